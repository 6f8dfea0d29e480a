-- Patterns as recipes use them stay allowed.
local s = ("a b c "):rep(1000)
local words = 0
for _ in s:gmatch("%a+") do words = words + 1 end
local joined = s:gsub("%s+", "_")
local first, second = ("model.layers"):match("^(%w+)%.(%w+)$")
return { words = words, joined = #joined, first = first, second = second,
         found = ("x"):rep(10000):find("xy", 1, true) or 0 }
