-- A valid grouped, strided, dilated convolution; the driver asks again with
-- each argument replaced by hostile values.
local im = { name = "im", shape = { 2, 9, 9, 4 } }
local w = { name = "w", shape = { 6, 3, 3, 2 }, role = "param" }
return "conv2d", { im, w, { name = "b", shape = { 6 }, role = "param" } },
    { stride = { 2, 1 }, pad = 1, dilation = { 1, 2 }, groups = 2 }
