/*
 * test_cuda.c - the CUDA back-end against the CPU reference, op by op and for
 * the whole model (forward, both losses, backward, AdamW, decoding), at the
 * per-operation tolerances below.  Without a usable CUDA device every test
 * calls cmocka's skip() and says why.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol |cpu|), float32 on both sides:
 *   elementwise (GELU, add, embeddings, AdamW, kv_store)   1e-6 + 1e-5
 *   LayerNorm forward / backward                           1e-5 + 1e-4
 *   matmul, head (cuBLAS FP32, no TF32) fwd / bwd          1e-5 + 1e-4
 *   attention fwd / bwd, decode attention                  1e-5 + 1e-4
 *   softmax rows: log-prob, entropy, their gradient        1e-5 + 1e-4
 *     (the CPU sums in double, the GPU in float)
 *   sum of squares                                         1e-9 relative
 *   model: logits 1e-4 + 1e-4; loss 1e-5; gradients 1e-5 + 1e-3;
 *          ten AdamW losses 2e-4; greedy decoding: identical tokens,
 *          step logits 1e-4 + 1e-4.
 * Atomic additions on the GPU make some gradients vary in the last bits
 * between runs; the tolerances cover that.
 */
#include "ktest.h"

#include "mk_internal.h"

static const mk_backend *gpu, *cpu = &mk__cpu_backend;

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!gpu) {                                                                                \
            fprintf(stderr, "skipped: no usable CUDA device (%s)\n", mk_last_error());             \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static int setup(void **state)
{
    gpu = mk_backend_cuda();
    if (!gpu) fprintf(stderr, "test_cuda: %s; every test will be skipped\n", mk_last_error());
    return 0;
}

/* device copy of host h (n floats), or zeros when h is NULL */
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
    fill_uniform(x, n, lo, hi, r);
    return x;
}

/* compares device array d with host reference h */
static void cmp_(const float *d, const float *h, size_t n, double atol, double rtol,
                 const char *label, const char *file, int line)
{
    float *g = malloc(n * sizeof(float));
    gpu->download(g, d, n * sizeof(float));
    check_close_(g, h, n, atol, rtol, label, file, line);
    free(g);
}
#define cmp(d, h, n, atol, rtol, label)                                                            \
    cmp_((d), (h), (n), (atol), (rtol), (label), __FILE__, __LINE__)

enum { R = 64, C = 48, NH = 4, B = 4, T = 16, V = 100 };

static void test_elementwise_and_layernorm(void **state)
{
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 1);
    size_t n = (size_t)R * C;
    float *x = host(n, -3, 3, &r), *y = host(n, -1, 1, &r), *w = host(C, 0.5, 1.5, &r),
          *b = host(C, -1, 1, &r), *out = calloc(n, 4), *mean = calloc(R, 4), *rstd = calloc(R, 4);
    float *dx = host(n, -1, 1, &r), *dw = host(C, -1, 1, &r), *db = host(C, -1, 1, &r);
    float *gx = dev(x, n * 4), *gy = dev(y, n * 4), *gw = dev(w, C * 4), *gb = dev(b, C * 4),
          *gout = dev(NULL, n * 4), *gmean = dev(NULL, R * 4), *grstd = dev(NULL, R * 4),
          *gdx = dev(dx, n * 4), *gdw = dev(dw, C * 4), *gdb = dev(db, C * 4);
    cpu->gelu_fwd(out, x, n), gpu->gelu_fwd(gout, gx, n);
    cmp(gout, out, n, 1e-6, 1e-5, "gelu_fwd");
    cpu->gelu_bwd(out, x, y, n), gpu->gelu_bwd(gout, gx, gy, n);
    cmp(gout, out, n, 1e-6, 1e-5, "gelu_bwd");
    cpu->add(out, x, y, n), gpu->add(gout, gx, gy, n);
    cmp(gout, out, n, 1e-6, 1e-5, "add");
    cpu->ln_fwd(out, mean, rstd, x, w, b, R, C), gpu->ln_fwd(gout, gmean, grstd, gx, gw, gb, R, C);
    cmp(gout, out, n, 1e-5, 1e-4, "ln_fwd out");
    cmp(grstd, rstd, R, 1e-5, 1e-4, "ln_fwd rstd");
    cpu->ln_bwd(dx, dw, db, y, x, w, mean, rstd, R, C);
    gpu->ln_bwd(gdx, gdw, gdb, gy, gx, gw, gmean, grstd, R, C);
    cmp(gdx, dx, n, 1e-5, 1e-4, "ln_bwd dinp");
    cmp(gdw, dw, C, 1e-5, 1e-4, "ln_bwd dw");
    cmp(gdb, db, C, 1e-5, 1e-4, "ln_bwd db");
    /* embeddings with repeated tokens */
    int tok[R], pos[R];
    for (int i = 0; i < R; i++) tok[i] = (i * 7) % V, pos[i] = i % T;
    float *wte = host((size_t)V * C, -1, 1, &r), *wpe = host((size_t)T * C, -1, 1, &r);
    float *dwte = calloc((size_t)V * C, 4), *dwpe = calloc((size_t)T * C, 4);
    int *gtok = dev(tok, sizeof tok), *gpos = dev(pos, sizeof pos);
    float *gwte = dev(wte, (size_t)V * C * 4), *gwpe = dev(wpe, (size_t)T * C * 4),
          *gdwte = dev(NULL, (size_t)V * C * 4), *gdwpe = dev(NULL, (size_t)T * C * 4);
    cpu->embed_fwd(out, tok, pos, wte, wpe, R, C),
        gpu->embed_fwd(gout, gtok, gpos, gwte, gwpe, R, C);
    cmp(gout, out, n, 1e-6, 1e-5, "embed_fwd");
    cpu->embed_bwd(dwte, dwpe, y, tok, pos, R, C);
    gpu->embed_bwd(gdwte, gdwpe, gy, gtok, gpos, R, C);
    cmp(gdwte, dwte, (size_t)V * C, 1e-6, 1e-5, "embed_bwd dwte");
    cmp(gdwpe, dwpe, (size_t)T * C, 1e-6, 1e-5, "embed_bwd dwpe");
    void *all[] = {gx,  gy,  gw,   gb,   gout, gmean, grstd, gdx,
                   gdw, gdb, gtok, gpos, gwte, gwpe,  gdwte, gdwpe};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu->release(all[i]);
    free(x), free(y), free(w), free(b), free(out), free(mean), free(rstd), free(dx), free(dw),
        free(db), free(wte), free(wpe), free(dwte), free(dwpe);
}

static void test_matmul_and_head(void **state)
{
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 2);
    int IC = C, OC = 3 * C;
    float *x = host((size_t)R * IC, -1, 1, &r), *w = host((size_t)IC * OC, -1, 1, &r),
          *bias = host(OC, -1, 1, &r), *dout = host((size_t)R * OC, -1, 1, &r);
    float *out = calloc((size_t)R * OC, 4), *dx = calloc((size_t)R * IC, 4),
          *dw = host((size_t)IC * OC, -1, 1, &r), *db = host(OC, -1, 1, &r);
    float *gx = dev(x, (size_t)R * IC * 4), *gw = dev(w, (size_t)IC * OC * 4),
          *gbias = dev(bias, OC * 4), *gdout = dev(dout, (size_t)R * OC * 4),
          *gout = dev(NULL, (size_t)R * OC * 4), *gdx = dev(NULL, (size_t)R * IC * 4),
          *gdw = dev(dw, (size_t)IC * OC * 4), *gdb = dev(db, OC * 4);
    cpu->mm_fwd(out, x, w, bias, R, IC, OC), gpu->mm_fwd(gout, gx, gw, gbias, R, IC, OC);
    cmp(gout, out, (size_t)R * OC, 1e-5, 1e-4, "mm_fwd");
    cpu->mm_bwd(dx, dw, db, dout, x, w, R, IC, OC);
    gpu->mm_bwd(gdx, gdw, gdb, gdout, gx, gw, R, IC, OC);
    cmp(gdx, dx, (size_t)R * IC, 1e-5, 1e-4, "mm_bwd dinp");
    cmp(gdw, dw, (size_t)IC * OC, 1e-5, 1e-4, "mm_bwd dw");
    cmp(gdb, db, OC, 1e-5, 1e-4, "mm_bwd dbias");
    /* head: wte [V, C] */
    float *wte = host((size_t)V * C, -1, 1, &r), *dl = host((size_t)R * V, -1, 1, &r);
    float *lg = calloc((size_t)R * V, 4), *dwte = calloc((size_t)V * C, 4);
    float *gwte = dev(wte, (size_t)V * C * 4), *gdl = dev(dl, (size_t)R * V * 4),
          *glg = dev(NULL, (size_t)R * V * 4), *gdwte = dev(NULL, (size_t)V * C * 4);
    cpu->head_fwd(lg, x, wte, R, C, V), gpu->head_fwd(glg, gx, gwte, R, C, V);
    cmp(glg, lg, (size_t)R * V, 1e-5, 1e-4, "head_fwd");
    cpu->head_bwd(dx, dwte, dl, x, wte, R, C, V), gpu->head_bwd(gdx, gdwte, gdl, gx, gwte, R, C, V);
    cmp(gdx, dx, (size_t)R * C, 1e-5, 1e-4, "head_bwd dinp");
    cmp(gdwte, dwte, (size_t)V * C, 1e-5, 1e-4, "head_bwd dwte");
    void *all[] = {gx, gw, gbias, gdout, gout, gdx, gdw, gdb, gwte, gdl, glg, gdwte};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu->release(all[i]);
    free(x), free(w), free(bias), free(dout), free(out), free(dx), free(dw), free(db), free(wte),
        free(dl), free(lg), free(dwte);
}

static void test_attention(void **state)
{
    NEED_GPU();
    mk_rng r;
    mk_rng_seed(&r, 3);
    size_t nq = (size_t)B * T * 3 * C, ny = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = host(nq, -1.5, 1.5, &r), *dy = host(ny, -1, 1, &r);
    float *y = calloc(ny, 4), *att = calloc(na, 4), *dqkv = calloc(nq, 4);
    float *gq = dev(qkv, nq * 4), *gdy = dev(dy, ny * 4), *gy = dev(NULL, ny * 4),
          *gatt = dev(NULL, na * 4), *gdq = dev(NULL, nq * 4);
    cpu->attn_fwd(y, att, qkv, B, T, C, NH), gpu->attn_fwd(gy, gatt, gq, B, T, C, NH);
    cmp(gy, y, ny, 1e-5, 1e-4, "attn_fwd out");
    cmp(gatt, att, na, 1e-5, 1e-4, "attn_fwd att");
    float *datt = calloc(na, 4), *gdatt = dev(NULL, na * 4);
    cpu->attn_bwd(dqkv, datt, dy, qkv, att, B, T, C, NH);
    gpu->attn_bwd(gdq, gdatt, gdy, gq, gatt, B, T, C, NH);
    cmp(gdq, dqkv, nq, 1e-5, 1e-4, "attn_bwd dqkv");
    /* decode attention: rows of B slots at every position, cache of Tmax */
    int Tmax = T + 4, slot[B * T], pos[B * T];
    for (int i = 0; i < B * T; i++) slot[i] = i / T, pos[i] = i % T;
    size_t nc = (size_t)B * Tmax * C;
    float *kc = calloc(nc, 4), *vc = calloc(nc, 4);
    float *gkc = dev(NULL, nc * 4), *gvc = dev(NULL, nc * 4);
    int *gs = dev(slot, sizeof slot), *gp = dev(pos, sizeof pos);
    cpu->kv_store(kc, vc, qkv, slot, pos, B * T, C, Tmax);
    gpu->kv_store(gkc, gvc, gq, gs, gp, B * T, C, Tmax);
    cmp(gkc, kc, nc, 0, 0, "kv_store k");
    cmp(gvc, vc, nc, 0, 0, "kv_store v");
    size_t nsc = (size_t)B * T * NH * Tmax;
    float *sc = calloc(nsc, 4), *gsc = dev(NULL, nsc * 4);
    cpu->attn_decode(y, sc, qkv, kc, vc, slot, pos, B * T, C, NH, Tmax);
    gpu->attn_decode(gy, gsc, gq, gkc, gvc, gs, gp, B * T, C, NH, Tmax);
    cmp(gy, y, ny, 1e-5, 1e-4, "attn_decode");
    void *all[] = {gq, gdy, gy, gatt, gdq, gkc, gvc, gs, gp, gdatt, gsc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) gpu->release(all[i]);
    free(qkv), free(dy), free(y), free(att), free(dqkv), free(kc), free(vc), free(datt), free(sc);
}

static void test_rows_and_optimiser(void **state)
{
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

/* The whole model on both back-ends from the PyTorch fixture's weights. */
static void test_model(void **state)
{
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
    float temp[3] = {0, 0, 0}, topp[3] = {1, 1, 1};
    for (int s = 0; s < 3; s++) {
        mk_decoder_reset(dc, s, 9), mk_decoder_reset(dg, s, 9);
        assert_mk_ok(mk_decoder_append(dc, s, prompt, 2 + s));
        assert_mk_ok(mk_decoder_append(dg, s, prompt, 2 + s));
    }
    for (int k = 0; k < 6; k++) {
        int tc[3], tg[3];
        assert_mk_ok(mk_decoder_step(dc, slots, 3, temp, topp, tc, NULL, NULL));
        assert_mk_ok(mk_decoder_step(dg, slots, 3, temp, topp, tg, NULL, NULL));
        assert_memory_equal(tc, tg, sizeof tc);
        for (int s = 0; s < 3; s++)
            check_close(mk_decoder_last_logits(dg, s), mk_decoder_last_logits(dc, s),
                        (size_t)ref.cfg.vocab_size, 1e-4, 1e-4, "decode logits");
    }
    mk_decoder_free(dc), mk_decoder_free(dg);
    mk_model_free(mc), mk_model_free(mg);
    free(a), free(b), free(la), free(lb), free(ref.mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_and_layernorm),
        cmocka_unit_test(test_matmul_and_head),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_rows_and_optimiser),
        cmocka_unit_test(test_model),
    };
    mk_set_threads(2);
    return cmocka_run_group_tests(tests, setup, NULL);
}
