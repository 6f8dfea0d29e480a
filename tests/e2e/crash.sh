#!/bin/sh
# Exact resume under SIGKILL: 10 runs killed at random moments (mid-step,
# mid-save) and resumed with --resume auto end with weights bit-identical to
# a run that was never interrupted.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
set -- train.steps=60 checkpoint.every=7 train.workers=2 train.batch=8 train.micro_batch=4 --quiet
t0=$(date +%s.%N)
"$TRAINRUN" "$R" "$@" run_dir=straight
t1=$(date +%s.%N)
span=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
want=straight/checkpoints/$(cat straight/checkpoints/LATEST)/model.safetensors
[ -f "$want" ] || fail "no final checkpoint"
trial=0
while [ $trial -lt 10 ]; do
  trial=$((trial + 1))
  dir=trial$trial
  kills=0
  # kill at random moments (scaled to an uninterrupted run's length), resume
  # each time, and after up to 3 kills let the run finish
  while :; do
    "$TRAINRUN" "$R" "$@" run_dir=$dir --resume auto 2> $dir.err &
    pid=$!
    if [ $kills -lt 3 ]; then
      delay=$(awk -v s="$trial$kills" -v t="$span" 'BEGIN { srand(s); printf "%.3f", t * (0.1 + 0.8 * rand()) }')
      sleep "$delay"
    fi
    if [ $kills -lt 3 ] && kill -9 $pid 2>/dev/null; then
      wait $pid 2>/dev/null || true
      kills=$((kills + 1))
    else
      wait $pid || { cat $dir.err; fail "trial $trial: the resumed run failed"; }
      break
    fi
  done
  got=$dir/checkpoints/$(cat $dir/checkpoints/LATEST)/model.safetensors
  cmp -s "$want" "$got" || fail "trial $trial ($kills kills): weights differ from the uninterrupted run"
  echo "trial $trial: killed $kills times, final weights bit-identical"
done
echo "crash: ok"
