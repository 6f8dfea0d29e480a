/*
 * Single-precision GEMM on top of oneDNN's row-major dnnl_sgemm.
 *
 * oneDNN's own threading may split the K dimension across threads, which
 * makes the rounding (and so the result) depend on the thread count.  To keep
 * results reproducible for any thread count, C is cut into a fixed grid of
 * tiles that depends only on the shape, and each tile is one single-threaded
 * dnnl_sgemm over the full K.  OpenMP spreads the tiles over threads; which
 * thread computes a tile never changes its value.
 */
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

enum {
    GEMM_TILE_MAX = 256, /* big tiles amortise oneDNN's packing of A and B */
    GEMM_TILE_MIN = 64,
    GEMM_MIN_TILES = 32, /* shrink tiles until there is this much parallel work */
};

/* Tile edge as a function of the shape only (never of the thread count). */
static int gemm_tile_size(int M, int N)
{
    int tile = GEMM_TILE_MAX;
    while (tile > GEMM_TILE_MIN) {
        long tiles = (long)((M + tile - 1) / tile) * ((N + tile - 1) / tile);
        if (tiles >= GEMM_MIN_TILES)
            break;
        tile /= 2;
    }
    return tile;
}

/* One oneDNN call; the caller guarantees oneDNN sees a single thread. */
static void sgemm_call(int trans_a, int trans_b, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc)
{
    dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                                      lda, B, ldb, beta, C, ldc);
    if (status != dnnl_success) {
        /* only reachable through inconsistent dimensions: a programming error */
        fprintf(stderr,
                "tr_cpu_sgemm: dnnl_sgemm failed (status %d): trans %d%d M=%d N=%d K=%d "
                "lda=%d ldb=%d ldc=%d\n",
                (int)status, trans_a, trans_b, M, N, K, lda, ldb, ldc);
        abort();
    }
}

/* Tile number `tile` of the grid: rows [i0, i0+tile), columns [j0, j0+tile) of C. */
static void sgemm_tile(int tile_index, int tile, int tiles_n, int trans_a, int trans_b, int M,
                       int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc)
{
    int i0 = (tile_index / tiles_n) * tile;
    int j0 = (tile_index % tiles_n) * tile;
    int rows = M - i0 < tile ? M - i0 : tile;
    int cols = N - j0 < tile ? N - j0 : tile;
    /* rows of op(A) are rows of A, or columns when A is stored transposed */
    const float *A_tile = trans_a ? A + i0 : A + (size_t)i0 * lda;
    /* columns of op(B) are columns of B, or rows when B is stored transposed */
    const float *B_tile = trans_b ? B + (size_t)j0 * ldb : B + j0;
    sgemm_call(trans_a, trans_b, rows, cols, K, alpha, A_tile, lda, B_tile, ldb, beta,
               C + (size_t)i0 * ldc + j0, ldc);
}

/* K == 0: op(A) op(B) is all zeros (BLAS leading-dimension checks would
 * reject lda = K = 0, so this case never reaches oneDNN). */
static void scale_c(int M, int N, float beta, float *C, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

void tr_cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    int tile = gemm_tile_size(M, N);
    int tiles_n = (N + tile - 1) / tile;
    int tiles = ((M + tile - 1) / tile) * tiles_n;
#pragma omp parallel
    {
        /* Affects only this region's implicit task: oneDNN, called from here,
         * then runs on this thread alone. */
        omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tiles; t++)
            sgemm_tile(t, tile, tiles_n, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                       C, ldc);
    }
}

void tr_cpu_sgemm_serial(int trans_a, int trans_b, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C,
                         int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    int tile = gemm_tile_size(M, N);
    int tiles_n = (N + tile - 1) / tile;
    int tiles = ((M + tile - 1) / tile) * tiles_n;
    /* Inside a parallel region this changes only the calling task's setting,
     * and it is restored before returning. */
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int t = 0; t < tiles; t++)
        sgemm_tile(t, tile, tiles_n, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                   ldc);
    omp_set_num_threads(saved_threads);
}
