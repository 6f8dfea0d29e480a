#!/bin/sh
# The mpi comm plugin on real MPI ranks, through the plugin ABI alone
# (tests/comm_check: allreduce, broadcast and allgather checked
# against values every rank computes itself).  Skipped (77) without mpirun
# or comm_mpi.so (install libopenmpi-dev openmpi-bin and re-run configure).
#   a) 2 and 3 ranks pass, with blocking collectives and with a timeout
#   b) a rank killed mid-job ends the whole job, non-zero, within 30 s
#   c) a rank that stops calling makes the others fail after `timeout`
#   d) TRAINRUN_RANK disagreeing with MPI's rank is refused with a message
#   e) trainrun itself under mpirun with comm = "mpi": 2 ranks train to the
#      weights 1 process reaches on the same global batch
. "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null 2>&1 || skip "mpirun not found: apt-get install openmpi-bin libopenmpi-dev"
PLUGIN=${TR_PLUGIN_BUILD_DIR:-}/comm_mpi.so
[ -f "$PLUGIN" ] ||
  skip "comm_mpi.so was not built (configure found no Open MPI: install libopenmpi-dev)"
CHECK=$TR_BUILDDIR/tests/comm_check
[ -x "$CHECK" ] || fail "$CHECK was not built"

# ranks come from mpirun here, not from a surrounding launcher
unset TRAINRUN_RANK TRAINRUN_WORLD_SIZE TRAINRUN_LOCAL_RANK TRAINRUN_LOCAL_WORLD_SIZE \
  SLURM_PROCID SLURM_NTASKS SLURM_LOCALID TRAINRUN_MASTER TRAINRUN_RENDEZVOUS_FILE
# root in containers; more ranks than cores; no pinning on a shared machine;
# no cross-memory attach (containers often forbid ptrace)
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none \
  --mca btl_vader_single_copy_mechanism none"

# run_job NAME NP ARGS...: runs the job under a 60 s guard, leaving its
# output in NAME.out, its status in $rc and its duration in $took (seconds)
run_job() {
  name=$1 np=$2
  shift 2
  start=$(date +%s)
  set +e
  timeout 60 $MPIRUN -np "$np" "$@" > "$name.out" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - start))
  echo "$name: exit $rc after ${took}s"
}

passes() { grep -c ': PASS' "$1.out" || true; }

# a) correct results
for np in 2 3; do
  run_job blocking$np "$np" "$CHECK" "$PLUGIN"
  [ "$rc" -eq 0 ] && [ "$(passes blocking$np)" -eq "$np" ] ||
    { cat blocking$np.out; fail "$np ranks: comm_check did not pass on every rank"; }
done
grep -q 'comm_check: mpi (Open MPI' blocking2.out || { cat blocking2.out; fail "no describe line"; }
grep -q 'rank 0 of 2, 2 on this node, no timeout' blocking2.out ||
  { cat blocking2.out; fail "describe does not say the ranks"; }
run_job nonblocking 2 "$CHECK" "$PLUGIN" timeout=30
[ "$rc" -eq 0 ] && [ "$(passes nonblocking)" -eq 2 ] ||
  { cat nonblocking.out; fail "with timeout=30 comm_check did not pass on every rank"; }
grep -q 'timeout 30 s' nonblocking.out || { cat nonblocking.out; fail "describe lacks the timeout"; }

# b) a rank dies: mpirun must end the job (no hang) and report failure
run_job die 2 "$CHECK" "$PLUGIN" --die=1
grep -q 'rank 1/2: dying on purpose' die.out || { cat die.out; fail "rank 1 did not reach its death"; }
[ "$rc" -ne 0 ] || { cat die.out; fail "a killed rank left mpirun with exit status 0"; }
[ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
  { cat die.out; fail "the job hung for ${took}s after a rank died"; }
[ "$(passes die)" -eq 0 ] || { cat die.out; fail "a rank passed although its peer died"; }

# c) a rank hangs alive: the timeout option turns the wait into an error
run_job stall 2 "$CHECK" "$PLUGIN" --stall=1 timeout=3
grep -q 'rank 0/2: FAIL: allreduce_sum.*did not complete within 3 s' stall.out ||
  { cat stall.out; fail "rank 0 did not report the timeout"; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
  { cat stall.out; fail "a stalled rank: exit $rc after ${took}s"; }

# d) ranks from the environment that disagree with MPI's
run_job mismatch 2 -x TRAINRUN_RANK=0 -x TRAINRUN_WORLD_SIZE=2 "$CHECK" "$PLUGIN"
grep -q 'MPI says this process is rank 1 of 2, but trainrun was told rank 0 of 2' mismatch.out ||
  { cat mismatch.out; fail "a rank mismatch was not reported"; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
  { cat mismatch.out; fail "a rank mismatch: exit $rc after ${took}s"; }

# e) the whole run loop on 2 MPI ranks against 1 process
TRAINRUN_PLUGIN_PATH="$TR_PLUGIN_BUILD_DIR${TRAINRUN_PLUGIN_PATH:+:$TRAINRUN_PLUGIN_PATH}"
export TRAINRUN_PLUGIN_PATH
R="$TR_SRCDIR/tests/config/tiny.lua"
set -- train.steps=20 train.batch=8 train.micro_batch=2 checkpoint.every=10
weights() { echo "$1/checkpoints/$(cat "$1/checkpoints/LATEST")/model.safetensors"; }
"$TRAINRUN" "$R" "$@" run_dir=one --quiet
run_job train 2 -x OMP_NUM_THREADS=1 "$TRAINRUN" "$R" "$@" run_dir=two comm=mpi
[ "$rc" -eq 0 ] || { cat train.out; fail "trainrun on 2 MPI ranks failed"; }
grep -q 'rank 0 of 2 .*mpi (Open MPI' train.out || { cat train.out; fail "the run did not use comm mpi"; }
python3 "$TR_SRCDIR/tests/e2e/read_safetensors.py" close "$(weights one)" "$(weights two)" 1e-5 ||
  fail "2 MPI ranks and 1 process trained to different weights"
echo "mpi comm plugin: 2 and 3 ranks pass; dead, hung and mislabelled ranks end the job;"
echo "  2 MPI ranks train like 1 process"
