#!/bin/sh
# `trainrun prepare --tokenizer tokenizer.json` on the KJV (one document per line) with 1
# and 2 workers, against the tokenizers library's encode_batch of the same documents with
# 1 and 2 threads (RAYON_NUM_THREADS), three rounds each, and a check that the shards hold
# exactly the library's ids with the EOS after each document.
#   contrib/bench/prepare.sh PYTHON [build dir, default build/] [tokenizer.json]
# PYTHON: an interpreter with tokenizers and numpy (tests/torch/requirements-hf.txt).
# prepare's own line gives wall and CPU seconds of the encoding (and writing) phase; the
# whole command's wall time is printed too (reading, dedup and loading included).
set -e
src=$(cd "$(dirname "$0")/../.." && pwd)
py=${1:?usage: prepare.sh PYTHON [BUILD_DIR] [TOKENIZER_JSON]}
build=$(cd "${2:-build}" && pwd)
tok=${3:-$src/tests/fixtures/tokenizer/bpe.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bible -f "Gen1:1-Rev22:21" > "$work/kjv.txt"
echo "$(wc -c < "$work/kjv.txt") bytes, $(basename "$tok"), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in 1 2 3; do
  for w in 1 2; do
    t0=$(date +%s.%N)
    "$build/trainrun" prepare "$work/kjv.txt" -o "$work/out$w" --tokenizer "$tok" \
      --doc-separator line --dedup none --val-fraction 0 --workers $w > "$work/log" 2>&1
    t1=$(date +%s.%N)
    echo "trainrun $(grep -o 'tokenized .*' "$work/log"); whole command $(echo "$t1 - $t0" | bc | cut -c1-5) s"
  done
  cmp "$work/out1/train_000000.bin" "$work/out2/train_000000.bin"
  for w in 1 2; do
    RAYON_NUM_THREADS=$w "$py" - "$tok" "$work/kjv.txt" "$work/out1/train_000000.bin" <<'PY'
import os, sys, time, numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
text = open(sys.argv[2], encoding="utf-8", newline="").read()
# prepare's documents: the non-blank lines, without their line ends
docs = [l.rstrip("\r") for l in text.split("\n") if l.strip()]
c0, t0 = time.process_time(), time.perf_counter()
enc = tok.encode_batch(docs, add_special_tokens=False)
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
mb = sum(len(d.encode()) for d in docs) / 1e6
print(f"tokenizers encode_batch, {os.environ['RAYON_NUM_THREADS']} thread(s): {mb:.2f} MB in {dt:.2f} s, "
      f"{mb / dt:.1f} MB/s ({cpu:.2f} s of CPU, {mb / cpu:.1f} MB per CPU second)")
eos = tok.token_to_id("<|endoftext|>")
want = np.array([i for e in enc for i in e.ids + [eos]], dtype=np.uint16)
got = np.fromfile(sys.argv[3], dtype=np.uint16, offset=64)
if len(got) != len(want) or (got != want).any():
    sys.exit(f"DIFFER: trainrun {len(got)} ids, tokenizers {len(want)}")
PY
  done
done
echo "shards identical for 1 and 2 workers, and equal to the tokenizers library's ids + EOS"
