/*
 * redis_async.c -- non-blocking Redis on the event loop: a second Redis
 * link per process, a hiredis redisAsyncContext whose socket joins the
 * loop's poll set through a small adapter (hiredis's ev hooks onto mn_io).
 *
 * For what the loop must never wait on: a suspect peer's directory record,
 * an actor's heartbeat. The blocking link (registry.c) stays for what a
 * caller waits on anyway (creating, looking up, killing an actor).
 *
 * The link opens at the first command and queues AUTH and SELECT before it,
 * so nothing waits for the connection either. A command that has no answer
 * after MN_AREDIS_TIMEOUT_MS drops the link: every command in flight then
 * gets a NULL reply, and the next command opens a new link.
 */
#include "internal.h"

#include <hiredis/async.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct cmd {
    mn_aredis_fn fn;
    void *arg;
    int64_t sent;
    struct cmd *next;
} cmd;

struct mn_aredis {
    manta_ctx *m;
    redisAsyncContext *ac; /* NULL: no link now */
    mn_io *io;
    short events;
    cmd *head, *tail; /* in flight, oldest first (Redis answers in order) */
    bool closing;     /* the ctx is being freed: answer nobody */
    char why[160];    /* why the link was dropped, for the NULL replies */
};

static const mn_loop_hook aredis_hook;

/* ---- the adapter: hiredis's event hooks onto the loop ---- */

static void ev_set(struct mn_aredis *a, short add, short del)
{
    a->events = (short)((a->events | add) & ~del);
    mn_io_events(a->m, a->io, a->events);
}

static void add_read(void *d)
{
    ev_set(d, ZMQ_POLLIN, 0);
}

static void del_read(void *d)
{
    ev_set(d, 0, ZMQ_POLLIN);
}

static void add_write(void *d)
{
    ev_set(d, ZMQ_POLLOUT, 0);
}

static void del_write(void *d)
{
    ev_set(d, 0, ZMQ_POLLOUT);
}

static void cleanup(void *d)
{
    struct mn_aredis *a = d;
    mn_io_del(a->m, a->io);
    a->io = NULL;
    a->events = 0;
}

static int on_io(manta_ctx *m, void *arg, int revents)
{
    struct mn_aredis *a = arg;
    /* Reading may end the link (a->ac is then NULL): check before writing. */
    if (a->ac && (revents & (ZMQ_POLLIN | ZMQ_POLLERR))) redisAsyncHandleRead(a->ac);
    if (a->ac && (revents & ZMQ_POLLOUT)) redisAsyncHandleWrite(a->ac);
    return 1;
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct mn_aredis *a = ac->data;
    if (status == REDIS_OK) return;
    mn_log("async Redis link to %s:%d: %s", a->m->redis_addr.host, a->m->redis_addr.port,
           ac->errstr);
    a->ac = NULL; /* hiredis frees it */
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    struct mn_aredis *a = ac->data;
    a->ac = NULL; /* hiredis frees it */
}

/* ---- commands ---- */

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct mn_aredis *a = ac->data;
    cmd *c = privdata, **pp = &a->head, *prev = NULL;
    while (*pp && *pp != c) prev = *pp, pp = &(*pp)->next;
    if (*pp) *pp = c->next;
    if (a->tail == c) a->tail = prev;
    redisReply *r = reply;
    if (!r)
        mn_fail(MANTA_EREDIS, "async Redis link: %s",
                a->why[0]                     ? a->why
                : ac->errstr && ac->errstr[0] ? ac->errstr
                                              : "closed");
    if (a->closing) {
        /* the ctx is going: nobody to tell */
    } else if (c->fn) {
        c->fn(a->m, r, c->arg);
    } else if (!r || r->type == REDIS_REPLY_ERROR) {
        mn_log("async Redis command failed: %s", r ? r->str : manta_last_error());
    }
    free(c);
}

static int queue(struct mn_aredis *a, mn_aredis_fn fn, void *arg, const char *fmt, va_list ap)
{
    cmd *c = calloc(1, sizeof *c);
    if (!c) return mn_fail(MANTA_ENOMEM, "async Redis: out of memory for a command");
    c->fn = fn, c->arg = arg, c->sent = mn_now_ms();
    if (redisvAsyncCommand(a->ac, on_reply, c, fmt, ap) != REDIS_OK) {
        free(c);
        return mn_fail(MANTA_EREDIS, "async Redis: cannot queue '%s': %s", fmt,
                       a->ac->errstr && a->ac->errstr[0] ? a->ac->errstr : "link closing");
    }
    if (a->tail)
        a->tail->next = c;
    else
        a->head = c;
    a->tail = c;
    return 0;
}

static int queue_v(struct mn_aredis *a, mn_aredis_fn fn, void *arg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = queue(a, fn, arg, fmt, ap);
    va_end(ap);
    return rc;
}

/* Open the link and queue what a connection needs before any command
 * (the same authentication and database as the blocking link). */
static int link_open(manta_ctx *m, struct mn_aredis *a)
{
    if (!m->redis_addr.host[0])
        return mn_fail(MANTA_EREDIS, "async Redis link: no Redis configured");
    redisAsyncContext *ac = redisAsyncConnect(m->redis_addr.host, m->redis_addr.port);
    if (!ac || ac->err) {
        int rc = mn_fail(MANTA_EREDIS, "async Redis link to %s:%d: %s", m->redis_addr.host,
                         m->redis_addr.port, ac ? ac->errstr : "out of memory");
        if (ac) redisAsyncFree(ac);
        return rc;
    }
    a->io = mn_io_add(m, NULL, ac->c.fd, 0, on_io, a);
    if (!a->io) {
        redisAsyncFree(ac);
        return MANTA_ENOMEM;
    }
    ac->data = a;
    ac->ev.data = a;
    ac->ev.addRead = add_read, ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write, ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    a->ac = ac;
    a->why[0] = 0;
    int rc = 0;
    const manta_redis_addr *ad = &m->redis_addr;
    if (ad->user[0]) /* an ACL user, with or without a password */
        rc = queue_v(a, NULL, NULL, "AUTH %s %s", ad->user, ad->password);
    else if (ad->password[0])
        rc = queue_v(a, NULL, NULL, "AUTH %s", ad->password);
    if (rc == 0 && ad->db) rc = queue_v(a, NULL, NULL, "SELECT %d", ad->db);
    return rc;
}

int mn_aredis_command(manta_ctx *m, mn_aredis_fn fn, void *arg, const char *fmt, ...)
{
    if (!m->aredis) {
        if (mn_loop_hook_add(m, &aredis_hook) != 0) return MANTA_ENOMEM;
        m->aredis = calloc(1, sizeof *m->aredis);
        if (!m->aredis) return mn_fail(MANTA_ENOMEM, "async Redis: out of memory");
        m->aredis->m = m;
    }
    struct mn_aredis *a = m->aredis;
    if (a->closing) return mn_fail(MANTA_ECLOSED, "async Redis: runtime shutting down");
    if (!a->ac) {
        int rc = link_open(m, a);
        if (rc) return rc;
    }
    va_list ap;
    va_start(ap, fmt);
    int rc = queue(a, fn, arg, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- the hook: command deadlines, and the end ---- */

static int64_t aredis_due(manta_ctx *m)
{
    struct mn_aredis *a = m->aredis;
    return a && a->head ? a->head->sent + MN_AREDIS_TIMEOUT_MS : INT64_MAX;
}

static int aredis_run(manta_ctx *m)
{
    struct mn_aredis *a = m->aredis;
    if (!a || !a->head || !a->ac || mn_now_ms() < a->head->sent + MN_AREDIS_TIMEOUT_MS) return 0;
    redisAsyncContext *ac = a->ac;
    snprintf(a->why, sizeof a->why, "no answer from Redis at %s:%d within %d ms",
             m->redis_addr.host, m->redis_addr.port, MN_AREDIS_TIMEOUT_MS);
    mn_log("%s: dropping the async link", a->why);
    a->ac = NULL;
    redisAsyncFree(ac); /* answers every command in flight with NULL */
    return 1;
}

static void aredis_free(manta_ctx *m)
{
    struct mn_aredis *a = m->aredis;
    if (!a) return;
    a->closing = true;
    if (a->ac) {
        redisAsyncContext *ac = a->ac;
        a->ac = NULL;
        redisAsyncFree(ac);
    }
    while (a->head) { /* not reached by hiredis (a link that never opened) */
        cmd *c = a->head;
        a->head = c->next;
        free(c);
    }
    free(a);
    m->aredis = NULL;
}

static const mn_loop_hook aredis_hook = {aredis_due, aredis_run, aredis_free};
