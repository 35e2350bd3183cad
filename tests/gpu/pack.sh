#!/bin/bash
# pack.sh -- build here what a GPU session runs, and pack it for the device machine, which has
# CUDA 13 (cuBLAS), PyTorch and transformers but none of our Debian libraries (../shared/GPU.md).
#
#   tests/gpu/pack.sh [BUILD_DIR]     (default build; configured with CUDA if not yet)
#
# Writes .gpu/ (ignored by git; carry it: run(carry=[".gpu"], ...)):
#   bin/       the CUDA tests and benchmarks, manta with libmanta_cuda.so and libmanta_nccl.so
#              beside it, redis-server (for the NCCL test and the RL job); debug info stripped
#   libs.tar.xz  every shared library they load that is not libc's, the CUDA toolkit's or
#              NCCL's (those the device machine has: cuBLAS in /usr/local, NCCL in PyTorch's
#              wheel)
#   srcdir     the source folder the binaries were built from: they look for fixtures and
#              scripts there, so device_check.sh links it to the copy of the tree it runs in
# Then, on the device: tests/gpu/device_check.sh (one prepared script; figures under $OUT).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
if [ ! -f "$B/CMakeCache.txt" ]; then
    cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMANTA_WERROR=ON >/dev/null
fi
grep -q "MANTA_HAVE_CUDA:INTERNAL=1\|MANTA_CUDA:BOOL=ON" "$B/CMakeCache.txt" ||
    echo "pack.sh: warning: $B may not be configured with CUDA" >&2
targets=(kernels_test_cuda bench_gpu bench_cuda_attn test_collective_nccl nccl_module_load
         manta_exe manta_cuda manta_nccl_module)
cmake --build "$B" -j"$(nproc)" --target "${targets[@]}"
rm -rf .gpu && mkdir -p .gpu/bin .gpu/libs
bins=("$B/tests/kernels/kernels_test_cuda" "$B/tests/bench/bench_gpu"
      "$B/tests/bench/bench_cuda_attn" "$B/tests/collective/test_collective_nccl"
      "$B/tests/collective/nccl_module_load" "$B/manta" "$B/libmanta_cuda.so"
      "$B/libmanta_nccl.so" "$(command -v redis-server)")
for f in "${bins[@]}"; do
    [ -f "$f" ] || { echo "pack.sh: missing $f" >&2; exit 1; }
    objcopy --strip-debug "$f" ".gpu/bin/$(basename "$f")"
done
# the libraries they load, but libc's, the CUDA toolkit's and NCCL's
for f in .gpu/bin/*; do ldd "$f" 2>/dev/null || true; done |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libresolv)\.so|/usr/local/cuda|libcuda\.so|libcublas|libcudart|libnccl' |
    while read -r lib; do cp -L "$lib" .gpu/libs/; done
tar cJf .gpu/libs.tar.xz -C .gpu libs && rm -rf .gpu/libs
pwd >.gpu/srcdir
git rev-parse HEAD >.gpu/commit
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
du -sh .gpu .gpu/* | sed 's/^/pack.sh: /'
