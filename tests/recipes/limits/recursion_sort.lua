local function less(a, b)
    table.sort({ 3, 2, 1 }, less)
    return a < b
end
table.sort({ 3, 2, 1 }, less)
return {}
