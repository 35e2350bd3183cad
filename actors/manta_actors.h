/*
 * manta_actors.h - the RL actor classes of Manta and the pieces they share.
 *
 * The classes (controller, rollout, env, reward, learner) are const
 * manta_class tables listed in manta_builtin_classes; `manta run SPEC`
 * creates `<group>-<i>` replicas of them with manta_spec_init_payload() as
 * their init arguments. How they work together, the spec sections they read
 * and the trajectory schema are in actors/README.md.
 *
 * Besides the classes this header exposes the pure parts of the RL system,
 * so that tests can check them without processes:
 *   - the byte-level vocabulary (256 bytes and four special tokens);
 *   - rl_traj, one episode's tokens with behaviour log-probs, versions and
 *     loss masks, and its msgpack codec (the documented trajectory schema);
 *   - GRPO group-normalised advantages;
 *   - the bounded-staleness admission and dropping rules;
 *   - the ledger (every admitted episode ends in exactly one bucket);
 *   - the codecs of the admit and step messages and of weight buckets.
 *
 * Errors: functions that can fail return 0 or a negative MANTA_E* code
 * (manta.h); decoders leave a message naming the message and the field at
 * fault in rl_last_error() (rl_util.h).
 *
 * Ownership: rl_traj_* functions work on caller storage (_init/_destroy);
 * decode returns a trajectory the caller destroys. Nothing here is
 * thread-safe and nothing needs to be: every actor is one thread.
 */
#ifndef MANTA_ACTORS_H
#define MANTA_ACTORS_H

#include <manta.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* controller, rollout, env, reward, learner; NULL-terminated. */
extern const manta_class *const manta_builtin_classes[];

extern const manta_class rl_controller_class;
extern const manta_class rl_rollout_class;
extern const manta_class rl_env_class;
extern const manta_class rl_reward_class;
extern const manta_class rl_learner_class;

/* The tool errors of every live env actor (`group`-0, -1, ...: each asked
 * for its "stats", waiting up to timeout_ms each), merged by kind:
 * {KIND: {outcome, count, first: [message...]}} (mcp_errors_json), {} when
 * none. NULL when out of memory. The caller owns it. For run summaries;
 * blocks, so call it where the controller may wait (the end of a run). */
struct cJSON;
struct cJSON *rl_env_errors_json(manta_ctx *m, const char *group, int timeout_ms);

/* ---- vocabulary ----------------------------------------------------------- *
 * Token ids 0..255 are bytes; four specials follow. A tool call is
 * RL_TOK_CALL <argument bytes> RL_TOK_END in the policy's output; the
 * observation that the env returns is appended as given bytes (loss mask 0)
 * followed by '\n'. An episode ends at RL_TOK_EOS. A policy with its own
 * tokenizer (spec model.tokenizer; actors/textio.c) uses that tokenizer's
 * ids and chat format instead: the decoders below then take its size as
 * the bound (rl_traj_decode_vocab, rl_step_req_decode_vocab). */
#define RL_TOK_BOS  256
#define RL_TOK_EOS  257
#define RL_TOK_CALL 258
#define RL_TOK_END  259
#define RL_VOCAB    260

/* ---- trajectories ----------------------------------------------------------- */

enum { RL_SEG_PROMPT = 0, RL_SEG_POLICY = 1, RL_SEG_TOOL = 2 };

/* How an episode ended. OK episodes are trainable; the others are dropped
 * with the status as the ledger's reason. */
enum { RL_EP_OK = 0, RL_EP_ERROR = 1 };

typedef struct rl_traj {
    int64_t episode; /* controller-wide id */
    int64_t group;   /* GRPO group id: the G episodes of one prompt share it */
    int32_t prompt;  /* index of the prompt in its dataset */
    int eval;        /* 1: held-out evaluation episode (greedy, never trained) */
    int n, cap;      /* tokens */
    int32_t *tok;    /* token ids */
    float *logp;     /* behaviour log-prob of a sampled token; 0 for given ones */
    int32_t *ver;    /* policy version that sampled the token; -1 for given ones */
    uint8_t *mask;   /* 1: sampled by the policy (trained on), 0: prompt/observation */
    int n_seg, seg_cap;
    int32_t *seg_start; /* first token of each segment (turn) */
    uint8_t *seg_kind;  /* RL_SEG_* */
    float reward;
    int status; /* RL_EP_* */
    int tool_calls, tool_errors;
    int truncated; /* hit the token or turn limit */
    char answer[128];
    char error[128];
    char rollout[64]; /* actor that generated it */
} rl_traj;

void rl_traj_init(rl_traj *t);
void rl_traj_destroy(rl_traj *t);
/* Reset to zero tokens and segments, keeping the storage. */
void rl_traj_clear(rl_traj *t);
/* Append one token; a new segment starts when kind differs from the last
 * one. ver -1 and logp 0 for given tokens. 0 or MANTA_ENOMEM. */
int rl_traj_push(rl_traj *t, int32_t tok, float logp, int32_t ver, uint8_t mask, int kind);
/* Oldest policy version among sampled tokens, or -1 when none. */
int32_t rl_traj_min_version(const rl_traj *t);
int32_t rl_traj_max_version(const rl_traj *t);
int rl_traj_trained_tokens(const rl_traj *t);
/* The text of the final policy segment without special tokens, trimmed:
 * what the reward rules compare with the reference. */
void rl_traj_final_text(const rl_traj *t, char *out, size_t cap);

/* Encode to msgpack (see README.md, "Trajectory schema"); *out malloc'd,
 * caller frees. 0 or MANTA_ENOMEM. */
int rl_traj_encode(const rl_traj *t, char **out, size_t *len);
/* Decode into an initialised t (its previous contents are replaced).
 * 0, or MANTA_EINVAL on a malformed buffer (t is left valid and empty),
 * MANTA_ENOMEM. */
int rl_traj_decode(rl_traj *t, const void *buf, size_t len);
/* The same with token ids checked against [0, vocab) instead of the
 * byte-level RL_VOCAB: a policy with its own tokenizer (model.tokenizer). */
int rl_traj_decode_vocab(rl_traj *t, const void *buf, size_t len, int32_t vocab);

/* The tokens as readable text: specials as <bos> <eos> <call> </call>,
 * '\n' as \n, other bytes outside ASCII as \xHH, ids of a tokenizer's
 * larger vocabulary (RL_VOCAB and up) as <id>. */
void rl_traj_render(const rl_traj *t, char *out, size_t cap);

/* Bytes of text as tokens (one per byte) into out[cap]; returns the count. */
int rl_tokenize(const char *text, int32_t *out, int cap);

/* ---- GRPO advantages ---------------------------------------------------------- */

/* For one group of n rewards: A_i = (r_i - mean) / (std + eps), std the
 * population standard deviation. A group whose rewards are all equal (std <
 * 1e-6) has no signal: every A_i = 0 and the function returns 0; otherwise 1. */
int rl_group_advantages(const float *rewards, int n, float eps, float *adv);

/* Dynamic sampling (DAPO): 1 when a group of n rewards carries a learning
 * signal (not all equal, n >= 2), 0 when it does not; such a group is
 * dropped ("no_signal") rather than trained on. */
int rl_group_has_signal(const float *rewards, int n);

/* ---- warm-up ---------------------------------------------------------------------- */

/* When the supervised warm-up on the demonstrations stops. `fixed` steps
 * (rl.warmup_steps; -1 when not given) are run exactly; otherwise steps run
 * until the demonstrations are reproduced: demo loss <= until_loss and/or
 * reproduced fraction >= until_success (each < 0 when not set; both set:
 * both), at most max_steps (with no threshold, exactly max_steps). No
 * warm-up: fixed 0, or fixed -1 and max_steps 0. */
typedef struct rl_warmup {
    int fixed;
    int max_steps;
    double until_loss, until_success;
} rl_warmup;

enum { RL_WARMUP_GO = 0, RL_WARMUP_MET, RL_WARMUP_LIMIT };

/* After `steps` steps, the last of which measured `loss` and `reproduced`
 * on the demonstrations before its update: RL_WARMUP_GO (take another),
 * RL_WARMUP_MET (the thresholds hold; with no threshold, the fixed count is
 * done) or RL_WARMUP_LIMIT (max_steps reached with a threshold not met). */
int rl_warmup_check(const rl_warmup *w, int steps, double loss, double reproduced);

/* ---- bounded staleness ------------------------------------------------------------- */

/* May `n` more episodes be admitted? With `admitted` episodes already
 * counted, learner version v, batch size b (episodes) and bound eta:
 * admitted + n <= (v + eta + 1) * b. */
int rl_admit_ok(int64_t admitted, int64_t n, int64_t v, int64_t eta, int64_t b);
/* Is a trajectory whose oldest sampled token has version min_ver too stale
 * to train on at learner version v? v - min_ver > eta. A trajectory with no
 * sampled token (min_ver < 0) is never stale. */
int rl_is_stale(int32_t min_ver, int64_t v, int64_t eta);

/* ---- the ledger ------------------------------------------------------------------- */

/* Every admitted training episode ends in exactly one of these. */
typedef struct rl_ledger {
    int64_t admitted;
    int64_t trained;
    int64_t dropped_stale;
    int64_t dropped_error;
    int64_t in_flight;   /* admitted and not yet in one of the three above */
    int64_t handed_back; /* re-queued by a draining rollout (re-admitted later, counted once) */
} rl_ledger;

/* 1 when admitted == trained + dropped_stale + dropped_error + in_flight. */
int rl_ledger_ok(const rl_ledger *l);

/* ---- reward rules ---------------------------------------------------------------- */

/* "exact": 1 when answer equals reference; "numeric": 1 when both parse as
 * numbers within tol * max(1, |reference|). 0 otherwise. */
float rl_reward_rule(const char *rule, double tol, const char *answer, const char *reference);

/* ---- messages (msgs.c; README.md "Methods") ------------------------------------------ *
 * Each message has one encoder (*out malloc'd, the caller frees; 0 or
 * MANTA_ENOMEM) and one decoder over untrusted bytes (0, or MANTA_EINVAL
 * with the message and field named in rl_last_error(); the output is then
 * empty). A decoded message owns its arrays and strings and is freed with
 * its _destroy; one filled by hand for encoding only borrows them (do not
 * _destroy it). */

/* A weight bucket: parameters [offset, offset + count) of the flat vector,
 * stored as object `id`, with the CRC32C of its bytes. When the learner
 * shard also keeps them in device memory that other processes of its
 * machine can map (has_share: CUDA IPC, mk_share), the bucket names that
 * copy too: the share's handle, the machine (manta_host_id), the share's
 * publication number (its stamp: seq) and where the bucket starts in it
 * (share_off, in floats). */
#define RL_SHARE_BYTES 64 /* MK_SHARE_HANDLE_BYTES */
typedef struct rl_bucket {
    manta_obj_id id;
    int64_t offset, count;
    uint32_t crc;
    int bf16; /* the object holds count bfloat16s (rl.bucket_dtype bf16), else count floats */
    int has_share;
    unsigned char share[RL_SHARE_BYTES];
    char share_host[160];
    int64_t share_seq, share_off;
} rl_bucket;

/* A growing list of buckets (one version's weights). */
typedef struct rl_buckets {
    rl_bucket *v;
    int n, cap;
} rl_buckets;
void rl_buckets_destroy(rl_buckets *b);
int rl_buckets_push(rl_buckets *b, const rl_bucket *x); /* 0 or MANTA_ENOMEM */
int rl_buckets_append(rl_buckets *dst, const rl_buckets *src);

/* rollout -> controller "admit": room for `groups` GRPO groups; the
 * caller's policy version (-1: none yet). */
typedef struct rl_admit_req {
    char rollout[64];
    int64_t groups;
    int64_t version;
} rl_admit_req;
int rl_admit_req_encode(const rl_admit_req *r, char **out, size_t *len);
int rl_admit_req_decode(rl_admit_req *r, const void *buf, size_t len);

/* One admitted episode: its prompt text and the reference answer. */
typedef struct rl_admit_ep {
    int64_t episode, group; /* group -1: evaluation */
    int32_t prompt;
    int eval;
    char *text, *reference;
} rl_admit_ep;

/* The controller's answer: the current version, its buckets when the caller
 * is behind (has_buckets), stop (the run is over), episodes. */
typedef struct rl_admit_reply {
    int64_t version;
    int stop;
    int has_buckets;
    rl_buckets buckets;
    rl_admit_ep *eps;
    int n_eps;
} rl_admit_reply;
int rl_admit_reply_encode(const rl_admit_reply *r, char **out, size_t *len);
int rl_admit_reply_decode(rl_admit_reply *r, const void *buf, size_t len);
void rl_admit_reply_destroy(rl_admit_reply *r);

/* controller -> learner "step": one shard's sequences. logp NULL (sent as
 * an empty column) for the supervised warm-up. Decoding checks equal column
 * lengths and token ids in the vocabulary. */
enum { RL_STEP_PPO = 0, RL_STEP_SFT = 1 };
typedef struct rl_step_item {
    int n;
    const int32_t *tok;
    const float *logp;
    const uint8_t *mask;
    float adv;
} rl_step_item;
typedef struct rl_step_req {
    int mode; /* RL_STEP_* */
    int64_t version;
    double lr;
    rl_step_item *items;
    int n_items;
} rl_step_req;
int rl_step_req_encode(const rl_step_req *r, char **out, size_t *len);
int rl_step_req_decode(rl_step_req *r, const void *buf, size_t len);
/* The same with token ids checked against [0, vocab) (RL_VOCAB above). */
int rl_step_req_decode_vocab(rl_step_req *r, const void *buf, size_t len, int32_t vocab);
void rl_step_req_destroy(rl_step_req *r);

/* A shard's answer to "step" (and to "publish", with zero statistics): its
 * slice as buckets and the step's statistics over the whole batch. */
typedef struct rl_step_reply {
    int64_t version;
    rl_buckets buckets;
    double loss, pg_loss, kl, clip_frac, entropy, ratio, tokens, grad_norm, busy_s;
    /* warm-up (RL_STEP_SFT) only: the fraction of the batch's sequences that
     * greedy decoding reproduces, measured before the update (every loss
     * token has probability > 1/2 under teacher forcing); 0 for RL steps */
    double reproduced;
} rl_step_reply;
int rl_step_reply_encode(const rl_step_reply *r, char **out, size_t *len);
int rl_step_reply_decode(rl_step_reply *r, const void *buf, size_t len);
void rl_step_reply_destroy(rl_step_reply *r);

#ifdef __cplusplus
}
#endif
#endif
