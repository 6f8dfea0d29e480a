/*
 * Embedding lookup and the broadcast add of per-position rows.
 */
#include <string.h>

#include "kernels.h"

/* Columns per block in the table-gradient scatter. */
enum { COLUMN_BLOCK = 32 };

void tr_cpu_embedding_forward(float *out, const int32_t *idx, const float *table, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, table + (size_t)idx[n] * C, (size_t)C * sizeof(float));
}

/* A 16-bit table (a frozen base's, rounded at load): each row widened as
 * it is gathered, no fp32 copy of the whole table. */
void tr_cpu_embedding_forward_half(float *out, const int32_t *idx, const uint16_t *table, int N,
                                   int C, int bf16)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        tr_cpu_from_half_serial(out + (size_t)n * C, table + (size_t)idx[n] * C, (size_t)C, bf16);
}

void tr_cpu_embedding_backward(float *dtable, const float *dout, const int32_t *idx, int N, int C)
{
    if (dtable == NULL)
        return;
    /* Repeated indices make rows collide, so threads split the columns, not
     * the rows: each thread walks all rows in order for its own columns, which
     * keeps the sums free of races and independent of the thread count. */
    int blocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * COLUMN_BLOCK;
        int width = C - c0 < COLUMN_BLOCK ? C - c0 : COLUMN_BLOCK;
        for (int n = 0; n < N; n++) {
            float *dst = dtable + (size_t)idx[n] * C + c0;
            const float *src = dout + (size_t)n * C + c0;
            for (int j = 0; j < width; j++)
                dst[j] += src[j];
        }
    }
}

void tr_cpu_add_rows_forward(float *out, const float *x, const float *p, int B, int T, int C)
{
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t row = ((size_t)b * T + t) * C;
            const float *pos = p + (size_t)t * C;
            for (int c = 0; c < C; c++)
                out[row + c] = x[row + c] + pos[c];
        }
}

void tr_cpu_add_rows_backward(float *dx, float *dp, const float *dout, int B, int T, int C)
{
    if (dx != NULL) {
        size_t n = (size_t)B * T * C;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            dx[i] += dout[i];
    }
    if (dp != NULL) {
        /* each position row is owned by one thread and sums the batch in order */
#pragma omp parallel for schedule(static)
        for (int t = 0; t < T; t++) {
            float *dpos = dp + (size_t)t * C;
            for (int b = 0; b < B; b++) {
                const float *src = dout + ((size_t)b * T + t) * C;
                for (int c = 0; c < C; c++)
                    dpos[c] += src[c];
            }
        }
    }
}
