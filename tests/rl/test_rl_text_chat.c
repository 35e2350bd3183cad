/*
 * test_rl_text_chat.c - the RL system with a policy that speaks through its
 * own tokenizer and chat format (issue 10 item 5), end to end:
 * examples/calc_qwen3_chat.yaml on the folder examples/make_tiny_qwen3_chat.py
 * writes with $MANTA_PYTHON (a tiny Qwen3 and a byte-level BPE tokenizer.json
 * with ChatML tokens, trained by `tokenizers`); skipped (77) when
 * MANTA_PYTHON is not set.
 *
 * A short synchronous run (rl.eta 0: every trained token was sampled by the
 * weights the learner steps from): warm-up on the ChatML demonstrations,
 * RL versions over the real calc tool, 2 learner shards, 2 rollouts, 2 envs.
 * Checked:
 *   - the run is done, the ledger balances, episodes were trained;
 *   - the trajectories hold the tokenizer's ids (not the byte-level
 *     vocabulary's), each prompt is the rendered ChatML conversation, masks
 *     follow the segments;
 *   - the learner trained on the sampled ids: at eta 0 its recomputed
 *     log-probs equal the behaviour log-probs, so every version's KL
 *     estimate is ~0 (< 1e-7) and nothing is clipped; training on a
 *     re-tokenisation would misalign the log-prob columns. How many episodes
 *     re-tokenise to other ids is printed (and at least one does).
 */
#include "calc_server.h"

#include <manta_actors.h>
#include <manta_job.h>
#include <manta_tok.h>

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
static char tmp_root[256], model_dir[300], run_dir[300];

static char *slurp(const char *path, size_t *len)
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
    if (len) *len = (size_t)n;
    return b;
}

static const cJSON *get(const cJSON *j, const char *path)
{
    char k[64];
    const cJSON *o = j;
    while (o && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        snprintf(k, sizeof k, "%.*s", (int)n, path);
        o = cJSON_GetObjectItemCaseSensitive(o, k);
        path += n + (dot != NULL);
    }
    if (!o) fail_msg("no %s", path);
    return o;
}

static manta_spec *load_spec(void)
{
    char url[128], dir[400], path[400];
    snprintf(url, sizeof url, "tools.0.url=http://127.0.0.1:%d/mcp", calc_port);
    snprintf(dir, sizeof dir, "rl.run_dir=%s", run_dir);
    snprintf(path, sizeof path, "model.path=%s", model_dir);
    const char *sets[] = {"task.train=" SOURCE_DIR "/examples/calc/train.jsonl",
                          "task.heldout=" SOURCE_DIR "/examples/calc/heldout.jsonl",
                          "task.demos=" SOURCE_DIR "/examples/calc/demos.jsonl",
                          url,
                          dir,
                          path,
                          "rl.eta=0",
                          "rl.warmup_steps=30",
                          "rl.max_versions=4",
                          "rl.batch_episodes=16",
                          "rl.warmup_batch=16",
                          "rl.max_time_s=150",
                          "rl.eval_every=0",
                          "rl.eval_problems=8",
                          "groups.rollout.settings.slots=16"};
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets, .n_sets = sizeof sets / sizeof *sets};
    manta_spec *spec =
        manta_spec_load_file(SOURCE_DIR "/examples/calc_qwen3_chat.yaml", &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    assert_non_null(spec);
    return spec;
}

/* Every version's line: KL ~0 and nothing clipped (eta 0: the learner's
 * log-probs of the ids it trains on are the behaviour log-probs). */
static int check_metrics(void)
{
    char path[400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    char *txt = slurp(path, NULL);
    assert_non_null(txt);
    int lines = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *kl = cJSON_GetObjectItemCaseSensitive(j, "kl");
        const cJSON *cf = cJSON_GetObjectItemCaseSensitive(j, "clip_frac");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "staleness");
        if (cJSON_IsNumber(kl) && cJSON_IsNumber(cf) && cJSON_IsArray(st)) {
            printf("version %d: kl %.3g clip_frac %.3g\n", (int)get(j, "version")->valuedouble,
                   kl->valuedouble, cf->valuedouble);
            assert_true(kl->valuedouble < 1e-7);
            assert_true(cf->valuedouble == 0);
            lines++;
        }
        cJSON_Delete(j);
    }
    free(txt);
    return lines;
}

/* The trajectories the controller kept: the tokenizer's ids, ChatML
 * prompts, masks by segment; how many re-tokenise to other ids. */
static void check_trajectories(int32_t vocab)
{
    char path[400], tokp[400];
    snprintf(path, sizeof path, "%s/trajectories.msgpack", run_dir);
    snprintf(tokp, sizeof tokp, "%s/tokenizer.json", model_dir);
    mtok *tk;
    assert_int_equal(mtok_load(tokp, &tk), 0);
    size_t len, off = 0;
    char *buf = slurp(path, &len);
    assert_non_null(buf);
    int n = 0, wide = 0, differs = 0, calls = 0;
    rl_traj t;
    rl_traj_init(&t);
    while (off < len) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t at = off;
        assert_int_equal(msgpack_unpack_next(&u, buf, len, &off), MSGPACK_UNPACK_SUCCESS);
        msgpack_unpacked_destroy(&u);
        assert_int_equal(rl_traj_decode_vocab(&t, buf + at, off - at, vocab), 0);
        assert_true(t.n_seg >= 2 && t.seg_kind[0] == RL_SEG_PROMPT);
        for (int s = 0; s < t.n_seg; s++) {
            int end = s + 1 < t.n_seg ? t.seg_start[s + 1] : t.n;
            for (int i = t.seg_start[s]; i < end; i++)
                assert_int_equal(t.mask[i], t.seg_kind[s] == RL_SEG_POLICY);
        }
        int wide_here = 0;
        for (int i = 0; i < t.n; i++) wide_here |= t.tok[i] >= RL_VOCAB;
        wide += wide_here;
        calls += t.tool_calls;
        char *text, *prompt;
        size_t tl, pl;
        assert_int_equal(mtok_decode(tk, t.tok, (size_t)t.n, 0, &text, &tl), 0);
        assert_int_equal(mtok_decode(tk, t.tok, (size_t)t.seg_start[1], 0, &prompt, &pl), 0);
        assert_true(!strncmp(prompt, "<|im_start|>system\n", 19));
        assert_non_null(strstr(prompt, "<|im_start|>user\n"));
        assert_true(pl > 22 && !strcmp(prompt + pl - 22, "<|im_start|>assistant\n"));
        int32_t *re;
        size_t nre;
        assert_int_equal(mtok_encode(tk, text, tl, MTOK_UTF8_REPLACE, &re, &nre), 0);
        int d = nre != (size_t)t.n || memcmp(re, t.tok, nre * sizeof *re);
        differs += d;
        if (n < 2 || (d && differs == 1))
            printf("trajectory %d (reward %.0f, %d calls, answer \"%s\"%s): %s\n", n, t.reward,
                   t.tool_calls, t.answer, d ? ", re-tokenises differently" : "",
                   pl <= tl ? text + pl : text);
        free(re), free(text), free(prompt);
        n++;
    }
    printf("%d trajectories: %d with ids of the tokenizer above %d, %d tool calls, %d whose text "
           "re-tokenises to other ids\n",
           n, wide, RL_VOCAB - 1, calls, differs);
    assert_true(n > 0);
    assert_true(wide > 0);
    assert_true(differs > 0);
    rl_traj_destroy(&t);
    free(buf);
    mtok_free(tk);
}

static void test_chat_run(void **st)
{
    (void)st;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' '%s/examples/make_tiny_qwen3_chat.py' '%s'",
             getenv("MANTA_PYTHON"), SOURCE_DIR, model_dir);
    assert_int_equal(system(cmd), 0);
    manta_spec *spec = load_spec();
    manta_job_t *job;
    if (manta_job_start(ctx, spec, &(manta_job_options){.no_services = 1}, &job) != 0)
        fail_msg("start: %s", manta_last_error());
    const void *reply;
    size_t len;
    if (manta_job_wait(job, -1, &reply, &len) != 0) fail_msg("run: %s", manta_last_error());
    char *summary = strndup(reply, len);
    manta_job_free(job);
    manta_spec_free(spec);
    printf("%s\n", summary);
    cJSON *j = cJSON_Parse(summary);
    assert_non_null(j);
    assert_string_equal(get(j, "status")->valuestring, "done");
    assert_true(cJSON_IsTrue(get(j, "ledger.balanced")));
    assert_true(get(j, "ledger.trained")->valuedouble > 0);
    assert_true(get(j, "versions")->valuedouble >= 4);
    assert_string_equal(get(j, "model.arch")->valuestring, "qwen3");
    int32_t vocab = (int32_t)get(j, "model.vocab_size")->valuedouble;
    cJSON_Delete(j);
    free(summary);
    assert_true(check_metrics() >= 4);
    check_trajectories(vocab);
}

int main(void)
{
    if (manta_init(&ctx, &(manta_options){.classes = manta_builtin_classes,
                                          .call_timeout_ms = 60000,
                                          .log_dir = getenv("RL_LOG_DIR")}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    /* after manta_init: the node agent starts from this main() too */
    if (!getenv("MANTA_PYTHON") || !getenv("MANTA_PYTHON")[0]) {
        printf("skipped: MANTA_PYTHON is not set (python with tokenizers and transformers)\n");
        manta_shutdown(ctx);
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/manta-rl-text-chat-%d", (int)getpid());
    snprintf(model_dir, sizeof model_dir, "%s/tiny-qwen3-chat", tmp_root);
    snprintf(run_dir, sizeof run_dir, "%s/run", tmp_root);
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_chat_run)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    manta_shutdown(ctx);
    rl_stop_process(pid);
    if (!failed) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_root);
    }
    return failed;
}
