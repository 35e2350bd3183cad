/*
 * test_runtime.c -- the runtime against a real redis-server and real
 * ZeroMQ sockets: calls, futures, ordering, timeouts, nested calls, errors,
 * bad input, crash and restart, objects, back-pressure, shutdown.
 *
 * This program is also its own actors: the node agent starts it again with
 * MANTA_ROLE set, and main() hands over to manta_init() at once.
 */
#include <manta.h>
#include <manta_schema.h>

#include "testutil.h"

#include <hiredis/hiredis.h>
#include <msgpack.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

static test_redis redis;

/* ---- the test actors ---- */

typedef struct tstate {
    int64_t next_seq;
    int64_t out_of_order;
    int64_t casts;
    char peer[64];
    char fini_file[128];
} tstate;

static int t_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    tstate *s = state;
    /* args: "peer=NAME" or "fini=PATH" or "fail" */
    if (len == 4 && !memcmp(args, "fail", 4)) {
        fprintf(stderr, "init refuses on purpose\n");
        return MANTA_EINVAL;
    }
    if (len > 5 && !memcmp(args, "peer=", 5))
        snprintf(s->peer, sizeof s->peer, "%.*s", (int)(len - 5), (const char *)args + 5);
    if (len > 5 && !memcmp(args, "fini=", 5))
        snprintf(s->fini_file, sizeof s->fini_file, "%.*s", (int)(len - 5), (const char *)args + 5);
    return 0;
}

static void t_fini(manta_ctx *m, void *state)
{
    tstate *s = state;
    if (s->fini_file[0]) {
        FILE *f = fopen(s->fini_file, "w");
        if (f) fputs("fini ran\n", f), fclose(f);
    }
}

static int m_echo(manta_req *c, void *st, const void *arg, size_t len)
{
    return manta_reply(c, arg, len);
}

static int m_pid(manta_req *c, void *st, const void *arg, size_t len)
{
    int pid = getpid();
    return manta_reply(c, &pid, sizeof pid);
}

static int m_sleep(manta_req *c, void *st, const void *arg, size_t len)
{
    int ms = 0;
    if (len == sizeof ms) memcpy(&ms, arg, sizeof ms);
    usleep((useconds_t)ms * 1000);
    return manta_reply(c, &ms, sizeof ms);
}

static int m_crash(manta_req *c, void *st, const void *arg, size_t len)
{
    abort();
}

static int m_fail(manta_req *c, void *st, const void *arg, size_t len)
{
    return manta_reply_error(c, MANTA_EREMOTE, "failing on purpose: %.*s", (int)len,
                             (const char *)arg);
}

static int m_seq(manta_req *c, void *st, const void *arg, size_t len)
{
    tstate *s = st;
    int64_t v = -1;
    if (len == sizeof v) memcpy(&v, arg, sizeof v);
    if (v != s->next_seq) s->out_of_order++;
    s->next_seq = v + 1;
    return manta_reply(c, &s->out_of_order, sizeof s->out_of_order);
}

static int m_cast_count(manta_req *c, void *st, const void *arg, size_t len)
{
    tstate *s = st;
    s->casts++;
    return 0;
}

static int m_get_casts(manta_req *c, void *st, const void *arg, size_t len)
{
    tstate *s = st;
    return manta_reply(c, &s->casts, sizeof s->casts);
}

/* Ask the peer actor for `depth` levels of mutual recursion. */
static int m_bounce(manta_req *c, void *st, const void *arg, size_t len)
{
    tstate *s = st;
    int n = 0;
    if (len == sizeof n) memcpy(&n, arg, sizeof n);
    if (n <= 0) return manta_reply(c, &n, sizeof n);
    manta_ctx *m = manta_req_ctx(c);
    manta_actor *peer;
    int rc = manta_actor_lookup(m, s->peer, &peer);
    if (rc) return rc;
    int next = n - 1, got = -100;
    manta_future *f = manta_call(m, peer, "bounce", &next, sizeof next);
    const void *d;
    size_t dl;
    rc = manta_get(f, 5000, &d, &dl);
    if (rc == 0 && dl == sizeof got) memcpy(&got, d, sizeof got);
    manta_future_free(f);
    if (rc) return manta_reply_error(c, rc, "bounce: %s", manta_strerror(rc));
    got++;
    return manta_reply(c, &got, sizeof got);
}

/* Fetch an object by id and answer its length and byte sum. */
static int m_obj_sum(manta_req *c, void *st, const void *arg, size_t len)
{
    manta_obj_id id = {{0}};
    if (len >= sizeof id.s) return MANTA_EINVAL;
    memcpy(id.s, arg, len);
    void *data;
    size_t n;
    int rc = manta_obj_get(manta_req_ctx(c), &id, &data, &n, 10000);
    if (rc) return manta_reply_error(c, rc, "obj_get: %s", manta_last_error());
    uint64_t out[2] = {n, 0};
    for (size_t i = 0; i < n; i++) out[1] += ((unsigned char *)data)[i];
    free(data);
    return manta_reply(c, out, sizeof out);
}

/* Answer later, from a timer: deferred replies. */
static void answer_later(void *arg)
{
    manta_req *c = arg;
    manta_reply(c, "later", 5);
}

static int m_deferred(manta_req *c, void *st, const void *arg, size_t len)
{
    manta_timer_add(manta_req_ctx(c), 20, answer_later, manta_req_defer(c));
    return 0;
}

static const manta_method t_methods[] = {
    {"echo", m_echo},     {"pid", m_pid},         {"sleep", m_sleep},       {"crash", m_crash},
    {"fail", m_fail},     {"seq", m_seq},         {"cast", m_cast_count},   {"casts", m_get_casts},
    {"bounce", m_bounce}, {"obj_sum", m_obj_sum}, {"deferred", m_deferred}, {NULL, NULL}};
static const manta_class tclass = {"tester", sizeof(tstate), t_init, t_fini, t_methods};
static const manta_class *const classes[] = {&tclass, NULL};

/* ---- helpers ---- */

static int job_no;

static manta_ctx *start(const char *transport, size_t max_message, size_t max_pending)
{
    char job[48];
    snprintf(job, sizeof job, "t%d-%d", (int)getpid(), ++job_no);
    manta_options o = {.redis_url = redis.url,
                       .job = job,
                       .classes = classes,
                       .transport = transport,
                       .max_message = max_message,
                       .max_pending = max_pending,
                       .call_timeout_ms = 10000};
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

static manta_actor *make(manta_ctx *m, const char *name, const char *args, int max_restarts)
{
    manta_actor *a = NULL;
    manta_actor_options o = {.cls = "tester",
                             .name = name,
                             .args = args,
                             .args_len = args ? strlen(args) : 0,
                             .max_restarts = max_restarts};
    int rc = manta_actor_create(m, &o, &a);
    if (rc) fprintf(stderr, "create %s: %s\n", name ? name : "?", manta_last_error());
    assert_int_equal(rc, 0);
    return a;
}

static int call_int(manta_ctx *m, manta_actor *a, const char *method, int arg, int *out)
{
    manta_future *f = manta_call(m, a, method, &arg, sizeof arg);
    const void *d;
    size_t n;
    int rc = manta_get(f, 10000, &d, &n);
    if (rc == 0 && out && n == sizeof *out) memcpy(out, d, sizeof *out);
    if (rc) fprintf(stderr, "call %s: %s: %s\n", method, manta_strerror(rc), manta_future_error(f));
    manta_future_free(f);
    return rc;
}

static uint64_t remote_stat(manta_ctx *m, manta_actor *a, const char *name)
{
    manta_future *f = manta_call(m, a, MANTA_METHOD_STATS, NULL, 0);
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, 5000, &d, &n), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&u, d, n, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(u.data.type, MSGPACK_OBJECT_MAP);
    uint64_t v = UINT64_MAX;
    for (uint32_t i = 0; i < u.data.via.map.size; i++) {
        msgpack_object *k = &u.data.via.map.ptr[i].key;
        if (k->via.str.size == strlen(name) && !memcmp(k->via.str.ptr, name, k->via.str.size))
            v = u.data.via.map.ptr[i].val.via.u64;
    }
    msgpack_unpacked_destroy(&u);
    manta_future_free(f);
    assert_true(v != UINT64_MAX);
    return v;
}

/* ---- tests ---- */

static void test_call_get_wait_cast(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    manta_actor *a = make(m, "echo", NULL, 0);
    manta_future *f = manta_call(m, a, "echo", "hello", 5);
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, 5000, &d, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(d, "hello", 5);
    manta_future_free(f);

    /* An empty argument and an empty answer. */
    f = manta_call(m, a, "echo", NULL, 0);
    assert_int_equal(manta_get(f, 5000, &d, &n), 0);
    assert_int_equal(n, 0);
    manta_future_free(f);

    /* A large argument travels as its own frame and comes back intact. */
    size_t big = 3 << 20;
    unsigned char *buf = malloc(big);
    for (size_t i = 0; i < big; i++) buf[i] = (unsigned char)(i * 7 + 3);
    f = manta_call(m, a, "echo", buf, big);
    assert_int_equal(manta_get(f, 10000, &d, &n), 0);
    assert_int_equal(n, big);
    assert_memory_equal(d, buf, big);
    manta_future_free(f);
    free(buf);

    /* wait k of n: the fast calls finish, the slow one does not. */
    manta_future *fs[4];
    int fast = 0, slow = 1500;
    manta_actor *b = make(m, "slow", NULL, 0);
    fs[0] = manta_call(m, b, "sleep", &slow, sizeof slow);
    for (int i = 1; i < 4; i++) fs[i] = manta_call(m, a, "sleep", &fast, sizeof fast);
    assert_int_equal(manta_wait(fs, 4, 3, 5000), 3);
    assert_false(manta_future_done(fs[0]));
    assert_int_equal(manta_get(fs[0], 0, NULL, NULL), MANTA_EPENDING);
    assert_int_equal(manta_wait(fs, 4, 4, 5000), 4);
    assert_int_equal(manta_get(fs[0], 0, NULL, NULL), 0);
    for (int i = 0; i < 4; i++) manta_future_free(fs[i]);

    /* casts arrive, in order with calls from the same caller */
    for (int i = 0; i < 100; i++) assert_int_equal(manta_cast(m, a, "cast", NULL, 0), 0);
    f = manta_call(m, a, "casts", NULL, 0);
    assert_int_equal(manta_get(f, 5000, &d, &n), 0);
    int64_t casts;
    memcpy(&casts, d, sizeof casts);
    assert_int_equal(casts, 100);
    manta_future_free(f);

    /* a deferred answer from a timer */
    f = manta_call(m, a, "deferred", NULL, 0);
    assert_int_equal(manta_get(f, 5000, &d, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(d, "later", 5);
    manta_future_free(f);
    stop_and_check_clean(m);
}

static void test_ordering(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    manta_actor *a = make(m, "seq", NULL, 0);
    enum { N = 5000 };
    manta_future **fs = calloc(N, sizeof *fs);
    for (int64_t i = 0; i < N; i++) fs[i] = manta_call(m, a, "seq", &i, sizeof i);
    assert_int_equal(manta_wait(fs, N, N, 20000), N);
    int64_t bad = -1;
    const void *d;
    size_t n;
    assert_int_equal(manta_get(fs[N - 1], 0, &d, &n), 0);
    memcpy(&bad, d, sizeof bad);
    assert_int_equal(bad, 0);
    for (int i = 0; i < N; i++) manta_future_free(fs[i]);
    free(fs);
    stop_and_check_clean(m);
}

static void test_timeouts_and_late_replies(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    manta_actor *a = make(m, "sleepy", NULL, 0);
    int ms = 600;
    manta_future *f = manta_call_timeout(m, a, "sleep", &ms, sizeof ms, 100);
    double t0 = test_now();
    assert_int_equal(manta_get(f, -1, NULL, NULL), MANTA_ETIMEDOUT);
    assert_true(test_now() - t0 < 0.5);
    assert_non_null(strstr(manta_future_error(f), "timed out"));
    /* resolved exactly once: asking again gives the same answer */
    assert_int_equal(manta_get(f, 0, NULL, NULL), MANTA_ETIMEDOUT);
    manta_future_free(f);
    /* The reply arrives after the deadline and is dropped, counted. */
    int got = 0;
    assert_int_equal(call_int(m, a, "sleep", 0, &got), 0);
    manta_stats st;
    manta_stats_get(m, &st);
    assert_int_equal(st.timeouts, 1);
    assert_int_equal(st.late_replies, 1);
    /* A get that runs out leaves the future pending; it then resolves. */
    ms = 300;
    f = manta_call(m, a, "sleep", &ms, sizeof ms);
    assert_int_equal(manta_get(f, 20, NULL, NULL), MANTA_EPENDING);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), 0);
    manta_future_free(f);
    stop_and_check_clean(m);
}

static void test_nested_and_mutual(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    manta_actor *a = make(m, "A", "peer=B", 0);
    make(m, "B", "peer=A", 0);
    int got = -1;
    assert_int_equal(call_int(m, a, "bounce", 12, &got), 0);
    assert_int_equal(got, 12);
    /* Several drivers' calls in flight at once through the same pair. */
    manta_future *fs[8];
    int depth = 6;
    for (int i = 0; i < 8; i++) fs[i] = manta_call(m, a, "bounce", &depth, sizeof depth);
    assert_int_equal(manta_wait(fs, 8, 8, 10000), 8);
    for (int i = 0; i < 8; i++) {
        const void *d;
        size_t n;
        assert_int_equal(manta_get(fs[i], 0, &d, &n), 0);
        memcpy(&got, d, sizeof got);
        assert_int_equal(got, 6);
        manta_future_free(fs[i]);
    }
    stop_and_check_clean(m);
}

static void test_errors_and_names(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    manta_actor *a = make(m, "err", NULL, 0);
    manta_future *f = manta_call(m, a, "no_such_method", NULL, 0);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), MANTA_ENOMETHOD);
    assert_non_null(strstr(manta_future_error(f), "no_such_method"));
    manta_future_free(f);
    f = manta_call(m, a, "fail", "why", 3);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), MANTA_EREMOTE);
    assert_string_equal(manta_future_error(f), "failing on purpose: why");
    manta_future_free(f);
    assert_int_equal(remote_stat(m, a, "unknown_methods"), 1);
    /* names: taken, unknown, lookup */
    manta_actor *dup = NULL;
    assert_int_equal(
        manta_actor_create(m, &(manta_actor_options){.cls = "tester", .name = "err"}, &dup),
        MANTA_EEXIST);
    assert_int_equal(manta_actor_create(m, &(manta_actor_options){.cls = "nope"}, &dup),
                     MANTA_ENOCLASS);
    assert_non_null(strstr(manta_last_error(), "nope"));
    assert_int_equal(
        manta_actor_create(
            m, &(manta_actor_options){.cls = "tester", .args = "fail", .args_len = 4}, &dup),
        MANTA_ESPAWN);
    assert_non_null(strstr(manta_last_error(), "init of class tester failed"));
    assert_int_equal(manta_actor_lookup(m, "ghost", &dup), MANTA_ENOTFOUND);
    manta_actor *same = NULL;
    assert_int_equal(manta_actor_lookup(m, "err", &same), 0);
    assert_ptr_equal(same, a);
    stop_and_check_clean(m);
}

/* Raw ZeroMQ peers that send what no Manta caller would. */
static void send_raw(void *s, const void *env, size_t n, const void *frame, size_t fn)
{
    zmq_send(s, env, n, frame ? ZMQ_SNDMORE : 0);
    if (frame) zmq_send(s, frame, fn, 0);
}

static int recv_error_status(void *s, char *msg, size_t cap)
{
    zmq_msg_t em;
    zmq_msg_init(&em);
    int rcvtimeo = 5000;
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
    if (zmq_msg_recv(&em, s, 0) < 0) return 999;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int status = 998;
    if (msgpack_unpack_next(&u, zmq_msg_data(&em), zmq_msg_size(&em), &off) ==
            MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size == 6 &&
        u.data.via.array.ptr[1].via.i64 == 3) {
        status = (int)u.data.via.array.ptr[3].via.i64;
        msgpack_object *p = &u.data.via.array.ptr[4];
        if (p->type == MSGPACK_OBJECT_BIN)
            snprintf(msg, cap, "%.*s", (int)p->via.bin.size, p->via.bin.ptr);
    }
    msgpack_unpacked_destroy(&u);
    zmq_msg_close(&em);
    return status;
}

static size_t pack_env(char *out, size_t cap, uint32_t version, int kind, const char *method,
                       int nframes)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 6);
    msgpack_pack_uint32(&pk, version);
    msgpack_pack_int(&pk, kind);
    msgpack_pack_uint64(&pk, 77);
    msgpack_pack_str(&pk, strlen(method));
    msgpack_pack_str_body(&pk, method, strlen(method));
    msgpack_pack_nil(&pk);
    msgpack_pack_int(&pk, nframes);
    size_t n = sb.size < cap ? sb.size : cap;
    memcpy(out, sb.data, n);
    msgpack_sbuffer_destroy(&sb);
    return n;
}

static void test_bad_input(void **unused)
{
    manta_ctx *m = start(NULL, 1 << 20, 0);
    manta_actor *a = make(m, "victim", NULL, 0);
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    void *z = zmq_ctx_new();
    void *s = zmq_socket(z, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_connect(s, info.endpoint), 0);
    char msg[512], env[128];

    send_raw(s, "garbage!", 8, NULL, 0);
    assert_int_equal(recv_error_status(s, msg, sizeof msg), MANTA_EPROTO);
    assert_non_null(strstr(msg, "not a msgpack array"));

    size_t n = pack_env(env, sizeof env, 42, 1, "echo", 0);
    send_raw(s, env, n, NULL, 0);
    assert_int_equal(recv_error_status(s, msg, sizeof msg), MANTA_EPROTO);
    assert_non_null(strstr(msg, "protocol version 42"));

    n = pack_env(env, sizeof env, MANTA_PROTOCOL_VERSION, 1, "echo", 1);
    size_t big = 2 << 20;
    char *payload = calloc(1, big);
    send_raw(s, env, n, payload, big);
    free(payload);
    assert_int_equal(recv_error_status(s, msg, sizeof msg), MANTA_EMSGSIZE);
    assert_non_null(strstr(msg, "exceeds"));

    /* announces a frame that never comes */
    n = pack_env(env, sizeof env, MANTA_PROTOCOL_VERSION, 1, "echo", 1);
    send_raw(s, env, n, NULL, 0);
    assert_int_equal(recv_error_status(s, msg, sizeof msg), MANTA_EPROTO);

    /* a truncated envelope */
    n = pack_env(env, sizeof env, MANTA_PROTOCOL_VERSION, 1, "echo", 0);
    send_raw(s, env, n - 2, NULL, 0);
    assert_int_equal(recv_error_status(s, msg, sizeof msg), MANTA_EPROTO);

    /* unknown method over the raw socket */
    n = pack_env(env, sizeof env, MANTA_PROTOCOL_VERSION, 1, "zzz", 0);
    send_raw(s, env, n, NULL, 0);
    assert_int_equal(recv_error_status(s, msg, sizeof msg), MANTA_ENOMETHOD);

    zmq_close(s);
    zmq_ctx_term(z);
    /* The actor kept running, and counted each kind. */
    assert_int_equal(remote_stat(m, a, "bad_versions"), 1);
    assert_int_equal(remote_stat(m, a, "oversized"), 1);
    assert_int_equal(remote_stat(m, a, "bad_envelopes"), 3);
    assert_int_equal(remote_stat(m, a, "unknown_methods"), 1);
    int got = 0;
    assert_int_equal(call_int(m, a, "sleep", 1, &got), 0);
    assert_int_equal(got, 1);
    /* Oversized calls from a Manta caller are answered the same way. */
    char *big2 = calloc(1, big);
    manta_future *f = manta_call(m, a, "echo", big2, big);
    free(big2);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), MANTA_EMSGSIZE);
    manta_future_free(f);
    stop_and_check_clean(m);
}

static void test_crash_restart(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    manta_actor *a = make(m, "phoenix", NULL, 2);
    int pid1 = 0, pid2 = 0;
    assert_int_equal(call_int(m, a, "pid", 0, &pid1), 0);
    /* calls in flight when it dies all resolve EDIED, promptly */
    manta_future *fs[5];
    int ms = 200;
    for (int i = 0; i < 4; i++) fs[i] = manta_call(m, a, "sleep", &ms, sizeof ms);
    fs[4] = manta_call(m, a, "crash", NULL, 0);
    double t0 = test_now();
    assert_int_equal(manta_wait(fs, 5, 5, 5000), 5);
    assert_true(test_now() - t0 < 2.0);
    int died = 0;
    for (int i = 0; i < 5; i++) {
        int st = manta_get(fs[i], 0, NULL, NULL);
        assert_true(st == 0 || st == MANTA_EDIED); /* sleeps done before the crash may finish */
        died += st == MANTA_EDIED;
        manta_future_free(fs[i]);
    }
    assert_true(died >= 1);
    assert_int_equal(manta_get(fs[0] = manta_call(m, a, "crash", NULL, 0), 5000, NULL, NULL),
                     MANTA_EDIED);
    manta_future_free(fs[0]);
    /* restarted (twice now): a new process, a new incarnation, same handle */
    assert_int_equal(manta_actor_wait_ready(m, a, 10000), 0);
    assert_int_equal(call_int(m, a, "pid", 0, &pid2), 0);
    assert_int_not_equal(pid1, pid2);
    assert_false(test_pid_alive(pid1));
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_int_equal(info.incarnation, 3);
    assert_int_equal(info.restarts, 2);
    /* the third crash is one too many: dead for good */
    manta_future *f = manta_call(m, a, "crash", NULL, 0);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), MANTA_EDIED);
    manta_future_free(f);
    t0 = test_now();
    for (;;) {
        assert_int_equal(manta_actor_info_get(m, a, &info), 0);
        if (info.state == MANTA_ACTOR_DEAD) break;
        assert_true(test_now() - t0 < 5);
        manta_poll(m, 10);
    }
    f = manta_call(m, a, "pid", NULL, 0);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), MANTA_EDIED);
    manta_future_free(f);
    /* kill from the API: restart=1 restarts, restart=0 ends it */
    manta_actor *b = make(m, "killme", NULL, 5);
    assert_int_equal(call_int(m, b, "pid", 0, &pid1), 0);
    assert_int_equal(manta_actor_kill(m, b, 1), 0);
    for (t0 = test_now(); test_pid_alive(pid1) && test_now() - t0 < 5;) manta_poll(m, 10);
    assert_int_equal(manta_actor_wait_ready(m, b, 10000), 0);
    assert_int_equal(call_int(m, b, "pid", 0, &pid2), 0);
    assert_int_not_equal(pid1, pid2);
    assert_int_equal(manta_actor_kill(m, b, 0), 0);
    f = manta_call(m, b, "sleep", &ms, sizeof ms);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), MANTA_EDIED);
    manta_future_free(f);
    stop_and_check_clean(m);
}

/* A handle whose endpoint never answered: the actor it named was killed
 * before the socket connected (so no DISCONNECTED came) and lives at
 * another endpoint now. A call made once the connection is overdue reads
 * the directory first and goes to the new endpoint; before, it waited out
 * its deadline in a pipe to nowhere (job.test_job's failover saw it). */
static void test_stale_endpoint(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    manta_actor *live = make(m, "live", NULL, 0);
    int pid = 0, got = 0;
    assert_int_equal(call_int(m, live, "pid", 0, &pid), 0);
    manta_actor_info where;
    assert_int_equal(manta_actor_info_get(m, live, &where), 0);
    manta_reg_actor rec;
    memset(&rec, 0, sizeof rec);
    snprintf(rec.info.endpoint, sizeof rec.info.endpoint, "ipc:///tmp/manta-test-nowhere-%d",
             (int)getpid());
    snprintf(rec.info.node, sizeof rec.info.node, "%s", where.node);
    assert_int_equal(manta_reg_actor_claim(m, "moved", "tester"), 0);
    assert_int_equal(manta_reg_actor_create(m, "moved", &rec, NULL, 0), 0);
    assert_int_equal(manta_reg_actor_set_state(m, "moved", MANTA_ACTOR_ALIVE, NULL), 0);
    manta_actor *a;
    assert_int_equal(manta_actor_lookup(m, "moved", &a), 0);
    int arg = 0;
    manta_future *f = manta_call(m, a, "pid", &arg, sizeof arg);
    assert_int_equal(manta_get(f, 300, NULL, NULL), MANTA_EPENDING); /* nobody there */
    manta_future_free(f);
    /* it "moved": the record names the live process's endpoint now */
    assert_int_equal(
        manta_reg_actor_report(m, "moved", MANTA_ACTOR_ALIVE, where.pid, where.endpoint, NULL), 0);
    for (double t0 = test_now(); test_now() - t0 < 1.2;) manta_poll(m, 50);
    assert_int_equal(call_int(m, a, "pid", 0, &got), 0);
    assert_int_equal(got, pid);
    assert_int_equal(manta_reg_actor_forget(m, "moved"), 0);
    stop_and_check_clean(m);
}

static void test_objects(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    manta_actor *a = make(m, "reader", NULL, 0);
    manta_obj_id small, large;
    assert_int_equal(manta_put(m, "tiny object", 11, &small), 0);
    size_t n = 16 << 20;
    unsigned char *buf = malloc(n);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 31 + 1), sum += buf[i];
    assert_int_equal(manta_put(m, buf, n, &large), 0);
    void *d;
    size_t len;
    assert_int_equal(manta_obj_get(m, &small, &d, &len, 5000), 0);
    assert_int_equal(len, 11);
    assert_memory_equal(d, "tiny object", 11);
    free(d);
    assert_int_equal(manta_obj_get(m, &large, &d, &len, 5000), 0);
    assert_int_equal(len, n);
    assert_memory_equal(d, buf, n);
    free(d);
    /* zero-copy fetches: the future holds the bytes */
    manta_future *ff = manta_obj_fetch(m, &large, 5000);
    const void *fd;
    size_t fl;
    assert_int_equal(manta_get(ff, 5000, &fd, &fl), 0);
    assert_int_equal(fl, n);
    assert_memory_equal(fd, buf, n);
    manta_future_free(ff);
    ff = manta_obj_fetch(m, &small, 5000);
    assert_int_equal(manta_get(ff, 5000, &fd, &fl), 0);
    assert_int_equal(fl, 11);
    assert_memory_equal(fd, "tiny object", 11);
    manta_future_free(ff);
    manta_obj_id ghost = {"obj-doesnotexist"};
    ff = manta_obj_fetch(m, &ghost, 5000);
    assert_int_equal(manta_get(ff, 5000, NULL, NULL), MANTA_ENOTFOUND);
    manta_future_free(ff);
    /* another process fetches the large one from this driver's object thread */
    manta_future *f = manta_call(m, a, "obj_sum", large.s, strlen(large.s));
    const void *r;
    size_t rl;
    assert_int_equal(manta_get(f, 10000, &r, &rl), 0);
    uint64_t out[2];
    memcpy(out, r, sizeof out);
    assert_int_equal(out[0], n);
    assert_int_equal(out[1], sum);
    manta_future_free(f);
    /* references: two refs, two releases, then gone */
    char pattern[128];
    snprintf(pattern, sizeof pattern, "manta:%s:obj:*", manta_job(m));
    assert_int_equal(test_redis_count(&redis, pattern), 2);
    assert_int_equal(manta_obj_ref(m, &large), 0);
    assert_int_equal(manta_obj_release(m, &large), 0);
    assert_int_equal(manta_obj_get(m, &large, &d, &len, 5000), 0);
    free(d);
    assert_int_equal(manta_obj_release(m, &large), 0);
    assert_int_equal(manta_obj_get(m, &large, &d, &len, 5000), MANTA_ENOTFOUND);
    assert_int_equal(manta_obj_release(m, &small), 0);
    assert_int_equal(test_redis_count(&redis, pattern), 0);
    assert_int_equal(manta_obj_ref(m, &small), MANTA_ENOTFOUND);
    free(buf);
    /* objects not released are freed with the job */
    assert_int_equal(manta_put(m, "left behind", 11, &small), 0);
    stop_and_check_clean(m);
}

static void test_job_values(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    assert_int_equal(manta_kv_set(m, "policy", "{\"version\": 3}", 14), 0);
    assert_int_equal(manta_kv_set(m, "policy", "{\"version\": 4}", 14), 0);
    void *v;
    size_t n;
    assert_int_equal(manta_kv_get(m, "policy", &v, &n), 0);
    assert_int_equal(n, 14);
    assert_string_equal(v, "{\"version\": 4}");
    free(v);
    assert_int_equal(manta_kv_get(m, "nothing", &v, &n), MANTA_ENOTFOUND);
    assert_null(v);
    assert_int_equal(manta_kv_set(m, "bad key!", "x", 1), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "bad key!"));
    char pattern[96];
    snprintf(pattern, sizeof pattern, "manta:%s:kv:*", manta_job(m));
    assert_int_equal(test_redis_count(&redis, pattern), 1);
    stop_and_check_clean(m);
}

static void test_backpressure(void **unused)
{
    manta_ctx *m = start(NULL, 0, 4);
    manta_actor *a = make(m, "bp", NULL, 0);
    enum { N = 20 };
    manta_future *fs[N];
    int ms = 5;
    for (int i = 0; i < N; i++) fs[i] = manta_call(m, a, "sleep", &ms, sizeof ms);
    /* each call beyond the 4th waited for a slot, so most are done already */
    int done = 0;
    for (int i = 0; i < N; i++) done += manta_future_done(fs[i]);
    assert_true(done >= N - 4);
    assert_int_equal(manta_wait(fs, N, N, 5000), N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(manta_get(fs[i], 0, NULL, NULL), 0);
        manta_future_free(fs[i]);
    }
    stop_and_check_clean(m);
}

static void test_tcp_and_stop(void **unused)
{
    manta_ctx *m = start("tcp", 0, 0);
    char fini_file[128], args[160];
    snprintf(fini_file, sizeof fini_file, "/tmp/manta-test-fini-%d", (int)getpid());
    unlink(fini_file);
    snprintf(args, sizeof args, "fini=%s", fini_file);
    manta_actor *a = make(m, "tcp-actor", args, 3);
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_memory_equal(info.endpoint, "tcp://127.0.0.1:", 16);
    int got = 0;
    assert_int_equal(call_int(m, a, "sleep", 3, &got), 0);
    assert_int_equal(got, 3);
    /* restart over tcp reaches the new incarnation too */
    manta_future *f = manta_call(m, a, "crash", NULL, 0);
    assert_int_equal(manta_get(f, 5000, NULL, NULL), MANTA_EDIED);
    manta_future_free(f);
    assert_int_equal(manta_actor_wait_ready(m, a, 10000), 0);
    assert_int_equal(call_int(m, a, "sleep", 4, &got), 0);
    assert_int_equal(got, 4);
    /* a clean stop runs fini and leaves the directory */
    int pid = info.pid;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    pid = info.pid;
    assert_int_equal(manta_actor_stop(m, a, 5000), 0);
    assert_int_equal(access(fini_file, F_OK), 0);
    unlink(fini_file);
    assert_false(test_pid_alive(pid));
    assert_int_equal(manta_actor_info_get(m, a, &info), MANTA_ENOTFOUND);
    stop_and_check_clean(m);
}

static void test_shutdown_leaves_nothing(void **unused)
{
    manta_ctx *m = start(NULL, 0, 0);
    int pids[6];
    for (int i = 0; i < 6; i++) {
        manta_actor *a = make(m, NULL, NULL, 1);
        assert_int_equal(call_int(m, a, "pid", 0, &pids[i]), 0);
        assert_true(test_pid_alive(pids[i]));
    }
    /* an actor busy in a call while we shut down */
    manta_actor *busy = make(m, "busy", NULL, 0);
    int ms = 5000;
    manta_future *f = manta_call(m, busy, "sleep", &ms, sizeof ms);
    char rundir[128];
    snprintf(rundir, sizeof rundir, "/tmp/manta-%s", manta_job(m));
    assert_int_equal(access(rundir, F_OK), 0);
    stop_and_check_clean(m);
    for (int i = 0; i < 6; i++) assert_false(test_pid_alive(pids[i]));
    /* resolved, never left hanging: answered early (SIGTERM cut its sleep
     * short), its actor stopped (EDIED), or the runtime closed */
    int st = manta_future_status(f);
    assert_true(st == 0 || st == MANTA_EDIED || st == MANTA_ECLOSED);
    manta_future_free(f);
    assert_int_not_equal(access(rundir, F_OK), 0);
    assert_int_equal(test_redis_count(&redis, "manta:*"), 0);
}

static void test_embedded_redis(void **unused)
{
    manta_ctx *m = NULL;
    assert_int_equal(manta_init(&m, &(manta_options){.classes = classes}), 0);
    const char *url = manta_redis_url(m);
    /* a generated password and a loopback port */
    assert_memory_equal(url, "redis://:", 9);
    assert_non_null(strstr(url, "@127.0.0.1:"));
    int port = atoi(strrchr(url, ':') + 1);
    manta_actor *a = make(m, "emb", NULL, 0);
    int got = 0;
    assert_int_equal(call_int(m, a, "sleep", 2, &got), 0);
    assert_int_equal(got, 2);
    redisContext *c = redisConnect("127.0.0.1", port);
    assert_true(c && !c->err);
    redisReply *r = redisCommand(c, "GET x"); /* no password: refused */
    assert_true(r && r->type == REDIS_REPLY_ERROR);
    freeReplyObject(r);
    redisFree(c);
    manta_shutdown(m);
    c = redisConnect("127.0.0.1", port);
    assert_true(!c || c->err); /* the server is gone */
    redisFree(c);
}

static void test_bad_redis_url(void **unused)
{
    manta_ctx *m = NULL;
    assert_int_equal(manta_init(&m, &(manta_options){.redis_url = "http://x", .classes = classes}),
                     MANTA_EINVAL);
    assert_null(m);
    assert_non_null(strstr(manta_last_error(), "redis://"));
    assert_int_equal(
        manta_init(&m, &(manta_options){.redis_url = "redis://127.0.0.1:1", .classes = classes}),
        MANTA_EREDIS);
    assert_null(m);
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
        cmocka_unit_test(test_call_get_wait_cast),
        cmocka_unit_test(test_ordering),
        cmocka_unit_test(test_timeouts_and_late_replies),
        cmocka_unit_test(test_nested_and_mutual),
        cmocka_unit_test(test_errors_and_names),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_crash_restart),
        cmocka_unit_test(test_stale_endpoint),
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_job_values),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_tcp_and_stop),
        cmocka_unit_test(test_shutdown_leaves_nothing),
        cmocka_unit_test(test_embedded_redis),
        cmocka_unit_test(test_bad_redis_url),
    };
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    test_redis_stop(&redis);
    return failed;
}
