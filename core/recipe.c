/*
 * Recipes: the C side.  Most of the loader (sandbox, extends/include, deep
 * merge, overrides, origin scanning) lives in lua/trainrun/recipe.lua; this
 * file gives it the few primitives plain Lua lacks (text-only loading,
 * realpath, an instruction budget), then converts the resolved table into
 * the C tree of value.h.
 */
#define _XOPEN_SOURCE 700 /* strdup, realpath */
#include "recipe.h"
#include "suggest.h"

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A recipe that runs longer than this is almost surely looping forever. */
#define TR_RECIPE_INSTRUCTION_LIMIT 50000000L
#define TR_RECIPE_HOOK_EVERY 10000
/* Deeper nesting than this in a recipe table is a mistake, not a config. */
#define TR_RECIPE_MAX_DEPTH 200

struct tr_recipe {
    lua_State *L;
    char *path;
    struct tr_value *root;
    int resolved_ref; /* registry reference to the resolved Lua table */
    int require_ref;  /* registry reference to the loader's require for the host */
};

/* ---- instruction budget ------------------------------------------------- */

struct budget {
    long used;
    int timed_out;
};

/* Loading runs on one thread from start to end; the hook finds its budget here. */
static _Thread_local struct budget *active_budget;

static void count_hook(lua_State *L, lua_Debug *ar)
{
    struct budget *b = active_budget;
    if (!b)
        return;
    b->used += TR_RECIPE_HOOK_EVERY;
    if (b->used <= TR_RECIPE_INSTRUCTION_LIMIT)
        return;
    b->timed_out = 1;
    if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
        luaL_error(L, "%s:%d: recipe took too long (infinite loop?)", ar->short_src, ar->currentline);
    luaL_error(L, "recipe took too long (infinite loop?)");
}

/* ---- primitives for recipe.lua --------------------------------------------- */

/* load_text(src, name) -> function | nil, message.  Source text only. */
static int host_load_text(lua_State *L)
{
    size_t len;
    const char *src = luaL_checklstring(L, 1, &len);
    const char *name = luaL_checkstring(L, 2);
    if (len > 0 && src[0] == LUA_SIGNATURE[0]) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: is precompiled Lua bytecode; recipes must be Lua source text", name);
        return 2;
    }
    lua_pushfstring(L, "@%s", name);
    int rc = luaL_loadbufferx(L, src, len, lua_tostring(L, -1), "t");
    if (rc != 0) {
        lua_pushnil(L);
        lua_insert(L, -2);
        return 2;
    }
    return 1;
}

static int host_realpath(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    char *real = realpath(path, NULL);
    if (!real) {
        lua_pushnil(L);
        return 1;
    }
    lua_pushstring(L, real);
    free(real);
    return 1;
}

static int host_is_file(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    struct stat st;
    lua_pushboolean(L, stat(path, &st) == 0 && S_ISREG(st.st_mode));
    return 1;
}

/* suggest(word, {candidates}) -> closest | nil */
static int host_suggest(lua_State *L)
{
    const char *word = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    size_t n = lua_objlen(L, 2);
    const char **candidates = lua_newuserdata(L, (n ? n : 1) * sizeof *candidates);
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, 2, (int)i + 1);
        candidates[i] = lua_tostring(L, -1); /* the table keeps the string alive */
        lua_pop(L, 1);
    }
    const char *best = tr_suggest(word, candidates, n);
    if (best)
        lua_pushstring(L, best);
    else
        lua_pushnil(L);
    return 1;
}

static int host_timed_out(lua_State *L)
{
    lua_pushboolean(L, active_budget && active_budget->timed_out);
    return 1;
}

static void push_host(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"load_text", host_load_text}, {"realpath", host_realpath}, {"is_file", host_is_file},
        {"suggest", host_suggest},     {"timed_out", host_timed_out}, {NULL, NULL},
    };
    lua_newtable(L);
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushcfunction(L, f->func);
        lua_setfield(L, -2, f->name);
    }
}

static void set_string_field(lua_State *L, const char *key, const char *value)
{
    if (!value)
        return;
    lua_pushstring(L, value);
    lua_setfield(L, -2, key);
}

static void push_config(lua_State *L, const char *path, const char *const *overrides, int n_overrides,
                        const struct tr_recipe_paths *paths)
{
    lua_newtable(L);
    set_string_field(L, "path", path);
    set_string_field(L, "lua_dir", paths->lua_dir);
    set_string_field(L, "extra_lua_dir", paths->extra_lua_dir);
    set_string_field(L, "recipe_dir", paths->recipe_dir);
    set_string_field(L, "recipe_path", getenv("TRAINRUN_RECIPE_PATH"));
    lua_newtable(L);
    for (int i = 0; i < n_overrides; i++) {
        lua_pushstring(L, overrides[i] ? overrides[i] : "");
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "overrides");
}

/* ---- conversion into the C tree ------------------------------------------- */

struct convert {
    lua_State *L;
    tr_err *err;
    int failed;
    int origins_ref;
    int result_ref;
    const char *top_file;
    struct tr_value *root;
    const void *tables[TR_RECIPE_MAX_DEPTH]; /* tables on the current path, for cycles */
};

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

static void fail_at(struct convert *c, const struct tr_origin *o, const char *path, const char *what)
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

/* Fill `node` (a TR_V_TABLE) from the Lua table at index t. */
static void convert_table(struct convert *c, int t, struct tr_value *node, const char *path, int depth)
{
    lua_State *L = c->L;
    const void *self = lua_topointer(L, t);
    if (depth >= TR_RECIPE_MAX_DEPTH) {
        fail_at(c, &node->origin, path, "is nested too deeply (more than 200 levels)");
        return;
    }
    for (int i = 0; i < depth; i++) {
        if (c->tables[i] == self) {
            fail_at(c, &node->origin, path, "contains itself (a table cycle); recipes must be trees");
            return;
        }
    }
    c->tables[depth] = self;

    size_t n = 0, cap = 16;
    struct key *keys = malloc(cap * sizeof *keys);
    if (!keys) {
        tr_fail(c->err, "out of memory converting the recipe");
        c->failed = 1;
        return;
    }
    lua_pushnil(L);
    while (!c->failed && lua_next(L, t)) {
        struct key k = {0};
        int kt = lua_type(L, -2);
        if (kt == LUA_TNUMBER) {
            lua_Number d = lua_tonumber(L, -2);
            if (d >= 1 && d <= INT_MAX && d == floor(d)) {
                k.is_index = 1;
                k.index = d;
            } else {
                char what[128];
                snprintf(what, sizeof what, "has the key %.17g; keys must be names or list positions 1, 2, ...", d);
                fail_at(c, &node->origin, path, what);
            }
        } else if (kt == LUA_TSTRING) {
            k.name = strdup(lua_tostring(L, -2));
            if (!k.name) {
                tr_fail(c->err, "out of memory converting the recipe");
                c->failed = 1;
            }
        } else {
            char what[128];
            snprintf(what, sizeof what, "has a key that is a %s; keys must be names or list positions 1, 2, ...",
                     lua_typename(L, kt));
            fail_at(c, &node->origin, path, what);
        }
        lua_pop(L, 1);
        if (c->failed) {
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
            lua_pop(L, 1);
            continue;
        }
        }
        struct tr_value *child = tr_value_new(type, key, o);
        if (!child) {
            tr_fail(c->err, "out of memory converting the recipe");
            c->failed = 1;
            lua_pop(L, 1);
            break;
        }
        child->is_list_item = keys[i].is_index;
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
        lua_pop(L, 1);
    }
    lua_pop(L, 1); /* origins */
    for (size_t i = 0; i < n; i++)
        free(keys[i].name);
    free(keys);
}

/* Runs under lua_cpcall so that running out of memory inside the Lua API is
 * an error, not a panic. */
static int convert_protected(lua_State *L)
{
    struct convert *c = lua_touserdata(L, 1);
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

/* ---- loading ---------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *grown = realloc(buf, cap * 2);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Pushes the module table returned by <lua_dir>/trainrun/recipe.lua. */
static int push_loader(lua_State *L, const char *lua_dir, tr_err *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/trainrun/recipe.lua", lua_dir);
    size_t len;
    char *src = read_file(path, &len);
    if (!src)
        return tr_fail(err, "cannot read the recipe loader %s: is trainrun installed completely? "
                            "(the Lua directory comes from the installation or --lua-dir)",
                       path);
    lua_pushfstring(L, "@%s", path);
    int rc = luaL_loadbufferx(L, src, len, lua_tostring(L, -1), "t");
    free(src);
    lua_remove(L, -2);
    if (rc == 0)
        rc = lua_pcall(L, 0, 1, 0);
    if (rc != 0) {
        tr_fail(err, "recipe loader: %s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "error");
        lua_pop(L, 1);
        return TR_ERROR;
    }
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return tr_fail(err, "recipe loader %s did not return its module table", path);
    }
    return 0;
}

static void copy_lua_error(lua_State *L, int rc, tr_err *err)
{
    if (rc == LUA_ERRMEM)
        tr_fail(err, "out of memory while loading the recipe");
    else if (lua_isstring(L, -1))
        tr_fail(err, "%s", lua_tostring(L, -1));
    else
        tr_fail(err, "the recipe raised an error that is not a message");
}

struct tr_recipe *tr_recipe_load(const char *path, const char *const *overrides, int n_overrides,
                                 const struct tr_recipe_paths *paths, tr_err *err)
{
    if (!path || !path[0]) {
        tr_fail(err, "no recipe given");
        return NULL;
    }
    if (!paths || !paths->lua_dir) {
        tr_fail(err, "internal error: the Lua directory of trainrun is not configured");
        return NULL;
    }
    struct tr_recipe *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path)) || !(r->L = luaL_newstate())) {
        tr_fail(err, "out of memory loading %s", path);
        tr_recipe_free(r);
        return NULL;
    }
    r->resolved_ref = LUA_NOREF;
    r->require_ref = LUA_NOREF;
    lua_State *L = r->L;
    luaL_openlibs(L);

    if (push_loader(L, paths->lua_dir, err) != 0) {
        tr_recipe_free(r);
        return NULL;
    }
    lua_getfield(L, -1, "load");
    lua_remove(L, -2);
    push_host(L);
    push_config(L, path, overrides, n_overrides, paths);

    /* Interpret only while the budget hook is on: compiled traces skip hooks. */
    struct budget budget = {0, 0};
    active_budget = &budget;
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    lua_sethook(L, count_hook, LUA_MASKCOUNT, TR_RECIPE_HOOK_EVERY);
    int rc = lua_pcall(L, 2, 3, 0);
    lua_sethook(L, NULL, 0, 0);
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_ON);
    active_budget = NULL;
    if (rc != 0) {
        copy_lua_error(L, rc, err);
        tr_recipe_free(r);
        return NULL;
    }

    struct convert c = {.L = L, .err = err, .top_file = r->path};
    r->require_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    c.origins_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    r->resolved_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    c.result_ref = r->resolved_ref;
    rc = lua_cpcall(L, convert_protected, &c);
    luaL_unref(L, LUA_REGISTRYINDEX, c.origins_ref);
    if (rc != 0) {
        copy_lua_error(L, rc, err);
        lua_pop(L, 1);
        c.failed = 1;
    }
    if (c.failed) {
        tr_value_free(c.root);
        tr_recipe_free(r);
        return NULL;
    }
    r->root = c.root;
    lua_gc(L, LUA_GCCOLLECT, 0); /* drop the loader's working tables now */
    return r;
}

void tr_recipe_free(struct tr_recipe *r)
{
    if (!r)
        return;
    if (r->L)
        lua_close(r->L);
    tr_value_free(r->root);
    free(r->path);
    free(r);
}

struct tr_value *tr_recipe_root(struct tr_recipe *r)
{
    return r ? r->root : NULL;
}

const char *tr_recipe_path(const struct tr_recipe *r)
{
    return r ? r->path : NULL;
}

struct lua_State *tr_recipe_lua(struct tr_recipe *r)
{
    return r ? r->L : NULL;
}

void tr_recipe_push_resolved(struct tr_recipe *r)
{
    lua_rawgeti(r->L, LUA_REGISTRYINDEX, r->resolved_ref);
}

int tr_recipe_require(struct tr_recipe *r, const char *name, tr_err *err)
{
    if (!r || !r->L || r->require_ref == LUA_NOREF || !name)
        return tr_fail(err, "internal error: no loaded recipe to require %s from", name ? name : "a module");
    lua_State *L = r->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->require_ref);
    lua_pushstring(L, name);
    int rc = lua_pcall(L, 1, 1, 0);
    if (rc != 0) {
        copy_lua_error(L, rc, err);
        lua_pop(L, 1);
        return TR_ERROR;
    }
    return TR_OK;
}

/* The origin of the deepest existing table on the path: for a key that is
 * not in the tree (a required key left out) that is the enclosing table's
 * key, which is where the user has to add it. */
int tr_recipe_origin(struct tr_recipe *r, const char *dotted_path, struct tr_origin *out)
{
    if (!r || !r->root || !dotted_path)
        return 0;
    const struct tr_value *node = r->root, *found = NULL;
    const char *p = dotted_path;
    while (*p && node && node->type == TR_V_TABLE) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        char key[256];
        if (len >= sizeof key)
            break;
        memcpy(key, p, len);
        key[len] = '\0';
        node = tr_value_child(node, key);
        if (!node)
            break;
        found = node;
        if (!dot)
            break;
        p = dot + 1;
    }
    if (!found) {
        if (out) {
            out->kind = TR_FROM_RECIPE;
            out->file = r->path;
            out->line = 0;
        }
        return 0;
    }
    if (out)
        *out = found->origin;
    return 1;
}
