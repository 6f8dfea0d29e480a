-- A tiny Llama (grouped-query attention, untied head) the engine and lever
-- tests run next to tiny_gpt.lua: vocab 37, ctx 8, 2 layers, 4 heads over
-- 2 key/value heads of head dim 4, SwiGLU width 24.
return {
  model = llama { vocab = 37, ctx = 8, layers = 2, heads = 4, kv_heads = 2, dim = 16, ffn_dim = 24 },
  data = { plugin = "synthetic", kind = "tokens", classes = 37, samples = 512 },
  optimizer = { type = "adamw", lr = 1e-2 },
  schedule = { plugin = "cosine", warmup = 2 },
  train = { steps = 4, batch = 4, log_every = 1 },
}
