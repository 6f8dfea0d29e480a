/* `trainrun export`: a checkpoint directory's weights, verified first, as
 * one safetensors file (tr_export_weights) or as a Hugging Face directory
 * (tr_export_hf, written by hf_export.c). */
#include "checkpoint.h"
#include "checkpoint_internal.h"

#include "../../kernels/host.h"
#include "hf_weights.h"
#include "peft.h"
#include "../util/json.h"
#include "../util/progress.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A checkpoint as every export reads it: its weights, verified against
 * state.json first (the weights exported are the ones it vouches for),
 * and state.json itself when asked for. */
struct verified {
    char *weights_path, *state_path;
    void *buf, *text;
    size_t size, text_size;
    struct tr_st_file *st;
    struct tr_json *state; /* NULL unless asked for */
};

static void close_verified(struct verified *v)
{
    tr_safetensors_free(v->st);
    tr_json_free(v->state);
    free(v->text);
    free(v->buf);
    free(v->state_path);
    free(v->weights_path);
    memset(v, 0, sizeof *v);
}

static int open_verified(struct verified *v, const char *checkpoint_dir, int with_state,
                         tr_err *err)
{
    memset(v, 0, sizeof *v);
    v->weights_path = tr_xasprintf("%s/model.safetensors", checkpoint_dir);
    v->state_path = tr_xasprintf("%s/state.json", checkpoint_dir);
    size_t bad = 0;
    if (tr_ckpt_verify_dir(checkpoint_dir, &v->buf, &v->size, err) != TR_OK ||
        (with_state &&
         tr_ckpt_read_whole(v->state_path, &v->text, &v->text_size, err) != TR_OK) ||
        !(v->st = tr_safetensors_read(v->buf, v->size, v->weights_path, err))) {
        close_verified(v);
        return TR_ERROR;
    }
    if (with_state)
        v->state = tr_json_parse(v->text, v->text_size, &bad);
    return TR_OK;
}

/* The tensors of a checkpoint as they are exported: fp32 ones converted to
 * dtype, the rest as stored. */
struct converted {
    struct tr_st_entry *out;
    uint16_t **halves; /* the converted values, per tensor (NULL: as stored) */
    size_t n;
};

static void convert_entries(struct converted *c, const struct tr_st_file *st, enum tr_dtype dtype)
{
    c->n = tr_safetensors_count(st);
    c->out = tr_xcalloc(c->n ? c->n : 1, sizeof *c->out);
    c->halves = tr_xcalloc(c->n ? c->n : 1, sizeof *c->halves);
    for (size_t i = 0; i < c->n; i++) {
        const struct tr_st_entry *e = tr_safetensors_at(st, i);
        c->out[i] = *e;
        if (e->dtype == TR_F32 && dtype != TR_F32) {
            size_t count = e->bytes / 4;
            c->halves[i] = tr_xcalloc(count ? count : 1, sizeof(uint16_t));
            tr_cpu_to_half(c->halves[i], e->data, count, dtype == TR_BF16);
            c->out[i].dtype = dtype;
            c->out[i].data = c->halves[i];
            c->out[i].bytes = count * 2;
        }
    }
}

static void free_converted(struct converted *c)
{
    for (size_t i = 0; c->halves && i < c->n; i++)
        free(c->halves[i]);
    free(c->halves);
    free(c->out);
}

/* blob (out_size bytes; NULL when it could not be made) as out_path. */
static int write_export(const char *out_path, const void *blob, size_t out_size, tr_err *err)
{
    int rc = TR_ERROR;
    /* a fresh name beside the output: no file of the user's is overwritten
     * but out_path itself, and that only once the export is complete */
    char *tmp = tr_xasprintf("%s.XXXXXX", out_path);
    int fd = mkstemp(tmp);
    if (fd >= 0) { /* mkstemp makes it 0600; an export is as readable as any new file */
        mode_t mask = umask(0);
        umask(mask);
        fchmod(fd, 0666 & ~mask);
    }
    FILE *o = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !o)
        close(fd);
    /* in 16 MiB pieces, each counted on the progress bar */
    struct tr_progress *bar = o && blob ? tr_progress_start("exporting", out_size) : NULL;
    size_t written = 0;
    while (o && blob && written < out_size) {
        size_t piece = out_size - written < (16u << 20) ? out_size - written : (16u << 20);
        if (fwrite((const char *)blob + written, 1, piece, o) != piece)
            break;
        written += piece;
        tr_progress_add(bar, piece);
        tr_progress_draw(bar, 0);
    }
    tr_progress_end(bar, written == out_size, 1);
    if (!blob || !o || written != out_size || fflush(o) != 0) {
        tr_fail(err, "cannot write %s: %s", out_path, strerror(errno));
        if (o)
            fclose(o);
        if (fd >= 0)
            remove(tmp);
    } else if (fclose(o) != 0 || rename(tmp, out_path) != 0) {
        tr_fail(err, "cannot write %s: %s", out_path, strerror(errno));
        remove(tmp);
    } else {
        rc = TR_OK;
    }
    free(tmp);
    return rc;
}

int tr_export_weights(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_path,
                      tr_err *err)
{
    struct verified v;
    if (open_verified(&v, checkpoint_dir, 0, err) != TR_OK)
        return TR_ERROR;
    struct converted c;
    convert_entries(&c, v.st, dtype);
    size_t out_size = 0;
    void *blob = tr_safetensors_write(c.out, c.n,
                                      "{\"format\":\"pt\",\"producer\":\"trainrun export\"}",
                                      &out_size);
    int rc = write_export(out_path, blob, out_size, err);
    free(blob);
    free_converted(&c);
    close_verified(&v);
    return rc;
}

int tr_export_hf(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir, tr_err *err)
{
    struct verified v;
    if (open_verified(&v, checkpoint_dir, 1, err) != TR_OK)
        return TR_ERROR;
    const char *config = tr_json_string(v.state, "hf_config");
    struct tr_hf_arch a;
    int rc = TR_ERROR;
    if (!config)
        tr_fail(err, "%s records no Hugging Face architecture: its model is not a llama or gpt "
                "(or the run predates export --format hf); export --format safetensors writes "
                "the weights alone", v.state_path);
    else if (tr_hf_config_parse(config, strlen(config), v.state_path, &a, err) == TR_OK)
        rc = tr_hf_export(&a, v.st, v.weights_path, out_dir, dtype, err);
    close_verified(&v);
    return rc;
}

/* `export --format peft`: adapter_config.json as the run recorded it and
 * the trained tensors under PEFT's names, each file replaced atomically. */
int tr_export_peft(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir,
                   tr_err *err)
{
    struct verified v;
    if (open_verified(&v, checkpoint_dir, 1, err) != TR_OK)
        return TR_ERROR;
    const char *config = tr_json_string(v.state, "peft_config");
    if (!config) {
        tr_fail(err, "%s is not a checkpoint of adapters (its run has no lora section); "
                "export --format hf writes its full weights", checkpoint_dir);
        close_verified(&v);
        return TR_ERROR;
    }
    if (tr_export_prepare_dir(out_dir, err) != TR_OK) {
        close_verified(&v);
        return TR_ERROR;
    }
    struct converted c;
    convert_entries(&c, v.st, dtype);
    char **names = tr_xcalloc(c.n ? c.n : 1, sizeof *names);
    for (size_t i = 0; i < c.n; i++) {
        names[i] = tr_xasprintf(TR_PEFT_PREFIX "%s", c.out[i].name);
        c.out[i].name = names[i];
    }
    size_t out_size = 0;
    void *blob = tr_safetensors_write(c.out, c.n, "{\"format\":\"pt\"}", &out_size);
    char *weights = tr_xasprintf("%s/adapter_model.safetensors", out_dir);
    char *cfg = tr_xasprintf("%s/adapter_config.json", out_dir);
    int rc = write_export(weights, blob, out_size, err);
    if (rc == TR_OK)
        rc = write_export(cfg, config, strlen(config), err);
    free(blob);
    free(weights);
    free(cfg);
    for (size_t i = 0; i < c.n; i++)
        free(names[i]);
    free(names);
    free_converted(&c);
    close_verified(&v);
    return rc;
}
