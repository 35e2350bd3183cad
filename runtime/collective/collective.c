/*
 * collective.c -- group collectives: the rendezvous in Redis, the public
 * entry points, CRC32C, and the ZeroMQ backend.
 *
 * Rendezvous. A group's control record is the schema's collective record
 * (manta_schema.h, manta_reg_coll_*): "world" (set once, checked by every
 * member), "r.R" (rank R is here: its pid), and what the backend publishes
 * ("ep.R" for ZeroMQ, "nccl_id" for NCCL). This file issues no Redis
 * command of its own. Each member waits until every r.R is present (naming the missing
 * ranks on timeout), then opens the backend, which completes its own
 * handshake. Then each member deletes its own fields and counts itself out
 * ("done"); the last one deletes the hash, so nothing stays behind and the
 * name can serve again.
 *
 * ZeroMQ data plane. Each rank binds one PULL socket and connects one PUSH
 * socket to every peer, in a private ZeroMQ context (so collectives neither
 * share I/O threads with the mailbox nor wait behind it). Every message is
 * two frames: a 32-byte header (op, op sequence number, sender, chunk
 * index, running CRC, length) and the payload. PUSH->PULL keeps each
 * sender's order, and every rank receives a given peer's messages in the
 * order that peer sent them, so a message that arrives from another peer
 * early (a fast rank already in the next step or the next operation) waits
 * in a per-sender queue, and the header of each message is checked against
 * what this rank expects: a rank running another operation is an EPROTO,
 * not a silent mix-up.
 *
 * Zero copy. Payloads of at least ZC_MIN bytes are sent with
 * zmq_msg_init_data on the caller's buffer; a counter of such messages not
 * yet released by ZeroMQ is drained before an operation returns, since the
 * caller may then write to its buffer. Received chunks are forwarded as the
 * very message that arrived (zmq_msg_send moves it), and partial sums are
 * added into the received message in place, so the ring needs no scratch.
 * After a failure the group's sockets are closed with linger 0 and its
 * context terminated, which releases every message still queued before the
 * error is returned: ZeroMQ never reads a caller's buffer after we return.
 */
#include "manta_collective.h"
#include "manta_schema.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_CHUNK      ((size_t)4 << 20)
#define MIN_CHUNK          ((size_t)4 << 10)
/* Below this a payload is copied into the message: a zero-copy message
 * costs a callback from the I/O thread and a wait for it. */
#define ZC_MIN ((size_t)16 << 10)
/* All-reduce and broadcast up to this many bytes go direct (every rank to
 * every rank, root to every rank): one step of latency instead of S-1. */
#define DIRECT_MAX ((size_t)64 << 10)

struct manta_coll_group {
    manta_ctx *m;
    char name[72];
    int world, rank;
    int default_timeout;
    size_t chunk;
    int cuda_device;
    bool broken;
    const manta_coll_backend *be;
    void *impl;
};

/* ---- errors and helpers ---- */

int manta_coll_fail(const manta_coll_group *g, int code, const char *fmt, ...)
{
    char buf[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!g) return manta_fail(code, "%s", buf);
    return manta_fail(code, "group '%s' rank %d: %s", g->name, g->rank, buf);
}

int64_t manta_coll_now_ms(void)
{
    return manta_now_ms();
}

size_t manta_coll_chunk_bytes(const manta_coll_group *g)
{
    return g->chunk;
}

int manta_coll_cuda_device(const manta_coll_group *g)
{
    return g->cuda_device;
}

const char *manta_coll_name(const manta_coll_group *g)
{
    return g->name;
}

int manta_coll_rank(const manta_coll_group *g)
{
    return g ? g->rank : -1;
}

int manta_coll_world(const manta_coll_group *g)
{
    return g ? g->world : 0;
}

const char *manta_coll_backend_name(const manta_coll_group *g)
{
    return g && g->be ? g->be->name : "";
}

void manta_coll_slice(size_t count, int world, int rank, size_t *offset, size_t *len)
{
    size_t w = world > 0 ? (size_t)world : 1, r = rank > 0 ? (size_t)rank : 0;
    size_t base = count / w, rem = count % w;
    if (offset) *offset = r * base + (r < rem ? r : rem);
    if (len) *len = base + (r < rem ? 1 : 0);
}

/* Sleep a little while polling Redis: 1, 2, 4 ... 50 ms. */
static void backoff(int *step)
{
    struct timespec ts = {0, (long)*step * 1000000L};
    nanosleep(&ts, NULL);
    if (*step < 50) *step *= 2;
}

/* ---- CRC32C ---- */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 255];
}

/* Slicing-by-8 in software: the reference, and the path without SSE4.2. */
static uint32_t crc_soft(uint32_t c, const unsigned char *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
    while (n && ((uintptr_t)p & 7)) c = crc_table[0][(c ^ *p++) & 255] ^ (c >> 8), n--;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = crc_table[7][w & 255] ^ crc_table[6][(w >> 8) & 255] ^ crc_table[5][(w >> 16) & 255] ^
            crc_table[4][(w >> 24) & 255] ^ crc_table[3][(w >> 32) & 255] ^
            crc_table[2][(w >> 40) & 255] ^ crc_table[1][(w >> 48) & 255] ^
            crc_table[0][(w >> 56) & 255];
        p += 8, n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 255] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p,
                                                         size_t n)
{
    uint64_t c64 = c;
    while (n && ((uintptr_t)p & 7)) c64 = _mm_crc32_u8((uint32_t)c64, *p++), n--;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
        p += 8, n -= 8;
    }
    while (n--) c64 = _mm_crc32_u8((uint32_t)c64, *p++);
    return (uint32_t)c64;
}
#endif

uint32_t manta_crc32c(uint32_t crc, const void *data, size_t len)
{
    uint32_t c = ~crc;
#if defined(__x86_64__)
    /* MANTA_CRC_SOFT=1 forces the table path (tests compare the two). */
    static int hw = -1;
    if (hw < 0) hw = __builtin_cpu_supports("sse4.2") && !getenv("MANTA_CRC_SOFT");
    if (hw) return ~crc_hw(c, data, len);
#endif
    return ~crc_soft(c, data, len);
}

/* ---- rendezvous (the schema's collective records) ---- */

/* A registry failure, with the group and rank in front of the schema's
 * message (which names the key). */
static int reg_fail(const manta_coll_group *g, int rc)
{
    char why[400];
    snprintf(why, sizeof why, "%s", manta_last_error());
    return manta_coll_fail(g, rc, "%s", why);
}

int manta_coll_put(manta_coll_group *g, const char *field, const void *val, size_t len)
{
    int rc = manta_reg_coll_put(g->m, g->name, field, val, len);
    return rc ? reg_fail(g, rc) : 0;
}

int manta_coll_get(manta_coll_group *g, const char *field, void *out, size_t len, int64_t deadline)
{
    int step = 1;
    for (;;) {
        int rc = manta_reg_coll_get(g->m, g->name, field, out, len);
        if (rc != MANTA_ENOTFOUND) return rc ? reg_fail(g, rc) : 0;
        if (manta_now_ms() >= deadline)
            return manta_coll_fail(g, MANTA_ETIMEDOUT, "'%s' not published in time", field);
        backoff(&step);
    }
}

/* Poll a text field (a peer's endpoint) until it is published. */
static int get_str(manta_coll_group *g, const char *field, char *out, size_t cap, int64_t deadline,
                   int peer)
{
    int step = 1;
    for (;;) {
        int rc = manta_reg_coll_get_str(g->m, g->name, field, out, cap);
        if (rc != MANTA_ENOTFOUND) return rc ? reg_fail(g, rc) : 0;
        if (manta_now_ms() >= deadline)
            return manta_coll_fail(g, MANTA_ETIMEDOUT,
                                   "rank %d joined but never published its endpoint", peer);
        backoff(&step);
    }
}

/* Name the ranks not seen in list[cap]; returns how many are missing. */
static int missing_ranks(const char *seen, int world, char *list, size_t cap)
{
    size_t n = 0;
    int missing = 0;
    list[0] = 0;
    for (int k = 0; k < world; k++) {
        if (seen[k]) continue;
        if (n < cap - 16) n += (size_t)snprintf(list + n, cap - n, "%s%d", missing ? ", " : "", k);
        missing++;
    }
    return missing;
}

/* Wait until every rank has announced itself; name the missing ones. A
 * rank counts as joined once seen, even if it gave up since (its own
 * timeout may fall a moment before ours). */
static int wait_presence(manta_coll_group *g, int64_t deadline, int timeout_ms)
{
    int step = 1, present = 0, rc = 0;
    char *seen = calloc((unsigned)g->world, 1);
    if (!seen) return manta_coll_fail(g, MANTA_ENOMEM, "out of memory");
    for (;;) {
        rc = manta_reg_coll_seen(g->m, g->name, g->world, seen, &present);
        if (rc) {
            rc = reg_fail(g, rc);
            break;
        }
        if (present == g->world) break;
        if (manta_now_ms() >= deadline) {
            char list[256];
            int missing = missing_ranks(seen, g->world, list, sizeof list);
            rc = manta_coll_fail(g, MANTA_ETIMEDOUT, "rank%s %s of %d did not join within %d ms",
                                 missing > 1 ? "s" : "", list, g->world, timeout_ms);
            break;
        }
        backoff(&step);
    }
    free(seen);
    return rc;
}

static int valid_group_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

int manta_coll_create(manta_ctx *m, const char *name, int world, int rank,
                      const manta_coll_options *o, manta_coll_group **out)
{
    static const manta_coll_options none;
    if (out) *out = NULL;
    if (!o) o = &none;
    if (!m || !name || !out || world < 1 || world > 4096 || rank < 0 || rank >= world)
        return manta_fail(MANTA_EINVAL,
                          "group '%s' rank %d: manta_coll_create needs ctx, name, out and 0 <= "
                          "rank < world (%d) <= 4096",
                          name ? name : "(null)", rank, world);
    if (!valid_group_name(name))
        return manta_fail(MANTA_EINVAL, "group '%s' rank %d: bad name: use 1..64 of [A-Za-z0-9._-]",
                          name, rank);
    manta_coll_group *g = calloc(1, sizeof *g);
    if (!g) return manta_fail(MANTA_ENOMEM, "group '%s' rank %d: out of memory", name, rank);
    g->m = m;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->world = world, g->rank = rank;
    g->default_timeout = o->timeout_ms > 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
    g->chunk = o->chunk_bytes ? o->chunk_bytes : DEFAULT_CHUNK;
    if (g->chunk < MIN_CHUNK) g->chunk = MIN_CHUNK;
    g->chunk &= ~(size_t)7; /* whole floats, and aligned for the CRC's 8-byte steps */
    g->cuda_device = o->cuda_device;
    g->be = o->backend ? o->backend : manta_coll_zmq();
    int64_t deadline = manta_now_ms() + g->default_timeout;

    /* The world size is set by the first member; the others must agree
     * (the schema's EINVAL names both sizes). */
    int rc = manta_reg_coll_join(m, name, world, rank);
    if (rc && rc != MANTA_EINVAL) rc = reg_fail(g, rc);
    if (rc == 0) rc = wait_presence(g, deadline, g->default_timeout);
    if (rc == 0) rc = g->be->open(g, &g->impl);
    if (rc == 0) {
        /* Count this rank out; the last one deletes the record. */
        rc = manta_reg_coll_leave(m, name, rank, world, 1);
        if (rc == 0) {
            *out = g;
            return 0;
        }
        rc = reg_fail(g, rc);
        g->be->close(g->impl);
        free(g);
        return rc;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", manta_last_error());
    /* A failed join: leave, and drop the record if no rank waits in it.
     * Its own failure is secondary to the one reported. */
    (void)manta_reg_coll_leave(m, name, rank, world, 0);
    free(g);
    return manta_fail(rc, "%s", why);
}

void manta_coll_free(manta_coll_group *g)
{
    if (!g) return;
    if (g->be && g->impl) g->be->close(g->impl);
    free(g);
}

/* ---- public operations: checks, deadline, broken state ---- */

static int enter(manta_coll_group *g, const char *op, int timeout_ms, int64_t *deadline)
{
    if (!g) return manta_fail(MANTA_EINVAL, "%s: no group (NULL)", op);
    if (g->broken)
        return manta_coll_fail(g, MANTA_ECLOSED,
                               "%s: the group is broken by an earlier failure: free it", op);
    *deadline = manta_now_ms() + (timeout_ms > 0 ? timeout_ms : g->default_timeout);
    return 0;
}

static int leave(manta_coll_group *g, int rc)
{
    if (rc != 0 && rc != MANTA_EINVAL) g->broken = true;
    return rc;
}

int manta_coll_broadcast(manta_coll_group *g, void *buf, size_t count, manta_coll_dtype dt,
                         int root, int timeout_ms)
{
    int64_t dl = 0;
    int rc = enter(g, "broadcast", timeout_ms, &dl);
    if (rc) return rc;
    if ((!buf && count) || root < 0 || root >= g->world ||
        (dt != MANTA_COLL_FLOAT32 && dt != MANTA_COLL_BYTE))
        return manta_coll_fail(
            g, MANTA_EINVAL, "broadcast: bad buffer, dtype or root %d (world %d)", root, g->world);
    size_t bytes = dt == MANTA_COLL_FLOAT32 ? count * sizeof(float) : count;
    return leave(g, g->be->broadcast(g->impl, buf, bytes, root, 0, NULL, dl));
}

int manta_coll_broadcast_crc(manta_coll_group *g, void *buf, size_t bytes, int root, uint32_t *crc,
                             int timeout_ms)
{
    int64_t dl = 0;
    int rc = enter(g, "broadcast_crc", timeout_ms, &dl);
    if (rc) return rc;
    if ((!buf && bytes) || root < 0 || root >= g->world)
        return manta_coll_fail(g, MANTA_EINVAL, "broadcast_crc: bad buffer or root %d (world %d)",
                               root, g->world);
    uint32_t c = 0;
    rc = leave(g, g->be->broadcast(g->impl, buf, bytes, root, 1, &c, dl));
    if (rc == 0 && crc) *crc = c;
    return rc;
}

int manta_coll_all_reduce(manta_coll_group *g, float *buf, size_t count, int timeout_ms)
{
    int64_t dl = 0;
    int rc = enter(g, "all_reduce", timeout_ms, &dl);
    if (rc) return rc;
    if (!buf && count) return manta_coll_fail(g, MANTA_EINVAL, "all_reduce: no buffer");
    return leave(g, g->be->all_reduce(g->impl, buf, count, dl));
}

int manta_coll_reduce_scatter(manta_coll_group *g, const float *send, float *recv, size_t count,
                              int timeout_ms)
{
    int64_t dl = 0;
    int rc = enter(g, "reduce_scatter", timeout_ms, &dl);
    if (rc) return rc;
    size_t mine;
    manta_coll_slice(count, g->world, g->rank, NULL, &mine);
    if ((!send && count) || (!recv && mine))
        return manta_coll_fail(g, MANTA_EINVAL, "reduce_scatter: no send or recv buffer");
    return leave(g, g->be->reduce_scatter(g->impl, send, recv, count, dl));
}

int manta_coll_all_gather(manta_coll_group *g, const void *send, void *recv, size_t count,
                          manta_coll_dtype dt, int timeout_ms)
{
    int64_t dl = 0;
    int rc = enter(g, "all_gather", timeout_ms, &dl);
    if (rc) return rc;
    size_t mine;
    manta_coll_slice(count, g->world, g->rank, NULL, &mine);
    if ((!send && mine) || (!recv && count) || (dt != MANTA_COLL_FLOAT32 && dt != MANTA_COLL_BYTE))
        return manta_coll_fail(g, MANTA_EINVAL, "all_gather: no send or recv buffer, or bad dtype");
    size_t elem = dt == MANTA_COLL_FLOAT32 ? sizeof(float) : 1;
    return leave(g, g->be->all_gather(g->impl, send, recv, count, elem, dl));
}

int manta_coll_barrier(manta_coll_group *g, int timeout_ms)
{
    int64_t dl = 0;
    int rc = enter(g, "barrier", timeout_ms, &dl);
    if (rc) return rc;
    return leave(g, g->be->barrier(g->impl, dl));
}

/* ======================= the ZeroMQ backend ======================= */

enum { OP_HELLO = 1, OP_BCAST, OP_ALLREDUCE, OP_RSCATTER, OP_AGATHER, OP_BARRIER };
static const char *const op_names[] = {
    "?", "hello", "broadcast", "all_reduce", "reduce_scatter", "all_gather", "barrier"};

#define HDR_MAGIC 0x4c4f434du /* "MCOL" */

typedef struct hdr {
    uint32_t magic;
    uint16_t src;
    uint8_t op;
    uint8_t check; /* 1: crc holds the running CRC32C of the broadcast */
    uint32_t seq;  /* this sender's operation counter: ranks must agree */
    uint32_t chunk;
    uint32_t crc;
    uint32_t pad;
    uint64_t len;
} hdr;

typedef struct pending_msg {
    zmq_msg_t h, d;
    struct pending_msg *next;
} pending_msg;

typedef struct zimpl {
    manta_coll_group *g;
    int rank, world;
    void *zctx;
    void *pull;
    void **push; /* [world]; NULL for self */
    char endpoint[256];
    uint32_t seq;
    size_t chunk;
    pending_msg **head, **tail; /* [world]: early messages per sender */
    atomic_long zc_out;         /* zero-copy messages ZeroMQ still holds */
    int linger_ms;              /* at teardown: 0, or time for hellos to go out */
} zimpl;

static int zfail(zimpl *z, const char *what)
{
    return manta_coll_fail(z->g, MANTA_EZMQ, "%s: %s", what, zmq_strerror(zmq_errno()));
}

static void zc_free(void *data, void *hint)
{
    atomic_fetch_sub_explicit((atomic_long *)hint, 1, memory_order_release);
}

/* Close every socket at once, dropping what is queued (linger 0, or
 * linger_ms when only hellos can be queued), and end the context: once zmq_ctx_term returns ZeroMQ
 * holds no caller memory. */
static void z_teardown(zimpl *z)
{
    if (!z->zctx) return;
    int zero = 0;
    if (z->pull) zmq_setsockopt(z->pull, ZMQ_LINGER, &zero, sizeof zero), zmq_close(z->pull);
    z->pull = NULL;
    for (int i = 0; z->push && i < z->world; i++)
        if (z->push[i]) {
            zmq_setsockopt(z->push[i], ZMQ_LINGER, &z->linger_ms, sizeof z->linger_ms);
            zmq_close(z->push[i]);
            z->push[i] = NULL;
        }
    while (zmq_ctx_term(z->zctx) != 0 && zmq_errno() == EINTR) {
    }
    z->zctx = NULL;
}

static void z_close(void *impl)
{
    zimpl *z = impl;
    if (!z) return;
    z_teardown(z);
    for (int i = 0; z->head && i < z->world; i++)
        while (z->head[i]) {
            pending_msg *p = z->head[i];
            z->head[i] = p->next;
            zmq_msg_close(&p->h), zmq_msg_close(&p->d);
            free(p);
        }
    if (!strncmp(z->endpoint, "ipc://", 6)) unlink(z->endpoint + 6);
    free(z->push), free(z->head), free(z->tail);
    free(z);
}

/* A failure mid-operation: release everything ZeroMQ holds, keep rc. */
static int z_abort(zimpl *z, int rc)
{
    char why[512];
    snprintf(why, sizeof why, "%s", manta_last_error());
    z_teardown(z);
    return manta_fail(rc, "%s", why);
}

/* Send a header and payload to `to`. zc: the payload stays the caller's
 * (zero copy) until ZeroMQ releases it. */
static int z_send(zimpl *z, int to, int op, uint32_t chunk, uint32_t crc, int check,
                  const void *data, size_t len)
{
    hdr h = {HDR_MAGIC, (uint16_t)z->rank, (uint8_t)op, (uint8_t)check, z->seq, chunk, crc, 0, len};
    zmq_msg_t d;
    if (len >= ZC_MIN) {
        atomic_fetch_add_explicit(&z->zc_out, 1, memory_order_relaxed);
        if (zmq_msg_init_data(&d, (void *)data, len, zc_free, &z->zc_out) != 0) {
            atomic_fetch_sub_explicit(&z->zc_out, 1, memory_order_relaxed);
            return zfail(z, "zmq_msg_init_data");
        }
    } else {
        if (zmq_msg_init_size(&d, len) != 0) return zfail(z, "zmq_msg_init_size");
        if (len) memcpy(zmq_msg_data(&d), data, len);
    }
    if (zmq_send(z->push[to], &h, sizeof h, ZMQ_SNDMORE) != (int)sizeof h) {
        zmq_msg_close(&d);
        return zfail(z, "send header");
    }
    if (zmq_msg_send(&d, z->push[to], 0) < 0) {
        zmq_msg_close(&d);
        return zfail(z, "send payload");
    }
    return 0;
}

/* Forward a received payload message (moved, no copy) with a new header. */
static int z_forward(zimpl *z, int to, int op, uint32_t chunk, uint32_t crc, int check,
                     zmq_msg_t *d)
{
    hdr h = {HDR_MAGIC, (uint16_t)z->rank, (uint8_t)op, (uint8_t)check, z->seq, chunk, crc,
             0,         zmq_msg_size(d)};
    if (zmq_send(z->push[to], &h, sizeof h, ZMQ_SNDMORE) != (int)sizeof h)
        return zfail(z, "send header");
    if (zmq_msg_send(d, z->push[to], 0) < 0) return zfail(z, "forward payload");
    return 0;
}

static int names_op(int op)
{
    return op > 0 && op <= OP_BARRIER ? op : 0;
}

/* Receive the next message from `from`, which must be operation `op`,
 * chunk `chunk`, of this operation's sequence number. *d is initialised
 * and owned by the caller on success. *h gets the header. */
static int z_recv(zimpl *z, int from, int op, uint32_t chunk, hdr *h, zmq_msg_t *d,
                  int64_t deadline)
{
    for (;;) {
        pending_msg *p = z->head[from];
        if (p) {
            z->head[from] = p->next;
            if (!p->next) z->tail[from] = NULL;
            memcpy(h, zmq_msg_data(&p->h), sizeof *h);
            zmq_msg_close(&p->h);
            zmq_msg_init(d);
            zmq_msg_move(d, &p->d);
            zmq_msg_close(&p->d);
            free(p);
            if (h->op != op || h->seq != z->seq || h->chunk != chunk) {
                zmq_msg_close(d);
                return manta_coll_fail(
                    z->g, MANTA_EPROTO,
                    "rank %d sent %s #%u chunk %u while this rank "
                    "expected %s #%u chunk %u (ranks called different operations?)",
                    from, op_names[names_op(h->op)], h->seq, h->chunk, op_names[op], z->seq, chunk);
            }
            return 0;
        }
        int64_t left = deadline - manta_now_ms();
        if (left < 0) left = 0;
        zmq_pollitem_t it = {z->pull, 0, ZMQ_POLLIN, 0};
        int n = zmq_poll(&it, 1, (long)left);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            return zfail(z, "zmq_poll");
        }
        if (n == 0)
            return manta_coll_fail(z->g, MANTA_ETIMEDOUT,
                                   "%s #%u: no message from rank %d before the "
                                   "deadline (is it alive and in the same operation?)",
                                   op_names[op], z->seq, from);
        pending_msg *q = malloc(sizeof *q);
        if (!q) return manta_coll_fail(z->g, MANTA_ENOMEM, "out of memory");
        zmq_msg_init(&q->h);
        zmq_msg_init(&q->d);
        q->next = NULL;
        int more = 0;
        size_t ml = sizeof more;
        int bad = zmq_msg_recv(&q->h, z->pull, ZMQ_DONTWAIT) < 0;
        if (!bad) zmq_getsockopt(z->pull, ZMQ_RCVMORE, &more, &ml);
        if (!bad && more) bad = zmq_msg_recv(&q->d, z->pull, ZMQ_DONTWAIT) < 0;
        if (bad && (zmq_errno() == EAGAIN || zmq_errno() == EINTR)) {
            zmq_msg_close(&q->h), zmq_msg_close(&q->d), free(q);
            continue;
        }
        hdr hh;
        if (bad || !more || zmq_msg_size(&q->h) != sizeof hh) {
            zmq_msg_close(&q->h), zmq_msg_close(&q->d), free(q);
            if (bad) return zfail(z, "receive");
            return manta_coll_fail(z->g, MANTA_EPROTO, "malformed message on the data socket");
        }
        memcpy(&hh, zmq_msg_data(&q->h), sizeof hh);
        if (hh.magic != HDR_MAGIC || hh.src >= z->world || hh.src == z->rank ||
            hh.len != zmq_msg_size(&q->d)) {
            zmq_msg_close(&q->h), zmq_msg_close(&q->d), free(q);
            return manta_coll_fail(z->g, MANTA_EPROTO,
                                   "malformed header on the data socket "
                                   "(magic %08x, sender %u)",
                                   hh.magic, hh.src);
        }
        if (z->tail[hh.src])
            z->tail[hh.src]->next = q;
        else
            z->head[hh.src] = q;
        z->tail[hh.src] = q;
    }
}

/* Wait until ZeroMQ has released every zero-copy message of this operation. */
static int z_drain(zimpl *z, int64_t deadline)
{
    int spins = 0;
    while (atomic_load_explicit(&z->zc_out, memory_order_acquire) > 0) {
        if (manta_now_ms() > deadline)
            return manta_coll_fail(z->g, MANTA_ETIMEDOUT,
                                   "%ld chunks still unsent at the deadline (a peer "
                                   "stopped reading?)",
                                   (long)atomic_load(&z->zc_out));
        if (++spins < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}

static int z_check_len(zimpl *z, int from, const hdr *h, size_t want)
{
    if (h->len == want) return 0;
    return manta_coll_fail(z->g, MANTA_EPROTO,
                           "rank %d sent %llu bytes where this rank expected %zu "
                           "(different sizes on different ranks?)",
                           from, (unsigned long long)h->len, want);
}

/* The group's ZeroMQ state: per-peer tables and a private context. */
static int z_new(manta_coll_group *g, zimpl **out)
{
    zimpl *z = calloc(1, sizeof *z);
    *out = z;
    if (!z) return manta_coll_fail(g, MANTA_ENOMEM, "out of memory");
    z->g = g, z->rank = g->rank, z->world = g->world, z->chunk = g->chunk;
    atomic_init(&z->zc_out, 0);
    z->push = calloc((size_t)g->world, sizeof *z->push);
    z->head = calloc((size_t)g->world, sizeof *z->head);
    z->tail = calloc((size_t)g->world, sizeof *z->tail);
    if (!z->push || !z->head || !z->tail) return manta_coll_fail(g, MANTA_ENOMEM, "out of memory");
    z->zctx = zmq_ctx_new();
    if (!z->zctx) return zfail(z, "zmq_ctx_new");
    /* Two I/O threads let one rank's send to its right and receive from
     * its left proceed at once (the ring's steady state). */
    zmq_ctx_set(z->zctx, ZMQ_IO_THREADS, g->world > 2 ? 2 : 1);
    zmq_ctx_set(z->zctx, ZMQ_BLOCKY, 0);
    return 0;
}

/* Send queues are unbounded and kernel buffers large: a ring step's chunk
 * never waits behind a high-water mark, and a send never blocks. */
static const int Z_ZERO = 0, Z_BIG = 8 << 20;

/* The largest frame a member sends: a chunk, or a direct operation's whole
 * payload, plus room for what CURVE adds to each frame on the wire (the
 * limit applies to the encrypted frame: a MAC, a nonce, a command name;
 * 64 KiB is far more, as for the mailboxes). A larger frame (or a header
 * announcing one) makes ZeroMQ drop that connection before it allocates
 * anything. */
#define FRAME_SLACK ((size_t)64 << 10)
static int64_t z_max_frame(const zimpl *z)
{
    return (int64_t)((z->chunk > DIRECT_MAX ? z->chunk : DIRECT_MAX) + FRAME_SLACK);
}

/* Bind this rank's PULL socket (tcp on the ctx's host, or ipc in its run
 * folder) and publish the endpoint as ep.RANK. The socket gets the job's
 * protection (manta_secure_server): message limits, a finite receive queue
 * (senders wait, nothing is dropped: every message sent is one its receiver
 * reads within the same operation), and CURVE with a ZAP handler in this
 * group's context when the job uses CURVE, so that only the job's members
 * can connect and feed data into an operation. */
static int z_bind(zimpl *z)
{
    manta_coll_group *g = z->g;
    manta_ctx *m = g->m;
    z->pull = zmq_socket(z->zctx, ZMQ_PULL);
    if (!z->pull) return zfail(z, "zmq_socket PULL");
    zmq_setsockopt(z->pull, ZMQ_RCVBUF, &Z_BIG, sizeof Z_BIG);
    zmq_setsockopt(z->pull, ZMQ_LINGER, &Z_ZERO, sizeof Z_ZERO);
    int rc = manta_secure_server(m, z->zctx, z->pull, z_max_frame(z));
    if (rc) return manta_coll_fail(g, rc, "data socket: %s", manta_last_error());
    char bind_ep[256];
    if (!strcmp(manta_transport(m), "tcp")) {
        snprintf(bind_ep, sizeof bind_ep, "tcp://%s:*", manta_bind_host(m));
    } else {
        /* The driver made the run folder on its machine; an actor elsewhere
         * may not have. One made by someone else is refused: it would hand
         * them this socket. */
        rc = manta_private_dir(manta_run_dir(m), "run folder");
        if (rc) return manta_coll_fail(g, rc, "%s", manta_last_error());
        char hex[13] = "";
        manta_random_hex(hex, 12);
        snprintf(bind_ep, sizeof bind_ep, "ipc://%s/c%s.%d", manta_run_dir(m), hex, g->rank);
    }
    if (zmq_bind(z->pull, bind_ep) != 0) return zfail(z, bind_ep);
    size_t eplen = sizeof z->endpoint;
    zmq_getsockopt(z->pull, ZMQ_LAST_ENDPOINT, z->endpoint, &eplen);
    char field[32];
    snprintf(field, sizeof field, MANTA_REG_COLL_EP "%d", g->rank);
    return manta_coll_put(g, field, z->endpoint, strlen(z->endpoint));
}

/* Read every peer's endpoint and connect a PUSH socket to it. Everyone is
 * present (the caller waited), so endpoints come fast. */
static int z_connect_peers(zimpl *z, int64_t deadline)
{
    manta_coll_group *g = z->g;
    for (int i = 0; i < g->world; i++) {
        if (i == g->rank) continue;
        char field[32], ep[256];
        snprintf(field, sizeof field, MANTA_REG_COLL_EP "%d", i);
        int rc = get_str(g, field, ep, sizeof ep, deadline, i);
        if (rc) return rc;
        z->push[i] = zmq_socket(z->zctx, ZMQ_PUSH);
        if (!z->push[i]) return zfail(z, "zmq_socket PUSH");
        zmq_setsockopt(z->push[i], ZMQ_SNDHWM, &Z_ZERO, sizeof Z_ZERO);
        zmq_setsockopt(z->push[i], ZMQ_SNDBUF, &Z_BIG, sizeof Z_BIG);
        if ((rc = manta_secure_client(g->m, z->push[i])) != 0)
            return manta_coll_fail(g, rc, "data socket to rank %d: %s", i, manta_last_error());
        if (zmq_connect(z->push[i], ep) != 0) return zfail(z, ep);
    }
    return 0;
}

/* Hello to everyone, from everyone: proves each pair can talk (with CURVE,
 * that each peer holds the job's keys), that every rank has read every
 * endpoint (so the fields may go), and that all use the same chunk size:
 * the hello carries it, since each rank's frame limit follows from it. */
static int z_hello(zimpl *z, int64_t deadline)
{
    manta_coll_group *g = z->g;
    int rc = 0;
    uint64_t mine = z->chunk;
    for (int i = 0; i < g->world && rc == 0; i++)
        if (i != g->rank) rc = z_send(z, i, OP_HELLO, 0, 0, 0, &mine, sizeof mine);
    for (int i = 0; i < g->world && rc == 0; i++) {
        if (i == g->rank) continue;
        hdr h;
        zmq_msg_t d;
        rc = z_recv(z, i, OP_HELLO, 0, &h, &d, deadline);
        if (rc == 0) {
            uint64_t theirs = 0;
            if (zmq_msg_size(&d) == sizeof theirs) memcpy(&theirs, zmq_msg_data(&d), sizeof theirs);
            zmq_msg_close(&d);
            /* Our hellos must still reach the others, so that they fail
             * the same way instead of waiting for theirs: they hold no
             * caller memory (copied), so the teardown may linger on them. */
            if (theirs != mine) z->linger_ms = 1000;
            if (theirs != mine)
                rc = manta_coll_fail(g, MANTA_EPROTO,
                                     "rank %d uses chunks of %llu bytes, this rank %llu: every "
                                     "rank must give the same chunk_bytes",
                                     i, (unsigned long long)theirs, (unsigned long long)mine);
        }
        if (rc == MANTA_ETIMEDOUT)
            rc = manta_coll_fail(g, MANTA_ETIMEDOUT,
                                 "rank %d joined but sent no hello on the data plane within "
                                 "%d ms (endpoint unreachable%s?)",
                                 i, g->default_timeout,
                                 manta_curve_on(g->m) ? ", or it lacks the job's CURVE keys" : "");
    }
    return rc;
}

static int z_open(manta_coll_group *g, void **impl)
{
    zimpl *z = NULL;
    int rc = z_new(g, &z);
    int64_t deadline = manta_now_ms() + g->default_timeout;
    if (rc == 0) rc = z_bind(z);
    if (rc == 0) rc = z_connect_peers(z, deadline);
    if (rc == 0) rc = z_hello(z, deadline);
    if (rc) {
        z_close(z);
        return rc;
    }
    z->seq++;
    *impl = z;
    return 0;
}

static int z_broadcast(void *impl, void *buf, size_t bytes, int root, int check, uint32_t *crc,
                       int64_t deadline)
{
    zimpl *z = impl;
    int P = z->world, r = z->rank, rc = 0;
    uint32_t run = 0;
    char *b = buf;
    if (P == 1) {
        if (check && crc) *crc = manta_crc32c(0, buf, bytes);
        return 0;
    }
    size_t ch = z->chunk;
    size_t nchunks = bytes ? (bytes + ch - 1) / ch : 1;
    bool direct = bytes <= DIRECT_MAX;
    int pos = (r - root + P) % P;
    int prev = (r - 1 + P) % P, next = (r + 1) % P;
    if (r == root) {
        for (size_t c = 0; c < nchunks && rc == 0; c++) {
            size_t off = c * ch, n = bytes - off < ch ? bytes - off : ch;
            if (check) run = manta_crc32c(run, b + off, n);
            if (direct) {
                for (int i = 0; i < P && rc == 0; i++)
                    if (i != r) rc = z_send(z, i, OP_BCAST, (uint32_t)c, run, check, b + off, n);
            } else {
                rc = z_send(z, next, OP_BCAST, (uint32_t)c, run, check, b + off, n);
            }
        }
    } else {
        int from = direct ? root : prev;
        bool fwd = !direct && pos < P - 1;
        for (size_t c = 0; c < nchunks && rc == 0; c++) {
            size_t off = c * ch, n = bytes - off < ch ? bytes - off : ch;
            hdr h;
            zmq_msg_t d;
            if ((rc = z_recv(z, from, OP_BCAST, (uint32_t)c, &h, &d, deadline)) != 0) break;
            if ((rc = z_check_len(z, from, &h, n)) == 0 && h.check != check)
                rc = manta_coll_fail(z->g, MANTA_EPROTO,
                                     "rank %d broadcasts %s a checksum, this rank "
                                     "called %s",
                                     from, h.check ? "with" : "without",
                                     check ? "broadcast_crc" : "broadcast");
            if (rc == 0 && fwd) {
                /* Forward first (a shared reference, no copy), then copy out. */
                zmq_msg_t f;
                zmq_msg_init(&f);
                zmq_msg_copy(&f, &d);
                rc = z_forward(z, next, OP_BCAST, (uint32_t)c, h.crc, check, &f);
                if (rc) zmq_msg_close(&f);
            }
            if (rc == 0) {
                memcpy(b + off, zmq_msg_data(&d), n);
                if (check) {
                    run = manta_crc32c(run, b + off, n);
                    if (run != h.crc)
                        rc = manta_coll_fail(
                            z->g, MANTA_EPROTO,
                            "broadcast from rank %d: checksum "
                            "mismatch at chunk %zu of %zu (crc32c %08x, sender says "
                            "%08x)",
                            root, c, nchunks, run, h.crc);
                }
            }
            zmq_msg_close(&d);
        }
    }
    if (rc == 0) rc = z_drain(z, deadline);
    if (rc) return z_abort(z, rc);
    z->seq++;
    if (check && crc) *crc = run;
    return 0;
}

/* dst[i] = a[i] + b[i] over n floats; dst and a may be unaligned (and equal). */
static void add_into(char *dst, const char *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x, y;
        memcpy(&x, a + i * sizeof x, sizeof x);
        memcpy(&y, b + i, sizeof y);
        x += y;
        memcpy(dst + i * sizeof x, &x, sizeof x);
    }
}

/* The ring reduce-scatter on floats: rank r ends with its slice of the sum
 * in recv. Each step's chunks are forwarded as they arrive. */
static int ring_rs(zimpl *z, int op, const float *send, float *recv, size_t count, int64_t deadline)
{
    int P = z->world, r = z->rank, rc = 0;
    int left = (r - 1 + P) % P, right = (r + 1) % P;
    size_t ce = z->chunk / sizeof(float);
    uint32_t rx = 0, tx = 0; /* chunk counters per direction */
    /* step 0: our own input for slice r-1 */
    size_t off, len;
    manta_coll_slice(count, P, (r - 1 + P) % P, &off, &len);
    for (size_t c = 0; c < len || (c == 0 && len == 0); c += ce) {
        size_t n = len - c < ce ? len - c : ce;
        if ((rc = z_send(z, right, op, tx++, 0, 0, send + off + c, n * sizeof(float)))) return rc;
        if (len == 0) break;
    }
    for (int s = 1; s < P; s++) {
        int k = ((r - s - 1) % P + P) % P;
        manta_coll_slice(count, P, k, &off, &len);
        for (size_t c = 0; c < len || (c == 0 && len == 0); c += ce) {
            size_t n = len - c < ce ? len - c : ce;
            hdr h;
            zmq_msg_t d;
            if ((rc = z_recv(z, left, op, rx++, &h, &d, deadline))) return rc;
            if ((rc = z_check_len(z, left, &h, n * sizeof(float)))) {
                zmq_msg_close(&d);
                return rc;
            }
            /* Received payloads may sit at any address inside ZeroMQ's
             * receive buffer: access them through memcpy, never as float *. */
            char *acc = zmq_msg_data(&d);
            const float *mine = send + off + c;
            if (s < P - 1) {
                add_into(acc, acc, mine, n);
                rc = z_forward(z, right, op, tx++, 0, 0, &d);
                if (rc) {
                    zmq_msg_close(&d);
                    return rc;
                }
            } else {
                add_into((char *)(recv + c), acc, mine, n);
                zmq_msg_close(&d);
            }
            if (len == 0) break;
        }
    }
    return 0;
}

/* The ring all-gather: recv holds this rank's slice at its offset already. */
static int ring_ag(zimpl *z, int op, char *recv, size_t count, size_t elem, int64_t deadline)
{
    int P = z->world, r = z->rank, rc = 0;
    int left = (r - 1 + P) % P, right = (r + 1) % P;
    size_t ce = z->chunk / elem;
    uint32_t rx = 0, tx = 0;
    size_t off, len;
    manta_coll_slice(count, P, r, &off, &len);
    for (size_t c = 0; c < len || (c == 0 && len == 0); c += ce) {
        size_t n = len - c < ce ? len - c : ce;
        if ((rc = z_send(z, right, op, tx++, 0, 0, recv + (off + c) * elem, n * elem))) return rc;
        if (len == 0) break;
    }
    for (int s = 0; s < P - 1; s++) {
        int k = ((r - s - 1) % P + P) % P;
        manta_coll_slice(count, P, k, &off, &len);
        for (size_t c = 0; c < len || (c == 0 && len == 0); c += ce) {
            size_t n = len - c < ce ? len - c : ce;
            hdr h;
            zmq_msg_t d;
            if ((rc = z_recv(z, left, op, rx++, &h, &d, deadline))) return rc;
            if ((rc = z_check_len(z, left, &h, n * elem))) {
                zmq_msg_close(&d);
                return rc;
            }
            if (n) memcpy(recv + (off + c) * elem, zmq_msg_data(&d), n * elem);
            if (s < P - 2) {
                rc = z_forward(z, right, op, tx++, 0, 0, &d);
                if (rc) {
                    zmq_msg_close(&d);
                    return rc;
                }
            } else {
                zmq_msg_close(&d);
            }
            if (len == 0) break;
        }
    }
    return 0;
}

static int z_reduce_scatter(void *impl, const float *send, float *recv, size_t count,
                            int64_t deadline)
{
    zimpl *z = impl;
    size_t off, len;
    manta_coll_slice(count, z->world, z->rank, &off, &len);
    if (z->world == 1) {
        if (len && recv != send) memmove(recv, send, len * sizeof(float));
        return 0;
    }
    int rc = ring_rs(z, OP_RSCATTER, send, recv, count, deadline);
    if (rc == 0) rc = z_drain(z, deadline);
    if (rc) return z_abort(z, rc);
    z->seq++;
    return 0;
}

static int z_all_gather(void *impl, const void *send, void *recv, size_t count, size_t elem,
                        int64_t deadline)
{
    zimpl *z = impl;
    size_t off, len;
    manta_coll_slice(count, z->world, z->rank, &off, &len);
    char *out = recv;
    if (len && out + off * elem != send) memmove(out + off * elem, send, len * elem);
    if (z->world == 1) return 0;
    int rc = ring_ag(z, OP_AGATHER, out, count, elem, deadline);
    if (rc == 0) rc = z_drain(z, deadline);
    if (rc) return z_abort(z, rc);
    z->seq++;
    return 0;
}

/* Small all-reduce: everyone sends everything to everyone, and each rank
 * sums the S contributions in rank order (so all ranks get the same bits). */
static int direct_allreduce(zimpl *z, float *buf, size_t count, int64_t deadline)
{
    int P = z->world, r = z->rank, rc = 0;
    size_t bytes = count * sizeof(float);
    for (int i = 0; i < P && rc == 0; i++)
        if (i != r) rc = z_send(z, i, OP_ALLREDUCE, 0, 0, 0, buf, bytes);
    if (rc) return rc;
    zmq_msg_t *got = calloc((unsigned)P, sizeof *got);
    const char **src = calloc((unsigned)P, sizeof *src);
    if (!got || !src) {
        free(got), free(src);
        return manta_coll_fail(z->g, MANTA_ENOMEM, "all_reduce: out of memory");
    }
    int n = 0; /* messages initialised in got[0..n) */
    for (; n < P; n++) {
        zmq_msg_init(&got[n]);
        if (n == r) continue;
        hdr h;
        zmq_msg_close(&got[n]);
        if ((rc = z_recv(z, n, OP_ALLREDUCE, 0, &h, &got[n], deadline))) break;
        if ((rc = z_check_len(z, n, &h, bytes))) {
            n++;
            break;
        }
        src[n] = zmq_msg_data(&got[n]);
    }
    /* Our own zero-copy sends read buf: they must be gone before we write. */
    if (rc == 0) rc = z_drain(z, deadline);
    if (rc == 0) {
        src[r] = (const char *)buf;
        for (size_t j = 0; j < count; j++) {
            float s = 0, v;
            for (int i = 0; i < P; i++) memcpy(&v, src[i] + j * sizeof v, sizeof v), s += v;
            buf[j] = s;
        }
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&got[i]);
    free(got), free(src);
    return rc;
}

static int z_all_reduce(void *impl, float *buf, size_t count, int64_t deadline)
{
    zimpl *z = impl;
    if (z->world == 1) return 0;
    int rc;
    if (count * sizeof(float) <= DIRECT_MAX) {
        rc = direct_allreduce(z, buf, count, deadline);
    } else {
        size_t off;
        manta_coll_slice(count, z->world, z->rank, &off, NULL);
        rc = ring_rs(z, OP_ALLREDUCE, buf, buf + off, count, deadline);
        /* The all-gather overwrites slices that zero-copy sends of the
         * reduce-scatter may still be reading. */
        if (rc == 0) rc = z_drain(z, deadline);
        if (rc == 0) rc = ring_ag(z, OP_ALLREDUCE, (char *)buf, count, sizeof(float), deadline);
    }
    if (rc == 0) rc = z_drain(z, deadline);
    if (rc) return z_abort(z, rc);
    z->seq++;
    return 0;
}

/* Dissemination barrier: in round k rank r signals r + 2^k and waits for
 * r - 2^k; after ceil(log2 S) rounds everyone has heard from everyone. */
static int z_barrier(void *impl, int64_t deadline)
{
    zimpl *z = impl;
    int P = z->world, r = z->rank, rc = 0;
    uint32_t k = 0;
    for (int d = 1; d < P && rc == 0; d *= 2, k++) {
        rc = z_send(z, (r + d) % P, OP_BARRIER, k, 0, 0, NULL, 0);
        hdr h;
        zmq_msg_t m;
        if (rc == 0) rc = z_recv(z, (r - d % P + P) % P, OP_BARRIER, k, &h, &m, deadline);
        if (rc == 0) zmq_msg_close(&m);
    }
    if (rc) return z_abort(z, rc);
    z->seq++;
    return 0;
}

static const manta_coll_backend zmq_backend = {
    .name = "zmq",
    .open = z_open,
    .close = z_close,
    .broadcast = z_broadcast,
    .all_reduce = z_all_reduce,
    .reduce_scatter = z_reduce_scatter,
    .all_gather = z_all_gather,
    .barrier = z_barrier,
};

const manta_coll_backend *manta_coll_zmq(void)
{
    return &zmq_backend;
}
