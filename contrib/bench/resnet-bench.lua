-- The benchmark recipe of contrib/bench/cpu_resnet.sh: ResNet-18 (basic
-- blocks [2,2,2,2], widths 64/128/256/512) with the small stem (one 3x3
-- stride-1 convolution, no max pool), as torch_resnet.py builds it, on
-- synthetic 64x64x3 images (12,288 features per sample, 10 classes), so no
-- data file is needed and every run sees the same work.  SGD with momentum
-- 0.9, as image models train.  cpu_resnet.sh sets batch, steps and threads
-- with command-line overrides.
return {
  model = resnet { depth = 18, width = 64, classes = 10, input = { 64, 64, 3 }, stem = "small" },
  data = { plugin = "synthetic", kind = "features", features = 12288, classes = 10 },
  optimizer = { type = "sgd", lr = 0.05, momentum = 0.9, weight_decay = 5e-4 },
  train = {
    steps = 5,
    batch = 32,
    log_every = 1,      -- one metrics line per step: the timing reads elapsed_s
    eval_every = 0,     -- evaluate only after the last step, outside the timing
    eval_batches = 1,
  },
  checkpoint = { plugin = "local", every = 0, keep = 1, async = false },
}
