local t = { name = "loop" }
t.self = t
return t
