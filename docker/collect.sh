#!/bin/sh
# collect.sh BUILD OUT -- gather what the runtime image needs from a CMake
# build tree: OUT/bin/manta (the CLI), OUT/examples/bin/* (built examples)
# and OUT/lib/*.so (shared libraries of actor classes, for `library:` in
# specs). Used by docker/Dockerfile; runs the same on a developer machine.
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR OUT_DIR" >&2
    exit 2
fi
build=$1
out=$2
mkdir -p "$out/bin" "$out/examples/bin" "$out/lib"

# The CLI: an executable named manta anywhere in the tree (its folder is
# the CLI owners' choice), never the compiler checks under CMakeFiles/.
manta=$(find "$build" -path '*/CMakeFiles' -prune -o -type f -name manta -perm -u+x -print | head -n 1)
if [ -z "$manta" ]; then
    echo "collect.sh: no executable named 'manta' under $build; is the CLI target built?" >&2
    exit 1
fi
cp "$manta" "$out/bin/manta"

# Built examples: the executables directly in BUILD/examples.
if [ -d "$build/examples" ]; then
    find "$build/examples" -maxdepth 1 -type f -perm -u+x -exec cp {} "$out/examples/bin/" \;
fi

# Shared libraries built anywhere (user actor classes for `library:`).
find "$build" -path '*/CMakeFiles' -prune -o -type f -name '*.so' -print \
    | while read -r so; do cp "$so" "$out/lib/"; done

count() { find "$1" -mindepth 1 -maxdepth 1 -type f | wc -l; }
echo "collect.sh: $(count "$out/bin") cli, $(count "$out/examples/bin") examples," \
     "$(count "$out/lib") libraries -> $out"
