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

void *tr_safetensors_header(const struct tr_st_entry *e, size_t n, const char *metadata_json,
                            size_t *header_size, size_t *size)
{
    char *header = NULL;
    size_t hlen = 0;
    FILE *h = open_memstream(&header, &hlen);
    if (!h)
        return NULL;
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
    if (fclose(h) != 0) {
        free(header);
        return NULL;
    }
    size_t padded = (hlen + 7) & ~(size_t)7; /* data starts 8-byte aligned */
    unsigned char *buf = malloc(8 + padded);
    if (!buf) {
        free(header);
        return NULL;
    }
    for (int b = 0; b < 8; b++)
        buf[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    memcpy(buf + 8, header, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    free(header);
    *header_size = 8 + padded;
    *size = 8 + padded + offset;
    return buf;
}

void *tr_safetensors_write(const struct tr_st_entry *e, size_t n, const char *metadata_json,
                           size_t *size)
{
    size_t at = 0;
    unsigned char *header = tr_safetensors_header(e, n, metadata_json, &at, size);
    unsigned char *buf = header ? malloc(*size) : NULL;
    if (!buf) {
        free(header);
        return NULL;
    }
    memcpy(buf, header, at);
    free(header);
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + at, e[i].data, e[i].bytes);
        at += e[i].bytes;
    }
    return buf;
}

struct tr_st_file {
    struct tr_st_entry *entries;
    char **names;
    void **copies; /* aligned copies of tensors the file stores misaligned */
    size_t n;
};

void tr_safetensors_free(struct tr_st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++) {
        free(f->names[i]);
        free(f->copies[i]);
    }
    free(f->names);
    free(f->copies);
    free(f->entries);
    free(f);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A JSON number that is a whole number in [0, 2^53] (doubles hold those
 * exactly); anything else, a string or 1e300 included, is malformed. */
static int json_size(const struct tr_json *v, uint64_t *out)
{
    if (!v || v->type != TR_JSON_NUMBER || !(v->number >= 0 && v->number <= 9007199254740992.0) ||
        v->number != (double)(uint64_t)v->number)
        return 0;
    *out = (uint64_t)v->number;
    return 1;
}

/* The shape's dimensions and the data offsets of entry t: whole numbers
 * whose product does not overflow; 0 when not. */
static int read_sizes(const struct tr_json *shape, const struct tr_json *off,
                      struct tr_st_entry *e, uint64_t *begin, uint64_t *end, uint64_t *numel)
{
    uint64_t dim = 0;
    *begin = *end = 0;
    *numel = 1;
    int sizes_ok = json_size(off->items[0], begin) && json_size(off->items[1], end);
    e->ndim = (int)shape->n;
    for (size_t d = 0; d < shape->n; d++) {
        /* every dimension a whole number, and their product without
         * overflow: a wrapped product could match a few bytes of data
         * while the shape promises far more */
        sizes_ok &= json_size(shape->items[d], &dim);
        e->shape[d] = sizes_ok ? (int64_t)dim : 0;
        if (!sizes_ok || (dim && *numel > UINT64_MAX / dim)) {
            sizes_ok = 0;
            break;
        }
        *numel *= dim;
    }
    return sizes_ok;
}

/* Header entry `name` (t) checked against the data it points into and
 * added to f as its next entry. */
static int read_entry(struct tr_st_file *f, const char *name, const struct tr_json *t,
                      const unsigned char *data, size_t data_size, uint64_t span[2],
                      const char *what, tr_err *err)
{
    /* t not an object: no dtype below */
    const char *dt = tr_json_string(t, "dtype");
    const struct tr_json *shape = tr_json_get(t, "shape");
    const struct tr_json *off = tr_json_get(t, "data_offsets");
    struct tr_st_entry *e = &f->entries[f->n];
    if (!dt || !dtype_from_tag(dt, &e->dtype) || !shape || shape->type != TR_JSON_ARRAY ||
        shape->n > 4 || !off || off->type != TR_JSON_ARRAY || off->n != 2)
        return tr_fail(err, "%s: tensor '%s' has a malformed or unsupported entry", what, name);
    uint64_t begin, end, numel;
    if (!read_sizes(shape, off, e, &begin, &end, &numel))
        return tr_fail(err, "%s: tensor '%s' has a shape or data offsets that are not whole "
                       "numbers from 0 to 2^53", what, name);
    uint64_t esize = e->dtype == TR_BF16 || e->dtype == TR_F16 ? 2 : 4;
    if (begin > end || end > data_size || numel > UINT64_MAX / esize ||
        end - begin != numel * esize)
        return tr_fail(err, "%s: tensor '%s' has data offsets [%llu, %llu) that do not match its "
                       "shape or the file size (truncated?)", what, name,
                       (unsigned long long)begin, (unsigned long long)end);
    span[0] = begin;
    span[1] = end;
    f->names[f->n] = tr_xstrdup(name);
    e->name = f->names[f->n];
    e->data = data + begin;
    e->bytes = end - begin;
    /* Readers take the data as float/uint16 arrays.  The format does not
     * promise alignment (a header of odd length, or a writer that does not
     * order tensors by dtype), so such a tensor is copied. */
    if ((uintptr_t)e->data % esize != 0) {
        f->copies[f->n] = tr_xcalloc(1, e->bytes ? e->bytes : 1);
        memcpy(f->copies[f->n], e->data, e->bytes);
        e->data = f->copies[f->n];
    }
    f->n++;
    return TR_OK;
}

/* Entries sorted by where their bytes begin (qsort). */
struct span_of {
    uint64_t begin, end;
    const char *name;
};

static int compare_spans(const void *a, const void *b)
{
    const struct span_of *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Two tensors sharing bytes would change together when either is written
 * (and the safetensors library refuses such a file): no byte of the data
 * belongs to two of them. */
static int check_no_overlap(const struct tr_st_file *f, uint64_t (*spans)[2], const char *what,
                            tr_err *err)
{
    struct span_of *v = tr_xcalloc(f->n ? f->n : 1, sizeof *v);
    for (size_t i = 0; i < f->n; i++)
        v[i] = (struct span_of){spans[i][0], spans[i][1], f->names[i]};
    qsort(v, f->n, sizeof *v, compare_spans);
    int rc = TR_OK;
    uint64_t reach = 0; /* where the bytes of the tensors so far end */
    const char *last = NULL;
    for (size_t i = 0; i < f->n && rc == TR_OK; i++) {
        if (v[i].begin == v[i].end)
            continue; /* no bytes: shares none */
        if (last && v[i].begin < reach)
            rc = tr_fail(err, "%s: tensors '%s' and '%s' have overlapping data offsets (bytes "
                         "%llu to %llu of the data are in both): the file is damaged or was "
                         "made by a broken writer; write it again", what, last, v[i].name,
                         (unsigned long long)v[i].begin,
                         (unsigned long long)(v[i].end < reach ? v[i].end : reach));
        if (v[i].end > reach) {
            reach = v[i].end;
            last = v[i].name;
        }
    }
    free(v);
    return rc;
}

/* A name twice would let two readers see different tensors under it. */
static int check_names_unique(const struct tr_st_file *f, const char *what, tr_err *err)
{
    if (f->n <= 1)
        return TR_OK;
    char **sorted = tr_xcalloc(f->n, sizeof *sorted);
    memcpy(sorted, f->names, f->n * sizeof *sorted);
    qsort(sorted, f->n, sizeof *sorted, compare_names);
    const char *twice = NULL;
    for (size_t i = 1; i < f->n && !twice; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0)
            twice = sorted[i];
    if (twice)
        tr_fail(err, "%s: tensor '%s' appears twice", what, twice);
    free(sorted);
    return twice ? TR_ERROR : TR_OK;
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
    f->copies = tr_xcalloc(j->n ? j->n : 1, sizeof *f->copies);
    uint64_t (*spans)[2] = tr_xcalloc(j->n ? j->n : 1, sizeof *spans);
    int rc = TR_OK;
    for (size_t i = 0; i < j->n && rc == TR_OK; i++)
        if (strcmp(j->keys[i], "__metadata__") != 0)
            rc = read_entry(f, j->keys[i], j->items[i], data, data_size, spans[f->n], what, err);
    if (rc == TR_OK)
        rc = check_names_unique(f, what, err);
    if (rc == TR_OK)
        rc = check_no_overlap(f, spans, what, err);
    free(spans);
    tr_json_free(j);
    if (rc != TR_OK) {
        tr_safetensors_free(f);
        return NULL;
    }
    return f;
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
