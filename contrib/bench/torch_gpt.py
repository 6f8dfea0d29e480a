#!/usr/bin/env python3
"""The GPT of trainrun's gpt{} model in PyTorch, timed on the CPU.

The peer of trainrun in contrib/bench/cpu_gpt.sh.  Same model as
lua/trainrun/models.lua and tests/torch/make_fixtures.py: GPT-2, learned
positions, pre-norm blocks, GELU (tanh) MLP of 4x width, tied embedding and
output head, parameters under the same names.  Same training step: mean
cross-entropy, AdamW with weight decay on matrices and embeddings only,
gradient clipping to a global L2 norm.  Random tokens, eager mode, as a
PyTorch user would write it (attention through scaled_dot_product_attention).

Prints one line that cpu_gpt.sh reads:
  RESULT ms_per_step=.. tokens_per_s=.. peak_rss_mib=.. params=.. torch=..

  python3 torch_gpt.py --layers 4 --dim 128 --heads 4 --ctx 128 --batch 32
  python3 torch_gpt.py ... --bf16        # torch.autocast("cpu", bfloat16)
"""

import argparse
import math
import resource
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit("torch_gpt.py: PyTorch is not importable (%s)" % e)


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=-1)
        # head h uses columns h*hs .. (h+1)*hs, as in trainrun
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        h = F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(V, C)
        self.transformer.wpe = nn.Embedding(T, C)
        self.transformer.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.transformer.ln_f = nn.LayerNorm(C, eps=1e-5)
        # trainrun's initialisation: std 0.02, residual projections scaled
        # by 1/sqrt(2 * layers), zero biases, unit norms
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets):
        t = self.transformer
        x = t.wte(tokens) + t.wpe.weight[: tokens.shape[1]]
        for block in t.h:
            x = block(x)
        logits = t.ln_f(x) @ t.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true",
                    help='forward under torch.autocast("cpu", dtype=torch.bfloat16)')
    # trainrun's recipes/base/gpt-char.lua
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = GPT(a.vocab, a.ctx, a.layers, a.heads, a.dim)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    # a few batches made up front: data is not what is being timed (trainrun's
    # loader prepares its batches in a thread of its own)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, a.vocab, (a.batch, a.ctx), generator=g),
                torch.randint(0, a.vocab, (a.batch, a.ctx), generator=g)) for _ in range(4)]

    def step(i):
        tokens, targets = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        return loss.item()

    for i in range(a.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss = step(a.warmup + i)
    seconds = time.perf_counter() - t0

    ms = 1e3 * seconds / a.steps
    tokens_per_s = a.batch * a.ctx * a.steps / seconds
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print("loss after %d steps: %.4f" % (a.warmup + a.steps, loss), file=sys.stderr)
    print("RESULT ms_per_step=%.1f tokens_per_s=%.1f peak_rss_mib=%.0f params=%d torch=%s"
          % (ms, tokens_per_s, rss_mib, n_params, torch.__version__.split("+")[0]))


if __name__ == "__main__":
    main()
