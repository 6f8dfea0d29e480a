/*
 * Single-precision GEMM on top of oneDNN's row-major dnnl_sgemm.
 *
 * oneDNN's own threading may split the K dimension across threads, which
 * makes the rounding (and so the result) depend on the thread count.  To keep
 * results reproducible for any thread count, C is cut into a fixed grid of
 * tiles that depends only on the shape, and each tile is one single-threaded
 * dnnl_sgemm over the full K.  OpenMP spreads the tiles over threads; which
 * thread computes a tile never changes its value.
 *
 * One file past 700 lines because it is one GEMM: the tile grid, the copies
 * of transposed operands and the bf16 matmul primitives (cached per shape)
 * all serve the same reproducible product and share its shape rules.
 */
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    GEMM_SHORT_K = 32,       /* at most this K: strips of whole rows (gemm_tile_grid) */
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

static struct tile_grid gemm_tile_grid(int M, int N, int K)
{
    int parts_m = 1, parts_n = 1;
    /* A short K (an adapter's rank) makes each call's fixed cost count:
     * GEMM_MIN_TILES strips of whole rows run oneDNN's bf16 product 1.1-3x
     * faster than the halved tiles (2 threads, 1024 x N x 16 accumulating:
     * N 1536 0.29 -> 0.26 ms, 576 0.19 -> 0.06, 192 0.032 -> 0.020). */
    if (K <= GEMM_SHORT_K) { /* no side above GEMM_TILE_EDGE_MAX all the same */
        while ((parts_m < GEMM_MIN_TILES && ceil_div(M, 2 * parts_m) >= GEMM_TILE_EDGE_MIN) ||
               ceil_div(M, parts_m) > GEMM_TILE_EDGE_MAX)
            parts_m *= 2;
        parts_n = ceil_div(N, GEMM_TILE_EDGE_MAX);
        struct tile_grid g = {aligned_edge(M, parts_m), aligned_edge(N, parts_n), 0, 0};
        g.tiles_m = ceil_div(M, g.rows);
        g.tiles_n = ceil_div(N, g.cols);
        return g;
    }
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

/*
 * A transposed A read as a narrow slice of wide rows -- the weight
 * gradient dW = dout^T x, whose tiles take `rows` columns of each of dout's
 * K rows, lda apart -- runs oneDNN's no-copy kernel 10-25% slower than the
 * same product from contiguous rows: the strided columns fall into the same
 * cache sets (AVX2 Zen 3, one thread, 384 x 384 x 2048: lda 1536 64 GFLOP/s,
 * lda 1552 81, lda 400 85; 288 x 384 x 2048: lda 1152 71, lda 288 81).  So
 * on CPUs without AVX-512 such a tile's slice of A is first copied into rows
 * of its own width, padded off a multiple of 128 floats (a few percent of
 * the product's time; same arithmetic, same bits).  AVX-512 CPUs run oneDNN's
 * other kernels and keep the direct call until this is measured there.
 * Where the copy cannot be allocated the tile runs directly.
 */
enum { GEMM_COPY_MIN_K = 256 }; /* below this the copy does not pay for itself */

static int copy_a_slice(int trans_a, int rows, int K, int lda)
{
    return trans_a && K >= GEMM_COPY_MIN_K && lda >= 2 * rows && !tr_cpu_avx512f();
}

static int padded_ld(int rows)
{
    int ld = (rows + 15) / 16 * 16;
    return ld % 128 == 0 ? ld + 16 : ld;
}

/* Rows x cols of C0 (elem bytes each, ldc apart, as C) copied into C from
 * row i0, column j0: a product of no terms (K = 0) onto C0. */
static void copy_tile(void *C, const void *C0, size_t elem, int ldc, int i0, int j0, int rows,
                      int cols)
{
    if (C0 == NULL || C0 == C)
        return;
    for (int i = i0; i < i0 + rows; i++)
        memcpy((char *)C + ((size_t)i * ldc + j0) * elem,
               (const char *)C0 + ((size_t)i * ldc + j0) * elem, (size_t)cols * elem);
}

/*
 * A product onto C0 (tr_cpu_sgemm_onto, tr_cpu_gemm_bf16_onto) runs each
 * tile's product with beta 0 into a buffer of the calling thread's, then
 * stores C0 + product into C in one pass while the buffer is in cache (C0
 * may be C: each element is read before it is written).  So the result is,
 * bit for bit, C0 plus the product tr_cpu_sgemm (tr_cpu_gemm_bf16) makes,
 * rounded once where C is bf16.
 * Starting C as C0 and multiplying with beta 1 instead made oneDNN read C
 * back through its kernels: slower than the product and an add apart for
 * the adapters' rank-16 products (2 threads, 1024 x 576 x 16: 0.28 against
 * 0.24 ms).  The buffer lives as long as the thread, grown on first use (a
 * tile is at most GEMM_TILE_EDGE_MAX squared).
 */
static _Thread_local float *onto_buf;
static _Thread_local size_t onto_cap;

static float *onto_tile_buffer(size_t floats)
{
    if (floats > onto_cap) {
        free(onto_buf);
        onto_buf = NULL;
        onto_cap = 0;
        void *p = NULL;
        if (posix_memalign(&p, 64, floats * sizeof(float)) != 0) {
            fprintf(stderr, "trainrun: out of memory for a GEMM tile (%zu floats)\n", floats);
            abort();
        }
        onto_buf = p;
        onto_cap = floats;
    }
    return onto_buf;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "bf16_lanes.h"
#define ONTO_HAVE_AVX512 1

/* One row of store_onto's bf16 case, 16 lanes at a time: widen C0, add,
 * round as tr_f32_to_bf16 (bf16_lanes.h); the same bits as the scalar loop
 * (2 threads, the rank-16 product onto bf16, 1024 rows in strips: 1536 wide
 * 0.45 -> 0.36 ms, 576 wide 0.105 -> 0.09, against the scalar loop). */
static __attribute__((target("avx512f"))) void onto_row_bf16_avx512(uint16_t *c16,
                                                                     const uint16_t *c0,
                                                                     const float *p, int cols)
{
    int j = 0;
    for (; j + 16 <= cols; j += 16) {
        __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(c0 + j))),
            16));
        tr_bf16_store16(c16 + j, _mm512_add_ps(_mm512_loadu_ps(p + j), x));
    }
    for (; j < cols; j++)
        c16[j] = tr_f32_to_bf16(p[j] + tr_bf16_to_f32(c0[j]));
}
#endif

/* C (fp32) or C16 (bf16, rounded as tr_f32_to_bf16) = C0 + P, row i0 and
 * column j0 on, P the tile's rows x cols product (ld cols); C0 in C's type. */
static void store_onto(float *C, uint16_t *C16, const void *C0, int ldc, int i0, int j0, int rows,
                       int cols, float *P)
{
    for (int i = 0; i < rows; i++) {
        size_t at = (size_t)(i0 + i) * ldc + j0;
        float *p = P + (size_t)i * cols;
        if (C != NULL) {
            const float *c0 = (const float *)C0 + at;
            float *c = C + at;
            for (int j = 0; j < cols; j++)
                c[j] = c0[j] + p[j];
        } else {
            const uint16_t *c0 = (const uint16_t *)C0 + at;
#ifdef ONTO_HAVE_AVX512
            if (tr_cpu_avx512f()) {
                onto_row_bf16_avx512(C16 + at, c0, p, cols);
                continue;
            }
#endif
            for (int j = 0; j < cols; j++) {
                uint32_t u = (uint32_t)c0[j] << 16;
                float x;
                memcpy(&x, &u, sizeof x);
                p[j] += x;
            }
            tr_cpu_to_half_serial(C16 + at, p, (size_t)cols, 1);
        }
    }
}

/* Tile number `tile_index` of the grid, counted along rows of tiles; with
 * C0, the product goes into the thread's tile buffer and C0 + it into C
 * (store_onto; beta is then not used). */
static void sgemm_tile(int tile_index, struct tile_grid grid, int trans_a, int trans_b, int M,
                       int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                       float beta, const float *C0, float *C, int ldc)
{
    int i0 = (tile_index / grid.tiles_n) * grid.rows;
    int j0 = (tile_index % grid.tiles_n) * grid.cols;
    int rows = M - i0 < grid.rows ? M - i0 : grid.rows;
    int cols = N - j0 < grid.cols ? N - j0 : grid.cols;
    float *out = C + (size_t)i0 * ldc + j0, *P = NULL;
    int ld_out = ldc;
    if (C0 != NULL) { /* the product apart, then C0 + it (store_onto) */
        out = P = onto_tile_buffer((size_t)rows * cols);
        ld_out = cols;
        beta = 0.0f;
    }
    /* rows of op(A) are rows of A, or columns when A is stored transposed */
    const float *A_tile = trans_a ? A + i0 : A + (size_t)i0 * lda;
    /* columns of op(B) are columns of B, or rows when B is stored transposed */
    const float *B_tile = trans_b ? B + (size_t)j0 * ldb : B + j0;
    float *copy = NULL;
    int ld_tile = lda;
    if (copy_a_slice(trans_a, rows, K, lda)) {
        ld_tile = padded_ld(rows);
        copy = malloc((size_t)K * ld_tile * sizeof *copy);
        if (copy != NULL) {
            for (int k = 0; k < K; k++)
                memcpy(copy + (size_t)k * ld_tile, A_tile + (size_t)k * lda,
                       (size_t)rows * sizeof *copy);
            A_tile = copy;
        } else {
            ld_tile = lda;
        }
    }
    sgemm_call(trans_a, trans_b, rows, cols, K, alpha, A_tile, ld_tile, B_tile, ldb, beta, out,
               ld_out);
    free(copy);
    if (P != NULL)
        store_onto(C, NULL, C0, ldc, i0, j0, rows, cols, P);
}

/* K == 0: op(A) op(B) is all zeros (BLAS leading-dimension checks would
 * reject lda = K = 0, so this case never reaches oneDNN). */
static void scale_c(int M, int N, float beta, float *C, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

/*
 * B stored transposed (op(B) = B^T: a Linear layer's forward, x W^T with W
 * as [out, in]) runs oneDNN 2.6's AVX-512 sgemm kernels 10-16% slower than
 * the same product with B in plain rows (one thread, Zen 4: 1024 x 576 x
 * 384 with ldc 1152, 91-95 against 106-108 GFLOP/s; 1024 x 768 x 384, 89
 * against 104; at 2048^3 the two are within 2%); its AVX2 kernels run both
 * alike.  So on AVX-512 a product with B transposed and enough rows of C to
 * pay for it first copies B into plain rows (K x N, padded like the A copy
 * above), once for all its tiles: the copy is K x N stores against 2 x M x
 * K x N FLOPs.  Only for a B of at most GEMM_COPY_B_MAX floats (a vocabulary
 * projection's would be a large transient allocation).  The decision
 * depends on the shape only, and the serial path makes the same one, so
 * the bits are the same for any thread count.
 */
enum {
    GEMM_COPY_B_MIN_M = 1024,
    GEMM_COPY_B_MAX = 4 << 20, /* floats: 16 MiB */
};

static int copy_b_whole(int trans_b, int M, int N, int K)
{
    return trans_b && M >= GEMM_COPY_B_MIN_M && (size_t)N * K <= GEMM_COPY_B_MAX &&
           tr_cpu_avx512f();
}

int tr_cpu_sgemm_plain_b(int M, int N, int K)
{
    return copy_b_whole(1, M, N, K);
}

int tr_cpu_sgemm_plain_b_ld(int N)
{
    return padded_ld(N);
}

/* Room for the plain-row copy of B that copy_b_whole asks for, ld *ld; NULL
 * where none is wanted or it cannot be allocated (the tiles then read B as
 * it is stored). */
static float *b_copy_room(int trans_b, int M, int N, int K, int *ld)
{
    *ld = padded_ld(N);
    return copy_b_whole(trans_b, M, N, K) ? malloc((size_t)K * *ld * sizeof(float)) : NULL;
}

/* dst[k * ld + n] = B[n * ldb + k] for the columns n0 <= n < n1 of op(B) */
static void transpose_b(float *dst, int ld, const float *B, int ldb, int n0, int n1, int K)
{
    enum { BK = 64 };
    for (int k0 = 0; k0 < K; k0 += BK) {
        int k1 = k0 + BK < K ? k0 + BK : K;
        for (int k = k0; k < k1; k++)
            for (int n = n0; n < n1; n++)
                dst[(size_t)k * ld + n] = B[(size_t)n * ldb + k];
    }
}

static void sgemm_threaded(int trans_a, int trans_b, int M, int N, int K, float alpha,
                           const float *A, int lda, const float *B, int ldb, float beta,
                           const float *C0, float *C, int ldc);

/* An fp32 product with a narrow K goes to the rank-r kernel (gemm_rank.c)
 * on every path, so its bits depend on the shape alone; 1 where it went. */
static int rank_product(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                        const float *B, int ldb, float alpha, float beta, const float *C0,
                        float *C, int ldc, int threaded)
{
    if (alpha != 1.0f || (beta != 0.0f && beta != 1.0f) || !tr_cpu_rank_gemm_takes(M, N, K))
        return 0;
    struct tr_cpu_rank_gemm p = {trans_a, trans_b, M,  N,  K, A, B, lda, ldb,
                                 C0,      C0 == NULL && beta == 1.0f, C, ldc};
    tr_cpu_rank_gemm(&p, threaded);
    return 1;
}

/*
 * A weight gradient with few columns -- dW = dout^T x of a linear with a
 * narrow input, an adapter's B [out, r] -- runs oneDNN's sgemm at half the
 * speed of the same product transposed, C^T = op(B)^T op(A)^T, whose rows
 * are the long side (2 threads, Xeon 4th gen, K 1024, r 16: 2560 rows 0.87
 * against 0.42 ms, 1536 rows 0.45 against 0.24, 960 rows 0.16 against 0.11;
 * oneDNN's bf16 product runs both alike).  So such a product (A stored
 * transposed, N at most GEMM_FLIP_MAX_N, M at least GEMM_FLIP_MIN_M, K past
 * the rank kernel's) is made transposed into a buffer of the thread's and
 * added into C.  A function of the shape: every path makes the same choice.
 */
enum { GEMM_FLIP_MAX_N = 32, GEMM_FLIP_MIN_M = 256 };

static _Thread_local float *flip_buf;
static _Thread_local size_t flip_cap;

static int flip_product(int trans_a, int M, int N, int K)
{
    return trans_a && N <= GEMM_FLIP_MAX_N && M >= GEMM_FLIP_MIN_M && K > TR_CPU_RANK_MAX;
}

static float *flip_buffer(size_t floats)
{
    if (floats > flip_cap) {
        free(flip_buf);
        flip_buf = malloc(floats * sizeof *flip_buf);
        if (flip_buf == NULL) {
            fprintf(stderr, "trainrun: out of memory for a GEMM buffer (%zu floats)\n", floats);
            abort();
        }
        flip_cap = floats;
    }
    return flip_buf;
}

/* C = P^T + beta C, P the N x M product (ld M) */
static void add_transposed(float *C, int ldc, const float *P, int M, int N, float beta)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float p = P[(size_t)j * M + i];
            float *c = C + (size_t)i * ldc + j;
            *c = beta == 0.0f ? p : p + beta * *c;
        }
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
    if (rank_product(trans_a, trans_b, M, N, K, A, lda, B, ldb, alpha, beta, NULL, C, ldc, 1))
        return;
    if (flip_product(trans_a, M, N, K)) {
        float *P = flip_buffer((size_t)N * M);
        tr_cpu_sgemm(!trans_b, !trans_a, N, M, K, alpha, B, ldb, A, lda, 0.0f, P, M);
        add_transposed(C, ldc, P, M, N, beta);
        return;
    }
    sgemm_threaded(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, NULL, C, ldc);
}

void tr_cpu_sgemm_onto(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                       const float *B, int ldb, const float *C0, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        copy_tile(C, C0, sizeof *C, ldc, 0, 0, M, N);
        return;
    }
    if (rank_product(trans_a, trans_b, M, N, K, A, lda, B, ldb, 1.0f, 0.0f, C0, C, ldc, 1))
        return;
    sgemm_threaded(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C0, C, ldc);
}

static void sgemm_threaded(int trans_a, int trans_b, int M, int N, int K, float alpha,
                           const float *A, int lda, const float *B, int ldb, float beta,
                           const float *C0, float *C, int ldc)
{
    struct tile_grid grid = gemm_tile_grid(M, N, K);
    int tiles = grid.tiles_m * grid.tiles_n;
    int ld;
    float *copy = b_copy_room(trans_b, M, N, K, &ld);
    const float *B_use = copy != NULL ? copy : B;
    int ldb_use = copy != NULL ? ld : ldb, trans_b_use = copy != NULL ? 0 : trans_b;
#pragma omp parallel
    {
        if (copy != NULL) {
#pragma omp for schedule(static)
            for (int n0 = 0; n0 < N; n0 += 16)
                transpose_b(copy, ld, B, ldb, n0, n0 + 16 < N ? n0 + 16 : N, K);
        }
        /* Affects only this region's implicit task: oneDNN, called from here,
         * then runs on this thread alone. */
        omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tiles; t++)
            sgemm_tile(t, grid, trans_a, trans_b_use, M, N, K, alpha, A, lda, B_use, ldb_use, beta,
                       C0, C, ldc);
    }
    free(copy);
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
    if (rank_product(trans_a, trans_b, M, N, K, A, lda, B, ldb, alpha, beta, NULL, C, ldc, 0))
        return;
    if (flip_product(trans_a, M, N, K)) {
        float *P = flip_buffer((size_t)N * M);
        tr_cpu_sgemm_serial(!trans_b, !trans_a, N, M, K, alpha, B, ldb, A, lda, 0.0f, P, M);
        add_transposed(C, ldc, P, M, N, beta);
        return;
    }
    struct tile_grid grid = gemm_tile_grid(M, N, K);
    int tiles = grid.tiles_m * grid.tiles_n;
    int ld;
    float *copy = b_copy_room(trans_b, M, N, K, &ld);
    if (copy != NULL) {
        transpose_b(copy, ld, B, ldb, 0, N, K);
        B = copy;
        ldb = ld;
        trans_b = 0;
    }
    /* Inside a parallel region this changes only the calling task's setting,
     * and it is restored before returning. */
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int t = 0; t < tiles; t++)
        sgemm_tile(t, grid, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, NULL, C, ldc);
    omp_set_num_threads(saved_threads);
    free(copy);
}

/*
 * ---- GEMMs with bf16 inputs and fp32 products, sums and output ----------
 *
 * Each tile is one oneDNN call on one thread: its bf16 GEMM function
 * (bf16_single, below: exported by libdnnl, undeclared in Debian's 2.x
 * headers), or a matmul primitive (src and weights bf16, dst f32) for the
 * tiles that add a bias and wherever libdnnl lacks the function.  The
 * determinism argument is the sgemm one: the same tile grid of C
 * (gemm_tile_grid, a function of the shape only), one single-threaded call
 * per tile over the full K.  A primitive decides its blocking from the
 * thread count it sees when it is created, so every primitive is created
 * with one OpenMP thread and only ever executed on one.
 *
 * Creating a primitive takes from a millisecond to tens of them, so each
 * tile shape (dimensions, transposes, leading dimensions, whether C
 * accumulates) gets one, created on first use and kept for the life of the
 * process in a table behind a mutex; a graph's shapes are fixed, so the
 * table stops growing after the first step.  oneDNN picks its kernel per
 * shape: its brgemm kernels for dense operands, its bf16 GEMM kernels for
 * the strided tiles of larger matrices; on AVX512-BF16 both multiply with
 * the bf16 dot-product instructions.
 *
 * Primitives run with user-managed scratchpads: by default oneDNN gives a
 * primitive the scratchpad of the thread that created it, and two threads
 * executing it at once would share that memory.  Each thread here keeps its
 * own scratchpad and its own stream, allocated on first use and kept for
 * the thread's life (OpenMP's worker threads live as long as the process).
 */
struct bf16_key {
    int trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate;
    int bias; /* an fp32 bias row added to every row of C, in the primitive */
    int c16;  /* C is bf16: the fp32 sums (+ bias) rounded as the primitive stores them */
};

struct bf16_prim {
    struct bf16_key key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a, b, c, bias, scratch;
    size_t scratch_bytes;
    struct bf16_prim *next;
};

enum { BF16_BUCKETS = 512 };

static pthread_mutex_t bf16_lock = PTHREAD_MUTEX_INITIALIZER;
static struct bf16_prim *bf16_table[BF16_BUCKETS];
static dnnl_engine_t bf16_engine;
static _Thread_local dnnl_stream_t bf16_stream;
static _Thread_local void *bf16_scratch;
static _Thread_local size_t bf16_scratch_size;

static void bf16_fail(const char *what, dnnl_status_t status, const struct bf16_key *k)
{
    /* reachable only through inconsistent dimensions, or a CPU oneDNN has no
     * bf16 matmul for, which callers check first (tr_cpu_gemm_bf16_available) */
    fprintf(stderr,
            "tr_cpu_gemm_bf16: %s failed (status %d): trans %d%d M=%d N=%d K=%d lda=%d ldb=%d "
            "ldc=%d accumulate=%d bias=%d\n",
            what, (int)status, k->trans_a, k->trans_b, k->M, k->N, k->K, k->lda, k->ldb, k->ldc,
            k->accumulate, k->bias);
    abort();
}

static unsigned bf16_hash(const struct bf16_key *k)
{
    const int *v = &k->trans_a;
    unsigned h = 2166136261u;
    for (size_t i = 0; i < sizeof *k / sizeof(int); i++)
        h = (h ^ (unsigned)v[i]) * 16777619u;
    return h % BF16_BUCKETS;
}

/* The engine; with bf16_lock held. */
static dnnl_status_t bf16_engine_locked(void)
{
    if (bf16_engine != NULL)
        return dnnl_success;
    return dnnl_engine_create(&bf16_engine, dnnl_cpu, 0);
}

/* A new primitive for k, or NULL with *status set; with bf16_lock held. */
static struct bf16_prim *bf16_create(const struct bf16_key *k, dnnl_status_t *status)
{
    dnnl_status_t s = bf16_engine_locked();
    struct bf16_prim *p = calloc(1, sizeof *p);
    if (p == NULL)
        s = dnnl_out_of_memory;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post_ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    /* op(A) is M x K: rows of A, or columns when A is stored transposed */
    dnnl_dims_t a_dims = {k->M, k->K}, a_strides = {k->trans_a ? 1 : k->lda, k->trans_a ? k->lda : 1};
    dnnl_dims_t b_dims = {k->K, k->N}, b_strides = {k->trans_b ? 1 : k->ldb, k->trans_b ? k->ldb : 1};
    dnnl_dims_t c_dims = {k->M, k->N}, c_strides = {k->ldc, 1};
    dnnl_dims_t bias_dims = {1, k->N}, bias_strides = {k->N, 1};
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&p->a, 2, a_dims, dnnl_bf16, a_strides);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&p->b, 2, b_dims, dnnl_bf16, b_strides);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&p->c, 2, c_dims, k->c16 ? dnnl_bf16 : dnnl_f32,
                                             c_strides);
    if (s == dnnl_success && k->bias)
        s = dnnl_memory_desc_init_by_strides(&p->bias, 2, bias_dims, dnnl_f32, bias_strides);
    dnnl_matmul_desc_t desc;
    if (s == dnnl_success)
        s = dnnl_matmul_desc_init(&desc, &p->a, &p->b, k->bias ? &p->bias : NULL, &p->c);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && k->accumulate) { /* C += op(A) op(B): the sum post-op */
        s = dnnl_post_ops_create(&post_ops);
        if (s == dnnl_success)
            s = dnnl_post_ops_append_sum(post_ops, 1.0f);
        if (s == dnnl_success)
            s = dnnl_primitive_attr_set_post_ops(attr, post_ops);
    }
    /* the blocking is chosen for the threads oneDNN sees now: one */
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    if (s == dnnl_success)
        s = dnnl_primitive_desc_create(&pd, &desc, attr, bf16_engine, NULL);
    if (s == dnnl_success)
        s = dnnl_primitive_create(&p->prim, pd);
    omp_set_num_threads(saved_threads);
    if (s == dnnl_success) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        if (md != NULL) {
            p->scratch = *md;
            p->scratch_bytes = dnnl_memory_desc_get_size(md);
        }
        p->key = *k;
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (post_ops)
        dnnl_post_ops_destroy(post_ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) {
        free(p);
        *status = s;
        return NULL;
    }
    return p;
}

/* The primitive for k, created on first use. */
static struct bf16_prim *bf16_get(const struct bf16_key *k)
{
    unsigned h = bf16_hash(k);
    pthread_mutex_lock(&bf16_lock);
    struct bf16_prim *p = bf16_table[h];
    while (p != NULL && memcmp(&p->key, k, sizeof *k) != 0)
        p = p->next;
    dnnl_status_t status = dnnl_success;
    if (p == NULL && (p = bf16_create(k, &status)) != NULL) {
        p->next = bf16_table[h];
        bf16_table[h] = p;
    }
    pthread_mutex_unlock(&bf16_lock);
    if (p == NULL)
        bf16_fail("creating the matmul primitive", status, k);
    return p;
}

/* This thread's stream and a scratchpad of at least `bytes`. */
static dnnl_stream_t bf16_thread_stream(const struct bf16_key *k)
{
    if (bf16_stream == NULL) {
        pthread_mutex_lock(&bf16_lock);
        dnnl_status_t s = bf16_engine_locked();
        pthread_mutex_unlock(&bf16_lock);
        if (s == dnnl_success)
            s = dnnl_stream_create(&bf16_stream, bf16_engine, dnnl_stream_default_flags);
        if (s != dnnl_success)
            bf16_fail("creating a stream", s, k);
    }
    return bf16_stream;
}

static void *bf16_thread_scratch(size_t bytes, const struct bf16_key *k)
{
    if (bytes > bf16_scratch_size) {
        free(bf16_scratch);
        bf16_scratch = NULL;
        bf16_scratch_size = 0;
        size_t rounded = (bytes + 4095) & ~(size_t)4095;
        if (posix_memalign(&bf16_scratch, 64, rounded) != 0) {
            bf16_scratch = NULL;
            bf16_fail("allocating the scratchpad", dnnl_out_of_memory, k);
        }
        bf16_scratch_size = rounded;
    }
    return bf16_scratch;
}

/* One primitive execution on the calling thread: C (+)= op(A) op(B)
 * (+ the bias row, when bias is not NULL); C is fp32, or bf16 with c16. */
static void bf16_call(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda,
                      const uint16_t *B, int ldb, const float *bias, int accumulate, void *C,
                      int c16, int ldc)
{
    struct bf16_key k = {trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, bias != NULL, c16};
    struct bf16_prim *p = bf16_get(&k);
    dnnl_stream_t stream = bf16_thread_stream(&k);
    dnnl_memory_t mem[5] = {NULL, NULL, NULL, NULL, NULL};
    dnnl_exec_arg_t args[5];
    int n_args = 0;
    dnnl_status_t s = dnnl_memory_create(&mem[0], &p->a, bf16_engine, (void *)A);
    args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, mem[0]};
    if (s == dnnl_success)
        s = dnnl_memory_create(&mem[1], &p->b, bf16_engine, (void *)B);
    args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, mem[1]};
    if (s == dnnl_success)
        s = dnnl_memory_create(&mem[2], &p->c, bf16_engine, C);
    args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_DST, mem[2]};
    if (s == dnnl_success && p->scratch_bytes > 0) {
        s = dnnl_memory_create(&mem[3], &p->scratch, bf16_engine,
                               bf16_thread_scratch(p->scratch_bytes, &k));
        args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[3]};
    }
    if (s == dnnl_success && bias != NULL) {
        s = dnnl_memory_create(&mem[4], &p->bias, bf16_engine, (void *)bias);
        args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mem[4]};
    }
    if (s == dnnl_success)
        s = dnnl_primitive_execute(p->prim, stream, n_args, args);
    if (s == dnnl_success)
        s = dnnl_stream_wait(stream);
    for (int i = 0; i < 5; i++)
        if (mem[i] != NULL)
            dnnl_memory_destroy(mem[i]);
    if (s != dnnl_success)
        bf16_fail("executing the matmul primitive", s, &k);
}

/*
 * oneDNN's GEMM function for bf16 inputs: no per-call set-up (a matmul
 * primitive costs a table lookup under a lock, four memory objects and a
 * stream wait a call: as much as the product itself for attention's 64-row
 * blocks), and 6-12% faster than the primitive on the tiles of this file's
 * grid (one core of a Zen 5: 1024 x 768 x 384, 431 against 385 GFLOP/s;
 * 384 x 384 x 2048 transposed, 406 against 372).  libdnnl exports it
 * (DNNL_API in its source) but the 2.x headers Debian ships do not declare
 * it, so it is declared here, weak: where a libdnnl lacks it the primitive
 * runs the same product instead (the same exact bf16 products, summed in
 * fp32, perhaps in another order).
 */
extern dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                           dnnl_dim_t K, float alpha, const uint16_t *A,
                                           dnnl_dim_t lda, const uint16_t *B, dnnl_dim_t ldb,
                                           float beta, float *C, dnnl_dim_t ldc)
    __attribute__((weak));

/* C (+)= op(A) op(B) in one oneDNN call on the calling thread, which the
 * caller has made oneDNN's only one: the GEMM function where libdnnl has
 * it, else a primitive. */
static void bf16_single(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda,
                        const uint16_t *B, int ldb, int accumulate, float *C, int ldc)
{
    if (dnnl_gemm_bf16bf16f32 == NULL) {
        bf16_call(trans_a, trans_b, M, N, K, A, lda, B, ldb, NULL, accumulate, C, 0, ldc);
        return;
    }
    dnnl_status_t s = dnnl_gemm_bf16bf16f32(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K,
                                            1.0f, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C,
                                            ldc);
    if (s != dnnl_success) {
        struct bf16_key k = {trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, 0, 0};
        bf16_fail("dnnl_gemm_bf16bf16f32", s, &k);
    }
}

/* Tile number tile_index of C (+)= op(A) op(B) (+ bias), into fp32 C or,
 * when C is NULL, into bf16 C16.  A tile with a bias runs the primitive,
 * which adds it as it stores the sums (faster than starting the tile from
 * the bias rows for the GEMM function to add onto: 410 against 368 GFLOP/s
 * for the 6 x 384 GPT's 2048 x 1152 x 384 on one core); the others the GEMM
 * function.  A bf16 C16 is always the primitive's: it rounds the fp32 sums
 * (+ bias) as it stores them, where rounding each fp32 tile afterwards cost
 * wide forwards 15-25% (2 threads, Zen 4, 2048 x 1536 x 384: 279-297
 * against 343-365 GFLOP/s). */
static void bf16_tile(int tile_index, struct tile_grid grid, int trans_a, int trans_b, int M, int N,
                      int K, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                      const float *bias, int accumulate, const void *C0, float *C, int ldc,
                      uint16_t *C16)
{
    int i0 = (tile_index / grid.tiles_n) * grid.rows;
    int j0 = (tile_index % grid.tiles_n) * grid.cols;
    int rows = M - i0 < grid.rows ? M - i0 : grid.rows;
    int cols = N - j0 < grid.cols ? N - j0 : grid.cols;
    const uint16_t *A_tile = trans_a ? A + i0 : A + (size_t)i0 * lda;
    const uint16_t *B_tile = trans_b ? B + (size_t)j0 * ldb : B + j0;
    if (C0 != NULL) { /* the product apart, then C0 + it (store_onto) */
        float *P = onto_tile_buffer((size_t)rows * cols);
        bf16_single(trans_a, trans_b, rows, cols, K, A_tile, lda, B_tile, ldb, 0, P, cols);
        store_onto(C, C16, C0, ldc, i0, j0, rows, cols, P);
        return;
    }
    const float *bias_tile = bias != NULL ? bias + j0 : NULL;
    if (C == NULL)
        bf16_call(trans_a, trans_b, rows, cols, K, A_tile, lda, B_tile, ldb, bias_tile, accumulate,
                  C16 + (size_t)i0 * ldc + j0, 1, ldc);
    else if (bias != NULL)
        bf16_call(trans_a, trans_b, rows, cols, K, A_tile, lda, B_tile, ldb, bias_tile, accumulate,
                  C + (size_t)i0 * ldc + j0, 0, ldc);
    else
        bf16_single(trans_a, trans_b, rows, cols, K, A_tile, lda, B_tile, ldb, accumulate,
                    C + (size_t)i0 * ldc + j0, ldc);
}

static int bf16_accumulate(float beta)
{
    if (beta != 0.0f && beta != 1.0f) {
        fprintf(stderr, "tr_cpu_gemm_bf16: beta %g: only 0 and 1 are supported\n", beta);
        abort();
    }
    return beta == 1.0f;
}

/* C (+)= op(A) op(B) (+ bias), tile by tile over the threads; with C16 each
 * tile also rounded into it (bf16_tile).  K > 0. */
static void bf16_threaded(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                          int lda, const uint16_t *B, int ldb, const float *bias, int accumulate,
                          const void *C0, float *C, int ldc, uint16_t *C16)
{
    struct tile_grid grid = gemm_tile_grid(M, N, K);
    int tiles = grid.tiles_m * grid.tiles_n;
#pragma omp parallel
    {
        omp_set_num_threads(1); /* this task's oneDNN calls run on this thread alone */
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tiles; t++)
            bf16_tile(t, grid, trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, accumulate, C0, C,
                      ldc, C16);
    }
}

void tr_cpu_gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda,
                      const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
    int accumulate = bf16_accumulate(beta);
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    bf16_threaded(trans_a, trans_b, M, N, K, A, lda, B, ldb, NULL, accumulate, NULL, C, ldc, NULL);
}

void tr_cpu_gemm_bf16_bias(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                           int lda, const uint16_t *B, int ldb, const float *bias, float *C,
                           int ldc, uint16_t *C16)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* C = the bias rows (or zeros), rounded as a tile would be */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float v = bias != NULL ? bias[j] : 0.0f;
                if (C != NULL)
                    C[(size_t)i * ldc + j] = v;
                else
                    C16[(size_t)i * ldc + j] = tr_f32_to_bf16(v);
            }
        return;
    }
    bf16_threaded(trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, 0, NULL, C, ldc, C16);
}

void tr_cpu_gemm_bf16_onto(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                           int lda, const uint16_t *B, int ldb, const void *C0, float *C, int ldc,
                           uint16_t *C16)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        if (C != NULL)
            copy_tile(C, C0, sizeof *C, ldc, 0, 0, M, N);
        else
            copy_tile(C16, C0, sizeof *C16, ldc, 0, 0, M, N);
        return;
    }
    bf16_threaded(trans_a, trans_b, M, N, K, A, lda, B, ldb, NULL, 1, C0, C, ldc, C16);
}

void tr_cpu_gemm_bf16_serial(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                             int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
    int accumulate = bf16_accumulate(beta);
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    struct tile_grid grid = gemm_tile_grid(M, N, K);
    int tiles = grid.tiles_m * grid.tiles_n;
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int t = 0; t < tiles; t++)
        bf16_tile(t, grid, trans_a, trans_b, M, N, K, A, lda, B, ldb, NULL, accumulate, NULL, C,
                  ldc, NULL);
    omp_set_num_threads(saved_threads);
}

/*
 * ---- small bf16 products on the calling thread --------------------------
 *
 * Attention multiplies 64-row blocks, one block a thread: one call over the
 * whole block, no tiling (the block is already one thread's share, and its
 * shape alone decides the order of the sums), through the GEMM function
 * where libdnnl has it (bf16_single).
 */
void tr_cpu_gemm_bf16_block(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                            int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
    int accumulate = bf16_accumulate(beta);
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    bf16_single(trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
    omp_set_num_threads(saved_threads);
}

/* ---- which path: decided once per process ---- */

static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static int bf16_available;      /* oneDNN runs bf16 matmuls here (maybe emulating bf16) */
static const char *bf16_native; /* the instructions that make them native, or NULL */

static void bf16_probe(void)
{
    /* A tiny primitive tells whether oneDNN has a bf16 matmul for this CPU at
     * all (none without AVX-512); it stays in the table, like any other. */
    struct bf16_key k = {0, 0, 16, 16, 16, 16, 16, 16, 0, 0, 0};
    dnnl_status_t status;
    pthread_mutex_lock(&bf16_lock);
    struct bf16_prim *p = bf16_create(&k, &status);
    if (p != NULL) {
        unsigned h = bf16_hash(&k);
        p->next = bf16_table[h];
        bf16_table[h] = p;
    }
    pthread_mutex_unlock(&bf16_lock);
    bf16_available = p != NULL;
    /* oneDNN's ISA after ONEDNN_MAX_CPU_ISA, which can so force the
     * emulated path on a CPU that has the instructions */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (!bf16_available)
        bf16_native = NULL;
    else if (((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_amx) ==
             (unsigned)dnnl_cpu_isa_avx512_core_amx)
        bf16_native = "AMX-BF16";
    else if (((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
             (unsigned)dnnl_cpu_isa_avx512_core_bf16)
        bf16_native = "AVX512-BF16";
}

int tr_cpu_gemm_bf16_available(void)
{
    pthread_once(&bf16_once, bf16_probe);
    return bf16_available;
}

const char *tr_cpu_bf16_native_isa(void)
{
    pthread_once(&bf16_once, bf16_probe);
    return bf16_native;
}

const char *tr_cpu_gemm_path(enum tr_dtype compute)
{
    if (compute == TR_BF16) {
        const char *isa = tr_cpu_bf16_native_isa();
        if (isa != NULL)
            return strcmp(isa, "AMX-BF16") == 0 ? "bf16 GEMMs: native (AMX-BF16, oneDNN)"
                                                : "bf16 GEMMs: native (AVX512-BF16, oneDNN)";
        return "bf16 GEMMs: emulated on this CPU (no AVX512-BF16 or AMX-BF16 for oneDNN): inputs "
               "rounded to bf16 and multiplied in fp32, slower than fp32";
    }
    if (compute == TR_F16) /* oneDNN 2.x has no fp16 matmul for CPUs, and AMD has no fp16 units */
        return "fp16 GEMMs: emulated (the CPU backend has no native fp16 GEMM): inputs rounded to "
               "fp16 and multiplied in fp32, slower than fp32";
    return "fp32 GEMMs: oneDNN sgemm";
}
