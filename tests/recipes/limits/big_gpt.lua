-- A built-in model big enough to pass a small heap limit while being built
-- (no recipe code runs then: the error points at the model line).
return {
    model = gpt { vocab = 256, ctx = 64, layers = 1024, heads = 4, dim = 64 },
}
