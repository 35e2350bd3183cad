#!/usr/bin/env python3
"""Baseline for bench_tok: tokenizers (Rust) encode speed, one thread.

    bench_tok.py TOKENIZER_JSON DOCS_BIN REPS

DOCS_BIN holds documents as "<len>\\n<bytes>\\n" records (valid UTF-8).  Each
pass encodes every document with Tokenizer.encode(doc, add_special_tokens=
False), one call per document, never encode_batch; TOKENIZERS_PARALLELISM
and RAYON_NUM_THREADS are set by the caller to keep Rust on one thread.  One
warm-up pass (it fills tokenizers' word cache, as the C side's is filled),
then the best of REPS passes.  Prints one JSON object: seconds, bytes,
n_ids and the sum of all ids (the C side checks both).  Exits 77 when
tokenizers is not installed.
"""
import json
import sys
import time

try:
    from tokenizers import Tokenizer
except ImportError:
    print("tokenizers is not installed", file=sys.stderr)
    sys.exit(77)


def read_docs(path):
    data = open(path, "rb").read()
    docs, i = [], 0
    while i < len(data):
        nl = data.index(b"\n", i)
        n = int(data[i:nl])
        docs.append(data[nl + 1:nl + 1 + n].decode("utf-8"))
        i = nl + 1 + n + 1
    return docs


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    docs = read_docs(sys.argv[2])
    reps = int(sys.argv[3])
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    encs = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    n_ids = sum(len(e) for e in encs)
    id_sum = sum(sum(e) for e in encs)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for d in docs:
            tok.encode(d, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"seconds": best, "bytes": nbytes, "n_ids": n_ids, "id_sum": id_sum}))


if __name__ == "__main__":
    main()
