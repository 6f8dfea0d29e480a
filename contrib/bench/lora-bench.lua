-- contrib/bench/lora.sh's trainrun side: the full fine-tune of a Llama-shaped
-- model directory given on the command line (model.from=DIR), on uniform
-- random token ids; lora-bench-adapters.lua extends it with the adapters.
return {
  model = { from = "MODEL_DIR", ctx = 256 },
  data = { plugin = "synthetic", kind = "tokens", classes = 49152 },
  optimizer = { type = "adamw", lr = 1e-4, weight_decay = 0.0, clip = 0 },
  train = { batch = 4, steps = 11, log_every = 1, eval_batches = 1, trace_every = 0 },
  checkpoint = { every = 0, keep_best = false },
}
