/*
 * test_ops.c - every op of the CPU back-end against finite differences, the
 * decode attention against the training attention, the optimiser helpers
 * against hand-computed values, and the whole model's gradient (both losses)
 * against finite differences of the loss, for GPT-2, Llama and Qwen3 shapes.
 * (The ops of the Llama/Qwen families are checked one by one in
 * test_ops_family.c.)
 *
 * Each op check uses the scalar objective J = sum(dout * out) with a random
 * dout, so that the backward op's output is dJ/dinput; central differences
 * with step h in float32 give about 1e-3 relative accuracy, hence the
 * tolerances (atol 2e-3, rtol 2e-2).
 */
#include "ktest.h"

#include "mk_internal.h"

static const mk_backend *be = &mk__cpu_backend;

typedef struct fd_ctx {
    void (*fwd)(void);
    const float *out;
    const float *dout;
    size_t nout;
} fd_ctx;

static double objective(const fd_ctx *c)
{
    c->fwd();
    double s = 0.0;
    for (size_t i = 0; i < c->nout; i++) s += (double)c->dout[i] * c->out[i];
    return s;
}

static void fd_check_(const fd_ctx *c, float *x, size_t n, const float *analytic, float h,
                      const char *label, const char *file, int line)
{
    float *num = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float save = x[i];
        x[i] = save + h;
        double jp = objective(c);
        x[i] = save - h;
        double jm = objective(c);
        x[i] = save;
        num[i] = (float)((jp - jm) / (2.0 * h));
    }
    c->fwd();
    check_close_(analytic, num, n, 2e-3, 2e-2, label, file, line);
    free(num);
}
#define fd_check(c, x, n, an, h, label)                                                            \
    fd_check_((c), (x), (n), (an), (h), (label), __FILE__, __LINE__)

static float *rnd(size_t n, float lo, float hi, mk_rng *r)
{
    float *x = malloc(n * sizeof(float));
    fill_uniform(x, n, lo, hi, r);
    return x;
}

static float *zeros(size_t n)
{
    return calloc(n, sizeof(float));
}

/* ---- LayerNorm ---------------------------------------------------------- */

enum { LR = 5, LC = 7 };
static float *ln_x, *ln_w, *ln_b, *ln_out, ln_mean[LR], ln_rstd[LR];
static void ln_run(void)
{
    be->ln_fwd(ln_out, ln_mean, ln_rstd, ln_x, ln_w, ln_b, LR, LC, 1e-5f);
}

static void test_layernorm(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 1);
    ln_x = rnd(LR * LC, -2, 2, &r), ln_w = rnd(LC, 0.5, 1.5, &r), ln_b = rnd(LC, -1, 1, &r);
    ln_out = zeros(LR * LC);
    float *dout = rnd(LR * LC, -1, 1, &r), *dx = zeros(LR * LC), *dw = zeros(LC), *db = zeros(LC);
    ln_run();
    /* the output of each row has mean b-weighted 0 and unit variance before the affine */
    be->ln_bwd(dx, dw, db, dout, ln_x, ln_w, ln_mean, ln_rstd, LR, LC);
    fd_ctx c = {ln_run, ln_out, dout, LR * LC};
    fd_check(&c, ln_x, LR * LC, dx, 1e-3f, "layernorm dx");
    fd_check(&c, ln_w, LC, dw, 1e-3f, "layernorm dw");
    fd_check(&c, ln_b, LC, db, 1e-3f, "layernorm db");
    /* backward adds: a second call doubles dw */
    float dw0 = dw[3];
    be->ln_bwd(dx, dw, db, dout, ln_x, ln_w, ln_mean, ln_rstd, LR, LC);
    assert_near(dw[3], 2 * dw0, 1e-6);
    free(ln_x), free(ln_w), free(ln_b), free(ln_out), free(dout), free(dx), free(dw), free(db);
}

/* add_norm_fwd is add then ln_fwd / rms_fwd, bit for bit, into fresh arrays and in place as
 * the decoder calls it (res = a, out = b) */
static void test_add_norm(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 11);
    enum { NR = 37, NC = 300 }; /* NR x NC above the parallel threshold's 16384 */
    size_t n = (size_t)NR * NC;
    float *a = rnd(n, -3, 3, &r), *b = rnd(n, -3, 3, &r), *w = rnd(NC, 0.5, 1.5, &r),
          *bias = rnd(NC, -1, 1, &r);
    float *res = zeros(n), *out = zeros(n), *want = zeros(n), *sum = zeros(n);
    float mean[NR], rstd[NR], wmean[NR], wrstd[NR];
    for (int rms = 0; rms < 2; rms++) {
        be->add(sum, a, b, n);
        if (rms)
            be->rms_fwd(want, wrstd, sum, w, NR, NC, 1e-6f);
        else
            be->ln_fwd(want, wmean, wrstd, sum, w, bias, NR, NC, 1e-5f);
        be->add_norm_fwd(res, out, mean, rstd, a, b, w, bias, NR, NC, rms ? 1e-6f : 1e-5f, rms);
        assert_memory_equal(res, sum, n * sizeof(float));
        assert_memory_equal(out, want, n * sizeof(float));
        assert_memory_equal(rstd, wrstd, sizeof rstd);
        if (!rms) assert_memory_equal(mean, wmean, sizeof mean);
        float *a2 = malloc(n * sizeof(float)), *b2 = malloc(n * sizeof(float));
        assert_non_null(a2), assert_non_null(b2);
        memcpy(a2, a, n * sizeof(float)), memcpy(b2, b, n * sizeof(float));
        be->add_norm_fwd(a2, b2, NULL, NULL, a2, b2, w, bias, NR, NC, rms ? 1e-6f : 1e-5f, rms);
        assert_memory_equal(a2, sum, n * sizeof(float));
        assert_memory_equal(b2, want, n * sizeof(float));
        free(a2), free(b2);
    }
    free(a), free(b), free(w), free(bias), free(res), free(out), free(want), free(sum);
}

/* ---- matrix products ---------------------------------------------------- */

enum { MR = 4, MIC = 5, MOC = 6, HV = 7 };
static float *mm_x, *mm_w, *mm_b, *mm_out;
static void mm_run(void)
{
    be->mm_fwd(mm_out, mm_x, mm_w, mm_b, MR, MIC, MOC);
}
static void head_run(void)
{
    be->head_fwd(mm_out, mm_x, mm_w, MR, MIC, HV);
}

static void test_matmul(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 2);
    mm_x = rnd(MR * MIC, -1, 1, &r), mm_w = rnd(MIC * MOC, -1, 1, &r), mm_b = rnd(MOC, -1, 1, &r);
    mm_out = zeros(MR * MOC);
    float *dout = rnd(MR * MOC, -1, 1, &r), *dx = zeros(MR * MIC), *dw = zeros(MIC * MOC),
          *db = zeros(MOC);
    mm_run();
    /* one element by hand */
    float want = mm_b[2];
    for (int k = 0; k < MIC; k++) want += mm_x[1 * MIC + k] * mm_w[k * MOC + 2];
    assert_near(mm_out[1 * MOC + 2], want, 1e-5);
    be->mm_bwd(dx, dw, db, dout, mm_x, mm_w, MR, MIC, MOC);
    fd_ctx c = {mm_run, mm_out, dout, MR * MOC};
    fd_check(&c, mm_x, MR * MIC, dx, 1e-2f, "matmul dx");
    fd_check(&c, mm_w, MIC * MOC, dw, 1e-2f, "matmul dw");
    fd_check(&c, mm_b, MOC, db, 1e-2f, "matmul db");
    free(mm_x), free(mm_w), free(mm_b), free(mm_out), free(dout), free(dx), free(dw), free(db);
}

static void test_head(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 3);
    mm_x = rnd(MR * MIC, -1, 1, &r), mm_w = rnd(HV * MIC, -1, 1, &r);
    mm_out = zeros(MR * HV);
    float *dout = rnd(MR * HV, -1, 1, &r), *dx = zeros(MR * MIC), *dw = zeros(HV * MIC);
    head_run();
    float want = 0;
    for (int k = 0; k < MIC; k++) want += mm_x[2 * MIC + k] * mm_w[5 * MIC + k];
    assert_near(mm_out[2 * HV + 5], want, 1e-5);
    be->head_bwd(dx, dw, dout, mm_x, mm_w, MR, MIC, HV);
    fd_ctx c = {head_run, mm_out, dout, MR * HV};
    fd_check(&c, mm_x, MR * MIC, dx, 1e-2f, "head dx");
    fd_check(&c, mm_w, HV * MIC, dw, 1e-2f, "head dwte");
    free(mm_x), free(mm_w), free(mm_out), free(dout), free(dx), free(dw);
}

/* ---- attention ---------------------------------------------------------- */

enum { AB = 2, AT = 5, AC = 8, ANH = 2 };
static float *at_qkv, *at_out, *at_att;
static void attn_run(void)
{
    be->attn_fwd(at_out, at_att, at_qkv, AB, AT, ANH, ANH, AC / ANH);
}

static void test_attention(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 4);
    size_t nqkv = AB * AT * 3 * AC;
    at_qkv = rnd(nqkv, -1.5, 1.5, &r), at_out = zeros(AB * AT * AC);
    at_att = zeros(AB * ANH * AT * AT);
    float *dout = rnd(AB * AT * AC, -1, 1, &r), *dqkv = rnd(nqkv, 5, 6, &r); /* overwritten */
    attn_run();
    /* causality and normalisation of the probabilities */
    for (int i = 0; i < AB * ANH; i++)
        for (int t = 0; t < AT; t++) {
            double s = 0;
            for (int t2 = 0; t2 < AT; t2++) {
                float p = at_att[(i * AT + t) * AT + t2];
                if (t2 > t) assert_true(p == 0.0f);
                s += p;
            }
            assert_near(s, 1.0, 1e-5);
        }
    /* position 0 attends only to itself: output = its value */
    for (int d = 0; d < AC; d++) assert_near(at_out[d], at_qkv[2 * AC + d], 1e-6);
    float *datt = zeros(AB * ANH * AT * AT);
    be->attn_bwd(dqkv, datt, dout, at_qkv, at_att, AB, AT, ANH, ANH, AC / ANH);
    fd_ctx c = {attn_run, at_out, dout, AB * AT * AC};
    fd_check(&c, at_qkv, nqkv, dqkv, 1e-3f, "attention dqkv");

    /* the decode path over a KV cache gives the same outputs */
    int S = AB, Tmax = AT + 3;
    float *kc = zeros((size_t)S * Tmax * AC), *vc = zeros((size_t)S * Tmax * AC);
    float *y = zeros(AB * AT * AC), *scores = zeros((size_t)AB * AT * ANH * Tmax);
    int slot[AB * AT], pos[AB * AT];
    for (int b = 0; b < AB; b++)
        for (int t = 0; t < AT; t++) slot[b * AT + t] = b, pos[b * AT + t] = t;
    be->kv_store(kc, vc, at_qkv, slot, pos, AB * AT, ANH, ANH, AC / ANH, Tmax);
    be->attn_decode(y, scores, at_qkv, kc, vc, slot, pos, AB * AT, ANH, ANH, AC / ANH, Tmax);
    check_close(y, at_out, AB * AT * AC, 1e-6, 1e-5, "attn_decode vs attn_fwd");
    free(kc), free(vc), free(y), free(scores), free(datt);
    free(at_qkv), free(at_out), free(at_att), free(dout), free(dqkv);
}

/* ---- GELU, embeddings --------------------------------------------------- */

enum { GN = 40 };
static float *g_x, *g_out;
static void gelu_run(void)
{
    be->gelu_fwd(g_out, g_x, GN);
}

static void test_gelu(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 5);
    g_x = rnd(GN, -4, 4, &r), g_out = zeros(GN);
    float *dout = rnd(GN, -1, 1, &r), *dx = zeros(GN);
    g_x[0] = 1.0f;
    gelu_run();
    assert_near(g_out[0], 0.8411920f, 1e-6); /* tanh-GELU(1) */
    be->gelu_bwd(dx, g_x, dout, GN);
    fd_ctx c = {gelu_run, g_out, dout, GN};
    fd_check(&c, g_x, GN, dx, 1e-3f, "gelu dx");
    free(g_x), free(g_out), free(dout), free(dx);
}

enum { ER = 6, EC = 3, EV = 4, ET = 5 };
static float *e_wte, *e_wpe, *e_out;
static int e_tok[ER] = {1, 3, 1, 0, 3, 3}, e_pos[ER] = {0, 1, 2, 0, 1, 4};
static void embed_run(void)
{
    be->embed_fwd(e_out, e_tok, e_pos, e_wte, e_wpe, ER, EC);
}

static void test_embedding(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 6);
    e_wte = rnd(EV * EC, -1, 1, &r), e_wpe = rnd(ET * EC, -1, 1, &r), e_out = zeros(ER * EC);
    float *dout = rnd(ER * EC, -1, 1, &r), *dwte = zeros(EV * EC), *dwpe = zeros(ET * EC);
    embed_run();
    assert_near(e_out[4 * EC + 2], e_wte[3 * EC + 2] + e_wpe[1 * EC + 2], 1e-7);
    be->embed_bwd(dwte, dwpe, dout, e_tok, e_pos, ER, EC);
    fd_ctx c = {embed_run, e_out, dout, ER * EC};
    fd_check(&c, e_wte, EV * EC, dwte, 1e-2f, "embedding dwte");
    fd_check(&c, e_wpe, ET * EC, dwpe, 1e-2f, "embedding dwpe");
    free(e_wte), free(e_wpe), free(e_out), free(dout), free(dwte), free(dwpe);
}

/* ---- softmax rows: log-probs and entropy -------------------------------- */

enum { SR = 3, SV = 6 };
static float *s_logits, s_stats[2 * SR];
static int s_tg[SR] = {2, -1, 5};
static void stats_run(void)
{
    be->row_stats(s_stats, s_stats + SR, s_logits, s_tg, SR, SV);
}

static void test_row_stats_and_grad(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 7);
    s_logits = rnd(SR * SV, -3, 3, &r);
    float coef[2 * SR], *d = zeros(SR * SV);
    fill_uniform(coef, 2 * SR, -1, 1, &r);
    stats_run();
    /* row 0 by hand */
    double lse = 0, pz = 0;
    for (int j = 0; j < SV; j++) lse += exp(s_logits[j]);
    for (int j = 0; j < SV; j++) pz += exp(s_logits[j]) / lse * s_logits[j];
    assert_near(s_stats[0], s_logits[2] - log(lse), 1e-6);
    assert_near(s_stats[SR], log(lse) - pz, 1e-5);
    assert_true(s_stats[1] == 0.0f); /* no target */
    be->row_grad(d, s_logits, s_tg, coef, coef + SR, SR, SV);
    fd_ctx c = {stats_run, s_stats, coef, 2 * SR};
    fd_check(&c, s_logits, SR * SV, d, 1e-3f, "row_grad dlogits");
    free(s_logits), free(d);
}

/* ---- optimiser helpers -------------------------------------------------- */

static void test_adamw_by_hand(void **state)
{
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.0f}, m[2] = {0}, v[2] = {0};
    mk_adamw(p, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
    /* m = 0.05, v = 0.00025, mhat = 0.5, vhat = 0.25: p = 1*(1 - 0.001) - 0.1 */
    assert_near(p[0], 0.899, 1e-6);
    assert_near(m[0], 0.05, 1e-7);
    assert_near(v[0], 0.00025, 1e-8);            /* 1 - 0.999f is 0.00099999 in float */
    assert_near(p[1], -2.0 * (1 - 0.001), 1e-6); /* zero gradient: decay only */
    g[0] = -0.25f;
    mk_adamw(p, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2);
    double m2 = 0.9 * 0.05 - 0.1 * 0.25, v2 = 0.999 * 0.00025 + 0.001 * 0.0625;
    double want =
        0.899 * (1 - 0.001) - 0.1 * (m2 / (1 - 0.81)) / (sqrt(v2 / (1 - 0.998001)) + 1e-8);
    assert_near(p[0], want, 1e-6);
}

static void test_sumsq_shards_and_clip(void **state)
{
    mk_rng r;
    mk_rng_seed(&r, 8);
    size_t n = 1001;
    float *x = rnd(n, -1, 1, &r);
    double whole = mk_sumsq(x, n), parts = mk_sumsq(x, 300) + mk_sumsq(x + 300, 701), ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    assert_near(whole, ref, 1e-9 * ref);
    assert_near(parts, ref, 1e-9 * ref);
    assert_near(mk_clip_factor(16.0, 2.0f), 2.0 / (4.0 + 1e-6), 1e-7);
    assert_true(mk_clip_factor(1.0, 2.0f) == 1.0f);
    assert_true(mk_clip_factor(1e6, 0.0f) == 1.0f); /* 0 disables clipping */
    mk_scale(x, 0.5f, n);
    assert_near(mk_sumsq(x, n), ref / 4, 1e-6 * ref);
    free(x);
}

/* A shard's slice ops (mk_model_grad_scale, _grad_sumsq_range, _adamw_range, the moments) over
 * S slices, against the whole-model step: bit-equal parameters and moments after three steps
 * (weight decay on the 2-D tensors only, slices that cut tensors), scaling and norms bit-equal
 * to mk_scale and mk_sumsq; ranges outside the vector and inference-only models refused. */
static void test_shard_slices(void **state)
{
    mk_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 11};
    mk_model *whole, *shard, *inf;
    assert_mk_ok(mk_model_new(&whole, &cfg, 1, 4, NULL));
    assert_mk_ok(mk_model_new(&shard, &cfg, 1, 4, NULL));
    mk_model_init(whole, 3), mk_model_init(shard, 3);
    size_t P = mk_model_num_params(whole);
    float *g = malloc(P * sizeof(float)), *a = malloc(P * sizeof(float));
    float *b = malloc(P * sizeof(float));
    mk_rng r;
    mk_rng_seed(&r, 12);
    mk_adamw_params ap = {
        .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (int t = 1; t <= 3; t++) {
        for (size_t i = 0; i < P; i++) g[i] = mk_rng_uniform(&r) - 0.5f;
        assert_mk_ok(mk_model_write_grads(whole, g, 0, P));
        assert_mk_ok(mk_model_write_grads(shard, g, 0, P));
        assert_mk_ok(mk_model_step(whole, &ap, t, NULL));
        for (size_t k = 0; k < 3; k++) { /* the first P % 3 slices one longer */
            size_t n = P / 3 + (k < P % 3), off = k * (P / 3) + (k < P % 3 ? k : P % 3);
            double ss;
            assert_mk_ok(mk_model_grad_sumsq_range(shard, off, n, &ss));
            assert_true(ss == mk_sumsq(g + off, n));
            assert_mk_ok(mk_model_grad_scale(shard, off, n, 0.5f));
            assert_mk_ok(mk_model_grad_scale(shard, off, n, 2.0f)); /* exact: powers of 2 */
            assert_mk_ok(mk_model_adamw_range(shard, off, n, &ap, t));
        }
        assert_mk_ok(mk_model_sync(shard));
    }
    assert_mk_ok(mk_model_read_params(whole, a, 0, P));
    assert_mk_ok(mk_model_read_params(shard, b, 0, P));
    assert_memory_equal(a, b, P * sizeof(float));
    for (int w = 0; w < 2; w++) {
        memcpy(a, w ? mk_model_adam_v(whole) : mk_model_adam_m(whole), P * sizeof(float));
        assert_mk_ok(mk_model_read_moments(shard, w, b, 0, P));
        assert_memory_equal(a, b, P * sizeof(float));
    }
    /* the moments written back are read back; the parameters and the other moment stay */
    for (size_t i = 0; i < 7; i++) a[i] = (float)i;
    assert_mk_ok(mk_model_write_moments(shard, 1, a, P - 7, 7));
    assert_mk_ok(mk_model_read_moments(shard, 1, b, P - 7, 7));
    assert_memory_equal(a, b, 7 * sizeof(float));
    assert_memory_equal(mk_model_adam_m(whole), mk_model_adam_m(shard), P * sizeof(float));
    /* a scale is x *= s element by element */
    memcpy(a, mk_model_grads(shard), P * sizeof(float));
    assert_mk_ok(mk_model_grad_scale(shard, 5, 9, 0.3f));
    mk_scale(a + 5, 0.3f, 9);
    assert_memory_equal(a, mk_model_grads(shard), P * sizeof(float));
    /* refused */
    double ss;
    assert_int_equal(mk_model_grad_scale(shard, P - 1, 2, 1.0f), MK_ERR_ARG);
    assert_int_equal(mk_model_grad_sumsq_range(shard, P + 1, 0, &ss), MK_ERR_ARG);
    assert_int_equal(mk_model_grad_sumsq_range(shard, 0, 1, NULL), MK_ERR_ARG);
    assert_int_equal(mk_model_adamw_range(shard, 0, P, &ap, 0), MK_ERR_ARG);
    assert_int_equal(mk_model_adamw_range(shard, 0, P + 1, &ap, 1), MK_ERR_ARG);
    assert_int_equal(mk_model_read_moments(shard, 2, b, 0, 1), MK_ERR_ARG);
    assert_int_equal(mk_model_write_moments(shard, 0, NULL, 0, 1), MK_ERR_ARG);
    assert_mk_ok(mk_model_new_ex(&inf, &cfg, 1, 4, NULL, MK_MODEL_INFER));
    assert_int_equal(mk_model_grad_scale(inf, 0, 1, 1.0f), MK_ERR_STATE);
    assert_int_equal(mk_model_adamw_range(inf, 0, 1, &ap, 1), MK_ERR_STATE);
    assert_int_equal(mk_model_read_moments(inf, 0, b, 0, 1), MK_ERR_STATE);
    mk_model_free(inf), mk_model_free(whole), mk_model_free(shard);
    free(g), free(a), free(b);
}

/* ZeRO stage 1: three models that keep only their slice's moments (mk_model_shard_moments),
 * each stepping its slice, against the whole-model step: bit-equal parameters and moments of
 * each slice; ranges outside a shard's moments and the whole-model step refused. */
static void test_shard_moments(void **state)
{
    mk_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 13};
    mk_model *whole, *sh[3];
    assert_mk_ok(mk_model_new(&whole, &cfg, 1, 4, NULL));
    mk_model_init(whole, 4);
    size_t P = mk_model_num_params(whole), off[3], len[3];
    for (size_t k = 0; k < 3; k++) {
        len[k] = P / 3 + (k < P % 3), off[k] = k * (P / 3) + (k < P % 3 ? k : P % 3);
        assert_mk_ok(mk_model_new(&sh[k], &cfg, 1, 4, NULL));
        mk_model_init(sh[k], 4);
        assert_mk_ok(mk_model_shard_moments(sh[k], off[k], len[k]));
    }
    float *g = malloc(P * sizeof(float)), *a = malloc(P * sizeof(float));
    float *b = malloc(P * sizeof(float));
    mk_rng r;
    mk_rng_seed(&r, 14);
    mk_adamw_params ap = {
        .lr = 0.02f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.2f};
    for (int t = 1; t <= 3; t++) {
        fill_uniform(g, P, -1, 1, &r);
        assert_mk_ok(mk_model_write_grads(whole, g, 0, P));
        assert_mk_ok(mk_model_step(whole, &ap, t, NULL));
        for (int k = 0; k < 3; k++) {
            assert_mk_ok(mk_model_write_grads(sh[k], g, 0, P));
            assert_mk_ok(mk_model_adamw_range(sh[k], off[k], len[k], &ap, t));
        }
    }
    for (int k = 0; k < 3; k++) {
        assert_mk_ok(mk_model_read_params(sh[k], b, off[k], len[k]));
        assert_memory_equal(mk_model_params(whole) + off[k], b, len[k] * sizeof(float));
        assert_mk_ok(mk_model_read_moments(sh[k], 1, b, off[k], len[k]));
        assert_memory_equal(mk_model_adam_v(whole) + off[k], b, len[k] * sizeof(float));
        assert_memory_equal(mk_model_adam_m(whole) + off[k], mk_model_adam_m(sh[k]),
                            len[k] * sizeof(float));
    }
    assert_int_equal(mk_model_adamw_range(sh[1], off[1] - 1, 2, &ap, 4), MK_ERR_ARG);
    assert_int_equal(mk_model_read_moments(sh[1], 0, a, off[2], 1), MK_ERR_ARG);
    assert_int_equal(mk_model_write_moments(sh[0], 0, a, 0, len[0] + 1), MK_ERR_ARG);
    assert_int_equal(mk_model_step(sh[0], &ap, 4, NULL), MK_ERR_STATE);
    assert_int_equal(mk_model_shard_moments(sh[0], P, 1), MK_ERR_ARG);
    assert_mk_ok(mk_model_shard_moments(sh[2], P, 0)); /* an empty slice */
    assert_mk_ok(mk_model_adamw_range(sh[2], P, 0, &ap, 4));
    mk_model_free(whole);
    for (int k = 0; k < 3; k++) mk_model_free(sh[k]);
    free(g), free(a), free(b);
}

/* ---- the whole model against finite differences of its loss ------------- */

static mk_model *fm;
static int fm_tok[2 * 6], fm_tg[2 * 6];
static float fm_w[2 * 6], fm_behav[2 * 6], fm_adv[2 * 6];
static int fm_ppo;
static const mk_ppo_params fm_pp = {
    .clip_low = 0.2f, .clip_high = 0.2f, .ratio_cap = 2.0f, .entropy_coef = 0.05f};

static float model_loss(void)
{
    float loss = 0;
    mk_ppo_stats s;
    assert_mk_ok(mk_forward(fm, fm_tok, 2, 6));
    if (fm_ppo) {
        assert_mk_ok(mk_loss_ppo(fm, fm_tg, fm_behav, fm_adv, fm_w, &fm_pp, &s));
        loss = s.loss;
    } else {
        assert_mk_ok(mk_loss_ce(fm, fm_tg, fm_w, &loss));
    }
    return loss;
}

static void model_fd(int ppo)
{
    fm_ppo = ppo;
    model_loss();
    mk_zero_grad(fm);
    assert_mk_ok(mk_backward(fm));
    float *p = mk_model_params(fm), *g = mk_model_grads(fm);
    mk_rng r;
    mk_rng_seed(&r, 99);
    int checked = 0;
    for (int i = 0; i < mk_model_num_tensors(fm); i++) {
        mk_tensor_info t;
        mk_model_tensor(fm, i, &t);
        for (int k = 0; k < 4; k++) {
            size_t j = t.offset + mk_rng_next(&r) % t.numel;
            float save = p[j], h = 2e-3f;
            p[j] = save + h;
            double lp = model_loss();
            p[j] = save - h;
            double lm = model_loss();
            p[j] = save;
            float num = (float)((lp - lm) / (2 * h));
            if (!(fabsf(num - g[j]) <= 2e-3f + 3e-2f * fabsf(num))) {
                fprintf(stderr, "%s %s[%zu]: analytic %g numeric %g\n", ppo ? "ppo" : "ce", t.name,
                        j - t.offset, g[j], num);
                fail();
            }
            checked++;
        }
    }
    assert_true(checked == 4 * mk_model_num_tensors(fm));
}

/* Every parameter tensor of a model of cfg, four elements each, for both losses. */
static void model_gradients(const mk_config *cfg)
{
    assert_mk_ok(mk_model_new(&fm, cfg, 2, 6, NULL));
    mk_model_init(fm, 5);
    /* larger weights than the init so every path carries signal */
    size_t P = mk_model_num_params(fm);
    float *p = mk_model_params(fm);
    mk_rng r;
    mk_rng_seed(&r, 6);
    for (size_t i = 0; i < P; i++) p[i] += 0.3f * (mk_rng_uniform(&r) - 0.5f);
    for (int i = 0; i < 12; i++) {
        fm_tok[i] = (int)(mk_rng_next(&r) % cfg->vocab_size);
        fm_tg[i] = (int)(mk_rng_next(&r) % cfg->vocab_size);
        fm_w[i] = i % 5 == 3 ? 0.0f : 1.0f;
        fm_adv[i] = 2 * mk_rng_uniform(&r) - 1;
    }
    float lp[12];
    model_loss();
    assert_mk_ok(mk_logprobs(fm, fm_tg, lp, NULL));
    for (int i = 0; i < 12; i++) fm_behav[i] = lp[i] + 0.1f * (mk_rng_uniform(&r) - 0.5f);
    model_fd(0);
    model_fd(1);
    mk_model_free(fm);
}

static void test_model_gradients(void **state)
{
    mk_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 11};
    model_gradients(&cfg);
}

/* Llama with grouped-query attention (2 query heads a kv head), an untied head and every
 * optional bias; Qwen3 with q/k norms and a head size apart from n_embd / n_head. */
static void test_model_gradients_families(void **state)
{
    mk_config llama = {.n_layer = 2,
                       .n_head = 4,
                       .n_embd = 16,
                       .block_size = 8,
                       .vocab_size = 11,
                       .arch = MK_ARCH_LLAMA,
                       .n_kv_head = 2,
                       .n_inner = 24,
                       .untied_head = 1,
                       .attn_bias = 1,
                       .attn_out_bias = 1,
                       .mlp_bias = 1};
    model_gradients(&llama);
    mk_config qwen3 = {.n_layer = 2,
                       .n_head = 4,
                       .n_embd = 12,
                       .block_size = 8,
                       .vocab_size = 11,
                       .arch = MK_ARCH_QWEN3,
                       .n_kv_head = 1,
                       .head_dim = 6,
                       .n_inner = 20};
    model_gradients(&qwen3);
}

/* The model's fused MLP ops on a back-end without them (mk__mm_gelu_fwd, mk__mm_gelu_bwd) are
 * mm_fwd then gelu_fwd, and mm_bwd then gelu_bwd, bit for bit: with pre kept and without (the
 * decoder), without a bias, and for the backward with dw and dbias added into.  Skinny (1 row)
 * and BLAS-sized shapes, odd widths. */
static void test_mm_gelu_fallback(void **state)
{
    (void)state;
    mk_rng r;
    mk_rng_seed(&r, 12);
    const int shapes[][3] = {{1, 7, 12}, {9, 7, 13}, {40, 16, 64}, {0, 4, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int NR = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        size_t ni = (size_t)NR * IC, no = (size_t)NR * OC, nw = (size_t)IC * OC;
        float *x = malloc((ni + 1) * sizeof(float)), *w = malloc(nw * sizeof(float));
        float *bias = malloc(OC * sizeof(float));
        float *pre = malloc((no + 1) * sizeof(float)), *out = malloc((no + 1) * sizeof(float));
        float *wpre = malloc((no + 1) * sizeof(float)), *wout = malloc((no + 1) * sizeof(float));
        fill_uniform(x, ni + 1, -1, 1, &r), fill_uniform(w, nw, -1, 1, &r);
        fill_uniform(bias, OC, -1, 1, &r);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *b = with_bias ? bias : NULL;
            fill_uniform(pre, no + 1, -9, 9, &r), fill_uniform(out, no + 1, -9, 9, &r);
            memcpy(wpre, pre, (no + 1) * sizeof(float)),
                memcpy(wout, out, (no + 1) * sizeof(float));
            be->mm_fwd(wpre, x, w, b, NR, IC, OC);
            be->gelu_fwd(wout, wpre, no);
            mk__mm_gelu_fwd(be, out, pre, x, w, b, NR, IC, OC);
            assert_memory_equal(pre, wpre, (no + 1) * sizeof(float));
            assert_memory_equal(out, wout, (no + 1) * sizeof(float));
            /* without pre: the product and the GELU in out */
            fill_uniform(out, no + 1, -9, 9, &r);
            memcpy(wout, out, (no + 1) * sizeof(float));
            be->mm_fwd(wout, x, w, b, NR, IC, OC);
            be->gelu_fwd(wout, wout, no);
            mk__mm_gelu_fwd(be, out, NULL, x, w, b, NR, IC, OC);
            assert_memory_equal(out, wout, (no + 1) * sizeof(float));
        }
        /* backward of the product that reads gelu(pre) [NR, OC] (here out) into [NR, IC]: dout
         * [NR, IC] -> the gradient at pre, dw [OC, IC] and dbias [IC] added into */
        float *dpre = malloc((no + 1) * sizeof(float)), *wdpre = malloc((no + 1) * sizeof(float));
        float *dfcg = malloc((no + 1) * sizeof(float)), *dw = malloc(nw * sizeof(float));
        float *wdw = malloc(nw * sizeof(float)), *db = malloc(IC * sizeof(float));
        float *wdb = malloc(IC * sizeof(float));
        fill_uniform(dpre, no + 1, -9, 9, &r), fill_uniform(dw, nw, -1, 1, &r);
        fill_uniform(db, IC, -1, 1, &r);
        memcpy(wdpre, dpre, (no + 1) * sizeof(float)), memcpy(dfcg, dpre, (no + 1) * sizeof(float));
        memcpy(wdw, dw, nw * sizeof(float)), memcpy(wdb, db, IC * sizeof(float));
        be->mm_bwd(dfcg, wdw, wdb, x, out, w, NR, OC, IC); /* as the model did: into a scratch */
        be->gelu_bwd(wdpre, pre, dfcg, no);
        mk__mm_gelu_bwd(be, dpre, dw, db, x, out, w, pre, NR, OC, IC);
        assert_memory_equal(dpre, wdpre, (no + 1) * sizeof(float));
        assert_memory_equal(dw, wdw, nw * sizeof(float));
        assert_memory_equal(db, wdb, IC * sizeof(float));
        free(dpre), free(wdpre), free(dfcg), free(dw), free(wdw), free(db), free(wdb);
        free(x), free(w), free(bias), free(pre), free(out), free(wpre), free(wout);
    }
}

/* The CPU back-end cannot share parameters with other processes: both ends of a share say so
 * (MK_ERR_UNSUPPORTED, naming the back-end) and change nothing. */
static void test_share_unsupported(void **state)
{
    (void)state;
    mk_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 11};
    mk_model *m;
    assert_mk_ok(mk_model_new_ex(&m, &cfg, 1, 1, be, MK_MODEL_INFER));
    mk_model_init(m, 3);
    size_t P = mk_model_num_params(m);
    float *before = malloc(P * sizeof(float)), *after = malloc(P * sizeof(float));
    assert_mk_ok(mk_model_read_params(m, before, 0, P));
    mk_share *s = (mk_share *)1;
    assert_int_equal(mk_share_new(m, 16, &s), MK_ERR_UNSUPPORTED);
    assert_null(s);
    assert_non_null(strstr(mk_last_error(), "cpu"));
    unsigned char h[MK_SHARE_HANDLE_BYTES];
    memset(h, 0x5a, sizeof h);
    assert_int_equal(mk_model_write_params_shared(m, h, 0, 0, 4, 0), MK_ERR_UNSUPPORTED);
    assert_non_null(strstr(mk_last_error(), "cpu"));
    assert_mk_ok(mk_model_read_params(m, after, 0, P));
    assert_memory_equal(after, before, P * sizeof(float));
    mk_share_free(NULL);
    free(before), free(after);
    mk_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),        cmocka_unit_test(test_add_norm),
        cmocka_unit_test(test_matmul),           cmocka_unit_test(test_head),
        cmocka_unit_test(test_attention),        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_embedding),        cmocka_unit_test(test_row_stats_and_grad),
        cmocka_unit_test(test_adamw_by_hand),    cmocka_unit_test(test_sumsq_shards_and_clip),
        cmocka_unit_test(test_shard_slices),     cmocka_unit_test(test_shard_moments),
        cmocka_unit_test(test_model_gradients),  cmocka_unit_test(test_model_gradients_families),
        cmocka_unit_test(test_mm_gelu_fallback), cmocka_unit_test(test_share_unsupported),
    };
    mk_set_threads(2);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
