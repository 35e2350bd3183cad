/*
 * bench_kernels.c - throughput of the policy kernels against PyTorch.
 *
 *   build/tests/bench/bench_kernels [--threads N] [--reps N] [--quick]
 *
 * Figures, each for a ~0.1M and a ~10M parameter GPT-2 with the byte
 * vocabulary (V = 260):
 *   train_<size>        tokens/s of forward + cross-entropy + backward +
 *                       global-norm clipping + AdamW, batch 8 x 128
 *   decode_<size>_b<B>  tokens/s of batched sampling steps with the KV cache,
 *                       B = 1 and 64 sequences, 16-token prompts, temperature 1
 * The baseline is transformers' GPT2LMHeadModel (eager PyTorch, the same
 * sizes, the same thread count), measured by bench_kernels_torch.py, which
 * this program runs as a subprocess right after measuring each of its own
 * figures, so both see the same load.  Each figure is the best of --reps runs
 * (default 3) on both sides: on a shared machine the best run is the one
 * least disturbed by other processes.  Prints one JSON object per figure and
 * line: {"name", "value", "unit", "baseline", "ratio"}; when torch is not
 * installed, baseline and ratio are null and a note goes to stderr.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "manta_kernels.h"

typedef struct bsize {
    const char *name;
    mk_config cfg;
} bsize;

static const bsize sizes[] = {
    {"0.1M", {.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 128, .vocab_size = 260}},
    {"10M", {.n_layer = 6, .n_head = 6, .n_embd = 384, .block_size = 256, .vocab_size = 260}},
};

static int threads = 2, quick = 0, reps = 3, torch_missing = 0;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) {                                                                                 \
            fprintf(stderr, "%s: %s (%s)\n", #x, mk_strerror(rc_), mk_last_error());               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double bench_train(const mk_config *cfg, int B, int T, int steps)
{
    mk_model *m;
    CHECK(mk_model_new(&m, cfg, B, T, NULL));
    mk_model_init(m, 1);
    int *x = malloc(sizeof(int) * B * T), *y = malloc(sizeof(int) * B * T);
    mk_rng r;
    mk_rng_seed(&r, 2);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)(mk_rng_next(&r) % cfg->vocab_size);
        y[i] = (int)(mk_rng_next(&r) % cfg->vocab_size);
    }
    mk_adamw_params p = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f};
    double t0 = 0;
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) t0 = now(); /* two warm-up steps */
        float loss;
        CHECK(mk_forward(m, x, B, T));
        CHECK(mk_loss_ce(m, y, NULL, &loss));
        mk_zero_grad(m);
        CHECK(mk_backward(m));
        CHECK(mk_model_step(m, &p, s + 1, NULL));
    }
    double tps = (double)B * T * steps / (now() - t0);
    free(x), free(y);
    mk_model_free(m);
    return tps;
}

static double bench_decode(const mk_config *cfg, int S, int prompt, int gen)
{
    mk_model *m;
    mk_decoder *d;
    CHECK(mk_model_new(&m, cfg, 1, 1, NULL));
    mk_model_init(m, 1);
    CHECK(mk_decoder_new(&d, m, S));
    int *slots = malloc(sizeof(int) * S), *tok = malloc(sizeof(int) * S), pr[64];
    float *temp = malloc(sizeof(float) * S), *topp = malloc(sizeof(float) * S);
    float *lps = malloc(sizeof(float) * S), *lpp = malloc(sizeof(float) * S);
    for (int s = 0; s < S; s++) {
        slots[s] = s, temp[s] = 1.0f, topp[s] = 1.0f;
        for (int i = 0; i < prompt; i++) pr[i] = (s * 31 + i * 7) % cfg->vocab_size;
        CHECK(mk_decoder_reset(d, s, (uint64_t)s));
        CHECK(mk_decoder_append(d, s, pr, prompt));
    }
    for (int k = 0; k < 4; k++) CHECK(mk_decoder_step(d, slots, S, temp, topp, tok, lps, lpp));
    double t0 = now();
    for (int k = 0; k < gen; k++) CHECK(mk_decoder_step(d, slots, S, temp, topp, tok, lps, lpp));
    double tps = (double)S * gen / (now() - t0);
    free(slots), free(tok), free(temp), free(topp), free(lps), free(lpp);
    mk_decoder_free(d);
    mk_model_free(m);
    return tps;
}

/* Runs the PyTorch script for one figure; NAN when torch is unavailable. */
static double torch_baseline(const char *name)
{
    if (torch_missing || getenv("BENCH_NO_TORCH")) return NAN;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s --threads %d --reps %d --only %s%s 2>/dev/null",
             BENCH_TORCH_SCRIPT, threads, reps, name, quick ? " --quick" : "");
    FILE *f = popen(cmd, "r");
    if (!f) return NAN;
    char line[512];
    double v = NAN;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "\"value\":");
        if (p) v = strtod(p + 8, NULL);
    }
    int st = pclose(f);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        torch_missing = 1;
        fprintf(stderr, "bench_kernels: torch or transformers not installed; baseline null\n");
    }
    return v;
}

static void report(const char *name, double value, double base)
{
    if (isnan(base))
        printf("{\"name\":\"%s\",\"value\":%.1f,\"unit\":\"tokens/s\",\"baseline\":null,"
               "\"ratio\":null}\n",
               name, value);
    else
        printf("{\"name\":\"%s\",\"value\":%.1f,\"unit\":\"tokens/s\",\"baseline\":%.1f,"
               "\"ratio\":%.3f}\n",
               name, value, base, value / base);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--reps N] [--quick]\n", argv[0]);
            return 2;
        }
    }
    mk_set_threads(threads);
    fprintf(stderr, "bench_kernels: %d threads\n", threads);
    char name[64];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const bsize *s = &sizes[i];
        int big = s->cfg.n_embd > 100;
        snprintf(name, sizeof name, "train_%s", s->name);
        double v = 0;
        for (int r = 0; r < reps; r++)
            v = fmax(v, bench_train(&s->cfg, 8, 128, quick ? (big ? 1 : 3) : (big ? 3 : 10)));
        report(name, v, torch_baseline(name));
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const int batches[2] = {1, 64};
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "decode_%s_b%d", sizes[i].name, batches[k]);
            double v = 0;
            for (int r = 0; r < reps; r++)
                v = fmax(v, bench_decode(&sizes[i].cfg, batches[k], 16, quick ? 16 : 64));
            report(name, v, torch_baseline(name));
        }
    }
    return 0;
}
