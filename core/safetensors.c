#include "safetensors.h"

#include "json.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dtype_tag(enum tr_dtype t)
{
    switch (t) {
    case TR_F32: return "F32";
    case TR_BF16: return "BF16";
    case TR_F16: return "F16";
    case TR_I32: return "I32";
    default: return "?";
    }
}

static int dtype_from_tag(const char *s, enum tr_dtype *t)
{
    const char *tags[] = {"F32", "BF16", "F16", "I32"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, tags[i]) == 0) {
            *t = (enum tr_dtype)i;
            return 1;
        }
    return 0;
}

void *tr_safetensors_write(const struct tr_st_entry *e, size_t n, const char *metadata_json,
                           size_t *size)
{
    char *header = NULL;
    size_t hlen = 0;
    FILE *h = open_memstream(&header, &hlen);
    fputc('{', h);
    if (metadata_json)
        fprintf(h, "\"__metadata__\":%s", metadata_json);
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        if (i || metadata_json)
            fputc(',', h);
        tr_json_write_string(h, e[i].name);
        fprintf(h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_tag(e[i].dtype));
        for (int d = 0; d < e[i].ndim; d++)
            fprintf(h, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        fprintf(h, "],\"data_offsets\":[%zu,%zu]}", offset, offset + e[i].bytes);
        offset += e[i].bytes;
    }
    fputc('}', h);
    fclose(h);
    size_t padded = (hlen + 7) & ~(size_t)7; /* data starts 8-byte aligned */
    *size = 8 + padded + offset;
    unsigned char *buf = malloc(*size);
    if (!buf) {
        free(header);
        return NULL;
    }
    for (int b = 0; b < 8; b++)
        buf[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    memcpy(buf + 8, header, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    size_t at = 8 + padded;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + at, e[i].data, e[i].bytes);
        at += e[i].bytes;
    }
    free(header);
    return buf;
}

struct tr_st_file {
    struct tr_st_entry *entries;
    char **names;
    size_t n;
};

void tr_safetensors_free(struct tr_st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free(f->names[i]);
    free(f->names);
    free(f->entries);
    free(f);
}

struct tr_st_file *tr_safetensors_read(const void *buf, size_t size, const char *what, tr_err *err)
{
    const unsigned char *b = buf;
    if (size < 8) {
        tr_fail(err, "%s: truncated safetensors file (%zu bytes)", what, size);
        return NULL;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)b[i] << (8 * i);
    if (hlen > size - 8) {
        tr_fail(err, "%s: safetensors header of %llu bytes does not fit in %zu", what,
                (unsigned long long)hlen, size);
        return NULL;
    }
    size_t bad = 0;
    struct tr_json *j = tr_json_parse((const char *)b + 8, (size_t)hlen, &bad);
    if (!j || j->type != TR_JSON_OBJECT) {
        tr_fail(err, "%s: safetensors header is not valid JSON (at byte %zu)", what, bad + 8);
        tr_json_free(j);
        return NULL;
    }
    size_t data_size = size - 8 - (size_t)hlen;
    const unsigned char *data = b + 8 + hlen;
    struct tr_st_file *f = tr_xcalloc(1, sizeof *f);
    f->entries = tr_xcalloc(j->n ? j->n : 1, sizeof *f->entries);
    f->names = tr_xcalloc(j->n ? j->n : 1, sizeof *f->names);
    for (size_t i = 0; i < j->n; i++) {
        if (strcmp(j->keys[i], "__metadata__") == 0)
            continue;
        const struct tr_json *t = j->items[i];
        const char *dt = tr_json_string(t, "dtype");
        const struct tr_json *shape = tr_json_get(t, "shape");
        const struct tr_json *off = tr_json_get(t, "data_offsets");
        struct tr_st_entry *e = &f->entries[f->n];
        if (!dt || !dtype_from_tag(dt, &e->dtype) || !shape || shape->type != TR_JSON_ARRAY ||
            shape->n > 4 || !off || off->type != TR_JSON_ARRAY || off->n != 2) {
            tr_fail(err, "%s: tensor '%s' has a malformed or unsupported entry", what, j->keys[i]);
            goto fail;
        }
        size_t begin = (size_t)off->items[0]->number, end = (size_t)off->items[1]->number;
        size_t numel = 1;
        e->ndim = (int)shape->n;
        for (size_t d = 0; d < shape->n; d++) {
            e->shape[d] = (int64_t)shape->items[d]->number;
            numel *= (size_t)e->shape[d];
        }
        size_t esize = e->dtype == TR_BF16 || e->dtype == TR_F16 ? 2 : 4;
        if (begin > end || end > data_size || end - begin != numel * esize) {
            tr_fail(err, "%s: tensor '%s' has data offsets [%zu, %zu) that do not match its shape "
                    "or the file size (truncated?)", what, j->keys[i], begin, end);
            goto fail;
        }
        f->names[f->n] = tr_xstrdup(j->keys[i]);
        e->name = f->names[f->n];
        e->data = data + begin;
        e->bytes = end - begin;
        f->n++;
    }
    tr_json_free(j);
    return f;
fail:
    tr_json_free(j);
    tr_safetensors_free(f);
    return NULL;
}

const struct tr_st_entry *tr_safetensors_find(const struct tr_st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->entries[i].name, name) == 0)
            return &f->entries[i];
    return NULL;
}

size_t tr_safetensors_count(const struct tr_st_file *f) { return f->n; }
const struct tr_st_entry *tr_safetensors_at(const struct tr_st_file *f, size_t i) { return &f->entries[i]; }
