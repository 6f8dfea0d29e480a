-- contrib/bench/sample.sh's trainrun side: a Llama-shaped model directory
-- given on the command line (model.from=DIR), sampled with token ids (no
-- tokenizer); its context is config.json's, capped at 2048 (the key/value
-- cache holds that many positions).
return {
  model = { from = "MODEL_DIR" },
  data = { plugin = "synthetic", kind = "tokens", classes = 49152 },
}
