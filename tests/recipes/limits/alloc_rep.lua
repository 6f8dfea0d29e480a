-- One call that asks for a gigabyte.
local s = string.rep("x", 2^30)
return { name = s }
