/*
 * test_rl_text.c - the policy's text with a real tokenizer (issue 10 item 4),
 * without processes and without Python: the committed ChatML tokenizer
 * fixture of tests/tokenizer (a byte-level BPE of 1207 ids with <|im_start|>,
 * <|im_end|>, <tool_call>, </tool_call>, ...) and a fresh GPT-2 of its size.
 *
 *   spec     model.tokenizer and model.chat_format are read and checked:
 *            the tokenizer's vocabulary sizes a fresh model and must fit a
 *            folder's; "auto" takes a folder's tokenizer.json; the format
 *            must have its tokens; the byte-level vocabulary takes no format.
 *   turns    the ChatML text of an episode: the prompt is the rendered
 *            conversation; a tool call ends at "</tool_call>" (found in the
 *            decoded text, whatever ids wrote it) and its text is the JSON;
 *            the answer ends at <|im_end|>; the observation is the rendered
 *            tool turn; a demonstration's ids decode to the conversation
 *            transformers' template writes.
 *   sampled  an untrained model samples an episode through the rollout's
 *            steps (prompt, sampled ids, a tool call, the observation, the
 *            answer). Re-tokenising the episode's text gives other ids than
 *            the sampled ones; the trajectory and the learner's step message
 *            carry the sampled ids unchanged, and the learner's forward pass
 *            over them gives, token for token, the behaviour log-probs the
 *            decoder reported (ratio 1 within 1e-5; mk_loss_ppo's mean ratio
 *            1, nothing clipped). The re-tokenised ids would not.
 */
#include "textio.h"

#include <manta_actors.h>
#include <manta_kernels.h>
#include <manta_tok.h>

#include <math.h>
#include <msgpack.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#define FIXTURE SOURCE_DIR "/tests/tokenizer/fixtures/qwen2.json"

/* ---- a spec payload {job, group, replica, settings, sections} ---- */

static void key(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* Reads section model (given as key/value string pairs, plus a fresh
 * model's size when no path is given) and tools [{name: calc}]. */
static int read_spec(rl_model_spec *ms, char *why, size_t wl, ...)
{
    const char *kv[16];
    int n = 0;
    va_list ap;
    va_start(ap, wl);
    for (const char *s; n < 16 && (s = va_arg(ap, const char *));) kv[n++] = s;
    va_end(ap);
    int has_path = 0;
    for (int i = 0; i < n; i += 2) has_path |= !strcmp(kv[i], "path");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    key(&pk, "job"), key(&pk, "j");
    key(&pk, "group"), key(&pk, "rollout");
    key(&pk, "replica"), msgpack_pack_int(&pk, 0);
    key(&pk, "settings"), msgpack_pack_map(&pk, 0);
    key(&pk, "sections"), msgpack_pack_map(&pk, 2);
    key(&pk, "model"), msgpack_pack_map(&pk, (size_t)(n / 2 + (has_path ? 0 : 4)));
    for (int i = 0; i + 1 < n; i += 2) key(&pk, kv[i]), key(&pk, kv[i + 1]);
    if (!has_path) {
        key(&pk, "n_layer"), msgpack_pack_int(&pk, 2);
        key(&pk, "n_head"), msgpack_pack_int(&pk, 2);
        key(&pk, "n_embd"), msgpack_pack_int(&pk, 32);
        key(&pk, "block_size"), msgpack_pack_int(&pk, 512);
    }
    key(&pk, "tools"), msgpack_pack_array(&pk, 1), msgpack_pack_map(&pk, 3);
    key(&pk, "name"), key(&pk, "calc");
    key(&pk, "url"), key(&pk, "http://127.0.0.1:1/mcp");
    key(&pk, "arg"), key(&pk, "expression");
    rl_args a;
    rl_args_open(&a, sb.data, sb.size);
    rl_model_read(&a, ms);
    snprintf(why, wl, "%s", a.err);
    int rc = rl_args_close(&a, NULL);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* A GPT-2 folder (mk_save_dir) with `vocab` ids; with the fixture as its
 * tokenizer.json when tok. */
static void make_folder(const char *dir, int vocab, int tok)
{
    mk_config c = {.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 64, .vocab_size = vocab};
    mk_model *m;
    assert_int_equal(mk_model_new(&m, &c, 1, 4, NULL), 0);
    mk_model_init(m, 3);
    mkdir(dir, 0755);
    assert_int_equal(mk_save_dir(m, dir, MK_F32, 0), 0);
    mk_model_free(m);
    if (tok) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s/tokenizer.json'", FIXTURE, dir);
        assert_int_equal(system(cmd), 0);
    }
}

static void rm_dir(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_spec(void **st)
{
    (void)st;
    rl_model_spec ms;
    char why[512], dir[128], small[128];

    /* a fresh model takes the tokenizer's size; the format is detected */
    assert_int_equal(read_spec(&ms, why, sizeof why, "tokenizer", FIXTURE, NULL), 0);
    assert_string_equal(ms.tokenizer, FIXTURE);
    assert_int_equal(ms.vocab, 1207);
    assert_int_equal(ms.cfg.vocab_size, 1207);
    assert_int_equal(ms.chat_format, MTOK_CHAT_CHATML);
    assert_non_null(strstr(ms.tools_json, "\"name\":\"calc\""));
    assert_string_equal(ms.tool_name, "calc");
    assert_string_equal(ms.tool_arg, "expression");

    /* the byte-level vocabulary: no tokenizer, RL_VOCAB, no format */
    assert_int_equal(read_spec(&ms, why, sizeof why, NULL), 0);
    assert_int_equal(ms.tokenizer[0], 0);
    assert_int_equal(ms.vocab, RL_VOCAB);
    assert_int_equal(ms.cfg.vocab_size, RL_VOCAB);
    assert_int_equal(
        read_spec(&ms, why, sizeof why, "tokenizer", "bytes", "chat_format", "chatml", NULL),
        MANTA_EINVAL);
    assert_non_null(strstr(why, "model.chat_format: needs a tokenizer"));

    /* a format whose tokens the tokenizer lacks; a name that is no format */
    assert_int_equal(
        read_spec(&ms, why, sizeof why, "tokenizer", FIXTURE, "chat_format", "llama3", NULL),
        MANTA_EINVAL);
    printf("refused: %s\n", why);
    assert_non_null(strstr(why, "model.chat_format: llama3: "));
    assert_non_null(strstr(why, "has no token <|start_header_id|>"));
    assert_int_equal(
        read_spec(&ms, why, sizeof why, "tokenizer", FIXTURE, "chat_format", "jinja", NULL),
        MANTA_EINVAL);
    assert_non_null(strstr(why, "model.chat_format: "));
    /* a tokenizer that is not there */
    assert_int_equal(
        read_spec(&ms, why, sizeof why, "tokenizer", "/nonexistent/tokenizer.json", NULL),
        MANTA_EINVAL);
    printf("refused: %s\n", why);
    assert_non_null(strstr(why, "model.tokenizer: "));
    assert_non_null(strstr(why, "/nonexistent/tokenizer.json"));

    /* auto: a folder's tokenizer.json; its ids must fit the model's */
    snprintf(dir, sizeof dir, "/tmp/manta-rl-text-%d-tok", (int)getpid());
    snprintf(small, sizeof small, "/tmp/manta-rl-text-%d-small", (int)getpid());
    make_folder(dir, 1300, 1);
    make_folder(small, 1000, 1);
    assert_int_equal(read_spec(&ms, why, sizeof why, "path", dir, NULL), 0);
    char want[300];
    snprintf(want, sizeof want, "%s/tokenizer.json", dir);
    assert_string_equal(ms.tokenizer, want);
    assert_int_equal(ms.vocab, 1207);
    assert_int_equal(ms.cfg.vocab_size, 1300);
    assert_int_equal(read_spec(&ms, why, sizeof why, "path", dir, "tokenizer", "bytes", NULL), 0);
    assert_int_equal(ms.tokenizer[0], 0);
    assert_int_equal(ms.vocab, RL_VOCAB);
    assert_int_equal(read_spec(&ms, why, sizeof why, "path", small, NULL), MANTA_EINVAL);
    printf("refused: %s\n", why);
    assert_non_null(strstr(why, "model.tokenizer: "));
    assert_non_null(strstr(why, "1207 token ids do not fit the model's vocab_size 1000"));
    rm_dir(dir), rm_dir(small);
}

/* ---- turns ---- */

static rl_text *open_text(rl_model_spec *ms)
{
    char why[512];
    assert_int_equal(read_spec(ms, why, sizeof why, "tokenizer", FIXTURE, NULL), 0);
    rl_text *x;
    if (rl_text_new(ms, &x)) fail_msg("rl_text_new: %s", rl_last_error());
    assert_string_equal(rl_text_kind(x), "mtok");
    assert_string_equal(rl_text_call_format(x), "json");
    assert_int_equal(rl_text_vocab(x), 1207);
    return x;
}

static char *decode(mtok *t, const int32_t *ids, size_t n)
{
    char *s;
    size_t len;
    assert_int_equal(mtok_decode(t, ids, n, 0, &s, &len), 0);
    return s;
}

/* Feed the encoding of text to the turn; the outcome of each id into
 * what[]; returns the number of ids. */
static size_t feed(rl_text *x, mtok *t, rl_turn *turn, const char *text, int *what, size_t cap)
{
    int32_t *ids;
    size_t n;
    assert_int_equal(mtok_encode(t, text, strlen(text), 0, &ids, &n), 0);
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) what[i] = rl_text_step(x, turn, ids[i]);
    free(ids);
    return n;
}

static void test_turns(void **st)
{
    (void)st;
    rl_model_spec ms;
    rl_text *x = open_text(&ms);
    mtok *t;
    assert_int_equal(mtok_load(FIXTURE, &t), 0);

    /* the prompt: the conversation [user] with tools and the generation prompt */
    int32_t *ids;
    size_t n;
    assert_int_equal(rl_text_prompt(x, "347*29=?", &ids, &n), 0);
    char *p = decode(t, ids, n);
    printf("prompt (%zu ids): %s\n", n, p);
    assert_non_null(strstr(p, "<|im_start|>user\n347*29=?<|im_end|>\n<|im_start|>assistant\n"));
    assert_non_null(strstr(p, "# Tools"));
    assert_non_null(strstr(p, "\"name\": \"calc\""));
    assert_true(strlen(p) > 22 &&
                !strcmp(p + strlen(p) - 22, "<|im_start|>assistant\n")); /* ends there */
    free(p), free(ids);

    /* a call ends at </tool_call>, whatever ids wrote it; its text is the JSON */
    rl_turn turn = {0};
    int what[256];
    size_t k = feed(x, t, &turn,
                    "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
                    "\"347*29\"}}\n</tool_call>",
                    what, 256);
    for (size_t i = 0; i + 1 < k; i++) assert_int_equal(what[i], RL_TURN_MORE);
    assert_int_equal(what[k - 1], RL_TURN_CALL);
    assert_string_equal(turn.call, "\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
                                   "\"347*29\"}}\n");
    /* the same call written byte by byte (ids no tokenizer would give) */
    rl_turn_reset(&turn);
    const char *call = "<tool_call>{\"name\": \"calc\"}</tool_call>";
    for (const char *c = call; *c; c++) {
        char one[2] = {*c, 0};
        int32_t *b;
        size_t nb;
        assert_int_equal(mtok_encode(t, one, 1, 0, &b, &nb), 0);
        assert_int_equal(nb, 1);
        int w = rl_text_step(x, &turn, b[0]);
        assert_int_equal(w, c[1] ? RL_TURN_MORE : RL_TURN_CALL);
        free(b);
    }
    assert_string_equal(turn.call, "{\"name\": \"calc\"}");
    /* a stray closing tag is text; the answer ends at <|im_end|> */
    rl_turn_reset(&turn);
    k = feed(x, t, &turn, "so </tool_call> 10063<|im_end|>", what, 256);
    for (size_t i = 0; i + 1 < k; i++) assert_int_equal(what[i], RL_TURN_MORE);
    assert_int_equal(what[k - 1], RL_TURN_END);
    /* an id outside the tokenizer's vocabulary is foreign */
    assert_int_equal(rl_text_step(x, &turn, 1207), RL_TURN_FOREIGN);
    rl_turn_destroy(&turn);

    /* the observation: the rest of the call's turn, the tool turn, the
     * generation prompt */
    assert_int_equal(rl_text_observation(x, "10063", 5, &ids, &n), 0);
    p = decode(t, ids, n);
    assert_string_equal(p, "<|im_end|>\n<|im_start|>user\n<tool_response>\n10063\n"
                           "</tool_response><|im_end|>\n<|im_start|>assistant\n");
    free(p), free(ids);

    /* the answer: the last policy segment without special tokens, trimmed */
    rl_traj tr;
    rl_traj_init(&tr);
    rl_traj_push(&tr, 1, 0, -1, 0, RL_SEG_PROMPT);
    assert_int_equal(mtok_encode(t, " 10063\n<|im_end|>", 17, 0, &ids, &n), 0);
    for (size_t i = 0; i < n; i++) rl_traj_push(&tr, ids[i], -1, 0, 1, RL_SEG_POLICY);
    free(ids);
    char ans[64];
    rl_text_answer(x, &tr, ans, sizeof ans);
    assert_string_equal(ans, "10063");
    rl_traj_destroy(&tr);

    /* a demonstration: the conversation as the template writes it (less the
     * final newline after <|im_end|>, which the policy never writes); the
     * policy's turns are trained on, the rest is given */
    cJSON *segs = cJSON_Parse("[[\"policy\", \"<call>347*29</call>\"], [\"tool\", \"10063\"], "
                              "[\"policy\", \"10063\"]]");
    uint8_t *mask;
    assert_int_equal(rl_text_demo(x, "347*29=?", segs, &ids, &mask, &n), 0);
    p = decode(t, ids, n);
    mtok_tool_call c1 = {.name = "calc", .arguments = "{\"expression\":\"347*29\"}"};
    mtok_message m[] = {{.role = "user", .content = "347*29=?"},
                        {.role = "assistant", .tool_calls = &c1, .n_tool_calls = 1},
                        {.role = "tool", .content = "10063"},
                        {.role = "assistant", .content = "10063"}};
    mtok_chat_opts o = {.format = MTOK_CHAT_CHATML, .tools_json = ms.tools_json};
    char *full;
    size_t fl;
    assert_int_equal(mtok_chat_render(t, m, 4, &o, &full, &fl), 0);
    printf("demo (%zu ids): %s\n", n, p);
    assert_int_equal(strlen(p) + 1, fl);
    assert_memory_equal(p, full, fl - 1);
    /* the trained ids decode to the two assistant turns */
    int32_t *pol = malloc(n * sizeof *pol);
    size_t np = 0;
    for (size_t i = 0; i < n; i++)
        if (mask[i]) pol[np++] = ids[i];
    char *ps = decode(t, pol, np);
    assert_string_equal(ps, "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
                            "\"347*29\"}}\n</tool_call>10063<|im_end|>");
    free(ps), free(pol), free(p), free(full), free(ids), free(mask);
    cJSON_Delete(segs);
    mtok_free(t);
    rl_text_free(x);
}

/* Llama 3: the call is the whole turn as JSON, ended by <|eot_id|>; tool
 * results come back in an ipython turn. */
/* The byte-level vocabulary: a call opened and closed before the turn has
 * any text is an empty call (the rollout asks the tool with ""), not a
 * read of a missing buffer (UBSan caught strndup(NULL, 0) here). */
static void test_bytes_empty_call(void **st)
{
    (void)st;
    rl_model_spec ms;
    char why[512];
    assert_int_equal(read_spec(&ms, why, sizeof why, NULL), 0);
    rl_text *x;
    if (rl_text_new(&ms, &x)) fail_msg("rl_text_new: %s", rl_last_error());
    assert_int_equal(rl_text_vocab(x), RL_VOCAB);
    rl_turn turn = {0};
    assert_int_equal(rl_text_step(x, &turn, RL_TOK_CALL), RL_TURN_MORE);
    assert_int_equal(rl_text_step(x, &turn, RL_TOK_END), RL_TURN_CALL);
    assert_non_null(turn.call);
    assert_string_equal(turn.call, "");
    /* and after text, the call is the bytes in between */
    rl_turn_reset(&turn);
    const char *in = "so 2*3";
    for (const char *c = in; *c; c++) {
        if (c == in + 3) assert_int_equal(rl_text_step(x, &turn, RL_TOK_CALL), RL_TURN_MORE);
        assert_int_equal(rl_text_step(x, &turn, (unsigned char)*c), RL_TURN_MORE);
    }
    assert_int_equal(rl_text_step(x, &turn, RL_TOK_END), RL_TURN_CALL);
    assert_string_equal(turn.call, "2*3");
    rl_turn_destroy(&turn);
    rl_text_free(x);
}

static void test_llama3_turns(void **st)
{
    (void)st;
    rl_model_spec ms;
    char why[512];
    const char *fix = SOURCE_DIR "/tests/tokenizer/fixtures/llama3.json";
    assert_int_equal(read_spec(&ms, why, sizeof why, "tokenizer", fix, NULL), 0);
    assert_int_equal(ms.chat_format, MTOK_CHAT_LLAMA3);
    rl_text *x;
    assert_int_equal(rl_text_new(&ms, &x), 0);
    mtok *t;
    assert_int_equal(mtok_load(fix, &t), 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(rl_text_prompt(x, "6*7=?", &ids, &n), 0);
    char *p = decode(t, ids, n);
    assert_true(!strncmp(p, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>", 59));
    const char *gen = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_true(strlen(p) > strlen(gen) && !strcmp(p + strlen(p) - strlen(gen), gen));
    free(p), free(ids);

    rl_turn turn = {0};
    int what[256];
    size_t k = feed(x, t, &turn,
                    "{\"name\": \"calc\", \"parameters\": {\"expression\": \"6*7\"}}<|eot_id|>",
                    what, 256);
    for (size_t i = 0; i + 1 < k; i++) assert_int_equal(what[i], RL_TURN_MORE);
    assert_int_equal(what[k - 1], RL_TURN_CALL);
    assert_string_equal(turn.call,
                        "{\"name\": \"calc\", \"parameters\": {\"expression\": \"6*7\"}}");
    rl_turn_reset(&turn);
    k = feed(x, t, &turn, "42<|eot_id|>", what, 256);
    assert_int_equal(what[k - 1], RL_TURN_END);
    rl_turn_destroy(&turn);

    assert_int_equal(rl_text_observation(x, "42", 2, &ids, &n), 0);
    p = decode(t, ids, n);
    printf("llama3 observation: %s\n", p);
    assert_true(!strncmp(p, "<|start_header_id|>ipython<|end_header_id|>\n\n", 45));
    assert_non_null(strstr(p, "42"));
    assert_true(!strcmp(p + strlen(p) - strlen(gen), gen));
    free(p), free(ids);

    cJSON *segs = cJSON_Parse("[[\"policy\", \"<call>6*7</call>\"], [\"tool\", \"42\"], "
                              "[\"policy\", \"42\"]]");
    uint8_t *mask;
    assert_int_equal(rl_text_demo(x, "6*7=?", segs, &ids, &mask, &n), 0);
    p = decode(t, ids, n);
    mtok_tool_call c1 = {.name = "calc", .arguments = "{\"expression\":\"6*7\"}"};
    mtok_message m[] = {{.role = "user", .content = "6*7=?"},
                        {.role = "assistant", .tool_calls = &c1, .n_tool_calls = 1},
                        {.role = "tool", .content = "42"},
                        {.role = "assistant", .content = "42"}};
    mtok_chat_opts o = {.format = MTOK_CHAT_LLAMA3, .tools_json = ms.tools_json};
    char *full;
    size_t fl;
    assert_int_equal(mtok_chat_render(t, m, 4, &o, &full, &fl), 0);
    assert_string_equal(p, full);
    free(p), free(full), free(ids), free(mask);
    cJSON_Delete(segs);
    mtok_free(t);
    rl_text_free(x);
}

/* ---- sampled ids ---- */

typedef struct episode {
    rl_traj tr;
    int calls;
} episode;

/* One episode as the rollout runs it: the prompt, sampled ids (temperature
 * 1, behaviour log-prob the policy's own) through rl_text_step, the
 * observation after a call, until the answer ends or max_new ids. */
static void run_episode(rl_text *x, mk_decoder *d, uint64_t seed, int max_new, episode *e)
{
    rl_traj_init(&e->tr);
    e->calls = 0;
    int32_t *ids;
    size_t n;
    assert_int_equal(rl_text_prompt(x, "347*29=?", &ids, &n), 0);
    for (size_t i = 0; i < n; i++) rl_traj_push(&e->tr, ids[i], 0, -1, 0, RL_SEG_PROMPT);
    assert_int_equal(mk_decoder_reset(d, 0, seed), 0);
    assert_int_equal(mk_decoder_append(d, 0, ids, (int)n), 0);
    free(ids);
    rl_turn turn = {0};
    int slot = 0;
    float temp = 1, topp = 1;
    for (int k = 0; k < max_new; k++) {
        int tok;
        float lps, lpp;
        assert_int_equal(mk_decoder_step(d, &slot, 1, &temp, &topp, &tok, &lps, &lpp), 0);
        int w = rl_text_step(x, &turn, tok);
        assert_true(w >= 0 && w != RL_TURN_FOREIGN); /* vocab_size == the tokenizer's */
        rl_traj_push(&e->tr, tok, lpp, 0, 1, RL_SEG_POLICY);
        if (w == RL_TURN_END) break;
        if (w == RL_TURN_CALL) {
            e->calls++;
            assert_int_equal(rl_text_observation(x, "error: no such tool", 19, &ids, &n), 0);
            for (size_t i = 0; i < n; i++) rl_traj_push(&e->tr, ids[i], 0, -1, 0, RL_SEG_TOOL);
            assert_int_equal(mk_decoder_append(d, 0, ids, (int)n), 0);
            free(ids);
            rl_turn_reset(&turn);
        }
    }
    rl_turn_destroy(&turn);
}

/* The learner's pass: inputs tok[0..n-2], targets tok[1..n-1]; the
 * log-prob of each target into lp[n-1]; mk_loss_ppo's statistics against
 * the behaviour log-probs. */
static void learner_pass(mk_model *m, const int32_t *tok, const float *blp, const uint8_t *mask,
                         int n, float *lp, mk_ppo_stats *ps)
{
    int T = n - 1;
    int *x = malloc((size_t)T * sizeof *x), *y = malloc((size_t)T * sizeof *y);
    float *b = malloc((size_t)T * sizeof *b), *adv = malloc((size_t)T * sizeof *adv),
          *mk = malloc((size_t)T * sizeof *mk);
    for (int t = 0; t < T; t++) {
        x[t] = tok[t], y[t] = tok[t + 1];
        b[t] = blp[t + 1], adv[t] = 1, mk[t] = mask[t + 1];
    }
    assert_int_equal(mk_forward(m, x, 1, T), 0);
    assert_int_equal(mk_logprobs(m, y, lp, NULL), 0);
    mk_ppo_params pp = {.clip_low = 0.2f, .clip_high = 0.28f, .ratio_cap = 3};
    assert_int_equal(mk_loss_ppo(m, y, b, adv, mk, &pp, ps), 0);
    free(x), free(y), free(b), free(adv), free(mk);
}

static void test_sampled_ids(void **st)
{
    (void)st;
    rl_model_spec ms;
    rl_text *x = open_text(&ms);
    mtok *t;
    assert_int_equal(mtok_load(FIXTURE, &t), 0);
    mk_model *model;
    assert_int_equal(rl_model_open(&ms, 1, 512, 0, &model), 0);
    mk_decoder *d;
    assert_int_equal(mk_decoder_new_ctx(&d, model, 1, 512), 0);

    /* an untrained model samples ids that re-tokenise differently; an
     * episode with a tool call when the seeds give one within 200 */
    episode e = {0};
    int differs = 0;
    int32_t *re = NULL;
    size_t nre = 0;
    for (uint64_t seed = 1; seed < 200 && !(differs && e.calls); seed++) {
        if (seed > 1) rl_traj_destroy(&e.tr);
        run_episode(x, d, seed, 120, &e);
        char *text = decode(t, e.tr.tok, (size_t)e.tr.n);
        free(re);
        assert_int_equal(mtok_encode(t, text, strlen(text), MTOK_UTF8_REPLACE, &re, &nre), 0);
        differs = nre != (size_t)e.tr.n || memcmp(re, e.tr.tok, nre * sizeof *re);
        free(text);
    }
    int policy = rl_traj_trained_tokens(&e.tr);
    printf("episode: %d ids (%d sampled), %d tool calls; its text re-tokenises to %zu ids%s\n",
           e.tr.n, policy, e.calls, nre, differs ? ", not the same ones" : "");
    assert_true(differs);
    assert_true(policy > 0);

    /* the trajectory carries the sampled ids; the byte-level bound refuses
     * them, the tokenizer's takes them */
    char *buf;
    size_t len;
    assert_int_equal(rl_traj_encode(&e.tr, &buf, &len), 0);
    rl_traj got;
    rl_traj_init(&got);
    assert_int_equal(rl_traj_decode(&got, buf, len), MANTA_EINVAL);
    assert_int_equal(rl_traj_decode_vocab(&got, buf, len, rl_text_vocab(x)), 0);
    assert_int_equal(got.n, e.tr.n);
    assert_memory_equal(got.tok, e.tr.tok, (size_t)got.n * sizeof *got.tok);
    assert_memory_equal(got.logp, e.tr.logp, (size_t)got.n * sizeof *got.logp);
    assert_memory_equal(got.mask, e.tr.mask, (size_t)got.n);
    free(buf);

    /* the learner's step message carries them too */
    rl_step_item it = {got.n, got.tok, got.logp, got.mask, 1.0f};
    rl_step_req q = {.mode = RL_STEP_PPO, .version = 0, .lr = 1e-3, .items = &it, .n_items = 1}, q2;
    assert_int_equal(rl_step_req_encode(&q, &buf, &len), 0);
    assert_int_equal(rl_step_req_decode_vocab(&q2, buf, len, 1000), MANTA_EINVAL);
    assert_int_equal(rl_step_req_decode_vocab(&q2, buf, len, rl_text_vocab(x)), 0);
    assert_int_equal(q2.items[0].n, e.tr.n);
    assert_memory_equal(q2.items[0].tok, e.tr.tok, (size_t)e.tr.n * sizeof(int32_t));
    free(buf);

    /* at the same weights the learner's log-probs of the sampled ids are the
     * behaviour log-probs, token for token */
    mk_model *lm;
    assert_int_equal(rl_model_open(&ms, 1, 512, 0, &lm), 0);
    int n = q2.items[0].n;
    float *lp = malloc((size_t)n * sizeof *lp);
    mk_ppo_stats ps;
    learner_pass(lm, q2.items[0].tok, q2.items[0].logp, q2.items[0].mask, n, lp, &ps);
    double worst = 0;
    int checked = 0;
    for (int i = 1; i < n; i++) {
        if (!q2.items[0].mask[i]) continue;
        double r = exp((double)lp[i - 1] - q2.items[0].logp[i]);
        if (fabs(r - 1) > worst) worst = fabs(r - 1);
        checked++;
    }
    printf("%d sampled ids: max |ratio - 1| %.3g; ppo mean ratio %.7f, clipped %.3g, kl %.3g\n",
           checked, worst, ps.mean_ratio, ps.clip_frac, ps.approx_kl);
    assert_int_equal(checked, policy);
    assert_true(worst < 1e-5);
    assert_true(fabsf(ps.mean_ratio - 1) < 1e-5f);
    assert_true(ps.clip_frac == 0);
    assert_true(ps.n_tokens == (float)policy);

    /* the re-tokenised text is another sequence: its first id that differs
     * has another log-prob under the same model (what training on it would
     * wrongly use) */
    size_t first = 0;
    while (first < nre && first < (size_t)n && re[first] == e.tr.tok[first]) first++;
    printf("re-tokenised ids first differ at %zu of %d (sampled %d, re-tokenised %d)\n", first, n,
           first < (size_t)n ? e.tr.tok[first] : -1, first < nre ? re[first] : -1);
    assert_true(first < nre && first < (size_t)n);

    free(lp), free(re);
    rl_step_req_destroy(&q2);
    rl_traj_destroy(&got);
    rl_traj_destroy(&e.tr);
    mk_model_free(lm);
    mk_decoder_free(d);
    mk_model_free(model);
    mtok_free(t);
    rl_text_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_spec), cmocka_unit_test(test_turns),
                                       cmocka_unit_test(test_bytes_empty_call),
                                       cmocka_unit_test(test_llama3_turns),
                                       cmocka_unit_test(test_sampled_ids)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
