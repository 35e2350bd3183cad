/*
 * loop.c -- the per-process event loop: calls and futures on the caller's
 * side, the mailbox on the actor's side, timers and file descriptors.
 *
 * One loop per process, run by whoever waits: manta_get(), manta_wait() and
 * manta_poll() each turn it until what they wait for happens. A method that
 * waits on a future therefore serves its own mailbox meanwhile (nested
 * dispatch), which is why mutual calls (A -> B -> A) never deadlock.
 *
 * Ordering: calls from one caller (one ROUTER routing id) are served in the
 * order they arrive. While a caller's call is on the dispatch stack (its
 * method waits on a future), that caller's later calls wait in the deferred
 * queue; other callers' calls are served. So a caller never sees its second
 * call begin before its first has returned.
 *
 * Peers: one DEALER socket per actor (or object owner) this process talks
 * to, with a socket monitor. A DISCONNECTED event means the actor's process
 * went away: every call pending on that peer resolves EDIED at once, and the
 * peer is "suspect" until the directory says a new incarnation is alive.
 *
 * Deadlines: every call has one; a min-heap of (deadline, call id) resolves
 * the overdue ones as ETIMEDOUT. A reply for a call that already resolved is
 * dropped and counted (late_replies): every future resolves exactly once.
 */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct mn_timer {
    uint64_t id;
    int64_t due;
    manta_timer_fn fn;
    void *arg;
    mn_timer *next;
};

struct mn_watch {
    int fd, events;
    manta_fd_fn fn;
    void *arg;
    mn_watch *next;
};

struct mn_deferred {
    zmq_msg_t route, env, frame;
    bool have_frame;
    mn_deferred *next;
};

/* What a poll item is, so the loop knows how to serve it. */
enum { IT_MAILBOX, IT_PEER, IT_MON, IT_FD };
typedef struct ready_item {
    int kind;
    void *ptr;
    int fd, revents;
} ready_item;

static void free_future_msgs(manta_future *f)
{
    if (f->have_env) zmq_msg_close(&f->env_msg);
    if (f->have_frame) zmq_msg_close(&f->frame_msg);
    f->have_env = f->have_frame = false;
}

/* ---- deadline heap ---- */

static void heap_sift_up(mn_heap_item *h, size_t i, mn_heap_item it)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].deadline <= it.deadline) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

/* Entries of calls that already resolved stay in the heap until their
 * deadline; when they outnumber the pending calls, drop them all at once
 * (amortised O(1) per call), so memory follows the calls in flight. */
static void heap_compact(manta_ctx *m)
{
    size_t n = 0;
    for (size_t i = 0; i < m->heap_len; i++) {
        manta_future *f = mn_idmap_get(&m->calls, m->heap[i].id);
        if (f && f->deadline == m->heap[i].deadline) heap_sift_up(m->heap, n++, m->heap[i]);
    }
    m->heap_len = n;
}

static void heap_push(manta_ctx *m, int64_t deadline, uint64_t id)
{
    if (m->heap_len >= 4096 && m->heap_len > 4 * m->pending) heap_compact(m);
    if (m->heap_len == m->heap_cap) {
        size_t nc = m->heap_cap ? m->heap_cap * 2 : 256;
        mn_heap_item *h = realloc(m->heap, nc * sizeof *h);
        if (!h) return; /* the call then has no deadline; counted nowhere, but rare */
        m->heap = h, m->heap_cap = nc;
    }
    size_t i = m->heap_len++;
    heap_sift_up(m->heap, i, (mn_heap_item){deadline, id});
}

static mn_heap_item heap_pop(manta_ctx *m)
{
    mn_heap_item top = m->heap[0], last = m->heap[--m->heap_len];
    size_t i = 0, n = m->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && m->heap[c + 1].deadline < m->heap[c].deadline) c++;
        if (last.deadline <= m->heap[c].deadline) break;
        m->heap[i] = m->heap[c];
        i = c;
    }
    if (n) m->heap[i] = last;
    return top;
}

/* ---- resolving futures ---- */

static void resolve(manta_ctx *m, manta_future *f, int status, const char *error)
{
    mn_idmap_del(&m->calls, f->id);
    if (f->peer && --f->peer->pending == 0) m->items_dirty = true;
    m->pending--;
    f->status = status;
    if (error) {
        free(f->error);
        f->error = mn_strdup(error);
    }
    switch (status) {
    case MANTA_ETIMEDOUT:
        m->stats.timeouts++;
        break;
    case MANTA_EDIED:
        m->stats.died++;
        break;
    case 0:
        m->stats.replies_ok++;
        break;
    default:
        m->stats.replies_error++;
        break;
    }
}

void mn_fail_peer_calls(manta_ctx *m, mn_peer *p, int code, const char *why)
{
    if (!p->pending) return;
    for (size_t i = 0; i < m->calls.cap && p->pending; i++) {
        manta_future *f = m->calls.vals[i];
        if (m->calls.keys[i] && f && f->peer == p) resolve(m, f, code, why);
    }
}

/* ---- peers ---- */

mn_peer *mn_peer_get(manta_ctx *m, const char *endpoint)
{
    for (mn_peer *p = m->peers; p; p = p->next)
        if (!strcmp(p->endpoint, endpoint)) return p;
    mn_peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ctx = m;
    p->endpoint = mn_strdup(endpoint);
    p->sock = zmq_socket(m->zmq, ZMQ_DEALER);
    if (!p->sock) goto fail;
    int zero = 0, ivl = 10, ivlmax = 200;
    /* No high-water mark: back-pressure is max_pending, not silent drops. */
    zmq_setsockopt(p->sock, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(p->sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof zero);
    /* Reconnect fast: a restarted actor binds the same endpoint again. */
    zmq_setsockopt(p->sock, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(p->sock, ZMQ_RECONNECT_IVL_MAX, &ivlmax, sizeof ivlmax);
    /* The callee sees who calls ("NAME#PID"): see waiting_on(). */
    char rid[200];
    int rl = snprintf(rid, sizeof rid, "%s#%d", m->self, (int)getpid());
    zmq_setsockopt(p->sock, ZMQ_ROUTING_ID, rid, (size_t)rl);
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://mn-mon-%d", ++m->npeers);
    if (zmq_socket_monitor(p->sock, mon,
                           getenv("MANTA_DEBUG")
                               ? ZMQ_EVENT_ALL
                               : ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECTED) != 0)
        goto fail;
    p->mon = zmq_socket(m->zmq, ZMQ_PAIR);
    if (!p->mon || zmq_connect(p->mon, mon) != 0) goto fail;
    zmq_setsockopt(p->mon, ZMQ_LINGER, &zero, sizeof zero);
    p->next = m->peers;
    m->peers = p;
    m->items_dirty = true;
    return p;
fail:
    mn_fail(MANTA_EZMQ, "peer socket for %s: %s", endpoint, zmq_strerror(zmq_errno()));
    if (p->sock) zmq_close(p->sock);
    if (p->mon) zmq_close(p->mon);
    free(p->endpoint);
    free(p);
    return NULL;
}

/* Connect a peer's socket on first use. Not at creation: an actor being
 * created binds its endpoint a few ms after the driver learns it, and a
 * connect that fails first waits out ZeroMQ's reconnect back-off (10, 20,
 * 40 ms ...); connecting once the actor is ready, or at the first call,
 * avoids that wait. */
int mn_peer_connect(mn_peer *p)
{
    if (p->connected) return 0;
    if (zmq_connect(p->sock, p->endpoint) != 0)
        return mn_fail(MANTA_EZMQ, "connect to %s: %s", p->endpoint, zmq_strerror(zmq_errno()));
    p->connected = true;
    return 0;
}

/* Re-read a suspect peer's directory record. Returns 1 if calls may go. */
static int check_peer(manta_ctx *m, mn_peer *p)
{
    if (!p->owner || !p->owner->name) return !p->dead;
    manta_actor_info info;
    int rc = mn_directory_read(m, p->owner->name, &info);
    p->next_check = mn_now_ms() + 100;
    if (rc == MANTA_ENOTFOUND ||
        (rc == 0 && (info.state == MANTA_ACTOR_DEAD || info.state == MANTA_ACTOR_FAILED ||
                     info.state == MANTA_ACTOR_STOPPED))) {
        p->dead = true;
        char why[256];
        snprintf(why, sizeof why, "actor %s is %s", p->owner->name,
                 rc ? "gone from the directory" : manta_actor_state_name(info.state));
        mn_fail_peer_calls(m, p, MANTA_EDIED, why);
        return 0;
    }
    if (rc != 0) return 1; /* registry trouble: try the transport anyway */
    p->dead = false;
    const char *ep = mn_pick_endpoint(&info);
    if (ep[0] && strcmp(ep, p->endpoint)) {
        /* A new incarnation on another endpoint (tcp port, other node). */
        if (p->connected) zmq_disconnect(p->sock, p->endpoint);
        p->connected = false;
        free(p->endpoint);
        p->endpoint = mn_strdup(ep);
        mn_peer_connect(p);
    }
    /* "alive" may be stale (the agent has not reaped the old process yet),
     * so it counts only once the socket has connected again. Until then
     * calls still go (they queue for the next incarnation) and the loop
     * re-reads the record every 100 ms while any is pending. */
    if (info.state == MANTA_ACTOR_ALIVE && p->reconnected) {
        p->suspect = false;
        p->incarnation = info.incarnation;
    }
    return 1;
}

static void recv_monitor(manta_ctx *m, mn_peer *p);

/* ---- calls ---- */

manta_future *mn_call_peer(manta_ctx *m, mn_peer *p, const char *method, const void *arg,
                           size_t len, int timeout_ms, zmq_msg_t *frame)
{
    manta_future *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->ctx = m;
    f->status = MANTA_EPENDING;
    if (timeout_ms <= 0) timeout_ms = m->call_timeout_ms;
    f->deadline = mn_now_ms() + timeout_ms;
    if (!m->zmq) {
        f->status = MANTA_ECLOSED;
        f->error = mn_strdup("runtime shut down");
        return f;
    }
    /* Back-pressure: serve the loop until a slot frees up or the deadline. */
    while (m->pending >= m->max_pending) {
        int64_t left = f->deadline - mn_now_ms();
        if (left <= 0) {
            f->status = MANTA_ETIMEDOUT;
            f->error = mn_strdup("no free slot: max_pending calls in flight until the deadline");
            m->stats.timeouts++;
            return f;
        }
        mn_loop_once(m, (int)(left < 50 ? left : 50));
    }
    /* An idle peer is not polled: read what its monitor said meanwhile
     * (a death, a reconnect) before a new call can be taken for a victim. */
    if (!p->pending) recv_monitor(m, p);
    if (p->suspect || p->dead) check_peer(m, p);
    if (p->dead) {
        f->status = MANTA_EDIED;
        char why[256];
        snprintf(why, sizeof why, "actor %s is dead", p->owner ? p->owner->name : p->endpoint);
        f->error = mn_strdup(why);
        m->stats.died++;
        return f;
    }
    if (mn_peer_connect(p) != 0) {
        f->status = MANTA_EZMQ;
        f->error = mn_strdup(manta_last_error());
        return f;
    }
    f->peer = p;
    f->id = ++m->next_id;
    if (mn_idmap_put(&m->calls, f->id, f) != 0) {
        f->status = MANTA_ENOMEM;
        return f;
    }
    m->pending++;
    if (p->pending++ == 0) m->items_dirty = true; /* the loop polls busy peers only */
    heap_push(m, f->deadline, f->id);
    int rc = mn_env_send(p->sock, NULL, 0, MN_CALL, f->id, method, 0, arg, len, frame);
    if (rc != 0) {
        resolve(m, f, rc, manta_last_error());
        return f;
    }
    m->stats.calls_sent++;
    return f;
}

manta_future *manta_call_timeout(manta_ctx *m, manta_actor *a, const char *method, const void *arg,
                                 size_t len, int timeout_ms)
{
    if (!m || !a || !method || !*method || (len && !arg)) {
        manta_future *f = calloc(1, sizeof *f);
        if (f) {
            f->status = MANTA_EINVAL;
            f->error = mn_strdup("manta_call: actor, method and argument are required");
        }
        return f;
    }
    return mn_call_peer(m, a->peer, method, arg, len, timeout_ms, NULL);
}

manta_future *manta_call(manta_ctx *m, manta_actor *a, const char *method, const void *arg,
                         size_t len)
{
    return manta_call_timeout(m, a, method, arg, len, 0);
}

int manta_cast(manta_ctx *m, manta_actor *a, const char *method, const void *arg, size_t len)
{
    if (!m || !a || !method || !*method || (len && !arg))
        return mn_fail(MANTA_EINVAL, "manta_cast: actor and method are required");
    mn_peer *p = a->peer;
    if (!p->pending) recv_monitor(m, p);
    if (p->suspect || p->dead) check_peer(m, p);
    if (p->dead) return mn_fail(MANTA_EDIED, "actor %s is dead", a->name);
    int rc = mn_peer_connect(p);
    if (rc == 0) rc = mn_env_send(p->sock, NULL, 0, MN_CAST, 0, method, 0, arg, len, NULL);
    if (rc == 0) m->stats.casts_sent++;
    return rc;
}

int manta_future_done(const manta_future *f)
{
    return f && f->status != MANTA_EPENDING;
}

int manta_future_status(const manta_future *f)
{
    return f ? f->status : MANTA_EINVAL;
}

const char *manta_future_error(const manta_future *f)
{
    return f && f->error ? f->error : "";
}

void manta_future_free(manta_future *f)
{
    if (!f) return;
    if (f->status == MANTA_EPENDING && f->ctx) {
        /* Its reply, if any, will find no future and be counted late. */
        mn_idmap_del(&f->ctx->calls, f->id);
        if (f->peer && --f->peer->pending == 0) f->ctx->items_dirty = true;
        f->ctx->pending--;
    }
    free_future_msgs(f);
    free(f->error);
    free(f->owned);
    free(f);
}

int manta_get(manta_future *f, int timeout_ms, const void **data, size_t *len)
{
    if (!f) return mn_fail(MANTA_EINVAL, "manta_get: no future");
    int64_t until = timeout_ms < 0 ? f->deadline : mn_now_ms() + timeout_ms;
    while (f->status == MANTA_EPENDING) {
        int64_t left = until - mn_now_ms();
        if (left < 0) return MANTA_EPENDING;
        mn_loop_once(f->ctx, (int)(left > 1000 ? 1000 : left));
    }
    if (f->status == 0) {
        if (data) *data = f->data;
        if (len) *len = f->len;
        return 0;
    }
    mn_fail(f->status, "%s", f->error ? f->error : manta_strerror(f->status));
    return f->status;
}

int manta_wait(manta_future *const *fs, size_t n, size_t k, int timeout_ms)
{
    if (k > n) k = n;
    int64_t until = mn_now_ms() + (timeout_ms < 0 ? (int64_t)1 << 40 : timeout_ms);
    manta_ctx *m = NULL;
    for (;;) {
        size_t done = 0;
        for (size_t i = 0; i < n; i++) {
            if (!fs[i]) continue;
            if (fs[i]->status != MANTA_EPENDING) done++;
            if (fs[i]->ctx) m = fs[i]->ctx;
        }
        int64_t left = until - mn_now_ms();
        if (done >= k || left < 0 || !m) return (int)done;
        mn_loop_once(m, (int)(left > 1000 ? 1000 : left));
    }
}

/* ---- receiving replies ---- */

static void recv_reply(manta_ctx *m, mn_peer *p)
{
    for (int budget = 0; budget < 4096; budget++) {
        zmq_msg_t em, fm;
        zmq_msg_init(&em);
        if (zmq_msg_recv(&em, p->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&em);
            return;
        }
        bool have_frame = false, extra = false;
        if (zmq_msg_more(&em)) {
            zmq_msg_init(&fm);
            zmq_msg_recv(&fm, p->sock, 0);
            have_frame = true;
            int more = zmq_msg_more(&fm);
            while (more) { /* more than one payload frame: drain and reject */
                zmq_msg_t junk;
                zmq_msg_init(&junk);
                zmq_msg_recv(&junk, p->sock, 0);
                more = zmq_msg_more(&junk);
                zmq_msg_close(&junk);
                extra = true;
            }
        }
        mn_env e;
        char err[256];
        manta_future *f = NULL;
        if (extra || mn_env_decode(zmq_msg_data(&em), zmq_msg_size(&em), &e, err, sizeof err) ||
            (e.kind != MN_REPLY && e.kind != MN_ERROR) || e.nframes != (have_frame ? 1 : 0)) {
            m->stats.bad_envelopes++;
        } else if (!(f = mn_idmap_get(&m->calls, e.id)) || f->peer != p) {
            m->stats.late_replies++;
            f = NULL;
        }
        if (!f) {
            zmq_msg_close(&em);
            if (have_frame) zmq_msg_close(&fm);
            continue;
        }
        /* Keep the frames: the reply's bytes are read in place. A small
         * message lives inside the zmq_msg_t itself, so pointers into it
         * are re-derived after the move. */
        size_t off = e.payload ? (size_t)((const char *)e.payload - (char *)zmq_msg_data(&em)) : 0;
        zmq_msg_init(&f->env_msg);
        zmq_msg_move(&f->env_msg, &em);
        f->have_env = true;
        if (e.payload) e.payload = (const char *)zmq_msg_data(&f->env_msg) + off;
        if (have_frame) {
            zmq_msg_init(&f->frame_msg);
            zmq_msg_move(&f->frame_msg, &fm);
            f->have_frame = true;
            f->data = zmq_msg_data(&f->frame_msg);
            f->len = zmq_msg_size(&f->frame_msg);
        } else {
            f->data = e.payload;
            f->len = e.payload_len;
        }
        if (e.kind == MN_REPLY) {
            resolve(m, f, 0, NULL);
        } else {
            char msg[1024];
            size_t n = f->len < sizeof msg - 1 ? f->len : sizeof msg - 1;
            memcpy(msg, f->data ? f->data : "", n);
            msg[n] = 0;
            int st = e.status < 0 && e.status > -100 ? e.status : MANTA_EREMOTE;
            resolve(m, f, st, msg);
            f->data = NULL, f->len = 0;
        }
    }
}

static void recv_monitor(manta_ctx *m, mn_peer *p)
{
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, p->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 2) memcpy(&event, zmq_msg_data(&ev), 2);
        if (zmq_msg_size(&ev) >= 6) memcpy(&value, (char *)zmq_msg_data(&ev) + 2, 4);
        zmq_msg_init(&addr);
        if (zmq_msg_more(&ev)) zmq_msg_recv(&addr, p->mon, 0);
        zmq_msg_close(&ev);
        zmq_msg_close(&addr);
        if (getenv("MANTA_DEBUG"))
            mn_log("peer %s (%s): socket event 0x%x value %u", p->endpoint,
                   p->owner && p->owner->name ? p->owner->name : "-", event, value);
        if (event == ZMQ_EVENT_CONNECTED) p->reconnected = true;
        if (event == ZMQ_EVENT_DISCONNECTED) {
            p->suspect = true;
            p->reconnected = false;
            p->next_check = mn_now_ms() + 20;
            char why[256];
            snprintf(why, sizeof why,
                     "actor %s died: its connection closed while the call was "
                     "pending",
                     p->owner && p->owner->name ? p->owner->name : p->endpoint);
            mn_fail_peer_calls(m, p, MANTA_EDIED, why);
        }
    }
}

/* ---- serving the mailbox ---- */

static bool route_eq(zmq_msg_t *a, zmq_msg_t *b)
{
    return zmq_msg_size(a) == zmq_msg_size(b) &&
           !memcmp(zmq_msg_data(a), zmq_msg_data(b), zmq_msg_size(a));
}

/* Is this process waiting on a call to the process behind `route`? Then a
 * new call from it is a consequence of ours (A -> B -> A -> B ...), not a
 * pipelined one, and must be served now or both would wait forever. Callers
 * set their routing id to "NAME#PID", so the route names the process. */
static bool waiting_on(manta_ctx *m, zmq_msg_t *route)
{
    const char *id = zmq_msg_data(route);
    size_t n = zmq_msg_size(route);
    const char *hash = memchr(id, '#', n);
    if (!hash) return false;
    size_t nl = (size_t)(hash - id);
    for (mn_peer *p = m->peers; p; p = p->next)
        if (p->pending && p->owner && p->owner->name && strlen(p->owner->name) == nl &&
            !memcmp(p->owner->name, id, nl))
            return true;
    return false;
}

static bool route_busy(manta_ctx *m, zmq_msg_t *route, mn_deferred *before)
{
    for (int i = 0; i < m->depth; i++)
        if (route_eq(&m->active_msgs[i], route)) return !waiting_on(m, route);
    for (mn_deferred *d = m->deferred_head; d && d != before; d = d->next)
        if (route_eq(&d->route, route)) return true;
    return false;
}

static void send_error(manta_ctx *m, zmq_msg_t *route, uint64_t id, int code, const char *msg)
{
    mn_env_send(m->mailbox, zmq_msg_data(route), zmq_msg_size(route), MN_ERROR, id, NULL, code, msg,
                strlen(msg), NULL);
}

int mn_stats_pack(const manta_stats *s, msgpack_sbuffer *out)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    const uint64_t *v = (const uint64_t *)s;
    static const char *names[] = {
        "calls_sent",   "casts_sent",      "replies_ok",   "replies_error", "timeouts",
        "died",         "late_replies",    "calls_served", "casts_served",  "bad_envelopes",
        "bad_versions", "unknown_methods", "oversized",    "method_errors"};
    size_t n = sizeof names / sizeof names[0];
    _Static_assert(sizeof(manta_stats) == 14 * sizeof(uint64_t), "stats names out of date");
    msgpack_pack_map(&pk, n);
    for (size_t i = 0; i < n; i++) {
        msgpack_pack_str(&pk, strlen(names[i]));
        msgpack_pack_str_body(&pk, names[i], strlen(names[i]));
        msgpack_pack_uint64(&pk, v[i]);
    }
    return 0;
}

static const manta_method *find_method(const manta_class *cls, const char *name)
{
    if (!cls || !cls->methods) return NULL;
    for (const manta_method *mt = cls->methods; mt->name; mt++)
        if (!strcmp(mt->name, name)) return mt;
    return NULL;
}

static void finish_call(manta_req *c, int rc)
{
    if (!c->answered && !c->deferred && !c->is_cast) {
        if (rc == 0)
            manta_reply(c, NULL, 0);
        else
            manta_reply_error(c, rc, "method %s failed: %s", c->method,
                              manta_last_error()[0] ? manta_last_error() : manta_strerror(rc));
    }
    c->returned = true;
    if (!c->deferred || c->answered) {
        zmq_msg_close(&c->route);
        free(c);
    }
}

/* Serve one decoded, validated message. The frames stay the caller's. */
static void dispatch(manta_ctx *m, zmq_msg_t *route, zmq_msg_t *envm, zmq_msg_t *frame,
                     bool have_frame, const mn_env *e)
{
    const void *arg = have_frame ? zmq_msg_data(frame) : e->payload;
    size_t len = have_frame ? zmq_msg_size(frame) : e->payload_len;
    manta_req *c = calloc(1, sizeof *c);
    if (!c) {
        send_error(m, route, e->id, MANTA_ENOMEM, "actor out of memory");
        return;
    }
    c->ctx = m;
    c->id = e->id;
    c->is_cast = e->kind == MN_CAST;
    memcpy(c->method, e->method, e->method_len);
    c->method[e->method_len] = 0;
    zmq_msg_init(&c->route);
    zmq_msg_copy(&c->route, route);
    if (c->is_cast)
        m->stats.casts_served++;
    else
        m->stats.calls_served++;

    /* The caller is busy until its method returns (see "Ordering" above). */
    zmq_msg_init(&m->active_msgs[m->depth]);
    zmq_msg_copy(&m->active_msgs[m->depth], route);
    m->depth++;
    int rc = 0;
    const manta_method *mt = find_method(m->cls, c->method);
    if (mt) {
        mn_fail(0, "%s", ""); /* so a failing method's own message is the one reported */
        rc = mt->fn(c, m->state, arg, len);
        if (rc) m->stats.method_errors++;
    } else if (m->system_method && (rc = m->system_method(m, c, e, arg, len)) != MANTA_ENOMETHOD) {
        /* served by the runtime itself */
    } else if (!strcmp(c->method, MANTA_METHOD_STATS)) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        mn_stats_pack(&m->stats, &sb);
        manta_reply(c, sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
        rc = 0;
    } else {
        m->stats.unknown_methods++;
        rc = 0;
        if (!c->is_cast)
            manta_reply_error(c, MANTA_ENOMETHOD, "unknown method '%s' on class '%s' (actor %s)",
                              c->method, m->cls ? m->cls->name : "none", m->self);
    }
    m->depth--;
    zmq_msg_close(&m->active_msgs[m->depth]);
    finish_call(c, rc);
}

static void defer(manta_ctx *m, zmq_msg_t *route, zmq_msg_t *envm, zmq_msg_t *frame,
                  bool have_frame)
{
    mn_deferred *d = calloc(1, sizeof *d);
    if (!d) { /* cannot keep it: answer rather than lose it silently */
        send_error(m, route, 0, MANTA_ENOMEM, "actor out of memory: call dropped");
        zmq_msg_close(envm);
        if (have_frame) zmq_msg_close(frame);
        return;
    }
    zmq_msg_init(&d->route), zmq_msg_init(&d->env), zmq_msg_init(&d->frame);
    zmq_msg_copy(&d->route, route);
    zmq_msg_move(&d->env, envm);
    if (have_frame) zmq_msg_move(&d->frame, frame);
    d->have_frame = have_frame;
    if (m->deferred_tail)
        m->deferred_tail->next = d;
    else
        m->deferred_head = d;
    m->deferred_tail = d;
}

static void drain_deferred(manta_ctx *m)
{
    for (;;) {
        if (m->depth >= MN_MAX_DEPTH || m->stopping) return;
        mn_deferred *prev = NULL, *d = m->deferred_head;
        while (d && route_busy(m, &d->route, d)) prev = d, d = d->next;
        if (!d) return;
        if (prev)
            prev->next = d->next;
        else
            m->deferred_head = d->next;
        if (m->deferred_tail == d) m->deferred_tail = prev;
        mn_env e;
        char err[256];
        mn_env_decode(zmq_msg_data(&d->env), zmq_msg_size(&d->env), &e, err, sizeof err);
        dispatch(m, &d->route, &d->env, &d->frame, d->have_frame, &e);
        zmq_msg_close(&d->route), zmq_msg_close(&d->env), zmq_msg_close(&d->frame);
        free(d);
    }
}

static void recv_mailbox(manta_ctx *m)
{
    for (int budget = 0; budget < 1024 && !m->stopping; budget++) {
        zmq_msg_t route, envm, frame;
        zmq_msg_init(&route);
        if (zmq_msg_recv(&route, m->mailbox, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&route);
            return;
        }
        zmq_msg_init(&envm);
        zmq_msg_init(&frame);
        bool have_envm = false, have_frame = false;
        size_t nextra = 0, total = 0;
        if (zmq_msg_more(&route)) {
            zmq_msg_recv(&envm, m->mailbox, 0);
            have_envm = true;
            total += zmq_msg_size(&envm);
            int more = zmq_msg_more(&envm);
            while (more) {
                zmq_msg_t *dst = &frame;
                zmq_msg_t junk;
                if (have_frame) zmq_msg_init(&junk), dst = &junk;
                zmq_msg_recv(dst, m->mailbox, 0);
                total += zmq_msg_size(dst);
                more = zmq_msg_more(dst);
                if (dst == &junk) zmq_msg_close(&junk);
                have_frame = true;
                nextra++;
            }
        }
        mn_env e;
        char err[300];
        int rc = have_envm
                     ? mn_env_decode(zmq_msg_data(&envm), zmq_msg_size(&envm), &e, err, sizeof err)
                     : (snprintf(err, sizeof err, "message has no envelope frame"), MANTA_EPROTO);
        uint64_t id = rc == 0 ? e.id : 0;
        if (rc == 0 && (e.kind == MN_REPLY || e.kind == MN_ERROR)) {
            rc = MANTA_EPROTO;
            snprintf(err, sizeof err, "a mailbox takes calls and casts, not kind %d", e.kind);
        } else if (rc == 0 && (size_t)e.nframes != nextra) {
            rc = MANTA_EPROTO;
            snprintf(err, sizeof err, "envelope announces %d payload frames, %zu arrived",
                     e.nframes, nextra);
        }
        if (rc == 0 && total > m->max_message) {
            rc = MANTA_EMSGSIZE;
            snprintf(err, sizeof err, "message of %zu bytes exceeds this actor's limit of %zu",
                     total, m->max_message);
        }
        if (rc != 0) {
            char msg[400];
            snprintf(msg, sizeof msg, "actor %s rejected a message: %s", m->self, err);
            if (rc == MANTA_EMSGSIZE)
                m->stats.oversized++;
            else if (strstr(err, "protocol version"))
                m->stats.bad_versions++;
            else
                m->stats.bad_envelopes++;
            send_error(m, &route, id, rc, msg);
            zmq_msg_close(&route);
            zmq_msg_close(&envm);
            zmq_msg_close(&frame);
            continue;
        }
        if (m->depth >= MN_MAX_DEPTH || route_busy(m, &route, NULL))
            defer(m, &route, &envm, &frame, have_frame);
        else
            dispatch(m, &route, &envm, &frame, have_frame, &e);
        zmq_msg_close(&route);
        zmq_msg_close(&envm);
        zmq_msg_close(&frame);
    }
}

int manta_reply(manta_req *c, const void *data, size_t len)
{
    if (!c || (len && !data)) return mn_fail(MANTA_EINVAL, "manta_reply: bad arguments");
    if (c->answered || c->is_cast) return 0;
    c->answered = true;
    manta_ctx *m = c->ctx;
    int rc = m->mailbox ? mn_env_send(m->mailbox, zmq_msg_data(&c->route), zmq_msg_size(&c->route),
                                      MN_REPLY, c->id, NULL, 0, data, len, NULL)
                        : MANTA_ECLOSED;
    if (c->deferred && c->returned) {
        zmq_msg_close(&c->route);
        free(c);
    }
    return rc;
}

int manta_reply_error(manta_req *c, int code, const char *fmt, ...)
{
    if (!c) return MANTA_EINVAL;
    if (c->answered || c->is_cast) return 0;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->answered = true;
    manta_ctx *m = c->ctx;
    if (code >= 0 || code <= -100) code = MANTA_EREMOTE;
    int rc = m->mailbox ? mn_env_send(m->mailbox, zmq_msg_data(&c->route), zmq_msg_size(&c->route),
                                      MN_ERROR, c->id, NULL, code, msg, strlen(msg), NULL)
                        : MANTA_ECLOSED;
    if (c->deferred && c->returned) {
        zmq_msg_close(&c->route);
        free(c);
    }
    return rc;
}

manta_req *manta_req_defer(manta_req *c)
{
    if (c && !c->is_cast) c->deferred = true;
    return c;
}

const char *manta_req_method(const manta_req *c)
{
    return c ? c->method : "";
}

manta_ctx *manta_req_ctx(const manta_req *c)
{
    return c ? c->ctx : NULL;
}

void manta_stop_self(manta_ctx *m)
{
    if (m) m->stopping = true;
}

int mn_mailbox_bind(manta_ctx *m, const char *endpoint)
{
    m->mailbox = zmq_socket(m->zmq, ZMQ_ROUTER);
    if (!m->mailbox) return mn_fail(MANTA_EZMQ, "mailbox: %s", zmq_strerror(zmq_errno()));
    int zero = 0, one = 1;
    zmq_setsockopt(m->mailbox, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(m->mailbox, ZMQ_RCVHWM, &zero, sizeof zero);
    int linger = 1000; /* replies already queued still leave at a clean stop */
    zmq_setsockopt(m->mailbox, ZMQ_LINGER, &linger, sizeof linger);
    /* A reply to a caller that has gone fails loudly instead of vanishing. */
    zmq_setsockopt(m->mailbox, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    /* Callers name themselves (routing id NAME#PID). When a caller's socket
     * reconnects before this side has noticed the old connection is gone,
     * the new connection must win; without handover ZeroMQ would close it,
     * and the caller would take that for the actor's death. */
    zmq_setsockopt(m->mailbox, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    if (zmq_bind(m->mailbox, endpoint) != 0)
        return mn_fail(MANTA_EZMQ, "bind mailbox %s: %s", endpoint, zmq_strerror(zmq_errno()));
    size_t n = sizeof m->endpoint;
    zmq_getsockopt(m->mailbox, ZMQ_LAST_ENDPOINT, m->endpoint, &n);
    m->items_dirty = true;
    return 0;
}

/* ---- timers and fds ---- */

uint64_t manta_timer_add(manta_ctx *m, int64_t after_ms, manta_timer_fn fn, void *arg)
{
    if (!m || !fn) return 0;
    mn_timer *t = calloc(1, sizeof *t);
    if (!t) return 0;
    t->id = ++m->next_timer;
    t->due = mn_now_ms() + (after_ms < 0 ? 0 : after_ms);
    t->fn = fn, t->arg = arg;
    mn_timer **pp = &m->timers;
    while (*pp && (*pp)->due <= t->due) pp = &(*pp)->next;
    t->next = *pp;
    *pp = t;
    return t->id;
}

void manta_timer_cancel(manta_ctx *m, uint64_t id)
{
    for (mn_timer **pp = &m->timers; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            mn_timer *t = *pp;
            *pp = t->next;
            free(t);
            return;
        }
    }
}

int manta_watch_fd(manta_ctx *m, int fd, int events, manta_fd_fn fn, void *arg)
{
    if (!m || fd < 0) return mn_fail(MANTA_EINVAL, "manta_watch_fd: bad fd %d", fd);
    for (mn_watch **pp = &m->watches; *pp; pp = &(*pp)->next) {
        if ((*pp)->fd == fd) {
            if (!events) {
                mn_watch *w = *pp;
                *pp = w->next;
                free(w);
            } else {
                (*pp)->events = events, (*pp)->fn = fn, (*pp)->arg = arg;
            }
            m->items_dirty = true;
            return 0;
        }
    }
    if (!events) return 0;
    if (!fn) return mn_fail(MANTA_EINVAL, "manta_watch_fd: no callback");
    mn_watch *w = calloc(1, sizeof *w);
    if (!w) return MANTA_ENOMEM;
    w->fd = fd, w->events = events, w->fn = fn, w->arg = arg;
    w->next = m->watches;
    m->watches = w;
    m->items_dirty = true;
    return 0;
}

/* ---- the loop ---- */

static int rebuild_items(manta_ctx *m, ready_item **kinds)
{
    /* Only peers with calls in flight are polled: zmq_poll's cost grows
     * with every socket, and an idle peer's news (its monitor) is read when
     * it is next used. Late replies to idle peers wait in their socket. */
    size_t n = (m->mailbox ? 1 : 0);
    for (mn_peer *p = m->peers; p; p = p->next) n += p->pending ? 2 : 0;
    for (mn_watch *w = m->watches; w; w = w->next) n++;
    if (n > m->items_cap) {
        size_t cap = n * 2;
        zmq_pollitem_t *it = realloc(m->items, cap * (sizeof *it + sizeof(ready_item)));
        if (!it) return MANTA_ENOMEM;
        m->items = it, m->items_cap = cap;
    }
    ready_item *k = (ready_item *)(m->items + m->items_cap);
    size_t i = 0;
    if (m->mailbox) {
        m->items[i] = (zmq_pollitem_t){m->mailbox, 0, ZMQ_POLLIN, 0};
        k[i++] = (ready_item){IT_MAILBOX, NULL, -1, 0};
    }
    for (mn_peer *p = m->peers; p; p = p->next) {
        if (!p->pending) continue;
        m->items[i] = (zmq_pollitem_t){p->sock, 0, ZMQ_POLLIN, 0};
        k[i++] = (ready_item){IT_PEER, p, -1, 0};
        m->items[i] = (zmq_pollitem_t){p->mon, 0, ZMQ_POLLIN, 0};
        k[i++] = (ready_item){IT_MON, p, -1, 0};
    }
    for (mn_watch *w = m->watches; w; w = w->next) {
        short ev = (short)(((w->events & MANTA_POLLIN) ? ZMQ_POLLIN : 0) |
                           ((w->events & MANTA_POLLOUT) ? ZMQ_POLLOUT : 0));
        m->items[i] = (zmq_pollitem_t){NULL, w->fd, ev, 0};
        k[i++] = (ready_item){IT_FD, NULL, w->fd, 0};
    }
    m->nitems = i;
    m->items_dirty = false;
    *kinds = k;
    return 0;
}

static void run_timers(manta_ctx *m)
{
    int64_t now = mn_now_ms();
    /* Only timers due now; a timer added by a callback waits for the next turn. */
    uint64_t last = m->next_timer;
    while (m->timers && m->timers->due <= now && m->timers->id <= last) {
        mn_timer *t = m->timers;
        m->timers = t->next;
        manta_timer_fn fn = t->fn;
        void *arg = t->arg;
        free(t);
        fn(arg);
    }
}

static void run_deadlines(manta_ctx *m)
{
    int64_t now = mn_now_ms();
    while (m->heap_len && m->heap[0].deadline <= now) {
        mn_heap_item it = heap_pop(m);
        manta_future *f = mn_idmap_get(&m->calls, it.id);
        if (f && f->deadline == it.deadline) {
            char why[256];
            snprintf(why, sizeof why, "call %llu to %s timed out", (unsigned long long)f->id,
                     f->peer && f->peer->owner && f->peer->owner->name ? f->peer->owner->name
                                                                       : "peer");
            resolve(m, f, MANTA_ETIMEDOUT, why);
        }
    }
}

static void check_suspects(manta_ctx *m)
{
    int64_t now = mn_now_ms();
    for (mn_peer *p = m->peers; p; p = p->next)
        if (p->suspect && p->pending && now >= p->next_check) check_peer(m, p);
}

int mn_loop_once(manta_ctx *m, int timeout_ms)
{
    if (!m || !m->zmq) return MANTA_ECLOSED;
    ready_item *kinds = (ready_item *)(m->items + m->items_cap);
    if (m->items_dirty || !m->items) {
        int rc = rebuild_items(m, &kinds);
        if (rc) return rc;
    }
    int64_t now = mn_now_ms();
    int64_t wait = timeout_ms < 0 ? 1000 : timeout_ms;
    if (m->timers && m->timers->due - now < wait) wait = m->timers->due - now;
    if (m->heap_len && m->heap[0].deadline - now < wait) wait = m->heap[0].deadline - now;
    if (m->deferred_head && m->depth < MN_MAX_DEPTH) wait = 0;
    if (wait < 0) wait = 0;
    int n = zmq_poll(m->items, (int)m->nitems, (long)wait);
    if (n < 0 && zmq_errno() != EINTR)
        return mn_fail(MANTA_EZMQ, "poll: %s", zmq_strerror(zmq_errno()));
    /* Copy what is ready first: serving may re-enter the loop and rebuild
     * the item array under us. Peers and the mailbox live until shutdown;
     * fd watches are looked up again by fd. */
    size_t nready = 0;
    ready_item stack_ready[64], *ready = stack_ready;
    if (n > 64) ready = malloc((size_t)n * sizeof *ready);
    if (!ready) return MANTA_ENOMEM;
    for (size_t i = 0; n > 0 && i < m->nitems && nready < (size_t)n; i++) {
        if (!m->items[i].revents) continue;
        ready[nready] = kinds[i];
        ready[nready++].revents = m->items[i].revents;
    }
    for (size_t i = 0; i < nready; i++) {
        ready_item *r = &ready[i];
        switch (r->kind) {
        case IT_MAILBOX:
            recv_mailbox(m);
            break;
        case IT_PEER:
            recv_reply(m, r->ptr);
            break;
        case IT_MON:
            recv_monitor(m, r->ptr);
            break;
        case IT_FD:
            for (mn_watch *w = m->watches; w; w = w->next) {
                if (w->fd != r->fd) continue;
                int ev = ((r->revents & ZMQ_POLLIN) ? MANTA_POLLIN : 0) |
                         ((r->revents & ZMQ_POLLOUT) ? MANTA_POLLOUT : 0) |
                         ((r->revents & ZMQ_POLLERR) ? MANTA_POLLIN : 0);
                w->fn(w->arg, w->fd, ev);
                break;
            }
            break;
        }
    }
    if (ready != stack_ready) free(ready);
    if (m->deferred_head) drain_deferred(m);
    run_timers(m);
    run_deadlines(m);
    check_suspects(m);
    return 0;
}

int manta_poll(manta_ctx *m, int timeout_ms)
{
    if (!m) return MANTA_EINVAL;
    int64_t until = mn_now_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    do {
        int rc = mn_loop_once(m, (int)(until - mn_now_ms()));
        if (rc) return rc;
    } while (mn_now_ms() < until);
    return 0;
}

void mn_loop_free(manta_ctx *m)
{
    /* Pending futures resolve ECLOSED; the caller still frees them. */
    for (size_t i = 0; i < m->calls.cap; i++) {
        manta_future *f = m->calls.vals[i];
        if (m->calls.keys[i] && f) {
            f->status = MANTA_ECLOSED;
            free(f->error);
            f->error = mn_strdup("runtime shut down while the call was pending");
            f->ctx = NULL;
            f->peer = NULL;
        }
    }
    mn_idmap_free(&m->calls);
    free(m->heap);
    m->heap = NULL, m->heap_len = m->heap_cap = 0;
    while (m->peers) {
        mn_peer *p = m->peers;
        m->peers = p->next;
        zmq_socket_monitor(p->sock, NULL, 0);
        zmq_close(p->mon);
        zmq_close(p->sock);
        free(p->endpoint);
        free(p);
    }
    while (m->actors) {
        manta_actor *a = m->actors;
        m->actors = a->next;
        free(a->name);
        free(a);
    }
    while (m->timers) {
        mn_timer *t = m->timers;
        m->timers = t->next;
        free(t);
    }
    while (m->watches) {
        mn_watch *w = m->watches;
        m->watches = w->next;
        free(w);
    }
    while (m->deferred_head) {
        mn_deferred *d = m->deferred_head;
        m->deferred_head = d->next;
        zmq_msg_close(&d->route), zmq_msg_close(&d->env), zmq_msg_close(&d->frame);
        free(d);
    }
    m->deferred_tail = NULL;
    if (m->mailbox) zmq_close(m->mailbox);
    m->mailbox = NULL;
    free(m->items);
    m->items = NULL;
    m->items_cap = m->nitems = 0;
}
