-- A tiny CNN for the engine tests of batch norm's running statistics
-- (tests/test_engine.c): 4x4 images of 2 channels, two stages of one 3x3
-- convolution with batch norm (3 channels, then 5 after a 2x2 max pool).
return {
  model = cnn { input = { 4, 4, 2 }, channels = { 3, 5 }, convs = 1, classes = 3 },
  data = { plugin = "synthetic", kind = "features", features = 32, classes = 3 },
  optimizer = { type = "adamw", lr = 1e-2 },
}
