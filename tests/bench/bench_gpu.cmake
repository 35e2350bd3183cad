# bench_gpu: the policy on one CUDA device against PyTorch on the same device (a program,
# not a test).  Built with the CUDA back-end (when nvcc exists), which it links directly
# as kernels_test_cuda does; exits 77 when no device can be used.
#   build/tests/bench/bench_gpu [--only-gpt2 | --only-llama] [--quick] [--bf16-weights]
if(MANTA_HAVE_CUDA AND TARGET manta_kernels_cuda)
  add_executable(bench_gpu ${CMAKE_CURRENT_LIST_DIR}/bench_gpu.c)
  target_link_libraries(bench_gpu PRIVATE manta_kernels_cuda)
  target_compile_definitions(bench_gpu PRIVATE
    BENCH_GPU_TORCH_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/bench_gpu_torch.py")
endif()
