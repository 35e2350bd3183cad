/*
 * test_fault.c -- fault injection into a whole `manta run` of the
 * calculator job (examples/calc_agent.yaml): one case per run,
 *
 *   test_fault MANTA_EXE CASE
 *
 * Each case starts the job as a user does (the `manta` executable, its
 * embedded redis-server, its node agent, the calc tool server as a
 * `services:` entry on a free port), waits until RL has trained a first
 * version (RUN_DIR/metrics.jsonl has a line), injects its fault into the
 * process it names, found through /proc (an actor or node agent by the
 * MANTA_JOB / MANTA_ROLE / MANTA_NAME of its environment; the tool server
 * and redis-server by a tag in the driver's environment that they
 * inherit, and their command line), and checks the outcome:
 *
 *   none        undisturbed: finishes, held-out success >= stop_at (0.95)
 *   rollout     kill -9 of rollout-0 (no restarts): finishes with the other
 *   env         kill -9 of env-0: finishes with the other
 *   tool        kill -9 of the tool server: restarted (restart: on-failure),
 *               finishes
 *   tool_never  the same with restart: never: fails naming service calc
 *   redis       kill -9 of redis-server: restarted with its data, finishes
 *   redis_stop  SIGSTOP of redis-server for good, MANTA_REDIS_DOWN_MS=3000:
 *               fails naming Redis (within 75 s: every command to a stopped
 *               server waits for its 5 s timeout, the teardown's too)
 *   stop_node   SIGSTOP of the node agent for 7 s (the watchdog's limit is
 *               5 s): not declared dead, finishes
 *   reward      kill -9 of reward-0 (no restarts): fails naming group reward
 *   controller  kill -9 of controller-0: fails naming controller-0
 *   node        kill -9 of the node agent: fails naming the node
 *   driver      kill -9 of the driver: everything else goes with it
 *   driver_shell the same with a service command that needs the shell
 *               ("exec python3 ..."), which runs under a keeper process
 *
 * "Finishes" means exit 0 with held-out success within 10 points of an
 * undisturbed run (which stops at stop_at 0.95: so >= 0.85); "fails" means a
 * non-zero exit within FAIL_WITHIN_S (45 s) of the fault, with the cause in the
 * output. In every case: summary.json's ledger, when the controller lived
 * to write one, is balanced and adds up (admitted = trained + dropped_stale
 * + dropped_error + in_flight); and afterwards no process of the job is
 * left (actors, node agent, tool server, redis-server: /proc is scanned
 * for the job's name and the tag) and the service's port is free.
 *
 * Exit 0 when the case holds, 1 with a message when not, 77 (skipped)
 * without python3 or redis-server.
 */
#include <cjson/cJSON.h>

#include <limits.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAIL_WITHIN_S   45  /* a fault that ends the job: non-zero exit within */
#define JOB_LIMIT_S     300 /* the whole run, whatever happens */
#define FIRST_VERSION_S 180 /* the warm-up: 3 s here, 20x that under ASan on a loaded machine */
#define STOP_AT         0.95
#define POINTS          0.10
#define STOP_NODE_S     7

static char job[64], tag[64], dir[256], out_path[300], run_dir[300];
static pid_t driver;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void cleanup_all(void);

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "tail -n 40 %s >&2", out_path);
    if (system(cmd) != 0) fputs("(no output file)\n", stderr);
    cleanup_all();
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return port;
}

static bool port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

/* ---- /proc ---- */

/* Read /proc/PID/FILE whole (NUL-separated strings); length in *n. */
static char *read_proc(int pid, const char *file, size_t *n)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t r;
    while (buf && (r = read(fd, buf + len, cap - len)) > 0) len += (size_t)r;
    close(fd);
    if (buf) buf[len] = 0;
    *n = len;
    return buf;
}

/* Does the NUL-separated list hold exactly `entry`? */
static bool has_entry(const char *buf, size_t n, const char *entry)
{
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        if (!strcmp(buf + i, entry)) return true;
    return false;
}

static bool is_zombie(int pid)
{
    size_t n;
    char *st = read_proc(pid, "stat", &n);
    const char *p = st ? strrchr(st, ')') : NULL;
    bool z = p && p[1] == ' ' && p[2] == 'Z';
    free(st);
    return z;
}

typedef struct who {
    const char *role; /* "actor", "node", NULL: a process with the tag, "redis": see below */
    const char *name; /* MANTA_NAME, or a substring of the command line */
} who;

/* redis-server rewrites its command line and environment (its process
 * title "redis-server 127.0.0.1:PORT"): the job's is found by its port,
 * learnt from the driver's child at the start. */
static char redis_title[64];

static int ppid_of(int pid)
{
    size_t n;
    char *st = read_proc(pid, "stat", &n);
    const char *p = st ? strrchr(st, ')') : NULL;
    int pp = 0;
    if (p && sscanf(p + 1, " %*c %d", &pp) != 1) pp = 0;
    free(st);
    return pp;
}

static bool cmdline_has(int pid, const char *what)
{
    size_t cn;
    char *cmd = read_proc(pid, "cmdline", &cn);
    for (size_t i = 0; cmd && i < cn; i++)
        if (!cmd[i]) cmd[i] = ' ';
    bool ok = cmd && strstr(cmd, what);
    free(cmd);
    return ok;
}

static bool matches(int pid, const who *w)
{
    if (w->role && !strcmp(w->role, "redis"))
        return redis_title[0] && cmdline_has(pid, redis_title);
    size_t n;
    char *env = read_proc(pid, "environ", &n);
    if (!env) return false;
    char want[128];
    bool ok;
    if (w->role) {
        snprintf(want, sizeof want, "MANTA_JOB=%s", job);
        ok = has_entry(env, n, want);
        snprintf(want, sizeof want, "MANTA_ROLE=%s", w->role);
        ok = ok && has_entry(env, n, want);
        if (ok && w->name) {
            snprintf(want, sizeof want, "MANTA_NAME=%s", w->name);
            ok = has_entry(env, n, want);
        }
    } else {
        ok = has_entry(env, n, tag) && (!w->name || cmdline_has(pid, w->name));
    }
    free(env);
    return ok;
}

/* Pids of live (not zombie) processes matching w, up to cap. */
static int find(const who *w, int *pids, int cap)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) && n < cap) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == getpid() || pid == driver) continue;
        if (matches(pid, w) && !is_zombie(pid)) pids[n++] = pid;
    }
    if (d) closedir(d);
    return n;
}

/* Every process of the job but the driver: by its name, and by the tag. */
static int leftovers(int *pids, int cap)
{
    who actors = {"actor", NULL}, nodes = {"node", NULL}, tagged = {NULL, NULL},
        redis = {"redis", NULL};
    int n = find(&actors, pids, cap);
    n += find(&nodes, pids + n, cap - n);
    n += find(&tagged, pids + n, cap - n);
    n += find(&redis, pids + n, cap - n);
    return n;
}

static void cleanup_all(void)
{
    if (driver > 0) {
        kill(driver, SIGKILL);
        waitpid(driver, NULL, 0);
        driver = 0;
    }
    int pids[64];
    int n = leftovers(pids, 64);
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    char cmd[200]; /* the killed driver's ipc folder */
    snprintf(cmd, sizeof cmd, "rm -rf '/tmp/manta-%s'", job);
    if (system(cmd) != 0) fprintf(stderr, "could not remove /tmp/manta-%s\n", job);
}

/* ---- the run ---- */

static void start(int port, const char *exe, const char *extra, bool shell, const char *env)
{
    char svc[400], svport[64], url[128], jobset[96], rd[400], src_spec[300];
    /* "exec ..." needs the shell: the service then runs under its keeper */
    snprintf(svc, sizeof svc, "services.0.command=%spython3 %s/examples/calc_server.py --port %d",
             shell ? "exec " : "", SOURCE_DIR, port);
    snprintf(svport, sizeof svport, "services.0.port=%d", port);
    snprintf(url, sizeof url, "tools.0.url=http://127.0.0.1:%d/mcp", port);
    snprintf(jobset, sizeof jobset, "job=%s", job);
    snprintf(rd, sizeof rd, "rl.run_dir=%s", run_dir);
    snprintf(src_spec, sizeof src_spec, "%s/examples/calc_agent.yaml", SOURCE_DIR);
    driver = fork();
    if (driver < 0) die("fork: %s", strerror(errno));
    if (driver == 0) {
        int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        putenv(tag);
        if (env) putenv((char *)env);
        if (chdir(SOURCE_DIR) != 0) _exit(126);
        const char *argv[32] = {exe,
                                "run",
                                src_spec,
                                "--log-dir",
                                dir,
                                "--set",
                                jobset,
                                "--set",
                                svc,
                                "--set",
                                svport,
                                "--set",
                                url,
                                "--set",
                                rd,
                                "--set",
                                "rl.max_time_s=240"};
        int k = 17;
        if (extra) argv[k++] = "--set", argv[k++] = extra;
        argv[k] = NULL;
        execv(exe, (char *const *)argv);
        _exit(127);
    }
}

/* Wait for the driver to exit (up to until_s, absolute): its status, or -1. */
static int wait_driver(double until_s)
{
    int status;
    while (now_s() < until_s) {
        pid_t r = waitpid(driver, &status, WNOHANG);
        if (r == driver) {
            driver = 0;
            return status;
        }
        usleep(50000);
    }
    return -1;
}

static bool file_has_line(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    int c, lines = 0;
    while ((c = fgetc(f)) != EOF) lines += c == '\n';
    fclose(f);
    return lines > 0;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) die("summary.json: no number %s", k);
    return v->valuedouble;
}

/* The ledger adds up; returns the final held-out success (-1: none). */
static double check_summary(bool required)
{
    char path[400];
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    char *txt = slurp(path);
    if (!txt) {
        if (required) die("no %s", path);
        printf("no summary.json (the controller did not live to write one)\n");
        return -1;
    }
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) die("%s is not JSON", path);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    if (!l) die("summary.json has no ledger");
    double adm = num(l, "admitted"), tr = num(l, "trained"), st = num(l, "dropped_stale"),
           er = num(l, "dropped_error"), inf = num(l, "in_flight");
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "balanced")) || adm != tr + st + er + inf)
        die("ledger not exact: admitted %.0f, trained %.0f + stale %.0f + error %.0f + in "
            "flight %.0f",
            adm, tr, st, er, inf);
    const cJSON *status = cJSON_GetObjectItemCaseSensitive(j, "status");
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(j, "heldout_success_final");
    double f = cJSON_IsNumber(fin) ? fin->valuedouble : -1;
    printf("summary: status %s, ledger admitted %.0f = %.0f + %.0f + %.0f + %.0f, final %.3f\n",
           cJSON_IsString(status) ? status->valuestring : "?", adm, tr, st, er, inf, f);
    cJSON_Delete(j);
    return f;
}

static bool output_has(const char *what)
{
    char *txt = slurp(out_path);
    bool ok = txt && strstr(txt, what);
    free(txt);
    return ok;
}

/* Nothing of the job is left a few seconds after its driver exited. */
static void check_nothing_left(int port, bool run_folder)
{
    int pids[64], n = 0;
    double until = now_s() + 10;
    while (now_s() < until && (n = leftovers(pids, 64)) > 0) usleep(100000);
    if (n > 0) {
        size_t cn;
        char *cmd = read_proc(pids[0], "cmdline", &cn);
        for (size_t i = 0; cmd && i + 1 < cn; i++)
            if (!cmd[i]) cmd[i] = ' ';
        die("%d process(es) of job %s left behind, e.g. pid %d: %s", n, job, pids[0],
            cmd ? cmd : "?");
    }
    if (port_open(port)) die("the tool server's port %d is still open", port);
    char rundir[128];
    snprintf(rundir, sizeof rundir, "/tmp/manta-%s", job);
    struct stat st;
    if (run_folder && lstat(rundir, &st) == 0)
        die("the job's run folder %s is left behind", rundir);
    if (!run_folder && lstat(rundir, &st) == 0) { /* a killed driver cannot remove it */
        char cmd[200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", rundir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", rundir);
    }
}

/* The driver's redis-server child: its process title. */
static void learn_redis(void)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || ppid_of(pid) != driver || !cmdline_has(pid, "redis-server")) continue;
        size_t cn;
        char *cmd = read_proc(pid, "cmdline", &cn);
        const char *at = cmd ? strstr(cmd, "127.0.0.1:") : NULL;
        if (at) snprintf(redis_title, sizeof redis_title, "redis-server %.30s", at);
        free(cmd);
    }
    if (d) closedir(d);
    if (!redis_title[0]) die("the driver (pid %d) has no redis-server child", (int)driver);
}

/* No sanitizer report in the driver's output or any log of the job (an
 * ASan/UBSan build runs these tests too). */
static void check_no_reports(void)
{
    char cmd[600];
    snprintf(
        cmd, sizeof cmd,
        "grep -rlE 'ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|leaked memory' "
        "'%s' >&2",
        dir);
    if (system(cmd) == 0) die("a sanitizer report in the file(s) above");
}

/* ---- faults ---- */

static int one(const who *w)
{
    int pids[4];
    double until = now_s() + 10;
    while (now_s() < until) {
        if (find(w, pids, 4) == 1) return pids[0];
        usleep(50000);
    }
    die("no single process for %s %s", w->role ? w->role : "tagged", w->name ? w->name : "");
}

typedef struct fault_case {
    const char *name;
    who target;
    int sig;            /* 0: none */
    const char *extra;  /* one --set */
    const char *expect; /* NULL: finishes; else: fails, with this in the output */
    const char *env;    /* NAME=VALUE for the driver, or NULL */
    int fail_within_s;  /* 0: FAIL_WITHIN_S */
} fault_case;

/* clang-format off */
static const fault_case cases[] = {
    {"none",         {NULL, NULL},              0,       NULL, NULL, NULL, 0},
    {"rollout",      {"actor", "rollout-0"},    SIGKILL, NULL, NULL, NULL, 0},
    {"env",          {"actor", "env-0"},        SIGKILL, NULL, NULL, NULL, 0},
    {"tool",         {NULL, "calc_server.py"},  SIGKILL, NULL, NULL, NULL, 0},
    {"tool_never",   {NULL, "calc_server.py"},  SIGKILL, "services.0.restart=never",
                     "service calc was killed by signal 9 (restart: never)", NULL, 0},
    {"redis",        {"redis", NULL},           SIGKILL, NULL, NULL, NULL, 0},
    /* stopped for good: every command waits for its 5 s timeout, and the
     * teardown too (the agent's shutdown call, the keys, the server's stop) */
    {"redis_stop",   {"redis", NULL},           SIGSTOP, NULL, "Redis has not answered for",
                     "MANTA_REDIS_DOWN_MS=3000", 75},
    {"stop_node",    {"node", NULL},            SIGSTOP, NULL, NULL, NULL, 0},
    {"reward",       {"actor", "reward-0"},     SIGKILL, NULL,
                     "group reward: every replica is gone for good", NULL, 0},
    {"controller",   {"actor", "controller-0"}, SIGKILL, NULL, "controller-0.run", NULL, 0},
    {"node",         {"node", NULL},            SIGKILL, NULL,
                     "is gone: its mailbox refuses connections", NULL, 0},
    {"driver",       {NULL, NULL},              SIGKILL, NULL, "", NULL, 0},
    {"driver_shell", {NULL, NULL},              SIGKILL, NULL, "", NULL, 0},
};
/* clang-format on */

/* The case's folder goes when it passed (a failed one stays to be read). */
static void remove_dir(void)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static bool have(const char *prog)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_fault MANTA_EXE CASE\n");
        return 2;
    }
    const fault_case *c = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(cases[i].name, argv[2])) c = &cases[i];
    if (!c) {
        fprintf(stderr, "test_fault: no case '%s'\n", argv[2]);
        return 2;
    }
    if (!have("python3") || !have("redis-server")) {
        fprintf(stderr, "test_fault: needs python3 and redis-server: skipped\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(job, sizeof job, "fault-%s-%d", c->name, (int)getpid());
    for (char *p = job; *p; p++)
        if (*p == '_') *p = '-';
    snprintf(tag, sizeof tag, "MANTA_FAULT_TAG=%s", job);
    snprintf(dir, sizeof dir, "/tmp/manta-test-%s", job);
    if (mkdir(dir, 0700) != 0) die("mkdir %s: %s", dir, strerror(errno));
    snprintf(out_path, sizeof out_path, "%s/out.log", dir);
    snprintf(run_dir, sizeof run_dir, "%s/rl", dir);
    char exe[4096];
    if (!realpath(argv[1], exe)) die("%s: %s", argv[1], strerror(errno));
    int port = free_port();
    double t0 = now_s();
    start(port, exe, c->extra, !strcmp(c->name, "driver_shell"), c->env);

    /* RL has trained a first version: the fault hits a running pipeline. */
    char metrics[400];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir);
    while (!file_has_line(metrics)) {
        if (now_s() - t0 > FIRST_VERSION_S) die("no version trained after %d s", FIRST_VERSION_S);
        int status;
        if (waitpid(driver, &status, WNOHANG) == driver) {
            driver = 0;
            die("the job exited (status %d) before a version was trained", status);
        }
        usleep(50000);
    }
    learn_redis();
    double tf = now_s();
    if (c->sig && !strncmp(c->name, "driver", 6)) {
        printf("kill -9 of the driver, pid %d\n", (int)driver);
        kill(driver, SIGKILL);
        waitpid(driver, NULL, 0);
        driver = 0;
        check_nothing_left(port, false);
        check_no_reports();
        printf("ok: nothing left %.1f s after the driver's death\n", now_s() - tf);
        remove_dir();
        return 0;
    }
    if (c->sig) {
        int pid = one(&c->target);
        printf("signal %d to %s %s, pid %d, %.1f s into the job\n", c->sig,
               c->target.role ? c->target.role : "process", c->target.name ? c->target.name : "",
               pid, tf - t0);
        kill(pid, c->sig);
        if (c->sig == SIGSTOP && c->target.role && !strcmp(c->target.role, "node")) {
            sleep(STOP_NODE_S);
            kill(pid, SIGCONT);
            printf("SIGCONT after %d s\n", STOP_NODE_S);
        }
    }
    int within = c->fail_within_s ? c->fail_within_s : FAIL_WITHIN_S;
    int status = wait_driver(c->expect ? tf + within : t0 + JOB_LIMIT_S);
    if (status == -1)
        die("the job did not end within %d s%s", c->expect ? within : JOB_LIMIT_S,
            c->expect ? " of the fault" : "");
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    printf("driver exited %d, %.1f s after the fault; its last lines:\n", code, now_s() - tf);
    fflush(stdout);
    char tail[400];
    snprintf(tail, sizeof tail, "grep -v '^progress' %s | tail -n 6", out_path);
    if (system(tail) != 0) printf("(no output)\n");
    if (c->expect) {
        if (code == 0) die("the job exited 0 after a fatal fault");
        if (!output_has(c->expect)) die("the output does not name the cause ('%s')", c->expect);
        check_summary(false);
    } else {
        if (code != 0) die("the job failed (exit %d)", code);
        double f = check_summary(true);
        double want = c->sig ? STOP_AT - POINTS : STOP_AT;
        if (f < want) die("held-out success %.3f < %.2f", f, want);
    }
    check_nothing_left(port, true);
    check_no_reports();
    printf("ok: %s\n", c->name);
    remove_dir();
    return 0;
}
