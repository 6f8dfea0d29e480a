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

/* Directories searched, in order: the built-in directory, each entry of
 * TRAINRUN_PLUGIN_PATH, then the recipe's directory (may be NULL). */
struct tr_plugin_path {
    char **dirs;
    int n;
};
void tr_plugin_path_init(struct tr_plugin_path *sp, const char *builtin_dir, const char *recipe_dir);
void tr_plugin_path_free(struct tr_plugin_path *sp);

const char *tr_kind_name(enum tr_plugin_kind kind);
int tr_kind_from_name(const char *name, enum tr_plugin_kind *out);

/* Load one plugin file and check it: entry symbol, ABI major, struct sizes,
 * kind, mandatory vtable slots.  Errors name the file. */
struct tr_plugin *tr_plugin_load_file(const char *path, tr_err *err);

/* Find plugin `name` of `kind` on the search path.  An unknown name gives
 * "no <kind> plugin 'x' (did you mean 'y'?); installed: a, b, c". */
struct tr_plugin *tr_plugin_find(const struct tr_plugin_path *sp, enum tr_plugin_kind kind,
                                 const char *name, tr_err *err);
void tr_plugin_close(struct tr_plugin *p);

/* Every loadable plugin on the search path (first occurrence of each
 * kind/name wins), sorted by kind then name.  Files that fail to load are
 * reported through `broken` (may be NULL). */
int tr_plugin_list(const struct tr_plugin_path *sp, struct tr_plugin ***out,
                   void (*broken)(const char *path, const char *why));

#endif
