#!/bin/sh
# The equal-steps comparison of aligned and random-offset training windows
# (data.windows) on the default job, recipes/kjv-char.lua (2000 steps, batch
# 32, context 128, 2 threads), for several seeds, one run after another: the
# validation loss at every evaluation of each run, then a table of the final
# ones with their mean and spread (docs/results.md#random-offset-windows).
#   contrib/bench/windows.sh [build dir, default build/] [seeds, default "1 2 3"]
# Runs go to windows-runs/ in the build dir; a run that finished is not run again.
set -e
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-build}" && pwd)
seeds=${2:-1 2 3}
cd "$build"
[ -s data/kjv.txt ] || make data/kjv.txt
final() { sed -n -e 's/.*"step": *2000, *"val_loss": *\([0-9.]*\).*/\1/p' "$1/metrics.jsonl" 2>/dev/null; }
for seed in $seeds; do
  for w in aligned random; do
    d=windows-runs/$w-s$seed
    [ -n "$(final "$d")" ] && continue
    rm -rf "$d"
    echo "== $w windows, seed $seed" >&2
    /usr/bin/time -f "$w seed $seed: wall %e s" ./trainrun "$src/recipes/kjv-char.lua" \
      data.windows=$w train.seed=$seed train.threads=2 run_dir="$d" --quiet
  done
done
printf '%-6s %-8s %-8s %s\n' seed aligned random "random - aligned"
for seed in $seeds; do
  a=$(final windows-runs/aligned-s$seed); r=$(final windows-runs/random-s$seed)
  printf '%-6s %-8s %-8s %+.4f\n' "$seed" "$a" "$r" "$(echo "$r - $a" | bc -l)"
done
for w in aligned random; do
  for seed in $seeds; do final windows-runs/$w-s$seed; done |
    awk -v w=$w '{ s += $1; q += $1 * $1; if (NR == 1 || $1 < lo) lo = $1; if (NR == 1 || $1 > hi) hi = $1 }
      END { m = s / NR; sd = NR > 1 ? sqrt((q - NR * m * m) / (NR - 1)) : 0;
            printf "%-8s mean %.4f  sd %.4f  min %.4f  max %.4f  (%d seeds)\n", w, m, sd, lo, hi, NR }'
done
