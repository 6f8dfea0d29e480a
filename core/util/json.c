#include "json.h"

#include "util.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    const char *s;
    size_t len, pos;
    int depth;
};

static void skip_ws(struct parser *p)
{
    while (p->pos < p->len && isspace((unsigned char)p->s[p->pos]))
        p->pos++;
}

static int peek(struct parser *p) { return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1; }

static struct tr_json *parse_value(struct parser *p);

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static char *parse_string(struct parser *p)
{
    if (peek(p) != '"')
        return NULL;
    p->pos++;
    size_t cap = 16, n = 0;
    char *out = tr_xcalloc(cap, 1);
    while (p->pos < p->len && p->s[p->pos] != '"') {
        char c = p->s[p->pos++];
        if (c == '\\') {
            if (p->pos >= p->len)
                break;
            char e = p->s[p->pos++];
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': { /* UTF-8, surrogate pairs joined (tokenizer.json vocabularies) */
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    int d = p->pos < p->len ? hex_digit(p->s[p->pos++]) : -1;
                    if (d < 0) { free(out); return NULL; }
                    v = v << 4 | (unsigned)d;
                }
                if (v >= 0xD800 && v < 0xDC00) {
                    unsigned lo = 0;
                    if (p->pos + 6 > p->len || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                        free(out);
                        return NULL;
                    }
                    p->pos += 2;
                    for (int k = 0; k < 4; k++) {
                        int d = hex_digit(p->s[p->pos++]);
                        if (d < 0) { free(out); return NULL; }
                        lo = lo << 4 | (unsigned)d;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) { free(out); return NULL; }
                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                } else if (v >= 0xDC00 && v <= 0xDFFF) {
                    free(out);
                    return NULL;
                }
                /* a NUL would cut the C string short: "a\u0000b" must not
                 * read as "a" */
                if (v == 0) { free(out); return NULL; }
                if (v < 0x80) {
                    c = (char)v;
                    break;
                }
                char u[4];
                int m = tr_utf8_encode((uint32_t)v, u);
                if (n + (size_t)m + 1 > cap)
                    out = tr_xrealloc(out, cap = 2 * cap + (size_t)m);
                for (int k = 0; k < m - 1; k++)
                    out[n++] = u[k];
                c = u[m - 1];
                break;
            }
            default: c = e; break;
            }
        } else if ((unsigned char)c < 0x20) {
            free(out);
            return NULL;
        }
        if (n + 2 > cap)
            out = tr_xrealloc(out, cap *= 2);
        out[n++] = c;
    }
    if (peek(p) != '"') {
        free(out);
        return NULL;
    }
    p->pos++;
    out[n] = 0;
    return out;
}

/* Append v (and, in an object, its key) to j. */
static void append_item(struct tr_json *j, char *key, struct tr_json *v)
{
    /* grow by doubling: a header of a million small items must not take a
     * million reallocations */
    if ((j->n & (j->n - 1)) == 0) {
        size_t cap = j->n ? 2 * j->n : 1;
        j->items = tr_xrealloc(j->items, cap * sizeof *j->items);
        if (j->type == TR_JSON_OBJECT)
            j->keys = tr_xrealloc(j->keys, cap * sizeof *j->keys);
    }
    if (j->type == TR_JSON_OBJECT)
        j->keys[j->n] = key;
    j->items[j->n++] = v;
}

/* The items of an object or array after its opening bracket, through its
 * closing one, into j; -1 when malformed. */
static int parse_items(struct parser *p, struct tr_json *j)
{
    int obj = j->type == TR_JSON_OBJECT;
    skip_ws(p);
    if (peek(p) == (obj ? '}' : ']')) {
        p->pos++;
        return 0;
    }
    for (;;) {
        char *key = NULL;
        if (obj) {
            skip_ws(p);
            if (!(key = parse_string(p)))
                return -1;
            skip_ws(p);
            if (peek(p) != ':') {
                free(key);
                return -1;
            }
            p->pos++;
        }
        struct tr_json *v = parse_value(p);
        if (!v) {
            free(key);
            return -1;
        }
        append_item(j, key, v);
        skip_ws(p);
        if (peek(p) == ',') {
            p->pos++;
            continue;
        }
        if (peek(p) == (obj ? '}' : ']')) {
            p->pos++;
            return 0;
        }
        return -1;
    }
}

/* A number's characters, read by strtod; -1 when it does not read whole. */
static int parse_number(struct parser *p, struct tr_json *j)
{
    char buf[64];
    size_t k = 0;
    /* (strchr finds a NUL byte too: it is no part of a number) */
    while (p->pos < p->len && k < sizeof buf - 1 && p->s[p->pos] &&
           strchr("+-0123456789.eE", p->s[p->pos]))
        buf[k++] = p->s[p->pos++];
    buf[k] = 0;
    char *end;
    j->type = TR_JSON_NUMBER;
    j->number = strtod(buf, &end);
    return *end ? -1 : 0;
}

/* The literal `word` at the parser's position: consumed, 1; else 0. */
static int take_word(struct parser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return 0;
    p->pos += n;
    return 1;
}

static struct tr_json *parse_value(struct parser *p)
{
    if (++p->depth > 64)
        return NULL;
    skip_ws(p);
    struct tr_json *j = tr_xcalloc(1, sizeof *j);
    int c = peek(p);
    int bad = 0;
    if (c == '{' || c == '[') {
        j->type = c == '{' ? TR_JSON_OBJECT : TR_JSON_ARRAY;
        p->pos++;
        bad = parse_items(p, j);
    } else if (c == '"') {
        j->type = TR_JSON_STRING;
        bad = !(j->string = parse_string(p));
    } else if (c == 't' && take_word(p, "true")) {
        j->type = TR_JSON_BOOL;
        j->boolean = 1;
    } else if (c == 'f' && take_word(p, "false")) {
        j->type = TR_JSON_BOOL;
    } else if (c == 'n' && take_word(p, "null")) {
        j->type = TR_JSON_NULL;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        bad = parse_number(p, j);
    } else {
        bad = 1;
    }
    if (bad) {
        tr_json_free(j);
        return NULL;
    }
    p->depth--;
    return j;
}

struct tr_json *tr_json_parse(const char *text, size_t len, size_t *error_offset)
{
    struct parser p = {text, len, 0, 0};
    struct tr_json *j = parse_value(&p);
    if (j) {
        skip_ws(&p);
        if (p.pos != len) {
            tr_json_free(j);
            j = NULL;
        }
    }
    if (!j && error_offset)
        *error_offset = p.pos;
    return j;
}

void tr_json_free(struct tr_json *j)
{
    if (!j)
        return;
    for (size_t i = 0; i < j->n; i++) {
        tr_json_free(j->items[i]);
        if (j->keys)
            free(j->keys[i]);
    }
    free(j->items);
    free(j->keys);
    free(j->string);
    free(j);
}

const struct tr_json *tr_json_get(const struct tr_json *obj, const char *key)
{
    if (!obj || obj->type != TR_JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->items[i];
    return NULL;
}

double tr_json_number(const struct tr_json *obj, const char *key, double fallback)
{
    const struct tr_json *v = tr_json_get(obj, key);
    return v && v->type == TR_JSON_NUMBER ? v->number : fallback;
}

const char *tr_json_string(const struct tr_json *obj, const char *key)
{
    const struct tr_json *v = tr_json_get(obj, key);
    return v && v->type == TR_JSON_STRING ? v->string : NULL;
}

void tr_json_write_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", out);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}
