/* The raster plotter of `trainrun report`: a canvas with a coverage buffer
 * (anti-aliased lines drawn once per curve), the bitmap font of font.h,
 * 1-2-5 axes, charts with legends, and the PNG encoding of a canvas (zlib
 * for the compression and the CRCs). It draws and encodes only: which
 * charts a report has, and writing them to disk, stay in report.c. */
#include "plot.h"

#include "font.h"
#include "../util/util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ---- the canvas ---------------------------------------------------------- */

static const struct rgb INK = {40, 40, 40};         /* text, axes */
static const struct rgb GRID = {228, 228, 228};

#define TEXT_SCALE 2

void canvas_init(struct canvas *c, int w, int h, struct rgb bg)
{
    c->w = w;
    c->h = h;
    c->rgb = tr_xcalloc((size_t)w * (size_t)h, 3);
    c->cover = tr_xcalloc((size_t)w * (size_t)h, sizeof *c->cover);
    for (size_t i = 0; i < (size_t)w * (size_t)h; i++)
        memcpy(c->rgb + 3 * i, &bg, 3);
}

void canvas_free(struct canvas *c)
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
int y_labels_width(const struct chart *ch, int h)
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
void draw_chart(struct canvas *c, struct rect area, const struct chart *ch)
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

/* length, type, data, and the CRC of type and data, at out (which has room) */
static size_t png_chunk(uint8_t *out, const char type[4], const uint8_t *data, size_t len)
{
    put_be32(out, (uint32_t)len);
    memcpy(out + 4, type, 4);
    if (len)
        memcpy(out + 8, data, len);
    uLong crc = crc32(0L, (const Bytef *)type, 4);
    if (len)
        crc = crc32(crc, data, (uInt)len);
    put_be32(out + 8 + len, (uint32_t)crc);
    return 12 + len;
}

/* An 8-bit RGB PNG: each scanline gets filter type 0 (none), then zlib. */
int png_encode(const struct canvas *c, uint8_t **png, size_t *png_len)
{
    *png = NULL;
    *png_len = 0;
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
        return zrc;
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
    uint8_t *out = tr_xcalloc(8 + 3 * 12 + sizeof ihdr + packed_len, 1);
    size_t n = 8;
    memcpy(out, signature, 8);
    n += png_chunk(out + n, "IHDR", ihdr, sizeof ihdr);
    n += png_chunk(out + n, "IDAT", packed, packed_len);
    n += png_chunk(out + n, "IEND", NULL, 0);
    free(packed);
    *png = out;
    *png_len = n;
    return Z_OK;
}
