#include "model.h"
#include "adapters.h"

#include "../config/recipe_ops.h"
#include "../util/util.h"

#include <ctype.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The graph a builder returns is data that anyone may have written (an
 * inline `build` function returns any table it likes): every number is
 * checked for range and integer-ness before it becomes an index or a size,
 * and the tables are read raw, so no metamethod of the recipe runs here,
 * outside the limits of recipe code. */

/* Far beyond any model; keeps every size sum of the plan inside 64 bits. */
#define MAX_TENSORS (1 << 18)
#define MAX_DIM INT32_MAX
#define MAX_NUMEL ((int64_t)1 << 40)

struct reader {
    lua_State *L;
    tr_err *err;
    int batch;
    int graph_ref; /* registry reference to the builder's result */
    int rc;
    struct tr_graph *g;
    const struct tr_lora_config *lora; /* adapters to add before the check, or NULL */
    enum tr_dtype compute;
    int located;                       /* the error names its recipe line already */
};

/* Push t[key] without metamethods; t is an absolute index. */
static int raw_field(lua_State *L, int t, const char *key)
{
    lua_pushstring(L, key);
    lua_rawget(L, t);
    return lua_type(L, -1);
}

/* A tensor id at idx (1-based in Lua) as a 0-based index. */
static int tensor_id(struct reader *rd, int idx, const char *what, int *out)
{
    int64_t v;
    if (tr_lua_whole_number(rd->L, idx, 1, rd->g->n_tensors, &v)) {
        *out = (int)v - 1;
        return TR_OK;
    }
    char got[96];
    return tr_fail(rd->err, "model: %s is %s; it must be a tensor id, a whole number from 1 to %d",
                   what, tr_lua_describe(rd->L, idx, got, sizeof got), rd->g->n_tensors);
}

/* An optional string field that must be one of `choices` (NULL-terminated);
 * the index of the choice, or fallback when absent. */
static int choice_field(struct reader *rd, int t, const char *key, const char *const *choices, int fallback,
                        const char *owner, int *out)
{
    lua_State *L = rd->L;
    int type = raw_field(L, t, key);
    if (type == LUA_TNIL && fallback >= 0) {
        lua_pop(L, 1);
        *out = fallback;
        return TR_OK;
    }
    if (type == LUA_TSTRING) {
        const char *s = lua_tostring(L, -1);
        for (int i = 0; choices[i]; i++)
            if (strcmp(s, choices[i]) == 0) {
                lua_pop(L, 1);
                *out = i;
                return TR_OK;
            }
    }
    char got[96], list[160] = "";
    for (int i = 0; choices[i]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "", choices[i]);
    tr_fail(rd->err, "model: %s: '%s' is %s; expected one of %s", owner, key,
            tr_lua_describe(L, -1, got, sizeof got), list);
    lua_pop(L, 1);
    return TR_ERROR;
}

static int by_name(const void *a, const void *b)
{
    const struct tr_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* A parameter's initialisation and weight decay (tensor table at e). */
static int read_param_init(struct reader *rd, int e, const char *owner, struct tr_tensor *t)
{
    lua_State *L = rd->L;
    static const char *const inits[] = {"normal", "ones", "zeros", NULL};
    static const enum tr_init init_of[] = {TR_INIT_NORMAL, TR_INIT_ONES, TR_INIT_ZEROS};
    int init;
    if (choice_field(rd, e, "init", inits, 0, owner, &init) != TR_OK)
        return TR_ERROR;
    t->init = init_of[init];
    t->init_std = 0.02;
    int type = raw_field(L, e, "std");
    if (type != LUA_TNIL) {
        double std = lua_tonumber(L, -1);
        if (type != LUA_TNUMBER || !(std >= 0 && std <= 1e6))
            return tr_fail(rd->err, "model: %s: 'std' must be a number from 0 to 1e6", owner);
        t->init_std = std;
    }
    lua_pop(L, 1);
    raw_field(L, e, "decay");
    t->decay = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return TR_OK;
}

/* A tensor's shape (tensor table at e) into shape[], its length in *ndim. */
static int read_shape(struct reader *rd, int e, const char *owner, int64_t shape[TR_MAX_DIMS],
                      size_t *ndim)
{
    lua_State *L = rd->L;
    if (raw_field(L, e, "shape") != LUA_TTABLE)
        return tr_fail(rd->err, "model: %s has no shape (a list of 1 to %d dimensions)", owner, TR_MAX_DIMS);
    *ndim = lua_objlen(L, -1);
    if (*ndim < 1 || *ndim > TR_MAX_DIMS)
        return tr_fail(rd->err, "model: %s has %zu dimensions; tensors have 1 to %d", owner, *ndim, TR_MAX_DIMS);
    int64_t numel = 1;
    for (int d = 0; d < (int)*ndim; d++) {
        lua_rawgeti(L, -1, d + 1);
        if (!tr_lua_whole_number(L, -1, 1, MAX_DIM, &shape[d])) {
            char got[96];
            return tr_fail(rd->err, "model: %s: dimension %d is %s; dimensions are whole numbers from 1 to %d",
                           owner, d + 1, tr_lua_describe(L, -1, got, sizeof got), MAX_DIM);
        }
        lua_pop(L, 1);
        if (__builtin_mul_overflow(numel, shape[d], &numel) || numel > MAX_NUMEL)
            return tr_fail(rd->err, "model: %s has more than 2^40 elements; no device holds that", owner);
    }
    lua_pop(L, 1); /* shape */
    return TR_OK;
}

/* Tensor i (1-based) of the list at ti: its table is pushed, read into a
 * new tensor of the graph, and popped. */
static int read_tensor(struct reader *rd, int ti, int i)
{
    lua_State *L = rd->L;
    static const char *const roles[] = {"input", "param", "activation", "buffer", NULL};
    static const enum tr_role role_of[] = {TR_ROLE_INPUT, TR_ROLE_PARAM, TR_ROLE_ACTIVATION,
                                           TR_ROLE_BUFFER};
    static const char *const dtypes[] = {"f32", "i32", NULL};
    lua_rawgeti(L, ti, i);
    int e = lua_gettop(L);
    char owner[160];
    snprintf(owner, sizeof owner, "tensor %d", i);
    if (lua_type(L, e) != LUA_TTABLE)
        return tr_fail(rd->err, "model: %s is a %s, not a tensor table", owner, lua_typename(L, lua_type(L, e)));
    if (raw_field(L, e, "name") != LUA_TSTRING || lua_objlen(L, -1) == 0 || lua_objlen(L, -1) > 255 ||
        strlen(lua_tostring(L, -1)) != lua_objlen(L, -1))
        return tr_fail(rd->err, "model: %s has no name (a string of 1 to 255 characters)", owner);
    const char *name = lua_tostring(L, -1); /* the tensor table keeps it alive */
    lua_pop(L, 1);
    snprintf(owner, sizeof owner, "tensor %d ('%s')", i, name);
    int role, dtype;
    if (choice_field(rd, e, "role", roles, -1, owner, &role) != TR_OK ||
        choice_field(rd, e, "dtype", dtypes, 0, owner, &dtype) != TR_OK)
        return TR_ERROR;
    if (role_of[role] != TR_ROLE_INPUT && dtype != 0)
        return tr_fail(rd->err, "model: %s: only inputs may be \"i32\"; a %s is \"f32\"", owner, roles[role]);
    int64_t shape[TR_MAX_DIMS];
    size_t ndim = 0;
    if (read_shape(rd, e, owner, shape, &ndim) != TR_OK)
        return TR_ERROR;
    int id = tr_graph_add_tensor(rd->g, name, role_of[role], dtype == 1 ? TR_I32 : TR_F32, (int)ndim, shape);
    struct tr_tensor *t = &rd->g->tensors[id];
    if (t->role == TR_ROLE_PARAM && read_param_init(rd, e, owner, t) != TR_OK)
        return TR_ERROR;
    lua_pop(L, 1); /* the tensor */
    return TR_OK;
}

/* checkpoints and exports find parameters by name: two with one name would
 * load one tensor's values into the other */
static int unique_names(struct reader *rd)
{
    const struct tr_graph *g = rd->g;
    const struct tr_tensor **sorted = tr_xcalloc((size_t)g->n_tensors, sizeof *sorted);
    for (int i = 0; i < g->n_tensors; i++)
        sorted[i] = &g->tensors[i];
    qsort(sorted, (size_t)g->n_tensors, sizeof *sorted, by_name);
    for (int i = 1; i < g->n_tensors; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            tr_fail(rd->err, "model: two tensors are named '%s'; names must be unique", sorted[i]->name);
            free(sorted);
            return TR_ERROR;
        }
    free(sorted);
    return TR_OK;
}

static int read_tensors(struct reader *rd, int gi)
{
    lua_State *L = rd->L;
    if (raw_field(L, gi, "tensors") != LUA_TTABLE) {
        lua_pop(L, 1);
        return tr_fail(rd->err, "model: the graph has no list of tensors (return g:finish{...} from the builder)");
    }
    int ti = lua_gettop(L);
    size_t nt = lua_objlen(L, ti);
    if (nt < 1 || nt > MAX_TENSORS) {
        lua_pop(L, 1);
        return tr_fail(rd->err, "model: the graph has %zu tensors; a model has 1 to %d", nt, MAX_TENSORS);
    }
    for (int i = 1; i <= (int)nt; i++)
        if (read_tensor(rd, ti, i) != TR_OK)
            return TR_ERROR;
    lua_pop(L, 1); /* tensors */
    return unique_names(rd);
}

/* A tensor attribute (batchnorm's buffer): a tensor id of this graph. */
static int tensor_attr(lua_State *L, int idx, const struct tr_attr_desc *d, void *ud, int *out,
                       char *why, size_t size)
{
    struct reader *rd = ud;
    int64_t v;
    if (tr_lua_whole_number(L, idx, 1, rd->g->n_tensors, &v)) {
        *out = (int)v - 1;
        return 0;
    }
    char got[96];
    snprintf(why, size, "the %s is %s; it must be a tensor id, a whole number from 1 to %d",
             d->name, tr_lua_describe(L, idx, got, sizeof got), rd->g->n_tensors);
    return -1;
}

/* Every node attribute the op table lists (kernels/ops.h, tr_attrs), in
 * its order, each checked by its kind (config/recipe_ops.c, which reads
 * them for the builders' answers too); an attribute the node's op does not
 * read is checked all the same. */
static int read_attrs(struct reader *rd, int e, const char *owner, struct tr_node *n)
{
    char why[TR_OP_WHY_SIZE];
    if (tr_node_attrs_read(rd->L, e, (1u << TR_ATTR_COUNT) - 1, n, tensor_attr, rd, why,
                           sizeof why) != 0)
        return tr_fail(rd->err, "model: %s: %s", owner, why);
    return TR_OK;
}

/* A node's op, name, output and inputs (node table at e, node i). */
static int read_node_io(struct reader *rd, int e, int i, char *owner, size_t owner_size,
                        struct tr_node *n)
{
    lua_State *L = rd->L;
    const char *op = raw_field(L, e, "op") == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    lua_pop(L, 1);
    if (!op || !tr_op_from_name(op, &n->op))
        return tr_fail(rd->err, "model: node %d has an unknown op '%s'", i, op ? op : "?");
    n->name = raw_field(L, e, "name") == LUA_TSTRING ? (char *)lua_tostring(L, -1) : NULL;
    lua_pop(L, 1);
    snprintf(owner, owner_size, "node %d (%s '%s')", i, op, n->name ? n->name : op);

    raw_field(L, e, "output");
    char what[200];
    snprintf(what, sizeof what, "%s: the output", owner);
    if (tensor_id(rd, -1, what, &n->out) != TR_OK)
        return TR_ERROR;
    lua_pop(L, 1);

    if (raw_field(L, e, "inputs") != LUA_TTABLE)
        return tr_fail(rd->err, "model: %s has no list of inputs", owner);
    size_t n_in = lua_objlen(L, -1);
    if (n_in < 1 || n_in > 3)
        return tr_fail(rd->err, "model: %s has %zu inputs; ops take 1 to 3", owner, n_in);
    n->n_in = (int)n_in;
    for (int k = 0; k < n->n_in; k++) {
        lua_rawgeti(L, -1, k + 1);
        snprintf(what, sizeof what, "%s: input %d", owner, k + 1);
        if (tensor_id(rd, -1, what, &n->in[k]) != TR_OK)
            return TR_ERROR;
        lua_pop(L, 1);
    }
    lua_pop(L, 1); /* inputs */
    return TR_OK;
}

static int read_nodes(struct reader *rd, int gi)
{
    lua_State *L = rd->L;
    if (raw_field(L, gi, "nodes") != LUA_TTABLE) {
        lua_pop(L, 1);
        return tr_fail(rd->err, "model: the graph has no list of nodes (return g:finish{...} from the builder)");
    }
    int ni = lua_gettop(L);
    size_t nn = lua_objlen(L, ni);
    if (nn > MAX_TENSORS)
        return tr_fail(rd->err, "model: the graph has %zu nodes; a model has at most %d", nn, MAX_TENSORS);
    for (int i = 1; i <= (int)nn; i++) {
        lua_rawgeti(L, ni, i);
        int e = lua_gettop(L);
        char owner[160];
        snprintf(owner, sizeof owner, "node %d", i);
        if (lua_type(L, e) != LUA_TTABLE)
            return tr_fail(rd->err, "model: %s is a %s, not a node table", owner, lua_typename(L, lua_type(L, e)));
        struct tr_node n;
        memset(&n, 0, sizeof n);
        if (read_node_io(rd, e, i, owner, sizeof owner, &n) != TR_OK ||
            read_attrs(rd, e, owner, &n) != TR_OK)
            return TR_ERROR;
        tr_graph_add_node(rd->g, &n);
        lua_pop(L, 1); /* the node */
    }
    lua_pop(L, 1); /* nodes */
    return TR_OK;
}

static int read_outputs(struct reader *rd, int gi)
{
    lua_State *L = rd->L;
    struct tr_graph *g = rd->g;
    raw_field(L, gi, "loss");
    if (tensor_id(rd, -1, "the loss", &g->loss) != TR_OK)
        return TR_ERROR;
    lua_pop(L, 1);
    if (raw_field(L, gi, "logits") == LUA_TNIL)
        g->logits = -1;
    else if (tensor_id(rd, -1, "the logits", &g->logits) != TR_OK)
        return TR_ERROR;
    lua_pop(L, 1);

    if (raw_field(L, gi, "inputs") != LUA_TTABLE)
        return tr_fail(rd->err, "model: the graph has no list of inputs");
    size_t n = lua_objlen(L, -1);
    if (n != 2)
        return tr_fail(rd->err, "model: declares %zu inputs; trainrun feeds two (the sample and its "
                       "targets, in that order)", n);
    g->n_inputs = 2;
    for (int k = 0; k < g->n_inputs; k++) {
        lua_rawgeti(L, -1, k + 1);
        char what[32];
        snprintf(what, sizeof what, "input %d", k + 1);
        if (tensor_id(rd, -1, what, &g->inputs[k]) != TR_OK)
            return TR_ERROR;
        lua_pop(L, 1);
        const struct tr_tensor *t = &g->tensors[g->inputs[k]];
        if (t->role != TR_ROLE_INPUT)
            return tr_fail(rd->err, "model: input %d is tensor '%s', which is not an input (declare it with g:input)",
                           k + 1, t->name);
    }
    lua_pop(L, 1);
    if (g->inputs[0] == g->inputs[1])
        return tr_fail(rd->err, "model: the sample and the targets are the same tensor '%s'",
                       g->tensors[g->inputs[0]].name);
    /* an input that is not fed would be read uninitialised */
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == TR_ROLE_INPUT && i != g->inputs[0] && i != g->inputs[1])
            return tr_fail(rd->err, "model: tensor '%s' is an input but not one of the graph's two inputs",
                           g->tensors[i].name);
    return TR_OK;
}

/* Runs under lua_cpcall, as running out of memory while reading is a Lua
 * error; the graph so far stays in rd->g for the caller to free. */
static int read_protected(lua_State *L)
{
    struct reader *rd = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, rd->graph_ref);
    int gi = lua_gettop(L);
    rd->g = tr_graph_new(rd->batch);
    rd->rc = TR_ERROR;
    if (read_tensors(rd, gi) != TR_OK || read_nodes(rd, gi) != TR_OK || read_outputs(rd, gi) != TR_OK)
        return 0;
    if (tr_adapters_apply(rd->g, rd->lora, rd->compute, rd->err) != TR_OK) {
        rd->located = 1;
        return 0;
    }
    if (tr_graph_check(rd->g, rd->err) != TR_OK) {
        tr_err_prefix(rd->err, "model");
        return 0;
    }
    rd->rc = TR_OK;
    return 0;
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

/* A builder's error about one of its options ("gpt: unknown option 'x'")
 * came out at the model's line; the option may have been set elsewhere (a
 * child recipe, the command line: model.x=1), so point at where it was. */
static void locate_option(struct tr_recipe *r, const char *loc, tr_err *err)
{
    size_t n = strlen(loc);
    const char *q = strstr(err->msg, "option '");
    if (strncmp(err->msg, loc, n) != 0 || strncmp(err->msg + n, ": ", 2) != 0 || !q)
        return;
    q += 8;
    const char *e = strchr(q, '\'');
    if (!e || e - q > 200)
        return;
    char path[256];
    snprintf(path, sizeof path, "model.%.*s", (int)(e - q), q);
    struct tr_value *v = tr_value_get(tr_recipe_root(r), path);
    struct tr_origin o;
    if (!v || !tr_recipe_origin(r, path, &o))
        return;
    char at[600];
    tr_origin_format(&o, at, sizeof at);
    if (strcmp(at, loc) == 0)
        return;
    char msg[sizeof err->msg];
    size_t a = strlen(at), rest = strlen(err->msg + n + 2);
    if (a + 2 + rest >= sizeof msg)
        return;
    memcpy(msg, at, a);
    memcpy(msg + a, ": ", 2);
    memcpy(msg + a + 2, err->msg + n + 2, rest + 1);
    memcpy(err->msg, msg, a + 2 + rest + 1);
}

static struct tr_graph *build(struct tr_recipe *r, int batch, const struct tr_lora_config *lora,
                               enum tr_dtype compute, tr_err *err)
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
    raw_field(L, lua_gettop(L), "build");
    lua_remove(L, -2);
    tr_recipe_push_resolved(r);
    raw_field(L, lua_gettop(L), "model");
    lua_remove(L, -2);
    if (lua_isnil(L, -1)) {
        tr_fail(err, "%s: the recipe has no model (model = gpt { ... })", tr_recipe_path(r));
        goto done;
    }
    lua_pushinteger(L, batch);
    if (tr_recipe_pcall(r, 2, 1, loc, err) != TR_OK) {
        if (!has_location(err->msg)) /* the builder's own file:line is the precise one */
            tr_err_prefix(err, "%s", loc);
        locate_option(r, loc, err);
        goto done;
    }
    if (!lua_istable(L, -1)) {
        tr_fail(err, "%s: the model builder did not return a graph (end it with g:finish{...})", loc);
        goto done;
    }
    struct reader rd = {.L = L, .err = err, .batch = batch, .rc = TR_ERROR, .lora = lora,
                        .compute = compute};
    rd.graph_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (lua_cpcall(L, read_protected, &rd) != 0) {
        tr_fail(err, "out of memory reading the model's graph");
        rd.rc = TR_ERROR;
    } else if (rd.rc != TR_OK && !rd.located) {
        tr_err_prefix(err, "%s", loc);
    }
    luaL_unref(L, LUA_REGISTRYINDEX, rd.graph_ref);
    if (rd.rc != TR_OK) {
        tr_graph_free(rd.g, NULL);
        goto done;
    }
    g = rd.g;
done:
    lua_settop(L, top);
    return g;
}

struct tr_graph *tr_model_build(struct tr_recipe *r, int batch, tr_err *err)
{
    return build(r, batch, NULL, TR_F32, err);
}

struct tr_graph *tr_model_build_run(const struct tr_config *cfg, int batch, enum tr_dtype compute,
                                    tr_err *err)
{
    return build(cfg->recipe, batch, &cfg->lora, compute, err);
}
