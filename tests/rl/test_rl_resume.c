/*
 * test_rl_resume.c - checkpoints, resume, and the learner's failures that
 * must never corrupt the model. One job per process; argv[1] picks it:
 *
 *   resume   `manta run` (the real binary, as a user runs it) of the
 *            calculator job undisturbed, then the same job killed with
 *            SIGKILL (argv[2] "int": SIGINT) once a checkpoint past version
 *            CKPT_AT exists, then `manta run --resume RUN_DIR`: the resumed
 *            run ends "done", from that checkpoint, with an exact ledger and
 *            a final held-out success within 5 points of the undisturbed
 *            run's. With SIGINT the stopped run's summary.json says
 *            "interrupted" and keeps its ledger.
 *   restart  learner-1 killed at version 4 and restarted by its node agent
 *            (max_restarts): every shard is restored from the last
 *            checkpoint, the run goes on to version 12 and ends "done"
 *            with held-out success no worse than after the warm-up (a
 *            shard that rejoins with the seed's parameters collapses it to
 *            about 0).
 *   nockpt   the same with rl.checkpoint_every 0: the run fails at once,
 *            saying the shard's state cannot be restored.
 *   errors   a scripted rollout submits only failed episodes: the run fails
 *            on rl.max_error_drop_rate, naming the error, instead of
 *            spinning until max_time_s.
 *
 * Real actors against a real calc server (the resume test through the
 * manta executable, the others through the job library).
 */
#include <manta_actors.h>
#include <manta_job.h>
#include <rl_util.h>

#include "calc_server.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define CKPT_AT 6 /* the resume test kills its job after a checkpoint this late */

static manta_ctx *ctx;
static int calc_port;
static int kill_signal = SIGKILL;

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
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return cJSON_Parse(buf);
}

static double num(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v)) fail_msg("no number '%s'", key);
    return v->valuedouble;
}

static const char *status_of(const cJSON *j)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "status");
    return cJSON_IsString(s) ? s->valuestring : "";
}

/* The ledger adds up, by its numbers and by its own verdict. */
static void check_ledger(const cJSON *j)
{
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    assert_non_null(l);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "balanced")));
    assert_true(num(l, "admitted") == num(l, "trained") + num(l, "dropped_stale") +
                                          num(l, "dropped_error") + num(l, "in_flight"));
}

/* ---- through the job library ---- */

static manta_spec *load(const char *run_dir, const char *const *extra, int n_extra)
{
    static char url[128], dir[400];
    snprintf(url, sizeof url, "tools.0.url=http://127.0.0.1:%d/mcp", calc_port);
    snprintf(dir, sizeof dir, "rl.run_dir=%s", run_dir);
    const char *sets[32] = {"task.train=" SOURCE_DIR "/examples/calc/train.jsonl",
                            "task.heldout=" SOURCE_DIR "/examples/calc/heldout.jsonl",
                            "task.demos=" SOURCE_DIR "/examples/calc/demos.jsonl", url, dir};
    int n = 5;
    for (int i = 0; i < n_extra; i++) sets[n++] = extra[i];
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets, .n_sets = (size_t)n};
    manta_spec *spec = manta_spec_load_file(SOURCE_DIR "/examples/calc_agent.yaml", &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    return spec;
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

static void kill_learner_at_4(manta_job_t *job, double t, void *arg)
{
    (void)t;
    int *done = arg;
    manta_ctx *m = manta_job_ctx(job);
    if (*done || policy_version(m) < 4) return;
    manta_actor *a;
    assert_int_equal(manta_actor_lookup(m, "learner-1", &a), 0);
    assert_int_equal(manta_actor_kill(m, a, 1), 0); /* restarted by its node agent */
    *done = 1;
}

/* learner-1 crashes at version 4 and comes back; with checkpoints every
 * shard is restored and the run ends well, without it fails naming why. */
static void run_learner_restart(int checkpoints)
{
    char run_dir[256], path[300];
    snprintf(run_dir, sizeof run_dir, "/tmp/manta-rl-resume-%d-restart", (int)getpid());
    const char *extra[] = {"groups.learner.max_restarts=2",
                           checkpoints ? "rl.checkpoint_every=2" : "rl.checkpoint_every=0",
                           "rl.max_versions=12",
                           "rl.stop_at=2",
                           "rl.eval_problems=100",
                           "rl.max_time_s=500", /* ASan on a loaded machine: minutes */
                           "rl.collective_timeout_s=15"};
    manta_spec *spec = load(run_dir, extra, 7);
    assert_non_null(spec);
    manta_job_t *job;
    int killed = 0;
    manta_job_options jo = {.no_services = 1, .tick = kill_learner_at_4, .tick_arg = &killed};
    if (manta_job_start(ctx, spec, &jo, &job) != 0) fail_msg("start: %s", manta_last_error());
    double t0 = now_s();
    int rc = manta_job_wait(job, 560000, NULL, NULL);
    printf("run: rc %d after %.1f s: %s\n", rc, now_s() - t0, rc ? manta_last_error() : "ok");
    assert_int_equal(killed, 1);
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    cJSON *j = read_json(path);
    assert_non_null(j);
    printf("status: %s; held-out success %.3f after the warm-up, %.3f at the end\n", status_of(j),
           num(j, "heldout_success_initial"), num(j, "heldout_success_final"));
    check_ledger(j);
    if (checkpoints) {
        assert_int_equal(rc, 0);
        assert_string_equal(status_of(j), "done");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "checkpoints");
        assert_int_equal((int)num(c, "learner_restores"), 1);
        /* the model was never corrupted: no collapse after the restart */
        assert_true(num(j, "heldout_success_final") >= num(j, "heldout_success_initial") - 0.1);
        const cJSON *w; /* one says so (another may say that a checkpoint it broke failed) */
        int said = 0;
        cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(j, "warnings")) said +=
            cJSON_IsString(w) && strstr(w->valuestring, "learner shard 1 restarted") != NULL;
        assert_int_equal(said, 1);
    } else {
        assert_int_not_equal(rc, 0);
        assert_int_not_equal(rc, MANTA_EPENDING);
        assert_non_null(strstr(manta_last_error(), "learner shard 1 restarted"));
        assert_non_null(strstr(status_of(j), "no checkpoint to restore the group from"));
    }
    cJSON_Delete(j);
    manta_job_free(job);
    manta_spec_free(spec);
    rl_remove_tree(run_dir); /* passed: nothing to read there */
}

static void test_learner_restart(void **st)
{
    (void)st;
    run_learner_restart(1);
}

static void test_learner_restart_no_checkpoint(void **st)
{
    (void)st;
    run_learner_restart(0);
}

/* ---- a scripted rollout whose every episode fails ---- */

typedef struct script {
    int64_t version;
    int64_t submitted;
} script;

static void submit_failed(manta_ctx *m, manta_actor *ctl, int64_t id)
{
    rl_traj t;
    rl_traj_init(&t);
    t.episode = id, t.status = RL_EP_ERROR;
    snprintf(t.error, sizeof t.error, "calc: connection refused (after 6 attempts)");
    rl_traj_push(&t, RL_TOK_BOS, 0, -1, 0, RL_SEG_PROMPT);
    rl_traj_push(&t, RL_TOK_CALL, -1.0f, 0, 1, RL_SEG_POLICY);
    char *buf;
    size_t len;
    assert_int_equal(rl_traj_encode(&t, &buf, &len), 0);
    rl_traj_destroy(&t);
    manta_future *f = manta_call(m, ctl, "submit", buf, len);
    free(buf);
    manta_get(f, 10000, NULL, NULL);
    manta_future_free(f);
}

/* Every 100 ms of the wait: take what the controller admits, fail it all. */
static void fail_everything(manta_job_t *job, double t, void *arg)
{
    (void)t;
    script *sc = arg;
    manta_ctx *m = manta_job_ctx(job);
    manta_actor *ctl;
    if (manta_actor_lookup(m, "controller-0", &ctl)) return;
    rl_admit_req q = {.rollout = "script", .groups = 8, .version = sc->version};
    char *buf;
    size_t len;
    assert_int_equal(rl_admit_req_encode(&q, &buf, &len), 0);
    manta_future *f = manta_call(m, ctl, "admit", buf, len);
    free(buf);
    const void *d;
    size_t n;
    if (manta_get(f, 10000, &d, &n) == 0) {
        rl_admit_reply r;
        if (rl_admit_reply_decode(&r, d, n) == 0) {
            sc->version = r.version;
            for (int e = 0; e < r.n_eps; e++, sc->submitted++)
                submit_failed(m, ctl, r.eps[e].episode);
            rl_admit_reply_destroy(&r);
        }
    }
    manta_future_free(f);
}

static void test_error_drop_rate(void **st)
{
    (void)st;
    char run_dir[256], path[300];
    snprintf(run_dir, sizeof run_dir, "/tmp/manta-rl-resume-%d-errors", (int)getpid());
    const char *extra[] = {"rollout.replicas=0",       "env.replicas=0",
                           "groups.reward.replicas=0", "rl.warmup_steps=0",
                           "rl.eval_problems=0",       "rl.batch_episodes=16",
                           "rl.max_time_s=60",         "rl.max_error_drop_rate=0.5"};
    manta_spec *spec = load(run_dir, extra, 8);
    assert_non_null(spec);
    manta_job_t *job;
    script sc = {.version = -1};
    manta_job_options jo = {.no_services = 1, .tick = fail_everything, .tick_arg = &sc};
    if (manta_job_start(ctx, spec, &jo, &job) != 0) fail_msg("start: %s", manta_last_error());
    double t0 = now_s();
    int rc = manta_job_wait(job, 90000, NULL, NULL);
    double took = now_s() - t0;
    const char *err = manta_last_error();
    printf("run: rc %d after %.1f s, %lld episodes failed: %s\n", rc, took, (long long)sc.submitted,
           err);
    assert_int_not_equal(rc, 0);
    assert_int_not_equal(rc, MANTA_EPENDING);
    assert_non_null(strstr(err, "rl.max_error_drop_rate 0.5"));
    assert_non_null(strstr(err, "connection refused"));
    assert_true(took < 40); /* long before max_time_s */
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    cJSON *j = read_json(path);
    assert_non_null(j);
    assert_int_equal(strncmp(status_of(j), "failed: ", 8), 0);
    assert_non_null(strstr(status_of(j), "dropped for errors"));
    check_ledger(j);
    cJSON_Delete(j);
    manta_job_free(job);
    manta_spec_free(spec);
    rl_remove_tree(run_dir); /* passed: nothing to read there */
}

/* ---- through the manta executable ---- */

/* The calculator job as a user's spec file: the calc server the test
 * started, no services. */
static void write_spec(const char *path, const char *job)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "job: %s\n"
            "groups:\n"
            "  controller: {class: controller, resources: {cpu: 0.1}}\n"
            "  learner: {class: learner, replicas: 2, resources: {cpu: 0.1}}\n"
            "  reward: {class: reward, resources: {cpu: 0.1}}\n"
            "  env: {class: env, replicas: 2, resources: {cpu: 0.1}}\n"
            "  rollout: {class: rollout, replicas: 2, resources: {cpu: 0.1}, settings: {slots: "
            "64}}\n"
            "model: {n_layer: 2, n_head: 4, n_embd: 48, block_size: 40, seed: 1}\n"
            "task:\n"
            "  train: %s/examples/calc/train.jsonl\n"
            "  heldout: %s/examples/calc/heldout.jsonl\n"
            "  demos: %s/examples/calc/demos.jsonl\n"
            "tools:\n"
            "  - {name: calc, url: \"http://127.0.0.1:%d/mcp\", tool: calc, arg: expression}\n"
            "reward: {rule: exact}\n"
            "rl:\n"
            "  group_size: 8\n"
            "  batch_episodes: 64\n"
            "  eta: 4\n"
            "  lr: 1.0e-3\n"
            "  warmup: {until_success: 0.1, max_steps: 1000}\n"
            "  warmup_lr: 3.0e-3\n"
            "  top_p: 0.9\n"
            "  max_new_tokens: 24\n"
            "  max_turns: 2\n"
            "  max_versions: 40\n"
            "  max_time_s: 500\n"
            "  eval_every: 0\n"
            "  eval_problems: 200\n"
            "  checkpoint_every: 3\n"
            "run: {group: controller, method: run, timeout_s: 560}\n",
            job, SOURCE_DIR, SOURCE_DIR, SOURCE_DIR, calc_port);
    fclose(f);
}

/* `manta run SPEC --log-dir LOGS --set rl.run_dir=RUN [more...]`, its
 * output in LOGS/driver.out; returns its pid. */
static pid_t manta_run(const char *spec, const char *logs, const char *run_dir, const char *more,
                       const char *more2)
{
    char set[600], out[600];
    snprintf(set, sizeof set, "rl.run_dir=%s", run_dir);
    snprintf(out, sizeof out, "%s/driver-%d.out", logs, (int)time(NULL));
    mkdir(logs, 0755);
    fflush(stdout); /* the child must not print what the parent has buffered */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *o = freopen(out, "w", stdout);
        if (o) dup2(fileno(o), 2);
        execl(MANTA_EXE, MANTA_EXE, "run", spec, "--log-dir", logs, "--set", set, more, more2,
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The newest complete checkpoint version in RUN/checkpoints, or -1. */
static long newest_checkpoint(const char *run_dir)
{
    char root[400];
    snprintf(root, sizeof root, "%s/checkpoints", run_dir);
    DIR *d = opendir(root);
    long best = -1;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] == 'v') {
            long v = strtol(e->d_name + 1, NULL, 10);
            if (v > best) best = v;
        }
    if (d) closedir(d);
    return best;
}

static void test_kill_and_resume(void **st)
{
    (void)st;
    char base[256], spec[300], logs_a[300], logs_b[300], run_a[400], run_b[400], path[500], job[64];
    snprintf(base, sizeof base, "/tmp/manta-rl-resume-%d", (int)getpid());
    snprintf(job, sizeof job, "resume-%d", (int)getpid());
    mkdir(base, 0755);
    snprintf(spec, sizeof spec, "%s/spec.yaml", base);
    write_spec(spec, job);
    snprintf(logs_a, sizeof logs_a, "%s/a", base);
    snprintf(logs_b, sizeof logs_b, "%s/b", base);
    snprintf(run_a, sizeof run_a, "%s/%s", logs_a, job);
    snprintf(run_b, sizeof run_b, "%s/%s", logs_b, job);

    /* A: undisturbed */
    double t0 = now_s();
    int code = wait_exit(manta_run(spec, logs_a, run_a, NULL, NULL));
    snprintf(path, sizeof path, "%s/summary.json", run_a);
    cJSON *a = read_json(path);
    assert_non_null(a);
    printf("undisturbed: exit %d in %.1f s, %s, %.0f versions, held-out %.3f -> %.3f\n", code,
           now_s() - t0, status_of(a), num(a, "versions"), num(a, "heldout_success_initial"),
           num(a, "heldout_success_final"));
    assert_int_equal(code, 0);
    assert_string_equal(status_of(a), "done");
    check_ledger(a);

    /* B: killed once a checkpoint past CKPT_AT is complete */
    t0 = now_s();
    pid_t pid = manta_run(spec, logs_b, run_b, NULL, NULL);
    long at = -1;
    while ((at = newest_checkpoint(run_b)) < CKPT_AT && now_s() - t0 < 500) {
        int st2;
        if (waitpid(pid, &st2, WNOHANG) == pid)
            fail_msg("the job ended before version %d", CKPT_AT);
        usleep(20000);
    }
    assert_true(at >= CKPT_AT);
    kill(pid, kill_signal);
    code = wait_exit(pid);
    printf("stopped with signal %d after checkpoint v%ld: exit %d\n", kill_signal, at, code);
    snprintf(path, sizeof path, "%s/summary.json", run_b);
    cJSON *b = read_json(path);
    if (kill_signal == SIGINT) { /* a clean stop still leaves its ledger */
        assert_int_equal(code, 130);
        assert_non_null(b);
        assert_string_equal(status_of(b), "interrupted");
        check_ledger(b);
    } else { /* the driver could write nothing; its node agent may still stop
              * the controller cleanly (PR_SET_PDEATHSIG), whose summary.json
              * then says so */
        assert_int_equal(code, 128 + SIGKILL);
        if (b) {
            printf("after the SIGKILL: summary.json says %s\n", status_of(b));
            assert_string_equal(status_of(b), "interrupted");
            check_ledger(b);
        }
    }
    cJSON_Delete(b);
    long resumable = newest_checkpoint(run_b);
    char ck[500];
    snprintf(ck, sizeof ck, "%s/checkpoints/v%08ld/controller.json", run_b, resumable);
    cJSON *c = read_json(ck);
    assert_non_null(c);
    double trained_at = num(cJSON_GetObjectItemCaseSensitive(c, "ledger"), "trained");
    cJSON_Delete(c);

    /* C: resumed from B's run folder */
    t0 = now_s();
    code = wait_exit(manta_run(spec, logs_b, run_b, "--resume", run_b));
    snprintf(path, sizeof path, "%s/summary.json", run_b);
    cJSON *r = read_json(path);
    assert_non_null(r);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(r, "resumed");
    printf("resumed: exit %d in %.1f s, %s, from version %.0f to %.0f, %.0f episodes lost, "
           "held-out %.3f (undisturbed %.3f)\n",
           code, now_s() - t0, status_of(r), res ? num(res, "version") : -1, num(r, "versions"),
           res ? num(res, "episodes_lost") : -1, num(r, "heldout_success_final"),
           num(a, "heldout_success_final"));
    assert_int_equal(code, 0);
    assert_string_equal(status_of(r), "done");
    assert_non_null(res);
    assert_int_equal((long)num(res, "version"), resumable);
    assert_true(num(r, "versions") > num(res, "version"));
    check_ledger(r);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(r, "ledger");
    assert_true(num(l, "trained") > trained_at); /* from the checkpoint's count on */
    assert_true(num(l, "dropped_error") >= num(res, "episodes_lost"));
    /* the warm-up and the baseline were not run again: the checkpoint's are kept */
    assert_true(num(r, "heldout_success_initial") >= 0);
    assert_true(num(cJSON_GetObjectItemCaseSensitive(r, "warmup"), "steps") > 0);
    assert_true(fabs(num(r, "heldout_success_final") - num(a, "heldout_success_final")) <= 0.05);
    cJSON_Delete(r);
    cJSON_Delete(a);
    rl_remove_tree(base); /* passed: nothing to read there */
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "resume";
    if (argc > 2 && !strcmp(argv[2], "int")) kill_signal = SIGINT;
    /* this program is also its actors (started again by its node agent, with
     * MANTA_ROLE set): manta_init comes first and never returns in them */
    int own_job = strcmp(mode, "resume") != 0 || getenv("MANTA_ROLE");
    if (own_job && manta_init(&ctx, &(manta_options){.classes = manta_builtin_classes,
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
    const struct CMUnitTest resume[] = {cmocka_unit_test(test_kill_and_resume)};
    const struct CMUnitTest restart[] = {cmocka_unit_test(test_learner_restart)};
    const struct CMUnitTest nockpt[] = {cmocka_unit_test(test_learner_restart_no_checkpoint)};
    const struct CMUnitTest errors[] = {cmocka_unit_test(test_error_drop_rate)};
    int failed = !own_job                   ? cmocka_run_group_tests(resume, NULL, NULL)
                 : !strcmp(mode, "restart") ? cmocka_run_group_tests(restart, NULL, NULL)
                 : !strcmp(mode, "nockpt")  ? cmocka_run_group_tests(nockpt, NULL, NULL)
                                            : cmocka_run_group_tests(errors, NULL, NULL);
    manta_shutdown(ctx);
    rl_stop_process(pid);
    return failed;
}
