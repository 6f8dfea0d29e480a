/*
 * `trainrun prepare --format csv` (see dataset.h): the rows are checked as
 * the csv data plugin checks them (the same number of fields everywhere,
 * every field a number), exact duplicate rows are dropped unless
 * --dedup none, and a cleaned copy (fields trimmed, no blank lines, "\n"
 * line ends) is written as OUTDIR/data.csv, with prepare.json beside it.
 * The command line is commands/prepare.c's, the output directory prepare_output.c's.
 */
#include "dataset.h"

#include "dedup.h"
#include "prepare_internal.h"

#include "../util/util.h"

#include <trainrun/input.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* the csv data source's reading of a line: what prepare checks is what the
 * plugin will take */
#include <trainrun/csv.h>

#define CSV_ERRORS_SHOWN 10

struct csv_state {
    const struct prepare_opts *o;
    FILE *out;
    char out_path[4096];
    size_t fields;            /* per row, from the first data row */
    const char *fields_from;  /* where that row is, for messages */
    long fields_line;
    size_t rows_read, rows_written, duplicates, errors, blank;
    /* kept rows as written (for exact dedup): offsets into `kept` */
    char *kept;
    size_t kept_len, kept_cap;
    size_t *slots;            /* open addressing: row number + 1 */
    size_t slot_mask;
    size_t *row_at;           /* offset of each kept row in `kept` */
    uint64_t *row_hash;
    const char **row_file;
    long *row_line;
    size_t rows_cap;
    int shown;
    char **split;             /* the fields of the current line */
    size_t split_cap;
};

static int csv_error(struct csv_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int csv_error(struct csv_state *s, const char *fmt, ...)
{
    if (s->errors++ < CSV_ERRORS_SHOWN) {
        va_list ap;
        va_start(ap, fmt);
        tr_prepare_vfail(fmt, ap);
        va_end(ap);
    }
    return 0;
}

/* A number the csv plugin can hold: it stores features as float, so 1e39,
 * finite as a double, would become infinity there. */
static int is_number(const char *s)
{
    double v;
    return tr_csv_number(s, &v) && fabs(v) <= FLT_MAX;
}

/* Remember a kept row for exact dedup; 1 if it is new, 0 if it repeats an
 * earlier one, -1 when out of memory. */
static int csv_remember(struct csv_state *s, const char *row, size_t len, const char *file,
                        long line)
{
    if (s->rows_written == s->rows_cap) { /* grow, and rebuild the table at half load */
        size_t cap = s->rows_cap ? s->rows_cap * 2 : 1024;
        size_t *at = realloc(s->row_at, cap * sizeof *at);
        if (at)
            s->row_at = at;
        uint64_t *h = realloc(s->row_hash, cap * sizeof *h);
        if (h)
            s->row_hash = h;
        const char **rf = realloc(s->row_file, cap * sizeof *rf);
        if (rf)
            s->row_file = rf;
        long *rl = realloc(s->row_line, cap * sizeof *rl);
        if (rl)
            s->row_line = rl;
        size_t slots_n = table_size_for(cap);
        size_t *slots = calloc(slots_n, sizeof *slots);
        if (!at || !h || !rf || !rl || !slots) {
            free(slots);
            return -1;
        }
        s->rows_cap = cap;
        free(s->slots);
        s->slots = slots;
        s->slot_mask = slots_n - 1;
        for (size_t i = 0; i < s->rows_written; i++) {
            size_t k = (size_t)tr_mix64(s->row_hash[i]) & s->slot_mask;
            while (s->slots[k])
                k = (k + 1) & s->slot_mask;
            s->slots[k] = i + 1;
        }
    }
    uint64_t hash = fnv1a(FNV_OFFSET, (const unsigned char *)row, len);
    size_t k = (size_t)tr_mix64(hash) & s->slot_mask;
    for (; s->slots[k]; k = (k + 1) & s->slot_mask) {
        size_t j = s->slots[k] - 1;
        const char *other = s->kept + s->row_at[j];
        if (s->row_hash[j] == hash && strcmp(other, row) == 0) {
            if (s->shown == 0)
                printf("trainrun prepare: duplicate rows (the first %d shown):\n",
                       SAMPLES_SHOWN);
            if (s->shown++ < SAMPLES_SHOWN)
                printf("  %s:%ld \"%.60s%s\"\n    repeats %s:%ld\n", file, line, row,
                       len > 60 ? "..." : "", s->row_file[j], s->row_line[j]);
            return 0;
        }
    }
    if (s->kept_cap - s->kept_len < len + 1) {
        size_t cap = s->kept_cap ? s->kept_cap : 1 << 16;
        while (cap - s->kept_len < len + 1)
            cap *= 2;
        char *grown = realloc(s->kept, cap);
        if (!grown)
            return -1;
        s->kept = grown;
        s->kept_cap = cap;
    }
    size_t i = s->rows_written;
    s->row_at[i] = s->kept_len;
    s->row_hash[i] = hash;
    s->row_file[i] = file;
    s->row_line[i] = line;
    memcpy(s->kept + s->kept_len, row, len + 1);
    s->kept_len += len + 1;
    s->slots[k] = i + 1;
    return 1;
}

/* Check and clean one line (in place, without its line ending); write it
 * when it is a new row. */
static int csv_line(struct csv_state *s, char *line, const char *file, long lineno,
                    int is_header)
{
    size_t len = strlen(line);
    if (tr_csv_is_blank(line)) {
        s->blank++;
        return 0;
    }
    /* Clean: fields trimmed, joined by commas, into a fresh buffer. */
    char *clean = malloc(len + 1);
    size_t n = clean ? tr_csv_split(line, &s->split, &s->split_cap) : (size_t)-1;
    if (n == (size_t)-1) {
        free(clean);
        return tr_prepare_fail("out of memory reading %s", file);
    }
    size_t o = 0;
    int bad = 0;
    for (size_t k = 0; k < n; k++) {
        const char *field = s->split[k];
        if (!is_header && !bad && !is_number(field)) {
            double v = strtod(field, NULL);
            csv_error(s, "%s:%ld: column %zu \"%s\" is %s", file, lineno, k, field,
                      isfinite(v) && fabs(v) > FLT_MAX ? "beyond what a float holds "
                                                         "(|x| <= 3.4e38)" : "not a number");
            bad = 1;
        }
        o += (size_t)sprintf(clean + o, "%s%s", k ? "," : "", field);
    }
    if (s->fields == 0) {
        if (n < 2) {
            csv_error(s, "%s:%ld: found 1 field; each line needs at least one feature and a "
                         "label, separated by commas", file, lineno);
            free(clean);
            return 0;
        }
        s->fields = n;
        s->fields_from = file;
        s->fields_line = lineno;
    } else if (n != s->fields) {
        csv_error(s, "%s:%ld: expected %zu fields (as on %s:%ld), got %zu; every row needs the "
                     "same number of comma-separated values",
                  file, lineno, s->fields, s->fields_from, s->fields_line, n);
        bad = 1;
    }
    int rc = 0;
    if (!is_header)
        s->rows_read++;
    if (!bad && s->errors == 0) {
        int dedup = strcmp(s->o->dedup, "none") != 0;
        int fresh = is_header || !dedup ? 1 : csv_remember(s, clean, o, file, lineno);
        if (fresh < 0)
            rc = tr_prepare_fail("out of memory reading %s", file);
        else if (fresh == 0)
            s->duplicates++;
        else if (fprintf(s->out, "%s\n", clean) < 0)
            rc = tr_prepare_fail("cannot write %s: %s", s->out_path, strerror(errno));
        else if (!is_header)
            s->rows_written++;
    }
    free(clean);
    return rc;
}

/* Input i, line by line into csv_line (the first input's header kept, the others'
 * dropped); *line and *cap are the line buffer, kept across inputs.  0 or -1. */
static int read_csv_input(struct csv_state *s, int i, char **line, size_t *cap)
{
    const struct prepare_opts *o = s->o;
    const char *file = o->inputs[i];
    int fd = tr_input_open(file); /* a regular file: a FIFO would block forever */
    gzFile f = fd >= 0 ? gzdopen(fd, "rb") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return tr_prepare_fail("cannot open %s: %s", file,
                               fd >= 0 ? "out of memory" : tr_input_strerror(e));
    }
    int rc = 0;
    int header_pending = o->header;
    for (long lineno = 1; rc == 0; lineno++) {
        int got = tr_csv_read_line(f, line, cap);
        if (got < 0)
            rc = tr_prepare_fail("out of memory reading %s", file);
        if (got <= 0)
            break;
        int is_header = header_pending && (*line)[strspn(*line, " \t\r\n")] != '\0';
        if (is_header)
            header_pending = 0;
        if (is_header && i > 0)
            continue; /* the first input's header names the columns */
        rc = csv_line(s, *line, file, lineno, is_header);
    }
    int zerr;
    const char *msg = gzerror(f, &zerr);
    if (rc == 0 && zerr != Z_OK && zerr != Z_STREAM_END)
        rc = tr_prepare_fail("cannot read %s: %s (is the .gz file complete?)", file,
                  zerr == Z_ERRNO ? strerror(errno) : msg);
    gzclose(f);
    return rc;
}

/* OUTDIR/prepare.json of a CSV prepare.  0 or -1. */
static int write_csv_json(const struct csv_state *s)
{
    const struct prepare_opts *o = s->o;
    char path[4096], jtmp[4200];
    snprintf(path, sizeof path, "%s/prepare.json", o->out_dir);
    snprintf(jtmp, sizeof jtmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(jtmp, "w");
    if (!f)
        return tr_prepare_fail("cannot create %s: %s", jtmp, strerror(errno));
    fputs("{\n  \"format\": \"csv\",\n", f);
    tr_prepare_json_inputs(f, o);
    fprintf(f,
            "  \"output\": \"data.csv\",\n  \"header\": %s,\n  \"columns\": %zu,\n"
            "  \"dedup\": \"%s\",\n  \"rows\": {\"read\": %zu, \"written\": %zu, "
            "\"duplicates_removed\": %zu, \"blank_lines\": %zu}\n}\n",
            o->header ? "true" : "false", s->fields,
            strcmp(o->dedup, "none") ? "exact" : "none", s->rows_read, s->rows_written,
            s->duplicates, s->blank);
    return tr_prepare_publish(jtmp, path, f);
}

int tr_prepare_csv(const struct prepare_opts *o)
{
    struct csv_state s = {.o = o};
    if (tr_mkdir_p(o->out_dir) != 0)
        return tr_prepare_fail("cannot create the output directory %s: %s", o->out_dir, strerror(errno));
    if (tr_prepare_claim_out_dir(o->out_dir) != 0)
        return -1;
    snprintf(s.out_path, sizeof s.out_path, "%s/data.csv", o->out_dir);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", s.out_path, (long)getpid());
    s.out = fopen(tmp, "w");
    if (!s.out)
        return tr_prepare_fail("cannot create %s: %s", tmp, strerror(errno));
    if (strcmp(o->dedup, "near") == 0)
        printf("trainrun prepare: near dedup applies to text; CSV rows get exact dedup\n");

    int rc = 0;
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < o->n_inputs && rc == 0; i++)
        rc = read_csv_input(&s, i, &line, &cap);
    free(line);
    if (rc == 0 && s.errors > 0)
        rc = tr_prepare_fail("%zu row%s of the input%s cannot be used%s; nothing was written", s.errors,
                  s.errors == 1 ? "" : "s", o->n_inputs == 1 ? "" : "s",
                  s.errors > CSV_ERRORS_SHOWN ? " (the first ones are shown above)" : "");
    if (rc == 0 && s.rows_written == 0)
        rc = tr_prepare_fail("no data rows in the input%s", o->n_inputs == 1 ? "" : "s");
    if (rc != 0) {
        fclose(s.out);
        unlink(tmp);
    } else {
        rc = tr_prepare_publish(tmp, s.out_path, s.out);
    }
    if (rc == 0)
        rc = write_csv_json(&s);
    if (rc == 0)
        printf("trainrun prepare: %zu rows of %zu columns read, %zu duplicate%s removed, %zu "
               "written to %s (and prepare.json)\n",
               s.rows_read, s.fields, s.duplicates, s.duplicates == 1 ? "" : "s",
               s.rows_written, s.out_path);
    free(s.kept);
    free(s.slots);
    free(s.row_at);
    free(s.row_hash);
    free(s.row_file);
    free(s.row_line);
    free(s.split);
    return rc;
}
