/*
 * Linear layer and batched matmul, both as GEMMs.
 */
#include <omp.h>

#include "kernels.h"

/* Columns per block in the bias-gradient column sums. */
enum { COLUMN_BLOCK = 64 };

void tr_cpu_linear_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int IC, int OC)
{
    float beta = 0.0f;
    if (bias != NULL) {
        /* start from the bias and let the GEMM accumulate onto it */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++)
                out[(size_t)n * OC + o] = bias[o];
        beta = 1.0f;
    }
    /* out[N,OC] (+)= inp[N,IC] @ w[OC,IC]^T */
    tr_cpu_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
}

void tr_cpu_linear_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC)
{
    /* dinp[N,IC] += dout[N,OC] @ w[OC,IC] */
    if (dinp != NULL)
        tr_cpu_sgemm(0, 0, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dinp, IC);
    /* dw[OC,IC] += dout[N,OC]^T @ inp[N,IC] */
    if (dw != NULL)
        tr_cpu_sgemm(1, 0, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
    if (dbias != NULL)
        tr_cpu_linear_bias_backward(dbias, dout, N, OC);
}

void tr_cpu_linear_bias_backward(float *dbias, const float *dout, int N, int OC)
{
    /* Column sums over rows.  Each block of columns belongs to one thread and
     * sums the rows in order, so the result does not depend on the thread
     * count; the inner loop runs along a contiguous row. */
    int blocks = (OC + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int o0 = blk * COLUMN_BLOCK;
        int width = OC - o0 < COLUMN_BLOCK ? OC - o0 : COLUMN_BLOCK;
        float sum[COLUMN_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = dout + (size_t)n * OC + o0;
            for (int j = 0; j < width; j++)
                sum[j] += row[j];
        }
        for (int j = 0; j < width; j++)
            dbias[o0 + j] += sum[j];
    }
}

/* Many small products are better spread one per thread; few large ones are
 * better left to the GEMM's own threading.  Either way each product is
 * computed the same way, so the choice never changes the result. */
static int spread_over_batch(int batch)
{
    return batch > 1 && batch >= omp_get_max_threads();
}

void tr_cpu_matmul_forward(float *out, const float *a, const float *bm, int batch, int M, int K,
                           int N, int trans_b)
{
    size_t a_size = (size_t)M * K, b_size = (size_t)K * N, out_size = (size_t)M * N;
    int ldb = trans_b ? K : N;
    if (spread_over_batch(batch)) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < batch; i++)
            tr_cpu_sgemm_serial(0, trans_b, M, N, K, 1.0f, a + i * a_size, K, bm + i * b_size, ldb,
                                0.0f, out + i * out_size, N);
    } else {
        for (int i = 0; i < batch; i++)
            tr_cpu_sgemm(0, trans_b, M, N, K, 1.0f, a + i * a_size, K, bm + i * b_size, ldb, 0.0f,
                         out + i * out_size, N);
    }
}

/* Gradients of one product out = a @ op(bm); `gemm` is the serial or the
 * threaded GEMM (bitwise the same results). */
typedef void (*gemm_fn)(int, int, int, int, int, float, const float *, int, const float *, int,
                        float, float *, int);

static void matmul_backward_one(gemm_fn gemm, float *da, float *dbm, const float *dout,
                                const float *a, const float *bm, int M, int K, int N, int trans_b)
{
    if (trans_b) {
        /* bm stored [N,K]: out = a @ bm^T */
        if (da != NULL) /* da[M,K] += dout[M,N] @ bm[N,K] */
            gemm(0, 0, M, K, N, 1.0f, dout, N, bm, K, 1.0f, da, K);
        if (dbm != NULL) /* dbm[N,K] += dout^T[N,M] @ a[M,K] */
            gemm(1, 0, N, K, M, 1.0f, dout, N, a, K, 1.0f, dbm, K);
    } else {
        /* bm stored [K,N]: out = a @ bm */
        if (da != NULL) /* da[M,K] += dout[M,N] @ bm^T[N,K] */
            gemm(0, 1, M, K, N, 1.0f, dout, N, bm, N, 1.0f, da, K);
        if (dbm != NULL) /* dbm[K,N] += a^T[K,M] @ dout[M,N] */
            gemm(1, 0, K, N, M, 1.0f, a, K, dout, N, 1.0f, dbm, N);
    }
}

void tr_cpu_matmul_backward(float *da, float *dbm, const float *dout, const float *a,
                            const float *bm, int batch, int M, int K, int N, int trans_b)
{
    size_t a_size = (size_t)M * K, b_size = (size_t)K * N, out_size = (size_t)M * N;
    if (spread_over_batch(batch)) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < batch; i++)
            matmul_backward_one(tr_cpu_sgemm_serial, da ? da + i * a_size : NULL,
                                dbm ? dbm + i * b_size : NULL, dout + i * out_size, a + i * a_size,
                                bm + i * b_size, M, K, N, trans_b);
    } else {
        for (int i = 0; i < batch; i++)
            matmul_backward_one(tr_cpu_sgemm, da ? da + i * a_size : NULL,
                                dbm ? dbm + i * b_size : NULL, dout + i * out_size, a + i * a_size,
                                bm + i * b_size, M, K, N, trans_b);
    }
}
