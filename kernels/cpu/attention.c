/*
 * Causal multi-head self-attention.
 *
 * Each head reads its q, k, v straight out of qkv[B,T,3C] (leading dimension
 * 3C), so nothing is gathered.  Query rows are processed in blocks of
 * ROW_BLOCK: a block of rows [r0, r1) only ever looks at keys 0..r1-1, so the
 * products skip most of the masked upper triangle while staying GEMMs.
 *
 * Every block is computed by the same sequence of serial GEMMs whatever the
 * thread that runs it, so results do not depend on the thread count.
 */
#include <math.h>

#include "kernels.h"

enum { ROW_BLOCK = 64 };

/* Softmax of att_row[0..t] in place; columns t+1..T-1 are masked to zero. */
static void causal_softmax_row(float *att_row, int t, int T)
{
    float max = att_row[0];
    for (int s = 1; s <= t; s++)
        max = att_row[s] > max ? att_row[s] : max;
    double sum = 0.0;
    for (int s = 0; s <= t; s++) {
        float e = expf(att_row[s] - max);
        att_row[s] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int s = 0; s <= t; s++)
        att_row[s] *= inv;
    for (int s = t + 1; s < T; s++)
        att_row[s] = 0.0f;
}

void tr_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH)
{
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int row_blocks = (T + ROW_BLOCK - 1) / ROW_BLOCK;
    /* query-row blocks are independent in the forward pass */
    int items = B * NH * row_blocks;
#pragma omp parallel for schedule(dynamic, 1)
    for (int item = 0; item < items; item++) {
        int blk = item % row_blocks;
        int h = (item / row_blocks) % NH;
        int b = item / (row_blocks * NH);
        int r0 = blk * ROW_BLOCK;
        int r1 = r0 + ROW_BLOCK < T ? r0 + ROW_BLOCK : T;
        int rows = r1 - r0;
        const float *q = qkv + (size_t)b * T * C3 + h * hs;
        const float *k = q + C;
        const float *v = q + 2 * C;
        float *att_bh = att + ((size_t)b * NH + h) * T * T;

        /* scores[r0:r1, 0:r1] = scale * q[r0:r1] @ k[0:r1]^T */
        tr_cpu_sgemm_serial(0, 1, rows, r1, hs, scale, q + (size_t)r0 * C3, C3, k, C3, 0.0f,
                            att_bh + (size_t)r0 * T, T);
        for (int t = r0; t < r1; t++)
            causal_softmax_row(att_bh + (size_t)t * T, t, T);
        /* out[r0:r1] = att[r0:r1, 0:r1] @ v[0:r1]; masked entries are zero */
        tr_cpu_sgemm_serial(0, 0, rows, hs, r1, 1.0f, att_bh + (size_t)r0 * T, T, v, C3, 0.0f,
                            out + ((size_t)b * T + r0) * C + h * hs, C);
    }
}

/* One slab of ROW_BLOCK x T floats per (batch, head) pair: it holds the
 * gradient of the attention scores for one block of query rows at a time.
 * Per pair rather than per thread, so the size does not depend on how many
 * threads run later. */
size_t tr_cpu_attention_scratch_floats(int B, int T, int C, int NH)
{
    (void)C;
    size_t block = T < ROW_BLOCK ? (size_t)T : ROW_BLOCK;
    return (size_t)B * NH * block * T;
}

void tr_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH)
{
    if (dqkv == NULL)
        return;
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    size_t slab_size = (T < ROW_BLOCK ? (size_t)T : ROW_BLOCK) * T;
    /* dk and dv sum over all query blocks, so one pair is one thread's work
     * and its blocks run in order */
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t head_offset = (size_t)b * T * C3 + h * hs;
            const float *q = qkv + head_offset;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *dq = dqkv + head_offset;
            float *dk = dq + C;
            float *dv = dq + 2 * C;
            const float *att_bh = att + ((size_t)b * NH + h) * T * T;
            const float *dout_bh = dout + (size_t)b * T * C + h * hs;
            float *dscores = scratch + ((size_t)b * NH + h) * slab_size; /* rows x T, ld T */

            for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
                int r1 = r0 + ROW_BLOCK < T ? r0 + ROW_BLOCK : T;
                int rows = r1 - r0;
                const float *att_blk = att_bh + (size_t)r0 * T;
                const float *dout_blk = dout_bh + (size_t)r0 * C;

                /* datt[rows, 0:r1] = dout[r0:r1] @ v[0:r1]^T */
                tr_cpu_sgemm_serial(0, 1, rows, r1, hs, 1.0f, dout_blk, C, v, C3, 0.0f, dscores,
                                    T);
                /* dv[0:r1] += att[r0:r1, 0:r1]^T @ dout[r0:r1] */
                tr_cpu_sgemm_serial(1, 0, r1, hs, rows, 1.0f, att_blk, T, dout_blk, C, 1.0f, dv,
                                    C3);
                /* softmax backward, with the score scale folded in:
                 * dscore = scale * p * (datt - sum(p * datt)) */
                for (int i = 0; i < rows; i++) {
                    int t = r0 + i;
                    const float *p = att_blk + (size_t)i * T;
                    float *ds = dscores + (size_t)i * T;
                    double dot = 0.0;
                    for (int s = 0; s <= t; s++)
                        dot += (double)p[s] * ds[s];
                    float dotf = (float)dot;
                    for (int s = 0; s <= t; s++)
                        ds[s] = scale * p[s] * (ds[s] - dotf);
                    for (int s = t + 1; s < r1; s++)
                        ds[s] = 0.0f;
                }
                /* dq[r0:r1] += dscores @ k[0:r1] */
                tr_cpu_sgemm_serial(0, 0, rows, hs, r1, 1.0f, dscores, T, k, C3, 1.0f,
                                    dq + (size_t)r0 * C3, C3);
                /* dk[0:r1] += dscores^T @ q[r0:r1] */
                tr_cpu_sgemm_serial(1, 0, r1, hs, rows, 1.0f, dscores, T, q + (size_t)r0 * C3, C3,
                                    1.0f, dk, C3);
            }
        }
    }
}
