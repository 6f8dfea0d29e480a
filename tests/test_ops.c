/* The op table (kernels/ops.h) is complete, and the Lua builders
 * (lua/trainrun/nn.lua) emit only what it describes: every op has a node
 * from some builder, each node's op, input count and attributes are the
 * table's, and each builder the table names exists.  nn.lua has no shape
 * logic of its own: every node's output shape is the one the table's answer
 * (trainrun.ops, core/config/recipe_ops.h) gives, and every builder's
 * mistake is the answer's sentence.  The optimizer table
 * (core/config/optimizers.c) is complete too. */
#include <criterion/criterion.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <string.h>

#include "config/optimizers.h"
#include "config/options.h"
#include "config/recipe_ops.h"
#include "config/run_config.h"
#include "engine/graph.h"

Test(ops, table_complete)
{
    for (int i = 0; i < TR_OP_COUNT; i++) {
        const struct tr_op_desc *d = tr_op_desc((enum tr_op)i);
        cr_assert(d && d->name && d->shape && d->lua, "op %d is not described", i);
        cr_assert(d->min_in >= 1 && d->min_in <= d->max_in && d->max_in <= 3, "%s: inputs",
                  d->name);
        for (int k = 0; k < d->max_in; k++)
            cr_assert(d->inputs[k], "%s: input %d has no role", d->name, k + 1);
        cr_assert(d->backends & TR_ON_CPU, "%s: the CPU runs every op", d->name);
        cr_assert((d->grad_inputs & d->int_inputs) == 0, "%s: a gradient flows to ids", d->name);
        enum tr_op back;
        cr_assert(tr_op_from_name(d->name, &back) && back == (enum tr_op)i, "%s: name", d->name);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(d->name, tr_ops[j].name);
    }
    cr_assert_null(tr_op_desc(TR_OP_COUNT));
    for (int a = 0; a < TR_ATTR_COUNT; a++) {
        cr_assert(tr_attrs[a].name, "attribute %d has no name", a);
        for (int b = 0; b < a; b++) {
            cr_assert_str_neq(tr_attrs[a].name, tr_attrs[b].name);
            cr_assert_neq(tr_attrs[a].offset, tr_attrs[b].offset);
        }
    }
    cr_assert_eq(tr_op_backend_bit("cpu"), TR_ON_CPU);
    cr_assert_eq(tr_op_backend_bit("cuda"), TR_ON_CUDA);
    cr_assert_eq(tr_op_backend_bit("elsewhere"), 0);
}

/* A graph through every builder of nn.lua: a function of nn returning g. */
#define EVERY_BUILDER                                                                              \
    "local function every_builder(nn)\n"                                                           \
    "local g = nn.graph(2)\n"                                                                      \
    "local x, y = g:input('x', {2, 4}, 'i32'), g:input('y', {2, 4}, 'i32')\n"                      \
    "local h = g:embedding(g:param('wte', {10, 8}), x)\n"                                          \
    "h = g:add_rows(h, g:param('wpe', {4, 8}))\n"                                                  \
    "h = g:LayerNorm('ln', h)\n"                                                                   \
    "local a = g:attention(g:Linear('qkv', h, 24), 2)\n"                                           \
    "local q = g:rope(g:Linear('q', h, 8), 2)\n"                                                   \
    "local k = g:rope(g:Linear('k', h, 4), 1)\n"                                                   \
    "local a2 = g:recompute(function()\n"                                                          \
    "  return g:gqa_attention(q, k, g:Linear('v', h, 4), 2, 1)\n"                                  \
    "end)\n"                                                                                       \
    "h = g:RMSNorm('rms', g:add(a, a2))\n"                                                         \
    "h = g:swiglu(g:Linear('gate', h, 8, {bias = false}), g:Linear('up', h, 8, {bias = false}))\n" \
    "h = g:dropout(g:scale(g:relu(g:gelu(h)), 0.5), 0.1)\n"                                        \
    "g:matmul(h, h, true)\n"                                                                       \
    "local im = g:input('im', {2, 6, 6, 3})\n"                                                     \
    "local c = g:BatchNorm('bn', g:Conv2d('conv', im, 4, 3, {pad = 1}))\n"                         \
    "g:global_avgpool(g:avgpool(g:maxpool(c, 2), 2, {pad = 1}))\n"                                 \
    "g:cross_entropy(g:Linear('head', h, 10), y)\n"                                                \
    "return g\n"                                                                                   \
    "end\n"

/* Each node of that graph against `ops` (the table as Lua data); returns an
 * error string or nothing. */
static const char *const every_builder =
    EVERY_BUILDER
    "local nn, ops = ...\n"
    "local g = every_builder(nn)\n"
    "local node_fields = {op = true, name = true, output = true, inputs = true, segment = true}\n"
    "local seen = {}\n"
    "for i, n in ipairs(g.nodes) do\n"
    "  local d = ops[n.op]\n"
    "  if not d then return ('node %d: op %s is not in the op table'):format(i, tostring(n.op)) end\n"
    "  seen[n.op] = true\n"
    "  if #n.inputs < d.min or #n.inputs > d.max then\n"
    "    return ('%s: %d inputs; the op table says %d to %d'):format(n.op, #n.inputs, d.min, d.max)\n"
    "  end\n"
    "  for key in pairs(n) do\n"
    "    if not node_fields[key] and not d.attrs[key] then\n"
    "      return ('%s: attribute %s is not one the op table lists'):format(n.op, key)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "for name, d in pairs(ops) do\n"
    "  if not seen[name] then return ('op %s: no builder made a node'):format(name) end\n"
    "  for b in d.lua:gmatch('Graph:([%w_]+)') do\n"
    "    if type(g[b]) ~= 'function' then return ('op %s: nn.lua has no Graph:%s'):format(name, b) end\n"
    "  end\n"
    "end\n";

/* tr_ops as {name = {min, max, attrs = {eps = true, ...}, lua}} */
static void push_table(lua_State *L)
{
    lua_newtable(L);
    for (int i = 0; i < TR_OP_COUNT; i++) {
        const struct tr_op_desc *d = &tr_ops[i];
        lua_newtable(L);
        lua_pushinteger(L, d->min_in);
        lua_setfield(L, -2, "min");
        lua_pushinteger(L, d->max_in);
        lua_setfield(L, -2, "max");
        lua_pushstring(L, d->lua);
        lua_setfield(L, -2, "lua");
        lua_newtable(L);
        for (int a = 0; a < TR_ATTR_COUNT; a++)
            if (d->attrs & TR_ATTR(a)) {
                lua_pushboolean(L, 1);
                lua_setfield(L, -2, tr_attrs[a].name);
            }
        lua_setfield(L, -2, "attrs");
        lua_setfield(L, -2, d->name);
    }
}

/* A plain Lua state with nn.lua loaded on top of the stack, its
 * trainrun.ops the module recipes get (stub NULL) or the one the Lua chunk
 * `stub` returns. */
static lua_State *nn_state(const char *stub)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "loaded");
    if (stub)
        cr_assert_eq(luaL_dostring(L, stub), 0, "%s", lua_tostring(L, -1));
    else
        tr_recipe_push_ops(L);
    lua_setfield(L, -2, "trainrun.ops");
    lua_pop(L, 2);
    cr_assert_eq(luaL_dofile(L, TR_TEST_SRCDIR "/../lua/trainrun/nn.lua"), 0, "%s",
                 lua_tostring(L, -1));
    return L;
}

/* Runs chunk with nn (and `extra` values pushed by push, if any) as its
 * arguments; it returns nil or what is wrong. */
static void expect_nothing_wrong(lua_State *L, const char *chunk, void (*push)(lua_State *))
{
    int nn = lua_gettop(L);
    cr_assert_eq(luaL_loadstring(L, chunk), 0, "%s", lua_tostring(L, -1));
    lua_pushvalue(L, nn);
    if (push)
        push(L);
    cr_assert_eq(lua_pcall(L, push ? 2 : 1, 1, 0), 0, "%s", lua_tostring(L, -1));
    cr_assert(lua_isnil(L, -1), "%s", lua_tostring(L, -1));
    lua_close(L);
}

Test(ops, nn_lua_agrees)
{
    expect_nothing_wrong(nn_state(NULL), every_builder, push_table);
}

/* With an op table that answers every node [3,7], every node's output is
 * [3,7]: the builders take each shape from the table and compute none of
 * their own (only the layers read their input's last dimension, for the
 * parameters they make).  Each call names the node's own op, inputs and
 * attributes. */
Test(ops, nn_lua_takes_every_shape_from_the_table)
{
    static const char stub[] =
        "calls = {}\n"
        "return { shape = function(op, inputs, attrs)\n"
        "  calls[#calls + 1] = { op = op, inputs = inputs, attrs = attrs }\n"
        "  return { 3, 7 }\n"
        "end }\n";
    static const char chunk[] =
        EVERY_BUILDER
        "local nn = ...\n"
        "local g = every_builder(nn)\n"
        "if #calls ~= #g.nodes then\n"
        "  return ('%d nodes but %d answers of the table'):format(#g.nodes, #calls)\n"
        "end\n"
        "for i, n in ipairs(g.nodes) do\n"
        "  local out, c = g.tensors[n.output], calls[i]\n"
        "  if #out.shape ~= 2 or out.shape[1] ~= 3 or out.shape[2] ~= 7 then\n"
        "    return ('%s %s: output [%s] is not the table\\'s [3,7]'):format(n.op, n.name,\n"
        "                                                          table.concat(out.shape, ','))\n"
        "  end\n"
        "  if c.op ~= n.op or #c.inputs ~= #n.inputs then return n.name .. ': not its own call' end\n"
        "  for k, t in ipairs(c.inputs) do\n"
        "    if t.id ~= n.inputs[k] then return n.name .. ': input ' .. k .. ' is not the node\\'s' end\n"
        "  end\n"
        "  for key, v in pairs(c.attrs) do\n"
        "    local want = type(v) == 'table' and v.id or v\n"
        "    if n[key] ~= want then return n.name .. ': attribute ' .. key .. ' differs' end\n"
        "  end\n"
        "end\n";
    expect_nothing_wrong(nn_state(stub), chunk, NULL);
}

/* With an op table that refuses every node, every builder's error is the
 * table's sentence after the builder's name: no builder checks shapes or
 * attributes before it asks. */
Test(ops, nn_lua_reports_the_table_s_sentence)
{
    static const char stub[] =
        "return { shape = function() return nil, 'the table says no' end }\n";
    static const char chunk[] =
        "local nn = ...\n"
        "local g = nn.graph(2)\n"
        "local x, i = g:input('x', {2, 4}), g:input('i', {2, 4}, 'i32')\n"
        "local p, im = g:param('p', {4, 4}), g:input('im', {2, 6, 6, 3})\n"
        "local r = g:buffer('r', {2, 4})\n"
        "local calls = {\n"
        "  embedding = function() g:embedding(p, i) end,\n"
        "  add_rows = function() g:add_rows(x, p) end,\n"
        "  add = function() g:add(x, p) end,\n"
        "  linear = function() g:linear(x, p, p) end,\n"
        "  matmul = function() g:matmul(x, p, true) end,\n"
        "  layernorm = function() g:layernorm(x, p, p, 2) end,\n"
        "  gelu = function() g:gelu(x) end,\n"
        "  relu = function() g:relu(x) end,\n"
        "  attention = function() g:attention(x, 0) end,\n"
        "  gqa_attention = function() g:gqa_attention(x, x, x, 3, 5) end,\n"
        "  rmsnorm = function() g:rmsnorm(x, p, -1) end,\n"
        "  rope = function() g:rope(x, 3, -1) end,\n"
        "  swiglu = function() g:swiglu(x, p) end,\n"
        "  scale = function() g:scale(x, 0 / 0) end,\n"
        "  conv2d = function() g:conv2d(x, p, nil, {stride = 0, groups = 7}) end,\n"
        "  maxpool = function() g:maxpool(x, 0, {pad = 9}) end,\n"
        "  avgpool = function() g:avgpool(x, {1, 2, 3}) end,\n"
        "  global_avgpool = function() g:global_avgpool(x) end,\n"
        "  batchnorm = function() g:batchnorm(x, p, p, p, {momentum = 7, eps = 2}) end,\n"
        "  cross_entropy = function() g:cross_entropy(x, x, 1.5) end,\n"
        "}\n"
        "for name, call in pairs(calls) do\n"
        "  local ok, e = pcall(call)\n"
        "  local want = name .. ': the table says no'\n"
        "  if ok or e:sub(-#want) ~= want then\n"
        "    return ('%s: %s, want ...%s'):format(name, ok and 'accepted' or e, want)\n"
        "  end\n"
        "end\n"
        "if #g.nodes ~= 0 then return 'a refused node was added' end\n";
    expect_nothing_wrong(nn_state(stub), chunk, NULL);
}

/* The answer itself: the output shape, the rule's sentence, defaults. */
Test(ops, the_answer_is_the_rule_s)
{
    static const char chunk[] =
        "local nn = ...\n"
        "local shape = require('trainrun.ops').shape\n"
        "local x = {name = 'x', shape = {2, 8, 16}}\n"
        "local w = {name = 'w', shape = {32, 16}, role = 'param'}\n"
        "local s = shape('linear', {x, w})\n"
        "if table.concat(s, ',') ~= '2,8,32' then return 'linear: ' .. table.concat(s, ',') end\n"
        "local bad = {name = 'w', shape = {32, 24}, role = 'param'}\n"
        "local none, why = shape('linear', {x, bad})\n"
        "if none ~= nil or why ~= \"input 'x' [2,8,16] has 16 features but weight 'w' [32,24] \"\n"
        "                         .. 'expects 24' then return 'linear: ' .. tostring(why) end\n"
        "local im = {name = 'im', shape = {2, 6, 6, 3}}\n"
        "s = shape('maxpool', {im}, {kernel = 2})\n"
        "if table.concat(s, ',') ~= '2,3,3,3' then return 'maxpool strides by its window' end\n"
        "local run = {name = 'run', shape = {2, 3}, role = 'buffer'}\n"
        "local c = {name = 'c', shape = {3}, role = 'param'}\n"
        "s = shape('batchnorm', {im, c, c}, {buffer = run})\n"
        "if table.concat(s, ',') ~= '2,6,6,3' then return 'batchnorm' end\n"
        "run.attribute_of = {op = 'batchnorm', name = 'bn'}\n"
        "none, why = shape('batchnorm', {im, c, c}, {buffer = run})\n"
        "if none ~= nil or not tostring(why):find(\"already the running statistics of 'bn'\") then\n"
        "  return 'a buffer taken twice: ' .. tostring(why)\n"
        "end\n"
        "none, why = shape('lineer', {x, w})\n"
        "if why ~= \"unknown op 'lineer' (did you mean 'linear'?)\" then return tostring(why) end\n";
    lua_State *L = nn_state(NULL);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "loaded");
    lua_getfield(L, -1, "trainrun.ops");
    cr_assert(lua_istable(L, -1));
    lua_pop(L, 3);
    expect_nothing_wrong(L, chunk, NULL);
}

Test(ops, optimizer_table_complete)
{
    int n = 0;
    for (; tr_optimizers[n]; n++) {
        const struct tr_optimizer_desc *d = tr_optimizers[n];
        cr_assert_str_eq(tr_optimizer_names[n], d->name, "the names list follows the table");
        cr_assert_eq(tr_optimizer_find(d->name), d);
        cr_assert(d->state_slots >= 0 && d->state_slots <= TR_OPTIMIZER_MAX_SLOTS, "%s", d->name);
        for (int k = 0; k < d->state_slots; k++)
            cr_assert(d->state_names[k] && tr_optimizer_state_files[k], "%s: slot %d", d->name, k);
        cr_assert(d->options && d->options[0].type != TR_OPT_END, "%s: the options its update reads",
                  d->name);
    }
    cr_assert_null(tr_optimizer_names[n]);
    cr_assert_null(tr_optimizer_find("adam"));
}

static int same_text(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* Each optimizer's options are whole descriptions of fields of struct
 * tr_optimizer_config; an option two optimizers read is described alike
 * by both (one field, one default, one range, one help line), and the run
 * configuration's list of them has every one once. */
Test(ops, optimizer_options_are_described_once)
{
    struct tr_option all[TR_OPTIMIZER_MAX_OPTIONS + 1];
    int n_all = tr_optimizer_options(all, TR_OPTIMIZER_MAX_OPTIONS + 1);
    cr_assert(n_all > 0);
    cr_assert_eq(all[n_all].type, TR_OPT_END);
    cr_assert_eq(tr_optimizer_options(all, 2), -1, "a list too short is refused");
    tr_optimizer_options(all, TR_OPTIMIZER_MAX_OPTIONS + 1);
    for (int i = 0; tr_optimizers[i]; i++) {
        const struct tr_optimizer_desc *d = tr_optimizers[i];
        for (const struct tr_option *o = d->options; o->type != TR_OPT_END; o++) {
            cr_assert(o->name && o->help && o->default_value, "%s: an option without its text", d->name);
            cr_assert(o->offset + sizeof(double) <= sizeof(struct tr_optimizer_config), "%s.%s: field",
                      d->name, o->name);
            cr_assert(strcmp(o->name, "type") && strcmp(o->name, "reference_batch") &&
                      strcmp(o->name, "clip"), "%s.%s is the run configuration's own", d->name, o->name);
            int found = 0;
            for (int k = 0; k < n_all; k++) {
                const struct tr_option *a = &all[k];
                if (strcmp(a->name, o->name) != 0)
                    continue;
                found++;
                cr_assert(a->type == o->type && a->offset == o->offset && a->min == o->min &&
                          a->max == o->max && same_text(a->default_value, o->default_value) &&
                          same_text(a->help, o->help),
                          "%s.%s is described otherwise by another optimizer", d->name, o->name);
            }
            cr_assert_eq(found, 1, "%s.%s: listed %d times", d->name, o->name, found);
        }
    }
}
