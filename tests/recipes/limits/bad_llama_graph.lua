-- A valid graph of the Llama-family ops (embedding scale, RMSNorm, rotary
-- embedding, grouped-query attention, SwiGLU) with one defect, chosen by
-- model.case, put in after g:finish the way a hand-written builder could
-- return it: the core must refuse each with a clear message.
local function node_named(g, name)
    for _, n in ipairs(g.nodes) do
        if n.name == name then return n end
    end
    error("no node " .. name)
end

local function tensor_id(g, name)
    for i, t in ipairs(g.tensors) do
        if t.name == name then return i end
    end
    error("no tensor " .. name)
end

local defects = {
    none = function(g) end,
    heads_not_dividing = function(g) node_named(g, "attn").heads = 3 end,
    kv_heads_not_dividing = function(g) node_named(g, "attn").kv_heads = 3 end,
    kv_heads_negative = function(g) node_named(g, "attn").kv_heads = -2 end,
    kv_width = function(g) node_named(g, "attn").kv_heads = 1 end,
    two_inputs = function(g) local n = node_named(g, "attn"); n.inputs = { n.inputs[1], n.inputs[2] } end,
    packed_kv_heads = function(g) node_named(g, "packed").kv_heads = 2 end,
    rope_odd = function(g) node_named(g, "q_rope").heads = 16 end,
    rope_theta_zero = function(g) node_named(g, "q_rope").theta = 0 end,
    rope_theta_inf = function(g) node_named(g, "k_rope").theta = 1 / 0 end,
    rope_theta_string = function(g) node_named(g, "k_rope").theta = "10000" end,
    scale_nan = function(g) node_named(g, "embed_scale").scale = 0 / 0 end,
    scale_huge = function(g) node_named(g, "embed_scale").scale = 1e300 end,
    rmsnorm_weight = function(g) node_named(g, "norm").inputs[2] = tensor_id(g, "k.weight") end,
    rmsnorm_eps = function(g) node_named(g, "norm").eps = -1 end,
    swiglu_shapes = function(g) node_named(g, "act").inputs[2] = tensor_id(g, "q") end,
    swiglu_int = function(g) node_named(g, "act").inputs[2] = tensor_id(g, "targets") end,
}

return {
    model = {
        case = "none",
        build = function(nn, spec, batch)
            local g = nn.graph(batch)
            local tokens = g:input("tokens", { batch, 4 }, "i32")
            local targets = g:input("targets", { batch, 4 }, "i32")
            local embed = g:param("embed.weight", { 8, 16 })
            local x = g:scale(g:embedding(embed, tokens, "embed"), 4, "embed_scale")
            local h = g:RMSNorm("norm", x, 1e-6)
            local q = g:rope(g:Linear("q", h, 16, { bias = false }), 4, 10000, "q_rope")
            local k = g:rope(g:Linear("k", h, 8, { bias = false }), 2, 500000, "k_rope")
            local v = g:Linear("v", h, 8, { bias = false })
            -- the packed form, beside (unused by the loss)
            local qkv = g:Linear("qkv", h, 48, { bias = false })
            g:attention(qkv, 4, "packed")
            h = g:gqa_attention(q, k, v, 4, 2, "attn")
            h = g:swiglu(g:Linear("gate", h, 12), g:Linear("up", h, 12), "act")
            x = g:add(x, g:Linear("down", h, 16), "res")
            local logits = g:Linear("lm_head", x, 8, { bias = false })
            local graph = g:finish { loss = g:cross_entropy(logits, targets), logits = logits }
            defects[spec.case](graph)
            return graph
        end,
    },
}
