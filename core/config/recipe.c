/*
 * Recipes: the C side.  Most of the loader (sandbox, extends/include, deep
 * merge, overrides, origin scanning) lives in lua/trainrun/recipe.lua; this
 * file gives it the few primitives plain Lua lacks (text-only loading,
 * realpath, the limits recipe code runs under), loads the recipe, and has
 * recipe_convert.c convert the resolved table into the C tree of value.h.
 * It stays one file a little over ~700 lines because it is one bridge: the
 * sandbox's limits, the primitives and the loading all act on the same Lua
 * state, through the one struct tr_recipe, on behalf of recipe.lua.
 */
#define _XOPEN_SOURCE 700 /* strdup, realpath */
#include "recipe.h"
#include "recipe_convert.h"
#include "recipe_ops.h"
#include "../util/suggest.h"
#include "../util/util.h"

#include <trainrun/input.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Recipe code is data from a colleague, not a program with the user's
 * privileges: every evaluation (loading, each model build, each require from
 * the host) runs under these limits, and hitting one ends it with the file:line
 * of the recipe code that was running.  Instructions are counted because that
 * is deterministic; CPU time catches long single library calls; the heap limit
 * is enforced by the allocator itself, so one huge request (string.rep of a
 * gigabyte) is refused before any memory is touched. */
#define TR_RECIPE_INSTRUCTION_LIMIT 50000000L
#define TR_RECIPE_CPU_SECONDS 5.0
#define TR_RECIPE_MEMORY_LIMIT ((size_t)1 << 30)
#define TR_RECIPE_HOOK_EVERY 10000
/* C stack that nested recipe code (a gsub callback calling gsub, a sort
 * comparator sorting) may use below the call into it; the main thread has
 * 8 MiB, and LuaJIT itself has no limit here: without this, a crash. */
#define TR_RECIPE_C_STACK ((size_t)1 << 20)

enum stop { STOP_NONE = 0, STOP_TIME, STOP_MEMORY, STOP_DEPTH };

struct sandbox {
    lua_State *L;
    char *lua_dir;        /* trainrun's own Lua library: errors there are relocated */
    const char *fallback; /* where to point when no recipe code is on the stack */
    size_t heap, heap_limit;
    int armed;            /* inside an evaluation: limits apply */
    long used;
    double cpu_start;
    uintptr_t stack_base;
    size_t stack_limit;
    enum stop stopped;
    char where[PATH_MAX + 32]; /* "file:line" of the recipe code that hit a limit */
    int where_is_code;         /* where names a line (else only the recipe file) */
};

struct tr_recipe {
    lua_State *L;
    char *path;
    struct tr_value *root;
    int resolved_ref; /* registry reference to the resolved Lua table */
    int require_ref;  /* registry reference to the loader's require for the host */
    int locate_ref;   /* registry reference to the error locator (below) */
    struct tr_recipe_switch *switches; /* slots given another plugin than their base's */
    int n_switches;
    struct sandbox sb;
};

/* ---- limits ----------------------------------------------------------------- */

static struct sandbox *sandbox_of(lua_State *L)
{
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* Is `path` (a chunk name without "@", or as Lua shortens it in a message,
 * with a leading "...") a file of trainrun's own Lua library? */
static int is_library_path(const struct sandbox *s, const char *path, size_t len)
{
    if (!s->lua_dir)
        return 0;
    size_t dir = strlen(s->lua_dir);
    if (len >= 3 && strncmp(path, "...", 3) == 0) {
        const char *tail = path + 3, *base = tail;
        size_t tlen = len - 3;
        for (size_t i = 0; i < tlen; i++)
            if (tail[i] == '/')
                base = tail + i + 1;
        char full[PATH_MAX];
        int n = snprintf(full, sizeof full, "%s/trainrun/%.*s", s->lua_dir, (int)(tlen - (size_t)(base - tail)),
                         base);
        return n > 0 && (size_t)n < sizeof full && (size_t)n >= tlen && strncmp(full + n - tlen, tail, tlen) == 0;
    }
    return len > dir + 1 && strncmp(path, s->lua_dir, dir) == 0 && path[dir] == '/';
}

/* "file:line" of the innermost frame at or above `level` that runs recipe
 * code (not trainrun's own library); 0 if there is none. */
static int user_location(lua_State *L, const struct sandbox *s, int level, char *buf, size_t size)
{
    lua_Debug ar;
    for (int i = level; lua_getstack(L, i, &ar); i++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0 || ar.source[0] != '@')
            continue;
        const char *file = ar.source + 1;
        if (is_library_path(s, file, strlen(file)))
            continue;
        snprintf(buf, size, "%s:%d", file, ar.currentline);
        return 1;
    }
    return 0;
}

static void note_where(lua_State *L, struct sandbox *s)
{
    s->where_is_code = L && user_location(L, s, 0, s->where, sizeof s->where);
    if (!s->where_is_code)
        snprintf(s->where, sizeof s->where, "%s", s->fallback ? s->fallback : "recipe");
}

/* The allocator of every recipe state.  It refuses, rather than grows past
 * the limit, while an evaluation runs; outside one (the host pushing a few
 * values) a refusal would be a panic, and nothing grows there. */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    struct sandbox *s = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        s->heap -= old;
        return NULL;
    }
    if (s->armed && nsize > old && nsize - old > s->heap_limit - (s->heap < s->heap_limit ? s->heap : s->heap_limit)) {
        if (s->stopped == STOP_NONE) {
            s->stopped = STOP_MEMORY;
            /* An allocation point is a safe point to read the stack at: the
             * collector, which runs at such points, walks it too. */
            note_where(s->L, s);
        }
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p)
        s->heap = s->heap - old + nsize;
    return p;
}

static double thread_cpu_seconds(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What limit recipe code hit, and where. */
static void format_stop(const struct sandbox *s, char *buf, size_t size)
{
    switch (s->stopped) {
    case STOP_DEPTH:
        snprintf(buf, size, "%s: recipe code is nested too deeply (runaway recursion through a library "
                            "function such as string.gsub or table.sort?)", s->where);
        break;
    case STOP_MEMORY:
        snprintf(buf, size, "%s: recipe code needs more than %zu MiB of memory, the limit for recipes "
                            "(something growing without end?)", s->where, s->heap_limit >> 20);
        break;
    default:
        /* with no recipe code running, trainrun's loader was still reading it */
        snprintf(buf, size, "%s: recipe took too long (%s); recipe code may run %ld million "
                            "Lua instructions and %d s of CPU each time it is evaluated",
                 s->where, s->where_is_code ? "infinite loop?" : "is it very large?",
                 TR_RECIPE_INSTRUCTION_LIMIT / 1000000L, (int)TR_RECIPE_CPU_SECONDS);
    }
}

static int raise_stop(lua_State *L, struct sandbox *s)
{
    char msg[sizeof s->where + 256];
    format_stop(s, msg, sizeof msg);
    return luaL_error(L, "%s", msg);
}

static void limit_hook(lua_State *L, lua_Debug *ar)
{
    struct sandbox *s = sandbox_of(L);
    if (!s->armed)
        return;
    if (s->stopped != STOP_NONE) { /* hit before and caught by recipe code: end it */
        raise_stop(L, s);
        return;
    }
    if (ar->event == LUA_HOOKCALL) {
        char here;
        uintptr_t sp = (uintptr_t)&here;
        if (sp < s->stack_base && s->stack_base - sp > s->stack_limit) {
            s->stopped = STOP_DEPTH;
            note_where(L, s);
            raise_stop(L, s);
        }
        return;
    }
    s->used += TR_RECIPE_HOOK_EVERY;
    if (s->used > TR_RECIPE_INSTRUCTION_LIMIT || thread_cpu_seconds() - s->cpu_start > TR_RECIPE_CPU_SECONDS) {
        s->stopped = STOP_TIME;
        note_where(L, s);
        raise_stop(L, s);
    }
}

/* Length of a leading "path.lua:123: " naming a file of trainrun's library
 * (or "[builtin:name]:0: ", LuaJIT's own Lua code), else 0. */
static size_t library_location_length(const struct sandbox *s, const char *msg)
{
    if (strncmp(msg, "[builtin:", 9) == 0) {
        const char *q = strstr(msg, "]:");
        if (!q || memchr(msg, ' ', (size_t)(q - msg)))
            return 0;
        for (q += 2; isdigit((unsigned char)*q); q++)
            ;
        return q[0] == ':' && q[1] == ' ' ? (size_t)(q + 2 - msg) : 0;
    }
    const char *p = strstr(msg, ".lua:");
    if (!p || memchr(msg, '\n', (size_t)(p - msg)))
        return 0;
    const char *q = p + 5;
    if (!isdigit((unsigned char)*q))
        return 0;
    while (isdigit((unsigned char)*q))
        q++;
    if (q[0] != ':' || q[1] != ' ')
        return 0;
    return is_library_path(s, msg, (size_t)(p + 4 - msg)) ? (size_t)(q + 2 - msg) : 0;
}

/* Error handler of every evaluation and of the loader's own protected calls:
 * a message that trainrun's library raised about a user's value, or a stack
 * overflow (which LuaJIT reports without a place), gets the file:line of the
 * innermost recipe code on the stack: the code the user wrote. */
static int locate_error(lua_State *L)
{
    struct sandbox *s = sandbox_of(L);
    if (lua_type(L, 1) != LUA_TSTRING)
        return 1;
    const char *msg = lua_tostring(L, 1);
    size_t skip = library_location_length(s, msg);
    int overflow = strncmp(msg + skip, "stack overflow", 14) == 0;
    if (!skip && !overflow)
        return 1;
    char where[PATH_MAX + 32];
    if (!user_location(L, s, 1, where, sizeof where))
        lua_pushstring(L, msg + skip);
    else if (overflow)
        lua_pushfstring(L, "%s: stack overflow (runaway recursion?)", where);
    else
        lua_pushfstring(L, "%s: %s", where, msg + skip);
    return 1;
}

static void copy_lua_error(lua_State *L, int rc, tr_err *err);

/* Call the function below its nargs arguments under the limits; on failure
 * err says what went wrong where, and nothing is left on the stack. */
static int sandbox_pcall(struct tr_recipe *r, int nargs, int nresults, tr_err *err)
{
    lua_State *L = r->L;
    struct sandbox *s = &r->sb;
    int fn = lua_gettop(L) - nargs;
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->locate_ref);
    lua_insert(L, fn);
    char base;
    s->stack_base = (uintptr_t)&base;
    s->stack_limit = TR_RECIPE_C_STACK;
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < s->stack_limit)
        s->stack_limit = rl.rlim_cur / 4;
    s->used = 0;
    s->cpu_start = thread_cpu_seconds();
    s->stopped = STOP_NONE;
    s->armed = 1;
    /* Interpret only while the hook is on: compiled traces skip hooks. */
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    lua_sethook(L, limit_hook, LUA_MASKCOUNT | LUA_MASKCALL, TR_RECIPE_HOOK_EVERY);
    int rc = lua_pcall(L, nargs, nresults, fn);
    lua_sethook(L, NULL, 0, 0);
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_ON);
    s->armed = 0;
    lua_remove(L, fn);
    if (rc == 0) {
        s->stopped = STOP_NONE;
        return TR_OK;
    }
    if (s->stopped != STOP_NONE) {
        /* the message recipe code let through may be LuaJIT's bare "not
         * enough memory": say which limit, where */
        char msg[sizeof s->where + 256];
        format_stop(s, msg, sizeof msg);
        tr_fail(err, "%s", msg);
        lua_pop(L, 1);
    } else {
        copy_lua_error(L, rc, err);
        lua_pop(L, 1);
    }
    s->stopped = STOP_NONE;
    lua_gc(L, LUA_GCCOLLECT, 0); /* what the failed evaluation built is garbage now */
    return TR_ERROR;
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

/* read_source(path, max) -> text | nil, message: the source of a recipe or
 * module, a regular file (tr_input_open) of at most max bytes */
static int host_read_source(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    lua_Number max = luaL_checknumber(L, 2);
    int fd = tr_input_open(path);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", path, tr_input_strerror(e));
        return 2;
    }
    if ((lua_Number)st.st_size > max) {
        close(fd);
        lua_pushnil(L);
        char mib[64];
        snprintf(mib, sizeof mib, "%.1f", (double)st.st_size / 1048576);
        lua_pushfstring(L, "%s: is %s MiB; a recipe or module has at most %d MiB of source "
                        "(read data through a data plugin)", path, mib, (int)(max / 1048576));
        return 2;
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *text = malloc(size ? size : 1);
    while (text && got < size) {
        ssize_t r = read(fd, text + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    int e = errno;
    close(fd);
    if (!text || got < size) {
        free(text);
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", path, !text ? "out of memory" : got < size && e == 0
                                                                       ? "it changed while being read"
                                                                       : strerror(e));
        return 2;
    }
    lua_pushlstring(L, text, size);
    free(text);
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

/* stopped() -> true once recipe code hit a limit: the sandbox's pcall
 * passes such errors on instead of catching them. */
static int host_stopped(lua_State *L)
{
    lua_pushboolean(L, sandbox_of(L)->stopped != STOP_NONE);
    return 1;
}

static void push_host(lua_State *L)
{
    /* op_shape: the op table's answer for a node (recipe_ops.h), for trainrun.nn
     * as the module trainrun.ops; pure, so recipe code may call it too */
    static const luaL_Reg fns[] = {
        {"load_text", host_load_text}, {"realpath", host_realpath}, {"is_file", host_is_file},
        {"read_source", host_read_source},
        {"suggest", host_suggest},     {"stopped", host_stopped},   {"locate", locate_error},
        {"op_shape", tr_recipe_op_shape}, {NULL, NULL},
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
    /* plugin_slots: slot name -> set of the core's keys there */
    lua_newtable(L);
    for (const struct tr_recipe_slot *s = paths->slots; s && s->name; s++) {
        lua_newtable(L);
        for (const struct tr_option *o = s->core; o && o->type != TR_OPT_END; o++) {
            lua_pushboolean(L, 1);
            lua_setfield(L, -2, o->name);
        }
        lua_setfield(L, -2, s->name);
    }
    lua_setfield(L, -2, "plugin_slots");
}

/* ---- loading ---------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = tr_input_fopen(path);
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

/* Only an error outside any protected call gets here, which is a bug in
 * trainrun: say so before LuaJIT exits. */
static int panic(lua_State *L)
{
    fprintf(stderr, "trainrun: internal error: unprotected Lua error: %s\n",
            lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(not a message)");
    return 0;
}

static char *string_field(lua_State *L, int t, const char *key)
{
    lua_getfield(L, t, key);
    char *s = tr_xstrdup(lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?");
    lua_pop(L, 1);
    return s;
}

/* The loader's list of plugin switches (lua/trainrun/recipe.lua
 * note_plugin_switch) on top of the stack, made by trainrun's own Lua from
 * the recipe's slot names and keys: strings, read as such. */
static void read_switches(lua_State *L, struct tr_recipe *r)
{
    if (!lua_istable(L, -1))
        return;
    int t = lua_gettop(L);
    size_t n = lua_objlen(L, t);
    r->switches = tr_xcalloc(n + 1, sizeof *r->switches);
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, t, (int)i);
        int e = lua_gettop(L);
        if (lua_istable(L, e)) {
            struct tr_recipe_switch *w = &r->switches[r->n_switches++];
            w->slot = string_field(L, e, "slot");
            w->from = string_field(L, e, "from");
            w->to = string_field(L, e, "to");
            w->to_where = string_field(L, e, "to_where");
            lua_getfield(L, e, "keys");
            size_t nk = lua_istable(L, -1) ? lua_objlen(L, -1) : 0;
            w->keys = tr_xcalloc(nk + 1, sizeof *w->keys);
            for (size_t k = 1; k <= nk; k++) {
                lua_rawgeti(L, -1, (int)k);
                if (lua_type(L, -1) == LUA_TSTRING)
                    w->keys[w->n_keys++] = tr_xstrdup(lua_tostring(L, -1));
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
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
    if (r) {
        r->sb.heap_limit = paths->memory_limit ? paths->memory_limit : TR_RECIPE_MEMORY_LIMIT;
        r->sb.lua_dir = strdup(paths->lua_dir);
        r->path = strdup(path);
        r->sb.fallback = r->path;
    }
    if (!r || !r->path || !r->sb.lua_dir) {
        tr_fail(err, "out of memory loading %s", path);
        tr_recipe_free(r);
        return NULL;
    }
    /* The state's allocator keeps the heap within the limit.  LuaJIT takes a
     * custom allocator only in its GC64 mode (the default on x86-64 and arm64
     * since 2.1); without one a recipe's memory would be unbounded, so say so
     * rather than run it. */
    if (!(r->L = r->sb.L = lua_newstate(sandbox_alloc, &r->sb))) {
        tr_fail(err, "cannot start Lua for %s: out of memory, or trainrun was built against a LuaJIT "
                     "without GC64 mode, which cannot bound the memory of recipe code (rebuild LuaJIT "
                     "2.1 with XCFLAGS=-DLUAJIT_ENABLE_GC64)", path);
        tr_recipe_free(r);
        return NULL;
    }
    r->resolved_ref = LUA_NOREF;
    r->require_ref = LUA_NOREF;
    lua_State *L = r->L;
    lua_atpanic(L, panic);
    luaL_openlibs(L);
    lua_pushcfunction(L, locate_error);
    r->locate_ref = luaL_ref(L, LUA_REGISTRYINDEX);

    if (push_loader(L, paths->lua_dir, err) != 0) {
        tr_recipe_free(r);
        return NULL;
    }
    lua_getfield(L, -1, "load");
    lua_remove(L, -2);
    push_host(L);
    push_config(L, path, overrides, n_overrides, paths);
    if (sandbox_pcall(r, 2, 4, err) != TR_OK) {
        tr_recipe_free(r);
        return NULL;
    }
    read_switches(L, r);
    lua_pop(L, 1);

    struct tr_convert c = {.L = L, .err = err, .top_file = r->path};
    r->require_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    c.origins_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    r->resolved_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    c.result_ref = r->resolved_ref;
    int rc = lua_cpcall(L, tr_recipe_convert_protected, &c);
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
    for (int i = 0; i < r->n_switches; i++) {
        struct tr_recipe_switch *w = &r->switches[i];
        free(w->slot);
        free(w->from);
        free(w->to);
        free(w->to_where);
        for (int k = 0; k < w->n_keys; k++)
            free(w->keys[k]);
        free(w->keys);
    }
    free(r->switches);
    free(r->path);
    free(r->sb.lua_dir);
    free(r);
}

struct tr_value *tr_recipe_root(struct tr_recipe *r)
{
    return r ? r->root : NULL;
}

int tr_recipe_switches(const struct tr_recipe *r, const struct tr_recipe_switch **out)
{
    *out = r->switches;
    return r->n_switches;
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
    return sandbox_pcall(r, 1, 1, err);
}

int tr_recipe_pcall(struct tr_recipe *r, int nargs, int nresults, const char *where, tr_err *err)
{
    if (!r || !r->L)
        return tr_fail(err, "internal error: no loaded recipe to run code of");
    if (where)
        r->sb.fallback = where;
    int rc = sandbox_pcall(r, nargs, nresults, err);
    r->sb.fallback = r->path;
    return rc;
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
