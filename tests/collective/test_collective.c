/*
 * test_collective.c -- group collectives between real processes: Manta
 * actors (this same program, started by the node agent) join groups of
 * S = 1..4 ranks through a real redis-server and run every operation on
 * uneven sizes (1, 7, 1000003 floats), each rank checking its result
 * against a serial computation of all ranks' inputs; a 64 MiB broadcast
 * with checksums; ranks that never join or never enter an operation;
 * ranks that disagree on the world size or on the operation.
 *
 * Inputs are small integers stored as floats, so every sum is exact and
 * results are compared bit for bit.
 */
#include <manta.h>
#include <manta_collective.h>

#include "testutil.h"

#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define MAXR 4

static test_redis redis;
static manta_ctx *drv;
static manta_actor *ranks[MAXR];

enum { K_OPS = 1, K_BCAST_BIG, K_JOIN, K_IDLE, K_ALLREDUCE, K_GATHER_BYTES, K_FIELDS };

typedef struct job {
    char group[64];
    int world, rank, kind, root, timeout_ms;
    uint64_t count;
    uint64_t chunk;
} job;

typedef struct result {
    int rc;
    uint32_t crc;
    char msg[480];
} result;

/* ---- inputs and the serial reference ---- */

static float input(int r, size_t i)
{
    return (float)((int)(((uint32_t)i * 2654435761u + (uint32_t)r * 40503u) >> 7) % 2001 - 1000);
}

static float sum_at(int world, size_t i)
{
    float s = 0;
    for (int r = 0; r < world; r++) s += input(r, i);
    return s;
}

static int owner_of(size_t count, int world, size_t i)
{
    for (int r = 0; r < world; r++) {
        size_t off, len;
        manta_coll_slice(count, world, r, &off, &len);
        if (i >= off && i < off + len) return r;
    }
    return -1;
}

/* ---- the rank actor ---- */

static int rfail(result *res, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    res->rc = rc ? rc : -100;
    vsnprintf(res->msg, sizeof res->msg, fmt, ap);
    va_end(ap);
    return res->rc;
}

static int cmp_floats(result *res, const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            return rfail(res, -100, "%s: element %zu is %g, serial says %g", what, i, got[i],
                         want[i]);
    return 0;
}

static int run_ops(manta_coll_group *g, const job *j, result *res)
{
    int S = j->world, r = j->rank;
    size_t n = j->count, off, len;
    manta_coll_slice(n, S, r, &off, &len);
    float *buf = calloc(n + 1, sizeof(float)), *want = calloc(n + 1, sizeof(float));
    float *mine = calloc(n + 1, sizeof(float)), *slice = calloc(len + 1, sizeof(float));
    unsigned char *bytes = calloc(n + 1, 1), *bwant = calloc(n + 1, 1);
    int rc = -1;
    if (!buf || !want || !mine || !slice || !bytes || !bwant) {
        rfail(res, MANTA_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) mine[i] = input(r, i), want[i] = sum_at(S, i);

    if ((rc = manta_coll_barrier(g, 0))) {
        rfail(res, rc, "barrier: %s", manta_last_error());
        goto out;
    }
    /* broadcast from the last rank */
    int root = S - 1;
    for (size_t i = 0; i < n; i++) buf[i] = r == root ? input(root, i) : NAN;
    if ((rc = manta_coll_broadcast(g, buf, n, MANTA_COLL_FLOAT32, root, 0))) {
        rfail(res, rc, "broadcast: %s", manta_last_error());
        goto out;
    }
    for (size_t i = 0; i < n; i++) bwant[i] = 0, want[i] = input(root, i);
    if ((rc = cmp_floats(res, "broadcast", buf, want, n))) goto out;

    /* all-reduce */
    memcpy(buf, mine, n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = sum_at(S, i);
    if ((rc = manta_coll_all_reduce(g, buf, n, 0))) {
        rfail(res, rc, "all_reduce: %s", manta_last_error());
        goto out;
    }
    if ((rc = cmp_floats(res, "all_reduce", buf, want, n))) goto out;

    /* reduce-scatter, out of place then in place */
    if ((rc = manta_coll_reduce_scatter(g, mine, slice, n, 0))) {
        rfail(res, rc, "reduce_scatter: %s", manta_last_error());
        goto out;
    }
    if ((rc = cmp_floats(res, "reduce_scatter", slice, want + off, len))) goto out;
    memcpy(buf, mine, n * sizeof(float));
    if ((rc = manta_coll_reduce_scatter(g, buf, buf + off, n, 0))) {
        rfail(res, rc, "reduce_scatter in place: %s", manta_last_error());
        goto out;
    }
    if ((rc = cmp_floats(res, "reduce_scatter in place", buf + off, want + off, len))) goto out;

    /* all-gather of every rank's own input slice */
    for (size_t i = 0; i < n; i++) buf[i] = NAN, want[i] = input(owner_of(n, S, i), i);
    if ((rc = manta_coll_all_gather(g, mine + off, buf, n, MANTA_COLL_FLOAT32, 0))) {
        rfail(res, rc, "all_gather: %s", manta_last_error());
        goto out;
    }
    if ((rc = cmp_floats(res, "all_gather", buf, want, n))) goto out;

    /* all-gather of bytes, in place */
    for (size_t i = 0; i < n; i++) {
        bwant[i] = (unsigned char)(i * 7 + (size_t)owner_of(n, S, i) * 31);
        bytes[i] = i >= off && i < off + len ? bwant[i] : 0xee;
    }
    if ((rc = manta_coll_all_gather(g, bytes + off, bytes, n, MANTA_COLL_BYTE, 0))) {
        rfail(res, rc, "all_gather bytes: %s", manta_last_error());
        goto out;
    }
    if (memcmp(bytes, bwant, n) != 0) {
        rc = rfail(res, -100, "all_gather bytes: wrong result");
        goto out;
    }

    /* broadcast with checksum from rank 0 */
    for (size_t i = 0; i < n; i++) bytes[i] = r == 0 ? (unsigned char)(i ^ 0x5a) : 0;
    uint32_t crc = 0;
    if ((rc = manta_coll_broadcast_crc(g, bytes, n, 0, &crc, 0))) {
        rfail(res, rc, "broadcast_crc: %s", manta_last_error());
        goto out;
    }
    for (size_t i = 0; i < n; i++) bwant[i] = (unsigned char)(i ^ 0x5a);
    if (memcmp(bytes, bwant, n) != 0 || crc != manta_crc32c(0, bwant, n)) {
        rc = rfail(res, -100, "broadcast_crc: wrong bytes or crc %08x", crc);
        goto out;
    }
    res->crc = crc;
    rc = manta_coll_barrier(g, 0);
    if (rc) rfail(res, rc, "final barrier: %s", manta_last_error());
out:
    free(buf), free(want), free(mine), free(slice), free(bytes), free(bwant);
    return rc;
}

static int run_bcast_big(manta_coll_group *g, const job *j, result *res)
{
    size_t n = j->count;
    unsigned char *b = malloc(n);
    if (!b) return rfail(res, MANTA_ENOMEM, "out of memory");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = j->rank == j->root ? (unsigned char)x : 0;
    }
    uint32_t crc = 0;
    int rc = manta_coll_broadcast_crc(g, b, n, j->root, &crc, j->timeout_ms);
    if (rc) {
        free(b);
        return rfail(res, rc, "broadcast_crc: %s", manta_last_error());
    }
    x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n && rc == 0; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (b[i] != (unsigned char)x)
            rc = rfail(res, -100, "64 MiB broadcast: byte %zu differs", i);
    }
    if (rc == 0 && crc != manta_crc32c(0, b, n)) rc = rfail(res, -100, "crc %08x is wrong", crc);
    res->crc = crc;
    free(b);
    return rc;
}

/* ---- a backend of the test's own: the rendezvous fields ---- */

/* What a backend publishes at open (as NCCL does its unique id): rank 0
 * puts a 16-byte token, every rank reads it back, polling until it is
 * there. A read of the wrong size is EPROTO naming the field, and a field
 * nobody publishes times out. Any other outcome fails the open, and with
 * it manta_coll_create, with a message saying what went wrong. */
static int fields_open(manta_coll_group *g, void **impl)
{
    unsigned char tok[16], got[16];
    for (size_t i = 0; i < sizeof tok; i++) tok[i] = (unsigned char)(i * 37 + 11);
    int64_t deadline = manta_coll_now_ms() + 10000;
    int rc = manta_coll_rank(g) == 0 ? manta_coll_put(g, "tok", tok, sizeof tok) : 0;
    if (rc == 0) rc = manta_coll_get(g, "tok", got, sizeof got, deadline);
    if (rc) return rc;
    if (memcmp(got, tok, sizeof tok) != 0)
        return manta_coll_fail(g, MANTA_EPROTO, "test: the token read back differs");
    rc = manta_coll_get(g, "tok", got, 8, deadline);
    if (rc != MANTA_EPROTO || !strstr(manta_last_error(), "field tok has 16 bytes, expected 8"))
        return manta_coll_fail(g, MANTA_EPROTO, "test: an 8-byte read of tok gave %d: %s", rc,
                               manta_last_error());
    rc = manta_coll_get(g, "absent", got, sizeof got, manta_coll_now_ms() + 50);
    if (rc != MANTA_ETIMEDOUT || !strstr(manta_last_error(), "'absent' not published in time"))
        return manta_coll_fail(g, MANTA_EPROTO, "test: reading an absent field gave %d: %s", rc,
                               manta_last_error());
    *impl = malloc(1);
    return *impl ? 0 : manta_coll_fail(g, MANTA_ENOMEM, "out of memory");
}

static void fields_close(void *impl)
{
    free(impl);
}

static const manta_coll_backend fields_backend = {
    .name = "fields", .open = fields_open, .close = fields_close};

static int m_run(manta_req *c, void *st, const void *arg, size_t alen)
{
    result res = {0};
    job j;
    if (alen != sizeof j) return manta_reply_error(c, MANTA_EINVAL, "bad job");
    memcpy(&j, arg, sizeof j);
    manta_coll_group *g = NULL;
    /* Joining gets 10 s (the actors start their calls a few ms apart), except
     * when joining is what the test times. */
    int join_ms = j.kind == K_JOIN || j.timeout_ms > 10000 ? j.timeout_ms : 10000;
    manta_coll_options o = {.timeout_ms = join_ms, .chunk_bytes = j.chunk};
    if (j.kind == K_FIELDS) o.backend = &fields_backend;
    int rc = manta_coll_create(manta_req_ctx(c), j.group, j.world, j.rank, &o, &g);
    if (rc) {
        rfail(&res, rc, "%s", manta_last_error());
    } else if (j.kind == K_OPS) {
        run_ops(g, &j, &res);
    } else if (j.kind == K_BCAST_BIG) {
        run_bcast_big(g, &j, &res);
    } else if (j.kind == K_ALLREDUCE) {
        float *b = calloc(j.count, sizeof(float));
        rc = b ? manta_coll_all_reduce(g, b, j.count, j.timeout_ms) : MANTA_ENOMEM;
        if (rc) rfail(&res, rc, "%s", manta_last_error());
        if (rc) {
            /* a broken group refuses further work */
            int rc2 = manta_coll_barrier(g, 100);
            if (rc2 != MANTA_ECLOSED) rfail(&res, -100, "after a failure: %d, not ECLOSED", rc2);
        }
        free(b);
    } else if (j.kind == K_GATHER_BYTES) {
        unsigned char *b = calloc(j.count + 1, 1);
        rc = b ? manta_coll_all_gather(g, b, b, j.count, MANTA_COLL_BYTE, j.timeout_ms)
               : MANTA_ENOMEM;
        if (rc) rfail(&res, rc, "%s", manta_last_error());
        free(b);
    } else if (j.kind == K_IDLE) {
        /* In the group, but never in an operation: until the driver says
         * the others have timed out (or j.root ms, a cap for a lost driver). */
        double until = test_now() + j.root / 1000.0;
        void *v = NULL;
        size_t vlen;
        while (manta_kv_get(manta_req_ctx(c), "idle-release", &v, &vlen) == MANTA_ENOTFOUND &&
               test_now() < until)
            usleep(5000);
        free(v);
    }
    manta_coll_free(g);
    return manta_reply(c, &res, sizeof res);
}

static const manta_method rank_methods[] = {{"run", m_run}, {NULL, NULL}};
static const manta_class rank_class = {"crank", 0, NULL, NULL, rank_methods};
static const manta_class *const classes[] = {&rank_class, NULL};

/* ---- the driver's side ---- */

/* Start `world` ranks on the actors (ranks[first..]) and collect results. */
static void run_group(const job *tmpl, int world, int first, result *out)
{
    manta_future *f[MAXR] = {0};
    for (int r = first; r < world; r++) {
        job j = *tmpl;
        j.world = world, j.rank = r;
        f[r] = manta_call_timeout(drv, ranks[r], "run", &j, sizeof j, 90000);
        assert_non_null(f[r]);
    }
    for (int r = first; r < world; r++) {
        const void *data;
        size_t len;
        int rc = manta_get(f[r], -1, &data, &len);
        if (rc)
            fail_msg("rank %d: call failed: %s %s", r, manta_strerror(rc),
                     manta_future_error(f[r]));
        assert_int_equal(len, sizeof(result));
        memcpy(&out[r], data, sizeof(result));
        manta_future_free(f[r]);
    }
}

static void test_crc32c(void **st)
{
    assert_int_equal(manta_crc32c(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(manta_crc32c(0, "", 0), 0);
    /* against a bitwise reference, at every alignment and split point */
    unsigned char buf[1031];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + 7);
    for (size_t start = 0; start < 9; start++) {
        uint32_t ref = 0xffffffffu;
        for (size_t i = start; i < sizeof buf; i++) {
            ref ^= buf[i];
            for (int k = 0; k < 8; k++) ref = ref & 1 ? (ref >> 1) ^ 0x82f63b78u : ref >> 1;
        }
        ref = ~ref;
        assert_int_equal(manta_crc32c(0, buf + start, sizeof buf - start), ref);
        size_t cut = (sizeof buf - start) / 3;
        uint32_t c = manta_crc32c(0, buf + start, cut);
        assert_int_equal(manta_crc32c(c, buf + start + cut, sizeof buf - start - cut), ref);
    }
}

static void test_slices(void **st)
{
    size_t off, len;
    manta_coll_slice(7, 3, 0, &off, &len);
    assert_true(off == 0 && len == 3);
    manta_coll_slice(7, 3, 1, &off, &len);
    assert_true(off == 3 && len == 2);
    manta_coll_slice(7, 3, 2, &off, &len);
    assert_true(off == 5 && len == 2);
    manta_coll_slice(1, 4, 3, &off, &len);
    assert_true(off == 1 && len == 0);
    for (size_t n = 0; n < 40; n++)
        for (int w = 1; w <= 5; w++) {
            size_t end = 0;
            for (int r = 0; r < w; r++) {
                manta_coll_slice(n, w, r, &off, &len);
                assert_int_equal(off, end);
                end += len;
            }
            assert_int_equal(end, n);
        }
}

static void test_ops_all_sizes(void **st)
{
    static const uint64_t sizes[] = {1, 7, 1000003};
    for (int S = 1; S <= MAXR; S++)
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            job j = {.kind = K_OPS,
                     .count = sizes[k],
                     .timeout_ms = 30000,
                     /* small chunks: pipelines of many uneven chunks */
                     .chunk = 256 << 10};
            snprintf(j.group, sizeof j.group, "ops-%d-%llu", S, (unsigned long long)sizes[k]);
            result res[MAXR] = {0};
            double t0 = test_now();
            run_group(&j, S, 0, res);
            for (int r = 0; r < S; r++)
                if (res[r].rc)
                    fail_msg("S=%d n=%llu rank %d: %s (%s)", S, (unsigned long long)sizes[k], r,
                             res[r].msg, manta_strerror(res[r].rc));
            printf("  S=%d n=%-8llu ok (%.2f s)\n", S, (unsigned long long)sizes[k],
                   test_now() - t0);
        }
}

/* A backend's own rendezvous fields (manta_coll_put/get, what NCCL uses
 * for its id) travel between real processes and go with the group. */
static void test_backend_fields(void **st)
{
    job j = {.kind = K_FIELDS, .timeout_ms = 10000};
    snprintf(j.group, sizeof j.group, "fields");
    result res[MAXR] = {0};
    run_group(&j, 3, 0, res);
    for (int r = 0; r < 3; r++)
        if (res[r].rc) fail_msg("rank %d: %s (%s)", r, res[r].msg, manta_strerror(res[r].rc));
    assert_int_equal(test_redis_count(&redis, "manta:*:coll:*"), 0);
}

static void test_broadcast_64mib_crc(void **st)
{
    job j = {.kind = K_BCAST_BIG, .count = 64u << 20, .root = 1, .timeout_ms = 40000};
    snprintf(j.group, sizeof j.group, "big");
    result res[MAXR] = {0};
    double t0 = test_now();
    run_group(&j, MAXR, 0, res);
    for (int r = 0; r < MAXR; r++) {
        if (res[r].rc) fail_msg("rank %d: %s", r, res[r].msg);
        assert_int_equal(res[r].crc, res[0].crc);
    }
    printf("  64 MiB to 3 ranks with crc32c %08x: %.2f s\n", res[0].crc, test_now() - t0);
}

/* Rank 2 of 3 never comes: the driver (rank 0) and an actor (rank 1) both
 * time out, and the message names rank 2. */
static void test_missing_rank(void **st)
{
    job j = {.kind = K_JOIN, .world = 3, .rank = 1, .timeout_ms = 1500};
    snprintf(j.group, sizeof j.group, "missing");
    manta_future *f = manta_call_timeout(drv, ranks[1], "run", &j, sizeof j, 30000);
    manta_coll_group *g = NULL;
    double t0 = test_now();
    int rc = manta_coll_create(drv, "missing", 3, 0, &(manta_coll_options){.timeout_ms = 1500}, &g);
    double took = test_now() - t0;
    assert_int_equal(rc, MANTA_ETIMEDOUT);
    assert_null(g);
    if (!strstr(manta_last_error(), "group 'missing' rank 0: rank 2 of 3 did not join"))
        fail_msg("%s", manta_last_error());
    assert_true(took >= 1.4 && took < 5);
    const void *data;
    size_t len;
    assert_int_equal(manta_get(f, -1, &data, &len), 0);
    result res;
    memcpy(&res, data, sizeof res);
    manta_future_free(f);
    assert_int_equal(res.rc, MANTA_ETIMEDOUT);
    assert_non_null(strstr(res.msg, "rank 2 of 3 did not join"));
    /* two missing ranks are both named */
    rc = manta_coll_create(drv, "missing2", 3, 1, &(manta_coll_options){.timeout_ms = 300}, &g);
    assert_int_equal(rc, MANTA_ETIMEDOUT);
    assert_non_null(strstr(manta_last_error(), "group 'missing2' rank 1: ranks 0, 2 of 3"));
    assert_int_equal(test_redis_count(&redis, "manta:*:coll:*"), 0);
}

/* A rank that joined but never enters the operation: the others time out
 * naming it, and their group is then broken (ECLOSED). */
static void test_rank_never_enters_op(void **st)
{
    job j = {.kind = K_ALLREDUCE, .count = 100000, .timeout_ms = 1000};
    snprintf(j.group, sizeof j.group, "idle");
    job idle = {.kind = K_IDLE, .world = 3, .rank = 2, .root = 20000, .timeout_ms = 10000};
    snprintf(idle.group, sizeof idle.group, "idle");
    manta_future *fi = manta_call_timeout(drv, ranks[2], "run", &idle, sizeof idle, 30000);
    manta_future *f[2];
    for (int r = 0; r < 2; r++) {
        job k = j;
        k.world = 3, k.rank = r;
        f[r] = manta_call_timeout(drv, ranks[r], "run", &k, sizeof k, 30000);
    }
    for (int r = 0; r < 2; r++) {
        const void *data;
        size_t len;
        assert_int_equal(manta_get(f[r], -1, &data, &len), 0);
        result res;
        memcpy(&res, data, sizeof res);
        manta_future_free(f[r]);
        if (res.rc != MANTA_ETIMEDOUT) fail_msg("rank %d: rc %d: %s", r, res.rc, res.msg);
        /* the ring: rank 0 waits on rank 2, rank 1 on rank 0 (which waits) */
        if (r == 0) assert_non_null(strstr(res.msg, "group 'idle' rank 0: "));
        if (r == 0) assert_non_null(strstr(res.msg, "no message from rank 2"));
    }
    assert_int_equal(manta_kv_set(drv, "idle-release", "1", 1), 0);
    assert_int_equal(manta_get(fi, -1, NULL, NULL), 0);
    manta_future_free(fi);
}

/* Ranks that disagree: on the world size (EINVAL at once), and on the
 * operation (EPROTO naming both). */
static void test_disagreements(void **st)
{
    job j = {.kind = K_JOIN, .world = 3, .rank = 0, .timeout_ms = 1500};
    snprintf(j.group, sizeof j.group, "worlds");
    manta_future *f = manta_call_timeout(drv, ranks[0], "run", &j, sizeof j, 30000);
    /* Rank 0 announces world 3 first: its record exists once it has. */
    double until = test_now() + 10;
    while (test_redis_count(&redis, "manta:coll-test:coll:worlds") != 1) {
        if (test_now() > until) fail_msg("rank 0 never recorded group 'worlds' in Redis");
        usleep(2000);
    }
    manta_coll_group *g = NULL;
    int rc = manta_coll_create(drv, "worlds", 2, 1, NULL, &g);
    assert_int_equal(rc, MANTA_EINVAL);
    if (!strstr(manta_last_error(), "group 'worlds': rank 1 says world 2, another member said 3"))
        fail_msg("%s", manta_last_error());
    assert_int_equal(manta_get(f, -1, NULL, NULL), 0);
    manta_future_free(f);

    /* rank 0 all-reduces while rank 1 all-gathers */
    job a = {.kind = K_ALLREDUCE, .world = 2, .rank = 0, .count = 1000, .timeout_ms = 3000};
    job b = {.kind = K_GATHER_BYTES, .world = 2, .rank = 1, .count = 1000, .timeout_ms = 3000};
    snprintf(a.group, sizeof a.group, "mixup");
    snprintf(b.group, sizeof b.group, "mixup");
    manta_future *fa = manta_call_timeout(drv, ranks[0], "run", &a, sizeof a, 30000);
    manta_future *fb = manta_call_timeout(drv, ranks[1], "run", &b, sizeof b, 30000);
    const void *data;
    size_t len;
    result ra, rb;
    assert_int_equal(manta_get(fa, -1, &data, &len), 0);
    memcpy(&ra, data, sizeof ra);
    assert_int_equal(manta_get(fb, -1, &data, &len), 0);
    memcpy(&rb, data, sizeof rb);
    manta_future_free(fa), manta_future_free(fb);
    /* each receives the other's message first: both see the mix-up */
    assert_int_equal(ra.rc, MANTA_EPROTO);
    assert_non_null(strstr(ra.msg, "group 'mixup' rank 0: rank 1 sent all_gather"));
    assert_int_equal(rb.rc, MANTA_EPROTO);
    assert_non_null(strstr(rb.msg, "group 'mixup' rank 1: rank 0 sent all_reduce"));
}

static void test_bad_arguments(void **st)
{
    manta_coll_group *g = (manta_coll_group *)1;
    /* every message names the group and the rank */
    assert_int_equal(manta_coll_create(drv, "x", 2, 2, NULL, &g), MANTA_EINVAL);
    assert_null(g);
    assert_non_null(strstr(manta_last_error(), "group 'x' rank 2: "));
    assert_int_equal(manta_coll_create(drv, "bad name", 1, 0, NULL, &g), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "group 'bad name' rank 0: bad name"));
    assert_int_equal(manta_coll_create(NULL, "x", 1, 0, NULL, &g), MANTA_EINVAL);
    /* a group of one works without any peer, and checks its arguments */
    assert_int_equal(manta_coll_create(drv, "solo", 1, 0, NULL, &g), 0);
    assert_string_equal(manta_coll_backend_name(g), "zmq");
    float x[3] = {1, 2, 3};
    assert_int_equal(manta_coll_broadcast(g, x, 3, MANTA_COLL_FLOAT32, 1, 0), MANTA_EINVAL);
    assert_int_equal(manta_coll_broadcast(g, x, 3, (manta_coll_dtype)7, 0, 0), MANTA_EINVAL);
    assert_int_equal(manta_coll_all_reduce(g, NULL, 3, 0), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "group 'solo' rank 0: all_reduce: no buffer"));
    assert_int_equal(manta_coll_all_reduce(g, x, 3, 0), 0); /* EINVAL does not break the group */
    assert_true(x[0] == 1 && x[2] == 3);
    manta_coll_free(g);
    manta_coll_free(NULL);
    assert_int_equal(test_redis_count(&redis, "manta:*:coll:*"), 0);
}

int main(void)
{
    if (getenv("MANTA_ROLE")) { /* started as an actor or node agent */
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    test_redis_start(&redis);
    manta_options o = {.redis_url = redis.url, .classes = classes, .job = "coll-test"};
    if (manta_init(&drv, &o) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        test_redis_stop(&redis);
        return 1;
    }
    for (int r = 0; r < MAXR; r++) {
        char name[16];
        snprintf(name, sizeof name, "rank%d", r);
        if (manta_actor_create(drv, &(manta_actor_options){.cls = "crank", .name = name},
                               &ranks[r]) != 0) {
            fprintf(stderr, "actor %s: %s\n", name, manta_last_error());
            manta_shutdown(drv);
            test_redis_stop(&redis);
            return 1;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),         cmocka_unit_test(test_slices),
        cmocka_unit_test(test_bad_arguments),  cmocka_unit_test(test_ops_all_sizes),
        cmocka_unit_test(test_backend_fields), cmocka_unit_test(test_broadcast_64mib_crc),
        cmocka_unit_test(test_missing_rank),   cmocka_unit_test(test_rank_never_enters_op),
        cmocka_unit_test(test_disagreements),
    };
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    long left = test_redis_count(&redis, "manta:coll-test:coll:*");
    manta_shutdown(drv);
    test_redis_stop(&redis);
    if (left != 0) {
        fprintf(stderr, "test: %ld collective keys left in Redis\n", left);
        failed++;
    }
    return failed;
}
