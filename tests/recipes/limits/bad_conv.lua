-- A valid convolutional graph from trainrun.nn with one defect, chosen by
-- model.case, put in after g:finish the way a hand-written builder could
-- return it.  Node 1 is the conv2d, 2 the batchnorm, 3 the maxpool.
local defects = {
    none = function(g) end,
    stride_zero = function(g) g.nodes[1].stride = 0 end,
    stride_fraction = function(g) g.nodes[1].stride = { 1, 1.5 } end,
    stride_triple = function(g) g.nodes[1].stride = { 1, 1, 1 } end,
    pad_negative = function(g) g.nodes[1].pad = -1 end,
    dilation_huge = function(g) g.nodes[1].dilation = 2^40 end,
    groups_zero = function(g) g.nodes[1].groups = 0 end,
    groups_not_dividing = function(g) g.nodes[1].groups = 3 end,
    window_too_big = function(g) g.nodes[1].dilation = 5 end,
    kernel_not_weight = function(g) g.nodes[1].kernel = 5 end,
    momentum_zero = function(g) g.nodes[2].momentum = 0 end,
    momentum_big = function(g) g.nodes[2].momentum = 1.5 end,
    buffer_missing = function(g) g.nodes[2].buffer = nil end,
    buffer_not_buffer = function(g) g.nodes[2].buffer = 1 end,
    buffer_past_end = function(g) g.nodes[2].buffer = 2^31 end,
    buffer_shape = function(g) g.tensors[g.nodes[2].buffer].shape = { 4 } end,
    buffer_as_input = function(g) g.nodes[3].inputs[1] = g.nodes[2].buffer end,
    buffer_shared = function(g) g.nodes[5].buffer = g.nodes[2].buffer end,
    pool_pad = function(g) g.nodes[3].pad = 2 end,
    pool_no_kernel = function(g) g.nodes[3].kernel = nil; g.nodes[3].stride = nil end,
    image_flat = function(g) g.tensors[1].shape = { 4, 36 }; g.tensors[1].shape[3] = nil end,
}

return {
    model = {
        case = "none",
        build = function(nn, spec, batch)
            local g = nn.graph(batch)
            local x = g:input("images", { batch, 6, 6, 2 })
            local y = g:input("targets", { batch }, "i32")
            x = g:BatchNorm("bn", g:Conv2d("conv", x, 4, 3, { pad = 1, bias = false }))
            x = g:maxpool(x, 2, nil, "pool")
            x = g:BatchNorm("bn2", g:relu(x, "relu"))
            local logits = g:Linear("head", g:global_avgpool(x, "gap"), 3)
            local graph = g:finish { loss = g:cross_entropy(logits, y), logits = logits }
            defects[spec.case](graph)
            return graph
        end,
    },
}
