local base = include "base.lua"
return {
    optim = base.optim,
    steps = 10,
}
