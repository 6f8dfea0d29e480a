#!/bin/sh
# The models transformers saved (tests/fixtures/hf, tests/torch/make_hf_fixtures.py)
# go through a run and out again as a user's would: `model = { from = DIR }`,
# one step at lr 0 (the weights stay as loaded), `trainrun export RUN
# --format hf`, and the export must hold every tensor of DIR/model.safetensors
# with the same name, dtype, shape and bytes, and a config.json with the same
# architecture.  test_hf checks the arithmetic; this checks the way out.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 (standard library only) compares the files"
H="$TR_SRCDIR/tests/fixtures/hf"

# name, the export's --dtype (the fixture's own), extra overrides (GPT-2 keeps
# its 16 positions, so wpe goes out whole)
for spec in "tiny-llama fp32" "tiny-llama-bf16 bf16" "tiny-llama-rope3 fp32" "tiny-qwen2 fp32" "tiny-gpt2 fp32 model.ctx=16"; do
  set -- $spec
  name=$1 dtype=$2
  shift 2
  "$TRAINRUN" "$H/$name.lua" train.steps=1 optimizer.lr=0 run_dir="$name" "$@" --quiet 2> err.txt ||
    { cat err.txt; fail "$name: the run from $H/$name failed"; }
  grep -q "weights from .*$name" err.txt || { cat err.txt; fail "$name: the run did not say where its weights came from"; }
  "$TRAINRUN" export "$name" --format hf --dtype "$dtype" -o "$name-hf" 2> err.txt ||
    { cat err.txt; fail "$name: export --format hf failed"; }
  python3 - "$H/$name" "$name-hf" <<'EOF' || fail "$name: the export differs from the fixture"
import json, struct, sys

def tensors(path):
    with open(path + "/model.safetensors", "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    return {k: (t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]])
            for k, t in header.items()}

fixture, export = sys.argv[1], sys.argv[2]
want, got = tensors(fixture), tensors(export)
bad = []
if sorted(want) != sorted(got):
    bad.append("names: missing %s, extra %s" % (sorted(set(want) - set(got))[:4],
                                                sorted(set(got) - set(want))[:4]))
for k in sorted(set(want) & set(got)):
    if want[k][:2] != got[k][:2]:
        bad.append("%s: %s %s, the fixture's %s %s" % (k, got[k][0], got[k][1], want[k][0], want[k][1]))
    elif want[k][2] != got[k][2]:
        bad.append("%s: the values differ" % k)
arch = ["model_type", "architectures", "vocab_size", "torch_dtype", "tie_word_embeddings",
        # Llama, Qwen2
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
        "rms_norm_eps", "rope_theta", "rope_scaling", "attention_bias", "mlp_bias",
        "use_sliding_window",
        # GPT-2
        "n_embd", "n_layer", "n_head", "n_positions", "n_inner", "activation_function",
        "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
        "reorder_and_upcast_attn"]
cw = json.load(open(fixture + "/config.json"))
cg = json.load(open(export + "/config.json"))
for k in arch:
    if k in cw and (k not in cg or cg[k] != cw[k]):
        bad.append("config.json %s: %r, the fixture's %r" % (k, cg.get(k, "(absent)"), cw[k]))
for b in bad[:8]:
    print(b)
sys.exit(1 if bad else 0)
EOF
done
echo "hf-fixtures: the four fixtures export to their own bytes and architecture"
