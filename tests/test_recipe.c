/* Recipes: loading, sandbox, sharing, overrides, origins, and the C tree.
 *
 * Covers: core/config/recipe.c and value.c with lua/trainrun/ (the sandbox, nn.lua,
 * models.lua), and the graphs core/engine/model.c builds from recipes.
 */
#define _XOPEN_SOURCE 700 /* mkstemp, open_memstream, setenv, fdopen */
#include "engine/model.h"
#include "config/recipe.h"

#include <criterion/criterion.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef TR_TEST_SRCDIR
#define TR_TEST_SRCDIR "tests"
#endif

/* Every test runs from the tests directory so that messages name
 * "recipes/x.lua" whatever the build directory is. */
static void enter_test_dir(void)
{
    cr_assert_eq(chdir(TR_TEST_SRCDIR), 0, "cannot enter %s", TR_TEST_SRCDIR);
    setenv("TRAINRUN_RECIPE_PATH", "recipes/extra_path", 1);
}

TestSuite(recipe, .init = enter_test_dir);
TestSuite(limits, .init = enter_test_dir);
TestSuite(model_graph, .init = enter_test_dir);

static const struct tr_recipe_paths test_paths = {
    .lua_dir = "../lua",
    .recipe_dir = "recipes/installed",
    .extra_lua_dir = "recipes/lua",
};

static struct tr_recipe *load_with(const char *path, const char *const *overrides, int n)
{
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load(path, overrides, n, &test_paths, &err);
    cr_assert_not_null(r, "loading %s failed: %s", path, err.msg);
    return r;
}

static struct tr_recipe *load(const char *path)
{
    return load_with(path, NULL, 0);
}

static void expect_error_with(const char *path, const char *const *overrides, int n, const char *expected)
{
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load(path, overrides, n, &test_paths, &err);
    cr_assert_null(r, "%s loaded but should fail with: %s", path, expected);
    cr_assert_str_eq(err.msg, expected);
}

static void expect_error(const char *path, const char *expected)
{
    expect_error_with(path, NULL, 0, expected);
}

static struct tr_value *get(struct tr_recipe *r, const char *path)
{
    struct tr_value *v = tr_value_get(tr_recipe_root(r), path);
    cr_assert_not_null(v, "no value at %s", path);
    return v;
}

static void expect_number(struct tr_recipe *r, const char *path, double want)
{
    struct tr_value *v = get(r, path);
    cr_assert_eq(v->type, TR_V_NUMBER, "%s is not a number", path);
    cr_assert_eq(v->number, want, "%s = %g, want %g", path, v->number, want);
}

static void expect_string(struct tr_recipe *r, const char *path, const char *want)
{
    struct tr_value *v = get(r, path);
    cr_assert_eq(v->type, TR_V_STRING, "%s is not a string", path);
    cr_assert_str_eq(v->string, want);
}

static void expect_origin(const struct tr_value *v, const char *want)
{
    char buf[256];
    tr_origin_format(&v->origin, buf, sizeof buf);
    cr_assert_str_eq(buf, want, "origin of %s", v->key ? v->key : "(root)");
}

/* ---- errors ------------------------------------------------------------- */

Test(recipe, syntax_error_names_file_and_line)
{
    expect_error("recipes/syntax_error.lua",
                 "recipes/syntax_error.lua:3: '}' expected (to close '{' at line 1) near 'steps'");
}

Test(recipe, runtime_error_keeps_file_and_line)
{
    expect_error("recipes/runtime_error.lua", "recipes/runtime_error.lua:3: steps must be at most 5");
}

Test(recipe, calling_nil_keeps_file_and_line)
{
    expect_error("recipes/call_nil.lua", "recipes/call_nil.lua:2: attempt to call field 'schedule' (a nil value)");
}

Test(recipe, forbidden_global)
{
    expect_error("recipes/uses_os.lua",
                 "recipes/uses_os.lua:3: 'os' is not available in recipes (recipes are sandboxed)");
}

Test(recipe, misspelled_global_suggests)
{
    expect_error("recipes/typo_global.lua",
                 "recipes/typo_global.lua:1: unknown name 'tonumbr' (did you mean 'tonumber'?)");
}

Test(recipe, required_modules_are_sandboxed_too)
{
    expect_error("recipes/module_uses_os.lua",
                 "recipes/lua/trainrun/helpers.lua:9: 'os' is not available in recipes (recipes are sandboxed)");
}

Test(recipe, model_builder_error_gets_recipe_line)
{
    expect_error("recipes/builder_error.lua", "recipes/builder_error.lua:2: strict: option 'size' is required");
}

Test(recipe, require_outside_trainrun_is_refused)
{
    expect_error("recipes/require_bad.lua", "recipes/require_bad.lua:1: require \"socket\": only trainrun.* "
                                            "modules are available in recipes (recipes are sandboxed)");
}

static int collect_chunk(lua_State *L, const void *p, size_t size, void *ud)
{
    (void)L;
    return fwrite(p, 1, size, ud) == size ? 0 : 1;
}

Test(recipe, bytecode_is_rejected)
{
    char path[] = "/tmp/trainrun-bytecode-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    lua_State *L = luaL_newstate();
    cr_assert_eq(luaL_loadstring(L, "return { lr = 1 }"), 0);
    cr_assert_eq(lua_dump(L, collect_chunk, f), 0);
    lua_close(L);
    fclose(f);

    char want[256];
    snprintf(want, sizeof want, "%s: is precompiled Lua bytecode; recipes must be Lua source text", path);
    expect_error(path, want);
    unlink(path);
}

/* error() text from a recipe reaches a terminal: its control characters
 * (an OSC title change, a colour, a carriage return that hides the start
 * of the line) are shown escaped, not sent raw; a FIFO recipe is refused. */
Test(recipe, error_text_is_escaped)
{
    char path[] = "/tmp/trainrun-escape-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    static const char src[] = "error(\"bad \\27]0;title\\7 \\27[31mred\\r \\194\\155x\", 0)\n";
    cr_assert_eq(write(fd, src, sizeof src - 1), (ssize_t)(sizeof src - 1));
    close(fd);
    expect_error(path, "bad \\x1b]0;title\\x07 \\x1b[31mred\\x0d \\x9bx");
    unlink(path);
    char fifo[] = "/tmp/trainrun-fifo-XXXXXX";
    fd = mkstemp(fifo);
    cr_assert(fd >= 0);
    close(fd);
    unlink(fifo);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    char want[256];
    snprintf(want, sizeof want, "cannot read recipe %s: not a regular file (a FIFO, a socket or a "
             "device: reading it could block forever); give the path of the file itself", fifo);
    expect_error(fifo, want);
    unlink(fifo);
}

Test(recipe, non_table_return)
{
    expect_error("recipes/not_table.lua", "recipes/not_table.lua:2: a recipe must return a table, got number");
}

Test(recipe, missing_recipe_file)
{
    expect_error("recipes/nope.lua", "cannot read recipe recipes/nope.lua: No such file or directory");
}

Test(recipe, extends_not_found_lists_search_path)
{
    expect_error("recipes/extends_missing.lua",
                 "recipes/extends_missing.lua:2: extends \"base/nope.lua\": not found "
                 "(searched: recipes, recipes/extra_path, recipes/installed)");
}

Test(recipe, include_not_found_lists_search_path)
{
    expect_error("recipes/include_missing.lua", "recipes/include_missing.lua:1: include \"nope.lua\": not found "
                                                "(searched: recipes, recipes/extra_path, recipes/installed)");
}

Test(recipe, extends_cycle_names_chain)
{
    expect_error("recipes/cycle_a.lua", "recipes/cycle_b.lua:2: extends cycle: recipes/cycle_a.lua -> "
                                        "recipes/cycle_b.lua -> recipes/cycle_a.lua");
}

Test(recipe, append_over_non_list)
{
    expect_error("recipes/append_bad.lua",
                 "recipes/append_bad.lua:3: append{...} for \"seed\": the value it extends is a number, not a list");
}

Test(recipe, infinite_loop_is_stopped)
{
    expect_error("recipes/infinite_loop.lua", "recipes/infinite_loop.lua:2: recipe took too long (infinite loop?); "
                 "recipe code may run 50 million Lua instructions and 5 s of CPU each time it is evaluated");
}

Test(recipe, table_cycle_is_an_error)
{
    expect_error("recipes/self_cycle.lua",
                 "recipes/self_cycle.lua:2: \"self\" contains itself (a table cycle); recipes must be trees");
}

Test(recipe, boolean_key_is_an_error)
{
    expect_error("recipes/bad_key.lua", "recipes/bad_key.lua:1: \"weights\" has a key that is a boolean; "
                                        "keys must be names or list positions 1, 2, ...");
}

Test(recipe, malformed_overrides)
{
    const char *no_equals[] = {"optim.lr"};
    expect_error_with("recipes/base.lua", no_equals, 1,
                      "command line override \"optim.lr\": expected key=value (for example optim.lr=3e-4)");
    const char *empty_key[] = {"=3"};
    expect_error_with("recipes/base.lua", empty_key, 1,
                      "command line override \"=3\": the key before \"=\" is empty (expected key=value)");
    const char *empty_part[] = {"optim..lr=3"};
    expect_error_with("recipes/base.lua", empty_part, 1,
                      "command line override \"optim..lr=3\": \"optim..lr\" has an empty part "
                      "(expected names separated by single dots)");
    const char *through_scalar[] = {"seed.x=1"};
    expect_error_with("recipes/base.lua", through_scalar, 1,
                      "command line override \"seed.x=1\": \"seed\" is a number in the recipe, not a table");
}

/* ---- overrides ------------------------------------------------------------ */

Test(recipe, overrides_are_typed_and_keep_text)
{
    const char *ov[] = {"optim.lr=0.01", "optim.amsgrad=true", "optim.fused=false", "optim.name=sgd",
                        "seed=0x10",     "optim.eps=1e-8",     "schedule.decay=inf"};
    struct tr_recipe *r = load_with("recipes/base.lua", ov, 7);
    expect_number(r, "optim.lr", 0.01);
    expect_number(r, "seed", 16);
    expect_number(r, "optim.eps", 1e-8);
    expect_string(r, "optim.name", "sgd");
    expect_string(r, "schedule.decay", "inf");
    struct tr_value *amsgrad = get(r, "optim.amsgrad");
    cr_assert_eq(amsgrad->type, TR_V_BOOL);
    cr_assert_eq(amsgrad->boolean, 1);
    struct tr_value *fused = get(r, "optim.fused");
    cr_assert_eq(fused->type, TR_V_BOOL);
    cr_assert_eq(fused->boolean, 0);

    struct tr_value *lr = get(r, "optim.lr");
    cr_assert_str_eq(lr->text, "0.01");
    cr_assert_eq(lr->origin.kind, TR_FROM_CLI);
    cr_assert_str_eq(get(r, "seed")->text, "0x10");
    cr_assert_null(get(r, "optim.betas.1")->text, "recipe values have no raw text");
    tr_recipe_free(r);
}

Test(recipe, overrides_create_nested_tables)
{
    const char *ov[] = {"logging.wandb.project=tiny", "data.files.3=c.bin"};
    struct tr_recipe *r = load_with("recipes/base.lua", ov, 2);
    expect_string(r, "logging.wandb.project", "tiny");
    cr_assert_eq(get(r, "logging")->type, TR_V_TABLE);
    expect_origin(get(r, "logging"), "command line");
    expect_string(r, "data.files.3", "c.bin");
    cr_assert(get(r, "data.files.3")->is_list_item);
    tr_recipe_free(r);
}

/* ---- extends, include, require ---------------------------------------------- */

Test(recipe, extends_merges_nested_tables)
{
    struct tr_recipe *r = load("recipes/child.lua");
    expect_number(r, "optim.lr", 1e-3);       /* child */
    expect_string(r, "optim.name", "adamw");  /* kept from base */
    expect_number(r, "model.n_layer", 2);     /* untouched subtree */
    cr_assert_null(tr_value_get(tr_recipe_root(r), "extends"), "extends is dropped");
    tr_recipe_free(r);
}

Test(recipe, extends_replaces_lists)
{
    struct tr_recipe *r = load("recipes/child.lua");
    struct tr_value *betas = get(r, "optim.betas");
    cr_assert_eq(betas->n_items, 2);
    expect_number(r, "optim.betas.1", 0.8);
    expect_number(r, "optim.betas.2", 0.99);
    tr_recipe_free(r);
}

Test(recipe, append_concatenates_lists)
{
    struct tr_recipe *r = load("recipes/child.lua");
    cr_assert_eq(get(r, "data.files")->n_items, 3);
    expect_string(r, "data.files.1", "a.bin");
    expect_string(r, "data.files.2", "b.bin");
    expect_string(r, "data.files.3", "c.bin");
    expect_origin(get(r, "data.files.1"), "recipes/base.lua:10");
    expect_origin(get(r, "data.files.3"), "recipes/child.lua:8");
    tr_recipe_free(r);
}

Test(recipe, scalars_and_tables_replace_each_other)
{
    struct tr_recipe *r = load("recipes/child.lua");
    expect_string(r, "schedule", "constant"); /* table -> scalar */
    expect_number(r, "seed.value", 7);        /* scalar -> table */
    tr_recipe_free(r);
}

/* A child that names another plugin for a slot than its base: the loader
 * lists the base's keys there that were the old plugin's options (not the
 * slot's core keys, checkpoint.every, nor keys the child sets again), for
 * the host to drop those the new plugin lacks; tables that keep their
 * plugin, and tables that are not slots, merge as before. */
static const struct tr_option every_option[] = {
    {TR_OPT_INT, "every", "0", 0, 1e9, NULL, "", 0}, {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0}};
static const struct tr_recipe_slot switch_slots[] = {
    {"schedule", NULL}, {"checkpoint", every_option}, {"data", NULL}, {NULL, NULL}};

static const struct tr_recipe_switch *find_switch(struct tr_recipe *r, const char *slot)
{
    const struct tr_recipe_switch *sw;
    int n = tr_recipe_switches(r, &sw);
    for (int i = 0; i < n; i++)
        if (strcmp(sw[i].slot, slot) == 0)
            return &sw[i];
    return NULL;
}

Test(recipe, extends_switching_plugin_lists_the_old_plugins_options)
{
    struct tr_recipe_paths paths = test_paths;
    paths.slots = switch_slots;
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load("recipes/switch_child.lua", NULL, 0, &paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    expect_string(r, "schedule.plugin", "step");
    expect_number(r, "schedule.step_size", 3);
    const struct tr_recipe_switch *s = find_switch(r, "schedule");
    cr_assert_not_null(s);
    cr_assert_str_eq(s->from, "cosine");
    cr_assert_str_eq(s->to, "step");
    cr_assert(strstr(s->to_where, "recipes/switch_child.lua:4") != NULL, "%s", s->to_where);
    cr_assert_eq(s->n_keys, 2);
    cr_assert_str_eq(s->keys[0], "min_lr_ratio");
    cr_assert_str_eq(s->keys[1], "warmup");
    s = find_switch(r, "checkpoint");
    cr_assert_not_null(s);
    cr_assert_eq(s->n_keys, 1, "only dir: every is the core's");
    cr_assert_str_eq(s->keys[0], "dir");
    expect_number(r, "checkpoint.every", 7); /* the core's, from the base */
    expect_origin(get(r, "checkpoint.every"), "recipes/switch_base.lua:5");
    cr_assert_null(find_switch(r, "data"), "the same plugin is no switch");
    expect_string(r, "data.path", "a.txt"); /* the same plugin: merged */
    expect_number(r, "data.val_fraction", 0.2);
    expect_number(r, "optim.lr", 0.5); /* not a slot: merged */
    tr_recipe_free(r);
    /* without slots (a loader that knows none) the tables merge whole, and
     * nothing is a switch */
    r = load("recipes/switch_child.lua");
    expect_number(r, "schedule.min_lr_ratio", 0.1);
    cr_assert_null(find_switch(r, "schedule"));
    tr_recipe_free(r);
}

/* schedule.plugin=NAME on the command line is a switch too; a key the
 * command line sets beside it is not listed (it is checked against the new
 * plugin), nor is one when the plugin stays the same. */
Test(recipe, override_switching_plugin_lists_the_old_plugins_options)
{
    struct tr_recipe_paths paths = test_paths;
    paths.slots = switch_slots;
    tr_err err = {{0}};
    const char *ov[] = {"schedule.plugin=constant", "schedule.warmup=1"};
    struct tr_recipe *r = tr_recipe_load("recipes/switch_base.lua", ov, 2, &paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    const struct tr_recipe_switch *s = find_switch(r, "schedule");
    cr_assert_not_null(s);
    cr_assert_str_eq(s->from, "cosine");
    cr_assert_str_eq(s->to, "constant");
    cr_assert_str_eq(s->to_where, "the command line (schedule.plugin=constant)");
    cr_assert_eq(s->n_keys, 1);
    cr_assert_str_eq(s->keys[0], "min_lr_ratio");
    tr_recipe_free(r);
    const char *same[] = {"schedule.plugin=cosine"};
    r = tr_recipe_load("recipes/switch_base.lua", same, 1, &paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    cr_assert_null(find_switch(r, "schedule"));
    tr_recipe_free(r);
}

Test(recipe, extends_chain_of_three)
{
    struct tr_recipe *r = load("recipes/grandchild.lua");
    expect_number(r, "optim.weight_decay", 0.1); /* grandchild */
    expect_number(r, "optim.lr", 1e-3);          /* child */
    expect_string(r, "optim.name", "adamw");     /* base */
    expect_number(r, "steps", 1000);
    cr_assert_eq(get(r, "data.files")->n_items, 3);
    expect_origin(get(r, "optim.weight_decay"), "recipes/grandchild.lua:3");
    expect_origin(get(r, "optim.lr"), "recipes/child.lua:5");
    expect_origin(get(r, "optim.name"), "recipes/base.lua:5");
    tr_recipe_free(r);
}

Test(recipe, include_returns_resolved_recipe)
{
    struct tr_recipe *r = load("recipes/includes.lua");
    expect_number(r, "optim.lr", 3e-4);
    expect_number(r, "steps", 10);
    cr_assert_null(tr_value_get(tr_recipe_root(r), "model"));
    expect_origin(get(r, "optim.lr"), "recipes/base.lua:6");
    expect_origin(get(r, "steps"), "recipes/includes.lua:4");
    tr_recipe_free(r);
}

Test(recipe, search_path_and_installed_recipes)
{
    struct tr_recipe *r = load("recipes/search.lua");
    expect_string(r, "team", "vision");
    expect_string(r, "optim.name", "sgd");
    expect_origin(get(r, "team"), "recipes/extra_path/team/base.lua:1");
    tr_recipe_free(r);
}

/* extends and include read only the directory of the recipe named on the
 * command line (and below it), TRAINRUN_RECIPE_PATH and the installed recipes:
 * a shared recipe cannot read ~/.netrc or /etc/shadow, not even to quote a
 * parse error of it into a value. */
#define OUTSIDE_TAIL "is outside the directories a recipe may read (recipes/confined, recipes/extra_path, " \
                     "recipes/installed, and below them); copy it beside the recipe you run, or add its " \
                     "directory to TRAINRUN_RECIPE_PATH"

Test(recipe, extends_and_include_stay_inside_the_recipe_directories)
{
    struct tr_recipe *r = load("recipes/confined/ok.lua");
    expect_number(r, "steps", 5);
    expect_string(r, "shared.name", "shared");
    expect_string(r, "team", "vision");
    expect_string(r, "optim.name", "sgd");
    tr_recipe_free(r);
    expect_error("recipes/confined/escape.lua", "recipes/confined/escape.lua:5: extends \"../base.lua\": "
                 "recipes/confined/../base.lua " OUTSIDE_TAIL);
}

Test(recipe, include_errors_cannot_be_caught_by_recipe_code)
{
    /* pcall(include, ...) of a file outside: the load ends, nothing of it in a value */
    expect_error("recipes/confined/pcall_include.lua", "recipes/confined/pcall_include.lua:1: include "
                 "\"../base.lua\": recipes/confined/../base.lua " OUTSIDE_TAIL);
    /* a file inside that is no recipe: its parse error (which quotes it) ends the
     * load, and xpcall's handler never sees it */
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load("recipes/confined/xpcall_include.lua", NULL, 0, &test_paths, &err);
    cr_assert_null(r, "xpcall caught include's error: the recipe loaded");
    cr_assert(strncmp(err.msg, "recipes/confined/netrc.txt:1:", 29) == 0, "%s", err.msg);
}

Test(recipe, absolute_and_linked_paths_stay_inside_too)
{
    char cwd[4096], tmpl[] = "/tmp/tr-recipe-XXXXXX", path[8192], text[8192];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    cr_assert_not_null(mkdtemp(tmpl));
    /* by absolute path */
    snprintf(path, sizeof path, "%s/abs.lua", tmpl);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "return { extends = \"%s/recipes/base.lua\" }\n", cwd);
    fclose(f);
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load(path, NULL, 0, &test_paths, &err);
    cr_assert_null(r, "extends by absolute path left the recipe directories");
    snprintf(text, sizeof text, "%s/recipes/base.lua is outside the directories a recipe may read (%s, ",
             cwd, tmpl);
    cr_assert_not_null(strstr(err.msg, text), "%s", err.msg);
    /* through a symbolic link beside the recipe */
    char link[8192];
    snprintf(link, sizeof link, "%s/base.lua", tmpl);
    snprintf(text, sizeof text, "%s/recipes/base.lua", cwd);
    cr_assert_eq(symlink(text, link), 0);
    snprintf(path, sizeof path, "%s/linked.lua", tmpl);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "return { extends = \"base.lua\" }\n");
    fclose(f);
    r = tr_recipe_load(path, NULL, 0, &test_paths, &err);
    cr_assert_null(r, "extends through a symbolic link left the recipe directories");
    cr_assert_not_null(strstr(err.msg, "/base.lua is outside the directories a recipe may read"), "%s", err.msg);
    /* the same absolute path, its directory on TRAINRUN_RECIPE_PATH: read */
    snprintf(text, sizeof text, "%s/recipes", cwd);
    setenv("TRAINRUN_RECIPE_PATH", text, 1);
    snprintf(path, sizeof path, "%s/abs.lua", tmpl);
    r = tr_recipe_load(path, NULL, 0, &test_paths, &err);
    setenv("TRAINRUN_RECIPE_PATH", "recipes/extra_path", 1);
    cr_assert_not_null(r, "%s", err.msg);
    expect_number(r, "seed", 1);
    tr_recipe_free(r);
    unlink(link);
    unlink(path);
    snprintf(path, sizeof path, "%s/linked.lua", tmpl);
    unlink(path);
    rmdir(tmpl);
}

Test(recipe, require_trainrun_module)
{
    struct tr_recipe *r = load("recipes/require_ok.lua");
    expect_number(r, "steps", 42);
    tr_recipe_free(r);
}

Test(recipe, model_builders_are_globals)
{
    struct tr_recipe *r = load("recipes/base.lua");
    expect_string(r, "model.kind", "gpt");
    expect_number(r, "model.n_layer", 2);
    tr_recipe_free(r);
}

Test(recipe, resolved_table_is_kept_for_lua)
{
    const char *ov[] = {"optim.lr=0.5"};
    struct tr_recipe *r = load_with("recipes/child.lua", ov, 1);
    lua_State *L = tr_recipe_lua(r);
    int top = lua_gettop(L);
    tr_recipe_push_resolved(r);
    cr_assert(lua_istable(L, -1));
    lua_getfield(L, -1, "optim");
    lua_getfield(L, -1, "lr");
    cr_assert_eq(lua_tonumber(L, -1), 0.5);
    lua_settop(L, top);
    cr_assert_str_eq(tr_recipe_path(r), "recipes/child.lua");
    tr_recipe_free(r);
}

Test(recipe, host_require_gives_the_recipes_module_instances)
{
    struct tr_recipe *r = load("recipes/require_ok.lua");
    lua_State *L = tr_recipe_lua(r);
    int top = lua_gettop(L);
    tr_err err = {{0}};
    cr_assert_eq(tr_recipe_require(r, "trainrun.helpers", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_recipe_require(r, "trainrun.helpers", &err), TR_OK, "%s", err.msg);
    cr_assert(lua_rawequal(L, -1, -2), "one instance per load");
    lua_getfield(L, -1, "double");
    lua_pushnumber(L, 4);
    cr_assert_eq(lua_pcall(L, 1, 1, 0), 0);
    cr_assert_eq(lua_tonumber(L, -1), 8);
    lua_settop(L, top);

    cr_assert_eq(tr_recipe_require(r, "trainrun.nope", &err), TR_ERROR);
    cr_assert_str_eq(err.msg, "require \"trainrun.nope\": not found "
                              "(searched: recipes/lua/trainrun/nope.lua, ../lua/trainrun/nope.lua)");
    cr_assert_eq(lua_gettop(L), top);
    tr_recipe_free(r);
}

/* ---- limits of recipe code ------------------------------------------------ */

/* The real trainrun.models and trainrun.nn (the stand-ins under recipes/lua
 * build no graphs). */
static const struct tr_recipe_paths real_paths = {
    .lua_dir = "../lua",
    .recipe_dir = "recipes/installed",
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Limits are meant to end a runaway recipe "within seconds"; a loaded test
 * machine gets some slack. */
#define WITHIN_SECONDS 20.0

/* From here on this test process may map at most `extra` more bytes: a
 * recipe that got past its heap limit would fail with a different message
 * (or crash) instead of the limit's.  (Criterion runs each test in its own
 * process.) */
static void cap_address_space(size_t extra)
{
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    unsigned long pages = 0;
    cr_assert_eq(fscanf(f, "%lu", &pages), 1);
    fclose(f);
    struct rlimit rl = {.rlim_cur = pages * (size_t)sysconf(_SC_PAGESIZE) + extra};
    rl.rlim_max = rl.rlim_cur;
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
}

/* Loading `path` with a heap limit of limit_mib fails, soon, with a message
 * that starts with `want`. */
static void expect_limit(const char *path, size_t limit_mib, const char *want)
{
    struct tr_recipe_paths paths = test_paths;
    paths.memory_limit = limit_mib << 20;
    tr_err err = {{0}};
    double start = now();
    struct tr_recipe *r = tr_recipe_load(path, NULL, 0, &paths, &err);
    double took = now() - start;
    cr_assert_null(r, "%s loaded but should fail with: %s", path, want);
    cr_assert(strncmp(err.msg, want, strlen(want)) == 0, "got:  %s\nwant: %s...", err.msg, want);
    cr_assert_lt(took, WITHIN_SECONDS, "%s took %.1f s to stop", path, took);
}

#define TOO_LONG "recipe took too long (infinite loop?); recipe code may run 50 million Lua instructions"
#define TOO_DEEP "recipe code is nested too deeply (runaway recursion through a library function"

Test(limits, loop_in_a_model_builder)
{
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/loop_in_build.lua", NULL, 0, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    double start = now();
    cr_assert_null(tr_model_build(r, 4, &err));
    cr_assert_lt(now() - start, WITHIN_SECONDS);
    cr_assert_str_eq(err.msg, "recipes/limits/loop_in_build.lua:6: " TOO_LONG
                              " and 5 s of CPU each time it is evaluated");
    /* the recipe stays usable: the next build is stopped the same way */
    cr_assert_null(tr_model_build(r, 4, &err));
    cr_assert(strstr(err.msg, "loop_in_build.lua:6: recipe took too long"), "%s", err.msg);
    tr_recipe_free(r);
}

Test(limits, loop_that_catches_every_error)
{
    expect_limit("recipes/limits/loop_caught.lua", 0, "recipes/limits/loop_caught.lua:4: " TOO_LONG);
}

Test(limits, loop_in_an_included_recipe)
{
    expect_limit("recipes/limits/loop_include.lua", 0, "recipes/limits/loop_base.lua:3: " TOO_LONG);
}

Test(limits, runaway_recursion_names_the_line)
{
    expect_limit("recipes/limits/recursion.lua", 0, "recipes/limits/recursion.lua:1: stack overflow");
    expect_limit("recipes/limits/recursion_index.lua", 0, "recipes/limits/recursion_index.lua:3: stack overflow");
}

/* Without a limit these overflowed the C stack: a segmentation fault. */
Test(limits, recursion_through_library_functions)
{
    expect_limit("recipes/limits/recursion_gsub.lua", 0, "recipes/limits/recursion_gsub.lua:2: " TOO_DEEP);
    expect_limit("recipes/limits/recursion_sort.lua", 0, "recipes/limits/recursion_sort.lua:1: " TOO_DEEP);
    expect_limit("recipes/limits/recursion_tostring.lua", 0, "recipes/limits/recursion_tostring.lua:1: " TOO_DEEP);
    expect_limit("recipes/limits/recursion_foreach.lua", 0, "recipes/limits/recursion_foreach.lua:3: stack overflow");
}

Test(limits, one_huge_allocation_is_refused_before_it_happens)
{
    cap_address_space((size_t)256 << 20); /* far less than the 1 GiB asked for */
    expect_limit("recipes/limits/alloc_rep.lua", 0,
                 "recipes/limits/alloc_rep.lua:2: recipe code needs more than 1024 MiB of memory, the limit for "
                 "recipes (something growing without end?)");
}

Test(limits, growing_tables_and_strings_stop_at_the_heap_limit)
{
    cap_address_space((size_t)512 << 20);
    const char *want = ": recipe code needs more than 64 MiB of memory, the limit for recipes";
    char buf[256];
    static const char *const cases[][2] = {
        {"recipes/limits/alloc_table.lua", "5"},
        {"recipes/limits/alloc_concat.lua", "3"},
        {"recipes/limits/alloc_caught.lua", "5"},
        {"recipes/limits/alloc_table_concat.lua", "5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(buf, sizeof buf, "%s:%s%s", cases[i][0], cases[i][1], want);
        expect_limit(cases[i][0], 64, buf);
    }
}

Test(limits, the_default_heap_limit_holds_for_table_concat)
{
    cap_address_space((size_t)1536 << 20);
    expect_limit("recipes/limits/alloc_table_concat.lua", 0,
                 "recipes/limits/alloc_table_concat.lua:5: recipe code needs more than 1024 MiB of memory");
}

Test(limits, backtracking_patterns_are_refused)
{
    expect_limit("recipes/limits/pattern.lua", 0,
                 "recipes/limits/pattern.lua:2: string.find: matching \".-.-.-b\" against a string of 30000 "
                 "characters could take hours");
    struct tr_recipe *r = load("recipes/limits/pattern_ok.lua");
    expect_number(r, "words", 3000);
    expect_number(r, "joined", 6000);
    expect_string(r, "first", "model");
    expect_string(r, "second", "layers");
    expect_number(r, "found", 0);
    tr_recipe_free(r);
}

Test(limits, errors_of_the_library_name_the_recipe_line)
{
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/lib_error.lua", NULL, 0, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    cr_assert_null(tr_model_build(r, 4, &err));
    cr_assert_str_eq(err.msg, "recipes/limits/lib_error.lua:5: nn.graph(batch): batch must be a positive number");
    tr_recipe_free(r);
}

Test(limits, a_limit_hit_inside_a_builtin_builder_names_the_model_line)
{
    /* between what loading the recipe and the builders takes (under 10 MiB)
     * and what building 1024 GPT blocks takes (over 14 MiB; 16 MiB sat at the
     * edge, and more builders in trainrun.nn/models moved the collector's
     * pace past it) */
    struct tr_recipe_paths paths = real_paths;
    paths.memory_limit = (size_t)12 << 20;
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/big_gpt.lua", NULL, 0, &paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    cr_assert_null(tr_model_build(r, 4, &err));
    cr_assert_str_eq(err.msg, "recipes/limits/big_gpt.lua:4: recipe code needs more than 12 MiB of memory, the "
                              "limit for recipes (something growing without end?)");
    tr_recipe_free(r);
}

/* ---- model graphs are checked -------------------------------------------- */

static void expect_graph_error(const char *defect, const char *want)
{
    char ov[64];
    snprintf(ov, sizeof ov, "model.case=%s", defect);
    const char *ovs[] = {ov};
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_graph.lua", ovs, 1, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    struct tr_graph *g = tr_model_build(r, 4, &err);
    cr_assert_null(g, "the %s graph was accepted", defect);
    char full[1024];
    snprintf(full, sizeof full, "recipes/limits/bad_graph.lua:33: model: %s", want);
    cr_assert_str_eq(err.msg, full, "defect %s:\ngot:  %s\nwant: %s", defect, err.msg, full);
    tr_recipe_free(r);
}

Test(model_graph, a_valid_graph_builds)
{
    tr_err err = {{0}};
    const char *ovs[] = {"model.case=none"};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_graph.lua", ovs, 1, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    struct tr_graph *g = tr_model_build(r, 4, &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(g->n_tensors, 7, "6 from the builder, 1 saved for backward (lse)");
    cr_assert_eq(g->loss, 5);
    cr_assert_eq(g->logits, 4);
    tr_graph_free(g, NULL);
    tr_recipe_free(r);
}

Test(model_graph, ids_out_of_range_or_not_whole_are_refused)
{
    expect_graph_error("loss_past_end", "the loss is 2147483648; it must be a tensor id, a whole number from 1 to 6");
    expect_graph_error("loss_fraction", "the loss is 1.5; it must be a tensor id, a whole number from 1 to 6");
    expect_graph_error("logits_huge",
                       "the logits is 4.6116860184273879e+18; it must be a tensor id, a whole number from 1 to 6");
    expect_graph_error("input_zero",
                       "node 1 (linear 'head'): input 1 is 0; it must be a tensor id, a whole number from 1 to 6");
    expect_graph_error("input_negative",
                       "node 1 (linear 'head'): input 2 is -1; it must be a tensor id, a whole number from 1 to 6");
    expect_graph_error("output_past_end", "node 1 (linear 'head'): the output is 4294967297; it must be a tensor "
                                          "id, a whole number from 1 to 6");
    expect_graph_error("too_many_inputs", "node 1 (linear 'head') has 4 inputs; ops take 1 to 3");
}

Test(model_graph, dimensions_are_checked_before_any_size_is_computed)
{
    expect_graph_error("dim_zero", "tensor 1 ('features'): dimension 2 is 0; dimensions are whole numbers from "
                                   "1 to 2147483647");
    expect_graph_error("dim_negative", "tensor 1 ('features'): dimension 2 is -16; dimensions are whole numbers "
                                       "from 1 to 2147483647");
    expect_graph_error("dim_huge", "tensor 3 ('head.weight'): dimension 1 is 4.6116860184273879e+18; dimensions "
                                   "are whole numbers from 1 to 2147483647");
    expect_graph_error("dims_overflow", "tensor 3 ('head.weight') has more than 2^40 elements; no device holds that");
    expect_graph_error("shape_string", "tensor 1 ('features') has no shape (a list of 1 to 4 dimensions)");
}

Test(model_graph, unexpected_tables_and_values_are_refused)
{
    expect_graph_error("role_unknown",
                       "tensor 1 ('features'): 'role' is the string \"weights\"; expected one of \"input\", "
                       "\"param\", \"activation\", \"buffer\"");
    expect_graph_error("same_name", "two tensors are named 'head.weight'; names must be unique");
    expect_graph_error("feeds_param",
                       "input 1 is tensor 'head.weight', which is not an input (declare it with g:input)");
    expect_graph_error("three_inputs", "declares 3 inputs; trainrun feeds two (the sample and its targets, in "
                                       "that order)");
    expect_graph_error("tensors_missing", "the graph has no list of tensors (return g:finish{...} from the builder)");
    expect_graph_error("node_not_table", "node 1 is a number, not a node table");
    expect_graph_error("heads_huge",
                       "node 1 (linear 'head'): 'heads' is 1099511627776; it must be a whole number from 0 to "
                       "2147483647");
    expect_graph_error("eps_nan", "node 1 (linear 'head'): 'eps' is nan; it must be a number between 0 and 1");
}

Test(model_graph, metamethods_of_the_result_do_not_run)
{
    tr_err err = {{0}};
    const char *ovs[] = {"model.case=metatable"};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_graph.lua", ovs, 1, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    double start = now();
    struct tr_graph *g = tr_model_build(r, 4, &err);
    cr_assert_lt(now() - start, WITHIN_SECONDS);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(g->logits, -1);
    tr_graph_free(g, NULL);
    tr_recipe_free(r);
}

/* The Llama-family ops: each defect a hand-written graph could carry is
 * refused with the op, the node and what is wrong. */
static void expect_llama_graph_error(const char *defect, const char *want)
{
    char ov[64];
    snprintf(ov, sizeof ov, "model.case=%s", defect);
    const char *ovs[] = {ov};
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_llama_graph.lua", ovs, 1, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    struct tr_graph *g = tr_model_build(r, 4, &err);
    cr_assert_null(g, "the %s graph was accepted", defect);
    char full[1024];
    snprintf(full, sizeof full, "recipes/limits/bad_llama_graph.lua:40: model: %s", want);
    cr_assert_str_eq(err.msg, full, "defect %s:\ngot:  %s\nwant: %s", defect, err.msg, full);
    tr_recipe_free(r);
}

static const struct tr_node *node_named(const struct tr_graph *g, const char *name)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (strcmp(g->nodes[i].name, name) == 0)
            return &g->nodes[i];
    cr_assert_fail("no node '%s'", name);
    return NULL;
}

Test(model_graph, llama_ops_build_with_their_attributes_and_saved_tensors)
{
    tr_err err = {{0}};
    const char *ovs[] = {"model.case=none"};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_llama_graph.lua", ovs, 1, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    struct tr_graph *g = tr_model_build(r, 4, &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(node_named(g, "embed_scale")->op, TR_OP_SCALE);
    cr_assert_eq(node_named(g, "embed_scale")->scale, 4.0f);
    const struct tr_node *norm = node_named(g, "norm");
    cr_assert_eq(norm->op, TR_OP_RMSNORM);
    cr_assert_eq(norm->eps, 1e-6f);
    cr_assert_eq(norm->n_aux, 1, "rmsnorm saves rstd only");
    const struct tr_tensor *rstd = &g->tensors[norm->aux[0]];
    cr_assert_str_eq(rstd->name, "norm.rstd");
    cr_assert_eq(rstd->ndim, 1);
    cr_assert_eq(rstd->shape[0], 4 * 4, "one per row: B x T");
    cr_assert_eq(node_named(g, "q_rope")->theta, 10000.0f);
    cr_assert_eq(node_named(g, "k_rope")->theta, 500000.0f);
    cr_assert_eq(node_named(g, "k_rope")->heads, 2);
    const struct tr_node *attn = node_named(g, "attn");
    cr_assert_eq(attn->n_in, 3);
    cr_assert_eq(attn->heads, 4);
    cr_assert_eq(attn->kv_heads, 2);
    const struct tr_tensor *lse = &g->tensors[attn->aux[0]];
    cr_assert_eq(lse->ndim, 3);
    cr_assert(lse->shape[0] == 4 && lse->shape[1] == 4 && lse->shape[2] == 4, "lse[B, H, T]");
    cr_assert_eq(node_named(g, "packed")->kv_heads, 4, "the packed form has kv_heads = heads");
    cr_assert_eq(node_named(g, "act")->op, TR_OP_SWIGLU);
    tr_graph_free(g, NULL);
    tr_recipe_free(r);
}

Test(model_graph, llama_op_defects_are_refused)
{
    expect_llama_graph_error("heads_not_dividing", "attention 'attn': 3 heads do not divide the width 16 of q 'q_rope'");
    expect_llama_graph_error("kv_heads_not_dividing",
                             "attention 'attn': 3 key/value heads do not divide the 4 heads; each key/value head "
                             "serves a whole group of query heads");
    expect_llama_graph_error("kv_heads_negative", "node 11 (attention 'attn'): 'kv_heads' is -2; it must be a whole "
                                                  "number from 0 to 2147483647");
    expect_llama_graph_error("kv_width", "attention 'attn': k 'k_rope' [4,4,8] and v 'v' [4,4,8] must be 4 wide "
                                         "(kv_heads 1 x head dim 4) to go with q 'q_rope' [4,4,16] over 4 heads");
    expect_llama_graph_error("two_inputs", "attention 'attn': takes 1 input (packed qkv) or 3 (q, k, v), got 2");
    expect_llama_graph_error("packed_kv_heads",
                             "attention 'packed': packed qkv attention has as many key/value heads as heads (4), "
                             "not 2; give q, k and v separately for grouped-query attention");
    expect_llama_graph_error("rope_odd", "rope 'q_rope': head dim 1 of 'q' (16 wide over 16 heads) is odd; rotary "
                                         "embedding turns pairs of channels (i, i+D/2), so it needs an even head dim");
    expect_llama_graph_error("rope_theta_zero", "node 5 (rope 'q_rope'): 'theta' is 0; it must be a finite number "
                                                "above 0 (within a float's range)");
    expect_llama_graph_error("rope_theta_inf", "node 7 (rope 'k_rope'): 'theta' is inf; it must be a finite number "
                                               "above 0 (within a float's range)");
    expect_llama_graph_error("rope_theta_string", "node 7 (rope 'k_rope'): 'theta' is the string \"10000\"; it must "
                                                  "be a finite number above 0 (within a float's range)");
    expect_llama_graph_error("scale_huge", "node 2 (scale 'embed_scale'): 'scale' is 1.0000000000000001e+300; it "
                                           "must be a finite number (within a float's range)");
    expect_llama_graph_error("rmsnorm_weight", "rmsnorm 'norm': weight 'k.weight' [8,16] must have 16 elements (the "
                                               "last dimension of 'embed_scale' [4,4,16])");
    expect_llama_graph_error("rmsnorm_eps", "node 3 (rmsnorm 'norm'): 'eps' is -1; it must be a number between 0 "
                                            "and 1");
    expect_llama_graph_error("swiglu_shapes", "swiglu 'act': gate 'gate' [4,4,12] and up 'q' [4,4,16] differ in "
                                              "shape");
    expect_llama_graph_error("swiglu_int", "swiglu 'act': input 'targets' must be floating point");
}

/* The same mistakes made through trainrun.nn are reported at the line of
 * the builder that made them. */
Test(model_graph, llama_op_shape_errors_name_the_builder_line)
{
    struct { const char *c, *want; } cases[] = {
        {"kv_width", "recipes/limits/bad_llama_builder.lua:14: gqa_attention: k 'k' [4,4,8] and v 'k' [4,4,8] must "
                     "be 4 wide (kv_heads 1 x head dim 4) to go with q 'q' [4,4,16] over 4 heads"},
        {"kv_heads", "recipes/limits/bad_llama_builder.lua:15: gqa_attention: 3 key/value heads do not divide the "
                     "4 heads; each key/value head serves a whole group of query heads"},
        {"rope_odd", "recipes/limits/bad_llama_builder.lua:16: rope: head dim 1 of 'q' (16 wide over 16 heads) is "
                     "odd; rotary embedding turns pairs of channels (i, i+D/2), so it needs an even head dim"},
        {"rope_theta", "recipes/limits/bad_llama_builder.lua:17: rope: 'theta' is -1; it must be a finite number "
                       "above 0 (within a float's range)"},
        {"rmsnorm_weight", "recipes/limits/bad_llama_builder.lua:18: rmsnorm: weight 'w' [8] must have 16 elements "
                           "(the last dimension of 'embed' [4,4,16])"},
        {"swiglu", "recipes/limits/bad_llama_builder.lua:19: swiglu: gate 'q' [4,4,16] and up 'k' [4,4,8] differ "
                   "in shape"},
        {"scale", "recipes/limits/bad_llama_builder.lua:20: scale: 'scale' is inf; it must be a finite number "
                  "(within a float's range)"},
    };
    for (size_t i = 0; i <= sizeof cases / sizeof *cases; i++) {
        char ov[64];
        snprintf(ov, sizeof ov, "model.case=%s", i < sizeof cases / sizeof *cases ? cases[i].c : "none");
        const char *ovs[] = {ov};
        tr_err err = {{0}};
        struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_llama_builder.lua", ovs, 1, &real_paths, &err);
        cr_assert_not_null(r, "%s", err.msg);
        struct tr_graph *g = tr_model_build(r, 4, &err);
        if (i == sizeof cases / sizeof *cases) { /* without a mistake it builds */
            cr_assert_not_null(g, "%s", err.msg);
            tr_graph_free(g, NULL);
        } else {
            cr_assert_null(g, "%s was accepted", cases[i].c);
            cr_assert_str_eq(err.msg, cases[i].want);
        }
        tr_recipe_free(r);
    }
}

/* ---- the llama builder ---------------------------------------------------- */

static struct tr_graph *build_llama(const char *const *overrides, int n, tr_err *err)
{
    struct tr_recipe *r = tr_recipe_load("config/plan_llama.lua", overrides, n, &real_paths, err);
    cr_assert_not_null(r, "%s", err->msg);
    struct tr_graph *g = tr_model_build(r, 2, err);
    tr_recipe_free(r);
    return g;
}

static const struct tr_tensor *param(const struct tr_graph *g, const char *name, int64_t d0, int64_t d1)
{
    int i = tr_graph_find(g, name);
    cr_assert(i >= 0, "no tensor '%s'", name);
    const struct tr_tensor *t = &g->tensors[i];
    cr_assert_eq(t->role, TR_ROLE_PARAM, "'%s' is not a parameter", name);
    cr_assert_eq(t->ndim, d1 ? 2 : 1, "'%s' has %d dimensions", name, t->ndim);
    cr_assert_eq(t->shape[0], d0, "'%s' dimension 1", name);
    if (d1)
        cr_assert_eq(t->shape[1], d1, "'%s' dimension 2", name);
    return t;
}

static int count_params(const struct tr_graph *g)
{
    int n = 0;
    for (int i = 0; i < g->n_tensors; i++)
        n += g->tensors[i].role == TR_ROLE_PARAM;
    return n;
}

Test(llama, parameters_carry_hugging_face_names_shapes_and_init, .init = enter_test_dir)
{
    tr_err err = {{0}};
    struct tr_graph *g = build_llama(NULL, 0, &err); /* V 64, C 32, H 4, KV 2 (D 8), F 48, L 2 */
    cr_assert_not_null(g, "%s", err.msg);
    const struct tr_tensor *t = param(g, "model.embed_tokens.weight", 64, 32);
    cr_assert(t->init == TR_INIT_NORMAL && t->init_std == 0.02 && t->decay);
    for (int l = 0; l < 2; l++) {
        char name[96];
        const char *norms[] = {"input_layernorm", "post_attention_layernorm"};
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, norms[k]);
            t = param(g, name, 32, 0);
            cr_assert(t->init == TR_INIT_ONES && !t->decay, "%s: ones, no weight decay", name);
        }
        struct { const char *what; int64_t out, in; } mats[] = {
            {"self_attn.q_proj", 32, 32}, {"self_attn.k_proj", 16, 32}, {"self_attn.v_proj", 16, 32},
            {"self_attn.o_proj", 32, 32}, {"mlp.gate_proj", 48, 32},    {"mlp.up_proj", 48, 32},
            {"mlp.down_proj", 32, 48},
        };
        for (size_t k = 0; k < sizeof mats / sizeof *mats; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, mats[k].what);
            t = param(g, name, mats[k].out, mats[k].in);
            cr_assert(t->init == TR_INIT_NORMAL && t->init_std == 0.02 && t->decay, "%s", name);
            snprintf(name, sizeof name, "model.layers.%d.%s.bias", l, mats[k].what);
            cr_assert_eq(tr_graph_find(g, name), -1, "Llama has no bias: %s", name);
        }
    }
    param(g, "model.norm.weight", 32, 0);
    param(g, "lm_head.weight", 64, 32);
    cr_assert_eq(count_params(g), 1 + 2 * 9 + 2, "embedding, 9 per layer, final norm, lm_head");
    const struct tr_node *attn = node_named(g, "model.layers.1.self_attn");
    cr_assert(attn->op == TR_OP_ATTENTION && attn->n_in == 3 && attn->heads == 4 && attn->kv_heads == 2);
    cr_assert_eq(node_named(g, "model.layers.0.self_attn.q_rope")->theta, 10000.0f);
    cr_assert_eq(node_named(g, "model.layers.0.self_attn.k_rope")->heads, 2);
    cr_assert_eq(node_named(g, "model.norm")->eps, 1e-5f);
    for (int i = 0; i < g->n_nodes; i++)
        cr_assert(g->nodes[i].op != TR_OP_SCALE && g->nodes[i].segment == 0,
                  "no embedding scale, no recompute by default");
    tr_graph_free(g, NULL);
}

Test(llama, options_tie_bias_scale_theta_eps_std_and_recompute, .init = enter_test_dir)
{
    tr_err err = {{0}};
    const char *ov[] = {"model.tie_embeddings=true", "model.qkv_bias=true", "model.embed_scale=5.5",
                        "model.rope_theta=1000000", "model.norm_eps=1e-6", "model.init_std=0.01",
                        "model.recompute=1"};
    struct tr_graph *g = build_llama(ov, 7, &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(tr_graph_find(g, "lm_head.weight"), -1, "tied: no lm_head.weight");
    const struct tr_node *head = node_named(g, "lm_head");
    cr_assert_str_eq(g->tensors[head->in[1]].name, "model.embed_tokens.weight");
    const struct tr_tensor *b = param(g, "model.layers.0.self_attn.k_proj.bias", 16, 0);
    cr_assert(b->init == TR_INIT_ZEROS && !b->decay);
    param(g, "model.layers.1.self_attn.q_proj.bias", 32, 0);
    cr_assert_eq(tr_graph_find(g, "model.layers.0.self_attn.o_proj.bias"), -1, "Qwen2: q, k, v biases only");
    cr_assert_eq(count_params(g), 1 + 2 * 12 + 1);
    cr_assert_eq(node_named(g, "embed_scale")->scale, 5.5f);
    cr_assert_eq(node_named(g, "model.layers.1.self_attn.k_rope")->theta, 1e6f);
    cr_assert_eq(node_named(g, "model.layers.0.post_attention_layernorm")->eps, 1e-6f);
    cr_assert_eq(g->tensors[tr_graph_find(g, "model.layers.0.mlp.up_proj.weight")].init_std, 0.01);
    cr_assert(node_named(g, "model.layers.0.mlp.act")->segment > 0, "recompute=1: every block");
    cr_assert(node_named(g, "model.layers.1.self_attn")->segment > 0);
    tr_graph_free(g, NULL);
}

Test(llama, bad_options_are_named, .init = enter_test_dir)
{
    struct { const char *override, *want; } cases[] = {
        {"model.kv_heads=3", "llama: kv_heads (3) must divide heads (4)"},
        {"model.heads=3", "llama: heads (3) must divide dim (32)"},
        {"model.heads=32", "llama: the head dim dim/heads = 1 must be even for rotary embeddings"},
        {"model.rope_theta=0", "llama: option 'rope_theta' must be a number above 0 and at most 1e+12, got 0"},
        {"model.norm_eps=-1", "llama: option 'norm_eps' must be a number above 0 and at most 0.5, got -1"},
        {"model.init_std=-0.5", "llama: option 'init_std' must be a number from 0 and at most 1e+06, got -0.5"},
        {"model.tie_embeddings=1", "llama: option 'tie_embeddings' must be true or false, got 1"},
        {"model.ffn=64", "llama: unknown option 'ffn'; options: ctx, dim, embed_scale, ffn_dim, heads, init_std, "
                         "kv_heads, layers, norm_eps, qkv_bias, recompute, rope_factor, rope_high_freq_factor, "
                         "rope_low_freq_factor, rope_original_ctx, rope_theta, tie_embeddings, vocab"},
        {"model.rope_factor=8", "rope_low_freq_factor 0 and rope_high_freq_factor 0 must be finite"},
        {"model.rope_original_ctx=8192", "need a rope_factor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tr_err err = {{0}};
        const char *ov[] = {cases[i].override};
        struct tr_graph *g = build_llama(ov, 1, &err);
        cr_assert_null(g, "%s was accepted", cases[i].override);
        cr_assert(strstr(err.msg, cases[i].want), "%s:\ngot:  %s\nwant: %s", cases[i].override, err.msg,
                  cases[i].want);
        /* an error about one option points where it was set (here the
         * command line); a rule between options, at the model's line */
        if (strstr(cases[i].want, "option '"))
            cr_assert(strncmp(err.msg, "command line: ", 14) == 0, "names the override: %s", err.msg);
        else
            cr_assert(strncmp(err.msg, "config/plan_llama.lua:", 22) == 0, "names the recipe: %s", err.msg);
    }
}

/* ---- origins -------------------------------------------------------------- */

Test(recipe, inherited_value_points_at_base)
{
    struct tr_recipe *r = load("recipes/child.lua");
    expect_origin(get(r, "optim.name"), "recipes/base.lua:5");
    expect_origin(get(r, "optim.lr"), "recipes/child.lua:5");
    expect_origin(get(r, "model.n_layer"), "recipes/base.lua:3");
    tr_recipe_free(r);
}

Test(recipe, override_origin_is_command_line)
{
    const char *ov[] = {"optim.lr=0.01"};
    struct tr_recipe *r = load_with("recipes/child.lua", ov, 1);
    expect_origin(get(r, "optim.lr"), "command line");
    tr_recipe_free(r);
}

Test(recipe, origin_of_misspelled_and_missing_keys)
{
    struct tr_recipe *r = load("recipes/typo.lua");
    struct tr_origin o;
    cr_assert_eq(tr_recipe_origin(r, "schedule.wramup", &o), 1);
    cr_assert_eq(o.kind, TR_FROM_RECIPE);
    cr_assert_str_eq(o.file, "recipes/typo.lua");
    cr_assert_eq(o.line, 4);
    cr_assert_eq(tr_recipe_origin(r, "schedule.warmup", &o), 1);
    cr_assert_str_eq(o.file, "recipes/base.lua");
    cr_assert_eq(o.line, 9);
    /* not in the recipe at all: the enclosing table's key */
    cr_assert_eq(tr_recipe_origin(r, "schedule.cooldown", &o), 1);
    cr_assert_str_eq(o.file, "recipes/typo.lua");
    cr_assert_eq(o.line, 3);
    cr_assert_eq(tr_recipe_origin(r, "nothing.here", &o), 0);
    tr_recipe_free(r);
}

Test(recipe, origins_of_locals_builders_and_assignments)
{
    struct tr_recipe *r = load("recipes/origins.lua");
    expect_origin(get(r, "optim.lr"), "recipes/origins.lua:2");     /* by suffix, in a local table */
    expect_origin(get(r, "model.n_layer"), "recipes/origins.lua:6"); /* inside gpt { ... } */
    expect_origin(get(r, "model.n_embd"), "recipes/origins.lua:6");  /* computed: the enclosing key */
    expect_origin(get(r, "steps"), "recipes/origins.lua:8");         /* cfg.steps = 100 */
    tr_recipe_free(r);
}

/* ---- the C tree --------------------------------------------------------------- */

static char *dump_text(const struct tr_value *root)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tr_value_dump(root, f);
    fclose(f);
    return text;
}

Test(recipe, dump_of_small_recipe)
{
    const char *ov[] = {"steps=5"};
    struct tr_recipe *r = load_with("recipes/dump.lua", ov, 1);
    cr_assert_eq(get(r, "build")->type, TR_V_FUNCTION);
    char *text = dump_text(tr_recipe_root(r));
    cr_assert_str_eq(text, "build = <function>   -- recipes/dump.lua:7\n"
                           "empty = {}           -- recipes/dump.lua:8\n"
                           "flags.fast = true    -- recipes/dump.lua:6\n"
                           "layers.1 = 64        -- recipes/dump.lua:5\n"
                           "layers.2 = 32        -- recipes/dump.lua:5\n"
                           "lr = 3e-4            -- recipes/dump.lua:3\n"
                           "name = \"tiny\"        -- recipes/dump.lua:2\n"
                           "steps = 5            -- command line\n");
    free(text);
    tr_recipe_free(r);
}

static void expect_format(const struct tr_value *v, const char *want)
{
    char buf[256];
    tr_value_format(v, buf, sizeof buf);
    cr_assert_str_eq(buf, want);
}

Test(value, numbers_print_in_shortest_exact_form)
{
    struct tr_origin o = {TR_FROM_DEFAULT, NULL, 0};
    struct tr_value *v = tr_value_new(TR_V_NUMBER, "x", o);
    const struct {
        double number;
        const char *text;
    } cases[] = {{100, "100"},  {3e-4, "3e-4"}, {0.1, "0.1"},      {0.95, "0.95"},     {-0.5, "-0.5"},
                 {1e20, "1e20"}, {2.5e-5, "2.5e-5"}, {1.0 / 3, "0.3333333333333333"}, {123456789, "123456789"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        v->number = cases[i].number;
        expect_format(v, cases[i].text);
    }
    tr_value_free(v);
}

Test(value, tables_strings_and_origins_format)
{
    struct tr_origin o = {TR_FROM_RECIPE, "r.lua", 3};
    struct tr_value *t = tr_value_new(TR_V_TABLE, NULL, o);
    struct tr_value *b = tr_value_new(TR_V_STRING, "b", o);
    tr_value_set_string(b, "say \"hi\"\n");
    tr_value_put(t, b);
    struct tr_value *item = tr_value_new(TR_V_NUMBER, "1", o);
    item->is_list_item = 1;
    item->number = 7;
    tr_value_put(t, item); /* list items go before named keys */
    struct tr_value *odd = tr_value_new(TR_V_BOOL, "a-b", o);
    tr_value_put(t, odd);
    expect_format(t, "{7, [\"a-b\"] = false, b = \"say \\\"hi\\\"\\n\"}");
    cr_assert_eq(tr_value_get(t, "b"), b);
    cr_assert_null(tr_value_get(t, "b.c"));

    char buf[64];
    tr_origin_format(&o, buf, sizeof buf);
    cr_assert_str_eq(buf, "r.lua:3");
    struct tr_origin env = {TR_FROM_ENV, "TRAINRUN_PRECISION", 0};
    tr_value_set_origin(odd, env);
    tr_origin_format(&odd->origin, buf, sizeof buf);
    cr_assert_str_eq(buf, "env TRAINRUN_PRECISION");
    struct tr_origin def = {TR_FROM_DEFAULT, NULL, 0};
    tr_origin_format(&def, buf, sizeof buf);
    cr_assert_str_eq(buf, "default");

    /* replacing a key frees the old child */
    struct tr_value *b2 = tr_value_new(TR_V_NUMBER, "b", o);
    tr_value_put(t, b2);
    cr_assert_eq(t->n_items, 3);
    cr_assert_eq(tr_value_child(t, "b"), b2);
    tr_value_free(t);
}

/* ---- convolutional models --------------------------------------------------- */

/* A conv graph's defect, put in after g:finish, refused at the model's line. */
static void expect_conv_error(const char *defect, const char *want)
{
    char ov[64];
    snprintf(ov, sizeof ov, "model.case=%s", defect);
    const char *ovs[] = {ov};
    tr_err err = {{0}};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_conv.lua", ovs, 1, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    struct tr_graph *g = tr_model_build(r, 4, &err);
    cr_assert_null(g, "the %s graph was accepted", defect);
    char full[1024];
    snprintf(full, sizeof full, "recipes/limits/bad_conv.lua:29: model: %s", want);
    cr_assert_str_eq(err.msg, full, "defect %s:\ngot:  %s\nwant: %s", defect, err.msg, full);
    tr_recipe_free(r);
}

static const struct tr_node *conv_node(const struct tr_graph *g, const char *name)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (strcmp(g->nodes[i].name, name) == 0)
            return &g->nodes[i];
    cr_assert_fail("no node '%s'", name);
    return NULL;
}

Test(model_graph, conv_ops_build_with_their_attributes_defaults_and_buffers)
{
    tr_err err = {{0}};
    const char *ovs[] = {"model.case=none"};
    struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_conv.lua", ovs, 1, &real_paths, &err);
    cr_assert_not_null(r, "%s", err.msg);
    struct tr_graph *g = tr_model_build(r, 4, &err);
    cr_assert_not_null(g, "%s", err.msg);
    const struct tr_node *conv = conv_node(g, "conv");
    cr_assert(conv->op == TR_OP_CONV2D && conv->kernel[0] == 3 && conv->kernel[1] == 3,
              "the kernel is the weight's window");
    cr_assert(conv->stride[0] == 1 && conv->stride[1] == 1 && conv->pad[0] == 1 && conv->pad[1] == 1);
    cr_assert(conv->dilation[0] == 1 && conv->dilation[1] == 1 && conv->groups == 1);
    const struct tr_tensor *y = &g->tensors[conv->out];
    cr_assert(y->ndim == 4 && y->shape[0] == 4 && y->shape[1] == 6 && y->shape[2] == 6 && y->shape[3] == 4);
    const struct tr_node *bn = conv_node(g, "bn");
    cr_assert(bn->op == TR_OP_BATCHNORM && bn->eps == 1e-5f && bn->momentum == 0.1f);
    const struct tr_tensor *running = &g->tensors[bn->buffer];
    cr_assert_str_eq(running->name, "bn.running");
    cr_assert(running->role == TR_ROLE_BUFFER && running->ndim == 2 && running->shape[0] == 2 &&
              running->shape[1] == 4);
    cr_assert_eq(bn->n_aux, 2, "batch mean and rstd saved for backward");
    cr_assert(g->tensors[bn->aux[0]].numel == 4 && g->tensors[bn->aux[1]].numel == 4);
    const struct tr_node *pool = conv_node(g, "pool");
    cr_assert(pool->op == TR_OP_MAXPOOL && pool->kernel[0] == 2 && pool->stride[0] == 2 &&
              pool->stride[1] == 2 && pool->pad[0] == 0, "pooling strides by its window");
    cr_assert_eq(g->tensors[pool->out].shape[1], 3);
    const struct tr_node *gap = conv_node(g, "gap");
    cr_assert(g->tensors[gap->out].ndim == 2 && g->tensors[gap->out].shape[1] == 4);
    tr_graph_free(g, NULL);
    tr_recipe_free(r);
}

Test(model_graph, conv_attribute_defects_are_refused)
{
    expect_conv_error("stride_zero", "node 1 (conv2d 'conv'): 'stride' is 0; it must be a whole number from 1 "
                      "to 65536, or a pair {h, w} of them");
    expect_conv_error("stride_fraction", "node 1 (conv2d 'conv'): 'stride' is {1, 1.5}; it must be a whole "
                      "number from 1 to 65536, or a pair {h, w} of them");
    expect_conv_error("stride_triple", "node 1 (conv2d 'conv'): 'stride' is a table of 3 items; it must be a "
                      "whole number from 1 to 65536, or a pair {h, w} of them");
    expect_conv_error("pad_negative", "node 1 (conv2d 'conv'): 'pad' is -1; it must be a whole number from 0 "
                      "to 65536, or a pair {h, w} of them");
    expect_conv_error("dilation_huge", "node 1 (conv2d 'conv'): 'dilation' is 1099511627776; it must be a whole "
                      "number from 1 to 65536, or a pair {h, w} of them");
    expect_conv_error("groups_zero", "node 1 (conv2d 'conv'): 'groups' is 0; it must be a whole number from 1 "
                      "to 2147483647");
    expect_conv_error("groups_not_dividing", "conv2d 'conv': 3 groups must divide the 2 input channels of "
                      "'images' and the 4 output channels of 'conv.weight'");
    expect_conv_error("window_too_big", "conv2d 'conv': the window 3x3 (dilation 5x5) does not fit input "
                      "'images' [4,6,6,2] padded by 1x1; use a smaller window or more padding");
    expect_conv_error("kernel_not_weight", "conv2d 'conv': kernel 5x5 differs from the window of weight "
                      "'conv.weight' [4,3,3,2]");
    expect_conv_error("image_flat", "conv2d 'conv': input 'images' [4,36] must be an image batch x[B,H,W,C] "
                      "(channel-last)");
    expect_conv_error("pool_pad", "maxpool 'pool': padding 2x2 is more than half the window 2x2");
    expect_conv_error("pool_no_kernel", "maxpool 'pool': needs a window: kernel 0x0 (1 or more on each side)");
}

Test(model_graph, batchnorm_buffer_defects_are_refused)
{
    const char *momentum = "; it must be a number above 0 and at most 1 (the weight of each batch in the running "
                           "statistics)";
    char want[300];
    snprintf(want, sizeof want, "node 2 (batchnorm 'bn'): 'momentum' is 0%s", momentum);
    expect_conv_error("momentum_zero", want);
    snprintf(want, sizeof want, "node 2 (batchnorm 'bn'): 'momentum' is 1.5%s", momentum);
    expect_conv_error("momentum_big", want);
    expect_conv_error("buffer_missing", "batchnorm 'bn': needs its running statistics: a buffer tensor "
                      "running[2,4] (the buffer attribute)");
    expect_conv_error("buffer_not_buffer", "batchnorm 'bn': 'images' is not a buffer; its running statistics "
                      "must be a buffer tensor running[2,4] (the buffer attribute; g:buffer in a recipe)");
    expect_conv_error("buffer_past_end", "node 2 (batchnorm 'bn'): the buffer is 2147483648; it must be a "
                      "tensor id, a whole number from 1 to 19");
    expect_conv_error("buffer_shape", "batchnorm 'bn': buffer 'bn.running' [4] must be [2,4]: the running mean "
                      "and variance of each channel");
    expect_conv_error("buffer_as_input", "maxpool 'pool': input 'bn.running' is a buffer (running statistics); "
                      "only batchnorm reads it, through its buffer attribute");
    expect_conv_error("buffer_shared", "batchnorm 'bn2': buffer 'bn.running' is already the running statistics "
                      "of 'bn'; each batchnorm needs its own");
}

Test(model_graph, conv_op_mistakes_name_the_builder_line)
{
    struct { const char *c, *want; } cases[] = {
        {"window", "recipes/limits/bad_conv_builder.lua:12: conv2d: the window 7x7 (dilation 1x1) does not fit "
                   "input 'images' [4,6,6,2] padded by 0x0; use a smaller window or more padding"},
        {"groups", "recipes/limits/bad_conv_builder.lua:13: conv2d: weight 'w' [4,3,3,2] must have 1 input "
                   "channels (the 2 of 'images' over 2 groups) in its last dimension"},
        {"stride", "recipes/limits/bad_conv_builder.lua:14: conv2d: 'stride' is {1, 0}; it must be a whole "
                   "number from 1 to 65536, or a pair {h, w} of them"},
        {"flat", "recipes/limits/bad_conv_builder.lua:15: maxpool: input 'flat' [4,36] must be an image batch "
                 "x[B,H,W,C] (channel-last)"},
        {"pool_pad", "recipes/limits/bad_conv_builder.lua:16: avgpool: padding 2x2 is more than half the window "
                     "3x3"},
        {"running", "recipes/limits/bad_conv_builder.lua:17: batchnorm: 'r' is not a buffer; its running "
                    "statistics must be a buffer tensor running[2,2] (the buffer attribute; g:buffer in a "
                    "recipe)"},
        {"momentum", "recipes/limits/bad_conv_builder.lua:18: batchnorm: 'momentum' is 0; it must be a number "
                     "above 0 and at most 1 (the weight of each batch in the running statistics)"},
    };
    size_t n = sizeof cases / sizeof *cases;
    for (size_t i = 0; i <= n; i++) {
        char ov[64];
        snprintf(ov, sizeof ov, "model.case=%s", i < n ? cases[i].c : "none");
        const char *ovs[] = {ov};
        tr_err err = {{0}};
        struct tr_recipe *r = tr_recipe_load("recipes/limits/bad_conv_builder.lua", ovs, 1, &real_paths, &err);
        cr_assert_not_null(r, "%s", err.msg);
        struct tr_graph *g = tr_model_build(r, 4, &err);
        if (i == n) { /* without a mistake it builds: conv, pools, batch norm */
            cr_assert_not_null(g, "%s", err.msg);
            const struct tr_node *avg = conv_node(g, "avg");
            cr_assert(avg->op == TR_OP_AVGPOOL && avg->kernel[0] == 3 && avg->stride[0] == 1 && avg->pad[1] == 1);
            tr_graph_free(g, NULL);
        } else {
            cr_assert_null(g, "%s was accepted", cases[i].c);
            cr_assert_str_eq(err.msg, cases[i].want);
        }
        tr_recipe_free(r);
    }
}

static struct tr_graph *build_recipe(const char *path, const char *const *overrides, int n, tr_err *err)
{
    struct tr_recipe *r = tr_recipe_load(path, overrides, n, &real_paths, err);
    cr_assert_not_null(r, "%s", err->msg);
    struct tr_graph *g = tr_model_build(r, 2, err);
    tr_recipe_free(r);
    return g;
}

static const struct tr_tensor *image_tensor(const struct tr_graph *g, const char *name, enum tr_role role,
                                            int ndim, const int64_t *shape)
{
    int i = tr_graph_find(g, name);
    cr_assert(i >= 0, "no tensor '%s'", name);
    const struct tr_tensor *t = &g->tensors[i];
    cr_assert_eq(t->role, role, "'%s' role %d", name, (int)t->role);
    cr_assert_eq(t->ndim, ndim, "'%s' has %d dimensions", name, t->ndim);
    for (int d = 0; d < ndim; d++)
        cr_assert_eq(t->shape[d], shape[d], "'%s' dimension %d is %lld", name, d + 1, (long long)t->shape[d]);
    return t;
}

Test(cnn, builds_stages_of_conv_batchnorm_relu_and_a_head, .init = enter_test_dir)
{
    tr_err err = {{0}};
    struct tr_graph *g = build_recipe("recipes/limits/cnn_options.lua", NULL, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    image_tensor(g, "images", TR_ROLE_INPUT, 4, (int64_t[]){2, 8, 8, 1});
    const struct tr_tensor *w = image_tensor(g, "stages.0.0.conv.weight", TR_ROLE_PARAM, 4, (int64_t[]){4, 3, 3, 1});
    cr_assert(w->init == TR_INIT_NORMAL && w->decay && fabs(w->init_std - sqrt(2.0 / 9)) < 1e-12,
              "He init from the fan-in, weight-decayed");
    image_tensor(g, "stages.1.1.conv.weight", TR_ROLE_PARAM, 4, (int64_t[]){8, 3, 3, 8});
    cr_assert_eq(tr_graph_find(g, "stages.0.0.conv.bias"), -1, "batch norm follows: no conv bias");
    const struct tr_tensor *s = image_tensor(g, "stages.1.0.bn.weight", TR_ROLE_PARAM, 1, (int64_t[]){8});
    cr_assert(s->init == TR_INIT_ONES && !s->decay);
    image_tensor(g, "stages.1.0.bn.running", TR_ROLE_BUFFER, 2, (int64_t[]){2, 8});
    image_tensor(g, "head.weight", TR_ROLE_PARAM, 2, (int64_t[]){10, 8});
    cr_assert_eq(conv_node(g, "stages.1.pool")->op, TR_OP_MAXPOOL);
    cr_assert_eq(g->tensors[conv_node(g, "stages.1.pool")->out].shape[1], 4, "8x8 pooled to 4x4");
    tr_graph_free(g, NULL);

    const char *ov[] = {"model.batchnorm=false", "model.pool=avg", "model.recompute=1"};
    g = build_recipe("recipes/limits/cnn_options.lua", ov, 3, &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(tr_graph_find(g, "stages.0.0.bn.running"), -1);
    image_tensor(g, "stages.0.0.conv.bias", TR_ROLE_PARAM, 1, (int64_t[]){4});
    cr_assert_eq(conv_node(g, "stages.1.pool")->op, TR_OP_AVGPOOL);
    cr_assert(conv_node(g, "stages.0.1.relu")->segment > 0 && conv_node(g, "stages.1.1.relu")->segment > 0,
              "recompute=1: every stage");
    tr_graph_free(g, NULL);
}

Test(cnn, bad_options_are_named, .init = enter_test_dir)
{
    struct { const char *override, *want; } cases[] = {
        {"model.pool=min", "cnn: option 'pool' must be \"max\", \"avg\" or \"none\", got min"},
        {"model.kernel=4", "cnn: option 'kernel' must be odd (same-size convolutions), got 4"},
        {"model.convs=0", "cnn: option 'convs' must be an integer between 1 and 64, got 0"},
        {"model.input=8", "cnn: option 'input' must be { H, W, C } (height, width, channels), got 8"},
        {"model.width=3", "cnn: unknown option 'width'; options: batchnorm, channels, classes, convs, hidden, "
                          "input, kernel, pool, recompute"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tr_err err = {{0}};
        const char *ov[] = {cases[i].override};
        struct tr_graph *g = build_recipe("recipes/limits/cnn_options.lua", ov, 1, &err);
        cr_assert_null(g, "%s was accepted", cases[i].override);
        cr_assert(strstr(err.msg, cases[i].want), "%s:\ngot:  %s\nwant: %s", cases[i].override, err.msg,
                  cases[i].want);
    }
}

Test(resnet, carries_torchvision_names_and_shapes, .init = enter_test_dir)
{
    tr_err err = {{0}};
    struct tr_graph *g = build_recipe("recipes/limits/resnet_options.lua", NULL, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    image_tensor(g, "conv1.weight", TR_ROLE_PARAM, 4, (int64_t[]){8, 3, 3, 3});
    image_tensor(g, "bn1.running", TR_ROLE_BUFFER, 2, (int64_t[]){2, 8});
    image_tensor(g, "layer1.1.conv2.weight", TR_ROLE_PARAM, 4, (int64_t[]){8, 3, 3, 8});
    cr_assert_eq(tr_graph_find(g, "layer1.0.downsample.0.weight"), -1, "stage 1 keeps the width and size");
    image_tensor(g, "layer2.0.conv1.weight", TR_ROLE_PARAM, 4, (int64_t[]){16, 3, 3, 8});
    image_tensor(g, "layer2.0.downsample.0.weight", TR_ROLE_PARAM, 4, (int64_t[]){16, 1, 1, 8});
    image_tensor(g, "layer2.0.downsample.1.running", TR_ROLE_BUFFER, 2, (int64_t[]){2, 16});
    cr_assert_eq(conv_node(g, "layer2.0.conv1")->stride[0], 2);
    cr_assert_eq(conv_node(g, "layer2.0.downsample.0")->stride[1], 2);
    image_tensor(g, "layer4.1.bn2.running", TR_ROLE_BUFFER, 2, (int64_t[]){2, 64});
    image_tensor(g, "fc.weight", TR_ROLE_PARAM, 2, (int64_t[]){10, 64});
    /* the small stem: 32x32 stays 32x32 into layer1, 4x4 into the pool */
    cr_assert_eq(g->tensors[conv_node(g, "layer1.0.conv1")->in[0]].shape[1], 32);
    cr_assert_eq(g->tensors[conv_node(g, "avgpool")->in[0]].shape[1], 4);
    cr_assert_eq(tr_graph_find(g, "maxpool"), -1, "no max pool in the small stem");
    cr_assert_eq(g->tensors[tr_graph_find(g, "layer3.1.bn2.weight")].init, TR_INIT_ONES);
    tr_graph_free(g, NULL);

    const char *ov[] = {"model.depth=50", "model.stem=imagenet", "model.zero_init_residual=true",
                        "model.recompute=2", "model.momentum=0.01"};
    g = build_recipe("recipes/limits/resnet_options.lua", ov, 5, &err);
    cr_assert_not_null(g, "%s", err.msg);
    image_tensor(g, "conv1.weight", TR_ROLE_PARAM, 4, (int64_t[]){8, 7, 7, 3});
    cr_assert_eq(conv_node(g, "conv1")->stride[0], 2);
    cr_assert_eq(conv_node(g, "maxpool")->op, TR_OP_MAXPOOL);
    image_tensor(g, "layer1.0.conv3.weight", TR_ROLE_PARAM, 4, (int64_t[]){32, 1, 1, 8});
    image_tensor(g, "layer1.0.downsample.0.weight", TR_ROLE_PARAM, 4, (int64_t[]){32, 1, 1, 8});
    image_tensor(g, "fc.weight", TR_ROLE_PARAM, 2, (int64_t[]){10, 256});
    cr_assert_eq(g->tensors[tr_graph_find(g, "layer3.1.bn3.weight")].init, TR_INIT_ZEROS,
                 "zero_init_residual: each block's last batch norm starts at scale 0");
    cr_assert_eq(g->tensors[tr_graph_find(g, "layer3.1.bn2.weight")].init, TR_INIT_ONES);
    cr_assert_eq(conv_node(g, "layer2.3.bn1")->momentum, 0.01f);
    cr_assert(conv_node(g, "layer1.0.relu")->segment > 0 && conv_node(g, "layer1.1.relu")->segment == 0 &&
              conv_node(g, "layer1.2.relu")->segment > 0, "recompute=2: every other block");
    tr_graph_free(g, NULL);
}

Test(resnet, bad_options_are_named, .init = enter_test_dir)
{
    struct { const char *override, *want; } cases[] = {
        {"model.depth=20", "resnet: option 'depth' must be 18, 34 or 50, got 20"},
        {"model.stem=big", "resnet: option 'stem' must be \"imagenet\" or \"small\", got big"},
        {"model.momentum=0", "resnet: option 'momentum' must be a number above 0 and at most 1, got 0"},
        {"model.zero_init_residual=1", "resnet: option 'zero_init_residual' must be true or false, got 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tr_err err = {{0}};
        const char *ov[] = {cases[i].override};
        struct tr_graph *g = build_recipe("recipes/limits/resnet_options.lua", ov, 1, &err);
        cr_assert_null(g, "%s was accepted", cases[i].override);
        cr_assert(strstr(err.msg, cases[i].want), "%s:\ngot:  %s\nwant: %s", cases[i].override, err.msg,
                  cases[i].want);
    }
}
