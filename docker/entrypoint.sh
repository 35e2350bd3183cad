#!/bin/sh
# manta-entrypoint -- the image's entrypoint. Before running its arguments:
#   1. MANTA_HOST: the address this container's actors bind and advertise
#      for tcp://, default its own IP (127.0.0.1 would not be reachable from
#      the other containers); MANTA_TRANSPORT defaults to tcp.
#   2. When a Redis address is given (--redis URL, --redis=URL, or
#      MANTA_REDIS), waits until it answers PING, for up to
#      MANTA_WAIT_REDIS seconds (default 60; 0 = do not wait), so that
#      `docker compose up` does not race Redis's start-up.
# Then it execs the command, which keeps its PID and gets signals directly.
set -eu

if [ -z "${MANTA_HOST:-}" ]; then
    MANTA_HOST=$(hostname -i 2>/dev/null | awk '{print $1}')
    [ -n "$MANTA_HOST" ] || MANTA_HOST=127.0.0.1
fi
export MANTA_HOST
export MANTA_TRANSPORT="${MANTA_TRANSPORT:-tcp}"

url="${MANTA_REDIS:-}"
prev=
for a in "$@"; do
    case "$a" in
    --redis=*) url=${a#--redis=} ;;
    *) [ "$prev" = --redis ] && url=$a ;;
    esac
    prev=$a
done

wait_s="${MANTA_WAIT_REDIS:-60}"
case "$url" in
redis://*)
    if [ "$wait_s" -gt 0 ]; then
        i=0
        until redis-cli --no-auth-warning -u "$url" ping 2>/dev/null | grep -q PONG; do
            i=$((i + 1))
            if [ "$i" -ge "$wait_s" ]; then
                # The URL holds the password: say where, not what.
                echo "manta-entrypoint: Redis did not answer PING within ${wait_s}s" >&2
                exit 1
            fi
            sleep 1
        done
    fi
    ;;
esac

if [ $# -eq 0 ]; then
    set -- manta --help
fi
exec "$@"
