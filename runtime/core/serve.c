/*
 * serve.c -- the mailbox: receiving calls and casts on the ROUTER socket,
 * checking them, ordering them, dispatching them to the class's methods, and
 * sending the answers.
 *
 * Ordering: calls from one caller (one ROUTER routing id) are served in the
 * order they arrive. While a caller's call is on the dispatch stack (its
 * method waits on a future, so the loop turns inside it), that caller's
 * later calls wait in the deferred queue; other callers' calls are served.
 * So a caller never sees its second call begin before its first returned.
 * The exception: when this process is itself waiting on a call to that
 * caller, its new call is a consequence of ours (A -> B -> A) and is served
 * at once, or both would wait forever.
 *
 * A malformed message, a wrong version, a frame count that does not match,
 * an unknown method or a message over max_message is answered with an error
 * reply and counted; the actor keeps running.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mn_deferred {
    zmq_msg_t route, env, frame;
    bool have_frame;
    mn_deferred *next;
};

/* A message as read from the mailbox. */
typedef struct inbound {
    zmq_msg_t route, env, frame;
    bool have_env, have_frame;
    size_t nextra, total; /* payload frames; bytes of envelope and payload */
} inbound;

static const mn_loop_hook serve_hook;

/* ---- ordering ---- */

static bool route_eq(zmq_msg_t *a, zmq_msg_t *b)
{
    return zmq_msg_size(a) == zmq_msg_size(b) &&
           !memcmp(zmq_msg_data(a), zmq_msg_data(b), zmq_msg_size(a));
}

/* Is this process waiting on a call to the process behind `route`? Callers
 * set their routing id to "NAME#PID#TOKEN", so the route names the process. */
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
        "bad_versions", "unknown_methods", "oversized",    "method_errors", "auth_refused"};
    size_t n = sizeof names / sizeof names[0];
    _Static_assert(sizeof(manta_stats) == 15 * sizeof(uint64_t), "stats names out of date");
    msgpack_pack_map(&pk, n);
    for (size_t i = 0; i < n; i++) {
        msgpack_pack_str(&pk, strlen(names[i]));
        msgpack_pack_str_body(&pk, names[i], strlen(names[i]));
        msgpack_pack_uint64(&pk, v[i]);
    }
    return 0;
}

/* ---- dispatch ---- */

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

static manta_req *req_new(manta_ctx *m, zmq_msg_t *route, const mn_env *e)
{
    manta_req *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ctx = m;
    c->id = e->id;
    c->is_cast = e->kind == MN_CAST;
    c->t0 = mn_metrics_clock();
    memcpy(c->method, e->method, e->method_len);
    c->method[e->method_len] = 0;
    zmq_msg_init(&c->route);
    zmq_msg_copy(&c->route, route);
    return c;
}

/* Run the method a request names: the class's, the runtime's own (node
 * agent, __stop), __stats, or none (an error reply). */
static int run_method(manta_ctx *m, manta_req *c, const mn_env *e, const void *arg, size_t len)
{
    int rc;
    const manta_method *mt = find_method(m->cls, c->method);
    if (mt) {
        mn_fail(0, "%s", ""); /* so a failing method's own message is the one reported */
        rc = mt->fn(c, m->state, arg, len);
        if (rc) m->stats.method_errors++;
        return rc;
    }
    if (m->system_method && (rc = m->system_method(m, c, e, arg, len)) != MANTA_ENOMETHOD)
        return rc;
    if (!strcmp(c->method, MANTA_METHOD_STATS)) {
        m->stats.auth_refused = atomic_load(&m->auth_refused);
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        mn_stats_pack(&m->stats, &sb);
        manta_reply(c, sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
        return 0;
    }
    m->stats.unknown_methods++;
    if (!c->is_cast)
        manta_reply_error(c, MANTA_ENOMETHOD, "unknown method '%s' on class '%s' (actor %s)",
                          c->method, m->cls ? m->cls->name : "none", m->self);
    return 0;
}

/* Serve one decoded, validated message. The frames stay the caller's. */
static void dispatch(manta_ctx *m, zmq_msg_t *route, zmq_msg_t *frame, bool have_frame,
                     const mn_env *e)
{
    const void *arg = have_frame ? zmq_msg_data(frame) : e->payload;
    size_t len = have_frame ? zmq_msg_size(frame) : e->payload_len;
    manta_req *c = req_new(m, route, e);
    if (!c) {
        send_error(m, route, e->id, MANTA_ENOMEM, "actor out of memory");
        return;
    }
    if (c->is_cast)
        m->stats.casts_served++;
    else
        m->stats.calls_served++;
    /* The caller is busy until its method returns (see "Ordering" above). */
    zmq_msg_init(&m->active_msgs[m->depth]);
    zmq_msg_copy(&m->active_msgs[m->depth], route);
    m->depth++;
    int rc = run_method(m, c, e, arg, len);
    m->depth--;
    zmq_msg_close(&m->active_msgs[m->depth]);
    finish_call(c, rc);
}

/* ---- the deferred queue ---- */

static void defer(manta_ctx *m, inbound *in)
{
    mn_deferred *d = calloc(1, sizeof *d);
    if (!d) { /* cannot keep it: answer rather than lose it silently */
        send_error(m, &in->route, 0, MANTA_ENOMEM, "actor out of memory: call dropped");
        return;
    }
    zmq_msg_init(&d->route), zmq_msg_init(&d->env), zmq_msg_init(&d->frame);
    zmq_msg_copy(&d->route, &in->route);
    zmq_msg_move(&d->env, &in->env);
    if (in->have_frame) zmq_msg_move(&d->frame, &in->frame);
    d->have_frame = in->have_frame;
    if (m->deferred_tail)
        m->deferred_tail->next = d;
    else
        m->deferred_head = d;
    m->deferred_tail = d;
}

static void free_deferred(mn_deferred *d)
{
    zmq_msg_close(&d->route), zmq_msg_close(&d->env), zmq_msg_close(&d->frame);
    free(d);
}

size_t mn_deferred_count(const manta_ctx *m)
{
    size_t n = 0;
    for (const mn_deferred *d = m->deferred_head; d; d = d->next) n++;
    return n;
}

/* Serve the deferred calls whose callers are free now, oldest first. */
static int drain_deferred(manta_ctx *m)
{
    int n = 0;
    while (m->deferred_head && m->depth < MN_MAX_DEPTH && !m->stopping) {
        mn_deferred *prev = NULL, *d = m->deferred_head;
        while (d && route_busy(m, &d->route, d)) prev = d, d = d->next;
        if (!d) break;
        if (prev)
            prev->next = d->next;
        else
            m->deferred_head = d->next;
        if (m->deferred_tail == d) m->deferred_tail = prev;
        mn_env e;
        char err[256];
        mn_env_decode(zmq_msg_data(&d->env), zmq_msg_size(&d->env), &e, err, sizeof err);
        dispatch(m, &d->route, &d->frame, d->have_frame, &e);
        free_deferred(d);
        n++;
    }
    return n;
}

/* ---- receiving ---- */

/* Read one message: routing id, envelope, payload frames (only the first
 * kept). Returns false when nothing waits. */
static bool read_inbound(void *sock, inbound *in)
{
    zmq_msg_init(&in->route);
    if (zmq_msg_recv(&in->route, sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&in->route);
        return false;
    }
    zmq_msg_init(&in->env);
    zmq_msg_init(&in->frame);
    in->have_env = in->have_frame = false;
    in->nextra = in->total = 0;
    if (!zmq_msg_more(&in->route)) return true;
    zmq_msg_recv(&in->env, sock, 0);
    in->have_env = true;
    in->total += zmq_msg_size(&in->env);
    int more = zmq_msg_more(&in->env);
    while (more) {
        zmq_msg_t junk, *dst = &in->frame;
        if (in->have_frame) zmq_msg_init(&junk), dst = &junk;
        zmq_msg_recv(dst, sock, 0);
        in->total += zmq_msg_size(dst);
        more = zmq_msg_more(dst);
        if (dst == &junk) zmq_msg_close(&junk);
        in->have_frame = true;
        in->nextra++;
    }
    return true;
}

/* Decode and check a message; 0, or a code with `err` saying what is wrong
 * (and *id the call's id once the envelope decoded, for the error reply). */
static int check_inbound(manta_ctx *m, inbound *in, mn_env *e, uint64_t *id, char *err,
                         size_t errlen)
{
    *id = 0;
    if (!in->have_env) return snprintf(err, errlen, "message has no envelope frame"), MANTA_EPROTO;
    int rc = mn_env_decode(zmq_msg_data(&in->env), zmq_msg_size(&in->env), e, err, errlen);
    if (rc) return rc;
    *id = e->id;
    if (e->kind == MN_REPLY || e->kind == MN_ERROR) {
        snprintf(err, errlen, "a mailbox takes calls and casts, not kind %d", e->kind);
        return MANTA_EPROTO;
    }
    if ((size_t)e->nframes != in->nextra) {
        snprintf(err, errlen, "envelope announces %d payload frames, %zu arrived", e->nframes,
                 in->nextra);
        return MANTA_EPROTO;
    }
    if (in->total > m->max_message) {
        snprintf(err, errlen, "message of %zu bytes exceeds this actor's limit of %zu", in->total,
                 m->max_message);
        return MANTA_EMSGSIZE;
    }
    return 0;
}

static void reject(manta_ctx *m, inbound *in, uint64_t id, int rc, const char *err)
{
    char msg[400];
    snprintf(msg, sizeof msg, "actor %s rejected a message: %s", m->self, err);
    if (rc == MANTA_EMSGSIZE)
        m->stats.oversized++;
    else if (strstr(err, "protocol version"))
        m->stats.bad_versions++;
    else
        m->stats.bad_envelopes++;
    send_error(m, &in->route, id, rc, msg);
}

static int recv_mailbox(manta_ctx *m, void *unused, int revents)
{
    int n = 0;
    for (; n < 1024 && !m->stopping; n++) {
        inbound in;
        if (!read_inbound(m->mailbox, &in)) break;
        mn_env e;
        char err[300];
        uint64_t id;
        int rc = check_inbound(m, &in, &e, &id, err, sizeof err);
        if (rc != 0)
            reject(m, &in, id, rc, err);
        else if (m->depth >= MN_MAX_DEPTH || route_busy(m, &in.route, NULL))
            defer(m, &in);
        else
            dispatch(m, &in.route, &in.frame, in.have_frame, &e);
        zmq_msg_close(&in.route);
        zmq_msg_close(&in.env);
        zmq_msg_close(&in.frame);
    }
    if (n) mn_metrics_backlog(m, n);
    return n;
}

/* ---- answering ---- */

static int answer(manta_req *c, int kind, int status, const void *data, size_t len)
{
    c->answered = true;
    manta_ctx *m = c->ctx;
    mn_metrics_served(m, c->t0);
    int rc = m->mailbox ? mn_env_send(m->mailbox, zmq_msg_data(&c->route), zmq_msg_size(&c->route),
                                      kind, c->id, NULL, status, data, len, NULL)
                        : MANTA_ECLOSED;
    if (c->deferred && c->returned) {
        zmq_msg_close(&c->route);
        free(c);
    }
    return rc;
}

int manta_reply(manta_req *c, const void *data, size_t len)
{
    if (!c || (len && !data)) return mn_fail(MANTA_EINVAL, "manta_reply: bad arguments");
    if (c->answered || c->is_cast) return 0;
    return answer(c, MN_REPLY, 0, data, len);
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
    if (code >= 0 || code <= -100) code = MANTA_EREMOTE;
    return answer(c, MN_ERROR, code, msg, strlen(msg));
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

/* ---- the mailbox on the loop ---- */

static int set_mailbox_options(manta_ctx *m, void *sock)
{
    int zero = 0, one = 1;
    zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof zero);
    if (mn_limit_socket(sock, mn_max_frame(m)) != 0) return -1;
    int linger = 1000; /* replies already queued still leave at a clean stop */
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    /* A reply to a caller that has gone fails loudly instead of vanishing. */
    zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (mn_auth_server(m, sock) != 0) return -1;
    /* Callers name themselves (routing id NAME#PID). When a caller's socket
     * reconnects before this side has noticed the old connection is gone,
     * the new connection must win; without handover ZeroMQ would close it,
     * and the caller would take that for the actor's death. */
    return zmq_setsockopt(sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
}

/* Handshakes that fail before the ZAP handler is asked (a client with no
 * CURVE, or with another server key) show only on the socket's monitor. */
static int on_mailbox_monitor(manta_ctx *m, void *unused, int revents)
{
    int n = 0;
    for (;; n++) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, m->mb_mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            break;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (char *)zmq_msg_data(&ev) + 2, 4);
        }
        zmq_msg_init(&addr);
        if (zmq_msg_more(&ev)) zmq_msg_recv(&addr, m->mb_mon, 0);
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
            mn_auth_refused(m,
                            "a client of %.*s failed the CURVE handshake (it has no CURVE keys "
                            "or another server key; ZMTP error 0x%x)",
                            (int)zmq_msg_size(&addr), (const char *)zmq_msg_data(&addr), value);
        zmq_msg_close(&ev);
        zmq_msg_close(&addr);
    }
    m->stats.auth_refused = atomic_load(&m->auth_refused);
    return n;
}

static int watch_handshakes(manta_ctx *m)
{
    if (!m->curve) return 0;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://mn-mailbox-mon-%p", (void *)m);
    int zero = 0;
    if (zmq_socket_monitor(m->mailbox, ep, ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0 ||
        !(m->mb_mon = zmq_socket(m->zmq, ZMQ_PAIR)) ||
        zmq_setsockopt(m->mb_mon, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(m->mb_mon, ep) != 0)
        return mn_fail(MANTA_EZMQ, "mailbox monitor: %s", zmq_strerror(zmq_errno()));
    m->mb_mon_io = mn_io_add(m, m->mb_mon, -1, ZMQ_POLLIN, on_mailbox_monitor, NULL);
    return m->mb_mon_io ? 0 : MANTA_ENOMEM;
}

int mn_mailbox_bind(manta_ctx *m, const char *endpoint)
{
    if (mn_loop_hook_add(m, &serve_hook) != 0) return MANTA_ENOMEM;
    m->mailbox = zmq_socket(m->zmq, ZMQ_ROUTER);
    if (!m->mailbox) return mn_fail(MANTA_EZMQ, "mailbox: %s", zmq_strerror(zmq_errno()));
    if (set_mailbox_options(m, m->mailbox) != 0)
        return mn_fail(MANTA_EZMQ, "mailbox options: %s",
                       manta_last_error()[0] ? manta_last_error() : zmq_strerror(zmq_errno()));
    int rc = watch_handshakes(m);
    if (rc) return rc;
    if (zmq_bind(m->mailbox, endpoint) != 0)
        return mn_fail(MANTA_EZMQ, "bind mailbox %s: %s", endpoint, zmq_strerror(zmq_errno()));
    size_t n = sizeof m->endpoint;
    zmq_getsockopt(m->mailbox, ZMQ_LAST_ENDPOINT, m->endpoint, &n);
    if (!mn_io_add(m, m->mailbox, -1, ZMQ_POLLIN, recv_mailbox, NULL)) return MANTA_ENOMEM;
    return 0;
}

/* A deferred call that can run now needs a turn without waiting; one whose
 * caller is still busy waits for an event (its caller's method returning is
 * one: it ends a turn). */
static int64_t serve_due(manta_ctx *m)
{
    if (m->depth >= MN_MAX_DEPTH || m->stopping) return INT64_MAX;
    for (mn_deferred *d = m->deferred_head; d; d = d->next)
        if (!route_busy(m, &d->route, d)) return 0;
    return INT64_MAX;
}

static void serve_free(manta_ctx *m)
{
    while (m->deferred_head) {
        mn_deferred *d = m->deferred_head;
        m->deferred_head = d->next;
        free_deferred(d);
    }
    m->deferred_tail = NULL;
    if (m->mb_mon) {
        mn_io_del(m, m->mb_mon_io);
        zmq_socket_monitor(m->mailbox, NULL, 0);
        zmq_close(m->mb_mon);
        m->mb_mon = NULL, m->mb_mon_io = NULL;
    }
    if (m->mailbox) zmq_close(m->mailbox);
    m->mailbox = NULL;
}

static const mn_loop_hook serve_hook = {serve_due, drain_deferred, serve_free};
