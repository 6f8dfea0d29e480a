-- inside the rule: a subdirectory, "../" back into the recipe's own
-- directory, TRAINRUN_RECIPE_PATH and the installed recipes
local part = include "sub/part.lua"
return {
    extends = "team/base.lua",
    steps = part.steps,
    shared = part.shared,
    optim = include "shared/optim.lua",
}
