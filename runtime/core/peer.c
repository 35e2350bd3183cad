/*
 * peer.c -- the processes this one talks to: one DEALER socket per actor
 * (or object owner, or node agent), and what the loop learns of their death
 * and return.
 *
 * Each peer's socket has a monitor. A DISCONNECTED event means the process
 * went away: every call pending on that peer resolves EDIED at once, and
 * the peer becomes suspect. Only a named actor has a directory record to
 * consult: while a suspect peer has calls pending the record is re-read
 * every 100 ms, and a new message to a suspect peer waits (is held) until a
 * fresh reading says where to send it or that the actor is dead for good.
 *
 * The reading is asynchronous (redis_async.c): a paused or slow Redis delays
 * only the held messages, never the loop, so the process keeps serving its
 * mailbox and its other peers meanwhile.
 */
#include "internal.h"
#include "manta_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How often a suspect peer's record is read while calls wait on it. */
#define CHECK_EVERY_MS 100
/* A socket that has not connected this long after zmq_connect may point at
 * an endpoint nobody serves any more: the actor died before the connection
 * was made (so no DISCONNECTED ever came) and lives elsewhere now. */
#define UNREACHED_MS 1000

/* A message waiting for a suspect peer's directory reading. */
struct mn_held {
    int kind;
    uint64_t id;
    char *method;
    void *arg;
    size_t len;
    zmq_msg_t frame;
    bool have_frame;
    mn_held *next;
};

static const mn_loop_hook peers_hook;

static int on_socket(manta_ctx *m, void *arg, int revents)
{
    return mn_recv_replies(m, arg);
}

static int on_monitor(manta_ctx *m, void *arg, int revents)
{
    return mn_peer_recv_monitor(m, arg);
}

static void set_suspect(manta_ctx *m, mn_peer *p, bool suspect)
{
    if (p->suspect != suspect) m->nsuspect += suspect ? 1 : -1;
    p->suspect = suspect;
}

static const char *peer_name(const mn_peer *p)
{
    return p->owner && p->owner->name ? p->owner->name : p->endpoint;
}

/* ---- making and connecting ---- */

static int open_sockets(manta_ctx *m, mn_peer *p)
{
    p->sock = zmq_socket(m->zmq, ZMQ_DEALER);
    if (!p->sock) return -1;
    int zero = 0, ivl = 10, ivlmax = 200;
    /* No send high-water mark: back-pressure is max_pending, not silent
     * drops. Replies are bounded (mn_limit_socket). */
    zmq_setsockopt(p->sock, ZMQ_SNDHWM, &zero, sizeof zero);
    if (mn_limit_socket(p->sock, mn_max_frame(m)) != 0) return -1;
    if (mn_auth_client(m, p->sock) != 0) return -1;
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof zero);
    /* Reconnect fast: a restarted actor binds the same endpoint again. */
    zmq_setsockopt(p->sock, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(p->sock, ZMQ_RECONNECT_IVL_MAX, &ivlmax, sizeof ivlmax);
    /* The callee sees who calls ("NAME#PID#TOKEN"): see waiting_on() in
     * serve.c. The random token makes the id unguessable: a mailbox hands a
     * connection over to whoever presents the same id (ROUTER_HANDOVER, so
     * that a reconnecting caller wins), and a guessed id would take over
     * another process's replies. It is drawn per socket, so per callee: an
     * id one callee has seen cannot take over this process's connection to
     * another (the socket keeps it through reconnections). */
    char token[17], rid[200];
    mn_random_hex(token, 16);
    int rl = snprintf(rid, sizeof rid, "%s#%d#%s", m->self, (int)getpid(), token);
    zmq_setsockopt(p->sock, ZMQ_ROUTING_ID, rid, (size_t)rl);
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://mn-mon-%d", ++m->npeers);
    int events = getenv("MANTA_DEBUG")
                     ? ZMQ_EVENT_ALL
                     : ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECTED |
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
    if (zmq_socket_monitor(p->sock, mon, events) != 0) return -1;
    p->mon = zmq_socket(m->zmq, ZMQ_PAIR);
    if (!p->mon || zmq_connect(p->mon, mon) != 0) return -1;
    zmq_setsockopt(p->mon, ZMQ_LINGER, &zero, sizeof zero);
    return 0;
}

mn_peer *mn_peer_get(manta_ctx *m, const char *endpoint)
{
    for (mn_peer *p = m->peers; p; p = p->next)
        if (!strcmp(p->endpoint, endpoint)) return p;
    if (mn_loop_hook_add(m, &peers_hook) != 0) return NULL;
    mn_peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ctx = m;
    p->endpoint = mn_strdup(endpoint);
    if (!p->endpoint || open_sockets(m, p) != 0) {
        mn_fail(MANTA_EZMQ, "peer socket for %s: %s", endpoint, zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* Registered unpolled: only peers with calls in flight are polled
     * (zmq_poll's cost grows with every socket); an idle peer's monitor is
     * read when it is next used, and late replies wait in its socket. */
    p->io = mn_io_add(m, p->sock, -1, 0, on_socket, p);
    p->io_mon = p->io ? mn_io_add(m, p->mon, -1, 0, on_monitor, p) : NULL;
    if (!p->io_mon) goto fail;
    p->next = m->peers;
    m->peers = p;
    return p;
fail:
    mn_io_del(m, p->io);
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
    p->reconnected = false; /* until this connection's CONNECTED event */
    p->connect_ms = mn_now_ms();
    return 0;
}

void mn_peer_busy(manta_ctx *m, mn_peer *p, bool busy)
{
    short ev = busy ? ZMQ_POLLIN : 0;
    mn_io_events(m, p->io, ev);
    mn_io_events(m, p->io_mon, ev);
}

/* ---- death and return ---- */

/* The hint a failed handshake adds to what a caller is told. */
static void curve_hint(const manta_ctx *m, char *out, size_t n)
{
    snprintf(out, n,
             "if it is alive, it may use CURVE settings or keys other than this process's (CURVE "
             "%s here); every member of a job needs the same MANTA_CURVE and key file "
             "(MANTA_KEYS)",
             m->curve ? "on" : "off");
}

static void on_disconnected(manta_ctx *m, mn_peer *p)
{
    set_suspect(m, p, true);
    p->reconnected = false;
    /* The next message looks the record up first: a new incarnation may
     * live elsewhere. */
    p->next_check = mn_now_ms();
    char why[512], hint[256] = "";
    if (p->handshake_failed) curve_hint(m, hint, sizeof hint);
    snprintf(why, sizeof why, "actor %s died: its connection closed %s%s%s", peer_name(p),
             p->handshake_failed ? "during the handshake" : "while the call was pending",
             hint[0] ? "; " : "", hint);
    p->handshake_failed = false;
    mn_fail_peer_calls(m, p, MANTA_EDIED, why);
}

/* The handshake was refused outright: the peer speaks CURVE and we do
 * not, or it has other keys, or our key is not on its allow-list. ZeroMQ
 * would retry for ever, so the calls waiting fail now, with the likely
 * cause, not at their deadline. (A connection merely closed during the
 * handshake may be a peer dying: on_disconnected says both.) */
static void on_refused(manta_ctx *m, mn_peer *p, uint16_t event, uint32_t value)
{
    char why[512], hint[256];
    curve_hint(m, hint, sizeof hint);
    snprintf(why, sizeof why, "the handshake with %s failed (%s, code 0x%x); %s", peer_name(p),
             event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "our key is not on its allow-list"
                                                      : "protocol error",
             value, hint);
    if (p->pending) mn_log("%s", why);
    mn_fail_peer_calls(m, p, MANTA_ECONNECT, why);
}

int mn_peer_recv_monitor(manta_ctx *m, mn_peer *p)
{
    int n = 0;
    for (;; n++) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, p->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return n;
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
        if (event == ZMQ_EVENT_CONNECTED) p->reconnected = true, p->handshake_failed = false;
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) p->handshake_failed = true;
        if (event == ZMQ_EVENT_DISCONNECTED) on_disconnected(m, p);
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
            event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            on_refused(m, p, event, value);
    }
}

/* ---- held messages ---- */

int mn_peer_hold(manta_ctx *m, mn_peer *p, int kind, uint64_t id, const char *method,
                 const void *arg, size_t len, zmq_msg_t *frame)
{
    mn_held *h = calloc(1, sizeof *h);
    if (!h) return mn_fail(MANTA_ENOMEM, "out of memory holding a message for %s", peer_name(p));
    h->kind = kind, h->id = id, h->len = len;
    h->method = mn_strdup(method);
    h->arg = len ? malloc(len) : NULL;
    if (!h->method || (len && !h->arg)) {
        free(h->method), free(h->arg), free(h);
        return mn_fail(MANTA_ENOMEM, "out of memory holding a message for %s", peer_name(p));
    }
    if (len) memcpy(h->arg, arg, len);
    zmq_msg_init(&h->frame);
    if (frame) zmq_msg_move(&h->frame, frame), h->have_frame = true;
    if (p->held_tail)
        p->held_tail->next = h;
    else
        p->held_head = h;
    p->held_tail = h;
    return 0;
}

static void free_held(mn_held *h)
{
    zmq_msg_close(&h->frame);
    free(h->method);
    free(h->arg);
    free(h);
}

/* Send what waited, in order: calls whose future is still pending, and
 * casts. A dead peer's calls have resolved EDIED already; drop the rest. */
static void release_held(manta_ctx *m, mn_peer *p)
{
    while (p->held_head) {
        mn_held *h = p->held_head;
        p->held_head = h->next;
        if (!p->held_head) p->held_tail = NULL;
        manta_future *f = h->kind == MN_CALL ? mn_call_find(m, p, h->id) : NULL;
        if (!p->dead && (f || h->kind == MN_CAST)) {
            int rc = mn_peer_connect(p);
            if (rc == 0)
                rc = mn_env_send(p->sock, NULL, 0, h->kind, h->id, h->method, 0, h->arg, h->len,
                                 h->have_frame ? &h->frame : NULL);
            if (rc == 0) {
                if (h->kind == MN_CAST) m->stats.casts_sent++;
            } else if (f) {
                mn_call_resolve(m, f, rc, manta_last_error());
            } else {
                mn_log("cast %s to %s dropped: %s", h->method, peer_name(p), manta_last_error());
            }
        }
        free_held(h);
    }
}

/* ---- the directory lookup ---- */

static bool ended(manta_actor_state st)
{
    return st == MANTA_ACTOR_DEAD || st == MANTA_ACTOR_FAILED || st == MANTA_ACTOR_STOPPED;
}

/* A new incarnation on another endpoint (tcp port, other node). */
static void repoint(mn_peer *p, const char *ep)
{
    if (!ep[0] || !strcmp(ep, p->endpoint)) return;
    char *copy = mn_strdup(ep);
    if (!copy) return;
    if (p->connected) zmq_disconnect(p->sock, p->endpoint);
    p->connected = false;
    free(p->endpoint);
    p->endpoint = copy;
    mn_peer_connect(p);
}

/* What a reading of the record means for the peer. */
static void apply_record(manta_ctx *m, mn_peer *p, int rc, const manta_actor_info *info)
{
    p->next_check = mn_now_ms() + CHECK_EVERY_MS;
    if (rc == MANTA_ENOTFOUND || (rc == 0 && ended(info->state))) {
        p->dead = true;
        char why[256];
        snprintf(why, sizeof why, "actor %s is %s", peer_name(p),
                 rc ? "gone from the directory" : manta_actor_state_name(info->state));
        mn_fail_peer_calls(m, p, MANTA_EDIED, why);
        return;
    }
    if (rc != 0) return; /* registry trouble: try the transport anyway */
    p->dead = false;
    repoint(p, mn_pick_endpoint(info));
    /* "alive" may be stale (the agent has not reaped the old process yet),
     * so it counts only once the socket has connected again. Until then
     * calls still go (they queue for the next incarnation) and the record
     * is read again every 100 ms while any is pending. */
    if (info->state == MANTA_ACTOR_ALIVE && p->reconnected) {
        set_suspect(m, p, false);
        p->incarnation = info->incarnation;
    }
}

static void on_record(manta_ctx *m, redisReply *r, void *arg)
{
    mn_peer *p = arg;
    p->looking = false;
    manta_reg_actor rec;
    memset(&rec, 0, sizeof rec);
    char key[MANTA_REG_KEY_MAX] = "";
    int rc = MANTA_EREDIS;
    if (r && manta_reg_key(m, MANTA_REG_ACTOR, peer_name(p), key, sizeof key) == 0)
        rc = manta_reg_actor_from_reply(key, r, &rec);
    const manta_actor_info info = rec.info;
    if (rc == MANTA_EREDIS)
        mn_log("directory lookup of actor %s: %s", peer_name(p), r ? r->str : manta_last_error());
    apply_record(m, p, rc, &info);
    release_held(m, p);
}

/* Start reading the peer's record unless a reading is under way. Returns
 * 0 when one is (the answer comes to on_record), else a code. */
static int look_up(manta_ctx *m, mn_peer *p)
{
    if (p->looking) return 0;
    char key[MANTA_REG_KEY_MAX];
    int rc = manta_reg_key(m, MANTA_REG_ACTOR, p->owner->name, key, sizeof key);
    if (rc == 0) rc = mn_aredis_command(m, on_record, p, "HGETALL %s", key);
    if (rc == 0)
        p->looking = true;
    else
        p->next_check = mn_now_ms() + CHECK_EVERY_MS;
    return rc;
}

int mn_peer_admit(manta_ctx *m, mn_peer *p)
{
    /* An idle peer is not polled: read what its monitor said meanwhile
     * (a death, a reconnect) before a new message is taken for a victim. */
    if (!p->pending) mn_peer_recv_monitor(m, p);
    if (p->held_head) return MN_HOLD; /* behind earlier messages: keep the order */
    bool named = p->owner && p->owner->name;
    /* Never connected, long after zmq_connect: a process killed before the
     * connection was made leaves no DISCONNECTED behind, and a message sent
     * now would wait in a pipe to nowhere. Read the record first. */
    if (named && p->connected && !p->reconnected && !p->suspect && !p->dead &&
        mn_now_ms() - p->connect_ms >= UNREACHED_MS) {
        set_suspect(m, p, true);
        p->next_check = mn_now_ms();
    }
    if (!p->suspect && !p->dead) return MN_SEND;
    if (named && (p->looking || mn_now_ms() >= p->next_check) && look_up(m, p) == 0) return MN_HOLD;
    return p->dead ? MN_DEAD : MN_SEND;
}

/* ---- the peers' hook ---- */

int64_t mn_peers_due(manta_ctx *m)
{
    int64_t due = INT64_MAX;
    if (!m->nsuspect) return due;
    for (mn_peer *p = m->peers; p; p = p->next)
        if (p->suspect && p->pending && !p->looking && p->owner && p->owner->name &&
            p->next_check < due)
            due = p->next_check;
    return due;
}

int mn_peers_check(manta_ctx *m)
{
    if (!m->nsuspect) return 0;
    int64_t now = mn_now_ms();
    for (mn_peer *p = m->peers; p; p = p->next)
        if (p->suspect && p->pending && !p->looking && p->owner && p->owner->name &&
            now >= p->next_check)
            look_up(m, p);
    return 0;
}

void mn_peers_free(manta_ctx *m)
{
    while (m->peers) {
        mn_peer *p = m->peers;
        m->peers = p->next;
        while (p->held_head) {
            mn_held *h = p->held_head;
            p->held_head = h->next;
            free_held(h);
        }
        mn_io_del(m, p->io);
        mn_io_del(m, p->io_mon);
        zmq_socket_monitor(p->sock, NULL, 0);
        zmq_close(p->mon);
        zmq_close(p->sock);
        free(p->endpoint);
        free(p);
    }
    m->nsuspect = 0;
    /* The handles name peers: they go with them. */
    while (m->actors) {
        manta_actor *a = m->actors;
        m->actors = a->next;
        free(a->name);
        free(a);
    }
}

static const mn_loop_hook peers_hook = {mn_peers_due, mn_peers_check, mn_peers_free};
