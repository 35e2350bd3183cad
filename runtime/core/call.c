/*
 * call.c -- calls and futures on the caller's side.
 *
 * A call gets an id, a future and a deadline, and goes out at once on its
 * peer's DEALER socket (or waits in the peer's hold queue while the peer is
 * suspect: see peer.c). The future is found again by id when the reply
 * arrives; the reply's bytes are read in place from the received frames,
 * which the future keeps.
 *
 * Deadlines: a min-heap of (deadline, call id) resolves the overdue calls
 * as ETIMEDOUT. A reply for a call that already resolved is dropped and
 * counted (late_replies): every future resolves exactly once, with a value,
 * an error, ETIMEDOUT, EDIED or ECLOSED.
 *
 * manta_get() and manta_wait() turn the loop until what they wait for has
 * happened, so a method waiting on a future keeps serving its mailbox.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const mn_loop_hook calls_hook;

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

static int heap_push(manta_ctx *m, int64_t deadline, uint64_t id)
{
    if (m->heap_len >= 4096 && m->heap_len > 4 * m->pending) heap_compact(m);
    if (m->heap_len == m->heap_cap) {
        size_t nc = m->heap_cap ? m->heap_cap * 2 : 256;
        mn_heap_item *h = realloc(m->heap, nc * sizeof *h);
        if (!h)
            return mn_fail(MANTA_ENOMEM, "out of memory for the deadline of call %llu",
                           (unsigned long long)id);
        m->heap = h, m->heap_cap = nc;
    }
    size_t i = m->heap_len++;
    heap_sift_up(m->heap, i, (mn_heap_item){deadline, id});
    return 0;
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

/* Forget a pending call: its id, and its place in its peer's count. */
static void unregister(manta_ctx *m, manta_future *f)
{
    mn_idmap_del(&m->calls, f->id);
    if (f->peer && --f->peer->pending == 0) mn_peer_busy(m, f->peer, false);
    m->pending--;
}

void mn_call_resolve(manta_ctx *m, manta_future *f, int status, const char *error)
{
    unregister(m, f);
    mn_metrics_made(m, f->t0);
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

manta_future *mn_call_find(manta_ctx *m, mn_peer *p, uint64_t id)
{
    manta_future *f = mn_idmap_get(&m->calls, id);
    return f && f->peer == p ? f : NULL;
}

void mn_fail_peer_calls(manta_ctx *m, mn_peer *p, int code, const char *why)
{
    if (!p->pending) return;
    for (size_t i = 0; i < m->calls.cap && p->pending; i++) {
        manta_future *f = m->calls.vals[i];
        if (m->calls.keys[i] && f && f->peer == p) mn_call_resolve(m, f, code, why);
    }
}

/* ---- making calls ---- */

/* A future that is resolved before it was sent. */
static manta_future *settle(manta_future *f, int status, const char *error)
{
    f->status = status;
    free(f->error);
    f->error = error ? mn_strdup(error) : NULL;
    return f;
}

/* Back-pressure: serve the loop until a slot frees up or the deadline. */
static int wait_for_slot(manta_ctx *m, int64_t deadline)
{
    while (m->pending >= m->max_pending) {
        int64_t left = deadline - mn_now_ms();
        if (left <= 0) return MANTA_ETIMEDOUT;
        int rc = mn_loop_once(m, (int)(left < 50 ? left : 50));
        if (rc < 0) return rc;
    }
    return 0;
}

/* Give the future an id, count it pending on its peer, and arm its deadline. */
static int register_call(manta_ctx *m, mn_peer *p, manta_future *f)
{
    f->peer = p;
    f->id = ++m->next_id;
    if (mn_idmap_put(&m->calls, f->id, f) != 0)
        return mn_fail(MANTA_ENOMEM, "out of memory registering call %llu",
                       (unsigned long long)f->id);
    m->pending++;
    if (p->pending++ == 0) mn_peer_busy(m, p, true); /* the loop polls busy peers only */
    int rc = heap_push(m, f->deadline, f->id);
    if (rc) unregister(m, f);
    return rc;
}

manta_future *mn_call_peer(manta_ctx *m, mn_peer *p, const char *method, const void *arg,
                           size_t len, int timeout_ms, zmq_msg_t *frame)
{
    manta_future *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->ctx = m;
    f->status = MANTA_EPENDING;
    f->t0 = mn_metrics_clock();
    if (timeout_ms <= 0) timeout_ms = m->call_timeout_ms;
    f->deadline = mn_now_ms() + timeout_ms;
    if (!m->zmq) return settle(f, MANTA_ECLOSED, "runtime shut down");
    if (mn_loop_hook_add(m, &calls_hook) != 0) return settle(f, MANTA_ENOMEM, manta_last_error());
    int rc = wait_for_slot(m, f->deadline);
    if (rc == MANTA_ETIMEDOUT) {
        m->stats.timeouts++;
        return settle(f, rc, "no free slot: max_pending calls in flight until the deadline");
    }
    if (rc) return settle(f, rc, manta_last_error());
    int how = mn_peer_admit(m, p);
    if (how == MN_DEAD) {
        char why[256];
        snprintf(why, sizeof why, "actor %s is dead", p->owner ? p->owner->name : p->endpoint);
        m->stats.died++;
        return settle(f, MANTA_EDIED, why);
    }
    if (how == MN_SEND && mn_peer_connect(p) != 0) return settle(f, MANTA_EZMQ, manta_last_error());
    if ((rc = register_call(m, p, f)) != 0) return settle(f, rc, manta_last_error());
    if (how == MN_HOLD)
        rc = mn_peer_hold(m, p, MN_CALL, f->id, method, arg, len, frame);
    else
        rc = mn_env_send(p->sock, NULL, 0, MN_CALL, f->id, method, 0, arg, len, frame);
    if (rc != 0) {
        mn_call_resolve(m, f, rc, manta_last_error());
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
        if (f) settle(f, MANTA_EINVAL, "manta_call: actor, method and argument are required");
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
    int how = mn_peer_admit(m, p);
    if (how == MN_DEAD) return mn_fail(MANTA_EDIED, "actor %s is dead", a->name);
    if (how == MN_HOLD) return mn_peer_hold(m, p, MN_CAST, 0, method, arg, len, NULL);
    int rc = mn_peer_connect(p);
    if (rc == 0) rc = mn_env_send(p->sock, NULL, 0, MN_CAST, 0, method, 0, arg, len, NULL);
    if (rc == 0) m->stats.casts_sent++;
    return rc;
}

/* ---- futures ---- */

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
    /* Its reply, if any, will find no future and be counted late. */
    if (f->status == MANTA_EPENDING && f->ctx) unregister(f->ctx, f);
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
        /* A failed turn (out of memory for the poll set) is tried again:
         * the call's deadline bounds the wait either way. */
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

/* Read one multipart reply: the envelope frame and at most one payload
 * frame. Returns 0, 1 when nothing waits, or -1 for more than one payload
 * frame (drained). */
static int read_reply(void *sock, zmq_msg_t *em, zmq_msg_t *fm, bool *have_frame)
{
    zmq_msg_init(em);
    if (zmq_msg_recv(em, sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(em);
        return 1;
    }
    *have_frame = false;
    if (!zmq_msg_more(em)) return 0;
    zmq_msg_init(fm);
    zmq_msg_recv(fm, sock, 0);
    *have_frame = true;
    int extra = 0, more = zmq_msg_more(fm);
    while (more) { /* more than one payload frame: drain and reject */
        zmq_msg_t junk;
        zmq_msg_init(&junk);
        zmq_msg_recv(&junk, sock, 0);
        more = zmq_msg_more(&junk);
        zmq_msg_close(&junk);
        extra = -1;
    }
    return extra;
}

/* Hand a reply's frames to its future and resolve it. The reply's bytes are
 * read in place. A small message lives inside the zmq_msg_t itself, so
 * pointers into it are re-derived after the move. */
static void deliver(manta_ctx *m, manta_future *f, mn_env *e, zmq_msg_t *em, zmq_msg_t *fm,
                    bool have_frame)
{
    size_t off = e->payload ? (size_t)((const char *)e->payload - (char *)zmq_msg_data(em)) : 0;
    zmq_msg_init(&f->env_msg);
    zmq_msg_move(&f->env_msg, em);
    f->have_env = true;
    if (e->payload) e->payload = (const char *)zmq_msg_data(&f->env_msg) + off;
    if (have_frame) {
        zmq_msg_init(&f->frame_msg);
        zmq_msg_move(&f->frame_msg, fm);
        f->have_frame = true;
        f->data = zmq_msg_data(&f->frame_msg);
        f->len = zmq_msg_size(&f->frame_msg);
    } else {
        f->data = e->payload;
        f->len = e->payload_len;
    }
    if (e->kind == MN_REPLY) {
        mn_call_resolve(m, f, 0, NULL);
        return;
    }
    char msg[1024];
    size_t n = f->len < sizeof msg - 1 ? f->len : sizeof msg - 1;
    memcpy(msg, f->data ? f->data : "", n);
    msg[n] = 0;
    int st = e->status < 0 && e->status > -100 ? e->status : MANTA_EREMOTE;
    mn_call_resolve(m, f, st, msg);
    f->data = NULL, f->len = 0;
}

int mn_recv_replies(manta_ctx *m, mn_peer *p)
{
    int got = 0;
    for (int budget = 0; budget < 4096; budget++) {
        zmq_msg_t em, fm;
        bool have_frame = false;
        int rc = read_reply(p->sock, &em, &fm, &have_frame);
        if (rc == 1) break;
        got++;
        mn_env e;
        char err[256];
        manta_future *f = NULL;
        if (rc < 0 || mn_env_decode(zmq_msg_data(&em), zmq_msg_size(&em), &e, err, sizeof err) ||
            (e.kind != MN_REPLY && e.kind != MN_ERROR) || e.nframes != (have_frame ? 1 : 0)) {
            m->stats.bad_envelopes++;
        } else if (!(f = mn_call_find(m, p, e.id))) {
            m->stats.late_replies++;
        }
        if (f) {
            deliver(m, f, &e, &em, &fm, have_frame);
            continue;
        }
        zmq_msg_close(&em);
        if (have_frame) zmq_msg_close(&fm);
    }
    return got;
}

/* ---- the calls' hook: deadlines ---- */

/* The next deadline of a pending call. Entries of resolved calls are
 * dropped from the top first, so an idle process does not wake for them. */
static int64_t calls_due(manta_ctx *m)
{
    while (m->heap_len) {
        manta_future *f = mn_idmap_get(&m->calls, m->heap[0].id);
        if (f && f->deadline == m->heap[0].deadline) return f->deadline;
        heap_pop(m);
    }
    return INT64_MAX;
}

static int run_deadlines(manta_ctx *m)
{
    int64_t now = mn_now_ms();
    int n = 0;
    while (m->heap_len && m->heap[0].deadline <= now) {
        mn_heap_item it = heap_pop(m);
        manta_future *f = mn_idmap_get(&m->calls, it.id);
        if (!f || f->deadline != it.deadline) continue;
        char why[256];
        snprintf(why, sizeof why, "call %llu to %s timed out", (unsigned long long)f->id,
                 f->peer && f->peer->owner && f->peer->owner->name ? f->peer->owner->name : "peer");
        mn_call_resolve(m, f, MANTA_ETIMEDOUT, why);
        n++;
    }
    return n;
}

/* Pending futures resolve ECLOSED; their owners still free them. */
static void calls_free(manta_ctx *m)
{
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
    m->pending = 0;
    free(m->heap);
    m->heap = NULL, m->heap_len = m->heap_cap = 0;
}

static const mn_loop_hook calls_hook = {calls_due, run_deadlines, calls_free};
