/*
 * The recipe's plugin slots (data, precision, schedule, checkpoint, comm)
 * and its list of loggers: each slot's plugin found, a base's options that
 * a switched plugin does not take dropped with a note, and the options
 * parsed into the slot's config (run_parts.h).
 */
#include "run_parts.h"

#include "../util/util.h"

#include <stdlib.h>
#include <string.h>

/* Keys every plugin slot takes besides its plugin's options. */
struct slot_keys {
    const char *plugin;
};
static const struct tr_option slot_options[] = {
    {TR_OPT_STRING, "plugin", NULL, 0, 0, NULL, "which plugin fills this slot",
     offsetof(struct slot_keys, plugin)},
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

static int takes_option(const struct tr_option *options, const char *name)
{
    for (const struct tr_option *o = options; o && o->type != TR_OPT_END; o++)
        if (strcmp(o->name, name) == 0)
            return 1;
    return 0;
}

/* A recipe that extends a base and names another plugin for a slot, or
 * slot.plugin=NAME on the command line, replaces the plugin: the base's
 * options of the old plugin that the new one does not take go, with a note
 * naming them ("schedule: dropped min_lr_ratio (set for cosine at
 * base.lua:6; constant, named at child.lua:3, has no such option)"); those
 * it also takes (warmup) stay, and the note says so.  Options set beside the
 * new plugin's name were never listed: they are checked against it. */
static void drop_replaced_options(struct tr_config *cfg, struct tr_value *table,
                                  const char *key, const struct tr_plugin_info *info,
                                  const struct tr_schema_use *extra)
{
    const struct tr_recipe_switch *sw;
    int n = tr_recipe_switches(cfg->recipe, &sw);
    for (int i = 0; i < n; i++) {
        if (strcmp(sw[i].slot, key) != 0)
            continue;
        char dropped[512] = "", kept[512] = "", at[600] = "";
        for (int k = 0; k < sw[i].n_keys; k++) {
            const char *name = sw[i].keys[k];
            struct tr_value *v = tr_value_child(table, name);
            if (!v)
                continue; /* dropped by an earlier switch */
            int takes = takes_option(info->options, name) ||
                        (extra && takes_option(extra->options, name));
            char *list = takes ? kept : dropped;
            size_t len = strlen(list);
            snprintf(list + len, sizeof dropped - len, "%s%s", len ? ", " : "", name);
            if (takes)
                continue;
            if (!*at)
                tr_origin_format(&v->origin, at, sizeof at);
            for (size_t j = 0; j < table->n_items; j++)
                if (table->items[j] == v) {
                    tr_value_free(v);
                    memmove(table->items + j, table->items + j + 1,
                            (table->n_items - j - 1) * sizeof *table->items);
                    table->n_items--;
                    break;
                }
        }
        if (cfg->rank.rank != 0 || (!*dropped && !*kept))
            continue;
        if (*dropped)
            tr_log(TR_LOG_INFO, NULL, "note: %s: dropped %s (set for %s at %s; %s, named at %s, "
                   "has no such option)%s%s%s", key, dropped, sw[i].from, at, sw[i].to,
                   sw[i].to_where, *kept ? "; kept " : "", kept,
                   *kept ? ", which it takes too" : "");
        else
            tr_log(TR_LOG_INFO, NULL, "note: %s: kept %s (set for %s) for %s, named at %s, "
                   "which takes it too", key, kept, sw[i].from, sw[i].to, sw[i].to_where);
    }
}

int tr_config_slot(struct tr_config *cfg, struct tr_slot *slot, const char *key,
                   enum tr_plugin_kind kind, const char *default_name,
                   struct tr_origin default_origin, const struct tr_schema_use *extra,
                   tr_err *err)
{
    struct tr_value *root = tr_recipe_root(cfg->recipe);
    struct tr_value *v = tr_value_child(root, key);
    slot->key = key;
    slot->kind = kind;
    if (!v) {
        if (!default_name) {
            char where[600];
            tr_config_where(cfg, "", where, sizeof where);
            return tr_fail(err, "%s: the recipe has no %s; add e.g. %s = { plugin = \"%s\", ... }",
                           tr_recipe_path(cfg->recipe), key, key,
                           kind == TR_KIND_DATA ? "text" : "?");
        }
        v = tr_value_new(TR_V_STRING, key, default_origin);
        v->string = tr_xstrdup(default_name);
        tr_value_put(root, v);
    }
    if (v->type == TR_V_STRING) { /* shorthand: precision = "bf16" */
        struct tr_value *table = tr_value_new(TR_V_TABLE, key, v->origin);
        struct tr_value *name = tr_value_new(TR_V_STRING, "plugin", v->origin);
        name->string = tr_xstrdup(v->string);
        if (v->text)
            name->text = tr_xstrdup(v->text);
        tr_value_put(table, name);
        tr_value_put(root, table); /* replaces (and frees) the string */
        v = table;
    }
    char where[600];
    tr_value_where(v, where, sizeof where);
    if (v->type != TR_V_TABLE)
        return tr_fail(err, "%s%s must be a plugin name or a table { plugin = \"name\", ... }",
                       where, key);
    struct tr_value *pv = tr_value_child(v, "plugin");
    if (!pv && default_name) { /* e.g. only checkpoint.every was given */
        pv = tr_value_new(TR_V_STRING, "plugin", default_origin);
        tr_value_set_string(pv, default_name);
        tr_value_put(v, pv);
    }
    if (!pv || pv->type != TR_V_STRING)
        return tr_fail(err, "%s%s: say which plugin, e.g. %s = { plugin = \"%s\", ... }", where,
                       key, key, default_name ? default_name : "text");
    slot->origin = pv->origin;
    tr_value_where(pv, where, sizeof where);
    slot->plugin = tr_plugin_find(&cfg->plugin_path, kind, pv->string, err);
    if (!slot->plugin) {
        tr_err_prefix(err, "%.*s", (int)(strlen(where) - 2), where);
        return TR_ERROR;
    }
    const struct tr_plugin_info *info = slot->plugin->info;
    drop_replaced_options(cfg, v, key, info, extra);
    slot->config = tr_xcalloc(1, info->config_size ? info->config_size : 1);
    struct slot_keys keys;
    struct tr_schema_use uses[3] = {{slot_options, &keys}, {info->options, slot->config}};
    int n = 2;
    if (extra)
        uses[n++] = *extra;
    char what[128];
    snprintf(what, sizeof what, "%s '%s'", key, info->name);
    if (tr_options_apply(root, key, what, uses, n, err) != TR_OK) {
        /* name the plugin file too: the schema came from it */
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " [plugin %s]", slot->plugin->path);
        return TR_ERROR;
    }
    return TR_OK;
}

/* logger = "csv", logger=jsonl,csv on the command line: the list it
 * stands for, in the string's place. */
static struct tr_value *logger_list_of_string(struct tr_value *root, struct tr_value *list)
{
    struct tr_value *table = tr_value_new(TR_V_TABLE, "logger", list->origin);
    const char *p = list->string;
    for (int n = 1;; n++) {
        size_t len = strcspn(p, ",");
        char pos[16];
        snprintf(pos, sizeof pos, "%d", n);
        struct tr_value *one = tr_value_new(TR_V_STRING, pos, list->origin);
        one->is_list_item = 1;
        one->string = tr_xasprintf("%.*s", (int)len, p);
        tr_value_put(table, one);
        if (!p[len])
            break;
        p += len + 1;
    }
    tr_value_put(root, table); /* replaces (and frees) the string */
    return table;
}

/* No logger: { "jsonl" }, which show prints. */
static void default_loggers(struct tr_value *root)
{
    struct tr_origin def = {TR_FROM_DEFAULT, NULL, 0};
    struct tr_value *list = tr_value_new(TR_V_TABLE, "logger", def);
    struct tr_value *one = tr_value_new(TR_V_STRING, "1", def);
    one->is_list_item = 1;
    tr_value_set_string(one, "jsonl");
    tr_value_put(list, one);
    tr_value_put(root, list);
}

/* One logger plugin, named by pv in entry `item`: found, once only, and
 * its options parsed into the next logger slot. */
static int logger_slot(struct tr_config *cfg, struct tr_value *list, struct tr_value *item,
                       struct tr_value *pv, tr_err *err)
{
    char where[600];
    tr_value_where(item, where, sizeof where);
    for (int k = 0; k < cfg->n_loggers; k++)
        if (strcmp(cfg->loggers[k].plugin->info->name, pv->string) == 0) {
            tr_value_where(pv, where, sizeof where);
            return tr_fail(err, "%slogger \"%s\" is listed twice", where, pv->string);
        }
    if (cfg->n_loggers == TR_MAX_LOGGERS)
        return tr_fail(err, "%slogger: more than %d loggers", where, TR_MAX_LOGGERS);
    struct tr_slot *slot = &cfg->loggers[cfg->n_loggers];
    slot->key = "logger";
    slot->kind = TR_KIND_LOGGER;
    slot->origin = pv->origin;
    tr_value_where(pv, where, sizeof where);
    slot->plugin = tr_plugin_find(&cfg->plugin_path, TR_KIND_LOGGER, pv->string, err);
    if (!slot->plugin) {
        tr_err_prefix(err, "%.*s", (int)(strlen(where) - 2), where);
        return TR_ERROR;
    }
    cfg->n_loggers++;
    const struct tr_plugin_info *info = slot->plugin->info;
    slot->config = tr_xcalloc(1, info->config_size ? info->config_size : 1);
    struct slot_keys keys;
    struct tr_schema_use uses[2] = {{slot_options, &keys}, {info->options, slot->config}};
    char what[128];
    snprintf(what, sizeof what, "logger '%s'", info->name);
    if (tr_options_apply(list, item->key, what, uses, 2, err) != TR_OK) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " [plugin %s]", slot->plugin->path);
        return TR_ERROR;
    }
    return TR_OK;
}

/* Entry i of the logger list: a name ("csv", made { plugin = "csv" }) or a
 * table; "jsonl" is the built-in metrics.jsonl, any other a plugin. */
static int logger_entry(struct tr_config *cfg, struct tr_value *list, size_t i, tr_err *err)
{
    char where[600];
    struct tr_value *item = list->items[i];
    tr_value_where(item, where, sizeof where);
    if (!item->is_list_item)
        return tr_fail(err, "%slogger: '%s' is not a list entry; write logger = { \"jsonl\", "
                       "{ plugin = \"csv\", file = \"m.csv\" } }", where, item->key);
    if (item->type == TR_V_STRING) { /* "csv" -> { plugin = "csv" } */
        struct tr_value *table = tr_value_new(TR_V_TABLE, item->key, item->origin);
        table->is_list_item = 1;
        struct tr_value *name = tr_value_new(TR_V_STRING, "plugin", item->origin);
        tr_value_set_string(name, item->string);
        tr_value_put(table, name);
        tr_value_put(list, table); /* replaces (and frees) the string */
        item = list->items[i];
    }
    struct tr_value *pv = item->type == TR_V_TABLE ? tr_value_child(item, "plugin") : NULL;
    if (!pv || pv->type != TR_V_STRING)
        return tr_fail(err, "%slogger entry %s: write a logger's name (\"csv\") or a table "
                       "{ plugin = \"csv\", ... }", where, item->key);
    if (strcmp(pv->string, "jsonl") == 0) { /* the built-in metrics.jsonl */
        if (item->n_items > 1)
            return tr_fail(err, "%slogger \"jsonl\" (metrics.jsonl) takes no options", where);
        return TR_OK;
    }
    return logger_slot(cfg, list, item, pv, err);
}

/* logger = { "jsonl", "csv", { plugin = "tensorboard", dir = "tb" } }: a list
 * of names or tables, each a logger plugin; "jsonl" is metrics.jsonl, which
 * the run always writes (report, plot and --resume read it), so it takes no
 * plugin.  Absent: { "jsonl" }, which show prints. */
int tr_config_loggers(struct tr_config *cfg, tr_err *err)
{
    struct tr_value *root = tr_recipe_root(cfg->recipe);
    struct tr_value *list = tr_value_child(root, "logger");
    if (list && list->type == TR_V_STRING) /* logger = "csv", logger=jsonl,csv on the CLI */
        list = logger_list_of_string(root, list);
    if (!list) {
        default_loggers(root);
        return TR_OK;
    }
    char where[600];
    tr_value_where(list, where, sizeof where);
    if (list->type != TR_V_TABLE)
        return tr_fail(err, "%slogger must be a list of logger plugins, e.g. logger = { \"jsonl\", "
                       "\"csv\", \"tensorboard\" }", where);
    for (size_t i = 0; i < list->n_items; i++)
        if (logger_entry(cfg, list, i, err) != TR_OK)
            return TR_ERROR;
    return TR_OK;
}
