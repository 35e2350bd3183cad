/*
 * cli.c -- the `manta` command: run, status, scale, stop, logs, node. It
 * parses arguments, calls the job library (runtime/job/manta_job.h) and
 * prints; it holds no orchestration of its own.
 *
 * `manta run SPEC` is a driver: it loads the spec (runtime/spec), makes the
 * run folder, starts or joins Redis and a local node agent (manta_init),
 * and hands the job to manta_job_start (records, services, placement,
 * replicas, readiness, node watchdog), then to manta_job_wait (the spec's
 * `run:` method, whose answer it prints, or serving until `manta stop` or
 * Ctrl-C). A small state file per job (MANTA_STATE_DIR, else
 * /tmp/manta-state-UID) lets later commands find the job by name.
 *
 * The other commands attach to a running job (manta_options.attach):
 * status reads the records, scale calls manta_job_attach and
 * manta_job_scale, stop signals the driver; none touches what it did not
 * make.
 */
#include "cli_internal.h"
#include "manta_schema.h"
#include "manta_cli.h"
#include "manta_job.h"
#include "manta_spec.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    manta_redis_addr redis_addr; /* --redis, parsed */
    const char *redis, *job, *log_dir, *host, *name, *cpu, *gpu, *memory, *transport, *log_level;
    const char *sets[64];
    int nsets;
    int detach, follow, verbose, json;
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
    "  report RUN_DIR    (re)write the plots of a run folder from its metrics.jsonl\n"
    "  node              run a node agent for a job on this machine (multi-node)\n"
    "  version           print the version\n"
    "  help [COMMAND]    this text, or a command's\n"
    "\n"
    "Options:\n"
    "  --set PATH=VALUE  override a spec value (run, scale): rollout.replicas=4, rl.eta=2\n"
    "  --redis URL       redis://[[user]:password@]host[:port][/db] instead of the spec's or\n"
    "                    the embedded one (IPv6 as [addr], %XX escapes in user and password)\n"
    "  --job NAME        which job (status, scale, stop, logs); default: the last one run here\n"
    "  --detach          run: return once every actor is ready; the job keeps running\n"
    "  --json            run: print the run method's whole answer (JSON) instead of a summary;\n"
    "                    logs: print the log lines as they are (JSON) instead of pretty\n"
    "  --log-level LVL   run: debug, info (default), warn or error: what actors log\n"
    "  --log-dir DIR     run: where run folders go (default: the spec's log_dir, else runs/)\n"
    "  --timeout SEC     run: readiness wait (60); scale: readiness (60) or drain (120) wait\n"
    "  --follow, -f      logs: keep printing what the actor writes\n"
    "  --verbose, -v     status: one line per actor and every series of its metrics\n"
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
               "               [--json]\n"
               "  Loads SPEC (errors name file:line:col), starts the embedded Redis unless the\n"
               "  spec or --redis names one, starts a node agent here, places every replica\n"
               "  (named GROUP-I) on a node with room, waits until all are ready, then calls\n"
               "  the spec's run: {group, method, timeout_s} on GROUP-0 and prints its answer.\n"
               "  Without run: it serves until `manta stop` or Ctrl-C. Actors' output goes to\n"
               "  RUN_DIR/logs/NAME.log; RUN_DIR (LOG_DIR/JOB) is in MANTA_RUN_DIR for them.\n"
               "  While it runs, a progress line (the job value `progress`): redrawn in place\n"
               "  on a terminal, a plain line every 10 s otherwise. At the end a short summary\n"
               "  (the whole answer with --json); the answer is kept in summary.json and the\n"
               "  plots of metrics.jsonl are written beside it (see `manta help report`).\n"
               "  With `metrics: {port: N, bind: ADDR}` in the spec the job's metrics are\n"
               "  served at http://ADDR:N/metrics in the Prometheus text format (bind:\n"
               "  127.0.0.1 unless given; port 0: any free one, printed).\n";
    if (!strcmp(cmd, "status"))
        return "manta status [--job NAME] [-v]\n"
               "  Shows the job's driver, nodes with their resources and heartbeat age,\n"
               "  groups with replicas ready/wanted, restarts and calls served per second,\n"
               "  and a table of every actor's metrics (calls served and made, mailbox,\n"
               "  latency percentiles, and the class's own counters); -v: every series.\n";
    if (!strcmp(cmd, "scale"))
        return "manta scale GROUP N [--job NAME] [--timeout SEC]\n"
               "  Grows GROUP with new replicas (placed on nodes with room, given the spec's\n"
               "  settings) or shrinks it: the highest-numbered replicas are asked to `drain`\n"
               "  (finish or hand back their work), then stopped.\n";
    if (!strcmp(cmd, "stop")) return "manta stop [--job NAME]\n  Stops a running job cleanly.\n";
    if (!strcmp(cmd, "logs"))
        return "manta logs ACTOR [--follow] [--json] [--job NAME]\n"
               "  Prints RUN_DIR/logs/ACTOR.log: the actor's log lines (JSON: time, actor,\n"
               "  incarnation, level, message) as `HH:MM:SS.mmm LEVEL ACTOR#INCARNATION message`,\n"
               "  other output as it is; --json: the lines as they are; --follow: keep going.\n";
    if (!strcmp(cmd, "report"))
        return "manta report RUN_DIR\n"
               "  Writes reward.svg, success.svg, throughput.svg and staleness.svg in RUN_DIR\n"
               "  from its metrics.jsonl (and summary.json), as `manta run` does at the end.\n";
    if (!strcmp(cmd, "node"))
        return "manta node --redis URL --job NAME [--host ADDR] [--name ID] [--cpu N]\n"
               "           [--gpu N] [--memory SIZE]\n"
               "  Runs a node agent for JOB on this machine: it registers its address and\n"
               "  resources in Redis and starts the actors placed on it, over tcp. It exits\n"
               "  when the job ends. URL: redis://[[user]:password@]host[:port][/db].\n";
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
    manta_redis_addr addr = c->redis_addr;
    char why[160];
    if (!c->redis && manta_redis_url_parse(st->redis, &addr, why, sizeof why) != 0) {
        fprintf(stderr, "manta: job %s: its state file's redis URL: %s\n", st->job, why);
        return MANTA_EXIT_RUNTIME;
    }
    manta_options o = {.redis = &addr,
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

/* ---- run ---- */

/* What `manta run` prepares before the job starts. */
typedef struct run_setup {
    manta_spec *spec;
    char spec_path[PATH_MAX], run_dir[PATH_MAX], logs[PATH_MAX + 8];
    int ready_pipe[2];        /* --detach: the driver tells its caller the verdict */
    int64_t metrics_port;     /* the spec's metrics.port; -1: no endpoint */
    const char *metrics_bind; /* metrics.bind, default 127.0.0.1 */
    cli_httpd *httpd;         /* the endpoint while the job runs */
    cli_progress *progress;   /* the progress line while the run method runs */
    int64_t t0;               /* when `manta run` started (manta_now_ms) */
} run_setup;

/* The spec's optional `metrics: {port, bind}` section; errors like the
 * loader's (file:line:col: path: message). */
static int read_metrics_section(run_setup *r)
{
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    const manta_spec_node *root = r->spec->root;
    int rc = manta_spec_get_int(root, "metrics.port", -1, &r->metrics_port, &errs);
    if (rc == 0 && (r->metrics_port < 0 || r->metrics_port > 65535)) {
        const manta_spec_node *n = manta_spec_find(root, "metrics.port");
        manta_spec_errors_add(&errs, n->file, n->line, n->col, "metrics.port",
                              "expected a TCP port 0..65535 (0: any free one), got %lld",
                              (long long)r->metrics_port);
    }
    manta_spec_get_str(root, "metrics.bind", "127.0.0.1", &r->metrics_bind, &errs);
    int bad = errs.count > 0;
    if (bad) manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    return bad ? MANTA_EXIT_USAGE : 0;
}

/* Load the spec and make RUN_DIR/logs (RUN_DIR = LOG_DIR/JOB). */
static int run_prepare(cli *c, run_setup *r)
{
    if (c->nargs != 1) {
        fprintf(stderr, "manta run: give one spec file\n%s", command_help("run"));
        return MANTA_EXIT_USAGE;
    }
    if (!realpath(c->args[0], r->spec_path)) {
        fprintf(stderr, "manta run: %s: %s\n", c->args[0], strerror(errno));
        return MANTA_EXIT_USAGE;
    }
    manta_log_level lvl;
    if (c->log_level && manta_log_level_parse(c->log_level, &lvl) != 0) {
        fprintf(stderr, "manta run: --log-level: %s\n", manta_last_error());
        return MANTA_EXIT_USAGE;
    }
    if (c->log_level) setenv("MANTA_LOG_LEVEL", c->log_level, 1); /* the actors inherit it */
    if (!(r->spec = load_spec(c, r->spec_path, c->sets, (size_t)c->nsets))) return MANTA_EXIT_USAGE;
    if (read_metrics_section(r)) return MANTA_EXIT_USAGE;
    const char *log_root = c->log_dir ? c->log_dir : r->spec->log_dir ? r->spec->log_dir : "runs";
    char rel_dir[PATH_MAX];
    snprintf(rel_dir, sizeof rel_dir, "%s/%s", log_root, r->spec->job);
    if (mkdirs(rel_dir) != 0 || !realpath(rel_dir, r->run_dir)) {
        fprintf(stderr, "manta run: run folder %s: %s\n", rel_dir, strerror(errno));
        return MANTA_EXIT_USAGE;
    }
    snprintf(r->logs, sizeof r->logs, "%s/logs", r->run_dir);
    mkdirs(r->logs);
    char old[PATH_MAX + 32]; /* a previous run's answer must not pass for this one's */
    snprintf(old, sizeof old, "%s/summary.json", r->run_dir);
    unlink(old);
    setenv("MANTA_RUN_DIR", r->run_dir, 1);
    return 0;
}

/* --detach: fork; the caller's process waits for the driver's verdict on
 * the pipe and returns it (*parent set); the driver goes on in the child,
 * output to RUN_DIR/driver.log. */
static int run_detach(run_setup *r, bool *parent)
{
    *parent = false;
    if (pipe(r->ready_pipe) != 0) return MANTA_EXIT_RUNTIME;
    pid_t pid = fork();
    if (pid < 0) return MANTA_EXIT_RUNTIME;
    if (pid > 0) {
        *parent = true;
        close(r->ready_pipe[1]);
        char code = MANTA_EXIT_RUNTIME;
        if (read(r->ready_pipe[0], &code, 1) != 1) code = MANTA_EXIT_RUNTIME;
        if (code == 0)
            printf("job %s running in the background (driver pid %d); run folder %s\n"
                   "  manta status --job %s; manta stop --job %s\n",
                   r->spec->job, (int)pid, r->run_dir, r->spec->job, r->spec->job);
        else
            fprintf(stderr, "manta run: the job did not start; see %s/driver.log\n", r->run_dir);
        return code;
    }
    close(r->ready_pipe[0]);
    setsid();
    char dlog[PATH_MAX + 16];
    snprintf(dlog, sizeof dlog, "%s/driver.log", r->run_dir);
    int fd = open(dlog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0), close(devnull);
    return 0;
}

/* Tell a --detach caller the verdict (0: running), once. */
static void run_verdict(run_setup *r, int code)
{
    if (r->ready_pipe[1] < 0) return;
    char b = (char)code;
    if (write(r->ready_pipe[1], &b, 1) != 1) { /* the caller went away; run anyway */
    }
    close(r->ready_pipe[1]);
    r->ready_pipe[1] = -1;
}

/* The exit code for a job library error. */
static int exit_code(int rc)
{
    switch (rc) {
    case 0:
        return MANTA_EXIT_OK;
    case MANTA_ETIMEDOUT:
    case MANTA_EPENDING:
        return MANTA_EXIT_TIMEOUT;
    case MANTA_ENOTFOUND:
        return MANTA_EXIT_NOT_FOUND;
    case MANTA_EEXIST:
    case MANTA_EINVAL:
        return MANTA_EXIT_USAGE;
    case MANTA_ECLOSED:
        return g_signal ? MANTA_EXIT_INTERRUPTED : MANTA_EXIT_RUNTIME;
    default:
        return MANTA_EXIT_RUNTIME;
    }
}

/* Every 100 ms of manta_job_wait: the progress line. */
static void run_tick(manta_job_t *job, double elapsed_s, void *arg)
{
    run_setup *r = arg;
    (void)job, (void)elapsed_s;
    cli_progress_tick(r->progress, (double)(manta_now_ms() - r->t0) / 1000);
}

/* The metrics endpoint, when the spec asks for one. */
static int run_metrics_endpoint(manta_ctx *m, run_setup *r)
{
    if (r->metrics_port < 0) return 0;
    char err[300];
    int rc = cli_httpd_start(m, r->metrics_bind, (int)r->metrics_port, &r->httpd, err, sizeof err);
    if (rc) {
        fprintf(stderr, "manta run: %s\n", err);
        return rc == MANTA_EINVAL ? MANTA_EXIT_USAGE : MANTA_EXIT_RUNTIME;
    }
    const char *b = r->metrics_bind;
    fprintf(stderr, "manta: metrics at http://%s%s%s:%d/metrics\n", strchr(b, ':') ? "[" : "", b,
            strchr(b, ':') ? "]" : "", cli_httpd_port(r->httpd));
    return 0;
}

/* Start the runtime and the job: Redis, the local node, the state file,
 * then manta_job_start (services, placement, replicas, readiness). */
static int run_start(cli *c, run_setup *r, manta_ctx **m, manta_job_t **job)
{
    const manta_spec *s = r->spec;
    const manta_redis_addr *redis = c->redis            ? &c->redis_addr
                                    : s->redis.embedded ? NULL
                                                        : &s->redis;
    const char *curve = NULL, *keys = NULL; /* security: {curve: auto|on|off, keys: FILE} */
    if (manta_spec_get_str(s->root, "security.curve", NULL, &curve, NULL) < 0 ||
        manta_spec_get_str(s->root, "security.keys", NULL, &keys, NULL) < 0) {
        fprintf(stderr, "manta run: %s: security: curve and keys must be strings\n", s->file);
        return MANTA_EXIT_USAGE;
    }
    const char *libs[65] = {NULL}; /* the node agents load classes from these only */
    for (size_t i = 0, n = 0; i < s->n_groups && n < 64; i++)
        if (s->groups[i].library_path) libs[n++] = s->groups[i].library_path;
    manta_options o = {.redis = redis,
                       .libraries = libs,
                       .curve = curve,
                       .keys_file = keys,
                       .job = s->job,
                       .classes = c->classes,
                       .log_dir = r->logs,
                       .transport = c->transport,
                       .host = c->host};
    if (manta_init(m, &o) != 0) {
        fprintf(stderr, "manta run: %s\n", manta_last_error());
        return MANTA_EXIT_RUNTIME;
    }
    manta_job_options jo = {.spec_path = r->spec_path,
                            .sets = c->sets,
                            .n_sets = (size_t)c->nsets,
                            .run_dir = r->run_dir,
                            .log_dir = r->logs,
                            .ready_timeout_s = c->timeout_s,
                            .interrupt = &g_signal,
                            .tick = run_tick,
                            .tick_arg = r};
    int rc = manta_job_start(*m, s, &jo, job);
    if (rc) {
        fprintf(stderr, "manta run: %s\n", manta_last_error());
        return exit_code(rc);
    }
    job_state st = {.pid = getpid()};
    snprintf(st.job, sizeof st.job, "%s", s->job);
    snprintf(st.redis, sizeof st.redis, "%s", manta_redis_url(*m));
    snprintf(st.run_dir, sizeof st.run_dir, "%s", r->run_dir);
    if (state_write(&st) != 0) fprintf(stderr, "manta run: warning: cannot write the state file\n");
    fprintf(stderr, "manta: job %s running; run folder %s\n", s->job, r->run_dir);
    return run_metrics_endpoint(*m, r);
}

/* Write the answer to DIR/summary.json (a temporary file renamed). */
static void keep_answer(const char *dir, const void *d, size_t n)
{
    char path[PATH_MAX + 32], tmp[PATH_MAX + 48];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f || fwrite(d, 1, n, f) != n || fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "manta run: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
    }
}

/* The run folder the answer names ("run_dir": an RL controller writes its
 * files there), else the job's own. */
static void answer_dir(const run_setup *r, const char *d, size_t n, char *out, size_t cap)
{
    snprintf(out, cap, "%s", r->run_dir);
    cJSON *j = cJSON_ParseWithLength(d, n);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "run_dir");
    struct stat st;
    if (cJSON_IsString(v) && stat(v->valuestring, &st) == 0 && S_ISDIR(st.st_mode) &&
        strlen(v->valuestring) < cap)
        snprintf(out, cap, "%s", v->valuestring);
    cJSON_Delete(j);
}

/* The end of a run that answered: the answer kept in summary.json (unless
 * the job wrote one there itself), the plots of metrics.jsonl, and on
 * stdout a short summary, or the whole answer with --json (or when it is
 * no run summary, one short line as it is). */
static void run_answer(cli *c, const run_setup *r, const void *d, size_t n)
{
    char dir[PATH_MAX], path[PATH_MAX + 32];
    answer_dir(r, d, n, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/summary.json", dir);
    if (access(path, F_OK) != 0) keep_answer(dir, d, n);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    int plots = 0;
    char err[600] = "";
    if (access(path, F_OK) == 0 && cli_report_write(dir, &plots, err, sizeof err) != 0)
        fprintf(stderr, "manta run: report: %s\n", err);
    if (c->json || cli_report_summary(d, n, stdout) != 0) {
        bool short_line = n <= 300 && !memchr(d, '\n', n ? n - 1 : 0);
        if (c->json || short_line) {
            fwrite(d, 1, n, stdout);
            if (n && ((const char *)d)[n - 1] != '\n') fputc('\n', stdout);
        } else {
            printf("answer: %zu bytes, in %s/summary.json (--json prints it)\n", n, dir);
        }
    }
    if (!c->json)
        printf("run folder %s: summary.json%s%s\n", dir, plots ? ", metrics.jsonl, plots: " : "",
               plots ? "reward.svg success.svg throughput.svg staleness.svg" : "");
    fflush(stdout);
}

/* Run the job: its run method (the answer goes to stdout), or serve until
 * `manta stop` (SIGTERM: exit 0) or Ctrl-C (130). */
static int run_job(cli *c, run_setup *r, manta_job_t *job)
{
    const manta_spec *s = r->spec;
    bool has_run = manta_spec_find(s->root, "run") != NULL;
    if (!has_run)
        fprintf(stderr, "manta: job %s serving; `manta stop --job %s` or Ctrl-C to end\n", s->job,
                s->job);
    else
        r->progress = cli_progress_new(manta_job_ctx(job), stderr, isatty(STDERR_FILENO), 10);
    const void *d;
    size_t n;
    int rc = manta_job_wait(job, -1, &d, &n);
    char why[1024]; /* the progress line's last read may set another error */
    snprintf(why, sizeof why, "%s", manta_last_error());
    cli_progress_end(r->progress, (double)(manta_now_ms() - r->t0) / 1000);
    r->progress = NULL;
    if (rc == 0) {
        if (has_run)
            run_answer(c, r, d, n);
        else
            fflush(stdout);
        return 0;
    }
    if (rc == MANTA_ECLOSED && g_signal == SIGTERM && !manta_spec_find(s->root, "run")) return 0;
    if (rc == MANTA_ECLOSED) {
        fprintf(stderr, "manta: interrupted; tearing down\n");
        return MANTA_EXIT_INTERRUPTED;
    }
    fprintf(stderr, "manta run: %s\n", why);
    if (rc == MANTA_ETIMEDOUT) return MANTA_EXIT_TIMEOUT;
    return rc == MANTA_ENOTFOUND ? MANTA_EXIT_USAGE : MANTA_EXIT_JOB_FAILED;
}

static int cmd_run(cli *c)
{
    run_setup r = {.ready_pipe = {-1, -1}, .metrics_port = -1, .t0 = manta_now_ms()};
    int rc = run_prepare(c, &r);
    bool parent = false;
    if (rc == 0 && c->detach) rc = run_detach(&r, &parent);
    if (rc || parent) {
        manta_spec_free(r.spec);
        return rc;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    manta_ctx *m = NULL;
    manta_job_t *job = NULL;
    rc = run_start(c, &r, &m, &job);
    if (rc == 0) {
        run_verdict(&r, 0);
        rc = run_job(c, &r, job);
    }
    run_verdict(&r, rc ? rc : MANTA_EXIT_RUNTIME);
    cli_httpd_free(r.httpd);
    manta_job_free(job);
    if (m && !manta_attached(m)) state_remove(r.spec->job);
    manta_shutdown(m);
    manta_spec_free(r.spec);
    return rc;
}

/* ---- status ---- */

/* Live nodes with their resources and heartbeat age, by id. */
static void status_nodes(manta_ctx *m)
{
    manta_reg_node_list nodes;
    if (manta_reg_node_list_read(m, &nodes) != 0) {
        fprintf(stderr, "manta status: nodes: %s\n", manta_last_error());
        return;
    }
    size_t live = 0;
    for (size_t i = 0; i < nodes.n; i++) live += nodes.v[i].rec.state == MANTA_ACTOR_ALIVE;
    printf("nodes: %zu\n", live);
    for (size_t i = 0; i < nodes.n; i++) {
        const manta_reg_node *n = &nodes.v[i].rec;
        if (n->state != MANTA_ACTOR_ALIVE) continue;
        char mem[32];
        manta_spec_format_size(n->memory, mem, sizeof mem);
        char hb[32] = "none yet";
        if (nodes.v[i].age_ms >= 0)
            snprintf(hb, sizeof hb, "%.1f s ago", (double)nodes.v[i].age_ms / 1000);
        printf("  %-16s host %-20s cpu %g gpu %lld memory %s heartbeat %s\n", nodes.v[i].id,
               n->host[0] ? n->host : "?", n->cpu, (long long)(n->gpu > 0 ? n->gpu : 0), mem, hb);
    }
    manta_reg_node_list_free(&nodes);
}

/* Every actor's served-call counter (-1: none), in `names` order. */
static int64_t *status_calls(manta_ctx *m, const manta_reg_names *names)
{
    int64_t *calls = calloc(names->n + 1, sizeof *calls);
    for (size_t i = 0; calls && i < names->n; i++) {
        manta_reg_actor a;
        calls[i] = manta_reg_actor_read(m, names->v[i], &a) == 0 ? (int64_t)a.calls : -1;
    }
    return calls;
}

/* One line per group: ready/wanted, restarts, calls per second between two
 * samples dt seconds apart (c0, c1); with -v one line per actor. */
static void status_group(cli *c, manta_ctx *m, const char *gname, const manta_reg_names *names,
                         const int64_t *c0, const int64_t *c1, double dt)
{
    int wanted = -1;
    if (manta_reg_group_read(m, gname, NULL, 0, &wanted) != 0) wanted = -1;
    int ready = 0, restarts = 0;
    double rate = 0;
    size_t glen = strlen(gname);
    for (size_t i = 0; i < names->n; i++) {
        const char *an = names->v[i];
        if (strncmp(an, gname, glen) || an[glen] != '-') continue;
        manta_reg_actor a;
        if (manta_reg_actor_read(m, an, &a) != 0) continue;
        const manta_actor_info *info = &a.info;
        ready += info->state == MANTA_ACTOR_ALIVE;
        restarts += info->restarts;
        if (c0 && c1 && c0[i] >= 0 && c1[i] >= c0[i]) rate += (double)(c1[i] - c0[i]) / dt;
        if (c->verbose)
            printf("    %-20s %-10s node %-14s pid %-7d incarnation %d restarts %d\n", an,
                   manta_actor_state_name(info->state), info->node, info->pid, info->incarnation,
                   info->restarts);
    }
    printf("  %-12s ready %d/%d  restarts %d  calls %.1f/s\n", gname, ready, wanted, restarts,
           rate);
}

static void status_groups(cli *c, manta_ctx *m)
{
    manta_reg_names names, groups;
    if (manta_reg_actor_names(m, &names) != 0) names.n = 0, names.v = NULL;
    int64_t *c0 = status_calls(m, &names);
    int64_t t0 = manta_now_ms();
    manta_poll(m, 1100); /* heartbeats (with the counters) come every second */
    double dt = (double)(manta_now_ms() - t0) / 1000;
    int64_t *c1 = status_calls(m, &names);
    if (manta_reg_group_names(m, &groups) != 0) groups.n = 0, groups.v = NULL;
    printf("groups:\n");
    for (size_t g = 0; g < groups.n; g++) status_group(c, m, groups.v[g], &names, c0, c1, dt);
    manta_reg_names_free(&groups);
    manta_reg_names_free(&names);
    free(c0), free(c1);
}

/* What the job publishes (manta_kv_set): printed when it is text. */
static void status_values(manta_ctx *m)
{
    manta_reg_names keys;
    if (manta_reg_kv_names(m, &keys) != 0) return;
    bool header = false;
    for (size_t i = 0; i < keys.n; i++) {
        const char *name = keys.v[i];
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
    manta_reg_names_free(&keys);
}

static int cmd_status(cli *c)
{
    manta_ctx *m;
    job_state st;
    int rc = attach(c, &m, &st);
    if (rc) return rc;
    manta_reg_driver *d = malloc(sizeof *d);
    rc = d ? manta_reg_driver_read(m, d) : MANTA_ENOMEM;
    if (rc) {
        if (rc == MANTA_ENOTFOUND)
            fprintf(stderr, "manta status: job %s is not running\n", st.job);
        else
            fprintf(stderr, "manta status: job %s: %s\n", st.job,
                    d ? manta_last_error() : "out of memory");
        free(d);
        manta_shutdown(m);
        return rc == MANTA_ENOTFOUND ? MANTA_EXIT_NOT_FOUND : MANTA_EXIT_RUNTIME;
    }
    printf("job %s: driver pid %lld, up %.0f s, run folder %s\n", st.job, (long long)d->pid,
           (double)manta_reg_age_ms(d->started_ms) / 1000, st.run_dir);
    free(d);
    status_nodes(m);
    status_groups(c, m);
    cli_status_metrics(m, c->verbose, stdout);
    status_values(m);
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
    /* The spec as launched (same overrides, then these), so new replicas
     * get the same init. */
    manta_spec_options so = {.sets = c->sets,
                             .n_sets = (size_t)c->nsets,
                             .class_exists = cli_class_exists,
                             .user = (void *)c->classes};
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_job_t *job;
    rc = manta_job_attach(m, &so, &errs, &job);
    if (rc) {
        if (errs.count) manta_spec_errors_print(&errs, stderr);
        fprintf(stderr, "manta scale: %s\n", manta_last_error());
        manta_spec_errors_destroy(&errs);
        manta_shutdown(m);
        return exit_code(rc);
    }
    manta_spec_errors_destroy(&errs);
    int64_t t0 = manta_now_ms();
    int before = manta_job_replicas(job, group);
    rc = before < 0 ? before : manta_job_scale(job, group, (int)want, (int)(c->timeout_s * 1000));
    if (rc) fprintf(stderr, "manta scale: %s\n", manta_last_error());
    if (before >= 0)
        printf("%s: %d -> %ld replicas in %.2f s%s\n", group, before, want,
               (double)(manta_now_ms() - t0) / 1000, rc ? " (with errors)" : "");
    manta_job_free(job);
    manta_shutdown(m);
    return exit_code(rc);
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
    int64_t until = manta_now_ms() + (int64_t)((c->timeout_s > 0 ? c->timeout_s : 60) * 1000);
    while (kill(st.pid, 0) == 0) {
        if (manta_now_ms() > until) {
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
    static char buf[65536];
    size_t have = 0;
    int color = isatty(STDOUT_FILENO);
    for (;;) {
        size_t n;
        while ((n = fread(buf + have, 1, sizeof buf - 1 - have, f)) > 0) {
            have += n;
            /* whole lines only: a line being written is finished next turn */
            char *start = buf, *nl;
            while ((nl = memchr(start, '\n', (size_t)(buf + have - start)))) {
                *nl = 0;
                cli_log_line(start, c->json, color, stdout);
                start = nl + 1;
            }
            have -= (size_t)(start - buf);
            memmove(buf, start, have);
            if (have == sizeof buf - 1) { /* a line longer than the buffer: as it is */
                buf[have] = 0;
                cli_log_line(buf, 1, 0, stdout);
                have = 0;
            }
        }
        fflush(stdout);
        if (!c->follow || g_signal) break;
        if (st.pid > 0 && kill(st.pid, 0) != 0) break; /* the job ended */
        clearerr(f);
        usleep(200000); /* follow by polling the file, as tail -f does */
    }
    if (have) {
        buf[have] = 0;
        cli_log_line(buf, c->json, color, stdout);
    }
    fclose(f);
    return 0;
}

/* ---- report ---- */

static int cmd_report(cli *c)
{
    if (c->nargs != 1) {
        fprintf(stderr, "manta report: give a run folder\n%s", command_help("report"));
        return MANTA_EXIT_USAGE;
    }
    int made = 0;
    char err[600];
    int rc = cli_report_write(c->args[0], &made, err, sizeof err);
    if (rc) {
        fprintf(stderr, "manta report: %s\n", err);
        return rc == MANTA_ENOTFOUND ? MANTA_EXIT_NOT_FOUND : MANTA_EXIT_RUNTIME;
    }
    printf("%s: reward.svg success.svg throughput.svg staleness.svg\n", c->args[0]);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/summary.json", c->args[0]);
    size_t n = 0;
    FILE *f = fopen(path, "r");
    char *txt = NULL;
    if (f) {
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        if (sz > 0 && (txt = malloc((size_t)sz + 1)) != NULL) n = fread(txt, 1, (size_t)sz, f);
        fclose(f);
    }
    if (txt) cli_report_summary(txt, n, stdout);
    free(txt);
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
        else if (!strcmp(a, "--log-level"))
            dst = &c->log_level;
        if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "manta: %s needs a value\n", a);
                return -1;
            }
            *dst = argv[++i];
            char why[160];
            if (dst == &c->redis &&
                manta_redis_url_parse(c->redis, &c->redis_addr, why, sizeof why) != 0) {
                fprintf(stderr, "manta: --redis '%s': %s\n", c->redis, why);
                return -1;
            }
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
        } else if (!strcmp(a, "--json")) {
            c->json = 1;
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
    if (argc > 1 && !strcmp(argv[1], "keys")) return manta_cli_keys(argc - 1, argv + 1);
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
    if (!strcmp(c.cmd, "report")) return cmd_report(&c);
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
