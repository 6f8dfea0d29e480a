"""What torch_gpt.py and torch_llama.py share: the options, the optimizer,
the batches and the timed loop of one training step, so the two peers of
trainrun's benchmarks measure the same thing the same way.

The training step is trainrun's recipes': mean cross-entropy on separate
targets, AdamW with weight decay on matrices and embeddings only, gradient
clipping to a global L2 norm.  Random tokens made up front (data is not
what is timed: trainrun's loader prepares batches in a thread of its own).
Prints the line the shell scripts read:
  RESULT ms_per_step=.. tokens_per_s=.. peak_rss_mib=.. params=.. torch=.. cpu_ms_per_step=..
"""

import argparse
import resource
import sys
import time

import torch
import torch.nn.functional as F


def parser(doc):
    """The options every peer takes; a model adds its own."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
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
    return ap


def setup(a):
    """Threads and seed, before the model is built."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)


def train(a, model, logits_of):
    """Time a.steps steps after a.warmup; logits_of(model, tokens) -> [B,T,V]."""
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
            logits = logits_of(model, tokens)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        return loss.item()

    for i in range(a.warmup):
        step(i)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(a.steps):
        loss = step(a.warmup + i)
    seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - c0  # user + system, all threads

    ms = 1e3 * seconds / a.steps
    tokens_per_s = a.batch * a.ctx * a.steps / seconds
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print("loss after %d steps: %.4f" % (a.warmup + a.steps, loss), file=sys.stderr)
    print("RESULT ms_per_step=%.1f tokens_per_s=%.1f peak_rss_mib=%.0f params=%d torch=%s "
          "cpu_ms_per_step=%.1f"
          % (ms, tokens_per_s, rss_mib, n_params, torch.__version__.split("+")[0],
             1e3 * cpu_seconds / a.steps))
