#!/bin/sh
# The mpi comm plugin on real MPI ranks, through the plugin ABI alone
# (tests/comm_check: allreduce, broadcast, allgather and reduce_scatter
# checked against values every rank computes itself).  Skipped (77) without
# mpirun or comm_mpi.so (install libopenmpi-dev openmpi-bin and re-run
# configure).
#   a) 2, 3 and 4 ranks pass, with the default timeout (nonblocking
#      collectives) and with timeout=0 (blocking ones); reduce_scatter
#      within 1e-5 of allreduce on sums that round, and the script says
#      whether bit for bit
#   b) a rank killed mid-job (between calls, or inside reduce_scatter or
#      allgather) ends the whole job, non-zero, within 30 s, and mpirun
#      names it
#   c) a rank that stops (asleep between calls, or SIGSTOP inside
#      reduce_scatter or allgather) makes the others fail after `timeout`,
#      naming it (each rank that speaks before mpirun ends the job)
#   d) TRAINRUN_RANK disagreeing with MPI's rank is refused with a message
#   e) trainrun itself under mpirun with comm = "mpi": 2 ranks train to the
#      weights 1 process reaches on the same global batch
. "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null 2>&1 || skip "mpirun not found: apt-get install openmpi-bin libopenmpi-dev"
PLUGIN=${TR_PLUGIN_BUILD_DIR:-}/comm_mpi.so
[ -f "$PLUGIN" ] ||
  skip "comm_mpi.so was not built (configure found no Open MPI: install libopenmpi-dev)"
# ranks come from mpirun here, not from a surrounding launcher
comm_check_env
# run_job NAME NP ARGS...: lib.sh's mpi_job, then its exit and duration said
run_job() {
  mpi_job "$@"
  echo "$name: exit $rc after ${took}s"
}

passes() { grep -c ': PASS' "$1.out" || true; }

# what a's comm_check found comparing reduce_scatter with allreduce
rs_finding() {
  if grep -q 'differ from allreduce_sum' "$1.out"; then
    echo "differs from allreduce in the last bits ($(grep -o 'largest difference [0-9.e+-]*' "$1.out" | sort -t' ' -k3 -g | tail -n 1) of the sum of magnitudes)"
  else
    echo "bit-identical to allreduce"
  fi
}

# a) correct results
for np in 2 3 4; do
  run_job default$np "$np" "$CHECK" "$PLUGIN" --rs-tolerance=1e-5
  [ "$rc" -eq 0 ] && [ "$(passes default$np)" -eq "$np" ] ||
    { cat default$np.out; fail "$np ranks: comm_check did not pass on every rank"; }
  echo "mpi: $np ranks, nonblocking (timeout): reduce_scatter $(rs_finding default$np)"
done
grep -q 'comm_check: mpi (Open MPI' default2.out || { cat default2.out; fail "no describe line"; }
grep -q 'rank 0 of 2, 2 on this node, timeout 300 s' default2.out ||
  { cat default2.out; fail "describe does not say the ranks and the default timeout"; }
for np in 2 3 4; do
  run_job blocking$np "$np" "$CHECK" "$PLUGIN" timeout=0 --rs-tolerance=1e-5
  [ "$rc" -eq 0 ] && [ "$(passes blocking$np)" -eq "$np" ] ||
    { cat blocking$np.out; fail "with timeout=0 comm_check did not pass on every rank"; }
  echo "mpi: $np ranks, blocking (timeout=0): reduce_scatter $(rs_finding blocking$np)"
done
grep -q 'no timeout' blocking2.out || { cat blocking2.out; fail "describe lacks 'no timeout'"; }

# b) a rank dies: mpirun must end the job (no hang), name it and report failure
for np in 2 3 4; do
  for where in "" :reduce_scatter :allgather; do
    case $where in
      "") bad=1 ;;
      :reduce_scatter) bad=$((np - 1)) ;;
      *) bad=0 ;;
    esac
    name=die$np$(echo "$where" | tr -d :)
    run_job "$name" "$np" "$CHECK" "$PLUGIN" "--die=$bad$where"
    grep -q "rank $bad/$np: dying" "$name.out" || { cat "$name.out"; fail "rank $bad did not reach its death"; }
    [ "$rc" -ne 0 ] || { cat "$name.out"; fail "a killed rank left mpirun with exit status 0"; }
    [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
      { cat "$name.out"; fail "the job hung for ${took}s after a rank died"; }
    [ "$(passes "$name")" -eq 0 ] || { cat "$name.out"; fail "a rank passed although its peer died"; }
    grep -q "process rank $bad .*signal 9" "$name.out" || { cat "$name.out"; fail "mpirun did not name rank $bad"; }
    echo "mpi: $np ranks, rank $bad killed${where:+ inside ${where#:}}: job over in ${took}s"
  done
done

# c) a rank stops without dying: the timeout option turns the wait into an
# error on every other rank, naming it
run_job stall 2 "$CHECK" "$PLUGIN" --stall=1 timeout=3
grep -q 'rank 0/2: FAIL: allreduce_sum.*did not complete within 3 s.*rank 1 did not arrive' stall.out ||
  { cat stall.out; fail "rank 0 did not report the timeout"; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
  { cat stall.out; fail "a stalled rank: exit $rc after ${took}s"; }
for np in 2 3 4; do
  for where in "" :reduce_scatter :allgather; do
    case $where in
      "") bad=$((np - 1)) ;;
      :reduce_scatter) bad=1 ;;
      *) bad=0 ;;
    esac
    name=stall$np$(echo "$where" | tr -d :)
    run_job "$name" "$np" "$CHECK" "$PLUGIN" "--stall=$bad$where" timeout=2
    # mpirun ends the job as soon as the first rank exits, so a rank may be
    # killed before it says anything; those that do must name rank $bad
    named=$(grep -c "FAIL: .*rank $bad did not arrive" "$name.out" || true)
    [ "$named" -ge 1 ] || { cat "$name.out"; fail "$name: no rank named rank $bad"; }
    ! grep "FAIL: .*did not arrive" "$name.out" | grep -v "rank $bad did not arrive" ||
      { cat "$name.out"; fail "$name: a rank named another rank than $bad"; }
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
      { cat "$name.out"; fail "$name: exit $rc after ${took}s"; }
    echo "mpi: $np ranks, rank $bad made to stall${where:+ inside ${where#:}}: job over in ${took}s, named by $named rank(s) ($(grep -o 'failed [0-9.]* s after the fault' "$name.out" | sort | tail -n 1))"
  done
done

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
echo "mpi comm plugin: 2, 3 and 4 ranks pass; dead, stopped and mislabelled ranks end the job;"
echo "  2 MPI ranks train like 1 process"
