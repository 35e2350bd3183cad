/*
 * test_decode.c - the decoder against the full forward pass, and the sampler
 * against the distribution it claims to sample.
 *
 * A schedule of joins, leaves, prompts, tool observations and steps with
 * sequences of different lengths runs on a 4-slot decoder; afterwards each
 * slot's sequence goes through mk_forward and every logit vector a step used
 * must equal the forward pass's at that position (1e-4 abs: the same math in
 * another order), and every returned policy log-prob must equal
 * log_softmax(forward logits) at the sampled token.  The same holds for every head size
 * (8 to 128, vector kernels and plain loop) on each step of a 40-token sequence.  The sampler is
 * checked with a chi-square test over 200000 draws (critical values at p = 0.001), which also must
 * reject a wrong distribution, so the check has power.  mk_sample split into its draw and its
 * choice given the uniform (what the CUDA sampler is compared with) gives the same samples.
 */
#include "ktest.h"

#include "mk_internal.h" /* mk__sample_draw, mk__sample_u */

enum { V = 32, CTX = 24, S = 4 };
static const mk_config cfg = {
    .n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = CTX, .vocab_size = V};

typedef struct track {
    int seq[CTX], len;
    float logits[CTX][V]; /* logits used by the step that fed position p */
    float lpp[CTX];       /* returned policy log-prob of the token at p + 1 */
    int stepped[CTX];
} track;

static track tr[S];
static mk_model *model;
static mk_decoder *dec;

static mk_model *new_model_cfg(const mk_config *c, uint64_t seed)
{
    mk_model *m;
    assert_mk_ok(mk_model_new(&m, c, 1, c->block_size, NULL));
    mk_model_init(m, seed);
    /* sharper than GPT-2's init so that logits differ clearly across tokens */
    size_t P = mk_model_num_params(m);
    float *p = mk_model_params(m);
    mk_rng r;
    mk_rng_seed(&r, seed + 1);
    for (size_t i = 0; i < P; i++) p[i] += 0.2f * (mk_rng_uniform(&r) - 0.5f);
    return m;
}

static mk_model *new_model(uint64_t seed)
{
    return new_model_cfg(&cfg, seed);
}

static void reset(int s, uint64_t seed)
{
    assert_mk_ok(mk_decoder_reset(dec, s, seed));
    memset(&tr[s], 0, sizeof tr[s]);
}

static void append(int s, int n, int base)
{
    int t[CTX];
    for (int i = 0; i < n; i++) t[i] = (base + 7 * i) % V;
    assert_mk_ok(mk_decoder_append(dec, s, t, n));
    memcpy(tr[s].seq + tr[s].len, t, sizeof(int) * n);
    tr[s].len += n;
    assert_int_equal(mk_decoder_len(dec, s), tr[s].len);
}

static void step(const int *slots, int n, int *out)
{
    float temp[S], topp[S], lps[S], lpp[S];
    int tok[S];
    for (int i = 0; i < n; i++) temp[i] = 0.7f + 0.2f * i, topp[i] = i % 2 ? 0.9f : 1.0f;
    assert_mk_ok(mk_decoder_step(dec, slots, n, temp, topp, tok, lps, lpp));
    for (int i = 0; i < n; i++) {
        track *t = &tr[slots[i]];
        int p = t->len - 1;
        memcpy(t->logits[p], mk_decoder_last_logits(dec, slots[i]), sizeof(float) * V);
        t->lpp[p] = lpp[i];
        t->stepped[p] = 1;
        assert_true(tok[i] >= 0 && tok[i] < V);
        assert_true(lps[i] <= 0.0f && lpp[i] <= 0.0f);
        t->seq[t->len++] = tok[i];
        if (out) *out++ = tok[i];
    }
}

/* the schedule; returns the sampled tokens in order into out (if given) */
static int schedule(int *out)
{
    int n0 = 0;
    for (int s = 0; s < S; s++) reset(s, 100 + s);
    append(0, 3, 1);
    append(1, 5, 2);
    int a[] = {0, 1};
    for (int k = 0; k < 3; k++, n0 += 2) step(a, 2, out ? out + n0 : NULL);
    append(2, 2, 3); /* slot 2 joins */
    int b[] = {2, 0, 1};
    for (int k = 0; k < 2; k++, n0 += 3) step(b, 3, out ? out + n0 : NULL);
    append(1, 4, 5); /* a tool observation for slot 1 */
    int c[] = {1, 2};
    for (int k = 0; k < 2; k++, n0 += 2) step(c, 2, out ? out + n0 : NULL);
    reset(0, 7); /* slot 0 leaves; a new sequence joins with a one-token prompt */
    append(0, 1, 9);
    int d[] = {0, 1, 2};
    step(d, 3, out ? out + n0 : NULL), n0 += 3;
    append(3, 6, 4);
    int e[] = {3, 0};
    for (int k = 0; k < 3; k++, n0 += 2) step(e, 2, out ? out + n0 : NULL);
    append(2, 1, 6); /* a one-token observation */
    int f[] = {2};
    step(f, 1, out ? out + n0 : NULL), n0 += 1;
    return n0;
}

static void test_kv_cache_equals_forward(void **state)
{
    model = new_model(11);
    assert_mk_ok(mk_decoder_new(&dec, model, S));
    schedule(NULL);
    float *logits = malloc(sizeof(float) * CTX * V), lp[CTX];
    int checked = 0;
    for (int s = 0; s < S; s++) {
        track *t = &tr[s];
        assert_mk_ok(mk_forward(model, t->seq, 1, t->len));
        assert_mk_ok(mk_model_read_logits(model, logits));
        assert_mk_ok(mk_logprobs(model, t->seq + 1, lp, NULL)); /* last target: junk, unused */
        for (int p = 0; p < t->len - 1; p++) {
            if (!t->stepped[p]) continue;
            char label[64];
            snprintf(label, sizeof label, "slot %d position %d logits", s, p);
            check_close(t->logits[p], logits + (size_t)p * V, V, 1e-4, 1e-4, label);
            assert_near(t->lpp[p], lp[p], 1e-4);
            checked++;
        }
    }
    assert_int_equal(checked, 21); /* 26 steps, less the 5 of the sequence slot 0 dropped */
    free(logits);
    mk_decoder_free(dec);
    mk_model_free(model);
}

/* ---- every head size: each step of a 40-token sequence equals the forward pass ---- */

enum { HS_STEPS = 40, HS_SLOTS = 8, HS_CTX = HS_SLOTS + HS_STEPS, HS_V = 40 };

/* Decodes HS_STEPS tokens after a prompt of prompt_len tokens in each of n_slots slots stepping
 * together, then checks every step's logits against mk_forward over the slot's whole sequence. */
static void decode_matches_forward(mk_model *m, int n_slots, int hs)
{
    mk_decoder *d;
    assert_mk_ok(mk_decoder_new(&d, m, n_slots));
    static int seq[HS_SLOTS][HS_CTX];
    static float step_logits[HS_SLOTS][HS_CTX][HS_V];
    int len[HS_SLOTS], slots[HS_SLOTS];
    float temp[HS_SLOTS], topp[HS_SLOTS];
    for (int s = 0; s < n_slots; s++) {
        assert_mk_ok(mk_decoder_reset(d, s, 40 + s));
        len[s] = 1 + s; /* prompts of 1..8 tokens: the multi-row append path as well */
        for (int i = 0; i < len[s]; i++) seq[s][i] = (3 * s + 5 * i + 1) % HS_V;
        assert_mk_ok(mk_decoder_append(d, s, seq[s], len[s]));
        slots[s] = s, temp[s] = 1.0f, topp[s] = 1.0f;
    }
    for (int k = 0; k < HS_STEPS; k++) {
        int tok[HS_SLOTS];
        assert_mk_ok(mk_decoder_step(d, slots, n_slots, temp, topp, tok, NULL, NULL));
        for (int s = 0; s < n_slots; s++) {
            memcpy(step_logits[s][len[s] - 1], mk_decoder_last_logits(d, s), sizeof(float) * HS_V);
            seq[s][len[s]++] = tok[s];
        }
    }
    float *logits = malloc(sizeof(float) * HS_CTX * HS_V);
    for (int s = 0; s < n_slots; s++) {
        assert_mk_ok(mk_forward(m, seq[s], 1, len[s]));
        assert_mk_ok(mk_model_read_logits(m, logits));
        for (int p = len[s] - 1 - HS_STEPS; p < len[s] - 1; p++) {
            char label[96];
            snprintf(label, sizeof label, "head size %d, %d slots: slot %d position %d logits", hs,
                     n_slots, s, p);
            check_close(step_logits[s][p], logits + (size_t)p * HS_V, HS_V, 1e-4, 1e-4, label);
        }
    }
    free(logits);
    mk_decoder_free(d);
}

/* Head sizes that are multiples of 16 take the vector kernels (one copy per size), the others the
 * plain loop; one slot gives one work item per (row, head), eight slots one per row (all heads). */
static void test_every_head_size(void **state)
{
    const struct {
        int hs, n_head;
    } sizes[] = {{8, 4},  {12, 4}, {16, 4}, {32, 2},  {48, 4}, {48, 8},
                 {64, 2}, {80, 2}, {96, 2}, {112, 2}, {128, 2}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        mk_config c = {.n_layer = 2,
                       .n_head = sizes[i].n_head,
                       .n_embd = sizes[i].hs * sizes[i].n_head,
                       .block_size = HS_CTX,
                       .vocab_size = HS_V};
        mk_model *m = new_model_cfg(&c, 100 + i);
        decode_matches_forward(m, 1, sizes[i].hs);
        decode_matches_forward(m, HS_SLOTS, sizes[i].hs);
        mk_model_free(m);
    }
}

static void test_same_seed_same_tokens(void **state)
{
    model = new_model(12);
    assert_mk_ok(mk_decoder_new(&dec, model, S));
    int a[64], b[64];
    int n = schedule(a);
    assert_int_equal(schedule(b), n);
    assert_memory_equal(a, b, sizeof(int) * n);
    /* another decoder with the same seeds agrees too */
    mk_decoder *d2 = dec;
    assert_mk_ok(mk_decoder_new(&dec, model, S));
    schedule(b);
    assert_memory_equal(a, b, sizeof(int) * n);
    mk_decoder_free(dec);
    dec = d2;
    /* a different seed gives a different sequence */
    reset(1, 555);
    append(1, 5, 2);
    int one[] = {1}, t1[8], t2[8];
    for (int k = 0; k < 8; k++) step(one, 1, &t1[k]);
    reset(1, 556);
    append(1, 5, 2);
    for (int k = 0; k < 8; k++) step(one, 1, &t2[k]);
    assert_memory_not_equal(t1, t2, sizeof t1);
    mk_decoder_free(dec);
    mk_model_free(model);
}

static void test_errors_and_limits(void **state)
{
    model = new_model(13);
    assert_mk_ok(mk_decoder_new(&dec, model, 2));
    float temp[2] = {1, 1}, topp[2] = {1, 1};
    int tok[2], slots[2] = {0, 0};
    reset(0, 1);
    reset(1, 1);
    assert_int_equal(mk_decoder_step(dec, slots, 1, temp, topp, tok, NULL, NULL), MK_ERR_STATE);
    append(0, CTX - 1, 1);
    assert_int_equal(mk_decoder_step(dec, slots, 2, temp, topp, tok, NULL, NULL), MK_ERR_ARG);
    int big[CTX] = {0};
    assert_int_equal(mk_decoder_append(dec, 0, big, 2), MK_ERR_FULL); /* 23 + 2 > 24 */
    assert_int_equal(mk_decoder_len(dec, 0), CTX - 1);
    assert_mk_ok(mk_decoder_step(dec, slots, 1, temp, topp, tok, NULL, NULL)); /* now 24 */
    assert_int_equal(mk_decoder_step(dec, slots, 1, temp, topp, tok, NULL, NULL), MK_ERR_FULL);
    assert_int_equal(mk_decoder_len(dec, 0), CTX);
    int bad = V;
    assert_int_equal(mk_decoder_append(dec, 1, &bad, 1), MK_ERR_ARG);
    assert_int_equal(mk_decoder_reset(dec, 2, 0), MK_ERR_ARG);
    mk_decoder_free(dec);
    mk_model_free(model);
}

/* New weights written between steps are used by the next step; a slot reset
 * and refilled afterwards matches the new model's forward pass exactly. */
static void test_weight_swap(void **state)
{
    model = new_model(14);
    mk_model *other = new_model(15);
    assert_mk_ok(mk_decoder_new(&dec, model, 1));
    reset(0, 3);
    append(0, 6, 2);
    int s0[] = {0}, tok;
    step(s0, 1, &tok);
    float next[V];
    size_t P = mk_model_num_params(model);
    float *w = malloc(P * sizeof(float));
    mk_model_read_params(other, w, 0, P);
    assert_mk_ok(mk_model_write_params(model, w, 0, P)); /* the swap */
    reset(0, 3);
    append(0, 6, 2);
    step(s0, 1, &tok);
    memcpy(next, tr[0].logits[5], sizeof next);
    float *logits = malloc(sizeof(float) * CTX * V);
    assert_mk_ok(mk_forward(other, tr[0].seq, 1, 6));
    assert_mk_ok(mk_model_read_logits(other, logits));
    check_close(next, logits + 5 * V, V, 1e-4, 1e-4, "after swap");
    free(w), free(logits);
    mk_decoder_free(dec);
    mk_model_free(model);
    mk_model_free(other);
}

/* An inference-only model (parameters only) decodes exactly as the trainable one holding the
 * same weights, and refuses what needs training state. */
static void test_inference_only(void **state)
{
    (void)state;
    const mk_config qc = {.n_layer = 2,
                          .n_head = 4,
                          .n_embd = 32,
                          .block_size = CTX,
                          .vocab_size = V,
                          .arch = MK_ARCH_QWEN3,
                          .n_kv_head = 2,
                          .head_dim = 16,
                          .n_inner = 48};
    mk_model *full = new_model_cfg(&qc, 21), *inf;
    assert_mk_ok(mk_model_new_ex(&inf, &qc, 1, 1, NULL, MK_MODEL_INFER));
    size_t P = mk_model_num_params(full);
    assert_int_equal(mk_model_num_params(inf), P);
    float *w = malloc(P * sizeof(float));
    assert_mk_ok(mk_model_read_params(full, w, 0, P));
    assert_mk_ok(mk_model_write_params(inf, w, 0, P));
    mk_decoder *a, *b;
    assert_mk_ok(mk_decoder_new_ctx(&a, full, 1, 16));
    assert_mk_ok(mk_decoder_new_ctx(&b, inf, 1, 16));
    int prompt[5] = {1, 9, 4, 30, 7}, s0[] = {0}, ta, tb;
    float t0 = 1.0f, p1 = 1.0f, la, lb;
    assert_mk_ok(mk_decoder_reset(a, 0, 5));
    assert_mk_ok(mk_decoder_reset(b, 0, 5));
    assert_mk_ok(mk_decoder_append(a, 0, prompt, 5));
    assert_mk_ok(mk_decoder_append(b, 0, prompt, 5));
    for (int k = 0; k < 8; k++) {
        assert_mk_ok(mk_decoder_step(a, s0, 1, &t0, &p1, &ta, NULL, &la));
        assert_mk_ok(mk_decoder_step(b, s0, 1, &t0, &p1, &tb, NULL, &lb));
        assert_int_equal(ta, tb);
        assert_true(la == lb);
        check_close(mk_decoder_last_logits(a, 0), mk_decoder_last_logits(b, 0), V, 0, 0,
                    "inference-only logits");
    }
    int toks[2] = {1, 2};
    assert_int_equal(mk_forward(inf, toks, 1, 2), MK_ERR_STATE);
    mk_adamw_params op = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.0f};
    assert_int_equal(mk_model_step(inf, &op, 1, NULL), MK_ERR_STATE);
    assert_int_equal(mk_model_read_grads(inf, w, 0, 1), MK_ERR_STATE);
    mk_model *bad;
    assert_int_equal(mk_model_new_ex(&bad, &qc, 1, 1, NULL, 8u), MK_ERR_ARG);
    assert_null(bad);
    free(w);
    mk_decoder_free(a);
    mk_decoder_free(b);
    mk_model_free(full);
    mk_model_free(inf);
}

/* ---- the sampler ---------------------------------------------------------- */

enum { SV = 8, DRAWS = 200000 };
static const float z[SV] = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.2f};

static double chi2(const long *counts, const double *p, int n, long draws)
{
    double c = 0;
    for (int j = 0; j < n; j++) {
        if (p[j] == 0) continue;
        double e = p[j] * draws;
        c += (counts[j] - e) * (counts[j] - e) / e;
    }
    return c;
}

static void softmax_t(double *p, double t)
{
    double s = 0, mx = 2.0;
    for (int j = 0; j < SV; j++) s += (p[j] = exp((z[j] - mx) / t));
    for (int j = 0; j < SV; j++) p[j] /= s;
}

static void test_sampling_distribution(void **state)
{
    void *scratch = malloc(MK_SAMPLE_SCRATCH(SV));
    mk_rng r;
    mk_rng_seed(&r, 2024);
    double pt[SV], p1[SV];
    softmax_t(pt, 0.7);
    softmax_t(p1, 1.0);
    long counts[SV] = {0};
    for (long i = 0; i < DRAWS; i++) {
        float lps, lpp;
        int t = mk_sample(z, SV, 0.7f, 1.0f, &r, scratch, &lps, &lpp);
        counts[t]++;
        if (i < 100) {
            assert_near(lps, log(pt[t]), 1e-5);
            assert_near(lpp, log(p1[t]), 1e-5);
        }
    }
    double c = chi2(counts, pt, SV, DRAWS);
    fprintf(stderr, "temperature 0.7: chi2 %.2f (df 7, critical 24.32)\n", c);
    assert_true(c < 24.32);
    assert_true(chi2(counts, p1, SV, DRAWS) > 1000); /* the untempered law is rejected */

    /* top-p 0.8 at temperature 1: sorted p1 = .391 (2), .237 (5), .144 (0), .087 (1), ...
     * the nucleus is {2, 5, 0, 1} (mass .859 >= .8); renormalised inside it */
    double nuc[SV] = {0}, mass = p1[2] + p1[5] + p1[0] + p1[1];
    nuc[2] = p1[2] / mass, nuc[5] = p1[5] / mass, nuc[0] = p1[0] / mass, nuc[1] = p1[1] / mass;
    memset(counts, 0, sizeof counts);
    for (long i = 0; i < DRAWS; i++) {
        float lps, lpp;
        int t = mk_sample(z, SV, 1.0f, 0.8f, &r, scratch, &lps, &lpp);
        counts[t]++;
        if (i < 100) {
            assert_near(lps, log(nuc[t]), 1e-5);
            assert_near(lpp, log(p1[t]), 1e-5);
        }
    }
    for (int j = 0; j < SV; j++)
        if (nuc[j] == 0) assert_int_equal(counts[j], 0);
    c = chi2(counts, nuc, SV, DRAWS);
    fprintf(stderr, "top-p 0.8: chi2 %.2f (df 3, critical 16.27)\n", c);
    assert_true(c < 16.27);

    /* greedy */
    float lps, lpp;
    assert_int_equal(mk_sample(z, SV, 0.0f, 1.0f, &r, scratch, &lps, &lpp), 2);
    assert_true(lps == 0.0f);
    assert_near(lpp, log(p1[2]), 1e-6);
    free(scratch);
}

/* mk_sample is the draw (mk__sample_draw) then the choice given the uniform (mk__sample_u, the
 * reference a back-end's sample_rows is held to): for many seeds, logits with and without ties,
 * temperatures (greedy among them) and top-p, both ways give the same token and bit-equal
 * log-probs, and leave the generators in the same state (greedy draws nothing). */
static void test_sample_draw_then_choice(void **state)
{
    enum { NV = 4 };
    static const int vs[NV] = {1, 7, 260, 4099};
    static const float temps[4] = {0.0f, 0.7f, 1.0f, 1.3f}, tps[5] = {1.0f, 0.9f, 0.5f, 0.0f, 0.1f};
    int maxv = vs[NV - 1];
    float *lg = malloc(sizeof(float) * maxv);
    void *scratch = malloc(MK_SAMPLE_SCRATCH(maxv));
    assert_non_null(lg), assert_non_null(scratch);
    mk_rng g;
    mk_rng_seed(&g, 99);
    long n = 0;
    for (int vi = 0; vi < NV; vi++)
        for (uint64_t seed = 0; seed < 40; seed++) {
            int Vv = vs[vi], ties = seed % 2;
            /* ties: logits rounded to a quarter, so many tokens share a probability */
            for (int j = 0; j < Vv; j++) {
                float x = 6.0f * (mk_rng_uniform(&g) - 0.5f);
                lg[j] = ties ? roundf(4 * x) / 4 : x;
            }
            mk_rng a, b;
            mk_rng_seed(&a, seed), mk_rng_seed(&b, seed);
            for (int k = 0; k < 20; k++) {
                float t = temps[k % 4], tp = tps[(k / 4) % 5], l1, p1, l2, p2;
                int t1 = mk_sample(lg, Vv, t, tp, &a, scratch, &l1, &p1);
                float u = mk__sample_draw(&b, t);
                if (t <= 0.0f) assert_true(u == 0.0f);
                int t2 = mk__sample_u(lg, Vv, t, tp, u, scratch, &l2, &p2);
                assert_int_equal(t1, t2);
                assert_memory_equal(&l1, &l2, sizeof l1);
                assert_memory_equal(&p1, &p2, sizeof p1);
                assert_memory_equal(&a, &b, sizeof a);
                n++;
            }
        }
    fprintf(stderr, "draw then choice: %ld samples equal to mk_sample\n", n);
    free(lg), free(scratch);
}

static void test_rng(void **state)
{
    mk_rng a, b;
    mk_rng_seed(&a, 0);
    mk_rng_seed(&b, 0);
    for (int i = 0; i < 10; i++) assert_true(mk_rng_next(&a) == mk_rng_next(&b));
    mk_rng_seed(&b, 1);
    assert_true(mk_rng_next(&a) != mk_rng_next(&b));
    double s = 0;
    for (int i = 0; i < 100000; i++) {
        float u = mk_rng_uniform(&a);
        assert_true(u >= 0.0f && u < 1.0f);
        s += u;
    }
    assert_near(s / 100000, 0.5, 0.005);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_cache_equals_forward),
        cmocka_unit_test(test_every_head_size),
        cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_errors_and_limits),
        cmocka_unit_test(test_weight_swap),
        cmocka_unit_test(test_inference_only),
        cmocka_unit_test(test_sampling_distribution),
        cmocka_unit_test(test_sample_draw_then_choice),
        cmocka_unit_test(test_rng),
    };
    mk_set_threads(2);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
