return {
    extends = "child.lua",
    optim = { weight_decay = 0.1 },
    steps = 1000,
}
