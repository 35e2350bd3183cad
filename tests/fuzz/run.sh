#!/usr/bin/env bash
# run.sh HARNESS CORPUS_DIR -- one bounded libFuzzer run, as ctest's
# fuzz.<harness> tests do: MANTA_FUZZ_SECONDS (default 30) of fuzzing on a
# copy of CORPUS_DIR in a temporary folder (the repository is never written),
# with -rss_limit_mb=2048. Exits non-zero on a crash, a sanitizer report, a
# leak, a timeout (10 s per input) or an out-of-memory; the reproducer is then
# kept in ./fuzz-artifacts/ (ctest's working folder: build/tests/fuzz) and its
# path printed. Extra arguments after CORPUS_DIR go to libFuzzer.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 HARNESS CORPUS_DIR [LIBFUZZER_FLAGS...]" >&2
    exit 2
fi
harness=$1 corpus=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
name=$(basename "$harness")
[ -x "$harness" ] || { echo "run.sh: $harness: no such executable (build the fuzz harnesses)" >&2; exit 2; }
[ -d "$corpus" ] || { echo "run.sh: $corpus: no such corpus folder" >&2; exit 2; }
seconds=${MANTA_FUZZ_SECONDS:-30}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/manta-$name.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/corpus" "$tmp/artifacts"
cp -R "$corpus"/. "$tmp/corpus/"

# Known leaks with a reproducer in crashes/ (see lsan.supp); the caller's
# ASan/UBSan options (the CI's log_path) are kept.
# print_suppressions=0: the "Suppressions used" table would otherwise land in
# the CI's sanitizer log folder, which fails the run.
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1:suppressions=$here/ubsan.supp"

rc=0
"$harness" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$tmp/artifacts/" "$@" "$tmp/corpus" > "$tmp/log" 2>&1 || rc=$?
grep -E '^stat::|^Done|cov:' "$tmp/log" | tail -n 12 || true
if [ $rc -ne 0 ] || [ -n "$(ls -A "$tmp/artifacts")" ]; then
    tail -n 80 "$tmp/log"
    mkdir -p fuzz-artifacts
    for f in "$tmp/artifacts"/*; do
        [ -e "$f" ] || continue
        cp "$f" "fuzz-artifacts/$name-$(basename "$f")"
        echo "run.sh: $name: reproducer kept in $PWD/fuzz-artifacts/$name-$(basename "$f")" \
             "(run: $harness FILE)"
    done
    echo "run.sh: $name failed (exit $rc)"
    [ $rc -ne 0 ] || rc=1
    exit $rc
fi
echo "run.sh: $name: ${seconds} s, no crash, no sanitizer report"
