#!/usr/bin/env python3
"""Generate the tiny GPT-2 reference fixture for trainrun's tests.

Builds a tiny GPT-2 in PyTorch with fixed random weights and one fixed batch,
then writes tests/fixtures/tiny_gpt.safetensors holding:

  param.<name>    initial weights (F32)
  tokens, targets the batch (I32 [B,T])
  loss            mean cross-entropy of the initial weights (F32 [1])
  grad.<name>     d loss / d param (for the tied wte: both uses summed)
  adamw_losses    loss before each of the AdamW steps (F32 [steps])
  final.<name>    weights after the AdamW steps

The loss, gradients and AdamW trajectory are computed in float64 and cast
to float32, so they are exact-math references for an fp32 implementation.
AdamW is torch.optim.AdamW: p -= lr*wd*p, then
p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).

Caveat for comparisons: the key slice of each attn.c_attn.bias (columns
C..2C) has an exactly zero gradient in exact math (softmax is invariant to
adding q.b_k to a whole row). Its reference grad is ~1e-18 and its final
weights equal the initial ones, but in fp32 the gradient is rounding noise
(~1e-9) that AdamW amplifies to drifts of up to ~1e-2. Compare gradients
per tensor (max|diff| / max|ref|), and compare final.*.attn.c_attn.bias
only on the q and v slices. The drift does not change any loss.

Usage:
  python3 tests/torch/make_fixtures.py            # regenerate, then check
  python3 tests/torch/make_fixtures.py --check    # only verify the file
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

V, T, L, H, C, B = 37, 8, 2, 2, 16, 3
LR, BETA1, BETA2, EPS, WD, STEPS = 1e-2, 0.9, 0.95, 1e-8, 0.1, 10
LN_EPS = 1e-5
SEED = 1234

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_PATH = os.path.normpath(
    os.path.join(HERE, "..", "fixtures", "tiny_gpt.safetensors"))


def param_specs():
    """(name, shape, kind) in canonical order; kind picks the init."""
    specs = [("transformer.wte.weight", (V, C), "mat"),
             ("transformer.wpe.weight", (T, C), "mat")]
    for l in range(L):
        p = "transformer.h.%d." % l
        specs += [
            (p + "ln_1.weight", (C,), "lnw"),
            (p + "ln_1.bias", (C,), "bias"),
            (p + "attn.c_attn.weight", (3 * C, C), "mat"),
            (p + "attn.c_attn.bias", (3 * C,), "bias"),
            (p + "attn.c_proj.weight", (C, C), "mat"),
            (p + "attn.c_proj.bias", (C,), "bias"),
            (p + "ln_2.weight", (C,), "lnw"),
            (p + "ln_2.bias", (C,), "bias"),
            (p + "mlp.c_fc.weight", (4 * C, C), "mat"),
            (p + "mlp.c_fc.bias", (4 * C,), "bias"),
            (p + "mlp.c_proj.weight", (C, 4 * C), "mat"),
            (p + "mlp.c_proj.bias", (C,), "bias"),
        ]
    specs += [("transformer.ln_f.weight", (C,), "lnw"),
              ("transformer.ln_f.bias", (C,), "bias")]
    return specs


# ---------------------------------------------------------------------------
# Model (explicit math; params is a dict name -> tensor)
# ---------------------------------------------------------------------------

def forward(params, tokens, targets):
    import torch
    import torch.nn.functional as F

    def lin(x, name):
        return x @ params[name + ".weight"].t() + params[name + ".bias"]

    def ln(x, name):
        return F.layer_norm(x, (C,), params[name + ".weight"],
                            params[name + ".bias"], LN_EPS)

    wte = params["transformer.wte.weight"]
    wpe = params["transformer.wpe.weight"]
    x = wte[tokens.long()] + wpe[:T]                      # [B,T,C]
    hs = C // H
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        p = "transformer.h.%d." % l
        qkv = lin(ln(x, p + "ln_1"), p + "attn.c_attn")   # [B,T,3C]
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
        # head h uses columns h*hs .. (h+1)*hs
        q = q.reshape(B, T, H, hs).transpose(1, 2)        # [B,H,T,hs]
        k = k.reshape(B, T, H, hs).transpose(1, 2)
        v = v.reshape(B, T, H, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)   # [B,H,T,T]
        att = att.masked_fill(~mask, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)    # heads concatenated
        x = x + lin(y, p + "attn.c_proj")
        hmid = F.gelu(lin(ln(x, p + "ln_2"), p + "mlp.c_fc"),
                      approximate="tanh")
        x = x + lin(hmid, p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    logits = x @ wte.t()                                  # tied head
    return F.cross_entropy(logits.reshape(B * T, V),
                           targets.long().reshape(B * T))


def make_inputs():
    import torch
    g = torch.Generator().manual_seed(SEED)
    params = {}
    for name, shape, kind in param_specs():
        if kind == "mat":
            t = torch.randn(shape, generator=g) * 0.2
        elif kind == "lnw":
            t = torch.rand(shape, generator=g) + 0.5
        else:
            t = torch.randn(shape, generator=g) * 0.1
        params[name] = t.to(torch.float32).contiguous()
    tokens = torch.randint(0, V, (B, T), generator=g).to(torch.int32)
    targets = torch.randint(0, V, (B, T), generator=g).to(torch.int32)
    return params, tokens, targets


def loss_and_grads(params0, tokens, targets, dtype):
    import torch
    params = {n: t.detach().to(dtype).clone().requires_grad_(True)
              for n, t in params0.items()}
    loss = forward(params, tokens, targets)
    loss.backward()
    return loss.detach(), {n: p.grad.detach() for n, p in params.items()}


def run_adamw(params0, tokens, targets, dtype):
    import torch
    params = {n: t.detach().to(dtype).clone().requires_grad_(True)
              for n, t in params0.items()}
    names = [n for n, _, _ in param_specs()]
    decay = [params[n] for n in names if params[n].dim() >= 2]
    no_decay = [params[n] for n in names if params[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WD},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = forward(params, tokens, targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses, {n: p.detach() for n, p in params.items()}


# ---------------------------------------------------------------------------
# safetensors writer / reader (by hand; numpy only)
# ---------------------------------------------------------------------------

_DT = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4")}


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, numpy array of float32 or int32)."""
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs, off = [], 0
    for name, arr in tensors:
        if arr.dtype == np.float32:
            dt = "F32"
        elif arr.dtype == np.int32:
            dt = "I32"
        else:
            raise ValueError("%s: unsupported dtype %s" % (name, arr.dtype))
        raw = np.ascontiguousarray(arr, dtype=_DT[dt]).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * ((-(8 + len(hdr))) % 8)       # data starts 8-byte aligned
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    if n % 8 != 0:
        raise ValueError("header length %d not a multiple of 8" % n)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    out, end_max = {}, 0
    for name, info in sorted(header.items(),
                             key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = info["data_offsets"]
        if b != end_max:
            raise ValueError("%s: offsets not contiguous" % name)
        dt = _DT[info["dtype"]]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        if e - b != count * dt.itemsize:
            raise ValueError("%s: size mismatch" % name)
        out[name] = np.frombuffer(body[b:e], dtype=dt).reshape(info["shape"])
        end_max = e
    if end_max != len(body):
        raise ValueError("trailing bytes after data section")
    return meta, out


# ---------------------------------------------------------------------------

def build():
    import torch
    torch.manual_seed(SEED)
    params, tokens, targets = make_inputs()
    names = [n for n, _, _ in param_specs()]

    loss64, grads64 = loss_and_grads(params, tokens, targets, torch.float64)
    loss32, grads32 = loss_and_grads(params, tokens, targets, torch.float32)
    losses64, final64 = run_adamw(params, tokens, targets, torch.float64)
    losses32, final32 = run_adamw(params, tokens, targets, torch.float32)

    # Report how far PyTorch's own fp32 result is from the float64 reference.
    def rel(a, b):
        a, b = a.double(), b.double()
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    print("fp32 vs fp64: loss rel %.2e" % abs(loss32.item() / loss64.item() - 1))
    print("fp32 vs fp64: max grad rel %.2e"
          % max(rel(grads32[n], grads64[n]) for n in names))
    print("fp32 vs fp64: max adamw loss rel %.2e"
          % max(abs(a / b - 1) for a, b in zip(losses32, losses64)))
    print("fp32 vs fp64: max final weight rel %.2e"
          % max(rel(final32[n], final64[n]) for n in names))

    f32 = lambda t: t.detach().to(torch.float32).cpu().numpy()
    tensors = [("param." + n, f32(params[n])) for n in names]
    tensors += [("tokens", tokens.numpy().astype(np.int32)),
                ("targets", targets.numpy().astype(np.int32)),
                ("loss", np.array([loss64.item()], dtype=np.float32))]
    tensors += [("grad." + n, f32(grads64[n])) for n in names]
    tensors += [("adamw_losses", np.array(losses64, dtype=np.float32))]
    tensors += [("final." + n, f32(final64[n])) for n in names]
    metadata = {"V": V, "T": T, "L": L, "H": H, "C": C, "B": B,
                "lr": repr(LR), "beta1": repr(BETA1), "beta2": repr(BETA2),
                "eps": repr(EPS), "weight_decay": repr(WD), "steps": STEPS}
    write_safetensors(OUT_PATH, tensors, metadata)
    print("wrote %s (%d bytes), torch %s"
          % (os.path.relpath(OUT_PATH), os.path.getsize(OUT_PATH),
             torch.__version__))
    print("loss %.7f" % loss64.item())
    for n in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
              "transformer.ln_f.weight"):
        print("max|grad.%s| = %.6e" % (n, grads64[n].abs().max().item()))
    print("adamw_losses", " ".join("%.6f" % x for x in losses64))
    return tensors, metadata


def check(expected=None):
    meta, got = read_safetensors(OUT_PATH)
    names = [n for n, _, _ in param_specs()]
    want = (["param." + n for n in names] + ["tokens", "targets", "loss"]
            + ["grad." + n for n in names] + ["adamw_losses"]
            + ["final." + n for n in names])
    if sorted(got) != sorted(want):
        raise SystemExit("check: tensor names differ")
    for k in ("V", "T", "L", "H", "C", "B", "lr", "beta1", "beta2", "eps",
              "weight_decay", "steps"):
        if k not in meta:
            raise SystemExit("check: metadata %s missing" % k)
    shapes = {n: s for n, s, _ in param_specs()}
    for n in names:
        for pre in ("param.", "grad.", "final."):
            if tuple(got[pre + n].shape) != shapes[n]:
                raise SystemExit("check: bad shape for %s%s" % (pre, n))
    if got["tokens"].shape != (B, T) or got["targets"].shape != (B, T):
        raise SystemExit("check: bad batch shape")
    if got["adamw_losses"].shape != (STEPS,) or got["loss"].shape != (1,):
        raise SystemExit("check: bad loss shape")
    if got["tokens"].min() < 0 or got["tokens"].max() >= V:
        raise SystemExit("check: token out of range")
    for n, a in got.items():
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise SystemExit("check: non-finite values in %s" % n)
    if expected is not None:
        tensors, metadata = expected
        for n, a in tensors:
            if not np.array_equal(got[n], a):
                raise SystemExit("check: %s does not round-trip" % n)
        if meta != {k: str(v) for k, v in metadata.items()}:
            raise SystemExit("check: metadata does not round-trip")
    if abs(float(got["loss"][0]) - float(got["adamw_losses"][0])) > 1e-6:
        raise SystemExit("check: loss != adamw_losses[0]")
    print("check: ok (%d tensors)" % len(got))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="only re-read and verify the existing fixture")
    args = ap.parse_args()
    if args.check:
        check()
    else:
        check(build())


if __name__ == "__main__":
    sys.exit(main())
