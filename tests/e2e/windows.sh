#!/bin/sh
# data.windows = "random" (a training window at every start position, drawn
# by the loader's seeded permutation) is a pure function of seed and step:
# the number of loader workers does not change a loss, and a run resumed from
# a checkpoint continues with the losses and ends with the weights of a run
# never interrupted.  Aligned windows train on other samples, so their losses
# differ: the option reaches the plugin.
. "$(dirname "$0")/lib.sh"

# 24 KB of text, the same every time
awk 'BEGIN { for (i = 0; i < 1200; i++) printf "line %d: %s\n", i, substr("the quick brown fox jumps over the lazy dog", 1 + i % 17) }' > corpus.txt
cat > w.lua <<'LUA'
return {
  model = gpt { vocab = 256, ctx = 16, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "text", path = "corpus.txt", val_fraction = 0.1, windows = "random" },
  schedule = { plugin = "cosine", warmup = 2 },
  train = { steps = 30, batch = 8, log_every = 1, eval_every = 10, eval_batches = 2, threads = 1 },
  checkpoint = { plugin = "local", every = 10, keep = 10 },
}
LUA
# step and loss (training and validation) of every metrics line
losses() { sed -n -e 's/.*"step": *\([0-9]*\).*"\(val_\)\{0,1\}loss": *\([-0-9.e+]*\).*/\1 \2\3/p' "$1"; }
weights() { echo "$1/checkpoints/$(cat "$1/checkpoints/LATEST")/model.safetensors"; }

"$TRAINRUN" w.lua train.workers=0 run_dir=straight --quiet
losses straight/metrics.jsonl > straight.txt
[ "$(wc -l < straight.txt)" -ge 30 ] || { cat straight/metrics.jsonl; fail "no losses in metrics.jsonl"; }
grep -q " val_" straight.txt || fail "no validation losses in metrics.jsonl"

# loader workers: the same samples in the same order
"$TRAINRUN" w.lua train.workers=3 train.prefetch=5 run_dir=workers --quiet
losses workers/metrics.jsonl > workers.txt
cmp straight.txt workers.txt || { diff straight.txt workers.txt; fail "3 loader workers changed the losses"; }
cmp "$(weights straight)" "$(weights workers)" || fail "3 loader workers changed the weights"

# resumed from step 10 (the later checkpoints removed), with another worker count
cp -r straight resumed
rm -rf resumed/checkpoints/step-0000000020 resumed/checkpoints/step-0000000030 resumed/metrics.jsonl
rm -f resumed/trainrun.lock
"$TRAINRUN" w.lua train.workers=2 run_dir=resumed --resume auto --quiet 2> err.txt || { cat err.txt; fail "resume"; }
grep -q "resumed from checkpoint step-0000000010" err.txt || { cat err.txt; fail "did not resume at step 10"; }
losses resumed/metrics.jsonl > resumed.txt
awk '$1 > 10' straight.txt > straight-after-10.txt
[ -s resumed.txt ] || fail "the resumed run logged no losses"
cmp straight-after-10.txt resumed.txt || { diff straight-after-10.txt resumed.txt; fail "the resumed run's losses differ"; }
cmp "$(weights straight)" "$(weights resumed)" || fail "the resumed run ended with other weights"

# evaluating the training split reads windows that do not overlap: every
# seq_len-th of the random ones, which are the aligned ones
for w in random aligned; do
  "$TRAINRUN" eval w.lua data.windows=$w --checkpoint straight/checkpoints/step-0000000030 \
    --split train --batches 4 --json > eval-$w.json 2> err.txt || { cat err.txt; fail "eval $w"; }
  sed -n -e 's/.*"loss": *\([-0-9.e+]*\).*/\1/p' eval-$w.json > loss-$w.txt
  sed -n -e 's/.*"split_batches": *\([0-9]*\).*/\1/p' eval-$w.json > batches-$w.txt
done
[ -s loss-random.txt ] || { cat eval-random.json; fail "no loss in eval --json"; }
cmp loss-random.txt loss-aligned.txt || { cat eval-random.json eval-aligned.json; fail "eval --split train of random windows read overlapping windows"; }
cmp batches-random.txt batches-aligned.txt || { cat eval-random.json eval-aligned.json; fail "split_batches counts overlapping windows"; }

# aligned windows: other samples, other losses; validation (always aligned) starts equal
"$TRAINRUN" w.lua data.windows=aligned train.workers=0 run_dir=aligned --quiet
losses aligned/metrics.jsonl > aligned.txt
cmp -s straight.txt aligned.txt && fail "windows = random trained on the aligned windows"
echo "windows: workers and resume leave the losses of random windows unchanged"
echo "windows: ok"
