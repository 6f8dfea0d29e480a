/*
 * fp32 -> bf16 rounding on values in vector registers, for the kernels that
 * produce a float vector and store it as bf16 without a second pass over
 * memory (convert.c's array conversions, AdamW's bf16 parameter copy).
 * Round to nearest even on the bits, NaN kept NaN and quiet
 * ((bits >> 16) | 0x40): tr_f32_to_bf16, lane for lane, subnormals included.
 * The lanes functions return the bf16 bits in the low half of each 32-bit
 * lane; the store functions round a float vector and store it as bf16.
 */
#ifndef TR_CPU_BF16_LANES_H
#define TR_CPU_BF16_LANES_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <stdint.h>

static inline __attribute__((target("avx512f"))) __m512i tr_bf16_lanes16(__m512i u)
{
    __m512i high = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
}

/* 8 lanes; the NaN test compares as signed: both sides are below 2^31 */
static inline __attribute__((target("avx2"))) __m256i tr_bf16_lanes8(__m256i u)
{
    __m256i high = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(r, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
}

/* 16 floats rounded and stored as 16 bf16 at dst */
static inline __attribute__((target("avx512f"))) void tr_bf16_store16(uint16_t *dst, __m512 x)
{
    _mm256_storeu_si256((__m256i *)(void *)dst,
                        _mm512_cvtepi32_epi16(tr_bf16_lanes16(_mm512_castps_si512(x))));
}

/* 8 floats rounded and stored as 8 bf16 at dst (lanes hold at most 0xffff:
 * the unsigned saturating pack is exact) */
static inline __attribute__((target("avx2"))) void tr_bf16_store8(uint16_t *dst, __m256 x)
{
    __m256i h = tr_bf16_lanes8(_mm256_castps_si256(x));
    _mm_storeu_si128((__m128i *)(void *)dst,
                     _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

/* compilers with the AVX512-BF16 intrinsics: 32 floats in one instruction
 * (VCVTNE2PS2BF16) where tr_cpu_bf16_convert_native() says the CPU has it */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define TR_BF16_HAVE_CVT 1

/* the lanes of u that hold a subnormal: exponent bits 0, mantissa bits not */
static inline __attribute__((target("avx512f"))) __mmask16 tr_bf16_subnormal16(__m512i u)
{
    return _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff)),
                                        u, _mm512_set1_epi32(0x7f800000));
}

/* lo then hi (32 floats) rounded and stored as 32 bf16 at dst: the CPU's
 * conversion rounds to nearest even as tr_f32_to_bf16 but flushes
 * subnormals to zero, so a pair holding one takes the integer rounding */
static inline __attribute__((target("avx512f,avx512bf16"))) void
tr_bf16_store32_cvt(uint16_t *dst, __m512 lo, __m512 hi)
{
    if ((tr_bf16_subnormal16(_mm512_castps_si512(lo)) |
         tr_bf16_subnormal16(_mm512_castps_si512(hi))) == 0) {
        _mm512_storeu_si512((void *)dst, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    } else {
        tr_bf16_store16(dst, lo);
        tr_bf16_store16(dst + 16, hi);
    }
}
#endif
#endif

#endif
