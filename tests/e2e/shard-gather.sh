#!/bin/sh
# Sharded parameters (parallel.shard = "parameters", core/engine/gather.c)
# on one short case that touches every path of the gather schedule, small
# enough for the sanitizer job (tests/e2e/sanitizers.sh runs it under ASan
# and UBSan): a Llama of 44 units over 2 ranks with recompute (backward
# gathers a segment's units again), accumulation (gradients
# reduce-scattered after every micro-batch), evaluation during the run (as
# many forwards on every rank), a checkpoint (the parameters gathered on
# rank 0) and a resume at 3 ranks; the weights stay within 1e-5 of one
# process; under bf16 and fp16 (the GEMM weights gathered in the compute
# dtype) bit-identical to sharded gradients, moving about half the bytes.
# tests/e2e/shard.sh has the whole matrix.
. "$(dirname "$0")/lib.sh"
# discarded memory faults until committed, as on the cuda backend
# (docs/testing.md): a rank touching what it gave back fails here
export TRAINRUN_CPU_DISCARD=strict
READ="$TR_SRCDIR/tests/e2e/read_safetensors.py"
LLAMA="$TR_SRCDIR/tests/config/tiny_llama.lua"
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
set -- train.steps=6 train.batch=6 train.micro_batch=1 train.threads=1 train.log_every=3 \
  train.eval_every=3 train.eval_batches=3 checkpoint.every=3 parallel.bucket_mb=0.01 \
  model.dim=64 model.ffn_dim=128 model.layers=3 model.recompute=1
"$TRAINRUN" "$LLAMA" "$@" run_dir=one --quiet > one.log 2>&1 || { cat one.log; fail "one process"; }
"$TRAINRUN" "$LLAMA" "$@" procs=2 parallel.shard=parameters run_dir=two > two.log 2>&1 ||
  { cat two.log; fail "2 ranks at shard parameters"; }
grep -q "parallel.shard = parameters, gathered unit by unit" two.log || { cat two.log; fail "not sharded"; }
python3 "$READ" close "$(weights one)" "$(weights two)" 1e-5 > /dev/null ||
  fail "2 ranks at shard parameters: not the weights of one process"
cp -r two three
echo step-0000000003 > three/checkpoints/LATEST
rm -rf three/checkpoints/step-0000000006
"$TRAINRUN" "$LLAMA" "$@" procs=3 parallel.shard=parameters run_dir=three --resume auto \
  > three.log 2>&1 || { cat three.log; fail "resume at 3 ranks"; }
grep -q "resumed from checkpoint step-0000000003" three.log || { cat three.log; fail "no resume"; }
python3 "$READ" close "$(weights two)" "$(weights three)" 1e-5 > /dev/null ||
  fail "saved at 2 ranks, resumed at 3: weights moved"
# under bf16 and fp16 the GEMM weights travel in the compute dtype
# (gather.h): the same bits as sharded gradients (whose gathers never
# happen: every rank holds the fp32 parameters), and per step about half
# the bytes of the fp32 gathers of the same run.  This Llama's parameters
# other than GEMM weights (the input embedding and the norms, in fp32) are
# 2.4% of them: (4 x 0.024 + 2 x 0.976) / 4 = 0.512 of the bytes, plus the
# padding of parts packed to the longest.
gathered() { # RUN_DIR: the gathered_bytes of its last logged step
  python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
print([json.loads(l)["gathered_bytes"] for l in open(sys.argv[1]) if '"gathered_bytes"' in l][-1])
PY
}
for prec in bf16 fp16; do
  for level in gradients parameters; do
    "$TRAINRUN" "$LLAMA" "$@" procs=2 parallel.shard=$level precision=$prec run_dir="$prec-$level" \
      > "$prec-$level.log" 2>&1 || { cat "$prec-$level.log"; fail "2 ranks at shard $level, $prec"; }
  done
  grep -q "sharded parameters gathered in $prec where only GEMMs read them" "$prec-parameters.log" ||
    { cat "$prec-parameters.log"; fail "$prec: not gathered in $prec"; }
  cmp "$(weights "$prec-gradients")" "$(weights "$prec-parameters")" ||
    fail "$prec: shard parameters is not bit-identical to shard gradients"
  python3 - "$(gathered two)" "$(gathered "$prec-parameters")" <<'PY' || fail "$prec: the gathers did not halve"
import sys
fp32, half = float(sys.argv[1]), float(sys.argv[2])
assert fp32 > 0 and 0.5 <= half / fp32 <= 0.53, (fp32, half, half / fp32)
PY
done
# the plan holds the gathered units in the compute dtype: less memory for
# the parameters under bf16 than under fp32 at shard parameters (10 units of
# 2,622 floats at once: 102 KiB in fp32, about half in bf16 with the
# staging), and the same at shard gradients (nothing gathered)
plan_params() { # PRECISION LEVEL: the plan's parameters row, in KiB
  "$TRAINRUN" plan "$LLAMA" model.dim=64 model.ffn_dim=128 model.layers=3 parallel.bucket_mb=0.01 \
    cost.hardware=h100-80gb gpus=2 parallel.shard="$2" precision="$1" > "plan-$1-$2.txt" 2>&1 ||
    { cat "plan-$1-$2.txt" >&2; fail "plan at $1, shard $2"; }
  awk '/^  parameters  / { v = $2; if ($3 == "MiB") v *= 1024; if ($3 == "B") v /= 1024; print v }' \
    "plan-$1-$2.txt"
}
python3 - "$(plan_params fp32 parameters)" "$(plan_params bf16 parameters)" \
  "$(plan_params fp32 gradients)" "$(plan_params bf16 gradients)" <<'PY' ||
import sys
f32, b16, g32, g16 = map(float, sys.argv[1:])
assert b16 < f32 - 30 and g16 == g32, (f32, b16, g32, g16)
PY
  fail "plan: the gathered units are not counted in bf16"
echo "shard-gather: ok"
