/*
 * registry.c -- the link to Redis, the control plane.
 *
 * One hiredis connection per process, made from the parsed address
 * (redis_url.c) with AUTH [user] password and SELECT db; a broken link is
 * made again for the next command. Redis is never on the per-call path: it
 * is read when a handle is made, when a peer went away, and for heartbeats
 * and objects. The records themselves (keys, fields, states) are schema.c's.
 *
 * With no URL the driver starts its own redis-server (the embedded default)
 * on a free loopback port with a generated password, in a private folder,
 * and stops it at shutdown.
 */
#include "internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int mn_redis_set_addr(manta_ctx *m, const manta_redis_addr *a)
{
    char url[1024];
    int rc = manta_redis_url_format(a, url, sizeof url);
    if (rc) return rc;
    char *copy = mn_strdup(url);
    if (!copy) return mn_fail(MANTA_ENOMEM, "redis URL: out of memory");
    free(m->redis_url);
    m->redis_url = copy;
    m->redis_addr = *a;
    return 0;
}

/* Send AUTH [user] password and SELECT db on a fresh link. */
static int redis_login(manta_ctx *m, redisContext *c)
{
    const manta_redis_addr *a = &m->redis_addr;
    if (a->password[0]) {
        redisReply *r = a->user[0] ? redisCommand(c, "AUTH %s %s", a->user, a->password)
                                   : redisCommand(c, "AUTH %s", a->password);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        int rc =
            bad ? mn_fail(MANTA_EREDIS, "Redis at %s:%d: AUTH as user '%s' failed: %s", a->host,
                          a->port, a->user[0] ? a->user : "default", r ? r->str : c->errstr)
                : 0;
        freeReplyObject(r);
        if (rc) return rc;
    }
    if (a->db) {
        redisReply *r = redisCommand(c, "SELECT %d", a->db);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        int rc = bad ? mn_fail(MANTA_EREDIS, "Redis at %s:%d: SELECT %d failed: %s", a->host,
                               a->port, a->db, r ? r->str : c->errstr)
                     : 0;
        freeReplyObject(r);
        if (rc) return rc;
    }
    /* A user without a password (nopass) is named by AUTH too: ping to be
     * sure the link works for us before we rely on it. */
    redisReply *r = redisCommand(c, "PING");
    int bad = !r || r->type == REDIS_REPLY_ERROR;
    int rc =
        bad ? mn_fail(MANTA_EREDIS, "Redis at %s:%d: %s", a->host, a->port, r ? r->str : c->errstr)
            : 0;
    freeReplyObject(r);
    return rc;
}

int mn_redis_connect(manta_ctx *m)
{
    const manta_redis_addr *a = &m->redis_addr;
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(a->host, a->port, tv);
    if (!c || c->err) {
        int rc = mn_fail(MANTA_EREDIS, "connect to Redis at %s:%d: %s", a->host, a->port,
                         c ? c->errstr : "out of memory");
        redisFree(c);
        return rc;
    }
    /* A command never blocks the loop for long: Redis is local control plane. */
    struct timeval cmd = {5, 0};
    redisSetTimeout(c, cmd);
    int rc = redis_login(m, c);
    if (rc) {
        redisFree(c);
        return rc;
    }
    m->redis = c;
    return 0;
}

static redisReply *check_reply(manta_ctx *m, redisReply *r, const char *what)
{
    if (!r) {
        mn_fail(MANTA_EREDIS, "Redis %s: %s", what, m->redis ? m->redis->errstr : "no link");
        /* A broken link stays broken in hiredis: reconnect for the next command. */
        if (m->redis && m->redis->err) {
            redisFree(m->redis);
            m->redis = NULL;
            mn_redis_connect(m);
        }
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        mn_fail(MANTA_EREDIS, "Redis %s: %s", what, r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

redisReply *mn_redis_v(manta_ctx *m, const char *fmt, va_list ap)
{
    if (!m->redis && mn_redis_connect(m) != 0) return NULL;
    redisReply *r = redisvCommand(m->redis, fmt, ap);
    return check_reply(m, r, fmt);
}

redisReply *mn_redis(manta_ctx *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = mn_redis_v(m, fmt, ap);
    va_end(ap);
    return r;
}

redisReply *mn_redis_argv(manta_ctx *m, int argc, const char **argv, const size_t *lens)
{
    if (!m->redis && mn_redis_connect(m) != 0) return NULL;
    redisReply *r = redisCommandArgv(m->redis, argc, argv, lens);
    return check_reply(m, r, argv[0]);
}

int mn_directory_read(manta_ctx *m, const char *name, manta_actor_info *info)
{
    manta_reg_actor rec = {0};
    int rc = manta_reg_actor_read(m, name, &rec);
    *info = rec.info;
    return rc;
}

const char *mn_host_id(void)
{
    /* Same hostname and boot id: the same kernel; same /tmp inode: the same
     * files, so an ipc:// path made by one process is reachable by the other
     * (network namespaces share it; containers do not). */
    static char id[160];
    if (id[0]) return id;
    char host[64] = "", boot[40] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        boot[strcspn(boot, "\n")] = 0;
        fclose(f);
    }
    struct stat st = {0};
    stat("/tmp", &st);
    snprintf(id, sizeof id, "%s/%s/%llx.%llx", host, boot, (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    return id;
}

const char *mn_pick_endpoint(const manta_actor_info *info)
{
    if (info->endpoint_local[0] && !strcmp(info->host, mn_host_id())) return info->endpoint_local;
    return info->endpoint;
}

/* ---- the embedded redis-server ---- */

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(s);
    return port;
}

void mn_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* Write the embedded server's configuration to DIR/redis.conf (mode 0600,
 * not following a link); its path goes to `conf`. */
static int write_redis_conf(const char *dir, int port, const char *pw, char *conf, size_t cap)
{
    snprintf(conf, cap, "%s/redis.conf", dir);
    int fd = open(conf, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return mn_fail(MANTA_ESYS, "redis config %s: %s", conf, strerror(errno));
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "port %d\nbind 127.0.0.1\nprotected-mode yes\nrequirepass %s\n"
                     "dir %s\nsave \"\"\nappendonly no\ndaemonize no\n"
                     "logfile %s/redis.log\n",
                     port, pw, dir, dir);
    bool ok = n > 0 && (size_t)n < sizeof text && fchmod(fd, 0600) == 0 &&
              write(fd, text, (size_t)n) == (ssize_t)n;
    int err = errno;
    if (close(fd) != 0 && ok) ok = false, err = errno;
    if (!ok) return mn_fail(MANTA_ESYS, "redis config %s: %s", conf, strerror(err));
    return 0;
}

int mn_redis_start_embedded(manta_ctx *m)
{
    char tmpl[] = "/tmp/manta-redis-XXXXXX";
    if (!mkdtemp(tmpl)) return mn_fail(MANTA_ESYS, "mkdtemp: %s", strerror(errno));
    m->redis_dir = mn_strdup(tmpl);
    char pw[33];
    mn_random_hex(pw, 32);
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = free_port();
        if (port < 0) return mn_fail(MANTA_ESYS, "no free loopback port: %s", strerror(errno));
        char sport[16], conf[256];
        snprintf(sport, sizeof sport, "%d", port);
        /* The password goes in a 0600 file in our 0700 folder, never on the
         * command line: /proc/PID/cmdline is readable by every local user. */
        int rc = write_redis_conf(tmpl, port, pw, conf, sizeof conf);
        if (rc) return rc;
        char *argv[] = {"redis-server", conf, NULL};
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) return mn_fail(MANTA_ESYS, "fork redis-server: %s", strerror(errno));
        if (pid == 0) {
            /* The embedded server dies with the driver, even on SIGKILL. */
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent) _exit(1);
            setpgid(0, 0); /* Ctrl-C at the terminal goes to the driver, which stops us */
            execvp("redis-server", argv);
            execv("/usr/bin/redis-server", argv);
            _exit(127);
        }
        m->redis_pid = pid;
        manta_redis_addr addr = {.port = port};
        snprintf(addr.host, sizeof addr.host, "127.0.0.1");
        snprintf(addr.password, sizeof addr.password, "%s", pw);
        rc = mn_redis_set_addr(m, &addr);
        if (rc) return rc;
        int64_t until = mn_now_ms() + 5000;
        while (mn_now_ms() < until) {
            int status;
            if (waitpid(pid, &status, WNOHANG) == pid) {
                m->redis_pid = 0;
                if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
                    return mn_fail(MANTA_ESYS,
                                   "redis-server not found: install it (apt-get install "
                                   "redis-server) or give a redis:// URL");
                break; /* probably lost the port race: try another */
            }
            struct timeval tv = {0, 200000};
            redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
            if (c && !c->err) {
                redisFree(c);
                if (mn_redis_connect(m) == 0) {
                    redisReply *r = mn_redis(m, "PING");
                    if (r) {
                        freeReplyObject(r);
                        return 0;
                    }
                }
            } else {
                redisFree(c);
            }
            usleep(10000);
        }
        if (m->redis_pid) mn_redis_stop_embedded(m);
    }
    return mn_fail(MANTA_EREDIS, "could not start the embedded redis-server (log in %s)", tmpl);
}

void mn_redis_stop_embedded(manta_ctx *m)
{
    if (m->redis) {
        redisFree(m->redis);
        m->redis = NULL;
    }
    if (m->redis_pid > 0) {
        kill(m->redis_pid, SIGTERM);
        int64_t until = mn_now_ms() + 3000;
        int status;
        while (waitpid(m->redis_pid, &status, WNOHANG) == 0) {
            if (mn_now_ms() > until) {
                kill(m->redis_pid, SIGKILL);
                waitpid(m->redis_pid, &status, 0);
                break;
            }
            usleep(5000);
        }
        m->redis_pid = 0;
    }
    if (m->redis_dir) {
        mn_remove_dir(m->redis_dir);
        free(m->redis_dir);
        m->redis_dir = NULL;
    }
}
