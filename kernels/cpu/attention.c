/*
 * Causal multi-head self-attention, flash style: the T x T probabilities are
 * never stored.
 *
 * Each head reads its q, k, v straight out of qkv[B,T,3C] (leading dimension
 * 3C), so nothing is gathered.  Queries go in blocks of Q_BLOCK rows, keys in
 * blocks of K_BLOCK; a query block [r0, r1) only visits keys 0..r1-1.
 *
 * Forward: for each key block, scores S = scale q k^T (a small GEMM), then an
 * online softmax: the running row maximum m and sum l are updated, the output
 * rows so far are rescaled by exp(m_old - m_new), and exp(S - m_new) @ v is
 * added.  At the end out /= l and lse = m + log(l) is kept for backward.
 *
 * Backward: P = exp(scale q k^T - lse) is recomputed block by block, and with
 * D = rowsum(dout * out) (= rowsum(P * dP)):
 *   dv += P^T dout,  dP = dout v^T,  dS = scale P (dP - D),
 *   dq += dS k,      dk += dS^T q.
 *
 * Every block is computed by the same sequence of serial GEMMs and loops
 * whatever the thread that runs it, so results do not depend on the thread
 * count.  The score blocks live on the stack (16 KiB each).
 */
#include <math.h>

#include "kernels.h"

/* K_BLOCK == Q_BLOCK: a key block starts at or before its query block, so
 * every query row sees at least one key of every block it visits. */
enum { Q_BLOCK = 64, K_BLOCK = 64 };

static int min_int(int a, int b) { return a < b ? a : b; }

void tr_cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                              int NH)
{
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int row_blocks = (T + Q_BLOCK - 1) / Q_BLOCK;
    /* query-row blocks are independent in the forward pass */
    int items = B * NH * row_blocks;
#pragma omp parallel for schedule(dynamic, 1)
    for (int item = 0; item < items; item++) {
        int blk = item % row_blocks;
        int h = (item / row_blocks) % NH;
        int b = item / (row_blocks * NH);
        int r0 = blk * Q_BLOCK;
        int r1 = min_int(r0 + Q_BLOCK, T);
        int rows = r1 - r0;
        const float *q = qkv + (size_t)b * T * C3 + h * hs;
        const float *k = q + C;
        const float *v = q + 2 * C;
        float *o = out + ((size_t)b * T + r0) * C + h * hs; /* rows x hs, ld C */
        float *lse_rows = lse + ((size_t)b * NH + h) * T + r0;
        float scores[Q_BLOCK * K_BLOCK]; /* rows x cols, ld K_BLOCK */
        float row_max[Q_BLOCK], row_sum[Q_BLOCK];

        for (int k0 = 0; k0 < r1; k0 += K_BLOCK) {
            int cols = min_int(K_BLOCK, r1 - k0);
            tr_cpu_sgemm_serial(0, 1, rows, cols, hs, scale, q + (size_t)r0 * C3, C3,
                                k + (size_t)k0 * C3, C3, 0.0f, scores, K_BLOCK);
            for (int i = 0; i < rows; i++) {
                float *s = scores + (size_t)i * K_BLOCK;
                int valid = min_int(cols, r0 + i - k0 + 1); /* causal: keys <= query */
                float m = s[0];
                for (int j = 1; j < valid; j++)
                    m = s[j] > m ? s[j] : m;
                if (k0 > 0 && row_max[i] > m)
                    m = row_max[i];
                float sum = tr_cpu_exp_shifted(s, valid, m);
                for (int j = valid; j < cols; j++)
                    s[j] = 0.0f;
                if (k0 == 0) {
                    row_sum[i] = sum;
                } else {
                    /* the output so far was weighted for the old maximum */
                    float correction = expf(row_max[i] - m);
                    row_sum[i] = row_sum[i] * correction + sum;
                    float *o_row = o + (size_t)i * C;
                    for (int d = 0; d < hs; d++)
                        o_row[d] *= correction;
                }
                row_max[i] = m;
            }
            /* o (+)= exp(S - m) @ v[k0:k0+cols] */
            tr_cpu_sgemm_serial(0, 0, rows, hs, cols, 1.0f, scores, K_BLOCK, v + (size_t)k0 * C3,
                                C3, k0 == 0 ? 0.0f : 1.0f, o, C);
        }
        for (int i = 0; i < rows; i++) {
            float inv = 1.0f / row_sum[i];
            float *o_row = o + (size_t)i * C;
            for (int d = 0; d < hs; d++)
                o_row[d] *= inv;
            lse_rows[i] = row_max[i] + logf(row_sum[i]);
        }
    }
}

size_t tr_cpu_attention_scratch_floats(int B, int T, int C, int NH)
{
    (void)C;
    return (size_t)B * NH * T;
}

void tr_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                               const float *qkv, const float *lse, int B, int T, int C, int NH)
{
    if (dqkv == NULL)
        return;
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    /* dk and dv sum over all query blocks, so one (batch, head) pair is one
     * thread's work and its blocks run in order */
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
            const float *dout_bh = dout + (size_t)b * T * C + h * hs; /* ld C */
            const float *out_bh = out + (size_t)b * T * C + h * hs;
            const float *lse_bh = lse + ((size_t)b * NH + h) * T;
            float *D = scratch + ((size_t)b * NH + h) * T;
            float probs[Q_BLOCK * K_BLOCK], dscores[Q_BLOCK * K_BLOCK]; /* ld K_BLOCK */

            for (int t = 0; t < T; t++) {
                const float *g = dout_bh + (size_t)t * C, *y = out_bh + (size_t)t * C;
                float dot = 0.0f;
                for (int d = 0; d < hs; d++)
                    dot += g[d] * y[d];
                D[t] = dot;
            }

            for (int r0 = 0; r0 < T; r0 += Q_BLOCK) {
                int r1 = min_int(r0 + Q_BLOCK, T);
                int rows = r1 - r0;
                const float *q_blk = q + (size_t)r0 * C3;
                const float *dout_blk = dout_bh + (size_t)r0 * C;
                for (int k0 = 0; k0 < r1; k0 += K_BLOCK) {
                    int cols = min_int(K_BLOCK, r1 - k0);
                    /* P = exp(scale q k^T - lse), zero above the diagonal */
                    tr_cpu_sgemm_serial(0, 1, rows, cols, hs, scale, q_blk, C3,
                                        k + (size_t)k0 * C3, C3, 0.0f, probs, K_BLOCK);
                    for (int i = 0; i < rows; i++) {
                        float *p = probs + (size_t)i * K_BLOCK;
                        int valid = min_int(cols, r0 + i - k0 + 1);
                        tr_cpu_exp_shifted(p, valid, lse_bh[r0 + i]);
                        for (int j = valid; j < cols; j++)
                            p[j] = 0.0f;
                    }
                    /* dv[k0:] += P^T dout */
                    tr_cpu_sgemm_serial(1, 0, cols, hs, rows, 1.0f, probs, K_BLOCK, dout_blk, C,
                                        1.0f, dv + (size_t)k0 * C3, C3);
                    /* dP = dout v^T, then dS = scale P (dP - D) in place */
                    tr_cpu_sgemm_serial(0, 1, rows, cols, hs, 1.0f, dout_blk, C,
                                        v + (size_t)k0 * C3, C3, 0.0f, dscores, K_BLOCK);
                    for (int i = 0; i < rows; i++) {
                        const float *p = probs + (size_t)i * K_BLOCK;
                        float *ds = dscores + (size_t)i * K_BLOCK;
                        float Di = D[r0 + i];
                        for (int j = 0; j < cols; j++)
                            ds[j] = scale * p[j] * (ds[j] - Di);
                    }
                    /* dq[r0:r1] += dS k[k0:],  dk[k0:] += dS^T q[r0:r1] */
                    tr_cpu_sgemm_serial(0, 0, rows, hs, cols, 1.0f, dscores, K_BLOCK,
                                        k + (size_t)k0 * C3, C3, 1.0f, dq + (size_t)r0 * C3, C3);
                    tr_cpu_sgemm_serial(1, 0, cols, hs, rows, 1.0f, dscores, K_BLOCK, q_blk, C3,
                                        1.0f, dk + (size_t)k0 * C3, C3);
                }
            }
        }
    }
}
