-- Catching the memory error does not buy more memory.  (Distinct strings:
-- equal ones are one object.)
local keep = {}
while true do
    local ok = pcall(function() keep[#keep + 1] = string.rep("y", 2^20) .. #keep end)
end
