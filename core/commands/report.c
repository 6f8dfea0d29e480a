/* `trainrun report`: read metrics.jsonl, draw the curves with a small raster
 * plotter (anti-aliased lines, 1-2-5 ticks, a bitmap font) and write them as
 * PNG files (zlib for the compression and the CRCs), plus an index.html. */
#include "report.h"

#include "font.h"
#include "../util/json.h"
#include "../engine/run.h"
#include "../util/util.h"

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

struct point {
    double x, y;
    size_t order; /* line order: keeps the sort stable */
};

struct series {
    struct point *p;
    size_t n, cap;
};

struct metrics {
    struct series loss, val_loss, val_accuracy, lr, tokens_per_s, data_wait, cost, mfu;
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

#define METRICS_SERIES 8

static void metrics_series(struct metrics *m, struct series *all[METRICS_SERIES])
{
    struct series *list[METRICS_SERIES] = {&m->loss, &m->val_loss, &m->val_accuracy, &m->lr,
                                           &m->tokens_per_s, &m->data_wait, &m->cost, &m->mfu};
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

/* Read path into m; 0, or -1 after printing an error naming path:line. */
static int metrics_read(const char *path, struct metrics *m)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "trainrun: error: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0, order = 0;
    ssize_t len;
    double segment_start_time = 0, previous_elapsed = -1;
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
        double step, v;
        if (!number_at(obj, "step", &step)) {
            /* lines of other kinds may come later; they carry no step */
            tr_json_free(obj);
            continue;
        }
        order++;
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
        if (number_at(obj, "cost_usd", &v))
            series_add(&m->cost, step, v, order);
        if (number_at(obj, "mfu", &v))
            series_add(&m->mfu, step, v, order);
        if (number_at(obj, "val_loss", &v))
            series_add(&m->val_loss, step, v, order);
        if (number_at(obj, "val_accuracy", &v) && v >= 0) /* -1: no accuracy */
            series_add(&m->val_accuracy, step, v, order);
        /* elapsed_s restarts with each process: a drop starts a new segment */
        if (number_at(obj, "elapsed_s", &v)) {
            if (v < previous_elapsed)
                segment_start_time += previous_elapsed;
            previous_elapsed = v;
            m->time_s = segment_start_time + v;
            m->has_time = 1;
        }
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

/* ---- the canvas ---------------------------------------------------------- */

struct rgb {
    uint8_t r, g, b;
};

static const struct rgb WHITE = {255, 255, 255};
static const struct rgb INK = {40, 40, 40};         /* text, axes */
static const struct rgb GRID = {228, 228, 228};
static const struct rgb BLUE = {31, 119, 180};
static const struct rgb ORANGE = {255, 127, 14};
static const struct rgb GREEN = {44, 160, 44};
static const struct rgb RED = {214, 39, 40};
static const struct rgb PURPLE = {148, 103, 189};

#define IMAGE_WIDTH 800
#define IMAGE_HEIGHT 500
#define TEXT_SCALE 2

struct rect {
    int x, y, w, h;
};

/* RGB pixels, plus a coverage buffer: a curve is first rasterised into the
 * coverage (the maximum over its segments) and then blended once, so the
 * joints of a polyline are not painted twice. */
struct canvas {
    int w, h;
    uint8_t *rgb;
    float *cover;
};

static void canvas_init(struct canvas *c, int w, int h, struct rgb bg)
{
    c->w = w;
    c->h = h;
    c->rgb = tr_xcalloc((size_t)w * (size_t)h, 3);
    c->cover = tr_xcalloc((size_t)w * (size_t)h, sizeof *c->cover);
    for (size_t i = 0; i < (size_t)w * (size_t)h; i++)
        memcpy(c->rgb + 3 * i, &bg, 3);
}

static void canvas_free(struct canvas *c)
{
    free(c->rgb);
    free(c->cover);
}

static void blend(struct canvas *c, int x, int y, struct rgb color, double alpha)
{
    if (x < 0 || y < 0 || x >= c->w || y >= c->h || alpha <= 0)
        return;
    uint8_t *p = c->rgb + 3 * ((size_t)y * (size_t)c->w + (size_t)x);
    if (alpha >= 1) {
        p[0] = color.r, p[1] = color.g, p[2] = color.b;
        return;
    }
    p[0] = (uint8_t)lround(p[0] + alpha * (color.r - p[0]));
    p[1] = (uint8_t)lround(p[1] + alpha * (color.g - p[1]));
    p[2] = (uint8_t)lround(p[2] + alpha * (color.b - p[2]));
}

static void fill_rect(struct canvas *c, int x, int y, int w, int h, struct rgb color)
{
    for (int j = y; j < y + h; j++)
        for (int i = x; i < x + w; i++)
            blend(c, i, j, color, 1);
}

/* A 1-pixel frame just inside (x, y, w, h). */
static void frame_rect(struct canvas *c, int x, int y, int w, int h, struct rgb color)
{
    fill_rect(c, x, y, w, 1, color);
    fill_rect(c, x, y + h - 1, w, 1, color);
    fill_rect(c, x, y, 1, h, color);
    fill_rect(c, x + w - 1, y, 1, h, color);
}

static void cover_set(struct canvas *c, int x, int y, double a)
{
    float *p = &c->cover[(size_t)y * (size_t)c->w + (size_t)x];
    if (a > *p)
        *p = (float)a;
}

/* Coverage of a segment `width` pixels wide with round ends: each pixel's
 * distance to the segment, with a one-pixel ramp at the edge (anti-aliasing). */
static void cover_segment(struct canvas *c, struct rect clip, double x0, double y0, double x1,
                          double y1, double width)
{
    double half = width / 2, reach = half + 1;
    int left = (int)floor(fmin(x0, x1) - reach), right = (int)ceil(fmax(x0, x1) + reach);
    int top = (int)floor(fmin(y0, y1) - reach), bottom = (int)ceil(fmax(y0, y1) + reach);
    if (left < clip.x) left = clip.x;
    if (top < clip.y) top = clip.y;
    if (right > clip.x + clip.w - 1) right = clip.x + clip.w - 1;
    if (bottom > clip.y + clip.h - 1) bottom = clip.y + clip.h - 1;
    double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    for (int y = top; y <= bottom; y++) {
        for (int x = left; x <= right; x++) {
            double t = len2 > 0 ? ((x - x0) * dx + (y - y0) * dy) / len2 : 0;
            t = t < 0 ? 0 : t > 1 ? 1 : t;
            double d = hypot(x - (x0 + t * dx), y - (y0 + t * dy));
            double a = half + 0.5 - d;
            if (a > 0)
                cover_set(c, x, y, a > 1 ? 1 : a);
        }
    }
}

static void cover_dot(struct canvas *c, struct rect clip, double x, double y, double diameter)
{
    cover_segment(c, clip, x, y, x, y, diameter);
}

/* Blend the accumulated coverage inside clip in one colour, and clear it. */
static void cover_paint(struct canvas *c, struct rect clip, struct rgb color)
{
    for (int y = clip.y; y < clip.y + clip.h; y++) {
        for (int x = clip.x; x < clip.x + clip.w; x++) {
            float *p = &c->cover[(size_t)y * (size_t)c->w + (size_t)x];
            if (*p > 0) {
                blend(c, x, y, color, *p);
                *p = 0;
            }
        }
    }
}

/* ---- text ------------------------------------------------------------------ */

#define GLYPH_ADVANCE (TR_FONT_WIDTH + 1)

static const uint8_t *glyph(char ch)
{
    unsigned char u = (unsigned char)ch;
    if (u < TR_FONT_FIRST || u > TR_FONT_LAST)
        u = '?';
    return tr_font_glyphs[u - TR_FONT_FIRST];
}

static int text_width(const char *s, int scale)
{
    size_t n = strlen(s);
    return n ? (int)n * GLYPH_ADVANCE * scale - scale : 0;
}

/* Text with its top-left corner at (x, y); capitals are 7*scale tall. */
static void draw_text(struct canvas *c, int x, int y, const char *s, int scale, struct rgb color)
{
    for (; *s; s++, x += GLYPH_ADVANCE * scale) {
        const uint8_t *rows = glyph(*s);
        for (int gy = 0; gy < TR_FONT_HEIGHT; gy++)
            for (int gx = 0; gx < TR_FONT_WIDTH; gx++)
                if (rows[gy] & (0x10 >> gx))
                    fill_rect(c, x + gx * scale, y + gy * scale, scale, scale, color);
    }
}

/* Text turned a quarter left (read bottom to top), starting at (x, y): the
 * glyphs' tops face x, the text runs up from y. For y-axis labels. */
static void draw_text_up(struct canvas *c, int x, int y, const char *s, int scale, struct rgb color)
{
    for (; *s; s++, y -= GLYPH_ADVANCE * scale) {
        const uint8_t *rows = glyph(*s);
        for (int gy = 0; gy < TR_FONT_HEIGHT; gy++)
            for (int gx = 0; gx < TR_FONT_WIDTH; gx++)
                if (rows[gy] & (0x10 >> gx))
                    fill_rect(c, x + gy * scale, y - (gx + 1) * scale, scale, scale, color);
    }
}

/* ---- axes -------------------------------------------------------------------- */

struct axis {
    double lo, hi, step;
};

/* The 1-2-5 step nearest above span/target. */
static double nice_step(double span, int target)
{
    double raw = span / (target > 0 ? target : 1);
    double magnitude = pow(10, floor(log10(raw)));
    double m = raw / magnitude;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * magnitude;
}

/* An axis from lo to hi rounded out to whole steps. */
static struct axis axis_fit(double lo, double hi, int target)
{
    if (!(hi > lo)) { /* one value (a constant lr): give it some room */
        double pad = lo != 0 ? fabs(lo) * 0.1 : 1;
        lo -= pad;
        hi += pad;
    }
    struct axis a;
    a.step = nice_step(hi - lo, target);
    a.lo = floor(lo / a.step + 1e-9) * a.step;
    a.hi = ceil(hi / a.step - 1e-9) * a.step;
    return a;
}

/* Tick values are whole multiples of the step; %g's 6 digits hide the
 * rounding of k * step, and large values get a k/M suffix to stay short. */
static void format_tick(char *buf, size_t size, double v, const struct axis *a, const char *prefix)
{
    double largest = fmax(fabs(a->lo), fabs(a->hi));
    if (fabs(v) < a->step * 1e-6) {
        snprintf(buf, size, "%s0", prefix);
        return;
    }
    const char *sign = v < 0 ? "-" : "";
    v = fabs(v);
    if (largest >= 1e6)
        snprintf(buf, size, "%s%s%gM", sign, prefix, v / 1e6);
    else if (largest >= 1e4)
        snprintf(buf, size, "%s%s%gk", sign, prefix, v / 1e3);
    else
        snprintf(buf, size, "%s%s%g", sign, prefix, v);
}

#define TICK_LABEL_MAX 32

/* ---- charts -------------------------------------------------------------------- */

enum style {
    LINE,
    NOISY_LINE,    /* drawn thinner when dense, so the spread stays visible */
    LINE_AND_DOTS,
};

struct curve {
    const char *name; /* in the legend */
    struct rgb color;
    enum style style;
    const struct series *data;
};

struct chart {
    const char *title;       /* above the plot; NULL for none */
    const char *x_label, *y_label;
    const char *y_prefix;    /* before tick values, e.g. "$" */
    struct curve curves[4];
    int n_curves;
    int y_from_zero;         /* lr, cost, rates: 0 belongs on the axis */
    double y_at_least;       /* the axis reaches at least this (0: no minimum) */
    double x_lo, x_hi;       /* the x range, shared by stacked panels */
    int y_labels_width;      /* at least this wide: aligns stacked panels */
};

struct frame {
    struct rect plot;        /* inside the axis box */
    struct rect data;        /* where the axis ranges map: inset, so that a curve
                              * along an end of its range is not hidden by the box */
    struct axis x, y;
};

#define DATA_INSET 8

static double to_px_x(const struct frame *f, double x)
{
    return f->data.x + (x - f->x.lo) / (f->x.hi - f->x.lo) * (f->data.w - 1);
}

static double to_px_y(const struct frame *f, double y)
{
    return f->data.y + f->data.h - 1 - (y - f->y.lo) / (f->y.hi - f->y.lo) * (f->data.h - 1);
}

static void y_range(const struct chart *ch, double *lo, double *hi)
{
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int i = 0; i < ch->n_curves; i++) {
        const struct series *s = ch->curves[i].data;
        for (size_t k = 0; k < s->n; k++) {
            *lo = fmin(*lo, s->p[k].y);
            *hi = fmax(*hi, s->p[k].y);
        }
    }
    if (ch->y_from_zero) {
        *lo = fmin(*lo, 0);
        *hi = fmax(*hi, 0);
    }
    if (ch->y_at_least > *hi)
        *hi = ch->y_at_least;
}

/* The legend goes in the corner of the plot that hides the fewest points. */
static void draw_legend(struct canvas *c, const struct chart *ch, const struct frame *f)
{
    int scale = TEXT_SCALE, row = 11 * scale, sample = 24, pad = 8, widest = 0;
    for (int i = 0; i < ch->n_curves; i++) {
        int w = text_width(ch->curves[i].name, scale);
        widest = w > widest ? w : widest;
    }
    int w = pad + sample + 8 + widest + pad, h = pad + ch->n_curves * row - 2 * scale + pad;
    const struct rect *p = &f->plot;
    int corners[4][2] = {
        {p->x + p->w - w - 8, p->y + 8}, {p->x + 8, p->y + 8},
        {p->x + p->w - w - 8, p->y + p->h - h - 8}, {p->x + 8, p->y + p->h - h - 8},
    };
    int best = 0;
    size_t fewest = (size_t)-1;
    for (int k = 0; k < 4; k++) {
        size_t hidden = 0;
        for (int i = 0; i < ch->n_curves; i++) {
            const struct series *s = ch->curves[i].data;
            for (size_t j = 0; j < s->n; j++) {
                double x = to_px_x(f, s->p[j].x), y = to_px_y(f, s->p[j].y);
                hidden += x >= corners[k][0] - 4 && x <= corners[k][0] + w + 4 &&
                          y >= corners[k][1] - 4 && y <= corners[k][1] + h + 4;
            }
        }
        if (hidden < fewest) {
            fewest = hidden;
            best = k;
        }
    }
    int x = corners[best][0], y = corners[best][1];
    fill_rect(c, x, y, w, h, WHITE);
    frame_rect(c, x, y, w, h, (struct rgb){190, 190, 190});
    for (int i = 0; i < ch->n_curves; i++) {
        const struct curve *cv = &ch->curves[i];
        int ty = y + pad + i * row, mid = ty + 7 * scale / 2;
        struct rect all = {0, 0, c->w, c->h};
        cover_segment(c, all, x + pad, mid, x + pad + sample, mid, 2.5);
        if (cv->style == LINE_AND_DOTS)
            cover_dot(c, all, x + pad + sample / 2.0, mid, 7);
        cover_paint(c, (struct rect){x, y, w, h}, cv->color);
        draw_text(c, x + pad + sample + 8, ty, cv->name, scale, INK);
    }
}

/* The y axis of a chart drawn in an area h pixels tall. */
static struct axis chart_y_axis(const struct chart *ch, int h)
{
    double lo, hi;
    y_range(ch, &lo, &hi);
    return axis_fit(lo, hi, h / 70 > 2 ? h / 70 : 2);
}

static const char *y_prefix(const struct chart *ch) { return ch->y_prefix ? ch->y_prefix : ""; }

/* The widest y tick value: the left margin must fit it. */
static int y_labels_width(const struct chart *ch, int h)
{
    struct axis a = chart_y_axis(ch, h);
    char label[TICK_LABEL_MAX];
    int widest = 0;
    long first = lround(ceil(a.lo / a.step - 1e-9)), last = lround(floor(a.hi / a.step + 1e-9));
    for (long k = first; k <= last; k++) {
        format_tick(label, sizeof label, (double)k * a.step, &a, y_prefix(ch));
        int w = text_width(label, TEXT_SCALE);
        widest = w > widest ? w : widest;
    }
    return widest;
}

/* Draw a chart into area: title, box, grid, ticks and their values, axis
 * labels, the curves, and a legend when there is more than one curve. */
static void draw_chart(struct canvas *c, struct rect area, const struct chart *ch)
{
    int scale = TEXT_SCALE, text_h = 7 * scale, tick = 5;
    struct frame f;
    char label[TICK_LABEL_MAX];
    f.y = chart_y_axis(ch, area.h);
    int widest = y_labels_width(ch, area.h);
    if (ch->y_labels_width > widest)
        widest = ch->y_labels_width;
    int top = area.y + (ch->title ? 14 + 9 * scale + 10 : 14);
    int left = area.x + 12 + (ch->y_label ? TR_FONT_HEIGHT * scale + 10 : 0) + widest + tick + 6;
    int bottom = area.y + area.h - (6 + tick + text_h + 8 + (ch->x_label ? 9 * scale + 8 : 0));
    int right = area.x + area.w - 28;
    f.plot = (struct rect){left, top, right - left, bottom - top};
    f.data = (struct rect){left + DATA_INSET, top + DATA_INSET, f.plot.w - 2 * DATA_INSET,
                           f.plot.h - 2 * DATA_INSET};
    f.x = axis_fit(ch->x_lo, ch->x_hi, f.data.w / 110 > 2 ? f.data.w / 110 : 2);
    if (f.x.step < 1)
        f.x.step = 1; /* steps are whole numbers */
    f.x.lo = ch->x_lo; /* the data decide the ends of x; ticks fall inside */
    f.x.hi = ch->x_hi > ch->x_lo ? ch->x_hi : ch->x_lo + 1;

    if (ch->title) {
        int w = text_width(ch->title, scale);
        int x = f.plot.x + (f.plot.w - w) / 2;
        draw_text(c, x, area.y + 12, ch->title, scale, INK);
        draw_text(c, x + 1, area.y + 12, ch->title, scale, INK); /* bold */
    }

    /* grid and ticks on y */
    long first = lround(ceil(f.y.lo / f.y.step - 1e-9)), last = lround(floor(f.y.hi / f.y.step + 1e-9));
    for (long k = first; k <= last; k++) {
        double v = (double)k * f.y.step;
        int y = (int)lround(to_px_y(&f, v));
        fill_rect(c, f.plot.x, y, f.plot.w, 1, GRID);
        fill_rect(c, f.plot.x - tick, y, tick, 1, INK);
        format_tick(label, sizeof label, v, &f.y, y_prefix(ch));
        draw_text(c, f.plot.x - tick - 6 - text_width(label, scale), y - text_h / 2, label, scale, INK);
    }
    /* grid and ticks on x */
    first = lround(ceil(f.x.lo / f.x.step - 1e-9));
    last = lround(floor(f.x.hi / f.x.step + 1e-9));
    for (long k = first; k <= last; k++) {
        double v = (double)k * f.x.step;
        int x = (int)lround(to_px_x(&f, v));
        fill_rect(c, x, f.plot.y, 1, f.plot.h, GRID);
        fill_rect(c, x, f.plot.y + f.plot.h, 1, tick, INK);
        format_tick(label, sizeof label, v, &f.x, "");
        draw_text(c, x - text_width(label, scale) / 2, f.plot.y + f.plot.h + tick + 6, label, scale, INK);
    }
    if (ch->x_label) {
        int w = text_width(ch->x_label, scale);
        draw_text(c, f.plot.x + (f.plot.w - w) / 2, f.plot.y + f.plot.h + tick + 6 + text_h + 8,
                  ch->x_label, scale, INK);
    }
    if (ch->y_label) {
        int w = text_width(ch->y_label, scale);
        draw_text_up(c, area.x + 12, f.plot.y + (f.plot.h + w) / 2, ch->y_label, scale, INK);
    }

    /* the curves, clipped to the plot */
    for (int i = 0; i < ch->n_curves; i++) {
        const struct curve *cv = &ch->curves[i];
        const struct series *s = cv->data;
        double width = cv->style == NOISY_LINE && s->n > 400 ? 1.5 : 2.2;
        for (size_t k = 0; k + 1 < s->n; k++)
            cover_segment(c, f.plot, to_px_x(&f, s->p[k].x), to_px_y(&f, s->p[k].y),
                          to_px_x(&f, s->p[k + 1].x), to_px_y(&f, s->p[k + 1].y), width);
        for (size_t k = 0; k < s->n; k++)
            if (cv->style == LINE_AND_DOTS || s->n == 1)
                cover_dot(c, f.plot, to_px_x(&f, s->p[k].x), to_px_y(&f, s->p[k].y), 7);
        cover_paint(c, f.plot, cv->color);
    }
    frame_rect(c, f.plot.x - 1, f.plot.y - 1, f.plot.w + 2, f.plot.h + 2, INK);
    if (ch->n_curves > 1)
        draw_legend(c, ch, &f);
}

/* ---- PNG ----------------------------------------------------------------------- */

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* length, type, data, and the CRC of type and data */
static int png_chunk(FILE *f, const char type[4], const uint8_t *data, size_t len)
{
    uint8_t head[8], tail[4];
    put_be32(head, (uint32_t)len);
    memcpy(head + 4, type, 4);
    uLong crc = crc32(0L, (const Bytef *)type, 4);
    if (len)
        crc = crc32(crc, data, (uInt)len);
    put_be32(tail, (uint32_t)crc);
    return fwrite(head, 1, 8, f) == 8 && (len == 0 || fwrite(data, 1, len, f) == len) &&
                   fwrite(tail, 1, 4, f) == 4
               ? 0 : -1;
}

/* ---- writing into OUTDIR without harming what else is there --------------------- */

/* What a report writes, and the marker saying a directory holds one. */
static const char *const report_files[] = {"index.html", "loss.png", "throughput.png",
                                           "cost.png", "lr.png"};
#define REPORT_MARK ".trainrun-report"

/* 1 when path is an index.html a report wrote (before the marker existed). */
static int is_report_index(const char *path)
{
    FILE *f = fopen(path, "r");
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

/* An 8-bit RGB PNG: each scanline gets filter type 0 (none), then zlib. */
static int png_write(const char *path, const struct canvas *c)
{
    size_t stride = (size_t)c->w * 3, raw_len = (stride + 1) * (size_t)c->h;
    uint8_t *raw = tr_xcalloc(raw_len, 1);
    for (int y = 0; y < c->h; y++)
        memcpy(raw + (size_t)y * (stride + 1) + 1, c->rgb + (size_t)y * stride, stride);
    uLongf packed_len = compressBound((uLong)raw_len);
    uint8_t *packed = tr_xcalloc(packed_len, 1);
    int zrc = compress2(packed, &packed_len, raw, (uLong)raw_len, 9);
    free(raw);
    if (zrc != Z_OK) {
        free(packed);
        fprintf(stderr, "trainrun: error: %s: zlib could not compress the image (%d)\n", path, zrc);
        return -1;
    }
    char *tmp;
    FILE *f = out_open(path, &tmp);
    if (!f) {
        free(packed);
        fprintf(stderr, "trainrun: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    uint8_t ihdr[13];
    put_be32(ihdr, (uint32_t)c->w);
    put_be32(ihdr + 4, (uint32_t)c->h);
    ihdr[8] = 8;  /* bits per sample */
    ihdr[9] = 2;  /* colour type: RGB */
    ihdr[10] = 0; /* compression: deflate */
    ihdr[11] = 0; /* filtering: adaptive (each line names its filter) */
    ihdr[12] = 0; /* no interlace */
    int bad = fwrite(signature, 1, 8, f) != 8 || png_chunk(f, "IHDR", ihdr, sizeof ihdr) ||
              png_chunk(f, "IDAT", packed, packed_len) || png_chunk(f, "IEND", NULL, 0);
    free(packed);
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
    if (m->val_accuracy.n)
        fprintf(out, "%-12s final %.2f%%\n", "val accuracy", 100 * m->val_accuracy.p[m->val_accuracy.n - 1].y);
    if (m->tokens_per_s.n)
        fprintf(out, "%-12s mean %.0f tokens/s\n", "throughput", series_mean(&m->tokens_per_s));
    if (m->data_wait.n)
        fprintf(out, "%-12s mean %.2f%%\n", "data wait", series_mean(&m->data_wait));
    if (m->mfu.n) {
        double mfu = series_mean(&m->mfu);
        fprintf(out, "%-12s mean %.1f%%\n", "mfu", mfu <= 1.5 ? 100 * mfu : mfu); /* a fraction or a percentage */
    }
    if (m->has_time) {
        format_duration(buf, sizeof buf, m->time_s);
        fprintf(out, "%-12s %s\n", "time", buf);
    }
    if (m->cost.n)
        fprintf(out, "%-12s $%.2f\n", "cost", m->cost.p[m->cost.n - 1].y);
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
