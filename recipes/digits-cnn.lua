-- A small CNN on the 8x8 handwritten digits that scikit-learn ships
-- (Debian: python3-sklearn), read as recipes/digits-mlp.lua reads them: the
-- csv plugin gives 64 features per sample, which the model takes as one
-- 8x8 image with one channel, x[B,8,8,1].  Two stages of two 3x3
-- convolutions with batch norm (8x8 at 32 channels, then 4x4 at 64 after a
-- 2x2 max pool), global average pooling and a linear head: 65,834
-- parameters.  docs/vision.md explains the ops and what batch norm does
-- in training and in evaluation.
return {
  model = cnn { input = { 8, 8, 1 }, channels = { 32, 64 }, classes = 10 },
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
