#!/usr/bin/env python3
# python3 examples/calc/gen.py [--seed 1] [--out examples/calc]
"""Generate the calculator task: multiplication problems a tiny byte-level
model cannot do in its head, so the answer has to come from the tool.

Writes, as JSON lines:
  train.jsonl    {"prompt": "347*29=?", "answer": "10063"}   (2000 problems)
  heldout.jsonl  the same form, 200 problems disjoint from train
  demos.jsonl    64 demonstrations for the supervised warm-up:
                 {"prompt", "segments": [["policy", "<call>347*29</call>"],
                  ["tool", "10063"], ["policy", "10063"]]}
In policy text, <call> and </call> stand for the tool-call tokens; the
controller turns them into RL_TOK_CALL / RL_TOK_END and ends the last policy
segment with EOS. Tool text is what the calc server answers.
"""
import argparse
import json
import os
import random


def problem(rng):
    # 3-digit times 2-digit with a 5-digit product: the prompt, the tool call
    # and the answer have fixed widths, so a tiny model learns the copying
    # fast; the product itself is out of its reach without the tool.
    while True:
        a = rng.randint(100, 999)
        b = rng.randint(10, 99)
        if a * b >= 10000:
            return f"{a}*{b}", str(a * b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--demos", type=int, default=64)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    seen = set()
    rows = []
    while len(rows) < args.train + args.heldout:
        expr, ans = problem(rng)
        if expr in seen:
            continue
        seen.add(expr)
        rows.append({"prompt": f"{expr}=?", "answer": ans, "expr": expr})
    train, held = rows[: args.train], rows[args.train :]
    with open(os.path.join(args.out, "train.jsonl"), "w") as f:
        for r in train:
            f.write(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n")
    with open(os.path.join(args.out, "heldout.jsonl"), "w") as f:
        for r in held:
            f.write(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n")
    with open(os.path.join(args.out, "demos.jsonl"), "w") as f:
        for r in train[: args.demos]:
            segs = [["policy", f"<call>{r['expr']}</call>"], ["tool", r["answer"]],
                    ["policy", r["answer"]]]
            f.write(json.dumps({"prompt": r["prompt"], "segments": segs}) + "\n")


if __name__ == "__main__":
    main()
