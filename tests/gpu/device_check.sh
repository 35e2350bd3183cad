#!/bin/bash
# device_check.sh -- on the device machine, with .gpu/ made by tests/gpu/pack.sh carried along:
# every CUDA test and GPU benchmark of the project, each under a timeout, its output teed under
# $OUT (so a run cut short still leaves what it printed). Sized for about 8 minutes on one H200;
# `--quick` for about 4.
#
#   tests/gpu/device_check.sh [--quick]        (from the repository root; OUT defaults to ./out)
#
# What a pass looks like is in kernels/GPU_CHECK.md.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
quick=${1:-}
G=$PWD/.gpu
[ -d "$G/bin" ] || { echo "device_check.sh: no .gpu/bin: run tests/gpu/pack.sh and carry .gpu" >&2; exit 2; }
tar xJf "$G/libs.tar.xz" -C "$G"
# the binaries find fixtures and scripts at the folder they were built in: make it this tree
src=$(cat "$G/srcdir")
if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
cublas=$(dirname "$(find /usr/local -name 'libcublas.so*' 2>/dev/null | head -1)")
nccl=$(dirname "$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$G/libs:$cublas:$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$G/bin:$PATH
step() { # NAME TIMEOUT CMD...: run, tee into $OUT/NAME.log, say the exit status
    local name=$1 t=$2
    shift 2
    echo "== $name ($(date +%T)): $*"
    timeout "$t" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -15 "$OUT/$name.log"
    echo "== $name: exit $rc"
    echo "$name $rc" >>"$OUT/status.txt"
}
{
    echo "commit $(cat "$G/commit")"
    nvidia-smi -L
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.is_available())"
} >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
KTEST_VERBOSE=1 step kernels_test_cuda 180 "$G/bin/kernels_test_cuda"
step nccl_module_load 30 "$G/bin/nccl_module_load" "$G/bin/libmanta_nccl.so"
step test_collective_nccl 120 "$G/bin/test_collective_nccl"
step bench_cuda_attn 60 "$G/bin/bench_cuda_attn"
if [ "$quick" = --quick ]; then
    MANTA_PYTHON=python3 step bench_gpu 240 "$G/bin/bench_gpu" --quick
else
    MANTA_PYTHON=python3 step bench_gpu 420 "$G/bin/bench_gpu"
fi
grep '^{' "$OUT/bench_gpu.log" >"$OUT/bench_gpu.jsonl" 2>/dev/null
# the calculator job on the one GPU: learners and rollouts share it by quarters (learners over
# the host: NCCL wants a GPU each; rollouts take the weights device to device, CUDA IPC), a few
# versions; the actors' logs come back under $OUT/logs-calc
step rl_calc_cuda 180 "$G/bin/manta" run examples/calc_agent.yaml --set model.device=cuda \
    --set rl.max_versions=5 --set rl.eval_every=0 --set rl.run_dir="$OUT/run-calc" \
    --log-dir "$OUT/logs-calc"
grep -rhE "device to device|device-to-device|rl.collective|weights to rollouts" \
    "$OUT/logs-calc" >"$OUT/weight_sync.txt" 2>/dev/null
echo "== weight sync lines of the job's logs:"
cat "$OUT/weight_sync.txt"
if command -v compute-sanitizer >/dev/null && [ "$quick" != --quick ]; then
    step memcheck 240 compute-sanitizer --tool memcheck "$G/bin/kernels_test_cuda"
fi
echo "== done; exits in $OUT/status.txt"
cat "$OUT/status.txt"
