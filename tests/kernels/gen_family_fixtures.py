#!/usr/bin/env python3
"""Writes the model-family fixtures that test_families.c reads.

    /work/venv/bin/python tests/kernels/gen_family_fixtures.py [OUT]
    (or: cmake --build build --target kernels_family_fixtures)

OUT defaults to tests/kernels/fixtures/family.  Tiny random-initialised models
of each family transformers defines (2 layers, hidden 32, MLP width 48 or
64, vocab 64 or 72, max_position_embeddings 64), each saved by save_pretrained into OUT/<name>/:

    llama3        LlamaConfig: 4 query / 2 key-value heads, untied lm_head,
                  rms_norm_eps 1e-5, rope_theta 500000 with Llama 3 scaling
                  (factor 8, low 1, high 4, original context 256: head_dim 8
                  then has one frequency in each band - kept, interpolated,
                  divided - which a context of 64 would not give;
                  max_position_embeddings 512, above it, as Llama 3's is), F32
    llama_bias    LlamaConfig, tied, attention_bias and mlp_bias true, default
                  rope (theta 10000), F32
    qwen2         Qwen2Config (q/k/v biases), tied, 4/2 heads, F32
    qwen3         Qwen3Config, head_dim 12 (hidden/heads is 8), q/k norms,
                  untied, 4/2 heads, F32
    gpt2          GPT2Config, 4 heads, n_inner 64 (not the default 4 x 32), F32
    qwen3_bf16    the qwen3 model in BF16, with config.json in the hub's
                  legacy spelling (rope_theta and rope_scaling at top level,
                  torch_dtype) as Qwen/Qwen3-0.6B ships it
    llama3_sharded the llama3 model in BF16, shards of at most 24 KB plus
                  model.safetensors.index.json, legacy config.json as
                  meta-llama/Llama-3.2-1B ships it

The weights are not transformers' initialisation (N(0, 0.02) gives nearly
uniform attention and logits within 0.1 of each other, which would test
little): every matrix is N(0, 0.15), biases N(0, 0.1), norm gains 1 + N(0, 0.1).
The untied llama3 and qwen3 have token embeddings of N(0, 0.003) and
N(0, 0.001): their mean square is then of the order of rms_norm_eps (1e-5,
1e-6), so the first RMSNorm depends on eps strongly enough that a wrong eps
fails the logits (at N(0, 0.15) it changes them by about 1e-6).

Every reference number is transformers' own, from the folder reloaded with
from_pretrained(dtype=torch.float32, attn_implementation="eager") (so 16-bit
weights are upcast exactly and the legacy configs are read by transformers
itself).  Each folder gets expect.bin, all little-endian:

    char    magic[8] = "MKFAMREF"
    int32   version (1), B, T, V, n_prompt, n_gen, n_grads
    int32   tokens[B*T], targets[B*T]       (targets: the next tokens)
    float32 logits[B*T*V]                   model(tokens).logits
    float32 logp[B*T]                       log_softmax(logits)[targets]
    float32 loss                            mean cross-entropy over B*T
    int32   prompt[n_prompt], gen[n_gen]    generate(prompt, do_sample=False,
                                            use_cache=True, n_gen new tokens)
    n_grads times (F32 variants only; 0 for the 16-bit ones):
      int32 name_len, char name[name_len], int32 ndim, int32 shape[ndim],
      float32 grad[prod(shape)]             d loss / d parameter, by its
                                            transformers name, loss.backward()
                                            on the float32 model

The prompt is chosen so that every greedy step's best logit leads the second
by at least 1e-3 (so the C side's float32 rounding cannot flip a token).
Deterministic (seeded).  generation_config.json is removed (not read).
"""
import json
import os
import shutil
import struct
import sys

import torch
import torch.nn.functional as F
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

B, T, N_GEN = 2, 16, 12
MIN_MARGIN = 1e-3
COMMON = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}


def llama3():
    kw = dict(COMMON, max_position_embeddings=512)
    cfg = LlamaConfig(vocab_size=64, intermediate_size=48, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, rope_parameters=dict(LLAMA3_ROPE), **kw)
    return LlamaForCausalLM(cfg)


def llama_bias():
    cfg = LlamaConfig(vocab_size=64, intermediate_size=48, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **COMMON)
    return LlamaForCausalLM(cfg)


def qwen2():
    cfg = Qwen2Config(vocab_size=72, intermediate_size=48, rms_norm_eps=1e-6,
                      tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **COMMON)
    return Qwen2ForCausalLM(cfg)


def qwen3():
    cfg = Qwen3Config(vocab_size=64, intermediate_size=48, head_dim=12, rms_norm_eps=1e-6,
                      tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **COMMON)
    return Qwen3ForCausalLM(cfg)


def gpt2():
    cfg = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                     eos_token_id=None)
    return GPT2LMHeadModel(cfg)


def randomise(m, seed, embed_std):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif p.dim() == 1:  # LayerNorm / RMSNorm gains
                p.copy_(1.0 + torch.randn_like(p) * 0.1)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn_like(p) * embed_std)
            else:
                p.copy_(torch.randn_like(p) * 0.15)
    return m.eval()


# The hub's config.json spelling (transformers 4.x, what downloaded models
# carry): rope_theta and rope_scaling at top level, torch_dtype.
def legacy_config(folder, dtype_name):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    rt = rp.get("rope_type", "default")
    c["rope_scaling"] = None if rt == "default" else rp
    c.pop("dtype", None)
    c["torch_dtype"] = dtype_name
    c["transformers_version"] = "4.51.0"
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def load_f32(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def greedy(m, V, gen_seed):
    """A prompt whose greedy continuation has a clear winner at every step."""
    g = torch.Generator().manual_seed(gen_seed)
    for attempt in range(200):
        prompt = torch.randint(0, V, (1, 5), generator=g)
        with torch.no_grad():
            # the explicit mask: without it generate() takes tokens equal to
            # pad_token_id for padding and masks them out
            out = m.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             use_cache=True, max_new_tokens=N_GEN, min_new_tokens=N_GEN,
                             eos_token_id=None, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
            seq = out.sequences[0, prompt.shape[1]:]
            assert seq.numel() == N_GEN, seq
            # the cached generation is the argmax of the full forward pass
            full = m(out.sequences).logits[0, prompt.shape[1] - 1:-1].argmax(-1)
            assert torch.equal(full, seq), (full, seq)
        margin = min((s[0].topk(2).values[0] - s[0].topk(2).values[1]).item()
                     for s in out.scores)
        if margin >= MIN_MARGIN:
            return prompt[0].tolist(), seq.tolist(), margin, attempt
    raise SystemExit("no prompt with a greedy margin >= %g" % MIN_MARGIN)


def reference(folder, seed, with_grads):
    m = load_f32(folder)
    V = m.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
    m.zero_grad()
    logits = m(tokens).logits.float()
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    grads = []
    if with_grads:
        loss.backward()
        for name, p in m.named_parameters():  # tied weights appear once
            assert p.grad is not None, name
            grads.append((name, p.grad.detach().float().contiguous()))
    prompt, gen, margin, attempt = greedy(m, V, seed + 1)
    return dict(V=V, tokens=tokens, targets=targets, logits=logits.detach(), logp=logp.detach(),
                loss=loss.item(), prompt=prompt, gen=gen, grads=grads, margin=margin,
                attempt=attempt)


def write_expect(folder, r):
    i32 = lambda xs: struct.pack("<%di" % len(xs), *xs)
    f32 = lambda t: t.numpy().astype("<f4").tobytes()
    with open(os.path.join(folder, "expect.bin"), "wb") as f:
        f.write(b"MKFAMREF")
        f.write(i32([1, B, T, r["V"], len(r["prompt"]), len(r["gen"]), len(r["grads"])]))
        f.write(i32(r["tokens"].flatten().tolist()))
        f.write(i32(r["targets"].flatten().tolist()))
        f.write(f32(r["logits"]))
        f.write(f32(r["logp"]))
        f.write(struct.pack("<f", r["loss"]))
        f.write(i32(r["prompt"]))
        f.write(i32(r["gen"]))
        for name, gr in r["grads"]:
            nb = name.encode()
            f.write(i32([len(nb)]) + nb)
            f.write(i32([gr.dim()] + list(gr.shape)))
            f.write(f32(gr))


VARIANTS = [
    # name, constructor, seed, embedding std, dtype, max_shard_size, legacy config
    ("llama3", llama3, 101, 0.003, torch.float32, None, False),
    ("llama_bias", llama_bias, 202, 0.15, torch.float32, None, False),
    ("qwen2", qwen2, 303, 0.15, torch.float32, None, False),
    ("qwen3", qwen3, 404, 0.001, torch.float32, None, False),
    ("gpt2", gpt2, 505, 0.15, torch.float32, None, False),
    ("qwen3_bf16", qwen3, 404, 0.001, torch.bfloat16, None, True),
    ("llama3_sharded", llama3, 101, 0.003, torch.bfloat16, "24KB", True),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fixtures", "family")
    os.makedirs(out, exist_ok=True)
    for name, make, seed, embed_std, dtype, shard, legacy in VARIANTS:
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        m = randomise(make(), seed, embed_std).to(dtype)
        m.save_pretrained(d, **({"max_shard_size": shard} if shard else {}))
        gen = os.path.join(d, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
        if legacy:
            legacy_config(d, "bfloat16" if dtype == torch.bfloat16 else "float32")
        r = reference(d, seed, dtype == torch.float32)
        write_expect(d, r)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print("%-15s %6.1f KB  loss %.4f  greedy margin %.4f (prompt try %d)  %s" %
              (name, size / 1024, r["loss"], r["margin"], r["attempt"], sorted(os.listdir(d))))


if __name__ == "__main__":
    main()
