--[[
Recipe loader, driven by core/config/recipe.c.  One file a little past 700
lines: the sandbox, extends/include, the deep merge and the overrides act on
the same environment and origins table, and a recipe's trust depends on all
of them being read together.

  M.load(host, cfg) -> resolved_table, origins, require_for_host

host: primitives from C that plain Lua lacks
  host.load_text(src, name)  compile source text only (never bytecode), chunk name "@name"
  host.realpath(path)        canonical path or nil (to detect cycles)
  host.is_file(path)         true for an existing regular file
  host.read_source(path, max)  the text of a regular file of at most max bytes, or nil, message
  host.suggest(word, list)   closest candidate or nil ("did you mean")
  host.stopped()             true once recipe code hit a limit (time, memory, C stack)
  host.locate(msg)           error handler: gives errors raised in trainrun's own Lua
                             library, and stack overflows, the file:line of the recipe
  host.op_shape(op, inputs, attrs)  the op table's check of one node: its output shape, or
                             nil and the rule's sentence (core/config/recipe_ops.h); pure, so
                             recipes and trainrun.* modules get it as require "trainrun.ops"
cfg: { path, overrides = {"k.s=v", ...}, lua_dir, extra_lua_dir, recipe_dir, recipe_path }

origins[t][k] = { file, line, cli, text } for every key of every table in the result;
core/config/recipe.c copies it into the C tree.  switches: a list of { slot, from, to,
to_where, keys }, each a plugin slot a child recipe or slot.plugin=NAME gave another
plugin than its base, with the base's keys there that were the old plugin's options;
the host drops those the new plugin does not take, with a note.

This file runs with the full standard library; recipes and trainrun.* modules run in
sandbox environments built here and never see it.
]]

local M = {}

local type, pairs, ipairs, next, tostring, tonumber, select = type, pairs, ipairs, next, tostring, tonumber, select
local error, pcall, xpcall, rawget, setfenv, unpack = error, pcall, xpcall, rawget, setfenv, unpack
local setmetatable, getmetatable = setmetatable, getmetatable
local debug_getmetatable, debug_setmetatable, debug_getinfo = debug.getmetatable, debug.setmetatable, debug.getinfo
local find, sub, match, gmatch, format, gsub = string.find, string.sub, string.match, string.gmatch, string.format, string.gsub
local concat, sort = table.concat, table.sort
local stderr = io.stderr

---------------------------------------------------------------------------
-- Small helpers

local function pack(...)
    return { n = select("#", ...), ... }
end

local function where(file, line)
    if line and line > 0 then
        return file .. ":" .. line .. ": "
    end
    return file .. ": "
end

local function dirname(path)
    return match(path, "^(.*)/[^/]*$") or ""
end

local function join(dir, name)
    if dir == "" then
        return name
    end
    return dir .. "/" .. name
end

-- n if the keys of t are exactly 1..n (n may be 0), else nil.
local function list_length(t)
    local n = 0
    for k in pairs(t) do
        if type(k) ~= "number" then
            return nil
        end
        n = n + 1
    end
    for i = 1, n do
        if rawget(t, i) == nil then
            return nil
        end
    end
    return n
end

local function is_nonempty_list(t)
    local n = list_length(t)
    return n ~= nil and n > 0
end

-- Recipes are configurations: a bigger file is a mistake (or a data file
-- named by accident), and reading it would only run into the memory limit.
local MAX_SOURCE = 4 * 1024 * 1024

-- The host reads it (a regular file only: a FIFO named by mistake would
-- block io.open forever, a directory reads as nonsense).
local function read_source(ctx, path)
    return ctx.host.read_source(path, MAX_SOURCE)
end

---------------------------------------------------------------------------
-- Source scanner (scan.lua, beside this file): where each table field was
-- written, and the key paths (a.b.1) it records them under.

-- A part of the loader kept in its own file beside this one.
local function load_part(name)
    local path = (match(debug_getinfo(1, "S").source, "^@(.*)/[^/]*$") or ".") .. "/" .. name
    local chunk, msg = loadfile(path, "t")
    if not chunk then
        error("cannot load the recipe loader's " .. name .. ": " .. tostring(msg), 0)
    end
    return chunk()
end

local scan = load_part("scan.lua")
local scan_source, lookup_line, lookup_exact = scan.scan_source, scan.lookup_line, scan.lookup_exact
local join_path, key_name = scan.join_path, scan.key_name

M.scan_source = scan_source
M.lookup_line = lookup_line

---------------------------------------------------------------------------
-- Sandbox (sandbox.lua, beside this file): the environment recipes and
-- trainrun.* modules run in, and the guard on string patterns.  Loaded after
-- the locals above took the string library's unguarded functions.

local sandbox = load_part("sandbox.lua")
local make_env, make_env_mt, make_protected_calls = sandbox.make_env, sandbox.make_env_mt,
    sandbox.make_protected_calls

---------------------------------------------------------------------------
-- require "trainrun.x": text-only, sandboxed, cached per load

local function module_candidates(ctx, name)
    local rel = gsub(name, "%.", "/") .. ".lua"
    local list = {}
    for _, dir in ipairs(ctx.lua_dirs) do
        list[#list + 1] = join(dir, rel)
    end
    return list
end

local LOADING = {}

local function load_module(ctx, name)
    local cached = ctx.modules[name]
    if cached == LOADING then
        error(format('require "%s": modules require each other in a cycle', name), 0)
    elseif cached ~= nil then
        return cached
    end
    local candidates = module_candidates(ctx, name)
    local path
    for _, p in ipairs(candidates) do
        if ctx.host.is_file(p) then
            path = p
            break
        end
    end
    if not path then
        return nil, format('require "%s": not found (searched: %s)', name, concat(candidates, ", "))
    end
    local src, msg = read_source(ctx, path)
    if not src then
        error(msg, 0)
    end
    local fn, lmsg = ctx.host.load_text(src, path)
    if not fn then
        error(lmsg, 0)
    end
    setfenv(fn, make_env(ctx, { require = ctx.require }))
    ctx.modules[name] = LOADING
    local ok, result = xpcall(fn, ctx.host.locate, name)
    if not ok then
        ctx.modules[name] = nil
        error(result, 0)
    end
    if result == nil then
        result = true
    end
    ctx.modules[name] = result
    return result
end

local function make_require(ctx)
    return function(name)
        if type(name) ~= "string" or not find(name, "^trainrun%.[%w_]+[%w_%.]*$") or find(name, "%.%.") then
            error(format('require "%s": only trainrun.* modules are available in recipes (recipes are sandboxed)',
                tostring(name)), 2)
        end
        local result, msg = load_module(ctx, name)
        if result == nil then
            error(msg, 2)
        end
        return result
    end
end

---------------------------------------------------------------------------
-- Origins, copies and merging

-- Give every (table, key) reachable from t a file:line in `file`, unless it
-- already has one from an included recipe and still holds the same value.
-- As deep as core/config/recipe.c converts; deeper is a mistake, not a config, and
-- the loader's own recursion must end before the Lua stack does.
local MAX_DEPTH = 200

local function attribute(ctx, t, file, scan, prefix, seen, depth)
    if seen[t] then
        return
    end
    depth = depth or 0
    if depth >= MAX_DEPTH then
        error(format('%s"%s" is nested too deeply (more than %d levels)', where(file, lookup_line(scan, prefix)),
            #prefix > 60 and sub(prefix, 1, 60) .. "..." or prefix, MAX_DEPTH), 0)
    end
    seen[t] = true
    local O = ctx.origins
    local ot = O[t]
    if not ot then
        ot = {}
        O[t] = ot
    end
    local keep = ctx.resolved[t]
    for k, v in pairs(t) do
        local name = key_name(k)
        if name then
            local path = join_path(prefix, name)
            local o = ot[k]
            if not (keep and o and (type(v) == "table" or o.value == v)) then
                ot[k] = { file = file, line = lookup_line(scan, path, v), value = v }
            end
            if type(v) == "table" then
                attribute(ctx, v, file, scan, path, seen, depth + 1)
            end
        end
    end
end

-- Deep copy carrying origins along; cycles are kept as cycles (reported
-- when converting), shared subtables become separate copies.
local function copy(ctx, v, active)
    if type(v) ~= "table" then
        return v
    end
    active = active or {}
    if active[v] then
        return active[v]
    end
    local r = {}
    active[v] = r
    ctx.resolved[r] = true
    local ov, orr = ctx.origins[v], {}
    ctx.origins[r] = orr
    for k, x in pairs(v) do
        r[k] = copy(ctx, x, active)
        if ov then
            orr[k] = ov[k]
        end
    end
    active[v] = nil
    local mt = debug_getmetatable(v)
    if mt then
        debug_setmetatable(r, mt)
    end
    return r
end

-- Does child table c merge key by key into base table b (instead of replacing it)?
local function merges_into(b, c)
    if is_nonempty_list(c) then
        return false -- lists replace
    end
    if next(c) == nil then
        return not is_nonempty_list(b) -- {} keeps a base map, empties a base list
    end
    return not is_nonempty_list(b) -- a map replaces a list
end

-- A plugin slot (data, schedule, checkpoint, ...) whose child table names
-- another plugin than its base table did: the base's keys there were the
-- old plugin's options.  Which of them the new plugin also takes only its
-- schema says, so they are listed here (ctx.switches) and the host drops
-- the others with a note (core/config/run_config.c); `plugin`, the slot's
-- core keys (checkpoint.every, ...) and the keys in `keep` (set again
-- beside the new plugin's name, so checked against it) are not listed.
-- A base that names no plugin keeps its keys (they may be the default's).
local function note_plugin_switch(ctx, name, b, to, to_where, keep)
    local core = ctx.plugin_slots[name]
    local from = rawget(b, "plugin")
    if not core or type(from) ~= "string" or type(to) ~= "string" or from == to then
        return
    end
    local keys = {}
    for k in pairs(b) do
        if type(k) == "string" and k ~= "plugin" and not core[k] and rawget(keep, k) == nil then
            keys[#keys + 1] = k
        end
    end
    sort(keys)
    ctx.switches[#ctx.switches + 1] = { slot = name, from = from, to = to, to_where = to_where,
        keys = keys }
end

-- Merge raw child table c over b (a fresh resolved table), in place.
local function merge_into(ctx, b, c, path, at_root)
    local O = ctx.origins
    local ob, oc = O[b], O[c] or {}
    for k, v in pairs(c) do
        if not (at_root and k == "extends") then
            local bv = b[k]
            local name = key_name(k) or tostring(k)
            if ctx.appended[v] then
                if bv == nil then
                    b[k] = copy(ctx, v)
                elseif type(bv) == "table" and list_length(bv) then
                    local n, obv, ov = #bv, O[bv], O[v] or {}
                    for i = 1, #v do
                        bv[n + i] = copy(ctx, v[i])
                        obv[n + i] = ov[i]
                    end
                else
                    local o = oc[k] or {}
                    error(format('%sappend{...} for "%s": the value it extends is a %s, not a list',
                        where(o.file or "?", o.line), join_path(path, name), type(bv)), 0)
                end
            elseif type(v) == "table" and type(bv) == "table" and merges_into(bv, v) then
                if at_root then
                    local oc_k = oc[k] or {}
                    local to_at = oc_k.file and gsub(where(oc_k.file, oc_k.line), ": $", "") or "the recipe"
                    note_plugin_switch(ctx, k, bv, rawget(v, "plugin"), to_at, v)
                end
                merge_into(ctx, bv, v, join_path(path, name), false)
            else
                b[k] = copy(ctx, v)
            end
            ob[k] = oc[k]
        end
    end
    local mt = debug_getmetatable(c)
    if mt then
        debug_setmetatable(b, mt)
    end
end

---------------------------------------------------------------------------
-- Resolving a recipe file

-- Where extends and include may read: the directory of the recipe named on
-- the command line and below it, the TRAINRUN_RECIPE_PATH directories and the
-- installed recipes, each compared by its real path (so neither "../" nor a
-- symbolic link leaves them).  A shared recipe is data: it may not read
-- /etc/shadow or ~/.netrc, even to put a parse error's quoted token into a
-- value.  Is real (a canonical path) inside one of them?
local function inside_roots(ctx, real)
    for _, r in ipairs(ctx.roots) do
        if r == "/" or real == r or sub(real, 1, #r + 1) == r .. "/" then
            return true
        end
    end
    return false
end

-- The first of the candidates that exists: its path, or nil and the
-- directories searched, or nil, nil and the path when it lies outside the
-- directories recipes may read.
local function find_recipe(ctx, name, from_dir)
    local dirs, seen = {}, {}
    local function add(d)
        if d and not seen[d] then
            seen[d] = true
            dirs[#dirs + 1] = d
        end
    end
    if sub(name, 1, 1) == "/" then
        add("")
    else
        add(from_dir)
        for _, d in ipairs(ctx.search_dirs) do
            add(d)
        end
    end
    local shown = {}
    for i, d in ipairs(dirs) do
        local p = join(d, name)
        if ctx.host.is_file(p) then
            local real = ctx.host.realpath(p)
            if real and inside_roots(ctx, real) then
                return p
            end
            return nil, nil, p
        end
        shown[i] = d == "" and (sub(name, 1, 1) == "/" and name or ".") or d
    end
    return nil, shown
end

-- The error of an extends or include whose file was not found or lies outside.
local function not_found(ctx, at, how, name, searched, outside)
    if outside then
        return format('%s%s "%s": %s is outside the directories a recipe may read (%s, and below them); '
            .. 'copy it beside the recipe you run, or add its directory to TRAINRUN_RECIPE_PATH', at, how,
            name, outside, concat(ctx.root_names, ", "))
    end
    return format('%s%s "%s": not found (searched: %s)', at, how, name, concat(searched, ", "))
end

local resolve

local function check_cycle(ctx, path, how, from)
    local real = ctx.host.realpath(path) or path
    for i, s in ipairs(ctx.stack) do
        if s.real == real then
            local chain = {}
            for j = i, #ctx.stack do
                chain[#chain + 1] = ctx.stack[j].display
            end
            chain[#chain + 1] = path
            error(format("%s%s cycle: %s", where(from.file, from.line), how, concat(chain, " -> ")), 0)
        end
    end
    return real
end

-- include's errors end the load: recipe code cannot catch them with pcall
-- (the sandbox's pcall passes ctx.fatal on), so no message about another
-- file -- a parse error quotes its text -- reaches a value of the recipe.
local function make_include(ctx, file)
    local function include(name, from)
        if type(name) ~= "string" then
            error(format("%sinclude expects a recipe path (a string), got %s", where(from.file, from.line),
                type(name)), 0)
        end
        local found, searched, outside = find_recipe(ctx, name, dirname(file))
        if not found then
            error(not_found(ctx, where(from.file, from.line), "include", name, searched, outside), 0)
        end
        return resolve(ctx, found, "include", from)
    end
    return function(name)
        -- the recipe's line (past the pcall that called include, if any)
        local line, source = 0, "@" .. file
        for level = 2, 10 do
            local info = debug_getinfo(level, "Sl")
            if not info then
                break
            elseif info.source == source and info.currentline and info.currentline > 0 then
                line = info.currentline
                break
            end
        end
        local from = { file = file, line = line }
        local r = pack(pcall(include, name, from))
        if not r[1] then
            ctx.fatal = ctx.fatal or r[2]
            error(r[2], 0)
        end
        return unpack(r, 2, r.n)
    end
end

local function append(list)
    if type(list) ~= "table" then
        error(format("append expects a list, e.g. append { 1, 2 }, got %s", type(list)), 2)
    end
    return list
end

-- Model builders often raise plain messages ("gpt: option 'ctx' is
-- required"); give those the recipe line that called the builder.
local function with_caller_line(fn, locate)
    return function(...)
        local r = pack(xpcall(fn, locate, ...))
        if r[1] then
            return unpack(r, 2, r.n)
        end
        local e = r[2]
        if type(e) == "string" and not find(e, "^[^\n]-:%d+: ") then
            local info = debug_getinfo(2, "Sl")
            if info and info.currentline and info.currentline > 0 and sub(info.source, 1, 1) == "@" then
                e = where(sub(info.source, 2), info.currentline) .. e
            end
        end
        error(e, 0)
    end
end

local function recipe_env(ctx, file)
    local extras = {}
    for k, v in pairs(ctx.models) do
        extras[k] = type(v) == "function" and with_caller_line(v, ctx.host.locate) or v
    end
    extras.include = make_include(ctx, file)
    extras.require = ctx.require
    extras.append = ctx.append
    return make_env(ctx, extras)
end

local function resolve_file(ctx, path)
    local src, msg = read_source(ctx, path)
    if not src then
        error(format("cannot read recipe %s", msg), 0)
    end
    local fn, lmsg = ctx.host.load_text(src, path)
    if not fn then
        error(lmsg, 0)
    end
    setfenv(fn, recipe_env(ctx, path))
    local results = pack(fn())
    local scan = scan_source(src)
    local t = results[1]
    if type(t) ~= "table" then
        error(format("%sa recipe must return a table, got %s", where(path, scan.return_line),
            results.n == 0 and "nothing" or type(t)), 0)
    end
    attribute(ctx, t, path, scan, "", {})

    local ext = rawget(t, "extends")
    if ext == nil then
        return copy(ctx, t)
    end
    local line = lookup_exact(scan, "extends")
    if type(ext) ~= "string" then
        error(format("%sextends must be the path of a recipe (a string), got %s", where(path, line), type(ext)), 0)
    end
    local found, searched, outside = find_recipe(ctx, ext, dirname(path))
    if not found then
        error(not_found(ctx, where(path, line), "extends", ext, searched, outside), 0)
    end
    local base = resolve(ctx, found, "extends", { file = path, line = line })
    merge_into(ctx, base, t, "", true)
    return base
end

-- The fully resolved table of a recipe file (its extends applied), fresh
-- tables throughout so that callers may change it.
resolve = function(ctx, path, how, from)
    local real = check_cycle(ctx, path, how, from)
    local depth = #ctx.stack
    ctx.stack[depth + 1] = { real = real, display = path }
    local ok, result = xpcall(resolve_file, ctx.host.locate, ctx, path)
    for i = #ctx.stack, depth + 1, -1 do
        ctx.stack[i] = nil
    end
    if not ok then
        if type(result) ~= "string" then
            result = format("%sthe recipe raised an error that is a %s, not a message", where(path), type(result))
        end
        error(result, 0)
    end
    return result
end

---------------------------------------------------------------------------
-- Command-line overrides

local function parse_number(text)
    -- Lua number literals only ("inf", "nan", " 1" stay strings).
    if find(text, "^[%+%-]?0[xX]%x+$")
        or (find(text, "%d") and (find(text, "^[%+%-]?%d*%.?%d*$") or find(text, "^[%+%-]?%d*%.?%d*[eE][%+%-]?%d+$"))
            and not find(text, "^[%+%-]?%.?[eE]")) then
        return tonumber(text)
    end
    return nil
end

local function parse_override(spec)
    local eq = find(spec, "=", 1, true)
    if not eq then
        error(format('command line override "%s": expected key=value (for example optim.lr=3e-4)', spec), 0)
    end
    local key, text = sub(spec, 1, eq - 1), sub(spec, eq + 1)
    if key == "" then
        error(format('command line override "%s": the key before "=" is empty (expected key=value)', spec), 0)
    end
    local parts = {}
    for part in gmatch(key .. ".", "([^%.]*)%.") do
        if part == "" then
            error(format('command line override "%s": "%s" has an empty part (expected names separated by single dots)',
                spec, key), 0)
        end
        parts[#parts + 1] = part
        if #parts > MAX_DEPTH then
            error(format('command line override "%s": the key has more than %d parts', sub(spec, 1, 60) .. "...",
                MAX_DEPTH), 0)
        end
    end
    local value
    if text == "true" then
        value = true
    elseif text == "false" then
        value = false
    else
        value = parse_number(text)
        if value == nil then
            value = text
        end
    end
    return { spec = spec, parts = parts, value = value, text = text }
end

local function override_key(t, part)
    if find(part, "^%d+$") then
        local i = tonumber(part)
        if rawget(t, i) ~= nil or i == #t + 1 then
            return i
        end
    end
    return part
end

local function apply_override(ctx, root, o)
    local O = ctx.origins
    local t = root
    for i = 1, #o.parts - 1 do
        local k = override_key(t, o.parts[i])
        local v = t[k]
        if v == nil then
            v = {}
            t[k] = v
            O[v] = {}
            O[t] = O[t] or {}
            O[t][k] = { cli = true }
        elseif type(v) ~= "table" then
            error(format('command line override "%s": "%s" is a %s in the recipe, not a table', o.spec,
                concat(o.parts, ".", 1, i), type(v)), 0)
        end
        t = v
    end
    local k = override_key(t, o.parts[#o.parts])
    t[k] = o.value
    O[t] = O[t] or {}
    O[t][k] = { cli = true, text = o.text }
end

---------------------------------------------------------------------------
-- Final origins: every key gets { file, line, cli, text }; a key without a
-- line of its own takes its enclosing table's.

local function finalize(ctx, t, parent, out, seen)
    if seen[t] then
        return
    end
    seen[t] = true
    local ot = ctx.origins[t] or {}
    local res = {}
    out[t] = res
    for k, v in pairs(t) do
        local o = ot[k]
        local r
        if o and o.cli then
            r = { cli = true, text = o.text }
        elseif o and o.line then
            r = { file = o.file, line = o.line }
        else
            r = { file = parent.file, line = parent.line, cli = parent.cli }
        end
        res[k] = r
        if type(v) == "table" then
            finalize(ctx, v, r, out, seen)
        end
    end
end

---------------------------------------------------------------------------

function M.load(host, cfg)
    local ctx = {
        host = host,
        origins = {},   -- table -> key -> { file, line, value } or { cli, text }
        resolved = setmetatable({}, { __mode = "k" }), -- tables made by copy (from a resolved recipe)
        appended = setmetatable({}, { __mode = "k" }), -- lists wrapped in append{}
        stack = {},     -- recipes being resolved, for cycle errors
        modules = {},   -- require cache
        models = {},
        lua_dirs = {},
        search_dirs = {},
        plugin_slots = cfg.plugin_slots or {}, -- slot name -> set of its core keys
        switches = {},  -- plugin slots a recipe or override gave another plugin
    }
    ctx.safe_pcall, ctx.safe_xpcall = make_protected_calls(host, function()
        return ctx.fatal
    end)
    ctx.env_mt = make_env_mt(host)
    ctx.require = make_require(ctx)
    -- the one module from C: the op table's shape rules, which trainrun.nn asks
    ctx.modules["trainrun.ops"] = { shape = host.op_shape }
    ctx.append = function(list)
        append(list)
        ctx.appended[list] = true
        return list
    end
    if cfg.extra_lua_dir then
        ctx.lua_dirs[#ctx.lua_dirs + 1] = cfg.extra_lua_dir
    end
    if cfg.lua_dir then
        ctx.lua_dirs[#ctx.lua_dirs + 1] = cfg.lua_dir
    end
    for dir in gmatch(cfg.recipe_path or "", "[^:]+") do
        ctx.search_dirs[#ctx.search_dirs + 1] = dir
    end
    if cfg.recipe_dir then
        ctx.search_dirs[#ctx.search_dirs + 1] = cfg.recipe_dir
    end
    -- the directories extends and include may read (inside_roots): the
    -- recipe named on the command line is trusted, and so is its directory
    ctx.roots, ctx.root_names = {}, {}
    local top = dirname(cfg.path or "")
    for _, dir in ipairs({ top == "" and "." or top, unpack(ctx.search_dirs) }) do
        local real = host.realpath(dir)
        if real then
            ctx.roots[#ctx.roots + 1] = real
            ctx.root_names[#ctx.root_names + 1] = dir
        end
    end

    local overrides = {}
    for i, spec in ipairs(cfg.overrides or {}) do
        overrides[i] = parse_override(spec)
    end

    -- Model builders (trainrun.models) are globals in every recipe.
    local models = load_module(ctx, "trainrun.models")
    if models ~= nil then
        if type(models) ~= "table" then
            error(format("trainrun/models.lua must return a table of builders, got %s", type(models)), 0)
        end
        for k, v in pairs(models) do
            ctx.models[k] = v
        end
    end

    local result = resolve(ctx, cfg.path, "extends", { file = cfg.path })
    -- slot.plugin=NAME on the command line switches the slot's plugin as a
    -- child recipe would: the recipe's options of the old plugin that the
    -- new one lacks go, except those the command line sets (slot.key=value)
    for _, o in ipairs(overrides) do
        local slot = o.parts[1]
        if #o.parts == 2 and o.parts[2] == "plugin" and ctx.plugin_slots[slot]
            and type(rawget(result, slot)) == "table" then
            local keep = {}
            for _, other in ipairs(overrides) do
                if other.parts[1] == slot and #other.parts >= 2 then
                    keep[other.parts[2]] = true
                end
            end
            note_plugin_switch(ctx, slot, result[slot], o.value,
                "the command line (" .. o.spec .. ")", keep)
        end
    end
    for _, o in ipairs(overrides) do
        apply_override(ctx, result, o)
    end
    local origins = {}
    finalize(ctx, result, { file = cfg.path, line = 0 }, origins, {})
    ctx.origins, ctx.stack = {}, {} -- only the module cache outlives the load

    -- For the host after loading (tr_recipe_require): the same module
    -- instances the recipe saw.
    local function require_for_host(name)
        local module, msg = load_module(ctx, name)
        if module == nil then
            error(msg, 0)
        end
        return module
    end
    return result, origins, require_for_host, ctx.switches
end

return M
