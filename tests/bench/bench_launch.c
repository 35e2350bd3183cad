/* Run: ./build/tests/bench/bench_launch [--quick] [--reps N] [--no-cli] > figures.jsonl
 *
 * bench_launch -- how long Manta takes to launch actors and make them ready,
 * against bare processes launched the same way in the same run (issue 4,
 * section 6). Each figure is one JSON line on stdout:
 *
 *     {"name":..., "value":..., "unit":..., "baseline":..., "ratio":...}
 *
 * with ratio = value / baseline; every figure here is a time, so lower is
 * better and the names end in "_lower_better". stderr gets the machine, the
 * phases of each launch (where the time goes) and errors.
 *
 * What runs against what:
 *   launch_N   a fresh job (manta_init: embedded Redis, local node agent;
 *              not timed), then, timed: manta_actor_create of N "pinger"
 *              actors with no_wait, manta_actor_wait_ready on each, one
 *              "ping" call to each and manta_wait for all answers. Reported
 *              per actor. N = 1, 8, 32, 64.
 *   scale      a fresh job with 4 pingers ready and answering, then, timed:
 *              28 more the same way (4 -> 32), per new actor.
 *   baseline   N bare processes: fork+exec of this program with "--bare
 *              ENDPOINT"; each connects a ZeroMQ DEALER to the bench's
 *              ROUTER, says "ready", answers one "ping" and waits for
 *              "quit". Timed from the first fork until the N-th answer.
 *   cli_*      (if the `manta` CLI and the user_class example are built
 *              next to this program, and not --no-cli) the wall time of
 *              `manta run --detach user_service.yaml` (4 squarers + 1
 *              summer: Redis, node agent, spec, 5 actors) against 5 bare
 *              processes, and of `manta scale squarer 32` against 28.
 *
 * Each measurement is repeated (--reps, default 5, the CLI at most 3; bare and Manta
 * interleaved) and the median reported. The bare processes and the actors
 * are this same program started again: a --bare first argument dispatches
 * before manta_init(), and an actor process is started with no arguments,
 * so it never takes that branch.
 */
#include <manta.h>

#include <zmq.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ACTORS   64
#define MAX_REPS     15
#define SCALE_FROM   4
#define SCALE_TO     32
#define WAIT_MS      60000 /* readiness and answers; far above what a launch takes */
#define CLI_REPLICAS 4     /* squarers at `manta run`; the spec adds 1 summer */

/* ---- clocks and output ---------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* CPU time of this process and every reaped descendant (the node agent
 * reaps its actors, and we reap the agent and redis-server at shutdown). */
static double cpu_ms(void)
{
    struct rusage s, c;
    getrusage(RUSAGE_SELF, &s);
    getrusage(RUSAGE_CHILDREN, &c);
    return (double)(s.ru_utime.tv_sec + s.ru_stime.tv_sec + c.ru_utime.tv_sec + c.ru_stime.tv_sec) *
               1e3 +
           (double)(s.ru_utime.tv_usec + s.ru_stime.tv_usec + c.ru_utime.tv_usec +
                    c.ru_stime.tv_usec) *
               1e-3;
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
    fprintf(stderr, "bench_launch: %s: %s (%s)\n", what, manta_strerror(rc), manta_last_error());
    g_failures++;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of n values (sorts them); 0 if none. */
static double median(double *v, int n)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static char g_exe[PATH_MAX]; /* this program, for the bare processes */
static char g_tmp[64];       /* private folder: the bare endpoint, CLI state and logs */

/* ---- the bare process ---------------------------------------------------------- */

/* What a bare process does: the least an actor must do to be reachable and
 * answer once. The 30 s poll limit keeps an orphan from living forever. */
static int bare_main(const char *endpoint)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    void *z = zmq_ctx_new();
    void *s = zmq_socket(z, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(s, endpoint) != 0 || zmq_send(s, "ready", 5, 0) != 5) return 1;
    for (;;) {
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 30000) <= 0) break;
        char buf[16];
        int n = zmq_recv(s, buf, sizeof buf, 0);
        if (n == 4 && !memcmp(buf, "ping", 4)) zmq_send(s, "pong", 4, 0);
        if (n == 4 && !memcmp(buf, "quit", 4)) break;
    }
    zmq_close(s);
    zmq_ctx_term(z);
    return 0;
}

/* Phases of one launch, in ms for all n together. */
typedef struct phases {
    double spawn; /* manta: the create calls; bare: the fork+exec loop */
    double ready; /* manta: wait_ready on all; bare: until all said "ready" */
    double call;  /* manta: one call to each, answered; bare: ping -> pong */
    double total;
} phases;

/* Launch n bare processes, each answering one ping. Returns 0 and fills ph,
 * or -1. The processes are told to quit and reaped before returning. */
static int bare_launch(int n, phases *ph)
{
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/bare", g_tmp);
    void *z = zmq_ctx_new();
    void *r = zmq_socket(z, ZMQ_ROUTER);
    int zero = 0, rc = -1;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(r, ep) != 0) {
        fprintf(stderr, "bench_launch: bind %s: %s\n", ep, zmq_strerror(zmq_errno()));
        zmq_close(r);
        zmq_ctx_term(z);
        g_failures++;
        return -1;
    }
    pid_t pids[MAX_ACTORS];
    unsigned char ids[MAX_ACTORS][256];
    size_t idlen[MAX_ACTORS];
    int started = 0, ready = 0, answered = 0;
    double t0 = now_ms(), t_ready = 0;
    for (; started < n; started++) {
        char *argv[] = {g_exe, "--bare", ep, NULL};
        pid_t pid = fork();
        if (pid < 0) break;
        if (pid == 0) {
            execv(g_exe, argv);
            _exit(127);
        }
        pids[started] = pid;
    }
    double t_spawn = now_ms();
    while (started == n && answered < n && now_ms() - t0 < WAIT_MS) {
        zmq_pollitem_t it = {r, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0) continue;
        unsigned char id[256], body[16];
        int il = zmq_recv(r, id, sizeof id, 0);
        int bl = zmq_recv(r, body, sizeof body, 0);
        if (il <= 0 || bl < 0) continue;
        if (bl == 5 && !memcmp(body, "ready", 5) && ready < n) {
            memcpy(ids[ready], id, (size_t)il);
            idlen[ready++] = (size_t)il;
            if (ready == n) t_ready = now_ms();
            zmq_send(r, id, (size_t)il, ZMQ_SNDMORE);
            zmq_send(r, "ping", 4, 0);
        } else if (bl == 4 && !memcmp(body, "pong", 4)) {
            answered++;
        }
    }
    double t_done = now_ms();
    if (answered == n) {
        ph->spawn = t_spawn - t0;
        ph->ready = t_ready - t_spawn;
        ph->call = t_done - t_ready;
        ph->total = t_done - t0;
        rc = 0;
    } else {
        fprintf(stderr, "bench_launch: bare x%d: %d started, %d ready, %d answered\n", n, started,
                ready, answered);
        g_failures++;
    }
    for (int i = 0; i < ready; i++) {
        zmq_send(r, ids[i], idlen[i], ZMQ_SNDMORE);
        zmq_send(r, "quit", 4, 0);
    }
    for (int i = 0; i < started; i++) {
        /* Those that never said ready (on failure) are killed. */
        int st;
        double until = now_ms() + 2000;
        while (waitpid(pids[i], &st, WNOHANG) == 0) {
            if (now_ms() > until) {
                kill(pids[i], SIGKILL);
                waitpid(pids[i], &st, 0);
                break;
            }
            usleep(1000);
        }
    }
    zmq_close(r);
    zmq_ctx_term(z);
    unlink(ep + 6); /* the ipc file, past "ipc://" */
    return rc;
}

/* ---- the actor side ---------------------------------------------------------- */

static int ping(manta_req *call, void *state, const void *arg, size_t len)
{
    return manta_reply(call, "pong", 4);
}

static const manta_method methods[] = {{"ping", ping}, {NULL, NULL}};
static const manta_class pinger = {"pinger", 0, NULL, NULL, methods};
static const manta_class *const classes[] = {&pinger, NULL};

static int new_job(manta_ctx **m)
{
    manta_options o = {.classes = classes};
    int rc = manta_init(m, &o);
    if (rc) fail("manta_init", rc);
    return rc;
}

/* Create actors [from, to) with no_wait, wait until each is ready, call
 * each once and wait for every answer. Fills ph (ms for all of them). */
static int launch(manta_ctx *m, manta_actor **a, int from, int to, phases *ph)
{
    manta_future *fs[MAX_ACTORS];
    int n = to - from, rc = 0;
    double t0 = now_ms();
    for (int i = from; i < to; i++) {
        char name[32];
        snprintf(name, sizeof name, "pinger-%d", i);
        manta_actor_options o = {.cls = "pinger", .name = name, .no_wait = 1};
        if ((rc = manta_actor_create(m, &o, &a[i])) != 0) return fail("create", rc), rc;
    }
    double t1 = now_ms();
    for (int i = from; i < to; i++) {
        if ((rc = manta_actor_wait_ready(m, a[i], WAIT_MS)) != 0) {
            fail("wait_ready", rc);
            manta_actor_info info;
            if (manta_actor_info_get(m, a[i], &info) == 0)
                fprintf(stderr, "bench_launch: %s: state %s pid %d incarnation %d endpoint %s\n",
                        manta_actor_name(a[i]), manta_actor_state_name(info.state), info.pid,
                        info.incarnation, info.endpoint);
            return rc;
        }
    }
    double t2 = now_ms();
    for (int i = from; i < to; i++) fs[i - from] = manta_call(m, a[i], "ping", NULL, 0);
    manta_wait(fs, (size_t)n, (size_t)n, WAIT_MS);
    double t3 = now_ms();
    for (int i = 0; i < n; i++) {
        int st = manta_future_status(fs[i]);
        if (st && !rc) fail("ping", rc = st);
        manta_future_free(fs[i]);
    }
    *ph = (phases){t1 - t0, t2 - t1, t3 - t2, t3 - t0};
    return rc;
}

/* Same, but without wait_ready: call at once (calls queue until ready). */
static int launch_calls_only(manta_ctx *m, manta_actor **a, int n, phases *ph)
{
    manta_future *fs[MAX_ACTORS];
    int rc = 0;
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "pinger-%d", i);
        manta_actor_options o = {.cls = "pinger", .name = name, .no_wait = 1};
        if ((rc = manta_actor_create(m, &o, &a[i])) != 0) return fail("create", rc), rc;
        fs[i] = manta_call(m, a[i], "ping", NULL, 0);
    }
    double t1 = now_ms();
    manta_wait(fs, (size_t)n, (size_t)n, WAIT_MS);
    double t2 = now_ms();
    for (int i = 0; i < n; i++) {
        int st = manta_future_status(fs[i]);
        if (st && !rc) fail("ping (calls only)", rc = st);
        manta_future_free(fs[i]);
    }
    *ph = (phases){t1 - t0, 0, t2 - t1, t2 - t0};
    return rc;
}

/* ---- the CLI ---------------------------------------------------------------------- */

/* Run argv with stdout sent to stderr (stdout carries only JSON); the exit
 * code, or -1. */
static int run_cmd(char *const argv[])
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(2, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* One `manta run --detach` (4 squarers + 1 summer), `manta scale squarer
 * 32`, `manta stop`. Fills run_ms and scale_ms (wall time of each command). */
static int cli_round(const char *manta, const char *spec, int rep, double *run_ms, double *scale_ms)
{
    char job[64], setjob[80], setrep[64], to[16];
    snprintf(job, sizeof job, "bench-launch-%d-%d", (int)getpid(), rep);
    snprintf(setjob, sizeof setjob, "job=%s", job);
    snprintf(setrep, sizeof setrep, "squarer.replicas=%d", CLI_REPLICAS);
    snprintf(to, sizeof to, "%d", SCALE_TO);
    /* Tiny cpu demand, so 32 squarers fit a 2-core node. */
    char *run[] = {(char *)manta, "run",        "--detach", "--log-dir",
                   g_tmp,         (char *)spec, "--set",    setjob,
                   "--set",       setrep,       "--set",    "squarer.resources.cpu=0.01",
                   NULL};
    char *scale[] = {(char *)manta, "scale", "squarer", to, "--job", job, NULL};
    char *stop[] = {(char *)manta, "stop", "--job", job, NULL};
    double t0 = now_ms();
    int rc = run_cmd(run);
    double t1 = now_ms();
    if (rc != 0) {
        fprintf(stderr, "bench_launch: `manta run --detach` exited %d\n", rc);
        g_failures++;
        return -1;
    }
    rc = run_cmd(scale);
    double t2 = now_ms();
    if (rc != 0) {
        fprintf(stderr, "bench_launch: `manta scale` exited %d\n", rc);
        g_failures++;
    }
    if (run_cmd(stop) != 0) {
        fprintf(stderr, "bench_launch: `manta stop --job %s` failed\n", job);
        g_failures++;
        return -1;
    }
    *run_ms = t1 - t0;
    *scale_ms = t2 - t1;
    return rc ? -1 : 0;
}

/* ---- main --------------------------------------------------------------------------- */

static void print_phases(const char *what, int n, const phases *ph)
{
    fprintf(stderr,
            "  %-22s n=%-2d total %7.1f ms (%6.2f ms/actor): spawn %7.1f  ready %7.1f  "
            "first call %6.1f\n",
            what, n, ph->total, ph->total / n, ph->spawn, ph->ready, ph->call);
}

/* Per-phase medians of reps runs (each phase's own median). */
static phases median_phases(phases *p, int reps)
{
    double v[4][MAX_REPS];
    for (int i = 0; i < reps; i++)
        v[0][i] = p[i].spawn, v[1][i] = p[i].ready, v[2][i] = p[i].call, v[3][i] = p[i].total;
    return (phases){median(v[0], reps), median(v[1], reps), median(v[2], reps), median(v[3], reps)};
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--bare")) return bare_main(argv[2]);
    int reps = 5, no_cli = 0;
    const char *manta_path = NULL, *spec_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            reps = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-cli"))
            no_cli = 1;
        else if (!strcmp(argv[i], "--manta") && i + 1 < argc)
            manta_path = argv[++i];
        else if (!strcmp(argv[i], "--spec") && i + 1 < argc)
            spec_path = argv[++i];
        else {
            fprintf(stderr, "usage: bench_launch [--quick] [--reps N] [--no-cli] [--manta PATH] "
                            "[--spec PATH]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (reps > MAX_REPS) reps = MAX_REPS;

    /* First thing: in an actor process manta_init() runs the actor and
     * never returns. In the driver this first job is the warm-up. */
    manta_ctx *m;
    if (new_job(&m) != 0) return 1;

    ssize_t el = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
    if (el <= 0) {
        fprintf(stderr, "bench_launch: readlink /proc/self/exe: %s\n", strerror(errno));
        manta_shutdown(m);
        return 1;
    }
    g_exe[el] = 0;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/bench-launch-XXXXXX");
    if (!mkdtemp(g_tmp)) {
        fprintf(stderr, "bench_launch: mkdtemp: %s\n", strerror(errno));
        manta_shutdown(m);
        return 1;
    }
    struct utsname u;
    uname(&u);
    fprintf(stderr, "bench_launch: %s %s, %ld cpus, %d reps, medians\n", u.sysname, u.machine,
            sysconf(_SC_NPROCESSORS_ONLN), reps);

    /* Warm-up: page cache for this program, libzmq and redis-server. */
    manta_actor *a[MAX_ACTORS];
    phases ph, bp;
    launch(m, a, 0, SCALE_FROM, &ph);
    manta_shutdown(m);
    bare_launch(SCALE_FROM, &bp);

    /* CPU of an empty job (manta_init + manta_shutdown), to subtract. */
    double empty_v[MAX_REPS];
    int nempty = 0;
    for (int r = 0; r < reps; r++) {
        double c0 = cpu_ms();
        if (new_job(&m) != 0) break;
        manta_shutdown(m);
        empty_v[nempty++] = cpu_ms() - c0;
    }
    double empty_cpu = median(empty_v, nempty);
    fprintf(stderr, "empty job (manta_init + manta_shutdown): %.1f cpu-ms\n", empty_cpu);

    static const int sizes[] = {1, 8, 32, 64};
    fprintf(stderr, "launch (create no_wait -> wait_ready -> one call each), per job:\n");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int n = sizes[k], got = 0, gotb = 0, gotj = 0;
        phases mp[MAX_REPS], bpp[MAX_REPS];
        double mv[MAX_REPS], bv[MAX_REPS], setup[MAX_REPS], down[MAX_REPS];
        double mcpu[MAX_REPS], bcpu[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            double c0 = cpu_ms();
            if (bare_launch(n, &bp) == 0)
                bpp[gotb] = bp, bcpu[gotb] = (cpu_ms() - c0) / n, bv[gotb++] = bp.total / n;
            double c1 = cpu_ms(), t0 = now_ms();
            if (new_job(&m) != 0) break;
            double t1 = now_ms();
            int rc = launch(m, a, 0, n, &ph);
            double t2 = now_ms();
            manta_shutdown(m);
            setup[gotj] = t1 - t0, down[gotj++] = now_ms() - t2;
            if (rc == 0)
                mp[got] = ph, mcpu[got] = (cpu_ms() - c1 - empty_cpu) / n, mv[got++] = ph.total / n;
        }
        if (!got || !gotb) continue;
        phases mm = median_phases(mp, got), bm = median_phases(bpp, gotb);
        print_phases("manta", n, &mm);
        print_phases("bare", n, &bm);
        double mc = median(mcpu, got), bc = median(bcpu, gotb);
        fprintf(stderr,
                "  cpu (all processes): manta %.2f, bare %.2f cpu-ms/actor; untimed: manta_init "
                "%.1f ms, manta_shutdown %.1f ms\n",
                mc, bc, median(setup, gotj), median(down, gotj));
        char name[64];
        snprintf(name, sizeof name, "launch_%d_actors_lower_better", n);
        emit(name, median(mv, got), "ms/actor", median(bv, gotb));
        if (n == MAX_ACTORS) emit("launch_64_actors_cpu_lower_better", mc, "cpu-ms/actor", bc);
    }

    /* The same without wait_ready: how much of the above is the polling. */
    {
        int n = MAX_ACTORS, got = 0, gotb = 0;
        phases mp[MAX_REPS], bpp[MAX_REPS];
        double mv[MAX_REPS], bv[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            if (bare_launch(n, &bp) == 0) bpp[gotb] = bp, bv[gotb++] = bp.total / n;
            if (new_job(&m) != 0) break;
            int rc = launch_calls_only(m, a, n, &ph);
            manta_shutdown(m);
            if (rc == 0) mp[got] = ph, mv[got++] = ph.total / n;
        }
        if (got && gotb) {
            fprintf(stderr, "launch without wait_ready (create no_wait + call at once):\n");
            phases mm = median_phases(mp, got), bm = median_phases(bpp, gotb);
            print_phases("manta (calls only)", n, &mm);
            print_phases("bare", n, &bm);
            emit("launch_64_actors_calls_only_lower_better", median(mv, got), "ms/actor",
                 median(bv, gotb));
        }
    }

    /* Scale a group 4 -> 32: the 28 new ones. */
    {
        int n = SCALE_TO - SCALE_FROM, got = 0, gotb = 0;
        phases mp[MAX_REPS], bpp[MAX_REPS];
        double mv[MAX_REPS], bv[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            if (bare_launch(n, &bp) == 0) bpp[gotb] = bp, bv[gotb++] = bp.total / n;
            if (new_job(&m) != 0) break;
            int rc = launch(m, a, 0, SCALE_FROM, &ph);
            if (rc == 0) rc = launch(m, a, SCALE_FROM, SCALE_TO, &ph);
            manta_shutdown(m);
            if (rc == 0) mp[got] = ph, mv[got++] = ph.total / n;
        }
        if (got && gotb) {
            fprintf(stderr, "scale 4 -> 32 through the API (the 28 new actors):\n");
            phases mm = median_phases(mp, got), bm = median_phases(bpp, gotb);
            print_phases("manta", n, &mm);
            print_phases("bare", n, &bm);
            emit("scale_4_to_32_lower_better", median(mv, got), "ms/actor", median(bv, gotb));
        }
    }

    /* The CLI, if built next to this program (build/tests/bench/ -> build/). */
    char mp_buf[PATH_MAX], sp_buf[PATH_MAX], dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", g_exe);
    for (int up = 0; up < 3; up++) {
        char *sl = strrchr(dir, '/');
        if (sl) *sl = 0;
    }
    if (!manta_path) snprintf(mp_buf, sizeof mp_buf, "%s/manta", dir), manta_path = mp_buf;
    if (!spec_path)
        snprintf(sp_buf, sizeof sp_buf, "%s/examples/user_class/user_service.yaml", dir),
            spec_path = sp_buf;
    if (no_cli) {
        fprintf(stderr, "cli: skipped (--no-cli)\n");
    } else if (!file_exists(manta_path) || !file_exists(spec_path)) {
        fprintf(stderr, "cli: skipped: %s or %s not built\n", manta_path, spec_path);
    } else {
        setenv("MANTA_STATE_DIR", g_tmp, 1); /* our jobs only, not the user's "current" */
        int got = 0, gotb5 = 0, gotb28 = 0;
        double run_v[MAX_REPS], scale_v[MAX_REPS], b5[MAX_REPS], b28[MAX_REPS];
        for (int r = 0; r < (reps < 3 ? reps : 3); r++) {
            if (bare_launch(CLI_REPLICAS + 1, &bp) == 0) b5[gotb5++] = bp.total;
            if (bare_launch(SCALE_TO - CLI_REPLICAS, &bp) == 0)
                b28[gotb28++] = bp.total / (SCALE_TO - CLI_REPLICAS);
            if (cli_round(manta_path, spec_path, r, &run_v[got], &scale_v[got]) == 0) got++;
        }
        if (got && gotb5 && gotb28) {
            fprintf(stderr, "cli: %s with %s\n", manta_path, spec_path);
            emit("cli_run_detach_5_actors_total_lower_better", median(run_v, got), "ms",
                 median(b5, gotb5));
            emit("cli_scale_squarer_4_to_32_lower_better", median(scale_v, got) / 28, "ms/actor",
                 median(b28, gotb28));
        }
    }

    char path[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/current", g_tmp);
    unlink(path);
    if (rmdir(g_tmp) != 0) {
        /* CLI run folders: leave them for a look if something failed. */
        if (!g_failures) {
            char *rm[] = {"/bin/rm", "-rf", g_tmp, NULL};
            run_cmd(rm);
        } else {
            fprintf(stderr, "bench_launch: run folders kept in %s\n", g_tmp);
        }
    }
    if (g_failures) fprintf(stderr, "bench_launch: %d failure(s)\n", g_failures);
    return g_failures ? 1 : 0;
}
