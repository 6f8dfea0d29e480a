#define _XOPEN_SOURCE 700 /* strdup */

#include "value.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *copy_string(const char *s)
{
    return s ? strdup(s) : NULL;
}

struct tr_value *tr_value_new(enum tr_value_type type, const char *key, struct tr_origin origin)
{
    struct tr_value *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    v->type = type;
    v->origin = origin;
    v->origin.file = copy_string(origin.file);
    v->key = copy_string(key);
    if ((key && !v->key) || (origin.file && !v->origin.file)) {
        tr_value_free(v);
        return NULL;
    }
    return v;
}

void tr_value_free(struct tr_value *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n_items; i++)
        tr_value_free(v->items[i]);
    free(v->items);
    free(v->key);
    free(v->string);
    free(v->text);
    free((char *)v->origin.file);
    free(v);
}

void tr_value_set_string(struct tr_value *v, const char *s)
{
    free(v->string);
    v->string = copy_string(s);
}

void tr_value_set_text(struct tr_value *v, const char *text)
{
    free(v->text);
    v->text = copy_string(text);
}

void tr_value_set_origin(struct tr_value *v, struct tr_origin origin)
{
    char *file = copy_string(origin.file);
    free((char *)v->origin.file);
    v->origin = origin;
    v->origin.file = file;
}

/* List items keep their positions; named keys stay sorted after them. */
static int goes_before(const struct tr_value *child, const struct tr_value *existing)
{
    if (child->is_list_item != existing->is_list_item)
        return child->is_list_item;
    if (child->is_list_item)
        return atol(child->key) < atol(existing->key);
    return strcmp(child->key, existing->key) < 0;
}

void tr_value_put(struct tr_value *table, struct tr_value *child)
{
    if (!table || !child)
        return;
    /* Items stay sorted, so a key after the last one is new: converting a
     * recipe puts its keys in order, and a list of thousands stays linear. */
    const struct tr_value *last = table->n_items ? table->items[table->n_items - 1] : NULL;
    int appends = child->key && last && last->key && goes_before(last, child);
    if (child->key && !appends) {
        for (size_t i = 0; i < table->n_items; i++) {
            if (table->items[i]->key && strcmp(table->items[i]->key, child->key) == 0) {
                tr_value_free(table->items[i]);
                table->items[i] = child;
                return;
            }
        }
    }
    struct tr_value **items = realloc(table->items, (table->n_items + 1) * sizeof *items);
    if (!items) {
        tr_value_free(child); /* the table owns its children: do not leak on failure */
        return;
    }
    table->items = items;
    size_t at = table->n_items;
    if (child->key) {
        while (at > 0 && table->items[at - 1]->key && goes_before(child, table->items[at - 1]))
            at--;
    }
    memmove(items + at + 1, items + at, (table->n_items - at) * sizeof *items);
    items[at] = child;
    table->n_items++;
}

struct tr_value *tr_value_child(const struct tr_value *table, const char *key)
{
    if (!table || table->type != TR_V_TABLE || !key)
        return NULL;
    for (size_t i = 0; i < table->n_items; i++)
        if (table->items[i]->key && strcmp(table->items[i]->key, key) == 0)
            return table->items[i];
    return NULL;
}

struct tr_value *tr_value_get(const struct tr_value *root, const char *dotted_path)
{
    if (!root || !dotted_path)
        return NULL;
    const struct tr_value *v = root;
    const char *p = dotted_path;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        char key[256];
        if (len == 0 || len >= sizeof key)
            return NULL;
        memcpy(key, p, len);
        key[len] = '\0';
        v = tr_value_child(v, key);
        if (!v)
            return NULL;
        if (!dot)
            break;
        p = dot + 1;
    }
    return (struct tr_value *)v;
}

void tr_origin_format(const struct tr_origin *o, char *buf, size_t size)
{
    if (!buf || size == 0)
        return;
    if (!o) {
        snprintf(buf, size, "unknown");
        return;
    }
    switch (o->kind) {
    case TR_FROM_DEFAULT:
        snprintf(buf, size, "default");
        break;
    case TR_FROM_CLI:
        snprintf(buf, size, "command line");
        break;
    case TR_FROM_ENV:
        snprintf(buf, size, "env %s", o->file ? o->file : "?");
        break;
    case TR_FROM_RECIPE:
    default:
        if (o->line > 0)
            snprintf(buf, size, "%s:%d", o->file ? o->file : "recipe", o->line);
        else
            snprintf(buf, size, "%s", o->file ? o->file : "recipe");
        break;
    }
}

/* ---- formatting ------------------------------------------------------------- */

/* A bounded string builder: writes what fits, always NUL-terminated. */
struct out {
    char *buf;
    size_t size, len;
};

static void put(struct out *o, const char *s, size_t n)
{
    if (o->len + 1 >= o->size)
        return;
    size_t room = o->size - 1 - o->len;
    if (n > room)
        n = room;
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

static void puts_(struct out *o, const char *s)
{
    put(o, s, strlen(s));
}

/* "e+05" -> "e5", "e-04" -> "e-4": the way people write exponents. */
static void tidy_exponent(char *s)
{
    char *e = strchr(s, 'e');
    if (!e)
        return;
    char *src = e + 1, *dst = e + 1;
    if (*src == '+')
        src++;
    else if (*src == '-')
        *dst++ = *src++;
    while (*src == '0' && src[1])
        src++;
    memmove(dst, src, strlen(src) + 1);
}

/* Shortest text that reads back as exactly d; integers without decimals. */
static void format_number(double d, char *buf, size_t size)
{
    if (isnan(d)) {
        snprintf(buf, size, "0/0");
        return;
    }
    if (isinf(d)) {
        snprintf(buf, size, d > 0 ? "math.huge" : "-math.huge");
        return;
    }
    if (d == floor(d) && fabs(d) < 1e15) {
        snprintf(buf, size, "%.0f", d);
        return;
    }
    char plain[40], sci[40];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(plain, sizeof plain, "%.*g", p, d);
        if (strtod(plain, NULL) == d)
            break;
    }
    snprintf(plain, sizeof plain, "%.*g", p, d);
    snprintf(sci, sizeof sci, "%.*e", p - 1, d);
    tidy_exponent(plain);
    tidy_exponent(sci);
    snprintf(buf, size, "%s", strlen(sci) < strlen(plain) ? sci : plain);
}

static void format_string(struct out *o, const char *s)
{
    put(o, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        switch (*c) {
        case '"': puts_(o, "\\\""); break;
        case '\\': puts_(o, "\\\\"); break;
        case '\n': puts_(o, "\\n"); break;
        case '\r': puts_(o, "\\r"); break;
        case '\t': puts_(o, "\\t"); break;
        default:
            if (*c < 32 || *c == 127) {
                snprintf(esc, sizeof esc, "\\%d", *c);
                puts_(o, esc);
            } else {
                put(o, (const char *)c, 1);
            }
        }
    }
    put(o, "\"", 1);
}

static int is_identifier(const char *s)
{
    static const char *const keywords[] = {"and",  "break", "do",    "else", "elseif", "end",   "false", "for",
                                           "function", "goto", "if", "in",   "local",  "nil",   "not",   "or",
                                           "repeat", "return", "then", "true", "until", "while"};
    if (!s || !(isalpha((unsigned char)*s) || *s == '_'))
        return 0;
    for (const char *c = s; *c; c++)
        if (!(isalnum((unsigned char)*c) || *c == '_'))
            return 0;
    for (size_t i = 0; i < sizeof keywords / sizeof *keywords; i++)
        if (strcmp(s, keywords[i]) == 0)
            return 0;
    return 1;
}

static void format_value(struct out *o, const struct tr_value *v)
{
    char num[64];
    switch (v->type) {
    case TR_V_NIL: puts_(o, "nil"); break;
    case TR_V_BOOL: puts_(o, v->boolean ? "true" : "false"); break;
    case TR_V_NUMBER:
        format_number(v->number, num, sizeof num);
        puts_(o, num);
        break;
    case TR_V_STRING: format_string(o, v->string ? v->string : ""); break;
    case TR_V_FUNCTION: puts_(o, "<function>"); break;
    case TR_V_TABLE:
        if (v->n_items == 0) {
            puts_(o, "{}");
            break;
        }
        puts_(o, "{");
        for (size_t i = 0; i < v->n_items; i++) {
            const struct tr_value *c = v->items[i];
            if (i > 0)
                puts_(o, ", ");
            if (!c->is_list_item && c->key) {
                if (is_identifier(c->key)) {
                    puts_(o, c->key);
                } else {
                    puts_(o, "[");
                    format_string(o, c->key);
                    puts_(o, "]");
                }
                puts_(o, " = ");
            }
            format_value(o, c);
        }
        puts_(o, "}");
        break;
    }
}

void tr_value_format(const struct tr_value *v, char *buf, size_t size)
{
    if (!buf || size == 0)
        return;
    struct out o = {buf, size, 0};
    buf[0] = '\0';
    if (!v) {
        puts_(&o, "nil");
        return;
    }
    format_value(&o, v);
}

/* ---- dump ------------------------------------------------------------------- */

struct dump_line {
    char *lhs;    /* "path = value" */
    char *origin;
};

struct dump {
    struct dump_line *lines;
    size_t n, cap;
    tr_value_shown_fn shown; /* NULL: each leaf as the tree holds it */
    void *ctx;
};

static void dump_add(struct dump *d, const char *path, const struct tr_value *v)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 32;
        struct dump_line *grown = realloc(d->lines, cap * sizeof *grown);
        if (!grown)
            return;
        d->lines = grown;
        d->cap = cap;
    }
    if (d->shown)
        v = d->shown(d->ctx, path, v);
    char value[1024], origin[512];
    tr_value_format(v, value, sizeof value);
    tr_origin_format(&v->origin, origin, sizeof origin);
    size_t len = strlen(path) + 3 + strlen(value) + 1;
    char *lhs = malloc(len);
    char *org = strdup(origin);
    if (!lhs || !org) {
        free(lhs);
        free(org);
        return;
    }
    snprintf(lhs, len, "%s = %s", path, value);
    d->lines[d->n].lhs = lhs;
    d->lines[d->n].origin = org;
    d->n++;
}

/* Lists print one item per line, as path.1, path.2, so each keeps its origin. */
static void dump_collect(struct dump *d, const struct tr_value *v, const char *path)
{
    if (v->type != TR_V_TABLE || v->n_items == 0) {
        if (path[0]) /* an empty recipe prints nothing */
            dump_add(d, path, v);
        return;
    }
    for (size_t i = 0; i < v->n_items; i++) {
        const struct tr_value *c = v->items[i];
        const char *key = c->key ? c->key : "?";
        size_t len = strlen(path) + 1 + strlen(key) + 1;
        char *child = malloc(len);
        if (!child)
            return;
        if (path[0])
            snprintf(child, len, "%s.%s", path, key);
        else
            snprintf(child, len, "%s", key);
        dump_collect(d, c, child);
        free(child);
    }
}

/* Origins start in one column unless a line is unusually long. */
#define DUMP_MAX_ALIGN 48

void tr_value_dump(const struct tr_value *root, FILE *out)
{
    tr_value_dump_shown(root, out, NULL, NULL);
}

void tr_value_dump_shown(const struct tr_value *root, FILE *out, tr_value_shown_fn shown,
                         void *ctx)
{
    if (!root || !out)
        return;
    struct dump d = {.shown = shown, .ctx = ctx};
    dump_collect(&d, root, "");
    size_t width = 0;
    for (size_t i = 0; i < d.n; i++) {
        size_t len = strlen(d.lines[i].lhs);
        if (len > width && len <= DUMP_MAX_ALIGN)
            width = len;
    }
    for (size_t i = 0; i < d.n; i++) {
        fprintf(out, "%-*s   -- %s\n", (int)width, d.lines[i].lhs, d.lines[i].origin);
        free(d.lines[i].lhs);
        free(d.lines[i].origin);
    }
    free(d.lines);
}
