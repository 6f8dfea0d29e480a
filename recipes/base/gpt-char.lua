-- A small byte-level GPT and how to train it; data comes from the recipe
-- that extends this one:   extends = "base/gpt-char.lua"
return {
  model = gpt { vocab = 256, ctx = 128, layers = 4, heads = 4, dim = 128 },
  optimizer = { type = "adamw", lr = 2e-3, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, clip = 1.0 },
  schedule = { plugin = "cosine", warmup = 100, min_lr_ratio = 0.1 },
  train = {
    steps = 2000,
    batch = 32,
    seed = 1,
    eval_every = 250,
    eval_batches = 16,
    log_every = 50,
  },
  checkpoint = { plugin = "local", every = 500, keep = 3 },
}
