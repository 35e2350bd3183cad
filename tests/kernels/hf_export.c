/*
 * hf_export.c - writes a checkpoint for check_hf_export.py: a model
 * initialised and trained for a few AdamW steps here, saved as
 * DIR/model.safetensors with DIR/config.json, and the logits this library
 * computes for fixed tokens in DIR/logits.bin (float32 [2, 8, 260]) and the
 * tokens in DIR/tokens.bin (int32 [2, 8]).
 *
 *   kernels_hf_export DIR
 */
#include <stdio.h>
#include <stdlib.h>

#include "manta_kernels.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) {                                                                                 \
            fprintf(stderr, "%s: %s (%s)\n", #x, mk_strerror(rc_), mk_last_error());               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    enum { B = 2, T = 8, V = 260 };
    mk_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 32, .vocab_size = V};
    mk_model *m;
    CHECK(mk_model_new(&m, &cfg, B, T, NULL));
    mk_model_init(m, 77);
    int tok[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 37 + 11) % V, tg[i] = (i * 53 + 5) % V;
    /* a few steps, so that biases and LayerNorm gains are no longer 0 and 1 */
    mk_adamw_params p = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    for (int t = 1; t <= 3; t++) {
        float loss;
        CHECK(mk_forward(m, tok, B, T));
        CHECK(mk_loss_ce(m, tg, NULL, &loss));
        mk_zero_grad(m);
        CHECK(mk_backward(m));
        CHECK(mk_model_step(m, &p, t, NULL));
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", argv[1]);
    CHECK(mk_save(m, path));
    snprintf(path, sizeof path, "%s/config.json", argv[1]);
    CHECK(mk_write_hf_config(&cfg, path));
    float *logits = malloc(sizeof(float) * B * T * V);
    CHECK(mk_forward(m, tok, B, T));
    CHECK(mk_model_read_logits(m, logits));
    snprintf(path, sizeof path, "%s/logits.bin", argv[1]);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(logits, sizeof(float), B * T * V, f) != B * T * V) return 1;
    fclose(f);
    snprintf(path, sizeof path, "%s/tokens.bin", argv[1]);
    f = fopen(path, "wb");
    if (!f || fwrite(tok, sizeof(int), B * T, f) != B * T) return 1;
    fclose(f);
    free(logits);
    mk_model_free(m);
    return 0;
}
