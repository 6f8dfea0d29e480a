#!/bin/sh
# Precision policies: fp16 gradients that overflow are skipped, the loss
# scale backs off and training recovers; a scale that collapses stops the
# run with a diagnosis; the scale is checkpointed; bf16 and fp16 reach the
# fp32 validation loss within 2%, bf16 natively or emulated alike; doctor,
# plan and the run say which bf16 GEMMs run; a policy field the device does
# not honour (tf32 on the cpu) is refused when the run or plan starts, and a
# plan for device=cuda prices tf32 at the tf32 tensor-core peak.
. "$(dirname "$0")/lib.sh"
C="$TR_SRCDIR/tests/config"

# at 2^24 the scaled logit gradients (about 2^24/32) overflow fp16's 65504
"$TRAINRUN" "$C/tiny.lua" precision.plugin=fp16 precision.init_scale=16777216 \
  train.steps=60 train.log_every=1 run_dir=ov 2> ov.txt || { cat ov.txt; fail "fp16 run with overflows"; }
skipped=$(last_metric ov/metrics.jsonl skipped_steps)
scale=$(last_metric ov/metrics.jsonl loss_scale)
echo "fp16 from 2^24: $skipped steps skipped, scale now $scale"
[ "$skipped" -ge 1 ] && [ "$skipped" -le 10 ] || fail "expected 1..10 skipped steps, got $skipped"
want=$(awk -v n="$skipped" 'BEGIN { printf "%.6g", 16777216 / 2 ^ n }')
[ "$scale" = "$want" ] || fail "scale $scale, expected 2^24 / 2^$skipped = $want"
grep -q "$skipped steps skipped for non-finite gradients" ov.txt || fail "summary does not count skipped steps"
first=$(grep '"loss"' ov/metrics.jsonl | sed -n "$((skipped + 2))p" | sed 's/.*"loss": *\([0-9.e+-]*\).*/\1/')
final=$(last_metric ov/metrics.jsonl loss)
less_than "$final" "$first" || fail "training did not recover: loss $first -> $final"
grep -q '"precision": {"scale": ' ov/checkpoints/step-0000000060/state.json || fail "the scale is not checkpointed"

# the scale may not fall below min_scale: the run stops and says why
if "$TRAINRUN" "$C/tiny.lua" precision.plugin=fp16 precision.init_scale=16777216 \
     precision.min_scale=16777216 train.steps=5 run_dir=collapse 2> collapse.txt; then
  fail "a collapsed loss scale must stop the run"
fi
grep -q "fp16 loss scale collapsed" collapse.txt || { cat collapse.txt; fail "no collapse diagnosis"; }

# the same run in each policy
for p in fp32 bf16 fp16; do
  "$TRAINRUN" "$C/tiny.lua" precision=$p train.steps=100 train.eval_batches=16 run_dir=$p --quiet
done
f32=$(last_metric fp32/metrics.jsonl val_loss)
for p in bf16 fp16; do
  v=$(last_metric $p/metrics.jsonl val_loss)
  echo "validation loss: fp32 $f32, $p $v"
  awk -v a="$v" -v b="$f32" 'BEGIN { d = (a - b) / b; exit !(d < 0.02 && d > -0.02) }' \
    || fail "$p validation loss $v is not within 2% of fp32's $f32"
  cmp -s fp32/checkpoints/LATEST $p/checkpoints/LATEST || fail "$p saved another checkpoint step"
  a=fp32/checkpoints/$(cat fp32/checkpoints/LATEST)/model.safetensors
  b=$p/checkpoints/$(cat $p/checkpoints/LATEST)/model.safetensors
  cmp -s "$a" "$b" && fail "$p trained bit-identical weights to fp32: the policy was not applied"
done
# bf16 GEMMs run natively where oneDNN has AVX512-BF16 or AMX-BF16, emulated
# elsewhere and where ONEDNN_MAX_CPU_ISA turns those off (AVX2: on any x86
# CPU); doctor, plan and the run's first line say which.  The emulation
# multiplies the same bf16 numbers, so it trains to the same loss.
if grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo 2>/dev/null; then
  path="bf16 GEMMs: native ("
else
  path="bf16 GEMMs: emulated on this CPU"
fi
"$TRAINRUN" doctor > doctor.txt 2>&1 || true
grep -qF "$path" doctor.txt || { cat doctor.txt; fail "doctor does not say '$path'"; }
grep -q "fp16 GEMMs: emulated .*slower than fp32" doctor.txt || { cat doctor.txt; fail "doctor: fp16 path"; }
ONEDNN_MAX_CPU_ISA=AVX2 "$TRAINRUN" doctor > doctor-avx2.txt 2>&1 || true
grep -q "bf16 GEMMs: emulated on this CPU .*slower than fp32" doctor-avx2.txt \
  || { cat doctor-avx2.txt; fail "doctor under ONEDNN_MAX_CPU_ISA=AVX2 does not say bf16 is emulated"; }
"$TRAINRUN" plan "$C/tiny.lua" precision=bf16 > plan.txt
grep -qF "(device=cpu on this machine: $path" plan.txt || { cat plan.txt; fail "plan does not say '$path'"; }
"$TRAINRUN" plan "$C/tiny.lua" precision=fp32 > plan32.txt
! grep -q "GEMMs:" plan32.txt || fail "an fp32 plan speaks of half-precision GEMMs"
"$TRAINRUN" "$C/tiny.lua" precision=bf16 train.steps=2 run_dir=first 2> first.txt
head -n 1 first.txt | grep -qF "$path" || { cat first.txt; fail "the run's first line does not say '$path'"; }
ONEDNN_MAX_CPU_ISA=AVX2 "$TRAINRUN" "$C/tiny.lua" precision=bf16 train.steps=100 \
  train.eval_batches=16 run_dir=bf16-emulated 2> emulated.txt
head -n 1 emulated.txt | grep -q "bf16 GEMMs: emulated on this CPU" \
  || { cat emulated.txt; fail "the emulated run's first line does not say so"; }
v=$(last_metric bf16/metrics.jsonl val_loss)
e=$(last_metric bf16-emulated/metrics.jsonl val_loss)
echo "validation loss: bf16 $v, bf16 emulated $e"
awk -v a="$v" -v b="$e" 'BEGIN { d = (a - b) / b; exit !(d < 0.002 && d > -0.002) }' \
  || fail "bf16 ($v) and emulated bf16 ($e) validation losses differ by 0.2% or more"
# bf16 GEMMs, native or not, are cut into a fixed grid of tiles: the same
# weights for any thread count (512 rows of activations: several tiles)
for t in 1 3; do
  "$TRAINRUN" "$C/tiny.lua" precision=bf16 model.dim=128 model.ctx=64 model.heads=4 \
    train.batch=8 train.steps=5 train.threads=$t run_dir=threads$t --quiet
done
cmp -s threads1/checkpoints/step-0000000005/model.safetensors \
  threads3/checkpoints/step-0000000005/model.safetensors \
  || fail "bf16 training gave other weights on 3 threads than on 1"
# a checkpoint written under bf16 resumes under fp32: the format holds fp32 master weights
# (another precision alters training: the resume names it and needs --allow-changes)
"$TRAINRUN" "$C/tiny.lua" precision=fp32 train.steps=120 train.eval_batches=16 run_dir=bf16 \
  --resume auto --allow-changes 2> mixed.txt || { cat mixed.txt; fail "fp32 resume of a bf16 checkpoint"; }
grep -q 'precision.plugin: "bf16" -> "fp32"' mixed.txt || { cat mixed.txt; fail "the precision change was not named"; }
grep -q "resumed from checkpoint step-0000000100" mixed.txt || { cat mixed.txt; fail "did not resume"; }
# tf32: the cpu backend runs no tf32 GEMMs, so a run and a plan refuse it at
# the start, naming the recipe line, the field, the device and what to do
cat > tf32.lua <<'EOF2'
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 512 },
  precision = { plugin = "fp32", tf32 = true },
  train = { steps = 4, batch = 4 },
}
EOF2
for cmd in "" plan; do
  if "$TRAINRUN" $cmd tf32.lua run_dir=tf32 2> tf32.txt > /dev/null; then
    fail "'trainrun $cmd' accepted allow_tf32 = true"
  fi
  grep -q "tf32.lua:4: precision 'fp32' asks for allow_tf32 = true, which device 'cpu' cannot honour" \
    tf32.txt || { cat tf32.txt; fail "'trainrun $cmd': no clear tf32 refusal"; }
  grep -q "remove allow_tf32" tf32.txt || { cat tf32.txt; fail "the tf32 refusal says not what to do"; }
done
[ ! -e tf32/metrics.jsonl ] || fail "a refused policy trained"
# on device=cuda the same recipe plans (no GPU needed) at the tf32 peak
"$TRAINRUN" plan tf32.lua device=cuda cost.hardware=a100-80gb > tf32-plan.txt 2>&1 ||
  { cat tf32-plan.txt; fail "plan refused tf32 on device=cuda"; }
grep -q "tf32 peak 156" tf32-plan.txt || { cat tf32-plan.txt; fail "the cuda plan did not price the tf32 peak"; }
# and the plugin list says what every policy gets
"$TRAINRUN" plugins precision > list.txt
grep -q "Every backend keeps master weights, optimizer state and gradients in fp32" \
  list.txt || { cat list.txt; fail "'trainrun plugins precision' does not say what runs in fp32"; }
grep -q "store the activations in" list.txt \
  || { cat list.txt; fail "'trainrun plugins precision' does not say where activations are stored"; }
# 16-bit policies store the activations in 16 bits: plan and the run say so
grep -q "the cpu backend's plan, activations in bf16 storage)" plan.txt \
  || { cat plan.txt; fail "the bf16 plan does not say it counts bf16 activations"; }
grep -q "the cpu backend's plan, activations in fp32 storage)" plan32.txt \
  || { cat plan32.txt; fail "the fp32 plan does not say it counts fp32 activations"; }
grep -q "activations in bf16 storage (the logits" first.txt \
  || { cat first.txt; fail "the bf16 run's memory plan does not say activations are in bf16"; }
# the native bf16 GEMMs read the weights from a bf16 copy of the parameters:
# plan counts it where it will exist (a row of its own), not in fp32, not
# emulated, and not for another device
copies() { grep -c "parameter copies" "$1" || true; }
want=0
[ "$path" = "bf16 GEMMs: native (" ] && want=1
[ "$(copies plan.txt)" = "$want" ] || { cat plan.txt; fail "the bf16 plan's parameter copies row: want $want"; }
[ "$(copies plan32.txt)" = 0 ] || { cat plan32.txt; fail "an fp32 plan counts parameter copies"; }
ONEDNN_MAX_CPU_ISA=AVX2 "$TRAINRUN" plan "$C/tiny.lua" precision=bf16 > plan-avx2.txt
[ "$(copies plan-avx2.txt)" = 0 ] || { cat plan-avx2.txt; fail "the emulated bf16 plan counts parameter copies"; }
"$TRAINRUN" plan "$C/tiny.lua" precision=bf16 device=cuda cost.hardware=a100-80gb > plan-cuda.txt 2>&1 ||
  { cat plan-cuda.txt; fail "plan refused bf16 on device=cuda"; }
[ "$(copies plan-cuda.txt)" = 0 ] || { cat plan-cuda.txt; fail "a cuda plan counts the cpu's parameter copies"; }
"$TRAINRUN" plan "$C/tiny.lua" precision=bf16 cost.hardware=h100-80gb > plan-h100.txt 2>&1 ||
  { cat plan-h100.txt; fail "plan refused cost.hardware=h100-80gb"; }
[ "$(copies plan-h100.txt)" = 0 ] || { cat plan-h100.txt; fail "a plan for GPUs counts the cpu's parameter copies"; }
"$TRAINRUN" plan "$C/tiny.lua" precision=bf16 cost.hardware=cpu > plan-cpuhw.txt 2>&1 ||
  { cat plan-cpuhw.txt; fail "plan refused cost.hardware=cpu"; }
[ "$(copies plan-cpuhw.txt)" = "$want" ] || { cat plan-cpuhw.txt; fail "a plan for the cpu hardware: parameter copies row, want $want"; }
echo "precision: ok"
