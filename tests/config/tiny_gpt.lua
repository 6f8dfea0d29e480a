-- The GPT of tests/fixtures/tiny_gpt.safetensors (tests/torch/make_fixtures.py).
return {
  model = gpt { vocab = 37, ctx = 8, layers = 2, heads = 2, dim = 16 },
  data = { plugin = "synthetic", kind = "tokens", classes = 37 },
  optimizer = { type = "adamw", lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 0 },
}
