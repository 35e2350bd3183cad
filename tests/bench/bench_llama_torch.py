#!/usr/bin/env python3
"""PyTorch baseline for the Llama-family figures of tests/bench/bench_kernels.c.

    python3 tests/bench/bench_llama_torch.py --dir /tmp/manta_bench_llama0.5B --only NAME

The folder is the BF16 one bench_kernels writes.  The model is loaded with
AutoModelForCausalLM.from_pretrained(dir, dtype=DTYPE) (eager PyTorch, its
default attention), --dtype float32 (default; as Manta holds a trainable model)
or bfloat16 (weights and activations in bfloat16).  Figures (--only picks one):
  load_llama0.5B         seconds of from_pretrained
  decode_llama0.5B_b<B>  tokens/s of a sampling loop with the KV cache, B = 1, 16
                         (best of --reps runs of the loop)
  train_llama0.5B        tokens/s of one forward + cross-entropy + backward +
                         clipping + AdamW step on 4 x 256 tokens (best after a warm-up)
  mem_llama0.5B          peak resident MB of a process that loads, decodes at
                         B = 16 and trains, as the C side does
  mem_rollout_llama0.5B  peak resident MB of a process that loads and decodes
                         at B = 1 and 16 (a rollout)
Prints {"name": ..., "value": ...}.  Exits 77 without torch or transformers.
"""
import argparse
import json
import resource
import sys
import time

try:
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"bench_llama_torch: {e}", file=sys.stderr)
    sys.exit(77)


def load(d, dtype):
    t0 = time.perf_counter()
    m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype)
    return m, time.perf_counter() - t0


@torch.inference_mode()
def decode(model, B, prompt, gen):
    model.eval()
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, prompt), generator=g)
    out = model(ids, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1, :]

    def step(logits, past):
        tok = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=g)
        out = model(tok, past_key_values=past, use_cache=True)
        return out.logits[:, -1, :], out.past_key_values

    logits, past = step(logits, past)  # warm-up
    t0 = time.perf_counter()
    for _ in range(gen):
        logits, past = step(logits, past)
    return B * gen / (time.perf_counter() - t0)


def train(model, B, T, steps):
    model.train()
    V = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1)
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    best = 0.0
    for s in range(steps):
        t0 = time.perf_counter()
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, V).float(), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        del logits, loss
        if s > 0:
            best = max(best, B * T / (time.perf_counter() - t0))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", required=True)
    ap.add_argument("--reps", type=int, default=1, help="decode: best of this many loops")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    gen = 4 if a.quick else 16
    steps = 2 if a.quick else 3
    model, secs = load(a.dir, getattr(torch, a.dtype))
    reps = max(1, a.reps)
    if a.only == "load_llama0.5B":
        v = secs
    elif a.only == "decode_llama0.5B_b1":
        v = max(decode(model, 1, 16, gen) for _ in range(reps))
    elif a.only == "decode_llama0.5B_b16":
        v = max(decode(model, 16, 16, gen) for _ in range(reps))
    elif a.only == "train_llama0.5B":
        v = train(model, 4, 256, steps)
    elif a.only == "mem_rollout_llama0.5B":
        decode(model, 1, 16, 2)
        decode(model, 16, 16, 2)
        v = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    elif a.only == "mem_llama0.5B":
        decode(model, 16, 16, 2)
        train(model, 4, 256, 2)
        v = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    else:
        print(f"bench_llama_torch: unknown figure {a.only}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"name": a.only, "value": v}), flush=True)


if __name__ == "__main__":
    main()
