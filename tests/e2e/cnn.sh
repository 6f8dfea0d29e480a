#!/bin/sh
# The digits CNN (recipes/digits-cnn.lua) through every lever: plan's exact
# FLOPs, show, smoke, a short run that learns, batch norm's running
# statistics in the checkpoint (fp32, beside the parameters), a resume and a
# recomputed run that end bit-identical to a straight run (so neither loses
# nor double-counts a running-statistics update), bf16, eval of the
# checkpoint, accumulation, the automatic micro-batch, two data-parallel
# ranks, and export.
. "$(dirname "$0")/lib.sh"
digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
[ -f "$digits" ] || skip "python3-sklearn is not installed (it ships the digits data)"
R="$TR_SRCDIR/recipes/digits-cnn.lua"

# --- plan and show: per-sample FLOPs from the shapes ------------------------------
# conv multiply-adds per sample: 8x8 positions x 32 x 9x1, 8x8 x 32 x 9x32,
# 4x4 x 64 x 9x32, 4x4 x 64 x 9x64 = 1,492,992; the head 64 x 10 = 640; x 6
"$TRAINRUN" plan "$R" > plan.txt 2>&1 || { cat plan.txt; fail "plan of the digits CNN"; }
grep -q "training FLOPs/sample .* = 8,957,952 + 3,840 = 8,961,792" plan.txt \
  || { cat plan.txt; fail "plan does not count the convolutions' FLOPs per sample"; }
grep -q "parameters P *65,834" plan.txt || { cat plan.txt; fail "plan's parameter count"; }
"$TRAINRUN" show "$R" > show.txt 2>&1 || { cat show.txt; fail "show of the digits CNN"; }
grep -q "parameters *= 65834" show.txt || { cat show.txt; fail "show's parameter count"; }

# --- smoke ---------------------------------------------------------------------------
"$TRAINRUN" --smoke "$R" 2> smoke.txt || { cat smoke.txt; fail "smoke of the digits CNN"; }
grep -q "smoke: ready to launch" smoke.txt || { cat smoke.txt; fail "smoke is not ready"; }

# --- a short run learns; the run's memory plan shows the buffers ---------------------
"$TRAINRUN" "$R" train.steps=150 train.eval_every=150 run_dir=short 2> short.txt \
  || { cat short.txt; fail "the short digits CNN run"; }
grep -q "memory plan (micro-batch 64, 65834 parameters, 384 buffer floats)" short.txt \
  || { cat short.txt; fail "the memory plan does not count the running statistics"; }
acc=$(last_metric short/metrics.jsonl val_accuracy)
echo "cnn: 150 steps, validation accuracy $acc"
less_than 0.95 "$acc" || fail "validation accuracy $acc after 150 steps is below 0.95"

# --- eval of the checkpoint: the run's number (running statistics, eval mode) -------
"$TRAINRUN" eval "$R" --checkpoint short --json > eval.json 2> eval.txt || { cat eval.txt; fail "eval"; }
run_loss=$(last_metric short/metrics.jsonl val_loss)
eval_loss=$(sed -e 's/.*"loss": *\([-0-9.e+]*\).*/\1/' eval.json)
awk -v a="$run_loss" -v b="$eval_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * a) }' \
  || fail "eval's loss $eval_loss is not the run's $run_loss"

# --- the running statistics are in the checkpoint, fp32 --------------------------------
set -- train.steps=40 checkpoint.every=10 train.eval_every=20 train.log_every=10
"$TRAINRUN" "$R" "$@" run_dir=straight --quiet
w=straight/checkpoints/step-0000000040/model.safetensors
head -c 4000 "$w" | tr -d '\000' | grep -q '"stages.1.1.bn.running":{"dtype":"F32","shape":\[2,64\]' \
  || fail "model.safetensors holds no fp32 running statistics [2,64] for stages.1.1.bn"

# --- resume from step 20: bit-identical weights and running statistics at 40 ---------
cp -r straight resumed
rm -rf resumed/checkpoints/step-0000000030 resumed/checkpoints/step-0000000040
echo step-0000000020 > resumed/checkpoints/LATEST
"$TRAINRUN" "$R" "$@" run_dir=resumed --resume auto --quiet 2> resumed.txt \
  || { cat resumed.txt; fail "resume of the digits CNN"; }
cmp "$w" resumed/checkpoints/step-0000000040/model.safetensors \
  || fail "the resumed run's weights or running statistics differ from the straight run's"

# --- recompute: the same gradients, and each batch moves the statistics once ---------
"$TRAINRUN" "$R" "$@" model.recompute=1 run_dir=recomputed 2> recomputed.txt \
  || { cat recomputed.txt; fail "the recomputed run"; }
grep -q "activation recomputation saves" recomputed.txt || { cat recomputed.txt; fail "no recompute arena"; }
cmp "$w" recomputed/checkpoints/step-0000000040/model.safetensors \
  || fail "recomputing the stages changed the weights or running statistics"

# --- bf16 ------------------------------------------------------------------------------
"$TRAINRUN" "$R" train.steps=60 train.eval_every=60 precision=bf16 run_dir=bf16 2> bf16.txt \
  || { cat bf16.txt; fail "the bf16 run"; }
acc=$(last_metric bf16/metrics.jsonl val_accuracy)
echo "cnn: bf16, 60 steps, validation accuracy $acc"
less_than 0.5 "$acc" || fail "bf16 validation accuracy $acc after 60 steps"

# --- accumulation and the automatic micro-batch: each micro-batch its own statistics ---
"$TRAINRUN" "$R" train.steps=20 train.micro_batch=16 train.eval_every=20 run_dir=accum --quiet 2> accum.txt \
  || { cat accum.txt; fail "4 micro-batches per step"; }
"$TRAINRUN" "$R" train.steps=10 train.micro_batch=auto train.memory_budget=0.003 train.eval_every=10 \
  run_dir=auto 2> auto.txt || { cat auto.txt; fail "micro_batch = auto"; }
grep -Eq "auto micro-batch: (4|8|16|32) " auto.txt || { cat auto.txt; fail "auto micro-batch did not fit the budget"; }

# --- two data-parallel ranks: gradients averaged, running statistics per rank ------------
"$TRAINRUN" "$R" train.steps=20 checkpoint.every=10 train.eval_every=20 procs=2 run_dir=two --quiet 2> two.txt \
  || { cat two.txt; fail "two ranks"; }
"$TRAINRUN" "$R" train.steps=30 checkpoint.every=10 train.eval_every=30 procs=2 run_dir=two \
  --resume auto --allow-changes --quiet 2> two-resumed.txt || { cat two-resumed.txt; fail "two ranks resumed"; }

# --- export: safetensors yes (buffers included); Hugging Face refused, clearly ------------
"$TRAINRUN" export straight -o weights.safetensors 2> export.txt || { cat export.txt; fail "export"; }
head -c 4000 weights.safetensors | tr -d '\000' | grep -q '"stages.0.0.bn.running"' \
  || fail "the export lacks the running statistics"
if "$TRAINRUN" export straight --format hf -o hf 2> hf.txt; then fail "export --format hf of a CNN"; fi
grep -q "is not a llama or gpt" hf.txt || { cat hf.txt; fail "export --format hf does not say why"; }
echo "cnn: ok"
