#!/bin/sh
# Every run evaluates on the validation split at its end: a split too small
# for one micro-batch is refused before the first step, by the run and by
# --smoke (which trains at micro-batch 1 but checks the recipe's own), not
# after training, when the error used to cost the whole run and its weights.
. "$(dirname "$0")/lib.sh"
awk 'BEGIN { for (i = 0; i < 60; i++) printf "a small text corpus for the validation check. " }' > small.txt
cat > v.lua <<'EOF2'
return {
  model = gpt { vocab = 256, ctx = 16, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "text", path = "small.txt", val_fraction = 0.01 },
  train = { steps = 5, batch = 8, log_every = 1 },
}
EOF2
msg="v.lua:3: data 'text' has 1 validation samples, fewer than one micro-batch of 8, and training evaluates on them at its end"
set +e
"$TRAINRUN" v.lua run_dir=run --quiet 2> run.txt
code=$?
set -e
[ $code -eq 1 ] || { cat run.txt; fail "a run with a validation split under one micro-batch: exit $code, not 1"; }
grep -q "$msg" run.txt || { cat run.txt; fail "the run does not say what is wrong with the validation split"; }
grep -q "train.micro_batch=N" run.txt || fail "the refusal does not say what to do"
[ ! -s run/metrics.jsonl ] || { cat run/metrics.jsonl; fail "the run trained before refusing"; }
set +e
"$TRAINRUN" --smoke v.lua 2> smoke.txt
code=$?
set -e
[ $code -eq 1 ] || { cat smoke.txt; fail "--smoke of a validation split under one micro-batch: exit $code, not 1"; }
grep -q "smoke: FAILED: $msg" smoke.txt || { cat smoke.txt; fail "--smoke does not check the validation split"; }
if grep -q "ready to launch" smoke.txt; then fail "--smoke said ready to launch"; fi
# the levers the message names work: more validation data, or a smaller micro-batch
"$TRAINRUN" v.lua data.val_fraction=0.1 run_dir=more --quiet 2> more.txt || { cat more.txt; fail "val_fraction=0.1"; }
ls more/checkpoints/step-* > /dev/null || fail "no checkpoint"
"$TRAINRUN" --smoke v.lua train.micro_batch=1 2> mb.txt || { cat mb.txt; fail "--smoke with micro_batch=1"; }
grep -q "ready to launch" mb.txt || { cat mb.txt; fail "--smoke with micro_batch=1 is not ready"; }
echo "validation: ok"
