/* layout.json, the manifest of a sharded checkpoint (checkpoint_shard.h
 * says what it records): written by the publishing rank, parsed and
 * checked by every reader.  A manifest is input like any file a user can
 * hand the program, so parsing refuses anything incoherent (ranges that
 * overlap, leave gaps or leave their tensor or blob, unknown slots and
 * blobs, a world of 0, numbers past 2^53) with a message, never a crash. */
#include "checkpoint_shard.h"

#include "../util/json.h"
#include "../util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tr_ckpt_layout_free(struct tr_ckpt_layout *l)
{
    if (!l)
        return;
    for (int k = 0; k < l->n_slots; k++)
        free(l->slots[k]);
    for (size_t i = 0; i < l->n_blobs; i++)
        free(l->blobs[i].name);
    for (size_t i = 0; i < l->n_tensors; i++)
        free(l->tensors[i].name);
    free(l->blobs);
    free(l->tensors);
    free(l->entries);
    free(l);
}

/* A whole number in [0, max] (max at most 2^53, what a double holds exactly) */
static int whole(const struct tr_json *v, double max, uint64_t *out)
{
    if (!v || v->type != TR_JSON_NUMBER || !(v->number >= 0) || v->number > max ||
        v->number != floor(v->number))
        return 0;
    *out = (uint64_t)v->number;
    return 1;
}

#define MAX_WHOLE 9007199254740992.0 /* 2^53 */

/* A blob name as the writer makes them: a plain file name. */
static int plain_name(const char *s)
{
    if (!s || !s[0] || s[0] == '.' || strlen(s) > 200)
        return 0;
    for (const char *p = s; *p; p++)
        if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20)
            return 0;
    return 1;
}

static int by_slot_begin(const void *a, const void *b)
{
    const struct tr_ckpt_entry *x = a, *y = b;
    if (x->slot != y->slot)
        return x->slot < y->slot ? -1 : 1;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int bad(tr_err *err, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(tr_err *err, const char *what, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tr_fail(err, "%s: %s (damaged, edited or written by another program; the "
                   "checkpoint is not used)", what, msg);
}

int tr_ckpt_layout_parse(const char *text, size_t size, const char *what,
                         struct tr_ckpt_layout **out, tr_err *err)
{
    *out = NULL;
    size_t at = 0;
    struct tr_json *js = tr_json_parse(text, size, &at);
    if (!js || js->type != TR_JSON_OBJECT) {
        tr_json_free(js);
        return bad(err, what, "not a JSON object (byte %zu)", at);
    }
    struct tr_ckpt_layout *l = tr_xcalloc(1, sizeof *l);
    int rc = TR_ERROR;
    uint64_t v = 0;
    const struct tr_json *slots = tr_json_get(js, "slots"), *blobs = tr_json_get(js, "blobs"),
                         *tensors = tr_json_get(js, "tensors");
    const char *level = tr_json_string(js, "level");
    if (!whole(tr_json_get(js, "format"), MAX_WHOLE, &v) || v != 1) {
        bad(err, what, "\"format\" is not 1");
        goto done;
    }
    if (!whole(tr_json_get(js, "world"), TR_CKPT_MAX_WORLD, &v) || v == 0) {
        bad(err, what, "\"world\" is not a number of ranks in 1..%d", TR_CKPT_MAX_WORLD);
        goto done;
    }
    l->world = (int)v;
    if (!level || strlen(level) >= sizeof l->level) {
        bad(err, what, "\"level\" is missing");
        goto done;
    }
    snprintf(l->level, sizeof l->level, "%s", level);
    if (!whole(tr_json_get(js, "unit"), MAX_WHOLE, &l->unit) ||
        !whole(tr_json_get(js, "floats"), MAX_WHOLE, &l->floats)) {
        bad(err, what, "\"unit\" or \"floats\" is missing or out of range");
        goto done;
    }
    if (!slots || slots->type != TR_JSON_ARRAY || slots->n < 1 || slots->n > TR_CKPT_MAX_SLOTS) {
        bad(err, what, "\"slots\" is not a list of 1 to %d names", TR_CKPT_MAX_SLOTS);
        goto done;
    }
    for (size_t k = 0; k < slots->n; k++) {
        const struct tr_json *s = slots->items[k];
        if (s->type != TR_JSON_STRING || strlen(s->string) > 64) {
            bad(err, what, "slot %zu has no name", k);
            goto done;
        }
        l->slots[l->n_slots++] = tr_xstrdup(s->string);
    }
    if (strcmp(l->slots[0], "model") != 0) {
        bad(err, what, "the first slot is not \"model\"");
        goto done;
    }
    if (!blobs || blobs->type != TR_JSON_ARRAY || blobs->n < 1 || blobs->n > 4 * TR_CKPT_MAX_WORLD) {
        bad(err, what, "\"blobs\" is not a list of 1 to %d blobs", 4 * TR_CKPT_MAX_WORLD);
        goto done;
    }
    l->blobs = tr_xcalloc(blobs->n, sizeof *l->blobs);
    for (size_t i = 0; i < blobs->n; i++) {
        const struct tr_json *b = blobs->items[i];
        if (b->type != TR_JSON_ARRAY || b->n != 2 || b->items[0]->type != TR_JSON_STRING ||
            !plain_name(b->items[0]->string) || strcmp(b->items[0]->string, "state.json") == 0 ||
            strcmp(b->items[0]->string, TR_CKPT_LAYOUT_BLOB) == 0 ||
            !whole(b->items[1], MAX_WHOLE, &l->blobs[i].bytes)) {
            bad(err, what, "blob %zu is not [a plain file name, its bytes]", i);
            goto done;
        }
        l->blobs[i].name = tr_xstrdup(b->items[0]->string);
        l->n_blobs++;
        for (size_t j = 0; j < i; j++)
            if (strcmp(l->blobs[j].name, l->blobs[i].name) == 0) {
                bad(err, what, "blob %s is listed twice", l->blobs[i].name);
                goto done;
            }
    }
    if (!tensors || tensors->type != TR_JSON_ARRAY || tensors->n < 1) {
        bad(err, what, "\"tensors\" is not a list of tensors");
        goto done;
    }
    /* entries counted first: one array for all of them */
    size_t n_entries = 0;
    for (size_t i = 0; i < tensors->n; i++) {
        const struct tr_json *e = tr_json_get(tensors->items[i], "entries");
        if (tensors->items[i]->type != TR_JSON_OBJECT || !e || e->type != TR_JSON_ARRAY) {
            bad(err, what, "tensor %zu has no \"entries\" list", i);
            goto done;
        }
        n_entries += e->n;
    }
    l->tensors = tr_xcalloc(tensors->n, sizeof *l->tensors);
    l->entries = tr_xcalloc(n_entries ? n_entries : 1, sizeof *l->entries);
    uint64_t total = 0;
    for (size_t i = 0; i < tensors->n; i++) {
        const struct tr_json *t = tensors->items[i];
        struct tr_ckpt_tensor *lt = &l->tensors[i];
        const char *name = tr_json_string(t, "name");
        const struct tr_json *shape = tr_json_get(t, "shape"), *buf = tr_json_get(t, "buffer"),
                             *ents = tr_json_get(t, "entries");
        if (!name || !name[0] || strlen(name) > 512) {
            bad(err, what, "tensor %zu has no name", i);
            goto done;
        }
        lt->name = tr_xstrdup(name);
        l->n_tensors++;
        if (!shape || shape->type != TR_JSON_ARRAY || shape->n < 1 || shape->n > 4) {
            bad(err, what, "tensor '%s': \"shape\" is not a list of 1 to 4 sizes", name);
            goto done;
        }
        lt->ndim = (int)shape->n;
        double numel = 1;
        for (size_t d = 0; d < shape->n; d++) {
            uint64_t dim;
            if (!whole(shape->items[d], MAX_WHOLE, &dim)) {
                bad(err, what, "tensor '%s': a size of its shape is not a whole number", name);
                goto done;
            }
            lt->shape[d] = (int64_t)dim;
            numel *= (double)dim;
        }
        if (numel > (double)TR_CKPT_MAX_NUMEL) {
            bad(err, what, "tensor '%s' is larger than any model (%.0f elements)", name, numel);
            goto done;
        }
        lt->numel = (uint64_t)numel;
        lt->buffer = buf && buf->type == TR_JSON_BOOL && buf->boolean;
        for (size_t j = 0; j < i; j++)
            if (strcmp(l->tensors[j].name, name) == 0) {
                bad(err, what, "tensor '%s' is listed twice", name);
                goto done;
            }
        lt->first = l->n_entries;
        for (size_t k = 0; k < ents->n; k++) {
            const struct tr_json *a = ents->items[k];
            uint64_t f[6];
            int ok = a->type == TR_JSON_ARRAY && a->n == 6;
            for (int m = 0; ok && m < 6; m++)
                ok = whole(a->items[m], MAX_WHOLE, &f[m]);
            if (!ok) {
                bad(err, what, "tensor '%s': entry %zu is not [slot, begin, end, blob, offset, "
                    "crc32] of whole numbers", name, k);
                goto done;
            }
            struct tr_ckpt_entry *en = &l->entries[l->n_entries];
            if (f[0] >= (uint64_t)l->n_slots || (lt->buffer && f[0] != 0)) {
                bad(err, what, "tensor '%s': entry %zu names slot %llu, which %s", name, k,
                    (unsigned long long)f[0], lt->buffer ? "a buffer has not" : "is not listed");
                goto done;
            }
            if (f[1] >= f[2] || f[2] > lt->numel) {
                bad(err, what, "tensor '%s': entry %zu holds elements %llu..%llu, not a range "
                    "inside its %llu", name, k, (unsigned long long)f[1],
                    (unsigned long long)f[2], (unsigned long long)lt->numel);
                goto done;
            }
            if (f[3] >= l->n_blobs || f[4] > l->blobs[f[3]].bytes ||
                (f[2] - f[1]) * 4 > l->blobs[f[3]].bytes - f[4] || f[5] > 0xffffffffull) {
                bad(err, what, "tensor '%s': entry %zu lies outside its blob, or its checksum "
                    "is not a CRC-32", name, k);
                goto done;
            }
            *en = (struct tr_ckpt_entry){(uint32_t)f[0], (uint32_t)f[3], f[1], f[2], f[4],
                                         (uint32_t)f[5]};
            l->n_entries++;
        }
        lt->n = l->n_entries - lt->first;
        struct tr_ckpt_entry *e = l->entries + lt->first;
        qsort(e, lt->n, sizeof *e, by_slot_begin);
        /* every slot (a buffer: the model's only) covered exactly: no gap, no overlap */
        int want_slots = lt->buffer ? 1 : l->n_slots;
        size_t j = 0;
        for (int s = 0; s < want_slots; s++) {
            uint64_t next = 0;
            for (; j < lt->n && e[j].slot == (uint32_t)s; j++) {
                if (e[j].begin != next) {
                    bad(err, what, "tensor '%s', slot %s: elements %llu..%llu are %s", name,
                        l->slots[s], (unsigned long long)(e[j].begin < next ? e[j].begin : next),
                        (unsigned long long)(e[j].begin < next ? next : e[j].begin),
                        e[j].begin < next ? "held twice (ranges overlap)" : "missing");
                    goto done;
                }
                next = e[j].end;
            }
            if (next != lt->numel) {
                bad(err, what, "tensor '%s', slot %s: elements %llu..%llu are missing", name,
                    l->slots[s], (unsigned long long)next, (unsigned long long)lt->numel);
                goto done;
            }
        }
        if (!lt->buffer)
            total += lt->numel;
    }
    if (total > l->floats) {
        bad(err, what, "its tensors hold %llu floats, more than the %llu it says",
            (unsigned long long)total, (unsigned long long)l->floats);
        goto done;
    }
    rc = TR_OK;
done:
    tr_json_free(js);
    if (rc == TR_OK)
        *out = l;
    else
        tr_ckpt_layout_free(l);
    return rc;
}

void tr_ckpt_layout_write(FILE *f, const struct tr_ckpt_layout *l)
{
    fprintf(f, "{\n  \"format\": 1,\n  \"world\": %d,\n  \"level\": ", l->world);
    tr_json_write_string(f, l->level);
    fprintf(f, ",\n  \"unit\": %llu,\n  \"floats\": %llu,\n  \"slots\": [",
            (unsigned long long)l->unit, (unsigned long long)l->floats);
    for (int k = 0; k < l->n_slots; k++) {
        fprintf(f, "%s", k ? ", " : "");
        tr_json_write_string(f, l->slots[k]);
    }
    fprintf(f, "],\n  \"blobs\": [");
    for (size_t i = 0; i < l->n_blobs; i++) {
        fprintf(f, "%s\n    [", i ? "," : "");
        tr_json_write_string(f, l->blobs[i].name);
        fprintf(f, ", %llu]", (unsigned long long)l->blobs[i].bytes);
    }
    fprintf(f, "\n  ],\n  \"tensors\": [");
    for (size_t i = 0; i < l->n_tensors; i++) {
        const struct tr_ckpt_tensor *t = &l->tensors[i];
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        tr_json_write_string(f, t->name);
        fprintf(f, ", \"shape\": [");
        for (int d = 0; d < t->ndim; d++)
            fprintf(f, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        fprintf(f, "], \"buffer\": %s, \"entries\": [", t->buffer ? "true" : "false");
        for (size_t j = 0; j < t->n; j++) {
            const struct tr_ckpt_entry *e = &l->entries[t->first + j];
            fprintf(f, "%s[%u, %llu, %llu, %u, %llu, %u]", j ? ", " : "", e->slot,
                    (unsigned long long)e->begin, (unsigned long long)e->end, e->blob,
                    (unsigned long long)e->offset, e->crc);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "\n  ]\n}\n");
}
