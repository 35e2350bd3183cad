/*
 * bench_collective.c -- collective bandwidth against raw ZeroMQ, same run.
 *
 *   build/tests/bench/bench_collective [--quick]
 *
 * Ranks are Manta actors (this program, started by the node agent of an
 * embedded Redis). Prints one JSON object per line:
 *   {"name","value","unit","baseline","ratio"}
 * - bcast_<size>_to_<n>: broadcast of <size> from rank 0 to n others, in
 *   GB/s (bytes / time until the last rank has them and a barrier closed);
 *   baseline: the same bytes over one raw ZeroMQ PAIR connection between two
 *   actors (best of one zero-copy message and 4 MiB zero-copy chunks, the
 *   receiver copying into its buffer, closed by a 1-byte ack);
 *   ratio = value / baseline.
 * - rs_ag_10M_S<n>: reduce-scatter then all-gather of 10M floats on n
 *   ranks, in ms; baseline: the raw transfer time of the same 40 MB;
 *   ratio = baseline / value (1.0: as fast as moving the tensor once; the
 *   ring moves 2(S-1)/S of it through every rank).
 * Each figure is the best of a few runs.
 */
#include <manta.h>
#include <manta_collective.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define MAXR 5

enum { B_BCAST = 1, B_RSAG, B_RAW };

typedef struct bjob {
    int kind, world, rank, iters;
    uint64_t bytes, chunk; /* B_RAW: chunk 0 sends one message */
    char group[64];
    char ep[160];
} bjob;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void zc_nop(void *data, void *hint) {}

/* Raw ZeroMQ: rank 0 sends, rank 1 receives into its buffer and acks. */
static double raw_transfer(manta_coll_group *g, const bjob *j, char *buf)
{
    void *zctx = zmq_ctx_new();
    void *s = zmq_socket(zctx, ZMQ_PAIR);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (j->rank == 1 ? zmq_bind(s, j->ep) : 0) return -1;
    manta_coll_barrier(g, 0);
    if (j->rank == 0 && zmq_connect(s, j->ep) != 0) return -1;
    double best = 1e9;
    size_t ch = j->chunk ? j->chunk : j->bytes;
    for (int it = 0; it < j->iters; it++) {
        manta_coll_barrier(g, 0);
        double t0 = now();
        if (j->rank == 0) {
            for (size_t off = 0; off < j->bytes; off += ch) {
                size_t n = j->bytes - off < ch ? j->bytes - off : ch;
                zmq_msg_t m;
                zmq_msg_init_data(&m, buf + off, n, zc_nop, NULL);
                zmq_msg_send(&m, s, 0);
            }
            char ack;
            zmq_recv(s, &ack, 1, 0);
        } else {
            for (size_t off = 0; off < j->bytes; off += ch) {
                zmq_msg_t m;
                zmq_msg_init(&m);
                zmq_msg_recv(&m, s, 0);
                memcpy(buf + off, zmq_msg_data(&m), zmq_msg_size(&m));
                zmq_msg_close(&m);
            }
            zmq_send(s, "k", 1, 0);
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    zmq_close(s);
    zmq_ctx_term(zctx);
    return best;
}

static int m_bench(manta_req *c, void *st, const void *arg, size_t len)
{
    bjob j;
    if (len != sizeof j) return manta_reply_error(c, MANTA_EINVAL, "bad job");
    memcpy(&j, arg, sizeof j);
    manta_coll_group *g;
    int rc = manta_coll_create(manta_req_ctx(c), j.group, j.world, j.rank,
                               &(manta_coll_options){.timeout_ms = 30000}, &g);
    if (rc) return manta_reply_error(c, rc, "create: %s", manta_last_error());
    size_t n = j.kind == B_RSAG ? j.bytes / sizeof(float) : j.bytes;
    char *buf = malloc(j.bytes);
    float *slice = malloc(j.bytes / (size_t)j.world + 64);
    if (!buf || !slice) return manta_reply_error(c, MANTA_ENOMEM, "out of memory");
    memset(buf, j.rank + 1, j.bytes);
    double best = 1e9;
    if (j.kind == B_RAW) {
        best = raw_transfer(g, &j, buf);
    } else {
        size_t off;
        manta_coll_slice(n, j.world, j.rank, &off, NULL);
        for (int it = 0; it < j.iters && rc == 0; it++) {
            rc = manta_coll_barrier(g, 0);
            double t0 = now();
            if (rc == 0 && j.kind == B_BCAST)
                rc = manta_coll_broadcast(g, buf, j.bytes, MANTA_COLL_BYTE, 0, 60000);
            if (rc == 0 && j.kind == B_RSAG) {
                rc = manta_coll_reduce_scatter(g, (float *)buf, slice, n, 60000);
                if (rc == 0)
                    rc = manta_coll_all_gather(g, slice, buf, n, MANTA_COLL_FLOAT32, 60000);
            }
            if (rc == 0) rc = manta_coll_barrier(g, 0);
            double t = now() - t0;
            if (t < best) best = t;
        }
    }
    free(buf), free(slice);
    manta_coll_free(g);
    if (rc) return manta_reply_error(c, rc, "%s", manta_last_error());
    return manta_reply(c, &best, sizeof best);
}

static const manta_method methods[] = {{"bench", m_bench}, {NULL, NULL}};
static const manta_class bench_class = {"brank", 0, NULL, NULL, methods};
static const manta_class *const classes[] = {&bench_class, NULL};

static manta_ctx *drv;
static manta_actor *ranks[MAXR];
static int groups;

/* Run a job on ranks 0..world-1; rank 0's time. */
static double run(bjob tmpl, int world)
{
    manta_future *f[MAXR];
    snprintf(tmpl.group, sizeof tmpl.group, "bench%d", groups++);
    for (int r = 0; r < world; r++) {
        bjob j = tmpl;
        j.world = world, j.rank = r;
        f[r] = manta_call_timeout(drv, ranks[r], "bench", &j, sizeof j, 300000);
    }
    double t = -1;
    for (int r = 0; r < world; r++) {
        const void *d;
        size_t len;
        int rc = manta_get(f[r], -1, &d, &len);
        if (rc) {
            fprintf(stderr, "bench: rank %d: %s: %s\n", r, manta_strerror(rc),
                    manta_future_error(f[r]));
            exit(1);
        }
        if (r == 0) memcpy(&t, d, sizeof t);
        manta_future_free(f[r]);
    }
    return t;
}

static double raw_time(uint64_t bytes, int iters)
{
    double best = 1e9;
    static const uint64_t chunks[] = {0, 4u << 20};
    for (int k = 0; k < 2; k++) {
        bjob j = {.kind = B_RAW, .bytes = bytes, .iters = iters, .chunk = chunks[k]};
        snprintf(j.ep, sizeof j.ep, "ipc:///tmp/manta-%s/raw%d", manta_job(drv), groups);
        double t = run(j, 2);
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    if (getenv("MANTA_ROLE")) {
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        return 1;
    }
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    signal(SIGPIPE, SIG_IGN);
    if (manta_init(&drv, &(manta_options){.classes = classes}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    for (int r = 0; r < MAXR; r++)
        if (manta_actor_create(drv, &(manta_actor_options){.cls = "brank"}, &ranks[r]) != 0) {
            fprintf(stderr, "actor: %s\n", manta_last_error());
            manta_shutdown(drv);
            return 1;
        }
    static const uint64_t sizes[] = {16u << 20, 128u << 20};
    for (int s = 0; s < 2; s++) {
        int iters = quick ? 2 : (s ? 3 : 6);
        double raw = raw_time(sizes[s], iters);
        double raw_gbs = sizes[s] / raw / 1e9;
        for (int others = 2; others <= 4; others += 2) {
            double t = run((bjob){.kind = B_BCAST, .bytes = sizes[s], .iters = iters}, others + 1);
            double gbs = sizes[s] / t / 1e9;
            printf("{\"name\":\"bcast_%lluMiB_to_%d\",\"value\":%.3f,\"unit\":\"GB/s\","
                   "\"baseline\":%.3f,\"ratio\":%.3f}\n",
                   (unsigned long long)(sizes[s] >> 20), others, gbs, raw_gbs, gbs / raw_gbs);
            fflush(stdout);
        }
    }
    uint64_t bytes = 10000000ull * sizeof(float);
    int iters = quick ? 2 : 4;
    double raw = raw_time(bytes, iters);
    for (int S = 2; S <= 4; S += 2) {
        double t = run((bjob){.kind = B_RSAG, .bytes = bytes, .iters = iters}, S);
        printf("{\"name\":\"rs_ag_10M_S%d\",\"value\":%.2f,\"unit\":\"ms\",\"baseline\":%.2f,"
               "\"ratio\":%.3f}\n",
               S, t * 1e3, raw * 1e3, raw / t);
        fflush(stdout);
    }
    manta_shutdown(drv);
    return 0;
}
