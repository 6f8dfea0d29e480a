-- Test stand-in for the model builders: each is a global in recipes.
local M = {}

function M.gpt(opts)
    local model = { kind = "gpt", n_layer = 12, n_embd = 768 }
    for k, v in pairs(opts or {}) do
        model[k] = v
    end
    return model
end

-- Fails the way real builders do: a plain message without file:line.
function M.strict(opts)
    if not opts.size then
        error("strict: option 'size' is required", 0)
    end
    return opts
end

return M
