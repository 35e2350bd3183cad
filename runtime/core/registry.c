/*
 * registry.c -- Redis: the control plane.
 *
 * Every key of a job lives under manta:JOB:, so one SCAN finds them all at
 * shutdown. The actor directory is one hash per actor,
 *
 *     manta:JOB:actor:NAME  {class, node, endpoint, pid, incarnation, state,
 *                            restarts, max_restarts, hb, error, ...}
 *
 * plus the set manta:JOB:actors of names; nodes are manta:JOB:node:ID with
 * the set manta:JOB:nodes; objects are manta:JOB:obj:ID. Redis is never on
 * the per-call path: it is read when a handle is made, when a peer went
 * away, and for heartbeats and objects.
 *
 * With no URL the driver starts its own redis-server (the embedded default)
 * on a free loopback port with a generated password, in a private folder,
 * and stops it at shutdown.
 */
#include "internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
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

int mn_redis_parse_url(manta_ctx *m, const char *url)
{
    /* redis://[[user]:password@]host:port[/db] */
    if (strncmp(url, "redis://", 8) != 0)
        return mn_fail(MANTA_EINVAL, "redis URL '%s': expected redis://[:password@]host:port", url);
    const char *p = url + 8;
    const char *at = strrchr(p, '@');
    free(m->redis_password);
    m->redis_password = NULL;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *pw = colon ? colon + 1 : p;
        m->redis_password = strndup(pw, (size_t)(at - pw));
        p = at + 1;
    }
    const char *colon = strrchr(p, ':');
    if (!colon || colon == p) return mn_fail(MANTA_EINVAL, "redis URL '%s': no host:port", url);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (port <= 0 || port > 65535 || (*end && *end != '/'))
        return mn_fail(MANTA_EINVAL, "redis URL '%s': bad port", url);
    m->redis_db = *end == '/' ? atoi(end + 1) : 0;
    free(m->redis_host);
    m->redis_host = strndup(p, (size_t)(colon - p));
    m->redis_port = (int)port;
    free(m->redis_url);
    m->redis_url = mn_strdup(url);
    return 0;
}

int mn_redis_connect(manta_ctx *m)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(m->redis_host, m->redis_port, tv);
    if (!c || c->err) {
        int rc = mn_fail(MANTA_EREDIS, "connect to Redis at %s:%d: %s", m->redis_host,
                         m->redis_port, c ? c->errstr : "out of memory");
        redisFree(c);
        return rc;
    }
    /* A command never blocks the loop for long: Redis is local control plane. */
    struct timeval cmd = {5, 0};
    redisSetTimeout(c, cmd);
    m->redis = c;
    if (m->redis_password && *m->redis_password) {
        redisReply *r = redisCommand(c, "AUTH %s", m->redis_password);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        int rc = bad ? mn_fail(MANTA_EREDIS, "Redis AUTH failed: %s", r ? r->str : c->errstr) : 0;
        freeReplyObject(r);
        if (rc) goto fail;
    }
    if (m->redis_db) {
        redisReply *r = redisCommand(c, "SELECT %d", m->redis_db);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        freeReplyObject(r);
        if (bad) {
            mn_fail(MANTA_EREDIS, "Redis SELECT %d failed", m->redis_db);
            goto fail;
        }
    }
    return 0;
fail:
    redisFree(c);
    m->redis = NULL;
    return MANTA_EREDIS;
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

redisReply *mn_redis(manta_ctx *m, const char *fmt, ...)
{
    if (!m->redis && mn_redis_connect(m) != 0) return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(m->redis, fmt, ap);
    va_end(ap);
    return check_reply(m, r, fmt);
}

redisReply *mn_redis_argv(manta_ctx *m, int argc, const char **argv, const size_t *lens)
{
    if (!m->redis && mn_redis_connect(m) != 0) return NULL;
    redisReply *r = redisCommandArgv(m->redis, argc, argv, lens);
    return check_reply(m, r, argv[0]);
}

void mn_key(const manta_ctx *m, char *out, size_t n, const char *kind, const char *name)
{
    if (name)
        snprintf(out, n, "manta:%s:%s:%s", m->job, kind, name);
    else
        snprintf(out, n, "manta:%s:%s", m->job, kind);
}

int mn_redis_hget_str(manta_ctx *m, const char *key, const char *field, char *out, size_t n)
{
    redisReply *r = mn_redis(m, "HGET %s %s", key, field);
    if (!r) return MANTA_EREDIS;
    int rc = 0;
    if (r->type == REDIS_REPLY_STRING)
        snprintf(out, n, "%s", r->str);
    else
        rc = MANTA_ENOTFOUND;
    freeReplyObject(r);
    return rc;
}

int mn_directory_read(manta_ctx *m, const char *name, manta_actor_info *info)
{
    char key[256];
    mn_key(m, key, sizeof key, "actor", name);
    redisReply *r = mn_redis(m, "HGETALL %s", key);
    if (!r) return MANTA_EREDIS;
    memset(info, 0, sizeof *info);
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        freeReplyObject(r);
        return mn_fail(MANTA_ENOTFOUND, "no actor named '%s' in job %s", name, m->job);
    }
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const char *k = r->element[i]->str, *v = r->element[i + 1]->str;
        if (!k || !v) continue;
        if (!strcmp(k, "state"))
            snprintf(info->state, sizeof info->state, "%s", v);
        else if (!strcmp(k, "node"))
            snprintf(info->node, sizeof info->node, "%s", v);
        else if (!strcmp(k, "endpoint"))
            snprintf(info->endpoint, sizeof info->endpoint, "%s", v);
        else if (!strcmp(k, "endpoint_local"))
            snprintf(info->endpoint_local, sizeof info->endpoint_local, "%s", v);
        else if (!strcmp(k, "host"))
            snprintf(info->host, sizeof info->host, "%s", v);
        else if (!strcmp(k, "pid"))
            info->pid = atoi(v);
        else if (!strcmp(k, "incarnation"))
            info->incarnation = atoi(v);
        else if (!strcmp(k, "restarts"))
            info->restarts = atoi(v);
        else if (!strcmp(k, "hb"))
            info->heartbeat_ms = atoll(v);
    }
    freeReplyObject(r);
    return 0;
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

int mn_delete_job_keys(manta_ctx *m)
{
    char pattern[160];
    snprintf(pattern, sizeof pattern, "manta:%s:*", m->job);
    char cursor[32] = "0";
    do {
        redisReply *r = mn_redis(m, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r) return MANTA_EREDIS;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            return mn_fail(MANTA_EREDIS, "SCAN: unexpected reply");
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            redisReply *d = mn_redis(m, "DEL %b", keys->element[i]->str, keys->element[i]->len);
            freeReplyObject(d);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return 0;
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
        char sport[16], logf[256];
        snprintf(sport, sizeof sport, "%d", port);
        snprintf(logf, sizeof logf, "%s/redis.log", tmpl);
        char *argv[] = {"redis-server", "--port",           sport, "--bind",
                        "127.0.0.1",    "--requirepass",    pw,    "--dir",
                        tmpl,           "--save",           "",    "--appendonly",
                        "no",           "--daemonize",      "no",  "--logfile",
                        logf,           "--protected-mode", "yes", NULL};
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
        char url[128];
        snprintf(url, sizeof url, "redis://:%s@127.0.0.1:%d", pw, port);
        mn_redis_parse_url(m, url);
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

/* ---- job values ---- */

static int kv_key(manta_ctx *m, const char *key, char *out, size_t n)
{
    size_t len = key ? strlen(key) : 0;
    if (!m || len == 0 || len > 100)
        return mn_fail(MANTA_EINVAL, "value key '%s': 1..100 characters", key ? key : "");
    for (size_t i = 0; i < len; i++) {
        char c = key[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return mn_fail(MANTA_EINVAL, "value key '%s': use [A-Za-z0-9._-]", key);
    }
    mn_key(m, out, n, "kv", key);
    return 0;
}

int manta_kv_set(manta_ctx *m, const char *key, const void *val, size_t len)
{
    char k[256];
    int rc = kv_key(m, key, k, sizeof k);
    if (rc) return rc;
    if (len && !val) return mn_fail(MANTA_EINVAL, "manta_kv_set %s: no value", key);
    redisReply *r = mn_redis(m, "SET %s %b", k, val ? val : "", len);
    freeReplyObject(r);
    return r ? 0 : MANTA_EREDIS;
}

int manta_kv_get(manta_ctx *m, const char *key, void **val, size_t *len)
{
    char k[256];
    if (!val || !len) return mn_fail(MANTA_EINVAL, "manta_kv_get: bad arguments");
    *val = NULL, *len = 0;
    int rc = kv_key(m, key, k, sizeof k);
    if (rc) return rc;
    redisReply *r = mn_redis(m, "GET %s", k);
    if (!r) return MANTA_EREDIS;
    if (r->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return mn_fail(MANTA_ENOTFOUND, "no value '%s' in job %s", key, m->job);
    }
    *val = malloc(r->len + 1);
    if (!*val)
        rc = MANTA_ENOMEM;
    else
        memcpy(*val, r->str, r->len), ((char *)*val)[r->len] = 0, *len = r->len;
    freeReplyObject(r);
    return rc;
}
