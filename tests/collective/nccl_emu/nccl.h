/*
 * nccl.h of the NCCL emulator: the part of NCCL's API that runtime/collective/collective_nccl.cu
 * uses, over POSIX shared memory and the CPU, so that the NCCL back-end is tested (and the
 * emulated `manta` runs collectives) without a GPU.  Goes with the CUDA emulator
 * (tests/kernels/cuda_emu): device pointers are host pointers, streams are its streams.
 *
 * What it models (nccl_emu.cpp):
 *   - a communicator is a shared-memory segment that its ranks map, in one process (threads)
 *     or many: the unique id carries the segment's random name (/manta-nccl-emu-<32 hex>);
 *     the segment is unlinked once every rank mapped it, or when a rank leaves (aborts or
 *     destroys its communicator) before that, so nothing stays in /dev/shm unless a process
 *     dies before all ranks joined and no other rank leaves;
 *   - each communicator has a worker thread that runs its queued operations in order; an
 *     operation keeps its stream "not ready" (cudaStreamQuery: cudaErrorNotReady) until the
 *     worker finished it; calls between ncclGroupStart and ncclGroupEnd are queued at
 *     ncclGroupEnd, in order (every rank must issue the same sequence, as with NCCL);
 *   - data moves through the segment in chunks (every rank has a slot of 256 KiB: write,
 *     barrier, read, barrier); sums are done in rank order, so every rank gets the same bits;
 *   - creation with ncclConfig_t.blocking = 0 returns ncclInProgress and the communicator's
 *     asynchronous error stays ncclInProgress until every rank joined; the barriers poll with
 *     short sleeps and give up when the communicator is aborted or destroyed, so
 *     ncclCommAbort frees a rank stuck waiting for a missing peer at once;
 *   - checks as NCCL makes them where cheap: a NULL communicator or output pointer, rank or
 *     root out of range, a config without NCCL_CONFIG_INITIALIZER (ncclInvalidArgument);
 *     ranks that disagree on the world size, a rank joining twice, ranks calling different
 *     operations (kind, type, count, root; the communicator fails with ncclInvalidUsage).
 * What it does not model: timing and bandwidth, any reduction but ncclSum on ncclFloat32,
 * types other than ncclInt8/ncclUint8/ncclInt32/ncclUint32/ncclFloat32, more than 16 ranks,
 * a failure of a remote rank (a rank that dies leaves its peers waiting until they abort, as a
 * hung peer does; no ncclRemoteError), ordering between two communicators on one stream, and
 * ncclCommDestroy waiting for queued work (here it abandons it, as ncclCommAbort).
 */
#ifndef MANTA_NCCL_EMU_H
#define MANTA_NCCL_EMU_H

#include <limits.h>
#include <stddef.h>

#include "cuda_runtime_api.h"

#define MANTA_NCCL_EMU 1

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION(X, Y, Z)                                                                      \
    (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL

typedef struct ncclConfig_v22800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                    \
    {                                                                                              \
        sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),        \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                           \
    }

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
const char *ncclGetErrorString(ncclResult_t result);

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif
#endif
