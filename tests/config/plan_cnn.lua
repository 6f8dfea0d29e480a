-- trainrun plan on a small CNN (tests/test_plan.c): 6x6 images of 2 channels,
-- stages of 4 and 8 channels (two 3x3 convolutions each, a 2x2 max pool
-- between), global average pooling, a head of 5 classes.
return {
  model = cnn { input = { 6, 6, 2 }, channels = { 4, 8 }, classes = 5 },
  data = { plugin = "synthetic", kind = "features", features = 72, classes = 5 },
  optimizer = { type = "adamw", lr = 1e-3 },
  train = { steps = 100, batch = 16, micro_batch = 8 },
}
