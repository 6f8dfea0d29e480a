/* A checkpoint's files read and checked, below the loading of its tensors
 * (checkpoint_read.c) and of a sharded one's ranges (checkpoint_shard.c),
 * which both stand on this: state.json parsed and checked (its own
 * checksum, then each field a run resumes from), a blob checked against
 * the CRC-32 state.json records for it, and a local checkpoint found
 * (resolve) and its files opened at once, so that a running run's pruning
 * cannot take them away half-read. */
#include "checkpoint.h"
#include "checkpoint_internal.h"

#include "../util/json.h"
#include "optim.h"
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
                        struct tr_run_state *state, int *weights_dtype, struct tr_json **js,
                        tr_err *err)
{
    int wd;
    return parse_state(text, size, name, state, weights_dtype ? weights_dtype : &wd, js, err);
}

int tr_ckpt_check_blob(const struct tr_json *js, const char *blob, const void *data, size_t size,
                       tr_err *err)
{
    return check_blob(js, blob, data, size, err);
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
