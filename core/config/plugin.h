/* Plugin loader: finds <kind>_<name>.so on the search path, checks the ABI,
 * and hands out the info struct and the kind's vtable. */
#ifndef TR_PLUGIN_LOADER_H
#define TR_PLUGIN_LOADER_H

#include <trainrun/plugin.h>

struct tr_plugin {
    char *path;
    void *handle;
    const struct tr_plugin_info *info;
};

/* Directories searched, in order: the built-in directory, then each entry
 * of TRAINRUN_PLUGIN_PATH (which `--plugin-path DIR` extends).  Only the
 * user chooses them: never the recipe's directory or anything a recipe
 * names, because loading a shared object runs its code (constructors run
 * at dlopen, before any check), and a shared recipe is data. */
struct tr_plugin_path {
    char **dirs;
    int n;
};
void tr_plugin_path_init(struct tr_plugin_path *sp, const char *builtin_dir);
void tr_plugin_path_free(struct tr_plugin_path *sp);

const char *tr_kind_name(enum tr_plugin_kind kind);

/* A plugin or backend name as recipes may write it: 1-64 of [A-Za-z0-9_-].
 * Anything else (a '/', "..", a ".so") could make the file name a path. */
int tr_plugin_name_ok(const char *name);
int tr_kind_from_name(const char *name, enum tr_plugin_kind *out);

/* Load one plugin file and check it: entry symbol, ABI major, struct sizes,
 * kind, mandatory vtable slots.  Errors name the file. */
struct tr_plugin *tr_plugin_load_file(const char *path, tr_err *err);

/* Find plugin `name` of `kind` on the search path and load that file only.
 * An unknown name gives "no <kind> plugin 'x' (did you mean 'y'?)" or
 * "...; installed: a, b, c", from file names: nothing else is loaded. */
struct tr_plugin *tr_plugin_find(const struct tr_plugin_path *sp, enum tr_plugin_kind kind,
                                 const char *name, tr_err *err);
void tr_plugin_close(struct tr_plugin *p);

/* Every loadable plugin on the search path (first occurrence of each
 * kind/name wins), sorted by kind then name.  Files that fail to load are
 * reported through `broken` (may be NULL). */
int tr_plugin_list(const struct tr_plugin_path *sp, struct tr_plugin ***out,
                   void (*broken)(const char *path, const char *why));

#endif
