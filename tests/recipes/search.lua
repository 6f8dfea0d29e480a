return {
    extends = "team/base.lua",          -- found through TRAINRUN_RECIPE_PATH
    optim = include "shared/optim.lua", -- found in the installed recipes directory
}
