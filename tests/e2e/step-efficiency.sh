#!/bin/sh
# Step efficiency, the throughput check of `make check`: a GPT training step's
# achieved GFLOP/s (FLOPs from `trainrun plan`'s count, time from the run's
# metrics) as a fraction of the fp32 GEMM ceiling (oneDNN sgemm at 2048^3,
# contrib/bench/gemm_ceiling.c) measured in the same script, before and
# after the step run, on the same threads.  A ratio, not a time: a loaded
# or slower machine moves both, so no absolute timing can make it flaky.
#
# Prints "step efficiency: X% of the fp32 GEMM ceiling (Y of Z GFLOP/s, CPU
# ...)" into the log, and fails only below a generous floor: half the figure
# tests/e2e/step-efficiency.tsv records for this CPU's ISA level (measured
# up to three times when below it: other tests run beside this one).  To
# show it can tell a slow path, the same measurement of a forced slow path
# (oneDNN's SSE4.1 kernels on one thread, set for trainrun alone) must come
# out under 60% of the normal path's efficiency.
#
# Environment: STEP_EFFICIENCY_FLOOR=PCT replaces the floor (a one-off:
# STEP_EFFICIENCY_FLOOR=99 fails on any machine).
. "$(dirname "$0")/lib.sh"
: "${TR_BUILDDIR:?run through make check}"
ceiling=$TR_BUILDDIR/contrib/bench/gemm_ceiling
table=$TR_SRCDIR/tests/e2e/step-efficiency.tsv
[ -x "$ceiling" ] || fail "$ceiling is not built"
threads=2
# the 6 x 384 GPT of contrib/bench/cpu_bf16.sh (vocab 256, ctx 256, batch 8)
shape="model.vocab=256 model.ctx=256 model.layers=6 model.heads=6 model.dim=384"
recipe=$TR_SRCDIR/contrib/bench/gpt-bench.lua

# ---- the CPU's ISA level and its recorded figure
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
case " $flags " in
  *" avx512f "*) isa=avx512 ;;
  *" avx2 "*" fma "* | *" fma "*" avx2 "*) isa=avx2 ;;
  *) isa=default ;;
esac
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
recorded=$(awk -v k="$isa" '$1 == k { print $2; exit }' "$table")
[ -n "$recorded" ] || recorded=$(awk '$1 == "default" { print $2; exit }' "$table")
[ -n "$recorded" ] || fail "$table has no figure for $isa and no default"
floor=$(awk -v r="$recorded" 'BEGIN { printf "%.1f", r / 2 }')
why="half of the $recorded% recorded for $isa in tests/e2e/step-efficiency.tsv"
if [ -n "${STEP_EFFICIENCY_FLOOR:-}" ]; then
  floor=$STEP_EFFICIENCY_FLOOR
  why="STEP_EFFICIENCY_FLOOR"
fi

# ---- measurements
ceil() { "$ceiling" "$threads" fp32 || fail "gemm_ceiling failed"; }

# best_step DIR WARMUP: the fastest timed step of a run, in seconds, from the
# elapsed_s of its metrics lines (one per step); steps after WARMUP only
best_step() {
  awk -v warm="$2" '
    match($0, /"step": *[0-9]+/) {
      s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s)
      if (!match($0, /"elapsed_s": *[0-9.e+-]+/)) next
      e = substr($0, RSTART, RLENGTH); sub(/.*: */, "", e)
      if (s + 0 > warm && (s - 1) in at) { d = e - at[s - 1]; if (best == "" || d < best) best = d }
      at[s] = e
    }
    END { if (best == "") exit 1; printf "%.6f\n", best }' "$1/metrics.jsonl" ||
    fail "$1: no timed steps in metrics.jsonl"
}

# flops_per_step ARGS...: the plan's training FLOPs per token x tokens per step
flops_per_step() {
  "$TRAINRUN" plan "$recipe" $shape "$@" > plan.txt 2>&1 || { cat plan.txt; fail "trainrun plan failed"; }
  awk '/training FLOPs\/token/ { sub(/ *\(.*/, ""); n = $NF; gsub(",", "", n); f = n }
       /tokens per step/ { t = $4; gsub(",", "", t) }
       END { if (f == "" || t == "") exit 1; printf "%.0f\n", f * t }' plan.txt ||
    { cat plan.txt; fail "no FLOPs/token or tokens per step in the plan"; }
}

# step_gflops DIR WARMUP STEPS BATCH THREADS [ENV=VALUE...]: a run's best
# step in GFLOP/s
step_gflops() {
  dir=$1 warm=$2 steps=$3 batch=$4 thr=$5
  shift 5
  env "$@" "$TRAINRUN" "$recipe" $shape train.batch="$batch" train.steps=$((warm + steps)) \
    train.threads="$thr" run_dir="$dir" > "$dir.txt" 2>&1 || { cat "$dir.txt"; fail "$dir: trainrun failed"; }
  flops=$(flops_per_step train.batch="$batch")
  secs=$(best_step "$dir" "$warm")
  awk -v f="$flops" -v s="$secs" 'BEGIN { printf "%.1f\n", f / s / 1e9 }'
}

# measure: one step-efficiency measurement into $pct ($step of $top GFLOP/s).
# make check runs other tests beside this one, so a measurement can fall on
# a busy moment: a result below the floor is measured again, up to three
# times in all, and the best counts (a real regression fails every time).
measure() {
  c1=$(ceil)
  step=$(step_gflops "step$1" 2 5 8 "$threads")
  c2=$(ceil)
  # the better ceiling: the machine at its best during the measurement
  top=$(awk -v a="$c1" -v b="$c2" 'BEGIN { print (a > b ? a : b) }')
  pct=$(awk -v s="$step" -v c="$top" 'BEGIN { printf "%.1f", 100 * s / c }')
  echo "step efficiency: $pct% of the fp32 GEMM ceiling ($step of $top GFLOP/s, CPU $isa: $cpu, $threads threads; ceiling before/after the steps $c1/$c2); floor $floor% ($why); load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
best=
for attempt in 1 2 3; do
  measure "$attempt"
  if [ -z "$best" ] || less_than "$best" "$pct"; then best=$pct; fi
  less_than "$best" "$floor" || break
done
pct=$best

# ---- it can fail: a forced slow path (oneDNN's SSE4.1 kernels on one
# thread), measured the same way, must come out well below the normal path
# (under 60% of its efficiency; on this test's CPUs it is a fraction of
# that), so a slowdown of that size is visible to the check.  Not on a CPU
# without AVX, where SSE4.1 is no slower path.
if [ "$isa" != default ] && [ -z "${STEP_EFFICIENCY_FLOOR:-}" ]; then
  limit=$(awk -v p="$pct" 'BEGIN { printf "%.1f", 0.6 * p }')
  for attempt in 1 2 3; do
    slow=$(step_gflops "slow$attempt" 1 2 2 1 ONEDNN_MAX_CPU_ISA=SSE41)
    slow_pct=$(awk -v s="$slow" -v c="$top" 'BEGIN { printf "%.1f", 100 * s / c }')
    echo "forced slow path (oneDNN SSE4.1 kernels, 1 thread, batch 2): $slow_pct% of the ceiling ($slow GFLOP/s); must be below $limit%"
    less_than "$slow_pct" "$limit" && break
    [ "$attempt" = 3 ] &&
      fail "the forced slow path reached $slow_pct%, not below $limit% (60% of the normal path's $pct%): the check could not tell them apart"
  done
fi

# to_ci TEXT: into the CI log too (make check's stderr, fd 9: AM_TESTS_FD_REDIRECT), pass or fail
to_ci() { { echo "step-efficiency.sh: $1" >&9; } 2> /dev/null || true; }
to_ci "step efficiency $pct% of the fp32 GEMM ceiling (floor $floor%; $top GFLOP/s ceiling, CPU $isa: $cpu)"
less_than "$pct" "$floor" &&
  fail "step efficiency $pct% (best of three) is below the floor of $floor% ($why): a throughput regression, or a machine too loaded to measure (load average $(cut -d' ' -f1 /proc/loadavg))"
echo "step efficiency: $pct% >= floor $floor%"
