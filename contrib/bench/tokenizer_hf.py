"""The tokenizers library's encode speed on the same text, one thread, whole text and
line by line; with IDS.bin (from tokenizer_bench) it checks the ids are identical.
    tokenizer_hf.py TOKENIZER.json TEXT [IDS.bin]"""
import sys, time, numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1]); text = open(sys.argv[2], encoding="utf-8", newline="").read()
for r in range(3):
    t0, c0 = time.perf_counter(), time.process_time()
    ids = tok.encode(text, add_special_tokens=False).ids
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print(f"tokenizers encode: {len(ids)} ids in {dt:.3f} s = {len(text.encode())/dt/1e6:.2f} MB/s"
          f" (CPU time {dc:.3f} s = {len(text.encode())/dc/1e6:.2f} MB/s)", file=sys.stderr)
lines = text.splitlines(keepends=True)
for r in range(3):
    t0, c0 = time.perf_counter(), time.process_time()
    enc = tok.encode_batch(lines, add_special_tokens=False)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print(f"tokenizers encode_batch of {len(lines)} lines: {sum(len(e.ids) for e in enc)} ids in {dt:.3f} s = "
          f"{len(text.encode())/dt/1e6:.2f} MB/s (CPU time {dc:.3f} s = {len(text.encode())/dc/1e6:.2f} MB/s)",
          file=sys.stderr)
if len(sys.argv) < 4:
    sys.exit(0)
c = np.fromfile(sys.argv[3], dtype=np.int32)
print("identical" if len(c) == len(ids) and (c == np.array(ids)).all() else f"DIFFER c={len(c)} hf={len(ids)}", file=sys.stderr)
