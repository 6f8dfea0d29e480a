#!/bin/sh
# trainrun prepare --format instruct: prompt/response records and ChatML and
# Llama 3 chat messages become shards whose loss mask trains on exactly the
# responses (and assistant turns) with their end token, checked by decoding
# the shards with python3's own byte-level decoder; prepare.json counts the
# trained and masked tokens; .gz input reads the same; the tokens plugin
# trains on the shards with a finite loss; a step's loss and gradient are
# the mean over its trained-on tokens, so accum = 1, 2 and 4 micro-batches
# of the same uneven masks, and two data-parallel ranks, give the same
# losses and gradient norms; other
# chat templates, messages without a template, byte tokens and bad records
# are refused with messages naming the file (and line).
. "$(dirname "$0")/lib.sh"
command -v python3 > /dev/null || skip "python3 checks the shards independently"
FIX="$TR_SRCDIR/tests/fixtures/tokenizer"

# runs.py TOKENIZER DIR PREFIX: the shards' tokens in runs of equal mask bit,
# one a line: "T <json text>" (trained on) or "M <json text>" (masked).
cat > runs.py <<'EOF'
import glob, json, struct, sys

j = json.load(open(sys.argv[1], encoding="utf-8"))
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + len(cs) - 188)
byte_of = {chr(c): b for b, c in zip(bs, cs)}
text = {i: bytes(byte_of[ch] for ch in t) for t, i in j["model"]["vocab"].items()}
text.update({a["id"]: a["content"].encode() for a in j.get("added_tokens") or []})
ids, bits = [], []
for path in sorted(glob.glob("%s/%s_*.bin" % (sys.argv[2], sys.argv[3]))):
    raw = open(path, "rb").read()
    magic, version, width, count, vocab, flags = struct.unpack("<8sIIQII", raw[:32])
    assert magic == b"TRTOKENS" and version == 2 and flags == 1, (path, version, flags)
    mask = raw[64 + width * count:]
    assert len(mask) == (count + 7) // 8, (path, len(mask), count)
    ids += struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"),
                         raw[64:64 + width * count])
    bits += [mask[i // 8] >> (i % 8) & 1 for i in range(count)]
run, bit = b"", None
for i, b in zip(ids, bits):
    if b != bit and bit is not None:
        print("T" if bit else "M", json.dumps(run.decode()))
        run = b""
    run += text[i]
    bit = b
print("T" if bit else "M", json.dumps(run.decode()))
EOF

# field FILE NAME: the first number after "NAME": in FILE
field() { sed -n "s/.*\"$2\": \([0-9]*\).*/\1/p" "$1" | head -n 1; }

mkdir chatml
cp "$FIX/bpe.json" chatml/tokenizer.json
cat > chatml/tokenizer_config.json <<'EOF'
{"eos_token": "<|im_end|>",
 "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"}
EOF

# --- prompt/response ---------------------------------------------------------------
cat > pr.jsonl <<'EOF'
{"prompt": "In the beginning God created", "response": " the heaven and the earth."}
{"prompt": "And the earth was without form,", "response": " and void."}
{"prompt": "And God said,", "response": " Let there be light: and there was light."}
{"prompt": "And God saw the light,", "response": " that it was good."}
EOF
"$TRAINRUN" prepare pr.jsonl -o pr --format instruct --tokenizer chatml/tokenizer.json \
  --val-fraction 0.2 > pr.out 2>&1 || { cat pr.out; fail "prepare prompt/response"; }
python3 runs.py chatml/tokenizer.json pr train > pr.runs
python3 runs.py chatml/tokenizer.json pr val >> pr.runs
cat > pr.want <<'EOF'
M "In the beginning God created"
T " the heaven and the earth.<|im_end|>"
M "And the earth was without form,"
T " and void.<|im_end|>"
M "And God said,"
T " Let there be light: and there was light.<|im_end|>"
M "And God saw the light,"
T " that it was good.<|im_end|>"
EOF
diff pr.want pr.runs || fail "prompt/response: the mask does not train on exactly the responses and EOS"
grep -q '"format": "instruct"' pr/prepare.json || fail "prepare.json format"
grep -q '"prompt_response": 4, "messages": 0' pr/prepare.json || { cat pr/prepare.json; fail "record counts"; }
grep -q '"tokenizer": {"file": "tokenizer.json", "source": "chatml/tokenizer.json", "hash": "[0-9a-f]\{16\}", "vocab": 1000, "eos": 2' pr/prepare.json \
  || { cat pr/prepare.json; fail "prepare.json's tokenizer"; }
cmp -s chatml/tokenizer.json pr/tokenizer.json || fail "tokenizer.json is not copied"
[ "$(grep -c '"records": 1,' pr/prepare.json)" = 1 ] || { cat pr/prepare.json; fail "validation is not the last record"; }
# the counts add up, and equal the runs' tokens
trained=$(sed -n 's/^  "trained_tokens": \([0-9]*\).*/\1/p' pr/prepare.json)
masked=$(sed -n 's/^  "masked_tokens": \([0-9]*\).*/\1/p' pr/prepare.json)
train_tokens=$(sed -n 's/.*"train": {"records": [0-9]*, "tokens": \([0-9]*\).*/\1/p' pr/prepare.json)
val_tokens=$(sed -n 's/.*"val": {"records": [0-9]*, "tokens": \([0-9]*\).*/\1/p' pr/prepare.json)
[ -n "$trained" ] && [ -n "$masked" ] && [ "$trained" -gt 0 ] && [ "$masked" -gt 0 ] || { cat pr/prepare.json; fail "no token counts"; }
[ $((trained + masked)) = $((train_tokens + val_tokens)) ] || { cat pr/prepare.json; fail "trained + masked is not every token"; }

# the same records gzip-compressed give the same shards
gzip -c pr.jsonl > pr.jsonl.gz
"$TRAINRUN" prepare pr.jsonl.gz -o prgz --format instruct --tokenizer chatml/tokenizer.json \
  --val-fraction 0.2 > prgz.out 2>&1 || { cat prgz.out; fail "prepare .jsonl.gz"; }
cmp -s pr/train_000000.bin prgz/train_000000.bin || fail ".jsonl.gz gives other shards"

# --- ChatML messages -----------------------------------------------------------------
cat > chat.jsonl <<'EOF'
{"messages": [{"role": "system", "content": "Answer from Genesis."}, {"role": "user", "content": "What was made first?"}, {"role": "assistant", "content": "Light."}, {"role": "user", "content": "And then?"}, {"role": "assistant", "content": "The firmament."}]}
{"messages": [{"role": "user", "content": "Who saw the light?"}, {"role": "assistant", "content": "God saw the light, that it was good."}]}
EOF
"$TRAINRUN" prepare chat.jsonl -o chat --format instruct --tokenizer chatml/tokenizer.json \
  --val-fraction 0 > chat.out 2>&1 || { cat chat.out; fail "prepare ChatML messages"; }
python3 runs.py chatml/tokenizer.json chat train > chat.runs
cat > chat.want <<'EOF'
M "<|im_start|>system\nAnswer from Genesis.<|im_end|>\n<|im_start|>user\nWhat was made first?<|im_end|>\n<|im_start|>assistant\n"
T "Light.<|im_end|>"
M "\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
T "The firmament.<|im_end|>"
M "\n<|im_start|>user\nWho saw the light?<|im_end|>\n<|im_start|>assistant\n"
T "God saw the light, that it was good.<|im_end|>"
M "\n"
EOF
diff chat.want chat.runs || fail "ChatML: the mask does not train on exactly the assistant turns and their end"
grep -q '"chat_template": "chatml"' chat/prepare.json || fail "prepare.json chat_template"
grep -q '"prompt_response": 0, "messages": 2' chat/prepare.json || { cat chat/prepare.json; fail "messages count"; }
cmp -s chatml/tokenizer_config.json chat/tokenizer_config.json || fail "tokenizer_config.json is not copied"

# --- Llama 3 messages (its special tokens added to a fixture tokenizer) ---------------
mkdir llama3
python3 - "$FIX/bpe_llama3_bos.json" llama3/tokenizer.json <<'EOF'
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
top = max(max(j["model"]["vocab"].values()), max(a["id"] for a in j["added_tokens"]))
for k, t in enumerate(["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]):
    j["added_tokens"].append({"id": top + 1 + k, "content": t, "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False,
                              "special": True})
json.dump(j, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
EOF
cat > llama3/tokenizer_config.json <<'EOF'
{"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>",
 "chat_template": "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"}
EOF
"$TRAINRUN" prepare chat.jsonl -o l3 --format instruct --tokenizer llama3/tokenizer.json \
  --val-fraction 0 > l3.out 2>&1 || { cat l3.out; fail "prepare Llama 3 messages"; }
python3 runs.py llama3/tokenizer.json l3 train > l3.runs
cat > l3.want <<'EOF'
M "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nAnswer from Genesis.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat was made first?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
T "Light.<|eot_id|>"
M "<|start_header_id|>user<|end_header_id|>\n\nAnd then?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
T "The firmament.<|eot_id|>"
M "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWho saw the light?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
T "God saw the light, that it was good.<|eot_id|>"
EOF
diff l3.want l3.runs || fail "Llama 3: the mask does not train on exactly the assistant turns and their end"
grep -q '"chat_template": "llama3"' l3/prepare.json || fail "prepare.json chat_template llama3"

# --- training on masked shards ----------------------------------------------------------
cat > train.lua <<'EOF'
return {
  model = gpt { vocab = 1000, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "tokens", train = "chat/train_*.bin", val = "chat/train_*.bin" },
  train = { steps = 3, batch = 2, threads = 1, log_every = 1 },
}
EOF
"$TRAINRUN" train.lua run_dir=run > train.out 2>&1 || { cat train.out; fail "training on ChatML shards"; }
loss=$(last_metric run/metrics.jsonl loss)
val=$(last_metric run/metrics.jsonl val_loss)
less_than "$loss" 100 && less_than 0 "$loss" || fail "the training loss is not finite: $loss"
less_than "$val" 100 && less_than 0 "$val" || fail "the validation loss is not finite: $val"
# a loss over the trained-on tokens alone has no loss per byte to report
grep -q val_loss_per_byte run/metrics.jsonl && fail "a loss per byte is reported for masked shards"

# --- token-weighted accumulation -----------------------------------------------------------
# Long prompts and short responses and the other way round give windows with
# very different numbers of trained-on targets.  With exactly `batch` windows
# in the split every step holds them all, so accum = 1, 2 and 4 must agree (and
# data-parallel ranks, and pipeline stages).
cat > acc.jsonl <<'EOF'
{"prompt": "And God made the firmament, and divided the waters which were under the firmament from the waters which were above the firmament: and it was so.", "response": " Amen."}
{"prompt": "Day.", "response": " And God called the firmament Heaven. And the evening and the morning were the second day."}
{"prompt": "And God said, Let the waters under the heaven be gathered together unto one place, and let the dry land appear: and it was so.", "response": " So."}
{"prompt": "Earth.", "response": " And God called the dry land Earth; and the gathering together of the waters called he Seas: and God saw that it was good."}
EOF
"$TRAINRUN" prepare acc.jsonl -o acc --format instruct --tokenizer chatml/tokenizer.json \
  --val-fraction 0 > acc.out 2>&1 || { cat acc.out; fail "prepare the accumulation data"; }
tokens=$(sed -n 's/.*"train": {"records": [0-9]*, "tokens": \([0-9]*\).*/\1/p' acc/prepare.json)
T=$(( (tokens - 1) / 4 ))
cat > acc.lua <<EOF
return {
  model = gpt { vocab = 1000, ctx = $T, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "tokens", train = "acc/train_*.bin", val = "acc/train_*.bin" },
  train = { steps = 3, batch = 4, threads = 1, log_every = 1 },
  optimizer = { lr = 1e-2 },
}
EOF
for mb in 4 2 1; do
  "$TRAINRUN" acc.lua run_dir=acc$mb train.micro_batch=$mb > acc$mb.out 2>&1 \
    || { cat acc$mb.out; fail "accumulation run, micro_batch $mb"; }
  grep '"loss"' acc$mb/metrics.jsonl | sed -e 's/.*\("loss": [^,]*, \).*\("grad_norm": [^,]*\),.*/\1\2/' > acc$mb.steps
done
[ "$(wc -l < acc4.steps)" = 3 ] || { cat acc4.steps; fail "three steps were not logged"; }
diff acc4.steps acc2.steps || fail "accum = 2 gives another loss or gradient than one batch of the same tokens"
diff acc4.steps acc1.steps || fail "accum = 4 gives another loss or gradient than one batch of the same tokens"
# two data-parallel ranks of 2 micro-batches of 1: the count is summed over the ranks
"$TRAINRUN" acc.lua procs=2 run_dir=accp train.micro_batch=1 > accp.out 2>&1 \
  || { cat accp.out; fail "accumulation run on two ranks"; }
grep '"loss"' accp/metrics.jsonl | sed -e 's/.*\("loss": [^,]*, \).*\("grad_norm": [^,]*\),.*/\1\2/' > accp.steps
diff acc4.steps accp.steps || fail "two ranks give another loss or gradient than one batch of the same tokens"
# pipeline stages (2, and 2 x 2 replicas) weigh masked micro-batches as one batch does
for procs in 2 4; do
  "$TRAINRUN" acc.lua procs=$procs parallel.pipeline=2 run_dir=accpipe$procs train.micro_batch=1 \
    > accpipe$procs.out 2>&1 || { cat accpipe$procs.out; fail "accumulation run on 2 stages ($procs ranks)"; }
  grep '"loss"' accpipe$procs/metrics.jsonl |
    sed -e 's/.*\("loss": [^,]*, \).*\("grad_norm": [^,]*\),.*/\1\2/' > accpipe$procs.steps
  diff acc4.steps accpipe$procs.steps ||
    fail "2 stages ($procs ranks) give another loss or gradient than one batch of the same tokens"
done

# windows of 8 tokens one at a time: some hold prompt tokens only; those steps
# apply no update (gradient norm 0, loss reported 0), warned about once and
# counted in the summary
sed -e "s/ctx = $T/ctx = 8/" -e 's/batch = 4/batch = 1/' -e 's/steps = 3/steps = 17/' acc.lua > empty.lua
"$TRAINRUN" empty.lua run_dir=empty > empty.out 2>&1 || { cat empty.out; fail "a run with all-masked steps"; }
empty=$(grep -c '"grad_norm": 0,' empty/metrics.jsonl || true)
[ "$empty" -gt 0 ] || { cat empty/metrics.jsonl; fail "no step without trained-on targets (the test data changed?)"; }
[ "$(grep -c 'every target of the step.s batch is masked' empty.out)" = 1 ] || { cat empty.out; fail "the all-masked step is not warned about once"; }
grep -q "  $empty steps without an update: every target of their batch was masked" empty.out \
  || { cat empty.out; fail "the summary does not count the $empty steps without an update"; }

# --- refusals -------------------------------------------------------------------------------
refused() { # NAME WANT...: the last prepare failed (exit 1) and its output has every WANT
  name=$1
  shift
  for want in "$@"; do
    grep -qF -- "$want" "$name.err" || { cat "$name.err"; fail "$name: no '$want'"; }
  done
}
mkdir other
cp "$FIX/bpe.json" other/tokenizer.json
echo '{"eos_token": "<|endoftext|>", "chat_template": "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"}' \
  > other/tokenizer_config.json
if "$TRAINRUN" prepare chat.jsonl -o o1 --format instruct --tokenizer other/tokenizer.json \
  > other.err 2>&1; then fail "an unknown chat template was accepted"; fi
refused other "chat.jsonl:1:" "other/tokenizer_config.json" "not one trainrun renders" \
  "{\"prompt\", \"response\"} records"

mkdir bare
cp "$FIX/bpe.json" bare/tokenizer.json
if "$TRAINRUN" prepare chat.jsonl -o o2 --format instruct --tokenizer bare/tokenizer.json \
  > bare.err 2>&1; then fail "messages without a chat template were accepted"; fi
refused bare "chat.jsonl:1:" "no tokenizer_config.json beside bare/tokenizer.json"
# prompt/response records need no template
"$TRAINRUN" prepare pr.jsonl -o o3 --format instruct --tokenizer bare/tokenizer.json \
  > bare-pr.out 2>&1 || { cat bare-pr.out; fail "prompt/response without a tokenizer_config.json"; }

if "$TRAINRUN" prepare pr.jsonl -o o4 --format instruct > byte.err 2>&1; then
  fail "instruct with byte tokens was accepted"
fi
refused byte "--format instruct needs --tokenizer PATH/tokenizer.json"

printf '%s\n' '{"prompt": "a", "response": "b"}' '{"prompt": "a"}' > bad.jsonl
if "$TRAINRUN" prepare bad.jsonl -o o5 --format instruct --tokenizer chatml/tokenizer.json \
  > bad.err 2>&1; then fail "a record without a response was accepted"; fi
refused bad "bad.jsonl:2:" "\"prompt\" and \"response\""
"$TRAINRUN" prepare bad.jsonl -o o5 --format instruct --tokenizer chatml/tokenizer.json \
  --skip-bad-records > skip.out 2>&1 || { cat skip.out; fail "--skip-bad-records"; }
grep -q '"skipped": 1' o5/prepare.json || { cat o5/prepare.json; fail "the skipped record is not counted"; }

echo '{"messages": [{"role": "user", "content": "Hi"}, {"role": "narrator", "content": "x"}]}' > role.jsonl
if "$TRAINRUN" prepare role.jsonl -o o6 --format instruct --tokenizer chatml/tokenizer.json \
  > role.err 2>&1; then fail "an unknown role was accepted"; fi
refused role "role.jsonl:1: message 2 has role \"narrator\""

echo '{"messages": [{"role": "user", "content": "Hi"}]}' > noasst.jsonl
if "$TRAINRUN" prepare noasst.jsonl -o o7 --format instruct --tokenizer chatml/tokenizer.json \
  > noasst.err 2>&1; then fail "a conversation without an assistant turn was accepted"; fi
refused noasst "noasst.jsonl:1: no assistant message"

"$TRAINRUN" prepare pr.jsonl -o o8 --format instruct --train-tokenizer 300 > train.err 2>&1 \
  && fail "--train-tokenizer with instruct data was accepted"
refused train "leave out --format instruct" "pass it with --tokenizer"

# --format instruct is never guessed: a .jsonl is text by default
"$TRAINRUN" prepare --help | grep -q "instruct is never guessed" || fail "--help does not name instruct"
echo ok
