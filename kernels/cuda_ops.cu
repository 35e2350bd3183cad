/*
 * cuda_ops.cu - the CUDA back-end: the same table as cpu_ops.c, over device
 * memory, with cuBLAS for the matrix products and plain kernels for the rest.
 *
 * Every kernel mirrors its CPU reference line for line rather than being
 * tuned: one thread per element for elementwise ops (GELU, SwiGLU), one warp
 * per row for LayerNorm, RMSNorm, softmax rows and decoding attention, one warp
 * per (row, head) for the rotary q/k preparation.  Training attention is the
 * exception: fused, tiled kernels without atomics in cuda_attn.cu.  Sums that
 * many rows add into one element (parameter gradients of the norms, q/k norms
 * and embeddings) use atomicAdd, so those results vary in the last bits from
 * run to run;
 * tests/kernels/test_cuda.c states the tolerance for each op.  Matrix
 * products keep full FP32 unless mk_backend_set_math says otherwise.  All
 * work goes to the calling thread's default stream (MK_STREAM, a blocking
 * stream); uploads and downloads are synchronous copies on the legacy
 * stream, so a download sees every earlier kernel's result.  Decoding steps
 * replay CUDA graphs of that stream (graph_run).  Nothing here allocates after
 * mk_backend_cuda: decoding attention keeps its scores in the decoder's
 * scratch (global memory, any context length).  Every op returns at once
 * when it has no rows or elements: a launch of an empty grid is an error.
 *
 * cuBLAS is row-major-agnostic: a row-major matrix is its transpose in
 * column-major, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T by
 * swapping the operands (gemm_rm below).  Products with a bias, GPT-2's c_fc
 * with its GELU (mm_gelu_fwd) and c_proj's input gradient with the GELU's
 * derivative (mm_gelu_bwd) go through cuBLASLt with the bias and GELU in the
 * product's epilogue (lt_gemm), where its heuristic offers an algorithm; else
 * through cuBLAS and the separate kernels as before.
 */
#include <mutex>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            mk__die(__FILE__, __LINE__, cublasGetStatusString(s_),                                 \
                    "a cuBLAS call failed; check the matrix sizes passed to the op");              \
    } while (0)
#define LAUNCHED() MK_LAUNCHED("a kernel")

static cublasHandle_t blas;
static void *blas_workspace; /* cuBLAS's, for as long as the handle lives (mk_backend_cuda) */

static inline int blocks(size_t n, int t)
{
    return (int)((n + t - 1) / t);
}

__device__ static inline float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ static inline float warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* ---- memory ------------------------------------------------------------- */

static int cu_alloc(void **p, size_t bytes)
{
    if (bytes == 0) bytes = 16;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        *p = NULL;
        return mk__fail(MK_ERR_DEVICE, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    }
    CUDA_CHECK(cudaMemset(*p, 0, bytes));
    return MK_OK;
}

static void cu_release(void *p)
{
    CUDA_CHECK(cudaFree(p));
}

static void cu_upload(void *dst, const void *src, size_t bytes)
{
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

static void cu_download(void *dst, const void *src, size_t bytes)
{
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void cu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

static void cu_zero(void *p, size_t bytes)
{
    if (bytes) CUDA_CHECK(cudaMemset(p, 0, bytes));
}

/* ---- embeddings --------------------------------------------------------- */

__global__ static void embed_fwd_k(float *out, const int *tok, const int *pos, const float *wte,
                                   const float *wpe, int R, int C)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)R * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    float e = wte[(size_t)tok[r] * C + c];
    out[i] = wpe ? e + wpe[(size_t)pos[r] * C + c] : e;
}

__global__ static void embed_bwd_k(float *dwte, float *dwpe, const float *dout, const int *tok,
                                   const int *pos, int R, int C)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)R * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    atomicAdd(&dwte[(size_t)tok[r] * C + c], dout[i]);
    if (dwpe) atomicAdd(&dwpe[(size_t)pos[r] * C + c], dout[i]);
}

static void embed_fwd(float *out, const int *tokens, const int *pos, const float *wte,
                      const float *wpe, int R, int C)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * C, 256), 256, 0, embed_fwd_k)(out, tokens, pos, wte, wpe, R, C);
    LAUNCHED();
}

static void embed_bwd(float *dwte, float *dwpe, const float *dout, const int *tokens,
                      const int *pos, int R, int C)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * C, 256), 256, 0, embed_bwd_k)(dwte, dwpe, dout, tokens, pos, R, C);
    LAUNCHED();
}

/* ---- LayerNorm and RMSNorm: one warp per row ---------------------------- */

/* one row's LayerNorm by one warp, lane owning columns lane, lane + 32, ...; mean, rstd: the
 * row's slots or NULL */
__device__ static void ln_row_warp(float *o, float *mean, float *rstd, const float *x,
                                   const float *w, const float *b, int C, float eps, int lane)
{
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
    float rs = rsqrtf(warp_sum(v) / C + eps);
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * rs * w[c] + b[c];
    if (lane == 0) {
        if (mean) *mean = m;
        if (rstd) *rstd = rs;
    }
}

__global__ static void ln_fwd_k(float *out, float *mean, float *rstd, const float *inp,
                                const float *w, const float *b, int R, int C, float eps)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= R) return;
    ln_row_warp(out + (size_t)r * C, mean ? mean + r : NULL, rstd ? rstd + r : NULL,
                inp + (size_t)r * C, w, b, C, eps, lane);
}

__global__ static void ln_bwd_k(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, const float *mean,
                                const float *rstd, int R, int C)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= R) return;
    const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
    float m = mean[r], s = rstd[r], a = 0.0f, bsum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = d[c] * w[c];
        a += dn;
        bsum += dn * (x[c] - m) * s;
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
    float *di = dinp + (size_t)r * C;
    for (int c = lane; c < C; c += 32) {
        float norm = (x[c] - m) * s;
        di[c] += (d[c] * w[c] - a - norm * bsum) * s;
        atomicAdd(&dw[c], d[c] * norm);
        atomicAdd(&db[c], d[c]);
    }
}

static void ln_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                   const float *b, int R, int C, float eps)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * 32, 256), 256, 0, ln_fwd_k)(out, mean, rstd, inp, w, b, R, C, eps);
    LAUNCHED();
}

static void ln_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, const float *mean, const float *rstd, int R, int C)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * 32, 256), 256, 0, ln_bwd_k)
    (dinp, dw, db, dout, inp, w, mean, rstd, R, C);
    LAUNCHED();
}

/* LlamaRMSNorm in float: y = w * (x * rs), rs = 1 / sqrt(mean(x^2) + eps); one row by one
 * warp as ln_row_warp */
__device__ static void rms_row_warp(float *o, float *rstd, const float *x, const float *w, int C,
                                    float eps, int lane)
{
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
    float rs = 1.0f / sqrtf(warp_sum(ss) / C + eps);
    for (int c = lane; c < C; c += 32) o[c] = w[c] * (x[c] * rs);
    if (lane == 0 && rstd) *rstd = rs;
}

__global__ static void rms_fwd_k(float *out, float *rstd, const float *inp, const float *w, int R,
                                 int C, float eps)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= R) return;
    rms_row_warp(out + (size_t)r * C, rstd ? rstd + r : NULL, inp + (size_t)r * C, w, C, eps, lane);
}

/* the residual sum and the next norm in one pass: res = a + b, out = norm(res); each lane
 * reads and writes only its own columns, so res may be a or b and out may be a or b */
__global__ static void add_norm_k(float *res, float *out, float *mean, float *rstd, const float *a,
                                  const float *b, const float *w, const float *bias, int R, int C,
                                  float eps, int rms)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= R) return;
    size_t o = (size_t)r * C;
    for (int c = lane; c < C; c += 32) res[o + c] = a[o + c] + b[o + c];
    if (rms)
        rms_row_warp(out + o, rstd ? rstd + r : NULL, res + o, w, C, eps, lane);
    else
        ln_row_warp(out + o, mean ? mean + r : NULL, rstd ? rstd + r : NULL, res + o, w, bias, C,
                    eps, lane);
}

/* dx_c = rs (w_c dy_c - x_c rs^2 mean_j(w_j dy_j x_j)), dw_c += dy_c x_c rs */
__global__ static void rms_bwd_k(float *dinp, float *dw, const float *dout, const float *inp,
                                 const float *w, const float *rstd, int R, int C)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= R) return;
    const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
    float rs = rstd[r], dot = 0.0f;
    for (int c = lane; c < C; c += 32) dot += d[c] * w[c] * x[c];
    dot = warp_sum(dot) / C;
    float *di = dinp + (size_t)r * C;
    for (int c = lane; c < C; c += 32) {
        di[c] += rs * (d[c] * w[c] - x[c] * rs * rs * dot);
        atomicAdd(&dw[c], d[c] * x[c] * rs);
    }
}

static void rms_fwd(float *out, float *rstd, const float *inp, const float *w, int R, int C,
                    float eps)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * 32, 256), 256, 0, rms_fwd_k)(out, rstd, inp, w, R, C, eps);
    LAUNCHED();
}

static void add_norm_fwd(float *res, float *out, float *mean, float *rstd, const float *a,
                         const float *b, const float *w, const float *bias, int R, int C, float eps,
                         int rms)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * 32, 256), 256, 0, add_norm_k)
    (res, out, mean, rstd, a, b, w, bias, R, C, eps, rms);
    LAUNCHED();
}

static void rms_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                    const float *rstd, int R, int C)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * 32, 256), 256, 0, rms_bwd_k)(dinp, dw, dout, inp, w, rstd, R, C);
    LAUNCHED();
}

/* ---- matrix products (cuBLAS) ------------------------------------------- */

/* Row-major C[M,N] = alpha op(A) op(B) + beta C; lda, ldb, ldc are row lengths
 * of the stored matrices. */
/* MK_MATH_FP32: plain SGEMM; MK_MATH_TF32 / MK_MATH_BF16: the same float operands and output,
 * the inputs rounded inside cuBLAS to TF32 or bfloat16 for the tensor cores, float sums
 * (mk_backend_set_math) */
static cublasComputeType_t gemm_math = CUBLAS_COMPUTE_32F;

static void gemm_rm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc)
{
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (gemm_math == CUBLAS_COMPUTE_32F)
        CUBLAS_CHECK(cublasSgemm(blas, ob, oa, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
    else
        CUBLAS_CHECK(cublasGemmEx(blas, ob, oa, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F,
                                  lda, &beta, C, CUDA_R_32F, ldc, gemm_math, CUBLAS_GEMM_DEFAULT));
}

static void set_math(int math)
{
    gemm_math = math == MK_MATH_TF32   ? CUBLAS_COMPUTE_32F_FAST_TF32
                : math == MK_MATH_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                       : CUBLAS_COMPUTE_32F;
}

__global__ static void bias_rows_k(float *out, const float *bias, int R, int OC)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < (size_t)R * OC) out[i] = bias[i % OC];
}

/* one thread per column; consecutive threads read consecutive addresses */
__global__ static void colsum_add_k(float *dst, const float *src, int R, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float s = 0.0f;
    for (int r = 0; r < R; r++) s += src[(size_t)r * OC + c];
    dst[c] += s;
}

/* ---- products with fused epilogues (cuBLASLt) ----------------------------- */

/* cuBLASLt's handle and a workspace of its own, made with the cuBLAS handle (mk_backend_cuda);
 * lt is NULL when cuBLASLt could not start, and every product then takes the cuBLAS path */
static cublasLtHandle_t lt;
static void *lt_workspace;
static const size_t LT_WORKSPACE = (size_t)32 << 20;

/* the largest power of two up to 256 that divides the address */
static unsigned align_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    unsigned a = 256;
    while (a > 1 && u % a) a >>= 1;
    return a;
}

/* What a heuristic's answer depends on: the shapes, the math, the epilogue and the alignment of
 * every pointer (cuBLASLt picks algorithms for the alignments it is told, so a plan serves only
 * pointers aligned as its own were). */
struct lt_key {
    int ta, tb, m, n, k, lda, ldb, ldd, auxld, epi, compute;
    unsigned align[5]; /* A, B, D, bias, aux */
};
/* A plan: descriptors and the heuristic's algorithm (ok), or the answer that there is none. */
struct lt_plan {
    lt_key key;
    bool used, ok;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};
/* Kept, not freed: a model's products have a few shapes (decoding: a few per row count, and
 * graphs replay them without asking again).  A plan's descriptors are host memory that cuBLASLt
 * allocates the first time a key is seen; no device memory is allocated after mk_backend_cuda.
 * When all are used, the oldest slot is remade. */
enum { LT_PLANS = 256 };
static lt_plan lt_plans[LT_PLANS];
static int lt_next;         /* the slot a new plan takes when all are used (round robin) */
static std::mutex lt_mutex; /* plans are shared by the threads that use the back-end */

static void lt_plan_free(lt_plan *p)
{
    if (p->used && p->ok) {
        cublasLtMatrixLayoutDestroy(p->a);
        cublasLtMatrixLayoutDestroy(p->b);
        cublasLtMatrixLayoutDestroy(p->d);
        cublasLtMatmulDescDestroy(p->op);
    }
    p->used = p->ok = false;
}

#define LT_TRY(call)                                                                               \
    do {                                                                                           \
        if ((call) != CUBLAS_STATUS_SUCCESS) return false;                                         \
    } while (0)

/* descriptors for key k with the pointers bias and aux, and the heuristic's algorithm */
static bool lt_plan_make(lt_plan *p, const lt_key *k, const void *bias, const void *aux)
{
    p->a = p->b = p->d = NULL;
    p->op = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    bool ok = false;
    do {
        int32_t ta = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        uint32_t epi = (uint32_t)k->epi;
        int64_t auxld = k->auxld;
        uint64_t ws = LT_WORKSPACE;
        if (cublasLtMatmulDescCreate(&p->op, (cublasComputeType_t)k->compute, CUDA_R_32F) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                           sizeof epi) != CUBLAS_STATUS_SUCCESS)
            break;
        if (bias && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof bias) != CUBLAS_STATUS_SUCCESS)
            break;
        if (aux && (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                   &aux, sizeof aux) != CUBLAS_STATUS_SUCCESS ||
                    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &auxld, sizeof auxld) != CUBLAS_STATUS_SUCCESS))
            break;
        /* stored shapes: A is [m,k] (or [k,m] transposed), B [k,n] (or [n,k]), D [m,n] */
        if (cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, k->ta ? k->k : k->m, k->ta ? k->m : k->k,
                                       k->lda) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, k->tb ? k->n : k->k, k->tb ? k->k : k->n,
                                       k->ldb) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, k->m, k->n, k->ldd) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws) != CUBLAS_STATUS_SUCCESS)
            break;
        const cublasLtMatmulPreferenceAttributes_t al[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        const unsigned av[4] = {k->align[0], k->align[1], k->align[2], k->align[2]};
        bool set = true;
        for (int i = 0; i < 4 && set; i++) {
            uint32_t v = av[i];
            set = cublasLtMatmulPreferenceSetAttribute(pref, al[i], &v, sizeof v) ==
                  CUBLAS_STATUS_SUCCESS;
        }
        if (!set) break;
        cublasLtMatmulHeuristicResult_t res;
        int n = 0;
        if (cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &res, &n) !=
                CUBLAS_STATUS_SUCCESS ||
            n < 1 || res.workspaceSize > LT_WORKSPACE)
            break;
        p->algo = res.algo;
        ok = true;
    } while (0);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) {
        if (p->a) cublasLtMatrixLayoutDestroy(p->a);
        if (p->b) cublasLtMatrixLayoutDestroy(p->b);
        if (p->d) cublasLtMatrixLayoutDestroy(p->d);
        if (p->op) cublasLtMatmulDescDestroy(p->op);
    }
    return ok;
}

/* Column-major D[m,n] = op(A) op(B) (no beta), then the epilogue epi: the bias [m] added to
 * every column (BIAS), GELU (GELU_BIAS, GELU_AUX_BIAS: aux [m,n] with leading dimension auxld
 * keeps the GELU's input), or D times GELU's derivative at aux (DGELU).  In the math mode of
 * set_math, on MK_STREAM.  false: cuBLASLt offers no algorithm for it (or failed to start), and
 * nothing ran; the caller takes the unfused path. */
static bool lt_gemm(bool ta, bool tb, int m, int n, int k, const float *A, int lda, const float *B,
                    int ldb, float *D, int ldd, cublasLtEpilogue_t epi, const float *bias,
                    float *aux, int auxld)
{
    if (!lt || m == 0 || n == 0 || k == 0) return false;
    lt_key key;
    memset(&key, 0, sizeof key); /* compared with memcmp */
    key.ta = ta, key.tb = tb, key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb;
    key.ldd = ldd, key.auxld = aux ? auxld : 0, key.epi = (int)epi, key.compute = (int)gemm_math;
    key.align[0] = align_of(A), key.align[1] = align_of(B), key.align[2] = align_of(D);
    key.align[3] = bias ? align_of(bias) : 0, key.align[4] = aux ? align_of(aux) : 0;
    std::lock_guard<std::mutex> g(lt_mutex);
    lt_plan *p = NULL;
    for (int i = 0; i < LT_PLANS && !p; i++)
        if (lt_plans[i].used && !memcmp(&lt_plans[i].key, &key, sizeof key)) p = &lt_plans[i];
    if (!p) {
        for (int i = 0; i < LT_PLANS && !p; i++)
            if (!lt_plans[i].used) p = &lt_plans[i];
        if (!p) {
            p = &lt_plans[lt_next];
            lt_next = (lt_next + 1) % LT_PLANS;
            lt_plan_free(p);
        }
        p->key = key;
        p->used = true;
        p->ok = lt_plan_make(p, &key, bias, aux);
    }
    if (!p->ok) return false;
    /* the plan's own pointers were aligned as these: point its descriptor at these */
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof bias));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                          sizeof aux));
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasLtMatmul(lt, p->op, &one, A, p->a, B, p->b, &zero, D, p->d, D, p->d,
                                      &p->algo, lt_workspace, LT_WORKSPACE, MK_STREAM);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        /* the heuristic's algorithm refused these operands after all: never again this plan */
        lt_plan_free(p);
        p->key = key;
        p->used = true;
        return false;
    }
    CUBLAS_CHECK(s);
    return true;
}

static void mm_fwd(float *out, const float *inp, const float *w, const float *bias, int R, int IC,
                   int OC)
{
    if (R == 0 || OC == 0) return;
    /* out^T [OC,R] = w^T [OC,IC] inp^T [IC,R] + bias, in cuBLASLt's epilogue */
    if (bias && lt_gemm(false, false, OC, R, IC, w, OC, inp, IC, out, OC, CUBLASLT_EPILOGUE_BIAS,
                        bias, NULL, 0))
        return;
    float beta = 0.0f;
    if (bias) {
        MK_LAUNCH(blocks((size_t)R * OC, 256), 256, 0, bias_rows_k)(out, bias, R, OC);
        LAUNCHED();
        beta = 1.0f;
    }
    gemm_rm(false, false, R, OC, IC, 1.0f, inp, IC, w, OC, beta, out, OC);
}

static void mm_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                   const float *w, int R, int IC, int OC)
{
    if (R == 0) return;
    gemm_rm(false, true, R, IC, OC, 1.0f, dout, OC, w, OC, 0.0f, dinp, IC);
    gemm_rm(true, false, IC, OC, R, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
    if (dbias) {
        MK_LAUNCH(blocks((size_t)OC, 128), 128, 0, colsum_add_k)(dbias, dout, R, OC);
        LAUNCHED();
    }
}

static void gelu_fwd(float *out, const float *inp, size_t n);
static void gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);

/* GPT-2's c_fc and its GELU: pre = inp w + bias, out = gelu(pre), in one cuBLASLt product with
 * the GELU_AUX_BIAS epilogue (GELU_BIAS when pre is NULL: not kept).  cuBLASLt's GELU is the
 * tanh form gelu_fwd_k computes, by its own code (test_cuda.c states the tolerance).  Its aux
 * matrix needs a leading dimension divisible by 8: other widths, and shapes without an
 * algorithm, take mm_fwd then gelu_fwd. */
static void mm_gelu_fwd(float *out, float *pre, const float *inp, const float *w, const float *bias,
                        int R, int IC, int OC)
{
    if (R == 0 || OC == 0) return;
    cublasLtEpilogue_t epi =
        pre ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
            : (bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
    if (lt_gemm(false, false, OC, R, IC, w, OC, inp, IC, out, OC, epi, bias, pre, OC)) return;
    float *h = pre ? pre : out;
    mm_fwd(h, inp, w, bias, R, IC, OC);
    gelu_fwd(out, h, (size_t)R * OC);
}

/* c_proj's backward with the GELU before it: mm_bwd's dw and dbias, and its input gradient
 * times gelu'(pre) into dpre [R, IC] (the gradient at c_fc's output), the latter in one
 * cuBLASLt product with the DGELU epilogue: dpre^T [IC,R] = w [IC,OC] dout^T [OC,R], then
 * times gelu'(pre^T), pre^T's leading dimension IC.  Unfused (no algorithm, IC not divisible by
 * 8): the input gradient into dpre, then gelu_bwd in place. */
static void mm_gelu_bwd(float *dpre, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, const float *pre, int R, int IC, int OC)
{
    if (R == 0) return;
    if (!lt_gemm(true, false, IC, R, OC, w, OC, dout, OC, dpre, IC, CUBLASLT_EPILOGUE_DGELU, NULL,
                 (float *)pre, IC)) {
        gemm_rm(false, true, R, IC, OC, 1.0f, dout, OC, w, OC, 0.0f, dpre, IC);
        gelu_bwd(dpre, pre, dpre, (size_t)R * IC);
    }
    gemm_rm(true, false, IC, OC, R, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
    if (dbias) {
        MK_LAUNCH(blocks((size_t)OC, 128), 128, 0, colsum_add_k)(dbias, dout, R, OC);
        LAUNCHED();
    }
}

/* bfloat16 weights: one thread per output element (column c of row r), consecutive threads
 * reading consecutive weights; the widening is exact (the bits shifted up by 16).  A plain
 * kernel, not tuned: decoding with bfloat16 weights exists for the memory-bound CPU. */
__global__ static void mm_bf16_k(float *out, const float *inp, const uint16_t *w, const float *bias,
                                 int R, int IC, int OC)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= OC || r >= R) return;
    const float *x = inp + (size_t)r * IC;
    float s = bias ? bias[c] : 0.0f;
    for (int k = 0; k < IC; k++) s += x[k] * __uint_as_float((unsigned)w[(size_t)k * OC + c] << 16);
    out[(size_t)r * OC + c] = s;
}

static void mm_fwd_bf16(float *out, const float *inp, const uint16_t *w, const float *bias, int R,
                        int IC, int OC)
{
    if (R == 0 || OC == 0) return;
    MK_LAUNCH(dim3(blocks((size_t)OC, 128), R), 128, 0, mm_bf16_k)(out, inp, w, bias, R, IC, OC);
    LAUNCHED();
}

/* round to nearest even, nan kept quiet: mk_f32_to_bf16 */
__device__ static inline uint16_t f32_to_bf16(float x)
{
    unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
    u += 0x7fffu + (u >> 16 & 1);
    return (uint16_t)(u >> 16);
}

/* element i of dst [IC, OC] (this back-end's layout: row-major) from src [IC, OC] or,
 * transposed, [OC, IC] */
__global__ static void to_bf16_k(uint16_t *dst, const float *src, int IC, int OC, int transposed)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)IC * OC) return;
    size_t k = i / OC, c = i % OC;
    dst[i] = f32_to_bf16(src[transposed ? c * IC + k : i]);
}

static void to_bf16(uint16_t *dst, const float *src, int IC, int OC, int transposed)
{
    if (IC == 0 || OC == 0) return;
    MK_LAUNCH(blocks((size_t)IC * OC, 256), 256, 0, to_bf16_k)(dst, src, IC, OC, transposed);
    LAUNCHED();
}

__global__ static void round_bf16_k(uint16_t *dst, const float *src, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f32_to_bf16(src[i]);
}

/* bfloat16 products (MK_MODEL_BF16_PRODUCTS): the activations rounded into scratch [R, IC], then
 * one cuBLAS GEMM of bfloat16 operands with float sums and output (tensor cores), the bias
 * written first and added by beta = 1 */
static void mm_fwd_bf16a(float *out, const float *inp, const uint16_t *w, const float *bias, int R,
                         int IC, int OC, void *scratch)
{
    if (R == 0 || OC == 0) return;
    uint16_t *xb = (uint16_t *)scratch;
    MK_LAUNCH(blocks((size_t)R * IC, 256), 256, 0, round_bf16_k)(xb, inp, (size_t)R * IC);
    LAUNCHED();
    float one = 1.0f, beta = 0.0f;
    if (bias) {
        MK_LAUNCH(blocks((size_t)R * OC, 256), 256, 0, bias_rows_k)(out, bias, R, OC);
        LAUNCHED();
        beta = 1.0f;
    }
    /* row-major out[R,OC] = xb[R,IC] w[IC,OC] is column-major out^T = w^T xb^T */
    CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, OC, R, IC, &one, w, CUDA_R_16BF, OC,
                              xb, CUDA_R_16BF, IC, &beta, out, CUDA_R_32F, OC, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

/* ---- bfloat16 training products (MK_MODEL_BF16_TRAIN) --------------------- */

static void round_bf16(uint16_t *dst, const float *src, size_t n)
{
    if (n == 0) return;
    MK_LAUNCH(blocks(n, 256), 256, 0, round_bf16_k)(dst, src, n);
    LAUNCHED();
}

/* Column-major views of the row-major operands: a row-major [r, c] array is a column-major
 * [c, r] one with leading dimension c.  One cuBLAS GEMM each, bfloat16 operands, float sums
 * and output (tensor cores). */
static void gemm_bb(cublasOperation_t oa, cublasOperation_t ob, int m, int n, int k,
                    const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
                    int ldc)
{
    float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(blas, oa, ob, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                              &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void mm_fwd_bb(float *out, const uint16_t *inp, const uint16_t *w, const float *bias, int R,
                      int IC, int OC, int wt, void *)
{
    if (R == 0 || OC == 0) return;
    float beta = 0.0f;
    if (bias) {
        MK_LAUNCH(blocks((size_t)R * OC, 256), 256, 0, bias_rows_k)(out, bias, R, OC);
        LAUNCHED();
        beta = 1.0f;
    }
    /* out^T [OC,R] = w^T inp^T: w [IC,OC] is column-major [OC,IC] as it lies; [OC,IC] (wt) is
     * column-major [IC,OC], transposed */
    gemm_bb(wt ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, OC, R, IC, w, wt ? IC : OC, inp, IC, beta,
            out, OC);
}

static void mm_bwd_bb(float *dinp, float *dw, float *dbias, uint16_t *dout16, const float *dout,
                      const uint16_t *inp, const uint16_t *w, int R, int IC, int OC, int wt, void *)
{
    if (R == 0) return;
    round_bf16(dout16, dout, (size_t)R * OC);
    /* dinp^T [IC,R] = w d^T: w [IC,OC] is column-major [OC,IC] (transposed), [OC,IC] (wt) is
     * column-major [IC,OC] as it lies; d^T is d16 as it lies, column-major [OC,R] */
    gemm_bb(wt ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, IC, R, OC, w, wt ? IC : OC, dout16, OC,
            0.0f, dinp, IC);
    if (wt) /* dw [OC,IC], column-major [IC,OC] += x^T d: x^T [IC,R] as it lies, d [R,OC] */
        gemm_bb(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, R, inp, IC, dout16, OC, 1.0f, dw, IC);
    else /* dw [IC,OC], column-major [OC,IC] += d^T x: d^T [OC,R] as it lies, x [R,IC] */
        gemm_bb(CUBLAS_OP_N, CUBLAS_OP_T, OC, IC, R, dout16, OC, inp, IC, 1.0f, dw, OC);
    if (dbias) {
        MK_LAUNCH(blocks((size_t)OC, 128), 128, 0, colsum_add_k)(dbias, dout, R, OC);
        LAUNCHED();
    }
}

static void head_fwd(float *logits, const float *inp, const float *wte, int R, int C, int V)
{
    if (R == 0) return;
    gemm_rm(false, true, R, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
}

static void head_bwd(float *dinp, float *dwte, const float *dlogits, const float *inp,
                     const float *wte, int R, int C, int V)
{
    if (R == 0) return;
    gemm_rm(false, false, R, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dinp, C);
    gemm_rm(true, false, V, C, R, 1.0f, dlogits, V, inp, C, 1.0f, dwte, C);
}

/* ---- q/k preparation of the rotary families: one warp per (row, head) --- */

/* A qkv row is NH query heads, NKV key heads, NKV value heads of hd floats; the warps cover
 * all NH + 2 NKV heads of every row, and value heads are a copy.  A query or key head is
 * RMSNormed when its weight is given, then rotated pairwise (i, i + hd/2) by position pos[r]'s
 * angle i.  Every branch below depends on the head only, so a warp never diverges around
 * warp_sum. */
__global__ static void qk_fwd_k(float *out, float *rstd, const float *inp, const float *wq,
                                const float *wk, const float *cosb, const float *sinb,
                                const int *pos, int R, int NH, int NKV, int hd, float eps)
{
    int NQK = NH + NKV, NT = NQK + NKV;
    size_t wi = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (wi >= (size_t)R * NT) return;
    int r = (int)(wi / NT), hh = (int)(wi % NT);
    size_t o = (size_t)r * NT * hd + (size_t)hh * hd;
    const float *x = inp + o;
    float *y = out + o;
    if (hh >= NQK) {
        for (int i = lane; i < hd; i += 32) y[i] = x[i];
        return;
    }
    const float *wn = hh < NH ? wq : wk;
    float rs = 1.0f;
    if (wn) {
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32) ss += x[i] * x[i];
        rs = 1.0f / sqrtf(warp_sum(ss) / hd + eps);
        if (lane == 0 && rstd) rstd[(size_t)r * NQK + hh] = rs;
    }
    int half = hd / 2;
    const float *c = cosb + (size_t)pos[r] * half, *s = sinb + (size_t)pos[r] * half;
    for (int i = lane; i < half; i += 32) {
        float a = x[i], b = x[i + half];
        if (wn) {
            a = wn[i] * (a * rs);
            b = wn[i + half] * (b * rs);
        }
        y[i] = a * c[i] - b * s[i];
        y[i + half] = b * c[i] + a * s[i];
    }
}

/* The transposed rotation gives the gradient of the normed head, dn; then RMSNorm's backward
 * over the head (as rms_bwd_k, C = hd), its weight gradient added atomically since every row
 * and every head of the kind shares the hd weights. */
__global__ static void qk_bwd_k(float *dinp, float *dwq, float *dwk, const float *dout,
                                const float *inp, const float *wq, const float *wk,
                                const float *rstd, const float *cosb, const float *sinb,
                                const int *pos, int R, int NH, int NKV, int hd)
{
    int NQK = NH + NKV, NT = NQK + NKV;
    size_t wi = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (wi >= (size_t)R * NT) return;
    int r = (int)(wi / NT), hh = (int)(wi % NT);
    size_t o = (size_t)r * NT * hd + (size_t)hh * hd;
    const float *dy = dout + o, *x = inp + o;
    float *dx = dinp + o;
    if (hh >= NQK) {
        for (int i = lane; i < hd; i += 32) dx[i] = dy[i];
        return;
    }
    const float *wn = hh < NH ? wq : wk;
    float *dwn = hh < NH ? dwq : dwk;
    int half = hd / 2;
    const float *c = cosb + (size_t)pos[r] * half, *s = sinb + (size_t)pos[r] * half;
    if (!wn) {
        for (int i = lane; i < half; i += 32) {
            float ga = dy[i], gb = dy[i + half];
            dx[i] = ga * c[i] + gb * s[i];
            dx[i + half] = gb * c[i] - ga * s[i];
        }
        return;
    }
    float rs = rstd[(size_t)r * NQK + hh], dot = 0.0f;
    for (int i = lane; i < half; i += 32) {
        float ga = dy[i], gb = dy[i + half];
        float da = ga * c[i] + gb * s[i], db = gb * c[i] - ga * s[i];
        float xa = x[i], xb = x[i + half];
        dot += da * wn[i] * xa + db * wn[i + half] * xb;
        if (dwn) {
            atomicAdd(&dwn[i], da * xa * rs);
            atomicAdd(&dwn[i + half], db * xb * rs);
        }
    }
    dot = warp_sum(dot) / hd;
    for (int i = lane; i < half; i += 32) {
        float ga = dy[i], gb = dy[i + half];
        float da = ga * c[i] + gb * s[i], db = gb * c[i] - ga * s[i];
        float xa = x[i], xb = x[i + half];
        dx[i] = rs * (wn[i] * da - xa * rs * rs * dot);
        dx[i + half] = rs * (wn[i + half] * db - xb * rs * rs * dot);
    }
}

static void qk_fwd(float *out, float *rstd, const float *inp, const float *wq, const float *wk,
                   const float *cosb, const float *sinb, const int *pos, int R, int NH, int NKV,
                   int hd, float eps)
{
    if (R == 0) return;
    size_t warps = (size_t)R * (NH + 2 * NKV);
    MK_LAUNCH(blocks(warps * 32, 128), 128, 0, qk_fwd_k)
    (out, rstd, inp, wq, wk, cosb, sinb, pos, R, NH, NKV, hd, eps);
    LAUNCHED();
}

static void qk_bwd(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp,
                   const float *wq, const float *wk, const float *rstd, const float *cosb,
                   const float *sinb, const int *pos, int R, int NH, int NKV, int hd)
{
    if (R == 0) return;
    if ((wq || wk) && !rstd)
        mk__die(__FILE__, __LINE__, "qk_bwd: q/k norm weights given without their rstd",
                "pass the rstd array that qk_fwd filled");
    size_t warps = (size_t)R * (NH + 2 * NKV);
    MK_LAUNCH(blocks(warps * 32, 128), 128, 0, qk_bwd_k)
    (dinp, dwq, dwk, dout, inp, wq, wk, rstd, cosb, sinb, pos, R, NH, NKV, hd);
    LAUNCHED();
}

/* ---- attention ---------------------------------------------------------- */

/* Training attention is fused (cuda_attn.cu): att and datt hold per-row log-sum-exp and
 * rowsum(dO * O) there, [B, NH, T] in their first floats, not T x T matrices. */
void mk__cuda_attn_fwd(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV,
                       int hd);
void mk__cuda_attn_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                       const float *att, int B, int T, int NH, int NKV, int hd);

static void attn_fwd(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV,
                     int hd)
{
    mk__cuda_attn_fwd(out, att, qkv, B, T, NH, NKV, hd);
}

static void attn_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                     const float *att, int B, int T, int NH, int NKV, int hd)
{
    mk__cuda_attn_bwd(dqkv, datt, dout, qkv, att, B, T, NH, NKV, hd);
}

/* Offset inside a qkv row (W = (NH + 2 NKV) hd floats) of query head h. */
__device__ static inline size_t q_off(int h, int hd)
{
    return (size_t)h * hd;
}

/* A cached value as stored and as read: float caches keep the value, bfloat16 ones
 * (MK_MODEL_BF16_KV) round it to nearest even (f32_to_bf16) and widen it exactly. */
__device__ static inline void kv_put(float *dst, float x)
{
    *dst = x;
}
__device__ static inline void kv_put(uint16_t *dst, float x)
{
    *dst = f32_to_bf16(x);
}
__device__ static inline float kv_get(float x)
{
    return x;
}
__device__ static inline float kv_get(uint16_t h)
{
    return __uint_as_float((unsigned)h << 16);
}

/* one thread per cached value: the NKV key heads, then the NKV value heads, of row r; KT is
 * the caches' type (float, or uint16_t bfloat16) */
template <typename KT>
__global__ static void kv_store_k(KT *kc, KT *vc, const float *qkv, const int *slot, const int *pos,
                                  int R, int NH, int NKV, int hd, int Tmax)
{
    size_t KW = (size_t)NKV * hd, W = (size_t)(NH + 2 * NKV) * hd;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)R * KW) return;
    int r = (int)(i / KW);
    size_t c = i % KW;
    size_t o = ((size_t)slot[r] * Tmax + pos[r]) * KW + c;
    const float *row = qkv + (size_t)r * W + (size_t)NH * hd;
    kv_put(&kc[o], row[c]);
    kv_put(&vc[o], row[KW + c]);
}

/* One warp (one block) per (row, query head) over the kv head of its group; the scores in att
 * [R, NH, Tmax] (global memory, so that any context length fits).  Cached positions are
 * KW = NKV hd values apart, of type KT (float, or uint16_t bfloat16 widened by kv_get). */
template <typename KT>
__global__ static void attn_decode_k(float *out, float *att, const float *qkv, const KT *kc,
                                     const KT *vc, const int *slot, const int *pos, int NH, int NKV,
                                     int hd, int Tmax)
{
    float *a = att + (size_t)blockIdx.x * Tmax;
    int r = blockIdx.x / NH, h = blockIdx.x % NH, lane = threadIdx.x;
    int n = pos[r] + 1, kh = h / (NH / NKV);
    size_t KW = (size_t)NKV * hd, W = (size_t)(NH + 2 * NKV) * hd;
    float scale = 1.0f / sqrtf((float)hd);
    const float *q = qkv + (size_t)r * W + q_off(h, hd);
    const KT *k = kc + (size_t)slot[r] * Tmax * KW + (size_t)kh * hd;
    const KT *v = vc + (size_t)slot[r] * Tmax * KW + (size_t)kh * hd;
    float mx = -INFINITY;
    for (int t2 = lane; t2 < n; t2 += 32) {
        float s = 0.0f;
        for (int i = 0; i < hd; i++) s += q[i] * kv_get(k[t2 * KW + i]);
        a[t2] = s * scale;
        mx = fmaxf(mx, a[t2]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int t2 = lane; t2 < n; t2 += 32) sum += (a[t2] = expf(a[t2] - mx));
    float inv = 1.0f / warp_sum(sum);
    __syncwarp();
    float *y = out + (size_t)r * NH * hd + q_off(h, hd);
    for (int i = lane; i < hd; i += 32) {
        float acc = 0.0f;
        for (int t2 = 0; t2 < n; t2++) acc += a[t2] * kv_get(v[t2 * KW + i]);
        y[i] = acc * inv;
    }
}

static void kv_store(float *kc, float *vc, const float *qkv, const int *slot, const int *pos, int R,
                     int NH, int NKV, int hd, int Tmax)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * NKV * hd, 256), 256, 0, kv_store_k<float>)
    (kc, vc, qkv, slot, pos, R, NH, NKV, hd, Tmax);
    LAUNCHED();
}

static void kv_store_bf16(uint16_t *kc, uint16_t *vc, const float *qkv, const int *slot,
                          const int *pos, int R, int NH, int NKV, int hd, int Tmax)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * NKV * hd, 256), 256, 0, kv_store_k<uint16_t>)
    (kc, vc, qkv, slot, pos, R, NH, NKV, hd, Tmax);
    LAUNCHED();
}

static void attn_decode(float *out, float *att, const float *qkv, const float *kc, const float *vc,
                        const int *slot, const int *pos, int R, int NH, int NKV, int hd, int Tmax)
{
    if (R == 0) return;
    if (R == 0) return;
    MK_LAUNCH(R * NH, 32, 0, attn_decode_k<float>)
    (out, att, qkv, kc, vc, slot, pos, NH, NKV, hd, Tmax);
    LAUNCHED();
}

static void attn_decode_bf16(float *out, float *att, const float *qkv, const uint16_t *kc,
                             const uint16_t *vc, const int *slot, const int *pos, int R, int NH,
                             int NKV, int hd, int Tmax)
{
    if (R == 0) return;
    MK_LAUNCH(R * NH, 32, 0, attn_decode_k<uint16_t>)
    (out, att, qkv, kc, vc, slot, pos, NH, NKV, hd, Tmax);
    LAUNCHED();
}

/* ---- GELU, SwiGLU, residuals -------------------------------------------- */

#define GELU_K 0.7978845608028654f

__global__ static void gelu_fwd_k(float *out, const float *inp, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
}

__global__ static void gelu_bwd_k(float *dinp, const float *inp, const float *dout, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i], th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    float g = 0.5f * (1.0f + th) +
              0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = g * dout[i];
}

/* SwiGLU over rows [gate | up] of 2I floats: one thread per output element */
__global__ static void swiglu_fwd_k(float *out, const float *inp, int R, int I)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)R * I) return;
    size_t r = i / I, j = i % I;
    float g = inp[r * 2 * I + j], u = inp[r * 2 * I + I + j];
    out[i] = g / (1.0f + expf(-g)) * u;
}

/* d gate = dy u silu'(g), silu'(g) = sig (1 + g (1 - sig)); d up = dy silu(g) */
__global__ static void swiglu_bwd_k(float *dinp, const float *inp, const float *dout, int R, int I)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)R * I) return;
    size_t r = i / I, j = i % I;
    float g = inp[r * 2 * I + j], u = inp[r * 2 * I + I + j], dy = dout[i];
    float sig = 1.0f / (1.0f + expf(-g));
    dinp[r * 2 * I + j] = dy * u * sig * (1.0f + g * (1.0f - sig));
    dinp[r * 2 * I + I + j] = dy * g * sig;
}

__global__ static void add_k(float *out, const float *a, const float *b, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

static void gelu_fwd(float *out, const float *inp, size_t n)
{
    if (n == 0) return;
    MK_LAUNCH(blocks(n, 256), 256, 0, gelu_fwd_k)(out, inp, n);
    LAUNCHED();
}

static void gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    if (n == 0) return;
    MK_LAUNCH(blocks(n, 256), 256, 0, gelu_bwd_k)(dinp, inp, dout, n);
    LAUNCHED();
}

static void swiglu_fwd(float *out, const float *inp, int R, int I)
{
    if (R == 0 || I == 0) return;
    MK_LAUNCH(blocks((size_t)R * I, 256), 256, 0, swiglu_fwd_k)(out, inp, R, I);
    LAUNCHED();
}

static void swiglu_bwd(float *dinp, const float *inp, const float *dout, int R, int I)
{
    if (R == 0 || I == 0) return;
    MK_LAUNCH(blocks((size_t)R * I, 256), 256, 0, swiglu_bwd_k)(dinp, inp, dout, R, I);
    LAUNCHED();
}

static void add(float *out, const float *a, const float *b, size_t n)
{
    if (n == 0) return;
    MK_LAUNCH(blocks(n, 256), 256, 0, add_k)(out, a, b, n);
    LAUNCHED();
}

/* ---- softmax rows: one warp per row ------------------------------------- */

/* log-sum-exp and sum p*z of row z, reduced over the warp */
__device__ static void row_lse(const float *z, int V, int lane, float *lse, float *pz)
{
    float mx = -INFINITY;
    for (int j = lane; j < V; j += 32) mx = fmaxf(mx, z[j]);
    mx = warp_max(mx);
    float s = 0.0f, sz = 0.0f;
    for (int j = lane; j < V; j += 32) {
        float e = expf(z[j] - mx);
        s += e;
        sz += e * z[j];
    }
    s = warp_sum(s);
    sz = warp_sum(sz);
    *lse = mx + logf(s);
    *pz = sz / s;
}

__global__ static void row_stats_k(float *logp, float *ent, const float *logits, const int *targets,
                                   int R, int V)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= R) return;
    const float *z = logits + (size_t)r * V;
    float lse, pz;
    row_lse(z, V, lane, &lse, &pz);
    if (lane == 0) {
        int t = targets ? targets[r] : -1;
        if (logp) logp[r] = t >= 0 ? z[t] - lse : 0.0f;
        if (ent) ent[r] = lse - pz;
    }
}

__global__ static void row_grad_k(float *dlogits, const float *logits, const int *targets,
                                  const float *ct, const float *ch, int R, int V)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= R) return;
    const float *z = logits + (size_t)r * V;
    float *d = dlogits + (size_t)r * V;
    int t = targets[r];
    float a = ct && t >= 0 ? ct[r] : 0.0f, e = ch ? ch[r] : 0.0f;
    float lse, pz;
    row_lse(z, V, lane, &lse, &pz);
    float H = lse - pz;
    for (int j = lane; j < V; j += 32) {
        float lp = z[j] - lse, p = expf(lp);
        d[j] = -a * p - e * p * (lp + H) + (j == t ? a : 0.0f);
    }
}

static void row_stats(float *logp, float *ent, const float *logits, const int *targets, int R,
                      int V)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * 32, 256), 256, 0, row_stats_k)(logp, ent, logits, targets, R, V);
    LAUNCHED();
}

static void row_grad(float *dlogits, const float *logits, const int *targets, const float *ct,
                     const float *ch, int R, int V)
{
    if (R == 0) return;
    MK_LAUNCH(blocks((size_t)R * 32, 256), 256, 0, row_grad_k)
    (dlogits, logits, targets, ct, ch, R, V);
    LAUNCHED();
}

/* ---- optimiser ---------------------------------------------------------- */

__global__ static void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float lr,
                               float b1, float b2, float eps, float wd, float bc1, float bc2)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * (1.0f - lr * wd) - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

static void adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                  float b2, float eps, float wd, int t)
{
    if (n == 0) return;
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    MK_LAUNCH(blocks(n, 256), 256, 0, adamw_k)(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2);
    LAUNCHED();
}

__global__ static void sumsq_k(double *out, const float *x, size_t n)
{
    __shared__ double part[256];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

/* the sum's accumulator, allocated once with the cuBLAS handle (mk_backend_cuda), so that a
 * step allocates nothing */
static double *sumsq_acc;

static double sumsq(const float *x, size_t n)
{
    double *d = sumsq_acc, h = 0.0;
    CUDA_CHECK(cudaMemset(d, 0, sizeof(double)));
    int nb = blocks(n, 256);
    if (nb > 1024) nb = 1024;
    if (nb < 1) nb = 1;
    MK_LAUNCH(nb, 256, 0, sumsq_k)(d, x, n);
    LAUNCHED();
    CUDA_CHECK(cudaMemcpy(&h, d, sizeof(double), cudaMemcpyDeviceToHost));
    return h;
}

__global__ static void scale_k(float *x, float s, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

static void scale(float *x, float s, size_t n)
{
    if (n == 0) return;
    MK_LAUNCH(blocks(n, 256), 256, 0, scale_k)(x, s, n);
    LAUNCHED();
}

/* ---- CUDA graphs ---------------------------------------------------------- */

static int graphs_off = -1; /* MANTA_CUDA_GRAPHS=0, or a capture failed */

static void graph_run(void **graph, void (*fn)(void *), void *ctx)
{
    if (graphs_off < 0) {
        const char *e = getenv("MANTA_CUDA_GRAPHS");
        graphs_off = e && !strcmp(e, "0");
    }
    if (graphs_off) {
        fn(ctx);
        return;
    }
    if (!*graph) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t x = NULL;
        cudaError_t e = cudaStreamBeginCapture(MK_STREAM, cudaStreamCaptureModeThreadLocal);
        if (e == cudaSuccess) {
            fn(ctx);
            e = cudaStreamEndCapture(MK_STREAM, &g);
        }
        if (e == cudaSuccess) e = cudaGraphInstantiate(&x, g, 0);
        if (g) cudaGraphDestroy(g);
        if (e != cudaSuccess) {
            (void)cudaGetLastError(); /* the failed capture's error is handled here */
            fprintf(stderr,
                    "manta kernels: capturing a CUDA graph failed (%s); decoding runs without "
                    "graphs from now on\n",
                    cudaGetErrorString(e));
            graphs_off = 1;
            fn(ctx); /* nothing captured ran: run it now */
            return;
        }
        *graph = x;
    }
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)*graph, MK_STREAM));
}

static void graph_free(void *graph)
{
    if (graph) CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

static void stream_sync(void)
{
    CUDA_CHECK(cudaStreamSynchronize(MK_STREAM));
}

/* ---- memory shared with other processes (share.c) --------------------------------------- */

static_assert(sizeof(cudaIpcMemHandle_t) == MK_SHARE_HANDLE_BYTES, "a share's handle");

/* The IPC calls fail where sharing does not work (a system or device without IPC, a handle
 * from elsewhere): each failure is reported, and its error (not sticky) cleared so that the
 * next CUDA_CHECK or launch check does not take it for its own. */
static int ipc_export(void *handle, const void *p)
{
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, (void *)p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "cudaIpcGetMemHandle: %s (this device or system does not share device "
                        "memory with other processes)",
                        cudaGetErrorString(e));
    }
    memcpy(handle, &h, sizeof h);
    return MK_OK;
}

static int ipc_open(void **p, const void *handle)
{
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    *p = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return mk__fail(MK_ERR_DEVICE,
                        "cudaIpcOpenMemHandle: %s (a share of another machine, of a device this "
                        "process does not see or has no peer access to, of a process that is "
                        "gone, or of this process)",
                        cudaGetErrorString(e));
    }
    return MK_OK;
}

static void ipc_close(void *p)
{
    if (cudaIpcCloseMemHandle(p) != cudaSuccess) (void)cudaGetLastError();
}

/* ---- the table ---------------------------------------------------------- */

/* in the order of struct mk__backend (mk_internal.h) */
/* clang-format off */
static const mk_backend cuda_backend = {
    "cuda",    cu_alloc,   cu_release, cu_upload,   cu_download, cu_copy,
    cu_zero,   embed_fwd,  embed_bwd,  ln_fwd,      ln_bwd,      rms_fwd,
    rms_bwd,   mm_fwd,     mm_bwd,     mm_fwd_bf16, to_bf16,     head_fwd,
    head_bwd,  qk_fwd,     qk_bwd,     attn_fwd,    attn_bwd,    gelu_fwd,
    gelu_bwd,  swiglu_fwd, swiglu_bwd, add,         kv_store,    attn_decode,
    row_stats, row_grad,   adamw,      sumsq,       scale,       mm_fwd_bf16a,
    mk__cuda_sample_rows, /* cuda_sample.cu */
    set_math,  add_norm_fwd, kv_store_bf16, attn_decode_bf16,
    graph_run, graph_free, stream_sync,
    mm_gelu_fwd, mm_gelu_bwd,
    ipc_export, ipc_open, ipc_close,
    1, /* att_rows_only: the fused attention (cuda_attn.cu) */
    round_bf16, mm_fwd_bb, mm_bwd_bb,
    0, /* bb_scratch_k: cuBLAS multiplies the bfloat16 operands as they are */
};
/* clang-format on */

/* Not thread-safe on its first call (it creates the cuBLAS handle): call it
 * once at start-up, as mk_set_threads. */
extern "C" const mk_backend *mk_backend_cuda(void)
{
    static int ready = 0;
    if (ready) return &cuda_backend;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        mk__fail(MK_ERR_DEVICE, "no CUDA device: %s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        return NULL;
    }
    cublasStatus_t s = cublasCreate(&blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        mk__fail(MK_ERR_DEVICE, "cublasCreate: %s", cublasGetStatusString(s));
        return NULL;
    }
    /* cuBLAS on the kernels' stream, with a workspace of its own so that a graph capture
     * never makes it allocate */
    size_t ws_bytes = (size_t)32 << 20;
    if ((s = cublasSetStream(blas, MK_STREAM)) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc(&blas_workspace, ws_bytes) != cudaSuccess ||
        (s = cublasSetWorkspace(blas, blas_workspace, ws_bytes)) != CUBLAS_STATUS_SUCCESS) {
        mk__fail(MK_ERR_DEVICE, "cuBLAS stream and workspace: %s", cublasGetStatusString(s));
        return NULL;
    }
    /* cuBLASLt for the products with epilogues, on the same stream with a workspace of its
     * own; without it every product takes the cuBLAS path */
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        lt = NULL;
    } else if (cudaMalloc(&lt_workspace, LT_WORKSPACE) != cudaSuccess) {
        (void)cudaGetLastError();
        cublasLtDestroy(lt);
        lt = NULL;
    }
    e = cudaMalloc(&sumsq_acc, sizeof(double));
    if (e != cudaSuccess) {
        mk__fail(MK_ERR_DEVICE, "cudaMalloc of the sum-of-squares accumulator: %s",
                 cudaGetErrorString(e));
        return NULL;
    }
    ready = 1;
    return &cuda_backend;
}
