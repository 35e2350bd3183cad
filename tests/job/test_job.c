/*
 * test_job.c - the job library (manta_job.h) from C, against a real
 * redis-server (embedded), node agent and actor processes, and a real
 * service process (python3 -m http.server on a free port).
 *
 * The spec below has two groups of classes defined here: `worker` (ping
 * answers its name; drain records itself with manta_kv_set) and `boss`,
 * whose `run` method pings every worker it finds and answers the count.
 * One test walks a job through its life: start (the service is up, the
 * replicas are ready), scale up, scale down (the highest-numbered drain
 * first), drain one by name, kill a replica and see it restarted, run the
 * run method, attach from a second ctx and scale from there, free (the
 * service is stopped). Others check the errors.
 */
#include <manta.h>
#include <manta_job.h>
#include <manta_schema.h>
#include <manta_spec.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

/* ---- the classes ---- */

static int w_ping(manta_req *c, void *st, const void *arg, size_t len)
{
    const char *self = manta_self(manta_req_ctx(c));
    return manta_reply(c, self, strlen(self));
}

static int w_drain(manta_req *c, void *st, const void *arg, size_t len)
{
    char key[96];
    snprintf(key, sizeof key, "drained-%s", manta_self(manta_req_ctx(c)));
    return manta_kv_set(manta_req_ctx(c), key, "1", 1) ? MANTA_EREDIS : manta_reply(c, "", 0);
}

/* Ping worker-0 .. worker-15 that exist; answer "pinged N". */
static int b_run(manta_req *c, void *st, const void *arg, size_t len)
{
    manta_ctx *m = manta_req_ctx(c);
    int n = 0;
    for (int i = 0; i < 16; i++) {
        char name[32];
        snprintf(name, sizeof name, "worker-%d", i);
        manta_actor *a;
        if (manta_actor_lookup(m, name, &a) != 0) continue;
        manta_future *f = manta_call(m, a, "ping", NULL, 0);
        const void *d;
        size_t dl;
        if (manta_get(f, 10000, &d, &dl) == 0 && dl == strlen(name) && !memcmp(d, name, dl)) n++;
        manta_future_free(f);
    }
    char out[32];
    snprintf(out, sizeof out, "pinged %d", n);
    return manta_reply(c, out, strlen(out));
}

/* The GPUs its node agent gave it: CUDA_VISIBLE_DEVICES, or "(unset)". */
static int w_devices(manta_req *c, void *st, const void *arg, size_t len)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) v = "(unset)";
    return manta_reply(c, v, strlen(v));
}

/* manta_gpu_see_node, twice (the second must change nothing): "N|CUDA_VISIBLE_DEVICES|
 * MANTA_GPUS_OWN" after it */
static int w_peers(manta_req *c, void *st, const void *arg, size_t len)
{
    int n1 = manta_gpu_see_node(), n2 = manta_gpu_see_node();
    const char *v = getenv("CUDA_VISIBLE_DEVICES"), *o = getenv("MANTA_GPUS_OWN");
    char out[1024];
    snprintf(out, sizeof out, "%d%s|%s|%s", n1, n1 == n2 ? "" : "!", v ? v : "(unset)",
             o ? o : "(unset)");
    return manta_reply(c, out, strlen(out));
}

static const manta_method worker_methods[] = {
    {"ping", w_ping}, {"drain", w_drain}, {"devices", w_devices}, {"peers", w_peers}, {NULL, NULL}};
static const manta_method boss_methods[] = {{"run", b_run}, {NULL, NULL}};
static const manta_class worker_class = {"worker", 0, NULL, NULL, worker_methods};
static const manta_class boss_class = {"boss", 0, NULL, NULL, boss_methods};
static const manta_class *const classes[] = {&worker_class, &boss_class, NULL};

/* ---- helpers ---- */

static manta_ctx *ctx;
static char spec_path[128];

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (void *)&a, &l))
        return -1;
    close(fd);
    return ntohs(a.sin_port);
}

static int port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Write the spec (with a service on `port`) to spec_path and load it. */
static manta_spec *load(int port, const char *job)
{
    FILE *f = fopen(spec_path, "w");
    assert_non_null(f);
    fprintf(f,
            "job: %s\n"
            "groups:\n"
            "  worker: {class: worker, replicas: 2, max_restarts: 3, resources: {cpu: 0.1}}\n"
            "  boss: {class: boss, resources: {cpu: 0.1}}\n"
            "services:\n"
            "  - {name: web, command: \"exec python3 -m http.server %d --bind 127.0.0.1\","
            " port: %d}\n"
            "run: {group: boss, method: run, timeout_s: 60}\n",
            job, port, port);
    fclose(f);
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec *s = manta_spec_load_file(spec_path, NULL, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    assert_non_null(s);
    return s;
}

/* What a test started, for after_test() to end when the test failed half way:
 * a job left running would refuse the next tests' starts (the ctx stays
 * attached to it), and an agent left running would take their actors. */
static manta_job_t *started;
static pid_t agents[16];
static size_t nagents;

static void check(int rc, const char *what)
{
    if (rc != 0) fail_msg("%s: %s (%s)", what, manta_strerror(rc), manta_last_error());
}

static int alive(const char *name, int *incarnation)
{
    manta_actor *a;
    manta_actor_info info;
    if (manta_actor_lookup(ctx, name, &a) != 0 || manta_actor_info_get(ctx, a, &info) != 0)
        return 0;
    if (incarnation) *incarnation = info.incarnation;
    return info.state == MANTA_ACTOR_ALIVE;
}

static void ping(const char *name)
{
    manta_actor *a;
    check(manta_actor_lookup(ctx, name, &a), name);
    manta_future *f = manta_call(ctx, a, "ping", NULL, 0);
    const void *d;
    size_t n;
    check(manta_get(f, 10000, &d, &n), name);
    assert_int_equal(n, strlen(name));
    assert_memory_equal(d, name, n);
    manta_future_free(f);
}

static int drained(const char *name)
{
    char key[96];
    void *v;
    size_t n;
    snprintf(key, sizeof key, "drained-%s", name);
    if (manta_kv_get(ctx, key, &v, &n) != 0) return 0;
    free(v);
    return 1;
}

/* Run this program again as another process (`test_job MODE URL JOB
 * SPEC`, see child() below); returns its exit status. */
static int run_self(const char *mode)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/proc/%d/exe %s '%s' %s %s", (int)getpid(), mode,
             manta_redis_url(ctx), manta_job(ctx), spec_path);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A program's derived defaults (manta_spec_options.defaults), as the RL
 * classes derive a GPU share (actors/rl_defaults.c) but by this test's
 * rule: a group with settings.gpu_share and no resources.gpu of its own
 * gets that share. */
static int share_defaults(manta_spec_defaults *d, const manta_spec_node *root, void *user)
{
    const manta_spec_node *groups = manta_spec_find(root, "groups");
    for (size_t i = 0; i < manta_spec_len(groups); i++) {
        const char *share;
        char path[128];
        if (manta_spec_get_str(manta_spec_at(groups, i), "settings.gpu_share", NULL, &share,
                               NULL) != 0)
            continue;
        snprintf(path, sizeof path, "groups.%s.resources.gpu", manta_spec_key_at(groups, i));
        int rc = manta_spec_default(d, path, share, "the test's rule: settings.gpu_share");
        if (rc < 0) return rc;
    }
    return 0;
}

/* What a replica of gs beyond the one GPU must fail with: the group, and
 * that its share is a default to set. */
static bool gs_refused(int rc)
{
    const char *e = manta_last_error();
    return rc == MANTA_ESPAWN && strstr(e, "placement: group \"gs\" replica 1 of 1") &&
           strstr(e, "groups.gs.resources.gpu 0.5 is a default (the test's rule: "
                     "settings.gpu_share): set it in the spec or with --set to choose another") &&
           !strstr(e, "gz");
}

/* The other process: "second" starts the same job as a second driver
 * (refused with MANTA_EEXIST, leaving the job alone); "attach" attaches and
 * scales worker to 3. Exit 0 when it went as expected. */
static int child(char **argv)
{
    const char *mode = argv[1], *url = argv[2], *job = argv[3], *path = argv[4];
    bool second = !strcmp(mode, "second");
    manta_ctx *m;
    manta_options o = {
        .redis_url = url, .job = job, .classes = classes, .attach = !second, .no_local_node = 1};
    if (manta_init(&m, &o) != 0) return fprintf(stderr, "init: %s\n", manta_last_error()), 10;
    manta_job_t *j = NULL;
    int rc;
    if (second) {
        manta_spec_errors errs;
        manta_spec_errors_init(&errs);
        manta_spec *s = manta_spec_load_file(path, NULL, &errs);
        manta_spec_errors_destroy(&errs);
        rc = s ? manta_job_start(m, s, NULL, &j) : 11;
        bool ok = rc == MANTA_EEXIST && strstr(manta_last_error(), "already running") && !j;
        if (!ok) fprintf(stderr, "second driver: %d %s\n", rc, manta_last_error());
        rc = ok ? 0 : 12;
        manta_spec_free(s);
    } else if (!strcmp(mode, "attach-gpu")) {
        /* as `manta scale gs 3` does: the spec reloaded with the program's defaults */
        manta_spec_options so = {.defaults = share_defaults};
        rc = manta_job_attach(m, &so, NULL, &j);
        if (rc == 0 && manta_spec_group_find(manta_job_spec(j), "gs")->gpu != 0.5) rc = 14;
        if (rc == 0) rc = gs_refused(manta_job_scale(j, "gs", 3, 0)) ? 0 : 15;
        if (rc) fprintf(stderr, "attach-gpu: %d %s\n", rc, manta_last_error());
        manta_job_free(j);
    } else {
        rc = manta_job_attach(m, NULL, NULL, &j);
        if (rc == 0 && strcmp(manta_job_spec(j)->job, job)) rc = 13;
        if (rc == 0) rc = manta_job_scale(j, "worker", 3, 0);
        if (rc) fprintf(stderr, "attach: %d %s\n", rc, manta_last_error());
        manta_job_free(j);
    }
    manta_shutdown(m);
    return rc ? 1 : 0;
}

static char job_name[32]; /* job-test-<pid> */

/* ---- the tests ---- */

/* A port taken by a stranger is refused, and the records go again. */
static void test_service_port_taken(void **st)
{
    int port = free_port();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    manta_spec *s = load(port, job_name);
    manta_job_t *job = (manta_job_t *)1;
    assert_int_equal(manta_job_start(ctx, s, NULL, &job), MANTA_ESPAWN);
    assert_null(job);
    assert_non_null(strstr(manta_last_error(), "already taken"));
    assert_non_null(strstr(manta_last_error(), "web"));
    close(fd);
    manta_spec_free(s);
}

static void test_life(void **st)
{
    int port = free_port();
    manta_spec *s = load(port, job_name);
    manta_job_t *job;
    FILE *log = tmpfile();
    manta_job_options o = {.spec_path = spec_path, .ready_timeout_s = 60, .log = log};
    check(manta_job_start(ctx, s, &o, &job), "start");
    started = job;
    assert_true(port_open(port)); /* the service is up */
    assert_int_equal(manta_job_node_count(job), 1);
    assert_ptr_equal(manta_job_spec(job), s);
    assert_int_equal(manta_job_replicas(job, "worker"), 2);
    ping("worker-0"), ping("worker-1");

    /* up: the new ones get the next indices and are ready */
    check(manta_job_scale(job, "worker", 4, 0), "scale to 4");
    assert_int_equal(manta_job_replicas(job, "worker"), 4);
    ping("worker-2"), ping("worker-3");
    /* down: the highest-numbered drain and stop */
    check(manta_job_scale(job, "worker", 2, 0), "scale to 2");
    assert_int_equal(manta_job_replicas(job, "worker"), 2);
    assert_true(drained("worker-3") && drained("worker-2"));
    assert_false(drained("worker-1"));
    assert_false(alive("worker-3", NULL));
    /* the same count again changes nothing */
    check(manta_job_scale(job, "worker", 2, 0), "scale to 2 again");

    /* a replica killed is restarted by its node (max_restarts 3) */
    int inc0 = 0, inc = 0;
    assert_true(alive("worker-1", &inc0));
    manta_actor *a;
    check(manta_actor_lookup(ctx, "worker-1", &a), "lookup worker-1");
    check(manta_actor_kill(ctx, a, 1), "kill worker-1");
    for (int t = 0; t < 200 && !(alive("worker-1", &inc) && inc > inc0); t++) manta_poll(ctx, 50);
    assert_true(inc > inc0);
    check(manta_actor_wait_ready(ctx, a, 20000), "worker-1 ready again");

    /* the run method: the boss pings both workers */
    const void *reply;
    size_t len;
    check(manta_job_wait(job, 60000, &reply, &len), "wait");
    assert_int_equal(len, strlen("pinged 2"));
    assert_memory_equal(reply, "pinged 2", len);

    /* another process: a second driver of the name is refused; an attached
     * one scales with the spec as recorded */
    assert_int_equal(run_self("second"), 0);
    assert_int_equal(run_self("attach"), 0);
    assert_int_equal(manta_job_replicas(job, "worker"), 3);
    ping("worker-2");

    /* one by name */
    check(manta_job_drain(job, "worker-2", 0), "drain worker-2");
    assert_true(drained("worker-2"));
    assert_int_equal(manta_job_drain(job, "worker-9", 0), MANTA_ENOTFOUND);

    /* a service that dies mid-job is reported in the log */
    char line[256], text[4096] = "";
    int svc = 0;
    rewind(log);
    while (fgets(line, sizeof line, log))
        if (sscanf(line, "manta: service web started (pid %d)", &svc) == 1) break;
    assert_true(svc > 0);
    kill(svc, SIGTERM);
    for (int t = 0; t < 40 && !strstr(text, "service web was"); t++) {
        manta_poll(ctx, 100); /* the watchdog looks every second */
        fflush(log), rewind(log);
        text[fread(text, 1, sizeof text - 1, log)] = 0;
    }
    assert_non_null(strstr(text, "service web was killed by signal 15"));
    manta_job_free(job);
    started = NULL;
    fclose(log);
    assert_false(port_open(port)); /* nothing listens after the job */
    manta_spec_free(s);
}

/* Start this program as the node agent NAME of the job with 2 CPUs, as
 * `manta node` does on another machine; extra ("VAR=value" or NULL) is
 * added to its environment, which has no CUDA_VISIBLE_DEVICES otherwise. */
static pid_t start_node_env(const char *name, const char *extra)
{
    extern char **environ;
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 9, sizeof *env), vars[7][700];
    snprintf(vars[0], sizeof vars[0], "MANTA_ROLE=node");
    snprintf(vars[1], sizeof vars[1], "MANTA_NAME=%s", name);
    snprintf(vars[2], sizeof vars[2], "MANTA_JOB=%s", manta_job(ctx));
    snprintf(vars[3], sizeof vars[3], "MANTA_REDIS=%s", manta_redis_url(ctx));
    snprintf(vars[4], sizeof vars[4], "MANTA_NODE_CPU=2");
    /* over tcp, as `manta node` runs: ipc endpoints are per machine */
    snprintf(vars[5], sizeof vars[5], "MANTA_TRANSPORT=tcp");
    snprintf(vars[6], sizeof vars[6], "MANTA_HOST=127.0.0.1");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "MANTA_", 6) && strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21))
            env[k++] = environ[i];
    for (int i = 0; i < 7; i++) env[k++] = vars[i];
    if (extra) env[k++] = (char *)extra;
    char self[64];
    snprintf(self, sizeof self, "/proc/%d/exe", (int)getpid());
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failing test leaves no agent behind */
        if (getppid() != parent) _exit(1);
        execle(self, self, (char *)NULL, env);
        _exit(127);
    }
    free(env);
    if (pid > 0 && nagents < sizeof agents / sizeof *agents) agents[nagents++] = pid;
    return pid;
}

static pid_t start_node(const char *name)
{
    return start_node_env(name, NULL);
}

static void actor_node(const char *name, char *node, size_t n, int *is_alive)
{
    manta_actor *a;
    manta_actor_info info;
    node[0] = 0;
    *is_alive = 0;
    if (manta_actor_lookup(ctx, name, &a) != 0 || manta_actor_info_get(ctx, a, &info) != 0) return;
    snprintf(node, n, "%s", info.node);
    *is_alive = info.state == MANTA_ACTOR_ALIVE;
}

/* A C driver gets the node watchdog: a node killed mid-job is declared dead
 * and its actor re-created on a node with room. The local node has 1 CPU
 * (main), so `big` (2 CPUs) goes to n2 first, then to n3. */
static void test_failover(void **st)
{
    pid_t n2 = start_node("n2"), n3 = start_node("n3");
    assert_true(n2 > 0 && n3 > 0);
    const char *y = "job: job-failover\n"
                    "groups: {big: {class: worker, resources: {cpu: 2}}}\n";
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec *s = manta_spec_load_buffer(y, strlen(y), "failover.yaml", NULL, &errs);
    manta_spec_errors_destroy(&errs);
    assert_non_null(s);
    manta_job_t *job = NULL;
    manta_job_options o = {.node_timeout_ms = 10000};
    /* Both nodes first: `big` fits on either, and a start with n2 alone
     * (n3 a moment later: CI saw it) would leave no node to fail over to. */
    size_t nodes = 0;
    for (int t = 0; t < 100 && nodes < 3; t++) {
        manta_reg_node_list nl;
        if (manta_reg_node_list_read(ctx, &nl) == 0) {
            nodes = nl.n;
            manta_reg_node_list_free(&nl);
        }
        if (nodes < 3) manta_poll(ctx, 100);
    }
    assert_int_equal(nodes, 3);
    int rc = MANTA_ESPAWN;
    for (int t = 0; t < 100 && rc == MANTA_ESPAWN; t++)
        if ((rc = manta_job_start(ctx, s, &o, &job)) == MANTA_ESPAWN) manta_poll(ctx, 100);
    check(rc, "start on three nodes");
    started = job;
    assert_int_equal(manta_job_node_count(job), 3);
    char node[64];
    int up;
    actor_node("big-0", node, sizeof node, &up);
    assert_string_equal(node, "n2");
    kill(n2, SIGKILL);
    waitpid(n2, NULL, 0);
    for (int t = 0; t < 300 && !(up && !strcmp(node, "n3")); t++) {
        manta_poll(ctx, 100); /* the watchdog runs on this loop */
        actor_node("big-0", node, sizeof node, &up);
    }
    assert_string_equal(node, "n3");
    assert_true(up);
    ping("big-0");
    manta_job_free(job);
    started = NULL;
    manta_spec_free(s);
    kill(n3, SIGTERM);
    waitpid(n3, NULL, 0);
}

/* NAME's reply to METHOD ("devices": its CUDA_VISIBLE_DEVICES) into out. */
static void ask_of(const char *name, const char *method, char *out, size_t cap)
{
    manta_actor *a;
    check(manta_actor_lookup(ctx, name, &a), name);
    check(manta_actor_wait_ready(ctx, a, 10000), name);
    manta_future *f = manta_call(ctx, a, method, NULL, 0);
    const void *d;
    size_t n;
    check(manta_get(f, 10000, &d, &n), name);
    assert_true(n < cap);
    if (n) memcpy(out, d, n); /* an empty reply has no bytes (d may be NULL) */
    out[n] = 0;
    manta_future_free(f);
}

static void devices_of(const char *name, char *out, size_t cap)
{
    ask_of(name, "devices", out, cap);
}

/* GPUs: a node agent started with CUDA_VISIBLE_DEVICES=7,GPU-<uuid>,9 offers three
 * GPUs and gives each actor of a `gpu: 1` group its own, by those names, in
 * CUDA_VISIBLE_DEVICES, and the two of a `gpu: 0.5` group one device to
 * share; an actor without GPUs gets "" (sees none); a restarted actor
 * keeps its device; a stopped one frees it; an agent asked for more than
 * it has free refuses, saying how much is. The local node offers none
 * (MANTA_NODE_GPU=0 in main). */
#define UUID "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
static void test_gpus(void **st)
{
    pid_t g1 = start_node_env("g1", "CUDA_VISIBLE_DEVICES=7," UUID ",9");
    assert_true(g1 > 0);
    const char *y = "job: job-gpus\n"
                    "groups:\n"
                    "  g: {class: worker, replicas: 2, max_restarts: 2,"
                    " resources: {cpu: 0.1, gpu: 1}}\n"
                    "  h: {class: worker, replicas: 2, resources: {cpu: 0.1, gpu: 0.5}}\n"
                    "  c: {class: worker, resources: {cpu: 0.1}}\n";
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec *s = manta_spec_load_buffer(y, strlen(y), "gpus.yaml", NULL, &errs);
    manta_spec_errors_destroy(&errs);
    assert_non_null(s);
    manta_job_t *job = NULL;
    int rc = MANTA_ESPAWN;
    for (int t = 0; t < 100 && rc == MANTA_ESPAWN; t++) /* until g1 has registered */
        if ((rc = manta_job_start(ctx, s, &(manta_job_options){.no_watchdog = 1}, &job)) ==
            MANTA_ESPAWN)
            manta_poll(ctx, 100);
    check(rc, "start with a GPU node");
    started = job;
    char g0[128], gone[128], h0[128], h1[128], dc[128], d[128], node[64];
    int up;
    devices_of("g-0", g0, sizeof g0);
    devices_of("g-1", gone, sizeof gone);
    devices_of("h-0", h0, sizeof h0);
    devices_of("h-1", h1, sizeof h1);
    devices_of("c-0", dc, sizeof dc);
    actor_node("g-0", node, sizeof node, &up);
    assert_string_equal(node, "g1");
    /* each one device by the agent's names: g's two their own, h's two one to share */
    const char *names[] = {"7", UUID, "9"};
    int seen[3] = {0};
    const char *got[] = {g0, gone, h0};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 3; k++) seen[k] += !strcmp(got[i], names[k]);
    assert_true(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);
    assert_string_equal(h1, h0);
    assert_string_equal(dc, "");
    /* an actor may see the node's other GPUs after its own (manta_gpu_see_node), in the
     * agent's order; one without a GPU sees none still */
    char want[256], peers[256];
    snprintf(want, sizeof want, "3|%s", g0);
    for (int k = 0; k < 3; k++)
        if (strcmp(names[k], g0))
            snprintf(want + strlen(want), sizeof want - strlen(want), ",%s", names[k]);
    snprintf(want + strlen(want), sizeof want - strlen(want), "|%s", g0);
    ask_of("g-0", "peers", peers, sizeof peers);
    assert_string_equal(peers, want);
    ask_of("c-0", "peers", peers, sizeof peers);
    assert_string_equal(peers, "0||(unset)");
    /* a restarted incarnation keeps its device */
    manta_actor *a;
    check(manta_actor_lookup(ctx, "g-0", &a), "g-0");
    int inc = 0;
    assert_true(alive("g-0", &inc));
    check(manta_actor_kill(ctx, a, 1), "kill g-0");
    int inc2 = inc;
    for (int t = 0; t < 100 && !(alive("g-0", &inc2) && inc2 > inc); t++) manta_poll(ctx, 100);
    assert_true(inc2 > inc);
    devices_of("g-0", d, sizeof d);
    assert_string_equal(d, g0);
    /* no room for a third whole GPU: the driver's placement says so */
    assert_int_equal(manta_job_scale(job, "g", 3, 5000), MANTA_ESPAWN);
    /* and the agent itself refuses what it does not have free */
    manta_actor *x = NULL;
    manta_actor_options xo = {
        .cls = "worker", .name = "extra", .node = "g1", .gpu = 1, .no_wait = 1};
    assert_int_equal(manta_actor_create(ctx, &xo, &x), MANTA_ESPAWN);
    assert_non_null(strstr(manta_last_error(), "asks for 1 GPU(s); 0 of this node's 3 are free"));
    xo.gpu = 0.25;
    assert_int_equal(manta_actor_create(ctx, &xo, &x), MANTA_ESPAWN);
    assert_non_null(strstr(manta_last_error(), "asks for 0.25 GPU(s); 0 of this node's 3 are"));
    /* a stopped replica frees its share, and then its whole device, for the next */
    check(manta_job_scale(job, "h", 1, 20000), "scale h to 1");
    check(manta_job_scale(job, "h", 2, 20000), "scale h to 2 again");
    devices_of("h-1", d, sizeof d);
    assert_string_equal(d, h0);
    check(manta_job_scale(job, "g", 1, 20000), "scale g to 1");
    check(manta_job_scale(job, "g", 2, 20000), "scale g to 2 again");
    devices_of("g-1", d, sizeof d);
    assert_string_equal(d, gone);
    manta_job_free(job);
    started = NULL;
    manta_spec_free(s);
    kill(g1, SIGTERM);
    waitpid(g1, NULL, 0);
}

/* A default the program derives (the RL classes' GPU share with
 * model.device cuda) is said once when the job starts; its replicas get
 * the devices of the share (here the one GPU of node g2, "0", to share),
 * a group's own resources.gpu (0) wins, and a scale beyond the GPU fails
 * at once, naming the group and saying to set its resources.gpu, from
 * this driver and from an attached process (as `manta scale`). */
static void test_gpu_defaults(void **st)
{
    pid_t g2 = start_node_env("g2", "MANTA_NODE_GPU=1");
    assert_true(g2 > 0);
    char path[128];
    snprintf(path, sizeof path, "/tmp/manta-test-job-dft-%d.yaml", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("job: job-dft\n"
          "groups:\n"
          "  gs: {class: worker, replicas: 2, resources: {cpu: 0.1}, settings: {gpu_share: 0.5}}\n"
          "  gz: {class: worker, resources: {cpu: 0.1, gpu: 0}, settings: {gpu_share: 0.5}}\n"
          "  gc: {class: worker, resources: {cpu: 0.1}}\n",
          f);
    fclose(f);
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.defaults = share_defaults};
    manta_spec *s = manta_spec_load_file(path, &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    assert_non_null(s);
    assert_int_equal(s->n_derived, 1);
    assert_true(manta_spec_group_find(s, "gs")->gpu == 0.5);
    assert_true(manta_spec_group_find(s, "gz")->gpu == 0);
    /* g2 registered (its GPU is the only one) before the job places anything */
    bool up = false;
    for (int t = 0; t < 100 && !up; t++) {
        manta_reg_node_list nl;
        if (manta_reg_node_list_read(ctx, &nl) == 0) {
            for (size_t i = 0; i < nl.n; i++)
                up |= !strcmp(nl.v[i].id, "g2") && nl.v[i].rec.state == MANTA_ACTOR_ALIVE;
            manta_reg_node_list_free(&nl);
        }
        if (!up) manta_poll(ctx, 100);
    }
    assert_true(up);
    FILE *log = tmpfile();
    manta_job_t *job = NULL;
    manta_job_options o = {.spec_path = path, .no_watchdog = 1, .log = log};
    check(manta_job_start(ctx, s, &o, &job), "start with a derived GPU share");
    started = job;
    char text[4096];
    fflush(log), rewind(log);
    text[fread(text, 1, sizeof text - 1, log)] = 0;
    const char *said = "manta: groups.gs.resources.gpu 0.5 is a default (the test's rule: "
                       "settings.gpu_share): set it in the spec or with --set to choose another\n";
    const char *at = strstr(text, said);
    assert_non_null(at);
    assert_null(strstr(at + 1, said)); /* once */
    char d0[128], d1[128], dz[128], dc[128];
    devices_of("gs-0", d0, sizeof d0);
    devices_of("gs-1", d1, sizeof d1);
    devices_of("gz-0", dz, sizeof dz);
    devices_of("gc-0", dc, sizeof dc);
    assert_string_equal(d0, "0");
    assert_string_equal(d1, "0");
    assert_string_equal(dz, "");
    assert_string_equal(dc, "");
    /* a third half does not fit the one GPU: refused at once, here and when attached */
    assert_true(gs_refused(manta_job_scale(job, "gs", 3, 5000)));
    assert_int_equal(run_self("attach-gpu"), 0);
    assert_int_equal(manta_job_replicas(job, "gs"), 2);
    manta_job_free(job);
    started = NULL;
    fclose(log);
    manta_spec_free(s);
    unlink(path);
    kill(g2, SIGTERM);
    waitpid(g2, NULL, 0);
}

/* After each test: end the job and the node agents it left behind (only a
 * failed test leaves any). Agents the test reaped are gone from the table:
 * waitpid(WNOHANG) says 0 only for a child still running. */
static int after_test(void **st)
{
    if (started) manta_job_free(started);
    started = NULL;
    for (size_t i = 0; i < nagents; i++)
        if (waitpid(agents[i], NULL, WNOHANG) == 0) {
            kill(agents[i], SIGKILL);
            waitpid(agents[i], NULL, 0);
        }
    nagents = 0;
    return 0;
}

/* The errors of the calls, each with a message naming the cause. */
static void test_errors(void **st)
{
    assert_int_equal(manta_job_start(NULL, NULL, NULL, NULL), MANTA_EINVAL);
    assert_int_equal(manta_job_scale(NULL, "worker", 1, 0), MANTA_EINVAL);
    assert_int_equal(manta_job_wait(NULL, 0, NULL, NULL), MANTA_EINVAL);
    manta_job_free(NULL);

    /* a job without services or run: wait serves until stopped */
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    const char *y = "job: job-errors\n"
                    "groups: {solo: {class: worker, resources: {cpu: 0.1}}}\n";
    manta_spec *s = manta_spec_load_buffer(y, strlen(y), "errors.yaml", NULL, &errs);
    manta_spec_errors_destroy(&errs);
    assert_non_null(s);
    manta_ctx *m = ctx; /* test_life's job was freed: its records went */
    manta_job_t *job;
    check(manta_job_start(m, s, &(manta_job_options){.no_watchdog = 1}, &job), "start");
    manta_job_t *again;
    assert_int_equal(manta_job_scale(job, "nosuch", 1, 0), MANTA_ENOTFOUND);
    assert_non_null(strstr(manta_last_error(), "nosuch"));
    assert_int_equal(manta_job_scale(job, "solo", -1, 0), MANTA_EINVAL);
    assert_int_equal(manta_job_replicas(job, "nosuch"), MANTA_ENOTFOUND);
    manta_future *f;
    assert_int_equal(manta_job_run_method(job, &f), MANTA_ENOTFOUND);
    assert_null(f);
    /* no run: -> the wait serves; a timeout is EPENDING, a stop is 0 */
    assert_int_equal(manta_job_wait(job, 200, NULL, NULL), MANTA_EPENDING);
    manta_job_stop(job);
    assert_int_equal(manta_job_wait(job, 5000, NULL, NULL), 0);
    /* started without a spec path: nothing to attach with */
    assert_int_equal(manta_job_attach(m, NULL, NULL, &again), MANTA_ENOTFOUND);
    assert_null(again);
    manta_job_free(job);
    manta_spec_free(s);
}

int main(int argc, char **argv)
{
    if (argc == 5 && !getenv("MANTA_ROLE")) return child(argv);
    /* the local node offers 1 CPU, so test_failover's group does not fit */
    if (!getenv("MANTA_ROLE")) setenv("MANTA_NODE_CPU", "1", 1);
    /* and no GPU, whatever the machine has (test_gpus starts a node with three) */
    if (!getenv("MANTA_ROLE")) setenv("MANTA_NODE_GPU", "0", 1);
    /* CURVE on over ipc too: the tcp agents of test_failover join with the
     * job's key file, and every test runs authenticated */
    /* a name of this process's own: two copies of this test on one machine (a CI clone and a
     * run by hand) would otherwise share the run folder /tmp/manta-<job> and its key file */
    snprintf(job_name, sizeof job_name, "job-test-%d", (int)getpid());
    if (manta_init(&ctx, &(manta_options){.classes = classes, .job = job_name, .curve = "on"}) !=
        0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(spec_path, sizeof spec_path, "/tmp/manta-test-job-%d.yaml", (int)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_service_port_taken, after_test),
        cmocka_unit_test_teardown(test_life, after_test),
        cmocka_unit_test_teardown(test_failover, after_test),
        cmocka_unit_test_teardown(test_gpus, after_test),
        cmocka_unit_test_teardown(test_gpu_defaults, after_test),
        cmocka_unit_test_teardown(test_errors, after_test)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    manta_shutdown(ctx);
    unlink(spec_path);
    return failed;
}
