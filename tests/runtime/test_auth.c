/*
 * test_auth.c -- CURVE on a job's sockets, against real processes: a tcp
 * job works with CURVE on; a raw ZeroMQ client without the keys, with its
 * own key pair, or with another server key is refused by an actor and by a
 * node agent, nothing it sent reaches a method, and each refusal is counted;
 * a client holding the job's keys (or one on the allow-list) is admitted;
 * a member with other settings fails at once, naming why; key files are
 * checked (owner, mode, links, syntax, a matching pair); a node agent loads
 * classes only from the libraries on the allow-list it got at its start.
 *
 * This program is also its own actors: the node agent starts it again with
 * MANTA_ROLE set, and main() hands over to manta_init() at once.
 */
#include <manta.h>
#include <manta_schema.h>

#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

static test_redis redis;

/* ---- the test actor ---- */

static int m_echo(manta_req *c, void *st, const void *arg, size_t len)
{
    return manta_reply(c, arg, len);
}

static const manta_method t_methods[] = {{"echo", m_echo}, {NULL, NULL}};
static const manta_class tclass = {"tester", 0, NULL, NULL, t_methods};
static const manta_class *const classes[] = {&tclass, NULL};

/* ---- helpers ---- */

static int job_no;

static manta_ctx *start(const char *transport, const char *curve, const char *keys_file)
{
    char job[48];
    snprintf(job, sizeof job, "au%d-%d", (int)getpid(), ++job_no);
    manta_options o = {.redis_url = redis.url,
                       .job = job,
                       .classes = classes,
                       .transport = transport,
                       .curve = curve,
                       .keys_file = keys_file,
                       .call_timeout_ms = 10000};
    manta_ctx *m = NULL;
    int rc = manta_init(&m, &o);
    if (rc) fprintf(stderr, "manta_init: %s\n", manta_last_error());
    assert_int_equal(rc, 0);
    return m;
}

static manta_actor *make(manta_ctx *m, const char *name)
{
    manta_actor *a = NULL;
    int rc = manta_actor_create(m, &(manta_actor_options){.cls = "tester", .name = name}, &a);
    if (rc) fprintf(stderr, "create %s: %s\n", name, manta_last_error());
    assert_int_equal(rc, 0);
    return a;
}

static void assert_serves(manta_ctx *m, manta_actor *a)
{
    manta_future *f = manta_call(m, a, "echo", "hello", 5);
    const void *d;
    size_t n;
    int rc = manta_get(f, 10000, &d, &n);
    if (rc) fprintf(stderr, "echo: %s: %s\n", manta_strerror(rc), manta_future_error(f));
    assert_int_equal(rc, 0);
    assert_int_equal(n, 5);
    assert_memory_equal(d, "hello", 5);
    manta_future_free(f);
}

/* A counter of an actor's (or node agent's) __stats map, read through a
 * handle or, for a node agent, through a raw member client. */
static uint64_t stat_of(const void *data, size_t len, const char *name)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    uint64_t v = UINT64_MAX;
    if (msgpack_unpack_next(&u, data, len, &off) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(name) &&
                !memcmp(kv->key.via.str.ptr, name, strlen(name)))
                v = kv->val.via.u64;
        }
    }
    msgpack_unpacked_destroy(&u);
    return v;
}

static uint64_t actor_stat(manta_ctx *m, manta_actor *a, const char *name)
{
    manta_future *f = manta_call(m, a, MANTA_METHOD_STATS, NULL, 0);
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, 10000, &d, &n), 0);
    uint64_t v = stat_of(d, n, name);
    manta_future_free(f);
    assert_true(v != UINT64_MAX);
    return v;
}

/* A call envelope as the runtime's wire format has it (envelope.c). */
static size_t pack_call(unsigned char *out, size_t cap, const char *method, const void *payload,
                        size_t plen)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 6);
    msgpack_pack_uint32(&pk, MANTA_PROTOCOL_VERSION);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_uint64(&pk, 7);
    msgpack_pack_str(&pk, strlen(method));
    msgpack_pack_str_body(&pk, method, strlen(method));
    if (payload) {
        msgpack_pack_bin(&pk, plen);
        msgpack_pack_bin_body(&pk, payload, plen);
    } else {
        msgpack_pack_nil(&pk);
    }
    msgpack_pack_int(&pk, 0);
    assert_true(sb.size <= cap);
    memcpy(out, sb.data, sb.size);
    size_t n = sb.size;
    msgpack_sbuffer_destroy(&sb);
    return n;
}

/* How a raw client presents itself. */
typedef struct client_keys {
    const char *server_key, *public_key, *secret_key; /* all NULL: no CURVE */
} client_keys;

/* Call `method` on `endpoint` from a raw DEALER; returns 1 if any answer
 * came within wait_ms (its payload's first bytes in out), else 0. */
static int raw_call(const char *endpoint, const client_keys *k, const char *method, const void *arg,
                    size_t len, int wait_ms, char *out, size_t outcap)
{
    void *z = zmq_ctx_new();
    void *s = zmq_socket(z, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &wait_ms, sizeof wait_ms);
    if (k && k->server_key) {
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, k->server_key, 41), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, k->public_key, 41), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k->secret_key, 41), 0);
    }
    assert_int_equal(zmq_connect(s, endpoint), 0);
    unsigned char env[1024];
    size_t n = pack_call(env, sizeof env, method, arg, len);
    /* Queued until a connection is up: it leaves only if the handshake passes. */
    assert_int_equal(zmq_send(s, env, n, ZMQ_DONTWAIT), (int)n);
    zmq_msg_t r;
    zmq_msg_init(&r);
    int got = zmq_msg_recv(&r, s, 0) >= 0;
    if (got && out) {
        size_t rn = zmq_msg_size(&r) < outcap ? zmq_msg_size(&r) : outcap;
        memcpy(out, zmq_msg_data(&r), rn);
    }
    zmq_msg_close(&r);
    zmq_close(s);
    zmq_ctx_term(z);
    return got;
}

static void job_keys(manta_ctx *m, manta_keys *k)
{
    char path[512];
    snprintf(path, sizeof path, "%s/curve.key", manta_run_dir(m));
    int rc = manta_keys_read(path, k);
    if (rc) fprintf(stderr, "%s\n", manta_last_error());
    assert_int_equal(rc, 0);
}

static void node_of_job(manta_ctx *m, manta_reg_node *node)
{
    manta_reg_names ids = {0};
    assert_int_equal(manta_reg_node_ids(m, &ids), 0);
    assert_int_equal(ids.n, 1);
    assert_int_equal(manta_reg_node_read(m, ids.v[0], node), 0);
    manta_reg_names_free(&ids);
}

/* The three kinds of stranger: no CURVE, its own pair, another server key. */
static void strangers(manta_keys *own, manta_keys *other_server, const manta_keys *job,
                      client_keys out[3])
{
    assert_int_equal(manta_keys_generate(own), 0);
    assert_int_equal(manta_keys_generate(other_server), 0);
    out[0] = (client_keys){NULL, NULL, NULL};
    out[1] = (client_keys){job->public_key, own->public_key, own->secret_key};
    out[2] = (client_keys){other_server->public_key, job->public_key, job->secret_key};
}

/* ---- 1. a tcp job with CURVE: members in, strangers out ---- */

static void test_tcp_job_refuses_strangers(void **unused)
{
    manta_ctx *m = start("tcp", NULL, NULL); /* auto: on for tcp */
    manta_actor *a = make(m, "guarded");
    assert_serves(m, a);
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_memory_equal(info.endpoint, "tcp://", 6);

    /* the job's keys: a file only this user can read */
    char path[512];
    snprintf(path, sizeof path, "%s/curve.key", manta_run_dir(m));
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    manta_keys job;
    job_keys(m, &job);

    /* a member with the file is served: the test's raw client is sound */
    client_keys member = {job.public_key, job.public_key, job.secret_key};
    char out[64];
    assert_int_equal(raw_call(info.endpoint, &member, "echo", "hi", 2, 5000, out, sizeof out), 1);

    uint64_t served = actor_stat(m, a, "calls_served");
    uint64_t bad = actor_stat(m, a, "bad_envelopes");
    assert_int_equal(actor_stat(m, a, "auth_refused"), 0);
    served += 3; /* the __stats calls: the two above and the one that reads it */

    manta_keys own, other;
    client_keys s[3];
    strangers(&own, &other, &job, s);
    const char *what[3] = {"no CURVE", "own key pair", "another server key"};
    for (int i = 0; i < 3; i++) {
        int got = raw_call(info.endpoint, &s[i], "echo", "hi", 2, 1500, NULL, 0);
        fprintf(stderr, "stranger with %s: %s\n", what[i], got ? "ANSWERED" : "refused");
        assert_int_equal(got, 0);
    }
    /* nothing reached a method, and each refusal was counted */
    assert_int_equal(actor_stat(m, a, "calls_served"), served);
    assert_int_equal(actor_stat(m, a, "bad_envelopes"), bad);
    uint64_t refused = actor_stat(m, a, "auth_refused");
    fprintf(stderr, "actor counted %llu refusals\n", (unsigned long long)refused);
    assert_true(refused >= 3);
    assert_serves(m, a);
    manta_shutdown(m);
}

/* ---- 2. a node agent: no spawn, kill or shutdown from a stranger ---- */

static void test_node_refuses_strangers(void **unused)
{
    manta_ctx *m = start("tcp", "on", NULL);
    manta_actor *a = make(m, "kept");
    manta_reg_node node;
    node_of_job(m, &node);
    assert_memory_equal(node.endpoint, "tcp://", 6);
    manta_keys job, own, other;
    job_keys(m, &job);
    client_keys s[3];
    strangers(&own, &other, &job, s);

    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(sl > 0);
    self[sl] = 0;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    const char *kv[] = {"name", "intruder", "class", "tester", "exe", self};
    for (int k = 0; k < 6; k++) {
        msgpack_pack_str(&pk, strlen(kv[k]));
        msgpack_pack_str_body(&pk, kv[k], strlen(kv[k]));
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(raw_call(node.endpoint, &s[i], "spawn", sb.data, sb.size, 1000, NULL, 0),
                         0);
        assert_int_equal(raw_call(node.endpoint, &s[i], "kill", "0 kept", 6, 500, NULL, 0), 0);
        assert_int_equal(raw_call(node.endpoint, &s[i], "shutdown", NULL, 0, 500, NULL, 0), 0);
    }
    msgpack_sbuffer_destroy(&sb);
    /* no intruder was spawned, the actor lives, the agent still serves */
    manta_actor *x = NULL;
    assert_int_equal(manta_actor_lookup(m, "intruder", &x), MANTA_ENOTFOUND);
    assert_true(test_pid_alive(node.pid));
    assert_serves(m, a);
    /* the agent counted the refusals (asked by a member) */
    client_keys member = {job.public_key, job.public_key, job.secret_key};
    char out[4096];
    memset(out, 0, sizeof out);
    assert_int_equal(
        raw_call(node.endpoint, &member, MANTA_METHOD_STATS, NULL, 0, 5000, out, sizeof out), 1);
    /* the reply envelope's inline payload is the stats map: find the key */
    void *hit = memmem(out, sizeof out, "auth_refused", 12);
    assert_non_null(hit);
    const unsigned char *v = (const unsigned char *)hit + 12;
    uint64_t refused = v[0] < 0x80 ? v[0] : v[0] == 0xcc ? v[1] : 1000;
    fprintf(stderr, "node agent counted %llu refusals\n", (unsigned long long)refused);
    assert_true(refused >= 9);
    manta_shutdown(m);
}

/* ---- 3. an operator's key file and its allow-list ---- */

static void test_operator_keys_and_allow_list(void **unused)
{
    char dir[] = "/tmp/manta-keys-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/job.key", dir);
    manta_keys k, guest;
    assert_int_equal(manta_keys_generate(&k), 0);
    assert_int_equal(manta_keys_generate(&guest), 0);
    k.nallow = 1;
    memcpy(k.allow[0], guest.public_key, sizeof k.allow[0]);
    assert_int_equal(manta_keys_write(path, &k, 0), 0);

    manta_ctx *m = start("tcp", NULL, path);
    manta_actor *a = make(m, "allowing");
    assert_serves(m, a);
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    /* the operator's keys are the job's: a client with them is served */
    client_keys owner = {k.public_key, k.public_key, k.secret_key};
    assert_int_equal(raw_call(info.endpoint, &owner, "echo", "x", 1, 5000, NULL, 0), 1);
    /* a guest on the allow-list is admitted with its own pair */
    client_keys g = {k.public_key, guest.public_key, guest.secret_key};
    assert_int_equal(raw_call(info.endpoint, &g, "echo", "x", 1, 5000, NULL, 0), 1);
    /* no key was written into the run folder */
    char own[512];
    snprintf(own, sizeof own, "%s/curve.key", manta_run_dir(m));
    assert_int_equal(access(own, F_OK), -1);
    manta_shutdown(m);
    unlink(path);
    rmdir(dir);
}

/* ---- 4. ipc: off by default (private folder), on when asked ---- */

static void test_ipc_modes(void **unused)
{
    manta_ctx *m = start("ipc", NULL, NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/curve.key", manta_run_dir(m));
    assert_int_equal(access(path, F_OK), -1); /* auto: ipc without CURVE */
    assert_serves(m, make(m, "plain"));
    manta_shutdown(m);

    m = start("ipc", "on", NULL);
    snprintf(path, sizeof path, "%s/curve.key", manta_run_dir(m));
    assert_int_equal(access(path, F_OK), 0);
    manta_actor *a = make(m, "sealed");
    assert_serves(m, a);
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_int_equal(raw_call(info.endpoint, NULL, "echo", "x", 1, 1000, NULL, 0), 0);
    manta_shutdown(m);

    manta_options bad = {.redis_url = redis.url, .job = "au-bad", .curve = "maybe"};
    manta_ctx *none = NULL;
    assert_int_equal(manta_init(&none, &bad), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "maybe"));
}

/* ---- 5. a member without CURVE learns why at once ---- */

static void test_mismatch_fails_fast(void **unused)
{
    manta_ctx *m = start("tcp", NULL, NULL);
    manta_actor *a = make(m, "strict");
    assert_serves(m, a);
    /* the same job, attached without CURVE: its calls fail with the reason,
     * well before their deadline */
    manta_options o = {.redis_url = redis.url,
                       .job = manta_job(m),
                       .classes = classes,
                       .attach = 1,
                       .curve = "off",
                       .call_timeout_ms = 20000};
    manta_ctx *x = NULL;
    assert_int_equal(manta_init(&x, &o), 0);
    manta_actor *xa = NULL;
    assert_int_equal(manta_actor_lookup(x, "strict", &xa), 0);
    double t0 = test_now();
    manta_future *f = manta_call(x, xa, "echo", "x", 1);
    const void *d;
    size_t n;
    int rc = manta_get(f, 20000, &d, &n);
    fprintf(stderr, "call without CURVE: %s after %.2f s: %s\n", manta_strerror(rc),
            test_now() - t0, manta_future_error(f));
    /* refused outright (ECONNECT), or closed mid-handshake, which a caller
     * cannot tell from a death (EDIED): either way at once, with the hint */
    assert_true(rc == MANTA_ECONNECT || rc == MANTA_EDIED);
    assert_true(test_now() - t0 < 5);
    assert_non_null(strstr(manta_future_error(f), "MANTA_CURVE"));
    manta_future_free(f);
    manta_shutdown(x);
    assert_serves(m, a);
    manta_shutdown(m);
}

/* ---- 5b. an attached driver follows the owner's record, not a stale file ---- */

/* A key file of an earlier job of the same name, left in the run folder. */
static void plant_stale_keys(const char *job, char *path, size_t cap)
{
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/manta-%s", job);
    assert_int_equal(manta_private_dir(dir, "run folder"), 0);
    snprintf(path, cap, "%s/curve.key", dir);
    unlink(path);
    manta_keys stale;
    assert_int_equal(manta_keys_generate(&stale), 0);
    assert_int_equal(manta_keys_write(path, &stale, 0), 0);
}

static manta_ctx *attach_to_opts(const manta_options *o)
{
    manta_ctx *x = NULL;
    int rc = manta_init(&x, o);
    if (rc) fprintf(stderr, "attach: %s\n", manta_last_error());
    assert_int_equal(rc, 0);
    return x;
}

static manta_ctx *attach_to(const char *job)
{
    manta_options o = {.redis_url = redis.url, .job = job, .classes = classes, .attach = 1};
    return attach_to_opts(&o);
}

static void test_attached_follows_owner(void **unused)
{
    /* An ipc job without CURVE, over a stale key file: before the owner's
     * record, the attached driver saw the file, turned CURVE on with the
     * stale keys, and none of its calls got through. */
    char job[48], stale[512];
    snprintf(job, sizeof job, "au%d-stale", (int)getpid());
    plant_stale_keys(job, stale, sizeof stale);
    manta_options o = {
        .redis_url = redis.url, .job = job, .classes = classes, .call_timeout_ms = 10000};
    manta_ctx *m = NULL;
    assert_int_equal(manta_init(&m, &o), 0);
    assert_int_equal(manta_curve_on(m), 0);
    assert_serves(m, make(m, "open"));
    manta_ctx *x = attach_to(job);
    assert_int_equal(manta_curve_on(x), 0);
    manta_actor *xa = NULL;
    assert_int_equal(manta_actor_lookup(x, "open", &xa), 0);
    assert_serves(x, xa);
    manta_shutdown(x);
    manta_shutdown(m);

    /* A tcp job with an operator's key file; the run folder holds a stale
     * one: an attached driver that finds only that file is told so at
     * once, by name, instead of failing every handshake. */
    char keys[256];
    snprintf(keys, sizeof keys, "/tmp/au-%d-operator.key", (int)getpid());
    unlink(keys);
    manta_keys op;
    assert_int_equal(manta_keys_generate(&op), 0);
    assert_int_equal(manta_keys_write(keys, &op, 0), 0);
    snprintf(job, sizeof job, "au%d-stale2", (int)getpid());
    plant_stale_keys(job, stale, sizeof stale);
    o = (manta_options){.redis_url = redis.url,
                        .job = job,
                        .classes = classes,
                        .transport = "tcp",
                        .keys_file = keys,
                        .call_timeout_ms = 10000};
    assert_int_equal(manta_init(&m, &o), 0);
    assert_int_equal(manta_curve_on(m), 1);
    assert_serves(m, make(m, "sealed2"));
    manta_options ao = {.redis_url = redis.url, .job = job, .classes = classes, .attach = 1};
    x = NULL;
    int rc = manta_init(&x, &ao);
    if (rc)
        fprintf(stderr, "attach with the stale file (refused, as expected): %s\n",
                manta_last_error());
    assert_int_equal(rc, MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "earlier job of this name"));
    /* with the job's file it attaches and calls */
    ao.keys_file = keys;
    x = attach_to_opts(&ao);
    manta_actor *sa = NULL;
    assert_int_equal(manta_actor_lookup(x, "sealed2", &sa), 0);
    assert_serves(x, sa);
    manta_shutdown(x);
    manta_shutdown(m);
    unlink(keys);
}

/* ---- 6. the node agent's library allow-list ---- */

#ifdef USER_ACTORS_LIB
static int spawn_lib(manta_ctx *m, const char *name, const char *library)
{
    manta_actor *a = NULL;
    return manta_actor_create(
        m, &(manta_actor_options){.cls = "squarer", .name = name, .library = library}, &a);
}

static void test_library_allow_list(void **unused)
{
    char job[48];
    snprintf(job, sizeof job, "au%d-lib", (int)getpid());
    const char *const libs[] = {USER_ACTORS_LIB, NULL};
    manta_options o = {.redis_url = redis.url, .job = job, .classes = classes, .libraries = libs};
    manta_ctx *m = NULL;
    assert_int_equal(manta_init(&m, &o), 0);
    /* the library named at the start loads, however its path is spelt */
    int rc = spawn_lib(m, "sq-1", USER_ACTORS_LIB);
    if (rc) fprintf(stderr, "%s\n", manta_last_error());
    assert_int_equal(rc, 0);
    char dir[] = "/tmp/manta-lib-XXXXXX", link[128];
    assert_non_null(mkdtemp(dir));
    snprintf(link, sizeof link, "%s/same.so", dir);
    assert_int_equal(symlink(USER_ACTORS_LIB, link), 0);
    assert_int_equal(spawn_lib(m, "sq-2", link), 0);
    /* any other library is refused, naming its path, and nothing runs */
    const char *other = "/lib/x86_64-linux-gnu/libz.so.1";
    rc = spawn_lib(m, "sq-3", other);
    fprintf(stderr, "spawn with %s: %s\n", other, manta_last_error());
    assert_int_equal(rc, MANTA_ESPAWN);
    assert_non_null(strstr(manta_last_error(), other));
    assert_non_null(strstr(manta_last_error(), "allow-list"));
    manta_actor *x = NULL;
    assert_int_equal(manta_actor_lookup(m, "sq-3", &x), MANTA_ENOTFOUND);
    /* a bare name is not resolved through dlopen's search */
    assert_int_equal(spawn_lib(m, "sq-4", "libuser_actors.so"), MANTA_ESPAWN);
    manta_shutdown(m);
    unlink(link);
    rmdir(dir);

    /* a job that names no library: every library is refused */
    o.libraries = NULL;
    assert_int_equal(manta_init(&m, &o), 0);
    assert_int_equal(spawn_lib(m, "sq-5", USER_ACTORS_LIB), MANTA_ESPAWN);
    manta_shutdown(m);
}
#endif

/* ---- 7. a node agent without the keys does not start ---- */

static void test_node_without_keys(void **unused)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        if (devnull >= 0) dup2(devnull, 2);
        setenv("MANTA_ROLE", "node", 1);
        setenv("MANTA_NAME", "rogue", 1);
        setenv("MANTA_JOB", "au-rogue", 1);
        setenv("MANTA_REDIS", redis.url, 1);
        setenv("MANTA_TRANSPORT", "tcp", 1);
        unsetenv("MANTA_KEYS");
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        _exit(99);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3); /* a failed start */
    assert_int_equal(test_redis_count(&redis, "manta:au-rogue:*"), 0);
}

/* ---- 8. key files: what is refused ---- */

static void test_key_files(void **unused)
{
    char dir[] = "/tmp/manta-keys-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], link[128], text[128];
    snprintf(path, sizeof path, "%s/a.key", dir);
    snprintf(link, sizeof link, "%s/link.key", dir);
    snprintf(text, sizeof text, "%s/t.key", dir);
    manta_keys k, r;
    assert_int_equal(manta_keys_generate(&k), 0);
    assert_true(manta_key_valid(k.public_key));
    assert_false(manta_key_valid("short"));
    assert_int_equal(manta_keys_write(path, &k, 0), 0);
    assert_int_equal(manta_keys_read(path, &r), 0);
    assert_string_equal(r.public_key, k.public_key);
    assert_string_equal(r.secret_key, k.secret_key);
    assert_int_equal(r.nallow, 0);
    /* never overwritten unless asked; replaced whole when asked */
    assert_int_equal(manta_keys_write(path, &k, 0), MANTA_ESYS);
    k.nallow = 1;
    memcpy(k.allow[0], r.public_key, sizeof k.allow[0]);
    assert_int_equal(manta_keys_write(path, &k, 1), 0);
    assert_int_equal(manta_keys_read(path, &r), 0);
    assert_int_equal(r.nallow, 1);
    /* readable by others: refused */
    assert_int_equal(chmod(path, 0640), 0);
    assert_int_equal(manta_keys_read(path, &r), MANTA_ESYS);
    assert_non_null(strstr(manta_last_error(), "mode 0640"));
    assert_int_equal(chmod(path, 0600), 0);
    /* through a link: refused */
    assert_int_equal(symlink(path, link), 0);
    assert_int_not_equal(manta_keys_read(link, &r), 0);
    /* a bad line is named; a pair that does not match is refused */
    FILE *f = fopen(text, "w");
    fprintf(f, "public-key = %s\nsecret-key = nonsense\n", k.public_key);
    fclose(f);
    chmod(text, 0600);
    assert_int_equal(manta_keys_read(text, &r), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), ":2:"));
    manta_keys other;
    assert_int_equal(manta_keys_generate(&other), 0);
    f = fopen(text, "w");
    fprintf(f, "# two halves of different pairs\npublic-key = %s\nsecret-key = %s\n", k.public_key,
            other.secret_key);
    fclose(f);
    assert_int_equal(manta_keys_read(text, &r), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "not the secret key's"));
    unlink(text), unlink(link), unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    if (getenv("MANTA_ROLE")) { /* started as an actor or node agent */
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    if (!zmq_has("curve")) {
        fprintf(stderr, "libzmq without CURVE: skipped\n");
        return 77;
    }
    unsetenv("MANTA_CURVE");
    unsetenv("MANTA_KEYS");
    test_redis_start(&redis);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_job_refuses_strangers),
        cmocka_unit_test(test_node_refuses_strangers),
        cmocka_unit_test(test_operator_keys_and_allow_list),
        cmocka_unit_test(test_ipc_modes),
        cmocka_unit_test(test_mismatch_fails_fast),
        cmocka_unit_test(test_attached_follows_owner),
#ifdef USER_ACTORS_LIB
        cmocka_unit_test(test_library_allow_list),
#endif
        cmocka_unit_test(test_node_without_keys),
        cmocka_unit_test(test_key_files),
    };
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    test_redis_stop(&redis);
    return failed;
}
