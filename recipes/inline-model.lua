-- A model written inline from the ops trainrun provides (see trainrun.nn):
-- a two-layer GELU network on synthetic features, with a residual branch.
return {
  model = {
    width = 32,
    build = function(nn, spec, batch)
      local g = nn.graph(batch)
      local x = g:input("features", { batch, 16 })
      local y = g:input("targets", { batch }, "i32")
      local h = g:gelu(g:Linear("fc1", x, spec.width))
      h = g:add(h, g:gelu(g:Linear("fc2", h, spec.width)))
      local logits = g:Linear("head", g:LayerNorm("norm", h), 4)
      return g:finish { loss = g:cross_entropy(logits, y), logits = logits }
    end,
  },
  data = { plugin = "synthetic", kind = "features", features = 16, classes = 4, samples = 4096 },
  optimizer = { lr = 1e-2 },
  train = { steps = 200, batch = 32, eval_every = 100, log_every = 50 },
}
