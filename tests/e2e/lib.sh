# Shared by the end-to-end scripts: a scratch directory and small checks.
# make check sets TRAINRUN (the binary), TR_SRCDIR and TR_BUILDDIR.
set -eu
: "${TRAINRUN:?run through make check}"
: "${TR_SRCDIR:?run through make check}"
work=$(mktemp -d "${TMPDIR:-/tmp}/trainrun-e2e.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

# the last value of a metric in a metrics.jsonl file
last_metric() {
  grep "\"$2\"" "$1" | tail -n 1 | sed -e "s/.*\"$2\": *\([-0-9.e+]*\).*/\1/"
}

# a < b for decimal numbers
less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# wait for pid $1 to end within $2 seconds; else kill it (-9) and return 1
ended_within() {
  n=0
  while kill -0 "$1" 2>/dev/null; do
    n=$((n + 1))
    if [ $n -gt $(($2 * 20)) ]; then
      kill -9 "$1" 2>/dev/null
      return 1
    fi
    sleep 0.05
  done
}

# A free loopback port drawn below the kernel's ephemeral range, as the
# launcher draws its own (core/commands/launch.c): a port that binding 0
# returned can be handed to another connection before a rank binds it.
free_port() {
  python3 - <<'PY'
import random, socket
low = 32768
try:
    a = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    low = a if a > 21024 else low
except (OSError, ValueError, IndexError):
    pass
for _ in range(64):
    port = random.randrange(20000, low)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])
PY
}

# tests/comm_check ($CHECK) over comm_tcp.so ($TCP, or $COMM_SO) on ranks
# started here, one thread each: tcp_check NAME NP FAULTY ARGS... leaves
# rank r's output in NAME.r and the time until every rank but FAULTY (-1:
# none) had exited in $took; FAULTY, stopped or asleep, is killed then
tcp_check() {
  name=$1 np=$2 faulty=$3
  shift 3
  port=$(free_port)
  pids="" r=0 t0=$(date +%s)
  while [ $r -lt "$np" ]; do
    TRAINRUN_RANK=$r TRAINRUN_WORLD_SIZE=$np TRAINRUN_LOCAL_RANK=$r TRAINRUN_LOCAL_WORLD_SIZE=$np \
      TRAINRUN_MASTER=127.0.0.1:$port OMP_NUM_THREADS=1 "$CHECK" "${COMM_SO:-$TCP}" "$@" > "$name.$r" 2>&1 &
    pids="$pids $!" r=$((r + 1))
  done
  waited=0
  while :; do
    alive=0 r=0
    for p in $pids; do
      [ $r -ne "$faulty" ] && kill -0 "$p" 2>/dev/null && alive=1
      r=$((r + 1))
    done
    [ $alive -eq 0 ] && break
    waited=$((waited + 1))
    [ $waited -le 600 ] || { kill -KILL $pids 2>/dev/null; cat "$name".*; fail "$name: ranks still running after 60 s"; }
    sleep 0.1
  done
  took=$(($(date +%s) - t0))
  kill -KILL $pids 2>/dev/null || true
  for p in $pids; do wait "$p" 2>/dev/null || true; done
}

# after tcp_check NAME NP BAD ... with rank BAD made to die or stall
# (FAULT): every other rank failed naming it, within 10 s; says so,
# prefixed with WHAT ("rank 2 made to die inside it")
others_failed_naming() { # NAME NP BAD FAULT PREFIX WHAT
  [ "$4" = die ] && want="lost rank $3 " || want="rank $3 did not answer"
  r=0
  while [ $r -lt "$2" ]; do
    if [ $r -ne "$3" ]; then
      grep -q "rank $r/$2: FAIL: .*$want" "$1.$r" ||
        { cat "$1".*; fail "$1: rank $r did not fail naming rank $3"; }
    fi
    r=$((r + 1))
  done
  [ "$took" -le 10 ] || { cat "$1".*; fail "$1: the other ranks took ${took}s to fail"; }
  echo "$5: tcp, $2 ranks, $6: the others failed in ${took}s ($(grep -ho 'failed [0-9.]* s after the fault' "$1".* | sort | tail -n 1))"
}

# mpirun as the comm tests run it: root in containers; more ranks than cores;
# no pinning on a shared machine; no cross-memory attach (containers often
# forbid ptrace)
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none \
  --mca btl_vader_single_copy_mechanism none"

# mpi_job NAME NP ARGS...: mpirun -np NP ARGS... under a 60 s guard, its
# output in NAME.out, its status in $rc and its duration in $took (seconds)
mpi_job() {
  name=$1 np=$2
  shift 2
  start=$(date +%s)
  set +e
  timeout 60 $MPIRUN -np "$np" "$@" > "$name.out" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - start))
}

# metrics.jsonl's KEYS (default: step losses, validation loss, accuracy,
# loss scale and skipped steps) of runs A and B agree within a relative
# tolerance, step by step (the steps both logged)
agree() { # agree A B TOLERANCE [KEYS]
  awk -v tol="$3" -v a="$1" -v b="$2" -v names="${4:-loss val_loss accuracy loss_scale skipped_steps}" '
    function field(line, key,   v) {
      if (!match(line, "\"" key "\": *[-0-9.e+]+")) return ""
      v = substr(line, RSTART, RLENGTH); sub(/.*: */, "", v); return v
    }
    {
      step = field($0, "step")
      for (k = 1; k <= nk; k++) {
        v = field($0, keys[k])
        if (v == "") continue
        if (FILENAME == ARGV[1]) want[step, keys[k]] = v
        else if ((step, keys[k]) in want) {
          d = v - want[step, keys[k]]; if (d < 0) d = -d
          s = want[step, keys[k]] + 0; if (s < 0) s = -s; if (s < 1e-30) s = 1e-30
          if (d / s > worst) { worst = d / s; what = keys[k] " at step " step }
          n++
        }
      }
    }
    BEGIN { nk = split(names, keys, " ") }
    END {
      if (n == 0) { printf "%s vs %s: no step in common\n", a, b; exit 1 }
      if (worst > tol) { printf "%s vs %s: %s differs by %.3g > %g\n", a, b, what, worst, tol; exit 1 }
      printf "%s vs %s: %d values agree (worst relative difference %.2g)\n", a, b, n, worst
    }' "$1/metrics.jsonl" "$2/metrics.jsonl" || fail "$1 and $2 disagree"
}

# term_after PID DIR N: once DIR/metrics.jsonl logs N step losses (or PID
# has ended), SIGTERM to PID and wait for it; its exit status in $code
term_after() {
  while [ ! -s "$2/metrics.jsonl" ] || [ "$(grep -c '"loss"' "$2/metrics.jsonl")" -lt "$3" ]; do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.01
  done
  kill -TERM "$1" 2>/dev/null || true
  set +e
  wait "$1"
  code=$?
  set -e
}

# comm_check_env: CHECK (tests/comm_check; the test fails where it was not
# built), MPI and TCP (the comm plugins as built), and no launcher's rank
# variables: the ranks come from mpirun or from tcp_check here
comm_check_env() {
  CHECK=$TR_BUILDDIR/tests/comm_check
  [ -x "$CHECK" ] || fail "$CHECK was not built"
  MPI=${TR_PLUGIN_BUILD_DIR:-}/comm_mpi.so
  TCP=${TR_PLUGIN_BUILD_DIR:-}/comm_tcp.so
  unset TRAINRUN_RANK TRAINRUN_WORLD_SIZE TRAINRUN_LOCAL_RANK TRAINRUN_LOCAL_WORLD_SIZE \
    SLURM_PROCID SLURM_NTASKS SLURM_LOCALID TRAINRUN_MASTER TRAINRUN_RENDEZVOUS_FILE
}

# nccl_harness: device=cuda ranks on the CUDA-on-CPU harness talking
# through its fake NCCL (tests/cudacpu/nccl.cpp).  The built-in plugin
# directory comes before --plugin-path and TRAINRUN_PLUGIN_PATH
# (core/config/plugin.c: the first comm_nccl.so found wins), and a build
# with NCCL holds the real plugin there.  So the cuda ranks run a copy of
# trainrun in an installed layout of its own (core/config/run_env.c:
# <prefix>/bin/trainrun finds <prefix>/lib/trainrun/plugins), whose plugins
# are the build's but for comm_nccl.so, the harness's: $CUDA_TRAINRUN.
# Each local rank gets an emulated device of its own (CUDACPU_DEVICES=2).
nccl_harness() {
  : "${TR_CUDACPU_DIR:?run through make check}"
  : "${TR_CUDACPU_COMM_DIR:?run through make check}"
  : "${TR_PLUGIN_BUILD_DIR:?run through make check}"
  [ -f "$TR_CUDACPU_COMM_DIR/comm_nccl.so" ] ||
    fail "no $TR_CUDACPU_COMM_DIR/comm_nccl.so (make check builds it)"
  mkdir -p inst/bin inst/lib/trainrun/plugins inst/share/trainrun
  cp "$TRAINRUN" inst/bin/trainrun
  for so in "$TR_PLUGIN_BUILD_DIR"/*.so; do
    [ "$(basename "$so")" = comm_nccl.so ] || ln -sf "$so" inst/lib/trainrun/plugins/
  done
  ln -sf "$TR_CUDACPU_COMM_DIR/comm_nccl.so" inst/lib/trainrun/plugins/comm_nccl.so
  ln -sfn "$TR_SRCDIR/lua" inst/share/trainrun/lua
  ln -sfn "$TR_SRCDIR/recipes" inst/share/trainrun/recipes
  CUDA_TRAINRUN=$PWD/inst/bin/trainrun
  export CUDACPU_DEVICES=2 TRAINRUN_BACKEND_PATH="$TR_CUDACPU_DIR"
}
