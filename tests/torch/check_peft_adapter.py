#!/usr/bin/env python3
"""Load a LoRA adapter directory with PEFT and compare its logits.

  check_peft_adapter.py DIR BASE [--logits FILE] [--tol 1e-5] [--out FILE]

loads PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE),
DIR) in float64 (eager attention, eval mode: no dropout), checks that every
tensor of DIR/adapter_model.safetensors landed in the model (PEFT itself
ignores tensors whose names it does not know, which would leave lora_B at
zero and the model equal to its base), prints the logits of the first row of
a fixed batch and, with --logits FILE (a safetensors holding `logits`, [T,V]
for the first row or [B,T,V]), the largest difference against them; it exits
1 when that exceeds --tol times max(1, max |logit|).

The batch is FILE's `tokens` when it has them, else the batch of the hf
fixtures (make_hf_fixtures.py: B=3 rows of T=8 tokens drawn with seed 1234 for
BASE's vocabulary), which is also the batch of every NAME.ref.safetensors under
tests/fixtures/lora.  With `targets` in FILE the loss (mean cross-entropy of
logits[b,t] against targets[b,t]) is printed and compared too.  --out FILE
writes tokens, logits (first row) and, given targets, loss as safetensors.

Not run in CI (it needs torch, transformers and peft as pinned in
requirements-lora.txt); see tests/torch/README.md, "LoRA fixtures".
"""

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # BASE and DIR are local
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_fixtures import read_safetensors, write_safetensors  # noqa: E402


def saved_name(name, adapter="default"):
    """PEFT's parameter name -> the name in adapter_model.safetensors."""
    for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
        name = name.replace(".%s.%s." % (part, adapter), ".%s." % part)
    return name.replace(".modules_to_save.%s." % adapter, ".")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", metavar="DIR", help="adapter directory "
                    "(adapter_config.json, adapter_model.safetensors)")
    ap.add_argument("base", metavar="BASE", help="the base model's directory")
    ap.add_argument("--logits", metavar="FILE",
                    help="safetensors with `logits` (and optionally `tokens`, "
                    "`targets`, `loss`) to compare against")
    ap.add_argument("--tol", type=float, default=1e-5,
                    help="allowed max |diff| / max(1, max |logit|) "
                    "(default 1e-5)")
    ap.add_argument("--out", metavar="FILE",
                    help="write tokens, logits (first row) and loss here")
    ap.add_argument("--quiet", action="store_true",
                    help="do not print the logits themselves")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(
        args.base, torch_dtype=torch.float64, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, args.dir)
    model.eval()
    config = model.peft_config["default"]

    # every tensor of the file must be a parameter of the model, equal to it
    _, saved = read_safetensors(os.path.join(args.dir,
                                             "adapter_model.safetensors"))
    params = {saved_name(n): p for n, p in model.named_parameters()
              if ".lora_" in n or ".modules_to_save." in n}
    unknown = sorted(set(saved) - set(params))
    missing = sorted(set(params) - set(saved))
    if unknown or missing:
        print("adapter names do not match PEFT's: %d unknown to PEFT %s, "
              "%d not in the file %s" % (len(unknown), unknown[:3],
                                         len(missing), missing[:3]))
        return 1
    for n, a in saved.items():
        p = params[n].detach().numpy()
        if p.shape != a.shape or not np.array_equal(
                p, a.astype(np.float64)):
            print("%s: PEFT's parameter (%s) is not the file's (%s)"
                  % (n, p.shape, a.shape))
            return 1
    scaling = config.lora_alpha / (config.r ** 0.5 if config.use_rslora
                                   else config.r)
    print("adapter %s: r %d, alpha %g, %s scaling %g, %d tensors, targets %s%s"
          % (args.dir, config.r, config.lora_alpha,
             "rslora" if config.use_rslora else "alpha/r", scaling,
             len(saved), ",".join(sorted(config.target_modules)),
             ", modules_to_save " + ",".join(config.modules_to_save)
             if config.modules_to_save else ""))

    ref = {}
    if args.logits:
        _, ref = read_safetensors(args.logits)
        if "logits" not in ref:
            print("%s holds no `logits`" % args.logits)
            return 1
    V = model.get_base_model().config.vocab_size
    if "tokens" in ref:
        tokens = torch.from_numpy(ref["tokens"].astype(np.int64))
    else:
        from make_hf_fixtures import SEED, batch
        tokens, _ = batch(V, SEED)
    if tokens.dim() == 1:
        tokens = tokens[None]
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    loss = None
    if "targets" in ref:
        targets = torch.from_numpy(ref["targets"].astype(np.int64))
        loss = F.cross_entropy(logits.reshape(-1, V),
                               targets.reshape(-1)).item()
    if not args.quiet:
        np.set_printoptions(precision=5, suppress=True, linewidth=120,
                            threshold=1 << 20)
        print("tokens[0] %s" % tokens[0].tolist())
        print("logits[0] (%d x %d):" % tuple(logits[0].shape))
        print(logits[0].numpy())
    if loss is not None:
        print("loss %.7f" % loss)
    if args.out:
        out = [("tokens", tokens.numpy().astype(np.int32)),
               ("logits", logits[0].numpy().astype(np.float32))]
        if loss is not None:
            out.append(("loss", np.array([loss], dtype=np.float32)))
        write_safetensors(args.out, out, {"adapter": os.path.basename(
            os.path.normpath(args.dir))})
    if not args.logits:
        return 0

    want = ref["logits"].astype(np.float64)
    got = logits.numpy() if want.ndim == 3 else logits[0].numpy()
    if got.shape != want.shape:
        print("logits shape %s, %s holds %s" % (got.shape, args.logits,
                                                want.shape))
        return 1
    diff = float(np.abs(got - want).max())
    scale = max(1.0, float(np.abs(want).max()))
    ok = diff <= args.tol * scale
    print("max |logits - %s| = %.3g (of max |logit| %.3g; tolerance %.3g)"
          % (args.logits, diff, float(np.abs(want).max()), args.tol * scale))
    if loss is not None and "loss" in ref:
        rel = abs(loss / float(ref["loss"].reshape(-1)[0]) - 1)
        print("loss %.7f, the file's %.7f (rel %.2g)"
              % (loss, float(ref["loss"].reshape(-1)[0]), rel))
        ok = ok and rel <= args.tol
    print("ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
