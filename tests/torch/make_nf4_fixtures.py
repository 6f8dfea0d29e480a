"""NF4 fixtures: what bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64,
compress_statistics=True) stores for a few matrices, and what dequantize_4bit gives back,
for tests/test_nf4.c (kernels/nf4.c must reproduce both bit for bit).

    python3 tests/torch/make_nf4_fixtures.py            # writes tests/fixtures/nf4/nf4.safetensors
    python3 tests/torch/make_nf4_fixtures.py --check    # re-reads and verifies it

Versions: tests/torch/requirements-nf4.txt (bitsandbytes 0.46.1, whose CPU backend
quantises; nothing here needs a GPU).  For each case NAME the file holds NAME.w (the
fp32 input), NAME.codes (the bytes as int32: two 4-bit codes a byte, the first in the high nibble),
NAME.qabsmax (bytes as int32: each 64-block's absmax, 8-bit), NAME.absmax2 (fp32: a scale per
256 absmax values), NAME.offset (fp32 [1]: the mean absmax subtracted before) and
NAME.deq (fp32: dequantize_4bit of the above, in fp32), plus code2 (the 256-value
signed dynamic map the absmax codes index, as bitsandbytes' CPU quantiser leaves it).
"""
import argparse
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from bitsandbytes.functional import dequantize_4bit, quantize_4bit

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "nf4", "nf4.safetensors")


def cases():
    g = torch.Generator().manual_seed(1234)
    c = {}
    c["normal"] = torch.randn(64, 64, generator=g)
    w = torch.randn(24, 128, generator=g) * 0.02
    w[3, 5] = 0.9      # an outlier dominates its block
    w[7, 64:128] = 0   # a block of zeros
    c["outliers"] = w
    # values on the NF4 table and halfway between its entries (ties)
    t = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                      -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                      0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                      0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                      0.7229568362236023, 1.0])
    mids = (t[1:] + t[:-1]) / 2
    row = torch.cat([t, mids, -mids, t * 0.5, torch.zeros(1)])[:64]
    row = torch.cat([row, torch.zeros(64 - row.numel())])
    c["ties"] = torch.stack([row, row * 3.0, row * -0.25, row.flip(0)])
    c["bf16"] = (torch.randn(32, 64, generator=g) * 0.05).to(torch.bfloat16).float()
    # more than 256 blocks: several second-level scales, and a partial last one
    c["wide"] = torch.randn(257, 64, generator=g) * torch.linspace(0.01, 2.0, 257).unsqueeze(1)
    return c


def make():
    out = {}
    code2 = None
    for name, w in cases().items():
        w = w.contiguous().float()
        q, st = quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
        assert st.nested and st.blocksize == 64 and st.state2.blocksize == 256
        deq = dequantize_4bit(q, st)
        out[name + ".w"] = w
        out[name + ".codes"] = q.flatten().to(torch.int32).contiguous()  # (U8 as I32: trainrun reads F32/F16/BF16/I32)
        out[name + ".qabsmax"] = st.absmax.flatten().to(torch.int32).contiguous()
        out[name + ".absmax2"] = st.state2.absmax.float().flatten().contiguous()
        out[name + ".offset"] = st.offset.float().reshape(1)
        out[name + ".deq"] = deq.float().contiguous()
        code2 = st.state2.code.float().contiguous()
    out["code2"] = code2
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    want = make()
    if a.check:
        have = load_file(OUT)
        bad = [k for k in want if not torch.equal(want[k], have[k])]
        print("differs:", bad) if bad else print("nf4 fixtures: ok")
        sys.exit(1 if bad else 0)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(want, OUT)
    print("wrote", OUT, sum(v.numel() * v.element_size() for v in want.values()), "bytes")


if __name__ == "__main__":
    main()
