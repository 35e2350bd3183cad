/*
 * node.c -- the node agent: spawns, supervises and restarts actor processes.
 *
 * One agent per machine (and per job). It is itself an actor-like process
 * with a mailbox, whose methods are:
 *
 *   spawn {name, class, library, exe, max_restarts, args}  -> endpoint
 *   kill  "R NAME"   SIGKILL the actor; R=1 restarts it as after a crash
 *   stop  "NAME"     ask the actor to stop; answers once it has exited
 *   list             the agent's actors as text lines
 *   shutdown         stop every actor, delete their keys and its own, exit
 *
 * Spawning writes the directory record first (state "starting"), so a name
 * is claimed exactly once (HSETNX), then fork+execs the program with the
 * actor's identity in the environment. A reaper timer collects exits with
 * waitpid(): a crashed actor is restarted, with incarnation+1 at the same
 * endpoint, while restarts < max_restarts (-1: always); callers learn of the
 * death from their sockets (see loop.c) and reach the new incarnation
 * without doing anything.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct child {
    char name[128], cls[128], library[512], exe[512], endpoint[192];
    char local[192]; /* ipc:// beside a tcp endpoint, for callers on this machine */
    pid_t pid;
    int max_restarts, restarts, incarnation;
    bool stopping;        /* asked to stop: do not restart */
    bool no_restart;      /* killed with restart=0 */
    manta_req *stop_call; /* answered when it exits */
    manta_req *kill_call; /* answered once the exit is handled */
    struct child *next;
} child;

typedef struct node {
    manta_ctx *m;
    child *children;
    int next_slot;
    bool shutdown;
    manta_req *shutdown_call;
} node;

static node the_node;
static volatile sig_atomic_t got_term;

static void on_term(int sig)
{
    got_term = 1;
}

static void actor_key(manta_ctx *m, const char *name, char *key, size_t n)
{
    mn_key(m, key, n, "actor", name);
}

static int start_child(node *nd, child *c)
{
    manta_ctx *m = nd->m;
    char e_role[] = "MANTA_ROLE=actor", e_redis[600], e_job[80], e_name[160], e_class[160],
         e_lib[560], e_ep[240], e_node[100], e_inc[40], e_tr[40], e_host[80], e_max[64];
    snprintf(e_redis, sizeof e_redis, "MANTA_REDIS=%s", m->redis_url);
    snprintf(e_job, sizeof e_job, "MANTA_JOB=%s", m->job);
    snprintf(e_name, sizeof e_name, "MANTA_NAME=%s", c->name);
    snprintf(e_class, sizeof e_class, "MANTA_CLASS=%s", c->cls);
    snprintf(e_lib, sizeof e_lib, "MANTA_LIBRARY=%s", c->library);
    snprintf(e_ep, sizeof e_ep, "MANTA_ENDPOINT=%s", c->endpoint);
    char e_local[240];
    snprintf(e_local, sizeof e_local, "MANTA_ENDPOINT_LOCAL=%s", c->local);
    snprintf(e_node, sizeof e_node, "MANTA_NODE=%s", m->self);
    snprintf(e_inc, sizeof e_inc, "MANTA_INCARNATION=%d", c->incarnation);
    snprintf(e_tr, sizeof e_tr, "MANTA_TRANSPORT=%s", m->transport);
    snprintf(e_host, sizeof e_host, "MANTA_HOST=%s", m->host);
    snprintf(e_max, sizeof e_max, "MANTA_MAX_MESSAGE=%zu", m->max_message);
    size_t nenv = 0;
    while (environ[nenv]) nenv++;
    char **envp = calloc(nenv + 16, sizeof *envp);
    if (!envp) return MANTA_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "MANTA_", 6) != 0 || !strncmp(environ[i], "MANTA_DEBUG=", 12) ||
            !strncmp(environ[i], "MANTA_RUN_DIR=", 14))
            envp[k++] = environ[i];
    char *vars[] = {e_role, e_redis, e_job, e_name, e_class, e_lib,  e_ep,
                    e_node, e_inc,   e_tr,  e_host, e_max,   e_local};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) envp[k++] = vars[i];
    char logf[700] = "";
    if (m->log_dir && *m->log_dir) snprintf(logf, sizeof logf, "%s/%s.log", m->log_dir, c->name);
    char *argv[] = {c->exe, NULL};
    char key[256];
    actor_key(m, c->name, key, sizeof key);
    freeReplyObject(mn_redis(m, "HSET %s incarnation %d restarts %d state starting", key,
                             c->incarnation, c->restarts));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        free(envp);
        return mn_fail(MANTA_ESPAWN, "fork for actor %s: %s", c->name, strerror(errno));
    }
    if (pid == 0) {
        /* Only async-signal-safe calls between fork and exec. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        if (logf[0]) {
            int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        }
        execve(c->exe, argv, envp);
        _exit(127);
    }
    free(envp);
    c->pid = pid;
    /* Only the pid now: the state was set before the fork, and the child may
     * already have written "alive" (writing "starting" here lost that race
     * under load and left a live actor marked starting for ever). */
    freeReplyObject(mn_redis(m, "HSET %s pid %d", key, (int)pid));
    return 0;
}

static void choose_endpoint(node *nd, child *c)
{
    manta_ctx *m = nd->m;
    if (!strcmp(m->transport, "tcp")) {
        /* A fixed port per actor, so a restarted incarnation binds the same one. */
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET};
        inet_pton(AF_INET, m->host, &a.sin_addr);
        socklen_t len = sizeof a;
        int port = 0;
        if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(s, (struct sockaddr *)&a, &len) == 0)
            port = ntohs(a.sin_port);
        if (s >= 0) close(s);
        snprintf(c->endpoint, sizeof c->endpoint, "tcp://%s:%d", m->host, port);
        /* Callers on this machine use ipc (named by this agent's pid: several
         * agents of a job may share a machine and its /tmp). */
        snprintf(c->local, sizeof c->local, "ipc://%s/n%da%d", m->rundir, (int)getpid(),
                 ++nd->next_slot);
    } else {
        snprintf(c->endpoint, sizeof c->endpoint, "ipc://%s/a%d", m->rundir, ++nd->next_slot);
    }
}

/* Read a msgpack map of the spawn request. */
static int parse_spawn(const void *arg, size_t len, child *c, const char **args, size_t *args_len,
                       msgpack_unpacked *u, char *err, size_t errlen)
{
    msgpack_unpacked_init(u);
    size_t off = 0;
    if (msgpack_unpack_next(u, arg, len, &off) != MSGPACK_UNPACK_SUCCESS ||
        u->data.type != MSGPACK_OBJECT_MAP) {
        snprintf(err, errlen, "spawn: argument is not a msgpack map");
        return MANTA_EINVAL;
    }
    c->max_restarts = 0;
    *args = NULL, *args_len = 0;
    msgpack_object_map *mp = &u->data.via.map;
    for (uint32_t i = 0; i < mp->size; i++) {
        msgpack_object *k = &mp->ptr[i].key, *v = &mp->ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR) continue;
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)k->via.str.size, k->via.str.ptr);
        char *dst = NULL;
        size_t cap = 0;
        if (!strcmp(key, "name"))
            dst = c->name, cap = sizeof c->name;
        else if (!strcmp(key, "class"))
            dst = c->cls, cap = sizeof c->cls;
        else if (!strcmp(key, "library"))
            dst = c->library, cap = sizeof c->library;
        else if (!strcmp(key, "exe"))
            dst = c->exe, cap = sizeof c->exe;
        if (dst) {
            if (v->type == MSGPACK_OBJECT_NIL) continue;
            if (v->type != MSGPACK_OBJECT_STR || v->via.str.size >= cap) {
                snprintf(err, errlen, "spawn: field %s must be a string under %zu bytes", key, cap);
                return MANTA_EINVAL;
            }
            memcpy(dst, v->via.str.ptr, v->via.str.size);
            dst[v->via.str.size] = 0;
        } else if (!strcmp(key, "max_restarts")) {
            if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                c->max_restarts = (int)v->via.u64;
            else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
                c->max_restarts = -1;
        } else if (!strcmp(key, "args") && v->type == MSGPACK_OBJECT_BIN) {
            *args = v->via.bin.ptr, *args_len = v->via.bin.size;
        }
    }
    if (!c->name[0] || !c->cls[0] || !c->exe[0]) {
        snprintf(err, errlen, "spawn: name, class and exe are required");
        return MANTA_EINVAL;
    }
    return 0;
}

static void do_spawn(node *nd, manta_req *call, const void *arg, size_t len)
{
    manta_ctx *m = nd->m;
    child *c = calloc(1, sizeof *c);
    if (!c) {
        manta_reply_error(call, MANTA_ENOMEM, "node %s: out of memory", m->self);
        return;
    }
    const char *args;
    size_t args_len;
    char err[300];
    msgpack_unpacked u;
    int rc = parse_spawn(arg, len, c, &args, &args_len, &u, err, sizeof err);
    if (rc) {
        manta_reply_error(call, rc, "%s", err);
        goto fail;
    }
    /* A library class is checked by the actor itself; a built-in one here,
     * so a typo fails the create at once with a clear message. */
    if (!c->library[0] && !mn_find_class(m, c->cls, NULL)) {
        manta_reply_error(call, MANTA_ENOCLASS, "node %s: %s", m->self, manta_last_error());
        goto fail;
    }
    if (access(c->exe, X_OK) != 0) {
        manta_reply_error(call, MANTA_ESPAWN, "node %s: program %s is not executable here", m->self,
                          c->exe);
        goto fail;
    }
    char key[256], setkey[256];
    actor_key(m, c->name, key, sizeof key);
    mn_key(m, setkey, sizeof setkey, "actors", NULL);
    redisReply *r = mn_redis(m, "HSETNX %s class %s", key, c->cls);
    if (!r) {
        manta_reply_error(call, MANTA_EREDIS, "node %s: %s", m->self, manta_last_error());
        goto fail;
    }
    long long fresh = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    if (!fresh) {
        manta_reply_error(call, MANTA_EEXIST, "an actor named '%s' already exists in job %s",
                          c->name, m->job);
        goto fail;
    }
    choose_endpoint(nd, c);
    const char *argv[] = {
        "HSET",        key,        "node",         m->self,    "endpoint", c->endpoint,
        "state",       "starting", "max_restarts", NULL,       "restarts", "0",
        "incarnation", "1",        "library",      c->library, "args",     args ? args : ""};
    char maxr[16];
    snprintf(maxr, sizeof maxr, "%d", c->max_restarts);
    argv[9] = maxr;
    size_t lens[18];
    for (int i = 0; i < 18; i++) lens[i] = strlen(argv[i]);
    lens[17] = args_len;
    freeReplyObject(mn_redis_argv(m, 18, argv, lens));
    if (c->local[0])
        freeReplyObject(
            mn_redis(m, "HSET %s endpoint_local %s host %s", key, c->local, mn_host_id()));
    freeReplyObject(mn_redis(m, "SADD %s %s", setkey, c->name));
    msgpack_unpacked_destroy(&u);
    c->incarnation = 1;
    rc = start_child(nd, c);
    if (rc) {
        freeReplyObject(mn_redis(m, "HSET %s state failed error %s", key, manta_last_error()));
        manta_reply_error(call, rc, "%s", manta_last_error());
        free(c);
        return;
    }
    c->next = nd->children;
    nd->children = c;
    char reply[600];
    int rn = c->local[0]
                 ? snprintf(reply, sizeof reply, "%s\n%s\n%s", c->endpoint, c->local, mn_host_id())
                 : snprintf(reply, sizeof reply, "%s", c->endpoint);
    manta_reply(call, reply, (size_t)rn);
    return;
fail:
    msgpack_unpacked_destroy(&u);
    free(c);
}

static child *find_child(node *nd, const char *name)
{
    for (child *c = nd->children; c; c = c->next)
        if (!strcmp(c->name, name)) return c;
    return NULL;
}

static void forget_actor(manta_ctx *m, const char *name)
{
    char key[256], setkey[256];
    actor_key(m, name, key, sizeof key);
    mn_key(m, setkey, sizeof setkey, "actors", NULL);
    freeReplyObject(mn_redis(m, "DEL %s", key));
    freeReplyObject(mn_redis(m, "SREM %s %s", setkey, name));
}

static void child_exited(node *nd, child *c, int status)
{
    manta_ctx *m = nd->m;
    char key[256];
    actor_key(m, c->name, key, sizeof key);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    c->pid = 0;
    bool remove = true;
    manta_req *kill_call = c->kill_call;
    c->kill_call = NULL;
    if (c->stopping || nd->shutdown) {
        forget_actor(m, c->name);
        if (c->stop_call) manta_reply(c->stop_call, NULL, 0);
    } else if (code == 3 || code == 127) {
        /* Failed start: the actor wrote why; retrying would fail the same way. */
        freeReplyObject(mn_redis(m, "HSET %s state failed", key));
        if (code == 127)
            freeReplyObject(mn_redis(m, "HSET %s error %s", key, "exec of the program failed"));
    } else if (!c->no_restart && (c->max_restarts < 0 || c->restarts < c->max_restarts)) {
        c->restarts++;
        c->incarnation++;
        mn_log("node %s: actor %s (pid exit %d, signal %d) restarting as incarnation %d", m->self,
               c->name, code, sig, c->incarnation);
        freeReplyObject(mn_redis(m, "HSET %s state restarting", key));
        if (start_child(nd, c) == 0) remove = false;
    } else {
        char why[128];
        snprintf(why, sizeof why, "exited with code %d signal %d after %d restarts", code, sig,
                 c->restarts);
        freeReplyObject(mn_redis(m, "HSET %s state dead error %s", key, why));
    }
    if (kill_call) manta_reply(kill_call, NULL, 0);
    if (remove) {
        for (child **pp = &nd->children; *pp; pp = &(*pp)->next) {
            if (*pp == c) {
                *pp = c->next;
                break;
            }
        }
        free(c);
    }
}

static void reap(void *arg)
{
    node *nd = arg;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (child *c = nd->children; c; c = c->next) {
            if (c->pid == pid) {
                child_exited(nd, c, status);
                break;
            }
        }
    }
    manta_timer_add(nd->m, 10, reap, nd);
}

static void node_heartbeat(void *arg)
{
    node *nd = arg;
    char key[256];
    mn_key(nd->m, key, sizeof key, "node", nd->m->self);
    freeReplyObject(mn_redis(nd->m, "HSET %s hb %lld", key, (long long)mn_wall_ms()));
    manta_timer_add(nd->m, 1000, node_heartbeat, nd);
}

static int node_method(manta_ctx *m, manta_req *call, const mn_env *e, const void *arg, size_t len)
{
    node *nd = &the_node;
    const char *meth = call->method;
    char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 255 ? len : 255), arg ? (const char *)arg : "");
    if (!strcmp(meth, "spawn")) {
        if (nd->shutdown) return manta_reply_error(call, MANTA_ECLOSED, "node shutting down"), 0;
        do_spawn(nd, call, arg, len);
        return 0;
    }
    if (!strcmp(meth, "kill")) {
        int restart = buf[0] == '1';
        child *c = buf[0] && buf[1] == ' ' ? find_child(nd, buf + 2) : NULL;
        if (!c) {
            manta_reply_error(call, MANTA_ENOTFOUND, "node %s has no actor '%s'", m->self,
                              buf[0] ? buf + 2 : "");
            return 0;
        }
        c->no_restart = !restart;
        if (c->pid > 0) {
            kill(c->pid, SIGKILL);
            /* Answer once the exit is handled, so that the directory shows
             * "restarting" or "dead" by then, never the stale "alive". */
            if (!c->kill_call) c->kill_call = manta_req_defer(call);
        }
        return 0;
    }
    if (!strcmp(meth, "stop")) {
        child *c = find_child(nd, buf);
        if (!c) {
            manta_reply_error(call, MANTA_ENOTFOUND, "node %s has no actor '%s'", m->self, buf);
            return 0;
        }
        c->stopping = true;
        c->stop_call = manta_req_defer(call);
        if (c->pid > 0) kill(c->pid, SIGTERM);
        return 0;
    }
    if (!strcmp(meth, "list")) {
        char out[8192];
        size_t n = 0;
        for (child *c = nd->children; c && n < sizeof out - 300; c = c->next)
            n += (size_t)snprintf(out + n, sizeof out - n, "%s %s %d %d %d\n", c->name, c->cls,
                                  (int)c->pid, c->incarnation, c->restarts);
        manta_reply(call, out, n);
        return 0;
    }
    if (!strcmp(meth, "shutdown")) {
        nd->shutdown = true;
        nd->shutdown_call = manta_req_defer(call);
        return 0;
    }
    return MANTA_ENOMETHOD;
}

static void stop_all(node *nd)
{
    manta_ctx *m = nd->m;
    for (child *c = nd->children; c; c = c->next) {
        c->stopping = true;
        if (c->pid > 0) kill(c->pid, SIGTERM);
    }
    /* Give actors 3 s to run fini, then kill what is left. */
    int64_t until = mn_now_ms() + 3000;
    while (nd->children && mn_now_ms() < until) mn_loop_once(m, 10);
    for (child *c = nd->children; c; c = c->next)
        if (c->pid > 0) kill(c->pid, SIGKILL);
    until = mn_now_ms() + 2000;
    while (nd->children && mn_now_ms() < until) mn_loop_once(m, 10);
    while (nd->children) { /* unreaped even after SIGKILL: forget them anyway */
        child *c = nd->children;
        nd->children = c->next;
        forget_actor(m, c->name);
        free(c);
    }
}

int mn_node_main(manta_ctx *m)
{
    node *nd = &the_node;
    nd->m = m;
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    mkdir(m->rundir, 0700);
    char ep[256];
    if (!strcmp(m->transport, "tcp"))
        snprintf(ep, sizeof ep, "tcp://%s:*", m->host);
    else
        snprintf(ep, sizeof ep, "ipc://%s/%s", m->rundir, m->self);
    if (mn_mailbox_bind(m, ep) != 0) {
        mn_log("node %s: %s", m->self, manta_last_error());
        _exit(3);
    }
    m->system_method = node_method;
    char key[256], setkey[256], host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    mn_key(m, key, sizeof key, "node", m->self);
    mn_key(m, setkey, sizeof setkey, "nodes", NULL);
    /* Join the node set before the record says "alive": whoever waits for
     * "alive" (the driver) then finds this node when it places actors. */
    freeReplyObject(mn_redis(m, "SADD %s %s", setkey, m->self));
    /* Resources offered for placement: the machine's, unless set. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned long long mem =
        (unsigned long long)sysconf(_SC_PHYS_PAGES) * (unsigned long long)sysconf(_SC_PAGESIZE);
    const char *cpu_s = getenv("MANTA_NODE_CPU"), *gpu_s = getenv("MANTA_NODE_GPU"),
               *mem_s = getenv("MANTA_NODE_MEMORY");
    char cpu[32], gpu[32], memory[32];
    snprintf(cpu, sizeof cpu, "%s", cpu_s && *cpu_s ? cpu_s : "");
    if (!cpu[0]) snprintf(cpu, sizeof cpu, "%ld", ncpu > 0 ? ncpu : 1);
    snprintf(gpu, sizeof gpu, "%s", gpu_s && *gpu_s ? gpu_s : "0");
    snprintf(memory, sizeof memory, "%s", mem_s && *mem_s ? mem_s : "");
    if (!memory[0]) snprintf(memory, sizeof memory, "%llu", mem);
    redisReply *r = mn_redis(m,
                             "HSET %s endpoint %s host %s pid %d state alive hb %lld cpu %s gpu %s "
                             "memory %s transport %s",
                             key, m->endpoint, host, (int)getpid(), (long long)mn_wall_ms(), cpu,
                             gpu, memory, m->transport);
    if (!r) {
        mn_log("node %s: register: %s", m->self, manta_last_error());
        _exit(3);
    }
    freeReplyObject(r);
    manta_timer_add(m, 10, reap, nd);
    manta_timer_add(m, 1000, node_heartbeat, nd);

    while (!nd->shutdown && !got_term) mn_loop_once(m, 100);

    stop_all(nd);
    freeReplyObject(mn_redis(m, "DEL %s", key));
    freeReplyObject(mn_redis(m, "SREM %s %s", setkey, m->self));
    if (nd->shutdown_call) manta_reply(nd->shutdown_call, NULL, 0);
    /* Let the reply leave before the sockets close. */
    mn_loop_free(m);
    zmq_ctx_term(m->zmq);
    _exit(0);
}
