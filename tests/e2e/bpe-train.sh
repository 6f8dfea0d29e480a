#!/bin/sh
# trainrun prepare --train-tokenizer N: a byte-level BPE of N tokens trained on the
# training documents only (a word found only in the validation documents never becomes a
# token; with no validation split it does), written as OUTDIR/tokenizer.json, the same
# file on every run, and used for the shards (vocabulary N in the headers and
# prepare.json); sizes out of range and a second tokenizer are usage errors; a run on the
# shards logs the validation loss per byte: val_loss / (text bytes per token of the
# validation shards), and eval prints the same.
. "$(dirname "$0")/lib.sh"
R="$TR_SRCDIR/recipes"

# 1200 lines of words from a small alphabet, then 60 lines (numbered, so exact dedup keeps
# them) of a word seen nowhere else: one document per line; the last 10% of the bytes (whole lines) validate
awk 'BEGIN { srand(3); split("ka lo mi ne ru sa to vi", syl, " ")
             for (i = 0; i < 1200; i++) { line = ""
               for (w = 0; w < 8; w++) { word = ""; n = 1 + int(rand() * 3)
                 for (k = 0; k < n; k++) word = word syl[1 + int(rand() * 8)]
                 line = line (w ? " " : "") word }
               print line "." }
             for (i = 0; i < 60; i++) print "zyzzyva zyzzyva zyzzyva zyzzyva zyzzyva zyzzyva " i "." }' > text.txt

# ---- usage errors ------------------------------------------------------------
for bad in "--train-tokenizer 256" "--train-tokenizer x" "--train-tokenizer -5" \
            "--train-tokenizer 300 --tokenizer char"; do
  set +e; "$TRAINRUN" prepare text.txt -o bad $bad > /dev/null 2> err.txt; rc=$?; set -e
  [ "$rc" = 2 ] || { cat err.txt; fail "prepare $bad: exit $rc, not 2 (usage)"; }
  grep -q "train-tokenizer" err.txt || { cat err.txt; fail "prepare $bad: the message does not name --train-tokenizer"; }
done
printf 'a,b\n1,2\n' > t.csv
set +e; "$TRAINRUN" prepare t.csv -o bad --train-tokenizer 300 > /dev/null 2> err.txt; rc=$?; set -e
[ "$rc" = 2 ] || { cat err.txt; fail "prepare of a CSV with --train-tokenizer: exit $rc, not 2"; }
[ ! -e bad/tokenizer.json ] || fail "a refused prepare wrote a tokenizer"
"$TRAINRUN" prepare --help | grep -q -- "--train-tokenizer N" || fail "prepare --help does not list --train-tokenizer"

# ---- training --------------------------------------------------------------------
"$TRAINRUN" prepare text.txt -o out --train-tokenizer 300 --doc-separator line \
  --val-fraction 0.1 > out.txt 2>&1 || { cat out.txt; fail "prepare --train-tokenizer 300"; }
grep -q "trained a byte-level BPE of 300 tokens" out.txt || { cat out.txt; fail "no training report"; }
[ -f out/tokenizer.json ] || fail "no out/tokenizer.json"
grep -q '"vocab": 300' out/prepare.json || { cat out/prepare.json; fail "prepare.json does not say vocab 300"; }
grep -q '"<|endoftext|>": 0' out/tokenizer.json || fail "<|endoftext|> is not id 0"
# the shards' headers: vocabulary (byte 24) 300, text bytes (byte 32) known
for s in out/train_000000.bin out/val_000000.bin; do
  [ "$(od -An -tu4 -j24 -N4 "$s" | tr -d ' ')" = 300 ] || fail "$s: header vocabulary is not 300"
  [ "$(od -An -tu8 -j32 -N8 "$s" | tr -d ' ')" -gt 0 ] || fail "$s: header text bytes are 0"
done
# the validation documents are not trained on, the training ones are
grep -q 'zyzz' out/tokenizer.json && fail "a word of the validation documents only is in the vocabulary"
grep -q '"Ġka"' out/tokenizer.json || fail "a frequent training word piece (\" ka\") is not a token"
"$TRAINRUN" prepare text.txt -o all --train-tokenizer 300 --doc-separator line \
  --val-fraction 0 > all.txt 2>&1 || { cat all.txt; fail "prepare --val-fraction 0"; }
grep -q 'zyzz' all/tokenizer.json || fail "with every document trained on, \"zyzzyva\" makes no token (the check above proves nothing)"
# the same file again (into an OUTDIR used before)
cp out/tokenizer.json first.json
"$TRAINRUN" prepare text.txt -o out --train-tokenizer 300 --doc-separator line \
  --val-fraction 0.1 > /dev/null 2>&1 || fail "prepare into the same OUTDIR again"
cmp -s first.json out/tokenizer.json || fail "a second training wrote another tokenizer.json"

# ---- the loss per byte of a run on the shards ---------------------------------------
tokens=$(od -An -tu8 -j16 -N8 out/val_000000.bin | tr -d ' ')
bytes=$(od -An -tu8 -j32 -N8 out/val_000000.bin | tr -d ' ')
cat > bpe.lua << EOF
return {
  extends = "$R/base/gpt-char.lua",
  model = gpt { vocab = 300, ctx = 16, layers = 1, heads = 2, dim = 32 },
  data = { plugin = "tokens", train = "out/train_*.bin", val = "out/val_*.bin" },
  train = { steps = 10, batch = 8, eval_every = 10, eval_batches = 2, log_every = 5 },
}
EOF
"$TRAINRUN" bpe.lua run_dir=run > run.txt 2>&1 || { cat run.txt; fail "a run on the trained tokens"; }
grep -q "nats/token (.* nats/byte)" run.txt || { cat run.txt; fail "the log shows no loss per byte"; }
val=$(last_metric run/metrics.jsonl val_loss)
per_byte=$(last_metric run/metrics.jsonl val_loss_per_byte)
echo "bpe-train: val $tokens tokens of $bytes bytes; loss $val nats/token, $per_byte nats/byte"
awk -v l="$val" -v b="$per_byte" -v t="$tokens" -v n="$bytes" \
  'BEGIN { want = l * t / n; d = b - want; if (d < 0) d = -d; exit !(n > t && d <= 1e-5 * want) }' ||
  fail "val_loss_per_byte $per_byte is not val_loss $val x $tokens tokens / $bytes bytes"
"$TRAINRUN" eval bpe.lua --checkpoint run --json > eval.json 2> eval.txt || { cat eval.txt; fail "eval"; }
got=$(sed -n 's/.*"loss_per_byte": *\([^,}]*\).*/\1/p' eval.json)
awk -v a="$got" -v b="$per_byte" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 5e-6 * b) }' ||
  fail "eval's loss_per_byte $got is not the logged $per_byte"
echo "bpe-train: ok"
