#!/bin/sh
# Checkpoints are a trust boundary in both directions:
# - checkpoint.dir pointed at a directory of the user's files (names that
#   look like checkpoints or staging directories, a symlink out of it) with
#   keep=1 over several saves: every one of the user's files survives, and
#   the symlink is not followed;
# - a state.json that is torn, edited (checksum mismatch), or consistent
#   with its checksum but not with the checkpoint (wrong step, a loader
#   position before its step, a step past train.steps) is skipped with a
#   message and the run resumes from the previous checkpoint;
# - export and sample refuse a checkpoint that fails its checksums;
# - report, prepare and export never overwrite or delete a file of the
#   user's in the directory they write to, nor follow a symlink there.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
ck() { echo "$1/checkpoints/step-$(printf %010d "$2")"; }

# --- a directory of the user's files as checkpoint.dir ----------------------
mkdir -p home/step_0001000 home/.staging-1 home/.tmp-step-0000000300-1 \
  home/.trainrun-tmp-step-0000000400-7 home/step-0000000005 home/step-0000000100 outside
echo notes > home/notes.txt
echo mine > home/step_0001000/data
echo mine > home/.staging-1/data
echo mine > home/.tmp-step-0000000300-1/model
echo mine > home/.trainrun-tmp-step-0000000400-7/model
echo mine > home/step-0000000005/model
echo mine > home/step-0000000100/model
echo '{}' > home/step-0000000100/state.json # an unrelated state.json: listed, never removed
echo mine > home/run.tmp
echo mine > home/.trainrun-tmp-LATEST-x
echo precious > outside/precious
ln -s "$PWD/outside" home/step-0000000003
ln -s "$PWD/outside" home/.trainrun-old-step-0000000010-1
find home outside | sort > before.txt
"$TRAINRUN" "$R" train.steps=20 checkpoint.every=5 checkpoint.keep=1 \
  checkpoint.keep_best=false checkpoint.dir="$PWD/home" run_dir=u --quiet 2> err.txt \
  || { cat err.txt; fail "training into a shared directory failed"; }
grep -q "home/step-0000000005 exists and was not made by trainrun" err.txt \
  || { cat err.txt; fail "no message for the save whose name the user took"; }
for f in notes.txt step_0001000/data .staging-1/data .tmp-step-0000000300-1/model \
    .trainrun-tmp-step-0000000400-7/model step-0000000005/model step-0000000100/model run.tmp \
    .trainrun-tmp-LATEST-x; do
  [ -f "home/$f" ] || { cat err.txt; fail "home/$f, a file of the user's, was removed"; }
done
[ "$(cat outside/precious)" = precious ] || fail "a symlink was followed out of checkpoint.dir"
[ -L home/step-0000000003 ] || fail "the user's symlink was removed"
[ -d "home/step-0000000020" ] || fail "no checkpoint of step 20"
[ ! -e "home/step-0000000010" ] || fail "keep=1 did not rotate trainrun's own step 10"
[ "$(cat home/LATEST)" = step-0000000020 ] || fail "LATEST is $(cat home/LATEST)"
find home outside | grep -v '/step-00000000[12]0\(/\|$\)' | grep -v '^home/LATEST$' | sort > after.txt
diff before.txt after.txt || fail "the user's files changed"
# and a run started there again (staging recovery at start) keeps them too
"$TRAINRUN" "$R" train.steps=25 checkpoint.every=5 checkpoint.keep=1 \
  checkpoint.dir="$PWD/home" run_dir=u --resume auto --quiet 2> err.txt \
  || { cat err.txt; fail "resume in a shared directory failed"; }
grep -q "resumed from checkpoint step-0000000020" err.txt || { cat err.txt; fail "did not resume"; }
find home outside | grep -v '/step-00000000[12][05]\(/\|$\)' | grep -v '^home/LATEST$' | sort > after.txt
diff before.txt after.txt || fail "the user's files changed on resume"

# --- tampered state.json ------------------------------------------------------
resume() { # run_dir, steps; err.txt gets the messages
  timeout 120 "$TRAINRUN" "$R" train.steps="$2" checkpoint.every=10 run_dir="$1" --resume auto \
    --quiet 2> err.txt || { cat err.txt; fail "resume of $1 failed (or hung)"; }
}
fell_back() { # what the skip message says
  grep -q "skipping step-0000000020: .*$1" err.txt || { cat err.txt; fail "no message: $1"; }
  grep -q "resumed from checkpoint step-0000000010" err.txt || { cat err.txt; fail "no fallback"; }
}
fresh() { rm -rf "$1"; cp -R base "$1"; }
"$TRAINRUN" "$R" train.steps=20 checkpoint.every=10 run_dir=base --quiet
s20=checkpoints/step-0000000020/state.json

fresh t1; sed -i 's/"loss": [0-9.e+-]*/"loss": 0.5/' "t1/$s20"
resume t1 20; fell_back "state.json fails its checksum"

fresh t2; printf '{"step": 20,' > "t2/$s20"
resume t2 20; fell_back "state.json has no state_checksum"

fresh t3; printf 'garbage' > "t3/$s20"
resume t3 20; fell_back "state.json"

# a FIFO where a blob belongs would block a reader for good
fresh tf; rm tf/checkpoints/step-0000000020/model.safetensors
mkfifo tf/checkpoints/step-0000000020/model.safetensors
resume tf 20; fell_back "model.safetensors is not a regular file"

# past train.steps: a shorter run resumes from the last checkpoint within it
fresh t4; resume t4 15; fell_back "its step 20 is past train.steps = 15"

if command -v python3 >/dev/null; then
  # edited consistently with the checksum: caught by what the fields say
  rewrite() { # dir, python expression over s (the text before the checksum)
    python3 - "$1/$s20" "$2" <<'EOF'
import re, sys, zlib
path, expr = sys.argv[1], sys.argv[2]
text = open(path).read()
s = text[:text.index('  "state_checksum":')]
s = eval(expr)
open(path, "w").write(s + '  "state_checksum": %d\n}\n' % zlib.crc32(s.encode()))
EOF
  }
  fresh t5; rewrite t5 "s.replace('\"step\": 20', '\"step\": 15')"
  resume t5 20; fell_back "state.json says step 15, but the checkpoint is step-0000000020"
  fresh t6; rewrite t6 "s.replace('\"loader_position\": 20', '\"loader_position\": 3')"
  resume t6 20; fell_back '"loader_position" is missing or out of range'
  fresh t7; rewrite t7 "s.replace('\"step\": 20', '\"step\": -20')"
  resume t7 20; fell_back '"step" is missing or out of range'
  fresh t8; rewrite t8 "s.replace('\"weights_dtype\": \"fp32\"', '\"weights_dtype\": \"bf16\"')"
  resume t8 20; fell_back "not in the weights_dtype state.json names"
  # with its checksum intact, an unchanged rewrite still loads (the check is not a stub)
  fresh t9; rewrite t9 "s"
  resume t9 25; grep -q "resumed from checkpoint step-0000000020" err.txt || { cat err.txt; fail "rewrite"; }
else
  echo "python3 missing: the consistent-checksum edits are skipped"
fi

# --- export and sample refuse a corrupt checkpoint ----------------------------------
fresh x
printf '\377' | dd of="x/checkpoints/step-0000000020/model.safetensors" bs=1 seek=300 count=1 \
  conv=notrunc 2>/dev/null
if "$TRAINRUN" export x -o x.safetensors --dtype fp32 2> err.txt; then fail "export of a corrupt checkpoint"; fi
grep -q "model.safetensors fails its checksum" err.txt || { cat err.txt; fail "export: no reason"; }
[ ! -e x.safetensors ] || fail "export wrote a file from a corrupt checkpoint"
ls x.safetensors.* 2>/dev/null && fail "export left a temporary file"
if "$TRAINRUN" sample x --tokens 4 --prompt ab > out.txt 2> err.txt; then fail "sample of a corrupt checkpoint"; fi
grep -q "model.safetensors fails its checksum" err.txt || { cat err.txt; fail "sample: no reason"; }
fresh y; sed -i 's/"recipe": "[^"]*"/"recipe": "\/nonexistent.lua"/' "y/$s20"
if "$TRAINRUN" sample y --tokens 4 --prompt ab > out.txt 2> err.txt; then fail "sample of an edited state.json"; fi
grep -q "state.json fails its checksum" err.txt || { cat err.txt; fail "sample: no reason for state.json"; }
if "$TRAINRUN" export y -o y.safetensors 2> err.txt; then fail "export of an edited state.json"; fi
# a LATEST that leads out of its directory is refused
fresh z; echo "../../outside" > z/checkpoints/LATEST
if "$TRAINRUN" export z -o z.safetensors 2> err.txt; then fail "export followed LATEST out"; fi
grep -q "names no checkpoint" err.txt || { cat err.txt; fail "export: no reason for LATEST"; }
# and the untouched ones still export and sample
"$TRAINRUN" export base -o ok.safetensors --dtype fp32 2> err.txt || { cat err.txt; fail "export"; }
"$TRAINRUN" sample base --tokens 4 --prompt 12 > out.txt 2> err.txt || { cat err.txt; fail "sample"; }

# --- report, prepare and export write into directories of the user's safely ----
mkdir rep && echo mine > rep/index.html
if "$TRAINRUN" report base -o rep > out.txt 2> err.txt; then fail "report overwrote a user's index.html"; fi
grep -q "rep/index.html exists and was not written by trainrun report" err.txt || { cat err.txt; fail "report: no reason"; }
[ "$(cat rep/index.html)" = mine ] || fail "report changed the user's index.html"
"$TRAINRUN" report base > out.txt 2> err.txt || { cat err.txt; fail "report"; }
echo precious > victim.txt
rm base/report/loss.png && ln -s "$PWD/victim.txt" base/report/loss.png
"$TRAINRUN" report base > out.txt 2> err.txt || { cat err.txt; fail "report again"; }
[ "$(cat victim.txt)" = precious ] || fail "report followed a symlink out of its directory"
[ -f base/report/loss.png ] && [ ! -L base/report/loss.png ] || fail "report did not replace the symlink"
i=0; while [ $i -lt 200 ]; do echo "document $i of the corpus"; echo; i=$((i + 1)); done > corpus.txt
mkdir shards && echo mine > shards/train_000007.bin && echo mine > shards/val_000000.bin
if "$TRAINRUN" prepare corpus.txt -o shards > out.txt 2> err.txt; then fail "prepare wrote into a directory of the user's shards"; fi
grep -q "exists and was not written by trainrun prepare" err.txt || { cat err.txt; fail "prepare: no reason"; }
[ "$(cat shards/train_000007.bin)" = mine ] || fail "prepare removed a user's file"
"$TRAINRUN" prepare corpus.txt -o ours --shard-tokens 500 > out.txt 2> err.txt || { cat err.txt; fail "prepare"; }
[ -f ours/train_000002.bin ] || fail "prepare wrote no third shard"
ln -s "$PWD/victim.txt" ours/train_000999.bin
"$TRAINRUN" prepare corpus.txt -o ours > out.txt 2> err.txt || { cat err.txt; fail "prepare again"; }
[ ! -e ours/train_000002.bin ] || fail "prepare left a stale shard of its own"
[ "$(cat victim.txt)" = precious ] || fail "prepare followed a symlink"
echo mine > keep.safetensors.tmp
"$TRAINRUN" export base -o keep.safetensors --dtype fp32 2> err.txt || { cat err.txt; fail "export"; }
[ "$(cat keep.safetensors.tmp)" = mine ] || fail "export overwrote <out>.tmp"
echo "checkpoint-trust: ok"
