-- LoRA on instruction data, end to end on this machine: kjv-bpe.lua's GPT,
-- exported in the Hugging Face layout, learns to say where a verse of the
-- Psalms is written ({"prompt": "Where is it written: The LORD is my
-- shepherd; I shall not want.", "response": " Psa23:1"}).  Its pretraining
-- text has every reference before its verse, never after: the skill is the
-- fine-tune's.  The base stays frozen; rank-8 adapters on every linear layer
-- train (docs/adapters.md).  From build/:
--   make data/kjv.txt data/psalms-sft.jsonl
--   ./trainrun prepare data/kjv.txt -o data/kjv-bpe --train-tokenizer 4096 --doc-separator line
--   ./trainrun ../recipes/kjv-bpe.lua
--   ./trainrun export runs/kjv-bpe --format hf -o ../models/kjv-bpe
--   ./trainrun prepare data/psalms-sft.jsonl -o data/psalms-sft --format instruct \
--       --tokenizer data/kjv-bpe/tokenizer.json --eos "<|endoftext|>" --val-fraction 0.1
--   ./trainrun eval ../recipes/lora-psalms.lua                           (before)
--   ./trainrun ../recipes/lora-psalms.lua
--   ./trainrun eval ../recipes/lora-psalms.lua --checkpoint runs/lora-psalms   (after)
--   ./trainrun sample runs/lora-psalms --prompt "Where is it written: Praise ye the LORD."
-- The validation records are the last tenth of the Psalms (whole records):
-- their references were never trained on in this form.  Measured figures:
-- docs/adapters.md.
return {
  model = { from = "../models/kjv-bpe" },
  data = { plugin = "tokens", train = "data/psalms-sft/train_*.bin", val = "data/psalms-sft/val_*.bin" },
  lora = { rank = 8, alpha = 16, targets = "all-linear" },
  -- adapters take a larger rate than full fine-tuning
  optimizer = { type = "adamw", lr = 2e-3, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.999, clip = 1.0 },
  schedule = { plugin = "cosine", warmup = 20, min_lr_ratio = 0.1 },
  train = { steps = 300, batch = 16, seed = 1, eval_every = 50, eval_batches = 4, log_every = 25 },
  checkpoint = { every = 100, keep = 2, keep_best = true },
}
