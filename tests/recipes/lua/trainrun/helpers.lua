-- A module for `require "trainrun.helpers"` in the tests.
local M = {}

function M.double(x)
    return 2 * x
end

function M.now()
    return os.time()
end

return M
