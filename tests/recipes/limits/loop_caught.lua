-- A loop that catches every error it can: the limit still ends it.
local n = 0
while true do
    pcall(function() while true do n = n + 1 end end)
end
