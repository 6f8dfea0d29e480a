#!/bin/sh
# A FIFO where trainrun expects a file (a recipe, a Hugging Face directory's
# config.json, weights, shard or index, a text, tokens or CSV data path, a
# checkpoint's weights, a run's metrics, recipe record or tokenizer) is
# refused at once with exit 1 and a message naming it: opening it for
# reading, or the first read, would block forever.  Every command runs under
# a timeout, so a regression fails here instead of hanging the suite.
. "$(dirname "$0")/lib.sh"
HF="$TR_SRCDIR/tests/fixtures/hf"

# refused WHAT FILE CMD...: CMD exits 1 within the timeout, naming FILE as not a regular file
refused() {
  what=$1 file=$2
  shift 2
  set +e
  timeout 60 "$@" > out.txt 2>&1
  code=$?
  set -e
  [ $code -ne 124 ] || fail "$what: hung on the FIFO $file"
  [ $code -eq 1 ] || { cat out.txt; fail "$what: exit $code, not 1"; }
  grep -q "$file.*not a regular file" out.txt || { cat out.txt; fail "$what: the message does not name $file"; }
}

# --- recipes -----------------------------------------------------------------------
mkfifo recipe.lua
refused "show of a FIFO recipe" recipe.lua "$TRAINRUN" show recipe.lua

# --- Hugging Face directories (model = { from = DIR }) ----------------------------
from() { # recipe name, directory, vocabulary
  cat > "$1" <<EOF
return { model = { from = "$2", ctx = 8 },
  data = { plugin = "synthetic", kind = "tokens", classes = $3 }, train = { steps = 1, batch = 1 } }
EOF
}
cp -R "$HF/tiny-gpt2" g1 && rm g1/config.json && mkfifo g1/config.json
from g1.lua g1 37
refused "show with a FIFO config.json" g1/config.json "$TRAINRUN" show g1.lua
cp -R "$HF/tiny-gpt2" g2 && rm g2/model.safetensors && mkfifo g2/model.safetensors
from g2.lua g2 37
refused "a run from a FIFO model.safetensors" g2/model.safetensors "$TRAINRUN" g2.lua run_dir=r2 --quiet
refused "eval from a FIFO model.safetensors" g2/model.safetensors "$TRAINRUN" eval g2.lua --batches 1
cp -R "$HF/tiny-qwen2-sharded" q1 && rm q1/model-00002-of-00003.safetensors && mkfifo q1/model-00002-of-00003.safetensors
from q1.lua q1 41
refused "a run from a FIFO shard" q1/model-00002-of-00003.safetensors "$TRAINRUN" q1.lua run_dir=r3 --quiet
cp -R "$HF/tiny-qwen2-sharded" q2 && rm q2/model.safetensors.index.json && mkfifo q2/model.safetensors.index.json
from q2.lua q2 41
refused "a run from a FIFO shard index" q2/model.safetensors.index.json "$TRAINRUN" q2.lua run_dir=r4 --quiet

# --- data --------------------------------------------------------------------------
mkfifo text.txt
cat > text.lua <<'EOF'
return { model = gpt { vocab = 256, ctx = 8, layers = 1, heads = 1, dim = 8 },
  data = { plugin = "text", path = "text.txt" }, train = { steps = 1, batch = 1 } }
EOF
refused "text data that is a FIFO" text.txt "$TRAINRUN" text.lua run_dir=r5 --quiet
refused "--smoke of text data that is a FIFO" text.txt "$TRAINRUN" text.lua --smoke
mkfifo train_000.bin
cat > tokens.lua <<'EOF'
return { model = gpt { vocab = 256, ctx = 8, layers = 1, heads = 1, dim = 8 },
  data = { plugin = "tokens", train = "train_*.bin" }, train = { steps = 1, batch = 1 } }
EOF
refused "a token shard that is a FIFO" train_000.bin "$TRAINRUN" tokens.lua run_dir=r6 --quiet
mkfifo data.csv
cat > csv.lua <<'EOF'
return { model = { type = "mlp", hidden = { 4 }, classes = 2, inputs = 3 },
  data = { plugin = "csv", path = "data.csv" }, train = { steps = 1, batch = 1 } }
EOF
refused "CSV data that is a FIFO" data.csv "$TRAINRUN" csv.lua run_dir=r7 --quiet
refused "prepare of a FIFO" text.txt "$TRAINRUN" prepare text.txt -o prepared

# --- a run's own files ---------------------------------------------------------------
"$TRAINRUN" "$TR_SRCDIR/tests/config/tiny.lua" train.steps=2 run_dir=run --quiet
cp -R run run-w
ckpt=checkpoints/$(cat run/checkpoints/LATEST)
rm run-w/$ckpt/model.safetensors && mkfifo run-w/$ckpt/model.safetensors
refused "sample of a checkpoint whose weights are a FIFO" model.safetensors "$TRAINRUN" sample run-w --tokens 2
refused "export of a checkpoint whose weights are a FIFO" model.safetensors "$TRAINRUN" export run-w -o w.safetensors
cp -R run run-m
rm run-m/metrics.jsonl && mkfifo run-m/metrics.jsonl
refused "report of a run whose metrics.jsonl is a FIFO" run-m/metrics.jsonl "$TRAINRUN" report run-m
cp -R run run-r
rm run-r/recipe.resolved.json && mkfifo run-r/recipe.resolved.json
refused "a resume whose recipe record is a FIFO" run-r/recipe.resolved.json \
  "$TRAINRUN" "$TR_SRCDIR/tests/config/tiny.lua" train.steps=3 run_dir=run-r --resume auto --quiet
echo "fifo: ok"
