/*
 * cudacpu: __half and the conversions the CUDA backend uses, with the GPU's
 * rounding (cvt.rn.f16.f32: round to nearest even, subnormals kept, overflow
 * to infinity, NaN becomes the canonical 0x7fff).
 */
#ifndef CUDACPU_CUDA_FP16_H
#define CUDACPU_CUDA_FP16_H

#include "cuda_runtime.h"

struct __half {
    uint16_t __x;
};
typedef __half half;

inline __half __float2half_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    __half r;
    if (a > 0x7f800000u) {
        r.__x = 0x7fffu;
        return r;
    }
    uint32_t h;
    if (a >= 0x38800000u) { /* normal in fp16, or overflow */
        /* add half an ulp of fp16 (13 dropped bits), ties to even */
        uint32_t t = a + 0xfffu + ((a >> 13) & 1u);
        h = t >= 0x47800000u ? 0x7c00u : (t - 0x38000000u) >> 13;
    } else { /* subnormal or zero: shift the full significand */
        int e = (int)(a >> 23);
        if (e < 102) { /* below a quarter of the smallest subnormal: 0 */
            h = 0;
        } else {
            uint32_t m = (a & 0x7fffffu) | 0x800000u;
            int shift = 126 - e; /* 14 .. 24 */
            h = m >> shift;
            uint32_t rest = m & ((1u << shift) - 1u), half_ulp = 1u << (shift - 1);
            if (rest > half_ulp || (rest == half_ulp && (h & 1u)))
                h++;
        }
    }
    r.__x = (uint16_t)(sign | h);
    return r;
}
inline __half __float2half(float f) { return __float2half_rn(f); }

inline float __half2float(__half x)
{
    uint32_t h = x.__x, sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
