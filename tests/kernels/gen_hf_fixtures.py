#!/usr/bin/env python3
"""Writes the Hugging Face folder fixtures that test_hf_dir.c loads.

    /work/venv/bin/python tests/kernels/gen_hf_fixtures.py [OUT]

OUT defaults to tests/kernels/fixtures/hf.  Tiny random models of each
family, saved by transformers' save_pretrained (biases and norm gains moved
away from 0 and 1, so that every tensor matters):

    f32/ bf16/ f16/   GPT-2 (2 layers, n_embd 16, 2 heads, vocab 64, 16
                      positions; a few weights subnormal in F16 and BF16),
                      float32 / bfloat16 / float16, one model.safetensors
    bf16_sharded/     the same GPT-2 in bfloat16, shards of at most 4 KB
    llama_f32/        Llama (hidden 16, 2 layers, 4 heads, 2 key/value heads,
                      intermediate 24, vocab 64, 32 positions), untied head,
                      attention and MLP biases, Llama 3 rope scaling; its
                      config.json rewritten in the transformers 4 layout
                      (rope_theta at the top, rope_scaling) to test that too
    llama_tied_bf16/  Llama, tied head, no biases, rope_theta 500000
    qwen2_bf16/       Qwen2 (q/k/v biases), tied head
    qwen3_sharded/    Qwen3 (q/k norms, head_dim 8 with hidden 16 and 4
                      heads), untied head, bfloat16 shards of at most 4 KB

Beside each folder's files, ref.bin holds the reference: int32 T, int32 V,
int32 tokens[T], float32 logits[T, V], where the logits are transformers'
own, from the folder reloaded with from_pretrained(dtype=torch.float32)
(16-bit weights upcast exactly, so the C loader's result should match to
float32 rounding).  Deterministic (seeded).
"""
import json
import os
import shutil
import struct
import sys

import torch
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

TOKENS = [3, 17, 42, 5, 63, 0, 28, 9, 51, 12, 33, 7]
ROTARY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=24, vocab_size=64, max_position_embeddings=32,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)


def perturb(m):
    """Biases and norm gains away from 0 and 1; weights a little larger than the init."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.05)
            elif p.dim() == 1:
                p.copy_(1.0 + torch.randn_like(p) * 0.1)
            else:
                p.mul_(5.0)  # logits of a useful size
    return m


def gpt2():
    torch.manual_seed(20261130)
    cfg = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    m = perturb(GPT2LMHeadModel(cfg).eval())
    with torch.no_grad():
        w = m.transformer.h[0].mlp.c_fc.weight
        # subnormal in F16 (below 2^-14) and in BF16 (below 2^-126), both signs
        w[0, :4] = torch.tensor([3.0e-6, -7.5e-7, 1.0e-39, -5.0e-40])
    return m


def llama_untied():
    torch.manual_seed(11)
    cfg = LlamaConfig(**ROTARY, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0,
                                       "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8})
    return perturb(LlamaForCausalLM(cfg).eval())


def llama_tied():
    torch.manual_seed(12)
    cfg = LlamaConfig(**ROTARY, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    return perturb(LlamaForCausalLM(cfg).eval())


def qwen2():
    torch.manual_seed(13)
    return perturb(Qwen2ForCausalLM(Qwen2Config(**ROTARY, tie_word_embeddings=True)).eval())


def qwen3():
    torch.manual_seed(14)
    cfg = Qwen3Config(**ROTARY, head_dim=8, tie_word_embeddings=False)
    return perturb(Qwen3ForCausalLM(cfg).eval())


def to_v4_layout(folder):
    """Rewrites config.json as transformers 4 wrote it: rope_theta at the top, rope_scaling."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


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
    variants = [("f32", gpt2, torch.float32, None), ("bf16", gpt2, torch.bfloat16, None),
                ("f16", gpt2, torch.float16, None), ("bf16_sharded", gpt2, torch.bfloat16, "4KB"),
                ("llama_f32", llama_untied, torch.float32, None),
                ("llama_tied_bf16", llama_tied, torch.bfloat16, None),
                ("qwen2_bf16", qwen2, torch.bfloat16, None),
                ("qwen3_sharded", qwen3, torch.bfloat16, "4KB")]
    for name, make, dtype, shard in variants:
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        m = make().to(dtype)
        kw = {"max_shard_size": shard} if shard else {}
        m.save_pretrained(d, **kw)
        gen = os.path.join(d, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)  # not read by anyone; keeps the fixtures small
        if name == "llama_f32":
            to_v4_layout(d)
        write_ref(d)
        print(name, sorted(os.listdir(d)))


if __name__ == "__main__":
    main()
