/* Run: ./build/tests/bench/bench_runtime [--quick] > figures.jsonl
 *
 * bench_runtime -- what the actor runtime costs over the libraries it is
 * built on, measured against those libraries in the same run (issue 2,
 * section 10). Each figure is one JSON line on stdout:
 *
 *     {"name":..., "value":..., "unit":..., "baseline":..., "ratio":...}
 *
 * with ratio = value / baseline. For throughput and bandwidth higher is
 * better; latency figures end in "_lower_better" and there a ratio under 1
 * would mean Manta beat the baseline. stderr gets one line about the machine
 * first, then progress and errors.
 *
 * What runs against what:
 *   calls    manta_call on "echo" actors, 1:1 sync, 1:1 pipelined (windows
 *            of 1000), 1:N (N = 4 actors, windows of 1000 spread over them)
 *            and N:N (4 caller actors, each pipelining over all 4 echo
 *            actors), 64 B and 4 KiB, over ipc and tcp; against raw libzmq
 *            DEALER -> ROUTER echo processes in the same pattern (N:N with 4
 *            raw caller processes).
 *   latency  p50/p99 of the 64 B sync calls against raw REQ/REP.
 *   objects  manta_put + manta_obj_get and manta_obj_get alone, 64 B and
 *            4 KiB, against SET + GET and GET from one hiredis client on the
 *            same (embedded) redis-server.
 *   large    16 MiB manta_obj_fetch by the driver of an object an actor put,
 *            against a raw DEALER fetching 16 MiB from a ROUTER process that
 *            sends it zero copy.
 *
 * Every raw server and caller is this same program started again with a
 * --raw-* first argument, so both sides pay for separate processes. They are
 * dispatched before manta_init(): an actor process is started with no
 * arguments, so it never takes that branch.
 */
#include <manta.h>

#include <hiredis/hiredis.h>
#include <zmq.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NACT        4           /* N of 1:N and N:N */
#define WINDOW      1000        /* calls in flight in the pipelined patterns */
#define LARGE_BYTES (16u << 20) /* the large object */
#define MAX_SAMPLES (1u << 20)  /* latency samples kept per run */

/* ---- clocks and output ---------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int g_failures;

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

static void fail(const char *what, int rc)
{
    fprintf(stderr, "bench_runtime: %s: %s (%s)\n", what, manta_strerror(rc), manta_last_error());
    g_failures++;
}

/* Latency samples in microseconds; p50/p99 by sorting. */
typedef struct samples {
    double *v;
    size_t n;
} samples;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(samples *s, double p)
{
    if (!s->n) return 0;
    qsort(s->v, s->n, sizeof *s->v, cmp_double);
    return s->v[(size_t)((double)(s->n - 1) * p)];
}

/* ---- the actor side ---------------------------------------------------------- */

/* Arguments of "go": a caller actor pipelines echo calls over its targets.
 * Same binary on both sides, so the struct travels as bytes. */
typedef struct go_args {
    uint32_t size, window, ntargets;
    double warm_s, run_s;
    char targets[NACT][32];
} go_args;

typedef struct go_result {
    uint64_t count, ns;
    int32_t rc;
} go_result;

typedef struct bench_state {
    manta_obj_id blob;
    int have_blob;
} bench_state;

/* Echo calls over targets, round robin, `window` in flight, until `secs`
 * have passed (at least one window). With window 1 and `lat`, records each
 * round trip. Returns 0 or the first error. */
static int manta_run(manta_ctx *m, manta_actor *const *t, int nt, const char *buf, size_t size,
                     int window, double secs, samples *lat, uint64_t *count, double *elapsed)
{
    manta_future *fs[WINDOW];
    uint64_t c = 0;
    int rc = 0;
    double t0 = now_s(), t1;
    do {
        double c0 = lat ? now_s() : 0;
        for (int i = 0; i < window; i++) fs[i] = manta_call(m, t[i % nt], "echo", buf, size);
        for (int i = 0; i < window; i++) {
            const void *d;
            size_t n;
            int r = fs[i] ? manta_get(fs[i], -1, &d, &n) : MANTA_ENOMEM;
            if (r == 0 && n != size) r = MANTA_EPROTO;
            if (r && !rc) rc = r;
            manta_future_free(fs[i]);
        }
        t1 = now_s();
        if (lat && lat->n < MAX_SAMPLES) lat->v[lat->n++] = (t1 - c0) * 1e6;
        c += (uint64_t)window;
    } while (!rc && t1 - t0 < secs);
    *count = c;
    *elapsed = t1 - t0;
    return rc;
}

static int m_echo(manta_req *c, void *st, const void *arg, size_t len)
{
    return manta_reply(c, arg, len);
}

static int m_go(manta_req *c, void *st, const void *arg, size_t len)
{
    go_args a;
    if (len != sizeof a) return manta_reply_error(c, MANTA_EINVAL, "go: want a go_args");
    memcpy(&a, arg, sizeof a);
    if (a.ntargets < 1 || a.ntargets > NACT || a.window < 1 || a.window > WINDOW)
        return manta_reply_error(c, MANTA_EINVAL, "go: bad arguments");
    manta_ctx *m = manta_req_ctx(c);
    manta_actor *t[NACT];
    for (uint32_t i = 0; i < a.ntargets; i++) {
        a.targets[i][sizeof a.targets[i] - 1] = 0;
        int rc = manta_actor_lookup(m, a.targets[i], &t[i]);
        if (rc)
            return manta_reply_error(c, rc, "go: lookup %s: %s", a.targets[i], manta_last_error());
    }
    char *buf = malloc(a.size ? a.size : 1);
    if (!buf) return MANTA_ENOMEM;
    memset(buf, 'x', a.size);
    go_result r = {0};
    uint64_t n;
    double el;
    r.rc = manta_run(m, t, (int)a.ntargets, buf, a.size, (int)a.window, a.warm_s, NULL, &n, &el);
    if (!r.rc)
        r.rc = manta_run(m, t, (int)a.ntargets, buf, a.size, (int)a.window, a.run_s, NULL, &r.count,
                         &el);
    r.ns = (uint64_t)(el * 1e9);
    free(buf);
    return manta_reply(c, &r, sizeof r);
}

/* Put a fresh object of the asked size (uint64) and answer its id. */
static int m_blob(manta_req *c, void *st, const void *arg, size_t len)
{
    bench_state *s = st;
    manta_ctx *m = manta_req_ctx(c);
    uint64_t size;
    if (len != sizeof size) return manta_reply_error(c, MANTA_EINVAL, "blob: want a uint64");
    memcpy(&size, arg, sizeof size);
    if (s->have_blob) manta_obj_release(m, &s->blob), s->have_blob = 0;
    char *buf = malloc(size ? size : 1);
    if (!buf) return MANTA_ENOMEM;
    memset(buf, 0xab, size);
    int rc = manta_put(m, buf, size, &s->blob);
    free(buf);
    if (rc) return manta_reply_error(c, rc, "blob: put: %s", manta_last_error());
    s->have_blob = 1;
    return manta_reply(c, s->blob.s, strlen(s->blob.s));
}

static const manta_method methods[] = {
    {"echo", m_echo}, {"go", m_go}, {"blob", m_blob}, {NULL, NULL}};
static const manta_class bench_class = {"bench", sizeof(bench_state), NULL, NULL, methods};
static const manta_class *const classes[] = {&bench_class, NULL};

/* ---- raw libzmq: the helper processes ------------------------------------------------ */

static void raw_opts(void *s)
{
    int zero = 0;
    /* As the runtime's sockets: no high-water mark, no linger. */
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
}

/* Bind, then tell the parent the endpoint (tcp ports are chosen by the kernel). */
static void *raw_bind(void *ctx, int type, const char *ep)
{
    void *s = zmq_socket(ctx, type);
    raw_opts(s);
    if (zmq_bind(s, ep) != 0) {
        fprintf(stderr, "raw: bind %s: %s\n", ep, zmq_strerror(zmq_errno()));
        exit(1);
    }
    char last[256];
    size_t n = sizeof last;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, last, &n);
    printf("%s\n", last);
    fflush(stdout);
    return s;
}

/* Pipelined echo calls from DEALERs, round robin, like manta_run. */
static int raw_run(void *const *socks, int ns, const char *buf, size_t size, int window,
                   double secs, samples *lat, uint64_t *count, double *elapsed)
{
    uint64_t c = 0;
    double t0 = now_s(), t1;
    do {
        double c0 = lat ? now_s() : 0;
        for (int i = 0; i < window; i++)
            if (zmq_send(socks[i % ns], buf, size, 0) != (int)size) return MANTA_EZMQ;
        for (int i = 0; i < window; i++) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, socks[i % ns], 0) != (int)size) return MANTA_EZMQ;
            zmq_msg_close(&msg);
        }
        t1 = now_s();
        if (lat && lat->n < MAX_SAMPLES) lat->v[lat->n++] = (t1 - c0) * 1e6;
        c += (uint64_t)window;
    } while (t1 - t0 < secs);
    *count = c;
    *elapsed = t1 - t0;
    return 0;
}

static int raw_main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    void *ctx = zmq_ctx_new();
    const char *mode = argv[1];
    if (!strcmp(mode, "--raw-echo") && argc == 3) {
        void *s = raw_bind(ctx, ZMQ_ROUTER, argv[2]);
        for (;;) {
            zmq_msg_t route, body;
            zmq_msg_init(&route);
            zmq_msg_init(&body);
            if (zmq_msg_recv(&route, s, 0) < 0 || zmq_msg_recv(&body, s, 0) < 0) return 1;
            zmq_msg_send(&route, s, ZMQ_SNDMORE);
            zmq_msg_send(&body, s, 0);
        }
    }
    if (!strcmp(mode, "--raw-rep") && argc == 3) {
        void *s = raw_bind(ctx, ZMQ_REP, argv[2]);
        for (;;) {
            zmq_msg_t body;
            zmq_msg_init(&body);
            if (zmq_msg_recv(&body, s, 0) < 0) return 1;
            zmq_msg_send(&body, s, 0);
        }
    }
    if (!strcmp(mode, "--raw-blob") && argc == 4) {
        size_t size = strtoull(argv[3], NULL, 10);
        char *blob = malloc(size);
        if (!blob) return 1;
        memset(blob, 0xab, size);
        void *s = raw_bind(ctx, ZMQ_ROUTER, argv[2]);
        for (;;) {
            zmq_msg_t route, req, out;
            zmq_msg_init(&route);
            zmq_msg_init(&req);
            if (zmq_msg_recv(&route, s, 0) < 0 || zmq_msg_recv(&req, s, 0) < 0) return 1;
            zmq_msg_close(&req);
            zmq_msg_send(&route, s, ZMQ_SNDMORE);
            /* Zero copy, as the object server sends: the buffer outlives every send. */
            zmq_msg_init_data(&out, blob, size, NULL, NULL);
            zmq_msg_send(&out, s, 0);
        }
    }
    if (!strcmp(mode, "--raw-caller") && argc >= 7 && argc <= 6 + NACT) {
        size_t size = strtoull(argv[2], NULL, 10);
        int window = atoi(argv[3]);
        double warm = atof(argv[4]), run = atof(argv[5]);
        int ns = argc - 6;
        void *socks[NACT];
        for (int i = 0; i < ns; i++) {
            socks[i] = zmq_socket(ctx, ZMQ_DEALER);
            raw_opts(socks[i]);
            zmq_connect(socks[i], argv[6 + i]);
        }
        char *buf = malloc(size ? size : 1), go;
        if (!buf) return 1;
        memset(buf, 'x', size);
        printf("ready\n");
        fflush(stdout);
        if (read(0, &go, 1) != 1) return 1;
        uint64_t n = 0;
        double el = 0;
        int rc = raw_run(socks, ns, buf, size, window, warm, NULL, &n, &el);
        if (!rc) rc = raw_run(socks, ns, buf, size, window, run, NULL, &n, &el);
        printf("%" PRIu64 " %.9f %d\n", n, el, rc);
        fflush(stdout);
        _exit(0); /* no linger, no teardown: the parent reads and reaps */
    }
    fprintf(stderr, "bench_runtime: unknown helper mode %s\n", mode);
    return 2;
}

/* ---- raw libzmq: starting helpers from the driver ------------------------------------------ */

static char g_exe[512];

typedef struct helper {
    pid_t pid;
    int to, from;   /* its stdin and stdout */
    char line[256]; /* its first line: endpoint or "ready" */
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

/* Start `exe mode args...` with pipes on its stdin and stdout; wait for
 * its first line. */
static int helper_start(helper *h, const char *const *args)
{
    char *argv[16];
    int k = 0;
    argv[k++] = g_exe;
    for (; *args && k < 15; args++) argv[k++] = (char *)*args;
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
    if (read_line(h->from, h->line, sizeof h->line, 10000) != 0) {
        fprintf(stderr, "bench_runtime: helper %s did not start\n", argv[1]);
        helper_stop(h);
        return -1;
    }
    return 0;
}

/* ---- the driver ---------------------------------------------------------------------------- */

typedef struct bench {
    manta_ctx *m;
    const char *tr;   /* "ipc" or "tcp" */
    const char *only; /* run only figures whose name contains this */
    double warm_s, run_s;
    manta_actor *echo[NACT], *callers[NACT];
    helper raw_echo[NACT], raw_rep, raw_blob;
    void *zctx;
} bench;

/* The machine is shared and small: each figure alternates Manta and its
 * baseline in ROUNDS slices of run_s and keeps the best slice of each, so a
 * burst of someone else's work hits both sides alike and rarely both. */
#define ROUNDS 3

static int wanted(const bench *b, const char *name)
{
    return !b->only || strstr(name, b->only);
}

static const char *size_name(size_t size)
{
    return size == 64 ? "64B" : size == 4096 ? "4KiB" : "?";
}

enum { P_SYNC, P_PIPE, P_ONE_N, P_N_N };
static const char *pattern_name[] = {"1to1_sync", "1to1_pipelined", "1toN", "NtoN"};

static double maxd(double a, double b)
{
    return a > b ? a : b;
}

/* N:N, Manta: every caller actor pipelines over all echo actors at once. */
static int nn_manta(bench *b, size_t size, double warm, double run, double *rate)
{
    go_args a = {.size = (uint32_t)size, .window = WINDOW, .ntargets = NACT};
    a.warm_s = warm, a.run_s = run;
    for (int i = 0; i < NACT; i++) snprintf(a.targets[i], sizeof a.targets[i], "e%d", i);
    manta_future *fs[NACT];
    for (int i = 0; i < NACT; i++) fs[i] = manta_call(b->m, b->callers[i], "go", &a, sizeof a);
    int rc = 0;
    *rate = 0;
    for (int i = 0; i < NACT; i++) {
        const void *d;
        size_t n;
        go_result r;
        int g = fs[i] ? manta_get(fs[i], -1, &d, &n) : MANTA_ENOMEM;
        if (g == 0 && n == sizeof r) {
            memcpy(&r, d, sizeof r);
            /* Callers run concurrently for the same time: rates add up. */
            if (r.rc)
                g = r.rc;
            else
                *rate += (double)r.count / ((double)r.ns * 1e-9);
        } else if (g == 0) {
            g = MANTA_EPROTO;
        }
        if (g && !rc) rc = g;
        manta_future_free(fs[i]);
    }
    return rc;
}

/* N:N, raw: as many caller processes, each with a DEALER per echo server. */
static int nn_raw(bench *b, size_t size, double warm, double run, double *rate)
{
    char sz[32], win[32], ws[32], rs[32];
    snprintf(sz, sizeof sz, "%zu", size);
    snprintf(win, sizeof win, "%d", WINDOW);
    snprintf(ws, sizeof ws, "%g", warm);
    snprintf(rs, sizeof rs, "%g", run);
    const char *args[8 + NACT] = {"--raw-caller", sz, win, ws, rs};
    for (int i = 0; i < NACT; i++) args[5 + i] = b->raw_echo[i].line;
    helper h[NACT] = {0};
    int rc = 0;
    for (int i = 0; i < NACT && !rc; i++)
        if (helper_start(&h[i], args)) rc = MANTA_ESPAWN;
    for (int i = 0; i < NACT && !rc; i++)
        if (write(h[i].to, "g", 1) != 1) rc = MANTA_ESYS;
    *rate = 0;
    for (int i = 0; i < NACT && !rc; i++) {
        char line[128];
        uint64_t n;
        double el;
        int r;
        if (read_line(h[i].from, line, sizeof line, 60000) ||
            sscanf(line, "%" SCNu64 " %lf %d", &n, &el, &r) != 3 || r)
            rc = MANTA_EZMQ;
        else
            *rate += (double)n / el;
    }
    for (int i = 0; i < NACT; i++) helper_stop(&h[i]);
    return rc;
}

static void calls(bench *b, int pattern, size_t size)
{
    char name[128];
    snprintf(name, sizeof name, "calls_%s_%s_%s", pattern_name[pattern], b->tr, size_name(size));
    if (!wanted(b, name)) return;
    fprintf(stderr, "bench_runtime: %s\n", name);
    char *buf = malloc(size);
    memset(buf, 'x', size);
    double mbest = 0, rbest = 0, slice = b->run_s / ROUNDS, rate;
    int rc = 0;
    if (pattern == P_N_N) {
        /* Each round warms up again (briefly): the callers start afresh. */
        for (int r = 0; r < ROUNDS && !rc; r++) {
            double warm = r ? b->warm_s / 4 : b->warm_s;
            rc = nn_manta(b, size, warm, slice, &rate);
            mbest = maxd(mbest, rate);
            if (!rc) rc = nn_raw(b, size, warm, slice, &rate);
            rbest = maxd(rbest, rate);
        }
    } else {
        int nt = pattern == P_ONE_N ? NACT : 1, window = pattern == P_SYNC ? 1 : WINDOW;
        void *socks[NACT];
        for (int i = 0; i < nt; i++) {
            socks[i] = zmq_socket(b->zctx, ZMQ_DEALER);
            raw_opts(socks[i]);
            zmq_connect(socks[i], b->raw_echo[i].line);
        }
        uint64_t n;
        double el;
        rc = manta_run(b->m, b->echo, nt, buf, size, window, b->warm_s, NULL, &n, &el);
        if (!rc) rc = raw_run(socks, nt, buf, size, window, b->warm_s, NULL, &n, &el);
        for (int r = 0; r < ROUNDS && !rc; r++) {
            rc = manta_run(b->m, b->echo, nt, buf, size, window, slice, NULL, &n, &el);
            mbest = maxd(mbest, (double)n / el);
            if (!rc) rc = raw_run(socks, nt, buf, size, window, slice, NULL, &n, &el);
            rbest = maxd(rbest, (double)n / el);
        }
        for (int i = 0; i < nt; i++) zmq_close(socks[i]);
    }
    free(buf);
    if (rc) {
        fail(name, rc);
        return;
    }
    emit(name, mbest, "calls/s", rbest);
}

/* Raw REQ/REP round trips for `secs`, each into `lat`. */
static int reqrep_run(void *s, double secs, samples *lat)
{
    char buf[64];
    memset(buf, 'x', sizeof buf);
    double t0 = now_s(), t1;
    do {
        double c0 = now_s();
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        int ok = zmq_send(s, buf, sizeof buf, 0) == (int)sizeof buf &&
                 zmq_msg_recv(&msg, s, 0) == (int)sizeof buf;
        zmq_msg_close(&msg);
        if (!ok) return MANTA_EZMQ;
        t1 = now_s();
        if (lat && lat->n < MAX_SAMPLES) lat->v[lat->n++] = (t1 - c0) * 1e6;
    } while (t1 - t0 < secs);
    return 0;
}

/* Round-trip latency of 64 B sync calls against raw REQ/REP; the samples of
 * all rounds are pooled on each side. */
static void latency(bench *b)
{
    char p50[128], p99[128];
    snprintf(p50, sizeof p50, "call_rtt_p50_%s_64B_lower_better", b->tr);
    snprintf(p99, sizeof p99, "call_rtt_p99_%s_64B_lower_better", b->tr);
    if (!wanted(b, p50) && !wanted(b, p99)) return;
    fprintf(stderr, "bench_runtime: %s\n", p50);
    samples ml = {malloc(MAX_SAMPLES * sizeof(double)), 0};
    samples rl = {malloc(MAX_SAMPLES * sizeof(double)), 0};
    void *s = zmq_socket(b->zctx, ZMQ_REQ);
    raw_opts(s);
    zmq_connect(s, b->raw_rep.line);
    char buf[64];
    memset(buf, 'x', sizeof buf);
    uint64_t n;
    double el, slice = b->run_s / ROUNDS;
    int rc = manta_run(b->m, b->echo, 1, buf, sizeof buf, 1, b->warm_s, NULL, &n, &el);
    if (!rc) rc = reqrep_run(s, b->warm_s, NULL);
    for (int r = 0; r < ROUNDS && !rc; r++) {
        rc = manta_run(b->m, b->echo, 1, buf, sizeof buf, 1, slice, &ml, &n, &el);
        if (!rc) rc = reqrep_run(s, slice, &rl);
    }
    zmq_close(s);
    if (rc) {
        fail(p50, rc);
    } else {
        emit(p50, percentile(&ml, 0.5), "us", percentile(&rl, 0.5));
        emit(p99, percentile(&ml, 0.99), "us", percentile(&rl, 0.99));
    }
    free(ml.v);
    free(rl.v);
}

/* manta_obj_fetch of a large object for `secs` (at least 3 fetches):
 * bytes/s. The fetch reads the object in place from the received frame, as
 * the raw baseline does (manta_obj_get adds a copy into a malloc'd buffer). */
static int large_manta(bench *b, const manta_obj_id *id, double secs, double *bw)
{
    double t0 = now_s(), t1;
    uint64_t bytes = 0;
    int k = 0, rc = 0;
    do {
        const void *data;
        size_t len = 0;
        manta_future *f = manta_obj_fetch(b->m, id, 10000);
        rc = manta_get(f, 10000, &data, &len);
        if (rc == 0 && len != LARGE_BYTES) rc = MANTA_EPROTO;
        manta_future_free(f);
        bytes += len;
        t1 = now_s();
    } while (!rc && (++k < 3 || t1 - t0 < secs));
    *bw = (double)bytes / (t1 - t0);
    return rc;
}

/* The same from the raw blob server: ask, receive one 16 MiB frame. */
static int large_raw(void *s, double secs, double *bw)
{
    double t0 = now_s(), t1;
    uint64_t bytes = 0;
    int k = 0;
    do {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        int got = -1;
        if (zmq_send(s, "get", 3, 0) == 3) got = zmq_msg_recv(&msg, s, 0);
        zmq_msg_close(&msg);
        if (got != (int)LARGE_BYTES) return MANTA_EZMQ;
        bytes += LARGE_BYTES;
        t1 = now_s();
    } while (++k < 3 || t1 - t0 < secs);
    *bw = (double)bytes / (t1 - t0);
    return 0;
}

/* 16 MiB: an actor puts it, the driver fetches it (bytes/s of manta_obj_get)
 * against a DEALER fetching 16 MiB from the raw blob server. */
static void large(bench *b)
{
    char name[128];
    snprintf(name, sizeof name, "large_object_fetch_%s_16MiB", b->tr);
    if (!wanted(b, name)) return;
    fprintf(stderr, "bench_runtime: %s\n", name);
    uint64_t size = LARGE_BYTES;
    manta_future *f = manta_call(b->m, b->echo[0], "blob", &size, sizeof size);
    const void *d;
    size_t n;
    int rc = f ? manta_get(f, -1, &d, &n) : MANTA_ENOMEM;
    manta_obj_id id;
    memset(&id, 0, sizeof id);
    if (rc == 0) memcpy(id.s, d, n < sizeof id.s - 1 ? n : sizeof id.s - 1);
    manta_future_free(f);
    if (rc) {
        fail("large: blob put by actor", rc);
        return;
    }
    void *s = zmq_socket(b->zctx, ZMQ_DEALER);
    raw_opts(s);
    zmq_connect(s, b->raw_blob.line);
    double mbest = 0, rbest = 0, bw, slice = b->run_s / ROUNDS;
    rc = large_manta(b, &id, b->warm_s, &bw);
    if (!rc) rc = large_raw(s, b->warm_s, &bw);
    for (int r = 0; r < ROUNDS && !rc; r++) {
        rc = large_manta(b, &id, slice, &bw);
        mbest = maxd(mbest, bw);
        if (!rc) rc = large_raw(s, slice, &bw);
        rbest = maxd(rbest, bw);
    }
    zmq_close(s);
    manta_obj_release(b->m, &id);
    if (rc) {
        fail(name, rc);
        return;
    }
    emit(name, mbest / 1e6, "MB/s", rbest / 1e6);
}

/* ---- small objects against raw Redis ------------------------------------------------------ */

/* A Redis URL (manta_redis_url_parse) -> a connected, authenticated hiredis client. */
static redisContext *redis_connect_url(const char *url)
{
    manta_redis_addr a;
    if (manta_redis_url_parse(url, &a, NULL, 0) != 0) {
        fprintf(stderr, "bench_runtime: %s\n", manta_last_error());
        return NULL;
    }
    redisContext *c = redisConnect(a.host, a.port);
    if (!c || c->err) {
        fprintf(stderr, "bench_runtime: redis %s:%d: %s\n", a.host, a.port, c ? c->errstr : "oom");
        redisFree(c);
        return NULL;
    }
    if (a.password[0]) {
        redisReply *r = a.user[0] ? redisCommand(c, "AUTH %s %s", a.user, a.password)
                                  : redisCommand(c, "AUTH %s", a.password);
        int ok = r && r->type != REDIS_REPLY_ERROR;
        freeReplyObject(r);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

/* One object benchmark step, Manta or Redis, for `secs`: ops/s. */
typedef struct objrun {
    bench *b;
    redisContext *rc;
    const char *buf;
    size_t size;
    manta_obj_id one; /* the object read again and again by "get" */
    uint64_t nkeys;   /* raw keys made by SET, deleted at the end */
} objrun;

enum { O_MANTA_PUTGET, O_RAW_PUTGET, O_MANTA_GET, O_RAW_GET };

static int obj_step(objrun *o, int what, double secs, double *rate)
{
    double t0 = now_s(), t1;
    uint64_t k = 0;
    int rc = 0;
    do {
        void *data = NULL;
        size_t len = o->size;
        redisReply *r = NULL;
        char key[64];
        manta_obj_id id;
        switch (what) {
        case O_MANTA_PUTGET: /* a fresh object each time, left to the job's end */
            rc = manta_put(o->b->m, o->buf, o->size, &id);
            if (!rc) rc = manta_obj_get(o->b->m, &id, &data, &len, 5000);
            break;
        case O_MANTA_GET:
            rc = manta_obj_get(o->b->m, &o->one, &data, &len, 5000);
            break;
        case O_RAW_PUTGET:
            snprintf(key, sizeof key, "bench-raw:%" PRIu64, o->nkeys++);
            r = redisCommand(o->rc, "SET %s %b", key, o->buf, o->size);
            if (!r || r->type == REDIS_REPLY_ERROR) rc = MANTA_EREDIS;
            freeReplyObject(r);
            r = rc ? NULL : redisCommand(o->rc, "GET %s", key);
            break;
        case O_RAW_GET:
            r = redisCommand(o->rc, "GET %s", "bench-raw:0");
            break;
        }
        if (what == O_RAW_PUTGET || what == O_RAW_GET) {
            if (!rc && (!r || r->type != REDIS_REPLY_STRING || (size_t)r->len != o->size))
                rc = MANTA_EREDIS;
            freeReplyObject(r);
        } else if (!rc && len != o->size) {
            rc = MANTA_EPROTO;
        }
        free(data);
        k++;
        t1 = now_s();
    } while (!rc && t1 - t0 < secs);
    *rate = (double)k / (t1 - t0);
    return rc;
}

static void objects(bench *b, size_t size)
{
    char pg[128], g[128];
    snprintf(pg, sizeof pg, "objects_put_get_%s", size_name(size));
    snprintf(g, sizeof g, "objects_get_%s", size_name(size));
    if (!wanted(b, pg) && !wanted(b, g)) return;
    fprintf(stderr, "bench_runtime: %s, %s\n", pg, g);
    char *buf = malloc(size);
    memset(buf, 'o', size);
    objrun o = {.b = b, .buf = buf, .size = size};
    o.rc = redis_connect_url(manta_redis_url(b->m));
    if (!o.rc) {
        free(buf);
        fail("objects: connect to redis", MANTA_EREDIS);
        return;
    }
    double best[4] = {0}, rate, slice = b->run_s / ROUNDS;
    int rc = manta_put(b->m, buf, size, &o.one);
    /* Warm each, then alternate: put+get pairs, then gets. */
    for (int w = 0; w < 4 && !rc; w++) rc = obj_step(&o, w, b->warm_s, &rate);
    for (int pair = 0; pair < 2; pair++) {
        for (int r = 0; r < ROUNDS && !rc; r++) {
            for (int side = 0; side < 2 && !rc; side++) {
                int what = pair * 2 + side;
                rc = obj_step(&o, what, slice, &rate);
                best[what] = maxd(best[what], rate);
            }
        }
    }
    /* Delete the raw keys (pipelined, untimed). */
    for (uint64_t i = 0; i < o.nkeys; i++) redisAppendCommand(o.rc, "UNLINK bench-raw:%" PRIu64, i);
    for (uint64_t i = 0; i < o.nkeys; i++) {
        void *r = NULL;
        if (redisGetReply(o.rc, &r) != REDIS_OK) break;
        freeReplyObject(r);
    }
    redisFree(o.rc);
    free(buf);
    if (rc) {
        fail(pg, rc);
        return;
    }
    emit(pg, best[O_MANTA_PUTGET], "put+get/s", best[O_RAW_PUTGET]);
    emit(g, best[O_MANTA_GET], "get/s", best[O_RAW_GET]);
}

/* ---- one transport -------------------------------------------------------------------------- */

static int raw_servers_start(bench *b, const char *tmpdir)
{
    char ep[256], sz[32];
    for (int i = 0; i <= NACT + 1; i++) {
        if (!strcmp(b->tr, "tcp"))
            snprintf(ep, sizeof ep, "tcp://127.0.0.1:*");
        else
            snprintf(ep, sizeof ep, "ipc://%s/raw%d", tmpdir, i);
        snprintf(sz, sizeof sz, "%u", LARGE_BYTES);
        const char *echo[] = {"--raw-echo", ep, NULL}, *rep[] = {"--raw-rep", ep, NULL},
                   *blob[] = {"--raw-blob", ep, sz, NULL};
        helper *h = i < NACT ? &b->raw_echo[i] : i == NACT ? &b->raw_rep : &b->raw_blob;
        if (helper_start(h, i < NACT ? echo : i == NACT ? rep : blob)) return MANTA_ESPAWN;
    }
    return 0;
}

static void raw_servers_stop(bench *b)
{
    for (int i = 0; i < NACT; i++) helper_stop(&b->raw_echo[i]);
    helper_stop(&b->raw_rep);
    helper_stop(&b->raw_blob);
}

static int actors_start(bench *b)
{
    char name[16];
    for (int i = 0; i < 2 * NACT; i++) {
        snprintf(name, sizeof name, "%c%d", i < NACT ? 'e' : 'c', i % NACT);
        manta_actor_options o = {.cls = "bench", .name = name, .no_wait = 1};
        int rc = manta_actor_create(b->m, &o, i < NACT ? &b->echo[i] : &b->callers[i - NACT]);
        if (rc) return rc;
    }
    for (int i = 0; i < 2 * NACT; i++) {
        int rc = manta_actor_wait_ready(b->m, i < NACT ? b->echo[i] : b->callers[i - NACT], 30000);
        if (rc) return rc;
    }
    return 0;
}

static void suite(bench *b, const char *tmpdir, int with_objects)
{
    int rc = actors_start(b);
    if (rc) {
        fail("start actors", rc);
        return;
    }
    if (raw_servers_start(b, tmpdir)) {
        raw_servers_stop(b);
        {
            fail("start raw servers", MANTA_ESPAWN);
            return;
        }
    }
    static const size_t sizes[] = {64, 4096};
    for (int s = 0; s < 2; s++)
        for (int p = P_SYNC; p <= P_N_N; p++) calls(b, p, sizes[s]);
    latency(b);
    large(b);
    if (with_objects)
        for (int s = 0; s < 2; s++) objects(b, sizes[s]);
    raw_servers_stop(b);
}

static void describe_machine(int quick)
{
    char model[256] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) snprintf(model, sizeof model, "%s", c + 2);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    }
    if (f) fclose(f);
    struct utsname u;
    uname(&u);
    int maj, min, pat;
    zmq_version(&maj, &min, &pat);
    fprintf(stderr,
            "bench_runtime: nproc %ld, cpu \"%s\", %s %s, libzmq %d.%d.%d, hiredis %d.%d.%d, "
            "%s run\n",
            sysconf(_SC_NPROCESSORS_ONLN), model, u.sysname, u.release, maj, min, pat,
            HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH, quick ? "quick" : "full");
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strncmp(argv[1], "--raw-", 6)) return raw_main(argc, argv);
    manta_ctx *m;
    /* First thing: in an actor process this runs the actor and never returns. */
    if (manta_init(&m, &(manta_options){.classes = classes, .transport = "ipc"}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    int quick = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--quick] [--only NAME-SUBSTRING]\n", argv[0]);
            manta_shutdown(m);
            return 2;
        }
    }
    ssize_t n = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
    if (n <= 0) {
        manta_shutdown(m);
        return 1;
    }
    g_exe[n] = 0;
    describe_machine(quick);
    char tmpdir[] = "/tmp/manta-bench-XXXXXX";
    if (!mkdtemp(tmpdir)) {
        manta_shutdown(m);
        return 1;
    }
    bench b = {.warm_s = quick ? 0.05 : 0.25, .run_s = quick ? 0.3 : 1.5, .only = only};
    b.zctx = zmq_ctx_new();
    static const char *transports[] = {"ipc", "tcp"};
    for (int t = 0; t < 2; t++) {
        if (t > 0 &&
            manta_init(&m, &(manta_options){.classes = classes, .transport = transports[t]}) != 0) {
            fail("manta_init (tcp)", MANTA_ESPAWN);
            break;
        }
        b.m = m, b.tr = transports[t];
        suite(&b, tmpdir, t == 0);
        manta_shutdown(m);
    }
    zmq_ctx_term(b.zctx);
    for (int i = 0; i <= NACT + 1; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s/raw%d", tmpdir, i);
        unlink(p);
    }
    rmdir(tmpdir);
    return g_failures ? 1 : 0;
}
