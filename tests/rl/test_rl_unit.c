/*
 * test_rl_unit.c - the pure rules of the RL system against hand-computed
 * values: GRPO advantages, the clipped surrogate loss with a capped
 * importance weight, admission and dropping at the staleness bound, the
 * ledger invariant, loss masks and versions in the trajectory codec, and
 * the reward rules.
 */
#include <manta_actors.h>
#include <manta_kernels.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_advantages(void **st)
{
    float r[4] = {1, 0, 0, 1}, a[4];
    /* mean 0.5, population std 0.5 */
    assert_int_equal(rl_group_advantages(r, 4, 0, a), 1);
    assert_float_equal(a[0], 1.0f, 1e-6);
    assert_float_equal(a[1], -1.0f, 1e-6);
    float r2[3] = {1, 0, 0}, a2[3];
    /* mean 1/3, std sqrt(2)/3: (1 - 1/3) / (sqrt(2)/3) = sqrt(2) */
    rl_group_advantages(r2, 3, 0, a2);
    assert_float_equal(a2[0], sqrtf(2.0f), 1e-5);
    assert_float_equal(a2[1], -1.0f / sqrtf(2.0f), 1e-5);
    float r3[5] = {0.7f, 0.7f, 0.7f, 0.7f, 0.7f}, a3[5] = {9, 9, 9, 9, 9};
    /* no variance: no signal, counted by the caller */
    assert_int_equal(rl_group_advantages(r3, 5, 1e-6f, a3), 0);
    for (int i = 0; i < 5; i++) assert_float_equal(a3[i], 0.0f, 0);
}

/* mk_loss_ppo against the formula worked by hand on known ratios. */
static void test_ppo_loss(void **st)
{
    mk_config cfg = {1, 2, 8, 8, RL_VOCAB};
    mk_model *m;
    assert_int_equal(mk_model_new(&m, &cfg, 1, 6, NULL), 0);
    mk_model_init(m, 3);
    int x[6] = {RL_TOK_BOS, 'a', 'b', 'c', 'd', 'e'}, y[6] = {'a', 'b', 'c', 'd', 'e', RL_TOK_EOS};
    assert_int_equal(mk_forward(m, x, 1, 6), 0);
    float lp[6];
    assert_int_equal(mk_logprobs(m, y, lp, NULL), 0);
    /* ratios r = exp(lp - behav) chosen: 1.5 (A>0: clipped at 1.28),
     * 0.5 (A>0: unclipped, min(rA, .8A) = .5A), 0.5 (A<0: clip .8 wins),
     * 5.0 (A<0: dual-clip cap 3 wins), 1.0 (A<0), and a masked token. */
    float ratio[6] = {1.5f, 0.5f, 0.5f, 5.0f, 1.0f, 2.0f};
    float adv[6] = {1, 1, -1, -1, -2, 1}, mask[6] = {1, 1, 1, 1, 1, 0}, behav[6];
    for (int i = 0; i < 6; i++) behav[i] = lp[i] - logf(ratio[i]);
    mk_ppo_params p = {0.2f, 0.28f, 3.0f, 0.0f};
    mk_ppo_stats s;
    assert_int_equal(mk_loss_ppo(m, y, behav, adv, mask, &p, &s), 0);
    /* L_i = max(-r A, -clip(r) A), then min(L, -cap A) for A < 0:
     * 1: max(-1.5, -1.28) = -1.28     2: max(-0.5, -0.8) = -0.5
     * 3: max(0.5, 0.8) = 0.8          4: max(5, 3) = 5 -> min(5, 3) = 3
     * 5: max(2, 2) = 2                mean over 5 masked tokens */
    float want = (-1.28f - 0.5f + 0.8f + 3.0f + 2.0f) / 5.0f;
    assert_float_equal(s.pg_loss, want, 1e-4);
    assert_float_equal(s.n_tokens, 5.0f, 0);
    assert_float_equal(s.mean_ratio, (1.5f + 0.5f + 0.5f + 5.0f + 1.0f) / 5.0f, 1e-4);
    mk_model_free(m);
}

static void test_admission_bound(void **st)
{
    /* B = 64 episodes, groups of 8 */
    /* eta = 0: exactly one batch per version, the synchronous baseline */
    assert_true(rl_admit_ok(0, 8, 0, 0, 64));
    assert_true(rl_admit_ok(56, 8, 0, 0, 64));
    assert_false(rl_admit_ok(64, 8, 0, 0, 64));
    assert_true(rl_admit_ok(64, 8, 1, 0, 64));
    /* eta = 2: (V + 3) batches */
    assert_true(rl_admit_ok(184, 8, 0, 2, 64));
    assert_false(rl_admit_ok(192, 8, 0, 2, 64));
    assert_true(rl_admit_ok(192, 8, 1, 2, 64));
    /* dropping: older than eta versions */
    assert_false(rl_is_stale(5, 5, 0));
    assert_true(rl_is_stale(4, 5, 0));
    assert_false(rl_is_stale(3, 5, 2));
    assert_true(rl_is_stale(2, 5, 2));
    assert_false(rl_is_stale(-1, 100, 0)); /* no sampled token: never stale */
}

static void test_ledger(void **st)
{
    rl_ledger l = {.admitted = 100, .trained = 64, .dropped_stale = 8, .dropped_error = 3};
    l.in_flight = 25;
    assert_true(rl_ledger_ok(&l));
    l.in_flight = 24;
    assert_false(rl_ledger_ok(&l));
}

/* A multi-turn episode as the rollout builds it: prompt and observation
 * tokens are given (mask 0, version -1), sampled tokens carry mask 1 and the
 * version that sampled them; the codec keeps all of it. */
static void test_traj_masks_and_codec(void **st)
{
    rl_traj t;
    rl_traj_init(&t);
    t.episode = 42, t.group = 5, t.prompt = 7, t.reward = 1;
    const char *prompt = "12*34=?";
    rl_traj_push(&t, RL_TOK_BOS, 0, -1, 0, RL_SEG_PROMPT);
    for (const char *c = prompt; *c; c++) rl_traj_push(&t, *c, 0, -1, 0, RL_SEG_PROMPT);
    rl_traj_push(&t, RL_TOK_CALL, -0.1f, 3, 1, RL_SEG_POLICY);
    for (const char *c = "12*34"; *c; c++) rl_traj_push(&t, *c, -0.2f, 3, 1, RL_SEG_POLICY);
    rl_traj_push(&t, RL_TOK_END, -0.1f, 4, 1, RL_SEG_POLICY);
    for (const char *c = "408\n"; *c; c++) rl_traj_push(&t, *c, 0, -1, 0, RL_SEG_TOOL);
    for (const char *c = "408"; *c; c++) rl_traj_push(&t, *c, -0.3f, 4, 1, RL_SEG_POLICY);
    rl_traj_push(&t, RL_TOK_EOS, -0.05f, 5, 1, RL_SEG_POLICY);
    assert_int_equal(t.n_seg, 4);
    assert_int_equal(rl_traj_min_version(&t), 3);
    assert_int_equal(rl_traj_max_version(&t), 5);
    assert_int_equal(rl_traj_trained_tokens(&t), 1 + 5 + 1 + 3 + 1);
    char ans[32];
    rl_traj_final_text(&t, ans, sizeof ans);
    assert_string_equal(ans, "408");
    char *buf;
    size_t len;
    assert_int_equal(rl_traj_encode(&t, &buf, &len), 0);
    rl_traj d;
    rl_traj_init(&d);
    assert_int_equal(rl_traj_decode(&d, buf, len), 0);
    assert_int_equal(d.n, t.n);
    assert_int_equal(d.episode, 42);
    assert_int_equal(d.n_seg, 4);
    for (int s = 0; s < d.n_seg; s++) {
        int end = s + 1 < d.n_seg ? d.seg_start[s + 1] : d.n;
        for (int i = d.seg_start[s]; i < end; i++) {
            /* the trainer never sees a token the policy did not sample */
            assert_int_equal(d.mask[i], d.seg_kind[s] == RL_SEG_POLICY);
            assert_true((d.ver[i] >= 0) == (d.seg_kind[s] == RL_SEG_POLICY));
            assert_int_equal(d.tok[i], t.tok[i]);
        }
    }
    /* garbage and truncation are refused, never crash */
    assert_int_equal(rl_traj_decode(&d, buf, len / 2), -1);
    assert_int_equal(rl_traj_decode(&d, "\x81\xa3tok\xc4\x01x", 8), -1);
    free(buf);
    rl_traj_destroy(&d);
    rl_traj_destroy(&t);
}

/* The decoder against mutated and truncated encodings: refuse or accept,
 * never crash (run under ASan/UBSan), and what it accepts is consistent. */
static void test_traj_decode_fuzz(void **st)
{
    rl_traj t;
    rl_traj_init(&t);
    for (int i = 0; i < 40; i++)
        rl_traj_push(&t, i % 7 ? 'a' + i % 26 : RL_TOK_CALL, -0.5f, i / 10, (uint8_t)(i % 3 != 0),
                     i % 3 ? RL_SEG_POLICY : RL_SEG_TOOL);
    char *buf;
    size_t len;
    assert_int_equal(rl_traj_encode(&t, &buf, &len), 0);
    char *m = malloc(len);
    rl_traj d;
    rl_traj_init(&d);
    uint64_t x = 88172645463325252ull;
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(m, buf, len);
        size_t n = len;
        int flips = 1 + it % 4;
        for (int f = 0; f < flips; f++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            m[x % len] = (char)(x >> 24);
        }
        if (it % 5 == 0) n = (size_t)(x >> 8) % len;
        if (rl_traj_decode(&d, m, n) == 0) {
            accepted++;
            for (int s = 0; s < d.n_seg; s++) assert_true(d.seg_start[s] <= d.n);
            for (int i = 0; i < d.n; i++) assert_true(d.tok[i] >= 0 && d.tok[i] < RL_VOCAB);
        } else {
            assert_int_equal(d.n, 0);
        }
    }
    assert_true(accepted > 0); /* flips in values keep it valid often enough */
    /* headers announcing billions of items in a few bytes: refused before
     * msgpack-c would allocate for them */
    assert_int_equal(rl_traj_decode(&d, "\xdd\x7f\xff\xff\xff", 5), -1);
    assert_int_equal(rl_traj_decode(&d, "\xdf\x7f\xff\xff\xff\xc0\xc0", 7), -1);
    assert_int_equal(rl_traj_decode(&d, "\x81\xa3tok\xc6\x7f\xff\xff\xff", 10), -1);
    free(m);
    free(buf);
    rl_traj_destroy(&d);
    rl_traj_destroy(&t);
}

static void test_reward_rules(void **st)
{
    assert_float_equal(rl_reward_rule("exact", 0, "10063", "10063"), 1.0f, 0);
    assert_float_equal(rl_reward_rule("exact", 0, "10063 ", "10063"), 0.0f, 0);
    assert_float_equal(rl_reward_rule("numeric", 1e-3, "3.1416", "3.14159"), 1.0f, 0);
    assert_float_equal(rl_reward_rule("numeric", 1e-6, "3.1416", "3.14159"), 0.0f, 0);
    assert_float_equal(rl_reward_rule("numeric", 1e-6, "abc", "1"), 0.0f, 0);
    assert_float_equal(rl_reward_rule("numeric", 0.01, "1000", "1005"), 1.0f, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_advantages),           cmocka_unit_test(test_ppo_loss),
        cmocka_unit_test(test_admission_bound),      cmocka_unit_test(test_ledger),
        cmocka_unit_test(test_traj_masks_and_codec), cmocka_unit_test(test_traj_decode_fuzz),
        cmocka_unit_test(test_reward_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
