#!/bin/sh
# parallel.offload = "optimizer" with several ranks (docs/scale-out.md,
# "Optimizer offload"): two device=cuda ranks on the CUDA-on-CPU harness
# over its fake NCCL (lib.sh's nccl_harness), each keeping its own parts of
# the optimizer state and their master copy on its host, at each shard
# level.  Checks that
#   - at "optimizer", "gradients" and "parameters" (fp32; "parameters" in
#     bf16 too) the offloaded ranks train as the same ranks with the state
#     on their devices: losses and gradient norms within 3e-6 relative,
#     weights within 1e-5 (offload.sh says why: the host's AdamW and the
#     device's are the same formula compiled apart), and each rank says it
#     keeps only its parts;
#   - at each level the update overlapping the next forward (the default:
#     each unit gathered again as the host finishes its parts, or before
#     the node that reads it under "parameters") trains the same weights,
#     bit for bit, as the update ending within the step;
#   - the sharded checkpoints the offloaded ranks write (each rank its
#     blob, its state read from host memory) resume offloaded to the
#     uninterrupted run's weights bit for bit, and on ranks that keep the
#     state on the device within the tolerance; a checkpoint of one process
#     resumed by offloaded ranks (rank 0 reads it whole and hands each rank
#     its parts, through device memory into host memory) trains as the same
#     resume without offload; so does a run whose checkpoint plugin cannot
#     take blobs from several ranks (rank 0 gathers the host state to save);
#   - with 2 pipeline stages (one replica) each stage's host keeps the state
#     of the parameters its chunks read: offloaded and not agree as above,
#     overlapped and within the step bit for bit, the stages' checkpoint
#     resumes offloaded bit for bit, one process's checkpoint resumed by
#     offloaded stages trains as without offload; the host's discarded
#     pages are made inaccessible (TRAINRUN_CPU_DISCARD=strict), so a stage
#     touching another's host state faults (replicas of stages are
#     refused: offload.sh);
#   - the plan of a Llama-3-8B on 8 H100s keeps 1/8 of the state a host,
#     on 2 stages the largest stage's share.
. "$(dirname "$0")/lib.sh"
nccl_harness # $CUDA_TRAINRUN: trainrun with the harness's comm_nccl.so (lib.sh)
export CUDACPU_NCCL_CHUNK=1024
LLAMA="$TR_SRCDIR/tests/config/tiny_llama.lua"
READ="$TR_SRCDIR/tests/e2e/read_safetensors.py"
tol=3e-6
steps=6
# 2 micro-batches a rank; 2,621-float units (tiny_llama's 5,104 parameters
# in 2 units, each rank a part of each); offload chunks of 1,048 floats
base="train.steps=$steps train.batch=4 train.micro_batch=1 train.log_every=1 train.threads=1
      parallel.bucket_mb=0.01 optimizer.clip=1.0 optimizer.weight_decay=0.1
      checkpoint.every=3 checkpoint.keep=4"
off="parallel.offload=optimizer parallel.offload_chunk_mb=0.004"
run() { # run DIR overrides...: 2 cuda ranks of tiny_llama.lua
  dir=$1
  shift
  # shellcheck disable=SC2086
  "$CUDA_TRAINRUN" "$LLAMA" device=cuda procs=2 $base run_dir="$dir" "$@" > "$dir.txt" 2>&1 ||
    { cat "$dir.txt"; fail "$dir: trainrun failed"; }
}
weights() { # a run's latest weights as one fp32 file (sharded checkpoints too)
  c="$1/checkpoints/$(cat "$1/checkpoints/LATEST")"
  "$TRAINRUN" export "$c" --dtype fp32 -o "$1.weights.safetensors" > "$1.export.log" 2>&1 ||
    { cat "$1.export.log" >&2; fail "export of $c"; }
  echo "$1.weights.safetensors"
}
close() { # close A B WHAT: final weights within 1e-5
  python3 "$READ" close "$(weights "$1")" "$(weights "$2")" 1e-5 || fail "$3: $1 and $2 differ"
}
same() { # same A B WHAT: bit-identical final weights
  cmp -s "$(weights "$1")" "$(weights "$2")" || fail "$3: $1 and $2 trained different weights"
  echo "$3: $1 and $2 bit-identical"
}
from3() { # from3 DIR FROM overrides...: DIR resumed from FROM's step-3 checkpoint
  dir=$1 from=$2
  shift 2
  mkdir "$dir" && cp -r "$from/checkpoints" "$dir/" && rm -r "$dir/checkpoints/step-0000000006"
  echo step-0000000003 > "$dir/checkpoints/LATEST"
  run "$dir" --resume auto "$@"
  grep -q "resumed from checkpoint step-0000000003" "$dir.txt" ||
    { cat "$dir.txt"; fail "$dir did not resume"; }
}

for level in optimizer gradients parameters; do
  run "$level" parallel.shard=$level
  # shellcheck disable=SC2086
  run "${level}_off" parallel.shard=$level $off
  grep -q "optimizer offloaded: its state and an fp32 master copy of the parameters (rank 0's parts: [0-9]* of 5104)" \
    "${level}_off.txt" || { cat "${level}_off.txt"; fail "${level}_off: rank 0 does not keep its parts only"; }
  grep -q "overlapping the next forward" "${level}_off.txt" ||
    { cat "${level}_off.txt"; fail "${level}_off: the update does not overlap the forward"; }
  agree "$level" "${level}_off" $tol "loss val_loss grad_norm"
  close "$level" "${level}_off" "shard $level, offloaded and not"
  # shellcheck disable=SC2086
  run "${level}_in_step" parallel.shard=$level $off parallel.offload_overlap=false
  same "${level}_off" "${level}_in_step" "shard $level: the update overlapped and within the step"
done
run bf16_parameters parallel.shard=parameters precision=bf16
# shellcheck disable=SC2086
run bf16_parameters_off parallel.shard=parameters precision=bf16 $off
agree bf16_parameters bf16_parameters_off $tol "loss val_loss grad_norm"
close bf16_parameters bf16_parameters_off "bf16, shard parameters, offloaded and not"
# shellcheck disable=SC2086
run bf16_parameters_in_step parallel.shard=parameters precision=bf16 $off \
  parallel.offload_overlap=false
same bf16_parameters_off bf16_parameters_in_step "bf16, shard parameters: overlapped and within the step"

# checkpoints: each rank wrote its blob from host memory
[ -f gradients_off/checkpoints/step-0000000006/layout.json ] ||
  { ls gradients_off/checkpoints/step-0000000006; fail "the offloaded ranks saved no sharded checkpoint"; }
# shellcheck disable=SC2086
from3 gradients_off_resumed gradients_off parallel.shard=gradients $off
same gradients_off gradients_off_resumed "offloaded ranks resumed from their own checkpoint"
from3 gradients_off_to_dev gradients_off parallel.shard=gradients
agree gradients_off gradients_off_to_dev $tol "loss val_loss grad_norm"
close gradients_off gradients_off_to_dev "offloaded ranks' checkpoint resumed on the device"
# one process's checkpoint (the whole state, read by rank 0), resumed by 2
# ranks: offloaded and not, the same
"$CUDA_TRAINRUN" "$LLAMA" device=cuda $base train.batch=4 run_dir=one train.steps=3 > one.txt 2>&1 ||
  { cat one.txt; fail "one process"; }
for d in one_to_ranks one_to_ranks_off; do
  mkdir "$d" && cp -r one/checkpoints "$d/"
done
run one_to_ranks --resume auto parallel.shard=gradients
# shellcheck disable=SC2086
run one_to_ranks_off --resume auto parallel.shard=gradients $off
grep -q "resumed from checkpoint step-0000000003" one_to_ranks_off.txt ||
  { cat one_to_ranks_off.txt; fail "one_to_ranks_off did not resume"; }
agree one_to_ranks one_to_ranks_off $tol "loss val_loss grad_norm"
close one_to_ranks one_to_ranks_off "one process's checkpoint resumed by 2 ranks, offloaded and not"
# a checkpoint plugin without the 2.5 slots: rank 0 gathers every rank's
# host state into one checkpoint
if [ -f "${TR_TEST_PLUGIN_DIR:-}/checkpoint_old_local.so" ]; then
  old="--plugin-path $TR_TEST_PLUGIN_DIR checkpoint.plugin=old_local"
  # shellcheck disable=SC2086
  run old_off $old parallel.shard=gradients $off
  grep -q "cannot take one checkpoint from several ranks" old_off.txt ||
    { cat old_off.txt; fail "old_off: not saved by rank 0"; }
  [ -f old_off/checkpoints/step-0000000006/optimizer.safetensors ] ||
    fail "old_off: rank 0 wrote no optimizer.safetensors"
  # shellcheck disable=SC2086
  from3 old_off_resumed old_off $old parallel.shard=gradients $off
  same old_off old_off_resumed "gathered by rank 0 from offloaded ranks, resumed offloaded"
  close gradients_off old_off "offloaded ranks: sharded checkpoints and one gathered"
else
  echo "no checkpoint_old_local.so: the gathered save is not checked"
fi

# pipeline stages: each stage's host keeps its own parameters' state
export TRAINRUN_CPU_DISCARD=strict
run pipe parallel.pipeline=2
# shellcheck disable=SC2086
run pipe_off parallel.pipeline=2 $off
grep -q "overlapping the next forward" pipe_off.txt ||
  { cat pipe_off.txt; fail "pipe_off: the update does not overlap the forward"; }
agree pipe pipe_off $tol "loss val_loss grad_norm"
close pipe pipe_off "2 stages, offloaded and not"
# shellcheck disable=SC2086
run pipe_in_step parallel.pipeline=2 $off parallel.offload_overlap=false
same pipe_off pipe_in_step "2 stages: the update overlapped and within the step"
# shellcheck disable=SC2086
from3 pipe_off_resumed pipe_off parallel.pipeline=2 $off
same pipe_off pipe_off_resumed "offloaded stages resumed from their own checkpoint"
for d in one_to_stages one_to_stages_off; do
  mkdir "$d" && cp -r one/checkpoints "$d/"
done
run one_to_stages --resume auto parallel.pipeline=2
# shellcheck disable=SC2086
run one_to_stages_off --resume auto parallel.pipeline=2 $off
grep -q "resumed from checkpoint step-0000000003" one_to_stages_off.txt ||
  { cat one_to_stages_off.txt; fail "one_to_stages_off did not resume"; }
agree one_to_stages one_to_stages_off $tol "loss val_loss grad_norm"
close one_to_stages one_to_stages_off "one process's checkpoint resumed by 2 stages, offloaded and not"
unset TRAINRUN_CPU_DISCARD

# the plan: a Llama-3-8B full fine-tune on 8 H100s, ZeRO-2 with the state
# offloaded: each host 1/8 of the state, of the master copy and of the
# gradients (the overlap's) one GPU's offload keeps
sed -e '/lora =/d' "$TR_SRCDIR/recipes/qlora-llama3-8b.lua" > full8b.lua
"$TRAINRUN" plan full8b.lua cost.hardware=h100-80gb gpus=8 parallel.shard=gradients \
  parallel.offload=optimizer > plan8.txt 2>&1 || { cat plan8.txt; fail "8B plan on 8 GPUs"; }
"$TRAINRUN" plan full8b.lua cost.hardware=h100-80gb parallel.offload=optimizer \
  > plan1.txt 2>&1 || { cat plan1.txt; fail "8B plan on 1 GPU"; }
grep -q "and their gradients" plan8.txt || { cat plan8.txt; fail "plan: no host gradients on 8 GPUs"; }
"$TRAINRUN" plan full8b.lua cost.hardware=h100-80gb gpus=2 parallel.pipeline=2 \
  parallel.offload=optimizer > plan_pp.txt 2>&1 || { cat plan_pp.txt; fail "8B plan on 2 stages"; }
hp=$(awk '/host \(offload\)/ { print $3, $4; exit }' plan_pp.txt)
grep -q "optimizer state of the largest stage's parameters" plan_pp.txt ||
  { cat plan_pp.txt; fail "plan: whose parameters on 2 stages"; }
awk -v a="$hp" -v b="$(awk '/host \(offload\)/ { print $3, $4; exit }' plan1.txt)" 'BEGIN {
  split(a, x, " "); split(b, y, " "); r = x[1] / y[1]; exit !(x[2] == "GiB" && r > 0.45 && r < 0.6) }' ||
  { cat plan_pp.txt; fail "plan: the largest of 2 stages' hosts holds $hp, not about half"; }
h8=$(awk '/host \(offload\)/ { print $3, $4; exit }' plan8.txt)
h1=$(awk '/host \(offload\)/ { print $3, $4; exit }' plan1.txt)
grep -q "optimizer state of a device's parts" plan8.txt || { cat plan8.txt; fail "plan: whose parts"; }
awk -v a="$h8" -v b="$h1" 'BEGIN { split(a, x, " "); split(b, y, " ");
  if (x[2] != "GiB" || y[2] != "GiB") exit 1; r = y[1] / x[1]; exit !(r > 7.99 && r < 8.01) }' ||
  { cat plan8.txt plan1.txt; fail "plan: the host holds $h8 on 8 GPUs, $h1 on one: not an eighth"; }
echo "offload-ranks: 8B host memory a rank: $h1 alone, $h8 on 8 GPUs at shard = gradients, $hp on the largest of 2 stages (all overlapped)"
echo "offload-ranks: ok"
