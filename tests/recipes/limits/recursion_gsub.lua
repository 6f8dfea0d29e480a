-- Recursion through a C library function (the C stack, not the Lua stack).
local function again(s)
    return (string.gsub(s, ".", again))
end
return { name = again("ab") }
