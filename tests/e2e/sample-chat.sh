#!/bin/sh
# trainrun sample and chat models: --chat renders the prompt as a user message
# with the chat template beside the run's tokenizer, byte for byte and id for
# id what transformers' apply_chat_template(add_generation_prompt=True) gives
# (tests/fixtures/chat/cases.json): ChatML's default system prompt, or
# --system's message; no post-processor BOS (here <|im_start|>, which would
# double the turn opener), also before a prompt written already rendered;
# Llama 3's bos_token once.  Generation stops at the template's end of turn
# (<|im_end|>, <|eot_id|>), not at an eos_token naming the turn opener, and
# --eos TOKEN (its text or id) names the one token to stop at; bad flags are
# refused with messages saying what to do.
. "$(dirname "$0")/lib.sh"
command -v python3 > /dev/null || skip "python3 reads the fixtures"
FIX="$TR_SRCDIR/tests/fixtures/chat"

# case.py FAMILY N FIELD: the field of case N (text as is, ids one line)
cat > case.py <<'PY'
import json, sys
c = json.load(open(sys.argv[1], encoding="utf-8"))[sys.argv[2]]["cases"][int(sys.argv[3])]
v = c[sys.argv[4]]
sys.stdout.write(" ".join(map(str, v)) if isinstance(v, list) else v)
PY
# TRTOKENS version 1 shard of uint16 ids: python3 shard.py OUT VOCAB ID...
cat > shard.py <<'PY'
import struct, sys
ids = [int(x) for x in sys.argv[3:]]
head = b"TRTOKENS" + struct.pack("<IIQII", 1, 2, len(ids), int(sys.argv[2]), 0)
open(sys.argv[1], "wb").write(head.ljust(64, b"\0") + struct.pack("<%dH" % len(ids), *ids))
PY
cat > chat.lua <<'LUA'
return {
  model = gpt { vocab = 600, ctx = 16, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "tokens", train = "data/train_*.bin", val_fraction = 0.3 },
  train = { steps = 2, batch = 4 },
}
LUA

for family in chatml llama3; do
  rm -rf data run
  mkdir data
  cp "$FIX/$family/tokenizer.json" "$FIX/$family/tokenizer_config.json" data/
  ids=$(python3 case.py "$FIX/cases.json" $family 1 ids)
  python3 shard.py data/train_000000.bin 600 $ids $ids $ids $ids $ids $ids
  "$TRAINRUN" chat.lua run_dir=run --quiet 2> train.err || { cat train.err; fail "$family: training"; }
  # cases 3 and 4: the generation prompt without and with a system message
  for n in 3 4; do
    sys=""
    [ $n = 4 ] && sys="Answer from Genesis."
    python3 case.py "$FIX/cases.json" $family $n text > want.txt
    printf '\n' >> want.txt
    python3 case.py "$FIX/cases.json" $family $n ids > want.ids
    printf '\n' >> want.ids
    if [ -n "$sys" ]; then set -- --system "$sys"; else set --; fi
    "$TRAINRUN" sample run --chat "$@" --prompt "What was made first?" --tokens 0 \
      > got.txt 2> got.err || { cat got.err; fail "$family: sample --chat"; }
    cmp -s want.txt got.txt || { od -c got.txt | head; fail "$family case $n: sample --chat printed another rendering than apply_chat_template's"; }
    "$TRAINRUN" sample run --chat "$@" --ids --prompt "What was made first?" --tokens 0 \
      > got.ids 2> got.err || { cat got.err; fail "$family: sample --chat --ids"; }
    cmp -s want.ids got.ids || { cat want.ids got.ids; fail "$family case $n: sample --chat's ids are not apply_chat_template's"; }
    # the same text as a plain prompt: no BOS put before it either ($(...) would drop
    # its last newline: the x keeps it)
    rendered=$(python3 case.py "$FIX/cases.json" $family $n text; printf x)
    "$TRAINRUN" sample run --prompt "${rendered%x}" --tokens 0 > plain.txt 2> plain.err \
      || { cat plain.err; fail "$family: a rendered prompt"; }
    grep -q "prompt: $(wc -w < want.ids) tokens" plain.err \
      || { cat plain.err; fail "$family case $n: a BOS was put before a prompt rendered with the chat template"; }
  done
  # a plain prompt still starts after the post-processor's BOS
  "$TRAINRUN" sample run --prompt "Light." --tokens 0 > light.txt 2> light.err || { cat light.err; fail "$family: plain prompt"; }
  grep -q "prompt: 3 tokens" light.err || { cat light.err; fail "$family: the BOS before a plain prompt"; }
done

# ---- where generation stops ----------------------------------------------------------
# (the run is Llama 3's: eos_token <|eot_id|> is the end of turn)
"$TRAINRUN" sample run --prompt "Light." --tokens 0 2> stop.err > /dev/null || { cat stop.err; fail "sample"; }
grep -q "EOS: 4 <|eot_id|> (the chat template's end of turn))" stop.err || { cat stop.err; fail "llama3: not stopping at <|eot_id|>"; }
# ChatML whose eos_token names the turn opener: stops at <|im_end|> alone
rm -rf data run
mkdir data
cp "$FIX/chatml/tokenizer.json" data/
sed 's/"eos_token": "<|im_end|>"/"eos_token": "<|im_start|>"/' "$FIX/chatml/tokenizer_config.json" > data/tokenizer_config.json
grep -q '"eos_token": "<|im_start|>"' data/tokenizer_config.json || fail "the fixture's eos_token moved"
ids=$(python3 case.py "$FIX/cases.json" chatml 1 ids)
python3 shard.py data/train_000000.bin 600 $ids $ids $ids $ids $ids $ids
"$TRAINRUN" chat.lua run_dir=run --quiet 2> train.err || { cat train.err; fail "chatml: training"; }
"$TRAINRUN" sample run --prompt "Light." --tokens 0 2> stop.err > /dev/null || { cat stop.err; fail "sample"; }
grep -q "EOS: 2 <|im_end|> (the chat template's end of turn))" stop.err \
  || { cat stop.err; fail "chatml: not stopping at <|im_end|> alone, where eos_token names <|im_start|>"; }

# --eos: greedy ids of the model, then the first of them named as the one to stop at
"$TRAINRUN" sample run --chat --ids --prompt "Hi" --temperature 0 --tokens 4 --ignore-eos \
  > greedy.ids 2> greedy.err || { cat greedy.err; fail "greedy sample"; }
plen=$(sed -n 's/.*prompt: \([0-9]*\) tokens.*/\1/p' greedy.err)
first=$(cut -d' ' -f$((plen + 1)) greedy.ids)
[ -n "$first" ] || { cat greedy.ids greedy.err; fail "no sampled ids"; }
"$TRAINRUN" sample run --chat --ids --prompt "Hi" --temperature 0 --tokens 4 --eos "$first" \
  > eos.ids 2> eos.err || { cat eos.err; fail "sample --eos ID"; }
[ "$(wc -w < eos.ids)" = $((plen + 1)) ] || { cat eos.ids eos.err; fail "--eos $first did not stop at the first token"; }
grep -q "EOS: $first .* (--eos)" eos.err && grep -q "stopped at the EOS token $first after 1 tokens" eos.err \
  || { cat eos.err; fail "--eos is not named as the EOS"; }
"$TRAINRUN" sample run --prompt "Hi" --tokens 0 --eos "<|endoftext|>" > /dev/null 2> eos.err \
  || { cat eos.err; fail "sample --eos TEXT"; }
grep -q "EOS: 0 <|endoftext|> (--eos))" eos.err || { cat eos.err; fail "--eos <|endoftext|> is not the EOS"; }

# ---- refused ---------------------------------------------------------------------------
"$TRAINRUN" sample run --prompt "Hi" --eos "<|nope|>" > /dev/null 2> bad.err && fail "an unknown --eos token"
grep -q "eos '<|nope|>': run/tokenizer.json has no such token; give a token of its vocabulary (e.g. <|im_end|>) or its id" bad.err \
  || { cat bad.err; fail "no clear message for an unknown --eos"; }
"$TRAINRUN" sample run --prompt "Hi" --eos 600 > /dev/null 2> bad.err && fail "--eos past the vocabulary"
grep -q "eos 600 is not an id the model samples (below 600)" bad.err || { cat bad.err; fail "no clear message for --eos 600"; }
"$TRAINRUN" sample run --prompt "Hi" --system "Be brief." > /dev/null 2> bad.err && fail "--system without --chat"
grep -q "add --chat" bad.err || { cat bad.err; fail "no clear message for --system without --chat"; }
echo '{"eos_token": "<|im_end|>"}' > run/tokenizer_config.json
"$TRAINRUN" sample run --chat --prompt "Hi" > /dev/null 2> bad.err && fail "--chat without a chat template"
grep -q "chat template, but .*tokenizer_config.json has no chat_template" bad.err \
  || { cat bad.err; fail "no clear message for --chat without a template"; }
exit 0
