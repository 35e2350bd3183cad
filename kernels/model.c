/*
 * model.c - the GPT-2 model object: its size table, its four allocations,
 * and the training graph (forward, losses, backward, AdamW step) written once
 * against the back-end table.
 *
 * Parameters, gradients and the two AdamW moments are each one back-end
 * allocation of n_params floats, laid out tensor by tensor in Hugging Face
 * checkpoint order (see manta_kernels.h).  Activations are one allocation
 * sized for max_batch x max_seq; a forward pass over a smaller batch uses the
 * front of each region.  The losses work in two halves: the back-end computes
 * per-row log-probs and entropies, the host turns them into the loss and a
 * per-row coefficient, and the back-end expands those coefficients into the
 * gradient of the logits.  Only [B,T] scalars cross between host and device.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mk_internal.h"

/* ---- configuration and size table --------------------------------------- */

const char *mk_arch_name(mk_arch a)
{
    switch (a) {
    case MK_ARCH_GPT2:
        return "gpt2";
    case MK_ARCH_LLAMA:
        return "llama";
    case MK_ARCH_QWEN2:
        return "qwen2";
    case MK_ARCH_QWEN3:
        return "qwen3";
    }
    return "?";
}

int mk_config_resolve(const mk_config *c, mk_config *out)
{
    if (!c || !out) return mk__fail(MK_ERR_ARG, "config is NULL");
    mk_config r = *c;
    if (r.arch < MK_ARCH_GPT2 || r.arch > MK_ARCH_QWEN3)
        return mk__fail(MK_ERR_ARG, "config: unknown arch %d", (int)r.arch);
    const char *an = mk_arch_name(r.arch);
    if (r.n_layer <= 0 || r.n_head <= 0 || r.n_embd <= 0 || r.block_size <= 0 || r.vocab_size <= 0)
        return mk__fail(MK_ERR_ARG,
                        "config fields must be positive (n_layer %d n_head %d n_embd %d "
                        "block_size %d vocab_size %d)",
                        r.n_layer, r.n_head, r.n_embd, r.block_size, r.vocab_size);
    if (r.n_kv_head < 0 || r.head_dim < 0 || r.n_inner < 0 || r.norm_eps < 0 || r.rope_theta < 0)
        return mk__fail(MK_ERR_ARG,
                        "config (%s): n_kv_head, head_dim, n_inner, norm_eps and "
                        "rope_theta must not be negative",
                        an);
    if (!r.n_kv_head) r.n_kv_head = r.n_head;
    if (!r.head_dim) {
        if (r.n_embd % r.n_head)
            return mk__fail(MK_ERR_ARG, "n_head %d does not divide n_embd %d", r.n_head, r.n_embd);
        r.head_dim = r.n_embd / r.n_head;
    }
    if (r.n_head % r.n_kv_head)
        return mk__fail(MK_ERR_ARG, "config (%s): n_kv_head %d does not divide n_head %d", an,
                        r.n_kv_head, r.n_head);
    if (r.arch == MK_ARCH_GPT2) {
        if (r.n_kv_head != r.n_head || r.head_dim * r.n_head != r.n_embd)
            return mk__fail(MK_ERR_ARG, "config (gpt2): n_kv_head and head_dim must be 0 (all "
                                        "heads attend; head_dim = n_embd / n_head)");
        if (r.untied_head || r.rope_theta != 0 || r.rope_factor != 0)
            return mk__fail(MK_ERR_ARG, "config (gpt2): untied_head and rope settings do not "
                                        "apply to gpt2");
        if (!r.n_inner) r.n_inner = 4 * r.n_embd;
        if (r.norm_eps == 0) r.norm_eps = 1e-5f;
        r.attn_bias = r.attn_out_bias = r.mlp_bias = 1;
    } else {
        if (!r.n_inner)
            return mk__fail(MK_ERR_ARG, "config (%s): n_inner (intermediate_size) is required", an);
        if (r.head_dim % 2)
            return mk__fail(MK_ERR_ARG, "config (%s): head_dim %d must be even (rotary pairs)", an,
                            r.head_dim);
        if (r.norm_eps == 0) r.norm_eps = 1e-6f;
        if (r.rope_theta == 0) r.rope_theta = 10000.0f;
        if (r.arch == MK_ARCH_QWEN2) r.attn_bias = 1;
        if (r.rope_factor != 0 &&
            (r.rope_factor < 0 || r.rope_low_freq_factor <= 0 ||
             r.rope_high_freq_factor <= r.rope_low_freq_factor || r.rope_orig_ctx <= 0))
            return mk__fail(MK_ERR_ARG,
                            "config (%s): llama3 rope scaling needs factor > 0, 0 < "
                            "low_freq_factor < high_freq_factor and original context > 0",
                            an);
    }
    r.untied_head = !!r.untied_head;
    r.attn_bias = !!r.attn_bias;
    r.attn_out_bias = !!r.attn_out_bias;
    r.mlp_bias = !!r.mlp_bias;
    if ((size_t)(r.n_head + 2 * r.n_kv_head) * r.head_dim > (size_t)1 << 24 ||
        (size_t)r.n_inner * 2 > (size_t)1 << 26)
        return mk__fail(MK_ERR_ARG, "config (%s): widths beyond this library's limits", an);
    *out = r;
    return MK_OK;
}

int mk_config_check(const mk_config *c)
{
    mk_config r;
    return mk_config_resolve(c, &r);
}

static const char *const gpt2_layer_names[MK_P_PER_LAYER] = {
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    NULL,
    NULL,
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
};
static const char *const rot_layer_names[MK_P_PER_LAYER] = {
    "input_norm.weight",  NULL,
    "attn.qkv.weight",    "attn.qkv.bias",
    "attn.q_norm.weight", "attn.k_norm.weight",
    "attn.o.weight",      "attn.o.bias",
    "post_norm.weight",   NULL,
    "mlp.gate_up.weight", "mlp.gate_up.bias",
    "mlp.down.weight",    "mlp.down.bias",
};

/* The tables a model is built from; every pointer may be NULL (then only counts). */
typedef struct table {
    mk_tensor_info *t;
    int n;
    size_t off;
    int *gidx, *lidx;
    mk__hf_map *hf;
    int n_hf;
} table;

/* Appends a tensor of d0 x d1 floats (d1 = 0: a vector of d0) named name; returns its index. */
static int add_tensor(table *tb, const char *name, int d0, int d1)
{
    size_t numel = (size_t)d0 * (d1 > 0 ? (size_t)d1 : 1);
    if (tb->t) {
        mk_tensor_info *e = &tb->t[tb->n];
        snprintf(e->name, sizeof e->name, "%s", name);
        e->offset = tb->off;
        e->ndim = d1 > 0 ? 2 : 1;
        e->shape[0] = d0;
        e->shape[1] = d1 > 0 ? d1 : 0;
        e->numel = numel;
    }
    tb->off += numel;
    return tb->n++;
}

/* Appends a checkpoint tensor: name (printf), shape d0 x d1 (d1 0: vector), over internal
 * tensor `tensor` by `kind` from column col0. */
static void add_hf(table *tb, int tensor, int kind, int col0, int d0, int d1, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void add_hf(table *tb, int tensor, int kind, int col0, int d0, int d1, const char *fmt, ...)
{
    if (tb->hf) {
        mk__hf_map *h = &tb->hf[tb->n_hf];
        memset(h, 0, sizeof *h);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(h->info.name, sizeof h->info.name, fmt, ap);
        va_end(ap);
        h->info.ndim = d1 > 0 ? 2 : 1;
        h->info.shape[0] = d0;
        h->info.shape[1] = d1 > 0 ? d1 : 0;
        h->info.numel = (size_t)d0 * (d1 > 0 ? (size_t)d1 : 1);
        h->tensor = tensor;
        h->kind = kind;
        h->col0 = col0;
    }
    tb->n_hf++;
}

static void set_g(table *tb, int k, int i)
{
    if (tb->gidx) tb->gidx[k] = i;
}

static void set_l(table *tb, int l, int k, int i)
{
    if (tb->lidx) tb->lidx[l * MK_P_PER_LAYER + k] = i;
}

/* GPT-2: internal tensors are the checkpoint's, in its order. */
static void build_gpt2(const mk_config *c, table *tb)
{
    int C = c->n_embd, F = c->n_inner;
    set_g(tb, MK_T_WTE, add_tensor(tb, "wte.weight", c->vocab_size, C));
    set_g(tb, MK_T_WPE, add_tensor(tb, "wpe.weight", c->block_size, C));
    const int d0[MK_P_PER_LAYER] = {C, C, C, 3 * C, 0, 0, C, C, C, C, C, F, F, C};
    const int d1[MK_P_PER_LAYER] = {0, 0, 3 * C, 0, 0, 0, C, 0, 0, 0, F, 0, C, 0};
    for (int l = 0; l < c->n_layer; l++)
        for (int k = 0; k < MK_P_PER_LAYER; k++) {
            if (!gpt2_layer_names[k]) continue;
            char name[sizeof tb->t->name];
            snprintf(name, sizeof name, "h.%d.%s", l, gpt2_layer_names[k]);
            set_l(tb, l, k, add_tensor(tb, name, d0[k], d1[k]));
        }
    set_g(tb, MK_T_LNFW, add_tensor(tb, "ln_f.weight", C, 0));
    set_g(tb, MK_T_LNFB, add_tensor(tb, "ln_f.bias", C, 0));
    for (int i = 0; i < tb->n; i++) {
        const mk_tensor_info *e = tb->t ? &tb->t[i] : NULL;
        add_hf(tb, i, MK_HF_COPY, 0, e ? e->shape[0] : 0, e ? e->shape[1] : 0, "transformer.%s",
               e ? e->name : "");
    }
}

/* Llama, Qwen2, Qwen3: fused internal tensors, transformers' names outside. */
static void build_rotary(const mk_config *c, table *tb)
{
    int C = c->n_embd, hd = c->head_dim, A = c->n_head * hd, K = c->n_kv_head * hd;
    int W = A + 2 * K, I = c->n_inner;
    int qk_norm = c->arch == MK_ARCH_QWEN3;
    int wte = add_tensor(tb, "embed.weight", c->vocab_size, C);
    set_g(tb, MK_T_WTE, wte);
    add_hf(tb, wte, MK_HF_COPY, 0, c->vocab_size, C, "model.embed_tokens.weight");
    const int d0[MK_P_PER_LAYER] = {C, 0, C, W, hd, hd, A, C, C, 0, C, 2 * I, I, C};
    const int d1[MK_P_PER_LAYER] = {0, 0, W, 0, 0, 0, C, 0, 0, 0, 2 * I, 0, C, 0};
    for (int l = 0; l < c->n_layer; l++) {
        int idx[MK_P_PER_LAYER];
        for (int k = 0; k < MK_P_PER_LAYER; k++) {
            int present = rot_layer_names[k] != NULL;
            if (k == MK_P_QKVB) present = c->attn_bias;
            if (k == MK_P_QNW || k == MK_P_KNW) present = qk_norm;
            if (k == MK_P_PROJB) present = c->attn_out_bias;
            if (k == MK_P_FCB || k == MK_P_FCPB) present = c->mlp_bias;
            idx[k] = -1;
            if (present) {
                char name[sizeof tb->t->name];
                snprintf(name, sizeof name, "layers.%d.%s", l, rot_layer_names[k]);
                idx[k] = add_tensor(tb, name, d0[k], d1[k]);
            }
            set_l(tb, l, k, idx[k]);
        }
        const char *pre = "model.layers";
        add_hf(tb, idx[MK_P_QKVW], MK_HF_TCOLS, 0, A, C, "%s.%d.self_attn.q_proj.weight", pre, l);
        if (c->attn_bias)
            add_hf(tb, idx[MK_P_QKVB], MK_HF_SLICE, 0, A, 0, "%s.%d.self_attn.q_proj.bias", pre, l);
        add_hf(tb, idx[MK_P_QKVW], MK_HF_TCOLS, A, K, C, "%s.%d.self_attn.k_proj.weight", pre, l);
        if (c->attn_bias)
            add_hf(tb, idx[MK_P_QKVB], MK_HF_SLICE, A, K, 0, "%s.%d.self_attn.k_proj.bias", pre, l);
        add_hf(tb, idx[MK_P_QKVW], MK_HF_TCOLS, A + K, K, C, "%s.%d.self_attn.v_proj.weight", pre,
               l);
        if (c->attn_bias)
            add_hf(tb, idx[MK_P_QKVB], MK_HF_SLICE, A + K, K, 0, "%s.%d.self_attn.v_proj.bias", pre,
                   l);
        add_hf(tb, idx[MK_P_PROJW], MK_HF_TCOLS, 0, C, A, "%s.%d.self_attn.o_proj.weight", pre, l);
        if (c->attn_out_bias)
            add_hf(tb, idx[MK_P_PROJB], MK_HF_COPY, 0, C, 0, "%s.%d.self_attn.o_proj.bias", pre, l);
        if (qk_norm) {
            add_hf(tb, idx[MK_P_QNW], MK_HF_COPY, 0, hd, 0, "%s.%d.self_attn.q_norm.weight", pre,
                   l);
            add_hf(tb, idx[MK_P_KNW], MK_HF_COPY, 0, hd, 0, "%s.%d.self_attn.k_norm.weight", pre,
                   l);
        }
        add_hf(tb, idx[MK_P_FCW], MK_HF_TCOLS, 0, I, C, "%s.%d.mlp.gate_proj.weight", pre, l);
        if (c->mlp_bias)
            add_hf(tb, idx[MK_P_FCB], MK_HF_SLICE, 0, I, 0, "%s.%d.mlp.gate_proj.bias", pre, l);
        add_hf(tb, idx[MK_P_FCW], MK_HF_TCOLS, I, I, C, "%s.%d.mlp.up_proj.weight", pre, l);
        if (c->mlp_bias)
            add_hf(tb, idx[MK_P_FCB], MK_HF_SLICE, I, I, 0, "%s.%d.mlp.up_proj.bias", pre, l);
        add_hf(tb, idx[MK_P_FCPW], MK_HF_TCOLS, 0, C, I, "%s.%d.mlp.down_proj.weight", pre, l);
        if (c->mlp_bias)
            add_hf(tb, idx[MK_P_FCPB], MK_HF_COPY, 0, C, 0, "%s.%d.mlp.down_proj.bias", pre, l);
        add_hf(tb, idx[MK_P_LN1W], MK_HF_COPY, 0, C, 0, "%s.%d.input_layernorm.weight", pre, l);
        add_hf(tb, idx[MK_P_LN2W], MK_HF_COPY, 0, C, 0, "%s.%d.post_attention_layernorm.weight",
               pre, l);
    }
    int nf = add_tensor(tb, "norm.weight", C, 0);
    set_g(tb, MK_T_LNFW, nf);
    add_hf(tb, nf, MK_HF_COPY, 0, C, 0, "model.norm.weight");
    if (c->untied_head) {
        int h = add_tensor(tb, "lm_head.weight", c->vocab_size, C);
        set_g(tb, MK_T_HEAD, h);
        add_hf(tb, h, MK_HF_COPY, 0, c->vocab_size, C, "lm_head.weight");
    }
}

/* Fills the tables of tb (pointers may be NULL) for a resolved config. */
static void build_table(const mk_config *c, table *tb)
{
    if (tb->gidx)
        for (int k = 0; k < MK_T_N; k++) tb->gidx[k] = -1;
    if (tb->lidx)
        for (int i = 0; i < c->n_layer * MK_P_PER_LAYER; i++) tb->lidx[i] = -1;
    if (c->arch == MK_ARCH_GPT2)
        build_gpt2(c, tb);
    else
        build_rotary(c, tb);
}

size_t mk_config_num_params(const mk_config *cfg)
{
    mk_config r;
    if (mk_config_resolve(cfg, &r) != MK_OK) return 0;
    table tb = {0};
    build_table(&r, &tb);
    return tb.off;
}

/* ---- the checkpoint's view ---------------------------------------------- */

/* name without a "transformer." or "model." prefix */
static const char *strip_prefix(const char *name)
{
    if (!strncmp(name, "transformer.", 12)) return name + 12;
    if (!strncmp(name, "model.", 6)) return name + 6;
    return name;
}

int mk__hf_find(const mk_model *m, const char *name)
{
    const char *want = strip_prefix(name);
    for (int i = 0; i < m->n_hf; i++)
        if (!strcmp(strip_prefix(m->hf[i].info.name), want)) return i;
    return -1;
}

/* Moves checkpoint tensor i between ck (its own layout) and base, its internal tensor's first
 * element; to_params chooses the direction. */
static void hf_move(const mk_model *m, int i, float *base, float *ck, int to_params)
{
    const mk__hf_map *h = &m->hf[i];
    const mk_tensor_info *t = &m->tensors[h->tensor];
    size_t n = h->info.numel;
    if (h->kind == MK_HF_COPY || h->kind == MK_HF_SLICE) {
        float *p = base + (h->kind == MK_HF_SLICE ? h->col0 : 0);
        if (to_params)
            memcpy(p, ck, n * sizeof(float));
        else
            memcpy(ck, p, n * sizeof(float));
        return;
    }
    /* MK_HF_TCOLS: ck [out, in]; internal [in, Wt] columns col0 .. col0 + out */
    int out = h->info.shape[0], in = h->info.shape[1], Wt = t->shape[1];
    enum { BLK = 32 };
    /* blocks of output columns over the team (a loaded weight is tens of MB: serially, its
     * transpose was a fifth of loading a 0.5B model); no two blocks touch the same element */
#pragma omp parallel for num_threads(mk_get_threads()) schedule(dynamic, 1) if (n >= (1u << 16))
    for (int o0 = 0; o0 < out; o0 += BLK)
        for (int i0 = 0; i0 < in; i0 += BLK) {
            int o1 = o0 + BLK < out ? o0 + BLK : out, i1 = i0 + BLK < in ? i0 + BLK : in;
            for (int ii = i0; ii < i1; ii++) {
                float *row = base + (size_t)ii * Wt + h->col0;
                for (int oo = o0; oo < o1; oo++) {
                    float *c = ck + (size_t)oo * in + ii;
                    if (to_params)
                        row[oo] = *c;
                    else
                        *c = row[oo];
                }
            }
        }
}

void mk__hf_scatter(const mk_model *m, int i, float *params, const float *src)
{
    hf_move(m, i, params + m->tensors[m->hf[i].tensor].offset, (float *)src, 1);
}

void mk__hf_gather(const mk_model *m, int i, const float *params, float *dst)
{
    hf_move(m, i, (float *)params + m->tensors[m->hf[i].tensor].offset, dst, 0);
}

int mk_model_num_hf_tensors(const mk_model *m)
{
    return m ? m->n_hf : 0;
}

int mk_model_hf_tensor(const mk_model *m, int i, mk_tensor_info *info)
{
    if (!m || !info || i < 0 || i >= m->n_hf)
        return mk__fail(MK_ERR_ARG, "checkpoint tensor index %d out of range", i);
    *info = m->hf[i].info;
    return MK_OK;
}

int mk_model_read_hf(const mk_model *m, const char *name, int grads, float *dst)
{
    if (!m || !name || !dst) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (grads && m->infer)
        return mk__fail(MK_ERR_STATE, "an inference-only model has no gradients");
    int i = mk__hf_find(m, name);
    if (i < 0)
        return mk__fail(MK_ERR_MISSING, "the %s model has no tensor %s", mk_arch_name(m->cfg.arch),
                        name);
    const mk__hf_map *h = &m->hf[i];
    const mk_tensor_info *t = &m->tensors[h->tensor];
    float *tmp = malloc(t->numel * sizeof(float));
    if (!tmp) return mk__fail(MK_ERR_NOMEM, "cannot allocate %zu floats", t->numel);
    m->be->download(tmp, (grads ? m->grads : m->params) + t->offset, t->numel * sizeof(float));
    hf_move(m, i, tmp, dst, 0);
    free(tmp);
    return MK_OK;
}

/* ---- model lifetime ----------------------------------------------------- */

/* Floats of one layer's attention activations (att) per (b, head): a row's log-sum-exp per
 * position with a back-end's fused attention (att_rows_only), else the T x T probabilities. */
static size_t att_per_head(const mk_backend *be, int T)
{
    return be->att_rows_only ? (size_t)T : (size_t)T * T;
}

/* Float-sized slots of n bfloat16 values */
static size_t halves(size_t n)
{
    return (n + 1) / 2;
}

/* bf16: MK_MODEL_BF16_TRAIN's sizes (the five product inputs in bfloat16) */
static void act_sizes(const mk_config *c, const mk_backend *be, int B, int T, int bf16, size_t *s)
{
    size_t L = c->n_layer, C = c->n_embd, R = (size_t)B * T, NH = c->n_head;
    size_t W = mk__qkv_width(c), A = mk__att_width(c), F = mk__mlp_in(c), H = mk__mlp_hidden(c);
    int rot = mk__rotary(c), qkn = c->arch == MK_ARCH_QWEN3;
    s[MK_ACT_ENC] = R * C;
    s[MK_ACT_LN1] = L * R * C;
    s[MK_ACT_LN1M] = L * R;
    s[MK_ACT_LN1R] = L * R;
    s[MK_ACT_QKVR] = rot ? L * R * W : 0;
    s[MK_ACT_QKR] = qkn ? L * R * (NH + c->n_kv_head) : 0;
    s[MK_ACT_QKV] = L * R * W;
    s[MK_ACT_ATTY] = L * R * A;
    s[MK_ACT_ATT] = L * B * NH * att_per_head(be, T);
    s[MK_ACT_RES2] = L * R * C;
    s[MK_ACT_LN2] = L * R * C;
    s[MK_ACT_LN2M] = L * R;
    s[MK_ACT_LN2R] = L * R;
    s[MK_ACT_FCH] = L * R * F;
    s[MK_ACT_FCG] = L * R * H;
    s[MK_ACT_RES3] = L * R * C;
    s[MK_ACT_LNF] = R * C;
    s[MK_ACT_LNFM] = R;
    s[MK_ACT_LNFR] = R;
    s[MK_ACT_LOGITS] = R * c->vocab_size;
    s[MK_ACT_DLOGITS] = R * c->vocab_size;
    if (bf16) {
        const int kept[] = {MK_ACT_LN1, MK_ACT_ATTY, MK_ACT_LN2, MK_ACT_FCG, MK_ACT_LNF};
        for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) s[kept[i]] = halves(s[kept[i]]);
    }
}

static size_t max3(size_t a, size_t b, size_t c)
{
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* bfloat16 values of MK_G_B16 for its backward use: the rounded output gradient of the largest
 * block product, and at least one row of the head's (whose backward goes by as many rows as
 * fit) */
static size_t b16_scratch(const mk_config *c, int B, int T)
{
    size_t R = (size_t)B * T, g = R * max3(mk__qkv_width(c), (size_t)c->n_embd, mk__mlp_in(c));
    return g > (size_t)c->vocab_size ? g : (size_t)c->vocab_size;
}

static void gact_sizes(const mk_config *c, const mk_backend *be, int B, int T, int bf16, size_t *s)
{
    size_t C = c->n_embd, R = (size_t)B * T, NH = c->n_head;
    size_t W = mk__qkv_width(c), A = mk__att_width(c), F = mk__mlp_in(c), H = mk__mlp_hidden(c);
    s[MK_G_RES] = R * C;
    s[MK_G_LN] = R * C;
    s[MK_G_QKV] = R * W;
    s[MK_G_QKVR] = mk__rotary(c) ? R * W : 0;
    s[MK_G_ATTY] = R * A;
    s[MK_G_FCH] = R * F;
    s[MK_G_FCG] = R * H;
    s[MK_G_ATT] = B * NH * att_per_head(be, T);
    /* one layer's float outputs of the kept activations' producers (forward), or the rounded
     * output gradients (backward) */
    s[MK_G_B16] = s[MK_G_BB] = 0;
    if (bf16) {
        size_t fwd = R * max3(C, A, H), bwd = halves(b16_scratch(c, B, T));
        s[MK_G_B16] = fwd > bwd ? fwd : bwd;
        size_t OC = max3(W, C, F) > (size_t)c->vocab_size ? max3(W, C, F) : (size_t)c->vocab_size;
        s[MK_G_BB] = (size_t)be->bb_scratch_k * (R + max3(C, A, H) + OC);
    }
}

/* Carves base into n regions of sizes[i] floats, each 16-float aligned. */
static size_t carve(float *base, const size_t *sizes, float **ptrs, int n)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (ptrs) ptrs[i] = base ? base + off : NULL;
        off += (sizes[i] + 15) / 16 * 16;
    }
    return off;
}

/* transformers' inverse frequencies (float32, as torch computes them), with Llama 3's
 * scaling when the config asks for it. */
static void rope_inv_freq(const mk_config *c, float *inv)
{
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)c->head_dim;
        inv[i] = (float)(1.0 / pow((double)c->rope_theta, (double)e));
    }
    if (c->rope_factor == 0) return;
    float factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
    float old = (float)c->rope_orig_ctx;
    float lo_wl = old / lo, hi_wl = old / hi;
    for (int i = 0; i < half; i++) {
        float wl = 2.0f * (float)M_PI / inv[i];
        float f = wl > lo_wl ? inv[i] / factor : inv[i];
        if (!(wl < hi_wl) && !(wl > lo_wl)) {
            float sm = (old / wl - lo) / (hi - lo);
            f = (1.0f - sm) * f / factor + sm * f;
        }
        inv[i] = f;
    }
}

/* The cos and sin tables [block_size, hd/2] of the rotary families, on the back-end. */
static int rope_tables(mk_model *m)
{
    const mk_config *c = &m->cfg;
    size_t half = (size_t)c->head_dim / 2, n = (size_t)c->block_size * half;
    float *h = malloc(sizeof(float) * (n * 2 + half));
    if (!h) return mk__fail(MK_ERR_NOMEM, "cannot allocate rotary tables (%zu floats)", n * 2);
    float *inv = h + 2 * n;
    rope_inv_freq(c, inv);
    for (int p = 0; p < c->block_size; p++)
        for (size_t i = 0; i < half; i++) {
            float ang = (float)p * inv[i];
            h[p * half + i] = (float)cos((double)ang);
            h[n + p * half + i] = (float)sin((double)ang);
        }
    int rc;
    if ((rc = m->be->alloc((void **)&m->rope_cos, n * sizeof(float))) ||
        (rc = m->be->alloc((void **)&m->rope_sin, n * sizeof(float)))) {
        free(h);
        return rc;
    }
    m->be->upload(m->rope_cos, h, n * sizeof(float));
    m->be->upload(m->rope_sin, h + n, n * sizeof(float));
    free(h);
    return MK_OK;
}

int mk_model_new(mk_model **out, const mk_config *cfg, int max_batch, int max_seq,
                 const mk_backend *be)
{
    return mk_model_new_ex(out, cfg, max_batch, max_seq, be, 0);
}

/* ---- bfloat16 weight copies (MK_MODEL_BF16_WEIGHTS) ---------------------- */

/* The tensors decoding multiplies by: every block's four product weights and the head. */
static int bf16_tensor(const mk_model *m, int i)
{
    if (i == mk__head_tensor(m)) return 1;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const int *li = m->lidx + l * MK_P_PER_LAYER;
        if (i == li[MK_P_QKVW] || i == li[MK_P_PROJW] || i == li[MK_P_FCW] || i == li[MK_P_FCPW])
            return 1;
    }
    return 0;
}

/* The copies of MK_MODEL_BF16_WEIGHTS (decoding: wb16 in the back-end's to_bf16 layout) or of
 * MK_MODEL_BF16_TRAIN (train: tb16, each tensor rounded as it is, row-major) */
static int bf16_alloc(mk_model *m, int train)
{
    if (!train && (!m->be->mm_fwd_bf16 || !m->be->to_bf16))
        return mk__fail(MK_ERR_UNSUPPORTED, "back-end %s has no bfloat16 weights", m->be->name);
    m->b16_off = malloc(sizeof(size_t) * (size_t)m->n_tensors);
    if (!m->b16_off) return mk__fail(MK_ERR_NOMEM, "cannot allocate model tables");
    size_t n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        m->b16_off[i] = bf16_tensor(m, i) ? n : SIZE_MAX;
        /* each copy starts on a 64-byte line (32 elements); for decoding the head [V, C] is the
         * product's [C, V] */
        const mk_tensor_info *t = &m->tensors[i];
        int head = i == mk__head_tensor(m);
        size_t e = train ? t->numel : MK_BF16_ELEMS(t->shape[head ? 1 : 0], t->shape[head ? 0 : 1]);
        if (bf16_tensor(m, i)) n += (e + 31) / 32 * 32;
    }
    m->b16_stale = 1;
    return m->be->alloc((void **)(train ? &m->tb16 : &m->wb16), n * sizeof(uint16_t));
}

void mk__bf16_sync(mk_model *m)
{
    if (m->tb16 && m->b16_stale) { /* training copies: every weight rounded as it lies */
        for (int i = 0; i < m->n_tensors; i++)
            if (m->b16_off[i] != SIZE_MAX)
                m->be->round_bf16(m->tb16 + m->b16_off[i], m->params + m->tensors[i].offset,
                                  m->tensors[i].numel);
        m->b16_stale = 0;
    }
    if (!m->wb16 || !m->b16_stale) return;
    int head = mk__head_tensor(m);
    for (int i = 0; i < m->n_tensors; i++) {
        if (m->b16_off[i] == SIZE_MAX) continue;
        const mk_tensor_info *t = &m->tensors[i];
        /* block weights are [in, out]; the head [V, C] is the product's [C, V] transposed */
        if (i == head)
            m->be->to_bf16(m->wb16 + m->b16_off[i], m->params + t->offset, t->shape[1], t->shape[0],
                           1);
        else
            m->be->to_bf16(m->wb16 + m->b16_off[i], m->params + t->offset, t->shape[0], t->shape[1],
                           0);
    }
    m->b16_stale = 0;
}

int mk_model_new_ex(mk_model **out, const mk_config *cfg_in, int max_batch, int max_seq,
                    const mk_backend *be, unsigned flags)
{
    if (!out) return mk__fail(MK_ERR_ARG, "out is NULL");
    *out = NULL;
    mk_config rcfg;
    int rc = mk_config_resolve(cfg_in, &rcfg);
    if (rc) return rc;
    const mk_config *cfg = &rcfg;
    if (max_batch < 1 || max_seq < 1 || max_seq > cfg->block_size)
        return mk__fail(MK_ERR_ARG, "max_batch %d, max_seq %d: need >= 1 and max_seq <= %d",
                        max_batch, max_seq, cfg->block_size);
    unsigned known = MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS | MK_MODEL_BF16_PRODUCTS |
                     MK_MODEL_BF16_KV | MK_MODEL_BF16_TRAIN;
    if (flags & ~known) return mk__fail(MK_ERR_ARG, "unknown model flags 0x%x", flags & ~known);
    if ((flags & MK_MODEL_BF16_WEIGHTS) && !(flags & MK_MODEL_INFER))
        return mk__fail(MK_ERR_ARG, "MK_MODEL_BF16_WEIGHTS needs MK_MODEL_INFER (a trainable "
                                    "model keeps float weights)");
    if ((flags & MK_MODEL_BF16_PRODUCTS) && !(flags & MK_MODEL_BF16_WEIGHTS))
        return mk__fail(MK_ERR_ARG, "MK_MODEL_BF16_PRODUCTS needs MK_MODEL_BF16_WEIGHTS (the "
                                    "products multiply the bfloat16 copies)");
    if ((flags & MK_MODEL_BF16_KV) && !(flags & MK_MODEL_INFER))
        return mk__fail(MK_ERR_ARG, "MK_MODEL_BF16_KV needs MK_MODEL_INFER (only decoders have "
                                    "KV caches)");
    if ((flags & MK_MODEL_BF16_TRAIN) && (flags & MK_MODEL_INFER))
        return mk__fail(MK_ERR_ARG, "MK_MODEL_BF16_TRAIN is for training: not with "
                                    "MK_MODEL_INFER");
    if (!be) be = &mk__cpu_backend;
    if ((flags & MK_MODEL_BF16_PRODUCTS) && !be->mm_fwd_bf16a)
        return mk__fail(MK_ERR_UNSUPPORTED, "back-end %s has no bfloat16 products", be->name);
    if ((flags & MK_MODEL_BF16_TRAIN) && (!be->round_bf16 || !be->mm_fwd_bb || !be->mm_bwd_bb))
        return mk__fail(MK_ERR_UNSUPPORTED, "back-end %s has no bfloat16 training products",
                        be->name);
    if (be == &mk__cpu_backend) mk__blas_init();
    mk_model *m = calloc(1, sizeof *m);
    if (!m) return mk__fail(MK_ERR_NOMEM, "cannot allocate model");
    m->cfg = *cfg;
    m->infer = (flags & MK_MODEL_INFER) != 0;
    m->b16_products = (flags & MK_MODEL_BF16_PRODUCTS) != 0;
    m->bf16_kv = (flags & MK_MODEL_BF16_KV) != 0;
    m->bf16_train = (flags & MK_MODEL_BF16_TRAIN) != 0;
    m->be = be;
    m->max_B = max_batch;
    m->max_T = max_seq;
    table count = {0};
    build_table(cfg, &count);
    m->n_tensors = count.n;
    m->n_hf = count.n_hf;
    m->tensors = calloc((size_t)m->n_tensors, sizeof *m->tensors);
    m->hf = calloc((size_t)m->n_hf, sizeof *m->hf);
    m->lidx = calloc((size_t)cfg->n_layer * MK_P_PER_LAYER, sizeof *m->lidx);
    size_t R = (size_t)max_batch * max_seq;
    m->h_rowa = malloc(sizeof(float) * R * 4);
    if (!m->tensors || !m->hf || !m->lidx || !m->h_rowa) {
        mk_model_free(m);
        return mk__fail(MK_ERR_NOMEM, "cannot allocate model tables");
    }
    m->h_rowb = m->h_rowa + R;
    m->h_rowc = m->h_rowb + R;
    m->h_rowd = m->h_rowc + R;
    table tb = {.t = m->tensors, .gidx = m->gidx, .lidx = m->lidx, .hf = m->hf};
    build_table(cfg, &tb);
    m->n_params = tb.off;
    m->m_off = 0, m->m_len = m->n_params;
    act_sizes(cfg, be, max_batch, max_seq, m->bf16_train, m->act_size);
    size_t gsz[MK_G_N];
    gact_sizes(cfg, be, max_batch, max_seq, m->bf16_train, gsz);
    size_t n_act = carve(NULL, m->act_size, NULL, MK_ACT_N);
    size_t n_gact = carve(NULL, gsz, NULL, MK_G_N);
    size_t P = m->n_params * sizeof(float);
    int train = !m->infer;
    if (train) m->act_bytes = (n_act + n_gact) * sizeof(float);
    if (m->bf16_train) m->b16_scratch = b16_scratch(cfg, max_batch, max_seq);
    if ((rc = be->alloc((void **)&m->params, P)) ||
        (train && (rc = be->alloc((void **)&m->grads, P))) ||
        (train && (rc = be->alloc((void **)&m->m, P))) ||
        (train && (rc = be->alloc((void **)&m->v, P))) ||
        (train && (rc = be->alloc((void **)&m->acts_mem, n_act * sizeof(float)))) ||
        (train && (rc = be->alloc((void **)&m->gacts_mem, n_gact * sizeof(float)))) ||
        (rc = be->alloc((void **)&m->d_tokens, R * sizeof(int))) ||
        (rc = be->alloc((void **)&m->d_targets, R * sizeof(int))) ||
        (rc = be->alloc((void **)&m->d_pos, R * sizeof(int))) ||
        (rc = be->alloc((void **)&m->d_rowa, R * sizeof(float))) ||
        (rc = be->alloc((void **)&m->d_rowb, R * sizeof(float))) ||
        (mk__rotary(cfg) && (rc = rope_tables(m))) ||
        ((flags & MK_MODEL_BF16_WEIGHTS) && (rc = bf16_alloc(m, 0))) ||
        (m->bf16_train && (rc = bf16_alloc(m, 1)))) {
        mk_model_free(m);
        return rc;
    }
    if (train) {
        carve(m->acts_mem, m->act_size, m->act, MK_ACT_N);
        carve(m->gacts_mem, gsz, m->gact, MK_G_N);
    }
    *out = m;
    return MK_OK;
}

void mk_model_free(mk_model *m)
{
    if (!m) return;
    mk__shared_close_all(m);
    void *dev[] = {m->params,    m->grads,    m->m,         m->v,     m->acts_mem,
                   m->gacts_mem, m->d_tokens, m->d_targets, m->d_pos, m->d_rowa,
                   m->d_rowb,    m->rope_cos, m->rope_sin,  m->wb16,  m->tb16};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) m->be->release(dev[i]);
    free(m->tensors);
    free(m->hf);
    free(m->lidx);
    free(m->h_rowa);
    free(m->b16_off);
    free(m);
}

const mk_config *mk_model_config(const mk_model *m)
{
    return &m->cfg;
}

const mk_backend *mk_model_backend(const mk_model *m)
{
    return m->be;
}

size_t mk_model_num_params(const mk_model *m)
{
    return m->n_params;
}

size_t mk_model_activation_bytes(const mk_model *m)
{
    return m ? m->act_bytes : 0;
}

int mk_model_num_tensors(const mk_model *m)
{
    return m->n_tensors;
}

int mk_model_tensor(const mk_model *m, int i, mk_tensor_info *info)
{
    if (!m || !info || i < 0 || i >= m->n_tensors)
        return mk__fail(MK_ERR_ARG, "tensor index %d out of range", i);
    *info = m->tensors[i];
    return MK_OK;
}

float *mk_model_params(mk_model *m)
{
    mk__params_changed(m);
    return m->params;
}

float *mk_model_grads(mk_model *m)
{
    return m->grads;
}

float *mk_model_adam_m(mk_model *m)
{
    return m->m;
}

float *mk_model_adam_v(mk_model *m)
{
    return m->v;
}

static int range_ok(const mk_model *m, const void *p, size_t off, size_t n)
{
    if (!m || (!p && n)) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (off > m->n_params || n > m->n_params - off)
        return mk__fail(MK_ERR_ARG, "range [%zu, %zu) outside %zu parameters", off, off + n,
                        m->n_params);
    return MK_OK;
}

int mk_model_read_params(const mk_model *m, float *dst, size_t off, size_t n)
{
    int rc = range_ok(m, dst, off, n);
    if (!rc && n) m->be->download(dst, m->params + off, n * sizeof(float));
    return rc;
}

int mk_model_write_params(mk_model *m, const float *src, size_t off, size_t n)
{
    int rc = range_ok(m, src, off, n);
    if (!rc && n) {
        m->be->upload(m->params + off, src, n * sizeof(float));
        mk__params_changed(m);
    }
    return rc;
}

int mk_model_read_grads(const mk_model *m, float *dst, size_t off, size_t n)
{
    if (m && m->infer) return mk__fail(MK_ERR_STATE, "an inference-only model has no gradients");
    int rc = range_ok(m, dst, off, n);
    if (!rc && n) m->be->download(dst, m->grads + off, n * sizeof(float));
    return rc;
}

int mk_model_write_grads(mk_model *m, const float *src, size_t off, size_t n)
{
    if (m && m->infer) return mk__fail(MK_ERR_STATE, "an inference-only model has no gradients");
    int rc = range_ok(m, src, off, n);
    if (!rc && n) m->be->upload(m->grads + off, src, n * sizeof(float));
    return rc;
}

/* ---- a shard's slice ------------------------------------------------------ */

static int train_range(const mk_model *m, size_t off, size_t n)
{
    if (m && m->infer) return mk__fail(MK_ERR_STATE, "an inference-only model has no gradients");
    return range_ok(m, m, off, n);
}

/* [off, off+n) inside the range the moments cover */
static int moment_range(const mk_model *m, size_t off, size_t n)
{
    int rc = train_range(m, off, n);
    if (!rc && n && (off < m->m_off || off + n > m->m_off + m->m_len))
        rc = mk__fail(MK_ERR_ARG, "range [%zu, %zu) outside the moments' [%zu, %zu)", off, off + n,
                      m->m_off, m->m_off + m->m_len);
    return rc;
}

int mk_model_shard_moments(mk_model *m, size_t off, size_t n)
{
    int rc = train_range(m, off, n);
    float *nm = NULL, *nv = NULL;
    size_t bytes = (n ? n : 1) * sizeof(float);
    if (!rc && (rc = m->be->alloc((void **)&nm, bytes)) == MK_OK &&
        (rc = m->be->alloc((void **)&nv, bytes)) != MK_OK)
        m->be->release(nm);
    if (rc) return rc;
    m->be->release(m->m), m->be->release(m->v);
    m->m = nm, m->v = nv, m->m_off = off, m->m_len = n;
    return MK_OK;
}

int mk_model_grad_scale(mk_model *m, size_t off, size_t n, float s)
{
    int rc = train_range(m, off, n);
    if (!rc && n) m->be->scale(m->grads + off, s, n);
    return rc;
}

int mk_model_grad_sumsq_range(mk_model *m, size_t off, size_t n, double *sumsq)
{
    int rc = sumsq ? train_range(m, off, n) : mk__fail(MK_ERR_ARG, "NULL argument");
    if (!rc) *sumsq = n ? m->be->sumsq(m->grads + off, n) : 0.0;
    return rc;
}

int mk_model_adamw_range(mk_model *m, size_t off, size_t n, const mk_adamw_params *p, int t)
{
    if (!p || t < 1) return mk__fail(MK_ERR_ARG, "bad AdamW arguments (step %d)", t);
    int rc = moment_range(m, off, n);
    /* in runs that do not cross a tensor's edge: weight decay is per tensor */
    for (int i = 0; !rc && i < m->n_tensors; i++) {
        const mk_tensor_info *ti = &m->tensors[i];
        size_t lo = ti->offset > off ? ti->offset : off;
        size_t hi = ti->offset + ti->numel < off + n ? ti->offset + ti->numel : off + n;
        if (lo >= hi) continue;
        float wd = ti->ndim == 2 ? p->weight_decay : 0.0f;
        size_t k = lo - m->m_off;
        m->be->adamw(m->params + lo, m->grads + lo, m->m + k, m->v + k, hi - lo, p->lr, p->beta1,
                     p->beta2, p->eps, wd, t);
    }
    if (!rc && n) mk__params_changed(m);
    return rc;
}

static float *moments(const mk_model *m, int which)
{
    return which == 0 ? m->m : which == 1 ? m->v : NULL;
}

int mk_model_read_moments(const mk_model *m, int which, float *dst, size_t off, size_t n)
{
    int rc = moment_range(m, off, n);
    if (!rc && !moments(m, which)) rc = mk__fail(MK_ERR_ARG, "moment %d: 0 or 1", which);
    if (!rc && !dst && n) rc = mk__fail(MK_ERR_ARG, "NULL argument");
    if (!rc && n) m->be->download(dst, moments(m, which) + (off - m->m_off), n * sizeof(float));
    return rc;
}

int mk_model_write_moments(mk_model *m, int which, const float *src, size_t off, size_t n)
{
    int rc = moment_range(m, off, n);
    if (!rc && !moments(m, which)) rc = mk__fail(MK_ERR_ARG, "moment %d: 0 or 1", which);
    if (!rc && !src && n) rc = mk__fail(MK_ERR_ARG, "NULL argument");
    if (!rc && n) m->be->upload(moments(m, which) + (off - m->m_off), src, n * sizeof(float));
    return rc;
}

int mk_model_sync(mk_model *m)
{
    if (!m) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (m->be->sync) m->be->sync();
    return MK_OK;
}

/* ---- initialisation ----------------------------------------------------- */

void mk_model_init(mk_model *m, uint64_t seed)
{
    float *h = malloc(sizeof(float) * m->n_params);
    if (!h) mk__die(__FILE__, __LINE__, "out of memory initialising parameters", NULL);
    mk_rng rng;
    mk_rng_seed(&rng, seed);
    float proj_std = 0.02f / sqrtf(2.0f * m->cfg.n_layer);
    for (int i = 0; i < m->n_tensors; i++) {
        const mk_tensor_info *t = &m->tensors[i];
        float *p = h + t->offset;
        const char *nm = t->name;
        size_t len = strlen(nm);
        int is_bias = len > 5 && strcmp(nm + len - 5, ".bias") == 0;
        int is_ln = strstr(nm, "ln_") != NULL || strstr(nm, "norm.") != NULL;
        if (is_bias) {
            memset(p, 0, sizeof(float) * t->numel);
        } else if (is_ln) {
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        } else {
            /* GPT-2 scales its residual projections; transformers' Llama/Qwen use 0.02 */
            float std = strstr(nm, "c_proj.weight") ? proj_std : 0.02f;
            for (size_t j = 0; j < t->numel; j += 2) {
                /* Box-Muller: two normals from two uniforms in (0, 1] */
                float u1 = 1.0f - mk_rng_uniform(&rng), u2 = mk_rng_uniform(&rng);
                float r = sqrtf(-2.0f * logf(u1));
                p[j] = std * r * cosf(6.2831853f * u2);
                if (j + 1 < t->numel) p[j + 1] = std * r * sinf(6.2831853f * u2);
            }
        }
    }
    m->be->upload(m->params, h, sizeof(float) * m->n_params);
    free(h);
    mk__params_changed(m);
    mk__bf16_sync(m);
    if (!m->infer) {
        m->be->zero(m->m, sizeof(float) * m->m_len);
        m->be->zero(m->v, sizeof(float) * m->m_len);
    }
}

/* ---- forward ------------------------------------------------------------ */

/* A block's pre-norm (LayerNorm with bias for GPT2, RMSNorm otherwise). */
void mk__norm_fwd(const mk_model *m, float *out, float *mean, float *rstd, const float *inp,
                  const float *w, const float *b, int R)
{
    if (mk__rotary(&m->cfg))
        m->be->rms_fwd(out, rstd, inp, w, R, m->cfg.n_embd, m->cfg.norm_eps);
    else
        m->be->ln_fwd(out, mean, rstd, inp, w, b, R, m->cfg.n_embd, m->cfg.norm_eps);
}

void mk__add_norm_fwd(const mk_model *m, float *res, float *out, float *mean, float *rstd,
                      const float *a, const float *b, const float *w, const float *bias, int R)
{
    const mk_backend *be = m->be;
    int C = m->cfg.n_embd;
    if (be->add_norm_fwd) {
        be->add_norm_fwd(res, out, mean, rstd, a, b, w, bias, R, C, m->cfg.norm_eps,
                         mk__rotary(&m->cfg));
        return;
    }
    be->add(res, a, b, (size_t)R * C);
    mk__norm_fwd(m, out, mean, rstd, res, w, bias, R);
}

void mk__mm_gelu_fwd(const mk_backend *be, float *out, float *pre, const float *inp, const float *w,
                     const float *bias, int R, int IC, int OC)
{
    if (be->mm_gelu_fwd) {
        be->mm_gelu_fwd(out, pre, inp, w, bias, R, IC, OC);
        return;
    }
    float *h = pre ? pre : out;
    be->mm_fwd(h, inp, w, bias, R, IC, OC);
    be->gelu_fwd(out, h, (size_t)R * OC);
}

void mk__mm_gelu_bwd(const mk_backend *be, float *dpre, float *dw, float *dbias, const float *dout,
                     const float *inp, const float *w, const float *pre, int R, int IC, int OC)
{
    if (be->mm_gelu_bwd) {
        be->mm_gelu_bwd(dpre, dw, dbias, dout, inp, w, pre, R, IC, OC);
        return;
    }
    be->mm_bwd(dpre, dw, dbias, dout, inp, w, R, IC, OC);
    be->gelu_bwd(dpre, pre, dpre, (size_t)R * IC);
}

static void norm_bwd(const mk_model *m, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, const float *mean, const float *rstd, int R)
{
    if (mk__rotary(&m->cfg))
        m->be->rms_bwd(dinp, dw, dout, inp, w, rstd, R, m->cfg.n_embd);
    else
        m->be->ln_bwd(dinp, dw, db, dout, inp, w, mean, rstd, R, m->cfg.n_embd);
}

/* Where layer l's activations lie for a forward over R = B T rows.  With MK_MODEL_BF16_TRAIN
 * the four product inputs are kept in bfloat16 (ln1h, attyh, ln2h, fcgh) and ln1, atty, ln2, fcg
 * all point to the one layer of float scratch (MK_G_B16) that their producers write; else the
 * h pointers are NULL. */
typedef struct layer_acts {
    const float *res; /* the block's input */
    float *ln1, *ln1m, *ln1r, *qkvr, *qkr, *qkv, *atty, *att, *res2, *ln2, *ln2m, *ln2r, *fch, *fcg,
        *res3;
    uint16_t *ln1h, *attyh, *ln2h, *fcgh;
} layer_acts;

static layer_acts acts_of(const mk_model *m, int l, int B, int T)
{
    const mk_config *c = &m->cfg;
    size_t R = (size_t)B * T, C = c->n_embd, W = mk__qkv_width(c), A = mk__att_width(c);
    size_t F = mk__mlp_in(c), H = mk__mlp_hidden(c), NQK = (size_t)c->n_head + c->n_kv_head;
    float *const *a = m->act;
    layer_acts x;
    x.res = l == 0 ? a[MK_ACT_ENC] : a[MK_ACT_RES3] + (l - 1) * R * C;
    x.ln1 = a[MK_ACT_LN1] + l * R * C;
    x.ln1m = a[MK_ACT_LN1M] + l * R;
    x.ln1r = a[MK_ACT_LN1R] + l * R;
    x.qkvr = mk__rotary(c) ? a[MK_ACT_QKVR] + l * R * W : NULL;
    x.qkr = c->arch == MK_ARCH_QWEN3 ? a[MK_ACT_QKR] + l * R * NQK : NULL;
    x.qkv = a[MK_ACT_QKV] + l * R * W;
    x.atty = a[MK_ACT_ATTY] + l * R * A;
    x.att = a[MK_ACT_ATT] + (size_t)l * B * c->n_head * att_per_head(m->be, T);
    x.res2 = a[MK_ACT_RES2] + l * R * C;
    x.ln2 = a[MK_ACT_LN2] + l * R * C;
    x.ln2m = a[MK_ACT_LN2M] + l * R;
    x.ln2r = a[MK_ACT_LN2R] + l * R;
    x.fch = a[MK_ACT_FCH] + l * R * F;
    x.fcg = a[MK_ACT_FCG] + l * R * H;
    x.res3 = a[MK_ACT_RES3] + l * R * C;
    x.ln1h = x.attyh = x.ln2h = x.fcgh = NULL;
    if (m->bf16_train) {
        x.ln1h = (uint16_t *)(void *)a[MK_ACT_LN1] + l * R * C;
        x.attyh = (uint16_t *)(void *)a[MK_ACT_ATTY] + l * R * A;
        x.ln2h = (uint16_t *)(void *)a[MK_ACT_LN2] + l * R * C;
        x.fcgh = (uint16_t *)(void *)a[MK_ACT_FCG] + l * R * H;
        x.ln1 = x.atty = x.ln2 = x.fcg = m->gact[MK_G_B16];
    }
    return x;
}

/* MK_MODEL_BF16_TRAIN: an activation that its producer wrote in float (src, the scratch) kept
 * in bfloat16 (dst) for the product that reads it and for the backward pass; nothing without */
static void keep16(const mk_model *m, uint16_t *dst, const float *src, size_t n)
{
    if (m->bf16_train) m->be->round_bf16(dst, src, n);
}

/* The scratch of mm_fwd_bb and mm_bwd_bb (NULL: the back-end takes none) */
static void *bb_scratch(const mk_model *m)
{
    return m->be->bb_scratch_k ? m->gact[MK_G_BB] : NULL;
}

/* The bfloat16 copy of weight tensor i (MK_MODEL_BF16_TRAIN) */
static const uint16_t *w16(const mk_model *m, int i)
{
    return m->tb16 + m->b16_off[i];
}

/* A block product out[R,OC] = inp[R,IC] (weight tensor i) + bias: of the floats, or of the
 * bfloat16 inp16 and copy with MK_MODEL_BF16_TRAIN */
static void prod_fwd(const mk_model *m, float *out, const float *inp, const uint16_t *inp16, int i,
                     const float *bias, int R, int IC, int OC)
{
    if (m->bf16_train)
        m->be->mm_fwd_bb(out, inp16, w16(m, i), bias, R, IC, OC, 0, bb_scratch(m));
    else
        m->be->mm_fwd(out, inp, P(i), bias, R, IC, OC);
}

/* prod_fwd's backward: dinp overwritten, the weight's gradient and dbias added into */
static void prod_bwd(const mk_model *m, float *dinp, float *dbias, const float *dout,
                     const float *inp, const uint16_t *inp16, int i, int R, int IC, int OC)
{
    if (m->bf16_train)
        m->be->mm_bwd_bb(dinp, G(i), dbias, (uint16_t *)(void *)m->gact[MK_G_B16], dout, inp16,
                         w16(m, i), R, IC, OC, 0, bb_scratch(m));
    else
        m->be->mm_bwd(dinp, G(i), dbias, dout, inp, P(i), R, IC, OC);
}

/* The head's backward with MK_MODEL_BF16_TRAIN: by as many rows at a time as MK_G_B16 holds
 * rounded logit gradients (every row of a small vocabulary; the rows of a large one would need
 * a [R, V] scratch), the weight gradient added over the passes */
static void head_bwd_bb(const mk_model *m, int R)
{
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, ht = mk__head_tensor(m);
    size_t per = m->b16_scratch / (size_t)V;
    int step = per >= (size_t)R ? R : (int)per;
    const uint16_t *lnf = (const uint16_t *)(const void *)m->act[MK_ACT_LNF];
    for (int r0 = 0; r0 < R; r0 += step) {
        int n = R - r0 < step ? R - r0 : step;
        m->be->mm_bwd_bb(m->gact[MK_G_LN] + (size_t)r0 * C, G(ht), NULL,
                         (uint16_t *)(void *)m->gact[MK_G_B16],
                         m->act[MK_ACT_DLOGITS] + (size_t)r0 * V, lnf + (size_t)r0 * C, w16(m, ht),
                         n, C, V, 1, bb_scratch(m));
    }
}

int mk_forward(mk_model *m, const int *tokens, int B, int T)
{
    if (!m || !tokens) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (m->infer)
        return mk__fail(MK_ERR_STATE, "mk_forward on an inference-only model (decode with "
                                      "mk_decoder_* instead)");
    if (B < 1 || T < 1 || B > m->max_B || T > m->max_T)
        return mk__fail(MK_ERR_ARG, "batch %dx%d outside the model's %dx%d", B, T, m->max_B,
                        m->max_T);
    const mk_backend *be = m->be;
    const mk_config *c = &m->cfg;
    int L = c->n_layer, C = c->n_embd, NH = c->n_head, NKV = c->n_kv_head, hd = c->head_dim;
    int V = c->vocab_size, W = (int)mk__qkv_width(c), A = (int)mk__att_width(c);
    int F = (int)mk__mlp_in(c), H = (int)mk__mlp_hidden(c), rot = mk__rotary(c);
    size_t R = (size_t)B * T;
    int *pos = (int *)m->h_rowa; /* host scratch reused as ints */
    for (size_t i = 0; i < R; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return mk__fail(MK_ERR_ARG, "token %d at position %zu outside [0, %d)", tokens[i], i,
                            V);
        pos[i] = (int)(i % T);
    }
    be->upload(m->d_tokens, tokens, R * sizeof(int));
    be->upload(m->d_pos, pos, R * sizeof(int));
    m->B = B;
    m->T = T;
    m->have_dlogits = 0;
    float **a = m->act;
    mk__bf16_sync(m); /* MK_MODEL_BF16_TRAIN: copies of parameters changed since the last ones */
    int b16 = m->bf16_train;
    /* the final norm's output: in float, or (b16) in the scratch, kept in bfloat16 */
    float *lnf = b16 ? m->gact[MK_G_B16] : a[MK_ACT_LNF];
    uint16_t *lnfh = (uint16_t *)(void *)a[MK_ACT_LNF];
    be->embed_fwd(a[MK_ACT_ENC], m->d_tokens, m->d_pos, TP(MK_T_WTE), TP(MK_T_WPE), (int)R, C);
    for (int l = 0; l < L; l++) {
        layer_acts x = acts_of(m, l, B, T);
        if (l == 0) { /* later layers' ln1 comes with the residual sum that ends the layer before */
            mk__norm_fwd(m, x.ln1, x.ln1m, x.ln1r, x.res, LP(l, MK_P_LN1W), LP(l, MK_P_LN1B),
                         (int)R);
            keep16(m, x.ln1h, x.ln1, R * C);
        }
        prod_fwd(m, rot ? x.qkvr : x.qkv, x.ln1, x.ln1h, mk__ltensor(m, l, MK_P_QKVW),
                 LP(l, MK_P_QKVB), (int)R, C, W);
        if (rot)
            be->qk_fwd(x.qkv, x.qkr, x.qkvr, LP(l, MK_P_QNW), LP(l, MK_P_KNW), m->rope_cos,
                       m->rope_sin, m->d_pos, (int)R, NH, NKV, hd, c->norm_eps);
        be->attn_fwd(x.atty, x.att, x.qkv, B, T, NH, NKV, hd);
        keep16(m, x.attyh, x.atty, R * A);
        prod_fwd(m, x.res2, x.atty, x.attyh, mk__ltensor(m, l, MK_P_PROJW), LP(l, MK_P_PROJB),
                 (int)R, A, C);
        mk__add_norm_fwd(m, x.res2, x.ln2, x.ln2m, x.ln2r, x.res2, x.res, LP(l, MK_P_LN2W),
                         LP(l, MK_P_LN2B), (int)R);
        keep16(m, x.ln2h, x.ln2, R * C);
        if (rot) {
            prod_fwd(m, x.fch, x.ln2, x.ln2h, mk__ltensor(m, l, MK_P_FCW), LP(l, MK_P_FCB), (int)R,
                     C, F);
            be->swiglu_fwd(x.fcg, x.fch, (int)R, H);
        } else if (b16) { /* c_fc of the bfloat16 operands, then the GELU (not fused) */
            prod_fwd(m, x.fch, x.ln2, x.ln2h, mk__ltensor(m, l, MK_P_FCW), LP(l, MK_P_FCB), (int)R,
                     C, F);
            be->gelu_fwd(x.fcg, x.fch, R * F);
        } else { /* c_fc and the GELU, fused where the back-end can */
            mk__mm_gelu_fwd(be, x.fcg, x.fch, x.ln2, LP(l, MK_P_FCW), LP(l, MK_P_FCB), (int)R, C,
                            F);
        }
        keep16(m, x.fcgh, x.fcg, R * H);
        prod_fwd(m, x.res3, x.fcg, x.fcgh, mk__ltensor(m, l, MK_P_FCPW), LP(l, MK_P_FCPB), (int)R,
                 H, C);
        if (l + 1 < L) { /* the residual sum, and the next layer's ln1 of it */
            layer_acts n = acts_of(m, l + 1, B, T);
            mk__add_norm_fwd(m, x.res3, n.ln1, n.ln1m, n.ln1r, x.res3, x.res2, LP(l + 1, MK_P_LN1W),
                             LP(l + 1, MK_P_LN1B), (int)R);
            keep16(m, n.ln1h, n.ln1, R * C);
        } else { /* the residual sum, and the final norm */
            mk__add_norm_fwd(m, x.res3, lnf, a[MK_ACT_LNFM], a[MK_ACT_LNFR], x.res3, x.res2,
                             TP(MK_T_LNFW), TP(MK_T_LNFB), (int)R);
            keep16(m, lnfh, lnf, R * C);
        }
    }
    int ht = mk__head_tensor(m);
    if (b16)
        be->mm_fwd_bb(a[MK_ACT_LOGITS], lnfh, w16(m, ht), NULL, (int)R, C, V, 1, bb_scratch(m));
    else
        be->head_fwd(a[MK_ACT_LOGITS], lnf, P(ht), (int)R, C, V);
    return MK_OK;
}

int mk_model_read_logits(const mk_model *m, float *dst)
{
    if (!m || !dst) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (!m->B) return mk__fail(MK_ERR_STATE, "no forward pass yet");
    m->be->download(dst, m->act[MK_ACT_LOGITS],
                    sizeof(float) * m->B * m->T * (size_t)m->cfg.vocab_size);
    return MK_OK;
}

/* ---- losses ------------------------------------------------------------- */

/* Uploads targets, replacing those that are masked out by -1.  A target
 * outside [0, V) at an unmasked position is an error. */
static int put_targets(mk_model *m, const int *targets, const float *mask)
{
    size_t R = (size_t)m->B * m->T;
    int V = m->cfg.vocab_size;
    int *t = (int *)m->h_rowd;
    for (size_t i = 0; i < R; i++) {
        int ok = targets[i] >= 0 && targets[i] < V;
        if (mask && mask[i] == 0.0f)
            ok = 0;
        else if (!ok && mask)
            return mk__fail(MK_ERR_ARG, "target %d at position %zu outside [0, %d)", targets[i], i,
                            V);
        t[i] = ok ? targets[i] : -1;
    }
    m->be->upload(m->d_targets, t, R * sizeof(int));
    return MK_OK;
}

int mk_logprobs(mk_model *m, const int *targets, float *logp, float *entropy)
{
    if (!m || !targets) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (!m->B) return mk__fail(MK_ERR_STATE, "mk_logprobs before mk_forward");
    int rc = put_targets(m, targets, NULL);
    if (rc) return rc;
    size_t R = (size_t)m->B * m->T;
    m->be->row_stats(m->d_rowa, m->d_rowb, m->act[MK_ACT_LOGITS], m->d_targets, (int)R,
                     m->cfg.vocab_size);
    if (logp) m->be->download(logp, m->d_rowa, R * sizeof(float));
    if (entropy) m->be->download(entropy, m->d_rowb, R * sizeof(float));
    return MK_OK;
}

/* Per-row log-probs and entropies to host h_rowa, h_rowb. */
static void stats_to_host(mk_model *m)
{
    size_t R = (size_t)m->B * m->T;
    m->be->row_stats(m->d_rowa, m->d_rowb, m->act[MK_ACT_LOGITS], m->d_targets, (int)R,
                     m->cfg.vocab_size);
    m->be->download(m->h_rowa, m->d_rowa, R * sizeof(float));
    m->be->download(m->h_rowb, m->d_rowb, R * sizeof(float));
}

/* Gradient of the logits from per-row coefficients in h_rowa (on logp) and
 * h_rowb (on entropy; NULL when unused). */
static void grad_from_host(mk_model *m, int with_entropy)
{
    size_t R = (size_t)m->B * m->T;
    m->be->upload(m->d_rowa, m->h_rowa, R * sizeof(float));
    if (with_entropy) m->be->upload(m->d_rowb, m->h_rowb, R * sizeof(float));
    m->be->row_grad(m->act[MK_ACT_DLOGITS], m->act[MK_ACT_LOGITS], m->d_targets, m->d_rowa,
                    with_entropy ? m->d_rowb : NULL, (int)R, m->cfg.vocab_size);
    m->have_dlogits = 1;
}

int mk_loss_ce(mk_model *m, const int *targets, const float *weights, float *loss)
{
    if (!m || !targets) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (!m->B) return mk__fail(MK_ERR_STATE, "mk_loss_ce before mk_forward");
    size_t R = (size_t)m->B * m->T;
    if (!weights)
        for (size_t i = 0; i < R; i++)
            if (targets[i] < 0 || targets[i] >= m->cfg.vocab_size)
                return mk__fail(MK_ERR_ARG, "target %d at position %zu outside [0, %d)", targets[i],
                                i, m->cfg.vocab_size);
    int rc = put_targets(m, targets, weights);
    if (rc) return rc;
    stats_to_host(m);
    double W = 0.0, sum = 0.0;
    for (size_t i = 0; i < R; i++) {
        double w = weights ? weights[i] : 1.0;
        W += w;
        if (w != 0.0) sum += w * -(double)m->h_rowa[i];
    }
    for (size_t i = 0; i < R; i++) {
        double w = weights ? weights[i] : 1.0;
        m->h_rowa[i] = W > 0.0 ? (float)(-w / W) : 0.0f;
    }
    grad_from_host(m, 0);
    if (loss) *loss = W > 0.0 ? (float)(sum / W) : 0.0f;
    return MK_OK;
}

int mk_loss_ppo(mk_model *m, const int *targets, const float *behav_logp, const float *adv,
                const float *mask, const mk_ppo_params *p, mk_ppo_stats *stats)
{
    if (!m || !targets || !behav_logp || !adv || !p) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (!m->B) return mk__fail(MK_ERR_STATE, "mk_loss_ppo before mk_forward");
    if (p->clip_low < 0 || p->clip_low >= 1 || p->clip_high < 0 ||
        (p->ratio_cap != 0 && p->ratio_cap <= 1))
        return mk__fail(MK_ERR_ARG, "ppo params: need 0 <= clip_low < 1, clip_high >= 0, "
                                    "ratio_cap 0 or > 1");
    size_t R = (size_t)m->B * m->T;
    if (!mask)
        for (size_t i = 0; i < R; i++)
            if (targets[i] < 0 || targets[i] >= m->cfg.vocab_size)
                return mk__fail(MK_ERR_ARG, "target %d at position %zu outside [0, %d)", targets[i],
                                i, m->cfg.vocab_size);
    int rc = put_targets(m, targets, mask);
    if (rc) return rc;
    stats_to_host(m);
    double N = 0.0;
    for (size_t i = 0; i < R; i++) N += mask ? mask[i] : 1.0;
    double s_pg = 0, s_ratio = 0, s_clip = 0, s_ent = 0, s_kl = 0;
    for (size_t i = 0; i < R; i++) {
        double w = mask ? mask[i] : 1.0;
        if (w == 0.0 || N <= 0.0) {
            m->h_rowa[i] = m->h_rowb[i] = 0.0f;
            continue;
        }
        double logr = (double)m->h_rowa[i] - behav_logp[i];
        if (logr > 20.0) logr = 20.0; /* keeps exp finite; far beyond any clip */
        double r = exp(logr), A = adv[i];
        double rc_ = r < 1.0 - p->clip_low ? 1.0 - p->clip_low
                                           : (r > 1.0 + p->clip_high ? 1.0 + p->clip_high : r);
        double unclipped = -r * A, clipped = -rc_ * A;
        double L = unclipped >= clipped ? unclipped : clipped;
        int active = unclipped >= clipped;
        if (p->ratio_cap > 0 && A < 0 && L > -p->ratio_cap * A) {
            L = -p->ratio_cap * A;
            active = 0;
        }
        s_pg += w * L;
        s_ratio += w * r;
        s_clip += active ? 0.0 : w;
        s_ent += w * m->h_rowb[i];
        s_kl += w * ((r - 1.0) - logr);
        m->h_rowa[i] = active ? (float)(w / N * -A * r) : 0.0f;
        m->h_rowb[i] = (float)(-p->entropy_coef * w / N);
    }
    grad_from_host(m, p->entropy_coef != 0.0f);
    if (stats) {
        double inv = N > 0.0 ? 1.0 / N : 0.0;
        stats->pg_loss = (float)(s_pg * inv);
        stats->entropy = (float)(s_ent * inv);
        stats->loss = (float)((s_pg - p->entropy_coef * s_ent) * inv);
        stats->mean_ratio = (float)(s_ratio * inv);
        stats->clip_frac = (float)(s_clip * inv);
        stats->approx_kl = (float)(s_kl * inv);
        stats->n_tokens = (float)N;
    }
    return MK_OK;
}

/* ---- backward ----------------------------------------------------------- */

void mk_zero_grad(mk_model *m)
{
    if (!m->infer) m->be->zero(m->grads, sizeof(float) * m->n_params);
}

int mk_loss_scale(mk_model *m, float scale)
{
    if (!m) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (!m->have_dlogits) return mk__fail(MK_ERR_STATE, "mk_loss_scale before a loss");
    if (scale != 1.0f)
        m->be->scale(m->act[MK_ACT_DLOGITS], scale, (size_t)m->B * m->T * m->cfg.vocab_size);
    return MK_OK;
}

int mk_backward(mk_model *m)
{
    if (!m) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (!m->have_dlogits) return mk__fail(MK_ERR_STATE, "mk_backward before a loss");
    const mk_backend *be = m->be;
    const mk_config *c = &m->cfg;
    int B = m->B, T = m->T, L = c->n_layer, C = c->n_embd, NH = c->n_head, NKV = c->n_kv_head;
    int hd = c->head_dim, V = c->vocab_size, W = (int)mk__qkv_width(c);
    int A = (int)mk__att_width(c), F = (int)mk__mlp_in(c), H = (int)mk__mlp_hidden(c);
    int rot = mk__rotary(c);
    size_t R = (size_t)B * T;
    float **a = m->act, **g = m->gact;
    be->zero(g[MK_G_RES], R * C * sizeof(float));
    int ht = mk__head_tensor(m), b16 = m->bf16_train;
    if (b16)
        head_bwd_bb(m, (int)R);
    else
        be->head_bwd(g[MK_G_LN], G(ht), a[MK_ACT_DLOGITS], a[MK_ACT_LNF], P(ht), (int)R, C, V);
    norm_bwd(m, g[MK_G_RES], TG(MK_T_LNFW), TG(MK_T_LNFB), g[MK_G_LN],
             a[MK_ACT_RES3] + (L - 1) * R * C, TP(MK_T_LNFW), a[MK_ACT_LNFM], a[MK_ACT_LNFR],
             (int)R);
    for (int l = L - 1; l >= 0; l--) {
        layer_acts x = acts_of(m, l, B, T);
        /* MLP branch: res3 = res2 + down(act(fc(norm2(res2)))) */
        int fcpw = mk__ltensor(m, l, MK_P_FCPW);
        if (rot) {
            prod_bwd(m, g[MK_G_FCG], LG(l, MK_P_FCPB), g[MK_G_RES], x.fcg, x.fcgh, fcpw, (int)R, H,
                     C);
            be->swiglu_bwd(g[MK_G_FCH], x.fch, g[MK_G_FCG], (int)R, H);
        } else if (b16) { /* c_proj's input gradient, then the GELU's in place (not fused) */
            prod_bwd(m, g[MK_G_FCH], LG(l, MK_P_FCPB), g[MK_G_RES], x.fcg, x.fcgh, fcpw, (int)R, H,
                     C);
            be->gelu_bwd(g[MK_G_FCH], x.fch, g[MK_G_FCH], R * H);
        } else { /* c_proj's input gradient and the GELU's, fused where the back-end can */
            mk__mm_gelu_bwd(be, g[MK_G_FCH], LG(l, MK_P_FCPW), LG(l, MK_P_FCPB), g[MK_G_RES], x.fcg,
                            LP(l, MK_P_FCPW), x.fch, (int)R, H, C);
        }
        prod_bwd(m, g[MK_G_LN], LG(l, MK_P_FCB), g[MK_G_FCH], x.ln2, x.ln2h,
                 mk__ltensor(m, l, MK_P_FCW), (int)R, C, F);
        norm_bwd(m, g[MK_G_RES], LG(l, MK_P_LN2W), LG(l, MK_P_LN2B), g[MK_G_LN], x.res2,
                 LP(l, MK_P_LN2W), x.ln2m, x.ln2r, (int)R);
        /* attention branch: res2 = res + o(attn(qk(qkv(norm1(res))))) */
        prod_bwd(m, g[MK_G_ATTY], LG(l, MK_P_PROJB), g[MK_G_RES], x.atty, x.attyh,
                 mk__ltensor(m, l, MK_P_PROJW), (int)R, A, C);
        be->attn_bwd(g[MK_G_QKV], g[MK_G_ATT], g[MK_G_ATTY], x.qkv, x.att, B, T, NH, NKV, hd);
        if (rot)
            be->qk_bwd(g[MK_G_QKVR], LG(l, MK_P_QNW), LG(l, MK_P_KNW), g[MK_G_QKV], x.qkvr,
                       LP(l, MK_P_QNW), LP(l, MK_P_KNW), x.qkr, m->rope_cos, m->rope_sin, m->d_pos,
                       (int)R, NH, NKV, hd);
        prod_bwd(m, g[MK_G_LN], LG(l, MK_P_QKVB), rot ? g[MK_G_QKVR] : g[MK_G_QKV], x.ln1, x.ln1h,
                 mk__ltensor(m, l, MK_P_QKVW), (int)R, C, W);
        norm_bwd(m, g[MK_G_RES], LG(l, MK_P_LN1W), LG(l, MK_P_LN1B), g[MK_G_LN], x.res,
                 LP(l, MK_P_LN1W), x.ln1m, x.ln1r, (int)R);
    }
    be->embed_bwd(TG(MK_T_WTE), TG(MK_T_WPE), g[MK_G_RES], m->d_tokens, m->d_pos, (int)R, C);
    return MK_OK;
}

/* ---- optimiser ---------------------------------------------------------- */

double mk_model_grad_sumsq(mk_model *m)
{
    return m->infer ? 0.0 : m->be->sumsq(m->grads, m->n_params);
}

int mk_model_step(mk_model *m, const mk_adamw_params *p, int t, float *grad_norm)
{
    if (!m || !p || t < 1) return mk__fail(MK_ERR_ARG, "bad AdamW arguments (step %d)", t);
    if (m->infer) return mk__fail(MK_ERR_STATE, "mk_model_step on an inference-only model");
    if (m->m_len != m->n_params)
        return mk__fail(MK_ERR_STATE, "mk_model_step: the moments cover only [%zu, %zu)", m->m_off,
                        m->m_off + m->m_len);
    double ss = m->be->sumsq(m->grads, m->n_params);
    if (grad_norm) *grad_norm = (float)sqrt(ss);
    float f = mk_clip_factor(ss, p->grad_clip);
    if (f < 1.0f) m->be->scale(m->grads, f, m->n_params);
    for (int i = 0; i < m->n_tensors; i++) {
        const mk_tensor_info *ti = &m->tensors[i];
        float wd = ti->ndim == 2 ? p->weight_decay : 0.0f;
        m->be->adamw(m->params + ti->offset, m->grads + ti->offset, m->m + ti->offset,
                     m->v + ti->offset, ti->numel, p->lr, p->beta1, p->beta2, p->eps, wd, t);
    }
    mk__params_changed(m);
    return MK_OK;
}
