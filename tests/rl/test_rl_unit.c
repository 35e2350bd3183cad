/*
 * test_rl_unit.c - the pure rules of the RL system against hand-computed
 * values: GRPO advantages, the clipped surrogate loss with a capped
 * importance weight, admission and dropping at the staleness bound, the
 * ledger invariant, loss masks and versions in the trajectory codec, the
 * reward rules, the codecs of the admit and step messages (round trips,
 * truncated and mistyped input refused with the field named), and the
 * init-argument reader (a setting of the wrong type or an unknown key is an
 * error naming the spec key), and the model section: a Hugging Face folder
 * (`path`, written here by mk_save_dir) or an inline size, never both; a
 * missing folder, one without config.json and one whose vocabulary is
 * smaller than the task's are refused naming model.path; context and
 * max_seq default from the block size and may not exceed it.
 */
#include <manta_actors.h>
#include <manta_kernels.h>
#include <rl_util.h>

#include <msgpack.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    mk_config cfg = {
        .n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = RL_VOCAB};
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
    assert_int_equal(rl_traj_decode(&d, "\xdd\x7f\xff\xff\xff", 5), MANTA_EINVAL);
    assert_int_equal(rl_traj_decode(&d, "\xdf\x7f\xff\xff\xff\xc0\xc0", 7), MANTA_EINVAL);
    assert_int_equal(rl_traj_decode(&d, "\x81\xa3tok\xc6\x7f\xff\xff\xff", 10), MANTA_EINVAL);
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

/* ---- message codecs ---- */

typedef int (*decode_fn)(void *out, const void *buf, size_t len);
typedef void (*destroy_fn)(void *out);

/* Every proper prefix of a valid encoding is refused, leaving out empty. */
static void refuse_prefixes(const char *buf, size_t len, decode_fn dec, destroy_fn des, size_t size)
{
    void *out = malloc(size);
    for (size_t n = 0; n < len; n++) {
        assert_int_equal(dec(out, buf, n), MANTA_EINVAL);
        assert_true(rl_last_error()[0] != 0);
        if (des) des(out);
    }
    free(out);
}

static int dec_admit_req(void *o, const void *b, size_t n)
{
    return rl_admit_req_decode(o, b, n);
}
static int dec_admit_reply(void *o, const void *b, size_t n)
{
    return rl_admit_reply_decode(o, b, n);
}
static void des_admit_reply(void *o)
{
    rl_admit_reply_destroy(o);
}
static int dec_step_req(void *o, const void *b, size_t n)
{
    return rl_step_req_decode(o, b, n);
}
static void des_step_req(void *o)
{
    rl_step_req_destroy(o);
}
static int dec_step_reply(void *o, const void *b, size_t n)
{
    return rl_step_reply_decode(o, b, n);
}
static void des_step_reply(void *o)
{
    rl_step_reply_destroy(o);
}

/* A msgpack map of n string keys with values packed by the caller. */
typedef struct mp {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mp;
static msgpack_packer *mp_begin(mp *m, size_t n)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
    msgpack_pack_map(&m->pk, n);
    return &m->pk;
}
static void key(msgpack_packer *pk, const char *k)
{
    msgpack_pack_str(pk, strlen(k));
    msgpack_pack_str_body(pk, k, strlen(k));
}

static void test_admit_codec(void **st)
{
    rl_admit_req q = {.rollout = "rollout-3", .groups = 4, .version = -1}, q2;
    char *buf;
    size_t len;
    assert_int_equal(rl_admit_req_encode(&q, &buf, &len), 0);
    assert_int_equal(rl_admit_req_decode(&q2, buf, len), 0);
    assert_string_equal(q2.rollout, "rollout-3");
    assert_int_equal(q2.groups, 4);
    assert_int_equal(q2.version, -1);
    refuse_prefixes(buf, len, dec_admit_req, NULL, sizeof q2);
    free(buf);

    rl_bucket b[2] = {{.id = {"obj-a"}, .offset = 0, .count = 100, .crc = 0xdeadbeef},
                      {.id = {"obj-b"}, .offset = 100, .count = 7, .crc = 1}};
    /* the second also names its copy in a shard's device memory */
    b[1].has_share = 1;
    for (int i = 0; i < RL_SHARE_BYTES; i++) b[1].share[i] = (unsigned char)(i * 7 + 1);
    snprintf(b[1].share_host, sizeof b[1].share_host, "box/boot/1.2");
    b[1].share_seq = 12, b[1].share_off = 40;
    b[1].bf16 = 1; /* rl.bucket_dtype bf16 */
    rl_admit_ep eps[2] = {{5, 0, 2, 0, "12*3=?", "36"}, {6, -1, 0, 1, "", "x"}};
    rl_admit_reply r = {.version = 3,
                        .stop = 1,
                        .has_buckets = 1,
                        .buckets = {b, 2, 2},
                        .eps = eps,
                        .n_eps = 2},
                   r2;
    assert_int_equal(rl_admit_reply_encode(&r, &buf, &len), 0);
    assert_int_equal(rl_admit_reply_decode(&r2, buf, len), 0);
    assert_int_equal(r2.version, 3);
    assert_int_equal(r2.stop, 1);
    assert_int_equal(r2.has_buckets, 1);
    assert_int_equal(r2.buckets.n, 2);
    assert_string_equal(r2.buckets.v[1].id.s, "obj-b");
    assert_int_equal(r2.buckets.v[0].crc, 0xdeadbeef);
    assert_int_equal(r2.buckets.v[1].offset, 100);
    assert_int_equal(r2.buckets.v[0].has_share, 0);
    assert_int_equal(r2.buckets.v[1].has_share, 1);
    assert_memory_equal(r2.buckets.v[1].share, b[1].share, RL_SHARE_BYTES);
    assert_string_equal(r2.buckets.v[1].share_host, "box/boot/1.2");
    assert_int_equal(r2.buckets.v[1].share_seq, 12);
    assert_int_equal(r2.buckets.v[1].share_off, 40);
    assert_int_equal(r2.buckets.v[0].bf16, 0);
    assert_int_equal(r2.buckets.v[1].bf16, 1);
    assert_int_equal(r2.n_eps, 2);
    assert_string_equal(r2.eps[0].text, "12*3=?");
    assert_string_equal(r2.eps[0].reference, "36");
    assert_int_equal(r2.eps[1].group, -1);
    assert_int_equal(r2.eps[1].eval, 1);
    rl_admit_reply_destroy(&r2);
    refuse_prefixes(buf, len, dec_admit_reply, des_admit_reply, sizeof r2);
    free(buf);
    /* no buckets when the caller is current */
    r.has_buckets = 0, r.n_eps = 0;
    assert_int_equal(rl_admit_reply_encode(&r, &buf, &len), 0);
    assert_int_equal(rl_admit_reply_decode(&r2, buf, len), 0);
    assert_int_equal(r2.has_buckets, 0);
    assert_int_equal(r2.n_eps, 0);
    rl_admit_reply_destroy(&r2);
    free(buf);

    /* mistyped: the field is named */
    mp m;
    msgpack_packer *pk = mp_begin(&m, 3);
    key(pk, "rollout"), key(pk, "r-0");
    key(pk, "groups"), key(pk, "two");
    key(pk, "version"), msgpack_pack_int(pk, 0);
    assert_int_equal(rl_admit_req_decode(&q2, m.sb.data, m.sb.size), MANTA_EINVAL);
    assert_string_equal(rl_last_error(), "admit.groups: expected an integer, got \"two\"");
    msgpack_sbuffer_destroy(&m.sb);
    pk = mp_begin(&m, 2);
    key(pk, "rollout"), key(pk, "r-0");
    key(pk, "groups"), msgpack_pack_int(pk, 1);
    assert_int_equal(rl_admit_req_decode(&q2, m.sb.data, m.sb.size), MANTA_EINVAL);
    assert_string_equal(rl_last_error(), "admit: missing \"version\"");
    msgpack_sbuffer_destroy(&m.sb);
    /* a bucket whose crc is a string */
    pk = mp_begin(&m, 4);
    key(pk, "version"), msgpack_pack_int(pk, 1);
    key(pk, "stop"), msgpack_pack_int(pk, 0);
    key(pk, "episodes"), msgpack_pack_array(pk, 0);
    key(pk, "buckets"), msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 4);
    key(pk, "id"), key(pk, "o"), key(pk, "offset"), msgpack_pack_int(pk, 0);
    key(pk, "count"), msgpack_pack_int(pk, 1), key(pk, "crc"), key(pk, "7");
    assert_int_equal(rl_admit_reply_decode(&r2, m.sb.data, m.sb.size), MANTA_EINVAL);
    assert_string_equal(rl_last_error(),
                        "admit reply.buckets[0].crc: expected an integer, got \"7\"");
    assert_null(r2.buckets.v);
    msgpack_sbuffer_destroy(&m.sb);
    /* a share handle one byte short */
    pk = mp_begin(&m, 4);
    key(pk, "version"), msgpack_pack_int(pk, 1);
    key(pk, "stop"), msgpack_pack_int(pk, 0);
    key(pk, "episodes"), msgpack_pack_array(pk, 0);
    key(pk, "buckets"), msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 5);
    key(pk, "id"), key(pk, "o"), key(pk, "offset"), msgpack_pack_int(pk, 0);
    key(pk, "count"), msgpack_pack_int(pk, 1), key(pk, "crc"), msgpack_pack_int(pk, 7);
    key(pk, "share"), msgpack_pack_map(pk, 4);
    key(pk, "handle"), msgpack_pack_bin(pk, RL_SHARE_BYTES - 1);
    msgpack_pack_bin_body(pk, b[1].share, RL_SHARE_BYTES - 1);
    key(pk, "host"), key(pk, "h"), key(pk, "seq"), msgpack_pack_int(pk, 0);
    key(pk, "off"), msgpack_pack_int(pk, 0);
    assert_int_equal(rl_admit_reply_decode(&r2, m.sb.data, m.sb.size), MANTA_EINVAL);
    assert_string_equal(rl_last_error(),
                        "admit reply.buckets[0].share.handle: expected 64 bytes of bin");
    assert_null(r2.buckets.v);
    msgpack_sbuffer_destroy(&m.sb);
    /* a dtype the rollout cannot read */
    pk = mp_begin(&m, 4);
    key(pk, "version"), msgpack_pack_int(pk, 1);
    key(pk, "stop"), msgpack_pack_int(pk, 0);
    key(pk, "episodes"), msgpack_pack_array(pk, 0);
    key(pk, "buckets"), msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 5);
    key(pk, "id"), key(pk, "o"), key(pk, "offset"), msgpack_pack_int(pk, 0);
    key(pk, "count"), msgpack_pack_int(pk, 1), key(pk, "crc"), msgpack_pack_int(pk, 7);
    key(pk, "dtype"), key(pk, "f16");
    assert_int_equal(rl_admit_reply_decode(&r2, m.sb.data, m.sb.size), MANTA_EINVAL);
    assert_string_equal(rl_last_error(),
                        "admit reply.buckets[0].dtype: 'f16': expected f32 or bf16");
    assert_null(r2.buckets.v);
    msgpack_sbuffer_destroy(&m.sb);
}

static void test_step_codec(void **st)
{
    int32_t tok[4] = {RL_TOK_BOS, 'a', RL_TOK_CALL, RL_TOK_EOS};
    float logp[4] = {0, -0.5f, -1.5f, -0.25f};
    uint8_t mask[4] = {0, 1, 1, 1};
    rl_step_item items[2] = {{4, tok, logp, mask, 0.75f}, {2, tok, NULL, mask, -1}};
    rl_step_req q = {.mode = RL_STEP_PPO, .version = 9, .lr = 1e-3, .items = items, .n_items = 2},
                q2;
    char *buf;
    size_t len;
    assert_int_equal(rl_step_req_encode(&q, &buf, &len), 0);
    assert_int_equal(rl_step_req_decode(&q2, buf, len), 0);
    assert_int_equal(q2.mode, RL_STEP_PPO);
    assert_int_equal(q2.version, 9);
    assert_true(q2.lr == 1e-3);
    assert_int_equal(q2.n_items, 2);
    assert_int_equal(q2.items[0].n, 4);
    assert_memory_equal(q2.items[0].tok, tok, sizeof tok);
    assert_memory_equal(q2.items[0].logp, logp, sizeof logp);
    assert_memory_equal(q2.items[0].mask, mask, sizeof mask);
    assert_true(q2.items[0].adv == 0.75f);
    assert_null(q2.items[1].logp);
    assert_int_equal(q2.items[1].n, 2);
    rl_step_req_destroy(&q2);
    refuse_prefixes(buf, len, dec_step_req, des_step_req, sizeof q2);
    free(buf);
    /* a token outside the vocabulary, and columns of unequal length */
    int32_t badtok[4] = {1, 2, RL_VOCAB, 3};
    items[0].tok = badtok;
    assert_int_equal(rl_step_req_encode(&q, &buf, &len), 0);
    assert_int_equal(rl_step_req_decode(&q2, buf, len), MANTA_EINVAL);
    assert_string_equal(rl_last_error(), "step.items[0].tok[2]: 260 is not a token id");
    assert_null(q2.items);
    free(buf);
    items[0].tok = tok;
    mp m;
    msgpack_packer *pk = mp_begin(&m, 4);
    key(pk, "mode"), key(pk, "ppo"), key(pk, "version"), msgpack_pack_int(pk, 1);
    key(pk, "lr"), msgpack_pack_double(pk, 0.1), key(pk, "items"), msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 4);
    key(pk, "tok"), msgpack_pack_bin(pk, 8), msgpack_pack_bin_body(pk, tok, 8);
    key(pk, "logp"), msgpack_pack_bin(pk, 0);
    key(pk, "mask"), msgpack_pack_bin(pk, 3), msgpack_pack_bin_body(pk, mask, 3);
    key(pk, "adv"), msgpack_pack_double(pk, 1);
    assert_int_equal(rl_step_req_decode(&q2, m.sb.data, m.sb.size), MANTA_EINVAL);
    assert_non_null(strstr(rl_last_error(), "step.items[0]: columns of unequal length"));
    msgpack_sbuffer_destroy(&m.sb);
    pk = mp_begin(&m, 4);
    key(pk, "mode"), key(pk, "rl"), key(pk, "version"), msgpack_pack_int(pk, 1);
    key(pk, "lr"), msgpack_pack_double(pk, 0.1), key(pk, "items"), msgpack_pack_array(pk, 0);
    assert_int_equal(rl_step_req_decode(&q2, m.sb.data, m.sb.size), MANTA_EINVAL);
    assert_string_equal(rl_last_error(), "step.mode: \"rl\" is neither \"ppo\" nor \"sft\"");
    msgpack_sbuffer_destroy(&m.sb);

    rl_bucket b = {.id = {"o-1"}, .offset = 8, .count = 16, .crc = 42};
    rl_step_reply r = {.version = 2,
                       .buckets = {&b, 1, 1},
                       .loss = 0.5,
                       .kl = 0.01,
                       .tokens = 300,
                       .grad_norm = 2,
                       .busy_s = 0.125},
                  r2;
    assert_int_equal(rl_step_reply_encode(&r, &buf, &len), 0);
    assert_int_equal(rl_step_reply_decode(&r2, buf, len), 0);
    assert_int_equal(r2.version, 2);
    assert_int_equal(r2.buckets.n, 1);
    assert_string_equal(r2.buckets.v[0].id.s, "o-1");
    assert_int_equal(r2.buckets.v[0].count, 16);
    assert_true(r2.loss == 0.5 && r2.kl == 0.01 && r2.tokens == 300 && r2.busy_s == 0.125);
    rl_step_reply_destroy(&r2);
    refuse_prefixes(buf, len, dec_step_reply, des_step_reply, sizeof r2);
    free(buf);
}

/* ---- the init-argument reader ---- */

/* The payload manta_spec_init_payload() makes for group `group`, with
 * settings and sections given as msgpack-packing callbacks. */
static void payload(mp *m, const char *group, void (*settings)(msgpack_packer *),
                    void (*sections)(msgpack_packer *))
{
    msgpack_packer *pk = mp_begin(m, 5);
    key(pk, "job"), key(pk, "j");
    key(pk, "group"), key(pk, group);
    key(pk, "replica"), msgpack_pack_int(pk, 0);
    key(pk, "settings");
    if (settings)
        settings(pk);
    else
        msgpack_pack_map(pk, 0);
    key(pk, "sections");
    if (sections)
        sections(pk);
    else
        msgpack_pack_map(pk, 0);
}

static void nested_two(msgpack_packer *pk) /* settings: {model: {n_layer: "two"}} */
{
    msgpack_pack_map(pk, 1), key(pk, "model"), msgpack_pack_map(pk, 1);
    key(pk, "n_layer"), key(pk, "two");
}
static void section_float(msgpack_packer *pk) /* model: {n_head: 2.5} */
{
    msgpack_pack_map(pk, 1), key(pk, "model"), msgpack_pack_map(pk, 1);
    key(pk, "n_head"), msgpack_pack_double(pk, 2.5);
}
static void section_typo(msgpack_packer *pk) /* rl: {gruop_size: 4} */
{
    msgpack_pack_map(pk, 1), key(pk, "rl"), msgpack_pack_map(pk, 1);
    key(pk, "gruop_size"), msgpack_pack_int(pk, 4);
}
static void settings_typo(msgpack_packer *pk) /* settings: {slot: 4} */
{
    msgpack_pack_map(pk, 1), key(pk, "slot"), msgpack_pack_int(pk, 4);
}
static void good_sections(msgpack_packer *pk) /* model: {n_layer: 3, n_embd: 48}, rl: {lr: 1} */
{
    msgpack_pack_map(pk, 2), key(pk, "model"), msgpack_pack_map(pk, 2);
    key(pk, "n_layer"), msgpack_pack_int(pk, 3), key(pk, "n_embd"), msgpack_pack_int(pk, 48);
    key(pk, "rl"), msgpack_pack_map(pk, 1), key(pk, "lr"), msgpack_pack_int(pk, 1);
}
static void good_settings(msgpack_packer *pk) /* settings: {n_layer: 4, slots: 8} */
{
    msgpack_pack_map(pk, 2), key(pk, "n_layer"), msgpack_pack_int(pk, 4);
    key(pk, "slots"), msgpack_pack_int(pk, 8);
}

/* Read the model config of a payload; returns rc, the message in why. */
static int read_model(const char *group, void (*settings)(msgpack_packer *),
                      void (*sections)(msgpack_packer *), rl_model_spec *ms, char *why, size_t wl)
{
    mp m;
    payload(&m, group, settings, sections);
    rl_args a;
    rl_args_open(&a, m.sb.data, m.sb.size);
    rl_model_read(&a, ms);
    (void)rl_arg_num(&a, "rl", "lr", 1e-3, 0, 1e3); /* as declared in rl_keys.c */
    snprintf(why, wl, "%s", a.err);
    int rc = rl_args_close(&a, NULL);
    msgpack_sbuffer_destroy(&m.sb);
    return rc;
}

static void test_settings_reader(void **st)
{
    rl_model_spec ms;
    const mk_config *cfg = &ms.cfg;
    char why[512];
    assert_int_equal(read_model("learner", nested_two, NULL, &ms, why, sizeof why), MANTA_EINVAL);
    assert_string_equal(why,
                        "groups.learner.settings.model.n_layer: expected an integer, got \"two\"");
    assert_string_equal(rl_last_error(), why);
    assert_int_equal(read_model("rollout", NULL, section_float, &ms, why, sizeof why),
                     MANTA_EINVAL);
    assert_string_equal(why, "model.n_head: expected an integer, got 2.5");
    assert_int_equal(read_model("learner", NULL, section_typo, &ms, why, sizeof why), MANTA_EINVAL);
    assert_string_equal(why, "rl.gruop_size: unknown key");
    assert_int_equal(read_model("rollout", settings_typo, NULL, &ms, why, sizeof why),
                     MANTA_EINVAL);
    assert_string_equal(why, "groups.rollout.settings.slot: unknown key");
    /* the group's settings win over the section; defaults fill the rest */
    assert_int_equal(read_model("rollout", good_settings, good_sections, &ms, why, sizeof why), 0);
    assert_int_equal(cfg->n_layer, 4);
    assert_int_equal(cfg->n_embd, 48);
    assert_int_equal(cfg->n_head, 4);
    assert_int_equal(cfg->vocab_size, RL_VOCAB);
    assert_int_equal(ms.context, 64); /* min(block_size 64, 2048) */
    assert_int_equal(ms.max_seq, 64);
    assert_int_equal(ms.dtype, MK_F32);
    assert_int_equal(read_model("learner", NULL, good_sections, &ms, why, sizeof why), 0);
    assert_int_equal(cfg->n_layer, 3);
    /* not a payload at all */
    rl_args a;
    assert_int_equal(rl_args_open(&a, "\x93\x01", 2), MANTA_EINVAL);
    assert_non_null(strstr(a.err, "init argument"));
    assert_int_equal(rl_args_close(&a, NULL), MANTA_EINVAL);
}

/* ---- the model section ---- */

static char g_path[256];    /* model.path of the next payload */
static const char *g_extra; /* a second model key: "n_layer", "context", "max_seq" or NULL */
static int g_extra_val;

static void model_path(msgpack_packer *pk) /* model: {path: g_path[, g_extra: g_extra_val]} */
{
    msgpack_pack_map(pk, 1), key(pk, "model"), msgpack_pack_map(pk, g_extra ? 2 : 1);
    key(pk, "path"), key(pk, g_path);
    if (g_extra) key(pk, g_extra), msgpack_pack_int(pk, g_extra_val);
}

/* A GPT-2 folder of vocabulary V and block size 48 in dtype dt. */
static void make_folder(const char *dir, int V, mk_dtype dt)
{
    mk_config c = {.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 48, .vocab_size = V};
    mk_model *m;
    assert_int_equal(mk_model_new(&m, &c, 1, 4, NULL), 0);
    mk_model_init(m, 5);
    mkdir(dir, 0755);
    if (mk_save_dir(m, dir, dt, 0)) fail_msg("mk_save_dir %s: %s", dir, mk_last_error());
    mk_model_free(m);
}

static int read_path(const char *path, const char *extra, int val, rl_model_spec *ms, char *why,
                     size_t wl)
{
    snprintf(g_path, sizeof g_path, "%s", path);
    g_extra = extra, g_extra_val = val;
    return read_model("rollout", NULL, model_path, ms, why, wl);
}

static void rm_folder(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir), unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir), unlink(p);
    rmdir(dir);
}

static void test_model_section(void **st)
{
    (void)st;
    char good[128], small[128], empty[128], want[512], why[512];
    snprintf(good, sizeof good, "/tmp/manta-rl-unit-%d-good", (int)getpid());
    snprintf(small, sizeof small, "/tmp/manta-rl-unit-%d-small", (int)getpid());
    snprintf(empty, sizeof empty, "/tmp/manta-rl-unit-%d-empty", (int)getpid());
    make_folder(good, RL_VOCAB + 7, MK_BF16);
    make_folder(small, 200, MK_F32);
    mkdir(empty, 0755);
    rl_model_spec ms;

    /* a good folder: its config sizes the model, its dtype the checkpoints */
    assert_int_equal(read_path(good, NULL, 0, &ms, why, sizeof why), 0);
    assert_string_equal(ms.path, good);
    assert_int_equal(ms.cfg.arch, MK_ARCH_GPT2);
    assert_int_equal(ms.cfg.n_layer, 1);
    assert_int_equal(ms.cfg.n_embd, 8);
    assert_int_equal(ms.cfg.vocab_size, RL_VOCAB + 7);
    assert_int_equal(ms.context, 48);
    assert_int_equal(ms.max_seq, 48);
    assert_int_equal(ms.dtype, MK_BF16);
    mk_model *m;
    assert_int_equal(rl_model_open(&ms, 2, ms.max_seq, 0, &m), 0);
    assert_int_equal(mk_model_config(m)->vocab_size, RL_VOCAB + 7);
    mk_model_free(m);
    assert_int_equal(read_path(good, "context", 16, &ms, why, sizeof why), 0);
    assert_int_equal(ms.context, 16);
    assert_int_equal(ms.max_seq, 16); /* follows the context */
    assert_int_equal(read_path(good, "max_seq", 32, &ms, why, sizeof why), 0);
    assert_int_equal(ms.context, 48);
    assert_int_equal(ms.max_seq, 32);

    /* refusals name model.path and the cause */
    assert_int_equal(read_path(good, "n_layer", 2, &ms, why, sizeof why), MANTA_EINVAL);
    assert_string_equal(why, "model.n_layer: cannot be given with model.path (the folder's "
                             "config.json sizes the model)");
    assert_int_equal(read_path(good, "context", 49, &ms, why, sizeof why), MANTA_EINVAL);
    assert_string_equal(why, "model.context: 49 is more than the model's block_size (48)");
    assert_int_equal(read_path("/nonexistent/manta-model", NULL, 0, &ms, why, sizeof why),
                     MANTA_EINVAL);
    assert_string_equal(why, "model.path: /nonexistent/manta-model: No such file or directory");
    assert_int_equal(read_path(empty, NULL, 0, &ms, why, sizeof why), MANTA_EINVAL);
    snprintf(want, sizeof want,
             "model.path: %s/config.json: No such file or directory (not a Hugging Face model "
             "folder)",
             empty);
    assert_string_equal(why, want);
    assert_int_equal(read_path(small, NULL, 0, &ms, why, sizeof why), MANTA_EINVAL);
    snprintf(want, sizeof want,
             "model.path: %s/config.json: vocab_size 200 is smaller than the task's vocabulary "
             "(260: 256 bytes and 4 special tokens)",
             small);
    assert_string_equal(why, want);
    assert_int_equal(read_path("", NULL, 0, &ms, why, sizeof why), MANTA_EINVAL);
    assert_string_equal(why, "model.path: empty (a Hugging Face model folder or a GGUF file)");

    /* a fresh model: F32 checkpoints, the seed's initialisation */
    g_extra = NULL;
    assert_int_equal(read_model("learner", NULL, good_sections, &ms, why, sizeof why), 0);
    assert_int_equal(ms.path[0], 0);
    assert_int_equal(ms.dtype, MK_F32);
    assert_int_equal(rl_model_open(&ms, 1, 8, MK_MODEL_INFER, &m), 0);
    assert_int_equal(mk_model_config(m)->n_layer, 3);
    mk_model_free(m);
    rm_folder(good), rm_folder(small), rmdir(empty);
}

static int g_bw;          /* model.bf16_weights: 0 false, 1 true, 2 the integer 3, 3 absent */
static int g_bp;          /* model.bf16_products: 0 absent, 1 true */
static const char *g_dev; /* model.device */
static const char *g_mm;  /* model.matmul, or NULL */
static const char *g_kv;  /* model.kv_cache, or NULL */
/* model: {n_layer: 2, bf16_weights, bf16_products, device} */
static void model_opts(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1), key(pk, "model");
    msgpack_pack_map(pk, 2 + (g_bw != 3) + (g_bp != 0) + (g_mm != NULL) + (g_kv != NULL));
    if (g_mm) key(pk, "matmul"), key(pk, g_mm);
    if (g_kv) key(pk, "kv_cache"), key(pk, g_kv);
    key(pk, "n_layer"), msgpack_pack_int(pk, 2);
    if (g_bw != 3) key(pk, "bf16_weights");
    if (g_bw == 2)
        msgpack_pack_int(pk, 3);
    else if (g_bw == 1)
        msgpack_pack_true(pk);
    else if (g_bw == 0)
        msgpack_pack_false(pk);
    if (g_bp) key(pk, "bf16_products"), msgpack_pack_true(pk);
    key(pk, "device"), key(pk, g_dev);
}

/* model.bf16_weights, model.bf16_products and model.device: read, checked, and what they
 * open. */
static void test_model_device_bf16(void **st)
{
    (void)st;
    rl_model_spec ms;
    mk_model *m = NULL;
    char why[512];
    g_bw = 1, g_dev = "cpu";
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), 0);
    assert_int_equal(ms.bf16_weights, 1);
    assert_int_equal(ms.cuda, 0);
    assert_int_equal(rl_model_open(&ms, 1, 8, MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS, &m), 0);
    assert_int_equal(mk_model_config(m)->n_layer, 2);
    mk_model_free(m);
    /* bf16_products implies bf16_weights, and contradicts it set false */
    g_bw = 3, g_bp = 1;
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), 0);
    assert_int_equal(ms.bf16_weights, 1);
    assert_int_equal(ms.bf16_products, 1);
    assert_int_equal(rl_model_open(&ms, 1, 8,
                                   MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS | MK_MODEL_BF16_PRODUCTS,
                                   &m),
                     0);
    mk_model_free(m);
    g_bw = 0;
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), MANTA_EINVAL);
    assert_non_null(strstr(why, "model.bf16_products"));
    assert_non_null(strstr(why, "needs bf16_weights"));
    g_bp = 0, g_bw = 2;
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), MANTA_EINVAL);
    assert_non_null(strstr(why, "model.bf16_weights"));
    assert_non_null(strstr(why, "expected true or false"));
    g_bw = 0, g_dev = "tpu";
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), MANTA_EINVAL);
    assert_non_null(strstr(why, "'tpu': expected cpu or cuda"));
    /* model.kv_cache: f32 (the default) or bf16, which opens (and decodes with) bfloat16
     * caches; anything else is refused naming the key */
    g_dev = "cpu", g_bw = 3;
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), 0);
    assert_int_equal(ms.bf16_kv, 0);
    g_kv = "f32";
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), 0);
    assert_int_equal(ms.bf16_kv, 0);
    g_kv = "bf16";
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), 0);
    assert_int_equal(ms.bf16_kv, 1);
    assert_int_equal(ms.bf16_weights, 0);
    assert_int_equal(rl_model_open(&ms, 1, 8, MK_MODEL_INFER | MK_MODEL_BF16_KV, &m), 0);
    {
        mk_decoder *d = NULL;
        int tok[3] = {1, 2, 3}, slot = 0, out = -1;
        float t = 0.0f, tp = 1.0f;
        assert_int_equal(mk_decoder_new_ctx(&d, m, 1, 8), MK_OK);
        assert_int_equal(mk_decoder_append(d, 0, tok, 3), MK_OK);
        assert_int_equal(mk_decoder_step(d, &slot, 1, &t, &tp, &out, NULL, NULL), MK_OK);
        assert_true(out >= 0);
        mk_decoder_free(d);
    }
    mk_model_free(m);
    g_kv = "fp16";
    assert_int_equal(read_model("rollout", NULL, model_opts, &ms, why, sizeof why), MANTA_EINVAL);
    assert_non_null(strstr(why, "model.kv_cache"));
    assert_non_null(strstr(why, "'fp16': expected f32 or bf16"));
    g_kv = NULL, g_bw = 0;
    /* model.matmul: tf32 / bf16 need cuda; an unknown value is refused */
    g_dev = "cpu", g_mm = "bf16";
    assert_int_equal(read_model("learner", NULL, model_opts, &ms, why, sizeof why), MANTA_EINVAL);
    assert_non_null(strstr(why, "model.matmul"));
    assert_non_null(strstr(why, "CUDA back-end"));
    g_dev = "cuda", g_mm = "fp16";
    assert_int_equal(read_model("learner", NULL, model_opts, &ms, why, sizeof why), MANTA_EINVAL);
    assert_non_null(strstr(why, "'fp16': expected fp32, tf32 or bf16"));
    g_mm = "tf32";
    assert_int_equal(read_model("learner", NULL, model_opts, &ms, why, sizeof why), 0);
    assert_int_equal(ms.math, MK_MATH_TF32);
    g_mm = NULL;
    assert_int_equal(read_model("learner", NULL, model_opts, &ms, why, sizeof why), 0);
    assert_int_equal(ms.math, MK_MATH_FP32);
    assert_int_equal(ms.cuda, 1);
    assert_int_equal(ms.bf16_weights, 0);
    /* this test program has no libmanta_cuda.so beside it: the reason, unless a
     * module is installed and a device is visible (then the model opens there) */
    int rc = rl_model_open(&ms, 1, 8, 0, &m);
    if (rc == 0) {
        assert_string_equal(mk_backend_name(mk_model_backend(m)), "cuda");
        mk_model_free(m);
    } else {
        assert_int_equal(rc, MANTA_EINVAL);
        assert_null(m);
        assert_non_null(strstr(rl_last_error(), "model.device is cuda, but"));
    }
}

/* Floats that do not fit an int64 give the default (the cast would be
 * undefined behaviour; found by the traj fuzzer). */
static void test_mp_int_floats(void **st)
{
    (void)st;
    msgpack_object o = {.type = MSGPACK_OBJECT_FLOAT64};
    o.via.f64 = -1e31;
    assert_int_equal(rl_mp_int(&o, -7), -7);
    o.via.f64 = 1e19;
    assert_int_equal(rl_mp_int(&o, -7), -7);
    o.via.f64 = NAN;
    assert_int_equal(rl_mp_int(&o, -7), -7);
    o.via.f64 = 42.9;
    assert_int_equal(rl_mp_int(&o, -7), 42);
    o.via.f64 = -3.0;
    assert_int_equal(rl_mp_int(&o, -7), -3);
}

/* ---- the GPU share derived for the policy groups (rl_defaults.c) ---- */

static bool builtin_class(const char *name, void *user)
{
    (void)user;
    for (const manta_class *const *c = manta_builtin_classes; *c; c++)
        if (!strcmp((*c)->name, name)) return true;
    return false;
}

/* examples/calc_agent.yaml (learner 2, rollout 2, controller, reward, env 2) loaded as
 * `manta run` loads it, with these overrides. */
static manta_spec *load_calc(const char *const *sets, size_t n)
{
    manta_spec_options so = {.sets = sets,
                             .n_sets = n,
                             .class_exists = builtin_class,
                             .sections = rl_spec_sections,
                             .settings = rl_settings_keys,
                             .defaults = rl_spec_defaults};
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec *s = manta_spec_load_file(SOURCE_DIR "/examples/calc_agent.yaml", &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    assert_non_null(s);
    return s;
}

static double gpu_of(const manta_spec *s, const char *g)
{
    const manta_spec_group *grp = manta_spec_group_find(s, g);
    assert_non_null(grp);
    return grp->gpu;
}

/* With model.device cuda every learner and rollout group without a resources.gpu of its own
 * gets 1/N of one GPU (N: the replicas of those groups, rounded down to a thousandth), so
 * that they fit on one device; values given win (0 too), a group's own device counts, a
 * library's class or another class gets nothing, and on the CPU nothing is derived. */
static void test_gpu_defaults(void **st)
{
    (void)st;
    assert_true(rl_gpu_share(0) == 1 && rl_gpu_share(1) == 1);
    assert_true(rl_gpu_share(2) == 0.5 && rl_gpu_share(4) == 0.25);
    assert_true(rl_gpu_share(3) == 0.333 && rl_gpu_share(6) == 0.166);
    assert_true(rl_gpu_share(1000) == 0.001 && rl_gpu_share(5000) == 0.001);
    for (int64_t n = 2; n <= 1000; n++) assert_true(rl_gpu_share(n) * (double)n <= 1 + 1e-9);

    manta_spec *s = load_calc(NULL, 0); /* cpu: nothing */
    assert_int_equal(s->n_derived, 0);
    for (size_t g = 0; g < s->n_groups; g++) assert_true(s->groups[g].gpu == 0);
    manta_spec_free(s);

    const char *cuda[] = {"model.device=cuda"};
    s = load_calc(cuda, 1);
    assert_true(gpu_of(s, "learner") == 0.25 && gpu_of(s, "rollout") == 0.25);
    assert_true(gpu_of(s, "controller") == 0 && gpu_of(s, "env") == 0 && gpu_of(s, "reward") == 0);
    assert_int_equal(s->n_derived, 2);
    assert_string_equal(s->derived[0].path, "groups.learner.resources.gpu");
    assert_string_equal(s->derived[1].path, "groups.rollout.resources.gpu");
    assert_string_equal(s->derived[1].value, "0.25");
    assert_string_equal(s->derived[1].why,
                        "model.device is cuda: the 4 replicas of learner, rollout share one GPU");
    manta_spec_free(s);

    const char *five[] = {"model.device=cuda", "rollout.replicas=3"};
    s = load_calc(five, 2);
    assert_true(gpu_of(s, "learner") == 0.2 && gpu_of(s, "rollout") == 0.2);
    manta_spec_free(s);

    /* a value given wins, 0 included; the others share among themselves */
    const char *own[] = {"model.device=cuda", "learner.resources.gpu=1"};
    s = load_calc(own, 2);
    assert_true(gpu_of(s, "learner") == 1 && gpu_of(s, "rollout") == 0.5);
    assert_int_equal(s->n_derived, 1);
    assert_string_equal(s->derived[0].why,
                        "model.device is cuda: the 2 replicas of rollout share one GPU");
    manta_spec_free(s);
    const char *zero[] = {"model.device=cuda", "learner.resources.gpu=0", "rollout.replicas=1"};
    s = load_calc(zero, 3);
    assert_true(gpu_of(s, "learner") == 0 && gpu_of(s, "rollout") == 1);
    assert_string_equal(s->derived[0].why,
                        "model.device is cuda: the 1 replica of rollout has one GPU");
    manta_spec_free(s);

    /* a group's own device, flat or nested, as its actors read it */
    const char *mine[] = {"rollout.settings.device=cuda"};
    s = load_calc(mine, 1);
    assert_true(gpu_of(s, "learner") == 0 && gpu_of(s, "rollout") == 0.5);
    manta_spec_free(s);
    const char *notmine[] = {"model.device=cuda", "learner.settings.model.device=cpu"};
    s = load_calc(notmine, 2);
    assert_true(gpu_of(s, "learner") == 0 && gpu_of(s, "rollout") == 0.5);
    manta_spec_free(s);

    /* any group of a policy class counts, by class not name; a library's class does not */
    const char *more[] = {"model.device=cuda", "groups.big={class: learner, replicas: 2}",
                          "rollout.library=./librollout.so"};
    s = load_calc(more, 3);
    assert_true(gpu_of(s, "learner") == 0.25 && gpu_of(s, "big") == 0.25);
    assert_true(gpu_of(s, "rollout") == 0);
    manta_spec_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_advantages),           cmocka_unit_test(test_ppo_loss),
        cmocka_unit_test(test_admission_bound),      cmocka_unit_test(test_ledger),
        cmocka_unit_test(test_traj_masks_and_codec), cmocka_unit_test(test_traj_decode_fuzz),
        cmocka_unit_test(test_reward_rules),         cmocka_unit_test(test_admit_codec),
        cmocka_unit_test(test_step_codec),           cmocka_unit_test(test_settings_reader),
        cmocka_unit_test(test_mp_int_floats),        cmocka_unit_test(test_model_device_bf16),
        cmocka_unit_test(test_model_section),        cmocka_unit_test(test_gpu_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
