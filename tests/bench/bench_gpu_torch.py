#!/usr/bin/env python3
"""PyTorch baseline for tests/bench/bench_gpu.c (run by it as a subprocess).

    python3 tests/bench/bench_gpu_torch.py --model gpt2 --device cuda [shape and step options]

bench_gpu measures its own figures first, frees its device memory, then runs
this script once per model with the shapes and the step counts it actually
ran, so that both sides do the same work on the same device.  The model is
transformers' GPT2LMHeadModel or LlamaForCausalLM with random weights, created
on the device, eager PyTorch with SDPA attention, float32 weights.  Each figure
is measured twice, in a fresh model each time:
  bf16  the forward passes under torch.autocast(dtype=torch.bfloat16)
        (weights, gradients and AdamW state stay float32: mixed precision)
  fp32  plain float32, TF32 off (torch.backends.*.allow_tf32 = False)
Figures (tokens/s; warm-up steps are not timed; every timed interval starts
and ends with torch.cuda.synchronize()):
  train        forward + cross-entropy (float32 logits) + backward +
               clip_grad_norm_(1.0) + AdamW(lr 1e-4, wd 0.1), B x T tokens
  dec64_t1     a sampling loop with the KV cache (past_key_values), 64 slots,
               temperature 1; per step softmax, torch.multinomial, the token's
               log-prob under the sampled and the raw distribution, and the
               tokens and log-probs copied to the host (what a rollout needs)
  dec64_topp   the same with top-p 0.9: sort, cumulative sum, nucleus mask,
               renormalise, sample
  dec256_t1    256 slots, temperature 1
  rl_gen, rl_train, rl_cycle  a synchronous generate-then-train cycle
               on one model: P prompts of Lp random tokens, G tokens sampled
               at temperature 1 (prefill included), then a PPO step on the
               P x (Lp + G - 1) sequences in micro-batches (clipped ratio with
               dual clip 3, one random advantage per sequence, mask on the
               generated tokens, entropy computed) and one AdamW step.
               rl_gen = generated tokens / generation time, rl_train = trained
               (masked) tokens / training time, rl_cycle = those tokens / the
               whole cycle.  One model generates and trains, so no weights are
               copied.
Prints one JSON object per line: {"name": "FIGURE@DTYPE", "value": ...}.
Exits 77 when torch or transformers is missing or the device is unusable
(the C side then reports baseline null); stderr says why.

--device cpu and --tiny (2 layers, width 64, vocabulary 512) let the script
be checked on a machine without a GPU:
    python3 tests/bench/bench_gpu_torch.py --model gpt2 --device cpu --tiny --B 2 --T 32 \
        --train-steps 1 --dec-prompt 4 --dec64-steps 2 --topp-steps 2 --dec256-steps 2 \
        --rl-prompts 4 --rl-prompt-len 4 --rl-gen 4 --rl-micro 2 --rl-cycles 1 --warmup 1
"""
import argparse
import inspect
import json
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig
except ImportError as e:  # the C benchmark reports "baseline null"
    print(f"bench_gpu_torch: {e}", file=sys.stderr)
    sys.exit(77)


def config_of(a):
    if a.model == "gpt2":
        L, NH, C, T, V = (2, 4, 64, 1024, 512) if a.tiny else (12, 12, 768, 1024, 50257)
        return GPT2Config(n_layer=L, n_head=NH, n_embd=C, n_positions=T, vocab_size=V,
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                          eos_token_id=0, attn_implementation="sdpa")
    # bench_gpu's (and bench_kernels') Llama-family configuration: Qwen2.5-0.5B's
    # shape without biases, tied head.
    if a.tiny:
        L, C, NH, NKV, hd, I, V = 2, 64, 4, 2, 16, 128, 512
    else:
        L, C, NH, NKV, hd, I, V = 24, 896, 14, 2, 64, 4864, 151936
    return LlamaConfig(num_hidden_layers=L, hidden_size=C, num_attention_heads=NH,
                       num_key_value_heads=NKV, head_dim=hd, intermediate_size=I,
                       vocab_size=V, max_position_embeddings=4096, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=0,
                       eos_token_id=0, attn_implementation="sdpa")


def new_model(a, dev):
    torch.manual_seed(0)
    with torch.device(dev):
        m = AutoModelForCausalLM.from_config(config_of(a), dtype=torch.float32)
    return m.to(dev)


class Side:
    """One precision: the autocast context and the synchronisation of the device."""

    def __init__(self, dev, dtype):
        self.dev, self.dtype = dev, dtype
        self.cuda = dev.type == "cuda"

    def ctx(self):
        if self.dtype == "bf16":
            return torch.autocast(self.dev.type, dtype=torch.bfloat16)
        return torch.autocast(self.dev.type, enabled=False)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.dev)


def train(a, side, model):
    model.train()
    V = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.1)
    g = torch.Generator(device=side.dev).manual_seed(2)
    x = torch.randint(0, V, (a.B, a.T), device=side.dev, generator=g)
    y = torch.randint(0, V, (a.B, a.T), device=side.dev, generator=g)

    def step():
        with side.ctx():
            logits = model(x).logits
        loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(a.warmup):
        step()
    side.sync()
    t0 = time.perf_counter()
    for _ in range(a.train_steps):
        step()
    side.sync()
    return a.B * a.T * a.train_steps / (time.perf_counter() - t0), opt


def sample(logits, temp, top_p, g):
    """Token, its log-prob under the sampled distribution and under the raw policy."""
    logits = logits.float()
    logp_all = torch.log_softmax(logits, dim=-1)
    probs = torch.softmax(logits / temp, dim=-1) if temp != 1.0 else logp_all.exp()
    if top_p < 1.0:
        sp, si = probs.sort(dim=-1, descending=True)
        keep = (sp.cumsum(dim=-1) - sp) < top_p  # the smallest prefix reaching top_p
        sp = sp * keep
        sp = sp / sp.sum(dim=-1, keepdim=True)
        k = torch.multinomial(sp, 1, generator=g)
        tok = si.gather(-1, k)
        lps = sp.gather(-1, k).log()
    else:
        tok = torch.multinomial(probs, 1, generator=g)
        lps = probs.gather(-1, tok).log()
    lpp = logp_all.gather(-1, tok)
    return tok, lps, lpp


class Rollout:
    """Sequences with a KV cache: the prompts are prefilled at creation; each step samples a
    token per sequence, copies the tokens and both log-probs to the host (what a rollout
    needs) and feeds the tokens."""

    @torch.no_grad()
    def __init__(self, side, model, prompts, g):
        self.side, self.model, self.g = side, model, g
        params = inspect.signature(model.forward).parameters
        # transformers 5.2x renamed past_key_values to cache (the old name still works, with
        # a warning); older versions know only past_key_values
        self.kw = "cache" if "cache" in params else "past_key_values"
        kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        with side.ctx():
            out = model(prompts, use_cache=True, **kw)
        self.take(out)

    def take(self, out):
        self.past = out["cache"] if "cache" in out else out.past_key_values
        self.logits = out.logits[:, -1, :]

    @torch.no_grad()
    def step(self, temp, top_p):
        tok, lps, lpp = sample(self.logits, temp, top_p, self.g)
        tok.cpu(), lps.cpu(), lpp.cpu()
        with self.side.ctx():
            self.take(self.model(tok, use_cache=True, **{self.kw: self.past}))
        return tok, lpp


def decode(a, side, model, S, steps, temp, top_p):
    model.eval()
    V = model.config.vocab_size
    g = torch.Generator(device=side.dev).manual_seed(3)
    prompts = torch.randint(0, V, (S, a.dec_prompt), device=side.dev, generator=g)
    r = Rollout(side, model, prompts, g)
    for _ in range(a.warmup):
        r.step(temp, top_p)
    side.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        r.step(temp, top_p)
    side.sync()
    return S * steps / (time.perf_counter() - t0)


def rl_cycle(a, side, model, opt, G):
    """One generate-then-train cycle; (gen seconds, train seconds, generated, trained)."""
    V = model.config.vocab_size
    P, Lp, mb = a.rl_prompts, a.rl_prompt_len, a.rl_micro
    g = torch.Generator(device=side.dev).manual_seed(5)
    side.sync()
    t0 = time.perf_counter()
    model.eval()
    prompts = torch.randint(0, V, (P, Lp), device=side.dev, generator=g)
    r = Rollout(side, model, prompts, g)
    out = [r.step(1.0, 1.0) for _ in range(G)]
    gen = torch.cat([t for t, _ in out], dim=1)  # [P, G]
    behav = torch.cat([lp for _, lp in out], dim=1)
    del r, out
    side.sync()
    t1 = time.perf_counter()
    model.train()
    seq = torch.cat([prompts, gen], dim=1)  # [P, Lp + G]
    x, y = seq[:, :-1], seq[:, 1:]
    T = x.shape[1]
    behav_full = torch.zeros(P, T, device=side.dev)
    behav_full[:, Lp - 1:] = behav
    mask = torch.zeros(P, T, device=side.dev)
    mask[:, Lp - 1:] = 1.0
    adv = torch.randn(P, 1, device=side.dev, generator=g).expand(P, T)
    n_tok = mask.sum()
    opt.zero_grad(set_to_none=True)
    for i in range(0, P, mb):
        sl = slice(i, i + mb)
        with side.ctx():
            logits = model(x[sl]).logits
        logp_all = torch.log_softmax(logits.float(), dim=-1)
        logp = logp_all.gather(-1, y[sl].unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # the statistics Manta reports
        r = torch.exp(logp - behav_full[sl])
        A = adv[sl]
        L = torch.maximum(-r * A, -torch.clamp(r, 0.8, 1.28) * A)
        L = torch.where(A < 0, torch.minimum(L, -3.0 * A), L)  # dual clip
        loss = (L * mask[sl]).sum() / n_tok
        loss.backward()
        del logits, logp_all, entropy
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    side.sync()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, P * G, float(n_tok)


def rl(a, side, model, opt):
    rl_cycle(a, side, model, opt, min(a.rl_gen, 4))  # warm-up: a short cycle
    gs = ts = gen = trained = 0.0
    for _ in range(a.rl_cycles):
        g_s, t_s, n_gen, n_tr = rl_cycle(a, side, model, opt, a.rl_gen)
        gs, ts, gen, trained = gs + g_s, ts + t_s, gen + n_gen, trained + n_tr
    return {"rl_gen": gen / gs, "rl_train": trained / ts, "rl_cycle": trained / (gs + ts)}


def emit(fig, dtype, v):
    print(json.dumps({"name": f"{fig}@{dtype}", "value": v}, separators=(",", ":")), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["gpt2", "llama"], required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (checking on a CPU)")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--only", default="", help="comma-separated figures (train,dec,rl)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--train-steps", type=int, default=8)
    ap.add_argument("--dec-prompt", type=int, default=16)
    ap.add_argument("--dec64-steps", type=int, default=64)
    ap.add_argument("--topp-steps", type=int, default=16)
    ap.add_argument("--dec256-steps", type=int, default=32)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--slots-big", type=int, default=256)
    ap.add_argument("--rl-prompts", type=int, default=64)
    ap.add_argument("--rl-prompt-len", type=int, default=32)
    ap.add_argument("--rl-gen", type=int, default=128)
    ap.add_argument("--rl-micro", type=int, default=8)
    ap.add_argument("--rl-cycles", type=int, default=2)
    a = ap.parse_args()
    try:
        dev = torch.device(a.device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("torch.cuda.is_available() is False")
            torch.cuda.set_device(dev)
            print(f"bench_gpu_torch: torch {torch.__version__} on "
                  f"{torch.cuda.get_device_name(dev)}", file=sys.stderr)
        torch.zeros(1, device=dev)
    except Exception as e:  # noqa: BLE001 - any failure here means "no baseline"
        print(f"bench_gpu_torch: device {a.device} unusable: {e}", file=sys.stderr)
        sys.exit(77)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    only = set(filter(None, a.only.split(",")))
    for dtype in a.dtypes.split(","):
        side = Side(dev, dtype)
        model = new_model(a, dev)
        opt = None
        if not only or "train" in only:
            v, opt = train(a, side, model)
            emit("train", dtype, v)
        if not only or "dec" in only:
            emit("dec64_t1", dtype, decode(a, side, model, a.slots, a.dec64_steps, 1.0, 1.0))
            emit("dec64_topp", dtype, decode(a, side, model, a.slots, a.topp_steps, 1.0, 0.9))
            emit("dec256_t1", dtype,
                 decode(a, side, model, a.slots_big, a.dec256_steps, 1.0, 1.0))
        if not only or "rl" in only:
            if opt is None:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
            for fig, v in rl(a, side, model, opt).items():
                emit(fig, dtype, v)
        del model, opt
        if side.cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
