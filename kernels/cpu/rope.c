/*
 * Rotary position embedding, Hugging Face's rotate-half convention.
 *
 * In each head of D channels, pair (i, i + D/2) at position t turns by the
 * angle t * f_i, f_i = theta^(-2i/D):
 *   out[i]       = x[i] cos - x[i + D/2] sin
 *   out[i + D/2] = x[i + D/2] cos + x[i] sin
 * Backward turns the gradient back (the transpose of a rotation is its
 * inverse): dx[i] += dy[i] cos + dy[i + D/2] sin, dx[i + D/2] += dy[i + D/2] cos - dy[i] sin.
 *
 * The angles are formed as transformers forms them, in float: f_i =
 * 1 / theta^(2i/D), then t * f_i rounded to float, and its cos and sin (glibc's
 * sincosf, within an ulp).  Every call fills a table of cos and sin, T x D/2
 * each, once (in the caller's scratch), so the per-element loops are
 * multiply-adds over contiguous arrays; the whole table costs T*D/2 sincosf.
 * With Llama 3.1's scaling (the _scaled entry points) each f_i is first
 * scaled as transformers scales it (kernels/rope_scaling.h).
 */
#include <math.h>
#include <stddef.h>

#include "../rope_scaling.h"
#include "kernels.h"

size_t tr_cpu_rope_scratch_floats(int T, int D)
{
    return ((size_t)T * 2 + 1) * (size_t)(D / 2);
}

/* scratch: cos[T][half], then sin[T][half], then the frequencies[half], for
 * positions pos0 .. pos0 + T - 1 */
static void rope_table(float *table, int T, int D, float theta, const struct tr_rope_scaling *sc,
                       int pos0)
{
    int half = D / 2;
    float *cos_t = table, *sin_t = table + (size_t)T * half, *freq = sin_t + (size_t)T * half;
    struct tr_rope_scaling none = {0, 0, 0, 0};
    for (int i = 0; i < half; i++)
        freq[i] = tr_rope_scale_freq(1.0f / powf(theta, (float)(2 * i) / (float)D), sc ? *sc : none);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++)
            sincosf((float)(pos0 + t) * freq[i], &sin_t[(size_t)t * half + i], &cos_t[(size_t)t * half + i]);
}

/*
 * Turns every head of in by its position's angles into out, forward
 * (sign 1) or back (sign -1: the same turn with sin negated, exact in float),
 * writing out or adding to it.  Inlined with constant sign and add, so each
 * caller gets its own loop with no branch in it.
 */
static inline void rope_turn(float *out, const float *inp, float *scratch, int B, int T, int H,
                             int D, float theta, const struct tr_rope_scaling *sc, float sign,
                             int add, int pos0)
{
    int half = D / 2;
    rope_table(scratch, T, D, theta, sc, pos0);
    const float *cos_t = scratch, *sin_t = scratch + (size_t)T * half;
    int rows = B * T;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *c = cos_t + (size_t)(r % T) * half, *s = sin_t + (size_t)(r % T) * half;
        for (int h = 0; h < H; h++) {
            const float *x = inp + ((size_t)r * H + h) * D;
            float *y = out + ((size_t)r * H + h) * D;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float a = x[i], b = x[i + half], sn = sign * s[i];
                float lo = a * c[i] - b * sn, hi = b * c[i] + a * sn;
                if (add) {
                    y[i] += lo;
                    y[i + half] += hi;
                } else {
                    y[i] = lo;
                    y[i + half] = hi;
                }
            }
        }
    }
}

void tr_cpu_rope_forward_scaled(float *out, const float *inp, float *scratch, int B, int T, int H,
                                int D, float theta, const struct tr_rope_scaling *sc)
{
    rope_turn(out, inp, scratch, B, T, H, D, theta, sc, 1.0f, 0, 0);
}

void tr_cpu_rope_forward_at(float *out, const float *inp, float *scratch, int B, int T, int H,
                            int D, float theta, const struct tr_rope_scaling *sc, int pos0)
{
    rope_turn(out, inp, scratch, B, T, H, D, theta, sc, 1.0f, 0, pos0);
}

void tr_cpu_rope_backward_scaled(float *dinp, const float *dout, float *scratch, int B, int T,
                                 int H, int D, float theta, const struct tr_rope_scaling *sc,
                                 int write)
{
    if (dinp == NULL)
        return;
    if (write)
        rope_turn(dinp, dout, scratch, B, T, H, D, theta, sc, -1.0f, 0, 0);
    else
        rope_turn(dinp, dout, scratch, B, T, H, D, theta, sc, -1.0f, 1, 0);
}

void tr_cpu_rope_forward(float *out, const float *inp, float *scratch, int B, int T, int H, int D,
                         float theta)
{
    tr_cpu_rope_forward_scaled(out, inp, scratch, B, T, H, D, theta, NULL);
}

void tr_cpu_rope_backward(float *dinp, const float *dout, float *scratch, int B, int T, int H,
                          int D, float theta, int write)
{
    tr_cpu_rope_backward_scaled(dinp, dout, scratch, B, T, H, D, theta, NULL, write);
}
