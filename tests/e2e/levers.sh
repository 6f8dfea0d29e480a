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
grep -q "shape_bug.lua:9: linear: input features .* has 16 features but weight head.weight \[4,32\] expects 32" bug.txt \
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

# --- auto micro-batch on a memory budget -------------------------------------------------
# the tiny GPT plans 217 KiB at micro-batch 8 and 364 KiB at 16: a 0.0003 GiB
# (315 KiB, 283 KiB usable) budget must pick 8 and accumulate 8 micro-batches
"$TRAINRUN" "$C/tiny.lua" train.batch=64 train.micro_batch=auto train.memory_budget=0.0003 \
  train.steps=3 run_dir=auto 2> auto.txt || { cat auto.txt; fail "auto micro-batch run"; }
grep -q "auto micro-batch: 8 (plan 217.06 KiB of 283.12 KiB usable on train.memory_budget); 8 micro-batches per step" auto.txt \
  || { cat auto.txt; fail "auto micro-batch did not pick 8"; }
grep -q "memory plan (micro-batch 8" auto.txt || fail "the run did not use the picked size"
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
# $3600 per device-hour is $1 a second: a $0.40 budget ends the run in 0.4 s
"$TRAINRUN" "$C/tiny.lua" cost.price=3600 cost.budget=0.4 train.steps=1000000 run_dir=bud --quiet \
  2> bud.txt || { cat bud.txt; fail "a budget stop is a clean exit"; }
grep -q "budget: \$0.3[2-9] spent, 8[0-9]% of the \$0.40 budget" bud.txt || { cat bud.txt; fail "no budget warning"; }
grep -q "budget: stopping at step [0-9]*: \$0.4[0-9] spent reaches the \$0.40 budget; checkpoint saved" bud.txt \
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
if "$TRAINRUN" --smoke "$C/tiny.lua" cost.hardware=t4-16gb train.batch=1000000 2> t4.txt; then
  fail "smoke passed a model that does not fit a T4"
fi
grep -q "won't fit: .* but t4-16gb has 16.00 GiB" t4.txt || { cat t4.txt; fail "smoke ignored cost.hardware"; }
echo "levers: ok"
