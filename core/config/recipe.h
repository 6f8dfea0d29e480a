/*
 * Recipes: LuaJIT files that return a table.
 *
 * Loading: text only (never bytecode), in a sandbox (no os, io, ffi, debug,
 * load*, dofile, require of arbitrary modules), chunk name "@path" so every
 * Lua error says file:line.  Sharing: `extends = "base/x.lua"` in the returned
 * table, or `local base = include "team/base.lua"` — both deep-merge, and
 * lists replace unless written as `append { ... }`.  Search path for
 * extends/include: the including file's directory, TRAINRUN_RECIPE_PATH
 * (colon-separated), then the installed recipes directory.
 *
 * Overrides "key.sub=value" from the command line are applied to the merged
 * table before it is converted: "true"/"false" become booleans, numbers
 * become numbers, anything else a string; the raw text is kept in
 * tr_value.text so that option validation can type it by the schema.
 */
#ifndef TR_RECIPE_H
#define TR_RECIPE_H

#include "value.h"
#include <trainrun/plugin.h>

struct lua_State;
struct tr_recipe;

/* A plugin slot of a recipe: a top-level table whose `plugin` names the
 * plugin its other keys configure, besides the core's own keys for the
 * slot (`core`, e.g. checkpoint.every; NULL: none). */
struct tr_recipe_slot {
    const char *name;
    const struct tr_option *core;
};

struct tr_recipe_paths {
    const char *lua_dir;     /* where lua/trainrun/<name>.lua live (for `require "trainrun.x"`) */
    const char *recipe_dir;  /* installed recipes directory, last on the search path */
    const char *extra_lua_dir; /* optional: searched before lua_dir by `require` (tests, development) */
    size_t memory_limit;     /* bytes of Lua heap recipe code may use; 0: the default, 1 GiB */
    /* optional, ended by a NULL name: when a recipe that extends a base names
     * another plugin for one of these than the base did, the base's keys
     * there go (they were the old plugin's options), all but `plugin` and
     * the slot's core keys */
    const struct tr_recipe_slot *slots;
};

/* Recipe code (the recipe files, extends/include, the model builders, any
 * trainrun.* module) is data from whoever shared the recipe, so every time it
 * runs it is bounded: 50 million Lua instructions and 5 s of CPU per
 * evaluation, the heap limit above for the whole state, and 1 MiB of C stack
 * for nesting through library calls.  Hitting a limit is an error that names
 * the file:line of the recipe code that was running. */

/* Load, merge, override, convert.  On failure returns NULL and err says
 * "file:line: what is wrong" (or names the override that is malformed). */
struct tr_recipe *tr_recipe_load(const char *path, const char *const *overrides, int n_overrides,
                                 const struct tr_recipe_paths *paths, tr_err *err);
void tr_recipe_free(struct tr_recipe *r);

/* The resolved tree (owned by the recipe). */
struct tr_value *tr_recipe_root(struct tr_recipe *r);
const char *tr_recipe_path(const struct tr_recipe *r);

/* A plugin slot that a child recipe or slot.plugin=NAME on the command line
 * gave another plugin than its base named: `keys` are the base's keys there
 * that were the old plugin's options (not `plugin`, the slot's core keys, or
 * keys set again beside the new name).  The loader leaves them in the tree;
 * the caller, which knows the new plugin's options, drops those it lacks
 * (run_config.c, with a note). */
struct tr_recipe_switch {
    char *slot, *from, *to;
    char *to_where; /* "file:line" or "the command line (schedule.plugin=constant)" */
    char **keys;
    int n_keys;
};
int tr_recipe_switches(const struct tr_recipe *r, const struct tr_recipe_switch **out);

/* The Lua state that evaluated the recipe, and a way to push the resolved
 * table (as merged and overridden) onto its stack: used to run model builders. */
struct lua_State *tr_recipe_lua(struct tr_recipe *r);
void tr_recipe_push_resolved(struct tr_recipe *r);

/* Line of `dotted_path` in the recipe files, for errors about keys that a
 * validator looks up by path: fills origin and returns 1 if known. */
int tr_recipe_origin(struct tr_recipe *r, const char *dotted_path, struct tr_origin *out);

/* Push module `name` (e.g. "trainrun.models") as the recipe saw it: the
 * same instance from the same per-load cache, sandboxed like the recipe.
 * TR_OK with the module on top of tr_recipe_lua(r)'s stack, or TR_ERROR
 * with err set and nothing pushed. */
int tr_recipe_require(struct tr_recipe *r, const char *name, tr_err *err);

/* lua_pcall for the host on tr_recipe_lua(r): the function below nargs
 * arguments runs under the limits above, JIT off; an error from trainrun's
 * own Lua library gets the file:line of the recipe code that led to it, or
 * `where` ("file:line" of what the call is about; NULL: the recipe file)
 * when no recipe code is on the stack.  TR_OK with nresults pushed, or
 * TR_ERROR with err set and the function and arguments popped. */
int tr_recipe_pcall(struct tr_recipe *r, int nargs, int nresults, const char *where, tr_err *err);

#endif
