#!/bin/sh
# Sums among some ranks (the comm vtable's allreduce_group, for pipeline
# replicas) through the plugin ABI alone: tests/comm_check --only-groups on
# 2 to 5 ranks of each comm plugin built here that runs on CPUs (mpi under
# mpirun, tcp on ranks started here).
#   a) every pair of ranks (ring neighbours or not: tcp opens links of its
#      own), groups that share ranks called one after another in the same
#      order, a rank alone, the world, sizes beyond the tcp scratch; the
#      same bits on every member; a rank outside the list refused; and
#      reduce_scatter_group / allgather_group (ABI 2.7) among pairs,
#      overlapping groups and the world, the reduce-scatter's parts with
#      allreduce_group's bits
#   b) a member killed inside a sum with a rank half the world away (no
#      ring neighbour on 4 ranks) while the rest wait in an allreduce: tcp,
#      every other rank fails naming it within seconds; mpi, mpirun ends
#      the job naming it
#   c) the same member stopped (SIGSTOP): the others fail after the
#      timeout option, naming it
# (mpi.sh and parallel.sh run comm_check whole, groups included.)
. "$(dirname "$0")/lib.sh"
comm_check_env

passes() { grep -c ': PASS' "$1" || true; }
checked="allreduce_group passes among pairs (ring neighbours and not) and overlapping groups"
parts="reduce_scatter_group and allgather_group pass among pairs, overlapping groups and the world"

# ---- mpi ---------------------------------------------------------------------
if command -v mpirun > /dev/null 2>&1 && [ -f "$MPI" ]; then
  # check_job NAME NP ARGS...: comm_check's only-groups checks under lib.sh's mpi_job
  check_job() {
    n=$1 p=$2
    shift 2
    mpi_job "$n" "$p" "$CHECK" "$MPI" --only-groups "$@"
  }
  for np in 2 3 4; do
    check_job mpi$np $np timeout=300
    [ "$rc" -eq 0 ] && [ "$(passes mpi$np.out)" -eq $np ] && grep -q "$checked" mpi$np.out &&
      grep -q "$parts" mpi$np.out ||
      { cat mpi$np.out; fail "mpi allreduce_group on $np ranks"; }
    echo "groups: mpi, $np ranks: pass in ${took}s"
  done
  np=4 bad=1
  check_job mpi-die $np "--die=$bad:group"
  grep -q "rank $bad/$np: dying" mpi-die.out || { cat mpi-die.out; fail "rank $bad did not reach its death"; }
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
    { cat mpi-die.out; fail "mpi, rank $bad killed inside allreduce_group: exit $rc after ${took}s"; }
  grep -q "process rank $bad .*signal 9" mpi-die.out || { cat mpi-die.out; fail "mpirun did not name rank $bad"; }
  echo "groups: mpi, $np ranks, rank $bad killed inside a group's sum: job over in ${took}s"
  check_job mpi-stall $np "--stall=$bad:group" timeout=2
  named=$(grep -c "FAIL: .*rank $bad did not arrive" mpi-stall.out || true)
  [ "$named" -ge 1 ] || { cat mpi-stall.out; fail "mpi: no rank named the stopped rank $bad"; }
  ! grep "FAIL: .*did not arrive" mpi-stall.out | grep -v "rank $bad did not arrive" ||
    { cat mpi-stall.out; fail "mpi: a rank named another rank than $bad"; }
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
    { cat mpi-stall.out; fail "mpi, rank $bad stopped inside allreduce_group: exit $rc after ${took}s"; }
  echo "groups: mpi, $np ranks, rank $bad stopped inside a group's sum: named by $named rank(s), job over in ${took}s"
else
  echo "groups: mpi skipped (no mpirun, or comm_mpi.so not built)"
fi
# ---- tcp ---------------------------------------------------------------------
[ -f "$TCP" ] || fail "$TCP was not built"
for np in 2 3 4 5; do
  tcp_check tcp$np $np -1 --only-groups timeout=30
  r=0
  while [ $r -lt $np ]; do
    grep -q "rank $r/$np: PASS" tcp$np.$r || { cat tcp$np.*; fail "tcp allreduce_group on $np ranks: rank $r"; }
    r=$((r + 1))
  done
  grep -q "$checked" tcp$np.0 || { cat tcp$np.0; fail "tcp on $np ranks: allreduce_group not checked"; }
  grep -q "$parts" tcp$np.0 || { cat tcp$np.0; fail "tcp on $np ranks: a group's reduce-scatter and all-gather not checked"; }
  echo "groups: tcp, $np ranks: pass in ${took}s"
done
# a member killed (SIGKILL) or stopped (SIGSTOP) inside a sum with a rank
# that is no ring neighbour (4 ranks: 1 with 3; 5 ranks: 2 with 4): every
# other rank fails naming it, soon after comm.timeout
for np in 4 5; do
  bad=$((np - 3))
  for fault in die stall; do
    name=tcp-$fault$np
    tcp_check $name $np $bad --only-groups timeout=2 "--$fault=$bad:group"
    others_failed_naming $name $np $bad $fault groups "rank $bad made to $fault inside a group's sum"
  done
done
echo "groups: ok"
