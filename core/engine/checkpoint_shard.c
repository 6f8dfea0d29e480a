/* Sharded checkpoints (checkpoint_shard.h): each rank's blob written in
 * parallel and published by rank 0 once all have, and read back range by
 * range at any world size and shard level. */
#include "checkpoint_shard.h"
#include "checkpoint_internal.h"

#include "backend.h"
#include "optim.h"
#include "../util/json.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <trainrun/input.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

int tr_ckpt_plugin_shared(const struct tr_checkpoint_vtable *vt)
{
    return TR_HAS_SLOT(vt, struct tr_checkpoint_vtable, begin_shared) &&
           TR_HAS_SLOT(vt, struct tr_checkpoint_vtable, detach);
}

/* ---- what a rank writes ----------------------------------------------------- */

/* One entry of a rank's blob: elements [begin, end) of tensor g->tensors[t]
 * in slot `slot`, taken from src (backend memory; NULL when planning
 * another rank's). */
struct piece {
    int slot, tensor;
    uint64_t begin, end;
    const float *src;
};

static int by_offset(const void *a, const void *b, void *g_)
{
    const struct tr_graph *g = g_;
    size_t x = g->tensors[*(const int *)a].offset, y = g->tensors[*(const int *)b].offset;
    return x < y ? -1 : x > y;
}

/* The parameter tensors of g sorted by their offset in the flat buffer. */
static int *params_by_offset(const struct tr_graph *g, int *n)
{
    int *idx = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *idx);
    *n = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == TR_ROLE_PARAM)
            idx[(*n)++] = i;
    qsort_r(idx, (size_t)*n, sizeof *idx, by_offset, (void *)g);
    return idx;
}

static void push_piece(struct piece **p, size_t *n, size_t *cap, struct piece x)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *p = tr_xrealloc(*p, *cap * sizeof **p);
    }
    (*p)[(*n)++] = x;
}

/* Rank q's entries, in the order of its blob: its parts (shard.h) of the
 * weights and of every state slot, split where tensors end, or the
 * tensors it owns whole (r->owner); rank 0 also every buffer whole. */
static size_t plan_rank(const struct tr_ckpt_rank *r, int q, const float *params,
                        float *const *slots, struct piece **out)
{
    const struct tr_shard *sh = r->shard;
    const struct tr_graph *g = r->g;
    int n_sorted, n_slots = 1 + r->od->state_slots;
    int *sorted = params_by_offset(g, &n_sorted);
    struct piece *p = NULL;
    size_t n = 0, cap = 0;
    for (int s = 0; r->owner && s < n_slots; s++)
        for (int j = 0; j < n_sorted; j++) {
            const struct tr_tensor *t = &g->tensors[sorted[j]];
            if (r->owner[sorted[j]] != q || t->numel == 0)
                continue;
            const float *src = NULL;
            if (params)
                src = (s == 0 ? params : slots[s - 1]) + t->offset;
            push_piece(&p, &n, &cap, (struct piece){s, sorted[j], 0, t->numel, src});
        }
    for (int s = 0; !r->owner && s < n_slots; s++) {
        size_t at = 0; /* this slot's packed position */
        int i = 0;
        for (size_t u = 0; u < sh->n_units; u++) {
            struct tr_shard_run part = tr_shard_part(sh, u, q);
            while (i < n_sorted && g->tensors[sorted[i]].offset + g->tensors[sorted[i]].numel <=
                                       part.begin)
                i++;
            for (int j = i; j < n_sorted && g->tensors[sorted[j]].offset < part.end; j++) {
                const struct tr_tensor *t = &g->tensors[sorted[j]];
                size_t b = t->offset > part.begin ? t->offset : part.begin;
                size_t e = t->offset + t->numel < part.end ? t->offset + t->numel : part.end;
                if (b >= e)
                    continue;
                const float *src = NULL;
                if (params)
                    src = s == 0 ? params + b : slots[s - 1] + at + (b - part.begin);
                push_piece(&p, &n, &cap,
                           (struct piece){s, sorted[j], b - t->offset, e - t->offset, src});
            }
            at += part.end - part.begin;
        }
    }
    for (int i = 0; q == 0 && i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_BUFFER || t->numel == 0)
            continue;
        push_piece(&p, &n, &cap,
                   (struct piece){0, i, 0, t->numel, params ? g->buffers + t->offset : NULL});
    }
    free(sorted);
    *out = p;
    return n;
}

/* The bytes of a rank's blob, produced on demand (tr_blob_fill_fn), with
 * each entry's CRC-32. */
struct shard_source {
    const struct tr_backend *be, *state_be; /* the weights' memory, the state slots' */
    const struct piece *p;
    size_t n, at;        /* entries; the one being given */
    uint64_t offset;     /* its bytes given */
    uint64_t size, pos;  /* the blob's bytes; given */
    uint32_t *crc;
};

static int shard_fill(void *ud, void *buf, size_t cap, size_t *got, tr_err *err)
{
    struct shard_source *s = ud;
    *got = 0;
    if (cap > 0 && s->pos == s->size)
        return tr_fail(err, "the checkpoint plugin asked for more than the blob's %llu bytes",
                       (unsigned long long)s->size);
    unsigned char *out = buf;
    size_t want = s->size - s->pos < cap ? (size_t)(s->size - s->pos) : cap;
    for (size_t done = 0; done < want;) {
        const struct piece *p = &s->p[s->at];
        uint64_t bytes = (p->end - p->begin) * 4;
        if (s->offset == bytes) {
            s->at++;
            s->offset = 0;
            continue;
        }
        size_t n = bytes - s->offset < want - done ? (size_t)(bytes - s->offset) : want - done;
        tr_be_download(p->slot > 0 ? s->state_be : s->be, out + done,
                       (const char *)p->src + s->offset, n);
        s->crc[s->at] = (uint32_t)crc32(s->crc[s->at], out + done, (uInt)n);
        s->offset += n;
        done += n;
    }
    s->pos += want;
    *got = want;
    return TR_OK;
}

static uint64_t blob_bytes(const struct piece *p, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += (p[i].end - p[i].begin) * 4;
    return total;
}

static void blob_name(char *out, size_t size, int q, int world)
{
    snprintf(out, size, "shard-%05d-of-%05d.bin", q, world);
}

/* This rank's blob through put_stream (or put with the blob whole, for a
 * plugin without it); crc[i]: entry i's CRC-32. */
static int write_blob(const struct tr_ckpt_rank *r, const struct piece *p, size_t n,
                      uint32_t *crc, tr_err *err)
{
    char name[64];
    blob_name(name, sizeof name, r->shard->rank, r->shard->world);
    struct shard_source s = {r->be, r->state_be ? r->state_be : r->be, p, n, 0, 0,
                             blob_bytes(p, n), 0, crc};
    for (size_t i = 0; i < n; i++)
        crc[i] = (uint32_t)crc32(0L, Z_NULL, 0);
    if (TR_HAS_SLOT(r->vt, struct tr_checkpoint_vtable, put_stream)) {
        int rc = r->vt->put_stream(r->self, name, (size_t)s.size, shard_fill, &s, err);
        if (rc == TR_OK && s.pos != s.size)
            rc = tr_fail(err, "the checkpoint plugin stored %s after %llu of its %llu bytes",
                         name, (unsigned long long)s.pos, (unsigned long long)s.size);
        return rc;
    }
    void *whole = malloc(s.size + 1);
    size_t got = 0;
    if (!whole)
        return tr_fail(err, "out of memory for %s (%llu bytes)", name,
                       (unsigned long long)s.size);
    int rc = s.size ? shard_fill(&s, whole, (size_t)s.size, &got, err) : TR_OK;
    if (rc == TR_OK)
        rc = r->vt->put(r->self, name, whole, (size_t)s.size, err);
    free(whole);
    return rc;
}

/* ---- the manifest ------------------------------------------------------------- */

struct placed {
    struct tr_ckpt_entry e;
    int tensor;
};

static int by_tensor_slot_begin(const void *a, const void *b)
{
    const struct placed *x = a, *y = b;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    if (x->e.slot != y->e.slot)
        return x->e.slot < y->e.slot ? -1 : 1;
    return x->e.begin < y->e.begin ? -1 : x->e.begin > y->e.begin;
}

/* layout.json's text from every rank's plan and entry CRC-32s (crcs[q]). */
static char *layout_text(const struct tr_ckpt_rank *r, uint32_t *const *crcs, size_t *size,
                         tr_err *err)
{
    const struct tr_shard *sh = r->shard;
    const struct tr_graph *g = r->g;
    struct tr_ckpt_layout l = {0};
    l.world = sh->world;
    snprintf(l.level, sizeof l.level, "%s", tr_shard_level_name(sh->level));
    l.unit = sh->unit;
    l.floats = sh->n;
    l.n_slots = 1 + r->od->state_slots;
    l.slots[0] = "model";
    for (int k = 0; k < r->od->state_slots; k++)
        l.slots[1 + k] = (char *)r->od->state_names[k];
    l.n_blobs = (size_t)sh->world;
    l.blobs = tr_xcalloc(l.n_blobs, sizeof *l.blobs);
    struct placed *all = NULL;
    size_t n_all = 0;
    for (int q = 0; q < sh->world; q++) {
        struct piece *p;
        size_t n = plan_rank(r, q, NULL, NULL, &p);
        char name[64];
        blob_name(name, sizeof name, q, sh->world);
        l.blobs[q].name = tr_xstrdup(name);
        l.blobs[q].bytes = blob_bytes(p, n);
        all = tr_xrealloc(all, (n_all + n + 1) * sizeof *all);
        uint64_t off = 0;
        for (size_t i = 0; i < n; i++) {
            all[n_all++] = (struct placed){{(uint32_t)p[i].slot, (uint32_t)q, p[i].begin, p[i].end,
                                            off, crcs[q][i]}, p[i].tensor};
            off += (p[i].end - p[i].begin) * 4;
        }
        free(p);
    }
    qsort(all, n_all, sizeof *all, by_tensor_slot_begin);
    l.entries = tr_xcalloc(n_all + 1, sizeof *l.entries);
    l.tensors = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *l.tensors);
    for (size_t i = 0; i < n_all; i++) {
        const struct tr_tensor *t = &g->tensors[all[i].tensor];
        if (i == 0 || all[i].tensor != all[i - 1].tensor) {
            struct tr_ckpt_tensor *lt = &l.tensors[l.n_tensors++];
            lt->name = t->name;
            lt->ndim = t->ndim;
            memcpy(lt->shape, t->shape, sizeof lt->shape);
            lt->numel = t->numel;
            lt->buffer = t->role == TR_ROLE_BUFFER;
            lt->first = i;
        }
        l.tensors[l.n_tensors - 1].n++;
        l.entries[l.n_entries++] = all[i].e;
    }
    char *text = NULL;
    FILE *f = open_memstream(&text, size);
    if (f) {
        tr_ckpt_layout_write(f, &l);
        fclose(f);
    }
    for (size_t q = 0; q < l.n_blobs; q++)
        free(l.blobs[q].name);
    free(l.blobs);
    free(l.entries);
    free(l.tensors);
    free(all);
    if (!text)
        tr_fail(err, "out of memory writing layout.json");
    return text;
}

/* ---- saving ------------------------------------------------------------------- */

/* src into dst[size], cut short where it must be */
static void copy_msg(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src) < size - 1 ? strlen(src) : size - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* What a rank tells the others, and rank 0 them all */
struct word {
    int32_t ok;
    uint32_t n;
    char msg[480];
};

int tr_ckpt_save_shared(const struct tr_ckpt_rank *r, struct tr_checkpointer *c,
                        const float *params, float *const *slots,
                        const struct tr_run_state *state, tr_err *err)
{
    int rank = r->shard->rank, world = r->shard->world;
    double t0 = tr_now();
    char name[64];
    snprintf(name, sizeof name, "step-%010llu", (unsigned long long)state->step);
    struct {
        int32_t ok;
        char token[512];
        char msg[480];
    } start;
    memset(&start, 0, sizeof start);
    tr_err mine = {{0}};
    if (rank == 0) {
        /* one write at a time: an earlier background save must have landed */
        if (tr_checkpointer_wait(c, &mine) == TR_OK &&
            r->vt->begin_shared(r->self, name, start.token, sizeof start.token, 1, &mine) == TR_OK)
            start.ok = 1;
        else
            copy_msg(start.msg, sizeof start.msg, mine.msg);
        start.token[sizeof start.token - 1] = 0;
    }
    if (tr_comm_broadcast_host(r->comm, &start, sizeof start, 0, err) != TR_OK) {
        if (rank == 0 && start.ok)
            r->vt->abort(r->self);
        return TR_ERROR;
    }
    if (!start.ok)
        return tr_fail(err, "checkpoint %s not saved (the previous one is still the latest): %s%s",
                       name, rank ? "rank 0: " : "", start.msg);
    int ok = 1;
    if (rank != 0 &&
        r->vt->begin_shared(r->self, name, start.token, sizeof start.token, 0, &mine) != TR_OK)
        ok = 0;
    struct piece *p;
    size_t n = plan_rank(r, rank, params, slots, &p);
    uint32_t *crc = tr_xcalloc(n + 1, sizeof *crc);
    if (ok && write_blob(r, p, n, crc, &mine) != TR_OK)
        ok = 0;
    if (ok && rank != 0 && r->vt->detach(r->self, &mine) != TR_OK)
        ok = 0;
    if (!ok && rank != 0)
        r->vt->abort(r->self); /* a joined rank forgets; rank 0's abort removes it all */
    free(p);
    /* every rank says how its blob went; rank 0 collects the entries' CRC-32s */
    uint32_t **crcs = tr_xcalloc((size_t)world, sizeof *crcs);
    char failed[600] = "";
    int comm_rc = TR_OK;
    for (int q = 0; q < world && comm_rc == TR_OK; q++) {
        struct word w = {0};
        if (q == rank) {
            w.ok = ok;
            w.n = (uint32_t)n;
            copy_msg(w.msg, sizeof w.msg, ok ? "" : mine.msg);
        }
        comm_rc = tr_comm_broadcast_host(r->comm, &w, sizeof w, q, err);
        if (comm_rc == TR_OK && w.ok && w.n) {
            crcs[q] = q == rank ? crc : tr_xcalloc(w.n, sizeof **crcs);
            comm_rc = tr_comm_broadcast_host(r->comm, crcs[q], w.n * sizeof **crcs, q, err);
        }
        if (comm_rc == TR_OK && !w.ok && !failed[0])
            snprintf(failed, sizeof failed, "rank %d: %s", q, w.msg);
        if (comm_rc == TR_OK && rank == 0 && w.ok && !failed[0]) {
            struct piece *theirs;
            size_t m = plan_rank(r, q, NULL, NULL, &theirs);
            free(theirs);
            if (m != w.n)
                snprintf(failed, sizeof failed, "rank %d wrote %u entries, rank 0 expected %zu "
                         "(the ranks disagree about the model)", q, w.n, m);
        }
    }
    struct word res = {0};
    if (comm_rc == TR_OK && rank == 0) {
        if (failed[0]) {
            r->vt->abort(r->self);
            copy_msg(res.msg, sizeof res.msg, failed);
        } else {
            /* the manifest and state.json, then publish */
            size_t lsize = 0, ssize = 0;
            char *layout = layout_text(r, crcs, &lsize, &mine);
            enum tr_dtype wd = c->cfg.weights_dtype;
            c->cfg.weights_dtype = TR_F32; /* the shards hold the fp32 weights */
            c->state = *state;
            const char *blobs[] = {TR_CKPT_LAYOUT_BLOB};
            unsigned long sums[] = {layout ? tr_ckpt_crc(layout, lsize) : 0};
            char *st = layout ? tr_ckpt_state_json(c, blobs, sums, 1, &ssize) : NULL;
            c->cfg.weights_dtype = wd;
            if (layout && st &&
                r->vt->put(r->self, TR_CKPT_LAYOUT_BLOB, layout, lsize, &mine) == TR_OK &&
                r->vt->put(r->self, "state.json", st, ssize, &mine) == TR_OK &&
                r->vt->commit(r->self, &mine) == TR_OK) {
                res.ok = 1;
            } else {
                r->vt->abort(r->self);
                copy_msg(res.msg, sizeof res.msg, mine.msg);
            }
            free(layout);
            free(st);
        }
    } else if (comm_rc != TR_OK && rank == 0) {
        r->vt->abort(r->self);
    }
    for (int q = 0; q < world; q++)
        if (crcs[q] != crc)
            free(crcs[q]);
    free(crcs);
    free(crc);
    if (comm_rc != TR_OK) {
        tr_err_prefix(err, "checkpoint %s not saved (the previous one is still the latest)", name);
        return TR_ERROR;
    }
    if (tr_comm_broadcast_host(r->comm, &res, sizeof res, 0, err) != TR_OK)
        return TR_ERROR;
    if (rank == 0) {
        c->stall += tr_now() - t0;
        if (res.ok)
            tr_ckpt_prune(c);
    }
    if (!res.ok)
        return tr_fail(err, "checkpoint %s not saved (the previous one is still the latest): %s",
                       name, res.msg);
    return TR_OK;
}

/* ---- reading ------------------------------------------------------------------ */

/* Bytes of a blob: a range through the plugin's get_range, a local file's
 * pread, or (a plugin without get_range) the whole blob through get(),
 * kept while the next reads are in it. */
struct reader {
    const struct tr_ckpt_src *src;
    char *whole_name;
    unsigned char *whole;
    size_t whole_size;
    char *fd_name;
    int fd;
};

static void reader_close(struct reader *rd)
{
    free(rd->whole_name);
    tr_free(rd->whole);
    free(rd->fd_name);
    if (rd->fd >= 0)
        close(rd->fd);
}

static int read_range(struct reader *rd, const char *blob, uint64_t offset, void *buf,
                      size_t size, tr_err *err)
{
    const struct tr_ckpt_src *src = rd->src;
    if (src->dir) {
        if (!rd->fd_name || strcmp(rd->fd_name, blob) != 0) {
            if (rd->fd >= 0)
                close(rd->fd);
            free(rd->fd_name);
            rd->fd_name = tr_xstrdup(blob);
            char *path = tr_xasprintf("%s/%s", src->dir, blob);
            rd->fd = tr_ckpt_open_input(path);
            if (rd->fd < 0) {
                int e = errno;
                tr_fail(err, "cannot read %s: %s", path, tr_input_strerror(e));
                free(path);
                return TR_ERROR;
            }
            free(path);
        }
        for (size_t got = 0; got < size;) {
            ssize_t k = pread(rd->fd, (char *)buf + got, size - got, (off_t)(offset + got));
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                return tr_fail(err, "cannot read %s/%s at byte %llu: %s", src->dir, blob,
                               (unsigned long long)(offset + got),
                               k < 0 ? strerror(errno) : "the file is shorter (truncated)");
            got += (size_t)k;
        }
        return TR_OK;
    }
    if (TR_HAS_SLOT(src->vt, struct tr_checkpoint_vtable, get_range))
        return src->vt->get_range(src->self, src->name, blob, offset, buf, size, err);
    if (!rd->whole_name || strcmp(rd->whole_name, blob) != 0) {
        free(rd->whole_name);
        tr_free(rd->whole);
        rd->whole = NULL;
        rd->whole_name = NULL;
        void *data = NULL;
        if (src->vt->get(src->self, src->name, blob, &data, &rd->whole_size, err) != TR_OK)
            return TR_ERROR;
        rd->whole = data;
        rd->whole_name = tr_xstrdup(blob);
    }
    if (offset > rd->whole_size || size > rd->whole_size - offset)
        return tr_fail(err, "checkpoint %s: %s is shorter than its layout says (truncated)",
                       src->name, blob);
    memcpy(buf, rd->whole + offset, size);
    return TR_OK;
}

/* Whether dest wants any of the flat range [fb, fe), and with host (its
 * values) placed there. */
static int place(const struct tr_ckpt_dest *d, const struct tr_backend *be, size_t fb, size_t fe,
                 const float *host)
{
    if (!d->base)
        return 0;
    if (d->be)
        be = d->be;
    if (!d->parts) {
        if (host)
            tr_be_upload(be, d->base + fb, host, (fe - fb) * sizeof(float));
        return 1;
    }
    const struct tr_shard *sh = d->parts;
    int any = 0;
    for (size_t u = fb / sh->unit; u < sh->n_units && u * sh->unit < fe; u++) {
        struct tr_shard_run p = tr_shard_part(sh, u, sh->rank);
        size_t b = fb > p.begin ? fb : p.begin, e = fe < p.end ? fe : p.end;
        if (b >= e)
            continue;
        any = 1;
        if (!host)
            continue;
        float *to = d->packed ? d->base + u * (sh->unit / (size_t)sh->world) + (b - p.begin)
                              : d->base + b;
        tr_be_upload(be, to, host + (b - fb), (e - b) * sizeof(float));
    }
    return any;
}

static const char *where(const struct tr_ckpt_src *src, char *buf, size_t size)
{
    if (src->dir)
        snprintf(buf, size, "%s", src->dir);
    else
        snprintf(buf, size, "%s", src->name);
    return buf;
}

int tr_ckpt_load_layout(const struct tr_ckpt_src *src, const struct tr_ckpt_layout *l,
                        const struct tr_graph *g, const struct tr_backend *be,
                        const struct tr_optimizer_desc *od, const struct tr_ckpt_dest *dest,
                        tr_err *err)
{
    return tr_ckpt_load_layout_some(src, l, g, be, od, dest, NULL, NULL, err);
}

int tr_ckpt_load_layout_some(const struct tr_ckpt_src *src, const struct tr_ckpt_layout *l,
                             const struct tr_graph *g, const struct tr_backend *be,
                             const struct tr_optimizer_desc *od, const struct tr_ckpt_dest *dest,
                             int (*keep)(void *ctx, const struct tr_tensor *t), void *keep_ctx,
                             tr_err *err)
{
    char at[512];
    where(src, at, sizeof at);
    int wants_slots = 0;
    for (int k = 0; od && k < od->state_slots; k++)
        wants_slots |= dest[1 + k].base != NULL;
    if (wants_slots) {
        int same = l->n_slots == 1 + od->state_slots;
        for (int k = 0; same && k < od->state_slots; k++)
            same = strcmp(l->slots[1 + k], od->state_names[k]) == 0;
        if (!same)
            return tr_fail(err, "checkpoint %s holds another optimizer's state (%d slots); "
                           "resume with the optimizer its run used", at, l->n_slots - 1);
    }
    /* every parameter and buffer of g there with its shape, and nothing else */
    size_t matched = 0, want = 0;
    for (int i = 0; i < g->n_tensors; i++)
        want += g->tensors[i].role == TR_ROLE_PARAM || g->tensors[i].role == TR_ROLE_BUFFER;
    struct reader rd = {src, NULL, NULL, 0, NULL, -1};
    float *host = NULL;
    size_t host_cap = 0;
    int rc = TR_OK;
    for (size_t i = 0; i < l->n_tensors && rc == TR_OK; i++) {
        const struct tr_ckpt_tensor *lt = &l->tensors[i];
        int k = tr_graph_find(g, lt->name);
        const struct tr_tensor *t = k >= 0 ? &g->tensors[k] : NULL;
        enum tr_role role = lt->buffer ? TR_ROLE_BUFFER : TR_ROLE_PARAM;
        if (!t || t->role != role) {
            rc = tr_fail(err, "checkpoint %s holds tensor '%s', which the model has not (a "
                         "checkpoint of another model?); use the recipe and overrides its run "
                         "trained with", at, lt->name);
            break;
        }
        if (t->ndim != lt->ndim || memcmp(t->shape, lt->shape, sizeof(int64_t) * (size_t)t->ndim)) {
            rc = tr_fail(err, "checkpoint %s: tensor '%s' has another shape there than in the "
                         "model; use the recipe and overrides its run trained with", at, lt->name);
            break;
        }
        matched++;
        if (keep && !lt->buffer && !keep(keep_ctx, t))
            continue;
        for (size_t j = 0; j < lt->n && rc == TR_OK; j++) {
            const struct tr_ckpt_entry *e = &l->entries[lt->first + j];
            if (od ? (int)e->slot > od->state_slots : e->slot > 0)
                continue;
            size_t count = (size_t)(e->end - e->begin);
            size_t fb = t->offset + (size_t)e->begin, fe = fb + count;
            const struct tr_ckpt_dest *d = &dest[e->slot];
            struct tr_ckpt_dest whole = {lt->buffer && d->base ? g->buffers : NULL, NULL, 0, NULL};
            if (lt->buffer)
                d = &whole;
            if (!place(d, be, fb, fe, NULL))
                continue;
            if (count > host_cap) {
                free(host);
                host_cap = count;
                host = malloc(host_cap * sizeof *host);
                if (!host) {
                    rc = tr_fail(err, "out of memory reading checkpoint %s", at);
                    break;
                }
            }
            const char *blob = l->blobs[e->blob].name;
            if (read_range(&rd, blob, e->offset, host, count * sizeof *host, err) != TR_OK) {
                rc = TR_ERROR;
                break;
            }
            if ((uint32_t)tr_ckpt_crc(host, count * sizeof *host) != e->crc) {
                rc = tr_fail(err, "checkpoint %s: %s fails its checksum at bytes %llu..%llu "
                             "(tensor '%s'; torn, truncated or corrupted)", at, blob,
                             (unsigned long long)e->offset,
                             (unsigned long long)(e->offset + count * sizeof *host), lt->name);
                break;
            }
            place(d, be, fb, fe, host);
        }
    }
    if (rc == TR_OK && matched != want)
        rc = tr_fail(err, "checkpoint %s lacks %zu of the model's tensors (a checkpoint of "
                     "another model?); use the recipe and overrides its run trained with", at,
                     want - matched);
    free(host);
    reader_close(&rd);
    return rc;
}

int tr_ckpt_read_shared_state(const struct tr_ckpt_src *src, struct tr_run_state *state,
                              struct tr_ckpt_layout **layout, tr_err *err)
{
    *layout = NULL;
    void *text = NULL, *ltext = NULL;
    size_t size = 0, lsize = 0;
    struct tr_json *js = NULL;
    int rc = src->vt->get(src->self, src->name, "state.json", &text, &size, err);
    if (rc == TR_OK)
        rc = tr_ckpt_parse_state(text, size, src->name, state, NULL, &js, err);
    const struct tr_json *sums = js ? tr_json_get(js, "checksums") : NULL;
    if (rc == TR_OK && sums && tr_json_get(sums, TR_CKPT_LAYOUT_BLOB)) {
        char what[256];
        snprintf(what, sizeof what, "checkpoint %s: " TR_CKPT_LAYOUT_BLOB, src->name);
        rc = src->vt->get(src->self, src->name, TR_CKPT_LAYOUT_BLOB, &ltext, &lsize, err);
        if (rc == TR_OK)
            rc = tr_ckpt_check_blob(js, TR_CKPT_LAYOUT_BLOB, ltext, lsize, err);
        if (rc == TR_OK)
            rc = tr_ckpt_layout_parse(ltext, lsize, what, layout, err);
    }
    tr_free(text);
    tr_free(ltext);
    tr_json_free(js);
    return rc;
}

int tr_ckpt_resume_shared(const struct tr_ckpt_rank *r, const char *name, float *params,
                          float *const *slots, int params_parts, struct tr_run_state *state,
                          tr_err *err)
{
    struct tr_ckpt_src src = {r->vt, r->self, name, NULL};
    struct tr_ckpt_layout *l = NULL;
    int rc = tr_ckpt_read_shared_state(&src, state, &l, err);
    if (rc == TR_OK && !l)
        rc = tr_fail(err, "checkpoint %s is not sharded", name);
    if (rc == TR_OK) {
        struct tr_ckpt_dest dest[TR_CKPT_MAX_SLOTS] = {
            {params, params_parts ? r->shard : NULL, 0, NULL}};
        for (int k = 0; k < r->od->state_slots; k++)
            dest[1 + k] = (struct tr_ckpt_dest){slots[k],
                                                 tr_shard_sharded(r->shard) ? r->shard : NULL, 1,
                                                 r->state_be};
        rc = tr_ckpt_load_layout_some(&src, l, r->g, r->be, r->od, dest, r->keep, r->keep_ctx,
                                      err);
    }
    tr_ckpt_layout_free(l);
    /* Every rank reads only its own ranges, so damage in one of them is
     * seen by the ranks that read it alone: the ranks agree (all of them
     * take the same verdict from the same collectives) and every rank
     * gets the first failing rank's reason, naming the blob. */
    tr_err mine = *err;
    float failed = rc == TR_OK ? 0.0f : 1.0f;
    if (tr_comm_allreduce_host(r->comm, &failed, 1, err) != TR_OK)
        return TR_ERROR;
    if (failed == 0)
        return TR_OK;
    int world = r->shard->world, first = -1;
    float *who = tr_xcalloc((size_t)world, sizeof *who);
    who[r->shard->rank] = rc == TR_OK ? 0.0f : 1.0f;
    int comm_rc = tr_comm_allreduce_host(r->comm, who, (size_t)world, err);
    for (int q = 0; comm_rc == TR_OK && q < world && first < 0; q++)
        if (who[q] > 0)
            first = q;
    free(who);
    if (comm_rc != TR_OK || first < 0)
        return comm_rc != TR_OK ? TR_ERROR
                                : tr_fail(err, "the ranks disagree about checkpoint %s", name);
    char why[480] = "";
    if (r->shard->rank == first)
        copy_msg(why, sizeof why, mine.msg);
    if (tr_comm_broadcast_host(r->comm, why, sizeof why, first, err) != TR_OK)
        return TR_ERROR;
    why[sizeof why - 1] = 0;
    if (failed > 1)
        tr_fail(err, "%.0f ranks could not read it; rank %d: %s", failed, first, why);
    else
        tr_fail(err, "rank %d could not read it: %s", first, why);
    return 1;
}

void tr_ckpt_skip(struct tr_checkpointer *c, const char *name, const tr_err *why)
{
    if (!c->skip[0]) {
        snprintf(c->newest, sizeof c->newest, "%s", name);
        c->newest_why = *why;
    }
    snprintf(c->skip, sizeof c->skip, "%s", name);
    tr_log(TR_LOG_WARN, "checkpoint", "skipping %s: %s; resuming from an older checkpoint "
           "(this run writes %s anew when it gets there: copy it elsewhere now to inspect it)",
           name, why->msg, name);
}

int tr_ckpt_layout_check_all(const struct tr_ckpt_src *src, const struct tr_ckpt_layout *l,
                             tr_err *err)
{
    char at[512];
    where(src, at, sizeof at);
    struct reader rd = {src, NULL, NULL, 0, NULL, -1};
    float *host = NULL;
    size_t cap = 0;
    int rc = TR_OK;
    for (size_t i = 0; i < l->n_entries && rc == TR_OK; i++) {
        const struct tr_ckpt_entry *e = &l->entries[i];
        size_t count = (size_t)(e->end - e->begin);
        if (count > cap) {
            free(host);
            host = malloc((cap = count) * sizeof *host);
            if (!host) {
                rc = tr_fail(err, "out of memory reading checkpoint %s", at);
                break;
            }
        }
        const char *blob = l->blobs[e->blob].name;
        rc = read_range(&rd, blob, e->offset, host, count * sizeof *host, err);
        if (rc == TR_OK && (uint32_t)tr_ckpt_crc(host, count * sizeof *host) != e->crc)
            rc = tr_fail(err, "%s fails its checksum at bytes %llu..%llu (torn, truncated or "
                         "corrupted)", blob, (unsigned long long)e->offset,
                         (unsigned long long)(e->offset + count * sizeof *host));
    }
    free(host);
    reader_close(&rd);
    return rc;
}

struct tr_ckpt_reader {
    struct tr_ckpt_src src; /* a copy: the reader outlives its caller's */
    const struct tr_ckpt_layout *l;
    struct reader rd;
};

struct tr_ckpt_reader *tr_ckpt_reader_open(const struct tr_ckpt_src *src,
                                           const struct tr_ckpt_layout *l)
{
    struct tr_ckpt_reader *r = tr_xcalloc(1, sizeof *r);
    r->src = *src;
    r->l = l;
    r->rd = (struct reader){&r->src, NULL, NULL, 0, NULL, -1};
    return r;
}

void tr_ckpt_reader_close(struct tr_ckpt_reader *r)
{
    if (!r)
        return;
    reader_close(&r->rd);
    free(r);
}

int tr_ckpt_read_tensor(struct tr_ckpt_reader *r, size_t i, float *out, tr_err *err)
{
    const struct tr_ckpt_layout *l = r->l;
    const struct tr_ckpt_tensor *t = &l->tensors[i];
    char at[512];
    where(&r->src, at, sizeof at);
    /* the layout covers slot model of every tensor exactly once, so out is
     * whole once its entries are read */
    for (size_t j = 0; j < t->n; j++) {
        const struct tr_ckpt_entry *en = &l->entries[t->first + j];
        if (en->slot != 0)
            continue;
        size_t bytes = (size_t)(en->end - en->begin) * sizeof(float);
        float *to = out + en->begin;
        const char *blob = l->blobs[en->blob].name;
        if (read_range(&r->rd, blob, en->offset, to, bytes, err) != TR_OK)
            return TR_ERROR;
        if ((uint32_t)tr_ckpt_crc(to, bytes) != en->crc)
            return tr_fail(err, "checkpoint %s: %s fails its checksum at bytes %llu..%llu "
                           "(tensor '%s'; torn, truncated or corrupted)", at, blob,
                           (unsigned long long)en->offset,
                           (unsigned long long)(en->offset + bytes), t->name);
    }
    return TR_OK;
}

void *tr_ckpt_layout_model(const struct tr_ckpt_src *src, const struct tr_ckpt_layout *l,
                           size_t *size, tr_err *err)
{
    struct tr_st_entry *e = tr_xcalloc(l->n_tensors + 1, sizeof *e);
    float **data = tr_xcalloc(l->n_tensors + 1, sizeof *data);
    struct tr_ckpt_reader *rd = tr_ckpt_reader_open(src, l);
    void *out = NULL;
    int rc = TR_OK;
    for (size_t i = 0; i < l->n_tensors && rc == TR_OK; i++) {
        const struct tr_ckpt_tensor *t = &l->tensors[i];
        data[i] = malloc(t->numel * sizeof(float) + 1);
        if (!data[i]) {
            rc = tr_fail(err, "out of memory reading tensor '%s'", t->name);
            break;
        }
        rc = tr_ckpt_read_tensor(rd, i, data[i], err);
        e[i] = (struct tr_st_entry){t->name, TR_F32, t->ndim, {0}, data[i],
                                    t->numel * sizeof(float)};
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
    }
    if (rc == TR_OK) {
        out = tr_safetensors_write(e, l->n_tensors,
                                   "{\"format\":\"pt\",\"producer\":\"trainrun\"}", size);
        if (!out)
            tr_fail(err, "out of memory assembling the weights");
    }
    for (size_t i = 0; i < l->n_tensors; i++)
        free(data[i]);
    free(data);
    free(e);
    tr_ckpt_reader_close(rd);
    return out;
}

int tr_ckpt_newest_sharded(struct tr_checkpointer *c, char *name, size_t size, tr_err *err)
{
    struct name_list l = {0};
    if (tr_ckpt_list(c, &l, err) != TR_OK)
        return TR_ERROR;
    int rc = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (c->skip[0] && strcmp(l.names[i], c->skip) >= 0)
            continue; /* the ranks could not read it, or a newer one (tr_ckpt_skip) */
        struct tr_ckpt_src src = {c->cfg.vt, c->cfg.self, l.names[i], NULL};
        struct tr_ckpt_layout *layout = NULL;
        struct tr_run_state st;
        tr_err why = {{0}};
        if (tr_ckpt_read_shared_state(&src, &st, &layout, &why) != TR_OK) {
            tr_log(TR_LOG_WARN, "checkpoint", "skipping %s: %s", l.names[i], why.msg);
            continue;
        }
        if (c->cfg.max_step && st.step > c->cfg.max_step) {
            tr_log(TR_LOG_WARN, "checkpoint", "skipping %s: its step %llu is past train.steps "
                   "= %llu", l.names[i], (unsigned long long)st.step,
                   (unsigned long long)c->cfg.max_step);
            tr_ckpt_layout_free(layout);
            continue;
        }
        if (layout) {
            snprintf(name, size, "%s", l.names[i]);
            rc = 1;
        }
        tr_ckpt_layout_free(layout);
        break;
    }
    tr_ckpt_free_names(&l);
    return rc;
}
