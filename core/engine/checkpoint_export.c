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

/* The tensors of st as they are exported: fp32 ones converted to dtype
 * into halves[i] (the caller frees them), the rest as stored. */
static struct tr_st_entry *export_entries(const struct tr_st_file *st, size_t n,
                                          enum tr_dtype dtype, uint16_t **halves)
{
    struct tr_st_entry *out = tr_xcalloc(n ? n : 1, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        const struct tr_st_entry *e = tr_safetensors_at(st, i);
        out[i] = *e;
        if (e->dtype == TR_F32 && dtype != TR_F32) {
            size_t count = e->bytes / 4;
            halves[i] = tr_xcalloc(count ? count : 1, sizeof(uint16_t));
            tr_cpu_to_half(halves[i], e->data, count, dtype == TR_BF16);
            out[i].dtype = dtype;
            out[i].data = halves[i];
            out[i].bytes = count * 2;
        }
    }
    return out;
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
    char *path = tr_xasprintf("%s/model.safetensors", checkpoint_dir);
    void *buf = NULL;
    size_t size = 0;
    int rc = TR_ERROR;
    struct tr_st_file *st = NULL;
    struct tr_st_entry *out = NULL;
    uint16_t **halves = NULL;
    size_t n = 0;
    /* the weights exported are the ones state.json vouches for */
    if (tr_ckpt_verify_dir(checkpoint_dir, &buf, &size, err) != TR_OK)
        goto done;
    if (!(st = tr_safetensors_read(buf, size, path, err)))
        goto done;
    n = tr_safetensors_count(st);
    halves = tr_xcalloc(n ? n : 1, sizeof *halves);
    out = export_entries(st, n, dtype, halves);
    size_t out_size = 0;
    void *blob = tr_safetensors_write(out, n, "{\"format\":\"pt\",\"producer\":\"trainrun export\"}", &out_size);
    rc = write_export(out_path, blob, out_size, err);
    free(blob);
done:
    for (size_t i = 0; halves && i < n; i++)
        free(halves[i]);
    free(halves);
    free(out);
    tr_safetensors_free(st);
    free(buf);
    free(path);
    return rc;
}

int tr_export_hf(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir, tr_err *err)
{
    char *what = tr_xasprintf("%s/model.safetensors", checkpoint_dir);
    char *state_path = tr_xasprintf("%s/state.json", checkpoint_dir);
    void *buf = NULL, *text = NULL;
    size_t size = 0, text_size = 0, bad = 0;
    struct tr_json *js = NULL;
    struct tr_st_file *st = NULL;
    int rc = TR_ERROR;
    /* the weights exported are the ones state.json vouches for */
    if (tr_ckpt_verify_dir(checkpoint_dir, &buf, &size, err) != TR_OK ||
        tr_ckpt_read_whole(state_path, &text, &text_size, err) != TR_OK)
        goto done;
    js = tr_json_parse(text, text_size, &bad);
    const char *config = tr_json_string(js, "hf_config");
    struct tr_hf_arch a;
    if (!config) {
        tr_fail(err, "%s records no Hugging Face architecture: its model is not a llama or gpt "
                "(or the run predates export --format hf); export --format safetensors writes "
                "the weights alone", state_path);
        goto done;
    }
    if (tr_hf_config_parse(config, strlen(config), state_path, &a, err) != TR_OK ||
        !(st = tr_safetensors_read(buf, size, what, err)))
        goto done;
    rc = tr_hf_export(&a, st, what, out_dir, dtype, err);
done:
    tr_safetensors_free(st);
    tr_json_free(js);
    free(text);
    free(buf);
    free(state_path);
    free(what);
    return rc;
}

/* `export --format peft`: adapter_config.json as the run recorded it and
 * the trained tensors under PEFT's names, each file replaced atomically. */
int tr_export_peft(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir,
                   tr_err *err)
{
    char *what = tr_xasprintf("%s/model.safetensors", checkpoint_dir);
    char *state_path = tr_xasprintf("%s/state.json", checkpoint_dir);
    void *buf = NULL, *text = NULL;
    size_t size = 0, text_size = 0, bad = 0, n = 0;
    struct tr_json *js = NULL;
    struct tr_st_file *st = NULL;
    struct tr_st_entry *out = NULL;
    uint16_t **halves = NULL;
    char **names = NULL;
    int rc = TR_ERROR;
    if (tr_ckpt_verify_dir(checkpoint_dir, &buf, &size, err) != TR_OK ||
        tr_ckpt_read_whole(state_path, &text, &text_size, err) != TR_OK)
        goto done;
    js = tr_json_parse(text, text_size, &bad);
    const char *config = tr_json_string(js, "peft_config");
    if (!config) {
        tr_fail(err, "%s is not a checkpoint of adapters (its run has no lora section); "
                "export --format hf writes its full weights", checkpoint_dir);
        goto done;
    }
    if (!(st = tr_safetensors_read(buf, size, what, err)) ||
        tr_export_prepare_dir(out_dir, err) != TR_OK)
        goto done;
    n = tr_safetensors_count(st);
    halves = tr_xcalloc(n ? n : 1, sizeof *halves);
    names = tr_xcalloc(n ? n : 1, sizeof *names);
    out = export_entries(st, n, dtype, halves);
    for (size_t i = 0; i < n; i++) {
        names[i] = tr_xasprintf(TR_PEFT_PREFIX "%s", out[i].name);
        out[i].name = names[i];
    }
    size_t out_size = 0;
    void *blob = tr_safetensors_write(out, n, "{\"format\":\"pt\"}", &out_size);
    char *weights = tr_xasprintf("%s/adapter_model.safetensors", out_dir);
    char *cfg = tr_xasprintf("%s/adapter_config.json", out_dir);
    rc = write_export(weights, blob, out_size, err);
    if (rc == TR_OK)
        rc = write_export(cfg, config, strlen(config), err);
    free(blob);
    free(weights);
    free(cfg);
done:
    for (size_t i = 0; i < n; i++) {
        if (halves)
            free(halves[i]);
        if (names)
            free(names[i]);
    }
    free(halves);
    free(names);
    free(out);
    tr_safetensors_free(st);
    tr_json_free(js);
    free(text);
    free(buf);
    free(state_path);
    free(what);
    return rc;
}
