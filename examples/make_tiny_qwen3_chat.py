#!/usr/bin/env python3
"""Write a tiny Qwen3 folder with its own byte-level BPE tokenizer and the ChatML format.

    python3 examples/make_tiny_qwen3_chat.py OUT [--seed N] [--vocab N]

OUT receives tokenizer.json, config.json and model.safetensors, for
examples/calc_qwen3_chat.yaml (`model: {path: OUT}`: the rollouts find the
folder's tokenizer.json and render conversations in ChatML, tool calls as
<tool_call>{json}</tool_call>). Needs the `tokenizers` library.

The tokenizer is trained here with `tokenizers` in the style of Qwen2's
tokenizer.json: NFC, the Qwen2 pre-tokenizer regex (each digit its own
piece) then ByteLevel, the ByteLevel decoder; special tokens <|endoftext|>,
<|im_start|>, <|im_end|>, and the added (not special) tokens <tool_call>,
</tool_call>, <tool_response>, </tool_response>, as Qwen's file has them. Its
training text is what the calculator task's conversations are made of (the
ChatML system and tool-definition text, prompts, tool calls, observations).

The model is make_tiny_qwen3.py's (hidden size 64, 2 layers, ...), with the
tokenizer's vocabulary size, <|im_end|> as eos, and 512 positions (the
rendered system prompt with its tool definitions is about 150 tokens).
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_tiny_qwen3 as base  # noqa: E402

QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# The text Qwen2.5's chat template writes around a conversation with tools
# (what libmanta_tok renders for model.chat_format chatml).
SYSTEM = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
          "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
          "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
          '{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", '
          '"properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}\n'
          "</tools>\n\nFor each function call, return a json object with function name and "
          "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
          '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n')


def conversation(a, b):
    p = a * b
    return (SYSTEM + "<|im_start|>user\n%d*%d=?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
            '{"name": "calc", "arguments": {"expression": "%d*%d"}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\n%d\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n%d<|im_end|>\n" % (a, b, a, b, p, p))


def training_text(seed):
    r = random.Random(seed)
    return [conversation(r.randint(100, 999), r.randint(10, 99)) for _ in range(400)]


def train_tokenizer(vocab, seed):
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab - len(ADDED), min_frequency=2,
                                  special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_text(seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the folder to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=512, help="the tokenizer's size at most")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tok = train_tokenizer(a.vocab, a.seed)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    v = tok.get_vocab_size(with_added_tokens=True)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>", "bos_token": None,
                   "model_max_length": 512}, f, indent=2)
        f.write("\n")
    # the model of make_tiny_qwen3.py with this vocabulary
    base.VOCAB = v
    base.SIZE.update(vocab_size=v, max_position_embeddings=512,
                     bos_token_id=tok.token_to_id("<|endoftext|>"),
                     eos_token_id=tok.token_to_id("<|im_end|>"))
    try:
        n, how = base.with_transformers(a.out, a.seed, "float32"), "transformers"
    except ImportError:
        n, how = base.with_stdlib(a.out, a.seed, "float32"), "the standard library"
    print("%s: tiny Qwen3 (%d parameters) with a %d-token ChatML tokenizer, written with %s"
          % (a.out, n, v, how))
    return 0


if __name__ == "__main__":
    sys.exit(main())
