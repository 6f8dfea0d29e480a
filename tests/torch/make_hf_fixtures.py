#!/usr/bin/env python3
"""Generate trainrun's Hugging Face reference fixtures with transformers.

Builds tiny models locally from configs (nothing is downloaded), gives them
fixed random weights, writes each with save_pretrained, and computes with the
transformers model itself (in float64) what trainrun must reproduce when it
loads that directory with `model = { from = DIR }`:

  tests/fixtures/hf/tiny-llama/       LlamaForCausalLM, GQA (4 heads, 2 kv
                                      heads), untied head, fp32
  tests/fixtures/hf/tiny-llama-bf16/  the same weights rounded to bfloat16
                                      (config.json torch_dtype bfloat16)
  tests/fixtures/hf/tiny-qwen2/       Qwen2ForCausalLM: q/k/v biases, GQA,
                                      tied embeddings, rope_theta 1e6
  tests/fixtures/hf/tiny-gpt2/        GPT2LMHeadModel (Conv1D layout [in,out])
  tests/fixtures/hf/tiny-qwen2-sharded/  tiny-qwen2's weights as save_pretrained
                                      shards them (max_shard_size 8KB: three
                                      files and model.safetensors.index.json);
                                      it has no reference of its own

and next to each directory DIR a reference DIR.ref.safetensors holding

  tokens, targets  the batch (I32 [B,T])
  loss             mean cross-entropy of logits(tokens) against targets (F32 [1])
  logits           the logits of the first batch row (F32 [T,V])
  grad.<name>      d loss / d parameter, HF names and HF layout (as stored
                   in DIR/model.safetensors: GPT-2's Conv1D weights [in,out])
  adamw_losses     the loss before each of 10 AdamW steps on that batch
  final.<name>     the parameters after those steps (HF layout)

The bf16 reference holds tokens, targets, loss, logits and adamw_losses only
(its gradients would repeat the fp32 model's test at twice the bytes); its
numbers are computed from the bf16-rounded weights, so an exact loader of
bf16 matches it to fp32 rounding.

targets are separate from tokens: transformers' own `labels=` shifts by one,
trainrun's data gives the next tokens as targets, so the loss here is
cross_entropy(logits.view(-1, V), targets.view(-1)) on the unshifted logits.

Everything is computed in float64 (model.double(), eager attention) and
stored as float32.  The AdamW settings are those of make_fixtures.py (lr
1e-2, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on parameters of two or more
dimensions, none on norms and biases), which is what trainrun decays.

Caveats for comparisons:
  - GPT-2's attn.c_attn.bias key slice (columns C..2C) has an exactly zero
    gradient (see make_fixtures.py): compare its final weights on the q and
    v slices only.
  - GPT-2's wpe rows at positions >= T get no gradient; a trainrun model
    built with ctx = T holds only the first T rows.

Usage (with the venv of tests/torch/README.md):
  python3 tests/torch/make_hf_fixtures.py              # regenerate, then check
  python3 tests/torch/make_hf_fixtures.py --check      # only verify the files
  python3 tests/torch/make_hf_fixtures.py --check-export build/trainrun
      # train a few steps from each fixture with trainrun, export with
      # `trainrun export RUN --format hf -o OUT`, load OUT with
      # from_pretrained and compare its logits with trainrun's weights'
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_fixtures import read_safetensors, write_safetensors  # noqa: E402

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures", "hf"))
B, T = 3, 8
LR, BETA1, BETA2, EPS, WD, STEPS = 1e-2, 0.9, 0.95, 1e-8, 0.1, 10
SEED = 1234

# copies of a fixture's weights saved in shards: name -> (fixture, max_shard_size)
SHARDED = {"tiny-qwen2-sharded": ("tiny-qwen2", "8KB")}

# HF GPT-2 Conv1D weights are stored [in, out]
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
          "mlp.c_proj.weight")


def llama_config():
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        hidden_act="silu", max_position_embeddings=64, rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
        mlp_bias=False, bos_token_id=1, eos_token_id=2,
        attn_implementation="eager")


def llama3_rope_config():
    """tiny-llama with Llama 3.1's rope_scaling (rope_type "llama3"), its original
    context small enough (16) that the scaling changes every frequency the fixture's 8
    positions use: head 8, theta 1e4 gives wavelengths 6.3 (between 16/4 and 16/1:
    smoothed), 63, 628 and 6283 (past 16: divided by the factor)"""
    config = llama_config()
    config.max_position_embeddings = 64
    config.rope_scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    return config


def write_llama3_freqs():
    """rope_llama3_freqs.txt: transformers' own llama3 inverse frequencies
    (_compute_llama3_parameters) for Llama 3.1 8B's and 3.2 1B's settings,
    the fixture's, and 100 seeded random ones, as float32 hex: one line per
    setting, "theta head factor low high original p_0 ... p_{head/2-1} f_0 ... f_{head/2-1}",
    p the plain frequencies (_compute_default_rope_parameters) and f the scaled ones
    (tests/test_kernels.c checks kernels/rope_scaling.h against it, bit for bit)"""
    import random
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rng = random.Random(SEED)
    settings = [(500000.0, 128, 8.0, 1.0, 4.0, 8192), (500000.0, 64, 32.0, 1.0, 4.0, 8192),
                (10000.0, 8, 4.0, 1.0, 4.0, 16)]
    for _ in range(100):
        settings.append((rng.choice([1e4, 5e5, 1e6, round(rng.uniform(100, 1e6), 3)]),
                         rng.choice([2, 4, 8, 16, 32, 64, 128]),
                         rng.choice([1.0, 2.0, 8.0, round(rng.uniform(1, 64), 4)]),
                         rng.choice([1.0, 0.5, round(rng.uniform(0.1, 2), 4)]),
                         rng.choice([4.0, round(rng.uniform(2.1, 8), 4)]),
                         rng.choice([8, 16, 32, 64, 100, 8192, rng.randint(2, 100000)])))
    lines = []
    for theta, head, factor, low, high, orig in settings:
        config = LlamaConfig(hidden_size=2 * head, num_attention_heads=2, rope_theta=theta,
                             max_position_embeddings=2 * orig,
                             rope_scaling={"rope_type": "llama3", "factor": factor,
                                           "low_freq_factor": low, "high_freq_factor": high,
                                           "original_max_position_embeddings": orig})
        inv, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
        plain, _ = ROPE_INIT_FUNCTIONS["default"](config, "cpu")
        lines.append(" ".join([repr(theta), str(head), repr(factor), repr(low), repr(high),
                               str(orig)] + [float(x).hex() for x in plain.tolist()]
                              + [float(x).hex() for x in inv.tolist()]))
    path = os.path.join(FIXTURES, "rope_llama3_freqs.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("rope_llama3_freqs.txt: %d settings" % len(lines))


def qwen2_config():
    from transformers import Qwen2Config
    return Qwen2Config(
        vocab_size=41, hidden_size=16, intermediate_size=24,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        hidden_act="silu", max_position_embeddings=32, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        sliding_window=32, max_window_layers=2, bos_token_id=1,
        eos_token_id=2, attn_implementation="eager")


def gpt2_config():
    from transformers import GPT2Config
    return GPT2Config(
        vocab_size=37, n_embd=16, n_layer=2, n_head=2, n_positions=16,
        activation_function="gelu_new", layer_norm_epsilon=1e-5,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=36,
        eos_token_id=36, attn_implementation="eager")


# name -> (config function, model class name, storage dtype, full reference)
MODELS = {
    "tiny-llama": (llama_config, "LlamaForCausalLM", "float32", True),
    "tiny-llama-bf16": (llama_config, "LlamaForCausalLM", "bfloat16", False),
    "tiny-llama-rope3": (llama3_rope_config, "LlamaForCausalLM", "float32", True),
    "tiny-qwen2": (qwen2_config, "Qwen2ForCausalLM", "float32", True),
    "tiny-gpt2": (gpt2_config, "GPT2LMHeadModel", "float32", True),
}


def model_class(name):
    import transformers
    return getattr(transformers, name)


def reinit(model, seed):
    """Weights large enough that attention is far from uniform and every
    op's gradient matters: matrices N(0, 0.2), norm gains U(0.5, 1.5),
    biases N(0, 0.1).  HF's own init (std 0.02) would make the loss ~ln V
    and hide most of the arithmetic."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                t = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.2
            elif name.endswith("bias"):
                t = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.1
            else:
                t = torch.rand(p.shape, generator=g, dtype=torch.float64) + 0.5
            p.copy_(t.to(p.dtype))


def batch(vocab, seed):
    import torch
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    return tokens, targets


def load64(path, cls):
    import torch
    m = model_class(cls).from_pretrained(path, torch_dtype=torch.float64,
                                         attn_implementation="eager")
    m.eval()  # no dropout (all pdrop are 0 anyway); gradients still flow
    return m


def loss_of(model, tokens, targets):
    import torch.nn.functional as F
    logits = model(input_ids=tokens).logits
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)), logits


def references(path, cls, tokens, targets):
    """loss, logits[0], grads, AdamW losses and final weights, float64."""
    import torch
    model = load64(path, cls)
    loss, logits = loss_of(model, tokens, targets)
    loss.backward()
    names = [n for n, _ in model.named_parameters()]
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    logits0 = logits[0].detach().clone()

    model = load64(path, cls)
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(
        [{"params": [params[n] for n in names if params[n].dim() >= 2],
          "weight_decay": WD},
         {"params": [params[n] for n in names if params[n].dim() < 2],
          "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss, _ = loss_of(model, tokens, targets)
        step_loss.backward()
        losses.append(step_loss.item())
        opt.step()
    final = {n: p.detach().clone() for n, p in model.named_parameters()}
    return loss.item(), logits0, names, grads, losses, final


def f32(t):
    import torch
    return t.detach().to(torch.float32).cpu().numpy()


def build_one(name):
    import torch
    config_fn, cls, dtype, full = MODELS[name]
    torch.manual_seed(SEED)
    model = model_class(cls)(config_fn())
    reinit(model, SEED)  # the bf16 copy gets the fp32 model's weights, rounded
    model = model.to(getattr(torch, dtype))
    out = os.path.join(FIXTURES, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    # generation_config.json is not part of the fixture: trainrun reads
    # config.json and the weights only
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)

    vocab = model.config.vocab_size
    tokens, targets = batch(vocab, SEED)
    loss, logits0, names, grads, losses, final = references(
        out, cls, tokens, targets)
    tensors = [("tokens", tokens.numpy().astype(np.int32)),
               ("targets", targets.numpy().astype(np.int32)),
               ("loss", np.array([loss], dtype=np.float32)),
               ("logits", f32(logits0))]
    if full:
        tensors += [("grad." + n, f32(grads[n])) for n in names]
    tensors += [("adamw_losses", np.array(losses, dtype=np.float32))]
    if full:
        tensors += [("final." + n, f32(final[n])) for n in names]
    import transformers
    metadata = {"model": name, "class": cls, "dtype": dtype, "B": B, "T": T,
                "lr": repr(LR), "beta1": repr(BETA1), "beta2": repr(BETA2),
                "eps": repr(EPS), "weight_decay": repr(WD), "steps": STEPS,
                "torch": torch.__version__.split("+")[0],
                "transformers": transformers.__version__}
    ref = out + ".ref.safetensors"
    write_safetensors(ref, tensors, metadata)
    print("%-16s loss %.7f  adamw %.6f -> %.6f  (%d + %d bytes)"
          % (name, loss, losses[0], losses[-1],
             os.path.getsize(os.path.join(out, "model.safetensors")),
             os.path.getsize(ref)))
    return tensors, metadata


def build_sharded(name):
    """The fixture's directory re-saved in shards; no reference (the
    fixture's applies)."""
    base, size = SHARDED[name]
    _, cls, _, _ = MODELS[base]
    model = model_class(cls).from_pretrained(os.path.join(FIXTURES, base))
    out = os.path.join(FIXTURES, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=size)
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        raise SystemExit("%s: save_pretrained wrote one file, not shards" % name)
    print("%-16s %s in %d shards" % (name, base, len(
        [f for f in os.listdir(out) if f.startswith("model-")])))


def check_sharded(name):
    """Same tensors as the fixture, and the fixture's reference loss."""
    import torch
    base, _ = SHARDED[name]
    _, cls, _, _ = MODELS[base]
    with open(os.path.join(FIXTURES, name,
                           "model.safetensors.index.json")) as f:
        index = json.load(f)
    if len(set(index["weight_map"].values())) < 2:
        raise SystemExit("check %s: not sharded" % name)
    a = dict(load64(os.path.join(FIXTURES, name), cls).named_parameters())
    b = dict(load64(os.path.join(FIXTURES, base), cls).named_parameters())
    if sorted(a) != sorted(b) or any(not torch.equal(a[n], b[n]) for n in a):
        raise SystemExit("check %s: the shards do not hold %s's weights"
                         % (name, base))
    print("check %-16s ok (%s's %d tensors in %d shards)"
          % (name, base, len(a), len(set(index["weight_map"].values()))))


def check_one(name, expected=None):
    """Re-read DIR and its reference; recompute loss and logits from DIR."""
    import torch
    _, cls, dtype, full = MODELS[name]
    path = os.path.join(FIXTURES, name)
    meta, got = read_safetensors(path + ".ref.safetensors")
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    if config.get("torch_dtype") != dtype:
        raise SystemExit("check %s: torch_dtype %r, want %r"
                         % (name, config.get("torch_dtype"), dtype))
    model = load64(path, cls)
    params = dict(model.named_parameters())
    want = ["tokens", "targets", "loss", "logits", "adamw_losses"]
    if full:
        want += ["grad." + n for n in params] + ["final." + n for n in params]
    if sorted(got) != sorted(want):
        extra = sorted(set(got) - set(want))
        missing = sorted(set(want) - set(got))
        raise SystemExit("check %s: tensor names differ (extra %s, missing %s)"
                         % (name, extra[:4], missing[:4]))
    if full:
        for n, p in params.items():
            for pre in ("grad.", "final."):
                if tuple(got[pre + n].shape) != tuple(p.shape):
                    raise SystemExit("check %s: bad shape for %s%s"
                                     % (name, pre, n))
    V = config["vocab_size"]
    if got["tokens"].shape != (B, T) or got["targets"].shape != (B, T):
        raise SystemExit("check %s: bad batch shape" % name)
    if got["tokens"].min() < 0 or got["tokens"].max() >= V:
        raise SystemExit("check %s: token out of range" % name)
    if got["logits"].shape != (T, V) or got["adamw_losses"].shape != (STEPS,):
        raise SystemExit("check %s: bad logits or loss shape" % name)
    for n, a in got.items():
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise SystemExit("check %s: non-finite values in %s" % (name, n))
    if abs(float(got["loss"][0]) - float(got["adamw_losses"][0])) > 1e-6:
        raise SystemExit("check %s: loss != adamw_losses[0]" % name)
    tokens = torch.from_numpy(got["tokens"].astype(np.int64))
    targets = torch.from_numpy(got["targets"].astype(np.int64))
    with torch.no_grad():
        loss, logits = loss_of(model, tokens, targets)
    if abs(loss.item() / float(got["loss"][0]) - 1) > 1e-6:
        raise SystemExit("check %s: the directory's loss %.7f is not the "
                         "reference's %.7f" % (name, loss.item(),
                                               float(got["loss"][0])))
    if np.abs(f32(logits[0]) - got["logits"]).max() > 1e-5:
        raise SystemExit("check %s: logits differ from the directory's" % name)
    if expected is not None:
        tensors, metadata = expected
        for n, a in tensors:
            if not np.array_equal(got[n], a):
                raise SystemExit("check %s: %s does not round-trip" % (name, n))
        if meta != {k: str(v) for k, v in metadata.items()}:
            raise SystemExit("check %s: metadata does not round-trip" % name)
    print("check %-16s ok (%d tensors, loss %.7f)"
          % (name, len(got), float(got["loss"][0])))


# ---------------------------------------------------------------------------
# --check-export: trainrun -> export --format hf -> from_pretrained
# ---------------------------------------------------------------------------

def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stdout.write(p.stdout + p.stderr)
        raise SystemExit("check-export: `%s` exited %d"
                         % (" ".join(cmd), p.returncode))
    return p.stdout


def hf_from_trainrun(tensors, fixture, cls):
    """An HF model of the fixture's architecture holding trainrun's own
    parameters (trainrun's export --format safetensors: trainrun names and
    layout), mapped here independently of trainrun's HF exporter."""
    import torch
    model = load64(fixture, cls)
    state = {}
    for n, a in tensors.items():
        t = torch.from_numpy(np.array(a, dtype=np.float64))
        if cls == "GPT2LMHeadModel" and n.endswith(CONV1D):
            t = t.t().contiguous()  # trainrun [out,in] -> Conv1D [in,out]
        state[n] = t
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied heads are not separate tensors; causal-mask buffers are not weights
    missing = [n for n in missing
               if n != "lm_head.weight" and not n.endswith("attn.bias")]
    if missing or unexpected:
        raise SystemExit("check-export: trainrun's parameters do not map onto "
                         "%s: missing %s, unexpected %s"
                         % (cls, missing[:4], unexpected[:4]))
    return model


def write_shard(path, tokens):
    """llm.c's token shard: 256 int32 header (magic, version 1, count),
    then uint16 tokens (docs/data.md)."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 1, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def check_export_one(trainrun, name, steps, work):
    """Train `steps` steps from the fixture (0: one step at lr 0, the
    weights as loaded), export --format hf, and compare with transformers:
    trainrun's own validation loss (`trainrun eval`) against
    from_pretrained(export)'s on the same windows, and the export's logits
    against an HF model holding trainrun's checkpoint weights."""
    import torch
    import torch.nn.functional as F
    _, cls, _, _ = MODELS[name]
    fixture = os.path.join(FIXTURES, name)
    with open(os.path.join(fixture, "config.json")) as f:
        config = json.load(f)
    V, ctx, K = config["vocab_size"], 16, 4
    d = os.path.join(work, "%s-%d" % (name, steps))
    os.makedirs(d)
    rng = np.random.default_rng(SEED + steps)
    write_shard(os.path.join(d, "train.bin"), rng.integers(0, V, 64 * ctx + 1))
    val = rng.integers(0, V, K * ctx + 1)
    write_shard(os.path.join(d, "val.bin"), val)
    recipe = os.path.join(d, "recipe.lua")
    with open(recipe, "w") as f:
        f.write('return {\n'
                '  model = { from = %s, ctx = %d },\n'
                '  data = { plugin = "tokens", train = "train.bin", val = "val.bin", vocab = %d },\n'
                '  train = { steps = %d, batch = %d, seed = 7 },\n'
                '  optimizer = { type = "adamw", lr = %s },\n'
                '  run_dir = "run",\n'
                '}\n' % (json.dumps(fixture), ctx, V, max(steps, 1), K,
                         "1e-2" if steps else "0"))
    run([trainrun, "run", recipe, "--quiet"], d)
    ckpt = os.path.join(d, "run")
    out = os.path.join(d, "hf")
    raw = os.path.join(d, "raw.safetensors")
    run([trainrun, "export", ckpt, "--format", "hf", "--dtype", "fp32", "-o", out], d)
    run([trainrun, "export", ckpt, "--dtype", "fp32", "-o", raw], d)
    ev = json.loads(run([trainrun, "eval", recipe, "--checkpoint", ckpt,
                         "--batches", "all", "--json"], d).strip().splitlines()[-1])

    with open(os.path.join(out, "config.json")) as f:
        exported = json.load(f)
    fields = ["model_type", "vocab_size"] + [
        k for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads",
                    "rope_theta", "rms_norm_eps", "tie_word_embeddings",
                    "n_embd", "n_layer", "n_head", "n_positions",
                    "layer_norm_epsilon", "activation_function") if k in config]
    for k in fields:
        if exported.get(k) != config[k]:
            raise SystemExit("check-export %s: config.json %s is %r, the "
                             "fixture's %r" % (name, k, exported.get(k),
                                               config[k]))
    _, trained = read_safetensors(raw)
    mine = hf_from_trainrun(trained, fixture, cls)
    theirs = load64(out, cls)
    windows = torch.from_numpy(np.stack(
        [val[i * ctx:(i + 1) * ctx + 1] for i in range(K)]).astype(np.int64))
    tokens, targets = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        a = mine(input_ids=tokens).logits
        b = theirs(input_ids=tokens).logits
        c = load64(fixture, cls)(input_ids=tokens).logits
        loss = F.cross_entropy(b.reshape(-1, V), targets.reshape(-1)).item()
    diff = (a - b).abs().max().item()
    moved = (b - c).abs().max().item()
    rel = abs(ev["loss"] / loss - 1)
    print("check-export %-11s steps %d: from_pretrained(export) logits vs "
          "trainrun's weights: max |diff| %.2g (of max |logit| %.2f); "
          "val loss trainrun eval %.7f, transformers %.7f (rel %.1e); "
          "logits moved %.3g from the fixture's"
          % (name, steps, diff, b.abs().max().item(), ev["loss"], loss, rel,
             moved))
    if diff > 1e-5 * max(1.0, b.abs().max().item()):
        raise SystemExit("check-export %s: exported logits differ by %.3g"
                         % (name, diff))
    if rel > 1e-5 or ev["tokens"] != K * ctx:
        raise SystemExit("check-export %s: trainrun's loss %r on %r tokens, "
                         "transformers' %r on %d" % (name, ev["loss"],
                                                     ev["tokens"], loss,
                                                     K * ctx))
    if (steps > 0) != (moved > 1e-4):
        raise SystemExit("check-export %s: after %d steps the logits moved "
                         "%.3g from the fixture's" % (name, steps, moved))


def check_export(trainrun):
    trainrun = os.path.abspath(trainrun)
    work = tempfile.mkdtemp(prefix="trainrun-hf-export-")
    try:
        for name in ("tiny-llama", "tiny-llama-bf16", "tiny-llama-rope3", "tiny-qwen2",
                     "tiny-gpt2"):
            for steps in (0, 3):
                check_export_one(trainrun, name, steps, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("check-export: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="only re-read and verify the existing fixtures")
    ap.add_argument("--check-export", metavar="TRAINRUN",
                    help="round trip through trainrun's export --format hf")
    ap.add_argument("models", nargs="*", default=list(MODELS),
                    help="which fixtures (default: all)")
    args = ap.parse_args()
    for m in args.models:
        if m not in MODELS:
            ap.error("unknown fixture %s (have %s)" % (m, ", ".join(MODELS)))
    sharded = [s for s, (base, _) in SHARDED.items() if base in args.models]
    if args.check_export:
        check_export(args.check_export)
    elif args.check:
        for m in args.models:
            check_one(m)
        for m in sharded:
            check_sharded(m)
    else:
        write_llama3_freqs()
        for m in args.models:
            check_one(m, build_one(m))
        for m in sharded:
            build_sharded(m)
            check_sharded(m)


if __name__ == "__main__":
    sys.exit(main())
