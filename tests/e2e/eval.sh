#!/bin/sh
# trainrun eval: the loss it prints for a checkpoint is the validation loss
# the run logged at that step (one evaluation, shared with the run), with
# every lever that changes numbers (micro_batch, precision, device, ranks) as
# the run had them; a fresh model is near ln(vocab), one from a Hugging Face directory
# (model = { from = DIR }) has its weights; nothing is written; --split,
# --batches and --json; clear errors for no validation split, a missing or
# damaged checkpoint and a checkpoint of another shape.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/recipes"

# a field of eval's one-line JSON object
field() { sed -n "s/.*\"$2\": *\([^,}]*\).*/\1/p" "$1"; }
# the val_loss (or another field) metrics.jsonl logged at a step
logged() { grep "^{\"step\": $2, \"val_loss\"" "$1" | sed -e "s/.*\"$3\": *\([-0-9.e+]*\).*/\1/"; }
# metrics.jsonl keeps 6 significant digits: equal to those
same6() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b
                                           exit !(b != "" && d <= 5e-6 * m) }'; }
# names, sizes and modification times of everything under a directory
snapshot() { find "$1" -exec stat -c '%n %s %Y %y' {} + | sort; }

mkdir data
if [ -n "${BIBLE:-}" ] && [ -x "$BIBLE" ]; then
  "$BIBLE" -f "Gen1:1-Exo40:38" > data/text.txt
else # any text will do: the point is equality with what the run logged
  awk 'BEGIN { srand(7); for (i = 0; i < 60000; i++) { w = ""; n = 1 + int(rand() * 7)
               for (j = 0; j < n; j++) w = w sprintf("%c", 97 + int(rand() * 26)); printf "%s%s", w, (i % 12 == 11) ? ".\n" : " " } }' > data/text.txt
fi
KJV="$R/kjv-char.lua data.path=$PWD/data/text.txt model.layers=1 model.dim=32 model.ctx=32 model.heads=2"

# ---- usage ---------------------------------------------------------------
"$TRAINRUN" help eval > help.txt
grep -q "trainrun eval RECIPE" help.txt || fail "trainrun help eval shows no usage"
"$TRAINRUN" eval --help | cmp -s - help.txt || fail "trainrun eval --help is not trainrun help eval"
grep -q "eval RECIPE" "$TR_SRCDIR/README.md" || fail "README lists no eval command"
for bad in "--split test" "--batches 0" "--batches x" "--frobnicate" "--checkpoint"; do
  set +e; "$TRAINRUN" eval $KJV $bad > /dev/null 2> usage.txt; rc=$?; set -e
  [ "$rc" = 2 ] || { cat usage.txt; fail "eval $bad: exit $rc, not 2 (usage)"; }
done
set +e; "$TRAINRUN" eval > /dev/null 2> usage.txt; rc=$?; set -e
[ "$rc" = 2 ] && grep -q "eval needs a recipe" usage.txt || fail "eval without a recipe: exit $rc"

# ---- plan says what eval needs: forward only, under training's total ------
"$TRAINRUN" plan $KJV > plan.txt 2>&1 || { cat plan.txt; fail "plan"; }
grep -q "^  eval  *[0-9.]* [KMG]*i*B  (forward only: no gradients" plan.txt ||
  { cat plan.txt; fail "plan shows no eval (forward only) memory"; }

# ---- a fresh model: near ln(256), with a warning ---------------------------
"$TRAINRUN" eval $KJV --json > fresh.json 2> fresh.txt || { cat fresh.txt; fail "eval of a fresh model"; }
grep -q "freshly initialised" fresh.txt || fail "no warning that the weights are fresh"
[ "$(field fresh.json weights)" = '"fresh"' ] || fail "fresh: weights is $(field fresh.json weights)"
loss=$(field fresh.json loss)
awk -v l="$loss" 'BEGIN { exit !(l > log(256) - 0.1 && l < log(256) + 0.1) }' ||
  fail "a fresh model's loss $loss is not within 0.1 of ln(256) = 5.545"
ppl=$(field fresh.json perplexity)
awk -v l="$loss" -v p="$ppl" 'BEGIN { d = exp(l) - p; exit !(d < 1e-4 * p && -d < 1e-4 * p) }' ||
  fail "perplexity $ppl is not exp($loss)"
[ ! -e runs ] || fail "eval of a fresh model created runs/"

# ---- a run: eval of its checkpoints = the validation loss it logged --------
# micro-batches of 4 in batches of 8: eval must evaluate micro-batches of 4 too
"$TRAINRUN" $KJV train.batch=8 train.micro_batch=4 train.steps=20 train.eval_every=10 \
  train.eval_batches=3 checkpoint.every=10 checkpoint.keep=5 run_dir=run --quiet
snapshot run > before.txt
for step in 10 20; do
  ck=run/checkpoints/$(printf 'step-%010d' $step)
  "$TRAINRUN" eval $KJV --checkpoint "$ck" --json > e$step.json 2> e$step.txt ||
    { cat e$step.txt; fail "eval of $ck"; }
  got=$(field e$step.json loss); want=$(logged run/metrics.jsonl $step val_loss)
  echo "eval: step $step: eval $got, the run logged $want"
  same6 "$got" "$want" || fail "step $step: eval says $got, the run logged val_loss $want"
  got=$(field e$step.json accuracy); want=$(logged run/metrics.jsonl $step val_accuracy)
  same6 "$got" "$want" || fail "step $step: accuracy $got, the run logged $want"
  [ "$(field e$step.json step)" = $step ] || fail "step $step: JSON step $(field e$step.json step)"
  [ "$(field e$step.json batches)" = 3 ] && [ "$(field e$step.json micro_batch)" = 4 ] &&
    [ "$(field e$step.json tokens)" = 384 ] || { cat e$step.json; fail "step $step: not 3 micro-batches of 4 x 32 tokens"; }
  # byte tokens: the loss per byte is the loss per token, in the log and in eval
  same6 "$(logged run/metrics.jsonl $step val_loss_per_byte)" "$(logged run/metrics.jsonl $step val_loss)" ||
    fail "step $step: val_loss_per_byte $(logged run/metrics.jsonl $step val_loss_per_byte) is not val_loss"
  same6 "$(field e$step.json loss_per_byte)" "$(field e$step.json loss)" ||
    fail "step $step: eval's loss_per_byte $(field e$step.json loss_per_byte) is not its loss"
done
# the run directory (through LATEST), with the recipe its checkpoint recorded
"$TRAINRUN" eval --checkpoint run --json > latest.json 2> latest.txt || { cat latest.txt; fail "eval --checkpoint run"; }
[ "$(field latest.json step)" = 20 ] || fail "eval --checkpoint run did not take LATEST (step 20)"
same6 "$(field latest.json loss)" "$(logged run/metrics.jsonl 20 val_loss)" ||
  fail "eval --checkpoint run: $(field latest.json loss) is not the logged val_loss"
# the text report says the same
"$TRAINRUN" eval $KJV --checkpoint run > latest.txt 2>&1
grep -q "loss $(awk -v l="$(field latest.json loss)" 'BEGIN { printf "%.6g", l }') nats per token" latest.txt ||
  { cat latest.txt; fail "the text report does not show the loss"; }
grep -q "accuracy" latest.txt || fail "the text report does not show the accuracy"

# ---- nothing written --------------------------------------------------------
"$TRAINRUN" eval $KJV --checkpoint run --split train --batches 2 --json > train.json
[ "$(field train.json split)" = '"train"' ] && [ "$(field train.json batches)" = 2 ] ||
  { cat train.json; fail "--split train --batches 2"; }
[ "$(field train.json loss)" != "$(field latest.json loss)" ] || fail "--split train evaluated the validation split"
"$TRAINRUN" eval $KJV --checkpoint run --batches all --json > all.json
[ "$(field all.json batches)" = "$(field all.json split_batches)" ] && [ "$(field all.json batches)" -gt 3 ] ||
  { cat all.json; fail "--batches all did not evaluate the whole split"; }
snapshot run > after.txt
cmp -s before.txt after.txt || { diff before.txt after.txt; fail "eval changed the run directory"; }
[ ! -e runs ] || fail "eval created runs/"

# ---- precision: the run's, and an override changes the number -------------
"$TRAINRUN" $KJV train.batch=8 train.steps=10 precision=bf16 run_dir=bf16 --quiet
"$TRAINRUN" eval $KJV --checkpoint bf16 --json > bf16.json
same6 "$(field bf16.json loss)" "$(logged bf16/metrics.jsonl 10 val_loss)" ||
  fail "bf16: eval $(field bf16.json loss), the run logged $(logged bf16/metrics.jsonl 10 val_loss)"
[ "$(field bf16.json precision)" = '"bf16"' ] || fail "eval did not take the run's precision"
"$TRAINRUN" eval $KJV --checkpoint bf16 precision=fp32 --json > fp32.json
[ "$(field fp32.json loss)" != "$(field bf16.json loss)" ] || fail "precision=fp32 did not change the evaluation"

# ---- device: the run's (device=cuda through the CUDA-on-CPU harness) --------
if [ -n "${TR_CUDACPU_DIR:-}" ] && [ -f "$TR_CUDACPU_DIR/backend_cuda.so" ]; then
  TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR "$TRAINRUN" $KJV device=cuda train.batch=8 train.steps=4 \
    train.eval_every=4 run_dir=cuda --quiet 2> cuda.txt || { cat cuda.txt; fail "a device=cuda run"; }
  TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR "$TRAINRUN" eval $KJV --checkpoint cuda --json > cuda.json
  [ "$(field cuda.json device)" = '"cuda"' ] || fail "eval did not take the run's device"
  same6 "$(field cuda.json loss)" "$(logged cuda/metrics.jsonl 4 val_loss)" ||
    fail "device=cuda: eval $(field cuda.json loss), the run logged $(logged cuda/metrics.jsonl 4 val_loss)"
  "$TRAINRUN" eval $KJV --checkpoint cuda device=cpu --json > cpu.json
  [ "$(field cpu.json device)" = '"cpu"' ] || fail "device=cpu did not move the evaluation"
  awk -v a="$(field cpu.json loss)" -v b="$(field cuda.json loss)" 'BEGIN { d = a - b; exit !(d < 1e-4 && -d < 1e-4) }' ||
    fail "device=cpu evaluates the device=cuda checkpoint to $(field cpu.json loss), not about $(field cuda.json loss)"
else
  echo "eval: the CUDA-on-CPU harness is not built: the device part is skipped"
fi

# ---- data parallel: one process evaluates what the ranks shared -------------
# 5 micro-batches: rank 0 evaluated 3, rank 1 2, and the loss is their mean
"$TRAINRUN" $KJV procs=2 train.batch=8 train.steps=4 train.eval_every=4 train.eval_batches=5 \
  run_dir=dp --quiet 2> dp.txt || { cat dp.txt; fail "a run of 2 ranks"; }
"$TRAINRUN" eval $KJV --checkpoint dp --json > dp.json
same6 "$(field dp.json loss)" "$(logged dp/metrics.jsonl 4 val_loss)" ||
  fail "procs=2: eval $(field dp.json loss), the ranks logged $(logged dp/metrics.jsonl 4 val_loss)"

# ---- model = { from = DIR }: the weights a run starts from --------------------
F="$TR_SRCDIR/tests/fixtures/hf"
"$TRAINRUN" eval "$F/tiny-llama.lua" --json > from.json 2> from.txt || { cat from.txt; fail "eval of model = { from = DIR }"; }
[ "$(field from.json weights)" = '"from"' ] || { cat from.json; fail "from: weights is not \"from\""; }
grep -q "freshly initialised" from.txt && fail "weights from a directory were called fresh"
# a run whose one step changes nothing (lr 0) logs the loaded weights' loss
"$TRAINRUN" "$F/tiny-llama.lua" optimizer.lr=0 train.steps=1 train.eval_every=1 run_dir=from --quiet 2> /dev/null
same6 "$(field from.json loss)" "$(logged from/metrics.jsonl 1 val_loss)" ||
  fail "from: eval $(field from.json loss), the run from the same weights logged $(logged from/metrics.jsonl 1 val_loss)"

# ---- errors ---------------------------------------------------------------------
set +e
"$TRAINRUN" eval $KJV data.val_fraction=0 2> noval.txt; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "has no validation split" noval.txt && grep -q -- "--split train" noval.txt ||
  { cat noval.txt; fail "no validation split: exit $rc"; }
set +e
"$TRAINRUN" eval $KJV --checkpoint nowhere 2> missing.txt; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "nowhere is not a checkpoint" missing.txt || { cat missing.txt; fail "missing checkpoint: exit $rc"; }
set +e
"$TRAINRUN" eval $KJV --checkpoint run model.dim=64 2> shape.txt; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "does not fit the model" shape.txt && grep -q "\[256, 32\] there but \[256, 64\]" shape.txt ||
  { cat shape.txt; fail "shape mismatch: exit $rc"; }
# a larger model's checkpoint: its first layer alone is no model to evaluate
# (another recipe file: the run's overrides, model.layers=2, do not apply)
cat > other.lua <<EOF
return {
  model = gpt { vocab = 256, ctx = 32, layers = 1, heads = 2, dim = 32 },
  data = { plugin = "text", path = "$PWD/data/text.txt", val_fraction = 0.05 },
  train = { steps = 2, batch = 8 },
}
EOF
"$TRAINRUN" $KJV model.layers=2 train.steps=2 train.batch=8 run_dir=two --quiet
set +e
"$TRAINRUN" eval other.lua --checkpoint two 2> extra.txt; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "tensors the model has not ('transformer.h.1" extra.txt ||
  { cat extra.txt; fail "a 2-layer checkpoint with a 1-layer recipe: exit $rc"; }
printf 'x' >> run/checkpoints/step-0000000020/model.safetensors
set +e
"$TRAINRUN" eval $KJV --checkpoint run 2> damaged.txt; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "fails its checksum" damaged.txt || { cat damaged.txt; fail "damaged checkpoint: exit $rc"; }

# ---- a classifier: samples and accuracy as the run logged them ---------------
digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
if [ -f "$digits" ]; then
  "$TRAINRUN" "$R/digits-mlp.lua" train.steps=40 train.eval_every=20 run_dir=digits --quiet
  "$TRAINRUN" eval "$R/digits-mlp.lua" --checkpoint digits/checkpoints/step-0000000040 --json > d.json
  same6 "$(field d.json loss)" "$(logged digits/metrics.jsonl 40 val_loss)" ||
    fail "digits: eval $(field d.json loss), the run logged $(logged digits/metrics.jsonl 40 val_loss)"
  same6 "$(field d.json accuracy)" "$(logged digits/metrics.jsonl 40 val_accuracy)" ||
    fail "digits: accuracy $(field d.json accuracy), the run logged $(logged digits/metrics.jsonl 40 val_accuracy)"
  grep -q '"tokens"' d.json && fail "a classifier reports tokens"
  echo "eval: digits accuracy $(field d.json accuracy)"
else
  echo "eval: python3-sklearn is not installed: the classifier part is skipped"
fi
echo "eval: ok"
