#!/bin/sh
# Point to point (the comm vtable's sendrecv, for pipeline stages) through
# the plugin ABI alone: tests/comm_check --only-sendrecv on 2, 3 and 4 ranks
# of each comm plugin built here that runs on CPUs (mpi under mpirun, tcp
# on ranks started here).
#   a) every rank sends to its ring neighbour at once, both ways, pairs
#      exchange in one call, send-only and receive-only calls along a
#      chain, with messages of 12 MiB (more than the sockets hold, so a
#      send that waited for its receive would deadlock), small messages
#      arrive in the order sent, peers two ranks away exchange 12 MiB both
#      ways (tcp: on links of their own, opened on first use), and peers
#      that do not exist are refused
#   b) a rank killed inside sendrecv (tcp: also one sending two ranks
#      ahead): tcp, every other rank fails naming it within seconds; mpi,
#      mpirun ends the job naming it
#   c) a rank stopped (SIGSTOP) inside sendrecv: the others fail after
#      the timeout option, naming it
# (mpi.sh and parallel.sh run comm_check whole, sendrecv included.)
. "$(dirname "$0")/lib.sh"
comm_check_env

passes() { grep -c ': PASS' "$1" || true; }

# ---- mpi ---------------------------------------------------------------------
if command -v mpirun > /dev/null 2>&1 && [ -f "$MPI" ]; then
  # check_job NAME NP ARGS...: comm_check's only-sendrecv checks under lib.sh's mpi_job
  check_job() {
    n=$1 p=$2
    shift 2
    mpi_job "$n" "$p" "$CHECK" "$MPI" --only-sendrecv "$@"
  }
  for np in 2 3 4; do
    for timeout in 300 0; do
      check_job mpi$np-$timeout $np timeout=$timeout
      [ "$rc" -eq 0 ] && [ "$(passes mpi$np-$timeout.out)" -eq $np ] ||
        { cat mpi$np-$timeout.out; fail "mpi sendrecv on $np ranks (timeout=$timeout)"; }
    done
    grep -q "sendrecv passes between ring neighbours$( [ $np -ge 4 ] && echo ' and beyond')" \
      mpi$np-300.out || { cat mpi$np-300.out; fail "mpi on $np ranks: sendrecv not checked"; }
    echo "sendrecv: mpi, $np ranks: pass (in ${took}s without a timeout)"
  done
  for np in 2 3; do
    bad=$((np - 1))
    check_job mpi-die$np $np "--die=$bad:sendrecv"
    grep -q "rank $bad/$np: dying" mpi-die$np.out || { cat mpi-die$np.out; fail "rank $bad did not reach its death"; }
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
      { cat mpi-die$np.out; fail "mpi, rank $bad killed inside sendrecv: exit $rc after ${took}s"; }
    grep -q "process rank $bad .*signal 9" mpi-die$np.out || { cat mpi-die$np.out; fail "mpirun did not name rank $bad"; }
    echo "sendrecv: mpi, $np ranks, rank $bad killed inside it: job over in ${took}s"
    check_job mpi-stall$np $np "--stall=$bad:sendrecv" timeout=2
    named=$(grep -c "FAIL: .*sendrecv.*rank $bad did not arrive" mpi-stall$np.out || true)
    [ "$named" -ge 1 ] || { cat mpi-stall$np.out; fail "mpi: no rank named the stopped rank $bad"; }
    ! grep "FAIL: .*did not arrive" mpi-stall$np.out | grep -v "rank $bad did not arrive" ||
      { cat mpi-stall$np.out; fail "mpi: a rank named another rank than $bad"; }
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 30 ] ||
      { cat mpi-stall$np.out; fail "mpi, rank $bad stopped inside sendrecv: exit $rc after ${took}s"; }
    echo "sendrecv: mpi, $np ranks, rank $bad stopped inside it: named by $named rank(s), job over in ${took}s"
  done
else
  echo "sendrecv: mpi skipped (no mpirun, or comm_mpi.so not built)"
fi
# ---- tcp ---------------------------------------------------------------------
[ -f "$TCP" ] || fail "$TCP was not built"
for np in 2 3 4; do
  tcp_check tcp$np $np -1 --only-sendrecv timeout=30
  r=0
  while [ $r -lt $np ]; do
    grep -q "rank $r/$np: PASS" tcp$np.$r || { cat tcp$np.*; fail "tcp sendrecv on $np ranks: rank $r"; }
    r=$((r + 1))
  done
  grep -q "sendrecv passes between ring neighbours$( [ $np -ge 4 ] && echo ' and beyond')\$" tcp$np.0 ||
    { cat tcp$np.0; fail "tcp on $np ranks: sendrecv not checked"; }
  echo "sendrecv: tcp, $np ranks: pass in ${took}s"
  # a rank killed (SIGKILL) or stopped (SIGSTOP) inside sendrecv: every
  # other rank fails naming it, soon after comm.timeout
  for fault in die stall; do
    bad=$((np - 1))
    [ $np -eq 3 ] && bad=1
    name=tcp-$fault$np
    tcp_check $name $np $bad --only-sendrecv timeout=2 "--$fault=$bad:sendrecv"
    others_failed_naming $name $np $bad $fault sendrecv "rank $bad made to $fault inside it"
  done
  # the same with every rank sending to the rank two ahead (no ring
  # neighbour: links opened on first use, the higher rank accepting inside
  # the call)
  [ $np -ge 4 ] || continue
  for fault in die stall; do
    bad=1 name=tcp-far-$fault$np
    tcp_check $name $np $bad --only-sendrecv timeout=2 "--$fault=$bad:sendfar"
    others_failed_naming $name $np $bad $fault sendrecv "rank $bad made to $fault inside a send two ranks away"
  done
done
echo "sendrecv: ok"
