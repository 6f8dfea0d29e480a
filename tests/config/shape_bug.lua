-- A model with a planted shape bug: the head expects 32 features, gets 16.
return {
  model = {
    build = function(nn, spec, batch)
      local g = nn.graph(batch)
      local x = g:input("features", { batch, 16 })
      local y = g:input("targets", { batch }, "i32")
      local w = g:param("head.weight", { 4, 32 })
      local logits = g:linear(x, w)
      return g:finish { loss = g:cross_entropy(logits, y), logits = logits }
    end,
  },
  data = { plugin = "synthetic", kind = "features", features = 16, classes = 4 },
}
