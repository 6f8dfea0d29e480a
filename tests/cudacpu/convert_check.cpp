/*
 * The harness's bf16/fp16 conversions (tests/cudacpu/include) round as the
 * CPU backend's (kernels/cpu/convert.c) do, bit for bit: both implement the
 * GPU's round-to-nearest-even, so a 16-bit value the CUDA kernels store on
 * the harness is the one the CPU reference stores.  Every 16-bit value back
 * to fp32, and fp32 values across the whole range (every rounding boundary
 * of each exponent, subnormals, overflow, infinities) to 16 bits.  NaN stays
 * NaN (payloads differ: the GPU's is canonical).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdio.h>

extern "C" {
uint16_t tr_f32_to_bf16(float f);
float tr_bf16_to_f32(uint16_t h);
uint16_t tr_f32_to_f16(float f);
float tr_f16_to_f32(uint16_t h);
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static int is_nan16(uint16_t h, bool bf16)
{
    return bf16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

static long failures;

static void check(uint32_t u)
{
    float f = float_of(u);
    uint16_t want_b = tr_f32_to_bf16(f), got_b = __float2bfloat16_rn(f).__x;
    uint16_t want_h = tr_f32_to_f16(f), got_h = __float2half_rn(f).__x;
    bool nan = f != f;
    if (nan ? !(is_nan16(got_b, true) && is_nan16(got_h, false))
            : (got_b != want_b || got_h != want_h)) {
        if (failures++ < 10)
            fprintf(stderr, "0x%08x (%.9g): bf16 0x%04x, CPU 0x%04x; fp16 0x%04x, CPU 0x%04x\n", u,
                    (double)f, got_b, want_b, got_h, want_h);
    }
}

int main(void)
{
    long checked = 0;
    for (uint32_t h = 0; h < 0x10000; h++) { /* every 16-bit value, both formats */
        __nv_bfloat16 b;
        __half x;
        b.__x = x.__x = (uint16_t)h;
        float want_b = tr_bf16_to_f32((uint16_t)h), want_h = tr_f16_to_f32((uint16_t)h);
        float got_b = __bfloat162float(b), got_h = __half2float(x);
        bool ok_b = want_b != want_b ? got_b != got_b : bits_of(got_b) == bits_of(want_b);
        bool ok_h = want_h != want_h ? got_h != got_h : bits_of(got_h) == bits_of(want_h);
        if (!ok_b || !ok_h) {
            if (failures++ < 10)
                fprintf(stderr, "0x%04x: bf16 %.9g (CPU %.9g), fp16 %.9g (CPU %.9g)\n", h,
                        (double)got_b, (double)want_b, (double)got_h, (double)want_h);
        }
        checked++;
    }
    /* each sign and exponent; mantissas near every bf16 and fp16 rounding
     * boundary (the low 16 and 13 bits at 0, half and around), plus a sweep */
    static const uint32_t low[] = {0,      1,      0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                                   0x2001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x3000, 0x5000};
    for (uint32_t top = 0; top < 0x10000; top++)
        for (uint32_t l : low) {
            check(top << 16 | l);
            checked++;
        }
    for (uint64_t u = 0; u < 0x100000000ull; u += 4099) {
        check((uint32_t)u);
        checked++;
    }
    if (failures) {
        fprintf(stderr, "convert_check: %ld of %ld conversions differ from the CPU backend's\n",
                failures, checked);
        return 1;
    }
    printf("convert_check: %ld conversions bit-identical to the CPU backend's\n", checked);
    return 0;
}
