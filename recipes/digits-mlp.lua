-- An MLP on the 8x8 handwritten digits that scikit-learn ships
-- (Debian: python3-sklearn).  Pixel values 0..16 are scaled to 0..1.
return {
  model = mlp { inputs = 64, hidden = { 128 }, classes = 10 },
  data = {
    plugin = "csv",
    path = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz",
    scale = 0.0625,
    val_fraction = 0.2,
    val_split = "random", -- the file is ordered by writer: validate on a random 20%
  },
  optimizer = { type = "adamw", lr = 2e-3, weight_decay = 0.01 },
  schedule = { plugin = "cosine", warmup = 20 },
  train = { steps = 800, batch = 64, eval_every = 100, eval_batches = 8, log_every = 50 },
}
