/*
 * test_collective_nccl.c -- the NCCL backend on real devices: one actor
 * per CUDA device (up to 4), each joining a group with cuda_device set,
 * running every operation on device buffers of uneven sizes and comparing
 * with the serial sum on the host, for S = 1 .. min(devices, 4) ranks; and
 * a rank that joins but never enters an operation: the others get
 * ETIMEDOUT (NCCL, the deadline) within the timeout and a little, then
 * ECLOSED. Exits 77 (ctest: skipped) when there is no CUDA device.
 *
 * The same file runs on the CPU emulators (tests/kernels/cuda_emu,
 * nccl_emu/: MK_CUDA_EMU_DEVICES=4), linked with the back-end or, with
 * NCCL_MODULE defined, taking it from that module (dlopen, as `manta`
 * does).
 */
#include <manta.h>
#include <manta_collective.h>

#include "testutil.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#ifdef NCCL_MODULE
#include <dlfcn.h>
#endif

#define MAXR 4

static test_redis redis;
static manta_ctx *drv;
static manta_actor *ranks[MAXR];
static int ndev;

typedef struct job {
    char group[64];
    int world, rank;
    uint64_t count;
    int mode; /* JOB_OPS, JOB_TIMEOUT (enter an all-reduce), JOB_ABSENT (never enter it) */
} job;

enum { JOB_OPS, JOB_TIMEOUT, JOB_ABSENT };
#define OP_TIMEOUT_MS 1500

/* the back-end: linked in, or from the module (NCCL_MODULE), as `manta` loads it */
static const manta_coll_backend *nccl_backend(void)
{
#ifdef NCCL_MODULE
    static const manta_coll_backend *b;
    if (!b) {
        void *h = dlopen(NCCL_MODULE, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen %s: %s\n", NCCL_MODULE, dlerror());
            exit(1);
        }
        const manta_coll_backend *(*get)(void);
        *(void **)&get = dlsym(h, "manta_coll_nccl");
        if (!get || !(b = get()) || strcmp(b->name, "nccl") != 0) {
            fprintf(stderr, "%s: no manta_coll_nccl\n", NCCL_MODULE);
            exit(1);
        }
    }
    return b;
#else
    return manta_coll_nccl();
#endif
}

typedef struct result {
    int rc;
    char msg[480];
} result;

static float input(int r, size_t i)
{
    return (float)((int)(((uint32_t)i * 2654435761u + (uint32_t)r * 40503u) >> 7) % 2001 - 1000);
}

static int rfail(result *res, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    res->rc = rc ? rc : -100;
    vsnprintf(res->msg, sizeof res->msg, fmt, ap);
    va_end(ap);
    return res->rc;
}

static int check(result *res, const char *what, const float *got, size_t n, int S, int kind,
                 size_t base)
{
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        if (kind == 0)
            for (int r = 0; r < S; r++) want += input(r, base + i);
        else
            want = input(kind - 1, base + i);
        if (got[i] != want)
            return rfail(res, -100, "%s: element %zu is %g, serial says %g", what, base + i, got[i],
                         want);
    }
    return 0;
}

static int run_ops(manta_coll_group *g, const job *j, result *res)
{
    int S = j->world, r = j->rank, rc = 0;
    size_t n = j->count, off, len;
    manta_coll_slice(n, S, r, &off, &len);
    float *h = calloc(n + 1, sizeof(float)), *d = NULL, *d2 = NULL;
    if (!h || cudaMalloc((void **)&d, (n + 1) * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&d2, (n + 1) * sizeof(float)) != cudaSuccess) {
        rc = rfail(res, MANTA_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) h[i] = input(r, i);
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    if ((rc = manta_coll_all_reduce(g, d, n, 20000))) {
        rfail(res, rc, "all_reduce: %s", manta_last_error());
        goto out;
    }
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    if ((rc = check(res, "all_reduce", h, n, S, 0, 0))) goto out;

    for (size_t i = 0; i < n; i++) h[i] = input(r, i);
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    if ((rc = manta_coll_reduce_scatter(g, d, d2, n, 20000))) {
        rfail(res, rc, "reduce_scatter: %s", manta_last_error());
        goto out;
    }
    cudaMemcpy(h, d2, len * sizeof(float), cudaMemcpyDeviceToHost);
    if ((rc = check(res, "reduce_scatter", h, len, S, 0, off))) goto out;

    for (size_t i = 0; i < len; i++) h[i] = input(r, off + i);
    cudaMemcpy(d, h, len * sizeof(float), cudaMemcpyHostToDevice);
    if ((rc = manta_coll_all_gather(g, d, d2, n, MANTA_COLL_FLOAT32, 20000))) {
        rfail(res, rc, "all_gather: %s", manta_last_error());
        goto out;
    }
    cudaMemcpy(h, d2, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (int q = 0; q < S && rc == 0; q++) {
        size_t o, l;
        manta_coll_slice(n, S, q, &o, &l);
        rc = check(res, "all_gather", h + o, l, S, q + 1, o);
    }
    if (rc) goto out;

    for (size_t i = 0; i < n; i++) h[i] = input(r, i);
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    uint32_t crc = 0;
    if ((rc = manta_coll_broadcast_crc(g, d, n * sizeof(float), S - 1, &crc, 20000))) {
        rfail(res, rc, "broadcast_crc: %s", manta_last_error());
        goto out;
    }
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    if ((rc = check(res, "broadcast", h, n, S, S, 0))) goto out;
    if (crc != manta_crc32c(0, h, n * sizeof(float))) {
        rc = rfail(res, -100, "broadcast_crc: crc %08x is not the data's", crc);
        goto out;
    }
    if ((rc = manta_coll_barrier(g, 20000))) rfail(res, rc, "barrier: %s", manta_last_error());
out:
    free(h);
    cudaFree(d), cudaFree(d2);
    return rc;
}

/* JOB_TIMEOUT: an all-reduce that a rank never enters times out, naming NCCL and the deadline,
 * within its timeout and a little; the group is broken after it. JOB_ABSENT: that rank, which
 * waits until the others are done (they have no use for it), then leaves. */
static int run_timeout(manta_coll_group *g, const job *j, result *res)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, 64 * sizeof(float)) != cudaSuccess)
        return rfail(res, MANTA_ENOMEM, "out of memory");
    int rc = 0;
    if (j->mode == JOB_ABSENT) {
        int ms = OP_TIMEOUT_MS + 500;
        struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        goto out;
    }
    int64_t t0 = manta_coll_now_ms();
    rc = manta_coll_all_reduce(g, d, 64, OP_TIMEOUT_MS);
    int64_t took = manta_coll_now_ms() - t0;
    const char *msg = manta_last_error();
    if (rc != MANTA_ETIMEDOUT || !strstr(msg, "NCCL") || !strstr(msg, "deadline")) {
        rc = rfail(res, -100,
                   "all_reduce without rank %d: %s (%s), expected ETIMEDOUT naming "
                   "NCCL and the deadline",
                   j->world - 1, manta_strerror(rc), msg);
        goto out;
    }
    if (took < OP_TIMEOUT_MS - 50 || took > OP_TIMEOUT_MS + 2500) {
        rc = rfail(res, -100, "all_reduce timed out after %lld ms (timeout %d ms)", (long long)took,
                   OP_TIMEOUT_MS);
        goto out;
    }
    rc = manta_coll_barrier(g, OP_TIMEOUT_MS);
    if (rc != MANTA_ECLOSED) {
        rc = rfail(res, -100, "barrier after the time-out: %s, expected ECLOSED",
                   manta_strerror(rc));
        goto out;
    }
    rc = 0;
out:
    cudaFree(d);
    return rc;
}

static int m_run(manta_req *c, void *st, const void *arg, size_t alen)
{
    result res = {0};
    job j;
    if (alen != sizeof j) return manta_reply_error(c, MANTA_EINVAL, "bad job");
    memcpy(&j, arg, sizeof j);
    manta_coll_group *g = NULL;
    manta_coll_options o = {
        .backend = nccl_backend(), .timeout_ms = 30000, .cuda_device = j.rank + 1};
    int rc = manta_coll_create(manta_req_ctx(c), j.group, j.world, j.rank, &o, &g);
    if (rc)
        rfail(&res, rc, "%s", manta_last_error());
    else if (j.mode == JOB_OPS)
        run_ops(g, &j, &res);
    else
        run_timeout(g, &j, &res);
    manta_coll_free(g);
    return manta_reply(c, &res, sizeof res);
}

static const manta_method rank_methods[] = {{"run", m_run}, {NULL, NULL}};
static const manta_class rank_class = {"nrank", 0, NULL, NULL, rank_methods};
static const manta_class *const classes[] = {&rank_class, NULL};

/* every rank of S runs j (its rank filled in; rank S-1 with mode last_mode) */
static void run_group(int S, job j, int last_mode)
{
    manta_future *f[MAXR];
    for (int r = 0; r < S; r++) {
        j.world = S, j.rank = r;
        if (r == S - 1 && S > 1) j.mode = last_mode;
        f[r] = manta_call_timeout(drv, ranks[r], "run", &j, sizeof j, 120000);
    }
    for (int r = 0; r < S; r++) {
        const void *data;
        size_t len;
        int rc = manta_get(f[r], -1, &data, &len);
        if (rc) fail_msg("rank %d: %s %s", r, manta_strerror(rc), manta_future_error(f[r]));
        result res;
        memcpy(&res, data, sizeof res);
        manta_future_free(f[r]);
        if (res.rc)
            fail_msg("%s: S=%d n=%llu rank %d: %s", j.group, S, (unsigned long long)j.count, r,
                     res.msg);
    }
}

static void test_nccl_ops(void **st)
{
    static const uint64_t sizes[] = {1, 7, 1000003};
    int smax = ndev < MAXR ? ndev : MAXR;
    for (int S = 1; S <= smax; S++)
        for (size_t k = 0; k < 3; k++) {
            job j = {.count = sizes[k], .mode = JOB_OPS};
            snprintf(j.group, sizeof j.group, "nccl-%d-%llu", S, (unsigned long long)sizes[k]);
            run_group(S, j, JOB_OPS);
        }
}

static void test_nccl_timeout(void **st)
{
    int S = ndev < MAXR ? ndev : MAXR;
    if (S < 2) skip();
    job j = {.count = 64, .mode = JOB_TIMEOUT};
    snprintf(j.group, sizeof j.group, "nccl-timeout-%d", S);
    run_group(S, j, JOB_ABSENT);
}

int main(void)
{
    if (getenv("MANTA_ROLE")) {
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        return 1;
    }
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("test_collective_nccl: no CUDA device here; skipped\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    test_redis_start(&redis);
    manta_options o = {.redis_url = redis.url, .classes = classes, .job = "nccl-test"};
    if (manta_init(&drv, &o) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        test_redis_stop(&redis);
        return 1;
    }
    int S = ndev < MAXR ? ndev : MAXR;
    for (int r = 0; r < S; r++) {
        char name[16];
        snprintf(name, sizeof name, "nrank%d", r);
        if (manta_actor_create(drv, &(manta_actor_options){.cls = "nrank", .name = name},
                               &ranks[r]) != 0) {
            fprintf(stderr, "actor %s: %s\n", name, manta_last_error());
            manta_shutdown(drv);
            test_redis_stop(&redis);
            return 1;
        }
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nccl_ops),
                                       cmocka_unit_test(test_nccl_timeout)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    manta_shutdown(drv);
    test_redis_stop(&redis);
    return failed;
}
