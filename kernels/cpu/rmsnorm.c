/*
 * RMSNorm over the last dimension (Llama's norm): y = x * rstd * w with
 * rstd = 1 / sqrt(mean(x^2) + eps); no mean is taken out and no bias added.
 *
 * Backward, with g = dout * w:
 *   dx = rstd * (g - x * rstd^2 * mean(g * x)),   dw = sum over rows of dout * x * rstd.
 *
 * Row sums are accumulated in double, in a vectorised loop: its lane order is
 * fixed by the code, not by the threads (rows are split between threads,
 * never a row), so results do not depend on the thread count.  Backward
 * reads x and dout once: dw is summed per chunk of rows into scratch, then
 * over the chunks in order (the same sums whatever the thread count).
 */
#include <math.h>

#include "kernels.h"

/* Rows per partial sum of dw: the partials' count depends on N alone, never
 * on the threads. */
enum { ROW_CHUNK = 32 };

void tr_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N,
                            int C, float eps)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double sq = 0.0;
#pragma omp simd reduction(+ : sq)
        for (int c = 0; c < C; c++)
            sq += (double)x[c] * x[c];
        float s = (float)(1.0 / sqrt(sq / C + eps));
        float *y = out + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++)
            y[c] = x[c] * s * w[c];
        rstd[n] = s;
    }
}

size_t tr_cpu_rmsnorm_scratch_floats(int N, int C)
{
    return (size_t)((N + ROW_CHUNK - 1) / ROW_CHUNK) * (size_t)C;
}

/* One pass over x and dout: each chunk of ROW_CHUNK rows writes its dinp
 * rows and its partial dw (rows in order) into scratch; the partials are
 * then summed in chunk order. */
void tr_cpu_rmsnorm_backward(float *dinp, float *dw, float *scratch, const float *dout,
                             const float *inp, const float *w, const float *rstd, int N, int C,
                             unsigned write)
{
    int write_x = (write & 1u) != 0;
    if (dinp == NULL && dw == NULL)
        return;
    int chunks = (N + ROW_CHUNK - 1) / ROW_CHUNK;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < chunks; k++) {
        float *part = scratch + (size_t)k * C;
        if (dw != NULL)
            for (int c = 0; c < C; c++)
                part[c] = 0.0f;
        int n1 = (k + 1) * ROW_CHUNK < N ? (k + 1) * ROW_CHUNK : N;
        for (int n = k * ROW_CHUNK; n < n1; n++) {
            const float *x = inp + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            float s = rstd[n];
            if (dinp != NULL) {
                double gx = 0.0;
#pragma omp simd reduction(+ : gx)
                for (int c = 0; c < C; c++)
                    gx += (double)(dy[c] * w[c]) * x[c];
                /* x's coefficient: rstd^3 * mean(g x) */
                float q = (float)((double)s * s * s * (gx / C));
                float *dx = dinp + (size_t)n * C;
#pragma omp simd
                for (int c = 0; c < C; c++) {
                    float d = s * (dy[c] * w[c]) - q * x[c];
                    dx[c] = write_x ? d : dx[c] + d;
                }
            }
            if (dw != NULL) {
#pragma omp simd
                for (int c = 0; c < C; c++)
                    part[c] += dy[c] * (x[c] * s);
            }
        }
    }
    /* the chunks' partials, summed column by column in chunk order: the
     * bias gradient's column sum */
    if (dw != NULL)
        tr_cpu_linear_bias_backward(dw, scratch, chunks, C, (write & 2u) != 0);
}
