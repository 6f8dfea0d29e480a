/*
 * Pooling, channel-last: x[B,H,W,C] -> out[B,OH,OW,C].
 *
 * Written by hand rather than on oneDNN's pooling primitives: pooling is
 * memory-bound, and in NHWC every window position is a contiguous run of C
 * channels, so the loops below vectorise over C and read each input once
 * per window that covers it, as oneDNN's would.  By hand, max pooling's
 * backward needs no workspace (oneDNN's keeps one from a forward_training
 * run, which would mean saving it as an activation or re-running the
 * forward into scratch): it finds each window's first maximum again from
 * x, which costs one more read of x.  And the gradient of overlapping
 * windows is summed in a fixed order per image (one image per thread), so
 * results do not depend on the thread count (kernels.h).
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

/* channels handled together: the running maxima live in registers/stack */
enum { POOL_CHUNK = 64 };

static const float *pixel(const float *x, const struct tr_cpu_pool_shape *s, int b, int h, int w)
{
    return x + (((size_t)b * s->H + h) * s->W + w) * s->C;
}

static float *pixel_mut(float *x, const struct tr_cpu_pool_shape *s, int b, int h, int w)
{
    return x + (((size_t)b * s->H + h) * s->W + w) * s->C;
}

/* the window of output (oh, ow) clipped to the image: rows [h0,h1), cols [w0,w1) */
struct window {
    int h0, h1, w0, w1;
};

static struct window window_of(const struct tr_cpu_pool_shape *s, int oh, int ow)
{
    struct window r;
    r.h0 = oh * s->stride[0] - s->pad[0];
    r.w0 = ow * s->stride[1] - s->pad[1];
    r.h1 = r.h0 + s->KH;
    r.w1 = r.w0 + s->KW;
    if (r.h0 < 0)
        r.h0 = 0;
    if (r.w0 < 0)
        r.w0 = 0;
    if (r.h1 > s->H)
        r.h1 = s->H;
    if (r.w1 > s->W)
        r.w1 = s->W;
    return r;
}

void tr_cpu_maxpool_forward(float *out, const float *x, const struct tr_cpu_pool_shape *s)
{
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < s->B; b++)
        for (int oh = 0; oh < s->OH; oh++)
            for (int ow = 0; ow < s->OW; ow++) {
                struct window r = window_of(s, oh, ow);
                float *o = out + (((size_t)b * s->OH + oh) * s->OW + ow) * s->C;
                /* padding is -inf: it never wins, and an all-padding window stays -inf */
                for (int c = 0; c < s->C; c++)
                    o[c] = -INFINITY;
                for (int h = r.h0; h < r.h1; h++)
                    for (int w = r.w0; w < r.w1; w++) {
                        const float *xp = pixel(x, s, b, h, w);
                        for (int c = 0; c < s->C; c++)
                            o[c] = xp[c] > o[c] ? xp[c] : o[c];
                    }
            }
}

void tr_cpu_maxpool_backward(float *dx, const float *dout, const float *x,
                             const struct tr_cpu_pool_shape *s)
{
    /* one image per thread: overlapping windows of an image add into its dx
     * in row-major output order whatever the thread count */
#pragma omp parallel for schedule(static)
    for (int b = 0; b < s->B; b++)
        for (int oh = 0; oh < s->OH; oh++)
            for (int ow = 0; ow < s->OW; ow++) {
                struct window r = window_of(s, oh, ow);
                const float *d = dout + (((size_t)b * s->OH + oh) * s->OW + ow) * s->C;
                for (int c0 = 0; c0 < s->C; c0 += POOL_CHUNK) {
                    int nc = s->C - c0 < POOL_CHUNK ? s->C - c0 : POOL_CHUNK;
                    float best[POOL_CHUNK];
                    int at[POOL_CHUNK];
                    for (int c = 0; c < nc; c++) {
                        best[c] = -INFINITY;
                        at[c] = -1;
                    }
                    /* strictly greater: the first maximum in row-major order */
                    for (int h = r.h0; h < r.h1; h++)
                        for (int w = r.w0; w < r.w1; w++) {
                            const float *xp = pixel(x, s, b, h, w) + c0;
                            int pos = h * s->W + w;
                            for (int c = 0; c < nc; c++)
                                if (at[c] < 0 || xp[c] > best[c]) {
                                    best[c] = xp[c];
                                    at[c] = pos;
                                }
                        }
                    for (int c = 0; c < nc; c++)
                        if (at[c] >= 0)
                            dx[((size_t)b * s->H * s->W + at[c]) * s->C + c0 + c] += d[c0 + c];
                }
            }
}

void tr_cpu_avgpool_forward(float *out, const float *x, const struct tr_cpu_pool_shape *s)
{
    /* padding counts as zeros: the divisor is the whole window */
    float inv = 1.0f / (float)(s->KH * s->KW);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < s->B; b++)
        for (int oh = 0; oh < s->OH; oh++)
            for (int ow = 0; ow < s->OW; ow++) {
                struct window r = window_of(s, oh, ow);
                float *o = out + (((size_t)b * s->OH + oh) * s->OW + ow) * s->C;
                for (int c = 0; c < s->C; c++)
                    o[c] = 0.0f;
                for (int h = r.h0; h < r.h1; h++)
                    for (int w = r.w0; w < r.w1; w++) {
                        const float *xp = pixel(x, s, b, h, w);
                        for (int c = 0; c < s->C; c++)
                            o[c] += xp[c];
                    }
                for (int c = 0; c < s->C; c++)
                    o[c] *= inv;
            }
}

void tr_cpu_avgpool_backward(float *dx, const float *dout, const struct tr_cpu_pool_shape *s)
{
    float inv = 1.0f / (float)(s->KH * s->KW);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < s->B; b++)
        for (int oh = 0; oh < s->OH; oh++)
            for (int ow = 0; ow < s->OW; ow++) {
                struct window r = window_of(s, oh, ow);
                const float *d = dout + (((size_t)b * s->OH + oh) * s->OW + ow) * s->C;
                for (int h = r.h0; h < r.h1; h++)
                    for (int w = r.w0; w < r.w1; w++) {
                        float *g = pixel_mut(dx, s, b, h, w);
                        for (int c = 0; c < s->C; c++)
                            g[c] += d[c] * inv;
                    }
            }
}

void tr_cpu_global_avgpool_forward(float *out, const float *x, int B, int HW, int C)
{
    float inv = 1.0f / (float)HW;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        float *o = out + (size_t)b * C;
        const float *xb = x + (size_t)b * HW * C;
        for (int c = 0; c < C; c++)
            o[c] = 0.0f;
        for (int p = 0; p < HW; p++)
            for (int c = 0; c < C; c++)
                o[c] += xb[(size_t)p * C + c];
        for (int c = 0; c < C; c++)
            o[c] *= inv;
    }
}

void tr_cpu_global_avgpool_backward(float *dx, const float *dout, int B, int HW, int C)
{
    float inv = 1.0f / (float)HW;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        const float *d = dout + (size_t)b * C;
        float *g = dx + (size_t)b * HW * C;
        for (int p = 0; p < HW; p++)
            for (int c = 0; c < C; c++)
                g[(size_t)p * C + c] += d[c] * inv;
    }
}
