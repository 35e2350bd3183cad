/* runtime/collective/collective_nccl.cu, compiled as C++ against the CUDA and NCCL emulators
 * (nccl.h beside this file, tests/kernels/cuda_emu) */
#include "collective_nccl.cu"
