/*
 * test_hf_save_dir.c - folders written by mk_save_dir load in transformers:
 * for each family (GPT-2 with an MLP width and epsilon of its own; an untied
 * Llama with every bias and Llama 3 rope scaling; a tied Qwen2; an untied
 * Qwen3) writes F32, BF16 and F16 folders, single and sharded, with Manta's
 * logits for fixed tokens from each folder loaded back, then runs
 * check_hf_save_dir.py on them (AutoModelForCausalLM.from_pretrained builds
 * the family's class in the saved dtype, tied as saved, and gives the same
 * logits).  The Python is $MANTA_PYTHON, default python3; when it cannot
 * `import torch, transformers` the test is skipped (exit 77).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "manta_kernels.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) {                                                                                 \
            fprintf(stderr, "%s: %s (%s)\n", #x, mk_strerror(rc_), mk_last_error());               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int write_bin(const char *dir, const char *name, const void *p, size_t bytes)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, bytes, f) == bytes;
    if (f) ok = (fclose(f) == 0) && ok;
    return ok ? 0 : -1;
}

/* A model of cfg with every parameter moved a little (biases and gains away from 0 and 1, so
 * that every tensor matters).  NULL on failure (reported). */
static mk_model *make_model(const mk_config *cfg, int T, uint64_t seed)
{
    mk_model *m;
    int rc = mk_model_new(&m, cfg, 1, T, NULL);
    if (rc) {
        fprintf(stderr, "mk_model_new: %s (%s)\n", mk_strerror(rc), mk_last_error());
        return NULL;
    }
    mk_model_init(m, seed);
    size_t P = mk_model_num_params(m);
    float *p = malloc(P * sizeof(float));
    mk_rng r;
    mk_rng_seed(&r, seed + 1);
    if (!p || mk_model_read_params(m, p, 0, P)) {
        fprintf(stderr, "cannot read the parameters\n");
        exit(1);
    }
    /* the init's 0.02 weights give near-uniform logits: scale them up so logits differ */
    for (size_t i = 0; i < P; i++) p[i] = 4 * p[i] + 0.1f * (mk_rng_uniform(&r) - 0.5f);
    if (mk_model_write_params(m, p, 0, P)) exit(1);
    free(p);
    return m;
}

typedef struct family {
    const char *tag;   /* folder name prefix */
    const char *klass; /* the class transformers must build */
    mk_config cfg;
} family;

int main(void)
{
    const char *py = getenv("MANTA_PYTHON");
    if (!py || !*py) py = "python3";
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch, transformers' >/dev/null 2>&1", py);
    if (system(cmd)) {
        printf("skipped: %s cannot import torch and transformers (set MANTA_PYTHON)\n", py);
        return 77;
    }
    enum { T = 10, V = 50 };
    /* GPT-2 with its own MLP width and epsilon; an untied Llama with every bias and Llama 3 rope
     * scaling (T and the original context make both scaled and smoothed frequencies matter); a tied
     * Qwen2; an untied Qwen3 whose head_dim is not hidden / heads */
    const family fams[] = {
        {"gpt2",
         "GPT2LMHeadModel",
         {.n_layer = 2,
          .n_head = 4,
          .n_embd = 32,
          .block_size = 16,
          .vocab_size = V,
          .n_inner = 80,
          .norm_eps = 1e-6f}},
        {"llama",
         "LlamaForCausalLM",
         {.n_layer = 2,
          .n_head = 4,
          .n_embd = 32,
          .block_size = 16,
          .vocab_size = V,
          .arch = MK_ARCH_LLAMA,
          .n_kv_head = 2,
          .n_inner = 40,
          .rope_theta = 500000.0f,
          .untied_head = 1,
          .attn_bias = 1,
          .attn_out_bias = 1,
          .mlp_bias = 1,
          .rope_factor = 8.0f,
          .rope_low_freq_factor = 1.0f,
          .rope_high_freq_factor = 4.0f,
          .rope_orig_ctx = 4}},
        {"qwen2",
         "Qwen2ForCausalLM",
         {.n_layer = 2,
          .n_head = 4,
          .n_embd = 32,
          .block_size = 16,
          .vocab_size = V,
          .arch = MK_ARCH_QWEN2,
          .n_kv_head = 1,
          .n_inner = 48,
          .rope_theta = 1e6f}},
        {"qwen3",
         "Qwen3ForCausalLM",
         {.n_layer = 2,
          .n_head = 4,
          .n_embd = 32,
          .block_size = 16,
          .vocab_size = V,
          .arch = MK_ARCH_QWEN3,
          .n_kv_head = 2,
          .head_dim = 16,
          .n_inner = 40,
          .untied_head = 1}},
    };
    int tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 17 + 3) % V;

    char root[] = "/tmp/mk_hfsave_XXXXXX";
    if (!mkdtemp(root)) return 1;
    static const mk_dtype dts[] = {MK_F32, MK_BF16, MK_F16};
    static const char *const names[] = {"f32", "bf16", "f16"};
    int n = snprintf(cmd, sizeof cmd, "'%s' '%s'", py, MK_CHECK_SCRIPT);
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        mk_model *m = make_model(&fams[f].cfg, T, 4242 + f);
        if (!m) return 1;
        for (int k = 0; k < 3; k++)
            for (int sharded = 0; sharded < 2; sharded++) {
                char d[256];
                snprintf(d, sizeof d, "%s/%s_%s%s", root, fams[f].tag, names[k],
                         sharded ? "_sharded" : "");
                mkdir(d, 0755);
                CHECK(mk_save_dir(m, d, dts[k], sharded ? 6000 : 0));
                mk_model *l;
                CHECK(mk_load_dir(&l, d, 1, T, NULL));
                float logits[T * V];
                CHECK(mk_forward(l, tokens, 1, T));
                CHECK(mk_model_read_logits(l, logits));
                mk_model_free(l);
                char expect[128];
                snprintf(expect, sizeof expect, "%s %s %d\n", fams[f].klass, names[k],
                         !fams[f].cfg.untied_head);
                if (write_bin(d, "tokens.bin", tokens, sizeof tokens) ||
                    write_bin(d, "logits.bin", logits, sizeof logits) ||
                    write_bin(d, "expect.txt", expect, strlen(expect)))
                    return 1;
                n += snprintf(cmd + n, sizeof cmd - (size_t)n, " '%s'", d);
            }
        mk_model_free(m);
    }
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return rc == 0 ? 0 : 1;
}
