-- A buffer an earlier batchnorm holds, given to another: refused with a
-- sentence; the driver then asks again with hostile arguments.
local im = { name = "im", shape = { 2, 6, 6, 3 } }
local c = { name = "c", shape = { 3 }, role = "param" }
local r = { name = "r", shape = { 2, 3 }, role = "buffer", attribute_of = { op = "batchnorm", name = "bn" } }
return "batchnorm", { im, c, c }, { buffer = r, momentum = 0.5 }
