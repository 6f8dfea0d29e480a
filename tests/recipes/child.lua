-- Extends base.lua: nested merge, list replace, append, scalar/table swaps.
return {
    extends = "base.lua",
    optim = {
        lr = 1e-3,
        betas = { 0.8, 0.99 },
    },
    data = { files = append { "c.bin" } },
    schedule = "constant",
    seed = { value = 7 },
}
