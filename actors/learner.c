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
 *   5. AdamW on the owned slice (weight decay on matrices only);
 *   6. all-gather of the parameters, written back into the local model;
 *   7. the owned slice is published as weight buckets of at most
 *      rl.bucket_mb MiB each (manta_put, served zero-copy by this process),
 *      each with its CRC32C; the reply lists them.
 *
 * The collectives are the runtime's (manta_collective.h, ZeroMQ backend);
 * the group "learn" is joined on the first step, when every shard is in the
 * call. The buckets of the last 8 versions stay alive; older ones are
 * released.
 *
 * Step argument (msgpack): {mode: "ppo"|"sft", version: int, lr: float,
 * items: [{tok: bin int32, logp: bin float32, mask: bin uint8, adv: float}]}.
 * Reply: {version, buckets: [{offset, count, id, crc}], loss, pg_loss, kl,
 * clip_frac, entropy, ratio, tokens, grad_norm, busy_s}.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <manta_collective.h>
#include <manta_kernels.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEEP_VERSIONS     8
#define MAX_SLICE_BUCKETS 256
#define COLL_TIMEOUT      60000

typedef struct learner_state {
    manta_ctx *m;
    mk_model *model;
    mk_config cfg;
    int max_batch, block;
    int rank, world;
    size_t n_params, off, len;
    float *params;  /* full vector, host */
    float *grads;   /* full vector, host */
    float *am, *av; /* AdamW moments of the owned slice */
    uint8_t *decay; /* per owned element: weight decay applies */
    mk_adamw_params opt;
    mk_ppo_params ppo;
    int t;
    manta_coll_group *coll;
    size_t bucket_elems; /* floats per bucket */
    struct published {   /* the buckets of one version */
        manta_obj_id ids[MAX_SLICE_BUCKETS];
        size_t off[MAX_SLICE_BUCKETS], n[MAX_SLICE_BUCKETS];
        uint32_t crc[MAX_SLICE_BUCKETS];
        int count;
    } * pubs; /* KEEP_VERSIONS of them, a ring */
    int pub_next;
    int32_t *x, *y;
    float *blp, *adv, *mask;
} learner_state;

static int learner_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    learner_state *s = state;
    s->m = m;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, args, len) != 0) {
        msgpack_unpacked_destroy(&u);
        return MANTA_EINVAL;
    }
    const msgpack_object *a = &u.data;
    s->rank = (int)rl_mp_int(rl_mp_get(a, "replica"), 0);
    s->world = (int)rl_mp_int(rl_mp_get(a, "replicas"), 1);
    s->cfg.n_layer = (int)rl_mp_int(rl_setting(a, "n_layer", "model"), 2);
    s->cfg.n_head = (int)rl_mp_int(rl_setting(a, "n_head", "model"), 4);
    s->cfg.n_embd = (int)rl_mp_int(rl_setting(a, "n_embd", "model"), 64);
    s->cfg.block_size = (int)rl_mp_int(rl_setting(a, "block_size", "model"), 64);
    s->cfg.vocab_size = RL_VOCAB;
    uint64_t seed = (uint64_t)rl_mp_int(rl_setting(a, "seed", "model"), 1);
    int64_t batch = rl_mp_int(rl_setting(a, "batch_episodes", "rl"), 64);
    int64_t demos = rl_mp_int(rl_setting(a, "warmup_batch", "rl"), 64);
    if (demos > batch) batch = demos;
    int64_t ev = rl_mp_int(rl_setting(a, "eval_problems", "rl"), 0);
    (void)ev;
    s->max_batch = (int)((batch + s->world - 1) / s->world);
    s->opt.lr = (float)rl_mp_num(rl_setting(a, "lr", "rl"), 1e-3);
    s->opt.beta1 = (float)rl_mp_num(rl_setting(a, "beta1", "rl"), 0.9);
    s->opt.beta2 = (float)rl_mp_num(rl_setting(a, "beta2", "rl"), 0.99);
    s->opt.eps = 1e-8f;
    s->opt.weight_decay = (float)rl_mp_num(rl_setting(a, "weight_decay", "rl"), 0.0);
    s->opt.grad_clip = (float)rl_mp_num(rl_setting(a, "grad_clip", "rl"), 1.0);
    s->ppo.clip_low = (float)rl_mp_num(rl_setting(a, "clip_low", "rl"), 0.2);
    s->ppo.clip_high = (float)rl_mp_num(rl_setting(a, "clip_high", "rl"), 0.28);
    s->ppo.ratio_cap = (float)rl_mp_num(rl_setting(a, "ratio_cap", "rl"), 3.0);
    s->ppo.entropy_coef = (float)rl_mp_num(rl_setting(a, "entropy_coef", "rl"), 0.0);
    int threads = (int)rl_mp_int(rl_setting(a, "threads", NULL), 1);
    double bucket_mb = rl_mp_num(rl_setting(a, "bucket_mb", "rl"), 4.0);
    msgpack_unpacked_destroy(&u);

    mk_set_threads(threads);
    s->bucket_elems = (size_t)(bucket_mb * (1 << 20) / sizeof(float));
    if (s->bucket_elems < 1024) s->bucket_elems = 1024;
    s->block = s->cfg.block_size;
    if (mk_model_new(&s->model, &s->cfg, s->max_batch, s->block, NULL)) {
        rl_log(m, "learner: model: %s", mk_last_error());
        return MANTA_EINVAL;
    }
    mk_model_init(s->model, seed);
    s->n_params = mk_model_num_params(s->model);
    manta_coll_slice(s->n_params, s->world, s->rank, &s->off, &s->len);
    size_t bt = (size_t)s->max_batch * s->block;
    s->params = calloc(s->n_params, sizeof(float));
    s->grads = calloc(s->n_params, sizeof(float));
    s->am = calloc(s->len + 1, sizeof(float));
    s->av = calloc(s->len + 1, sizeof(float));
    s->decay = calloc(s->len + 1, 1);
    s->x = calloc(bt, sizeof(int32_t)), s->y = calloc(bt, sizeof(int32_t));
    s->blp = calloc(bt, sizeof(float)), s->adv = calloc(bt, sizeof(float));
    s->mask = calloc(bt, sizeof(float));
    s->pubs = calloc(KEEP_VERSIONS, sizeof *s->pubs);
    if (s->len / s->bucket_elems + 1 > MAX_SLICE_BUCKETS)
        s->bucket_elems = s->len / (MAX_SLICE_BUCKETS - 1) + 1;
    if (!s->pubs || !s->params || !s->grads || !s->am || !s->av || !s->decay || !s->x || !s->y ||
        !s->blp || !s->adv || !s->mask)
        return MANTA_ENOMEM;
    mk_model_read_params(s->model, s->params, 0, s->n_params);
    for (int i = 0; i < mk_model_num_tensors(s->model); i++) {
        mk_tensor_info ti;
        mk_model_tensor(s->model, i, &ti);
        if (ti.ndim != 2) continue;
        size_t lo = ti.offset > s->off ? ti.offset : s->off;
        size_t hi = ti.offset + ti.numel < s->off + s->len ? ti.offset + ti.numel : s->off + s->len;
        for (size_t k = lo; k < hi; k++) s->decay[k - s->off] = 1;
    }
    rl_log(m, "learner %d/%d: %zu params, slice [%zu, %zu), batch %d x %d", s->rank, s->world,
           s->n_params, s->off, s->off + s->len, s->max_batch, s->block);
    return 0;
}

static void learner_fini(manta_ctx *m, void *state)
{
    learner_state *s = state;
    for (int v = 0; s->pubs && v < KEEP_VERSIONS; v++)
        for (int i = 0; i < s->pubs[v].count; i++) manta_obj_release(m, &s->pubs[v].ids[i]);
    free(s->pubs);
    manta_coll_free(s->coll);
    mk_model_free(s->model);
    free(s->params), free(s->grads), free(s->am), free(s->av), free(s->decay);
    free(s->x), free(s->y), free(s->blp), free(s->adv), free(s->mask);
}

/* Publish the owned slice as buckets of bucket_elems floats and pack them
 * as "buckets": [...]; the ring keeps the last KEEP_VERSIONS versions. */
static int publish(learner_state *s, msgpack_packer *pk)
{
    struct published *pub = &s->pubs[s->pub_next];
    for (int i = 0; i < pub->count; i++) manta_obj_release(s->m, &pub->ids[i]);
    pub->count = 0;
    s->pub_next = (s->pub_next + 1) % KEEP_VERSIONS;
    for (size_t o = 0; o < s->len || (s->len == 0 && pub->count == 0);) {
        size_t n = s->len - o < s->bucket_elems ? s->len - o : s->bucket_elems;
        const float *p = s->params + s->off + o;
        int rc =
            manta_put(s->m, n ? (const void *)p : "", n * sizeof(float), &pub->ids[pub->count]);
        if (rc) return rc;
        pub->off[pub->count] = s->off + o, pub->n[pub->count] = n;
        pub->crc[pub->count] = manta_crc32c(0, p, n * sizeof(float));
        pub->count++;
        o += n;
        if (n == 0) break;
    }
    rl_pack_str(pk, "buckets");
    msgpack_pack_array(pk, (size_t)pub->count);
    for (int i = 0; i < pub->count; i++) {
        msgpack_pack_map(pk, 4);
        rl_pack_kv_int(pk, "offset", (int64_t)pub->off[i]);
        rl_pack_kv_int(pk, "count", (int64_t)pub->n[i]);
        rl_pack_kv_str(pk, "id", pub->ids[i].s);
        rl_pack_kv_int(pk, "crc", pub->crc[i]);
    }
    return 0;
}

static int join_group(learner_state *s)
{
    if (s->coll) return 0;
    manta_coll_options o = {.timeout_ms = COLL_TIMEOUT};
    int rc = manta_coll_create(s->m, "learn", s->world, s->rank, &o, &s->coll);
    if (rc) rl_log(s->m, "learner: join group: %s", manta_last_error());
    return rc;
}

/* Fill the batch arrays from items; returns B (sequences) and sets *T. */
static int load_batch(learner_state *s, const msgpack_object *items, int *T, char *why, size_t wl)
{
    int B = 0, Tm = 2;
    if (!items || items->type != MSGPACK_OBJECT_ARRAY) return 0;
    if ((int)items->via.array.size > s->max_batch) {
        snprintf(why, wl, "%u sequences > max batch %d", items->via.array.size, s->max_batch);
        return -1;
    }
    for (uint32_t i = 0; i < items->via.array.size; i++) {
        const msgpack_object *tok = rl_mp_get(&items->via.array.ptr[i], "tok");
        if (!tok || tok->type != MSGPACK_OBJECT_BIN) continue;
        int n = (int)(tok->via.bin.size / 4);
        if (n > s->block + 1) n = s->block + 1;
        if (n > Tm) Tm = n;
    }
    int T1 = Tm - 1; /* inputs are tok[0..n-2], targets tok[1..n-1] */
    for (uint32_t i = 0; i < items->via.array.size; i++) {
        const msgpack_object *it = &items->via.array.ptr[i];
        const msgpack_object *tok = rl_mp_get(it, "tok"), *lp = rl_mp_get(it, "logp"),
                             *mk = rl_mp_get(it, "mask");
        if (!tok || tok->type != MSGPACK_OBJECT_BIN) continue;
        int n = (int)(tok->via.bin.size / 4);
        if (n > s->block + 1) n = s->block + 1;
        int have_lp = lp && lp->type == MSGPACK_OBJECT_BIN && lp->via.bin.size / 4 >= (uint32_t)n;
        int have_mk = mk && mk->type == MSGPACK_OBJECT_BIN && mk->via.bin.size >= (uint32_t)n;
        float a = (float)rl_mp_num(rl_mp_get(it, "adv"), 0);
        const char *tb = tok->via.bin.ptr;
        for (int t = 0; t < T1; t++) {
            size_t k = (size_t)B * T1 + t;
            int32_t xi = RL_TOK_EOS, yi = RL_TOK_EOS;
            float w = 0, l = 0;
            if (t + 1 < n) {
                memcpy(&xi, tb + 4 * t, 4);
                memcpy(&yi, tb + 4 * (t + 1), 4);
                if (have_mk) w = ((const uint8_t *)mk->via.bin.ptr)[t + 1] ? 1.0f : 0.0f;
                if (have_lp) memcpy(&l, lp->via.bin.ptr + 4 * (t + 1), 4);
            }
            if (xi < 0 || xi >= RL_VOCAB) xi = RL_TOK_EOS;
            if (yi < 0 || yi >= RL_VOCAB) yi = RL_TOK_EOS, w = 0;
            s->x[k] = xi, s->y[k] = yi, s->mask[k] = w, s->blp[k] = l, s->adv[k] = a;
        }
        B++;
    }
    *T = T1;
    return B;
}

static int learner_step(manta_req *req, void *state, const void *arg, size_t len)
{
    learner_state *s = state;
    double t0 = rl_now_s();
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, arg, len) != 0) {
        msgpack_unpacked_destroy(&u);
        return manta_reply_error(req, MANTA_EINVAL, "step: not msgpack");
    }
    char mode[8], why[128] = "";
    rl_mp_str(rl_mp_get(&u.data, "mode"), mode, sizeof mode, "ppo");
    int64_t version = rl_mp_int(rl_mp_get(&u.data, "version"), 0);
    float lr = (float)rl_mp_num(rl_mp_get(&u.data, "lr"), s->opt.lr);
    int T = 1;
    int B = load_batch(s, rl_mp_get(&u.data, "items"), &T, why, sizeof why);
    msgpack_unpacked_destroy(&u);
    if (B < 0) return manta_reply_error(req, MANTA_EINVAL, "step: %s", why);
    int rc = join_group(s);
    if (rc) return manta_reply_error(req, rc, "step: collective group: %s", manta_last_error());

    /* 1. local forward/backward */
    mk_zero_grad(s->model);
    /* stats: tokens, loss*tok, pg*tok, kl*tok, clip*tok, ent*tok, ratio*tok */
    float st[7] = {0};
    if (B > 0) {
        rc = mk_forward(s->model, s->x, B, T);
        mk_ppo_stats ps = {0};
        if (!rc && !strcmp(mode, "sft")) {
            float loss = 0, n = 0;
            for (int i = 0; i < B * T; i++) n += s->mask[i];
            rc = mk_loss_ce(s->model, s->y, s->mask, &loss);
            ps.loss = ps.pg_loss = loss, ps.n_tokens = n;
        } else if (!rc) {
            rc = mk_loss_ppo(s->model, s->y, s->blp, s->adv, s->mask, &s->ppo, &ps);
        }
        if (!rc) rc = mk_backward(s->model);
        if (rc) return manta_reply_error(req, MANTA_EINVAL, "step: kernels: %s", mk_last_error());
        float n = ps.n_tokens;
        st[0] = n, st[1] = ps.loss * n, st[2] = ps.pg_loss * n, st[3] = ps.approx_kl * n;
        st[4] = ps.clip_frac * n, st[5] = ps.entropy * n, st[6] = ps.mean_ratio * n;
    }
    float local_tokens = st[0];
    /* 2. totals */
    rc = manta_coll_all_reduce(s->coll, st, 7, COLL_TIMEOUT);
    if (rc) goto coll_fail;
    mk_model_read_grads(s->model, s->grads, 0, s->n_params);
    float share = st[0] > 0 ? local_tokens / st[0] : 0;
    mk_scale(s->grads, share, s->n_params);
    /* 3. reduce-scatter: our slice of the summed gradient, in place */
    rc = manta_coll_reduce_scatter(s->coll, s->grads, s->grads + s->off, s->n_params, COLL_TIMEOUT);
    if (rc) goto coll_fail;
    /* 4. global norm */
    float sq = (float)mk_sumsq(s->grads + s->off, s->len);
    rc = manta_coll_all_reduce(s->coll, &sq, 1, COLL_TIMEOUT);
    if (rc) goto coll_fail;
    float gnorm = sqrtf(sq);
    if (s->opt.grad_clip > 0)
        mk_scale(s->grads + s->off, mk_clip_factor(sq, s->opt.grad_clip), s->len);
    /* 5. AdamW on the slice, runs of equal decay flag */
    s->t++;
    for (size_t k = 0; k < s->len;) {
        size_t e = k;
        while (e < s->len && s->decay[e] == s->decay[k]) e++;
        mk_adamw(s->params + s->off + k, s->grads + s->off + k, s->am + k, s->av + k, e - k, lr,
                 s->opt.beta1, s->opt.beta2, s->opt.eps, s->decay[k] ? s->opt.weight_decay : 0.0f,
                 s->t);
        k = e;
    }
    /* 6. all-gather */
    rc = manta_coll_all_gather(s->coll, s->params + s->off, s->params, s->n_params,
                               MANTA_COLL_FLOAT32, COLL_TIMEOUT);
    if (rc) goto coll_fail;
    mk_model_write_params(s->model, s->params, 0, s->n_params);
    /* 7. buckets, in the reply */
    float n = st[0] > 0 ? st[0] : 1;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 11);
    rl_pack_kv_int(&pk, "version", version);
    rc = publish(s, &pk);
    if (rc) {
        msgpack_sbuffer_destroy(&sb);
        return manta_reply_error(req, rc, "step: publish: %s", manta_last_error());
    }
    rl_pack_kv_num(&pk, "loss", st[1] / n);
    rl_pack_kv_num(&pk, "pg_loss", st[2] / n);
    rl_pack_kv_num(&pk, "kl", st[3] / n);
    rl_pack_kv_num(&pk, "clip_frac", st[4] / n);
    rl_pack_kv_num(&pk, "entropy", st[5] / n);
    rl_pack_kv_num(&pk, "ratio", st[6] / n);
    rl_pack_kv_num(&pk, "tokens", st[0]);
    rl_pack_kv_num(&pk, "grad_norm", gnorm);
    rl_pack_kv_num(&pk, "busy_s", rl_now_s() - t0);
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return 0;
coll_fail:
    rl_log(s->m, "learner: collective failed: %s", manta_last_error());
    manta_coll_free(s->coll);
    s->coll = NULL;
    return manta_reply_error(req, rc, "step: collective: %s", manta_last_error());
}

/* Publish the current parameters without a step (the first version). */
static int learner_publish(manta_req *req, void *state, const void *arg, size_t len)
{
    learner_state *s = state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    int rc = publish(s, &pk);
    if (rc) {
        msgpack_sbuffer_destroy(&sb);
        return manta_reply_error(req, rc, "publish: %s", manta_last_error());
    }
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

/* Save the full model as safetensors at the path given (text), and a
 * transformers config.json in the same folder. */
static int learner_save(manta_req *req, void *state, const void *arg, size_t len)
{
    learner_state *s = state;
    char path[512];
    snprintf(path, sizeof path, "%.*s", (int)len, (const char *)arg);
    if (mk_save(s->model, path))
        return manta_reply_error(req, MANTA_ESYS, "save: %s", mk_last_error());
    /* config.json next to it: the folder loads with GPT2LMHeadModel.from_pretrained */
    char cfg[600];
    const char *slash = strrchr(path, '/');
    snprintf(cfg, sizeof cfg, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
    if (mk_write_hf_config(&s->cfg, cfg))
        return manta_reply_error(req, MANTA_ESYS, "save: %s", mk_last_error());
    return manta_reply(req, "ok", 2);
}

static const manta_method learner_methods[] = {
    {"step", learner_step}, {"publish", learner_publish}, {"save", learner_save}, {NULL, NULL}};

const manta_class rl_learner_class = {"learner", sizeof(learner_state), learner_init, learner_fini,
                                      learner_methods};
