-- Fine-tuning from a Hugging Face directory, end to end on this machine: the
-- Llama of llama-kjv.lua, exported in the Hugging Face layout, fine-tuned on
-- the Psalms alone.  The same steps fine-tune a downloaded model
-- (finetune-smollm.lua, docs/models.md).  From build/:
--   ./trainrun ../recipes/llama-kjv.lua
--   ./trainrun export runs/llama-kjv --format hf -o ../models/llama-kjv
--   make data/psalms.txt
--   ./trainrun eval ../recipes/finetune-psalms.lua     (before: the pretrained weights)
--   ./trainrun ../recipes/finetune-psalms.lua
--   ./trainrun sample runs/finetune-psalms --prompt "The LORD is my shepherd"
-- `from` is relative to this file (models/ beside recipes/); give
-- model.from=DIR on the command line for a directory elsewhere.
return {
  model = { from = "../models/llama-kjv" },
  data = { plugin = "text", path = "data/psalms.txt", val_fraction = 0.1 },
  -- the weights are trained: a tenth of the pretraining rate, a short warm-up
  -- and no weight decay; the optimizer starts fresh.  150 steps: the Psalms
  -- are small (245 kB), and longer runs overfit them (docs/results.md)
  optimizer = { type = "adamw", lr = 2e-4, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95, clip = 1.0 },
  schedule = { plugin = "cosine", warmup = 20, min_lr_ratio = 0.1 },
  train = { steps = 150, batch = 32, seed = 1, eval_every = 25, eval_batches = 16, log_every = 25 },
  checkpoint = { plugin = "local", every = 50, keep = 2 },
}
