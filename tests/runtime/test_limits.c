/*
 * test_limits.c -- what a hostile local peer can do to a job, checked
 * against real processes: oversized messages and frame headers refused
 * before memory is taken, hostile spawn requests to a node agent refused
 * without allocation (and names with paths in them, and programs other than
 * its own), a run folder someone else prepared refused, and the
 * embedded Redis password kept off the command line.
 *
 * Memory is read from /proc/PID/status: VmHWM (peak resident, reset through
 * /proc/PID/clear_refs) and VmSize (address space).
 *
 * This program is also its own actors: the node agent starts it again with
 * MANTA_ROLE set, and main() hands over to manta_init() at once.
 */
#include <manta.h>
#include <manta_schema.h>

#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <msgpack.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

static test_redis redis;

/* ---- the test actor ---- */

static int m_sleep(manta_req *c, void *st, const void *arg, size_t len)
{
    int ms = 0;
    if (len == sizeof ms) memcpy(&ms, arg, sizeof ms);
    usleep((useconds_t)ms * 1000);
    return manta_reply(c, &ms, sizeof ms);
}

static const manta_method t_methods[] = {{"sleep", m_sleep}, {NULL, NULL}};
static const manta_class tclass = {"tester", 0, NULL, NULL, t_methods};
static const manta_class *const classes[] = {&tclass, NULL};

/* ---- helpers ---- */

static int job_no;

static manta_ctx *start(size_t max_message)
{
    char job[48];
    snprintf(job, sizeof job, "l%d-%d", (int)getpid(), ++job_no);
    manta_options o = {.redis_url = redis.url,
                       .job = job,
                       .classes = classes,
                       .max_message = max_message,
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

/* The actor still serves a normal call. */
static void assert_serves(manta_ctx *m, manta_actor *a)
{
    int ms = 3, got = 0;
    manta_future *f = manta_call(m, a, "sleep", &ms, sizeof ms);
    const void *d;
    size_t n;
    int rc = manta_get(f, 10000, &d, &n);
    if (rc) fprintf(stderr, "sleep: %s: %s\n", manta_strerror(rc), manta_future_error(f));
    assert_int_equal(rc, 0);
    assert_int_equal(n, sizeof got);
    memcpy(&got, d, sizeof got);
    assert_int_equal(got, ms);
    manta_future_free(f);
}

/* A field of /proc/PID/status in kB; -1 if absent. */
static long proc_kb(int pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    size_t fl = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, fl) && line[fl] == ':') v = atol(line + fl + 1);
    fclose(f);
    return v;
}

/* Reset the peak resident size (VmHWM) to the current one. */
static void reset_peak(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", pid);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "5", 1), 1);
    close(fd);
}

static size_t pack_call(unsigned char *out, size_t cap, const char *method, const void *payload,
                        size_t plen, int nframes)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 6);
    msgpack_pack_uint32(&pk, MANTA_PROTOCOL_VERSION);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_uint64(&pk, 5);
    msgpack_pack_str(&pk, strlen(method));
    msgpack_pack_str_body(&pk, method, strlen(method));
    if (payload) {
        msgpack_pack_bin(&pk, plen);
        msgpack_pack_bin_body(&pk, payload, plen);
    } else {
        msgpack_pack_nil(&pk);
    }
    msgpack_pack_int(&pk, nframes);
    assert_true(sb.size <= cap);
    memcpy(out, sb.data, sb.size);
    size_t n = sb.size;
    msgpack_sbuffer_destroy(&sb);
    return n;
}

/* The status of the error reply on a raw DEALER (999: none within 5 s). */
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
    msg[0] = 0;
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

/* ---- 1. messages over the limit are refused before allocation ---- */

static void test_oversized_message(void **unused)
{
    manta_ctx *m = start(1 << 20);
    manta_actor *a = make(m, "small");
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_serves(m, a);
    reset_peak(info.pid);
    long before = proc_kb(info.pid, "VmHWM");
    assert_true(before > 0);

    void *z = zmq_ctx_new();
    void *s = zmq_socket(z, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_connect(s, info.endpoint), 0);
    unsigned char env[128];
    size_t n = pack_call(env, sizeof env, "sleep", NULL, 0, 1);
    size_t big = (size_t)16 << 20;
    char *payload = calloc(1, big);
    assert_non_null(payload);
    assert_int_equal(zmq_send(s, env, n, ZMQ_SNDMORE), (int)n);
    assert_int_equal(zmq_send(s, payload, big, 0), (int)big);
    free(payload);
    /* No answer comes: ZeroMQ closes the connection at the frame's header. */
    int rcvtimeo = 1500;
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
    zmq_msg_t r;
    zmq_msg_init(&r);
    int got = zmq_msg_recv(&r, s, 0);
    zmq_msg_close(&r);
    long after = proc_kb(info.pid, "VmHWM");
    fprintf(stderr, "actor peak resident: %ld kB before, %ld kB after a 16 MiB message\n", before,
            after);
    assert_true(after - before < 4 * 1024);
    assert_true(got < 0); /* refused, not read and answered */
    zmq_close(s);
    zmq_ctx_term(z);
    assert_serves(m, a);
    manta_shutdown(m);
}

/* Speak ZMTP 3 by hand on the actor's ipc socket, up to a message frame
 * whose header announces `announce` bytes. Returns the connected fd. */
static int zmtp_connect(const char *endpoint)
{
    assert_memory_equal(endpoint, "ipc://", 6);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", endpoint + 6);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    unsigned char greet[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    assert_int_equal(write(fd, greet, sizeof greet), (ssize_t)sizeof greet);
    unsigned char peer[64];
    size_t got = 0;
    while (got < sizeof peer) {
        ssize_t r = read(fd, peer + got, sizeof peer - got);
        assert_true(r > 0);
        got += (size_t)r;
    }
    assert_int_equal(peer[0], 0xff);
    static const unsigned char ready[] = {0x04, 28,  5,   'R', 'E', 'A', 'D', 'Y', 11,  'S',
                                          'o',  'c', 'k', 'e', 't', '-', 'T', 'y', 'p', 'e',
                                          0,    0,   0,   6,   'D', 'E', 'A', 'L', 'E', 'R'};
    assert_int_equal(write(fd, ready, sizeof ready), (ssize_t)sizeof ready);
    /* the peer's READY command */
    unsigned char hdr[9];
    assert_int_equal(read(fd, hdr, 2), 2);
    assert_true(hdr[0] & 0x04);
    uint64_t len = hdr[1];
    if (hdr[0] & 0x02) {
        unsigned char rest[7];
        size_t k = 0;
        while (k < 7) {
            ssize_t r = read(fd, rest + k, 7 - k);
            assert_true(r > 0);
            k += (size_t)r;
        }
        len = hdr[1];
        for (int i = 0; i < 7; i++) len = (len << 8) | rest[i];
    }
    while (len) {
        unsigned char buf[256];
        ssize_t r = read(fd, buf, len < sizeof buf ? len : sizeof buf);
        assert_true(r > 0);
        len -= (uint64_t)r;
    }
    return fd;
}

static void test_huge_frame_header(void **unused)
{
    manta_ctx *m = start(1 << 20);
    manta_actor *a = make(m, "header");
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_serves(m, a);
    long vm_before = proc_kb(info.pid, "VmSize");
    int fd = zmtp_connect(info.endpoint);
    /* a long message frame announcing 1 GiB, then a few bytes of it */
    unsigned char frame[9 + 16] = {0x02, 0, 0, 0, 0, 0x40, 0, 0, 0};
    assert_int_equal(write(fd, frame, sizeof frame), (ssize_t)sizeof frame);
    /* the actor hangs up at once instead of waiting for the gigabyte */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 3000), 1);
    char c;
    ssize_t r = read(fd, &c, 1);
    assert_true(r == 0 || (r < 0 && errno == ECONNRESET));
    long vm_after = proc_kb(info.pid, "VmSize");
    fprintf(stderr, "actor address space: %ld kB before, %ld kB after a 1 GiB frame header\n",
            vm_before, vm_after);
    assert_true(vm_after - vm_before < 256 * 1024);
    close(fd);
    assert_serves(m, a);
    manta_shutdown(m);
}

/* ---- routing ids cannot be guessed to steal replies ---- */

static void test_routing_id_takeover(void **unused)
{
    manta_ctx *m = start(0);
    manta_actor *a = make(m, "victim");
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_serves(m, a); /* the driver's connection is up */
    /* a slow call in flight, then an impostor connects with the id a
     * caller would have had before (NAME#PID) */
    int ms = 400;
    manta_future *f = manta_call(m, a, "sleep", &ms, sizeof ms);
    void *z = zmq_ctx_new();
    void *s = zmq_socket(z, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    char rid[64];
    int rl = snprintf(rid, sizeof rid, "driver#%d", (int)getpid());
    zmq_setsockopt(s, ZMQ_ROUTING_ID, rid, (size_t)rl);
    assert_int_equal(zmq_connect(s, info.endpoint), 0);
    unsigned char env[128];
    size_t n = pack_call(env, sizeof env, "zzz", NULL, 0, 0); /* makes the connection real */
    assert_int_equal(zmq_send(s, env, n, 0), (int)n);
    /* the reply still reaches the driver, not the impostor */
    const void *d;
    size_t dl;
    int rc = manta_get(f, 5000, &d, &dl);
    if (rc) fprintf(stderr, "slow call: %s: %s\n", manta_strerror(rc), manta_future_error(f));
    assert_int_equal(rc, 0);
    manta_future_free(f);
    zmq_msg_t r;
    zmq_msg_init(&r);
    int rcvtimeo = 200;
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
    int stolen = 0;
    while (zmq_msg_recv(&r, s, 0) >= 0) {
        /* the impostor may get its own error answer; never a reply (kind 2) */
        const unsigned char *b = zmq_msg_data(&r);
        if (zmq_msg_size(&r) > 2 && b[0] == 0x96 && b[2] == 2) stolen = 1;
    }
    zmq_msg_close(&r);
    assert_false(stolen);
    zmq_close(s);
    zmq_ctx_term(z);
    assert_serves(m, a);
    manta_shutdown(m);
}

/* A callee learns the routing id its callers present to it. Here the
 * callee is a spy (a raw ROUTER the driver finds in the directory): it
 * reads the driver's id from a call and presents it to another actor while
 * the driver's slow call to that actor is in flight. With one id per
 * process the spy took over the connection and the reply; with one per
 * socket (per callee) the id it saw is worth nothing elsewhere. */
static void test_routing_id_per_callee(void **unused)
{
    manta_ctx *m = start(0);
    manta_actor *a = make(m, "victim2");
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_serves(m, a);
    void *z = zmq_ctx_new();
    void *spy = zmq_socket(z, ZMQ_ROUTER);
    int zero = 0, rcvtimeo = 3000;
    zmq_setsockopt(spy, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(spy, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
    char ep[256];
    snprintf(ep, sizeof ep, "ipc://%s/spy", manta_run_dir(m));
    assert_int_equal(zmq_bind(spy, ep), 0);
    /* the spy in the directory, as an actor of the job */
    redisContext *c = redisConnect("127.0.0.1", redis.port);
    assert_true(c && !c->err);
    char key[160];
    snprintf(key, sizeof key, "manta:%s:actor:spy", manta_job(m));
    freeReplyObject(redisCommand(c,
                                 "HSET %s class tester endpoint %s state alive pid %d "
                                 "incarnation 1 node x",
                                 key, ep, (int)getpid()));
    redisFree(c);
    manta_actor *sa = NULL;
    assert_int_equal(manta_actor_lookup(m, "spy", &sa), 0);
    assert_int_equal(manta_cast(m, sa, "hello", NULL, 0), 0);
    manta_poll(m, 50); /* let the cast go out */
    zmq_msg_t rid;
    zmq_msg_init(&rid);
    assert_true(zmq_msg_recv(&rid, spy, 0) > 0);
    fprintf(stderr, "the spy saw routing id %.*s\n", (int)zmq_msg_size(&rid),
            (const char *)zmq_msg_data(&rid));
    /* a slow call to the victim, and the spy connects to it with that id */
    int ms = 400;
    manta_future *f = manta_call(m, a, "sleep", &ms, sizeof ms);
    void *s = zmq_socket(z, ZMQ_DEALER);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, zmq_msg_data(&rid), zmq_msg_size(&rid));
    zmq_msg_close(&rid);
    assert_int_equal(zmq_connect(s, info.endpoint), 0);
    unsigned char env[128];
    size_t n = pack_call(env, sizeof env, "zzz", NULL, 0, 0);
    assert_int_equal(zmq_send(s, env, n, 0), (int)n);
    const void *d;
    size_t dl;
    int rc = manta_get(f, 5000, &d, &dl);
    if (rc) fprintf(stderr, "slow call: %s: %s\n", manta_strerror(rc), manta_future_error(f));
    assert_int_equal(rc, 0);
    manta_future_free(f);
    zmq_msg_t r;
    zmq_msg_init(&r);
    rcvtimeo = 200;
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
    int stolen = 0;
    while (zmq_msg_recv(&r, s, 0) >= 0) {
        const unsigned char *b = zmq_msg_data(&r);
        if (zmq_msg_size(&r) > 2 && b[0] == 0x96 && b[2] == 2) stolen = 1;
    }
    zmq_msg_close(&r);
    assert_false(stolen);
    zmq_close(s);
    zmq_close(spy);
    zmq_ctx_term(z);
    assert_serves(m, a);
    manta_shutdown(m);
}

/* A node agent or actor whose name is not a plain name ("../x" would make
 * keys and, for an actor, a log file path) refuses to start (exit 3)
 * instead of registering under it. */
static void test_role_name_checked(void **unused)
{
    char job[48];
    snprintf(job, sizeof job, "lim%d-role", (int)getpid());
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("MANTA_ROLE", "node", 1);
        setenv("MANTA_NAME", "../evil", 1);
        setenv("MANTA_JOB", job, 1);
        setenv("MANTA_REDIS", redis.url, 1);
        setenv("MANTA_CURVE", "off", 1);
        execl("/proc/self/exe", "test_limits", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    double t0 = test_now();
    while (waitpid(pid, &status, WNOHANG) == 0 && test_now() - t0 < 5) usleep(20000);
    if (test_now() - t0 >= 5) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("a node agent named '../evil' still ran after 5 s");
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3);
    char pattern[96];
    snprintf(pattern, sizeof pattern, "manta:%s:*", job);
    assert_int_equal(test_redis_count(&redis, pattern), 0);
}

/* ---- 2. hostile spawn requests to a node agent ---- */

static void test_hostile_spawn(void **unused)
{
    manta_ctx *m = start(0);
    manta_reg_names ids = {0};
    assert_int_equal(manta_reg_node_ids(m, &ids), 0);
    assert_int_equal(ids.n, 1);
    manta_reg_node node;
    assert_int_equal(manta_reg_node_read(m, ids.v[0], &node), 0);
    manta_reg_names_free(&ids);
    assert_true(node.pid > 0);
    /* Measured once the agent is fully up: it registers before its loop has
     * run, and on a loaded machine its ZeroMQ threads (and the malloc arena
     * the first of them takes, 64 MiB of address space) came after such an
     * early measurement (CI: VmSize 26764 -> 92432 kB, none of it the
     * hostile messages'). A spawn that works warms it. */
    manta_actor *warm = make(m, "warm");
    assert_serves(m, warm);
    reset_peak(node.pid);
    long vm_before = proc_kb(node.pid, "VmSize"), rss_before = proc_kb(node.pid, "VmHWM");

    void *z = zmq_ctx_new();
    void *s = zmq_socket(z, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_connect(s, node.endpoint), 0);

    unsigned char bodies[5][200];
    size_t lens[5];
    /* an array announcing 2^32-1 elements in 40 bytes */
    memset(bodies, 0, sizeof bodies);
    memcpy(bodies[0], "\xdd\xff\xff\xff\xff", 5), lens[0] = 40;
    /* a map announcing 2^32-1 entries */
    memcpy(bodies[1], "\xdf\xff\xff\xff\xff", 5), lens[1] = 40;
    /* a map whose "name" is an array announcing 2^32-1 elements */
    memcpy(bodies[2], "\x81\xa4name\xdd\xff\xff\xff\xff", 11), lens[2] = 40;
    /* a map whose "junk" nests arrays 150 deep */
    memcpy(bodies[3], "\x81\xa4junk", 6);
    memset(bodies[3] + 6, 0x91, 150);
    bodies[3][156] = 0xc0, lens[3] = 157;
    /* a string announcing 4 GiB */
    memcpy(bodies[4], "\x81\xa4name\xdb\xff\xff\xff\xff", 11), lens[4] = 40;
    for (int i = 0; i < 5; i++) {
        unsigned char env[400];
        size_t n = pack_call(env, sizeof env, "spawn", bodies[i], lens[i], 0);
        assert_int_equal(zmq_send(s, env, n, 0), (int)n);
        char msg[512];
        int st = recv_error_status(s, msg, sizeof msg);
        fprintf(stderr, "hostile spawn %d: %s: %s\n", i, manta_strerror(st), msg);
        assert_int_equal(st, MANTA_EPROTO);
    }
    /* well-formed requests that ask for what no one may have */
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(sl > 0);
    self[sl] = 0;
    const char *const asks[][2] = {{"../../tmp/evil", self}, {"evil", "/bin/sh"}};
    const int want[] = {MANTA_EINVAL, MANTA_ESPAWN};
    const char *const why[] = {"actor name", "runs only its own program"};
    for (int i = 0; i < 2; i++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 3);
        const char *kv[] = {"name", asks[i][0], "class", "tester", "exe", asks[i][1]};
        for (int k = 0; k < 6; k++) {
            msgpack_pack_str(&pk, strlen(kv[k]));
            msgpack_pack_str_body(&pk, kv[k], strlen(kv[k]));
        }
        unsigned char env[8192];
        size_t n = pack_call(env, sizeof env, "spawn", sb.data, sb.size, 0);
        msgpack_sbuffer_destroy(&sb);
        assert_int_equal(zmq_send(s, env, n, 0), (int)n);
        char msg[512];
        int st = recv_error_status(s, msg, sizeof msg);
        fprintf(stderr, "spawn %s as %s: %s: %s\n", asks[i][1], asks[i][0], manta_strerror(st),
                msg);
        assert_int_equal(st, want[i]);
        assert_non_null(strstr(msg, why[i]));
    }
    zmq_close(s);
    zmq_ctx_term(z);
    long vm_after = proc_kb(node.pid, "VmSize"), rss_after = proc_kb(node.pid, "VmHWM");
    fprintf(stderr, "node agent: VmSize %ld -> %ld kB, peak resident %ld -> %ld kB\n", vm_before,
            vm_after, rss_before, rss_after);
    assert_true(vm_after - vm_before < 64 * 1024);
    assert_true(rss_after - rss_before < 4 * 1024);
    /* and it still spawns */
    manta_actor *a = make(m, "after");
    assert_serves(m, a);
    manta_shutdown(m);
}

/* ---- 3. a run folder someone else prepared ---- */

static void test_run_folder_checked(void **unused)
{
    char job[48], dir[96];
    snprintf(job, sizeof job, "l%d-open", (int)getpid());
    snprintf(dir, sizeof dir, "/tmp/manta-%s", job);
    rmdir(dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(chmod(dir, 0777), 0);
    manta_ctx *m = NULL;
    manta_options o = {.redis_url = redis.url, .job = job, .classes = classes};
    assert_int_equal(manta_init(&m, &o), MANTA_ESYS);
    assert_null(m);
    fprintf(stderr, "refused: %s\n", manta_last_error());
    assert_non_null(strstr(manta_last_error(), dir));
    assert_non_null(strstr(manta_last_error(), "0777"));
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0); /* left alone, not removed */
    assert_int_equal(rmdir(dir), 0);

    /* a link to a folder of ours is refused too */
    char target[] = "/tmp/manta-target-XXXXXX";
    assert_non_null(mkdtemp(target));
    snprintf(job, sizeof job, "l%d-link", (int)getpid());
    snprintf(dir, sizeof dir, "/tmp/manta-%s", job);
    unlink(dir);
    assert_int_equal(symlink(target, dir), 0);
    assert_int_equal(manta_init(&m, &o), MANTA_ESYS);
    fprintf(stderr, "refused: %s\n", manta_last_error());
    assert_non_null(strstr(manta_last_error(), dir));
    assert_non_null(strstr(manta_last_error(), "symbolic link"));
    assert_int_equal(unlink(dir), 0);
    assert_int_equal(rmdir(target), 0);

    /* one that is ours with mode 0700 is used */
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(manta_init(&m, &o), 0);
    assert_serves(m, make(m, "ok"));
    manta_shutdown(m);
}

/* ---- 4. the embedded Redis password stays off the command line ---- */

static int child_named(const char *comm)
{
    DIR *d = opendir("/proc");
    assert_non_null(d);
    struct dirent *e;
    int found = -1;
    while (found < 0 && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0) continue;
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/%d/status", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int ppid = -1, match = 0;
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "Name:", 5) && strstr(line, comm)) match = 1;
            if (!strncmp(line, "PPid:", 5)) ppid = atoi(line + 5);
        }
        fclose(f);
        if (match && ppid == getpid()) found = pid;
    }
    closedir(d);
    return found;
}

static void test_redis_password_hidden(void **unused)
{
    manta_ctx *m = NULL;
    assert_int_equal(manta_init(&m, &(manta_options){.classes = classes}), 0);
    const char *url = manta_redis_url(m);
    assert_memory_equal(url, "redis://:", 9);
    char pw[64];
    const char *at = strchr(url + 9, '@');
    assert_non_null(at);
    snprintf(pw, sizeof pw, "%.*s", (int)(at - url - 9), url + 9);
    assert_int_equal(strlen(pw), 32);
    int port = atoi(strrchr(url, ':') + 1);
    int pid = child_named("redis-server");
    assert_true(pid > 0);
    char path[64], cmd[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    ssize_t n = read(fd, cmd, sizeof cmd - 1);
    close(fd);
    assert_true(n > 0);
    for (ssize_t i = 0; i < n; i++)
        if (!cmd[i]) cmd[i] = ' ';
    cmd[n] = 0;
    fprintf(stderr, "redis-server command line: %s\n", cmd);
    assert_null(strstr(cmd, pw));
    /* the configuration that holds it is private */
    /* a client with the password works, one without is refused */
    redisContext *c = redisConnect("127.0.0.1", port);
    assert_true(c && !c->err);
    redisReply *r = redisCommand(c, "PING");
    assert_true(r && r->type == REDIS_REPLY_ERROR);
    freeReplyObject(r);
    r = redisCommand(c, "AUTH %s", pw);
    assert_true(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = redisCommand(c, "PING");
    assert_true(r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG"));
    freeReplyObject(r);
    /* redis-server rewrites its process title, but the password was on
     * the command line from exec until then: it must come from a file, one
     * that only this user can read, in a folder only this user can enter */
    r = redisCommand(c, "INFO server");
    assert_true(r && r->type == REDIS_REPLY_STRING);
    const char *cf = strstr(r->str, "config_file:");
    assert_non_null(cf);
    char conf[256];
    assert_int_equal(sscanf(cf, "config_file:%255s", conf), 1);
    freeReplyObject(r);
    fprintf(stderr, "redis-server configuration: %s\n", conf);
    struct stat st;
    assert_int_equal(lstat(conf, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_uid, geteuid());
    *strrchr(conf, '/') = 0;
    struct stat dst;
    assert_int_equal(lstat(conf, &dst), 0);
    assert_int_equal(dst.st_mode & 0777, 0700);
    *strrchr(conf, 0) = '/';
    redisFree(c);
    assert_serves(m, make(m, "emb"));
    manta_shutdown(m);
    assert_int_equal(lstat(conf, &st), -1); /* gone with the job */
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
        cmocka_unit_test(test_oversized_message),   cmocka_unit_test(test_huge_frame_header),
        cmocka_unit_test(test_routing_id_takeover), cmocka_unit_test(test_routing_id_per_callee),
        cmocka_unit_test(test_role_name_checked),   cmocka_unit_test(test_hostile_spawn),
        cmocka_unit_test(test_run_folder_checked),  cmocka_unit_test(test_redis_password_hidden),
    };
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    test_redis_stop(&redis);
    return failed;
}
