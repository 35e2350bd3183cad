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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mk_internal.h"

/* ---- configuration and size table --------------------------------------- */

int mk_config_check(const mk_config *c)
{
    if (!c) return mk__fail(MK_ERR_ARG, "config is NULL");
    if (c->n_layer <= 0 || c->n_head <= 0 || c->n_embd <= 0 || c->block_size <= 0 ||
        c->vocab_size <= 0)
        return mk__fail(MK_ERR_ARG,
                        "config fields must be positive (n_layer %d n_head %d n_embd %d "
                        "block_size %d vocab_size %d)",
                        c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size);
    if (c->n_embd % c->n_head)
        return mk__fail(MK_ERR_ARG, "n_head %d does not divide n_embd %d", c->n_head, c->n_embd);
    return MK_OK;
}

static const char *const layer_names[MK_P_PER_LAYER] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
};

/* Appends a tensor of d0 x d1 floats (d1 = 0: a vector of d0) named name to the table t (may be
 * NULL: then only counts), at *off, which it advances. */
static void add_tensor(mk_tensor_info *t, int *n, size_t *off, const char *name, int d0, int d1)
{
    size_t numel = (size_t)d0 * (d1 > 0 ? (size_t)d1 : 1);
    if (t) {
        mk_tensor_info *e = &t[*n];
        snprintf(e->name, sizeof e->name, "%s", name);
        e->offset = *off;
        e->ndim = d1 > 0 ? 2 : 1;
        e->shape[0] = d0;
        e->shape[1] = d1 > 0 ? d1 : 0;
        e->numel = numel;
    }
    *off += numel;
    (*n)++;
}

/* Fills t[] (may be NULL) and returns the number of tensors; *total gets the
 * number of parameters. */
static int build_table(const mk_config *c, mk_tensor_info *t, size_t *total)
{
    int n = 0, C = c->n_embd;
    size_t off = 0;
    add_tensor(t, &n, &off, "wte.weight", c->vocab_size, C);
    add_tensor(t, &n, &off, "wpe.weight", c->block_size, C);
    const int d0[MK_P_PER_LAYER] = {C, C, C, 3 * C, C, C, C, C, C, 4 * C, 4 * C, C};
    const int d1[MK_P_PER_LAYER] = {0, 0, 3 * C, 0, C, 0, 0, 0, 4 * C, 0, C, 0};
    for (int l = 0; l < c->n_layer; l++)
        for (int k = 0; k < MK_P_PER_LAYER; k++) {
            char name[sizeof t->name];
            snprintf(name, sizeof name, "h.%d.%s", l, layer_names[k]);
            add_tensor(t, &n, &off, name, d0[k], d1[k]);
        }
    add_tensor(t, &n, &off, "ln_f.weight", C, 0);
    add_tensor(t, &n, &off, "ln_f.bias", C, 0);
    *total = off;
    return n;
}

size_t mk_config_num_params(const mk_config *cfg)
{
    if (mk_config_check(cfg) != MK_OK) return 0;
    size_t total;
    build_table(cfg, NULL, &total);
    return total;
}

/* ---- model lifetime ----------------------------------------------------- */

static void act_sizes(const mk_config *c, int B, int T, size_t *s)
{
    size_t L = c->n_layer, C = c->n_embd, R = (size_t)B * T, NH = c->n_head;
    s[MK_ACT_ENC] = R * C;
    s[MK_ACT_LN1] = L * R * C;
    s[MK_ACT_LN1M] = L * R;
    s[MK_ACT_LN1R] = L * R;
    s[MK_ACT_QKV] = L * R * 3 * C;
    s[MK_ACT_ATTY] = L * R * C;
    s[MK_ACT_ATT] = L * B * NH * T * T;
    s[MK_ACT_RES2] = L * R * C;
    s[MK_ACT_LN2] = L * R * C;
    s[MK_ACT_LN2M] = L * R;
    s[MK_ACT_LN2R] = L * R;
    s[MK_ACT_FCH] = L * R * 4 * C;
    s[MK_ACT_FCG] = L * R * 4 * C;
    s[MK_ACT_RES3] = L * R * C;
    s[MK_ACT_LNF] = R * C;
    s[MK_ACT_LNFM] = R;
    s[MK_ACT_LNFR] = R;
    s[MK_ACT_LOGITS] = R * c->vocab_size;
    s[MK_ACT_DLOGITS] = R * c->vocab_size;
}

static void gact_sizes(const mk_config *c, int B, int T, size_t *s)
{
    size_t C = c->n_embd, R = (size_t)B * T, NH = c->n_head;
    s[MK_G_RES] = R * C;
    s[MK_G_LN] = R * C;
    s[MK_G_QKV] = R * 3 * C;
    s[MK_G_ATTY] = R * C;
    s[MK_G_FCH] = R * 4 * C;
    s[MK_G_FCG] = R * 4 * C;
    s[MK_G_ATT] = B * NH * T * T;
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

int mk_model_new(mk_model **out, const mk_config *cfg, int max_batch, int max_seq,
                 const mk_backend *be)
{
    if (!out) return mk__fail(MK_ERR_ARG, "out is NULL");
    *out = NULL;
    int rc = mk_config_check(cfg);
    if (rc) return rc;
    if (max_batch < 1 || max_seq < 1 || max_seq > cfg->block_size)
        return mk__fail(MK_ERR_ARG, "max_batch %d, max_seq %d: need >= 1 and max_seq <= %d",
                        max_batch, max_seq, cfg->block_size);
    if (!be) be = &mk__cpu_backend;
    if (be == &mk__cpu_backend) mk__blas_init();
    mk_model *m = calloc(1, sizeof *m);
    if (!m) return mk__fail(MK_ERR_NOMEM, "cannot allocate model");
    m->cfg = *cfg;
    m->be = be;
    m->max_B = max_batch;
    m->max_T = max_seq;
    size_t total;
    m->n_tensors = build_table(cfg, NULL, &total);
    m->tensors = calloc((size_t)m->n_tensors, sizeof *m->tensors);
    size_t R = (size_t)max_batch * max_seq;
    m->h_rowa = malloc(sizeof(float) * R * 4);
    if (!m->tensors || !m->h_rowa) {
        mk_model_free(m);
        return mk__fail(MK_ERR_NOMEM, "cannot allocate model tables");
    }
    m->h_rowb = m->h_rowa + R;
    m->h_rowc = m->h_rowb + R;
    m->h_rowd = m->h_rowc + R;
    build_table(cfg, m->tensors, &m->n_params);
    act_sizes(cfg, max_batch, max_seq, m->act_size);
    size_t gsz[MK_G_N];
    gact_sizes(cfg, max_batch, max_seq, gsz);
    size_t n_act = carve(NULL, m->act_size, NULL, MK_ACT_N);
    size_t n_gact = carve(NULL, gsz, NULL, MK_G_N);
    size_t P = m->n_params * sizeof(float);
    if ((rc = be->alloc((void **)&m->params, P)) || (rc = be->alloc((void **)&m->grads, P)) ||
        (rc = be->alloc((void **)&m->m, P)) || (rc = be->alloc((void **)&m->v, P)) ||
        (rc = be->alloc((void **)&m->acts_mem, n_act * sizeof(float))) ||
        (rc = be->alloc((void **)&m->gacts_mem, n_gact * sizeof(float))) ||
        (rc = be->alloc((void **)&m->d_tokens, R * sizeof(int))) ||
        (rc = be->alloc((void **)&m->d_targets, R * sizeof(int))) ||
        (rc = be->alloc((void **)&m->d_pos, R * sizeof(int))) ||
        (rc = be->alloc((void **)&m->d_rowa, R * sizeof(float))) ||
        (rc = be->alloc((void **)&m->d_rowb, R * sizeof(float)))) {
        mk_model_free(m);
        return rc;
    }
    carve(m->acts_mem, m->act_size, m->act, MK_ACT_N);
    carve(m->gacts_mem, gsz, m->gact, MK_G_N);
    *out = m;
    return MK_OK;
}

void mk_model_free(mk_model *m)
{
    if (!m) return;
    void *dev[] = {m->params,   m->grads,     m->m,     m->v,      m->acts_mem, m->gacts_mem,
                   m->d_tokens, m->d_targets, m->d_pos, m->d_rowa, m->d_rowb};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) m->be->release(dev[i]);
    free(m->tensors);
    free(m->h_rowa);
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
    if (!rc && n) m->be->upload(m->params + off, src, n * sizeof(float));
    return rc;
}

int mk_model_read_grads(const mk_model *m, float *dst, size_t off, size_t n)
{
    int rc = range_ok(m, dst, off, n);
    if (!rc && n) m->be->download(dst, m->grads + off, n * sizeof(float));
    return rc;
}

int mk_model_write_grads(mk_model *m, const float *src, size_t off, size_t n)
{
    int rc = range_ok(m, src, off, n);
    if (!rc && n) m->be->upload(m->grads + off, src, n * sizeof(float));
    return rc;
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
        int is_ln = strstr(nm, "ln_") != NULL;
        if (is_bias) {
            memset(p, 0, sizeof(float) * t->numel);
        } else if (is_ln) {
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        } else {
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
    m->be->zero(m->m, sizeof(float) * m->n_params);
    m->be->zero(m->v, sizeof(float) * m->n_params);
}

/* ---- forward ------------------------------------------------------------ */

int mk_forward(mk_model *m, const int *tokens, int B, int T)
{
    if (!m || !tokens) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (B < 1 || T < 1 || B > m->max_B || T > m->max_T)
        return mk__fail(MK_ERR_ARG, "batch %dx%d outside the model's %dx%d", B, T, m->max_B,
                        m->max_T);
    const mk_backend *be = m->be;
    int L = m->cfg.n_layer, C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size;
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
    be->embed_fwd(a[MK_ACT_ENC], m->d_tokens, m->d_pos, P(0), P(1), (int)R, C);
    for (int l = 0; l < L; l++) {
        const float *res = l == 0 ? a[MK_ACT_ENC] : a[MK_ACT_RES3] + (l - 1) * R * C;
        float *ln1 = a[MK_ACT_LN1] + l * R * C, *qkv = a[MK_ACT_QKV] + l * R * 3 * C;
        float *atty = a[MK_ACT_ATTY] + l * R * C, *res2 = a[MK_ACT_RES2] + l * R * C;
        float *ln2 = a[MK_ACT_LN2] + l * R * C, *res3 = a[MK_ACT_RES3] + l * R * C;
        float *fch = a[MK_ACT_FCH] + l * R * 4 * C, *fcg = a[MK_ACT_FCG] + l * R * 4 * C;
        float *att = a[MK_ACT_ATT] + (size_t)l * B * NH * T * T;
        be->ln_fwd(ln1, a[MK_ACT_LN1M] + l * R, a[MK_ACT_LN1R] + l * R, res, LP(l, MK_P_LN1W),
                   LP(l, MK_P_LN1B), (int)R, C);
        be->mm_fwd(qkv, ln1, LP(l, MK_P_QKVW), LP(l, MK_P_QKVB), (int)R, C, 3 * C);
        be->attn_fwd(atty, att, qkv, B, T, C, NH);
        be->mm_fwd(res2, atty, LP(l, MK_P_PROJW), LP(l, MK_P_PROJB), (int)R, C, C);
        be->add(res2, res2, res, R * C);
        be->ln_fwd(ln2, a[MK_ACT_LN2M] + l * R, a[MK_ACT_LN2R] + l * R, res2, LP(l, MK_P_LN2W),
                   LP(l, MK_P_LN2B), (int)R, C);
        be->mm_fwd(fch, ln2, LP(l, MK_P_FCW), LP(l, MK_P_FCB), (int)R, C, 4 * C);
        be->gelu_fwd(fcg, fch, R * 4 * C);
        be->mm_fwd(res3, fcg, LP(l, MK_P_FCPW), LP(l, MK_P_FCPB), (int)R, 4 * C, C);
        be->add(res3, res3, res2, R * C);
    }
    int nt = m->n_tensors;
    be->ln_fwd(a[MK_ACT_LNF], a[MK_ACT_LNFM], a[MK_ACT_LNFR], a[MK_ACT_RES3] + (L - 1) * R * C,
               P(nt - 2), P(nt - 1), (int)R, C);
    be->head_fwd(a[MK_ACT_LOGITS], a[MK_ACT_LNF], P(0), (int)R, C, V);
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
    m->be->zero(m->grads, sizeof(float) * m->n_params);
}

int mk_backward(mk_model *m)
{
    if (!m) return mk__fail(MK_ERR_ARG, "NULL argument");
    if (!m->have_dlogits) return mk__fail(MK_ERR_STATE, "mk_backward before a loss");
    const mk_backend *be = m->be;
    int B = m->B, T = m->T, L = m->cfg.n_layer, C = m->cfg.n_embd, NH = m->cfg.n_head,
        V = m->cfg.vocab_size, nt = m->n_tensors;
    size_t R = (size_t)B * T;
    float **a = m->act, **g = m->gact;
    be->zero(g[MK_G_RES], R * C * sizeof(float));
    be->head_bwd(g[MK_G_LN], G(0), a[MK_ACT_DLOGITS], a[MK_ACT_LNF], P(0), (int)R, C, V);
    be->ln_bwd(g[MK_G_RES], G(nt - 2), G(nt - 1), g[MK_G_LN], a[MK_ACT_RES3] + (L - 1) * R * C,
               P(nt - 2), a[MK_ACT_LNFM], a[MK_ACT_LNFR], (int)R, C);
    for (int l = L - 1; l >= 0; l--) {
        const float *res = l == 0 ? a[MK_ACT_ENC] : a[MK_ACT_RES3] + (l - 1) * R * C;
        float *ln1 = a[MK_ACT_LN1] + l * R * C, *qkv = a[MK_ACT_QKV] + l * R * 3 * C;
        float *atty = a[MK_ACT_ATTY] + l * R * C, *res2 = a[MK_ACT_RES2] + l * R * C;
        float *ln2 = a[MK_ACT_LN2] + l * R * C;
        float *fch = a[MK_ACT_FCH] + l * R * 4 * C, *fcg = a[MK_ACT_FCG] + l * R * 4 * C;
        float *att = a[MK_ACT_ATT] + (size_t)l * B * NH * T * T;
        /* MLP branch: res3 = res2 + proj(gelu(fc(ln2(res2)))) */
        be->mm_bwd(g[MK_G_FCG], LG(l, MK_P_FCPW), LG(l, MK_P_FCPB), g[MK_G_RES], fcg,
                   LP(l, MK_P_FCPW), (int)R, 4 * C, C);
        be->gelu_bwd(g[MK_G_FCH], fch, g[MK_G_FCG], R * 4 * C);
        be->mm_bwd(g[MK_G_LN], LG(l, MK_P_FCW), LG(l, MK_P_FCB), g[MK_G_FCH], ln2, LP(l, MK_P_FCW),
                   (int)R, C, 4 * C);
        be->ln_bwd(g[MK_G_RES], LG(l, MK_P_LN2W), LG(l, MK_P_LN2B), g[MK_G_LN], res2,
                   LP(l, MK_P_LN2W), a[MK_ACT_LN2M] + l * R, a[MK_ACT_LN2R] + l * R, (int)R, C);
        /* attention branch: res2 = res + proj(attn(qkv(ln1(res)))) */
        be->mm_bwd(g[MK_G_ATTY], LG(l, MK_P_PROJW), LG(l, MK_P_PROJB), g[MK_G_RES], atty,
                   LP(l, MK_P_PROJW), (int)R, C, C);
        be->attn_bwd(g[MK_G_QKV], g[MK_G_ATT], g[MK_G_ATTY], qkv, att, B, T, C, NH);
        be->mm_bwd(g[MK_G_LN], LG(l, MK_P_QKVW), LG(l, MK_P_QKVB), g[MK_G_QKV], ln1,
                   LP(l, MK_P_QKVW), (int)R, C, 3 * C);
        be->ln_bwd(g[MK_G_RES], LG(l, MK_P_LN1W), LG(l, MK_P_LN1B), g[MK_G_LN], res,
                   LP(l, MK_P_LN1W), a[MK_ACT_LN1M] + l * R, a[MK_ACT_LN1R] + l * R, (int)R, C);
    }
    be->embed_bwd(G(0), G(1), g[MK_G_RES], m->d_tokens, m->d_pos, (int)R, C);
    return MK_OK;
}

/* ---- optimiser ---------------------------------------------------------- */

double mk_model_grad_sumsq(mk_model *m)
{
    return m->be->sumsq(m->grads, m->n_params);
}

int mk_model_step(mk_model *m, const mk_adamw_params *p, int t, float *grad_norm)
{
    if (!m || !p || t < 1) return mk__fail(MK_ERR_ARG, "bad AdamW arguments (step %d)", t);
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
    return MK_OK;
}
