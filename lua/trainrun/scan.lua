--[[
Recipe source scanner, used by recipe.lua (the loader) to give every value
of a resolved recipe the file:line where it was written.

  scan_source(src) -> scan         every table field of a source text, with its key path
  lookup_line(scan, path, value)   the line of a key path (suffix match; see below)
  lookup_exact(scan, path)         the line of exactly that path, or nil
  join_path(prefix, name), key_name(k)   the key paths both files speak in: "a.b.1"

This file runs with the loader's full standard library and is no module for
recipes: it reads nothing but the text it is given.
]]

local type, ipairs, select, tostring, tonumber = type, ipairs, select, tostring, tonumber
local find, sub, match, gmatch, format, gsub = string.find, string.sub, string.match, string.gmatch, string.format, string.gsub
local concat, sort = table.concat, table.sort

local function join_path(prefix, name)
    if prefix == "" then
        return name
    end
    return prefix .. "." .. name
end

-- Keys that can appear in a resolved path: strings and list positions.
local function key_name(k)
    if type(k) == "string" then
        return k
    end
    if type(k) == "number" and k >= 1 and k % 1 == 0 then
        return format("%d", k)
    end
    return nil
end

---------------------------------------------------------------------------
-- Source scanner: where each table field was written.
--
-- Lua keeps no line numbers for table constructor fields, so the source is
-- tokenized and every `name =`, `["name"] =` and positional item inside a
-- constructor is recorded with its key path (relative to the outermost
-- constructor) and line.  A constructor that is the value of a field, also
-- when wrapped in a call (`model = gpt { ... }`, `xs = append { ... }`), nests
-- under that field's key.  Top-level assignments `cfg.a.b = v` record "a.b".
--
-- Limits (it is a scanner, not an evaluator):
--  * paths are syntactic: a table built in one place and stored under another
--    key (`local o = { lr = 1 }  return { optim = o }`) records "lr", found
--    only by suffix match when resolving "optim.lr";
--  * when the same suffix is written in several constructors of one file the
--    one whose literal value equals the resolved value wins, else the first;
--  * values computed by code (loops, functions, model builders) have no line
--    of their own and take the line of the enclosing table's key;
--  * computed keys `[expr] =` (other than a literal string or integer) are
--    recorded as "?" and never match.

local KEYWORDS = {}
for w in gmatch("and break do else elseif end false for function goto if in local nil not or repeat return then true until while", "%S+") do
    KEYWORDS[w] = true
end

local function count_newlines(s, i, j)
    local n, p = 0, i
    while true do
        local q = find(s, "\n", p, true)
        if not q or q > j then
            return n
        end
        n, p = n + 1, q + 1
    end
end

-- At pos: "[" "="* "[".  Returns content start, content end, last char of the closing bracket.
local function long_bracket(s, pos)
    local eqs = match(s, "^%[(=*)%[", pos)
    if not eqs then
        return nil
    end
    local open_end = pos + #eqs + 1
    local cs, ce = find(s, "]" .. eqs .. "]", open_end + 1, true)
    if not cs then
        return open_end + 1, #s, #s
    end
    return open_end + 1, cs - 1, ce
end

local function tokenize(s)
    local toks, n = {}, 0
    local pos, line, len = 1, 1, #s
    if sub(s, 1, 1) == "#" then -- shebang line
        pos = find(s, "\n", 1, true) or len + 1
    end
    local function push(t, v, tline, has_value)
        n = n + 1
        toks[n] = { t = t, v = v, line = tline, has_value = has_value }
    end
    while pos <= len do
        local c = sub(s, pos, pos)
        if c == "\n" then
            line, pos = line + 1, pos + 1
        elseif find(c, "^[ \t\r\f\v]") then
            pos = find(s, "[^ \t\r\f\v]", pos) or len + 1
        elseif c == "-" and sub(s, pos + 1, pos + 1) == "-" then
            local _, _, last = long_bracket(s, pos + 2)
            if last then
                line = line + count_newlines(s, pos, last)
                pos = last + 1
            else
                pos = find(s, "\n", pos, true) or len + 1
            end
        elseif c == "[" and find(s, "^%[=*%[", pos) then
            local cs, ce, last = long_bracket(s, pos)
            local content = sub(s, cs, ce)
            content = gsub(content, "^\r?\n", "", 1)
            push("string", content, line, true)
            line = line + count_newlines(s, pos, last)
            pos = last + 1
        elseif c == '"' or c == "'" then
            local start_line, p, escaped = line, pos + 1, false
            local stop = "[\\\n" .. c .. "]"
            while true do
                local q = find(s, stop, p)
                if not q then
                    p = len + 1
                    break
                end
                local ch = sub(s, q, q)
                if ch == "\\" then
                    escaped = true
                    if sub(s, q + 1, q + 1) == "\n" then
                        line = line + 1
                    end
                    p = q + 2
                elseif ch == "\n" then -- only after \z in valid source
                    line, p = line + 1, q + 1
                else
                    p = q
                    break
                end
            end
            push("string", sub(s, pos + 1, p - 1), start_line, not escaped)
            pos = p + 1
        elseif find(c, "^%d") or (c == "." and find(s, "^%.%d", pos)) then
            local e
            if find(s, "^0[xX]", pos) then
                e = select(2, find(s, "^0[xX][%x%.]*", pos))
                e = select(2, find(s, "^[pP][%+%-]?%d+", e + 1)) or e
            else
                e = select(2, find(s, "^%d*%.?%d*", pos))
                e = select(2, find(s, "^[eE][%+%-]?%d+", e + 1)) or e
            end
            e = select(2, find(s, "^[uUlLiI]+", e + 1)) or e
            local v = tonumber(sub(s, pos, e))
            push("number", v, line, v ~= nil)
            pos = e + 1
        elseif find(c, "^[%a_]") then
            local e = select(2, find(s, "^[%a_][%w_]*", pos))
            local w = sub(s, pos, e)
            push(KEYWORDS[w] and w or "name", w, line, false)
            pos = e + 1
        else
            local op = match(s, "^%.%.%.", pos) or match(s, "^[=~<>]=", pos) or match(s, "^%.%.", pos)
                or match(s, "^::", pos) or c
            push(op, nil, line, false)
            pos = pos + #op
        end
    end
    return toks, n
end

-- The literal value written at toks[i] when the whole value is one literal
-- (optionally negated), else nil, false.
local VALUE_ENDS = { [","] = true, [";"] = true, ["}"] = true }
local function literal_at(toks, i, in_ctor)
    local tok, sign = toks[i], 1
    if tok and tok.t == "-" and toks[i + 1] and toks[i + 1].t == "number" then
        tok, sign, i = toks[i + 1], -1, i + 1
    end
    if not tok then
        return nil, false
    end
    local after = toks[i + 1]
    local ends
    if in_ctor then
        ends = after ~= nil and VALUE_ENDS[after.t]
    else
        ends = after == nil or after.t == "name" or (KEYWORDS[after.t] and after.t ~= "and" and after.t ~= "or")
            or after.t == ";"
    end
    if not ends then
        return nil, false
    end
    if tok.t == "number" and tok.has_value then
        return sign * tok.v, true
    elseif tok.t == "string" and tok.has_value and sign == 1 then
        return tok.v, true
    elseif tok.t == "true" and sign == 1 then
        return true, true
    elseif tok.t == "false" and sign == 1 then
        return false, true
    end
    return nil, false
end

local function scan_source(src)
    local toks, n = tokenize(src)
    local records = {}          -- { path, line, literal, has_literal }
    local by_last = {}          -- last path component -> list of records
    local by_path = {}          -- path -> list of records (exact matches without a scan)
    local return_line = nil     -- line of the last top-level `return`

    local function record(path, line, value_index, in_ctor)
        local lit, has = literal_at(toks, value_index, in_ctor)
        local r = { path = path, line = line, literal = lit, has_literal = has }
        records[#records + 1] = r
        local last = match(path, "([^%.]*)$")
        local list = by_last[last]
        if not list then
            list = {}
            by_last[last] = list
        end
        list[#list + 1] = r
        local same = by_path[path]
        if not same then
            same = {}
            by_path[path] = same
        end
        same[#same + 1] = r
    end

    -- Frames: stmt (top level), ctor { }, group ( ) or [ ], func (function ... end).
    local stack = { { kind = "stmt", assign = "" } }
    local function child_prefix(f)
        if f.kind == "ctor" then
            return f.item or f.prefix
        elseif f.kind == "stmt" then
            return f.assign
        end
        return f.prefix
    end

    local i = 1
    while i <= n do
        local tok = toks[i]
        local t = tok.t
        local f = stack[#stack]
        local nxt = toks[i + 1]
        if f.kind == "ctor" and f.at_start then
            if t == "}" then
                stack[#stack] = nil
                i = i + 1
            elseif t == "name" and nxt and nxt.t == "=" then
                f.item = join_path(f.prefix, tok.v)
                record(f.item, tok.line, i + 2, true)
                f.at_start = false
                i = i + 2
            elseif t == "[" and nxt and nxt.has_value and key_name(nxt.v) and toks[i + 2] and toks[i + 2].t == "]"
                and toks[i + 3] and toks[i + 3].t == "=" then
                f.item = join_path(f.prefix, key_name(nxt.v))
                record(f.item, tok.line, i + 4, true)
                f.at_start = false
                i = i + 4
            elseif t == "[" then -- computed key
                f.item = join_path(f.prefix, "?")
                f.at_start = false
                stack[#stack + 1] = { kind = "group", prefix = f.item, close = "]" }
                i = i + 1
            else -- positional item; the token itself is handled next round
                f.npos = f.npos + 1
                f.item = join_path(f.prefix, tostring(f.npos))
                record(f.item, tok.line, i, true)
                f.at_start = false
            end
        else
            if f.kind == "stmt" and t == "[" and f.cand and nxt and nxt.t == "string" and nxt.has_value
                and toks[i + 2] and toks[i + 2].t == "]" then
                f.cand[#f.cand + 1] = nxt.v
                f.cand_line = tok.line
                i = i + 2
            elseif t == "{" then
                stack[#stack + 1] = { kind = "ctor", prefix = child_prefix(f), npos = 0, at_start = true }
            elseif t == "(" or t == "[" then
                stack[#stack + 1] = { kind = "group", prefix = child_prefix(f), close = t == "(" and ")" or "]" }
            elseif t == "function" then
                if f.kind == "func" then
                    f.depth = f.depth + 1
                else
                    stack[#stack + 1] = { kind = "func", prefix = child_prefix(f), depth = 1 }
                end
            elseif f.kind == "func" then
                if t == "if" or t == "do" then
                    f.depth = f.depth + 1
                elseif t == "end" then
                    f.depth = f.depth - 1
                    if f.depth == 0 then
                        stack[#stack] = nil
                    end
                end
            elseif f.kind == "group" then
                if t == f.close then
                    stack[#stack] = nil
                end
            elseif f.kind == "ctor" then
                if t == "}" then
                    stack[#stack] = nil
                elseif t == "," or t == ";" then
                    f.at_start = true
                end
            else -- top-level statements: track `a.b.c =` assignments
                local prev = toks[i - 1]
                if t == "name" then
                    if prev and prev.t == "." and f.cand then
                        f.cand[#f.cand + 1] = tok.v
                        f.cand_line = tok.line
                    elseif prev and prev.t == ":" then
                        f.cand = nil
                    else
                        f.cand = { tok.v }
                        f.cand_line = tok.line
                    end
                elseif t == "." then
                    -- keeps the candidate
                elseif t == "=" then
                    if f.cand and #f.cand > 1 then
                        f.assign = concat(f.cand, ".", 2)
                        record(f.assign, f.cand_line, i + 1, false)
                    elseif f.cand then
                        f.assign = ""
                    end
                    f.cand = nil
                else
                    if t == "return" then
                        return_line = tok.line
                    end
                    if KEYWORDS[t] then
                        f.assign = ""
                    end
                    f.cand = nil
                end
            end
            i = i + 1
        end
    end
    return { records = records, by_last = by_last, by_path = by_path, return_line = return_line }
end

-- Line of `path` in a scanned file: exact path, else the longest recorded
-- path that is a suffix of it; ties go to a record whose literal equals
-- `value`, then to the first written.  nil when nothing matches.
local function lookup_line(scan, path, value)
    -- an exact path is the longest suffix there is: no need to scan (which
    -- made big list recipes quadratic)
    local exact = scan.by_path[path]
    if exact then
        for _, r in ipairs(exact) do
            if r.has_literal and r.literal == value then
                return r.line
            end
        end
        return exact[1].line
    end
    local last = match(path, "([^%.]*)$")
    local list = scan.by_last[last]
    if not list then
        return nil
    end
    local best, best_len, best_match = nil, -1, false
    for _, r in ipairs(list) do
        local rp = r.path
        if rp == path or (#rp < #path and sub(path, -#rp - 1) == "." .. rp) then
            local vmatch = r.has_literal and r.literal == value
            if #rp > best_len or (#rp == best_len and vmatch and not best_match) then
                best, best_len, best_match = r, #rp, vmatch
            end
        end
    end
    return best and best.line
end

local function lookup_exact(scan, path)
    local list = scan.by_last[match(path, "([^%.]*)$")]
    for _, r in ipairs(list or {}) do
        if r.path == path then
            return r.line
        end
    end
    return nil
end

return {
    scan_source = scan_source,
    lookup_line = lookup_line,
    lookup_exact = lookup_exact,
    join_path = join_path,
    key_name = key_name,
}
