#!/usr/bin/env python3
# python3 examples/warehouse/gen.py [--seed 1] [--out examples/warehouse]
"""Generate the warehouse task: "where is ab417?", answered with the shelf
("C4-19") after two tool calls, the item's SKU and then that SKU's shelf.
Both are keyed hashes (examples/warehouse_server.py, whose functions this
script imports), so neither can be guessed: the policy has to copy the item
code into the first call, the first answer into the second call, and the
second answer out.

Writes, as JSON lines:
  train.jsonl    {"prompt": "where is ab417?", "answer": "C4-19"}  (2000)
  heldout.jsonl  the same form, 200 items disjoint from train
  demos.jsonl    64 demonstrations for the supervised warm-up, training
                 items chosen so that every symbol the policy must copy
                 appears in them at every position (each letter as an item
                 code's first and second letter, each digit in each of the
                 three places), the rest in order (see demo_items):
                 {"prompt", "segments": [["policy", "<call>sku:ab417</call>"],
                  ["tool", "QX7M"], ["policy", "<call>shelf:QX7M</call>"],
                  ["tool", "C4-19"], ["policy", "C4-19"]]}
`sku:` and `shelf:` name the tool (the spec's `tools:` entries); <call> and
</call> stand for the tool-call tokens.
"""
import argparse
import json
import os
import random
import string
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from warehouse_server import shelf, sku  # noqa: E402  (the ground truth)


def demo_items(train, n):
    """n training rows for the demonstrations: first, in order, each row
    that shows a symbol at a position no row chosen so far shows (an item
    code's letters and digits, a SKU's characters, a shelf's), then the
    first rows not chosen. RL cannot learn to write what the policy never
    samples: with the first 64 rows, no item code had a "c", and the policy
    copied "cd954" as "zd954" after any amount of RL (held-out success
    stayed at 0.91)."""
    kinds = (("item", "item"), ("sku", "sku"), ("shelf", "answer"))
    seen, chosen = set(), []
    for kind, key in kinds:  # the prompt's symbols first: they are copied twice
        for r in train:
            new = {(kind, i, ch) for i, ch in enumerate(r[key])} - seen
            if new and len(chosen) < n and all(r is not c for c in chosen):
                chosen.append(r)
                for k, q in kinds:
                    seen |= {(k, i, ch) for i, ch in enumerate(r[q])}
    chosen += [r for r in train if all(r is not c for c in chosen)][: n - len(chosen)]
    return chosen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--demos", type=int, default=64)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    seen, rows = set(), []
    while len(rows) < args.train + args.heldout:
        item = "".join(rng.choice(string.ascii_lowercase) for _ in range(2))
        item += "%03d" % rng.randint(0, 999)
        if item in seen:
            continue
        seen.add(item)
        unit = sku(item)
        rows.append({"item": item, "sku": unit, "answer": shelf(unit)})
    train, held = rows[: args.train], rows[args.train :]
    for name, part in (("train.jsonl", train), ("heldout.jsonl", held)):
        with open(os.path.join(args.out, name), "w") as f:
            for r in part:
                f.write(json.dumps({"prompt": "where is %s?" % r["item"],
                                    "answer": r["answer"]}) + "\n")
    with open(os.path.join(args.out, "demos.jsonl"), "w") as f:
        for r in demo_items(train, args.demos):
            segs = [["policy", "<call>sku:%s</call>" % r["item"]], ["tool", r["sku"]],
                    ["policy", "<call>shelf:%s</call>" % r["sku"]], ["tool", r["answer"]],
                    ["policy", r["answer"]]]
            f.write(json.dumps({"prompt": "where is %s?" % r["item"], "segments": segs}) + "\n")


if __name__ == "__main__":
    main()
