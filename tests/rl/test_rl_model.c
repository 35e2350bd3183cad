/*
 * test_rl_model.c - the RL system on a policy loaded from a Hugging Face
 * folder (`model: {path: DIR}`), through examples/calc_qwen3.yaml with
 * model.path pointed at the folder made here.
 *
 *   test_rl_model        a GPT-2 folder written by mk_save_dir in BF16 (no
 *                        Python needed); a short run (warm-up, RL versions,
 *                        2 learner shards, 2 rollouts) from it. The rollouts
 *                        decoded with the folder's model (their parameter
 *                        count is the folder's), the summary names the
 *                        folder and family, and the final checkpoint is a
 *                        folder of the same family and dtype that
 *                        mk_load_dir reads back, whose weights are the
 *                        folder's moved by at most the optimiser's steps (so
 *                        training started from them, not from a fresh
 *                        initialisation).
 *   test_rl_model refuse a folder whose vocabulary is smaller than the
 *                        task's fails the job at its start, naming
 *                        model.path and the file.
 *   test_rl_model qwen3  the same run from the folder that
 *                        examples/make_tiny_qwen3.py writes with
 *                        $MANTA_PYTHON (transformers); skipped (77) when
 *                        MANTA_PYTHON is not set.
 */
#include "calc_server.h"

#include <manta_actors.h>
#include <manta_job.h>
#include <manta_kernels.h>

#include <cjson/cJSON.h>
#include <math.h>
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
#include <unistd.h>

#include <cmocka.h>

static manta_ctx *ctx;
static int calc_port;
static char tmp_root[256]; /* every folder this test makes, removed at the end */

/* The steps of the short run and their learning rates: a bound on how far
 * AdamW (no weight decay) can move one weight, about lr per step. */
#define WARMUP_STEPS 4
#define WARMUP_LR    3e-3
#define RL_VERSIONS  3
#define RL_LR        1e-3

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static const cJSON *get(const cJSON *j, const char *path)
{
    char key[64];
    const cJSON *o = j;
    while (o && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = cJSON_GetObjectItemCaseSensitive(o, key);
        path += n + (dot != NULL);
    }
    if (!o) fail_msg("summary has no %s", path);
    return o;
}

/* A GPT-2 of the calculator example's size (vocabulary 260, block 64),
 * initialised from seed 11, written as a BF16 folder. */
static void make_gpt2_folder(const char *dir, int vocab)
{
    mk_config c = {.n_layer = 2, .n_head = 4, .n_embd = 48, .block_size = 64, .vocab_size = vocab};
    mk_model *m;
    assert_int_equal(mk_model_new(&m, &c, 1, 4, NULL), 0);
    mk_model_init(m, 11);
    assert_int_equal(mkdir(dir, 0755), 0);
    if (mk_save_dir(m, dir, MK_BF16, 0)) fail_msg("mk_save_dir %s: %s", dir, mk_last_error());
    mk_model_free(m);
}

/* The spec examples/calc_qwen3.yaml with the folder, the calc server on its
 * free port, and a short run into run_dir. */
static manta_spec *load_spec(const char *model_dir, const char *run_dir)
{
    char url[128], dir[300], path[300], warm[64], wlr[64], ver[64], lr[64];
    snprintf(url, sizeof url, "tools.0.url=http://127.0.0.1:%d/mcp", calc_port);
    snprintf(dir, sizeof dir, "rl.run_dir=%s", run_dir);
    snprintf(path, sizeof path, "model.path=%s", model_dir);
    snprintf(warm, sizeof warm, "rl.warmup_steps=%d", WARMUP_STEPS);
    snprintf(wlr, sizeof wlr, "rl.warmup_lr=%g", WARMUP_LR);
    snprintf(ver, sizeof ver, "rl.max_versions=%d", RL_VERSIONS);
    snprintf(lr, sizeof lr, "rl.lr=%g", RL_LR);
    const char *sets[] = {"task.train=" SOURCE_DIR "/examples/calc/train.jsonl",
                          "task.heldout=" SOURCE_DIR "/examples/calc/heldout.jsonl",
                          "task.demos=" SOURCE_DIR "/examples/calc/demos.jsonl", url, dir, path,
                          warm, wlr, ver, lr, "rl.weight_decay=0", "rl.batch_episodes=16",
                          "rl.warmup_batch=16", "rl.max_time_s=120", "rl.eval_every=0",
                          "rl.eval_problems=8",
                          /* a policy this new earns no reward: train on its
                           * groups anyway (advantage 0), so that versions are
                           * trained and the weights move */
                          "rl.dynamic_sampling=false"};
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets, .n_sets = sizeof sets / sizeof *sets};
    manta_spec *spec = manta_spec_load_file(SOURCE_DIR "/examples/calc_qwen3.yaml", &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    assert_non_null(spec);
    return spec;
}

/* rollout-0's parameter count and version, from its "stats". */
static void rollout_stats(int64_t *params, int64_t *version)
{
    manta_actor *r;
    assert_int_equal(manta_actor_lookup(ctx, "rollout-0", &r), 0);
    manta_future *f = manta_call(ctx, r, "stats", "", 0);
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, 10000, &d, &n), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, d, n, NULL), MSGPACK_UNPACK_SUCCESS);
    *params = *version = -2;
    for (uint32_t i = 0; i < u.data.via.map.size; i++) {
        const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
        const char *k = kv->key.via.str.ptr;
        size_t kn = kv->key.via.str.size;
        if (kn == 6 && !memcmp(k, "params", 6)) *params = kv->val.via.i64;
        if (kn == 7 && !memcmp(k, "version", 7)) *version = kv->val.via.i64;
    }
    msgpack_unpacked_destroy(&u);
    manta_future_free(f);
}

/* The checkpoint's dtype as its config.json names it. */
static void assert_config_dtype(const char *dir, const char *want)
{
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt = read_file(path);
    assert_non_null(txt);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (!cJSON_IsString(d)) d = cJSON_GetObjectItemCaseSensitive(j, "torch_dtype");
    assert_true(cJSON_IsString(d));
    assert_string_equal(d->valuestring, want);
    cJSON_Delete(j);
}

/* The checkpoint is a folder of the source's family and size whose weights
 * are the source's moved by at most the optimiser's steps, plus one
 * rounding to the checkpoint's dtype (bf16: 2^-8 relative). A fresh
 * initialisation differs from the source by ~0.03 in most embedding
 * weights, far beyond that bound. */
static void check_checkpoint(const char *src_dir, const char *ckpt_dir, const char *arch,
                             const char *dtype)
{
    mk_model *src, *ck;
    if (mk_load_dir(&src, src_dir, 1, 2, NULL)) fail_msg("load %s: %s", src_dir, mk_last_error());
    if (mk_load_dir(&ck, ckpt_dir, 1, 2, NULL)) fail_msg("load %s: %s", ckpt_dir, mk_last_error());
    const mk_config *a = mk_model_config(src), *b = mk_model_config(ck);
    assert_string_equal(mk_arch_name(b->arch), arch);
    assert_int_equal(a->arch, b->arch);
    assert_int_equal(a->n_layer, b->n_layer);
    assert_int_equal(a->n_head, b->n_head);
    assert_int_equal(a->n_embd, b->n_embd);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->block_size, b->block_size);
    size_t n = mk_model_num_params(src);
    assert_int_equal(mk_model_num_params(ck), n);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    assert_non_null(x), assert_non_null(y);
    assert_int_equal(mk_model_read_params(src, x, 0, n), 0);
    assert_int_equal(mk_model_read_params(ck, y, 0, n), 0);
    double steps_bound = 1.5 * (WARMUP_STEPS * WARMUP_LR + RL_VERSIONS * RL_LR);
    double round = !strcmp(dtype, "f32") ? 1e-7 : 1.0 / 256;
    size_t moved = 0, outside = 0;
    double max_d = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)y[i] - x[i]);
        if (d > max_d) max_d = d;
        if (d > 0) moved++;
        if (d > steps_bound + round * (fabs(x[i]) + steps_bound)) outside++;
    }
    printf("checkpoint %s: %zu of %zu weights moved, max |change| %.4g (bound %.4g + rounding)\n",
           ckpt_dir, moved, n, max_d, steps_bound);
    assert_int_equal(outside, 0); /* it started from the folder's weights */
    assert_true(moved > n / 10);  /* and was trained */
    free(x), free(y);
    mk_model_free(src), mk_model_free(ck);
}

/* A short run from model_dir; the summary, rollout-0 and the checkpoint. */
static void run_from_folder(const char *model_dir, const char *arch, const char *dtype)
{
    char run_dir[300], ckpt[400];
    snprintf(run_dir, sizeof run_dir, "%s/run", tmp_root);
    snprintf(ckpt, sizeof ckpt, "%s/model", run_dir);
    manta_spec *spec = load_spec(model_dir, run_dir);
    manta_job_t *job;
    if (manta_job_start(ctx, spec, &(manta_job_options){.no_services = 1}, &job) != 0)
        fail_msg("start: %s", manta_last_error());
    const void *reply;
    size_t len;
    if (manta_job_wait(job, -1, &reply, &len) != 0) fail_msg("run: %s", manta_last_error());
    char *summary = strndup(reply, len);
    assert_non_null(summary);
    int64_t r_params, r_version;
    rollout_stats(&r_params, &r_version);
    manta_job_free(job);
    manta_spec_free(spec);
    printf("%s\n", summary);
    cJSON *j = cJSON_Parse(summary);
    assert_non_null(j);
    assert_string_equal(get(j, "status")->valuestring, "done");
    assert_true(cJSON_IsTrue(get(j, "ledger.balanced")));
    assert_true(get(j, "ledger.trained")->valuedouble > 0);
    assert_true(get(j, "versions")->valuedouble >= RL_VERSIONS);
    assert_true(get(j, "rates.gen_tokens")->valuedouble > 0);
    /* the policy named in the summary is the folder's */
    assert_string_equal(get(j, "model.arch")->valuestring, arch);
    assert_string_equal(get(j, "model.path")->valuestring, model_dir);
    assert_string_equal(get(j, "model.checkpoint")->valuestring, ckpt);
    assert_string_equal(get(j, "model.checkpoint_dtype")->valuestring, dtype);
    /* the rollouts decoded with it: its parameter count, a trained version */
    printf("rollout-0: %lld params, version %lld\n", (long long)r_params, (long long)r_version);
    assert_true(r_params > 0);
    assert_true(get(j, "model.params")->valuedouble == (double)r_params);
    assert_true(r_version >= 1);
    cJSON_Delete(j);
    free(summary);
    assert_config_dtype(ckpt, !strcmp(dtype, "bf16") ? "bfloat16" : "float32");
    check_checkpoint(model_dir, ckpt, arch, dtype);
}

/* A job whose model.path is refused fails at its start, naming the cause. */
static void expect_start_fails(const char *model_dir, const char *why)
{
    char run_dir[300];
    snprintf(run_dir, sizeof run_dir, "%s/run-refused", tmp_root);
    manta_spec *spec = load_spec(model_dir, run_dir);
    manta_job_t *job = NULL;
    int rc = manta_job_start(ctx, spec, &(manta_job_options){.no_services = 1}, &job);
    const char *err = manta_last_error();
    printf("refused: %s\n", err);
    if (rc == 0) {
        /* started after all: the run must fail (it never may train) */
        rc = manta_job_wait(job, 60000, NULL, NULL);
        err = manta_last_error();
        printf("run: %s\n", err);
        manta_job_free(job);
        assert_int_not_equal(rc, 0);
        fail_msg("the job started with model.path %s", model_dir);
    }
    assert_non_null(strstr(err, "model.path"));
    assert_non_null(strstr(err, why));
    manta_spec_free(spec);
}

static void test_gpt2_folder(void **st)
{
    (void)st;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/gpt2", tmp_root);
    make_gpt2_folder(dir, RL_VOCAB);
    run_from_folder(dir, "gpt2", "bf16");
}

/* One job per process: a start that failed leaves its failed actor's name
 * taken in the context. The other refusals are in test_rl_unit. */
static void test_small_vocab_refused(void **st)
{
    (void)st;
    char small[300];
    snprintf(small, sizeof small, "%s/gpt2-small-vocab", tmp_root);
    make_gpt2_folder(small, 200);
    expect_start_fails(small, "vocab_size 200 is smaller than the task's vocabulary (260");
}

static void test_qwen3_folder(void **st)
{
    (void)st;
    char dir[300], cmd[1200];
    snprintf(dir, sizeof dir, "%s/tiny-qwen3", tmp_root);
    snprintf(cmd, sizeof cmd, "'%s' '%s/examples/make_tiny_qwen3.py' '%s'", getenv("MANTA_PYTHON"),
             SOURCE_DIR, dir);
    assert_int_equal(system(cmd), 0);
    run_from_folder(dir, "qwen3", "f32");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "gpt2";
    int qwen3_mode = !strcmp(mode, "qwen3");
    if (qwen3_mode && (!getenv("MANTA_PYTHON") || !getenv("MANTA_PYTHON")[0])) {
        printf("skipped: MANTA_PYTHON is not set (python with transformers)\n");
        return 77;
    }
    if (manta_init(&ctx, &(manta_options){.classes = manta_builtin_classes,
                                          .call_timeout_ms = 60000,
                                          .log_dir = getenv("RL_LOG_DIR")}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/manta-rl-model-%d", (int)getpid());
    if (mkdir(tmp_root, 0755) != 0) {
        perror(tmp_root);
        manta_shutdown(ctx);
        return 1;
    }
    int pid = rl_start_calc_server(SOURCE_DIR "/examples/calc_server.py", "", &calc_port);
    if (pid < 0) {
        fprintf(stderr, "cannot start the calc server\n");
        manta_shutdown(ctx);
        return 1;
    }
    const struct CMUnitTest gpt2[] = {cmocka_unit_test(test_gpt2_folder)};
    const struct CMUnitTest refuse[] = {cmocka_unit_test(test_small_vocab_refused)};
    const struct CMUnitTest qwen3[] = {cmocka_unit_test(test_qwen3_folder)};
    int failed = qwen3_mode                ? cmocka_run_group_tests(qwen3, NULL, NULL)
                 : !strcmp(mode, "refuse") ? cmocka_run_group_tests(refuse, NULL, NULL)
                                           : cmocka_run_group_tests(gpt2, NULL, NULL);
    manta_shutdown(ctx);
    rl_stop_process(pid);
    if (!failed) { /* keep the folders of a failed run for inspection */
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_root);
    }
    return failed;
}
