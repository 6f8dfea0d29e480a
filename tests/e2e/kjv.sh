#!/bin/sh
# The KJV byte-level GPT learns: loss falls from ln(256) = 5.55 below 2.5 in a
# short run sized for CI, and a sample can be drawn from its checkpoint.
. "$(dirname "$0")/lib.sh"
[ -n "${BIBLE:-}" ] && [ -x "$BIBLE" ] || skip "bible-kjv is not installed (apt-get install bible-kjv)"
mkdir data
"$BIBLE" -f "Gen1:1-Rev22:21" > data/kjv.txt
"$TRAINRUN" "$TR_SRCDIR/recipes/kjv-char.lua" --quiet \
  model.layers=2 model.dim=64 model.ctx=64 train.batch=16 train.steps=300 \
  schedule.warmup=30 train.eval_every=100 train.eval_batches=8 checkpoint.every=0
first=$(grep '"loss"' runs/kjv-char/metrics.jsonl | head -n 1 | sed 's/.*"loss": *\([0-9.e+-]*\).*/\1/')
val=$(last_metric runs/kjv-char/metrics.jsonl val_loss)
echo "kjv: first logged loss $first, final validation loss $val"
less_than "$val" 2.5 || fail "validation loss $val is not below 2.5"
"$TRAINRUN" sample runs/kjv-char --prompt "In the beginning" --tokens 40 --seed 3 > sample.txt
grep -q "^In the beginning" sample.txt || fail "sample does not start with the prompt"
[ "$(wc -c < sample.txt)" -ge 56 ] || fail "sample is too short"
echo "kjv: ok"
