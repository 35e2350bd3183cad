#!/usr/bin/env bash
# test_install.sh BUILD_DIR SOURCE_DIR [CFLAGS] -- install Manta into a temporary
# prefix, build examples/01_ping_pong.c against it with nothing but
# pkg-config, run it (embedded redis-server), and check that a program that
# only makes actors links neither curl nor libyaml.
set -euo pipefail
build=$1 src=$2 extra=${3:-}
tmp=$(mktemp -d /tmp/manta-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
export PKG_CONFIG_PATH=$tmp/prefix/lib/pkgconfig
for pc in manta manta-http manta-spec manta-collective manta-job manta-kernels manta-tok; do
    pkg-config --exists "$pc" || { echo "FAIL: pkg-config does not know $pc"; exit 1; }
done
# shellcheck disable=SC2046
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror $extra -o "$tmp/ping" "$src/examples/01_ping_pong.c" \
    $(pkg-config --cflags --libs manta)
if ldd "$tmp/ping" | grep -E 'libcurl|libyaml'; then
    echo "FAIL: an actor-only program links curl or libyaml"
    exit 1
fi
# Every other library links through its .pc file alone.
cat > "$tmp/all.c" <<'C'
#include <manta_job.h>
#include <manta_http.h>
#include <manta_collective.h>
#include <manta_kernels.h>
#include <manta_tok.h>
#include <stdio.h>
int main(void)
{
    manta_job_free(NULL);
    printf("%s|%s|%s\n", manta_strerror(MANTA_ETIMEDOUT), mk_strerror(0), mtok_strerror(0));
    return 0;
}
C
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Werror $extra -o "$tmp/all" "$tmp/all.c" \
    $(pkg-config --cflags --libs manta-job manta-http manta-collective manta-kernels manta-tok)
"$tmp/all" > /dev/null || { echo "FAIL: the program linked against every library did not run"; exit 1; }
out=$(timeout 60 "$tmp/ping")
echo "$out"
grep -q "pong" <<< "$out" || { echo "FAIL: the installed example did not answer"; exit 1; }
test -x "$tmp/prefix/bin/manta" || { echo "FAIL: the manta command was not installed"; exit 1; }
echo "PASS: installed, linked through pkg-config, ran"
