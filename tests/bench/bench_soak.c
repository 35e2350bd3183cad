/* Run: ./build/tests/bench/bench_soak [--calls N] > figures.jsonl
 *      ./build/tests/bench/bench_soak --job SAMPLES.jsonl [--metrics FILE] -- COMMAND...
 *
 * bench_soak -- load and soak: does any process's memory grow while the
 * runtime works (issue 12, item 6)? Two modes, one RSS sampler.
 *
 * Calls (the default): 16 echo actors and 4 caller actors in one job. The
 * driver hands the callers rounds of work ("go": N calls each, a sliding
 * window of W calls in flight spread round robin over the 16 echo actors,
 * 64 B each, every reply checked), 1,000,000 calls in all by default. Between
 * rounds, and every --sample-s seconds while a round runs, it reads VmRSS
 * (/proc/PID/status) of every process of the job: itself (the driver), the
 * node agent, each actor and redis-server, found as its descendants in /proc
 * and named by their MANTA_ROLE / MANTA_NAME environment. The RSS of each
 * process after warm-up (the first sample once --warm of the calls are done)
 * is compared with its RSS at the end. Before the soak the same pattern runs
 * in raw libzmq (4 caller processes, each with a DEALER per ROUTER echo
 * process, the same window), and the calls/s figure is a ratio against it.
 *
 * Job (--job): runs COMMAND (e.g. `build/manta run examples/calc_agent.yaml
 * --set ...`), samples every process under it every --every-s seconds into
 * SAMPLES.jsonl (with the policy version so far: the last training line of
 * --metrics, the run's metrics.jsonl), and compares each process's RSS at
 * the first sample at or after --warm-s seconds and --warm-versions versions
 * with its last sample. A process that appears later (a restart) is
 * compared from its own first sample. COMMAND's stdout and stderr go to
 * stderr.
 *
 * Either way stdout gets one JSON line per figure, {"name", "value", "unit",
 * "baseline", "ratio"}: for memory the value is the RSS at the end, the
 * baseline the RSS after warm-up (per process kind: the sum over its
 * processes), and the largest growth of one process of that kind, in kB and
 * per 100k calls or per 1000 versions. The exit status is 1 when any
 * process grew more than --max-growth-kb after warm-up (stderr names it),
 * when a call failed, or when COMMAND failed; 0 otherwise.
 *
 * Actor processes are this same program (manta_init runs them); the raw
 * helpers are this program started with a --raw-* first argument, dispatched
 * before manta_init.
 */
#include <manta.h>

#include <zmq.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NECHO      16   /* echo actors */
#define NCALLER    4    /* caller actors */
#define PAYLOAD    64   /* bytes per call */
#define MAX_WINDOW 4096 /* calls in flight per caller, at most */
#define MAX_PROCS  256  /* processes tracked */

/* ---- clocks and output ---------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void emit(const char *name, double value, const char *unit, double baseline)
{
    if (baseline > 0)
        printf(
            "{\"name\":\"%s\",\"value\":%.6g,\"unit\":\"%s\",\"baseline\":%.6g,\"ratio\":%.4f}\n",
            name, value, unit, baseline, value / baseline);
    else
        printf(
            "{\"name\":\"%s\",\"value\":%.6g,\"unit\":\"%s\",\"baseline\":null,\"ratio\":null}\n",
            name, value, unit);
    fflush(stdout);
}

/* ---- the RSS sampler ---------------------------------------------------------------------- */

/* One process seen under the root, and its RSS at the points that matter. */
typedef struct proc {
    int pid;
    char name[64]; /* "driver", "redis-server", "node", the actor's name, or comm */
    char kind[64]; /* name without a "-N" replica suffix; "node" for any node agent */
    long first_kb, warm_kb, last_kb, max_kb;
    double first_t, warm_t, last_t;
    double warm_work, last_work; /* calls done or versions trained at those samples */
    int have_warm;
} proc;

typedef struct sampler {
    int root;
    proc p[MAX_PROCS];
    int n;
    FILE *out; /* every sample as a JSON line, or NULL */
    double t0;
} sampler;

/* Read a small file whole into buf (NUL-terminated, NULs inside kept). */
static ssize_t slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
    close(fd);
    buf[n] = 0;
    return (ssize_t)n;
}

/* ppid and comm from /proc/PID/stat ("pid (comm) S ppid ..."; comm may hold
 * spaces and parentheses, so it ends at the last ')'). */
static int read_stat(int pid, int *ppid, char *comm, size_t cap)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (slurp(path, buf, sizeof buf) <= 0) return -1;
    char *l = strchr(buf, '('), *r = strrchr(buf, ')');
    if (!l || !r || r < l) return -1;
    snprintf(comm, cap, "%.*s", (int)(r - l - 1), l + 1);
    char state;
    return sscanf(r + 1, " %c %d", &state, ppid) == 2 ? 0 : -1;
}

static long read_rss_kb(int pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    if (slurp(path, buf, sizeof buf) <= 0) return -1;
    char *v = strstr(buf, "\nVmRSS:");
    return v ? strtol(v + 7, NULL, 10) : -1;
}

/* The value of VAR in /proc/PID/environ, or "" (the file is NUL-separated). */
static void read_env(int pid, const char *var, char *out, size_t cap)
{
    char path[64], buf[16384];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    out[0] = 0;
    ssize_t n = slurp(path, buf, sizeof buf);
    size_t vl = strlen(var);
    for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
        if (!strncmp(buf + i, var, vl) && buf[i + vl] == '=') {
            snprintf(out, cap, "%s", buf + i + vl + 1);
            return;
        }
}

/* "rollout-3" -> "rollout"; other names stay. */
static void kind_of(const char *name, char *kind, size_t cap)
{
    size_t l = strnlen(name, cap - 1);
    memmove(kind, name, l);
    kind[l] = 0;
    char *d = strrchr(kind, '-');
    if (!d || !d[1]) return;
    for (const char *c = d + 1; *c; c++)
        if (!isdigit((unsigned char)*c)) return;
    *d = 0;
}

static proc *proc_find(sampler *s, int pid, const char *comm)
{
    for (int i = 0; i < s->n; i++)
        if (s->p[i].pid == pid) return &s->p[i];
    if (s->n == MAX_PROCS) return NULL;
    proc *p = &s->p[s->n++];
    memset(p, 0, sizeof *p);
    p->pid = pid;
    char role[32], name[64];
    read_env(pid, "MANTA_ROLE", role, sizeof role);
    read_env(pid, "MANTA_NAME", name, sizeof name);
    if (pid == s->root)
        snprintf(p->name, sizeof p->name, "driver");
    else if (!strcmp(comm, "redis-server"))
        snprintf(p->name, sizeof p->name, "redis-server");
    else if (!strcmp(role, "node"))
        snprintf(p->name, sizeof p->name, "node");
    else if (name[0])
        snprintf(p->name, sizeof p->name, "%s", name);
    else /* a service's process (its server, or the shell that runs it) */
        snprintf(p->name, sizeof p->name, "%s", comm);
    kind_of(p->name, p->kind, sizeof p->kind);
    return p;
}

/* Sample every process under the root: its RSS, and at the first sample at
 * or after the warm-up point (warm != 0) its warm-up RSS. `work` is calls
 * done or versions so far. */
static void sample(sampler *s, int warm, double work)
{
    static int pids[32768], ppids[32768];
    static char comms[32768][32];
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 32768) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name);
        if (read_stat(pid, &ppids[n], comms[n], sizeof comms[n]) == 0) pids[n++] = pid;
    }
    if (d) closedir(d);
    /* The root and its descendants: mark in passes until nothing changes
     * (a process tree is a handful of levels deep). */
    static char in[32768];
    memset(in, 0, (size_t)n);
    int changed = 1;
    for (int i = 0; i < n; i++) in[i] = pids[i] == s->root;
    while (changed) {
        changed = 0;
        for (int i = 0; i < n; i++) {
            if (in[i]) continue;
            for (int j = 0; j < n; j++)
                if (in[j] && pids[j] == ppids[i]) {
                    in[i] = 1, changed = 1;
                    break;
                }
        }
    }
    double t = now_s() - s->t0;
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        long kb = read_rss_kb(pids[i]);
        if (kb <= 0) continue; /* gone, or a zombie */
        proc *p = proc_find(s, pids[i], comms[i]);
        if (!p) continue;
        if (!p->first_t) p->first_kb = kb, p->first_t = t > 0 ? t : 1e-9;
        if (warm && !p->have_warm)
            p->warm_kb = kb, p->warm_t = t, p->warm_work = work, p->have_warm = 1;
        p->last_kb = kb, p->last_t = t, p->last_work = work;
        if (kb > p->max_kb) p->max_kb = kb;
        if (s->out)
            fprintf(s->out,
                    "{\"t\":%.1f,\"work\":%.0f,\"pid\":%d,\"name\":\"%s\",\"kind\":\"%s\","
                    "\"rss_kb\":%ld}\n",
                    t, work, p->pid, p->name, p->kind, kb);
    }
    if (s->out) fflush(s->out);
}

/* Per process and per kind: RSS after warm-up and at the end, growth. Prints
 * a table on stderr and figures on stdout; returns how many processes grew
 * more than max_kb. `per` scales growth per `per_n` units of work. */
static int report(sampler *s, const char *prefix, long max_kb, const char *per_unit, double per_n)
{
    int over = 0;
    fprintf(stderr, "%-24s %7s %10s %10s %10s %10s %9s %12s\n", "process", "pid", "first_kB",
            "warm_kB", "end_kB", "max_kB", "growth_kB", per_unit);
    char kinds[MAX_PROCS][64];
    int nk = 0;
    for (int i = 0; i < s->n; i++) {
        proc *p = &s->p[i];
        if (!p->have_warm) { /* started after the warm-up point: from its first sample */
            p->warm_kb = p->first_kb, p->warm_t = p->first_t, p->warm_work = p->last_work;
        }
        long g = p->last_kb - p->warm_kb;
        double dw = p->last_work - p->warm_work;
        fprintf(stderr, "%-24s %7d %10ld %10ld %10ld %10ld %9ld %12.1f%s\n", p->name, p->pid,
                p->first_kb, p->warm_kb, p->last_kb, p->max_kb, g,
                dw > 0 ? (double)g * per_n / dw : 0.0, g > max_kb ? "  GREW" : "");
        if (g > max_kb) over++;
        int k;
        for (k = 0; k < nk; k++)
            if (!strcmp(kinds[k], p->kind)) break;
        if (k == nk) snprintf(kinds[nk++], sizeof kinds[0], "%s", p->kind);
    }
    for (int k = 0; k < nk; k++) {
        long warm = 0, end = 0, gmax = LONG_MIN;
        double per = 0;
        int np = 0;
        for (int i = 0; i < s->n; i++) {
            proc *p = &s->p[i];
            if (strcmp(p->kind, kinds[k])) continue;
            long g = p->last_kb - p->warm_kb;
            double dw = p->last_work - p->warm_work;
            warm += p->warm_kb, end += p->last_kb, np++;
            if (g > gmax) gmax = g, per = dw > 0 ? (double)g * per_n / dw : 0;
        }
        char name[160], unit[64];
        snprintf(name, sizeof name, "%s_rss_%s_x%d", prefix, kinds[k], np);
        emit(name, (double)end, "kB at end (baseline: after warm-up)", (double)warm);
        snprintf(name, sizeof name, "%s_rss_growth_max_%s_lower_better", prefix, kinds[k]);
        emit(name, (double)gmax, "kB", 0);
        snprintf(name, sizeof name, "%s_rss_growth_max_%s_per_%s_lower_better", prefix, kinds[k],
                 per_unit);
        snprintf(unit, sizeof unit, "kB/%s", per_unit);
        emit(name, per, unit, 0);
    }
    if (over)
        fprintf(stderr,
                "bench_soak: FAIL: %d process(es) grew more than %ld kB after warm-up "
                "(marked GREW above)\n",
                over, max_kb);
    else
        fprintf(stderr, "bench_soak: ok: no process grew more than %ld kB after warm-up\n", max_kb);
    return over;
}

/* ---- the actors ---------------------------------------------------------------------------- */

/* Arguments of "go": `count` echo calls over the echo actors named
 * "echo-0".."echo-(ntargets-1)", round robin, at most `window` in flight. */
typedef struct go_args {
    uint64_t count;
    uint32_t window, ntargets;
} go_args;

typedef struct go_result {
    uint64_t done, bad; /* calls answered, and of those with a wrong reply */
    int32_t rc;         /* first error, 0 if none */
} go_result;

typedef struct caller_state {
    manta_actor *t[NECHO];
    int nt;
} caller_state;

static int m_echo(manta_req *c, void *st, const void *arg, size_t len)
{
    (void)st;
    return manta_reply(c, arg, len);
}

/* A sliding window: wait for the oldest call, check its reply, send the next. */
static int m_go(manta_req *c, void *st, const void *arg, size_t len)
{
    caller_state *s = st;
    go_args a;
    if (len != sizeof a) return manta_reply_error(c, MANTA_EINVAL, "go: want a go_args");
    memcpy(&a, arg, sizeof a);
    if (a.ntargets < 1 || a.ntargets > NECHO || a.window < 1 || a.window > MAX_WINDOW)
        return manta_reply_error(c, MANTA_EINVAL, "go: bad arguments");
    manta_ctx *m = manta_req_ctx(c);
    for (; s->nt < (int)a.ntargets; s->nt++) { /* looked up once per incarnation */
        char name[32];
        snprintf(name, sizeof name, "echo-%d", s->nt);
        int rc = manta_actor_lookup(m, name, &s->t[s->nt]);
        if (rc) return manta_reply_error(c, rc, "go: lookup %s: %s", name, manta_last_error());
    }
    static manta_future *fs[MAX_WINDOW];
    static char buf[MAX_WINDOW][PAYLOAD];
    go_result r = {0};
    uint64_t sent = 0;
    size_t head = 0, inflight = 0;
    while (r.done < a.count) {
        while (sent < a.count && inflight < a.window) {
            size_t slot = (head + inflight) % a.window;
            /* each call's payload names it, so a reply routed to the wrong
             * future would be seen */
            memset(buf[slot], 'a' + (int)(sent % 26), PAYLOAD);
            memcpy(buf[slot], &sent, sizeof sent);
            fs[slot] = manta_call(m, s->t[sent % a.ntargets], "echo", buf[slot], PAYLOAD);
            sent++, inflight++;
        }
        const void *d;
        size_t n;
        int g = fs[head] ? manta_get(fs[head], -1, &d, &n) : MANTA_ENOMEM;
        if (g == 0 && (n != PAYLOAD || memcmp(d, buf[head], PAYLOAD))) r.bad++;
        if (g && !r.rc) r.rc = g;
        manta_future_free(fs[head]);
        head = (head + 1) % a.window, inflight--, r.done++;
    }
    return manta_reply(c, &r, sizeof r);
}

static const manta_method methods[] = {{"echo", m_echo}, {"go", m_go}, {NULL, NULL}};
static const manta_class soak_class = {"soak", sizeof(caller_state), NULL, NULL, methods};
static const manta_class *const classes[] = {&soak_class, NULL};

/* ---- raw libzmq baseline: helper processes ------------------------------------------------- */

static char g_exe[512];

static void raw_opts(void *s)
{
    int zero = 0;
    /* As the runtime's sockets: no high-water mark, no linger. */
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
}

static int raw_main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    void *ctx = zmq_ctx_new();
    if (!strcmp(argv[1], "--raw-echo") && argc == 3) {
        void *s = zmq_socket(ctx, ZMQ_ROUTER);
        raw_opts(s);
        if (zmq_bind(s, argv[2]) != 0) return 1;
        printf("ready\n");
        fflush(stdout);
        for (;;) {
            zmq_msg_t route, body;
            zmq_msg_init(&route);
            zmq_msg_init(&body);
            if (zmq_msg_recv(&route, s, 0) < 0 || zmq_msg_recv(&body, s, 0) < 0) return 1;
            zmq_msg_send(&route, s, ZMQ_SNDMORE);
            zmq_msg_send(&body, s, 0);
        }
    }
    /* --raw-caller COUNT WINDOW EP...: the same sliding window as m_go, one
     * DEALER per echo process; prints "done seconds bad" after a go byte. */
    if (!strcmp(argv[1], "--raw-caller") && argc >= 5 && argc - 4 <= NECHO) {
        uint64_t count = strtoull(argv[2], NULL, 10);
        size_t window = strtoul(argv[3], NULL, 10);
        int ns = argc - 4;
        if (window < 1 || window > MAX_WINDOW) return 2;
        void *socks[NECHO];
        for (int i = 0; i < ns; i++) {
            socks[i] = zmq_socket(ctx, ZMQ_DEALER);
            raw_opts(socks[i]);
            if (zmq_connect(socks[i], argv[4 + i]) != 0) return 1;
        }
        static char buf[MAX_WINDOW][PAYLOAD];
        static int sock_of[MAX_WINDOW];
        printf("ready\n");
        fflush(stdout);
        char go;
        if (read(0, &go, 1) != 1) return 1;
        double t0 = now_s();
        uint64_t sent = 0, done = 0, bad = 0;
        size_t head = 0, inflight = 0;
        while (done < count) {
            while (sent < count && inflight < window) {
                size_t slot = (head + inflight) % window;
                memset(buf[slot], 'a' + (int)(sent % 26), PAYLOAD);
                memcpy(buf[slot], &sent, sizeof sent);
                sock_of[slot] = (int)(sent % (uint64_t)ns);
                if (zmq_send(socks[sock_of[slot]], buf[slot], PAYLOAD, 0) != PAYLOAD) return 1;
                sent++, inflight++;
            }
            /* Replies come back in order per socket; the oldest call's socket
             * answers it next. */
            char got[PAYLOAD];
            if (zmq_recv(socks[sock_of[head]], got, sizeof got, 0) != PAYLOAD) return 1;
            if (memcmp(got, buf[head], PAYLOAD)) bad++;
            head = (head + 1) % window, inflight--, done++;
        }
        printf("%" PRIu64 " %.9f %" PRIu64 "\n", done, now_s() - t0, bad);
        fflush(stdout);
        _exit(0); /* no linger, no teardown: the parent reads and reaps */
    }
    fprintf(stderr, "bench_soak: unknown helper mode %s\n", argv[1]);
    return 2;
}

typedef struct helper {
    pid_t pid;
    int to, from; /* its stdin and stdout */
} helper;

static int read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t n = 0;
    while (n + 1 < cap) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) <= 0) return -1;
        char ch;
        if (read(fd, &ch, 1) != 1) return -1;
        if (ch == '\n') break;
        buf[n++] = ch;
    }
    buf[n] = 0;
    return 0;
}

static void helper_stop(helper *h)
{
    if (h->pid <= 0) return;
    kill(h->pid, SIGKILL);
    waitpid(h->pid, NULL, 0);
    close(h->to);
    close(h->from);
    h->pid = 0;
}

/* Start this program with args, pipes on its stdin and stdout; wait for "ready". */
static int helper_start(helper *h, char **args)
{
    char *argv[8 + NECHO];
    int k = 0;
    argv[k++] = g_exe;
    for (; *args && k < 7 + NECHO; args++) argv[k++] = *args;
    argv[k] = NULL;
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) return -1;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]), close(in[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execv(g_exe, argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    h->pid = pid, h->to = in[1], h->from = out[0];
    char line[64];
    if (read_line(h->from, line, sizeof line, 10000) != 0 || strcmp(line, "ready")) {
        fprintf(stderr, "bench_soak: helper %s did not start\n", argv[1]);
        helper_stop(h);
        return -1;
    }
    return 0;
}

/* 4 raw callers x 16 raw echo processes, `total` calls in all: calls/s. */
static int raw_baseline(uint64_t total, unsigned window, const char *dir, double *rate)
{
    helper echo[NECHO] = {0}, callers[NCALLER] = {0};
    char eps[NECHO][256], cnt[32], win[32];
    int rc = 0;
    for (int i = 0; i < NECHO && !rc; i++) {
        snprintf(eps[i], sizeof eps[i], "ipc://%s/raw%d", dir, i);
        char *args[] = {"--raw-echo", eps[i], NULL};
        if (helper_start(&echo[i], args)) rc = -1;
    }
    snprintf(cnt, sizeof cnt, "%" PRIu64, total / NCALLER);
    snprintf(win, sizeof win, "%u", window);
    char *args[8 + NECHO] = {"--raw-caller", cnt, win};
    for (int i = 0; i < NECHO; i++) args[3 + i] = eps[i];
    for (int i = 0; i < NCALLER && !rc; i++)
        if (helper_start(&callers[i], args)) rc = -1;
    for (int i = 0; i < NCALLER && !rc; i++)
        if (write(callers[i].to, "g", 1) != 1) rc = -1;
    uint64_t done = 0;
    double slowest = 0;
    for (int i = 0; i < NCALLER && !rc; i++) {
        char line[128];
        uint64_t n, bad;
        double el;
        if (read_line(callers[i].from, line, sizeof line, 600000) ||
            sscanf(line, "%" SCNu64 " %lf %" SCNu64, &n, &el, &bad) != 3 || bad) {
            rc = -1;
        } else {
            done += n;
            if (el > slowest) slowest = el;
        }
    }
    for (int i = 0; i < NCALLER; i++) helper_stop(&callers[i]);
    for (int i = 0; i < NECHO; i++) {
        helper_stop(&echo[i]);
        unlink(eps[i] + 6);
    }
    /* All callers start together; the run lasts until the slowest is done. */
    *rate = rc || slowest <= 0 ? 0 : (double)done / slowest;
    return rc;
}

/* ---- calls mode -------------------------------------------------------------------------------
 */

typedef struct calls_opts {
    uint64_t calls;     /* in all */
    unsigned window;    /* per caller */
    unsigned rounds;    /* the calls are handed out in this many rounds */
    double warm;        /* share of the calls before the warm-up sample */
    double sample_s;    /* sample at least this often */
    long max_growth_kb; /* per process, after warm-up */
    const char *samples;
    int no_baseline;
} calls_opts;

static int calls_mode(manta_ctx *m, const calls_opts *o)
{
    int failed = 0;
    double base = 0;
    if (!o->no_baseline) {
        char dir[] = "/tmp/manta-soak-XXXXXX";
        if (!mkdtemp(dir)) return 1;
        fprintf(stderr, "bench_soak: raw libzmq baseline, %" PRIu64 " calls\n", o->calls);
        if (raw_baseline(o->calls, o->window, dir, &base)) {
            fprintf(stderr, "bench_soak: the raw baseline failed\n");
            failed = 1;
        }
        rmdir(dir);
    }
    manta_actor *echo[NECHO], *callers[NCALLER];
    for (int i = 0; i < NECHO + NCALLER; i++) {
        char name[32];
        if (i < NECHO)
            snprintf(name, sizeof name, "echo-%d", i);
        else
            snprintf(name, sizeof name, "caller-%d", i - NECHO);
        manta_actor_options ao = {.cls = "soak", .name = name, .no_wait = 1};
        int rc = manta_actor_create(m, &ao, i < NECHO ? &echo[i] : &callers[i - NECHO]);
        if (rc) {
            fprintf(stderr, "bench_soak: create %s: %s\n", name, manta_last_error());
            return 1;
        }
    }
    for (int i = 0; i < NECHO + NCALLER; i++) {
        manta_actor *a = i < NECHO ? echo[i] : callers[i - NECHO];
        if (manta_actor_wait_ready(m, a, 60000)) {
            fprintf(stderr, "bench_soak: %s not ready: %s\n", manta_actor_name(a),
                    manta_last_error());
            return 1;
        }
    }
    sampler s = {.root = getpid(), .t0 = now_s()};
    if (o->samples && !(s.out = fopen(o->samples, "w"))) {
        fprintf(stderr, "bench_soak: %s: %s\n", o->samples, strerror(errno));
        return 1;
    }
    sample(&s, 0, 0);
    uint64_t per_round = o->calls / o->rounds / NCALLER, done = 0, bad = 0;
    uint64_t warm_at = (uint64_t)((double)o->calls * o->warm);
    int warm = 0, rc = 0;
    double t_warm = 0, t_end = 0, done_warm = 0, t_start = now_s(), last_sample = t_start;
    fprintf(stderr,
            "bench_soak: %" PRIu64 " calls: %d callers x %d echo actors, %u in flight per "
            "caller, %u rounds, warm-up at %" PRIu64 " calls\n",
            o->calls, NCALLER, NECHO, o->window, o->rounds, warm_at);
    for (unsigned r = 0; r < o->rounds && !rc; r++) {
        /* the last round takes what the division left */
        uint64_t left = o->calls - done, each = r + 1 == o->rounds ? left / NCALLER : per_round;
        manta_future *fs[NCALLER];
        for (int i = 0; i < NCALLER; i++) {
            go_args a = {.count = each + (r + 1 == o->rounds && i < (int)(left % NCALLER)),
                         .window = o->window,
                         .ntargets = NECHO};
            fs[i] = manta_call_timeout(m, callers[i], "go", &a, sizeof a, 3600 * 1000);
        }
        while (manta_wait(fs, NCALLER, NCALLER, (int)(o->sample_s * 1000)) < NCALLER) {
            sample(&s, 0, (double)done);
            last_sample = now_s();
        }
        for (int i = 0; i < NCALLER; i++) {
            const void *d;
            size_t n;
            go_result g;
            int e = manta_get(fs[i], 0, &d, &n);
            if (e == 0 && n == sizeof g) {
                memcpy(&g, d, sizeof g);
                done += g.done, bad += g.bad;
                if (g.rc) e = g.rc;
            } else if (e == 0) {
                e = MANTA_EPROTO;
            }
            if (e && !rc) {
                rc = e;
                fprintf(stderr, "bench_soak: caller-%d: %s (%s)\n", i, manta_strerror(e),
                        manta_future_error(fs[i]));
            }
            manta_future_free(fs[i]);
        }
        double t = now_s();
        if (!warm && done >= warm_at) {
            warm = 1, t_warm = t, done_warm = (double)done;
            sample(&s, 1, (double)done);
            last_sample = t;
            fprintf(stderr, "bench_soak: warm-up sample at %" PRIu64 " calls, %.1f s\n", done,
                    t - t_start);
        } else if (t - last_sample >= o->sample_s) {
            sample(&s, 0, (double)done);
            last_sample = t;
        }
    }
    t_end = now_s();
    sample(&s, 0, (double)done);
    if (s.out) fclose(s.out);
    if (rc || bad || done != o->calls) {
        fprintf(stderr,
                "bench_soak: FAIL: %" PRIu64 " of %" PRIu64 " calls answered, %" PRIu64
                " with a wrong reply, first error %s\n",
                done, o->calls, bad, rc ? manta_strerror(rc) : "none");
        failed = 1;
    }
    fprintf(stderr, "bench_soak: %" PRIu64 " calls in %.1f s (%.0f calls/s after warm-up)\n", done,
            t_end - t_start, t_end > t_warm ? ((double)done - done_warm) / (t_end - t_warm) : 0);
    char name[96];
    snprintf(name, sizeof name, "soak_calls_%dto%d_ipc_64B", NCALLER, NECHO);
    emit(name, (double)done / (t_end - t_start), "calls/s", base);
    if (report(&s, "soak_calls", o->max_growth_kb, "100k_calls", 1e5)) failed = 1;
    return failed;
}

/* ---- job mode -----------------------------------------------------------------------------------
 */

/* The policy version of the last training line of the metrics file (lines
 * that start {"version":...; evaluations and warnings start otherwise). */
static double last_version(const char *path)
{
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    double v = 0;
    char line[8192];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "{\"version\":", 11)) v = atof(line + 11);
    fclose(f);
    return v;
}

typedef struct job_opts {
    const char *samples, *metrics;
    double warm_s, every_s, warm_versions;
    long max_growth_kb;
    char **cmd;
} job_opts;

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    g_stop = sig;
}

static int job_mode(const job_opts *o)
{
    sampler s = {.t0 = now_s()};
    if (!(s.out = fopen(o->samples, "w"))) {
        fprintf(stderr, "bench_soak: %s: %s\n", o->samples, strerror(errno));
        return 1;
    }
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* the job goes when the soak goes */
        if (getppid() != parent) _exit(1);
        dup2(2, 1); /* its output to stderr: stdout stays JSON lines */
        execvp(o->cmd[0], o->cmd);
        fprintf(stderr, "bench_soak: exec %s: %s\n", o->cmd[0], strerror(errno));
        _exit(127);
    }
    s.root = pid;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    int status = 0, warm = 0;
    for (;;) {
        double t = now_s() - s.t0;
        double v = last_version(o->metrics);
        if (!warm && t >= o->warm_s && v >= o->warm_versions) warm = 1;
        sample(&s, warm, v);
        fprintf(stderr, "bench_soak: t=%.0f s, %.0f versions, %d processes seen\n", t, v, s.n);
        /* sleep until the next sample, or until the job ends */
        double next = t + o->every_s;
        int ended = 0;
        while (!ended && now_s() - s.t0 < next) {
            if (waitpid(pid, &status, WNOHANG) == pid) ended = 1;
            if (g_stop) kill(pid, SIGTERM), g_stop = 0;
            if (!ended) usleep(100000);
        }
        if (ended) break;
    }
    fclose(s.out);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    double v = last_version(o->metrics);
    fprintf(stderr, "bench_soak: the job exited with status %d after %.0f s, %.0f versions\n", code,
            now_s() - s.t0, v);
    int failed = code != 0;
    if (!warm) {
        fprintf(
            stderr,
            "bench_soak: FAIL: the job ended before the warm-up point (%.0f s, %.0f versions)\n",
            o->warm_s, o->warm_versions);
        failed = 1;
    }
    if (report(&s, "soak_job", o->max_growth_kb, "1000_versions", 1000)) failed = 1;
    return failed;
}

/* ---- main
 * ------------------------------------------------------------------------------------------ */

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--calls N] [--window W] [--rounds R] [--warm FRACTION] [--sample-s S]\n"
            "          [--max-growth-kb K] [--samples FILE] [--no-baseline]\n"
            "       %s --job SAMPLES.jsonl [--metrics FILE] [--warm-s S] [--warm-versions V]\n"
            "          [--every-s S]"
            " [--max-growth-kb K] -- COMMAND [ARG]...\n"
            "defaults: 1000000 calls (env MANTA_SOAK_CALLS), window 64, 100 rounds, warm 0.1,\n"
            "sample-s 1, max-growth-kb 2048; job: warm-s 60, every-s 10, max-growth-kb 4096\n",
            argv0, argv0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strncmp(argv[1], "--raw-", 6)) return raw_main(argc, argv);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--job")) {
            job_opts o = {.warm_s = 60, .every_s = 10, .max_growth_kb = 4096};
            int j;
            for (j = 1; j < argc && strcmp(argv[j], "--"); j++) {
                const char *v = j + 1 < argc ? argv[j + 1] : NULL;
                if (!strcmp(argv[j], "--job") && v)
                    o.samples = argv[++j];
                else if (!strcmp(argv[j], "--metrics") && v)
                    o.metrics = argv[++j];
                else if (!strcmp(argv[j], "--warm-s") && v)
                    o.warm_s = atof(argv[++j]);
                else if (!strcmp(argv[j], "--warm-versions") && v)
                    o.warm_versions = atof(argv[++j]);
                else if (!strcmp(argv[j], "--every-s") && v)
                    o.every_s = atof(argv[++j]);
                else if (!strcmp(argv[j], "--max-growth-kb") && v)
                    o.max_growth_kb = atol(argv[++j]);
                else
                    return usage(argv[0]), 2;
            }
            if (j + 1 >= argc || o.every_s <= 0) return usage(argv[0]), 2;
            o.cmd = argv + j + 1;
            return job_mode(&o);
        }
    }
    manta_ctx *m;
    /* In an actor process this runs the actor and never returns. */
    if (manta_init(&m, &(manta_options){.classes = classes, .transport = "ipc"}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    const char *env = getenv("MANTA_SOAK_CALLS");
    calls_opts o = {.calls = env ? strtoull(env, NULL, 10) : 1000000,
                    .window = 64,
                    .rounds = 100,
                    .warm = 0.1,
                    .sample_s = 1,
                    .max_growth_kb = 2048};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--calls") && v)
            o.calls = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--window") && v)
            o.window = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && v)
            o.rounds = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warm") && v)
            o.warm = atof(argv[++i]);
        else if (!strcmp(argv[i], "--sample-s") && v)
            o.sample_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--max-growth-kb") && v)
            o.max_growth_kb = atol(argv[++i]);
        else if (!strcmp(argv[i], "--samples") && v)
            o.samples = argv[++i];
        else if (!strcmp(argv[i], "--no-baseline"))
            o.no_baseline = 1;
        else
            o.calls = 0; /* bad argument: refused below */
    }
    if (o.calls < (uint64_t)NCALLER * (o.rounds ? o.rounds : 1) || o.rounds < 2 || o.window < 1 ||
        o.window > MAX_WINDOW || o.warm <= 0 || o.warm >= 1 || o.sample_s <= 0) {
        usage(argv[0]);
        manta_shutdown(m);
        return 2;
    }
    ssize_t n = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
    if (n <= 0) {
        manta_shutdown(m);
        return 1;
    }
    g_exe[n] = 0;
    int failed = calls_mode(m, &o);
    manta_shutdown(m);
    return failed;
}
