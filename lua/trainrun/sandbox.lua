--[[
The recipe sandbox, used by recipe.lua (the loader):

  make_env(ctx, extras)      a fresh environment for a recipe or trainrun.* module: the
                             safe base library, copies of string, table and math, extras
  make_env_mt(host)          its metatable: forbidden names and unknown ones ("did you mean")
                             are errors
  make_protected_calls(host, fatal) pcall and xpcall that cannot swallow a limit being hit
                             or an error that ends the load

Loading this file guards string.find, match, gmatch and gsub in the global
string table against patterns that would backtrack for hours; the loader and
scan.lua keep the unguarded originals in their locals, taken before.
]]

local type, pairs, ipairs, select, tostring = type, pairs, ipairs, select, tostring
local error, pcall, xpcall, setmetatable, getmetatable = error, pcall, xpcall, setmetatable, getmetatable
local find, sub, gmatch, format = string.find, string.sub, string.gmatch, string.format
local concat, sort = table.concat, table.sort
local stderr = io.stderr

-- Lua's pattern matcher backtracks in C, where the instruction limit of
-- recipe code does not reach: ("a"):rep(30000):find(".-.-.-b") would run for
-- hours.  Every start position costs up to one step per pattern item, times
-- the subject's length for each *, +, - and %b (the ways it can backtrack),
-- times two for each ?; a call whose worst case is past PATTERN_WORK steps
-- (about a second) is refused before it starts.  Recipes match short strings
-- (names, paths), far inside this.
local PATTERN_WORK = 5e8

local function skip_set(p, i, len) -- p[i] == "[": the index after its "]"
    local j = i + 1
    if sub(p, j, j) == "^" then
        j = j + 1
    end
    repeat
        if j > len then
            return len + 1
        end
        local c = sub(p, j, j)
        j = j + (c == "%" and 2 or 1)
    until sub(p, j, j) == "]"
    return j + 1
end

local function pattern_work(p, n, anchors, plain)
    local len = #p
    if plain then
        return (n + 1) * (len + 1)
    end
    local i, starts, items, factor = 1, n + 1, 0, 1
    if anchors and sub(p, 1, 1) == "^" then
        i, starts = 2, 1
    end
    while i <= len and factor <= PATTERN_WORK do
        local c = sub(p, i, i)
        if c == "(" or c == ")" then
            i = i + 1
        else
            local single = true
            items = items + 1
            if c == "%" then
                local d = sub(p, i + 1, i + 1)
                if d == "b" then
                    factor, i, single = factor * (n + 1), i + 4, false
                elseif d == "f" then
                    i, single = skip_set(p, i + 2, len), false
                elseif find(d, "^%d$") then -- a back reference compares up to n characters
                    factor, i, single = factor * (n + 1), i + 2, false
                else
                    i = i + 2
                end
            elseif c == "[" then
                i = skip_set(p, i, len)
            else
                i = i + 1
            end
            if single then
                local q = sub(p, i, i)
                if q == "*" or q == "+" or q == "-" then
                    factor, i = factor * (n + 1), i + 1
                elseif q == "?" then
                    factor, i = factor * 2, i + 1
                end
            end
        end
    end
    return starts * (items + 1) * factor
end

local function guard_pattern(name, fn, anchors)
    return function(s, p, ...)
        local ts, tp = type(s), type(p)
        if (ts == "string" or ts == "number") and (tp == "string" or tp == "number") then
            s, p = tostring(s), tostring(p)
            local plain = name == "find" and select(2, ...)
            if pattern_work(p, #s, anchors, plain) > PATTERN_WORK then
                error(format("string.%s: matching %q against a string of %d characters could take hours "
                    .. "(each *, +, - or ? in a pattern can multiply the work by the string's length); "
                    .. "use a simpler pattern or a shorter string", name, #p > 40 and sub(p, 1, 40) .. "..." or p,
                    #s), 2)
            end
        end
        return fn(s, p, ...)
    end
end

-- In the global string table, which is also where ("x"):find(...) looks;
-- this loader keeps the originals in its locals.
string.find = guard_pattern("find", string.find, true)
string.match = guard_pattern("match", string.match, true)
string.gmatch = guard_pattern("gmatch", string.gmatch, false)
string.gsub = guard_pattern("gsub", string.gsub, true)

local SAFE_BASE = { "assert", "error", "ipairs", "next", "pairs", "select", "tonumber", "tostring", "type",
    "unpack", "rawequal", "rawget", "rawset", "setmetatable" }

local FORBIDDEN = {}
for w in gmatch("os io ffi jit debug package load loadstring loadfile dofile collectgarbage module "
    .. "setfenv getfenv newproxy gcinfo coroutine bit _G arg", "%S+") do
    FORBIDDEN[w] = true
end

local function shallow_copy(t)
    local c = {}
    for k, v in pairs(t) do
        c[k] = v
    end
    return c
end

-- pcall/xpcall that cannot swallow a limit being hit (time, memory, C stack),
-- nor an error that ends the load (fatal() returns it: a failed include,
-- whose message may quote another file), and whose xpcall handler never
-- sees either.
local function make_protected_calls(host, fatal)
    fatal = fatal or function() return nil end
    local function check(ok, ...)
        if not ok then
            local f = fatal()
            if f then
                error(f, 0)
            elseif host.stopped() then
                error((...), 0)
            end
        end
        return ok, ...
    end
    local function safe_pcall(f, ...)
        return check(pcall(f, ...))
    end
    local function safe_xpcall(f, handler, ...)
        local h = handler
        if type(handler) == "function" then
            h = function(e)
                if fatal() or host.stopped() then
                    return e
                end
                return handler(e)
            end
        end
        return check(xpcall(f, h, ...))
    end
    return safe_pcall, safe_xpcall
end

local function safe_getmetatable(x)
    -- The string metatable leads to the loader's own string library.
    if type(x) == "string" then
        return nil
    end
    return getmetatable(x)
end

local function sandbox_print(...)
    local parts = {}
    for i = 1, select("#", ...) do
        parts[i] = tostring((select(i, ...)))
    end
    stderr:write(concat(parts, "\t"), "\n")
end

local function make_env(ctx, extras)
    local env = {}
    for _, name in ipairs(SAFE_BASE) do
        env[name] = _G[name]
    end
    env.string = shallow_copy(string)
    env.table = shallow_copy(table)
    env.math = shallow_copy(math)
    env.print = sandbox_print
    env.pcall, env.xpcall = ctx.safe_pcall, ctx.safe_xpcall
    env.getmetatable = safe_getmetatable
    for k, v in pairs(extras) do
        env[k] = v
    end
    return setmetatable(env, ctx.env_mt)
end

local function make_env_mt(host)
    return {
        __metatable = "sandbox",
        __index = function(env, name)
            if type(name) ~= "string" then
                return nil
            end
            if FORBIDDEN[name] then
                error(format("'%s' is not available in recipes (recipes are sandboxed)", name), 2)
            end
            if #name >= 3 then
                local names = {}
                for k in pairs(env) do
                    if type(k) == "string" then
                        names[#names + 1] = k
                    end
                end
                sort(names)
                local guess = host.suggest(name, names)
                if guess then
                    error(format("unknown name '%s' (did you mean '%s'?)", name, guess), 2)
                end
            end
            return nil
        end,
    }
end

return {
    make_env = make_env,
    make_env_mt = make_env_mt,
    make_protected_calls = make_protected_calls,
}
