/*
 * test_hf_save_dir.c - folders written by mk_save_dir load in transformers:
 * writes F32, BF16 and F16 folders, single and sharded, with Manta's logits
 * for fixed tokens from each folder loaded back, then runs
 * check_hf_save_dir.py on them (AutoModelForCausalLM.from_pretrained, logits
 * within 1e-5).  The Python is $MANTA_PYTHON, default python3; when it cannot
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

int main(void)
{
    const char *py = getenv("MANTA_PYTHON");
    if (!py || !*py) py = "python3";
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch, transformers' >/dev/null 2>&1", py);
    if (system(cmd)) {
        printf("skipped: %s cannot import torch and transformers (set MANTA_PYTHON)\n", py);
        return 77;
    }
    enum { T = 10, V = 50 };
    mk_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 16, .vocab_size = V};
    mk_model *m;
    CHECK(mk_model_new(&m, &cfg, 1, T, NULL));
    mk_model_init(m, 4242);
    /* biases and gains away from 0 and 1, so that every tensor matters */
    size_t P = mk_model_num_params(m);
    float *p = malloc(P * sizeof(float));
    CHECK(mk_model_read_params(m, p, 0, P));
    mk_rng r;
    mk_rng_seed(&r, 7);
    for (size_t i = 0; i < P; i++) p[i] += 0.05f * (mk_rng_uniform(&r) - 0.5f);
    CHECK(mk_model_write_params(m, p, 0, P));
    free(p);
    int tokens[T];
    for (int i = 0; i < T; i++) tokens[i] = (i * 17 + 3) % V;

    char root[] = "/tmp/mk_hfsave_XXXXXX";
    if (!mkdtemp(root)) return 1;
    static const mk_dtype dts[] = {MK_F32, MK_BF16, MK_F16};
    static const char *const names[] = {"f32", "bf16", "f16"};
    int n = snprintf(cmd, sizeof cmd, "'%s' '%s'", py, MK_CHECK_SCRIPT);
    for (int k = 0; k < 3; k++)
        for (int sharded = 0; sharded < 2; sharded++) {
            char d[256];
            snprintf(d, sizeof d, "%s/%s%s", root, names[k], sharded ? "_sharded" : "");
            mkdir(d, 0755);
            CHECK(mk_save_dir(m, d, dts[k], sharded ? 6000 : 0));
            mk_model *l;
            CHECK(mk_load_dir(&l, d, 1, T, NULL));
            float logits[T * V];
            CHECK(mk_forward(l, tokens, 1, T));
            CHECK(mk_model_read_logits(l, logits));
            mk_model_free(l);
            if (write_bin(d, "tokens.bin", tokens, sizeof tokens) ||
                write_bin(d, "logits.bin", logits, sizeof logits))
                return 1;
            n += snprintf(cmd + n, sizeof cmd - (size_t)n, " '%s'", d);
        }
    mk_model_free(m);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return rc == 0 ? 0 : 1;
}
