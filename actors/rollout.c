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
 *     checked); the version never goes backwards; a version whose buckets
 *     could not be fetched is skipped for a back-off (load_weights);
 *   - advances every generating slot by one token in one mk_decoder_step;
 *   - parks a slot whose policy closed a tool call and sends the call's text
 *     to an env actor; when the observation comes back it is appended as
 *     given tokens (loss mask 0) and the slot generates again;
 *   - ends an episode at the end of the answer or at the token / turn /
 *     context limit, asks a reward actor for its score, and submits the
 *     trajectory to the controller.
 * Text goes through the policy's rl_text (textio.c): the byte-level task
 * vocabulary (<bos> prompt, <call>...</call>, <eos>), or a tokenizer and chat
 * format (the rendered conversation as prompt; stop strings such as
 * "</tool_call>" and "<|im_end|>" found in the decoded text of the turn; the
 * rendered tool turn as observation). Every sampled id is stored exactly as
 * sampled (never re-tokenised from the text), with its behaviour log-prob and
 * the version that sampled it, so an episode may span versions.
 *
 * Settings (group settings, else sections.rl): slots, temperature,
 * max_new_tokens, max_turns, controller (actor name, default
 * "controller-0"), env_group ("env"), reward_group ("reward"), threads;
 * sections.model for the policy (policy.c: a Hugging Face folder or a fresh
 * GPT-2) and model.context, the KV positions each slot holds: the longest
 * episode. A token the model samples outside the task's vocabulary (a
 * folder's vocabulary may be larger) ends its episode.
 *
 * The admit request and reply are rl_admit_req / rl_admit_reply (msgs.c).
 *
 * "drain": stop asking for work, hand the unfinished episodes back to the
 * controller (it re-admits them elsewhere), wait for submissions in flight,
 * answer. "stats": counters as msgpack.
 */
#include "manta_actors.h"
#include "rl_util.h"
#include "textio.h"

#include <manta_collective.h>
#include <manta_kernels.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SLOT_FREE, SLOT_GEN, SLOT_TOOL, SLOT_SCORE, SLOT_SUBMIT };

typedef struct slot {
    int state;
    rl_traj traj;
    char *reference; /* the admitted episode's, owned */
    int greedy;
    int turns, new_tokens;
    int tool_tries;
    rl_turn turn; /* the policy's current turn: its text, and the call it made */
    manta_future *fut;
} slot;

typedef struct rollout_state {
    manta_ctx *m;
    mk_model *model;
    mk_decoder *dec;
    rl_model_spec ms;
    rl_text *text; /* the policy's text: byte-level, or a tokenizer and chat format */
    int ctx;       /* KV positions per slot (model.context): the longest episode */
    int n_slots, group_size;
    slot *slots;
    float temperature, top_p;
    int max_new_tokens, max_turns;
    char controller[64], env_group[32], reward_group[32];
    manta_actor *ctl;
    manta_actor **envs, **rewards; /* the live ones, growing */
    int n_envs, n_rewards, cap_envs, cap_rewards, rr_env, rr_reward;
    int64_t last_discover, discoveries; /* directory reads */
    int discover_soon;
    int64_t version; /* -1 until the first weights arrive */
    manta_future *admit;
    manta_future *handback; /* the latest handback call */
    manta_req *drain_req;   /* a deferred drain */
    int64_t drain_until_ms;
    int drain_n;
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
        submit_errors, handed_back, admit_calls, foreign_tokens, weight_skips;
    /* device-to-device loads (CUDA IPC: mk_model_write_params_shared) */
    uint64_t weight_ipc_loads, weight_ipc_errors;
    int ipc;       /* 1: try the learners' device copies (rl.weight_sync auto) */
    int ipc_fails; /* in a row; IPC_MAX_FAILS turn it off */
    char weight_sync[16];
    /* the newest version whose load failed (-1: none), and when it may be
     * fetched again (load_weights) */
    int64_t failed_version, retry_at_ms;
    int backoff_ms;
    double busy_s;
} rollout_state;

static void tick(void *arg);
static void drain_check(rollout_state *s);

static int read_settings(rollout_state *s, manta_ctx *m, const void *args, size_t len, int *threads)
{
    rl_args a;
    rl_args_open(&a, args, len);
    rl_model_read(&a, &s->ms);
    s->ctx = s->ms.context;
    s->n_slots = (int)rl_arg_int(&a, "rl", "slots", 32, 1, 1 << 16);
    s->group_size = (int)rl_arg_int(&a, "rl", "group_size", 8, 1, 1 << 16);
    s->temperature = (float)rl_arg_num(&a, "rl", "temperature", 1.0, 0, 1e3);
    s->top_p = (float)rl_arg_num(&a, "rl", "top_p", 1.0, 0, 1);
    s->max_new_tokens = (int)rl_arg_int(&a, "rl", "max_new_tokens", 32, 1, 1 << 20);
    s->max_turns = (int)rl_arg_int(&a, "rl", "max_turns", 2, 0, 1 << 20);
    rl_arg_str(&a, NULL, "controller", s->controller, sizeof s->controller, "controller-0");
    rl_arg_str(&a, NULL, "env_group", s->env_group, sizeof s->env_group, "env");
    rl_arg_str(&a, NULL, "reward_group", s->reward_group, sizeof s->reward_group, "reward");
    *threads = (int)rl_arg_int(&a, NULL, "threads", 1, 0, 4096);
    s->seed = (uint64_t)rl_arg_int(&a, "", "replica", 0, 0, 1 << 20) * 7919 + 17;
    rl_arg_str(&a, "rl", "weight_sync", s->weight_sync, sizeof s->weight_sync, "auto");
    if (strcmp(s->weight_sync, "auto") && strcmp(s->weight_sync, "buckets") && !a.rc)
        rl_arg_error(&a, "rl", "weight_sync", "'%s': expected auto or buckets", s->weight_sync);
    return rl_args_close(&a, m);
}

static int rollout_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    rollout_state *s = state;
    s->m = m;
    int threads, rc = read_settings(s, m, args, len, &threads);
    if (rc) return rc;
    if (s->n_slots < s->group_size) s->n_slots = s->group_size; /* one group must fit */

    mk_set_threads(threads);
    /* On cuda, weights may come device to device from learner shards on other GPUs of this
     * node: this process then sees those GPUs too (after its own, which it computes on), as a
     * process maps only memory of devices it sees.  Before the model, which starts CUDA. */
    if (s->ms.cuda && !strcmp(s->weight_sync, "auto")) {
        const char *own = getenv("CUDA_VISIBLE_DEVICES");
        char was[4200];
        snprintf(was, sizeof was, "%s", own ? own : "");
        int seen = manta_gpu_see_node();
        if (seen < 0)
            rl_log(m,
                   "rollout: cannot see this node's other GPUs (%s): weights from learners "
                   "on them come as buckets",
                   manta_last_error());
        else if (seen > 0 && strcmp(was, getenv("CUDA_VISIBLE_DEVICES")))
            rl_log(m,
                   "rollout: computes on GPU %s and sees this node's others too "
                   "(CUDA_VISIBLE_DEVICES=%s), to copy weights from learners there",
                   was, getenv("CUDA_VISIBLE_DEVICES"));
    }
    /* the model only decodes here: room for one training token is enough */
    unsigned flags = MK_MODEL_INFER | (s->ms.bf16_weights ? MK_MODEL_BF16_WEIGHTS : 0u) |
                     (s->ms.bf16_products ? MK_MODEL_BF16_PRODUCTS : 0u) |
                     (s->ms.bf16_kv ? MK_MODEL_BF16_KV : 0u);
    if ((rc = rl_model_open(&s->ms, 1, 1, flags, &s->model))) {
        rl_log(m, "rollout: %s", rl_last_error());
        return rc;
    }
    if (mk_decoder_new_ctx(&s->dec, s->model, s->n_slots, s->ctx)) {
        rl_log(m, "rollout: decoder of %d slots x %d positions: %s", s->n_slots, s->ctx,
               mk_last_error());
        return rl_fail(MANTA_EINVAL, "decoder of %d slots x %d positions: %s", s->n_slots, s->ctx,
                       mk_last_error());
    }
    s->n_params = mk_model_num_params(s->model);
    s->wbuf = calloc(s->n_params, sizeof(float));
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    size_t n = (size_t)s->n_slots;
    s->stok = calloc(n, sizeof(int32_t)), s->sidx = calloc(n, sizeof(int32_t));
    s->stemp = calloc(n, sizeof(float)), s->stopp = calloc(n, sizeof(float));
    s->slps = calloc(n, sizeof(float)), s->slpp = calloc(n, sizeof(float));
    if (!s->wbuf || !s->slots || !s->stok || !s->sidx || !s->stemp || !s->stopp || !s->slps ||
        !s->slpp) {
        rl_log(m, "rollout: out of memory for %d slots", s->n_slots);
        return MANTA_ENOMEM;
    }
    for (int i = 0; i < s->n_slots; i++) rl_traj_init(&s->slots[i].traj);
    if ((rc = rl_text_new(&s->ms, &s->text))) {
        rl_log(m, "rollout: %s", rl_last_error());
        return rc;
    }
    s->version = -1;
    s->failed_version = -1;
    s->ipc = !strcmp(s->weight_sync, "auto") && mk_model_backend(s->model) != mk_backend_cpu();
    s->timer = manta_timer_add(m, 1, tick, s);
    char what[600];
    rl_log(m, "rollout: %s, %zu params, %d slots x %d positions, text %s (%d ids)",
           rl_model_describe(&s->ms, what, sizeof what), s->n_params, s->n_slots, s->ctx,
           rl_text_kind(s->text), (int)rl_text_vocab(s->text));
    return 0;
}

static void rollout_fini(manta_ctx *m, void *state)
{
    rollout_state *s = state;
    if (s->timer) manta_timer_cancel(m, s->timer);
    manta_future_free(s->admit);
    manta_future_free(s->handback);
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        manta_future_free(s->slots[i].fut);
        rl_traj_destroy(&s->slots[i].traj);
        free(s->slots[i].reference);
        rl_turn_destroy(&s->slots[i].turn);
    }
    rl_text_free(s->text);
    free(s->envs), free(s->rewards);
    mk_decoder_free(s->dec);
    mk_model_free(s->model);
    free(s->slots), free(s->wbuf), free(s->stok), free(s->sidx), free(s->stemp), free(s->stopp);
    free(s->slps), free(s->slpp);
}

/* ---- discovery of env and reward actors ---- */

/* The live actors `group`-0, -1, ... (until a name is missing) into *out. */
static int discover_group(rollout_state *s, const char *group, manta_actor ***out, int *cap)
{
    int n = 0;
    for (int i = 0;; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s-%d", group, i);
        manta_actor *a;
        if (manta_actor_lookup(s->m, name, &a)) break;
        manta_actor_info info;
        if (manta_actor_info_get(s->m, a, &info) == 0 && info.state != MANTA_ACTOR_ALIVE) continue;
        if (n == *cap) {
            int c = *cap ? 2 * *cap : 8;
            manta_actor **v = realloc(*out, (size_t)c * sizeof *v);
            if (!v) {
                rl_log(s->m, "rollout: out of memory listing %s actors; using %d", group, n);
                break;
            }
            *out = v, *cap = c;
        }
        (*out)[n++] = a;
    }
    return n;
}

/* The directory is read at most once per DISCOVER_MS; while a group is
 * empty, or after a failed call asked for a refresh (refresh_discovery), at
 * most once per DISCOVER_RETRY_MS: a group that is gone must not cost a
 * Redis round trip per episode, and one that is back is seen soon. */
#define DISCOVER_MS       1000
#define DISCOVER_RETRY_MS 200

static void refresh_discovery(rollout_state *s)
{
    s->discover_soon = 1;
}

static void discover(rollout_state *s)
{
    int64_t now = rl_now_ms(), since = now - s->last_discover;
    int soon = s->discover_soon || !s->n_envs || !s->n_rewards;
    if (s->discoveries && since < (soon ? DISCOVER_RETRY_MS : DISCOVER_MS)) return;
    s->last_discover = now;
    s->discover_soon = 0;
    s->discoveries++;
    s->n_envs = discover_group(s, s->env_group, &s->envs, &s->cap_envs);
    s->n_rewards = discover_group(s, s->reward_group, &s->rewards, &s->cap_rewards);
    if (!s->ctl) manta_actor_lookup(s->m, s->controller, &s->ctl);
}

/* ---- weights ---- */

/* A version whose buckets cannot be fetched (a learner shard that died
 * after publishing it holds them, and nobody else) would cost a fetch
 * deadline at every admit reply that names it. After a failure the same
 * version is skipped for a back-off (BACKOFF_MIN_MS doubling to
 * BACKOFF_MAX_MS) while the rollout generates with the weights it has; a
 * newer version is fetched at once (a restored shard publishes one). The
 * failure is logged once per version. */
#define FETCH_TIMEOUT_MS 10000
#define BACKOFF_MIN_MS   5000
#define BACKOFF_MAX_MS   60000

/* May `version` be fetched now? Counts the skips. */
static int may_load(rollout_state *s, int64_t version)
{
    if (version != s->failed_version || rl_now_ms() >= s->retry_at_ms) return 1;
    s->weight_skips++;
    return 0;
}

static int load_failed(rollout_state *s, int64_t version, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int load_failed(rollout_state *s, int64_t version, int rc, const char *fmt, ...)
{
    s->weight_errors++;
    int first = version != s->failed_version;
    s->backoff_ms = first                                ? BACKOFF_MIN_MS
                    : 2 * s->backoff_ms < BACKOFF_MAX_MS ? 2 * s->backoff_ms
                                                         : BACKOFF_MAX_MS;
    s->failed_version = version;
    s->retry_at_ms = rl_now_ms() + s->backoff_ms;
    if (first) {
        char why[600];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        rl_log(s->m,
               "rollout: version %lld not loaded: %s; generating with version %lld, fetching it "
               "again in %d s at the earliest (a newer version at once)",
               (long long)version, why, (long long)s->version, s->backoff_ms / 1000);
    }
    return rc;
}

/* Device to device: every bucket's copy in its learner shard's device
 * memory (CUDA IPC), when all of them have one on this machine. 0 when
 * loaded; else an error, and the caller fetches the buckets (which also
 * rewrites whatever a copy overtaken mid-way left: MK_ERR_STATE). After
 * IPC_MAX_FAILS failures in a row (a rollout whose GPU cannot map the
 * learners', say) it is not tried again; a back-end that cannot map at all
 * turns it off at once. Both are said once. */
#define IPC_MAX_FAILS 3
static int load_shared(rollout_state *s, int64_t version, const rl_bucket *b, int nb)
{
    for (int i = 0; i < nb; i++)
        if (!b[i].has_share || strcmp(b[i].share_host, manta_host_id())) return MANTA_ENOTFOUND;
    double t0 = rl_now_s();
    size_t total = 0;
    /* Every share is checked first (opened, holding the bucket's stamp and range), so that one
     * that cannot be read writes none of the parameters; then the copies, which check again. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < nb; i++) {
            size_t so = (size_t)b[i].share_off, off = (size_t)b[i].offset, n = (size_t)b[i].count;
            int rc = pass == 0 ? mk_model_share_check(s->model, b[i].share, so, n, b[i].share_seq)
                               : mk_model_write_params_shared(s->model, b[i].share, so, off, n,
                                                              b[i].share_seq);
            if (rc == MK_OK) {
                total += pass ? n : 0;
                continue;
            }
            s->weight_ipc_errors++;
            int off_for_good = rc == MK_ERR_UNSUPPORTED || ++s->ipc_fails >= IPC_MAX_FAILS;
            if (s->ipc_fails == 1 || off_for_good)
                rl_log(s->m,
                       "rollout: version %lld: the device-to-device %s of bucket %d failed (%s); "
                       "fetching its buckets%s",
                       (long long)version, pass ? "copy" : "check", i, mk_last_error(),
                       off_for_good ? ", and only buckets from now on" : "");
            if (off_for_good) s->ipc = 0;
            return MANTA_EDIED;
        }
    if (total != s->n_params) /* a learner's own mistake: the buckets say the same */
        return MANTA_EPROTO;
    s->ipc_fails = 0;
    if (s->weight_ipc_loads++ == 0)
        rl_log(s->m,
               "rollout: weights device to device from the learners' GPU memory (CUDA IPC): "
               "version %lld, %zu params in %.1f ms",
               (long long)version, total, 1e3 * (rl_now_s() - t0));
    manta_metric_observe(s->m, "weight_sync_seconds", "ipc", rl_now_s() - t0);
    manta_metric_add(s->m, "weight_sync_bytes_total", "ipc", (double)total * sizeof(float));
    return 0;
}

/* Load `version`: from the learners' device copies where they can be
 * mapped (load_shared), else by fetching its buckets; 0, or an error (the
 * old version is kept, the cause logged once per version and counted). */
static int load_weights(rollout_state *s, int64_t version, const rl_bucket *b, int nb)
{
    if (s->ipc && load_shared(s, version, b, nb) == 0) {
        if (s->failed_version >= 0 && s->failed_version <= version) s->failed_version = -1;
        s->version = version;
        s->weight_loads++;
        return 0;
    }
    size_t total = 0, bytes = 0;
    double t0 = rl_now_s();
    for (int i = 0; i < nb; i++) {
        void *data = NULL;
        size_t len = 0;
        int rc = manta_obj_get(s->m, &b[i].id, &data, &len, FETCH_TIMEOUT_MS);
        size_t es = b[i].bf16 ? sizeof(uint16_t) : sizeof(float);
        if (rc || b[i].offset < 0 || (size_t)(b[i].offset + b[i].count) > s->n_params ||
            len != (size_t)b[i].count * es || manta_crc32c(0, data, len) != b[i].crc) {
            free(data);
            return load_failed(s, version, rc ? rc : MANTA_EPROTO, "bucket %s: %s", b[i].id.s,
                               rc ? manta_last_error() : "bad size or checksum");
        }
        if (b[i].bf16) /* rl.bucket_dtype bf16: widened exactly */
            mk_bf16_to_f32_n(s->wbuf + b[i].offset, data, (size_t)b[i].count);
        else
            memcpy(s->wbuf + b[i].offset, data, len);
        bytes += len;
        total += (size_t)b[i].count;
        free(data);
    }
    if (total != s->n_params)
        return load_failed(s, version, MANTA_EPROTO, "its buckets cover %zu of %zu params", total,
                           s->n_params);
    mk_model_write_params(s->model, s->wbuf, 0, s->n_params);
    if (s->failed_version >= 0 && s->failed_version <= version) s->failed_version = -1;
    s->version = version;
    s->weight_loads++;
    manta_metric_observe(s->m, "weight_sync_seconds", "fetch", rl_now_s() - t0);
    manta_metric_add(s->m, "weight_sync_bytes_total", "fetch", (double)bytes);
    return 0;
}

/* ---- episodes ---- */

static void finish(rollout_state *s, int k);

/* Given ids: appended to slot k's trajectory (loss mask 0) and its KV
 * cache. 0, or an error (out of memory; the context is full). */
static int append_given(rollout_state *s, int k, const int32_t *ids, size_t n, int kind)
{
    slot *sl = &s->slots[k];
    for (size_t i = 0; i < n; i++)
        if (rl_traj_push(&sl->traj, ids[i], 0, -1, 0, kind)) return MANTA_ENOMEM;
    return mk_decoder_append(s->dec, k, ids, (int)n) ? MANTA_EINVAL : 0;
}

/* Start an admitted episode in a free slot: the prompt as the policy's text
 * gives it (textio.c: <bos> and the bytes, or the rendered conversation).
 * A prompt that does not fit the context ends at once as an error episode
 * (the controller drops it with that reason) instead of being cut. */
static int start_episode(rollout_state *s, rl_admit_ep *e)
{
    int k = -1;
    for (int i = 0; i < s->n_slots && k < 0; i++)
        if (s->slots[i].state == SLOT_FREE) k = i;
    if (k < 0) return -1; /* no room: the caller hands it back */
    slot *sl = &s->slots[k];
    rl_traj_clear(&sl->traj);
    sl->traj.episode = e->episode;
    sl->traj.group = e->group;
    sl->traj.prompt = e->prompt;
    sl->traj.eval = e->eval;
    snprintf(sl->traj.rollout, sizeof sl->traj.rollout, "%s", manta_self(s->m));
    sl->greedy = sl->traj.eval;
    free(sl->reference);
    sl->reference = e->reference; /* taken over */
    e->reference = NULL;
    sl->turns = sl->new_tokens = 0;
    sl->tool_tries = 0;
    rl_turn_reset(&sl->turn);
    s->episodes++;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = rl_text_prompt(s->text, e->text, &ids, &n);
    if (rc || n + 2 > (size_t)s->ctx) { /* the policy needs room to answer */
        sl->traj.status = RL_EP_ERROR;
        if (rc)
            snprintf(sl->traj.error, sizeof sl->traj.error, "prompt: %s", rl_last_error());
        else
            snprintf(sl->traj.error, sizeof sl->traj.error,
                     "prompt of %zu bytes (%zu tokens) does not fit the context (model.context "
                     "%d)",
                     strlen(e->text), n, s->ctx);
        free(ids);
        sl->state = SLOT_SCORE, sl->fut = NULL; /* submitted as it is by poll_slots */
        return 0;
    }
    mk_decoder_reset(s->dec, k, s->seed++);
    rc = append_given(s, k, ids, n, RL_SEG_PROMPT);
    free(ids);
    if (rc) {
        sl->traj.status = RL_EP_ERROR;
        snprintf(sl->traj.error, sizeof sl->traj.error, "prompt: %s",
                 rc == MANTA_ENOMEM ? "out of memory" : "the decoder refused it");
        sl->state = SLOT_SCORE, sl->fut = NULL;
        return 0;
    }
    sl->state = SLOT_GEN;
    return 0;
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
    rl_text_answer(s->text, &sl->traj, sl->traj.answer, sizeof sl->traj.answer);
    discover(s);
    if (s->n_rewards == 0) {
        sl->traj.status = RL_EP_ERROR;
        snprintf(sl->traj.error, sizeof sl->traj.error, "no reward actor in group '%s'",
                 s->reward_group);
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
    rl_pack_kv_str(&pk, "reference", sl->reference ? sl->reference : "");
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
    msgpack_pack_map(&pk, 3);
    rl_pack_kv_str(&pk, "tool", "");
    rl_pack_kv_str(&pk, "input", sl->turn.call ? sl->turn.call : "");
    rl_pack_kv_str(&pk, "format", rl_text_call_format(s->text));
    manta_actor *e = s->envs[s->rr_env++ % s->n_envs];
    sl->fut = manta_call_timeout(s->m, e, "call", sb.data, sb.size, 30000);
    msgpack_sbuffer_destroy(&sb);
}

/* The env's answer text[n] as given tokens (bytes: the text and '\n'; a
 * chat format: the tool turn it renders); an observation that does not fit
 * the context ends the episode as truncated. */
static void append_observation(rollout_state *s, int k, const char *text, size_t n, int ok)
{
    slot *sl = &s->slots[k];
    s->tool_calls++;
    sl->traj.tool_calls++;
    if (!ok) s->tool_errors++, sl->traj.tool_errors++;
    int32_t *ids = NULL;
    size_t m = 0;
    int rc = rl_text_observation(s->text, text, n, &ids, &m);
    if (rc) { /* text the chat format cannot render: the policy is told so */
        rl_log(s->m, "rollout: observation of episode %lld: %s", (long long)sl->traj.episode,
               rl_last_error());
        static const char bad[] = "error: observation not renderable";
        if (ok) s->tool_errors++, sl->traj.tool_errors++;
        rc = rl_text_observation(s->text, bad, sizeof bad - 1, &ids, &m);
    }
    if (rc || (size_t)mk_decoder_len(s->dec, k) + m >= (size_t)s->ctx ||
        append_given(s, k, ids, m, RL_SEG_TOOL)) {
        free(ids);
        sl->traj.truncated = 1;
        finish(s, k);
        return;
    }
    free(ids);
    rl_turn_reset(&sl->turn); /* the policy's next turn */
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

static void observe_error(rollout_state *s, int k, const char *text)
{
    append_observation(s, k, text, strlen(text), 0);
}

/* A parked tool call: retry on another env when this one failed at the
 * actor level (draining or gone), else append the observation. */
static void poll_tool(rollout_state *s, int k)
{
    slot *sl = &s->slots[k];
    if (!sl->fut) { /* no env actor: the episode is dropped, not taught a fake error */
        sl->traj.status = RL_EP_ERROR;
        snprintf(sl->traj.error, sizeof sl->traj.error, "no env actor in group '%s'", s->env_group);
        sl->state = SLOT_SCORE;
        return;
    }
    if (!manta_future_done(sl->fut)) return;
    /* The slot lets go of the answer first: appending the observation may
     * end the episode, and finish() then parks the reward call in sl->fut. */
    manta_future *f = sl->fut;
    sl->fut = NULL;
    const void *d;
    size_t n;
    int rc = manta_get(f, 0, &d, &n);
    if (rc && sl->tool_tries++ < 4) {
        manta_future_free(f);
        refresh_discovery(s);
        send_tool(s, k);
        return;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    const msgpack_object *oc = NULL;
    if (rc) { /* not the policy's doing: the episode is dropped with the reason */
        sl->traj.status = RL_EP_ERROR;
        snprintf(sl->traj.error, sizeof sl->traj.error, "env unavailable: %s", manta_errname(rc));
        sl->state = SLOT_SCORE;
    } else if (rl_unpack(&u, d, n) == 0 && (oc = rl_mp_get(&u.data, "outcome")) &&
               oc->type == MSGPACK_OBJECT_STR && oc->via.str.size == 9 &&
               !memcmp(oc->via.str.ptr, "transport", 9)) {
        /* the tool server or the network failed after the MCP client's retries: drop */
        const msgpack_object *msg = rl_mp_get(&u.data, "message");
        char why[160];
        rl_mp_str(msg, why, sizeof why, "?");
        sl->traj.status = RL_EP_ERROR;
        snprintf(sl->traj.error, sizeof sl->traj.error, "tool transport: %s", why);
        sl->state = SLOT_SCORE;
    } else if (u.data.type == MSGPACK_OBJECT_MAP) {
        const msgpack_object *t = rl_mp_get(&u.data, "text"), *ok = rl_mp_get(&u.data, "ok");
        if (t && t->type == MSGPACK_OBJECT_STR && ok && ok->type == MSGPACK_OBJECT_BOOLEAN)
            append_observation(s, k, t->via.str.ptr, t->via.str.size, ok->via.boolean);
        else
            observe_error(s, k, "error: bad answer");
    } else {
        observe_error(s, k, "error: bad answer");
    }
    msgpack_unpacked_destroy(&u);
    manta_future_free(f);
}

/* A slot being scored: the reward (or the failure) goes into the
 * trajectory, which is submitted. */
static void poll_score(rollout_state *s, int k)
{
    slot *sl = &s->slots[k];
    if (sl->fut && !manta_future_done(sl->fut)) return;
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
}

static void poll_submit(rollout_state *s, int k)
{
    slot *sl = &s->slots[k];
    if (!manta_future_done(sl->fut)) return;
    if (manta_future_status(sl->fut) != 0) {
        s->submit_errors++;
        rl_log(s->m, "rollout: submit of episode %lld: %s", (long long)sl->traj.episode,
               manta_future_error(sl->fut));
    }
    manta_future_free(sl->fut);
    sl->fut = NULL;
    sl->state = SLOT_FREE;
}

/* Check the futures of parked slots. */
static void poll_slots(rollout_state *s)
{
    for (int k = 0; k < s->n_slots; k++) {
        switch (s->slots[k].state) {
        case SLOT_TOOL:
            poll_tool(s, k);
            break;
        case SLOT_SCORE:
            poll_score(s, k);
            break;
        case SLOT_SUBMIT:
            poll_submit(s, k);
            break;
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
            if (mk_decoder_len(s->dec, k) >= s->ctx) {
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
        int what = rl_text_step(s->text, &sl->turn, tok);
        if (what == RL_TURN_FOREIGN || what < 0) {
            /* An id the task's text gives no meaning: a model whose
             * vocabulary is larger than its tokenizer's (or than the
             * byte-level task's) sampled it. The episode ends before it,
             * truncated; the token is not kept, so the trajectory stays in
             * the vocabulary the codecs and the learner check. (what < 0:
             * out of memory; the episode ends the same way.) */
            if (what == RL_TURN_FOREIGN) s->foreign_tokens++;
            sl->traj.truncated = 1;
            finish(s, k);
            continue;
        }
        /* the id as sampled, never a re-tokenisation of the text */
        rl_traj_push(&sl->traj, tok, lp, (int32_t)s->version, 1, RL_SEG_POLICY);
        sl->new_tokens++;
        s->tokens++;
        manta_metric_add(s->m, "tokens_generated_total", NULL, 1);
        if (what == RL_TURN_END) {
            finish(s, k);
            continue;
        }
        if (what == RL_TURN_CALL) {
            sl->turns++;
            if (sl->turns > s->max_turns) {
                sl->traj.truncated = 1;
                finish(s, k);
                continue;
            }
            sl->state = SLOT_TOOL;
            sl->tool_tries = 0;
            sl->new_tokens = 0; /* rl.max_new_tokens counts per turn */
            send_tool(s, k);
            continue;
        }
        if (sl->new_tokens >= s->max_new_tokens || mk_decoder_len(s->dec, k) >= s->ctx) {
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
    rl_admit_req r = {.groups = groups, .version = s->version};
    snprintf(r.rollout, sizeof r.rollout, "%s", manta_self(s->m));
    char *buf;
    size_t len;
    if (rl_admit_req_encode(&r, &buf, &len)) {
        rl_log(s->m, "rollout: admit: %s", rl_last_error());
        s->next_admit_ms = rl_now_ms() + 200;
        return;
    }
    s->admit = manta_call_timeout(s->m, s->ctl, "admit", buf, len, 30000);
    free(buf);
    s->admit_calls++;
}

/* Tell the controller that episodes ids[n] will not be run here (they are
 * re-admitted elsewhere). The call is kept so that a drain answers only
 * once the controller has them. */
static void hand_back(rollout_state *s, const int64_t *ids, int n)
{
    if (n == 0 || !s->ctl) return;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    rl_pack_kv_str(&pk, "rollout", manta_self(s->m));
    rl_pack_str(&pk, "episodes");
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) msgpack_pack_int64(&pk, ids[i]);
    manta_future_free(s->handback); /* only the latest is waited for: calls are ordered */
    s->handback = manta_call_timeout(s->m, s->ctl, "handback", sb.data, sb.size, 30000);
    msgpack_sbuffer_destroy(&sb);
    s->handed_back += (uint64_t)n;
}

/* The admit reply: a newer version is loaded first, then the episodes
 * start (or go straight back without weights or while draining). */
static int use_admit_reply(rollout_state *s, const void *d, size_t n)
{
    rl_admit_reply r;
    int rc = rl_admit_reply_decode(&r, d, n);
    if (rc) {
        rl_log(s->m, "rollout: %s", rl_last_error());
        return 0;
    }
    if (r.version > s->version && r.has_buckets && may_load(s, r.version))
        load_weights(s, r.version, r.buckets.v, r.buckets.n);
    if (r.stop) s->stopped = 1;
    /* episodes that cannot run here (no weights yet, draining, no free
     * slot) go straight back to the controller */
    int got = 0, back = 0;
    int64_t *ids = r.n_eps ? malloc((size_t)r.n_eps * sizeof *ids) : NULL;
    for (int i = 0; i < r.n_eps; i++) {
        if (s->version >= 0 && !s->draining && start_episode(s, &r.eps[i]) == 0)
            got++;
        else if (ids)
            ids[back++] = r.eps[i].episode;
        else
            rl_log(s->m, "rollout: out of memory: episode %lld neither started nor handed back",
                   (long long)r.eps[i].episode);
    }
    hand_back(s, ids, back);
    free(ids);
    rl_admit_reply_destroy(&r);
    return got;
}

static void take_work(rollout_state *s)
{
    if (!s->admit || !manta_future_done(s->admit)) return;
    const void *d;
    size_t n;
    int got = 0;
    if (manta_get(s->admit, 0, &d, &n) == 0)
        got = use_admit_reply(s, d, n);
    else
        s->ctl = NULL; /* look the controller up again */
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
    drain_check(s);
    /* 0 ms when generating: the loop still serves the mailbox between steps */
    s->timer = manta_timer_add(s->m, n ? 0 : 2, tick, s);
}

/* ---- methods ---- */

/* Drain: stop asking for work and hand back the episodes not yet finished;
 * the answer is deferred until the slots still scoring or submitting are
 * free and the controller has the handed-back episodes (checked by tick),
 * or 30 s have passed. */
static int rollout_drain(manta_req *req, void *state, const void *arg, size_t len)
{
    rollout_state *s = state;
    (void)arg, (void)len;
    if (s->drain_req) return manta_reply_error(req, MANTA_EBUSY, "drain: already draining");
    s->draining = 1;
    int64_t *ids = malloc((size_t)s->n_slots * sizeof *ids);
    if (!ids) return manta_reply_error(req, MANTA_ENOMEM, "drain: out of memory");
    int n = 0;
    for (int k = 0; k < s->n_slots; k++) {
        slot *sl = &s->slots[k];
        if (sl->state == SLOT_GEN || sl->state == SLOT_TOOL) {
            ids[n++] = sl->traj.episode;
            manta_future_free(sl->fut);
            sl->fut = NULL;
            sl->state = SLOT_FREE;
        }
    }
    discover(s);
    hand_back(s, ids, n);
    free(ids);
    s->drain_n = n;
    s->drain_until_ms = rl_now_ms() + 30000;
    s->drain_req = manta_req_defer(req);
    return 0;
}

/* Answer a deferred drain once nothing is left in flight. */
static void drain_check(rollout_state *s)
{
    if (!s->drain_req) return;
    int busy = s->admit != NULL || (s->handback && !manta_future_done(s->handback));
    for (int k = 0; k < s->n_slots && !busy; k++) busy = s->slots[k].state != SLOT_FREE;
    if (busy && rl_now_ms() < s->drain_until_ms) return;
    if (s->handback && manta_future_done(s->handback) && manta_future_status(s->handback))
        rl_log(s->m, "rollout: handback: %s", manta_future_error(s->handback));
    rl_log(s->m, "rollout drained: %d episodes handed back%s", s->drain_n,
           busy ? " (gave up waiting after 30 s)" : "");
    manta_reply(s->drain_req, "ok", 2);
    s->drain_req = NULL;
}

static int rollout_stats(manta_req *req, void *state, const void *arg, size_t len)
{
    rollout_state *s = state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 18);
    rl_pack_kv_int(&pk, "version", s->version);
    rl_pack_kv_int(&pk, "params", (int64_t)s->n_params);
    rl_pack_kv_int(&pk, "discoveries", s->discoveries);
    rl_pack_kv_int(&pk, "episodes", (int64_t)s->episodes);
    rl_pack_kv_int(&pk, "tokens", (int64_t)s->tokens);
    rl_pack_kv_int(&pk, "steps", (int64_t)s->steps);
    rl_pack_kv_int(&pk, "tool_calls", (int64_t)s->tool_calls);
    rl_pack_kv_int(&pk, "tool_errors", (int64_t)s->tool_errors);
    rl_pack_kv_int(&pk, "weight_loads", (int64_t)s->weight_loads);
    rl_pack_kv_int(&pk, "weight_errors", (int64_t)s->weight_errors);
    rl_pack_kv_int(&pk, "weight_skips", (int64_t)s->weight_skips);
    rl_pack_kv_int(&pk, "weight_ipc_loads", (int64_t)s->weight_ipc_loads);
    rl_pack_kv_int(&pk, "weight_ipc_errors", (int64_t)s->weight_ipc_errors);
    rl_pack_kv_int(&pk, "submit_errors", (int64_t)s->submit_errors);
    rl_pack_kv_int(&pk, "handed_back", (int64_t)s->handed_back);
    rl_pack_kv_int(&pk, "foreign_tokens", (int64_t)s->foreign_tokens);
    rl_pack_kv_num(&pk, "busy_s", s->busy_s);
    pack_kv_bool(&pk, "draining", s->draining);
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

static const manta_method rollout_methods[] = {
    {"drain", rollout_drain}, {"stats", rollout_stats}, {NULL, NULL}};

const manta_class rl_rollout_class = {"rollout", sizeof(rollout_state), rollout_init, rollout_fini,
                                      rollout_methods};
