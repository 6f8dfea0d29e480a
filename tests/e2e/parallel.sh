#!/bin/sh
# Data parallelism on this machine: `procs=2` starts two ranks that meet over
# TCP.  Checks that
#   - 2 ranks train to the same weights as 1 process on the same global batch
#     (to fp32 rounding: the gradient sums are added in another order);
#   - a 2-rank job killed with SIGKILL and resumed ends bit-identical to one
#     never interrupted; SIGTERM makes it save and exit 75;
#   - ZeRO-1 (parallel.zero) trains the same and resumes exactly, also when
#     the parameters do not divide by the ranks; a comm plugin without the
#     allgather it shares the shards with is refused before training;
#   - a checkpoint from 2 ranks resumes in 1 process (another world size);
#   - a rank that dies ends the whole job promptly, naming the rank;
#   - a batch the ranks cannot share is refused with the fix;
#   - the tcp comm plugin through the ABI alone (tests/comm_check) on 2, 3
#     and 4 ranks: allreduce, broadcast, allgather and reduce_scatter
#     right, reduce_scatter bit-identical to allreduce on sums that round,
#     and a rank that dies or stops (between calls, or inside reduce_scatter
#     or allgather) makes every other rank fail within seconds of
#     comm.timeout, naming it;
#   - where this machine has 2 GPUs and comm_nccl.so was built, the nccl
#     plugin the same way on 2 ranks (not on CPU machines, as CI's).
# (The same job under mpirun, over MPI, is tests/e2e/mpi.sh.)
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
READ="$TR_SRCDIR/tests/e2e/read_safetensors.py"
set -- train.steps=40 train.batch=8 train.micro_batch=2 checkpoint.every=5 train.log_every=1
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
# steps logged so far (0 before the metrics file exists)
logged() { n=$(grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null) || true; echo "${n:-0}"; }
# start a 2-rank job in the background (pid in $pid) and wait until it has
# logged $1 steps: start_after STEPS RUN_DIR [overrides...]
start_after() {
  steps=$1 dir=$2
  shift 2
  "$TRAINRUN" "$R" "$@" run_dir="$dir" procs=2 > "$dir.log" 2>&1 &
  pid=$!
  while [ "$(logged "$dir")" -lt "$steps" ]; do
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
  done
}
# wait for $pid; its exit code in $code
finish() { set +e; wait $pid; code=$?; set -e; }

"$TRAINRUN" "$R" "$@" run_dir=one --quiet
"$TRAINRUN" "$R" "$@" run_dir=two procs=2 --quiet
python3 "$READ" close "$(weights one)" "$(weights two)" 1e-5 ||
  fail "2 ranks and 1 process trained to different weights"
[ "$(grep -c '"loss"' two/metrics.jsonl)" -eq 40 ] || fail "rank 0 should log every step once"

# ZeRO-1: each rank keeps and updates half of the optimizer state; the same
# training, a sharded checkpoint (each rank its parts), and an exact sharded resume
"$TRAINRUN" "$R" "$@" run_dir=zero procs=2 parallel.zero=true 2> zero.log
grep -q "optimizer state sharded: rank 0 keeps" zero.log || { cat zero.log; fail "ZeRO-1 not in effect"; }
python3 "$READ" close "$(weights one)" "$(weights zero)" 1e-5 || fail "ZeRO-1 changed the weights"
[ -f zero/checkpoints/step-0000000040/layout.json ] || fail "ZeRO-1 wrote no sharded checkpoint"
# the optimizer state as one writer saves it (a checkpoint plugin without
# the 2.5 slots: rank 0 gathers it) is one process's
if [ -f "${TR_TEST_PLUGIN_DIR:-}/checkpoint_old_local.so" ]; then
  "$TRAINRUN" --plugin-path "$TR_TEST_PLUGIN_DIR" "$R" "$@" run_dir=zero-gathered procs=2 \
    parallel.zero=true checkpoint.plugin=old_local --quiet 2> zero-gathered.log ||
    { cat zero-gathered.log; fail "ZeRO-1 over a 2.4 checkpoint plugin"; }
  for f in optimizer optimizer2; do
    python3 "$READ" close "$(dirname "$(weights one)")/$f.safetensors" \
      "$(dirname "$(weights zero-gathered)")/$f.safetensors" 1e-5 || fail "ZeRO-1 saved another $f state"
  done
fi
cp -r zero zero-resumed
rm -rf zero-resumed/checkpoints/step-0000000040 zero-resumed/checkpoints/step-0000000035
echo step-0000000030 > zero-resumed/checkpoints/LATEST
"$TRAINRUN" "$R" "$@" run_dir=zero-resumed procs=2 parallel.zero=true --resume auto --quiet
cmp "$(weights zero)" "$(weights zero-resumed)" || fail "ZeRO-1 resumed: weights differ"
# 1,885 parameters: an allgather of 942 per rank, and the last rank's one
# left over broadcast after it
O="$TR_SRCDIR/recipes/inline-model.lua"
set -- model.width=33 train.steps=6 checkpoint.every=6
"$TRAINRUN" "$O" "$@" run_dir=odd-one --quiet
"$TRAINRUN" "$O" "$@" run_dir=odd-zero procs=2 parallel.zero=true 2> odd-zero.log
grep -q "rank 0 keeps 942 of 1885 parameters" odd-zero.log || { cat odd-zero.log; fail "ZeRO-1 shards of 1885"; }
python3 "$READ" close "$(weights odd-one)" "$(weights odd-zero)" 1e-5 ||
  fail "ZeRO-1 with parameters that do not divide by the ranks changed the weights"
if TRAINRUN_RANK=0 TRAINRUN_WORLD_SIZE=2 "$TRAINRUN" --plugin-path "$TR_TEST_PLUGIN_DIR" "$O" "$@" \
     run_dir=no-allgather comm=no_allgather parallel.zero=true 2> no-allgather.log; then
  fail "ZeRO-1 ran over a comm plugin without allgather"
fi
grep -q "comm 'no_allgather' has no allgather, which sharding (ZeRO-1 and up) needs" no-allgather.log ||
  { cat no-allgather.log; fail "unclear message for ZeRO-1 without allgather"; }
set -- train.steps=40 train.batch=8 train.micro_batch=2 checkpoint.every=5 train.log_every=1

# SIGKILL of the whole job (launcher and both ranks), then resume
start_after 17 killed "$@"
pkill -KILL -P $pid 2>/dev/null || true
kill -KILL $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
[ -f killed/checkpoints/LATEST ] || fail "no checkpoint before the kill"
"$TRAINRUN" "$R" "$@" run_dir=killed procs=2 --resume auto --quiet
cmp "$(weights two)" "$(weights killed)" || fail "2 ranks killed and resumed: weights differ"

# SIGTERM: the ranks agree to stop after the same step, rank 0 saves, exit 75
start_after 8 term "$@" train.steps=400
kill -TERM $pid
finish
[ $code -eq 75 ] || { cat term.log; fail "SIGTERM: exit code $code, expected 75"; }
grep -q "checkpoint of step" term.log || fail "SIGTERM: no preemption checkpoint reported"

# the same at shard = "parameters" (ZeRO-3): every rank writes its parts of
# the save, and the run resumes from it
start_after 8 term3 "$@" train.steps=400 parallel.shard=parameters
kill -TERM $pid
finish
[ $code -eq 75 ] || { cat term3.log; fail "SIGTERM at shard parameters: exit code $code, expected 75"; }
grep -q "checkpoint of step" term3.log || fail "SIGTERM at shard parameters: no checkpoint reported"
at=$(sed 's/step-0*//' term3/checkpoints/LATEST)
"$TRAINRUN" "$R" "$@" run_dir=term3 procs=2 parallel.shard=parameters train.steps=$((at + 3)) \
  --resume auto --allow-changes > term3-resumed.log 2>&1 ||
  { cat term3-resumed.log; fail "resume after SIGTERM at shard parameters"; }
grep -q "resumed from checkpoint step-0*$at" term3-resumed.log || { cat term3-resumed.log; fail "no resume at step $at"; }
[ "$(cat term3/checkpoints/LATEST)" = "$(printf 'step-%010d' $((at + 3)))" ] ||
  fail "the resumed run at shard parameters did not reach step $((at + 3))"
# and an exact resume: stopped at step 30 and resumed, bit-identical
"$TRAINRUN" "$R" "$@" run_dir=z3 procs=2 parallel.shard=parameters --quiet
python3 "$READ" close "$(weights one)" "$(weights z3)" 1e-5 || fail "shard parameters changed the weights"
cp -r z3 z3-resumed
rm -rf z3-resumed/checkpoints/step-0000000040 z3-resumed/checkpoints/step-0000000035
echo step-0000000030 > z3-resumed/checkpoints/LATEST
"$TRAINRUN" "$R" "$@" run_dir=z3-resumed procs=2 parallel.shard=parameters --resume auto --quiet
cmp "$(weights z3)" "$(weights z3-resumed)" || fail "shard parameters resumed: weights differ"

# another world size: resume the 2-rank checkpoint in one process
cp -r two mixed
rm -rf mixed/checkpoints/step-0000000040 mixed/checkpoints/step-0000000035
echo step-0000000030 > mixed/checkpoints/LATEST
"$TRAINRUN" "$R" "$@" run_dir=mixed --resume auto --quiet 2> mixed.log
grep -q "resumed from checkpoint step-0000000030" mixed.log || { cat mixed.log; fail "no resume at step 30"; }
python3 "$READ" close "$(weights two)" "$(weights mixed)" 1e-5 ||
  fail "resuming 2 ranks' checkpoint in 1 process changed the result"

# a rank dies: the job ends within seconds and names it
start_after 3 dies "$@" train.steps=100000
rank1=$(pgrep -P $pid | tail -n 1)
kill -KILL "$rank1"
t0=$(date +%s)
finish
took=$(( $(date +%s) - t0 ))
[ $code -eq 1 ] || { cat dies.log; fail "a dead rank: exit code $code, expected 1"; }
[ $took -le 15 ] || fail "a dead rank: the job took ${took}s to end"
grep -q "rank 1 was killed by signal 9" dies.log || { cat dies.log; fail "the launcher did not name rank 1"; }
echo "parallel: a dead rank ended the job in ${took}s: $(grep 'launch' dies.log | tail -n 1)"

# the ranks cannot share 3 micro-batches
if "$TRAINRUN" "$R" train.batch=6 train.micro_batch=2 procs=2 run_dir=odd 2> odd.log; then
  fail "a batch of 3 micro-batches for 2 ranks was accepted"
fi
grep -q "cannot share evenly" odd.log || { cat odd.log; fail "unclear message for an unshareable batch"; }

# comm_check over comm_tcp.so (or $COMM_SO): tcp_check in lib.sh
CHECK=$TR_BUILDDIR/tests/comm_check
TCP=$TR_PLUGIN_BUILD_DIR/comm_tcp.so
[ -x "$CHECK" ] && [ -f "$TCP" ] || fail "$CHECK or $TCP was not built"
for np in 2 3 4; do
  tcp_check pass$np $np -1 timeout=30
  r=0
  while [ $r -lt $np ]; do
    grep -q "rank $r/$np: PASS" pass$np.$r || { cat pass$np.$r; fail "tcp comm_check on $np ranks: rank $r"; }
    grep -q "bit-identical to allreduce_sum" pass$np.$r || { cat pass$np.$r; fail "no reduce_scatter check"; }
    r=$((r + 1))
  done
  # faults: rank `bad` dies (SIGKILL) or stops (asleep, or SIGSTOP inside
  # a call); each other rank must fail naming it, soon after comm.timeout
  for fault in die stall; do
    for where in "" :reduce_scatter :allgather; do
      case $where in
        "") bad=$((np - 1)) ;;
        :reduce_scatter) bad=1 ;;
        *) bad=0 ;;
      esac
      name=$fault$np$(echo "$where" | tr -d :)
      tcp_check "$name" $np $bad timeout=2 "--$fault=$bad$where"
      others_failed_naming "$name" $np $bad $fault parallel \
        "rank $bad made to $fault${where:+ inside ${where#:}}"
    done
  done
done

# the nccl plugin, GPU buffers, 2 ranks meeting through TRAINRUN_MASTER
NCCL=$TR_PLUGIN_BUILD_DIR/comm_nccl.so
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ -f "$NCCL" ] && [ "${gpus:-0}" -ge 2 ]; then
  COMM_SO=$NCCL tcp_check nccl 2 -1 --device=cuda --rs-tolerance=1e-5 timeout=120
  for r in 0 1; do
    grep -q "rank $r/2: PASS (nccl)" nccl.$r || { cat nccl.*; fail "nccl comm_check: rank $r"; }
  done
  echo "parallel: nccl on 2 GPUs: reduce_scatter $(grep -q 'differ from allreduce_sum' nccl.0 &&
    echo "differs from allreduce in the last bits" || echo "bit-identical to allreduce")"
  COMM_SO=$NCCL tcp_check nccl-stall 2 1 --device=cuda timeout=5 --stall=1:reduce_scatter
  grep -q "rank 0/2: FAIL: .*did not complete within 5 s" nccl-stall.0 ||
    { cat nccl-stall.*; fail "nccl: a stopped rank did not make rank 0's reduce_scatter time out"; }
  echo "parallel: nccl, rank 1 stopped inside reduce_scatter: rank 0 failed in ${took}s"
else
  echo "parallel: nccl comm_check skipped (comm_nccl.so not built, or fewer than 2 GPUs)"
fi
echo "parallel: ok"
