#!/usr/bin/env python3
"""Writes safetensors-deep-nesting.safetensors (4 MB, so not committed): a
header whose __metadata__ value nests 2,000,000 arrays. kernels/safetensors.c
skip() (line 137) recurses once per level with no depth limit:
fuzz_safetensors reports an ASan stack-overflow in skip, and a plain build
gets SIGSEGV (issue 12, "Bad input").

    python3 safetensors-deep-nesting.py OUT_DIR && \
        build/tests/fuzz/harness/fuzz_safetensors OUT_DIR/safetensors-deep-nesting.safetensors
"""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "."
depth = 2_000_000
header = b'{"__metadata__":' + b"[" * depth + b"]" * depth + b"}"
with open(os.path.join(out, "safetensors-deep-nesting.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header)
