/*
 * test_coll_auth.c -- the collectives' data plane is a job's socket like any
 * other: with CURVE on (a tcp job) a process without the job's keys cannot
 * join a group, neither without CURVE nor with its own key pair (its key is
 * refused by the ZAP handler and counted); a frame larger than the group's
 * limit is dropped before it is allocated; two members with the keys work,
 * and members that disagree on the chunk size are told so.
 *
 * The stranger is a thread of this program that speaks the data plane's wire
 * format by hand over raw ZeroMQ and raw Redis, as an attacker who can reach
 * the ports would: it announces itself as rank 1 of a group of 2, publishes
 * an endpoint and sends rank 0 its hello. Before CURVE covered the data
 * plane, rank 0 accepted that hello and the group formed with the stranger
 * in it. The members are two contexts of this process: the job's driver
 * (rank 0) and a driver attached to the same job (rank 1) in a thread.
 */
#include <manta.h>
#include <manta_collective.h>
#include <manta_schema.h>

#include "testutil.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <setjmp.h>
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
static int job_no;

static manta_ctx *start(const char *transport, char *job, size_t cap)
{
    snprintf(job, cap, "ca%d-%d", (int)getpid(), ++job_no);
    manta_options o = {.redis_url = redis.url,
                       .job = job,
                       .transport = transport,
                       .no_local_node = 1,
                       .call_timeout_ms = 10000};
    manta_ctx *m = NULL;
    int rc = manta_init(&m, &o);
    if (rc) fprintf(stderr, "manta_init: %s\n", manta_last_error());
    assert_int_equal(rc, 0);
    return m;
}

/* ---- the stranger: rank 1 by hand ---- */

/* The data plane's message header (collective.c). */
typedef struct wire_hdr {
    uint32_t magic;
    uint16_t src;
    uint8_t op, check;
    uint32_t seq, chunk, crc, pad;
    uint64_t len;
} wire_hdr;

enum { S_PLAIN, S_OWN_KEYS, S_BIG_FRAME };

typedef struct stranger {
    const char *job, *group;
    int mode;
    char server_key[MANTA_KEY_Z85_LEN + 1]; /* the job's public key (S_OWN_KEYS) */
    int sent;                               /* 1 once its hello went out */
} stranger;

static void *stranger_main(void *arg)
{
    stranger *s = arg;
    redisContext *r = redisConnect("127.0.0.1", redis.port);
    if (!r || r->err) return NULL;
    char key[160];
    snprintf(key, sizeof key, "manta:%s:coll:%s", s->job, s->group);
    freeReplyObject(redisCommand(r, "HSETNX %s " MANTA_REG_COLL_WORLD " 2", key));
    freeReplyObject(redisCommand(r, "HSET %s " MANTA_REG_COLL_RANK "1 %d", key, (int)getpid()));
    void *zctx = zmq_ctx_new();
    void *pull = zmq_socket(zctx, ZMQ_PULL), *push = zmq_socket(zctx, ZMQ_PUSH);
    int zero = 0;
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof zero);
    char ep[256] = "";
    size_t eplen = sizeof ep;
    zmq_bind(pull, "tcp://127.0.0.1:*");
    zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep, &eplen);
    freeReplyObject(redisCommand(r, "HSET %s " MANTA_REG_COLL_EP "1 %s", key, ep));
    /* rank 0's endpoint, once published */
    char ep0[256] = "";
    for (int i = 0; i < 500 && !ep0[0]; i++) {
        redisReply *rep = redisCommand(r, "HGET %s " MANTA_REG_COLL_EP "0", key);
        if (rep && rep->type == REDIS_REPLY_STRING) snprintf(ep0, sizeof ep0, "%s", rep->str);
        freeReplyObject(rep);
        if (!ep0[0]) usleep(10000);
    }
    if (ep0[0]) {
        if (s->mode == S_OWN_KEYS) {
            char pub[41], sec[41];
            zmq_curve_keypair(pub, sec);
            zmq_setsockopt(push, ZMQ_CURVE_SERVERKEY, s->server_key, 41);
            zmq_setsockopt(push, ZMQ_CURVE_PUBLICKEY, pub, 41);
            zmq_setsockopt(push, ZMQ_CURVE_SECRETKEY, sec, 41);
        }
        zmq_connect(push, ep0);
        /* A hello as rank 1 sends it: 8 bytes, the chunk size (4 MiB by
         * default); with S_BIG_FRAME a 1 MiB payload instead. */
        size_t len = s->mode == S_BIG_FRAME ? (size_t)1 << 20 : 8;
        unsigned char *payload = calloc(1, len);
        uint64_t chunk = s->mode == S_BIG_FRAME ? 4096 : (uint64_t)4 << 20;
        memcpy(payload, &chunk, sizeof chunk);
        wire_hdr h = {0x4c4f434du, 1, 1, 0, 0, 0, 0, 0, len};
        zmq_send(push, &h, sizeof h, ZMQ_SNDMORE);
        zmq_send(push, payload, len, 0);
        free(payload);
        s->sent = 1;
        usleep(2500 * 1000); /* keep the connection while rank 0 waits */
    }
    zmq_close(pull);
    zmq_close(push);
    zmq_ctx_term(zctx);
    redisFree(r);
    return NULL;
}

static void job_public_key(manta_ctx *m, char *out)
{
    char path[512];
    snprintf(path, sizeof path, "%s/curve.key", manta_run_dir(m));
    manta_keys k;
    int rc = manta_keys_read(path, &k);
    if (rc) fprintf(stderr, "%s\n", manta_last_error());
    assert_int_equal(rc, 0);
    memcpy(out, k.public_key, MANTA_KEY_Z85_LEN + 1);
}

/* Rank 0 in `m` against a stranger as rank 1: returns manta_coll_create's code. */
static int against_stranger(manta_ctx *m, const char *job, int mode, size_t chunk)
{
    stranger s = {.job = job, .group = "g", .mode = mode};
    if (mode == S_OWN_KEYS) job_public_key(m, s.server_key);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stranger_main, &s), 0);
    manta_coll_group *g = NULL;
    int rc = manta_coll_create(m, "g", 2, 0,
                               &(manta_coll_options){.timeout_ms = 1500, .chunk_bytes = chunk}, &g);
    if (rc) fprintf(stderr, "rank 0 (expected to fail): %s\n", manta_last_error());
    manta_coll_free(g);
    pthread_join(t, NULL);
    assert_int_equal(s.sent, 1);
    return rc;
}

static void test_stranger_without_curve(void **unused)
{
    (void)unused;
    char job[64];
    manta_ctx *m = start("tcp", job, sizeof job);
    int rc = against_stranger(m, job, S_PLAIN, 0);
    assert_int_equal(rc, MANTA_ETIMEDOUT);
    assert_non_null(strstr(manta_last_error(), "rank 1 joined but sent no hello"));
    manta_shutdown(m);
}

static void test_stranger_with_own_keys(void **unused)
{
    (void)unused;
    char job[64];
    manta_ctx *m = start("tcp", job, sizeof job);
    manta_stats before, after;
    manta_stats_get(m, &before);
    int rc = against_stranger(m, job, S_OWN_KEYS, 0);
    assert_int_equal(rc, MANTA_ETIMEDOUT);
    assert_non_null(strstr(manta_last_error(), "CURVE keys"));
    /* The group's own ZAP handler refused the key and counted it. */
    manta_stats_get(m, &after);
    assert_true(after.auth_refused > before.auth_refused);
    manta_shutdown(m);
}

static void test_frame_over_limit_dropped(void **unused)
{
    (void)unused;
    /* ipc without CURVE (this user may connect): the limit alone is tested.
     * 4 KiB chunks give a 64 KiB frame limit; the 1 MiB hello never arrives. */
    char job[64];
    manta_ctx *m = start("ipc", job, sizeof job);
    assert_int_equal(manta_curve_on(m), 0);
    int rc = against_stranger(m, job, S_BIG_FRAME, 4096);
    assert_int_equal(rc, MANTA_ETIMEDOUT);
    manta_shutdown(m);
}

/* ---- two members ---- */

typedef struct member {
    const char *job, *group;
    size_t chunk, bcast;
    int rc, bcast_ok;
    char msg[480];
    float sum[4];
} member;

static void *member_main(void *arg)
{
    member *b = arg;
    manta_options o = {.redis_url = redis.url, .job = b->job, .transport = "tcp", .attach = 1};
    manta_ctx *m = NULL;
    b->rc = manta_init(&m, &o);
    manta_coll_group *g = NULL;
    if (b->rc == 0)
        b->rc = manta_coll_create(
            m, b->group, 2, 1, &(manta_coll_options){.timeout_ms = 5000, .chunk_bytes = b->chunk},
            &g);
    for (int i = 0; i < 4; i++) b->sum[i] = (float)(10 * i);
    if (b->rc == 0) b->rc = manta_coll_all_reduce(g, b->sum, 4, 5000);
    /* a broadcast of whole chunks: each frame is as large as the limit
     * allows, before CURVE's own few bytes */
    if (b->rc == 0 && b->bcast) {
        b->bcast_ok = 0;
        unsigned char *buf = calloc(1, b->bcast);
        b->rc =
            buf ? manta_coll_broadcast(g, buf, b->bcast, MANTA_COLL_BYTE, 0, 5000) : MANTA_ENOMEM;
        b->bcast_ok = b->rc == 0 && buf[0] == 7 && buf[b->bcast - 1] == 7;
        free(buf);
    }
    snprintf(b->msg, sizeof b->msg, "%s", b->rc ? manta_last_error() : "");
    manta_coll_free(g);
    manta_shutdown(m);
    return NULL;
}

static void test_members_with_curve(void **unused)
{
    (void)unused;
    char job[64];
    manta_ctx *m = start("tcp", job, sizeof job);
    assert_int_equal(manta_curve_on(m), 1);
    /* Different chunk sizes: both ranks say so. */
    member b = {.job = job, .group = "mismatch", .chunk = 8192};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, member_main, &b), 0);
    manta_coll_group *g = NULL;
    int rc = manta_coll_create(m, "mismatch", 2, 0, &(manta_coll_options){.timeout_ms = 5000}, &g);
    pthread_join(t, NULL);
    fprintf(stderr, "expected refusals: rank 0: %s\nrank 1: %s\n", rc ? manta_last_error() : "ok",
            b.msg);
    assert_int_equal(rc, MANTA_EPROTO);
    assert_non_null(strstr(manta_last_error(), "chunk_bytes"));
    assert_int_equal(b.rc, MANTA_EPROTO);
    assert_non_null(strstr(b.msg, "chunk_bytes"));
    manta_coll_free(g);

    /* The same settings: the group forms over CURVE, sums, and broadcasts
     * two full 128 KiB chunks. */
    const size_t chunk = 128 << 10, bytes = 2 * chunk;
    member c = {.job = job, .group = "ok", .chunk = chunk, .bcast = bytes};
    assert_int_equal(pthread_create(&t, NULL, member_main, &c), 0);
    g = NULL;
    rc = manta_coll_create(m, "ok", 2, 0,
                           &(manta_coll_options){.timeout_ms = 5000, .chunk_bytes = chunk}, &g);
    if (rc) fprintf(stderr, "rank 0: %s\n", manta_last_error());
    assert_int_equal(rc, 0);
    float v[4] = {1, 2, 3, 4};
    rc = manta_coll_all_reduce(g, v, 4, 5000);
    unsigned char *big = malloc(bytes);
    assert_non_null(big);
    memset(big, 7, bytes);
    if (rc == 0) rc = manta_coll_broadcast(g, big, bytes, MANTA_COLL_BYTE, 0, 5000);
    if (rc) fprintf(stderr, "rank 0: %s\n", manta_last_error());
    free(big);
    pthread_join(t, NULL);
    assert_int_equal(rc, 0);
    if (c.rc) fprintf(stderr, "rank 1: %s\n", c.msg);
    assert_int_equal(c.rc, 0);
    for (int i = 0; i < 4; i++) {
        assert_true(v[i] == (float)(i + 1 + 10 * i));
        assert_true(c.sum[i] == v[i]);
    }
    assert_int_equal(c.bcast_ok, 1);
    manta_coll_free(g);
    manta_shutdown(m);
}

int main(void)
{
    if (!zmq_has("curve")) {
        fprintf(stderr, "libzmq without CURVE: skipped\n");
        return 77;
    }
    test_redis_start(&redis);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stranger_without_curve),
        cmocka_unit_test(test_stranger_with_own_keys),
        cmocka_unit_test(test_frame_over_limit_dropped),
        cmocka_unit_test(test_members_with_curve),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    assert_int_equal(test_redis_count(&redis, "manta:*"), 0);
    test_redis_stop(&redis);
    return failed;
}
