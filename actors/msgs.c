/*
 * msgs.c - the codecs of the messages the RL actors exchange besides
 * trajectories (traj.c): admit (rollout -> controller and its reply), step
 * (controller -> learner and its reply, which is also the answer of
 * "publish") and the weight-bucket list both replies carry.
 *
 * One encoder and one decoder per message, so each shape is written once.
 * Decoders take untrusted bytes: rl_unpack() walks them with bounds first,
 * then every field is checked for presence and type; a violation returns
 * MANTA_EINVAL with a message naming the message and the field in
 * rl_last_error(), and leaves the output empty (safe to destroy). Unknown
 * keys are ignored, so a newer peer may add fields.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <msgpack.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- field readers: required unless `opt`, typed, named in errors ---- */

static int bad(const char *msg, const char *key, const char *want, const msgpack_object *v)
{
    char d[64];
    if (!v) return rl_fail(MANTA_EINVAL, "%s: missing \"%s\"", msg, key);
    return rl_fail(MANTA_EINVAL, "%s.%s: expected %s, got %s", msg, key, want,
                   rl_mp_describe(v, d, sizeof d));
}

static int get_int(const msgpack_object *m, const char *msg, const char *key, int64_t *out)
{
    const msgpack_object *v = rl_mp_get(m, key);
    if (v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX)
        *out = (int64_t)v->via.u64;
    else if (v && v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        *out = v->via.i64;
    else if (v && v->type == MSGPACK_OBJECT_BOOLEAN)
        *out = v->via.boolean;
    else
        return bad(msg, key, "an integer", v);
    return 0;
}

static int get_num(const msgpack_object *m, const char *msg, const char *key, double *out)
{
    const msgpack_object *v = rl_mp_get(m, key);
    if (v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        *out = (double)v->via.u64;
    else if (v && v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        *out = (double)v->via.i64;
    else if (v && (v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64))
        *out = v->via.f64;
    else
        return bad(msg, key, "a number", v);
    return 0;
}

/* A string into out[cap]: longer is an error, not a truncation. */
static int get_str(const msgpack_object *m, const char *msg, const char *key, char *out, size_t cap)
{
    const msgpack_object *v = rl_mp_get(m, key);
    if (!v || v->type != MSGPACK_OBJECT_STR) return bad(msg, key, "a string", v);
    if (v->via.str.size >= cap)
        return rl_fail(MANTA_EINVAL, "%s.%s: longer than %zu bytes", msg, key, cap - 1);
    memcpy(out, v->via.str.ptr, v->via.str.size);
    out[v->via.str.size] = 0;
    return 0;
}

/* A string copied to the heap. */
static int get_dup(const msgpack_object *m, const char *msg, const char *key, char **out)
{
    const msgpack_object *v = rl_mp_get(m, key);
    if (!v || v->type != MSGPACK_OBJECT_STR) return bad(msg, key, "a string", v);
    *out = malloc(v->via.str.size + 1);
    if (!*out) return rl_fail(MANTA_ENOMEM, "%s.%s: out of memory", msg, key);
    memcpy(*out, v->via.str.ptr, v->via.str.size);
    (*out)[v->via.str.size] = 0;
    return 0;
}

static const msgpack_object *get_typed(const msgpack_object *m, const char *msg, const char *key,
                                       msgpack_object_type type, const char *want, int *rc)
{
    const msgpack_object *v = rl_mp_get(m, key);
    if (v && v->type == type) return v;
    *rc = bad(msg, key, want, v);
    return NULL;
}

/* ---- weight buckets ---- */

void rl_buckets_destroy(rl_buckets *b)
{
    if (!b) return;
    free(b->v);
    memset(b, 0, sizeof *b);
}

int rl_buckets_push(rl_buckets *b, const rl_bucket *x)
{
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 16;
        rl_bucket *v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) return rl_fail(MANTA_ENOMEM, "weight buckets: out of memory at %d", b->n);
        b->v = v, b->cap = cap;
    }
    b->v[b->n++] = *x;
    return 0;
}

int rl_buckets_append(rl_buckets *dst, const rl_buckets *src)
{
    for (int i = 0; i < src->n; i++) {
        int rc = rl_buckets_push(dst, &src->v[i]);
        if (rc) return rc;
    }
    return 0;
}

static void pack_buckets(msgpack_packer *pk, const rl_buckets *b)
{
    rl_pack_str(pk, "buckets");
    msgpack_pack_array(pk, (size_t)b->n);
    for (int i = 0; i < b->n; i++) {
        const rl_bucket *x = &b->v[i];
        msgpack_pack_map(pk, 4 + (x->has_share ? 1 : 0) + (x->bf16 ? 1 : 0));
        rl_pack_kv_str(pk, "id", x->id.s);
        rl_pack_kv_int(pk, "offset", x->offset);
        rl_pack_kv_int(pk, "count", x->count);
        rl_pack_kv_int(pk, "crc", x->crc);
        if (x->bf16) rl_pack_kv_str(pk, "dtype", "bf16"); /* absent: f32 */
        if (!x->has_share) continue;
        rl_pack_str(pk, "share");
        msgpack_pack_map(pk, 4);
        rl_pack_kv_bin(pk, "handle", x->share, RL_SHARE_BYTES);
        rl_pack_kv_str(pk, "host", x->share_host);
        rl_pack_kv_int(pk, "seq", x->share_seq);
        rl_pack_kv_int(pk, "off", x->share_off);
    }
}

/* A bucket's optional "share": {handle (bin, RL_SHARE_BYTES), host, seq, off}. */
static int read_share(const msgpack_object *e, const char *what, rl_bucket *b)
{
    const msgpack_object *sh = rl_mp_get(e, "share");
    if (!sh) return 0;
    char w[128];
    snprintf(w, sizeof w, "%s.share", what);
    if (sh->type != MSGPACK_OBJECT_MAP) return rl_fail(MANTA_EINVAL, "%s: expected a map", w);
    const msgpack_object *h = rl_mp_get(sh, "handle");
    if (!h || h->type != MSGPACK_OBJECT_BIN || h->via.bin.size != RL_SHARE_BYTES)
        return rl_fail(MANTA_EINVAL, "%s.handle: expected %d bytes of bin", w, RL_SHARE_BYTES);
    memcpy(b->share, h->via.bin.ptr, RL_SHARE_BYTES);
    int rc = get_str(sh, w, "host", b->share_host, sizeof b->share_host);
    if (!rc) rc = get_int(sh, w, "seq", &b->share_seq);
    if (!rc) rc = get_int(sh, w, "off", &b->share_off);
    if (!rc && (b->share_seq < 0 || b->share_off < 0))
        rc = rl_fail(MANTA_EINVAL, "%s: seq or off below 0", w);
    if (!rc) b->has_share = 1;
    return rc;
}

/* Append the array `arr` of bucket maps to out. */
static int read_buckets(const msgpack_object *arr, const char *msg, rl_buckets *out)
{
    char what[96];
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *e = &arr->via.array.ptr[i];
        snprintf(what, sizeof what, "%s.buckets[%u]", msg, i);
        if (e->type != MSGPACK_OBJECT_MAP) return rl_fail(MANTA_EINVAL, "%s: expected a map", what);
        rl_bucket b;
        memset(&b, 0, sizeof b);
        int64_t crc;
        int rc = get_str(e, what, "id", b.id.s, sizeof b.id.s);
        if (!rc) rc = get_int(e, what, "offset", &b.offset);
        if (!rc) rc = get_int(e, what, "count", &b.count);
        if (!rc) rc = get_int(e, what, "crc", &crc);
        if (!rc) rc = read_share(e, what, &b);
        if (!rc && rl_mp_get(e, "dtype")) {
            char dt[8];
            rc = get_str(e, what, "dtype", dt, sizeof dt);
            if (!rc && strcmp(dt, "bf16") && strcmp(dt, "f32"))
                rc = rl_fail(MANTA_EINVAL, "%s.dtype: '%s': expected f32 or bf16", what, dt);
            b.bf16 = !rc && !strcmp(dt, "bf16");
        }
        if (rc) return rc;
        if (b.offset < 0 || b.count < 0 || crc < 0 || crc > UINT32_MAX)
            return rl_fail(MANTA_EINVAL, "%s: offset, count or crc out of range", what);
        b.crc = (uint32_t)crc;
        if ((rc = rl_buckets_push(out, &b))) return rc;
    }
    return 0;
}

/* ---- shared plumbing ---- */

typedef struct enc {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} enc;

static msgpack_packer *enc_begin(enc *e)
{
    msgpack_sbuffer_init(&e->sb);
    msgpack_packer_init(&e->pk, &e->sb, msgpack_sbuffer_write);
    return &e->pk;
}

static int enc_end(enc *e, const char *msg, char **out, size_t *len)
{
    *out = e->sb.data, *len = e->sb.size;
    if (!e->sb.data) return rl_fail(MANTA_ENOMEM, "%s: out of memory while encoding", msg);
    return 0;
}

/* Unpack buf as a map; 0 or MANTA_EINVAL naming msg. */
static int open_map(msgpack_unpacked *u, const void *buf, size_t len, const char *msg)
{
    msgpack_unpacked_init(u);
    if (rl_unpack(u, buf, len)) {
        char why[256];
        snprintf(why, sizeof why, "%s", rl_last_error());
        return rl_fail(MANTA_EINVAL, "%s: %s", msg, why);
    }
    if (u->data.type != MSGPACK_OBJECT_MAP) return rl_fail(MANTA_EINVAL, "%s: expected a map", msg);
    return 0;
}

/* ---- admit ---- */

int rl_admit_req_encode(const rl_admit_req *r, char **out, size_t *len)
{
    enc e;
    msgpack_packer *pk = enc_begin(&e);
    msgpack_pack_map(pk, 3);
    rl_pack_kv_str(pk, "rollout", r->rollout);
    rl_pack_kv_int(pk, "groups", r->groups);
    rl_pack_kv_int(pk, "version", r->version);
    return enc_end(&e, "admit", out, len);
}

int rl_admit_req_decode(rl_admit_req *r, const void *buf, size_t len)
{
    static const char msg[] = "admit";
    msgpack_unpacked u;
    memset(r, 0, sizeof *r);
    int rc = open_map(&u, buf, len, msg);
    if (!rc) rc = get_str(&u.data, msg, "rollout", r->rollout, sizeof r->rollout);
    if (!rc) rc = get_int(&u.data, msg, "groups", &r->groups);
    if (!rc) rc = get_int(&u.data, msg, "version", &r->version);
    if (!rc && r->groups < 0) rc = rl_fail(MANTA_EINVAL, "admit.groups: negative");
    msgpack_unpacked_destroy(&u);
    if (rc) memset(r, 0, sizeof *r);
    return rc;
}

void rl_admit_reply_destroy(rl_admit_reply *r)
{
    if (!r) return;
    for (int i = 0; r->eps && i < r->n_eps; i++) free(r->eps[i].text), free(r->eps[i].reference);
    free(r->eps);
    rl_buckets_destroy(&r->buckets);
    memset(r, 0, sizeof *r);
}

int rl_admit_reply_encode(const rl_admit_reply *r, char **out, size_t *len)
{
    enc e;
    msgpack_packer *pk = enc_begin(&e);
    msgpack_pack_map(pk, 3 + (r->has_buckets ? 1 : 0));
    rl_pack_kv_int(pk, "version", r->version);
    rl_pack_kv_int(pk, "stop", r->stop);
    if (r->has_buckets) pack_buckets(pk, &r->buckets);
    rl_pack_str(pk, "episodes");
    msgpack_pack_array(pk, (size_t)r->n_eps);
    for (int i = 0; i < r->n_eps; i++) {
        const rl_admit_ep *ep = &r->eps[i];
        msgpack_pack_map(pk, 6);
        rl_pack_kv_int(pk, "episode", ep->episode);
        rl_pack_kv_int(pk, "group", ep->group);
        rl_pack_kv_int(pk, "prompt", ep->prompt);
        rl_pack_kv_str(pk, "text", ep->text);
        rl_pack_kv_str(pk, "reference", ep->reference);
        rl_pack_kv_int(pk, "eval", ep->eval);
    }
    return enc_end(&e, "admit reply", out, len);
}

static int read_episode(const msgpack_object *o, uint32_t i, rl_admit_ep *ep)
{
    char what[64];
    snprintf(what, sizeof what, "admit reply.episodes[%u]", i);
    if (o->type != MSGPACK_OBJECT_MAP) return rl_fail(MANTA_EINVAL, "%s: expected a map", what);
    int64_t prompt, eval;
    int rc = get_int(o, what, "episode", &ep->episode);
    if (!rc) rc = get_int(o, what, "group", &ep->group);
    if (!rc) rc = get_int(o, what, "prompt", &prompt);
    if (!rc) rc = get_int(o, what, "eval", &eval);
    if (!rc) rc = get_dup(o, what, "text", &ep->text);
    if (!rc) rc = get_dup(o, what, "reference", &ep->reference);
    if (rc) return rc;
    if (ep->episode < 0 || prompt < 0 || prompt > INT32_MAX)
        return rl_fail(MANTA_EINVAL, "%s: episode or prompt out of range", what);
    ep->prompt = (int32_t)prompt, ep->eval = eval != 0;
    return 0;
}

int rl_admit_reply_decode(rl_admit_reply *r, const void *buf, size_t len)
{
    static const char msg[] = "admit reply";
    msgpack_unpacked u;
    memset(r, 0, sizeof *r);
    int rc = open_map(&u, buf, len, msg);
    int64_t stop = 0;
    const msgpack_object *eps = NULL, *bs = NULL;
    if (!rc) rc = get_int(&u.data, msg, "version", &r->version);
    if (!rc) rc = get_int(&u.data, msg, "stop", &stop);
    if (!rc) eps = get_typed(&u.data, msg, "episodes", MSGPACK_OBJECT_ARRAY, "an array", &rc);
    if (!rc && rl_mp_get(&u.data, "buckets"))
        bs = get_typed(&u.data, msg, "buckets", MSGPACK_OBJECT_ARRAY, "an array", &rc);
    if (!rc && bs) r->has_buckets = 1, rc = read_buckets(bs, msg, &r->buckets);
    r->stop = stop != 0;
    if (!rc && eps->via.array.size) {
        r->eps = calloc(eps->via.array.size, sizeof *r->eps);
        if (!r->eps) rc = rl_fail(MANTA_ENOMEM, "admit reply: out of memory");
    }
    for (uint32_t i = 0; !rc && i < eps->via.array.size; i++) {
        rc = read_episode(&eps->via.array.ptr[i], i, &r->eps[i]);
        r->n_eps = (int)i + 1; /* destroy frees what was copied */
    }
    msgpack_unpacked_destroy(&u);
    if (rc) rl_admit_reply_destroy(r);
    return rc;
}

/* ---- step ---- */

void rl_step_req_destroy(rl_step_req *r)
{
    if (!r) return;
    for (int i = 0; r->items && i < r->n_items; i++) free((void *)r->items[i].tok);
    free(r->items);
    memset(r, 0, sizeof *r);
}

int rl_step_req_encode(const rl_step_req *r, char **out, size_t *len)
{
    enc e;
    msgpack_packer *pk = enc_begin(&e);
    msgpack_pack_map(pk, 4);
    rl_pack_kv_str(pk, "mode", r->mode == RL_STEP_SFT ? "sft" : "ppo");
    rl_pack_kv_int(pk, "version", r->version);
    rl_pack_kv_num(pk, "lr", r->lr);
    rl_pack_str(pk, "items");
    msgpack_pack_array(pk, (size_t)r->n_items);
    for (int k = 0; k < r->n_items; k++) {
        const rl_step_item *it = &r->items[k];
        msgpack_pack_map(pk, 4);
        rl_pack_kv_bin(pk, "tok", it->tok, (size_t)it->n * 4);
        rl_pack_kv_bin(pk, "logp", it->logp, it->logp ? (size_t)it->n * 4 : 0);
        rl_pack_kv_bin(pk, "mask", it->mask, (size_t)it->n);
        rl_pack_kv_num(pk, "adv", it->adv);
    }
    return enc_end(&e, "step", out, len);
}

/* One item: tok n x int32 in [0, vocab), logp empty or n x float32,
 * mask n bytes; copied into one allocation owned by it->tok. */
static int read_item(const msgpack_object *o, uint32_t i, int32_t vocab, rl_step_item *it)
{
    char what[48];
    int rc = 0;
    snprintf(what, sizeof what, "step.items[%u]", i);
    if (o->type != MSGPACK_OBJECT_MAP) return rl_fail(MANTA_EINVAL, "%s: expected a map", what);
    const msgpack_object *tok = get_typed(o, what, "tok", MSGPACK_OBJECT_BIN, "binary", &rc);
    const msgpack_object *lp =
        rc ? NULL : get_typed(o, what, "logp", MSGPACK_OBJECT_BIN, "binary", &rc);
    const msgpack_object *mk =
        rc ? NULL : get_typed(o, what, "mask", MSGPACK_OBJECT_BIN, "binary", &rc);
    double adv = 0;
    if (!rc) rc = get_num(o, what, "adv", &adv);
    if (rc) return rc;
    uint32_t n = mk->via.bin.size;
    if (tok->via.bin.size != 4 * (uint64_t)n || (lp->via.bin.size && lp->via.bin.size != 4 * n))
        return rl_fail(MANTA_EINVAL,
                       "%s: columns of unequal length (tok %u bytes, logp %u, mask %u)", what,
                       tok->via.bin.size, lp->via.bin.size, n);
    size_t bytes = (size_t)n * (4 + 4 + 1);
    char *mem = malloc(bytes ? bytes : 1);
    if (!mem) return rl_fail(MANTA_ENOMEM, "%s: out of memory", what);
    int32_t *t = (int32_t *)mem;
    float *l = (float *)(mem + (size_t)n * 4);
    uint8_t *m = (uint8_t *)(mem + (size_t)n * 8);
    memcpy(t, tok->via.bin.ptr, (size_t)n * 4);
    memcpy(m, mk->via.bin.ptr, n);
    if (lp->via.bin.size) memcpy(l, lp->via.bin.ptr, (size_t)n * 4);
    *it = (rl_step_item){(int)n, t, lp->via.bin.size ? l : NULL, m, (float)adv};
    for (uint32_t k = 0; k < n; k++)
        if (t[k] < 0 || t[k] >= vocab)
            return rl_fail(MANTA_EINVAL, "%s.tok[%u]: %d is not a token id", what, k, t[k]);
    return 0;
}

int rl_step_req_decode(rl_step_req *r, const void *buf, size_t len)
{
    return rl_step_req_decode_vocab(r, buf, len, RL_VOCAB);
}

int rl_step_req_decode_vocab(rl_step_req *r, const void *buf, size_t len, int32_t vocab)
{
    static const char msg[] = "step";
    msgpack_unpacked u;
    memset(r, 0, sizeof *r);
    int rc = open_map(&u, buf, len, msg);
    char mode[8];
    const msgpack_object *items = NULL;
    if (!rc) rc = get_str(&u.data, msg, "mode", mode, sizeof mode);
    if (!rc && strcmp(mode, "ppo") && strcmp(mode, "sft"))
        rc = rl_fail(MANTA_EINVAL, "step.mode: \"%s\" is neither \"ppo\" nor \"sft\"", mode);
    if (!rc) r->mode = strcmp(mode, "sft") ? RL_STEP_PPO : RL_STEP_SFT;
    if (!rc) rc = get_int(&u.data, msg, "version", &r->version);
    if (!rc) rc = get_num(&u.data, msg, "lr", &r->lr);
    if (!rc) items = get_typed(&u.data, msg, "items", MSGPACK_OBJECT_ARRAY, "an array", &rc);
    if (!rc && items->via.array.size) {
        r->items = calloc(items->via.array.size, sizeof *r->items);
        if (!r->items) rc = rl_fail(MANTA_ENOMEM, "step: out of memory");
    }
    for (uint32_t i = 0; !rc && i < items->via.array.size; i++) {
        rc = read_item(&items->via.array.ptr[i], i, vocab, &r->items[i]);
        r->n_items = (int)i + 1;
    }
    msgpack_unpacked_destroy(&u);
    if (rc) rl_step_req_destroy(r);
    return rc;
}

void rl_step_reply_destroy(rl_step_reply *r)
{
    if (!r) return;
    rl_buckets_destroy(&r->buckets);
    memset(r, 0, sizeof *r);
}

/* The statistics of a step reply, in wire order. */
static const struct {
    const char *key;
    size_t off;
} step_stats[] = {
    {"loss", offsetof(rl_step_reply, loss)},
    {"pg_loss", offsetof(rl_step_reply, pg_loss)},
    {"kl", offsetof(rl_step_reply, kl)},
    {"clip_frac", offsetof(rl_step_reply, clip_frac)},
    {"entropy", offsetof(rl_step_reply, entropy)},
    {"ratio", offsetof(rl_step_reply, ratio)},
    {"tokens", offsetof(rl_step_reply, tokens)},
    {"grad_norm", offsetof(rl_step_reply, grad_norm)},
    {"busy_s", offsetof(rl_step_reply, busy_s)},
    {"reproduced", offsetof(rl_step_reply, reproduced)},
};
#define N_STATS (sizeof step_stats / sizeof step_stats[0])

int rl_step_reply_encode(const rl_step_reply *r, char **out, size_t *len)
{
    enc e;
    msgpack_packer *pk = enc_begin(&e);
    msgpack_pack_map(pk, 2 + N_STATS);
    rl_pack_kv_int(pk, "version", r->version);
    pack_buckets(pk, &r->buckets);
    for (size_t i = 0; i < N_STATS; i++)
        rl_pack_kv_num(pk, step_stats[i].key,
                       *(const double *)((const char *)r + step_stats[i].off));
    return enc_end(&e, "step reply", out, len);
}

int rl_step_reply_decode(rl_step_reply *r, const void *buf, size_t len)
{
    static const char msg[] = "step reply";
    msgpack_unpacked u;
    memset(r, 0, sizeof *r);
    int rc = open_map(&u, buf, len, msg);
    const msgpack_object *bs = NULL;
    if (!rc) rc = get_int(&u.data, msg, "version", &r->version);
    if (!rc) bs = get_typed(&u.data, msg, "buckets", MSGPACK_OBJECT_ARRAY, "an array", &rc);
    if (!rc) rc = read_buckets(bs, msg, &r->buckets);
    for (size_t i = 0; !rc && i < N_STATS; i++)
        rc = get_num(&u.data, msg, step_stats[i].key, (double *)((char *)r + step_stats[i].off));
    msgpack_unpacked_destroy(&u);
    if (rc) rl_step_reply_destroy(r);
    return rc;
}
