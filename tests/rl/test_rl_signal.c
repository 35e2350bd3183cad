/*
 * test_rl_signal.c - the learning signal: dynamic sampling, the warm-up
 * that runs until the demonstrations are reproduced, and the warning of a
 * run that sees no reward.
 *
 * A controller and two learner shards run for real (the calculator spec,
 * no rollouts); a test actor ("script") plays the rollouts where one is
 * needed, submitting hand-made trajectories with the rewards it chooses.
 * One job per process; the modes (argv[1]):
 *   (none)         the pure rules (rl_group_has_signal, rl_warmup_check),
 *                  then dynamic sampling with B = 16, G = 8, eta = 0: of the
 *                  first two groups one has equal rewards; it is dropped
 *                  ("no_signal"), no step is taken on the 8 informative
 *                  episodes alone, the drop gives its admission back, and the
 *                  step waits for a third, informative group. Ledger:
 *                  admitted 24 = trained 16 + dropped_error 8 (no_signal 8), plus
 *                  what is admitted at version 1, left in flight.
 *   noreward       every episode has reward 0, rl.no_reward_warn_versions 1:
 *                  nothing is trained, the run fails at max_time_s saying no
 *                  episode was rewarded, and the warning is in summary.json
 *                  and metrics.jsonl.
 *   warmup_loss    rl.warmup {until_loss: 1.0}: stops once the demo loss
 *                  is <= 1.0, well before max_steps.
 *   warmup_success rl.warmup {until_success: 0.5}: stops once half the
 *                  demonstrations are reproduced.
 *   warmup_limit   rl.warmup {until_loss: 1e-4, max_steps: 5}: stops at 5
 *                  steps and warns.
 *   warmup_fixed   rl.warmup_steps 7 beside rl.warmup: exactly 7 steps.
 */
#include <manta_actors.h>
#include <manta_job.h>

#include <cjson/cJSON.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* ---- the scripted rollout ---- */

typedef struct admitted {
    int64_t version;
    int n;
    int64_t ids[64];
} admitted;

/* Ask for 8 groups; out gets the version and the episodes given. */
static int admit(manta_ctx *m, manta_actor *ctl, int64_t my_version, admitted *out)
{
    rl_admit_req q = {.rollout = "script", .groups = 8, .version = my_version};
    char *buf;
    size_t len;
    if (rl_admit_req_encode(&q, &buf, &len)) return MANTA_ENOMEM;
    manta_future *f = manta_call(m, ctl, "admit", buf, len);
    free(buf);
    const void *d;
    size_t n;
    int rc = manta_get(f, -1, &d, &n);
    out->n = 0, out->version = -1;
    if (rc == 0) {
        rl_admit_reply r;
        rc = rl_admit_reply_decode(&r, d, n);
        if (rc == 0) {
            out->version = r.version;
            for (int e = 0; e < r.n_eps && out->n < 64; e++) out->ids[out->n++] = r.eps[e].episode;
            rl_admit_reply_destroy(&r);
        }
    }
    manta_future_free(f);
    return rc;
}

/* A hand-made episode of version `version` with `reward`. */
static int submit(manta_ctx *m, manta_actor *ctl, int64_t id, int32_t version, float reward)
{
    rl_traj t;
    rl_traj_init(&t);
    t.episode = id, t.reward = reward;
    rl_traj_push(&t, RL_TOK_BOS, 0, -1, 0, RL_SEG_PROMPT);
    for (const char *c = "12*34=?"; *c; c++) rl_traj_push(&t, *c, 0, -1, 0, RL_SEG_PROMPT);
    rl_traj_push(&t, RL_TOK_CALL, -1.0f, version, 1, RL_SEG_POLICY);
    for (const char *c = "12*34"; *c; c++) rl_traj_push(&t, *c, -1.0f, version, 1, RL_SEG_POLICY);
    rl_traj_push(&t, RL_TOK_END, -1.0f, version, 1, RL_SEG_POLICY);
    for (const char *c = "408\n"; *c; c++) rl_traj_push(&t, *c, 0, -1, 0, RL_SEG_TOOL);
    for (const char *c = "408"; *c; c++) rl_traj_push(&t, *c, -1.0f, version, 1, RL_SEG_POLICY);
    rl_traj_push(&t, RL_TOK_EOS, -1.0f, version, 1, RL_SEG_POLICY);
    char *buf;
    size_t len;
    int rc = rl_traj_encode(&t, &buf, &len);
    rl_traj_destroy(&t);
    if (rc) return rc;
    manta_future *f = manta_call(m, ctl, "submit", buf, len);
    free(buf);
    rc = manta_get(f, -1, NULL, NULL);
    manta_future_free(f);
    return rc;
}

/* Admit until version >= v is published (10 s at most). */
static int wait_version(manta_ctx *m, manta_actor *ctl, int64_t v, int64_t mine, admitted *a)
{
    for (int i = 0; i < 1000; i++) {
        if (admit(m, ctl, mine, a)) return -1;
        if (a->version >= v) return 0;
        usleep(10000);
    }
    return -1;
}

/* Dynamic sampling, scripted. Answers int[6]: episodes admitted at v0;
 * the version after the two first groups (one without signal) were in and
 * 600 ms had passed; the episodes admitted then (the freed admission); the
 * version after the third group, and the episodes admitted with it. */
static int m_drive(manta_req *c, void *st, const void *arg, size_t len)
{
    manta_ctx *m = manta_req_ctx(c);
    manta_actor *ctl;
    int rc = manta_actor_lookup(m, "controller-0", &ctl);
    if (rc) return rc;
    int log[6] = {0};
    admitted a, b;
    if (wait_version(m, ctl, 0, -1, &a)) return MANTA_ETIMEDOUT;
    log[0] = a.n;                 /* 16: two groups, the bound (0 + 0 + 1) * 16 */
    for (int i = 0; i < a.n; i++) /* group 1: all 1 (no signal); group 2: 0/1 */
        submit(m, ctl, a.ids[i], 0, i < 8 ? 1.0f : (float)(i % 2));
    usleep(600000); /* time for a step, were one taken */
    if (admit(m, ctl, 0, &b)) return MANTA_EREMOTE;
    log[1] = (int)b.version; /* still 0: 8 informative episodes are not a batch */
    log[2] = b.n;            /* 8: the group without signal gave its admission back */
    for (int i = 0; i < b.n; i++) submit(m, ctl, b.ids[i], 0, (float)(i % 3 == 0));
    admitted v;
    if (wait_version(m, ctl, 1, 0, &v)) return MANTA_ETIMEDOUT;
    log[3] = (int)v.version; /* 1 */
    log[4] = v.n;            /* admitted at version 1 (left in flight) */
    return manta_reply(c, log, sizeof log);
}

/* Every episode admitted gets reward 0, until the run stops. */
static int m_zero(manta_req *c, void *st, const void *arg, size_t len)
{
    manta_ctx *m = manta_req_ctx(c);
    manta_actor *ctl;
    int rc = manta_actor_lookup(m, "controller-0", &ctl);
    if (rc) return rc;
    admitted a;
    if (wait_version(m, ctl, 0, -1, &a)) return MANTA_ETIMEDOUT;
    int submitted = 0;
    for (int iter = 0; iter < 100000; iter++) {
        for (int i = 0; i < a.n; i++)
            if (submit(m, ctl, a.ids[i], 0, 0.0f) == 0) submitted++;
        if (a.n == 0) usleep(5000);
        if (admit(m, ctl, 0, &a)) break; /* the controller is gone: the run ended */
        if (a.version != 0 || submitted > 4000) break;
    }
    return manta_reply(c, &submitted, sizeof submitted);
}

static const manta_method script_methods[] = {{"drive", m_drive}, {"zero", m_zero}, {NULL, NULL}};
static const manta_class script_class = {"script", 0, NULL, NULL, script_methods};
static const manta_class *const classes[] = {&rl_controller_class, &rl_learner_class, &script_class,
                                             NULL};
static manta_ctx *ctx;

/* ---- helpers ---- */

#define DATA_SETS                                                                                  \
    "task.train=" SOURCE_DIR "/examples/calc/train.jsonl",                                         \
        "task.heldout=" SOURCE_DIR "/examples/calc/heldout.jsonl",                                 \
        "task.demos=" SOURCE_DIR "/examples/calc/demos.jsonl", "rollout.replicas=0",               \
        "env.replicas=0", "groups.reward.replicas=0"

static manta_job_t *start_job(const char *const *sets, size_t n, manta_spec **spec)
{
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets, .n_sets = n};
    *spec = manta_spec_load_file(SOURCE_DIR "/examples/calc_agent.yaml", &so, &errs);
    assert_non_null(*spec);
    manta_spec_errors_destroy(&errs);
    manta_job_t *job;
    if (manta_job_start(ctx, *spec, &(manta_job_options){.no_services = 1}, &job) != 0)
        fail_msg("start: %s", manta_last_error());
    return job;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 20);
    size_t got = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (buf) buf[got] = 0;
    return buf;
}

static cJSON *read_json(const char *path)
{
    char *txt = read_file(path);
    assert_non_null(txt);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    return j;
}

static double num(const cJSON *j, const char *a, const char *b)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b) o = cJSON_GetObjectItemCaseSensitive(o, b);
    if (!cJSON_IsNumber(o)) fail_msg("%s%s%s: not a number", a, b ? "." : "", b ? b : "");
    return o->valuedouble;
}

/* ---- the pure rules ---- */

static void test_rules(void **st)
{
    (void)st;
    const float same[4] = {1, 1, 1, 1}, zero[3] = {0, 0, 0}, mixed[4] = {0, 0, 1, 0};
    const float close[2] = {0.5f, 0.5f + 1e-8f}, apart[2] = {0.25f, 0.75f};
    assert_false(rl_group_has_signal(same, 4));
    assert_false(rl_group_has_signal(zero, 3));
    assert_true(rl_group_has_signal(mixed, 4));
    assert_false(rl_group_has_signal(close, 2));
    assert_true(rl_group_has_signal(apart, 2));
    assert_false(rl_group_has_signal(mixed + 2, 1)); /* one member: nothing to compare */
    assert_false(rl_group_has_signal(mixed, 0));

    rl_warmup fixed = {.fixed = 3, .max_steps = 100, .until_loss = 0.5, .until_success = -1};
    assert_int_equal(rl_warmup_check(&fixed, 2, 0.1, 1), RL_WARMUP_GO); /* thresholds unused */
    assert_int_equal(rl_warmup_check(&fixed, 3, 9.0, 0), RL_WARMUP_MET);
    rl_warmup steps = {.fixed = -1, .max_steps = 4, .until_loss = -1, .until_success = -1};
    assert_int_equal(rl_warmup_check(&steps, 3, 0, 1), RL_WARMUP_GO);
    assert_int_equal(rl_warmup_check(&steps, 4, 9, 0), RL_WARMUP_MET);
    rl_warmup loss = {.fixed = -1, .max_steps = 10, .until_loss = 0.5, .until_success = -1};
    assert_int_equal(rl_warmup_check(&loss, 1, 0.6, 1), RL_WARMUP_GO);
    assert_int_equal(rl_warmup_check(&loss, 2, 0.5, 0), RL_WARMUP_MET);
    assert_int_equal(rl_warmup_check(&loss, 10, 0.6, 0), RL_WARMUP_LIMIT);
    rl_warmup both = {.fixed = -1, .max_steps = 10, .until_loss = 0.5, .until_success = 0.8};
    assert_int_equal(rl_warmup_check(&both, 1, 0.4, 0.7), RL_WARMUP_GO);
    assert_int_equal(rl_warmup_check(&both, 1, 0.6, 0.9), RL_WARMUP_GO);
    assert_int_equal(rl_warmup_check(&both, 1, 0.4, 0.8), RL_WARMUP_MET);
}

/* ---- dynamic sampling ---- */

static void test_no_signal_groups(void **st)
{
    (void)st;
    const char *sets[] = {"rl.eta=0",
                          "rl.batch_episodes=16",
                          "rl.group_size=8",
                          "rl.max_versions=1",
                          "rl.eval_problems=0",
                          "rl.warmup_steps=0",
                          "rl.max_time_s=120",
                          "rl.run_dir=/tmp/manta-rl-signal-test",
                          DATA_SETS};
    manta_spec *spec;
    manta_job_t *job = start_job(sets, sizeof sets / sizeof *sets, &spec);
    manta_actor *script;
    assert_int_equal(
        manta_actor_create(ctx, &(manta_actor_options){.cls = "script", .name = "script"}, &script),
        0);
    manta_future *run;
    assert_int_equal(manta_job_run_method(job, &run), 0);
    manta_future *drive = manta_call_timeout(ctx, script, "drive", "", 0, 60000);
    const void *d;
    size_t n;
    if (manta_get(drive, -1, &d, &n)) fail_msg("drive: %s", manta_future_error(drive));
    int log[6];
    assert_int_equal(n, sizeof log);
    memcpy(log, d, sizeof log);
    printf("admitted %d; then version %d, admitted %d; then version %d\n", log[0], log[1], log[2],
           log[3]);
    assert_int_equal(log[0], 16);
    assert_int_equal(log[1], 0); /* no step on a batch that lacks B informative episodes */
    assert_int_equal(log[2], 8); /* the dropped group's admission given back */
    assert_int_equal(log[3], 1);
    if (manta_get(run, -1, &d, &n)) fail_msg("run: %s", manta_future_error(run));
    char *txt = strndup(d, n);
    printf("%s\n", txt);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    assert_int_equal((int)num(j, "versions", NULL), 1);
    assert_int_equal((int)num(l, "admitted", NULL), 24 + log[4]);
    assert_int_equal((int)num(l, "trained", NULL), 16); /* the informative groups only */
    assert_int_equal((int)num(l, "dropped_error", NULL), 8);
    assert_int_equal((int)num(l, "error_reasons", "no_signal"), 8);
    assert_int_equal((int)num(l, "in_flight", NULL), log[4]);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "balanced")));
    assert_int_equal((int)num(j, "rates", "no_signal_groups"), 1);
    cJSON_Delete(j);
    /* the metrics line of version 1 counts the group dropped before it */
    char *m = read_file("/tmp/manta-rl-signal-test/metrics.jsonl");
    assert_non_null(m);
    int seen = 0;
    for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *x = cJSON_Parse(line);
        assert_non_null(x);
        if (cJSON_GetObjectItemCaseSensitive(x, "episodes")) {
            assert_int_equal((int)num(x, "episodes", NULL), 16);
            assert_int_equal((int)num(x, "no_signal_groups", NULL), 1);
            assert_int_equal((int)num(x, "dropped_no_signal", NULL), 8);
            seen++;
        }
        cJSON_Delete(x);
    }
    free(m);
    assert_int_equal(seen, 1);
    manta_future_free(run);
    manta_future_free(drive);
    manta_job_free(job);
    manta_spec_free(spec);
}

/* ---- no reward ---- */

static void test_no_reward_warns(void **st)
{
    (void)st;
    const char *sets[] = {"rl.eta=0",
                          "rl.batch_episodes=16",
                          "rl.group_size=8",
                          "rl.max_versions=10",
                          "rl.eval_problems=0",
                          "rl.warmup_steps=0",
                          "rl.max_time_s=4",
                          "rl.no_reward_warn_versions=2",
                          "rl.run_dir=/tmp/manta-rl-signal-test-noreward",
                          DATA_SETS};
    manta_spec *spec;
    manta_job_t *job = start_job(sets, sizeof sets / sizeof *sets, &spec);
    manta_actor *script;
    assert_int_equal(
        manta_actor_create(ctx, &(manta_actor_options){.cls = "script", .name = "script"}, &script),
        0);
    manta_future *run;
    assert_int_equal(manta_job_run_method(job, &run), 0);
    manta_future *zero = manta_call_timeout(ctx, script, "zero", "", 0, 60000);
    const void *d;
    size_t n;
    assert_int_not_equal(manta_get(run, -1, &d, &n), 0); /* the run fails ... */
    const char *err = manta_future_error(run);
    printf("run: %s\n", err);
    assert_non_null(strstr(err, "no policy version trained in rl.max_time_s"));
    assert_non_null(strstr(err, "no episode was rewarded"));
    int submitted = 0;
    if (manta_get(zero, -1, &d, &n) == 0 && n == sizeof submitted) memcpy(&submitted, d, n);
    printf("episodes submitted: %d\n", submitted);
    assert_true(submitted >= 32); /* 2 batches' worth: the warning's threshold */
    cJSON *j = read_json("/tmp/manta-rl-signal-test-noreward/summary.json");
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    assert_int_equal((int)num(l, "trained", NULL), 0); /* ... having trained on nothing */
    assert_int_equal((int)num(j, "versions", NULL), 0);
    assert_true(num(l, "error_reasons", "no_signal") >= 32);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "balanced")));
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "warnings");
    assert_int_equal(cJSON_GetArraySize(w), 1);
    const char *msg = cJSON_GetArrayItem(w, 0)->valuestring;
    printf("warning: %s\n", msg);
    assert_non_null(strstr(msg, "no reward in 32 training episodes in a row"));
    assert_non_null(strstr(msg, "rl.no_reward_warn_versions 2"));
    cJSON_Delete(j);
    char *m = read_file("/tmp/manta-rl-signal-test-noreward/metrics.jsonl");
    assert_non_null(m);
    assert_non_null(strstr(m, "{\"warning\":\"no reward in 32 training episodes"));
    free(m);
    manta_future_free(run);
    manta_future_free(zero);
    manta_job_free(job);
    manta_spec_free(spec);
}

/* ---- the warm-up ---- */

/* Run the warm-up only (no RL version, no evaluation) with `set`; returns
 * summary.json's warmup object and its warnings (the caller frees j). */
static cJSON *warmup_run(const char *set, const char *set2, cJSON **j)
{
    const char *sets[] = {"rl.max_versions=0",
                          "rl.eval_problems=0",
                          "rl.max_time_s=120",
                          "rl.run_dir=/tmp/manta-rl-signal-test-warmup",
                          DATA_SETS,
                          set,
                          set2};
    size_t n = sizeof sets / sizeof *sets - (set2 ? 0 : 1);
    manta_spec *spec;
    manta_job_t *job = start_job(sets, n, &spec);
    manta_future *run;
    assert_int_equal(manta_job_run_method(job, &run), 0);
    const void *d;
    size_t len;
    if (manta_get(run, -1, &d, &len)) fail_msg("run: %s", manta_future_error(run));
    char *txt = strndup(d, len);
    *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(*j);
    cJSON *w = cJSON_GetObjectItemCaseSensitive(*j, "warmup");
    char *p = cJSON_PrintUnformatted(w);
    printf("warmup: %s\n", p);
    free(p);
    manta_future_free(run);
    manta_job_free(job);
    manta_spec_free(spec);
    return w;
}

static const char *stopped(const cJSON *w)
{
    return cJSON_GetObjectItemCaseSensitive(w, "stopped")->valuestring;
}

static void test_warmup_loss(void **st)
{
    (void)st;
    cJSON *j, *w = warmup_run("rl.warmup={until_loss: 1.0, max_steps: 400}", NULL, &j);
    assert_string_equal(stopped(w), "met");
    assert_true(num(w, "demo_loss", NULL) <= 1.0);
    /* the loss starts near ln 260 = 5.6: many steps, far fewer than 400 */
    assert_true(num(w, "steps", NULL) > 10 && num(w, "steps", NULL) < 400);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "warnings")), 0);
    cJSON_Delete(j);
}

static void test_warmup_success(void **st)
{
    (void)st;
    cJSON *j, *w = warmup_run("rl.warmup={until_success: 0.5, max_steps: 400}", NULL, &j);
    assert_string_equal(stopped(w), "met");
    assert_true(num(w, "demo_reproduced", NULL) >= 0.5);
    assert_true(num(w, "steps", NULL) > 10 && num(w, "steps", NULL) < 400);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "warnings")), 0);
    cJSON_Delete(j);
}

static void test_warmup_limit(void **st)
{
    (void)st;
    cJSON *j, *w = warmup_run("rl.warmup={until_loss: 0.0001, max_steps: 5}", NULL, &j);
    assert_string_equal(stopped(w), "max_steps");
    assert_int_equal((int)num(w, "steps", NULL), 5);
    assert_true(num(w, "demo_loss", NULL) > 0.0001);
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "warnings");
    assert_int_equal(cJSON_GetArraySize(ws), 1);
    assert_non_null(strstr(cJSON_GetArrayItem(ws, 0)->valuestring,
                           "the warm-up stopped at rl.warmup.max_steps (5)"));
    cJSON_Delete(j);
}

static void test_warmup_fixed(void **st)
{
    (void)st;
    cJSON *j,
        *w = warmup_run("rl.warmup={until_loss: 0.0001, max_steps: 50}", "rl.warmup_steps=7", &j);
    assert_string_equal(stopped(w), "met");
    assert_int_equal((int)num(w, "steps", NULL), 7);
    assert_int_equal((int)num(w, "fixed_steps", NULL), 7);
    cJSON_Delete(j);
}

int main(int argc, char **argv)
{
    if (manta_init(&ctx, &(manta_options){.classes = classes,
                                          .call_timeout_ms = 60000,
                                          .log_dir = getenv("RL_LOG_DIR")}) != 0)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    static const struct {
        const char *mode;
        struct CMUnitTest t;
    } modes[] = {
        {"", cmocka_unit_test(test_no_signal_groups)},
        {"noreward", cmocka_unit_test(test_no_reward_warns)},
        {"warmup_loss", cmocka_unit_test(test_warmup_loss)},
        {"warmup_success", cmocka_unit_test(test_warmup_success)},
        {"warmup_limit", cmocka_unit_test(test_warmup_limit)},
        {"warmup_fixed", cmocka_unit_test(test_warmup_fixed)},
    };
    const char *mode = argc > 1 ? argv[1] : "";
    int failed = -1;
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        if (strcmp(mode, modes[i].mode)) continue;
        const struct CMUnitTest with_rules[] = {cmocka_unit_test(test_rules), modes[i].t};
        const struct CMUnitTest alone[] = {modes[i].t};
        failed = i == 0 ? cmocka_run_group_tests(with_rules, NULL, NULL)
                        : cmocka_run_group_tests(alone, NULL, NULL);
    }
    if (failed < 0) fprintf(stderr, "test_rl_signal: unknown mode '%s'\n", mode);
    manta_shutdown(ctx);
    return failed != 0;
}
