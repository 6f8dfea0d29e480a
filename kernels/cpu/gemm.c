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

/*
 * Tile sizes.  oneDNN's single-threaded sgemm has two code paths: for big
 * products it packs A and B into its own layout first; for small ones (on
 * AVX2, when 1/rows + 1/cols >= 0.0038, i.e. below about 512 x 512) it runs
 * a "no-copy" kernel straight on the caller's layout.  Packed runs ~15%
 * faster per core, and with A transposed and a large leading dimension the
 * no-copy kernel halves its speed (cache-set conflicts on the strided
 * columns).  So tiles are as big as possible: the grid starts as the whole
 * of C and halves the longer tile side until there are GEMM_MIN_TILES tiles
 * (work for a few threads, equal shares) and no side is longer than
 * GEMM_TILE_EDGE_MAX (more tiles only for products big enough to afford
 * them).  Halves keep the tiles of one product equal in size, which
 * balances the threads.
 */
enum {
    GEMM_MIN_TILES = 4,
    GEMM_TILE_EDGE_MAX = 1536,
    GEMM_TILE_EDGE_MIN = 64, /* never split a side below this */
    GEMM_TILE_ALIGN = 16,    /* tile edges in whole SIMD vectors */
};

/* The tile grid of C; a function of the shape only, never of the thread
 * count, so each element of C is always reduced by the same call. */
struct tile_grid {
    int rows, cols;       /* tile edges (the last row / column of tiles may be smaller) */
    int tiles_m, tiles_n; /* tiles down and across */
};

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

static int aligned_edge(int size, int parts)
{
    int edge = ceil_div(size, parts);
    int aligned = ceil_div(edge, GEMM_TILE_ALIGN) * GEMM_TILE_ALIGN;
    return aligned < size ? aligned : size;
}

static struct tile_grid gemm_tile_grid(int M, int N)
{
    int parts_m = 1, parts_n = 1;
    for (;;) {
        int rows = ceil_div(M, parts_m), cols = ceil_div(N, parts_n);
        int longer = rows > cols ? rows : cols;
        if (parts_m * parts_n >= GEMM_MIN_TILES && longer <= GEMM_TILE_EDGE_MAX)
            break;
        if (longer < 2 * GEMM_TILE_EDGE_MIN)
            break;
        if (rows >= cols)
            parts_m *= 2;
        else
            parts_n *= 2;
    }
    struct tile_grid g;
    g.rows = aligned_edge(M, parts_m);
    g.cols = aligned_edge(N, parts_n);
    g.tiles_m = ceil_div(M, g.rows);
    g.tiles_n = ceil_div(N, g.cols);
    return g;
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

/* Tile number `tile_index` of the grid, counted along rows of tiles. */
static void sgemm_tile(int tile_index, struct tile_grid grid, int trans_a, int trans_b, int M,
                       int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc)
{
    int i0 = (tile_index / grid.tiles_n) * grid.rows;
    int j0 = (tile_index % grid.tiles_n) * grid.cols;
    int rows = M - i0 < grid.rows ? M - i0 : grid.rows;
    int cols = N - j0 < grid.cols ? N - j0 : grid.cols;
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
    struct tile_grid grid = gemm_tile_grid(M, N);
    int tiles = grid.tiles_m * grid.tiles_n;
#pragma omp parallel
    {
        /* Affects only this region's implicit task: oneDNN, called from here,
         * then runs on this thread alone. */
        omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tiles; t++)
            sgemm_tile(t, grid, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
    struct tile_grid grid = gemm_tile_grid(M, N);
    int tiles = grid.tiles_m * grid.tiles_n;
    /* Inside a parallel region this changes only the calling task's setting,
     * and it is restored before returning. */
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int t = 0; t < tiles; t++)
        sgemm_tile(t, grid, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    omp_set_num_threads(saved_threads);
}
