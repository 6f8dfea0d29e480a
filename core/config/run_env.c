/*
 * Where a run finds what it needs outside the recipe: the install paths of
 * the plugins, the Lua library and the shipped recipes, and the run's rank
 * from a launcher's environment (run_config.h).
 */
#include "run_config.h"

#include "../util/util.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- install paths ------------------------------------------------------ */

const struct tr_install_paths *tr_install_paths(void)
{
    static struct tr_install_paths paths;
    static int done;
    if (done)
        return &paths;
    done = 1;
    paths.plugin_dir = TR_PLUGIN_DIR;
    paths.lua_dir = TR_LUA_DIR;
    paths.recipe_dir = TR_RECIPE_DIR;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    /* An installed tree that was moved (or installed with DESTDIR): find
     * the plugins and Lua next to the binary, as <prefix>/bin/trainrun. */
    static char rel_plugins[PATH_MAX + 64], rel_lua[PATH_MAX + 64], rel_recipes[PATH_MAX + 64];
    char *slash = n > 0 ? strrchr(exe, '/') : NULL;
    if (slash) {
        struct stat st;
        snprintf(rel_plugins, sizeof rel_plugins, "%.*s/../lib/trainrun/plugins", (int)(slash - exe), exe);
        snprintf(rel_lua, sizeof rel_lua, "%.*s/../share/trainrun/lua", (int)(slash - exe), exe);
        snprintf(rel_recipes, sizeof rel_recipes, "%.*s/../share/trainrun/recipes", (int)(slash - exe), exe);
        if (stat(rel_plugins, &st) == 0 && stat(rel_lua, &st) == 0) {
            paths.plugin_dir = rel_plugins;
            paths.lua_dir = rel_lua;
            paths.recipe_dir = rel_recipes;
        }
    }
#ifdef TR_BUILD_DIR
    /* Running from the build tree: use its plugins and the source tree's Lua. */
    char build[PATH_MAX];
    if (n > 0 && realpath(TR_BUILD_DIR, build)) {
        size_t len = strlen(build);
        if (strncmp(exe, build, len) == 0 && (exe[len] == '/' || exe[len] == 0) &&
            !strchr(exe + len + 1, '/')) {
            paths.plugin_dir = TR_BUILD_DIR "/plugins/.libs";
            paths.lua_dir = TR_SOURCE_DIR "/lua";
            paths.recipe_dir = TR_SOURCE_DIR "/recipes";
        }
    }
#endif
    const char *env = getenv("TRAINRUN_LUA_DIR");
    if (env && *env)
        paths.lua_dir = env;
    return &paths;
}

/* ---- ranks ----------------------------------------------------------------- */

static int env_int(const char *name, int *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1 << 20)
        return -1;
    *out = (int)x;
    return 1;
}

int tr_rank_from_env(struct tr_rank_info *out, tr_err *err)
{
    static const char *const sources[][4] = {
        {"TRAINRUN_RANK", "TRAINRUN_WORLD_SIZE", "TRAINRUN_LOCAL_RANK", "TRAINRUN_LOCAL_WORLD_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
    };
    *out = (struct tr_rank_info){0, 1, 0, 1, NULL};
    for (size_t i = 0; i < TR_ARRAY_LEN(sources); i++) {
        int v[4] = {0, 1, 0, 1}, got[4];
        for (int k = 0; k < 4; k++)
            if ((got[k] = env_int(sources[i][k], &v[k])) < 0)
                return tr_fail(err, "environment: %s=\"%s\" is not a number", sources[i][k],
                               getenv(sources[i][k]));
        if (!got[0] && !got[1])
            continue;
        if (!got[0] || !got[1] || v[1] < 1 || v[0] >= v[1])
            return tr_fail(err, "environment: %s=%s and %s=%s do not name a rank of a job; set "
                           "both, with rank < size", sources[i][0],
                           getenv(sources[i][0]) ? getenv(sources[i][0]) : "(unset)", sources[i][1],
                           getenv(sources[i][1]) ? getenv(sources[i][1]) : "(unset)");
        if (!got[2]) /* no local rank: assume one rank per node */
            v[2] = 0;
        if (!got[3])
            v[3] = got[2] ? v[2] + 1 : 1;
        *out = (struct tr_rank_info){v[0], v[1], v[2], v[3], sources[i][0]};
        return TR_OK;
    }
    return TR_OK;
}
