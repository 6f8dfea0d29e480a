-- Base recipe for the tests.
return {
    model = gpt { n_layer = 2, n_embd = 64 },
    optim = {
        name = "adamw",
        lr = 3e-4,
        betas = { 0.9, 0.95 },
    },
    schedule = { warmup = 100, decay = "cosine" },
    data = { files = { "a.bin", "b.bin" } },
    seed = 1,
}
