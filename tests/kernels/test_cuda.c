/*
 * test_cuda.c - the CUDA back-end against the CPU reference (mk_backend_cpu),
 * op by op and for whole models of every family (forward, losses, backward,
 * AdamW, decoding), at the per-operation tolerances below.  Without a usable
 * CUDA device every test calls cmocka's skip() and says why (ctest reads
 * "every test will be skipped" as a skip).
 *
 * The attention-shaped ops run on grouped-query shapes (NH query heads, NKV
 * key/value heads of hd floats): NH=4 NKV=2 hd=8, NH=8 NKV=2 hd=64,
 * NH=4 NKV=4 hd=128 and NH=8 NKV=1 hd=128, with T above the warp width so
 * that every lane loop wraps; training attention also at T = 1 and T = 150
 * (several tiles of the fused kernels, the last one partial; 37 is inside one).  Outputs that an op
 * overwrites start from random values on both sides, and gradients that it adds into start from the
 * same random values, so an op that accumulates where it should overwrite (or the reverse) fails.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol |cpu|), float32 on both sides:
 *   elementwise (GELU, SwiGLU, add, embeddings, AdamW)     1e-6 + 1e-5
 *   kv_store (copies), kv_store_bf16 (rounding to bf16)    exact
 *   LayerNorm, RMSNorm forward / backward                  1e-5 + 1e-4
 *     and add_norm_fwd (its residual sum 1e-6 + 1e-5)
 *   q/k norm + rotation forward / backward                 1e-5 + 1e-4
 *     its weight gradients dwq, dwk                        1e-4 + 1e-4
 *     (each a sum over every row and head of the kind, with cancellation: float rounding in
 *     the CPU's order and the GPU's atomic order differ by ~1e-5 there)
 *   matmul, head (cuBLAS FP32, no TF32) fwd / bwd          1e-5 + 1e-4
 *     mixed math (mk_backend_set_math) TF32 / BF16          4e-3 / 5e-2 + 1e-2
 *     (dinp 4x: longer sums); bf16 products (mm_fwd_bf16a)  2e-5 + 1e-5
 *   bf16 training products (mm_fwd_bb, mm_bwd_bb: dinp,    2e-5 + 1e-5
 *     dw, dbias); round_bf16 and mm_bwd_bb's dout16        exact
 *   attention fwd / bwd, decode attention (float and       1e-5 + 1e-4
 *     bfloat16 caches, attn_decode_bf16)
 *     fused attention's log-sum-exp (vs a double sum)      1e-5 + 1e-5
 *   softmax rows: log-prob, entropy, their gradient        1e-5 + 1e-4
 *     (the CPU sums in double, the GPU in float)
 *   sum of squares                                         1e-9 relative
 *   sampling on the device (sample_rows, and the decoder with it) against
 *     mk__sample_u given the same uniform: greedy tokens identical; other
 *     tokens identical wherever the reference's token stays when u and
 *     top-p move by 1e-6 (the device sums in another order; see
 *     cuda_sample.cu), and always for equal logits over a power-of-two V
 *     (every sum exact); logp_sample, logp_policy 1e-5 + 1e-6 rel.
 *   GPT-2 fixture model: logits 1e-4 + 1e-4; loss 1e-5; gradients
 *          1e-5 + 1e-3; ten AdamW losses 2e-4; greedy decoding: identical
 *          tokens, step logits 1e-4 + 1e-4.
 *   Llama/Qwen2/Qwen3 models: logits 1e-4 + 1e-4; loss 1e-5; gradients
 *          1e-5 + 1e-3; greedy decoding as above.
 *   Training with MK_MODEL_BF16_TRAIN (GPT-2 and the three families): logits 2e-3 + 2e-3;
 *          loss 1e-4 relative; each tensor's gradient 1e-2 relative in L2 norm; five AdamW
 *          steps' losses 3e-3 relative (check_bf16_train says why).
 *   Decoding with bfloat16 KV caches (MK_MODEL_BF16_KV), GPT-2 fixture and
 *          the three families: identical greedy tokens, step logits
 *          1e-4 + 1e-4 (the stored values are bit-equal on both sides).
 *   Parameters shared with another process (test_share, CUDA against CUDA): bit-equal; a
 *          bfloat16-weights reader's logits within 1e-6 of a model written from the host.
 * Atomic additions on the GPU (norm, q/k-norm and embedding weight gradients;
 * not attention, whose kernels have none) make some gradients vary in the last
 * bits between runs; the tolerances cover that.
 */
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ktest.h"

#include "mk_internal.h"

extern char **environ;

static const mk_backend *gpu, *cpu;

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!gpu) {                                                                                \
            fprintf(stderr, "skipped: no usable CUDA device (%s)\n", mk_last_error());             \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static int setup(void **state)
{
    (void)state;
    cpu = mk_backend_cpu();
    gpu = mk_backend_cuda();
    if (!gpu) fprintf(stderr, "test_cuda: %s; every test will be skipped\n", mk_last_error());
    return 0;
}

/* device copy of host h (bytes), or zeros when h is NULL */
static void *dev(const void *h, size_t bytes)
{
    void *d;
    assert_mk_ok(gpu->alloc(&d, bytes));
    if (h) gpu->upload(d, h, bytes);
    return d;
}

static float *host(size_t n, float lo, float hi, mk_rng *r)
{
    float *x = malloc(n * sizeof(float));
    assert_non_null(x);
    fill_uniform(x, n, lo, hi, r);
    return x;
}

/* compares device array d with host reference h */
static void cmp_(const float *d, const float *h, size_t n, double atol, double rtol,
                 const char *label, const char *file, int line)
{
    float *g = malloc(n * sizeof(float));
    assert_non_null(g);
    gpu->download(g, d, n * sizeof(float));
    check_close_(g, h, n, atol, rtol, label, file, line);
    free(g);
}
#define cmp(d, h, n, atol, rtol, label)                                                            \
    cmp_((d), (h), (n), (atol), (rtol), (label), __FILE__, __LINE__)

/* An array on both sides: the CPU's h and the GPU's d, n floats, equal at the start. */
typedef struct pair {
    float *h, *d;
    size_t n;
} pair;

/* uniform in [lo, hi) on both sides */
static pair rnd(size_t n, float lo, float hi, mk_rng *r)
{
    pair p = {host(n, lo, hi, r), NULL, n};
    p.d = dev(p.h, n * sizeof(float));
    return p;
}

static void pair_free(pair *p)
{
    free(p->h);
    gpu->release(p->d);
    p->h = p->d = NULL;
}

#define CMP(p, atol, rtol, label) cmp((p).d, (p).h, (p).n, (atol), (rtol), (label))

enum { R = 64, C = 48, B = 4, T = 16, V = 100 };

static void test_elementwise_and_norms(void **state)
{
    (void)state;
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 1);
    size_t n = (size_t)R * C;
    pair x = rnd(n, -3, 3, &r), y = rnd(n, -1, 1, &r), w = rnd(C, 0.5f, 1.5f, &r),
         b = rnd(C, -1, 1, &r), out = rnd(n, -9, 9, &r), mean = rnd(R, -9, 9, &r),
         rstd = rnd(R, -9, 9, &r), dx = rnd(n, -1, 1, &r), dw = rnd(C, -1, 1, &r),
         db = rnd(C, -1, 1, &r);
    cpu->gelu_fwd(out.h, x.h, n), gpu->gelu_fwd(out.d, x.d, n);
    CMP(out, 1e-6, 1e-5, "gelu_fwd");
    cpu->gelu_bwd(out.h, x.h, y.h, n), gpu->gelu_bwd(out.d, x.d, y.d, n);
    CMP(out, 1e-6, 1e-5, "gelu_bwd");
    cpu->add(out.h, x.h, y.h, n), gpu->add(out.d, x.d, y.d, n);
    CMP(out, 1e-6, 1e-5, "add");

    /* SwiGLU: x as R rows of [gate | up], I = C/2 */
    int I = C / 2;
    pair sw = rnd((size_t)R * I, -9, 9, &r), dsw = rnd((size_t)R * I, -1, 1, &r);
    cpu->swiglu_fwd(sw.h, x.h, R, I), gpu->swiglu_fwd(sw.d, x.d, R, I);
    CMP(sw, 1e-6, 1e-5, "swiglu_fwd");
    cpu->swiglu_bwd(out.h, x.h, dsw.h, R, I), gpu->swiglu_bwd(out.d, x.d, dsw.d, R, I);
    CMP(out, 1e-6, 1e-5, "swiglu_bwd");

    /* LayerNorm with GPT-2's eps and with another */
    const float eps[2] = {1e-5f, 1e-3f};
    for (int e = 0; e < 2; e++) {
        cpu->ln_fwd(out.h, mean.h, rstd.h, x.h, w.h, b.h, R, C, eps[e]);
        gpu->ln_fwd(out.d, mean.d, rstd.d, x.d, w.d, b.d, R, C, eps[e]);
        CMP(out, 1e-5, 1e-4, "ln_fwd out");
        CMP(mean, 1e-5, 1e-4, "ln_fwd mean");
        CMP(rstd, 1e-5, 1e-4, "ln_fwd rstd");
        cpu->ln_bwd(dx.h, dw.h, db.h, y.h, x.h, w.h, mean.h, rstd.h, R, C);
        gpu->ln_bwd(dx.d, dw.d, db.d, y.d, x.d, w.d, mean.d, rstd.d, R, C);
        CMP(dx, 1e-5, 1e-4, "ln_bwd dinp");
        CMP(dw, 1e-5, 1e-4, "ln_bwd dw");
        CMP(db, 1e-5, 1e-4, "ln_bwd db");
    }
    /* RMSNorm (rms_norm_eps 1e-6, and a large eps that matters) */
    const float reps[2] = {1e-6f, 0.5f};
    for (int e = 0; e < 2; e++) {
        cpu->rms_fwd(out.h, rstd.h, x.h, w.h, R, C, reps[e]);
        gpu->rms_fwd(out.d, rstd.d, x.d, w.d, R, C, reps[e]);
        CMP(out, 1e-5, 1e-4, "rms_fwd out");
        CMP(rstd, 1e-5, 1e-4, "rms_fwd rstd");
        cpu->rms_bwd(dx.h, dw.h, y.h, x.h, w.h, rstd.h, R, C);
        gpu->rms_bwd(dx.d, dw.d, y.d, x.d, w.d, rstd.d, R, C);
        CMP(dx, 1e-5, 1e-4, "rms_bwd dinp");
        CMP(dw, 1e-5, 1e-4, "rms_bwd dw");
    }
    /* rstd may be NULL */
    cpu->rms_fwd(out.h, NULL, y.h, w.h, R, C, 1e-6f),
        gpu->rms_fwd(out.d, NULL, y.d, w.d, R, C, 1e-6f);
    CMP(out, 1e-5, 1e-4, "rms_fwd without rstd");

    /* the residual sum and the norm in one pass (add_norm_fwd), LayerNorm and RMSNorm: into
     * fresh arrays, then in place as the model calls it (res = a, out = b: the decoder's x += ln,
     * ln = norm(x)) */
    for (int rms = 0; rms < 2; rms++) {
        pair res = rnd(n, -9, 9, &r), a = rnd(n, -3, 3, &r), bb = rnd(n, -3, 3, &r);
        cpu->add_norm_fwd(res.h, out.h, rms ? NULL : mean.h, rstd.h, a.h, bb.h, w.h, b.h, R, C,
                          1e-5f, rms);
        gpu->add_norm_fwd(res.d, out.d, rms ? NULL : mean.d, rstd.d, a.d, bb.d, w.d, b.d, R, C,
                          1e-5f, rms);
        CMP(res, 1e-6, 1e-5, "add_norm_fwd res");
        CMP(out, 1e-5, 1e-4, "add_norm_fwd out");
        CMP(rstd, 1e-5, 1e-4, "add_norm_fwd rstd");
        if (!rms) CMP(mean, 1e-5, 1e-4, "add_norm_fwd mean");
        cpu->add_norm_fwd(a.h, bb.h, NULL, NULL, a.h, bb.h, w.h, b.h, R, C, 1e-6f, rms);
        gpu->add_norm_fwd(a.d, bb.d, NULL, NULL, a.d, bb.d, w.d, b.d, R, C, 1e-6f, rms);
        CMP(a, 1e-6, 1e-5, "add_norm_fwd in place: res");
        CMP(bb, 1e-5, 1e-4, "add_norm_fwd in place: out");
        pair_free(&res), pair_free(&a), pair_free(&bb);
    }

    /* embeddings with repeated tokens, with and without positions */
    int tok[R], pos[R];
    for (int i = 0; i < R; i++) tok[i] = (i * 7) % V, pos[i] = i % T;
    int *gtok = dev(tok, sizeof tok), *gpos = dev(pos, sizeof pos);
    pair wte = rnd((size_t)V * C, -1, 1, &r), wpe = rnd((size_t)T * C, -1, 1, &r),
         dwte = rnd((size_t)V * C, -1, 1, &r), dwpe = rnd((size_t)T * C, -1, 1, &r);
    cpu->embed_fwd(out.h, tok, pos, wte.h, wpe.h, R, C);
    gpu->embed_fwd(out.d, gtok, gpos, wte.d, wpe.d, R, C);
    CMP(out, 1e-6, 1e-5, "embed_fwd");
    cpu->embed_bwd(dwte.h, dwpe.h, y.h, tok, pos, R, C);
    gpu->embed_bwd(dwte.d, dwpe.d, y.d, gtok, gpos, R, C);
    CMP(dwte, 1e-6, 1e-5, "embed_bwd dwte");
    CMP(dwpe, 1e-6, 1e-5, "embed_bwd dwpe");
    cpu->embed_fwd(out.h, tok, pos, wte.h, NULL, R, C);
    gpu->embed_fwd(out.d, gtok, gpos, wte.d, NULL, R, C);
    CMP(out, 1e-6, 1e-5, "embed_fwd without wpe");
    cpu->embed_bwd(dwte.h, NULL, y.h, tok, pos, R, C);
    gpu->embed_bwd(dwte.d, NULL, y.d, gtok, gpos, R, C);
    CMP(dwte, 1e-6, 1e-5, "embed_bwd without dwpe");

    pair *all[] = {&x,  &y,  &w,  &b,   &out, &mean, &rstd, &dx,
                   &dw, &db, &sw, &dsw, &wte, &wpe,  &dwte, &dwpe};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
    gpu->release(gtok), gpu->release(gpos);
}

static void test_matmul_and_head(void **state)
{
    (void)state;
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 2);
    int IC = C, OC = 3 * C;
    pair x = rnd((size_t)R * IC, -1, 1, &r), w = rnd((size_t)IC * OC, -1, 1, &r),
         bias = rnd(OC, -1, 1, &r), dout = rnd((size_t)R * OC, -1, 1, &r),
         out = rnd((size_t)R * OC, -9, 9, &r), dx = rnd((size_t)R * IC, -9, 9, &r),
         dw = rnd((size_t)IC * OC, -1, 1, &r), db = rnd(OC, -1, 1, &r);
    cpu->mm_fwd(out.h, x.h, w.h, bias.h, R, IC, OC),
        gpu->mm_fwd(out.d, x.d, w.d, bias.d, R, IC, OC);
    CMP(out, 1e-5, 1e-4, "mm_fwd");
    cpu->mm_fwd(out.h, x.h, w.h, NULL, R, IC, OC), gpu->mm_fwd(out.d, x.d, w.d, NULL, R, IC, OC);
    CMP(out, 1e-5, 1e-4, "mm_fwd without bias");
    cpu->mm_bwd(dx.h, dw.h, db.h, dout.h, x.h, w.h, R, IC, OC);
    gpu->mm_bwd(dx.d, dw.d, db.d, dout.d, x.d, w.d, R, IC, OC);
    CMP(dx, 1e-5, 1e-4, "mm_bwd dinp");
    CMP(dw, 1e-5, 1e-4, "mm_bwd dw");
    CMP(db, 1e-5, 1e-4, "mm_bwd dbias");
    /* head: wte [V, C] */
    pair wte = rnd((size_t)V * C, -1, 1, &r), dl = rnd((size_t)R * V, -1, 1, &r),
         lg = rnd((size_t)R * V, -9, 9, &r), dwte = rnd((size_t)V * C, -1, 1, &r);
    cpu->head_fwd(lg.h, x.h, wte.h, R, C, V), gpu->head_fwd(lg.d, x.d, wte.d, R, C, V);
    CMP(lg, 1e-5, 1e-4, "head_fwd");
    cpu->head_bwd(dx.h, dwte.h, dl.h, x.h, wte.h, R, C, V);
    gpu->head_bwd(dx.d, dwte.d, dl.d, x.d, wte.d, R, C, V);
    CMP(dx, 1e-5, 1e-4, "head_bwd dinp");
    CMP(dwte, 1e-5, 1e-4, "head_bwd dwte");
    /* mixed-precision products (mk_backend_set_math): the operands rounded to TF32 (10-bit
     * mantissa) or bfloat16 (7-bit) inside cuBLAS, float sums: against the FP32 CPU within
     * the rounding of 48-term sums of products of size <= 1 */
    const mk_math maths[2] = {MK_MATH_TF32, MK_MATH_BF16};
    const double math_atol[2] = {4e-3, 5e-2};
    for (int k = 0; k < 2; k++) {
        char l[64];
        assert_mk_ok(mk_backend_set_math(gpu, maths[k]));
        cpu->mm_fwd(out.h, x.h, w.h, bias.h, R, IC, OC);
        gpu->mm_fwd(out.d, x.d, w.d, bias.d, R, IC, OC);
        snprintf(l, sizeof l, "mm_fwd math %d", (int)maths[k]);
        CMP(out, math_atol[k], 1e-2, l);
        cpu->mm_bwd(dx.h, dw.h, db.h, dout.h, x.h, w.h, R, IC, OC);
        gpu->mm_bwd(dx.d, dw.d, db.d, dout.d, x.d, w.d, R, IC, OC);
        snprintf(l, sizeof l, "mm_bwd dinp math %d", (int)maths[k]);
        CMP(dx, math_atol[k] * 4, 1e-2, l); /* up to 144-term sums */
        cpu->head_fwd(lg.h, x.h, wte.h, R, C, V), gpu->head_fwd(lg.d, x.d, wte.d, R, C, V);
        snprintf(l, sizeof l, "head_fwd math %d", (int)maths[k]);
        CMP(lg, math_atol[k], 1e-2, l);
    }
    assert_mk_ok(mk_backend_set_math(gpu, MK_MATH_FP32));
    cpu->mm_fwd(out.h, x.h, w.h, bias.h, R, IC, OC),
        gpu->mm_fwd(out.d, x.d, w.d, bias.d, R, IC, OC);
    CMP(out, 1e-5, 1e-4, "mm_fwd back in fp32");
    /* bfloat16 products (MK_MODEL_BF16_PRODUCTS): each back-end's own weight layout and
     * scratch; both multiply the same rounded operands exactly and sum in float */
    {
        size_t nb = MK_BF16_ELEMS(IC, OC);
        uint16_t *wh = malloc(nb * sizeof(uint16_t)), *wd = dev(NULL, nb * sizeof(uint16_t));
        void *sh = malloc(MK_BF16A_SCRATCH(R, IC)), *sd = dev(NULL, MK_BF16A_SCRATCH(R, IC));
        cpu->to_bf16(wh, w.h, IC, OC, 0), gpu->to_bf16(wd, w.d, IC, OC, 0);
        cpu->mm_fwd_bf16a(out.h, x.h, wh, bias.h, R, IC, OC, sh);
        gpu->mm_fwd_bf16a(out.d, x.d, wd, bias.d, R, IC, OC, sd);
        CMP(out, 2e-5, 1e-5, "mm_fwd_bf16a");
        free(wh), free(sh), gpu->release(wd), gpu->release(sd);
    }
    pair *all[] = {&x, &w, &bias, &dout, &out, &dx, &dw, &db, &wte, &dl, &lg, &dwte};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
}

/* Grouped-query shapes the attention-shaped ops run on. */
typedef struct gqa_shape {
    int NH, NKV, hd;
} gqa_shape;
static const gqa_shape shapes[] = {{4, 2, 8}, {8, 2, 64}, {4, 4, 128}, {8, 1, 128}};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };

/* label "what NH=.. NKV=.. hd=.." in buf */
static const char *lab(char *buf, size_t n, const char *what, const gqa_shape *s)
{
    snprintf(buf, n, "%s NH=%d NKV=%d hd=%d", what, s->NH, s->NKV, s->hd);
    return buf;
}

/* transformers' default rotary tables: angle p * theta^(-2i/hd), [Tb, hd/2] */
static void rope_tables(float *cosb, float *sinb, int Tb, int hd)
{
    int half = hd / 2;
    for (int p = 0; p < Tb; p++)
        for (int i = 0; i < half; i++) {
            double a = p * pow(10000.0, -2.0 * i / hd);
            cosb[(size_t)p * half + i] = (float)cos(a);
            sinb[(size_t)p * half + i] = (float)sin(a);
        }
}

/* qk_fwd / qk_bwd with and without the per-head norms, rows at positions 0..TQ-1 */
static void check_qk(const gqa_shape *s, mk_rng *r)
{
    enum { TQ = 40, RQ = 2 * TQ };
    int NH = s->NH, NKV = s->NKV, hd = s->hd, NQK = NH + NKV;
    size_t W = (size_t)(NH + 2 * NKV) * hd, n = RQ * W;
    int pos[RQ];
    for (int i = 0; i < RQ; i++) pos[i] = i % TQ;
    int *gpos = dev(pos, sizeof pos);
    pair cosb = rnd((size_t)TQ * hd / 2, 0, 1, r), sinb = rnd((size_t)TQ * hd / 2, 0, 1, r);
    rope_tables(cosb.h, sinb.h, TQ, hd);
    gpu->upload(cosb.d, cosb.h, cosb.n * sizeof(float));
    gpu->upload(sinb.d, sinb.h, sinb.n * sizeof(float));
    pair inp = rnd(n, -2, 2, r), dout = rnd(n, -1, 1, r), out = rnd(n, -9, 9, r),
         dinp = rnd(n, -9, 9, r), rstd = rnd((size_t)RQ * NQK, -9, 9, r),
         wq = rnd(hd, 0.5f, 1.5f, r), wk = rnd(hd, 0.5f, 1.5f, r), dwq = rnd(hd, -1, 1, r),
         dwk = rnd(hd, -1, 1, r);
    char l[96];
    /* rotation only (LLAMA, QWEN2) */
    cpu->qk_fwd(out.h, NULL, inp.h, NULL, NULL, cosb.h, sinb.h, pos, RQ, NH, NKV, hd, 1e-6f);
    gpu->qk_fwd(out.d, NULL, inp.d, NULL, NULL, cosb.d, sinb.d, gpos, RQ, NH, NKV, hd, 1e-6f);
    CMP(out, 1e-5, 1e-4, lab(l, sizeof l, "qk_fwd rotation", s));
    cpu->qk_bwd(dinp.h, NULL, NULL, dout.h, inp.h, NULL, NULL, NULL, cosb.h, sinb.h, pos, RQ, NH,
                NKV, hd);
    gpu->qk_bwd(dinp.d, NULL, NULL, dout.d, inp.d, NULL, NULL, NULL, cosb.d, sinb.d, gpos, RQ, NH,
                NKV, hd);
    CMP(dinp, 1e-5, 1e-4, lab(l, sizeof l, "qk_bwd rotation dinp", s));
    /* q/k RMSNorm, then rotation (QWEN3) */
    cpu->qk_fwd(out.h, rstd.h, inp.h, wq.h, wk.h, cosb.h, sinb.h, pos, RQ, NH, NKV, hd, 1e-6f);
    gpu->qk_fwd(out.d, rstd.d, inp.d, wq.d, wk.d, cosb.d, sinb.d, gpos, RQ, NH, NKV, hd, 1e-6f);
    CMP(out, 1e-5, 1e-4, lab(l, sizeof l, "qk_fwd norm+rotation", s));
    CMP(rstd, 1e-5, 1e-4, lab(l, sizeof l, "qk_fwd rstd", s));
    cpu->qk_bwd(dinp.h, dwq.h, dwk.h, dout.h, inp.h, wq.h, wk.h, rstd.h, cosb.h, sinb.h, pos, RQ,
                NH, NKV, hd);
    gpu->qk_bwd(dinp.d, dwq.d, dwk.d, dout.d, inp.d, wq.d, wk.d, rstd.d, cosb.d, sinb.d, gpos, RQ,
                NH, NKV, hd);
    CMP(dinp, 1e-5, 1e-4, lab(l, sizeof l, "qk_bwd norm+rotation dinp", s));
    CMP(dwq, 1e-4, 1e-4, lab(l, sizeof l, "qk_bwd dwq", s));
    CMP(dwk, 1e-4, 1e-4, lab(l, sizeof l, "qk_bwd dwk", s));
    /* the decoder's call: norms without rstd */
    cpu->qk_fwd(out.h, NULL, dout.h, wq.h, wk.h, cosb.h, sinb.h, pos, RQ, NH, NKV, hd, 1e-6f);
    gpu->qk_fwd(out.d, NULL, dout.d, wq.d, wk.d, cosb.d, sinb.d, gpos, RQ, NH, NKV, hd, 1e-6f);
    CMP(out, 1e-5, 1e-4, lab(l, sizeof l, "qk_fwd norm without rstd", s));
    pair *all[] = {&cosb, &sinb, &inp, &dout, &out, &dinp, &rstd, &wq, &wk, &dwq, &dwk};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
    gpu->release(gpos);
}

static void test_qk(void **state)
{
    (void)state;
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 5);
    for (int i = 0; i < N_SHAPES; i++) check_qk(&shapes[i], &r);
}

/* label "what NH=.. NKV=.. hd=.. T=.." in buf */
static const char *labt(char *buf, size_t n, const char *what, const gqa_shape *s, int T_)
{
    snprintf(buf, n, "%s NH=%d NKV=%d hd=%d T=%d", what, s->NH, s->NKV, s->hd, T_);
    return buf;
}

/* log-sum-exp of row t's scaled scores for query head h of sequence b, in double: what the
 * CUDA attn_fwd keeps in att's first B NH T floats */
static float ref_lse(const float *qkv, int b, int h, int t, int AT, const gqa_shape *s)
{
    int NH = s->NH, NKV = s->NKV, hd = s->hd;
    size_t W = (size_t)(NH + 2 * NKV) * hd;
    const float *q = qkv + ((size_t)b * AT + t) * W + (size_t)h * hd;
    double mx = -HUGE_VAL, sum = 0.0, sc[512];
    assert_true(t < 512);
    for (int t2 = 0; t2 <= t; t2++) {
        const float *k = qkv + ((size_t)b * AT + t2) * W + (size_t)(NH + h / (NH / NKV)) * hd;
        double a = 0.0;
        for (int i = 0; i < hd; i++) a += (double)q[i] * k[i];
        sc[t2] = a / sqrt((double)hd);
        if (sc[t2] > mx) mx = sc[t2];
    }
    for (int t2 = 0; t2 <= t; t2++) sum += exp(sc[t2] - mx);
    return (float)(mx + log(sum));
}

/* attn_fwd, attn_bwd (sequences of AT positions), then kv_store and attn_decode over the same
 * rows.  The CUDA attention is fused: its att holds the [B, NH, T] log-sum-exp instead of the
 * CPU's [B, NH, T, T] probabilities, so that part is compared with ref_lse. */
static void check_attention(const gqa_shape *s, int AT, mk_rng *r)
{
    enum { AB = 3 };
    int NH = s->NH, NKV = s->NKV, hd = s->hd;
    size_t W = (size_t)(NH + 2 * NKV) * hd, A = (size_t)NH * hd;
    size_t nq = AB * AT * W, ny = AB * AT * A, na = (size_t)AB * NH * AT * AT;
    size_t nl = (size_t)AB * NH * AT;
    pair qkv = rnd(nq, -1.5f, 1.5f, r), dy = rnd(ny, -1, 1, r), y = rnd(ny, -9, 9, r),
         att = rnd(na, -9, 9, r), datt = rnd(na, -9, 9, r), dqkv = rnd(nq, -9, 9, r);
    char l[128];
    cpu->attn_fwd(y.h, att.h, qkv.h, AB, AT, NH, NKV, hd);
    gpu->attn_fwd(y.d, att.d, qkv.d, AB, AT, NH, NKV, hd);
    CMP(y, 1e-5, 1e-4, labt(l, sizeof l, "attn_fwd out", s, AT));
    float *lse = malloc(nl * sizeof(float));
    assert_non_null(lse);
    for (int b = 0; b < AB; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < AT; t++)
                lse[((size_t)b * NH + h) * AT + t] = ref_lse(qkv.h, b, h, t, AT, s);
    cmp(att.d, lse, nl, 1e-5, 1e-5, labt(l, sizeof l, "attn_fwd log-sum-exp", s, AT));
    free(lse);
    cpu->attn_bwd(dqkv.h, datt.h, dy.h, qkv.h, att.h, AB, AT, NH, NKV, hd);
    gpu->attn_bwd(dqkv.d, datt.d, dy.d, qkv.d, att.d, AB, AT, NH, NKV, hd);
    CMP(dqkv, 1e-5, 1e-4, labt(l, sizeof l, "attn_bwd dqkv", s, AT));

    /* decoding: every row (b, t) as slot S-1-b at position t; caches of Tmax > AT, and one
     * slot more than used, so that a slot or stride mix-up lands in the wrong place */
    int S = AB + 1, Tmax = AT + 5, n = AB * AT;
    int *slot = malloc(n * sizeof(int)), *pos = malloc(n * sizeof(int));
    assert_non_null(slot), assert_non_null(pos);
    for (int i = 0; i < n; i++) slot[i] = S - 1 - i / AT, pos[i] = i % AT;
    int *gs = dev(slot, n * sizeof(int)), *gp = dev(pos, n * sizeof(int));
    size_t nc = (size_t)S * Tmax * NKV * hd;
    pair kc = rnd(nc, -9, 9, r), vc = rnd(nc, -9, 9, r),
         sc = rnd((size_t)AB * AT * NH * Tmax, -9, 9, r);
    cpu->kv_store(kc.h, vc.h, qkv.h, slot, pos, n, NH, NKV, hd, Tmax);
    gpu->kv_store(kc.d, vc.d, qkv.d, gs, gp, n, NH, NKV, hd, Tmax);
    CMP(kc, 0, 0, labt(l, sizeof l, "kv_store k", s, AT));
    CMP(vc, 0, 0, labt(l, sizeof l, "kv_store v", s, AT));
    cpu->attn_decode(y.h, sc.h, qkv.h, kc.h, vc.h, slot, pos, n, NH, NKV, hd, Tmax);
    gpu->attn_decode(y.d, sc.d, qkv.d, kc.d, vc.d, gs, gp, n, NH, NKV, hd, Tmax);
    CMP(y, 1e-5, 1e-4, labt(l, sizeof l, "attn_decode", s, AT));
    /* a decoding step: one row per filled slot, at a late position, slots out of order */
    int slot1[AB], pos1[AB];
    for (int b = 0; b < AB; b++) {
        slot1[b] = S - 1 - (b + 2) % AB;
        pos1[b] = AT - 1 - b >= 0 ? AT - 1 - b : 0;
    }
    int *gs1 = dev(slot1, sizeof slot1), *gp1 = dev(pos1, sizeof pos1);
    cpu->attn_decode(y.h, sc.h, qkv.h, kc.h, vc.h, slot1, pos1, AB, NH, NKV, hd, Tmax);
    gpu->attn_decode(y.d, sc.d, qkv.d, kc.d, vc.d, gs1, gp1, AB, NH, NKV, hd, Tmax);
    cmp(y.d, y.h, (size_t)AB * A, 1e-5, 1e-4, labt(l, sizeof l, "attn_decode step", s, AT));

    /* bfloat16 caches (MK_MODEL_BF16_KV): the stores bit for bit (one rounding on both sides),
     * from caches that start from the same random bits, then attention over all rows and the
     * step's rows */
    uint16_t *kbh = malloc(nc * 2), *vbh = malloc(nc * 2), *kbg = malloc(nc * 2),
             *vbg = malloc(nc * 2);
    assert_non_null(kbh), assert_non_null(vbh), assert_non_null(kbg), assert_non_null(vbg);
    for (size_t i = 0; i < nc; i++)
        kbh[i] = (uint16_t)mk_rng_next(r), vbh[i] = mk_f32_to_bf16(kc.h[i]);
    uint16_t *kbd = dev(kbh, nc * 2), *vbd = dev(vbh, nc * 2);
    cpu->kv_store_bf16(kbh, vbh, qkv.h, slot, pos, n, NH, NKV, hd, Tmax);
    gpu->kv_store_bf16(kbd, vbd, qkv.d, gs, gp, n, NH, NKV, hd, Tmax);
    gpu->download(kbg, kbd, nc * 2), gpu->download(vbg, vbd, nc * 2);
    assert_memory_equal(kbg, kbh, nc * 2);
    assert_memory_equal(vbg, vbh, nc * 2);
    cpu->attn_decode_bf16(y.h, sc.h, qkv.h, kbh, vbh, slot, pos, n, NH, NKV, hd, Tmax);
    gpu->attn_decode_bf16(y.d, sc.d, qkv.d, kbd, vbd, gs, gp, n, NH, NKV, hd, Tmax);
    CMP(y, 1e-5, 1e-4, labt(l, sizeof l, "attn_decode_bf16", s, AT));
    cpu->attn_decode_bf16(y.h, sc.h, qkv.h, kbh, vbh, slot1, pos1, AB, NH, NKV, hd, Tmax);
    gpu->attn_decode_bf16(y.d, sc.d, qkv.d, kbd, vbd, gs1, gp1, AB, NH, NKV, hd, Tmax);
    cmp(y.d, y.h, (size_t)AB * A, 1e-5, 1e-4, labt(l, sizeof l, "attn_decode_bf16 step", s, AT));
    free(kbh), free(vbh), free(kbg), free(vbg);
    gpu->release(kbd), gpu->release(vbd);
    pair *all[] = {&qkv, &dy, &y, &att, &datt, &dqkv, &kc, &vc, &sc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
    free(slot), free(pos);
    gpu->release(gs), gpu->release(gp), gpu->release(gs1), gpu->release(gp1);
}

static void test_attention(void **state)
{
    (void)state;
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 3);
    /* GPT-2's multi-head case first (NKV = NH, hd = C / NH) */
    gqa_shape mha = {4, 4, C / 4};
    check_attention(&mha, 37, &r);
    /* sequence lengths: 37 (inside one tile, not a multiple of any tile), 1, and 150 (several
     * query and key tiles of every tile shape, the last one partial) */
    static const int lens[] = {37, 1, 150};
    for (int i = 0; i < N_SHAPES; i++)
        for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
            check_attention(&shapes[i], lens[j], &r);
}

/* Every op over zero rows (or zero elements) leaves its outputs as they were, on both sides:
 * a CUDA launch of an empty grid is an error ("invalid configuration argument"), so each
 * host wrapper must return before launching.  (A decoding step with no active slot, a
 * learner shard with no tokens: the callers do not all check.) */
static void test_empty(void **state)
{
    (void)state;
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 9);
    enum { N = 4096 };
    pair a = rnd(N, -1, 1, &r), b = rnd(N, -1, 1, &r), c = rnd(N, -1, 1, &r), d = rnd(N, -1, 1, &r),
         e = rnd(N, -1, 1, &r);
    int zi[8] = {0};
    int *gi = dev(zi, sizeof zi);
    uint16_t *gb = dev(NULL, N * 2);
    const mk_backend *be[2] = {cpu, gpu};
    for (int s = 0; s < 2; s++) {
        const mk_backend *k = be[s];
        float *A = s ? a.d : a.h, *Bf = s ? b.d : b.h, *Cf = s ? c.d : c.h, *D = s ? d.d : d.h,
              *E = s ? e.d : e.h;
        int *I = s ? gi : zi;
        uint16_t hb[N];
        uint16_t *Hb = s ? gb : hb;
        memset(hb, 0, sizeof hb);
        k->embed_fwd(A, I, I, Bf, Cf, 0, 8);
        k->embed_bwd(A, Bf, Cf, I, I, 0, 8);
        k->ln_fwd(A, Bf, Cf, D, E, E, 0, 8, 1e-5f);
        k->ln_bwd(A, Bf, Cf, D, E, E, Bf, Cf, 0, 8);
        k->rms_fwd(A, Bf, Cf, D, 0, 8, 1e-5f);
        k->rms_bwd(A, Bf, Cf, D, E, Bf, 0, 8);
        k->mm_fwd(A, Bf, Cf, D, 0, 8, 8);
        k->mm_bwd(A, Bf, Cf, D, E, E, 0, 8, 8);
        k->mm_fwd_bf16(A, Bf, Hb, D, 0, 8, 8);
        k->head_fwd(A, Bf, Cf, 0, 8, 16);
        k->head_bwd(A, Bf, Cf, D, E, 0, 8, 16);
        k->attn_fwd(A, Bf, Cf, 0, 4, 2, 2, 8);
        k->attn_bwd(A, Bf, Cf, D, E, 0, 4, 2, 2, 8);
        k->gelu_fwd(A, Bf, 0);
        k->gelu_bwd(A, Bf, Cf, 0);
        k->swiglu_fwd(A, Bf, 0, 8);
        k->swiglu_bwd(A, Bf, Cf, 0, 8);
        k->add(A, Bf, Cf, 0);
        k->kv_store(A, Bf, Cf, I, I, 0, 2, 2, 8, 4);
        k->attn_decode(A, Bf, Cf, D, E, I, I, 0, 2, 2, 8, 4);
        k->kv_store_bf16(Hb, Hb + N / 2, Cf, I, I, 0, 2, 2, 8, 4);
        k->attn_decode_bf16(A, Bf, Cf, Hb, Hb + N / 2, I, I, 0, 2, 2, 8, 4);
        k->row_stats(A, Bf, Cf, I, 0, 16);
        k->row_grad(A, Bf, I, Cf, D, 0, 16);
        k->adamw(A, Bf, Cf, D, 0, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
        assert_true(k->sumsq(A, 0) == 0.0);
        k->scale(A, 2.0f, 0);
        if (k->mm_fwd_bf16a) k->mm_fwd_bf16a(A, Bf, Hb, D, 0, 8, 8, E);
        if (k->sample_rows) k->sample_rows(I, A, Bf, Cf, D, E, E, E, 0, 16);
        k->add_norm_fwd(A, Bf, Cf, D, E, E, E, E, 0, 8, 1e-5f, 0);
        k->add_norm_fwd(A, Bf, Cf, D, E, E, E, E, 0, 8, 1e-5f, 1);
        for (int i = 0; !s && i < N; i++) assert_int_equal(hb[i], 0);
    }
    CMP(a, 0, 0, "zero rows: a");
    CMP(b, 0, 0, "zero rows: b");
    CMP(c, 0, 0, "zero rows: c");
    {
        uint16_t hb[N], zero[N] = {0}; /* the bfloat16 buffer: zero on both sides still */
        gpu->download(hb, gb, sizeof hb);
        assert_memory_equal(hb, zero, sizeof hb);
    }
    pair_free(&a), pair_free(&b), pair_free(&c), pair_free(&d), pair_free(&e);
    gpu->release(gi), gpu->release(gb);
}

static void test_rows_and_optimiser(void **state)
{
    (void)state;
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 4);
    size_t n = (size_t)R * V;
    float *z = host(n, -4, 4, &r), *ct = host(R, -1, 1, &r), *ch = host(R, -1, 1, &r);
    int tg[R];
    for (int i = 0; i < R; i++) tg[i] = i % 9 == 4 ? -1 : (i * 13) % V;
    float lp[R], ent[R], *d = calloc(n, 4);
    float *gz = dev(z, n * 4), *gct = dev(ct, R * 4), *gch = dev(ch, R * 4),
          *glp = dev(NULL, R * 4), *gent = dev(NULL, R * 4), *gd = dev(NULL, n * 4);
    int *gtg = dev(tg, sizeof tg);
    cpu->row_stats(lp, ent, z, tg, R, V), gpu->row_stats(glp, gent, gz, gtg, R, V);
    cmp(glp, lp, R, 1e-5, 1e-4, "row_stats logp");
    cmp(gent, ent, R, 1e-5, 1e-4, "row_stats entropy");
    cpu->row_grad(d, z, tg, ct, ch, R, V), gpu->row_grad(gd, gz, gtg, gct, gch, R, V);
    cmp(gd, d, n, 1e-5, 1e-4, "row_grad");
    /* AdamW, sum of squares, scale */
    size_t np = 10000;
    float *p = host(np, -1, 1, &r), *g = host(np, -1, 1, &r), *m = host(np, -0.1f, 0.1f, &r),
          *v = host(np, 0, 0.01f, &r);
    float *gp_ = dev(p, np * 4), *gg = dev(g, np * 4), *gm = dev(m, np * 4), *gv = dev(v, np * 4);
    cpu->adamw(p, g, m, v, np, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    gpu->adamw(gp_, gg, gm, gv, np, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    cmp(gp_, p, np, 1e-6, 1e-5, "adamw p");
    cmp(gm, m, np, 1e-6, 1e-5, "adamw m");
    cmp(gv, v, np, 1e-6, 1e-5, "adamw v");
    double a = cpu->sumsq(g, np), b = gpu->sumsq(gg, np);
    assert_near(b, a, 1e-9 * a);
    cpu->scale(g, 0.3f, np), gpu->scale(gg, 0.3f, np);
    cmp(gg, g, np, 1e-7, 1e-6, "scale");
    void *all[] = {gz, gct, gch, glp, gent, gd, gtg, gp_, gg, gm, gv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu->release(all[i]);
    free(z), free(ct), free(ch), free(d), free(p), free(g), free(m), free(v);
}

/* A learner shard's slice ops on the model's device memory (mk_model_grad_scale,
 * _grad_sumsq_range, _adamw_range, the moments, mk_model_sync) against the CPU back-end: three
 * steps of three slices that cut tensors, weight decay on the 2-D tensors only. */
static void test_shard_slices(void **state)
{
    (void)state;
    NEED_GPU();
    mk_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 37};
    mk_model *mc, *mg;
    assert_mk_ok(mk_model_new(&mc, &cfg, 1, 4, cpu));
    assert_mk_ok(mk_model_new(&mg, &cfg, 1, 4, gpu));
    mk_model_init(mc, 9), mk_model_init(mg, 9);
    size_t P = mk_model_num_params(mc);
    float *g = malloc(P * sizeof(float)), *a = malloc(P * sizeof(float));
    float *b = malloc(P * sizeof(float));
    mk_rng r;
    mk_rng_seed(&r, 10);
    mk_adamw_params ap = {
        .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (int t = 1; t <= 3; t++) {
        fill_uniform(g, P, -0.5f, 0.5f, &r);
        assert_mk_ok(mk_model_write_grads(mc, g, 0, P));
        assert_mk_ok(mk_model_write_grads(mg, g, 0, P));
        for (size_t k = 0; k < 3; k++) { /* the first P % 3 slices one longer */
            size_t n = P / 3 + (k < P % 3), off = k * (P / 3) + (k < P % 3 ? k : P % 3);
            double sc, sg;
            assert_mk_ok(mk_model_grad_sumsq_range(mc, off, n, &sc));
            assert_mk_ok(mk_model_grad_sumsq_range(mg, off, n, &sg));
            assert_near(sg, sc, 1e-9 * sc);
            assert_mk_ok(mk_model_grad_scale(mc, off, n, 0.7f));
            assert_mk_ok(mk_model_grad_scale(mg, off, n, 0.7f));
            assert_mk_ok(mk_model_adamw_range(mc, off, n, &ap, t));
            assert_mk_ok(mk_model_adamw_range(mg, off, n, &ap, t));
        }
        assert_mk_ok(mk_model_sync(mg));
    }
    assert_mk_ok(mk_model_read_params(mc, a, 0, P));
    cmp(mk_model_params(mg), a, P, 1e-6, 1e-5, "slices: parameters");
    for (int w = 0; w < 2; w++) {
        assert_mk_ok(mk_model_read_moments(mc, w, a, 0, P));
        assert_mk_ok(mk_model_read_moments(mg, w, b, 0, P));
        check_close(b, a, P, 1e-7, 1e-5, w ? "slices: second moments" : "slices: first moments");
    }
    for (size_t i = 0; i < 5; i++) a[i] = (float)i - 2;
    assert_mk_ok(mk_model_write_moments(mg, 0, a, 11, 5));
    assert_mk_ok(mk_model_read_moments(mg, 0, b, 11, 5));
    assert_memory_equal(a, b, 5 * sizeof(float));
    mk_model_free(mc), mk_model_free(mg);
    free(g), free(a), free(b);
}

/* Whether the reference's token for (u, top_p) stays when u and top_p move by 1e-6: a device
 * sampler that agrees up to the order of its double sums must then pick the same token. */
static int ref_stable(const float *z, int Vv, float t, float tp, float u, void *scr)
{
    const float d = 1e-6f;
    int k = mk__sample_u(z, Vv, t, tp, u, scr, NULL, NULL);
    float us[2] = {u < d ? 0.0f : u - d, u + d < 1.0f ? u + d : u};
    for (int i = 0; i < 2; i++)
        if (mk__sample_u(z, Vv, t, tp, us[i], scr, NULL, NULL) != k) return 0;
    if (tp > 0.0f && tp < 1.0f) {
        float ps[2] = {tp - d, tp + d < 1.0f ? tp + d : tp};
        for (int i = 0; i < 2; i++)
            if (mk__sample_u(z, Vv, t, ps[i], u, scr, NULL, NULL) != k) return 0;
    }
    return 1;
}

/* sample_rows against mk__sample_u, row by row, for one vocabulary size: rows of every
 * (kind of logits, temperature, top-p, uniform).  Kinds: spread logits; logits rounded to
 * integers (many ties); all equal (every probability 1/V: with V a power of two every sum is
 * exact, so the tokens must agree even for u on a boundary); a tied maximum every 7th token.
 * Uniforms: 0, the largest (1 - 2^-24), random, and for the equal kind the multiples of
 * 1/16 (boundaries of the walk when V divides 16 * 2^k). */
static void check_sample_rows(int Vv, mk_rng *g)
{
    enum { KINDS = 4, NT = 3, NP = 3, NU = 6 };
    static const float temps[NT] = {0.0f, 0.7f, 1.0f}, tps[NP] = {1.0f, 0.9f, 0.5f};
    int Rr = KINDS * NT * NP * NU;
    float *z = malloc(sizeof(float) * (size_t)Rr * Vv), *t = malloc(sizeof(float) * Rr),
          *tp = malloc(sizeof(float) * Rr), *u = malloc(sizeof(float) * Rr);
    float *lps = malloc(sizeof(float) * Rr), *lpp = malloc(sizeof(float) * Rr);
    int *tok = malloc(sizeof(int) * Rr), *exact = malloc(sizeof(int) * Rr);
    void *scr = malloc(MK_SAMPLE_SCRATCH(Vv));
    assert_non_null(z), assert_non_null(t), assert_non_null(tp), assert_non_null(u);
    assert_non_null(lps), assert_non_null(lpp), assert_non_null(tok), assert_non_null(exact);
    assert_non_null(scr);
    int r = 0;
    for (int kind = 0; kind < KINDS; kind++)
        for (int ti = 0; ti < NT; ti++)
            for (int pi = 0; pi < NP; pi++)
                for (int ui = 0; ui < NU; ui++, r++) {
                    float *row = z + (size_t)r * Vv;
                    for (int j = 0; j < Vv; j++) {
                        float x = 6.0f * (mk_rng_uniform(g) - 0.5f);
                        row[j] = kind == 0   ? x
                                 : kind == 1 ? roundf(x)
                                 : kind == 2 ? 0.25f
                                             : (j % 7 == 3 ? 4.0f : x);
                    }
                    t[r] = temps[ti], tp[r] = tps[pi];
                    u[r] = ui == 0 ? 0.0f : ui == 1 ? 1.0f - 1.0f / 16777216 : mk_rng_uniform(g);
                    if (kind == 2 && ui >= 2) u[r] = (float)(ui * 3) / 16;
                    exact[r] = kind == 2 && (Vv & (Vv - 1)) == 0;
                }
    float *dz = dev(z, sizeof(float) * (size_t)Rr * Vv),
          *dwork = dev(NULL, sizeof(float) * (size_t)Rr * Vv);
    float *dt = dev(t, sizeof(float) * Rr), *dtp = dev(tp, sizeof(float) * Rr),
          *du = dev(u, sizeof(float) * Rr), *dlps = dev(NULL, sizeof(float) * Rr),
          *dlpp = dev(NULL, sizeof(float) * Rr);
    int *dtok = dev(NULL, sizeof(int) * Rr);
    gpu->sample_rows(dtok, dlps, dlpp, dwork, dz, dt, dtp, du, Rr, Vv);
    gpu->download(tok, dtok, sizeof(int) * Rr);
    gpu->download(lps, dlps, sizeof(float) * Rr);
    gpu->download(lpp, dlpp, sizeof(float) * Rr);
    int compared = 0, skipped = 0;
    double worst = 0;
    for (r = 0; r < Rr; r++) {
        const float *row = z + (size_t)r * Vv;
        float rl, rp;
        int rt = mk__sample_u(row, Vv, t[r], tp[r], u[r], scr, &rl, &rp);
        char l[160];
        snprintf(l, sizeof l, "V=%d row %d: temperature %g top-p %g u %.9g: token %d, reference %d",
                 Vv, r, t[r], tp[r], u[r], tok[r], rt);
        if (t[r] <= 0.0f || exact[r] || ref_stable(row, Vv, t[r], tp[r], u[r], scr)) {
            if (tok[r] != rt) fail_msg("%s", l);
            compared++;
        } else {
            skipped++;
        }
        if (tok[r] != rt)
            continue; /* an unstable row that went the other way: nothing to compare */
        double e = fmax(fabs(lps[r] - rl), fabs(lpp[r] - rp));
        if (e > 1e-5 + 1e-6 * fmax(fabs(rl), fabs(rp)))
            fail_msg("%s: log-probs %g %g, reference %g %g", l, lps[r], lpp[r], rl, rp);
        if (t[r] <= 0.0f && lps[r] != 0.0f) fail_msg("%s: greedy logp_sample %g", l, lps[r]);
        worst = fmax(worst, e);
    }
    fprintf(stderr,
            "sample_rows V=%d: %d rows, %d tokens compared, %d near a boundary skipped, log-probs "
            "within %.3g\n",
            Vv, Rr, compared, skipped, worst);
    assert_true(compared >= Rr * 8 / 10);
    void *all[] = {dz, dwork, dt, dtp, du, dlps, dlpp, dtok};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu->release(all[i]);
    free(z), free(t), free(tp), free(u), free(lps), free(lpp), free(tok), free(exact), free(scr);
}

/* The device sampler over byte vocabularies (256, 260), GPT-2's 50257 and a few others,
 * including V below and not a multiple of the block's thread count. */
static void test_sample_rows(void **state)
{
    (void)state;
    NEED_GPU();
    assert_non_null(gpu->sample_rows);
    mk_rng g;
    mk_rng_seed(&g, 12);
    static const int vs[] = {1, 7, 256, 260, 1000, 4096, 50257};
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) check_sample_rows(vs[i], &g);
}

/* The decoder samples on the device: each step's tokens and log-probs are mk__sample_u's from
 * that step's logits (mk_decoder_last_logits) and a replica of the slot's generator; a slot left
 * out of a step keeps the logits of its own last step (copied before the step overwrote them). */
static void check_sampled_decoding(mk_model *mg, int Vv)
{
    enum { NS = 4, STEPS = 10 };
    mk_decoder *dg;
    assert_mk_ok(mk_decoder_new(&dg, mg, NS));
    mk_rng rep[NS];
    int prompt[6] = {1, 2, 3, 4, 5, 6};
    for (int s = 0; s < NS; s++) {
        assert_mk_ok(mk_decoder_reset(dg, s, 100 + s));
        mk_rng_seed(&rep[s], 100 + s);
        assert_mk_ok(mk_decoder_append(dg, s, prompt, 2 + s));
    }
    void *scr = malloc(MK_SAMPLE_SCRATCH(Vv));
    assert_non_null(scr);
    float temp[NS] = {1.0f, 0.7f, 1.0f, 0.0f}, topp[NS] = {1.0f, 0.9f, 0.5f, 1.0f};
    float last_u[NS] = {0};
    int last_tok[NS] = {0}, waiting[NS] = {0};
    float last_lpp[NS] = {0};
    for (int k = 0; k < STEPS; k++) {
        /* every third step leaves slot k % NS out */
        int slots[NS], n = 0;
        for (int s = 0; s < NS; s++)
            if (k % 3 != 2 || s != k % NS) slots[n++] = s;
        float t[NS], tp[NS], lps[NS], lpp[NS];
        int tok[NS];
        for (int i = 0; i < n; i++) t[i] = temp[slots[i]], tp[i] = topp[slots[i]];
        assert_mk_ok(mk_decoder_step(dg, slots, n, t, tp, tok, lps, lpp));
        for (int i = 0; i < n; i++) {
            int s = slots[i];
            float u = mk__sample_draw(&rep[s], t[i]);
            if (s == (k + 1) % NS && k % 3 == 1) { /* left out of the next step: look later */
                last_u[s] = u, last_tok[s] = tok[i], last_lpp[s] = lpp[i], waiting[s] = 1;
                continue;
            }
            const float *lg = mk_decoder_last_logits(dg, s);
            float rl, rp;
            int rt = mk__sample_u(lg, Vv, t[i], tp[i], u, scr, &rl, &rp);
            if (t[i] <= 0.0f || ref_stable(lg, Vv, t[i], tp[i], u, scr))
                assert_int_equal(tok[i], rt);
            if (tok[i] == rt) {
                assert_near(lps[i], rl, 1e-5);
                assert_near(lpp[i], rp, 1e-5);
            }
        }
        for (int s = 0; s < NS; s++)
            if (waiting[s] && k % 3 == 2) { /* s was left out of this step */
                const float *lg = mk_decoder_last_logits(dg, s);
                float rl, rp;
                int rt = mk__sample_u(lg, Vv, temp[s], topp[s], last_u[s], scr, &rl, &rp);
                if (ref_stable(lg, Vv, temp[s], topp[s], last_u[s], scr))
                    assert_int_equal(last_tok[s], rt);
                if (last_tok[s] == rt) assert_near(last_lpp[s], rp, 1e-5);
                waiting[s] = 0;
            }
    }
    free(scr);
    mk_decoder_free(dg);
}

/* Slot s of the CPU's decoder dc and the device's dg reset with seed, then given the n tokens at
 * prompt. */
static void prompt_both(mk_decoder *dc, mk_decoder *dg, int s, uint64_t seed, const int *prompt,
                        int n)
{
    assert_mk_ok(mk_decoder_reset(dc, s, seed));
    assert_mk_ok(mk_decoder_reset(dg, s, seed));
    assert_mk_ok(mk_decoder_append(dc, s, prompt, n));
    assert_mk_ok(mk_decoder_append(dg, s, prompt, n));
}

/* One greedy step of the n slots on dc and dg: the same tokens, and each slot's step logits (Vv)
 * within 1e-4 + 1e-4; a failure's label is "<what> step <k> slot <s> logits". */
static void step_both(mk_decoder *dc, mk_decoder *dg, const int *slots, int n, int Vv,
                      const char *what, int k)
{
    enum { MAXN = 8 };
    assert_true(n >= 1 && n <= MAXN);
    float temp[MAXN] = {0}, topp[MAXN];
    int tc[MAXN], tg[MAXN];
    for (int i = 0; i < n; i++) topp[i] = 1.0f;
    assert_mk_ok(mk_decoder_step(dc, slots, n, temp, topp, tc, NULL, NULL));
    assert_mk_ok(mk_decoder_step(dg, slots, n, temp, topp, tg, NULL, NULL));
    assert_memory_equal(tc, tg, sizeof(int) * (size_t)n);
    char l[128];
    for (int i = 0; i < n; i++) {
        snprintf(l, sizeof l, "%s step %d slot %d logits", what, k, slots[i]);
        check_close(mk_decoder_last_logits(dg, slots[i]), mk_decoder_last_logits(dc, slots[i]),
                    (size_t)Vv, 1e-4, 1e-4, l);
    }
}

/* Greedy decoding with bfloat16 KV caches (MK_MODEL_BF16_KV) on both back-ends, from the
 * parameters of src (a CPU model): three slots with prompts of different lengths, eight steps;
 * identical tokens, step logits 1e-4 + 1e-4. */
static void check_bf16_kv_decoding(const mk_model *src, const char *name)
{
    enum { NS = 3 };
    const mk_config *cfg = mk_model_config(src);
    int Vv = cfg->vocab_size, ctx = cfg->block_size < 24 ? cfg->block_size : 24;
    size_t P = mk_model_num_params(src);
    float *p = malloc(P * 4);
    assert_non_null(p);
    assert_mk_ok(mk_model_read_params(src, p, 0, P));
    mk_model *mc, *mg;
    assert_mk_ok(mk_model_new_ex(&mc, cfg, 1, 1, cpu, MK_MODEL_INFER | MK_MODEL_BF16_KV));
    assert_mk_ok(mk_model_new_ex(&mg, cfg, 1, 1, gpu, MK_MODEL_INFER | MK_MODEL_BF16_KV));
    assert_mk_ok(mk_model_write_params(mc, p, 0, P));
    assert_mk_ok(mk_model_write_params(mg, p, 0, P));
    mk_decoder *dc, *dg;
    assert_mk_ok(mk_decoder_new_ctx(&dc, mc, NS, ctx));
    assert_mk_ok(mk_decoder_new_ctx(&dg, mg, NS, ctx));
    int slots[NS] = {1, 2, 0}, prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = (i * 7 + 3) % Vv;
    for (int s = 0; s < NS; s++) prompt_both(dc, dg, s, 9, prompt + s, 3 + 4 * s);
    char what[64];
    snprintf(what, sizeof what, "%s bf16 KV decode", name);
    for (int k = 0; k < 8 && 11 + k < ctx; k++) step_both(dc, dg, slots, NS, Vv, what, k);
    mk_decoder_free(dc), mk_decoder_free(dg);
    mk_model_free(mc), mk_model_free(mg);
    free(p);
}

#ifdef MK_CUDA_EMU_TEST
long mk_emu_graph_launches(void); /* tests/kernels/cuda_emu: graphs launched so far */
#endif

/* Decoding steps replay a CUDA graph per row count (graph_run): steps of 1, 2, 3, 1, 2, 3
 * slots after prompts (growing: a graph of fewer rows replayed for more would leave rows out), each
 * against the CPU, so every row count is captured once and replayed with new tokens, positions and
 * slots; then a parameter write (mk_model_params), which a replay must read.  On the emulator, the
 * replays are counted. */
static void check_graph_decoding(mk_model *mc, mk_model *mg, int Vv)
{
    mk_decoder *dc, *dg;
    assert_mk_ok(mk_decoder_new(&dc, mc, 3));
    assert_mk_ok(mk_decoder_new(&dg, mg, 3));
    int prompt[5] = {5, 4, 3, 2, 1}, slots[3] = {2, 0, 1};
    for (int s = 0; s < 3; s++) prompt_both(dc, dg, s, 3, prompt, 1 + s);
#ifdef MK_CUDA_EMU_TEST
    long g0 = mk_emu_graph_launches();
#endif
    for (int k = 0; k < 8; k++) {
        if (k == 6) { /* new weights between replays: the same arrays, other values */
            size_t n = mk_model_num_params(mc);
            float *p = malloc(n * sizeof(float));
            assert_non_null(p);
            assert_mk_ok(mk_model_read_params(mc, p, 0, n));
            for (size_t i = 0; i < n; i += 7) p[i] *= 0.5f;
            assert_mk_ok(mk_model_write_params(mc, p, 0, n));
            assert_mk_ok(mk_model_write_params(mg, p, 0, n));
            free(p);
        }
        step_both(dc, dg, slots, 1 + k % 3, Vv, "decode (steps of 1, 2 and 3 slots)", k);
    }
#ifdef MK_CUDA_EMU_TEST
    /* 8 steps of 3 row counts: 3 captures (each then launched) and 5 replays */
    assert_int_equal(mk_emu_graph_launches() - g0, 8);
#endif
    mk_decoder_free(dc), mk_decoder_free(dg);
}

/* The GPT-2 model on both back-ends from the PyTorch fixture's weights. */
static void test_model_gpt2(void **state)
{
    (void)state;
    NEED_GPU();
    ref_fixture ref;
    assert_int_equal(ref_load(&ref, MK_FIXTURES "/ref.bin"), 0);
    mk_model *mc, *mg;
    assert_mk_ok(mk_model_new(&mc, &ref.cfg, ref.B, ref.cfg.block_size, cpu));
    assert_mk_ok(mk_model_new(&mg, &ref.cfg, ref.B, ref.cfg.block_size, gpu));
    assert_mk_ok(mk_load(mc, MK_FIXTURES "/model.safetensors"));
    assert_mk_ok(mk_load(mg, MK_FIXTURES "/model.safetensors"));
    size_t P = mk_model_num_params(mc), NL = (size_t)ref.B * ref.T * ref.cfg.vocab_size;
    float *a = malloc(P * 4), *b = malloc(P * 4), *la = malloc(NL * 4), *lb = malloc(NL * 4);
    float lc, lg;
    assert_mk_ok(mk_forward(mc, ref.tokens, ref.B, ref.T));
    assert_mk_ok(mk_forward(mg, ref.tokens, ref.B, ref.T));
    mk_model_read_logits(mc, la), mk_model_read_logits(mg, lb);
    check_close(lb, la, NL, 1e-4, 1e-4, "model logits");
    assert_mk_ok(mk_loss_ce(mc, ref.targets, ref.weights, &lc));
    assert_mk_ok(mk_loss_ce(mg, ref.targets, ref.weights, &lg));
    assert_near(lg, lc, 1e-5);
    mk_zero_grad(mc), mk_zero_grad(mg);
    assert_mk_ok(mk_backward(mc));
    assert_mk_ok(mk_backward(mg));
    mk_model_read_grads(mc, a, 0, P), mk_model_read_grads(mg, b, 0, P);
    check_close(b, a, P, 1e-5, 1e-3, "model CE gradients");
    mk_ppo_params pp = {0.2f, 0.28f, 3.0f, 0.01f};
    mk_ppo_stats sc, sg;
    assert_mk_ok(mk_loss_ppo(mc, ref.targets, ref.behav, ref.adv, ref.mask, &pp, &sc));
    assert_mk_ok(mk_loss_ppo(mg, ref.targets, ref.behav, ref.adv, ref.mask, &pp, &sg));
    assert_near(sg.loss, sc.loss, 1e-5);
    assert_near(sg.clip_frac, sc.clip_frac, 1e-6);
    mk_zero_grad(mc), mk_zero_grad(mg);
    assert_mk_ok(mk_backward(mc));
    assert_mk_ok(mk_backward(mg));
    mk_model_read_grads(mc, a, 0, P), mk_model_read_grads(mg, b, 0, P);
    check_close(b, a, P, 1e-5, 1e-3, "model PPO gradients");
    mk_adamw_params ap = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    for (int t = 1; t <= 10; t++) {
        assert_mk_ok(mk_forward(mc, ref.tokens, ref.B, ref.T));
        assert_mk_ok(mk_forward(mg, ref.tokens, ref.B, ref.T));
        assert_mk_ok(mk_loss_ce(mc, ref.targets, ref.weights, &lc));
        assert_mk_ok(mk_loss_ce(mg, ref.targets, ref.weights, &lg));
        assert_near(lg, lc, 2e-4);
        assert_near(lc, ref.losses[t - 1], 2e-4);
        mk_zero_grad(mc), mk_zero_grad(mg);
        assert_mk_ok(mk_backward(mc));
        assert_mk_ok(mk_backward(mg));
        assert_mk_ok(mk_model_step(mc, &ap, t, NULL));
        assert_mk_ok(mk_model_step(mg, &ap, t, NULL));
    }
    /* greedy decoding: same tokens, same logits */
    mk_decoder *dc, *dg;
    assert_mk_ok(mk_decoder_new(&dc, mc, 3));
    assert_mk_ok(mk_decoder_new(&dg, mg, 3));
    int prompt[5] = {1, 2, 3, 4, 5}, slots[3] = {0, 1, 2};
    for (int s = 0; s < 3; s++) prompt_both(dc, dg, s, 9, prompt, 2 + s);
    for (int k = 0; k < 6; k++) step_both(dc, dg, slots, 3, ref.cfg.vocab_size, "gpt2 decode", k);
    mk_decoder_free(dc), mk_decoder_free(dg);
    check_graph_decoding(mc, mg, ref.cfg.vocab_size);
    check_bf16_kv_decoding(mc, "gpt2");
    check_sampled_decoding(mg, ref.cfg.vocab_size);
    mk_model_free(mc), mk_model_free(mg);
    free(a), free(b), free(la), free(lb), free(ref.mem);
}

/* Tiny configurations of the rotary families, each with grouped-query attention:
 *  - LLAMA with an untied head, biases on every linear layer and Llama 3 rope scaling;
 *  - QWEN2 (q/k/v biases), tied;
 *  - QWEN3 (q/k norms) with head_dim 16 != n_embd / n_head, untied. */
static const mk_config family_cfgs[] = {
    {.n_layer = 2,
     .n_head = 4,
     .n_embd = 32,
     .block_size = 48,
     .vocab_size = 64,
     .arch = MK_ARCH_LLAMA,
     .n_kv_head = 2,
     .n_inner = 48,
     .untied_head = 1,
     .attn_bias = 1,
     .attn_out_bias = 1,
     .mlp_bias = 1,
     .rope_theta = 500000.0f,
     .rope_factor = 8.0f,
     .rope_low_freq_factor = 1.0f,
     .rope_high_freq_factor = 4.0f,
     .rope_orig_ctx = 16},
    {.n_layer = 2,
     .n_head = 4,
     .n_embd = 32,
     .block_size = 48,
     .vocab_size = 64,
     .arch = MK_ARCH_QWEN2,
     .n_kv_head = 2,
     .n_inner = 40},
    {.n_layer = 2,
     .n_head = 4,
     .n_embd = 32,
     .block_size = 48,
     .vocab_size = 64,
     .arch = MK_ARCH_QWEN3,
     .n_kv_head = 1,
     .head_dim = 16,
     .n_inner = 40,
     .untied_head = 1},
};

/* One family's model on both back-ends from the same random weights (HF initialisation, then
 * every parameter moved by up to 0.05 so that norm weights and biases are not 1 and 0):
 * forward logits, the CE loss, one backward's gradients, and greedy decoding of three slots
 * (tokens and step logits). */
static void check_family(const mk_config *cfg)
{
    enum { FB = 2, FT = 40, NS = 3 };
    const char *name = mk_arch_name(cfg->arch);
    mk_model *mc, *mg;
    assert_mk_ok(mk_model_new(&mc, cfg, FB, FT, cpu));
    assert_mk_ok(mk_model_new(&mg, cfg, FB, FT, gpu));
    int Vv = cfg->vocab_size;
    size_t P = mk_model_num_params(mc), NL = (size_t)FB * FT * Vv;
    assert_int_equal(mk_model_num_params(mg), P);
    mk_rng r;
    mk_rng_seed(&r, 11 + cfg->arch);
    mk_model_init(mc, 7);
    float *a = malloc(P * 4), *b = malloc(P * 4), *la = malloc(NL * 4), *lb = malloc(NL * 4);
    assert_non_null(a), assert_non_null(b), assert_non_null(la), assert_non_null(lb);
    assert_mk_ok(mk_model_read_params(mc, a, 0, P));
    for (size_t i = 0; i < P; i++) a[i] += 0.1f * (mk_rng_uniform(&r) - 0.5f);
    assert_mk_ok(mk_model_write_params(mc, a, 0, P));
    assert_mk_ok(mk_model_write_params(mg, a, 0, P));

    int tokens[FB * FT], targets[FB * FT];
    for (int i = 0; i < FB * FT; i++) tokens[i] = (int)(mk_rng_next(&r) % (uint64_t)Vv);
    for (int i = 0; i < FB * FT; i++) targets[i] = i % FT == FT - 1 ? -1 : tokens[i + 1];
    float wts[FB * FT];
    for (int i = 0; i < FB * FT; i++) wts[i] = targets[i] < 0 ? 0.0f : 1.0f;
    for (int i = 0; i < FB * FT; i++) targets[i] = targets[i] < 0 ? 0 : targets[i];
    char l[96];
    assert_mk_ok(mk_forward(mc, tokens, FB, FT));
    assert_mk_ok(mk_forward(mg, tokens, FB, FT));
    assert_mk_ok(mk_model_read_logits(mc, la));
    assert_mk_ok(mk_model_read_logits(mg, lb));
    snprintf(l, sizeof l, "%s logits", name);
    check_close(lb, la, NL, 1e-4, 1e-4, l);
    float lc, lg;
    assert_mk_ok(mk_loss_ce(mc, targets, wts, &lc));
    assert_mk_ok(mk_loss_ce(mg, targets, wts, &lg));
    assert_near(lg, lc, 1e-5);
    mk_zero_grad(mc), mk_zero_grad(mg);
    assert_mk_ok(mk_backward(mc));
    assert_mk_ok(mk_backward(mg));
    assert_mk_ok(mk_model_read_grads(mc, a, 0, P));
    assert_mk_ok(mk_model_read_grads(mg, b, 0, P));
    /* tensor by tensor, so that a failure names the tensor */
    for (int i = 0; i < mk_model_num_tensors(mc); i++) {
        mk_tensor_info ti;
        assert_mk_ok(mk_model_tensor(mc, i, &ti));
        snprintf(l, sizeof l, "%s gradient of %s", name, ti.name);
        check_close(b + ti.offset, a + ti.offset, ti.numel, 1e-5, 1e-3, l);
    }

    /* greedy decoding of three slots with prompts of different lengths */
    mk_decoder *dc, *dg;
    assert_mk_ok(mk_decoder_new_ctx(&dc, mc, NS, 24));
    assert_mk_ok(mk_decoder_new_ctx(&dg, mg, NS, 24));
    int slots[NS] = {2, 0, 1};
    for (int s = 0; s < NS; s++) prompt_both(dc, dg, s, 9, tokens + 3 * s, 3 + 4 * s);
    snprintf(l, sizeof l, "%s decode", name);
    for (int k = 0; k < 8; k++) step_both(dc, dg, slots, NS, Vv, l, k);
    mk_decoder_free(dc), mk_decoder_free(dg);
    check_bf16_kv_decoding(mc, name);
    mk_model_free(mc), mk_model_free(mg);
    free(a), free(b), free(la), free(lb);
}

static void test_model_families(void **state)
{
    (void)state;
    NEED_GPU();
    for (size_t i = 0; i < sizeof family_cfgs / sizeof family_cfgs[0]; i++)
        check_family(&family_cfgs[i]);
}

/* ---- mixed-precision training (MK_MODEL_BF16_TRAIN) ------------------------------------ */

/* bfloat16 values on both sides */
static uint16_t *dev16(const uint16_t *h, size_t n)
{
    return dev(h, n * sizeof(uint16_t));
}

static void cmp16(const uint16_t *d, const uint16_t *h, size_t n, const char *label)
{
    uint16_t *g = malloc(n * sizeof(uint16_t));
    assert_non_null(g);
    gpu->download(g, d, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        if (g[i] != h[i]) fail_msg("%s [%zu]: 0x%04x, want 0x%04x", label, i, g[i], h[i]);
    free(g);
}

/* round_bf16, mm_fwd_bb and mm_bwd_bb against the CPU's at odd shapes, weights [IC,OC] and
 * [OC,IC] (wt), with and without bias; dinp starts from garbage (overwritten), dw and dbias from
 * random values (added into) */
static void test_bf16_train_ops(void **state)
{
    (void)state;
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 23);
    const int bb[][3] = {{1, 37, 5},    {37, 19, 41},  {64, 48, 144},
                         {130, 33, 17}, {70, 150, 90}, {0, 8, 16}};
    for (size_t s = 0; s < sizeof bb / sizeof bb[0]; s++)
        for (int wt = 0; wt < 2; wt++) {
            int NR = bb[s][0], IC = bb[s][1], OC = bb[s][2], wb = (int)(s + wt) % 2;
            size_t nx = (size_t)NR * IC + 1, nw = (size_t)IC * OC, no = (size_t)NR * OC + 1;
            char l[96];
            pair x = rnd(nx, -2, 2, &r), w = rnd(nw, -1, 1, &r), bias = rnd(OC, -1, 1, &r),
                 out = rnd(no, -9, 9, &r), dout = rnd(no, -1, 1, &r), dinp = rnd(nx, -9, 9, &r),
                 dw = rnd(nw, -1, 1, &r), db = rnd(OC, -1, 1, &r);
            uint16_t *xh = malloc(nx * 2), *wh = malloc(nw * 2), *dh = malloc(no * 2);
            uint16_t *xd = dev16(NULL, nx), *wd = dev16(NULL, nw), *dd = dev16(NULL, no);
            cpu->round_bf16(xh, x.h, nx), gpu->round_bf16(xd, x.d, nx);
            cpu->round_bf16(wh, w.h, nw), gpu->round_bf16(wd, w.d, nw);
            cmp16(xd, xh, nx, "round_bf16 activations");
            cmp16(wd, wh, nw, "round_bf16 weights");
            /* each back-end's scratch */
            size_t nsc = (size_t)cpu->bb_scratch_k * (NR + IC + OC) + 1,
                   nsg = (size_t)gpu->bb_scratch_k * (NR + IC + OC);
            float *sc = malloc(nsc * 4), *sg = nsg ? dev(NULL, nsg * 4) : NULL;
            assert_non_null(sc);
            cpu->mm_fwd_bb(out.h, xh, wh, wb ? bias.h : NULL, NR, IC, OC, wt, sc);
            gpu->mm_fwd_bb(out.d, xd, wd, wb ? bias.d : NULL, NR, IC, OC, wt, sg);
            snprintf(l, sizeof l, "mm_fwd_bb R=%d IC=%d OC=%d wt=%d bias=%d", NR, IC, OC, wt, wb);
            CMP(out, 2e-5, 1e-5, l);
            cpu->mm_bwd_bb(dinp.h, dw.h, wb ? db.h : NULL, dh, dout.h, xh, wh, NR, IC, OC, wt, sc);
            gpu->mm_bwd_bb(dinp.d, dw.d, wb ? db.d : NULL, dd, dout.d, xd, wd, NR, IC, OC, wt, sg);
            free(sc);
            if (sg) gpu->release(sg);
            if (NR) cmp16(dd, dh, (size_t)NR * OC, "mm_bwd_bb dout16");
            snprintf(l, sizeof l, "mm_bwd_bb dinp R=%d IC=%d OC=%d wt=%d", NR, IC, OC, wt);
            CMP(dinp, 2e-5, 1e-5, l);
            snprintf(l, sizeof l, "mm_bwd_bb dw R=%d IC=%d OC=%d wt=%d", NR, IC, OC, wt);
            CMP(dw, 2e-5, 1e-5, l);
            snprintf(l, sizeof l, "mm_bwd_bb dbias R=%d OC=%d", NR, OC);
            CMP(db, 2e-5, 1e-5, l);
            pair *all[] = {&x, &w, &bias, &out, &dout, &dinp, &dw, &db};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
            free(xh), free(wh), free(dh);
            gpu->release(xd), gpu->release(wd), gpu->release(dd);
        }
}

/* ||a - b|| / ||b|| over n floats */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0, w = 0;
    for (size_t i = 0; i < n; i++)
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), w += (double)b[i] * b[i];
    return w > 0 ? sqrt(d / w) : sqrt(d);
}

/* One model with MK_MODEL_BF16_TRAIN on both back-ends from the same parameters: the logits,
 * the CE loss, every tensor's gradient and five AdamW steps' losses.  The CPU and the GPU round
 * the same activations to bfloat16, and an activation that their float ops leave a hair either
 * side of a rounding boundary rounds one bfloat16 step (2^-8 relative) apart, so these bound the
 * whole, not elements: logits 2e-3 + 2e-3 relative, the loss 1e-4 relative, each tensor's
 * gradient within 1e-2 relative (L2 norm of the difference over the CPU's), the losses of five
 * steps 3e-3 relative (the emulator: within 3e-4). */
static void check_bf16_train(const mk_config *cfg)
{
    enum { FB = 2, FT = 23 };
    const char *name = mk_arch_name(cfg->arch);
    mk_model *mc, *mg;
    assert_mk_ok(mk_model_new_ex(&mc, cfg, FB, FT, cpu, MK_MODEL_BF16_TRAIN));
    assert_mk_ok(mk_model_new_ex(&mg, cfg, FB, FT, gpu, MK_MODEL_BF16_TRAIN));
    int Vv = cfg->vocab_size;
    size_t P = mk_model_num_params(mc), NL = (size_t)FB * FT * Vv;
    assert_int_equal(mk_model_num_params(mg), P);
    /* fewer activation bytes than the float model on the device (from two layers on: one layer
     * saves about what the float scratch of a layer costs) */
    if (cfg->n_layer >= 2) {
        mk_model *mf;
        assert_mk_ok(mk_model_new_ex(&mf, cfg, FB, FT, gpu, 0));
        assert_true(mk_model_activation_bytes(mg) < mk_model_activation_bytes(mf));
        mk_model_free(mf);
    }
    mk_rng r;
    mk_rng_seed(&r, 29 + cfg->arch);
    mk_model_init(mc, 5);
    float *a = malloc(P * 4), *b = malloc(P * 4), *la = malloc(NL * 4), *lb = malloc(NL * 4);
    assert_non_null(a), assert_non_null(b), assert_non_null(la), assert_non_null(lb);
    assert_mk_ok(mk_model_read_params(mc, a, 0, P));
    for (size_t i = 0; i < P; i++) a[i] += 0.1f * (mk_rng_uniform(&r) - 0.5f);
    assert_mk_ok(mk_model_write_params(mc, a, 0, P));
    assert_mk_ok(mk_model_write_params(mg, a, 0, P));
    int tokens[FB * FT], targets[FB * FT];
    for (int i = 0; i < FB * FT; i++) tokens[i] = (int)(mk_rng_next(&r) % (uint64_t)Vv);
    for (int i = 0; i < FB * FT; i++) targets[i] = (tokens[i] * 5 + 1) % Vv;
    char l[128];
    assert_mk_ok(mk_forward(mc, tokens, FB, FT));
    assert_mk_ok(mk_forward(mg, tokens, FB, FT));
    assert_mk_ok(mk_model_read_logits(mc, la));
    assert_mk_ok(mk_model_read_logits(mg, lb));
    snprintf(l, sizeof l, "%s bf16-train logits", name);
    check_close(lb, la, NL, 2e-3, 2e-3, l);
    float lc, lg;
    assert_mk_ok(mk_loss_ce(mc, targets, NULL, &lc));
    assert_mk_ok(mk_loss_ce(mg, targets, NULL, &lg));
    assert_near(lg, lc, 1e-4 * fabs(lc));
    mk_zero_grad(mc), mk_zero_grad(mg);
    assert_mk_ok(mk_backward(mc));
    assert_mk_ok(mk_backward(mg));
    assert_mk_ok(mk_model_read_grads(mc, a, 0, P));
    assert_mk_ok(mk_model_read_grads(mg, b, 0, P));
    double worst = 0;
    for (int i = 0; i < mk_model_num_tensors(mc); i++) {
        mk_tensor_info ti;
        assert_mk_ok(mk_model_tensor(mc, i, &ti));
        double e = rel_l2(b + ti.offset, a + ti.offset, ti.numel);
        worst = e > worst ? e : worst;
        if (!(e <= 1e-2)) fail_msg("%s bf16-train gradient of %s: %.3g relative", name, ti.name, e);
    }
    fprintf(stderr, "%s bf16-train: loss %.7g cpu %.7g gpu; worst gradient %.3g relative\n", name,
            lc, lg, worst);
    mk_adamw_params ap = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    for (int t = 1; t <= 5; t++) {
        assert_mk_ok(mk_model_step(mc, &ap, t, NULL));
        assert_mk_ok(mk_model_step(mg, &ap, t, NULL));
        assert_mk_ok(mk_forward(mc, tokens, FB, FT));
        assert_mk_ok(mk_forward(mg, tokens, FB, FT));
        assert_mk_ok(mk_loss_ce(mc, targets, NULL, &lc));
        assert_mk_ok(mk_loss_ce(mg, targets, NULL, &lg));
        assert_near(lg, lc, 3e-3 * fabs(lc));
        mk_zero_grad(mc), mk_zero_grad(mg);
        assert_mk_ok(mk_backward(mc));
        assert_mk_ok(mk_backward(mg));
    }
    fprintf(stderr, "%s bf16-train: loss after 5 steps %.7g cpu %.7g gpu\n", name, lc, lg);
    mk_model_free(mc), mk_model_free(mg);
    free(a), free(b), free(la), free(lb);
}

static void test_model_bf16_train(void **state)
{
    (void)state;
    NEED_GPU();
    const mk_config g2 = {
        .n_layer = 2, .n_head = 3, .n_embd = 36, .block_size = 32, .vocab_size = 67};
    check_bf16_train(&g2);
    /* a vocabulary wider than every block product: the head's backward in passes of 6 rows */
    const mk_config wide = {
        .n_layer = 1, .n_head = 2, .n_embd = 12, .block_size = 32, .vocab_size = 331};
    check_bf16_train(&wide);
    for (size_t i = 0; i < sizeof family_cfgs / sizeof family_cfgs[0]; i++)
        check_bf16_train(&family_cfgs[i]);
}

#ifdef MK_CUDA_EMU_TEST
/* tests/kernels/cuda_emu: cuBLASLt products run so far with the epilogue named */
long mk_emu_lt_matmuls(const char *epilogue);
/* products with epilogue e since the last call (the first call: since the start) */
static const char *const lt_names[5] = {"BIAS", "GELU_BIAS", "GELU_AUX", "GELU_AUX_BIAS", "DGELU"};
static long lt_new(const char *e)
{
    static long seen[5];
    for (int i = 0; i < 5; i++)
        if (!strcmp(lt_names[i], e)) {
            long n = mk_emu_lt_matmuls(e), d = n - seen[i];
            seen[i] = n;
            return d;
        }
    fail_msg("lt_new: %s", e);
    return 0;
}
#endif

/* Products with a bias through cuBLASLt's BIAS epilogue (mm_fwd), GPT-2's c_fc with its GELU
 * (mm_gelu_fwd: GELU_AUX_BIAS, GELU_BIAS without pre) and c_proj's input gradient with the
 * GELU's derivative (mm_gelu_bwd: DGELU) against the CPU's unfused ops (mk__mm_gelu_fwd,
 * mk__mm_gelu_bwd).  Shapes (R, C, F) as c_fc's [C, F] and c_proj's [F, C]: F divisible by 8
 * takes the fused path (cuBLASLt wants the aux matrix's leading dimension divisible by 8), F = 13
 * the unfused one; odd R and C, one row, and R = 0 (nothing written).  Tolerances:
 *   pre (the product and bias), mm_fwd with bias, dw, dbias: as matmul, 1e-5 + 1e-4;
 *   out = gelu(pre), dpre: on the emulator 1e-5 + 1e-4 (it computes the tanh form as
 *     gelu_fwd_k does); on a device 1e-3 + 1e-4 and 3e-3 + 1e-4: cuBLASLt computes the tanh form
 *     with its own tanh, and these bound a tanh with relative error 2^-11 (PTX tanh.approx) at
 *     |pre| <= 3, which the inputs keep to (x in [-1, 1], w in [-0.25, 0.25]);
 *   TF32 / BF16 math: pre and out 4e-3 / 5e-2 + 1e-2 (as test_matmul_and_head), dpre 4x. */
static void test_fused_epilogues(void **state)
{
    (void)state;
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 13);
#ifdef MK_CUDA_EMU_TEST
    const double g_atol = 1e-5, dg_atol = 1e-5;
#else
    const double g_atol = 1e-3, dg_atol = 3e-3;
#endif
    const int mlp[][3] = {{64, 48, 192}, {37, 19, 40}, {5, 24, 13}, {1, 48, 192}, {0, 8, 16}};
    for (size_t s = 0; s < sizeof mlp / sizeof mlp[0]; s++) {
        int NR = mlp[s][0], Cc = mlp[s][1], F = mlp[s][2];
        size_t nx = (size_t)NR * Cc + 1, nh = (size_t)NR * F + 1, nw = (size_t)Cc * F;
        char l[96];
        pair x = rnd(nx, -1, 1, &r), wfc = rnd(nw, -0.25f, 0.25f, &r), bfc = rnd(F, -1, 1, &r),
             wpj = rnd(nw, -0.25f, 0.25f, &r), bpj = rnd(Cc, -1, 1, &r), pre = rnd(nh, -9, 9, &r),
             out = rnd(nh, -9, 9, &r), dres = rnd(nx, -1, 1, &r), dpre = rnd(nh, -9, 9, &r),
             dw = rnd(nw, -1, 1, &r), db = rnd(Cc, -1, 1, &r), res = rnd(nx, -9, 9, &r);
#ifdef MK_CUDA_EMU_TEST
        int fused = NR > 0 && F % 8 == 0;
        for (int i = 0; i < 5; i++) lt_new(lt_names[i]); /* from here */
#endif
        /* c_proj's product with its bias: the BIAS epilogue whenever there are rows */
        cpu->mm_fwd(res.h, out.h, wpj.h, bpj.h, NR, F, Cc);
        gpu->mm_fwd(res.d, out.d, wpj.d, bpj.d, NR, F, Cc);
        snprintf(l, sizeof l, "mm_fwd with bias R=%d IC=%d OC=%d", NR, F, Cc);
        CMP(res, 1e-5, 1e-4, l);
#ifdef MK_CUDA_EMU_TEST
        assert_int_equal(lt_new("BIAS"), NR > 0);
#endif
        mk__mm_gelu_fwd(cpu, out.h, pre.h, x.h, wfc.h, bfc.h, NR, Cc, F);
        gpu->mm_gelu_fwd(out.d, pre.d, x.d, wfc.d, bfc.d, NR, Cc, F);
        snprintf(l, sizeof l, "mm_gelu_fwd pre R=%d C=%d F=%d", NR, Cc, F);
        CMP(pre, 1e-5, 1e-4, l);
        snprintf(l, sizeof l, "mm_gelu_fwd out R=%d C=%d F=%d", NR, Cc, F);
        CMP(out, g_atol, 1e-4, l);
#ifdef MK_CUDA_EMU_TEST
        assert_int_equal(lt_new("GELU_AUX_BIAS"), fused);
        assert_int_equal(lt_new("BIAS"), NR > 0 && !fused); /* unfused: mm_fwd's epilogue */
#endif
        /* c_proj's backward from the CPU's activations on both sides: dres [R, C] -> dpre [R, F] */
        gpu->upload(pre.d, pre.h, nh * sizeof(float)),
            gpu->upload(out.d, out.h, nh * sizeof(float));
        mk__mm_gelu_bwd(cpu, dpre.h, dw.h, db.h, dres.h, out.h, wpj.h, pre.h, NR, F, Cc);
        gpu->mm_gelu_bwd(dpre.d, dw.d, db.d, dres.d, out.d, wpj.d, pre.d, NR, F, Cc);
        snprintf(l, sizeof l, "mm_gelu_bwd dpre R=%d C=%d F=%d", NR, Cc, F);
        CMP(dpre, dg_atol, 1e-4, l);
        snprintf(l, sizeof l, "mm_gelu_bwd dw R=%d C=%d F=%d", NR, Cc, F);
        CMP(dw, 1e-5, 1e-4, l);
        snprintf(l, sizeof l, "mm_gelu_bwd dbias R=%d C=%d F=%d", NR, Cc, F);
        CMP(db, 1e-5, 1e-4, l);
#ifdef MK_CUDA_EMU_TEST
        assert_int_equal(lt_new("DGELU"), fused);
#endif
        /* without pre (the decoder: GELU_BIAS), and without a bias (GELU_AUX) */
        mk__mm_gelu_fwd(cpu, out.h, NULL, x.h, wfc.h, bfc.h, NR, Cc, F);
        gpu->mm_gelu_fwd(out.d, NULL, x.d, wfc.d, bfc.d, NR, Cc, F);
        snprintf(l, sizeof l, "mm_gelu_fwd without pre R=%d C=%d F=%d", NR, Cc, F);
        CMP(out, g_atol, 1e-4, l);
        mk__mm_gelu_fwd(cpu, out.h, pre.h, x.h, wfc.h, NULL, NR, Cc, F);
        gpu->mm_gelu_fwd(out.d, pre.d, x.d, wfc.d, NULL, NR, Cc, F);
        snprintf(l, sizeof l, "mm_gelu_fwd without bias R=%d C=%d F=%d", NR, Cc, F);
        CMP(pre, 1e-5, 1e-4, l);
        CMP(out, g_atol, 1e-4, l);
#ifdef MK_CUDA_EMU_TEST
        assert_int_equal(lt_new("GELU_BIAS"), NR > 0); /* no aux: any width */
        assert_int_equal(lt_new("GELU_AUX"), fused);
        assert_int_equal(lt_new("BIAS"), 0); /* unfused without a bias: cuBLAS */
#endif
        /* tensor-core math: the operands rounded inside cuBLASLt as inside cuBLAS */
        const mk_math maths[2] = {MK_MATH_TF32, MK_MATH_BF16};
        const double math_atol[2] = {4e-3, 5e-2};
        for (int k = 0; k < 2 && NR > 0; k++) {
            assert_mk_ok(mk_backend_set_math(gpu, maths[k]));
            cpu->mm_fwd(res.h, out.h, wpj.h, bpj.h, NR, F, Cc);
            gpu->mm_fwd(res.d, out.d, wpj.d, bpj.d, NR, F, Cc);
            snprintf(l, sizeof l, "mm_fwd with bias math %d R=%d", (int)maths[k], NR);
            CMP(res, math_atol[k], 1e-2, l);
            mk__mm_gelu_fwd(cpu, out.h, pre.h, x.h, wfc.h, bfc.h, NR, Cc, F);
            gpu->mm_gelu_fwd(out.d, pre.d, x.d, wfc.d, bfc.d, NR, Cc, F);
            snprintf(l, sizeof l, "mm_gelu_fwd math %d R=%d C=%d F=%d", (int)maths[k], NR, Cc, F);
            CMP(pre, math_atol[k], 1e-2, l);
            CMP(out, math_atol[k] + g_atol, 1e-2, l);
            gpu->upload(pre.d, pre.h, nh * sizeof(float));
            gpu->upload(out.d, out.h, nh * sizeof(float));
            mk__mm_gelu_bwd(cpu, dpre.h, dw.h, db.h, dres.h, out.h, wpj.h, pre.h, NR, F, Cc);
            gpu->mm_gelu_bwd(dpre.d, dw.d, db.d, dres.d, out.d, wpj.d, pre.d, NR, F, Cc);
            gpu->upload(dw.d, dw.h, nw * sizeof(float)); /* dw's sums are cuBLAS's: not here */
            snprintf(l, sizeof l, "mm_gelu_bwd dpre math %d R=%d C=%d F=%d", (int)maths[k], NR, Cc,
                     F);
            CMP(dpre, 4 * math_atol[k] + dg_atol, 1e-2, l);
            CMP(db, 1e-5, 1e-4, "mm_gelu_bwd dbias (no product)");
        }
        assert_mk_ok(mk_backend_set_math(gpu, MK_MATH_FP32));
        pair *all[] = {&x, &wfc, &bfc, &wpj, &bpj, &pre, &out, &dres, &dpre, &dw, &db, &res};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(all[i]);
    }

    /* a GPT-2 model (4C = 64: every MLP fused) on both back-ends: logits, CE gradients and
     * greedy decoding with graphs at the whole-model tolerances above */
    mk_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 16, .vocab_size = 37};
    enum { MB = 2, MT = 7 };
    mk_model *mc, *mg;
    assert_mk_ok(mk_model_new(&mc, &cfg, MB, MT, cpu));
    assert_mk_ok(mk_model_new(&mg, &cfg, MB, MT, gpu));
    mk_model_init(mc, 21), mk_model_init(mg, 21);
    int tok[MB * MT], tgt[MB * MT];
    for (int i = 0; i < MB * MT; i++) tok[i] = (i * 7 + 3) % 37, tgt[i] = (i * 5 + 1) % 37;
    size_t P = mk_model_num_params(mc), NL = (size_t)MB * MT * 37;
    float *a = malloc(P * 4), *b = malloc(P * 4), *la = malloc(NL * 4), *lb = malloc(NL * 4);
    float lc, lg;
    assert_mk_ok(mk_forward(mc, tok, MB, MT));
    assert_mk_ok(mk_forward(mg, tok, MB, MT));
    mk_model_read_logits(mc, la), mk_model_read_logits(mg, lb);
    check_close(lb, la, NL, 1e-4, 1e-4, "fused MLP model logits");
    assert_mk_ok(mk_loss_ce(mc, tgt, NULL, &lc));
    assert_mk_ok(mk_loss_ce(mg, tgt, NULL, &lg));
    assert_near(lg, lc, 1e-5);
    mk_zero_grad(mc), mk_zero_grad(mg);
    assert_mk_ok(mk_backward(mc));
    assert_mk_ok(mk_backward(mg));
    mk_model_read_grads(mc, a, 0, P), mk_model_read_grads(mg, b, 0, P);
    check_close(b, a, P, 1e-5, 1e-3, "fused MLP model CE gradients");
#ifdef MK_CUDA_EMU_TEST
    assert_int_equal(lt_new("GELU_AUX_BIAS"), cfg.n_layer);
    assert_int_equal(lt_new("DGELU"), cfg.n_layer);
#endif
    check_graph_decoding(mc, mg, 37);
#ifdef MK_CUDA_EMU_TEST
    /* the decoder's c_fc + GELU: captured and replayed with the graphs */
    assert_true(lt_new("GELU_BIAS") >= 8 * cfg.n_layer);
#endif
    free(a), free(b), free(la), free(lb);
    mk_model_free(mc), mk_model_free(mg);
}

/* ---- parameters shared with another process (share.c) -------------------------------------
 *
 * The reading side of a share must be another process (CUDA refuses to open a handle in the
 * process that exported it, and CUDA cannot be used in a forked child), so the test runs this
 * binary again as a reader (/proc/self/exe --share-reader MODE) and drives it through its
 * standard input and output, one command a line and one reply a line ("RC message"):
 *   w HEX SRC_OFF OFF N VERSION   mk_model_write_params_shared into the reader's model
 *   k HEX SRC_OFF N VERSION       mk_model_share_check
 *   t HEX SRC_OFF OFF N VERSION   the same, with the stamp changed during the copy (the test
 *                                 hook mk__share_test_after_copy, as a fill would change it)
 *   d PATH                        writes the model's parameters (floats) to PATH
 *   o                             "0 OPENED MAPPED": handles the emulator opened, mappings open
 *                                 now (-1 -1 on a device)
 *   c                             (MODE bf16) decodes one greedy step with the model A
 *                                 (MK_MODEL_BF16_WEIGHTS) and with a model B given A's float
 *                                 parameters by mk_model_write_params: "0 DIFF CHANGE", DIFF the
 *                                 largest |A - B| of the logits, CHANGE A's from the last c
 *   q                             frees everything and exits 0
 * The reader's model (MODE plain: MK_MODEL_INFER) starts from mk_model_init(seed 99). */

static const mk_config share_cfg = {
    .n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 16, .vocab_size = 37};

#ifdef MK_CUDA_EMU_TEST
void mk_emu_ipc_counts(long *opened, long *mapped); /* tests/kernels/cuda_emu */
#endif

static void hex_of(char *out, const unsigned char *h)
{
    for (int i = 0; i < MK_SHARE_HANDLE_BYTES; i++) sprintf(out + 2 * i, "%02x", h[i]);
}

static int hex_to(unsigned char *h, const char *in)
{
    for (int i = 0; i < MK_SHARE_HANDLE_BYTES; i++) {
        unsigned v;
        if (sscanf(in + 2 * i, "%2x", &v) != 1) return -1;
        h[i] = (unsigned char)v;
    }
    return 0;
}

static void reader_torn(const mk_backend *be, void *stamp)
{
    int64_t v;
    be->download(&v, stamp, sizeof v);
    v += 1000;
    be->upload(stamp, &v, sizeof v);
}

/* logits of one greedy step of prompt {1, 2, 3, 4} with a fresh decoder */
static int reader_logits(mk_model *m, float *out)
{
    mk_decoder *d;
    int rc, prompt[4] = {1, 2, 3, 4}, slot = 0, tok;
    float t = 0, tp = 1, lp;
    if ((rc = mk_decoder_new(&d, m, 1))) return rc;
    if (!(rc = mk_decoder_reset(d, 0, 1)) && !(rc = mk_decoder_append(d, 0, prompt, 4)) &&
        !(rc = mk_decoder_step(d, &slot, 1, &t, &tp, &tok, &lp, NULL)))
        memcpy(out, mk_decoder_last_logits(d, 0), sizeof(float) * share_cfg.vocab_size);
    mk_decoder_free(d);
    return rc;
}

static int share_reader(const char *mode)
{
    int bf16 = !strcmp(mode, "bf16");
    gpu = mk_backend_cuda();
    if (!gpu) {
        fprintf(stderr, "share reader: %s\n", mk_last_error());
        return 2;
    }
    unsigned flags = MK_MODEL_INFER | (bf16 ? MK_MODEL_BF16_WEIGHTS : 0);
    mk_model *m = NULL, *mb = NULL;
    if (mk_model_new_ex(&m, &share_cfg, 1, 1, gpu, flags) ||
        (bf16 && mk_model_new_ex(&mb, &share_cfg, 1, 1, gpu, flags))) {
        fprintf(stderr, "share reader: %s\n", mk_last_error());
        mk_model_free(m);
        return 2;
    }
    mk_model_init(m, 99);
    size_t P = mk_model_num_params(m);
    int Vv = share_cfg.vocab_size;
    float *p = malloc(P * sizeof(float)), *la = calloc((size_t)Vv, 4), *lb = calloc((size_t)Vv, 4),
          *prev = calloc((size_t)Vv, 4);
    char line[512], hex[2 * MK_SHARE_HANDLE_BYTES + 1];
    int status = 3;
    while (fgets(line, sizeof line, stdin)) {
        unsigned char h[MK_SHARE_HANDLE_BYTES];
        size_t so, off, n;
        long long ver;
        int rc = 0;
        double a = 0, b = 0;
        if ((line[0] == 'w' || line[0] == 't') &&
            sscanf(line + 1, "%128s %zu %zu %zu %lld", hex, &so, &off, &n, &ver) == 5 &&
            !hex_to(h, hex)) {
            if (line[0] == 't') mk__share_test_after_copy = reader_torn;
            rc = mk_model_write_params_shared(m, h, so, off, n, ver);
            mk__share_test_after_copy = NULL;
            printf("%d %s\n", rc, rc ? mk_last_error() : "");
        } else if (line[0] == 'k' &&
                   sscanf(line + 1, "%128s %zu %zu %lld", hex, &so, &n, &ver) == 4 &&
                   !hex_to(h, hex)) {
            rc = mk_model_share_check(m, h, so, n, ver);
            printf("%d %s\n", rc, rc ? mk_last_error() : "");
        } else if (line[0] == 'd') {
            line[strcspn(line, "\n")] = 0;
            FILE *f = fopen(line + 2, "wb");
            rc = mk_model_read_params(m, p, 0, P);
            if (!f || rc || fwrite(p, sizeof(float), P, f) != P) rc = rc ? rc : MK_ERR_IO;
            if (f) fclose(f);
            printf("%d\n", rc);
        } else if (line[0] == 'o') {
            long opened = -1, mapped = -1;
#ifdef MK_CUDA_EMU_TEST
            mk_emu_ipc_counts(&opened, &mapped);
#endif
            printf("0 %ld %ld\n", opened, mapped);
        } else if (line[0] == 'c' && bf16) {
            if (!(rc = mk_model_read_params(m, p, 0, P)) &&
                !(rc = mk_model_write_params(mb, p, 0, P)) && !(rc = reader_logits(m, la)))
                rc = reader_logits(mb, lb);
            for (int i = 0; i < Vv; i++) {
                a = fmax(a, fabs((double)la[i] - lb[i]));
                b = fmax(b, fabs((double)la[i] - prev[i]));
            }
            memcpy(prev, la, sizeof(float) * Vv);
            printf("%d %g %g\n", rc, a, b);
        } else if (line[0] == 'q') {
            status = 0;
            break;
        } else {
            printf("%d unknown command\n", MK_ERR_ARG);
        }
        fflush(stdout);
    }
    free(p), free(la), free(lb), free(prev);
    mk_model_free(m), mk_model_free(mb);
    return status;
}

typedef struct reader {
    pid_t pid;
    FILE *to, *from;
    char reply[512];
} reader;

static void reader_start(reader *r, const char *mode)
{
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(k > 0);
    exe[k] = 0;
    int in[2], out[2];
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    char *argv[] = {exe, "--share-reader", (char *)mode, NULL};
    assert_int_equal(posix_spawn(&r->pid, exe, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]), close(out[1]);
    r->to = fdopen(in[1], "w");
    r->from = fdopen(out[0], "r");
    assert_non_null(r->to);
    assert_non_null(r->from);
}

/* sends one command; the reply's first number (the rc), the whole reply in r->reply */
static int reader_cmd(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int reader_cmd(reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->to, fmt, ap);
    va_end(ap);
    fputc('\n', r->to);
    fflush(r->to);
    if (!fgets(r->reply, sizeof r->reply, r->from)) fail_msg("the share reader died");
    return atoi(r->reply);
}

static int reader_write(reader *r, char c, const unsigned char *h, size_t so, size_t off, size_t n,
                        long long version)
{
    char hex[2 * MK_SHARE_HANDLE_BYTES + 1];
    hex_of(hex, h);
    return reader_cmd(r, "%c %s %zu %zu %zu %lld", c, hex, so, off, n, version);
}

/* the reader's parameters */
static void reader_dump(reader *r, float *p, size_t P)
{
    char path[] = "/tmp/mk_share_test_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_mk_ok(reader_cmd(r, "d %s", path));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(p, sizeof(float), P, f), P);
    fclose(f);
    unlink(path);
}

/* how many handles the reader opened so far and has open now (emulator); 0 on a device */
static int reader_opens(reader *r, long *opened, long *mapped)
{
    assert_int_equal(reader_cmd(r, "o"), 0);
    assert_int_equal(sscanf(r->reply, "%*d %ld %ld", opened, mapped), 2);
    return *opened >= 0;
}

static void reader_end(reader *r)
{
    fprintf(r->to, "q\n");
    fclose(r->to);
    fclose(r->from);
    int st;
    assert_int_equal(waitpid(r->pid, &st, 0), r->pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void assert_params(const float *got, const float *want, size_t P, const char *what)
{
    for (size_t i = 0; i < P; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)))
            fail_msg("%s: parameter %zu is %.9g, expected %.9g", what, i, got[i], want[i]);
}

/* A learner's share read by another process: a slice (src_off, off != 0) bit for bit; a wrong
 * version refused with the parameters untouched; a second fill read through the cached handle;
 * ranges beyond the share or the model; the stamp changing during the copy; a handle of this
 * process and a garbage one; ten shares through a cache of eight; and a reader with bfloat16
 * weights decoding with what it read. */
static void test_share(void **state)
{
    (void)state;
    NEED_GPU();
    mk_model *mw;
    assert_mk_ok(mk_model_new(&mw, &share_cfg, 1, 1, gpu));
    mk_model_init(mw, 21);
    size_t P = mk_model_num_params(mw), N1 = P - 100;
    float *pw = malloc(P * 4), *want = malloc(P * 4), *got = malloc(P * 4);
    assert_mk_ok(mk_model_read_params(mw, pw, 0, P));
    mk_share *s1;
    int rc = mk_share_new(mw, N1, &s1);
#ifndef MK_CUDA_EMU_TEST
    if (rc == MK_ERR_UNSUPPORTED) {
        fprintf(stderr, "skipped: %s\n", mk_last_error());
        free(pw), free(want), free(got);
        mk_model_free(mw);
        skip();
    }
#endif
    assert_mk_ok(rc);
    /* the writer's arguments */
    assert_int_equal(mk_share_fill(s1, mw, 0, N1 + 1, 1), MK_ERR_ARG);
    assert_int_equal(mk_share_fill(s1, mw, 101, N1, 1), MK_ERR_ARG);
    assert_int_equal(mk_share_fill(s1, mw, 0, N1, -1), MK_ERR_ARG);
    assert_mk_ok(mk_share_fill(s1, mw, 30, N1, 1)); /* share [0, N1) = params [30, 30 + N1) */
    unsigned char h1[MK_SHARE_HANDLE_BYTES], junk[MK_SHARE_HANDLE_BYTES];
    mk_share_handle(s1, h1);
    for (int i = 0; i < MK_SHARE_HANDLE_BYTES; i++) junk[i] = (unsigned char)(i * 37 + 11);

    /* in the exporting process itself: refused, nothing written */
    assert_int_equal(mk_model_write_params_shared(mw, h1, 0, 0, 10, 1), MK_ERR_DEVICE);
    assert_non_null(strstr(mk_last_error(), "cudaIpcOpenMemHandle"));
    assert_mk_ok(mk_model_read_params(mw, got, 0, P));
    assert_params(got, pw, P, "the exporter's own parameters");

    signal(SIGPIPE, SIG_IGN); /* a reader that died fails the test, not the process */
    reader r;
    reader_start(&r, "plain");
    long opened, mapped;
    reader_dump(&r, want, P); /* its own parameters, to start with */
    assert_int_equal(reader_write(&r, 'w', junk, 0, 0, 10, 1), MK_ERR_DEVICE);
    assert_non_null(strstr(r.reply, "cudaIpcOpenMemHandle"));

    /* a slice: share [17, 17 + K) into [5, 5 + K) */
    size_t K = N1 - 50;
    assert_mk_ok(reader_write(&r, 'w', h1, 17, 5, K, 1));
    memcpy(want + 5, pw + 30 + 17, K * 4);
    reader_dump(&r, got, P);
    assert_params(got, want, P, "a slice of version 1");
    /* the check alone: the version it holds and a range inside it pass; another version, a
     * range beyond it and a garbage handle do not; nothing is written */
    char hx[2 * MK_SHARE_HANDLE_BYTES + 1];
    hex_of(hx, h1);
    assert_mk_ok(reader_cmd(&r, "k %s %zu %zu %d", hx, (size_t)0, N1, 1));
    assert_int_equal(reader_cmd(&r, "k %s %zu %zu %d", hx, (size_t)0, N1, 2), MK_ERR_STATE);
    assert_int_equal(reader_cmd(&r, "k %s %zu %zu %d", hx, (size_t)1, N1, 1), MK_ERR_ARG);
    hex_of(hx, junk);
    assert_int_equal(reader_cmd(&r, "k %s %zu %zu %d", hx, (size_t)0, (size_t)1, 1), MK_ERR_DEVICE);
    reader_dump(&r, got, P);
    assert_params(got, want, P, "after the checks");
    /* a version the share does not hold: nothing written */
    assert_int_equal(reader_write(&r, 'w', h1, 0, 0, 10, 2), MK_ERR_STATE);
    assert_non_null(strstr(r.reply, "version 1"));
    reader_dump(&r, got, P);
    assert_params(got, want, P, "after a refused version");
    int counted = reader_opens(&r, &opened, &mapped);
    if (counted) assert_true(opened == 1 && mapped == 1);

    /* new parameters, version 2 in the same share: read through the handle already open */
    for (size_t i = 0; i < P; i++) pw[i] = pw[i] * -0.5f + 0.25f;
    assert_mk_ok(mk_model_write_params(mw, pw, 0, P));
    assert_mk_ok(mk_share_fill(s1, mw, 30, N1, 2));
    assert_int_equal(reader_write(&r, 'w', h1, 17, 5, K, 1), MK_ERR_STATE);
    assert_mk_ok(reader_write(&r, 'w', h1, 0, 3, N1, 2));
    memcpy(want + 3, pw + 30, N1 * 4);
    reader_dump(&r, got, P);
    assert_params(got, want, P, "the whole share at version 2");
    if (counted) {
        reader_opens(&r, &opened, &mapped);
        assert_true(opened == 1 && mapped == 1);
    }
    /* beyond the share (its n from the stamp), beyond the model */
    assert_int_equal(reader_write(&r, 'w', h1, N1 - 10, 0, 11, 2), MK_ERR_ARG);
    assert_non_null(strstr(r.reply, "of a share of"));
    assert_int_equal(reader_write(&r, 'w', h1, 0, P - 5, 6, 2), MK_ERR_ARG);
    assert_int_equal(reader_write(&r, 'w', h1, 0, 0, 10, -1), MK_ERR_ARG);
    reader_dump(&r, got, P);
    assert_params(got, want, P, "after refused ranges");
    /* the stamp moves during the copy (as a fill would move it): reported, not taken */
    assert_int_equal(reader_write(&r, 't', h1, 0, 0, 10, 2), MK_ERR_STATE);
    assert_non_null(strstr(r.reply, "during the copy"));
    memcpy(want, pw + 30, 10 * 4); /* the copy itself happened */

    /* nine more shares: ten opened through a cache of eight, each read into its own place */
    enum { NS = 9, SN = 64 };
    mk_share *sh[NS];
    unsigned char hs[NS][MK_SHARE_HANDLE_BYTES];
    for (int i = 0; i < NS; i++) {
        assert_mk_ok(mk_share_new(mw, SN, &sh[i]));
        assert_mk_ok(mk_share_fill(sh[i], mw, 100 + 50 * (size_t)i, SN, 7 + i));
        mk_share_handle(sh[i], hs[i]);
        assert_mk_ok(reader_write(&r, 'w', hs[i], 0, 1000 + SN * (size_t)i, SN, 7 + i));
        memcpy(want + 1000 + SN * i, pw + 100 + 50 * i, SN * 4);
    }
    if (counted) {
        reader_opens(&r, &opened, &mapped);
        assert_true(opened == 1 + NS && mapped == 8);
    }
    /* the first share was closed (least recent): opened again, at a new version */
    assert_mk_ok(mk_share_fill(s1, mw, 0, N1, 3));
    assert_mk_ok(reader_write(&r, 'w', h1, 40, 2000, 500, 3));
    memcpy(want + 2000, pw + 40, 500 * 4);
    assert_mk_ok(reader_write(&r, 'w', hs[NS - 1], 0, 3000, SN, 7 + NS - 1)); /* still open */
    memcpy(want + 3000, pw + 100 + 50 * (NS - 1), SN * 4);
    if (counted) {
        reader_opens(&r, &opened, &mapped);
        assert_true(opened == 2 + NS && mapped == 8);
    }
    reader_dump(&r, got, P);
    assert_params(got, want, P, "ten shares through the cache");
    reader_end(&r);
    for (int i = 0; i < NS; i++) mk_share_free(sh[i]);

    /* a reader with bfloat16 weights decodes with the parameters it read (the copies stale) */
    mk_share *sp;
    assert_mk_ok(mk_share_new(mw, P, &sp));
    assert_mk_ok(mk_share_fill(sp, mw, 0, P, 5));
    unsigned char hp[MK_SHARE_HANDLE_BYTES];
    mk_share_handle(sp, hp);
    reader_start(&r, "bf16");
    assert_int_equal(reader_write(&r, 'w', junk, 0, 0, 10, 5), MK_ERR_DEVICE);
    double diff, change;
    assert_mk_ok(reader_cmd(&r, "c")); /* A's copies made from its own parameters */
    assert_int_equal(sscanf(r.reply, "%*d %lf %lf", &diff, &change), 2);
    assert_true(diff <= 1e-6);
    assert_mk_ok(reader_write(&r, 'w', hp, 0, 0, P, 5));
    assert_mk_ok(reader_cmd(&r, "c"));
    assert_int_equal(sscanf(r.reply, "%*d %lf %lf", &diff, &change), 2);
    fprintf(stderr, "bf16 reader: logits %g from the reference, moved %g\n", diff, change);
    assert_true(diff <= 1e-6 && change > 1e-3);
    reader_end(&r);

    mk_share_free(sp);
    mk_share_free(s1);
    free(pw), free(want), free(got);
    mk_model_free(mw);
}

#ifdef MK_CUDA_EMU_TEST
/* A process maps only memory of the devices it sees: a reader given another device by
 * CUDA_VISIBLE_DEVICES (as a node agent gives a rollout a GPU of its own) cannot open a share
 * made on device 7, and says so (MK_ERR_DEVICE, the caller falls back to buckets); one given
 * device 7 among others reads it (manta_gpu_see_node), unless the devices have no peer access
 * (MK_CUDA_EMU_P2P=0), where only a reader on device 7 itself does.  The emulator models it
 * (cuda_runtime_api.h); on a GPU, CUDA does the refusing. */
static void test_share_visibility(void **state)
{
    (void)state;
    NEED_GPU();
    const char *had = getenv("CUDA_VISIBLE_DEVICES");
    char saved[256] = "";
    if (had) snprintf(saved, sizeof saved, "%s", had);
    mk_model *mw;
    assert_mk_ok(mk_model_new(&mw, &share_cfg, 1, 1, gpu));
    mk_model_init(mw, 5);
    size_t P = mk_model_num_params(mw);
    setenv("CUDA_VISIBLE_DEVICES", "7", 1); /* the exporter's device */
    mk_share *s;
    assert_mk_ok(mk_share_new(mw, P, &s));
    assert_mk_ok(mk_share_fill(s, mw, 0, P, 3));
    unsigned char h[MK_SHARE_HANDLE_BYTES];
    mk_share_handle(s, h);
    signal(SIGPIPE, SIG_IGN);
    reader r;
    setenv("CUDA_VISIBLE_DEVICES", "3", 1);
    reader_start(&r, "plain");
    assert_int_equal(reader_write(&r, 'w', h, 0, 0, P, 3), MK_ERR_DEVICE);
    assert_non_null(strstr(r.reply, "cudaIpcOpenMemHandle"));
    reader_end(&r);
    setenv("CUDA_VISIBLE_DEVICES", "2,7", 1);
    reader_start(&r, "plain");
    assert_mk_ok(reader_write(&r, 'w', h, 0, 0, P, 3));
    float *want = malloc(P * 4), *got = malloc(P * 4);
    assert_mk_ok(mk_model_read_params(mw, want, 0, P));
    reader_dump(&r, got, P);
    assert_params(got, want, P, "read on a device it sees");
    reader_end(&r);
    /* GPUs without peer access: seeing device 7 is not enough when the reader computes on
     * another (its first); on device 7 itself it reads */
    setenv("MK_CUDA_EMU_P2P", "0", 1);
    reader_start(&r, "plain");
    assert_int_equal(reader_write(&r, 'w', h, 0, 0, P, 3), MK_ERR_DEVICE);
    assert_non_null(strstr(r.reply, "peer access is not supported"));
    reader_end(&r);
    setenv("CUDA_VISIBLE_DEVICES", "7,2", 1);
    reader_start(&r, "plain");
    assert_mk_ok(reader_write(&r, 'w', h, 0, 0, P, 3));
    memset(got, 0, P * 4);
    reader_dump(&r, got, P);
    assert_params(got, want, P, "read on its own device without peer access");
    reader_end(&r);
    unsetenv("MK_CUDA_EMU_P2P");
    if (had)
        setenv("CUDA_VISIBLE_DEVICES", saved, 1);
    else
        unsetenv("CUDA_VISIBLE_DEVICES");
    free(want), free(got);
    mk_share_free(s);
    mk_model_free(mw);
}
#endif

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--share-reader")) return share_reader(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_and_norms),
        cmocka_unit_test(test_matmul_and_head),
        cmocka_unit_test(test_qk),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_rows_and_optimiser),
        cmocka_unit_test(test_shard_slices),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_sample_rows),
        cmocka_unit_test(test_model_gpt2),
        cmocka_unit_test(test_model_families),
        cmocka_unit_test(test_fused_epilogues),
        cmocka_unit_test(test_bf16_train_ops),
        cmocka_unit_test(test_model_bf16_train),
        cmocka_unit_test(test_share),
#ifdef MK_CUDA_EMU_TEST
        cmocka_unit_test(test_share_visibility),
#endif
    };
    mk_set_threads(2);
    return cmocka_run_group_tests(tests, setup, NULL);
}
