#!/bin/sh
# prepare --format instruct writes chat messages as transformers renders them:
# the shards' ids are apply_chat_template(messages, tokenize=True)'s for ChatML
# (SmolLM2-Instruct's template: its default system prompt where the messages
# have no system message, and no post-processor BOS, which here is
# <|im_start|> and would double it) and Llama 3 (bos_token once, contents
# trimmed), with and without system messages: the ids of
# tests/fixtures/chat/cases.json, made by transformers 4.46.3
# (tests/fixtures/chat/make_fixtures.py).  The assistant turns and their end
# token are what is trained on.  Where tokenizer_config.json's eos_token names
# the turn opener, prompt/response records end with the end of turn instead.
. "$(dirname "$0")/lib.sh"
command -v python3 > /dev/null || skip "python3 reads the shards and the fixtures"
FIX="$TR_SRCDIR/tests/fixtures/chat"

# shard.py DIR: the ids and mask bits of DIR/train_*.bin, "ID BIT" a line
cat > shard.py <<'PY'
import glob, struct, sys
for path in sorted(glob.glob(sys.argv[1] + "/train_*.bin")):
    raw = open(path, "rb").read()
    magic, version, width, count, vocab, flags = struct.unpack("<8sIIQII", raw[:32])
    assert magic == b"TRTOKENS" and version == 2 and flags == 1, (path, version, flags)
    ids = struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), raw[64:64 + width * count])
    mask = raw[64 + width * count:]
    for i, t in enumerate(ids):
        print(t, mask[i // 8] >> (i % 8) & 1)
PY
# cases.py FAMILY: the conversations as JSONL (records.jsonl) and transformers'
# ids, one a line (want.ids), of the cases without a generation prompt
cat > cases.py <<'PY'
import json, sys
fam = json.load(open(sys.argv[1], encoding="utf-8"))[sys.argv[2]]
with open("records.jsonl", "w", encoding="utf-8") as rec, open("want.ids", "w") as want:
    for c in fam["cases"]:
        if not c["add_generation_prompt"]:
            rec.write(json.dumps({"messages": c["messages"]}, ensure_ascii=False) + "\n")
            want.write("".join("%d\n" % i for i in c["ids"]))
PY

for family in chatml llama3; do
  python3 cases.py "$FIX/cases.json" $family
  "$TRAINRUN" prepare records.jsonl -o $family --format instruct \
    --tokenizer "$FIX/$family/tokenizer.json" --val-fraction 0 > $family.out 2>&1 \
    || { cat $family.out; fail "$family: prepare"; }
  python3 shard.py $family > $family.got
  cut -d' ' -f1 $family.got > got.ids
  diff want.ids got.ids > $family.diff \
    || { head -20 $family.diff; fail "$family: the shards are not the ids apply_chat_template gives"; }
  # trained on: the end-of-turn tokens of the 4 assistant messages, not the others'
  eot=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["end_of_turn_id"])' \
    "$FIX/cases.json" $family)
  [ "$(grep -c "^$eot 1$" $family.got)" = 4 ] \
    || { cat $family.got; fail "$family: not the 4 assistant turns' end tokens trained on"; }
  [ "$(grep -c "^$eot 0$" $family.got)" -gt 0 ] \
    || fail "$family: the system and user turns' end tokens are trained on"
  grep -q "\"chat_template\": \"$family\"" $family/prepare.json || fail "$family: prepare.json's chat_template"
done
# the default system prompt is there, once, where the messages have none
python3 - "$FIX/chatml/tokenizer.json" chatml.got <<'PY' || fail "ChatML: the default system prompt"
import json, sys
ids = [int(l.split()[0]) for l in open(sys.argv[2])]
assert ids.count(1) == 3 + 5 + 3, ids.count(1)  # one <|im_start|> a turn, no BOS on top
PY

# a config whose eos_token names the turn opener: prompt/response records end
# with the template's end of turn, as sample stops there (--eos still decides)
mkdir opener
cp "$FIX/chatml/tokenizer.json" opener/
sed 's/"eos_token": "<|im_end|>"/"eos_token": "<|im_start|>"/' "$FIX/chatml/tokenizer_config.json" \
  > opener/tokenizer_config.json
grep -q '"eos_token": "<|im_start|>"' opener/tokenizer_config.json || fail "the fixture's eos_token moved"
echo '{"prompt": "What was made first?", "response": " Light."}' > pr.jsonl
"$TRAINRUN" prepare pr.jsonl -o pr --format instruct --tokenizer opener/tokenizer.json \
  --val-fraction 0 > pr.out 2>&1 || { cat pr.out; fail "prepare prompt/response"; }
python3 shard.py pr > pr.got
[ "$(tail -n 1 pr.got)" = "2 1" ] || { cat pr.got; fail "the response does not end with <|im_end|>"; }
[ "$(head -n 1 pr.got)" = "1 0" ] || { cat pr.got; fail "prompt/response records lost the post-processor's BOS"; }
grep -q '"eos": 2' pr/prepare.json || { cat pr/prepare.json; fail "prepare.json's eos is not <|im_end|>"; }
grep -q "names <|im_start|>, the chat template's turn opener, as eos_token; prompt/response records end with its end of turn <|im_end|> (id 2)" pr.out \
  || { cat pr.out; fail "prepare does not say it ends records with the end of turn"; }
"$TRAINRUN" prepare pr.jsonl -o pr2 --format instruct --tokenizer opener/tokenizer.json \
  --val-fraction 0 --eos "<|endoftext|>" > pr2.out 2>&1 || { cat pr2.out; fail "prepare --eos"; }
grep -q '"eos": 0' pr2/prepare.json || { cat pr2/prepare.json; fail "--eos is not the EOS"; }
