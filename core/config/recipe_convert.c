/*
 * The recipe's resolved Lua table converted into the C tree of value.h,
 * each value with the origin recipe.lua scanned for it (recipe_convert.h).
 * Tables are walked in key order (list positions, then names), so the
 * tree is sorted as tr_value_put keeps it; cycles, nesting past 200 levels,
 * keys that are neither names nor list positions and values C cannot hold
 * are errors naming the key's file:line.
 */
#define _XOPEN_SOURCE 700 /* strdup */
#include "recipe_convert.h"
#include "../util/util.h"

#include <lauxlib.h>
#include <lua.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A recipe's C tree holds at most this many values (a config, not a data set). */
#define TR_RECIPE_MAX_VALUES 1000000L

struct key {
    int is_index;
    lua_Number index;
    char *name;
};

static int compare_keys(const void *pa, const void *pb)
{
    const struct key *a = pa, *b = pb;
    if (a->is_index != b->is_index)
        return a->is_index ? -1 : 1;
    if (a->is_index)
        return (a->index > b->index) - (a->index < b->index);
    return strcmp(a->name, b->name);
}

static void push_key(lua_State *L, const struct key *k)
{
    if (k->is_index)
        lua_pushnumber(L, k->index);
    else
        lua_pushstring(L, k->name);
}

static void fail_at(struct tr_convert *c, const struct tr_origin *o, const char *path, const char *what)
{
    char where[1024];
    tr_origin_format(o, where, sizeof where);
    if (path[0])
        tr_fail(c->err, "%s: \"%s\" %s", where, path, what);
    else
        tr_fail(c->err, "%s: the recipe table %s", where, what);
    c->failed = 1;
}

/* Origin of key k of the table at index t, from the origins table at index
 * origins; strings stay owned by Lua (tr_value_new copies them). */
static struct tr_origin read_origin(lua_State *L, int origins, int t, const struct key *k,
                                    const struct tr_origin *parent, const char **text)
{
    struct tr_origin o = *parent;
    *text = NULL;
    lua_pushvalue(L, t);
    lua_rawget(L, origins);
    if (lua_istable(L, -1)) {
        push_key(L, k);
        lua_rawget(L, -2);
        if (lua_istable(L, -1)) {
            lua_getfield(L, -1, "cli");
            int cli = lua_toboolean(L, -1);
            lua_pop(L, 1);
            if (cli) {
                o.kind = TR_FROM_CLI;
                o.file = NULL;
                o.line = 0;
                lua_getfield(L, -1, "text");
                *text = lua_tostring(L, -1); /* kept alive by the origins table */
                lua_pop(L, 1);
            } else {
                o.kind = TR_FROM_RECIPE;
                lua_getfield(L, -1, "file");
                if (lua_isstring(L, -1))
                    o.file = lua_tostring(L, -1);
                lua_pop(L, 1);
                lua_getfield(L, -1, "line");
                o.line = (int)lua_tointeger(L, -1);
                lua_pop(L, 1);
            }
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return o;
}

static void append_path(char *buf, size_t size, const char *parent, const char *key)
{
    if (parent[0])
        snprintf(buf, size, "%s.%s", parent, key);
    else
        snprintf(buf, size, "%s", key);
}

static const char *type_word(int t)
{
    switch (t) {
    case LUA_TUSERDATA:
    case LUA_TLIGHTUSERDATA: return "userdata";
    case LUA_TTHREAD: return "coroutine";
    default: return "value of an unsupported type";
    }
}

/* The table at index t is not on the path to itself, nor too deep. */
static int enter_table(struct tr_convert *c, int t, struct tr_value *node, const char *path,
                       int depth)
{
    const void *self = lua_topointer(c->L, t);
    if (depth >= TR_RECIPE_MAX_DEPTH) {
        fail_at(c, &node->origin, path, "is nested too deeply (more than 200 levels)");
        return -1;
    }
    for (int i = 0; i < depth; i++) {
        if (c->tables[i] == self) {
            fail_at(c, &node->origin, path, "contains itself (a table cycle); recipes must be trees");
            return -1;
        }
    }
    c->tables[depth] = self;
    return 0;
}

/* The key at index -2 as a name or a list position; anything else fails. */
static int read_key(struct tr_convert *c, struct tr_value *node, const char *path, struct key *k)
{
    lua_State *L = c->L;
    int kt = lua_type(L, -2);
    if (kt == LUA_TNUMBER) {
        lua_Number d = lua_tonumber(L, -2);
        if (d >= 1 && d <= INT_MAX && d == floor(d)) {
            k->is_index = 1;
            k->index = d;
        } else {
            char what[128];
            snprintf(what, sizeof what, "has the key %.17g; keys must be names or list positions 1, 2, ...", d);
            fail_at(c, &node->origin, path, what);
        }
    } else if (kt == LUA_TSTRING) {
        k->name = strdup(lua_tostring(L, -2));
        if (!k->name) {
            tr_fail(c->err, "out of memory converting the recipe");
            c->failed = 1;
        }
    } else {
        char what[128];
        snprintf(what, sizeof what, "has a key that is a %s; keys must be names or list positions 1, 2, ...",
                 lua_typename(L, kt));
        fail_at(c, &node->origin, path, what);
    }
    return c->failed ? -1 : 0;
}

/* The keys of the table at index t, sorted; *n of them (NULL on failure). */
static struct key *table_keys(struct tr_convert *c, int t, struct tr_value *node,
                              const char *path, size_t *n_out)
{
    lua_State *L = c->L;
    size_t n = 0, cap = 16;
    struct key *keys = malloc(cap * sizeof *keys);
    if (!keys) {
        tr_fail(c->err, "out of memory converting the recipe");
        c->failed = 1;
        return NULL;
    }
    lua_pushnil(L);
    while (!c->failed && lua_next(L, t)) {
        struct key k = {0};
        int bad = read_key(c, node, path, &k);
        lua_pop(L, 1);
        if (bad) {
            lua_pop(L, 1);
            free(k.name);
            break;
        }
        if (n == cap) {
            struct key *grown = realloc(keys, 2 * cap * sizeof *keys);
            if (!grown) {
                free(k.name);
                lua_pop(L, 1);
                tr_fail(c->err, "out of memory converting the recipe");
                c->failed = 1;
                break;
            }
            keys = grown;
            cap *= 2;
        }
        keys[n++] = k;
    }
    if (!c->failed)
        qsort(keys, n, sizeof *keys, compare_keys);
    *n_out = n;
    return keys;
}

static void convert_table(struct tr_convert *c, int t, struct tr_value *node, const char *path,
                          int depth);

/* The value at the top of the stack, key k of `node`, converted into a
 * child of node; returns -1 to stop the table (too many values, no
 * memory), 0 to go on (after a failure too, which c->failed records). */
static int convert_value(struct tr_convert *c, struct tr_value *node, const struct key *k,
                         const char *key, struct tr_origin o, const char *text,
                         const char *child_path, int depth)
{
    lua_State *L = c->L;
    int vt = lua_type(L, -1);
    enum tr_value_type type;
    switch (vt) {
    case LUA_TBOOLEAN: type = TR_V_BOOL; break;
    case LUA_TNUMBER: type = TR_V_NUMBER; break;
    case LUA_TSTRING: type = TR_V_STRING; break;
    case LUA_TTABLE: type = TR_V_TABLE; break;
    case LUA_TFUNCTION: type = TR_V_FUNCTION; break;
    default: {
        char what[160];
        snprintf(what, sizeof what,
                 "is a %s; recipe values must be numbers, strings, booleans, tables or functions",
                 type_word(vt));
        fail_at(c, &o, child_path, what);
        return 0;
    }
    }
    if (++c->values > TR_RECIPE_MAX_VALUES) {
        fail_at(c, &o, child_path, "is one value too many: a recipe holds at most 1000000 values "
                                   "(it is a configuration; read data through a data plugin)");
        return -1;
    }
    struct tr_value *child = tr_value_new(type, key, o);
    if (!child) {
        tr_fail(c->err, "out of memory converting the recipe");
        c->failed = 1;
        return -1;
    }
    child->is_list_item = k->is_index;
    tr_value_put(node, child);
    if (text)
        tr_value_set_text(child, text);
    if (type == TR_V_BOOL)
        child->boolean = lua_toboolean(L, -1);
    else if (type == TR_V_NUMBER)
        child->number = lua_tonumber(L, -1);
    else if (type == TR_V_STRING)
        tr_value_set_string(child, lua_tostring(L, -1));
    else if (type == TR_V_TABLE)
        convert_table(c, lua_gettop(L), child, child_path, depth + 1);
    return 0;
}

/* Fill `node` (a TR_V_TABLE) from the Lua table at index t. */
static void convert_table(struct tr_convert *c, int t, struct tr_value *node, const char *path,
                          int depth)
{
    lua_State *L = c->L;
    if (enter_table(c, t, node, path, depth) != 0)
        return;
    size_t n = 0;
    struct key *keys = table_keys(c, t, node, path, &n);
    if (!keys)
        return;
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->origins_ref);
    int origins = lua_gettop(L);
    for (size_t i = 0; i < n && !c->failed; i++) {
        char name[32];
        const char *key = keys[i].name;
        if (keys[i].is_index) {
            snprintf(name, sizeof name, "%d", (int)keys[i].index);
            key = name;
        }
        char child_path[1024];
        append_path(child_path, sizeof child_path, path, key);

        const char *text;
        struct tr_origin o = read_origin(L, origins, t, &keys[i], &node->origin, &text);
        push_key(L, &keys[i]);
        lua_rawget(L, t);
        int stop = convert_value(c, node, &keys[i], key, o, text, child_path, depth);
        lua_pop(L, 1);
        if (stop)
            break;
    }
    lua_pop(L, 1); /* origins */
    for (size_t i = 0; i < n; i++)
        free(keys[i].name);
    free(keys);
}

/* Runs under lua_cpcall so that running out of memory inside the Lua API is
 * an error, not a panic. */
int tr_recipe_convert_protected(lua_State *L)
{
    struct tr_convert *c = lua_touserdata(L, 1);
    struct tr_origin root_origin = {TR_FROM_RECIPE, c->top_file, 0};
    c->root = tr_value_new(TR_V_TABLE, NULL, root_origin);
    if (!c->root) {
        tr_fail(c->err, "out of memory converting the recipe");
        c->failed = 1;
        return 0;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->result_ref);
    convert_table(c, lua_gettop(L), c->root, "", 0);
    lua_pop(L, 1);
    return 0;
}
