#!/bin/sh
# Hugging Face directories through the command line: a run's checkpoint
# exported with `export --format hf`, read back by a recipe in another
# directory with model = { from = "../hf" } (show, plan, a run), the
# weights unchanged by the round trip (llama and gpt, whose Conv1D weights
# are transposed both ways), a resume that no longer needs the directory,
# and the errors a user meets.  No PyTorch: tests/test_hf.c compares with it.
. "$(dirname "$0")/lib.sh"

# --- a llama trained from scratch, exported --------------------------------------
cat > base.lua <<'EOF'
return {
  model = llama { vocab = 40, ctx = 8, layers = 2, heads = 4, kv_heads = 2, dim = 16, ffn_dim = 24 },
  data = { plugin = "synthetic", kind = "tokens", classes = 40, samples = 256 },
  train = { steps = 2, batch = 2 },
}
EOF
"$TRAINRUN" base.lua run_dir=base --quiet 2> base.txt || { cat base.txt; fail "training the base llama"; }
grep -q '"hf_config"' base/checkpoints/step-0000000002/state.json || fail "state.json records no hf_config"
"$TRAINRUN" export base --format hf -o hf 2> export.txt || { cat export.txt; fail "export --format hf"; }
grep -q "wrote hf/config.json and hf/model.safetensors (bf16 weights" export.txt || { cat export.txt; fail "export message"; }
for key in '"architectures": \["LlamaForCausalLM"\]' '"model_type": "llama"' '"num_key_value_heads": 2' \
           '"intermediate_size": 24' '"max_position_embeddings": 8' '"torch_dtype": "bfloat16"' \
           '"tie_word_embeddings": false' '"rms_norm_eps": 1e-05'; do
  grep -q "$key" hf/config.json || { cat hf/config.json; fail "config.json lacks $key"; }
done

# --- a recipe in another directory fine-tunes it ------------------------------------
mkdir ft
cat > ft/ft.lua <<'EOF'
return {
  model = { from = "../hf", recompute = 1 },
  data = { plugin = "synthetic", kind = "tokens", classes = 40, samples = 256 },
  train = { steps = 2, batch = 2 },
  optimizer = { lr = 0 },
}
EOF
"$TRAINRUN" show ft/ft.lua > show.txt 2>&1 || { cat show.txt; fail "show of a from recipe"; }
grep -q 'model.kv_heads = 2 *-- ft/../hf/config.json' show.txt || { cat show.txt; fail "show: kv_heads from config.json"; }
grep -q 'model.type = "llama"' show.txt || { cat show.txt; fail "show: the type"; }
grep -q 'model.recompute = 1 *-- ft/ft.lua:2' show.txt || { cat show.txt; fail "show: the recipe's own key"; }
# typed on the command line, from is relative to the current directory
"$TRAINRUN" show ft/ft.lua model.from=hf > cli.txt 2>&1 || { cat cli.txt; fail "model.from on the command line"; }
grep -q 'model.kv_heads = 2 *-- hf/config.json' cli.txt || { cat cli.txt; fail "model.from=hf is not ./hf"; }
"$TRAINRUN" plan ft/ft.lua > plan.txt 2>&1 || { cat plan.txt; fail "plan of a from recipe"; }
grep -qi "param" plan.txt || { cat plan.txt; fail "plan shows no parameters"; }

# lr = 0: the weights go out as they came in, byte for byte
"$TRAINRUN" ft/ft.lua run_dir=ft-run 2> ft.txt || { cat ft.txt; fail "fine-tuning from hf"; }
grep -q "weights from ft/../hf (llama" ft.txt || { cat ft.txt; fail "the run does not say where its weights came from"; }
grep -q "\"weights_from\": \"$PWD/hf\"" ft-run/checkpoints/step-0000000002/state.json \
  || { cat ft-run/checkpoints/step-0000000002/state.json; fail "state.json does not record weights_from"; }
"$TRAINRUN" export ft-run --format hf -o hf2 2> export2.txt || { cat export2.txt; fail "second export"; }
cmp -s hf/model.safetensors hf2/model.safetensors || fail "llama weights changed on a round trip through from and export"
cmp -s hf/config.json hf2/config.json || { diff hf/config.json hf2/config.json; fail "config.json changed on a round trip"; }

# data parallel: every rank starts from the directory's weights
"$TRAINRUN" ft/ft.lua procs=2 run_dir=ft-dp --quiet 2> dp.txt || { cat dp.txt; fail "fine-tuning from hf with procs=2"; }
"$TRAINRUN" export ft-dp --format hf -o hf-dp 2> /dev/null || fail "export of the procs=2 run"
cmp -s hf/model.safetensors hf-dp/model.safetensors || fail "procs=2 changed the weights at lr = 0"

# a resumed run has its checkpoint's weights: only config.json is read
mv hf/model.safetensors weights-away
"$TRAINRUN" ft/ft.lua run_dir=ft-run train.steps=3 --resume auto 2> resume.txt || { cat resume.txt; fail "resume without the hf weights"; }
grep -q "resumed from checkpoint step-0000000002" resume.txt || { cat resume.txt; fail "did not resume"; }
if grep -q "weights from" resume.txt; then fail "a resumed run loaded the pretrained weights"; fi
if "$TRAINRUN" ft/ft.lua run_dir=ft-fresh 2> noweights.txt; then fail "a fresh run without the weights"; fi
grep -q "ft/ft.lua:2: model.from: ft/../hf holds neither model.safetensors nor model.safetensors.index.json" noweights.txt \
  || { cat noweights.txt; fail "missing weights message"; }
mv weights-away hf/model.safetensors
mv hf hf-away
if "$TRAINRUN" ft/ft.lua run_dir=ft-fresh 2> gone.txt; then fail "a fresh run without its from directory"; fi
grep -q "ft/ft.lua:2: model.from: cannot read ft/../hf/config.json" gone.txt || { cat gone.txt; fail "a missing directory's message"; }
mv hf-away hf

# --- gpt: Conv1D weights transposed in and out --------------------------------------
cat > gpt.lua <<'EOF'
return {
  model = gpt { vocab = 40, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 40, samples = 256 },
  train = { steps = 2, batch = 2 },
}
EOF
"$TRAINRUN" gpt.lua run_dir=gpt --quiet 2> gpt.txt || { cat gpt.txt; fail "training the gpt"; }
"$TRAINRUN" export gpt --format hf --dtype fp32 -o hf-gpt 2> /dev/null || fail "export of a gpt"
grep -q '"architectures": \["GPT2LMHeadModel"\]' hf-gpt/config.json || fail "gpt config.json"
grep -q '"activation_function": "gelu_new"' hf-gpt/config.json || fail "gpt activation"
cat > gpt-ft.lua <<'EOF'
return {
  model = { from = "hf-gpt" },
  data = { plugin = "synthetic", kind = "tokens", classes = 40, samples = 256 },
  train = { steps = 1, batch = 2 },
  optimizer = { lr = 0 },
}
EOF
"$TRAINRUN" gpt-ft.lua run_dir=gpt-ft --quiet 2> gptft.txt || { cat gptft.txt; fail "fine-tuning a gpt from hf"; }
"$TRAINRUN" export gpt-ft --format hf --dtype fp32 -o hf-gpt2 2> /dev/null || fail "second gpt export"
cmp -s hf-gpt/model.safetensors hf-gpt2/model.safetensors || fail "gpt weights changed on a round trip"

# --- the published configs: recipes/finetune-smollm.lua with SmolLM-135M's
# config.json, and GPT-2 124M's, count the parameters transformers does (plan
# needs no weights)
mkdir -p sm/recipes sm/models/smollm-135m sm/models/gpt2
cp "$TR_SRCDIR/recipes/finetune-smollm.lua" sm/recipes/
cat > sm/models/smollm-135m/config.json <<'EOF'
{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
 "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
 "initializer_range": 0.02, "intermediate_size": 1536, "max_position_embeddings": 2048,
 "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
 "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
 "rope_theta": 10000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
 "transformers_version": "4.40.1", "use_cache": true, "vocab_size": 49152}
EOF
"$TRAINRUN" plan sm/recipes/finetune-smollm.lua > smollm.txt 2>&1 || { cat smollm.txt; fail "plan of finetune-smollm.lua"; }
grep -q "parameters P *134,515,008 " smollm.txt || { cat smollm.txt; fail "SmolLM-135M is not 134,515,008 parameters"; }
cat > sm/models/gpt2/config.json <<'EOF'
{"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
 "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
 "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
 "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
 "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
 "summary_use_proj": true, "vocab_size": 50257}
EOF
sed -e 's|"../models/smollm-135m", ctx = 512|"../models/gpt2"|' -e 's|vocab = 49152|vocab = 50257|' \
  sm/recipes/finetune-smollm.lua > sm/recipes/gpt2.lua
"$TRAINRUN" plan sm/recipes/gpt2.lua > gpt2.txt 2>&1 || { cat gpt2.txt; fail "plan of GPT-2 124M from its config"; }
grep -q "parameters P *124,439,808 " gpt2.txt || { cat gpt2.txt; fail "GPT-2 124M is not 124,439,808 parameters"; }

# --- errors -------------------------------------------------------------------------
# an architecture key that contradicts config.json
if "$TRAINRUN" show ft/ft.lua model.layers=3 > layers.txt 2>&1; then fail "a contradicting model.layers"; fi
grep -q "model.layers is 3, but ft/../hf/config.json says 2 (\"num_hidden_layers\")" layers.txt \
  || { cat layers.txt; fail "contradiction message"; }
# a model_type trainrun does not read
mkdir gemma && cp hf/model.safetensors gemma/ && sed -e 's/"model_type": "llama"/"model_type": "gemma"/' hf/config.json > gemma/config.json
sed -e 's|"../hf"|"../gemma"|' ft/ft.lua > ft/gemma.lua
if "$TRAINRUN" plan ft/gemma.lua > gemma.txt 2>&1; then fail "a gemma config"; fi
grep -q 'ft/gemma.lua:2: model.from: ft/../gemma/config.json: "model_type" is "gemma"; trainrun reads "llama", "mistral", "qwen2" and "gpt2"' gemma.txt \
  || { cat gemma.txt; fail "model_type message"; }
# exports never overwrite a directory of other files
mkdir mine && echo keep > mine/notes.txt
if "$TRAINRUN" export base --format hf -o mine 2> mine.txt; then fail "export into a directory of other files"; fi
grep -q "mine is not empty and is not an earlier trainrun export" mine.txt || { cat mine.txt; fail "non-empty dir message"; }
[ "$(cat mine/notes.txt)" = keep ] && [ ! -e mine/config.json ] || fail "export touched a user's directory"
# an earlier export is replaced, the files added to it kept
echo '{}' > hf/tokenizer.json
"$TRAINRUN" export base --format hf --dtype fp16 -o hf 2> /dev/null || fail "re-export into an earlier export"
grep -q '"torch_dtype": "float16"' hf/config.json && [ -e hf/tokenizer.json ] || fail "re-export"
# a model without a Hugging Face form
cat > mlp.lua <<'EOF'
return {
  model = mlp { inputs = 4, hidden = { 8 }, classes = 3 },
  data = { plugin = "synthetic", kind = "features", features = 4, classes = 3, samples = 64 },
  train = { steps = 1, batch = 4 },
}
EOF
"$TRAINRUN" mlp.lua run_dir=mlp --quiet 2> mlp.txt || { cat mlp.txt; fail "training an mlp"; }
if "$TRAINRUN" export mlp --format hf -o hf-mlp 2> mlpx.txt; then fail "export of an mlp as hf"; fi
grep -q "records no Hugging Face architecture" mlpx.txt || { cat mlpx.txt; fail "mlp export message"; }
[ ! -e hf-mlp ] || fail "a refused export left a directory"
# usage
set +e
"$TRAINRUN" export base --format onnx -o x 2> usage.txt
[ $? -eq 2 ] || fail "an unknown --format is not a usage error"
set -e
grep -q "format takes safetensors" usage.txt || { cat usage.txt; fail "--format message"; }
echo "ok"
