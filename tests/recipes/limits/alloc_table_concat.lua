-- 4 GiB out of a 1 MiB string and one call.
local part = string.rep("z", 2^20)
local big = {}
for i = 1, 4096 do big[i] = part end
return { name = table.concat(big) }
