/*
 * cuda_common.h - what the CUDA back-end's three files (cuda_ops.cu, cuda_attn.cu,
 * cuda_sample.cu) share: error checks that die naming the call, and the two spellings that
 * differ between nvcc and the CPU emulator that tests/kernels/cuda_emu provides.
 *
 * The emulator compiles these same files with a C++ compiler against its own cuda_runtime.h
 * and cublas_v2.h (which define MK_CUDA_EMU), runs every thread of a block as a coroutine on
 * the CPU, and so lets tests/kernels/test_cuda.c check every kernel against the CPU back-end
 * on machines without a GPU.  Two things in CUDA C++ cannot be spelled in plain C++, so the
 * kernels write them through these macros:
 *
 *   MK_LAUNCH(grid, block, smem, kernel)(args...)   kernel<<<grid, block, smem,
 * MK_STREAM>>>(args...) MK_DYNAMIC_SMEM(type, name);                    extern __shared__ type
 * name[];
 *
 * (kernel may be a template-id with commas, e.g. attn_fwd_k<4, 4, 1>: it is the variadic tail).
 */
#ifndef MK_CUDA_COMMON_H
#define MK_CUDA_COMMON_H

#include <cuda_runtime.h>

#include "mk_internal.h"

/* Every kernel and every cuBLAS call goes to the calling thread's default stream: a blocking
 * stream, so the synchronous copies (on the legacy stream) stay ordered after its work as
 * before, and, unlike the legacy stream, one that a CUDA graph can capture (graph_run). */
#define MK_STREAM cudaStreamPerThread

#ifdef MK_CUDA_EMU
#define MK_LAUNCH(grid, block, smem, ...)                                                          \
    mk_emu_launch((grid), (block), (smem), #__VA_ARGS__, __VA_ARGS__)
#define MK_DYNAMIC_SMEM(type, name) type *name = (type *)mk_emu_dynamic_smem()
#else
#define MK_LAUNCH(grid, block, smem, ...) __VA_ARGS__<<<(grid), (block), (smem), MK_STREAM>>>
#define MK_DYNAMIC_SMEM(type, name)       extern __shared__ type name[]
#endif

/* a failed runtime call ends the process, naming the call's file and line */
#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            mk__die(__FILE__, __LINE__, cudaGetErrorString(e_),                                    \
                    "a CUDA call failed; run with compute-sanitizer to find the kernel");          \
    } while (0)

/* after a launch: a launch that did not start (bad configuration, too much shared memory) */
#define MK_LAUNCHED(what)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess)                                                                     \
            mk__die(__FILE__, __LINE__, cudaGetErrorString(e_),                                    \
                    what " failed to launch; run with compute-sanitizer");                         \
    } while (0)

#endif
