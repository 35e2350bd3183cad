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
#include <dirent.h>
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
#include <time.h>
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
    const char *run; /* --run RUN_DIR: logs and status of a run folder */
    const char *sets[64];
    int nsets;
    int detach, follow, verbose, json, dashboard;
    int resume;             /* run --resume [RUN_DIR] */
    const char *resume_dir; /* its RUN_DIR, or NULL: the spec's own run folder */
    char resume_sets[2][PATH_MAX + 16];
    double timeout_s;
    const manta_class *const *classes;
    const manta_cli_builtins *b; /* classes, declared sections and settings */
} cli;

static const char *usage_text =
    "usage: manta COMMAND [ARGS] [OPTIONS]\n"
    "\n"
    "Commands:\n"
    "  run SPEC          launch the actor graph of a spec file, run its job, tear down\n"
    "  status [RUN_DIR]  nodes, groups (ready/wanted), restarts, message rates; after the\n"
    "                    job: its run folder (runs, summary, logs)\n"
    "  scale GROUP N     grow or shrink a group of a running job to N replicas\n"
    "  stop              stop a running job (its driver tears everything down)\n"
    "  logs ACTOR        print an actor's output (RUN_DIR/logs/RUN_ID/ACTOR.log)\n"
    "  report RUN_DIR    (re)write the plots of a run folder from its metrics.jsonl\n"
    "  node              run a node agent for a job on this machine (multi-node)\n"
    "  version           print the version\n"
    "  help [COMMAND]    this text, or a command's; `help spec`: every spec key\n"
    "\n"
    "Options:\n"
    "  --set PATH=VALUE  override a spec value (run, scale): rollout.replicas=4, rl.eta=2\n"
    "  --redis URL       redis://[[user]:password@]host[:port][/db] instead of the spec's or\n"
    "                    the embedded one (IPv6 as [addr], %XX escapes in user and password)\n"
    "  --job NAME        which job (status, scale, stop, logs); default: the last one run here\n"
    "  --detach          run: return once every actor is ready; the job keeps running\n"
    "  --dashboard       run: serve the web dashboard (the spec's metrics.port, else a free one)\n"
    "  --resume [DIR]    run: continue a stopped or crashed job from the newest checkpoint of\n"
    "                    its run folder (or of run folder DIR): --set rl.resume=true|DIR\n"
    "  --json            run: print the run method's whole answer (JSON) instead of a summary;\n"
    "                    logs: print the log lines as they are (JSON) instead of pretty\n"
    "  --log-level LVL   run: debug, info (default), warn or error: what actors log\n"
    "  --log-dir DIR     run: where run folders go (default: the spec's log_dir, else runs/)\n"
    "  --timeout SEC     run: readiness wait (60); scale: readiness (60) or drain (120) wait\n"
    "  --follow, -f      logs: keep printing what the actor writes\n"
    "  --run DIR         logs, status: a run folder (RUN_DIR), or one run's logs folder\n"
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
               "               [--json] [--dashboard] [--resume [RUN_DIR]]\n"
               "  Loads SPEC (errors name file:line:col), starts the embedded Redis unless the\n"
               "  spec or --redis names one, starts a node agent here, places every replica\n"
               "  (named GROUP-I) on a node with room, waits until all are ready, then calls\n"
               "  the spec's run: {group, method, timeout_s} on GROUP-0 and prints its answer.\n"
               "  Without run: it serves until `manta stop` or Ctrl-C. Each run's output goes\n"
               "  to RUN_DIR/logs/RUN_ID/NAME.log (RUN_ID: its UTC start, YYYYMMDD-HHMMSS;\n"
               "  RUN_DIR/logs/latest points at the last one; RUN_DIR is LOG_DIR/JOB, in\n"
               "  MANTA_RUN_DIR for the actors). The last line names the run folder.\n"
               "  While it runs, a progress line (the job value `progress`): redrawn in place\n"
               "  on a terminal, a plain line every 10 s otherwise. At the end a short summary\n"
               "  (the whole answer with --json); the answer is kept in summary.json and the\n"
               "  plots of metrics.jsonl are written beside it (see `manta help report`).\n"
               "  With `metrics: {port: N, bind: ADDR}` in the spec (or --dashboard) the head\n"
               "  serves a web dashboard at http://ADDR:N/ (actors, curves, errors; live) and\n"
               "  the metrics at /metrics in the Prometheus text format (bind: 127.0.0.1\n"
               "  unless given; port 0: any free one; the URL is printed). Off loopback, the\n"
               "  data needs the token in RUN_DIR/dashboard.token (?token= or Bearer).\n"
               "  --resume continues a stopped or crashed RL job from the newest checkpoint\n"
               "  in its run folder's checkpoints/ (--resume RUN_DIR: that run folder's, and\n"
               "  the run goes on there); it sets rl.resume (and rl.run_dir). A run that\n"
               "  fails or is interrupted still leaves summary.json, with its status.\n";
    if (!strcmp(cmd, "status"))
        return "manta status [RUN_DIR | --run RUN_DIR] [--job NAME] [-v]\n"
               "  Of a running job: its driver, nodes with their resources and heartbeat age,\n"
               "  groups with replicas ready/wanted, restarts and calls served per second,\n"
               "  and a table of every actor's metrics (calls served and made, mailbox,\n"
               "  latency percentiles, and the class's own counters); -v: every series.\n"
               "  Of a finished job (the last one run here, --job's, or RUN_DIR): its run\n"
               "  folder: the runs kept (RUN_ID, start, end, exit code), the summary of\n"
               "  summary.json and the last run's logs.\n";
    if (!strcmp(cmd, "scale"))
        return "manta scale GROUP N [--job NAME] [--timeout SEC]\n"
               "  Grows GROUP with new replicas (placed on nodes with room, given the spec's\n"
               "  settings) or shrinks it: the highest-numbered replicas are asked to `drain`\n"
               "  (finish or hand back their work), then stopped.\n";
    if (!strcmp(cmd, "stop")) return "manta stop [--job NAME]\n  Stops a running job cleanly.\n";
    if (!strcmp(cmd, "logs"))
        return "manta logs ACTOR [--follow] [--json] [--job NAME | --run DIR]\n"
               "  Prints RUN_DIR/logs/RUN_ID/ACTOR.log of the running job, else of the last\n"
               "  run here (of --job's), or of --run DIR (a run folder: its latest run; or\n"
               "  one run's folder RUN_DIR/logs/RUN_ID): the actor's log lines (JSON: time, "
               "actor,\n"
               "  incarnation, level, message) as `HH:MM:SS.mmm LEVEL ACTOR#INCARNATION message`,\n"
               "  other output as it is; --json: the lines as they are; --follow: keep going\n"
               "  while the job runs.\n";
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

/* What the state folder keeps of a job: JOB.job while it runs (removed at
 * its end), JOB.last for its last run (kept, without the Redis URL), and
 * the names of the current and the last job. */
typedef struct job_state {
    char job[64], redis[600], run_dir[PATH_MAX], logs[PATH_MAX + 64];
    int pid;
} job_state;

/* The state folder holds Redis URLs with their passwords. It must be this
 * user's own (a folder another local user made first at the default path in
 * /tmp is refused, not written into), and its files are opened without
 * following links, mode 0600. */
static int state_folder(char *dir, size_t n)
{
    state_dir(dir, n);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) { /* a MANTA_STATE_DIR's parents, as before */
        *slash = 0;
        int rc = mkdirs(dir);
        *slash = '/';
        if (rc != 0) return -1;
    }
    if (manta_private_dir(dir, "state folder") != 0) {
        fprintf(stderr, "manta: %s\n", manta_last_error());
        return -1;
    }
    return 0;
}

static FILE *state_open(const char *path, int write)
{
    int fd = write ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)
                   : open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, write ? "w" : "r");
    if (!f) close(fd);
    return f;
}

static int write_file(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = state_open(path, 1);
    if (!f) return -1;
    fputs(text, f);
    return fclose(f) == 0 ? 0 : -1;
}

static int state_write(const job_state *st)
{
    char dir[PATH_MAX], name[96], text[2 * PATH_MAX + 800];
    if (!st->job[0] || strchr(st->job, '/') || state_folder(dir, sizeof dir) != 0) return -1;
    snprintf(text, sizeof text, "job=%s\nredis=%s\nrun_dir=%s\nlogs=%s\npid=%d\n", st->job,
             st->redis, st->run_dir, st->logs, st->pid);
    snprintf(name, sizeof name, "%s.job", st->job);
    if (write_file(dir, name, text) != 0) return -1;
    snprintf(text, sizeof text, "%s\n", st->job);
    return write_file(dir, "current", text);
}

/* The record of a job's last run, written as it begins (so that a run
 * whose start failed can be looked at too) and kept after it ended. */
static int last_write(const job_state *st)
{
    char dir[PATH_MAX], name[96], text[2 * PATH_MAX + 800];
    if (!st->job[0] || strchr(st->job, '/') || state_folder(dir, sizeof dir) != 0) return -1;
    snprintf(text, sizeof text, "job=%s\nrun_dir=%s\nlogs=%s\n", st->job, st->run_dir, st->logs);
    snprintf(name, sizeof name, "%s.last", st->job);
    if (write_file(dir, name, text) != 0) return -1;
    snprintf(text, sizeof text, "%s\n", st->job);
    return write_file(dir, "last", text);
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

/* A job's record: "job" (running) or "last" (its last run), of `job` or,
 * when NULL, of the job the file `which` ("current" or "last") names. */
static int record_read(const char *job, const char *which, const char *ext, job_state *st)
{
    char dir[PATH_MAX], path[PATH_MAX + 80], name[80] = "";
    memset(st, 0, sizeof *st);
    if (state_folder(dir, sizeof dir) != 0) return -1;
    if (!job) {
        snprintf(path, sizeof path, "%s/%s", dir, which);
        FILE *f = state_open(path, 0);
        if (!f) return -1;
        if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = 0;
        fclose(f);
        job = name;
    }
    if (!*job || strchr(job, '/')) return -1; /* a job name is never a path */
    snprintf(path, sizeof path, "%s/%s.%s", dir, job, ext);
    FILE *f = state_open(path, 0);
    if (!f) return -1;
    char line[PATH_MAX + 64];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "job=", 4)) snprintf(st->job, sizeof st->job, "%s", line + 4);
        if (!strncmp(line, "redis=", 6)) snprintf(st->redis, sizeof st->redis, "%s", line + 6);
        if (!strncmp(line, "run_dir=", 8))
            snprintf(st->run_dir, sizeof st->run_dir, "%s", line + 8);
        if (!strncmp(line, "logs=", 5)) snprintf(st->logs, sizeof st->logs, "%s", line + 5);
        if (!strncmp(line, "pid=", 4)) st->pid = atoi(line + 4);
    }
    fclose(f);
    if (!st->logs[0]) snprintf(st->logs, sizeof st->logs, "%s/logs", st->run_dir);
    return st->job[0] ? 0 : -1;
}

/* The running job (named, or the current one). */
static int state_read(const char *job, job_state *st)
{
    return record_read(job, "current", "job", st);
}

/* The last run of a job (named, or the last one run here), kept after it
 * ended. */
static int last_read(const char *job, job_state *st)
{
    return record_read(job, "last", "last", st);
}

/* The logs folder of DIR: a run folder's latest run (DIR/logs/latest), a
 * run folder of the layout before run ids (DIR/logs), or DIR itself (one
 * run's folder, DIR/logs/RUN_ID). */
static void run_logs_of(const char *dir, char *out, size_t cap)
{
    char p[PATH_MAX + 32];
    struct stat st;
    snprintf(p, sizeof p, "%s/logs/latest", dir);
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode) && realpath(p, out) && strlen(out) < cap) return;
    snprintf(p, sizeof p, "%s/logs", dir);
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(out, cap, "%s", p);
        return;
    }
    snprintf(out, cap, "%s", dir);
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

/* How every command loads a spec: the built-in classes, the sections and
 * settings they declare, these overrides. */
static manta_spec_options spec_options(const cli *c, const char *const *sets, size_t nsets)
{
    return (manta_spec_options){.sets = sets,
                                .n_sets = nsets,
                                .class_exists = cli_class_exists,
                                .user = (void *)c->classes,
                                .sections = c->b->sections,
                                .settings = c->b->settings,
                                .defaults = c->b->defaults};
}

static manta_spec *load_spec(cli *c, const char *path, const char *const *sets, size_t nsets)
{
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = spec_options(c, sets, nsets);
    manta_spec *s = manta_spec_load_file(path, &so, &errs);
    if (!s) manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    return s;
}

/* ---- run ---- */

/* What `manta run` prepares before the job starts. */
typedef struct run_setup {
    manta_spec *spec;
    char spec_path[PATH_MAX], run_dir[PATH_MAX], logs[PATH_MAX + 64];
    char run_id[40];           /* YYYYMMDD-HHMMSS[-N]: this run's logs folder */
    char answer_dir[PATH_MAX]; /* where the answer was kept ("" : none) */
    int plots;                 /* plots written there */
    int ready_pipe[2];         /* --detach: the driver tells its caller the verdict */
    int64_t metrics_port;      /* the spec's metrics.port; -1: no endpoint */
    const char *metrics_bind;  /* metrics.bind, default 127.0.0.1 */
    cli_httpd *httpd;          /* the endpoint while the job runs */
    cli_progress *progress;    /* the progress line while the run method runs */
    int64_t t0;                /* when `manta run` started (manta_now_ms) */
    char end_status[700]; /* a run method that did not answer: "failed: ..." or "interrupted" */
    cJSON *last_record;   /* the job value `policy` then (an RL controller's last version) */
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

/* This run's own logs folder, RUN_DIR/logs/RUN_ID, RUN_ID its UTC start
 * (a -2, -3 ... suffix when a run began in the same second), and
 * RUN_DIR/logs/latest pointing at it; run.txt there says what ran. So a
 * second run neither appends to nor mixes with the first's logs. */
static int run_logs_dir(run_setup *r)
{
    char base[PATH_MAX + 8];
    snprintf(base, sizeof base, "%s/logs", r->run_dir);
    if (mkdirs(base) != 0) return -1;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    for (int n = 1;; n++) {
        if (n == 1)
            snprintf(r->run_id, sizeof r->run_id, "%s", stamp);
        else
            snprintf(r->run_id, sizeof r->run_id, "%s-%d", stamp, n);
        snprintf(r->logs, sizeof r->logs, "%s/%s", base, r->run_id);
        if (mkdir(r->logs, 0755) == 0) break;
        if (errno != EEXIST || n >= 1000) return -1;
    }
    char link[PATH_MAX + 32], tmp[PATH_MAX + 48];
    snprintf(link, sizeof link, "%s/latest", base);
    snprintf(tmp, sizeof tmp, "%s/.latest.%d", base, (int)getpid());
    unlink(tmp);
    if (symlink(r->run_id, tmp) != 0 || rename(tmp, link) != 0) unlink(tmp); /* a view only */
    char started[40], text[PATH_MAX * 2 + 200];
    strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(text, sizeof text, "job=%s\nrun_id=%s\nspec=%s\nstarted=%s\npid=%d\n", r->spec->job,
             r->run_id, r->spec_path, started, (int)getpid());
    return write_file(r->logs, "run.txt", text);
}

/* The end of a run in its run.txt: when, and the exit code. */
static void run_logs_end(const run_setup *r, int code)
{
    if (!r->run_id[0]) return;
    char path[PATH_MAX + 80], ended[40];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ended, sizeof ended, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(path, sizeof path, "%s/run.txt", r->logs);
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "ended=%s\nexit=%d\n", ended, code);
    fclose(f);
}

/* --resume [RUN_DIR] as overrides after the user's: rl.resume=true (the
 * controller's own run folder) or rl.resume=DIR and rl.run_dir=DIR. */
static int resume_sets(cli *c)
{
    char dir[PATH_MAX];
    if (c->nsets > 62) {
        fprintf(stderr, "manta run: --resume: too many --set (at most 62 with it)\n");
        return -1;
    }
    if (!c->resume_dir) {
        snprintf(c->resume_sets[0], sizeof c->resume_sets[0], "rl.resume=true");
        c->sets[c->nsets++] = c->resume_sets[0];
        return 0;
    }
    if (!realpath(c->resume_dir, dir)) {
        fprintf(stderr, "manta run: --resume %s: %s\n", c->resume_dir, strerror(errno));
        return -1;
    }
    snprintf(c->resume_sets[0], sizeof c->resume_sets[0], "rl.resume=%s", dir);
    snprintf(c->resume_sets[1], sizeof c->resume_sets[1], "rl.run_dir=%s", dir);
    c->sets[c->nsets++] = c->resume_sets[0];
    c->sets[c->nsets++] = c->resume_sets[1];
    return 0;
}

/* Load the spec and make RUN_DIR/logs/RUN_ID (RUN_DIR = LOG_DIR/JOB). */
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
    if (c->resume && resume_sets(c) != 0) return MANTA_EXIT_USAGE;
    if (!(r->spec = load_spec(c, r->spec_path, c->sets, (size_t)c->nsets))) return MANTA_EXIT_USAGE;
    if (read_metrics_section(r)) return MANTA_EXIT_USAGE;
    if (c->dashboard && r->metrics_port < 0) r->metrics_port = 0; /* a free port */
    const char *log_root = c->log_dir ? c->log_dir : r->spec->log_dir ? r->spec->log_dir : "runs";
    char rel_dir[PATH_MAX];
    snprintf(rel_dir, sizeof rel_dir, "%s/%s", log_root, r->spec->job);
    if (mkdirs(rel_dir) != 0 || !realpath(rel_dir, r->run_dir)) {
        fprintf(stderr, "manta run: run folder %s: %s\n", rel_dir, strerror(errno));
        return MANTA_EXIT_USAGE;
    }
    if (run_logs_dir(r) != 0) {
        fprintf(stderr, "manta run: logs folder in %s/logs: %s\n", r->run_dir, strerror(errno));
        return MANTA_EXIT_USAGE;
    }
    job_state last = {.pid = 0};
    snprintf(last.job, sizeof last.job, "%s", r->spec->job);
    snprintf(last.run_dir, sizeof last.run_dir, "%s", r->run_dir);
    snprintf(last.logs, sizeof last.logs, "%s", r->logs);
    if (last_write(&last) != 0)
        fprintf(stderr, "manta run: warning: cannot write the state file\n");
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

/* The HTTP endpoint (dashboard, API, metrics), when the spec asks for one. */
static int run_metrics_endpoint(manta_ctx *m, run_setup *r)
{
    if (r->metrics_port < 0) return 0;
    char err[300];
    int rc = cli_httpd_start(m, r->metrics_bind, (int)r->metrics_port, &r->httpd, err, sizeof err);
    if (rc) {
        fprintf(stderr, "manta run: %s\n", err);
        return rc == MANTA_EINVAL ? MANTA_EXIT_USAGE : MANTA_EXIT_RUNTIME;
    }
    if (cli_httpd_dashboard(r->httpd, r->spec, r->run_dir, r->logs, err, sizeof err) != 0) {
        fprintf(stderr, "manta run: %s\n", err);
        return MANTA_EXIT_RUNTIME;
    }
    const char *b = r->metrics_bind, *tok = cli_httpd_token(r->httpd);
    char url[400];
    snprintf(url, sizeof url, "http://%s%s%s:%d/", strchr(b, ':') ? "[" : "", b,
             strchr(b, ':') ? "]" : "", cli_httpd_port(r->httpd));
    fprintf(stderr, "manta: dashboard at %s%s%s, metrics at %smetrics\n", url, tok ? "?token=" : "",
            tok ? tok : "", url);
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
    snprintf(st.logs, sizeof st.logs, "%s", r->logs);
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

/* Copy file `from` (when it exists) to DIR/NAME; a failure is only said. */
static void copy_file(const char *from, const char *dir, const char *name)
{
    FILE *in = fopen(from, "rb");
    if (!in) return;
    char to[PATH_MAX + 80], buf[65536];
    snprintf(to, sizeof to, "%s/%s", dir, name);
    FILE *out = fopen(to, "wb");
    size_t n;
    int bad = !out;
    while (out && (n = fread(buf, 1, sizeof buf, in)) > 0) bad |= fwrite(buf, 1, n, out) != n;
    if (out && fclose(out) != 0) bad = 1;
    fclose(in);
    if (bad) fprintf(stderr, "manta run: cannot write %s: %s\n", to, strerror(errno));
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
static void run_answer(cli *c, run_setup *r, const void *d, size_t n)
{
    char dir[PATH_MAX], path[PATH_MAX + 32];
    answer_dir(r, d, n, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/summary.json", dir);
    if (access(path, F_OK) != 0) keep_answer(dir, d, n);
    keep_answer(r->logs, d, n); /* each run keeps its own answer beside its logs */
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    copy_file(path, r->logs, "metrics.jsonl"); /* and its metrics (RUN_DIR's are the last run's) */
    int plots = 0;
    char err[600] = "";
    if (access(path, F_OK) == 0 && cli_report_write(dir, &plots, err, sizeof err) != 0)
        fprintf(stderr, "manta run: report: %s\n", err);
    snprintf(r->answer_dir, sizeof r->answer_dir, "%s", dir);
    r->plots = plots;
    if (c->json || cli_report_summary(d, n, stdout) != 0) {
        bool short_line = n <= 300 && !memchr(d, '\n', n ? n - 1 : 0);
        if (c->json || short_line) {
            fwrite(d, 1, n, stdout);
            if (n && ((const char *)d)[n - 1] != '\n') fputc('\n', stdout);
        } else {
            printf("answer: %zu bytes, in %s/summary.json (--json prints it)\n", n, dir);
        }
    }
    fflush(stdout);
}

/* The last line of `manta run`: where everything is, and how to look at it
 * after the job (stdout; stderr with --json, whose stdout is the answer). */
static void run_folder_line(const cli *c, const run_setup *r)
{
    FILE *out = c->json ? stderr : stdout;
    if (r->answer_dir[0] && strcmp(r->answer_dir, r->run_dir))
        fprintf(out, "answer in %s: summary.json%s%s\n", r->answer_dir,
                r->plots ? ", metrics.jsonl, plots: " : "",
                r->plots ? "reward.svg success.svg throughput.svg staleness.svg" : "");
    fprintf(out, "run folder %s: %slogs/%s/ (manta status %s; manta logs ACTOR --run %s)\n",
            r->run_dir,
            !r->answer_dir[0] || strcmp(r->answer_dir, r->run_dir) ? ""
            : r->plots ? "summary.json, metrics.jsonl, reward.svg success.svg throughput.svg "
                         "staleness.svg, "
                       : "summary.json, ",
            r->run_id, r->run_dir, r->run_dir);
    fflush(out);
}

/* A run method that ended without an answer (it failed, its actor died, or
 * the driver was interrupted): how, and the last version record, kept for
 * run_keep_end once the teardown is over. */
static void run_note_end(run_setup *r, manta_ctx *m, bool interrupted, const char *why)
{
    if (interrupted)
        snprintf(r->end_status, sizeof r->end_status, "interrupted");
    else
        snprintf(r->end_status, sizeof r->end_status, "failed: %s", why);
    void *v;
    size_t n;
    if (manta_kv_get(m, "policy", &v, &n) == 0) {
        r->last_record = cJSON_ParseWithLength(v, n);
        free(v);
    }
}

/* Every run leaves summary.json: when the job wrote none (its run method's
 * actor died, or could not write while it stopped), the driver writes what
 * it knows: the status and the ledger of the last version recorded. */
static void run_keep_end(run_setup *r)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/summary.json", r->run_dir);
    if (!r->end_status[0] || access(path, F_OK) == 0) return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", r->end_status);
    cJSON_AddStringToObject(j, "run_dir", r->run_dir);
    cJSON_AddStringToObject(j, "written_by", "driver");
    const cJSON *rec = r->last_record;
    if (cJSON_IsObject(rec)) { /* {version, admitted, trained, dropped_stale, ...} */
        static const char *const keys[] = {"admitted", "trained", "dropped_stale", "dropped_error",
                                           "in_flight"};
        cJSON *l = cJSON_AddObjectToObject(j, "ledger");
        double sum = 0, admitted = 0;
        for (int i = 0; i < 5; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, keys[i]);
            double x = cJSON_IsNumber(v) ? v->valuedouble : 0;
            cJSON_AddNumberToObject(l, keys[i], x);
            if (i == 0)
                admitted = x;
            else
                sum += x;
        }
        cJSON_AddBoolToObject(l, "balanced", admitted == sum);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, "version");
        cJSON_AddNumberToObject(l, "at_version", cJSON_IsNumber(v) ? v->valuedouble : -1);
        cJSON_AddNumberToObject(j, "versions", cJSON_IsNumber(v) ? v->valuedouble : -1);
    }
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    if (txt) keep_answer(r->run_dir, txt, strlen(txt));
    free(txt);
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
    if (has_run) run_note_end(r, manta_job_ctx(job), rc == MANTA_ECLOSED, manta_last_error());
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
        if (!parent) run_logs_end(&r, rc);
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
    run_keep_end(
        &r); /* after the teardown: the job's own summary.json, written as it stops, wins */
    cJSON_Delete(r.last_record);
    run_logs_end(&r, rc);
    if (r.run_id[0]) run_folder_line(c, &r);
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

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One run's line: RUN_ID, start, end, exit code (from its run.txt). */
static void status_run_line(const char *logs_root, const char *id)
{
    char path[PATH_MAX + 300], line[PATH_MAX + 64], started[64] = "?", ended[64] = "",
                                                    code[16] = "";
    snprintf(path, sizeof path, "%s/%s/run.txt", logs_root, id);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "started=", 8)) snprintf(started, sizeof started, "%s", line + 8);
        if (!strncmp(line, "ended=", 6)) snprintf(ended, sizeof ended, "%s", line + 6);
        if (!strncmp(line, "exit=", 5)) snprintf(code, sizeof code, "%s", line + 5);
    }
    if (f) fclose(f);
    printf("  %-20s started %s, %s%s%s%s\n", id, started, ended[0] ? "ended " : "not ended", ended,
           code[0] ? ", exit code " : "", code);
}

/* The actors' logs of one run: name, lines, warnings and errors. */
static void status_run_logs(const char *logs)
{
    DIR *d = opendir(logs);
    if (!d) return;
    printf("logs in %s:\n", logs);
    struct dirent *de;
    char *names[512];
    size_t n = 0;
    while ((de = readdir(d)) && n < 512) {
        size_t len = strlen(de->d_name);
        if (len > 4 && !strcmp(de->d_name + len - 4, ".log") && (names[n] = strdup(de->d_name)))
            n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX + 300], line[4096];
        snprintf(path, sizeof path, "%s/%s", logs, names[i]);
        long lines = 0, warn = 0, err = 0;
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f)) {
            lines += strchr(line, '\n') != NULL;
            warn += strstr(line, "\"level\":\"warn\"") != NULL;
            err += strstr(line, "\"level\":\"error\"") != NULL;
        }
        if (f) fclose(f);
        names[i][strlen(names[i]) - 4] = 0;
        printf("  %-20s %6ld lines, %ld warnings, %ld errors\n", names[i], lines, warn, err);
        free(names[i]);
    }
}

/* A finished job's run folder: the runs kept, the last answer, the logs. */
static int status_run_dir(const char *dir, const char *job)
{
    char logs_root[PATH_MAX + 8], latest[PATH_MAX + 64] = "", path[PATH_MAX + 32];
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "manta status: %s: not a run folder\n", dir);
        return MANTA_EXIT_NOT_FOUND;
    }
    printf("run folder %s%s%s%s\n", dir, job ? " (job " : "", job ? job : "", job ? ")" : "");
    snprintf(logs_root, sizeof logs_root, "%s/logs", dir);
    run_logs_of(dir, latest, sizeof latest);
    DIR *d = opendir(logs_root);
    char *ids[512];
    size_t n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) && n < 512) {
        char p[PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s/run.txt", logs_root, de->d_name);
        if (de->d_name[0] != '.' && strcmp(de->d_name, "latest") && access(p, F_OK) == 0 &&
            (ids[n] = strdup(de->d_name)))
            n++;
    }
    if (d) closedir(d);
    qsort(ids, n, sizeof *ids, by_name);
    printf("runs: %zu\n", n);
    for (size_t i = 0; i < n; i++) {
        status_run_line(logs_root, ids[i]);
        free(ids[i]);
    }
    snprintf(path, sizeof path, "%s/summary.json", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        char *txt = NULL;
        size_t len = 0;
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        if (sz > 0 && (txt = malloc((size_t)sz + 1))) len = fread(txt, 1, (size_t)sz, f);
        fclose(f);
        printf("answer (summary.json):\n");
        if (txt && cli_report_summary(txt, len, stdout) != 0)
            printf("  %.*s\n", (int)(len > 300 ? 300 : len), txt);
        free(txt);
    }
    status_run_logs(latest);
    return 0;
}

static int cmd_status(cli *c)
{
    manta_ctx *m;
    job_state st;
    const char *dir = c->run ? c->run : c->nargs ? c->args[0] : NULL;
    if (dir) return status_run_dir(dir, NULL);
    if (state_read(c->job, &st) != 0 && !c->redis) {
        if (last_read(c->job, &st) != 0) {
            fprintf(stderr, "manta status: no job %s%sfound here; give a run folder\n",
                    c->job ? c->job : "", c->job ? " " : "");
            return MANTA_EXIT_NOT_FOUND;
        }
        printf("job %s is not running; it has finished\n", st.job);
        return status_run_dir(st.run_dir, st.job);
    }
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
    manta_spec_options so = spec_options(c, c->sets, (size_t)c->nsets);
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
    bool running = false; /* --follow only follows a running job */
    if (c->run) {
        memset(&st, 0, sizeof st);
        run_logs_of(c->run, st.logs, sizeof st.logs);
    } else if (!(running = state_read(c->job, &st) == 0) && last_read(c->job, &st) != 0) {
        fprintf(stderr, "manta logs: no job %s%sfound here; give --run RUN_DIR\n",
                c->job ? c->job : "", c->job ? " " : "");
        return MANTA_EXIT_NOT_FOUND;
    }
    char path[PATH_MAX + 200];
    snprintf(path, sizeof path, "%s/%s.log", st.logs, c->args[0]);
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
        if (!c->follow || !running || g_signal) break;
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
    /* The URL may come in the environment: a password on the command line
     * is readable by every local user (/proc/PID/cmdline). */
    const char *env_url = getenv("MANTA_REDIS");
    if (!c->redis && env_url && *env_url) {
        char why[256];
        if (manta_redis_url_parse(env_url, &c->redis_addr, why, sizeof why) != 0) {
            fprintf(stderr, "manta node: MANTA_REDIS: %s\n", why);
            return MANTA_EXIT_USAGE;
        }
        c->redis = env_url;
    }
    if (!c->redis || !c->job) {
        fprintf(stderr, "manta node: --redis URL (or MANTA_REDIS) and --job NAME are required\n%s",
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
        else if (!strcmp(a, "--run"))
            dst = &c->run;
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
        } else if (!strcmp(a, "--resume")) { /* an optional RUN_DIR: the next word, a folder */
            struct stat st;
            c->resume = 1;
            if (i + 1 < argc && argv[i + 1][0] != '-' && stat(argv[i + 1], &st) == 0 &&
                S_ISDIR(st.st_mode))
                c->resume_dir = argv[++i];
        } else if (!strcmp(a, "--json")) {
            c->json = 1;
        } else if (!strcmp(a, "--dashboard")) {
            c->dashboard = 1;
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

/* `manta help spec`: every declared key as Markdown (docs/spec-keys.md is
 * this output). */
static int help_spec(const cli *c)
{
    printf("# Spec keys\n\n"
           "Generated by `manta help spec` from the declarations the spec loader checks\n"
           "(runtime/spec/spec.c for the runtime's sections, actors/rl_keys.c for the RL\n"
           "classes'). An unknown key, a wrong type or a value out of range is an error at\n"
           "its file:line:col, with a \"did you mean\" when a key is one or two edits from\n"
           "a declared one. A null value (`key:` or `key: ~`) means the default. The fixed\n"
           "keys (job, redis, log_dir, groups, nodes) are described in runtime/spec/README.md.\n"
           "\n## Sections the runtime reads\n\n");
    int rc = manta_spec_keys_markdown(manta_spec_runtime_sections, stdout);
    if (!rc && c->b->sections) {
        printf("## Sections the built-in classes read\n\n");
        rc = manta_spec_keys_markdown(c->b->sections, stdout);
    }
    if (!rc && c->b->settings) {
        printf("## A built-in group's settings\n\n");
        const manta_spec_key set[] = {
            {"groups.GROUP.settings", MANTA_SPEC_K_MAP, 0, 0, NULL,
             "keys of a group whose class is built in; besides these, the keys of the sections "
             "above marked so, nested or flat",
             NULL, c->b->settings, 0},
            {NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0}};
        rc = manta_spec_keys_markdown(set, stdout);
    }
    return rc ? MANTA_EXIT_RUNTIME : 0;
}

int manta_cli_main(int argc, char **argv, const manta_class *const *classes)
{
    const manta_cli_builtins b = {classes, NULL, NULL, NULL};
    return manta_cli_run(argc, argv, &b);
}

int manta_cli_run(int argc, char **argv, const manta_cli_builtins *b)
{
    const manta_class *const *classes = b->classes;
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
    cli c = {.classes = classes, .b = b};
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
        if (c.nargs && !strcmp(c.args[0], "spec")) return help_spec(&c);
        const char *h = c.nargs ? command_help(c.args[0]) : NULL;
        fputs(h ? h : usage_text, stdout);
        return 0;
    }
    fprintf(stderr, "manta: unknown command '%s' (see manta --help)\n", c.cmd);
    return MANTA_EXIT_USAGE;
}
