-- LoRA fine-tune of SmolLM2-135M-Instruct on instruction data: the base's
-- weights frozen, rank-16 adapters on every linear layer trained (0.5% of
-- the parameters), as PEFT's LoraConfig(r=16, lora_alpha=32,
-- target_modules="all-linear") does (docs/adapters.md).
--
--   huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct \
--       --include "*.json" "*.safetensors" --local-dir models/smollm2-135m-instruct
--   trainrun prepare sft.jsonl -o data/sft --format instruct \
--       --tokenizer models/smollm2-135m-instruct/tokenizer.json
--   trainrun plan recipes/lora-smollm.lua           trained / frozen parameters, memory
--   trainrun eval recipes/lora-smollm.lua           the base's validation loss (before)
--   trainrun recipes/lora-smollm.lua
--   trainrun eval recipes/lora-smollm.lua --checkpoint runs/lora-smollm   (after)
--   trainrun export runs/lora-smollm --format peft -o adapters/smollm-sft
--   trainrun export runs/lora-smollm --format hf --merge -o models/smollm-sft
--
-- `from` is relative to this file: models/ beside recipes/.  The adapters'
-- checkpoints hold the adapters alone (a few MB) and the base's identity:
-- resuming, evaluating or exporting against another base is refused.
return {
  model = { from = "../models/smollm2-135m-instruct", ctx = 512 },
  data = { plugin = "tokens", train = "data/sft/train_*.bin", val = "data/sft/val_*.bin" },
  lora = { rank = 16, alpha = 32, targets = "all-linear" },
  precision = "bf16",
  -- adapters take a larger rate than full fine-tuning (PEFT's usual 1e-4 to 2e-4)
  optimizer = { type = "adamw", lr = 2e-4, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.999, clip = 1.0 },
  schedule = { plugin = "cosine", warmup = 20, min_lr_ratio = 0.1 },
  train = { steps = 500, batch = 16, micro_batch = "auto", eval_every = 50, eval_batches = 20,
            log_every = 10 },
  checkpoint = { every = 100, keep = 2, keep_best = true },
}
