#!/usr/bin/env python3
"""Generate trainrun's LoRA reference fixtures with PEFT.

For each case below, a PEFT LoRA model is built over one of the tiny Hugging
Face fixtures (tests/fixtures/hf/, made by make_hf_fixtures.py; nothing is
downloaded), its adapters are given seeded random values (PEFT starts B at
zero, which would hide every gradient of A), and

  tests/fixtures/lora/CASE/            the adapter as PeftModel.save_pretrained
                                       writes it (adapter_config.json +
                                       adapter_model.safetensors, fp32)
  tests/fixtures/lora/CASE.ref.safetensors
      tokens, targets  the hf fixture's batch (I32 [B,T])
      loss             mean cross-entropy of logits(tokens) against targets
      logits           the logits of the first batch row (F32 [T,V])
      grad.<name>      d loss / d trainable tensor, <name> as in
                       adapter_model.safetensors ("base_model.model.<module>
                       .lora_A.weight", a saved module's full weight)
      adamw_losses     the loss before each of 10 AdamW steps of the trainable
                       tensors (the hf fixtures' settings: lr 1e-2, betas
                       0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D tensors)
      final.<name>     the trainable tensors after those steps

all computed in float64 (the model .double() after the adapter is saved) and
stored as float32.  Targets are not shifted by the model (as make_hf_fixtures).

Cases:
  tiny-llama-qv        r 4, alpha 8, q_proj and v_proj
  tiny-llama-all       r 8, alpha 16, target_modules "all-linear" (PEFT picks
                       q k v o gate up down; never the output head)
  tiny-llama-rslora    r 4, alpha 8, use_rslora (scale alpha / sqrt(r)), q k v o
  tiny-llama-save      r 4, alpha 8, q and v, modules_to_save lm_head (saved in
                       full as base_model.model.lm_head.weight)
  tiny-llama-qlora     r 4, alpha 8, all-linear over the NF4 base: each adapted
                       linear's weight replaced by bitsandbytes'
                       dequantize_4bit(quantize_4bit(W, nf4, blocksize 64,
                       compress_statistics)) before the references, which is
                       what a QLoRA forward multiplies (trainrun quantises the
                       same base itself, bit for bit, tests/test_nf4.c)
  tiny-qwen2-all       r 4, alpha 8, all-linear on Qwen2 (q/k/v biases, tied head)
  tiny-gpt2-attn       r 4, alpha 8, c_attn and c_proj: transformers' Conv1D
                       layers (PEFT sets fan_in_fan_out; lora_A is still
                       [r, in] and lora_B [out, r]); c_proj also matches the
                       MLP's c_proj, as PEFT's suffix match does

Usage (the venv of tests/torch/README.md, requirements-lora.txt):
  python3 tests/torch/make_lora_fixtures.py            # regenerate
  python3 tests/torch/make_lora_fixtures.py --check    # verify the files
"""

import argparse
import json
import os
import shutil
import sys

# PEFT keeps target_modules as a set: its saved order follows Python's string
# hashing, so the files are reproducible only with a fixed seed
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)
os.environ["HF_HUB_OFFLINE"] = "1"  # the bases are local: ask the Hub nothing

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_fixtures import read_safetensors, write_safetensors  # noqa: E402

HF = os.path.normpath(os.path.join(HERE, "..", "fixtures", "hf"))
OUT = os.path.normpath(os.path.join(HERE, "..", "fixtures", "lora"))
LR, BETA1, BETA2, EPS, WD, STEPS = 1e-2, 0.9, 0.95, 1e-8, 0.1, 10
SEED = 4321

CASES = {
    "tiny-llama-qv": ("tiny-llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])),
    "tiny-llama-all": ("tiny-llama", dict(r=8, lora_alpha=16, target_modules="all-linear")),
    "tiny-llama-rslora": ("tiny-llama", dict(r=4, lora_alpha=8, use_rslora=True,
                                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])),
    "tiny-llama-save": ("tiny-llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=["lm_head"])),
    "tiny-llama-qlora": ("tiny-llama", dict(r=4, lora_alpha=8, target_modules="all-linear")),
    "tiny-qwen2-all": ("tiny-qwen2", dict(r=4, lora_alpha=8, target_modules="all-linear")),
    "tiny-gpt2-attn": ("tiny-gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"])),
}


def nf4_roundtrip(model):
    """Each linear inside the decoder blocks replaced by its NF4 round trip."""
    import torch
    from bitsandbytes.functional import dequantize_4bit, quantize_4bit
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and ".layers." in name:
                w = mod.weight.data.float().contiguous()
                q, st = quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
                mod.weight.data.copy_(dequantize_4bit(q, st).to(mod.weight.dtype))


def loss_of(model, tokens, targets):
    import torch
    logits = model(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss, logits


def saved_name(param_name):
    """PEFT's in-memory parameter name -> its adapter_model.safetensors key."""
    n = param_name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
    return n.replace(".modules_to_save.default.", ".")


def build(case):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    base, kw = CASES[case]
    model = AutoModelForCausalLM.from_pretrained(os.path.join(HF, base), torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    if case.endswith("qlora"):
        nf4_roundtrip(model)
    peft = get_peft_model(model, LoraConfig(lora_dropout=0.0, **kw))
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if p.requires_grad and ("lora_A" in n or "lora_B" in n):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    out = os.path.join(OUT, case)
    if os.path.isdir(out):
        shutil.rmtree(out)
    peft.save_pretrained(out)
    cfg = os.path.join(out, "adapter_config.json")
    j = json.load(open(cfg))
    j["base_model_name_or_path"] = base  # the fixture directory, not this machine's path
    json.dump(j, open(cfg, "w"), indent=2, sort_keys=True)
    readme = os.path.join(out, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    return peft.double(), base


def references(case):
    import torch
    peft, base = build(case)
    _, ref = read_safetensors(os.path.join(HF, base + ".ref.safetensors"))
    tokens = torch.from_numpy(ref["tokens"].astype(np.int64))
    targets = torch.from_numpy(ref["targets"].astype(np.int64))
    trained = [(n, p) for n, p in peft.named_parameters() if p.requires_grad]
    loss, logits = loss_of(peft, tokens, targets)
    loss.backward()
    grads = {saved_name(n): p.grad.detach().clone() for n, p in trained}
    logits0 = logits[0].detach().clone()
    for _, p in trained:
        p.grad = None
    opt = torch.optim.AdamW(
        [{"params": [p for _, p in trained if p.dim() >= 2], "weight_decay": WD},
         {"params": [p for _, p in trained if p.dim() < 2], "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss, _ = loss_of(peft, tokens, targets)
        step_loss.backward()
        losses.append(step_loss.item())
        opt.step()
    final = {saved_name(n): p.detach().clone() for n, p in trained}
    f32 = lambda t: t.detach().to(torch.float32).numpy()
    tensors = [("tokens", ref["tokens"]), ("targets", ref["targets"]),
               ("loss", np.array([loss.item()], dtype=np.float32)), ("logits", f32(logits0))]
    tensors += [("grad." + n, f32(grads[n])) for n in sorted(grads)]
    tensors += [("adamw_losses", np.array(losses, dtype=np.float32))]
    tensors += [("final." + n, f32(final[n])) for n in sorted(final)]
    import peft as peft_module
    import transformers
    meta = {"case": case, "base": base, "steps": STEPS, "lr": repr(LR), "torch": torch.__version__,
            "transformers": transformers.__version__, "peft": peft_module.__version__}
    write_safetensors(os.path.join(OUT, case + ".ref.safetensors"), tensors, meta)
    # the same model in float32, as PyTorch itself computes it: its distance
    # from the float64 reference is the bar trainrun's tolerance stands beside
    peft32, _ = build(case)
    peft32 = peft32.float()
    l32, lg32 = loss_of(peft32, tokens, targets)
    print("%-18s %3d trained tensors  loss %.7f  adamw %.6f -> %.6f  fp32 PyTorch: loss %.1e, "
          "logits %.1e" % (case, len(grads), loss.item(), losses[0], losses[-1],
                            abs(l32.item() - loss.item()),
                            float((lg32[0].double() - logits0).abs().max())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="verify the files only")
    a = ap.parse_args()
    if a.check:
        for case in CASES:
            _, ref = read_safetensors(os.path.join(OUT, case + ".ref.safetensors"))
            _, ad = read_safetensors(os.path.join(OUT, case, "adapter_model.safetensors"))
            grads = sorted(k[5:] for k in ref if k.startswith("grad."))
            if grads != sorted(ad):
                raise SystemExit("%s: gradients %s, adapter %s" % (case, grads, sorted(ad)))
            print("%-18s ok (%d tensors)" % (case, len(ad)))
        return
    os.makedirs(OUT, exist_ok=True)
    for case in CASES:
        references(case)


if __name__ == "__main__":
    main()
