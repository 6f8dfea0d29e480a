-- trainrun plan on a tiny GPT (tests/test_plan.c): P = V*C + T*C + L*(12*C*C + 13*C) + 2*C
-- = 64*32 + 16*32 + 2*(12*32*32 + 13*32) + 2*32 = 28,032 parameters.
return {
  model = gpt { vocab = 64, ctx = 16, layers = 2, heads = 2, dim = 32 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64 },
  optimizer = { type = "adamw", lr = 1e-3 },
  train = { steps = 1000, batch = 32, micro_batch = 8 },
  cost = { hardware = "h100-80gb", count = 2, price = 2.5, spot_price = 1.5 },
}
