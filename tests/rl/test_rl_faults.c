/*
 * test_rl_faults.c - runs that cannot finish must say so: a missing reward
 * group fails the run (non-zero, naming the group) after rl.max_missing_s,
 * with summary.json written; the rollouts do not read the directory for each
 * episode meanwhile; a run stopped part-way (the controller stopped while
 * "run" is in flight) leaves summary.json with status "interrupted" and its
 * ledger; a rollout that must fetch the buckets of a learner shard that died
 * tries once per back-off, not at every admit reply.
 *
 * Real actors (controller, learners, rollouts, envs) against a real calc
 * server, launched through the job library like `manta run`.
 */
#include <manta_actors.h>
#include <manta_job.h>
#include <rl_util.h>

#include "calc_server.h"

#include <cjson/cJSON.h>
#include <msgpack.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static manta_ctx *ctx;
static int calc_port;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return cJSON_Parse(buf);
}

static manta_spec *load(const char *run_dir, const char *const *extra, int n_extra)
{
    static char url[128], dir[400];
    snprintf(url, sizeof url, "tools.0.url=http://127.0.0.1:%d/mcp", calc_port);
    snprintf(dir, sizeof dir, "rl.run_dir=%s", run_dir);
    const char *sets[32] = {"task.train=" SOURCE_DIR "/examples/calc/train.jsonl",
                            "task.heldout=" SOURCE_DIR "/examples/calc/heldout.jsonl",
                            "task.demos=" SOURCE_DIR "/examples/calc/demos.jsonl", url, dir,
                            "rl.warmup_steps=0", "rl.eval_problems=0", "rl.max_time_s=120",
                            /* no warm-up, so no reward: versions must still
                             * be trained for the faults to hit them */
                            "rl.dynamic_sampling=false"};
    int n = 9;
    for (int i = 0; i < n_extra; i++) sets[n++] = extra[i];
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets, .n_sets = (size_t)n};
    manta_spec *spec = manta_spec_load_file(SOURCE_DIR "/examples/calc_agent.yaml", &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    return spec;
}

static void check_ledger(const cJSON *j)
{
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    assert_non_null(l);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "balanced")));
}

/* The reward group has no actor: every episode is dropped "no reward
 * actor"; after rl.max_missing_s the run fails naming the group. */
static void test_missing_reward_group(void **st)
{
    (void)st;
    char run_dir[256], path[300];
    snprintf(run_dir, sizeof run_dir, "/tmp/manta-rl-faults-%d-reward", (int)getpid());
    const char *extra[] = {"groups.reward.replicas=0", "rl.max_missing_s=3"};
    manta_spec *spec = load(run_dir, extra, 2);
    assert_non_null(spec);
    manta_job_t *job;
    if (manta_job_start(ctx, spec, &(manta_job_options){.no_services = 1}, &job) != 0)
        fail_msg("start: %s", manta_last_error());
    double t0 = now_s();
    int rc = manta_job_wait(job, 90000, NULL, NULL);
    double took = now_s() - t0;
    const char *err = manta_last_error();
    printf("run: rc %d after %.1f s: %s\n", rc, took, err);
    assert_int_not_equal(rc, 0);
    assert_int_not_equal(rc, MANTA_EPENDING);
    assert_non_null(strstr(err, "no reward actor in group 'reward'"));
    assert_true(took < 60);
    /* the rollouts read the directory a few times a second, not per episode */
    manta_actor *r;
    assert_int_equal(manta_actor_lookup(ctx, "rollout-0", &r), 0);
    manta_future *f = manta_call(ctx, r, "stats", "", 0);
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, 10000, &d, &n), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, d, n, NULL), MSGPACK_UNPACK_SUCCESS);
    int64_t disc = -1, eps = -1;
    for (uint32_t i = 0; i < u.data.via.map.size; i++) {
        const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
        if (kv->key.via.str.size == 11 && !memcmp(kv->key.via.str.ptr, "discoveries", 11))
            disc = (int64_t)kv->val.via.u64;
        if (kv->key.via.str.size == 8 && !memcmp(kv->key.via.str.ptr, "episodes", 8))
            eps = (int64_t)kv->val.via.u64;
    }
    msgpack_unpacked_destroy(&u);
    manta_future_free(f);
    double alive = now_s() - t0 + 5;
    printf("rollout-0: %lld directory reads, %lld episodes in %.1f s\n", (long long)disc,
           (long long)eps, alive);
    assert_true(disc >= 1);
    assert_true(disc <= 5 * alive + 10); /* at most every 200 ms while a group is empty */
    assert_true(eps > 10 * disc);
    /* summary.json: failed, naming the group, with its ledger */
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    cJSON *j = read_json(path);
    assert_non_null(j);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "status");
    assert_true(cJSON_IsString(s));
    printf("status: %s\n", s->valuestring);
    assert_int_equal(strncmp(s->valuestring, "failed: ", 8), 0);
    assert_non_null(strstr(s->valuestring, "group 'reward'"));
    check_ledger(j);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    assert_true(cJSON_GetObjectItemCaseSensitive(l, "dropped_error")->valuedouble > 0);
    cJSON_Delete(j);
    manta_job_free(job);
    manta_spec_free(spec);
    rl_remove_tree(run_dir); /* passed: nothing to read there */
}

static long policy_version(manta_ctx *m)
{
    void *v;
    size_t n;
    long version = -1;
    if (manta_kv_get(m, "policy", &v, &n) == 0) {
        const char *p = strstr(v, "\"version\": ");
        if (p) version = strtol(p + 11, NULL, 10);
        free(v);
    }
    return version;
}

static void stop_at_3(manta_job_t *job, double t, void *arg)
{
    (void)t, (void)arg;
    if (policy_version(manta_job_ctx(job)) >= 3) manta_job_stop(job);
}

/* The controller is stopped while the run is in flight: summary.json says
 * "interrupted" and keeps the ledger. */
static void test_interrupted_summary(void **st)
{
    (void)st;
    char run_dir[256], path[300];
    snprintf(run_dir, sizeof run_dir, "/tmp/manta-rl-faults-%d-stop", (int)getpid());
    const char *extra[] = {"rl.max_versions=1000"};
    manta_spec *spec = load(run_dir, extra, 1);
    assert_non_null(spec);
    manta_job_t *job;
    manta_job_options jo = {.no_services = 1, .tick = stop_at_3};
    if (manta_job_start(ctx, spec, &jo, &job) != 0) fail_msg("start: %s", manta_last_error());
    int rc = manta_job_wait(job, 90000, NULL, NULL);
    assert_int_equal(rc, MANTA_ECLOSED);
    manta_actor *c;
    assert_int_equal(manta_actor_lookup(ctx, "controller-0", &c), 0);
    assert_int_equal(manta_actor_stop(ctx, c, 30000), 0);
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    cJSON *j = read_json(path);
    assert_non_null(j);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "status");
    assert_true(cJSON_IsString(s));
    assert_string_equal(s->valuestring, "interrupted");
    assert_true(cJSON_GetObjectItemCaseSensitive(j, "versions")->valuedouble >= 3);
    check_ledger(j);
    cJSON_Delete(j);
    manta_job_free(job);
    manta_spec_free(spec);
    rl_remove_tree(run_dir); /* passed: nothing to read there */
}

static void kill_learner_at_2(manta_job_t *job, double t, void *arg)
{
    (void)t;
    int *done = arg;
    manta_ctx *m = manta_job_ctx(job);
    if (*done || policy_version(m) < 2) return;
    manta_actor *a;
    assert_int_equal(manta_actor_lookup(m, "learner-1", &a), 0);
    assert_int_equal(manta_actor_kill(m, a, 0), 0);
    *done = 1;
}

/* A learner shard killed for good: every step fails; after
 * rl.max_step_failures in a row the run fails saying so, with summary.json. */
static void test_step_failures(void **st)
{
    (void)st;
    char run_dir[256], path[300];
    snprintf(run_dir, sizeof run_dir, "/tmp/manta-rl-faults-%d-learner", (int)getpid());
    const char *extra[] = {"rl.max_versions=1000", "rl.max_step_failures=3"};
    manta_spec *spec = load(run_dir, extra, 2);
    assert_non_null(spec);
    manta_job_t *job;
    int killed = 0;
    manta_job_options jo = {.no_services = 1, .tick = kill_learner_at_2, .tick_arg = &killed};
    if (manta_job_start(ctx, spec, &jo, &job) != 0) fail_msg("start: %s", manta_last_error());
    int rc = manta_job_wait(job, 200000, NULL, NULL);
    const char *err = manta_last_error();
    printf("run: rc %d: %s\n", rc, err);
    assert_int_equal(killed, 1);
    assert_int_not_equal(rc, 0);
    assert_int_not_equal(rc, MANTA_EPENDING);
    assert_non_null(strstr(err, "learner step failed 3 times in a row"));
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    cJSON *j = read_json(path);
    assert_non_null(j);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "status");
    assert_true(cJSON_IsString(s));
    assert_int_equal(strncmp(s->valuestring, "failed: learner step failed", 27), 0);
    check_ledger(j);
    cJSON_Delete(j);
    manta_job_free(job);
    manta_spec_free(spec);
    rl_remove_tree(run_dir); /* passed: nothing to read there */
}

/* The integer `key` of a rollout's stats map (-1 when absent). */
static int64_t rollout_stat(const void *d, size_t n, const char *key)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int64_t v = -1;
    if (msgpack_unpack_next(&u, d, n, NULL) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP)
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
                !memcmp(kv->key.via.str.ptr, key, strlen(key)))
                v = kv->val.type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? kv->val.via.i64
                                                                    : (int64_t)kv->val.via.u64;
        }
    msgpack_unpacked_destroy(&u);
    return v;
}

#define WATCH_S 25 /* how long the new rollout is watched after the kill */

typedef struct bucket_case {
    int killed;
    double t_kill;
    char rollout[32];
} bucket_case;

/* At version 2: learner-1 killed for good (its buckets lived in its
 * memory) and a rollout added, which has no weights yet and must fetch
 * them, half from the dead shard. WATCH_S later the job is stopped. */
static void kill_learner_add_rollout(manta_job_t *job, double t, void *arg)
{
    (void)t;
    bucket_case *c = arg;
    manta_ctx *m = manta_job_ctx(job);
    if (c->killed) {
        if (now_s() - c->t_kill > WATCH_S) manta_job_stop(job);
        return;
    }
    if (policy_version(m) < 2) return;
    manta_actor *a;
    assert_int_equal(manta_actor_lookup(m, "learner-1", &a), 0);
    assert_int_equal(manta_actor_kill(m, a, 0), 0);
    int n = manta_job_replicas(job, "rollout");
    if (manta_job_scale(job, "rollout", n + 1, 60000) != 0)
        fail_msg("scale: %s", manta_last_error());
    snprintf(c->rollout, sizeof c->rollout, "rollout-%d", n);
    c->killed = 1;
    c->t_kill = now_s();
}

/* A dead shard's buckets: the new rollout's fetch of them fails once per
 * back-off, not at every admit reply (each of which used to wait out the
 * 10 s fetch deadline again, the rollout's loop blocked meanwhile). */
static void test_dead_shard_buckets(void **st)
{
    (void)st;
    char run_dir[256];
    snprintf(run_dir, sizeof run_dir, "/tmp/manta-rl-faults-%d-bucket", (int)getpid());
    /* the run must outlive the watch: steps fail from the kill on */
    const char *extra[] = {"rl.max_versions=1000", "rl.max_step_failures=1000000"};
    manta_spec *spec = load(run_dir, extra, 2);
    assert_non_null(spec);
    manta_job_t *job;
    bucket_case c = {0};
    manta_job_options jo = {.no_services = 1, .tick = kill_learner_add_rollout, .tick_arg = &c};
    if (manta_job_start(ctx, spec, &jo, &job) != 0) fail_msg("start: %s", manta_last_error());
    int rc = manta_job_wait(job, 200000, NULL, NULL);
    printf("run: rc %d: %s\n", rc, manta_last_error());
    assert_int_equal(c.killed, 1);
    manta_actor *r;
    assert_int_equal(manta_actor_lookup(ctx, c.rollout, &r), 0);
    manta_future *f = manta_call(ctx, r, "stats", "", 0);
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, 20000, &d, &n), 0);
    int64_t errors = rollout_stat(d, n, "weight_errors"),
            skips = rollout_stat(d, n, "weight_skips");
    int64_t version = rollout_stat(d, n, "version");
    manta_future_free(f);
    printf("%s over %d s after the kill: version %lld, %lld failed fetches, %lld skipped\n",
           c.rollout, WATCH_S, (long long)version, (long long)errors, (long long)skips);
    assert_true(errors >= 1); /* it did try, and failed */
    assert_true(errors <= 4); /* 10 s, then 5 s off, 10 s, then 10 s off ... */
    assert_true(skips >= 20); /* admit replies answered meanwhile, without a fetch */
    manta_job_free(job);
    manta_spec_free(spec);
    rl_remove_tree(run_dir); /* passed: nothing to read there */
}

/* One job per process (a job's actors live as long as the driver's ctx):
 * argv[1] "reward" (default), "stop", "learner" or "bucket" picks the test. */
int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "reward";
    if (manta_init(&ctx, &(manta_options){.classes = manta_builtin_classes,
                                          .call_timeout_ms = 60000,
                                          .log_dir = getenv("RL_LOG_DIR")}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    int pid = rl_start_calc_server(SOURCE_DIR "/examples/calc_server.py", "", &calc_port);
    if (pid < 0) {
        fprintf(stderr, "cannot start the calc server\n");
        manta_shutdown(ctx);
        return 1;
    }
    const struct CMUnitTest reward[] = {cmocka_unit_test(test_missing_reward_group)};
    const struct CMUnitTest stopped[] = {cmocka_unit_test(test_interrupted_summary)};
    const struct CMUnitTest learner[] = {cmocka_unit_test(test_step_failures)};
    const struct CMUnitTest bucket[] = {cmocka_unit_test(test_dead_shard_buckets)};
    int failed = !strcmp(mode, "stop")      ? cmocka_run_group_tests(stopped, NULL, NULL)
                 : !strcmp(mode, "learner") ? cmocka_run_group_tests(learner, NULL, NULL)
                 : !strcmp(mode, "bucket")  ? cmocka_run_group_tests(bucket, NULL, NULL)
                                            : cmocka_run_group_tests(reward, NULL, NULL);
    manta_shutdown(ctx);
    rl_stop_process(pid);
    return failed;
}
