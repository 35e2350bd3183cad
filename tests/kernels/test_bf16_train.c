/*
 * test_bf16_train.c - mixed-precision training (MK_MODEL_BF16_TRAIN) on the CPU back-end, the
 * reference.
 *
 * Ops: round_bf16 is mk__f32_to_bf16 element by element (ties to even both ways, infinities,
 * quiet nan, subnormals).  mm_fwd_bb and mm_bwd_bb, weights [IC,OC] and transposed [OC,IC], with
 * and without bias, at odd shapes (R, IC, OC not multiples of 8 or 16, one row, one column),
 * against double sums over the bfloat16 operands widened: each result within the bound of a
 * float sum in any order, 2 (n + 1) 2^-24 sum|terms| + 1e-6 (the products are exact in float,
 * so only the order of the sums may differ).  The backward's dout16 equals round_bf16(dout)
 * exactly, dinp is overwritten (it starts from garbage), dw and dbias are added into (they
 * start from random values), dbias sums the unrounded float dout and the products the rounded
 * one (the references differ by far more than the bound, so either mistake fails).
 *
 * Models (GPT-2 with biases, Llama with grouped queries and an untied head, Qwen3 with q/k norms,
 * a GPT-2 whose vocabulary is wider than its block products (the head's backward in passes of a
 * few rows); widths that are not multiples of 8), the flag against the float model from the same
 * initialisation:
 *   - the cross-entropy loss within 2e-2 relative, and not equal (the roundings are there);
 *   - the gradient vector's cosine similarity with the float one > 0.99, and not equal;
 *   - 20 AdamW steps on one batch: the bfloat16 model's loss falls by at least 80% and at most
 *     125% of the float model's fall;
 *   - after those steps (mk_model_step), after mk_model_write_params, after writing through
 *     mk_model_params and after mk_model_adamw_range, the next forward's logits equal (bit for
 *     bit) those of a new model with the flag given the same parameters: every way to change
 *     the parameters remakes the bfloat16 copies;
 *   - decoders of such a model use the float parameters (equal to the float model's decoder).
 * The loaders (mk_load_dir_ex with the flag, Llama 3 and a BF16 Qwen3 folder; mk_load into a
 * model whose copies were made from other weights) leave copies of the loaded weights.
 * Memory: with twelve layers of each, mk_model_activation_bytes is lower than the float model's
 * by at least the halving of the five kept activations less one layer of float scratch and the
 * CPU's product scratch.  The products allocate nothing (test_alloc).
 * The flag with MK_MODEL_INFER (or with the decoding-only flags) is refused.
 */
#include "ktest.h"
#include "mk_internal.h"

static const mk_backend *be = &mk__cpu_backend;

static void test_round(void **state)
{
    (void)state;
    mk_set_threads(2);
    /* ties (both ways), the largest finite values, infinities, nan (quiet), subnormals */
    const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu, 0x7f7fffffu,
                             0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                             0xff812345u, 0x00000001u, 0x00008000u, 0x00018000u, 0x80000000u};
    enum { NS = sizeof bits / sizeof bits[0], N = NS + 1000 };
    float src[N];
    memcpy(src, bits, sizeof bits);
    mk_rng r;
    mk_rng_seed(&r, 3);
    fill_uniform(src + NS, N - NS, -1e3f, 1e3f, &r);
    uint16_t dst[N + 1];
    dst[N] = 0xabcd; /* past the end: untouched */
    be->round_bf16(dst, src, N);
    for (int i = 0; i < N; i++) {
        uint16_t want = mk__f32_to_bf16(src[i]);
        if (dst[i] != want) fail_msg("round_bf16 [%d] = 0x%04x, want 0x%04x", i, dst[i], want);
    }
    assert_int_equal(dst[N], 0xabcd);
    assert_int_equal(dst[0], 0x3f80);          /* tie to even: down */
    assert_int_equal(dst[1], 0x3f82);          /* tie to even: up */
    assert_int_equal(dst[9] & 0x7fc0, 0x7fc0); /* signalling nan made quiet */
}

/* Every element of got within the bound of a float sum of n terms whose absolute values sum to
 * abs[i], in any order, of the double sum want[i]. */
static void check_sum(const float *got, const double *want, const double *abs, size_t count, int n,
                      const char *label)
{
    for (size_t i = 0; i < count; i++) {
        double tol = 2.0 * (n + 1) * ldexp(1.0, -24) * abs[i] + 1e-6;
        if (!(fabs(got[i] - want[i]) <= tol))
            fail_msg("%s [%zu]: %.9g, want %.9g (tol %.3g)", label, i, got[i], want[i], tol);
    }
}

static float wid(uint16_t h)
{
    return mk__bf16_to_f32(h);
}

static void check_products(int R, int IC, int OC, int wt, int with_bias, mk_rng *r)
{
    size_t nx = (size_t)R * IC, nw = (size_t)IC * OC, no = (size_t)R * OC;
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *bias = malloc(OC * 4), *out = malloc(no * 4);
    float *dout = malloc(no * 4), *dinp = malloc(nx * 4), *dw = malloc(nw * 4),
          *dw0 = malloc(nw * 4), *db = malloc(OC * 4), *db0 = malloc(OC * 4);
    uint16_t *xh = malloc(nx * 2), *wh = malloc(nw * 2), *dh = malloc(no * 2);
    size_t nmax = nx > nw ? nx : nw;
    nmax = nmax > no ? nmax : no;
    double *want = malloc(nmax * 8), *abs_ = malloc(nmax * 8);
    assert_true(x && w && bias && out && dout && dinp && dw && dw0 && db && db0 && xh && wh && dh &&
                want && abs_);
    fill_uniform(x, nx, -2, 2, r);
    fill_uniform(w, nw, -1, 1, r);
    fill_uniform(bias, OC, -1, 1, r);
    fill_uniform(out, no, -9, 9, r);
    fill_uniform(dout, no, -1, 1, r);
    fill_uniform(dinp, nx, -9, 9, r);
    fill_uniform(dw0, nw, -1, 1, r);
    fill_uniform(db0, OC, -1, 1, r);
    memcpy(dw, dw0, nw * 4);
    memcpy(db, db0, OC * 4);
    be->round_bf16(xh, x, nx);
    be->round_bf16(wh, w, nw);
    char l[128];
    /* w[k][c] of the product, in either layout */
#define WAT(k, c) wid(wt ? wh[(size_t)(c)*IC + (k)] : wh[(size_t)(k)*OC + (c)])
    /* the scratch the back-end asks for, and a guard after it that must stay as it is */
    size_t ns = (size_t)be->bb_scratch_k * (R + IC + OC);
    float *scratch = malloc((ns + 1) * 4);
    assert_non_null(scratch);
    scratch[ns] = 1234.5f;
    be->mm_fwd_bb(out, xh, wh, with_bias ? bias : NULL, R, IC, OC, wt, scratch);
    for (int i = 0; i < R; i++)
        for (int c = 0; c < OC; c++) {
            double s = with_bias ? bias[c] : 0.0, a = fabs(s);
            for (int k = 0; k < IC; k++) {
                double t = (double)wid(xh[(size_t)i * IC + k]) * WAT(k, c);
                s += t, a += fabs(t);
            }
            want[(size_t)i * OC + c] = s, abs_[(size_t)i * OC + c] = a;
        }
    snprintf(l, sizeof l, "mm_fwd_bb R=%d IC=%d OC=%d wt=%d bias=%d", R, IC, OC, wt, with_bias);
    check_sum(out, want, abs_, no, IC + 1, l);

    be->mm_bwd_bb(dinp, dw, with_bias ? db : NULL, dh, dout, xh, wh, R, IC, OC, wt, scratch);
    assert_true(scratch[ns] == 1234.5f);
    free(scratch);
    for (size_t i = 0; i < no; i++)
        if (dh[i] != mk__f32_to_bf16(dout[i]))
            fail_msg("mm_bwd_bb dout16 [%zu] 0x%04x, want 0x%04x", i, dh[i],
                     mk__f32_to_bf16(dout[i]));
    /* dinp = d16 w^T; other: the same with the unrounded dout (must differ) */
    double sep = -1.0;
    for (int i = 0; i < R; i++)
        for (int k = 0; k < IC; k++) {
            double s = 0.0, a = 0.0, u = 0.0;
            for (int c = 0; c < OC; c++) {
                double t = (double)wid(dh[(size_t)i * OC + c]) * WAT(k, c);
                s += t, a += fabs(t), u += (double)dout[(size_t)i * OC + c] * WAT(k, c);
            }
            want[(size_t)i * IC + k] = s, abs_[(size_t)i * IC + k] = a;
            /* how far the unrounded product lies outside the tolerance */
            sep = fmax(sep, fabs(u - s) - (2.0 * (OC + 1) * 0x1p-24 * a + 1e-6));
        }
    snprintf(l, sizeof l, "mm_bwd_bb dinp R=%d IC=%d OC=%d wt=%d", R, IC, OC, wt);
    check_sum(dinp, want, abs_, nx, OC, l);
    if (R * OC > 16) assert_true(sep > 0); /* the rounding of dout is visible */
    /* dw += x16^T d16, in w's layout */
    for (int k = 0; k < IC; k++)
        for (int c = 0; c < OC; c++) {
            size_t at = wt ? (size_t)c * IC + k : (size_t)k * OC + c;
            double s = dw0[at], a = fabs(s);
            for (int i = 0; i < R; i++) {
                double t = (double)wid(xh[(size_t)i * IC + k]) * wid(dh[(size_t)i * OC + c]);
                s += t, a += fabs(t);
            }
            want[at] = s, abs_[at] = a;
        }
    snprintf(l, sizeof l, "mm_bwd_bb dw R=%d IC=%d OC=%d wt=%d", R, IC, OC, wt);
    check_sum(dw, want, abs_, nw, R + 1, l);
    if (with_bias) { /* db += colsum(dout), the float dout */
        double sep_b = -1.0;
        for (int c = 0; c < OC; c++) {
            double s = db0[c], a = fabs(s), s16 = db0[c];
            for (int i = 0; i < R; i++) {
                s += dout[(size_t)i * OC + c], a += fabs(dout[(size_t)i * OC + c]);
                s16 += wid(dh[(size_t)i * OC + c]);
            }
            want[c] = s, abs_[c] = a;
            sep_b = fmax(sep_b, fabs(s16 - s) - (2.0 * (R + 2) * 0x1p-24 * a + 1e-6));
        }
        snprintf(l, sizeof l, "mm_bwd_bb dbias R=%d OC=%d", R, OC);
        check_sum(db, want, abs_, OC, R + 1, l);
        if (R * OC > 16) assert_true(sep_b > 0); /* the sums of the rounded dout would fail */
    }
#undef WAT
    free(x), free(w), free(bias), free(out), free(dout), free(dinp), free(dw), free(dw0);
    free(db), free(db0), free(xh), free(wh), free(dh), free(want), free(abs_);
}

static void test_products(void **state)
{
    (void)state;
    mk_set_threads(2);
    mk_rng r;
    mk_rng_seed(&r, 5);
    /* beyond 64 (the CPU's block of inner terms) in each dimension, with a partial last block */
    const int shapes[][3] = {{1, 1, 1},     {1, 37, 5},    {3, 5, 7},     {37, 19, 41},
                             {64, 48, 144}, {130, 33, 17}, {200, 100, 3}, {70, 150, 90}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int wt = 0; wt < 2; wt++)
            for (int b = 0; b < 2; b++)
                check_products(shapes[s][0], shapes[s][1], shapes[s][2], wt, b, &r);
}

/* ---- models ---------------------------------------------------------------- */

static const mk_config cfgs[] = {
    {.n_layer = 2, .n_head = 3, .n_embd = 36, .block_size = 32, .vocab_size = 67},
    {.n_layer = 2,
     .n_head = 4,
     .n_embd = 40,
     .block_size = 32,
     .vocab_size = 71,
     .arch = MK_ARCH_LLAMA,
     .n_kv_head = 2,
     .n_inner = 52,
     .untied_head = 1,
     .attn_bias = 1,
     .mlp_bias = 1},
    {.n_layer = 2,
     .n_head = 4,
     .n_embd = 32,
     .block_size = 32,
     .vocab_size = 64,
     .arch = MK_ARCH_QWEN3,
     .n_kv_head = 1,
     .head_dim = 10,
     .n_inner = 44},
    /* a vocabulary wider than every block product: the head's backward goes by 10 rows at a
     * time (the last pass shorter) */
    {.n_layer = 2, .n_head = 2, .n_embd = 12, .block_size = 32, .vocab_size = 251},
};
enum { MB = 3, MT = 19 };

typedef struct batch {
    int tokens[MB * MT], targets[MB * MT];
    int T; /* the forward's sequence length, MT unless a model is shorter */
} batch;

static void make_batch(batch *b, int V, uint64_t seed)
{
    mk_rng r;
    mk_rng_seed(&r, seed);
    for (int i = 0; i < MB * MT; i++) b->tokens[i] = (int)(mk_rng_next(&r) % (uint64_t)V);
    /* a learnable rule: the next token is a function of this one */
    for (int i = 0; i < MB * MT; i++) b->targets[i] = (b->tokens[i] * 7 + 3) % V;
    b->T = MT;
}

static float fwd_loss(mk_model *m, const batch *b)
{
    float loss;
    assert_mk_ok(mk_forward(m, b->tokens, MB, b->T));
    assert_mk_ok(mk_loss_ce(m, b->targets, NULL, &loss));
    return loss;
}

static float *logits_of(mk_model *m, const batch *b)
{
    size_t n = (size_t)MB * b->T * mk_model_config(m)->vocab_size;
    float *l = malloc(n * 4);
    assert_non_null(l);
    assert_mk_ok(mk_forward(m, b->tokens, MB, b->T));
    assert_mk_ok(mk_model_read_logits(m, l));
    return l;
}

/* The logits of m on b equal (bit for bit) those of a new bfloat16-training model given m's
 * parameters: m's copies are those of its current parameters. */
static void check_fresh(mk_model *m, const batch *b, const char *what)
{
    const mk_config *c = mk_model_config(m);
    size_t P = mk_model_num_params(m), n = (size_t)MB * b->T * c->vocab_size;
    float *p = malloc(P * 4);
    assert_non_null(p);
    assert_mk_ok(mk_model_read_params(m, p, 0, P));
    mk_model *f;
    assert_mk_ok(mk_model_new_ex(&f, c, MB, b->T, be, MK_MODEL_BF16_TRAIN));
    assert_mk_ok(mk_model_write_params(f, p, 0, P));
    float *got = logits_of(m, b), *want = logits_of(f, b);
    char l[128];
    snprintf(l, sizeof l, "%s: logits after %s vs a new model", mk_arch_name(c->arch), what);
    check_close(got, want, n, 0, 0, l);
    mk_model_free(f);
    free(p), free(got), free(want);
}

/* Bytes the flag saves at least: half of the five kept activations, less MK_G_B16's scratch (one
 * layer of floats), the back-end's product scratch (MK_G_BB) and the alignment of the regions */
static long min_saving(const mk_config *cin, int Bm, int Tm)
{
    mk_config c;
    assert_mk_ok(mk_config_resolve(cin, &c));
    size_t R = (size_t)Bm * Tm, L = c.n_layer, C = c.n_embd, A = mk__att_width(&c);
    size_t H = mk__mlp_hidden(&c), W = mk__qkv_width(&c), F = mk__mlp_in(&c);
    size_t kept = L * R * (2 * C + A + H) + R * C;
    size_t in = C > A ? (C > H ? C : H) : (A > H ? A : H);
    size_t out = W > C ? (W > F ? W : F) : (C > F ? C : F);
    size_t g = R * out > (size_t)c.vocab_size ? R * out : (size_t)c.vocab_size;
    size_t scratch = R * in * 4 > g * 2 ? R * in * 4 : (g + 1) / 2 * 4;
    out = out > (size_t)c.vocab_size ? out : (size_t)c.vocab_size;
    size_t bb = (size_t)be->bb_scratch_k * (R + in + out) * 4;
    return (long)(kept * 2) - (long)scratch - (long)bb - 16 * 4 * 8;
}

/* mk_model_activation_bytes with the flag: lower than without by at least min_saving, for models
 * of twelve layers (the saving grows with the layers, the scratch does not); an inference model
 * has none */
static void test_memory(void **state)
{
    (void)state;
    enum { Bm = 4, Tm = 32 };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        mk_config c = cfgs[i];
        c.n_layer = 12;
        mk_model *mf, *mb;
        assert_mk_ok(mk_model_new_ex(&mf, &c, Bm, Tm, be, 0));
        assert_mk_ok(mk_model_new_ex(&mb, &c, Bm, Tm, be, MK_MODEL_BF16_TRAIN));
        size_t af = mk_model_activation_bytes(mf), ab = mk_model_activation_bytes(mb);
        long want = min_saving(&c, Bm, Tm);
        fprintf(stderr, "%s: activation bytes %zu float, %zu bf16 (at least %ld less expected)\n",
                mk_arch_name(c.arch), af, ab, want);
        assert_true(want > 0);
        assert_true(ab < af);
        assert_true((long)(af - ab) >= want);
        mk_model_free(mf), mk_model_free(mb);
    }
    mk_model *m;
    assert_mk_ok(mk_model_new_ex(&m, &cfgs[0], 1, 4, be, MK_MODEL_INFER));
    assert_int_equal(mk_model_activation_bytes(m), 0);
    mk_model_free(m);
}

static void check_model(const mk_config *cfg)
{
    const char *name = mk_arch_name(cfg->arch);
    mk_model *mf, *mb;
    assert_mk_ok(mk_model_new_ex(&mf, cfg, MB, MT, be, 0));
    assert_mk_ok(mk_model_new_ex(&mb, cfg, MB, MT, be, MK_MODEL_BF16_TRAIN));
    size_t P = mk_model_num_params(mf);
    assert_int_equal(mk_model_num_params(mb), P);
    mk_model_init(mf, 42), mk_model_init(mb, 42);
    /* move every parameter a little so that norm weights and biases are not 1 and 0 */
    float *p = malloc(P * 4), *gf = malloc(P * 4), *gb = malloc(P * 4);
    assert_true(p && gf && gb);
    mk_rng r;
    mk_rng_seed(&r, 17 + cfg->arch);
    assert_mk_ok(mk_model_read_params(mf, p, 0, P));
    for (size_t i = 0; i < P; i++) p[i] += 0.05f * (mk_rng_uniform(&r) - 0.5f);
    assert_mk_ok(mk_model_write_params(mf, p, 0, P));
    assert_mk_ok(mk_model_write_params(mb, p, 0, P));
    batch b;
    make_batch(&b, cfg->vocab_size, 9 + cfg->arch);

    /* one forward and backward */
    float lf = fwd_loss(mf, &b), lb = fwd_loss(mb, &b);
    fprintf(stderr, "%s: loss %.7g float, %.7g bf16\n", name, lf, lb);
    assert_true(fabsf(lb - lf) <= 2e-2f * fabsf(lf));
    assert_true(lb != lf);
    mk_zero_grad(mf), mk_zero_grad(mb);
    assert_mk_ok(mk_backward(mf));
    assert_mk_ok(mk_backward(mb));
    assert_mk_ok(mk_model_read_grads(mf, gf, 0, P));
    assert_mk_ok(mk_model_read_grads(mb, gb, 0, P));
    double dot = 0, nf = 0, nb = 0;
    for (size_t i = 0; i < P; i++)
        dot += (double)gf[i] * gb[i], nf += (double)gf[i] * gf[i], nb += (double)gb[i] * gb[i];
    double cosv = dot / sqrt(nf * nb);
    fprintf(stderr, "%s: gradient cosine %.6f\n", name, cosv);
    assert_true(cosv > 0.99);
    assert_true(cosv < 1.0 - 1e-12 || memcmp(gf, gb, P * 4) != 0);
    /* every tensor's gradient on its own too (a product left out would still pass the whole) */
    for (int i = 0; i < mk_model_num_tensors(mf); i++) {
        mk_tensor_info ti;
        assert_mk_ok(mk_model_tensor(mf, i, &ti));
        double d = 0, a = 0, c2 = 0;
        for (size_t k = ti.offset; k < ti.offset + ti.numel; k++)
            d += (double)gf[k] * gb[k], a += (double)gf[k] * gf[k], c2 += (double)gb[k] * gb[k];
        if (a == 0 && c2 == 0) continue;
        if (!(d / sqrt(a * c2) > 0.98))
            fail_msg("%s: gradient of %s: cosine %.5f", name, ti.name, d / sqrt(a * c2));
    }

    /* 20 AdamW steps on the batch */
    mk_adamw_params ap = {.lr = 3e-3f,
                          .beta1 = 0.9f,
                          .beta2 = 0.95f,
                          .eps = 1e-8f,
                          .weight_decay = 0.01f,
                          .grad_clip = 1.0f};
    float f0 = lf, b0 = lb, f1 = 0, b1 = 0;
    for (int t = 1; t <= 20; t++) {
        f1 = fwd_loss(mf, &b), b1 = fwd_loss(mb, &b);
        mk_zero_grad(mf), mk_zero_grad(mb);
        assert_mk_ok(mk_backward(mf));
        assert_mk_ok(mk_backward(mb));
        assert_mk_ok(mk_model_step(mf, &ap, t, NULL));
        assert_mk_ok(mk_model_step(mb, &ap, t, NULL));
    }
    f1 = fwd_loss(mf, &b), b1 = fwd_loss(mb, &b);
    fprintf(stderr, "%s: 20 steps: float %.5f -> %.5f, bf16 %.5f -> %.5f\n", name, f0, f1, b0, b1);
    assert_true(f0 - f1 > 0.1f);
    assert_true(b0 - b1 >= 0.8f * (f0 - f1) && b0 - b1 <= 1.25f * (f0 - f1));

    /* every way of changing the parameters remakes the copies before the next forward */
    check_fresh(mb, &b, "mk_model_step");
    assert_mk_ok(mk_model_read_params(mb, p, 0, P));
    for (size_t i = 0; i < P; i++) p[i] *= 1.25f;
    float *before = logits_of(mb, &b);
    assert_mk_ok(mk_model_write_params(mb, p, 0, P));
    float *after = logits_of(mb, &b);
    assert_true(memcmp(before, after, (size_t)MB * MT * cfg->vocab_size * 4) != 0);
    check_fresh(mb, &b, "mk_model_write_params");
    free(before), free(after);
    float *pp = mk_model_params(mb); /* host memory on the CPU */
    for (size_t i = 0; i < P; i++) pp[i] *= 0.8f;
    check_fresh(mb, &b, "writing through mk_model_params");
    free(logits_of(mb, &b)); /* copies made: stale no more */
    mk_zero_grad(mb);
    fwd_loss(mb, &b);
    assert_mk_ok(mk_backward(mb));
    assert_mk_ok(mk_model_adamw_range(mb, 0, P, &ap, 21));
    check_fresh(mb, &b, "mk_model_adamw_range");

    /* decoders read the float parameters: as the float model's with the same ones */
    assert_mk_ok(mk_model_read_params(mb, p, 0, P));
    assert_mk_ok(mk_model_write_params(mf, p, 0, P));
    mk_decoder *df, *db;
    assert_mk_ok(mk_decoder_new_ctx(&df, mf, 1, 16));
    assert_mk_ok(mk_decoder_new_ctx(&db, mb, 1, 16));
    int slot = 0, tf, tb;
    float temp = 0.0f, top = 1.0f;
    assert_mk_ok(mk_decoder_append(df, 0, b.tokens, 5));
    assert_mk_ok(mk_decoder_append(db, 0, b.tokens, 5));
    assert_mk_ok(mk_decoder_step(df, &slot, 1, &temp, &top, &tf, NULL, NULL));
    assert_mk_ok(mk_decoder_step(db, &slot, 1, &temp, &top, &tb, NULL, NULL));
    assert_int_equal(tf, tb);
    check_close(mk_decoder_last_logits(db, 0), mk_decoder_last_logits(df, 0),
                (size_t)cfg->vocab_size, 0, 0, "decoder of a bf16-training model");
    mk_decoder_free(df), mk_decoder_free(db);
    mk_model_free(mf), mk_model_free(mb);
    free(p), free(gf), free(gb);
}

static void test_models(void **state)
{
    (void)state;
    mk_set_threads(2);
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_model(&cfgs[i]);
}

/* The loaders: a folder loaded with the flag (its copies made from the loaded weights) gives the
 * float model's loss within 2e-2 relative and the logits of a new model given its parameters;
 * mk_load into a model whose copies were made from other weights remakes them. */
static void test_loaders(void **state)
{
    (void)state;
    mk_set_threads(2);
    const char *dirs[] = {MK_FIXTURES "/family/llama3", MK_FIXTURES "/family/qwen3_bf16"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        mk_model *mf, *mb;
        assert_mk_ok(mk_load_dir_ex(&mf, dirs[i], MB, MT, NULL, 0));
        assert_mk_ok(mk_load_dir_ex(&mb, dirs[i], MB, MT, NULL, MK_MODEL_BF16_TRAIN));
        batch b;
        make_batch(&b, mk_model_config(mf)->vocab_size, 31);
        float lf = fwd_loss(mf, &b), lb = fwd_loss(mb, &b);
        fprintf(stderr, "%s: loss %.7g float, %.7g bf16\n", dirs[i], lf, lb);
        assert_true(fabsf(lb - lf) <= 2e-2f * fabsf(lf) && lb != lf);
        check_fresh(mb, &b, "mk_load_dir_ex");
        mk_model_free(mf), mk_model_free(mb);
    }
    ref_fixture ref;
    assert_int_equal(ref_load(&ref, MK_FIXTURES "/ref.bin"), 0);
    mk_model *m;
    assert_mk_ok(mk_model_new_ex(&m, &ref.cfg, MB, ref.cfg.block_size, NULL, MK_MODEL_BF16_TRAIN));
    mk_model_init(m, 3);
    batch b;
    make_batch(&b, ref.cfg.vocab_size, 37);
    b.T = ref.cfg.block_size;
    float before = fwd_loss(m, &b); /* the copies of the initial weights made */
    assert_mk_ok(mk_load(m, MK_FIXTURES "/model.safetensors"));
    assert_true(fwd_loss(m, &b) != before);
    check_fresh(m, &b, "mk_load");
    mk_model_free(m);
    free(ref.mem);
}

static void test_refusals(void **state)
{
    (void)state;
    mk_model *m = (mk_model *)1;
    const unsigned bad[] = {MK_MODEL_BF16_TRAIN | MK_MODEL_INFER,
                            MK_MODEL_BF16_TRAIN | MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS,
                            MK_MODEL_BF16_TRAIN | MK_MODEL_BF16_WEIGHTS,
                            MK_MODEL_BF16_TRAIN | MK_MODEL_BF16_KV, 32u};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(mk_model_new_ex(&m, &cfgs[0], 1, 4, be, bad[i]), MK_ERR_ARG);
        assert_null(m);
    }
    assert_mk_ok(mk_model_new_ex(&m, &cfgs[0], 1, 4, be, MK_MODEL_BF16_TRAIN));
    mk_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round),   cmocka_unit_test(test_products),
        cmocka_unit_test(test_models),  cmocka_unit_test(test_memory),
        cmocka_unit_test(test_loaders), cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
