-- A complete recipe whose model builder never returns: `trainrun plan`,
-- `--smoke` and runs must stop it.
return {
    model = {
        build = function(nn, spec, batch)
            while true do end
        end,
    },
    data = { plugin = "synthetic", kind = "features", features = 16, classes = 4, samples = 64 },
    train = { steps = 2, batch = 4 },
}
