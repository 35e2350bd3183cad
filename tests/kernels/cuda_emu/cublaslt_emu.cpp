/*
 * cublaslt_emu.cpp - the emulator's cuBLASLt (cublasLt.h says what it models and what it
 * refuses).  Products with the CPU's BLAS, then the epilogue element by element in float; a call
 * during a stream capture is recorded (mk_emu::record) and runs at each launch of the graph.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include <cblas.h>

#include "cublasLt.h"
#include "cuda_runtime.h"

struct mk_emu_lt_context {
    int unused;
};
struct mk_emu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t ta, tb;
    uint32_t epi;
    const void *bias;
    void *aux;
    int64_t auxld;
};
struct mk_emu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
struct mk_emu_lt_pref {
    uint64_t workspace;
    uint32_t align[4]; /* A, B, C, D */
};

namespace
{

__attribute__((format(printf, 1, 2))) [[noreturn]] void refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: cuBLASLt: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

const uint64_t ALGO_MAGIC = 0x6d6b2d656d752d6cull;

/* the largest power of two up to 256 that divides the address (256 for NULL) */
uint32_t alignment(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && u % a) a >>= 1;
    return a;
}

bool has_bias(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool has_gelu(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool has_aux(uint32_t e) /* writes the GELU's input (forward) or reads it (DGELU) */
{
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           e == CUBLASLT_EPILOGUE_DGELU;
}
const char *epilogue_name(uint32_t e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
        return "DEFAULT";
    case CUBLASLT_EPILOGUE_RELU:
        return "RELU";
    case CUBLASLT_EPILOGUE_RELU_AUX:
        return "RELU_AUX";
    case CUBLASLT_EPILOGUE_BIAS:
        return "BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
        return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
        return "RELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DRELU:
        return "DRELU";
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
        return "DRELU_BGRAD";
    case CUBLASLT_EPILOGUE_GELU:
        return "GELU";
    case CUBLASLT_EPILOGUE_GELU_AUX:
        return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
        return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU:
        return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADA:
        return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB:
        return "BGRADB";
    }
    return "(unknown)";
}
bool epilogue_supported(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_DEFAULT || has_bias(e) || has_gelu(e) ||
           e == CUBLASLT_EPILOGUE_DGELU;
}

/* GELU's tanh form and its derivative, as kernels/cuda_ops.cu's gelu_fwd_k and gelu_bwd_k */
const float GELU_K = 0.7978845608028654f;
float gelu(float x)
{
    return 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
}
float dgelu(float x)
{
    float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + th) +
           0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

/* a stored float operand (ld x cols) rounded as the compute type reads it (the emulator's
 * cublasGemmEx does the same) */
std::vector<float> operand(const float *p, int64_t ld, uint64_t cols, cublasComputeType_t c)
{
    std::vector<float> out(p, p + (size_t)ld * cols);
    int drop = c == CUBLAS_COMPUTE_32F_FAST_16BF ? 16 : 13;
    for (float &x : out) x = mk_emu::round_bits(x, drop);
    return out;
}

const char *compute_name(cublasComputeType_t c)
{
    switch (c) {
    case CUBLAS_COMPUTE_32F:
        return "CUBLAS_COMPUTE_32F";
    case CUBLAS_COMPUTE_32F_FAST_16F:
        return "CUBLAS_COMPUTE_32F_FAST_16F";
    case CUBLAS_COMPUTE_32F_FAST_16BF:
        return "CUBLAS_COMPUTE_32F_FAST_16BF";
    case CUBLAS_COMPUTE_32F_FAST_TF32:
        return "CUBLAS_COMPUTE_32F_FAST_TF32";
    }
    return "(unknown compute type)";
}

/* the shapes of a product: op(A) [m,k], op(B) [k,n], D [m,n]; aborts when they disagree */
struct dims {
    int m, n, k;
};
dims check_shapes(const char *who, const mk_emu_lt_desc *d, const mk_emu_lt_layout *a,
                  const mk_emu_lt_layout *b, const mk_emu_lt_layout *c, const mk_emu_lt_layout *o)
{
    if (!d || !a || !b || !c || !o) refuse("%s: a NULL descriptor", who);
    if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_FAST_TF32 &&
        d->compute != CUBLAS_COMPUTE_32F_FAST_16BF)
        refuse("%s: compute type %s (%d) is not emulated", who, compute_name(d->compute),
               (int)d->compute);
    if (d->scale != CUDA_R_32F) refuse("%s: scale type %d is not emulated", who, (int)d->scale);
    const mk_emu_lt_layout *ls[4] = {a, b, c, o};
    for (const mk_emu_lt_layout *l : ls) {
        if (l->type != CUDA_R_32F) refuse("%s: matrix type %d is not emulated", who, (int)l->type);
        if (l->ld < (int64_t)std::max<uint64_t>(1, l->rows))
            refuse("%s: ld %lld below the %llu rows", who, (long long)l->ld,
                   (unsigned long long)l->rows);
    }
    if (c->rows != o->rows || c->cols != o->cols || c->ld != o->ld)
        refuse("%s: C's layout differs from D's (only C = D is emulated)", who);
    dims s;
    s.m = (int)o->rows, s.n = (int)o->cols;
    uint64_t am = d->ta ? a->cols : a->rows, ak = d->ta ? a->rows : a->cols;
    uint64_t bk = d->tb ? b->cols : b->rows, bn = d->tb ? b->rows : b->cols;
    if (am != o->rows || bn != o->cols || ak != bk)
        refuse("%s: op(A) %llux%llu times op(B) %llux%llu into D %llux%llu", who,
               (unsigned long long)am, (unsigned long long)ak, (unsigned long long)bk,
               (unsigned long long)bn, (unsigned long long)o->rows, (unsigned long long)o->cols);
    s.k = (int)ak;
    return s;
}

/* one product and its epilogue, by value (recorded as it stands during a capture) */
struct lt_call {
    bool ta, tb;
    int m, n, k;
    int64_t lda, ldb, ldd, auxld;
    float alpha, beta;
    const float *A, *B, *bias;
    float *D, *aux;
    uint32_t epi;
    cublasComputeType_t compute;
};

long matmuls[1024]; /* cublasLtMatmul calls run or replayed, by epilogue (mk_emu_lt_matmuls) */

void lt_run(const void *p)
{
    const lt_call *c = (const lt_call *)p;
    matmuls[c->epi % 1024]++;
    if (c->m == 0 || c->n == 0) return;
    const float *A = c->A, *B = c->B;
    std::vector<float> ra, rb;
    if (c->compute != CUBLAS_COMPUTE_32F) {
        ra = operand(c->A, c->lda, c->ta ? c->m : c->k, c->compute);
        rb = operand(c->B, c->ldb, c->tb ? c->k : c->n, c->compute);
        A = ra.data(), B = rb.data();
    }
    cblas_sgemm(CblasColMajor, c->ta ? CblasTrans : CblasNoTrans, c->tb ? CblasTrans : CblasNoTrans,
                c->m, c->n, c->k, c->alpha, A, (int)c->lda, B, (int)c->ldb, c->beta, c->D,
                (int)c->ldd);
    if (c->epi == CUBLASLT_EPILOGUE_DEFAULT) return;
    for (int j = 0; j < c->n; j++) {
        float *d = c->D + (size_t)j * c->ldd;
        float *x = c->aux ? c->aux + (size_t)j * c->auxld : NULL;
        for (int i = 0; i < c->m; i++) {
            if (c->epi == CUBLASLT_EPILOGUE_DGELU) {
                d[i] = dgelu(x[i]) * d[i];
                continue;
            }
            float v = d[i];
            if (has_bias(c->epi)) v += c->bias[i];
            if (has_aux(c->epi)) x[i] = v;
            d[i] = has_gelu(c->epi) ? gelu(v) : v;
        }
    }
}

} /* namespace */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    *handle = new mk_emu_lt_context{0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    *desc = new mk_emu_lt_desc{
        compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t bytes)
{
    if (!desc || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    auto need = [&](size_t n, const char *name) {
        if (bytes != n) refuse("%s set with %zu bytes, not %zu", name, bytes, n);
    };
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        const char *name = attr == CUBLASLT_MATMUL_DESC_TRANSA ? "TRANSA" : "TRANSB";
        need(sizeof(int32_t), name);
        int32_t v;
        memcpy(&v, buf, sizeof v);
        if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) refuse("%s = %d is not emulated", name, (int)v);
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->ta : desc->tb) = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        need(sizeof(uint32_t), "EPILOGUE");
        uint32_t v;
        memcpy(&v, buf, sizeof v);
        if (!epilogue_supported(v))
            refuse("epilogue CUBLASLT_EPILOGUE_%s (%u) is not emulated", epilogue_name(v), v);
        desc->epi = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        need(sizeof(void *), "BIAS_POINTER");
        memcpy(&desc->bias, buf, sizeof desc->bias);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        need(sizeof(void *), "EPILOGUE_AUX_POINTER");
        memcpy(&desc->aux, buf, sizeof desc->aux);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        need(sizeof(int64_t), "EPILOGUE_AUX_LD");
        memcpy(&desc->auxld, buf, sizeof desc->auxld);
        return CUBLAS_STATUS_SUCCESS;
    default:
        refuse("matmul descriptor attribute %d is not emulated", (int)attr);
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (type != CUDA_R_32F) refuse("matrix layout of type %d is not emulated", (int)type);
    *layout = new mk_emu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    *pref = new mk_emu_lt_pref{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t bytes)
{
    if (!pref || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (bytes != sizeof(uint64_t)) refuse("MAX_WORKSPACE_BYTES set with %zu bytes", bytes);
        memcpy(&pref->workspace, buf, sizeof pref->workspace);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (bytes != sizeof(uint32_t)) refuse("MIN_ALIGNMENT_*_BYTES set with %zu bytes", bytes);
        uint32_t v;
        memcpy(&v, buf, sizeof v);
        if (v == 0 || (v & (v - 1))) refuse("MIN_ALIGNMENT_*_BYTES = %u: not a power of two", v);
        pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    refuse("preference attribute %d is not emulated", (int)attr);
}

/* The one algorithm there is, or none where cuBLASLt documents a restriction.  The algorithm
 * remembers what it was chosen for: the epilogue, the minimum alignments of A, B, C, D and the
 * alignments of the bias and aux pointers (the real heuristic reads those pointers for that). */
cublasStatus_t
cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                               cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                               cublasLtMatmulPreference_t pref, int requested,
                               cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!pref || requested < 1 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    check_shapes("cublasLtMatmulAlgoGetHeuristic", desc, Adesc, Bdesc, Cdesc, Ddesc);
    if (has_bias(desc->epi) && !desc->bias)
        refuse("heuristic: epilogue %s without BIAS_POINTER", epilogue_name(desc->epi));
    if (has_aux(desc->epi)) {
        if (!desc->aux)
            refuse("heuristic: epilogue %s without EPILOGUE_AUX_POINTER", epilogue_name(desc->epi));
        if (desc->auxld % 8 || desc->auxld < (int64_t)Ddesc->rows)
            return CUBLAS_STATUS_NOT_SUPPORTED; /* "divisible by 8, no less than the rows" */
    }
    memset(&results[0], 0, sizeof results[0]);
    uint64_t *a = results[0].algo.data;
    a[0] = ALGO_MAGIC;
    for (int i = 0; i < 4; i++) a[1 + i] = pref->align[i];
    a[5] = has_bias(desc->epi) ? alignment(desc->bias) : 0;
    a[6] = has_aux(desc->epi) ? alignment(desc->aux) : 0;
    a[7] = desc->epi;
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || !A || !B || !D) return CUBLAS_STATUS_INVALID_VALUE;
    dims s = check_shapes("cublasLtMatmul", desc, Adesc, Bdesc, Cdesc, Ddesc);
    if (C != D) refuse("cublasLtMatmul: C is not D (only C = D is emulated)");
    if (!algo || algo->data[0] != ALGO_MAGIC)
        refuse("cublasLtMatmul: no algorithm from cublasLtMatmulAlgoGetHeuristic");
    const uint64_t *a = algo->data;
    if (a[7] != desc->epi)
        refuse("cublasLtMatmul: epilogue %s, the algorithm was chosen for %s",
               epilogue_name(desc->epi), epilogue_name((uint32_t)a[7]));
    const void *ptr[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if (alignment(ptr[i]) < a[1 + i])
            refuse("cublasLtMatmul: matrix %c at %p is aligned to %u bytes, the algorithm was "
                   "chosen for %llu",
                   "ABCD"[i], ptr[i], alignment(ptr[i]), (unsigned long long)a[1 + i]);
    if (has_bias(desc->epi)) {
        if (!desc->bias) refuse("cublasLtMatmul: epilogue %s without a bias", epilogue_name(a[7]));
        if (alignment(desc->bias) < a[5])
            refuse("cublasLtMatmul: the bias is aligned to %u bytes, the algorithm was chosen "
                   "for %llu",
                   alignment(desc->bias), (unsigned long long)a[5]);
    }
    if (has_aux(desc->epi)) {
        if (!desc->aux) refuse("cublasLtMatmul: epilogue %s without aux", epilogue_name(a[7]));
        if (desc->auxld % 8 || desc->auxld < s.m)
            refuse("cublasLtMatmul: aux ld %lld (D has %d rows)", (long long)desc->auxld, s.m);
        if (alignment(desc->aux) < a[6])
            refuse("cublasLtMatmul: aux is aligned to %u bytes, the algorithm was chosen for %llu",
                   alignment(desc->aux), (unsigned long long)a[6]);
    }
    (void)workspace, (void)workspace_bytes, (void)stream;
    lt_call c;
    c.ta = desc->ta == CUBLAS_OP_T, c.tb = desc->tb == CUBLAS_OP_T;
    c.m = s.m, c.n = s.n, c.k = s.k;
    c.lda = Adesc->ld, c.ldb = Bdesc->ld, c.ldd = Ddesc->ld, c.auxld = desc->auxld;
    c.alpha = *(const float *)alpha, c.beta = *(const float *)beta;
    c.A = (const float *)A, c.B = (const float *)B;
    c.bias = has_bias(desc->epi) ? (const float *)desc->bias : NULL;
    c.D = (float *)D, c.aux = has_aux(desc->epi) ? (float *)desc->aux : NULL;
    c.epi = desc->epi, c.compute = desc->compute;
    if (mk_emu::capturing())
        mk_emu::record(
            lt_run, &c, [](const void *p) -> void * { return new lt_call(*(const lt_call *)p); },
            [](void *p) { delete (lt_call *)p; });
    else
        lt_run(&c);
    return CUBLAS_STATUS_SUCCESS;
}

/* products cublasLtMatmul has run so far with the epilogue named (CUBLASLT_EPILOGUE_ and
 * then epilogue, e.g. "GELU_AUX_BIAS"), replays included: tests/kernels/test_cuda.c checks that
 * the fused paths are taken */
extern "C" long mk_emu_lt_matmuls(const char *epilogue)
{
    for (uint32_t e = 0; e < 1024; e++)
        if (!strcmp(epilogue_name(e), epilogue)) return matmuls[e];
    refuse("mk_emu_lt_matmuls: no epilogue %s", epilogue);
}
