/*
 * manta_collective.h -- group collectives: broadcast, all-reduce,
 * reduce-scatter, all-gather and barrier over a fixed set of processes.
 *
 * A group is S processes (typically the actors of one role: S learner
 * shards, or a learner and the rollout actors it feeds weights to). Every
 * member calls manta_coll_create() with the same group name and world size
 * and its own rank 0..S-1; the members meet through Redis under the job's
 * namespace (manta:JOB:coll:NAME), each publishing its data endpoint (and,
 * for NCCL, rank 0 its unique id), and return once every rank has joined and
 * every pair of ranks has exchanged a hello on the data plane.
 *
 * Two backends sit behind one const table of functions (manta_coll_backend):
 *
 *   - ZeroMQ (the default, manta_coll_zmq()): host memory. Each rank binds
 *     a PULL socket of its own (ipc:// under the job's run folder, or tcp://
 *     on the ctx's host, following the ctx's transport) and connects a PUSH
 *     socket to every peer. This is a data plane separate from the actor's
 *     mailbox, with a private ZeroMQ context and I/O threads. Large tensors
 *     travel in chunks (4 MiB by default) sent without a copy
 *     (zmq_msg_init_data on the caller's buffer).
 *   - NCCL (manta_coll_nccl(), in the separate library manta_nccl, built
 *     when nvcc exists): every pointer is a DEVICE pointer on the CUDA device
 *     current at manta_coll_create() (or options.cuda_device).
 *
 * Algorithms (ZeroMQ): reduce-scatter and all-gather are rings (each rank
 * sends and receives (S-1)/S of the data: bandwidth-optimal); all-reduce is
 * a ring reduce-scatter followed by a ring all-gather, or a direct exchange
 * when the tensor is small (<= 64 KiB); broadcast is a chunked pipeline
 * along the chain root, root+1, ... (every link carries the bytes once, so
 * the time is close to one transfer whatever S), or direct when small.
 * Sums are done in a fixed order per element, and every rank ends with the
 * same bits.
 *
 * Uneven sizes: reduce-scatter and all-gather split `count` elements into S
 * contiguous slices; rank r owns manta_coll_slice(count, S, r): the first
 * count % S ranks get count / S + 1 elements, the others count / S (a slice
 * may be empty).
 *
 * Blocking: every operation blocks the calling thread until it is done on
 * this rank, or the timeout passes. The actor's mailbox is NOT served during
 * a collective (calls to the actor queue in its mailbox and are served when
 * the method returns): a collective is a bulk-synchronous step, and serving
 * other calls in the middle of one would let a nested call start a second
 * collective on the same group. Keep timeouts shorter than the callers'
 * call deadlines.
 *
 * Errors: 0 or a negative MANTA_E* code (manta.h) with manta_last_error()
 * naming what failed, always as "group 'NAME' rank R: ...": ETIMEDOUT names
 * the ranks that did not join or did not send; EPROTO a checksum mismatch or
 * a rank running a different operation; EINVAL a bad argument; EREDIS the
 * rendezvous; EZMQ, or ESYS for CUDA and NCCL failures (the message names
 * the library and the call); EDIED a remote NCCL rank's failure.
 * After a failed operation the group is broken: every later call returns
 * ECLOSED; free it and create a new group (a new name, e.g. with an epoch).
 *
 * Threads: a group belongs to the thread that created it (like its ctx).
 * Memory layout: ranks must share endianness (they exchange raw floats).
 */
#ifndef MANTA_COLLECTIVE_H
#define MANTA_COLLECTIVE_H

#include "manta.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct manta_coll_group manta_coll_group;
typedef struct manta_coll_backend manta_coll_backend;

typedef enum manta_coll_dtype {
    MANTA_COLL_FLOAT32 = 0, /* reductions sum float32 */
    MANTA_COLL_BYTE = 1,    /* broadcast and all-gather only */
} manta_coll_dtype;

typedef struct manta_coll_options {
    const manta_coll_backend *backend; /* NULL: manta_coll_zmq() */
    int timeout_ms;                    /* rendezvous deadline; default 30000 */
    size_t chunk_bytes;                /* transfer unit; default 4 MiB, at least 4 KiB */
    int cuda_device;                   /* NCCL: device + 1 (0: keep the current device) */
} manta_coll_options;

/* Join group `name` (1..64 of [A-Za-z0-9._-]) of `world` ranks as `rank`,
 * in ctx m's job. Blocks until every rank has joined and greeted every
 * other, or options.timeout_ms passes: then ETIMEDOUT, with a message such
 * as "group 'g': ranks 2, 3 of 4 did not join within 5000 ms". EINVAL if
 * another member announced a different world size. The group's Redis
 * fields are removed once all ranks have joined, so a name may be used
 * again after every member freed its group. *out is owned by the caller
 * (manta_coll_free). The ctx must outlive the group. */
int manta_coll_create(manta_ctx *m, const char *name, int world, int rank,
                      const manta_coll_options *o, manta_coll_group **out);
/* Leave the group: close its sockets (or NCCL communicator). NULL ok. */
void manta_coll_free(manta_coll_group *g);

int manta_coll_rank(const manta_coll_group *g);
int manta_coll_world(const manta_coll_group *g);
const char *manta_coll_backend_name(const manta_coll_group *g);

/* The slice of `count` elements that rank `rank` of `world` owns. */
void manta_coll_slice(size_t count, int world, int rank, size_t *offset, size_t *len);

/* Every rank's `buf` (count elements of dt) becomes root's. With dt BYTE,
 * count is in bytes. */
int manta_coll_broadcast(manta_coll_group *g, void *buf, size_t count, manta_coll_dtype dt,
                         int root, int timeout_ms);
/* Broadcast with integrity: every chunk carries the CRC32C of the bytes
 * sent so far and every receiver checks it (EPROTO on a mismatch, naming
 * the chunk and the sender). On success *crc (may be NULL) is the CRC32C
 * of the whole buffer, the same on every rank: compare it with the one in
 * the policy version registry. */
int manta_coll_broadcast_crc(manta_coll_group *g, void *buf, size_t bytes, int root, uint32_t *crc,
                             int timeout_ms);
/* In place: buf[i] = sum over ranks of buf[i]. */
int manta_coll_all_reduce(manta_coll_group *g, float *buf, size_t count, int timeout_ms);
/* send: count floats on every rank. recv: this rank's slice (see
 * manta_coll_slice) of the element-wise sum. recv may point into send at
 * this rank's offset; otherwise they must not overlap. */
int manta_coll_reduce_scatter(manta_coll_group *g, const float *send, float *recv, size_t count,
                              int timeout_ms);
/* send: this rank's slice of `count` elements (see manta_coll_slice);
 * recv: all count elements, rank r's slice at its offset. send may point
 * into recv at this rank's offset. */
int manta_coll_all_gather(manta_coll_group *g, const void *send, void *recv, size_t count,
                          manta_coll_dtype dt, int timeout_ms);
/* Return once every rank has entered the barrier. */
int manta_coll_barrier(manta_coll_group *g, int timeout_ms);

/* CRC32C (Castagnoli) of len bytes, continuing from crc (0 to start); uses
 * the SSE4.2 instruction when the CPU has it. crc32c("123456789") is
 * 0xe3069283. Thread-safe. */
uint32_t manta_crc32c(uint32_t crc, const void *data, size_t len);

/* ---- Backends: a const table of functions --------------------------------
 *
 * open() runs after the Redis rendezvous of presence (every rank has
 * published its fields); it makes the backend's state (*impl). Every
 * operation gets an absolute deadline on the monotonic clock
 * (manta_coll_now_ms) and sizes in bytes or elements as named; it returns
 * 0 or a MANTA_E* code after calling manta_coll_fail. */
struct manta_coll_backend {
    const char *name;
    int (*open)(manta_coll_group *g, void **impl);
    void (*close)(void *impl);
    int (*broadcast)(void *impl, void *buf, size_t bytes, int root, int check, uint32_t *crc,
                     int64_t deadline);
    int (*all_reduce)(void *impl, float *buf, size_t count, int64_t deadline);
    int (*reduce_scatter)(void *impl, const float *send, float *recv, size_t count,
                          int64_t deadline);
    int (*all_gather)(void *impl, const void *send, void *recv, size_t count, size_t elem,
                      int64_t deadline);
    int (*barrier)(void *impl, int64_t deadline);
};

/* The ZeroMQ backend (always there). */
const manta_coll_backend *manta_coll_zmq(void);
/* The NCCL backend: defined in the library manta_nccl (link it; present
 * only in builds with CUDA). Pointers given to its groups are device
 * pointers. */
const manta_coll_backend *manta_coll_nccl(void);

/* For backends and the front end: set the error message (manta_last_error)
 * to "group 'NAME' rank R: " and the formatted text, and return code. g NULL:
 * the text alone (no group exists yet). */
int manta_coll_fail(const manta_coll_group *g, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int64_t manta_coll_now_ms(void);
size_t manta_coll_chunk_bytes(const manta_coll_group *g);
int manta_coll_cuda_device(const manta_coll_group *g); /* options.cuda_device */
const char *manta_coll_name(const manta_coll_group *g);
/* Publish a binary value under this group's rendezvous key (field), or
 * wait until `field` is there (up to deadline) and copy it into out
 * (exactly len bytes expected; EPROTO otherwise). Used for NCCL's id. */
int manta_coll_put(manta_coll_group *g, const char *field, const void *val, size_t len);
int manta_coll_get(manta_coll_group *g, const char *field, void *out, size_t len, int64_t deadline);

#ifdef __cplusplus
}
#endif
#endif
