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

struct mk__backend {
    const char *name;
    /* memory in the back-end's space */
    int (*alloc)(void **p, size_t bytes); /* zero-filled; MK_ERR_NOMEM/DEVICE */
    void (*release)(void *p);
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*zero)(void *p, size_t bytes);

    /* out[R,C] = wte[tokens[r]] + wpe[pos[r]] */
    void (*embed_fwd)(float *out, const int *tokens, const int *pos, const float *wte,
                      const float *wpe, int R, int C);
    /* dwte[tokens[r]] += dout[r], dwpe[pos[r]] += dout[r] */
    void (*embed_bwd)(float *dwte, float *dwpe, const float *dout, const int *tokens,
                      const int *pos, int R, int C);
    /* LayerNorm over rows, eps 1e-5; mean, rstd [R] may be NULL */
    void (*ln_fwd)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                   const float *b, int R, int C);
    /* dinp += ..., dw += ..., db += ... */
    void (*ln_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, const float *mean, const float *rstd, int R, int C);
    /* out[R,OC] = inp[R,IC] w[IC,OC] + bias[OC] (bias may be NULL) */
    void (*mm_fwd)(float *out, const float *inp, const float *w, const float *bias, int R, int IC,
                   int OC);
    /* dinp = dout w^T (overwrites); dw += inp^T dout; dbias += colsum(dout) */
    void (*mm_bwd)(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                   const float *w, int R, int IC, int OC);
    /* logits[R,V] = inp[R,C] wte[V,C]^T */
    void (*head_fwd)(float *logits, const float *inp, const float *wte, int R, int C, int V);
    /* dinp = dlogits wte (overwrites); dwte += dlogits^T inp */
    void (*head_bwd)(float *dinp, float *dwte, const float *dlogits, const float *inp,
                     const float *wte, int R, int C, int V);
    /* causal attention: qkv [B,T,3C] (q|k|v, heads of C/NH), out [B,T,C],
     * att [B,NH,T,T] softmax probabilities (row t uses 0..t) */
    void (*attn_fwd)(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
    /* dqkv = (overwrites); datt [B,NH,T,T] is scratch (the gradient of att) */
    void (*attn_bwd)(float *dqkv, float *datt, const float *dout, const float *qkv,
                     const float *att, int B, int T, int C, int NH);
    /* tanh GELU (GPT-2 "gelu_new"); bwd overwrites dinp */
    void (*gelu_fwd)(float *out, const float *inp, size_t n);
    void (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n);
    /* out = a + b */
    void (*add)(float *out, const float *a, const float *b, size_t n);

    /* decoding with a KV cache.  kc, vc: one layer's caches [S, Tmax, C].
     * Row r belongs to slot[r] at position pos[r]; qkv [R,3C]. */
    void (*kv_store)(float *kc, float *vc, const float *qkv, const int *slot, const int *pos, int R,
                     int C, int Tmax);
    /* out[r] = attention of q[r] over kc/vc[slot[r], 0..pos[r]]; att [R,NH,Tmax] is
     * scratch for the scores */
    void (*attn_decode)(float *out, float *att, const float *qkv, const float *kc, const float *vc,
                        const int *slot, const int *pos, int R, int C, int NH, int Tmax);

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
};

extern const mk_backend mk__cpu_backend;

/* Makes sure OpenBLAS runs kernels this CPU supports at full width (see
 * cpu_ops.c); idempotent and thread-safe. */
void mk__blas_init(void);

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
/* Writes tensors ts[0..n) (host values at params + offset) named prefix + name in dtype dt,
 * atomically (path.tmp, then rename). */
int mk__st_write(const char *path, const mk_tensor_info *ts, int n, const float *params,
                 mk_dtype dt, const char *prefix);

/* Activations of the training graph, one allocation carved by a size table. */
enum {
    MK_ACT_ENC,     /* [B,T,C] embeddings, the residual stream into block 0 */
    MK_ACT_LN1,     /* [L,B,T,C] */
    MK_ACT_LN1M,    /* [L,B,T] */
    MK_ACT_LN1R,    /* [L,B,T] */
    MK_ACT_QKV,     /* [L,B,T,3C] */
    MK_ACT_ATTY,    /* [L,B,T,C] attention output before projection */
    MK_ACT_ATT,     /* [L,B,NH,T,T] */
    MK_ACT_RES2,    /* [L,B,T,C] residual after attention */
    MK_ACT_LN2,     /* [L,B,T,C] */
    MK_ACT_LN2M,    /* [L,B,T] */
    MK_ACT_LN2R,    /* [L,B,T] */
    MK_ACT_FCH,     /* [L,B,T,4C] */
    MK_ACT_FCG,     /* [L,B,T,4C] after GELU */
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
    MK_G_LN,   /* [B,T,C] gradient of a LayerNorm output */
    MK_G_QKV,  /* [B,T,3C] */
    MK_G_ATTY, /* [B,T,C] */
    MK_G_FCH,  /* [B,T,4C] */
    MK_G_FCG,  /* [B,T,4C] */
    MK_G_ATT,  /* [B,NH,T,T] gradient of the attention probabilities (attn_bwd's scratch) */
    MK_G_N
};

/* Parameter tensors of one block, in checkpoint order. */
enum {
    MK_P_LN1W,
    MK_P_LN1B,
    MK_P_QKVW,
    MK_P_QKVB,
    MK_P_PROJW,
    MK_P_PROJB,
    MK_P_LN2W,
    MK_P_LN2B,
    MK_P_FCW,
    MK_P_FCB,
    MK_P_FCPW,
    MK_P_FCPB,
    MK_P_PER_LAYER
};

struct mk_model {
    mk_config cfg;
    const mk_backend *be;
    int max_B, max_T;
    int n_tensors;
    mk_tensor_info *tensors; /* size table, n_tensors entries (host) */
    size_t n_params;
    float *params, *grads, *m, *v; /* back-end memory, n_params each */
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
};

/* Pointer to tensor i (global index) in a flat vector base. */
static inline float *mk__tensor(const mk_model *m, float *base, int i)
{
    return base + m->tensors[i].offset;
}
/* Global index of block tensor k of layer l. */
static inline int mk__ltensor(int l, int k)
{
    return 2 + l * MK_P_PER_LAYER + k;
}

/* Parameter (P) and gradient (G) tensors of the model `m` in scope; LP and LG
 * take a layer and a block tensor index. */
#define P(i)     mk__tensor(m, m->params, (i))
#define G(i)     mk__tensor(m, m->grads, (i))
#define LP(l, k) P(mk__ltensor((l), (k)))
#define LG(l, k) G(mk__ltensor((l), (k)))

#ifdef __cplusplus
}
#endif
#endif
