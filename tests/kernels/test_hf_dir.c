/*
 * test_hf_dir.c - Hugging Face folders of every family.  The committed
 * fixtures written by transformers (gen_hf_fixtures.py: GPT-2 in F32, BF16,
 * F16 and sharded BF16; an untied Llama with biases and Llama 3 rope scaling
 * whose config is in the transformers 4 layout; a tied BF16 Llama; a tied
 * BF16 Qwen2; an untied sharded BF16 Qwen3) load with mk_load_dir, read the
 * right config, and give transformers' logits; the loaded 16-bit GPT-2
 * weights equal the F32 fixture's rounded here (so our rounding is torch's
 * and the upcast is exact); the conversions over all 65536 16-bit patterns;
 * config.json's defaults and layouts as transformers reads them; save ->
 * load -> save round trips, bit-exact, for every family and dtype, single and
 * sharded; and the refusals (config: unknown model_type, activation, sliding
 * windows, rope types, experts, dropout, missing sizes; tensors: missing,
 * wrong shape, unknown dtype, truncated shard, index without the tensor,
 * untied head on a tied model, missing lm_head on an untied one), each naming
 * the file and the tensor or key.  Broken folders are written by a small
 * writer here from the public checkpoint view (mk_model_hf_tensor,
 * mk_model_read_hf), independent of mk_save_dir.
 *
 * Tolerance against transformers' float32 logits, every family: 1e-5
 * absolute + 1e-5 relative (the weights are identical floats; only summation
 * order and the rotation's cos/sin tables differ; measured below 6e-7 on
 * logits up to 1.4).
 */
#include <dirent.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ktest.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mk_hf_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static void *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    ((char *)b)[*n] = 0;
    fclose(f);
    return b;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static float *params_of(const mk_model *m)
{
    size_t P = mk_model_num_params(m);
    float *p = malloc(P * sizeof(float));
    assert_mk_ok(mk_model_read_params(m, p, 0, P));
    return p;
}

/* ---- the transformers fixtures ----------------------------------------- */

typedef struct fixture {
    const char *name;
    mk_arch arch;
    int untied;
} fixture;

static const fixture fixtures[] = {
    {"f32", MK_ARCH_GPT2, 0},         {"bf16", MK_ARCH_GPT2, 0},
    {"f16", MK_ARCH_GPT2, 0},         {"bf16_sharded", MK_ARCH_GPT2, 0},
    {"llama_f32", MK_ARCH_LLAMA, 1},  {"llama_tied_bf16", MK_ARCH_LLAMA, 0},
    {"qwen2_bf16", MK_ARCH_QWEN2, 0}, {"qwen3_sharded", MK_ARCH_QWEN3, 1},
};

/* The config each fixture's config.json must give (gen_hf_fixtures.py). */
static void check_fixture_config(const fixture *fx, const mk_config *c)
{
    assert_int_equal(c->arch, fx->arch);
    assert_int_equal(c->untied_head, fx->untied);
    assert_int_equal(c->vocab_size, 64);
    if (fx->arch == MK_ARCH_GPT2) {
        assert_int_equal(c->n_embd, 16);
        assert_int_equal(c->n_inner, 64);
        assert_true(c->norm_eps == 1e-5f);
        return;
    }
    assert_int_equal(c->n_layer, 2);
    assert_int_equal(c->n_embd, 16);
    assert_int_equal(c->n_head, 4);
    assert_int_equal(c->n_kv_head, 2);
    assert_int_equal(c->n_inner, 24);
    assert_int_equal(c->block_size, 32);
    assert_int_equal(c->head_dim, fx->arch == MK_ARCH_QWEN3 ? 8 : 4);
    assert_true(c->norm_eps == 1e-6f);
    assert_int_equal(c->attn_bias, !strcmp(fx->name, "llama_f32") || fx->arch == MK_ARCH_QWEN2);
    assert_int_equal(c->attn_out_bias, !strcmp(fx->name, "llama_f32"));
    assert_int_equal(c->mlp_bias, !strcmp(fx->name, "llama_f32"));
    assert_true(c->rope_theta == (strcmp(fx->name, "llama_tied_bf16") ? 10000.0f : 500000.0f));
    if (!strcmp(fx->name, "llama_f32")) {
        assert_true(c->rope_factor == 8.0f);
        assert_true(c->rope_low_freq_factor == 1.0f);
        assert_true(c->rope_high_freq_factor == 4.0f);
        assert_int_equal(c->rope_orig_ctx, 8);
    } else {
        assert_true(c->rope_factor == 0.0f);
    }
}

static void check_fixture(const fixture *fx, float *max_diff)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hf/%s", MK_FIXTURES, fx->name);
    mk_model *m;
    assert_mk_ok(mk_load_dir(&m, path, 1, 16, NULL));
    check_fixture_config(fx, mk_model_config(m));
    snprintf(path, sizeof path, "%s/hf/%s/ref.bin", MK_FIXTURES, fx->name);
    size_t n;
    int32_t *ref = read_all(path, &n);
    assert_non_null(ref);
    int T = ref[0], V = ref[1];
    assert_int_equal(V, mk_model_config(m)->vocab_size);
    assert_int_equal(n, 8 + (size_t)T * 4 + (size_t)T * V * 4);
    const float *want = (const float *)(ref + 2 + T);
    float *got = malloc(sizeof(float) * (size_t)T * V);
    assert_mk_ok(mk_forward(m, ref + 2, 1, T));
    assert_mk_ok(mk_model_read_logits(m, got));
    check_close(got, want, (size_t)T * V, 1e-5, 1e-5, fx->name);
    float md = 0, mx = 0;
    for (int i = 0; i < T * V; i++) {
        md = fmaxf(md, fabsf(got[i] - want[i]));
        mx = fmaxf(mx, fabsf(want[i]));
    }
    fprintf(stderr, "%-16s max |manta - transformers| logit = %.3g (max |logit| %.3g)\n", fx->name,
            md, mx);
    *max_diff = md;
    free(got);
    free(ref);
    mk_model_free(m);
}

static void test_fixtures(void **state)
{
    (void)state;
    float d[sizeof fixtures / sizeof *fixtures];
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++)
        check_fixture(&fixtures[i], &d[i]);

    /* the 16-bit folders hold the F32 weights rounded by torch: rounding here must agree
     * bit for bit, and the loads must be exact (subnormals included) */
    char path[512];
    mk_model *m32, *mb, *mh, *ms;
    snprintf(path, sizeof path, "%s/hf/f32", MK_FIXTURES);
    assert_mk_ok(mk_load_dir(&m32, path, 1, 1, NULL));
    snprintf(path, sizeof path, "%s/hf/bf16", MK_FIXTURES);
    assert_mk_ok(mk_load_dir(&mb, path, 1, 1, NULL));
    snprintf(path, sizeof path, "%s/hf/f16", MK_FIXTURES);
    assert_mk_ok(mk_load_dir(&mh, path, 1, 1, NULL));
    snprintf(path, sizeof path, "%s/hf/bf16_sharded", MK_FIXTURES);
    assert_mk_ok(mk_load_dir(&ms, path, 1, 1, NULL));
    size_t P = mk_model_num_params(m32);
    float *p32 = params_of(m32), *pb = params_of(mb), *ph = params_of(mh), *ps = params_of(ms);
    size_t n_sub = 0;
    for (size_t i = 0; i < P; i++) {
        float wb = mk_bf16_to_f32(mk_f32_to_bf16(p32[i]));
        float wh = mk_f16_to_f32(mk_f32_to_f16(p32[i]));
        if (memcmp(&wb, &pb[i], 4) || memcmp(&wh, &ph[i], 4) || memcmp(&pb[i], &ps[i], 4)) {
            fprintf(stderr,
                    "param %zu: f32 %.9g -> bf16 %.9g (loaded %.9g, sharded %.9g), "
                    "f16 %.9g (loaded %.9g)\n",
                    i, p32[i], wb, pb[i], ps[i], wh, ph[i]);
            fail();
        }
        if (ph[i] != 0 && fabsf(ph[i]) < 6.103515625e-05f) n_sub++;
    }
    assert_true(n_sub >= 2); /* the fixture's F16 subnormals arrived */
    free(p32), free(pb), free(ph), free(ps);
    mk_model_free(m32), mk_model_free(mb), mk_model_free(mh), mk_model_free(ms);

    /* the loaded checkpoint view gives back the file's tensors: q_proj of the sharded Qwen3
     * equals the BF16 values transformers wrote (read through the public view) */
    snprintf(path, sizeof path, "%s/hf/qwen3_sharded", MK_FIXTURES);
    assert_mk_ok(mk_load_dir(&ms, path, 1, 1, NULL));
    mk_tensor_info t;
    for (int i = 0; i < mk_model_num_hf_tensors(ms); i++) {
        assert_mk_ok(mk_model_hf_tensor(ms, i, &t));
        float *x = malloc(sizeof(float) * t.numel);
        assert_mk_ok(mk_model_read_hf(ms, t.name, 0, x));
        for (size_t j = 0; j < t.numel; j++) /* every value a BF16 */
            assert_true(mk_bf16_to_f32(mk_f32_to_bf16(x[j])) == x[j]);
        free(x);
    }
    assert_mk_ok(mk_model_hf_tensor(ms, 1, &t));
    assert_string_equal(t.name, "model.layers.0.self_attn.q_proj.weight");
    assert_int_equal(t.shape[0], 32);
    assert_int_equal(t.shape[1], 16);
    mk_model_free(ms);
}

/* ---- conversions --------------------------------------------------------- */

static void test_conversions(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float b = mk_bf16_to_f32((uint16_t)h), f = mk_f16_to_f32((uint16_t)h);
        uint32_t ub;
        memcpy(&ub, &b, 4);
        assert_int_equal(ub, h << 16); /* bf16 is the top half of a float */
        if (isnan(f)) {
            assert_true((h & 0x7c00) == 0x7c00 && (h & 0x3ff));
            assert_true(isnan(mk_f16_to_f32(mk_f32_to_f16(f))));
            continue;
        }
        assert_int_equal(mk_f32_to_f16(f), h);
        if (!isnan(b)) assert_int_equal(mk_f32_to_bf16(b), h);
        /* the exact value: sign * man * 2^(exp - 25) (subnormals: exp 1) */
        int e = (h >> 10) & 0x1f, man = h & 0x3ff;
        double v = e == 31 ? INFINITY : ldexp(e ? man + 1024 : man, (e ? e : 1) - 25);
        if (h & 0x8000) v = -v;
        assert_true((double)f == v);
    }
    /* rounding: ties to even, overflow, underflow */
    assert_int_equal(mk_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);            /* tie -> even (down) */
    assert_int_equal(mk_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);        /* tie -> even (up) */
    assert_int_equal(mk_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01); /* above the tie */
    assert_int_equal(mk_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(mk_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(mk_f32_to_f16(65520.0f), 0x7c00); /* rounds past the largest: inf */
    assert_int_equal(mk_f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(mk_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(mk_f32_to_f16(0x1p-25f), 0x0000); /* tie -> even: zero */
    assert_int_equal(mk_f32_to_f16(0x1p-25f * 1.5f), 0x0001);
    assert_int_equal(mk_f32_to_f16(3 * 0x1p-25f), 0x0002); /* tie -> even: 2 */
    assert_int_equal(mk_f32_to_f16(-0x1p-14f * 0.5f), 0x8200);
    assert_int_equal(mk_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400); /* rounds up to normal */
    assert_int_equal(mk_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie -> even (down) */
    assert_int_equal(mk_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie -> even (up) */
    assert_int_equal(mk_f32_to_bf16(3.4028235e38f), 0x7f80);      /* overflow: inf */
    assert_int_equal(mk_f32_to_bf16(1e-45f), 0x0000);             /* float subnormal */
    assert_true(isnan(mk_bf16_to_f32(mk_f32_to_bf16(NAN))));
    assert_true(isnan(mk_f16_to_f32(mk_f32_to_f16(NAN))));
    /* the bulk forms agree with the scalar ones value by value, nan and ties included */
    float xs[7] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.4028235e38f, 1e-45f, NAN, -2.5f, 0.1f};
    uint16_t hs[7];
    float back[7];
    mk_f32_to_bf16_n(hs, xs, 7);
    mk_bf16_to_f32_n(back, hs, 7);
    for (int i = 0; i < 7; i++) {
        assert_int_equal(hs[i], mk_f32_to_bf16(xs[i]));
        float w = mk_bf16_to_f32(hs[i]);
        assert_memory_equal(&back[i], &w, sizeof w);
    }
}

/* ---- config.json as transformers reads it --------------------------------- */

static const char *const llama_conf =
    "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24,"
    "\"vocab_size\":64,\"max_position_embeddings\":32%s}";

/* Writes text (a format with one %s, filled by extra) to DIR/name.json and reads it. */
static int read_conf(mk_config *c, int *tied, const char *name, const char *fmt, const char *extra)
{
    char path[512], text[2048];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    snprintf(text, sizeof text, fmt, extra);
    write_text(path, text);
    memset(c, 0x55, sizeof *c);
    return mk_read_hf_config(c, tied, path);
}

static void test_configs(void **state)
{
    (void)state;
    mk_config c;
    int tied;
    /* Llama's defaults: key/value heads = heads, head_dim = hidden / heads, eps 1e-6, theta
     * 10000, untied, no biases */
    assert_mk_ok(read_conf(&c, &tied, "llama_min",
                           "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2,"
                           "\"num_attention_heads\":4,\"intermediate_size\":24,\"vocab_size\":64,"
                           "\"max_position_embeddings\":32%s}",
                           ""));
    assert_int_equal(c.arch, MK_ARCH_LLAMA);
    assert_int_equal(c.n_kv_head, 4);
    assert_int_equal(c.head_dim, 4);
    assert_true(c.norm_eps == 1e-6f && c.rope_theta == 10000.0f && c.rope_factor == 0);
    assert_int_equal(tied, 0);
    assert_int_equal(c.untied_head, 1);
    assert_int_equal(c.attn_bias + c.attn_out_bias + c.mlp_bias, 0);
    /* Qwen3's head_dim defaults to 128 and Qwen2/Qwen3's key/value heads to 32 (a null
     * num_key_value_heads means the heads), as in their config classes */
    assert_mk_ok(read_conf(&c, &tied, "qwen3_hd",
                           "{\"model_type\":\"qwen3\",\"hidden_size\":16,\"num_hidden_layers\":2,"
                           "\"num_attention_heads\":32,\"intermediate_size\":24,\"vocab_size\":"
                           "64,\"max_position_embeddings\":32%s}",
                           ""));
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.n_kv_head, 32);
    assert_mk_ok(read_conf(&c, &tied, "qwen2_kv",
                           "{\"model_type\":\"qwen2\",\"hidden_size\":16,\"num_hidden_layers\":2,"
                           "\"num_attention_heads\":4,\"num_key_value_heads\":null,"
                           "\"intermediate_size\":24,\"vocab_size\":64,"
                           "\"max_position_embeddings\":32%s}",
                           ""));
    assert_int_equal(c.n_kv_head, 4);
    assert_int_equal(c.head_dim, 4);
    assert_int_equal(c.attn_bias, 1);
    assert_int_equal(c.attn_out_bias, 0);
    /* rope: transformers 5's rope_parameters, whose theta wins over a top-level one */
    assert_mk_ok(read_conf(&c, &tied, "rope5", llama_conf,
                           ",\"rope_theta\":1.0,\"rope_parameters\":{\"rope_theta\":500000.0,"
                           "\"rope_type\":\"default\"},\"tie_word_embeddings\":true"));
    assert_true(c.rope_theta == 500000.0f && c.rope_factor == 0);
    assert_int_equal(tied, 1);
    assert_int_equal(c.untied_head, 0);
    /* 4.x: rope_theta at the top, rope_scaling with the old "type" key; the original context
     * defaults to max_position_embeddings and a top-level one wins */
    assert_mk_ok(read_conf(&c, &tied, "rope4", llama_conf,
                           ",\"rope_theta\":500000.0,\"rope_scaling\":{\"type\":\"llama3\","
                           "\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0}"));
    assert_true(c.rope_theta == 500000.0f && c.rope_factor == 32.0f);
    assert_true(c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f);
    assert_int_equal(c.rope_orig_ctx, 32);
    assert_mk_ok(read_conf(&c, &tied, "rope_orig", llama_conf,
                           ",\"original_max_position_embeddings\":16,\"rope_scaling\":null,"
                           "\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                           "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":8}"));
    assert_true(c.rope_theta == 10000.0f && c.rope_factor == 8.0f);
    assert_int_equal(c.rope_orig_ctx, 16);
    /* a Qwen2 window that starts at or above the last layer is never used; so is one with
     * use_sliding_window false (Qwen2.5's configs carry sliding_window 131072) */
    assert_mk_ok(read_conf(&c, &tied, "qwen2_win",
                           "{\"model_type\":\"qwen2\",\"hidden_size\":16,\"num_hidden_layers\":2,"
                           "\"num_attention_heads\":4,\"intermediate_size\":24,\"vocab_size\":64,"
                           "\"num_key_value_heads\":2,\"max_position_embeddings\":32,"
                           "\"use_sliding_window\":true,\"sliding_window\":8%s}",
                           ",\"max_window_layers\":2"));
    assert_mk_ok(read_conf(&c, &tied, "qwen2_nowin",
                           "{\"model_type\":\"qwen2\",\"hidden_size\":16,\"num_hidden_layers\":2,"
                           "\"num_attention_heads\":4,\"intermediate_size\":24,\"vocab_size\":64,"
                           "\"num_key_value_heads\":2,\"max_position_embeddings\":32,"
                           "\"use_sliding_window\":false,\"sliding_window\":8%s}",
                           ",\"max_window_layers\":0"));
    /* swish is transformers' other name for silu; pretraining_tp changes nothing in 5.x */
    assert_mk_ok(read_conf(&c, &tied, "swish", llama_conf,
                           ",\"hidden_act\":\"swish\",\"pretraining_tp\":2"));
    /* GPT-2's own epsilon and MLP width are read */
    assert_mk_ok(read_conf(&c, &tied, "gpt2_eps",
                           "{\"model_type\":\"gpt2\",\"n_layer\":2,\"n_head\":2,\"n_embd\":16,"
                           "\"n_positions\":8,\"vocab_size\":24%s}",
                           ",\"layer_norm_epsilon\":1e-6,\"n_inner\":40"));
    assert_int_equal(c.arch, MK_ARCH_GPT2);
    assert_true(c.norm_eps == 1e-6f);
    assert_int_equal(c.n_inner, 40);
    assert_int_equal(tied, 1);
}

/* ---- save -> load round trips ------------------------------------------ */

static const mk_config cfg = {
    .n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 24};

/* Every family: an untied Llama with every bias and Llama 3 rope scaling, a tied Qwen2, an
 * untied Qwen3 whose head_dim is not hidden / heads. */
static const mk_config llama_cfg = {.n_layer = 2,
                                    .n_head = 4,
                                    .n_embd = 16,
                                    .block_size = 16,
                                    .vocab_size = 24,
                                    .arch = MK_ARCH_LLAMA,
                                    .n_kv_head = 2,
                                    .n_inner = 24,
                                    .rope_theta = 500000.0f,
                                    .untied_head = 1,
                                    .attn_bias = 1,
                                    .attn_out_bias = 1,
                                    .mlp_bias = 1,
                                    .rope_factor = 8.0f,
                                    .rope_low_freq_factor = 1.0f,
                                    .rope_high_freq_factor = 4.0f,
                                    .rope_orig_ctx = 8};
static const mk_config qwen2_cfg = {.n_layer = 2,
                                    .n_head = 4,
                                    .n_embd = 16,
                                    .block_size = 16,
                                    .vocab_size = 24,
                                    .arch = MK_ARCH_QWEN2,
                                    .n_kv_head = 1,
                                    .n_inner = 20};
static const mk_config qwen3_cfg = {.n_layer = 2,
                                    .n_head = 4,
                                    .n_embd = 16,
                                    .block_size = 16,
                                    .vocab_size = 24,
                                    .arch = MK_ARCH_QWEN3,
                                    .n_kv_head = 2,
                                    .head_dim = 8,
                                    .n_inner = 20,
                                    .norm_eps = 1e-5f,
                                    .untied_head = 1};

static void sub(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
    mkdir(out, 0755);
}

/* A model of c with every parameter away from 0 and 1 and distinct. */
static mk_model *random_model(const mk_config *c, uint64_t seed)
{
    mk_model *m;
    assert_mk_ok(mk_model_new(&m, c, 1, 8, NULL));
    mk_model_init(m, seed);
    float *p = params_of(m);
    mk_rng r;
    mk_rng_seed(&r, seed + 1);
    for (size_t i = 0; i < mk_model_num_params(m); i++) p[i] += 0.05f * (mk_rng_uniform(&r) - 0.5f);
    assert_mk_ok(mk_model_write_params(m, p, 0, mk_model_num_params(m)));
    free(p);
    return m;
}

/* Files of folder d and d2 are the same bytes; returns how many there are. */
static int same_files(const char *d, const char *d2)
{
    char f1[512], f2[512];
    DIR *dd = opendir(d);
    assert_non_null(dd);
    int n_files = 0;
    for (struct dirent *de; (de = readdir(dd));) {
        if (de->d_name[0] == '.') continue;
        snprintf(f1, sizeof f1, "%s/%s", d, de->d_name);
        snprintf(f2, sizeof f2, "%s/%s", d2, de->d_name);
        size_t n1, n2;
        void *b1 = read_all(f1, &n1), *b2 = read_all(f2, &n2);
        if (!b1 || !b2) fprintf(stderr, "missing %s or %s\n", f1, f2);
        assert_non_null(b1);
        assert_non_null(b2);
        assert_int_equal(n1, n2);
        assert_memory_equal(b1, b2, n1);
        free(b1), free(b2);
        n_files++;
    }
    closedir(dd);
    return n_files;
}

static void round_trips(const mk_config *c, const char *family, size_t shard_bytes)
{
    mk_model *m = random_model(c, 99);
    size_t P = mk_model_num_params(m);
    float *p = params_of(m);
    static const mk_dtype dts[] = {MK_F32, MK_BF16, MK_F16};
    static const char *const names[] = {"f32", "bf16", "f16"};
    for (int k = 0; k < 3; k++)
        for (int sharded = 0; sharded < 2; sharded++) {
            char d[256], d2[256], f1[512], tmp[64];
            snprintf(tmp, sizeof tmp, "%s_%s%s", family, names[k], sharded ? "_sh" : "");
            sub(d, sizeof d, tmp);
            size_t shard = sharded ? shard_bytes : 0;
            assert_mk_ok(mk_save_dir(m, d, dts[k], shard));
            mk_model *l;
            assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
            assert_memory_equal(mk_model_config(l), mk_model_config(m), sizeof(mk_config));
            float *q = params_of(l);
            for (size_t i = 0; i < P; i++) {
                float w = dts[k] == MK_F32    ? p[i]
                          : dts[k] == MK_BF16 ? mk_bf16_to_f32(mk_f32_to_bf16(p[i]))
                                              : mk_f16_to_f32(mk_f32_to_f16(p[i]));
                if (memcmp(&w, &q[i], 4)) fprintf(stderr, "%s: param %zu differs\n", tmp, i);
                assert_memory_equal(&w, &q[i], 4);
            }
            /* saved again, the loaded model gives the same bytes */
            snprintf(tmp, sizeof tmp, "%s_%s%s_again", family, names[k], sharded ? "_sh" : "");
            sub(d2, sizeof d2, tmp);
            assert_mk_ok(mk_save_dir(l, d2, dts[k], shard));
            int n_files = same_files(d, d2);
            assert_true(sharded ? n_files >= 5 : n_files == 2); /* config, weights, index */
            snprintf(f1, sizeof f1, "%s/model.safetensors.index.json", d);
            assert_int_equal(access(f1, F_OK) == 0, sharded);
            snprintf(f1, sizeof f1, "%s/model.safetensors", d);
            assert_int_equal(access(f1, F_OK) == 0, !sharded);
            free(q);
            mk_model_free(l);
        }
    /* the single F32 file of mk_save, under the same names, loads through mk_load */
    char path[512];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, family);
    assert_mk_ok(mk_save(m, path));
    mk_model *l;
    assert_mk_ok(mk_model_new(&l, c, 1, 8, NULL));
    assert_mk_ok(mk_load(l, path));
    float *q = params_of(l);
    assert_memory_equal(p, q, P * sizeof(float));
    free(q);
    mk_model_free(l);
    free(p);
    mk_model_free(m);
}

static void test_round_trips(void **state)
{
    (void)state;
    round_trips(&cfg, "gpt2", 2000);
    round_trips(&llama_cfg, "llama", 1500);
    round_trips(&qwen2_cfg, "qwen2", 1500);
    round_trips(&qwen3_cfg, "qwen3", 1500);

    mk_model *m = random_model(&cfg, 98);
    /* a sharded save over a single one removes the single file, and back */
    char d[256], f[512];
    sub(d, sizeof d, "relayout");
    assert_mk_ok(mk_save_dir(m, d, MK_F32, 0));
    assert_mk_ok(mk_save_dir(m, d, MK_BF16, 3000));
    snprintf(f, sizeof f, "%s/model.safetensors", d);
    assert_int_equal(access(f, F_OK), -1);
    mk_model *l;
    assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
    mk_model_free(l);
    assert_mk_ok(mk_save_dir(m, d, MK_F16, 0));
    snprintf(f, sizeof f, "%s/model.safetensors.index.json", d);
    assert_int_equal(access(f, F_OK), -1);
    assert_int_equal(mk_save_dir(m, d, (mk_dtype)7, 0), MK_ERR_ARG);
    mk_model_free(m);

    /* a tensor of several conversion chunks (2^18 elements each; the embedding here has
     * 2.1 of them) arrives whole in every dtype */
    const mk_config big = {
        .n_layer = 1, .n_head = 2, .n_embd = 64, .block_size = 8, .vocab_size = 8200};
    m = random_model(&big, 97);
    float *p = params_of(m);
    static const mk_dtype dts[] = {MK_F32, MK_BF16, MK_F16};
    for (int k = 0; k < 3; k++) {
        sub(d, sizeof d, "big");
        assert_mk_ok(mk_save_dir(m, d, dts[k], 0));
        assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
        float *q = params_of(l);
        for (size_t i = 0; i < mk_model_num_params(m); i++) {
            float w = dts[k] == MK_F32    ? p[i]
                      : dts[k] == MK_BF16 ? mk_bf16_to_f32(mk_f32_to_bf16(p[i]))
                                          : mk_f16_to_f32(mk_f32_to_f16(p[i]));
            assert_memory_equal(&w, &q[i], 4);
        }
        free(q);
        mk_model_free(l);
    }
    free(p);
    mk_model_free(m);

    /* a Llama whose q/k/v have biases but o has none has no transformers config */
    mk_config odd = llama_cfg;
    odd.attn_out_bias = 0;
    assert_mk_ok(mk_model_new(&m, &odd, 1, 8, NULL));
    sub(d, sizeof d, "odd");
    assert_int_equal(mk_save_dir(m, d, MK_F32, 0), MK_ERR_UNSUPPORTED);
    assert_non_null(strstr(mk_last_error(), "attention_bias"));
    snprintf(f, sizeof f, "%s/config.json", d);
    assert_int_equal(mk_write_hf_config(&odd, f), MK_ERR_UNSUPPORTED);
    assert_int_equal(access(f, F_OK), -1); /* nothing written */
    mk_model_free(m);
}

/* ---- refusals ------------------------------------------------------------ */

/* The name without a "transformer." or "model." prefix. */
static const char *bare(const char *name)
{
    if (!strncmp(name, "transformer.", 12)) return name + 12;
    if (!strncmp(name, "model.", 6)) return name + 6;
    return name;
}

/* Writes DIR/NAME as BF16 safetensors of m's checkpoint tensors (mk_model_hf_tensor) with one
 * change each: `skip` left out, `reshape` given swapped dims, `odd_tensor` written with dtype
 * odd_dtype (names compared without prefix); names as the model gives them, or with prefix
 * instead of theirs when prefix is set; then `extra` (a name) appended as a copy of the
 * embedding with one element changed when `perturb`; then `cut` bytes cut off the end. */
typedef struct variant {
    const char *skip, *reshape, *odd_tensor, *odd_dtype, *prefix, *extra;
    int perturb;
    long cut;
} variant;

static void write_file(const mk_model *m, const char *path, const variant *v)
{
    char hdr[32768];
    size_t h = 0, off = 0;
    int nt = mk_model_num_hf_tensors(m);
    unsigned char *data = malloc(mk_model_num_params(m) * 2 * 2 + 16);
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i <= nt; i++) {
        mk_tensor_info t;
        assert_mk_ok(mk_model_hf_tensor(m, i < nt ? i : 0, &t));
        float *x = malloc(sizeof(float) * t.numel);
        assert_mk_ok(mk_model_read_hf(m, t.name, 0, x));
        char name[128];
        if (i == nt && !v->extra) {
            free(x);
            break;
        }
        if (i == nt)
            snprintf(name, sizeof name, "%s", v->extra);
        else if (v->prefix)
            snprintf(name, sizeof name, "%s%s", v->prefix, bare(t.name));
        else
            snprintf(name, sizeof name, "%s", t.name);
        if (v->skip && !strcmp(bare(name), v->skip)) {
            free(x);
            continue;
        }
        const char *dt =
            v->odd_tensor && !strcmp(bare(name), v->odd_tensor) ? v->odd_dtype : "BF16";
        char shape[32];
        if (t.ndim == 1)
            snprintf(shape, sizeof shape, "[%d]", t.shape[0]);
        else if (v->reshape && !strcmp(bare(name), v->reshape))
            snprintf(shape, sizeof shape, "[%d,%d]", t.shape[1], t.shape[0]);
        else
            snprintf(shape, sizeof shape, "[%d,%d]", t.shape[0], t.shape[1]);
        h += (size_t)snprintf(hdr + h, sizeof hdr - h,
                              ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                              name, dt, shape, off, off + t.numel * 2);
        for (size_t j = 0; j < t.numel; j++) {
            uint16_t b = mk_f32_to_bf16(x[j]);
            if (i == nt && v->perturb && j == 5) b ^= 1;
            data[off + 2 * j] = (unsigned char)b;
            data[off + 2 * j + 1] = (unsigned char)(b >> 8);
        }
        off += t.numel * 2;
        free(x);
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    assert_true(h < sizeof hdr);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t N = h;
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(N >> (8 * i));
    fwrite(lenb, 1, 8, f);
    fwrite(hdr, 1, h, f);
    fwrite(data, 1, off - (size_t)v->cut, f);
    fclose(f);
    free(data);
}

static const char *good_config = "{\"model_type\":\"gpt2\",\"n_layer\":2,\"n_head\":2,"
                                 "\"n_embd\":16,\"n_positions\":8,\"vocab_size\":24%s}";

/* A folder with config.json holding conf and one variant file. */
static void make_folder_with(const mk_model *m, char *d, size_t n, const char *name,
                             const char *conf, const variant *v)
{
    char path[512];
    sub(d, n, name);
    snprintf(path, sizeof path, "%s/config.json", d);
    write_text(path, conf);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    write_file(m, path, v);
}

/* A GPT-2 folder: good_config plus config_extra, or config_extra after "REPLACE" alone. */
static void make_folder(const mk_model *m, char *d, size_t n, const char *name,
                        const char *config_extra, const variant *v)
{
    char conf[2048];
    if (config_extra && !strncmp(config_extra, "REPLACE", 7))
        snprintf(conf, sizeof conf, "%s", config_extra + 7);
    else
        snprintf(conf, sizeof conf, good_config, config_extra ? config_extra : "");
    make_folder_with(m, d, n, name, conf, v);
}

/* The small rotary config of model_type with the keys of extra (may be "") first: the first
 * of two equal keys is the one read, so extra overrides the rest. */
static const char *rotary_conf(const char *model_type, const char *extra)
{
    static char conf[2048];
    snprintf(conf, sizeof conf,
             "{%s%s\"model_type\":\"%s\",\"hidden_size\":16,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24,"
             "\"vocab_size\":64,\"max_position_embeddings\":32}",
             extra, *extra ? "," : "", model_type);
    return conf;
}

/* mk_load_dir must fail with code, the message naming `file` (inside d) and `needle`. */
static void expect_refusal(const char *d, const char *file, int code, const char *needle)
{
    mk_model *l = (mk_model *)1;
    int rc = mk_load_dir(&l, d, 1, 8, NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", d, file);
    if (rc != code || !strstr(mk_last_error(), needle) || !strstr(mk_last_error(), path)) {
        fprintf(stderr, "want %s mentioning '%s' and %s; got %s: %s\n", mk_strerror(code), needle,
                path, mk_strerror(rc), mk_last_error());
        fail();
    }
    assert_null(l);
    fprintf(stderr, "refused as it should: %s\n", mk_last_error());
}

static void test_refusals(void **state)
{
    (void)state;
    mk_model *m;
    assert_mk_ok(mk_model_new(&m, &cfg, 1, 8, NULL));
    mk_model_init(m, 5);
    char d[256], path[512];
    const variant plain = {0};

    /* accepted: "model." prefix; lm_head equal to wte, also with tie_word_embeddings false */
    variant v = {.prefix = "model."};
    make_folder(m, d, sizeof d, "prefix_model", NULL, &v);
    mk_model *l;
    assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
    mk_model_free(l);
    v = (variant){.extra = "lm_head.weight"};
    make_folder(m, d, sizeof d, "head_equal", ",\"tie_word_embeddings\":false", &v);
    assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
    mk_model_free(l);

    /* config */
    make_folder(m, d, sizeof d, "mistral",
                "REPLACE{\"model_type\":\"mistral\",\"hidden_size\":16,\"num_hidden_layers\":2}",
                &plain);
    expect_refusal(d, "config.json", MK_ERR_UNSUPPORTED, "model_type 'mistral'");
    make_folder(m, d, sizeof d, "relu", ",\"activation_function\":\"relu\"", &plain);
    expect_refusal(d, "config.json", MK_ERR_UNSUPPORTED, "activation_function");
    make_folder(m, d, sizeof d, "inv_idx", ",\"scale_attn_by_inverse_layer_idx\":true", &plain);
    expect_refusal(d, "config.json", MK_ERR_UNSUPPORTED, "scale_attn_by_inverse_layer_idx");
    make_folder(m, d, sizeof d, "no_layers",
                "REPLACE{\"model_type\":\"gpt2\",\"n_head\":2,\"n_embd\":16,\"n_positions\":8,"
                "\"vocab_size\":24}",
                &plain);
    expect_refusal(d, "config.json", MK_ERR_FORMAT, "n_layer");
    make_folder(m, d, sizeof d, "huge",
                "REPLACE{\"model_type\":\"gpt2\",\"n_layer\":2,\"n_head\":2,\"n_embd\":16,"
                "\"n_positions\":3000000000,\"vocab_size\":24}",
                &plain);
    expect_refusal(d, "config.json", MK_ERR_FORMAT, "n_positions");
    make_folder(m, d, sizeof d, "garbage", "REPLACE{\"model_type\":", &plain);
    expect_refusal(d, "config.json", MK_ERR_FORMAT, "not a JSON object");
    /* a GPT-2 MLP width the weights do not have: the config is read, the tensor refused */
    make_folder(m, d, sizeof d, "inner", ",\"n_inner\":40", &plain);
    expect_refusal(d, "model.safetensors", MK_ERR_SHAPE, "transformer.h.0.mlp.c_fc.weight");

    /* tensors */
    v = (variant){.skip = "h.1.mlp.c_fc.bias"};
    make_folder(m, d, sizeof d, "missing", NULL, &v);
    expect_refusal(d, "model.safetensors", MK_ERR_MISSING, "h.1.mlp.c_fc.bias");
    v = (variant){.reshape = "h.0.attn.c_attn.weight", .prefix = "transformer."};
    make_folder(m, d, sizeof d, "shape", NULL, &v);
    expect_refusal(d, "model.safetensors", MK_ERR_SHAPE, "transformer.h.0.attn.c_attn.weight");
    v = (variant){.odd_tensor = "h.0.ln_2.weight", .odd_dtype = "I8"};
    make_folder(m, d, sizeof d, "dtype", NULL, &v);
    expect_refusal(d, "model.safetensors", MK_ERR_DTYPE, "h.0.ln_2.weight");
    v = (variant){.cut = 3};
    make_folder(m, d, sizeof d, "cut", NULL, &v);
    expect_refusal(d, "model.safetensors", MK_ERR_TRUNCATED, "ln_f.bias");
    v = (variant){.extra = "lm_head.weight", .perturb = 1};
    make_folder(m, d, sizeof d, "untied", NULL, &v);
    expect_refusal(d, "model.safetensors", MK_ERR_UNSUPPORTED, "lm_head.weight");
    assert_non_null(strstr(mk_last_error(), "tied"));
    make_folder(m, d, sizeof d, "untied_absent", ",\"tie_word_embeddings\":false", &plain);
    expect_refusal(d, "config.json", MK_ERR_MISSING, "lm_head.weight");

    /* shards: one cut short, one absent, the index lacking a tensor */
    sub(d, sizeof d, "shards");
    assert_mk_ok(mk_save_dir(m, d, MK_BF16, 2000));
    glob_t g;
    snprintf(path, sizeof path, "%s/model-00003-of-*.safetensors", d);
    assert_int_equal(glob(path, 0, NULL, &g), 0);
    snprintf(path, sizeof path, "%s", g.gl_pathv[0]);
    const char *third = strrchr(g.gl_pathv[0], '/') + 1;
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size - 1), 0);
    expect_refusal(d, third, MK_ERR_TRUNCATED, "transformer.h.");
    assert_int_equal(unlink(path), 0);
    expect_refusal(d, third, MK_ERR_IO, "No such file");
    assert_non_null(strstr(mk_last_error(), "the shard of tensor 'transformer.h.0."));
    globfree(&g);
    assert_mk_ok(mk_save_dir(m, d, MK_BF16, 2000));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
    size_t n;
    char *idx = read_all(path, &n), *hit = strstr(idx, "\"transformer.wpe.weight\"");
    assert_non_null(hit);
    memcpy(hit + 1, "xxxxxxxxxxx", 11); /* the key no longer names wpe */
    write_text(path, idx);
    free(idx);
    expect_refusal(d, "model.safetensors.index.json", MK_ERR_MISSING, "wpe.weight");

    /* no weights at all */
    sub(d, sizeof d, "empty");
    snprintf(path, sizeof path, "%s/config.json", d);
    char conf[256];
    snprintf(conf, sizeof conf, good_config, "");
    write_text(path, conf);
    mk_model *none;
    assert_int_equal(mk_load_dir(&none, d, 1, 8, NULL), MK_ERR_IO);
    assert_non_null(strstr(mk_last_error(), "model.safetensors.index.json"));
    mk_model_free(m);
}

/* The rotary families: rotary_conf's model (Llama, untied), and what each refusal names. */
static void test_refusals_rotary(void **state)
{
    (void)state;
    mk_config c = {.n_layer = 2,
                   .n_head = 4,
                   .n_embd = 16,
                   .block_size = 32,
                   .vocab_size = 64,
                   .arch = MK_ARCH_LLAMA,
                   .n_kv_head = 2,
                   .n_inner = 24,
                   .untied_head = 1};
    mk_model *m = random_model(&c, 7);
    char d[256];
    const variant plain = {0};

    /* accepted: bare names (no "model."), and the same model tied with lm_head absent */
    variant v = {.prefix = ""};
    make_folder_with(m, d, sizeof d, "bare", rotary_conf("llama", ""), &v);
    mk_model *l;
    assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
    float *p = params_of(m), *q = params_of(l);
    for (size_t i = 0; i < mk_model_num_params(m); i++)
        assert_true(q[i] == mk_bf16_to_f32(mk_f32_to_bf16(p[i])));
    free(p), free(q);
    mk_model_free(l);

    /* config: each unsupported feature named by its key */
    static const struct {
        const char *name, *model_type, *extra, *needle;
        int code;
    } bad[] = {
        {"gelu", "llama", "\"hidden_act\":\"gelu\"", "hidden_act", MK_ERR_UNSUPPORTED},
        {"yarn", "llama",
         "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"rope_theta\":10000.0}",
         "rope_parameters.rope_type' is 'yarn'", MK_ERR_UNSUPPORTED},
        {"linear", "llama", "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}",
         "rope_scaling.type' is 'linear'", MK_ERR_UNSUPPORTED},
        {"dynamic", "qwen2", "\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2.0}",
         "'dynamic'", MK_ERR_UNSUPPORTED},
        {"llama3_nofactor", "llama",
         "\"rope_parameters\":{\"rope_type\":\"llama3\",\"low_freq_factor\":1.0,"
         "\"high_freq_factor\":4.0}",
         "rope_parameters.factor", MK_ERR_FORMAT},
        {"partial", "llama", "\"partial_rotary_factor\":0.5", "partial_rotary_factor",
         MK_ERR_UNSUPPORTED},
        {"sliding", "qwen2", "\"use_sliding_window\":true,\"max_window_layers\":1",
         "use_sliding_window", MK_ERR_UNSUPPORTED},
        {"sliding_q3", "qwen3", "\"use_sliding_window\":true,\"max_window_layers\":0",
         "use_sliding_window", MK_ERR_UNSUPPORTED},
        {"layer_types", "qwen3", "\"layer_types\":[\"full_attention\",\"sliding_attention\"]",
         "layer_types", MK_ERR_UNSUPPORTED},
        {"moe", "qwen3", "\"num_experts\":8,\"num_experts_per_tok\":2", "num_experts",
         MK_ERR_UNSUPPORTED},
        {"moe_local", "llama", "\"num_local_experts\":4", "num_local_experts", MK_ERR_UNSUPPORTED},
        {"dropout", "llama", "\"attention_dropout\":0.1", "attention_dropout", MK_ERR_UNSUPPORTED},
        {"quant", "llama", "\"quantization_config\":{\"quant_method\":\"gptq\"}",
         "quantization_config", MK_ERR_UNSUPPORTED},
        {"kv", "llama", "\"num_key_value_heads\":3", "n_kv_head 3 does not divide", MK_ERR_FORMAT},
        {"odd_hd", "qwen3", "\"head_dim\":5", "head_dim 5 must be even", MK_ERR_FORMAT},
        {"hd_null", "qwen3", "\"head_dim\":null", "head_dim", MK_ERR_FORMAT},
        {"vocab", "llama", "\"vocab_size\":-3", "vocab_size", MK_ERR_FORMAT},
        {"big", "qwen2", "\"hidden_size\":1e12", "hidden_size", MK_ERR_FORMAT},
        {"tie", "llama", "\"tie_word_embeddings\":\"no\"", "tie_word_embeddings", MK_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        make_folder_with(m, d, sizeof d, bad[i].name, rotary_conf(bad[i].model_type, bad[i].extra),
                         &plain);
        expect_refusal(d, "config.json", bad[i].code, bad[i].needle);
    }
    make_folder_with(m, d, sizeof d, "no_inter",
                     "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":4,\"vocab_size\":64,"
                     "\"max_position_embeddings\":32}",
                     &plain);
    expect_refusal(d, "config.json", MK_ERR_FORMAT, "intermediate_size");

    /* tensors: an untied model without lm_head, a k_proj of the wrong shape, an unknown
     * tensor dtype; a tied config whose file holds a different lm_head */
    v = (variant){.skip = "lm_head.weight"};
    make_folder_with(m, d, sizeof d, "no_head", rotary_conf("llama", ""), &v);
    expect_refusal(d, "model.safetensors", MK_ERR_MISSING, "'lm_head.weight'");
    v = (variant){.reshape = "layers.1.self_attn.k_proj.weight"};
    make_folder_with(m, d, sizeof d, "k_shape", rotary_conf("llama", ""), &v);
    expect_refusal(d, "model.safetensors", MK_ERR_SHAPE,
                   "'model.layers.1.self_attn.k_proj.weight' has shape [16,8], need [8,16]");
    v = (variant){.odd_tensor = "layers.0.mlp.up_proj.weight", .odd_dtype = "F64"};
    make_folder_with(m, d, sizeof d, "f64", rotary_conf("llama", ""), &v);
    expect_refusal(d, "model.safetensors", MK_ERR_DTYPE, "model.layers.0.mlp.up_proj.weight");
    mk_model_free(m);
    c.untied_head = 0;
    m = random_model(&c, 8);
    v = (variant){.extra = "lm_head.weight", .perturb = 1};
    make_folder_with(m, d, sizeof d, "tied_head",
                     rotary_conf("llama", "\"tie_word_embeddings\":true"), &v);
    expect_refusal(d, "model.safetensors", MK_ERR_UNSUPPORTED, "lm_head.weight");
    assert_non_null(strstr(mk_last_error(), "says the head is tied"));
    v = (variant){.extra = "lm_head.weight"};
    make_folder_with(m, d, sizeof d, "tied_equal",
                     rotary_conf("llama", "\"tie_word_embeddings\":true"), &v);
    assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
    mk_model_free(l);
    mk_model_free(m);
}

int main(void)
{
    mk_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test_setup_teardown(test_configs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals_rotary, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
