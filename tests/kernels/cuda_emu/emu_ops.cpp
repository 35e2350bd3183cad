/* kernels/cuda_ops.cu, compiled as C++ against the emulator's cuda_runtime.h (see there) */
#include "cuda_ops.cu"
