/*
 * cublas_v2.h of the CPU emulator (see cuda_runtime.h beside it): the cuBLAS calls
 * kernels/cuda_ops.cu makes, computed with the CPU's BLAS.  Arguments are checked as cuBLAS
 * checks them (a leading dimension below the rows it must hold is CUBLAS_STATUS_INVALID_VALUE).
 * Column-major, host pointer mode.  cublasGemmEx takes float or bfloat16 operands, float
 * output, and rounds float operands to TF32 or bfloat16 (nearest even) for the _FAST_TF32 and
 * _FAST_16BF compute types, as the tensor cores read them.
 */
#ifndef MK_CUDA_EMU_CUBLAS_H
#define MK_CUDA_EMU_CUBLAS_H

#include "cuda_runtime.h"

typedef struct cublasContext *cublasHandle_t;

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
} cudaDataType;

typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType Atype, int lda, const void *B, cudaDataType Btype, int ldb,
                            const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);

#endif
