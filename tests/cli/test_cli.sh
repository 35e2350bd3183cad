#!/usr/bin/env bash
# test_cli.sh MANTA USER_CLASS_SPEC USER_SERVICE_SPEC
# The `manta` command end to end on the embedded Redis: run with a run
# method, bad specs, and a detached service grown and shrunk with `scale`,
# read with `status` and `logs`, ended with `stop`; then nothing is left.
set -u
MANTA=$1 RUN_SPEC=$2 SERVICE_SPEC=$3
work=$(mktemp -d /tmp/manta-cli-test-XXXXXX)
export MANTA_STATE_DIR=$work/state
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    local what=$1; shift
    if "$@"; then echo "ok: $what"; else fail "$what"; fi
}
procs_of_job() { # processes whose environment names the job (waits up to 5 s for exits)
    local n t
    for t in $(seq 50); do
        n=0
        for e in /proc/[0-9]*/environ; do
            tr '\0' '\n' < "$e" 2>/dev/null | grep -qx "MANTA_JOB=$1" && n=$((n + 1))
        done
        [ $n -eq 0 ] && break
        sleep 0.1
    done
    echo $n
}

# 1. help and usage errors
check "--help exits 0" "$MANTA" --help
"$MANTA" frobnicate >/dev/null 2>&1; rc=$?
check "unknown command exits 2 (got $rc)" test $rc -eq 2
out=$("$MANTA" status --job x --redis redis://127.0.0.1:99999 2>&1); rc=$?
check "a bad --redis URL exits 2 (got $rc)" test $rc -eq 2
check "the error names the URL and the reason ($out)" grep -q "redis://127.0.0.1:99999.*port" <<<"$out"

# 2. a bad spec names file, line and column, exits 2
cat > $work/bad.yaml <<'YAML'
job: bad-spec
groups:
  w:
    class: squarer
    replicas: two
YAML
out=$("$MANTA" run $work/bad.yaml 2>&1); rc=$?
check "bad spec exits 2 (got $rc)" test $rc -eq 2
check "bad spec error names file:line:col ($out)" grep -q "bad.yaml:5:15: groups.w.replicas" <<<"$out"

# 3. run with a run method: the answer is printed, everything torn down
out=$("$MANTA" run --log-dir $work/runs "$RUN_SPEC" 2>$work/run.err); rc=$?
check "run exits 0 (got $rc; $(tail -2 $work/run.err))" test $rc -eq 0
check "run prints the job's answer ($out)" grep -q '"sum": 2666466670000, "failed": 0' <<<"$out"
check "no process of the job is left" test "$(procs_of_job user-class-demo)" -eq 0
first=$(readlink $work/runs/user-class-demo/logs/latest)
check "the actors' logs are kept in logs/RUN_ID ($first)" \
    test -f $work/runs/user-class-demo/logs/$first/squarer-0.log
check "the last line names the run folder ($out)" \
    grep -q "^run folder $work/runs/user-class-demo: .*logs/$first/" <<<"$(tail -1 <<<"$out")"

# 4. --set overrides reach the actors
out=$("$MANTA" run --log-dir $work/runs --set summer.settings.items=10 "$RUN_SPEC" 2>$work/set.err)
check "--set reaches init ($out $(tail -3 $work/set.err))" grep -q '"sum": 285,' <<<"$out"
second=$(readlink $work/runs/user-class-demo/logs/latest)
check "a second run has its own logs folder ($first, $second)" \
    test -n "$first" -a "$first" != "$second" -a -f $work/runs/user-class-demo/logs/$second/run.txt
check "each run keeps its own answer" \
    grep -q '"sum": 2666466670000' $work/runs/user-class-demo/logs/$first/summary.json
st=$("$MANTA" status $work/runs/user-class-demo); rc=$?
check "status RUN_DIR of a finished job exits 0 (got $rc)" test $rc -eq 0
check "status RUN_DIR lists both runs with their exit codes ($st)" \
    bash -c "grep -q 'runs: 2' <<<'$st' && grep -q '$first .*exit code 0' <<<'$st' && grep -q '$second .*exit code 0' <<<'$st'"
check "status RUN_DIR shows the answer and the actors' logs ($st)" \
    bash -c "grep -q '\"sum\": 285' <<<'$st' && grep -q 'squarer-0 .* lines' <<<'$st'"
st=$("$MANTA" status 2>&1); rc=$?
check "status after the job shows the last run (rc $rc: $st)" \
    bash -c "test $rc -eq 0 && grep -q 'user-class-demo is not running' <<<'$st' && grep -q 'runs: 2' <<<'$st'"

# 5. services the spec names are started first and stopped at the end
lib=$(awk '/library:/ {print $2; exit}' "$RUN_SPEC")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > $work/svc.yaml <<YAML
job: svc-demo
services:
  - {name: web, command: "exec python3 -u -m http.server $port --bind 127.0.0.1", port: $port}
groups:
  squarer: {class: squarer, library: $lib, replicas: 1, resources: {cpu: 0.1}}
  summer: {class: summer, library: $lib, resources: {cpu: 0.1}, settings: {workers: 1, items: 5}}
run: {group: summer, method: run, timeout_s: 60}
YAML
out=$("$MANTA" run --log-dir $work/runs $work/svc.yaml 2>$work/svc.err); rc=$?
check "run with a service exits 0 ($out $(tail -3 $work/svc.err))" test $rc -eq 0
check "the service was up during the job" grep -q "service web started" $work/svc.err
check "the service is stopped after the job" bash -c "! (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null"
python3 -m http.server $port --bind 127.0.0.1 >/dev/null 2>&1 &
squatter=$!
for t in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
"$MANTA" run --log-dir $work/runs $work/svc.yaml >/dev/null 2>$work/svc2.err; rc=$?
kill $squatter
check "a service port taken by a stranger is refused (rc $rc)" grep -q "already taken" $work/svc2.err
lg=$("$MANTA" logs web 2>&1); rc=$?
latest=$(readlink $work/runs/svc-demo/logs/latest)
check "logs after the job look in the last run, which started no service (rc $rc: $lg)" \
    bash -c "test $rc -eq 5 && grep -q 'svc-demo/logs/$latest/web.log' <<<'$lg'"
lg=$("$MANTA" logs web --run $work/runs/svc-demo/logs/$(ls $work/runs/svc-demo/logs | head -1) 2>&1)
check "logs --run RUN_DIR/logs/RUN_ID: that run's ($lg)" grep -q "Serving HTTP on 127.0.0.1 port $port" <<<"$lg"
st=$("$MANTA" status --run $work/runs/svc-demo)
check "status --run: the refused run's exit code ($st)" grep -q "runs: 2" <<<"$st"
check "... one ended with 0, the other not ($st)" \
    bash -c "grep -q 'exit code 0' <<<'$st' && grep -q 'exit code [1-9]' <<<'$st'"

# 6. a detached service: status, scale up and down, logs, stop
"$MANTA" run --detach --log-dir $work/runs "$SERVICE_SPEC" > $work/detach.out 2>&1; rc=$?
check "detached run exits 0 (got $rc: $(cat $work/detach.out))" test $rc -eq 0
st=$("$MANTA" status --job user-service-demo)
check "status shows 3/3 squarers" grep -q "squarer *ready 3/3" <<<"$st"
check "status shows the node with its heartbeat ($st)" grep -q "heartbeat [0-9.]* s ago" <<<"$st"
check "status shows the driver ($st)" grep -q "driver pid [0-9]*, up" <<<"$st"
check "scale up to 5" "$MANTA" scale squarer 5 --job user-service-demo
st=$("$MANTA" status --job user-service-demo -v)
check "status shows 5/5 ($st)" grep -q "squarer *ready 5/5" <<<"$st"
check "scale down to 1" "$MANTA" scale squarer 1 --job user-service-demo
st=$("$MANTA" status --job user-service-demo -v)
check "status shows 1/1" grep -q "squarer *ready 1/1" <<<"$st"
check "the drained replicas are gone" bash -c "! grep -q 'squarer-4' <<<'$st'"
"$MANTA" scale nosuchgroup 2 --job user-service-demo >/dev/null 2>&1; rc=$?
check "scale of an unknown group exits 5 (got $rc)" test $rc -eq 5
check "logs of an actor" "$MANTA" logs squarer-0 --job user-service-demo
check "stop" "$MANTA" stop --job user-service-demo
check "no process of the service is left" test "$(procs_of_job user-service-demo)" -eq 0
st=$("$MANTA" status --job user-service-demo 2>&1); rc=$?
check "status of a stopped job shows its run folder (rc $rc: $st)" \
    bash -c "test $rc -eq 0 && grep -q 'user-service-demo is not running' <<<'$st'"
"$MANTA" status --job never-ran >/dev/null 2>&1; rc=$?
check "status of a job never run here exits 5 (got $rc)" test $rc -eq 5
check "logs after stop" "$MANTA" logs squarer-0 --job user-service-demo

rm -rf "$work"
echo "$fails failure(s)"
test $fails -eq 0
