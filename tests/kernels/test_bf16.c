/*
 * test_bf16.c - decoding with bfloat16 weights (MK_MODEL_BF16_WEIGHTS).
 *
 * The CPU product with bfloat16 weights against a double-precision sum over
 * the weights rounded by mk_f32_to_bf16, for row counts that take every tile
 * (1..6 in place, more through the widened L1 block), several k-blocks and
 * column tails; a weight copied from its transpose (the head) is the same
 * copy, bit for bit.  Whole models (GPT-2 with biases, tied Llama, untied Qwen2
 * with biases, sizes with column tails): a bfloat16-weight decoder equals a
 * float decoder whose parameters were rounded to bfloat16 beforehand (1e-4:
 * the same products in another order), over prompts (many rows) and steps
 * of 1, 5 and 8 slots; against the float parameters unrounded the logits
 * differ, by a bounded amount (the rounding of the weights, 2^-9 relative
 * each), and not by nothing (the copies are used).  New weights written
 * between steps (mk_model_write_params, mk_model_params) are used at the
 * next step.  A BF16 Hugging Face folder decodes alike with either weights.
 * The flag without MK_MODEL_INFER is refused.  Bfloat16 products
 * (MK_MODEL_BF16_PRODUCTS: activations rounded too), on AMX and on the float
 * fallback, against a double sum of the rounded operands, row by row equal to
 * the batch; whole models with them differ from bfloat16 weights alone by a
 * bounded amount.
 *
 * Bfloat16 KV caches (MK_MODEL_BF16_KV): kv_store_bf16 writes exactly
 * mk_f32_to_bf16 of each key and value (ties to even, infinities, nan kept
 * quiet, subnormals) and nothing else; attn_decode_bf16 equals attn_decode
 * over float caches holding the same values widened (1e-6 + 1e-6 relative:
 * the same float arithmetic, up to how the compiler orders a sum; observed
 * bit-equal), on every work split (all rows of a prompt, a step's few rows,
 * one row), grouped-query shapes, the vector head sizes and the fallback's
 * (24, 8), contexts of 70 positions.  Whole models (GPT-2, Llama with grouped
 * queries, untied Qwen2, and the gpt2, llama3 and qwen3_bf16 fixture folders,
 * the last with bfloat16 weights too): logits with bfloat16 caches differ
 * from float caches on each slot's first step, by more than nothing and by at
 * most 2% of the largest logit, and their greedy tokens agree wherever the
 * float logits' top two are further apart than twice the largest difference.
 * The flag without MK_MODEL_INFER is refused.
 */
#include "ktest.h"
#include "mk_internal.h"

static const mk_backend *be = &mk__cpu_backend;

static void test_product(void **state)
{
    (void)state;
    mk_set_threads(2);
    mk_rng r;
    mk_rng_seed(&r, 11);
    const int Rs[] = {1, 2, 3, 4, 5, 6, 7, 13, 100}, ICs[] = {1, 130, 257},
              OCs[] = {1, 64, 100, 200};
    for (size_t a = 0; a < sizeof Rs / sizeof *Rs; a++)
        for (size_t b = 0; b < sizeof ICs / sizeof *ICs; b++)
            for (size_t c = 0; c < sizeof OCs / sizeof *OCs; c++) {
                int R = Rs[a], IC = ICs[b], OC = OCs[c], with_bias = (a + b + c) % 2;
                float *x = malloc(sizeof(float) * R * IC), *w = malloc(sizeof(float) * IC * OC);
                float *bias = malloc(sizeof(float) * OC), *out = malloc(sizeof(float) * R * OC);
                float *ref = malloc(sizeof(float) * R * OC);
                uint16_t *wh = malloc(sizeof(uint16_t) * MK_BF16_ELEMS(IC, OC));
                fill_uniform(x, (size_t)R * IC, -1, 1, &r);
                fill_uniform(w, (size_t)IC * OC, -1, 1, &r);
                fill_uniform(bias, OC, -1, 1, &r);
                be->to_bf16(wh, w, IC, OC, 0); /* the back-end's layout: checked through products */
                for (int i = 0; i < R; i++)
                    for (int j = 0; j < OC; j++) {
                        double s = with_bias ? bias[j] : 0.0;
                        for (int k = 0; k < IC; k++)
                            s += (double)x[i * IC + k] *
                                 mk_bf16_to_f32(mk_f32_to_bf16(w[k * OC + j]));
                        ref[i * OC + j] = (float)s;
                    }
                for (int i = 0; i < R * OC; i++) out[i] = NAN; /* every element must be written */
                be->mm_fwd_bf16(out, x, wh, with_bias ? bias : NULL, R, IC, OC);
                char label[96];
                snprintf(label, sizeof label, "bf16 product R %d IC %d OC %d", R, IC, OC);
                /* float sums of up to 257 terms of size <= 1: a few 1e-6 */
                check_close(out, ref, (size_t)R * OC, 2e-5, 1e-5, label);
                free(x), free(w), free(bias), free(out), free(ref), free(wh);
            }
}

/* A weight given transposed ([OC, IC], the head's case) makes the same copy: products with the
 * two copies are bit-equal (so are their bytes), for shapes with and without column tails. */
static void test_transpose(void **state)
{
    (void)state;
    mk_rng r;
    mk_rng_seed(&r, 12);
    const int shapes[][2] = {{1, 1}, {33, 70}, {100, 31}, {64, 64}, {130, 200}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int IC = shapes[s][0], OC = shapes[s][1], R = 3;
        size_t n = (size_t)IC * OC;
        float *w = malloc(sizeof(float) * n), *wt = malloc(sizeof(float) * n);
        float *x = malloc(sizeof(float) * R * IC), *o1 = malloc(sizeof(float) * R * OC),
              *o2 = malloc(sizeof(float) * R * OC);
        size_t nb = MK_BF16_ELEMS(IC, OC);
        uint16_t *a = calloc(nb, sizeof(uint16_t)), *b = calloc(nb, sizeof(uint16_t));
        fill_uniform(w, n, -3, 3, &r);
        fill_uniform(x, (size_t)R * IC, -1, 1, &r);
        for (int k = 0; k < IC; k++)
            for (int c = 0; c < OC; c++) wt[(size_t)c * IC + k] = w[(size_t)k * OC + c];
        be->to_bf16(a, w, IC, OC, 0);
        be->to_bf16(b, wt, IC, OC, 1);
        assert_memory_equal(a, b, nb * sizeof(uint16_t));
        be->mm_fwd_bf16(o1, x, a, NULL, R, IC, OC);
        be->mm_fwd_bf16(o2, x, b, NULL, R, IC, OC);
        assert_memory_equal(o1, o2, sizeof(float) * R * OC);
        free(w), free(wt), free(x), free(o1), free(o2), free(a), free(b);
    }
    /* a nan stays a (quiet) nan */
    float nanw = NAN, one = 1.0f, out;
    uint16_t h[MK_BF16_ELEMS(1, 1)];
    be->to_bf16(h, &nanw, 1, 1, 0);
    assert_int_equal(h[0], mk_f32_to_bf16(NAN));
    be->mm_fwd_bf16(&out, &one, h, NULL, 1, 1, 1);
    assert_true(isnan(out));
}

/* Bfloat16 products (mm_fwd_bf16a): against a double sum over the activations and the weights
 * both rounded, on AMX (where this CPU has it) and on the float fallback; each row alone gives
 * the bytes it gives in a batch (decoding's rows must not depend on their neighbours); the two
 * paths agree to the sums' order. */
static void test_products(void **state)
{
    (void)state;
    mk_rng r;
    mk_rng_seed(&r, 13);
    const int Rs[] = {1, 3, 16, 17, 40}, ICs[] = {1, 33, 130, 257}, OCs[] = {1, 64, 100, 200};
    int amx = mk__cpu_amx(1);
    mk__cpu_amx(amx);
    fprintf(stderr, "bf16 products: AMX %s\n", mk__cpu_amx(1) ? "in use" : "not usable here");
    for (size_t a = 0; a < sizeof Rs / sizeof *Rs; a++)
        for (size_t b = 0; b < sizeof ICs / sizeof *ICs; b++)
            for (size_t c = 0; c < sizeof OCs / sizeof *OCs; c++) {
                int R = Rs[a], IC = ICs[b], OC = OCs[c], with_bias = (a + b + c) % 2;
                float *x = malloc(sizeof(float) * R * IC), *w = malloc(sizeof(float) * IC * OC);
                float *bias = malloc(sizeof(float) * OC), *ref = malloc(sizeof(float) * R * OC);
                float *out[2], *one = malloc(sizeof(float) * OC);
                void *scratch = malloc(MK_BF16A_SCRATCH(R, IC));
                uint16_t *wh = malloc(sizeof(uint16_t) * MK_BF16_ELEMS(IC, OC));
                fill_uniform(x, (size_t)R * IC, -1, 1, &r);
                fill_uniform(w, (size_t)IC * OC, -1, 1, &r);
                fill_uniform(bias, OC, -1, 1, &r);
                be->to_bf16(wh, w, IC, OC, 0);
                for (int i = 0; i < R; i++)
                    for (int j = 0; j < OC; j++) {
                        double s = with_bias ? bias[j] : 0.0;
                        for (int k = 0; k < IC; k++)
                            s += (double)mk_bf16_to_f32(mk_f32_to_bf16(x[i * IC + k])) *
                                 mk_bf16_to_f32(mk_f32_to_bf16(w[k * OC + j]));
                        ref[i * OC + j] = (float)s;
                    }
                for (int path = 0; path < 2; path++) {
                    mk__cpu_amx(path);
                    out[path] = malloc(sizeof(float) * R * OC);
                    for (int i = 0; i < R * OC; i++) out[path][i] = NAN;
                    be->mm_fwd_bf16a(out[path], x, wh, with_bias ? bias : NULL, R, IC, OC, scratch);
                    char label[96];
                    snprintf(label, sizeof label, "bf16 products (%s) R %d IC %d OC %d",
                             path ? "AMX" : "fallback", R, IC, OC);
                    check_close(out[path], ref, (size_t)R * OC, 2e-5, 1e-5, label);
                    for (int i = 0; i < R; i += 7) { /* a row alone: the same bytes */
                        be->mm_fwd_bf16a(one, x + (size_t)i * IC, wh, with_bias ? bias : NULL, 1,
                                         IC, OC, scratch);
                        assert_memory_equal(one, out[path] + (size_t)i * OC, sizeof(float) * OC);
                    }
                }
                check_close(out[1], out[0], (size_t)R * OC, 2e-5, 1e-5, "AMX vs fallback");
                free(x), free(w), free(bias), free(ref), free(out[0]), free(out[1]), free(one);
                free(scratch), free(wh);
            }
    mk__cpu_amx(amx);
}

enum { CTX = 40, SL = 8, PROMPT = 11 };

/* Random parameters with a spread that makes logits differ clearly (as test_decode.c). */
static void random_params(float *p, size_t n, uint64_t seed)
{
    mk_rng r;
    mk_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) p[i] = 0.25f * (mk_rng_uniform(&r) - 0.5f) + 0.02f;
}

static void round_params(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = mk_bf16_to_f32(mk_f32_to_bf16(p[i]));
}

/* Appends the same prompts to every slot of each decoder, then steps groups of 1, 5 and 8
 * slots greedily; every step's logits of decoder 1 go to lg1, of decoder 2 to lg2 (each
 * [n_logits, V]); first[row] (may be NULL) is 1 for a slot's first step (logits before any
 * sampled token was fed back, so equal inputs on both sides whatever they sampled).  Returns
 * the number of logit rows written. */
static int run_pair(mk_decoder *d1, mk_decoder *d2, int V, float *lg1, float *lg2, int *first)
{
    mk_decoder *ds[2] = {d1, d2};
    float *lgs[2] = {lg1, lg2};
    int rows = 0;
    for (int k = 0; k < 2; k++) {
        int n = 0;
        for (int s = 0; s < SL; s++) {
            int pr[PROMPT];
            for (int i = 0; i < PROMPT; i++) pr[i] = (s * 13 + i * 7 + 3) % V;
            assert_mk_ok(mk_decoder_reset(ds[k], s, (uint64_t)s));
            assert_mk_ok(mk_decoder_append(ds[k], s, pr, 1 + (s * 5) % PROMPT));
        }
        const int groups[3] = {1, 5, 8};
        for (int g = 0; g < 3; g++)
            for (int it = 0; it < 3; it++) {
                int slots[SL], tok[SL];
                float temp[SL] = {0}, topp[SL];
                for (int i = 0; i < groups[g]; i++) slots[i] = (i * 3 + g) % SL, topp[i] = 1.0f;
                assert_mk_ok(mk_decoder_step(ds[k], slots, groups[g], temp, topp, tok, NULL, NULL));
                for (int i = 0; i < groups[g]; i++, n++)
                    memcpy(lgs[k] + (size_t)n * V, mk_decoder_last_logits(ds[k], slots[i]),
                           sizeof(float) * V);
            }
        rows = n;
        if (first) {
            int seen[SL] = {0}, row = 0;
            for (int g = 0; g < 3; g++)
                for (int it = 0; it < 3; it++)
                    for (int i = 0; i < groups[g]; i++, row++) {
                        int s = (i * 3 + g) % SL;
                        first[row] = !seen[s];
                        seen[s] = 1;
                    }
        }
    }
    return rows;
}

static void check_family(const mk_config *cfg, const char *name)
{
    mk_model *mf, *mb;
    assert_mk_ok(mk_model_new_ex(&mf, cfg, 1, 1, NULL, MK_MODEL_INFER));
    assert_mk_ok(mk_model_new_ex(&mb, cfg, 1, 1, NULL, MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS));
    size_t P = mk_model_num_params(mf);
    int V = cfg->vocab_size;
    float *p = malloc(sizeof(float) * P), *pr = malloc(sizeof(float) * P);
    random_params(p, P, 5);
    memcpy(pr, p, sizeof(float) * P);
    round_params(pr, P);
    enum { ROWS = 3 * (1 + 5 + 8) };
    float *lf = malloc(sizeof(float) * ROWS * V), *lb = malloc(sizeof(float) * ROWS * V);
    mk_decoder *df, *db;
    assert_mk_ok(mk_decoder_new_ctx(&df, mf, SL, CTX));
    assert_mk_ok(mk_decoder_new_ctx(&db, mb, SL, CTX));
    char label[96];

    /* the same parameters, rounded to bfloat16 beforehand (so that embeddings and norms,
     * which stay float, agree too): equal up to the order of the sums */
    assert_mk_ok(mk_model_write_params(mf, pr, 0, P));
    assert_mk_ok(mk_model_write_params(mb, pr, 0, P));
    int n = run_pair(df, db, V, lf, lb, NULL);
    assert_int_equal(n, ROWS);
    snprintf(label, sizeof label, "%s: bf16 weights vs float weights rounded", name);
    check_close(lb, lf, (size_t)n * V, 1e-4, 1e-4, label);

    /* bfloat16 products (the activations rounded too) against bfloat16 weights alone: they
     * differ (the rounding is applied), by a bounded amount, on the first steps (equal
     * inputs); AMX where this CPU has it */
    mk_model *mp;
    mk_decoder *dp;
    assert_mk_ok(mk_model_new_ex(&mp, cfg, 1, 1, NULL,
                                 MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS | MK_MODEL_BF16_PRODUCTS));
    assert_mk_ok(mk_model_write_params(mp, pr, 0, P));
    assert_mk_ok(mk_decoder_new_ctx(&dp, mp, SL, CTX));
    {
        int first[ROWS];
        float *lp = malloc(sizeof(float) * ROWS * V);
        run_pair(db, dp, V, lb, lp, first);
        double maxd = 0, maxl = 0;
        for (int row = 0; row < n; row++)
            for (int i = row * V; first[row] && i < (row + 1) * V; i++) {
                maxd = fmax(maxd, fabs((double)lp[i] - lb[i]));
                maxl = fmax(maxl, fabs((double)lb[i]));
            }
        fprintf(stderr, "%s: bf16 products vs bf16 weights: max |logit diff| %.3g (max %.3g)\n",
                name, maxd, maxl);
        assert_true(maxd > 1e-7);
        assert_true(maxd <= 0.02 * maxl);
        free(lp);
    }
    mk_decoder_free(dp);
    mk_model_free(mp);

    /* against the unrounded float weights: differs, within a bound.  Each weight moves by at
     * most 2^-9 of itself, the errors of a product's terms mostly cancel: observed max |diff|
     * 5.6e-4 for logits up to 0.3 (2e-3 of them) on the three models; bound 2e-2 of the
     * largest logit.  Compared on each slot's first step only (later, greedy choices may
     * differ and then so do the inputs) */
    assert_mk_ok(mk_model_write_params(mf, p, 0, P));
    assert_mk_ok(mk_model_write_params(mb, p, 0, P));
    int first[ROWS], n_first = 0;
    run_pair(df, db, V, lf, lb, first);
    double maxd = 0, maxl = 0;
    for (int row = 0; row < n; row++) {
        if (!first[row]) continue; /* greedy choices may differ later: other inputs */
        n_first++;
        for (int i = row * V; i < (row + 1) * V; i++) {
            maxd = fmax(maxd, fabs((double)lb[i] - lf[i]));
            maxl = fmax(maxl, fabs((double)lf[i]));
        }
    }
    assert_int_equal(n_first, SL);
    fprintf(stderr, "%s: bf16 vs float weights: max |logit diff| %.3g (max |logit| %.3g)\n", name,
            maxd, maxl);
    assert_true(maxd > 1e-6);         /* the bf16 copies are what was multiplied */
    assert_true(maxd <= 0.02 * maxl); /* and their rounding moves the logits little */

    /* new weights through mk_model_params (marks the copies stale): the next step uses them */
    float *bp = mk_model_params(mb);
    random_params(bp, P, 9);
    round_params(bp, P);
    memcpy(pr, bp, sizeof(float) * P);
    assert_mk_ok(mk_model_write_params(mf, pr, 0, P));
    run_pair(df, db, V, lf, lb, NULL);
    snprintf(label, sizeof label, "%s: after writing through mk_model_params", name);
    check_close(lb, lf, (size_t)n * V, 1e-4, 1e-4, label);

    mk_decoder_free(df), mk_decoder_free(db);
    mk_model_free(mf), mk_model_free(mb);
    free(p), free(pr), free(lf), free(lb);
}

/* The random models of test_models and test_kv_models: gpt2; llama, with grouped queries; qwen2
 * untied, llama's but for C 128, heads of 32 and an untied head.  Column tails: C 160 and 96 (not
 * multiples of 64), F 400, V 300; IC over one k-block. */
enum { N_RAND = 3 };
static const char *const rand_names[N_RAND] = {"gpt2", "llama", "qwen2 untied"};
static mk_config rand_cfg(int k)
{
    mk_config c = {.n_layer = 2, .n_head = 4, .n_embd = 96, .block_size = CTX, .vocab_size = 300};
    if (k == 0) return c;
    c.n_embd = 160, c.arch = MK_ARCH_LLAMA, c.n_kv_head = 2, c.n_inner = 200;
    if (k == 1) return c;
    c.arch = MK_ARCH_QWEN2, c.untied_head = 1, c.n_embd = 128, c.head_dim = 32;
    return c;
}

static void test_models(void **state)
{
    (void)state;
    for (int k = 0; k < N_RAND; k++) {
        mk_config c = rand_cfg(k);
        check_family(&c, rand_names[k]);
    }
}

/* A BF16 folder: its weights are bfloat16 values, so both decoders agree to the sums' order. */
static void test_folder(void **state)
{
    (void)state;
    const char *dir = MK_FIXTURES "/family/qwen3_bf16";
    mk_model *mf, *mb;
    assert_mk_ok(mk_load_dir_ex(&mf, dir, 1, 1, NULL, MK_MODEL_INFER));
    assert_mk_ok(mk_load_dir_ex(&mb, dir, 1, 1, NULL, MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS));
    int V = mk_model_config(mf)->vocab_size;
    enum { ROWS = 3 * (1 + 5 + 8) };
    float *lf = malloc(sizeof(float) * ROWS * V), *lb = malloc(sizeof(float) * ROWS * V);
    mk_decoder *df, *db;
    assert_mk_ok(mk_decoder_new_ctx(&df, mf, SL, CTX));
    assert_mk_ok(mk_decoder_new_ctx(&db, mb, SL, CTX));
    int n = run_pair(df, db, V, lf, lb, NULL);
    check_close(lb, lf, (size_t)n * V, 1e-4, 1e-4, "qwen3_bf16 folder: bf16 vs float weights");
    mk_decoder_free(df), mk_decoder_free(db);
    mk_model_free(mf), mk_model_free(mb);
    free(lf), free(lb);
}

static void test_refusals(void **state)
{
    (void)state;
    mk_config c = {.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 16};
    mk_model *m = (mk_model *)1;
    assert_int_equal(mk_model_new_ex(&m, &c, 1, 1, NULL, MK_MODEL_BF16_WEIGHTS), MK_ERR_ARG);
    assert_null(m);
    assert_non_null(strstr(mk_last_error(), "MK_MODEL_INFER"));
    assert_int_equal(mk_model_new_ex(&m, &c, 1, 1, NULL, MK_MODEL_BF16_KV), MK_ERR_ARG);
    assert_null(m);
    assert_non_null(strstr(mk_last_error(), "MK_MODEL_BF16_KV needs MK_MODEL_INFER"));
    assert_int_equal(mk_model_new_ex(&m, &c, 1, 1, NULL, 32u), MK_ERR_ARG);
    assert_non_null(strstr(mk_last_error(), "unknown model flags"));
    assert_int_equal(mk_model_new_ex(&m, &c, 1, 1, NULL, MK_MODEL_INFER | MK_MODEL_BF16_PRODUCTS),
                     MK_ERR_ARG);
    assert_non_null(strstr(mk_last_error(), "needs MK_MODEL_BF16_WEIGHTS"));
    /* the CPU multiplies in FP32 only: mixed-precision math is refused, FP32 accepted */
    assert_int_equal(mk_backend_set_math(be, MK_MATH_FP32), MK_OK);
    assert_int_equal(mk_backend_set_math(be, MK_MATH_BF16), MK_ERR_UNSUPPORTED);
    assert_non_null(strstr(mk_last_error(), "FP32 only"));
    assert_int_equal(mk_backend_set_math(be, (mk_math)7), MK_ERR_ARG);
}

/* ---- bfloat16 KV caches ---- */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* kv_store_bf16 against mk_f32_to_bf16 bit for bit, and attn_decode_bf16 against attn_decode
 * over the widened values, for NH query heads over NKV kv heads of hd, S slots of Tmax. */
static void check_kv_ops(int NH, int NKV, int hd, mk_rng *rng)
{
    enum { S = 3, Tmax = 70 };
    const int lens[S] = {70, 33, 1};
    int W = (NH + 2 * NKV) * hd, A = NH * hd, KV = NKV * hd;
    int Rall = lens[0] + lens[1] + lens[2];
    size_t cache = (size_t)S * Tmax * KV;
    float *qkv = malloc(sizeof(float) * Rall * W), *kf = malloc(sizeof(float) * cache),
          *vf = malloc(sizeof(float) * cache);
    uint16_t *kb = calloc(cache, sizeof(uint16_t)), *vb = calloc(cache, sizeof(uint16_t));
    float *yf = malloc(sizeof(float) * Rall * A), *yb = malloc(sizeof(float) * Rall * A);
    float *att = malloc(sizeof(float) * Rall * NH * Tmax);
    int *slot = malloc(sizeof(int) * Rall), *pos = malloc(sizeof(int) * Rall);
    int R = 0;
    for (int s = 0; s < S; s++)
        for (int t = 0; t < lens[s]; t++) slot[R] = s, pos[R++] = t;
    char label[128];

    /* the store, with special values among the keys and values of row 0 */
    fill_uniform(qkv, (size_t)R * W, -2, 2, rng);
    const uint32_t special[] = {0x7fc00000u, 0x7f800001u, 0xff800000u, 0x7f800000u,
                                0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00000001u,
                                0x807fffffu, 0x7f7fffffu, 0x80000000u, 0xffffffffu};
    for (size_t i = 0; i < sizeof special / sizeof *special && i < (size_t)2 * KV; i++)
        qkv[(size_t)NH * hd + i] = from_bits(special[i]);
    be->kv_store_bf16(kb, vb, qkv, slot, pos, R, NH, NKV, hd, Tmax);
    size_t bad = 0;
    for (int s = 0; s < S; s++)
        for (int t = 0; t < Tmax; t++)
            for (int i = 0; i < KV; i++) {
                size_t o = ((size_t)s * Tmax + t) * KV + i;
                uint16_t wk = 0, wv = 0; /* never written: still zero */
                if (t < lens[s]) {
                    int r = (s > 0 ? lens[0] : 0) + (s > 1 ? lens[1] : 0) + t;
                    const float *row = qkv + (size_t)r * W + (size_t)NH * hd;
                    wk = mk_f32_to_bf16(row[i]), wv = mk_f32_to_bf16(row[KV + i]);
                }
                bad += kb[o] != wk || vb[o] != wv;
            }
    if (bad)
        fprintf(stderr, "kv_store_bf16 NH %d NKV %d hd %d: %zu values differ\n", NH, NKV, hd, bad);
    assert_int_equal(bad, 0);

    /* attention over finite values; the float caches hold the same values widened */
    fill_uniform(qkv, (size_t)R * W, -2, 2, rng);
    be->kv_store_bf16(kb, vb, qkv, slot, pos, R, NH, NKV, hd, Tmax);
    for (size_t i = 0; i < cache; i++) kf[i] = mk_bf16_to_f32(kb[i]), vf[i] = mk_bf16_to_f32(vb[i]);
    /* every row (a prompt: one work item a row), each slot's last row (a step: items of a kv
     * head's group or of one head), one row */
    int sel[3][S] = {{0}, {lens[0] - 1, lens[0] + lens[1] - 1, Rall - 1}, {lens[0] + 5}};
    const int nsel[3] = {Rall, S, 1};
    size_t equal = 0, total = 0;
    for (int k = 0; k < 3; k++) {
        int n = nsel[k];
        float *q = qkv;
        int *sl = slot, *ps = pos;
        float *qs = NULL;
        int *ss = NULL;
        if (k) { /* the selected rows' queries, slots and positions */
            qs = malloc(sizeof(float) * n * W), ss = malloc(sizeof(int) * 2 * n);
            for (int i = 0; i < n; i++) {
                memcpy(qs + (size_t)i * W, qkv + (size_t)sel[k][i] * W, sizeof(float) * W);
                ss[i] = slot[sel[k][i]], ss[n + i] = pos[sel[k][i]];
            }
            q = qs, sl = ss, ps = ss + n;
        }
        for (int i = 0; i < n * A; i++) yb[i] = NAN; /* every element must be written */
        be->attn_decode(yf, att, q, kf, vf, sl, ps, n, NH, NKV, hd, Tmax);
        be->attn_decode_bf16(yb, att, q, kb, vb, sl, ps, n, NH, NKV, hd, Tmax);
        snprintf(label, sizeof label, "attn_decode_bf16 NH %d NKV %d hd %d, %d rows", NH, NKV, hd,
                 n);
        check_close(yb, yf, (size_t)n * A, 1e-6, 1e-6, label);
        for (int i = 0; i < n * A; i++) equal += !memcmp(&yb[i], &yf[i], sizeof(float));
        total += (size_t)n * A;
        free(qs), free(ss);
    }
    fprintf(stderr, "attn_decode_bf16 NH %d NKV %d hd %d: %zu/%zu outputs bit-equal\n", NH, NKV, hd,
            equal, total);
    free(qkv), free(kf), free(vf), free(kb), free(vb), free(yf), free(yb), free(att);
    free(slot), free(pos);
}

static void test_kv_ops(void **state)
{
    (void)state;
    mk_set_threads(2);
    mk_rng r;
    mk_rng_seed(&r, 21);
    /* GPT-2 (NKV = NH), grouped queries, the vector path's head sizes 16..128, the fallback's */
    const int shapes[][3] = {{4, 4, 16}, {4, 2, 32}, {8, 2, 64}, {2, 1, 128},
                             {6, 3, 48}, {4, 2, 24}, {3, 3, 8}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        check_kv_ops(shapes[i][0], shapes[i][1], shapes[i][2], &r);
}

/* Decoders of the same parameters with float and bfloat16 caches (both with flags extra): each
 * slot's first-step logits differ, by more than nothing and by at most 2% of the largest
 * logit (each cached value moves by at most 2^-9 of itself; observed 0.05% on the random models,
 * 0.2%, 0.34% and 0.67% on the gpt2, llama3 and qwen3_bf16 fixtures), and the greedy
 * token agrees wherever the float logits' top two lie more than twice that difference apart. */
static void check_kv_model(mk_model *mf, mk_model *mk, const char *name)
{
    int V = mk_model_config(mf)->vocab_size;
    enum { ROWS = 3 * (1 + 5 + 8) };
    float *lf = malloc(sizeof(float) * ROWS * V), *lk = malloc(sizeof(float) * ROWS * V);
    mk_decoder *df, *dk;
    assert_mk_ok(mk_decoder_new_ctx(&df, mf, SL, CTX));
    assert_mk_ok(mk_decoder_new_ctx(&dk, mk, SL, CTX));
    int first[ROWS], n = run_pair(df, dk, V, lf, lk, first), n_first = 0;
    double maxd = 0, maxl = 0;
    for (int row = 0; row < n; row++) {
        if (!first[row]) continue; /* greedy choices may differ later: other inputs */
        n_first++;
        for (int i = row * V; i < (row + 1) * V; i++) {
            maxd = fmax(maxd, fabs((double)lk[i] - lf[i]));
            maxl = fmax(maxl, fabs((double)lf[i]));
        }
    }
    assert_int_equal(n_first, SL);
    int agree = 0, decided = 0;
    for (int row = 0; row < n; row++) {
        if (!first[row]) continue;
        const float *a = lf + (size_t)row * V, *b = lk + (size_t)row * V;
        int ia = 0, ib = 0;
        for (int i = 1; i < V; i++) {
            if (a[i] > a[ia]) ia = i;
            if (b[i] > b[ib]) ib = i;
        }
        float second = -INFINITY;
        for (int i = 0; i < V; i++)
            if (i != ia && a[i] > second) second = a[i];
        agree += ia == ib;
        if (a[ia] - second > 2 * maxd) {
            decided++;
            assert_int_equal(ia, ib);
        }
    }
    fprintf(stderr,
            "%s: bf16 vs float KV cache: max |logit diff| %.3g (max |logit| %.3g); greedy tokens "
            "agree %d/%d (%d decided)\n",
            name, maxd, maxl, agree, n_first, decided);
    assert_true(maxd > 0);            /* the bfloat16 caches are what attention read */
    assert_true(maxd <= 0.02 * maxl); /* and their rounding moves the logits little */
    mk_decoder_free(df), mk_decoder_free(dk);
    free(lf), free(lk);
}

static void test_kv_models(void **state)
{
    (void)state;
    for (int k = 0; k < N_RAND; k++) {
        mk_config c = rand_cfg(k);
        mk_model *mf, *mk;
        assert_mk_ok(mk_model_new_ex(&mf, &c, 1, 1, NULL, MK_MODEL_INFER));
        assert_mk_ok(mk_model_new_ex(&mk, &c, 1, 1, NULL, MK_MODEL_INFER | MK_MODEL_BF16_KV));
        size_t P = mk_model_num_params(mf);
        float *p = malloc(sizeof(float) * P);
        random_params(p, P, 5);
        assert_mk_ok(mk_model_write_params(mf, p, 0, P));
        assert_mk_ok(mk_model_write_params(mk, p, 0, P));
        check_kv_model(mf, mk, rand_names[k]);
        mk_model_free(mf), mk_model_free(mk);
        free(p);
    }
    /* the fixture folders; the BF16 one with bfloat16 weights on both sides (the flags are
     * independent) */
    const char *dirs[] = {"gpt2", "llama3", "qwen3_bf16"};
    for (int k = 0; k < 3; k++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/family/%s", MK_FIXTURES, dirs[k]);
        unsigned extra = k == 2 ? MK_MODEL_BF16_WEIGHTS : 0u;
        mk_model *mf, *mk;
        assert_mk_ok(mk_load_dir_ex(&mf, dir, 1, 1, NULL, MK_MODEL_INFER | extra));
        assert_mk_ok(
            mk_load_dir_ex(&mk, dir, 1, 1, NULL, MK_MODEL_INFER | MK_MODEL_BF16_KV | extra));
        check_kv_model(mf, mk, dirs[k]);
        mk_model_free(mf), mk_model_free(mk);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_product),  cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_products), cmocka_unit_test(test_models),
        cmocka_unit_test(test_folder),   cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_kv_ops),   cmocka_unit_test(test_kv_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
