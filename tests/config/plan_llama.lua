-- trainrun plan on a tiny Llama with grouped-query attention
-- (tests/test_plan.c): V = 64, T = 16, L = 2, C = 32, H = 4, KV = 2 (D = 8),
-- F = 48.  P = V*C (embed) + L*(2*C (norms) + C*C (q) + 2*C*KV*D (k, v)
-- + C*C (o) + 3*C*F (gate, up, down)) + C (final norm) + V*C (lm_head)
-- = 2048 + 2*(64 + 1024 + 1024 + 1024 + 4608) + 32 + 2048 = 19,616.
return {
  model = llama { vocab = 64, ctx = 16, layers = 2, heads = 4, kv_heads = 2, dim = 32, ffn_dim = 48 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64 },
  optimizer = { type = "adamw", lr = 1e-3 },
  train = { steps = 1000, batch = 32, micro_batch = 8 },
  cost = { hardware = "h100-80gb", count = 2, price = 2.5, spot_price = 1.5 },
}
