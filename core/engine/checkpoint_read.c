/* Checkpoints read back: state.json checked (its own checksum, then each
 * field a run resumes from), the blobs checked against the CRC-32s it
 * records, and their tensors loaded by name into backend memory.  Through
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
    if (tr_ckpt_crc(text, (size_t)(at - text)) != want)
        return "state.json fails its checksum (torn, truncated or edited)";
    return NULL;
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
    if (!field && tr_ckpt_is_step_name(name) && strcmp(name, expected) != 0) {
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
    if (!best || (best[0] && !tr_ckpt_is_step_name(best))) {
        tr_json_free(js);
        return tr_fail(err, "state.json: \"best\" names no checkpoint of this run");
    }
    snprintf(state->best, sizeof state->best, "%s", best);
    const char *base = tr_json_string(js, "base"); /* an adapter run's frozen base */
    snprintf(state->base, sizeof state->base, "%s", base ? base : "");
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
    unsigned long got = tr_ckpt_crc(data, size);
    if (!v || v->type != TR_JSON_NUMBER || v->number < 0 || (unsigned long)v->number != got)
        return tr_fail(err, "%s fails its checksum (torn, truncated or corrupted)", blob);
    return TR_OK;
}

int tr_ckpt_parse_state(const void *text, size_t size, const char *name,
                        struct tr_run_state *state, struct tr_json **js, tr_err *err)
{
    int weights_dtype;
    return parse_state(text, size, name, state, &weights_dtype, js, err);
}

int tr_ckpt_check_blob(const struct tr_json *js, const char *blob, const void *data, size_t size,
                       tr_err *err)
{
    return check_blob(js, blob, data, size, err);
}

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
    if (layout) {
        struct tr_ckpt_dest dest[TR_CKPT_MAX_SLOTS] = {{params, NULL, 0}};
        for (int k = 0; k < od->state_slots; k++)
            dest[1 + k] = (struct tr_ckpt_dest){slots[k], NULL, 0};
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
    if (tr_ckpt_list(c, &l, err) != TR_OK)
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
    tr_ckpt_free_names(&l);
    return rc;
}

/* ---- finding a checkpoint on disk ---- */

static int resolve_once(const char *path, char **dir, char **name, tr_err *err)
{
    struct stat st;
    char *latest = NULL;
    const char *candidates[] = {"%s/LATEST", "%s/checkpoints/LATEST"};
    for (int i = 0; i < 2; i++) {
        char *p = tr_xasprintf(candidates[i], path);
        FILE *f = tr_input_fopen(p); /* a regular file: opening a FIFO would hang */
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

/* ---- pinning: reading the checkpoints of a running run ---------------------- */

/* A running run prunes its older checkpoints (checkpoint.keep) and moves
 * LATEST on, so a reader that resolved LATEST may find the checkpoint's
 * files removed before it reads them, and a checkpoint whose files vanish
 * must not be called damaged.  tr_checkpoint_resolve therefore opens every
 * file of the checkpoint it resolved at once (an open file stays readable
 * after it is removed) and tr_ckpt_read_whole reads those; when some of its
 * files were already gone, it resolves again. */
struct pin {
    char *path;
    int fd;
};
static struct pin *pins;
static size_t n_pins;

static void unpin_all(void)
{
    for (size_t i = 0; i < n_pins; i++) {
        close(pins[i].fd);
        free(pins[i].path);
    }
    free(pins);
    pins = NULL;
    n_pins = 0;
}

static int pinned_fd(const char *path)
{
    for (size_t i = 0; i < n_pins; i++)
        if (strcmp(pins[i].path, path) == 0)
            return pins[i].fd;
    return -1;
}

int tr_ckpt_open_input(const char *path)
{
    int fd = pinned_fd(path);
    return fd >= 0 ? dup(fd) : tr_input_open(path);
}

/* The whole of the file fd from offset 0 (one byte more, zeroed); 0 or an errno. */
static int read_fd(int fd, char **data, size_t *size)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return errno;
    size_t len = (size_t)st.st_size, got = 0;
    char *buf = malloc(len + 1);
    if (!buf)
        return ENOMEM;
    while (got < len) {
        ssize_t r = pread(fd, buf + got, len - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            return e;
        }
        got += (size_t)r;
    }
    buf[len] = 0;
    *data = buf;
    *size = len;
    return 0;
}

/* Open every regular file of the checkpoint directory ckpt; 1 when
 * state.json and every blob it lists are among them (or state.json cannot
 * be parsed: verification says so), 0 when some were already removed. */
static int pin_checkpoint(const char *ckpt)
{
    unpin_all();
    DIR *d = opendir(ckpt);
    if (!d)
        return errno != ENOENT;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char *path = tr_xasprintf("%s/%s", ckpt, e->d_name);
        int fd = tr_input_open(path);
        if (fd < 0) {
            free(path); /* removed meanwhile, or not a file: the reads say which */
            continue;
        }
        pins = tr_xrealloc(pins, (n_pins + 1) * sizeof *pins);
        pins[n_pins].path = path;
        pins[n_pins].fd = fd;
        n_pins++;
    }
    closedir(d);
    char *state = tr_xasprintf("%s/state.json", ckpt);
    int fd = pinned_fd(state);
    free(state);
    char *text = NULL;
    size_t size = 0;
    if (fd < 0 || read_fd(fd, &text, &size) != 0)
        return fd >= 0;
    struct tr_json *js = tr_json_parse(text, size, NULL);
    const struct tr_json *sums = js && js->type == TR_JSON_OBJECT ? tr_json_get(js, "checksums") : NULL;
    int complete = 1;
    for (size_t i = 0; sums && sums->type == TR_JSON_OBJECT && i < sums->n && complete; i++) {
        char *blob = tr_xasprintf("%s/%s", ckpt, sums->keys[i]);
        complete = pinned_fd(blob) >= 0;
        free(blob);
    }
    tr_json_free(js);
    free(text);
    return complete;
}

int tr_checkpoint_resolve(const char *path, char **dir, char **name, tr_err *err)
{
    for (int attempt = 0;; attempt++) {
        if (resolve_once(path, dir, name, err) != TR_OK) {
            if (attempt == 0)
                return TR_ERROR;
            /* it resolved a moment ago: its checkpoint was removed meanwhile */
            return tr_fail(err, "the checkpoint %s named was removed while it was read (its run "
                           "prunes older checkpoints, checkpoint.keep): name the run directory "
                           "to read its latest checkpoint, or copy a checkpoint elsewhere first",
                           path);
        }
        char *ckpt = tr_xasprintf("%s/%s", *dir, *name);
        int complete = pin_checkpoint(ckpt);
        free(ckpt);
        if (complete || attempt == 200)
            return TR_OK; /* the reads say what is missing */
        /* files of it were removed: the run pruned it (LATEST has moved on),
         * or is pruning it; resolve again */
        char *dir2 = NULL, *name2 = NULL;
        tr_err ignored = {{0}};
        int moved = resolve_once(path, &dir2, &name2, &ignored) != TR_OK ||
                    strcmp(dir2, *dir) != 0 || strcmp(name2, *name) != 0;
        free(dir2);
        free(name2);
        if (!moved) {
            /* the same checkpoint, named directly: a moment for its removal to finish */
            struct stat st;
            char *again = tr_xasprintf("%s/%s", *dir, *name);
            usleep(20 * 1000);
            int gone = stat(again, &st) != 0;
            free(again);
            if (!gone)
                return TR_OK; /* not being removed: damaged, and verification says how */
        }
        free(*dir);
        free(*name);
        *dir = *name = NULL;
        unpin_all();
        usleep(5 * 1000);
    }
}

/* ---- verifying a checkpoint directory ---------------------------------------- */

/* The whole of path in malloc'd memory (one byte more, zeroed). */
int tr_ckpt_read_whole(const char *path, void **data, size_t *size, tr_err *err)
{
    *data = NULL;
    *size = 0;
    /* a regular file only: a FIFO in a colleague's run directory would hang */
    int pinned = pinned_fd(path); /* opened when it was resolved */
    if (pinned >= 0) {
        char *buf = NULL;
        size_t len = 0;
        int e = read_fd(pinned, &buf, &len);
        if (e)
            return tr_fail(err, "cannot read %s: %s", path, strerror(e));
        *data = buf;
        *size = len;
        return TR_OK;
    }
    FILE *f = tr_input_fopen(path);
    if (!f)
        return tr_fail(err, "cannot read %s: %s", path, tr_input_strerror(errno));
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
        rc = check_blob(js, TR_CKPT_LAYOUT_BLOB, text, size, err);
    if (rc == TR_OK)
        rc = tr_ckpt_layout_parse(text, size, path, l, err);
    free(text);
    free(path);
    return rc;
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
    if (rc == TR_OK && sums && sums->type == TR_JSON_OBJECT &&
        tr_json_get(sums, TR_CKPT_LAYOUT_BLOB) && !tr_json_get(sums, "model.safetensors")) {
        /* sharded (checkpoint_shard.h): layout.json, then every range it lists */
        struct tr_ckpt_layout *layout = NULL;
        struct tr_ckpt_src src = {NULL, NULL, name, copy};
        rc = dir_layout(copy, js, &layout, err);
        if (rc == TR_OK && model)
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
        struct tr_ckpt_dest dest[TR_CKPT_MAX_SLOTS] = {{params, NULL, 0}};
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
