#!/bin/sh
# trainrun sample's key/value cache: greedy generation (--temperature 0) from
# the Hugging Face fixtures gives, id for id, what transformers' generate
# gives in float64 (tests/fixtures/hf/generate.json, made by
# tests/torch/make_generate_fixtures.py): tiny-llama (rotary positions,
# grouped-query attention) over its whole 64-position context, tiny-qwen2
# (q/k/v biases, a tied head), tiny-gpt2 (learned positions, packed qkv) --
# with the cache and with --no-cache, which re-runs the whole context for
# each token, and on device=cuda through the CUDA-on-CPU harness.  Past the context (a window of the last ctx tokens, re-run in
# full) both give the same text; the log says which way it ran.
. "$(dirname "$0")/lib.sh"
command -v python3 > /dev/null || skip "python3 reads the fixtures"
FIX="$TR_SRCDIR/tests/fixtures/hf"

# field.py NAME FIELD: the field of generate.json's model NAME, ids on one line
cat > field.py <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))[sys.argv[2]][sys.argv[3]]
print(" ".join(map(str, v)) if isinstance(v, list) else v)
PY

for name in tiny-llama tiny-qwen2 tiny-gpt2; do
  ctx=$(python3 field.py "$FIX/generate.json" $name ctx)
  prompt=$(python3 field.py "$FIX/generate.json" $name prompt)
  want=$(python3 field.py "$FIX/generate.json" $name ids)
  n=$(echo "$want" | wc -w)
  for way in cache no-cache; do
    flag=; [ $way = no-cache ] && flag=--no-cache
    "$TRAINRUN" sample "$FIX/$name.lua" model.ctx="$ctx" --ids --prompt "$prompt" --tokens "$n" \
      --temperature 0 --ignore-eos $flag > $name-$way.txt 2> $name-$way.err \
      || { cat $name-$way.err; fail "$name: sample ($way)"; }
    got=$(cut -d' ' -f$(($(echo "$prompt" | wc -w) + 1))- $name-$way.txt)
    [ "$got" = "$want" ] || { echo "got:  $got"; echo "want: $want"; fail "$name ($way): not transformers' greedy ids"; }
  done
  grep -q "; key/value cache" $name-cache.err || { cat $name-cache.err; fail "$name: the log does not say the cache ran"; }
  grep -q "no key/value cache (--no-cache)" $name-no-cache.err || { cat $name-no-cache.err; fail "$name: --no-cache not said"; }
done

# device=cuda through the CUDA-on-CPU harness (tests/cudacpu): the same ids,
# fp32, from its rope and attention kernels' windows
if [ -n "${TR_CUDACPU_DIR:-}" ]; then
  for name in tiny-llama tiny-gpt2; do
    ctx=$(python3 field.py "$FIX/generate.json" $name ctx)
    prompt=$(python3 field.py "$FIX/generate.json" $name prompt)
    want=$(python3 field.py "$FIX/generate.json" $name ids)
    TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR "$TRAINRUN" sample "$FIX/$name.lua" model.ctx="$ctx" \
      device=cuda --ids --prompt "$prompt" --tokens "$(echo "$want" | wc -w)" --temperature 0 \
      --ignore-eos > $name-cuda.txt 2> $name-cuda.err || { cat $name-cuda.err; fail "$name: sample on device=cuda"; }
    grep -q "; key/value cache" $name-cuda.err || { cat $name-cuda.err; fail "$name: no cache on device=cuda"; }
    got=$(cut -d' ' -f$(($(echo "$prompt" | wc -w) + 1))- $name-cuda.txt)
    [ "$got" = "$want" ] || { echo "got:  $got"; echo "want: $want"; fail "$name (device=cuda): not transformers' greedy ids"; }
  done
fi

# past the context: a trained 8-position GPT sampled for 40 tokens
"$TRAINRUN" "$TR_SRCDIR/tests/config/tiny.lua" train.steps=30 run_dir=run --quiet 2> train.err \
  || { cat train.err; fail "training"; }
for way in cache no-cache; do
  flag=; [ $way = no-cache ] && flag=--no-cache
  "$TRAINRUN" sample run --tokens 40 --ids --prompt "49 50 51" --ignore-eos --temperature 0 $flag \
    > long-$way.txt 2> long-$way.err || { cat long-$way.err; fail "sample past the context ($way)"; }
  "$TRAINRUN" sample run --tokens 40 --ids --prompt "49 50 51" --ignore-eos --temperature 1 \
    --seed 3 $flag > drawn-$way.txt 2> drawn-$way.err || { cat drawn-$way.err; fail "drawn ($way)"; }
done
[ "$(wc -w < long-cache.txt)" -eq 43 ] || fail "sample past the context gave $(wc -w < long-cache.txt) ids"
cmp -s long-cache.txt long-no-cache.txt || { cat long-cache.txt long-no-cache.txt; fail "past the context the cache changed the text"; }
cmp -s drawn-cache.txt drawn-no-cache.txt || { cat drawn-cache.txt drawn-no-cache.txt; fail "drawn tokens differ with the cache"; }
exit 0
