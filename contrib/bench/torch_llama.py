#!/usr/bin/env python3
"""A Llama of trainrun's llama{} shape in PyTorch (transformers), timed on the CPU.

The peer of trainrun in contrib/bench/cpu_llama.sh: transformers'
LlamaForCausalLM built from a LlamaConfig (nothing downloaded), eager mode
with attention through scaled_dot_product_attention ("sdpa"), as a PyTorch
user fine-tuning a Llama would run it.  The training step and the timing
are torch_common.py's, shared with torch_gpt.py.

  python3 torch_llama.py --layers 4 --dim 128 --heads 4 --kv-heads 2 --ffn 400 --ctx 128 --batch 32
  python3 torch_llama.py ... --bf16        # torch.autocast("cpu", bfloat16)
"""

import sys

try:
    import torch_common
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    sys.exit("torch_llama.py: PyTorch or transformers is not importable (%s)" % e)


def main():
    ap = torch_common.parser(__doc__)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=400)
    a = ap.parse_args()
    torch_common.setup(a)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.ctx,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, use_cache=False)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    model.train()
    torch_common.train(a, model, lambda m, tokens: m(input_ids=tokens).logits)


if __name__ == "__main__":
    main()
