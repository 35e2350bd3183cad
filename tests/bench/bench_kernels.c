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
 * and for a ~0.5B-parameter Llama-family model (Qwen2.5-0.5B's shape: 24
 * layers, hidden 896, 14 query and 2 key/value heads of 64, SwiGLU 4864,
 * vocabulary 151936, tied head; random weights written as a BF16 Hugging
 * Face folder first):
 * Two models of it are measured, one after the other.  A rollout's: inference
 * only with bfloat16 weights (MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS:
 * products with bfloat16 weights widened in registers, float activations
 * and sums), "weights":"bf16", against PyTorch with the model in bfloat16
 * AND in float32, each on its own line ("baseline_dtype"):
 *   load_llama0.5B_rollout          seconds of mk_load_dir_ex (BF16 folder ->
 *                                   float parameters + bfloat16 copies);
 *                                   ratio = speed-up
 *   decode_llama0.5B_b<B>_bf16      tokens/s, B = 1 and 16, 16-token prompts,
 *                                   against PyTorch bfloat16
 *   decode_llama0.5B_b<B>_bf16_products  the same with bfloat16 products too
 *                                   (MK_MODEL_BF16_PRODUCTS: activations rounded,
 *                                   AMX tiles where the CPU has them), against
 *                                   PyTorch bfloat16 (which also multiplies in
 *                                   bfloat16: the like-for-like figure)
 *   decode_llama0.5B_b<B>_bf16_vs_f32   the bf16-weight figure against PyTorch float32
 *   mem_llama0.5B_rollout           peak resident MB after loading and
 *                                   decoding; ratio = baseline / value
 * and a learner's: trainable, float weights ("f32"), against PyTorch float32:
 *   load_llama0.5B          seconds of mk_load_dir (BF16 -> float)
 *   decode_llama0.5B_b<B>   tokens/s with the float weights
 *   train_llama0.5B         tokens/s of one step on 4 x 256 tokens
 *   mem_llama0.5B           peak resident MB of the whole run
 * (--no-llama skips these: they need ~12 GB and minutes on 2 cores;
 * --only-llama runs only these.)
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
#include <sys/resource.h>
#include <sys/stat.h>
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

static int threads = 2, quick = 0, reps = 3, torch_missing = 0, llama = 1, gpt2 = 1;
static const char *llama_dir = "/tmp/manta_bench_llama0.5B";

/* The Llama-family configuration (Qwen2.5-0.5B's sizes, no biases). */
static const mk_config llama_cfg = {.n_layer = 24,
                                    .n_head = 14,
                                    .n_embd = 896,
                                    .block_size = 4096,
                                    .vocab_size = 151936,
                                    .arch = MK_ARCH_LLAMA,
                                    .n_kv_head = 2,
                                    .head_dim = 64,
                                    .n_inner = 4864,
                                    .norm_eps = 1e-6f,
                                    .rope_theta = 1000000.0f};

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

/* Runs a PyTorch script for one figure; NAN when torch is unavailable.  The interpreter is
 * $MANTA_PYTHON, else python3. */
static double torch_run(const char *script, const char *name, const char *extra)
{
    if (torch_missing || getenv("BENCH_NO_TORCH")) return NAN;
    const char *py = getenv("MANTA_PYTHON") ? getenv("MANTA_PYTHON") : "python3";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s --threads %d --reps %d --only %s%s %s 2>/dev/null", py, script,
             threads, reps, name, quick ? " --quick" : "", extra);
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

static double torch_baseline(const char *name)
{
    return torch_run(BENCH_TORCH_SCRIPT, name, "");
}

/* Writes the random-weight BF16 folder once (kept across runs: it is the same every time). */
static void llama_folder(void)
{
    char cfgp[512];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", llama_dir);
    struct stat st;
    if (stat(cfgp, &st) == 0) return;
    mkdir(llama_dir, 0755);
    mk_model *m;
    CHECK(mk_model_new(&m, &llama_cfg, 1, 1, NULL));
    mk_model_init(m, 7);
    CHECK(mk_save_dir(m, llama_dir, MK_BF16, 0));
    mk_model_free(m);
}

/* Best tokens/s over `reps` runs of `gen` decoding steps of n slots (16-token prompts,
 * temperature 1) on a decoder of model m. */
static double llama_decode(mk_model *m, int n, int prompt, int gen)
{
    mk_decoder *d;
    CHECK(mk_decoder_new_ctx(&d, m, n, 256));
    int slots[16], tok[16], pr[16];
    float temp[16], topp[16], lps[16], lpp[16];
    double best = 0;
    for (int rep = 0; rep < reps; rep++) {
        for (int s = 0; s < n; s++) {
            slots[s] = s, temp[s] = 1.0f, topp[s] = 1.0f;
            for (int i = 0; i < prompt; i++) pr[i] = (s * 7919 + i * 104729) % llama_cfg.vocab_size;
            CHECK(mk_decoder_reset(d, s, (uint64_t)s));
            CHECK(mk_decoder_append(d, s, pr, prompt));
        }
        CHECK(mk_decoder_step(d, slots, n, temp, topp, tok, lps, lpp)); /* warm-up */
        double t1 = now();
        for (int g = 0; g < gen; g++)
            CHECK(mk_decoder_step(d, slots, n, temp, topp, tok, lps, lpp));
        best = fmax(best, (double)n * gen / (now() - t1));
    }
    mk_decoder_free(d);
    return best;
}

/* One JSON line of the Llama figures: what each side ran (ours: "f32" weights, or "bf16"
 * weights with float activations; PyTorch: the model's dtype) beside the numbers. */
static void report_llama(const char *name, double value, const char *unit, const char *ours,
                         const char *theirs, double base, double ratio)
{
    printf("{\"name\":\"%s\",\"value\":%.3f,\"unit\":\"%s\",\"weights\":\"%s\","
           "\"baseline_dtype\":\"%s\",",
           name, value, unit, ours, theirs);
    if (isnan(base))
        printf("\"baseline\":null,\"ratio\":null}\n");
    else
        printf("\"baseline\":%.3f,\"ratio\":%.3f}\n", base, ratio);
    fflush(stdout);
}

static void bench_llama(void)
{
    int B = 4, T = 256, S = 16, prompt = 16, gen = quick ? 4 : 16;
    const int batches[2] = {1, S};
    char f32[600], b16[600];
    snprintf(f32, sizeof f32, "--dir %s --dtype float32", llama_dir);
    snprintf(b16, sizeof b16, "--dir %s --dtype bfloat16", llama_dir);
    llama_folder();
    /* Manta's figures first, each model freed before the next and before PyTorch's runs
     * (both at once would need twice the memory).  1. A rollout's model: inference only,
     * bfloat16 weights (MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS); the peak resident memory
     * after it is the rollout's. */
    double t0 = now();
    mk_model *m;
    CHECK(mk_load_dir_ex(&m, llama_dir, 1, 1, NULL, MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS));
    double load_b16 = now() - t0, dec_b16[2];
    fprintf(stderr, "bench_kernels: llama0.5B has %zu parameters\n", mk_model_num_params(m));
    for (int k = 0; k < 2; k++) dec_b16[k] = llama_decode(m, batches[k], prompt, gen);
    mk_model_free(m);
    /* 1b. The same with bfloat16 products (activations rounded too: AMX where the CPU has it) */
    double dec_b16x[2];
    CHECK(mk_load_dir_ex(&m, llama_dir, 1, 1, NULL,
                         MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS | MK_MODEL_BF16_PRODUCTS));
    for (int k = 0; k < 2; k++) dec_b16x[k] = llama_decode(m, batches[k], prompt, gen);
    mk_model_free(m);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mb_rollout = ru.ru_maxrss / 1024.0;
    /* 2. A learner's model: trainable, float weights; decoding with it too (float against
     * float), then the training step. */
    t0 = now();
    CHECK(mk_load_dir(&m, llama_dir, B, T, NULL));
    double load = now() - t0, dec[2];
    for (int k = 0; k < 2; k++) dec[k] = llama_decode(m, batches[k], prompt, gen);
    int *x = malloc(sizeof(int) * B * T), *y = malloc(sizeof(int) * B * T);
    mk_rng r;
    mk_rng_seed(&r, 2);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)(mk_rng_next(&r) % llama_cfg.vocab_size);
        y[i] = (int)(mk_rng_next(&r) % llama_cfg.vocab_size);
    }
    mk_adamw_params p = {1e-5f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f};
    double train = 0;
    for (int s = 0; s < (quick ? 2 : 3); s++) {
        double t1 = now();
        float loss;
        CHECK(mk_forward(m, x, B, T));
        CHECK(mk_loss_ce(m, y, NULL, &loss));
        mk_zero_grad(m);
        CHECK(mk_backward(m));
        CHECK(mk_model_step(m, &p, s + 1, NULL));
        double tps = (double)B * T / (now() - t1);
        if (s > 0 && tps > train) train = tps; /* the first step is the warm-up */
    }
    free(x), free(y);
    mk_model_free(m);
    getrusage(RUSAGE_SELF, &ru);
    double mb = ru.ru_maxrss / 1024.0;

    /* the rollout's figures against PyTorch in bfloat16 and in float32 */
    double tb = torch_run(BENCH_LLAMA_SCRIPT, "load_llama0.5B", b16);
    report_llama("load_llama0.5B_rollout", load_b16, "s", "bf16", "bfloat16", tb, tb / load_b16);
    for (int k = 0; k < 2; k++) {
        char name[64], tname[64];
        snprintf(tname, sizeof tname, "decode_llama0.5B_b%d", batches[k]);
        snprintf(name, sizeof name, "decode_llama0.5B_b%d_bf16", batches[k]);
        double base = torch_run(BENCH_LLAMA_SCRIPT, tname, b16);
        report_llama(name, dec_b16[k], "tokens/s", "bf16", "bfloat16", base, dec_b16[k] / base);
        snprintf(name, sizeof name, "decode_llama0.5B_b%d_bf16_products", batches[k]);
        report_llama(name, dec_b16x[k], "tokens/s", "bf16_products", "bfloat16", base,
                     dec_b16x[k] / base);
        snprintf(name, sizeof name, "decode_llama0.5B_b%d_bf16_vs_f32", batches[k]);
        base = torch_run(BENCH_LLAMA_SCRIPT, tname, f32);
        report_llama(name, dec_b16[k], "tokens/s", "bf16", "float32", base, dec_b16[k] / base);
    }
    double bm = torch_run(BENCH_LLAMA_SCRIPT, "mem_rollout_llama0.5B", b16);
    report_llama("mem_llama0.5B_rollout", mb_rollout, "MB", "bf16", "bfloat16", bm,
                 bm / mb_rollout);
    /* the learner's figures against PyTorch in float32 */
    tb = torch_run(BENCH_LLAMA_SCRIPT, "load_llama0.5B", f32);
    report_llama("load_llama0.5B", load, "s", "f32", "float32", tb, tb / load);
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "decode_llama0.5B_b%d", batches[k]);
        double base = torch_run(BENCH_LLAMA_SCRIPT, name, f32);
        report_llama(name, dec[k], "tokens/s", "f32", "float32", base, dec[k] / base);
    }
    double base = torch_run(BENCH_LLAMA_SCRIPT, "train_llama0.5B", f32);
    report_llama("train_llama0.5B", train, "tokens/s", "f32", "float32", base, train / base);
    bm = torch_run(BENCH_LLAMA_SCRIPT, "mem_llama0.5B", f32);
    report_llama("mem_llama0.5B", mb, "MB", "f32", "float32", bm, bm / mb);
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
        else if (!strcmp(argv[i], "--no-llama"))
            llama = 0;
        else if (!strcmp(argv[i], "--only-llama"))
            gpt2 = 0;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--threads N] [--reps N] [--quick] [--no-llama | --only-llama]\n",
                    argv[0]);
            return 2;
        }
    }
    mk_set_threads(threads);
    fprintf(stderr, "bench_kernels: %d threads\n", threads);
    char name[64];
    for (size_t i = 0; gpt2 && i < sizeof sizes / sizeof sizes[0]; i++) {
        const bsize *s = &sizes[i];
        int big = s->cfg.n_embd > 100;
        snprintf(name, sizeof name, "train_%s", s->name);
        double v = 0;
        for (int r = 0; r < reps; r++)
            v = fmax(v, bench_train(&s->cfg, 8, 128, quick ? (big ? 1 : 3) : (big ? 3 : 10)));
        report(name, v, torch_baseline(name));
    }
    for (size_t i = 0; gpt2 && i < sizeof sizes / sizeof sizes[0]; i++) {
        const int batches[2] = {1, 64};
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "decode_%s_b%d", sizes[i].name, batches[k]);
            double v = 0;
            for (int r = 0; r < reps; r++)
                v = fmax(v, bench_decode(&sizes[i].cfg, batches[k], 16, quick ? 16 : 64));
            report(name, v, torch_baseline(name));
        }
    }
    if (llama) bench_llama();
    return 0;
}
