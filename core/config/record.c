/*
 * The run's record of its recipe (record.h): writing it, and comparing a
 * resumed run's recipe with it.
 */
#include "record.h"
#include "../util/json.h"
#include "../util/util.h"

#include <stdlib.h>
#include <string.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

/* The slots a configuration fills, in show's order; comm only when used,
 * then the logger plugins (metrics.jsonl is built in: no plugin). */
#define MAX_SLOTS (5 + TR_MAX_LOGGERS)
static int loaded_slots(const struct tr_config *cfg, const struct tr_slot **out)
{
    int n = 0;
    const struct tr_slot *all[] = {&cfg->precision, &cfg->data, &cfg->schedule, &cfg->checkpoint,
                                   &cfg->comm};
    for (size_t i = 0; i < TR_ARRAY_LEN(all); i++)
        if (all[i]->plugin)
            out[n++] = all[i];
    for (int i = 0; i < cfg->n_loggers && i < TR_MAX_LOGGERS; i++)
        if (cfg->loggers[i].plugin)
            out[n++] = &cfg->loggers[i];
    return n;
}

/* The tree keeps what the recipe said; where the configuration derived a
 * value the recipe left open, the record prints the derived one in its
 * key's place: train.steps the steps train.tokens or train.epochs come to;
 * train.micro_batch = "auto" prints as "auto" (the run
 * chooses it when it starts), one given as 0 as the micro-batch in effect;
 * one not given at all prints its default, 0. */
struct shown {
    const struct tr_config *cfg;
    struct tr_value derived; /* a copy of the leaf (key, origin) with the derived value */
};

static const struct tr_value *shown_value(void *ctx, const char *path,
                                          const struct tr_value *leaf)
{
    struct shown *s = ctx;
    const struct tr_train_config *t = &s->cfg->train;
    if (strcmp(path, "train.steps") == 0 && leaf->type == TR_V_NUMBER &&
        (t->length_from == TR_LENGTH_TOKENS || t->length_from == TR_LENGTH_EPOCHS)) {
        /* train.tokens / train.epochs: the steps they come to once resolved
         * (tr_train_resolve_steps; until then the recipe's own) */
        s->derived = *leaf;
        s->derived.text = NULL;
        s->derived.number = (double)t->steps;
        return &s->derived;
    }
    if (strcmp(path, "train.micro_batch") != 0)
        return leaf;
    s->derived = *leaf;
    s->derived.text = NULL;
    if (t->auto_micro_batch) {
        s->derived.type = TR_V_STRING;
        s->derived.string = (char *)"auto";
        return &s->derived;
    }
    if (leaf->type == TR_V_NUMBER && leaf->number == 0 && leaf->origin.kind != TR_FROM_DEFAULT) {
        s->derived.number = (double)t->micro_batch;
        return &s->derived;
    }
    return leaf;
}

void tr_record_print(const struct tr_config *cfg, FILE *out)
{
    fprintf(out, "-- %s, resolved (each value with where it came from)\n",
            tr_recipe_path(cfg->recipe));
    struct shown shown = {cfg, {0}};
    tr_value_dump_shown(tr_recipe_root(cfg->recipe), out, shown_value, &shown);
    const struct tr_slot *slots[MAX_SLOTS];
    int n = loaded_slots(cfg, slots);
    fprintf(out, "-- plugins\n");
    for (int i = 0; i < n; i++)
        fprintf(out, "%-10s = %-10s -- %s\n", slots[i]->key, slots[i]->plugin->info->name,
                slots[i]->plugin->path);
}

/* Every leaf of the tree as "dotted.key" (an empty table is a leaf too). */
static void write_values(const struct tr_value *v, const char *path, FILE *out, int *first,
                         struct shown *shown)
{
    if (v->type == TR_V_TABLE && v->n_items > 0) {
        for (size_t i = 0; i < v->n_items; i++) {
            char *child = *path ? tr_xasprintf("%s.%s", path, v->items[i]->key)
                                : tr_xstrdup(v->items[i]->key);
            write_values(v->items[i], child, out, first, shown);
            free(child);
        }
        return;
    }
    if (!*path)
        return;
    v = shown_value(shown, path, v);
    char value[4096], origin[1024];
    if (v->type == TR_V_TABLE)
        snprintf(value, sizeof value, "{}");
    else
        tr_value_format(v, value, sizeof value);
    tr_origin_format(&v->origin, origin, sizeof origin);
    fprintf(out, "%s\n    ", *first ? "" : ",");
    *first = 0;
    tr_json_write_string(out, path);
    fprintf(out, ": {\"value\": ");
    tr_json_write_string(out, value);
    fprintf(out, ", \"origin\": ");
    tr_json_write_string(out, origin);
    fprintf(out, "}");
}

void tr_record_write_json(const struct tr_config *cfg, FILE *out)
{
    fprintf(out, "{\n  \"format\": 1,\n  \"trainrun\": ");
    tr_json_write_string(out, PACKAGE_VERSION);
    fprintf(out, ",\n  \"recipe\": ");
    tr_json_write_string(out, tr_recipe_path(cfg->recipe));
    fprintf(out, ",\n  \"overrides\": [");
    for (int i = 0; i < cfg->n_overrides; i++) {
        fprintf(out, "%s", i ? ", " : "");
        tr_json_write_string(out, cfg->overrides[i]);
    }
    fprintf(out, "],\n  \"values\": {");
    int first = 1;
    struct shown shown = {cfg, {0}};
    write_values(tr_recipe_root(cfg->recipe), "", out, &first, &shown);
    fprintf(out, "\n  },\n  \"plugins\": [");
    const struct tr_slot *slots[MAX_SLOTS];
    int n = loaded_slots(cfg, slots);
    for (int i = 0; i < n; i++) {
        const struct tr_plugin_info *info = slots[i]->plugin->info;
        fprintf(out, "%s\n    {\"slot\": ", i ? "," : "");
        tr_json_write_string(out, slots[i]->key);
        fprintf(out, ", \"name\": ");
        tr_json_write_string(out, info->name);
        fprintf(out, ", \"version\": ");
        tr_json_write_string(out, info->version ? info->version : "");
        fprintf(out, ", \"path\": ");
        tr_json_write_string(out, slots[i]->plugin->path);
        fprintf(out, "}");
    }
    fprintf(out, "\n  ]\n}\n");
}

/* Keys whose change a resume takes with a note: they say how the run is
 * watched, saved, paid for, labelled or spread over processes, not what it
 * computes.  A key matches an entry equal to it or below it (entry + ".");
 * the first match wins, so a narrower entry that alters goes before its
 * section. */
static const struct {
    const char *key;
    int harmless;
} change_classes[] = {
    {"checkpoint.weights_dtype", 0}, /* a resume reads the weights back in this dtype */
    {"name", 1},
    {"run_dir", 1},
    /* how long: extending or shortening a run is what a resume is for; the
     * schedule follows the new length from the resumed step on */
    {"train.steps", 1},
    {"train.tokens", 1},
    {"train.epochs", 1},
    {"train.time", 1},
    {"device", 1}, /* the backends compute the same steps (rounding aside) */
    {"train.log_every", 1},
    {"train.eval_every", 1},
    {"train.eval_batches", 1},
    {"train.trace_every", 1},
    {"train.threads", 1},
    {"train.workers", 1},  /* the loader gives the same batches for any count */
    {"train.prefetch", 1},
    {"train.memory_budget", 1}, /* only sizes micro_batch = "auto" (same batch) */
    {"checkpoint", 1},     /* every, keep, keep_best, async, deadline, the store's options */
    {"early_stop", 1},
    {"cost", 1},           /* budget, hardware and prices */
    {"logger", 1},
    {"comm", 1},
    {"parallel", 1},
    {"procs", 1},
    {"gpus", 1},
};

int tr_record_key_harmless(const char *key)
{
    for (size_t i = 0; i < TR_ARRAY_LEN(change_classes); i++) {
        size_t n = strlen(change_classes[i].key);
        if (strncmp(key, change_classes[i].key, n) == 0 && (key[n] == 0 || key[n] == '.'))
            return change_classes[i].harmless;
    }
    return 0;
}

struct buf {
    char *text;
    size_t len;
};

static void add_line(struct buf *b, const char *key, const char *old, const char *now)
{
    char *line = tr_xasprintf("  %s: %s -> %s\n", key, old, now);
    size_t n = strlen(line);
    b->text = tr_xrealloc(b->text, b->len + n + 1);
    memcpy(b->text + b->len, line, n + 1);
    b->len += n;
    free(line);
}

int tr_record_compare(const struct tr_config *cfg, const char *json, size_t len, const char *what,
                      char **altering, char **harmless, tr_err *err)
{
    *altering = *harmless = NULL;
    size_t at = 0;
    struct tr_json *old = tr_json_parse(json, len, &at);
    const struct tr_json *old_values = old ? tr_json_get(old, "values") : NULL;
    if (!old_values || old_values->type != TR_JSON_OBJECT) {
        tr_json_free(old);
        return tr_fail(err, "%s: not a recipe record (malformed JSON near byte %zu, or no "
                       "\"values\"); move it away to resume without comparing", what, at);
    }
    /* the current values, through the same writer, read back */
    char *mine = NULL;
    size_t mine_len = 0;
    FILE *f = open_memstream(&mine, &mine_len);
    if (!f) {
        tr_json_free(old);
        return tr_fail(err, "out of memory comparing with %s", what);
    }
    tr_record_write_json(cfg, f);
    fclose(f);
    struct tr_json *now = tr_json_parse(mine, mine_len, &at);
    free(mine);
    const struct tr_json *now_values = now ? tr_json_get(now, "values") : NULL;
    if (!now_values) { /* cannot happen: we wrote it */
        tr_json_free(old);
        tr_json_free(now);
        return tr_fail(err, "internal error: the resolved recipe does not read back as JSON");
    }
    struct buf alt = {0}, ok = {0};
    for (size_t i = 0; i < old_values->n; i++) {
        const char *key = old_values->keys[i];
        const char *was = tr_json_string(old_values->items[i], "value");
        const struct tr_json *n = tr_json_get(now_values, key);
        const char *is = n ? tr_json_string(n, "value") : NULL;
        if (!was)
            was = "?";
        if (is && strcmp(was, is) == 0)
            continue;
        add_line(tr_record_key_harmless(key) ? &ok : &alt, key, was, is ? is : "(unset)");
    }
    for (size_t i = 0; i < now_values->n; i++) {
        const char *key = now_values->keys[i];
        if (tr_json_get(old_values, key))
            continue;
        const char *is = tr_json_string(now_values->items[i], "value");
        add_line(tr_record_key_harmless(key) ? &ok : &alt, key, "(unset)", is ? is : "?");
    }
    tr_json_free(old);
    tr_json_free(now);
    *altering = alt.text;
    *harmless = ok.text;
    return TR_OK;
}
