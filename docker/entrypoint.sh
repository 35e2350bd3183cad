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

# redis-cli -u sends `AUTH "" password` for redis://:password@host, which
# Redis 7 refuses, so split the URL here: [[user]:password@]host[:port][/db].
# The password goes through REDISCLI_AUTH, not the command line; %XX
# escapes are not decoded (use a URL-safe password).
redis_ping() {
    rest=${1#redis://}
    auth=
    case "$rest" in *@*) auth=${rest%@*} rest=${rest##*@} ;; esac
    hostport=${rest%%/*}
    case "$auth" in
    *:*) user=${auth%%:*} pass=${auth#*:} ;;
    *) user=$auth pass= ;;
    esac
    case "$hostport" in
    \[*\]:*) host=${hostport%]:*} host=${host#[} port=${hostport##*]:} ;;
    \[*\]) host=${hostport#[} host=${host%]} port=6379 ;;
    *:*) host=${hostport%:*} port=${hostport##*:} ;;
    *) host=$hostport port=6379 ;;
    esac
    if [ -n "$user" ]; then
        REDISCLI_AUTH=$pass redis-cli -h "$host" -p "$port" --user "$user" ping
    elif [ -n "$pass" ]; then
        REDISCLI_AUTH=$pass redis-cli -h "$host" -p "$port" ping
    else
        redis-cli -h "$host" -p "$port" ping
    fi
}

wait_s="${MANTA_WAIT_REDIS:-60}"
case "$url" in
redis://*)
    if [ "$wait_s" -gt 0 ]; then
        i=0
        until redis_ping "$url" 2>/dev/null | grep -q PONG; do
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
