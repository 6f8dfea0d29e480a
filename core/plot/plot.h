/* The raster plotter behind `trainrun report` (plot.c): charts of series
 * drawn on an RGB canvas, and the canvas encoded as a PNG. report.c (the
 * commands room) is its one user. */
#ifndef TR_PLOT_H
#define TR_PLOT_H

#include <stddef.h>
#include <stdint.h>

/* A logged metric: (step, value) points, sorted by step. */
struct point {
    double x, y;
    size_t order; /* line order: keeps the sort stable */
};

struct series {
    struct point *p;
    size_t n, cap;
};

struct rgb {
    uint8_t r, g, b;
};

static const struct rgb WHITE = {255, 255, 255};
static const struct rgb BLUE = {31, 119, 180};
static const struct rgb ORANGE = {255, 127, 14};
static const struct rgb GREEN = {44, 160, 44};
static const struct rgb RED = {214, 39, 40};
static const struct rgb PURPLE = {148, 103, 189};

#define IMAGE_WIDTH 800
#define IMAGE_HEIGHT 500

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

/* A w x h canvas filled with bg; canvas_free releases it. */
void canvas_init(struct canvas *c, int w, int h, struct rgb bg);
void canvas_free(struct canvas *c);

/* The widest y tick value of ch drawn h pixels tall: stacked panels take
 * the larger of theirs as y_labels_width, so that their x axes line up. */
int y_labels_width(const struct chart *ch, int h);

/* Draw ch into area: title, box, grid, ticks and their values, axis
 * labels, the curves, and a legend when there is more than one curve. */
void draw_chart(struct canvas *c, struct rect area, const struct chart *ch);

/* The PNG file of c in a fresh buffer (*png, *png_len; the caller frees
 * it). Returns Z_OK, or zlib's error code and no buffer. */
int png_encode(const struct canvas *c, uint8_t **png, size_t *png_len);

#endif
