-- lora-bench.lua with LoRA: rank 16, alpha 32, every linear but the head
-- (PEFT's "all-linear"), the base frozen in the policy's compute dtype.
return {
  extends = "lora-bench.lua",
  lora = { rank = 16, alpha = 32, targets = "all-linear" },
}
