#!/bin/sh
# Sharded checkpoints (docs/scale-out.md): under parallel.shard each rank
# writes its own parts into one checkpoint, published once all have.
# Checks that
#   - a run at 2 ranks writes shard-0000q-of-00002.bin per rank and
#     layout.json, and no model.safetensors (rank 0 gathers nothing);
#   - saved at 2 ranks (step 10) and resumed at 1, 2 and 4 ranks, at its
#     level and at the others, a run ends within 1e-5 of the run that kept
#     2 ranks (and says where it is bit-identical);
#   - eval reads a sharded checkpoint; export writes the weights of one,
#     byte-identical to the same weights' export from a one-writer
#     checkpoint (safetensors and hf, fp32 and bf16), streaming them from
#     the blobs (its peak memory well below the model's weights);
#   - a checkpoint written the old way (one writer, model.safetensors) still
#     resumes a sharded run;
#   - a damaged blob is refused by export naming the file; a resume (at 2
#     ranks and at 1) passes over a checkpoint whose blob is damaged,
#     truncated or missing with a warning naming both, and resumes from the
#     one before, bit-identical to a resume from that one; with none before
#     it fails naming the blob;
#   - kill -9 of one rank, or of all, during a sharded save leaves the
#     previous checkpoint good and the next resume works.
. "$(dirname "$0")/lib.sh"
# discarded memory faults until committed, as on the cuda backend
# (docs/testing.md): a rank touching what it gave back fails here
export TRAINRUN_CPU_DISCARD=strict
READ="$TR_SRCDIR/tests/e2e/read_safetensors.py"
LLAMA="$TR_SRCDIR/tests/config/tiny_llama.lua"
base="train.steps=20 train.batch=12 train.micro_batch=1 train.log_every=5 train.threads=1
      checkpoint.every=10 parallel.bucket_mb=0.01 optimizer.clip=0"
run() { # RUN_DIR overrides...
  dir=$1
  shift
  # shellcheck disable=SC2086
  "$TRAINRUN" "$LLAMA" $base "$@" run_dir="$dir" --quiet > "$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "$dir failed"; }
}
latest() { echo "$1/checkpoints/$(cat "$1/checkpoints/LATEST")"; }
weights() { # a run's latest weights as one safetensors file
  "$TRAINRUN" export "$(latest "$1")" --dtype fp32 -o "$1.st" > "$1.export.log" 2>&1 ||
    { cat "$1.export.log"; fail "export of $(latest "$1")"; }
  echo "$1.st"
}
close() { # RUN_A RUN_B WHAT
  a=$(weights "$1") b=$(weights "$2")
  python3 "$READ" close "$a" "$b" 1e-5 > /dev/null || fail "$3: not within 1e-5"
  if cmp -s "$a" "$b"; then echo "shard-checkpoint: $3: bit-identical"; else echo "shard-checkpoint: $3: within 1e-5"; fi
}

for level in optimizer gradients parameters; do
  run "saved-$level" procs=2 parallel.shard=$level
  ck=$(latest "saved-$level")
  for f in shard-00000-of-00002.bin shard-00001-of-00002.bin layout.json state.json; do
    [ -f "$ck/$f" ] || { ls -la "$ck"; fail "$level: $ck has no $f"; }
  done
  [ ! -e "$ck/model.safetensors" ] || fail "$level: rank 0 wrote model.safetensors too"
done
if ! grep -q '"level": "parameters"' "$(latest saved-parameters)/layout.json" ||
   ! grep -q '"world": 2' "$(latest saved-parameters)/layout.json"; then
  fail "layout.json does not record the layout"
fi

# step 10 resumed at 1, 2 and 4 ranks, at its level and at others
resume() { # SAVED_LEVEL PROCS LEVEL
  dir="resume-$1-$2-$3"
  rm -rf "$dir"
  cp -r "saved-$1" "$dir"
  rm -rf "$dir/checkpoints/step-0000000020"
  echo step-0000000010 > "$dir/checkpoints/LATEST"
  extra="parallel.shard=$3"
  [ "$2" = 1 ] && extra=
  # shellcheck disable=SC2086
  "$TRAINRUN" "$LLAMA" $base procs=$2 $extra run_dir="$dir" --resume auto > "$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "resume of $1 at $2 ranks ($3)"; }
  grep -q "resumed from checkpoint step-0000000010" "$dir.log" ||
    { cat "$dir.log"; fail "no resume at $2 ranks"; }
  close "saved-$1" "$dir" "saved at 2 ranks ($1), resumed at $2 ($3)"
}
for level in optimizer gradients parameters; do
  for procs in 1 2 4; do
    resume $level $procs $level
  done
done
resume parameters 3 optimizer
resume optimizer 4 parameters
resume gradients 3 parameters
resume parameters 2 gradients
grep -q "every rank read its own parts" resume-parameters-4-parameters.log ||
  { cat resume-parameters-4-parameters.log; fail "the ranks did not read their own parts"; }

# eval reads a sharded checkpoint
"$TRAINRUN" eval "$LLAMA" --checkpoint saved-parameters --json > eval.json 2> eval.txt ||
  { cat eval.txt; fail "eval of a sharded checkpoint"; }
grep -q '"loss"' eval.json || { cat eval.json; fail "eval gave no loss"; }

# a checkpoint of one writer (one process: model.safetensors) resumes a sharded run
run old
[ -f "$(latest old)/model.safetensors" ] || fail "one process wrote no model.safetensors"
rm -rf old-resumed
cp -r old old-resumed
rm -rf old-resumed/checkpoints/step-0000000020
echo step-0000000010 > old-resumed/checkpoints/LATEST
# shellcheck disable=SC2086
"$TRAINRUN" "$LLAMA" $base procs=2 parallel.shard=parameters run_dir=old-resumed --resume auto \
  > old-resumed.log 2>&1 || { cat old-resumed.log; fail "a sharded run resumed from a one-writer checkpoint"; }
grep -q "resumed from checkpoint step-0000000010" old-resumed.log || { cat old-resumed.log; fail "no resume from the old checkpoint"; }
close old old-resumed "one writer's checkpoint, resumed at 2 ranks (parameters)"

# a checkpoint plugin without the 2.5 slots: rank 0 gathers and writes
# one-writer checkpoints, says so once, and they resume at other world sizes
if [ -n "${TR_TEST_PLUGIN_DIR:-}" ] && [ -f "$TR_TEST_PLUGIN_DIR/checkpoint_old_local.so" ]; then
  # shellcheck disable=SC2086
  "$TRAINRUN" --plugin-path "$TR_TEST_PLUGIN_DIR" "$LLAMA" $base procs=2 parallel.shard=parameters \
    checkpoint.plugin=old_local run_dir=fallback > fallback.log 2>&1 ||
    { cat fallback.log; fail "a sharded run over a 2.4 checkpoint plugin"; }
  [ "$(grep -c "cannot take one checkpoint from several ranks" fallback.log)" = 1 ] ||
    { cat fallback.log; fail "the fallback to rank 0 writing is not said once"; }
  [ -f "$(latest fallback)/model.safetensors" ] || fail "the fallback wrote no model.safetensors"
  close saved-parameters fallback "a 2.4 plugin's gathered save, against the sharded one"
  # the same weights exported from the one-writer checkpoint and streamed
  # from the sharded one's blobs: the same bytes, in every format and dtype
  for fmt in safetensors hf; do
    for dt in fp32 bf16; do
      for src in fallback saved-parameters; do
        rm -rf "$src.$fmt-$dt"
        "$TRAINRUN" export "$(latest $src)" --format $fmt --dtype $dt -o "$src.$fmt-$dt" \
          > "$src.$fmt-$dt.log" 2>&1 || { cat "$src.$fmt-$dt.log"; fail "export --format $fmt of $src"; }
      done
      if [ $fmt = hf ]; then
        cmp fallback.hf-$dt/model.safetensors saved-parameters.hf-$dt/model.safetensors &&
          cmp fallback.hf-$dt/config.json saved-parameters.hf-$dt/config.json ||
          fail "export --format hf --dtype $dt of a sharded checkpoint differs from the one-writer one"
      else
        cmp fallback.$fmt-$dt saved-parameters.$fmt-$dt ||
          fail "export --format $fmt --dtype $dt of a sharded checkpoint differs from the one-writer one"
      fi
    done
  done
  echo "shard-checkpoint: export of the sharded checkpoint: byte-identical to the one-writer one (safetensors, hf; fp32, bf16)"
else
  echo "shard-checkpoint: no test plugins (criterion missing): the 2.4 fallback is skipped"
fi

# a damaged blob: export refuses it naming the file; a resume passes over
# the checkpoint with a warning naming it and the blob, and resumes from the
# one before, at 2 ranks (where only rank 1 reads the damaged range, so the
# ranks must agree) and in one process, to the very weights of a run that
# resumed from that one (resume-parameters-*); a truncated or missing blob
# likewise; with no older checkpoint the resume fails naming the blob
flip_byte() { # FILE OFFSET
  python3 - "$1" "$2" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)
    f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 0xFF]))
PY
}
rm -rf damaged
cp -r saved-parameters damaged
flip_byte "$(latest damaged)/shard-00001-of-00002.bin" 100
if "$TRAINRUN" export "$(latest damaged)" -o damaged.st > damaged.log 2>&1; then fail "a damaged shard exported"; fi
grep -q "shard-00001-of-00002.bin fails its checksum" damaged.log || { cat damaged.log; fail "damaged shard: no message naming it"; }
[ ! -e damaged.st ] || fail "a failed export left damaged.st"
fallback() { # DIR PROCS WHAT BLOB-MESSAGE
  extra="parallel.shard=parameters"
  [ "$2" = 1 ] && extra=
  # shellcheck disable=SC2086
  "$TRAINRUN" "$LLAMA" $base procs=$2 $extra run_dir="$1" --resume auto > "$1.log" 2>&1 ||
    { cat "$1.log"; fail "$3: the resume did not fall back on the older checkpoint"; }
  grep "skipping step-0000000020" "$1.log" | grep -q "$4" ||
    { cat "$1.log"; fail "$3: no warning naming the checkpoint and the blob"; }
  grep -q "resumed from checkpoint step-0000000010" "$1.log" ||
    { cat "$1.log"; fail "$3: not resumed from step-0000000010"; }
  cmp -s "$(weights "$1")" "$(weights "resume-parameters-$2-parameters")" ||
    fail "$3: the weights differ from a run resumed from step-0000000010"
  echo "shard-checkpoint: $3: fell back on step-0000000010, weights bit-identical"
}
for procs in 2 1; do
  rm -rf "damaged-$procs"
  cp -r damaged "damaged-$procs"
  fallback "damaged-$procs" $procs "a flipped byte in rank 1's blob, resumed at $procs" \
    "shard-00001-of-00002.bin fails its checksum"
done
rm -rf truncated
cp -r saved-parameters truncated
python3 -c 'import os, sys; os.truncate(sys.argv[1], os.path.getsize(sys.argv[1]) - 4)' \
  "$(latest truncated)/shard-00001-of-00002.bin"
fallback truncated 2 "a truncated blob, resumed at 2" "shard-00001-of-00002.bin"
rm -rf missing
cp -r saved-parameters missing
rm "$(latest missing)/shard-00000-of-00002.bin"
fallback missing 2 "a missing blob, resumed at 2" "shard-00000-of-00002.bin"
rm -rf damaged/checkpoints/step-0000000010
# shellcheck disable=SC2086
if "$TRAINRUN" "$LLAMA" $base procs=2 parallel.shard=parameters train.steps=30 run_dir=damaged --resume auto \
     > damaged-resume.log 2>&1; then
  fail "resumed from a damaged shard"
fi
grep -q "no checkpoint could be loaded.*shard-00001-of-00002.bin fails its checksum" damaged-resume.log ||
  { cat damaged-resume.log; fail "damaged resume: no message naming the blob"; }

# export streams a sharded checkpoint from its blobs, a tensor at a time:
# its peak memory stays far below the model's 26 MB of fp32 weights
# (assembling them, as export did, peaked at 62 MB: docs/scale-out.md)
# shellcheck disable=SC2086
"$TRAINRUN" "$LLAMA" model.dim=512 model.layers=8 train.steps=2 checkpoint.every=2 train.eval_every=0 \
  train.threads=1 procs=2 parallel.shard=parameters run_dir=big --quiet > big.log 2>&1 ||
  { cat big.log; fail "the 512-wide model did not train"; }
for fmt in safetensors hf; do
  python3 - "$TRAINRUN" "$(latest big)" $fmt "big.$fmt" <<'PY' || fail "export --format $fmt of a sharded checkpoint holds the model"
import os, resource, subprocess, sys
trainrun, ckpt, fmt, out = sys.argv[1:]
weights = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt) if f.startswith("shard-")) // 3
r = subprocess.run([trainrun, "export", ckpt, "--format", fmt, "--dtype", "fp32", "-o", out],
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
if r.returncode:
    sys.exit("export failed: " + r.stderr.decode())
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
base = 24 << 20  # the program itself, and a tensor or two
print(f"shard-checkpoint: export --format {fmt}: peak RSS {peak >> 20} MiB for {weights >> 20} MiB of weights")
if peak > base + weights // 4:
    sys.exit(f"peak RSS {peak} bytes: more than {base + weights // 4} (the weights are {weights} bytes)")
PY
done

# kill -9 during a sharded save: checkpoints every step of a wider model,
# each kill aimed at a moment when a save is staged; the previous checkpoint
# stays good and the run resumes to the weights of one never killed
wide="model.dim=64 model.ffn_dim=256 model.layers=4 train.steps=12 checkpoint.every=1 checkpoint.keep=2"
# shellcheck disable=SC2086
run straight procs=2 parallel.shard=parameters $wide
hits=0
for trial in 1 2 3 4; do
  dir=killed$trial
  rm -rf "$dir"
  # shellcheck disable=SC2086
  "$TRAINRUN" "$LLAMA" $base procs=2 parallel.shard=parameters $wide run_dir="$dir" --quiet \
    > "$dir.log" 2>&1 &
  launcher=$!
  # wait for a save in progress (a staging directory holding rank 1's blob)
  i=0
  while [ $i -lt 2000 ] && ! ls "$dir"/checkpoints/.trainrun-tmp-step-*/shard-00001-of-00002.bin \
        > /dev/null 2>&1; do
    i=$((i + 1))
    sleep 0.005
  done
  [ $i -lt 2000 ] && hits=$((hits + 1))
  ranks=$(pgrep -P "$launcher" || true)
  if [ "$trial" -le 2 ]; then # one rank: rank 1 (the second child)
    victim=$(echo "$ranks" | sed -n 2p)
    if [ -n "$victim" ]; then kill -9 "$victim" 2>/dev/null || true; fi
  else # every rank and the launcher
    for p in $ranks; do kill -9 "$p" 2>/dev/null || true; done
    kill -9 "$launcher" 2>/dev/null || true
  fi
  wait "$launcher" 2>/dev/null || true
  # every published checkpoint verifies
  for ck in "$dir"/checkpoints/step-*; do
    [ -d "$ck" ] || continue
    "$TRAINRUN" export "$ck" -o "$dir.check.st" > "$dir.check.log" 2>&1 ||
      { cat "$dir.check.log"; fail "trial $trial: $ck does not verify after kill -9"; }
  done
  # shellcheck disable=SC2086
  "$TRAINRUN" "$LLAMA" $base procs=2 parallel.shard=parameters $wide run_dir="$dir" --resume auto \
    > "$dir.resume.log" 2>&1 || { cat "$dir.resume.log"; fail "trial $trial: the resume after kill -9 failed"; }
  close straight "$dir" "killed during a save (trial $trial), resumed"
done
[ $hits -ge 1 ] || fail "no kill was aimed at a sharded save in progress (none was seen staged)"
echo "shard-checkpoint: $hits of 4 kills were sent while a save was staged"
echo "shard-checkpoint: ok"
