#!/usr/bin/env bash
# test_netns.sh MANTA SERVICE_SPEC
# Three "machines" on this one: network namespaces joined by a bridge. A
# redis-server and the head (`manta run`) live in the first; `manta node`
# agents in the other two. The graph is placed across them by resources,
# scaled 1 -> 6 -> 2, then one node is killed and its actor comes back on
# another. Skips (exit 77) where namespaces cannot be made (not root, no
# ip netns).
set -u
MANTA=$1 SPEC=$2
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root for ip netns"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
tag=mt$$
br=br$tag
ns=(${tag}a ${tag}b ${tag}c)
addr=(10.77.0.1 10.77.0.2 10.77.0.3)
work=$(mktemp -d /tmp/manta-netns-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for n in "${ns[@]}"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$n" 2>/dev/null
    done
    ip link del "$br" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
if ! ip link add "$br" type bridge 2>/dev/null; then
    echo "SKIP: cannot create a bridge here (no CAP_NET_ADMIN?)"; exit 77
fi
ip link set "$br" up
for i in 0 1 2; do
    n=${ns[$i]}
    ip netns add "$n" || { echo "SKIP: cannot create network namespaces"; exit 77; }
    ip link add v${tag}$i type veth peer name p${tag}$i
    ip link set p${tag}$i master "$br" up
    ip link set v${tag}$i netns "$n"
    ip -n "$n" addr add ${addr[$i]}/24 dev v${tag}$i
    ip -n "$n" link set v${tag}$i up
    ip -n "$n" link set lo up
done
in_ns() { local i=$1; shift; ip netns exec "${ns[$i]}" "$@"; }

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

pw=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
in_ns 0 redis-server --port 6390 --bind ${addr[0]} --requirepass "$pw" --save '' \
    --appendonly no --dir "$work" --logfile "$work/redis.log" &
pids+=($!)
url="redis://:$pw@${addr[0]}:6390"
job=netns-demo
for t in $(seq 50); do
    in_ns 0 redis-cli -h ${addr[0]} -p 6390 --no-auth-warning -a "$pw" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
done
in_ns 1 redis-cli -h ${addr[0]} -p 6390 --no-auth-warning -a "$pw" ping 2>/dev/null | grep -q PONG \
    && ok "the namespaces reach each other" || { echo "FAIL: namespaces cannot reach each other"; exit 1; }
export MANTA_STATE_DIR=$work/state MANTA_NODE_TIMEOUT_MS=3000
# The job's machines share one CURVE key file, given by path (tcp jobs admit no one without it).
"$MANTA" keys new "$work/job.key" > /dev/null || { echo "FAIL: manta keys new"; exit 1; }
export MANTA_KEYS=$work/job.key
# ... and load actor classes only from the libraries named at their start.
export MANTA_LIBRARIES=$(awk '$1 == "library:" {print $2; exit}' "$SPEC")
# Two worker nodes with 3 CPUs each; the head offers 1.
for i in 1 2; do
    in_ns $i "$MANTA" node --redis "$url" --job $job --host ${addr[$i]} --cpu 3 \
        --name n$((i + 1)) > "$work/node$i.log" 2>&1 &
    pids+=($!)
done
for t in $(seq 100); do
    n=$(in_ns 0 redis-cli -h ${addr[0]} -p 6390 --no-auth-warning -a "$pw" scard manta:$job:nodes)
    [ "$n" = 2 ] && break
    sleep 0.1
done
[ "$n" = 2 ] && ok "two worker nodes registered" || fail "worker nodes did not register ($n)"

in_ns 0 env MANTA_NODE_CPU=1 "$MANTA" run --detach --transport tcp --host ${addr[0]} \
    --redis "$url" --log-dir "$work/runs" --set job=$job --set squarer.replicas=1 \
    --set squarer.resources.cpu=1 --set summer.replicas=0 "$SPEC" > "$work/run.log" 2>&1 \
    && ok "detached run" || { fail "run: $(cat $work/run.log)"; exit 1; }
where() { # where ACTOR -> node id
    in_ns 0 "$MANTA" status --job $job -v | awk -v a="$1" '$1 == a && $3 == "node" {print $4}'
}
st() { in_ns 0 "$MANTA" status --job $job -v; }

in_ns 0 "$MANTA" scale squarer 6 --job $job > "$work/scale.log" 2>&1 \
    && ok "scale 1 -> 6" || fail "scale 1 -> 6: $(cat $work/scale.log)"
s=$(st)
grep -q "squarer *ready 6/6" <<<"$s" && ok "6/6 ready" || fail "not 6/6: $s"
for n in n2 n3; do
    grep -q "node $n " <<<"$s" && ok "actors placed on $n" || fail "nothing on $n: $s"
done
in_ns 0 "$MANTA" scale squarer 2 --job $job > "$work/scale.log" 2>&1 \
    && ok "scale 6 -> 2" || fail "scale 6 -> 2: $(cat $work/scale.log)"
s=$(st)
grep -q "squarer *ready 2/2" <<<"$s" && ok "2/2 ready" || fail "not 2/2: $s"
rc() { in_ns 0 redis-cli -h ${addr[0]} -p 6390 --no-auth-warning -a "$pw" "$@"; }
ep=$(rc hget manta:$job:actor:squarer-1 endpoint)
lep=$(rc hget manta:$job:actor:squarer-1 endpoint_local)
[[ $ep == tcp://10.77.0.* && $lep == ipc://* ]] && ok "actors offer tcp to other nodes and ipc to their own machine ($ep, $lep)" \
    || fail "endpoints '$ep' '$lep'"
victim_node=$(where squarer-1)
[ "$victim_node" = n2 ] && ok "squarer-1 is on n2" || fail "squarer-1 on '$victim_node', wanted n2: $s"

# Kill node n2 and everything it runs (as a machine would die).
in_ns 1 true
ip netns pids ${ns[1]} | xargs -r kill -9
for t in $(seq 150); do
    now=$(where squarer-1)
    s=$(st)
    if [ "$now" = n3 ] && grep -q "squarer *ready 2/2" <<<"$s" && ! grep -q "^  n2 " <<<"$s"; then
        break
    fi
    sleep 0.1
done
[ "$now" = n3 ] && ok "squarer-1 restarted on n3 after n2 died" || fail "squarer-1 on '$now': $s"
grep -q "squarer *ready 2/2" <<<"$s" && ok "2/2 ready again" || fail "not 2/2 after the node died: $s"
grep -q "^  n2 " <<<"$s" && fail "dead node n2 still listed: $s" || ok "n2 no longer listed"

in_ns 0 "$MANTA" stop --job $job > /dev/null && ok "stop" || fail "stop"
# The agents delete their keys as they go: wait (up to 10 s) for none to be left.
for t in $(seq 100); do
    left=$(in_ns 0 redis-cli -h ${addr[0]} -p 6390 --no-auth-warning -a "$pw" --scan --pattern "manta:$job:*" | wc -l)
    [ "$left" = 0 ] && break
    sleep 0.1
done
[ "$left" = 0 ] && ok "no key left" || fail "$left keys left"
echo "$fails failure(s)"
test $fails -eq 0
