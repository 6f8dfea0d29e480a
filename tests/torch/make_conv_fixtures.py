#!/usr/bin/env python3
"""PyTorch references for the convolutional ops of the CPU backend.

Writes tests/fixtures/conv/NAME.bin, one small file per case, read by
tests/test_conv.c (suite torch_fixtures).  PyTorch computes every case in
float64 from float32 inputs (so the reference is exact to float32 storage);
the file stores float32.  torch 2.5.1 (tests/torch/requirements-hf.txt);
CI never runs this script, the files are committed.

Layout: trainrun's, channel-last.  PyTorch's NCHW tensors are permuted to
NHWC (images, output and their gradients) and conv weights from
[OC, IC/groups, KH, KW] to [OC, KH, KW, IC/groups]; batch norm's running
statistics are one [2, C] array (running mean, then running variance).

File format (little-endian): int32 count, then per array a 16-byte
NUL-padded name, int32 ndim, int32 dims[ndim]; then the arrays' float32
data in the same order.  Every case holds its inputs (x, w, b, dout,
running), the forward output (out) and the gradients (dx, dw, db) of
L = sum(out * dout); batch norm in training also the running statistics
after the step (running_after).

  /path/to/venv/bin/python tests/torch/make_conv_fixtures.py
  /path/to/venv/bin/python tests/torch/make_conv_fixtures.py --check   # files are up to date
"""

import argparse
import os
import struct
import sys

import torch
import torch.nn.functional as F

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "conv")

# conv cases: B, H, W, IC, OC, KH, KW, stride, pad, dilation, groups, bias
CONVS = {
    "conv_3x3_bias": (2, 6, 5, 4, 6, 3, 3, (1, 1), (1, 1), (1, 1), 1, True),
    "conv_stride2_groups2": (2, 7, 6, 4, 6, 3, 3, (2, 2), (1, 1), (1, 1), 2, False),
    "conv_depthwise_dilation2": (2, 6, 6, 4, 4, 3, 3, (1, 1), (2, 2), (2, 2), 4, True),
    "conv_1x1_stride2": (2, 6, 6, 4, 8, 1, 1, (2, 2), (0, 0), (1, 1), 1, False),
}
# pooling cases: op, B, H, W, C, kernel, stride, pad
POOLS = {
    "maxpool_3x3_s2_p1": ("max", 2, 7, 6, 3, (3, 3), (2, 2), (1, 1)),
    "avgpool_3x3_s2_p1": ("avg", 2, 7, 6, 3, (3, 3), (2, 2), (1, 1)),
    "global_avgpool": ("global", 2, 4, 3, 5, None, None, None),
}
# batch norm: B, H, W, C, training
BNS = {
    "batchnorm_train": (2, 3, 4, 5, True),
    "batchnorm_eval": (2, 3, 4, 5, False),
}
EPS, MOMENTUM = 1e-5, 0.1


def nhwc(t):
    return t.permute(0, 2, 3, 1).contiguous()


def rand(g, *shape, lo=-1.0, hi=1.0):
    """float32 values, held in float64 for the computation"""
    return (torch.rand(*shape, generator=g, dtype=torch.float32) * (hi - lo) + lo).double()


def conv_case(g, B, H, W, IC, OC, KH, KW, stride, pad, dilation, groups, bias):
    x = rand(g, B, IC, H, W).requires_grad_()
    w = rand(g, OC, IC // groups, KH, KW).requires_grad_()
    b = rand(g, OC).requires_grad_() if bias else None
    out = F.conv2d(x, w, b, stride, pad, dilation, groups)
    dout = rand(g, *out.shape)
    (out * dout).sum().backward()
    arrays = [("x", nhwc(x)), ("w", w.detach().permute(0, 2, 3, 1)), ("dout", nhwc(dout)),
              ("out", nhwc(out.detach())), ("dx", nhwc(x.grad)), ("dw", w.grad.permute(0, 2, 3, 1))]
    if bias:
        arrays += [("b", b.detach()), ("db", b.grad)]
    return arrays


def pool_case(g, op, B, H, W, C, kernel, stride, pad):
    x = rand(g, B, C, H, W).requires_grad_()
    if op == "max":
        out = F.max_pool2d(x, kernel, stride, pad)
    elif op == "avg":
        out = F.avg_pool2d(x, kernel, stride, pad, count_include_pad=True)
    else:
        out = F.adaptive_avg_pool2d(x, 1)
    dout = rand(g, *out.shape)
    (out * dout).sum().backward()
    if op == "global":  # [B, C]
        return [("x", nhwc(x)), ("dout", dout.reshape(B, C)), ("out", out.detach().reshape(B, C)),
                ("dx", nhwc(x.grad))]
    return [("x", nhwc(x)), ("dout", nhwc(dout)), ("out", nhwc(out.detach())), ("dx", nhwc(x.grad))]


def bn_case(g, B, H, W, C, training):
    # a mean away from zero per channel, as activations have
    x = rand(g, B, C, H, W) + torch.arange(C, dtype=torch.float64).view(1, C, 1, 1)
    x = x.float().double().requires_grad_()  # exactly the float32 the file stores
    w = rand(g, C, lo=0.5, hi=1.5).requires_grad_()
    b = rand(g, C).requires_grad_()
    rm, rv = rand(g, C), rand(g, C, lo=0.5, hi=2.0)
    running = torch.stack([rm, rv])
    rm_t, rv_t = rm.clone(), rv.clone()
    out = F.batch_norm(x, rm_t, rv_t, w, b, training=training, momentum=MOMENTUM, eps=EPS)
    dout = rand(g, *out.shape)
    (out * dout).sum().backward()
    arrays = [("x", nhwc(x)), ("w", w.detach()), ("b", b.detach()), ("running", running),
              ("dout", nhwc(dout)), ("out", nhwc(out.detach())), ("dx", nhwc(x.grad)),
              ("dw", w.grad), ("db", b.grad)]
    if training:
        arrays.append(("running_after", torch.stack([rm_t, rv_t])))
    return arrays


def encode(arrays):
    head = struct.pack("<i", len(arrays))
    body = b""
    for name, t in arrays:
        t = t.detach().to(torch.float32).contiguous()
        head += struct.pack("<16s", name.encode()) + struct.pack("<i", t.dim())
        head += struct.pack("<%di" % t.dim(), *t.shape)
        body += t.numpy().astype("<f4").tobytes()
    return head + body


def cases():
    g = torch.Generator().manual_seed(20251125)
    for name, args in CONVS.items():
        yield name, conv_case(g, *args)
    for name, args in POOLS.items():
        yield name, pool_case(g, *args)
    for name, args in BNS.items():
        yield name, bn_case(g, *args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing")
    a = ap.parse_args()
    if torch.__version__.split("+")[0] != "2.5.1":
        print("make_conv_fixtures.py: torch %s, the fixtures were made with 2.5.1"
              % torch.__version__, file=sys.stderr)
    torch.use_deterministic_algorithms(True)
    os.makedirs(OUT_DIR, exist_ok=True)
    stale = 0
    for name, arrays in cases():
        data = encode(arrays)
        path = os.path.join(OUT_DIR, name + ".bin")
        if a.check:
            with open(path, "rb") as f:
                if f.read() != data:
                    print("stale: %s" % path, file=sys.stderr)
                    stale += 1
        else:
            with open(path, "wb") as f:
                f.write(data)
            print("%s: %d bytes" % (path, len(data)))
    sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
