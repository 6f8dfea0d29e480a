/*
 * cudacpu: __nv_bfloat16 and the conversions the CUDA backend uses, with
 * the GPU's rounding (round to nearest even; NaN becomes the canonical
 * 0x7fff), so bf16 results match a GPU's bit for bit.
 */
#ifndef CUDACPU_CUDA_BF16_H
#define CUDACPU_CUDA_BF16_H

#include "cuda_runtime.h"

struct __nv_bfloat16 {
    uint16_t __x;
};
typedef __nv_bfloat16 nv_bfloat16;

inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.__x = 0x7fffu;
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* ties to even; carries into the exponent */
    r.__x = (uint16_t)(u >> 16);
    return r;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
