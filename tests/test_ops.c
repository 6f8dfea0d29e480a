/* The op table (kernels/ops.h) is complete, and the Lua builders
 * (lua/trainrun/nn.lua) emit only what it describes: every op has a node
 * from some builder, each node's op, input count and attributes are the
 * table's, and each builder the table names exists.  The optimizer table
 * (core/config/optimizers.c) is complete too. */
#include <criterion/criterion.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <string.h>

#include "config/optimizers.h"
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

/* A graph through every builder of nn.lua, then each node against `ops`
 * (the table as Lua data); returns an error string or nothing. */
static const char *const every_builder =
    "local nn, ops = ...\n"
    "local g = nn.graph(2)\n"
    "local x, y = g:input('x', {2, 4}, 'i32'), g:input('y', {2, 4}, 'i32')\n"
    "local h = g:embedding(g:param('wte', {10, 8}), x)\n"
    "h = g:add_rows(h, g:param('wpe', {4, 8}))\n"
    "h = g:LayerNorm('ln', h)\n"
    "local a = g:attention(g:Linear('qkv', h, 24), 2)\n"
    "local q = g:rope(g:Linear('q', h, 8), 2)\n"
    "local k = g:rope(g:Linear('k', h, 4), 1)\n"
    "local a2 = g:recompute(function() return g:gqa_attention(q, k, g:Linear('v', h, 4), 2, 1) end)\n"
    "h = g:RMSNorm('rms', g:add(a, a2))\n"
    "h = g:swiglu(g:Linear('gate', h, 8, {bias = false}), g:Linear('up', h, 8, {bias = false}))\n"
    "h = g:dropout(g:scale(g:relu(g:gelu(h)), 0.5), 0.1)\n"
    "g:matmul(h, h, true)\n"
    "local im = g:input('im', {2, 6, 6, 3})\n"
    "local c = g:BatchNorm('bn', g:Conv2d('conv', im, 4, 3, {pad = 1}))\n"
    "g:global_avgpool(g:avgpool(g:maxpool(c, 2), 2, {pad = 1}))\n"
    "g:cross_entropy(g:Linear('head', h, 10), y)\n"
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

Test(ops, nn_lua_agrees)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    cr_assert_eq(luaL_dofile(L, TR_TEST_SRCDIR "/../lua/trainrun/nn.lua"), 0, "%s",
                 lua_tostring(L, -1));
    int nn = lua_gettop(L);
    cr_assert_eq(luaL_loadstring(L, every_builder), 0, "%s", lua_tostring(L, -1));
    lua_pushvalue(L, nn);
    push_table(L);
    cr_assert_eq(lua_pcall(L, 2, 1, 0), 0, "%s", lua_tostring(L, -1));
    cr_assert(lua_isnil(L, -1), "%s", lua_tostring(L, -1));
    lua_close(L);
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
        cr_assert(d->options && d->options[0], "%s: the options its update reads", d->name);
    }
    cr_assert_null(tr_optimizer_names[n]);
    cr_assert_null(tr_optimizer_find("adam"));
}
