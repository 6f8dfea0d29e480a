/*
 * A reader of TensorBoard event files written apart from the tensorboard
 * logger (plugins/logger/tensorboard.c), so that the tests check that
 * plugin against the format, not against itself: its CRC32C is computed
 * bit by bit (the plugin uses a table), and it decodes any protobuf field
 * it meets, skipping those it does not know, as protobuf readers do.
 *
 * tfevents_read() fills the scalars of every Event in order and says
 * whether the first Event carries file_version "brain.Event:2".  Any
 * damage (a short record, a CRC that does not match, a malformed field)
 * is an error naming the byte offset.
 */
#ifndef TR_TESTS_TFEVENTS_H
#define TR_TESTS_TFEVENTS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tfe_scalar {
    int64_t step;
    double wall_time;
    char tag[64];
    float value;
};

struct tfe_file {
    int version_ok;     /* the first Event is file_version "brain.Event:2" */
    size_t events;      /* records read */
    struct tfe_scalar *v;
    size_t n;
};

static uint32_t tfe_crc32c(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    }
    return ~c;
}

static uint32_t tfe_masked(const unsigned char *p, size_t n)
{
    uint32_t c = tfe_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t tfe_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* a varint at *p (< end); -1 when malformed */
static int tfe_varint(const unsigned char **p, const unsigned char *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end)
            return -1;
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* One field: its number, wire type and, for wire 2, the bytes; for 0, 1
 * and 5, the value.  -1 when malformed. */
static int tfe_field(const unsigned char **p, const unsigned char *end, unsigned *field,
                     unsigned *wire, uint64_t *value, const unsigned char **data, size_t *len)
{
    uint64_t key;
    if (tfe_varint(p, end, &key) != 0)
        return -1;
    *field = (unsigned)(key >> 3);
    *wire = (unsigned)(key & 7);
    switch (*wire) {
    case 0:
        return tfe_varint(p, end, value);
    case 1:
    case 5: {
        int bytes = *wire == 1 ? 8 : 4;
        if (end - *p < bytes)
            return -1;
        *value = tfe_le(*p, bytes);
        *p += bytes;
        return 0;
    }
    case 2: {
        uint64_t n;
        if (tfe_varint(p, end, &n) != 0 || n > (uint64_t)(end - *p))
            return -1;
        *data = *p;
        *len = (size_t)n;
        *p += n;
        return 0;
    }
    default:
        return -1;
    }
}

static int tfe_add(struct tfe_file *f, int64_t step, double wall, const char *tag, size_t tag_len,
                   float value)
{
    struct tfe_scalar *grown = realloc(f->v, (f->n + 1) * sizeof *grown);
    if (!grown)
        return -1;
    f->v = grown;
    struct tfe_scalar *s = &f->v[f->n++];
    s->step = step;
    s->wall_time = wall;
    snprintf(s->tag, sizeof s->tag, "%.*s", (int)tag_len, tag);
    s->value = value;
    return 0;
}

/* One Event's bytes: its scalars into f.  -1 when malformed. */
static int tfe_event(struct tfe_file *f, const unsigned char *p, const unsigned char *end)
{
    int64_t step = 0;
    double wall = 0;
    const unsigned char *summary = NULL, *summary_end = NULL;
    int version = 0;
    while (p < end) {
        unsigned field, wire;
        uint64_t value = 0;
        const unsigned char *data = NULL;
        size_t len = 0;
        if (tfe_field(&p, end, &field, &wire, &value, &data, &len) != 0)
            return -1;
        if (field == 1 && wire == 1)
            memcpy(&wall, &value, sizeof wall);
        else if (field == 2 && wire == 0)
            step = (int64_t)value;
        else if (field == 3 && wire == 2)
            version = len == 13 && memcmp(data, "brain.Event:2", 13) == 0;
        else if (field == 5 && wire == 2) {
            summary = data;
            summary_end = data + len;
        }
    }
    if (f->events == 0)
        f->version_ok = version;
    /* Summary: repeated Value (field 1) { tag 1, simple_value 2 } */
    for (const unsigned char *q = summary; q && q < summary_end;) {
        unsigned field, wire;
        uint64_t value = 0;
        const unsigned char *data = NULL;
        size_t len = 0;
        if (tfe_field(&q, summary_end, &field, &wire, &value, &data, &len) != 0)
            return -1;
        if (field != 1 || wire != 2)
            continue;
        const char *tag = NULL;
        size_t tag_len = 0;
        float simple = 0;
        int have = 0;
        for (const unsigned char *r = data, *r_end = data + len; r < r_end;) {
            unsigned vf, vw;
            uint64_t vv = 0;
            const unsigned char *vd = NULL;
            size_t vl = 0;
            if (tfe_field(&r, r_end, &vf, &vw, &vv, &vd, &vl) != 0)
                return -1;
            if (vf == 1 && vw == 2) {
                tag = (const char *)vd;
                tag_len = vl;
            } else if (vf == 2 && vw == 5) {
                uint32_t bits = (uint32_t)vv;
                memcpy(&simple, &bits, sizeof simple);
                have = 1;
            }
        }
        if (tag && have && tfe_add(f, step, wall, tag, tag_len, simple) != 0)
            return -1;
    }
    return 0;
}

/* 0, or -1 with why (naming the offset) in msg */
static int tfevents_read(const char *path, struct tfe_file *f, char *msg, size_t msg_size)
{
    memset(f, 0, sizeof *f);
    FILE *in = fopen(path, "rb");
    if (!in) {
        snprintf(msg, msg_size, "cannot open %s", path);
        return -1;
    }
    long offset = 0;
    for (;;) {
        unsigned char head[12];
        size_t got = fread(head, 1, 12, in);
        if (got == 0)
            break;
        if (got != 12) {
            snprintf(msg, msg_size, "%s: a record header cut short at byte %ld", path, offset);
            goto bad;
        }
        uint64_t len = tfe_le(head, 8);
        if ((uint32_t)tfe_le(head + 8, 4) != tfe_masked(head, 8)) {
            snprintf(msg, msg_size, "%s: the length CRC does not match at byte %ld", path, offset);
            goto bad;
        }
        if (len > (1u << 26)) {
            snprintf(msg, msg_size, "%s: a record of %llu bytes at byte %ld", path,
                     (unsigned long long)len, offset);
            goto bad;
        }
        unsigned char *data = malloc(len + 4);
        if (!data || fread(data, 1, len + 4, in) != len + 4) {
            free(data);
            snprintf(msg, msg_size, "%s: a record cut short at byte %ld", path, offset);
            goto bad;
        }
        if ((uint32_t)tfe_le(data + len, 4) != tfe_masked(data, len)) {
            free(data);
            snprintf(msg, msg_size, "%s: the data CRC does not match at byte %ld", path, offset);
            goto bad;
        }
        int rc = tfe_event(f, data, data + len);
        free(data);
        if (rc != 0) {
            snprintf(msg, msg_size, "%s: a malformed Event at byte %ld", path, offset);
            goto bad;
        }
        f->events++;
        offset += (long)(12 + len + 4);
    }
    fclose(in);
    return 0;
bad:
    fclose(in);
    free(f->v);
    f->v = NULL;
    f->n = 0;
    return -1;
}

#endif
