/*
 * manta_kernels.h - the policy of Manta: a GPT-2 style decoder in plain C.
 *
 * This header is the whole contract of the kernels library (libmanta_kernels,
 * plus libmanta_kernels_cuda for the CUDA back-end).  It does not depend on the
 * runtime.  The model is GPT-2 as Hugging Face writes it: token and position
 * embeddings, pre-LayerNorm blocks with causal multi-head self-attention and a
 * tanh-GELU MLP, a final LayerNorm and an output head tied to the token
 * embedding.
 *
 * Conventions, true of every function below unless its comment says otherwise:
 *
 *  - Errors.  Functions that can fail return an int: MK_OK (0) on success or a
 *    negative mk_err code.  They also record a one-line message naming the
 *    cause (tensor, file, argument) in thread-local storage, which
 *    mk_last_error() returns.  mk_strerror() names a code.  Broken internal
 *    invariants (a CUDA launch failing, say) abort with file, line and a hint.
 *  - Ownership.  `_new` allocates on the heap and `_free` releases; `_free(NULL)`
 *    is a no-op.  Pointers passed in are borrowed for the duration of the call
 *    only, unless stated.  Arrays are row-major, flat, float32.
 *  - Threads.  An mk_model or mk_decoder may be used by one thread at a time;
 *    distinct objects may be used by distinct threads concurrently.  The
 *    functions with no object argument are thread-safe, except mk_set_threads.
 *    Inside a call, work is split over mk_set_threads() threads of one OpenMP
 *    team; matrix products are cut into blocks, each run by single-threaded
 *    OpenBLAS on one thread of the team.
 *  - Memory.  A model owns one allocation each for parameters, gradients, the
 *    AdamW moments and activations (sized for max_batch x max_seq at creation);
 *    a decoder allocates its caches and buffers when it is created.  Nothing is
 *    allocated during forward, the losses, backward or a step, nor by
 *    mk_decoder_append or mk_decoder_step.
 *  - Back-ends.  The CPU back-end is always present.  The CUDA back-end
 *    (mk_backend_cuda) keeps parameters, gradients and activations in device
 *    memory; every function here hides that, except mk_model_params and
 *    mk_model_grads, which return back-end pointers.
 */
#ifndef MANTA_KERNELS_H
#define MANTA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------- */

typedef enum mk_err {
    MK_OK = 0,
    MK_ERR_ARG = -1,          /* an argument is out of range or NULL */
    MK_ERR_NOMEM = -2,        /* an allocation failed */
    MK_ERR_IO = -3,           /* open, read, write or rename failed */
    MK_ERR_FORMAT = -4,       /* a checkpoint is not valid safetensors */
    MK_ERR_MISSING = -5,      /* a checkpoint lacks a tensor the model needs */
    MK_ERR_SHAPE = -6,        /* a tensor has the wrong shape */
    MK_ERR_DTYPE = -7,        /* a tensor has a dtype this loader does not read */
    MK_ERR_TRUNCATED = -8,    /* a checkpoint file ends before its data does */
    MK_ERR_FULL = -9,         /* a decode slot has no room left in its context */
    MK_ERR_STATE = -10,       /* call out of order (loss before forward, ...) */
    MK_ERR_DEVICE = -11,      /* no CUDA device, or a CUDA/cuBLAS call failed */
    MK_ERR_UNSUPPORTED = -12, /* a checkpoint's config asks for a model this library lacks */
} mk_err;

/* Name of an error code ("shape mismatch", ...).  Never NULL. Thread-safe. */
const char *mk_strerror(int code);
/* The message recorded by the last failing call on this thread ("" if none).
 * The pointer stays valid until the next failing call on this thread. */
const char *mk_last_error(void);

/* ---- threads ------------------------------------------------------------ */

/* Sets the number of threads every later call uses, process-wide (the
 * OpenMP team; OpenBLAS itself is set to one thread, since the library
 * splits products over the team).  n <= 0 means one per core.  The default,
 * without a call, is OpenMP's (OMP_NUM_THREADS or one per core).  The first
 * call (or the first mk_model_new) may also switch OpenBLAS to the AVX-512 or
 * AVX2 kernels when it failed to recognise the CPU (see kernels/README.md).
 * Not thread-safe: call it at start-up, before other threads use BLAS. */
void mk_set_threads(int n);
int mk_get_threads(void);

/* ---- configuration ------------------------------------------------------ */

/* The model families.  One description (mk_config) drives all of them; the
 * family fixes the block's parts:
 *   GPT2   LayerNorm with bias, learned positions (wpe), tanh-GELU MLP,
 *          biases on every linear layer, head tied to wte;
 *   LLAMA  RMSNorm (weight only), rotary positions (rope_theta, optional
 *          Llama 3 rope_scaling), SwiGLU MLP, grouped-query attention,
 *          biases per attn_bias / attn_out_bias / mlp_bias, head tied or not;
 *   QWEN2  LLAMA with biases on q, k, v (attn_bias forced on, o none);
 *   QWEN3  LLAMA plus RMSNorm of every query and key head (q_norm, k_norm,
 *          weight [head_dim]) before the rotation; head_dim free. */
typedef enum mk_arch { MK_ARCH_GPT2 = 0, MK_ARCH_LLAMA, MK_ARCH_QWEN2, MK_ARCH_QWEN3 } mk_arch;

typedef struct mk_config {
    int n_layer;    /* transformer blocks */
    int n_head;     /* attention (query) heads */
    int n_embd;     /* width C (hidden_size) */
    int block_size; /* context length: positions 0 .. block_size-1 */
    int vocab_size; /* V, e.g. 260 for bytes plus four specials */
    /* Everything below is zero for GPT-2 (a zero means "the family's
     * default"); mk_config_resolve fills the defaults in. */
    mk_arch arch;
    int n_kv_head;     /* key/value heads (GQA); 0: n_head.  Divides n_head */
    int head_dim;      /* 0: n_embd / n_head (then n_head must divide n_embd) */
    int n_inner;       /* MLP width (intermediate_size); 0: 4 n_embd for GPT2 */
    float norm_eps;    /* 0: 1e-5 (GPT2's layer_norm_epsilon) or 1e-6 (rms_norm_eps) */
    float rope_theta;  /* 0: 10000 */
    int untied_head;   /* 1: a separate lm_head.weight [V,C] (not GPT2) */
    int attn_bias;     /* biases on q, k, v (GPT2 and QWEN2: always) */
    int attn_out_bias; /* bias on the output projection (GPT2: always) */
    int mlp_bias;      /* biases on the MLP's products (GPT2: always) */
    /* Llama 3 rope_scaling ("rope_type": "llama3"); rope_factor 0: none */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_ctx; /* original_max_position_embeddings */
} mk_config;

/* MK_OK if the description is complete and consistent (sizes positive,
 * n_kv_head divides n_head, head_dim even for rotary families, GPT2 fields
 * that do not apply left zero), else MK_ERR_ARG naming the field. */
int mk_config_check(const mk_config *cfg);
/* Copies cfg to *out with every default filled in (n_kv_head, head_dim,
 * n_inner, norm_eps, rope_theta, the forced biases); then checks it.  The
 * model keeps the resolved copy (mk_model_config). */
int mk_config_resolve(const mk_config *cfg, mk_config *out);
/* "gpt2", "llama", "qwen2", "qwen3" (the transformers model_type), or "?". */
const char *mk_arch_name(mk_arch a);
/* Number of float parameters of a model of this size (0 if cfg is invalid). */
size_t mk_config_num_params(const mk_config *cfg);

/* ---- back-ends ---------------------------------------------------------- */

/* A back-end is a const table of functions (internal); pick one, pass it to
 * mk_model_new.  Both are read-only singletons: thread-safe. */
typedef struct mk__backend mk_backend;
const mk_backend *mk_backend_cpu(void);
/* Defined in libmanta_kernels_cuda only.  Returns NULL when no CUDA device
 * can be used (no driver, no GPU); mk_last_error() then says why. */
const mk_backend *mk_backend_cuda(void);
const char *mk_backend_name(const mk_backend *be);
/* How a back-end's float matrix products (forward, backward, head) multiply, process-wide:
 * MK_MATH_FP32 (the default: FP32 throughout); MK_MATH_TF32 or MK_MATH_BF16: the operands stay
 * float in memory (parameters, gradients, activations, AdamW state: FP32 master weights) and
 * are rounded to TF32 or bfloat16 inside each product for the tensor cores, sums and results
 * float (cuBLAS's FAST_TF32 / FAST_16BF compute types): mixed-precision products.  CUDA only;
 * the CPU back-end accepts MK_MATH_FP32 and refuses the others (MK_ERR_UNSUPPORTED). */
typedef enum { MK_MATH_FP32 = 0, MK_MATH_TF32 = 1, MK_MATH_BF16 = 2 } mk_math;
int mk_backend_set_math(const mk_backend *be, mk_math math);

/* ---- model -------------------------------------------------------------- */

typedef struct mk_model mk_model;

/* Creates a model of size *cfg on back-end be (NULL means CPU), with room for
 * batches of up to max_batch sequences of up to max_seq tokens
 * (max_seq <= block_size).  Parameters are zero until mk_model_init or
 * mk_load.  On success *out owns the model; free it with mk_model_free. */
int mk_model_new(mk_model **out, const mk_config *cfg, int max_batch, int max_seq,
                 const mk_backend *be);
/* Flags of mk_model_new_ex and mk_load_dir_ex. */
enum {
    /* Parameters only: no gradients, AdamW moments or training activations (a quarter of the
     * memory of a trainable model, what a rollout needs).  Decoders work; mk_forward,
     * mk_model_step and reading or writing gradients fail with MK_ERR_STATE; mk_zero_grad does
     * nothing. */
    MK_MODEL_INFER = 1u,
    /* With MK_MODEL_INFER only (else MK_ERR_ARG): decoding multiplies by bfloat16 copies of
     * the product weights (q/k/v, o, gate/up, down or GPT-2's four, and the head), made
     * from the float parameters rounded to nearest even; activations, sums, embeddings,
     * norms and biases stay float.  Decoding reads half the bytes a step (it is bound by
     * memory bandwidth at a few slots), and a checkpoint stored in BF16 decodes with its
     * exact weights.  Costs a copy of those weights at 2 bytes each beside the float
     * parameters (which loading, mk_model_read_params and saving keep using).  The copies
     * are remade after mk_model_init, the loaders and mk_model_write_params (at the next
     * decoder call), and after mk_model_params (the caller may write through it).  CPU and
     * CUDA. */
    MK_MODEL_BF16_WEIGHTS = 2u,
    /* With MK_MODEL_BF16_WEIGHTS only (else MK_ERR_ARG): decoding's products also round their
     * activations to bfloat16 (nearest even) and sum the bfloat16 products in float, as
     * PyTorch's bfloat16 models and tensor cores do; norms, attention, residuals and the
     * sampler stay float.  On a CPU with AMX (Intel Sapphire Rapids on) the products run on
     * its tile unit, several times the float rate; without it they are the float products of
     * the rounded activations (the same numerics, slower than MK_MODEL_BF16_WEIGHTS alone).
     * Logits differ from MK_MODEL_BF16_WEIGHTS alone by activation rounding (relative 2^-9
     * per element). CPU and CUDA (cuBLAS bfloat16 GEMMs). */
    MK_MODEL_BF16_PRODUCTS = 4u,
    /* With MK_MODEL_INFER only (else MK_ERR_ARG): decoders keep their key and value caches in
     * bfloat16 (half the bytes: twice the context or slots in the same memory, and half the
     * cache traffic of decoding attention, which dominates a step at long contexts).  Keys and
     * values are rounded to nearest even (nan kept quiet) as they are stored, and widened
     * exactly as attention reads them; queries, scores, the softmax, the sums and the output
     * stay float.  Logits differ from float caches by the rounding of K and V (relative 2^-9
     * per element).  Independent of the other flags.  CPU and CUDA. */
    MK_MODEL_BF16_KV = 8u,
    /* Mixed-precision training; not with MK_MODEL_INFER (else MK_ERR_ARG).  The parameters,
     * gradients and AdamW moments stay float (the master weights: what mk_model_step updates and
     * what reading, writing, sharing and saving see).  Before mk_forward, whenever the
     * parameters changed since the last copy (mk_model_init, the loaders, mk_model_step,
     * mk_model_adamw_range, mk_model_write_params, mk_model_write_params_shared, and
     * mk_model_params: the caller may write through it), bfloat16 copies of the product weights
     * (every block's q/k/v, o, gate/up and down, or GPT-2's four, and the head: the token
     * embedding when tied) are remade from them, rounded to nearest even (nan kept quiet).
     * The activations that are inputs of those products and are kept for the backward pass
     * (each block's two norm outputs, its attention output and its MLP's hidden activation,
     * and the final norm's output) are kept only in bfloat16: half the bytes of those five
     * (mk_model_activation_bytes), for one layer of float scratch (and on the CPU a scratch of
     * the products' operands widened to float, 64 inner terms at a time: B T + the widest input
     * + the widest output, vocabulary included, times 64 floats).  The bfloat16 copies cost 2
     * bytes per product weight beside the parameters.  Each product multiplies the
     * bfloat16 operands and sums in float (float bias and output); its backward rounds the
     * output gradient to bfloat16 for both products (input gradient and weight gradient, the
     * latter added into the float gradients) and sums the bias gradient from the float one:
     * PyTorch autocast's numerics for matrix products.  The embeddings, norms, attention (and
     * its float q/k/v), GELU / SwiGLU, residuals, losses and AdamW stay float.  Losses and
     * gradients differ from a float model by the roundings (about 2^-9 relative each).
     * Decoders of such a model use the float parameters.  Every family; CPU (the reference)
     * and CUDA (cuBLAS bfloat16 GEMMs on tensor cores). */
    MK_MODEL_BF16_TRAIN = 16u,
};
int mk_model_new_ex(mk_model **out, const mk_config *cfg, int max_batch, int max_seq,
                    const mk_backend *be, unsigned flags);
void mk_model_free(mk_model *m);
const mk_config *mk_model_config(const mk_model *m);
const mk_backend *mk_model_backend(const mk_model *m);

/* GPT-2 initialisation from a seed, as Hugging Face does it: weights and
 * embeddings N(0, 0.02), the two residual projections N(0, 0.02/sqrt(2 L)),
 * biases 0, LayerNorm gains 1.  Zeroes the AdamW moments.  Deterministic. */
void mk_model_init(mk_model *m, uint64_t seed);

/* The flat parameter vector and its size table.  For GPT2 the tensors lie
 * in checkpoint order: wte, wpe, then for each block ln_1.{weight,bias},
 * attn.c_attn.{weight,bias}, attn.c_proj.{weight,bias}, ln_2.{weight,bias},
 * mlp.c_fc.{weight,bias}, mlp.c_proj.{weight,bias}, then ln_f.{weight,bias}.
 * Every family uses the same internal layout: linear weights [in, out]
 * (y = x W + b, GPT-2's Conv1D), the query, key and value products fused
 * into one [C, (NH + 2 NKV) hd] matrix and SwiGLU's gate and up products
 * into one [C, 2 I] matrix (gate columns first).  For the other families
 * the tensors are, per block: input_norm.weight, attn.qkv.{weight,bias?},
 * attn.q_norm.weight and attn.k_norm.weight (QWEN3), attn.o.{weight,bias?},
 * post_norm.weight, mlp.gate_up.{weight,bias?}, mlp.down.{weight,bias?};
 * around them embed.weight first and norm.weight (then lm_head.weight when
 * untied) last.  Checkpoints keep transformers' names and nn.Linear
 * [out, in] layout; the loaders and writers translate (see the checkpoint
 * tensors below).  Gradients and AdamW moments have the same layout, so a
 * learner shard can own the slice [off, off+len) of all four. */
typedef struct mk_tensor_info {
    char name[64]; /* Hugging Face name without prefix, e.g. "h.0.ln_1.weight" */
    size_t offset; /* first element in the flat vector */
    size_t numel;  /* elements */
    int ndim;      /* 1 or 2 */
    int shape[2];  /* shape[1] unused when ndim == 1 */
} mk_tensor_info;
size_t mk_model_num_params(const mk_model *m);
/* Bytes of the training activations and activation gradients the model allocated (in the
 * back-end's memory; 0 with MK_MODEL_INFER); they grow with max_batch x max_seq. */
size_t mk_model_activation_bytes(const mk_model *m);
int mk_model_num_tensors(const mk_model *m);
/* Fills *info for tensor i in [0, mk_model_num_tensors); MK_ERR_ARG otherwise. */
int mk_model_tensor(const mk_model *m, int i, mk_tensor_info *info);

/* The checkpoint's view: the tensors as transformers names and shapes them
 * (full names, e.g. "transformer.h.0.attn.c_attn.weight",
 * "model.layers.0.self_attn.q_proj.weight" [NH hd, C], "lm_head.weight"),
 * each a slice of an internal tensor, transposed for nn.Linear weights.
 * info->offset is unused (0).  mk_model_read_hf copies one of them, by its
 * name with or without the "transformer."/"model." prefix, from the
 * parameters (grads 0) or the gradients (grads 1) into dst in the
 * checkpoint's layout (numel floats, row-major); MK_ERR_MISSING if the model
 * has no such tensor. */
int mk_model_num_hf_tensors(const mk_model *m);
int mk_model_hf_tensor(const mk_model *m, int i, mk_tensor_info *info);
int mk_model_read_hf(const mk_model *m, const char *name, int grads, float *dst);

/* Back-end pointers to the flat parameters and gradients (host memory on the
 * CPU back-end, device memory on CUDA).  Owned by the model.  With
 * MK_MODEL_BF16_WEIGHTS or MK_MODEL_BF16_TRAIN, mk_model_params marks the bfloat16 copies
 * stale (the next decoder call, or mk_forward, remakes them): call it again after writing
 * through an old pointer. */
float *mk_model_params(mk_model *m);
float *mk_model_grads(mk_model *m);
/* Copy elements [off, off+n) between the model and host memory; work on any
 * back-end.  MK_ERR_ARG if the range is outside the vector. */
int mk_model_read_params(const mk_model *m, float *dst, size_t off, size_t n);
int mk_model_write_params(mk_model *m, const float *src, size_t off, size_t n);
int mk_model_read_grads(const mk_model *m, float *dst, size_t off, size_t n);
int mk_model_write_grads(mk_model *m, const float *src, size_t off, size_t n);

/* ---- training ----------------------------------------------------------- */

/* Forward pass over tokens [B,T] (host memory, ids in [0, V)), keeping every
 * activation for mk_backward.  1 <= B <= max_batch, 1 <= T <= max_seq. */
int mk_forward(mk_model *m, const int *tokens, int B, int T);
/* Copies the logits [B,T,V] of the last mk_forward to host memory. */
int mk_model_read_logits(const mk_model *m, float *dst);

/* After mk_forward: per position, the log-probability of targets[i] under
 * the (untempered) policy, and the entropy of the policy, in nats.  logp
 * and entropy are host arrays of B*T floats; either may be NULL. */
int mk_logprobs(mk_model *m, const int *targets, float *logp, float *entropy);

/* Cross-entropy for supervised warm-up, after mk_forward.  targets [B,T];
 * weights [B,T] (NULL means all 1; 0 masks a position).  The loss is
 *     sum_i w_i * -log p(targets_i) / sum_i w_i,
 * the weighted mean over the batch (0 when all weights are 0).  Stores the
 * gradient for mk_backward; writes the loss to *loss. */
int mk_loss_ce(mk_model *m, const int *targets, const float *weights, float *loss);

/* The RL objective: a PPO-style clipped surrogate on per-token ratios
 * r = exp(logp - behav_logp) of current to behaviour policy, with dual-clip
 * cap on the importance weight.  Per masked token i, with advantage A:
 *     L_i = max(-r A, -clip(r, 1-clip_low, 1+clip_high) A)
 *     if A < 0 and ratio_cap > 0:  L_i = min(L_i, -ratio_cap A)
 * and, with H_i the entropy of the policy at i,
 *     loss = sum_i mask_i (L_i - entropy_coef H_i) / sum_i mask_i.
 * ratio_cap (> 1, e.g. 3) bounds how much a stale, very-off-policy token with
 * negative advantage can pull; 0 disables it.  Tokens whose term is clipped or
 * capped contribute no gradient through L_i. */
typedef struct mk_ppo_params {
    float clip_low;     /* e.g. 0.2 */
    float clip_high;    /* e.g. 0.2 (or 0.28, "clip-higher") */
    float ratio_cap;    /* dual-clip constant c > 1, or 0 for none */
    float entropy_coef; /* bonus on the policy entropy, usually 0 */
} mk_ppo_params;

/* Statistics over the masked tokens (weights mask_i). */
typedef struct mk_ppo_stats {
    float loss;       /* the objective above */
    float pg_loss;    /* sum mask L / sum mask, without the entropy term */
    float mean_ratio; /* mean r */
    float clip_frac;  /* fraction of tokens clipped or capped (no gradient) */
    float entropy;    /* mean H */
    float approx_kl;  /* mean (r - 1) - log r, an estimate of KL(behaviour||current) */
    float n_tokens;   /* sum of mask */
} mk_ppo_stats;

/* After mk_forward.  targets, behav_logp, adv, mask: host arrays [B,T]; mask
 * NULL means all 1.  Stores the gradient for mk_backward; fills *stats. */
int mk_loss_ppo(mk_model *m, const int *targets, const float *behav_logp, const float *adv,
                const float *mask, const mk_ppo_params *p, mk_ppo_stats *stats);

/* Multiplies the gradient stored by the last mk_loss_* by scale: a
 * micro-batch's share of a larger batch (its tokens / the batch's), so
 * that accumulated micro-batch gradients are the mean over the batch. */
int mk_loss_scale(mk_model *m, float scale);

/* Back-propagates the gradient stored by the last mk_loss_* through the
 * network, ADDING into the gradient vector (so gradients accumulate over
 * micro-batches; call mk_zero_grad to start afresh). */
int mk_backward(mk_model *m);
void mk_zero_grad(mk_model *m);

/* ---- optimiser ---------------------------------------------------------- */

/* One AdamW step (PyTorch's torch.optim.AdamW, decoupled weight decay) over
 * n elements: p -= lr*wd*p; m,v updated; p -= lr * mhat / (sqrt(vhat) + eps),
 * with bias correction for step t >= 1.  Host arrays; thread-safe on
 * disjoint arrays.  A learner shard calls it on its slice. */
void mk_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
              float beta2, float eps, float weight_decay, int t);
/* sum of x_i^2 in double precision: the partial sums of shards add up to the
 * squared global norm.  Host arrays; thread-safe. */
double mk_sumsq(const float *x, size_t n);
/* x *= s over n elements (host).  Used to clip by a global norm. */
void mk_scale(float *x, float s, size_t n);
/* The factor to multiply gradients by so that their global norm is at most
 * max_norm (PyTorch clip_grad_norm_: max_norm / (norm + 1e-6), at most 1). */
float mk_clip_factor(double sumsq, float max_norm);

typedef struct mk_adamw_params {
    float lr, beta1, beta2, eps;
    float weight_decay; /* applied to 2-D tensors only (matrices, embeddings) */
    float grad_clip;    /* clip the global gradient norm to this; 0 means no clipping */
} mk_adamw_params;

/* Squared L2 norm of all gradients of the model. */
double mk_model_grad_sumsq(mk_model *m);
/* Whole-model step t >= 1: clip the gradients by global norm, then AdamW on
 * every tensor.  *grad_norm (may be NULL) receives the norm before clipping.
 * Does not zero the gradients. */
int mk_model_step(mk_model *m, const mk_adamw_params *p, int t, float *grad_norm);
/* The AdamW moments [n_params] each (back-end pointers; see mk_model_shard_moments). */
float *mk_model_adam_m(mk_model *m);
float *mk_model_adam_v(mk_model *m);

/* ---- a shard's slice, in the back-end's memory ----------------------------
 *
 * A learner shard (ZeRO style) owns elements [off, off+n) of the flat
 * vectors.  When its collectives work on the back-end's memory (NCCL between
 * GPUs on mk_model_grads / mk_model_params), these run its part of the step
 * there, with no copy to the host.  Each returns MK_ERR_ARG for a range
 * outside the vector and MK_ERR_STATE on an inference-only model; the same
 * arithmetic as mk_scale, mk_sumsq and mk_adamw on the CPU back-end (bit-equal
 * to them there). */
int mk_model_grad_scale(mk_model *m, size_t off, size_t n, float s);
int mk_model_grad_sumsq_range(mk_model *m, size_t off, size_t n, double *sumsq);
/* AdamW step t >= 1 over [off, off+n) with the model's own moments; weight decay p->weight_decay
 * on the elements of 2-D tensors only, as mk_model_step (which also clips: this does not, scale
 * first). */
int mk_model_adamw_range(mk_model *m, size_t off, size_t n, const mk_adamw_params *p, int t);
/* ZeRO stage 1: keep the moments of [off, off+n) only (zero: call it before the first step),
 * freeing the whole vector's.  Then mk_model_adamw_range and the moments' copies take ranges
 * inside [off, off+n) only (MK_ERR_ARG otherwise), mk_model_step is refused (MK_ERR_STATE) and
 * mk_model_adam_m/_v point at element off's moments. */
int mk_model_shard_moments(mk_model *m, size_t off, size_t n);
/* The moments of [off, off+n) to and from host memory: which 0 is the first (m), 1 the second
 * (v).  For a shard's checkpoint. */
int mk_model_read_moments(const mk_model *m, int which, float *dst, size_t off, size_t n);
int mk_model_write_moments(mk_model *m, int which, const float *src, size_t off, size_t n);
/* Wait until the work that this thread queued on the model's back-end is done.  Call it before
 * another library (NCCL, on a stream of its own) reads or writes the model's memory; that
 * library's calls must be complete before the next kernel call.  Nothing to do on the CPU. */
int mk_model_sync(mk_model *m);

/* ---- parameters shared with other processes on one machine -------------------
 *
 * A learner shard on CUDA publishes a versioned copy of a slice of its parameters in device
 * memory (an mk_share); a rollout process on the same machine copies it into its own model's
 * parameters device to device (CUDA IPC), instead of through host buckets.  The share's bytes
 * start with a stamp: the version its floats hold (-1 while they are being written, and before
 * the first fill) and their count n.  A reader checks the stamp before and after its copy (a
 * seqlock), so a fill during a read is detected, never silently mixed in.  CUDA back-end only. */
#define MK_SHARE_HANDLE_BYTES 64
typedef struct mk_share mk_share;
/* A buffer for n floats in m's back-end memory that other processes on this machine can map
 * (its own cudaMalloc allocation, exported with cudaIpcGetMemHandle), stamped version -1 and
 * n.  MK_ERR_UNSUPPORTED where the back-end cannot share (the CPU back-end; a CUDA back-end
 * whose cudaIpcGetMemHandle fails), with a message saying why; MK_ERR_DEVICE (out of device
 * memory).  The share belongs to the caller; m may be freed before it. */
int mk_share_new(mk_model *m, size_t n, mk_share **out);
/* Frees the share (NULL is fine).  What a process that still maps it then reads is undefined
 * (CUDA's rule for IPC memory freed before its importers close it; the emulator keeps the
 * memory): free it only when no reader will copy from it again (a learner frees its shares
 * when it ends), or accept that a late reader's stamp checks may fail. */
void mk_share_free(mk_share *s);
/* Copies m's parameters [off, off + n) into the share's floats [0, n) (n <= its size, m on
 * the back-end the share was made on; MK_ERR_ARG otherwise), stamped with version >= 0
 * (MK_ERR_ARG otherwise): stamps -1, waits for m's queued work (kernels on its stream may be
 * writing the parameters), copies, waits for the copy, stamps version and waits for the stamp:
 * when it returns, every reader sees version.  Floats [n, size) keep what they held. */
int mk_share_fill(mk_share *s, mk_model *m, size_t off, size_t n, int64_t version);
/* The bytes that name the share to another process (the same for the share's life). */
void mk_share_handle(const mk_share *s, unsigned char out[MK_SHARE_HANDLE_BYTES]);
/* In another process on the same machine: copies floats [src_off, src_off + n) of the share
 * named by handle, as published at `version` (>= 0), into m's parameters [off, off + n), device
 * to device, and marks the bfloat16 copies stale as mk_model_write_params does.  The stamp is
 * read before the copy and again after it.  Errors:
 *   MK_ERR_UNSUPPORTED  the back-end cannot open shares (the CPU);
 *   MK_ERR_DEVICE       the handle does not open here (another machine, a device this process
 *                       does not see, the exporting process is gone, or it is this process);
 *   MK_ERR_ARG          [off, off+n) outside m's vector, version < 0, or src_off + n above the
 *                       share's n (read from its stamp); nothing was written;
 *   MK_ERR_STATE        the stamp is not `version` before the copy (nothing was written), or
 *                       not after it: the parameters [off, off+n) may then hold a mix of two
 *                       versions, and the caller must write them again from elsewhere.
 * The model keeps the handles it opened (most recent first, 8 at most, keyed by the handle's
 * bytes; the least recent is closed when a 9th opens; mk_model_free closes all), so a new
 * version in the same share costs no open.  Two models of one process may open the same share:
 * CUDA returns the same mapping, counted, and each model's close drops its count (the emulator
 * maps it twice). */
int mk_model_write_params_shared(mk_model *m, const unsigned char handle[MK_SHARE_HANDLE_BYTES],
                                 size_t src_off, size_t off, size_t n, int64_t version);
/* The checks of mk_model_write_params_shared without the copy: opens the share (into the same
 * cache) and reads its stamp; MK_OK when it holds `version` and floats [src_off, src_off + n),
 * else its errors (n may be 0).  A reader that takes a version from several shares checks them
 * all first, so that a share it cannot open or that moved on writes none of its parameters. */
int mk_model_share_check(mk_model *m, const unsigned char handle[MK_SHARE_HANDLE_BYTES],
                         size_t src_off, size_t n, int64_t version);

/* ---- checkpoints (safetensors, Hugging Face names) ----------------------- */

/* Writes the parameters to path as one safetensors file, F32, the checkpoint
 * tensors (mk_model_hf_tensor) under their full transformers names and
 * layout ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"
 * [C,3C], ...; "model.embed_tokens.weight",
 * "model.layers.0.self_attn.q_proj.weight" [NH hd, C], ..., "lm_head.weight"
 * when untied), with the metadata {"format":"pt"} that transformers expects:
 * the model.safetensors of mk_save_dir(m, DIR, MK_F32, 0).  Streamed through
 * one buffer of the largest tensor, to path.tmp then renamed, so a reader
 * never sees half a file. */
int mk_save(const mk_model *m, const char *path);
/* Reads the parameters of m (any family) from a safetensors file written
 * here or by transformers: every checkpoint tensor of m, by its name with or
 * without a "transformer." or "model." prefix, F32 only (for BF16/F16 and
 * sharded folders see mk_load_dir); other tensors (attention mask buffers)
 * are ignored, except lm_head.weight on a tied model, which must equal the
 * embedding.  Refuses, naming the tensor and file, a missing tensor
 * (MK_ERR_MISSING), wrong shape (MK_ERR_SHAPE), non-F32 dtype (MK_ERR_DTYPE),
 * a file shorter than its header says (MK_ERR_TRUNCATED), a malformed header
 * (MK_ERR_FORMAT), a head that differs from a tied embedding
 * (MK_ERR_UNSUPPORTED).  On failure the model's parameters are unchanged. */
int mk_load(mk_model *m, const char *path);
/* Writes a transformers config.json for cfg (any family; defaults resolved
 * as mk_config_resolve does), dtype float32, as mk_save_dir writes it, so
 * that a directory holding it and mk_save's model.safetensors loads with
 * AutoModelForCausalLM.from_pretrained(dir).  MK_ERR_ARG for an invalid cfg;
 * MK_ERR_UNSUPPORTED (nothing written) for a cfg no transformers config
 * describes (Llama/Qwen3 biases on q/k/v but not o, Qwen2 or Qwen3 with MLP
 * biases); MK_ERR_IO.  Written via path.tmp and rename. */
int mk_write_hf_config(const mk_config *cfg, const char *path);

/* ---- Hugging Face folders (config.json + safetensors, F32/BF16/F16) ----- */

typedef enum mk_dtype { MK_F32, MK_BF16, MK_F16 } mk_dtype;

/* Reads a transformers config.json of model_type gpt2, llama, qwen2 or qwen3
 * into *out, resolved (mk_config_resolve).  Keys absent or null take
 * transformers' defaults for the family: num_key_value_heads the heads
 * (Qwen2/Qwen3: 32 when absent), head_dim hidden_size / num_attention_heads
 * (Qwen3: 128), rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings
 * true for gpt2 and false otherwise, attention_bias and mlp_bias false
 * (Qwen2: biases on q, k, v always).  Rotary settings are read from
 * transformers 5's "rope_parameters" or 4.x's top-level "rope_theta" and
 * "rope_scaling" (rope_type/type "default" or "llama3").  Refuses, naming
 * the file and key, with MK_ERR_UNSUPPORTED: an unknown model_type (naming
 * it) and any setting that changes numerics this library does not implement
 * - GPT-2: activation_function other than gelu_new / gelu_pytorch_tanh,
 * scale_attn_weights false, scale_attn_by_inverse_layer_idx,
 * reorder_and_upcast_attn or add_cross_attention true; the others:
 * hidden_act other than silu, other rope types (linear, dynamic, yarn,
 * longrope, ...), partial_rotary_factor other than 1, per-layer-type rope
 * settings, sliding-window layers (layer_types other than full_attention,
 * or Qwen2/Qwen3 use_sliding_window true with max_window_layers below
 * num_hidden_layers), attention_dropout other than 0; any family:
 * experts (num_experts, num_local_experts, n_routed_experts,
 * num_experts_per_tok > 0), quantization_config.  pretraining_tp is ignored
 * (transformers 5 ignores it; the products are the same).  A size that is
 * missing, not an integer or beyond an int, and an inconsistent config
 * (num_key_value_heads not dividing the heads, odd head_dim), give
 * MK_ERR_FORMAT naming the key.  *tied (may be NULL) receives
 * tie_word_embeddings. */
int mk_read_hf_config(mk_config *out, int *tied, const char *path);

/* Creates *out (as mk_model_new with max_batch, max_seq, be; be NULL means
 * CPU) from a transformers folder of any family: DIR/config.json (read by
 * mk_read_hf_config) and either DIR/model.safetensors or
 * DIR/model.safetensors.index.json naming its shard files (weight_map).
 * Shards are memory-mapped and every checkpoint tensor of the model
 * (mk_model_hf_tensor) is found by name ("transformer."/"model." prefixes
 * optional), checked for shape and dtype, then converted once from F32,
 * BF16 or F16 to float (exactly), straight from the mapping into the
 * parameters or, for tensors fused inside Manta (q/k/v, gate/up), through
 * one buffer of the largest; other tensors (mask buffers) are ignored.
 * Untied models need lm_head.weight; on tied ones it must be absent or equal
 * to the embedding (else MK_ERR_UNSUPPORTED: GPT-2 here is tied-only).  On
 * CUDA the parameters are assembled in one host buffer, uploaded once.
 * Every refusal names the file and tensor or key (codes as mk_load, plus the
 * config's).  On failure *out is NULL. */
int mk_load_dir(mk_model **out, const char *dir, int max_batch, int max_seq, const mk_backend *be);
/* mk_load_dir with mk_model_new_ex's flags (MK_MODEL_INFER for a rollout). */
int mk_load_dir_ex(mk_model **out, const char *dir, int max_batch, int max_seq,
                   const mk_backend *be, unsigned flags);

/* Writes DIR/config.json (the family's architectures entry -
 * GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM -
 * model_type, every size, norm epsilon, rope settings in both the
 * transformers 5 and 4.x layouts, tie_word_embeddings, "dtype" and
 * "torch_dtype" naming dt) and the checkpoint tensors in dtype dt (F32 as
 * is; BF16 and F16 rounded to nearest even) under their full names, as
 * save_pretrained does ("transformer." for GPT-2; "model." and, untied,
 * "lm_head.weight" for the others).  max_shard_bytes 0: one
 * DIR/model.safetensors; else shards model-0000i-of-0000n.safetensors of at
 * most that many bytes each (a larger single tensor gets a shard of its
 * own) and model.safetensors.index.json.  Every file is streamed through
 * one buffer of the largest tensor to a temporary and renamed; a stale
 * single file or index of the other layout is removed.  DIR must exist.
 * MK_ERR_UNSUPPORTED (nothing written) as mk_write_hf_config. */
int mk_save_dir(const mk_model *m, const char *dir, mk_dtype dt, size_t max_shard_bytes);

/* Conversions between float and the two 16-bit formats: exact upward
 * (subnormals, inf, nan included), round to nearest even downward (nan stays
 * a quiet nan, overflow gives inf).  Thread-safe. */
float mk_bf16_to_f32(uint16_t h);
float mk_f16_to_f32(uint16_t h);
uint16_t mk_f32_to_bf16(float x);
uint16_t mk_f32_to_f16(float x);
/* The same over n values (as fast as a loop of inline code: no call per value). */
void mk_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
void mk_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);

/* ---- GGUF files ----------------------------------------------------------- */

/* Creates *out (as mk_model_new with max_batch, max_seq, be; be NULL means
 * CPU) from a GGUF file (llama.cpp's format, versions 2 and 3), memory-mapped.
 * Architecture "llama" only (others refused naming general.architecture):
 * llama.block_count, embedding_length, attention.head_count,
 * attention.head_count_kv, feed_forward_length, context_length (block_size),
 * rope.freq_base, attention.layer_norm_rms_epsilon and rope.dimension_count
 * (must equal head_dim) give the MK_ARCH_LLAMA config; the vocabulary is
 * token_embd.weight's rows; the head is untied when output.weight is present.
 * Tensors F32, F16, BF16, Q8_0, Q4_0 and Q4_1 are converted to float once, as
 * ggml defines the blocks; q and k rows are put back from llama.cpp's
 * interleaved rotary order into transformers'.  Every count and length in
 * the file is checked against its size.  Refusals name the file and the key
 * or tensor: MK_ERR_FORMAT (not GGUF, malformed, a count beyond the file),
 * MK_ERR_TRUNCATED, MK_ERR_UNSUPPORTED (another architecture, a GGUF
 * version, rope scaling, experts, a tensor with no place in the model),
 * MK_ERR_DTYPE (another tensor kind, named: "Q4_K", ...), MK_ERR_SHAPE,
 * MK_ERR_MISSING.  On failure *out is NULL. */
int mk_load_gguf(mk_model **out, const char *path, int max_batch, int max_seq,
                 const mk_backend *be);
/* mk_load_gguf with mk_model_new_ex's flags (MK_MODEL_INFER for a rollout). */
int mk_load_gguf_ex(mk_model **out, const char *path, int max_batch, int max_seq,
                    const mk_backend *be, unsigned flags);
/* The config mk_load_gguf would build (block_size is the file's
 * context_length), without loading tensors.  Errors as mk_load_gguf. */
int mk_read_gguf_config(mk_config *out, const char *path);

/* ---- decoding ----------------------------------------------------------- */

/* A decoder holds n_slots sequences, each with its own KV cache (room for
 * block_size positions), length and random generator.  It borrows the model's
 * parameters: the model must outlive it.  New weights may be written into the
 * model between calls (a policy update); caches built with the old weights
 * are kept as they are and later tokens attend to them - callers that need
 * exact per-version caches reset the slots.
 *
 * A slot's sequence is the tokens appended plus the tokens sampled.  Its last
 * token is "pending": it has not been through the model yet; mk_decoder_step
 * feeds it and samples the next.  So a slot needs at least one appended token
 * before it can step. */
typedef struct mk_decoder mk_decoder;

int mk_decoder_new(mk_decoder **out, mk_model *m, int n_slots);
/* As mk_decoder_new with room for context <= block_size positions per slot
 * (a pretrained model's block_size is its max_position_embeddings, often
 * 32768 or more: far more KV cache than a rollout needs). */
int mk_decoder_new_ctx(mk_decoder **out, mk_model *m, int n_slots, int context);
void mk_decoder_free(mk_decoder *d);
int mk_decoder_num_slots(const mk_decoder *d);
/* Empties slot s (a sequence leaves; a new one may join) and seeds its
 * generator.  The same seed gives the same tokens for the same inputs. */
int mk_decoder_reset(mk_decoder *d, int slot, uint64_t seed);
/* Appends n >= 1 given tokens to slot s without sampling them (a prompt, or
 * a tool's observation).  All but the last go through the model now, into
 * the KV cache.  MK_ERR_FULL if the sequence would exceed block_size tokens
 * (nothing is appended then). */
int mk_decoder_append(mk_decoder *d, int slot, const int *tokens, int n);
/* Tokens in slot s, including the pending one. */
int mk_decoder_len(const mk_decoder *d, int slot);

/* One decoding step for the n distinct slots listed: feeds each slot's
 * pending token (all in one batch), then samples its next token from
 * softmax(logits / temperature[i]) restricted to the smallest set of tokens
 * whose probability reaches top_p[i] (nucleus), using the slot's generator.
 * temperature <= 0 means greedy.  Outputs, host arrays of n:
 *   tokens[i]      the sampled token, which becomes the slot's pending token;
 *   logp_sample[i] its log-probability under the distribution it was drawn
 *                  from (tempered, truncated, renormalised; 0 when greedy);
 *   logp_policy[i] its log-probability under the raw policy softmax(logits),
 *                  the behaviour log-prob a learner needs.  May be NULL.
 * MK_ERR_FULL (and nothing changes) if a slot already holds block_size
 * tokens; MK_ERR_STATE if a slot is empty. */
int mk_decoder_step(mk_decoder *d, const int *slots, int n, const float *temperature,
                    const float *top_p, int *tokens, float *logp_sample, float *logp_policy);
/* The logits [V] from which slot s's last step sampled (untempered); host
 * pointer owned by the decoder, valid until the next step or reset.  On a
 * back-end that samples in its own memory (CUDA) the first call after a step
 * copies the row to the host (V floats); a step copies nothing else.  That
 * copy writes the decoder: calls on one decoder stay one thread at a time. */
const float *mk_decoder_last_logits(const mk_decoder *d, int slot);

/* ---- sampling (also used by the decoder) -------------------------------- */

/* xoshiro256** generator; state seeded by splitmix64.  Plain value type. */
typedef struct mk_rng {
    uint64_t s[4];
} mk_rng;
void mk_rng_seed(mk_rng *r, uint64_t seed);
uint64_t mk_rng_next(mk_rng *r);
/* Uniform in [0, 1) with 24 random bits. */
float mk_rng_uniform(mk_rng *r);

/* Samples from logits [V] with temperature and top-p as mk_decoder_step does.
 * scratch: 2*V floats plus V ints of caller memory (see MK_SAMPLE_SCRATCH).
 * Returns the token; *logp_sample and *logp_policy (may be NULL) as above. */
#define MK_SAMPLE_SCRATCH(V) ((size_t)(V) * (2 * sizeof(float) + sizeof(int)))
int mk_sample(const float *logits, int V, float temperature, float top_p, mk_rng *rng,
              void *scratch, float *logp_sample, float *logp_policy);

#ifdef __cplusplus
}
#endif
#endif
