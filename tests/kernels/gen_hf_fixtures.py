#!/usr/bin/env python3
"""Writes the Hugging Face folder fixtures that test_hf_dir.c loads.

    /work/venv/bin/python tests/kernels/gen_hf_fixtures.py [OUT]

OUT defaults to tests/kernels/fixtures/hf.  One tiny random GPT-2 (2 layers,
n_embd 32, 2 heads, vocab 64, 16 positions; biases and LayerNorm gains moved
away from 0 and 1; a few weights set to values that are subnormal in F16 and
BF16) is saved by transformers' save_pretrained as:

    f32/           float32, one model.safetensors
    bf16/          bfloat16, one file
    f16/           float16, one file
    bf16_sharded/  bfloat16, shards of at most 12 KB plus the index

Beside each folder's files, ref.bin holds the reference: int32 T, int32 V,
int32 tokens[T], float32 logits[T, V], where the logits are transformers'
own, from the folder reloaded with from_pretrained(dtype=torch.float32)
(the 16-bit weights upcast exactly, so the C loader's result should match
to float32 rounding).  Deterministic (seeded).
"""
import os
import shutil
import struct
import sys

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

TOKENS = [3, 17, 42, 5, 63, 0, 28, 9, 51, 12, 33, 7]


def make_model():
    torch.manual_seed(20261130)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    m = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.05)
            elif ".ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + torch.randn_like(p) * 0.1)
        w = m.transformer.h[0].mlp.c_fc.weight
        # subnormal in F16 (below 2^-14) and in BF16 (below 2^-126), both signs
        w[0, :4] = torch.tensor([3.0e-6, -7.5e-7, 1.0e-39, -5.0e-40])
    return m


def write_ref(folder):
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = m(torch.tensor([TOKENS])).logits[0].float().contiguous()
    T, V = logits.shape
    with open(os.path.join(folder, "ref.bin"), "wb") as f:
        f.write(struct.pack("<ii", T, V))
        f.write(struct.pack(f"<{T}i", *TOKENS))
        f.write(logits.numpy().astype("<f4").tobytes())


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
    variants = [("f32", torch.float32, None), ("bf16", torch.bfloat16, None),
                ("f16", torch.float16, None), ("bf16_sharded", torch.bfloat16, "12KB")]
    for name, dtype, shard in variants:
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        m = make_model().to(dtype)
        kw = {"max_shard_size": shard} if shard else {}
        m.save_pretrained(d, **kw)
        gen = os.path.join(d, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)  # not read by anyone; keeps the fixtures small
        write_ref(d)
        print(name, sorted(os.listdir(d)))


if __name__ == "__main__":
    main()
