#!/bin/bash
# model.device: cuda, end to end through `manta run` on the calculator job
# (examples/calc_agent.yaml on a free port, a few versions). The flag alone
# gives the learners and rollouts, which have no resources.gpu, a quarter of
# one GPU each (4 replicas share one; actors/rl_defaults.c), said at the start:
#  1. a node that offers no GPU: the job fails at placement, naming the
#     group and saying that its share is a default to set;
#  2. the same with resources.gpu 0 given for both: the value given wins, no
#     default; the job fails at the learners' and rollouts' init, saying
#     model.device is cuda and why (no libmanta_cuda.so in this build, or
#     no device: CUDA_VISIBLE_DEVICES is '' and the group needs a GPU);
#  3. the flag alone on a node offering one GPU (MANTA_NODE_GPU=1 where the
#     machine has none): the four model actors share device 0. Without a
#     device or without the module the job fails naming that
#     (CUDA_VISIBLE_DEVICES='0'); with both, it runs 3 versions and exits 0;
#  4. a fifth quarter (env) does not fit the one GPU: refused before any
#     actor starts, the defaults named;
#  5. given EMU_MANTA (build/cuda-emu/manta: beside it, libmanta_cuda.so is
#     the CUDA back-end on the CPU emulator of tests/kernels/cuda_emu), the
#     job runs to its end with the rollouts on the CUDA back-end (the
#     learners on the CPU: the emulator trains about 100x slower than the
#     CPU back-end): device sampling, weights uploaded from the learners'
#     checkpoints, the rollouts' half of one GPU each; it exits 0 with its
#     ledger balanced, and both rollouts' logs say the emulator ran;
#  6. with the learners on the emulated back-end too (beside it,
#     libmanta_nccl.so is the NCCL back-end on the NCCL emulator of
#     tests/collective/nccl_emu), short runs: rl.collective nccl with a GPU
#     per learner sums over NCCL and exits 0; the default (auto) with both
#     learners on one GPU goes through the host, saying why; nccl there
#     fails naming the shared GPU; nccl with learners on the CPU is refused;
#  7. learners and rollouts on the emulated back-end in its IPC mode: the
#     rollouts take the weights device to device (CUDA IPC), each says so once
#     and none reports a failed copy; rl.weight_sync buckets turns it off; with
#     the learners on GPUs of their own and the rollouts on another, the
#     rollouts see the node's other GPUs too and copy device to device; where
#     the GPUs have no peer access (MK_CUDA_EMU_P2P=0) they cannot map the
#     learners' memory: they say so and fetch buckets.
# usage: test_rl_device.sh MANTA SOURCE_DIR [EMU_MANTA]
set -u
MANTA=$1
SRC=$2
EMU_MANTA=${3:-}
tmp=$(mktemp -d /tmp/manta-test-device-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sed -e "s/8000/$port/g" -e "s/^job: calc-agent/job: device-$$/" \
    "$SRC/examples/calc_agent.yaml" >"$tmp/spec.yaml"
have_gpu=0
[ -n "$(ls /proc/driver/nvidia/gpus 2>/dev/null)" ] && have_gpu=1
have_module=0
[ -f "$(dirname "$MANTA")/libmanta_cuda.so" ] && have_module=1
fail=0
run() { # NAME EXPECT_RC(0|nonzero) [ENV=VAL] -- ARGS...
    local name=$1 want=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    (cd "$SRC" && env "${envs[@]}" timeout 300 "${PROGRAM:-$MANTA}" run "$tmp/spec.yaml" \
        --log-dir "$tmp/logs" --set "rl.run_dir=$tmp/run-$name" \
        --set model.device=cuda --set rl.max_versions=3 --set rl.eval_every=0 "$@") \
        >"$tmp/$name.out" 2>&1
    rc=$?
    echo "== $name: exit $rc"
    tail -5 "$tmp/$name.out"
    if [ "$want" = 0 ] && [ $rc -ne 0 ]; then echo "FAIL: $name: expected exit 0"; fail=1; fi
    if [ "$want" != 0 ] && { [ $rc -eq 0 ] || [ $rc -eq 124 ]; }; then
        echo "FAIL: $name: expected a failure, not exit $rc"
        fail=1
    fi
}
expect() { # NAME TEXT
    if ! grep -qF -- "$2" "$tmp/$1.out"; then echo "FAIL: $1: the output does not say: $2"; fail=1; fi
}

said="groups.learner.resources.gpu 0.25 and groups.rollout.resources.gpu 0.25 are defaults \
(model.device is cuda: the 4 replicas of learner, rollout share one GPU): set them in the spec or \
with --set to choose others"
actor_log() { # NAME ACTOR TEXT: the latest run's ACTOR.log says TEXT
    grep -qF -- "$3" "$tmp/logs"/*/logs/latest/$2.log ||
        { echo "FAIL: $1: $2.log does not say: $3"; fail=1; }
}
actor_unlog() { # NAME ACTOR REGEX: the latest run's ACTOR.log has no line matching REGEX
    ! grep -qE -- "$3" "$tmp/logs"/*/logs/latest/$2.log ||
        { echo "FAIL: $1: $2.log says: $3"; fail=1; }
}
learner_log() { # NAME RANK TEXT
    actor_log "$1" "learner-$2" "$3"
}
unexpect() { # NAME TEXT
    if grep -qF -- "$2" "$tmp/$1.out"; then echo "FAIL: $1: the output says: $2"; fail=1; fi
}

run none nonzero MANTA_NODE_GPU=0 --
expect none "manta: $said"
expect none 'placement: group "learner" replica'
expect none "does not fit: free: "
expect none "gpu 0 memory"
expect none "; $said"
unexpect none "model.device is cuda, but"

zero=(--set groups.learner.resources.gpu=0 --set groups.rollout.resources.gpu=0)
run zero nonzero MANTA_NODE_GPU=0 -- "${zero[@]}"
unexpect zero "are defaults"
expect zero "model.device is cuda, but"
if [ $have_module = 1 ]; then
    expect zero "CUDA_VISIBLE_DEVICES='', none given: give its group resources: {gpu: ...}"
else
    expect zero "no libmanta_cuda.so"
fi

if [ $have_gpu = 1 ] && [ $have_module = 1 ]; then
    run shared 0 MANTA_NODE_GPU=1 --
else
    run shared nonzero MANTA_NODE_GPU=1 --
    expect shared "model.device is cuda, but"
    if [ $have_module = 1 ]; then
        expect shared "this actor sees no CUDA device (CUDA_VISIBLE_DEVICES='0')"
    else
        expect shared "no libmanta_cuda.so"
    fi
    unexpect shared "does not fit"
fi
expect shared "manta: $said"
[ "$(grep -cF -- "$said" "$tmp/shared.out")" = 1 ] || { echo "FAIL: shared: the defaults are not said once"; fail=1; }

# a fifth quarter does not fit the one GPU: refused before any actor starts
run toomany nonzero MANTA_NODE_GPU=1 -- --set groups.env.resources.gpu=0.25
expect toomany "does not fit"
expect toomany "; $said"
unexpect toomany "model.device is cuda, but"
if [ -n "$EMU_MANTA" ]; then
    PROGRAM=$EMU_MANTA run emulated 0 MANTA_NODE_GPU=1 -- --set groups.learner.settings.device=cpu
    expect emulated "groups.rollout.resources.gpu 0.5 is a default"
    expect emulated "ledger balanced"
    expect emulated "done: held-out success"
    for r in rollout-0 rollout-1; do
        grep -qF "cuda emulator: the CUDA kernels run on the CPU" "$tmp/logs"/*/logs/latest/$r.log ||
            { echo "FAIL: emulated: $r.log does not say the emulator ran"; fail=1; }
    done
    ! grep -qF "cuda emulator" "$tmp/logs"/*/logs/latest/learner-0.log ||
        { echo "FAIL: emulated: learner-0 loaded the CUDA module"; fail=1; }
    # the learners on the emulated CUDA back-end too, a short run each (2 warm-up steps, 1
    # version, every batch trained), the rollouts on the CPU to keep it short
    short=(--set groups.rollout.settings.device=cpu --set "rl.warmup={max_steps: 2}"
           --set rl.max_versions=1 --set rl.dynamic_sampling=false)
    own=(--set groups.learner.resources.gpu=1)
    PROGRAM=$EMU_MANTA run learners-nccl 0 MANTA_NODE_GPU=2 -- "${short[@]}" "${own[@]}" \
        --set rl.collective=nccl
    expect learners-nccl "ledger balanced"
    learner_log learners-nccl 0 "collective nccl (gradients and parameters on the devices)"
    learner_log learners-nccl 1 "collective nccl (gradients and parameters on the devices)"
    learner_log learners-nccl 1 "learner 1: joined learn.nccl: gradients and parameters over NCCL"
    learner_log learners-nccl 0 "cuda emulator: the CUDA kernels run on the CPU"
    # learners and rollouts on the emulated back-end, with CUDA IPC (the emulator maps
    # another process's allocations in MK_CUDA_EMU_IPC mode): the rollouts copy the weights
    # device to device; with rl.weight_sync buckets they fetch buckets only
    ipc=(--set "rl.warmup={max_steps: 2}" --set rl.max_versions=1 --set rl.dynamic_sampling=false)
    PROGRAM=$EMU_MANTA run weights-ipc 0 MANTA_NODE_GPU=1 MK_CUDA_EMU_IPC=1 -- "${ipc[@]}"
    expect weights-ipc "ledger balanced"
    learner_log weights-ipc 0 "weights to rollouts: device to device for rollouts on cuda"
    for r in rollout-0 rollout-1; do
        actor_log weights-ipc $r "rollout: weights device to device from the learners' GPU memory"
        actor_unlog weights-ipc $r "device-to-device (copy|check) of bucket"
    done
    PROGRAM=$EMU_MANTA run weights-buckets 0 MANTA_NODE_GPU=1 MK_CUDA_EMU_IPC=1 -- "${ipc[@]}" \
        --set rl.weight_sync=buckets
    expect weights-buckets "ledger balanced"
    actor_unlog weights-buckets rollout-0 "device to device"
    actor_unlog weights-buckets learner-0 "device to device"
    # learners on GPUs of their own, the rollouts on a third: a rollout sees the node's other
    # GPUs too (after its own), so it maps the learners' memory there and copies device to
    # device; where the GPUs have no peer access (MK_CUDA_EMU_P2P=0) its check fails and it
    # fetches the buckets
    PROGRAM=$EMU_MANTA run weights-apart 0 MANTA_NODE_GPU=3 MK_CUDA_EMU_IPC=1 -- "${ipc[@]}" \
        "${own[@]}"
    expect weights-apart "ledger balanced"
    for r in rollout-0 rollout-1; do
        actor_log weights-apart $r "rollout: computes on GPU 2 and sees this node's others too (CUDA_VISIBLE_DEVICES=2,0,1)"
        actor_log weights-apart $r "rollout: weights device to device from the learners' GPU memory"
        actor_unlog weights-apart $r "device-to-device (copy|check) of bucket"
    done
    PROGRAM=$EMU_MANTA run weights-nop2p 0 MANTA_NODE_GPU=3 MK_CUDA_EMU_IPC=1 MK_CUDA_EMU_P2P=0 \
        -- "${ipc[@]}" "${own[@]}"
    expect weights-nop2p "ledger balanced"
    for r in rollout-0 rollout-1; do
        actor_log weights-nop2p $r "the device-to-device check of bucket 0 failed (cudaIpcOpenMemHandle: peer access is not supported"
        actor_unlog weights-nop2p $r "weights device to device from the learners"
    done
    PROGRAM=$EMU_MANTA run learners-shared 0 MANTA_NODE_GPU=1 -- "${short[@]}"
    expect learners-shared "ledger balanced"
    learner_log learners-shared 1 "rl.collective auto: host, as learner shards 0 and 1 share one GPU ("
    PROGRAM=$EMU_MANTA run shared-nccl nonzero MANTA_NODE_GPU=1 -- "${short[@]}" \
        --set rl.collective=nccl
    expect shared-nccl "NCCL needs a GPU per shard (give the learner group resources: {gpu: 1}"
    PROGRAM=$EMU_MANTA run cpu-nccl nonzero MANTA_NODE_GPU=1 -- "${short[@]}" \
        --set groups.learner.settings.device=cpu --set rl.collective=nccl
    expect cpu-nccl "rl.collective is nccl, but model.device is not cuda"
else
    echo "== emulated: skipped (no build/cuda-emu/manta: no C++ compiler)"
fi
[ $fail = 0 ] && echo "PASS"
exit $fail
