/* Conversions between fp32 and the 16-bit float formats, round to nearest
 * even (NaN stays NaN, overflow to fp16 gives inf). */
#include "kernels.h"

#include <string.h>

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t tr_f32_to_bf16(float f)
{
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tr_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t tr_f32_to_f16(float f)
{
    uint32_t u = bits_of(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (abs >= 0x477ff000u)                /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* subnormal in fp16 (or zero) */
        if (abs < 0x33000000u)
            return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(abs >> 23); /* 14..24 */
        uint32_t half = mant >> shift;
        uint32_t rest = mant & ((1u << shift) - 1u), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((abs - 0x38000000u) >> 13); /* rebias exponent 127 -> 15 */
    uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

float tr_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0)
            return float_of(sign);
        /* subnormal: normalise */
        int e = -1;
        do {
            mant <<= 1;
            e++;
        } while (!(mant & 0x400u));
        return float_of(sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13));
    }
    if (exp == 31)
        return float_of(sign | 0x7f800000u | (mant << 13));
    return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

/*
 * fp32 -> bf16 over arrays: the GEMM inputs of every bf16 step pass through
 * here, so it runs 16 lanes at a time where the CPU has AVX-512, with the
 * same integer rounding as tr_f32_to_bf16 (round to nearest even, NaN kept
 * quiet), bit for bit.  Where the CPU has AVX512-BF16, VCVTNE2PS2BF16 does
 * the same 32 floats at a time: it rounds to nearest even and quiets a NaN
 * the same way ((bits >> 16) | 0x40, the SDM's pseudocode, and checked on
 * all 2^32 inputs on Zen 5), but flushes subnormal inputs to zero where
 * tr_f32_to_bf16 rounds them, so a vector with a subnormal in it takes the
 * integer path instead.
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "bf16_lanes.h"
#define BF16_HAVE_X86 1 /* the AVX-512 and AVX2 paths below, picked at run time */
#define AVX512 __attribute__((target("avx512f")))

/* the bf16 bits of 16 floats, in the low half of each 32-bit lane */
static inline AVX512 __m512i bf16_bits16(const float *in)
{
    return tr_bf16_lanes16(_mm512_loadu_si512((const void *)in));
}

static AVX512 void to_bf16_avx512(uint16_t *out, const float *in, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        tr_bf16_store16(out + i, _mm512_loadu_ps(in + i));
    for (; i < n; i++)
        out[i] = tr_f32_to_bf16(in[i]);
}

#ifdef TR_BF16_HAVE_CVT
#define AVX512BF16 __attribute__((target("avx512f,avx512bf16")))

static AVX512BF16 void to_bf16_avx512bf16(uint16_t *out, const float *in, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        tr_bf16_store32_cvt(out + i, _mm512_loadu_ps(in + i), _mm512_loadu_ps(in + i + 16));
    to_bf16_avx512(out + i, in + i, n - i); /* 16 at a time, then one by one */
}
#endif

int tr_cpu_bf16_convert_native(void)
{
#ifdef TR_BF16_HAVE_CVT
    static int cached = -1;
    int use = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (use < 0) {
        __builtin_cpu_init();
        use = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
        __atomic_store_n(&cached, use, __ATOMIC_RELAXED);
    }
    return use;
#else
    return 0;
#endif
}

/* bf16 -> fp32 is exact: the bits, 16 places up */
static AVX512 void from_bf16_avx512(float *out, const uint16_t *in, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(in + i));
        _mm512_storeu_si512((void *)(out + i), _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (; i < n; i++)
        out[i] = tr_bf16_to_f32(in[i]);
}

static AVX512 void round_bf16_avx512(float *out, const float *in, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_si512((void *)(out + i), _mm512_slli_epi32(bf16_bits16(in + i), 16));
    for (; i < n; i++)
        out[i] = tr_bf16_to_f32(tr_f32_to_bf16(in[i]));
}

/* The same three, 8 lanes at a time, where the CPU has AVX2 but not AVX-512
 * (per element they took about 2 ns each on a Zen 3, a third of an emulated
 * bf16 step's extra time over fp32). */
#define AVX2 __attribute__((target("avx2")))

static inline AVX2 __m256i bf16_bits8(const float *in)
{
    return tr_bf16_lanes8(_mm256_loadu_si256((const __m256i *)(const void *)in));
}

static AVX2 void to_bf16_avx2(uint16_t *out, const float *in, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* lanes hold at most 0xffff: the unsigned saturating pack is exact;
         * it interleaves the 128-bit halves, the permute puts them back */
        __m256i packed = _mm256_packus_epi32(bf16_bits8(in + i), bf16_bits8(in + i + 8));
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm256_permute4x64_epi64(packed, 0xd8));
    }
    for (; i < n; i++)
        out[i] = tr_f32_to_bf16(in[i]);
}

static AVX2 void from_bf16_avx2(float *out, const uint16_t *in, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        _mm256_storeu_si256((__m256i *)(void *)(out + i),
                            _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    for (; i < n; i++)
        out[i] = tr_bf16_to_f32(in[i]);
}

static AVX2 void round_bf16_avx2(float *out, const float *in, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm256_slli_epi32(bf16_bits8(in + i), 16));
    for (; i < n; i++)
        out[i] = tr_bf16_to_f32(tr_f32_to_bf16(in[i]));
}
#endif

int tr_cpu_avx512f(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static int cached = -1;
    int use = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (use < 0) {
        __builtin_cpu_init();
        use = __builtin_cpu_supports("avx512f");
        __atomic_store_n(&cached, use, __ATOMIC_RELAXED);
    }
    return use;
#else
    return 0;
#endif
}

/* Blocks of whole cache lines, spread over the threads. */
enum { CONVERT_BLOCK = 16384 };

void tr_cpu_to_bf16(uint16_t *out, const float *in, size_t n)
{
    size_t blocks = (n + CONVERT_BLOCK - 1) / CONVERT_BLOCK;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t i0 = b * CONVERT_BLOCK, len = n - i0 < CONVERT_BLOCK ? n - i0 : CONVERT_BLOCK;
        tr_cpu_to_bf16_serial(out + i0, in + i0, len);
    }
}

void tr_cpu_to_bf16_serial(uint16_t *out, const float *in, size_t n)
{
#ifdef BF16_HAVE_X86
    int path = tr_cpu_elementwise_path();
#ifdef TR_BF16_HAVE_CVT
    if (path == TR_CPU_EW_AVX512 && tr_cpu_bf16_convert_native()) {
        to_bf16_avx512bf16(out, in, n);
        return;
    }
#endif
    if (path == TR_CPU_EW_AVX512) {
        to_bf16_avx512(out, in, n);
        return;
    }
    if (path == TR_CPU_EW_AVX2) {
        to_bf16_avx2(out, in, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        out[i] = tr_f32_to_bf16(in[i]);
}

/* One span on the calling thread, both ways: tr_cpu_from_half runs these on
 * its blocks, and the kernels that read and write 16-bit activations on the
 * tiles of their own parallel loops (kernels.h). */
void tr_cpu_to_half_serial(uint16_t *out, const float *in, size_t n, int bf16)
{
    if (bf16) {
        tr_cpu_to_bf16_serial(out, in, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = tr_f32_to_f16(in[i]);
}

void tr_cpu_from_half_serial(float *out, const uint16_t *in, size_t n, int bf16)
{
    if (!bf16) {
        for (size_t i = 0; i < n; i++)
            out[i] = tr_f16_to_f32(in[i]);
        return;
    }
#ifdef BF16_HAVE_X86
    int path = tr_cpu_elementwise_path();
    if (path == TR_CPU_EW_AVX512) {
        from_bf16_avx512(out, in, n);
        return;
    }
    if (path == TR_CPU_EW_AVX2) {
        from_bf16_avx2(out, in, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        out[i] = tr_bf16_to_f32(in[i]);
}

void tr_cpu_to_half(uint16_t *out, const float *in, size_t n, int bf16)
{
    if (bf16) {
        tr_cpu_to_bf16(out, in, n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = tr_f32_to_f16(in[i]);
}

void tr_cpu_from_half(float *out, const uint16_t *in, size_t n, int bf16)
{
    /* 16-bit activations are widened here before the ops that do not read
     * them as stored (backend.c): per element through tr_bf16_to_f32 this
     * took a sixth of a bf16 step's CPU time */
    if (bf16) {
        size_t blocks = (n + CONVERT_BLOCK - 1) / CONVERT_BLOCK;
#pragma omp parallel for schedule(static) if (blocks > 1)
        for (size_t b = 0; b < blocks; b++) {
            size_t i0 = b * CONVERT_BLOCK, len = n - i0 < CONVERT_BLOCK ? n - i0 : CONVERT_BLOCK;
            tr_cpu_from_half_serial(out + i0, in + i0, len, 1);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = tr_f16_to_f32(in[i]);
}

void tr_cpu_round_to_half(float *out, const float *in, size_t n, int bf16)
{
#ifdef BF16_HAVE_X86
    int path = bf16 ? tr_cpu_elementwise_path() : TR_CPU_EW_PORTABLE;
    if (path != TR_CPU_EW_PORTABLE) {
        size_t blocks = (n + CONVERT_BLOCK - 1) / CONVERT_BLOCK;
#pragma omp parallel for schedule(static) if (blocks > 1)
        for (size_t b = 0; b < blocks; b++) {
            size_t i0 = b * CONVERT_BLOCK, len = n - i0 < CONVERT_BLOCK ? n - i0 : CONVERT_BLOCK;
            if (path == TR_CPU_EW_AVX512)
                round_bf16_avx512(out + i0, in + i0, len);
            else
                round_bf16_avx2(out + i0, in + i0, len);
        }
        return;
    }
#endif
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = bf16 ? tr_bf16_to_f32(tr_f32_to_bf16(in[i])) : tr_f16_to_f32(tr_f32_to_f16(in[i]));
}
