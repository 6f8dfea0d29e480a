#!/bin/sh
# A model from a Hugging Face directory as its users run it: the context a
# from model plans without model.ctx (2048 at most, said), data that does not
# fit model.from's tokenizer refused by show, eval and the run before any
# weights load (byte ids; another tokenizer's ids), and the way out: export
# --format hf writes the tokenizer and generation_config.json beside the
# weights (what AutoTokenizer.from_pretrained reads) and warns when it rounds
# them, and eval --logits writes the logits for a reference to compare.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 (standard library only) reads the files"

# a corpus, a byte-level BPE of 300 tokens trained on it, and a llama trained
# on its ids: the run records the tokenizer
python3 - <<'PY'
import random
random.seed(1)
w = "the a cat dog sat on mat ran far near house tree river stone light dark old new".split()
with open("corpus.txt", "w") as f:
    for d in range(400):
        f.write(" ".join(random.choice(w) for _ in range(30)) + ".\n\n")
PY
"$TRAINRUN" prepare corpus.txt -o tok --train-tokenizer 300 --val-fraction 0.2 > prep.txt 2>&1 ||
  { cat prep.txt; fail "prepare --train-tokenizer 300"; }
"$TRAINRUN" prepare corpus.txt -o tok2 --train-tokenizer 280 --val-fraction 0.2 > prep2.txt 2>&1 ||
  { cat prep2.txt; fail "prepare --train-tokenizer 280"; }
cat > base.lua <<'LUA'
return {
  model = llama { vocab = 300, ctx = 16, layers = 1, heads = 2, kv_heads = 1, dim = 16, ffn_dim = 24 },
  data = { plugin = "tokens", train = "tok/train_*.bin", val = "tok/val_*.bin" },
  train = { steps = 2, batch = 2 },
}
LUA
"$TRAINRUN" base.lua run_dir=base --quiet 2> base.txt || { cat base.txt; fail "training the base"; }

# --- export: the tokenizer and generation_config.json beside the weights ---------
"$TRAINRUN" export base --format hf -o m 2> export.txt || { cat export.txt; fail "export --format hf"; }
cmp -s tok/tokenizer.json m/tokenizer.json || fail "the export lacks the run's tokenizer.json"
for f in tokenizer_config.json generation_config.json; do
  python3 -c "import json, sys; json.load(open(sys.argv[1]))" "m/$f" || fail "the export's $f is not JSON"
done
grep -q '"tokenizer_class": "PreTrainedTokenizerFast"' m/tokenizer_config.json ||
  { cat m/tokenizer_config.json; fail "tokenizer_config.json names no tokenizer class"; }
grep -q '"eos_token_id": 0' m/generation_config.json ||
  { cat m/generation_config.json; fail "generation_config.json lacks the data's EOS"; }
# the default bf16 rounds the fp32 checkpoint: said, with the way to keep it
grep -q "warning: exporting the fp32 weights of .* as bf16 .*--dtype fp32" export.txt ||
  { cat export.txt; fail "no warning that bf16 rounds the fp32 weights"; }
"$TRAINRUN" export base --format hf --dtype fp32 -o m32 2> export32.txt || { cat export32.txt; fail "export --dtype fp32"; }
grep -q "warning" export32.txt && { cat export32.txt; fail "a warning for an export that keeps the weights"; }
# a model from the export hands its tokenizer (and the base's files) on
echo '{"bos_token": "<|endoftext|>"}' > m/special_tokens_map.json
echo '{"eos_token_id": 0, "max_new_tokens": 7}' > m/generation_config.json
cat > good.lua <<'LUA'
return {
  model = { from = "m" },
  data = { plugin = "tokens", train = "tok/train_*.bin", val = "tok/val_*.bin" },
  train = { steps = 1, batch = 2 },
}
LUA
"$TRAINRUN" good.lua run_dir=ft --quiet 2> ft.txt || { cat ft.txt; fail "fine-tuning the export"; }
"$TRAINRUN" export ft --format hf --dtype fp32 -o m2 2> export2.txt || { cat export2.txt; fail "export of the fine-tuned run"; }
for f in tokenizer.json special_tokens_map.json generation_config.json; do
  cmp -s "m/$f" "m2/$f" || fail "the fine-tuned export's $f is not the base's"
done

# --- eval --logits: the ids and logits of the first micro-batch -----------------
"$TRAINRUN" eval good.lua --batches 1 --json --logits logits.safetensors > eval.json 2> eval.txt ||
  { cat eval.txt; fail "eval --logits"; }
python3 - <<'PY' || fail "eval --logits: the file does not hold the logits eval scored"
import json, math, struct
b = open("logits.safetensors", "rb").read()
(n,) = struct.unpack("<Q", b[:8])
h = json.loads(b[8:8 + n])
d = b[8 + n:]
def values(k, fmt):
    s, e = h[k]["data_offsets"]
    return struct.unpack("<%d%s" % ((e - s) // 4, fmt), d[s:e])
assert h["input_ids"]["dtype"] == "I32" and h["input_ids"]["shape"] == [2, 16], h["input_ids"]
assert h["labels"]["shape"] == [2, 16] and h["logits"]["dtype"] == "F32", h
B, T, V = h["logits"]["shape"]
assert (B, T, V) == (2, 16, 300), h["logits"]["shape"]
lg, lab = values("logits", "f"), values("labels", "i")
loss = 0.0
for r in range(B * T):
    row = lg[r * V:(r + 1) * V]
    m = max(row)
    loss += m + math.log(sum(math.exp(x - m) for x in row)) - row[lab[r]]
want = json.load(open("eval.json"))["loss"]
assert abs(loss / (B * T) - want) < 1e-5 * max(1, abs(want)), (loss / (B * T), want)
PY

# --- data that does not fit model.from's tokenizer --------------------------------
cat > bytes.lua <<'LUA'
return {
  model = { from = "m", ctx = 16 },
  data = { plugin = "text", path = "corpus.txt" },
  train = { steps = 1, batch = 2 },
}
LUA
for cmd in show eval run; do
  if [ $cmd = run ]; then set -- bytes.lua run_dir=bytes; else set -- $cmd bytes.lua; fi
  "$TRAINRUN" "$@" > bytes-$cmd.txt 2>&1 && { cat bytes-$cmd.txt; fail "$cmd: byte ids accepted for a model with a tokenizer"; }
  grep -q "bytes.lua:3: data 'text' gives byte ids .*m/tokenizer.json.*trainrun prepare FILE -o DIR --tokenizer m/tokenizer.json" bytes-$cmd.txt ||
    { cat bytes-$cmd.txt; fail "$cmd: the byte-data error"; }
done
grep -q "weights from" bytes-run.txt && { cat bytes-run.txt; fail "the weights were loaded before the data was refused"; }
# shards prepared byte by byte are bytes too; synthetic ids (a benchmark) are not text
"$TRAINRUN" prepare corpus.txt -o bytetok --val-fraction 0.2 > prep3.txt 2>&1 || { cat prep3.txt; fail "prepare (bytes)"; }
"$TRAINRUN" show bytes.lua 'data.plugin=tokens' 'data.train=bytetok/train_*.bin' 'data.val=bytetok/val_*.bin' > bt.txt 2>&1 &&
  { cat bt.txt; fail "byte shards accepted for a model with a tokenizer"; }
grep -q "data 'tokens' gives byte ids" bt.txt || { cat bt.txt; fail "byte shards: the error"; }
"$TRAINRUN" show bytes.lua data.plugin=synthetic data.kind=tokens data.classes=256 > syn.txt 2>&1 ||
  { cat syn.txt; fail "synthetic ids refused as bytes"; }
cat > other.lua <<'LUA'
return {
  model = { from = "m", ctx = 16 },
  data = { plugin = "tokens", train = "tok2/train_*.bin", val = "tok2/val_*.bin" },
  train = { steps = 1, batch = 2 },
}
LUA
"$TRAINRUN" show other.lua > other.txt 2>&1 && { cat other.txt; fail "show: another tokenizer's data accepted"; }
grep -q "other.lua:2: model.from: the weights in m were trained with the tokenizer m/tokenizer.json .*tok2/tokenizer.json" other.txt ||
  { cat other.txt; fail "show: the tokenizer mismatch"; }
# found before the weights: a directory whose weights are not there yet
mkdir nowts && cp m/config.json m/tokenizer.json nowts/
"$TRAINRUN" other.lua model.from=nowts run_dir=other > other-run.txt 2>&1 && fail "run: another tokenizer's data accepted"
grep -q "trained with the tokenizer nowts/tokenizer.json" other-run.txt || { cat other-run.txt; fail "run: the mismatch was not found first"; }
# data not there yet: show still shows, with a note
"$TRAINRUN" show other.lua 'data.train=absent/train_*.bin' > absent.txt 2> absent-err.txt || { cat absent-err.txt; fail "show with data not prepared yet"; }
grep -q "note: the data is not checked against the tokenizer of m" absent-err.txt || { cat absent-err.txt; fail "show: no note about unopened data"; }
"$TRAINRUN" show good.lua > good.txt 2>&1 || { cat good.txt; fail "show: the model's own tokenizer's data refused"; }

# --- without model.ctx: config.json's context, at most 2048, said -----------------
mkdir long
cp m/model.safetensors long/
sed 's/"max_position_embeddings": 16/"max_position_embeddings": 8192/' m/config.json > long/config.json
grep -q '"max_position_embeddings": 8192' long/config.json || fail "the long config"
cat > long.lua <<'LUA'
return {
  model = { from = "long" },
  data = { plugin = "synthetic", kind = "tokens", classes = 300 },
  train = { steps = 1, batch = 2 },
}
LUA
"$TRAINRUN" show long.lua > long.txt 2> long-err.txt || { cat long-err.txt; fail "show of a long from model"; }
grep -q 'model.ctx = 2048 *-- default: long/config.json says 8192 ("max_position_embeddings").*set model.ctx = 8192' long.txt ||
  { cat long.txt; fail "show: the capped context and why"; }
grep -q "note: model.ctx = 2048: long/config.json allows 8192 tokens" long-err.txt || { cat long-err.txt; fail "no note of the capped context"; }
"$TRAINRUN" show long.lua model.ctx=4096 > long4k.txt 2>&1 || { cat long4k.txt; fail "show with model.ctx=4096"; }
grep -q 'model.ctx = 4096 *-- command line' long4k.txt || { cat long4k.txt; fail "model.ctx=4096 not kept"; }
grep -q "note: model.ctx" long4k.txt && { cat long4k.txt; fail "a note although model.ctx is set"; }
# a shorter directory keeps its own context, with no note
"$TRAINRUN" show good.lua > short.txt 2>&1
grep -q 'model.ctx = 16 *-- m/config.json' short.txt || { cat short.txt; fail "a 16-position model's ctx"; }
grep -q "note: model.ctx" short.txt && { cat short.txt; fail "a note for a context that was not shortened"; }
# a plan that does not fit names the context as the lever
"$TRAINRUN" long.lua model.ctx=8192 train.micro_batch=auto train.memory_budget=0.001 run_dir=long-run > fit.txt 2>&1 &&
  fail "a run that does not fit started"
grep -q "shorten the context (model.ctx, now 8192 tokens a sample)" fit.txt || { cat fit.txt; fail "the fit error does not name model.ctx"; }
echo "hf-defaults: ok"
