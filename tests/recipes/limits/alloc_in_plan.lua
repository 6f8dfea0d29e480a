-- A complete recipe whose model builder allocates without end.
return {
    model = {
        build = function(nn, spec, batch)
            local s = "x"
            while true do s = s .. s end
        end,
    },
    data = { plugin = "synthetic", kind = "features", features = 16, classes = 4, samples = 64 },
    train = { steps = 2, batch = 4 },
}
