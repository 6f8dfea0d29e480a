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

void tr_cpu_to_half(uint16_t *out, const float *in, size_t n, int bf16)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = bf16 ? tr_f32_to_bf16(in[i]) : tr_f32_to_f16(in[i]);
}

void tr_cpu_from_half(float *out, const uint16_t *in, size_t n, int bf16)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = bf16 ? tr_bf16_to_f32(in[i]) : tr_f16_to_f32(in[i]);
}

void tr_cpu_round_to_half(float *out, const float *in, size_t n, int bf16)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = bf16 ? tr_bf16_to_f32(tr_f32_to_bf16(in[i])) : tr_f16_to_f32(tr_f32_to_f16(in[i]));
}
