#!/bin/sh
# device=cuda end to end, through the CUDA-on-CPU harness (tests/cudacpu,
# docs/cuda.md), against device=cpu: the same short runs in fp32, bf16 and
# fp16 (with loss-scale overflows), of a tiny Llama in fp32 and bf16 and of
# a small CNN in fp32 and bf16, agreeing step by step (and the CNN refused,
# saying why, when cuDNN is unusable); on the harness a
# resumed run and a recomputing run train bit-identical weights, and a
# checkpoint written by device=cuda resumes on device=cpu; and
# discarded memory (a trial step's gradients) is given back and committed
# again on the harness's emulated virtual memory; parallel.shard =
# "parameters" is refused where the driver has no virtual memory management.
#
# Losses are compared, and weights across devices are not: the key part of
# c_attn.bias has an exactly-zero gradient (softmax ignores a shift common to
# all keys), each backend gets rounding noise there, and AdamW turns noise
# into full lr steps.  Those weights do not change the model's outputs.
. "$(dirname "$0")/lib.sh"
: "${TR_CUDACPU_DIR:?run through make check}"
C="$TR_SRCDIR/tests/config"
steps=12
recipe=$C/tiny.lua
run() { # run DIR DEVICE ARGS...: a short run of $recipe (tests/config/tiny.lua)
  dir=$1 device=$2
  shift 2
  TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR "$TRAINRUN" "$recipe" device="$device" \
    train.steps=$steps train.log_every=1 train.eval_every=$steps checkpoint.every=6 checkpoint.keep=3 \
    run_dir="$dir" "$@" > "$dir.txt" 2>&1 || { cat "$dir.txt"; fail "$dir: trainrun failed"; }
}

same_weights() { # same_weights RUN_A RUN_B: bit-identical final checkpoints
  a=$1/checkpoints/step-$(printf %010d $steps)/model.safetensors
  b=$2/checkpoints/step-$(printf %010d $steps)/model.safetensors
  [ -f "$a" ] && [ -f "$b" ] || fail "missing checkpoint $a or $b"
  cmp -s "$a" "$b" || fail "$1 and $2 trained different weights"
  echo "$1 and $2: bit-identical weights after $steps steps"
}

# NAME_cpu and NAME_cuda: the same run on each device, agreeing within TOLERANCE
on_both() { # on_both NAME TOLERANCE ARGS...
  name=$1 tol=$2
  shift 2
  run "${name}_cpu" cpu "$@"
  run "${name}_cuda" cuda "$@"
  agree "${name}_cpu" "${name}_cuda" "$tol"
}

run cpu cpu
run cuda cuda
agree cpu cuda 1e-4

# a checkpoint round trip: the step-6 checkpoint of the run, resumed on the
# harness, ends in the same weights; resumed by device=cpu, in the same losses
resume_from_6() { # resume_from_6 DIR DEVICE
  mkdir "$1" && cp -r cuda/checkpoints "$1/" && rm -r "$1/checkpoints/step-$(printf %010d $steps)"
  echo step-0000000006 > "$1/checkpoints/LATEST"
  run "$1" "$2" --resume auto
  grep -q "resumed from checkpoint step-0000000006" "$1.txt" || { cat "$1.txt"; fail "$1 did not resume"; }
}
resume_from_6 resumed cuda
same_weights cuda resumed
resume_from_6 cross cpu
agree cuda cross 1e-4
# recomputed activations give the same gradients, hence the same weights
run recompute cuda model.recompute=1
same_weights cuda recompute

on_both bf16 1e-3 precision=bf16
# fp16 from a loss scale of 2^24: gradients overflow, steps are skipped and
# the scale backs off, in the same steps on both
on_both fp16 1e-3 precision.plugin=fp16 precision.init_scale=16777216
skipped=$(last_metric fp16_cuda/metrics.jsonl skipped_steps)
[ "$skipped" -ge 1 ] || fail "fp16 from 2^24 skipped no step: the overflow path was not run"

# tf32: device=cuda's fp32 GEMMs round their inputs to tf32 when the policy
# allows it (the reference GEMM as the tensor cores do): the run trains other
# weights than the fp32 one, within tf32's rounding of it
run tf32 cuda precision.tf32=true cost.hardware=a100-80gb
agree cuda tf32 1e-2
# its MFU is against the A100's dense tf32 peak (156 TFLOP/s), not fp32's 19.5:
# peak = tokens/s x the plan's FLOPs/token / MFU
fpt=$("$TRAINRUN" plan "$recipe" | awk '/training FLOPs\/token/ { sub(/ *\(.*/, ""); n = $NF; gsub(",", "", n); print n }')
awk -v t="$(last_metric tf32/metrics.jsonl tokens_per_s)" -v m="$(last_metric tf32/metrics.jsonl mfu)" \
  -v f="$fpt" 'BEGIN { p = t * f / m / 1e12; printf "tf32 run: MFU against a %.4g TFLOP/s peak\n", p
                       exit !(p > 155 && p < 157) }' || fail "the tf32 run's MFU is not against the tf32 peak"
grep -q "device cuda: fp32 GEMMs in tf32 on tensor cores" tf32.txt ||
  { cat tf32.txt; fail "the tf32 run did not say its GEMMs run in tf32"; }
a=cuda/checkpoints/step-$(printf %010d $steps)/model.safetensors
! cmp -s "$a" "tf32/checkpoints/step-$(printf %010d $steps)/model.safetensors" ||
  fail "precision.tf32=true trained the fp32 weights: the flag did not reach the GEMMs"

# the Llama family (grouped-query attention, RoPE, RMSNorm, SwiGLU, untied
# head) through the run loop, in fp32 and bf16
recipe=$C/tiny_llama.lua
on_both llama 1e-4
run llama_recompute cuda model.recompute=1
same_weights llama_cuda llama_recompute
on_both llama_bf16 1e-3 precision=bf16

# a small CNN (conv2d on cuDNN, the harness's fake one here; batch norm,
# max and global average pooling) in fp32 and bf16; recomputed, batch
# norm's running statistics (saved in the checkpoint) move once per step
recipe=$PWD/tiny_cnn.lua
cat > "$recipe" <<'LUA'
return {
  model = cnn { input = { 8, 8, 3 }, channels = { 8, 16 }, classes = 5 },
  data = { plugin = "synthetic", kind = "features", features = 192, classes = 5 },
  optimizer = { type = "adamw", lr = 1e-3 },
  train = { batch = 8 },
}
LUA
on_both cnn 1e-4
run cnn_recompute cuda model.recompute=1
same_weights cnn_cuda cnn_recompute
on_both cnn_bf16 1e-3 precision=bf16
# with a cuDNN of another major version (the fake says 8.9.7) the module
# still opens and a GPT trains, and the CNN is refused when its run starts,
# saying which op and why
cnn=$recipe
recipe=$C/tiny.lua
export CUDACPU_CUDNN_VERSION=80907
run nodnn_gpt cuda
if TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR "$TRAINRUN" "$cnn" device=cuda train.steps=2 \
     run_dir=nodnn_cnn > nodnn_cnn.txt 2>&1; then
  cat nodnn_cnn.txt; fail "a conv model ran on device=cuda with an unusable cuDNN"
fi
unset CUDACPU_CUDNN_VERSION
grep -q "conv2d '.*' cannot run: cuDNN 80907 is loaded but this build needs major version" nodnn_cnn.txt &&
  grep -q 'device "cuda" cannot run conv2d' nodnn_cnn.txt ||
  { cat nodnn_cnn.txt; fail "the refused conv model does not say why"; }
# discard and commit (CUDA virtual memory: a discarded chunk is unmapped and
# faults until committed): micro_batch = "auto"'s trial step gives every
# gradient back and the training steps commit them again before writing;
# gradients of 4.6 MiB span whole 2 MiB chunks.  The same weights, bit for
# bit, as the run of the same micro-batch that never discards, and the
# CPU's losses over the first 6 steps within 1e-4.  (Later steps of this
# wider model at lr 1e-2 amplify the two devices' rounding: on an AVX2 CPU
# the losses drift apart by 1.1e-3 at step 11, the run without discard
# alike; seen at step 6: 1.2e-5.)
recipe=$C/tiny_llama.lua
wide="model.dim=256 model.ffn_dim=512"
# shellcheck disable=SC2086
run vmm_fixed cuda $wide train.micro_batch=4
# shellcheck disable=SC2086
run vmm_cpu cpu $wide train.micro_batch=auto
# shellcheck disable=SC2086
run vmm_cuda cuda $wide train.micro_batch=auto
for d in vmm_cpu vmm_cuda; do
  mkdir -p "${d}_6"
  awk 'match($0, /"step": *[0-9]+/) && substr($0, RSTART + 7, RLENGTH - 7) + 0 <= 6' \
    "$d/metrics.jsonl" > "${d}_6/metrics.jsonl"
done
agree vmm_cpu_6 vmm_cuda_6 1e-4
same_weights vmm_fixed vmm_cuda
grep -q "auto micro-batch: 4 " vmm_cuda.txt || { cat vmm_cuda.txt; fail "vmm_cuda: no trial step"; }

# sharded parameters need discard, which a driver without virtual memory
# management (CUDACPU_NO_VMM takes it from the harness) leaves the backend
# without: a rank of 2 (over a test comm plugin, no peer needed to get
# there) is refused at start naming the recipe's key
if CUDACPU_NO_VMM=1 TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR TRAINRUN_RANK=0 TRAINRUN_WORLD_SIZE=2 "$TRAINRUN" \
     --plugin-path "$TR_TEST_PLUGIN_DIR" "$C/tiny_llama.lua" device=cuda comm=no_reduce_scatter \
     parallel.shard=parameters precision=bf16 train.steps=2 run_dir=cuda_zero3 > cuda_zero3.txt 2>&1; then
  cat cuda_zero3.txt; fail "device=cuda ran parallel.shard = parameters"
fi
grep -q 'parallel.shard = "parameters": the cuda backend cannot give memory back' cuda_zero3.txt ||
  { cat cuda_zero3.txt; fail "device=cuda's refusal of shard = parameters does not say why"; }
echo "cudacpu: device=cuda through the harness agrees with device=cpu ($skipped fp16 steps skipped on both)"
