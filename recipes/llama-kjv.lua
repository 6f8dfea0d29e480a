-- A byte-level Llama on the King James Bible, to compare with kjv-char.lua
-- at equal compute: the same data, optimizer, schedule, batch and steps
-- (extended from it), and a model of the same training FLOPs per token
-- (5.86 M against the GPT's 5.84 M; `trainrun plan` shows both): 4 blocks
-- of width 128 with grouped-query attention (4 query heads over 2
-- key/value heads), rotary positions instead of learned ones, RMSNorm, a
-- SwiGLU MLP of width 400 and an untied output head.
--   make data/kjv.txt          (needs Debian's bible-kjv)
--   trainrun recipes/llama-kjv.lua
--   trainrun sample runs/llama-kjv --prompt "In the beginning"
return {
  extends = "kjv-char.lua",
  model = llama { vocab = 256, ctx = 128, layers = 4, heads = 4, kv_heads = 2, dim = 128,
                  ffn_dim = 400 },
}
