local base = include "loop_base.lua"
return { train = base }
