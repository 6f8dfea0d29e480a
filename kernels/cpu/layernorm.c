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

/* Rows per partial sum of dw and db: the partials' count depends on N
 * alone, never on the threads, so results do not depend on the thread
 * count. */
enum { ROW_CHUNK = 32 };

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

size_t tr_cpu_layernorm_scratch_floats(int N, int C)
{
    return (size_t)((N + ROW_CHUNK - 1) / ROW_CHUNK) * 2 * (size_t)C;
}

/* One pass over x and dout, as in RMSNorm: each chunk of ROW_CHUNK rows
 * writes its dinp rows and its partial dw and db (rows in order) into
 * scratch; the partials are then summed in chunk order
 * (tr_cpu_linear_bias_backward's column sums).  (The column sums were a second pass over x and
 * dout in column blocks, a widening call per 64 elements of a 16-bit x.) */
void tr_cpu_layernorm_backward_act(float *dinp, float *dw, float *db, float *scratch,
                                   const float *dout, struct tr_cpu_act inp, const float *w,
                                   const float *mean, const float *rstd, int N, int C,
                                   unsigned write)
{
    int write_x = (write & 1u) != 0, write_w = (write & 2u) != 0, write_b = (write & 4u) != 0;
    if (dinp == NULL && dw == NULL && db == NULL)
        return;
    int chunks = (N + ROW_CHUNK - 1) / ROW_CHUNK;
    int sums = dw != NULL || db != NULL;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < chunks; k++) {
        /* dw's partials [chunks][C], then db's */
        float *pw = scratch + (size_t)k * C, *pb = scratch + ((size_t)chunks + k) * C;
        if (sums)
            for (int c = 0; c < C; c++)
                pw[c] = pb[c] = 0.0f;
        int n1 = (k + 1) * ROW_CHUNK < N ? (k + 1) * ROW_CHUNK : N;
        for (int n = k * ROW_CHUNK; n < n1; n++) {
            float xbuf[ROW_TILE];
            size_t row = (size_t)n * C;
            const float *whole = row_whole(inp, row, C, xbuf);
            float m = mean[n], s = rstd[n];
            float g_mean = 0.0f, g_xhat_mean = 0.0f;
            if (dinp != NULL) {
                /* dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * w */
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
                g_mean = (float)(g_sum / C);
                g_xhat_mean = (float)(g_xhat_sum / C);
            }
            for (int c0 = 0; c0 < C; c0 += ROW_TILE) {
                int len = C - c0 < ROW_TILE ? C - c0 : ROW_TILE;
                const float *x = row_tile(inp, whole, row, c0, len, xbuf);
                const float *dy = dout + row + c0, *wt = w + c0;
                if (dinp != NULL) {
                    float *dx = dinp + row + c0;
#pragma omp simd
                    for (int c = 0; c < len; c++) {
                        float xhat = (x[c] - m) * s;
                        float g = dy[c] * wt[c];
                        float d = s * (g - g_mean - xhat * g_xhat_mean);
                        dx[c] = write_x ? d : dx[c] + d;
                    }
                }
                if (sums) {
                    float *pwt = pw + c0, *pbt = pb + c0;
#pragma omp simd
                    for (int c = 0; c < len; c++) {
                        pwt[c] += dy[c] * ((x[c] - m) * s);
                        pbt[c] += dy[c];
                    }
                }
            }
        }
    }
    /* the chunks' partials, summed column by column in chunk order: the
     * bias gradient's column sum, as RMSNorm sums its own */
    if (dw != NULL)
        tr_cpu_linear_bias_backward(dw, scratch, chunks, C, write_w);
    if (db != NULL)
        tr_cpu_linear_bias_backward(db, scratch + (size_t)chunks * C, chunks, C, write_b);
}

void tr_cpu_layernorm_backward(float *dinp, float *dw, float *db, float *scratch,
                               const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C,
                               unsigned write)
{
    tr_cpu_layernorm_backward_act(dinp, dw, db, scratch, dout,
                                  (struct tr_cpu_act){(void *)inp, TR_F32}, w, mean, rstd, N, C,
                                  write);
}
