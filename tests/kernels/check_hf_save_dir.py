#!/usr/bin/env python3
"""Folders written by mk_save_dir load with AutoModelForCausalLM.from_pretrained.

    PYTHON tests/kernels/check_hf_save_dir.py DIR...

Run by kernels_test_hf_save_dir, which writes the folders: config.json, the
weights in F32, BF16 or F16, single or sharded, plus tokens.bin int32 [T],
logits.bin float32 [T, V] (Manta's logits from the folder loaded back) and
expect.txt ("CLASS DTYPE TIED": the transformers class the folder must build,
f32/bf16/f16, 1 if the head is tied).  Each folder must load as that class in
that dtype, its output head tied to the input embedding exactly when TIED,
and, upcast to float32, give Manta's logits within TOL absolute + TOL
relative (1e-5: the weights are the same floats; only summation order and,
for the rotary families, the cos/sin tables differ; measured: below 1.3e-5
absolute on logits up to 7).
"""
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

TOL = 1e-5
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def check(d):
    with open(os.path.join(d, "expect.txt")) as f:
        klass, tag, tied = f.read().split()
    native = AutoModelForCausalLM.from_pretrained(d)
    assert type(native).__name__ == klass, (d, type(native).__name__)
    assert native.dtype == DTYPES[tag], (d, native.dtype)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    same = (model.get_output_embeddings().weight.data_ptr()
            == model.get_input_embeddings().weight.data_ptr())
    assert same == (tied == "1"), (d, "tied" if same else "untied")
    tokens = np.fromfile(os.path.join(d, "tokens.bin"), dtype="<i4")
    want = np.fromfile(os.path.join(d, "logits.bin"), dtype="<f4").reshape(len(tokens), -1)
    with torch.no_grad():
        got = model(torch.from_numpy(tokens).long()[None]).logits[0].numpy()
    tol = TOL
    excess = float((np.abs(got - want) - tol * (1 + np.abs(want))).max())
    err = float(np.abs(got - want).max())
    print(f"{os.path.basename(d)}: {klass} in {native.dtype}, "
          f"{'tied' if same else 'untied'}, max |transformers - manta| logit = {err:.3g} "
          f"(max |logit| {float(np.abs(want).max()):.3g}, tol {tol:g} abs + rel)")
    return excess <= 0


def main():
    bad = [d for d in sys.argv[1:] if not check(d)]
    if bad:
        print("FAIL: logits outside tolerance in", " ".join(map(os.path.basename, bad)))
        sys.exit(1)


if __name__ == "__main__":
    main()
