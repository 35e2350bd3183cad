#!/usr/bin/env python3
"""Writes the SmolLM2 agent's task: arithmetic word problems that need the
calculator (seven stories: three are a product, four a product and then a
sum or a difference), and demonstrations of the tool call on other problems.

  train.jsonl    2000 word problems   {"prompt", "answer"}
  heldout.jsonl   200 word problems   (numbers never seen in train)
  demos.jsonl      48 demonstrations  call, result, answer:
                   24 bare expressions "What is 237*82?", "What is
                      237*82+415?", "What is 237*82-415?" (every symbol a
                      call writes: digits, *, + and -);
                   24 stories in five wordings of their own, none of
                      them a template of the task: four products, and
                      one difference ("... sells 415 rolls. How many
                      rolls are left?", 4 demonstrations).

The warm-up on the demonstrations teaches the call format (the pretrained
model never calls a tool by itself: 0 calls in 64 samples), that a call
holds the whole calculation, and how to pull a product out of a sentence.
No demonstration is a task template: writing "824*26+491" for the shop's
loose apples, or "96*222-436" for the jammed pages, is left to RL (a first
run with product stories only learnt every sum, 0.1-0.3 -> 1.0, and no
difference: it never sampled a "-" in a story, so those groups never had
a reward to learn from; the baker's rolls give it that prior).
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
    ("A shop sells {a} bags of {b} apples and {c} loose apples. How many apples does it sell?",
     "{a}*{b}+{c}"),
    ("A printer makes {b} pages a minute for {a} minutes; {c} pages jam. How many good pages?",
     "{a}*{b}-{c}"),
    ("A hotel has {a} floors of {b} rooms, and {c} rooms are booked. How many rooms are free?",
     "{a}*{b}-{c}"),
    ("A club buys {a} packs of {b} cards and is given {c} more cards. How many cards does it "
     "have?", "{a}*{b}+{c}"),
]

# Demonstrations' own stories: none is a task template; four products and
# one difference.
DEMO_STORIES = [
    ("A crate holds {b} bottles. How many bottles fill {a} crates?", "{a}*{b}"),
    ("A cinema has {a} rows with {b} seats each. How many seats does it have?", "{a}*{b}"),
    ("Each of {a} students reads {b} pages. How many pages do they read?", "{a}*{b}"),
    ("A train runs {b} km an hour for {a} hours. How far does it go?", "{a}*{b}"),
    ("A baker makes {a} trays of {b} rolls and sells {c} rolls. How many rolls are left?",
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
    for i in range(48):
        a, b, c = rng.randint(100, 999), rng.randint(11, 99), rng.randint(10, 999)
        if i % 2 == 0:  # bare expressions: *, + and -
            expr = (f"{a}*{b}", f"{a}*{b}+{c}", f"{a}*{b}-{c}")[(i // 2) % 3]
            q = f"What is {expr}?"
        else:  # stories the task never asks
            q, e = DEMO_STORIES[(i // 2) % len(DEMO_STORIES)]
            q, expr = q.format(a=a, b=b, c=c), e.format(a=a, b=b, c=c)
        r = str(eval(expr))
        demos.append({"prompt": q,
                      "segments": [["policy", f"<call>{expr}</call>"], ["tool", r],
                                   ["policy", r]]})
    for name, rows in (("train", train), ("heldout", heldout), ("demos", demos)):
        with open(os.path.join(DST, name + ".jsonl"), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
