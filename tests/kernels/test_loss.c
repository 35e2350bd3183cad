/*
 * test_loss.c - the losses against values computed by hand.
 *
 * The model is rigged so that its logits are known exactly: every weight is
 * zero except the final LayerNorm's bias, (1, 0, 0, 0), and column 0 of the
 * tied embedding, z = log(0.1, 0.2, 0.3, 0.4).  Whatever the input, the final
 * LayerNorm outputs its bias and the head outputs z, so every position has
 * p = (0.1, 0.2, 0.3, 0.4) and entropy H = 1.27985440 nats.  The comments
 * below work each token's term out by hand.
 */
#include "ktest.h"

#include "mk_internal.h"

enum { V = 4, T = 5 };
static const double p[V] = {0.1, 0.2, 0.3, 0.4};
static const double H = 1.2798542258336676;
static const int tokens[T] = {0, 1, 2, 3, 1};
static const int targets[T] = {0, 1, 2, 3, 1};

static mk_model *rigged(void)
{
    mk_config cfg = {.n_layer = 1, .n_head = 1, .n_embd = 4, .block_size = 8, .vocab_size = V};
    mk_model *m;
    assert_mk_ok(mk_model_new(&m, &cfg, 1, T, NULL));
    float *w = mk_model_params(m);
    memset(w, 0, sizeof(float) * mk_model_num_params(m));
    for (int j = 0; j < V; j++) w[j * 4] = (float)log(p[j]); /* wte[j][0] */
    mk_tensor_info t;
    mk_model_tensor(m, mk_model_num_tensors(m) - 1, &t); /* ln_f.bias */
    assert_string_equal(t.name, "ln_f.bias");
    w[t.offset] = 1.0f;
    assert_mk_ok(mk_forward(m, tokens, 1, T));
    return m;
}

/* dlogits the loss stored, against ct (1[j=t] - p_j) + ch (-p_j (log p_j + H)) */
static void check_dlogits(mk_model *m, const double *ct, const double *ch)
{
    float want[T * V];
    for (int i = 0; i < T; i++)
        for (int j = 0; j < V; j++)
            want[i * V + j] =
                (float)(ct[i] * ((j == targets[i]) - p[j]) + ch[i] * (-p[j] * (log(p[j]) + H)));
    check_close(m->act[MK_ACT_DLOGITS], want, T * V, 1e-6, 1e-5, "dlogits");
}

static void test_logprobs(void **state)
{
    mk_model *m = rigged();
    float lp[T], ent[T];
    assert_mk_ok(mk_logprobs(m, targets, lp, ent));
    for (int i = 0; i < T; i++) {
        assert_near(lp[i], log(p[targets[i]]), 1e-6);
        assert_near(ent[i], H, 1e-6);
    }
    mk_model_free(m);
}

static void test_ce_weighted(void **state)
{
    mk_model *m = rigged();
    const float w[T] = {1, 2, 0, 1, 0};
    float loss;
    assert_mk_ok(mk_loss_ce(m, targets, w, &loss));
    /* (1 * -log .1 + 2 * -log .2 + 1 * -log .4) / 4 = (2.302585 + 3.218876 + 0.916291) / 4 */
    assert_near(loss, 1.6094379, 1e-6);
    double ct[T] = {-0.25, -0.5, 0, -0.25, 0}, ch[T] = {0};
    check_dlogits(m, ct, ch);
    /* all weights zero: loss 0, no gradient, no division by zero */
    const float z[T] = {0};
    assert_mk_ok(mk_loss_ce(m, targets, z, &loss));
    assert_true(loss == 0.0f);
    double zc[T] = {0};
    check_dlogits(m, zc, zc);
    mk_model_free(m);
}

/*
 * clip_low 0.2, clip_high 0.3, ratio_cap 3, entropy_coef 0.1; mask 1,1,1,0,1 (N = 4)
 *   0: r = .1/.05 = 2,   A = +1: max(-2, -1.3) = -1.3   clipped, no gradient
 *   1: r = .2/(2/9) = .9, A = -2: max(1.8, 1.8) = 1.8   inside the range, dL/dlogp = -A r = 1.8
 *   2: r = .3/.075 = 4,  A = -1: max(4, 1.3)    =  4 > 3: capped at 3, no gradient
 *   3: masked out
 *   4: r = .2/.4 = .5,   A = +1: max(-.5, -.8)  = -0.5   active, dL/dlogp = -0.5
 * pg_loss = (-1.3 + 1.8 + 3 - 0.5) / 4 = 0.75;  loss = 0.75 - 0.1 H
 * mean ratio = 7.4 / 4;  clip_frac = 2 / 4
 * approx_kl = [(1 - ln 2) + (-.1 - ln .9) + (3 - ln 4) + (-.5 - ln .5)] / 4
 * (a ratio exactly on a clip boundary is avoided: float rounding decides it)
 */
static const float behav[T] = {-2.99573227f /* ln .05 */, -1.50407740f /* ln(2/9) */,
                               -2.59026717f /* ln .075 */, -0.91629073f, -0.91629073f /* ln .4 */};
static const float adv[T] = {1, -2, -1, 0.5f, 1};
static const float mask[T] = {1, 1, 1, 0, 1};

static void test_ppo_by_hand(void **state)
{
    mk_model *m = rigged();
    mk_ppo_params pp = {
        .clip_low = 0.2f, .clip_high = 0.3f, .ratio_cap = 3.0f, .entropy_coef = 0.1f};
    mk_ppo_stats s;
    assert_mk_ok(mk_loss_ppo(m, targets, behav, adv, mask, &pp, &s));
    assert_near(s.pg_loss, 0.75, 1e-5);
    assert_near(s.loss, 0.75 - 0.1 * H, 1e-5);
    assert_near(s.mean_ratio, 7.4 / 4, 1e-5);
    assert_near(s.clip_frac, 0.5, 1e-7);
    assert_near(s.entropy, H, 1e-6);
    double kl = ((1 - log(2.0)) + (-0.1 - log(0.9)) + (3 - log(4.0)) + (-0.5 - log(0.5))) / 4;
    assert_near(s.approx_kl, kl, 1e-5);
    assert_near(s.n_tokens, 4, 0);
    double ct[T] = {0, 1.8 / 4, 0, 0, -0.5 / 4};
    double ch[T] = {-0.025, -0.025, -0.025, 0, -0.025};
    check_dlogits(m, ct, ch);

    /* without the cap token 2 counts in full: L = 4, dL/dlogp = 4 */
    pp.ratio_cap = 0.0f;
    pp.entropy_coef = 0.0f;
    assert_mk_ok(mk_loss_ppo(m, targets, behav, adv, mask, &pp, &s));
    assert_near(s.pg_loss, (-1.3 + 1.8 + 4 - 0.5) / 4, 1e-5);
    assert_near(s.clip_frac, 0.25, 1e-7);
    double ct2[T] = {0, 1.8 / 4, 4.0 / 4, 0, -0.5 / 4}, ch2[T] = {0};
    check_dlogits(m, ct2, ch2);

    /* the gradient reaches the parameters: only wte and ln_f carry it here */
    mk_zero_grad(m);
    assert_mk_ok(mk_backward(m));
    float g0;
    mk_model_read_grads(m, &g0, 0, 1); /* d loss / d wte[0][0] */
    double want = 0; /* logits z_j = wte[j][0] * 1 (ln_f output) and the head is tied */
    for (int i = 0; i < T; i++) want += ct2[i] * ((0 == targets[i]) - p[0]);
    assert_near(g0, want, 1e-6);
    mk_model_free(m);
}

static void test_ppo_arguments(void **state)
{
    mk_model *m = rigged();
    mk_ppo_params bad = {.clip_low = 1.5f, .clip_high = 0.2f};
    mk_ppo_stats s;
    assert_int_equal(mk_loss_ppo(m, targets, behav, adv, mask, &bad, &s), MK_ERR_ARG);
    mk_ppo_params capbad = {.clip_low = 0.2f, .clip_high = 0.2f, .ratio_cap = 0.5f};
    assert_int_equal(mk_loss_ppo(m, targets, behav, adv, mask, &capbad, &s), MK_ERR_ARG);
    int badt[T] = {0, 1, 9, 3, 1};
    mk_ppo_params ok = {.clip_low = 0.2f, .clip_high = 0.2f};
    assert_int_equal(mk_loss_ppo(m, badt, behav, adv, mask, &ok, &s), MK_ERR_ARG);
    assert_non_null(strstr(mk_last_error(), "target 9"));
    int masked_bad[T] = {0, 1, 2, -1, 1}; /* out of range but masked: fine */
    assert_mk_ok(mk_loss_ppo(m, masked_bad, behav, adv, mask, &ok, &s));
    mk_model_free(m);
    mk_model *fresh;
    mk_config cfg = {.n_layer = 1, .n_head = 1, .n_embd = 4, .block_size = 8, .vocab_size = V};
    assert_mk_ok(mk_model_new(&fresh, &cfg, 1, 4, NULL));
    assert_int_equal(mk_backward(fresh), MK_ERR_STATE);
    assert_int_equal(mk_loss_ce(fresh, targets, NULL, NULL), MK_ERR_STATE);
    mk_model_free(fresh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_ce_weighted),
        cmocka_unit_test(test_ppo_by_hand),
        cmocka_unit_test(test_ppo_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
