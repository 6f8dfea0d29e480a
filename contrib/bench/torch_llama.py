#!/usr/bin/env python3
"""A Llama of trainrun's llama{} shape in PyTorch (transformers), timed on the CPU.

The peer of trainrun in contrib/bench/cpu_llama.sh: transformers'
LlamaForCausalLM built from a LlamaConfig (nothing downloaded), eager mode
with attention through scaled_dot_product_attention ("sdpa"), as a PyTorch
user fine-tuning a Llama would run it.  Same training step as trainrun's
recipes: mean cross-entropy on separate targets, AdamW (weight decay on
matrices and embeddings only), gradient clipping to a global L2 norm.

Prints one line that cpu_llama.sh reads:
  RESULT ms_per_step=.. tokens_per_s=.. peak_rss_mib=.. params=.. torch=..

  python3 torch_llama.py --layers 4 --dim 128 --heads 4 --kv-heads 2 --ffn 344 --ctx 128 --batch 32
  python3 torch_llama.py ... --bf16        # torch.autocast("cpu", bfloat16)
"""

import argparse
import resource
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    sys.exit("torch_llama.py: PyTorch or transformers is not importable (%s)" % e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=344)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true",
                    help='forward under torch.autocast("cpu", dtype=torch.bfloat16)')
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.ctx,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, use_cache=False)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    model.train()
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, a.vocab, (a.batch, a.ctx), generator=g),
                torch.randint(0, a.vocab, (a.batch, a.ctx), generator=g)) for _ in range(4)]

    def step(i):
        tokens, targets = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(input_ids=tokens).logits
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), targets.view(-1))
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
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("loss after %d steps: %.4f" % (a.warmup + a.steps, loss), file=sys.stderr)
    print("RESULT ms_per_step=%.1f tokens_per_s=%.1f peak_rss_mib=%.0f params=%d torch=%s"
          % (ms, tokens_per_s, rss_mib, n_params, torch.__version__.split("+")[0]))


if __name__ == "__main__":
    main()
