/* The op table for recipe code (recipe_ops.h): ops.shape, and the reading
 * of node attributes the model reader shares. */
#include "recipe_ops.h"

#include "../util/suggest.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* What a tensor may be: the model reader's limits (engine/model.c), so a
 * handle the answer takes is one the graph could hold. */
#define MAX_DIM INT32_MAX
#define MAX_NUMEL ((int64_t)1 << 40)

/* ---- reading Lua values ------------------------------------------------------- */

int tr_lua_whole_number(lua_State *L, int idx, int64_t lo, int64_t hi, int64_t *out)
{
    if (lua_type(L, idx) != LUA_TNUMBER)
        return 0;
    double d = lua_tonumber(L, idx);
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return 0;
    *out = (int64_t)d;
    return 1;
}

static void describe_number(double d, char *buf, size_t size)
{
    if (isnan(d)) /* 0/0 is -nan on most machines; the sign means nothing */
        snprintf(buf, size, "nan");
    else
        snprintf(buf, size, "%.17g", d);
}

const char *tr_lua_describe(lua_State *L, int idx, char *buf, size_t size)
{
    if (idx < 0 && idx > LUA_REGISTRYINDEX)
        idx = lua_gettop(L) + idx + 1;
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER: describe_number(lua_tonumber(L, idx), buf, size); break;
    case LUA_TSTRING: snprintf(buf, size, "the string \"%.40s\"", lua_tostring(L, idx)); break;
    case LUA_TNIL: snprintf(buf, size, "missing"); break;
    case LUA_TTABLE: {
        size_t n = lua_objlen(L, idx);
        lua_rawgeti(L, idx, 1);
        lua_rawgeti(L, idx, 2);
        if (n == 2 && lua_type(L, -2) == LUA_TNUMBER && lua_type(L, -1) == LUA_TNUMBER) {
            char a[40], b[40];
            describe_number(lua_tonumber(L, -2), a, sizeof a);
            describe_number(lua_tonumber(L, -1), b, sizeof b);
            snprintf(buf, size, "{%s, %s}", a, b);
        } else if (n > 0) {
            snprintf(buf, size, "a table of %zu item%s", n, n == 1 ? "" : "s");
        } else {
            snprintf(buf, size, "a table");
        }
        lua_pop(L, 2);
        break;
    }
    default: snprintf(buf, size, "a %s", lua_typename(L, lua_type(L, idx))); break;
    }
    return buf;
}

/* ---- node attributes ----------------------------------------------------------- */

/* Push t[key] without metamethods; t is an absolute index. */
static int raw_field(lua_State *L, int t, const char *key)
{
    lua_pushstring(L, key);
    lua_rawget(L, t);
    return lua_type(L, -1);
}

#define WHY(...) (snprintf(why, size, __VA_ARGS__), -1)

/* A whole number in [lo, hi] (a boolean too where hi is 1). */
static int int_attr(lua_State *L, const struct tr_attr_desc *d, int *out, char *why, size_t size)
{
    int type = lua_type(L, -1);
    int64_t v = (int64_t)d->fallback;
    if (type == LUA_TBOOLEAN && d->hi == 1)
        v = lua_toboolean(L, -1);
    else if (type != LUA_TNIL && !tr_lua_whole_number(L, -1, d->lo, d->hi, &v)) {
        char got[96];
        return WHY("'%s' is %s; it must be a whole number from %lld to %lld", d->name,
                   tr_lua_describe(L, -1, got, sizeof got), (long long)d->lo, (long long)d->hi);
    }
    *out = (int)v;
    return 0;
}

/* A number that fits a float, finite; above 0 where lo > 0 (and not so
 * small that it rounds to 0 as a float). */
static int real_attr(lua_State *L, const struct tr_attr_desc *d, float *out, char *why, size_t size)
{
    int type = lua_type(L, -1), positive = d->lo > 0;
    double v = type == LUA_TNIL ? d->fallback : lua_tonumber(L, -1);
    int ok = type == LUA_TNIL || (type == LUA_TNUMBER && isfinite(v) && fabs(v) <= FLT_MAX &&
                                  (!positive || (float)v > 0));
    if (!ok) {
        char got[96];
        return WHY("'%s' is %s; it must be a finite number%s (within a float's range)", d->name,
                   tr_lua_describe(L, -1, got, sizeof got), positive ? " above 0" : "");
    }
    *out = (float)v;
    return 0;
}

/* A whole number n (n on both sides) or a pair {h, w}, each in [lo, hi];
 * both 0 when absent (the shape rule's default). */
static int pair_attr(lua_State *L, const struct tr_attr_desc *d, int out[2], char *why, size_t size)
{
    int type = lua_type(L, -1);
    int64_t v[2] = {0, 0};
    int ok = type == LUA_TNIL;
    if (type == LUA_TNUMBER) {
        ok = tr_lua_whole_number(L, -1, d->lo, d->hi, &v[0]);
        v[1] = v[0];
    } else if (type == LUA_TTABLE && lua_objlen(L, -1) == 2) {
        ok = 1;
        for (int k = 0; k < 2 && ok; k++) {
            lua_rawgeti(L, -1, k + 1);
            ok = tr_lua_whole_number(L, -1, d->lo, d->hi, &v[k]);
            lua_pop(L, 1);
        }
    }
    if (!ok) {
        char got[96];
        return WHY("'%s' is %s; it must be a whole number from %lld to %lld, or a pair {h, w} of "
                   "them", d->name, tr_lua_describe(L, -1, got, sizeof got), (long long)d->lo,
                   (long long)d->hi);
    }
    out[0] = (int)v[0];
    out[1] = (int)v[1];
    return 0;
}

/* A number in (0, 1) (OPEN_UNIT) or (0, 1] (HALF_UNIT, above 0 as a float). */
static int unit_attr(lua_State *L, const struct tr_attr_desc *d, float *out, char *why, size_t size)
{
    int type = lua_type(L, -1);
    double v = type == LUA_TNIL ? d->fallback : lua_tonumber(L, -1);
    int ok = d->kind == TR_ATTR_OPEN_UNIT ? v > 0 && v < 1 : v <= 1 && (float)v > 0;
    if (type != LUA_TNIL && (type != LUA_TNUMBER || !ok)) {
        char got[96];
        return WHY("'%s' is %s; it must be a number %s", d->name,
                   tr_lua_describe(L, -1, got, sizeof got), d->rule);
    }
    *out = (float)v;
    return 0;
}

int tr_node_attrs_read(lua_State *L, int t, unsigned mask, struct tr_node *n,
                       tr_attr_tensor_fn tensor, void *ud, char *why, size_t size)
{
    for (int a = 0; a < TR_ATTR_COUNT; a++) {
        const struct tr_attr_desc *d = &tr_attrs[a];
        if (!(mask & TR_ATTR(a)))
            continue;
        void *field = (char *)n + d->offset;
        raw_field(L, t, d->name);
        int rc = 0;
        switch (d->kind) {
        case TR_ATTR_INT: rc = int_attr(L, d, field, why, size); break;
        case TR_ATTR_REAL: rc = real_attr(L, d, field, why, size); break;
        case TR_ATTR_REAL64: {
            float f = 0;
            rc = real_attr(L, d, &f, why, size); /* the same checks; the value unrounded */
            *(double *)field = rc == 0 && lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1)
                                                                         : d->fallback;
            break;
        }
        case TR_ATTR_PAIR: rc = pair_attr(L, d, field, why, size); break;
        case TR_ATTR_OPEN_UNIT:
        case TR_ATTR_HALF_UNIT: rc = unit_attr(L, d, field, why, size); break;
        case TR_ATTR_TENSOR:
            *(int *)field = (int)d->fallback;
            if (lua_type(L, -1) != LUA_TNIL)
                rc = tensor(L, lua_gettop(L), d, ud, field, why, size);
            break;
        }
        lua_pop(L, 1);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* ---- ops.shape ------------------------------------------------------------------ */

/* The throwaway graph one answer runs on: the node's inputs, the tensors
 * its attributes name, and the node before it that already holds one of
 * them (batchnorm's buffer taken twice), all pointing into Lua's strings,
 * which the arguments keep alive for the call. */
struct scratch {
    struct tr_tensor tensors[3 + TR_ATTR_COUNT];
    int n_tensors;
    struct tr_node nodes[2]; /* [0]: a node before, [1]: this one */
    int has_before;
};

/* A tensor handle at idx (absolute) into *t; 0, or -1 with why naming it
 * as `what` ("input 2", "'buffer'"). */
static int read_handle(lua_State *L, int idx, const char *what, struct tr_tensor *t, char *why,
                       size_t size)
{
    char got[96];
    memset(t, 0, sizeof *t);
    t->producer = -1;
    if (lua_type(L, idx) != LUA_TTABLE)
        return WHY("%s is %s, not a tensor (a table with a name and a shape, as the graph's "
                   "builders make)", what, tr_lua_describe(L, idx, got, sizeof got));
    if (raw_field(L, idx, "name") != LUA_TSTRING) {
        lua_pop(L, 1);
        return WHY("%s has no name (a tensor's name is a string)", what);
    }
    t->name = (char *)lua_tostring(L, -1); /* the handle keeps it alive */
    lua_pop(L, 1);
    static const char *const roles[] = {"input", "param", "activation", "buffer", NULL};
    static const enum tr_role role_of[] = {TR_ROLE_INPUT, TR_ROLE_PARAM, TR_ROLE_ACTIVATION,
                                           TR_ROLE_BUFFER};
    t->role = TR_ROLE_ACTIVATION;
    int type = raw_field(L, idx, "role");
    int known = type == LUA_TNIL;
    for (int i = 0; type == LUA_TSTRING && roles[i]; i++)
        if (strcmp(lua_tostring(L, -1), roles[i]) == 0)
            t->role = role_of[i], known = 1;
    if (!known) {
        tr_lua_describe(L, -1, got, sizeof got);
        lua_pop(L, 1);
        return WHY("%s '%s': its role is %s; roles are \"input\", \"param\", \"activation\" "
                   "and \"buffer\"", what, t->name, got);
    }
    lua_pop(L, 1);
    type = raw_field(L, idx, "dtype");
    t->dtype = TR_F32;
    if (type == LUA_TSTRING && strcmp(lua_tostring(L, -1), "i32") == 0)
        t->dtype = TR_I32;
    else if (type != LUA_TNIL && !(type == LUA_TSTRING && strcmp(lua_tostring(L, -1), "f32") == 0)) {
        tr_lua_describe(L, -1, got, sizeof got);
        lua_pop(L, 1);
        return WHY("%s '%s': its dtype is %s; tensors are \"f32\" or \"i32\"", what, t->name, got);
    }
    lua_pop(L, 1);
    if (raw_field(L, idx, "shape") != LUA_TTABLE) {
        lua_pop(L, 1);
        return WHY("%s '%s' has no shape (a list of 1 to %d dimensions)", what, t->name,
                   TR_MAX_DIMS);
    }
    size_t ndim = lua_objlen(L, -1);
    if (ndim < 1 || ndim > TR_MAX_DIMS) {
        lua_pop(L, 1);
        return WHY("%s '%s' has %zu dimensions; tensors have 1 to %d", what, t->name, ndim,
                   TR_MAX_DIMS);
    }
    int64_t numel = 1;
    for (int d = 0; d < (int)ndim; d++) {
        lua_rawgeti(L, -1, d + 1);
        if (!tr_lua_whole_number(L, -1, 1, MAX_DIM, &t->shape[d])) {
            tr_lua_describe(L, -1, got, sizeof got);
            lua_pop(L, 2);
            return WHY("%s '%s': dimension %d is %s; dimensions are whole numbers from 1 to %d",
                       what, t->name, d + 1, got, MAX_DIM);
        }
        lua_pop(L, 1);
        if (__builtin_mul_overflow(numel, t->shape[d], &numel) || numel > MAX_NUMEL) {
            lua_pop(L, 1);
            return WHY("%s '%s' has more than 2^40 elements; no device holds that", what, t->name);
        }
    }
    lua_pop(L, 1); /* shape */
    t->ndim = (int)ndim;
    t->numel = (size_t)numel;
    return 0;
}

/* The op called `name` in the table. */
static int op_named(const char *name, enum tr_op *out)
{
    for (int i = 0; i < TR_OP_COUNT; i++)
        if (strcmp(tr_ops[i].name, name) == 0) {
            *out = (enum tr_op)i;
            return 1;
        }
    return 0;
}

/* A tensor attribute (batchnorm's buffer): a handle, added to the scratch
 * graph.  A handle that an earlier node of the graph already holds as an
 * attribute says so (attribute_of = {op = "batchnorm", name = "bn"}, which
 * nn.lua records), and that node goes before this one, so the rule sees
 * the graph it would see. */
static int tensor_attr(lua_State *L, int idx, const struct tr_attr_desc *d, void *ud, int *out,
                       char *why, size_t size)
{
    struct scratch *sc = ud;
    char what[64];
    snprintf(what, sizeof what, "'%s'", d->name);
    if (sc->n_tensors >= (int)(sizeof sc->tensors / sizeof sc->tensors[0]))
        return WHY("too many tensor attributes");
    if (read_handle(L, idx, what, &sc->tensors[sc->n_tensors], why, size) != 0)
        return -1;
    *out = sc->n_tensors++;
    if (raw_field(L, idx, "attribute_of") == LUA_TTABLE && !sc->has_before) {
        int h = lua_gettop(L);
        enum tr_op op;
        int named = raw_field(L, h, "name") == LUA_TSTRING;
        const char *name = named ? lua_tostring(L, -1) : NULL;
        int known = raw_field(L, h, "op") == LUA_TSTRING && op_named(lua_tostring(L, -1), &op);
        lua_pop(L, 2);
        if (named && known) {
            struct tr_node *before = &sc->nodes[0];
            memset(before, 0, sizeof *before);
            before->op = op;
            before->name = (char *)name; /* the handle keeps it alive */
            *(int *)((char *)before + d->offset) = *out;
            sc->has_before = 1;
        }
    }
    lua_pop(L, 1);
    return 0;
}

/* The answer's failure: nil, why. */
static int refuse(lua_State *L, const char *why)
{
    lua_pushnil(L);
    lua_pushstring(L, why);
    return 2;
}

int tr_recipe_op_shape(lua_State *L)
{
    char why[TR_OP_WHY_SIZE], got[96];
    const size_t size = sizeof why;
    lua_settop(L, 3);
    if (lua_type(L, 1) != LUA_TSTRING) {
        snprintf(why, size, "the op is %s; it must be an op's name, a string such as \"linear\"",
                 tr_lua_describe(L, 1, got, sizeof got));
        return refuse(L, why);
    }
    const char *name = lua_tostring(L, 1);
    struct scratch sc;
    memset(&sc, 0, sizeof sc);
    struct tr_node *n = &sc.nodes[1];
    if (!op_named(name, &n->op)) {
        const char *names[TR_OP_COUNT];
        for (int i = 0; i < TR_OP_COUNT; i++)
            names[i] = tr_ops[i].name;
        /* a did-you-mean costs the name's length: none for a name no op is near */
        const char *guess = lua_objlen(L, 1) <= 64 ? tr_suggest(name, names, TR_OP_COUNT) : NULL;
        if (guess)
            snprintf(why, size, "unknown op '%.60s' (did you mean '%s'?)", name, guess);
        else
            snprintf(why, size, "unknown op '%.60s'", name);
        return refuse(L, why);
    }
    n->name = (char *)tr_ops[n->op].name;
    if (lua_type(L, 2) != LUA_TTABLE) {
        snprintf(why, size, "the inputs are %s; they must be a list of tensors",
                 tr_lua_describe(L, 2, got, sizeof got));
        return refuse(L, why);
    }
    size_t count = lua_objlen(L, 2);
    n->n_in = count > 3 ? 4 : (int)count; /* more than any op takes: tr_op_check says so */
    const struct tr_tensor *in[3] = {NULL, NULL, NULL};
    for (int k = 0; k < n->n_in && k < 3; k++) {
        char what[32];
        snprintf(what, sizeof what, "input %d", k + 1);
        lua_rawgeti(L, 2, k + 1);
        int rc = read_handle(L, lua_gettop(L), what, &sc.tensors[k], why, size);
        lua_pop(L, 1);
        if (rc != 0)
            return refuse(L, why);
        n->in[k] = k;
        in[k] = &sc.tensors[k];
    }
    sc.n_tensors = n->n_in < 3 ? n->n_in : 3;
    int type = lua_type(L, 3);
    if (type != LUA_TNIL && type != LUA_TTABLE) {
        snprintf(why, size, "the attributes are %s; they must be a table (eps = 1e-5, ...)",
                 tr_lua_describe(L, 3, got, sizeof got));
        return refuse(L, why);
    }
    if (type == LUA_TNIL) {
        lua_newtable(L);
        lua_replace(L, 3);
    }
    if (tr_node_attrs_read(L, 3, tr_ops[n->op].attrs, n, tensor_attr, &sc, why, size) != 0)
        return refuse(L, why);
    n->out = -1;
    struct tr_graph g;
    memset(&g, 0, sizeof g);
    g.tensors = sc.tensors;
    g.n_tensors = sc.n_tensors;
    g.nodes = sc.has_before ? &sc.nodes[0] : &sc.nodes[1];
    g.n_nodes = sc.has_before ? 2 : 1;
    g.loss = g.logits = -1;
    g.training = 1;
    struct tr_op_shape s;
    if (tr_op_check(&g, n, in, &s, why) != 0)
        return refuse(L, why);
    lua_createtable(L, s.ndim, 0);
    for (int d = 0; d < s.ndim; d++) {
        lua_pushnumber(L, (lua_Number)s.shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
    return 1;
}

void tr_recipe_push_ops(lua_State *L)
{
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, tr_recipe_op_shape);
    lua_setfield(L, -2, "shape");
}
