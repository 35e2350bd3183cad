/*
 * test_nccl_emu.cpp - the NCCL emulator on its own, ranks as threads of one process (the
 * actor test, test_collective_nccl, has them in processes): every operation against serial
 * sums, in and out of groups, larger than a chunk; streams not ready until the worker is done;
 * ncclCommAbort freeing a rank that waits for a missing peer at once; the checks (world size,
 * rank range, a rank joining twice, different operations); nothing left in /dev/shm.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <thread>
#include <vector>

#include "cuda_runtime.h"
#include "nccl.h"

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);                             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                                    \
        }                                                                                          \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static float input(int r, size_t i)
{
    return (float)((int)(((uint32_t)i * 2654435761u + (uint32_t)r * 40503u) >> 7) % 2001 - 1000);
}

static int shm_segments(void)
{
    int n = 0;
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    while (struct dirent *e = readdir(d))
        if (!strncmp(e->d_name, "manta-nccl-emu-", 15)) n++;
    closedir(d);
    return n;
}

static void wait_stream(cudaStream_t s)
{
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "synchronize");
    CHECK(cudaStreamQuery(s) == cudaSuccess, "query after synchronize");
}

/* rank r of R: every operation on n floats */
static void rank_ops(int R, int r, ncclUniqueId id, size_t n)
{
    ncclComm_t comm;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t st = ncclCommInitRankConfig(&comm, R, id, r, &cfg);
    CHECK(st == ncclInProgress || st == ncclSuccess, "init: %s", ncclGetErrorString(st));
    do ncclCommGetAsyncError(comm, &st);
    while (st == ncclInProgress);
    CHECK(st == ncclSuccess, "init: %s", ncclGetErrorString(st));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    size_t slice = n / (size_t)R;
    float *a, *b;
    cudaMalloc(&a, n * sizeof(float) + 4);
    cudaMalloc(&b, n * sizeof(float) + 4);
    std::vector<float> h(n), want(n, 0.0f);
    for (size_t i = 0; i < n; i++) {
        h[i] = input(r, i);
        for (int q = 0; q < R; q++) want[i] += input(q, i);
    }
    /* all-reduce in place */
    cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    CHECK(ncclAllReduce(a, a, n, ncclFloat32, ncclSum, comm, s) == ncclSuccess, "all-reduce");
    wait_stream(s);
    CHECK(!memcmp(a, want.data(), n * sizeof(float)), "all-reduce rank %d n %zu", r, n);
    /* reduce-scatter, then all-gather of the slices: the sums again */
    cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    CHECK(ncclReduceScatter(a, b + r * slice, slice, ncclFloat32, ncclSum, comm, s) == ncclSuccess,
          "reduce-scatter");
    CHECK(ncclAllGather(b + r * slice, b, slice, ncclFloat32, comm, s) == ncclSuccess,
          "all-gather");
    wait_stream(s);
    CHECK(!memcmp(b, want.data(), slice * R * sizeof(float)), "rs + ag rank %d n %zu", r, n);
    /* a group: reduce to each rank in turn, then broadcast from the last */
    cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    ncclGroupStart();
    for (int q = 0; q < R; q++)
        ncclReduce(a + q * slice, q == r ? b : a + q * slice, slice, ncclFloat32, ncclSum, q, comm,
                   s);
    ncclBroadcast(a, a, n, ncclFloat32, R - 1, comm, s);
    /* nothing runs before ncclGroupEnd */
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "query in a group");
    ncclGroupEnd();
    wait_stream(s);
    CHECK(!memcmp(b, want.data() + r * slice, slice * sizeof(float)), "reduce rank %d", r);
    for (size_t i = 0; i < n; i++) h[i] = input(R - 1, i);
    CHECK(!memcmp(a, h.data(), n * sizeof(float)), "broadcast rank %d", r);
    /* bytes */
    unsigned char *c8 = (unsigned char *)b;
    size_t nb = n * sizeof(float) - 1;
    if (r == 0) memset(c8, 0x5a, nb);
    CHECK(ncclBroadcast(c8, c8, nb, ncclUint8, 0, comm, s) == ncclSuccess, "bytes");
    wait_stream(s);
    CHECK(c8[0] == 0x5a && c8[nb - 1] == 0x5a, "byte broadcast rank %d", r);
    /* checks at the call */
    CHECK(ncclBroadcast(a, a, 1, ncclFloat32, R, comm, s) == ncclInvalidArgument, "root");
    CHECK(ncclAllReduce(a, a, 1, ncclUint8, ncclSum, comm, s) == ncclInvalidArgument, "type");
    CHECK(ncclAllReduce(a, a, 1, ncclFloat32, ncclMax, comm, s) == ncclInvalidArgument, "op");
    CHECK(ncclAllReduce(a, a, 1, ncclFloat32, ncclSum, NULL, s) == ncclInvalidArgument, "comm");
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroy");
    cudaFree(a), cudaFree(b);
}

static void test_ops(int R, size_t n)
{
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "id");
    std::vector<std::thread> t;
    for (int r = 0; r < R; r++) t.emplace_back(rank_ops, R, r, id, n);
    for (auto &x : t) x.join();
}

/* rank 0 of 2 enters an all-reduce alone; abort frees it at once */
static void test_abort(void)
{
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t c[2];
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    for (int r = 0; r < 2; r++) ncclCommInitRankConfig(&c[r], 2, id, r, &cfg);
    ncclResult_t st;
    do ncclCommGetAsyncError(c[0], &st);
    while (st == ncclInProgress);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *a;
    cudaMalloc(&a, (1 << 20) * sizeof(float));
    CHECK(ncclAllReduce(a, a, 1 << 20, ncclFloat32, ncclSum, c[0], s) == ncclSuccess, "enqueue");
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "a missing peer: not ready");
    double t0 = now_ms();
    ncclCommAbort(c[0]);
    double took = now_ms() - t0;
    CHECK(took < 100, "abort took %.1f ms", took);
    CHECK(cudaStreamQuery(s) == cudaSuccess, "the stream after the abort");
    ncclCommDestroy(c[1]);
    cudaStreamDestroy(s);
    cudaFree(a);
    /* a rank that never joins: init stays in progress; abort ends it */
    ncclGetUniqueId(&id);
    CHECK(ncclCommInitRankConfig(&c[0], 2, id, 0, &cfg) == ncclInProgress, "init alone");
    nanosleep(&ts, NULL);
    ncclCommGetAsyncError(c[0], &st);
    CHECK(st == ncclInProgress, "init alone: %s", ncclGetErrorString(st));
    t0 = now_ms();
    ncclCommAbort(c[0]);
    CHECK(now_ms() - t0 < 100, "abort during init took %.1f ms", now_ms() - t0);
}

static void test_checks(void)
{
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t c0, c1, c2;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    CHECK(ncclCommInitRankConfig(&c0, 2, id, 2, &cfg) == ncclInvalidArgument, "rank range");
    CHECK(ncclCommInitRankConfig(&c0, 0, id, 0, &cfg) == ncclInvalidArgument, "world 0");
    ncclConfig_t raw;
    memset(&raw, 0, sizeof raw);
    CHECK(ncclCommInitRankConfig(&c0, 2, id, 0, &raw) == ncclInvalidArgument, "bad config");
    ncclUniqueId junk;
    memset(&junk, 'x', sizeof junk);
    CHECK(ncclCommInitRankConfig(&c0, 2, junk, 0, &cfg) == ncclInvalidArgument, "bad id");
    CHECK(ncclCommInitRankConfig(&c0, 2, id, 0, &cfg) == ncclInProgress, "rank 0");
    CHECK(ncclCommInitRankConfig(&c1, 3, id, 1, &cfg) == ncclInvalidUsage, "world mismatch");
    CHECK(ncclCommInitRankConfig(&c1, 2, id, 0, &cfg) == ncclInvalidUsage, "rank 0 twice");
    CHECK(ncclCommInitRankConfig(&c1, 2, id, 1, &cfg) == ncclInProgress, "rank 1");
    ncclResult_t st;
    do ncclCommGetAsyncError(c0, &st);
    while (st == ncclInProgress);
    CHECK(st == ncclSuccess, "init");
    CHECK(ncclCommGetAsyncError(NULL, &st) == ncclInvalidArgument, "NULL comm");
    /* different operations: both communicators fail with ncclInvalidUsage */
    cudaStream_t s0, s1;
    cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    float *a;
    cudaMalloc(&a, 64 * sizeof(float));
    ncclAllReduce(a, a, 8, ncclFloat32, ncclSum, c0, s0);
    ncclAllReduce(a + 16, a + 16, 9, ncclFloat32, ncclSum, c1, s1);
    cudaStreamSynchronize(s0);
    cudaStreamSynchronize(s1);
    ncclCommGetAsyncError(c0, &st);
    CHECK(st == ncclInvalidUsage, "mismatch at rank 0: %s", ncclGetErrorString(st));
    ncclCommGetAsyncError(c1, &st);
    CHECK(st == ncclInvalidUsage, "mismatch at rank 1: %s", ncclGetErrorString(st));
    CHECK(ncclAllReduce(a, a, 8, ncclFloat32, ncclSum, c0, s0) == ncclInvalidUsage, "broken");
    ncclCommDestroy(c0);
    ncclCommDestroy(c1);
    cudaStreamDestroy(s0);
    cudaStreamDestroy(s1);
    cudaFree(a);
    (void)c2;
}

int main(void)
{
    int before = shm_segments();
    for (int R = 1; R <= 4; R++) {
        test_ops(R, 4 * 1);
        test_ops(R, 4 * 100003); /* several chunks, and a short one */
    }
    test_abort();
    test_checks();
    int after = shm_segments();
    CHECK(after == before, "/dev/shm: %d segments before, %d after", before, after);
    if (failures) {
        fprintf(stderr, "test_nccl_emu: %d failures\n", failures);
        return 1;
    }
    printf("test_nccl_emu: ok\n");
    return 0;
}
