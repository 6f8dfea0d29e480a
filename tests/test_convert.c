/* fp32 <-> bf16/fp16 conversions: fp16 against the CPU's own F16C
 * instructions (an independent reference), bf16 against its definition.
 *
 * Covers: kernels/cpu/convert.c.
 */
#include <criterion/criterion.h>

#include "kernels.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

__attribute__((target("f16c"))) static uint16_t hardware_f16(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("f16c"))) static float hardware_f32(uint16_t h) { return _cvtsh_ss(h); }

Test(convert, fp16_matches_the_f16c_instructions)
{
    if (!__builtin_cpu_supports("f16c"))
        cr_skip_test("this CPU has no F16C instructions to compare against");
    uint64_t state = 12345;
    for (int i = 0; i < 2000000; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t u = (uint32_t)(state >> 32);
        float f = from_bits(u);
        if (isnan(f))
            continue;
        uint16_t want = hardware_f16(f), got = tr_f32_to_f16(f);
        cr_assert_eq(got, want, "%a (0x%08x): 0x%04x, F16C gives 0x%04x", f, u, got, want);
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float want = hardware_f32((uint16_t)h), got = tr_f16_to_f32((uint16_t)h);
        if (isnan(want))
            cr_assert(isnan(got), "0x%04x", h);
        else
            cr_assert_eq(bits(got), bits(want), "0x%04x: %a vs %a", h, got, want);
    }
    cr_assert_eq(tr_f32_to_f16(70000.0f), 0x7c00, "overflow gives inf");
    cr_assert(isnan(tr_f16_to_f32(tr_f32_to_f16(NAN))));
}

Test(convert, bf16_rounds_to_nearest_even)
{
    /* every bf16 value converts back exactly */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tr_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            cr_assert_eq(tr_f32_to_bf16(f), h, "0x%04x", h);
    }
    /* halfway cases go to the even neighbour, others to the nearest */
    cr_assert_eq(tr_f32_to_bf16(from_bits(0x3f808000u)), 0x3f80); /* tie, even below */
    cr_assert_eq(tr_f32_to_bf16(from_bits(0x3f818000u)), 0x3f82); /* tie, even above */
    cr_assert_eq(tr_f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
    cr_assert_eq(tr_f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);
    cr_assert(isnan(tr_bf16_to_f32(tr_f32_to_bf16(NAN))));
    float x[5] = {1.0f, 1.00390625f, 3.14159265f, -2.5e-3f, 65504.f}, y[5];
    tr_cpu_round_to_half(y, x, 5, 1);
    for (int i = 0; i < 5; i++)
        cr_assert_float_eq(y[i], x[i], fabsf(x[i]) / 256, "bf16 keeps 8 bits of mantissa");
}
