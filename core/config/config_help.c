/*
 * The generated parts of `trainrun help recipe`: the model builders' options
 * as lua/trainrun/models.lua declares them, and every plugin's options as
 * the plugins on the search path declare them, so that the reference lists
 * what a recipe may set and cannot fall behind either.
 */
#include "config_help.h"

#include "plugin.h"
#include "recipe_ops.h"
#include "run_config.h"
#include "../util/util.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdlib.h>
#include <string.h>

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One builder's schema (the table on top of L) as "name = default  help" lines. */
static void print_schema(lua_State *L, const char *builder, FILE *out)
{
    const char *names[64];
    int n = 0;
    for (lua_pushnil(L); lua_next(L, -2) && n < 64; lua_pop(L, 1))
        if (lua_type(L, -2) == LUA_TSTRING)
            names[n++] = lua_tostring(L, -2); /* the keys stay in the table */
    qsort(names, (size_t)n, sizeof *names, by_name);
    fprintf(out, "    %s {\n", builder);
    for (int i = 0; i < n; i++) {
        lua_getfield(L, -1, names[i]);
        lua_getfield(L, -1, "default");
        char def[64];
        if (lua_isnil(L, -1))
            snprintf(def, sizeof def, "required");
        else if (lua_type(L, -1) == LUA_TBOOLEAN)
            snprintf(def, sizeof def, "%s", lua_toboolean(L, -1) ? "true" : "false");
        else if (lua_type(L, -1) == LUA_TSTRING)
            snprintf(def, sizeof def, "\"%s\"", lua_tostring(L, -1));
        else if (lua_type(L, -1) == LUA_TNUMBER)
            snprintf(def, sizeof def, "%g", lua_tonumber(L, -1));
        else if (lua_istable(L, -1) && lua_objlen(L, -1) > 0) { /* a list of numbers: { 32, 64 } */
            size_t len = (size_t)snprintf(def, sizeof def, "{");
            for (int k = 1; k <= (int)lua_objlen(L, -1) && len < sizeof def; k++) {
                lua_rawgeti(L, -1, k);
                len += (size_t)snprintf(def + len, sizeof def - len, "%s%g", k > 1 ? "," : "",
                                        lua_tonumber(L, -1));
                lua_pop(L, 1);
            }
            if (len < sizeof def)
                snprintf(def + len, sizeof def - len, "}");
        } else
            snprintf(def, sizeof def, "{}");
        lua_pop(L, 1);
        lua_getfield(L, -1, "help");
        fprintf(out, "      %-14s = %-10s %s\n", names[i], def,
                lua_isstring(L, -1) ? lua_tostring(L, -1) : "");
        lua_pop(L, 2);
    }
    fprintf(out, "    }\n");
}

void tr_model_help(FILE *out)
{
    lua_State *L = luaL_newstate();
    if (!L) {
        fprintf(out, "    (out of memory reading the model builders)\n");
        return;
    }
    luaL_openlibs(L);
    char *path = tr_xasprintf("%s/?.lua", tr_install_paths()->lua_dir);
    lua_getglobal(L, "package");
    lua_pushstring(L, path);
    lua_setfield(L, -2, "path");
    lua_getfield(L, -1, "loaded"); /* trainrun.nn asks the op table, as in a recipe */
    tr_recipe_push_ops(L);
    lua_setfield(L, -2, "trainrun.ops");
    lua_pop(L, 2);
    free(path);
    lua_getglobal(L, "require");
    lua_pushstring(L, "trainrun.models");
    if (lua_pcall(L, 1, 1, 0) != 0) {
        fprintf(out, "    (cannot read the model builders: %s)\n", lua_tostring(L, -1));
        lua_close(L);
        return;
    }
    lua_getfield(L, -1, "schemas");
    static const char *const builders[] = {"gpt", "llama", "mlp", "cnn", "resnet"};
    for (size_t i = 0; i < TR_ARRAY_LEN(builders) && lua_istable(L, -1); i++) {
        lua_getfield(L, -1, builders[i]);
        if (lua_istable(L, -1))
            print_schema(L, builders[i], out);
        lua_pop(L, 1);
    }
    lua_close(L);
}

/* a list, unlike the other slots */
static void logger_help(FILE *out)
{
    fprintf(out, "\n  logger = { \"jsonl\", \"NAME\", { plugin = \"NAME\", ... } }  (metrics.jsonl is "
            "\"jsonl\", built in and always written)\n");
}

void tr_plugins_help(FILE *out)
{
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, tr_install_paths()->plugin_dir);
    struct tr_plugin **list;
    int n = tr_plugin_list(&sp, &list, NULL);
    int last_kind = -1, seen_logger = 0;
    for (int i = 0; i < n; i++) {
        const struct tr_plugin_info *info = list[i]->info;
        if ((int)info->kind != last_kind) {
            const char *kind = tr_kind_name(info->kind);
            if (strcmp(kind, "logger") == 0)
                logger_help(out), seen_logger = 1;
            else
                fprintf(out, "\n  %s = { plugin = \"NAME\", ... }%s\n", kind,
                        info->kind == TR_KIND_COMM ? "  (how ranks talk; default tcp, mpi under "
                                                     "mpirun, nccl for cuda)" : "");
            last_kind = (int)info->kind;
        }
        fprintf(out, "    %-12s", info->name);
        int col = 16, any = 0;
        for (const struct tr_option *o = info->options; o && o->type != TR_OPT_END; o++) {
            int len = (int)strlen(o->name);
            if (any && col + len + 2 > 96) { /* wrap under the first name */
                fprintf(out, ",\n%16s", "");
                col = 16;
            } else if (any) {
                fprintf(out, ", ");
                col += 2;
            }
            fprintf(out, "%s", o->name);
            col += len;
            any = 1;
        }
        fprintf(out, "%s\n", any ? "" : "(no options)");
        tr_plugin_close(list[i]);
    }
    if (!seen_logger) /* none installed: "jsonl" is built in */
        logger_help(out);
    free(list);
    tr_plugin_path_free(&sp);
}
