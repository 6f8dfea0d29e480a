#!/bin/sh
# One run directory, one writer: a second run on a busy run_dir refuses at
# once and names the holder; a killed holder leaves no stuck lock; the ranks
# of one job do not refuse each other; a report reads a running run.  A full
# disk while metrics.jsonl or trace.json is written stops the run with the
# file and the reason, keeps the last checkpoint, and --resume auto goes on.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
long="train.steps=100000000 train.log_every=50 checkpoint.every=0 train.trace_every=0"

# start a long run in the background on $1 (more arguments: overrides); $pid
start() {
  dir=$1
  shift
  "$TRAINRUN" "$R" $long run_dir="$dir" "$@" --quiet > /dev/null 2> "$dir.err" &
  pid=$!
  while [ ! -s "$dir/metrics.jsonl" ]; do
    kill -0 $pid 2>/dev/null || { cat "$dir.err"; fail "the run on $dir did not start"; }
    sleep 0.05
  done
}

# --- a second run on a busy run_dir -------------------------------------------------
start a
first=$(head -n 1 a/metrics.jsonl)
set +e
"$TRAINRUN" "$R" train.steps=5 run_dir=a --quiet 2> second.txt
code=$?
set -e
[ $code -eq 1 ] || { cat second.txt; fail "the second run on a busy run_dir exited $code, not 1"; }
grep -q "run directory a is in use by another trainrun (pid $pid on $(hostname), started 20[0-9-]* [0-9:]* UTC: .*tiny.lua .*run_dir=a" second.txt \
  || { cat second.txt; fail "the refusal does not name the holder"; }
grep -q "run_dir=" second.txt || fail "the refusal does not say what to do"
kill -0 $pid 2>/dev/null || { cat a.err; fail "the first run died"; }
[ "$(head -n 1 a/metrics.jsonl)" = "$first" ] || fail "the second run touched the first one's metrics"
# readers need no lock: a report of the running run
"$TRAINRUN" report a > report.txt 2>&1 || { cat report.txt; fail "report of a running run"; }
# a SIGKILLed holder leaves no stuck lock: the next run starts at once
kill -KILL $pid
wait $pid 2>/dev/null || true
"$TRAINRUN" "$R" train.steps=5 run_dir=a --resume auto --quiet 2> third.txt || { cat third.txt; fail "the lock outlived a killed run"; }
# a fresh start would cut the earlier run's metrics and mix checkpoints of two runs
set +e
"$TRAINRUN" "$R" train.steps=5 run_dir=a --quiet 2> fresh.txt
code=$?
set -e
[ $code -eq 1 ] || { cat fresh.txt; fail "a fresh start over an earlier run: exit $code, not 1"; }
grep -q "a holds an earlier run (a/metrics.jsonl and its checkpoints): continue it with --resume auto" fresh.txt \
  || { cat fresh.txt; fail "no message for a fresh start over an earlier run"; }
[ "$(head -n 1 a/metrics.jsonl)" = "$first" ] || fail "the refused fresh start touched the metrics"

# a reader of a running run (sample loads its checkpoints) leaves the saves in
# progress alone: it once took them for leftovers of a crash and deleted them
"$TRAINRUN" "$R" $long checkpoint.every=1 checkpoint.keep=2 run_dir=live --quiet > /dev/null 2> live.err &
pid=$!
while [ ! -f live/checkpoints/LATEST ]; do kill -0 $pid 2>/dev/null || { cat live.err; fail "no checkpoint"; }; sleep 0.05; done
for i in 1 2 3 4 5 6 7 8; do "$TRAINRUN" sample live --tokens 2 > /dev/null 2>> sample.err || true; done
kill -TERM $pid
set +e; wait $pid; code=$?; set -e
[ $code -eq 75 ] || { cat live.err; fail "the run read by sample did not stop cleanly (exit $code)"; }
grep -q "removed .*trainrun-tmp" sample.err && { cat sample.err; fail "sample removed a save in progress"; }
grep -q "not saved" live.err && { cat live.err; fail "a reader made the running run's saves fail"; }

# readers pin the checkpoint they resolved: one the run prunes under them
# (every=2, keep=2) is read whole or resolved again, never called damaged
"$TRAINRUN" "$R" $long checkpoint.every=2 checkpoint.keep=2 run_dir=pruned --quiet > /dev/null 2> pruned.err &
pid=$!
while [ ! -f pruned/checkpoints/LATEST ]; do kill -0 $pid 2>/dev/null || { cat pruned.err; fail "no checkpoint"; }; sleep 0.05; done
for i in 1 2 3 4 5 6 7 8 9 10; do
  "$TRAINRUN" sample pruned --tokens 2 > /dev/null 2> reader.err || { cat reader.err; kill $pid; fail "sample of a pruning run failed"; }
done
for i in 1 2 3 4 5; do
  "$TRAINRUN" eval --checkpoint pruned --batches 1 > /dev/null 2> reader.err || { cat reader.err; kill $pid; fail "eval of a pruning run failed"; }
  "$TRAINRUN" export pruned -o pruned.safetensors 2> reader.err || { cat reader.err; kill $pid; fail "export of a pruning run failed"; }
done
kill -TERM $pid
set +e; wait $pid; code=$?; set -e
[ $code -eq 75 ] || { cat pruned.err; fail "the pruning run read by sample, eval and export did not stop cleanly (exit $code)"; }

# --- the ranks of one job share the directory; a second job is refused ----------------
"$TRAINRUN" "$R" train.steps=4 procs=2 run_dir=p --quiet 2> p.txt || { cat p.txt; fail "procs=2"; }
[ "$(grep -c '"loss"' p/metrics.jsonl)" -eq 4 ] || fail "procs=2: one rank writes the metrics"
start q procs=2
set +e
"$TRAINRUN" "$R" train.steps=4 procs=2 run_dir=q --quiet 2> q2.txt
code=$?
set -e
[ $code -eq 1 ] || { cat q2.txt; fail "a second 2-rank job on a busy run_dir exited $code"; }
grep -q "run directory q is in use by another trainrun (pid [0-9]* on" q2.txt || { cat q2.txt; fail "no holder for the job"; }
kill -0 $pid 2>/dev/null || { cat q.err; fail "the first job died"; }
kill -TERM $pid
set +e; wait $pid; code=$?; set -e
[ $code -eq 75 ] || { cat q.err; fail "the first job did not stop cleanly (exit $code)"; }

# --- a full disk during metrics.jsonl and trace.json writes ---------------------------
shim="$TR_BUILDDIR/tests/shims/.libs/enospc.so"
[ -f "$shim" ] || fail "no $shim"
# a sanitizer build wants its runtime first in LD_PRELOAD
asan=$(ldd "$TRAINRUN" 2>/dev/null | awk '/libasan/ { print $3 }')
shim="${asan:+$asan:}$shim"
# every line must parse: a torn line would make the file unreadable
whole_lines() {
  if command -v python3 > /dev/null; then
    python3 -c 'import json, sys
for line in open(sys.argv[1]): json.loads(line)' "$1" || fail "$1 is not whole JSON lines"
  fi
}
for file in metrics.jsonl trace.json; do
  d=full-${file%%.*}
  set +e
  LD_PRELOAD="$shim" TR_ENOSPC_MATCH="$d/$file" TR_ENOSPC_AFTER=20000 \
    "$TRAINRUN" "$R" train.steps=2000 checkpoint.every=20 train.trace_every=5 run_dir=$d --quiet 2> $d.txt
  code=$?
  set -e
  [ $code -eq 1 ] || { cat $d.txt; fail "$file on a full disk: exit $code, not 1"; }
  grep -q "cannot write $d/$file: No space left on device: free space on the disk of $d or set run_dir=" $d.txt \
    || { cat $d.txt; fail "$file on a full disk: no message naming the file and the reason"; }
  stop=$(sed -n 's/.*the run stops at step \([0-9]*\).*/\1/p' $d.txt)
  [ -n "$stop" ] && [ "$stop" -lt 2000 ] || { cat $d.txt; fail "$file: the run went on"; }
  latest=$(cat $d/checkpoints/LATEST)
  [ "${latest#step-}" -le "$stop" ] && [ "${latest#step-}" -ge $((stop - 40)) ] \
    || fail "$file: LATEST is $latest after a stop at $stop"
  "$TRAINRUN" export $d -o $d.safetensors --dtype fp32 2>/dev/null || fail "$file: the last checkpoint does not load"
  [ $file = metrics.jsonl ] && whole_lines $d/metrics.jsonl
  "$TRAINRUN" "$R" train.steps=$((stop + 10)) checkpoint.every=20 train.trace_every=5 run_dir=$d \
    --resume auto --quiet 2> $d-resume.txt || { cat $d-resume.txt; fail "$file: resume after the disk filled"; }
  grep -q "resumed from checkpoint $latest" $d-resume.txt || { cat $d-resume.txt; fail "$file: did not resume from $latest"; }
  whole_lines $d/metrics.jsonl
  "$TRAINRUN" report $d > /dev/null 2>&1 || fail "$file: report after the disk filled"
done
# the disk fills with the last line of a run: the run fails, it does not end "ok"
set +e
LD_PRELOAD="$shim" TR_ENOSPC_MATCH=last/metrics.jsonl TR_ENOSPC_AFTER=1 \
  "$TRAINRUN" "$R" train.steps=3 train.log_every=100 run_dir=last --quiet 2> last.txt
code=$?
set -e
[ $code -eq 1 ] || { cat last.txt; fail "a failed write of the last metrics line: exit $code"; }
grep -q "cannot write last/metrics.jsonl: No space left on device" last.txt || { cat last.txt; fail "no message for the last line"; }
[ ! -s last/metrics.jsonl ] || fail "the torn first line was not cut"

# --- a run killed mid-line: resume drops the torn line, the file stays readable ------------
"$TRAINRUN" "$R" train.steps=10 checkpoint.every=5 run_dir=torn --quiet
printf '{"step": 11, "loss": 2.' >> torn/metrics.jsonl
"$TRAINRUN" "$R" train.steps=12 run_dir=torn --resume auto --quiet 2> torn.txt || { cat torn.txt; fail "resume after a torn line"; }
grep -q "torn/metrics.jsonl ended in a torn line" torn.txt || { cat torn.txt; fail "the torn line is not reported"; }
whole_lines torn/metrics.jsonl
"$TRAINRUN" report torn > /dev/null 2>&1 || fail "report after a torn line"
# a resumed run keeps the earlier trace (trace-1.json) and writes its own
"$TRAINRUN" "$R" train.steps=10 train.trace_every=5 run_dir=tr --quiet
cp tr/trace.json first-trace.json
"$TRAINRUN" "$R" train.steps=20 train.trace_every=5 run_dir=tr --resume auto --quiet
cmp -s first-trace.json tr/trace-1.json || fail "the first trace was not kept as trace-1.json"
[ -s tr/trace.json ] || fail "the resumed run wrote no trace"

# --- a directory that is not a run: nothing in it is replaced or removed ------------------
# (a model directory named by a typo or a shared recipe; the data has no tokenizer)
mkdir hfdir
for f in tokenizer.json tokenizer_config.json trace.json recipe.resolved config.json; do
  echo "theirs $f" > hfdir/$f
done
ls -l hfdir > hfdir.before
for resume in "" "--resume auto"; do
  set +e
  "$TRAINRUN" "$R" train.steps=2 train.trace_every=1 run_dir=hfdir $resume --quiet 2> hfdir.txt
  code=$?
  set -e
  [ $code -eq 1 ] || { cat hfdir.txt; fail "a run in a directory that is not a run ($resume): exit $code, not 1"; }
  grep -q "run_dir hfdir is not a trainrun run directory, but it holds .*tokenizer_config.json.*: give the run a directory of its own" hfdir.txt \
    || { cat hfdir.txt; fail "no message for a directory that is not a run"; }
  for f in tokenizer.json tokenizer_config.json trace.json recipe.resolved config.json; do
    [ "$(cat hfdir/$f)" = "theirs $f" ] || fail "the refused run ($resume) changed hfdir/$f"
  done
  ls -l hfdir | cmp -s - hfdir.before || { ls -l hfdir; fail "the refused run ($resume) wrote to hfdir"; }
done
# a directory with only files of other names (a log the shell put there) is fine, and kept
mkdir logged
echo "a log" > logged/train.log
"$TRAINRUN" "$R" train.steps=2 run_dir=logged --quiet 2> logged.txt || { cat logged.txt; fail "a run beside a log file"; }
[ "$(cat logged/train.log)" = "a log" ] || fail "the run touched logged/train.log"
echo "rundir: ok"
