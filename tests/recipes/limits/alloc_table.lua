local rows = {}
local i = 0
while true do
    i = i + 1
    rows[i] = { i, i }
end
