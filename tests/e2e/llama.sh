#!/bin/sh
# The llama builder with every lever a GPT has (tests/config/tiny_llama.lua:
# grouped-query attention, untied head):
#   - the loss falls; --smoke is ready to launch; plan counts it;
#   - recomputing every block trains to bit-identical weights;
#   - accumulating micro-batches trains as the whole batch does (to fp32
#     rounding), and micro_batch = "auto" picks one that fits a budget;
#   - bf16 GEMMs train (the loss falls too);
#   - a resumed run ends bit-identical to one never interrupted;
#   - 2 data-parallel ranks, and ZeRO-1, train to 1 process's weights.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny_llama.lua"
READ="$TR_SRCDIR/tests/e2e/read_safetensors.py"
# a run's latest weights as one fp32 file: model.safetensors, or a sharded
# checkpoint's (each rank wrote its parts, docs/scale-out.md) exported and
# kept beside the run directory
weights() {
  c="$1/checkpoints/$(cat "$1/checkpoints/LATEST")"
  if [ -f "$c/model.safetensors" ]; then echo "$c/model.safetensors"; return; fi
  "$TRAINRUN" export "$c" --dtype fp32 -o "$1.weights.safetensors" > "$1.export.log" 2>&1 ||
    { cat "$1.export.log" >&2; fail "export of $c"; }
  echo "$1.weights.safetensors"
}
first_metric() {
  grep "\"$2\"" "$1" | head -n 1 | sed -e "s/.*\"$2\": *\([-0-9.e+]*\).*/\1/"
}
set -- train.steps=30 train.batch=8 checkpoint.every=10 train.log_every=1

# --- the loss falls, in fp32 and with bf16 GEMMs --------------------------------------
for p in fp32 bf16; do
  "$TRAINRUN" "$R" "$@" precision=$p run_dir=$p --quiet
  a=$(first_metric $p/metrics.jsonl loss) b=$(last_metric $p/metrics.jsonl loss)
  less_than "$b" "$(awk -v a="$a" 'BEGIN { print a / 2 }')" ||
    fail "$p: the loss went from $a to $b, not below half"
done
cmp -s "$(weights fp32)" "$(weights bf16)" && fail "bf16 GEMMs gave fp32's weights bit for bit"

# --- smoke and plan ---------------------------------------------------------------------
"$TRAINRUN" --smoke "$R" 2> smoke.txt || { cat smoke.txt; fail "smoke of a llama"; }
grep -q "smoke: ready to launch" smoke.txt || { cat smoke.txt; fail "no 'ready to launch'"; }
"$TRAINRUN" plan "$R" > plan.txt || { cat plan.txt; fail "plan of a llama"; }
# V 37, C 16, L 2, H 4, KV 2 (D 4), F 24: P = 2*V*C + L*(2C + 2C^2 + 2*C*8 + 3*C*24) + C
grep -q "parameters P              5,104 " plan.txt || { cat plan.txt; fail "llama parameter count"; }
grep -q "6·(P - E) + 12·L·T·C = 27,072 + 3,072 = 30,144" plan.txt ||
  { cat plan.txt; fail "llama FLOPs per token"; }

"$TRAINRUN" help recipe > help.txt
grep -q "^    llama {" help.txt && grep -Eq "^      kv_heads  *= " help.txt && grep -Eq "^      ffn_dim  *= " help.txt ||
  fail "help recipe does not show the llama builder"

# --- recompute: the same weights, bit for bit -------------------------------------------
"$TRAINRUN" "$R" "$@" model.recompute=1 run_dir=recompute --quiet
cmp "$(weights fp32)" "$(weights recompute)" || fail "recompute=1 changed the weights"

# --- accumulation and an auto micro-batch -----------------------------------------------
"$TRAINRUN" "$R" "$@" train.micro_batch=2 run_dir=accum --quiet
python3 "$READ" close "$(weights fp32)" "$(weights accum)" 1e-5 ||
  fail "4 micro-batches of 2 trained to other weights than one batch of 8"
# micro-batch 4 plans 166 KiB, 8 plans 252 KiB: a 0.0002 GiB budget (189 KiB
# usable) must pick 4
"$TRAINRUN" "$R" "$@" train.micro_batch=auto train.memory_budget=0.0002 run_dir=auto 2> auto.txt ||
  { cat auto.txt; fail "auto micro-batch"; }
grep -q "auto micro-batch: 4 (plan .* of 188.74 KiB usable on train.memory_budget); 2 micro-batches" auto.txt ||
  { cat auto.txt; fail "auto micro-batch did not pick 4"; }
python3 "$READ" close "$(weights fp32)" "$(weights auto)" 1e-5 ||
  fail "the auto micro-batch trained to other weights"

# --- resume: bit-identical ----------------------------------------------------------------
cp -r fp32 resumed
rm -rf resumed/checkpoints/step-0000000030 resumed/checkpoints/step-0000000020
echo step-0000000010 > resumed/checkpoints/LATEST
"$TRAINRUN" "$R" "$@" run_dir=resumed --resume auto --quiet
cmp "$(weights fp32)" "$(weights resumed)" || fail "resumed at step 10: weights differ"

# --- data parallel and ZeRO-1 ------------------------------------------------------------
"$TRAINRUN" "$R" "$@" train.micro_batch=2 run_dir=two procs=2 --quiet
python3 "$READ" close "$(weights fp32)" "$(weights two)" 1e-5 ||
  fail "2 ranks and 1 process trained a llama to different weights"
"$TRAINRUN" "$R" "$@" train.micro_batch=2 run_dir=zero procs=2 parallel.zero=true --quiet
python3 "$READ" close "$(weights fp32)" "$(weights zero)" 1e-5 || fail "ZeRO-1 changed a llama's weights"
echo "llama: every lever ok"
