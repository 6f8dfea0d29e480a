#!/bin/sh
# How long the step loop stalls for checkpoints: the KJV recipe saving every
# 10 steps, with the background writer (async) and without it.
#   contrib/bench/checkpoint.sh [steps] [build dir]     (default 100, build/)
set -eu
steps=${1:-100}
build=$(cd "${2:-build}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir data
bible -f "Gen1:1-Rev22:21" > data/kjv.txt
printf '| writer | checkpoints | stall (share of run time) | ms per checkpoint | s per step |\n|---|---:|---:|---:|---:|\n'
for async in true false; do
  "$build/trainrun" "$src/recipes/kjv-char.lua" train.steps="$steps" train.eval_every=0 \
    checkpoint.every=10 checkpoint.keep=2 checkpoint.async=$async run_dir=a$async 2> a$async.log
  total=$(sed -n 's/^run kjv-char: [0-9]* steps in \([0-9.]*\) s.*/\1/p' a$async.log)
  share=$(sed -n 's/.*checkpoint \([0-9.]*\)%.*/\1/p' a$async.log)
  n=$((steps / 10))
  awk -v a=$async -v n=$n -v s="$share" -v t="$total" -v k="$steps" \
    'BEGIN { printf "| %s | %d | %.2f%% | %.1f | %.3f |\n", (a == "true" ? "background" : "in the step loop"), n, s, 10 * s * t / n, t / k }'
done
