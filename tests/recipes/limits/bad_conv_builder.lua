-- Mistakes in a hand-written builder's convolutional ops, chosen by
-- model.case: each is reported at the builder's line that made it.
return {
    model = {
        case = "none",
        build = function(nn, spec, batch)
            local g = nn.graph(batch)
            local x = g:input("images", { batch, 6, 6, 2 })
            local y = g:input("targets", { batch }, "i32")
            local w = g:param("w", { 4, 3, 3, 2 })
            local c = spec.case
            if c == "window" then g:conv2d(x, g:param("big", { 4, 7, 7, 2 }), nil, {}) end
            if c == "groups" then g:conv2d(x, w, nil, { groups = 2 }) end
            if c == "stride" then g:conv2d(x, w, nil, { stride = { 1, 0 } }) end
            if c == "flat" then g:maxpool(g:input("flat", { batch, 36 }), 2) end
            if c == "pool_pad" then g:avgpool(x, 3, { pad = 2 }) end
            if c == "running" then g:batchnorm(x, g:param("s", { 2 }), g:param("t", { 2 }), g:param("r", { 2, 2 })) end
            if c == "momentum" then g:BatchNorm("bn0", x, { momentum = 0 }) end
            x = g:relu(g:BatchNorm("bn", g:conv2d(x, w, nil, { pad = 1 }, "conv")), "relu")
            x = g:avgpool(g:maxpool(x, 2, nil, "max"), 3, { stride = 1, pad = 1 }, "avg")
            local logits = g:Linear("head", g:global_avgpool(x, "gap"), 3)
            return g:finish { loss = g:cross_entropy(logits, y), logits = logits }
        end,
    },
}
