/*
 * RMSNorm over the last dimension (Llama's norm): y = x * rstd * w with
 * rstd = 1 / sqrt(mean(x^2) + eps); no mean is taken out and no bias added.
 *
 * Backward, with g = dout * w:
 *   dx = rstd * (g - x * rstd^2 * mean(g * x)),   dw = sum over rows of dout * x * rstd.
 *
 * Row sums are accumulated in double, in a vectorised loop: its lane order is
 * fixed by the code, not by the threads (rows are split between threads,
 * never a row), so results do not depend on the thread count.
 */
#include <math.h>

#include "kernels.h"

/* Columns per block in the dw column sums (as layernorm.c). */
enum { COLUMN_BLOCK = 64 };

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

void tr_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C)
{
    if (dinp != NULL) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            float s = rstd[n];
            double gx = 0.0;
#pragma omp simd reduction(+ : gx)
            for (int c = 0; c < C; c++)
                gx += (double)(dy[c] * w[c]) * x[c];
            /* x's coefficient: rstd^3 * mean(g x) */
            float k = (float)((double)s * s * s * (gx / C));
            float *dx = dinp + (size_t)n * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                dx[c] += s * (dy[c] * w[c]) - k * x[c];
        }
    }
    if (dw != NULL) {
        /* Column sums over rows, split by column blocks so each sum runs over
         * the rows in order whatever the thread count. */
        int blocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < blocks; blk++) {
            int c0 = blk * COLUMN_BLOCK;
            int width = C - c0 < COLUMN_BLOCK ? C - c0 : COLUMN_BLOCK;
            float dw_sum[COLUMN_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C + c0;
                const float *dy = dout + (size_t)n * C + c0;
                float s = rstd[n];
#pragma omp simd
                for (int j = 0; j < width; j++)
                    dw_sum[j] += dy[j] * (x[j] * s);
            }
            for (int j = 0; j < width; j++)
                dw[c0 + j] += dw_sum[j];
        }
    }
}
