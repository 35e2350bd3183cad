/*
 * test_loop.c -- the event loop driven by events, against a real
 * redis-server and real actor processes: manta_poll_once returns at the
 * first event (a timer, an fd, a reply, an incoming call) and not before,
 * and a suspect peer's directory lookup never stalls serving, even while
 * Redis does not answer at all (SIGSTOP).
 *
 * This program is also its own actors: the node agent starts it again with
 * MANTA_ROLE set, and main() hands over to manta_init() at once.
 */
#include <manta.h>

#include "testutil.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static test_redis redis;

/* ---- the test actor ---- */

/* What a poll_once inside the actor saw, and the relay's two calls. */
typedef struct wstate {
    manta_ctx *m;
    int64_t poll_ms;  /* from the start of the poll to the ping being served */
    int poll_returns; /* manta_poll_once calls until then */
    int poll_done;
    int hangs;       /* "hang" calls received */
    manta_req *hung; /* the last of them, never answered */
    manta_actor *target;
    int relay[2];  /* statuses of the relay's first and second call */
    int notes[64]; /* what "note" casts carried, in arrival order */
    int nnotes;
} wstate;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int w_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    wstate *s = state;
    s->m = m;
    s->relay[0] = s->relay[1] = MANTA_EPENDING;
    return 0;
}

static int w_ping(manta_req *c, void *st, const void *arg, size_t len)
{
    return manta_reply(c, "pong", 4);
}

static int w_pid(manta_req *c, void *st, const void *arg, size_t len)
{
    int pid = (int)getpid();
    return manta_reply(c, &pid, sizeof pid);
}

/* From a timer, not a method: the driver's calls are then not queued behind
 * a method of theirs still on the dispatch stack. */
static void poll_until_served(void *arg)
{
    wstate *s = arg;
    manta_stats st;
    manta_stats_get(s->m, &st);
    uint64_t served = st.calls_served;
    int64_t t0 = now_ms();
    while (now_ms() - t0 < 3000) {
        int n = manta_poll_once(s->m, 3000);
        s->poll_returns++;
        manta_stats_get(s->m, &st);
        if (n > 0 && st.calls_served > served) break;
    }
    s->poll_ms = now_ms() - t0;
    s->poll_done = 1;
}

static int w_arm_poll(manta_req *c, void *st, const void *arg, size_t len)
{
    wstate *s = st;
    manta_timer_add(s->m, 0, poll_until_served, s);
    return 0;
}

static int w_poll_result(manta_req *c, void *st, const void *arg, size_t len)
{
    wstate *s = st;
    int64_t r[3] = {s->poll_done, s->poll_ms, s->poll_returns};
    return manta_reply(c, r, sizeof r);
}

static int w_hang(manta_req *c, void *st, const void *arg, size_t len)
{
    wstate *s = st;
    s->hangs++;
    s->hung = manta_req_defer(c);
    return 0;
}

static int w_hangs(manta_req *c, void *st, const void *arg, size_t len)
{
    wstate *s = st;
    return manta_reply(c, &s->hangs, sizeof s->hangs);
}

/* Call the target's "hang"; when that call dies with its process, call it
 * again: the second call meets a suspect peer. */
static void relay(void *arg)
{
    wstate *s = arg;
    for (int i = 0; i < 2; i++) {
        manta_future *f = manta_call_timeout(s->m, s->target, "hang", NULL, 0, i ? 8000 : 20000);
        s->relay[i] = manta_get(f, -1, NULL, NULL);
        manta_future_free(f);
        if (s->relay[i] != MANTA_EDIED) break;
    }
}

static int w_arm_relay(manta_req *c, void *st, const void *arg, size_t len)
{
    wstate *s = st;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)len, (const char *)arg);
    int rc = manta_actor_lookup(s->m, name, &s->target);
    if (rc) return rc;
    manta_timer_add(s->m, 0, relay, s);
    return 0;
}

static int w_relay_result(manta_req *c, void *st, const void *arg, size_t len)
{
    wstate *s = st;
    return manta_reply(c, s->relay, sizeof s->relay);
}

static int w_sleep(manta_req *c, void *st, const void *arg, size_t len)
{
    int ms = 0;
    if (len == sizeof ms) memcpy(&ms, arg, sizeof ms);
    usleep((useconds_t)ms * 1000);
    return 0;
}

static int w_crash(manta_req *c, void *st, const void *arg, size_t len)
{
    _exit(9);
}

static int w_note(manta_req *c, void *st, const void *arg, size_t len)
{
    wstate *s = st;
    if (len == sizeof(int) && s->nnotes < 64) memcpy(&s->notes[s->nnotes++], arg, sizeof(int));
    return 0;
}

static int w_notes(manta_req *c, void *st, const void *arg, size_t len)
{
    wstate *s = st;
    return manta_reply(c, s->notes, (size_t)s->nnotes * sizeof(int));
}

static const manta_method w_methods[] = {
    {"crash", w_crash},         {"note", w_note},
    {"notes", w_notes},

    {"ping", w_ping},           {"pid", w_pid},
    {"arm_poll", w_arm_poll},   {"poll_result", w_poll_result},
    {"hang", w_hang},           {"hangs", w_hangs},
    {"arm_relay", w_arm_relay}, {"relay_result", w_relay_result},
    {"sleep", w_sleep},         {NULL, NULL}};
static const manta_class waker = {"waker", sizeof(wstate), w_init, NULL, w_methods};
static const manta_class *const classes[] = {&waker, NULL};

/* ---- helpers ---- */

static int job_no;

static manta_ctx *start(void)
{
    char job[48];
    snprintf(job, sizeof job, "l%d-%d", (int)getpid(), ++job_no);
    manta_options o = {
        .redis_url = redis.url, .job = job, .classes = classes, .call_timeout_ms = 10000};
    manta_ctx *m = NULL;
    int rc = manta_init(&m, &o);
    if (rc) fprintf(stderr, "manta_init: %s\n", manta_last_error());
    assert_int_equal(rc, 0);
    return m;
}

static void stop_and_check_clean(manta_ctx *m)
{
    char pattern[96];
    snprintf(pattern, sizeof pattern, "manta:%s:*", manta_job(m));
    manta_shutdown(m);
    assert_int_equal(test_redis_count(&redis, pattern), 0);
}

static manta_actor *make_r(manta_ctx *m, const char *name, int max_restarts)
{
    manta_actor *a = NULL;
    manta_actor_options o = {.cls = "waker", .name = name, .max_restarts = max_restarts};
    int rc = manta_actor_create(m, &o, &a);
    if (rc) fprintf(stderr, "create %s: %s\n", name, manta_last_error());
    assert_int_equal(rc, 0);
    return a;
}

static manta_actor *make(manta_ctx *m, const char *name)
{
    return make_r(m, name, 0);
}

/* Call and copy the reply into out (n bytes); returns the status. */
static int call(manta_ctx *m, manta_actor *a, const char *method, const void *arg, size_t len,
                void *out, size_t n)
{
    manta_future *f = manta_call(m, a, method, arg, len);
    const void *d;
    size_t got;
    int rc = manta_get(f, 10000, &d, &got);
    if (rc == 0 && out) {
        assert_int_equal(got, n);
        memcpy(out, d, n);
    }
    if (rc) fprintf(stderr, "call %s: %s: %s\n", method, manta_strerror(rc), manta_future_error(f));
    manta_future_free(f);
    return rc;
}

static int fired;

static void on_timer(void *arg)
{
    fired++;
}

static int watched;

static void on_fd(void *arg, int fd, int revents)
{
    char b[8];
    if (read(fd, b, sizeof b) > 0) watched++;
}

/* ---- tests ---- */

/* A timer or an fd wakes manta_poll_once before its timeout; with nothing
 * to wait for it waits out the timeout, or returns at once when unbounded. */
static void test_poll_once_timer_and_fd(void **unused)
{
    manta_ctx *m = start();
    double t0 = test_now();
    assert_int_equal(manta_poll_once(m, 150), 0);
    assert_true(test_now() - t0 >= 0.14);
    t0 = test_now();
    assert_int_equal(manta_poll_once(m, -1), 0); /* nothing could wake it */
    assert_true(test_now() - t0 < 0.1);

    fired = 0;
    assert_true(manta_timer_add(m, 60, on_timer, NULL) > 0);
    t0 = test_now();
    int n = manta_poll_once(m, 5000);
    double took = test_now() - t0;
    assert_true(n >= 1);
    assert_int_equal(fired, 1);
    assert_true(took >= 0.05 && took < 1.0);

    int fds[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(manta_watch_fd(m, fds[0], MANTA_POLLIN, on_fd, NULL), 0);
    pid_t child = fork();
    if (child == 0) {
        usleep(100 * 1000);
        if (write(fds[1], "x", 1) != 1) _exit(1);
        _exit(0);
    }
    watched = 0;
    t0 = test_now();
    n = manta_poll_once(m, -1);
    took = test_now() - t0;
    assert_true(n >= 1);
    assert_int_equal(watched, 1);
    assert_true(took >= 0.05 && took < 1.0);
    waitpid(child, NULL, 0);
    assert_int_equal(manta_watch_fd(m, fds[0], 0, NULL, NULL), 0);
    close(fds[0]), close(fds[1]);
    stop_and_check_clean(m);
}

/* A reply wakes the caller's poll_once; an incoming call wakes the
 * actor's: both promptly, after the event and not before. */
static void test_poll_once_reply_and_call(void **unused)
{
    manta_ctx *m = start();
    manta_actor *a = make(m, "waker-1");
    assert_int_equal(call(m, a, "ping", NULL, 0, NULL, 0), 0);
    int ms = 150;
    manta_future *f = manta_call(m, a, "sleep", &ms, sizeof ms);
    double t0 = test_now();
    int turns = 0;
    while (!manta_future_done(f) && test_now() - t0 < 5) {
        assert_true(manta_poll_once(m, 5000) >= 0);
        turns++;
    }
    double took = test_now() - t0;
    assert_int_equal(manta_get(f, 0, NULL, NULL), 0);
    manta_future_free(f);
    assert_true(took >= 0.14 && took < 1.0);
    assert_true(turns <= 3);

    /* The actor waits in manta_poll_once; our ping, 200 ms later, ends it. */
    assert_int_equal(call(m, a, "arm_poll", NULL, 0, NULL, 0), 0);
    manta_poll(m, 200);
    assert_int_equal(call(m, a, "ping", NULL, 0, NULL, 0), 0);
    /* poll_result may be read in the same turn as the ping, before the
     * actor's poll_once has returned: ask until it has. */
    int64_t r[3] = {0, 0, 0};
    for (t0 = test_now(); !r[0] && test_now() - t0 < 5; manta_poll(m, 5))
        assert_int_equal(call(m, a, "poll_result", NULL, 0, r, sizeof r), 0);
    assert_int_equal(r[0], 1);
    fprintf(stderr, "actor's poll_once: ping served after %lld ms, %lld returns\n", (long long)r[1],
            (long long)r[2]);
    assert_true(r[1] >= 50 && r[1] < 1500); /* the ping came 200 ms after arming */
    assert_true(r[2] <= 3);
    stop_and_check_clean(m);
}

/* X has a call pending on Y; Y dies while Redis does not answer (SIGSTOP),
 * so X's second call to Y waits on a directory lookup that cannot come.
 * X must keep serving another caller all the while, and settle the call
 * once Redis is back. */
static void test_suspect_lookup_does_not_stall(void **unused)
{
    manta_ctx *m = start();
    manta_actor *y = make(m, "hang-y");
    manta_actor *x = make(m, "relay-x");
    int ypid = 0, hangs = 0;
    assert_int_equal(call(m, y, "pid", NULL, 0, &ypid, sizeof ypid), 0);
    assert_int_equal(call(m, x, "arm_relay", "hang-y", 6, NULL, 0), 0);
    for (double t0 = test_now(); hangs < 1 && test_now() - t0 < 5; manta_poll(m, 10))
        assert_int_equal(call(m, y, "hangs", NULL, 0, &hangs, sizeof hangs), 0);
    assert_int_equal(hangs, 1);

    assert_int_equal(kill(redis.pid, SIGSTOP), 0);
    assert_int_equal(kill(ypid, SIGKILL), 0);
    double worst = 0, t0 = test_now();
    int pings = 0, relay[2] = {0, 0};
    while (test_now() - t0 < 1.5) {
        double c0 = test_now();
        int rc = call(m, x, "ping", NULL, 0, NULL, 0);
        double took = test_now() - c0;
        if (rc != 0) break;
        if (took > worst) worst = took;
        pings++;
        manta_poll(m, 20);
    }
    /* X saw Y die, and its second call still waits for the directory. */
    int rc = call(m, x, "relay_result", NULL, 0, relay, sizeof relay);
    assert_int_equal(kill(redis.pid, SIGCONT), 0);
    assert_int_equal(rc, 0);
    fprintf(stderr, "while Redis was stopped: %d pings, slowest %.1f ms; relay %d %d\n", pings,
            worst * 1e3, relay[0], relay[1]);
    assert_true(pings >= 10);
    assert_true(worst < 0.5);
    assert_int_equal(relay[0], MANTA_EDIED);
    assert_int_equal(relay[1], MANTA_EPENDING);

    /* Redis answers again: the lookup says Y is dead, the call ends EDIED. */
    for (t0 = test_now(); relay[1] == MANTA_EPENDING && test_now() - t0 < 8; manta_poll(m, 20))
        assert_int_equal(call(m, x, "relay_result", NULL, 0, relay, sizeof relay), 0);
    assert_int_equal(relay[1], MANTA_EDIED);
    assert_true(test_now() - t0 < 3);
    stop_and_check_clean(m);
}

/* Right after a crash the peer is suspect: casts and a call made before the
 * new incarnation is up wait for the directory lookup, then reach it, all of
 * them and in order. */
static void test_held_messages_keep_order(void **unused)
{
    manta_ctx *m = start();
    manta_actor *a = make_r(m, "phoenix", 1);
    int pid1 = 0, pid2 = 0;
    assert_int_equal(call(m, a, "pid", NULL, 0, &pid1, sizeof pid1), 0);
    manta_future *f = manta_call(m, a, "crash", NULL, 0);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), MANTA_EDIED);
    manta_future_free(f);
    for (int i = 0; i < 10; i++) assert_int_equal(manta_cast(m, a, "note", &i, sizeof i), 0);
    int notes[64];
    manta_future *g = manta_call(m, a, "notes", NULL, 0);
    const void *d;
    size_t n = 0;
    assert_int_equal(manta_get(g, 10000, &d, &n), 0);
    assert_int_equal(n, 10 * sizeof(int));
    memcpy(notes, d, n);
    manta_future_free(g);
    for (int i = 0; i < 10; i++) assert_int_equal(notes[i], i);
    assert_int_equal(call(m, a, "pid", NULL, 0, &pid2, sizeof pid2), 0);
    assert_int_not_equal(pid1, pid2);
    stop_and_check_clean(m);
}

int main(void)
{
    if (getenv("MANTA_ROLE")) { /* started as an actor or node agent */
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    test_redis_start(&redis);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poll_once_timer_and_fd),
        cmocka_unit_test(test_poll_once_reply_and_call),
        cmocka_unit_test(test_suspect_lookup_does_not_stall),
        cmocka_unit_test(test_held_messages_keep_order),
    };
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    test_redis_stop(&redis);
    return failed;
}
