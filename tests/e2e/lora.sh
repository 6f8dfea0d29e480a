#!/bin/sh
# LoRA end to end on the tiny Llama fixture: train adapters, resume them
# bit-exactly, evaluate and sample a checkpoint of adapters (the base comes
# from model.from), export them for PEFT and read them back (lora.from),
# merge them into the base (export --format hf --merge) and evaluate that as
# a plain model, and refuse a resume against another base.
. "$(dirname "$0")/lib.sh"
cp -r "$TR_SRCDIR/tests/fixtures/hf/tiny-llama" base
cat > lora.lua <<'EOF'
return {
  model = { from = "base", ctx = 8 },
  data = { plugin = "synthetic", kind = "tokens", classes = 61 },
  optimizer = { type = "adamw", lr = 1e-2, clip = 1.0 },
  lora = { rank = 4, alpha = 8, targets = { "q_proj", "v_proj" }, modules_to_save = { "lm_head" } },
  train = { steps = 12, batch = 4, log_every = 4, eval_batches = 4, threads = 1 },
  checkpoint = { every = 6 },
}
EOF
"$TRAINRUN" lora.lua run_dir=straight --quiet
"$TRAINRUN" lora.lua run_dir=stopped train.steps=6 --quiet
"$TRAINRUN" lora.lua run_dir=stopped --resume auto --quiet --allow-changes
a=straight/checkpoints/$(cat straight/checkpoints/LATEST)
b=stopped/checkpoints/$(cat stopped/checkpoints/LATEST)
cmp "$a/model.safetensors" "$b/model.safetensors" || fail "resumed adapters differ"
echo "lora: 6 + 6 steps resumed bit-identical to 12"

# a checkpoint of adapters holds the adapters and the saved head, nothing of the base
grep -q '"base": "crc32:' "$a/state.json" || fail "state.json records no base"
# shellcheck disable=SC2016
python3 - "$a/model.safetensors" <<'EOF' || fail "the checkpoint holds more than the trained tensors"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
names = sorted(k for k in h if k != "__metadata__")
assert all(".lora_" in k or k == "lm_head.weight" for k in names), names
assert len(names) == 9, names
EOF

val() { "$TRAINRUN" eval "$@" --json 2>/dev/null | sed -e 's/.*"loss": *\([-0-9.e+]*\).*/\1/'; }
trained=$(val lora.lua run_dir=straight --checkpoint straight)
fresh=$(val lora.lua run_dir=straight)
less_than "$trained" "$fresh" || fail "eval: trained adapters $trained not below the base's $fresh"
"$TRAINRUN" sample straight --tokens 4 --seed 1 > sample.txt 2>/dev/null || fail "sample of adapters"
# the key/value cache runs each adapter's lora_B onto a window of its base
# output's rows: greedy tokens as the whole-context forward gives them
"$TRAINRUN" sample straight --tokens 12 --temperature 0 --ids --prompt "1 2 3" --ignore-eos > cached.txt 2>/dev/null ||
  fail "greedy sample of adapters"
"$TRAINRUN" sample straight --tokens 12 --temperature 0 --ids --prompt "1 2 3" --ignore-eos --no-cache > whole.txt 2>/dev/null ||
  fail "greedy sample of adapters without the cache"
grep -q "[0-9]" cached.txt && cmp -s cached.txt whole.txt || fail "adapters: cached greedy ids $(cat cached.txt) differ from $(cat whole.txt)"

# PEFT's layout out, and back in as lora.from: the same loss
"$TRAINRUN" export straight --format peft -o adapter 2>/dev/null
[ -f adapter/adapter_config.json ] && [ -f adapter/adapter_model.safetensors ] || fail "no adapter dir"
grep -q '"peft_type": "LORA"' adapter/adapter_config.json || fail "adapter_config.json"
again=$(val lora.lua run_dir=again lora.from=adapter)
[ "$again" = "$trained" ] || fail "lora.from of the export: loss $again, the checkpoint's $trained"
echo "lora: export --format peft read back by lora.from: loss $again"
# an adapter trained on a base of another name is refused, naming both
grep -q '"base_model_name_or_path": "[^"]*base"' adapter/adapter_config.json ||
  fail "the export does not name its base"
cp -r adapter adapter-other
sed -i 's/"base_model_name_or_path": "[^"]*"/"base_model_name_or_path": "org\/other-model"/' \
  adapter-other/adapter_config.json
if "$TRAINRUN" eval lora.lua run_dir=other lora.from=adapter-other > other.log 2>&1; then
  fail "an adapter of another base was evaluated"
fi
grep -q 'was trained on "org/other-model", but model.from is' other.log || { cat other.log; fail "other base"; }

# merged into the base: a plain model with (almost) the same loss
"$TRAINRUN" export straight --format hf --merge --dtype fp32 -o merged 2>/dev/null
sed -e 's/from = "base"/from = "merged"/' -e '/lora =/d' lora.lua > merged.lua
m=$(val merged.lua run_dir=merged)
awk -v a="$m" -v b="$trained" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-5 * b) }' ||
  fail "merged model's loss $m is not the adapters' $trained"
echo "lora: merged export's loss $m (adapters $trained)"

# another base: refused, naming the checkpoint, nothing changed
python3 - base/model.safetensors <<'EOF'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
b[8 + n + 100] ^= 0x40  # one value of the first tensor
open(p, "wb").write(bytes(b))
EOF
if "$TRAINRUN" lora.lua run_dir=straight train.steps=14 --resume auto --allow-changes > other.log 2>&1; then
  fail "resumed against a changed base"
fi
grep -q "adapters only fit the weights they were trained on" other.log || { cat other.log; fail "message"; }
echo "lora: a resume against another base is refused"
# data parallel, with ZeRO-1 and adapter dropout: two ranks' adapters step
# as one process accumulating the same micro-batches (a micro-batch's dropout
# masks follow its place in the step, not the rank that reads it)
for r in 1 2; do
  "$TRAINRUN" lora.lua run_dir=p$r procs=$r parallel.zero=true train.threads=1 train.steps=5 \
    lora.dropout=0.1 train.micro_batch=2 \
    train.log_every=1 checkpoint.every=0 --quiet 2>/dev/null || fail "procs=$r"
done
grep '"loss"' p1/metrics.jsonl | grep -v val_loss | sed 's/.*"loss": *\([-0-9.e]*\).*/\1/' > p1.txt
grep '"loss"' p2/metrics.jsonl | grep -v val_loss | sed 's/.*"loss": *\([-0-9.e]*\).*/\1/' > p2.txt
[ -s p1.txt ] && paste p1.txt p2.txt | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) exit 1 }' ||
  fail "procs=2 with ZeRO-1: losses differ from one process's ($(tr '\n' ' ' < p1.txt) vs $(tr '\n' ' ' < p2.txt))"
echo "lora: procs=2 with ZeRO-1 and dropout steps the adapters as one process"

# adapter dropout: a resumed run draws the masks the uninterrupted one did
"$TRAINRUN" lora.lua run_dir=d8 lora.dropout=0.1 train.steps=8 --quiet 2>/dev/null
"$TRAINRUN" lora.lua run_dir=d44 lora.dropout=0.1 train.steps=4 --quiet 2>/dev/null
"$TRAINRUN" lora.lua run_dir=d44 lora.dropout=0.1 train.steps=8 --resume auto --allow-changes --quiet 2>/dev/null
cmp d8/checkpoints/step-0000000008/model.safetensors d44/checkpoints/step-0000000008/model.safetensors ||
  fail "adapter dropout: 4 + 4 steps differ from 8"
"$TRAINRUN" lora.lua run_dir=n8 train.steps=8 --quiet 2>/dev/null
cmp -s d8/checkpoints/step-0000000008/model.safetensors n8/checkpoints/step-0000000008/model.safetensors &&
  fail "lora.dropout = 0.1 trained the same adapters as none"
echo "lora: adapter dropout resumes bit-exactly"

# a bf16 base under bf16 compute is the fp32 base the GEMMs round to bf16
# anyway: the same adapters to the bit, in half the base's memory; NF4 trains
"$TRAINRUN" lora.lua run_dir=b32 precision=bf16 lora.base=fp32 train.steps=4 --quiet 2>/dev/null
"$TRAINRUN" lora.lua run_dir=b16 precision=bf16 lora.base=bf16 train.steps=4 --quiet 2>/dev/null
cmp b32/checkpoints/step-0000000004/model.safetensors b16/checkpoints/step-0000000004/model.safetensors ||
  fail "a bf16 base under bf16 compute trains other adapters than an fp32 one"
"$TRAINRUN" lora.lua run_dir=q4 precision=bf16 lora.base=nf4 train.steps=4 > q4.txt 2>&1 ||
  { cat q4.txt; fail "an NF4 base"; }
grep -q "frozen (NF4 + 16-bit)" q4.txt || fail "the NF4 base's memory row"
echo "lora: bf16 base = fp32 base under bf16 compute, bit for bit; NF4 base trains"

# device=cuda through the CUDA-on-CPU harness (tests/cudacpu): the same
# adapters' losses as the cpu's, within 1e-5 relative in fp32 (the two
# backends' GEMMs and attention sum in other orders, nothing else differs)
if [ -n "${TR_CUDACPU_DIR:-}" ]; then
  on() { TRAINRUN_BACKEND_PATH=$TR_CUDACPU_DIR "$TRAINRUN" lora.lua train.steps=4 train.log_every=1 "$@"; }
  agree() { # agree RUN_A RUN_B RELATIVE-TOLERANCE WHAT
    a=$(last_metric "$1/metrics.jsonl" loss) b=$(last_metric "$2/metrics.jsonl" loss)
    awk -v a="$a" -v b="$b" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * a) }' ||
      fail "$4: device=cuda's adapters end at loss $b, the cpu's at $a (tolerance $3 relative)"
    echo "lora: $4: device=cuda (harness) loss $b, cpu $a"
  }
  for d in cpu cuda; do
    on run_dir=dev-$d device=$d --quiet > dev-$d.txt 2>&1 || { cat dev-$d.txt; fail "device=$d"; }
  done
  agree dev-cpu dev-cuda 1e-5 "fp32 base"
  # QLoRA: the NF4 base dequantised by the CUDA kernel is the CPU's bit for
  # bit (tests/test_nf4), so fp32 compute keeps the fp32 tolerance above
  for d in cpu cuda; do
    on run_dir=q4-$d device=$d lora.base=nf4 --quiet > q4-$d.txt 2>&1 || { cat q4-$d.txt; fail "NF4 base, device=$d"; }
  done
  agree q4-cpu q4-cuda 1e-5 "QLoRA (NF4 base), fp32 compute"
  # under bf16, base = "auto" stores the frozen base in bf16 on cuda as on
  # the cpu (the same frozen bytes in the run's memory plan, half of fp32's);
  # the losses within 1e-2, test_backend_ops' tolerance for whole models in
  # bf16: activations are rounded to bf16, and the cpu's native bf16
  # attention multiplies in bf16 where the CUDA kernel multiplies in fp32
  for d in cpu cuda; do
    on run_dir=a16-$d device=$d precision=bf16 > a16-$d.txt 2>&1 || { cat a16-$d.txt; fail "bf16 auto base, device=$d"; }
  done
  f16=$(grep 'frozen weights' a16-cuda.txt)
  [ -n "$f16" ] && [ "$f16" = "$(grep 'frozen weights' a16-cpu.txt)" ] ||
    fail "base = auto under bf16: cuda plans '$f16', the cpu '$(grep 'frozen weights' a16-cpu.txt)'"
  on run_dir=a32-cuda device=cuda > a32-cuda.txt 2>&1 || { cat a32-cuda.txt; fail "fp32 auto base on cuda"; }
  [ "$f16" != "$(grep 'frozen weights' a32-cuda.txt)" ] || fail "base = auto on cuda: bf16 stores what fp32 does ($f16)"
  agree a16-cpu a16-cuda 1e-2 "bf16 compute, base auto (bf16)"
  for d in cpu cuda; do
    on run_dir=q16-$d device=$d precision=bf16 lora.base=nf4 --quiet > q16-$d.txt 2>&1 ||
      { cat q16-$d.txt; fail "QLoRA under bf16, device=$d"; }
  done
  agree q16-cpu q16-cuda 1e-2 "QLoRA (NF4 base), bf16 compute"
fi

# show checks what a run checks: a target naming no module, at its line
sed -e 's/"q_proj"/"q_prj"/' lora.lua > typo.lua
"$TRAINRUN" show typo.lua > typo.txt 2>&1 && fail "show accepted a target naming no module"
grep -q 'typo.lua:5: lora.targets: "q_prj" names no linear layer of this model (did you mean "q_proj"?)' typo.txt ||
  { cat typo.txt; fail "show's message for a misspelt target"; }

# the plans the adapters exist for: Llama-3-8B QLoRA on one 24 GB card, LoRA
# on a bf16 base on a 40 GB one (a full fine-tune fits neither)
Q="$TR_SRCDIR/recipes/qlora-llama3-8b.lua"
"$TRAINRUN" plan "$Q" > qlora.txt 2>&1 || { cat qlora.txt; fail "plan of $Q"; }
grep -q "on l4-24gb *fits" qlora.txt || { cat qlora.txt; fail "QLoRA 8B does not fit l4-24gb"; }
grep -q "trained *41,943,040" qlora.txt || fail "QLoRA 8B: not PEFT's 41,943,040 trained parameters"
"$TRAINRUN" plan "$Q" lora.base=bf16 cost.hardware=a100-40gb > lora8b.txt 2>&1
grep -q "on a100-40gb *fits" lora8b.txt || { cat lora8b.txt; fail "LoRA 8B does not fit a100-40gb"; }
sed -e '/lora =/d' "$Q" > full8b.lua
"$TRAINRUN" plan full8b.lua cost.hardware=a100-80gb > full8b.txt 2>&1
grep -q "DOES NOT FIT" full8b.txt || { cat full8b.txt; fail "a full 8B fine-tune fits a100-80gb?"; }
echo "lora: plans: $(grep 'on l4-24gb' qlora.txt | tr -s ' ')"
# adapters under ZeRO-3 in fp16: the adapters' weights are gathered in 16
# bits and every GEMM reads those (lora_B's onto its base output too), so
# the losses and norms are those of ZeRO-2, bit for bit
for lvl in gradients parameters; do
  "$TRAINRUN" lora.lua procs=2 comm=tcp parallel.shard=$lvl precision=fp16 train.steps=4 \
    checkpoint.every=0 run_dir=z-$lvl --quiet > z-$lvl.txt 2>&1 || { cat z-$lvl.txt; fail "fp16 $lvl"; }
  grep -o '"loss": [0-9.e-]*\|"grad_norm": [0-9.e-]*' z-$lvl/metrics.jsonl > z-$lvl.metrics
done
[ -s z-parameters.metrics ] && cmp -s z-gradients.metrics z-parameters.metrics ||
  fail "adapters in fp16: shard = parameters trained other losses than gradients"
# a frozen base is never sharded: its fp32 copies for the forward GEMM
# (kernels/cpu/frozen_t.c: AVX-512 CPUs, 1024 rows or more) stay in the plan
# of every device (at 256 x 8 rows a micro-batch)
"$TRAINRUN" plan lora.lua train.batch=256 > one.txt 2>&1 || { cat one.txt; fail "plan of lora.lua"; }
"$TRAINRUN" plan lora.lua train.batch=256 parallel.shard=parameters cost.hardware=cpu cost.count=2 \
  > sharded.txt 2>&1 ||
  { cat sharded.txt; fail "plan of lora.lua under shard = parameters"; }
copies() { sed -n 's/^ *parameter copies *//p' "$1" | head -1; }
[ "$(copies one.txt)" = "$(copies sharded.txt)" ] ||
  fail "parameter copies: $(copies one.txt) in one process, '$(copies sharded.txt)' a rank sharded"
if grep -q avx512f /proc/cpuinfo; then
  [ -n "$(copies one.txt)" ] || { cat one.txt; fail "no transposed copies of the frozen base planned"; }
fi
echo "lora: ok"
