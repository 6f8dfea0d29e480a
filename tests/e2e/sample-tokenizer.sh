#!/bin/sh
# A run records the tokenizer its data was made with (run_dir/tokenizer.json,
# byte for byte, and where it came from), and `trainrun sample` speaks text
# through it: the prompt encoded, each sampled id printed as its bytes, up to
# the EOS.  Checked with a decoder of its own (python3's standard library
# only): the text sample prints is the decoding of the ids `sample --ids`
# prints for the same prompt's ids and seed.  A char-tokenized text run
# records its character table as a tokenizer.json and samples characters; a
# recipe with model = { from = DIR } samples through DIR/tokenizer.json; data
# made with another tokenizer than DIR's, resuming on such data, and a model
# smaller than its tokenizer are refused.
. "$(dirname "$0")/lib.sh"
command -v python3 > /dev/null || skip "python3 decodes the ids independently"
FIX="$TR_SRCDIR/tests/fixtures"

# ids -> bytes with the tokenizer.json's vocabulary and GPT-2's byte-level
# alphabet (no trainrun code involved)
cat > decode.py <<'EOF'
import json, sys
vocab = json.load(open(sys.argv[1], encoding="utf-8"))["model"]["vocab"]
added = json.load(open(sys.argv[1], encoding="utf-8")).get("added_tokens") or []
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + len(cs) - 188)
byte_of = {chr(c): b for b, c in zip(bs, cs)}
text = {i: bytes(byte_of[ch] for ch in tok) for tok, i in vocab.items()}
text.update({a["id"]: a["content"].encode() for a in added})
ids = [int(x) for x in open(sys.argv[2]).read().split()]
if len(sys.argv) > 3:  # leave out this id (the EOS) where it ends the text
    if ids and ids[-1] == int(sys.argv[3]):
        ids.pop()
sys.stdout.buffer.write(b"".join(text[i] for i in ids))
EOF
# TRTOKENS version 1 shard of uint16 ids: python3 shard.py OUT VOCAB ID...
cat > shard.py <<'EOF'
import struct, sys
ids = [int(x) for x in sys.argv[3:]]
head = b"TRTOKENS" + struct.pack("<IIQII", 1, 2, len(ids), int(sys.argv[2]), 0)
open(sys.argv[1], "wb").write(head.ljust(64, b"\0") + struct.pack("<%dH" % len(ids), *ids))
EOF

# ---- a BPE run: data made with the fixture tokenizer (1000 ids) ----------------
mkdir bpe
cp "$FIX/tokenizer/bpe.json" bpe/tokenizer.json
ids=$(python3 -c 'import json, sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["corpus"])))' \
  "$FIX/tokenizer/ids.json")
# the corpus 8 times over: enough windows to train on
python3 shard.py bpe/train_000000.bin 1000 $ids $ids $ids $ids $ids $ids $ids $ids
cat > bpe.lua <<'EOF'
return {
  model = gpt { vocab = 1000, ctx = 16, layers = 1, heads = 2, dim = 32 },
  data = { plugin = "tokens", train = "bpe/train_*.bin" },
  optimizer = { lr = 3e-3 },
  train = { steps = 30, batch = 8, log_every = 10 },
}
EOF
"$TRAINRUN" bpe.lua run_dir=run --quiet 2> train.err || { cat train.err; fail "training on BPE shards"; }
cmp -s run/tokenizer.json "$FIX/tokenizer/bpe.json" \
  || fail "run/tokenizer.json is not the data's tokenizer, byte for byte"
grep -q "\"source\": \"$(cd bpe && pwd -P)/tokenizer.json\"" run/tokenizer.origin.json \
  || { cat run/tokenizer.origin.json; fail "tokenizer.origin.json does not name the source"; }
grep -q '"hash": "[0-9a-f]\{16\}"' run/tokenizer.origin.json \
  || { cat run/tokenizer.origin.json; fail "tokenizer.origin.json has no hash"; }

# the prompt: the corpus's first line, whose ids the fixture lists (a line
# ends where the pre-tokenizer splits, so its ids are a prefix of the corpus's)
prompt=$(head -n 1 "$FIX/tokenizer/corpus.txt")
n=1
while :; do
  echo "$ids" | cut -d' ' -f1-$n > prompt.ids
  [ "$(python3 decode.py run/tokenizer.json prompt.ids)" = "$prompt" ] && break
  n=$((n + 1))
  [ $n -lt 60 ] || fail "no prefix of the corpus ids decodes to its first line"
done
"$TRAINRUN" sample run --prompt "$prompt" --tokens 25 --seed 3 --ignore-eos > text.txt 2> text.err \
  || { cat text.err; fail "sample with the run's tokenizer"; }
grep -q "tokenizer run/tokenizer.json (1000 ids" text.err || { cat text.err; fail "sample does not name its tokenizer"; }
"$TRAINRUN" sample run --ids --prompt "$(cat prompt.ids)" --tokens 25 --seed 3 --ignore-eos \
  > ids.txt 2> ids.err || { cat ids.err; fail "sample --ids"; }
[ "$(wc -w < ids.txt)" -eq $((n + 25)) ] || fail "sample --ids printed $(wc -w < ids.txt) ids, not $n + 25"
python3 decode.py run/tokenizer.json ids.txt > decoded.txt
printf '\n' >> decoded.txt
cmp -s text.txt decoded.txt || { od -c text.txt | head; od -c decoded.txt | head;
  fail "the text sample printed is not the decoding of the ids sample --ids printed"; }
head -c ${#prompt} text.txt | grep -qF "$prompt" || fail "the text does not start with the prompt"
cmp -s text.txt ids.txt && fail "sample printed ids without --ids"

# resuming on data made with another tokenizer: the checkpoints learnt the first one's ids
mkdir other
cp bpe/train_000000.bin other/
cp "$FIX/tokenizer/bpe_gpt2.json" other/tokenizer.json
"$TRAINRUN" bpe.lua run_dir=run data.train=other/train_000000.bin train.steps=40 --resume auto \
  --quiet 2> resume.err && fail "a run resumed on data of another tokenizer"
grep -q "run/tokenizer.json (hash [0-9a-f]\{16\}) is not the tokenizer this run's data was made with, .*other/tokenizer.json" resume.err \
  || { cat resume.err; fail "no clear message for resuming with another tokenizer"; }
cmp -s run/tokenizer.json "$FIX/tokenizer/bpe.json" || fail "the refused resume changed run/tokenizer.json"
# the same tokenizer resumes
"$TRAINRUN" bpe.lua run_dir=run train.steps=40 --resume auto --quiet 2> resumed.err \
  || { cat resumed.err; fail "resuming with the same tokenizer"; }

# a model smaller than the tokenizer: ids it produces would index past the embedding
"$TRAINRUN" bpe.lua run_dir=small model.vocab=500 data.vocab=500 --quiet 2> small.err \
  && fail "a model of 500 ids trained on a tokenizer of 1000"
grep -q "model's vocabulary of 500 tokens is smaller than the 1000 ids of the tokenizer" small.err \
  || { cat small.err; fail "no clear message for a model smaller than its tokenizer"; }

# ---- EOS: generation stops there, unless --ignore-eos -------------------------------
# documents of one token, 5, each after the EOS (<|endoftext|>, id 0), so
# every window starts at an EOS: after "0 5" the model says 0
mkdir eos
cp "$FIX/tokenizer/bpe.json" eos/tokenizer.json
python3 shard.py eos/train_000000.bin 1000 $(i=0; while [ $i -lt 3000 ]; do printf "0 5 "; i=$((i + 1)); done)
"$TRAINRUN" bpe.lua run_dir=erun data.train=eos/train_000000.bin train.steps=100 optimizer.lr=3e-2 \
  --quiet 2> eos.err || { cat eos.err; fail "training the EOS run"; }
"$TRAINRUN" sample erun --ids --prompt "0 5" --top-k 1 --tokens 10 > stop.txt 2> stop.err \
  || { cat stop.err; fail "sample up to the EOS"; }
[ "$(cat stop.txt)" = "0 5 0" ] || { cat stop.txt; fail "sample did not stop at the EOS"; }
grep -q "stopped at the EOS" stop.err || { cat stop.err; fail "sample does not say it stopped at the EOS"; }
# an empty prompt starts a document (after the EOS); the text is token 5's
"$TRAINRUN" sample erun --prompt "" --top-k 1 --tokens 10 > stoptext.txt 2> /dev/null \
  || fail "sample of text up to the EOS"
echo 5 > five.ids
python3 decode.py erun/tokenizer.json five.ids > expect.txt
printf '\n' >> expect.txt
cmp -s stoptext.txt expect.txt || { od -c stoptext.txt; fail "an empty prompt did not start at the EOS and end before the next"; }
"$TRAINRUN" sample erun --ids --prompt "0 5" --top-k 1 --tokens 10 --ignore-eos > all.txt 2> /dev/null \
  || fail "sample --ignore-eos"
[ "$(wc -w < all.txt)" -eq 12 ] || { cat all.txt; fail "--ignore-eos did not sample all 10 tokens"; }

# the EOS a tokenizer_config.json beside the tokenizer names (as prepare puts
# it after each document) goes with the run and is where sampling stops
mkdir eos2
cp "$FIX/tokenizer/bpe.json" eos2/tokenizer.json
echo '{"eos_token": {"content": "<|im_end|>", "special": true}}' > eos2/tokenizer_config.json
python3 shard.py eos2/train_000000.bin 1000 $(i=0; while [ $i -lt 3000 ]; do printf "2 5 "; i=$((i + 1)); done)
"$TRAINRUN" bpe.lua run_dir=erun2 data.train=eos2/train_000000.bin train.steps=100 optimizer.lr=3e-2 \
  --quiet 2> eos2.err || { cat eos2.err; fail "training the run with a tokenizer_config.json"; }
cmp -s erun2/tokenizer_config.json eos2/tokenizer_config.json || fail "the run did not keep tokenizer_config.json"
"$TRAINRUN" sample erun2 --ids --prompt "2 5" --top-k 1 --tokens 10 > stop2.txt 2> stop2.err \
  || { cat stop2.err; fail "sample up to tokenizer_config.json's EOS"; }
[ "$(cat stop2.txt)" = "2 5 2" ] || { cat stop2.txt stop2.err; fail "sample did not stop at tokenizer_config.json's eos_token"; }
grep -q "EOS: 2 <|im_end|>" stop2.err || { cat stop2.err; fail "sample does not name the EOS it stops at"; }
# a fresh run in that directory whose data has no tokenizer leaves none behind
rm -r erun2/checkpoints erun2/metrics.jsonl
"$TRAINRUN" "$TR_SRCDIR/tests/config/tiny.lua" run_dir=erun2 train.steps=2 --quiet 2> none.err \
  || { cat none.err; fail "a run on synthetic tokens"; }
[ ! -e erun2/tokenizer.json ] && [ ! -e erun2/tokenizer_config.json ] && [ ! -e erun2/tokenizer.origin.json ] \
  || { ls erun2; fail "a run without a tokenizer kept the one an earlier run left"; }

# data from `trainrun prepare --tokenizer`: the run records the tokenizer it
# copied beside the shards (the same hash prepare.json gives it) and the EOS
# it put after each document (--eos), which sample stops at
cp "$FIX/tokenizer/corpus.txt" corpus.txt
i=0
while [ $i -lt 8 ]; do printf '\n' >> corpus.txt; cat "$FIX/tokenizer/corpus.txt" >> corpus.txt; i=$((i + 1)); done
"$TRAINRUN" prepare corpus.txt -o prep --tokenizer "$FIX/tokenizer/bpe.json" --eos "<|im_end|>" \
  --dedup none > prep.out 2>&1 || { cat prep.out; fail "prepare --tokenizer"; }
"$TRAINRUN" bpe.lua run_dir=prun 'data.train=prep/train_*.bin' 'data.val=prep/val_*.bin' train.steps=5 \
  --quiet 2> prun.err || { cat prun.err; fail "training on prepared shards"; }
cmp -s prun/tokenizer.json "$FIX/tokenizer/bpe.json" || fail "the run did not record the tokenizer prepare used"
hash=$(sed -n 's/.*"hash": "\([0-9a-f]*\)".*/\1/p' prep/prepare.json)
grep -q "\"hash\": \"$hash\"" prun/tokenizer.origin.json && grep -q '"eos": 2' prun/tokenizer.origin.json \
  || { cat prep/prepare.json prun/tokenizer.origin.json; fail "tokenizer.origin.json lacks prepare's hash or EOS"; }
"$TRAINRUN" sample prun --prompt "Hello" --tokens 5 > prun.txt 2> prun-sample.err \
  || { cat prun-sample.err; fail "sample of a run on prepared shards"; }
grep -q "EOS: 2 <|im_end|>" prun-sample.err || { cat prun-sample.err; fail "sample does not stop at prepare's --eos"; }
grep -q "^Hello" prun.txt || fail "the text does not start with the prompt"

# ---- the prompt check: refused only for a character that has no token ------------
# sample encodes the prompt as prepare encoded the data: what a normalizer
# changes (NFC composes a decomposed e + U+0301) or a decoder does not give
# back (Mistral's strips a leading space) is no reason to
# refuse; a character outside a vocabulary without byte fallback is, named
# with its byte offset
prompt_run() { # DIR FIXTURE VOCAB: a 2-step run on ids 3..12 with FIXTURE as its tokenizer
  mkdir "$1"
  cp "$FIX/tokenizer/$2" "$1/tokenizer.json"
  python3 shard.py "$1/train_000000.bin" "$3" $(i=0; while [ $i -lt 100 ]; do printf "3 4 5 6 7 8 9 10 11 12 "; i=$((i + 1)); done)
  "$TRAINRUN" bpe.lua run_dir="$1/run" model.vocab="$3" data.vocab="$3" "data.train=$1/train_*.bin" \
    train.steps=2 train.batch=2 --quiet 2> "$1.err" || { cat "$1.err"; fail "training on $2's ids"; }
}
prompt_run nfc bpe_qwen2_nfc.json 1000
decomposed=$(printf 'caf\145\314\201 au lait')
"$TRAINRUN" sample nfc/run --prompt "$decomposed" --tokens 3 > nfc.out 2> nfc.err \
  || { cat nfc.err; fail "a prompt the NFC normalizer changes was refused"; }
head -c ${#decomposed} nfc.out | grep -qF "$decomposed" || { od -c nfc.out | head; fail "the NFC prompt is not printed as given"; }
# Llama 2 and Mistral layouts: decode gives "<s> Hi" for "<s>Hi", and Mistral's
# drops a leading space; sp_never.json lowercases (its vocabulary has no K)
prompt_run llama2 sp_llama2.json 800
prompt_run mistral sp_mistral.json 800
prompt_run never sp_never.json 800
for p in "llama2:Hello world" "llama2:<s>Hi there" "mistral: two  spaces" "mistral:  x" "never:the King"; do
  "$TRAINRUN" sample "${p%%:*}/run" --prompt "${p#*:}" --tokens 3 > sp.out 2> sp.err \
    || { cat sp.err; fail "${p%%:*}'s tokenizer refused the prompt '${p#*:}'"; }
  grep -qF "${p#*:}" sp.out || { cat sp.out; fail "${p%%:*}'s prompt '${p#*:}' is not printed"; }
done
# no byte fallback: sp_split_unk.json has no K (nor Q, V, X)
prompt_run unk sp_split_unk.json 800
"$TRAINRUN" sample unk/run --prompt "the caf$(printf '\303\251') King" --tokens 3 > /dev/null 2> unk.err \
  && fail "a prompt with a character outside a vocabulary without byte fallback was sampled"
grep -qF "the character 'K' U+004B at byte 10 has no token in unk/run/tokenizer.json" unk.err \
  || { cat unk.err; fail "no clear message naming the character a vocabulary lacks and its byte"; }
"$TRAINRUN" sample unk/run --prompt "the caf$(printf '\303\251') king" --tokens 3 > /dev/null 2> unk2.err \
  || { cat unk2.err; fail "a prompt of the vocabulary's characters was refused"; }

# ---- a char-tokenized text run samples characters ---------------------------------
i=0
while [ $i -lt 300 ]; do echo "the quick brown fox jumps over the lazy dog"; i=$((i + 1)); done > fox.txt
cat > fox.lua <<'EOF'
return {
  model = gpt { vocab = 32, ctx = 16, layers = 1, heads = 2, dim = 32 },
  data = { plugin = "text", path = "fox.txt", tokenizer = "char" },
  optimizer = { lr = 1e-2 },
  train = { steps = 80, batch = 16, log_every = 20 },
}
EOF
"$TRAINRUN" fox.lua run_dir=crun --quiet 2> char.err || { cat char.err; fail "training a char run"; }
[ -f crun/tokenizer.json ] || fail "a char run records no tokenizer (its character table)"
"$TRAINRUN" sample crun --prompt "the quick" --top-k 1 --tokens 40 > fox.out 2> fox.err \
  || { cat fox.err; fail "sample of a char run"; }
# every character is one of the corpus's (ids as bytes would be control characters)
[ -z "$(tr -d 'a-z \n' < fox.out)" ] || { od -c fox.out; fail "a char run sampled characters its corpus lacks"; }
grep -q "^the quick.* .*[a-z][a-z]" fox.out || { cat fox.out; fail "a char run's text is not words"; }
[ "$(tr -d '\n' < fox.out | wc -c)" -ge 45 ] || { cat fox.out; fail "a char run's text is short"; }
"$TRAINRUN" sample crun --prompt "the quick" --top-k 1 --tokens 40 --ids > /dev/null 2>&1 \
  && fail "--ids took text"
"$TRAINRUN" sample crun --prompt "THE" --tokens 5 > /dev/null 2> upper.err && fail "a prompt with characters the corpus lacks was sampled"
grep -qF "the character 'T' U+0054 at byte 0 has no token in crun/tokenizer.json" upper.err \
  || { cat upper.err; fail "no clear message for a prompt character the corpus lacks"; }

# ---- model = { from = DIR }: DIR's tokenizer.json, and data made with another -------
cp -r "$FIX/hf/tiny-gpt2" gpt2
cp crun/tokenizer.json gpt2/tokenizer.json   # 28 characters: tiny-gpt2 predicts 37 ids
cat > from.lua <<'EOF'
return {
  model = { from = "gpt2", ctx = 8 },
  data = { plugin = "text", path = "fox.txt", tokenizer = "char" },
  train = { steps = 2, batch = 2 },
}
EOF
"$TRAINRUN" sample from.lua --prompt "the " --tokens 20 > from.out 2> from.err \
  || { cat from.err; fail "sample of model.from with its tokenizer"; }
grep -q "tokenizer gpt2/tokenizer.json" from.err || { cat from.err; fail "sample did not use DIR/tokenizer.json"; }
[ -z "$(tr -d 'a-z \n' < from.out)" ] || { od -c from.out; fail "model.from sampled no text of its tokenizer"; }
"$TRAINRUN" from.lua run_dir=frun --quiet 2> fine.err || { cat fine.err; fail "fine-tuning on data of DIR's tokenizer"; }
cmp -s frun/tokenizer.json gpt2/tokenizer.json || fail "the fine-tuning run did not record the tokenizer"

# data without a tokenizer: the run records model.from's
cat > syn.lua <<'EOF'
return {
  model = { from = "gpt2", ctx = 8 },
  data = { plugin = "synthetic", kind = "tokens", classes = 37, samples = 64 },
  train = { steps = 2, batch = 2 },
}
EOF
"$TRAINRUN" syn.lua run_dir=srun --quiet 2> syn.err || { cat syn.err; fail "fine-tuning on synthetic tokens"; }
cmp -s srun/tokenizer.json gpt2/tokenizer.json || fail "a run whose data has no tokenizer did not record model.from's"
grep -q '"from": "model.from"' srun/tokenizer.origin.json || { cat srun/tokenizer.origin.json; fail "tokenizer.origin.json does not say it came from model.from"; }

# data whose characters differ: another tokenizer than the weights learnt
i=0
while [ $i -lt 300 ]; do echo "in the beginning god created the heaven and the earth"; i=$((i + 1)); done > box.txt
"$TRAINRUN" from.lua run_dir=mrun data.path=box.txt --quiet 2> mismatch.err \
  && fail "data made with another tokenizer than model.from's was trained on"
grep -q "from.lua:2: model.from: the weights in gpt2 were trained with the tokenizer gpt2/tokenizer.json" mismatch.err \
  && grep -q "re-prepare the data with .*--tokenizer gpt2/tokenizer.json" mismatch.err \
  && grep -q "\.tokenizer\.json (hash [0-9a-f]\{16\})" mismatch.err \
  || { cat mismatch.err; fail "the tokenizer mismatch message does not name both files and what to do"; }
[ -f mrun/tokenizer.json ] && fail "a refused run recorded a tokenizer"
exit 0
