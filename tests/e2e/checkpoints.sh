#!/bin/sh
# Corrupt, truncated and torn checkpoints are detected and the previous good
# one is used; a full disk during a save leaves the previous checkpoint
# loadable and says why; a second SIGTERM during the save corrupts nothing;
# exported half-precision weights read back with an independent reader.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
ck() { echo "$1/checkpoints/step-$(printf %010d "$2")"; }

# --- corruption: flip a byte of the newest weights --------------------------
"$TRAINRUN" "$R" train.steps=20 checkpoint.every=10 run_dir=a --quiet
newest=$(ck a 20)
printf '\377' | dd of="$newest/model.safetensors" bs=1 seek=200 count=1 conv=notrunc 2>/dev/null
"$TRAINRUN" "$R" train.steps=25 checkpoint.every=10 run_dir=a --resume auto --quiet 2> err.txt
grep -q "skipping step-0000000020: model.safetensors fails its checksum" err.txt || { cat err.txt; fail "bit flip not detected"; }
grep -q "resumed from checkpoint step-0000000010" err.txt || { cat err.txt; fail "did not fall back to step 10"; }

# --- truncation and a torn checkpoint (no state.json) -----------------------
"$TRAINRUN" "$R" train.steps=20 checkpoint.every=10 run_dir=b --quiet
truncate -s 100 "$(ck b 20)/optimizer.safetensors"
"$TRAINRUN" "$R" train.steps=20 run_dir=b --resume auto --quiet 2> err.txt
grep -q "skipping step-0000000020: optimizer.safetensors fails its checksum" err.txt || { cat err.txt; fail "truncation not detected"; }
rm "$(ck b 20)/state.json"
"$TRAINRUN" "$R" train.steps=20 run_dir=b --resume auto --quiet 2> err.txt
grep -q "skipping step-0000000020: .*state.json" err.txt || { cat err.txt; fail "torn checkpoint not detected"; }

# --- a full disk during saves ---------------------------------------------------
shim="$TR_BUILDDIR/tests/shims/.libs/enospc.so"
[ -f "$shim" ] || fail "no $shim"
# a sanitizer build wants its runtime first in LD_PRELOAD
asan=$(ldd "$TRAINRUN" 2>/dev/null | awk '/libasan/ { print $3 }')
shim="${asan:+$asan:}$shim"
set +e
LD_PRELOAD="$shim" TR_ENOSPC_MATCH=step-0000000020,step-0000000030 \
  "$TRAINRUN" "$R" train.steps=30 checkpoint.every=10 checkpoint.keep_best=false run_dir=c --quiet 2> err.txt
code=$?
set -e
[ $code -eq 1 ] || { cat err.txt; fail "a final save on a full disk must fail the run (exit $code)"; }
grep -q "checkpoint step-0000000020 not saved" err.txt || { cat err.txt; fail "no message for the failed save"; }
grep -q "No space left on device" err.txt || { cat err.txt; fail "the reason (disk full) is not given"; }
grep -q "free disk space, or point checkpoint.dir at a larger disk" err.txt \
  || { cat err.txt; fail "a full disk does not say what to do"; }
[ "$(cat c/checkpoints/LATEST)" = step-0000000010 ] || fail "LATEST moved past the last good checkpoint"
ls -a c/checkpoints | grep -q '^.tmp' && fail "a staging directory was left behind"
"$TRAINRUN" export c -o ok.safetensors --dtype fp32 2>/dev/null || fail "the previous checkpoint does not load"
"$TRAINRUN" "$R" train.steps=30 checkpoint.every=10 run_dir=c --resume auto --quiet 2> err.txt \
  || { cat err.txt; fail "resume after the disk filled"; }
grep -q "resumed from checkpoint step-0000000010" err.txt || { cat err.txt; fail "resume did not start at step 10"; }

# --- two signals during the preemption save ---------------------------------------
"$TRAINRUN" "$R" train.steps=100000 checkpoint.every=0 run_dir=d > /dev/null 2> err.txt &
pid=$!
while [ ! -s d/metrics.jsonl ]; do kill -0 $pid 2>/dev/null || break; sleep 0.02; done
kill -TERM $pid; kill -TERM $pid 2>/dev/null || true; kill -USR1 $pid 2>/dev/null || true
set +e; wait $pid; code=$?; set -e
[ $code -eq 75 ] || { cat err.txt; fail "preemption exit code $code, expected 75"; }
"$TRAINRUN" export d -o d.safetensors --dtype fp32 2>/dev/null || fail "the preemption checkpoint does not load"

# --- export to half precision, read back independently ------------------------------
"$TRAINRUN" export a -o bf16.safetensors --dtype bf16 2>/dev/null || fail "export bf16"
"$TRAINRUN" export a -o fp16.safetensors --dtype fp16 2>/dev/null || fail "export fp16"
"$TRAINRUN" export a -o fp32.safetensors --dtype fp32 2>/dev/null || fail "export fp32"
if command -v python3 >/dev/null; then
  python3 "$TR_SRCDIR/tests/e2e/read_safetensors.py" fp32.safetensors bf16.safetensors fp16.safetensors \
    || fail "the independent reader rejects the exported files"
else
  echo "python3 missing: the independent reader check is skipped"
fi
echo "checkpoints: ok"
