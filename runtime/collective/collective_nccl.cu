/*
 * collective_nccl.cu -- the NCCL backend of the group collectives
 * (manta_collective.h): the same const table as the ZeroMQ backend, over
 * ncclBroadcast, ncclAllReduce, ncclReduceScatter and ncclAllGather on
 * DEVICE buffers. Host code only (no kernels): nvcc compiles it because it
 * needs the CUDA toolkit's headers and libraries, and it lives in its own
 * library, manta_nccl, so that a CPU-only program never links CUDA.
 *
 * Rendezvous: every rank has joined in Redis before open() runs; rank 0
 * makes the NCCL unique id and publishes it as the group's "nccl_id"
 * field, the others read it. The communicator is created non-blocking
 * (ncclConfig_t.blocking = 0) so that both its creation and every
 * operation can be waited on with a deadline: past it the communicator is
 * aborted (ncclCommAbort) and the call returns ETIMEDOUT.
 *
 * Uneven sizes: NCCL's ReduceScatter and AllGather need equal slices. When
 * count % S == 0 they are used; otherwise the same result is made from S
 * ncclReduce / ncclBroadcast calls in one NCCL group, one per slice.
 *
 * Checksums: broadcast_crc copies the received buffer to the host through a
 * pinned staging buffer, one chunk at a time, computes its CRC32C, and
 * compares it with the root's (itself broadcast over NCCL).
 *
 * Errors: NCCL and CUDA results are translated here and only here
 * (nccl_err, cuda_err) into MANTA_E* codes with a message naming the call.
 */
#include "manta_collective.h"
#include "manta_schema.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct nimpl {
    manta_coll_group *g;
    int rank, world, device;
    ncclComm_t comm;
    cudaStream_t stream;
    float *scratch;      /* device: barrier and CRC exchange */
    unsigned char *host; /* pinned staging for checksums */
    size_t host_len;
};

/* ---- the one translation point per library ---- */

static int cuda_err(const manta_coll_group *g, cudaError_t e, const char *what)
{
    int code = e == cudaErrorMemoryAllocation ? MANTA_ENOMEM
               : e == cudaErrorInvalidValue   ? MANTA_EINVAL
                                              : MANTA_ESYS;
    return manta_coll_fail(g, code, "CUDA %s: %s (%s)", what, cudaGetErrorString(e),
                           cudaGetErrorName(e));
}

static int nccl_err(const manta_coll_group *g, ncclResult_t r, const char *what)
{
    int code = r == ncclInvalidArgument || r == ncclInvalidUsage ? MANTA_EINVAL
               : r == ncclRemoteError                            ? MANTA_EDIED
                                                                 : MANTA_ESYS;
    return manta_coll_fail(g, code, "NCCL %s: %s", what, ncclGetErrorString(r));
}

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cuda_err(n->g, e_, what);                                    \
    } while (0)

static void nap(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* Wait until the communicator has no call in progress (non-blocking mode). */
static int comm_settle(nimpl *n, int64_t deadline, const char *what)
{
    for (;;) {
        ncclResult_t st;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &st);
        if (r != ncclSuccess) return nccl_err(n->g, r, "ncclCommGetAsyncError");
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) return nccl_err(n->g, st, what);
        if (manta_coll_now_ms() > deadline) {
            ncclCommAbort(n->comm);
            n->comm = NULL;
            return manta_coll_fail(n->g, MANTA_ETIMEDOUT,
                                   "NCCL %s did not finish before the deadline; communicator "
                                   "aborted",
                                   what);
        }
        nap();
    }
}

/* Wait for the stream, watching NCCL's asynchronous errors and the deadline. */
static int stream_wait(nimpl *n, int64_t deadline, const char *what)
{
    int rc = comm_settle(n, deadline, what);
    if (rc) return rc;
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return cuda_err(n->g, e, what);
        ncclResult_t st;
        if (ncclCommGetAsyncError(n->comm, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress)
            return nccl_err(n->g, st, what);
        if (manta_coll_now_ms() > deadline) {
            ncclCommAbort(n->comm);
            n->comm = NULL;
            return manta_coll_fail(n->g, MANTA_ETIMEDOUT,
                                   "NCCL %s not done before the deadline (a rank missing?); "
                                   "communicator aborted",
                                   what);
        }
        nap();
    }
}

/* A call on a non-blocking communicator returns ncclInProgress while it is
 * being enqueued: that is not an error. */
static int launched(const nimpl *n, ncclResult_t r, const char *what)
{
    return r == ncclSuccess || r == ncclInProgress ? 0 : nccl_err(n->g, r, what);
}

static void n_close(void *impl)
{
    nimpl *n = (nimpl *)impl;
    if (!n) return;
    if (n->comm) ncclCommDestroy(n->comm);
    if (n->stream) cudaStreamDestroy(n->stream);
    if (n->scratch) cudaFree(n->scratch);
    if (n->host) cudaFreeHost(n->host);
    free(n);
}

static int n_open(manta_coll_group *g, void **impl)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess) return cuda_err(g, e, "cudaGetDeviceCount");
    if (ndev == 0) return manta_coll_fail(g, MANTA_ESYS, "NCCL backend: no CUDA device");
    nimpl *n = (nimpl *)calloc(1, sizeof *n);
    if (!n) return manta_coll_fail(g, MANTA_ENOMEM, "NCCL backend: out of memory");
    n->g = g, n->rank = manta_coll_rank(g), n->world = manta_coll_world(g);
    int rc = 0;
    int64_t deadline = manta_coll_now_ms() + 60000;
    ncclUniqueId id;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    if (manta_coll_cuda_device(g) > 0) {
        if ((e = cudaSetDevice(manta_coll_cuda_device(g) - 1)) != cudaSuccess) {
            rc = cuda_err(n->g, e, "cudaSetDevice");
            goto fail;
        }
    }
    cudaGetDevice(&n->device);
    if ((e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        rc = cuda_err(n->g, e, "cudaStreamCreate");
        goto fail;
    }
    if ((e = cudaMalloc((void **)&n->scratch, 2 * sizeof(float))) != cudaSuccess) {
        rc = cuda_err(n->g, e, "cudaMalloc");
        goto fail;
    }
    if (n->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            rc = nccl_err(n->g, r, "ncclGetUniqueId");
            goto fail;
        }
        if ((rc = manta_coll_put(g, MANTA_REG_COLL_NCCL, &id, sizeof id)) != 0) goto fail;
    } else if ((rc = manta_coll_get(g, MANTA_REG_COLL_NCCL, &id, sizeof id, deadline)) != 0) {
        goto fail;
    }
    {
        ncclResult_t r = ncclCommInitRankConfig(&n->comm, n->world, id, n->rank, &cfg);
        if ((rc = launched(n, r, "ncclCommInitRankConfig")) != 0) goto fail;
        if ((rc = comm_settle(n, deadline, "ncclCommInitRank")) != 0) goto fail;
    }
    *impl = n;
    return 0;
fail:
    n_close(n);
    return rc;
}

static int n_broadcast(void *impl, void *buf, size_t bytes, int root, int check, uint32_t *crc,
                       int64_t deadline)
{
    nimpl *n = (nimpl *)impl;
    int rc = launched(n, ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->comm, n->stream),
                      "ncclBroadcast");
    if (rc == 0) rc = stream_wait(n, deadline, "broadcast");
    if (rc || !check) return rc;
    /* CRC32C of what this rank now holds, through pinned chunks. */
    size_t ch = manta_coll_chunk_bytes(n->g);
    if (n->host_len < ch) {
        if (n->host) cudaFreeHost(n->host);
        n->host = NULL, n->host_len = 0;
        CUDA_TRY(cudaMallocHost((void **)&n->host, ch), "cudaMallocHost");
        n->host_len = ch;
    }
    uint32_t c = 0;
    for (size_t off = 0; off < bytes; off += ch) {
        size_t len = bytes - off < ch ? bytes - off : ch;
        CUDA_TRY(cudaMemcpyAsync(n->host, (const char *)buf + off, len, cudaMemcpyDeviceToHost,
                                 n->stream),
                 "cudaMemcpyAsync");
        CUDA_TRY(cudaStreamSynchronize(n->stream), "cudaStreamSynchronize");
        c = manta_crc32c(c, n->host, len);
    }
    /* The root's CRC travels to every rank; each compares it with its own. */
    uint32_t mine[2] = {c, 0};
    CUDA_TRY(cudaMemcpyAsync(n->scratch, mine, sizeof mine, cudaMemcpyHostToDevice, n->stream),
             "cudaMemcpyAsync");
    rc = launched(
        n, ncclBroadcast(n->scratch, n->scratch + 1, 1, ncclUint32, root, n->comm, n->stream),
        "ncclBroadcast");
    if (rc == 0) rc = stream_wait(n, deadline, "broadcast checksum");
    if (rc) return rc;
    CUDA_TRY(cudaMemcpy(mine, n->scratch, sizeof mine, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (mine[1] != c)
        return manta_coll_fail(n->g, MANTA_EPROTO,
                               "broadcast from rank %d: checksum mismatch (crc32c %08x here, "
                               "%08x at the root)",
                               root, c, mine[1]);
    if (crc) *crc = c;
    return 0;
}

static int n_all_reduce(void *impl, float *buf, size_t count, int64_t deadline)
{
    nimpl *n = (nimpl *)impl;
    int rc = launched(n, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, n->comm, n->stream),
                      "ncclAllReduce");
    return rc ? rc : stream_wait(n, deadline, "all_reduce");
}

static int n_reduce_scatter(void *impl, const float *send, float *recv, size_t count,
                            int64_t deadline)
{
    nimpl *n = (nimpl *)impl;
    int rc = 0;
    if (count % (size_t)n->world == 0) {
        rc = launched(n,
                      ncclReduceScatter(send, recv, count / (size_t)n->world, ncclFloat32, ncclSum,
                                        n->comm, n->stream),
                      "ncclReduceScatter");
    } else {
        /* uneven: one reduce per slice, to its owner */
        rc = launched(n, ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < n->world && rc == 0; r++) {
            size_t off, len;
            manta_coll_slice(count, n->world, r, &off, &len);
            if (len == 0) continue;
            void *dst = r == n->rank ? (void *)recv : (void *)(send + off);
            rc = launched(
                n, ncclReduce(send + off, dst, len, ncclFloat32, ncclSum, r, n->comm, n->stream),
                "ncclReduce");
        }
        int rc2 = launched(n, ncclGroupEnd(), "ncclGroupEnd");
        if (rc == 0) rc = rc2;
    }
    return rc ? rc : stream_wait(n, deadline, "reduce_scatter");
}

static int n_all_gather(void *impl, const void *send, void *recv, size_t count, size_t elem,
                        int64_t deadline)
{
    nimpl *n = (nimpl *)impl;
    ncclDataType_t t = elem == 1 ? ncclUint8 : ncclFloat32;
    int rc = 0;
    if (count % (size_t)n->world == 0) {
        rc = launched(n, ncclAllGather(send, recv, count / (size_t)n->world, t, n->comm, n->stream),
                      "ncclAllGather");
    } else {
        /* uneven: every owner broadcasts its slice into place */
        rc = launched(n, ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < n->world && rc == 0; r++) {
            size_t off, len;
            manta_coll_slice(count, n->world, r, &off, &len);
            if (len == 0) continue;
            char *dst = (char *)recv + off * elem;
            const void *src = r == n->rank ? send : dst;
            rc = launched(n, ncclBroadcast(src, dst, len, t, r, n->comm, n->stream),
                          "ncclBroadcast");
        }
        int rc2 = launched(n, ncclGroupEnd(), "ncclGroupEnd");
        if (rc == 0) rc = rc2;
    }
    return rc ? rc : stream_wait(n, deadline, "all_gather");
}

static int n_barrier(void *impl, int64_t deadline)
{
    nimpl *n = (nimpl *)impl;
    int rc = launched(
        n, ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat32, ncclSum, n->comm, n->stream),
        "ncclAllReduce");
    return rc ? rc : stream_wait(n, deadline, "barrier");
}

static const manta_coll_backend nccl_backend = {
    "nccl", n_open, n_close, n_broadcast, n_all_reduce, n_reduce_scatter, n_all_gather, n_barrier,
};

extern "C" const manta_coll_backend *manta_coll_nccl(void)
{
    return &nccl_backend;
}
