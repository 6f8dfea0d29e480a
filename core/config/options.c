#include "options.h"

#include "../util/suggest.h"
#include "../util/util.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void tr_value_where(const struct tr_value *v, char *buf, size_t size)
{
    if (!v) {
        buf[0] = 0;
        return;
    }
    char o[512];
    tr_origin_format(&v->origin, o, sizeof o);
    snprintf(buf, size, "%s: ", o);
}

static const char *type_word(enum tr_option_type t)
{
    switch (t) {
    case TR_OPT_INT: return "an integer";
    case TR_OPT_FLOAT: return "a number";
    case TR_OPT_BOOL: return "true or false";
    case TR_OPT_STRING: return "a string";
    case TR_OPT_ENUM: return "one of";
    default: return "?";
    }
}

static const char *value_word(const struct tr_value *v)
{
    switch (v->type) {
    case TR_V_NIL: return "nil";
    case TR_V_BOOL: return "a boolean";
    case TR_V_NUMBER: return "a number";
    case TR_V_STRING: return "a string";
    case TR_V_TABLE: return "a table";
    case TR_V_FUNCTION: return "a function";
    }
    return "?";
}

static int bounded(const struct tr_option *o) { return !(o->min == 0 && o->max == 0); }

/* Every integer option stays within what a recipe number holds exactly
 * (2^53 - 1), whatever its schema says: past it, 2^53 + 1 would silently
 * read as 2^53.  Schemas give real, much tighter bounds. */
#define INT_LIMIT 9007199254740991.0

static void effective_range(const struct tr_option *o, double *lo, double *hi)
{
    *lo = bounded(o) ? o->min : TR_NO_MIN;
    *hi = bounded(o) ? o->max : TR_NO_MAX;
    if (o->type == TR_OPT_INT) {
        *lo = fmax(*lo, -INT_LIMIT);
        *hi = fmin(*hi, INT_LIMIT);
    }
}

/* A bound as people write it: integers in full (1000000000000, not 1e+12). */
static void format_bound(const struct tr_option *o, double x, char *buf, size_t size)
{
    if (o->type == TR_OPT_INT || (x == floor(x) && fabs(x) <= INT_LIMIT))
        snprintf(buf, size, "%.0f", x);
    else
        snprintf(buf, size, "%g", x);
}

static void format_range(const struct tr_option *o, double lo, double hi, char *buf, size_t size)
{
    char a[40], b[40];
    format_bound(o, lo, a, sizeof a);
    format_bound(o, hi, b, sizeof b);
    if (lo == TR_NO_MIN)
        snprintf(buf, size, "at most %s", b);
    else if (hi == TR_NO_MAX)
        snprintf(buf, size, "at least %s", a);
    else
        snprintf(buf, size, "between %s and %s", a, b);
}

/* The value as the user wrote it: the command-line text (cut short if
 * long), else the number as recipe text (1e18, 0.5). */
static void shown_number(const struct tr_value *v, char *buf, size_t size)
{
    if (v->text && v->origin.kind == TR_FROM_CLI) {
        size_t len = strlen(v->text);
        snprintf(buf, size, len > 40 ? "%.40s..." : "%s", v->text);
        return;
    }
    tr_value_format(v, buf, size);
}

static void format_choices(const struct tr_option *o, char *buf, size_t size)
{
    buf[0] = 0;
    for (int i = 0; o->choices && o->choices[i]; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, size - len, "%s%s", i ? ", " : "", o->choices[i]);
    }
}

/* The number literals a recipe can write, and so a command line may give:
 * [+-] decimal digits with an optional fraction and exponent (1000, 1e3,
 * 2.5e-4, .5), or a hexadecimal integer (0x10).  strtod alone would also
 * take "inf", "nan", " 7", hex floats and locale forms, which a recipe
 * cannot write. */
static int is_number_literal(const char *s)
{
    if (*s == '+' || *s == '-')
        s++;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        if (!*s)
            return 0;
        for (; *s; s++)
            if (!isxdigit((unsigned char)*s))
                return 0;
        return 1;
    }
    int digits = 0;
    for (; isdigit((unsigned char)*s); s++)
        digits++;
    if (*s == '.')
        for (s++; isdigit((unsigned char)*s); s++)
            digits++;
    if (!digits)
        return 0;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!isdigit((unsigned char)*s))
            return 0;
        while (isdigit((unsigned char)*s))
            s++;
    }
    return *s == 0;
}

/* Parse recipe text (a default, or a command-line value) by the option type. */
static int parse_text(const struct tr_option *o, const char *text, struct tr_value *out)
{
    char *end = NULL;
    switch (o->type) {
    case TR_OPT_INT:
    case TR_OPT_FLOAT:
        if (!is_number_literal(text))
            return -1;
        out->number = strtod(text, &end);
        /* a literal too large for a double ("1e999") becomes +-inf, which
         * the range check then reports with the text as typed */
        if (end == text || *end)
            return -1;
        out->type = TR_V_NUMBER;
        return 0;
    case TR_OPT_BOOL:
        if (strcmp(text, "true") == 0 || strcmp(text, "false") == 0) {
            out->type = TR_V_BOOL;
            out->boolean = text[0] == 't';
            return 0;
        }
        return -1;
    case TR_OPT_STRING:
    case TR_OPT_ENUM:
        free(out->string);
        out->type = TR_V_STRING;
        out->string = tr_xstrdup(text);
        return 0;
    default:
        return -1;
    }
}

/* An integer or number option: in range, an integer where it must be, finite. */
static int take_number(const struct tr_option *o, struct tr_value *v, char *slot,
                       const char *where, const char *what, tr_err *err)
{
    if (v->type != TR_V_NUMBER)
        return tr_fail(err, "%s%s: option '%s' expects %s, got %s", where, what, o->name,
                       type_word(o->type), value_word(v));
    double x = v->number;
    char shown[64];
    shown_number(v, shown, sizeof shown);
    double lo, hi;
    effective_range(o, &lo, &hi);
    /* the range first: 1e18 steps is an integer, just too many */
    if (isnan(x) || x < lo || x > hi) {
        char range[128];
        format_range(o, lo, hi, range, sizeof range);
        return tr_fail(err, "%s%s: option '%s' is %s, must be %s", where, what, o->name, shown,
                       range);
    }
    if (o->type == TR_OPT_INT && x != floor(x))
        return tr_fail(err, "%s%s: option '%s' expects an integer, got %s", where, what,
                       o->name, shown);
    if (!isfinite(x))
        return tr_fail(err, "%s%s: option '%s' is %s, must be finite", where, what, o->name,
                       shown);
    if (o->type == TR_OPT_INT)
        *(int64_t *)slot = (int64_t)x;
    else
        *(double *)slot = x;
    return TR_OK;
}

/* A choice option: one of its choices, with a did-you-mean when close. */
static int take_enum(const struct tr_option *o, struct tr_value *v, char *slot,
                     const char *where, const char *what, tr_err *err)
{
    if (v->type != TR_V_STRING)
        return tr_fail(err, "%s%s: option '%s' expects a string, got %s", where, what,
                       o->name, value_word(v));
    size_t n = 0;
    while (o->choices && o->choices[n])
        n++;
    for (size_t i = 0; i < n; i++)
        if (strcmp(o->choices[i], v->string) == 0) {
            *(const char **)slot = o->choices[i];
            return TR_OK;
        }
    char list[512];
    format_choices(o, list, sizeof list);
    const char *hint = tr_suggest(v->string, (const char *const *)o->choices, n);
    if (hint)
        return tr_fail(err, "%s%s: option '%s' is \"%s\" (did you mean \"%s\"?); choices: %s",
                       where, what, o->name, v->string, hint, list);
    return tr_fail(err, "%s%s: option '%s' is \"%s\"; choices: %s", where, what, o->name,
                   v->string, list);
}

/* Check one value against its option and store it in config. */
static int take(const struct tr_option *o, struct tr_value *v, void *config, const char *what,
                tr_err *err)
{
    char where[600];
    tr_value_where(v, where, sizeof where);
    /* Command-line text is typed here, by the schema. */
    if (v->text && v->origin.kind == TR_FROM_CLI) {
        if (parse_text(o, v->text, v) != 0)
            return tr_fail(err, "%s%s: option '%s' expects %s, got \"%s\"", where, what, o->name,
                           type_word(o->type), v->text);
    }
    char *slot = (char *)config + o->offset;
    switch (o->type) {
    case TR_OPT_INT:
    case TR_OPT_FLOAT:
        return take_number(o, v, slot, where, what, err);
    case TR_OPT_BOOL:
        if (v->type != TR_V_BOOL)
            return tr_fail(err, "%s%s: option '%s' expects true or false, got %s", where, what,
                           o->name, value_word(v));
        *(int *)slot = v->boolean;
        return TR_OK;
    case TR_OPT_STRING:
        if (v->type == TR_V_NUMBER && v->text) { /* a CLI path like 123 */
            v->type = TR_V_STRING;
            v->string = tr_xstrdup(v->text);
        }
        if (v->type != TR_V_STRING)
            return tr_fail(err, "%s%s: option '%s' expects a string, got %s", where, what,
                           o->name, value_word(v));
        *(const char **)slot = v->string;
        return TR_OK;
    case TR_OPT_ENUM:
        return take_enum(o, v, slot, where, what, err);
    default:
        return tr_fail(err, "%s%s: option '%s' has an invalid type in its schema", where, what,
                       o->name);
    }
}

static const struct tr_option *find_option(const struct tr_schema_use *uses, int n_uses,
                                           const char *name, int *which)
{
    for (int u = 0; u < n_uses; u++)
        for (const struct tr_option *o = uses[u].options; o && o->type != TR_OPT_END; o++)
            if (strcmp(o->name, name) == 0) {
                *which = u;
                return o;
            }
    return NULL;
}

static int listed(const char *const *names, const char *key)
{
    for (; names && *names; names++)
        if (strcmp(*names, key) == 0)
            return 1;
    return 0;
}

/* A key no schema names: an error with a did-you-mean over every name the
 * table takes (the skipped keys first, then each schema's options). */
static int unknown_key(const struct tr_value *v, const char *what,
                       const struct tr_schema_use *uses, int n_uses, const char *const *skip,
                       tr_err *err)
{
    const char *names[256];
    size_t n = 0;
    for (const char *const *s = skip; s && *s && n < 256; s++)
        names[n++] = *s;
    for (int u = 0; u < n_uses; u++)
        for (const struct tr_option *o = uses[u].options; o && o->type != TR_OPT_END && n < 256; o++)
            names[n++] = o->name;
    char where[600];
    tr_value_where(v, where, sizeof where);
    const char *hint = v->is_list_item ? NULL : tr_suggest(v->key, names, n);
    if (v->is_list_item)
        return tr_fail(err, "%s%s: unexpected list item %s (options are written name = value)",
                       where, what, v->key);
    if (hint)
        return tr_fail(err, "%s%s: unknown option '%s' (did you mean '%s'?)", where, what,
                       v->key, hint);
    if (n == 0)
        return tr_fail(err, "%s%s: unknown option '%s' (it takes no options)", where, what,
                       v->key);
    char list[1024] = "";
    for (size_t j = 0; j < n; j++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", j ? ", " : "", names[j]);
    }
    return tr_fail(err, "%s%s: unknown option '%s'; options: %s", where, what, v->key, list);
}

/* An option the table does not give: its default, added to the tree (and
 * the table too, when there was none) so that show prints it. */
static int take_default(struct tr_value *parent, const char *key, struct tr_value **table,
                        const struct tr_option *o, void *config, const char *what, tr_err *err)
{
    if (!o->default_value) {
        char where[600] = "";
        if (*table)
            tr_value_where(*table, where, sizeof where);
        return tr_fail(err, "%s%s: option '%s' is required (%s)", where, what, o->name,
                       o->help ? o->help : "");
    }
    if (!*table && parent) {
        struct tr_origin d = {TR_FROM_DEFAULT, NULL, 0};
        *table = tr_value_new(TR_V_TABLE, key, d);
        tr_value_put(parent, *table);
    }
    struct tr_origin d = {TR_FROM_DEFAULT, NULL, 0};
    struct tr_value *v = tr_value_new(TR_V_NIL, o->name, d);
    if (parse_text(o, o->default_value, v) != 0) {
        tr_value_free(v);
        return tr_fail(err, "%s: the default of option '%s' (\"%s\") is not %s "
                       "(a bug in the plugin's schema)", what, o->name, o->default_value,
                       type_word(o->type));
    }
    if (*table)
        tr_value_put(*table, v);
    /* Without a tree (parent == NULL) v is not freed: string options point
     * into it for the life of the process. */
    return take(o, v, config, what, err);
}

static int apply(struct tr_value *parent, const char *key, const char *what,
                 const struct tr_schema_use *uses, int n_uses, const char *const *skip,
                 const char *const *read_by_caller, tr_err *err)
{
    struct tr_value *table = !parent ? NULL : key ? tr_value_child(parent, key) : parent;
    if (table && table->type != TR_V_TABLE) {
        char where[600];
        tr_value_where(table, where, sizeof where);
        return tr_fail(err, "%s%s must be a table, got %s", where, what, value_word(table));
    }
    /* 1. every key given must be known */
    for (size_t i = 0; table && i < table->n_items; i++) {
        struct tr_value *v = table->items[i];
        int which;
        if (!find_option(uses, n_uses, v->key, &which) && !listed(skip, v->key))
            return unknown_key(v, what, uses, n_uses, skip, err);
    }
    /* 2. every option: the given value, or its default */
    for (int u = 0; u < n_uses; u++) {
        for (const struct tr_option *o = uses[u].options; o && o->type != TR_OPT_END; o++) {
            struct tr_value *v = table ? tr_value_child(table, o->name) : NULL;
            if (v && listed(read_by_caller, o->name))
                continue;
            int rc = v ? take(o, v, uses[u].config, what, err)
                       : take_default(parent, key, &table, o, uses[u].config, what, err);
            if (rc != TR_OK)
                return TR_ERROR;
        }
    }
    return TR_OK;
}

int tr_options_apply(struct tr_value *parent, const char *key, const char *what,
                     const struct tr_schema_use *uses, int n_uses, tr_err *err)
{
    return apply(parent, key, what, uses, n_uses, NULL, NULL, err);
}

int tr_options_apply_skip(struct tr_value *parent, const char *key, const char *what,
                          const struct tr_schema_use *uses, int n_uses,
                          const char *const *skip, tr_err *err)
{
    return apply(parent, key, what, uses, n_uses, skip, NULL, err);
}

int tr_options_apply_except(struct tr_value *parent, const char *key, const char *what,
                            const struct tr_schema_use *uses, int n_uses,
                            const char *const *read_by_caller, tr_err *err)
{
    return apply(parent, key, what, uses, n_uses, NULL, read_by_caller, err);
}

void tr_options_help(const struct tr_option *options, FILE *out, const char *indent)
{
    for (const struct tr_option *o = options; o && o->type != TR_OPT_END; o++) {
        char spec[256];
        const char *t = o->type == TR_OPT_INT ? "int" : o->type == TR_OPT_FLOAT ? "number"
                      : o->type == TR_OPT_BOOL ? "bool" : o->type == TR_OPT_STRING ? "string" : "choice";
        if (o->type == TR_OPT_ENUM) {
            char list[200];
            format_choices(o, list, sizeof list);
            snprintf(spec, sizeof spec, "%s: %s", t, list);
        } else {
            double lo, hi;
            effective_range(o, &lo, &hi);
            char a[40], b[40];
            format_bound(o, lo, a, sizeof a);
            format_bound(o, hi, b, sizeof b);
            if (lo != TR_NO_MIN && hi != TR_NO_MAX)
                snprintf(spec, sizeof spec, "%s, %s..%s", t, a, b);
            else if (lo != TR_NO_MIN)
                snprintf(spec, sizeof spec, "%s, >= %s", t, a);
            else if (hi != TR_NO_MAX)
                snprintf(spec, sizeof spec, "%s, <= %s", t, b);
            else
                snprintf(spec, sizeof spec, "%s", t);
        }
        char def[128];
        if (o->default_value)
            snprintf(def, sizeof def, o->type == TR_OPT_STRING || o->type == TR_OPT_ENUM
                                          ? "\"%s\"" : "%s", o->default_value);
        else
            snprintf(def, sizeof def, "required");
        fprintf(out, "%s%-16s = %-12s (%s)\n%s    %s\n", indent, o->name, def, spec, indent,
                o->help ? o->help : "");
    }
}
