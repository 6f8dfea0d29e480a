#include "model.h"

#include "util.h"

#include <ctype.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>

static int field_int(lua_State *L, int idx, const char *key, int fallback)
{
    lua_getfield(L, idx, key);
    int v = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : fallback;
    lua_pop(L, 1);
    return v;
}

static double field_num(lua_State *L, int idx, const char *key, double fallback)
{
    lua_getfield(L, idx, key);
    double v = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : fallback;
    lua_pop(L, 1);
    return v;
}

static const char *field_str(lua_State *L, int idx, const char *key)
{
    lua_getfield(L, idx, key);
    const char *s = lua_tostring(L, -1); /* stays valid: the table holds it */
    lua_pop(L, 1);
    return s;
}

static int convert(lua_State *L, int gi, int batch, struct tr_graph **out, tr_err *err)
{
    struct tr_graph *g = tr_graph_new(batch);
    lua_getfield(L, gi, "tensors");
    int ti = lua_gettop(L);
    int nt = (int)lua_objlen(L, ti);
    for (int i = 1; i <= nt; i++) {
        lua_rawgeti(L, ti, i);
        int e = lua_gettop(L);
        const char *name = field_str(L, e, "name");
        const char *role = field_str(L, e, "role");
        const char *dtype = field_str(L, e, "dtype");
        int64_t shape[TR_MAX_DIMS];
        lua_getfield(L, e, "shape");
        int ndim = (int)lua_objlen(L, -1);
        if (!name || !role || ndim < 1 || ndim > TR_MAX_DIMS) {
            tr_graph_free(g, NULL);
            return tr_fail(err, "model: tensor %d is malformed (name, role, 1-%d dims)", i,
                           TR_MAX_DIMS);
        }
        for (int d = 0; d < ndim; d++) {
            lua_rawgeti(L, -1, d + 1);
            shape[d] = (int64_t)lua_tointeger(L, -1);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
        enum tr_role r = strcmp(role, "param") == 0   ? TR_ROLE_PARAM
                         : strcmp(role, "input") == 0 ? TR_ROLE_INPUT
                                                      : TR_ROLE_ACTIVATION;
        enum tr_dtype dt = dtype && strcmp(dtype, "i32") == 0 ? TR_I32 : TR_F32;
        int id = tr_graph_add_tensor(g, name, r, dt, ndim, shape);
        struct tr_tensor *t = &g->tensors[id];
        if (r == TR_ROLE_PARAM) {
            const char *init = field_str(L, e, "init");
            t->init = !init || strcmp(init, "normal") == 0 ? TR_INIT_NORMAL
                      : strcmp(init, "ones") == 0          ? TR_INIT_ONES
                                                           : TR_INIT_ZEROS;
            t->init_std = field_num(L, e, "std", 0.02);
            lua_getfield(L, e, "decay");
            t->decay = lua_toboolean(L, -1);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);

    lua_getfield(L, gi, "nodes");
    int ni = lua_gettop(L);
    int nn = (int)lua_objlen(L, ni);
    for (int i = 1; i <= nn; i++) {
        lua_rawgeti(L, ni, i);
        int e = lua_gettop(L);
        struct tr_node n;
        memset(&n, 0, sizeof n);
        const char *op = field_str(L, e, "op");
        if (!op || !tr_op_from_name(op, &n.op)) {
            tr_graph_free(g, NULL);
            return tr_fail(err, "model: node %d has an unknown op '%s'", i, op ? op : "?");
        }
        n.name = (char *)field_str(L, e, "name");
        n.out = field_int(L, e, "output", 0) - 1;
        lua_getfield(L, e, "inputs");
        n.n_in = (int)lua_objlen(L, -1);
        if (n.n_in > 3)
            n.n_in = 3;
        for (int k = 0; k < n.n_in; k++) {
            lua_rawgeti(L, -1, k + 1);
            n.in[k] = (int)lua_tointeger(L, -1) - 1;
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
        n.heads = field_int(L, e, "heads", 0);
        n.eps = (float)field_num(L, e, "eps", 1e-5);
        n.ignore_index = field_int(L, e, "ignore_index", -1);
        n.trans_b = field_int(L, e, "trans_b", 0);
        n.segment = field_int(L, e, "segment", 0);
        tr_graph_add_node(g, &n);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);

    g->loss = field_int(L, gi, "loss", 0) - 1;
    g->logits = field_int(L, gi, "logits", 0) - 1;
    lua_getfield(L, gi, "inputs");
    g->n_inputs = (int)lua_objlen(L, -1);
    if (g->n_inputs != 2) {
        lua_pop(L, 1);
        tr_graph_free(g, NULL);
        return tr_fail(err, "model: declares %d inputs; trainrun feeds two (the sample and its "
                       "targets, in that order)", g->n_inputs);
    }
    for (int k = 0; k < g->n_inputs; k++) {
        lua_rawgeti(L, -1, k + 1);
        g->inputs[k] = (int)lua_tointeger(L, -1) - 1;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    if (tr_graph_check(g, err) != TR_OK) {
        tr_err_prefix(err, "model");
        tr_graph_free(g, NULL);
        return TR_ERROR;
    }
    *out = g;
    return TR_OK;
}

/* Does msg start with "some/file.lua:12: "? */
static int has_location(const char *msg)
{
    const char *end = msg ? strstr(msg, ": ") : NULL;
    if (!end)
        return 0;
    const char *p = end;
    while (p > msg && isdigit((unsigned char)p[-1]))
        p--;
    return p < end && p - msg > 5 && strncmp(p - 5, ".lua:", 5) == 0 &&
           memchr(msg, ' ', (size_t)(end - msg)) == NULL;
}

struct tr_graph *tr_model_build(struct tr_recipe *r, int batch, tr_err *err)
{
    lua_State *L = tr_recipe_lua(r);
    int top = lua_gettop(L);
    struct tr_graph *g = NULL;
    struct tr_origin where = {TR_FROM_RECIPE, tr_recipe_path(r), 0};
    tr_recipe_origin(r, "model", &where);
    char loc[600];
    tr_origin_format(&where, loc, sizeof loc);

    if (tr_recipe_require(r, "trainrun.models", err) != TR_OK)
        goto done;
    lua_getfield(L, -1, "build");
    tr_recipe_push_resolved(r);
    lua_getfield(L, -1, "model");
    lua_remove(L, -2);
    if (lua_isnil(L, -1)) {
        tr_fail(err, "%s: the recipe has no model (model = gpt { ... })", tr_recipe_path(r));
        goto done;
    }
    lua_pushinteger(L, batch);
    if (lua_pcall(L, 2, 1, 0) != 0) {
        const char *msg = lua_tostring(L, -1);
        if (has_location(msg)) /* the builder's own file:line is the precise one */
            tr_fail(err, "%s", msg);
        else
            tr_fail(err, "%s: %s", loc, msg);
        goto done;
    }
    if (!lua_istable(L, -1)) {
        tr_fail(err, "%s: the model builder did not return a graph (end it with g:finish{...})", loc);
        goto done;
    }
    if (convert(L, lua_gettop(L), batch, &g, err) != TR_OK)
        tr_err_prefix(err, "%s", loc);
done:
    lua_settop(L, top);
    return g;
}
