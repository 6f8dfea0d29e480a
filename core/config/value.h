/*
 * A resolved recipe as a plain C tree, each value carrying where it came from.
 *
 * The Lua layer (core/config/recipe.c) builds it once after extends/include merging
 * and command-line overrides; everything downstream (option validation,
 * `trainrun show`, plugin configs) reads this tree and never touches Lua.
 */
#ifndef TR_VALUE_H
#define TR_VALUE_H

#include <stddef.h>
#include <stdio.h>

enum tr_value_type {
    TR_V_NIL = 0,
    TR_V_BOOL,
    TR_V_NUMBER,
    TR_V_STRING,
    TR_V_TABLE,
    TR_V_FUNCTION /* a Lua function (e.g. an inline model builder); opaque here */
};

enum tr_origin_kind {
    TR_FROM_RECIPE = 0, /* file:line of a recipe (or a file it extends/includes) */
    TR_FROM_DEFAULT,    /* a schema default */
    TR_FROM_CLI,        /* a key=value on the command line */
    TR_FROM_ENV         /* an environment variable, e.g. TRAINRUN_PRECISION */
};

struct tr_origin {
    enum tr_origin_kind kind;
    const char *file; /* TR_FROM_RECIPE: the file; TR_FROM_ENV: the variable name */
    int line;         /* TR_FROM_RECIPE: 1-based line, 0 if unknown */
};

struct tr_value {
    enum tr_value_type type;
    char *key;            /* key in the parent table; "1", "2"... for list items */
    int is_list_item;     /* key is a 1-based list position */
    int boolean;          /* TR_V_BOOL */
    double number;        /* TR_V_NUMBER */
    char *string;         /* TR_V_STRING */
    char *text;           /* TR_FROM_CLI: the raw text as typed, else NULL */
    struct tr_value **items; /* TR_V_TABLE: list items first (in order), then keys sorted */
    size_t n_items;
    struct tr_origin origin;
};

/* Constructors: all strings are copied; the tree owns everything. */
struct tr_value *tr_value_new(enum tr_value_type type, const char *key, struct tr_origin origin);
void tr_value_free(struct tr_value *v);
/* Append child to a table (replaces an existing child with the same key). */
void tr_value_put(struct tr_value *table, struct tr_value *child);

/* Child of a table by key, or NULL. */
struct tr_value *tr_value_child(const struct tr_value *table, const char *key);
/* Value at a dotted path ("schedule.warmup"), or NULL. */
struct tr_value *tr_value_get(const struct tr_value *root, const char *dotted_path);

/* "recipes/kjv.lua:14", "default", "command line", "env TRAINRUN_PRECISION" */
void tr_origin_format(const struct tr_origin *o, char *buf, size_t size);

/* The value as recipe text: 3e-4, true, "cosine", { ... } */
void tr_value_format(const struct tr_value *v, char *buf, size_t size);

/* `trainrun show`: one line per leaf, "path = value   -- origin", sorted as stored. */
void tr_value_dump(const struct tr_value *root, FILE *out);
/* The same, printing for each leaf the value `shown` gives for it: the leaf
 * itself, or one its reader derived from it (the tree stays as loaded). */
typedef const struct tr_value *(*tr_value_shown_fn)(void *ctx, const char *path,
                                                    const struct tr_value *leaf);
void tr_value_dump_shown(const struct tr_value *root, FILE *out, tr_value_shown_fn shown,
                         void *ctx);

/* The tree owns every string it points to, origin.file included (it is
 * copied by tr_value_new); set them through these, which copy too. */
void tr_value_set_string(struct tr_value *v, const char *s);
void tr_value_set_text(struct tr_value *v, const char *text);
void tr_value_set_origin(struct tr_value *v, struct tr_origin origin);

#endif
