/*
 * traj.c - one episode's trajectory and its msgpack codec.
 *
 * The wire form is a msgpack map (schema in README.md): scalars by name and
 * the per-token columns as little-endian binary arrays ("tok" int32, "logp"
 * float32, "ver" int32, "mask" uint8), so a 1000-token episode is one
 * compact message that any language can read with a msgpack library.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

void rl_traj_init(rl_traj *t)
{
    memset(t, 0, sizeof *t);
}

void rl_traj_destroy(rl_traj *t)
{
    if (!t) return;
    free(t->tok), free(t->logp), free(t->ver), free(t->mask);
    free(t->seg_start), free(t->seg_kind);
    memset(t, 0, sizeof *t);
}

void rl_traj_clear(rl_traj *t)
{
    t->n = 0, t->n_seg = 0;
    t->reward = 0, t->status = RL_EP_OK, t->tool_calls = t->tool_errors = 0, t->truncated = 0;
    t->answer[0] = t->error[0] = 0;
}

static int grow_tokens(rl_traj *t, int need)
{
    if (need <= t->cap) return 0;
    int cap = t->cap ? t->cap : 64;
    while (cap < need) cap *= 2;
    int32_t *tok = realloc(t->tok, (size_t)cap * sizeof *tok);
    if (tok) t->tok = tok;
    float *lp = realloc(t->logp, (size_t)cap * sizeof *lp);
    if (lp) t->logp = lp;
    int32_t *ver = realloc(t->ver, (size_t)cap * sizeof *ver);
    if (ver) t->ver = ver;
    uint8_t *mask = realloc(t->mask, (size_t)cap);
    if (mask) t->mask = mask;
    if (!tok || !lp || !ver || !mask) return -1;
    t->cap = cap;
    return 0;
}

static int push_seg(rl_traj *t, int start, int kind)
{
    if (t->n_seg == t->seg_cap) {
        int cap = t->seg_cap ? t->seg_cap * 2 : 8;
        int32_t *s = realloc(t->seg_start, (size_t)cap * sizeof *s);
        if (s) t->seg_start = s;
        uint8_t *k = realloc(t->seg_kind, (size_t)cap);
        if (k) t->seg_kind = k;
        if (!s || !k) return -1;
        t->seg_cap = cap;
    }
    t->seg_start[t->n_seg] = start;
    t->seg_kind[t->n_seg++] = (uint8_t)kind;
    return 0;
}

int rl_traj_push(rl_traj *t, int32_t tok, float logp, int32_t ver, uint8_t mask, int kind)
{
    if (grow_tokens(t, t->n + 1) ||
        ((t->n_seg == 0 || t->seg_kind[t->n_seg - 1] != kind) && push_seg(t, t->n, kind)))
        return rl_fail(MANTA_ENOMEM, "trajectory of episode %lld: out of memory at %d tokens",
                       (long long)t->episode, t->n);
    t->tok[t->n] = tok, t->logp[t->n] = logp, t->ver[t->n] = ver, t->mask[t->n] = mask;
    t->n++;
    return 0;
}

int32_t rl_traj_min_version(const rl_traj *t)
{
    int32_t v = -1;
    for (int i = 0; i < t->n; i++)
        if (t->mask[i] && t->ver[i] >= 0 && (v < 0 || t->ver[i] < v)) v = t->ver[i];
    return v;
}

int32_t rl_traj_max_version(const rl_traj *t)
{
    int32_t v = -1;
    for (int i = 0; i < t->n; i++)
        if (t->mask[i] && t->ver[i] > v) v = t->ver[i];
    return v;
}

int rl_traj_trained_tokens(const rl_traj *t)
{
    int n = 0;
    for (int i = 0; i < t->n; i++) n += t->mask[i] != 0;
    return n;
}

void rl_traj_final_text(const rl_traj *t, char *out, size_t cap)
{
    size_t k = 0;
    if (cap == 0) return;
    out[0] = 0;
    if (t->n_seg == 0 || t->seg_kind[t->n_seg - 1] != RL_SEG_POLICY) return;
    for (int i = t->seg_start[t->n_seg - 1]; i < t->n && k + 1 < cap; i++)
        if (t->tok[i] < 256) out[k++] = (char)t->tok[i];
    out[k] = 0;
    /* trim */
    size_t s = 0;
    while (s < k && (out[s] == ' ' || out[s] == '\n' || out[s] == '\t' || out[s] == '\r')) s++;
    while (k > s &&
           (out[k - 1] == ' ' || out[k - 1] == '\n' || out[k - 1] == '\t' || out[k - 1] == '\r'))
        k--;
    memmove(out, out + s, k - s);
    out[k - s] = 0;
}

void rl_traj_render(const rl_traj *t, char *out, size_t cap)
{
    static const char *const names[] = {"<bos>", "<eos>", "<call>", "</call>"};
    size_t k = 0;
    for (int i = 0; i < t->n && k + 14 < cap; i++) {
        int c = t->tok[i];
        if (c >= RL_VOCAB) /* a tokenizer's id: shown as a number */
            k += (size_t)snprintf(out + k, cap - k, "<%d>", c);
        else if (c >= 256)
            k += (size_t)snprintf(out + k, cap - k, "%s", names[c - 256]);
        else if (c == '\n')
            k += (size_t)snprintf(out + k, cap - k, "\\n");
        else if (c >= 32 && c < 127)
            out[k++] = (char)c;
        else
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
    }
    out[k < cap ? k : cap - 1] = 0;
}

int rl_tokenize(const char *text, int32_t *out, int cap)
{
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && n < cap; p++) out[n++] = *p;
    return n;
}

/* ---- codec ---- */

int rl_traj_encode(const rl_traj *t, char **out, size_t *len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 19);
    rl_pack_kv_int(&pk, "schema", 1);
    rl_pack_kv_int(&pk, "episode", t->episode);
    rl_pack_kv_int(&pk, "group", t->group);
    rl_pack_kv_int(&pk, "prompt", t->prompt);
    rl_pack_kv_int(&pk, "eval", t->eval);
    rl_pack_kv_bin(&pk, "tok", t->tok, (size_t)t->n * 4);
    rl_pack_kv_bin(&pk, "logp", t->logp, (size_t)t->n * 4);
    rl_pack_kv_bin(&pk, "ver", t->ver, (size_t)t->n * 4);
    rl_pack_kv_bin(&pk, "mask", t->mask, (size_t)t->n);
    rl_pack_str(&pk, "segments");
    msgpack_pack_array(&pk, (size_t)t->n_seg);
    for (int i = 0; i < t->n_seg; i++) {
        msgpack_pack_array(&pk, 2);
        msgpack_pack_int32(&pk, t->seg_start[i]);
        rl_pack_str(&pk, t->seg_kind[i] == RL_SEG_PROMPT   ? "prompt"
                         : t->seg_kind[i] == RL_SEG_POLICY ? "policy"
                                                           : "tool");
    }
    rl_pack_str(&pk, "reward");
    msgpack_pack_float(&pk, t->reward);
    rl_pack_kv_str(&pk, "status", t->status == RL_EP_OK ? "ok" : "error");
    rl_pack_kv_int(&pk, "tool_calls", t->tool_calls);
    rl_pack_kv_int(&pk, "tool_errors", t->tool_errors);
    rl_pack_kv_int(&pk, "truncated", t->truncated);
    rl_pack_kv_str(&pk, "answer", t->answer);
    rl_pack_kv_str(&pk, "error", t->error);
    rl_pack_kv_str(&pk, "rollout", t->rollout);
    rl_pack_kv_int(&pk, "min_version", rl_traj_min_version(t));
    *out = sb.data, *len = sb.size;
    return sb.data ? 0 : rl_fail(MANTA_ENOMEM, "trajectory: out of memory while encoding");
}

static void copy_str(char *dst, size_t cap, const msgpack_object *o)
{
    dst[0] = 0;
    if (o && o->type == MSGPACK_OBJECT_STR) {
        size_t n = o->via.str.size < cap - 1 ? o->via.str.size : cap - 1;
        memcpy(dst, o->via.str.ptr, n);
        dst[n] = 0;
    }
}

int rl_traj_decode(rl_traj *t, const void *buf, size_t len)
{
    return rl_traj_decode_vocab(t, buf, len, RL_VOCAB);
}

int rl_traj_decode_vocab(rl_traj *t, const void *buf, size_t len, int32_t vocab)
{
    rl_traj_clear(t);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = MANTA_EINVAL;
    const char *why = "not a map";
    if (rl_unpack(&u, buf, len) != 0) {
        why = "not well-formed msgpack";
        goto bad;
    }
    const msgpack_object *o = &u.data;
    if (o->type != MSGPACK_OBJECT_MAP) goto bad;
    const msgpack_object *tok = rl_mp_get(o, "tok"), *lp = rl_mp_get(o, "logp"),
                         *ver = rl_mp_get(o, "ver"), *mask = rl_mp_get(o, "mask");
    if (!tok || !lp || !ver || !mask || tok->type != MSGPACK_OBJECT_BIN ||
        lp->type != MSGPACK_OBJECT_BIN || ver->type != MSGPACK_OBJECT_BIN ||
        mask->type != MSGPACK_OBJECT_BIN) {
        why = "tok, logp, ver and mask must be binary columns";
        goto bad;
    }
    uint32_t n = mask->via.bin.size;
    why = "columns of unequal length";
    if (tok->via.bin.size != 4 * n || lp->via.bin.size != 4 * n || ver->via.bin.size != 4 * n)
        goto bad;
    why = "out of memory";
    if (n > INT32_MAX / 4 || grow_tokens(t, (int)n)) {
        rc = n > INT32_MAX / 4 ? MANTA_EINVAL : MANTA_ENOMEM;
        goto bad;
    }
    memcpy(t->tok, tok->via.bin.ptr, 4 * (size_t)n);
    memcpy(t->logp, lp->via.bin.ptr, 4 * (size_t)n);
    memcpy(t->ver, ver->via.bin.ptr, 4 * (size_t)n);
    memcpy(t->mask, mask->via.bin.ptr, n);
    t->n = (int)n;
    why = "a token id outside the vocabulary";
    for (int i = 0; i < t->n; i++)
        if (t->tok[i] < 0 || t->tok[i] >= vocab) goto bad;
    why = "segments: each must be [start inside the episode, kind]";
    const msgpack_object *segs = rl_mp_get(o, "segments");
    if (segs && segs->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < segs->via.array.size; i++) {
            const msgpack_object *s = &segs->via.array.ptr[i];
            if (s->type != MSGPACK_OBJECT_ARRAY || s->via.array.size != 2) goto bad;
            int64_t start = rl_mp_int(&s->via.array.ptr[0], -1);
            char kind[16];
            copy_str(kind, sizeof kind, &s->via.array.ptr[1]);
            if (start < 0 || start > t->n) goto bad;
            if (push_seg(t, (int)start,
                         !strcmp(kind, "prompt")   ? RL_SEG_PROMPT
                         : !strcmp(kind, "policy") ? RL_SEG_POLICY
                                                   : RL_SEG_TOOL))
                goto bad;
        }
    }
    t->episode = rl_mp_int(rl_mp_get(o, "episode"), -1);
    t->group = rl_mp_int(rl_mp_get(o, "group"), -1);
    t->prompt = (int32_t)rl_mp_int(rl_mp_get(o, "prompt"), -1);
    t->eval = (int)rl_mp_int(rl_mp_get(o, "eval"), 0);
    t->reward = (float)rl_mp_num(rl_mp_get(o, "reward"), 0);
    char st[16];
    copy_str(st, sizeof st, rl_mp_get(o, "status"));
    t->status = !strcmp(st, "ok") ? RL_EP_OK : RL_EP_ERROR;
    t->tool_calls = (int)rl_mp_int(rl_mp_get(o, "tool_calls"), 0);
    t->tool_errors = (int)rl_mp_int(rl_mp_get(o, "tool_errors"), 0);
    t->truncated = (int)rl_mp_int(rl_mp_get(o, "truncated"), 0);
    copy_str(t->answer, sizeof t->answer, rl_mp_get(o, "answer"));
    copy_str(t->error, sizeof t->error, rl_mp_get(o, "error"));
    copy_str(t->rollout, sizeof t->rollout, rl_mp_get(o, "rollout"));
    msgpack_unpacked_destroy(&u);
    return 0;
bad:
    rl_traj_clear(t);
    msgpack_unpacked_destroy(&u);
    return rl_fail(rc, "trajectory: %s", why);
}
