-- A valid graph from trainrun.nn with one defect, chosen by model.case, put
-- in after g:finish the way a hand-written builder could return it.
local defects = {
    none = function(g) end,
    loss_past_end = function(g) g.loss = 2^31 end,
    loss_fraction = function(g) g.loss = 1.5 end,
    logits_huge = function(g) g.logits = 2^62 end,
    input_zero = function(g) g.nodes[1].inputs[1] = 0 end,
    input_negative = function(g) g.nodes[1].inputs[2] = -1 end,
    output_past_end = function(g) g.nodes[1].output = 2^32 + 1 end,
    too_many_inputs = function(g) g.nodes[1].inputs = { 1, 3, 4, 1 } end,
    dim_zero = function(g) g.tensors[1].shape[2] = 0 end,
    dim_negative = function(g) g.tensors[1].shape[2] = -16 end,
    dim_huge = function(g) g.tensors[3].shape = { 2^62, 16 } end,
    dims_overflow = function(g) g.tensors[3].shape = { 2^31 - 1, 2^31 - 1, 2^31 - 1, 2^31 - 1 } end,
    shape_string = function(g) g.tensors[1].shape = "abcd" end,
    role_unknown = function(g) g.tensors[1].role = "weights" end,
    same_name = function(g) g.tensors[4].name = g.tensors[3].name end,
    feeds_param = function(g) g.inputs[1] = 3 end,
    three_inputs = function(g) g.inputs[3] = 1 end,
    tensors_missing = function(g) g.tensors = nil end,
    node_not_table = function(g) g.nodes[1] = 7 end,
    heads_huge = function(g) g.nodes[1].heads = 2^40 end,
    eps_nan = function(g) g.nodes[1].eps = 0 / 0 end,
    -- read raw: a metamethod of the result never runs (it would loop)
    metatable = function(g)
        g.logits = nil
        setmetatable(g, { __index = function() while true do end end })
    end,
}

return {
    model = {
        case = "none",
        build = function(nn, spec, batch)
            local g = nn.graph(batch)
            local x = g:input("features", { batch, 16 })
            local y = g:input("targets", { batch }, "i32")
            local logits = g:Linear("head", x, 4)
            local graph = g:finish { loss = g:cross_entropy(logits, y), logits = logits }
            defects[spec.case](graph)
            return graph
        end,
    },
}
