local t = setmetatable({}, { __tostring = function(self) return string.format("%s", self) end })
return { name = tostring(t) }
