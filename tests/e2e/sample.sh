#!/bin/sh
# trainrun sample only reads: sampling from a run directory that holds what
# a training run (or a crash of one) leaves there — a stale staging
# directory, a half-written LATEST, a checkpoint set aside, a LATEST one
# behind the newest checkpoint — changes no byte, name or modification time
# in it, and creates no run directory where it is started.  The text is the
# checkpoint's, whichever way the checkpoint is named, and a recipe whose
# model = { from = DIR } samples DIR's weights without a checkpoint.  A
# prompt token past the vocabulary is refused; --ids gives and prints token
# ids, which a vocabulary of more than 256 needs; --temperature 0 is greedy.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/tests/config/tiny.lua"
ck() { echo "run/checkpoints/step-$(printf %010d "$1")"; }
# names, sizes, modification times and contents of everything under $1
snapshot() {
  find "$1" -printf '%p %s %T@\n' | sort
  find "$1" -type f -exec sha256sum {} + | sort
}

"$TRAINRUN" "$R" train.steps=8 checkpoint.every=4 checkpoint.keep=5 run_dir=run --quiet 2> train.txt \
  || { cat train.txt; fail "training"; }
[ -d "$(ck 4)" ] && [ -d "$(ck 8)" ] || fail "no checkpoints of steps 4 and 8"

# what an interrupted save leaves, with the pid of a process that has ended
sh -c 'exit 0' &
dead=$!
wait $dead
mkdir "run/checkpoints/.trainrun-tmp-step-0000000012-$dead"
cp "$(ck 8)/.trainrun-checkpoint" "$(ck 8)/state.json" "run/checkpoints/.trainrun-tmp-step-0000000012-$dead/"
echo step-0000000012 > "run/checkpoints/.trainrun-tmp-LATEST-$dead"
cp -a "$(ck 4)" "run/checkpoints/.trainrun-old-step-0000000004-$dead"
# LATEST one behind the newest checkpoint, as a crash between the two leaves it
echo step-0000000004 > run/checkpoints/LATEST
[ -f "run/checkpoints/.trainrun-tmp-step-0000000012-$dead/.trainrun-checkpoint" ] \
  || fail "the run's checkpoints carry no .trainrun-checkpoint marker to copy"
snapshot run > before.txt

# sampled from another directory: the run's run_dir=run names no directory there
mkdir elsewhere
(cd elsewhere && "$TRAINRUN" sample ../run --tokens 30 --prompt 12 --seed 5 > ../latest.txt 2> ../latest.err) \
  || { cat latest.err; fail "sample of the run directory"; }
[ -z "$(ls -A elsewhere)" ] || { ls -A elsewhere; fail "sample created $(ls -A elsewhere) where it was started"; }
"$TRAINRUN" sample run/checkpoints --tokens 30 --prompt 12 --seed 5 > dir.txt 2> dir.err \
  || { cat dir.err; fail "sample of the checkpoints directory"; }
"$TRAINRUN" sample "$(ck 8)" --tokens 30 --prompt 12 --seed 5 --top-k 5 --temperature 1.3 \
  > step8.txt 2> step8.err || { cat step8.err; fail "sample of one checkpoint"; }
snapshot run > after.txt
diff before.txt after.txt || fail "sample changed the run directory"
for e in latest.err dir.err step8.err; do
  if grep -q "removed\|restored\|now names" $e; then cat $e; fail "sample tidied the run directory"; fi
done

# LATEST is what a run directory means, even one behind: step 4's text
"$TRAINRUN" sample "$(ck 4)" --tokens 30 --prompt 12 --seed 5 > step4.txt 2> step4.err \
  || { cat step4.err; fail "sample of step 4"; }
cmp -s latest.txt step4.txt || fail "sample of the run is not the text of step 4, which LATEST names"
cmp -s dir.txt step4.txt || fail "sample of run/checkpoints is not the text of step 4"
cmp -s step8.txt step4.txt && fail "steps 4 and 8 gave the same text: the weights were not read"
head -c 2 latest.txt | grep -q '^12$' || fail "the text does not start with the prompt"
[ "$(wc -c < latest.txt)" -eq 33 ] || fail "30 tokens after a 2-byte prompt are not 33 bytes with the newline"
# the same flags give the same text
"$TRAINRUN" sample "$(ck 8)" --tokens 30 --prompt 12 --seed 5 --top-k 5 --temperature 1.3 > again.txt 2> /dev/null
cmp -s step8.txt again.txt || fail "the same flags gave another text"

# --temperature 0 is greedy: the likeliest token each time, the same whatever the
# seed, and the tokens top-k 1 (only the likeliest left to draw) gives
for seed in 1 9; do
  "$TRAINRUN" sample "$(ck 8)" --tokens 30 --ids --prompt "49 50" --ignore-eos --temperature 0 \
    --seed $seed > greedy$seed.txt 2> greedy.err || { cat greedy.err; fail "sample --temperature 0"; }
done
"$TRAINRUN" sample "$(ck 8)" --tokens 30 --ids --prompt "49 50" --ignore-eos --temperature 1 \
  --top-k 1 --seed 3 > top1.txt 2> top1.err || { cat top1.err; fail "sample --top-k 1"; }
[ "$(wc -w < greedy1.txt)" -eq 32 ] || fail "--temperature 0 printed $(wc -w < greedy1.txt) ids, not 32"
cmp -s greedy1.txt greedy9.txt || fail "--temperature 0 depends on the seed"
cmp -s greedy1.txt top1.txt || { cat greedy1.txt top1.txt; fail "--temperature 0 is not the argmax (top-k 1)"; }

# a prompt is token ids: a byte past the vocabulary of 64 would be read past the
# embedding table, so it is refused; --ids lists ids
# sample with the arguments given exits with CODE, says MESSAGE and prints no text
sample_fails() { # code, message, then sample's arguments
  want_code=$1 want=$2
  shift 2
  set +e
  "$TRAINRUN" sample "$@" > refused.txt 2> refused.err
  code=$?
  set -e
  [ $code -eq "$want_code" ] || { cat refused.err; fail "sample $*: exit $code, not $want_code"; }
  grep -qF -e "$want" refused.err || { cat refused.err; fail "sample $*: no message '$want'"; }
  [ ! -s refused.txt ] || fail "sample $* printed text"
}
refused() { sample_fails 1 "$@"; } # message, then sample's arguments
refused "--prompt: byte 97 ('a') is not in the model's vocabulary of 64 tokens" run --prompt ab
refused "--prompt: token id 64 is not in the model's vocabulary of 64" run --ids --prompt "1 64"
refused "--prompt: 'x' is not a token id" run --ids --prompt "1 x"
refused "--ids needs a --prompt of one token id at least" run --ids
"$TRAINRUN" sample run --tokens 30 --ids --prompt "49, 50" --seed 5 > ids.txt 2> ids.err \
  || { cat ids.err; fail "sample --ids"; }
# the same tokens as the bytes "12" gave, written as ids
[ "$(od -An -v -tu1 latest.txt | xargs)" = "$(xargs < ids.txt) 10" ] \
  || { od -An -v -tu1 latest.txt; cat ids.txt; fail "--ids gave other tokens than the bytes"; }
# more ids than bytes: text would lose them, so it takes --ids
"$TRAINRUN" "$R" model.vocab=300 train.steps=1 run_dir=wide --quiet 2> wide.txt || { cat wide.txt; fail "training vocab 300"; }
refused "the model predicts 300 token ids, more than the 256 bytes sample prints as text; pass --ids" wide --prompt 12
"$TRAINRUN" sample wide --ids --prompt 299 --tokens 50 > wide-ids.txt 2> wide.err || { cat wide.err; fail "--ids of vocab 300"; }
[ "$(wc -w < wide-ids.txt)" -eq 51 ] || fail "--ids printed $(wc -w < wide-ids.txt) ids, not 51"

# --- a recipe's model = { from = DIR }, no checkpoint ------------------------------
cat > base.lua <<'EOF'
return {
  model = llama { vocab = 40, ctx = 8, layers = 2, heads = 4, kv_heads = 2, dim = 16, ffn_dim = 24 },
  data = { plugin = "synthetic", kind = "tokens", classes = 40, samples = 256 },
  train = { steps = 3, batch = 2 },
}
EOF
"$TRAINRUN" base.lua run_dir=base --quiet 2> base.txt || { cat base.txt; fail "training the llama"; }
"$TRAINRUN" export base --format hf --dtype fp32 -o hf 2> export.txt || { cat export.txt; fail "export --format hf"; }
cat > ft.lua <<'EOF'
return {
  model = { from = "hf" },
  data = { plugin = "synthetic", kind = "tokens", classes = 40, samples = 256 },
  train = { steps = 2, batch = 2 },
}
EOF
snapshot hf > hf-before.txt
"$TRAINRUN" sample base --tokens 20 --ids --prompt "1 39" --seed 2 > trained.txt 2> trained.err \
  || { cat trained.err; fail "sample of the llama run"; }
"$TRAINRUN" sample ft.lua --tokens 20 --ids --prompt "1 39" --seed 2 > from.txt 2> from.err \
  || { cat from.err; fail "sample of a recipe with model.from"; }
cmp -s trained.txt from.txt || fail "the recipe's from weights did not give the text of the checkpoint they came from"
grep -q "weights from hf (llama" from.err || { cat from.err; fail "sample does not say where the weights came from"; }
[ ! -e runs ] || fail "sample of a recipe created runs/"
snapshot hf > hf-after.txt
diff hf-before.txt hf-after.txt || fail "sample changed the from directory"
# overrides as a run takes them; model.from typed here is relative to this directory
cp -r hf hf2
"$TRAINRUN" sample ft.lua model.from=hf2 --tokens 20 --ids --prompt "1 39" --seed 2 > over.txt 2> over.err \
  || { cat over.err; fail "sample with an override"; }
cmp -s trained.txt over.txt || fail "model.from=hf2 gave another text"
grep -q "weights from hf2 (llama" over.err || { cat over.err; fail "the override was not applied"; }
# a recipe without from has no weights to sample
set +e
"$TRAINRUN" sample base.lua --tokens 5 > none.txt 2> none.err
code=$?
set -e
[ $code -eq 1 ] || { cat none.err; fail "sample of a recipe without weights: exit $code, not 1"; }
grep -q "base.lua: the model has no weights to sample from" none.err || { cat none.err; fail "no message for a recipe without weights"; }
[ ! -s none.txt ] || fail "sample printed text from untrained weights"
# usage mistakes are exit 2
usage_error() { sample_fails 2 "$@"; } # message, then sample's arguments
usage_error "--recipe goes with a checkpoint, and ft.lua is a recipe already" ft.lua --recipe base.lua
usage_error "'model..from=hf' is not an override" ft.lua model..from=hf
usage_error "unknown flag '--frobnicate' for sample" run --frobnicate 1
usage_error "--temperature takes a number of 0 or more (0: greedy" run --temperature -1
usage_error "usage: trainrun" --ids
echo "sample: ok"
