#!/usr/bin/env python3
"""Writes the SmolLM2 agent's task: arithmetic word problems that need the
calculator (a product, then a sum or difference), and demonstrations of the
tool call on plain products only.

  train.jsonl    2000 word problems   {"prompt", "answer"}
  heldout.jsonl   200 word problems   (numbers never seen in train)
  demos.jsonl      32 products only   "What is 237*82?" and the three word
                                     problems that are a plain product ->
                                     call, result, answer

The warm-up on the demonstrations teaches the call format (the pretrained
model never calls a tool by itself: 0 calls in 64 samples) and how to pull a
product out of a sentence; the sums and differences (four templates of
seven) are never demonstrated: those are left to RL.
Deterministic; run from the repository root:  python3 examples/smollm2/gen.py
"""
import json
import os
import random

DST = os.path.dirname(os.path.abspath(__file__))

# (question, expression) templates: a, b are the product's factors, c is
# added or taken away.
TEMPLATES = [
    ("A box holds {b} pencils. How many pencils are in {a} boxes?", "{a}*{b}"),
    ("Each of {a} buses carries {b} people. How many people ride in all?", "{a}*{b}"),
    ("A farm has {a} rows of {b} trees. How many trees are there?", "{a}*{b}"),
    ("What is {a} times {b}, plus {c}?", "{a}*{b}+{c}"),
    ("What is {a} times {b}, minus {c}?", "{a}*{b}-{c}"),
    ("A shop sells {a} bags of {b} apples and {c} loose apples. How many apples does it sell?",
     "{a}*{b}+{c}"),
    ("A printer makes {b} pages a minute for {a} minutes; {c} pages jam. How many good pages?",
     "{a}*{b}-{c}"),
]


def problem(rng, seen):
    while True:
        a, b, c = rng.randint(100, 999), rng.randint(11, 99), rng.randint(10, 999)
        if (a, b, c) not in seen:
            seen.add((a, b, c))
            break
    q, e = rng.choice(TEMPLATES)
    expr = e.format(a=a, b=b, c=c)
    return {"prompt": q.format(a=a, b=b, c=c), "answer": str(eval(expr))}


def main():
    rng = random.Random(20261201)
    seen = set()
    train = [problem(rng, seen) for _ in range(2000)]
    heldout = [problem(rng, seen) for _ in range(200)]
    demos = []
    for i in range(32):  # plain products and the product-only word problems
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        r = str(a * b)
        q = f"What is {a}*{b}?" if i % 4 == 0 else TEMPLATES[i % 3][0].format(a=a, b=b)
        demos.append({"prompt": q,
                      "segments": [["policy", f"<call>{a}*{b}</call>"], ["tool", r],
                                   ["policy", r]]})
    for name, rows in (("train", train), ("heldout", heldout), ("demos", demos)):
        with open(os.path.join(DST, name + ".jsonl"), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
