"""An independent safetensors reader, written from the format's spec (an
8-byte little-endian header length, a JSON header, raw little-endian data),
using only the Python standard library. Checks that half-precision exports
hold the same tensors as the fp32 file, within each format's rounding."""
import json
import math
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        count = math.prod(t["shape"])
        raw = data[begin:end]
        if t["dtype"] == "F32":
            assert end - begin == 4 * count, name
            values = struct.unpack(f"<{count}f", raw)
        elif t["dtype"] == "F16":
            assert end - begin == 2 * count, name
            values = struct.unpack(f"<{count}e", raw)
        elif t["dtype"] == "BF16":
            assert end - begin == 2 * count, name
            halves = struct.unpack(f"<{count}H", raw)
            values = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
        else:
            raise SystemExit(f"{path}: unexpected dtype {t['dtype']} for {name}")
        out[name] = (t["dtype"], t["shape"], values)
    return out


def main(fp32_path, bf16_path, fp16_path):
    ref = read(fp32_path)
    for path, dtype, rel in ((bf16_path, "BF16", 2 ** -8), (fp16_path, "F16", 2 ** -11)):
        got = read(path)
        assert set(got) == set(ref), f"{path}: tensor names differ"
        for name, (_, shape, values) in ref.items():
            gdtype, gshape, gvalues = got[name]
            assert gdtype == dtype, f"{path}: {name} is {gdtype}"
            assert gshape == shape, f"{path}: {name} shape {gshape} != {shape}"
            for a, b in zip(values, gvalues):
                assert abs(a - b) <= rel * abs(a) + 1e-7, f"{path}: {name}: {b} vs {a}"
    print(f"read {len(ref)} tensors in fp32, bf16 and fp16: consistent")


def close(a_path, b_path, tolerance, skip=None):
    """Same tensors, every value within `tolerance` (absolute); tensors whose
    name contains `skip` are compared in shape only."""
    a, b = read(a_path), read(b_path)
    assert set(a) == set(b), "tensor names differ"
    worst = 0.0
    for name, (_, shape, values) in a.items():
        assert b[name][1] == shape, f"{name}: shapes differ"
        if skip and skip in name:
            continue
        for x, y in zip(values, b[name][2]):
            worst = max(worst, abs(x - y))
    assert worst <= float(tolerance), f"largest difference {worst:.3g} > {tolerance}"
    print(f"{len(a)} tensors agree: largest difference {worst:.3g} <= {tolerance}")


if __name__ == "__main__":
    if sys.argv[1] == "close":
        close(*sys.argv[2:6])
    else:
        main(*sys.argv[1:4])
