#!/bin/sh
# Encode speed of trainrun's tokenizer against the tokenizers library on the KJV,
# one core each (wall and CPU time: the CPU time moves less on a shared machine), and a
# check that the ids are identical.  The default tokenizer.json is the byte-level test one;
# tests/fixtures/tokenizer/sp_llama2.json measures the SentencePiece-style path.
#   contrib/bench/tokenizer.sh PYTHON [build dir, default build/] [tokenizer.json]
# PYTHON: an interpreter with tokenizers and numpy (tests/torch/requirements-hf.txt).
set -e
src=$(cd "$(dirname "$0")/../.." && pwd)
py=${1:?usage: tokenizer.sh PYTHON [BUILD_DIR] [TOKENIZER_JSON]}
build=$(cd "${2:-build}" && pwd)
tok=${3:-$src/tests/fixtures/tokenizer/bpe.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bible -f "Gen1:1-Rev22:21" > "$work/kjv.txt"
${CC:-cc} -O2 -I"$src/core" -I"$src/include" -I"$build" "$src/contrib/bench/tokenizer_bench.c" \
  -o "$work/bench" "$build/.libs/libtrcore.a" "$build/.libs/libtrkernels.a" \
  $(pkg-config --libs libpcre2-8 libutf8proc luajit hwloc) -lz -ldnnl -lm -fopenmp -ldl -lpthread
echo "$(wc -c < "$work/kjv.txt") bytes, $(basename "$tok")"
taskset -c 0 "$work/bench" "$tok" "$work/kjv.txt" "$work/ids.bin"
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false taskset -c 0 "$py" "$src/contrib/bench/tokenizer_hf.py" \
  "$tok" "$work/kjv.txt" "$work/ids.bin"
