/* Checkpoints: the on-disk format and everything that reads or writes it
 * (serialisation, pruning, writing, loading, finding, verifying); export is
 * checkpoint_export.c's.  It stays one file over ~700 lines because it is
 * one format: the writer, the reader and the verifier must agree byte for
 * byte on its layout. */
#include "checkpoint.h"
#include "checkpoint_internal.h"

#include "backend.h"

#include "../../kernels/host.h"
#include "../util/json.h"
#include "optim.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* crc, the CRC-32 of some bytes, continued over data: zlib takes at most
 * 4 GiB a call, and a blob (the weights of a 1.5B model) can be larger. */
static unsigned long crc_more(unsigned long crc, const void *data, size_t size)
{
    const unsigned char *p = data;
    while (size > 0) {
        size_t n = size > (1u << 30) ? (1u << 30) : size;
        crc = crc32((uLong)crc, p, (uInt)n);
        p += n;
        size -= n;
    }
    return crc;
}

/* CRC-32 of all of data */
static unsigned long crc_of(const void *data, size_t size)
{
    return crc_more(crc32(0L, Z_NULL, 0), data, size);
}

/* The last member of state.json: the CRC-32 of the bytes before it. */
#define STATE_CHECKSUM_KEY "  \"state_checksum\":"

struct tr_checkpointer {
    struct tr_checkpointer_config cfg;
    /* The snapshot of an asynchronous save: the serialised blobs themselves,
     * taken by save() and freed by the writer as each is written, so nothing
     * is held between saves and no second copy is made.  A synchronous save
     * streams each blob to the plugin instead (or, for a plugin without
     * put_stream, builds, writes and frees one blob at a time). */
    void *blob[3];
    size_t blob_size[3];
    struct tr_run_state state;
    /* the background writer */
    pthread_t thread;
    int has_thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int pending; /* a snapshot waits to be written */
    int busy;    /* the writer is writing */
    int stop;
    int failed;
    tr_err error;
    double stall;
};

/* ---- serialisation ------------------------------------------------------- */

/* Floats converted to 16 bits at a time (the staging buffer: 4 MiB of
 * floats and their 2 MiB of halves) */
#define STAGING_FLOATS ((size_t)1 << 20)

/* The bytes of a blob of tensors, produced in order on demand: the blob
 * of every parameter tensor of the flat array `base` (backend memory,
 * fp32), stored as `dtype`, laid out as tr_safetensors_write lays it out:
 * the header, then each tensor downloaded straight into the caller's
 * buffer, or, stored in 16 bits, downloaded and converted through a
 * bounded staging buffer.  So neither the whole blob nor a whole tensor is
 * ever held besides what the caller asks for.  With `buffers` the blob
 * also holds every buffer tensor (batch norm's running statistics,
 * g->buffers), always in fp32: they are not trained and a resume must
 * continue them bit for bit. */
struct blob_source {
    const struct tr_backend *be;
    const float *base;
    const float *buffers;
    enum tr_dtype dtype;
    size_t n;                          /* tensors */
    const struct tr_tensor **tensors;
    size_t *bytes;                     /* each tensor's bytes in the blob */
    unsigned char *header;             /* the 8-byte length and the header */
    size_t header_size, size;          /* the header's bytes; the blob's */
    size_t pos;                        /* bytes given so far */
    size_t at, offset;                 /* the tensor being given, its bytes given */
    float *staging;                    /* 16-bit blobs: STAGING_FLOATS floats */
    uint16_t *halves;                  /* and as many halves */
    int checksum;                      /* keep crc: a streamed blob's (a whole blob's
                                        * is taken by the writer, off the step loop) */
    unsigned long crc;                 /* of the bytes given so far */
};

static void blob_source_close(struct blob_source *s)
{
    free(s->tensors);
    free(s->bytes);
    free(s->header);
    free(s->staging);
    free(s->halves);
    memset(s, 0, sizeof *s);
}

/* TR_ERROR when out of memory */
static int blob_source_open(struct blob_source *s, struct tr_checkpointer *c, const float *base,
                            enum tr_dtype dtype, const char *prefix, int buffers)
{
    const struct tr_graph *g = c->cfg.g;
    size_t esize = dtype == TR_F32 ? 4 : 2;
    memset(s, 0, sizeof *s);
    s->be = c->cfg.be;
    s->base = base;
    s->buffers = g->buffers;
    s->dtype = dtype;
    s->crc = crc32(0L, Z_NULL, 0);
    struct tr_st_entry *e = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *e);
    char **names = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *names);
    s->tensors = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *s->tensors);
    s->bytes = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *s->bytes);
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        int buffer = t->role == TR_ROLE_BUFFER;
        if (t->role != TR_ROLE_PARAM && !(buffers && buffer))
            continue;
        size_t n = s->n++;
        s->tensors[n] = t;
        s->bytes[n] = t->numel * (buffer ? 4 : esize);
        names[n] = tr_xasprintf("%s%s", prefix, t->name);
        e[n] = (struct tr_st_entry){names[n], buffer ? TR_F32 : dtype, t->ndim, {0}, NULL,
                                    s->bytes[n]};
        memcpy(e[n].shape, t->shape, sizeof t->shape);
    }
    s->header = tr_safetensors_header(e, s->n, "{\"format\":\"pt\",\"producer\":\"trainrun\"}",
                                      &s->header_size, &s->size);
    if (dtype != TR_F32) {
        s->staging = malloc(STAGING_FLOATS * sizeof *s->staging);
        s->halves = malloc(STAGING_FLOATS * sizeof *s->halves);
    }
    for (size_t i = 0; i < s->n; i++)
        free(names[i]);
    free(names);
    free(e);
    if (!s->header || (dtype != TR_F32 && (!s->staging || !s->halves))) {
        blob_source_close(s);
        return TR_ERROR;
    }
    return TR_OK;
}

/* Up to cap bytes of the tensors' data into out, from where the source
 * stands (inside the data, not at its end); how many. */
static size_t tensor_bytes(struct blob_source *s, unsigned char *out, size_t cap)
{
    while (s->offset == s->bytes[s->at]) { /* done, or empty */
        s->at++;
        s->offset = 0;
    }
    const struct tr_tensor *t = s->tensors[s->at];
    size_t n = s->bytes[s->at] - s->offset < cap ? s->bytes[s->at] - s->offset : cap;
    const struct tr_backend *be = s->be;
    if (t->role == TR_ROLE_BUFFER || s->dtype == TR_F32) {
        const float *from = t->role == TR_ROLE_BUFFER ? s->buffers : s->base;
        tr_be_download(be, out, (const char *)(from + t->offset) + s->offset, n);
    } else {
        /* whole elements through the staging buffer, then their bytes asked
         * for (an odd cap can split an element between two calls) */
        size_t first = s->offset / 2, skip = s->offset % 2;
        size_t count = (skip + n + 1) / 2;
        if (count > STAGING_FLOATS) {
            count = STAGING_FLOATS;
            n = 2 * count - skip;
        }
        tr_be_download(be, s->staging, s->base + t->offset + first,
                            count * sizeof(float));
        tr_cpu_to_half(s->halves, s->staging, count, s->dtype == TR_BF16);
        memcpy(out, (const unsigned char *)s->halves + skip, n);
    }
    s->offset += n;
    return n;
}

/* tr_blob_fill_fn over a blob_source */
static int blob_fill(void *ud, void *buf, size_t cap, size_t *got, tr_err *err)
{
    struct blob_source *s = ud;
    *got = 0;
    if (cap > 0 && s->pos == s->size)
        return tr_fail(err, "the checkpoint plugin asked for more than the blob's %zu bytes",
                       s->size);
    size_t want = s->size - s->pos < cap ? s->size - s->pos : cap;
    unsigned char *out = buf;
    for (size_t done = 0, n; done < want; done += n, s->pos += n) {
        if (s->pos < s->header_size) {
            n = s->header_size - s->pos < want - done ? s->header_size - s->pos : want - done;
            memcpy(out + done, s->header + s->pos, n);
        } else {
            n = tensor_bytes(s, out + done, want - done);
        }
    }
    if (s->checksum)
        s->crc = crc_more(s->crc, buf, want);
    *got = want;
    return TR_OK;
}

static void write_vars(FILE *f, const char *key, const struct tr_state_var *vars, size_t n)
{
    fprintf(f, "  \"%s\": {", key);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s", i ? ", " : "");
        tr_json_write_string(f, vars[i].name);
        fprintf(f, ": %.17g", vars[i].value);
    }
    fprintf(f, "},\n");
}

/* -1 stands for unknown; inf would not be JSON at all */
static double json_or_nan(double x) { return isfinite(x) ? x : -1.0; }

static char *state_json(struct tr_checkpointer *c, const char *const *blobs,
                        const unsigned long *checksums, int n_blobs, size_t *size)
{
    const struct tr_run_state *s = &c->state;
    char *text = NULL;
    FILE *f = open_memstream(&text, size);
    fprintf(f, "{\n  \"format\": 1,\n  \"step\": %llu,\n  \"applied_steps\": %lld,\n"
               "  \"loader_position\": %llu,\n  \"skipped_steps\": %llu,\n  \"seed\": %lld,\n",
            (unsigned long long)s->step, (long long)s->applied,
            (unsigned long long)s->loader_position, (unsigned long long)s->skipped,
            (long long)c->cfg.seed);
    fprintf(f, "  \"recipe\": ");
    tr_json_write_string(f, c->cfg.recipe ? c->cfg.recipe : "");
    fprintf(f, ",\n  \"overrides\": [");
    for (int i = 0; i < c->cfg.n_overrides; i++) {
        fprintf(f, "%s", i ? ", " : "");
        tr_json_write_string(f, c->cfg.overrides[i]);
    }
    fprintf(f, "],\n  \"loss\": %.9g,\n  \"val_loss\": %.9g,\n  \"cost_usd\": %.17g,\n",
            json_or_nan(s->loss), json_or_nan(s->val_loss), s->cost_usd);
    fprintf(f, "  \"best\": ");
    tr_json_write_string(f, s->best);
    fprintf(f, ",\n  \"best_val_loss\": %.17g,\n  \"best_step\": %llu,\n", json_or_nan(s->best_val_loss),
            (unsigned long long)s->best_step);
    fprintf(f, "  \"weights_dtype\": \"%s\",\n",
            c->cfg.weights_dtype == TR_BF16 ? "bf16" : c->cfg.weights_dtype == TR_F16 ? "fp16" : "fp32");
    if (c->cfg.hf_config) { /* what export --format hf writes as config.json */
        fprintf(f, "  \"hf_config\": ");
        tr_json_write_string(f, c->cfg.hf_config);
        fprintf(f, ",\n");
    }
    if (c->cfg.weights_from) {
        fprintf(f, "  \"weights_from\": ");
        tr_json_write_string(f, c->cfg.weights_from);
        fprintf(f, ",\n");
    }
    write_vars(f, "precision", s->precision, s->n_precision);
    write_vars(f, "schedule", s->schedule, s->n_schedule);
    fprintf(f, "  \"checksums\": {");
    for (int i = 0; i < n_blobs; i++)
        fprintf(f, "%s\"%s\": %lu", i ? ", " : "", blobs[i], checksums[i]);
    fprintf(f, "},\n");
    /* the file vouches for itself too: the CRC-32 of everything before it */
    fflush(f);
    unsigned long own = crc_of(text, *size);
    fprintf(f, STATE_CHECKSUM_KEY " %lu\n}\n", own);
    fclose(f);
    return text;
}

/* NULL when state.json's own checksum holds, else why not.  The checksum
 * member must be the last one, so nothing after it escapes the check. */
static const char *state_checksum_problem(const char *text, size_t size)
{
    const size_t klen = strlen(STATE_CHECKSUM_KEY);
    const char *at = NULL;
    for (size_t i = 0; i + klen <= size; i++)
        if (memcmp(text + i, STATE_CHECKSUM_KEY, klen) == 0)
            at = text + i;
    if (!at)
        return "state.json has no state_checksum (not written by this trainrun, or edited)";
    const char *p = at + klen, *end = text + size;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    unsigned long want = 0;
    int digits = 0;
    for (; p < end && *p >= '0' && *p <= '9' && digits < 11; p++, digits++)
        want = want * 10 + (unsigned long)(*p - '0');
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    int closed = p < end && *p == '}';
    for (p += closed; p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t');)
        p++;
    if (!digits || !closed || p != end)
        return "state.json's state_checksum is not its last member (edited)";
    if (crc_of(text, (size_t)(at - text)) != want)
        return "state.json fails its checksum (torn, truncated or edited)";
    return NULL;
}

/* ---- pruning: newest `keep`, plus the best ------------------------------ */

struct name_list {
    char **names;
    size_t n;
};

/* "step-" and ten digits: the only names this file writes.  The backend
 * may hold others (checkpoint.dir shared with other files); those are
 * neither loaded nor pruned. */
static int is_step_name(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || strlen(name) != 15)
        return 0;
    for (const char *p = name + 5; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

static void collect(void *ud, const char *name)
{
    struct name_list *l = ud;
    if (!is_step_name(name))
        return;
    l->names = tr_xrealloc(l->names, (l->n + 1) * sizeof *l->names);
    l->names[l->n++] = tr_xstrdup(name);
}

static void free_names(struct name_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

static void prune(struct tr_checkpointer *c)
{
    struct name_list l = {0};
    tr_err err = {{0}};
    if (c->cfg.vt->list(c->cfg.self, collect, &l, &err) != TR_OK) {
        tr_log(TR_LOG_WARN, "checkpoint", "cannot list checkpoints to prune: %s", err.msg);
        return;
    }
    /* Newer names than the one just written are not this run's line of
     * checkpoints (ones a resume skipped as damaged, or not trainrun's):
     * they neither count towards keep nor go.  Of the rest, newest first,
     * the first `keep` stay. */
    char written[64];
    snprintf(written, sizeof written, "step-%010llu", (unsigned long long)c->state.step);
    size_t kept = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (strcmp(l.names[i], written) > 0 || kept++ < (size_t)c->cfg.keep ||
            strcmp(l.names[i], c->state.best) == 0)
            continue;
        if (c->cfg.vt->remove(c->cfg.self, l.names[i], &err) != TR_OK)
            tr_log(TR_LOG_WARN, "checkpoint", "cannot remove %s: %s", l.names[i], err.msg);
    }
    free_names(&l);
}

/* ---- writing -------------------------------------------------------------- */

static const char *const blob_names[3] = {"model.safetensors", "optimizer.safetensors",
                                          "optimizer2.safetensors"};
_Static_assert(sizeof blob_names / sizeof blob_names[0] == 1 + TR_OPTIMIZER_MAX_SLOTS,
               "a blob name for the weights and for each optimizer state slot");

/* the weights, then one blob per optimizer state slot */
static int blob_count(const struct tr_checkpointer *c) { return 1 + c->cfg.optimizer->state_slots; }

/* The source of blob i of a checkpoint: the weights (in weights_dtype),
 * then the state slots.  TR_ERROR when out of memory. */
static int open_blob(struct tr_checkpointer *c, int i, const float *params, float *const *slots,
                     struct blob_source *s)
{
    if (i == 0)
        return blob_source_open(s, c, params, c->cfg.weights_dtype, "", 1);
    return blob_source_open(s, c, slots[i - 1], TR_F32, c->cfg.optimizer->state_names[i - 1], 0);
}

/* Blob i whole in one malloc'd buffer (NULL when out of memory): the
 * asynchronous save's snapshot, and what a plugin without put_stream gets. */
static void *build_blob(struct tr_checkpointer *c, int i, const float *params,
                        float *const *slots, size_t *size)
{
    struct blob_source s;
    void *blob = NULL;
    size_t got = 0;
    if (open_blob(c, i, params, slots, &s) == TR_OK && (blob = malloc(s.size)) != NULL)
        blob_fill(&s, blob, s.size, &got, NULL);
    *size = got;
    blob_source_close(&s);
    return blob;
}

/* Blob i streamed to the plugin's put_stream, its CRC-32 in *checksum. */
static int stream_blob(struct tr_checkpointer *c, int i, const float *params, float *const *slots,
                       const char *name, unsigned long *checksum, tr_err *err)
{
    struct blob_source s;
    if (open_blob(c, i, params, slots, &s) != TR_OK)
        return tr_fail(err, "out of memory serialising checkpoint %s", name);
    s.checksum = 1;
    int rc = c->cfg.vt->put_stream(c->cfg.self, blob_names[i], s.size, blob_fill, &s, err);
    if (rc == TR_OK && s.pos != s.size)
        rc = tr_fail(err, "the checkpoint plugin stored %s after %zu of its %zu bytes",
                     blob_names[i], s.pos, s.size);
    *checksum = s.crc;
    blob_source_close(&s);
    return rc;
}

static void free_blobs(struct tr_checkpointer *c)
{
    for (int i = 0; i < 3; i++) {
        free(c->blob[i]);
        c->blob[i] = NULL;
    }
}

/* Writes checkpoint "step-<c->state.step>": the blobs the snapshot holds
 * (asynchronous save), or, where it holds none, blobs made from params and
 * the state slots (synchronous save): streamed to put_stream a piece at a
 * time where the plugin has it, else built whole one at a time for put().
 * Each blob is freed once put() has it, so memory falls as the write goes
 * on. */
static int write_checkpoint(struct tr_checkpointer *c, const float *params, float *const *slots,
                            tr_err *err)
{
    char name[64];
    snprintf(name, sizeof name, "step-%010llu", (unsigned long long)c->state.step);
    int n = blob_count(c);
    unsigned long checksums[3] = {0};
    char *state = NULL;
    size_t state_size = 0;
    const struct tr_checkpoint_vtable *vt = c->cfg.vt;
    if (vt->begin(c->cfg.self, name, err) != TR_OK)
        goto failed;
    int stream = TR_HAS_SLOT(vt, struct tr_checkpoint_vtable, put_stream);
    for (int i = 0; i < n; i++) {
        size_t size = c->blob_size[i];
        void *data = c->blob[i];
        c->blob[i] = NULL;
        if (!data && stream) {
            if (stream_blob(c, i, params, slots, name, &checksums[i], err) != TR_OK)
                goto failed;
            continue;
        }
        if (!data)
            data = build_blob(c, i, params, slots, &size);
        if (!data) {
            tr_fail(err, "out of memory serialising checkpoint %s", name);
            goto failed;
        }
        checksums[i] = crc_of(data, size);
        int rc = vt->put(c->cfg.self, blob_names[i], data, size, err);
        free(data);
        if (rc != TR_OK)
            goto failed;
    }
    /* state last: its checksums vouch for the blobs written before it */
    state = state_json(c, blob_names, checksums, n, &state_size);
    if (vt->put(c->cfg.self, "state.json", state, state_size, err) != TR_OK ||
        vt->commit(c->cfg.self, err) != TR_OK)
        goto failed;
    free(state);
    prune(c);
    return TR_OK;
failed:
    vt->abort(c->cfg.self);
    free(state);
    free_blobs(c);
    tr_err_prefix(err, "checkpoint %s not saved (the previous one is still the latest)", name);
    return TR_ERROR;
}

static void *writer(void *arg)
{
    struct tr_checkpointer *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->pending && !c->stop)
            pthread_cond_wait(&c->changed, &c->lock);
        if (!c->pending && c->stop)
            break;
        c->pending = 0;
        c->busy = 1;
        pthread_mutex_unlock(&c->lock);
        tr_err err = {{0}};
        int rc = write_checkpoint(c, NULL, NULL, &err);
        pthread_mutex_lock(&c->lock);
        c->busy = 0;
        if (rc != TR_OK && !c->failed) {
            c->failed = 1;
            c->error = err;
        }
        pthread_cond_broadcast(&c->changed);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

struct tr_checkpointer *tr_checkpointer_open(const struct tr_checkpointer_config *cfg, tr_err *err)
{
    struct tr_checkpointer *c = tr_xcalloc(1, sizeof *c);
    c->cfg = *cfg;
    c->cfg.recipe = tr_xstrdup(cfg->recipe ? cfg->recipe : ""); /* the caller's may be a stack buffer */
    c->cfg.hf_config = cfg->hf_config ? tr_xstrdup(cfg->hf_config) : NULL;
    c->cfg.weights_from = cfg->weights_from ? tr_xstrdup(cfg->weights_from) : NULL;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    if (cfg->async) {
        if (pthread_create(&c->thread, NULL, writer, c) != 0) {
            tr_fail(err, "cannot start the checkpoint writer thread");
            tr_checkpointer_close(c);
            return NULL;
        }
        c->has_thread = 1;
    }
    return c;
}

static int wait_locked(struct tr_checkpointer *c, tr_err *err)
{
    while (c->pending || c->busy)
        pthread_cond_wait(&c->changed, &c->lock);
    if (c->failed) {
        c->failed = 0;
        if (err)
            *err = c->error;
        return TR_ERROR;
    }
    return TR_OK;
}

int tr_checkpointer_wait(struct tr_checkpointer *c, tr_err *err)
{
    double t0 = tr_now();
    pthread_mutex_lock(&c->lock);
    int rc = wait_locked(c, err);
    pthread_mutex_unlock(&c->lock);
    c->stall += tr_now() - t0;
    return rc;
}

static int save(struct tr_checkpointer *c, const float *params, float *const *slots,
                const struct tr_run_state *state, int in_background, tr_err *err);

int tr_checkpointer_save(struct tr_checkpointer *c, const float *params, float *const *slots,
                         const struct tr_run_state *state, tr_err *err)
{
    return save(c, params, slots, state, c->has_thread, err);
}

int tr_checkpointer_save_now(struct tr_checkpointer *c, const float *params, float *const *slots,
                             const struct tr_run_state *state, tr_err *err)
{
    return save(c, params, slots, state, 0, err);
}

static int save(struct tr_checkpointer *c, const float *params, float *const *slots,
                const struct tr_run_state *state, int in_background, tr_err *err)
{
    double t0 = tr_now();
    /* one write at a time: the previous one must be done */
    tr_err previous_err = {{0}};
    pthread_mutex_lock(&c->lock);
    int previous = wait_locked(c, &previous_err);
    pthread_mutex_unlock(&c->lock);
    c->state = *state;
    int rc = TR_OK;
    if (in_background) {
        /* the snapshot: training goes on changing params and the slots */
        for (int i = 0; i < blob_count(c) && rc == TR_OK; i++) {
            c->blob[i] = build_blob(c, i, params, slots, &c->blob_size[i]);
            if (!c->blob[i]) {
                free_blobs(c);
                rc = tr_fail(err, "out of memory for the checkpoint snapshot of step %llu "
                                  "(%zu parameters); checkpoint.async = false needs less",
                             (unsigned long long)state->step, c->cfg.g->n_params);
            }
        }
        if (rc == TR_OK) {
            pthread_mutex_lock(&c->lock);
            c->pending = 1;
            pthread_cond_broadcast(&c->changed);
            pthread_mutex_unlock(&c->lock);
        }
    } else {
        rc = write_checkpoint(c, params, slots, err);
    }
    c->stall += tr_now() - t0;
    if (previous != TR_OK && rc == TR_OK) {
        *err = previous_err; /* the earlier background write failed */
        return TR_ERROR;
    }
    if (previous != TR_OK) /* both failed: say the earlier one here, err says this one */
        tr_log(TR_LOG_ERROR, NULL, "%s", previous_err.msg);
    return rc;
}

double tr_checkpointer_stall(const struct tr_checkpointer *c) { return c->stall; }

void tr_checkpointer_close(struct tr_checkpointer *c)
{
    if (!c)
        return;
    if (c->has_thread) {
        pthread_mutex_lock(&c->lock);
        c->stop = 1;
        pthread_cond_broadcast(&c->changed);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->thread, NULL);
    }
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->changed);
    free_blobs(c);
    free((char *)c->cfg.recipe);
    free((char *)c->cfg.hf_config);
    free((char *)c->cfg.weights_from);
    free(c);
}

/* ---- loading -------------------------------------------------------------- */

/* "[256, 64]" */
static void format_shape(const int64_t *shape, int ndim, char *buf, size_t size)
{
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < size)
        snprintf(buf + len, size - len, "]");
}

/* g's parameters from blob into dst (backend memory, g's layout), and with
 * `buffers` g's buffers into g->buffers (a buffer in any float dtype).
 * expect: the dtype every parameter must have, or -1 for any float type. */
static int load_tensors(const struct tr_graph *g, const struct tr_backend *be, const void *blob,
                        size_t size, const char *prefix, float *dst, int buffers, int expect,
                        const char *what, tr_err *err)
{
    struct tr_st_file *f = tr_safetensors_read(blob, size, what, err);
    if (!f)
        return TR_ERROR;
    int rc = TR_OK;
    float *tmp = NULL;
    for (int i = 0; i < g->n_tensors && rc == TR_OK; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        int buffer = t->role == TR_ROLE_BUFFER;
        if (t->role != TR_ROLE_PARAM && !(buffers && buffer))
            continue;
        float *to = buffer ? g->buffers + t->offset : dst + t->offset;
        char *key = tr_xasprintf("%s%s", prefix, t->name);
        const struct tr_st_entry *e = tr_safetensors_find(f, key);
        int ok_shape = e && e->ndim == t->ndim && !memcmp(e->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        if (!e) {
            rc = tr_fail(err, "%s has no tensor '%s' (a checkpoint of another model?)", what, key);
        } else if (!ok_shape) {
            char have[160], want[160];
            format_shape(e->shape, e->ndim, have, sizeof have);
            format_shape(t->shape, t->ndim, want, sizeof want);
            rc = tr_fail(err, "%s: tensor '%s' is %s there but %s in the model", what, key, have,
                         want);
        } else if (!buffer && expect >= 0 && e->dtype != (enum tr_dtype)expect) {
            rc = tr_fail(err, "%s: tensor '%s' is not in the weights_dtype state.json names "
                         "(the weights and state.json do not belong together)", what, key);
        } else if (e->dtype == TR_F32) {
            tr_be_upload(be, to, e->data, e->bytes);
        } else if (e->dtype == TR_BF16 || e->dtype == TR_F16) {
            tmp = tr_xrealloc(tmp, t->numel * sizeof(float));
            tr_cpu_from_half(tmp, e->data, t->numel, e->dtype == TR_BF16);
            tr_be_upload(be, to, tmp, t->numel * sizeof(float));
        } else {
            rc = tr_fail(err, "%s: tensor '%s' is not a floating-point tensor", what, key);
        }
        free(key);
    }
    free(tmp);
    tr_safetensors_free(f);
    return rc;
}

/* vars: an object of finite numbers (at most 32) */
static int read_vars(const struct tr_json *obj, struct tr_state_var *vars, size_t *n)
{
    *n = 0;
    if (obj && obj->type != TR_JSON_OBJECT)
        return TR_ERROR;
    for (size_t i = 0; obj && i < obj->n; i++) {
        if (*n == 32 || obj->items[i]->type != TR_JSON_NUMBER || !isfinite(obj->items[i]->number))
            return TR_ERROR;
        snprintf(vars[*n].name, sizeof vars[*n].name, "%s", obj->keys[i]);
        vars[(*n)++].value = obj->items[i]->number;
    }
    return TR_OK;
}

static double nan_if_negative(double x) { return x < 0 ? NAN : x; }

/* Member key as a whole number in [0, 2^53]; 0 when absent or anything else. */
static int get_count(const struct tr_json *js, const char *key, uint64_t *out)
{
    const struct tr_json *v = tr_json_get(js, key);
    if (!v || v->type != TR_JSON_NUMBER || !(v->number >= 0) || v->number > 9007199254740992.0 ||
        v->number != floor(v->number))
        return 0;
    *out = (uint64_t)v->number;
    return 1;
}

/* A number member that is finite (loss and the like; -1 means unknown). */
static int get_finite(const struct tr_json *js, const char *key, double *out)
{
    const struct tr_json *v = tr_json_get(js, key);
    if (!v || v->type != TR_JSON_NUMBER || !isfinite(v->number))
        return 0;
    *out = v->number;
    return 1;
}

/* state.json of checkpoint `name`: its own checksum, then every field a
 * run resumes from, in range and consistent with the name.  On success
 * *out owns the parsed document; the weights are checked by the caller. */
static int parse_state(const void *text, size_t size, const char *name, struct tr_run_state *state,
                       int *weights_dtype, struct tr_json **out, tr_err *err)
{
    *out = NULL;
    const char *why = state_checksum_problem(text, size);
    if (why)
        return tr_fail(err, "%s", why);
    size_t bad = 0;
    struct tr_json *js = tr_json_parse(text, size, &bad);
    if (!js || js->type != TR_JSON_OBJECT) {
        tr_json_free(js);
        return tr_fail(err, "state.json is not valid JSON (byte %zu): torn or corrupted", bad);
    }
    memset(state, 0, sizeof *state);
    uint64_t applied = 0, format = 0;
    const char *field = NULL;
    double loss, val_loss, best_val;
    if (!get_count(js, "format", &format) || format != 1)
        field = "format";
    else if (!get_count(js, "step", &state->step))
        field = "step";
    char expected[64];
    snprintf(expected, sizeof expected, "step-%010llu", (unsigned long long)state->step);
    if (!field && is_step_name(name) && strcmp(name, expected) != 0) {
        tr_json_free(js);
        return tr_fail(err, "state.json says step %llu, but the checkpoint is %s (a state.json "
                       "copied from another checkpoint, or edited)",
                       (unsigned long long)state->step, name);
    }
    if (field)
        ; /* reported below */
    else if (!get_count(js, "applied_steps", &applied) || applied > state->step)
        field = "applied_steps";
    else if (!get_count(js, "loader_position", &state->loader_position) ||
             state->loader_position < state->step)
        field = "loader_position"; /* every step consumes at least one micro-batch */
    else if (!get_count(js, "skipped_steps", &state->skipped) || state->skipped > state->step)
        field = "skipped_steps";
    else if (!get_finite(js, "cost_usd", &state->cost_usd) || state->cost_usd < 0)
        field = "cost_usd";
    else if (!get_finite(js, "loss", &loss) || !get_finite(js, "val_loss", &val_loss))
        field = "loss";
    else if (!get_finite(js, "best_val_loss", &best_val) ||
             !get_count(js, "best_step", &state->best_step) || state->best_step > state->step)
        field = "best_step";
    else if (read_vars(tr_json_get(js, "precision"), state->precision, &state->n_precision) ||
             read_vars(tr_json_get(js, "schedule"), state->schedule, &state->n_schedule))
        field = "precision or schedule";
    if (field) {
        tr_json_free(js);
        return tr_fail(err, "state.json: \"%s\" is missing or out of range (edited or written "
                       "by another program)", field);
    }
    const char *best = tr_json_string(js, "best");
    if (!best || (best[0] && !is_step_name(best))) {
        tr_json_free(js);
        return tr_fail(err, "state.json: \"best\" names no checkpoint of this run");
    }
    snprintf(state->best, sizeof state->best, "%s", best);
    state->applied = (int64_t)applied;
    state->loss = nan_if_negative(loss);
    state->val_loss = nan_if_negative(val_loss);
    state->best_val_loss = nan_if_negative(best_val);
    const char *wd = tr_json_string(js, "weights_dtype");
    *weights_dtype = !wd ? -1
                     : strcmp(wd, "fp32") == 0 ? TR_F32
                     : strcmp(wd, "bf16") == 0 ? TR_BF16
                     : strcmp(wd, "fp16") == 0 ? TR_F16 : -2;
    if (*weights_dtype < 0) {
        tr_json_free(js);
        return tr_fail(err, "state.json: \"weights_dtype\" is not fp32, bf16 or fp16");
    }
    *out = js;
    return TR_OK;
}

/* The CRC-32 state.json records for blob, or a message when it differs. */
static int check_blob(const struct tr_json *js, const char *blob, const void *data, size_t size,
                      tr_err *err)
{
    const struct tr_json *v = tr_json_get(tr_json_get(js, "checksums"), blob);
    unsigned long got = crc_of(data, size);
    if (!v || v->type != TR_JSON_NUMBER || v->number < 0 || (unsigned long)v->number != got)
        return tr_fail(err, "%s fails its checksum (torn, truncated or corrupted)", blob);
    return TR_OK;
}

int tr_checkpointer_load(struct tr_checkpointer *c, const char *name, float *params,
                         float *const *slots, struct tr_run_state *state, tr_err *err)
{
    const char *blobs[] = {"state.json", "model.safetensors", "optimizer.safetensors",
                           "optimizer2.safetensors"};
    void *data[4] = {NULL};
    size_t size[4] = {0};
    struct tr_json *js = NULL;
    int rc = TR_ERROR;
    const struct tr_optimizer_desc *od = c->cfg.optimizer;
    int n = 2 + od->state_slots;
    for (int i = 0; i < n; i++)
        if (c->cfg.vt->get(c->cfg.self, name, blobs[i], &data[i], &size[i], err) != TR_OK)
            goto done;
    /* everything is verified before anything is uploaded or returned */
    struct tr_run_state st;
    int weights_dtype;
    if (parse_state(data[0], size[0], name, &st, &weights_dtype, &js, err) != TR_OK)
        goto done;
    for (int i = 1; i < n; i++)
        if (check_blob(js, blobs[i], data[i], size[i], err) != TR_OK)
            goto done;
    const struct tr_graph *g = c->cfg.g;
    const struct tr_backend *be = c->cfg.be;
    if (load_tensors(g, be, data[1], size[1], "", params, 1, weights_dtype, "model.safetensors",
                     err) != TR_OK)
        goto done;
    for (int k = 0; k < od->state_slots; k++)
        if (load_tensors(g, be, data[2 + k], size[2 + k], od->state_names[k], slots[k], 0, -1,
                         blobs[2 + k], err) != TR_OK)
            goto done;
    *state = st;
    if (weights_dtype != TR_F32)
        tr_log(TR_LOG_WARN, "checkpoint", "%s stores weights in %s: resuming from it is not "
               "bit-exact", name, weights_dtype == TR_BF16 ? "bf16" : "fp16");
    rc = TR_OK;
done:
    for (int i = 0; i < 4; i++)
        tr_free(data[i]);
    tr_json_free(js);
    return rc;
}

int tr_checkpointer_resume(struct tr_checkpointer *c, float *params, float *const *slots,
                           struct tr_run_state *state, char *loaded, size_t loaded_size,
                           tr_err *err)
{
    struct name_list l = {0};
    if (c->cfg.vt->list(c->cfg.self, collect, &l, err) != TR_OK)
        return TR_ERROR;
    int rc = 0;
    for (size_t i = 0; i < l.n; i++) {
        tr_err why = {{0}};
        int ok = tr_checkpointer_load(c, l.names[i], params, slots, state, &why) == TR_OK;
        if (ok && c->cfg.max_step && state->step > c->cfg.max_step) {
            ok = 0;
            tr_fail(&why, "its step %llu is past train.steps = %llu",
                    (unsigned long long)state->step, (unsigned long long)c->cfg.max_step);
        }
        if (ok) {
            snprintf(loaded, loaded_size, "%s", l.names[i]);
            rc = 1;
            break;
        }
        tr_log(TR_LOG_WARN, "checkpoint", "skipping %s: %s", l.names[i], why.msg);
        if (rc == 0)
            tr_fail(err, "no checkpoint could be loaded; the newest, %s: %s", l.names[i], why.msg);
        rc = TR_ERROR;
    }
    free_names(&l);
    return rc;
}

/* ---- finding a checkpoint on disk ---- */

int tr_checkpoint_resolve(const char *path, char **dir, char **name, tr_err *err)
{
    struct stat st;
    char *latest = NULL;
    const char *candidates[] = {"%s/LATEST", "%s/checkpoints/LATEST"};
    for (int i = 0; i < 2; i++) {
        char *p = tr_xasprintf(candidates[i], path);
        struct stat lst; /* a regular file: opening a FIFO would hang */
        FILE *f = stat(p, &lst) == 0 && S_ISREG(lst.st_mode) ? fopen(p, "r") : NULL;
        if (f) {
            char buf[256] = "";
            if (fgets(buf, sizeof buf, f))
                buf[strcspn(buf, "\r\n")] = 0;
            fclose(f);
            free(p);
            /* a name, not a path: LATEST must not lead out of its directory */
            if (!buf[0] || buf[0] == '.' || strchr(buf, '/'))
                return tr_fail(err, "%s%s names no checkpoint (\"%s\"); pass the checkpoint "
                               "directory itself", path, i == 0 ? "/LATEST" : "/checkpoints/LATEST",
                               buf);
            *dir = i == 0 ? tr_xstrdup(path) : tr_xasprintf("%s/checkpoints", path);
            *name = tr_xstrdup(buf);
            return TR_OK;
        }
        free(p);
    }
    char *state = tr_xasprintf("%s/state.json", path);
    int ok = stat(state, &st) == 0;
    free(state);
    free(latest);
    if (!ok)
        return tr_fail(err, "%s is not a checkpoint, a checkpoints directory or a run directory "
                       "(no state.json or LATEST there)", path);
    char *copy = tr_xstrdup(path);
    size_t len = strlen(copy);
    while (len > 1 && copy[len - 1] == '/')
        copy[--len] = 0;
    *dir = tr_dirname(copy);
    const char *slash = strrchr(copy, '/');
    *name = tr_xstrdup(slash ? slash + 1 : copy);
    free(copy);
    return TR_OK;
}

/* ---- verifying a checkpoint directory ---------------------------------------- */

/* The whole of path in malloc'd memory (one byte more, zeroed). */
int tr_ckpt_read_whole(const char *path, void **data, size_t *size, tr_err *err)
{
    *data = NULL;
    *size = 0;
    /* a regular file only: a FIFO in a colleague's run directory would hang */
    struct stat st;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return tr_fail(err, "cannot open %s: %s", path, strerror(errno));
    FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "rb") : NULL;
    if (!f) {
        close(fd);
        return tr_fail(err, "cannot read %s: not a regular file", path);
    }
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return tr_fail(err, "cannot read %s: not a regular file", path);
    }
    char *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        fclose(f);
        return tr_fail(err, "cannot read %s%s", path, buf ? "" : ": out of memory");
    }
    fclose(f);
    buf[len] = '\0';
    *data = buf;
    *size = (size_t)len;
    return TR_OK;
}

/* state.json of a checkpoint directory and the CRC-32 of each blob it
 * lists (model.safetensors must be among them); *model, when asked for,
 * gets the verified weights' bytes. */
int tr_ckpt_verify_dir(const char *checkpoint_dir, void **model, size_t *model_size, tr_err *err)
{
    char *copy = tr_xstrdup(checkpoint_dir);
    size_t len = strlen(copy);
    while (len > 1 && copy[len - 1] == '/')
        copy[--len] = 0;
    const char *slash = strrchr(copy, '/');
    const char *name = slash ? slash + 1 : copy;
    char *path = tr_xasprintf("%s/state.json", copy);
    void *text = NULL, *blob = NULL;
    size_t size = 0, blob_size = 0;
    struct tr_json *js = NULL;
    struct tr_run_state st;
    int wd, rc = tr_ckpt_read_whole(path, &text, &size, err);
    if (rc == TR_OK)
        rc = parse_state(text, size, name, &st, &wd, &js, err);
    const struct tr_json *sums = rc == TR_OK ? tr_json_get(js, "checksums") : NULL;
    if (rc == TR_OK && (!sums || sums->type != TR_JSON_OBJECT ||
                        !tr_json_get(sums, "model.safetensors")))
        rc = tr_fail(err, "state.json lists no checksum of model.safetensors");
    for (size_t i = 0; rc == TR_OK && i < sums->n; i++) {
        const char *b = sums->keys[i];
        if (!b[0] || b[0] == '.' || strchr(b, '/')) {
            rc = tr_fail(err, "state.json lists a checksum of \"%s\", which is no blob", b);
            break;
        }
        char *bp = tr_xasprintf("%s/%s", copy, b);
        rc = tr_ckpt_read_whole(bp, &blob, &blob_size, err);
        free(bp);
        if (rc == TR_OK)
            rc = check_blob(js, b, blob, blob_size, err);
        if (rc == TR_OK && model && strcmp(b, "model.safetensors") == 0) {
            *model = blob;
            *model_size = blob_size;
            blob = NULL;
        }
        free(blob);
        blob = NULL;
    }
    if (rc != TR_OK) {
        tr_err_prefix(err, "checkpoint %s is damaged or was edited, so it is not used", copy);
        if (model) {
            free(*model);
            *model = NULL;
        }
    }
    tr_json_free(js);
    free(text);
    free(path);
    free(copy);
    return rc;
}

int tr_checkpoint_verify(const char *checkpoint_dir, tr_err *err)
{
    return tr_ckpt_verify_dir(checkpoint_dir, NULL, NULL, err);
}

/* ---- reading a checkpoint without a run ----------------------------------- */

struct tr_json *tr_checkpoint_read_state(const char *checkpoint_dir, struct tr_run_state *state,
                                         tr_err *err)
{
    char *copy = tr_xstrdup(checkpoint_dir);
    size_t len = strlen(copy);
    while (len > 1 && copy[len - 1] == '/')
        copy[--len] = 0;
    const char *slash = strrchr(copy, '/');
    char *path = tr_xasprintf("%s/state.json", copy);
    void *text = NULL;
    size_t size = 0;
    struct tr_json *js = NULL;
    int wd;
    if (tr_ckpt_read_whole(path, &text, &size, err) != TR_OK ||
        parse_state(text, size, slash ? slash + 1 : copy, state, &wd, &js, err) != TR_OK) {
        tr_err_prefix(err, "checkpoint %s is damaged or was edited, so it is not used", copy);
        js = NULL;
    }
    free(text);
    free(path);
    free(copy);
    return js;
}

int tr_checkpoint_load_weights(const char *checkpoint_dir, const struct tr_graph *g,
                               const struct tr_backend *be, float *params, tr_err *err)
{
    void *buf = NULL;
    size_t size = 0;
    if (tr_ckpt_verify_dir(checkpoint_dir, &buf, &size, err) != TR_OK)
        return TR_ERROR;
    char *what = tr_xasprintf("%s/model.safetensors", checkpoint_dir);
    int rc = load_tensors(g, be, buf, size, "", params, 1, -1, what, err);
    /* every parameter was there; a tensor more means another (larger) model,
     * whose first layers alone would be evaluated */
    struct tr_st_file *f = rc == TR_OK ? tr_safetensors_read(buf, size, what, err) : NULL;
    if (rc == TR_OK && !f)
        rc = TR_ERROR;
    size_t n = f ? tr_safetensors_count(f) : 0, extra = 0;
    const char *first = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *name = tr_safetensors_at(f, i)->name;
        int k = tr_graph_find(g, name);
        if (k < 0 || (g->tensors[k].role != TR_ROLE_PARAM && g->tensors[k].role != TR_ROLE_BUFFER)) {
            if (!first)
                first = name;
            extra++;
        }
    }
    if (extra)
        rc = tr_fail(err, "%s holds %zu tensor%s the model has not ('%s'%s)", what, extra,
                     extra == 1 ? "" : "s", first, extra > 1 ? ", ..." : "");
    if (rc != TR_OK) {
        tr_err_prefix(err, "checkpoint %s does not fit the model", checkpoint_dir);
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, "; use the recipe and overrides its run "
                 "trained with (its state.json names them)");
    }
    tr_safetensors_free(f);
    free(what);
    free(buf);
    return rc;
}
