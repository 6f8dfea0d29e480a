/*
 * logger = { "csv" }: the run's scalars as RUN/metrics.csv, one row per
 * logged step, for spreadsheets and pandas.read_csv.
 *
 * The columns are fixed when the file is started, since a CSV header cannot
 * grow once rows follow it: `step`, then the `columns` option (by default
 * every scalar trainrun logs).  A training row and a validation row of the
 * same step are separate rows, each leaving the other's cells empty.  A
 * scalar outside the columns is not written, with a warning naming it once
 * (add it to `columns`).  A resumed run appends below the earlier rows when
 * the header is the same and refuses, naming the file, when it is not.
 * Rows are written whole with one write(2), as metrics.jsonl's lines are:
 * a reader during the run sees whole rows, and a row torn by a kill is cut
 * when the run resumes.
 */
#include <trainrun/plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CSV_MAX_COLUMNS 64

struct csv_config {
    const char *file;
    const char *columns;
};

static const struct tr_option csv_options[] = {
    {TR_OPT_STRING, "file", "metrics.csv", 0, 0, NULL,
     "the CSV file, relative to the run directory", offsetof(struct csv_config, file)},
    {TR_OPT_STRING, "columns",
     "loss,lr,grad_norm,tokens_per_s,mfu,data_wait_pct,comm_wait_pct,loss_scale,skipped_steps,cost_usd,"
     "cost_projected_usd,elapsed_s,val_loss,val_accuracy,val_loss_per_byte",
     0, 0, NULL, "the columns after step, comma-separated; a row leaves the cells it lacks empty",
     offsetof(struct csv_config, columns)},
    {.type = TR_OPT_END},
};

struct csv {
    const struct tr_host *host;
    char path[4400];
    char *names[CSV_MAX_COLUMNS];
    int n;
    char *warned; /* "\n"-separated names already warned about */
    char header[4096];
    int fd;
    off_t good; /* the file up to here holds whole rows */
};

static int csv_create(const struct tr_host *host, const void *config,
                      const struct tr_create_args *args, void **self, tr_err *err)
{
    const struct csv_config *cfg = config;
    if (!*cfg->file || strstr(cfg->file, ".."))
        return tr_fail(err, "file \"%s\" must name a file inside the run directory", cfg->file);
    struct csv *c = calloc(1, sizeof *c);
    if (!c)
        return tr_fail(err, "out of memory");
    c->host = host;
    c->fd = -1;
    if (cfg->file[0] == '/')
        snprintf(c->path, sizeof c->path, "%s", cfg->file);
    else
        snprintf(c->path, sizeof c->path, "%s/%s", args->run_dir, cfg->file);
    /* columns: names of letters, digits, '_', '.', '/', '-' (no quoting needed) */
    size_t hlen = (size_t)snprintf(c->header, sizeof c->header, "step");
    const char *p = cfg->columns;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || c->n == CSV_MAX_COLUMNS) {
            for (int i = 0; i < c->n; i++)
                free(c->names[i]);
            free(c);
            return tr_fail(err, "columns \"%s\": %s", cfg->columns,
                           len ? "more than 64 columns" : "an empty name; write names "
                           "separated by single commas");
        }
        for (size_t i = 0; i < len; i++) {
            char ch = p[i];
            if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '_' || ch == '.' || ch == '/' || ch == '-')) {
                for (int k = 0; k < c->n; k++)
                    free(c->names[k]);
                free(c);
                return tr_fail(err, "columns \"%s\": '%c' in a column name; names are letters, "
                               "digits, '_', '.', '/' and '-'", cfg->columns, ch);
            }
        }
        c->names[c->n] = strndup(p, len);
        hlen += (size_t)snprintf(c->header + hlen, hlen < sizeof c->header ? sizeof c->header - hlen : 0,
                                 ",%.*s", (int)len, p);
        c->n++;
        p += len + (end ? 1 : 0);
        if (end && !*p) {
            for (int k = 0; k < c->n; k++)
                free(c->names[k]);
            free(c);
            return tr_fail(err, "columns \"%s\" ends in a comma", cfg->columns);
        }
    }
    if (hlen + 2 >= sizeof c->header) {
        for (int k = 0; k < c->n; k++)
            free(c->names[k]);
        free(c);
        return tr_fail(err, "columns \"%s\" is too long", cfg->columns);
    }
    strcat(c->header, "\n");
    *self = c;
    return TR_OK;
}

static int write_all(int fd, const char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

static int failed(struct csv *c, tr_err *err)
{
    int e = errno;
    /* cut what landed of the row (EINVAL: not a regular file, nothing to cut) */
    if (c->fd >= 0 && ftruncate(c->fd, c->good) != 0 && errno != EINVAL)
        c->host->log(TR_LOG_WARN, "csv", "%s may end in a torn row", c->path);
    return tr_fail(err, "cannot write %s: %s; free space on its disk, or drop \"csv\" from logger",
                   c->path, strerror(e));
}

static int csv_open(void *self, int resume, tr_err *err)
{
    struct csv *c = self;
    c->fd = open(c->path, O_RDWR | O_CREAT | O_CLOEXEC | O_APPEND | (resume ? 0 : O_TRUNC), 0666);
    if (c->fd < 0)
        return tr_fail(err, "cannot write %s: %s", c->path, strerror(errno));
    off_t end = lseek(c->fd, 0, SEEK_END);
    if (end <= 0) {
        c->good = 0;
        if (write_all(c->fd, c->header, strlen(c->header)) != 0)
            return failed(c, err);
        c->good = (off_t)strlen(c->header);
        return TR_OK;
    }
    /* resuming: the same header, and whole rows only */
    size_t hlen = strlen(c->header);
    char head[4096];
    ssize_t got = pread(c->fd, head, hlen, 0);
    if (got != (ssize_t)hlen || memcmp(head, c->header, hlen) != 0)
        return tr_fail(err, "%s was started with other columns than this run writes (step,%s...): "
                       "give the csv logger the earlier run's columns, or move the file away",
                       c->path, c->n ? c->names[0] : "");
    char tail[65536];
    off_t from = end > (off_t)sizeof tail ? end - (off_t)sizeof tail : 0;
    ssize_t n = pread(c->fd, tail, (size_t)(end - from), from);
    c->good = end;
    if (n > 0 && tail[n - 1] != '\n') {
        ssize_t i = n - 1;
        while (i >= 0 && tail[i] != '\n')
            i--;
        off_t keep = i >= 0 ? from + i + 1 : from;
        if (ftruncate(c->fd, keep) != 0)
            return failed(c, err);
        c->host->log(TR_LOG_WARN, "csv", "%s ended in a torn row (from a run killed mid-write); "
                     "dropped it", c->path);
        c->good = keep;
    }
    return TR_OK;
}

static void warn_once(struct csv *c, const char *name)
{
    size_t len = strlen(name);
    for (const char *w = c->warned; w && *w;) {
        const char *nl = strchr(w, '\n');
        if ((size_t)(nl - w) == len && memcmp(w, name, len) == 0)
            return;
        w = nl + 1;
    }
    size_t have = c->warned ? strlen(c->warned) : 0;
    char *grown = realloc(c->warned, have + len + 2);
    if (!grown)
        return;
    memcpy(grown + have, name, len);
    grown[have + len] = '\n';
    grown[have + len + 1] = 0;
    c->warned = grown;
    c->host->log(TR_LOG_WARN, "csv", "%s has no column \"%s\": it is not written there (add it "
                 "to the csv logger's columns)", c->path, name);
}

static int csv_scalars(void *self, uint64_t step, const struct tr_scalar *v, size_t n, tr_err *err)
{
    struct csv *c = self;
    char row[8192];
    size_t len = (size_t)snprintf(row, sizeof row, "%llu", (unsigned long long)step);
    for (int k = 0; k < c->n; k++) {
        const struct tr_scalar *found = NULL;
        for (size_t i = 0; i < n && !found; i++)
            if (strcmp(v[i].name, c->names[k]) == 0)
                found = &v[i];
        if (found)
            len += (size_t)snprintf(row + len, sizeof row - len, ",%.9g", found->value);
        else
            len += (size_t)snprintf(row + len, sizeof row - len, ",");
        if (len >= sizeof row - 2)
            return tr_fail(err, "a row of %s is longer than %zu bytes", c->path, sizeof row);
    }
    for (size_t i = 0; i < n; i++) {
        int known = 0;
        for (int k = 0; k < c->n && !known; k++)
            known = strcmp(v[i].name, c->names[k]) == 0;
        if (!known)
            warn_once(c, v[i].name);
    }
    row[len++] = '\n';
    if (write_all(c->fd, row, len) != 0)
        return failed(c, err);
    c->good += (off_t)len;
    return TR_OK;
}

static int csv_close(void *self, tr_err *err)
{
    struct csv *c = self;
    if (c->fd < 0)
        return TR_OK;
    int bad = fsync(c->fd) != 0;
    int e = errno;
    if (close(c->fd) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    c->fd = -1;
    return bad ? tr_fail(err, "cannot write %s: %s", c->path, strerror(e)) : TR_OK;
}

static void csv_destroy(void *self)
{
    struct csv *c = self;
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    for (int k = 0; k < c->n; k++)
        free(c->names[k]);
    free(c->warned);
    free(c);
}

static const struct tr_logger_vtable csv_vtable = {
    .struct_size = sizeof(struct tr_logger_vtable),
    .open = csv_open,
    .scalars = csv_scalars,
    .close = csv_close,
};

static const struct tr_plugin_info csv_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_LOGGER,
    .name = "csv",
    .version = "0.1.0",
    .description = "the run's scalars as RUN/metrics.csv, a header and one row per logged step",
    .options = csv_options,
    .config_size = sizeof(struct csv_config),
    .create = csv_create,
    .destroy = csv_destroy,
    .vtable = &csv_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &csv_info;
}
