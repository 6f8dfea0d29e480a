-- trainrun.nn refuses the value; the error names this line, not nn.lua.
return {
    model = {
        build = function(nn, spec, batch)
            local g = nn.graph(-batch)
            return g
        end,
    },
}
