-- contrib/bench/shard.sh's model: a Llama of 27.3 M parameters (vocab 4096,
-- 8 layers x 512, untied head) on uniform random tokens, small batches, so
-- that parameters, gradients and AdamW's two state slots (437 MB together
-- in fp32) are most of each rank's memory and a shard level shows in it.
return {
  model = llama { vocab = 4096, ctx = 64, layers = 8, heads = 8, kv_heads = 4, dim = 512,
                  ffn_dim = 1376 },
  data = { plugin = "synthetic", kind = "tokens", classes = 4096 },
  optimizer = { type = "adamw", lr = 1e-4, clip = 1.0 },
  train = { steps = 6, batch = 4, micro_batch = 1, log_every = 1, eval_batches = 1, threads = 1 },
  checkpoint = { every = 0, keep_best = false },
  -- units of 2 MiB (about 55 over the model): at the default 25 MiB the
  -- model is five units, and shard = "parameters", which holds the units
  -- the current and the next node read, would hold most of it at once
  parallel = { bucket_mb = 2 },
}
