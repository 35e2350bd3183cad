/*
 * nccl_emu.cpp - the NCCL emulator behind nccl.h (read its head for what it models).
 *
 * The segment: a header (magic, world size, ranks joined, ranks in it, whether the
 * name is unlinked; per rank: barriers passed, present, the operation it runs) and one slot of
 * SLOT bytes per rank.  Its size is fixed (SEG_BYTES) and every bound below comes from this
 * rank's own arguments, never from a word a peer wrote: a peer's operation is only compared.
 *
 * A barrier: rank r stores k (its k-th barrier) in its counter, then waits until every rank's
 * counter reaches k.  Counters only grow, so nothing is reset.  An operation, per chunk: write
 * this rank's part into its slot, barrier, read or sum the slots (in rank order), barrier.  The
 * first barrier of an operation also checks that every rank runs the same one.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_runtime.h"
#include "nccl.h"

namespace
{

const int MAX_RANKS = 16;
const size_t SLOT = (size_t)256 << 10;
const uint64_t SEG_MAGIC = 0x554d454c43434e4dull; /* "MNCCLEMU" */
const char ID_MAGIC[8] = {'M', 'N', 'C', 'C', 'L', 'E', 'M', 'U'};
const char NAME_PREFIX[] = "/manta-nccl-emu-";

enum kind : uint32_t { K_BCAST = 1, K_REDUCE, K_ALL_REDUCE, K_REDUCE_SCATTER, K_ALL_GATHER };

/* what a rank runs: every rank must run the same */
struct desc {
    uint32_t kind, dtype, redop;
    int32_t root;
    uint64_t count, seq;
};

struct alignas(64) rank_area {
    uint64_t arrive;  /* barriers passed (atomic) */
    uint32_t present; /* joined (atomic) */
    uint32_t pad;
    desc d; /* written before the operation's first barrier, read after it */
};

struct segment {
    uint64_t magic;   /* 0 in a new segment, then SEG_MAGIC */
    int32_t nranks;   /* 0, then the first rank's world size */
    int32_t joined;   /* ranks that joined */
    int32_t refs;     /* ranks that joined and have not left */
    int32_t unlinked; /* the name is gone */
    rank_area r[MAX_RANKS];
};
const size_t DATA_OFF = (sizeof(segment) + 4095) & ~(size_t)4095;
const size_t SEG_BYTES = DATA_OFF + (size_t)MAX_RANKS * SLOT;

template <class T> T ld(const T *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <class T> void st(T *p, T v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
template <class T> bool cas(T *p, T *expect, T v)
{
    return __atomic_compare_exchange_n(p, expect, v, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

struct op {
    kind k;
    const void *send;
    void *recv;
    size_t count; /* elements: per rank for reduce-scatter and all-gather */
    ncclDataType_t dt;
    ncclRedOp_t redop;
    int root;
    cudaStream_t stream;
};

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 0; /* not emulated */
    }
}

/* short waits: yield first, then sleep 50 us; slow: sleep 1 ms (the rendezvous) */
void nap(unsigned &i, bool slow = false)
{
    if (!slow && i < 32) {
        i++;
        sched_yield();
        return;
    }
    struct timespec ts = {0, slow ? 1000000L : 50000L};
    nanosleep(&ts, NULL);
}

} // namespace

struct ncclComm {
    int rank = 0, nranks = 0;
    char name[NCCL_UNIQUE_ID_BYTES] = {0};
    segment *seg = nullptr;
    unsigned char *data = nullptr;
    std::atomic<ncclResult_t> async{ncclInProgress};
    std::atomic<bool> stop{false};
    std::mutex m;
    std::condition_variable cv;
    std::deque<op> q;
    std::thread worker;
    uint64_t barriers = 0, seq = 0; /* the worker's */
};

namespace
{

/* calls between ncclGroupStart and ncclGroupEnd, per thread */
thread_local int group_depth;
thread_local std::vector<std::pair<ncclComm *, op>> group_ops;

unsigned char *slot(ncclComm *c, int r)
{
    return c->data + (size_t)r * SLOT;
}

void unlink_once(segment *s, const char *name)
{
    int32_t zero = 0;
    if (cas(&s->unlinked, &zero, (int32_t)1)) shm_unlink(name);
}

bool barrier(ncclComm *c)
{
    uint64_t k = ++c->barriers;
    st(&c->seg->r[c->rank].arrive, k);
    for (int r = 0; r < c->nranks; r++) {
        unsigned i = 0;
        while (ld(&c->seg->r[r].arrive) < k) {
            if (c->stop.load(std::memory_order_relaxed)) return false;
            nap(i);
        }
    }
    return true;
}

/* the first barrier of an operation: also, does every rank run this one? */
ncclResult_t first_barrier(ncclComm *c, const desc &d)
{
    if (!barrier(c)) return ncclSystemError;
    for (int r = 0; r < c->nranks; r++)
        if (memcmp(&c->seg->r[r].d, &c->seg->r[0].d, sizeof d) != 0) {
            fprintf(stderr,
                    "nccl emulator: rank %d: ranks run different operations (operation %llu)\n",
                    c->rank, (unsigned long long)d.seq);
            return ncclInvalidUsage;
        }
    return ncclSuccess;
}

/* out[0, n) = src[0][i] + src[1][i] + ... in rank order */
void sum_ranks(float *out, unsigned char *const *src, int nsrc, size_t n)
{
    memcpy(out, src[0], n * sizeof(float));
    for (int r = 1; r < nsrc; r++) {
        const float *p = (const float *)src[r];
        for (size_t i = 0; i < n; i++) out[i] += p[i];
    }
}

ncclResult_t run(ncclComm *c, const op &o)
{
    const size_t es = type_size(o.dt);
    const int R = c->nranks, me = c->rank;
    desc d = {o.k, (uint32_t)o.dt, (uint32_t)o.redop, o.root, o.count, c->seq++};
    memcpy(&c->seg->r[me].d, &d, sizeof d);
    /* elements per chunk: the slot, or a share of it per destination (reduce-scatter) */
    size_t ce = (o.k == K_REDUCE_SCATTER ? SLOT / (size_t)R : SLOT) / es;
    size_t nch = o.count == 0 ? 1 : (o.count + ce - 1) / ce;
    const unsigned char *send = (const unsigned char *)o.send;
    unsigned char *recv = (unsigned char *)o.recv;
    unsigned char *srcs[MAX_RANKS];
    for (size_t ch = 0; ch < nch; ch++) {
        size_t off = ch * ce, len = o.count - off < ce ? o.count - off : ce, b = len * es;
        /* this rank's part into its slot */
        switch (o.k) {
        case K_BCAST:
            if (me == o.root) memcpy(slot(c, me), send + off * es, b);
            break;
        case K_REDUCE:
        case K_ALL_REDUCE:
        case K_ALL_GATHER:
            memcpy(slot(c, me), send + off * es, b);
            break;
        case K_REDUCE_SCATTER:
            for (int t = 0; t < R; t++)
                memcpy(slot(c, me) + (size_t)t * ce * es, send + ((size_t)t * o.count + off) * es,
                       b);
            break;
        }
        ncclResult_t rc = ch == 0      ? first_barrier(c, d)
                          : barrier(c) ? ncclSuccess
                                       : ncclSystemError;
        if (rc != ncclSuccess) return rc;
        /* read the slots */
        switch (o.k) {
        case K_BCAST:
            if (me != o.root)
                memcpy(recv + off * es, slot(c, o.root), b);
            else if (recv != send)
                memmove(recv + off * es, send + off * es, b);
            break;
        case K_REDUCE:
        case K_ALL_REDUCE:
            if (o.k == K_ALL_REDUCE || me == o.root) {
                for (int r = 0; r < R; r++) srcs[r] = slot(c, r);
                sum_ranks((float *)(recv + off * es), srcs, R, len);
            }
            break;
        case K_REDUCE_SCATTER:
            for (int r = 0; r < R; r++) srcs[r] = slot(c, r) + (size_t)me * ce * es;
            sum_ranks((float *)(recv + off * es), srcs, R, len);
            break;
        case K_ALL_GATHER:
            for (int r = 0; r < R; r++)
                memmove(recv + ((size_t)r * o.count + off) * es, slot(c, r), b);
            break;
        }
        if (!barrier(c)) return ncclSystemError;
    }
    return ncclSuccess;
}

void work(ncclComm *c)
{
    /* the rendezvous: every rank has mapped the segment, then its name can go */
    unsigned i = 0;
    while (ld(&c->seg->joined) < c->nranks && !c->stop.load()) nap(i, true);
    if (!c->stop.load()) {
        unlink_once(c->seg, c->name);
        c->async.store(ncclSuccess);
    }
    for (;;) {
        op o;
        {
            std::unique_lock<std::mutex> g(c->m);
            c->cv.wait(g, [c] { return !c->q.empty() || c->stop.load(); });
            if (c->q.empty()) return;
            o = c->q.front();
            c->q.pop_front();
        }
        if (!c->stop.load() && c->async.load() == ncclSuccess) {
            ncclResult_t r = run(c, o);
            if (r != ncclSuccess && !c->stop.load()) c->async.store(r);
        }
        mk_emu::stream_release(o.stream);
    }
}

void push(ncclComm *c, const op &o)
{
    std::lock_guard<std::mutex> g(c->m);
    c->q.push_back(o);
    c->cv.notify_one();
}

/* stop the worker (a barrier it waits in gives up), drop queued work, leave the segment */
void leave(ncclComm *c)
{
    for (size_t k = 0; k < group_ops.size();) {
        if (group_ops[k].first == c) {
            mk_emu::stream_release(group_ops[k].second.stream);
            group_ops.erase(group_ops.begin() + (long)k);
        } else {
            k++;
        }
    }
    {
        std::lock_guard<std::mutex> g(c->m);
        c->stop.store(true);
        c->cv.notify_all();
    }
    if (c->worker.joinable()) c->worker.join();
    /* a communicator a rank has left can never complete: a rank that comes later makes a
     * segment of its own (and times out) rather than joining this one */
    __atomic_sub_fetch(&c->seg->refs, 1, __ATOMIC_ACQ_REL);
    unlink_once(c->seg, c->name);
    munmap(c->seg, SEG_BYTES);
    delete c;
}

ncclResult_t enqueue(ncclComm *c, const op &o)
{
    if (!c) return ncclInvalidArgument;
    ncclResult_t a = c->async.load();
    if (a != ncclSuccess && a != ncclInProgress) return a;
    size_t es = type_size(o.dt);
    if (!es) return ncclInvalidArgument;
    if (o.root < 0 || o.root >= c->nranks) return ncclInvalidArgument;
    bool reduces = o.k == K_REDUCE || o.k == K_ALL_REDUCE || o.k == K_REDUCE_SCATTER;
    if (reduces && (o.redop != ncclSum || o.dt != ncclFloat32)) return ncclInvalidArgument;
    if (o.count > SIZE_MAX / es / (size_t)c->nranks) return ncclInvalidArgument;
    if (o.count) {
        bool sends = o.k != K_BCAST || c->rank == o.root;
        bool receives = o.k != K_REDUCE || c->rank == o.root;
        if ((sends && !o.send) || (receives && !o.recv)) return ncclInvalidArgument;
    }
    if (!mk_emu::stream_hold(o.stream)) return ncclInvalidArgument;
    if (group_depth > 0)
        group_ops.emplace_back(c, o);
    else
        push(c, o);
    return ncclSuccess;
}

} // namespace

/* ---- the API --------------------------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id) return ncclInvalidArgument;
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) return ncclSystemError;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC);
    char *p = id->internal + sizeof ID_MAGIC;
    p += snprintf(p, 40, "%s", NAME_PREFIX);
    for (unsigned char x : rnd) p += snprintf(p, 3, "%02x", x);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg)
{
    if (!out) return ncclInvalidArgument;
    *out = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) {
        fprintf(stderr, "nccl emulator: rank %d of %d: out of range (at most %d ranks)\n", rank,
                nranks, MAX_RANKS);
        return ncclInvalidArgument;
    }
    bool blocking = true;
    if (cfg) {
        if (cfg->magic != 0xcafebeef || cfg->size < offsetof(ncclConfig_t, cgaClusterSize))
            return ncclInvalidArgument; /* not from NCCL_CONFIG_INITIALIZER */
        if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) blocking = cfg->blocking != 0;
    }
    const char *name = id.internal + sizeof ID_MAGIC;
    size_t room = sizeof id.internal - sizeof ID_MAGIC;
    if (memcmp(id.internal, ID_MAGIC, sizeof ID_MAGIC) != 0 || !memchr(name, 0, room) ||
        strncmp(name, NAME_PREFIX, sizeof NAME_PREFIX - 1) != 0 || strchr(name + 1, '/'))
        return ncclInvalidArgument; /* not an id of ncclGetUniqueId */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return ncclSystemError;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return ncclSystemError;
    }
    if ((size_t)sb.st_size > SEG_BYTES) {
        close(fd);
        return ncclInvalidUsage;
    }
    if ((size_t)sb.st_size < SEG_BYTES && ftruncate(fd, (off_t)SEG_BYTES) != 0) {
        close(fd);
        return ncclSystemError;
    }
    void *m = mmap(NULL, SEG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return ncclSystemError;
    segment *s = (segment *)m;
    uint64_t mg = 0;
    int32_t n0 = 0;
    uint32_t p0 = 0;
    ncclResult_t bad = ncclSuccess;
    if (!cas(&s->magic, &mg, SEG_MAGIC) && mg != SEG_MAGIC) {
        bad = ncclInvalidUsage;
    } else if (!cas(&s->nranks, &n0, (int32_t)nranks) && n0 != nranks) {
        fprintf(stderr, "nccl emulator: rank %d: world size %d here, %d at another rank\n", rank,
                nranks, n0);
        bad = ncclInvalidUsage;
    } else if (!cas(&s->r[rank].present, &p0, (uint32_t)1)) {
        fprintf(stderr, "nccl emulator: rank %d joined twice\n", rank);
        bad = ncclInvalidUsage;
    }
    if (bad != ncclSuccess) {
        if (ld(&s->refs) == 0) unlink_once(s, name);
        munmap(m, SEG_BYTES);
        return bad;
    }
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&s->joined, 1, __ATOMIC_ACQ_REL);
    ncclComm *c = new ncclComm;
    c->rank = rank, c->nranks = nranks, c->seg = s, c->data = (unsigned char *)m + DATA_OFF;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->worker = std::thread(work, c);
    *out = c;
    if (!blocking) return ncclInProgress;
    unsigned i = 0;
    while (c->async.load() == ncclInProgress) nap(i, true);
    return c->async.load();
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    if (!comm || !err) return ncclInvalidArgument;
    *err = comm->async.load();
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm) leave(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (comm) leave(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt,
                           int root, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(comm, op{K_BCAST, sendbuff, recvbuff, count, dt, ncclSum, root, stream});
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt,
                        ncclRedOp_t redop, int root, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(comm, op{K_REDUCE, sendbuff, recvbuff, count, dt, redop, root, stream});
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt,
                           ncclRedOp_t redop, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(comm, op{K_ALL_REDUCE, sendbuff, recvbuff, count, dt, redop, 0, stream});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t dt, ncclRedOp_t redop, ncclComm_t comm,
                               cudaStream_t stream)
{
    return enqueue(comm, op{K_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, dt, redop, 0, stream});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t dt, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(comm, op{K_ALL_GATHER, sendbuff, recvbuff, sendcount, dt, ncclSum, 0, stream});
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0) return ncclInvalidUsage;
    if (--group_depth > 0) return ncclSuccess;
    std::vector<std::pair<ncclComm *, op>> ops;
    ops.swap(group_ops);
    for (auto &x : ops) push(x.first, x.second);
    return ncclSuccess;
}
