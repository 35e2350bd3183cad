/*
 * rollout.c - the rollout actor: continuous batching of multi-turn episodes.
 *
 * A rollout holds n_slots episodes in one mk_decoder. A self-rearming loop
 * timer ("tick") does, between two turns of the actor's event loop (so the
 * mailbox and every reply are served in between):
 *   - asks the controller for work when whole GRPO groups fit in the free
 *     slots (pull model: a new rollout takes work the moment it is up);
 *   - loads a newer policy version before starting newly admitted episodes
 *     and between decode steps (weight buckets fetched as objects, CRC32C
 *     checked); the version never goes backwards;
 *   - advances every generating slot by one token in one mk_decoder_step;
 *   - parks a slot whose policy closed a tool call (RL_TOK_CALL ... RL_TOK_END)
 *     and sends the call to an env actor; when the observation comes back it
 *     is appended as given tokens (loss mask 0) and the slot generates again;
 *   - ends an episode at RL_TOK_EOS or at the token / turn / context limit,
 *     asks a reward actor for its score, and submits the trajectory to the
 *     controller.
 * Every sampled token is stored with its behaviour log-prob and the version
 * that sampled it, so an episode may span versions.
 *
 * Settings (group settings, else sections.rl): slots, temperature,
 * max_new_tokens, max_turns, controller (actor name, default
 * "controller-0"), env_group ("env"), reward_group ("reward"), threads;
 * sections.model for the model's size.
 *
 * "drain": stop asking for work, hand the unfinished episodes back to the
 * controller (it re-admits them elsewhere), wait for submissions in flight,
 * answer. "stats": counters as msgpack.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <manta_collective.h>
#include <manta_kernels.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ACTORS  64
#define MAX_BUCKETS 1024

enum { SLOT_FREE, SLOT_GEN, SLOT_TOOL, SLOT_SCORE, SLOT_SUBMIT };

typedef struct slot {
    int state;
    rl_traj traj;
    char reference[128];
    int greedy;
    int turns, new_tokens, in_call, call_start;
    int tool_tries;
    char call_text[256];
    manta_future *fut;
} slot;

typedef struct bucket {
    char id[48];
    int64_t offset, count;
    uint32_t crc;
} bucket;

typedef struct rollout_state {
    manta_ctx *m;
    mk_model *model;
    mk_decoder *dec;
    mk_config cfg;
    int n_slots, group_size;
    slot *slots;
    float temperature, top_p;
    int max_new_tokens, max_turns;
    char controller[64], env_group[32], reward_group[32];
    manta_actor *ctl;
    manta_actor *envs[MAX_ACTORS], *rewards[MAX_ACTORS];
    int n_envs, n_rewards, rr_env, rr_reward;
    int64_t last_discover;
    int64_t version; /* -1 until the first weights arrive */
    manta_future *admit;
    int64_t next_admit_ms;
    int draining, stopped;
    uint64_t timer;
    uint64_t seed;
    float *wbuf;
    size_t n_params;
    int32_t *stok, *sidx;
    float *stemp, *stopp, *slps, *slpp;
    /* counters */
    uint64_t episodes, tokens, steps, tool_calls, tool_errors, weight_loads, weight_errors,
        submit_errors, handed_back, admit_calls;
    double busy_s;
} rollout_state;

static void tick(void *arg);

static int rollout_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    rollout_state *s = state;
    s->m = m;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, args, len) != 0) {
        msgpack_unpacked_destroy(&u);
        return MANTA_EINVAL;
    }
    const msgpack_object *a = &u.data;
    s->cfg.n_layer = (int)rl_mp_int(rl_setting(a, "n_layer", "model"), 2);
    s->cfg.n_head = (int)rl_mp_int(rl_setting(a, "n_head", "model"), 4);
    s->cfg.n_embd = (int)rl_mp_int(rl_setting(a, "n_embd", "model"), 64);
    s->cfg.block_size = (int)rl_mp_int(rl_setting(a, "block_size", "model"), 64);
    s->cfg.vocab_size = RL_VOCAB;
    s->n_slots = (int)rl_mp_int(rl_setting(a, "slots", "rl"), 32);
    s->group_size = (int)rl_mp_int(rl_setting(a, "group_size", "rl"), 8);
    s->temperature = (float)rl_mp_num(rl_setting(a, "temperature", "rl"), 1.0);
    s->top_p = (float)rl_mp_num(rl_setting(a, "top_p", "rl"), 1.0);
    s->max_new_tokens = (int)rl_mp_int(rl_setting(a, "max_new_tokens", "rl"), 32);
    s->max_turns = (int)rl_mp_int(rl_setting(a, "max_turns", "rl"), 2);
    rl_mp_str(rl_setting(a, "controller", NULL), s->controller, sizeof s->controller,
              "controller-0");
    rl_mp_str(rl_setting(a, "env_group", NULL), s->env_group, sizeof s->env_group, "env");
    rl_mp_str(rl_setting(a, "reward_group", NULL), s->reward_group, sizeof s->reward_group,
              "reward");
    int threads = (int)rl_mp_int(rl_setting(a, "threads", NULL), 1);
    s->seed = (uint64_t)rl_mp_int(rl_mp_get(a, "replica"), 0) * 7919 + 17;
    msgpack_unpacked_destroy(&u);
    if (s->n_slots < s->group_size) s->n_slots = s->group_size;

    mk_set_threads(threads);
    if (mk_model_new(&s->model, &s->cfg, 1, s->cfg.block_size, NULL) ||
        mk_decoder_new(&s->dec, s->model, s->n_slots)) {
        rl_log(m, "rollout: model: %s", mk_last_error());
        return MANTA_EINVAL;
    }
    s->n_params = mk_model_num_params(s->model);
    s->wbuf = calloc(s->n_params, sizeof(float));
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    size_t n = (size_t)s->n_slots;
    s->stok = calloc(n, sizeof(int32_t)), s->sidx = calloc(n, sizeof(int32_t));
    s->stemp = calloc(n, sizeof(float)), s->stopp = calloc(n, sizeof(float));
    s->slps = calloc(n, sizeof(float)), s->slpp = calloc(n, sizeof(float));
    if (!s->wbuf || !s->slots || !s->stok || !s->sidx || !s->stemp || !s->stopp || !s->slps ||
        !s->slpp)
        return MANTA_ENOMEM;
    for (int i = 0; i < s->n_slots; i++) rl_traj_init(&s->slots[i].traj);
    s->version = -1;
    s->timer = manta_timer_add(m, 1, tick, s);
    rl_log(m, "rollout: %d slots, %zu params", s->n_slots, s->n_params);
    return 0;
}

static void rollout_fini(manta_ctx *m, void *state)
{
    rollout_state *s = state;
    if (s->timer) manta_timer_cancel(m, s->timer);
    manta_future_free(s->admit);
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        manta_future_free(s->slots[i].fut);
        rl_traj_destroy(&s->slots[i].traj);
    }
    mk_decoder_free(s->dec);
    mk_model_free(s->model);
    free(s->slots), free(s->wbuf), free(s->stok), free(s->sidx), free(s->stemp), free(s->stopp);
    free(s->slps), free(s->slpp);
}

/* ---- discovery of env and reward actors ---- */

static int discover_group(rollout_state *s, const char *group, manta_actor **out)
{
    int n = 0;
    for (int i = 0; i < MAX_ACTORS; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s-%d", group, i);
        manta_actor *a;
        if (manta_actor_lookup(s->m, name, &a)) break;
        manta_actor_info info;
        if (manta_actor_info_get(s->m, a, &info) == 0 && info.state != MANTA_ACTOR_ALIVE) continue;
        out[n++] = a;
    }
    return n;
}

static void discover(rollout_state *s)
{
    int64_t now = rl_now_ms();
    if (s->n_envs && s->n_rewards && now - s->last_discover < 1000) return;
    s->last_discover = now;
    s->n_envs = discover_group(s, s->env_group, s->envs);
    s->n_rewards = discover_group(s, s->reward_group, s->rewards);
    if (!s->ctl) manta_actor_lookup(s->m, s->controller, &s->ctl);
}

/* ---- weights ---- */

/* Fetch the buckets of `version` and load them; 0 or -1 (kept the old). */
static int load_weights(rollout_state *s, int64_t version, const bucket *b, int nb)
{
    size_t total = 0;
    for (int i = 0; i < nb; i++) {
        manta_obj_id id;
        snprintf(id.s, sizeof id.s, "%s", b[i].id);
        void *data = NULL;
        size_t len = 0;
        int rc = manta_obj_get(s->m, &id, &data, &len, 10000);
        if (rc || b[i].offset < 0 || (size_t)(b[i].offset + b[i].count) > s->n_params ||
            len != (size_t)b[i].count * sizeof(float) || manta_crc32c(0, data, len) != b[i].crc) {
            rl_log(s->m, "rollout: bucket %s of version %lld: %s", b[i].id, (long long)version,
                   rc ? manta_last_error() : "bad size or checksum");
            free(data);
            s->weight_errors++;
            return -1;
        }
        memcpy(s->wbuf + b[i].offset, data, len);
        total += (size_t)b[i].count;
        free(data);
    }
    if (total != s->n_params) {
        s->weight_errors++;
        rl_log(s->m, "rollout: version %lld covers %zu of %zu params", (long long)version, total,
               s->n_params);
        return -1;
    }
    mk_model_write_params(s->model, s->wbuf, 0, s->n_params);
    s->version = version;
    s->weight_loads++;
    return 0;
}

/* ---- episodes ---- */

static void start_episode(rollout_state *s, const msgpack_object *e)
{
    int k = -1;
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].state == SLOT_FREE) {
            k = i;
            break;
        }
    if (k < 0) return;
    slot *sl = &s->slots[k];
    rl_traj_clear(&sl->traj);
    sl->traj.episode = rl_mp_int(rl_mp_get(e, "episode"), -1);
    sl->traj.group = rl_mp_int(rl_mp_get(e, "group"), -1);
    sl->traj.prompt = (int32_t)rl_mp_int(rl_mp_get(e, "prompt"), -1);
    sl->traj.eval = (int)rl_mp_int(rl_mp_get(e, "eval"), 0);
    snprintf(sl->traj.rollout, sizeof sl->traj.rollout, "%s", manta_self(s->m));
    sl->greedy = sl->traj.eval;
    rl_mp_str(rl_mp_get(e, "reference"), sl->reference, sizeof sl->reference, "");
    char text[512];
    rl_mp_str(rl_mp_get(e, "text"), text, sizeof text, "");
    int32_t toks[512];
    int n = 0;
    toks[n++] = RL_TOK_BOS;
    n += rl_tokenize(text, toks + n, (int)(sizeof toks / sizeof *toks) - n);
    if (n > s->cfg.block_size - 2) n = s->cfg.block_size - 2;
    for (int i = 0; i < n; i++) rl_traj_push(&sl->traj, toks[i], 0, -1, 0, RL_SEG_PROMPT);
    mk_decoder_reset(s->dec, k, s->seed++);
    mk_decoder_append(s->dec, k, toks, n);
    sl->turns = sl->new_tokens = sl->in_call = 0;
    sl->tool_tries = 0;
    sl->state = SLOT_GEN;
    s->episodes++;
}

static void pack_kv_bool(msgpack_packer *pk, const char *k, int v)
{
    rl_pack_str(pk, k);
    v ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

/* The episode in slot k is over: ask for its reward. */
static void finish(rollout_state *s, int k)
{
    slot *sl = &s->slots[k];
    rl_traj_final_text(&sl->traj, sl->traj.answer, sizeof sl->traj.answer);
    discover(s);
    if (s->n_rewards == 0) {
        sl->traj.status = RL_EP_ERROR;
        snprintf(sl->traj.error, sizeof sl->traj.error, "no reward actor");
        sl->state = SLOT_SCORE;
        sl->fut = NULL;
        return;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    rl_pack_kv_str(&pk, "answer", sl->traj.answer);
    rl_pack_kv_str(&pk, "reference", sl->reference);
    manta_actor *r = s->rewards[s->rr_reward++ % s->n_rewards];
    sl->fut = manta_call_timeout(s->m, r, "score", sb.data, sb.size, 30000);
    msgpack_sbuffer_destroy(&sb);
    sl->state = SLOT_SCORE;
}

static void send_tool(rollout_state *s, int k)
{
    slot *sl = &s->slots[k];
    discover(s);
    sl->fut = NULL;
    if (s->n_envs == 0) return; /* answered as an error observation in poll */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    rl_pack_kv_str(&pk, "tool", "");
    rl_pack_kv_str(&pk, "input", sl->call_text);
    manta_actor *e = s->envs[s->rr_env++ % s->n_envs];
    sl->fut = manta_call_timeout(s->m, e, "call", sb.data, sb.size, 30000);
    msgpack_sbuffer_destroy(&sb);
}

static void append_observation(rollout_state *s, int k, const char *text, int ok)
{
    slot *sl = &s->slots[k];
    s->tool_calls++;
    sl->traj.tool_calls++;
    if (!ok) s->tool_errors++, sl->traj.tool_errors++;
    int32_t toks[160];
    int n = rl_tokenize(text, toks, 150);
    toks[n++] = '\n';
    if (mk_decoder_len(s->dec, k) + n >= s->cfg.block_size) {
        sl->traj.truncated = 1;
        finish(s, k);
        return;
    }
    for (int i = 0; i < n; i++) rl_traj_push(&sl->traj, toks[i], 0, -1, 0, RL_SEG_TOOL);
    if (mk_decoder_append(s->dec, k, toks, n)) {
        sl->traj.truncated = 1;
        finish(s, k);
        return;
    }
    sl->state = SLOT_GEN;
}

static void submit(rollout_state *s, int k)
{
    slot *sl = &s->slots[k];
    char *buf;
    size_t len;
    discover(s);
    if (!s->ctl || rl_traj_encode(&sl->traj, &buf, &len)) {
        s->submit_errors++;
        sl->state = SLOT_FREE;
        return;
    }
    sl->fut = manta_call_timeout(s->m, s->ctl, "submit", buf, len, 60000);
    free(buf);
    sl->state = SLOT_SUBMIT;
}

/* Check the futures of parked slots. */
static void poll_slots(rollout_state *s)
{
    for (int k = 0; k < s->n_slots; k++) {
        slot *sl = &s->slots[k];
        if (sl->state == SLOT_TOOL) {
            if (!sl->fut) {
                append_observation(s, k, "error: no env", 0);
                continue;
            }
            if (!manta_future_done(sl->fut)) continue;
            const void *d;
            size_t n;
            int rc = manta_get(sl->fut, 0, &d, &n);
            if (rc && sl->tool_tries++ < 4) { /* env draining or gone: another one */
                manta_future_free(sl->fut);
                s->last_discover = 0;
                send_tool(s, k);
                continue;
            }
            char text[256] = "error: env unavailable";
            int ok = 0;
            if (rc == 0) {
                msgpack_unpacked u;
                msgpack_unpacked_init(&u);
                if (rl_unpack(&u, d, n) == 0) {
                    rl_mp_str(rl_mp_get(&u.data, "text"), text, sizeof text, "error: bad answer");
                    ok = (int)rl_mp_int(rl_mp_get(&u.data, "ok"), 0);
                }
                msgpack_unpacked_destroy(&u);
            }
            manta_future_free(sl->fut);
            sl->fut = NULL;
            append_observation(s, k, text, ok);
        } else if (sl->state == SLOT_SCORE) {
            if (sl->fut && !manta_future_done(sl->fut)) continue;
            if (sl->fut) {
                const void *d;
                size_t n;
                int rc = manta_get(sl->fut, 0, &d, &n);
                int ok = 0;
                if (rc == 0) {
                    msgpack_unpacked u;
                    msgpack_unpacked_init(&u);
                    if (rl_unpack(&u, d, n) == 0) {
                        sl->traj.reward = (float)rl_mp_num(rl_mp_get(&u.data, "reward"), 0);
                        ok = (int)rl_mp_int(rl_mp_get(&u.data, "ok"), 0);
                    }
                    msgpack_unpacked_destroy(&u);
                }
                if (!ok) {
                    sl->traj.status = RL_EP_ERROR;
                    snprintf(sl->traj.error, sizeof sl->traj.error, "reward failed: %s",
                             rc ? manta_strerror(rc) : "rule or service error");
                }
                manta_future_free(sl->fut);
                sl->fut = NULL;
            }
            submit(s, k);
        } else if (sl->state == SLOT_SUBMIT) {
            if (!manta_future_done(sl->fut)) continue;
            if (manta_future_status(sl->fut) != 0) {
                s->submit_errors++;
                rl_log(s->m, "rollout: submit of episode %lld: %s", (long long)sl->traj.episode,
                       manta_future_error(sl->fut));
            }
            manta_future_free(sl->fut);
            sl->fut = NULL;
            sl->state = SLOT_FREE;
        }
    }
}

/* One decode step over every generating slot. */
static int decode_step(rollout_state *s)
{
    int n = 0;
    for (int k = 0; k < s->n_slots; k++) {
        if (s->slots[k].state != SLOT_GEN) continue;
        s->sidx[n] = k;
        s->stemp[n] = s->slots[k].greedy ? 0.0f : s->temperature;
        s->stopp[n] = s->slots[k].greedy ? 1.0f : s->top_p;
        n++;
    }
    if (n == 0) return 0;
    int rc = mk_decoder_step(s->dec, s->sidx, n, s->stemp, s->stopp, s->stok, s->slps, s->slpp);
    if (rc) { /* a slot is full: end every full one, retry next tick */
        for (int i = 0; i < n; i++) {
            int k = s->sidx[i];
            if (mk_decoder_len(s->dec, k) >= s->cfg.block_size) {
                s->slots[k].traj.truncated = 1;
                finish(s, k);
            }
        }
        return n;
    }
    s->steps++;
    for (int i = 0; i < n; i++) {
        int k = s->sidx[i];
        slot *sl = &s->slots[k];
        int tok = s->stok[i];
        /* The behaviour log-prob. At temperature 1 it is the policy's own
         * (untruncated) log-prob, as inference engines report it: the
         * nucleus (top_p) only keeps the far tail of a small model's
         * distribution from being sampled, and the learner compares like with
         * like. At another temperature it is that of the tempered
         * distribution actually sampled from. */
        float lp = s->temperature == 1.0f ? s->slpp[i] : s->slps[i];
        rl_traj_push(&sl->traj, tok, lp, (int32_t)s->version, 1, RL_SEG_POLICY);
        sl->new_tokens++;
        s->tokens++;
        if (tok == RL_TOK_EOS) {
            finish(s, k);
            continue;
        }
        if (tok == RL_TOK_CALL) {
            sl->in_call = 1;
            sl->call_start = sl->traj.n;
        } else if (tok == RL_TOK_END && sl->in_call) {
            sl->in_call = 0;
            int len = 0;
            for (int j = sl->call_start; j < sl->traj.n - 1 && len < (int)sizeof sl->call_text - 1;
                 j++)
                if (sl->traj.tok[j] < 256) sl->call_text[len++] = (char)sl->traj.tok[j];
            sl->call_text[len] = 0;
            sl->turns++;
            if (sl->turns > s->max_turns) {
                sl->traj.truncated = 1;
                finish(s, k);
                continue;
            }
            sl->state = SLOT_TOOL;
            sl->tool_tries = 0;
            send_tool(s, k);
            continue;
        }
        if (sl->new_tokens >= s->max_new_tokens || mk_decoder_len(s->dec, k) >= s->cfg.block_size) {
            sl->traj.truncated = 1;
            finish(s, k);
        }
    }
    return n;
}

static int free_slots(const rollout_state *s)
{
    int n = 0;
    for (int k = 0; k < s->n_slots; k++) n += s->slots[k].state == SLOT_FREE;
    return n;
}

static void ask_work(rollout_state *s)
{
    if (s->admit || s->draining || s->stopped || rl_now_ms() < s->next_admit_ms) return;
    int groups = free_slots(s) / s->group_size;
    /* with no room, still ask (for nothing) now and then: the reply carries
     * the newest version, which is loaded between decode steps */
    if (groups == 0 && rl_now_ms() < s->next_admit_ms + 30) return;
    discover(s);
    if (!s->ctl) {
        s->next_admit_ms = rl_now_ms() + 200;
        return;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    rl_pack_kv_str(&pk, "rollout", manta_self(s->m));
    rl_pack_kv_int(&pk, "groups", groups);
    rl_pack_kv_int(&pk, "version", s->version);
    s->admit = manta_call_timeout(s->m, s->ctl, "admit", sb.data, sb.size, 30000);
    msgpack_sbuffer_destroy(&sb);
    s->admit_calls++;
}

/* Read the version and buckets of a reply; load if newer. */
static void maybe_load(rollout_state *s, const msgpack_object *o)
{
    int64_t v = rl_mp_int(rl_mp_get(o, "version"), -1);
    if (v <= s->version) return;
    const msgpack_object *bs = rl_mp_get(o, "buckets");
    if (!bs || bs->type != MSGPACK_OBJECT_ARRAY || bs->via.array.size > MAX_BUCKETS) return;
    bucket *b = malloc(MAX_BUCKETS * sizeof *b);
    int nb = 0;
    if (!b) return;
    for (uint32_t i = 0; i < bs->via.array.size; i++) {
        const msgpack_object *e = &bs->via.array.ptr[i];
        rl_mp_str(rl_mp_get(e, "id"), b[nb].id, sizeof b[nb].id, "");
        b[nb].offset = rl_mp_int(rl_mp_get(e, "offset"), -1);
        b[nb].count = rl_mp_int(rl_mp_get(e, "count"), 0);
        b[nb].crc = (uint32_t)rl_mp_int(rl_mp_get(e, "crc"), 0);
        nb++;
    }
    load_weights(s, v, b, nb);
    free(b);
}

/* Give admitted episodes back to the controller without running them. */
static void hand_back(rollout_state *s, const msgpack_object *eps)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    rl_pack_kv_str(&pk, "rollout", manta_self(s->m));
    rl_pack_str(&pk, "episodes");
    msgpack_pack_array(&pk, eps->via.array.size);
    for (uint32_t i = 0; i < eps->via.array.size; i++)
        msgpack_pack_int64(&pk, rl_mp_int(rl_mp_get(&eps->via.array.ptr[i], "episode"), -1));
    if (s->ctl) manta_cast(s->m, s->ctl, "handback", sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    s->handed_back += eps->via.array.size;
}

static void take_work(rollout_state *s)
{
    if (!s->admit || !manta_future_done(s->admit)) return;
    const void *d;
    size_t n;
    int rc = manta_get(s->admit, 0, &d, &n);
    int got = 0;
    if (rc == 0) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        if (rl_unpack(&u, d, n) == 0) {
            maybe_load(s, &u.data);
            if (rl_mp_int(rl_mp_get(&u.data, "stop"), 0)) s->stopped = 1;
            const msgpack_object *eps = rl_mp_get(&u.data, "episodes");
            if (eps && eps->type == MSGPACK_OBJECT_ARRAY && eps->via.array.size) {
                if (s->version < 0 || s->draining) {
                    /* no weights (or draining): give them straight back */
                    hand_back(s, eps);
                } else {
                    for (uint32_t i = 0; i < eps->via.array.size; i++)
                        start_episode(s, &eps->via.array.ptr[i]), got++;
                }
            }
        }
        msgpack_unpacked_destroy(&u);
    } else {
        s->ctl = NULL; /* look the controller up again */
    }
    manta_future_free(s->admit);
    s->admit = NULL;
    s->next_admit_ms = rl_now_ms() + (got ? 0 : 20);
}

static void tick(void *arg)
{
    rollout_state *s = arg;
    s->timer = 0;
    double t0 = rl_now_s();
    take_work(s);
    ask_work(s);
    poll_slots(s);
    int n = decode_step(s);
    if (n) s->busy_s += rl_now_s() - t0;
    /* 0 ms when generating: the loop still serves the mailbox between steps */
    s->timer = manta_timer_add(s->m, n ? 0 : 2, tick, s);
}

/* ---- methods ---- */

/* The controller pushes a new version (optional: admits carry it too). */
static int rollout_weights(manta_req *req, void *state, const void *arg, size_t len)
{
    rollout_state *s = state;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, arg, len) == 0) maybe_load(s, &u.data);
    msgpack_unpacked_destroy(&u);
    return manta_reply(req, &s->version, sizeof s->version);
}

static int rollout_drain(manta_req *req, void *state, const void *arg, size_t len)
{
    rollout_state *s = state;
    s->draining = 1;
    /* hand back the episodes not yet finished */
    int64_t ids[1024];
    int n = 0;
    for (int k = 0; k < s->n_slots && n < 1024; k++) {
        slot *sl = &s->slots[k];
        if (sl->state == SLOT_GEN || sl->state == SLOT_TOOL) {
            ids[n++] = sl->traj.episode;
            manta_future_free(sl->fut);
            sl->fut = NULL;
            sl->state = SLOT_FREE;
        }
    }
    discover(s);
    if (n && s->ctl) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 2);
        rl_pack_kv_str(&pk, "rollout", manta_self(s->m));
        rl_pack_str(&pk, "episodes");
        msgpack_pack_array(&pk, (size_t)n);
        for (int i = 0; i < n; i++) msgpack_pack_int64(&pk, ids[i]);
        manta_future *f = manta_call_timeout(s->m, s->ctl, "handback", sb.data, sb.size, 30000);
        msgpack_sbuffer_destroy(&sb);
        int rc = manta_get(f, -1, NULL, NULL);
        if (rc) rl_log(s->m, "rollout: handback: %s", manta_future_error(f));
        manta_future_free(f);
        s->handed_back += (uint64_t)n;
    }
    /* scoring and submitting episodes finish: they are already generated */
    int64_t until = rl_now_ms() + 30000;
    while (rl_now_ms() < until) {
        int busy = 0;
        for (int k = 0; k < s->n_slots; k++) busy += s->slots[k].state != SLOT_FREE;
        if (!busy && !s->admit) break;
        manta_poll(s->m, 5);
    }
    rl_log(s->m, "rollout drained: %d episodes handed back", n);
    return manta_reply(req, "ok", 2);
}

static int rollout_stats(manta_req *req, void *state, const void *arg, size_t len)
{
    rollout_state *s = state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 12);
    rl_pack_kv_int(&pk, "version", s->version);
    rl_pack_kv_int(&pk, "episodes", (int64_t)s->episodes);
    rl_pack_kv_int(&pk, "tokens", (int64_t)s->tokens);
    rl_pack_kv_int(&pk, "steps", (int64_t)s->steps);
    rl_pack_kv_int(&pk, "tool_calls", (int64_t)s->tool_calls);
    rl_pack_kv_int(&pk, "tool_errors", (int64_t)s->tool_errors);
    rl_pack_kv_int(&pk, "weight_loads", (int64_t)s->weight_loads);
    rl_pack_kv_int(&pk, "weight_errors", (int64_t)s->weight_errors);
    rl_pack_kv_int(&pk, "submit_errors", (int64_t)s->submit_errors);
    rl_pack_kv_int(&pk, "handed_back", (int64_t)s->handed_back);
    rl_pack_kv_num(&pk, "busy_s", s->busy_s);
    pack_kv_bool(&pk, "draining", s->draining);
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

static const manta_method rollout_methods[] = {
    {"weights", rollout_weights}, {"drain", rollout_drain}, {"stats", rollout_stats}, {NULL, NULL}};

const manta_class rl_rollout_class = {"rollout", sizeof(rollout_state), rollout_init, rollout_fini,
                                      rollout_methods};
