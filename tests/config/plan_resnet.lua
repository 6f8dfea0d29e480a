-- trainrun plan on torchvision's ResNet at 224x224 (tests/test_plan.c).
return {
  model = resnet { depth = 18, classes = 1000 },
  data = { plugin = "synthetic", kind = "features", features = 150528, classes = 1000 },
  optimizer = { type = "sgd", lr = 0.1, momentum = 0.9 },
  train = { steps = 100, batch = 1 },
}
