/*
 * cuda_runtime_api.h of the CPU emulator (see cuda_runtime.h beside it): the host API, in C as
 * well as C++ (a C test calls cudaMalloc and cudaMemcpy, as with CUDA's own header), with C
 * linkage as CUDA's.  cuda_runtime.h adds the device language for C++.
 *
 * Streams: the handles cudaStreamPerThread, cudaStreamLegacy and 0 share one stream; each
 * cudaStreamCreateWithFlags makes one more.  Kernels, copies and memsets run at once, on the
 * calling thread; the only work that stays pending on a stream is what another emulator puts
 * there (the NCCL emulator, tests/collective/nccl_emu: an operation keeps its stream "not
 * ready" until the communicator's worker finished it).  cudaStreamQuery says cudaErrorNotReady
 * while work is pending, cudaStreamSynchronize waits for it, and cudaMemcpyAsync waits for it
 * before copying (stream order), then copies at once.
 *
 * Devices: cudaGetDeviceCount says MK_CUDA_EMU_DEVICES (default 1, at most 64; not a MANTA_
 * name, since node agents pass no MANTA_ variable to the actors they start); every device
 * shares the host's memory, and cudaSetDevice only records the thread's current device.
 */
#ifndef MK_CUDA_EMU_RUNTIME_API_H
#define MK_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef struct CUstream_st *cudaStream_t;
#define cudaStreamLegacy      ((cudaStream_t)0x1)
#define cudaStreamPerThread   ((cudaStream_t)0x2)
#define cudaStreamDefault     0x00
#define cudaStreamNonBlocking 0x01
#define cudaHostAllocDefault  0x00
typedef struct mk_emu_graph *cudaGraph_t;
typedef struct mk_emu_graph *cudaGraphExec_t;
typedef enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
} cudaStreamCaptureMode;

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes); /* pinned: plain host memory here */
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

#ifdef __cplusplus
}
#endif
#endif
