-- Fine-tune SmolLM-135M (a Llama: 30 blocks of width 576, 9 query heads over
-- 3 key/value heads, tied embeddings) from its Hugging Face weights, then
-- export the result for transformers (docs/models.md).
--
--   huggingface-cli download HuggingFaceTB/SmolLM-135M --include "config.json" \
--       "*.safetensors" --local-dir models/smollm-135m
--   trainrun show recipes/finetune-smollm.lua      the model config.json describes
--   trainrun eval recipes/finetune-smollm.lua      validation loss before fine-tuning
--   trainrun recipes/finetune-smollm.lua
--   trainrun export runs/finetune-smollm --format hf -o models/smollm-135m-ft
--
-- `from` is relative to this file: models/ beside recipes/.  The data are
-- shards of token ids from SmolLM's own tokenizer (vocabulary 49,152; any
-- tokenizer that writes TRTOKENS or llm.c shards, docs/data.md).  The
-- optimizer starts fresh; a resumed run takes its checkpoint's weights.
return {
  model = { from = "../models/smollm-135m", ctx = 512 },
  data = { plugin = "tokens", train = "data/smollm/train_*.bin", val = "data/smollm/val_*.bin",
           vocab = 49152 },
  precision = "bf16",
  -- a small learning rate and no weight decay: the weights are already trained
  optimizer = { type = "adamw", lr = 5e-5, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95, clip = 1.0 },
  schedule = { plugin = "cosine", warmup = 50, min_lr_ratio = 0.1 },
  train = { steps = 1000, batch = 32, micro_batch = "auto", eval_every = 100, eval_batches = 20,
            log_every = 10 },
  checkpoint = { every = 200, keep = 2, keep_best = true },
}
