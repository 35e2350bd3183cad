# bench_kernels: policy kernel throughput against PyTorch (a program, not a test).
#   build/tests/bench/bench_kernels [--threads N] [--quick]
add_executable(bench_kernels ${CMAKE_CURRENT_LIST_DIR}/bench_kernels.c)
target_link_libraries(bench_kernels PRIVATE manta_kernels)
target_compile_definitions(bench_kernels PRIVATE
  BENCH_TORCH_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/bench_kernels_torch.py"
  BENCH_LLAMA_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/bench_llama_torch.py")
