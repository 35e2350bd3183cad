#!/usr/bin/env python3
"""Folders written by mk_save_dir load with AutoModelForCausalLM.from_pretrained.

    PYTHON tests/kernels/check_hf_save_dir.py DIR...

Run by kernels_test_hf_save_dir (which writes the folders: config.json, the
weights in F32, BF16 or F16, single or sharded, plus tokens.bin int32 [T] and
logits.bin float32 [T, V], Manta's logits from the folder loaded back).  Each
folder must load as a GPT2LMHeadModel in the dtype its config names, with the
head tied to wte, and, upcast to float32, give Manta's logits within 1e-5.
"""
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

TOL = 1e-5


def main():
    worst = 0.0
    for d in sys.argv[1:]:
        native = AutoModelForCausalLM.from_pretrained(d)
        want_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
        tag = os.path.basename(d).split("_")[0]
        assert type(native).__name__ == "GPT2LMHeadModel", type(native).__name__
        assert native.dtype == want_dtype[tag], (d, native.dtype)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
        tokens = np.fromfile(os.path.join(d, "tokens.bin"), dtype="<i4")
        want = np.fromfile(os.path.join(d, "logits.bin"), dtype="<f4").reshape(len(tokens), -1)
        with torch.no_grad():
            got = model(torch.from_numpy(tokens).long()[None]).logits[0].numpy()
        err = float(np.abs(got - want).max())
        worst = max(worst, err)
        print(f"{os.path.basename(d)}: loads as {native.dtype}, "
              f"max |transformers - manta| logit = {err:.3g}")
    if not worst <= TOL:
        print(f"FAIL: {worst:.3g} > {TOL}")
        sys.exit(1)


if __name__ == "__main__":
    main()
