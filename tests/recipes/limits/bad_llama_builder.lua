-- Shape mistakes in a hand-written builder's Llama-family ops, chosen by
-- model.case: each is reported at the builder's line that made it.
return {
    model = {
        case = "none",
        build = function(nn, spec, batch)
            local g = nn.graph(batch)
            local tokens = g:input("tokens", { batch, 4 }, "i32")
            local targets = g:input("targets", { batch, 4 }, "i32")
            local x = g:embedding(g:param("embed.weight", { 8, 16 }), tokens, "embed")
            local q = g:Linear("q", x, 16, { bias = false })
            local k = g:Linear("k", x, 8, { bias = false })
            local c = spec.case
            if c == "kv_width" then g:gqa_attention(q, k, k, 4, 1, "attn") end
            if c == "kv_heads" then g:gqa_attention(q, k, k, 4, 3, "attn") end
            if c == "rope_odd" then g:rope(q, 16, 10000) end
            if c == "rope_theta" then g:rope(q, 4, -1) end
            if c == "rmsnorm_weight" then g:rmsnorm(x, g:param("w", { 8 })) end
            if c == "swiglu" then g:swiglu(q, k) end
            if c == "scale" then g:scale(x, 1 / 0) end
            local h = g:gqa_attention(g:rope(q, 4, 10000), g:rope(k, 2, 10000), k, 4, 2, "attn")
            local logits = g:Linear("lm_head", g:RMSNorm("norm", h), 8, { bias = false })
            return g:finish { loss = g:cross_entropy(logits, targets), logits = logits }
        end,
    },
}
