/*
 * Option schemas (struct tr_option, declared once by each plugin and by the
 * core's own recipe sections) drive three things: validation with errors
 * that point at the recipe's file:line, parsing into a config struct, and
 * the help text of `trainrun plugins` / `trainrun help recipe`.
 */
#ifndef TR_OPTIONS_H
#define TR_OPTIONS_H

#include "value.h"
#include <stdio.h>
#include <trainrun/plugin.h>

struct tr_recipe;

/* A table in the recipe checked against one or more schemas.  Keys listed in
 * any schema are parsed into that schema's config; keys in no schema are an
 * error with a did-you-mean over all of them.  Missing keys take their
 * default, which is added to the tree (origin "default") so that
 * `trainrun show` prints every value that is in effect. */
struct tr_schema_use {
    const struct tr_option *options; /* TR_OPT_END-terminated; NULL = none */
    void *config;                    /* parsed values are written here */
};

/* `what` names the table in messages ("schedule 'cosine'", "train").
 * `table` may be NULL (all defaults): then `parent`/`key` say where to add
 * it for `show`.  Errors: "<file>:<line>: <what>: <problem>". */
int tr_options_apply(struct tr_value *parent, const char *key, const char *what,
                     const struct tr_schema_use *uses, int n_uses, tr_err *err);

/* The same, leaving alone the keys in `skip` (NULL-terminated): they are
 * checked by someone else (the root table's sections). */
int tr_options_apply_skip(struct tr_value *parent, const char *key, const char *what,
                          const struct tr_schema_use *uses, int n_uses,
                          const char *const *skip, tr_err *err);

/* The same, except that the options named in `read_by_caller`
 * (NULL-terminated) are neither parsed nor checked when the table gives
 * them: the caller reads those values itself (train.micro_batch = "auto",
 * the one string an integer option takes).  The tree is left as given. */
int tr_options_apply_except(struct tr_value *parent, const char *key, const char *what,
                            const struct tr_schema_use *uses, int n_uses,
                            const char *const *read_by_caller, tr_err *err);

/* One option per line: name, type, default, range/choices, help. */
void tr_options_help(const struct tr_option *options, FILE *out, const char *indent);

/* "file:line: " for a value (empty string when no origin is known). */
void tr_value_where(const struct tr_value *v, char *buf, size_t size);

#endif
