/*
 * cli.c -- the `manta` command: run, status, scale, stop, logs, node.
 *
 * `manta run SPEC` is a driver: it loads the spec (runtime/spec.c), starts
 * or joins Redis, starts a local node agent, records the job in Redis
 * (manta:JOB:driver, manta:JOB:group:NAME, the list manta:JOB:groups) and in
 * a small state file (so later commands find the job by name), places every
 * replica on a node with room, starts them all at once and waits until all
 * are ready. If the spec has a `run: {group, method, timeout_s}` section it
 * calls that method on GROUP-0 and prints the answer; otherwise it serves
 * until `manta stop` or Ctrl-C. Then it tears everything down.
 *
 * The other commands attach to a running job (manta_options.attach): they
 * read the records, create or drain actors through the node agents, and
 * leave without touching what they did not make.
 */
#include "internal.h"
#include "manta_cli.h"
#include "manta_spec.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t g_signal;

static void on_signal(int sig)
{
    g_signal = sig;
}

typedef struct cli {
    const char *cmd;
    const char *args[8];
    int nargs;
    const char *redis, *job, *log_dir, *host, *name, *cpu, *gpu, *memory, *transport;
    const char *sets[64];
    int nsets;
    int detach, follow, verbose;
    double timeout_s;
    const manta_class *const *classes;
} cli;

static const char *usage_text =
    "usage: manta COMMAND [ARGS] [OPTIONS]\n"
    "\n"
    "Commands:\n"
    "  run SPEC          launch the actor graph of a spec file, run its job, tear down\n"
    "  status            nodes, groups (ready/wanted), restarts, message rates\n"
    "  scale GROUP N     grow or shrink a group of a running job to N replicas\n"
    "  stop              stop a running job (its driver tears everything down)\n"
    "  logs ACTOR        print an actor's output (kept in RUN_DIR/logs/ACTOR.log)\n"
    "  node              run a node agent for a job on this machine (multi-node)\n"
    "  version           print the version\n"
    "  help [COMMAND]    this text, or a command's\n"
    "\n"
    "Options:\n"
    "  --set PATH=VALUE  override a spec value (run, scale): rollout.replicas=4, rl.eta=2\n"
    "  --redis URL       redis://[:password@]host:port instead of the spec's or the embedded one\n"
    "  --job NAME        which job (status, scale, stop, logs); default: the last one run here\n"
    "  --detach          run: return once every actor is ready; the job keeps running\n"
    "  --log-dir DIR     run: where run folders go (default: the spec's log_dir, else runs/)\n"
    "  --timeout SEC     run: readiness wait (60); scale: drain wait (120)\n"
    "  --follow, -f      logs: keep printing what the actor writes\n"
    "  --verbose, -v     status: one line per actor too\n"
    "  --host ADDR       node: address other machines reach this one at (tcp)\n"
    "  --name ID, --cpu N, --gpu N, --memory SIZE   node: identity and resources offered\n"
    "\n"
    "Exit codes: 0 done; 1 the job's run method failed; 2 bad command line or spec;\n"
    "3 runtime failure (Redis, spawn, placement); 4 a wait timed out; 5 no such job,\n"
    "group or actor; 130 interrupted (torn down cleanly).\n";

static const char *command_help(const char *cmd)
{
    if (!strcmp(cmd, "run"))
        return "manta run SPEC [--set PATH=VALUE]... [--redis URL] [--detach] [--log-dir DIR]\n"
               "  Loads SPEC (errors name file:line:col), starts the embedded Redis unless the\n"
               "  spec or --redis names one, starts a node agent here, places every replica\n"
               "  (named GROUP-I) on a node with room, waits until all are ready, then calls\n"
               "  the spec's run: {group, method, timeout_s} on GROUP-0 and prints its answer.\n"
               "  Without run: it serves until `manta stop` or Ctrl-C. Actors' output goes to\n"
               "  RUN_DIR/logs/NAME.log; RUN_DIR (LOG_DIR/JOB) is in MANTA_RUN_DIR for them.\n";
    if (!strcmp(cmd, "status"))
        return "manta status [--job NAME] [-v]\n"
               "  Shows the job's driver, nodes with their resources and heartbeat age,\n"
               "  groups with replicas ready/wanted, restarts and calls served per second.\n";
    if (!strcmp(cmd, "scale"))
        return "manta scale GROUP N [--job NAME] [--timeout SEC]\n"
               "  Grows GROUP with new replicas (placed on nodes with room, given the spec's\n"
               "  settings) or shrinks it: the highest-numbered replicas are asked to `drain`\n"
               "  (finish or hand back their work), then stopped.\n";
    if (!strcmp(cmd, "stop")) return "manta stop [--job NAME]\n  Stops a running job cleanly.\n";
    if (!strcmp(cmd, "logs"))
        return "manta logs ACTOR [--follow] [--job NAME]\n  Prints RUN_DIR/logs/ACTOR.log.\n";
    if (!strcmp(cmd, "node"))
        return "manta node --redis URL --job NAME [--host ADDR] [--name ID] [--cpu N]\n"
               "           [--gpu N] [--memory SIZE]\n"
               "  Runs a node agent for JOB on this machine: it registers its address and\n"
               "  resources in Redis and starts the actors placed on it, over tcp. It exits\n"
               "  when the job ends.\n";
    return NULL;
}

/* ---- small helpers ---- */

static int mkdirs(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static void state_dir(char *out, size_t n)
{
    const char *d = getenv("MANTA_STATE_DIR");
    if (d && *d)
        snprintf(out, n, "%s", d);
    else
        snprintf(out, n, "/tmp/manta-state-%d", (int)getuid());
}

typedef struct job_state {
    char job[64], redis[600], run_dir[PATH_MAX];
    int pid;
} job_state;

static int state_write(const job_state *st)
{
    char dir[PATH_MAX], path[PATH_MAX + 80];
    state_dir(dir, sizeof dir);
    if (mkdirs(dir) != 0) return -1;
    chmod(dir, 0700); /* the file holds the Redis password */
    snprintf(path, sizeof path, "%s/%s.job", dir, st->job);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "job=%s\nredis=%s\nrun_dir=%s\npid=%d\n", st->job, st->redis, st->run_dir, st->pid);
    fclose(f);
    snprintf(path, sizeof path, "%s/current", dir);
    f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "%s\n", st->job);
    fclose(f);
    return 0;
}

static void state_remove(const char *job)
{
    char dir[PATH_MAX], path[PATH_MAX + 80], cur[80] = "";
    state_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s.job", dir, job);
    unlink(path);
    snprintf(path, sizeof path, "%s/current", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(cur, sizeof cur, f)) cur[strcspn(cur, "\n")] = 0;
        fclose(f);
        if (!strcmp(cur, job)) unlink(path);
    }
}

static int state_read(const char *job, job_state *st)
{
    char dir[PATH_MAX], path[PATH_MAX + 80], name[80] = "";
    state_dir(dir, sizeof dir);
    memset(st, 0, sizeof *st);
    if (!job) {
        snprintf(path, sizeof path, "%s/current", dir);
        FILE *f = fopen(path, "r");
        if (!f) return -1;
        if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = 0;
        fclose(f);
        job = name;
    }
    snprintf(path, sizeof path, "%s/%s.job", dir, job);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[PATH_MAX + 64];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "job=", 4)) snprintf(st->job, sizeof st->job, "%s", line + 4);
        if (!strncmp(line, "redis=", 6)) snprintf(st->redis, sizeof st->redis, "%s", line + 6);
        if (!strncmp(line, "run_dir=", 8))
            snprintf(st->run_dir, sizeof st->run_dir, "%s", line + 8);
        if (!strncmp(line, "pid=", 4)) st->pid = atoi(line + 4);
    }
    fclose(f);
    return st->job[0] ? 0 : -1;
}

static bool cli_class_exists(const char *name, void *user)
{
    const manta_class *const *c = user;
    for (; c && *c; c++)
        if (!strcmp((*c)->name, name)) return true;
    return false;
}

/* Attach to a running job found through its state file (or --job/--redis). */
static int attach(cli *c, manta_ctx **m, job_state *st)
{
    if (state_read(c->job, st) != 0) {
        if (!c->job || !c->redis) {
            fprintf(stderr, "manta: no running job %s%s found here (give --job and --redis)\n",
                    c->job ? "named " : "", c->job ? c->job : "");
            return MANTA_EXIT_NOT_FOUND;
        }
        snprintf(st->job, sizeof st->job, "%s", c->job);
    }
    if (c->redis) snprintf(st->redis, sizeof st->redis, "%s", c->redis);
    manta_options o = {.redis_url = st->redis,
                       .job = st->job,
                       .classes = c->classes,
                       .attach = 1,
                       .transport = c->transport};
    if (manta_init(m, &o) != 0) {
        fprintf(stderr, "manta: job %s: %s\n", st->job, manta_last_error());
        return MANTA_EXIT_RUNTIME;
    }
    return 0;
}

/* Nodes of the job with their capacity, for placement. */
typedef struct node_list {
    size_t n;
    char ids[64][64];
    manta_spec_capacity cap[64];
} node_list;

static int read_nodes(manta_ctx *m, node_list *nl)
{
    char setkey[256], key[256];
    nl->n = 0;
    mn_key(m, setkey, sizeof setkey, "nodes", NULL);
    redisReply *r = mn_redis(m, "SMEMBERS %s", setkey);
    if (!r) return MANTA_EREDIS;
    for (size_t i = 0; i < r->elements && nl->n < 64; i++) {
        size_t k = nl->n;
        snprintf(nl->ids[k], sizeof nl->ids[k], "%s", r->element[i]->str);
        mn_key(m, key, sizeof key, "node", nl->ids[k]);
        redisReply *h = mn_redis(m, "HMGET %s cpu gpu memory state", key);
        if (!h) continue;
        if (h->elements == 4 && h->element[3]->str && !strcmp(h->element[3]->str, "alive")) {
            nl->cap[k].name = nl->ids[k];
            nl->cap[k].cpu = h->element[0]->str ? atof(h->element[0]->str) : 1;
            nl->cap[k].gpu = h->element[1]->str ? atoi(h->element[1]->str) : 0;
            nl->cap[k].memory_bytes = h->element[2]->str ? strtoull(h->element[2]->str, 0, 10) : 0;
            nl->n++;
        }
        freeReplyObject(h);
    }
    freeReplyObject(r);
    /* Placement is first-fit: make the order deterministic, node ids in
     * order, with the local (driver's) node first so it fills before others. */
    for (size_t i = 1; i < nl->n; i++) {
        for (size_t j = i; j > 0 && strcmp(nl->ids[j - 1], nl->ids[j]) > 0; j--) {
            char tmp[64];
            manta_spec_capacity c = nl->cap[j];
            memcpy(tmp, nl->ids[j], 64);
            memcpy(nl->ids[j], nl->ids[j - 1], 64);
            nl->cap[j] = nl->cap[j - 1];
            memcpy(nl->ids[j - 1], tmp, 64);
            nl->cap[j - 1] = c;
        }
    }
    for (size_t i = 1; i < nl->n; i++) {
        if (!strcmp(nl->ids[i], m->node)) {
            char tmp[64];
            manta_spec_capacity c = nl->cap[i];
            memcpy(tmp, nl->ids[i], 64);
            memcpy(nl->ids[i], nl->ids[0], 64);
            nl->cap[i] = nl->cap[0];
            memcpy(nl->ids[0], tmp, 64);
            nl->cap[0] = c;
        }
    }
    for (size_t i = 0; i < nl->n; i++) nl->cap[i].name = nl->ids[i];
    return 0;
}

/* Subtract what running actors already use on each node. */
static void subtract_usage(manta_ctx *m, node_list *nl)
{
    char setkey[256], key[256];
    mn_key(m, setkey, sizeof setkey, "actors", NULL);
    redisReply *r = mn_redis(m, "SMEMBERS %s", setkey);
    if (!r) return;
    for (size_t i = 0; i < r->elements; i++) {
        mn_key(m, key, sizeof key, "actor", r->element[i]->str);
        redisReply *h = mn_redis(m, "HMGET %s node cpu gpu memory", key);
        if (!h) continue;
        for (size_t k = 0; h->elements == 4 && h->element[0]->str && k < nl->n; k++) {
            if (strcmp(nl->ids[k], h->element[0]->str)) continue;
            if (h->element[1]->str) nl->cap[k].cpu -= atof(h->element[1]->str);
            if (h->element[2]->str) nl->cap[k].gpu -= atoi(h->element[2]->str);
            if (h->element[3]->str) {
                uint64_t mem = strtoull(h->element[3]->str, 0, 10);
                nl->cap[k].memory_bytes =
                    nl->cap[k].memory_bytes > mem ? nl->cap[k].memory_bytes - mem : 0;
            }
        }
        freeReplyObject(h);
    }
    freeReplyObject(r);
}

/* Start replica `replica` of group g on node `node` without waiting. */
static int start_replica(manta_ctx *m, const manta_spec *s, size_t g, int replica, const char *node,
                         manta_actor **out)
{
    const manta_spec_group *grp = &s->groups[g];
    char *payload = NULL, name[128];
    size_t len = 0;
    if (manta_spec_init_payload(s, g, replica, &payload, &len) != 0)
        return mn_fail(MANTA_ENOMEM, "init payload of %s-%d", grp->name, replica);
    snprintf(name, sizeof name, "%s-%d", grp->name, replica);
    manta_actor_options o = {.cls = grp->class_name,
                             .name = name,
                             .args = payload,
                             .args_len = len,
                             .max_restarts = grp->max_restarts,
                             .node = node,
                             .library = grp->library_path,
                             .no_wait = 1};
    int rc = manta_actor_create(m, &o, out);
    free(payload);
    if (rc == 0) {
        /* What it holds, so placement later knows what is used where. */
        char key[256];
        mn_key(m, key, sizeof key, "actor", name);
        freeReplyObject(mn_redis(m, "HSET %s group %s cpu %g gpu %d memory %llu", key, grp->name,
                                 grp->cpu, grp->gpu, (unsigned long long)grp->memory_bytes));
    }
    return rc;
}

static manta_spec *load_spec(cli *c, const char *path, const char *const *sets, size_t nsets)
{
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets,
                             .n_sets = nsets,
                             .class_exists = cli_class_exists,
                             .user = (void *)c->classes};
    manta_spec *s = manta_spec_load_file(path, &so, &errs);
    if (!s) manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    return s;
}

/* ---- services (run) ----
 *
 * A spec may name processes the job needs that are not actors, such as the
 * external tool servers an agent calls:
 *
 *   services:
 *     - {name: calc, command: "python3 examples/calc_server.py --port 8000",
 *        port: 8000, ready_timeout_s: 20}
 *
 * `manta run` starts each with /bin/sh -c in the directory it was started
 * from, output to RUN_DIR/logs/NAME.log, waits until it accepts TCP
 * connections on 127.0.0.1:PORT (when a port is given), and stops it
 * (SIGTERM to its process group, then SIGKILL) when the job ends. A port
 * already taken is an error: the job would talk to a stranger. */

typedef struct service {
    char name[64];
    pid_t pid;
} service;

static int port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static void stop_services(service *sv, int n)
{
    for (int i = 0; i < n; i++)
        if (sv[i].pid > 0) kill(-sv[i].pid, SIGTERM);
    int64_t until = mn_now_ms() + 3000;
    for (int i = 0; i < n; i++) {
        if (sv[i].pid <= 0) continue;
        int status;
        while (waitpid(sv[i].pid, &status, WNOHANG) == 0 && mn_now_ms() < until)
            usleep(10000); /* a child's exit: nothing to poll but time */
        if (waitpid(sv[i].pid, &status, WNOHANG) == 0) {
            kill(-sv[i].pid, SIGKILL);
            waitpid(sv[i].pid, &status, 0);
        }
        sv[i].pid = 0;
    }
}

/* Start the spec's services; returns how many are running, or -1. */
static int start_services(const manta_spec *s, const char *logs, service *sv, int max)
{
    const manta_spec_node *seq = NULL;
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    if (manta_spec_get_seq(s->root, "services", &seq, &errs) < 0) {
        manta_spec_errors_print(&errs, stderr);
        manta_spec_errors_destroy(&errs);
        return -1;
    }
    int n = 0;
    for (size_t i = 0; seq && i < manta_spec_len(seq); i++) {
        const manta_spec_node *it = manta_spec_at(seq, i);
        const char *name = NULL, *cmd = NULL;
        int64_t port = 0;
        double ready_s = 20;
        if (manta_spec_get_str(it, "name", NULL, &name, &errs) != 0 ||
            manta_spec_get_str(it, "command", NULL, &cmd, &errs) != 0 ||
            manta_spec_get_int(it, "port", 0, &port, &errs) < 0 ||
            manta_spec_get_double(it, "ready_timeout_s", 20, &ready_s, &errs) < 0 || n == max) {
            if (!errs.count)
                manta_spec_errors_add(&errs, s->file, it->line, it->col, "services",
                                      "each service needs a name and a command (at most %d)", max);
            manta_spec_errors_print(&errs, stderr);
            manta_spec_errors_destroy(&errs);
            stop_services(sv, n);
            return -1;
        }
        if (port > 0 && port_open((int)port)) {
            fprintf(stderr,
                    "manta run: service %s: port %lld is already taken by another process; stop "
                    "it or change the spec\n",
                    name, (long long)port);
            manta_spec_errors_destroy(&errs);
            stop_services(sv, n);
            return -1;
        }
        char logf[PATH_MAX + 80];
        snprintf(logf, sizeof logf, "%s/%s.log", logs, name);
        snprintf(sv[n].name, sizeof sv[n].name, "%s", name);
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid == 0) {
            setpgid(0, 0);
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent) _exit(1);
            int fd = open(logf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        if (pid < 0) {
            stop_services(sv, n);
            return -1;
        }
        sv[n++].pid = pid;
        int64_t until = mn_now_ms() + (int64_t)(ready_s * 1000);
        while (port > 0 && !port_open((int)port)) {
            int status;
            if (waitpid(pid, &status, WNOHANG) == pid || mn_now_ms() > until) {
                fprintf(stderr, "manta run: service %s did not come up on port %lld (see %s)\n",
                        name, (long long)port, logf);
                sv[n - 1].pid = waitpid(pid, &status, WNOHANG) == 0 ? pid : 0;
                stop_services(sv, n);
                manta_spec_errors_destroy(&errs);
                return -1;
            }
            usleep(20000); /* another process binding a port: poll it */
        }
        fprintf(stderr, "manta: service %s started (pid %d)\n", name, (int)pid);
    }
    manta_spec_errors_destroy(&errs);
    return n;
}

/* ---- node watchdog (run) ---- */

/* A node whose heartbeat is older than this is declared dead (ms). */
static int64_t node_timeout_ms(void)
{
    const char *v = getenv("MANTA_NODE_TIMEOUT_MS");
    return v && atoll(v) > 0 ? atoll(v) : 5000;
}

/* Re-create one actor of a dead node on a node with room, from its own
 * directory record (class, library, init bytes, restarts allowed). */
static void move_actor(manta_ctx *m, const char *name, const char *dead_node)
{
    char key[256], setkey[256];
    mn_key(m, key, sizeof key, "actor", name);
    mn_key(m, setkey, sizeof setkey, "actors", NULL);
    redisReply *r =
        mn_redis(m, "HMGET %s class library args max_restarts group cpu gpu memory", key);
    if (!r || r->elements != 8 || !r->element[0]->str) {
        freeReplyObject(r);
        return;
    }
    char cls[128], lib[512], group[64];
    snprintf(cls, sizeof cls, "%s", r->element[0]->str);
    snprintf(lib, sizeof lib, "%s", r->element[1]->str ? r->element[1]->str : "");
    snprintf(group, sizeof group, "%s", r->element[4]->str ? r->element[4]->str : "");
    size_t args_len = r->element[2]->str ? r->element[2]->len : 0;
    char *args = malloc(args_len ? args_len : 1);
    if (args_len) memcpy(args, r->element[2]->str, args_len);
    int max_restarts = r->element[3]->str ? atoi(r->element[3]->str) : 0;
    manta_spec_demand d = {group, 1, r->element[5]->str ? atof(r->element[5]->str) : 0,
                           r->element[6]->str ? atoi(r->element[6]->str) : 0,
                           r->element[7]->str ? strtoull(r->element[7]->str, 0, 10) : 0};
    freeReplyObject(r);
    /* The old record goes; the name is taken again by the new incarnation. */
    freeReplyObject(mn_redis(m, "DEL %s", key));
    freeReplyObject(mn_redis(m, "SREM %s %s", setkey, name));
    node_list nl;
    read_nodes(m, &nl);
    subtract_usage(m, &nl);
    size_t where = 0;
    char why[512];
    manta_actor *a;
    if (nl.n == 0 || manta_spec_place(&d, 1, nl.cap, nl.n, MANTA_SPEC_FIRST_FIT, false, &where, why,
                                      sizeof why) != 0) {
        fprintf(stderr, "manta: node %s died; no room for actor %s elsewhere: %s\n", dead_node,
                name, nl.n ? why : "no node left");
        freeReplyObject(mn_redis(m, "HSET %s class %s state dead node %s error %s", key, cls,
                                 dead_node, "its node died and no other node had room"));
        freeReplyObject(mn_redis(m, "SADD %s %s", setkey, name));
        free(args);
        return;
    }
    manta_actor_options o = {.cls = cls,
                             .name = name,
                             .args = args,
                             .args_len = args_len,
                             .max_restarts = max_restarts,
                             .node = nl.ids[where],
                             .library = lib[0] ? lib : NULL,
                             .no_wait = 1};
    if (manta_actor_create(m, &o, &a) == 0) {
        freeReplyObject(mn_redis(m, "HSET %s group %s cpu %g gpu %d memory %llu", key, group, d.cpu,
                                 d.gpu, (unsigned long long)d.memory_bytes));
        fprintf(stderr, "manta: node %s died; actor %s restarted on node %s\n", dead_node, name,
                nl.ids[where]);
    } else {
        fprintf(stderr, "manta: node %s died; restarting actor %s: %s\n", dead_node, name,
                manta_last_error());
    }
    free(args);
}

static void watch_nodes(void *arg)
{
    manta_ctx *m = arg;
    char setkey[256], asetkey[256], key[256];
    mn_key(m, setkey, sizeof setkey, "nodes", NULL);
    mn_key(m, asetkey, sizeof asetkey, "actors", NULL);
    redisReply *r = mn_redis(m, "SMEMBERS %s", setkey);
    int64_t now = mn_wall_ms(), limit = node_timeout_ms();
    for (size_t i = 0; r && i < r->elements; i++) {
        const char *id = r->element[i]->str;
        mn_key(m, key, sizeof key, "node", id);
        char hb[32] = "";
        if (mn_redis_hget_str(m, key, "hb", hb, sizeof hb) != 0 || now - atoll(hb) <= limit)
            continue;
        fprintf(stderr, "manta: node %s: no heartbeat for %.1f s: declared dead\n", id,
                (double)(now - atoll(hb)) / 1000);
        freeReplyObject(mn_redis(m, "HSET %s state dead", key));
        freeReplyObject(mn_redis(m, "SREM %s %s", setkey, id));
        redisReply *names = mn_redis(m, "SMEMBERS %s", asetkey);
        for (size_t k = 0; names && k < names->elements; k++) {
            char ak[256], node[64] = "";
            mn_key(m, ak, sizeof ak, "actor", names->element[k]->str);
            if (mn_redis_hget_str(m, ak, "node", node, sizeof node) == 0 && !strcmp(node, id))
                move_actor(m, names->element[k]->str, id);
        }
        freeReplyObject(names);
        freeReplyObject(mn_redis(m, "DEL %s", key));
    }
    freeReplyObject(r);
    manta_timer_add(m, 1000, watch_nodes, m);
}

/* ---- run ---- */

static int wait_all_ready(manta_ctx *m, manta_actor **actors, size_t n, double timeout_s)
{
    int64_t until = mn_now_ms() + (int64_t)(timeout_s * 1000);
    for (size_t i = 0; i < n; i++) {
        int64_t left = until - mn_now_ms();
        int rc = manta_actor_wait_ready(m, actors[i], left > 0 ? (int)left : 1);
        if (rc) {
            fprintf(stderr, "manta: actor %s: %s\n", manta_actor_name(actors[i]),
                    manta_last_error());
            return rc == MANTA_ETIMEDOUT ? MANTA_EXIT_TIMEOUT : MANTA_EXIT_RUNTIME;
        }
        if (g_signal) return MANTA_EXIT_INTERRUPTED;
    }
    return 0;
}

static int cmd_run(cli *c)
{
    if (c->nargs != 1) {
        fprintf(stderr, "manta run: give one spec file\n%s", command_help("run"));
        return MANTA_EXIT_USAGE;
    }
    char spec_path[PATH_MAX];
    if (!realpath(c->args[0], spec_path)) {
        fprintf(stderr, "manta run: %s: %s\n", c->args[0], strerror(errno));
        return MANTA_EXIT_USAGE;
    }
    manta_spec *s = load_spec(c, spec_path, c->sets, (size_t)c->nsets);
    if (!s) return MANTA_EXIT_USAGE;
    const char *log_root = c->log_dir ? c->log_dir : s->log_dir ? s->log_dir : "runs";
    char rel_dir[PATH_MAX], run_dir[PATH_MAX], logs[PATH_MAX + 8];
    snprintf(rel_dir, sizeof rel_dir, "%s/%s", log_root, s->job);
    if (mkdirs(rel_dir) != 0 || !realpath(rel_dir, run_dir)) {
        fprintf(stderr, "manta run: run folder %s: %s\n", rel_dir, strerror(errno));
        manta_spec_free(s);
        return MANTA_EXIT_USAGE;
    }
    snprintf(logs, sizeof logs, "%s/logs", run_dir);
    mkdirs(logs);
    setenv("MANTA_RUN_DIR", run_dir, 1);

    int ready_pipe[2] = {-1, -1};
    if (c->detach) {
        if (pipe(ready_pipe) != 0) return MANTA_EXIT_RUNTIME;
        pid_t pid = fork();
        if (pid < 0) return MANTA_EXIT_RUNTIME;
        if (pid > 0) { /* the caller's process: wait for the verdict */
            close(ready_pipe[1]);
            char code = MANTA_EXIT_RUNTIME;
            if (read(ready_pipe[0], &code, 1) != 1) code = MANTA_EXIT_RUNTIME;
            if (code == 0)
                printf("job %s running in the background (driver pid %d); run folder %s\n"
                       "  manta status --job %s; manta stop --job %s\n",
                       s->job, (int)pid, run_dir, s->job, s->job);
            else
                fprintf(stderr, "manta run: the job did not start; see %s/driver.log\n", run_dir);
            manta_spec_free(s);
            return code;
        }
        close(ready_pipe[0]);
        setsid();
        char dlog[PATH_MAX + 16];
        snprintf(dlog, sizeof dlog, "%s/driver.log", run_dir);
        int fd = open(dlog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0), close(devnull);
    }
#define DONE(code)                                                                                 \
    do {                                                                                           \
        rc = (code);                                                                               \
        goto out;                                                                                  \
    } while (0)
    int rc = 0;
    manta_ctx *m = NULL;
    manta_actor **actors = NULL;
    service services[16];
    int nservices = 0;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    const char *redis = c->redis ? c->redis : s->redis.embedded ? NULL : s->redis_url;
    manta_options o = {.redis_url = redis,
                       .job = s->job,
                       .classes = c->classes,
                       .log_dir = logs,
                       .transport = c->transport,
                       .host = c->host};
    if (manta_init(&m, &o) != 0) {
        fprintf(stderr, "manta run: %s\n", manta_last_error());
        DONE(MANTA_EXIT_RUNTIME);
    }
    char key[256], pidbuf[16];
    mn_key(m, key, sizeof key, "driver", NULL);
    if (mn_redis_hget_str(m, key, "pid", pidbuf, sizeof pidbuf) == 0) {
        fprintf(stderr, "manta run: job %s is already running (driver pid %s); stop it first\n",
                s->job, pidbuf);
        m->attached = true; /* not ours to tear down */
        DONE(MANTA_EXIT_USAGE);
    }
    char host[128] = "localhost", sets[4096] = "";
    gethostname(host, sizeof host - 1);
    for (int i = 0; i < c->nsets; i++) {
        strncat(sets, c->sets[i], sizeof sets - strlen(sets) - 2);
        strcat(sets, "\n");
    }
    freeReplyObject(mn_redis(m, "HSET %s pid %d host %s spec %s sets %s run_dir %s started %lld",
                             key, (int)getpid(), host, spec_path, sets, run_dir,
                             (long long)mn_wall_ms()));
    char gl[256];
    mn_key(m, gl, sizeof gl, "groups", NULL);
    for (size_t g = 0; g < s->n_groups; g++) {
        char gk[256];
        mn_key(m, gk, sizeof gk, "group", s->groups[g].name);
        freeReplyObject(mn_redis(m, "HSET %s class %s wanted %d", gk, s->groups[g].class_name,
                                 s->groups[g].replicas));
        freeReplyObject(mn_redis(m, "RPUSH %s %s", gl, s->groups[g].name));
    }
    job_state st = {.pid = getpid()};
    snprintf(st.job, sizeof st.job, "%s", s->job);
    snprintf(st.redis, sizeof st.redis, "%s", manta_redis_url(m));
    snprintf(st.run_dir, sizeof st.run_dir, "%s", run_dir);
    if (state_write(&st) != 0) fprintf(stderr, "manta run: warning: cannot write the state file\n");

    if ((nservices = start_services(s, logs, services, 16)) < 0) {
        nservices = 0;
        DONE(MANTA_EXIT_RUNTIME);
    }

    /* Place every replica, then start them all at once. */
    node_list nl;
    read_nodes(m, &nl);
    manta_spec_demand *dem = calloc(s->n_groups, sizeof *dem);
    manta_spec_demands(s, dem);
    size_t total = manta_spec_total_replicas(dem, s->n_groups);
    size_t *node_of = calloc(total ? total : 1, sizeof *node_of);
    actors = calloc(total ? total : 1, sizeof *actors);
    char why[512];
    if (!dem || !node_of || !actors ||
        manta_spec_place(dem, s->n_groups, nl.cap, nl.n, MANTA_SPEC_FIRST_FIT, true, node_of, why,
                         sizeof why) != 0) {
        fprintf(stderr, "manta run: placement: %s\n", why);
        free(dem), free(node_of);
        DONE(MANTA_EXIT_RUNTIME);
    }
    size_t k = 0;
    int64_t t0 = mn_now_ms();
    for (size_t g = 0; g < s->n_groups; g++) {
        for (int r = 0; r < s->groups[g].replicas; r++, k++) {
            if (start_replica(m, s, g, r, nl.ids[node_of[k]], &actors[k]) != 0) {
                fprintf(stderr, "manta run: %s-%d: %s\n", s->groups[g].name, r, manta_last_error());
                free(dem), free(node_of);
                DONE(MANTA_EXIT_RUNTIME);
            }
        }
    }
    free(dem), free(node_of);
    double tmo = c->timeout_s > 0 ? c->timeout_s : 60;
    if ((rc = wait_all_ready(m, actors, total, tmo)) != 0) DONE(rc);
    fprintf(stderr, "manta: job %s: %zu actors ready in %.2f s on %zu node(s); run folder %s\n",
            s->job, total, (double)(mn_now_ms() - t0) / 1000, nl.n, run_dir);
    if (c->detach) {
        char zero = 0;
        if (write(ready_pipe[1], &zero, 1) != 1) { /* the caller went away; run anyway */
        }
        close(ready_pipe[1]);
        ready_pipe[1] = -1;
    }

    /* While the job runs, nodes that stop heart-beating are declared dead
     * and their actors re-created on nodes with room. */
    manta_timer_add(m, 1000, watch_nodes, m);
    const manta_spec_node *run = manta_spec_find(s->root, "run");
    if (run) {
        const char *group = NULL, *method = NULL;
        double timeout_s = 3600;
        manta_spec_get_str(run, "group", NULL, &group, NULL);
        manta_spec_get_str(run, "method", "run", &method, NULL);
        manta_spec_get_double(run, "timeout_s", 3600, &timeout_s, NULL);
        char name[128];
        snprintf(name, sizeof name, "%s-0", group ? group : "");
        manta_actor *a;
        if (!group || manta_actor_lookup(m, name, &a) != 0) {
            fprintf(stderr, "manta run: run: no actor %s to call\n", name);
            DONE(MANTA_EXIT_USAGE);
        }
        manta_future *f = manta_call_timeout(m, a, method, NULL, 0, (int)(timeout_s * 1000));
        int st2 = MANTA_EPENDING;
        while (st2 == MANTA_EPENDING && !g_signal) st2 = manta_get(f, 200, NULL, NULL);
        if (g_signal) {
            fprintf(stderr, "manta: interrupted; tearing down\n");
            rc = MANTA_EXIT_INTERRUPTED;
        } else if (st2 == 0) {
            const void *d;
            size_t n;
            manta_get(f, 0, &d, &n);
            fwrite(d, 1, n, stdout);
            if (n && ((const char *)d)[n - 1] != '\n') fputc('\n', stdout);
            fflush(stdout);
        } else {
            fprintf(stderr, "manta run: %s.%s: %s: %s\n", name, method, manta_strerror(st2),
                    manta_future_error(f));
            rc = st2 == MANTA_ETIMEDOUT ? MANTA_EXIT_TIMEOUT : MANTA_EXIT_JOB_FAILED;
        }
        manta_future_free(f);
    } else {
        fprintf(stderr, "manta: job %s serving; `manta stop --job %s` or Ctrl-C to end\n", s->job,
                s->job);
        while (!g_signal) manta_poll(m, 200);
        rc = g_signal == SIGTERM ? 0 : MANTA_EXIT_INTERRUPTED;
    }
out:
    if (c->detach && ready_pipe[1] >= 0) {
        char code = (char)(rc ? rc : MANTA_EXIT_RUNTIME);
        if (write(ready_pipe[1], &code, 1) != 1) {
        }
        close(ready_pipe[1]);
    }
    free(actors);
    if (m && !m->attached) state_remove(s->job);
    manta_shutdown(m);
    stop_services(services, nservices);
    manta_spec_free(s);
    return rc;
#undef DONE
}

/* ---- status ---- */

static int64_t hget_int(manta_ctx *m, const char *key, const char *field)
{
    char buf[64];
    return mn_redis_hget_str(m, key, field, buf, sizeof buf) == 0 ? atoll(buf) : -1;
}

static int cmd_status(cli *c)
{
    manta_ctx *m;
    job_state st;
    int rc = attach(c, &m, &st);
    if (rc) return rc;
    char key[256];
    mn_key(m, key, sizeof key, "driver", NULL);
    int64_t pid = hget_int(m, key, "pid");
    if (pid < 0) {
        fprintf(stderr, "manta status: job %s is not running\n", st.job);
        manta_shutdown(m);
        return MANTA_EXIT_NOT_FOUND;
    }
    int64_t now = mn_wall_ms();
    printf("job %s: driver pid %lld, up %.0f s, run folder %s\n", st.job, (long long)pid,
           (double)(now - hget_int(m, key, "started")) / 1000, st.run_dir);
    node_list nl;
    read_nodes(m, &nl);
    printf("nodes: %zu\n", nl.n);
    for (size_t i = 0; i < nl.n; i++) {
        char nk[256], hostn[128] = "?";
        mn_key(m, nk, sizeof nk, "node", nl.ids[i]);
        mn_redis_hget_str(m, nk, "host", hostn, sizeof hostn);
        char mem[32];
        manta_spec_format_size(nl.cap[i].memory_bytes, mem, sizeof mem);
        printf("  %-16s host %-20s cpu %g gpu %d memory %s heartbeat %.1f s ago\n", nl.ids[i],
               hostn, nl.cap[i].cpu, nl.cap[i].gpu, mem,
               (double)(now - hget_int(m, nk, "hb")) / 1000);
    }
    /* Two samples of every actor's served-call counter give the rates. */
    char setkey[256];
    mn_key(m, setkey, sizeof setkey, "actors", NULL);
    redisReply *names = mn_redis(m, "SMEMBERS %s", setkey);
    size_t na = names ? names->elements : 0;
    int64_t *c0 = calloc(na + 1, sizeof *c0);
    for (size_t i = 0; i < na; i++) {
        mn_key(m, key, sizeof key, "actor", names->element[i]->str);
        c0[i] = hget_int(m, key, "calls");
    }
    int64_t t0 = mn_now_ms();
    manta_poll(m, 1100); /* heartbeats (with the counters) come every second */
    double dt = (double)(mn_now_ms() - t0) / 1000;
    char gl[256];
    mn_key(m, gl, sizeof gl, "groups", NULL);
    redisReply *groups = mn_redis(m, "LRANGE %s 0 -1", gl);
    printf("groups:\n");
    for (size_t g = 0; groups && g < groups->elements; g++) {
        const char *gname = groups->element[g]->str;
        char gk[256];
        mn_key(m, gk, sizeof gk, "group", gname);
        int64_t wanted = hget_int(m, gk, "wanted");
        int ready = 0, restarts = 0;
        double rate = 0;
        for (size_t i = 0; i < na; i++) {
            const char *an = names->element[i]->str;
            size_t gl2 = strlen(gname);
            if (strncmp(an, gname, gl2) || an[gl2] != '-') continue;
            manta_actor_info info;
            if (mn_directory_read(m, an, &info) != 0) continue;
            ready += info.state == MANTA_ACTOR_ALIVE;
            restarts += info.restarts;
            mn_key(m, key, sizeof key, "actor", an);
            int64_t c1 = hget_int(m, key, "calls");
            if (c0[i] >= 0 && c1 >= c0[i]) rate += (double)(c1 - c0[i]) / dt;
            if (c->verbose)
                printf("    %-20s %-10s node %-14s pid %-7d incarnation %d restarts %d\n", an,
                       manta_actor_state_name(info.state), info.node, info.pid, info.incarnation, info.restarts);
        }
        printf("  %-12s ready %d/%lld  restarts %d  calls %.1f/s\n", gname, ready,
               (long long)wanted, restarts, rate);
    }
    freeReplyObject(groups);
    freeReplyObject(names);
    free(c0);
    /* What the job publishes (manta_kv_set): printed when it is text. */
    char pattern[160], cursor[32] = "0";
    snprintf(pattern, sizeof pattern, "manta:%s:kv:*", st.job);
    bool header = false;
    do {
        redisReply *r = mn_redis(m, "SCAN %s MATCH %s COUNT 100", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        for (size_t i = 0; i < r->element[1]->elements; i++) {
            const char *k = r->element[1]->element[i]->str;
            const char *name = k + strlen(pattern) - 1;
            void *v;
            size_t vl;
            if (manta_kv_get(m, name, &v, &vl) != 0) continue;
            bool text = vl <= 400;
            for (size_t j = 0; j < vl && text; j++)
                text = ((unsigned char *)v)[j] >= 32 || ((char *)v)[j] == '\t';
            if (!header) printf("values:\n"), header = true;
            if (text)
                printf("  %-20s %s\n", name, (char *)v);
            else
                printf("  %-20s (%zu bytes)\n", name, vl);
            free(v);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    manta_shutdown(m);
    return 0;
}

/* ---- scale ---- */

static int cmd_scale(cli *c)
{
    if (c->nargs != 2) {
        fprintf(stderr, "manta scale: give GROUP and N\n%s", command_help("scale"));
        return MANTA_EXIT_USAGE;
    }
    const char *group = c->args[0];
    char *end;
    long want = strtol(c->args[1], &end, 10);
    if (*end || want < 0 || want > 10000) {
        fprintf(stderr, "manta scale: N must be an integer 0..10000, got '%s'\n", c->args[1]);
        return MANTA_EXIT_USAGE;
    }
    manta_ctx *m;
    job_state st;
    int rc = attach(c, &m, &st);
    if (rc) return rc;
    char key[256], spec_path[PATH_MAX] = "", sets[4096] = "";
    mn_key(m, key, sizeof key, "driver", NULL);
    if (mn_redis_hget_str(m, key, "spec", spec_path, sizeof spec_path) != 0) {
        fprintf(stderr, "manta scale: job %s is not running\n", st.job);
        manta_shutdown(m);
        return MANTA_EXIT_NOT_FOUND;
    }
    mn_redis_hget_str(m, key, "sets", sets, sizeof sets);
    /* The spec as launched (same overrides), so new replicas get the same init. */
    const char *setv[70];
    size_t nset = 0;
    for (char *p = sets, *nl; *p && nset < 64; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl) break;
        *nl = 0;
        setv[nset++] = p;
    }
    for (int i = 0; i < c->nsets && nset < 70; i++) setv[nset++] = c->sets[i];
    manta_spec *s = load_spec(c, spec_path, setv, nset);
    if (!s) {
        manta_shutdown(m);
        return MANTA_EXIT_USAGE;
    }
    size_t g = 0;
    while (g < s->n_groups && strcmp(s->groups[g].name, group)) g++;
    if (g == s->n_groups) {
        fprintf(stderr, "manta scale: job %s has no group '%s'\n", st.job, group);
        manta_spec_free(s);
        manta_shutdown(m);
        return MANTA_EXIT_NOT_FOUND;
    }
    /* Which replicas exist now: GROUP-I in the directory. */
    char setkey[256];
    mn_key(m, setkey, sizeof setkey, "actors", NULL);
    redisReply *names = mn_redis(m, "SMEMBERS %s", setkey);
    int have_max = -1, count = 0;
    bool present[10001] = {false};
    size_t glen = strlen(group);
    for (size_t i = 0; names && i < names->elements; i++) {
        const char *an = names->element[i]->str;
        if (strncmp(an, group, glen) || an[glen] != '-') continue;
        char *e2;
        long idx = strtol(an + glen + 1, &e2, 10);
        if (*e2 || idx < 0 || idx > 10000) continue;
        present[idx] = true;
        count++;
        if (idx > have_max) have_max = (int)idx;
    }
    freeReplyObject(names);
    int64_t t0 = mn_now_ms();
    rc = 0;
    if (want > count) {
        node_list nl;
        read_nodes(m, &nl);
        subtract_usage(m, &nl);
        manta_spec_demand d = {group, (int)(want - count), s->groups[g].cpu, s->groups[g].gpu,
                               s->groups[g].memory_bytes};
        size_t *node_of = calloc((size_t)d.replicas, sizeof *node_of);
        manta_actor **made = calloc((size_t)d.replicas, sizeof *made);
        char why[512];
        if (manta_spec_place(&d, 1, nl.cap, nl.n, MANTA_SPEC_FIRST_FIT, false, node_of, why,
                             sizeof why) != 0) {
            fprintf(stderr, "manta scale: placement: %s\n", why);
            rc = MANTA_EXIT_RUNTIME;
        }
        int idx = 0, n = 0;
        for (int k = 0; rc == 0 && k < d.replicas; k++) {
            while (present[idx]) idx++;
            present[idx] = true;
            if (start_replica(m, s, g, idx, nl.ids[node_of[k]], &made[n]) != 0) {
                fprintf(stderr, "manta scale: %s-%d: %s\n", group, idx, manta_last_error());
                rc = MANTA_EXIT_RUNTIME;
                break;
            }
            n++;
        }
        if (rc == 0) rc = wait_all_ready(m, made, (size_t)n, c->timeout_s > 0 ? c->timeout_s : 60);
        free(node_of);
        free(made);
    } else if (want < count) {
        /* Drain the highest-numbered first, all at once, then stop them. */
        manta_actor *victims[10001];
        manta_future *fs[10001];
        int nv = 0;
        for (int idx = have_max; idx >= 0 && count - nv > want; idx--) {
            if (!present[idx]) continue;
            char an[128];
            snprintf(an, sizeof an, "%s-%d", group, idx);
            if (manta_actor_lookup(m, an, &victims[nv]) == 0) {
                fs[nv] = manta_call_timeout(m, victims[nv], "drain", NULL, 0,
                                            (int)((c->timeout_s > 0 ? c->timeout_s : 120) * 1000));
                nv++;
            }
        }
        manta_wait(fs, (size_t)nv, (size_t)nv, -1);
        for (int i = 0; i < nv; i++) {
            int st2 = manta_future_status(fs[i]);
            if (st2 != 0 && st2 != MANTA_ENOMETHOD) {
                fprintf(stderr, "manta scale: drain %s: %s: %s\n", manta_actor_name(victims[i]),
                        manta_strerror(st2), manta_future_error(fs[i]));
                rc = st2 == MANTA_ETIMEDOUT ? MANTA_EXIT_TIMEOUT : MANTA_EXIT_RUNTIME;
            }
            manta_future_free(fs[i]);
            int sr = manta_actor_stop(m, victims[i], 30000);
            if (sr && rc == 0) {
                fprintf(stderr, "manta scale: stop %s: %s\n", manta_actor_name(victims[i]),
                        manta_last_error());
                rc = MANTA_EXIT_RUNTIME;
            }
        }
    }
    char gk[256];
    mn_key(m, gk, sizeof gk, "group", group);
    if (rc == 0) freeReplyObject(mn_redis(m, "HSET %s wanted %ld", gk, want));
    printf("%s: %d -> %ld replicas in %.2f s%s\n", group, count, want,
           (double)(mn_now_ms() - t0) / 1000, rc ? " (with errors)" : "");
    manta_spec_free(s);
    manta_shutdown(m);
    return rc;
}

/* ---- stop, logs ---- */

static int cmd_stop(cli *c)
{
    job_state st;
    if (state_read(c->job, &st) != 0 || st.pid <= 0) {
        fprintf(stderr, "manta stop: no running job %s found here\n", c->job ? c->job : "");
        return MANTA_EXIT_NOT_FOUND;
    }
    if (kill(st.pid, SIGTERM) != 0) {
        fprintf(stderr, "manta stop: job %s: driver pid %d is gone; cleaning its state file\n",
                st.job, st.pid);
        state_remove(st.job);
        return MANTA_EXIT_NOT_FOUND;
    }
    int64_t until = mn_now_ms() + (int64_t)((c->timeout_s > 0 ? c->timeout_s : 60) * 1000);
    while (kill(st.pid, 0) == 0) {
        if (mn_now_ms() > until) {
            fprintf(stderr, "manta stop: job %s: driver %d still running\n", st.job, st.pid);
            return MANTA_EXIT_TIMEOUT;
        }
        usleep(20000); /* another process's exit: nothing to poll but time */
    }
    printf("job %s stopped\n", st.job);
    return 0;
}

static int cmd_logs(cli *c)
{
    if (c->nargs != 1) {
        fprintf(stderr, "manta logs: give an actor name\n%s", command_help("logs"));
        return MANTA_EXIT_USAGE;
    }
    job_state st;
    if (state_read(c->job, &st) != 0) {
        fprintf(stderr, "manta logs: no job %s found here\n", c->job ? c->job : "");
        return MANTA_EXIT_NOT_FOUND;
    }
    char path[PATH_MAX + 200];
    snprintf(path, sizeof path, "%s/logs/%s.log", st.run_dir, c->args[0]);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "manta logs: %s: %s\n", path, strerror(errno));
        return MANTA_EXIT_NOT_FOUND;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    char buf[65536];
    for (;;) {
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
        fflush(stdout);
        if (!c->follow || g_signal) break;
        if (st.pid > 0 && kill(st.pid, 0) != 0) break; /* the job ended */
        clearerr(f);
        usleep(200000); /* follow by polling the file, as tail -f does */
    }
    fclose(f);
    return 0;
}

/* ---- node ---- */

static int cmd_node(cli *c)
{
    if (!c->redis || !c->job) {
        fprintf(stderr, "manta node: --redis URL and --job NAME are required\n%s",
                command_help("node"));
        return MANTA_EXIT_USAGE;
    }
    char name[64];
    if (c->name) {
        snprintf(name, sizeof name, "%s", c->name);
    } else {
        char host[48] = "node";
        gethostname(host, sizeof host - 1);
        snprintf(name, sizeof name, "%.40s-%d", host, (int)getpid());
    }
    /* Become the node agent: manta_init() runs it and exits at the job's end. */
    setenv("MANTA_ROLE", "node", 1);
    setenv("MANTA_NAME", name, 1);
    setenv("MANTA_JOB", c->job, 1);
    setenv("MANTA_REDIS", c->redis, 1);
    setenv("MANTA_TRANSPORT", c->transport ? c->transport : "tcp", 1);
    if (c->host) setenv("MANTA_HOST", c->host, 1);
    if (c->cpu) setenv("MANTA_NODE_CPU", c->cpu, 1);
    if (c->gpu) setenv("MANTA_NODE_GPU", c->gpu, 1);
    if (c->memory) {
        uint64_t bytes;
        if (manta_spec_parse_size(c->memory, &bytes) != 0) {
            fprintf(stderr, "manta node: --memory '%s': expected a size like 8GiB\n", c->memory);
            return MANTA_EXIT_USAGE;
        }
        char b[32];
        snprintf(b, sizeof b, "%llu", (unsigned long long)bytes);
        setenv("MANTA_NODE_MEMORY", b, 1);
    }
    fprintf(stderr, "manta node %s: joining job %s\n", name, c->job);
    manta_ctx *m;
    manta_init(&m, &(manta_options){.classes = c->classes});
    fprintf(stderr, "manta node: %s\n", manta_last_error());
    return MANTA_EXIT_RUNTIME;
}

/* ---- argument parsing ---- */

static int parse(cli *c, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        if (!strcmp(a, "--redis"))
            dst = &c->redis;
        else if (!strcmp(a, "--job"))
            dst = &c->job;
        else if (!strcmp(a, "--log-dir"))
            dst = &c->log_dir;
        else if (!strcmp(a, "--host"))
            dst = &c->host;
        else if (!strcmp(a, "--name"))
            dst = &c->name;
        else if (!strcmp(a, "--cpu"))
            dst = &c->cpu;
        else if (!strcmp(a, "--gpu"))
            dst = &c->gpu;
        else if (!strcmp(a, "--memory"))
            dst = &c->memory;
        else if (!strcmp(a, "--transport"))
            dst = &c->transport;
        if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "manta: %s needs a value\n", a);
                return -1;
            }
            *dst = argv[++i];
            continue;
        }
        if (!strcmp(a, "--set")) {
            if (i + 1 >= argc || !strchr(argv[i + 1], '=') || c->nsets == 64) {
                fprintf(stderr, "manta: --set needs PATH=VALUE (at most 64)\n");
                return -1;
            }
            c->sets[c->nsets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            if (c->nsets == 64) return -1;
            c->sets[c->nsets++] = a + 6;
        } else if (!strcmp(a, "--timeout")) {
            if (i + 1 >= argc || (c->timeout_s = atof(argv[++i])) <= 0) {
                fprintf(stderr, "manta: --timeout needs seconds > 0\n");
                return -1;
            }
        } else if (!strcmp(a, "--detach")) {
            c->detach = 1;
        } else if (!strcmp(a, "--follow") || !strcmp(a, "-f")) {
            c->follow = 1;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            c->verbose = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "manta: unknown option %s (see manta --help)\n", a);
            return -1;
        } else if (!c->cmd) {
            c->cmd = a;
        } else if (c->nargs < 8) {
            c->args[c->nargs++] = a;
        } else {
            fprintf(stderr, "manta: too many arguments\n");
            return -1;
        }
    }
    return 0;
}

int manta_cli_main(int argc, char **argv, const manta_class *const *classes)
{
    if (getenv("MANTA_ROLE")) { /* started by a node agent as an actor or agent */
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        return MANTA_EXIT_RUNTIME;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            const char *h = i > 1 ? command_help(argv[1]) : NULL;
            fputs(h ? h : usage_text, stdout);
            return 0;
        }
    }
    cli c = {.classes = classes};
    if (parse(&c, argc, argv) != 0) return MANTA_EXIT_USAGE;
    if (!c.cmd) {
        fputs(usage_text, stderr);
        return MANTA_EXIT_USAGE;
    }
    signal(SIGPIPE, SIG_IGN);
    if (!strcmp(c.cmd, "run")) return cmd_run(&c);
    if (!strcmp(c.cmd, "status")) return cmd_status(&c);
    if (!strcmp(c.cmd, "scale")) return cmd_scale(&c);
    if (!strcmp(c.cmd, "stop")) return cmd_stop(&c);
    if (!strcmp(c.cmd, "logs")) return cmd_logs(&c);
    if (!strcmp(c.cmd, "node")) return cmd_node(&c);
    if (!strcmp(c.cmd, "version")) {
        printf("manta 0.1.0 (protocol %d)\n", MANTA_PROTOCOL_VERSION);
        return 0;
    }
    if (!strcmp(c.cmd, "help")) {
        const char *h = c.nargs ? command_help(c.args[0]) : NULL;
        fputs(h ? h : usage_text, stdout);
        return 0;
    }
    fprintf(stderr, "manta: unknown command '%s' (see manta --help)\n", c.cmd);
    return MANTA_EXIT_USAGE;
}
