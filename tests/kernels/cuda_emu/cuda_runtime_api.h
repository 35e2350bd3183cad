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
 *
 * Memory shared between processes (cudaIpc*): only in IPC mode, switched on by the environment
 * variable MK_CUDA_EMU_IPC=1 (read once; not a MANTA_ name, as above).  There cudaMalloc takes
 * its memory from memfd_create + ftruncate + mmap(MAP_SHARED) and keeps the file descriptor
 * open (close-on-exec) until cudaFree, raising RLIMIT_NOFILE's soft limit to the hard one once;
 * at least a page after each allocation is mapped too and poisoned for AddressSanitizer, which
 * does not track mappings, so that overruns still show.
 * cudaIpcGetMemHandle names an allocation by a magic, the exporter's pid, the descriptor, the
 * file's inode, the size and the exporter's device (the first name in its CUDA_VISIBLE_DEVICES,
 * empty when unset); cudaIpcOpenMemHandle in another process that sees that device (its own
 * CUDA_VISIBLE_DEVICES unset, or naming it) maps
 * /proc/<pid>/fd/<fd> MAP_SHARED (so both see one memory, as two processes on one GPU do),
 * registers the mapping as device memory and returns its base; cudaIpcCloseMemHandle unmaps it.
 * Refused, with the error real CUDA gives where known:
 *   cudaIpcGetMemHandle outside IPC mode (says once on stderr to set MK_CUDA_EMU_IPC=1), or
 *     of a pointer that is not the base of one of this process's own allocations (CUDA takes
 *     an interior pointer and names the whole allocation: the emulator is stricter, so that
 *     code relying on the base is checked), or of an opened mapping: cudaErrorInvalidValue;
 *   cudaIpcOpenMemHandle of memory on a device this process does not see: cudaErrorInvalidDevice
 *     (what CUDA gives is not documented; it refuses);
 *   with MK_CUDA_EMU_P2P=0 (GPUs without peer access between them, as PCIe cards behind
 *     different root complexes): cudaIpcOpenMemHandle of memory on a device it sees but that is
 *     not its own device 0 (the exporter's device is another name than the first of its
 *     CUDA_VISIBLE_DEVICES): cudaErrorPeerAccessUnsupported; by default (1) every pair of
 *     devices has peer access, as GPUs on NVLink do;
 *   cudaIpcOpenMemHandle of a handle this process exported: cudaErrorDeviceUninitialized
 *     ("invalid device context", what CUDA says); a bad magic, an exporter that is gone or
 *     whose descriptor no longer names that file (CUDA's code for these is not documented):
 *     cudaErrorInvalidValue;
 *   cudaIpcCloseMemHandle of a pointer that is not an opened mapping's base, and cudaFree of
 *     one that is: cudaErrorInvalidValue.
 * Opening one handle twice in a process maps it twice (CUDA may refuse the second open).
 * The exporter's cudaFree leaves other processes' mappings valid (the file lives while mapped).
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
    cudaErrorDeviceUninitialized = 201,
    cudaErrorPeerAccessUnsupported = 217,
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

#define CUDA_IPC_HANDLE_SIZE           64
#define cudaIpcMemLazyEnablePeerAccess 0x01
typedef struct cudaIpcMemHandle_st {
    char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcMemHandle_t;
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void *p);

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
