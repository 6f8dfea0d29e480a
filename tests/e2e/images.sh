#!/bin/sh
# Images end to end: an image folder and a WebDataset tar prepared into
# TRIMAGES shards, an MLP trained on them through the images plugin with
# random crops and flips; the same seed gives the same losses with one
# loader worker or three, another seed other ones.  The images are the
# committed fixtures (PNG, JPEG, WebP), copied into class folders.
. "$(dirname "$0")/lib.sh"
fx="$TR_SRCDIR/tests/fixtures/images"

mkdir -p folder/cool folder/warm
for i in 1 2 3 4; do
  cp "$fx/rgb.png" "folder/warm/a$i.png"
  cp "$fx/rgb.jpg" "folder/warm/b$i.jpg"
  cp "$fx/grey.png" "folder/cool/a$i.png"
  cp "$fx/rgba.webp" "folder/cool/b$i.webp"
done
echo "not an image" > folder/cool/notes.txt
"$TRAINRUN" prepare folder --size 8 --val-fraction 0.25 --augment-copies 1 --seed 3 \
  -o shards > prepare.txt || fail "prepare of the folder"
cat prepare.txt
grep -q '16 images in 2 classes -> ' prepare.txt || fail "prepare: the summary line"
grep -q 'ignored 1 files' prepare.txt || fail "prepare: the ignored file is not counted"
grep -q '"format": "images"' shards/prepare.json || fail "prepare.json"
[ "$(cat shards/classes.txt)" = "$(printf 'cool\nwarm')" ] || fail "classes.txt: sorted class names"
ls shards/train_000000.bin shards/val_000000.bin > /dev/null

# a tar is auto-detected too; its .cls labels are the classes
"$TRAINRUN" prepare "$fx/shard-000.tar" --size 8 --val-fraction 0 -o tarshards > tar.txt ||
  fail "prepare of the tar"
grep -q '3 images in 3 classes -> 3 training and 0 validation' tar.txt || { cat tar.txt; fail "tar summary"; }

cat > r.lua <<'EOF'
return {
  model = mlp { inputs = 192, hidden = { 32 }, classes = 2 },
  data = { plugin = "images", dir = "shards", pad = 2, flip = true, mean = "0.5,0.5,0.5" },
  optimizer = { type = "adamw", lr = 3e-3 },
  train = { steps = 12, batch = 4, eval_every = 6, eval_batches = 1, log_every = 1 },
}
EOF
for w in 1 3; do
  "$TRAINRUN" r.lua run_dir=w$w train.workers=$w --quiet || fail "training with $w workers"
  grep '"loss"' w$w/metrics.jsonl | sed 's/.*"loss": \([^,]*\),.*/\1/' > w$w.loss
done
[ "$(wc -l < w1.loss)" -eq 12 ] || fail "12 logged steps"
cmp -s w1.loss w3.loss || { paste w1.loss w3.loss; fail "one and three loader workers drew other batches"; }
"$TRAINRUN" r.lua run_dir=s2 train.seed=2 --quiet || fail "training with seed 2"
grep '"loss"' s2/metrics.jsonl | sed 's/.*"loss": \([^,]*\),.*/\1/' > s2.loss
cmp -s w1.loss s2.loss && fail "seed 2 trained on the same batches as seed 1"
acc=$(last_metric w1/metrics.jsonl val_accuracy)
[ -n "$acc" ] || fail "no validation accuracy"

# train.epochs counts images (originals and their copies), not the loader's
# augmented views: two epochs of N images in batches of 4 are 2 x floor(N / 4) steps
n=$(sed -n 's/.*"train_images": \([0-9]*\).*/\1/p' shards/prepare.json)
sed 's/steps = 12/epochs = 2/' r.lua > ep.lua
"$TRAINRUN" ep.lua run_dir=ep --quiet || fail "train.epochs"
[ "$(grep -c '"loss"' ep/metrics.jsonl)" -eq $((2 * (n / 4))) ] ||
  fail "train.epochs=2 of $n images: $(grep -c '"loss"' ep/metrics.jsonl) steps, not $((2 * (n / 4)))"

# a damaged shard is refused with its name, not trained on
cp -r shards bad && printf 'X' | dd of=bad/train_000000.bin bs=1 seek=100 conv=notrunc 2> /dev/null
sed 's/dir = "shards"/dir = "bad"/' r.lua > bad.lua
if "$TRAINRUN" bad.lua run_dir=b --quiet 2> bad.txt; then fail "a damaged shard was accepted"; fi
grep -q 'train_000000.bin: the checksum does not match' bad.txt || { cat bad.txt; fail "checksum message"; }
echo "images: ok"
