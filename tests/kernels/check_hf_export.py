#!/usr/bin/env python3
"""A checkpoint saved by Manta loads into transformers' GPT2LMHeadModel unchanged.

    python3 tests/kernels/check_hf_export.py path/to/kernels_hf_export

Runs the C program to write model.safetensors, config.json, tokens and logits
into a temporary folder, loads the folder with GPT2LMHeadModel.from_pretrained
and checks that PyTorch's logits equal Manta's (1e-4).  Exits 77 (ctest's
"skipped") when torch or transformers is not installed.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from transformers import GPT2LMHeadModel
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def main():
    writer = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([writer, d], check=True)
        model = GPT2LMHeadModel.from_pretrained(d)
        model.eval()
        tokens = np.fromfile(os.path.join(d, "tokens.bin"), dtype="<i4").reshape(2, 8)
        want = np.fromfile(os.path.join(d, "logits.bin"), dtype="<f4").reshape(2, 8, -1)
        with torch.no_grad():
            got = model(torch.from_numpy(tokens).long()).logits.numpy()
        err = float(np.abs(got - want).max())
        print(f"max |torch - manta| = {err:.3g} over {want.size} logits")
        # the head is tied: lm_head must be the loaded wte, not a fresh init
        assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
        if not err <= 1e-4:
            sys.exit(1)


if __name__ == "__main__":
    main()
