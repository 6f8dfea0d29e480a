-- Base of switch_child.lua: a schedule, a checkpoint and data with options.
return {
    schedule = { plugin = "cosine", warmup = 10, min_lr_ratio = 0.1 },
    checkpoint = { plugin = "local", dir = "ck",
                   every = 7 },
    data = { plugin = "text", path = "a.txt" },
    optim = { lr = 0.5, name = "sgd" },
}
