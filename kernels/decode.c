/*
 * decode.c - batched decoding with a per-slot KV cache (continuous batching).
 *
 * The decoder owns, per layer, a key cache and a value cache of shape
 * [S, context, NKV hd] in back-end memory (context: block_size, or less with
 * mk_decoder_new_ctx), a length and a pending token per
 * slot, and a generator per slot.  Both appending given tokens and a step go
 * through one routine, run_rows(), over a ragged batch of rows: row r is
 * token tok[r] of slot slot[r] at position pos[r].  For each layer it first
 * stores every row's key and value in the cache, then lets every row attend to
 * its own slot's cache up to its position; so rows of one slot in one call
 * (a multi-token append) see each other causally, and rows of different slots
 * never mix.  Only a step computes logits, and only for its rows.
 *
 * The decoder reads the model's parameters at every call, so writing new
 * weights into the model between calls takes effect at the next call, with
 * the caches left as they were computed.  With MK_MODEL_BF16_WEIGHTS the
 * products use the model's bfloat16 copies of the weights, remade at the start
 * of a call when the parameters were written since the last.  With
 * MK_MODEL_BF16_KV the caches hold bfloat16s (kv_store_bf16 rounds, and
 * attn_decode_bf16 widens as it reads), half the bytes of float caches.
 *
 * Sampling: on a back-end with sample_rows (CUDA) a step samples where the
 * logits are; the host draws each row's uniform from the slot's generator
 * (mk__sample_draw, as mk_sample would), and only tokens and log-probs come
 * back.  The logits stay in back-end memory, row lg_row[s] of the step that
 * made them, and are copied to the host copy (h_logits) when
 * mk_decoder_last_logits asks, or when a later step that does not list the
 * slot is about to overwrite them.  Without sample_rows (CPU) a step copies
 * each row's logits to h_logits and samples there with mk_sample.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "mk_internal.h"

struct mk_decoder {
    mk_model *m;
    int S, Tmax, max_rows;
    void *kc, *vc;               /* back-end [L, S, Tmax, NKV hd] floats, or uint16_t bfloat16s
                                    (MK_MODEL_BF16_KV) */
    float *x, *ln, *qkvr;        /* back-end row buffers: [R,C], [R,C], [R,W] (rotary) */
    float *qkv, *atty;           /* [R,W], [R,A] */
    float *fch, *fcg;            /* [R,F], [R,H] (SwiGLU; GELU works in place in fch) */
    float *logits;               /* [S,V] */
    float *att;                  /* back-end [max_rows, NH, Tmax] scores */
    void *b16x;                  /* back-end scratch of the bfloat16 products (or NULL) */
    int *d_tok, *d_slot, *d_pos; /* back-end [max_rows] */
    int *h_tok, *h_slot, *h_pos; /* host [max_rows] */
    int *len, *pending;          /* host [S] */
    mk_rng *rng;                 /* host [S] */
    float *h_logits;             /* host [S, V] the logits of each slot's last step */
    void *sample_scratch;        /* n_scratch x MK_SAMPLE_SCRATCH(V) */
    int n_scratch;
    /* sampling in the back-end (be->sample_rows) */
    int *lg_row;   /* host [S]: slot s's last logits are row lg_row[s] of d->logits; -1: in
                      h_logits (or none) */
    float *swork;  /* back-end [S, V] the sampler's scratch */
    float *d_sp;   /* back-end [3S] a step's temperatures, top-p, uniforms (n each) */
    void **graphs; /* host [S + 1]: the CUDA graph of a step of R rows (be->graph_run), or NULL */
    int *d_so;     /* back-end [3S] a step's tokens, then logp_sample, logp_policy (floats) */
    float *h_sp;   /* host [3S] */
    int *h_so;     /* host [3S] */
};

int mk_decoder_new(mk_decoder **out, mk_model *m, int n_slots)
{
    if (!m) return mk__fail(MK_ERR_ARG, "mk_decoder_new: need a model");
    return mk_decoder_new_ctx(out, m, n_slots, m->cfg.block_size);
}

/* The widest input of a decoding product (the scratch of the bfloat16 products) */
static size_t bf16_max_in(const mk_config *c)
{
    size_t C = c->n_embd, A = mk__att_width(c), H = mk__mlp_hidden(c);
    return C > A ? (C > H ? C : H) : (A > H ? A : H);
}

int mk_decoder_new_ctx(mk_decoder **out, mk_model *m, int n_slots, int context)
{
    if (!out || !m || n_slots < 1)
        return mk__fail(MK_ERR_ARG, "mk_decoder_new: need a model and n_slots >= 1");
    *out = NULL;
    const mk_config *c = &m->cfg;
    if (context < 1 || context > c->block_size)
        return mk__fail(MK_ERR_ARG, "decoder context %d outside [1, block_size %d]", context,
                        c->block_size);
    mk_decoder *d = calloc(1, sizeof *d);
    if (!d) return mk__fail(MK_ERR_NOMEM, "cannot allocate decoder");
    const mk_backend *be = m->be;
    size_t C = c->n_embd, V = c->vocab_size, W = mk__qkv_width(c), A = mk__att_width(c);
    size_t F = mk__mlp_in(c), H = mk__mlp_hidden(c), KV = (size_t)c->n_kv_head * c->head_dim;
    int rot = mk__rotary(c);
    d->m = m;
    d->S = n_slots;
    d->Tmax = context;
    d->max_rows = n_slots > context ? n_slots : context;
    size_t Rm = d->max_rows, cache = (size_t)c->n_layer * n_slots * d->Tmax * KV;
    size_t kv_bytes = cache * (m->bf16_kv ? sizeof(uint16_t) : sizeof(float));
    int rc;
    d->len = calloc((size_t)n_slots * 2, sizeof(int));
    d->rng = calloc((size_t)n_slots, sizeof(mk_rng));
    d->h_tok = malloc(sizeof(int) * Rm * 3);
    d->h_logits = calloc((size_t)n_slots * V, sizeof(float));
    /* one sampler scratch per thread that samples (slots are sampled in parallel) */
    int nsc = omp_get_max_threads();
    d->n_scratch = nsc < 1 ? 1 : (nsc > n_slots ? n_slots : nsc);
    d->sample_scratch = malloc(MK_SAMPLE_SCRATCH(V) * (size_t)d->n_scratch);
    d->lg_row = malloc(sizeof(int) * (size_t)n_slots);
    d->h_sp = malloc(sizeof(float) * 3 * (size_t)n_slots);
    d->h_so = malloc(sizeof(int) * 3 * (size_t)n_slots);
    if (be->graph_run) d->graphs = calloc((size_t)n_slots + 1, sizeof(void *));
    if (!d->len || !d->rng || !d->h_tok || !d->h_logits || !d->sample_scratch || !d->lg_row ||
        !d->h_sp || !d->h_so || (be->graph_run && !d->graphs)) {
        mk_decoder_free(d);
        return mk__fail(MK_ERR_NOMEM, "cannot allocate decoder tables");
    }
    d->pending = d->len + n_slots;
    d->h_slot = d->h_tok + Rm;
    d->h_pos = d->h_slot + Rm;
    if ((rc = be->alloc(&d->kc, kv_bytes)) || (rc = be->alloc(&d->vc, kv_bytes)) ||
        (rc = be->alloc((void **)&d->x, Rm * C * sizeof(float))) ||
        (rc = be->alloc((void **)&d->ln, Rm * C * sizeof(float))) ||
        (rot && (rc = be->alloc((void **)&d->qkvr, Rm * W * sizeof(float)))) ||
        (rc = be->alloc((void **)&d->qkv, Rm * W * sizeof(float))) ||
        (rc = be->alloc((void **)&d->atty, Rm * A * sizeof(float))) ||
        (rc = be->alloc((void **)&d->att, Rm * c->n_head * d->Tmax * sizeof(float))) ||
        (rc = be->alloc((void **)&d->fch, Rm * F * sizeof(float))) ||
        (rot && (rc = be->alloc((void **)&d->fcg, Rm * H * sizeof(float)))) ||
        (rc = be->alloc((void **)&d->logits, (size_t)n_slots * V * sizeof(float))) ||
        (rc = be->alloc((void **)&d->d_tok, Rm * sizeof(int))) ||
        (rc = be->alloc((void **)&d->d_slot, Rm * sizeof(int))) ||
        (rc = be->alloc((void **)&d->d_pos, Rm * sizeof(int))) ||
        (m->b16_products && (rc = be->alloc(&d->b16x, MK_BF16A_SCRATCH(Rm, bf16_max_in(c))))) ||
        (be->sample_rows &&
         ((rc = be->alloc((void **)&d->swork, (size_t)n_slots * V * sizeof(float))) ||
          (rc = be->alloc((void **)&d->d_sp, (size_t)n_slots * 3 * sizeof(float))) ||
          (rc = be->alloc((void **)&d->d_so, (size_t)n_slots * 3 * sizeof(int)))))) {
        mk_decoder_free(d);
        return rc;
    }
    for (int s = 0; s < n_slots; s++) mk_rng_seed(&d->rng[s], (uint64_t)s);
    for (int s = 0; s < n_slots; s++) d->lg_row[s] = -1;
    *out = d;
    return MK_OK;
}

void mk_decoder_free(mk_decoder *d)
{
    if (!d) return;
    void *dev[] = {d->kc,     d->vc,    d->x,    d->ln,    d->qkvr,   d->qkv,
                   d->atty,   d->att,   d->fch,  d->fcg,   d->logits, d->d_tok,
                   d->d_slot, d->d_pos, d->b16x, d->swork, d->d_sp,   d->d_so};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) d->m->be->release(dev[i]);
    free(d->len);
    free(d->rng);
    free(d->h_tok);
    free(d->h_logits);
    free(d->sample_scratch);
    free(d->lg_row);
    free(d->h_sp);
    free(d->h_so);
    if (d->graphs)
        for (int r = 0; r <= d->S; r++)
            if (d->graphs[r]) d->m->be->graph_free(d->graphs[r]);
    free(d->graphs);
    free(d);
}

int mk_decoder_num_slots(const mk_decoder *d)
{
    return d->S;
}

int mk_decoder_reset(mk_decoder *d, int slot, uint64_t seed)
{
    if (!d || slot < 0 || slot >= d->S) return mk__fail(MK_ERR_ARG, "slot %d out of range", slot);
    d->len[slot] = 0;
    d->pending[slot] = -1;
    d->lg_row[slot] = -1; /* its last logits are no longer asked for */
    mk_rng_seed(&d->rng[slot], seed);
    return MK_OK;
}

int mk_decoder_len(const mk_decoder *d, int slot)
{
    if (!d || slot < 0 || slot >= d->S) return mk__fail(MK_ERR_ARG, "slot %d out of range", slot);
    return d->len[slot];
}

/* Copies slot s's last logits from back-end memory to h_logits if they are only there. */
static void fetch_logits(mk_decoder *d, int s)
{
    if (d->lg_row[s] < 0) return;
    size_t V = d->m->cfg.vocab_size;
    d->m->be->download(d->h_logits + (size_t)s * V, d->logits + (size_t)d->lg_row[s] * V,
                       V * sizeof(float));
    d->lg_row[s] = -1;
}

const float *mk_decoder_last_logits(const mk_decoder *d, int slot)
{
    if (!d || slot < 0 || slot >= d->S) return NULL;
    /* the decoder is the caller's (not a const object): the copy is a cache filled on demand */
    fetch_logits((mk_decoder *)d, slot);
    return d->h_logits + (size_t)slot * d->m->cfg.vocab_size;
}

/* A product by tensor i's bfloat16 copy */
static void product_bf16(const mk_decoder *d, float *out, const float *inp, int i,
                         const float *bias, int R, int IC, int OC)
{
    const mk_model *m = d->m;
    if (m->b16_products)
        m->be->mm_fwd_bf16a(out, inp, m->wb16 + m->b16_off[i], bias, R, IC, OC, d->b16x);
    else
        m->be->mm_fwd_bf16(out, inp, m->wb16 + m->b16_off[i], bias, R, IC, OC);
}

/* out[R,OC] = inp[R,IC] times block tensor k of layer l, plus bias: with the float weights,
 * or their bfloat16 copies (MK_MODEL_BF16_WEIGHTS, with MK_MODEL_BF16_PRODUCTS rounding the
 * activations too). */
static void linear(const mk_decoder *d, float *out, const float *inp, int l, int k,
                   const float *bias, int R, int IC, int OC)
{
    const mk_model *m = d->m;
    int i = mk__ltensor(m, l, k);
    if (m->wb16)
        product_bf16(d, out, inp, i, bias, R, IC, OC);
    else
        m->be->mm_fwd(out, inp, P(i), bias, R, IC, OC);
}

/* what rows_body works on: only values that are the same at every step of R rows, so that a
 * CUDA graph of it can be replayed (graph_run) */
typedef struct rows_job {
    mk_decoder *d;
    int R, want_logits;
} rows_job;

/* The model over R rows already uploaded (d_tok, d_slot, d_pos): launches only, no copy */
static void rows_body(void *job)
{
    const rows_job *j = job;
    mk_decoder *d = j->d;
    int R = j->R, want_logits = j->want_logits;
    mk_model *m = d->m;
    const mk_backend *be = m->be;
    const mk_config *c = &m->cfg;
    int L = c->n_layer, C = c->n_embd, NH = c->n_head, NKV = c->n_kv_head, hd = c->head_dim;
    int V = c->vocab_size, W = (int)mk__qkv_width(c), A = (int)mk__att_width(c);
    int F = (int)mk__mlp_in(c), H = (int)mk__mlp_hidden(c), rot = mk__rotary(c);
    size_t RC = (size_t)R * C, layer_cache = (size_t)d->S * d->Tmax * NKV * hd;
    be->embed_fwd(d->x, d->d_tok, d->d_pos, TP(MK_T_WTE), TP(MK_T_WPE), R, C);
    for (int l = 0; l < L; l++) {
        size_t lc = l * layer_cache;
        if (l == 0) /* later layers' ln1 comes with the residual sum ending the layer before */
            mk__norm_fwd(m, d->ln, NULL, NULL, d->x, LP(l, MK_P_LN1W), LP(l, MK_P_LN1B), R);
        linear(d, rot ? d->qkvr : d->qkv, d->ln, l, MK_P_QKVW, LP(l, MK_P_QKVB), R, C, W);
        if (rot)
            be->qk_fwd(d->qkv, NULL, d->qkvr, LP(l, MK_P_QNW), LP(l, MK_P_KNW), m->rope_cos,
                       m->rope_sin, d->d_pos, R, NH, NKV, hd, c->norm_eps);
        if (m->bf16_kv) {
            uint16_t *kc = (uint16_t *)d->kc + lc, *vc = (uint16_t *)d->vc + lc;
            be->kv_store_bf16(kc, vc, d->qkv, d->d_slot, d->d_pos, R, NH, NKV, hd, d->Tmax);
            be->attn_decode_bf16(d->atty, d->att, d->qkv, kc, vc, d->d_slot, d->d_pos, R, NH, NKV,
                                 hd, d->Tmax);
        } else {
            float *kc = (float *)d->kc + lc, *vc = (float *)d->vc + lc;
            be->kv_store(kc, vc, d->qkv, d->d_slot, d->d_pos, R, NH, NKV, hd, d->Tmax);
            be->attn_decode(d->atty, d->att, d->qkv, kc, vc, d->d_slot, d->d_pos, R, NH, NKV, hd,
                            d->Tmax);
        }
        linear(d, d->ln, d->atty, l, MK_P_PROJW, LP(l, MK_P_PROJB), R, A, C);
        mk__add_norm_fwd(m, d->x, d->ln, NULL, NULL, d->x, d->ln, LP(l, MK_P_LN2W),
                         LP(l, MK_P_LN2B), R);
        float *hid = d->fch;
        if (!rot && !m->wb16) { /* float weights: c_fc and the GELU, fused where the back-end can */
            mk__mm_gelu_fwd(be, d->fch, NULL, d->ln, LP(l, MK_P_FCW), LP(l, MK_P_FCB), R, C, F);
        } else {
            linear(d, d->fch, d->ln, l, MK_P_FCW, LP(l, MK_P_FCB), R, C, F);
            if (rot) {
                be->swiglu_fwd(d->fcg, d->fch, R, H);
                hid = d->fcg;
            } else {
                be->gelu_fwd(d->fch, d->fch, (size_t)R * F);
            }
        }
        linear(d, d->ln, hid, l, MK_P_FCPW, LP(l, MK_P_FCPB), R, H, C);
        /* the residual sum, and the norm of it that comes next: the next layer's ln1, or the
         * final norm when logits are wanted */
        if (l + 1 < L)
            mk__add_norm_fwd(m, d->x, d->ln, NULL, NULL, d->x, d->ln, LP(l + 1, MK_P_LN1W),
                             LP(l + 1, MK_P_LN1B), R);
        else if (want_logits)
            mk__add_norm_fwd(m, d->x, d->ln, NULL, NULL, d->x, d->ln, TP(MK_T_LNFW), TP(MK_T_LNFB),
                             R);
        else
            be->add(d->x, d->x, d->ln, RC);
    }
    if (want_logits) {
        int ht = mk__head_tensor(m);
        if (m->wb16) /* the copy is the head transposed, [C, V] */
            product_bf16(d, d->logits, d->ln, ht, NULL, R, C, V);
        else
            be->head_fwd(d->logits, d->ln, P(ht), R, C, V);
    }
}

/* Runs R rows (host h_tok/h_slot/h_pos) through the model, storing keys and values; with
 * want_logits, leaves logits [R,V] in d->logits.  A step (want_logits) replays the CUDA graph
 * of its row count where the back-end has graphs (d->graphs); prompts run as they stand. */
static void run_rows(mk_decoder *d, int R, int want_logits)
{
    mk_model *m = d->m;
    const mk_backend *be = m->be;
    mk__bf16_sync(m); /* new weights since the last call: remake the bfloat16 copies */
    be->upload(d->d_tok, d->h_tok, sizeof(int) * R);
    be->upload(d->d_slot, d->h_slot, sizeof(int) * R);
    be->upload(d->d_pos, d->h_pos, sizeof(int) * R);
    rows_job j = {d, R, want_logits};
    if (want_logits && d->graphs && R <= d->S)
        be->graph_run(&d->graphs[R], rows_body, &j);
    else
        rows_body(&j);
}

int mk_decoder_append(mk_decoder *d, int slot, const int *tokens, int n)
{
    if (!d || slot < 0 || slot >= d->S || !tokens || n < 1)
        return mk__fail(MK_ERR_ARG, "mk_decoder_append: slot %d, n %d", slot, n);
    int V = d->m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return mk__fail(MK_ERR_ARG, "token %d outside [0, %d)", tokens[i], V);
    int len = d->len[slot];
    if (len + n > d->Tmax)
        return mk__fail(MK_ERR_FULL, "slot %d holds %d tokens; %d more exceed the context %d", slot,
                        len, n, d->Tmax);
    /* rows: the pending token (if any), then every given token but the last */
    int R = 0;
    if (len > 0) {
        d->h_tok[R] = d->pending[slot];
        d->h_pos[R] = len - 1;
        d->h_slot[R++] = slot;
    }
    for (int i = 0; i < n - 1; i++) {
        d->h_tok[R] = tokens[i];
        d->h_pos[R] = len + i;
        d->h_slot[R++] = slot;
    }
    if (R > 0) run_rows(d, R, 0);
    d->len[slot] = len + n;
    d->pending[slot] = tokens[n - 1];
    return MK_OK;
}

int mk_decoder_step(mk_decoder *d, const int *slots, int n, const float *temperature,
                    const float *top_p, int *tokens, float *logp_sample, float *logp_policy)
{
    if (!d || !slots || n < 1 || n > d->S || !temperature || !top_p || !tokens)
        return mk__fail(MK_ERR_ARG, "mk_decoder_step: bad arguments (n %d)", n);
    for (int i = 0; i < n; i++) {
        int s = slots[i];
        if (s < 0 || s >= d->S) return mk__fail(MK_ERR_ARG, "slot %d out of range", s);
        for (int j = 0; j < i; j++)
            if (slots[j] == s) return mk__fail(MK_ERR_ARG, "slot %d listed twice", s);
        if (d->len[s] == 0) return mk__fail(MK_ERR_STATE, "slot %d is empty: append first", s);
        if (d->len[s] >= d->Tmax)
            return mk__fail(MK_ERR_FULL, "slot %d already holds %d tokens", s, d->Tmax);
        d->h_tok[i] = d->pending[s];
        d->h_pos[i] = d->len[s] - 1;
        d->h_slot[i] = s;
    }
    mk_model *m = d->m;
    const mk_backend *be = m->be;
    size_t V = m->cfg.vocab_size;
    if (be->sample_rows) {
        /* this step overwrites d->logits: keep the rows of slots it does not list */
        for (int i = 0; i < n; i++) d->lg_row[slots[i]] = -1;
        for (int s = 0; s < d->S; s++) fetch_logits(d, s);
    }
    run_rows(d, n, 1);
    if (be->sample_rows) {
        float *ht = d->h_sp, *hp = ht + n, *hu = hp + n, *dp = d->d_sp;
        float *so = (float *)(d->d_so + n);
        for (int i = 0; i < n; i++) {
            ht[i] = temperature[i];
            hp[i] = top_p[i];
            hu[i] = mk__sample_draw(&d->rng[slots[i]], temperature[i]);
        }
        be->upload(dp, ht, sizeof(float) * 3 * (size_t)n);
        be->sample_rows(d->d_so, so, so + n, d->swork, d->logits, dp, dp + n, dp + 2 * n, n,
                        (int)V);
        be->download(d->h_so, d->d_so, sizeof(int) * 3 * (size_t)n);
        for (int i = 0; i < n; i++) {
            int s = slots[i], tok = d->h_so[i];
            tokens[i] = tok;
            if (logp_sample) memcpy(&logp_sample[i], &d->h_so[n + i], sizeof(float));
            if (logp_policy) memcpy(&logp_policy[i], &d->h_so[2 * n + i], sizeof(float));
            d->lg_row[s] = i;
            d->pending[s] = tok;
            d->len[s]++;
        }
        return MK_OK;
    }
    /* each slot's draw uses its own generator: the slots are independent, sampled in parallel
     * (at 16 slots of a 152k vocabulary the sampler is a tenth of a step) */
    int nt = mk_get_threads();
    if (nt > d->n_scratch) nt = d->n_scratch;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (n > 1 && (size_t)n * V >= 65536)
    for (int i = 0; i < n; i++) {
        int s = slots[i];
        float *lg = d->h_logits + (size_t)s * V;
        be->download(lg, d->logits + (size_t)i * V, V * sizeof(float));
        float lps, lpp;
        char *scratch = (char *)d->sample_scratch + MK_SAMPLE_SCRATCH(V) * omp_get_thread_num();
        int tok = mk_sample(lg, (int)V, temperature[i], top_p[i], &d->rng[s], scratch, &lps, &lpp);
        tokens[i] = tok;
        if (logp_sample) logp_sample[i] = lps;
        if (logp_policy) logp_policy[i] = lpp;
        d->pending[s] = tok;
        d->len[s]++;
    }
    return MK_OK;
}
