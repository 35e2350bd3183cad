#!/usr/bin/env bash
# test_state_dir.sh MANTA
# The CLI's state folder (MANTA_STATE_DIR, else /tmp/manta-state-UID) holds
# each running job's Redis URL, password included, and its driver's pid,
# which `manta stop` signals. A folder that is not this user's own (made
# first by another local user, or with group/other access) is refused, not
# read or written, and state files are not followed through links:
#   1. a folder owned by another user, holding a planted job file whose
#      "driver" pid is a bystander: `manta stop` refuses and the bystander
#      lives (before the check it was sent SIGTERM);
#   2. a folder of ours with mode 0755: refused, naming the mode;
#   3. a `current` file that is a symbolic link: not followed.
set -u
MANTA=$1
work=$(mktemp -d /tmp/manta-state-test-XXXXXX)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    local what=$1; shift
    if "$@"; then echo "ok: $what"; else fail "$what"; fi
}
sleep 60 & bystander=$!
plant() { # plant DIR: a job file naming the bystander as its driver
    printf 'job=victim\nredis=redis://127.0.0.1:1\nrun_dir=/tmp\npid=%d\n' $bystander > "$1/victim.job"
    echo victim > "$1/current"
}

# 1. another user's folder (needs root to make one; else skipped)
if [ "$(id -u)" -eq 0 ]; then
    mkdir -m 700 $work/other && plant $work/other && chown -R 65534 $work/other
    out=$(MANTA_STATE_DIR=$work/other "$MANTA" stop --job victim 2>&1); rc=$?
    check "stop in another user's state folder fails (rc $rc)" test $rc -ne 0
    check "the message names the folder and its owner ($out)" \
        grep -q "state folder $work/other.*owned by uid 65534" <<<"$out"
    check "the planted pid was not signalled" kill -0 $bystander
else
    echo "skip: not root, cannot make another user's folder"
fi

# 2. our folder, open to others
mkdir -m 755 $work/open && plant $work/open && chmod 755 $work/open
out=$(MANTA_STATE_DIR=$work/open "$MANTA" stop 2>&1); rc=$?
check "stop in a 0755 state folder fails (rc $rc)" test $rc -ne 0
check "the message names the mode ($out)" grep -q "state folder $work/open.*mode 0755" <<<"$out"
check "the planted pid was not signalled" kill -0 $bystander

# 3. a private folder whose files are links to planted ones elsewhere
mkdir -m 700 $work/real $work/link && plant $work/real
ln -s $work/real/current $work/link/current
ln -s $work/real/victim.job $work/link/victim.job
out=$(MANTA_STATE_DIR=$work/link "$MANTA" stop 2>&1); rc=$?
check "stop through a linked current file fails (rc $rc: $out)" test $rc -ne 0
out=$(MANTA_STATE_DIR=$work/link "$MANTA" stop --job victim 2>&1); rc=$?
check "stop through a linked job file fails (rc $rc: $out)" test $rc -ne 0
check "the planted pid was not signalled" kill -0 $bystander

kill $bystander 2>/dev/null; wait $bystander 2>/dev/null
rm -rf $work
[ $fails -eq 0 ] && echo "all ok" || echo "$fails failed"
exit $((fails > 0))
