-- A tiny valid recipe the core tests start from.
return {
  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64, samples = 512 },
  schedule = { plugin = "cosine", warmup = 2 },
  train = { steps = 4, batch = 4, log_every = 1 },
}
