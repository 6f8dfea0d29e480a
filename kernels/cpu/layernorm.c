/*
 * LayerNorm over the last dimension, biased variance.
 *
 * Row statistics are accumulated in double, in vectorised loops: their lane
 * order is fixed by the code, not by the threads (rows are split between
 * threads, never a row), so results do not depend on the thread count.  (The
 * sums were serial double chains, latency-bound: 3x the time the row's
 * bytes take to stream.)
 *
 * One body serves fp32 and 16-bit activations (the *_act kernels,
 * kernels.h): the input is read through tr_cpu_act_read, which hands out
 * the stored floats themselves or a tile widened on the stack, and the
 * output goes through tr_cpu_act_dst / tr_cpu_act_write.  The arithmetic
 * sees the same fp32 values in the same order either way, so a 16-bit
 * result is the fp32 kernel's on the widened input, rounded once.
 */
#include <math.h>

#include "kernels.h"

/* Columns per block in the dw/db column sums. */
enum { COLUMN_BLOCK = 64 };

/* Columns of a 16-bit row widened at a time (on the stack).  A row that
 * fits in one tile, as model widths do, is widened once for all the passes
 * over it; a wider one tile by tile in each pass. */
enum { ROW_TILE = 1024 };

/* columns [c0, c0+len) of row `row` (its first element) of x as fp32: from
 * the row widened once (whole, when not NULL), or widened into buf now */
static inline const float *row_tile(struct tr_cpu_act x, const float *whole, size_t row, int c0,
                                    int len, float *buf)
{
    return whole ? whole + c0 : tr_cpu_act_read(x, row + (size_t)c0, (size_t)len, buf);
}

/* the whole row at once where it fits one tile (fp32 rows always) */
static inline const float *row_whole(struct tr_cpu_act x, size_t row, int C, float *buf)
{
    return x.dtype == TR_F32 || C <= ROW_TILE ? tr_cpu_act_read(x, row, (size_t)C, buf) : NULL;
}

void tr_cpu_layernorm_forward_act(struct tr_cpu_act out, float *mean, float *rstd,
                                  struct tr_cpu_act inp, const float *w, const float *b, int N,
                                  int C, float eps)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float xbuf[ROW_TILE], ybuf[ROW_TILE];
        size_t row = (size_t)n * C;
        const float *whole = row_whole(inp, row, C, xbuf);
        double sum = 0.0;
        for (int c0 = 0; c0 < C; c0 += ROW_TILE) {
            int len = C - c0 < ROW_TILE ? C - c0 : ROW_TILE;
            const float *x = row_tile(inp, whole, row, c0, len, xbuf);
#pragma omp simd reduction(+ : sum)
            for (int c = 0; c < len; c++)
                sum += x[c];
        }
        float m = (float)(sum / C);
        double sq = 0.0;
        for (int c0 = 0; c0 < C; c0 += ROW_TILE) {
            int len = C - c0 < ROW_TILE ? C - c0 : ROW_TILE;
            const float *x = row_tile(inp, whole, row, c0, len, xbuf);
#pragma omp simd reduction(+ : sq)
            for (int c = 0; c < len; c++) {
                float d = x[c] - m;
                sq += (double)d * d;
            }
        }
        float s = (float)(1.0 / sqrt(sq / C + eps));
        for (int c0 = 0; c0 < C; c0 += ROW_TILE) {
            int len = C - c0 < ROW_TILE ? C - c0 : ROW_TILE;
            const float *x = row_tile(inp, whole, row, c0, len, xbuf);
            const float *wt = w + c0, *bt = b + c0;
            float *y = tr_cpu_act_dst(out, row + (size_t)c0, ybuf);
            for (int c = 0; c < len; c++)
                y[c] = (x[c] - m) * s * wt[c] + bt[c];
            tr_cpu_act_write(out, row + (size_t)c0, (size_t)len, y);
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

void tr_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, float eps)
{
    tr_cpu_layernorm_forward_act((struct tr_cpu_act){out, TR_F32}, mean, rstd,
                                 (struct tr_cpu_act){(void *)inp, TR_F32}, w, b, N, C, eps);
}

void tr_cpu_layernorm_backward_act(float *dinp, float *dw, float *db, const float *dout,
                                   struct tr_cpu_act inp, const float *w, const float *mean,
                                   const float *rstd, int N, int C)
{
    if (dinp != NULL) {
        /* dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * w */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float xbuf[ROW_TILE];
            size_t row = (size_t)n * C;
            const float *whole = row_whole(inp, row, C, xbuf);
            float m = mean[n], s = rstd[n];
            double g_sum = 0.0, g_xhat_sum = 0.0;
            for (int c0 = 0; c0 < C; c0 += ROW_TILE) {
                int len = C - c0 < ROW_TILE ? C - c0 : ROW_TILE;
                const float *x = row_tile(inp, whole, row, c0, len, xbuf);
                const float *dy = dout + row + c0, *wt = w + c0;
#pragma omp simd reduction(+ : g_sum, g_xhat_sum)
                for (int c = 0; c < len; c++) {
                    float g = dy[c] * wt[c];
                    g_sum += g;
                    g_xhat_sum += (double)g * ((x[c] - m) * s);
                }
            }
            float g_mean = (float)(g_sum / C);
            float g_xhat_mean = (float)(g_xhat_sum / C);
            for (int c0 = 0; c0 < C; c0 += ROW_TILE) {
                int len = C - c0 < ROW_TILE ? C - c0 : ROW_TILE;
                const float *x = row_tile(inp, whole, row, c0, len, xbuf);
                const float *dy = dout + row + c0, *wt = w + c0;
                float *dx = dinp + row + c0;
                for (int c = 0; c < len; c++) {
                    float xhat = (x[c] - m) * s;
                    float g = dy[c] * wt[c];
                    dx[c] += s * (g - g_mean - xhat * g_xhat_mean);
                }
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
            float xbuf[COLUMN_BLOCK];
            for (int n = 0; n < N; n++) {
                const float *x = tr_cpu_act_read(inp, (size_t)n * C + c0, (size_t)width, xbuf);
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

void tr_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    tr_cpu_layernorm_backward_act(dinp, dw, db, dout, (struct tr_cpu_act){(void *)inp, TR_F32}, w,
                                  mean, rstd, N, C);
}
