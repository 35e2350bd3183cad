#!/usr/bin/env bash
# Run: tests/bench/soak_job.sh [SECONDS] [ROLLOUTS] [--set KEY=VALUE]... > figures.jsonl
#      (from the repository root)
#
# The job soak of issue 12 item 6: the calculator job (examples/calc_agent.yaml)
# through `build/manta run` for SECONDS (default 600) with ROLLOUTS rollout
# replicas (default 8), never stopping early (stop_at above any success,
# max_versions out of reach), while build/tests/bench/bench_soak --job samples
# the RSS of every process under `manta run` (the CLI driver, redis-server, the
# node agent, every actor, the tool server) every 10 s. Further `--set`s go to
# `manta run` after the soak's own (e.g. --set rl.dynamic_sampling=false, so
# that a policy that already solves every problem keeps making versions). stdout: the JSON
# figures; stderr: progress and the per-process table; exit 1 when a process
# grew more than MAX_GROWTH_KB (default 8192) after the warm-up point (60 s and
# 100 versions) or the job failed.
#
# Environment: MANTA (default build/manta), BENCH_SOAK (default
# build/tests/bench/bench_soak), OUT (default runs/soak-job: samples.jsonl and
# the run's folder), MAX_GROWTH_KB, WARM_S, WARM_VERSIONS.
set -euo pipefail
secs=${1:-600}
rollouts=${2:-8}
shift $(($# < 2 ? $# : 2))
manta=${MANTA:-build/manta}
bench=${BENCH_SOAK:-build/tests/bench/bench_soak}
out=${OUT:-runs/soak-job}
for f in "$manta" "$bench" examples/calc_agent.yaml; do
    [ -e "$f" ] || { echo "soak_job.sh: $f not found (run from the repository root after a build)" >&2; exit 2; }
done
# A free port for the tool server, so a calculator job running beside this
# one (port 8000) is not disturbed.
port=
for _ in $(seq 50); do
    p=$((20000 + RANDOM % 20000))
    if ! ss -ltn 2>/dev/null | awk '{print $4}' | grep -q ":$p\$"; then port=$p; break; fi
done
[ -n "$port" ] || { echo "soak_job.sh: no free port found" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out"
job="soak-$$"
echo "soak_job.sh: job $job, $secs s, $rollouts rollouts, tool server on port $port, samples in $out/samples.jsonl" >&2
# The run's own timeout (run.timeout_s) leaves room for the final evaluation.
exec "$bench" --job "$out/samples.jsonl" --metrics "$out/run/metrics.jsonl" \
    --warm-s "${WARM_S:-60}" --warm-versions "${WARM_VERSIONS:-100}" --every-s 10 \
    --max-growth-kb "${MAX_GROWTH_KB:-8192}" -- \
    "$manta" run examples/calc_agent.yaml \
    --set "job=$job" \
    --set "rl.run_dir=$out/run" \
    --set "rollout.replicas=$rollouts" \
    --set "rl.max_time_s=$secs" \
    --set "rl.max_versions=1000000000" \
    --set "rl.stop_at=2" \
    --set "run.timeout_s=$((secs + 600))" \
    --set "services.0.command=python3 examples/calc_server.py --port $port" \
    --set "services.0.port=$port" \
    --set "tools.0.url=http://127.0.0.1:$port/mcp" \
    "$@"
