/*
 * LayerNorm over the last dimension, biased variance.
 *
 * Row statistics are accumulated in double: the sums are sequential either
 * way (no vectorised reduction without reassociation), so it costs nothing.
 */
#include <math.h>

#include "kernels.h"

/* Columns per block in the dw/db column sums. */
enum { COLUMN_BLOCK = 64 };

void tr_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, float eps)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++)
            sum += x[c];
        float m = (float)(sum / C);
        double sq = 0.0;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            sq += (double)d * d;
        }
        float s = (float)(1.0 / sqrt(sq / C + eps));
        float *y = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            y[c] = (x[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

void tr_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    if (dinp != NULL) {
        /* dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * w */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            double g_sum = 0.0, g_xhat_sum = 0.0;
            for (int c = 0; c < C; c++) {
                float g = dy[c] * w[c];
                g_sum += g;
                g_xhat_sum += (double)g * ((x[c] - m) * s);
            }
            float g_mean = (float)(g_sum / C);
            float g_xhat_mean = (float)(g_xhat_sum / C);
            float *dx = dinp + (size_t)n * C;
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * s;
                float g = dy[c] * w[c];
                dx[c] += s * (g - g_mean - xhat * g_xhat_mean);
            }
        }
    }
    if (dw != NULL || db != NULL) {
        /* Column sums over rows, split by column blocks so each sum runs over
         * the rows in order whatever the thread count. */
        int blocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < blocks; blk++) {
            int c0 = blk * COLUMN_BLOCK;
            int width = C - c0 < COLUMN_BLOCK ? C - c0 : COLUMN_BLOCK;
            float dw_sum[COLUMN_BLOCK] = {0}, db_sum[COLUMN_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C + c0;
                const float *dy = dout + (size_t)n * C + c0;
                float m = mean[n], s = rstd[n];
                for (int j = 0; j < width; j++) {
                    dw_sum[j] += dy[j] * ((x[j] - m) * s);
                    db_sum[j] += dy[j];
                }
            }
            for (int j = 0; j < width; j++) {
                if (dw != NULL)
                    dw[c0 + j] += dw_sum[j];
                if (db != NULL)
                    db[c0 + j] += db_sum[j];
            }
        }
    }
}
