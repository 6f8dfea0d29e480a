local optim = {
    lr = 0.5,
}
local cfg = {
    optim = optim,
    model = gpt { n_layer = 4 },
}
cfg.steps = 100
return cfg
