-- Included by loop_include.lua; loops while being included.
local t = {}
repeat t[1] = 1 until false
return t
