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

import math
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_common
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

    def forward(self, tokens):
        t = self.transformer
        x = t.wte(tokens) + t.wpe.weight[: tokens.shape[1]]
        for block in t.h:
            x = block(x)
        return t.ln_f(x) @ t.wte.weight.t()  # tied head


def main():
    a = torch_common.parser(__doc__).parse_args()
    torch_common.setup(a)
    model = GPT(a.vocab, a.ctx, a.layers, a.heads, a.dim)
    torch_common.train(a, model, lambda m, tokens: m(tokens))


if __name__ == "__main__":
    main()
