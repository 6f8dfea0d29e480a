local optim = include "nope.lua"
return { optim = optim }
