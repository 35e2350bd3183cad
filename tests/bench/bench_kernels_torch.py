#!/usr/bin/env python3
"""PyTorch baseline for tests/bench/bench_kernels.c (run by it as a subprocess).

    python3 tests/bench/bench_kernels_torch.py --threads 2

Measures, for the same model sizes and thread count as the C benchmark,
transformers' GPT2LMHeadModel in eager mode (its default attention, SDPA):
  train_<size>       tokens/s of forward + cross-entropy + backward + AdamW step
  decode_<size>_b<B> tokens/s of a sampling loop with the KV cache
                     (past_key_values), batch B, temperature 1
Prints one JSON object per line: {"name": ..., "value": ...}; --only NAME
measures one figure (the C benchmark asks for each right after measuring its
own, so that both see the same load on a shared machine); --reps N reports the
best of N runs, as the C side does.  Exits 77 when
torch or transformers is missing, so the caller can print baseline null.
"""
import argparse
import json
import sys
import time

try:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:  # the C benchmark reports "baseline null"
    print(f"bench_kernels_torch: {e}", file=sys.stderr)
    sys.exit(77)

SIZES = {  # name: (n_layer, n_head, n_embd, block_size, vocab_size)
    "0.1M": (2, 4, 64, 128, 260),
    "10M": (6, 6, 384, 256, 260),
}


def model_of(size):
    L, NH, C, T, V = SIZES[size]
    cfg = GPT2Config(n_layer=L, n_head=NH, n_embd=C, n_positions=T, vocab_size=V,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                     eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def train(size, B, T, steps):
    model = model_of(size)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    x = torch.randint(0, SIZES[size][4], (B, T))
    y = torch.randint(0, SIZES[size][4], (B, T))

    def step():
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return B * T * steps / (time.perf_counter() - t0)


@torch.inference_mode()
def decode(size, B, prompt, gen):
    model = model_of(size)
    model.eval()
    V = SIZES[size][4]
    g = torch.Generator().manual_seed(0)

    def run(n):
        ids = torch.randint(0, V, (B, prompt), generator=g)
        out = model(ids, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1, :]
        t0 = time.perf_counter()
        for _ in range(n):
            probs = torch.softmax(logits / 1.0, dim=-1)
            tok = torch.multinomial(probs, 1, generator=g)
            out = model(tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :]
        return B * n / (time.perf_counter() - t0)

    run(4)
    return run(gen)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="measure this figure only")
    ap.add_argument("--reps", type=int, default=1, help="report the best of this many runs")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    q = a.quick
    figs = [
        ("train_0.1M", lambda: train("0.1M", 8, 128, 3 if q else 10)),
        ("train_10M", lambda: train("10M", 8, 128, 1 if q else 3)),
        ("decode_0.1M_b1", lambda: decode("0.1M", 1, 16, 16 if q else 64)),
        ("decode_0.1M_b64", lambda: decode("0.1M", 64, 16, 16 if q else 64)),
        ("decode_10M_b1", lambda: decode("10M", 1, 16, 16 if q else 64)),
        ("decode_10M_b64", lambda: decode("10M", 64, 16, 16 if q else 64)),
    ]
    for name, f in figs:
        if a.only and name != a.only:
            continue
        best = max(f() for _ in range(a.reps))
        print(json.dumps({"name": name, "value": best}), flush=True)


if __name__ == "__main__":
    main()
