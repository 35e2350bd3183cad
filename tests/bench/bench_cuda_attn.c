/*
 * bench_cuda_attn.c - throughput of the CUDA back-end's fused causal attention
 * (kernels/cuda_attn.cu: the table's attn_fwd and attn_bwd) on model-sized
 * grouped-query shapes.  One JSON object per figure and line; the unit is
 * TFLOP/s by FlashAttention's convention (causal forward 2 B NH T^2 hd flops,
 * backward 2.5 times that), so the figures compare with FlashAttention's
 * published float32/TF32-free numbers and with cuBLAS's FP32 peak (about 50-60
 * TFLOP/s on an H100/H200).  No baseline is run here ("baseline": null).
 * Timing: CLOCK_MONOTONIC around --reps calls (default 20) after two warm-up
 * calls; a one-float download waits for the device at both ends.
 *
 * The CUDA attn_fwd keeps only [B, NH, T] log-sum-exp floats in its att
 * argument (and attn_bwd its D in datt), so those are all this allocates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mk_internal.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *dev_random(const mk_backend *be, size_t n, mk_rng *r)
{
    void *d;
    float *h = malloc(n * sizeof(float));
    if (!h || be->alloc(&d, n * sizeof(float))) {
        fprintf(stderr, "bench_cuda_attn: out of memory (%zu floats): %s\n", n, mk_last_error());
        exit(1);
    }
    for (size_t i = 0; i < n; i++) h[i] = 2.0f * mk_rng_uniform(r) - 1.0f;
    be->upload(d, h, n * sizeof(float));
    free(h);
    return d;
}

static void wait_device(const mk_backend *be, const float *d)
{
    float x;
    be->download(&x, d, sizeof x);
}

typedef struct shape {
    const char *name;
    int B, T, NH, NKV, hd;
} shape;

int main(int argc, char **argv)
{
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cuda_attn [--reps N]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    const mk_backend *be = mk_backend_cuda();
    if (!be) {
        fprintf(stderr, "bench_cuda_attn: %s\n", mk_last_error());
        return 1;
    }
    static const shape shapes[] = {
        {"gpt2_124M_8x1024", 8, 1024, 12, 12, 64},   /* GPT-2 small, MHA */
        {"qwen2.5_0.5B_4x1024", 4, 1024, 14, 2, 64}, /* 14 query heads over 2 kv heads */
        {"qwen2.5_0.5B_2x4096", 2, 4096, 14, 2, 64},
        {"llama_8B_2x2048", 2, 2048, 32, 8, 128}, /* Llama 3 8B's heads */
        {"qwen3_4x1024", 4, 1024, 16, 8, 128},
    };
    mk_rng r;
    mk_rng_seed(&r, 1);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape *sh = &shapes[s];
        int B = sh->B, T = sh->T, NH = sh->NH, NKV = sh->NKV, hd = sh->hd;
        size_t W = (size_t)(NH + 2 * NKV) * hd, A = (size_t)NH * hd;
        size_t nq = (size_t)B * T * W, ny = (size_t)B * T * A, nl = (size_t)B * NH * T;
        float *qkv = dev_random(be, nq, &r), *dy = dev_random(be, ny, &r),
              *y = dev_random(be, ny, &r), *lse = dev_random(be, nl, &r),
              *dsum = dev_random(be, nl, &r), *dqkv = dev_random(be, nq, &r);
        double flops_f = 2.0 * B * NH * (double)T * T * hd; /* causal: half of 4 B NH T^2 hd */
        double tf = 0, tb = 0;
        for (int pass = 0; pass < 2; pass++) { /* pass 0: warm-up */
            int n = pass ? reps : 2;
            wait_device(be, y);
            double t0 = now();
            for (int i = 0; i < n; i++) be->attn_fwd(y, lse, qkv, B, T, NH, NKV, hd);
            wait_device(be, y);
            double t1 = now();
            for (int i = 0; i < n; i++) be->attn_bwd(dqkv, dsum, dy, qkv, lse, B, T, NH, NKV, hd);
            wait_device(be, dqkv);
            tf = (t1 - t0) / n, tb = (now() - t1) / n;
        }
        printf("{\"name\":\"attn_fwd_%s\",\"value\":%.2f,\"unit\":\"TFLOP/s\",\"ms\":%.3f,"
               "\"baseline\":null,\"ratio\":null}\n",
               sh->name, flops_f / tf * 1e-12, tf * 1e3);
        printf("{\"name\":\"attn_bwd_%s\",\"value\":%.2f,\"unit\":\"TFLOP/s\",\"ms\":%.3f,"
               "\"baseline\":null,\"ratio\":null}\n",
               sh->name, 2.5 * flops_f / tb * 1e-12, tb * 1e3);
        fflush(stdout);
        float *all[] = {qkv, dy, y, lse, dsum, dqkv};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->release(all[i]);
    }
    return 0;
}
