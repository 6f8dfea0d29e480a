-- The benchmark recipe of contrib/bench/cpu_llama.sh: gpt-bench.lua's data,
-- optimizer, schedule and checkpointing with a Llama in place of the GPT.
-- cpu_llama.sh sets the shape, batch, steps and threads with overrides.
return {
  extends = "gpt-bench.lua",
  model = llama { vocab = 256, ctx = 128, layers = 4, heads = 4, kv_heads = 2, dim = 128,
                  ffn_dim = 400 },
}
