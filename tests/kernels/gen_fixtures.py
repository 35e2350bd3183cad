#!/usr/bin/env python3
"""Generates the PyTorch reference fixtures for tests/kernels (run by hand).

    python3 tests/kernels/gen_fixtures.py            # writes tests/kernels/fixtures/

A tiny GPT-2 is initialised by transformers' GPT2LMHeadModel and saved with
save_pretrained (tensor names carry the "transformer." prefix, the head is
tied).  For fixed inputs it records, in ref.bin:

  header   int32[12]: magic 20251129, version 1, n_layer, n_head, n_embd,
           block_size, vocab_size, B, T, n_params, n_steps, 0
  tokens   int32[B*T];  targets int32[B*T];  weights float32[B*T]
  logits   float32[B*T*V]             forward logits
  ce_loss  float32[1]                 weighted-mean cross-entropy
  ce_grads float32[n_params]          its gradient, in Manta's flat order
  behav, adv, mask float32[B*T] each  inputs of the PPO objective
  ppo      float32[6]                 loss, pg_loss, mean_ratio, clip_frac,
                                      entropy, approx_kl
  ppo_grads float32[n_params]
  losses   float32[n_steps]           CE loss before each of ten AdamW steps
                                      (clip 1.0, decay on 2-D tensors only)

The C tests need no Python: the fixtures are committed (about 200 KB).
"""
import os
import struct
import sys

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")

L, NH, C, TCTX, V = 2, 2, 16, 16, 64
B, T = 2, 8
STEPS = 10
PPO = dict(clip_low=0.2, clip_high=0.28, ratio_cap=3.0, entropy_coef=0.01)
ADAM = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip=1.0)

LAYER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
         "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]


def manta_order():
    names = ["wte.weight", "wpe.weight"]
    for l in range(L):
        names += [f"h.{l}.{n}" for n in LAYER]
    return names + ["ln_f.weight", "ln_f.bias"]


def flat(model, what):
    params = dict(model.transformer.named_parameters())
    out = []
    for n in manta_order():
        t = params[n]
        out.append((t.grad if what == "grad" else t).detach().reshape(-1))
    return torch.cat(out).numpy().astype(np.float32)


def ppo_loss(logits, targets, behav, adv, mask):
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    logr = logp - behav
    r = torch.exp(logr)
    un = -r * adv
    cl = -torch.clamp(r, 1 - PPO["clip_low"], 1 + PPO["clip_high"]) * adv
    Lt = torch.maximum(un, cl)
    cap = -PPO["ratio_cap"] * adv
    Lt = torch.where((adv < 0) & (Lt > cap), cap, Lt)
    active = (un >= cl) & ~((adv < 0) & (torch.maximum(un, cl) > cap))
    n = mask.sum()
    pg = (mask * Lt).sum() / n
    H = (mask * ent).sum() / n
    loss = pg - PPO["entropy_coef"] * H
    stats = [loss.item(), pg.item(), ((mask * r).sum() / n).item(),
             ((mask * (~active).float()).sum() / n).item(), H.item(),
             ((mask * ((r - 1) - logr)).sum() / n).item()]
    return loss, stats


def main():
    torch.manual_seed(1234)
    cfg = GPT2Config(n_layer=L, n_head=NH, n_embd=C, n_positions=TCTX, vocab_size=V,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                     eos_token_id=0, activation_function="gelu_new",
                     attn_implementation="eager")
    model = GPT2LMHeadModel(cfg)
    model.eval()  # no dropout anywhere; gradients still flow
    # make biases and LayerNorm gains non-trivial so that their gradients are tested
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "ln_" in n:
                p.add_(0.05 * torch.randn_like(p))
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT)  # model.safetensors + config.json
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    weights = (torch.rand(B, T, generator=g) > 0.25).float()
    weights[0, 0] = 1.0

    def ce(logits):
        lp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return -(weights * lp).sum() / weights.sum()

    logits = model(tokens).logits
    loss = ce(logits)
    model.zero_grad()
    loss.backward()
    ce_grads = flat(model, "grad")

    with torch.no_grad():
        lp_now = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # behaviour log-probs: current ones shifted so some ratios fall outside the clip range
    behav = (lp_now + 0.6 * torch.randn(B, T, generator=g)).float()
    adv = torch.randn(B, T, generator=g).float()
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    logits2 = model(tokens).logits
    ploss, pstats = ppo_loss(logits2, targets, behav, adv, mask)
    model.zero_grad()
    ploss.backward()
    ppo_grads = flat(model, "grad")

    # ten AdamW steps on the cross-entropy
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAM["lr"], betas=ADAM["betas"], eps=ADAM["eps"])
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        l = ce(model(tokens).logits)
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ADAM["clip"])
        opt.step()
        losses.append(l.item())

    n_params = ce_grads.size
    with open(os.path.join(OUT, "ref.bin"), "wb") as f:
        f.write(struct.pack("<12i", 20251129, 1, L, NH, C, TCTX, V, B, T, n_params, STEPS, 0))
        f.write(tokens.numpy().astype("<i4").tobytes())
        f.write(targets.numpy().astype("<i4").tobytes())
        f.write(weights.numpy().astype("<f4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        f.write(np.float32(loss.item()).tobytes())
        f.write(ce_grads.astype("<f4").tobytes())
        for a in (behav, adv, mask):
            f.write(a.numpy().astype("<f4").tobytes())
        f.write(np.array(pstats, dtype="<f4").tobytes())
        f.write(ppo_grads.astype("<f4").tobytes())
        f.write(np.array(losses, dtype="<f4").tobytes())
    print("wrote", OUT, "n_params", n_params, "ce", loss.item(), "ppo", pstats, "losses", losses,
          file=sys.stderr)


if __name__ == "__main__":
    main()
