#!/bin/sh
# A run stopped by SIGTERM saves a checkpoint and exits 75; resumed, it ends
# with weights bit-identical to a run that was never interrupted.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
set -- train.steps=40 train.log_every=1 checkpoint.every=10 train.workers=2
"$TRAINRUN" "$R" "$@" run_dir=straight --quiet
# interrupted: SIGTERM partway, then resume
"$TRAINRUN" "$R" "$@" run_dir=stopped train.steps=40 > /dev/null 2>&1 &
term_after $! stopped 12
if [ $code -ne 75 ] && [ $code -ne 0 ]; then fail "SIGTERM exit code $code, expected 75"; fi
"$TRAINRUN" "$R" "$@" run_dir=stopped --resume auto --quiet
a=straight/checkpoints/$(cat straight/checkpoints/LATEST)/model.safetensors
b=stopped/checkpoints/$(cat stopped/checkpoints/LATEST)/model.safetensors
cmp "$a" "$b" || fail "resumed weights differ from the uninterrupted run"
[ "$code" -eq 75 ] && echo "resume: stopped with 75, resumed, bit-identical" || echo "resume: finished before the signal; still identical"
echo "resume: ok"
