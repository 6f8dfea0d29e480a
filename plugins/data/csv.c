/*
 * data = { plugin = "csv", path = "iris.csv" }: rows of numeric features with
 * one integer class label, from a .csv or gzip-compressed .csv.gz file.
 *
 * Everything is loaded into memory at create (features as float, labels as
 * int32); the last val_fraction of the rows validate.  Errors name the
 * file:line and say what was expected.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file APIs under strict C11 */

#include <trainrun/csv.h> /* the CSV reading trainrun prepare checks against */
#include <trainrun/mix.h>
#include <trainrun/plugin.h>

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"

struct csv_config {
    const char *path;
    int64_t label_column;
    int header;
    double val_fraction;
    const char *val_split;
    int64_t split_seed;
    double scale;
    int64_t classes;
};

static const char *const split_choices[] = {"tail", "random", NULL};

static const struct tr_option csv_options[] = {
    {TR_OPT_STRING, "path", NULL, 0, 0, NULL,
     "required: the .csv or .csv.gz file, one sample per line, comma-separated numbers "
     "(relative paths are relative to the current directory)",
     offsetof(struct csv_config, path)},
    {TR_OPT_INT, "label_column", "-1", -1, 1048576, NULL,
     "column holding the integer class label, numbered from 0; -1 is the last column. "
     "Every other column is a feature",
     offsetof(struct csv_config, label_column)},
    {TR_OPT_BOOL, "header", "false", 0, 0, NULL,
     "the first line holds column names and is skipped",
     offsetof(struct csv_config, header)},
    {TR_OPT_FLOAT, "val_fraction", "0.1", 0, 0.5, NULL,
     "fraction of the rows used for validation",
     offsetof(struct csv_config, val_fraction)},
    {TR_OPT_ENUM, "val_split", "tail", 0, 0, split_choices,
     "which rows validate: \"tail\", the last rows of the file; \"random\", rows drawn by "
     "split_seed (use it when the file is ordered, e.g. by writer or date)",
     offsetof(struct csv_config, val_split)},
    {TR_OPT_INT, "split_seed", "0", 0, 9007199254740991.0, NULL,
     "seed of the random split; fixed apart from the run's seed so the validation rows stay "
     "the same across runs",
     offsetof(struct csv_config, split_seed)},
    {TR_OPT_FLOAT, "scale", "1.0", 0, 0, NULL,
     "every feature is multiplied by this as it is loaded (e.g. 0.00392 for 0..255 pixels)",
     offsetof(struct csv_config, scale)},
    {TR_OPT_INT, "classes", "0", 0, INT32_MAX, NULL,
     "number of classes; labels must be below it. 0: one more than the largest label",
     offsetof(struct csv_config, classes)},
    {.type = TR_OPT_END},
};

struct csv {
    uint32_t features;  /* per row */
    uint32_t classes;
    uint64_t rows;
    uint64_t start[TR_SPLIT_COUNT]; /* first row of each split */
    uint64_t samples[TR_SPLIT_COUNT];
    float *x;           /* rows * features */
    int32_t *y;         /* rows */
};

static void csv_destroy(void *self)
{
    struct csv *c = self;
    if (!c)
        return;
    free(c->x);
    free(c->y);
    free(c);
}

/* Append one row's storage, doubling the arrays as needed. */
static int grow_rows(struct csv *c, uint64_t *row_cap)
{
    if (c->rows < *row_cap)
        return 1;
    uint64_t grown = *row_cap ? *row_cap * 2 : 1024;
    float *x = realloc(c->x, grown * c->features * sizeof *x);
    if (!x)
        return 0;
    c->x = x;
    int32_t *y = realloc(c->y, grown * sizeof *y);
    if (!y)
        return 0;
    c->y = y;
    *row_cap = grown;
    return 1;
}

/* What loading has learnt so far: the columns from the first data line,
 * the largest label. */
struct load_state {
    const struct csv_config *cfg;
    size_t expected;       /* fields per line, from the first data line */
    size_t label_col;
    long first_data_line;
    int64_t max_label;
    uint64_t row_cap;
};

/* A data line's field count: the first fixes the columns, the others must
 * match it. */
static int check_columns(struct csv *c, struct load_state *st, size_t n, long lineno,
                         tr_err *err)
{
    const char *path = st->cfg->path;
    if (st->expected != 0) {
        if (n != st->expected)
            return tr_fail(err,
                           "csv data: %s:%ld: expected %zu fields (as on line %ld), got %zu; every "
                           "row needs the same number of comma-separated values",
                           path, lineno, st->expected, st->first_data_line, n);
        return TR_OK;
    }
    if (n < 2)
        return tr_fail(err,
                       "csv data: %s:%ld: found 1 field; each line needs at least one feature "
                       "and a label, separated by commas",
                       path, lineno);
    st->label_col = st->cfg->label_column < 0 ? n - 1 : (size_t)st->cfg->label_column;
    if (st->label_col >= n)
        return tr_fail(err,
                       "csv data: label_column = %lld but %s:%ld has only %zu columns "
                       "(numbered from 0; -1 means the last)",
                       (long long)st->cfg->label_column, path, lineno, n);
    if (n - 1 > UINT32_MAX)
        return tr_fail(err, "csv data: %s:%ld: too many columns (%zu)", path, lineno, n);
    st->expected = n;
    st->first_data_line = lineno;
    c->features = (uint32_t)(n - 1);
    return TR_OK;
}

/* The label column's value v: a class index, below classes when given. */
static int check_label(const struct load_state *st, const char *field, double v, long lineno,
                       tr_err *err)
{
    const char *path = st->cfg->path;
    if (v < 0)
        return tr_fail(err,
                       "csv data: %s:%ld: label \"%s\" is negative; labels are class "
                       "indices 0, 1, 2, ... (is label_column right?)",
                       path, lineno, field);
    if (v != floor(v) || v > INT32_MAX)
        return tr_fail(err,
                       "csv data: %s:%ld: label \"%s\" is not an integer class index "
                       "(is label_column right?)",
                       path, lineno, field);
    if (st->cfg->classes > 0 && v >= (double)st->cfg->classes)
        return tr_fail(err,
                       "csv data: %s:%ld: label %s is not below classes = %lld; raise "
                       "classes or fix the label",
                       path, lineno, field, (long long)st->cfg->classes);
    return TR_OK;
}

/* One data line's fields into the next row: the features scaled, the label
 * checked. */
static int store_row(struct csv *c, struct load_state *st, char **fields, size_t n, long lineno,
                     tr_err *err)
{
    const char *path = st->cfg->path;
    double scale = st->cfg->scale;
    float *x = c->x + c->rows * c->features;
    for (size_t k = 0; k < n; k++) {
        double v;
        if (!tr_csv_number(fields[k], &v))
            return tr_fail(err, "csv data: %s:%ld: column %zu%s \"%s\" is not a number", path,
                           lineno, k, k == st->label_col ? " (the label)" : "", fields[k]);
        if (k != st->label_col) {
            /* features are floats: 1e39, or 1e30 with scale = 1e10, would
             * train on infinity */
            float feature = (float)(v * scale);
            if (!isfinite(feature))
                return tr_fail(err,
                               "csv data: %s:%ld: column %zu \"%s\" times scale = %g is beyond "
                               "what a float holds (|x| <= 3.4e38); fix the value or data.scale",
                               path, lineno, k, fields[k], scale);
            *x++ = feature;
            continue;
        }
        if (check_label(st, fields[k], v, lineno, err) != TR_OK)
            return TR_ERROR;
        c->y[c->rows] = (int32_t)v;
        if ((int64_t)v > st->max_label)
            st->max_label = (int64_t)v;
    }
    c->rows++;
    return TR_OK;
}

/* After the last line: the file read whole, some rows, the classes. */
static int finish_load(struct csv *c, const struct load_state *st, const struct tr_host *host,
                       gzFile f, tr_err *err)
{
    const char *path = st->cfg->path;
    int zerr;
    const char *zmsg = data_gz_message(f, path, &zerr);
    if (zerr != Z_OK)
        return tr_fail(err, "csv data: cannot read %s: %s (is the .gz file complete?)", path,
                       zerr == Z_ERRNO ? strerror(errno) : zmsg);
    if (c->rows == 0)
        return tr_fail(err, "csv data: %s has no data rows%s; point data.path at a CSV file",
                       path, st->cfg->header ? " (only a header, or nothing)" : "");
    c->classes = st->cfg->classes > 0 ? (uint32_t)st->cfg->classes
                                      : (uint32_t)(st->max_label + 1);
    if (c->classes < 2 && host && host->log)
        host->log(TR_LOG_WARN, "csv", "%s: every label is 0, so there is only one class",
                  path);
    return TR_OK;
}

/* Parse the whole file into c.  Returns TR_OK or fills err. */
static int load(struct csv *c, const struct csv_config *cfg, const struct tr_host *host,
                gzFile f, tr_err *err)
{
    const char *path = cfg->path;
    char *line = NULL, **fields = NULL;
    size_t line_cap = 0, fields_cap = 0;
    struct load_state st = {.cfg = cfg, .max_label = -1};
    int header_pending = cfg->header;
    int rc = TR_ERROR;

    for (long lineno = 1;; lineno++) {
        int got = tr_csv_read_line(f, &line, &line_cap);
        if (got < 0) {
            tr_fail(err, "csv data: out of memory reading %s", path);
            goto out;
        }
        if (got == 0)
            break;
        if (tr_csv_is_blank(line))
            continue;
        if (header_pending) {
            header_pending = 0;
            continue;
        }
        size_t n = tr_csv_split(line, &fields, &fields_cap);
        if (n == (size_t)-1) {
            tr_fail(err, "csv data: out of memory reading %s", path);
            goto out;
        }
        if (check_columns(c, &st, n, lineno, err) != TR_OK)
            goto out;
        if (!grow_rows(c, &st.row_cap)) {
            tr_fail(err, "csv data: out of memory loading %s (%llu rows so far)", path,
                    (unsigned long long)c->rows);
            goto out;
        }
        if (store_row(c, &st, fields, n, lineno, err) != TR_OK)
            goto out;
    }
    rc = finish_load(c, &st, host, f, err);
out:
    free(line);
    free(fields);
    return rc;
}

/* Fisher-Yates over the rows with a splitmix64 stream: the same seed gives
 * the same split on every machine. */
static void shuffle_rows(struct csv *c, uint64_t seed)
{
    uint64_t state = seed;
    size_t f = c->features;
    for (uint64_t i = c->rows; i > 1; i--) {
        uint64_t j = tr_splitmix64_next(&state) % i;
        if (j == i - 1)
            continue;
        for (size_t k = 0; k < f; k++) {
            float t = c->x[(i - 1) * f + k];
            c->x[(i - 1) * f + k] = c->x[j * f + k];
            c->x[j * f + k] = t;
        }
        int32_t t = c->y[i - 1];
        c->y[i - 1] = c->y[j];
        c->y[j] = t;
    }
}

static int csv_create(const struct tr_host *host, const void *config,
                      const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)args;
    const struct csv_config *cfg = config;

    int errnum = 0;
    gzFile f = data_gzopen(cfg->path, &errnum);
    if (!f)
        return errnum ? data_fail_open(err, "csv", "path", cfg->path, errnum)
                      : tr_fail(err, "csv data: out of memory opening %s", cfg->path);
    struct csv *c = calloc(1, sizeof *c);
    if (!c) {
        gzclose(f);
        return tr_fail(err, "csv data: out of memory");
    }
    int rc = load(c, cfg, host, f, err);
    gzclose(f);
    if (rc != TR_OK) {
        csv_destroy(c);
        return rc;
    }

    if (strcmp(cfg->val_split, "random") == 0)
        shuffle_rows(c, (uint64_t)cfg->split_seed);
    uint64_t val_rows = (uint64_t)((double)c->rows * cfg->val_fraction);
    uint64_t train_rows = c->rows - val_rows;
    if (train_rows == 0) {
        csv_destroy(c);
        return tr_fail(err, "csv data: %s leaves no training rows; lower val_fraction",
                       cfg->path);
    }
    if (val_rows == 0 && cfg->val_fraction > 0 && host && host->log)
        host->log(TR_LOG_WARN, "csv",
                  "%s: val_fraction = %g of %llu rows is less than one row; no validation",
                  cfg->path, cfg->val_fraction, (unsigned long long)c->rows);
    c->start[TR_SPLIT_TRAIN] = 0;
    c->start[TR_SPLIT_VAL] = train_rows;
    c->samples[TR_SPLIT_TRAIN] = train_rows;
    c->samples[TR_SPLIT_VAL] = val_rows;
    *self = c;
    return TR_OK;
}

static int csv_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)err;
    const struct csv *c = self;
    return data_info(out, c->samples, TR_F32, c->features, 1, c->classes);
}

static int csv_read(void *self, enum tr_split split, const uint64_t *indices, size_t n,
                    void *inputs, int32_t *targets, tr_err *err)
{
    const struct csv *c = self;
    if (data_check_read(err, "csv", split, c->samples, indices, n) != TR_OK)
        return TR_ERROR;
    float *x = inputs;
    for (size_t i = 0; i < n; i++) {
        uint64_t row = c->start[split] + indices[i];
        memcpy(x + i * c->features, c->x + row * c->features, c->features * sizeof *x);
        targets[i] = c->y[row];
    }
    return TR_OK;
}

static const struct tr_data_vtable csv_vtable = {
    .struct_size = sizeof(struct tr_data_vtable),
    .info = csv_info,
    .read = csv_read,
};

static const struct tr_plugin_info csv_plugin_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_DATA,
    .name = "csv",
    .version = "0.1.0",
    .description = "numeric features and an integer class label per row, from .csv or .csv.gz",
    .options = csv_options,
    .config_size = sizeof(struct csv_config),
    .create = csv_create,
    .destroy = csv_destroy,
    .vtable = &csv_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &csv_plugin_info;
}
