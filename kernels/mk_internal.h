/*
 * mk_internal.h - what the kernels library's files share and no caller sees:
 * the back-end table, the model and decoder structs, the error recorder.
 *
 * A back-end is a const table of plain functions over flat float arrays in
 * its own memory (host for CPU, device for CUDA).  Each op follows one
 * convention: outputs first, then inputs, then sizes; shapes in the comment.
 * Backward ops ADD into parameter gradients (dw, db) and, where a tensor
 * receives gradient from two places (the residual stream), into dinp as
 * noted.  The orchestration in model.c and decode.c is written once against
 * this table; the CPU table (cpu_ops.c) is the reference and the CUDA table
 * (cuda_ops.cu) is tested against it.
 */
#ifndef MK_INTERNAL_H
#define MK_INTERNAL_H

#include "manta_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mk_f32_to_bf16 and mk_bf16_to_f32 inline, for the loops that convert whole weights (a call
 * per element was a third of loading a 0.5B model's bf16 copies) */
static inline uint16_t mk__f32_to_bf16(float x)
{
    union {
        float f;
        uint32_t u;
    } v = {x};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(v.u >> 16 | 0x40); /* quiet nan */
    return (uint16_t)((v.u + 0x7fffu + (v.u >> 16 & 1)) >> 16);
}

static inline float mk__bf16_to_f32(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}

/* Values of a bfloat16 weight [IC, OC] in any back-end's layout (to_bf16), and bytes of
 * mm_fwd_bf16a's scratch for R rows of IC activations. */
#define MK_BF16_ELEMS(IC, OC) (((size_t)(IC) + 31) * (size_t)(OC))
#define MK_BF16A_SCRATCH(R, IC)                                                                    \
    (((size_t)(R) + 15) / 16 * 16 * (((size_t)(IC) + 31) / 32 * 32) * 2 + (size_t)(R) * (IC)*4)

struct mk__backend {
    const char *name;
    /* memory in the back-end's space */
    int (*alloc)(void **p, size_t bytes); /* zero-filled; MK_ERR_NOMEM/DEVICE */
    void (*release)(void *p);
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*zero)(void *p, size_t bytes);

    /* out[R,C] = wte[tokens[r]] + wpe[pos[r]] (wpe NULL: no position term) */
    void (*embed_fwd)(float *out, const int *tokens, const int *pos, const float *wte,
                      const float *wpe, int R, int C);
    /* dwte[tokens[r]] += dout[r], dwpe[pos[r]] += dout[r] (dwpe may be NULL) */
    void (*embed_bwd)(float *dwte, float *dwpe, const float *dout, const int *tokens,
                      const int *pos, int R, int C);
    /* LayerNorm over rows with eps; mean, rstd [R] may be NULL */
    void (*ln_fwd)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                   const float *b, int R, int C, float eps);
    /* dinp += ..., dw += ..., db += ... */
    void (*ln_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, const float *mean, const float *rstd, int R, int C);
    /* RMSNorm as transformers' LlamaRMSNorm: out = w * x / sqrt(mean(x^2) + eps),
     * in float; rstd [R] may be NULL */
    void (*rms_fwd)(float *out, float *rstd, const float *inp, const float *w, int R, int C,
                    float eps);
    /* dinp += ..., dw += ... (rstd from rms_fwd) */
    void (*rms_bwd)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                    const float *rstd, int R, int C);
    /* out[R,OC] = inp[R,IC] w[IC,OC] + bias[OC] (bias may be NULL) */
    void (*mm_fwd)(float *out, const float *inp, const float *w, const float *bias, int R, int IC,
                   int OC);
    /* dinp = dout w^T (overwrites); dw += inp^T dout; dbias += colsum(dout) (dbias may be NULL) */
    void (*mm_bwd)(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                   const float *w, int R, int IC, int OC);
    /* out[R,OC] = inp[R,IC] w[IC,OC] + bias[OC] with w in bfloat16 (widened exactly to float
     * as it is read; products and sums in float), in the back-end's layout made by to_bf16
     * (at most MK_BF16_ELEMS(IC, OC) values; the CPU's is packed by 64-column strips); bias may
     * be NULL.  Any R; a row's result does not depend on the other rows. */
    void (*mm_fwd_bf16)(float *out, const float *inp, const uint16_t *w, const float *bias, int R,
                        int IC, int OC);
    /* dst = the weight src rounded to bfloat16 (nearest even, nan kept quiet) in mm_fwd_bf16's
     * layout; src is [IC, OC] (transposed 0) or [OC, IC] (1: the head's [V, C]) */
    void (*to_bf16)(uint16_t *dst, const float *src, int IC, int OC, int transposed);
    /* logits[R,V] = inp[R,C] wte[V,C]^T */
    void (*head_fwd)(float *logits, const float *inp, const float *wte, int R, int C, int V);
    /* dinp = dlogits wte (overwrites); dwte += dlogits^T inp */
    void (*head_bwd)(float *dinp, float *dwte, const float *dlogits, const float *inp,
                     const float *wte, int R, int C, int V);

    /* Attention shapes.  A qkv row holds NH query heads, then NKV key heads, then NKV value
     * heads, hd floats each: W = (NH + 2 NKV) hd floats.  Query head h reads key/value head
     * h / (NH / NKV) (grouped-query attention; GPT-2 is NKV = NH, hd = C / NH).  Outputs are
     * rows of NH hd floats.  Scores are scaled by 1/sqrt(hd). */

    /* The rotary family's preparation of q and k, row r at position pos[r]: for each query
     * and key head, optionally RMSNorm over the head (wq, wk [hd]; NULL: no norm; rstd
     * [R, NH + NKV] receives each head's 1/rms, may be NULL), then the rotation of
     * transformers' rotate_half form: for i < hd/2, with c = cosb[pos][i], s = sinb[pos][i],
     *   y[i] = x[i] c - x[i + hd/2] s,   y[i + hd/2] = x[i + hd/2] c + x[i] s.
     * cosb, sinb: [block_size, hd/2].  Value heads are copied.  out and inp are [R, W]
     * and do not overlap. */
    void (*qk_fwd)(float *out, float *rstd, const float *inp, const float *wq, const float *wk,
                   const float *cosb, const float *sinb, const int *pos, int R, int NH, int NKV,
                   int hd, float eps);
    /* dinp [R, W] = gradient through qk_fwd of dout (overwrites); dwq, dwk += (when wq, wk
     * are not NULL).  inp, rstd as given to / produced by qk_fwd. */
    void (*qk_bwd)(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp,
                   const float *wq, const float *wk, const float *rstd, const float *cosb,
                   const float *sinb, const int *pos, int R, int NH, int NKV, int hd);
    /* causal attention: qkv [B,T,W], out [B,T,NH hd], att [B,NH,T,T] softmax probabilities
     * (row t uses 0..t).  att is what attn_bwd reads back and nothing else does: the CUDA
     * back-end (fused, cuda_attn.cu) keeps only each row's log-sum-exp there, [B,NH,T] in
     * its first B NH T floats, and datt's first B NH T floats are its scratch. */
    void (*attn_fwd)(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV,
                     int hd);
    /* dqkv [B,T,W] (overwrites; key/value heads sum over their group of query heads); datt
     * [B,NH,T,T] is scratch (the gradient of att) */
    void (*attn_bwd)(float *dqkv, float *datt, const float *dout, const float *qkv,
                     const float *att, int B, int T, int NH, int NKV, int hd);
    /* tanh GELU (GPT-2 "gelu_new"); bwd overwrites dinp */
    void (*gelu_fwd)(float *out, const float *inp, size_t n);
    void (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    /* SwiGLU: inp [R, 2H] holds gate (columns 0..H) then up; out[R,H] = silu(gate) * up,
     * silu(x) = x / (1 + exp(-x)).  bwd: dinp [R, 2H] (overwrites) from dout [R, H]. */
    void (*swiglu_fwd)(float *out, const float *inp, int R, int H);
    void (*swiglu_bwd)(float *dinp, const float *inp, const float *dout, int R, int H);
    /* out = a + b */
    void (*add)(float *out, const float *a, const float *b, size_t n);

    /* decoding with a KV cache.  kc, vc: one layer's caches [S, Tmax, NKV hd].  Row r
     * belongs to slot[r] at position pos[r]; qkv [R, W] (after qk_fwd for rotary families). */
    void (*kv_store)(float *kc, float *vc, const float *qkv, const int *slot, const int *pos, int R,
                     int NH, int NKV, int hd, int Tmax);
    /* out[r] (NH hd floats) = attention of row r's queries over kc/vc[slot[r], 0..pos[r]];
     * att [R,NH,Tmax] is scratch for the scores */
    void (*attn_decode)(float *out, float *att, const float *qkv, const float *kc, const float *vc,
                        const int *slot, const int *pos, int R, int NH, int NKV, int hd, int Tmax);

    /* per row: logp[r] = log softmax(logits[r])[targets[r]], ent[r] = entropy */
    void (*row_stats)(float *logp, float *ent, const float *logits, const int *targets, int R,
                      int V);
    /* dlogits[r,j] = ct[r] (1[j==t] - p_j) + ch[r] (-p_j (log p_j + H_r)),
     * the gradient of ct*logp + ch*H with respect to the logits */
    void (*row_grad)(float *dlogits, const float *logits, const int *targets, const float *ct,
                     const float *ch, int R, int V);

    /* optimiser over back-end arrays */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                  float b2, float eps, float wd, int t);
    double (*sumsq)(const float *x, size_t n);
    void (*scale)(float *x, float s, size_t n);
    /* mm_fwd_bf16 with inp rounded to bfloat16 first (nearest even, as mk_f32_to_bf16): bfloat16
     * products summed in float, as tensor-core and AMX products do (MK_MODEL_BF16_PRODUCTS).
     * scratch: MK_BF16A_SCRATCH(R, IC) bytes of the back-end's memory.  NULL: not offered. */
    void (*mm_fwd_bf16a)(float *out, const float *inp, const uint16_t *w, const float *bias, int R,
                         int IC, int OC, void *scratch);

    /* Optional (NULL: the decoder downloads the logits and samples on the host).  Sampling
     * of R rows in the back-end: row r of logits [R,V] with temperature[r], top_p[r] and the
     * uniform u[r] (drawn on the host by mk__sample_draw; unused when greedy) gives tok[r],
     * logp_sample[r], logp_policy[r] as mk__sample_u does (sample.c, the reference).  All
     * arrays in back-end memory; work [R,V] is scratch (the tempered probabilities).  Agrees
     * with the reference up to the order of double sums (cuda_sample.cu states how far). */
    void (*sample_rows)(int *tok, float *logp_sample, float *logp_policy, float *work,
                        const float *logits, const float *temperature, const float *top_p,
                        const float *u, int R, int V);
    /* how float matrix products use tensor cores (an mk_math, checked by the caller);
     * NULL: FP32 only */
    void (*set_math)(int math);
    /* Optional (NULL: add, then the norm; mk__add_norm_fwd does either).  The residual sum and
     * the norm after it in one pass over the rows: res = a + b, then out = the row norm of res,
     * RMSNorm (rms != 0: rms_fwd's, bias and mean unused) or LayerNorm (ln_fwd's), with eps;
     * mean, rstd [R] may be NULL.  res may be a or b; out may be a or b, not res.  The same
     * sums as add then the norm, so the CPU's results are bit-equal to the two ops'. */
    void (*add_norm_fwd)(float *res, float *out, float *mean, float *rstd, const float *a,
                         const float *b, const float *w, const float *bias, int R, int C, float eps,
                         int rms);

    /* kv_store and attn_decode over caches in bfloat16 (MK_MODEL_BF16_KV), kc, vc [S, Tmax,
     * NKV hd] uint16_t: the store rounds each key and value to nearest even (nan kept quiet, as
     * mk_f32_to_bf16); attention widens them exactly as it reads them and otherwise computes
     * as attn_decode does (float queries, scores, softmax, sums and output). */
    void (*kv_store_bf16)(uint16_t *kc, uint16_t *vc, const float *qkv, const int *slot,
                          const int *pos, int R, int NH, int NKV, int hd, int Tmax);
    void (*attn_decode_bf16)(float *out, float *att, const float *qkv, const uint16_t *kc,
                             const uint16_t *vc, const int *slot, const int *pos, int R, int NH,
                             int NKV, int hd, int Tmax);
    /* Optional (NULL: fn(ctx) runs as it stands).  Runs fn(ctx) - a sequence of this back-end's
     * ops with no copy and no host synchronisation - as one CUDA graph: captured into *graph
     * when it is NULL (kept there for the caller to free with graph_free), replayed after.  A
     * replay repeats the launches as captured: the same pointers and scalars, reading the
     * arrays' current contents.  A capture that fails (or MANTA_CUDA_GRAPHS=0) runs fn
     * directly, then and from then on. */
    void (*graph_run)(void **graph, void (*fn)(void *ctx), void *ctx);
    void (*graph_free)(void *graph);
    /* Optional (NULL: nothing is ever queued).  Wait until every op this thread queued is done
     * (mk_model_sync). */
    void (*sync)(void);
    /* Optional (NULL: mm_fwd, then gelu_fwd; mk__mm_gelu_fwd does either).  GPT-2's c_fc and
     * its GELU: pre = inp w + bias ([R,OC]; bias may be NULL), out = gelu_fwd's tanh GELU of
     * pre.  pre may be NULL (not kept: the decoder); out and pre do not overlap otherwise. */
    void (*mm_gelu_fwd)(float *out, float *pre, const float *inp, const float *w, const float *bias,
                        int R, int IC, int OC);
    /* Optional (NULL: mm_bwd into dpre, then gelu_bwd in place; mk__mm_gelu_bwd does either).
     * c_proj's backward with the GELU before it: as mm_bwd(dpre, dw, dbias, dout, inp, w, R, IC,
     * OC) (dw, dbias added into) with its input gradient then multiplied by gelu'(pre)
     * (gelu_bwd), so that dpre [R,IC] is the gradient at pre (inp = gelu(pre)). */
    void (*mm_gelu_bwd)(float *dpre, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, const float *pre, int R, int IC, int OC);
    /* Optional, all three or none (NULL: memory cannot be shared with other processes; see
     * mk_share_new).  ipc_export writes into handle (MK_SHARE_HANDLE_BYTES) the name by which
     * another process on this machine maps the allocation p (the base of one alloc);
     * MK_ERR_UNSUPPORTED if it cannot.  ipc_open maps, in this process, the allocation that
     * handle names and sets *p to its base; MK_ERR_DEVICE if it does not open here (another
     * machine, an exporter that is gone, this very process).  ipc_close unmaps what ipc_open
     * mapped.  Failures abort nothing and leave no error pending in the runtime. */
    int (*ipc_export)(void *handle, const void *p);
    int (*ipc_open)(void **p, const void *handle);
    void (*ipc_close)(void *p);
    /* 1: attn_fwd keeps only each row's log-sum-exp in att ([B,NH,T] a layer) and attn_bwd
     * uses only the first B NH T floats of datt (the fused attention), so the model allocates
     * those and not the [B,NH,T,T] matrices; 0: the whole matrices (the CPU back-end). */
    int att_rows_only;

    /* Mixed-precision training (MK_MODEL_BF16_TRAIN); all three or none (NULL: not offered).
     * Every array row-major in the back-end's memory.  scratch: bb_scratch_k (R + IC + OC)
     * floats of the back-end's memory (NULL when bb_scratch_k is 0). */
    /* dst[n] = src[n] rounded to bfloat16 (nearest even, nan kept quiet: mk__f32_to_bf16) */
    void (*round_bf16)(uint16_t *dst, const float *src, size_t n);
    /* out[R,OC] = inp[R,IC] w + bias[OC] (bias may be NULL) with inp and w in bfloat16: the
     * products (exact in float) summed in float, as tensor cores do.  w is [IC,OC] (wt 0), or
     * [OC,IC] (wt 1: the head's [V,C], logits = inp w^T). */
    void (*mm_fwd_bb)(float *out, const uint16_t *inp, const uint16_t *w, const float *bias, int R,
                      int IC, int OC, int wt, void *scratch);
    /* The backward of mm_fwd_bb with dout rounded to bfloat16 for both products (PyTorch
     * autocast's numerics): dout16[R,OC] = round_bf16(dout) (an output: scratch that the op
     * fills); dinp[R,IC] = dout16 w^T (overwrites); dw += inp^T dout16, in w's layout ([IC,OC],
     * or [OC,IC] with wt); dbias[OC] += the column sums of the float dout (may be NULL). */
    void (*mm_bwd_bb)(float *dinp, float *dw, float *dbias, uint16_t *dout16, const float *dout,
                      const uint16_t *inp, const uint16_t *w, int R, int IC, int OC, int wt,
                      void *scratch);
    /* the scratch mm_fwd_bb and mm_bwd_bb take, per row, input and output column (the CPU's:
     * the operands widened to float a block of that many inner terms at a time); 0: none */
    int bb_scratch_k;
};

extern const mk_backend mk__cpu_backend;

/* The CUDA back-end's sample_rows (cuda_sample.cu). */
void mk__cuda_sample_rows(int *tok, float *logp_sample, float *logp_policy, float *work,
                          const float *logits, const float *temperature, const float *top_p,
                          const float *u, int R, int V);

/* Sampling in two steps (sample.c): mk_sample(..., rng, ...) is
 * mk__sample_u(..., mk__sample_draw(rng, temperature), ...).  The draw takes one uniform
 * from the generator, or none (0, the generator untouched) when greedy (temperature <= 0);
 * the choice is a function of the logits and u alone (scratch: MK_SAMPLE_SCRATCH(V)). */
static inline float mk__sample_draw(mk_rng *rng, float temperature)
{
    return temperature <= 0.0f ? 0.0f : mk_rng_uniform(rng);
}
int mk__sample_u(const float *logits, int V, float temperature, float top_p, float u, void *scratch,
                 float *logp_sample, float *logp_policy);

/* Makes sure OpenBLAS runs kernels this CPU supports at full width (see
 * cpu_ops.c); idempotent and thread-safe. */
void mk__blas_init(void);
/* Tests: whether the CPU's bfloat16 products use AMX (enable 0: the float fallback; 1: AMX where
 * usable); returns the previous setting. */
int mk__cpu_amx(int enable);

/* Records a formatted message for mk_last_error and returns code. */
int mk__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Aborts with file, line, message and a hint: for broken invariants. */
void mk__die(const char *file, int line, const char *msg, const char *hint)
    __attribute__((noreturn));

/* ---- safetensors files (safetensors.c), shared with hf_dir.c ---- */

/* One tensor of a file's header; name and dtype point into the header copy. */
typedef struct mk__st_entry {
    const char *name, *dtype;
    int ndim;
    long long shape[8];
    long long begin, end; /* data_offsets, relative to the end of the header */
} mk__st_entry;

/* A safetensors file mapped read-only; path is borrowed. */
typedef struct mk__st_file {
    const char *path;
    void *map;
    size_t map_size;
    const unsigned char *data; /* the data after the header, data_size bytes */
    long long data_size;
    char *header; /* a copy, strings unescaped in place */
    mk__st_entry *es;
    int n_es;
} mk__st_file;

/* Maps and parses path; MK_ERR_IO/TRUNCATED/FORMAT naming the file.  On failure nothing
 * needs closing. */
int mk__st_open(mk__st_file *f, const char *path);
void mk__st_close(mk__st_file *f);
/* name without a "transformer." or "model." prefix */
const char *mk__st_strip(const char *name);
/* The entry whose name is name after mk__st_strip, or NULL. */
const mk__st_entry *mk__st_find(const mk__st_file *f, const char *name);
/* Checks e (NULL: missing, reported as name) has the shape given, a dtype F32 (or, unless
 * f32_only, BF16/F16), a consistent size and lies inside the file. */
int mk__st_check(const mk__st_file *f, const mk__st_entry *e, const char *name, int ndim,
                 const int *shape, int f32_only);
/* Converts a checked entry's data to float. */
void mk__st_read(float *dst, const mk__st_file *f, const mk__st_entry *e);
/* Fills dst (ts[i].numel floats) with the values of tensor i of a file being written. */
typedef void (*mk__st_source)(const void *ctx, int i, float *dst);
/* Writes tensors ts[0..n) (full names and shapes; offsets unused), their values given by
 * get(ctx, i, ...), in dtype dt, atomically (path.tmp, then rename); the data streams through
 * one buffer of the largest tensor. */
int mk__st_write(const char *path, const mk_tensor_info *ts, int n, mk__st_source get,
                 const void *ctx, mk_dtype dt);

/* ---- parameters shared between processes (share.c) ---- */

/* The shares another process's model keeps open (mk_model_write_params_shared). */
#define MK__SHARED_OPEN 8
/* A share's allocation: this header, then its n floats (64-byte aligned).  version: what the
 * floats hold, -1 while they are being written and before the first fill; n: their count. */
typedef struct mk__share_stamp {
    int64_t version;
    int64_t n;
    unsigned char pad[48];
} mk__share_stamp;
/* A share of another process that a model keeps open. */
typedef struct mk__shared_map {
    unsigned char handle[MK_SHARE_HANDLE_BYTES];
    void *base; /* the share's allocation, mapped here (ipc_open) */
} mk__shared_map;
/* Closes the shares m keeps open (mk_model_free). */
void mk__shared_close_all(mk_model *m);
/* Tests only: when not NULL, mk_model_write_params_shared calls it between its copy and its
 * second reading of the stamp, with the share's base (its stamp) in this process's mapping, so
 * that a test can change the stamp there as a writer would during the copy. */
extern void (*mk__share_test_after_copy)(const mk_backend *be, void *stamp);

/* Activations of the training graph, one allocation carved by a size table.
 * W = (NH + 2 NKV) hd is the width of a qkv row, A = NH hd of an attention
 * output, F the MLP's first product (4C for GPT2, 2I gate|up otherwise), H its
 * hidden width (4C, or I). */
enum {
    MK_ACT_ENC,     /* [B,T,C] embeddings, the residual stream into block 0 */
    MK_ACT_LN1,     /* [L,B,T,C] (bfloat16 with bf16_train, as ATTY, LN2, FCG, LNF) */
    MK_ACT_LN1M,    /* [L,B,T] */
    MK_ACT_LN1R,    /* [L,B,T] */
    MK_ACT_QKVR,    /* [L,B,T,W] the qkv product before qk_fwd (rotary families; else empty) */
    MK_ACT_QKR,     /* [L,B,T,NH+NKV] per-head 1/rms of q_norm/k_norm (QWEN3; else empty) */
    MK_ACT_QKV,     /* [L,B,T,W] what attention reads */
    MK_ACT_ATTY,    /* [L,B,T,A] attention output before projection */
    MK_ACT_ATT,     /* [L,B,NH,T,T], or [L,B,NH,T] with the back-end's att_rows_only */
    MK_ACT_RES2,    /* [L,B,T,C] residual after attention */
    MK_ACT_LN2,     /* [L,B,T,C] */
    MK_ACT_LN2M,    /* [L,B,T] */
    MK_ACT_LN2R,    /* [L,B,T] */
    MK_ACT_FCH,     /* [L,B,T,F] */
    MK_ACT_FCG,     /* [L,B,T,H] after GELU / SwiGLU */
    MK_ACT_RES3,    /* [L,B,T,C] residual after MLP: the block's output */
    MK_ACT_LNF,     /* [B,T,C] */
    MK_ACT_LNFM,    /* [B,T] */
    MK_ACT_LNFR,    /* [B,T] */
    MK_ACT_LOGITS,  /* [B,T,V] */
    MK_ACT_DLOGITS, /* [B,T,V] gradient stored by the loss */
    MK_ACT_N
};

/* Gradients of activations.  The residual stream's gradient lives in one
 * buffer that every block adds into on the way down, so only one layer's
 * worth of scratch is needed. */
enum {
    MK_G_RES,  /* [B,T,C] gradient of the residual stream */
    MK_G_LN,   /* [B,T,C] gradient of a norm's output */
    MK_G_QKV,  /* [B,T,W] */
    MK_G_QKVR, /* [B,T,W] gradient of the raw qkv product (rotary families) */
    MK_G_ATTY, /* [B,T,A] */
    MK_G_FCH,  /* [B,T,F] */
    MK_G_FCG,  /* [B,T,H] */
    MK_G_ATT,  /* [B,NH,T,T] gradient of the attention probabilities (attn_bwd's scratch);
                * [B,NH,T] with att_rows_only */
    MK_G_B16,  /* MK_MODEL_BF16_TRAIN only (else empty): [B,T,max(C,A,H)] floats in the forward
                * pass, [B,T,max(W,C,F)] bfloat16 values in the backward pass */
    MK_G_BB,   /* MK_MODEL_BF16_TRAIN only: the scratch of mm_fwd_bb and mm_bwd_bb, bb_scratch_k
                * (B T + max(C,A,H) + max(W,C,F,V)) floats (none on CUDA) */
    MK_G_N
};

/* Parameter tensors of one block, in checkpoint order; absent ones (biases
 * a family lacks, q/k norms outside QWEN3) have index -1. */
enum {
    MK_P_LN1W,
    MK_P_LN1B,
    MK_P_QKVW,  /* [C, W] */
    MK_P_QKVB,  /* [W] */
    MK_P_QNW,   /* [hd] */
    MK_P_KNW,   /* [hd] */
    MK_P_PROJW, /* [A, C] */
    MK_P_PROJB,
    MK_P_LN2W,
    MK_P_LN2B,
    MK_P_FCW, /* [C, F] */
    MK_P_FCB,
    MK_P_FCPW, /* [H, C] */
    MK_P_FCPB,
    MK_P_PER_LAYER
};

/* Model-level tensors; absent ones have index -1. */
enum {
    MK_T_WTE,  /* [V, C] token embedding (and the tied head) */
    MK_T_WPE,  /* [block_size, C] GPT2 only */
    MK_T_LNFW, /* [C] final norm */
    MK_T_LNFB, /* [C] GPT2 only */
    MK_T_HEAD, /* [V, C] untied lm_head only */
    MK_T_N
};

/* How a checkpoint tensor maps onto an internal tensor. */
enum {
    MK_HF_COPY,  /* the same shape and layout */
    MK_HF_TCOLS, /* nn.Linear weight [out, in]: columns col0 .. col0+out of an internal [in, W] */
    MK_HF_SLICE, /* a bias [out]: elements col0 .. col0+out of an internal [W] */
};

typedef struct mk__hf_map {
    mk_tensor_info info; /* the checkpoint's full name and shape; offset unused */
    int tensor;          /* internal tensor index */
    int kind;            /* MK_HF_* */
    int col0;
} mk__hf_map;

struct mk_model {
    mk_config cfg; /* resolved (mk_config_resolve) */
    const mk_backend *be;
    int max_B, max_T;
    int infer; /* MK_MODEL_INFER: parameters only */
    /* MK_MODEL_BF16_WEIGHTS: bfloat16 copies of the product weights (every block's
     * [in, out] matrices as they are, the head transposed to [C, V]) that decoding
     * multiplies with; b16_off[i] is tensor i's place in wb16 (SIZE_MAX: none).
     * b16_stale: the parameters may have changed since the copies were made. */
    uint16_t *wb16;
    size_t *b16_off;
    int b16_stale;
    int b16_products; /* MK_MODEL_BF16_PRODUCTS: decoding's products round activations too */
    int bf16_kv;      /* MK_MODEL_BF16_KV: decoders' caches in bfloat16 (kv_store_bf16) */
    /* MK_MODEL_BF16_TRAIN: wb16 holds the training copies instead (every product weight
     * rounded as it is, row-major: block weights [in, out], the head [V, C]; made by
     * round_bf16), the product inputs kept for the backward pass (MK_ACT_LN1, ATTY, LN2, FCG,
     * LNF) are bfloat16 arrays in their act slots, and gact[MK_G_B16] is the scratch of one
     * layer: the float outputs of those activations' producers in the forward pass, the
     * rounded output gradients (mm_bwd_bb's dout16) in the backward pass.  The copies are tb16
     * (b16_off[i] is tensor i's place there, b16_stale as for wb16), which decoders do not read
     * (wb16 stays NULL: they multiply the float parameters). */
    int bf16_train;
    uint16_t *tb16;
    size_t b16_scratch; /* bfloat16 values gact[MK_G_B16] holds */
    size_t act_bytes;   /* bytes of acts_mem and gacts_mem (mk_model_activation_bytes) */
    int n_tensors;
    mk_tensor_info *tensors; /* size table, n_tensors entries (host) */
    int gidx[MK_T_N];        /* model-level tensor indices, -1 absent */
    int *lidx;               /* [n_layer * MK_P_PER_LAYER] block tensor indices, -1 absent */
    int n_hf;
    mk__hf_map *hf; /* the checkpoint's tensors, in the order transformers saves them */
    size_t n_params;
    float *params, *grads;      /* back-end memory, n_params each */
    float *m, *v;               /* back-end memory: the moments of [m_off, m_off + m_len) */
    size_t m_off, m_len;        /* [0, n_params) unless mk_model_shard_moments */
    float *rope_cos, *rope_sin; /* back-end [block_size, hd/2] (rotary families; else NULL) */
    size_t act_size[MK_ACT_N];
    float *acts_mem; /* one allocation */
    float *act[MK_ACT_N];
    float *gacts_mem; /* gradients of activations, reused by every layer */
    float *gact[MK_G_N];
    int *d_tokens, *d_targets, *d_pos;        /* back-end [max_B*max_T] */
    float *d_rowa, *d_rowb;                   /* back-end [max_B*max_T] per-row scalars */
    float *h_rowa, *h_rowb, *h_rowc, *h_rowd; /* host scratch [max_B*max_T] */
    int B, T;                                 /* shape of the last forward; 0 before one */
    int have_dlogits;                         /* a loss has stored its gradient */
    /* shares of other processes that mk_model_write_params_shared opened, most recent first
     * (share.c); mk_model_free closes them */
    mk__shared_map shared[MK__SHARED_OPEN];
    int n_shared;
};

/* Derived sizes of a resolved config. */
static inline int mk__rotary(const mk_config *c)
{
    return c->arch != MK_ARCH_GPT2;
}
static inline int mk__kvh(const mk_config *c)
{
    return c->n_kv_head;
}
static inline size_t mk__qkv_width(const mk_config *c) /* W */
{
    return (size_t)(c->n_head + 2 * c->n_kv_head) * c->head_dim;
}
static inline size_t mk__att_width(const mk_config *c) /* A */
{
    return (size_t)c->n_head * c->head_dim;
}
static inline size_t mk__mlp_in(const mk_config *c) /* F */
{
    return c->arch == MK_ARCH_GPT2 ? (size_t)c->n_inner : 2 * (size_t)c->n_inner;
}
static inline size_t mk__mlp_hidden(const mk_config *c) /* H */
{
    return (size_t)c->n_inner;
}

/* Pointer to tensor i (global index) in a flat vector base; NULL when i < 0. */
static inline float *mk__tensor(const mk_model *m, float *base, int i)
{
    return i < 0 ? NULL : base + m->tensors[i].offset;
}
/* Global index of block tensor k of layer l (-1: absent). */
static inline int mk__ltensor(const mk_model *m, int l, int k)
{
    return m->lidx[l * MK_P_PER_LAYER + k];
}

/* Parameter (P) and gradient (G) tensors of the model `m` in scope, by global index; TP and
 * TG by model-level slot (MK_T_*); LP and LG take a layer and a block tensor index.  Absent
 * tensors give NULL. */
#define P(i)     mk__tensor(m, m->params, (i))
#define G(i)     mk__tensor(m, m->grads, (i))
#define TP(k)    P(m->gidx[(k)])
#define TG(k)    G(m->gidx[(k)])
#define LP(l, k) P(mk__ltensor(m, (l), (k)))
#define LG(l, k) G(mk__ltensor(m, (l), (k)))

/* The output head's weight: lm_head when untied, else the token embedding. */
static inline int mk__head_tensor(const mk_model *m)
{
    return m->gidx[MK_T_HEAD] >= 0 ? m->gidx[MK_T_HEAD] : m->gidx[MK_T_WTE];
}
/* A block's pre-norm over R rows of n_embd: LayerNorm (w, b; mean and rstd may be NULL) for
 * GPT2, RMSNorm (w; rstd may be NULL) for the rotary families. */
/* res = a + b, then mk__norm_fwd(out, ..., res): the back-end's add_norm_fwd where it has one */
void mk__add_norm_fwd(const mk_model *m, float *res, float *out, float *mean, float *rstd,
                      const float *a, const float *b, const float *w, const float *bias, int R);
void mk__norm_fwd(const mk_model *m, float *out, float *mean, float *rstd, const float *inp,
                  const float *w, const float *b, int R);
/* The back-end's mm_gelu_fwd / mm_gelu_bwd where it has them, else the ops they fuse (bit-equal
 * to those ops on a back-end without them) */
void mk__mm_gelu_fwd(const mk_backend *be, float *out, float *pre, const float *inp, const float *w,
                     const float *bias, int R, int IC, int OC);
void mk__mm_gelu_bwd(const mk_backend *be, float *dpre, float *dw, float *dbias, const float *dout,
                     const float *inp, const float *w, const float *pre, int R, int IC, int OC);

/* Marks the bfloat16 weight copies stale (the parameters were or may be written), and
 * remakes stale copies from the parameters; both nothing without MK_MODEL_BF16_WEIGHTS or
 * MK_MODEL_BF16_TRAIN.
 * The sync allocates nothing. */
static inline void mk__params_changed(mk_model *m)
{
    m->b16_stale = 1;
}
void mk__bf16_sync(mk_model *m);

/* Checkpoint tensor i between its own layout (src/dst: info.numel host floats) and the
 * internal host parameter vector `params` (n_params floats). */
void mk__hf_scatter(const mk_model *m, int i, float *params, const float *src);
void mk__hf_gather(const mk_model *m, int i, const float *params, float *dst);
/* Index of the checkpoint tensor named name (prefix "transformer."/"model." ignored on both
 * sides), or -1. */
int mk__hf_find(const mk_model *m, const char *name);

#ifdef __cplusplus
}
#endif
#endif
