-- GPT-2 small (124 M parameters) on ~10 B tokens of pre-tokenised text, the
-- shape of llm.c's GPT-2 reproduction: 512 sequences of 1024 tokens (524,288
-- tokens) per step, 19,073 steps.  The vocabulary is GPT-2's 50,257 padded to
-- 50,304 (a multiple of 128) for faster GEMMs.
--
--   trainrun plan recipes/gpt2-124m.lua       memory, time and dollars first
--   trainrun plan recipes/gpt2-124m.lua gpus=1 cost.hardware=a100-80gb
--
-- The shards are GPT-2-tokenised uint16 files (llm.c's format or trainrun's
-- own, see `trainrun plugins data`).
return {
  model = gpt { vocab = 50304, ctx = 1024, layers = 12, heads = 12, dim = 768 },
  data = { plugin = "tokens", train = "data/gpt2/train_*.bin", val = "data/gpt2/val_*.bin" },
  precision = "bf16",
  optimizer = { type = "adamw", lr = 6e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, clip = 1.0 },
  schedule = { plugin = "cosine", warmup = 700, min_lr_ratio = 0.1 },
  train = { steps = 19073, batch = 512, micro_batch = 16, eval_every = 250, eval_batches = 20, log_every = 10 },
  checkpoint = { every = 1000, keep = 3 },
  cost = { hardware = "h100-80gb", count = 8, spot = true },
}
