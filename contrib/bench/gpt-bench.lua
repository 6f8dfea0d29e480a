-- The benchmark recipe of contrib/bench/cpu_gpt.sh: the KJV recipe's GPT and
-- optimizer (base/gpt-char.lua) on synthetic tokens, so no data file is
-- needed and every run sees the same work.  cpu_gpt.sh sets the shape, batch,
-- steps and threads with command-line overrides.
return {
  extends = "../../recipes/base/gpt-char.lua",
  data = { plugin = "synthetic", kind = "tokens", classes = 256 },
  train = {
    steps = 10,
    log_every = 1,      -- one metrics line per step: the timing reads elapsed_s
    eval_every = 0,     -- evaluate only after the last step, outside the timing
    eval_batches = 1,
  },
  -- The only checkpoint is the end-of-run one, which the run waits for anyway:
  -- written synchronously it needs no snapshot of the weights and moments
  -- (12 bytes per parameter), one 4-byte-per-parameter blob at a time.
  checkpoint = { plugin = "local", every = 0, keep = 1, async = false },
}
