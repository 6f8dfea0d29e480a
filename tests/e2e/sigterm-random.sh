#!/bin/sh
# SIGTERM at a random moment of training, many times over: every run exits
# 75 with a checkpoint, and that checkpoint resumes.  Runs go through the
# combinations of compute threads (1, 2), loader workers (0, 2) and
# checkpoint writes (async on, off; a checkpoint every 50 steps, so some
# signals land during writes).  The model is small but has GEMMs with K >= 256,
# where oneDNN's AVX/AVX-512 f32 kernels point the stack pointer at a heap
# workspace: a signal handled on a compute thread there writes its frame into
# the heap (aborts in free(), SIGSEGV, hangs; core/engine/stop_signals.h).
# So every thread but the one that takes them (trainrun-signal) must keep
# the stop signals blocked; that is checked first, where /proc shows it.
#
# TR_SIGTERM_RUNS (default 50) sets the number of runs, TR_SIGTERM_SEED the
# random moments (printed, so a failure can be replayed).
. "$(dirname "$0")/lib.sh"
runs=${TR_SIGTERM_RUNS:-50}
seed=${TR_SIGTERM_SEED:-$$}
echo "sigterm-random: $runs runs, seed $seed"
cat > r.lua <<'L'
return {
  model = gpt { vocab = 64, ctx = 32, layers = 2, heads = 2, dim = 128 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 1000 },
  train = { steps = 100000, batch = 8, log_every = 1 },
  checkpoint = { every = 50, keep = 2 },
}
L
# the random delays, one a run: 0 to 0.5 s after the 20th logged step (past
# the first steps, where oneDNN generates its kernels)
awk -v n="$runs" -v s="$seed" 'BEGIN { srand(s); for (i = 0; i < n; i++) printf "%.3f\n", rand() * 0.5 }' > delays

# 20 steps are logged, or the run ended
started() { # pid, run_dir
  while [ "$(cat "$2/metrics.jsonl" 2>/dev/null | grep -c '"loss"')" -lt 20 ]; do
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.01
  done
}

# --- every thread of a run blocks SIGTERM, SIGINT and SIGUSR1 (bits 15, 2, 10) ---
# (a failure here is counted with the runs' below, which run all the same)
bad=0
"$TRAINRUN" r.lua run_dir=mask train.threads=2 train.workers=2 > /dev/null 2> mask.err &
pid=$!
started $pid mask || { cat mask.err; fail "mask: ended early"; }
sleep 0.3 # the checkpoint writer's and OpenMP's threads are up too
if [ -d "/proc/$pid/task" ]; then
  threads=0 takers="" waiters=0
  for t in /proc/$pid/task/*; do
    blk=$(sed -n 's/^SigBlk:[[:space:]]*//p' "$t/status" 2>/dev/null) || continue
    [ -n "$blk" ] || continue
    threads=$((threads + 1))
    # the thread that takes them shows them unblocked while it waits in sigwait
    if [ "$(cat "$t/comm")" = trainrun-signal ]; then
      waiters=$((waiters + 1))
      continue
    fi
    low=$(printf '%d' "0x$(echo "$blk" | cut -c9-16)") # the low 32 bits of 16 hex digits
    [ $((low & 0x4202)) -eq $((0x4202)) ] || takers="$takers $(basename "$t") (SigBlk $blk)"
  done
  if [ -n "$takers" ] || [ $waiters -ne 1 ]; then
    echo "FAIL: of $threads threads, $waiters named trainrun-signal; these take stop signals:$takers" >&2
    bad=$((bad + 1))
  elif [ $threads -lt 5 ]; then
    echo "FAIL: mask: only $threads threads seen" >&2
    bad=$((bad + 1))
  else
    echo "sigterm-random: all $threads threads but trainrun-signal block the stop signals"
  fi
fi
kill -TERM $pid
ended_within $pid 10 || fail "mask: no exit within 10 s of SIGTERM"
set +e; wait $pid; code=$?; set -e
[ $code -eq 75 ] || { echo "FAIL: mask: exit code $code after SIGTERM, expected 75" >&2; bad=$((bad + 1)); }

# --- SIGTERM at random moments ----------------------------------------------------
i=0 tally=""
while [ $i -lt "$runs" ]; do
  i=$((i + 1))
  th=$((1 + i % 2)) wk=$((i / 2 % 2 * 2)) as=$([ $((i / 4 % 2)) -eq 0 ] && echo true || echo false)
  d=run$i
  delay=$(sed -n "${i}p" delays)
  what="run $i (threads=$th workers=$wk async=$as, SIGTERM ${delay} s in)"
  "$TRAINRUN" r.lua run_dir=$d train.threads=$th train.workers=$wk checkpoint.async=$as \
    > /dev/null 2> $d.err &
  pid=$!
  started $pid $d || { cat $d.err; fail "$what: ended before training"; }
  sleep "$delay"
  kill -TERM $pid
  if ended_within $pid 10; then
    set +e; wait $pid; code=$?; set -e
  else
    wait $pid 2>/dev/null || true
    code=hang
  fi
  tally="$tally $code"
  step=$(sed -n 's/.*received signal 15: checkpoint of step \([0-9]*\) saved.*/\1/p' $d.err)
  if [ "$code" != 75 ] || [ -z "$step" ] || [ ! -s $d/checkpoints/LATEST ]; then
    echo "FAIL: $what: exit $code, $(tail -n 1 $d.err)" >&2
    bad=$((bad + 1))
    continue
  fi
  # the checkpoint resumes and training goes on from it
  "$TRAINRUN" r.lua run_dir=$d train.threads=$th train.workers=$wk checkpoint.async=$as \
    train.steps=$((step + 2)) --resume auto --quiet 2> $d.resume ||
    { echo "FAIL: $what: resume from step $step: $(tail -n 1 $d.resume)" >&2; bad=$((bad + 1)); continue; }
  grep -q "resumed from checkpoint" $d.resume ||
    { echo "FAIL: $what: nothing resumed" >&2; bad=$((bad + 1)); continue; }
  [ "$(last_metric $d/metrics.jsonl step)" = $((step + 2)) ] ||
    { echo "FAIL: $what: resumed at $step, ended at $(last_metric $d/metrics.jsonl step)" >&2; bad=$((bad + 1)); continue; }
  rm -rf $d
done
counts=$(echo $tally | tr ' ' '\n' | sort | uniq -c | awk '{ printf "%s exit %s: %d", (NR > 1 ? "," : ""), $2, $1 }')
echo "sigterm-random:$counts"
[ $bad -eq 0 ] || fail "$bad failures (seed $seed)"
echo "sigterm-random: ok"
