# bench_cuda_attn: the CUDA back-end's fused training attention (kernels/cuda_attn.cu), forward
# and backward, on model-sized shapes (a program, not a test; needs a CUDA device).
#   build/tests/bench/bench_cuda_attn [--reps N]
if(MANTA_HAVE_CUDA AND TARGET manta_kernels_cuda)
  add_executable(bench_cuda_attn ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_attn.c)
  target_link_libraries(bench_cuda_attn PRIVATE manta_kernels_cuda)
endif()
