/*
 * bench_gpu.c - the policy on one CUDA device against PyTorch on the same device.
 *
 *   build/tests/bench/bench_gpu [--only-gpt2 | --only-llama] [--quick] [--bf16-weights]
 *                               [--bf16-kv] [--math fp32|tf32|bf16] [--cpu-tiny]
 *
 * Two models with random weights: GPT-2 124M (12 layers, width 768, 12 heads, vocabulary
 * 50257, context 1024) and the ~0.5B Llama-family configuration of bench_kernels
 * (Qwen2.5-0.5B's shape: 24 layers, hidden 896, 14 query and 2 key/value heads of 64, SwiGLU
 * 4864, vocabulary 151936, tied head, no biases).  For each, in tokens/s (warm-up steps
 * are not timed):
 *   <model>_train            forward + cross-entropy + backward + global-norm clipping +
 *                            AdamW on 8 x 1024 tokens, float storage (the products as
 *                            --math says)
 *   <model>_train_bf16       the same in mixed precision with bfloat16 storage
 *                            (MK_MODEL_BF16_TRAIN: bfloat16 weight copies and product inputs,
 *                            bfloat16 GEMMs with float sums, float master weights, gradients
 *                            and AdamW state - PyTorch autocast's arrangement), measured last
 *                            of the model's figures; the training target is on this one
 *   <model>_decode_s64_t1    batched decoding steps with the KV cache, 64 slots, 16-token
 *                            prompts, temperature 1
 *   <model>_decode_s64_topp  the same with top-p 0.9
 *   <model>_decode_s256_t1   256 slots, temperature 1
 *   <model>_rl_generated     a synchronous generate-then-train RL cycle on one model (the
 *   <model>_rl_trained       kernels API alone: no actors): 64 prompts of 32 random tokens,
 *   <model>_rl_cycle         128 tokens sampled each at temperature 1 (prompts appended
 *                            and sampling, timed), then the PPO loss on the 64 x 159
 *                            sequences in micro-batches of 8 with the sampled tokens masked
 *                            in, one random advantage per sequence, and one AdamW step.
 *                            generated = sampled tokens / generation time, trained =
 *                            masked tokens / training time, cycle = tokens / whole cycle.
 * Manta runs on mk_backend_cuda() (this program links the CUDA back-end directly, as
 * kernels_test_cuda does): float32 parameters, activations and AdamW state, the products
 * multiplying as --math says (mk_backend_set_math; default bf16: operands rounded to bfloat16
 * inside cuBLAS for the tensor cores, float sums - the like-for-like of BF16 autocast; fp32 is
 * plain SGEMM; each line names its "math"); decoding on a rollout's model (MK_MODEL_INFER,
 * with --bf16-weights also MK_MODEL_BF16_WEIGHTS, with --bf16-kv also MK_MODEL_BF16_KV:
 * bfloat16 KV caches).
 *
 * Baseline: tests/bench/bench_gpu_torch.py (transformers' GPT2LMHeadModel /
 * LlamaForCausalLM, eager, SDPA attention) with $MANTA_PYTHON (default python3), run once per
 * model after Manta's figures of that model are measured and its device memory freed, with
 * the shapes and the step counts Manta ran.  Every figure is printed twice: against PyTorch
 * with BF16 autocast (float32 master weights and AdamW state: mixed precision) and, name
 * suffixed _vs_fp32, against PyTorch in float32 without TF32.  One JSON object per line:
 *   {"name","value","unit","steps","weights","kv_cache","math","baseline_dtype","baseline",
 *    "ratio"[,"target"]}
 * ("weights" and "kv_cache": what the figure's model stored, f32 or bf16)
 * ratio = value / baseline (higher is better for every figure); baseline and ratio are null
 * when torch, transformers or a CUDA device is missing on the Python side (BENCH_NO_TORCH=1
 * skips it).  "target" is the target ratio (training >= 1.0, top-p decoding >= 3.0
 * against BF16).
 *
 * Step counts (--quick in brackets): training 8 [2] after 2 [1] warm-up steps; decoding
 * 64 [8], 16 [2] and 32 [4] steps; RL 2 [1] cycles of 128 [16] generated tokens after a
 * short warm-up cycle.  A loop stops early once it has run 15 s [5 s] (at least one timed
 * step or cycle); "steps" says how many were timed and PyTorch runs the same number.
 *
 * Exit status: 0, 2 for a bad command line, 77 when no CUDA device can be used (nothing is
 * measured; the message says why), 1 when a Manta call fails.
 *
 * Then one figure of weight sync, on the last model's parameter vector (all of it: one learner
 * shard's slice when S = 1):
 *   weight_sync_ipc          GB/s of a rollout's device-to-device load: another process (this
 *                            program again, --share-reader) copies the vector from a share
 *                            this one filled (mk_share, CUDA IPC) into its own model's
 *                            parameters with mk_model_write_params_shared, stamp checks
 *                            included, the handle opened once beforehand (its first load is
 *                            reported on stderr).  Baseline: the host path of the weight
 *                            buckets in one process, without the network: the learner's
 *                            download (mk_model_read_params) then the rollout's upload
 *                            (mk_model_write_params) of the same vector; the buckets'
 *                            ZeroMQ transfer and CRC32C come on top of it in a real job, so
 *                            the ratio understates the gain.  (--cpu-tiny: the baseline only,
 *                            the CPU back-end cannot share: value and ratio null.)
 *
 * --cpu-tiny checks this program itself without a GPU: tiny models of both families on the
 * CPU back-end against bench_gpu_torch.py --device cpu --tiny, with tiny shapes.  Its
 * figures mean nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "manta_kernels.h"

#define EXIT_SKIP 77

/* The figures, in the order they are printed; the keys are bench_gpu_torch.py's names. */
enum { F_TRAIN, F_TRAIN16, F_DEC64, F_TOPP, F_DEC256, F_RL_GEN, F_RL_TRAIN, F_RL_CYCLE, N_FIG };
/* train_bf16 is measured against PyTorch's training figure too */
static const char *const fig_key[N_FIG] = {"train",     "train",  "dec64_t1", "dec64_topp",
                                           "dec256_t1", "rl_gen", "rl_train", "rl_cycle"};
static const char *const fig_name[N_FIG] = {"train",           "train_bf16",     "decode_s64_t1",
                                            "decode_s64_topp", "decode_s256_t1", "rl_generated",
                                            "rl_trained",      "rl_cycle"};
static const double fig_target[N_FIG] = {0, 1.0, 0, 3.0, 0, 0, 0, 0};

typedef struct bmodel {
    const char *name;  /* in the figure names */
    const char *torch; /* bench_gpu_torch.py --model */
    mk_config cfg;
} bmodel;

/* GPT-2 124M, and bench_kernels' Llama-family configuration (Qwen2.5-0.5B's sizes, no
 * biases, tied head). */
static const bmodel models[2] = {
    {"gpt2",
     "gpt2",
     {.n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = 1024, .vocab_size = 50257}},
    {"llama0.5B",
     "llama",
     {.n_layer = 24,
      .n_head = 14,
      .n_embd = 896,
      .block_size = 4096,
      .vocab_size = 151936,
      .arch = MK_ARCH_LLAMA,
      .n_kv_head = 2,
      .head_dim = 64,
      .n_inner = 4864,
      .norm_eps = 1e-6f,
      .rope_theta = 1000000.0f}},
};
/* --cpu-tiny: bench_gpu_torch.py --tiny's models */
static const bmodel tiny_models[2] = {
    {"gpt2",
     "gpt2",
     {.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 1024, .vocab_size = 512}},
    {"llama0.5B",
     "llama",
     {.n_layer = 2,
      .n_head = 4,
      .n_embd = 64,
      .block_size = 4096,
      .vocab_size = 512,
      .arch = MK_ARCH_LLAMA,
      .n_kv_head = 2,
      .head_dim = 16,
      .n_inner = 128,
      .norm_eps = 1e-6f,
      .rope_theta = 1000000.0f}},
};

/* Shapes and step counts; the step counts of a model's run are overwritten with the number
 * of steps actually timed, and passed on to PyTorch. */
typedef struct plan {
    int warmup, B, T, train_steps;
    int prompt, slots, slots_big, dec64_steps, topp_steps, dec256_steps;
    int rl_prompts, rl_prompt_len, rl_gen, rl_micro, rl_cycles;
    double cap_s; /* a timed loop stops after this long (with at least one step timed) */
} plan;

static const plan full_plan = {2, 8, 1024, 8, 16, 64, 256, 64, 16, 32, 64, 32, 128, 8, 2, 15.0};
static const plan quick_plan = {1, 8, 1024, 2, 16, 64, 256, 8, 2, 4, 64, 32, 16, 8, 1, 5.0};
static const plan tiny_plan = {1, 2, 32, 2, 4, 4, 8, 3, 3, 3, 4, 4, 4, 2, 1, 5.0};

static int cpu_tiny = 0, bf16_weights = 0, bf16_kv = 0, torch_off = 0;
/* --math: how Manta's float products multiply (mk_backend_set_math) */
static mk_math math = MK_MATH_BF16;
static int math_given;
static const char *math_name[] = {"fp32", "tf32", "bf16"};
static const mk_backend *be;

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
            fprintf(stderr, "bench_gpu: %s: %s (%s)\n", #x, mk_strerror(rc_), mk_last_error());    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_gpu: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Waits for the device: reading a parameter back returns only after every queued kernel
 * that writes the parameters (the last AdamW step) has finished. */
static void sync_model(const mk_model *m)
{
    float x;
    CHECK(mk_model_read_params(m, &x, 0, 1));
}

static void random_tokens(int *x, size_t n, int V, uint64_t seed)
{
    mk_rng r;
    mk_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (int)(mk_rng_next(&r) % (uint64_t)V);
}

/* ---- training ------------------------------------------------------------------------ */

static void train_step(mk_model *m, const int *x, const int *y, int B, int T, int t)
{
    const mk_adamw_params opt = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f};
    float loss;
    CHECK(mk_forward(m, x, B, T));
    CHECK(mk_loss_ce(m, y, NULL, &loss));
    mk_zero_grad(m);
    CHECK(mk_backward(m));
    CHECK(mk_model_step(m, &opt, t, NULL));
}

/* tokens/s of B x T training steps; *t counts AdamW steps, *steps gets the steps timed */
static double bench_train(mk_model *m, const plan *p, int *t, int *steps)
{
    int V = mk_model_config(m)->vocab_size;
    size_t n = (size_t)p->B * p->T;
    int *x = xmalloc(sizeof(int) * n), *y = xmalloc(sizeof(int) * n);
    random_tokens(x, n, V, 2);
    random_tokens(y, n, V, 3);
    for (int s = 0; s < p->warmup; s++) train_step(m, x, y, p->B, p->T, ++*t);
    sync_model(m);
    double t0 = now();
    int s = 0;
    while (s < p->train_steps) {
        train_step(m, x, y, p->B, p->T, ++*t);
        s++;
        if (now() - t0 > p->cap_s) break; /* mk_loss_ce waited for the forward pass */
    }
    sync_model(m);
    double tps = (double)n * s / (now() - t0);
    *steps = s;
    free(x), free(y);
    return tps;
}

/* ---- decoding ------------------------------------------------------------------------ */

/* tokens/s of decoding steps over S slots with prompt-token prompts; *steps: timed */
static double bench_decode(mk_model *m, const plan *p, int S, int max_steps, float temp,
                           float top_p, int *steps)
{
    int V = mk_model_config(m)->vocab_size;
    mk_decoder *d;
    CHECK(mk_decoder_new_ctx(&d, m, S, p->prompt + p->warmup + max_steps + 1));
    int *slots = xmalloc(sizeof(int) * S), *tok = xmalloc(sizeof(int) * S);
    int *pr = xmalloc(sizeof(int) * p->prompt);
    float *temps = xmalloc(sizeof(float) * S), *topp = xmalloc(sizeof(float) * S);
    float *lps = xmalloc(sizeof(float) * S), *lpp = xmalloc(sizeof(float) * S);
    for (int s = 0; s < S; s++) {
        slots[s] = s, temps[s] = temp, topp[s] = top_p;
        random_tokens(pr, (size_t)p->prompt, V, 1000 + (uint64_t)s);
        CHECK(mk_decoder_reset(d, s, (uint64_t)s));
        CHECK(mk_decoder_append(d, s, pr, p->prompt));
    }
    for (int k = 0; k < p->warmup; k++)
        CHECK(mk_decoder_step(d, slots, S, temps, topp, tok, lps, lpp));
    double t0 = now();
    int k = 0;
    while (k < max_steps) {
        CHECK(mk_decoder_step(d, slots, S, temps, topp, tok, lps, lpp)); /* returns on host */
        k++;
        if (now() - t0 > p->cap_s) break;
    }
    double tps = (double)S * k / (now() - t0);
    *steps = k;
    free(slots), free(tok), free(pr), free(temps), free(topp), free(lps), free(lpp);
    mk_decoder_free(d);
    return tps;
}

/* ---- a generate-then-train RL cycle ---------------------------------------------------- */

typedef struct rl_batch {
    int P, Lp, G, T;           /* prompts, prompt length, generated tokens, T = Lp + G - 1 */
    int *seq;                  /* [P, Lp + G] */
    int *x, *y;                /* [P, T]: inputs seq[:, :-1], targets seq[:, 1:] */
    float *behav, *adv, *mask; /* [P, T] */
    int *slots, *tok;          /* [P] */
    float *temp, *topp, *lps, *lpp;
} rl_batch;

/* One cycle generating G tokens; adds the seconds of each phase and the token counts. */
static void rl_cycle(mk_model *m, mk_decoder *d, rl_batch *b, const plan *p, int G, int *t,
                     uint64_t seed, double *gen_s, double *train_s, double *n_gen, double *n_train)
{
    const mk_adamw_params opt = {1e-5f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f};
    const mk_ppo_params pp = {.clip_low = 0.2f, .clip_high = 0.28f, .ratio_cap = 3.0f};
    int V = mk_model_config(m)->vocab_size, P = b->P, Lp = b->Lp, W = Lp + G, T = W - 1;
    mk_rng r;
    mk_rng_seed(&r, seed);
    double t0 = now();
    for (int s = 0; s < P; s++) {
        int *row = b->seq + (size_t)s * W;
        for (int i = 0; i < Lp; i++) row[i] = (int)(mk_rng_next(&r) % (uint64_t)V);
        CHECK(mk_decoder_reset(d, s, seed * 1000 + (uint64_t)s));
        CHECK(mk_decoder_append(d, s, row, Lp));
    }
    for (int g = 0; g < G; g++) {
        CHECK(mk_decoder_step(d, b->slots, P, b->temp, b->topp, b->tok, b->lps, b->lpp));
        for (int s = 0; s < P; s++) {
            b->seq[(size_t)s * W + Lp + g] = b->tok[s];
            b->behav[(size_t)s * T + Lp - 1 + g] = b->lpp[s];
        }
    }
    double t1 = now();
    for (int s = 0; s < P; s++) {
        float a = 2.0f * mk_rng_uniform(&r) - 1.0f;
        for (int i = 0; i < T; i++) {
            size_t k = (size_t)s * T + i;
            b->x[k] = b->seq[(size_t)s * W + i];
            b->y[k] = b->seq[(size_t)s * W + i + 1];
            b->adv[k] = a;
            b->mask[k] = i >= Lp - 1 ? 1.0f : 0.0f;
            if (i < Lp - 1) b->behav[k] = 0;
        }
    }
    mk_zero_grad(m);
    for (int i = 0; i < P; i += p->rl_micro) {
        int mb = P - i < p->rl_micro ? P - i : p->rl_micro;
        size_t o = (size_t)i * T;
        mk_ppo_stats st;
        CHECK(mk_forward(m, b->x + o, mb, T));
        CHECK(mk_loss_ppo(m, b->y + o, b->behav + o, b->adv + o, b->mask + o, &pp, &st));
        CHECK(mk_loss_scale(m, (float)mb / (float)P)); /* every sequence has G masked tokens */
        CHECK(mk_backward(m));
    }
    CHECK(mk_model_step(m, &opt, ++*t, NULL));
    sync_model(m);
    double t2 = now();
    *gen_s += t1 - t0, *train_s += t2 - t1;
    *n_gen += (double)P * G, *n_train += (double)P * G;
}

/* out[0..2]: generated, trained and cycle tokens/s; *cycles: cycles timed */
static void bench_rl(mk_model *m, const plan *p, int *t, double out[3], int *cycles)
{
    rl_batch b = {.P = p->rl_prompts, .Lp = p->rl_prompt_len, .G = p->rl_gen};
    int P = b.P, W = b.Lp + b.G;
    b.T = W - 1;
    size_t n = (size_t)P * b.T;
    b.seq = xmalloc(sizeof(int) * (size_t)P * W);
    b.x = xmalloc(sizeof(int) * n), b.y = xmalloc(sizeof(int) * n);
    b.behav = xmalloc(sizeof(float) * n), b.adv = xmalloc(sizeof(float) * n);
    b.mask = xmalloc(sizeof(float) * n);
    b.slots = xmalloc(sizeof(int) * P), b.tok = xmalloc(sizeof(int) * P);
    b.temp = xmalloc(sizeof(float) * P), b.topp = xmalloc(sizeof(float) * P);
    b.lps = xmalloc(sizeof(float) * P), b.lpp = xmalloc(sizeof(float) * P);
    for (int s = 0; s < P; s++) b.slots[s] = s, b.temp[s] = 1.0f, b.topp[s] = 1.0f;
    mk_decoder *d;
    CHECK(mk_decoder_new_ctx(&d, m, P, W + 1));
    double gs = 0, ts = 0, ng = 0, nt = 0;
    /* warm-up: a short cycle (the first use of this decoder and of the PPO loss) */
    rl_cycle(m, d, &b, p, b.G < 4 ? b.G : 4, t, 1, &gs, &ts, &ng, &nt);
    gs = ts = ng = nt = 0;
    double t0 = now();
    int c = 0;
    while (c < p->rl_cycles) {
        rl_cycle(m, d, &b, p, b.G, t, 2 + (uint64_t)c, &gs, &ts, &ng, &nt);
        c++;
        if (now() - t0 > p->cap_s) break;
    }
    out[0] = ng / gs, out[1] = nt / ts, out[2] = nt / (gs + ts);
    *cycles = c;
    mk_decoder_free(d);
    free(b.seq), free(b.x), free(b.y), free(b.behav), free(b.adv), free(b.mask);
    free(b.slots), free(b.tok), free(b.temp), free(b.topp), free(b.lps), free(b.lpp);
}

/* ---- PyTorch ------------------------------------------------------------------------- */

enum { D_BF16, D_FP32, N_DT };
static const char *const dt_key[N_DT] = {"bf16", "fp32"};
static const char *const dt_name[N_DT] = {"bf16-autocast", "fp32"};

/* Runs bench_gpu_torch.py for one model with plan p (the steps Manta timed); fills
 * base[dtype][figure] (NAN where it printed nothing). */
static void torch_run(const bmodel *bm, const plan *p, double base[N_DT][N_FIG])
{
    for (int d = 0; d < N_DT; d++)
        for (int f = 0; f < N_FIG; f++) base[d][f] = NAN;
    if (torch_off) return;
    if (getenv("BENCH_NO_TORCH")) {
        fprintf(stderr, "bench_gpu: BENCH_NO_TORCH is set; baseline null\n");
        torch_off = 1;
        return;
    }
    const char *py = getenv("MANTA_PYTHON") ? getenv("MANTA_PYTHON") : "python3";
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s %s --model %s --device %s%s --warmup %d --B %d --T %d --train-steps %d "
             "--dec-prompt %d --slots %d --slots-big %d --dec64-steps %d --topp-steps %d "
             "--dec256-steps %d --rl-prompts %d --rl-prompt-len %d --rl-gen %d --rl-micro %d "
             "--rl-cycles %d",
             py, BENCH_GPU_TORCH_SCRIPT, bm->torch, cpu_tiny ? "cpu" : "cuda",
             cpu_tiny ? " --tiny" : "", p->warmup, p->B, p->T, p->train_steps, p->prompt, p->slots,
             p->slots_big, p->dec64_steps, p->topp_steps, p->dec256_steps, p->rl_prompts,
             p->rl_prompt_len, p->rl_gen, p->rl_micro, p->rl_cycles);
    fprintf(stderr, "bench_gpu: %s: PyTorch baseline: %s\n", bm->name, cmd);
    fflush(stderr);
    FILE *f = popen(cmd, "r");
    if (!f) {
        fprintf(stderr, "bench_gpu: cannot run %s; baseline null\n", py);
        return;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *nm = strstr(line, "\"name\":\""), *val = strstr(line, "\"value\":");
        if (!nm || !val) continue;
        nm += 8;
        char *at = strchr(nm, '@'), *q = at ? strchr(at, '"') : NULL;
        if (!q) continue;
        for (int d = 0; d < N_DT; d++)
            for (int k = 0; k < N_FIG; k++)
                if ((size_t)(at - nm) == strlen(fig_key[k]) && !strncmp(nm, fig_key[k], at - nm) &&
                    (size_t)(q - at - 1) == strlen(dt_key[d]) &&
                    !strncmp(at + 1, dt_key[d], q - at - 1))
                    base[d][k] = strtod(val + 8, NULL);
    }
    int st = pclose(f);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        int code = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (code == EXIT_SKIP) {
            fprintf(stderr, "bench_gpu: no PyTorch baseline (torch or transformers missing, or "
                            "no device for it: see above); baseline null\n");
            torch_off = 1;
        } else {
            fprintf(stderr,
                    "bench_gpu: %s failed (exit %d); the figures it did not print get "
                    "baseline null\n",
                    BENCH_GPU_TORCH_SCRIPT, code);
        }
    }
}

/* ---- one model ------------------------------------------------------------------------ */

static void report(const char *model, int f, double value, int steps, const char *weights,
                   const char *kv, int d, double base)
{
    printf("{\"name\":\"%s_%s%s\",\"value\":%.1f,\"unit\":\"tokens/s\",\"steps\":%d,"
           "\"weights\":\"%s\",\"kv_cache\":\"%s\",\"math\":\"%s\",\"baseline_dtype\":\"%s\",",
           model, fig_name[f], d == D_FP32 ? "_vs_fp32" : "", value, steps, weights, kv,
           math_name[math], dt_name[d]);
    if (isnan(base) || base <= 0)
        printf("\"baseline\":null,\"ratio\":null");
    else
        printf("\"baseline\":%.1f,\"ratio\":%.4f", base, value / base);
    if (d == D_BF16 && fig_target[f] > 0) printf(",\"target\":%.1f", fig_target[f]);
    printf("}\n");
    fflush(stdout);
}

static void bench_model(const bmodel *bm, plan p)
{
    double v[N_FIG];
    int steps[N_FIG], t = 0;
    /* the learner's model: training, then the RL cycle on the same weights */
    int max_b = p.B > p.rl_micro ? p.B : p.rl_micro;
    int rl_T = p.rl_prompt_len + p.rl_gen - 1, max_t = p.T > rl_T ? p.T : rl_T;
    mk_model *m;
    double t0 = now();
    CHECK(mk_model_new(&m, &bm->cfg, max_b, max_t, be));
    mk_model_init(m, 1);
    fprintf(stderr, "bench_gpu: %s: %zu parameters on %s (created and initialised in %.1f s)\n",
            bm->name, mk_model_num_params(m), mk_backend_name(be), now() - t0);
    v[F_TRAIN] = bench_train(m, &p, &t, &steps[F_TRAIN]);
    fprintf(stderr, "bench_gpu: %s: train %dx%d: %.0f tokens/s (%d steps), activations %.1f MB\n",
            bm->name, p.B, p.T, v[F_TRAIN], steps[F_TRAIN], mk_model_activation_bytes(m) / 1e6);
    double rl[3];
    int cycles;
    bench_rl(m, &p, &t, rl, &cycles);
    v[F_RL_GEN] = rl[0], v[F_RL_TRAIN] = rl[1], v[F_RL_CYCLE] = rl[2];
    steps[F_RL_GEN] = steps[F_RL_TRAIN] = steps[F_RL_CYCLE] = cycles;
    fprintf(stderr,
            "bench_gpu: %s: RL %d x (%d + %d): generated %.0f, trained %.0f, cycle %.0f "
            "tokens/s (%d cycles)\n",
            bm->name, p.rl_prompts, p.rl_prompt_len, p.rl_gen, rl[0], rl[1], rl[2], cycles);
    mk_model_free(m);
    /* a rollout's model: decoding only */
    unsigned flags = MK_MODEL_INFER | (bf16_weights ? MK_MODEL_BF16_WEIGHTS : 0u) |
                     (bf16_kv ? MK_MODEL_BF16_KV : 0u);
    CHECK(mk_model_new_ex(&m, &bm->cfg, 1, 1, be, flags));
    mk_model_init(m, 1);
    v[F_DEC64] = bench_decode(m, &p, p.slots, p.dec64_steps, 1.0f, 1.0f, &steps[F_DEC64]);
    v[F_TOPP] = bench_decode(m, &p, p.slots, p.topp_steps, 1.0f, 0.9f, &steps[F_TOPP]);
    v[F_DEC256] = bench_decode(m, &p, p.slots_big, p.dec256_steps, 1.0f, 1.0f, &steps[F_DEC256]);
    fprintf(stderr,
            "bench_gpu: %s: decode s%d t1 %.0f (%d steps), s%d top-p %.0f (%d), s%d t1 %.0f "
            "(%d) tokens/s\n",
            bm->name, p.slots, v[F_DEC64], steps[F_DEC64], p.slots, v[F_TOPP], steps[F_TOPP],
            p.slots_big, v[F_DEC256], steps[F_DEC256]);
    mk_model_free(m);
    /* mixed-precision training with bfloat16 storage */
    CHECK(mk_model_new_ex(&m, &bm->cfg, max_b, max_t, be, MK_MODEL_BF16_TRAIN));
    mk_model_init(m, 1);
    t = 0;
    v[F_TRAIN16] = bench_train(m, &p, &t, &steps[F_TRAIN16]);
    fprintf(stderr,
            "bench_gpu: %s: train bf16 %dx%d: %.0f tokens/s (%d steps), activations %.1f MB\n",
            bm->name, p.B, p.T, v[F_TRAIN16], steps[F_TRAIN16], mk_model_activation_bytes(m) / 1e6);
    mk_model_free(m);
    /* PyTorch, the same shapes and the steps Manta timed */
    p.train_steps = steps[F_TRAIN], p.dec64_steps = steps[F_DEC64];
    p.topp_steps = steps[F_TOPP], p.dec256_steps = steps[F_DEC256], p.rl_cycles = cycles;
    double base[N_DT][N_FIG];
    torch_run(bm, &p, base);
    for (int f = 0; f < N_FIG; f++) {
        int dec = f == F_DEC64 || f == F_TOPP || f == F_DEC256;
        const char *w = (dec && bf16_weights) || f == F_TRAIN16 ? "bf16" : "f32",
                   *kv = dec && bf16_kv ? "bf16" : "f32";
        for (int d = 0; d < N_DT; d++) report(bm->name, f, v[f], steps[f], w, kv, d, base[d][f]);
    }
}

/* ---- weight sync: device to device (CUDA IPC) against the host path ---------------------- */

#define SYNC_ITERS 5

/* --share-reader HEX N MODEL: load N floats from the share HEX names into a new model of
 * models[MODEL], once untimed then SYNC_ITERS times; prints the first load's and the mean
 * timed load's seconds.  Exit 0, or 1 with the reason. */
static int share_reader(const char *hex, const char *count, const char *which)
{
    unsigned char h[MK_SHARE_HANDLE_BYTES];
    size_t n = strtoull(count, NULL, 10);
    int k = atoi(which);
    if (strlen(hex) != 2 * sizeof h || k < 0 || k > 1) return 1;
    for (size_t i = 0; i < sizeof h; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 1;
        h[i] = (unsigned char)v;
    }
    if (!(be = mk_backend_cuda())) {
        fprintf(stderr, "bench_gpu reader: no CUDA device: %s\n", mk_last_error());
        return 1;
    }
    mk_model *m;
    CHECK(mk_model_new_ex(&m, &models[k].cfg, 1, 1, be, MK_MODEL_INFER));
    if (mk_model_num_params(m) != n) return 1;
    double t0 = now();
    CHECK(mk_model_write_params_shared(m, h, 0, 0, n, 1));
    double first = now() - t0;
    t0 = now();
    for (int i = 0; i < SYNC_ITERS; i++) CHECK(mk_model_write_params_shared(m, h, 0, 0, n, 1));
    printf("%.9f %.9f\n", first, (now() - t0) / SYNC_ITERS);
    mk_model_free(m);
    return 0;
}

static void bench_weight_sync(const bmodel *bm, int k)
{
    mk_model *src, *dst;
    CHECK(mk_model_new_ex(&src, &bm->cfg, 1, 1, be, MK_MODEL_INFER));
    mk_model_init(src, 1);
    size_t n = mk_model_num_params(src);
    double gb = (double)n * sizeof(float) / 1e9;
    /* the baseline: down to the host, up into another model */
    CHECK(mk_model_new_ex(&dst, &bm->cfg, 1, 1, be, MK_MODEL_INFER));
    float *host = xmalloc(n * sizeof(float));
    CHECK(mk_model_read_params(src, host, 0, n)); /* untimed: the pages touched once */
    double t0 = now();
    for (int i = 0; i < SYNC_ITERS; i++) {
        CHECK(mk_model_read_params(src, host, 0, n));
        CHECK(mk_model_write_params(dst, host, 0, n));
    }
    sync_model(dst);
    double host_s = (now() - t0) / SYNC_ITERS;
    free(host);
    mk_model_free(dst);
    /* device to device, read by another process */
    mk_share *sh;
    int rc = mk_share_new(src, n, &sh);
    double ipc = NAN, first = NAN, mean = NAN;
    if (rc == MK_OK) {
        CHECK(mk_share_fill(sh, src, 0, n, 1));
        unsigned char h[MK_SHARE_HANDLE_BYTES];
        mk_share_handle(sh, h);
        char cmd[4096], hex[2 * MK_SHARE_HANDLE_BYTES + 1];
        for (size_t i = 0; i < sizeof h; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
        snprintf(cmd, sizeof cmd, "/proc/%d/exe --share-reader %s %zu %d", (int)getpid(), hex, n,
                 k);
        FILE *f = popen(cmd, "r");
        if (f && fscanf(f, "%lf %lf", &first, &mean) == 2 && mean > 0) ipc = gb / mean;
        int st = f ? pclose(f) : -1;
        if (st != 0) fprintf(stderr, "bench_gpu: weight sync: the reader failed (status %d)\n", st);
        mk_share_free(sh);
    } else {
        fprintf(stderr, "bench_gpu: weight sync: no share: %s\n", mk_last_error());
    }
    mk_model_free(src);
    fprintf(stderr,
            "bench_gpu: %s: weight sync of %.2f GB: device to device %.2f GB/s (first load, "
            "opening the handle: %.1f ms), host path %.2f GB/s\n",
            bm->name, gb, ipc, first * 1e3, gb / host_s);
    char value[32] = "null", ratio[32] = "null"; /* null: no share, or the reader failed */
    if (!isnan(ipc)) {
        snprintf(value, sizeof value, "%.3f", ipc);
        snprintf(ratio, sizeof ratio, "%.4f", ipc / (gb / host_s));
    }
    printf("{\"name\":\"weight_sync_ipc\",\"value\":%s,\"unit\":\"GB/s\",\"model\":\"%s\","
           "\"bytes\":%.0f,\"baseline_path\":\"host (download + upload)\",\"baseline\":%.3f,"
           "\"ratio\":%s}\n",
           value, bm->name, gb * 1e9, gb / host_s, ratio);
    fflush(stdout);
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--only-gpt2 | --only-llama] [--quick] [--bf16-weights] [--bf16-kv]\n"
            "          [--math fp32|tf32|bf16] [--cpu-tiny]\n"
            "  GPT-2 124M and a 0.5B Llama on one CUDA device against PyTorch (transformers,\n"
            "  eager, SDPA; BF16 autocast and FP32) via $MANTA_PYTHON (default python3).\n"
            "  Exit 77 when no CUDA device can be used.  See tests/bench/README.md.\n",
            argv0);
    return 2;
}

int main(int argc, char **argv)
{
    int which = 3, quick = 0;
    if (argc == 5 && !strcmp(argv[1], "--share-reader"))
        return share_reader(argv[2], argv[3], argv[4]);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--only-gpt2") && which == 3)
            which = 1;
        else if (!strcmp(argv[i], "--only-llama") && which == 3)
            which = 2;
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--bf16-weights"))
            bf16_weights = 1;
        else if (!strcmp(argv[i], "--bf16-kv"))
            bf16_kv = 1;
        else if (!strcmp(argv[i], "--math") && i + 1 < argc) {
            int k = 0;
            while (k < 3 && strcmp(argv[i + 1], math_name[k])) k++;
            if (k == 3) return usage(argv[0]);
            math = (mk_math)k;
            math_given = 1;
            i++;
        } else if (!strcmp(argv[i], "--cpu-tiny"))
            cpu_tiny = 1;
        else
            return usage(argv[0]);
    }
    plan p = cpu_tiny ? tiny_plan : quick ? quick_plan : full_plan;
    const bmodel *ms = cpu_tiny ? tiny_models : models;
    if (cpu_tiny) {
        be = mk_backend_cpu();
        fprintf(stderr, "bench_gpu: --cpu-tiny: tiny models on the CPU, a check of this "
                        "program; the figures mean nothing\n");
    } else if (!(be = mk_backend_cuda())) {
        fprintf(stderr, "bench_gpu: skipped: no usable CUDA device (%s); nothing measured\n",
                mk_last_error());
        return EXIT_SKIP;
    }
    if (cpu_tiny && !math_given) math = MK_MATH_FP32; /* the CPU multiplies in FP32 only */
    if (mk_backend_set_math(be, math) != MK_OK) {
        fprintf(stderr, "bench_gpu: --math %s: %s\n", math_name[math], mk_last_error());
        return 2;
    }
    double t0 = now();
    for (int k = 0; k < 2; k++)
        if (which & (1 << k)) bench_model(&ms[k], p);
    bench_weight_sync(&ms[which & 2 ? 1 : 0], which & 2 ? 1 : 0);
    fprintf(stderr, "bench_gpu: done in %.0f s\n", now() - t0);
    return 0;
}
