/* `trainrun report`: read metrics.jsonl, draw the curves with the raster
 * plotter of plot.c (anti-aliased lines, 1-2-5 ticks, a bitmap font) and
 * write them as PNG files, plus an index.html and a summary. */
#include "report.h"

#include "../plot/plot.h"
#include "../util/json.h"
#include "../engine/run.h"
#include "../util/util.h"

#include <trainrun/input.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ---- metrics.jsonl ------------------------------------------------------ */

struct metrics {
    struct series loss, val_loss, val_accuracy, lr, tokens_per_s, data_wait, cost, mfu;
    struct series comm_wait; /* data parallel: % of the step waiting for collectives */
    struct series val_loss_per_byte; /* text data: nats per byte, across tokenizers */
    double last_step;   /* the highest step logged */
    double time_s;      /* wall time over all segments of a resumed run */
    int has_time;
};

static void series_add(struct series *s, double x, double y, size_t order)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->p = tr_xrealloc(s->p, s->cap * sizeof *s->p);
    }
    s->p[s->n++] = (struct point){x, y, order};
}

static int by_step_then_order(const void *a, const void *b)
{
    const struct point *p = a, *q = b;
    if (p->x != q->x)
        return p->x < q->x ? -1 : 1;
    return p->order < q->order ? -1 : p->order > q->order;
}

/* A resumed run logs some steps again: sort by step and keep the newest
 * value of each step. */
static void series_settle(struct series *s)
{
    if (s->n < 2)
        return;
    qsort(s->p, s->n, sizeof *s->p, by_step_then_order);
    size_t kept = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (kept && s->p[kept - 1].x == s->p[i].x)
            s->p[kept - 1] = s->p[i];
        else
            s->p[kept++] = s->p[i];
    }
    s->n = kept;
}

#define METRICS_SERIES 10

static void metrics_series(struct metrics *m, struct series *all[METRICS_SERIES])
{
    struct series *list[METRICS_SERIES] = {&m->loss, &m->val_loss, &m->val_accuracy, &m->lr,
                                           &m->tokens_per_s, &m->data_wait, &m->cost, &m->mfu,
                                           &m->val_loss_per_byte, &m->comm_wait};
    memcpy(all, list, sizeof list);
}

static void metrics_free(struct metrics *m)
{
    struct series *all[METRICS_SERIES];
    metrics_series(m, all);
    for (int i = 0; i < METRICS_SERIES; i++)
        free(all[i]->p);
}

/* The number under key, if it is one that can be plotted. */
static int number_at(const struct tr_json *obj, const char *key, double *out)
{
    const struct tr_json *v = tr_json_get(obj, key);
    if (!v || v->type != TR_JSON_NUMBER || !(fabs(v->number) < 1e300))
        return 0;
    *out = v->number;
    return 1;
}

/* elapsed_s restarts with each process: a drop starts a new segment. */
struct elapsed {
    double segment_start_time, previous_elapsed;
};

/* One line with a step, the order-th: each metric it has into its series. */
static void add_record(struct metrics *m, const struct tr_json *obj, double step, size_t order,
                       struct elapsed *e)
{
    double v;
    if (step > m->last_step)
        m->last_step = step;
    if (number_at(obj, "loss", &v))
        series_add(&m->loss, step, v, order);
    if (number_at(obj, "lr", &v))
        series_add(&m->lr, step, v, order);
    if (number_at(obj, "tokens_per_s", &v))
        series_add(&m->tokens_per_s, step, v, order);
    if (number_at(obj, "data_wait_pct", &v))
        series_add(&m->data_wait, step, v, order);
    if (number_at(obj, "comm_wait_pct", &v))
        series_add(&m->comm_wait, step, v, order);
    if (number_at(obj, "cost_usd", &v))
        series_add(&m->cost, step, v, order);
    if (number_at(obj, "mfu", &v) && v >= 0) /* -1: no peak FLOP/s was known */
        series_add(&m->mfu, step, v, order);
    if (number_at(obj, "val_loss", &v))
        series_add(&m->val_loss, step, v, order);
    if (number_at(obj, "val_loss_per_byte", &v))
        series_add(&m->val_loss_per_byte, step, v, order);
    if (number_at(obj, "val_accuracy", &v) && v >= 0) /* -1: no accuracy */
        series_add(&m->val_accuracy, step, v, order);
    if (number_at(obj, "elapsed_s", &v)) {
        if (v < e->previous_elapsed)
            e->segment_start_time += e->previous_elapsed;
        e->previous_elapsed = v;
        m->time_s = e->segment_start_time + v;
        m->has_time = 1;
    }
}

/* Read path into m; 0, or -1 after printing an error naming path:line. */
static int metrics_read(const char *path, struct metrics *m)
{
    FILE *f = tr_input_fopen(path);
    if (!f) {
        fprintf(stderr, "trainrun: error: cannot read %s: %s\n", path, tr_input_strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0, order = 0;
    ssize_t len;
    struct elapsed elapsed = {0, -1};
    int status = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        int complete = len > 0 && line[len - 1] == '\n';
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = 0;
        if (len == 0)
            continue;
        size_t error_offset = 0;
        struct tr_json *obj = tr_json_parse(line, (size_t)len, &error_offset);
        if (!obj && !complete) {
            /* the run may be writing this line right now */
            fprintf(stderr, "trainrun: note: %s:%zu: incomplete last line ignored\n", path, lineno);
            break;
        }
        if (!obj || obj->type != TR_JSON_OBJECT) {
            if (obj)
                fprintf(stderr, "trainrun: error: %s:%zu: expected a JSON object per line\n", path, lineno);
            else
                fprintf(stderr, "trainrun: error: %s:%zu:%zu: malformed JSON\n", path, lineno,
                        error_offset + 1);
            tr_json_free(obj);
            status = -1;
            break;
        }
        double step;
        if (!number_at(obj, "step", &step)) {
            /* lines of other kinds may come later; they carry no step */
            tr_json_free(obj);
            continue;
        }
        order++;
        add_record(m, obj, step, order, &elapsed);
        tr_json_free(obj);
    }
    if (status == 0 && ferror(f)) {
        fprintf(stderr, "trainrun: error: %s:%zu: %s\n", path, lineno + 1, strerror(errno));
        status = -1;
    }
    free(line);
    fclose(f);
    if (status == 0 && order == 0) {
        fprintf(stderr, "trainrun: error: %s: no metrics yet (no line has a \"step\")\n", path);
        status = -1;
    }
    struct series *all[METRICS_SERIES];
    metrics_series(m, all);
    for (int i = 0; i < METRICS_SERIES; i++)
        series_settle(all[i]);
    return status;
}

/* ---- writing into OUTDIR without harming what else is there --------------------- */

/* What a report writes, and the marker saying a directory holds one. */
static const char *const report_files[] = {"index.html", "loss.png", "throughput.png",
                                           "cost.png", "lr.png"};
#define REPORT_MARK ".trainrun-report"

/* 1 when path is an index.html a report wrote (before the marker existed). */
static int is_report_index(const char *path)
{
    FILE *f = tr_input_fopen(path);
    char head[512] = "";
    size_t n = f ? fread(head, 1, sizeof head - 1, f) : 0;
    if (f)
        fclose(f);
    head[n] = '\0';
    return strstr(head, "<title>trainrun report: ") != NULL;
}

/* OUTDIR may be any directory (-o): the report's files there are replaced
 * only where a report was written before (its marker, or its index.html),
 * so a user's index.html or loss.png is never overwritten. */
static int claim_out_dir(const char *out)
{
    char *mark = tr_xasprintf("%s/" REPORT_MARK, out);
    char *index = tr_xasprintf("%s/index.html", out);
    struct stat st;
    int ours = (lstat(mark, &st) == 0 && S_ISREG(st.st_mode)) ||
               (lstat(index, &st) == 0 && S_ISREG(st.st_mode) && is_report_index(index));
    int rc = 0;
    for (size_t i = 0; !ours && rc == 0 && i < TR_ARRAY_LEN(report_files); i++) {
        char *p = tr_xasprintf("%s/%s", out, report_files[i]);
        if (lstat(p, &st) == 0) {
            fprintf(stderr, "trainrun: error: %s exists and was not written by trainrun report; "
                            "it is left untouched: pass -o with a new or empty directory\n", p);
            rc = -1;
        }
        free(p);
    }
    if (rc == 0) {
        int fd = open(mark, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "trainrun: error: cannot write %s: %s\n", mark, strerror(errno));
            rc = -1;
        } else {
            close(fd);
        }
    }
    free(index);
    free(mark);
    return rc;
}

/* A fresh temporary file beside path, renamed over it by out_close: a
 * symlink at path (a shared run directory) is replaced, never followed. */
static FILE *out_open(const char *path, char **tmp)
{
    *tmp = tr_xasprintf("%s.XXXXXX", path);
    int fd = mkstemp(*tmp);
    FILE *f = NULL;
    if (fd >= 0) {
        mode_t mask = umask(0); /* mkstemp makes it 0600 */
        umask(mask);
        fchmod(fd, 0666 & ~mask);
        if (!(f = fdopen(fd, "wb"))) {
            close(fd);
            unlink(*tmp);
        }
    }
    if (!f) {
        free(*tmp);
        *tmp = NULL;
    }
    return f;
}

/* Close and publish; on any error the temporary goes and -1 (errno set). */
static int out_close(FILE *f, char *tmp, const char *path, int bad)
{
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (!bad && rename(tmp, path) != 0) {
        bad = 1;
        e = errno;
    }
    if (bad)
        unlink(tmp);
    free(tmp);
    errno = e;
    return bad ? -1 : 0;
}

/* The canvas as a PNG at path, through a temporary file renamed over it. */
static int png_write(const char *path, const struct canvas *c)
{
    uint8_t *png;
    size_t png_len;
    int zrc = png_encode(c, &png, &png_len);
    if (zrc != Z_OK) {
        fprintf(stderr, "trainrun: error: %s: zlib could not compress the image (%d)\n", path, zrc);
        return -1;
    }
    char *tmp;
    FILE *f = out_open(path, &tmp);
    if (!f) {
        free(png);
        fprintf(stderr, "trainrun: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    int bad = fwrite(png, 1, png_len, f) != png_len;
    free(png);
    if (out_close(f, tmp, path, bad || ferror(f)) != 0) {
        fprintf(stderr, "trainrun: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- the report ------------------------------------------------------------------ */

struct report {
    const struct metrics *m;
    const char *out_dir;
    double x_lo, x_hi;         /* every chart shares the step axis */
    const char *written[8];    /* image names, for the index */
    int n_written;
    char skipped[512];         /* why some images are missing */
};

static void skip_image(struct report *r, const char *name, const char *why)
{
    size_t used = strlen(r->skipped);
    snprintf(r->skipped + used, sizeof r->skipped - used, "%s%s skipped: %s", used ? "; " : "", name, why);
}

static int save(struct report *r, const char *name, const struct canvas *c)
{
    char *path = tr_xasprintf("%s/%s", r->out_dir, name);
    int rc = png_write(path, c);
    free(path);
    if (rc == 0)
        r->written[r->n_written++] = name;
    return rc;
}

static struct chart chart_base(const struct report *r, const char *title, const char *y_label)
{
    struct chart ch = {0};
    ch.title = title;
    ch.x_label = "step";
    ch.y_label = y_label;
    ch.x_lo = r->x_lo;
    ch.x_hi = r->x_hi;
    return ch;
}

static void add_curve(struct chart *ch, const char *name, struct rgb color, enum style style,
                      const struct series *s)
{
    if (s->n)
        ch->curves[ch->n_curves++] = (struct curve){name, color, style, s};
}

/* One chart on its own image. */
static int single_chart_image(struct report *r, const char *name, const struct chart *ch)
{
    struct canvas c;
    canvas_init(&c, IMAGE_WIDTH, IMAGE_HEIGHT, WHITE);
    draw_chart(&c, (struct rect){0, 0, c.w, c.h}, ch);
    int rc = save(r, name, &c);
    canvas_free(&c);
    return rc;
}

static int loss_image(struct report *r)
{
    const struct metrics *m = r->m;
    if (!m->loss.n && !m->val_loss.n) {
        skip_image(r, "loss.png", "no loss logged");
        return 0;
    }
    struct chart ch = chart_base(r, "Loss", "loss");
    add_curve(&ch, "train", BLUE, NOISY_LINE, &m->loss);
    add_curve(&ch, "validation", ORANGE, LINE_AND_DOTS, &m->val_loss);
    return single_chart_image(r, "loss.png", &ch);
}

/* Tokens/s on top, data wait below on the same steps. */
static int throughput_image(struct report *r)
{
    const struct metrics *m = r->m;
    if (!m->tokens_per_s.n) {
        skip_image(r, "throughput.png", "no tokens_per_s logged");
        return 0;
    }
    struct canvas c;
    canvas_init(&c, IMAGE_WIDTH, IMAGE_HEIGHT, WHITE);
    struct chart top = chart_base(r, "Throughput", "tokens/s");
    top.x_label = NULL;
    top.y_from_zero = 1;
    add_curve(&top, "tokens/s", GREEN, NOISY_LINE, &m->tokens_per_s);
    struct chart below = chart_base(r, NULL, "wait %");
    below.y_from_zero = 1;
    below.y_at_least = 10; /* a few tenths of a percent should look small */
    add_curve(&below, "data wait %", RED, NOISY_LINE, &m->data_wait);
    int split = m->data_wait.n ? c.h * 62 / 100 : c.h;
    if (m->data_wait.n) { /* line the two x axes up */
        int top_w = y_labels_width(&top, split), below_w = y_labels_width(&below, c.h - split);
        top.y_labels_width = below.y_labels_width = top_w > below_w ? top_w : below_w;
    }
    draw_chart(&c, (struct rect){0, 0, c.w, split}, &top);
    if (m->data_wait.n)
        draw_chart(&c, (struct rect){0, split, c.w, c.h - split}, &below);
    int rc = save(r, "throughput.png", &c);
    canvas_free(&c);
    return rc;
}

static int cost_image(struct report *r)
{
    if (!r->m->cost.n) {
        skip_image(r, "cost.png", "no cost_usd logged");
        return 0;
    }
    if (r->m->cost.p[r->m->cost.n - 1].y <= 0) { /* 0 throughout: no price */
        skip_image(r, "cost.png", "no price known (cost_usd is 0)");
        return 0;
    }
    struct chart ch = chart_base(r, "Cost", "dollars");
    ch.y_prefix = "$";
    ch.y_from_zero = 1;
    add_curve(&ch, "cost", PURPLE, LINE, &r->m->cost);
    return single_chart_image(r, "cost.png", &ch);
}

static int lr_image(struct report *r)
{
    if (!r->m->lr.n) {
        skip_image(r, "lr.png", "no lr logged");
        return 0;
    }
    struct chart ch = chart_base(r, "Learning rate", "lr");
    ch.y_from_zero = 1;
    add_curve(&ch, "lr", BLUE, LINE, &r->m->lr);
    return single_chart_image(r, "lr.png", &ch);
}

/* ---- summary and index -------------------------------------------------------------- */

static void format_duration(char *buf, size_t size, double s)
{
    if (s < 60)
        snprintf(buf, size, "%.1f s", s);
    else if (s < 3600)
        snprintf(buf, size, "%dm %02ds", (int)(s / 60), (int)fmod(s, 60));
    else
        snprintf(buf, size, "%dh %02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

static double series_mean(const struct series *s)
{
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->p[i].y;
    return s->n ? sum / (double)s->n : NAN;
}

static const struct point *series_min(const struct series *s)
{
    const struct point *best = NULL;
    for (size_t i = 0; i < s->n; i++)
        if (!best || s->p[i].y < best->y)
            best = &s->p[i];
    return best;
}

static void summary_loss(FILE *out, const char *what, const struct series *s)
{
    if (!s->n)
        return;
    const struct point *final = &s->p[s->n - 1], *best = series_min(s);
    fprintf(out, "%-12s final %.4g (step %.0f), best %.4g (step %.0f)\n", what, final->y, final->x,
            best->y, best->x);
}

static char *summary_text(const struct metrics *m, const char *run)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out)
        return tr_xstrdup("");
    char buf[64];
    fprintf(out, "%-12s %s\n", "run", run);
    fprintf(out, "%-12s %.0f (%zu logged, %zu evaluations)\n", "steps", m->last_step, m->loss.n,
            m->val_loss.n);
    summary_loss(out, "train loss", &m->loss);
    summary_loss(out, "val loss", &m->val_loss);
    summary_loss(out, "val per byte", &m->val_loss_per_byte);
    if (m->val_accuracy.n)
        fprintf(out, "%-12s final %.2f%%\n", "val accuracy", 100 * m->val_accuracy.p[m->val_accuracy.n - 1].y);
    if (m->tokens_per_s.n)
        fprintf(out, "%-12s mean %.0f tokens/s\n", "throughput", series_mean(&m->tokens_per_s));
    if (m->data_wait.n)
        fprintf(out, "%-12s mean %.2f%%\n", "data wait", series_mean(&m->data_wait));
    if (m->comm_wait.n) /* cumulative: the last line covers the whole run */
        fprintf(out, "%-12s %.2f%% of the steps waiting for collectives (not hidden by compute)\n",
                "comm wait", m->comm_wait.p[m->comm_wait.n - 1].y);
    if (m->mfu.n) {
        double mfu = series_mean(&m->mfu);
        fprintf(out, "%-12s mean %.1f%%\n", "mfu", mfu <= 1.5 ? 100 * mfu : mfu); /* a fraction or a percentage */
    } else if (m->tokens_per_s.n) { /* logged as -1, or left out, when no peak is known */
        fprintf(out, "%-12s n/a (no peak FLOP/s known: set cost.hardware, or cost.peak_tflops "
                "for cpu)\n", "mfu");
    }
    if (m->has_time) {
        format_duration(buf, sizeof buf, m->time_s);
        fprintf(out, "%-12s %s\n", "time", buf);
    }
    if (m->cost.n && m->cost.p[m->cost.n - 1].y > 0)
        fprintf(out, "%-12s $%.2f\n", "cost", m->cost.p[m->cost.n - 1].y);
    else if (m->cost.n) /* 0 throughout: the run knew no price */
        fprintf(out, "%-12s n/a (no price known: set cost.hardware or cost.price)\n", "cost");
    else
        fprintf(out, "%-12s not logged\n", "cost");
    fclose(out);
    return text;
}

static void html_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static int write_index(const struct report *r, const char *run, const char *summary)
{
    char *path = tr_xasprintf("%s/index.html", r->out_dir);
    char *tmp;
    FILE *f = out_open(path, &tmp);
    if (!f) {
        fprintf(stderr, "trainrun: error: cannot write %s: %s\n", path, strerror(errno));
        free(path);
        return -1;
    }
    fputs("<!doctype html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n<title>trainrun report: ", f);
    html_escaped(f, run);
    fputs("</title>\n<style>\n"
          "body { font-family: sans-serif; margin: 2em auto; max-width: 840px; color: #282828; }\n"
          "pre { background: #f4f4f4; padding: 1em; }\n"
          "img { display: block; margin: 1.5em 0; border: 1px solid #ddd; max-width: 100%; }\n"
          "</style>\n</head>\n<body>\n<h1>trainrun report</h1>\n<pre>", f);
    html_escaped(f, summary);
    fputs("</pre>\n", f);
    for (int i = 0; i < r->n_written; i++)
        fprintf(f, "<img src=\"%s\" width=\"%d\" height=\"%d\" alt=\"%s\">\n", r->written[i],
                IMAGE_WIDTH, IMAGE_HEIGHT, r->written[i]);
    if (r->skipped[0]) {
        fputs("<p>", f);
        html_escaped(f, r->skipped);
        fputs("</p>\n", f);
    }
    fputs("</body>\n</html>\n", f);
    if (out_close(f, tmp, path, ferror(f)) != 0) {
        fprintf(stderr, "trainrun: error: cannot write %s: %s\n", path, strerror(errno));
        free(path);
        return -1;
    }
    free(path);
    return 0;
}

/* ---- the command ----------------------------------------------------------------------- */

static void report_usage(FILE *out)
{
    fprintf(out, "usage: trainrun report RUN_DIR [-o OUTDIR]\n"
                 "Plots RUN_DIR/metrics.jsonl into OUTDIR (default RUN_DIR/report): loss.png,\n"
                 "throughput.png, lr.png, cost.png (when cost_usd is logged) and index.html,\n"
                 "and prints a summary.\n");
}

int tr_report_main(int argc, char **argv)
{
    const char *run = NULL, *out_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            report_usage(stdout);
            return TR_EXIT_OK;
        } else if (strcmp(argv[i], "-o") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "trainrun: error: -o needs a directory\n");
                return TR_EXIT_USAGE;
            }
            out_dir = argv[++i];
        } else if (argv[i][0] == '-' || run) {
            fprintf(stderr, "trainrun: error: report: unexpected '%s'\n", argv[i]);
            report_usage(stderr);
            return TR_EXIT_USAGE;
        } else {
            run = argv[i];
        }
    }
    if (!run) {
        report_usage(stderr);
        return TR_EXIT_USAGE;
    }

    /* RUN_DIR, or the metrics file itself */
    struct stat st;
    if (stat(run, &st) != 0) {
        fprintf(stderr, "trainrun: error: cannot open run directory %s: %s\n", run, strerror(errno));
        return TR_EXIT_ERROR;
    }
    char *run_dir = S_ISDIR(st.st_mode) ? tr_xstrdup(run) : tr_dirname(run);
    char *metrics_path = S_ISDIR(st.st_mode) ? tr_xasprintf("%s/metrics.jsonl", run) : tr_xstrdup(run);
    char *out = out_dir ? tr_xstrdup(out_dir) : tr_xasprintf("%s/report", run_dir);
    int code = TR_EXIT_ERROR;
    struct metrics m = {0};
    char *summary = NULL;

    if (S_ISDIR(st.st_mode) && access(metrics_path, F_OK) != 0) {
        fprintf(stderr, "trainrun: error: %s has no metrics.jsonl (is it a run directory? a run "
                        "writes it there as it trains)\n", run);
        goto done;
    }
    if (metrics_read(metrics_path, &m) != 0)
        goto done;
    if (tr_mkdir_p(out) != 0) {
        fprintf(stderr, "trainrun: error: cannot create %s: %s\n", out, strerror(errno));
        goto done;
    }
    if (claim_out_dir(out) != 0)
        goto done;

    struct report r = {.m = &m, .out_dir = out, .x_lo = 0, .x_hi = m.last_step};
    if (loss_image(&r) || throughput_image(&r) || cost_image(&r) || lr_image(&r))
        goto done;
    summary = summary_text(&m, run_dir);
    if (write_index(&r, run_dir, summary) != 0)
        goto done;
    fputs(summary, stdout);
    printf("%-12s %s/index.html\n", "report", out);
    if (r.skipped[0])
        printf("%-12s %s\n", "note", r.skipped);
    code = TR_EXIT_OK;
done:
    free(summary);
    metrics_free(&m);
    free(out);
    free(metrics_path);
    free(run_dir);
    return code;
}
