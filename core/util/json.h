/* A small JSON reader (checkpoint state, safetensors headers) and writer helpers. */
#ifndef TR_JSON_H
#define TR_JSON_H

#include <stddef.h>
#include <stdio.h>

enum tr_json_type { TR_JSON_NULL, TR_JSON_BOOL, TR_JSON_NUMBER, TR_JSON_STRING, TR_JSON_ARRAY, TR_JSON_OBJECT };

struct tr_json {
    enum tr_json_type type;
    double number;
    int boolean;
    char *string;            /* STRING */
    char **keys;             /* OBJECT */
    struct tr_json **items;  /* ARRAY and OBJECT values */
    size_t n;
};

/* Parse text[0..len); NULL with *error_offset set on malformed input. */
struct tr_json *tr_json_parse(const char *text, size_t len, size_t *error_offset);
void tr_json_free(struct tr_json *j);
const struct tr_json *tr_json_get(const struct tr_json *obj, const char *key);
double tr_json_number(const struct tr_json *obj, const char *key, double fallback);
const char *tr_json_string(const struct tr_json *obj, const char *key);

/* Write s as a JSON string literal. */
void tr_json_write_string(FILE *out, const char *s);

#endif
