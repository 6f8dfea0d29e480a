#!/bin/sh
# The cost levers as recipe lines: --smoke catches a planted shape bug, a
# missing data file and a model that won't fit, and says "ready to launch"
# otherwise; early stopping ends a run whose validation loss has plateaued.
. "$(dirname "$0")/lib.sh"
C="$TR_SRCDIR/tests/config"

# --- smoke -------------------------------------------------------------------------
"$TRAINRUN" --smoke "$C/tiny.lua" 2> ok.txt || { cat ok.txt; fail "smoke of a good recipe"; }
grep -q "smoke: ready to launch" ok.txt || fail "no 'ready to launch'"
grep -q "checkpoint round trip ok" ok.txt || fail "no checkpoint round trip"

if "$TRAINRUN" --smoke "$C/shape_bug.lua" 2> bug.txt; then fail "smoke passed a shape bug"; fi
grep -q "shape_bug.lua:9: linear: input 'features' .* has 16 features but weight 'head.weight' \[4,32\] expects 32" bug.txt \
  || { cat bug.txt; fail "shape bug message"; }
grep -q "smoke: FAILED" bug.txt || fail "no FAILED line"

if "$TRAINRUN" --smoke "$C/missing_data.lua" 2> missing.txt; then
  fail "smoke passed a missing data file"
fi
grep -q "no/such/file.txt" missing.txt || { cat missing.txt; fail "the missing file is not named"; }
grep -q "smoke: FAILED" missing.txt || fail "no FAILED line for the missing file"

# a micro-batch whose activations cannot fit an 80 GiB device (the smoke
# steps themselves run at micro-batch 1, so this stays cheap)
if "$TRAINRUN" --smoke "$C/tiny.lua" device=cuda train.batch=8000000 2> big.txt; then
  fail "smoke passed a model that does not fit"
fi
grep -q "won't fit" big.txt || { cat big.txt; fail "no won't-fit diagnosis"; }

# a recipe whose checkpoints go to S3: smoke checks its options but runs the round
# trip in a scratch directory (no bucket, server or credentials needed)
if [ -f "${TR_PLUGIN_BUILD_DIR:-}/checkpoint_s3.so" ]; then
  cat > s3.lua <<'EOF'
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 512 },
  train = { steps = 4, batch = 4 },
  checkpoint = { plugin = "s3", bucket = "team-ckpts", prefix = "runs/x",
                 endpoint = "http://127.0.0.1:9", every = 100 },
}
EOF
  TRAINRUN_PLUGIN_PATH="$TR_PLUGIN_BUILD_DIR" "$TRAINRUN" --smoke s3.lua 2> s3.txt \
    || { cat s3.txt; fail "smoke of an s3 recipe"; }
  grep -q "checkpoints go to a scratch directory, not through the recipe's 's3' plugin" s3.txt \
    || { cat s3.txt; fail "smoke does not say where its checkpoints went"; }
  grep -q "smoke: ready to launch" s3.txt || { cat s3.txt; fail "smoke of an s3 recipe is not ready"; }
  sed -e 's/bucket = /bukket = /' s3.lua > s3typo.lua
  if TRAINRUN_PLUGIN_PATH="$TR_PLUGIN_BUILD_DIR" "$TRAINRUN" --smoke s3typo.lua 2> s3typo.txt; then
    fail "smoke passed a misspelt s3 option"
  fi
  grep -q "checkpoint 's3': unknown option 'bukket'" s3typo.txt || { cat s3typo.txt; fail "the s3 options were not checked"; }
else
  echo "checkpoint_s3.so was not built: the smoke of an s3 recipe is not tried"
fi
# the recipe's own checkpoint directory is neither written nor pruned by a smoke run
"$TRAINRUN" "$C/tiny.lua" train.steps=20 checkpoint.every=10 checkpoint.dir="$PWD/real" run_dir=real-run --quiet
ls -a real > before.txt
"$TRAINRUN" --smoke "$C/tiny.lua" checkpoint.dir="$PWD/real" 2> real.txt || { cat real.txt; fail "smoke with a checkpoint.dir"; }
ls -a real | cmp -s - before.txt || { ls -a real; fail "smoke changed the recipe's checkpoint directory"; }
# micro_batch = "auto" fits when a micro-batch of 1 does (the whole batch need not);
# the validation split must hold the micro-batch it picks (the run evaluates at its end)
"$TRAINRUN" --smoke "$C/tiny.lua" device=cuda train.batch=8000000 train.micro_batch=auto \
  data.val_samples=8000000 2> auto-smoke.txt \
  || { cat auto-smoke.txt; fail "smoke of an auto micro-batch judged the whole batch"; }

# --- the advice for a loss that is not finite fits the run ---------------------------
set +e
"$TRAINRUN" "$C/tiny.lua" train.steps=5 optimizer.lr=1e30 optimizer.clip=0 run_dir=nan0 2> nan0.txt
"$TRAINRUN" "$C/tiny.lua" train.steps=5 optimizer.lr=1e30 optimizer.clip=1 run_dir=nan1 2> nan1.txt
set -e
grep -q "step 1: the loss is not finite .*lower optimizer.lr (now 1e+30), clip the gradients (optimizer.clip = 1.0)" nan0.txt \
  || { cat nan0.txt; fail "no clipping advice without clipping"; }
grep -q "gradient clipping is already on (optimizer.clip = 1): lower optimizer.lr (now 1e+30)" nan1.txt \
  || { cat nan1.txt; fail "clipping is on: the advice must not suggest it"; }
grep -q "clip the gradients" nan1.txt && fail "suggests clipping while clipping is on"
# features near the top of fp32: the initial weights already give inf, the lr is no cause
# (128 rows: the validation split holds a micro-batch of 8)
awk 'BEGIN { for (i = 0; i < 128; i++) { for (j = 0; j < 32; j++) printf "3e38,"; print i % 2 } }' > huge.csv
cat > huge.lua <<'EOF'
return {
  model = mlp { inputs = 32, hidden = { 8 }, classes = 2 },
  data = { plugin = "csv", path = "huge.csv" },
  train = { steps = 5, batch = 8 },
}
EOF
if "$TRAINRUN" huge.lua run_dir=huge 2> huge.txt; then fail "a run on inf features passed"; fi
grep -q "step 0: the loss is not finite .*no update has been applied yet, so the learning rate is not the cause: check the data" huge.txt \
  || { cat huge.txt; fail "step 0 advice"; }
grep -q "lower optimizer.lr" huge.txt && fail "lowering the lr cannot help at step 0"

# --- auto micro-batch on a memory budget -------------------------------------------------
# the tiny GPT plans 209 KiB at micro-batch 8 and 348 KiB at 16: a 0.0003 GiB
# (315 KiB, 283 KiB usable) budget must pick 8 and accumulate 8 micro-batches
"$TRAINRUN" "$C/tiny.lua" train.batch=64 train.micro_batch=auto train.memory_budget=0.0003 \
  train.steps=3 run_dir=auto 2> auto.txt || { cat auto.txt; fail "auto micro-batch run"; }
grep -q "auto micro-batch: 8 (plan 209.06 KiB of 283.12 KiB usable on train.memory_budget); 8 micro-batches per step" auto.txt \
  || { cat auto.txt; fail "auto micro-batch did not pick 8"; }
grep -q "memory plan (micro-batch 8" auto.txt || fail "the run did not use the picked size"
# bf16 stores activations in 16 bits, and auto plans each candidate that way:
# at micro-batch 16 the plan is 298 KiB under bf16 (the weights' bf16 copy
# counted), 348 KiB in fp32, so a budget with 323 KiB usable takes 16 under
# bf16 and 8 in fp32.  That holds where the CPU multiplies bf16 natively; where
# bf16 is emulated (no AVX512-BF16 or AMX-BF16, as on an AVX2-only CPU) the
# GEMMs' rounded fp32 copies in scratch take back what the 16-bit activations
# save at this size (351 KiB), and there both pick 8.
if grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo 2>/dev/null; then bf16_pick=16; else bf16_pick=8; fi
for p in fp32:8 bf16:$bf16_pick; do
  "$TRAINRUN" "$C/tiny.lua" train.batch=64 train.micro_batch=auto train.memory_budget=0.00035 \
    train.steps=1 run_dir=auto-${p%%:*} precision=${p%%:*} 2> auto16.txt \
    || { cat auto16.txt; fail "auto micro-batch under ${p%%:*}"; }
  grep -q "auto micro-batch: ${p##*:} (plan" auto16.txt \
    || { cat auto16.txt; fail "auto micro-batch under ${p%%:*} did not pick ${p##*:}"; }
done
# --smoke's fit check counts the same storage: micro-batch 16 fits that budget
# under native bf16 only
if [ "$bf16_pick" = 16 ]; then
  "$TRAINRUN" --smoke "$C/tiny.lua" train.batch=64 train.micro_batch=16 train.memory_budget=0.00035 \
    precision=bf16 2> fit16.txt || { cat fit16.txt; fail "smoke of micro-batch 16 under bf16"; }
  grep -q "smoke: fits train.memory_budget (298.06 KiB" fit16.txt || { cat fit16.txt; fail "bf16 smoke fit"; }
fi
if "$TRAINRUN" --smoke "$C/tiny.lua" train.batch=64 train.micro_batch=16 train.memory_budget=0.00035 \
  2> fit32.txt; then fail "smoke of micro-batch 16 in fp32 must not fit that budget"; fi
grep -q "won't fit: the recipe needs 348.31 KiB" fit32.txt || { cat fit32.txt; fail "fp32 smoke fit"; }
if "$TRAINRUN" "$C/tiny.lua" train.micro_batch=auto train.memory_budget=0.00001 train.steps=1 2> none.txt; then
  fail "a budget nothing fits must fail"
fi
grep -q "auto micro-batch: even a micro-batch of 1 needs" none.txt || { cat none.txt; fail "no diagnosis"; }

# --- early stopping on a plateau ---------------------------------------------------------
# lr 0 never improves the validation loss: patience 2 stops after the 3rd evaluation
"$TRAINRUN" "$C/tiny.lua" train.steps=100 train.eval_every=5 optimizer.lr=0 \
  early_stop.patience=2 run_dir=es 2> es.txt || { cat es.txt; fail "early stop run"; }
grep -q "early stop at step 15" es.txt || { cat es.txt; fail "did not stop at step 15"; }
grep -q "early stopping saved 85 of 100 steps" es.txt || { cat es.txt; fail "summary of steps saved"; }
[ "$(grep -c '"val_loss"' es/metrics.jsonl)" -eq 3 ] || fail "expected 3 evaluations"
ls es/checkpoints | grep -q step-0000000005 || fail "the best checkpoint was not kept"
# --- a budget: warn at 80%, stop cleanly with a checkpoint at the limit ------------------
# $3600 per device-hour is $1 a second: a $2 budget ends the run in 2 s.  The warning
# window (80% to 100%) is 0.4 s wide, so a step slowed by a loaded machine still lands in it.
"$TRAINRUN" "$C/tiny.lua" cost.price=3600 cost.budget=2 train.steps=1000000 run_dir=bud --quiet \
  2> bud.txt || { cat bud.txt; fail "a budget stop is a clean exit"; }
grep -q "budget: \$[0-9.]* spent, [89][0-9]% of the \$2.00 budget" bud.txt || { cat bud.txt; fail "no budget warning"; }
grep -q "budget: stopping at step [0-9]*: \$2\.[0-9][0-9] spent reaches the \$2.00 budget; checkpoint saved" bud.txt \
  || { cat bud.txt; fail "no budget stop"; }
stop=$(sed -n 's/.*stopping at step \([0-9]*\).*/\1/p' bud.txt)
[ "$(cat bud/checkpoints/LATEST)" = "step-$(printf %010d "$stop")" ] || fail "no checkpoint at the budget stop"
grep -q '"cost_usd"' bud/metrics.jsonl || fail "metrics carry no cost"
# --- the trace: step phases, and per-op timings on sampled steps ----------------------------
"$TRAINRUN" "$C/tiny.lua" train.steps=20 train.trace_every=10 run_dir=tr --quiet
if command -v python3 > /dev/null; then
  python3 - tr/trace.json <<'PY' || fail "trace.json"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["name"] for e in events}
for phase in ("data wait", "forward+backward", "optimizer", "evaluation", "checkpoint stall"):
    assert phase in names, phase
ops = [e for e in events if e.get("cat") in ("forward", "backward")]
steps = sorted({e["args"]["step"] for e in ops})
assert steps == [0, 10], steps
assert any(e["name"].startswith("attention ") and e["cat"] == "backward" for e in ops)
assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
PY
fi
# --- report: PNG plots a person can open ---------------------------------------------------
"$TRAINRUN" report bud > report.txt || fail "report"
for f in loss throughput lr cost; do
  head -c 8 "bud/report/$f.png" | od -An -c | grep -q "P   N   G" || fail "bud/report/$f.png is not a PNG"
done
# the target device comes from cost.hardware when the recipe names one
if "$TRAINRUN" --smoke "$C/tiny.lua" cost.hardware=l4-24gb train.batch=2000000 2> l4.txt; then
  fail "smoke passed a model that does not fit an L4"
fi
grep -q "won't fit: .* but l4-24gb has 24.00 GiB" l4.txt || { cat l4.txt; fail "smoke ignored cost.hardware"; }
echo "levers: ok"
