/*
 * Linear layer and batched matmul, both as GEMMs: fp32 inputs through
 * tr_cpu_sgemm, or bf16 inputs through tr_cpu_gemm_bf16 (fp32 products,
 * sums and outputs either way).  One body serves both: `struct gemm_kind`
 * says which GEMM and how wide an input element is.
 */
#include <omp.h>

#include "kernels.h"
#include "../host.h"

/* Columns per block in the bias-gradient column sums. */
enum { COLUMN_BLOCK = 64 };

/* C (+)= op(A) op(B), beta 0 or 1; A and B in the kind's element type. */
typedef void (*gemm_fn)(int trans_a, int trans_b, int M, int N, int K, const void *A, int lda,
                        const void *B, int ldb, float beta, float *C, int ldc);

struct gemm_kind {
    size_t elem;     /* bytes per input element */
    gemm_fn threaded; /* threaded over tiles of C */
    gemm_fn serial;   /* the same bits, on the calling thread */
};

static void sgemm_threaded(int ta, int tb, int M, int N, int K, const void *A, int lda,
                           const void *B, int ldb, float beta, float *C, int ldc)
{
    tr_cpu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

static void sgemm_serial(int ta, int tb, int M, int N, int K, const void *A, int lda,
                         const void *B, int ldb, float beta, float *C, int ldc)
{
    tr_cpu_sgemm_serial(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

static void bf16_threaded(int ta, int tb, int M, int N, int K, const void *A, int lda,
                          const void *B, int ldb, float beta, float *C, int ldc)
{
    tr_cpu_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

static void bf16_serial(int ta, int tb, int M, int N, int K, const void *A, int lda,
                        const void *B, int ldb, float beta, float *C, int ldc)
{
    tr_cpu_gemm_bf16_serial(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

static const struct gemm_kind F32 = {sizeof(float), sgemm_threaded, sgemm_serial};
static const struct gemm_kind BF16 = {sizeof(uint16_t), bf16_threaded, bf16_serial};

/* element i of an input array of the kind */
static const void *at(const struct gemm_kind *k, const void *base, size_t i)
{
    return (const char *)base + i * k->elem;
}

/* out = the bias rows, where there is a bias; the beta for the GEMM that
 * then accumulates onto them */
static float bias_start(float *out, const float *bias, int N, int OC)
{
    if (bias == NULL)
        return 0.0f;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            out[(size_t)n * OC + o] = bias[o];
    return 1.0f;
}

static void linear_forward(const struct gemm_kind *k, float *out, const void *inp, const void *w,
                           const float *bias, int N, int IC, int OC)
{
    float beta = bias_start(out, bias, N, OC);
    /* out[N,OC] (+)= inp[N,IC] @ w[OC,IC]^T */
    k->threaded(0, 1, N, OC, IC, inp, IC, w, IC, beta, out, OC);
}

/* write: bit 0 dinp, bit 1 dw are written (GEMMs with beta 0) */
static void linear_backward(const struct gemm_kind *k, float *dinp, float *dw, const void *dout,
                            const void *inp, const void *w, int N, int IC, int OC, unsigned write)
{
    /* dinp[N,IC] (+)= dout[N,OC] @ w[OC,IC] */
    if (dinp != NULL)
        k->threaded(0, 0, N, IC, OC, dout, OC, w, IC, write & 1u ? 0.0f : 1.0f, dinp, IC);
    /* dw[OC,IC] (+)= dout[N,OC]^T @ inp[N,IC] */
    if (dw != NULL)
        k->threaded(1, 0, OC, IC, N, dout, OC, inp, IC, write & 2u ? 0.0f : 1.0f, dw, IC);
}

void tr_cpu_linear_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int IC, int OC)
{
    linear_forward(&F32, out, inp, w, bias, N, IC, OC);
}

void tr_cpu_linear_forward_wt(float *out, const float *inp, const float *wt, int ldw,
                              const float *bias, int N, int IC, int OC)
{
    float beta = bias_start(out, bias, N, OC);
    /* out[N,OC] (+)= inp[N,IC] @ wt[IC,OC] */
    tr_cpu_sgemm(0, 0, N, OC, IC, 1.0f, inp, IC, wt, ldw, beta, out, OC);
}

void tr_cpu_linear_forward_onto(float *out, const float *inp, const float *w, const float *wt,
                                int ldw, const float *addend, int N, int IC, int OC)
{
    if (wt != NULL) /* out[N,OC] = addend + inp[N,IC] @ wt[IC,OC] */
        tr_cpu_sgemm_onto(0, 0, N, OC, IC, inp, IC, wt, ldw, addend, out, OC);
    else /* out[N,OC] = addend + inp[N,IC] @ w[OC,IC]^T */
        tr_cpu_sgemm_onto(0, 1, N, OC, IC, inp, IC, w, IC, addend, out, OC);
}

void tr_cpu_linear_forward_bf16_onto(float *out, uint16_t *out16, const uint16_t *inp,
                                     const uint16_t *w, const void *addend, int N, int IC, int OC)
{
    tr_cpu_gemm_bf16_onto(0, 1, N, OC, IC, inp, IC, w, IC, addend, out16 ? NULL : out, OC, out16);
}

void tr_cpu_linear_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC,
                            unsigned write)
{
    linear_backward(&F32, dinp, dw, dout, inp, w, N, IC, OC, write);
    if (dbias != NULL)
        tr_cpu_linear_bias_backward(dbias, dout, N, OC, (write & 4u) != 0);
}

/* The bias goes into the primitives (added to each tile's sums as they are
 * stored, the same fp32 sum as starting C from the bias), not a pass of its
 * own over out. */
void tr_cpu_linear_forward_bf16(float *out, const uint16_t *inp, const uint16_t *w,
                                const float *bias, int N, int IC, int OC)
{
    tr_cpu_gemm_bf16_bias(0, 1, N, OC, IC, inp, IC, w, IC, bias, out, OC, NULL);
}

void tr_cpu_linear_forward_bf16_out16(uint16_t *out, const uint16_t *inp, const uint16_t *w,
                                      const float *bias, int N, int IC, int OC)
{
    tr_cpu_gemm_bf16_bias(0, 1, N, OC, IC, inp, IC, w, IC, bias, NULL, OC, out);
}

void tr_cpu_linear_backward_bf16(float *dinp, float *dw, const uint16_t *dout,
                                 const uint16_t *inp, const uint16_t *w, int N, int IC, int OC,
                                 unsigned write)
{
    linear_backward(&BF16, dinp, dw, dout, inp, w, N, IC, OC, write);
}

/*
 * A whole block of COLUMN_BLOCK columns with its sums in vector registers
 * for all N rows: each row's segment is loaded once, added, and (with
 * dout16) rounded to bf16 in registers and stored (bf16_lanes.h: the bits of
 * tr_f32_to_bf16).  Each column is the same float additions in the same row
 * order as the portable loop, so the sums are its bits.  The portable loop
 * called the array conversion once per 64-float row segment, and it and the
 * sums read each segment twice; in a native bf16 run of the 6 x 384 GPT,
 * tr_cpu_to_bf16_serial took 6.6% of the CPU time, a third of it called from
 * here (perf, Zen 4).
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "bf16_lanes.h"
#define LINEAR_HAVE_X86 1
_Static_assert(COLUMN_BLOCK == 64, "the vector blocks below are 4 x 16 and 8 x 8 columns");

static __attribute__((target("avx512f"))) void bias_block_avx512(float *sum, uint16_t *dout16,
                                                                   const float *dout, int N,
                                                                   int OC)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int n = 0; n < N; n++) {
        const float *row = dout + (size_t)n * OC;
        __m512 x0 = _mm512_loadu_ps(row), x1 = _mm512_loadu_ps(row + 16);
        __m512 x2 = _mm512_loadu_ps(row + 32), x3 = _mm512_loadu_ps(row + 48);
        s0 = _mm512_add_ps(s0, x0), s1 = _mm512_add_ps(s1, x1);
        s2 = _mm512_add_ps(s2, x2), s3 = _mm512_add_ps(s3, x3);
        if (dout16 != NULL) {
            uint16_t *h = dout16 + (size_t)n * OC;
            tr_bf16_store16(h, x0), tr_bf16_store16(h + 16, x1);
            tr_bf16_store16(h + 32, x2), tr_bf16_store16(h + 48, x3);
        }
    }
    _mm512_storeu_ps(sum, s0), _mm512_storeu_ps(sum + 16, s1);
    _mm512_storeu_ps(sum + 32, s2), _mm512_storeu_ps(sum + 48, s3);
}

/* the same, 8 lanes wide: eight registers of sums */
static __attribute__((target("avx2"))) void bias_block_avx2(float *sum, uint16_t *dout16,
                                                              const float *dout, int N, int OC)
{
    __m256 s[8];
    for (int k = 0; k < 8; k++)
        s[k] = _mm256_setzero_ps();
    for (int n = 0; n < N; n++) {
        const float *row = dout + (size_t)n * OC;
        for (int k = 0; k < 8; k++) {
            __m256 x = _mm256_loadu_ps(row + 8 * k);
            s[k] = _mm256_add_ps(s[k], x);
            if (dout16 != NULL)
                tr_bf16_store8(dout16 + (size_t)n * OC + 8 * k, x);
        }
    }
    for (int k = 0; k < 8; k++)
        _mm256_storeu_ps(sum + 8 * k, s[k]);
}
#endif

/* dbias (+)= the column sums of dout[N,OC]; with dout16, each row segment
 * also rounded to bf16 into dout16 as it is read.  Each block of columns
 * belongs to one thread and sums the rows in order, so the result does not
 * depend on the thread count; the inner loop runs along a contiguous row.
 * Whole blocks run in vector registers where the CPU has AVX-512 or AVX2
 * (the elementwise path: the same bits). */
static void bias_sums(float *dbias, uint16_t *dout16, const float *dout, int N, int OC,
                      int write)
{
    int blocks = (OC + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    int path = tr_cpu_elementwise_path();
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int o0 = blk * COLUMN_BLOCK;
        int width = OC - o0 < COLUMN_BLOCK ? OC - o0 : COLUMN_BLOCK;
        float sum[COLUMN_BLOCK] = {0};
        uint16_t *h16 = dout16 != NULL ? dout16 + o0 : NULL;
#ifdef LINEAR_HAVE_X86
        if (width == COLUMN_BLOCK && path == TR_CPU_EW_AVX512)
            bias_block_avx512(sum, h16, dout + o0, N, OC);
        else if (width == COLUMN_BLOCK && path == TR_CPU_EW_AVX2)
            bias_block_avx2(sum, h16, dout + o0, N, OC);
        else
#endif
            for (int n = 0; n < N; n++) {
                const float *row = dout + (size_t)n * OC + o0;
                if (h16 != NULL)
                    tr_cpu_to_bf16_serial(h16 + (size_t)n * OC, row, (size_t)width);
                for (int j = 0; j < width; j++)
                    sum[j] += row[j];
            }
        for (int j = 0; j < width; j++)
            dbias[o0 + j] = write ? sum[j] : dbias[o0 + j] + sum[j];
    }
    (void)path;
}

void tr_cpu_linear_bias_backward(float *dbias, const float *dout, int N, int OC, int write)
{
    bias_sums(dbias, NULL, dout, N, OC, write);
}

void tr_cpu_linear_dout_bf16(uint16_t *dout16, float *dbias, const float *dout, int N, int OC,
                             int write_bias)
{
    if (dbias == NULL)
        tr_cpu_to_bf16(dout16, dout, (size_t)N * OC);
    else /* the same sums, in the same pass as the rounding */
        bias_sums(dbias, dout16, dout, N, OC, write_bias);
}

/* Many small products are better spread one per thread; few large ones are
 * better left to the GEMM's own threading.  Either way each product is
 * computed the same way, so the choice never changes the result. */
static int spread_over_batch(int batch)
{
    return batch > 1 && batch >= omp_get_max_threads();
}

static void matmul_forward(const struct gemm_kind *k, float *out, const void *a, const void *bm,
                           int batch, int M, int K, int N, int trans_b)
{
    size_t a_size = (size_t)M * K, b_size = (size_t)K * N, out_size = (size_t)M * N;
    int ldb = trans_b ? K : N;
    if (spread_over_batch(batch)) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < batch; i++)
            k->serial(0, trans_b, M, N, K, at(k, a, i * a_size), K, at(k, bm, i * b_size), ldb,
                      0.0f, out + i * out_size, N);
    } else {
        for (int i = 0; i < batch; i++)
            k->threaded(0, trans_b, M, N, K, at(k, a, i * a_size), K, at(k, bm, i * b_size), ldb,
                        0.0f, out + i * out_size, N);
    }
}

/* Gradients of one product out = a @ op(bm); `gemm` is the kind's serial or
 * threaded GEMM (bitwise the same results). */
static void matmul_backward_one(gemm_fn gemm, float *da, float *dbm, const void *dout,
                                const void *a, const void *bm, int M, int K, int N, int trans_b)
{
    if (trans_b) {
        /* bm stored [N,K]: out = a @ bm^T */
        if (da != NULL) /* da[M,K] += dout[M,N] @ bm[N,K] */
            gemm(0, 0, M, K, N, dout, N, bm, K, 1.0f, da, K);
        if (dbm != NULL) /* dbm[N,K] += dout^T[N,M] @ a[M,K] */
            gemm(1, 0, N, K, M, dout, N, a, K, 1.0f, dbm, K);
    } else {
        /* bm stored [K,N]: out = a @ bm */
        if (da != NULL) /* da[M,K] += dout[M,N] @ bm^T[N,K] */
            gemm(0, 1, M, K, N, dout, N, bm, N, 1.0f, da, K);
        if (dbm != NULL) /* dbm[K,N] += a^T[K,M] @ dout[M,N] */
            gemm(1, 0, K, N, M, a, K, dout, N, 1.0f, dbm, N);
    }
}

static void matmul_backward(const struct gemm_kind *k, float *da, float *dbm, const void *dout,
                            const void *a, const void *bm, int batch, int M, int K, int N,
                            int trans_b)
{
    size_t a_size = (size_t)M * K, b_size = (size_t)K * N, out_size = (size_t)M * N;
    if (spread_over_batch(batch)) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < batch; i++)
            matmul_backward_one(k->serial, da ? da + i * a_size : NULL,
                                dbm ? dbm + i * b_size : NULL, at(k, dout, i * out_size),
                                at(k, a, i * a_size), at(k, bm, i * b_size), M, K, N, trans_b);
    } else {
        /* outside any parallel region: each GEMM spreads its own tiles */
        for (int i = 0; i < batch; i++)
            matmul_backward_one(k->threaded, da ? da + i * a_size : NULL,
                                dbm ? dbm + i * b_size : NULL, at(k, dout, i * out_size),
                                at(k, a, i * a_size), at(k, bm, i * b_size), M, K, N, trans_b);
    }
}

void tr_cpu_matmul_forward(float *out, const float *a, const float *bm, int batch, int M, int K,
                           int N, int trans_b)
{
    matmul_forward(&F32, out, a, bm, batch, M, K, N, trans_b);
}

void tr_cpu_matmul_backward(float *da, float *dbm, const float *dout, const float *a,
                            const float *bm, int batch, int M, int K, int N, int trans_b)
{
    matmul_backward(&F32, da, dbm, dout, a, bm, batch, M, K, N, trans_b);
}

void tr_cpu_matmul_forward_bf16(float *out, const uint16_t *a, const uint16_t *bm, int batch,
                                int M, int K, int N, int trans_b)
{
    matmul_forward(&BF16, out, a, bm, batch, M, K, N, trans_b);
}

void tr_cpu_matmul_backward_bf16(float *da, float *dbm, const uint16_t *dout, const uint16_t *a,
                                 const uint16_t *bm, int batch, int M, int K, int N, int trans_b)
{
    matmul_backward(&BF16, da, dbm, dout, a, bm, batch, M, K, N, trans_b);
}

void tr_cpu_lora_merge(float *w, const float *a, const float *b, int64_t out, int64_t in, int r,
                       float scale)
{
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; o++) {
        float *row = w + o * in;
        const float *bo = b + o * r;
        for (int64_t i = 0; i < in; i++) {
            float d = 0.0f;
            for (int k = 0; k < r; k++)
                d += bo[k] * a[(int64_t)k * in + i];
            row[i] += d * scale;
        }
    }
}
