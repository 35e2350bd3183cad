/*
 * test_safetensors.c - checkpoints: a save/load round trip, the Hugging Face
 * names and layout in the written header, and every refusal (missing tensor,
 * wrong shape, wrong dtype, truncated data, truncated or garbage header, no
 * file), each naming the tensor and the file and leaving the model as it was;
 * for the rotary families, transformers' names and layout, the config read
 * back, and mk_load's refusals of 16-bit files and of a head that does not fit.
 * Broken files are written by a small writer here, independent of mk_save.
 */
#include <sys/stat.h>
#include <unistd.h>

#include "ktest.h"

static const mk_config cfg = {
    .n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 13};
static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/mk_st_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

/* Writes a safetensors file holding the model's tensors, with one change:
 * tensor `skip` left out, tensor `reshape` given swapped dims, tensor `f16`
 * written as F16 (half the bytes); then cuts `cut` bytes off the end. */
static void write_variant(mk_model *m, const char *path, const char *skip, const char *reshape,
                          const char *f16, long cut)
{
    char hdr[16384];
    size_t h = 0, off = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < mk_model_num_tensors(m); i++) {
        mk_tensor_info t;
        mk_model_tensor(m, i, &t);
        if (skip && !strcmp(t.name, skip)) continue;
        size_t bytes = t.numel * 4;
        const char *dt = "F32";
        if (f16 && !strcmp(t.name, f16)) bytes /= 2, dt = "F16";
        char shape[32];
        if (t.ndim == 1)
            snprintf(shape, sizeof shape, "[%d]", t.shape[0]);
        else if (reshape && !strcmp(t.name, reshape))
            snprintf(shape, sizeof shape, "[%d,%d]", t.shape[1], t.shape[0]);
        else
            snprintf(shape, sizeof shape, "[%d,%d]", t.shape[0], t.shape[1]);
        h += (size_t)snprintf(hdr + h, sizeof hdr - h,
                              ",\"transformer.%s\":{\"dtype\":\"%s\",\"shape\":%s,"
                              "\"data_offsets\":[%zu,%zu]}",
                              t.name, dt, shape, off, off + bytes);
        off += bytes;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = h;
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, h, f);
    size_t P = mk_model_num_params(m);
    float *buf = malloc(P * 4);
    mk_model_read_params(m, buf, 0, P);
    fwrite(buf, 1, off, f); /* contents do not matter for the refusals */
    free(buf);
    long len = ftell(f);
    fclose(f);
    if (cut) assert_int_equal(truncate(path, len - cut), 0);
}

static void expect_refusal(mk_model *m, const char *path, int code, const char *needle)
{
    size_t P = mk_model_num_params(m);
    float *before = malloc(P * 4), *after = malloc(P * 4);
    mk_model_read_params(m, before, 0, P);
    int rc = mk_load(m, path);
    if (rc != code || !strstr(mk_last_error(), needle) || !strstr(mk_last_error(), path)) {
        fprintf(stderr, "want %s mentioning '%s' and the path; got %s: %s\n", mk_strerror(code),
                needle, mk_strerror(rc), mk_last_error());
        fail();
    }
    mk_model_read_params(m, after, 0, P);
    assert_memory_equal(before, after, P * 4); /* unchanged */
    free(before), free(after);
}

static void test_round_trip(void **state)
{
    mk_model *a, *b;
    assert_mk_ok(mk_model_new(&a, &cfg, 1, 8, NULL));
    assert_mk_ok(mk_model_new(&b, &cfg, 1, 8, NULL));
    mk_model_init(a, 42);
    char path[128];
    path_of(path, sizeof path, "rt.safetensors");
    assert_mk_ok(mk_save(a, path));
    assert_mk_ok(mk_load(b, path));
    size_t P = mk_model_num_params(a);
    assert_int_equal(P, mk_config_num_params(&cfg));
    assert_memory_equal(mk_model_params(a), mk_model_params(b), P * 4);
    /* the header uses GPT2LMHeadModel's names and Conv1D layout, 8-byte aligned data */
    FILE *f = fopen(path, "rb");
    uint64_t n;
    assert_int_equal(fread(&n, 8, 1, f), 1);
    assert_int_equal(n % 8, 0);
    char *hdr = calloc(1, n + 1);
    assert_int_equal(fread(hdr, 1, n, f), n);
    fclose(f);
    assert_non_null(strstr(hdr, "\"format\":\"pt\""));
    assert_non_null(
        strstr(hdr, "\"transformer.h.1.attn.c_attn.weight\":{\"dtype\":\"F32\",\"shape\":[8,24]"));
    assert_non_null(
        strstr(hdr, "\"transformer.h.0.mlp.c_proj.weight\":{\"dtype\":\"F32\",\"shape\":[32,8]"));
    assert_non_null(strstr(hdr, "\"transformer.wte.weight\":{\"dtype\":\"F32\",\"shape\":[13,8]"));
    assert_non_null(strstr(hdr, "\"transformer.ln_f.bias\""));
    free(hdr);
    /* a file from another writer, with the names GPT2LMHeadModel saves, loads too */
    path_of(path, sizeof path, "prefixed.safetensors");
    write_variant(a, path, NULL, NULL, NULL, 0);
    mk_model_init(b, 1);
    assert_mk_ok(mk_load(b, path));
    assert_memory_equal(mk_model_params(a), mk_model_params(b), P * 4);
    /* a config.json for transformers, read back as the same config */
    path_of(path, sizeof path, "config.json");
    assert_mk_ok(mk_write_hf_config(&cfg, path));
    mk_config back, want;
    int tied;
    assert_mk_ok(mk_read_hf_config(&back, &tied, path));
    assert_mk_ok(mk_config_resolve(&cfg, &want));
    assert_memory_equal(&back, &want, sizeof want);
    assert_int_equal(tied, 1);
    mk_model_free(a);
    mk_model_free(b);
}

static void test_refusals(void **state)
{
    mk_model *m;
    assert_mk_ok(mk_model_new(&m, &cfg, 1, 8, NULL));
    mk_model_init(m, 3);
    char path[128];

    path_of(path, sizeof path, "missing.safetensors");
    write_variant(m, path, "h.1.ln_2.bias", NULL, NULL, 0);
    expect_refusal(m, path, MK_ERR_MISSING, "'transformer.h.1.ln_2.bias' is missing");

    path_of(path, sizeof path, "shape.safetensors");
    write_variant(m, path, NULL, "h.0.attn.c_attn.weight", NULL, 0);
    expect_refusal(m, path, MK_ERR_SHAPE, "'transformer.h.0.attn.c_attn.weight' has shape [24,8]");

    path_of(path, sizeof path, "dtype.safetensors");
    write_variant(m, path, NULL, NULL, "h.1.mlp.c_fc.bias", 0);
    expect_refusal(m, path, MK_ERR_DTYPE, "'transformer.h.1.mlp.c_fc.bias' has dtype F16");

    path_of(path, sizeof path, "cut.safetensors");
    write_variant(m, path, NULL, NULL, NULL, 20); /* the last tensor, ln_f.bias, loses 5 floats */
    expect_refusal(m, path, MK_ERR_TRUNCATED, "'transformer.ln_f.bias'");

    path_of(path, sizeof path, "short.safetensors");
    FILE *f = fopen(path, "wb");
    fwrite("\x10\x00\x00", 1, 3, f);
    fclose(f);
    expect_refusal(m, path, MK_ERR_TRUNCATED, "8-byte");

    path_of(path, sizeof path, "hdrcut.safetensors");
    f = fopen(path, "wb");
    uint64_t n = 1000;
    fwrite(&n, 8, 1, f);
    fwrite("{\"a\":", 1, 5, f);
    fclose(f);
    expect_refusal(m, path, MK_ERR_TRUNCATED, "header of 1000 bytes");

    path_of(path, sizeof path, "garbage.safetensors");
    f = fopen(path, "wb");
    const char *g = "{\"wte.weight\": [1, 2, 3]}";
    n = strlen(g);
    fwrite(&n, 8, 1, f);
    fwrite(g, 1, n, f);
    fclose(f);
    expect_refusal(m, path, MK_ERR_FORMAT, "bad header");

    /* more dimensions than the loader keeps is refused by name, not cut short */
    path_of(path, sizeof path, "ninedims.safetensors");
    f = fopen(path, "wb");
    g = "{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
        "\"data_offsets\":[0,4]}}";
    n = strlen(g);
    fwrite(&n, 8, 1, f);
    fwrite(g, 1, n, f);
    fwrite("\0\0\0\0", 1, 4, f);
    fclose(f);
    expect_refusal(m, path, MK_ERR_FORMAT, "shape of tensor wte.weight has more than 8 entries");

    /* metadata nested a million levels deep: refused, not a stack overflow */
    path_of(path, sizeof path, "deep.safetensors");
    f = fopen(path, "wb");
    size_t levels = 1000000;
    n = 20 + 2 * levels;
    fwrite(&n, 8, 1, f);
    fputs("{\"__metadata__\":", f);
    for (size_t i = 0; i < levels; i++) fputc('[', f);
    for (size_t i = 0; i < levels; i++) fputc(']', f);
    fputs("}    ", f);
    fclose(f);
    expect_refusal(m, path, MK_ERR_FORMAT, "nested deeper than 64 levels");

    path_of(path, sizeof path, "absent.safetensors");
    expect_refusal(m, path, MK_ERR_IO, "No such file");

    /* a checkpoint of another size is refused by shape */
    mk_config other = cfg;
    other.vocab_size = 14;
    mk_model *o;
    assert_mk_ok(mk_model_new(&o, &other, 1, 8, NULL));
    path_of(path, sizeof path, "other.safetensors");
    assert_mk_ok(mk_save(o, path));
    expect_refusal(m, path, MK_ERR_SHAPE, "'transformer.wte.weight' has shape [14,8], need [13,8]");
    mk_model_free(o);
    mk_model_free(m);
}

/* The other families: transformers' names and nn.Linear layout in the file, a config that
 * reads back as the same config, and mk_load refusing 16-bit files and a missing lm_head. */
static void test_families(void **state)
{
    mk_config c = {.n_layer = 2,
                   .n_head = 4,
                   .n_embd = 8,
                   .block_size = 8,
                   .vocab_size = 13,
                   .arch = MK_ARCH_QWEN3,
                   .n_kv_head = 2,
                   .head_dim = 6,
                   .n_inner = 12,
                   .rope_theta = 1e6f,
                   .untied_head = 1};
    mk_model *a, *b;
    assert_mk_ok(mk_model_new(&a, &c, 1, 8, NULL));
    assert_mk_ok(mk_model_new(&b, &c, 1, 8, NULL));
    mk_model_init(a, 42);
    char path[128];
    path_of(path, sizeof path, "qwen3.safetensors");
    assert_mk_ok(mk_save(a, path));
    assert_mk_ok(mk_load(b, path));
    size_t P = mk_model_num_params(a);
    assert_memory_equal(mk_model_params(a), mk_model_params(b), P * 4);
    FILE *f = fopen(path, "rb");
    uint64_t n;
    assert_int_equal(fread(&n, 8, 1, f), 1);
    char *hdr = calloc(1, n + 1);
    assert_int_equal(fread(hdr, 1, n, f), n);
    fclose(f);
    /* q_proj [NH hd, C], k_proj [NKV hd, C], gate_proj [I, C], down_proj [C, I] */
    assert_non_null(
        strstr(hdr, "\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[13,8]"));
    assert_non_null(strstr(
        hdr, "\"model.layers.1.self_attn.q_proj.weight\":{\"dtype\":\"F32\",\"shape\":[24,8]"));
    assert_non_null(strstr(
        hdr, "\"model.layers.0.self_attn.k_proj.weight\":{\"dtype\":\"F32\",\"shape\":[12,8]"));
    assert_non_null(
        strstr(hdr, "\"model.layers.0.self_attn.q_norm.weight\":{\"dtype\":\"F32\",\"shape\":[6]"));
    assert_non_null(
        strstr(hdr, "\"model.layers.1.mlp.gate_proj.weight\":{\"dtype\":\"F32\",\"shape\":[12,8]"));
    assert_non_null(
        strstr(hdr, "\"model.layers.1.mlp.down_proj.weight\":{\"dtype\":\"F32\",\"shape\":[8,12]"));
    assert_non_null(strstr(hdr, "\"model.norm.weight\""));
    assert_non_null(strstr(hdr, "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[13,8]"));
    assert_null(strstr(hdr, "layers.0.attn.qkv")); /* no internal name leaks out */
    free(hdr);

    path_of(path, sizeof path, "config.json");
    assert_mk_ok(mk_write_hf_config(&c, path));
    mk_config back, want;
    int tied;
    assert_mk_ok(mk_read_hf_config(&back, &tied, path));
    assert_mk_ok(mk_config_resolve(&c, &want));
    assert_memory_equal(&back, &want, sizeof want);
    assert_int_equal(tied, 0);

    /* mk_load reads F32 only; a 16-bit folder's file is refused by tensor */
    char d[128];
    path_of(d, sizeof d, "bf16");
    mkdir(d, 0755);
    assert_mk_ok(mk_save_dir(a, d, MK_BF16, 0));
    path_of(path, sizeof path, "bf16/model.safetensors");
    expect_refusal(b, path, MK_ERR_DTYPE, "'model.embed_tokens.weight' has dtype BF16, need F32");
    /* a tied model of the same size reads the file (its head is not in the tied map, so
     * lm_head.weight must equal the embedding): refused, naming the head */
    c.untied_head = 0;
    mk_model *t;
    assert_mk_ok(mk_model_new(&t, &c, 1, 8, NULL));
    path_of(path, sizeof path, "qwen3.safetensors");
    expect_refusal(t, path, MK_ERR_UNSUPPORTED, "'lm_head.weight' differs");
    /* and the untied model refuses the tied model's file, which has no lm_head */
    path_of(path, sizeof path, "tied.safetensors");
    assert_mk_ok(mk_save(t, path));
    expect_refusal(b, path, MK_ERR_MISSING, "'lm_head.weight' is missing");
    mk_model_free(t);
    mk_model_free(a);
    mk_model_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_families),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
