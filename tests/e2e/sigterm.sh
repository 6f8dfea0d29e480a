#!/bin/sh
# SIGTERM always ends a run, within a deadline, with a checkpoint that
# loads: during the first step, while the loader is blocked in a read that
# never returns, during checkpoint writes; a failing read ends the run with
# its reason instead of a hang.  The data plugin "stall" (tests/plugins)
# blocks or fails its reads after a given number.
. "$(dirname "$0")/lib.sh"
: "${TR_BUILDDIR:?}"
TRAINRUN_PLUGIN_PATH="$TR_BUILDDIR/tests/plugins/.libs"
export TRAINRUN_PLUGIN_PATH
[ -f "$TRAINRUN_PLUGIN_PATH/data_stall.so" ] || fail "no data_stall.so in $TRAINRUN_PLUGIN_PATH"
recipe() { # file, data options
  cat > "$1" <<L
return {
  model = mlp { inputs = 8, hidden = { 16 }, classes = 3 },
  data = { plugin = "stall", $2 },
  train = { steps = 100000, batch = 8, micro_batch = 4, workers = 2, log_every = 1 },
}
L
}
# run_dir: the checkpoint LATEST names loads and resumes (reads no longer stall;
# the recorded recipe had data.stall_after set, hence --allow-changes)
resumes() {
  recipe ok.lua "stall_after = 0"
  "$TRAINRUN" ok.lua train.steps="$2" run_dir="$1" --resume auto --allow-changes --quiet 2> err.txt \
    || { cat err.txt; fail "$1: resuming after SIGTERM failed"; }
  grep -q "resumed from checkpoint" err.txt || { cat err.txt; fail "$1: nothing to resume"; }
}
stop() { # pid, name: SIGTERM now, exit 75 within 10 s
  kill -TERM "$1"
  ended_within "$1" 10 || { cat "$2.err"; fail "$2: SIGTERM did not end the run within 10 s"; }
  set +e; wait "$1"; code=$?; set -e
  [ $code -eq 75 ] || { cat "$2.err"; fail "$2: exit code $code after SIGTERM, expected 75"; }
}

# --- the loader blocked during the first step (its second read never returns)
recipe first.lua "stall_after = 1"
rm -f stalled
"$TRAINRUN" first.lua run_dir=first 2> first.err > /dev/null &
pid=$!
while [ ! -e stalled ]; do kill -0 $pid 2>/dev/null || { cat first.err; fail "first: ended early"; }; sleep 0.02; done
stop $pid first
grep -q "step 0 saved" first.err || { cat first.err; fail "first: no checkpoint of step 0"; }
resumes first 3

# --- the loader blocked mid-run -----------------------------------------------------
recipe mid.lua "stall_after = 41"
rm -f stalled
"$TRAINRUN" mid.lua run_dir=mid checkpoint.every=5 2> mid.err > /dev/null &
pid=$!
while [ ! -e stalled ]; do kill -0 $pid 2>/dev/null || { cat mid.err; fail "mid: ended early"; }; sleep 0.02; done
sleep 0.3 # the step loop is now waiting on the stuck workers
stop $pid mid
grep -q "received signal 15: checkpoint of step" mid.err || { cat mid.err; fail "mid: no checkpoint"; }
resumes mid 25

# --- a failing read ends the run with its reason, also with a worker stuck -------------
recipe fails.lua "fail_after = 30"
"$TRAINRUN" fails.lua run_dir=fails 2> fails.err > /dev/null &
pid=$!
ended_within $pid 20 || { cat fails.err; fail "a failing read did not end the run"; }
set +e; wait $pid; code=$?; set -e
[ $code -eq 1 ] || { cat fails.err; fail "failing read: exit code $code"; }
grep -q "read 3[0-9] fails" fails.err || { cat fails.err; fail "failing read: no reason given"; }

# one worker stuck in a read while another's read fails: the run still ends
recipe stuckfail.lua "stall_after = 30, fail_after = 31"
"$TRAINRUN" stuckfail.lua run_dir=stuckfail 2> stuckfail.err > /dev/null &
pid=$!
ended_within $pid 20 || { cat stuckfail.err; fail "a failed read beside a stuck one hung the run"; }
set +e; wait $pid; code=$?; set -e
[ $code -eq 1 ] || { cat stuckfail.err; fail "stuck and failing reads: exit code $code"; }
grep -q "read 3[0-9] fails" stuckfail.err || { cat stuckfail.err; fail "stuck and failing: no reason"; }

# --- during checkpoint writes: a checkpoint every step, signals at three moments -------
recipe ok.lua "stall_after = 0"
for delay in 0 0.1 0.4; do
  "$TRAINRUN" ok.lua run_dir="w$delay" checkpoint.every=1 2> "w$delay.err" > /dev/null &
  pid=$!
  # steps have begun (the handler is in place), then a moment into the saves
  while [ ! -s "w$delay/metrics.jsonl" ]; do
    kill -0 $pid 2>/dev/null || { cat "w$delay.err"; fail "w$delay: ended early"; }
    sleep 0.02
  done
  sleep $delay
  kill -0 $pid 2>/dev/null || { cat "w$delay.err"; fail "w$delay: ended early"; }
  stop $pid "w$delay"
  "$TRAINRUN" export "w$delay" -o "w$delay.safetensors" --dtype fp32 2> err.txt \
    || { cat err.txt; fail "w$delay: the checkpoint written at SIGTERM does not verify"; }
done
# --- an evaluation that fails after training: the weights it evaluated are
# saved first (exit 1, a checkpoint of the last step that loads)
recipe evalfails.lua "fail_val = true"
if "$TRAINRUN" evalfails.lua train.steps=6 train.eval_every=6 train.eval_batches=1 \
     checkpoint.every=0 run_dir=evalfails 2> evalfails.err; then
  fail "a run whose evaluation fails succeeded"
fi
grep -q "the evaluation at step 6 failed (below); the weights it evaluated are saved in checkpoint step-0000000006" evalfails.err &&
  grep -q "a validation read fails" evalfails.err || { cat evalfails.err; fail "evaluation failure message"; }
"$TRAINRUN" export evalfails -o evalfails.safetensors --dtype fp32 2> err.txt ||
  { cat err.txt; fail "the checkpoint saved before a failed evaluation does not verify"; }
echo "sigterm: ok"
