#include "plugin.h"

#include "../util/suggest.h"
#include "../util/util.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const kind_names[] = {
    [TR_KIND_PRECISION] = "precision", [TR_KIND_DATA] = "data",
    [TR_KIND_CHECKPOINT] = "checkpoint", [TR_KIND_SCHEDULE] = "schedule",
    [TR_KIND_COMM] = "comm", [TR_KIND_LOGGER] = "logger",
};

const char *tr_kind_name(enum tr_plugin_kind kind)
{
    if ((unsigned)kind < TR_ARRAY_LEN(kind_names) && kind_names[kind])
        return kind_names[kind];
    return "unknown";
}

int tr_kind_from_name(const char *name, enum tr_plugin_kind *out)
{
    for (size_t k = 1; k < TR_ARRAY_LEN(kind_names); k++)
        if (kind_names[k] && strcmp(kind_names[k], name) == 0) {
            *out = (enum tr_plugin_kind)k;
            return 1;
        }
    return 0;
}

static void add_dir(struct tr_plugin_path *sp, const char *dir)
{
    if (!dir || !*dir)
        return;
    for (int i = 0; i < sp->n; i++)
        if (strcmp(sp->dirs[i], dir) == 0)
            return;
    sp->dirs = tr_xrealloc(sp->dirs, (size_t)(sp->n + 1) * sizeof *sp->dirs);
    sp->dirs[sp->n++] = tr_xstrdup(dir);
}

void tr_plugin_path_init(struct tr_plugin_path *sp, const char *builtin_dir)
{
    sp->dirs = NULL;
    sp->n = 0;
    add_dir(sp, builtin_dir);
    const char *env = getenv("TRAINRUN_PLUGIN_PATH");
    if (env) {
        char *copy = tr_xstrdup(env), *save = NULL;
        for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save))
            add_dir(sp, d);
        free(copy);
    }
}

int tr_plugin_name_ok(const char *name)
{
    size_t n = 0;
    for (; name && name[n]; n++) {
        char c = name[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return n >= 1 && n <= 64;
}

void tr_plugin_path_free(struct tr_plugin_path *sp)
{
    for (int i = 0; i < sp->n; i++)
        free(sp->dirs[i]);
    free(sp->dirs);
    sp->dirs = NULL;
    sp->n = 0;
}

/* Smallest vtable (through the last mandatory slot) each kind must provide,
 * and its mandatory slots: the core calls those without a NULL check. */
static int check_vtable(const struct tr_plugin_info *info, tr_err *err)
{
    const uint32_t *size = info->vtable; /* every vtable starts with its struct_size */
    if (!size)
        return tr_fail(err, "its %s vtable is NULL", tr_kind_name(info->kind));
    size_t need = 0;
    int present = 0;
    switch (info->kind) {
    case TR_KIND_PRECISION: {
        const struct tr_precision_vtable *v = info->vtable;
        need = offsetof(struct tr_precision_vtable, policy) + sizeof v->policy;
        present = TR_HAS_SLOT(v, struct tr_precision_vtable, policy);
        break;
    }
    case TR_KIND_DATA: {
        const struct tr_data_vtable *v = info->vtable;
        need = offsetof(struct tr_data_vtable, read) + sizeof v->read;
        present = TR_HAS_SLOT(v, struct tr_data_vtable, info) &&
                  TR_HAS_SLOT(v, struct tr_data_vtable, read);
        break;
    }
    case TR_KIND_CHECKPOINT: {
        const struct tr_checkpoint_vtable *v = info->vtable;
        need = offsetof(struct tr_checkpoint_vtable, remove) + sizeof v->remove;
        present = TR_HAS_SLOT(v, struct tr_checkpoint_vtable, begin) &&
                  TR_HAS_SLOT(v, struct tr_checkpoint_vtable, put) &&
                  TR_HAS_SLOT(v, struct tr_checkpoint_vtable, commit) &&
                  TR_HAS_SLOT(v, struct tr_checkpoint_vtable, abort) &&
                  TR_HAS_SLOT(v, struct tr_checkpoint_vtable, list) &&
                  TR_HAS_SLOT(v, struct tr_checkpoint_vtable, get) &&
                  TR_HAS_SLOT(v, struct tr_checkpoint_vtable, remove);
        break;
    }
    case TR_KIND_SCHEDULE: {
        const struct tr_schedule_vtable *v = info->vtable;
        need = offsetof(struct tr_schedule_vtable, lr) + sizeof v->lr;
        present = TR_HAS_SLOT(v, struct tr_schedule_vtable, lr);
        break;
    }
    case TR_KIND_COMM: {
        const struct tr_comm_vtable *v = info->vtable;
        need = offsetof(struct tr_comm_vtable, broadcast) + sizeof v->broadcast;
        present = TR_HAS_SLOT(v, struct tr_comm_vtable, allreduce_sum) &&
                  TR_HAS_SLOT(v, struct tr_comm_vtable, broadcast);
        break;
    }
    case TR_KIND_LOGGER: {
        const struct tr_logger_vtable *v = info->vtable;
        need = offsetof(struct tr_logger_vtable, scalars) + sizeof v->scalars;
        present = TR_HAS_SLOT(v, struct tr_logger_vtable, open) &&
                  TR_HAS_SLOT(v, struct tr_logger_vtable, scalars);
        break;
    }
    default:
        return tr_fail(err, "unknown plugin kind %d", (int)info->kind);
    }
    if (*size < need)
        return tr_fail(err, "its %s vtable is %u bytes, smaller than the %zu this trainrun needs",
                       tr_kind_name(info->kind), *size, need);
    if (!present)
        return tr_fail(err, "its %s vtable leaves a mandatory slot NULL", tr_kind_name(info->kind));
    return TR_OK;
}

struct tr_plugin *tr_plugin_load_file(const char *path, tr_err *err)
{
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        tr_fail(err, "cannot load plugin %s: %s", path, dlerror());
        return NULL;
    }
    tr_plugin_entry_fn entry = (tr_plugin_entry_fn)dlsym(handle, TR_PLUGIN_ENTRY_NAME);
    if (!entry) {
        tr_fail(err, "%s is not a trainrun plugin: it exports no '%s' function", path,
                TR_PLUGIN_ENTRY_NAME);
        dlclose(handle);
        return NULL;
    }
    const struct tr_plugin_info *info = entry();
    tr_err why = {{0}};
    if (!info) {
        tr_fail(&why, "its entry function returned NULL");
    } else if (info->abi_major != TR_ABI_MAJOR) {
        tr_fail(&why,
                "it was built for plugin ABI %u but this trainrun speaks ABI %d; rebuild it "
                "against this trainrun's <trainrun/plugin.h>",
                info->abi_major, TR_ABI_MAJOR);
    } else if (!TR_HAS_FIELD(info, struct tr_plugin_info, vtable)) {
        tr_fail(&why, "its info struct is %u bytes, too small for ABI %d", info->struct_size,
                TR_ABI_MAJOR);
    } else if (!info->name || !*info->name || !info->create) {
        tr_fail(&why, "its info struct has no name or no create function");
    } else if (info->options && info->config_size == 0) {
        tr_fail(&why, "it declares options but a config_size of 0");
    } else {
        check_vtable(info, &why);
    }
    if (why.msg[0]) {
        tr_fail(err, "refusing plugin %s: %s", path, why.msg);
        dlclose(handle);
        return NULL;
    }
    struct tr_plugin *p = tr_xcalloc(1, sizeof *p);
    p->path = tr_xstrdup(path);
    p->handle = handle;
    p->info = info;
    return p;
}

void tr_plugin_close(struct tr_plugin *p)
{
    if (!p)
        return;
    /* Keep the code mapped: plugin strings (names, option help) may still be
     * referenced by the resolved recipe; the process is short-lived anyway. */
    free(p->path);
    free(p);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A plugin's file name, "<kind>_<name>.so": its kind and where its name is
 * in it.  0 for any other file. */
static int parse_plugin_file(const char *file, enum tr_plugin_kind *kind, const char **name,
                             int *name_len)
{
    size_t len = strlen(file);
    const char *us = strchr(file, '_');
    char prefix[32];
    if (len < 4 || strcmp(file + len - 3, ".so") != 0 || !us || (size_t)(us - file) >= sizeof prefix)
        return 0;
    snprintf(prefix, sizeof prefix, "%.*s", (int)(us - file), file);
    if (!tr_kind_from_name(prefix, kind))
        return 0;
    *name = us + 1;
    *name_len = (int)(file + len - 3 - *name);
    return 1;
}

/* The names of kind's plugins on the search path, from their file names
 * (first occurrence wins): suggesting a name must not run any plugin's code. */
static int installed_names(const struct tr_plugin_path *sp, enum tr_plugin_kind kind,
                           char ***out)
{
    char **names = NULL;
    int n = 0;
    for (int i = 0; i < sp->n; i++) {
        DIR *d = opendir(sp->dirs[i]);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            enum tr_plugin_kind file_kind;
            const char *at;
            int name_len;
            if (!parse_plugin_file(e->d_name, &file_kind, &at, &name_len) || file_kind != kind)
                continue;
            char *name = tr_xasprintf("%.*s", name_len, at);
            int dup = !tr_plugin_name_ok(name);
            for (int j = 0; j < n && !dup; j++)
                dup = strcmp(names[j], name) == 0;
            if (dup) {
                free(name);
                continue;
            }
            names = tr_xrealloc(names, (size_t)(n + 1) * sizeof *names);
            names[n++] = name;
        }
        closedir(d);
    }
    if (n > 1)
        qsort(names, (size_t)n, sizeof *names, compare_names);
    *out = names;
    return n;
}

struct tr_plugin *tr_plugin_find(const struct tr_plugin_path *sp, enum tr_plugin_kind kind,
                                 const char *name, tr_err *err)
{
    if (!tr_plugin_name_ok(name)) {
        tr_fail(err, "invalid %s plugin name \"%s\": a plugin is named by letters, digits, "
                "'_' and '-' only, never by a path; install the plugin in a directory of "
                "TRAINRUN_PLUGIN_PATH (or pass --plugin-path DIR) and write its name",
                tr_kind_name(kind), name ? name : "");
        return NULL;
    }
    for (int i = 0; i < sp->n; i++) {
        char *path = tr_xasprintf("%s/%s_%s.so", sp->dirs[i], tr_kind_name(kind), name);
        if (is_file(path)) {
            struct tr_plugin *p = tr_plugin_load_file(path, err);
            if (p && (p->info->kind != kind || strcmp(p->info->name, name) != 0)) {
                tr_fail(err, "refusing plugin %s: the file name says %s '%s' but it declares %s '%s'",
                        path, tr_kind_name(kind), name, tr_kind_name(p->info->kind), p->info->name);
                tr_plugin_close(p);
                p = NULL;
            }
            free(path);
            return p;
        }
        free(path);
    }
    /* Not found: suggest a close name among those installed. */
    char **names = NULL;
    int m = installed_names(sp, kind, &names);
    char installed[512] = "";
    for (int i = 0; i < m; i++) {
        size_t len = strlen(installed);
        snprintf(installed + len, sizeof installed - len, "%s%s", i ? ", " : "", names[i]);
    }
    const char *hint = tr_suggest(name, (const char *const *)names, (size_t)m);
    char where[512] = "";
    for (int i = 0; i < sp->n; i++) {
        size_t len = strlen(where);
        snprintf(where + len, sizeof where - len, "%s%s", i ? ":" : "", sp->dirs[i]);
    }
    if (hint)
        tr_fail(err, "no %s plugin '%s' (did you mean '%s'?)", tr_kind_name(kind), name, hint);
    else
        tr_fail(err, "no %s plugin '%s'; installed: %s (searched %s; plugins never load from "
                "a recipe's directory: put a plugin you trust in a directory you name with "
                "--plugin-path DIR or TRAINRUN_PLUGIN_PATH)", tr_kind_name(kind), name,
                m ? installed : "none", where);
    for (int i = 0; i < m; i++)
        free(names[i]);
    free(names);
    return NULL;
}

static int compare_plugins(const void *a, const void *b)
{
    const struct tr_plugin *pa = *(struct tr_plugin *const *)a, *pb = *(struct tr_plugin *const *)b;
    if (pa->info->kind != pb->info->kind)
        return (int)pa->info->kind - (int)pb->info->kind;
    return strcmp(pa->info->name, pb->info->name);
}

int tr_plugin_list(const struct tr_plugin_path *sp, struct tr_plugin ***out,
                   void (*broken)(const char *path, const char *why))
{
    struct tr_plugin **list = NULL;
    int n = 0;
    for (int i = 0; i < sp->n; i++) {
        DIR *d = opendir(sp->dirs[i]);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            enum tr_plugin_kind kind;
            const char *name;
            int name_len;
            if (!parse_plugin_file(e->d_name, &kind, &name, &name_len))
                continue;
            char *path = tr_xasprintf("%s/%s", sp->dirs[i], e->d_name);
            tr_err err = {{0}};
            struct tr_plugin *p = tr_plugin_load_file(path, &err);
            free(path);
            if (!p) {
                if (broken)
                    broken(e->d_name, err.msg);
                continue;
            }
            int dup = 0;
            for (int j = 0; j < n && !dup; j++)
                dup = list[j]->info->kind == p->info->kind &&
                      strcmp(list[j]->info->name, p->info->name) == 0;
            if (dup) {
                tr_plugin_close(p);
                continue;
            }
            list = tr_xrealloc(list, (size_t)(n + 1) * sizeof *list);
            list[n++] = p;
        }
        closedir(d);
    }
    if (n > 1)
        qsort(list, (size_t)n, sizeof *list, compare_plugins);
    *out = list;
    return n;
}
