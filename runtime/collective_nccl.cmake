# manta_nccl: the NCCL backend of the collectives (manta_coll_nccl()), in a
# library of its own so CPU-only programs never link CUDA. Built when nvcc
# and NCCL are found; include this file from runtime/CMakeLists.txt after the
# manta target:   include(${CMAKE_CURRENT_SOURCE_DIR}/collective_nccl.cmake)
if(MANTA_HAVE_CUDA AND NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
  add_library(manta_nccl STATIC ${CMAKE_CURRENT_LIST_DIR}/collective_nccl.cu)
  # The root's add_compile_options are for the C compiler; nvcc takes host
  # flags through -Xcompiler (as kernels/ does for manta_kernels_cuda).
  set_target_properties(manta_nccl PROPERTIES
    COMPILE_OPTIONS ""
    POSITION_INDEPENDENT_CODE ON
    CUDA_SEPARABLE_COMPILATION OFF)
  target_compile_options(manta_nccl PRIVATE
    -Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror,-Wno-unused-parameter,-D_GNU_SOURCE)
  # Under MANTA_SANITIZE the host code stays uninstrumented (as in kernels/):
  # nvcc splits -Xcompiler values at commas, which breaks
  # -fsanitize=address,undefined; the programs that link it are instrumented.
  target_include_directories(manta_nccl PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(manta_nccl PUBLIC manta CUDA::cudart ${NCCL_LIBRARY})
  message(STATUS "manta: NCCL ${NCCL_LIBRARY}; building manta_nccl")
else()
  message(STATUS "manta: no NCCL; the NCCL collective backend is skipped")
endif()
