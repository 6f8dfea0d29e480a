local s = string.rep("a", 30000)
return { name = tostring(s:find(".-.-.-b")) }
