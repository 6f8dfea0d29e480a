#!/bin/sh
# parallel.offload = "optimizer" (docs/scale-out.md, "Optimizer offload"):
# device=cuda through the CUDA-on-CPU harness (tests/cudacpu) with the
# optimizer's state and master weights on the host, updated by the CPU
# backend, against the same run with everything on the device: step by step
# within a tight tolerance, for a GPT (AdamW, SGD, fp16 with skipped steps)
# and a Llama (fp32, bf16); resumes across offload on and off in both
# directions, and after SIGTERM bit-identical; the refusals (device=cpu,
# data-parallel replicas of pipeline stages, several ranks without a shard level or stages); and
# the plan's device and host figures, for
# a tiny Llama and a Llama-3-8B.
#
# The tolerances: the host's update is the CPU backend's kernel, the
# device's the cuda backend's (on the harness, its C++ on the CPU); the same
# formula, compiled apart (-march=native, contraction into FMAs), so a
# weight can differ in its last bits after an update.  Seen after 12 steps
# of tiny.lua: weights within 1.1e-6 of each other (AdamW; SGD and the
# Llama 1.2e-7), and
# the losses metrics.jsonl prints (6 digits) equal, but for one SGD loss one
# unit in its last digit (2.4e-6 relative).  So losses must agree within
# 3e-6 and weights within 1e-5: AdamW without its weight decay (0.1) moves
# the weights by 4.8e-5 and the losses by 9.8e-6 in the same 12 steps.
. "$(dirname "$0")/lib.sh"
: "${TR_CUDACPU_DIR:?run through make check}"
C="$TR_SRCDIR/tests/config"
steps=12
tol=3e-6
# chunks of 1048 floats: tiny.lua's 4464 parameters (and the Llama's 5104)
# go through the pipeline in several, one ending at the weight-decay boundary
off="parallel.offload=optimizer parallel.offload_chunk_mb=0.004"
recipe=$C/tiny.lua
run() { # run DIR ARGS...: a short device=cuda run of $recipe
  dir=$1
  shift
  TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR "$TRAINRUN" "$recipe" device=cuda \
    train.steps=$steps train.log_every=1 train.eval_every=$steps checkpoint.every=6 checkpoint.keep=3 \
    optimizer.clip=1.0 optimizer.weight_decay=0.1 run_dir="$dir" "$@" > "$dir.txt" 2>&1 || { cat "$dir.txt"; fail "$dir: trainrun failed"; }
}

ckpt() { echo "$1/checkpoints/step-$(printf %010d "$2")"; }

# the final weights of two runs within an absolute 1e-5 (python3's
# standard library and tests/e2e/read_safetensors.py; skipped without it)
close_weights() { # close_weights RUN_A RUN_B
  command -v python3 > /dev/null || { echo "python3 missing: weights not compared"; return 0; }
  python3 - "$TR_SRCDIR/tests/e2e" "$(ckpt "$1" $steps)/model.safetensors" \
    "$(ckpt "$2" $steps)/model.safetensors" <<'PY' || fail "$1 and $2: weights differ"
import sys
sys.path.insert(0, sys.argv[1])
from read_safetensors import read
a, b = read(sys.argv[2]), read(sys.argv[3])
assert set(a) == set(b), "tensor names differ"
worst = max(abs(x - y) for k in a for x, y in zip(a[k][2], b[k][2]))
print(f"weights within {worst:.2g} of each other")
sys.exit(worst > 1e-5)
PY
}

same_weights() { # same_weights RUN_A RUN_B: bit-identical final checkpoints
  cmp -s "$(ckpt "$1" $steps)/model.safetensors" "$(ckpt "$2" $steps)/model.safetensors" ||
    fail "$1 and $2 trained different weights"
  echo "$1 and $2: bit-identical weights after $steps steps"
}

# DIR: a run resumed from FROM's step-6 checkpoint, with ARGS
resume_from_6() { # resume_from_6 DIR FROM ARGS...
  dir=$1 from=$2
  shift 2
  mkdir "$dir" && cp -r "$from/checkpoints" "$dir/" && rm -r "$(ckpt "$dir" $steps)"
  echo step-0000000006 > "$dir/checkpoints/LATEST"
  run "$dir" --resume auto "$@"
  grep -q "resumed from checkpoint step-0000000006" "$dir.txt" || { cat "$dir.txt"; fail "$dir did not resume"; }
}

run gpt
run gpt_off $off
grep -q "optimizer offloaded: its state and an fp32 master copy.*in chunks of 0.004 MiB" gpt_off.txt ||
  { cat gpt_off.txt; fail "the offloaded run does not say so"; }
agree gpt gpt_off $tol "loss val_loss grad_norm"
close_weights gpt gpt_off
# the chunks are a transfer's size only: one chunk (the default 4 MiB)
# trains the same weights, bit for bit
run gpt_off_whole parallel.offload=optimizer
same_weights gpt_off gpt_off_whole
# overlapped with the next forward (the default alone) or within the step:
# the same updates, bit for bit (an evaluation and checkpoints in between)
grep -q "overlapping the next forward" gpt_off.txt || { cat gpt_off.txt; fail "gpt_off: not overlapped"; }
run gpt_off_instep $off parallel.offload_overlap=false
! grep -q "overlapping the next forward" gpt_off_instep.txt || fail "offload_overlap=false overlapped"
same_weights gpt_off gpt_off_instep
# the state is saved as without offload: the same blobs, names and shapes
for f in optimizer.safetensors optimizer2.safetensors model.safetensors; do
  [ -f "$(ckpt gpt_off 6)/$f" ] || { ls "$(ckpt gpt_off 6)"; fail "offloaded checkpoint lacks $f"; }
  cmp -s "$(ckpt gpt 6)/$f" "$(ckpt gpt_off 6)/$f" ||
    [ "$(wc -c < "$(ckpt gpt 6)/$f")" = "$(wc -c < "$(ckpt gpt_off 6)/$f")" ] ||
    fail "$f: the offloaded run saved another layout"
done
# resumed with offload from its own checkpoint: the uninterrupted run's
# weights, bit for bit (the host state and master copy came back exactly)
resume_from_6 gpt_off_resumed gpt_off $off
same_weights gpt_off gpt_off_resumed
# across: an offloaded run's checkpoint resumed on the device, and the other way
resume_from_6 off_to_dev gpt_off
agree gpt_off off_to_dev $tol "loss val_loss grad_norm"
resume_from_6 dev_to_off gpt $off
agree gpt dev_to_off $tol "loss val_loss grad_norm"
# stopped by SIGTERM partway (a checkpoint at whatever step it was), then
# resumed: with offload, the uninterrupted offloaded run's weights bit for
# bit; without, its losses within the tolerance
long() { # long DIR ARGS...: 40 steps of tiny.lua on the harness, offloaded
  dir=$1
  shift
  TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR ${exec_long:-} "$TRAINRUN" "$recipe" device=cuda train.steps=40 \
    train.log_every=1 checkpoint.every=10 optimizer.weight_decay=0.1 run_dir="$dir" "$@"
}
long straight $off --quiet > straight.txt 2>&1 || { cat straight.txt; fail "straight"; }
# exec: $! is then trainrun itself, not a subshell around it
( exec_long=exec; long stopped $off ) > stopped.txt 2>&1 &
term_after $! stopped 13
[ $code -eq 75 ] || [ $code -eq 0 ] || { cat stopped.txt; fail "SIGTERM exit code $code, expected 75"; }
cp -r stopped stopped_dev
stop_at=$(cat stopped/checkpoints/LATEST)
long stopped $off --resume auto --quiet > resumed.txt 2>&1 || { cat resumed.txt; fail "resume"; }
cmp "straight/checkpoints/$(cat straight/checkpoints/LATEST)/model.safetensors" \
  "stopped/checkpoints/$(cat stopped/checkpoints/LATEST)/model.safetensors" ||
  fail "the offloaded run stopped and resumed trained other weights"
long stopped_dev --resume auto --quiet > resumed_dev.txt 2>&1 || { cat resumed_dev.txt; fail "resume on the device"; }
agree straight stopped_dev $tol "loss val_loss grad_norm"
[ "$code" -eq 75 ] && echo "offload: stopped with 75 ($stop_at), resumed: bit-identical with offload, within $tol without" ||
  echo "offload: finished before the signal; still identical"

# SGD with momentum and weight decay too
run sgd optimizer.type=sgd optimizer.lr=0.05 optimizer.momentum=0.9 optimizer.weight_decay=0.01
run sgd_off optimizer.type=sgd optimizer.lr=0.05 optimizer.momentum=0.9 optimizer.weight_decay=0.01 \
  $off
agree sgd sgd_off $tol "loss val_loss grad_norm"
close_weights sgd sgd_off

# fp16 from a loss scale of 2^24: the overflowing steps are skipped (no
# update, bias correction not advanced) in the same steps, and the scale
# the update undoes is the same
run fp16 precision.plugin=fp16 precision.init_scale=16777216
run fp16_off precision.plugin=fp16 precision.init_scale=16777216 $off
[ "$(last_metric fp16/metrics.jsonl skipped_steps)" -ge 1 ] || fail "fp16 from 2^24 skipped no step"
[ "$(last_metric fp16/metrics.jsonl skipped_steps)" = "$(last_metric fp16_off/metrics.jsonl skipped_steps)" ] ||
  fail "fp16: the offloaded run skipped other steps"
agree fp16 fp16_off $tol "loss val_loss grad_norm"

# the Llama family, fp32 and bf16 compute
recipe=$C/tiny_llama.lua
run llama
run llama_off $off
agree llama llama_off $tol "loss val_loss grad_norm"
close_weights llama llama_off
run llama_off_instep $off parallel.offload_overlap=false
same_weights llama_off llama_off_instep
run llama_bf16 precision=bf16
run llama_bf16_off precision=bf16 $off
agree llama_bf16 llama_bf16_off $tol "loss val_loss grad_norm"

# refusals, naming the recipe line
cat > cpu.lua <<'LUA'
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 512 },
  parallel = { offload = "optimizer" },
}
LUA
if "$TRAINRUN" cpu.lua device=cpu train.steps=1 run_dir=cpu > cpu.txt 2>&1; then
  cat cpu.txt; fail "parallel.offload ran on device=cpu"
fi
grep -q 'cpu.lua:4: parallel.offload = "optimizer" on device = "cpu": nothing to offload to: the optimizer state is in host memory already' cpu.txt ||
  { cat cpu.txt; fail "the device=cpu refusal does not say why, or where"; }
# 2 replicas of 2 stages would each keep their stages' state on the host
# (stages of one replica: offload-ranks.sh)
TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR "$TRAINRUN" cpu.lua device=cuda parallel.pipeline=2 procs=4 \
  train.steps=1 run_dir=pipe > pipe.txt 2>&1 &&
  { cat pipe.txt; fail "parallel.offload ran with replicas of pipeline stages"; }
grep -q 'cpu.lua:4: parallel.offload = "optimizer" with pipeline = 2 on 4 ranks: each of the 2 data-parallel replicas' pipe.txt ||
  { cat pipe.txt; fail "the refusal of replicas of stages does not say why"; }
! grep -q "launch:" pipe.txt || { cat pipe.txt; fail "replicas of stages: ranks started before the refusal"; }
# several ranks without a shard level would each keep the whole state on
# their host: refused before any rank starts (gpus= or procs=; a job
# launched from outside, by mpirun, is refused by each rank's session,
# tr_config_check_offload, once its comm is up).  With a shard level:
# offload-ranks.sh
for ranks in "gpus=2" "procs=2 comm=tcp"; do
  if TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR timeout 120 "$TRAINRUN" cpu.lua device=cuda $ranks \
       train.steps=1 run_dir=ranks > ranks.txt 2>&1; then
    cat ranks.txt; fail "parallel.offload ran with $ranks"
  fi
  grep -q 'cpu.lua:4: parallel.offload = "optimizer" with 2 ranks needs a shard level' ranks.txt ||
    { cat ranks.txt; fail "$ranks: the refusal of several ranks does not say why, or where"; }
  ! grep -q "launch:" ranks.txt || { cat ranks.txt; fail "$ranks: ranks started before the refusal"; }
done
# a plan for this machine's cpu is refused too; for a GPU profile it plans
"$TRAINRUN" plan cpu.lua > plan_cpu.txt 2>&1 && { cat plan_cpu.txt; fail "planned offload on the cpu"; }
grep -q 'nothing to offload to' plan_cpu.txt || { cat plan_cpu.txt; fail "the plan's refusal"; }

# the plan: the tiny Llama's 19,616 parameters' AdamW state (2 x 4 bytes
# each, 153.25 KiB) off the device, the host holding it, the master copy
# (4 bytes each, 76.62 KiB) and, overlapped (the default), the gradients
# (76.62 KiB)
"$TRAINRUN" plan "$C/plan_llama.lua" > plan.txt 2>&1 || { cat plan.txt; fail "plan"; }
"$TRAINRUN" plan "$C/plan_llama.lua" parallel.offload=optimizer > plan_off.txt 2>&1 ||
  { cat plan_off.txt; fail "plan with offload"; }
grep -q "optimizer state *153.25 KiB" plan.txt || { cat plan.txt; fail "plan: the state on the device"; }
grep -q "optimizer state *0 B" plan_off.txt || { cat plan_off.txt; fail "plan: state left on the device"; }
grep -q "host (offload) *306.50 KiB" plan_off.txt || { cat plan_off.txt; fail "plan: the host line"; }
grep -q "optimizer state, 153.25 KiB, moved off" plan_off.txt && grep -q "fp32 master copy of the parameters, 76.62 KiB" \
  plan_off.txt && grep -q "their gradients, 76.62 KiB, for the update overlapping the next forward" plan_off.txt ||
  { cat plan_off.txt; fail "plan: what the host holds"; }
"$TRAINRUN" plan "$C/plan_llama.lua" parallel.offload=optimizer parallel.offload_overlap=false \
  > plan_instep.txt 2>&1 || { cat plan_instep.txt; fail "plan with offload in the step"; }
grep -q "host (offload) *229.88 KiB" plan_instep.txt && ! grep -q "their gradients" plan_instep.txt ||
  { cat plan_instep.txt; fail "plan: the host line without overlap"; }
# a full fine-tune of a Llama-3-8B shape on one H100-80GB: too large with
# the state on the device, fits without it
sed -e '/lora =/d' "$TR_SRCDIR/recipes/qlora-llama3-8b.lua" > full8b.lua
"$TRAINRUN" plan full8b.lua cost.hardware=h100-80gb > full8b.txt 2>&1 || { cat full8b.txt; fail "8B plan"; }
"$TRAINRUN" plan full8b.lua cost.hardware=h100-80gb parallel.offload=optimizer > full8b_off.txt 2>&1 ||
  { cat full8b_off.txt; fail "8B plan with offload"; }
grep -q "on h100-80gb *DOES NOT FIT" full8b.txt || { cat full8b.txt; fail "a full 8B fits one H100?"; }
grep -q "on h100-80gb *fits" full8b_off.txt || { cat full8b_off.txt; fail "the offloaded 8B does not fit"; }
echo "offload: 8B: $(grep '^ *on h100-80gb' full8b.txt | tr -s ' ') -> $(grep '^ *on h100-80gb' full8b_off.txt | tr -s ' ')"
echo "offload: 8B host: $(grep 'host (offload)' full8b_off.txt | tr -s ' ')"
echo "offload: ok"
