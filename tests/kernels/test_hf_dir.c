/*
 * test_hf_dir.c - Hugging Face folders: the four committed fixtures written
 * by transformers (gen_hf_fixtures.py: F32, BF16, F16, sharded BF16) load
 * with mk_load_dir and give transformers' logits; the loaded 16-bit weights
 * equal the F32 fixture's rounded here (so our rounding is torch's and the
 * upcast is exact); the conversions over all 65536 16-bit patterns; save ->
 * load -> save round trips, bit-exact, for each dtype, single and sharded;
 * and the refusals (config, missing tensor, wrong shape, unknown dtype,
 * truncated shard, index without the tensor, untied head), each naming the
 * file and the tensor or key.  Broken folders are written by a small writer
 * here, independent of mk_save_dir.
 *
 * Tolerance against transformers' float32 logits: 1e-5 absolute + 1e-5
 * relative (the weights are identical floats; only summation order differs).
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

static void check_fixture(const char *name, float *max_diff)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hf/%s", MK_FIXTURES, name);
    mk_model *m;
    assert_mk_ok(mk_load_dir(&m, path, 1, 16, NULL));
    snprintf(path, sizeof path, "%s/hf/%s/ref.bin", MK_FIXTURES, name);
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
    check_close(got, want, (size_t)T * V, 1e-5, 1e-5, name);
    float md = 0;
    for (int i = 0; i < T * V; i++) md = fmaxf(md, fabsf(got[i] - want[i]));
    fprintf(stderr, "%-13s max |manta - transformers| logit = %.3g\n", name, md);
    *max_diff = md;
    free(got);
    free(ref);
    mk_model_free(m);
}

static void test_fixtures(void **state)
{
    (void)state;
    float d[4];
    check_fixture("f32", &d[0]);
    check_fixture("bf16", &d[1]);
    check_fixture("f16", &d[2]);
    check_fixture("bf16_sharded", &d[3]);

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
}

/* ---- save -> load round trips ------------------------------------------ */

static const mk_config cfg = {
    .n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 24};

static void sub(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
    mkdir(out, 0755);
}

static void test_round_trips(void **state)
{
    (void)state;
    mk_model *m;
    assert_mk_ok(mk_model_new(&m, &cfg, 1, 8, NULL));
    mk_model_init(m, 99);
    size_t P = mk_model_num_params(m);
    float *p = params_of(m);
    static const mk_dtype dts[] = {MK_F32, MK_BF16, MK_F16};
    static const char *const names[] = {"f32", "bf16", "f16"};
    for (int k = 0; k < 3; k++)
        for (int sharded = 0; sharded < 2; sharded++) {
            char d[256], d2[256], f1[512], f2[512], tmp[64];
            snprintf(tmp, sizeof tmp, "%s%s", names[k], sharded ? "_sh" : "");
            sub(d, sizeof d, tmp);
            size_t shard = sharded ? 2000 : 0;
            assert_mk_ok(mk_save_dir(m, d, dts[k], shard));
            mk_model *l;
            assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
            assert_memory_equal(mk_model_config(l), &cfg, sizeof cfg);
            float *q = params_of(l);
            for (size_t i = 0; i < P; i++) {
                float w = dts[k] == MK_F32    ? p[i]
                          : dts[k] == MK_BF16 ? mk_bf16_to_f32(mk_f32_to_bf16(p[i]))
                                              : mk_f16_to_f32(mk_f32_to_f16(p[i]));
                assert_memory_equal(&w, &q[i], 4);
            }
            /* saved again, the loaded model gives the same bytes */
            snprintf(tmp, sizeof tmp, "%s%s_again", names[k], sharded ? "_sh" : "");
            sub(d2, sizeof d2, tmp);
            assert_mk_ok(mk_save_dir(l, d2, dts[k], shard));
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
            assert_true(sharded ? n_files >= 5 : n_files == 2); /* config, weights, index */
            snprintf(f1, sizeof f1, "%s/model.safetensors.index.json", d);
            assert_int_equal(access(f1, F_OK) == 0, sharded);
            snprintf(f1, sizeof f1, "%s/model.safetensors", d);
            assert_int_equal(access(f1, F_OK) == 0, !sharded);
            free(q);
            mk_model_free(l);
        }
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
    free(p);
    mk_model_free(m);
}

/* ---- refusals ------------------------------------------------------------ */

/* Writes DIR/NAME as BF16 safetensors of m's tensors with one change each: `skip` left out,
 * `reshape` given swapped dims, `dtype` written with that dtype string, names prefixed by
 * prefix; then `extra` (a name) appended as a copy of wte with one element changed when
 * `perturb`; then `cut` bytes cut off the end. */
typedef struct variant {
    const char *skip, *reshape, *odd_tensor, *odd_dtype, *prefix, *extra;
    int perturb;
    long cut;
} variant;

static void write_file(const mk_model *m, const char *path, const variant *v)
{
    char hdr[16384];
    size_t h = 0, off = 0;
    int nt = mk_model_num_tensors(m);
    float *p = params_of(m);
    unsigned char *data = malloc(mk_model_num_params(m) * 2 * 2 + 16);
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i <= nt; i++) {
        mk_tensor_info t;
        mk_model_tensor(m, i < nt ? i : 0, &t);
        const float *x = p + t.offset;
        if (i == nt) {
            if (!v->extra) break;
            snprintf(t.name, sizeof t.name, "%s", v->extra);
        }
        if (v->skip && !strcmp(t.name, v->skip)) continue;
        const char *dt = v->odd_tensor && !strcmp(t.name, v->odd_tensor) ? v->odd_dtype : "BF16";
        char shape[32];
        if (t.ndim == 1)
            snprintf(shape, sizeof shape, "[%d]", t.shape[0]);
        else if (v->reshape && !strcmp(t.name, v->reshape))
            snprintf(shape, sizeof shape, "[%d,%d]", t.shape[1], t.shape[0]);
        else
            snprintf(shape, sizeof shape, "[%d,%d]", t.shape[0], t.shape[1]);
        h +=
            (size_t)snprintf(hdr + h, sizeof hdr - h,
                             ",\"%s%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                             v->prefix ? v->prefix : "", t.name, dt, shape, off, off + t.numel * 2);
        for (size_t j = 0; j < t.numel; j++) {
            uint16_t b = mk_f32_to_bf16(x[j]);
            if (i == nt && v->perturb && j == 5) b ^= 1;
            data[off + 2 * j] = (unsigned char)b;
            data[off + 2 * j + 1] = (unsigned char)(b >> 8);
        }
        off += t.numel * 2;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
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
    free(p);
}

static const char *good_config = "{\"model_type\":\"gpt2\",\"n_layer\":2,\"n_head\":2,"
                                 "\"n_embd\":16,\"n_positions\":8,\"vocab_size\":24%s}";

/* A folder with a config (good_config plus `config_extra`) and one variant file. */
static void make_folder(const mk_model *m, char *d, size_t n, const char *name,
                        const char *config_extra, const variant *v)
{
    char path[512], conf[1024];
    sub(d, n, name);
    snprintf(path, sizeof path, "%s/config.json", d);
    if (config_extra && !strncmp(config_extra, "REPLACE", 7))
        snprintf(conf, sizeof conf, "%s", config_extra + 7);
    else
        snprintf(conf, sizeof conf, good_config, config_extra ? config_extra : "");
    write_text(path, conf);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    write_file(m, path, v);
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
    v = (variant){.prefix = "transformer.", .extra = "lm_head.weight"};
    make_folder(m, d, sizeof d, "head_equal", ",\"tie_word_embeddings\":false", &v);
    assert_mk_ok(mk_load_dir(&l, d, 1, 8, NULL));
    mk_model_free(l);

    /* config */
    make_folder(m, d, sizeof d, "llama",
                "REPLACE{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2}",
                &plain);
    expect_refusal(d, "config.json", MK_ERR_UNSUPPORTED, "model_type 'llama'");
    make_folder(m, d, sizeof d, "relu", ",\"activation_function\":\"relu\"", &plain);
    expect_refusal(d, "config.json", MK_ERR_UNSUPPORTED, "activation_function");
    make_folder(m, d, sizeof d, "inv_idx", ",\"scale_attn_by_inverse_layer_idx\":true", &plain);
    expect_refusal(d, "config.json", MK_ERR_UNSUPPORTED, "scale_attn_by_inverse_layer_idx");
    make_folder(m, d, sizeof d, "eps", ",\"layer_norm_epsilon\":1e-6", &plain);
    expect_refusal(d, "config.json", MK_ERR_UNSUPPORTED, "layer_norm_epsilon");
    make_folder(m, d, sizeof d, "inner", ",\"n_inner\":40", &plain);
    expect_refusal(d, "config.json", MK_ERR_UNSUPPORTED, "n_inner");
    make_folder(m, d, sizeof d, "no_layers",
                "REPLACE{\"model_type\":\"gpt2\",\"n_head\":2,\"n_embd\":16,\"n_positions\":8,"
                "\"vocab_size\":24}",
                &plain);
    expect_refusal(d, "config.json", MK_ERR_FORMAT, "n_layer");
    make_folder(m, d, sizeof d, "garbage", "REPLACE{\"model_type\":", &plain);
    expect_refusal(d, "config.json", MK_ERR_FORMAT, "not a JSON object");

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

int main(void)
{
    mk_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test_setup_teardown(test_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
