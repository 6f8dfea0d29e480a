#!/bin/sh
# Tokens/s and validation loss of the KJV recipe under each precision policy,
# the same steps and seed, one after the other on this machine.
#   contrib/bench/precision.sh [steps] [build dir]     (default 200, build/)
set -eu
steps=${1:-200}
build=$(cd "${2:-build}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir data
bible -f "Gen1:1-Rev22:21" > data/kjv.txt
printf '| precision | tokens/s | validation loss | vs fp32 |\n|---|---:|---:|---:|\n'
for p in fp32 bf16 fp16; do
  "$build/trainrun" "$src/recipes/kjv-char.lua" precision=$p train.steps="$steps" \
    train.eval_every=0 checkpoint.every=0 run_dir=$p 2> $p.log
  tok=$(sed -n 's/^run kjv-char: .* \([0-9]*\) tokens\/s$/\1/p' $p.log)
  val=$(grep '"val_loss"' $p/metrics.jsonl | tail -n 1 | sed 's/.*"val_loss": *\([0-9.e+-]*\).*/\1/')
  [ "$p" = fp32 ] && base=$val
  awk -v p=$p -v t="$tok" -v v="$val" -v b="$base" \
    'BEGIN { printf "| %s | %s | %.4f | %+.2f%% |\n", p, t, v, 100 * (v - b) / b }'
done
