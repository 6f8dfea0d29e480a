-- kjv-char.lua's GPT, optimizer, schedule, batch and steps on byte-level BPE tokens of the
-- King James Bible: a tokenizer of 4096 tokens trained on the training verses by `trainrun
-- prepare` itself (what the tokenizers library's BpeTrainer would make from them).  Compare
-- the validation loss in nats per byte (the log and metrics.jsonl's val_loss_per_byte):
-- nats per token are not comparable across tokenizers, a BPE token holding about 4 bytes.
--   make data/kjv.txt          (needs Debian's bible-kjv: bible -f "Gen1:1-Rev22:21")
--   trainrun prepare data/kjv.txt -o data/kjv-bpe --train-tokenizer 4096 --doc-separator line
--   trainrun recipes/kjv-bpe.lua
--   trainrun sample runs/kjv-bpe --prompt "In the beginning"
-- Each verse is a document followed by <|endoftext|> (id 0); the last 5% of the text's bytes,
-- whole verses, validate, as kjv-char.lua's data.val_fraction = 0.05 does.  The model's
-- vocabulary must be the tokenizer's (the tokens plugin refuses shards with larger ids).
return {
  extends = "base/gpt-char.lua",
  model = gpt { vocab = 4096, ctx = 128, layers = 4, heads = 4, dim = 128 },
  data = { plugin = "tokens", train = "data/kjv-bpe/train_*.bin", val = "data/kjv-bpe/val_*.bin" },
}
