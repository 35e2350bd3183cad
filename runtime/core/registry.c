/*
 * registry.c -- the link to Redis, the control plane.
 *
 * One hiredis connection per process, made from the parsed address
 * (redis_url.c) with AUTH [user] password and SELECT db; a broken link is
 * made again for the next command, with back-off: after a failed connect
 * the next attempt waits 50 ms, then 100, 200 ... up to 2 s, and commands
 * meanwhile fail at once (EREDIS, saying since when Redis is gone) instead
 * of each waiting for a connect timeout. Redis is never on the per-call
 * path: it is read when a handle is made, when a peer went away, and for
 * heartbeats and objects. The records themselves (keys, fields, states) are
 * schema.c's.
 *
 * With no URL the driver starts its own redis-server (the embedded default)
 * on a free loopback port with a generated password, in a private folder,
 * with an append-only file, and stops it at shutdown. When it dies during
 * the job (killed, crashed), the driver's next command that finds the link
 * broken restarts it on the same port with the same password and folder: it
 * loads its data back from the append-only file (each write reaches the
 * file, in the kernel's cache, before its reply: a killed process loses
 * nothing it answered; no fsync, since the server cannot outlive the
 * machine's crash anyway: it dies with its driver), and every client's link reconnects by itself.
 * At most MAX_REDIS_RESTARTS times per job.
 */
#include "internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
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

#define MAX_REDIS_RESTARTS 10
#define BACKOFF_FIRST_MS   50
#define BACKOFF_MAX_MS     2000

static int spawn_redis(manta_ctx *m, const char *conf, pid_t *out);
static int wait_redis_up(manta_ctx *m, pid_t pid, int port, int64_t ms);
static void stop_server(manta_ctx *m);

/* The driver's embedded server exited: start it again from its folder and
 * append-only file. true when it is up again. */
static bool embedded_restart(manta_ctx *m)
{
    int status;
    if (m->role != MN_ROLE_DRIVER || m->redis_pid <= 0 || !m->redis_dir ||
        waitpid(m->redis_pid, &status, WNOHANG) != m->redis_pid)
        return false;
    pid_t old = m->redis_pid;
    m->redis_pid = 0;
    char how[64];
    if (WIFSIGNALED(status))
        snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(status));
    else
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(status));
    if (m->redis_restarts >= MAX_REDIS_RESTARTS) {
        mn_log("embedded redis-server (pid %d) %s; not restarted: it died %d times already (log "
               "in %s)",
               (int)old, how, m->redis_restarts, m->redis_dir);
        return false;
    }
    m->redis_restarts++;
    char conf[512];
    snprintf(conf, sizeof conf, "%s/redis.conf", m->redis_dir);
    pid_t pid;
    if (spawn_redis(m, conf, &pid) != 0 || wait_redis_up(m, pid, m->redis_addr.port, 10000) != 0) {
        mn_log("embedded redis-server (pid %d) %s; its restart failed: %s", (int)old, how,
               manta_last_error());
        return false;
    }
    mn_log("embedded redis-server (pid %d) %s; restarted as pid %d on port %d with its data "
           "(append-only file), restart %d of %d",
           (int)old, how, (int)pid, m->redis_addr.port, m->redis_restarts, MAX_REDIS_RESTARTS);
    return true;
}

/* The blocking link, made again when it is broken: at once the first time,
 * then with back-off while Redis stays away. */
/* A link whose server went away (killed, restarted) has its end of file
 * waiting: nothing else arrives on an idle blocking link. Found before a
 * command is sent, it is made again first, so that the command goes to
 * the live server instead of failing (and is never sent twice). */
static bool link_stale(redisContext *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, 0) != 1) return false;
    char b;
    ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static int link_up(manta_ctx *m)
{
    if (m->redis && link_stale(m->redis)) {
        redisFree(m->redis);
        m->redis = NULL;
    }
    if (m->redis) return 0;
    int64_t now = mn_now_ms();
    if (m->redis_retry_at && now < m->redis_retry_at)
        return mn_fail(
            MANTA_EREDIS, "Redis at %s:%d does not answer (for %.1f s; next try in %lld ms)",
            m->redis_addr.host, m->redis_addr.port, (double)(now - m->redis_down_since) / 1000,
            (long long)(m->redis_retry_at - now));
    int rc = mn_redis_connect(m);
    if (rc && embedded_restart(m)) rc = m->redis ? 0 : mn_redis_connect(m);
    if (rc) {
        if (!m->redis_down_since) m->redis_down_since = now;
        m->redis_backoff_ms = m->redis_backoff_ms ? 2 * m->redis_backoff_ms : BACKOFF_FIRST_MS;
        if (m->redis_backoff_ms > BACKOFF_MAX_MS) m->redis_backoff_ms = BACKOFF_MAX_MS;
        m->redis_retry_at = mn_now_ms() + m->redis_backoff_ms;
        return rc;
    }
    if (m->redis_down_since)
        mn_log("Redis at %s:%d answers again after %.1f s", m->redis_addr.host, m->redis_addr.port,
               (double)(mn_now_ms() - m->redis_down_since) / 1000);
    m->redis_down_since = 0, m->redis_backoff_ms = 0, m->redis_retry_at = 0;
    return 0;
}

static redisReply *check_reply(manta_ctx *m, redisReply *r, const char *what)
{
    if (!r) {
        mn_fail(MANTA_EREDIS, "Redis %s: %s", what, m->redis ? m->redis->errstr : "no link");
        /* A broken link stays broken in hiredis: make it again for the
         * next command (now, so that a restarted server is found at once). */
        if (m->redis && m->redis->err) {
            char why[512];
            snprintf(why, sizeof why, "%s", manta_last_error());
            redisFree(m->redis);
            m->redis = NULL;
            link_up(m);
            mn_fail(MANTA_EREDIS, "%s", why);
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
    if (link_up(m) != 0) return NULL;
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
    if (link_up(m) != 0) return NULL;
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

const char *manta_host_id(void)
{
    return mn_host_id();
}

/* Does the comma-separated list have the name [p, p + n)? */
static bool list_has(const char *list, const char *p, size_t n)
{
    for (const char *q = list; *q;) {
        size_t k = strcspn(q, ",");
        if (k == n && !memcmp(q, p, n)) return true;
        q += k + (q[k] == ',');
    }
    return false;
}

int manta_gpu_see_node(void)
{
    const char *own = getenv("MANTA_GPUS_OWN"), *node = getenv("MANTA_NODE_GPUS");
    if (!own) own = getenv("CUDA_VISIBLE_DEVICES"); /* not yet called */
    if (!own || !*own || !node || !*node) return 0;
    char ownc[MN_MAX_GPUS * 65], list[MN_MAX_GPUS * 65];
    int n = 0;
    size_t used = (size_t)snprintf(ownc, sizeof ownc, "%s", own);
    if (used >= sizeof ownc) return mn_fail(MANTA_EINVAL, "CUDA_VISIBLE_DEVICES: too long");
    memcpy(list, ownc, used + 1);
    for (const char *q = ownc; *q; n++) {
        size_t k = strcspn(q, ",");
        q += k + (q[k] == ',');
    }
    for (const char *q = node; *q;) {
        size_t k = strcspn(q, ",");
        if (k && !list_has(ownc, q, k)) {
            if (n == MN_MAX_GPUS || used + k + 2 > sizeof list)
                return mn_fail(MANTA_EINVAL, "MANTA_NODE_GPUS '%s': over %d names", node,
                               MN_MAX_GPUS);
            used += (size_t)snprintf(list + used, sizeof list - used, ",%.*s", (int)k, q);
            n++;
        }
        q += k + (q[k] == ',');
    }
    if (setenv("MANTA_GPUS_OWN", ownc, 1) || setenv("CUDA_VISIBLE_DEVICES", list, 1))
        return mn_fail(MANTA_ENOMEM, "setenv: %s", strerror(errno));
    return n;
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

/* Remove dir, its files and its sub-folders (the embedded server's
 * appendonlydir) down to `depth` levels; links are removed, not followed. */
static void remove_tree(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (depth > 0 && lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(path, depth - 1);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

void mn_remove_dir(const char *dir)
{
    remove_tree(dir, 0);
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
                     "dir %s\nsave \"\"\nappendonly yes\nappendfsync no\ndaemonize no\n"
                     "logfile %s/redis.log\n",
                     port, pw, dir, dir);
    bool ok = n > 0 && (size_t)n < sizeof text && fchmod(fd, 0600) == 0 &&
              write(fd, text, (size_t)n) == (ssize_t)n;
    int err = errno;
    if (close(fd) != 0 && ok) ok = false, err = errno;
    if (!ok) return mn_fail(MANTA_ESYS, "redis config %s: %s", conf, strerror(err));
    return 0;
}

static int spawn_redis(manta_ctx *m, const char *conf, pid_t *out)
{
    (void)m;
    char *argv[] = {"redis-server", (char *)conf, NULL};
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
    *out = pid;
    m->redis_pid = pid;
    return 0;
}

/* Wait until the server answers PING on the blocking link, up to ms.
 * MANTA_ESPAWN when it exited (m->redis_pid is then 0; 127: not found). */
static int wait_redis_up(manta_ctx *m, pid_t pid, int port, int64_t ms)
{
    int64_t until = mn_now_ms() + ms;
    if (m->redis) {
        redisFree(m->redis);
        m->redis = NULL;
    }
    while (mn_now_ms() < until) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            m->redis_pid = 0;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
                return mn_fail(MANTA_ESYS, "redis-server not found: install it (apt-get install "
                                           "redis-server) or give a redis:// URL");
            return mn_fail(MANTA_ESPAWN, "redis-server exited at start (status %d; log in %s)",
                           status, m->redis_dir);
        }
        struct timeval tv = {0, 200000};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        bool up = c && !c->err;
        redisFree(c);
        if (up && mn_redis_connect(m) == 0) {
            redisReply *r = redisCommand(m->redis, "PING");
            bool ok = r && r->type != REDIS_REPLY_ERROR;
            freeReplyObject(r);
            if (ok) return 0;
            redisFree(m->redis);
            m->redis = NULL;
        }
        usleep(10000); /* another process loading its data: poll it */
    }
    return mn_fail(MANTA_ETIMEDOUT,
                   "redis-server on port %d not answering after %lld ms (log in %s)", port,
                   (long long)ms, m->redis_dir);
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
        char conf[256];
        /* The password goes in a 0600 file in our 0700 folder, never on the
         * command line: /proc/PID/cmdline is readable by every local user. */
        int rc = write_redis_conf(tmpl, port, pw, conf, sizeof conf);
        if (rc) return rc;
        pid_t pid;
        if ((rc = spawn_redis(m, conf, &pid)) != 0) return rc;
        manta_redis_addr addr = {.port = port};
        snprintf(addr.host, sizeof addr.host, "127.0.0.1");
        snprintf(addr.password, sizeof addr.password, "%s", pw);
        rc = mn_redis_set_addr(m, &addr);
        if (rc) return rc;
        rc = wait_redis_up(m, pid, port, 5000);
        if (rc == 0) return 0;
        if (rc == MANTA_ESYS) return rc; /* not installed */
        /* probably lost the port race: try another */
        if (m->redis_pid) stop_server(m);
    }
    return mn_fail(MANTA_EREDIS, "could not start the embedded redis-server (log in %s)", tmpl);
}

/* Stop the server process only (the folder stays). */
static void stop_server(manta_ctx *m)
{
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
}

void mn_redis_stop_embedded(manta_ctx *m)
{
    if (m->redis) {
        redisFree(m->redis);
        m->redis = NULL;
    }
    stop_server(m);
    if (m->redis_dir) {
        remove_tree(m->redis_dir, 2);
        free(m->redis_dir);
        m->redis_dir = NULL;
    }
}
