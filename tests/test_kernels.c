/*
 * CPU kernel tests.
 *
 * Every op is checked against a plain double-precision reference written here:
 *  - forward: the float kernel matches the reference forward;
 *  - backward: with L = sum(out * R) for a random R, the float kernel's
 *    gradients (fed dout = R) match central finite differences of the double
 *    reference;
 *  - accumulation: backward adds to gradient buffers that already hold values.
 * Shapes and data come from a seeded generator, so failures reproduce.
 *
 * Covers: kernels/cpu/'s op files elementwise.c, attention.c, linear.c, gemm.c,
 * layernorm.c, rmsnorm.c, rope.c, embedding.c, loss.c, optim.c, param16.c, frozen_t.c
 * and convert.c, through backend.c; conv.c, pool.c and batchnorm.c are test_conv.c's.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <trainrun/mix.h>

#include "../rope_scaling.h"
#include "kernels.h"
#include "tensor_init.h"

#define FD_EPS 1e-6    /* finite-difference step on the double reference */
#define FWD_TOL 1e-5   /* forward error, relative to the largest reference value */
#define GRAD_TOL 1e-4  /* gradient error, relative to the largest reference gradient */
#define ACCUM_TOL 1e-6 /* accumulated minus first result, relative */

/* ---- deterministic random numbers (splitmix64) ------------------------ */

typedef struct {
    uint64_t state;
} rng_t;

static uint64_t rng_next(rng_t *rng)
{
    return tr_splitmix64_next(&rng->state);
}

static double rng_uniform(rng_t *rng, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(rng_next(rng) >> 11) / 9007199254740992.0);
}

/* uniform integer in [lo, hi] */
static int rng_int(rng_t *rng, int lo, int hi)
{
    return lo + (int)(rng_next(rng) % (uint64_t)(hi - lo + 1));
}

/* ---- buffers ------------------------------------------------------------ */

static float *fvec(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof(float));
    cr_assert(x != NULL, "out of memory");
    return x;
}

static double *dvec(size_t n)
{
    double *x = calloc(n ? n : 1, sizeof(double));
    cr_assert(x != NULL, "out of memory");
    return x;
}

static float *random_fvec(rng_t *rng, size_t n, double lo, double hi)
{
    float *x = fvec(n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)rng_uniform(rng, lo, hi);
    return x;
}

/* the double reference sees exactly the float kernel's inputs */
static double *to_double(const float *x, size_t n)
{
    double *y = dvec(n);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

static float *copy_fvec(const float *x, size_t n)
{
    float *y = fvec(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static void fill_f(float *x, size_t n, float value)
{
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

/* ---- comparisons -------------------------------------------------------- */

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* max |got - want| <= tol * max|want|.  Test data are O(1), so the scale is
 * floored at SCALE_FLOOR: a result that is (nearly) zero in exact arithmetic
 * is then checked in absolute terms instead of against rounding noise. */
#define SCALE_FLOOR 1e-3
static void expect_close(const char *what, const float *got, const double *want, size_t n,
                         double tol)
{
    double scale = fmax(max_abs(want, n), SCALE_FLOOR);
    double err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) { /* also catches NaN */
            err = e;
            worst = i;
        }
    }
    cr_assert(err <= tol * scale,
              "%s: max error %.3g at [%zu] (got %.8g, want %.8g), allowed %.3g (scale %.3g)",
              what, err, worst, n ? (double)got[worst] : 0.0, n ? want[worst] : 0.0, tol * scale,
              scale);
}

static void expect_close_ff(const char *what, const float *got, const float *want, size_t n,
                            double tol)
{
    double *w = to_double(want, n);
    expect_close(what, got, w, n, tol);
    free(w);
}

/* A second backward call on buffers that held `prefill` must give
 * prefill + first (the gradient from zeroed buffers). */
static void expect_accumulated(const char *what, const float *got, const float *prefill,
                               const float *first, size_t n)
{
    double *want = dvec(n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)prefill[i] + first[i];
    expect_close(what, got, want, n, ACCUM_TOL);
    free(want);
}

static void expect_bitwise(const char *what, const float *a, const float *b, size_t n)
{
    cr_assert(memcmp(a, b, n * sizeof(float)) == 0, "%s: not bitwise identical", what);
}

/* ---- finite differences --------------------------------------------------- */

/* A reference forward reads its inputs through ctx and writes out[n_out]. */
typedef void (*ref_forward_fn)(const void *ctx, double *out);

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* grad = dL/dx for L = sum(out * R); x is one of the arrays ctx reads. */
static void fd_gradient(ref_forward_fn forward, const void *ctx, double *x, size_t n,
                        const double *R, size_t n_out, double *grad)
{
    double *out = dvec(n_out);
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + FD_EPS;
        forward(ctx, out);
        double plus = dot(out, R, n_out);
        x[i] = saved - FD_EPS;
        forward(ctx, out);
        double minus = dot(out, R, n_out);
        x[i] = saved;
        grad[i] = (plus - minus) / (2.0 * FD_EPS);
    }
    free(out);
}

/* Checks a float kernel gradient against finite differences of `forward`
 * with respect to x. */
static void check_gradient(const char *what, const float *got, ref_forward_fn forward,
                           const void *ctx, double *x, size_t n, const double *R, size_t n_out)
{
    double *want = dvec(n);
    fd_gradient(forward, ctx, x, n, R, n_out, want);
    expect_close(what, got, want, n, GRAD_TOL);
    free(want);
}

/* ======================================================================== */
/* GEMM                                                                      */
/* ======================================================================== */

Test(sgemm, all_transposes_vs_naive)
{
    rng_t rng = {101};
    /* M, N, K: small ones, ones that cut C into several tiles, and one whose
     * transposed-A tiles are narrow slices of long rows (gemm.c copies those
     * on CPUs without AVX-512) */
    const int shapes[][3] = {{1, 1, 1},     {5, 7, 3},     {17, 9, 24}, {24, 40, 13},
                             {150, 70, 33}, {3, 300, 5},   {300, 40, 300}, {260, 20, 40}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    const float alpha = 0.7f, beta = -0.3f;
    for (int s = 0; s < n_shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int trans = 0; trans < 4; trans++) {
            int ta = trans & 1, tb = trans >> 1;
            /* stored shapes, with padded leading dimensions */
            int a_rows = ta ? K : M, a_cols = ta ? M : K;
            int b_rows = tb ? N : K, b_cols = tb ? K : N;
            int lda = a_cols + 3, ldb = b_cols + 2, ldc = N + 1;
            float *A = random_fvec(&rng, (size_t)a_rows * lda, -1, 1);
            float *B = random_fvec(&rng, (size_t)b_rows * ldb, -1, 1);
            float *C = random_fvec(&rng, (size_t)M * ldc, -1, 1);
            float *C_serial = copy_fvec(C, (size_t)M * ldc);
            double *want = dvec((size_t)M * ldc);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < ldc; j++) {
                    if (j >= N) { /* padding must stay untouched */
                        want[i * ldc + j] = C[i * ldc + j];
                        continue;
                    }
                    double sum = 0.0;
                    for (int k = 0; k < K; k++) {
                        double a = ta ? A[k * lda + i] : A[i * lda + k];
                        double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                        sum += a * b;
                    }
                    want[i * ldc + j] = alpha * sum + beta * (double)C[i * ldc + j];
                }
            tr_cpu_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            expect_close("sgemm", C, want, (size_t)M * ldc, FWD_TOL);
            tr_cpu_sgemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C_serial, ldc);
            expect_bitwise("sgemm_serial vs sgemm", C, C_serial, (size_t)M * ldc);
            free(A);
            free(B);
            free(C);
            free(C_serial);
            free(want);
        }
    }
}

/* Products big enough for tiles of several hundred rows and columns (where
 * oneDNN packs its inputs), one of them cut into more tiles than the 4 the
 * grid starts from, with K long enough that oneDNN's order of summation
 * differs between tile shapes: the same bits for 1, 2 and 3 threads and
 * serially, and the right values (every 7th row), for every transpose.
 * Both have over 1024 rows, so with B transposed on an AVX-512 CPU they run
 * gemm.c's copy of B into plain rows. */
Test(sgemm, large_tiles_same_bits_for_any_thread_count)
{
    rng_t rng = {103};
    enum { CHECKED_ROW_STRIDE = 7 };
    const int shapes[][3] = {{1300, 1100, 700}, {3100, 1700, 300}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    const float alpha = 1.0f, beta = 1.0f; /* weight gradients accumulate */
    int saved_threads = omp_get_max_threads();
    for (int s = 0; s < n_shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int trans = 0; trans < 4; trans++) {
            int ta = trans & 1, tb = trans >> 1;
            int a_rows = ta ? K : M, a_cols = ta ? M : K;
            int b_rows = tb ? N : K, b_cols = tb ? K : N;
            int lda = a_cols + 1, ldb = b_cols + 3, ldc = N;
            size_t c_size = (size_t)M * ldc;
            float *A = random_fvec(&rng, (size_t)a_rows * lda, -1, 1);
            float *B = random_fvec(&rng, (size_t)b_rows * ldb, -1, 1);
            float *C0 = random_fvec(&rng, c_size, -1, 1);
            double *want = dvec(c_size);
            for (int i = 0; i < M; i += CHECKED_ROW_STRIDE)
                for (int j = 0; j < N; j++) {
                    double sum = 0.0;
                    for (int k = 0; k < K; k++) {
                        double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                        double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                        sum += a * b;
                    }
                    want[(size_t)i * ldc + j] = alpha * sum + beta * (double)C0[(size_t)i * ldc + j];
                }
            float *C[3];
            for (int t = 0; t < 3; t++) {
                C[t] = copy_fvec(C0, c_size);
                omp_set_num_threads(t + 1);
                tr_cpu_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C[t], ldc);
            }
            omp_set_num_threads(saved_threads);
            for (int i = 0; i < M; i += CHECKED_ROW_STRIDE)
                expect_close("sgemm, large tiles", C[0] + (size_t)i * ldc, want + (size_t)i * ldc,
                             N, FWD_TOL);
            expect_bitwise("sgemm 2 threads vs 1", C[1], C[0], c_size);
            expect_bitwise("sgemm 3 threads vs 1", C[2], C[0], c_size);
            float *C_serial = copy_fvec(C0, c_size);
            tr_cpu_sgemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C_serial, ldc);
            expect_bitwise("sgemm_serial vs sgemm", C_serial, C[0], c_size);
            for (int t = 0; t < 3; t++)
                free(C[t]);
            free(A), free(B), free(C0), free(C_serial), free(want);
        }
    }
}

/* Products with a narrow side: a narrow K (an adapter's rank: gemm_rank.c
 * takes them on AVX-512 CPUs, oneDNN elsewhere), and few columns with many
 * rows (with A transposed, a narrow weight's gradient: made transposed,
 * gemm.c's flip_product): the right values for every transpose, with C
 * overwritten and accumulated, a last block of rows and columns cut short
 * and C's padding untouched; the same bits for 1, 2 and 3 threads and
 * serially. */
Test(sgemm, narrow_products_vs_naive_same_bits_for_any_thread_count)
{
    rng_t rng = {104};
    const int shapes[][3] = {{1, 256, 1},   {7, 300, 16},   {1031, 700, 32}, {64, 1536, 16},
                             {700, 16, 300}, {1031, 32, 64}, {256, 1, 40}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    int saved_threads = omp_get_max_threads();
    for (int s = 0; s < n_shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        cr_assert(K > TR_CPU_RANK_MAX || tr_cpu_rank_gemm_takes(M, N, K) == (tr_cpu_avx512f() != 0),
                  "%dx%dx%d", M, N, K);
        for (int trans = 0; trans < 8; trans++) {
            int ta = trans & 1, tb = (trans >> 1) & 1, accumulate = trans >> 2;
            float beta = accumulate ? 1.0f : 0.0f;
            int a_rows = ta ? K : M, a_cols = ta ? M : K;
            int b_rows = tb ? N : K, b_cols = tb ? K : N;
            int lda = a_cols + 3, ldb = b_cols + 2, ldc = N + 1;
            size_t c_size = (size_t)M * ldc;
            float *A = random_fvec(&rng, (size_t)a_rows * lda, -1, 1);
            float *B = random_fvec(&rng, (size_t)b_rows * ldb, -1, 1);
            float *C0 = random_fvec(&rng, c_size, -1, 1);
            double *want = dvec(c_size);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < ldc; j++) {
                    size_t at = (size_t)i * ldc + j;
                    double sum = 0.0;
                    for (int k = 0; k < K && j < N; k++)
                        sum += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                               (double)(tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                    want[at] = j >= N ? C0[at] : sum + (accumulate ? (double)C0[at] : 0.0);
                }
            float *C[3];
            for (int t = 0; t < 3; t++) {
                C[t] = copy_fvec(C0, c_size);
                omp_set_num_threads(t + 1);
                tr_cpu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C[t], ldc);
            }
            omp_set_num_threads(saved_threads);
            expect_close("narrow product", C[0], want, c_size, FWD_TOL);
            expect_bitwise("narrow product, 2 threads vs 1", C[1], C[0], c_size);
            expect_bitwise("narrow product, 3 threads vs 1", C[2], C[0], c_size);
            float *C_serial = copy_fvec(C0, c_size);
            tr_cpu_sgemm_serial(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C_serial, ldc);
            expect_bitwise("narrow product, serial vs threaded", C_serial, C[0], c_size);
            for (int t = 0; t < 3; t++)
                free(C[t]);
            free(A), free(B), free(C0), free(C_serial), free(want);
        }
    }
}

Test(sgemm, beta_zero_ignores_c_and_k_zero)
{
    rng_t rng = {102};
    int M = 70, N = 9, K = 5;
    float *A = random_fvec(&rng, (size_t)M * K, -1, 1);
    float *B = random_fvec(&rng, (size_t)K * N, -1, 1);
    float *C = fvec((size_t)M * N);
    fill_f(C, (size_t)M * N, NAN); /* beta = 0: C is write-only */
    tr_cpu_sgemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    for (int i = 0; i < M * N; i++)
        cr_assert(isfinite(C[i]), "beta = 0 read C");
    /* K = 0: C = beta * C */
    float *C2 = random_fvec(&rng, (size_t)M * N, -1, 1);
    float *C2_orig = copy_fvec(C2, (size_t)M * N);
    tr_cpu_sgemm(0, 0, M, N, 0, 1.0f, A, 1, B, N, 0.5f, C2, N);
    for (int i = 0; i < M * N; i++)
        cr_assert(C2[i] == 0.5f * C2_orig[i], "K = 0 must scale C by beta");
    fill_f(C2, (size_t)M * N, NAN);
    tr_cpu_sgemm(0, 0, M, N, 0, 1.0f, A, 1, B, N, 0.0f, C2, N);
    for (int i = 0; i < M * N; i++)
        cr_assert(C2[i] == 0.0f, "K = 0, beta = 0 must zero C");
    free(A);
    free(B);
    free(C);
    free(C2);
    free(C2_orig);
}

/* ======================================================================== */
/* bf16 GEMMs                                                                */
/* ======================================================================== */

/* Where oneDNN has no bf16 matmul (CPUs without AVX-512) the backend never
 * calls these GEMMs: precision bf16 is emulated there. */
static void need_gemm_bf16(void)
{
    if (!tr_cpu_gemm_bf16_available())
        cr_skip_test("oneDNN has no bf16 matmul for this CPU (no AVX-512): the backend emulates "
                     "bf16 here, and tests that path elsewhere");
}

static uint16_t *to_bf16_vec(const float *x, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert(h != NULL, "out of memory");
    for (size_t i = 0; i < n; i++)
        h[i] = tr_f32_to_bf16(x[i]);
    return h;
}

/* x rounded to bf16, as fp32: what the emulated path multiplies */
static float *bf16_rounded_vec(const float *x, size_t n)
{
    float *r = fvec(n);
    for (size_t i = 0; i < n; i++)
        r[i] = tr_bf16_to_f32(tr_f32_to_bf16(x[i]));
    return r;
}

static float float_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The vectorised conversions give tr_f32_to_bf16's bits for every kind of
 * input, at every position of a 16-lane vector and in the scalar tail;
 * and, where VCVTNE2PS2BF16 converts 32 at a time, for whole vectors of
 * subnormals (which it would flush to zero), of NaNs (which it quiets) and
 * of ordinary values, and one subnormal at each of the 32 lanes.  Run on
 * every path this CPU has (portable, AVX2, AVX-512: the elementwise cap). */
static void check_bf16_conversions(void)
{
    rng_t rng = {111};
    const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u, /* subnormals, ties */
        0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
        0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fbf0000u, 0x3f7fffffu};
    enum { N = 16 * 37 + 11 };
    float *in = fvec(N), *rounded = fvec(N);
    for (size_t i = 0; i < N; i++)
        in[i] = i % 3 == 0 ? float_bits(special[(i / 3) % (sizeof special / sizeof *special)])
                : i % 3 == 1 ? float_bits((uint32_t)rng_next(&rng))
                             : (float)rng_uniform(&rng, -3, 3);
    uint16_t *got = malloc(N * sizeof *got);
    for (size_t len = 0; len <= N; len += len < 40 ? 1 : 97) {
        memset(got, 0xa5, N * sizeof *got);
        tr_cpu_to_bf16(got, in, len);
        for (size_t i = 0; i < len; i++)
            cr_assert_eq(got[i], tr_f32_to_bf16(in[i]), "n=%zu: [%zu] = %a gives 0x%04x, want 0x%04x",
                         len, i, (double)in[i], got[i], tr_f32_to_bf16(in[i]));
        for (size_t i = len; i < N; i++)
            cr_assert_eq(got[i], 0xa5a5, "n=%zu: wrote past the end at [%zu]", len, i);
    }
    tr_cpu_round_to_half(rounded, in, N, 1);
    for (size_t i = 0; i < N; i++) {
        float want = tr_bf16_to_f32(tr_f32_to_bf16(in[i]));
        cr_assert(memcmp(&rounded[i], &want, sizeof want) == 0, "round_to_half bf16 [%zu]", i);
    }
    /* more than one block: the threaded split */
    size_t big = 100003;
    float *x = random_fvec(&rng, big, -100, 100);
    uint16_t *h = malloc(big * sizeof *h);
    tr_cpu_to_bf16(h, x, big);
    for (size_t i = 0; i < big; i++)
        cr_assert_eq(h[i], tr_f32_to_bf16(x[i]), "large array [%zu]", i);
    /* and back: tr_bf16_to_f32's bits for every pattern (NaNs, infinities,
     * subnormals), every length up to two vectors and a threaded one */
    uint16_t *all = malloc(65536 * sizeof *all);
    float *wide = malloc((65536 + 1) * sizeof *wide);
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    for (size_t len = 0; len <= 65536; len += len < 40 ? 1 : 65536 - 40) {
        wide[len] = 7.0f;
        tr_cpu_from_half(wide, all, len, 1);
        for (size_t i = 0; i < len; i++) {
            float want = tr_bf16_to_f32(all[i]);
            cr_assert(memcmp(&wide[i], &want, sizeof want) == 0, "from_half bf16 n=%zu [%zu]", len, i);
        }
        cr_assert_eq(wide[len], 7.0f, "from_half wrote past the end (n=%zu)", len);
    }
    /* blocks of 32 */
    enum { BLOCKS = 3 + 32 + 1, M = 32 * BLOCKS + 16 + 7 };
    float *v = fvec(M);
    uint16_t *vh = malloc(M * sizeof *vh);
    const uint32_t edge[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu,
                             0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00800000u,
                             0x80808000u, 0x00818000u, 0x3f7fffffu, 0x7f7f8000u};
    for (size_t i = 0; i < M; i++) {
        uint32_t r = (uint32_t)rng_next(&rng), sign = r & 0x80000000u, b = i / 32;
        uint32_t subnormal = sign | ((r >> 8) % 0x7fffffu + 1), nan = sign | 0x7f800000u | ((r >> 8) % 0x7fffffu + 1);
        uint32_t normal = sign | ((r >> 8) % 254u + 1) << 23 | (r & 0x7fffffu);
        if (i >= 32 * BLOCKS) /* a 16-lane vector of NaNs and a tail of subnormals */
            v[i] = float_bits(i < 32 * BLOCKS + 16 ? nan : subnormal);
        else if (b == 0) /* subnormals, ties of them among them */
            v[i] = float_bits(i % 4 == 0 ? sign | ((r >> 8) & 0x7f0000u) | 0x8000u : subnormal);
        else if (b == 1) /* NaNs, signalling and quiet, all payloads */
            v[i] = float_bits(i == 32 ? 0x7f800001u : i == 33 ? 0xffffffffu : nan);
        else if (b == 2) /* ties, overflow to inf, zeros, the smallest normals */
            v[i] = float_bits(i % 2 ? edge[(i / 2) % (sizeof edge / sizeof *edge)] : normal);
        else if (b < 3 + 32) /* ordinary values and one subnormal, at lane b - 3 */
            v[i] = float_bits(i % 32 == b - 3 ? subnormal : normal);
        else /* NaNs and infinities among ordinary values */
            v[i] = float_bits(i % 3 == 0 ? nan : i % 3 == 1 ? edge[5 + i % 2] : normal);
    }
    const size_t offsets[] = {0, 1, 16, 31};
    for (size_t o = 0; o < sizeof offsets / sizeof *offsets; o++)
        for (int how = 0; how < 3; how++) {
            size_t off = offsets[o], len = M - off;
            memset(vh, 0xa5, M * sizeof *vh);
            if (how == 0)
                tr_cpu_to_bf16(vh, v + off, len);
            else if (how == 1)
                tr_cpu_to_bf16_serial(vh, v + off, len);
            else
                tr_cpu_to_half_serial(vh, v + off, len, 1);
            for (size_t i = 0; i < len; i++)
                cr_assert_eq(vh[i], tr_f32_to_bf16(v[off + i]),
                             "blocks at offset %zu (%d): [%zu] = 0x%08x gives 0x%04x, want 0x%04x",
                             off, how, off + i, (unsigned)bits_of_float(v[off + i]), vh[i],
                             tr_f32_to_bf16(v[off + i]));
        }
    free(in), free(rounded), free(got), free(x), free(h), free(all), free(wide), free(v), free(vh);
}

Test(bf16, vectorised_conversion_matches_scalar)
{
    int widest = tr_cpu_elementwise_path();
    for (int path = TR_CPU_EW_PORTABLE; path <= widest; path++) {
        int cap = tr_cpu_elementwise_cap(path);
        cr_assert_eq(tr_cpu_elementwise_path(), path);
        check_bf16_conversions();
        tr_cpu_elementwise_cap(cap);
    }
}

/* The bf16 GEMM against the emulated one (tr_cpu_sgemm on the same numbers
 * rounded to bf16) and a double reference, every transpose, padded leading
 * dimensions, beta 0 and 1.  Products of bf16 numbers are exact in fp32, so
 * only the order of the fp32 sums differs: a tolerance of fp32 rounding,
 * far below bf16's (2^-8), which truncated products would exceed. */
Test(gemm_bf16, vs_emulated_all_transposes)
{
    need_gemm_bf16();
    rng_t rng = {112};
    const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {17, 9, 24}, {24, 40, 13}, {150, 70, 33},
                             {3, 300, 5}, {200, 130, 260}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    for (int s = 0; s < n_shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int variant = 0; variant < 8; variant++) {
            int ta = variant & 1, tb = (variant >> 1) & 1;
            float beta = variant >> 2 ? 1.0f : 0.0f;
            int a_rows = ta ? K : M, a_cols = ta ? M : K;
            int b_rows = tb ? N : K, b_cols = tb ? K : N;
            int lda = a_cols + 3, ldb = b_cols + 2, ldc = N + 1;
            size_t a_size = (size_t)a_rows * lda, b_size = (size_t)b_rows * ldb;
            size_t c_size = (size_t)M * ldc;
            float *A = random_fvec(&rng, a_size, -1, 1), *B = random_fvec(&rng, b_size, -1, 1);
            uint16_t *Ah = to_bf16_vec(A, a_size), *Bh = to_bf16_vec(B, b_size);
            float *Ar = bf16_rounded_vec(A, a_size), *Br = bf16_rounded_vec(B, b_size);
            float *C = random_fvec(&rng, c_size, -1, 1);
            float *C_emulated = copy_fvec(C, c_size), *C_serial = copy_fvec(C, c_size);
            double *want = dvec(c_size);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < ldc; j++) {
                    if (j >= N) { /* padding must stay untouched */
                        want[i * ldc + j] = C[i * ldc + j];
                        continue;
                    }
                    double sum = 0.0;
                    for (int k = 0; k < K; k++)
                        sum += (double)(ta ? Ar[k * lda + i] : Ar[i * lda + k]) *
                               (tb ? Br[j * ldb + k] : Br[k * ldb + j]);
                    want[i * ldc + j] = sum + beta * (double)C[i * ldc + j];
                }
            tr_cpu_gemm_bf16(ta, tb, M, N, K, Ah, lda, Bh, ldb, beta, C, ldc);
            tr_cpu_sgemm(ta, tb, M, N, K, 1.0f, Ar, lda, Br, ldb, beta, C_emulated, ldc);
            char what[96];
            snprintf(what, sizeof what, "gemm_bf16 %dx%dx%d trans %d%d beta %g", M, N, K, ta, tb,
                     beta);
            expect_close(what, C, want, c_size, FWD_TOL);
            expect_close_ff(what, C, C_emulated, c_size, FWD_TOL);
            tr_cpu_gemm_bf16_serial(ta, tb, M, N, K, Ah, lda, Bh, ldb, beta, C_serial, ldc);
            expect_bitwise("gemm_bf16_serial vs gemm_bf16", C, C_serial, c_size);
            free(A), free(B), free(Ah), free(Bh), free(Ar), free(Br);
            free(C), free(C_emulated), free(C_serial), free(want);
        }
    }
}

/* Tiles of several hundred rows and columns, one product cut into more
 * tiles than the grid's 4, K long: the same bits for 1, 2 and 3 threads and
 * serially, for every transpose, accumulating as weight gradients do. */
Test(gemm_bf16, large_tiles_same_bits_for_any_thread_count)
{
    need_gemm_bf16();
    rng_t rng = {113};
    const int shapes[][3] = {{1300, 1100, 700}, {3100, 400, 300}};
    const int n_shapes = sizeof shapes / sizeof shapes[0];
    int saved_threads = omp_get_max_threads();
    for (int s = 0; s < n_shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int trans = 0; trans < 4; trans++) {
            int ta = trans & 1, tb = trans >> 1;
            int a_rows = ta ? K : M, a_cols = ta ? M : K;
            int b_rows = tb ? N : K, b_cols = tb ? K : N;
            int lda = a_cols, ldb = b_cols + 3, ldc = N;
            size_t a_size = (size_t)a_rows * lda, b_size = (size_t)b_rows * ldb;
            size_t c_size = (size_t)M * ldc;
            float *A = random_fvec(&rng, a_size, -1, 1), *B = random_fvec(&rng, b_size, -1, 1);
            uint16_t *Ah = to_bf16_vec(A, a_size), *Bh = to_bf16_vec(B, b_size);
            float *C0 = random_fvec(&rng, c_size, -1, 1);
            float *C[3];
            for (int t = 0; t < 3; t++) {
                C[t] = copy_fvec(C0, c_size);
                omp_set_num_threads(t + 1);
                tr_cpu_gemm_bf16(ta, tb, M, N, K, Ah, lda, Bh, ldb, 1.0f, C[t], ldc);
            }
            omp_set_num_threads(saved_threads);
            expect_bitwise("gemm_bf16 2 threads vs 1", C[1], C[0], c_size);
            expect_bitwise("gemm_bf16 3 threads vs 1", C[2], C[0], c_size);
            float *C_serial = copy_fvec(C0, c_size);
            tr_cpu_gemm_bf16_serial(ta, tb, M, N, K, Ah, lda, Bh, ldb, 1.0f, C_serial, ldc);
            expect_bitwise("gemm_bf16_serial vs gemm_bf16", C_serial, C[0], c_size);
            /* and against the emulation, on a band of rows */
            float *Ar = bf16_rounded_vec(A, a_size), *Br = bf16_rounded_vec(B, b_size);
            float *C_emulated = copy_fvec(C0, c_size);
            tr_cpu_sgemm(ta, tb, M, N, K, 1.0f, Ar, lda, Br, ldb, 1.0f, C_emulated, ldc);
            expect_close_ff("gemm_bf16 vs emulated, large tiles", C[0], C_emulated, c_size,
                            FWD_TOL);
            for (int t = 0; t < 3; t++)
                free(C[t]);
            free(A), free(B), free(Ah), free(Bh), free(Ar), free(Br), free(C0), free(C_serial);
            free(C_emulated);
        }
    }
}

Test(gemm_bf16, beta_zero_ignores_c_and_k_zero)
{
    need_gemm_bf16();
    rng_t rng = {114};
    int M = 70, N = 9, K = 5;
    float *A = random_fvec(&rng, (size_t)M * K, -1, 1), *B = random_fvec(&rng, (size_t)K * N, -1, 1);
    uint16_t *Ah = to_bf16_vec(A, (size_t)M * K), *Bh = to_bf16_vec(B, (size_t)K * N);
    float *C = fvec((size_t)M * N);
    fill_f(C, (size_t)M * N, NAN); /* beta = 0: C is write-only */
    tr_cpu_gemm_bf16(0, 0, M, N, K, Ah, K, Bh, N, 0.0f, C, N);
    for (int i = 0; i < M * N; i++)
        cr_assert(isfinite(C[i]), "beta = 0 read C");
    float *C2 = random_fvec(&rng, (size_t)M * N, -1, 1);
    float *C2_orig = copy_fvec(C2, (size_t)M * N);
    tr_cpu_gemm_bf16(0, 0, M, N, 0, Ah, 1, Bh, N, 1.0f, C2, N);
    expect_bitwise("K = 0, beta = 1 keeps C", C2, C2_orig, (size_t)M * N);
    tr_cpu_gemm_bf16(0, 0, M, N, 0, Ah, 1, Bh, N, 0.0f, C2, N);
    for (int i = 0; i < M * N; i++)
        cr_assert(C2[i] == 0.0f, "K = 0, beta = 0 must zero C");
    free(A), free(B), free(Ah), free(Bh), free(C), free(C2), free(C2_orig);
}

/* A linear layer with bf16 inputs: forward and both gradients within bf16
 * tolerance of fp32 on the unrounded numbers, within fp32 rounding of the
 * emulation, accumulating, and the same bits for 1 and 2 threads. */
Test(gemm_bf16, linear_forward_backward_vs_fp32_and_emulated)
{
    need_gemm_bf16();
    rng_t rng = {115};
    const double BF16_TOL = 2e-2; /* inputs carry 2^-9 relative error each */
    int N = 300, IC = 96, OC = 200;
    size_t n_in = (size_t)N * IC, n_w = (size_t)OC * IC, n_out = (size_t)N * OC;
    float *inp = random_fvec(&rng, n_in, -1, 1), *w = random_fvec(&rng, n_w, -1, 1);
    float *bias = random_fvec(&rng, OC, -1, 1), *R = random_fvec(&rng, n_out, -1, 1);
    uint16_t *inp_h = to_bf16_vec(inp, n_in), *w_h = to_bf16_vec(w, n_w), *R_h = to_bf16_vec(R, n_out);
    float *inp_r = bf16_rounded_vec(inp, n_in), *w_r = bf16_rounded_vec(w, n_w);
    float *R_r = bf16_rounded_vec(R, n_out);
    int saved_threads = omp_get_max_threads();

    float *out = fvec(n_out), *out32 = fvec(n_out), *out_emulated = fvec(n_out);
    fill_f(out, n_out, NAN);
    tr_cpu_linear_forward_bf16(out, inp_h, w_h, bias, N, IC, OC);
    tr_cpu_linear_forward(out32, inp, w, bias, N, IC, OC);
    tr_cpu_linear_forward(out_emulated, inp_r, w_r, bias, N, IC, OC);
    expect_close_ff("linear bf16 forward vs fp32", out, out32, n_out, BF16_TOL);
    expect_close_ff("linear bf16 forward vs emulated", out, out_emulated, n_out, FWD_TOL);

    float *pre_inp = random_fvec(&rng, n_in, -1, 1), *pre_w = random_fvec(&rng, n_w, -1, 1);
    float *dinp[2], *dw[2];
    for (int t = 0; t < 2; t++) {
        dinp[t] = copy_fvec(pre_inp, n_in);
        dw[t] = copy_fvec(pre_w, n_w);
        omp_set_num_threads(t + 1);
        tr_cpu_linear_backward_bf16(dinp[t], dw[t], R_h, inp_h, w_h, N, IC, OC, 0);
    }
    omp_set_num_threads(saved_threads);
    expect_bitwise("linear bf16 dinp, 2 threads vs 1", dinp[1], dinp[0], n_in);
    expect_bitwise("linear bf16 dw, 2 threads vs 1", dw[1], dw[0], n_w);
    float *dinp32 = copy_fvec(pre_inp, n_in), *dw32 = copy_fvec(pre_w, n_w);
    tr_cpu_linear_backward(dinp32, dw32, NULL, R, inp, w, N, IC, OC, 0);
    float *dinp_e = copy_fvec(pre_inp, n_in), *dw_e = copy_fvec(pre_w, n_w);
    tr_cpu_linear_backward(dinp_e, dw_e, NULL, R_r, inp_r, w_r, N, IC, OC, 0);
    /* compare the gradients themselves, not the prefill they were added to */
    for (size_t i = 0; i < n_in; i++)
        dinp[0][i] -= pre_inp[i], dinp32[i] -= pre_inp[i], dinp_e[i] -= pre_inp[i];
    for (size_t i = 0; i < n_w; i++)
        dw[0][i] -= pre_w[i], dw32[i] -= pre_w[i], dw_e[i] -= pre_w[i];
    expect_close_ff("linear bf16 dinp vs fp32", dinp[0], dinp32, n_in, BF16_TOL);
    expect_close_ff("linear bf16 dw vs fp32", dw[0], dw32, n_w, BF16_TOL);
    expect_close_ff("linear bf16 dinp vs emulated", dinp[0], dinp_e, n_in, 1e-5 * 4);
    expect_close_ff("linear bf16 dw vs emulated", dw[0], dw_e, n_w, 1e-5 * 4);

    /* batched matmul, both forms of b: the emulation's numbers */
    for (int trans_b = 0; trans_b < 2; trans_b++) {
        int batch = 3, M = 40, K = 24, Nm = 56;
        size_t a_n = (size_t)batch * M * K, b_n = (size_t)batch * K * Nm, o_n = (size_t)batch * M * Nm;
        float *a = random_fvec(&rng, a_n, -1, 1), *bm = random_fvec(&rng, b_n, -1, 1);
        float *dout = random_fvec(&rng, o_n, -1, 1);
        uint16_t *a_h = to_bf16_vec(a, a_n), *b_h = to_bf16_vec(bm, b_n), *d_h = to_bf16_vec(dout, o_n);
        float *a_r = bf16_rounded_vec(a, a_n), *b_r = bf16_rounded_vec(bm, b_n);
        float *d_r = bf16_rounded_vec(dout, o_n);
        float *o = fvec(o_n), *o_e = fvec(o_n);
        tr_cpu_matmul_forward_bf16(o, a_h, b_h, batch, M, K, Nm, trans_b);
        tr_cpu_matmul_forward(o_e, a_r, b_r, batch, M, K, Nm, trans_b);
        expect_close_ff("matmul bf16 forward vs emulated", o, o_e, o_n, FWD_TOL);
        float *da = fvec(a_n), *db = fvec(b_n), *da_e = fvec(a_n), *db_e = fvec(b_n);
        tr_cpu_matmul_backward_bf16(da, db, d_h, a_h, b_h, batch, M, K, Nm, trans_b);
        tr_cpu_matmul_backward(da_e, db_e, d_r, a_r, b_r, batch, M, K, Nm, trans_b);
        expect_close_ff("matmul bf16 da vs emulated", da, da_e, a_n, FWD_TOL);
        expect_close_ff("matmul bf16 db vs emulated", db, db_e, b_n, FWD_TOL);
        free(a), free(bm), free(dout), free(a_h), free(b_h), free(d_h), free(a_r), free(b_r);
        free(d_r), free(o), free(o_e), free(da), free(db), free(da_e), free(db_e);
    }

    free(inp), free(w), free(bias), free(R), free(inp_h), free(w_h), free(R_h);
    free(inp_r), free(w_r), free(R_r), free(out), free(out32), free(out_emulated);
    free(pre_inp), free(pre_w), free(dinp[0]), free(dinp[1]), free(dw[0]), free(dw[1]);
    free(dinp32), free(dw32), free(dinp_e), free(dw_e);
}

/* The forward whose GEMM rounds its output to bf16 as it stores each tile
 * gives, for any thread count, the bits of the fp32 forward rounded
 * afterwards (what the backend stored before); with and without a bias,
 * over one tile and over a grid of them. */
Test(gemm_bf16, linear_forward_out16_is_the_rounded_forward)
{
    need_gemm_bf16();
    rng_t rng = {116};
    const int shapes[][3] = {{1, 8, 3}, {37, 96, 200}, {1300, 64, 700}};
    int saved_threads = omp_get_max_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        size_t n_in = (size_t)N * IC, n_w = (size_t)OC * IC, n_out = (size_t)N * OC;
        float *inp = random_fvec(&rng, n_in, -1, 1), *w = random_fvec(&rng, n_w, -1, 1);
        float *bias = random_fvec(&rng, OC, -1, 1);
        uint16_t *inp_h = to_bf16_vec(inp, n_in), *w_h = to_bf16_vec(w, n_w);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            float *out = fvec(n_out);
            tr_cpu_linear_forward_bf16(out, inp_h, w_h, with_bias ? bias : NULL, N, IC, OC);
            uint16_t *want = to_bf16_vec(out, n_out);
            for (int t = 1; t <= 3; t++) {
                omp_set_num_threads(t);
                uint16_t *got = malloc(n_out * sizeof *got);
                cr_assert(got != NULL, "out of memory");
                tr_cpu_linear_forward_bf16_out16(got, inp_h, w_h, with_bias ? bias : NULL, N, IC,
                                                 OC);
                cr_assert(memcmp(got, want, n_out * sizeof *got) == 0,
                          "%dx%dx%d bias %d, %d threads: the bf16 output is not the forward "
                          "rounded", N, IC, OC, with_bias, t);
                free(got);
            }
            omp_set_num_threads(saved_threads);
            free(out), free(want);
        }
        free(inp), free(w), free(bias), free(inp_h), free(w_h);
    }
}

/* A linear onto an addend (out = addend + inp w^T, ops.h's
 * tr_linear_addend): the bits of the plain forward plus the addend (into
 * bf16: rounded once), also with the weight given transposed (within the
 * rounding: another product) and with the addend as out itself; any thread
 * count, over one tile and a grid of them. */
Test(gemm_bf16, linear_onto_an_addend_is_the_forward_plus_it)
{
    rng_t rng = {118};
    const int shapes[][3] = {{1, 8, 3}, {37, 96, 200}, {1300, 16, 700}};
    int saved_threads = omp_get_max_threads();
    int bf16 = tr_cpu_gemm_bf16_available();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        size_t n_in = (size_t)N * IC, n_w = (size_t)OC * IC, n_out = (size_t)N * OC;
        float *inp = random_fvec(&rng, n_in, -1, 1), *w = random_fvec(&rng, n_w, -1, 1);
        float *addend = random_fvec(&rng, n_out, -4, 4), *wt = fvec(n_w);
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < IC; i++)
                wt[(size_t)i * OC + o] = w[(size_t)o * IC + i];
        uint16_t *inp_h = to_bf16_vec(inp, n_in), *w_h = to_bf16_vec(w, n_w);
        uint16_t *addend_h = to_bf16_vec(addend, n_out);
        float *plain = fvec(n_out), *plain16 = fvec(n_out);
        tr_cpu_linear_forward(plain, inp, w, NULL, N, IC, OC);
        if (bf16)
            tr_cpu_linear_forward_bf16(plain16, inp_h, w_h, NULL, N, IC, OC);
        for (int t = 1; t <= 3; t++) {
            omp_set_num_threads(t);
            float *got = fvec(n_out), *got_t = fvec(n_out), *in_place = fvec(n_out);
            memcpy(in_place, addend, n_out * sizeof *in_place);
            tr_cpu_linear_forward_onto(got, inp, w, NULL, 0, addend, N, IC, OC);
            tr_cpu_linear_forward_onto(got_t, inp, NULL, wt, OC, addend, N, IC, OC);
            tr_cpu_linear_forward_onto(in_place, inp, w, NULL, 0, in_place, N, IC, OC);
            for (size_t i = 0; i < n_out; i++) {
                float want = addend[i] + plain[i];
                float tol = 1e-6f * (fabsf(addend[i]) + fabsf(plain[i]) + (float)IC);
                cr_assert(got[i] == want && fabsf(got_t[i] - want) <= tol && got[i] == in_place[i],
                          "%dx%dx%d, %d threads, [%zu]: %.9g (transposed weight %.9g, in place "
                          "%.9g), the forward plus the addend %.9g", N, IC, OC, t, i,
                          (double)got[i], (double)got_t[i], (double)in_place[i], (double)want);
            }
            if (bf16) {
                uint16_t *got16 = malloc(n_out * sizeof *got16);
                cr_assert(got16 != NULL, "out of memory");
                tr_cpu_linear_forward_bf16_onto(NULL, got16, inp_h, w_h, addend_h, N, IC, OC);
                float *got32 = fvec(n_out);
                tr_cpu_linear_forward_bf16_onto(got32, NULL, inp_h, w_h, addend, N, IC, OC);
                for (size_t i = 0; i < n_out; i++) {
                    float sum = tr_bf16_to_f32(addend_h[i]) + plain16[i];
                    cr_assert_eq(got16[i], tr_f32_to_bf16(sum),
                                 "%dx%dx%d, %d threads, [%zu]: bf16 %#x, not the rounded sum %.9g",
                                 N, IC, OC, t, i, got16[i], (double)sum);
                    float want = addend[i] + plain16[i];
                    cr_assert(got32[i] == want, "%dx%dx%d, %d threads, [%zu]: fp32 %.9g, not %.9g",
                              N, IC, OC, t, i, (double)got32[i], (double)want);
                }
                free(got16), free(got32);
            }
            free(got), free(got_t), free(in_place);
        }
        omp_set_num_threads(saved_threads);
        free(inp), free(w), free(wt), free(addend), free(inp_h), free(w_h), free(addend_h);
        free(plain), free(plain16);
    }
}

/* dout to bf16 and the bias gradient in one pass: the bits of
 * tr_cpu_to_bf16 and of the column sums taken row by row in float, on every
 * elementwise path this CPU runs (portable, AVX2, AVX-512: the vector paths
 * keep whole column blocks' sums in registers), for any thread count, OC a
 * multiple of the column block and not, without a bias, and for the fp32
 * bias gradient (tr_cpu_linear_bias_backward, the same sums), written and
 * accumulated. */
Test(gemm_bf16, linear_dout_bf16_is_conversion_and_bias_sums)
{
    rng_t rng = {117};
    const int shapes[][2] = {{1, 3}, {37, 64}, {300, 200}, {129, 1100}, {5, 128}};
    int saved_threads = omp_get_max_threads(), widest = tr_cpu_elementwise_path();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], OC = shapes[s][1];
        size_t n = (size_t)N * OC;
        float *dout = random_fvec(&rng, n, -2, 2), *prefill = random_fvec(&rng, OC, -1, 1);
        if (s == 0)
            dout[1] = 1e-40f; /* a subnormal: rounded, not flushed */
        uint16_t *want16 = to_bf16_vec(dout, n), *got16 = malloc(n * sizeof *got16);
        cr_assert(got16 != NULL, "out of memory");
        float *want_db = copy_fvec(prefill, OC), *want_sum = fvec(OC);
        for (int o = 0; o < OC; o++) {
            float sum = 0.0f;
            for (int r = 0; r < N; r++)
                sum += dout[(size_t)r * OC + o];
            want_sum[o] = sum;
            want_db[o] = prefill[o] + sum;
        }
        for (int path = TR_CPU_EW_PORTABLE; path <= widest; path++) {
            int cap = tr_cpu_elementwise_cap(path);
            for (int t = 1; t <= 3; t++) {
                omp_set_num_threads(t);
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                    float *db = copy_fvec(prefill, OC);
                    memset(got16, 0xa5, n * sizeof *got16);
                    tr_cpu_linear_dout_bf16(got16, with_bias ? db : NULL, dout, N, OC, 0);
                    cr_assert(memcmp(got16, want16, n * sizeof *got16) == 0,
                              "%dx%d, path %d, %d threads, bias %d: dout in bf16 differs", N, OC,
                              path, t, with_bias);
                    expect_bitwise("fused bias gradient", db, with_bias ? want_db : prefill, OC);
                    free(db);
                }
                float *db = copy_fvec(prefill, OC);
                tr_cpu_linear_bias_backward(db, dout, N, OC, 0);
                expect_bitwise("fp32 bias gradient, accumulated", db, want_db, OC);
                tr_cpu_linear_bias_backward(db, dout, N, OC, 1);
                expect_bitwise("fp32 bias gradient, written", db, want_sum, OC);
                free(db);
            }
            tr_cpu_elementwise_cap(cap);
        }
        omp_set_num_threads(saved_threads);
        free(dout), free(prefill), free(want16), free(got16), free(want_db), free(want_sum);
    }
}

/* ======================================================================== */
/* linear                                                                    */
/* ======================================================================== */

typedef struct {
    double *inp, *w, *bias; /* bias may be NULL */
    int N, IC, OC;
} linear_ctx;

static void ref_linear(const void *vctx, double *out)
{
    const linear_ctx *c = vctx;
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double s = c->bias ? c->bias[o] : 0.0;
            for (int i = 0; i < c->IC; i++)
                s += c->inp[n * c->IC + i] * c->w[o * c->IC + i];
            out[n * c->OC + o] = s;
        }
}

static void check_linear(rng_t *rng, int N, int IC, int OC, int with_bias)
{
    size_t n_in = (size_t)N * IC, n_w = (size_t)OC * IC, n_out = (size_t)N * OC;
    float *inp = random_fvec(rng, n_in, -1, 1);
    float *w = random_fvec(rng, n_w, -1, 1);
    float *bias = with_bias ? random_fvec(rng, OC, -1, 1) : NULL;
    float *R = random_fvec(rng, n_out, -1, 1);
    linear_ctx ctx = {to_double(inp, n_in), to_double(w, n_w),
                      with_bias ? to_double(bias, OC) : NULL, N, IC, OC};
    double *Rd = to_double(R, n_out);

    float *out = fvec(n_out);
    fill_f(out, n_out, NAN); /* forward must overwrite */
    double *want = dvec(n_out);
    tr_cpu_linear_forward(out, inp, w, bias, N, IC, OC);
    ref_linear(&ctx, want);
    expect_close("linear forward", out, want, n_out, FWD_TOL);

    float *dinp = fvec(n_in), *dw = fvec(n_w), *dbias = fvec(OC);
    tr_cpu_linear_backward(dinp, dw, with_bias ? dbias : NULL, R, inp, w, N, IC, OC, 0);
    check_gradient("linear dinp", dinp, ref_linear, &ctx, ctx.inp, n_in, Rd, n_out);
    check_gradient("linear dw", dw, ref_linear, &ctx, ctx.w, n_w, Rd, n_out);
    if (with_bias)
        check_gradient("linear dbias", dbias, ref_linear, &ctx, ctx.bias, OC, Rd, n_out);

    float *pre_inp = random_fvec(rng, n_in, -1, 1), *pre_w = random_fvec(rng, n_w, -1, 1);
    float *pre_b = random_fvec(rng, OC, -1, 1);
    float *acc_inp = copy_fvec(pre_inp, n_in), *acc_w = copy_fvec(pre_w, n_w);
    float *acc_b = copy_fvec(pre_b, OC);
    tr_cpu_linear_backward(acc_inp, acc_w, with_bias ? acc_b : NULL, R, inp, w, N, IC, OC, 0);
    expect_accumulated("linear dinp accumulates", acc_inp, pre_inp, dinp, n_in);
    expect_accumulated("linear dw accumulates", acc_w, pre_w, dw, n_w);
    if (with_bias)
        expect_accumulated("linear dbias accumulates", acc_b, pre_b, dbias, OC);

    /* NULL gradients are skipped, the others still computed */
    float *only_w = fvec(n_w);
    tr_cpu_linear_backward(NULL, only_w, NULL, R, inp, w, N, IC, OC, 0);
    expect_close_ff("linear dw alone", only_w, dw, n_w, 0.0);

    free(inp), free(w), free(bias), free(R), free(out), free(want), free(Rd);
    free(ctx.inp), free(ctx.w), free(ctx.bias);
    free(dinp), free(dw), free(dbias), free(pre_inp), free(pre_w), free(pre_b);
    free(acc_inp), free(acc_w), free(acc_b), free(only_w);
}

Test(linear, forward_backward)
{
    rng_t rng = {201};
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 4}, {7, 16, 9}, {24, 13, 40}, {12, 40, 24}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int with_bias = 0; with_bias < 2; with_bias++)
            check_linear(&rng, shapes[s][0], shapes[s][1], shapes[s][2], with_bias);
}

/* ======================================================================== */
/* batched matmul                                                            */
/* ======================================================================== */

typedef struct {
    double *a, *bm;
    int batch, M, K, N, trans_b;
} matmul_ctx;

static void ref_matmul(const void *vctx, double *out)
{
    const matmul_ctx *c = vctx;
    for (int i = 0; i < c->batch; i++) {
        const double *a = c->a + (size_t)i * c->M * c->K;
        const double *bm = c->bm + (size_t)i * c->K * c->N;
        for (int m = 0; m < c->M; m++)
            for (int n = 0; n < c->N; n++) {
                double s = 0.0;
                for (int k = 0; k < c->K; k++)
                    s += a[m * c->K + k] * (c->trans_b ? bm[n * c->K + k] : bm[k * c->N + n]);
                out[(size_t)i * c->M * c->N + m * c->N + n] = s;
            }
    }
}

Test(matmul, forward_backward)
{
    rng_t rng = {301};
    /* batch, M, K, N: batch 1 uses threaded GEMMs, larger batches one per thread */
    const int shapes[][4] = {{1, 1, 1, 1}, {1, 6, 5, 7}, {3, 4, 9, 2}, {2, 9, 3, 11}, {5, 3, 8, 6}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int trans_b = 0; trans_b < 2; trans_b++) {
            int batch = shapes[s][0], M = shapes[s][1], K = shapes[s][2], N = shapes[s][3];
            size_t n_a = (size_t)batch * M * K, n_b = (size_t)batch * K * N;
            size_t n_out = (size_t)batch * M * N;
            float *a = random_fvec(&rng, n_a, -1, 1), *bm = random_fvec(&rng, n_b, -1, 1);
            float *R = random_fvec(&rng, n_out, -1, 1);
            matmul_ctx ctx = {to_double(a, n_a), to_double(bm, n_b), batch, M, K, N, trans_b};
            double *Rd = to_double(R, n_out), *want = dvec(n_out);
            float *out = fvec(n_out);
            tr_cpu_matmul_forward(out, a, bm, batch, M, K, N, trans_b);
            ref_matmul(&ctx, want);
            expect_close("matmul forward", out, want, n_out, FWD_TOL);

            float *da = fvec(n_a), *dbm = fvec(n_b);
            tr_cpu_matmul_backward(da, dbm, R, a, bm, batch, M, K, N, trans_b);
            check_gradient("matmul da", da, ref_matmul, &ctx, ctx.a, n_a, Rd, n_out);
            check_gradient("matmul dbm", dbm, ref_matmul, &ctx, ctx.bm, n_b, Rd, n_out);

            float *pre_a = random_fvec(&rng, n_a, -1, 1), *pre_b = random_fvec(&rng, n_b, -1, 1);
            float *acc_a = copy_fvec(pre_a, n_a), *acc_b = copy_fvec(pre_b, n_b);
            tr_cpu_matmul_backward(acc_a, acc_b, R, a, bm, batch, M, K, N, trans_b);
            expect_accumulated("matmul da accumulates", acc_a, pre_a, da, n_a);
            expect_accumulated("matmul dbm accumulates", acc_b, pre_b, dbm, n_b);

            float *only_b = fvec(n_b);
            tr_cpu_matmul_backward(NULL, only_b, R, a, bm, batch, M, K, N, trans_b);
            expect_close_ff("matmul dbm alone", only_b, dbm, n_b, 0.0);

            free(a), free(bm), free(R), free(ctx.a), free(ctx.bm), free(Rd), free(want);
            free(out), free(da), free(dbm), free(pre_a), free(pre_b), free(acc_a), free(acc_b);
            free(only_b);
        }
}

/* ======================================================================== */
/* embedding and add_rows                                                    */
/* ======================================================================== */

typedef struct {
    double *table;
    const int32_t *idx;
    int N, C;
} embedding_ctx;

static void ref_embedding(const void *vctx, double *out)
{
    const embedding_ctx *c = vctx;
    for (int n = 0; n < c->N; n++)
        for (int j = 0; j < c->C; j++)
            out[n * c->C + j] = c->table[c->idx[n] * c->C + j];
}

Test(embedding, forward_backward_repeated_indices)
{
    rng_t rng = {401};
    const int shapes[][3] = {{1, 1, 1}, {4, 6, 3}, {7, 20, 9}, {5, 24, 40}, {30, 11, 70}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int V = shapes[s][0], N = shapes[s][1], C = shapes[s][2];
        size_t n_table = (size_t)V * C, n_out = (size_t)N * C;
        int32_t *idx = malloc((size_t)N * sizeof(int32_t));
        for (int n = 0; n < N; n++)
            idx[n] = rng_int(&rng, 0, V - 1);
        if (N > 2)
            idx[N - 1] = idx[0] = idx[1]; /* make sure some index repeats */
        float *table = random_fvec(&rng, n_table, -1, 1);
        float *R = random_fvec(&rng, n_out, -1, 1);
        embedding_ctx ctx = {to_double(table, n_table), idx, N, C};
        double *Rd = to_double(R, n_out), *want = dvec(n_out);
        float *out = fvec(n_out);
        tr_cpu_embedding_forward(out, idx, table, N, C);
        ref_embedding(&ctx, want);
        expect_close("embedding forward", out, want, n_out, 0.0);

        float *dtable = fvec(n_table);
        tr_cpu_embedding_backward(dtable, R, idx, N, C);
        check_gradient("embedding dtable", dtable, ref_embedding, &ctx, ctx.table, n_table, Rd,
                       n_out);

        float *pre = random_fvec(&rng, n_table, -1, 1), *acc = copy_fvec(pre, n_table);
        tr_cpu_embedding_backward(acc, R, idx, N, C);
        expect_accumulated("embedding dtable accumulates", acc, pre, dtable, n_table);
        tr_cpu_embedding_backward(NULL, R, idx, N, C);

        free(idx), free(table), free(R), free(ctx.table), free(Rd), free(want), free(out);
        free(dtable), free(pre), free(acc);
    }
}

typedef struct {
    double *x, *p;
    int B, T, C;
} add_rows_ctx;

static void ref_add_rows(const void *vctx, double *out)
{
    const add_rows_ctx *c = vctx;
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int j = 0; j < c->C; j++) {
                size_t i = ((size_t)b * c->T + t) * c->C + j;
                out[i] = c->x[i] + c->p[t * c->C + j];
            }
}

Test(add_rows, forward_backward)
{
    rng_t rng = {501};
    const int shapes[][3] = {{1, 1, 1}, {2, 3, 4}, {3, 9, 17}, {4, 5, 40}, {1, 8, 33}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2];
        size_t n_x = (size_t)B * T * C, n_p = (size_t)T * C;
        float *x = random_fvec(&rng, n_x, -1, 1), *p = random_fvec(&rng, n_p, -1, 1);
        float *R = random_fvec(&rng, n_x, -1, 1);
        add_rows_ctx ctx = {to_double(x, n_x), to_double(p, n_p), B, T, C};
        double *Rd = to_double(R, n_x), *want = dvec(n_x);
        float *out = fvec(n_x);
        tr_cpu_add_rows_forward(out, x, p, B, T, C);
        ref_add_rows(&ctx, want);
        expect_close("add_rows forward", out, want, n_x, FWD_TOL);

        float *dx = fvec(n_x), *dp = fvec(n_p);
        tr_cpu_add_rows_backward(dx, dp, R, B, T, C);
        check_gradient("add_rows dx", dx, ref_add_rows, &ctx, ctx.x, n_x, Rd, n_x);
        check_gradient("add_rows dp", dp, ref_add_rows, &ctx, ctx.p, n_p, Rd, n_x);

        float *pre_x = random_fvec(&rng, n_x, -1, 1), *pre_p = random_fvec(&rng, n_p, -1, 1);
        float *acc_x = copy_fvec(pre_x, n_x), *acc_p = copy_fvec(pre_p, n_p);
        tr_cpu_add_rows_backward(acc_x, acc_p, R, B, T, C);
        expect_accumulated("add_rows dx accumulates", acc_x, pre_x, dx, n_x);
        expect_accumulated("add_rows dp accumulates", acc_p, pre_p, dp, n_p);

        free(x), free(p), free(R), free(ctx.x), free(ctx.p), free(Rd), free(want), free(out);
        free(dx), free(dp), free(pre_x), free(pre_p), free(acc_x), free(acc_p);
    }
}

/* ======================================================================== */
/* elementwise                                                               */
/* ======================================================================== */

typedef struct {
    double *a, *b;
    size_t n;
} binary_ctx;

static void ref_add(const void *vctx, double *out)
{
    const binary_ctx *c = vctx;
    for (size_t i = 0; i < c->n; i++)
        out[i] = c->a[i] + c->b[i];
}

Test(add, forward_backward)
{
    rng_t rng = {601};
    const size_t sizes[] = {1, 5, 37, 100, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *a = random_fvec(&rng, n, -1, 1), *b = random_fvec(&rng, n, -1, 1);
        float *R = random_fvec(&rng, n, -1, 1);
        binary_ctx ctx = {to_double(a, n), to_double(b, n), n};
        double *Rd = to_double(R, n), *want = dvec(n);
        float *out = fvec(n);
        tr_cpu_add_forward(out, a, b, n);
        ref_add(&ctx, want);
        expect_close("add forward", out, want, n, FWD_TOL);

        float *da = fvec(n), *db = fvec(n);
        tr_cpu_add_backward(da, db, R, n, 0);
        check_gradient("add da", da, ref_add, &ctx, ctx.a, n, Rd, n);
        check_gradient("add db", db, ref_add, &ctx, ctx.b, n, Rd, n);

        float *pre = random_fvec(&rng, n, -1, 1), *acc = copy_fvec(pre, n);
        tr_cpu_add_backward(acc, NULL, R, n, 0);
        expect_accumulated("add da accumulates", acc, pre, da, n);

        /* out = x + x: both gradients land in the same buffer */
        float *dx = fvec(n);
        tr_cpu_add_backward(dx, dx, R, n, 0);
        for (size_t i = 0; i < n; i++)
            cr_assert(dx[i] == 2.0f * R[i], "add with da == db");

        free(a), free(b), free(R), free(ctx.a), free(ctx.b), free(Rd), free(want), free(out);
        free(da), free(db), free(pre), free(acc), free(dx);
    }
}

typedef struct {
    double *x;
    size_t n;
} unary_ctx;

static void ref_gelu(const void *vctx, double *out)
{
    const unary_ctx *c = vctx;
    const double k = sqrt(2.0 / 3.14159265358979323846);
    for (size_t i = 0; i < c->n; i++) {
        double x = c->x[i];
        out[i] = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
}

static void ref_relu(const void *vctx, double *out)
{
    const unary_ctx *c = vctx;
    for (size_t i = 0; i < c->n; i++)
        out[i] = c->x[i] > 0.0 ? c->x[i] : 0.0;
}

typedef void (*unary_forward_fn)(float *, const float *, size_t);
typedef void (*unary_backward_fn)(float *, const float *, const float *, size_t);

static void check_unary(rng_t *rng, const char *name, unary_forward_fn forward,
                        unary_backward_fn backward, ref_forward_fn ref, size_t n, double range)
{
    float *x = random_fvec(rng, n, -range, range);
    for (size_t i = 0; i < n; i++) /* keep clear of ReLU's kink for the differences */
        if (fabsf(x[i]) < 1e-2f)
            x[i] = 0.5f;
    float *R = random_fvec(rng, n, -1, 1);
    unary_ctx ctx = {to_double(x, n), n};
    double *Rd = to_double(R, n), *want = dvec(n);
    float *out = fvec(n);
    char what[64];
    forward(out, x, n);
    ref(&ctx, want);
    snprintf(what, sizeof what, "%s forward", name);
    expect_close(what, out, want, n, FWD_TOL);

    float *dx = fvec(n);
    backward(dx, x, R, n);
    snprintf(what, sizeof what, "%s dinp", name);
    check_gradient(what, dx, ref, &ctx, ctx.x, n, Rd, n);

    float *pre = random_fvec(rng, n, -1, 1), *acc = copy_fvec(pre, n);
    backward(acc, x, R, n);
    snprintf(what, sizeof what, "%s dinp accumulates", name);
    expect_accumulated(what, acc, pre, dx, n);
    backward(NULL, x, R, n);

    free(x), free(R), free(ctx.x), free(Rd), free(want), free(out), free(dx), free(pre);
    free(acc);
}

/* GELU's backward adding to dinp (check_unary's form) */
static void gelu_backward_add(float *dinp, const float *x, const float *dout, size_t n)
{
    tr_cpu_gelu_backward(dinp, x, dout, n, 0);
}

Test(gelu, forward_backward)
{
    rng_t rng = {701};
    const size_t sizes[] = {1, 7, 64, 333, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        check_unary(&rng, "gelu", tr_cpu_gelu_forward, gelu_backward_add, ref_gelu, sizes[s],
                    5.0);
}

/* The whole float range that matters, against the double reference: the
 * error stays within a few float roundings of the result (relative), or of
 * 1e-30 near the underflow of the far negative side, and the derivative
 * within a few roundings of its two terms.  Sizes cover the padded tail. */
Test(gelu, wide_range_and_tails)
{
    const size_t sizes[] = {1, 8, 13, 20001};
    const double k = sqrt(2.0 / 3.14159265358979323846);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = fvec(n), *out = fvec(n), *dx = fvec(n), *ones = fvec(n);
        for (size_t i = 0; i < n; i++) {
            x[i] = n == 1 ? -0.5f : (float)(-20.0 + 40.0 * (double)i / (double)(n - 1));
            ones[i] = 1.0f;
        }
        tr_cpu_gelu_forward(out, x, n);
        tr_cpu_gelu_backward(dx, x, ones, n, 0);
        for (size_t i = 0; i < n; i++) {
            /* 0.5 (1 + tanh u) as 1 / (1 + exp(-2u)): no cancellation for x << 0 */
            double X = x[i], u = k * (X + 0.044715 * X * X * X), e = exp(-2.0 * u);
            double sig = 1.0 / (1.0 + e);
            double want = X * sig;
            double dterm = 2.0 * X * sig * (e * sig) * k * (1.0 + 3 * 0.044715 * X * X);
            double dwant = sig + dterm;
            /* the float argument u carries a relative rounding of ~1e-7,
             * which exp(-2u) turns into |2u| * 1e-7 of the result */
            double tol = 4e-7 * (1.0 + 2.0 * fabs(u));
            cr_assert(fabs(out[i] - want) <= tol * fabs(want) + 1e-30,
                      "gelu(%.9g) = %.9g, want %.9g", X, out[i], want);
            /* the derivative is a sum of two terms: relative to their sizes */
            cr_assert(fabs(dx[i] - dwant) <= 2 * tol * (sig + fabs(dterm)) + 1e-30,
                      "gelu'(%.9g) = %.9g, want %.9g", X, dx[i], dwant);
        }
        free(x), free(out), free(dx), free(ones);
    }
}

Test(relu, kink_and_negative_side)
{
    float x[4] = {-1e-3f, 0.0f, 1e-3f, -5.0f}, dout[4] = {1, 2, 3, 4}, dx[4] = {0};
    tr_cpu_relu_backward(dx, x, dout, 4);
    cr_assert(dx[0] == 0.0f && dx[1] == 0.0f && dx[2] == 3.0f && dx[3] == 0.0f,
              "relu passes the gradient only where x > 0");
}

Test(relu, forward_backward)
{
    rng_t rng = {702};
    const size_t sizes[] = {1, 7, 64, 333, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        check_unary(&rng, "relu", tr_cpu_relu_forward, tr_cpu_relu_backward, ref_relu, sizes[s],
                    3.0);
}

/* ======================================================================== */
/* layernorm                                                                 */
/* ======================================================================== */

typedef struct {
    double *inp, *w, *b;
    int N, C;
    double eps;
    double *mean, *rstd; /* optional outputs */
} layernorm_ctx;

static void ref_layernorm(const void *vctx, double *out)
{
    const layernorm_ctx *c = vctx;
    for (int n = 0; n < c->N; n++) {
        const double *x = c->inp + (size_t)n * c->C;
        double m = 0.0, v = 0.0;
        for (int j = 0; j < c->C; j++)
            m += x[j];
        m /= c->C;
        for (int j = 0; j < c->C; j++)
            v += (x[j] - m) * (x[j] - m);
        v /= c->C;
        double s = 1.0 / sqrt(v + c->eps);
        for (int j = 0; j < c->C; j++)
            out[(size_t)n * c->C + j] = (x[j] - m) * s * c->w[j] + c->b[j];
        if (c->mean)
            c->mean[n] = m;
        if (c->rstd)
            c->rstd[n] = s;
    }
}

Test(layernorm, forward_backward)
{
    rng_t rng = {801};
    /* (C = 2 is left out: its input gradient is zero up to eps, all rounding noise) */
    /* (70 rows: three chunks of dw's and db's partial sums, the last short) */
    const int shapes[][2] = {{1, 3}, {3, 5}, {7, 16}, {24, 40}, {10, 67}, {5, 130}, {70, 9}};
    const float eps = 1e-5f;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t n_x = (size_t)N * C;
        float *inp = random_fvec(&rng, n_x, -2, 3); /* nonzero mean */
        float *w = random_fvec(&rng, C, 0.5, 1.5), *b = random_fvec(&rng, C, -1, 1);
        float *R = random_fvec(&rng, n_x, -1, 1);
        layernorm_ctx ctx = {to_double(inp, n_x), to_double(w, C), to_double(b, C), N, C, eps,
                             dvec(N), dvec(N)};
        double *Rd = to_double(R, n_x), *want = dvec(n_x);
        float *out = fvec(n_x), *mean = fvec(N), *rstd = fvec(N);
        tr_cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
        ref_layernorm(&ctx, want);
        expect_close("layernorm forward", out, want, n_x, FWD_TOL);
        expect_close("layernorm mean", mean, ctx.mean, N, FWD_TOL);
        expect_close("layernorm rstd", rstd, ctx.rstd, N, FWD_TOL);
        free(ctx.mean), free(ctx.rstd);
        ctx.mean = ctx.rstd = NULL;

        float *dinp = fvec(n_x), *dw = fvec(C), *db = fvec(C);
        float *scratch = fvec(tr_cpu_layernorm_scratch_floats(N, C));
        tr_cpu_layernorm_backward(dinp, dw, db, scratch, R, inp, w, mean, rstd, N, C, 0);
        check_gradient("layernorm dinp", dinp, ref_layernorm, &ctx, ctx.inp, n_x, Rd, n_x);
        check_gradient("layernorm dw", dw, ref_layernorm, &ctx, ctx.w, C, Rd, n_x);
        check_gradient("layernorm db", db, ref_layernorm, &ctx, ctx.b, C, Rd, n_x);

        float *pre_x = random_fvec(&rng, n_x, -1, 1), *pre_w = random_fvec(&rng, C, -1, 1);
        float *pre_b = random_fvec(&rng, C, -1, 1);
        float *acc_x = copy_fvec(pre_x, n_x), *acc_w = copy_fvec(pre_w, C);
        float *acc_b = copy_fvec(pre_b, C);
        tr_cpu_layernorm_backward(acc_x, acc_w, acc_b, scratch, R, inp, w, mean, rstd, N, C, 0);
        expect_accumulated("layernorm dinp accumulates", acc_x, pre_x, dinp, n_x);
        expect_accumulated("layernorm dw accumulates", acc_w, pre_w, dw, C);
        expect_accumulated("layernorm db accumulates", acc_b, pre_b, db, C);

        float *only_w = fvec(C);
        tr_cpu_layernorm_backward(NULL, only_w, NULL, scratch, R, inp, w, mean, rstd, N, C, 0);
        expect_close_ff("layernorm dw alone", only_w, dw, C, 0.0);
        free(scratch);

        free(inp), free(w), free(b), free(R), free(ctx.inp), free(ctx.w), free(ctx.b), free(Rd);
        free(want), free(out), free(mean), free(rstd), free(dinp), free(dw), free(db);
        free(pre_x), free(pre_w), free(pre_b), free(acc_x), free(acc_w), free(acc_b);
        free(only_w);
    }
}

/* ======================================================================== */
/* 16-bit activations as stored (the *_act kernels)                          */
/* ======================================================================== */

/* Each against what the backend ran before these kernels: the 16-bit inputs
 * widened (tr_cpu_from_half), the fp32 kernel, the output rounded once
 * (tr_cpu_to_half), compared bit for bit, in bf16 and fp16, with 1 and 2
 * threads, at sizes that leave tails on the 16-lane conversions, on GELU's
 * 8-wide blocks and on the kernels' tiles (4096 + 29: a last chunk of 24
 * whole elements, whose odd 8 follow a full vector). */

static const size_t act_sizes[] = {1, 7, 37, 4096 + 13, 4096 + 29};

static const char *half_name(int bf16) { return bf16 ? "bf16" : "fp16"; }

static uint16_t *hvec(size_t n)
{
    uint16_t *h = calloc(n ? n : 1, sizeof *h);
    cr_assert(h != NULL, "out of memory");
    return h;
}

/* random values in [lo, hi) rounded to the 16-bit type; with `specials`,
 * every 11th one a value at an edge of the type (zeros, subnormals, the
 * largest finite, infinities, NaN), so sums overflow and round to subnormal */
static uint16_t *random_hvec(rng_t *rng, size_t n, double lo, double hi, int bf16, int specials)
{
    static const uint16_t edge_bf16[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f, 0xff7f,
                                         0x7f80, 0xff80, 0x7fc0, 0x0080, 0x3f81};
    static const uint16_t edge_f16[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff,
                                        0x7c00, 0xfc00, 0x7e00, 0x0400, 0x3c01};
    float *x = random_fvec(rng, n, lo, hi);
    uint16_t *h = hvec(n);
    tr_cpu_to_half(h, x, n, bf16);
    for (size_t i = 5; specials && i < n; i += 11)
        h[i] = bf16 ? edge_bf16[(i / 11) % 11] : edge_f16[(i / 11) % 11];
    free(x);
    return h;
}

static float *widened(const uint16_t *h, size_t n, int bf16)
{
    float *x = fvec(n);
    tr_cpu_from_half(x, h, n, bf16);
    return x;
}

static void expect_same_halves(const char *what, const uint16_t *got, const uint16_t *want,
                               size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(got[i] == want[i], "%s: [%zu] of %zu is 0x%04x, want 0x%04x", what, i, n,
                  got[i], want[i]);
}

static struct tr_cpu_act act_half(uint16_t *h, int bf16)
{
    return (struct tr_cpu_act){h, bf16 ? TR_BF16 : TR_F16};
}

static struct tr_cpu_act act_f32(float *x) { return (struct tr_cpu_act){x, TR_F32}; }

Test(activations_16bit, add_forward_bitwise)
{
    rng_t rng = {1501};
    int saved_threads = omp_get_max_threads();
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t s = 0; s < sizeof act_sizes / sizeof *act_sizes; s++) {
            size_t n = act_sizes[s];
            /* large values in fp16's range, so some sums overflow to inf */
            double range = bf16 ? 4 : 40000;
            uint16_t *a = random_hvec(&rng, n, -range, range, bf16, 1);
            uint16_t *b = random_hvec(&rng, n, -range, range, bf16, 1);
            float *a32 = widened(a, n, bf16), *b32 = widened(b, n, bf16), *b_f32 = fvec(n);
            for (size_t i = 0; i < n; i++) /* an fp32 operand next to a 16-bit one */
                b_f32[i] = (float)rng_uniform(&rng, -range, range);
            float *sum = fvec(n), *twice = fvec(n), *mixed = fvec(n);
            tr_cpu_add_forward(sum, a32, b32, n);
            tr_cpu_add_forward(twice, a32, a32, n); /* x + x reads one tensor twice */
            tr_cpu_add_forward(mixed, a32, b_f32, n);
            uint16_t *want = hvec(n), *want_twice = hvec(n), *want_mixed = hvec(n);
            tr_cpu_to_half(want, sum, n, bf16);
            tr_cpu_to_half(want_twice, twice, n, bf16);
            tr_cpu_to_half(want_mixed, mixed, n, bf16);
            for (int threads = 1; threads <= 2; threads++) {
                omp_set_num_threads(threads);
                char what[96];
                uint16_t *out = hvec(n);
                float *out32 = fvec(n);
                tr_cpu_add_forward_act(act_half(out, bf16), act_half(a, bf16), act_half(b, bf16),
                                       n);
                snprintf(what, sizeof what, "add %s n=%zu threads=%d", half_name(bf16), n,
                         threads);
                expect_same_halves(what, out, want, n);
                tr_cpu_add_forward_act(act_half(out, bf16), act_half(a, bf16), act_half(a, bf16),
                                       n);
                snprintf(what, sizeof what, "add %s x + x n=%zu threads=%d", half_name(bf16), n,
                         threads);
                expect_same_halves(what, out, want_twice, n);
                tr_cpu_add_forward_act(act_half(out, bf16), act_half(a, bf16), act_f32(b_f32), n);
                snprintf(what, sizeof what, "add %s + fp32 n=%zu threads=%d", half_name(bf16), n,
                         threads);
                expect_same_halves(what, out, want_mixed, n);
                tr_cpu_add_forward_act(act_f32(out32), act_half(a, bf16), act_half(b, bf16), n);
                snprintf(what, sizeof what, "add %s into fp32 n=%zu threads=%d", half_name(bf16),
                         n, threads);
                expect_bitwise(what, out32, sum, n);
                free(out), free(out32);
            }
            omp_set_num_threads(saved_threads);
            free(a), free(b), free(a32), free(b32), free(b_f32), free(sum), free(twice);
            free(mixed), free(want), free(want_twice), free(want_mixed);
        }
}

Test(activations_16bit, gelu_forward_backward_bitwise)
{
    rng_t rng = {1502};
    int saved_threads = omp_get_max_threads();
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t s = 0; s < sizeof act_sizes / sizeof *act_sizes; s++) {
            size_t n = act_sizes[s];
            uint16_t *x = random_hvec(&rng, n, -6, 6, bf16, 1);
            float *x32 = widened(x, n, bf16), *y32 = fvec(n);
            float *dout = random_fvec(&rng, n, -1, 1), *pre = random_fvec(&rng, n, -1, 1);
            tr_cpu_gelu_forward(y32, x32, n);
            uint16_t *want = hvec(n);
            tr_cpu_to_half(want, y32, n, bf16);
            float *dwant = copy_fvec(pre, n); /* accumulated into nonzero gradients */
            tr_cpu_gelu_backward(dwant, x32, dout, n, 0);
            for (int threads = 1; threads <= 2; threads++) {
                omp_set_num_threads(threads);
                char what[96];
                uint16_t *y = hvec(n);
                float *y_f32 = fvec(n), *dinp = copy_fvec(pre, n);
                tr_cpu_gelu_forward_act(act_half(y, bf16), act_half(x, bf16), n);
                snprintf(what, sizeof what, "gelu %s n=%zu threads=%d", half_name(bf16), n,
                         threads);
                expect_same_halves(what, y, want, n);
                tr_cpu_gelu_forward_act(act_f32(y_f32), act_half(x, bf16), n);
                snprintf(what, sizeof what, "gelu %s into fp32 n=%zu threads=%d",
                         half_name(bf16), n, threads);
                expect_bitwise(what, y_f32, y32, n);
                tr_cpu_gelu_backward_act(dinp, act_half(x, bf16), dout, n, 0);
                snprintf(what, sizeof what, "gelu %s dinp n=%zu threads=%d", half_name(bf16), n,
                         threads);
                expect_bitwise(what, dinp, dwant, n);
                tr_cpu_gelu_backward_act(NULL, act_half(x, bf16), dout, n, 0); /* no gradient */
                free(y), free(y_f32), free(dinp);
            }
            omp_set_num_threads(saved_threads);
            free(x), free(x32), free(y32), free(dout), free(pre), free(want), free(dwant);
        }
}

Test(activations_16bit, layernorm_forward_backward_bitwise)
{
    rng_t rng = {1503};
    int saved_threads = omp_get_max_threads();
    /* model widths, one past the kernel's 1024-column row tile, and rows
     * for three chunks of the backward's partial sums */
    const int shapes[][2] = {{1, 48}, {7, 100}, {13, 384}, {5, 2048 + 37}, {77, 64}};
    const float eps = 1e-5f;
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int N = shapes[s][0], C = shapes[s][1];
            size_t n_x = (size_t)N * C;
            uint16_t *x = random_hvec(&rng, n_x, -2, 3, bf16, 0); /* nonzero mean */
            float *x32 = widened(x, n_x, bf16);
            float *w = random_fvec(&rng, C, 0.5, 1.5), *b = random_fvec(&rng, C, -1, 1);
            float *dout = random_fvec(&rng, n_x, -1, 1);
            float *pre_x = random_fvec(&rng, n_x, -1, 1), *pre_w = random_fvec(&rng, C, -1, 1);
            float *pre_b = random_fvec(&rng, C, -1, 1);
            float *y32 = fvec(n_x), *mean = fvec(N), *rstd = fvec(N);
            tr_cpu_layernorm_forward(y32, mean, rstd, x32, w, b, N, C, eps);
            uint16_t *want = hvec(n_x);
            tr_cpu_to_half(want, y32, n_x, bf16);
            float *dx_want = copy_fvec(pre_x, n_x), *dw_want = copy_fvec(pre_w, C);
            float *db_want = copy_fvec(pre_b, C);
            float *scratch = fvec(tr_cpu_layernorm_scratch_floats(N, C));
            tr_cpu_layernorm_backward(dx_want, dw_want, db_want, scratch, dout, x32, w, mean,
                                      rstd, N, C, 0);
            for (int threads = 1; threads <= 2; threads++) {
                omp_set_num_threads(threads);
                char what[96];
                uint16_t *y = hvec(n_x);
                float *y_f32 = fvec(n_x), *m = fvec(N), *r = fvec(N);
                tr_cpu_layernorm_forward_act(act_half(y, bf16), m, r, act_half(x, bf16), w, b, N,
                                             C, eps);
                snprintf(what, sizeof what, "layernorm %s %dx%d threads=%d", half_name(bf16), N,
                         C, threads);
                expect_same_halves(what, y, want, n_x);
                expect_bitwise(what, m, mean, N);
                expect_bitwise(what, r, rstd, N);
                tr_cpu_layernorm_forward_act(act_f32(y_f32), m, r, act_half(x, bf16), w, b, N, C,
                                             eps);
                snprintf(what, sizeof what, "layernorm %s into fp32 %dx%d threads=%d",
                         half_name(bf16), N, C, threads);
                expect_bitwise(what, y_f32, y32, n_x);

                float *dx = copy_fvec(pre_x, n_x), *dw = copy_fvec(pre_w, C);
                float *db = copy_fvec(pre_b, C);
                tr_cpu_layernorm_backward_act(dx, dw, db, scratch, dout, act_half(x, bf16), w,
                                              mean, rstd, N, C, 0);
                snprintf(what, sizeof what, "layernorm %s backward %dx%d threads=%d",
                         half_name(bf16), N, C, threads);
                expect_bitwise(what, dx, dx_want, n_x);
                expect_bitwise(what, dw, dw_want, C);
                expect_bitwise(what, db, db_want, C);
                /* the weights' gradients alone (an input that needs none) */
                float *only_w = copy_fvec(pre_w, C);
                tr_cpu_layernorm_backward_act(NULL, only_w, NULL, scratch, dout, act_half(x, bf16),
                                              w, mean, rstd, N, C, 0);
                expect_bitwise(what, only_w, dw_want, C);
                free(y), free(y_f32), free(m), free(r), free(dx), free(dw), free(db);
                free(only_w);
            }
            omp_set_num_threads(saved_threads);
            free(x), free(x32), free(w), free(b), free(dout), free(pre_x), free(pre_w);
            free(pre_b), free(y32), free(mean), free(rstd), free(want), free(dx_want);
            free(dw_want), free(db_want), free(scratch);
        }
}

/* ======================================================================== */
/* RMSNorm                                                                   */
/* ======================================================================== */

typedef struct {
    double *inp, *w;
    int N, C;
    double eps;
    double *rstd; /* optional output */
} rmsnorm_ctx;

static void ref_rmsnorm(const void *vctx, double *out)
{
    const rmsnorm_ctx *c = vctx;
    for (int n = 0; n < c->N; n++) {
        const double *x = c->inp + (size_t)n * c->C;
        double sq = 0.0;
        for (int j = 0; j < c->C; j++)
            sq += x[j] * x[j];
        double s = 1.0 / sqrt(sq / c->C + c->eps);
        for (int j = 0; j < c->C; j++)
            out[(size_t)n * c->C + j] = x[j] * s * c->w[j];
        if (c->rstd)
            c->rstd[n] = s;
    }
}

Test(rmsnorm, forward_backward)
{
    rng_t rng = {851};
    /* odd widths, one row, a Llama-like width, rows past two chunks of dw sums */
    const int shapes[][2] = {{1, 3}, {3, 5}, {7, 16}, {24, 40}, {10, 67}, {5, 130}, {3, 512},
                             {75, 9}};
    const float eps = 1e-5f;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t n_x = (size_t)N * C;
        float *inp = random_fvec(&rng, n_x, -2, 3);
        float *w = random_fvec(&rng, C, 0.5, 1.5);
        float *R = random_fvec(&rng, n_x, -1, 1);
        rmsnorm_ctx ctx = {to_double(inp, n_x), to_double(w, C), N, C, eps, dvec(N)};
        double *Rd = to_double(R, n_x), *want = dvec(n_x);
        float *out = fvec(n_x), *rstd = fvec(N);
        fill_f(out, n_x, NAN);
        fill_f(rstd, N, NAN);
        tr_cpu_rmsnorm_forward(out, rstd, inp, w, N, C, eps);
        ref_rmsnorm(&ctx, want);
        expect_close("rmsnorm forward", out, want, n_x, FWD_TOL);
        expect_close("rmsnorm rstd", rstd, ctx.rstd, N, FWD_TOL);
        free(ctx.rstd);
        ctx.rstd = NULL;

        size_t n_scratch = tr_cpu_rmsnorm_scratch_floats(N, C);
        float *scratch = fvec(n_scratch);
        fill_f(scratch, n_scratch, NAN); /* scratch content must not matter */
        float *dinp = fvec(n_x), *dw = fvec(C);
        tr_cpu_rmsnorm_backward(dinp, dw, scratch, R, inp, w, rstd, N, C, 0);
        check_gradient("rmsnorm dinp", dinp, ref_rmsnorm, &ctx, ctx.inp, n_x, Rd, n_x);
        check_gradient("rmsnorm dw", dw, ref_rmsnorm, &ctx, ctx.w, C, Rd, n_x);

        float *pre_x = random_fvec(&rng, n_x, -1, 1), *pre_w = random_fvec(&rng, C, -1, 1);
        float *acc_x = copy_fvec(pre_x, n_x), *acc_w = copy_fvec(pre_w, C);
        tr_cpu_rmsnorm_backward(acc_x, acc_w, scratch, R, inp, w, rstd, N, C, 0);
        expect_accumulated("rmsnorm dinp accumulates", acc_x, pre_x, dinp, n_x);
        expect_accumulated("rmsnorm dw accumulates", acc_w, pre_w, dw, C);

        float *only_w = fvec(C), *only_x = fvec(n_x);
        tr_cpu_rmsnorm_backward(NULL, only_w, scratch, R, inp, w, rstd, N, C, 0);
        expect_close_ff("rmsnorm dw alone", only_w, dw, C, 0.0);
        tr_cpu_rmsnorm_backward(only_x, NULL, scratch, R, inp, w, rstd, N, C, 0);
        expect_close_ff("rmsnorm dinp alone", only_x, dinp, n_x, 0.0);

        free(inp), free(w), free(R), free(ctx.inp), free(ctx.w), free(Rd), free(want);
        free(out), free(rstd), free(dinp), free(dw), free(pre_x), free(pre_w), free(acc_x);
        free(acc_w), free(only_w), free(only_x), free(scratch);
    }
}

/* eps matters where the row is small: an all-zero row gives 0, not NaN, and
 * rstd = 1/sqrt(eps) */
Test(rmsnorm, zero_row_and_eps)
{
    float x[8] = {0}, w[8] = {1, 1, 1, 1, 1, 1, 1, 1}, out[8], rstd[1], dx[8] = {0}, dw[8] = {0};
    float dy[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tr_cpu_rmsnorm_forward(out, rstd, x, w, 1, 8, 1e-6f);
    cr_assert(fabsf(rstd[0] - 1000.0f) <= 1e-3f, "rstd of a zero row is 1/sqrt(eps): %g", rstd[0]);
    for (int i = 0; i < 8; i++)
        cr_assert(out[i] == 0.0f, "zero row stays zero");
    float scratch[8];
    tr_cpu_rmsnorm_backward(dx, dw, scratch, dy, x, w, rstd, 1, 8, 0);
    for (int i = 0; i < 8; i++) {
        cr_assert(fabsf(dx[i] - 1000.0f * dy[i]) <= 1e-3f * dy[i], "dx of a zero row is rstd * dy");
        cr_assert(dw[i] == 0.0f, "dw of a zero row is 0");
    }
}

/* ======================================================================== */
/* rotary position embedding                                                 */
/* ======================================================================== */

typedef struct {
    double *x;
    int B, T, H, D;
    double theta;
} rope_ctx;

/* Hugging Face's rotate-half: pair (i, i + D/2) turns by t * theta^(-2i/D) */
static void ref_rope(const void *vctx, double *out)
{
    const rope_ctx *c = vctx;
    int half = c->D / 2;
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int h = 0; h < c->H; h++) {
                size_t base = (((size_t)b * c->T + t) * c->H + h) * c->D;
                for (int i = 0; i < half; i++) {
                    double angle = t * pow(c->theta, -2.0 * i / c->D);
                    double a = c->x[base + i], bb = c->x[base + i + half];
                    out[base + i] = a * cos(angle) - bb * sin(angle);
                    out[base + i + half] = bb * cos(angle) + a * sin(angle);
                }
            }
}

Test(rope, forward_backward)
{
    rng_t rng = {861};
    /* B, T, H, D, theta: D = 2, D not a multiple of 16, T = 1, one head,
     * Llama 2's and Llama 3's theta */
    const struct {
        int B, T, H, D;
        double theta;
    } shapes[] = {{1, 1, 1, 2, 10000},  {2, 5, 3, 8, 10000},   {1, 9, 2, 6, 10000},
                  {2, 7, 4, 18, 500000}, {1, 33, 2, 64, 10000}, {3, 4, 1, 34, 1e6},
                  {1, 20, 3, 128, 10000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s].B, T = shapes[s].T, H = shapes[s].H, D = shapes[s].D;
        float theta = (float)shapes[s].theta;
        size_t n = (size_t)B * T * H * D;
        float *x = random_fvec(&rng, n, -2, 2), *R = random_fvec(&rng, n, -1, 1);
        rope_ctx ctx = {to_double(x, n), B, T, H, D, theta};
        double *Rd = to_double(R, n), *want = dvec(n);
        size_t n_scratch = tr_cpu_rope_scratch_floats(T, D);
        float *scratch = fvec(n_scratch), *out = fvec(n);
        fill_f(scratch, n_scratch, NAN); /* scratch content must not matter */
        fill_f(out, n, NAN);
        tr_cpu_rope_forward(out, x, scratch, B, T, H, D, theta);
        ref_rope(&ctx, want);
        expect_close("rope forward", out, want, n, FWD_TOL);

        float *dx = fvec(n);
        fill_f(scratch, n_scratch, NAN);
        tr_cpu_rope_backward(dx, R, scratch, B, T, H, D, theta, 0);
        check_gradient("rope dinp", dx, ref_rope, &ctx, ctx.x, n, Rd, n);

        float *pre = random_fvec(&rng, n, -1, 1), *acc = copy_fvec(pre, n);
        tr_cpu_rope_backward(acc, R, scratch, B, T, H, D, theta, 0);
        expect_accumulated("rope dinp accumulates", acc, pre, dx, n);
        tr_cpu_rope_backward(NULL, R, scratch, B, T, H, D, theta, 0);

        /* position 0 is the identity; every pair keeps its length */
        int half = D / 2;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    size_t base = (((size_t)b * T + t) * H + h) * D;
                    for (int i = 0; i < half; i++) {
                        float a = x[base + i], c = x[base + i + half];
                        float ya = out[base + i], yc = out[base + i + half];
                        if (t == 0)
                            cr_assert(ya == a && yc == c, "rope at position 0 changed [%zu]",
                                      base + i);
                        double before = (double)a * a + (double)c * c;
                        double after = (double)ya * ya + (double)yc * yc;
                        cr_assert(fabs(after - before) <= 1e-6 * fmax(before, 1e-3),
                                  "rope changed the length of pair %d at t=%d: %.9g -> %.9g", i, t,
                                  before, after);
                    }
                }

        /* backward turns back: rope^-1(rope(x)) = x */
        float *back = fvec(n);
        tr_cpu_rope_backward(back, out, scratch, B, T, H, D, theta, 0);
        expect_close_ff("rope backward inverts forward", back, x, n, 1e-6);

        free(x), free(R), free(ctx.x), free(Rd), free(want), free(scratch), free(out), free(dx);
        free(pre), free(acc), free(back);
    }
}

/* The convention, spelled out on unit vectors: channel i of a head goes to
 * (cos, sin) on channels (i, i + D/2), and channel i + D/2 to (-sin, cos) */
/* Llama 3.1's scaled frequencies (kernels/rope_scaling.h) are transformers'
 * bit for bit: tests/fixtures/hf/rope_llama3_freqs.txt holds the plain
 * frequencies and what _compute_llama3_parameters makes of them for Llama
 * 3.1 8B's settings, the tiny-llama-rope3 fixture's and 100 random ones
 * (make_hf_fixtures.py); and the scaled rope turns pairs by exactly those
 * frequencies.  (The plain ones are the CPU's powf's, which differ from
 * torch's pow by an ulp in a few settings: counted, not asserted.) */
Test(rope, llama3_scaling_is_transformers)
{
    const char *src = getenv("TR_SRCDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/hf/rope_llama3_freqs.txt", src ? src : ".");
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot read %s", path);
    char line[16384];
    int settings = 0, changed = 0, ulps = 0, total = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = line, *end;
        double theta = strtod(p, &end);
        p = end;
        int D = (int)strtol(p, &end, 10);
        p = end;
        struct tr_rope_scaling sc;
        sc.factor = strtod(p, &end);
        p = end;
        sc.low_freq_factor = strtod(p, &end);
        p = end;
        sc.high_freq_factor = strtod(p, &end);
        p = end;
        sc.original_ctx = strtol(p, &end, 10);
        p = end;
        cr_assert(D >= 2 && D <= 1024, "line %d: head %d", settings + 1, D);
        float plain[512];
        for (int i = 0; i < D / 2; i++) {
            plain[i] = (float)strtod(p, &end);
            cr_assert(end != p, "line %d: %d plain frequencies, want %d", settings + 1, i, D / 2);
            p = end;
            ulps += plain[i] != 1.0f / powf((float)theta, (float)(2 * i) / (float)D);
            total++;
        }
        for (int i = 0; i < D / 2; i++) {
            double want = strtod(p, &end);
            cr_assert(end != p, "line %d: %d frequencies, want %d", settings + 1, i, D / 2);
            p = end;
            float got = tr_rope_scale_freq(plain[i], sc);
            cr_assert((double)got == want, "theta %g head %d factor %g low %g high %g original %g: "
                      "f_%d is %a, transformers %a", theta, D, (double)sc.factor,
                      (double)sc.low_freq_factor, (double)sc.high_freq_factor,
                      (double)sc.original_ctx, i, (double)got, want);
            changed += got != plain[i];
        }
        settings++;
    }
    fclose(f);
    cr_assert_geq(settings, 100);
    cr_assert_gt(changed, 500, "only %d frequencies scaled", changed);
    cr_log_info("%d settings, %d of %d frequencies scaled, identical to transformers'; plain "
                "frequencies from powf off torch's by an ulp: %d", settings, changed, total, ulps);

    /* the kernel's angles: t * f' */
    enum { T = 9, D = 8, HALF = D / 2 };
    struct tr_rope_scaling sc = {4.0, 1.0, 4.0, 16.0};
    float *scratch = fvec(tr_cpu_rope_scratch_floats(T, D));
    float x[T * D] = {0}, out[T * D];
    for (int t = 0; t < T; t++)
        x[t * D] = 1.0f; /* channel 0: its output pair is (cos, sin) of f'_0 t */
    tr_cpu_rope_forward_scaled(out, x, scratch, 1, T, 1, D, 10000.0f, &sc);
    float f0 = tr_rope_scale_freq(1.0f, sc);
    cr_assert(f0 != 1.0f, "the test's frequency 0 is not scaled");
    for (int t = 0; t < T; t++) {
        float s, c;
        sincosf((float)t * f0, &s, &c);
        cr_assert(out[t * D] == c && out[t * D + HALF] == s, "t=%d: (%.9g, %.9g), want (%.9g, %.9g)",
                  t, out[t * D], out[t * D + HALF], c, s);
    }
    free(scratch);
}

Test(rope, rotate_half_convention)
{
    enum { T = 5, D = 8, HALF = D / 2 };
    float theta = 10000.0f;
    float *scratch = fvec(tr_cpu_rope_scratch_floats(T, D));
    for (int i = 0; i < D; i++) {
        float x[T * D] = {0}, out[T * D];
        for (int t = 0; t < T; t++)
            x[t * D + i] = 1.0f;
        tr_cpu_rope_forward(out, x, scratch, 1, T, 1, D, theta);
        int pair = i % HALF;
        for (int t = 0; t < T; t++) {
            double angle = t * pow(10000.0, -2.0 * pair / D);
            for (int j = 0; j < D; j++) {
                double want = 0.0;
                if (i < HALF && j == i)
                    want = cos(angle);
                else if (i < HALF && j == i + HALF)
                    want = sin(angle);
                else if (i >= HALF && j == i)
                    want = cos(angle);
                else if (i >= HALF && j == i - HALF)
                    want = -sin(angle);
                cr_assert(fabs(out[t * D + j] - want) <= 1e-6,
                          "unit %d at t=%d: channel %d is %.8g, want %.8g", i, t, j,
                          out[t * D + j], want);
            }
        }
    }
    free(scratch);
}

/* ======================================================================== */
/* SwiGLU and scale                                                          */
/* ======================================================================== */

typedef struct {
    double *gate, *up;
    size_t n;
} swiglu_ctx;

static void ref_swiglu(const void *vctx, double *out)
{
    const swiglu_ctx *c = vctx;
    for (size_t i = 0; i < c->n; i++)
        out[i] = c->gate[i] / (1.0 + exp(-c->gate[i])) * c->up[i];
}

Test(swiglu, forward_backward)
{
    rng_t rng = {871};
    const size_t sizes[] = {1, 7, 8, 64, 333, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *gate = random_fvec(&rng, n, -6, 6), *up = random_fvec(&rng, n, -2, 2);
        float *R = random_fvec(&rng, n, -1, 1);
        swiglu_ctx ctx = {to_double(gate, n), to_double(up, n), n};
        double *Rd = to_double(R, n), *want = dvec(n);
        float *out = fvec(n);
        fill_f(out, n, NAN);
        tr_cpu_swiglu_forward(out, gate, up, n);
        ref_swiglu(&ctx, want);
        expect_close("swiglu forward", out, want, n, FWD_TOL);

        float *dg = fvec(n), *du = fvec(n);
        tr_cpu_swiglu_backward(dg, du, gate, up, R, n, 0);
        check_gradient("swiglu dgate", dg, ref_swiglu, &ctx, ctx.gate, n, Rd, n);
        check_gradient("swiglu dup", du, ref_swiglu, &ctx, ctx.up, n, Rd, n);

        float *pre_g = random_fvec(&rng, n, -1, 1), *pre_u = random_fvec(&rng, n, -1, 1);
        float *acc_g = copy_fvec(pre_g, n), *acc_u = copy_fvec(pre_u, n);
        tr_cpu_swiglu_backward(acc_g, acc_u, gate, up, R, n, 0);
        expect_accumulated("swiglu dgate accumulates", acc_g, pre_g, dg, n);
        expect_accumulated("swiglu dup accumulates", acc_u, pre_u, du, n);

        float *only_g = fvec(n), *only_u = fvec(n);
        tr_cpu_swiglu_backward(only_g, NULL, gate, up, R, n, 0);
        tr_cpu_swiglu_backward(NULL, only_u, gate, up, R, n, 0);
        expect_close_ff("swiglu dgate alone", only_g, dg, n, 0.0);
        expect_close_ff("swiglu dup alone", only_u, du, n, 0.0);
        tr_cpu_swiglu_backward(NULL, NULL, gate, up, R, n, 0);

        free(gate), free(up), free(R), free(ctx.gate), free(ctx.up), free(Rd), free(want);
        free(out), free(dg), free(du), free(pre_g), free(pre_u), free(acc_g), free(acc_u);
        free(only_g), free(only_u);
    }
}

/* out = silu(x) * x: gate and up are one tensor, so both gradients go into
 * one buffer and must both land, in the vector body and in the tail */
Test(swiglu, same_tensor_for_gate_and_up)
{
    rng_t rng = {872};
    const size_t sizes[] = {1, 8, 13, 148};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = random_fvec(&rng, n, -4, 4), *R = random_fvec(&rng, n, -1, 1);
        float *pre = random_fvec(&rng, n, -1, 1), *dx = copy_fvec(pre, n);
        float *dg = fvec(n), *du = fvec(n);
        tr_cpu_swiglu_backward(dx, dx, x, x, R, n, 0);
        tr_cpu_swiglu_backward(dg, du, x, x, R, n, 0);
        double *want = dvec(n);
        for (size_t i = 0; i < n; i++)
            want[i] = (double)pre[i] + dg[i] + du[i];
        expect_close("swiglu dgate + dup in one buffer", dx, want, n, 1e-6);
        free(x), free(R), free(pre), free(dx), free(dg), free(du), free(want);
    }
}

/* Far out on both sides (silu -> g and -> 0 without overflow or NaN), against
 * the double formula, relative to the result; sizes cover the padded tail. */
Test(swiglu, wide_range_and_tails)
{
    const size_t sizes[] = {1, 8, 13, 20001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *g = fvec(n), *up = fvec(n), *out = fvec(n), *dg = fvec(n), *du = fvec(n);
        float *ones = fvec(n);
        for (size_t i = 0; i < n; i++) {
            g[i] = n == 1 ? -0.5f : (float)(-100.0 + 200.0 * (double)i / (double)(n - 1));
            up[i] = 1.0f;
            ones[i] = 1.0f;
        }
        tr_cpu_swiglu_forward(out, g, up, n);
        tr_cpu_swiglu_backward(dg, du, g, up, ones, n, 0);
        for (size_t i = 0; i < n; i++) {
            double G = g[i], sig = 1.0 / (1.0 + exp(-G)), want = G * sig;
            double dwant = sig * (1.0 + G * (1.0 - sig));
            /* exp(-g) carries |g| * 1e-7 relative from the rounding of g, and
             * exp's clamp at -87/88 leaves ~1e-38 absolute below */
            double tol = 4e-7 * (1.0 + fabs(G));
            cr_assert(fabs(out[i] - want) <= tol * fabs(want) + 1e-30,
                      "silu(%.9g) = %.9g, want %.9g", G, out[i], want);
            cr_assert(fabs(du[i] - want) <= tol * fabs(want) + 1e-30, "dup at %.9g", G);
            cr_assert(fabs(dg[i] - dwant) <= 2 * tol * (sig + fabs(G * sig * (1 - sig))) + 1e-30,
                      "silu'(%.9g) = %.9g, want %.9g", G, dg[i], dwant);
        }
        free(g), free(up), free(out), free(dg), free(du), free(ones);
    }
}

/* ======================================================================== */
/* GELU, SwiGLU and exp: the AVX-512 path against the AVX2 path            */
/* ======================================================================== */

/* The elementwise kernels' 16-lane path must give the 8-lane path's bits
 * for every element, whatever its position in the call and the thread
 * count: each op runs on a multi-chunk array with the AVX2 path (the
 * reference), then on that array and on slices of every length 0..40 (at
 * shifting offsets, so each tail length starts at other positions) with
 * both paths, 1 and 2 threads.  SwiGLU's backward is compared slice against
 * slice only: it adds a padded tail's gradients, computed from zero, to
 * dgate and dup afterwards, where the body updates them in one (fused)
 * step, so its last n % 8 elements can round differently from the same
 * element in the body, on either path alike. */

enum { EW_BIG = 3 * 4096 + 8 + 5 }; /* GELU's chunks, an odd 8-block and a tail */

/* every fifth input from the edges of the float range (and of GELU's and
 * exp's clamps), every fifth a large |x|, the rest in [-12, 12] */
static float *ew_path_inputs(rng_t *rng, size_t n)
{
    static const float edge[] = {0.0f,    -0.0f,   1e-45f,  -1e-45f,  1.1754944e-38f, -3e-39f,
                                 1e-20f,  -1e-8f,  9.0f,    -9.0f,    10.0f,          -10.0f,
                                 43.5f,   -43.5f,  87.0f,   -87.0f,   88.0f,          -88.0f,
                                 89.0f,   -89.0f,  1e4f,    -1e4f,    3.4028235e38f,  -3.4028235e38f,
                                 INFINITY, -INFINITY, NAN};
    float *x = fvec(n);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(rng);
        if (r % 5 == 0)
            x[i] = edge[(r >> 8) % (sizeof edge / sizeof *edge)];
        else if (r % 5 == 1) /* |x| from 12 to 1e13, either sign */
            x[i] = (float)((r & 256 ? -1 : 1) * 12.0 * exp(rng_uniform(rng, 0, 27)));
        else
            x[i] = (float)rng_uniform(rng, -12, 12);
    }
    return x;
}

struct ew_in {
    float *x, *up, *dout, *pre, *pre2; /* pre, pre2: gradients' prior contents */
    float *ex;                         /* exp_shifted's, with shift 2.5: finite sums */
    uint16_t *x16[2];                  /* x as fp16, bf16 */
};

struct ew_out {
    float *gelu, *dgelu, *silu, *dgate, *dup, *dgate_only, *dup_only, *dsame, *exp;
    float exp_sum;
    uint16_t *gelu16[2];
    float *gelu16_f32[2], *dgelu16[2];
};

static void ew_out_alloc(struct ew_out *o, size_t n)
{
    float **f[] = {&o->gelu,       &o->dgelu,    &o->silu,  &o->dgate,         &o->dup,
                   &o->dgate_only, &o->dup_only, &o->dsame, &o->exp,           &o->gelu16_f32[0],
                   &o->gelu16_f32[1], &o->dgelu16[0], &o->dgelu16[1]};
    for (size_t k = 0; k < sizeof f / sizeof *f; k++)
        *f[k] = fvec(n);
    o->gelu16[0] = hvec(n), o->gelu16[1] = hvec(n);
}

static void ew_out_free(struct ew_out *o)
{
    free(o->gelu), free(o->dgelu), free(o->silu), free(o->dgate), free(o->dup);
    free(o->dgate_only), free(o->dup_only), free(o->dsame), free(o->exp);
    for (int b = 0; b < 2; b++)
        free(o->gelu16[b]), free(o->gelu16_f32[b]), free(o->dgelu16[b]);
}

/* every op on elements [off, off+n) of in, into the same elements of o */
static void ew_run_all(struct ew_out *o, const struct ew_in *in, size_t off, size_t n, int path,
                       int threads)
{
    size_t bytes = n * sizeof(float);
    int saved_cap = tr_cpu_elementwise_cap(path), saved_threads = omp_get_max_threads();
    omp_set_num_threads(threads);
    const float *x = in->x + off, *up = in->up + off, *dout = in->dout + off;
    memset(o->gelu + off, 0xa5, bytes); /* outputs not written show */
    memset(o->silu + off, 0xa5, bytes);
    for (int b = 0; b < 2; b++) {
        memset(o->gelu16[b] + off, 0xa5, n * sizeof(uint16_t));
        memset(o->gelu16_f32[b] + off, 0xa5, bytes);
    }
    tr_cpu_gelu_forward(o->gelu + off, x, n);
    memcpy(o->dgelu + off, in->pre + off, bytes);
    tr_cpu_gelu_backward(o->dgelu + off, x, dout, n, 0);
    tr_cpu_swiglu_forward(o->silu + off, x, up, n);
    memcpy(o->dgate + off, in->pre + off, bytes);
    memcpy(o->dup + off, in->pre2 + off, bytes);
    tr_cpu_swiglu_backward(o->dgate + off, o->dup + off, x, up, dout, n, 0);
    memcpy(o->dgate_only + off, in->pre + off, bytes);
    tr_cpu_swiglu_backward(o->dgate_only + off, NULL, x, up, dout, n, 0);
    memcpy(o->dup_only + off, in->pre2 + off, bytes);
    tr_cpu_swiglu_backward(NULL, o->dup_only + off, x, up, dout, n, 0);
    memcpy(o->dsame + off, in->pre + off, bytes); /* silu(x) * x: one tensor, one gradient */
    tr_cpu_swiglu_backward(o->dsame + off, o->dsame + off, x, x, dout, n, 0);
    memcpy(o->exp + off, in->ex + off, bytes);
    o->exp_sum = tr_cpu_exp_shifted(o->exp + off, (int)n, 2.5f);
    for (int b = 0; b < 2; b++) {
        struct tr_cpu_act x16 = act_half(in->x16[b] + off, b);
        tr_cpu_gelu_forward_act(act_half(o->gelu16[b] + off, b), x16, n);
        tr_cpu_gelu_forward_act(act_f32(o->gelu16_f32[b] + off), x16, n);
        memcpy(o->dgelu16[b] + off, in->pre + off, bytes);
        tr_cpu_gelu_backward_act(o->dgelu16[b] + off, x16, dout, n, 0);
    }
    tr_cpu_elementwise_cap(saved_cap);
    omp_set_num_threads(saved_threads);
}

/* b's elements [off, off+n) against a's; swiglu's gradients only where
 * swiglu_grads */
static void ew_expect_same(const char *what, const struct ew_out *a, const struct ew_out *b,
                           size_t off, size_t n, int swiglu_grads)
{
    const struct {
        const char *name;
        const float *a, *b;
    } f[] = {{"gelu", a->gelu, b->gelu},
             {"gelu dinp", a->dgelu, b->dgelu},
             {"swiglu out", a->silu, b->silu},
             {"swiglu dgate", a->dgate, b->dgate},
             {"swiglu dup", a->dup, b->dup},
             {"swiglu dgate alone", a->dgate_only, b->dgate_only},
             {"swiglu dup alone", a->dup_only, b->dup_only},
             {"swiglu dx of silu(x) * x", a->dsame, b->dsame},
             {"exp_shifted", a->exp, b->exp},
             {"gelu fp16 into fp32", a->gelu16_f32[0], b->gelu16_f32[0]},
             {"gelu bf16 into fp32", a->gelu16_f32[1], b->gelu16_f32[1]},
             {"gelu fp16 dinp", a->dgelu16[0], b->dgelu16[0]},
             {"gelu bf16 dinp", a->dgelu16[1], b->dgelu16[1]}};
    for (size_t k = 0; k < sizeof f / sizeof *f; k++)
        for (size_t i = off; i < off + n && (swiglu_grads || strncmp(f[k].name, "swiglu d", 8)); i++)
            cr_assert(memcmp(&f[k].a[i], &f[k].b[i], sizeof(float)) == 0,
                      "%s: %s [%zu]: %a, want %a", what, f[k].name, i, (double)f[k].b[i],
                      (double)f[k].a[i]);
    for (int b16 = 0; b16 < 2; b16++)
        for (size_t i = off; i < off + n; i++)
            cr_assert(a->gelu16[b16][i] == b->gelu16[b16][i], "%s: gelu %s [%zu]: 0x%04x, want 0x%04x",
                      what, half_name(b16), i, b->gelu16[b16][i], a->gelu16[b16][i]);
}

Test(elementwise_paths, avx512_same_bits_as_avx2)
{
    if (!tr_cpu_avx512f() || tr_cpu_elementwise_path() != TR_CPU_EW_AVX512)
        cr_skip_test("no AVX-512F on this CPU: the elementwise kernels run the AVX2 path");
    rng_t rng = {1901};
    struct ew_in in = {.x = ew_path_inputs(&rng, EW_BIG),
                       .up = random_fvec(&rng, EW_BIG, -2, 2),
                       .dout = random_fvec(&rng, EW_BIG, -1, 1),
                       .pre = random_fvec(&rng, EW_BIG, -1, 1),
                       .pre2 = random_fvec(&rng, EW_BIG, -1, 1),
                       .x16 = {hvec(EW_BIG), hvec(EW_BIG)}};
    for (size_t i = 0; i < EW_BIG; i += 7) /* large and special up operands too */
        in.up[i] = in.x[(i * 31) % EW_BIG];
    in.ex = random_fvec(&rng, EW_BIG, -30, 2.5);
    for (size_t i = 0; i < EW_BIG; i += 5) /* below exp's clamp, down to -inf, and +-0 */
        in.ex[i] = isfinite(in.x[i]) ? -fabsf(in.x[i]) : -INFINITY;
    for (int b = 0; b < 2; b++)
        tr_cpu_to_half(in.x16[b], in.x, EW_BIG, b);
    struct ew_out ref, avx2, avx512;
    ew_out_alloc(&ref, EW_BIG), ew_out_alloc(&avx2, EW_BIG), ew_out_alloc(&avx512, EW_BIG);
    ew_run_all(&ref, &in, 0, EW_BIG, TR_CPU_EW_AVX2, 2);
    char what[96];
    for (int threads = 1; threads <= 2; threads++) {
        ew_run_all(&avx512, &in, 0, EW_BIG, TR_CPU_EW_AVX512, threads);
        snprintf(what, sizeof what, "n=%d threads=%d", (int)EW_BIG, threads);
        ew_expect_same(what, &ref, &avx512, 0, EW_BIG, 1);
        cr_assert(memcmp(&ref.exp_sum, &avx512.exp_sum, sizeof(float)) == 0,
                  "%s: exp_shifted sum %a, want %a", what, (double)avx512.exp_sum,
                  (double)ref.exp_sum);
    }
    for (size_t n = 0; n <= 40; n++)
        for (int threads = 1; threads <= 2; threads++) {
            size_t off = (n * 13 + (size_t)threads * 5) % 64;
            ew_run_all(&avx2, &in, off, n, TR_CPU_EW_AVX2, threads);
            ew_run_all(&avx512, &in, off, n, TR_CPU_EW_AVX512, threads);
            snprintf(what, sizeof what, "AVX-512 n=%zu at %zu threads=%d", n, off, threads);
            ew_expect_same(what, &avx2, &avx512, off, n, 1);
            snprintf(what, sizeof what, "AVX2 n=%zu at %zu threads=%d, against n=%d", n, off,
                     threads, (int)EW_BIG);
            ew_expect_same(what, &ref, &avx2, off, n, 0);
            cr_assert(memcmp(&avx2.exp_sum, &avx512.exp_sum, sizeof(float)) == 0,
                      "%s: exp_shifted sum %a, want %a", what, (double)avx512.exp_sum,
                      (double)avx2.exp_sum);
        }
    ew_out_free(&ref), ew_out_free(&avx2), ew_out_free(&avx512);
    free(in.x), free(in.up), free(in.dout), free(in.pre), free(in.pre2), free(in.ex);
    free(in.x16[0]), free(in.x16[1]);
}

Test(scale, forward_backward)
{
    rng_t rng = {881};
    const size_t sizes[] = {1, 7, 1000};
    const float scales[] = {1.0f, 0.125f, 22.627417f, -3.0f};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
            size_t n = sizes[s];
            float sc = scales[k];
            float *x = random_fvec(&rng, n, -2, 2), *R = random_fvec(&rng, n, -1, 1);
            float *out = fvec(n), *pre = random_fvec(&rng, n, -1, 1), *acc = copy_fvec(pre, n);
            tr_cpu_scale_forward(out, x, sc, n);
            tr_cpu_scale_backward(acc, R, sc, n, 0);
            tr_cpu_scale_backward(NULL, R, sc, n, 0);
            for (size_t i = 0; i < n; i++) {
                cr_assert(out[i] == sc * x[i], "scale forward [%zu]", i);
                double want = (double)pre[i] + (double)sc * R[i]; /* one rounding, or two */
                cr_assert(fabs(acc[i] - want) <= 2e-7 * (fabs(pre[i]) + fabs(sc * R[i])),
                          "scale backward accumulates [%zu]: %.9g, want %.9g", i, acc[i], want);
            }
            free(x), free(R), free(out), free(pre), free(acc);
        }
}

/* ======================================================================== */
/* attention                                                                 */
/* ======================================================================== */

typedef struct {
    double *qkv;
    int B, T, C, NH;
    double *lse; /* optional output: log-sum-exp of each scaled score row */
} attention_ctx;

static void ref_attention(const void *vctx, double *out)
{
    const attention_ctx *c = vctx;
    int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *p = dvec(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = c->qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double max = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const double *k = c->qkv + ((size_t)b * T + s) * 3 * C + C + h * hs;
                    double score = 0.0;
                    for (int d = 0; d < hs; d++)
                        score += q[d] * k[d];
                    p[s] = score * scale;
                    max = fmax(max, p[s]);
                }
                double sum = 0.0;
                for (int s = 0; s <= t; s++) {
                    p[s] = exp(p[s] - max);
                    sum += p[s];
                }
                for (int s = 0; s <= t; s++)
                    p[s] /= sum;
                if (c->lse)
                    c->lse[((size_t)b * NH + h) * T + t] = max + log(sum);
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int d = 0; d < hs; d++) {
                    double acc = 0.0;
                    for (int s = 0; s <= t; s++)
                        acc += p[s] * c->qkv[((size_t)b * T + s) * 3 * C + 2 * C + h * hs + d];
                    o[d] = acc;
                }
            }
    free(p);
}

static void check_attention(rng_t *rng, int B, int T, int C, int NH)
{
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    size_t n_lse = (size_t)B * NH * T;
    float *qkv = random_fvec(rng, n_qkv, -1.5, 1.5);
    float *R = random_fvec(rng, n_out, -1, 1);
    attention_ctx ctx = {to_double(qkv, n_qkv), B, T, C, NH, dvec(n_lse)};
    double *Rd = to_double(R, n_out), *want = dvec(n_out);
    float *out = fvec(n_out), *lse = fvec(n_lse);
    fill_f(out, n_out, NAN);
    fill_f(lse, n_lse, NAN); /* every row must be written */
    tr_cpu_attention_forward(out, lse, qkv, B, T, C, NH);
    ref_attention(&ctx, want);
    expect_close("attention forward", out, want, n_out, FWD_TOL);
    expect_close("attention log-sum-exp", lse, ctx.lse, n_lse, FWD_TOL);
    free(ctx.lse);
    ctx.lse = NULL;

    size_t n_scratch = tr_cpu_attention_scratch_floats(B, T, C, NH);
    float *scratch = fvec(n_scratch);
    fill_f(scratch, n_scratch, NAN); /* scratch content must not matter */
    float *dqkv = fvec(n_qkv);
    tr_cpu_attention_backward(dqkv, scratch, R, out, qkv, lse, B, T, C, NH, 0);
    check_gradient("attention dqkv", dqkv, ref_attention, &ctx, ctx.qkv, n_qkv, Rd, n_out);

    float *pre = random_fvec(rng, n_qkv, -1, 1), *acc = copy_fvec(pre, n_qkv);
    tr_cpu_attention_backward(acc, scratch, R, out, qkv, lse, B, T, C, NH, 0);
    expect_accumulated("attention dqkv accumulates", acc, pre, dqkv, n_qkv);
    tr_cpu_attention_backward(NULL, scratch, R, out, qkv, lse, B, T, C, NH, 0);

    free(qkv), free(R), free(ctx.qkv), free(Rd), free(want), free(out), free(lse);
    free(scratch), free(dqkv), free(pre), free(acc);
}

Test(attention, forward_backward)
{
    rng_t rng = {901};
    /* B, T, C, NH: T = 1, one head, several heads, T past one block of
     * queries and keys (64), and past two (several key blocks per query block) */
    const int shapes[][4] = {{1, 1, 8, 2}, {2, 1, 6, 1}, {2, 5, 12, 3}, {1, 9, 16, 4},
                             {2, 7, 8, 1}, {3, 4, 20, 2}, {1, 67, 4, 2}, {1, 150, 6, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        check_attention(&rng, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
}

/* ======================================================================== */
/* grouped-query attention (separate q, k, v)                                */
/* ======================================================================== */

typedef struct {
    double *q, *k, *v;
    int B, T, H, KV, D;
    double *lse; /* optional output */
} gqa_ctx;

/* The naive form: every key/value head repeated for its H/KV query heads
 * (as transformers' repeat_kv does), then plain causal attention. */
static void ref_gqa(const void *vctx, double *out)
{
    const gqa_ctx *c = vctx;
    int B = c->B, T = c->T, H = c->H, KV = c->KV, D = c->D, group = H / KV;
    double scale = 1.0 / sqrt((double)D);
    double *kr = dvec((size_t)B * T * H * D), *vr = dvec((size_t)B * T * H * D);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    size_t src = (((size_t)b * T + t) * KV + h / group) * D + d;
                    kr[(((size_t)b * T + t) * H + h) * D + d] = c->k[src];
                    vr[(((size_t)b * T + t) * H + h) * D + d] = c->v[src];
                }
    double *p = dvec(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const double *q = c->q + (((size_t)b * T + t) * H + h) * D;
                double max = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const double *k = kr + (((size_t)b * T + s) * H + h) * D;
                    p[s] = dot(q, k, D) * scale;
                    max = fmax(max, p[s]);
                }
                double sum = 0.0;
                for (int s = 0; s <= t; s++) {
                    p[s] = exp(p[s] - max);
                    sum += p[s];
                }
                if (c->lse)
                    c->lse[((size_t)b * H + h) * T + t] = max + log(sum);
                double *o = out + (((size_t)b * T + t) * H + h) * D;
                for (int d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int s = 0; s <= t; s++)
                        acc += p[s] / sum * vr[(((size_t)b * T + s) * H + h) * D + d];
                    o[d] = acc;
                }
            }
    free(p), free(kr), free(vr);
}

static void check_gqa(rng_t *rng, int B, int T, int H, int KV, int D)
{
    size_t n_q = (size_t)B * T * H * D, n_kv = (size_t)B * T * KV * D;
    size_t n_lse = (size_t)B * H * T;
    float *q = random_fvec(rng, n_q, -1.5, 1.5), *k = random_fvec(rng, n_kv, -1.5, 1.5);
    float *v = random_fvec(rng, n_kv, -1.5, 1.5), *R = random_fvec(rng, n_q, -1, 1);
    gqa_ctx ctx = {to_double(q, n_q), to_double(k, n_kv), to_double(v, n_kv), B, T, H, KV, D,
                   dvec(n_lse)};
    double *Rd = to_double(R, n_q), *want = dvec(n_q);
    float *out = fvec(n_q), *lse = fvec(n_lse);
    fill_f(out, n_q, NAN);
    fill_f(lse, n_lse, NAN); /* every row must be written */
    tr_cpu_attention_gqa_forward(out, lse, q, k, v, B, T, H, KV, D);
    ref_gqa(&ctx, want);
    char what[96];
    snprintf(what, sizeof what, "gqa forward B%d T%d H%d KV%d D%d", B, T, H, KV, D);
    expect_close(what, out, want, n_q, FWD_TOL);
    expect_close("gqa log-sum-exp", lse, ctx.lse, n_lse, FWD_TOL);
    free(ctx.lse);
    ctx.lse = NULL;

    size_t n_scratch = tr_cpu_attention_gqa_scratch_floats(B, T, H, KV, D);
    float *scratch = fvec(n_scratch);
    fill_f(scratch, n_scratch, NAN); /* scratch content must not matter */
    float *dq = fvec(n_q), *dk = fvec(n_kv), *dv = fvec(n_kv);
    tr_cpu_attention_gqa_backward(dq, dk, dv, scratch, R, out, q, k, v, lse, B, T, H, KV, D, 0);
    snprintf(what, sizeof what, "gqa dq B%d T%d H%d KV%d D%d", B, T, H, KV, D);
    check_gradient(what, dq, ref_gqa, &ctx, ctx.q, n_q, Rd, n_q);
    snprintf(what, sizeof what, "gqa dk B%d T%d H%d KV%d D%d", B, T, H, KV, D);
    check_gradient(what, dk, ref_gqa, &ctx, ctx.k, n_kv, Rd, n_q);
    snprintf(what, sizeof what, "gqa dv B%d T%d H%d KV%d D%d", B, T, H, KV, D);
    check_gradient(what, dv, ref_gqa, &ctx, ctx.v, n_kv, Rd, n_q);

    float *pre_q = random_fvec(rng, n_q, -1, 1), *acc_q = copy_fvec(pre_q, n_q);
    float *pre_k = random_fvec(rng, n_kv, -1, 1), *acc_k = copy_fvec(pre_k, n_kv);
    float *pre_v = random_fvec(rng, n_kv, -1, 1), *acc_v = copy_fvec(pre_v, n_kv);
    tr_cpu_attention_gqa_backward(acc_q, acc_k, acc_v, scratch, R, out, q, k, v, lse, B, T, H,
                                  KV, D, 0);
    expect_accumulated("gqa dq accumulates", acc_q, pre_q, dq, n_q);
    expect_accumulated("gqa dk accumulates", acc_k, pre_k, dk, n_kv);
    expect_accumulated("gqa dv accumulates", acc_v, pre_v, dv, n_kv);

    /* each gradient alone is the same as with the others */
    float *only_q = fvec(n_q), *only_k = fvec(n_kv), *only_v = fvec(n_kv);
    tr_cpu_attention_gqa_backward(only_q, NULL, NULL, scratch, R, out, q, k, v, lse, B, T, H, KV,
                                  D, 0);
    tr_cpu_attention_gqa_backward(NULL, only_k, NULL, scratch, R, out, q, k, v, lse, B, T, H, KV,
                                  D, 0);
    tr_cpu_attention_gqa_backward(NULL, NULL, only_v, scratch, R, out, q, k, v, lse, B, T, H, KV,
                                  D, 0);
    tr_cpu_attention_gqa_backward(NULL, NULL, NULL, scratch, R, out, q, k, v, lse, B, T, H, KV,
                                  D, 0);
    expect_bitwise("gqa dq alone", only_q, dq, n_q);
    expect_bitwise("gqa dk alone", only_k, dk, n_kv);
    expect_bitwise("gqa dv alone", only_v, dv, n_kv);

    free(q), free(k), free(v), free(R), free(ctx.q), free(ctx.k), free(ctx.v), free(Rd);
    free(want), free(out), free(lse), free(scratch), free(dq), free(dk), free(dv);
    free(pre_q), free(acc_q), free(pre_k), free(acc_k), free(pre_v), free(acc_v);
    free(only_q), free(only_k), free(only_v);
}

Test(attention_gqa, forward_backward_vs_repeated_kv)
{
    rng_t rng = {911};
    /* B, T, H, KV, D: T = 1; H/KV = 1, 2, 3, 4 and KV = 1 (multi-query); odd D
     * and D not a multiple of 16; T past one block (64) and past two */
    const int shapes[][5] = {{1, 1, 2, 1, 8},  {2, 1, 4, 4, 6},  {2, 5, 4, 2, 6},
                             {1, 9, 4, 1, 16}, {2, 7, 3, 3, 5},  {1, 6, 6, 2, 12},
                             {2, 4, 8, 2, 20}, {1, 67, 4, 2, 4}, {1, 150, 2, 1, 6}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        check_gqa(&rng, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4]);
}

/* With KV = H and the same numbers, the three-input form is the packed form,
 * to the bit, forward and backward (one implementation serves both). */
Test(attention_gqa, kv_equal_heads_is_packed_bitwise)
{
    rng_t rng = {912};
    const int shapes[][4] = {{1, 1, 8, 2}, {2, 9, 12, 3}, {1, 70, 16, 4}, {2, 130, 20, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
        size_t n_qkv = (size_t)B * T * 3 * C, n = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
        float *qkv = random_fvec(&rng, n_qkv, -1.5, 1.5), *R = random_fvec(&rng, n, -1, 1);
        float *q = fvec(n), *k = fvec(n), *v = fvec(n);
        for (size_t r = 0; r < (size_t)B * T; r++) {
            memcpy(q + r * C, qkv + r * 3 * C, C * sizeof(float));
            memcpy(k + r * C, qkv + r * 3 * C + C, C * sizeof(float));
            memcpy(v + r * C, qkv + r * 3 * C + 2 * C, C * sizeof(float));
        }
        float *out_p = fvec(n), *lse_p = fvec(n_lse), *out_g = fvec(n), *lse_g = fvec(n_lse);
        tr_cpu_attention_forward(out_p, lse_p, qkv, B, T, C, NH);
        tr_cpu_attention_gqa_forward(out_g, lse_g, q, k, v, B, T, NH, NH, C / NH);
        expect_bitwise("gqa out vs packed", out_g, out_p, n);
        expect_bitwise("gqa lse vs packed", lse_g, lse_p, n_lse);

        float *scratch = fvec(tr_cpu_attention_scratch_floats(B, T, C, NH));
        float *dqkv = fvec(n_qkv), *dq = fvec(n), *dk = fvec(n), *dv = fvec(n);
        tr_cpu_attention_backward(dqkv, scratch, R, out_p, qkv, lse_p, B, T, C, NH, 0);
        tr_cpu_attention_gqa_backward(dq, dk, dv, scratch, R, out_g, q, k, v, lse_g, B, T, NH, NH,
                                      C / NH, 0);
        for (size_t r = 0; r < (size_t)B * T; r++) {
            expect_bitwise("gqa dq vs packed", dq + r * C, dqkv + r * 3 * C, C);
            expect_bitwise("gqa dk vs packed", dk + r * C, dqkv + r * 3 * C + C, C);
            expect_bitwise("gqa dv vs packed", dv + r * C, dqkv + r * 3 * C + 2 * C, C);
        }
        free(qkv), free(R), free(q), free(k), free(v), free(out_p), free(lse_p), free(out_g);
        free(lse_g), free(scratch), free(dqkv), free(dq), free(dk), free(dv);
    }
}

/* A quarter as many (batch, kv head) pairs as threads: backward splits into dq by
 * query block and dk, dv by key block.  It must give the one-thread bits,
 * for every subset of wanted gradients, in both input forms. */
Test(attention_gqa, split_backward_same_bits)
{
    rng_t rng = {914};
    /* B, T, H, KV, D: one sequence, one or two kv heads, T past two blocks */
    const int shapes[][5] = {{1, 150, 4, 1, 8}, {1, 130, 6, 2, 5}, {1, 65, 2, 2, 16}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], H = shapes[s][2], KV = shapes[s][3];
        int D = shapes[s][4];
        size_t n_q = (size_t)B * T * H * D, n_kv = (size_t)B * T * KV * D;
        float *q = random_fvec(&rng, n_q, -1.5, 1.5), *k = random_fvec(&rng, n_kv, -1.5, 1.5);
        float *v = random_fvec(&rng, n_kv, -1.5, 1.5), *R = random_fvec(&rng, n_q, -1, 1);
        float *out = fvec(n_q), *lse = fvec((size_t)B * H * T);
        float *scratch = fvec(tr_cpu_attention_gqa_scratch_floats(B, T, H, KV, D));
        tr_cpu_attention_gqa_forward(out, lse, q, k, v, B, T, H, KV, D);
        for (int want = 1; want < 8; want++) { /* bits: dq, dk, dv */
            float *g[2][3];
            for (int run = 0; run < 2; run++) {
                omp_set_num_threads(run == 0 ? 1 : 8);
                g[run][0] = want & 1 ? fvec(n_q) : NULL;
                g[run][1] = want & 2 ? fvec(n_kv) : NULL;
                g[run][2] = want & 4 ? fvec(n_kv) : NULL;
                tr_cpu_attention_gqa_backward(g[run][0], g[run][1], g[run][2], scratch, R, out, q,
                                              k, v, lse, B, T, H, KV, D, 0);
            }
            const char *names[3] = {"split dq", "split dk", "split dv"};
            for (int i = 0; i < 3; i++) {
                if (g[0][i] != NULL)
                    expect_bitwise(names[i], g[1][i], g[0][i], i == 0 ? n_q : n_kv);
                free(g[0][i]), free(g[1][i]);
            }
        }
        /* the packed form, one sequence and H = KV */
        if (H == KV) {
            int C = H * D;
            float *qkv = random_fvec(&rng, 3 * n_q, -1.5, 1.5), *dqkv[2];
            tr_cpu_attention_forward(out, lse, qkv, B, T, C, H);
            for (int run = 0; run < 2; run++) {
                omp_set_num_threads(run == 0 ? 1 : 8);
                dqkv[run] = fvec(3 * n_q);
                tr_cpu_attention_backward(dqkv[run], scratch, R, out, qkv, lse, B, T, C, H, 0);
            }
            expect_bitwise("split packed dqkv", dqkv[1], dqkv[0], 3 * n_q);
            free(qkv), free(dqkv[0]), free(dqkv[1]);
        }
        free(q), free(k), free(v), free(R), free(out), free(lse), free(scratch);
    }
}

/* Query heads that share a key/value head see the same keys: with their
 * queries equal, their outputs are equal, and dk, dv are the sum of what
 * each alone would give (checked against KV = H with the kv heads repeated). */
Test(attention_gqa, grouped_equals_repeated_heads)
{
    rng_t rng = {913};
    enum { B = 2, T = 70, H = 4, KV = 2, D = 8 };
    size_t n_q = (size_t)B * T * H * D, n_kv = (size_t)B * T * KV * D;
    float *q = random_fvec(&rng, n_q, -1.5, 1.5), *k = random_fvec(&rng, n_kv, -1.5, 1.5);
    float *v = random_fvec(&rng, n_kv, -1.5, 1.5), *R = random_fvec(&rng, n_q, -1, 1);
    float *kr = fvec(n_q), *vr = fvec(n_q);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int h = 0; h < H; h++) {
            memcpy(kr + (r * H + h) * D, k + (r * KV + h / (H / KV)) * D, D * sizeof(float));
            memcpy(vr + (r * H + h) * D, v + (r * KV + h / (H / KV)) * D, D * sizeof(float));
        }
    float *out_g = fvec(n_q), *out_r = fvec(n_q);
    float *lse_g = fvec(B * H * T), *lse_r = fvec(B * H * T);
    tr_cpu_attention_gqa_forward(out_g, lse_g, q, k, v, B, T, H, KV, D);
    tr_cpu_attention_gqa_forward(out_r, lse_r, q, kr, vr, B, T, H, H, D);
    expect_bitwise("grouped out vs repeated", out_g, out_r, n_q);
    expect_bitwise("grouped lse vs repeated", lse_g, lse_r, (size_t)B * H * T);

    float *scratch = fvec(tr_cpu_attention_gqa_scratch_floats(B, T, H, KV, D));
    float *dq_g = fvec(n_q), *dk_g = fvec(n_kv), *dv_g = fvec(n_kv);
    float *dq_r = fvec(n_q), *dk_r = fvec(n_q), *dv_r = fvec(n_q);
    tr_cpu_attention_gqa_backward(dq_g, dk_g, dv_g, scratch, R, out_g, q, k, v, lse_g, B, T, H,
                                  KV, D, 0);
    tr_cpu_attention_gqa_backward(dq_r, dk_r, dv_r, scratch, R, out_r, q, kr, vr, lse_r, B, T, H,
                                  H, D, 0);
    expect_bitwise("grouped dq vs repeated", dq_g, dq_r, n_q);
    double *dk_sum = dvec(n_kv), *dv_sum = dvec(n_kv);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                dk_sum[(r * KV + h / (H / KV)) * D + d] += dk_r[(r * H + h) * D + d];
                dv_sum[(r * KV + h / (H / KV)) * D + d] += dv_r[(r * H + h) * D + d];
            }
    expect_close("grouped dk = sum over the group", dk_g, dk_sum, n_kv, 1e-6);
    expect_close("grouped dv = sum over the group", dv_g, dv_sum, n_kv, 1e-6);
    free(q), free(k), free(v), free(R), free(kr), free(vr), free(out_g), free(out_r);
    free(lse_g), free(lse_r), free(scratch), free(dq_g), free(dk_g), free(dv_g), free(dq_r);
    free(dk_r), free(dv_r), free(dk_sum), free(dv_sum);
}

/* ---- attention under native bf16 ------------------------------------------ */

/* The bf16 form reads q, k, v as bf16 bits and multiplies in bf16 (P, dS and
 * dout rounded for the products, fp32 sums): against fp32 attention on the
 * same bf16-rounded inputs within what those roundings allow, every wanted
 * gradient, for the packed and the grouped form; the same bits for 1, 2, 3
 * and 8 threads (8 takes the split backward for one sequence), and the
 * grouped form with KV = H gives the packed form's bits. */
static void check_attention_bf16(rng_t *rng, int B, int T, int H, int KV, int D)
{
    size_t n_q = (size_t)B * T * H * D, n_kv = (size_t)B * T * KV * D, n_lse = (size_t)B * H * T;
    float *q = random_fvec(rng, n_q, -1.5, 1.5), *k = random_fvec(rng, n_kv, -1.5, 1.5);
    float *v = random_fvec(rng, n_kv, -1.5, 1.5), *R = random_fvec(rng, n_q, -1, 1);
    float *qr = bf16_rounded_vec(q, n_q), *kr = bf16_rounded_vec(k, n_kv);
    float *vr = bf16_rounded_vec(v, n_kv);
    uint16_t *q16 = to_bf16_vec(q, n_q), *k16 = to_bf16_vec(k, n_kv), *v16 = to_bf16_vec(v, n_kv);
    /* fp32 on the rounded numbers */
    float *want = fvec(n_q), *want_lse = fvec(n_lse);
    float *scratch = fvec(tr_cpu_attention_gqa_bf16_scratch_floats(B, T, H, KV, D) +
                          tr_cpu_attention_gqa_scratch_floats(B, T, H, KV, D));
    float *wdq = fvec(n_q), *wdk = fvec(n_kv), *wdv = fvec(n_kv);
    tr_cpu_attention_gqa_forward(want, want_lse, qr, kr, vr, B, T, H, KV, D);
    tr_cpu_attention_gqa_backward(wdq, wdk, wdv, scratch, R, want, qr, kr, vr, want_lse, B, T, H,
                                  KV, D, 0);
    int saved = omp_get_max_threads();
    const int threads[] = {1, 2, 3, 8};
    float *out[4], *lse[4], *dq[4], *dk[4], *dv[4];
    for (int t = 0; t < 4; t++) {
        omp_set_num_threads(threads[t]);
        out[t] = fvec(n_q), lse[t] = fvec(n_lse), dq[t] = fvec(n_q), dk[t] = fvec(n_kv);
        dv[t] = fvec(n_kv);
        tr_cpu_attention_gqa_forward_bf16(out[t], lse[t], q16, k16, v16, B, T, H, KV, D);
        tr_cpu_attention_gqa_backward_bf16(dq[t], dk[t], dv[t], scratch, R, out[t], q16, k16, v16,
                                           lse[t], B, T, H, KV, D, 0);
    }
    omp_set_num_threads(saved);
    /* P rounded to 8 bits before it meets v: out and lse to about 1e-2 of
     * their scale, the gradients (dS and dout rounded too) to 2e-2 */
    expect_close_ff("bf16 attention out vs fp32", out[0], want, n_q, 1e-2);
    expect_close_ff("bf16 attention lse vs fp32", lse[0], want_lse, n_lse, 1e-2);
    expect_close_ff("bf16 attention dq vs fp32", dq[0], wdq, n_q, 2e-2);
    expect_close_ff("bf16 attention dk vs fp32", dk[0], wdk, n_kv, 2e-2);
    expect_close_ff("bf16 attention dv vs fp32", dv[0], wdv, n_kv, 2e-2);
    for (int t = 1; t < 4; t++) {
        expect_bitwise("bf16 attention out, threads", out[t], out[0], n_q);
        expect_bitwise("bf16 attention lse, threads", lse[t], lse[0], n_lse);
        expect_bitwise("bf16 attention dq, threads", dq[t], dq[0], n_q);
        expect_bitwise("bf16 attention dk, threads", dk[t], dk[0], n_kv);
        expect_bitwise("bf16 attention dv, threads", dv[t], dv[0], n_kv);
    }
    /* the packed form on the same numbers, where KV = H */
    if (KV == H) {
        int C = H * D;
        size_t rows = (size_t)B * T;
        uint16_t *qkv = malloc(3 * n_q * sizeof *qkv);
        cr_assert(qkv != NULL, "out of memory");
        for (size_t r = 0; r < rows; r++) {
            memcpy(qkv + r * 3 * C, q16 + r * C, C * sizeof *qkv);
            memcpy(qkv + r * 3 * C + C, k16 + r * C, C * sizeof *qkv);
            memcpy(qkv + r * 3 * C + 2 * C, v16 + r * C, C * sizeof *qkv);
        }
        float *po = fvec(n_q), *plse = fvec(n_lse), *dqkv = fvec(3 * n_q);
        float *pscratch = fvec(tr_cpu_attention_bf16_scratch_floats(B, T, C, H));
        tr_cpu_attention_forward_bf16(po, plse, qkv, B, T, C, H);
        tr_cpu_attention_backward_bf16(dqkv, pscratch, R, po, qkv, plse, B, T, C, H, 0);
        expect_bitwise("bf16 packed out vs grouped", po, out[0], n_q);
        expect_bitwise("bf16 packed lse vs grouped", plse, lse[0], n_lse);
        for (size_t r = 0; r < rows; r++) {
            expect_bitwise("bf16 packed dq vs grouped", dqkv + r * 3 * C, dq[0] + r * C, C);
            expect_bitwise("bf16 packed dk vs grouped", dqkv + r * 3 * C + C, dk[0] + r * C, C);
            expect_bitwise("bf16 packed dv vs grouped", dqkv + r * 3 * C + 2 * C, dv[0] + r * C, C);
        }
        free(qkv), free(po), free(plse), free(dqkv), free(pscratch);
    }
    for (int t = 0; t < 4; t++)
        free(out[t]), free(lse[t]), free(dq[t]), free(dk[t]), free(dv[t]);
    free(q), free(k), free(v), free(R), free(qr), free(kr), free(vr), free(q16), free(k16);
    free(v16), free(want), free(want_lse), free(scratch), free(wdq), free(wdk), free(wdv);
}

Test(attention_bf16, vs_fp32_on_rounded_inputs_any_thread_count)
{
    need_gemm_bf16();
    rng_t rng = {915};
    /* B, T, H, KV, D: one row, one block, past one and two blocks; grouped
     * and multi-query; D odd and not a multiple of 16 */
    const int shapes[][5] = {{1, 1, 2, 2, 8},   {2, 9, 4, 4, 6},   {2, 70, 3, 3, 16},
                             {1, 150, 4, 1, 8}, {1, 130, 6, 2, 5}, {2, 64, 4, 2, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        check_attention_bf16(&rng, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                             shapes[s][4]);
}

/* ======================================================================== */
/* cross-entropy and softmax                                                 */
/* ======================================================================== */

#define IGNORE_INDEX (-100)

typedef struct {
    double *logits;
    const int32_t *targets;
    int N, V;
} xent_ctx;

/* out[0] = mean over counted rows of lse - logit[target] */
static void ref_cross_entropy(const void *vctx, double *out)
{
    const xent_ctx *c = vctx;
    double total = 0.0;
    int valid = 0;
    for (int n = 0; n < c->N; n++) {
        if (c->targets[n] == IGNORE_INDEX)
            continue;
        const double *x = c->logits + (size_t)n * c->V;
        double max = x[0], sum = 0.0;
        for (int i = 1; i < c->V; i++)
            max = fmax(max, x[i]);
        for (int i = 0; i < c->V; i++)
            sum += exp(x[i] - max);
        total += max + log(sum) - x[c->targets[n]];
        valid++;
    }
    out[0] = valid ? total / valid : 0.0;
}

Test(cross_entropy, forward_backward_ignore_index)
{
    rng_t rng = {1001};
    /* 2500 classes: the kernels' chunks of 1024 and a tail */
    const int shapes[][2] = {{1, 2}, {4, 5}, {9, 17}, {24, 40}, {13, 100}, {3, 2500}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], V = shapes[s][1];
        size_t n_logits = (size_t)N * V;
        int32_t *targets = malloc((size_t)N * sizeof(int32_t));
        int expected_valid = 0;
        for (int n = 0; n < N; n++) {
            /* about a quarter ignored, but never the first row */
            targets[n] = n > 0 && rng_int(&rng, 0, 3) == 0 ? IGNORE_INDEX : rng_int(&rng, 0, V - 1);
            expected_valid += targets[n] != IGNORE_INDEX;
        }
        float *logits = random_fvec(&rng, n_logits, -4, 4);
        xent_ctx ctx = {to_double(logits, n_logits), targets, N, V};
        float loss = NAN;
        float *lse = fvec(N);
        int n_valid = tr_cpu_cross_entropy_forward(&loss, lse, logits, targets, N, V, IGNORE_INDEX);
        cr_assert(n_valid == expected_valid, "n_valid %d, want %d", n_valid, expected_valid);
        double want_loss;
        ref_cross_entropy(&ctx, &want_loss);
        expect_close("cross-entropy loss", &loss, &want_loss, 1, FWD_TOL);
        for (int n = 0; n < N; n++) {
            if (targets[n] == IGNORE_INDEX)
                continue;
            double max = -INFINITY, sum = 0.0;
            for (int i = 0; i < V; i++)
                max = fmax(max, ctx.logits[n * V + i]);
            for (int i = 0; i < V; i++)
                sum += exp(ctx.logits[n * V + i] - max);
            double want_lse = max + log(sum);
            expect_close("cross-entropy lse", &lse[n], &want_lse, 1, FWD_TOL);
        }

        double dloss = rng_uniform(&rng, 0.5, 2.0);
        float *dlogits = fvec(n_logits);
        tr_cpu_cross_entropy_backward(dlogits, logits, lse, targets, (float)dloss, N, V,
                                      IGNORE_INDEX, 0);
        check_gradient("cross-entropy dlogits", dlogits, ref_cross_entropy, &ctx, ctx.logits,
                       n_logits, &dloss, 1);
        for (int n = 0; n < N; n++)
            if (targets[n] == IGNORE_INDEX)
                for (int i = 0; i < V; i++)
                    cr_assert(dlogits[n * V + i] == 0.0f, "ignored row got a gradient");

        float *pre = random_fvec(&rng, n_logits, -1, 1), *acc = copy_fvec(pre, n_logits);
        tr_cpu_cross_entropy_backward(acc, logits, lse, targets, (float)dloss, N, V,
                                      IGNORE_INDEX, 0);
        expect_accumulated("cross-entropy dlogits accumulates", acc, pre, dlogits, n_logits);

        free(targets), free(logits), free(ctx.logits), free(lse), free(dlogits), free(pre);
        free(acc);
    }
}

Test(cross_entropy, all_rows_ignored)
{
    int N = 3, V = 4;
    int32_t targets[3] = {IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX};
    float logits[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, lse[3], loss = NAN;
    int n_valid = tr_cpu_cross_entropy_forward(&loss, lse, logits, targets, N, V, IGNORE_INDEX);
    cr_assert(n_valid == 0 && loss == 0.0f, "no counted rows: n_valid 0, loss 0");
    float dlogits[12] = {0};
    tr_cpu_cross_entropy_backward(dlogits, logits, lse, targets, 1.0f, N, V, IGNORE_INDEX, 0);
    for (int i = 0; i < N * V; i++)
        cr_assert(dlogits[i] == 0.0f, "no counted rows: no gradient");
}

Test(softmax, temperature)
{
    rng_t rng = {1101};
    const int sizes[] = {1, 2, 10, 50, 1000};
    const float temperatures[] = {0.25f, 1.0f, 2.5f};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t k = 0; k < sizeof temperatures / sizeof temperatures[0]; k++) {
            int n = sizes[s];
            float temperature = temperatures[k];
            float *logits = random_fvec(&rng, n, -5, 5), *out = fvec(n);
            double *want = dvec(n), max = -INFINITY, sum = 0.0;
            for (int i = 0; i < n; i++)
                max = fmax(max, (double)logits[i] / temperature);
            for (int i = 0; i < n; i++)
                sum += want[i] = exp((double)logits[i] / temperature - max);
            for (int i = 0; i < n; i++)
                want[i] /= sum;
            tr_cpu_softmax(out, logits, n, temperature);
            expect_close("softmax", out, want, n, FWD_TOL);
            free(logits), free(out), free(want);
        }
    /* temperature 0: greedy */
    float logits[4] = {0.5f, 3.0f, -1.0f, 3.0f}, out[4];
    tr_cpu_softmax(out, logits, 4, 0.0f);
    cr_assert(out[0] == 0.0f && out[1] == 1.0f && out[2] == 0.0f && out[3] == 0.0f,
              "temperature 0 puts all mass on the first maximum");
}

/* ======================================================================== */
/* optimizers                                                                */
/* ======================================================================== */

Test(optim, adamw_three_steps)
{
    rng_t rng = {1201};
    const size_t n = 37;
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const float grad_scale = 0.5f;
    float *param = random_fvec(&rng, n, -1, 1), *m = fvec(n), *v = fvec(n);
    double *p_ref = to_double(param, n), *m_ref = dvec(n), *v_ref = dvec(n);
    for (int64_t t = 1; t <= 3; t++) {
        float *grad = random_fvec(&rng, n, -2, 2);
        tr_cpu_adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t);
        for (size_t i = 0; i < n; i++) {
            double g = (double)grad[i] * grad_scale;
            m_ref[i] = beta1 * m_ref[i] + (1.0 - beta1) * g;
            v_ref[i] = beta2 * v_ref[i] + (1.0 - beta2) * g * g;
            double m_hat = m_ref[i] / (1.0 - pow(beta1, (double)t));
            double v_hat = v_ref[i] / (1.0 - pow(beta2, (double)t));
            p_ref[i] -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p_ref[i]);
        }
        expect_close("adamw param", param, p_ref, n, FWD_TOL);
        expect_close("adamw m", m, m_ref, n, FWD_TOL);
        expect_close("adamw v", v, v_ref, n, FWD_TOL);
        free(grad);
    }
    free(param), free(m), free(v), free(p_ref), free(m_ref), free(v_ref);
}

/* The vectorised update covers whole blocks, a block's last part-vector
 * and the split over threads, on every path this CPU runs (portable, AVX2,
 * AVX-512): the parameters and moments come out bit for bit the same for 1
 * and 2 threads (and close to the double reference above), the bf16 copy
 * written in the same pass is tr_f32_to_bf16 of each updated parameter, and
 * the AVX-512 path gives the AVX2 path's bits. */
static void adamw_on_path(int path, size_t n, float *param[2], float *m[2], float *v[2])
{
    rng_t rng = {1211};
    param[0] = random_fvec(&rng, n, -1, 1), param[1] = copy_fvec(param[0], n);
    m[0] = fvec(n), v[0] = fvec(n), m[1] = fvec(n), v[1] = fvec(n);
    uint16_t *h = calloc(n, sizeof *h);
    double *p_ref = to_double(param[0], n), *m_ref = dvec(n), *v_ref = dvec(n);
    int threads = omp_get_max_threads(), cap = tr_cpu_elementwise_cap(path);
    cr_assert_eq(tr_cpu_elementwise_path(), path);
    for (int64_t t = 1; t <= 2; t++) {
        float *grad = random_fvec(&rng, n, -2, 2);
        omp_set_num_threads(1);
        tr_cpu_adamw_update(param[0], grad, m[0], v[0], n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                            t);
        omp_set_num_threads(2);
        tr_cpu_adamw_update_bf16(param[1], h, grad, m[1], v[1], n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                                 0.1f, 0.5f, t);
        for (size_t i = 0; i < n; i++) {
            double g = (double)grad[i] * 0.5;
            m_ref[i] = 0.9 * m_ref[i] + 0.1 * g;
            v_ref[i] = 0.95 * v_ref[i] + 0.05 * g * g;
            double m_hat = m_ref[i] / (1.0 - pow(0.9, (double)t));
            double v_hat = v_ref[i] / (1.0 - pow(0.95, (double)t));
            p_ref[i] -= 1e-2 * (m_hat / (sqrt(v_hat) + 1e-8) + 0.1 * p_ref[i]);
        }
        cr_assert(memcmp(param[0], param[1], n * sizeof(float)) == 0,
                  "path %d: params differ between 1 and 2 threads", path);
        cr_assert(memcmp(m[0], m[1], n * sizeof(float)) == 0 &&
                      memcmp(v[0], v[1], n * sizeof(float)) == 0,
                  "path %d: moments differ between 1 and 2 threads", path);
        expect_close("adamw param", param[0], p_ref, n, FWD_TOL);
        expect_close("adamw m", m[0], m_ref, n, FWD_TOL);
        expect_close("adamw v", v[0], v_ref, n, FWD_TOL);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(h[i], tr_f32_to_bf16(param[1][i]), "path %d: bf16 copy [%zu]", path, i);
        free(grad);
    }
    omp_set_num_threads(threads);
    tr_cpu_elementwise_cap(cap);
    free(param[1]), free(m[1]), free(v[1]), free(h), free(p_ref), free(m_ref), free(v_ref);
}

Test(optim, adamw_blocks_threads_paths_and_bf16_copy)
{
    const size_t n = 2 * 16384 + 37;
    int widest = tr_cpu_elementwise_path();
    float *param[TR_CPU_EW_AVX512 + 1][2], *m[TR_CPU_EW_AVX512 + 1][2], *v[TR_CPU_EW_AVX512 + 1][2];
    for (int path = TR_CPU_EW_PORTABLE; path <= widest; path++)
        adamw_on_path(path, n, param[path], m[path], v[path]);
    if (widest == TR_CPU_EW_AVX512) {
        enum { A2 = TR_CPU_EW_AVX2, A5 = TR_CPU_EW_AVX512 };
        expect_bitwise("AdamW param, AVX-512 vs AVX2", param[A5][0], param[A2][0], n);
        expect_bitwise("AdamW m, AVX-512 vs AVX2", m[A5][0], m[A2][0], n);
        expect_bitwise("AdamW v, AVX-512 vs AVX2", v[A5][0], v[A2][0], n);
    }
    for (int path = TR_CPU_EW_PORTABLE; path <= widest; path++)
        free(param[path][0]), free(m[path][0]), free(v[path][0]);
}

/* The parameters' bf16 copy (param16.c) follows every write the backend
 * reports: it starts as the parameters converted; a reported write (an
 * upload) is seen at the next read; an optimizer burst that refreshed only
 * a shard of the buffer (a sharded optimizer, the other shards gathered
 * straight into memory) has the rest converted at the next read; freeing
 * the buffer drops the copy.  Without the tracking, each check reads stale
 * bits. */
static void expect_param16(const struct tr_graph *g, const struct tr_tensor *t, const char *when)
{
    const uint16_t *h = tr_cpu_param16(g, t);
    cr_assert_not_null(h, "%s: no bf16 copy of a parameter in the buffer", when);
    const float *x = t->data;
    for (size_t i = 0; i < t->numel; i++)
        cr_assert_eq(h[i], tr_f32_to_bf16(x[i]), "%s: [%zu] is 0x%04x, want 0x%04x", when, i,
                     h[i], tr_f32_to_bf16(x[i]));
}

Test(param16, follows_every_reported_write)
{
    rng_t rng = {1221};
    const size_t n = 1000;
    float *params = NULL;
    cr_assert(posix_memalign((void **)&params, 64, n * sizeof(float)) == 0);
    float *init = random_fvec(&rng, n, -1, 1);
    memcpy(params, init, n * sizeof(float));
    struct tr_graph g;
    memset(&g, 0, sizeof g);
    g.params = params;
    g.n_params = n;
    struct tr_tensor whole = {.role = TR_ROLE_PARAM, .dtype = TR_F32, .data = params, .numel = n};
    struct tr_tensor part = whole;
    part.data = params + 600;
    part.numel = 400;
    expect_param16(&g, &part, "first read");
    expect_param16(&g, &whole, "first read, whole buffer");

    /* a reported write anywhere in the buffer */
    params[3] = 1234.5f;
    tr_cpu_param16_written(params + 3, sizeof(float));
    expect_param16(&g, &whole, "after an upload");

    /* the optimizer updates [0, 500) and writes that run's copy; [500, n)
     * then changes behind the backend's back, as a gather would write it */
    uint16_t *run = tr_cpu_param16_updated(params, 500);
    cr_assert_not_null(run, "no place for the optimizer's bf16 copy");
    for (size_t i = 0; i < 500; i++) {
        params[i] *= -0.5f;
        run[i] = tr_f32_to_bf16(params[i]);
    }
    for (size_t i = 500; i < n; i++)
        params[i] += 1.0f;
    expect_param16(&g, &part, "after a sharded optimizer step");
    expect_param16(&g, &whole, "after a sharded optimizer step, whole buffer");

    /* not a parameter of this buffer: the caller converts it itself */
    struct tr_tensor act = whole;
    act.role = TR_ROLE_ACTIVATION;
    cr_assert_null(tr_cpu_param16(&g, &act));
    struct tr_tensor outside = whole;
    outside.data = init;
    cr_assert_null(tr_cpu_param16(&g, &outside));

    /* freed and allocated again at the same address: a fresh copy */
    tr_cpu_param16_forget(params);
    for (size_t i = 0; i < n; i++)
        params[i] = (float)i;
    expect_param16(&g, &whole, "after the buffer was freed and reused");
    tr_cpu_param16_forget(params);
    free(params);
    free(init);
}

/* What the core discards (backend.h's discard) is listed until it is
 * committed, zeroed or uploaded into again (backend.c), and the bf16 copy
 * of the parameters converts around it: a pipeline stage's other stages'
 * parameters are neither read nor mirrored.  Under
 * TRAINRUN_CPU_DISCARD=strict the discarded pages fault until committed,
 * so a mirror reading them would end this test with SIGSEGV. */
Test(discard, listed_until_committed_and_mirror_skips_it)
{
    setenv("TRAINRUN_CPU_DISCARD", "strict", 1);
    struct tr_backend be;
    cr_assert(tr_cpu_backend_init(&be, 1) == 0);
    unsetenv("TRAINRUN_CPU_DISCARD");
    cr_assert_not_null(be.iface->commit, "strict mode has no commit slot");
    const size_t n = (size_t)1 << 20; /* 4 MiB: whole pages to give back */
    float *params = be.iface->alloc(be.context, n * sizeof(float));
    cr_assert_not_null(params);
    float *host = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        host[i] = (float)(i % 1000) * 0.001f - 0.5f;
    be.iface->upload(be.context, params, host, n * sizeof(float));

    /* two adjacent runs merge; committing a middle part splits them */
    const size_t a = 100000, b = 300000, c = 500000; /* floats */
    be.iface->discard(be.context, params + a, (b - a) * sizeof(float));
    be.iface->discard(be.context, params + b, (c - b) * sizeof(float));
    size_t from, to;
    cr_assert(tr_cpu_discarded_within(params, n * sizeof(float), &from, &to));
    cr_assert_eq(from, a * sizeof(float));
    cr_assert_eq(to, c * sizeof(float), "adjacent discarded runs not merged: ends at %zu", to);
    cr_assert(!tr_cpu_discarded_within(params, a * sizeof(float), &from, &to));
    /* discarding inside what was discarded is allowed (a pipeline stage
     * gives back other stages' gradients after a trial step gave all) */
    be.iface->discard(be.context, params + a + 999, (c - a - 2001) * sizeof(float));
    cr_assert(tr_cpu_discarded_within(params, n * sizeof(float), &from, &to));
    cr_assert_eq(from, a * sizeof(float));
    cr_assert_eq(to, c * sizeof(float));

    /* the mirror converts around the hole (strict: reading it faults) */
    struct tr_graph g;
    memset(&g, 0, sizeof g);
    g.params = params;
    g.n_params = n;
    struct tr_tensor head = {.role = TR_ROLE_PARAM, .dtype = TR_F32, .data = params, .numel = a};
    struct tr_tensor tail = head;
    tail.data = params + c;
    tail.numel = n - c;
    expect_param16(&g, &head, "before the discarded run");
    expect_param16(&g, &tail, "after the discarded run");

    /* committed: [a, c) reads as zeros, then is written again and seen */
    const size_t m0 = 200000, m1 = 250000;
    be.iface->commit(be.context, params + m0, (m1 - m0) * sizeof(float));
    cr_assert(tr_cpu_discarded_within(params + a, (m0 - a) * sizeof(float), &from, &to));
    cr_assert(!tr_cpu_discarded_within(params + m0, (m1 - m0) * sizeof(float), &from, &to),
              "a committed run is still listed as discarded");
    cr_assert(tr_cpu_discarded_within(params + m1, (c - m1) * sizeof(float), &from, &to));
    be.iface->commit(be.context, params + a, (c - a) * sizeof(float));
    cr_assert(!tr_cpu_discarded_within(params, n * sizeof(float), &from, &to));
    for (size_t i = a; i < c; i++)
        cr_assert_eq(params[i], 0.0f, "discarded float %zu reads %g after commit", i, params[i]);
    be.iface->upload(be.context, params + a, host + a, (c - a) * sizeof(float));
    struct tr_tensor whole = head;
    whole.numel = n;
    expect_param16(&g, &whole, "after the discarded run was written again");

    be.iface->free(be.context, params);
    tr_cpu_backend_free(&be);
    free(host);
}

/* Strict mode's point: a touch of discarded memory without a commit faults
 * (as the cuda backend's unmapped chunks do), so the e2e runs that set it
 * catch a core that forgot one. */
#if defined(__SANITIZE_ADDRESS__)
/* the sanitizer job counts every report, this deliberate fault's too: the
 * plain build runs it */
Test(discard, strict_touch_without_commit_faults)
{
    cr_skip_test("under AddressSanitizer the deliberate fault is a report");
}
#else
Test(discard, strict_touch_without_commit_faults, .signal = SIGSEGV)
{
    setenv("TRAINRUN_CPU_DISCARD", "strict", 1);
    struct tr_backend be;
    cr_assert(tr_cpu_backend_init(&be, 1) == 0);
    const size_t n = (size_t)1 << 20;
    float *buf = be.iface->alloc(be.context, n * sizeof(float));
    cr_assert_not_null(buf);
    be.iface->zero(be.context, buf, n * sizeof(float));
    be.iface->discard(be.context, buf, n * sizeof(float));
    volatile float *p = buf + n / 2;
    *p = 1.0f;
}
#endif

/* The transposed copies of frozen fp32 weights (frozen_t.c): a linear
 * forward that reads one gives tr_cpu_linear_forward's bits for any thread
 * count; the copy follows a reported write (a base loaded again), is made
 * only where the GEMM would transpose the weight itself, only for frozen
 * weights in the graph's frozen buffer, and is dropped with the buffer. */
static void expect_frozen_t(const struct tr_graph *g, const struct tr_tensor *w, int M,
                            const char *when)
{
    int ld = 0;
    const float *t = tr_cpu_frozen_t(g, w, M, &ld);
    cr_assert_not_null(t, "%s: no transposed copy", when);
    int OC = (int)w->shape[0], IC = (int)w->shape[1];
    cr_assert_eq(ld, tr_cpu_sgemm_plain_b_ld(OC), "%s: ld %d", when, ld);
    const float *x = w->data;
    for (int k = 0; k < IC; k++)
        for (int n = 0; n < OC; n++)
            cr_assert_eq(t[(size_t)k * ld + n], x[(size_t)n * IC + k], "%s: [%d][%d]", when, k, n);
}

Test(frozen_t, same_bits_as_the_forward_and_follows_writes)
{
    enum { M = 1024, IC = 80, OC = 96 };
    rng_t rng = {1717};
    float *frozen = NULL;
    size_t bytes = (size_t)(OC * IC + 64) * sizeof(float);
    cr_assert(posix_memalign((void **)&frozen, 64, bytes) == 0);
    float *init = random_fvec(&rng, OC * IC, -1, 1);
    float *wd = frozen + 64; /* not at the buffer's start */
    memcpy(wd, init, (size_t)OC * IC * sizeof(float));
    struct tr_tensor ts[3];
    memset(ts, 0, sizeof ts);
    ts[0] = (struct tr_tensor){.role = TR_ROLE_ACTIVATION, .dtype = TR_F32, .ndim = 2,
                               .shape = {M, IC}, .numel = (size_t)M * IC};
    ts[1] = (struct tr_tensor){.role = TR_ROLE_FROZEN, .dtype = TR_F32, .ndim = 2,
                               .shape = {OC, IC}, .numel = (size_t)OC * IC, .data = wd};
    ts[2] = (struct tr_tensor){.role = TR_ROLE_ACTIVATION, .dtype = TR_F32, .ndim = 2,
                               .shape = {M, OC}, .numel = (size_t)M * OC};
    struct tr_node nodes[2];
    memset(nodes, 0, sizeof nodes);
    nodes[0].op = nodes[1].op = TR_OP_LINEAR; /* two linears share the weight */
    nodes[0].in[0] = nodes[1].in[0] = 0, nodes[0].in[1] = nodes[1].in[1] = 1;
    nodes[0].n_in = nodes[1].n_in = 2, nodes[0].out = nodes[1].out = 2;
    struct tr_graph g;
    memset(&g, 0, sizeof g);
    g.tensors = ts, g.n_tensors = 3, g.nodes = nodes, g.n_nodes = 2;
    g.frozen = frozen, g.frozen_bytes = bytes;
    struct tr_tensor *w = &ts[1];

    if (!tr_cpu_sgemm_plain_b(M, OC, IC)) { /* no AVX-512: the GEMM reads W as stored */
        int ld;
        cr_assert_null(tr_cpu_frozen_t(&g, w, M, &ld));
        cr_assert_eq(tr_cpu_frozen_t_bytes(&g), 0);
        free(frozen), free(init);
        return;
    }
    cr_assert_eq(tr_cpu_frozen_t_bytes(&g),
                 (size_t)IC * tr_cpu_sgemm_plain_b_ld(OC) * sizeof(float), "counted once");
    expect_frozen_t(&g, w, M, "first read");

    /* the forward on the copy: the plain forward's bits, for 1, 2, 3 threads */
    float *x = random_fvec(&rng, (size_t)M * IC, -1, 1), *bias = random_fvec(&rng, OC, -1, 1);
    float *want = malloc((size_t)M * OC * sizeof(float)), *got = malloc((size_t)M * OC * sizeof(float));
    int saved = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        for (int b = 0; b < 2; b++) {
            const float *bb = b ? bias : NULL;
            int ld;
            const float *t = tr_cpu_frozen_t(&g, w, M, &ld);
            tr_cpu_linear_forward(want, x, wd, bb, M, IC, OC);
            tr_cpu_linear_forward_wt(got, x, t, ld, bb, M, IC, OC);
            cr_assert(memcmp(want, got, (size_t)M * OC * sizeof(float)) == 0,
                      "%d threads, bias %d: not the plain forward's bits", threads, b);
        }
    }
    omp_set_num_threads(saved);

    /* a reported write into the weight (another base loaded) is seen */
    wd[5] = 1234.5f;
    tr_cpu_frozen_t_written(wd + 5, sizeof(float));
    expect_frozen_t(&g, w, M, "after an upload");
    for (int i = 0; i < OC * IC; i++)
        wd[i] = -wd[i];
    tr_cpu_frozen_t_written(frozen, bytes);
    expect_frozen_t(&g, w, M, "after a whole-buffer upload");

    /* none where the GEMM would not transpose, nor for other tensors */
    int ld;
    cr_assert_null(tr_cpu_frozen_t(&g, w, 8, &ld), "a product too small to transpose");
    struct tr_tensor other = *w;
    other.role = TR_ROLE_PARAM;
    cr_assert_null(tr_cpu_frozen_t(&g, &other, M, &ld), "a trained weight");
    other = *w;
    other.data = init;
    cr_assert_null(tr_cpu_frozen_t(&g, &other, M, &ld), "outside the frozen buffer");
    other = *w;
    other.dtype = TR_BF16;
    cr_assert_null(tr_cpu_frozen_t(&g, &other, M, &ld), "a 16-bit base");

    /* freed and allocated again at the same address: a fresh copy */
    tr_cpu_frozen_t_forget(frozen);
    for (int i = 0; i < OC * IC; i++)
        wd[i] = (float)i;
    expect_frozen_t(&g, w, M, "after the buffer was freed and reused");
    tr_cpu_frozen_t_forget(frozen);
    free(frozen), free(init), free(x), free(bias), free(want), free(got);
}

/* The same through the CPU backend, as a LoRA step runs it: a linear node
 * whose weight is frozen, in a frozen buffer from the backend's alloc, gives
 * tr_cpu_linear_forward's bits; a new base uploaded through the backend is
 * what the next forward multiplies; the buffer freed and allocated again
 * holds no stale copy. */
Test(frozen_t, linear_node_follows_the_backend_writes)
{
    enum { M = 1024, IC = 64, OC = 48 };
    rng_t rng = {1718};
    struct tr_backend be;
    cr_assert(tr_cpu_backend_init(&be, 2) == 0);
    const struct tr_backend_iface *in = be.iface;
    float *x = random_fvec(&rng, (size_t)M * IC, -1, 1), *bias = random_fvec(&rng, OC, -1, 1);
    float *w1 = random_fvec(&rng, OC * IC, -1, 1), *w2 = random_fvec(&rng, OC * IC, -1, 1);
    float *out = fvec((size_t)M * OC), *want = fvec((size_t)M * OC);
    int64_t x_shape[2] = {M, IC}, w_shape[2] = {OC, IC}, b_shape[1] = {OC}, o_shape[2] = {M, OC};
    struct tr_tensor t[4];
    struct tr_node n = {.op = TR_OP_LINEAR, .in = {0, 1, 2}, .n_in = 3, .out = 3};
    struct tr_graph g;
    memset(&g, 0, sizeof g);
    g.tensors = t, g.n_tensors = 4, g.nodes = &n, g.n_nodes = 1;
    g.loss = -1, g.logits = -1, g.compute = TR_F32;
    for (int round = 0; round < 2; round++) {
        size_t bytes = (size_t)OC * IC * sizeof(float);
        g.frozen = in->alloc(be.context, bytes);
        g.frozen_bytes = bytes;
        cr_assert_not_null(g.frozen);
        tensor_init(&t[0], 2, x_shape, x, NULL);
        tensor_init(&t[1], 2, w_shape, g.frozen, NULL);
        t[1].role = TR_ROLE_FROZEN;
        tensor_init(&t[2], 1, b_shape, bias, NULL);
        tensor_init(&t[3], 2, o_shape, out, NULL);
        g.scratch_floats = in->scratch_floats(be.context, &g, &n);
        g.scratch = fvec(g.scratch_floats + 1);
        if (round == 0)
            cr_assert_eq(in->param_copy_bytes(be.context, &g),
                         tr_cpu_sgemm_plain_b(M, OC, IC)
                             ? (size_t)IC * tr_cpu_sgemm_plain_b_ld(OC) * sizeof(float)
                             : 0,
                         "the plan counts the copy where the forward reads one");
        for (int k = 0; k < 2; k++) { /* base w1, then w2 uploaded over it */
            const float *w = k ? w2 : w1;
            in->upload(be.context, g.frozen, w, bytes);
            in->forward(be.context, &g, &n);
            tr_cpu_linear_forward(want, x, w, bias, M, IC, OC);
            expect_bitwise(k ? "after another base was uploaded" : "the first base", out, want,
                           (size_t)M * OC);
        }
        free(g.scratch);
        in->free(be.context, g.frozen); /* round 1: a new buffer, maybe at the same address */
    }
    tr_cpu_backend_free(&be);
    free(x), free(bias), free(w1), free(w2), free(out), free(want);
}

Test(optim, sgd_momentum_three_steps)
{
    rng_t rng = {1301};
    const size_t n = 29;
    const float lr = 0.1f, momentum = 0.9f, wd = 0.01f, grad_scale = 0.5f;
    float *param = random_fvec(&rng, n, -1, 1), *buf = fvec(n);
    float *plain = copy_fvec(param, n);
    double *p_ref = to_double(param, n), *b_ref = dvec(n), *plain_ref = to_double(param, n);
    for (int step = 0; step < 3; step++) {
        float *grad = random_fvec(&rng, n, -2, 2);
        tr_cpu_sgd_update(param, grad, buf, n, lr, momentum, wd, grad_scale);
        tr_cpu_sgd_update(plain, grad, NULL, n, lr, 0.0f, wd, grad_scale);
        for (size_t i = 0; i < n; i++) {
            double g = (double)grad[i] * grad_scale + wd * p_ref[i];
            b_ref[i] = step == 0 ? g : momentum * b_ref[i] + g;
            p_ref[i] -= lr * b_ref[i];
            plain_ref[i] -= lr * ((double)grad[i] * grad_scale + wd * plain_ref[i]);
        }
        expect_close("sgd param", param, p_ref, n, FWD_TOL);
        expect_close("sgd momentum buffer", buf, b_ref, n, FWD_TOL);
        expect_close("sgd without momentum", plain, plain_ref, n, FWD_TOL);
        free(grad);
    }
    free(param), free(buf), free(plain), free(p_ref), free(b_ref), free(plain_ref);
}

Test(optim, sum_squares)
{
    rng_t rng = {1401};
    const size_t sizes[] = {0, 1, 7, 1000, 100003, 3000000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = random_fvec(&rng, n, -3, 3);
        double want = 0.0;
        for (size_t i = 0; i < n; i++)
            want += (double)x[i] * x[i];
        double got = tr_cpu_sum_squares(x, n);
        cr_assert(fabs(got - want) <= 1e-12 * fmax(want, 1.0), "sum_squares n=%zu: %.17g vs %.17g",
                  n, got, want);
        if (n > 1) {
            x[n / 2] = 3e38f; /* its square overflows a float, not a double */
            cr_assert(isfinite(tr_cpu_sum_squares(x, n)), "large finite input stays finite");
            x[n / 2] = INFINITY;
            cr_assert(!isfinite(tr_cpu_sum_squares(x, n)), "inf input gives non-finite");
            x[n / 2] = NAN;
            cr_assert(!isfinite(tr_cpu_sum_squares(x, n)), "NaN input gives non-finite");
        }
        free(x);
    }
}

/* ======================================================================== */
/* the CPU backend runs the new ops from their nodes                         */
/* ======================================================================== */

/* A one-node graph by hand (no core): tensors 0..n_in-1 are the inputs,
 * then the output, then the saved tensor if any.  The backend must read the
 * node's attributes and shapes into the kernels' arguments: its results
 * equal direct kernel calls with the intended arguments, to the bit. */
typedef struct {
    struct tr_graph g;
    struct tr_tensor t[5];
    struct tr_node n;
    struct tr_backend be;
} one_node;

/* forward, then backward of the node (dout in the output's grad) */
static void one_node_run(one_node *o)
{
    o->g.tensors = o->t;
    o->g.nodes = &o->n;
    o->g.n_nodes = 1;
    o->g.loss = -1;
    o->g.logits = -1;
    o->g.compute = TR_F32;
    cr_assert(tr_cpu_backend_init(&o->be, 2) == 0);
    const struct tr_backend_iface *in = o->be.iface;
    cr_assert(in->supports_op(o->be.context, &o->g, &o->n), "the CPU backend runs this node");
    o->g.scratch_floats = in->scratch_floats(o->be.context, &o->g, &o->n);
    o->g.scratch = fvec(o->g.scratch_floats);
    in->forward(o->be.context, &o->g, &o->n);
    in->backward(o->be.context, &o->g, &o->n);
    free(o->g.scratch);
    tr_cpu_backend_free(&o->be);
}

Test(backend_ops, rmsnorm_rope_swiglu_scale_from_nodes)
{
    rng_t rng = {1401};
    enum { B = 2, T = 5, H = 3, D = 6, C = H * D, N = B * T * C };
    int64_t x_shape[3] = {B, T, C}, w_shape[1] = {C}, rows_shape[1] = {B * T};
    float *x = random_fvec(&rng, N, -2, 2), *x2 = random_fvec(&rng, N, -2, 2);
    float *w = random_fvec(&rng, C, 0.5, 1.5), *dout = random_fvec(&rng, N, -1, 1);

    /* rmsnorm: eps from the node, rstd as the saved tensor */
    {
        one_node o = {0};
        float *out = fvec(N), *rstd = fvec(B * T), *dx = fvec(N), *dw = fvec(C);
        tensor_init(&o.t[0], 3, x_shape, x, dx);
        tensor_init(&o.t[1], 1, w_shape, w, dw);
        tensor_init(&o.t[2], 3, x_shape, out, dout);
        tensor_init(&o.t[3], 1, rows_shape, rstd, NULL);
        o.g.n_tensors = 4;
        o.n = (struct tr_node){.op = TR_OP_RMSNORM, .in = {0, 1}, .n_in = 2, .out = 2,
                               .aux = {3}, .n_aux = 1, .eps = 0.25f};
        one_node_run(&o);
        float *want = fvec(N), *want_rstd = fvec(B * T), *want_dx = fvec(N), *want_dw = fvec(C);
        tr_cpu_rmsnorm_forward(want, want_rstd, x, w, B * T, C, 0.25f);
        float *scratch = fvec(tr_cpu_rmsnorm_scratch_floats(B * T, C));
        tr_cpu_rmsnorm_backward(want_dx, want_dw, scratch, dout, x, w, want_rstd, B * T, C, 0);
        expect_bitwise("rmsnorm node out", out, want, N);
        expect_bitwise("rmsnorm node rstd", rstd, want_rstd, B * T);
        expect_bitwise("rmsnorm node dx", dx, want_dx, N);
        expect_bitwise("rmsnorm node dw", dw, want_dw, C);
        free(out), free(rstd), free(dx), free(dw), free(want), free(want_rstd), free(want_dx);
        free(want_dw), free(scratch);
    }
    /* rope: heads and theta from the node */
    {
        one_node o = {0};
        float *out = fvec(N), *dx = fvec(N);
        tensor_init(&o.t[0], 3, x_shape, x, dx);
        tensor_init(&o.t[1], 3, x_shape, out, dout);
        o.g.n_tensors = 2;
        o.n = (struct tr_node){.op = TR_OP_ROPE, .in = {0}, .n_in = 1, .out = 1, .heads = H,
                               .theta = 500.0f};
        one_node_run(&o);
        float *want = fvec(N), *want_dx = fvec(N);
        float *scratch = fvec(tr_cpu_rope_scratch_floats(T, D));
        tr_cpu_rope_forward(want, x, scratch, B, T, H, D, 500.0f);
        tr_cpu_rope_backward(want_dx, dout, scratch, B, T, H, D, 500.0f, 0);
        expect_bitwise("rope node out", out, want, N);
        expect_bitwise("rope node dx", dx, want_dx, N);
        free(out), free(dx), free(want), free(want_dx), free(scratch);
    }
    /* swiglu: gate first, up second */
    {
        one_node o = {0};
        float *out = fvec(N), *dg = fvec(N), *du = fvec(N);
        tensor_init(&o.t[0], 3, x_shape, x, dg);
        tensor_init(&o.t[1], 3, x_shape, x2, du);
        tensor_init(&o.t[2], 3, x_shape, out, dout);
        o.g.n_tensors = 3;
        o.n = (struct tr_node){.op = TR_OP_SWIGLU, .in = {0, 1}, .n_in = 2, .out = 2};
        one_node_run(&o);
        float *want = fvec(N), *want_dg = fvec(N), *want_du = fvec(N);
        tr_cpu_swiglu_forward(want, x, x2, N);
        tr_cpu_swiglu_backward(want_dg, want_du, x, x2, dout, N, 0);
        expect_bitwise("swiglu node out", out, want, N);
        expect_bitwise("swiglu node dgate", dg, want_dg, N);
        expect_bitwise("swiglu node dup", du, want_du, N);
        free(out), free(dg), free(du), free(want), free(want_dg), free(want_du);
    }
    /* scale: the factor from the node */
    {
        one_node o = {0};
        float *out = fvec(N), *dx = fvec(N);
        tensor_init(&o.t[0], 3, x_shape, x, dx);
        tensor_init(&o.t[1], 3, x_shape, out, dout);
        o.g.n_tensors = 2;
        o.n = (struct tr_node){.op = TR_OP_SCALE, .in = {0}, .n_in = 1, .out = 1, .scale = 3.5f};
        one_node_run(&o);
        for (int i = 0; i < N; i++)
            cr_assert(out[i] == 3.5f * x[i] && dx[i] == 3.5f * dout[i], "scale node [%d]", i);
        free(out), free(dx);
    }
    free(x), free(x2), free(w), free(dout);
}

Test(backend_ops, grouped_query_attention_from_nodes)
{
    rng_t rng = {1402};
    enum { B = 2, T = 70, H = 4, KV = 2, D = 6 };
    size_t n_q = (size_t)B * T * H * D, n_kv = (size_t)B * T * KV * D;
    int64_t q_shape[3] = {B, T, H * D}, kv_shape[3] = {B, T, KV * D}, lse_shape[3] = {B, H, T};
    float *q = random_fvec(&rng, n_q, -1, 1), *k = random_fvec(&rng, n_kv, -1, 1);
    float *v = random_fvec(&rng, n_kv, -1, 1), *dout = random_fvec(&rng, n_q, -1, 1);
    float *out = fvec(n_q), *lse = fvec((size_t)B * H * T);
    float *dq = fvec(n_q), *dk = fvec(n_kv), *dv = fvec(n_kv);
    one_node o = {0};
    tensor_init(&o.t[0], 3, q_shape, q, dq);
    tensor_init(&o.t[1], 3, kv_shape, k, dk);
    tensor_init(&o.t[2], 3, kv_shape, v, dv);
    tensor_init(&o.t[3], 3, q_shape, out, dout);
    tensor_init(&o.t[4], 3, lse_shape, lse, NULL);
    o.g.n_tensors = 5;
    o.n = (struct tr_node){.op = TR_OP_ATTENTION, .in = {0, 1, 2}, .n_in = 3, .out = 3,
                           .aux = {4}, .n_aux = 1, .heads = H, .kv_heads = KV};
    one_node_run(&o);
    float *want = fvec(n_q), *want_lse = fvec((size_t)B * H * T);
    float *want_dq = fvec(n_q), *want_dk = fvec(n_kv), *want_dv = fvec(n_kv);
    float *scratch = fvec(tr_cpu_attention_gqa_scratch_floats(B, T, H, KV, D));
    tr_cpu_attention_gqa_forward(want, want_lse, q, k, v, B, T, H, KV, D);
    tr_cpu_attention_gqa_backward(want_dq, want_dk, want_dv, scratch, dout, want, q, k, v,
                                  want_lse, B, T, H, KV, D, 0);
    expect_bitwise("gqa node out", out, want, n_q);
    expect_bitwise("gqa node lse", lse, want_lse, (size_t)B * H * T);
    expect_bitwise("gqa node dq", dq, want_dq, n_q);
    expect_bitwise("gqa node dk", dk, want_dk, n_kv);
    expect_bitwise("gqa node dv", dv, want_dv, n_kv);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(want), free(want_lse), free(want_dq), free(want_dk), free(want_dv), free(scratch);
}

/* ======================================================================== */
/* thread-count independence                                                 */
/* ======================================================================== */

/* Results for thread count `threads`, written into fresh buffers. */
typedef struct {
    float *lin_out, *lin_dinp, *lin_dw, *lin_db;
    float *ln_out, *ln_mean, *ln_rstd, *ln_dinp, *ln_dw, *ln_db;
    float *att_out, *att_lse, *att_dqkv;
    float *mm_out, *mm_da, *mm_db;
    float *emb_dtable, *xent_dlogits, xent_loss;
    float *gelu_out, *gelu_dinp;
    float *rms_out, *rms_rstd, *rms_dinp, *rms_dw;
    float *rope_out, *rope_dinp;
    float *swiglu_out, *swiglu_dgate, *swiglu_dup;
    float *gqa_out, *gqa_lse, *gqa_dq, *gqa_dk, *gqa_dv;
    double sumsq;
} thread_results;

enum {
    LIN_N = 200, LIN_IC = 100, LIN_OC = 300,
    LN_N = 50, LN_C = 200,
    AT_B = 2, AT_T = 130, AT_C = 32, AT_NH = 4,
    MM_BATCH = 5, MM_M = 20, MM_K = 30, MM_N = 40,
    EMB_V = 10, EMB_N = 300, EMB_C = 100,
    XE_N = 40, XE_V = 500,
    SQ_N = 1000000,
    GELU_N = 50001, /* several threads' shares and a tail */
    RMS_N = 150, RMS_C = 200, /* several chunks of dw sums */
    ROPE_B = 3, ROPE_T = 40, ROPE_H = 4, ROPE_D = 18,
    GQ_B = 2, GQ_T = 130, GQ_H = 6, GQ_KV = 2, GQ_D = 8,
};

typedef struct {
    float *lin_inp, *lin_w, *lin_b, *lin_dout;
    float *ln_inp, *ln_w, *ln_b, *ln_dout;
    float *att_qkv, *att_dout;
    float *mm_a, *mm_b, *mm_dout;
    int32_t emb_idx[EMB_N];
    float *emb_dout;
    int32_t xe_targets[XE_N];
    float *xe_logits;
    float *sq_x;
    float *gelu_x, *gelu_dout;
    float *rms_inp, *rms_w, *rms_dout;
    float *rope_x, *rope_dout;
    float *gqa_q, *gqa_k, *gqa_v, *gqa_dout;
} thread_inputs;

static void run_with_threads(const thread_inputs *in, int threads, thread_results *r)
{
    omp_set_num_threads(threads);
    r->lin_out = fvec(LIN_N * LIN_OC), r->lin_dinp = fvec(LIN_N * LIN_IC);
    r->lin_dw = fvec(LIN_OC * LIN_IC), r->lin_db = fvec(LIN_OC);
    tr_cpu_linear_forward(r->lin_out, in->lin_inp, in->lin_w, in->lin_b, LIN_N, LIN_IC, LIN_OC);
    tr_cpu_linear_backward(r->lin_dinp, r->lin_dw, r->lin_db, in->lin_dout, in->lin_inp,
                           in->lin_w, LIN_N, LIN_IC, LIN_OC, 0);

    r->ln_out = fvec(LN_N * LN_C), r->ln_mean = fvec(LN_N), r->ln_rstd = fvec(LN_N);
    r->ln_dinp = fvec(LN_N * LN_C), r->ln_dw = fvec(LN_C), r->ln_db = fvec(LN_C);
    tr_cpu_layernorm_forward(r->ln_out, r->ln_mean, r->ln_rstd, in->ln_inp, in->ln_w, in->ln_b,
                             LN_N, LN_C, 1e-5f);
    float *ln_scratch = fvec(tr_cpu_layernorm_scratch_floats(LN_N, LN_C));
    tr_cpu_layernorm_backward(r->ln_dinp, r->ln_dw, r->ln_db, ln_scratch, in->ln_dout, in->ln_inp,
                              in->ln_w, r->ln_mean, r->ln_rstd, LN_N, LN_C, 0);
    free(ln_scratch);

    r->att_out = fvec(AT_B * AT_T * AT_C), r->att_lse = fvec(AT_B * AT_NH * AT_T);
    r->att_dqkv = fvec(AT_B * AT_T * 3 * AT_C);
    float *scratch = fvec(tr_cpu_attention_scratch_floats(AT_B, AT_T, AT_C, AT_NH));
    tr_cpu_attention_forward(r->att_out, r->att_lse, in->att_qkv, AT_B, AT_T, AT_C, AT_NH);
    tr_cpu_attention_backward(r->att_dqkv, scratch, in->att_dout, r->att_out, in->att_qkv,
                              r->att_lse, AT_B, AT_T, AT_C, AT_NH, 0);
    free(scratch);

    r->mm_out = fvec(MM_BATCH * MM_M * MM_N), r->mm_da = fvec(MM_BATCH * MM_M * MM_K);
    r->mm_db = fvec(MM_BATCH * MM_K * MM_N);
    tr_cpu_matmul_forward(r->mm_out, in->mm_a, in->mm_b, MM_BATCH, MM_M, MM_K, MM_N, 1);
    tr_cpu_matmul_backward(r->mm_da, r->mm_db, in->mm_dout, in->mm_a, in->mm_b, MM_BATCH, MM_M,
                           MM_K, MM_N, 1);

    r->emb_dtable = fvec(EMB_V * EMB_C);
    tr_cpu_embedding_backward(r->emb_dtable, in->emb_dout, in->emb_idx, EMB_N, EMB_C);

    float lse[XE_N];
    r->xent_dlogits = fvec(XE_N * XE_V);
    tr_cpu_cross_entropy_forward(&r->xent_loss, lse, in->xe_logits, in->xe_targets, XE_N, XE_V,
                                 IGNORE_INDEX);
    tr_cpu_cross_entropy_backward(r->xent_dlogits, in->xe_logits, lse, in->xe_targets, 1.0f, XE_N,
                                  XE_V, IGNORE_INDEX, 0);

    r->sumsq = tr_cpu_sum_squares(in->sq_x, SQ_N);

    r->gelu_out = fvec(GELU_N), r->gelu_dinp = fvec(GELU_N);
    tr_cpu_gelu_forward(r->gelu_out, in->gelu_x, GELU_N);
    tr_cpu_gelu_backward(r->gelu_dinp, in->gelu_x, in->gelu_dout, GELU_N, 0);

    r->rms_out = fvec(RMS_N * RMS_C), r->rms_rstd = fvec(RMS_N);
    r->rms_dinp = fvec(RMS_N * RMS_C), r->rms_dw = fvec(RMS_C);
    tr_cpu_rmsnorm_forward(r->rms_out, r->rms_rstd, in->rms_inp, in->rms_w, RMS_N, RMS_C, 1e-5f);
    scratch = fvec(tr_cpu_rmsnorm_scratch_floats(RMS_N, RMS_C));
    tr_cpu_rmsnorm_backward(r->rms_dinp, r->rms_dw, scratch, in->rms_dout, in->rms_inp, in->rms_w,
                            r->rms_rstd, RMS_N, RMS_C, 0);
    free(scratch);

    size_t n_rope = (size_t)ROPE_B * ROPE_T * ROPE_H * ROPE_D;
    r->rope_out = fvec(n_rope), r->rope_dinp = fvec(n_rope);
    scratch = fvec(tr_cpu_rope_scratch_floats(ROPE_T, ROPE_D));
    tr_cpu_rope_forward(r->rope_out, in->rope_x, scratch, ROPE_B, ROPE_T, ROPE_H, ROPE_D, 1e4f);
    tr_cpu_rope_backward(r->rope_dinp, in->rope_dout, scratch, ROPE_B, ROPE_T, ROPE_H, ROPE_D,
                         1e4f, 0);
    free(scratch);

    /* SwiGLU on GELU's inputs: several threads' shares and a tail */
    r->swiglu_out = fvec(GELU_N), r->swiglu_dgate = fvec(GELU_N), r->swiglu_dup = fvec(GELU_N);
    tr_cpu_swiglu_forward(r->swiglu_out, in->gelu_x, in->gelu_dout, GELU_N);
    tr_cpu_swiglu_backward(r->swiglu_dgate, r->swiglu_dup, in->gelu_x, in->gelu_dout,
                           in->gelu_x, GELU_N, 0);

    size_t n_q = (size_t)GQ_B * GQ_T * GQ_H * GQ_D, n_kv = (size_t)GQ_B * GQ_T * GQ_KV * GQ_D;
    r->gqa_out = fvec(n_q), r->gqa_lse = fvec(GQ_B * GQ_H * GQ_T);
    r->gqa_dq = fvec(n_q), r->gqa_dk = fvec(n_kv), r->gqa_dv = fvec(n_kv);
    scratch = fvec(tr_cpu_attention_gqa_scratch_floats(GQ_B, GQ_T, GQ_H, GQ_KV, GQ_D));
    tr_cpu_attention_gqa_forward(r->gqa_out, r->gqa_lse, in->gqa_q, in->gqa_k, in->gqa_v, GQ_B,
                                 GQ_T, GQ_H, GQ_KV, GQ_D);
    tr_cpu_attention_gqa_backward(r->gqa_dq, r->gqa_dk, r->gqa_dv, scratch, in->gqa_dout,
                                  r->gqa_out, in->gqa_q, in->gqa_k, in->gqa_v, r->gqa_lse, GQ_B,
                                  GQ_T, GQ_H, GQ_KV, GQ_D, 0);
    free(scratch);
}

/* names read "<what>: not bitwise identical" on failure */
static void expect_same_results(const thread_results *a, const thread_results *b)
{
    expect_bitwise("linear out", a->lin_out, b->lin_out, LIN_N * LIN_OC);
    expect_bitwise("linear dinp", a->lin_dinp, b->lin_dinp, LIN_N * LIN_IC);
    expect_bitwise("linear dw", a->lin_dw, b->lin_dw, LIN_OC * LIN_IC);
    expect_bitwise("linear dbias", a->lin_db, b->lin_db, LIN_OC);
    expect_bitwise("layernorm out", a->ln_out, b->ln_out, LN_N * LN_C);
    expect_bitwise("layernorm mean", a->ln_mean, b->ln_mean, LN_N);
    expect_bitwise("layernorm rstd", a->ln_rstd, b->ln_rstd, LN_N);
    expect_bitwise("layernorm dinp", a->ln_dinp, b->ln_dinp, LN_N * LN_C);
    expect_bitwise("layernorm dw", a->ln_dw, b->ln_dw, LN_C);
    expect_bitwise("layernorm db", a->ln_db, b->ln_db, LN_C);
    expect_bitwise("attention out", a->att_out, b->att_out, AT_B * AT_T * AT_C);
    expect_bitwise("attention lse", a->att_lse, b->att_lse, AT_B * AT_NH * AT_T);
    expect_bitwise("attention dqkv", a->att_dqkv, b->att_dqkv, AT_B * AT_T * 3 * AT_C);
    expect_bitwise("matmul out", a->mm_out, b->mm_out, MM_BATCH * MM_M * MM_N);
    expect_bitwise("matmul da", a->mm_da, b->mm_da, MM_BATCH * MM_M * MM_K);
    expect_bitwise("matmul db", a->mm_db, b->mm_db, MM_BATCH * MM_K * MM_N);
    expect_bitwise("embedding dtable", a->emb_dtable, b->emb_dtable, EMB_V * EMB_C);
    expect_bitwise("cross-entropy loss", &a->xent_loss, &b->xent_loss, 1);
    expect_bitwise("cross-entropy dlogits", a->xent_dlogits, b->xent_dlogits, XE_N * XE_V);
    expect_bitwise("gelu out", a->gelu_out, b->gelu_out, GELU_N);
    expect_bitwise("gelu dinp", a->gelu_dinp, b->gelu_dinp, GELU_N);
    expect_bitwise("rmsnorm out", a->rms_out, b->rms_out, RMS_N * RMS_C);
    expect_bitwise("rmsnorm rstd", a->rms_rstd, b->rms_rstd, RMS_N);
    expect_bitwise("rmsnorm dinp", a->rms_dinp, b->rms_dinp, RMS_N * RMS_C);
    expect_bitwise("rmsnorm dw", a->rms_dw, b->rms_dw, RMS_C);
    size_t n_rope = (size_t)ROPE_B * ROPE_T * ROPE_H * ROPE_D;
    expect_bitwise("rope out", a->rope_out, b->rope_out, n_rope);
    expect_bitwise("rope dinp", a->rope_dinp, b->rope_dinp, n_rope);
    expect_bitwise("swiglu out", a->swiglu_out, b->swiglu_out, GELU_N);
    expect_bitwise("swiglu dgate", a->swiglu_dgate, b->swiglu_dgate, GELU_N);
    expect_bitwise("swiglu dup", a->swiglu_dup, b->swiglu_dup, GELU_N);
    size_t n_q = (size_t)GQ_B * GQ_T * GQ_H * GQ_D, n_kv = (size_t)GQ_B * GQ_T * GQ_KV * GQ_D;
    expect_bitwise("gqa out", a->gqa_out, b->gqa_out, n_q);
    expect_bitwise("gqa lse", a->gqa_lse, b->gqa_lse, GQ_B * GQ_H * GQ_T);
    expect_bitwise("gqa dq", a->gqa_dq, b->gqa_dq, n_q);
    expect_bitwise("gqa dk", a->gqa_dk, b->gqa_dk, n_kv);
    expect_bitwise("gqa dv", a->gqa_dv, b->gqa_dv, n_kv);
    cr_assert(memcmp(&a->sumsq, &b->sumsq, sizeof(double)) == 0,
              "sum_squares: not bitwise identical");
}

static void free_results(thread_results *r)
{
    float *all[] = {r->lin_out,  r->lin_dinp, r->lin_dw,    r->lin_db,    r->ln_out,
                    r->ln_mean,  r->ln_rstd,  r->ln_dinp,   r->ln_dw,     r->ln_db,
                    r->att_out,  r->att_lse,  r->att_dqkv,  r->mm_out,    r->mm_da,
                    r->mm_db,    r->emb_dtable, r->xent_dlogits, r->gelu_out, r->gelu_dinp,
                    r->rms_out,  r->rms_rstd, r->rms_dinp,  r->rms_dw,    r->rope_out,
                    r->rope_dinp, r->swiglu_out, r->swiglu_dgate, r->swiglu_dup, r->gqa_out,
                    r->gqa_lse,  r->gqa_dq,   r->gqa_dk,    r->gqa_dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

Test(determinism, same_bits_for_1_2_3_threads)
{
    rng_t rng = {1501};
    thread_inputs in;
    in.lin_inp = random_fvec(&rng, LIN_N * LIN_IC, -1, 1);
    in.lin_w = random_fvec(&rng, LIN_OC * LIN_IC, -1, 1);
    in.lin_b = random_fvec(&rng, LIN_OC, -1, 1);
    in.lin_dout = random_fvec(&rng, LIN_N * LIN_OC, -1, 1);
    in.ln_inp = random_fvec(&rng, LN_N * LN_C, -2, 3);
    in.ln_w = random_fvec(&rng, LN_C, 0.5, 1.5);
    in.ln_b = random_fvec(&rng, LN_C, -1, 1);
    in.ln_dout = random_fvec(&rng, LN_N * LN_C, -1, 1);
    in.att_qkv = random_fvec(&rng, AT_B * AT_T * 3 * AT_C, -1, 1);
    in.att_dout = random_fvec(&rng, AT_B * AT_T * AT_C, -1, 1);
    in.mm_a = random_fvec(&rng, MM_BATCH * MM_M * MM_K, -1, 1);
    in.mm_b = random_fvec(&rng, MM_BATCH * MM_K * MM_N, -1, 1);
    in.mm_dout = random_fvec(&rng, MM_BATCH * MM_M * MM_N, -1, 1);
    for (int n = 0; n < EMB_N; n++)
        in.emb_idx[n] = rng_int(&rng, 0, EMB_V - 1);
    in.emb_dout = random_fvec(&rng, EMB_N * EMB_C, -1, 1);
    for (int n = 0; n < XE_N; n++)
        in.xe_targets[n] = n % 5 == 3 ? IGNORE_INDEX : rng_int(&rng, 0, XE_V - 1);
    in.xe_logits = random_fvec(&rng, XE_N * XE_V, -4, 4);
    in.sq_x = random_fvec(&rng, SQ_N, -1, 1);
    in.gelu_x = random_fvec(&rng, GELU_N, -6, 6);
    in.gelu_dout = random_fvec(&rng, GELU_N, -1, 1);
    in.rms_inp = random_fvec(&rng, RMS_N * RMS_C, -2, 3);
    in.rms_w = random_fvec(&rng, RMS_C, 0.5, 1.5);
    in.rms_dout = random_fvec(&rng, RMS_N * RMS_C, -1, 1);
    in.rope_x = random_fvec(&rng, ROPE_B * ROPE_T * ROPE_H * ROPE_D, -2, 2);
    in.rope_dout = random_fvec(&rng, ROPE_B * ROPE_T * ROPE_H * ROPE_D, -1, 1);
    in.gqa_q = random_fvec(&rng, GQ_B * GQ_T * GQ_H * GQ_D, -1, 1);
    in.gqa_k = random_fvec(&rng, GQ_B * GQ_T * GQ_KV * GQ_D, -1, 1);
    in.gqa_v = random_fvec(&rng, GQ_B * GQ_T * GQ_KV * GQ_D, -1, 1);
    in.gqa_dout = random_fvec(&rng, GQ_B * GQ_T * GQ_H * GQ_D, -1, 1);

    thread_results one, two, three;
    run_with_threads(&in, 1, &one);
    run_with_threads(&in, 2, &two);
    run_with_threads(&in, 3, &three);
    expect_same_results(&one, &two);
    expect_same_results(&one, &three);
    free_results(&one), free_results(&two), free_results(&three);

    float *inputs[] = {in.lin_inp, in.lin_w,    in.lin_b,  in.lin_dout, in.ln_inp,
                       in.ln_w,    in.ln_b,     in.ln_dout, in.att_qkv, in.att_dout,
                       in.mm_a,    in.mm_b,     in.mm_dout, in.emb_dout, in.xe_logits,
                       in.sq_x,    in.gelu_x,   in.gelu_dout, in.rms_inp, in.rms_w,
                       in.rms_dout, in.rope_x,  in.rope_dout, in.gqa_q,  in.gqa_k,
                       in.gqa_v,   in.gqa_dout};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
        free(inputs[i]);
}

/* ======================================================================== */
/* Written gradients (`write`): the first writer of a gradient overwrites    */
/* whatever the buffer holds, with the values an accumulation onto zeros     */
/* gives (the core then skips zeroing it: kernels.h)                         */
/* ======================================================================== */

/* n floats of garbage (NaN among them: a written gradient must not read it) */
static float *garbage(size_t n)
{
    float *x = fvec(n);
    for (size_t i = 0; i < n; i++)
        x[i] = i % 3 == 0 ? NAN : (float)(1e6 + (double)i);
    return x;
}

/* written over garbage == accumulated onto zeros (-0 and +0 alike) */
static void expect_written(const char *what, const float *written, const float *from_zeros,
                           size_t n)
{
    expect_close_ff(what, written, from_zeros, n, 0.0);
}

Test(grad_write, linear_add_layernorm_gelu_cross_entropy)
{
    rng_t rng = {2601};
    /* linear: every subset of dinp, dw, dbias written, fp32 and native bf16 */
    const int N = 37, IC = 24, OC = 40;
    float *x = random_fvec(&rng, (size_t)N * IC, -1, 1), *w = random_fvec(&rng, (size_t)OC * IC, -1, 1);
    float *dout = random_fvec(&rng, (size_t)N * OC, -1, 1);
    uint16_t *x16 = hvec((size_t)N * IC), *w16 = hvec((size_t)OC * IC), *d16 = hvec((size_t)N * OC);
    tr_cpu_to_bf16(x16, x, (size_t)N * IC), tr_cpu_to_bf16(w16, w, (size_t)OC * IC);
    int native = tr_cpu_gemm_bf16_available() && tr_cpu_bf16_native_isa() != NULL;
    for (int bf16 = 0; bf16 <= native; bf16++)
        for (unsigned write = 0; write < 8; write++) {
            float *zx = fvec((size_t)N * IC), *zw = fvec((size_t)OC * IC), *zb = fvec(OC);
            float *gx = garbage((size_t)N * IC), *gw = garbage((size_t)OC * IC), *gb = garbage(OC);
            float *px = write & 1u ? gx : zx, *pw = write & 2u ? gw : zw, *pb = write & 4u ? gb : zb;
            if (bf16) {
                float *zb2 = fvec(OC);
                tr_cpu_linear_dout_bf16(d16, zb2, dout, N, OC, 0);
                tr_cpu_linear_backward_bf16(zx, zw, d16, x16, w16, N, IC, OC, 0);
                tr_cpu_linear_dout_bf16(d16, pb, dout, N, OC, (write & 4u) != 0);
                tr_cpu_linear_backward_bf16(write & 1u ? gx : NULL, write & 2u ? gw : NULL, d16,
                                            x16, w16, N, IC, OC, write);
                memcpy(zb, zb2, OC * sizeof(float));
                free(zb2);
            } else {
                float *ax = fvec((size_t)N * IC), *aw = fvec((size_t)OC * IC), *ab = fvec(OC);
                tr_cpu_linear_backward(ax, aw, ab, dout, x, w, N, IC, OC, 0);
                tr_cpu_linear_backward(write & 1u ? gx : NULL, write & 2u ? gw : NULL,
                                       write & 4u ? gb : NULL, dout, x, w, N, IC, OC, write);
                memcpy(zx, ax, (size_t)N * IC * sizeof(float));
                memcpy(zw, aw, (size_t)OC * IC * sizeof(float));
                memcpy(zb, ab, OC * sizeof(float));
                free(ax), free(aw), free(ab);
            }
            char what[64];
            snprintf(what, sizeof what, "linear %s write %u: dinp", bf16 ? "bf16" : "fp32", write);
            if (write & 1u)
                expect_written(what, gx, zx, (size_t)N * IC);
            snprintf(what, sizeof what, "linear %s write %u: dw", bf16 ? "bf16" : "fp32", write);
            if (write & 2u)
                expect_written(what, gw, zw, (size_t)OC * IC);
            snprintf(what, sizeof what, "linear %s write %u: dbias", bf16 ? "bf16" : "fp32", write);
            if (write & 4u)
                expect_written(what, gb, zb, OC);
            (void)px, (void)pw;
            free(zx), free(zw), free(zb), free(gx), free(gw), free(gb);
        }
    free(x), free(w), free(dout), free(x16), free(w16), free(d16);

    /* add: da, db, each written or added */
    const size_t n = 1003;
    float *g = random_fvec(&rng, n, -1, 1);
    for (unsigned write = 1; write < 4; write++) {
        float *za = fvec(n), *zb = fvec(n), *ga = garbage(n), *gb = garbage(n);
        tr_cpu_add_backward(za, zb, g, n, 0);
        tr_cpu_add_backward(write & 1u ? ga : za, write & 2u ? gb : zb, g, n, write);
        if (write & 1u)
            expect_written("add da", ga, za, n);
        if (write & 2u)
            expect_written("add db", gb, zb, n);
        free(za), free(zb), free(ga), free(gb);
    }

    /* GELU: fp32 and bf16 input, lengths with a tail */
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t len = 5; len < 20000; len = len * 7 + 3) {
            float *xs = random_fvec(&rng, len, -5, 5), *d = random_fvec(&rng, len, -1, 1);
            uint16_t *xh = hvec(len);
            tr_cpu_to_bf16(xh, xs, len);
            struct tr_cpu_act in = bf16 ? act_half(xh, 1) : act_f32(xs);
            float *z = fvec(len), *gw2 = garbage(len);
            tr_cpu_gelu_backward_act(z, in, d, len, 0);
            tr_cpu_gelu_backward_act(gw2, in, d, len, 1);
            expect_written(bf16 ? "gelu bf16 dinp" : "gelu dinp", gw2, z, len);
            free(xs), free(d), free(xh), free(z), free(gw2);
        }

    /* layer norm: every subset of dinp, dw, db written, rows over several chunks */
    const int LN = 70, C = 33;
    float *lx = random_fvec(&rng, (size_t)LN * C, -2, 3), *lw = random_fvec(&rng, C, 0.5, 1.5);
    float *lb = random_fvec(&rng, C, -1, 1), *ld = random_fvec(&rng, (size_t)LN * C, -1, 1);
    float *y = fvec((size_t)LN * C), *mean = fvec(LN), *rstd = fvec(LN);
    float *scratch = fvec(tr_cpu_layernorm_scratch_floats(LN, C));
    tr_cpu_layernorm_forward(y, mean, rstd, lx, lw, lb, LN, C, 1e-5f);
    float *zx = fvec((size_t)LN * C), *zw = fvec(C), *zb = fvec(C);
    tr_cpu_layernorm_backward(zx, zw, zb, scratch, ld, lx, lw, mean, rstd, LN, C, 0);
    for (unsigned write = 1; write < 8; write++) {
        float *gx = garbage((size_t)LN * C), *gw = garbage(C), *gb = garbage(C);
        float *ax = copy_fvec(zx, (size_t)LN * C), *aw = copy_fvec(zw, C), *ab = copy_fvec(zb, C);
        memset(ax, 0, (size_t)LN * C * sizeof(float)), memset(aw, 0, C * sizeof(float));
        memset(ab, 0, C * sizeof(float));
        tr_cpu_layernorm_backward(write & 1u ? gx : ax, write & 2u ? gw : aw,
                                  write & 4u ? gb : ab, scratch, ld, lx, lw, mean, rstd, LN, C,
                                  write);
        if (write & 1u)
            expect_written("layernorm dinp", gx, zx, (size_t)LN * C);
        if (write & 2u)
            expect_written("layernorm dw", gw, zw, C);
        if (write & 4u)
            expect_written("layernorm db", gb, zb, C);
        free(gx), free(gw), free(gb), free(ax), free(aw), free(ab);
    }
    free(lx), free(lw), free(lb), free(ld), free(y), free(mean), free(rstd), free(scratch);
    free(zx), free(zw), free(zb);

    /* cross-entropy: a row that does not count is written with zeros */
    const int XN = 6, V = 1031;
    float *logits = random_fvec(&rng, (size_t)XN * V, -3, 3), *lse = fvec(XN), loss;
    int32_t targets[6] = {5, -100, 1030, 0, -100, 77};
    tr_cpu_cross_entropy_forward(&loss, lse, logits, targets, XN, V, -100);
    float *z = fvec((size_t)XN * V), *gl = garbage((size_t)XN * V);
    tr_cpu_cross_entropy_backward(z, logits, lse, targets, 0.5f, XN, V, -100, 0);
    tr_cpu_cross_entropy_backward(gl, logits, lse, targets, 0.5f, XN, V, -100, 1);
    expect_written("cross-entropy dlogits", gl, z, (size_t)XN * V);
    int32_t none[6] = {-100, -100, -100, -100, -100, -100};
    float *gn = garbage((size_t)XN * V), *zn = fvec((size_t)XN * V);
    tr_cpu_cross_entropy_backward(gn, logits, lse, none, 0.5f, XN, V, -100, 1);
    expect_written("cross-entropy, no row counts", gn, zn, (size_t)XN * V);
    free(logits), free(lse), free(z), free(gl), free(gn), free(zn), free(g);
}

/* Llama's ops: RMSNorm (dinp, dw), SwiGLU (dgate, dup), rope, scale */
Test(grad_write, rmsnorm_swiglu_rope_scale)
{
    rng_t rng = {2603};
    const int N = 70, C = 24; /* rows over three chunks of dw's partial sums */
    size_t nx = (size_t)N * C;
    float *x = random_fvec(&rng, nx, -2, 2), *w = random_fvec(&rng, C, 0.5, 1.5);
    float *dy = random_fvec(&rng, nx, -1, 1), *y = fvec(nx), *rstd = fvec(N);
    float *scratch = fvec(tr_cpu_rmsnorm_scratch_floats(N, C));
    tr_cpu_rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f);
    float *zx = fvec(nx), *zw = fvec(C);
    tr_cpu_rmsnorm_backward(zx, zw, scratch, dy, x, w, rstd, N, C, 0);
    for (unsigned write = 1; write < 4; write++) {
        float *gx = write & 1u ? garbage(nx) : fvec(nx), *gw = write & 2u ? garbage(C) : fvec(C);
        tr_cpu_rmsnorm_backward(gx, gw, scratch, dy, x, w, rstd, N, C, write);
        if (write & 1u)
            expect_written("rmsnorm dinp", gx, zx, nx);
        if (write & 2u)
            expect_written("rmsnorm dw", gw, zw, C);
        free(gx), free(gw);
    }
    free(x), free(w), free(dy), free(y), free(rstd), free(scratch), free(zx), free(zw);

    for (size_t n = 5; n < 20000; n = n * 9 + 4) { /* with and without a tail */
        float *gate = random_fvec(&rng, n, -4, 4), *up = random_fvec(&rng, n, -2, 2);
        float *d = random_fvec(&rng, n, -1, 1), *zg = fvec(n), *zu = fvec(n);
        tr_cpu_swiglu_backward(zg, zu, gate, up, d, n, 0);
        for (unsigned write = 1; write < 4; write++) {
            float *gg = write & 1u ? garbage(n) : fvec(n), *gu = write & 2u ? garbage(n) : fvec(n);
            tr_cpu_swiglu_backward(gg, gu, gate, up, d, n, write);
            if (write & 1u)
                expect_written("swiglu dgate", gg, zg, n);
            if (write & 2u)
                expect_written("swiglu dup", gu, zu, n);
            free(gg), free(gu);
        }
        float *zs = fvec(n), *gs = garbage(n);
        tr_cpu_scale_backward(zs, d, 0.37f, n, 0);
        tr_cpu_scale_backward(gs, d, 0.37f, n, 1);
        expect_written("scale dinp", gs, zs, n);
        free(gate), free(up), free(d), free(zg), free(zu), free(zs), free(gs);
    }

    const int B = 2, T = 5, H = 3, D = 8;
    size_t nr = (size_t)B * T * H * D;
    float *rd = random_fvec(&rng, nr, -1, 1), *zr = fvec(nr), *gr = garbage(nr);
    float *rs = fvec(tr_cpu_rope_scratch_floats(T, D));
    tr_cpu_rope_backward(zr, rd, rs, B, T, H, D, 10000.0f, 0);
    tr_cpu_rope_backward(gr, rd, rs, B, T, H, D, 10000.0f, 1);
    expect_written("rope dinp", gr, zr, nr);
    free(rd), free(zr), free(gr), free(rs);
}

/* attention: dq, dk, dv written by each block's first product -- packed and
 * grouped-query, fp32 and native bf16, per-head and split backward (the
 * split runs when a few (batch, kv head) pairs meet many threads) */
Test(grad_write, attention)
{
    rng_t rng = {2602};
    int saved_threads = omp_get_max_threads();
    int native = tr_cpu_gemm_bf16_available() && tr_cpu_bf16_native_isa() != NULL;
    const int B = 1, T = 150, H = 4, KV = 2, D = 16;
    size_t nq = (size_t)B * T * H * D, nkv = (size_t)B * T * KV * D;
    float *q = random_fvec(&rng, nq, -1, 1), *k = random_fvec(&rng, nkv, -1, 1);
    float *v = random_fvec(&rng, nkv, -1, 1), *dout = random_fvec(&rng, nq, -1, 1);
    uint16_t *q16 = hvec(nq), *k16 = hvec(nkv), *v16 = hvec(nkv);
    tr_cpu_to_bf16(q16, q, nq), tr_cpu_to_bf16(k16, k, nkv), tr_cpu_to_bf16(v16, v, nkv);
    float *out = fvec(nq), *lse = fvec((size_t)B * H * T);
    float *scratch = fvec(tr_cpu_attention_gqa_bf16_scratch_floats(B, T, H, KV, D) +
                          tr_cpu_attention_gqa_scratch_floats(B, T, H, KV, D));
    for (int threads = 1; threads <= 8; threads *= 8) /* 8: the split backward */
        for (int bf16 = 0; bf16 <= native; bf16++)
            for (unsigned write = 1; write < 8; write++) {
                omp_set_num_threads(threads);
                float *zq = fvec(nq), *zk = fvec(nkv), *zv = fvec(nkv);
                float *gq = garbage(nq), *gk = garbage(nkv), *gv = garbage(nkv);
                float *wq = write & 1u ? gq : fvec(nq), *wk = write & 2u ? gk : fvec(nkv);
                float *wv = write & 4u ? gv : fvec(nkv);
                if (bf16) {
                    tr_cpu_attention_gqa_forward_bf16(out, lse, q16, k16, v16, B, T, H, KV, D);
                    tr_cpu_attention_gqa_backward_bf16(zq, zk, zv, scratch, dout, out, q16, k16,
                                                       v16, lse, B, T, H, KV, D, 0);
                    tr_cpu_attention_gqa_backward_bf16(wq, wk, wv, scratch, dout, out, q16, k16,
                                                       v16, lse, B, T, H, KV, D, write);
                } else {
                    tr_cpu_attention_gqa_forward(out, lse, q, k, v, B, T, H, KV, D);
                    tr_cpu_attention_gqa_backward(zq, zk, zv, scratch, dout, out, q, k, v, lse, B,
                                                  T, H, KV, D, 0);
                    tr_cpu_attention_gqa_backward(wq, wk, wv, scratch, dout, out, q, k, v, lse, B,
                                                  T, H, KV, D, write);
                }
                char what[96];
                snprintf(what, sizeof what, "attention %s threads %d write %u: dq",
                         bf16 ? "bf16" : "fp32", threads, write);
                expect_written(what, wq, zq, nq);
                what[strlen(what) - 1] = 'k';
                expect_written(what, wk, zk, nkv);
                what[strlen(what) - 1] = 'v';
                expect_written(what, wv, zv, nkv);
                free(zq), free(zk), free(zv), free(wq), free(wk), free(wv);
            }
    omp_set_num_threads(saved_threads);

    /* packed q, k, v (one gradient, written whole) */
    const int C = H * D;
    size_t n3 = (size_t)B * T * 3 * C;
    float *qkv = random_fvec(&rng, n3, -1, 1);
    uint16_t *qkv16 = hvec(n3);
    tr_cpu_to_bf16(qkv16, qkv, n3);
    for (int bf16 = 0; bf16 <= native; bf16++) {
        float *z = fvec(n3), *gw = garbage(n3);
        if (bf16) {
            tr_cpu_attention_forward_bf16(out, lse, qkv16, B, T, C, H);
            tr_cpu_attention_backward_bf16(z, scratch, dout, out, qkv16, lse, B, T, C, H, 0);
            tr_cpu_attention_backward_bf16(gw, scratch, dout, out, qkv16, lse, B, T, C, H, 1);
        } else {
            tr_cpu_attention_forward(out, lse, qkv, B, T, C, H);
            tr_cpu_attention_backward(z, scratch, dout, out, qkv, lse, B, T, C, H, 0);
            tr_cpu_attention_backward(gw, scratch, dout, out, qkv, lse, B, T, C, H, 1);
        }
        expect_written(bf16 ? "attention packed bf16 dqkv" : "attention packed dqkv", gw, z, n3);
        free(z), free(gw);
    }
    free(q), free(k), free(v), free(dout), free(q16), free(k16), free(v16), free(out), free(lse);
    free(scratch), free(qkv), free(qkv16);
}
