/* Checkpoints read back: state.json and the blobs checked
 * (checkpoint_files.c), and their tensors loaded by name into backend
 * memory.  Through
 * the checkpoint plugin for a run (tr_checkpointer_load, _resume); from a
 * local directory without one (resolve, verify, read_state, load_weights,
 * and checkpoint_export.c).  Nothing is uploaded or returned before it is
 * verified. */
#include "checkpoint.h"
#include "checkpoint_internal.h"
#include "checkpoint_shard.h"

#include "backend.h"

#include "../../kernels/host.h"
#include "../util/json.h"
#include "optim.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <trainrun/input.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
int tr_checkpointer_load(struct tr_checkpointer *c, const char *name, float *params,
                         float *const *slots, struct tr_run_state *state, tr_err *err)
{
    const char *blobs[] = {"state.json", tr_ckpt_blob_name(0), tr_ckpt_blob_name(1),
                           tr_ckpt_blob_name(2)};
    _Static_assert(TR_OPTIMIZER_MAX_SLOTS == 2, "state.json, the weights and two state slots");
    void *data[4] = {NULL};
    size_t size[4] = {0};
    struct tr_json *js = NULL;
    int rc = TR_ERROR;
    const struct tr_optimizer_desc *od = c->cfg.optimizer;
    int n = 2 + od->state_slots;
    /* a sharded checkpoint (checkpoint_shard.h): read range by range */
    struct tr_ckpt_src src = {c->cfg.vt, c->cfg.self, name, NULL};
    struct tr_ckpt_layout *layout = NULL;
    struct tr_run_state sst;
    if (tr_ckpt_read_shared_state(&src, &sst, &layout, err) != TR_OK)
        return TR_ERROR;
    if (layout) { /* the state slots where they live: host memory under offload */
        struct tr_ckpt_dest dest[TR_CKPT_MAX_SLOTS] = {{params, NULL, 0, NULL}};
        for (int k = 0; k < od->state_slots; k++)
            dest[1 + k] = (struct tr_ckpt_dest){slots[k], NULL, 0, c->cfg.state_be};
        rc = tr_ckpt_load_layout(&src, layout, c->cfg.g, c->cfg.be, od, dest, err);
        tr_ckpt_layout_free(layout);
        if (rc == TR_OK)
            *state = sst;
        return rc;
    }
    for (int i = 0; i < n; i++)
        if (c->cfg.vt->get(c->cfg.self, name, blobs[i], &data[i], &size[i], err) != TR_OK)
            goto done;
    /* everything is verified before anything is uploaded or returned */
    struct tr_run_state st;
    int weights_dtype;
    if (tr_ckpt_parse_state(data[0], size[0], name, &st, &weights_dtype, &js, err) != TR_OK)
        goto done;
    for (int i = 1; i < n; i++)
        if (tr_ckpt_check_blob(js, blobs[i], data[i], size[i], err) != TR_OK)
            goto done;
    const struct tr_graph *g = c->cfg.g;
    const struct tr_backend *be = c->cfg.be;
    if (load_tensors(g, be, data[1], size[1], "", params, 1, weights_dtype, "model.safetensors",
                     err) != TR_OK)
        goto done;
    const struct tr_backend *state_be = c->cfg.state_be ? c->cfg.state_be : be;
    for (int k = 0; k < od->state_slots; k++)
        if (load_tensors(g, state_be, data[2 + k], size[2 + k], od->state_names[k], slots[k], 0, -1,
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
    if (tr_ckpt_list(c, &l, err) != TR_OK)
        return TR_ERROR;
    int rc = 0;
    if (c->skip[0]) { /* the ranks passed over the newest sharded ones already (and said so) */
        rc = TR_ERROR;
        tr_fail(err, "no checkpoint could be loaded; the newest, %s: %s", c->newest,
                c->newest_why.msg);
    }
    for (size_t i = 0; i < l.n; i++) {
        if (c->skip[0] && strcmp(l.names[i], c->skip) >= 0)
            continue;
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
    tr_ckpt_free_names(&l);
    return rc;
}

/* layout.json of sharded checkpoint directory dir (state.json parsed as
 * js), checked against the checksum state.json records, and parsed. */
static int dir_layout(const char *dir, const struct tr_json *js, struct tr_ckpt_layout **l,
                      tr_err *err)
{
    char *path = tr_xasprintf("%s/" TR_CKPT_LAYOUT_BLOB, dir);
    void *text = NULL;
    size_t size = 0;
    int rc = tr_ckpt_read_whole(path, &text, &size, err);
    if (rc == TR_OK)
        rc = tr_ckpt_check_blob(js, TR_CKPT_LAYOUT_BLOB, text, size, err);
    if (rc == TR_OK)
        rc = tr_ckpt_layout_parse(text, size, path, l, err);
    free(text);
    free(path);
    return rc;
}

/* state.json of a checkpoint directory and the CRC-32 of each blob it
 * lists (model.safetensors must be among them); *model, when asked for,
 * gets the verified weights' bytes; a sharded checkpoint's *layout, when
 * asked for, gets its checked layout instead of *model. */
int tr_ckpt_verify_dir(const char *checkpoint_dir, void **model, size_t *model_size,
                       struct tr_ckpt_layout **layout_out, tr_err *err)
{
    if (layout_out)
        *layout_out = NULL;
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
        rc = tr_ckpt_parse_state(text, size, name, &st, &wd, &js, err);
    const struct tr_json *sums = rc == TR_OK ? tr_json_get(js, "checksums") : NULL;
    if (rc == TR_OK && sums && sums->type == TR_JSON_OBJECT &&
        tr_json_get(sums, TR_CKPT_LAYOUT_BLOB) && !tr_json_get(sums, "model.safetensors")) {
        /* sharded (checkpoint_shard.h): layout.json, then every range it lists */
        struct tr_ckpt_layout *layout = NULL;
        struct tr_ckpt_src src = {NULL, NULL, name, copy};
        rc = dir_layout(copy, js, &layout, err);
        if (rc == TR_OK && layout_out) {
            /* the reader checks each range as it reads it: nothing read twice */
            *layout_out = layout;
            layout = NULL;
        } else if (rc == TR_OK && model)
            rc = (*model = tr_ckpt_layout_model(&src, layout, model_size, err)) ? TR_OK : TR_ERROR;
        else if (rc == TR_OK)
            rc = tr_ckpt_layout_check_all(&src, layout, err);
        tr_ckpt_layout_free(layout);
        sums = NULL;
    } else if (rc == TR_OK && (!sums || sums->type != TR_JSON_OBJECT ||
                               !tr_json_get(sums, "model.safetensors"))) {
        rc = tr_fail(err, "state.json lists no checksum of model.safetensors");
    }
    for (size_t i = 0; rc == TR_OK && sums && i < sums->n; i++) {
        const char *b = sums->keys[i];
        if (!b[0] || b[0] == '.' || strchr(b, '/')) {
            rc = tr_fail(err, "state.json lists a checksum of \"%s\", which is no blob", b);
            break;
        }
        char *bp = tr_xasprintf("%s/%s", copy, b);
        rc = tr_ckpt_read_whole(bp, &blob, &blob_size, err);
        free(bp);
        if (rc == TR_OK)
            rc = tr_ckpt_check_blob(js, b, blob, blob_size, err);
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
    return tr_ckpt_verify_dir(checkpoint_dir, NULL, NULL, NULL, err);
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
        tr_ckpt_parse_state(text, size, slash ? slash + 1 : copy, state, &wd, &js, err) != TR_OK) {
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
    /* sharded (checkpoint_shard.h): tensor by tensor, each range checked */
    struct tr_run_state st;
    struct tr_json *js = tr_checkpoint_read_state(checkpoint_dir, &st, err);
    if (!js)
        return TR_ERROR;
    const struct tr_json *sums = tr_json_get(js, "checksums");
    if (sums && sums->type == TR_JSON_OBJECT && tr_json_get(sums, TR_CKPT_LAYOUT_BLOB) &&
        !tr_json_get(sums, "model.safetensors")) {
        struct tr_ckpt_layout *layout = NULL;
        struct tr_ckpt_src src = {NULL, NULL, checkpoint_dir, checkpoint_dir};
        struct tr_ckpt_dest dest[TR_CKPT_MAX_SLOTS] = {{params, NULL, 0, NULL}};
        int rc = dir_layout(checkpoint_dir, js, &layout, err);
        if (rc == TR_OK)
            rc = tr_ckpt_load_layout(&src, layout, g, be, NULL, dest, err);
        tr_ckpt_layout_free(layout);
        tr_json_free(js);
        if (rc != TR_OK)
            tr_err_prefix(err, "checkpoint %s is damaged or does not fit the model",
                          checkpoint_dir);
        return rc;
    }
    tr_json_free(js);
    if (tr_ckpt_verify_dir(checkpoint_dir, &buf, &size, NULL, err) != TR_OK)
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
