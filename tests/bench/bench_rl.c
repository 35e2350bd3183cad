/*
 * bench_rl.c - figures of the RL system, each against a baseline measured in
 * the same run. One JSON object per line: {"name","value","unit","baseline",
 * "ratio"}.
 *
 *   build/tests/bench/bench_rl [--quick] > figures.jsonl
 *
 *  (a) trained tokens/s with eta = 4 against eta = 0 (the synchronous
 *      baseline), rollout-heavy, heavy-tailed tool latency (Pareto);
 *  (b) generated tokens/s with 1, 2, 4, 8 rollout actors, tool latency
 *      dominating, against 1 rollout;
 *  (c) the learner's idle fraction at eta = 4 (1 - time in steps / RL wall
 *      time, 100 versions, no tool latency), against eta = 0; and the same
 *      in the setting of (a);
 *  (d) weight-sync bandwidth: 16 MiB of weights as 4 buckets of 4 MiB (the
 *      learners' default), fetched by another process with manta_obj_get,
 *      each checked with CRC32C and assembled, as a rollout does; against a
 *      raw ZeroMQ REQ/REP transfer of the same 16 MiB between the same two
 *      processes (copied out and checked the same way); and (d') the same 4M
 *      parameters as bfloat16 buckets (rl.bucket_dtype bf16: 8 MiB, each
 *      value widened as the rollout does), in parameters/s, against the
 *      float buckets.
 *
 * Every configuration runs in a fresh child process (its own runtime, its
 * own embedded Redis, its own calc server) started as `bench_rl --one ...`;
 * the program is also its own actors (manta_init re-executes it).
 */
#include "calc_server.h"

#include <manta_actors.h>
#include <manta_collective.h>
#include <manta_job.h>
#include <manta_kernels.h>

#include <cjson/cJSON.h>
#include <msgpack.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the fetcher actor, for (d) ---- */

#define SYNC_BUCKETS 4

/* A version's weights as the learners publish them: SYNC_BUCKETS buckets. */
typedef struct fetch_req {
    char id[SYNC_BUCKETS][48];
    uint32_t bucket_crc[SYNC_BUCKETS];
    char endpoint[128];
    int64_t bytes; /* in all */
    uint32_t crc;  /* of all */
    int bf16;      /* the buckets hold bfloat16s, widened to floats as they arrive */
} fetch_req;

/* What a rollout does: fetch every bucket, check each CRC32C, assemble. */
static int m_fetch(manta_req *c, void *st, const void *arg, size_t len)
{
    fetch_req r;
    if (len != sizeof r) return MANTA_EINVAL;
    memcpy(&r, arg, sizeof r);
    size_t total = (size_t)r.bytes * (r.bf16 ? 2 : 1); /* of floats assembled */
    char *all = malloc(total);
    if (!all) return MANTA_ENOMEM;
    double t0 = now_s();
    size_t at = 0;
    for (int b = 0; b < SYNC_BUCKETS; b++) {
        manta_obj_id id;
        snprintf(id.s, sizeof id.s, "%s", r.id[b]);
        void *data;
        size_t n;
        int rc = manta_obj_get(manta_req_ctx(c), &id, &data, &n, 30000);
        if (rc) {
            free(all);
            return manta_reply_error(c, rc, "fetch: %s", manta_last_error());
        }
        int ok = at + n <= (size_t)r.bytes && manta_crc32c(0, data, n) == r.bucket_crc[b];
        if (ok && r.bf16)
            mk_bf16_to_f32_n((float *)(void *)(all + 2 * at), data, n / 2);
        else if (ok)
            memcpy(all + at, data, n);
        at += ok ? n : 0;
        free(data);
        if (!ok) {
            free(all);
            return manta_reply_error(c, MANTA_EPROTO, "fetch: bad size or checksum");
        }
    }
    double dt = now_s() - t0;
    free(all);
    if (at != (size_t)r.bytes) return manta_reply_error(c, MANTA_EPROTO, "fetch: short");
    return manta_reply(c, &dt, sizeof dt);
}

static int m_raw(manta_req *c, void *st, const void *arg, size_t len)
{
    fetch_req r;
    if (len != sizeof r) return MANTA_EINVAL;
    memcpy(&r, arg, sizeof r);
    void *zc = zmq_ctx_new();
    void *s = zmq_socket(zc, ZMQ_REQ);
    zmq_connect(s, r.endpoint);
    double t0 = now_s();
    zmq_send(s, "get", 3, 0);
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    int n = zmq_msg_recv(&msg, s, 0);
    /* the same copy out and the same check as the object path */
    void *data = malloc(zmq_msg_size(&msg));
    if (data) memcpy(data, zmq_msg_data(&msg), zmq_msg_size(&msg));
    int ok = n == r.bytes && data && manta_crc32c(0, data, (size_t)n) == r.crc;
    double dt = now_s() - t0;
    free(data);
    zmq_msg_close(&msg);
    zmq_close(s);
    zmq_ctx_term(zc);
    if (!ok) return manta_reply_error(c, MANTA_EPROTO, "raw: bad transfer");
    return manta_reply(c, &dt, sizeof dt);
}

static const manta_method fetcher_methods[] = {{"fetch", m_fetch}, {"raw", m_raw}, {NULL, NULL}};
static const manta_class fetcher_class = {"bench_fetcher", 0, NULL, NULL, fetcher_methods};
static const manta_class *const classes[] = {
    &rl_controller_class, &rl_rollout_class, &rl_env_class, &rl_reward_class,
    &rl_learner_class,    &fetcher_class,    NULL};

/* ---- (d) ---- */

typedef struct raw_server {
    void *zc, *sock;
    const void *buf;
    size_t len;
    int rounds;
} raw_server;

static void *raw_thread(void *arg)
{
    raw_server *r = arg;
    for (int i = 0; i < r->rounds; i++) {
        char req[8];
        if (zmq_recv(r->sock, req, sizeof req, 0) < 0) break;
        zmq_msg_t msg; /* zero copy, as the object thread serves */
        zmq_msg_init_data(&msg, (void *)r->buf, r->len, NULL, NULL);
        zmq_msg_send(&msg, r->sock, 0);
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int one_sync(manta_ctx *m, size_t bytes, int rounds)
{
    manta_actor *f;
    if (manta_actor_create(m, &(manta_actor_options){.cls = "bench_fetcher", .name = "fetcher"},
                           &f))
        return 1;
    float *buf = malloc(bytes);
    for (size_t i = 0; i < bytes / 4; i++) buf[i] = (float)i * 1e-3f;
    fetch_req r = {0};
    r.bytes = (int64_t)bytes;
    r.crc = manta_crc32c(0, buf, bytes);
    manta_obj_id ids[SYNC_BUCKETS];
    size_t per = bytes / SYNC_BUCKETS;
    for (int b = 0; b < SYNC_BUCKETS; b++) {
        if (manta_put(m, (char *)buf + b * per, per, &ids[b])) return 1;
        snprintf(r.id[b], sizeof r.id[b], "%s", ids[b].s);
        r.bucket_crc[b] = manta_crc32c(0, (char *)buf + b * per, per);
    }
    /* the same parameters as bfloat16 buckets (rl.bucket_dtype bf16) */
    fetch_req r16 = r;
    r16.bf16 = 1;
    r16.bytes = (int64_t)bytes / 2;
    uint16_t *b16 = malloc(bytes / 2);
    mk_f32_to_bf16_n(b16, buf, bytes / 4);
    manta_obj_id ids16[SYNC_BUCKETS];
    for (int b = 0; b < SYNC_BUCKETS; b++) {
        if (manta_put(m, (char *)b16 + b * per / 2, per / 2, &ids16[b])) return 1;
        snprintf(r16.id[b], sizeof r16.id[b], "%s", ids16[b].s);
        r16.bucket_crc[b] = manta_crc32c(0, (char *)b16 + b * per / 2, per / 2);
    }
    raw_server rs = {.buf = buf, .len = bytes, .rounds = rounds};
    rs.zc = zmq_ctx_new();
    rs.sock = zmq_socket(rs.zc, ZMQ_REP);
    snprintf(r.endpoint, sizeof r.endpoint, "ipc:///tmp/bench-rl-%d.ipc", (int)getpid());
    zmq_bind(rs.sock, r.endpoint);
    pthread_t th;
    pthread_create(&th, NULL, raw_thread, &rs);
    double tm[64], tr[64], t16[64];
    for (int i = 0; i < rounds; i++) {
        const void *d;
        size_t n;
        manta_future *f16 = manta_call_timeout(m, f, "fetch", &r16, sizeof r16, 60000);
        if (manta_get(f16, -1, &d, &n) || n != sizeof(double)) {
            fprintf(stderr, "fetch bf16: %s\n", manta_future_error(f16));
            return 1;
        }
        memcpy(&t16[i], d, sizeof(double));
        manta_future_free(f16);
        manta_future *fu = manta_call_timeout(m, f, "fetch", &r, sizeof r, 60000);
        if (manta_get(fu, -1, &d, &n) || n != sizeof(double)) {
            fprintf(stderr, "fetch: %s\n", manta_future_error(fu));
            return 1;
        }
        memcpy(&tm[i], d, sizeof(double));
        manta_future_free(fu);
        fu = manta_call_timeout(m, f, "raw", &r, sizeof r, 60000);
        if (manta_get(fu, -1, &d, &n) || n != sizeof(double)) {
            fprintf(stderr, "raw: %s\n", manta_future_error(fu));
            return 1;
        }
        memcpy(&tr[i], d, sizeof(double));
        manta_future_free(fu);
    }
    pthread_join(th, NULL);
    zmq_close(rs.sock);
    zmq_ctx_term(rs.zc);
    char path[128];
    snprintf(path, sizeof path, "/tmp/bench-rl-%d.ipc", (int)getpid());
    unlink(path);
    for (int b = 0; b < SYNC_BUCKETS; b++) manta_obj_release(m, &ids[b]);
    for (int b = 0; b < SYNC_BUCKETS; b++) manta_obj_release(m, &ids16[b]);
    free(buf), free(b16);
    qsort(tm, (size_t)rounds, sizeof *tm, cmp_d);
    qsort(tr, (size_t)rounds, sizeof *tr, cmp_d);
    qsort(t16, (size_t)rounds, sizeof *t16, cmp_d);
    double mb = bytes / 1e6, mp = bytes / 4 / 1e6;
    printf("{\"manta_MBps\":%.1f,\"raw_MBps\":%.1f,\"f32_Mparams_s\":%.1f,"
           "\"bf16_Mparams_s\":%.1f}\n",
           mb / tm[rounds / 2], mb / tr[rounds / 2], mp / tm[rounds / 2], mp / t16[rounds / 2]);
    return 0;
}

/* ---- (a)-(c): one RL run ---- */

static int one_rl(manta_ctx *m, int argc, char **argv)
{
    /* argv: latency_args sets... */
    int port = 0;
    int pid = rl_start_calc_server(SOURCE_DIR "/examples/calc_server.py", argv[0], &port);
    if (pid < 0) return 1;
    const char *sets[64];
    size_t n = 0;
    char url[128];
    snprintf(url, sizeof url, "tools.0.url=http://127.0.0.1:%d/mcp", port);
    sets[n++] = url;
    sets[n++] = "task.train=" SOURCE_DIR "/examples/calc/train.jsonl";
    sets[n++] = "task.heldout=" SOURCE_DIR "/examples/calc/heldout.jsonl";
    sets[n++] = "task.demos=" SOURCE_DIR "/examples/calc/demos.jsonl";
    char dir[128];
    snprintf(dir, sizeof dir, "rl.run_dir=/tmp/bench-rl-run-%d", (int)getpid());
    sets[n++] = dir;
    sets[n++] = "rl.eval_problems=0";
    sets[n++] = "rl.eval_every=0";
    /* the figures measure the pipeline (generation, staleness, the learner),
     * not the sampling rule: every group is trained, as when they were first
     * taken (dynamic sampling would make versions wait for informative groups) */
    sets[n++] = "rl.dynamic_sampling=false";
    for (int i = 1; i < argc && n < 60; i++) sets[n++] = argv[i];
    /* The job through the job library, the calc server above in place of
     * the spec's service (a free port). */
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets, .n_sets = n};
    manta_spec *spec = manta_spec_load_file(SOURCE_DIR "/examples/calc_agent.yaml", &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    manta_job_t *job = NULL;
    const void *reply = NULL;
    size_t len = 0;
    int rc = spec ? manta_job_start(m, spec, &(manta_job_options){.no_services = 1}, &job)
                  : MANTA_EINVAL;
    if (rc == 0) rc = manta_job_wait(job, -1, &reply, &len);
    if (rc) fprintf(stderr, "bench_rl: %s\n", manta_last_error());
    char *summary = rc == 0 ? strndup(reply, len) : NULL;
    manta_job_free(job);
    manta_spec_free(spec);
    rl_stop_process(pid);
    if (rc || !summary) return 1;
    cJSON *j = cJSON_Parse(summary);
    char *flat = cJSON_PrintUnformatted(j);
    printf("%s\n", flat);
    free(flat);
    cJSON_Delete(j);
    free(summary);
    return 0;
}

/* ---- the parent ---- */

static cJSON *run_child(const char *self, const char *const *args)
{
    char cmd[4096];
    int k = snprintf(cmd, sizeof cmd, "'%s' --one", self);
    for (int i = 0; args[i]; i++) k += snprintf(cmd + k, sizeof cmd - k, " '%s'", args[i]);
    snprintf(cmd + k, sizeof cmd - k, " 2>/dev/null");
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char line[65536], last[65536] = "";
    while (fgets(line, sizeof line, p))
        if (line[0] == '{') snprintf(last, sizeof last, "%s", line);
    pclose(p);
    return last[0] ? cJSON_Parse(last) : NULL;
}

static double jnum(const cJSON *j, const char *a, const char *b)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b) o = cJSON_GetObjectItemCaseSensitive(o, b);
    return cJSON_IsNumber(o) ? o->valuedouble : -1;
}

static void figure(const char *name, double v, const char *unit, double base)
{
    printf("{\"name\":\"%s\",\"value\":%.4g,\"unit\":\"%s\",\"baseline\":%.4g,\"ratio\":%.3f}\n",
           name, v, unit, base, base > 0 ? v / base : 0);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    manta_ctx *m;
    if (argc > 1 && !strcmp(argv[1], "--one")) {
        if (manta_init(&m, &(manta_options){.classes = classes, .call_timeout_ms = 60000}))
            return 1;
        signal(SIGPIPE, SIG_IGN);
        int rc = 1;
        if (argc > 3 && !strcmp(argv[2], "sync"))
            rc = one_sync(m, (size_t)atol(argv[3]), argc > 4 ? atoi(argv[4]) : 5);
        else if (argc > 3 && !strcmp(argv[2], "rl"))
            rc = one_rl(m, argc - 3, argv + 3);
        manta_shutdown(m);
        return rc;
    }
    if (getenv("MANTA_ROLE")) { /* an actor or node agent */
        manta_init(&m, &(manta_options){.classes = classes});
        return 1;
    }
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    char self[1024];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return 1;
    self[sl] = 0;
    const char *versions = quick ? "rl.max_versions=15" : "rl.max_versions=60";
    /* (c) measures a steady state: long enough that filling the pipeline at
     * the start (the first batch has to be generated) does not dominate */
    const char *versions_c = quick ? "rl.max_versions=30" : "rl.max_versions=100";
    /* the same policy for every figure, whatever the example's warm-up */
    const char *warm = "rl.warmup_steps=70";

    /* (a) eta 4 vs eta 0, heavy-tailed tool latency, rollout-heavy */
    const char *lat_a = "--latency-ms 40 --latency-dist pareto --seed 7";
    double tps[2], idle_a[2];
    for (int k = 0; k < 2; k++) {
        const char *args[] = {
            "rl", lat_a, k ? "rl.eta=4" : "rl.eta=0", versions, "rl.max_time_s=300", warm, NULL};
        cJSON *j = run_child(self, args);
        tps[k] = j ? jnum(j, "rates", "trained_tokens_per_s") : -1;
        idle_a[k] = j ? 1 - jnum(j, "rates", "learner_busy_fraction") : -1;
        cJSON_Delete(j);
    }
    figure("rl_trained_tokens_per_s_eta4_vs_eta0_pareto_latency", tps[1], "tokens/s", tps[0]);
    figure("rl_learner_idle_fraction_eta4_vs_eta0_pareto_latency", idle_a[1], "fraction",
           idle_a[0]);
    /* (c) the learner-bound setting: no tool latency, eta 4 vs 0 */
    double idle[2];
    for (int k = 0; k < 2; k++) {
        const char *args[] = {"rl", "", k ? "rl.eta=4" : "rl.eta=0", versions_c, warm, NULL};
        cJSON *j = run_child(self, args);
        idle[k] = j ? 1 - jnum(j, "rates", "learner_busy_fraction") : -1;
        cJSON_Delete(j);
    }
    figure("rl_learner_idle_fraction_eta4_vs_eta0", idle[1], "fraction", idle[0]);

    /* (b) rollout scaling with tool latency dominating (fixed 500 ms) */
    double base = 0;
    int ns[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        if (quick && ns[i] == 4) continue;
        char rep[64];
        snprintf(rep, sizeof rep, "rollout.replicas=%d", ns[i]);
        const char *args[] = {"rl",
                              "--latency-ms 500",
                              rep,
                              "rollout.settings.slots=8",
                              "rl.eta=100000",
                              "rl.max_versions=100000",
                              quick ? "rl.max_time_s=8" : "rl.max_time_s=14",
                              warm,
                              NULL};
        cJSON *j = run_child(self, args);
        double v = j ? jnum(j, "rates", "gen_tokens_per_s") : -1;
        cJSON_Delete(j);
        if (i == 0) base = v;
        char name[64];
        snprintf(name, sizeof name, "rl_rollout_scaling_%d_rollouts_500ms_tools", ns[i]);
        figure(name, v, "tokens/s", base);
    }

    /* (d) weight sync: 16 MiB (a 4M-parameter policy) */
    {
        char bytes[32];
        snprintf(bytes, sizeof bytes, "%d", 16 << 20);
        const char *args[] = {"sync", bytes, quick ? "3" : "7", NULL};
        cJSON *j = run_child(self, args);
        figure("rl_weight_sync_bandwidth_16MiB", j ? jnum(j, "manta_MBps", NULL) : -1, "MB/s",
               j ? jnum(j, "raw_MBps", NULL) : -1);
        figure("rl_weight_sync_bf16_buckets_4M_params", j ? jnum(j, "bf16_Mparams_s", NULL) : -1,
               "Mparams/s", j ? jnum(j, "f32_Mparams_s", NULL) : -1);
        cJSON_Delete(j);
    }
    return 0;
}
