#!/usr/bin/env python3
"""Write a tiny random-initialised Qwen3-architecture model as a Hugging Face folder.

    python3 examples/make_tiny_qwen3.py OUT [--seed N] [--dtype float32|bfloat16]

OUT receives config.json and model.safetensors, the layout save_pretrained
writes, for examples/calc_qwen3.yaml (`model: {path: OUT}`). The model has
the Qwen3 architecture (RMSNorm, rotary positions, SwiGLU MLP, grouped-query
attention, per-head q/k RMSNorm, head_dim not tied to the width) at a size the
calculator task trains in minutes on a CPU: vocabulary 260 (the task's
byte-level tokens: 256 bytes and <bos> <eos> <call> </call>), hidden size 64,
2 layers, 4 query heads and 2 key/value heads of 32 dimensions, MLP width
128, 256 positions, tied embeddings; about 0.1M parameters.

With transformers installed, the model is transformers' own Qwen3ForCausalLM
(Qwen3Config, its initialisation, save_pretrained). Without it, the same
folder is written with the standard library alone: the same config keys and
tensor names, weights drawn N(0, initializer_range) and norm weights 1, as
transformers initialises them.
"""
import argparse
import json
import os
import random
import struct
import sys

VOCAB = 260  # manta_actors.h RL_VOCAB: bytes 0..255, <bos> 256, <eos> 257, <call> 258, </call> 259
SIZE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    bos_token_id=256,
    eos_token_id=257,
    initializer_range=0.02,
)


def with_transformers(out, seed, dtype):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    size = dict(SIZE)
    theta = size.pop("rope_theta")
    cfg = Qwen3Config(**size, rope_parameters={"rope_type": "default", "rope_theta": theta})
    model = Qwen3ForCausalLM(cfg).eval()
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def tensors(seed):
    """(name, shape, values) of every tensor, in the order transformers lists them."""
    rnd = random.Random(seed)
    C, I, L = SIZE["hidden_size"], SIZE["intermediate_size"], SIZE["num_hidden_layers"]
    NH, NKV, hd = SIZE["num_attention_heads"], SIZE["num_key_value_heads"], SIZE["head_dim"]
    std = SIZE["initializer_range"]

    def normal(*shape):
        n = 1
        for s in shape:
            n *= s
        return [rnd.gauss(0.0, std) for _ in range(n)]

    def ones(n):
        return [1.0] * n

    out = [("model.embed_tokens.weight", [VOCAB, C], normal(VOCAB, C))]
    for i in range(L):
        p = "model.layers.%d." % i
        out += [
            (p + "input_layernorm.weight", [C], ones(C)),
            (p + "self_attn.q_proj.weight", [NH * hd, C], normal(NH * hd, C)),
            (p + "self_attn.k_proj.weight", [NKV * hd, C], normal(NKV * hd, C)),
            (p + "self_attn.v_proj.weight", [NKV * hd, C], normal(NKV * hd, C)),
            (p + "self_attn.o_proj.weight", [C, NH * hd], normal(C, NH * hd)),
            (p + "self_attn.q_norm.weight", [hd], ones(hd)),
            (p + "self_attn.k_norm.weight", [hd], ones(hd)),
            (p + "post_attention_layernorm.weight", [C], ones(C)),
            (p + "mlp.gate_proj.weight", [I, C], normal(I, C)),
            (p + "mlp.up_proj.weight", [I, C], normal(I, C)),
            (p + "mlp.down_proj.weight", [C, I], normal(C, I)),
        ]
    out.append(("model.norm.weight", [C], ones(C)))
    return out


def bf16_bytes(values):
    """Float32 to bfloat16, rounding to nearest even, little-endian."""
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", struct.pack("<%df" % len(values), *values)):
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u & 0xFFFF)
    return bytes(out)


def with_stdlib(out, seed, dtype):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    st = "BF16" if dtype == "bfloat16" else "F32"
    n_params = 0
    for name, shape, values in tensors(seed):
        data = bf16_bytes(values) if st == "BF16" else struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": st, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
        n_params += len(values)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    tmp = os.path.join(out, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, os.path.join(out, "model.safetensors"))
    size = dict(SIZE)
    theta = size.pop("rope_theta")
    config = dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        hidden_act="silu",
        attention_bias=False,
        attention_dropout=0.0,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=SIZE["num_hidden_layers"],
        layer_types=["full_attention"] * SIZE["num_hidden_layers"],
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        use_cache=True,
        dtype=dtype,
        **size,
    )
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    return n_params


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the folder to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--no-transformers", action="store_true",
                    help="write with the standard library even when transformers is installed")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    how = "standard library"
    n = None
    if not a.no_transformers:
        try:
            n = with_transformers(a.out, a.seed, a.dtype)
            how = "transformers"
        except ImportError:
            pass
    if n is None:
        n = with_stdlib(a.out, a.seed, a.dtype)
    print("%s: tiny Qwen3 (%d parameters, vocabulary %d, %s) written with the %s"
          % (a.out, n, VOCAB, a.dtype, how))
    return 0


if __name__ == "__main__":
    sys.exit(main())
