/*
 * loop.c -- the per-process event loop: a poll set, timers and fd watches.
 *
 * It knows sources, not what they carry. A source is a ZeroMQ socket or a
 * file descriptor with a callback (mn_io); the layers above register theirs
 * (peer.c its DEALER sockets and monitors, serve.c the mailbox,
 * redis_async.c its hiredis socket) and plug in with a const table of
 * hooks (mn_loop_hook) that says when they next need a turn and what to do
 * after each, as Redis's networking.c sits on ae.c.
 *
 * One turn (mn_loop_once): wait in zmq_poll until a source is ready, a
 * timer or a hook is due, or the caller's timeout; serve every ready
 * source; run the timers that are due; run the hooks. A turn returns how
 * many events it handled, which gives manta_poll_once its "return after the
 * first event" (uv_run's UV_RUN_ONCE); manta_poll runs turns for a while.
 *
 * Turns nest: a callback may turn the loop again (a method waiting on a
 * future). So a turn first copies what is ready, and entries removed while
 * a turn is running are only marked, and freed when the outermost turn ends.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct mn_timer {
    uint64_t id;
    int64_t due;
    manta_timer_fn fn;
    void *arg;
    mn_timer *next;
};

struct mn_io {
    void *sock;
    int fd;
    short events;
    bool removed;
    mn_io_fn fn;
    void *arg;
    manta_fd_fn user_fn; /* for manta_watch_fd */
    void *user_arg;
    mn_io *next;
};

typedef struct ready_item {
    mn_io *io;
    int revents;
} ready_item;

/* ---- sources ---- */

mn_io *mn_io_add(manta_ctx *m, void *sock, int fd, short events, mn_io_fn fn, void *arg)
{
    mn_io *io = calloc(1, sizeof *io);
    if (!io) {
        mn_fail(MANTA_ENOMEM, "event loop: out of memory for a poll entry");
        return NULL;
    }
    io->sock = sock, io->fd = sock ? -1 : fd, io->events = events;
    io->fn = fn, io->arg = arg;
    if (m->io_tail)
        m->io_tail->next = io;
    else
        m->io_head = io;
    m->io_tail = io;
    m->nio++;
    if (events) m->items_dirty = true;
    return io;
}

void mn_io_events(manta_ctx *m, mn_io *io, short events)
{
    if (!io || io->events == events) return;
    io->events = events;
    m->items_dirty = true;
}

void mn_io_del(manta_ctx *m, mn_io *io)
{
    if (!io) return;
    mn_io *prev = NULL;
    for (mn_io *i = m->io_head; i && i != io; i = i->next) prev = i;
    if (prev)
        prev->next = io->next;
    else if (m->io_head == io)
        m->io_head = io->next;
    else
        return; /* not in the set */
    if (m->io_tail == io) m->io_tail = prev;
    m->nio--;
    m->items_dirty = true;
    /* A turn may hold it in its ready list: free it when no turn runs. */
    io->removed = true;
    io->next = m->io_removed;
    m->io_removed = io;
}

static void free_removed(manta_ctx *m)
{
    while (m->io_removed) {
        mn_io *io = m->io_removed;
        m->io_removed = io->next;
        free(io);
    }
}

int mn_loop_hook_add(manta_ctx *m, const mn_loop_hook *h)
{
    for (int i = 0; i < m->nhooks; i++)
        if (m->hooks[i] == h) return 0;
    if (m->nhooks == MN_LOOP_MAX_HOOKS)
        return mn_fail(MANTA_ENOMEM, "event loop: more than %d hooks", MN_LOOP_MAX_HOOKS);
    m->hooks[m->nhooks++] = h;
    return 0;
}

/* ---- fd watches (public) ---- */

static int call_watch(manta_ctx *m, void *arg, int revents)
{
    mn_io *io = arg;
    int ev = ((revents & ZMQ_POLLIN) ? MANTA_POLLIN : 0) |
             ((revents & ZMQ_POLLOUT) ? MANTA_POLLOUT : 0) |
             ((revents & ZMQ_POLLERR) ? MANTA_POLLIN : 0);
    io->user_fn(io->user_arg, io->fd, ev);
    return 1;
}

static short zmq_events(int events)
{
    return (short)(((events & MANTA_POLLIN) ? ZMQ_POLLIN : 0) |
                   ((events & MANTA_POLLOUT) ? ZMQ_POLLOUT : 0));
}

int manta_watch_fd(manta_ctx *m, int fd, int events, manta_fd_fn fn, void *arg)
{
    if (!m || fd < 0) return mn_fail(MANTA_EINVAL, "manta_watch_fd: bad fd %d", fd);
    for (mn_io *io = m->io_head; io; io = io->next) {
        if (io->sock || io->fd != fd || io->fn != call_watch) continue;
        if (!events) {
            mn_io_del(m, io);
        } else {
            io->user_fn = fn, io->user_arg = arg;
            mn_io_events(m, io, zmq_events(events));
        }
        return 0;
    }
    if (!events) return 0;
    if (!fn) return mn_fail(MANTA_EINVAL, "manta_watch_fd: no callback for fd %d", fd);
    mn_io *io = mn_io_add(m, NULL, fd, zmq_events(events), call_watch, NULL);
    if (!io) return MANTA_ENOMEM;
    io->arg = io;
    io->user_fn = fn, io->user_arg = arg;
    return 0;
}

/* ---- timers (public) ---- */

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

static int run_timers(manta_ctx *m)
{
    int64_t now = mn_now_ms();
    int n = 0;
    /* Only timers due now; a timer added by a callback waits for the next turn. */
    uint64_t last = m->next_timer;
    while (m->timers && m->timers->due <= now && m->timers->id <= last) {
        mn_timer *t = m->timers;
        m->timers = t->next;
        manta_timer_fn fn = t->fn;
        void *arg = t->arg;
        free(t);
        fn(arg);
        n++;
    }
    return n;
}

/* ---- one turn ---- */

static int rebuild_items(manta_ctx *m)
{
    if (m->nio > m->items_cap || !m->items) {
        size_t cap = m->nio * 2 + 4;
        zmq_pollitem_t *it = realloc(m->items, cap * (sizeof *it + sizeof(mn_io *)));
        if (!it) return mn_fail(MANTA_ENOMEM, "event loop: out of memory for %zu poll items", cap);
        m->items = it, m->items_cap = cap;
    }
    mn_io **owner = (mn_io **)(m->items + m->items_cap);
    size_t i = 0;
    for (mn_io *io = m->io_head; io; io = io->next) {
        if (!io->events) continue;
        m->items[i] = (zmq_pollitem_t){io->sock, io->fd, io->events, 0};
        owner[i++] = io;
    }
    m->nitems = i;
    m->items_dirty = false;
    return 0;
}

/* How long this turn may sleep: the caller's limit, bounded by the next
 * timer and whatever a hook has due. -1: no limit. */
static long turn_wait(manta_ctx *m, int timeout_ms)
{
    int64_t now = mn_now_ms(), due = INT64_MAX;
    if (m->timers) due = m->timers->due;
    for (int i = 0; i < m->nhooks; i++) {
        if (!m->hooks[i]->due) continue;
        int64_t d = m->hooks[i]->due(m);
        if (d < due) due = d;
    }
    if (due == INT64_MAX) return timeout_ms < 0 ? -1 : timeout_ms;
    int64_t wait = due - now;
    if (wait < 0) wait = 0;
    if (timeout_ms >= 0 && wait > timeout_ms) wait = timeout_ms;
    return (long)wait;
}

/* Serve what zmq_poll found ready. Copied first: serving may turn the loop
 * again and rebuild the item array under us. */
static int serve_ready(manta_ctx *m, int n)
{
    if (n <= 0) return 0;
    ready_item stack_ready[64], *ready = stack_ready;
    if (n > 64) ready = malloc((size_t)n * sizeof *ready);
    if (!ready) return mn_fail(MANTA_ENOMEM, "event loop: out of memory for %d ready items", n);
    mn_io **owner = (mn_io **)(m->items + m->items_cap);
    size_t nready = 0;
    for (size_t i = 0; i < m->nitems && nready < (size_t)n; i++)
        if (m->items[i].revents) ready[nready++] = (ready_item){owner[i], m->items[i].revents};
    int handled = 0;
    for (size_t i = 0; i < nready; i++)
        if (!ready[i].io->removed)
            handled += ready[i].io->fn(m, ready[i].io->arg, ready[i].revents);
    if (ready != stack_ready) free(ready);
    return handled;
}

static int run_hooks(manta_ctx *m)
{
    int n = 0;
    for (int i = 0; i < m->nhooks; i++)
        if (m->hooks[i]->run) n += m->hooks[i]->run(m);
    return n;
}

int mn_loop_once(manta_ctx *m, int timeout_ms)
{
    if (!m || !m->zmq) return MANTA_ECLOSED;
    if (m->items_dirty || !m->items) {
        int rc = rebuild_items(m);
        if (rc) return rc;
    }
    long wait = turn_wait(m, timeout_ms);
    if (wait < 0 && m->nitems == 0) return 0; /* nothing could ever wake it */
    int n = zmq_poll(m->items, (int)m->nitems, wait);
    if (n < 0 && zmq_errno() != EINTR)
        return mn_fail(MANTA_EZMQ, "event loop: zmq_poll: %s", zmq_strerror(zmq_errno()));
    m->loop_depth++;
    int handled = serve_ready(m, n);
    if (handled >= 0) handled += run_timers(m);
    if (handled >= 0) handled += run_hooks(m);
    if (--m->loop_depth == 0) free_removed(m);
    return handled;
}

int manta_poll(manta_ctx *m, int timeout_ms)
{
    if (!m) return mn_fail(MANTA_EINVAL, "manta_poll: no ctx");
    int64_t until = mn_now_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    do {
        int64_t left = until - mn_now_ms();
        int rc = mn_loop_once(m, (int)(left < 0 ? 0 : left));
        if (rc < 0) return rc;
    } while (mn_now_ms() < until);
    return 0;
}

int manta_poll_once(manta_ctx *m, int timeout_ms)
{
    if (!m) return mn_fail(MANTA_EINVAL, "manta_poll_once: no ctx");
    int64_t until = timeout_ms < 0 ? INT64_MAX : mn_now_ms() + timeout_ms;
    for (;;) {
        int64_t left = until == INT64_MAX ? -1 : until - mn_now_ms();
        if (until != INT64_MAX && left < 0) left = 0;
        /* A turn can wake with nothing to do (a hook's due time that ended
         * with no event, EINTR): wait again for what is left. */
        int n = mn_loop_once(m, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n != 0) return n;
        if (until != INT64_MAX && mn_now_ms() >= until) return 0;
        if (until == INT64_MAX && m->nitems == 0 && turn_wait(m, -1) < 0) return 0;
    }
}

void mn_loop_free(manta_ctx *m)
{
    for (int i = m->nhooks - 1; i >= 0; i--)
        if (m->hooks[i]->fini) m->hooks[i]->fini(m);
    m->nhooks = 0;
    mn_metrics_free(m);
    while (m->timers) {
        mn_timer *t = m->timers;
        m->timers = t->next;
        free(t);
    }
    while (m->io_head) {
        mn_io *io = m->io_head;
        m->io_head = io->next;
        free(io);
    }
    m->io_tail = NULL;
    m->nio = 0;
    free_removed(m);
    free(m->items);
    m->items = NULL;
    m->items_cap = m->nitems = 0;
}
