#!/usr/bin/env bash
# test_smollm2_rl.sh MANTA SOURCE_DIR -- the SmolLM2 agent example
# (examples/smollm2_calc.yaml) end to end on the real pretrained model, a
# few RL versions only: `manta run` with the GGUF file, its own tokenizer and
# ChatML, the real calc tool server, an embedded redis-server; then checks
# the summary (exit 0, versions trained, warm-up run, ledger balanced and
# exact), the final evaluation's answers (eval_final.jsonl) and the
# Hugging Face folder the learner wrote (config.json, model.safetensors,
# tokenizer.json, tokenizer_config.json with the chat template). With
# $MANTA_PYTHON (transformers), tests/rl/check_hf_export.py loads that
# folder with transformers and replays the greedy tool conversations of the
# held-out problems: its answers must equal Manta's. Skipped (77) when
# $MANTA_SMOLLM2_GGUF does not name the model (.ci/fetch_smollm2.py).
set -euo pipefail
manta=$1
src=$2
gguf=${MANTA_SMOLLM2_GGUF:-}
if [ -z "$gguf" ] || [ ! -r "$gguf" ]; then
    echo "test_smollm2_rl: MANTA_SMOLLM2_GGUF does not name a readable file; skipped" \
        "(python3 .ci/fetch_smollm2.py prints its path)"
    exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/manta-smollm2-XXXXXX")
trap 'rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The example's spec with the model, the tool server's port and the run
# folder moved, and a short run: 2 RL versions of 16 episodes, 16 held-out
# problems, a warm-up of 8 demonstrations.
sed -e "s#path: models/SmolLM2-135M-Instruct.Q4_1.gguf#path: $gguf#" \
    -e "s#8021#$port#g" \
    -e "s#run_dir: runs/smollm2-calc#run_dir: $work/run#" \
    -e "s#^job: smollm2-calc#job: smollm2-test-$$#" \
    "$src/examples/smollm2_calc.yaml" > "$work/spec.yaml"
cd "$src"
"$manta" run "$work/spec.yaml" --log-dir "$work/logs" \
    --set rl.max_versions=2 --set rl.batch_episodes=16 --set rl.warmup_batch=8 \
    --set rl.eval_problems=16 --set rl.eval_every=0 --set rl.max_time_s=900 \
    --set rl.stop_at=2.0 > "$work/out.txt" 2>&1 || {
    cat "$work/out.txt"
    tail -n 30 "$work"/logs/*/logs/*.log 2>/dev/null || true
    echo "test_smollm2_rl: manta run failed"
    exit 1
}
tail -n 5 "$work/out.txt"
python3 - "$work/run" <<'PY'
import json, os, sys
run = sys.argv[1]
s = json.load(open(os.path.join(run, "summary.json")))
led = s["ledger"]
def check(ok, what):
    if not ok:
        sys.exit("test_smollm2_rl: " + what)
check(s["versions"] >= 2, f"versions {s['versions']} < 2")
check(s["model"]["arch"] == "llama" and s["model"]["vocab_size"] == 49152, f"model {s['model']}")
check(s["warmup"]["steps"] >= 1, f"warm-up {s['warmup']}")
check(led["balanced"], f"ledger not balanced: {led}")
check(led["admitted"] == led["trained"] + led["dropped_stale"] + led["dropped_error"]
      + led["in_flight"], f"ledger does not add up: {led}")
check(led["trained"] >= 32, f"trained {led['trained']} < 32 episodes")
check(0 <= s["heldout_success_final"] <= 1, f"final {s['heldout_success_final']}")
rows = [json.loads(l) for l in open(os.path.join(run, "eval_final.jsonl"))]
check(len(rows) == 16, f"{len(rows)} answers in eval_final.jsonl, expected 16")
ok = sum(r["reward"] >= 0.5 for r in rows) / len(rows)
check(abs(ok - s["heldout_success_final"]) < 1e-9, f"eval_final.jsonl success {ok} != summary")
check(any(r["tool_calls"] > 0 for r in rows), "no held-out episode called the tool")
m = os.path.join(run, "model")
for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "generation_config.json"):
    check(os.path.isfile(os.path.join(m, f)), f"model/{f} missing")
cfg = json.load(open(os.path.join(m, "config.json")))
check(cfg["architectures"] == ["LlamaForCausalLM"], f"architectures {cfg['architectures']}")
tc = json.load(open(os.path.join(m, "tokenizer_config.json")))
check("<tool_call>" in tc["chat_template"] and tc["eos_token"] == "<|im_end|>", "tokenizer_config")
print(f"test_smollm2_rl: {s['versions']} versions, held-out {s['heldout_success_initial']:.3f}"
      f" -> {s['heldout_success_final']:.3f}, ledger balanced")
PY
if [ -n "${MANTA_PYTHON:-}" ]; then
    "$MANTA_PYTHON" "$src/tests/rl/check_hf_export.py" "$work/run" "$gguf"
else
    echo "test_smollm2_rl: MANTA_PYTHON not set; the transformers check of the folder is skipped"
fi
