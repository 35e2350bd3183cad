/*
 * test_pytorch.c - the CPU model against PyTorch (transformers GPT2LMHeadModel)
 * on the same weights and inputs: forward logits, the weighted cross-entropy
 * and every gradient, the PPO objective's statistics and gradients, and the
 * losses of ten AdamW steps with global-norm clipping.  The reference values
 * come from gen_fixtures.py and are committed in fixtures/.
 *
 * Tolerances (float32 on both sides, different summation orders): logits
 * 1e-5 abs; losses 1e-5; gradients 2e-6 abs + 1e-3 rel per element; AdamW
 * losses 2e-4 after ten steps (Adam's 1/sqrt(v) amplifies tiny gradient
 * differences on near-zero gradients).
 */
#include "ktest.h"

static ref_fixture ref;
static mk_model *model;

static int setup(void **state)
{
    if (ref_load(&ref, MK_FIXTURES "/ref.bin")) return -1;
    if (mk_model_new(&model, &ref.cfg, ref.B, ref.T, NULL)) return -1;
    if (mk_model_num_params(model) != ref.n_params) return -1;
    if (mk_load(model, MK_FIXTURES "/model.safetensors")) {
        fprintf(stderr, "load: %s\n", mk_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    mk_model_free(model);
    free(ref.mem);
    return 0;
}

static void test_forward_logits(void **state)
{
    size_t n = (size_t)ref.B * ref.T * ref.cfg.vocab_size;
    float *logits = malloc(n * sizeof(float));
    assert_mk_ok(mk_forward(model, ref.tokens, ref.B, ref.T));
    assert_mk_ok(mk_model_read_logits(model, logits));
    check_close(logits, ref.logits, n, 1e-5, 1e-4, "logits");
    free(logits);
}

/* Per-tensor comparison so that a failure names the tensor. */
static void check_grads(const float *want)
{
    size_t P = mk_model_num_params(model);
    float *g = malloc(P * sizeof(float));
    assert_mk_ok(mk_model_read_grads(model, g, 0, P));
    for (int i = 0; i < mk_model_num_tensors(model); i++) {
        mk_tensor_info t;
        assert_mk_ok(mk_model_tensor(model, i, &t));
        check_close(g + t.offset, want + t.offset, t.numel, 2e-6, 1e-3, t.name);
    }
    free(g);
}

static void test_ce_loss_and_grads(void **state)
{
    float loss;
    assert_mk_ok(mk_forward(model, ref.tokens, ref.B, ref.T));
    assert_mk_ok(mk_loss_ce(model, ref.targets, ref.weights, &loss));
    assert_near(loss, ref.ce_loss, 1e-5);
    mk_zero_grad(model);
    assert_mk_ok(mk_backward(model));
    check_grads(ref.ce_grads);
}

static void test_ppo_loss_and_grads(void **state)
{
    mk_ppo_params p = {
        .clip_low = 0.2f, .clip_high = 0.28f, .ratio_cap = 3.0f, .entropy_coef = 0.01f};
    mk_ppo_stats s;
    assert_mk_ok(mk_forward(model, ref.tokens, ref.B, ref.T));
    assert_mk_ok(mk_loss_ppo(model, ref.targets, ref.behav, ref.adv, ref.mask, &p, &s));
    assert_near(s.loss, ref.ppo[0], 1e-5);
    assert_near(s.pg_loss, ref.ppo[1], 1e-5);
    assert_near(s.mean_ratio, ref.ppo[2], 1e-5);
    assert_near(s.clip_frac, ref.ppo[3], 1e-6);
    assert_near(s.entropy, ref.ppo[4], 1e-5);
    assert_near(s.approx_kl, ref.ppo[5], 1e-5);
    assert_true(s.clip_frac > 0.0f && s.clip_frac < 1.0f); /* the fixture exercises clipping */
    mk_zero_grad(model);
    assert_mk_ok(mk_backward(model));
    check_grads(ref.ppo_grads);
}

/* Runs last: it changes the weights. */
static void test_adamw_ten_steps(void **state)
{
    mk_adamw_params p = {.lr = 1e-2f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-8f,
                         .weight_decay = 0.1f,
                         .grad_clip = 1.0f};
    for (int t = 1; t <= ref.n_steps; t++) {
        float loss, norm;
        assert_mk_ok(mk_forward(model, ref.tokens, ref.B, ref.T));
        assert_mk_ok(mk_loss_ce(model, ref.targets, ref.weights, &loss));
        mk_zero_grad(model);
        assert_mk_ok(mk_backward(model));
        assert_mk_ok(mk_model_step(model, &p, t, &norm));
        fprintf(stderr, "step %d loss %.6f (torch %.6f) grad norm %.4f\n", t, loss,
                ref.losses[t - 1], norm);
        assert_near(loss, ref.losses[t - 1], 2e-4);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_logits),
        cmocka_unit_test(test_ce_loss_and_grads),
        cmocka_unit_test(test_ppo_loss_and_grads),
        cmocka_unit_test(test_adamw_ten_steps),
    };
    mk_set_threads(2);
    return cmocka_run_group_tests(tests, setup, teardown);
}
