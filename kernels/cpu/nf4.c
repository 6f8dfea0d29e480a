/*
 * NF4 dequantisation (kernels/nf4.h) on the CPU: the frozen NF4 weight of a
 * linear node becomes fp32 or bf16 in scratch before its GEMM, every forward
 * and backward, so this runs once per weight per pass and should cost little
 * next to the GEMM that follows.
 *
 * Each block of 64 has one scale, tr_nf4_scales' (the product and the sum
 * rounded apart, computed a span of blocks at a time in kernels/nf4.c,
 * where no fused multiply-add can creep in); a value is NF4[code] * scale,
 * one rounded product.  The AVX-512 path looks the 16 codes of a vector up with one
 * permute, the AVX2 path with two permutes and a blend; both store products
 * of the same two floats as the portable loop, so all three give
 * tr_nf4_dequantize's bits (and bf16: those values rounded as
 * tr_f32_to_bf16, by AVX512-BF16's conversion where the CPU has it and no
 * value is subnormal).  The path is tr_cpu_elementwise_path()'s, so tests can
 * cap it and compare.
 */
#include "../nf4.h"
#include "kernels.h"

#include <string.h>

/* one value of the blob, portable: what every path computes */
static float value_at(const unsigned char *codes, size_t i, float scale)
{
    unsigned c = codes[i / 2];
    return tr_nf4_table[i % 2 ? c & 15u : c >> 4] * scale;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "bf16_lanes.h"
#define NF4_HAVE_X86 1
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2")))

/* Half h of one block's 32 code bytes: its 32 values, 16 a vector: the
 * bytes widened to lanes, high and low nibbles interleaved as elements 2j,
 * 2j+1, looked up in the table held in one register, times the scale. */
static inline AVX512 void half_avx512(const unsigned char *c, int h, __m512 table, __m512 s,
                                      __m512 *v0, __m512 *v1)
{
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(c + 16 * h)));
    __m512i hi = _mm512_srli_epi32(b, 4), lo = _mm512_and_si512(b, _mm512_set1_epi32(15));
    *v0 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, first, lo), table), s);
    *v1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, second, lo), table), s);
}

/* The 64 values of one block into f32, or rounded into bf16 */
static inline AVX512 void block_avx512(const unsigned char *c, float scale, float *f32,
                                       uint16_t *bf16)
{
    const __m512 table = _mm512_loadu_ps(tr_nf4_table), s = _mm512_set1_ps(scale);
    for (int h = 0; h < 2; h++) {
        __m512 v0, v1;
        half_avx512(c, h, table, s, &v0, &v1);
        if (f32) {
            _mm512_storeu_ps(f32 + 32 * h, v0);
            _mm512_storeu_ps(f32 + 32 * h + 16, v1);
        } else {
            tr_bf16_store16(bf16 + 32 * h, v0);
            tr_bf16_store16(bf16 + 32 * h + 16, v1);
        }
    }
}

#ifdef TR_BF16_HAVE_CVT
/* block_avx512 to bf16 with the CPU's conversion, 32 values an instruction
 * (tr_bf16_store32_cvt: subnormals take the integer rounding) */
static inline __attribute__((target("avx512f,avx512bf16"))) void
block_avx512bf16(const unsigned char *c, float scale, uint16_t *bf16)
{
    const __m512 table = _mm512_loadu_ps(tr_nf4_table), s = _mm512_set1_ps(scale);
    for (int h = 0; h < 2; h++) {
        __m512 v0, v1;
        half_avx512(c, h, table, s, &v0, &v1);
        tr_bf16_store32_cvt(bf16 + 32 * h, v0, v1);
    }
}
#endif

/* The same 8 at a time: the table in two registers of 8, picked between by
 * the code's bit 3 (shifted into the sign bit blendv reads). */
static inline AVX2 __m256 lookup8(__m256i idx, __m256 low, __m256 high)
{
    __m256 a = _mm256_permutevar8x32_ps(low, idx), b = _mm256_permutevar8x32_ps(high, idx);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

static inline AVX2 void block_avx2(const unsigned char *c, float scale, float *f32, uint16_t *bf16)
{
    const __m256 low = _mm256_loadu_ps(tr_nf4_table), high = _mm256_loadu_ps(tr_nf4_table + 8);
    const __m256 s = _mm256_set1_ps(scale);
    for (int q = 0; q < 4; q++) { /* 8 bytes: 16 values */
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(c + 8 * q)));
        __m256i hi = _mm256_srli_epi32(b, 4), lo = _mm256_and_si256(b, _mm256_set1_epi32(15));
        /* per 128-bit half: (hi0 lo0 hi1 lo1 | hi4 lo4 hi5 lo5) and (hi2 .. lo3 | hi6 .. lo7) */
        __m256i ul = _mm256_unpacklo_epi32(hi, lo), uh = _mm256_unpackhi_epi32(hi, lo);
        __m256i i0 = _mm256_permute2x128_si256(ul, uh, 0x20), i1 = _mm256_permute2x128_si256(ul, uh, 0x31);
        __m256 v0 = _mm256_mul_ps(lookup8(i0, low, high), s);
        __m256 v1 = _mm256_mul_ps(lookup8(i1, low, high), s);
        if (f32) {
            _mm256_storeu_ps(f32 + 16 * q, v0);
            _mm256_storeu_ps(f32 + 16 * q + 8, v1);
        } else {
            tr_bf16_store8(bf16 + 16 * q, v0);
            tr_bf16_store8(bf16 + 16 * q + 8, v1);
        }
    }
}
#endif

/* Elements [first, first + count) on the calling thread into f32 or (f32
 * NULL) bf16, at most SPAN_BLOCKS blocks: partial blocks at the ends value
 * by value, whole blocks on `path`. */
enum { SPAN_BLOCKS = 256 };

static void span(float *f32, uint16_t *bf16, const void *blob, size_t n, size_t first,
                 size_t count, int path)
{
    const unsigned char *codes = (const unsigned char *)blob + tr_nf4_parts(n).codes;
    size_t i = first, end = first + count, b0 = first / TR_NF4_BLOCK;
    float scales[SPAN_BLOCKS + 1];
    tr_nf4_scales(scales, blob, n, b0, (end - 1) / TR_NF4_BLOCK - b0 + 1);
    while (i < end) {
        size_t b = i / TR_NF4_BLOCK, block_end = (b + 1) * TR_NF4_BLOCK;
        float scale = scales[b - b0];
        size_t at = i - first;
        if (i % TR_NF4_BLOCK == 0 && block_end <= end && path != TR_CPU_EW_PORTABLE) {
#ifdef NF4_HAVE_X86
            const unsigned char *c = codes + i / 2;
#ifdef TR_BF16_HAVE_CVT
            if (path == TR_CPU_EW_AVX512 && !f32 && tr_cpu_bf16_convert_native())
                block_avx512bf16(c, scale, bf16 + at);
            else
#endif
            if (path == TR_CPU_EW_AVX512)
                block_avx512(c, scale, f32 ? f32 + at : NULL, f32 ? NULL : bf16 + at);
            else
                block_avx2(c, scale, f32 ? f32 + at : NULL, f32 ? NULL : bf16 + at);
#endif
            i = block_end;
            continue;
        }
        size_t stop = block_end < end ? block_end : end;
        for (; i < stop; i++, at++) {
            float v = value_at(codes, i, scale);
            if (f32)
                f32[at] = v;
            else
                bf16[at] = tr_f32_to_bf16(v);
        }
    }
}

/* Spans of SPAN_BLOCKS whole blocks spread over the threads. */

static void dequantize(float *f32, uint16_t *bf16, const void *blob, size_t n, size_t first,
                       size_t count)
{
    int path = tr_cpu_elementwise_path();
#ifndef NF4_HAVE_X86
    path = TR_CPU_EW_PORTABLE;
#endif
    const size_t chunk = (size_t)SPAN_BLOCKS * TR_NF4_BLOCK;
    size_t start = first / chunk * chunk, end = first + count;
    size_t chunks = count ? (end - start + chunk - 1) / chunk : 0;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t k = 0; k < chunks; k++) {
        size_t a = start + k * chunk, b = a + chunk;
        if (a < first)
            a = first;
        if (b > end)
            b = end;
        span(f32 ? f32 + (a - first) : NULL, f32 ? NULL : bf16 + (a - first), blob, n, a, b - a,
             path);
    }
}

void tr_cpu_nf4_to_f32(float *dst, const void *blob, size_t n, size_t first, size_t count)
{
    dequantize(dst, NULL, blob, n, first, count);
}

void tr_cpu_nf4_to_bf16(uint16_t *dst, const void *blob, size_t n, size_t first, size_t count)
{
    dequantize(NULL, dst, blob, n, first, count);
}
