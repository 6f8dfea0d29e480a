-- QLoRA of a Llama-3-8B-shaped model: the frozen linears in 4-bit
-- NormalFloat (NF4, double-quantised scales, bitsandbytes' values), rank-16
-- adapters on every linear layer in fp32, bf16 compute, every block
-- recomputed in backward.  Its plan fits one 24 GB card:
--
--   trainrun plan recipes/qlora-llama3-8b.lua                 (cost.hardware = l4-24gb)
--   trainrun plan recipes/qlora-llama3-8b.lua lora.base=bf16 cost.hardware=a100-40gb
--
-- To train it, give the downloaded weights instead of the shape below:
--   model = { from = "../models/llama-3-8b", ctx = 2048, recompute = 1 }
-- (docs/adapters.md: what NF4 stores, how it is checked against bitsandbytes).
return {
  model = llama { vocab = 128256, ctx = 2048, layers = 32, heads = 32, kv_heads = 8, dim = 4096,
                  ffn_dim = 14336, rope_theta = 500000, recompute = 1 },
  data = { plugin = "synthetic", kind = "tokens", classes = 128256 },
  precision = "bf16",
  lora = { rank = 16, alpha = 32, targets = "all-linear", base = "nf4" },
  optimizer = { type = "adamw", lr = 2e-4, weight_decay = 0.0 },
  train = { batch = 16, micro_batch = 1, steps = 1000 },
  cost = { hardware = "l4-24gb" },
}
