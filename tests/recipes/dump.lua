return {
    name = "tiny",
    lr = 3e-4,
    steps = 1000,
    layers = { 64, 32 },
    flags = { fast = true },
    build = function() return 1 end,
    empty = {},
}
