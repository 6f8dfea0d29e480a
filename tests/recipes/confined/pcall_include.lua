local ok, msg = pcall(include, "../base.lua")
return { seed = 7, stolen = tostring(msg) }
