/*
 * Rank-r products: fp32 GEMMs whose inner dimension K is at most
 * TR_CPU_RANK_MAX (32), the adapter's low-rank products
 * (core/engine/adapters.c, rank r):
 *
 *     forward   y   = y_base + a_s B^T    M = rows, N = out, K = r  (onto)
 *     backward  dx += da A                M = rows, N = in,  K = r  (beta 1)
 *
 * oneDNN's sgemm is built for a long K: with K = 16 each tile's product
 * goes through its packing for a handful of FMAs a value, and an onto
 * product then adds C0 in a second pass (2 threads, Xeon 4th gen, 1024 rows:
 * 1536 wide 0.53 ms, 576 wide 0.22 ms).  Here a thread packs op(B) once
 * (K x N floats, shared by the threads), and for each 4-row block of C
 * packs those rows of op(A) (4 x K) and sums a 4 x 64 block in 16 registers
 * over the whole of K, in order, adding C0 or C as it stores the block
 * (0.30 and 0.11 ms).  Every element of C is one chain of fp32 FMAs from
 * zero in k order, then + C0 (or + C): the bits depend on the shape alone,
 * never on the thread count, and an onto product is still C0 plus the plain
 * product bit for bit.  Narrow outputs (N below TR_CPU_RANK_MIN_N: a
 * grouped-query key/value projection's 192) stay with oneDNN, which runs
 * them faster; bf16 products too (oneDNN's AMX runs the dx product 1.8x
 * faster than these FMAs).  Only where the CPU has AVX-512.
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define RANK_HAVE_X86 1
#define AVX512 __attribute__((target("avx512f")))
#endif

int tr_cpu_rank_gemm_takes(int M, int N, int K)
{
#ifdef RANK_HAVE_X86
    return M > 0 && K > 0 && K <= TR_CPU_RANK_MAX && N >= TR_CPU_RANK_MIN_N && tr_cpu_avx512f();
#else
    (void)M, (void)N, (void)K;
    return 0;
#endif
}

#ifdef RANK_HAVE_X86

enum { MR = 4, NW = 64 }; /* a block of C: 4 rows x 4 vectors, 16 accumulators */

/* Panels, grown on first use and kept for the thread's life (a step asks
 * for the same sizes every time): op(B), packed by the threads together
 * into the calling thread's, and each thread's rows of op(A) and block. */
struct buffer {
    float *p;
    size_t cap;
};
static _Thread_local struct buffer b_buf, own_buf;

static float *grow(struct buffer *b, size_t floats)
{
    if (floats > b->cap) {
        free(b->p);
        b->p = NULL;
        b->cap = 0;
        void *p = NULL;
        if (posix_memalign(&p, 64, floats * sizeof(float)) != 0) {
            fprintf(stderr, "trainrun: out of memory for a GEMM panel (%zu floats)\n", floats);
            abort();
        }
        b->p = p;
        b->cap = floats;
    }
    return b->p;
}

/* op(A)'s rows i0.. (rows of them, zeros after) as ap[r * K + k] */
static void pack_a(const struct tr_cpu_rank_gemm *p, float *ap, int i0, int rows)
{
    for (int r = 0; r < MR; r++)
        for (int k = 0; k < p->K; k++)
            ap[r * p->K + k] = r >= rows           ? 0.0f
                               : p->trans_a ? p->A[(size_t)k * p->lda + i0 + r]
                                            : p->A[(size_t)(i0 + r) * p->lda + k];
}

/* op(B)'s column block cb (NW columns, zeros past N) as bp[k * NW + c] */
static AVX512 void pack_b(const struct tr_cpu_rank_gemm *p, float *bp, int cb)
{
    int j0 = cb * NW, cols = p->N - j0 < NW ? p->N - j0 : NW;
    for (int k = 0; k < p->K; k++) {
        float *row = bp + (size_t)k * NW;
        if (!p->trans_b) { /* a row of storage: whole vectors */
            for (int c = 0; c < NW; c += 16) {
                int n = cols - c < 0 ? 0 : cols - c < 16 ? cols - c : 16;
                __mmask16 m = (__mmask16)(n == 16 ? 0xffffu : (1u << n) - 1u);
                _mm512_store_ps(row + c,
                                _mm512_maskz_loadu_ps(m, p->B + (size_t)k * p->ldb + j0 + c));
            }
            continue;
        }
        for (int c = 0; c < NW; c++)
            row[c] = c < cols ? p->B[(size_t)(j0 + c) * p->ldb + k] : 0.0f;
    }
}

/* C's block at rows i0.., columns j0..: the sums over k, in order, of
 * op(A)[r][k] * op(B)[k][c], each lane one chain of FMAs from zero, then
 * + C0 or + C as asked, stored in the valid rows and lanes. */
static AVX512 void block(const struct tr_cpu_rank_gemm *p, const float *ap, const float *bp,
                         int i0, int rows, int j0)
{
    int K = p->K, cols = p->N - j0 < NW ? p->N - j0 : NW;
    __m512 s[MR][4];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 4; v++)
            s[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 b[4];
        for (int v = 0; v < 4; v++)
            b[v] = _mm512_load_ps(bp + (size_t)k * NW + 16 * v);
        for (int r = 0; r < MR; r++) {
            __m512 x = _mm512_set1_ps(ap[r * K + k]);
            for (int v = 0; v < 4; v++)
                s[r][v] = _mm512_fmadd_ps(x, b[v], s[r][v]);
        }
    }
    for (int r = 0; r < rows; r++) {
        size_t at = (size_t)(i0 + r) * p->ldc + j0;
        for (int v = 0; v < 4 && 16 * v < cols; v++) {
            int n = cols - 16 * v < 16 ? cols - 16 * v : 16;
            __mmask16 m = (__mmask16)(n == 16 ? 0xffffu : (1u << n) - 1u);
            __m512 y = s[r][v];
            if (p->C0 != NULL)
                y = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p->C0 + at + 16 * v), y);
            else if (p->accumulate)
                y = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p->C + at + 16 * v), y);
            _mm512_mask_storeu_ps(p->C + at + 16 * v, m, y);
        }
    }
}

/* Row block rb of C against every column block of the packed op(B). */
static void row_block(const struct tr_cpu_rank_gemm *p, const float *bp, int rb)
{
    float *ap = grow(&own_buf, (size_t)MR * p->K);
    int i0 = rb * MR, rows = p->M - i0 < MR ? p->M - i0 : MR;
    pack_a(p, ap, i0, rows);
    for (int j0 = 0; j0 < p->N; j0 += NW)
        block(p, ap, bp + (size_t)(j0 / NW) * p->K * NW, i0, rows, j0);
}

void tr_cpu_rank_gemm(const struct tr_cpu_rank_gemm *p, int threaded)
{
    int col_blocks = (p->N + NW - 1) / NW, row_blocks = (p->M + MR - 1) / MR;
    float *bp = grow(&b_buf, (size_t)col_blocks * p->K * NW);
    if (!threaded) {
        for (int cb = 0; cb < col_blocks; cb++)
            pack_b(p, bp + (size_t)cb * p->K * NW, cb);
        for (int rb = 0; rb < row_blocks; rb++)
            row_block(p, bp, rb);
        return;
    }
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int cb = 0; cb < col_blocks; cb++)
            pack_b(p, bp + (size_t)cb * p->K * NW, cb);
#pragma omp for schedule(static)
        for (int rb = 0; rb < row_blocks; rb++)
            row_block(p, bp, rb);
    }
}

#else

void tr_cpu_rank_gemm(const struct tr_cpu_rank_gemm *p, int threaded)
{
    (void)p, (void)threaded;
    abort(); /* tr_cpu_rank_gemm_takes said no */
}

#endif
