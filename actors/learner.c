/*
 * learner.c - a learner shard: one of S processes that train the policy
 * together, ZeRO style.
 *
 * Every shard holds the whole model for its forward and backward pass but
 * owns only a slice of the flat parameter vector (manta_coll_slice) and the
 * AdamW moments of that slice. One training step, method "step", called on
 * every shard at once by the controller with that shard's share of the batch:
 *
 *   1. forward + loss (mk_loss_ppo for RL, mk_loss_ce for the warm-up) +
 *      backward on the local sequences;
 *   2. all-reduce of the token counts and statistics, so each shard scales
 *      its gradient by its share of the tokens (the result is the mean over
 *      every token of the batch, whatever the split);
 *   3. reduce-scatter of the gradients: each shard gets the sum for its slice;
 *   4. all-reduce of the slices' squared norms: the global norm, for clipping;
 *   5. AdamW on the owned slice (weight decay on matrices only), with the
 *      model's own moments, which cover that slice only (ZeRO stage 1:
 *      mk_model_shard_moments);
 *   6. all-gather of the parameters into the local model;
 *   7. the owned slice is published as weight buckets of at most
 *      rl.bucket_mb MiB each (manta_put, served zero-copy by this process),
 *      each with its CRC32C; the reply lists them.
 *
 * The collectives are the runtime's (manta_collective.h). The group "learn"
 * (ZeroMQ) is joined on the first step, when every shard is in the call; it
 * sums the statistics and norms (host floats). Steps 3-6 run on the model's
 * own memory (mk_model_grads, mk_model_params and the slice ops of
 * manta_kernels.h), never copied:
 *   - CPU model: over "learn" itself;
 *   - CUDA model, rl.collective nccl (auto's choice with 2 or more shards
 *     and libmanta_nccl.so): over a second group, "learn.nccl", the NCCL
 *     back-end on device memory (mk_model_sync before each of its calls:
 *     NCCL works on a stream of its own);
 *   - CUDA model, rl.collective host: staged through host copies (the
 *     gradients down, the slice up; the slice down, every parameter up) and
 *     summed over "learn".
 * The buckets of the last 8 versions stay alive; older ones are released.
 *
 * The step argument and reply are rl_step_req and rl_step_reply (msgs.c):
 * {mode: "ppo"|"sft", version, lr, items: [{tok, logp, mask, adv}]} and
 * {version, buckets: [{id, offset, count, crc[, dtype: "bf16"]}], loss, pg_loss, kl,
 * clip_frac, entropy, ratio, tokens, grad_norm, busy_s, reproduced}; a
 * warm-up step also reports the fraction of its sequences that greedy
 * decoding reproduces (the warm-up's `until_success`).
 *
 * The model is section model's (policy.c): loaded from a Hugging Face folder
 * or a fresh GPT-2, with activations for model.max_seq tokens a sequence.
 * "save DIR" writes it as a folder of its family in the source folder's
 * dtype (F32 for a fresh model).
 *
 * Checkpoints (the controller's rl.checkpoint_every): "checkpoint DIR"
 * writes DIR/learner-RANK.state, this shard's AdamW moments and step count
 * (and, when the model's dtype is not F32, its F32 slice of the parameters,
 * which the folder's rounding would lose), fsynced; shard 0 also writes the
 * weights as DIR/model, the same Hugging Face folder as "save". "restore
 * DIR" reads them back: the whole parameter vector (DIR/model, or the
 * state files' slices) and this shard's slice of the moments from whichever
 * state files cover it, so a checkpoint of S shards restores onto any
 * number. A restarted shard (incarnation > 1: its parameters are the seed's,
 * its moments zero) refuses "step" and "publish" until it is restored, so a
 * lost shard can never rejoin the group with a model of its own.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <manta_collective.h>
#include <manta_kernels.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEEP_VERSIONS 8
#define SHARES        2 /* device copies of the slice, used in turn (CUDA IPC) */

typedef struct learner_state {
    manta_ctx *m;
    mk_model *model;
    rl_model_spec ms;
    int max_batch, block;
    int micro; /* sequences per forward/backward (rl.micro_batch; max_batch when 0) */
    int rank, world;
    size_t n_params, off, len;
    float *slice;   /* host: the owned slice, as published and checkpointed */
    float *params;  /* full vector, host: staging only (rl.collective host on CUDA), else NULL */
    float *grads;   /* full vector, host: staging only, else one float */
    float *am, *av; /* host copies of the slice's AdamW moments, for checkpoints */
    mk_adamw_params opt;
    mk_ppo_params ppo;
    int t;
    manta_coll_group *coll;         /* "learn": statistics, norms (and tensors unless ncoll) */
    manta_coll_group *ncoll;        /* "learn.nccl": tensors on the devices, or NULL */
    const manta_coll_backend *nccl; /* rl.collective's NCCL back-end, or NULL */
    int nccl_asked;                 /* rl.collective is nccl (not auto) */
    int staged;                     /* tensors through host copies (CUDA, no NCCL) */
    size_t bucket_elems;            /* values per bucket */
    int bucket_bf16;                /* rl.bucket_dtype bf16: buckets of bfloat16s */
    uint16_t *slice16;              /* host: the slice rounded to bfloat16 (bucket_bf16) */
    mk_share *shares[SHARES]; /* the slice in device memory for rollouts (CUDA IPC), or NULL */
    int64_t share_seq;        /* publications into the shares (the stamp of the newest) */
    char weight_sync[16];     /* rl.weight_sync: auto or buckets */
    rl_buckets *pubs;         /* the buckets of the last KEEP_VERSIONS versions, a ring */
    int pub_next;
    int32_t *x, *y;
    float *blp, *adv, *mask;
    int coll_timeout_ms;  /* rl.collective_timeout_s */
    int incarnation;      /* of this process (1: the first) */
    int needs_restore;    /* a restarted shard: no step until "restore" */
    char run_dir[512];    /* rl.run_dir: save, checkpoint and restore stay inside it */
    char resume_dir[512]; /* rl.resume when it names a folder: restore may read it too */
} learner_state;

/* The settings (README.md "Spec sections read"); 0 or MANTA_EINVAL. */
static int read_settings(learner_state *s, manta_ctx *m, const void *args, size_t len, int *threads,
                         double *bucket_mb, char *collective, size_t cap)
{
    rl_args a;
    rl_args_open(&a, args, len);
    s->rank = (int)rl_arg_int(&a, "", "replica", 0, 0, 1 << 20);
    s->world = (int)rl_arg_int(&a, "", "replicas", 1, 1, 1 << 20);
    rl_model_read(&a, &s->ms);
    int64_t batch = rl_arg_int(&a, "rl", "batch_episodes", 64, 1, 1 << 24);
    int64_t demos = rl_arg_int(&a, "rl", "warmup_batch", 64, 1, 1 << 24);
    if (demos > batch) batch = demos;
    s->max_batch = (int)((batch + s->world - 1) / s->world);
    s->micro = (int)rl_arg_int(&a, "rl", "micro_batch", 0, 0, 1 << 24);
    if (s->micro == 0 || s->micro > s->max_batch) s->micro = s->max_batch;
    s->opt.lr = (float)rl_arg_num(&a, "rl", "lr", 1e-3, 0, 1e3);
    s->opt.beta1 = (float)rl_arg_num(&a, "rl", "beta1", 0.9, 0, 1);
    s->opt.beta2 = (float)rl_arg_num(&a, "rl", "beta2", 0.99, 0, 1);
    s->opt.eps = 1e-8f;
    s->opt.weight_decay = (float)rl_arg_num(&a, "rl", "weight_decay", 0.0, 0, 1e3);
    s->opt.grad_clip = (float)rl_arg_num(&a, "rl", "grad_clip", 1.0, 0, 1e9);
    s->ppo.clip_low = (float)rl_arg_num(&a, "rl", "clip_low", 0.2, 0, 1);
    s->ppo.clip_high = (float)rl_arg_num(&a, "rl", "clip_high", 0.28, 0, 1e3);
    s->ppo.ratio_cap = (float)rl_arg_num(&a, "rl", "ratio_cap", 3.0, 0, 1e9);
    s->ppo.entropy_coef = (float)rl_arg_num(&a, "rl", "entropy_coef", 0.0, -1e3, 1e3);
    *threads = (int)rl_arg_int(&a, NULL, "threads", 1, 0, 4096);
    *bucket_mb = rl_arg_num(&a, "rl", "bucket_mb", 4.0, 1e-3, 1 << 20);
    s->coll_timeout_ms = (int)(1000 * rl_arg_num(&a, "rl", "collective_timeout_s", 60, 0.1, 86400));
    rl_arg_str(&a, "rl", "collective", collective, cap, "auto");
    if (strcmp(collective, "auto") && strcmp(collective, "host") && strcmp(collective, "nccl") &&
        !a.rc)
        rl_arg_error(&a, "rl", "collective", "'%s': expected auto, host or nccl", collective);
    rl_arg_str(&a, "rl", "weight_sync", s->weight_sync, sizeof s->weight_sync, "auto");
    if (strcmp(s->weight_sync, "auto") && strcmp(s->weight_sync, "buckets") && !a.rc)
        rl_arg_error(&a, "rl", "weight_sync", "'%s': expected auto or buckets", s->weight_sync);
    char dtype[8];
    rl_arg_str(&a, "rl", "bucket_dtype", dtype, sizeof dtype, "f32");
    if (strcmp(dtype, "f32") && strcmp(dtype, "bf16") && !a.rc)
        rl_arg_error(&a, "rl", "bucket_dtype", "'%s': expected f32 or bf16", dtype);
    s->bucket_bf16 = !strcmp(dtype, "bf16");
    rl_run_dir_read(&a, s->run_dir, sizeof s->run_dir);
    const msgpack_object *resume = rl_arg_get(&a, "rl", "resume");
    if (resume && resume->type == MSGPACK_OBJECT_STR)
        rl_mp_str(resume, s->resume_dir, sizeof s->resume_dir, "");
    if (!a.rc && s->rank >= s->world)
        rl_arg_error(&a, "", "replica", "%d is not below replicas (%d)", s->rank, s->world);
    return rl_args_close(&a, m);
}

/* rl.collective: where the tensors of steps 3-6 are summed (the file's header). */
static int choose_collective(learner_state *s, const char *how)
{
    int cuda = mk_model_backend(s->model) != mk_backend_cpu();
    s->nccl_asked = !strcmp(how, "nccl");
    int want = s->nccl_asked || (!strcmp(how, "auto") && cuda && s->world > 1);
    if (want && !cuda)
        return rl_fail(MANTA_EINVAL, "rl.collective is nccl, but model.device is not cuda");
    if (want && !(s->nccl = rl_nccl_backend())) {
        if (strcmp(how, "auto")) return MANTA_EINVAL; /* asked for: the reason is the error */
        rl_log(s->m, "learner %d: rl.collective auto: host, as %s", s->rank, rl_last_error());
    }
    s->staged = cuda && !s->nccl;
    return 0;
}

/* ---- weights for rollouts on this machine's GPUs ----
 *
 * With the model on cuda and rl.weight_sync auto, the shard also keeps its
 * published slice in device memory that rollouts on this machine map (CUDA
 * IPC: mk_share): SHARES copies used in turn, each stamped with its
 * publication number. A rollout copies from the newest one device to
 * device and checks the stamp before and after (a copy overtaken by two
 * more publications is detected, and the rollout falls back to the
 * buckets, which are published as before, for rollouts elsewhere). */

static void free_shares(learner_state *s)
{
    for (int i = 0; i < SHARES; i++) mk_share_free(s->shares[i]), s->shares[i] = NULL;
}

static void open_shares(learner_state *s)
{
    if (strcmp(s->weight_sync, "auto") || mk_model_backend(s->model) == mk_backend_cpu()) return;
    for (int i = 0; i < SHARES; i++)
        if (mk_share_new(s->model, s->len, &s->shares[i]) != MK_OK) {
            rl_log(s->m,
                   "learner %d: rl.weight_sync auto: buckets only, as the slice cannot be "
                   "shared with rollouts on this machine: %s",
                   s->rank, mk_last_error());
            free_shares(s);
            return;
        }
    rl_log(s->m,
           "learner %d: weights to rollouts: device to device for rollouts on cuda on this "
           "machine (CUDA IPC, %d copies of the slice, %.1f MiB each), buckets for the others",
           s->rank, SHARES, (double)s->len * sizeof(float) / (1 << 20));
}

_Static_assert(RL_SHARE_BYTES == MK_SHARE_HANDLE_BYTES, "a share's handle fits a bucket's");

/* Copy the slice into the next share and name it in the buckets of pub. */
static void fill_share(learner_state *s, rl_buckets *pub)
{
    if (!s->shares[0]) return;
    int64_t seq = s->share_seq + 1;
    mk_share *sh = s->shares[seq % SHARES];
    if (mk_share_fill(sh, s->model, s->off, s->len, seq) != MK_OK) {
        rl_log(s->m, "learner %d: weights to rollouts: buckets only from now on: %s", s->rank,
               mk_last_error());
        free_shares(s);
        return;
    }
    s->share_seq = seq;
    unsigned char handle[MK_SHARE_HANDLE_BYTES];
    mk_share_handle(sh, handle);
    for (int i = 0; i < pub->n; i++) {
        rl_bucket *b = &pub->v[i];
        b->has_share = 1;
        memcpy(b->share, handle, RL_SHARE_BYTES);
        snprintf(b->share_host, sizeof b->share_host, "%s", manta_host_id());
        b->share_seq = seq;
        b->share_off = b->offset - (int64_t)s->off;
    }
}

static int learner_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    learner_state *s = state;
    s->m = m;
    int threads;
    double bucket_mb;
    char collective[16];
    int rc = read_settings(s, m, args, len, &threads, &bucket_mb, collective, sizeof collective);
    if (rc) return rc;
    mk_set_threads(threads);
    s->bucket_elems =
        (size_t)(bucket_mb * (1 << 20) / (s->bucket_bf16 ? sizeof(uint16_t) : sizeof(float)));
    if (s->bucket_elems < 1024) s->bucket_elems = 1024; /* tiny buckets only cost round trips */
    s->block = s->ms.max_seq;
    unsigned flags = s->ms.bf16_train ? MK_MODEL_BF16_TRAIN : 0u;
    if ((rc = rl_model_open(&s->ms, s->micro, s->block, flags, &s->model))) {
        rl_log(m, "learner: %s", rl_last_error());
        return rc;
    }
    if ((rc = choose_collective(s, collective))) {
        rl_log(m, "learner: %s", rl_last_error());
        return rc;
    }
    s->n_params = mk_model_num_params(s->model);
    manta_coll_slice(s->n_params, s->world, s->rank, &s->off, &s->len);
    if (mk_model_shard_moments(s->model, s->off, s->len) != MK_OK) { /* ZeRO stage 1 */
        rl_log(m, "learner: moments of the slice: %s", mk_last_error());
        return MANTA_ENOMEM;
    }
    size_t bt = (size_t)s->max_batch * s->block;
    s->slice = calloc(s->len + 1, sizeof(float));
    s->slice16 = s->bucket_bf16 ? calloc(s->len + 1, sizeof(uint16_t)) : NULL;
    s->params = s->staged ? calloc(s->n_params, sizeof(float)) : NULL;
    s->grads = calloc(s->staged ? s->n_params : 1, sizeof(float));
    s->am = calloc(s->len + 1, sizeof(float));
    s->av = calloc(s->len + 1, sizeof(float));
    s->x = calloc(bt, sizeof(int32_t)), s->y = calloc(bt, sizeof(int32_t));
    s->blp = calloc(bt, sizeof(float)), s->adv = calloc(bt, sizeof(float));
    s->mask = calloc(bt, sizeof(float));
    s->pubs = calloc(KEEP_VERSIONS, sizeof *s->pubs);
    if (!s->pubs || !s->slice || (s->bucket_bf16 && !s->slice16) || (s->staged && !s->params) ||
        !s->grads || !s->am || !s->av || !s->x || !s->y || !s->blp || !s->adv || !s->mask) {
        rl_log(m, "learner: out of memory for %zu parameters", s->n_params);
        return MANTA_ENOMEM;
    }
    open_shares(s);
    const char *inc = getenv("MANTA_INCARNATION"); /* set by the node agent, as log.c reads it */
    s->incarnation = inc ? atoi(inc) : 1;
    s->needs_restore = s->incarnation > 1;
    if (s->needs_restore)
        rl_log(m,
               "learner %d: restarted (incarnation %d): parameters from the seed and AdamW "
               "state lost; steps are refused until the controller restores a checkpoint",
               s->rank, s->incarnation);
    char what[600];
    rl_log(m,
           "learner %d/%d: %s, %zu params, slice [%zu, %zu), batch %d x %d in micro-batches of "
           "%d%s, checkpoints %s, weight buckets of %s, collective %s",
           s->rank, s->world, rl_model_describe(&s->ms, what, sizeof what), s->n_params, s->off,
           s->off + s->len, s->max_batch, s->block, s->micro,
           s->ms.bf16_train ? ", mixed precision (bfloat16 weights, products and product inputs)"
                            : "",
           rl_dtype_name(s->ms.dtype), s->bucket_bf16 ? "bfloat16s" : "floats",
           !s->nccl        ? (s->staged ? "host (gradients and parameters staged through host "
                                          "memory)"
                                        : "host")
           : s->nccl_asked ? "nccl (gradients and parameters on the devices)"
                           : "nccl (gradients and parameters on the devices) if each shard has "
                             "a GPU of its own, checked at the first step; host otherwise");
    return 0;
}

/* Leave both groups (after a failed collective, a restore, or at the end). */
static void leave_groups(learner_state *s)
{
    manta_coll_free(s->ncoll);
    manta_coll_free(s->coll);
    s->ncoll = s->coll = NULL;
}

static void release_version(manta_ctx *m, rl_buckets *b)
{
    for (int i = 0; i < b->n; i++) manta_obj_release(m, &b->v[i].id);
    b->n = 0;
}

static void learner_fini(manta_ctx *m, void *state)
{
    learner_state *s = state;
    for (int v = 0; s->pubs && v < KEEP_VERSIONS; v++) {
        release_version(m, &s->pubs[v]);
        rl_buckets_destroy(&s->pubs[v]);
    }
    free(s->pubs);
    free_shares(s);
    leave_groups(s);
    mk_model_free(s->model);
    free(s->slice), free(s->slice16), free(s->params), free(s->grads), free(s->am), free(s->av);
    free(s->x), free(s->y), free(s->blp), free(s->adv), free(s->mask);
}

/* Publish the owned slice as buckets of bucket_elems values (floats, or
 * bfloat16s with rl.bucket_dtype bf16) into *out (borrowed from the ring,
 * which keeps the last KEEP_VERSIONS versions). */
static int publish(learner_state *s, const rl_buckets **out)
{
    int rc = mk_model_read_params(s->model, s->slice, s->off, s->len);
    if (rc) return rl_fail(MANTA_EINVAL, "kernels: %s", mk_last_error());
    if (s->bucket_bf16) mk_f32_to_bf16_n(s->slice16, s->slice, s->len);
    size_t es = s->bucket_bf16 ? sizeof(uint16_t) : sizeof(float);
    rl_buckets *pub = &s->pubs[s->pub_next];
    release_version(s->m, pub);
    s->pub_next = (s->pub_next + 1) % KEEP_VERSIONS;
    size_t o = 0;
    do { /* an empty slice still publishes one empty bucket */
        size_t n = s->len - o < s->bucket_elems ? s->len - o : s->bucket_elems;
        const void *p =
            s->bucket_bf16 ? (const void *)(s->slice16 + o) : (const void *)(s->slice + o);
        rl_bucket b = {
            .offset = (int64_t)(s->off + o), .count = (int64_t)n, .bf16 = s->bucket_bf16};
        rc = manta_put(s->m, n ? p : "", n * es, &b.id);
        if (rc) return rc;
        b.crc = manta_crc32c(0, p, n * es);
        if ((rc = rl_buckets_push(pub, &b))) {
            manta_obj_release(s->m, &b.id);
            return rc;
        }
        o += n;
    } while (o < s->len);
    fill_share(s, pub);
    *out = pub;
    return 0;
}

#define DEVICE_ID 128 /* bytes of a shard's device name: HOST/CUDA_VISIBLE_DEVICES */

/* NCCL takes one GPU per rank: every shard's device name over "learn" (the
 * host and the CUDA_VISIBLE_DEVICES its node agent gave it). Two shards on
 * one device: rl.collective nccl fails the step, naming them; auto goes on
 * through the host, said once. 0 or an error code, the reason in rl_last_error(). */
static int check_devices(learner_state *s)
{
    char *ids = calloc((size_t)s->world, DEVICE_ID), host[64] = "?";
    if (!ids) return rl_fail(MANTA_ENOMEM, "out of memory");
    gethostname(host, sizeof host - 1);
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    char *mine = ids + (size_t)s->rank * DEVICE_ID;
    snprintf(mine, DEVICE_ID, "%s/%s", host, vis ? vis : "(every device)");
    int rc = manta_coll_all_gather(s->coll, mine, ids, (size_t)s->world * DEVICE_ID,
                                   MANTA_COLL_BYTE, s->coll_timeout_ms);
    if (rc) rl_fail(rc, "collective group: %s", manta_last_error());
    int a = -1, b = -1;
    for (int i = 0; !rc && a < 0 && i < s->world; i++)
        for (int j = i + 1; a < 0 && j < s->world; j++)
            if (!strncmp(ids + (size_t)i * DEVICE_ID, ids + (size_t)j * DEVICE_ID, DEVICE_ID))
                a = i, b = j;
    if (a >= 0) {
        char shared[300];
        snprintf(shared, sizeof shared,
                 "learner shards %d and %d share one GPU (%.*s): NCCL needs a GPU per shard", a, b,
                 DEVICE_ID, ids + (size_t)a * DEVICE_ID);
        if (s->nccl_asked) {
            rc = rl_fail(MANTA_EINVAL,
                         "rl.collective is nccl, but %s (give the learner group resources: {gpu: "
                         "1}, or set rl.collective host)",
                         shared);
        } else {
            rl_log(s->m, "learner %d: rl.collective auto: host, as %s", s->rank, shared);
            float *g = calloc(s->n_params, sizeof(float)), *p = calloc(s->n_params, sizeof(float));
            if (!g || !p) {
                free(g), free(p);
                rc = rl_fail(MANTA_ENOMEM, "out of memory for staging %zu parameters", s->n_params);
            } else {
                free(s->grads), free(s->params);
                s->grads = g, s->params = p, s->nccl = NULL, s->staged = 1;
            }
        }
    }
    free(ids);
    return rc;
}

/* Join "learn" (and "learn.nccl"); on failure why[cap] says what failed. */
static int join_group(learner_state *s, char *why, size_t cap)
{
    manta_coll_options o = {.timeout_ms = s->coll_timeout_ms};
    int rc = s->coll ? 0 : manta_coll_create(s->m, "learn", s->world, s->rank, &o, &s->coll);
    if (rc) snprintf(why, cap, "collective group: %s", manta_last_error());
    if (!rc && s->nccl && !s->ncoll && (rc = check_devices(s)))
        snprintf(why, cap, "%s", rl_last_error());
    o.backend = s->nccl;
    if (!rc && s->nccl && !s->ncoll) {
        rc = manta_coll_create(s->m, "learn.nccl", s->world, s->rank, &o, &s->ncoll);
        if (rc)
            snprintf(why, cap, "collective group: %s", manta_last_error());
        else
            rl_log(s->m, "learner %d: joined learn.nccl: gradients and parameters over NCCL",
                   s->rank);
    }
    if (rc) {
        rl_log(s->m, "learner: %s", why);
        leave_groups(s); /* met afresh at the next step */
    }
    return rc;
}

/* Fill the batch arrays (inputs tok[0..n-2], targets tok[1..n-1], each
 * sequence cut to the context) from the items; returns the padded length T.
 * Refuses more sequences than the batch the model was built for. */
static int load_batch(learner_state *s, const rl_step_req *r, int *T)
{
    if (r->n_items > s->max_batch)
        return rl_fail(MANTA_EINVAL, "%d sequences > max batch %d of this shard", r->n_items,
                       s->max_batch);
    int Tm = 2;
    for (int i = 0; i < r->n_items; i++) {
        int n = r->items[i].n < s->block + 1 ? r->items[i].n : s->block + 1;
        if (n > Tm) Tm = n;
    }
    int T1 = Tm - 1;
    for (int b = 0; b < r->n_items; b++) {
        const rl_step_item *it = &r->items[b];
        int n = it->n < s->block + 1 ? it->n : s->block + 1;
        for (int t = 0; t < T1; t++) {
            size_t k = (size_t)b * T1 + t;
            int live = t + 1 < n; /* padding: EOS, weight 0 */
            s->x[k] = live ? it->tok[t] : RL_TOK_EOS;
            s->y[k] = live ? it->tok[t + 1] : RL_TOK_EOS;
            s->mask[k] = live && it->mask[t + 1] ? 1.0f : 0.0f;
            s->blp[k] = live && it->logp ? it->logp[t + 1] : 0.0f;
            s->adv[k] = it->adv;
        }
    }
    *T = T1;
    return 0;
}

#define N_ST 9 /* tokens, loss, pg, kl, clip, entropy, ratio, reproduced, sequences */

/* Warm-up: how many of the B sequences at row b0 greedy decoding
 * reproduces before the update (every loss token has probability > 1/2
 * under teacher forcing, so it is the argmax), and how many have loss
 * tokens, into st[7], st[8]. The behaviour log-probs are unused in this
 * mode: blp is the scratch. */
static int count_reproduced(learner_state *s, int b0, int B, int T, float st[N_ST])
{
    float *lp = s->blp + (size_t)b0 * T;
    const float *mask = s->mask + (size_t)b0 * T;
    if (mk_logprobs(s->model, s->y + (size_t)b0 * T, lp, NULL)) return -1;
    for (int b = 0; b < B; b++) {
        int any = 0, all = 1;
        for (int t = 0; t < T; t++) {
            size_t k = (size_t)b * T + t;
            if (mask[k] == 0) continue;
            any = 1;
            if (lp[k] <= -0.69314718f) all = 0; /* p <= 1/2 */
        }
        st[7] += (float)(any && all), st[8] += (float)any;
    }
    memset(lp, 0, (size_t)B * T * sizeof *lp);
    return 0;
}

/* Step 1: forward, loss (clipped surrogate, or cross-entropy for the
 * warm-up) and backward over the B local sequences, in micro-batches of
 * s->micro sequences whose gradients add up (each scaled by its share of
 * the loss tokens, so the sum is the mean over the B sequences); st gets the
 * token count and the token-weighted statistics (loss, pg, kl, clip,
 * entropy, ratio), and for the warm-up the sequences reproduced and counted. */
static int local_pass(learner_state *s, int mode, int B, int T, float st[N_ST])
{
    memset(st, 0, N_ST * sizeof *st);
    mk_zero_grad(s->model);
    float total = 0;
    for (size_t i = 0; i < (size_t)B * T; i++) total += s->mask[i];
    int rc = 0;
    for (int b0 = 0; !rc && b0 < B; b0 += s->micro) {
        int nb = B - b0 < s->micro ? B - b0 : s->micro;
        size_t o = (size_t)b0 * T;
        float n = 0;
        for (size_t i = 0; i < (size_t)nb * T; i++) n += s->mask[o + i];
        if (n == 0) continue; /* no loss tokens: no gradient, nothing to count */
        mk_ppo_stats ps = {0};
        rc = mk_forward(s->model, s->x + o, nb, T);
        if (!rc && mode == RL_STEP_SFT) {
            float loss = 0;
            rc = count_reproduced(s, b0, nb, T, st);
            if (!rc) rc = mk_loss_ce(s->model, s->y + o, s->mask + o, &loss);
            ps.loss = ps.pg_loss = loss, ps.n_tokens = n;
        } else if (!rc) {
            rc = mk_loss_ppo(s->model, s->y + o, s->blp + o, s->adv + o, s->mask + o, &s->ppo, &ps);
        }
        if (!rc) rc = mk_loss_scale(s->model, n / total);
        if (!rc) rc = mk_backward(s->model);
        st[0] += n, st[1] += ps.loss * n, st[2] += ps.pg_loss * n, st[3] += ps.approx_kl * n;
        st[4] += ps.clip_frac * n, st[5] += ps.entropy * n, st[6] += ps.mean_ratio * n;
    }
    if (rc) return rl_fail(MANTA_EINVAL, "kernels: %s", mk_last_error());
    return 0;
}

/* Steps 2-4: totals over every shard, this shard's slice of the summed
 * gradient (each shard scaled by its share of the tokens, so the result is
 * the mean over the batch), the global norm and clipping. */
static int reduce_grads(learner_state *s, float st[N_ST], float *gnorm)
{
    float local_tokens = st[0];
    int rc = manta_coll_all_reduce(s->coll, st, N_ST, s->coll_timeout_ms);
    if (rc) return rc;
    float share = st[0] > 0 ? local_tokens / st[0] : 0;
    mk_model *md = s->model;
    if (s->staged) { /* through host memory: the whole gradient down, the slice up */
        mk_model_read_grads(md, s->grads, 0, s->n_params);
        mk_scale(s->grads, share, s->n_params);
        rc = manta_coll_reduce_scatter(s->coll, s->grads, s->grads + s->off, s->n_params,
                                       s->coll_timeout_ms);
        if (!rc) mk_model_write_grads(md, s->grads + s->off, s->off, s->len);
    } else { /* on the model's own memory: host (CPU) or device (NCCL) */
        float *g = mk_model_grads(md);
        mk_model_grad_scale(md, 0, s->n_params, share);
        mk_model_sync(md);
        rc = manta_coll_reduce_scatter(s->ncoll ? s->ncoll : s->coll, g, g + s->off, s->n_params,
                                       s->coll_timeout_ms);
    }
    if (rc) return rc;
    double sum;
    mk_model_grad_sumsq_range(md, s->off, s->len, &sum);
    float sq = (float)sum;
    rc = manta_coll_all_reduce(s->coll, &sq, 1, s->coll_timeout_ms);
    if (rc) return rc;
    *gnorm = sqrtf(sq);
    if (s->opt.grad_clip > 0)
        mk_model_grad_scale(md, s->off, s->len, mk_clip_factor(sq, s->opt.grad_clip));
    return 0;
}

/* Step 6: every shard's slice into the local model. */
static int gather_params(learner_state *s)
{
    mk_model *md = s->model;
    if (s->staged) { /* the slice down, every parameter up */
        mk_model_read_params(md, s->params + s->off, s->off, s->len);
        int rc = manta_coll_all_gather(s->coll, s->params + s->off, s->params, s->n_params,
                                       MANTA_COLL_FLOAT32, s->coll_timeout_ms);
        if (!rc) mk_model_write_params(md, s->params, 0, s->n_params);
        return rc;
    }
    float *p = mk_model_params(md);
    mk_model_sync(md);
    return manta_coll_all_gather(s->ncoll ? s->ncoll : s->coll, p + s->off, p, s->n_params,
                                 MANTA_COLL_FLOAT32, s->coll_timeout_ms);
}

/* Answer with the published buckets and the statistics. */
static int reply_step(manta_req *req, rl_step_reply *r, const rl_buckets *pub)
{
    r->buckets = *pub; /* borrowed: not destroyed here */
    char *buf;
    size_t len;
    int rc = rl_step_reply_encode(r, &buf, &len);
    if (rc) return manta_reply_error(req, rc, "%s", rl_last_error());
    rc = manta_reply(req, buf, len);
    free(buf);
    return rc;
}

/* A restarted shard that was not restored would train and publish a model
 * of its own: refuse, naming why (the controller restores or fails). */
static int refuse_unrestored(manta_req *req, const learner_state *s, const char *method)
{
    return manta_reply_error(req, MANTA_EREMOTE,
                             "%s: learner shard %d restarted (incarnation %d) and was not "
                             "restored from a checkpoint: its parameters and AdamW state are "
                             "not the group's",
                             method, s->rank, s->incarnation);
}

static int learner_step(manta_req *req, void *state, const void *arg, size_t len)
{
    learner_state *s = state;
    if (s->needs_restore) return refuse_unrestored(req, s, "step");
    double t0 = rl_now_s();
    rl_step_req r;
    int T = 1, rc = rl_step_req_decode_vocab(&r, arg, len, s->ms.vocab);
    if (!rc) rc = load_batch(s, &r, &T);
    int mode = r.mode, B = r.n_items;
    float lr = (float)r.lr;
    rl_step_reply out = {.version = r.version};
    rl_step_req_destroy(&r);
    if (rc) return manta_reply_error(req, rc, "step: %s", rl_last_error());
    char why[600];
    if ((rc = join_group(s, why, sizeof why))) return manta_reply_error(req, rc, "step: %s", why);
    float st[N_ST], gnorm = 0;
    if ((rc = local_pass(s, mode, B, T, st)))
        return manta_reply_error(req, rc, "step: %s", rl_last_error());
    if ((rc = reduce_grads(s, st, &gnorm))) goto coll_fail;
    mk_adamw_params opt = s->opt; /* step 5 */
    opt.lr = lr;
    mk_model_adamw_range(s->model, s->off, s->len, &opt, ++s->t);
    if ((rc = gather_params(s))) goto coll_fail;
    const rl_buckets *pub;
    double tp = rl_now_s();
    if ((rc = publish(s, &pub)))
        return manta_reply_error(req, rc, "step: publish: %s", manta_last_error());
    manta_metric_observe(s->m, "weight_sync_seconds", "publish", rl_now_s() - tp);
    manta_metric_add(s->m, "weight_sync_bytes_total", "publish", (double)s->len * sizeof(float));
    manta_metric_add(s->m, "tokens_trained_total", NULL, st[0] > 0 ? st[0] : 0);
    float n = st[0] > 0 ? st[0] : 1;
    out.loss = st[1] / n, out.pg_loss = st[2] / n, out.kl = st[3] / n;
    out.clip_frac = st[4] / n, out.entropy = st[5] / n, out.ratio = st[6] / n;
    out.tokens = st[0], out.grad_norm = gnorm, out.busy_s = rl_now_s() - t0;
    out.reproduced = st[8] > 0 ? st[7] / st[8] : 0;
    return reply_step(req, &out, pub);
coll_fail:
    rl_log(s->m, "learner: collective failed: %s", manta_last_error());
    leave_groups(s);
    return manta_reply_error(req, rc, "step: collective: %s", manta_last_error());
}

/* Publish the current parameters without a step (version 0). */
static int learner_publish(manta_req *req, void *state, const void *arg, size_t len)
{
    learner_state *s = state;
    (void)arg, (void)len;
    if (s->needs_restore) return refuse_unrestored(req, s, "publish");
    const rl_buckets *pub;
    int rc = publish(s, &pub);
    if (rc) return manta_reply_error(req, rc, "publish: %s", manta_last_error());
    rl_step_reply out = {.version = 0};
    return reply_step(req, &out, pub);
}

/* ---- paths: inside the run folder only ----
 *
 * save, checkpoint and restore take a path from whoever calls them, so
 * each is confined to the run folder (rl.run_dir, read from the spec as the
 * controller reads it, never from the caller): relative to it, or absolute
 * and inside it once resolved (rl_path_inside: no "..", no link leading
 * out). What is written is created new, never through a link: folders with
 * mkdir/mkdtemp, files with O_CREAT|O_EXCL|O_NOFOLLOW. restore may also read
 * the folder rl.resume names. A refusal is answered with the reason, logged
 * and counted (metric path_refusals_total{kind=METHOD}). */

static int refuse_path(manta_req *req, learner_state *s, const char *method, int rc)
{
    manta_metric_add(s->m, "path_refusals_total", method, 1);
    rl_log(s->m, "learner %d: refused: %s", s->rank, rl_last_error());
    return manta_reply_error(req, rc, "%s", rl_last_error());
}

/* Write the model as the Hugging Face folder dir (canonical, inside the run
 * folder, its first `have` bytes existing): missing parents are made, the
 * files go into a new folder made by mkdtemp beside dir (nobody else's
 * links can be in it), which then replaces dir; a folder already at dir
 * (ours: rl_path_inside checked) is moved aside and removed. */
static int save_folder(learner_state *s, const char *dir, size_t have)
{
    char tmp[PATH_MAX + 16], old[PATH_MAX + 16];
    struct stat st;
    int rc = rl_mkdirs_new(dir, have, 0);
    if (rc) return rc;
    snprintf(tmp, sizeof tmp, "%s.new-XXXXXX", dir);
    if (!mkdtemp(tmp) || chmod(tmp, 0755))
        return rl_fail(MANTA_ESYS, "cannot create folder %s: %s", tmp, strerror(errno));
    rc = rl_model_save(&s->ms, s->model, tmp);
    old[0] = 0;
    if (!rc && lstat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())
            rc = rl_fail(MANTA_ESYS, "%s exists and is not a folder of this user", dir);
        else if (snprintf(old, sizeof old, "%s.old-XXXXXX", dir) < 0 || !mkdtemp(old) ||
                 rename(dir, old))
            rc = rl_fail(MANTA_ESYS, "cannot move %s aside: %s", dir, strerror(errno));
    }
    if (!rc && rename(tmp, dir)) {
        rc = rl_fail(MANTA_ESYS, "%s: %s", dir, strerror(errno));
        if (old[0] && rename(old, dir) == 0) old[0] = 0; /* the previous one stays */
    }
    if (rc) rl_remove_tree(tmp);
    if (old[0]) rl_remove_tree(old);
    return rc;
}

/* Save the full model as a Hugging Face folder of its family at the path
 * given (text, inside the run folder), in the dtype of the folder it was
 * loaded from (F32 for a fresh model): config.json and model.safetensors
 * (or shards and their index), loadable by mk_load_dir and transformers'
 * from_pretrained. */
static int learner_save(manta_req *req, void *state, const void *arg, size_t len)
{
    learner_state *s = state;
    char dir[PATH_MAX];
    size_t have;
    int rc = rl_path_inside("save", s->run_dir, 0, arg, len, dir, sizeof dir, &have);
    if (rc) return refuse_path(req, s, "save", rc);
    if (s->needs_restore) return refuse_unrestored(req, s, "save");
    rc = save_folder(s, dir, have);
    if (rc) return manta_reply_error(req, rc, "save: %s", rl_last_error());
    return manta_reply(req, "ok", 2);
}

/* ---- checkpoints ---- */

/* learner-RANK.state: this header, then the slice's first moments, second
 * moments and (flag HAS_PARAMS) parameters, len floats each, host byte
 * order (a checkpoint is read back on machines of the same kind). */
#define STATE_MAGIC "MANTAOPT"
#define HAS_PARAMS  1u
typedef struct state_header {
    char magic[8];
    uint32_t format, flags;
    int64_t world, rank, n_params, off, len, t;
} state_header;

/* Weights in the Hugging Face folder lose nothing when it is one F32 file
 * (mk_load reads it); otherwise the state files carry the F32 slices. */
static int weights_in_folder(const learner_state *s)
{
    return s->ms.dtype == MK_F32 && s->n_params * sizeof(float) <= 5000000000ull;
}

/* fsync a file or a folder by path; 0 or -1 (errno). */
static int sync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* fsync every file of a folder, then the folder. */
static int sync_folder(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int rc = 0;
    struct dirent *e;
    char path[1100];
    while (!rc && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            rc = sync_path(path);
        }
    closedir(d);
    return rc ? rc : sync_path(dir);
}

static int write_state(const learner_state *s, const char *dir)
{
    char path[PATH_MAX + 32];
    int rc;
    snprintf(path, sizeof path, "%s/learner-%d.state", dir, s->rank);
    state_header h = {.format = 1,
                      .flags = weights_in_folder(s) ? 0 : HAS_PARAMS,
                      .world = s->world,
                      .rank = s->rank,
                      .n_params = (int64_t)s->n_params,
                      .off = (int64_t)s->off,
                      .len = (int64_t)s->len,
                      .t = s->t};
    memcpy(h.magic, STATE_MAGIC, 8);
    /* new, never through a link (the folder is new: nothing to replace) */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!f) {
        rc = rl_fail(MANTA_ESYS, "%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return rc;
    }
    int ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(s->am, sizeof(float), s->len, f) == s->len &&
             fwrite(s->av, sizeof(float), s->len, f) == s->len &&
             (!(h.flags & HAS_PARAMS) || fwrite(s->slice, sizeof(float), s->len, f) == s->len) &&
             fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f)) ok = 0;
    return ok ? 0 : rl_fail(MANTA_ESYS, "%s: %s", path, strerror(errno));
}

/* "checkpoint DIR" (text, inside the run folder; made when missing): this
 * shard's state file; shard 0 adds DIR/model. */
static int learner_checkpoint(manta_req *req, void *state, const void *arg, size_t len)
{
    learner_state *s = state;
    char dir[PATH_MAX], model[PATH_MAX + 8];
    size_t have;
    int rc = rl_path_inside("checkpoint", s->run_dir, 0, arg, len, dir, sizeof dir, &have);
    if (rc) return refuse_path(req, s, "checkpoint", rc);
    if (s->needs_restore) return refuse_unrestored(req, s, "checkpoint");
    if (have < strlen(dir)) { /* made here (shards race: one wins), then checked again */
        rl_mkdirs_new(dir, have, 1);
        rc = rl_path_inside("checkpoint", s->run_dir, 0, arg, len, dir, sizeof dir, &have);
        if (!rc && have < strlen(dir))
            rc = rl_fail(MANTA_ESYS, "checkpoint: cannot create folder %s", dir);
        if (rc) return manta_reply_error(req, rc, "%s", rl_last_error());
    }
    mk_model_read_moments(s->model, 0, s->am, s->off, s->len);
    mk_model_read_moments(s->model, 1, s->av, s->off, s->len);
    mk_model_read_params(s->model, s->slice, s->off, s->len);
    rc = write_state(s, dir);
    if (!rc && s->rank == 0) {
        snprintf(model, sizeof model, "%s/model", dir);
        rc = save_folder(s, model, strlen(dir));
        if (!rc && sync_folder(model))
            rc = rl_fail(MANTA_ESYS, "fsync %s: %s", model, strerror(errno));
    }
    if (rc) return manta_reply_error(req, rc, "checkpoint: %s", rl_last_error());
    return manta_reply(req, "ok", 2);
}

/* Read n floats at element `at` of the array that starts at byte `base`. */
static int read_at(FILE *f, long base, size_t at, float *dst, size_t n)
{
    return fseek(f, base + (long)(at * sizeof(float)), SEEK_SET) == 0 &&
                   fread(dst, sizeof(float), n, f) == n
               ? 0
               : -1;
}

/* One state file: its share of this shard's moments (and of the whole
 * parameter vector, into all[n_params], when it carries parameters); *got
 * and *pgot count the elements found. */
static int read_state(learner_state *s, const char *path, float *all, size_t *got, size_t *pgot,
                      int64_t *t)
{
    /* a file of the folder, never a link out of it */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid())) {
        close(fd);
        return rl_fail(MANTA_EINVAL, "%s: not a regular file of this user", path);
    }
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        int rc = rl_fail(MANTA_ESYS, "%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return rc;
    }
    state_header h;
    int rc = 0;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, STATE_MAGIC, 8) || h.format != 1)
        rc = rl_fail(MANTA_EINVAL, "%s: not a learner state file", path);
    else if (h.n_params != (int64_t)s->n_params)
        rc = rl_fail(MANTA_EINVAL, "%s: %lld parameters, the model has %zu", path,
                     (long long)h.n_params, s->n_params);
    else if (h.off < 0 || h.len < 0 || h.off + h.len > h.n_params || fstat(fileno(f), &st) ||
             (uint64_t)st.st_size !=
                 sizeof h + (uint64_t)h.len * sizeof(float) * ((h.flags & HAS_PARAMS) ? 3 : 2))
        rc = rl_fail(MANTA_EINVAL, "%s: truncated or inconsistent (slice %lld+%lld)", path,
                     (long long)h.off, (long long)h.len);
    size_t lo = (size_t)h.off > s->off ? (size_t)h.off : s->off;
    size_t hi =
        (size_t)(h.off + h.len) < s->off + s->len ? (size_t)(h.off + h.len) : s->off + s->len;
    long m0 = (long)sizeof h, v0 = m0 + (long)(h.len * 4), p0 = v0 + (long)(h.len * 4);
    if (!rc && lo < hi &&
        (read_at(f, m0, lo - (size_t)h.off, s->am + (lo - s->off), hi - lo) ||
         read_at(f, v0, lo - (size_t)h.off, s->av + (lo - s->off), hi - lo)))
        rc = rl_fail(MANTA_ESYS, "%s: read failed", path);
    if (!rc && lo < hi) *got += hi - lo;
    if (!rc && (h.flags & HAS_PARAMS)) {
        if (read_at(f, p0, 0, all + h.off, (size_t)h.len))
            rc = rl_fail(MANTA_ESYS, "%s: read failed", path);
        *pgot += (size_t)h.len;
    }
    if (!rc) *t = h.t;
    fclose(f);
    return rc;
}

/* Is every component of path after its first `from` bytes neither a link
 * nor another user's, and the last a regular file? (mk_load opens it by
 * name.) */
static int regular_file(const char *path, size_t from)
{
    char tmp[PATH_MAX + 300];
    struct stat st;
    snprintf(tmp, sizeof tmp, "%s", path);
    for (size_t i = from + 1, n = strlen(tmp); i <= n; i++) {
        if (tmp[i] != '/' && tmp[i] != 0) continue;
        char c = tmp[i];
        tmp[i] = 0;
        if (lstat(tmp, &st) || S_ISLNK(st.st_mode) || st.st_uid != geteuid() ||
            (c == 0 && !S_ISREG(st.st_mode)))
            return 0;
        tmp[i] = c;
    }
    return 1;
}

/* The parameters and this shard's moments from checkpoint folder dir. */
static int restore_from(learner_state *s, const char *dir)
{
    /* the state files' parameters (a BF16/F16 policy's F32 slices), for the restore only */
    float *all = calloc(s->n_params + 1, sizeof(float));
    if (!all) return rl_fail(MANTA_ENOMEM, "out of memory for %zu parameters", s->n_params);
    DIR *d = opendir(dir);
    if (!d) {
        free(all);
        return rl_fail(MANTA_ESYS, "%s: %s", dir, strerror(errno));
    }
    size_t got = 0, pgot = 0;
    int64_t t = -1;
    int rc = 0, files = 0;
    struct dirent *e;
    char path[PATH_MAX + 300];
    while (!rc && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "learner-", 8) || n < 6 || strcmp(e->d_name + n - 6, ".state"))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        rc = read_state(s, path, all, &got, &pgot, &t);
        files++;
    }
    closedir(d);
    if (!rc && (files == 0 || got != s->len))
        rc = rl_fail(MANTA_EINVAL,
                     "%s: the state files cover %zu of the %zu moments of slice "
                     "[%zu, %zu)",
                     dir, got, s->len, s->off, s->off + s->len);
    if (!rc && pgot == 0) { /* the weights are the folder's F32 file */
        snprintf(path, sizeof path, "%s/model/model.safetensors", dir);
        if (!regular_file(path, strlen(dir)))
            rc = rl_fail(MANTA_EINVAL, "%s: not a regular file of this user in %s", path, dir);
        else if (mk_load(s->model, path) != MK_OK)
            rc = rl_fail(MANTA_EINVAL, "%s: %s", path, mk_last_error());
    } else if (!rc && pgot != s->n_params) {
        rc = rl_fail(MANTA_EINVAL, "%s: the state files hold %zu of %zu parameters", dir, pgot,
                     s->n_params);
    } else if (!rc) {
        mk_model_write_params(s->model, all, 0, s->n_params);
    }
    free(all);
    if (rc) return rc;
    mk_model_write_moments(s->model, 0, s->am, s->off, s->len);
    mk_model_write_moments(s->model, 1, s->av, s->off, s->len);
    s->t = (int)t;
    return 0;
}

/* "restore DIR" (text, inside the run folder or rl.resume's): parameters,
 * moments and step count from a checkpoint. A refused path changes
 * nothing. The collective group is left, so that every shard meets its
 * peers afresh at the next step. On failure the shard stays unrestored
 * (a restarted one keeps refusing steps) and the reply says why. */
static int learner_restore(manta_req *req, void *state, const void *arg, size_t len)
{
    learner_state *s = state;
    char dir[PATH_MAX];
    size_t have = 0;
    int rc = rl_path_inside("restore", s->run_dir, 0, arg, len, dir, sizeof dir, &have);
    if (rc && s->resume_dir[0]) { /* a run resumed from another folder reads that one */
        char why[600];
        snprintf(why, sizeof why, "%s", rl_last_error());
        if (rl_path_inside("restore", s->resume_dir, 1, arg, len, dir, sizeof dir, &have))
            rl_fail(MANTA_EINVAL, "%s (nor inside rl.resume's folder %s)", why, s->resume_dir);
        else
            rc = 0;
    }
    if (!rc && have < strlen(dir)) rc = rl_fail(MANTA_EINVAL, "restore: %s: no such folder", dir);
    if (rc) return refuse_path(req, s, "restore", rc);
    rc = restore_from(s, dir);
    leave_groups(s);
    if (rc) {
        s->needs_restore = 1; /* half-read: never step on it */
        rl_log(s->m, "learner %d: restore %s: %s", s->rank, dir, rl_last_error());
        return manta_reply_error(req, rc, "restore: %s", rl_last_error());
    }
    s->needs_restore = 0;
    rl_log(s->m, "learner %d: restored from %s (AdamW step %d)", s->rank, dir, s->t);
    return manta_reply(req, "ok", 2);
}

static const manta_method learner_methods[] = {
    {"step", learner_step},       {"publish", learner_publish},
    {"save", learner_save},       {"checkpoint", learner_checkpoint},
    {"restore", learner_restore}, {NULL, NULL}};

const manta_class rl_learner_class = {"learner", sizeof(learner_state), learner_init, learner_fini,
                                      learner_methods};
