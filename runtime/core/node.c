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
 * A spawn may name a shared library to load the class from only when the
 * library is on the allow-list the agent got at its start (MANTA_LIBRARIES:
 * the spec's `library:` entries); the program must be the agent's own.
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

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

typedef struct child {
    char name[128], cls[128], library[512], exe[512], endpoint[192];
    char local[192]; /* ipc:// beside a tcp endpoint, for callers on this machine */
    pid_t pid;
    int max_restarts, restarts, incarnation;
    double gpu;                          /* GPUs asked for: a fraction of one, or whole ones */
    double share;                        /* of each device it holds: gpu below 1, else 1 */
    int ngpu;                            /* devices held, indices into node.gpu_ids, from the */
    int gpus[MN_MAX_GPUS];               /* spawn until the actor is gone for good */
    char cuda_devices[MN_MAX_GPUS * 65]; /* its CUDA_VISIBLE_DEVICES ("" with no GPU) */
    bool stopping;                       /* asked to stop: do not restart */
    bool no_restart;                     /* killed with restart=0 */
    bool superseded;      /* its record went to another node's incarnation: leave it alone */
    manta_req *stop_call; /* answered when it exits */
    manta_req *kill_call; /* answered once the exit is handled */
    struct child *next;
} child;

typedef struct node {
    manta_ctx *m;
    char **libs; /* the library allow-list: resolved paths, or bare names */
    size_t nlibs;
    child *children;
    int next_slot;
    /* The GPUs this agent gives out, as CUDA_VISIBLE_DEVICES names them:
     * its own CUDA_VISIBLE_DEVICES if set, else 0..N-1 (see node_gpus) */
    char gpu_ids[MN_MAX_GPUS][64]; /* indices, GPU-<uuid> or MIG-<uuid> names */
    int ngpu_ids;
    bool shutdown;
    manta_req *shutdown_call;
} node;

static node the_node;
static volatile sig_atomic_t got_term;

static void on_term(int sig)
{
    got_term = 1;
}

/* A directory write that failed: the agent carries on (the record is
 * advisory for callers, the process is what counts) but says so. */
static void check(manta_ctx *m, int rc, const char *what, const char *name)
{
    if (rc) mn_log("node %s: %s of actor %s: %s", m->self, what, name, manta_last_error());
}

static int start_child(node *nd, child *c)
{
    manta_ctx *m = nd->m;
    char inc[16], maxm[32], node_gpus[MN_MAX_GPUS * 65] = "";
    snprintf(inc, sizeof inc, "%d", c->incarnation);
    /* the node's GPUs, for an actor that holds some: what manta_gpu_see_node may add after its
     * own (to map their memory); an actor without a GPU is told none */
    for (int d = 0, used = 0; c->ngpu > 0 && d < nd->ngpu_ids; d++)
        used += snprintf(node_gpus + used, sizeof node_gpus - (size_t)used, "%s%s", used ? "," : "",
                         nd->gpu_ids[d]);
    snprintf(maxm, sizeof maxm, "%zu", m->max_message);
    static const char *const keep[] = {"MANTA_DEBUG=", "MANTA_RUN_DIR=", "MANTA_LOG_LEVEL=", NULL};
    const mn_var vars[] = {
        {"MANTA_ROLE", "actor"},
        {"MANTA_REDIS", m->redis_url},
        {"MANTA_JOB", m->job},
        {"MANTA_NAME", c->name},
        {"MANTA_CLASS", c->cls},
        {"MANTA_LIBRARY", c->library},
        {"MANTA_ENDPOINT", c->endpoint},
        {"MANTA_ENDPOINT_LOCAL", c->local},
        {"MANTA_NODE", m->self},
        {"MANTA_INCARNATION", inc},
        {"MANTA_TRANSPORT", m->transport},
        {"MANTA_HOST", m->host},
        {"MANTA_MAX_MESSAGE", maxm},
        /* the path of the job's key file, never the keys themselves */
        {"MANTA_CURVE", m->curve ? "on" : "off"},
        {"MANTA_KEYS", m->keys_path},
        /* the devices it was given, and no others (none: "") */
        {"CUDA_VISIBLE_DEVICES", c->cuda_devices},
        {"MANTA_NODE_GPUS", node_gpus},
    };
    char logf[PATH_MAX] = "";
    if (m->log_dir && *m->log_dir &&
        snprintf(logf, sizeof logf, "%s/%s.log", m->log_dir, c->name) >= (int)sizeof logf)
        return mn_fail(MANTA_EINVAL, "log file of actor %s: path longer than %d bytes", c->name,
                       PATH_MAX - 1);
    char **envp = mn_child_env(keep, vars, sizeof vars / sizeof vars[0]);
    if (!envp) return MANTA_ENOMEM;
    char *argv[] = {c->exe, NULL};
    int rc = manta_reg_actor_incarnate(m, c->name, c->incarnation, c->restarts);
    if (rc) {
        free(envp);
        return rc;
    }
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
            /* not through a link someone left where the log goes */
            int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
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
    check(m, manta_reg_actor_set_pid(m, c->name, (int)pid), "pid", c->name);
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

/* Read the spawn request, a msgpack map, with the bounds-checked reader:
 * the bytes come from whoever reached the mailbox, so nothing they announce
 * (a count, a length) is believed before the bytes to back it are there, and
 * nothing is allocated. */
static int parse_spawn(const void *arg, size_t len, child *c, const char **args, size_t *args_len,
                       char *err, size_t errlen)
{
    mn_mp r;
    mn_mp_init(&r, arg, len);
    uint32_t n;
    if (mn_mp_map(&r, &n) != 0) {
        snprintf(err, errlen,
                 "spawn: argument is not a msgpack map (or announces more entries "
                 "than its %zu bytes hold)",
                 len);
        return MANTA_EPROTO;
    }
    c->max_restarts = 0;
    *args = NULL, *args_len = 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *ks;
        size_t kl;
        if (mn_mp_str(&r, &ks, &kl) != 0) {
            if (mn_mp_skip(&r) == 0 && mn_mp_skip(&r) == 0) continue; /* not a string key */
            snprintf(err, errlen, "spawn: entry %u of the map is malformed", i);
            return MANTA_EPROTO;
        }
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)(kl < sizeof key ? kl : sizeof key - 1), ks);
        if (kl >= sizeof key) key[0] = 0; /* no field has so long a name */
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
        int64_t iv;
        double dv;
        const char *sv;
        size_t sl;
        if (dst) {
            if (mn_mp_nil(&r) == 0) continue;
            if (mn_mp_str(&r, &sv, &sl) != 0 || sl >= cap || memchr(sv, 0, sl)) {
                snprintf(err, errlen, "spawn: field %s must be a string under %zu bytes", key, cap);
                return MANTA_EPROTO;
            }
            memcpy(dst, sv, sl);
            dst[sl] = 0;
        } else if (!strcmp(key, "gpu") && mn_mp_num(&r, &dv) == 0) {
            if (!(dv >= 0 && dv <= MN_MAX_GPUS) || (dv > 1 && dv != (double)(int)dv)) {
                snprintf(err, errlen,
                         "spawn: gpu must be a fraction below 1 or a whole number 0..%d, got %g",
                         MN_MAX_GPUS, dv);
                return MANTA_EINVAL;
            }
            c->gpu = dv;
        } else if (!strcmp(key, "max_restarts") && mn_mp_int(&r, &iv) == 0) {
            c->max_restarts = iv < 0 ? -1 : iv > INT32_MAX ? INT32_MAX : (int)iv;
        } else if (!strcmp(key, "args") && mn_mp_bin(&r, (const void **)args, args_len) == 0) {
            /* points into the request */
        } else if (mn_mp_skip(&r) != 0) {
            snprintf(err, errlen, "spawn: value of field %s is malformed or nested over %d deep",
                     key, MN_MP_MAX_DEPTH);
            return MANTA_EPROTO;
        }
    }
    if (r.p != r.end) {
        snprintf(err, errlen, "spawn: %zu trailing bytes after the map", (size_t)(r.end - r.p));
        return MANTA_EPROTO;
    }
    if (!c->name[0] || !c->cls[0] || !c->exe[0]) {
        snprintf(err, errlen, "spawn: name, class and exe are required");
        return MANTA_EINVAL;
    }
    /* The name becomes a log file's name, Redis keys and routing ids. */
    if (!mn_valid_name(c->name, 100)) {
        snprintf(err, errlen, "spawn: actor name '%s': use 1..100 of [A-Za-z0-9._-]", c->name);
        return MANTA_EINVAL;
    }
    return 0;
}

int mn_node_parse_spawn(const void *arg, size_t len, char *err, size_t errlen)
{
    child *c = calloc(1, sizeof *c);
    if (!c) return snprintf(err, errlen, "spawn: out of memory"), MANTA_ENOMEM;
    const char *args;
    size_t args_len;
    int rc = parse_spawn(arg, len, c, &args, &args_len, err, errlen);
    free(c);
    return rc;
}

/* 1 if `exe` is this agent's own program (the same file), else 0: an agent
 * runs nothing else, whoever asks. */
static int own_program(const char *exe)
{
    char self[PATH_MAX];
    struct stat a, b;
    return mn_self_exe(self, sizeof self) == 0 && stat(self, &a) == 0 && stat(exe, &b) == 0 &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* ---- the library allow-list ---- */

int mn_node_libraries_set(manta_ctx *m, const manta_options *opts)
{
    size_t n = 1;
    const char *env = getenv("MANTA_LIBRARIES");
    for (const char *const *l = opts->libraries; l && *l; l++) n += strlen(*l) + 1;
    if (env) n += strlen(env) + 1;
    char *out = calloc(1, n);
    if (!out) return mn_fail(MANTA_ENOMEM, "library allow-list: out of memory");
    for (const char *const *l = opts->libraries; l && *l; l++) {
        if (!**l) continue;
        if (strchr(*l, ':')) {
            free(out);
            return mn_fail(MANTA_EINVAL, "library %s: a ':' in the path is not supported", *l);
        }
        if (*out) strcat(out, ":");
        strcat(out, *l);
    }
    if (env && *env) {
        if (*out) strcat(out, ":");
        strcat(out, env);
    }
    free(m->libraries);
    m->libraries = out;
    return 0;
}

/* Read MANTA_LIBRARIES at the agent's start. A path is kept resolved, so a
 * spawn matches it however it spells the same file; one that does not
 * resolve here is left out, and said so. */
static int load_allow_list(node *nd)
{
    const char *env = getenv("MANTA_LIBRARIES");
    char *copy = mn_strdup(env && *env ? env : "");
    size_t cap = 1;
    for (const char *p = copy; p && *p; p++) cap += *p == ':';
    nd->libs = calloc(cap, sizeof *nd->libs);
    if (!copy || !nd->libs) return free(copy), MANTA_ENOMEM;
    char *save = NULL;
    for (char *t = strtok_r(copy, ":", &save); t; t = strtok_r(NULL, ":", &save)) {
        char resolved[PATH_MAX];
        if (strchr(t, '/') && !realpath(t, resolved)) {
            mn_log("node %s: library %s of the allow-list: %s; spawns naming it are refused",
                   nd->m->self, t, strerror(errno));
            continue;
        }
        char *keep = mn_strdup(strchr(t, '/') ? resolved : t);
        if (!keep) return free(copy), MANTA_ENOMEM;
        nd->libs[nd->nlibs++] = keep;
    }
    free(copy);
    return 0;
}

/* Is the spawn's library on the allow-list? On success c->library becomes
 * the allowed entry (the resolved path), so that the actor loads exactly
 * the file that was checked, not one dlopen's search finds first. */
static bool library_allowed(node *nd, child *c)
{
    char resolved[PATH_MAX];
    const char *want = c->library;
    if (strchr(want, '/')) {
        if (!realpath(want, resolved)) return false;
        want = resolved;
    }
    for (size_t i = 0; i < nd->nlibs; i++) {
        if (!strcmp(nd->libs[i], want)) {
            if (strlen(nd->libs[i]) >= sizeof c->library) return false;
            snprintf(c->library, sizeof c->library, "%s", nd->libs[i]);
            return true;
        }
    }
    return false;
}

/* Check a spawn request before anything is written: the class (built-in
 * ones here, library ones in the actor itself), the library and the
 * program. */
static int check_spawn(node *nd, manta_req *call, child *c)
{
    manta_ctx *m = nd->m;
    if (c->library[0] && !library_allowed(nd, c))
        return manta_reply_error(call, MANTA_ESPAWN,
                                 "node %s: library %s is not on this node's allow-list; a node "
                                 "loads classes only from the libraries named at its start (the "
                                 "spec's library: entries, manta_options.libraries, "
                                 "MANTA_LIBRARIES for `manta node`)",
                                 m->self, c->library),
               MANTA_ESPAWN;
    if (!c->library[0] && !mn_find_class(m, c->cls, NULL))
        return manta_reply_error(call, MANTA_ENOCLASS, "node %s: %s", m->self, manta_last_error()),
               MANTA_ENOCLASS;
    if (!own_program(c->exe))
        return manta_reply_error(call, MANTA_ESPAWN,
                                 "node %s: runs only its own program, not %s (a driver and its "
                                 "nodes must run the same executable)",
                                 m->self, c->exe),
               MANTA_ESPAWN;
    if (access(c->exe, X_OK) != 0)
        return manta_reply_error(call, MANTA_ESPAWN, "node %s: program %s is not executable here",
                                 m->self, c->exe),
               MANTA_ESPAWN;
    return 0;
}

/* Give c its GPUs (a restarting actor keeps its own): whole ones, the
 * lowest-numbered that no actor of this agent holds any of; or, for a
 * fraction, the lowest-numbered device whose holders leave that much of it
 * (as Ray's fractional num_gpus: the actors share the device, and the
 * fractions are a promise between them, not a limit the device enforces).
 * Or refuse the spawn, saying what is free. */
static int assign_gpus(node *nd, manta_req *call, child *c)
{
    double used_of[MN_MAX_GPUS] = {0};
    for (child *o = nd->children; o; o = o->next)
        for (int i = 0; i < o->ngpu; i++) used_of[o->gpus[i]] += o->share;
    int want = c->gpu <= 0 ? 0 : c->gpu < 1 ? 1 : (int)c->gpu;
    c->share = c->gpu < 1 ? c->gpu : 1;
    c->ngpu = 0;
    size_t used = 0;
    c->cuda_devices[0] = 0;
    for (int d = 0; d < nd->ngpu_ids && c->ngpu < want; d++) {
        if (used_of[d] + c->share > 1 + 1e-9) continue;
        c->gpus[c->ngpu++] = d;
        used += (size_t)snprintf(c->cuda_devices + used, sizeof c->cuda_devices - used, "%s%s",
                                 used ? "," : "", nd->gpu_ids[d]);
    }
    if (c->ngpu == want) return 0;
    c->ngpu = 0;
    double free_sum = 0;
    for (int d = 0; d < nd->ngpu_ids; d++) free_sum += used_of[d] < 1 ? 1 - used_of[d] : 0;
    return manta_reply_error(call, MANTA_ESPAWN,
                             "node %s: actor %s asks for %g GPU(s); %g of this node's %d are free "
                             "(a node's GPUs: CUDA_VISIBLE_DEVICES or MANTA_NODE_GPU at its "
                             "start, else /proc/driver/nvidia/gpus)",
                             nd->m->self, c->name, c->gpu, free_sum, nd->ngpu_ids),
           MANTA_ESPAWN;
}

/* Claim the name (once per job: HSETNX) and write the directory record. */
static int register_child(node *nd, manta_req *call, child *c, const void *args, size_t args_len)
{
    manta_ctx *m = nd->m;
    int rc = manta_reg_actor_claim(m, c->name, c->cls);
    if (rc) return manta_reply_error(call, rc, "node %s: %s", m->self, manta_last_error()), rc;
    choose_endpoint(nd, c);
    manta_reg_actor rec = {.max_restarts = c->max_restarts};
    snprintf(rec.info.node, sizeof rec.info.node, "%s", m->self);
    snprintf(rec.info.endpoint, sizeof rec.info.endpoint, "%s", c->endpoint);
    snprintf(rec.library, sizeof rec.library, "%s", c->library);
    if (c->local[0]) {
        snprintf(rec.info.endpoint_local, sizeof rec.info.endpoint_local, "%s", c->local);
        snprintf(rec.info.host, sizeof rec.info.host, "%s", mn_host_id());
    }
    rc = manta_reg_actor_create(m, c->name, &rec, args, args_len);
    if (rc) {
        manta_reply_error(call, rc, "node %s: %s", m->self, manta_last_error());
        check(m, manta_reg_actor_forget(m, c->name), "cleanup", c->name);
    }
    return rc;
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
    int rc = parse_spawn(arg, len, c, &args, &args_len, err, sizeof err);
    if (rc) manta_reply_error(call, rc, "%s", err);
    if (rc == 0) rc = check_spawn(nd, call, c);
    if (rc == 0) rc = assign_gpus(nd, call, c);
    if (rc == 0) rc = register_child(nd, call, c, args, args_len);
    if (rc) {
        free(c);
        return;
    }
    c->incarnation = 1;
    rc = start_child(nd, c);
    if (rc) {
        check(m, manta_reg_actor_set_state(m, c->name, MANTA_ACTOR_FAILED, manta_last_error()),
              "state", c->name);
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
}

static child *find_child(node *nd, const char *name)
{
    for (child *c = nd->children; c; c = c->next)
        if (!strcmp(c->name, name)) return c;
    return NULL;
}

static void forget_actor(manta_ctx *m, const char *name)
{
    check(m, manta_reg_actor_forget(m, name), "removal", name);
}

static void child_exited(node *nd, child *c, int status)
{
    manta_ctx *m = nd->m;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    c->pid = 0;
    if (code == MN_EXIT_LEAKED)
        mn_log("node %s: actor %s leaked memory (LeakSanitizer's report is in its log)", m->self,
               c->name);
    bool remove = true;
    manta_req *kill_call = c->kill_call;
    c->kill_call = NULL;
    if (c->superseded) {
        /* the directory record is another incarnation's now */
    } else if (c->stopping || nd->shutdown) {
        forget_actor(m, c->name);
        if (c->stop_call) manta_reply(c->stop_call, NULL, 0);
    } else if (code == 3 || code == 127) {
        /* Failed start: the actor wrote why; retrying would fail the same way. */
        check(m,
              manta_reg_actor_set_state(m, c->name, MANTA_ACTOR_FAILED,
                                        code == 127 ? "exec of the program failed" : NULL),
              "state", c->name);
    } else if (!c->no_restart && (c->max_restarts < 0 || c->restarts < c->max_restarts)) {
        c->restarts++;
        c->incarnation++;
        mn_log("node %s: actor %s (pid exit %d, signal %d) restarting as incarnation %d", m->self,
               c->name, code, sig, c->incarnation);
        check(m, manta_reg_actor_set_state(m, c->name, MANTA_ACTOR_RESTARTING, NULL), "state",
              c->name);
        if (start_child(nd, c) == 0)
            remove = false;
        else
            check(m, manta_reg_actor_set_state(m, c->name, MANTA_ACTOR_DEAD, manta_last_error()),
                  "state", c->name);
    } else {
        char why[128];
        snprintf(why, sizeof why, "exited with code %d signal %d after %d restarts", code, sig,
                 c->restarts);
        check(m, manta_reg_actor_set_state(m, c->name, MANTA_ACTOR_DEAD, why), "state", c->name);
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

static int node_register(manta_ctx *m);

/* The driver's watchdog declared this agent dead (it was cut off, or
 * silent while its socket did not answer) and its heartbeat is back: join
 * the node set again. Its actors whose directory records were given to new
 * incarnations elsewhere, or marked lost, are killed without touching those
 * records; the ones still recorded here go on. */
static void readmit(node *nd)
{
    manta_ctx *m = nd->m;
    if (node_register(m) != 0) {
        mn_log("node %s: re-admission: %s", m->self, manta_last_error());
        return;
    }
    int kept = 0, dropped = 0;
    manta_reg_actor *rec = malloc(sizeof *rec);
    for (child *c = nd->children; rec && c; c = c->next) {
        int rc = manta_reg_actor_read(m, c->name, rec);
        if (rc == MANTA_EREDIS) continue; /* the next heartbeat looks again */
        if (rc == 0 && !strcmp(rec->info.node, m->self) && rec->info.state != MANTA_ACTOR_DEAD) {
            kept++;
            continue;
        }
        dropped++;
        c->superseded = c->stopping = true;
        if (c->pid > 0) kill(c->pid, SIGKILL);
    }
    free(rec);
    mn_log("node %s: declared dead by the driver, but alive: re-admitted (%d actor(s) kept, %d "
           "replaced elsewhere or lost: stopped)",
           m->self, kept, dropped);
}

static void node_heartbeat(void *arg)
{
    node *nd = arg;
    manta_ctx *m = nd->m;
    manta_reg_node rec;
    if (manta_reg_node_heartbeat(m, m->self) != 0)
        mn_log("node %s: heartbeat: %s", m->self, manta_last_error());
    else if (manta_reg_node_read(m, m->self, &rec) == 0 && rec.state == MANTA_ACTOR_DEAD)
        readmit(nd);
    manta_timer_add(m, 1000, node_heartbeat, nd);
}

/* The agent's actors as "NAME CLASS PID INCARNATION RESTARTS" lines. */
static void list_children(node *nd, manta_req *call)
{
    size_t cap = 1, n = 0;
    for (child *c = nd->children; c; c = c->next) cap += strlen(c->name) + strlen(c->cls) + 40;
    char *out = malloc(cap);
    if (!out) {
        manta_reply_error(call, MANTA_ENOMEM, "node %s: list: out of memory", nd->m->self);
        return;
    }
    for (child *c = nd->children; c; c = c->next)
        n += (size_t)snprintf(out + n, cap - n, "%s %s %d %d %d\n", c->name, c->cls, (int)c->pid,
                              c->incarnation, c->restarts);
    manta_reply(call, out, n);
    free(out);
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
        list_children(nd, call);
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

/* The GPUs this agent gives out. CUDA_VISIBLE_DEVICES, when the agent was
 * started with it, lists them by the names actors will be given; else
 * they are 0..N-1 for the N devices the NVIDIA driver lists under
 * /proc/driver/nvidia/gpus. MANTA_NODE_GPU=N, when set, is the count
 * (the first N names, or 0..N-1: a node may offer fewer GPUs than it has,
 * and a test may offer GPUs it has not). More than MN_MAX_GPUS: refused. */
static int node_gpus(node *nd)
{
    manta_ctx *m = nd->m;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES"), *want = getenv("MANTA_NODE_GPU");
    int n = 0;
    if (vis) {
        const char *p = vis;
        while (*p) {
            size_t len = strcspn(p, ",");
            if (len == 0 || len >= sizeof nd->gpu_ids[0] || n == MN_MAX_GPUS)
                return mn_fail(MANTA_EINVAL,
                               "node %s: CUDA_VISIBLE_DEVICES '%s': expected up to %d names of "
                               "1..%zu characters, separated by commas",
                               m->self, vis, MN_MAX_GPUS, sizeof nd->gpu_ids[0] - 1);
            snprintf(nd->gpu_ids[n++], sizeof nd->gpu_ids[0], "%.*s", (int)len, p);
            p += len + (p[len] == ',');
        }
    } else {
        DIR *d = opendir("/proc/driver/nvidia/gpus");
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL)
            if (e->d_name[0] != '.' && n < MN_MAX_GPUS) n++;
        if (d) closedir(d);
        for (int i = 0; i < n; i++) snprintf(nd->gpu_ids[i], sizeof nd->gpu_ids[0], "%d", i);
    }
    if (want && *want) {
        char *end;
        long w = strtol(want, &end, 10);
        if (*end || w < 0 || w > MN_MAX_GPUS || (vis && w > n))
            return mn_fail(MANTA_EINVAL, "node %s: MANTA_NODE_GPU '%s': expected 0..%d%s", m->self,
                           want, vis ? n : MN_MAX_GPUS,
                           vis ? " (the devices CUDA_VISIBLE_DEVICES lists)" : "");
        if (!vis)
            for (int i = n; i < w; i++) snprintf(nd->gpu_ids[i], sizeof nd->gpu_ids[0], "%d", i);
        n = (int)w;
    }
    nd->ngpu_ids = n;
    return 0;
}

/* Join the node set with this agent's record: resources offered for
 * placement are the machine's unless MANTA_NODE_CPU/MEMORY say; its GPUs
 * are node_gpus'. */
static int node_register(manta_ctx *m)
{
    manta_reg_node rec = {.pid = (int)getpid()};
    snprintf(rec.endpoint, sizeof rec.endpoint, "%s", m->endpoint);
    snprintf(rec.transport, sizeof rec.transport, "%s", m->transport);
    if (gethostname(rec.host, sizeof rec.host - 1) != 0) snprintf(rec.host, sizeof rec.host, "?");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const char *cpu = getenv("MANTA_NODE_CPU"), *mem = getenv("MANTA_NODE_MEMORY");
    rec.cpu = cpu && *cpu ? atof(cpu) : (double)(ncpu > 0 ? ncpu : 1);
    rec.gpu = the_node.ngpu_ids;
    rec.memory = mem && *mem ? strtoull(mem, NULL, 10)
                             : (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    return manta_reg_node_register(m, m->self, &rec);
}

int mn_node_main(manta_ctx *m)
{
    node *nd = &the_node;
    nd->m = m;
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (mn_private_dir(m->rundir, "run folder") != 0) {
        mn_log("node %s: %s", m->self, manta_last_error());
        _exit(3);
    }
    if (load_allow_list(nd) != 0) {
        mn_log("node %s: library allow-list: out of memory", m->self);
        _exit(3);
    }
    if (node_gpus(nd) != 0) {
        mn_log("%s", manta_last_error());
        _exit(3);
    }
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
    if (node_register(m) != 0) {
        mn_log("node %s: register: %s", m->self, manta_last_error());
        _exit(3);
    }
    manta_timer_add(m, 10, reap, nd);
    manta_timer_add(m, 1000, node_heartbeat, nd);

    while (!nd->shutdown && !got_term) mn_loop_once(m, 100);

    stop_all(nd);
    if (manta_reg_node_forget(m, m->self) != 0)
        mn_log("node %s: leave: %s", m->self, manta_last_error());
    if (nd->shutdown_call) manta_reply(nd->shutdown_call, NULL, 0);
    /* Let the reply leave before the sockets close. */
    mn_loop_free(m);
    zmq_ctx_term(m->zmq);
    mn_exit(0);
}
