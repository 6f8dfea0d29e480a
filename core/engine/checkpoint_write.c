/* One checkpoint written: its blobs (the weights in weights_dtype, the
 * optimizer's state slots in fp32) serialised from backend memory as
 * safetensors, a piece at a time or whole, then state.json, which vouches
 * for them with their CRC-32s and for itself with its own; all stored
 * through the checkpoint plugin (begin, put or put_stream, commit).
 * checkpoint_read.c reads exactly this back. */
#include "checkpoint.h"
#include "checkpoint_internal.h"

#include "backend.h"

#include "../../kernels/host.h"
#include "../util/json.h"
#include "optim.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
unsigned long tr_ckpt_crc(const void *data, size_t size)
{
    return crc_more(crc32(0L, Z_NULL, 0), data, size);
}

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

char *tr_ckpt_state_json(struct tr_checkpointer *c, const char *const *blobs,
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
    if (c->cfg.peft_config) { /* what export --format peft writes as adapter_config.json */
        fprintf(f, "  \"peft_config\": ");
        tr_json_write_string(f, c->cfg.peft_config);
        fprintf(f, ",\n  \"base\": ");
        tr_json_write_string(f, c->cfg.base_identity ? c->cfg.base_identity : "");
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
    unsigned long own = tr_ckpt_crc(text, *size);
    fprintf(f, STATE_CHECKSUM_KEY " %lu\n}\n", own);
    fclose(f);
    return text;
}

/* ---- writing -------------------------------------------------------------- */

/* Blob i of a checkpoint: the weights, then each optimizer state slot's
 * file as the optimizers' table names it (config/optimizers.c). */
const char *tr_ckpt_blob_name(int i)
{
    return i == 0 ? "model.safetensors" : tr_optimizer_state_files[i - 1];
}


/* the weights, then one blob per optimizer state slot */
int tr_ckpt_blob_count(const struct tr_checkpointer *c) { return 1 + c->cfg.optimizer->state_slots; }

/* The source of blob i of a checkpoint: the weights (in weights_dtype),
 * then the state slots.  TR_ERROR when out of memory. */
static int open_blob(struct tr_checkpointer *c, int i, const float *params, float *const *slots,
                     struct blob_source *s)
{
    if (i == 0)
        return blob_source_open(s, c, params, c->cfg.weights_dtype, "", 1);
    int rc = blob_source_open(s, c, slots[i - 1], TR_F32, c->cfg.optimizer->state_names[i - 1], 0);
    if (c->cfg.state_be) /* offloaded: the same bytes, from host memory */
        s->be = c->cfg.state_be;
    return rc;
}

/* Blob i whole in one malloc'd buffer (NULL when out of memory): the
 * asynchronous save's snapshot, and what a plugin without put_stream gets. */
void *tr_ckpt_build_blob(struct tr_checkpointer *c, int i, const float *params,
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
    int rc = c->cfg.vt->put_stream(c->cfg.self, tr_ckpt_blob_name(i), s.size, blob_fill, &s, err);
    if (rc == TR_OK && s.pos != s.size)
        rc = tr_fail(err, "the checkpoint plugin stored %s after %zu of its %zu bytes",
                     tr_ckpt_blob_name(i), s.pos, s.size);
    *checksum = s.crc;
    blob_source_close(&s);
    return rc;
}

void tr_ckpt_free_blobs(struct tr_checkpointer *c)
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
int tr_ckpt_write(struct tr_checkpointer *c, const float *params, float *const *slots,
                  tr_err *err)
{
    char name[64];
    snprintf(name, sizeof name, "step-%010llu", (unsigned long long)c->state.step);
    int n = tr_ckpt_blob_count(c);
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
            data = tr_ckpt_build_blob(c, i, params, slots, &size);
        if (!data) {
            tr_fail(err, "out of memory serialising checkpoint %s", name);
            goto failed;
        }
        checksums[i] = tr_ckpt_crc(data, size);
        int rc = vt->put(c->cfg.self, tr_ckpt_blob_name(i), data, size, err);
        free(data);
        if (rc != TR_OK)
            goto failed;
    }
    /* state last: its checksums vouch for the blobs written before it */
    const char *names[1 + TR_OPTIMIZER_MAX_SLOTS];
    for (int i = 0; i < n; i++)
        names[i] = tr_ckpt_blob_name(i);
    state = tr_ckpt_state_json(c, names, checksums, n, &state_size);
    if (vt->put(c->cfg.self, "state.json", state, state_size, err) != TR_OK ||
        vt->commit(c->cfg.self, err) != TR_OK)
        goto failed;
    free(state);
    return TR_OK;
failed:
    vt->abort(c->cfg.self);
    free(state);
    tr_ckpt_free_blobs(c);
    tr_err_prefix(err, "checkpoint %s not saved (the previous one is still the latest)", name);
    return TR_ERROR;
}
