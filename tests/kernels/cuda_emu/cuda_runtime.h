/*
 * cuda_runtime.h of the CPU emulator: the part of CUDA's runtime API and of CUDA C++'s
 * device language that kernels/cuda_*.cu use, so that the CUDA back-end compiles with a C++
 * compiler and runs on the CPU (tests/kernels/CMakeLists.txt, kernels_test_cuda_emu).
 *
 * What it models (cuda_emu.cpp):
 *   - a launch runs its blocks one after another, in a shuffled order, and each block's
 *     threads as coroutines on their own stacks, resumed in a shuffled order; a thread runs
 *     until it reaches a barrier, so every interleaving the schedule picks is one a GPU may
 *     produce, and code that leans on an order CUDA does not promise gives other results
 *     from run to run (MANTA_CUDA_EMU_ORDER=forward|reverse|shuffle, MANTA_CUDA_EMU_SEED);
 *   - __syncthreads waits for every live thread of the block; __syncwarp and the shuffles
 *     wait for every live lane of the warp, and a shuffle that reads a lane which did not
 *     reach the same shuffle, or warps that split between a warp and a block barrier, stop
 *     the program naming the kernel, block and thread;
 *   - launch checks as the runtime makes them (an empty grid, more than 1024 threads, dynamic
 *     shared memory above 48 KB without cudaFuncSetAttribute, or above 227 KB) set the error
 *     that cudaGetLastError returns;
 *   - dynamic shared memory starts each block filled with 0xff bytes (a float NaN), so a read
 *     before any write shows; device memory is host memory from the allocator (so AddressSanitizer
 *     sees overruns), and the copies check that the device side lies inside one allocation.
 * What it does not model: the memory model between threads without a barrier (a thread's
 * writes are visible at once), timing, warp-synchronous code without __syncwarp, and
 * cuBLAS's own kernels (cublas_v2.h multiplies with the CPU's BLAS).
 */
#ifndef MK_CUDA_EMU_RUNTIME_H
#define MK_CUDA_EMU_RUNTIME_H

#ifndef __cplusplus
#error "the CUDA emulator is C++: compile the .cu files with a C++ compiler"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

#define MK_CUDA_EMU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* blocks run one at a time, so a block's shared variables are the function's statics */
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

/* streams: see cuda_runtime_api.h.  cudaStreamPerThread is the only handle the back-end uses.
 * Graphs: a capture records every launch and cuBLAS call made while it is on (arguments copied
 * as a launch copies them) and a launch of the graph replays them; a copy, a memset or a
 * synchronisation during a capture fails it, as on a device. */
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
    return cudaMalloc((void **)p, bytes);
}

/* For another emulator that queues work on a stream (tests/collective/nccl_emu): stream_hold
 * marks one operation pending on s (cudaStreamQuery: cudaErrorNotReady), stream_release ends
 * it.  false: s is not a stream. */
namespace mk_emu
{
bool stream_hold(cudaStream_t s);
void stream_release(cudaStream_t s);
/* x with its last `drop` mantissa bits rounded off to nearest even (13: TF32, 16: bfloat16), as
 * the tensor cores read an operand; NaN kept.  cuBLAS and cuBLASLt (with cuBLAS only). */
float round_bits(float x, int drop);
} // namespace mk_emu

namespace mk_emu
{
cudaError_t set_max_dynamic_smem(const void *kernel, int bytes);
}
template <typename K>
static inline cudaError_t cudaFuncSetAttribute(K *kernel, cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    return mk_emu::set_max_dynamic_smem((const void *)kernel, value);
}

/* ---- inside a kernel ------------------------------------------------------------------- */

namespace mk_emu
{
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;
void sync_block(void);
enum shfl_kind { SHFL_NONE, SHFL_XOR, SHFL_DOWN, SHFL_UP, SHFL_IDX };
uint64_t exchange(uint64_t bits, int kind, int arg, int width);
void *dynamic_smem(void);
/* run(closure) on every thread of the grid; while a capture is on, copy(closure) is kept
 * (free_ drops it) and run at each launch of the graph instead */
void launch(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem,
            void (*run)(const void *), const void *closure, void *(*copy)(const void *),
            void (*free_)(void *));
/* true while a capture is on: a host call to record (cuBLAS) rather than run */
bool capturing(void);
void record(void (*run)(const void *), const void *closure, void *(*copy)(const void *),
            void (*free_)(void *));

template <typename T> static inline T shfl(T v, int kind, int arg, int width)
{
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = exchange(b, kind, arg, width);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}

/* MK_LAUNCH(grid, block, smem, kernel)(args...): the arguments are converted to the
 * kernel's parameter types and copied once, as a launch copies them to the device */
template <typename... P> struct launcher {
    const char *name;
    void (*kernel)(P...);
    dim3 grid, block;
    size_t smem;
    template <typename... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "a kernel launched with the wrong arity");
        struct closure {
            void (*k)(P...);
            std::tuple<typename std::decay<P>::type...> args;
        } c{kernel, std::tuple<typename std::decay<P>::type...>(static_cast<P>(a)...)};
        launch(
            name, (const void *)kernel, grid, block, smem,
            [](const void *p) {
                const closure *cc = (const closure *)p;
                std::apply(cc->k, cc->args);
            },
            &c, [](const void *p) -> void * { return new closure(*(const closure *)p); },
            [](void *p) { delete (closure *)p; });
    }
};
} /* namespace mk_emu */

template <typename... P>
static inline mk_emu::launcher<P...> mk_emu_launch(dim3 grid, dim3 block, size_t smem,
                                                   const char *name, void (*kernel)(P...))
{
    return mk_emu::launcher<P...>{name, kernel, grid, block, smem};
}
static inline void *mk_emu_dynamic_smem(void)
{
    return mk_emu::dynamic_smem();
}

#define threadIdx (mk_emu::thread_idx)
#define blockIdx  (mk_emu::block_idx)
#define blockDim  (mk_emu::block_dim)
#define gridDim   (mk_emu::grid_dim)
#define warpSize  32

static inline void __syncthreads(void)
{
    mk_emu::sync_block();
}
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    (void)mask;
    mk_emu::exchange(0, mk_emu::SHFL_NONE, 0, 32);
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32)
{
    (void)mask;
    return mk_emu::shfl(v, mk_emu::SHFL_XOR, m, width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    (void)mask;
    return mk_emu::shfl(v, mk_emu::SHFL_DOWN, (int)d, width);
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    (void)mask;
    return mk_emu::shfl(v, mk_emu::SHFL_UP, (int)d, width);
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    (void)mask;
    return mk_emu::shfl(v, mk_emu::SHFL_IDX, src, width);
}

/* one thread runs at a time, so read-modify-write is atomic as it stands */
template <typename T> static inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T> static inline T atomicMax(T *p, T v)
{
    T old = *p;
    if (v > old) *p = v;
    return old;
}
template <typename T> static inline T atomicMin(T *p, T v)
{
    T old = *p;
    if (v < old) *p = v;
    return old;
}
template <typename T> static inline T atomicExch(T *p, T v)
{
    T old = *p;
    *p = v;
    return old;
}
template <typename T> static inline T atomicCAS(T *p, T cmp, T v)
{
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}

static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __int_as_float(int i)
{
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}
static inline int __float_as_int(float f)
{
    int i;
    memcpy(&i, &f, sizeof i);
    return i;
}
static inline float rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}
static inline float __fdividef(float a, float b)
{
    return a / b;
}

/* CUDA's min and max take any two arithmetic types */
template <typename A, typename B> static inline typename std::common_type<A, B>::type min(A a, B b)
{
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)a : (C)b;
}
template <typename A, typename B> static inline typename std::common_type<A, B>::type max(A a, B b)
{
    typedef typename std::common_type<A, B>::type C;
    return (C)a > (C)b ? (C)a : (C)b;
}

#endif
