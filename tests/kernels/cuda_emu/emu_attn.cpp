/* kernels/cuda_attn.cu, compiled as C++ against the emulator's cuda_runtime.h (see there) */
#include "cuda_attn.cu"
