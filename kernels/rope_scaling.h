/*
 * Rotary frequencies under Llama 3.1's rope_scaling (rope_type "llama3"),
 * shared by the backends' rope tables (kernels/cpu/rope.c and
 * kernels/cuda/ops.cu), so the policy lives here once and the kernels only
 * turn pairs by the angles they are given.
 *
 * transformers' _compute_llama3_parameters (modeling_rope_utils.py), on each
 * plain inverse frequency f = 1 / theta^(2i/D), in float32 as torch computes
 * it (2*pi / f is torch's f.reciprocal() * 2*pi; the Python scalars become
 * floats):
 *   wavelen = 2 pi / f
 *   wavelen < original / high_freq_factor: f as it is
 *   wavelen > original / low_freq_factor:  f / factor
 *   otherwise, smooth = (original / wavelen - low) / (high - low) and
 *              f' = (1 - smooth) * f / factor + smooth * f
 * Each product and sum is rounded on its own (TR_ROPE_MUL, TR_ROPE_ADD: nvcc
 * and -march=native would fuse them into FMAs, which torch does not), so
 * the frequencies are transformers' bit for bit (tests/test_kernels.c checks
 * them against tests/fixtures/hf/rope_llama3_freqs.txt).
 *
 * The includer defines TR_ROPE_FN (the function's qualifiers: "static inline"
 * in C, "__device__ static inline" in CUDA) and TR_ROPE_MUL / TR_ROPE_ADD
 * (a product and a sum rounded to float without fusing), or takes the C
 * defaults below.
 */
#ifndef TR_ROPE_SCALING_H
#define TR_ROPE_SCALING_H

/* A rope node's scaling (struct tr_node's rope_* fields); factor 0: none.
 * Doubles, as config.json gives them: transformers forms the thresholds
 * original / low and original / high and the span high - low in Python
 * floats, and rounds them to float only where they meet the tensor. */
struct tr_rope_scaling {
    double factor, low_freq_factor, high_freq_factor, original_ctx;
};

#ifndef TR_ROPE_FN
#define TR_ROPE_FN static inline
static inline float tr_rope_mul_rn(float a, float b)
{
    volatile float r = a * b; /* rounded here, whatever -ffp-contract says */
    return r;
}
static inline float tr_rope_add_rn(float a, float b)
{
    volatile float r = a + b;
    return r;
}
#define TR_ROPE_MUL(a, b) tr_rope_mul_rn((a), (b))
#define TR_ROPE_ADD(a, b) tr_rope_add_rn((a), (b))
#endif

/* f scaled as transformers scales it; f itself when s->factor is 0. */
TR_ROPE_FN float tr_rope_scale_freq(float f, struct tr_rope_scaling s)
{
    if (!(s.factor > 0))
        return f;
    const float two_pi = 6.283185307179586f;
    /* the thresholds are Python floats (original / factor), compared as floats */
    float factor = (float)s.factor, low = (float)s.low_freq_factor;
    float low_wavelen = (float)(s.original_ctx / s.low_freq_factor);
    float high_wavelen = (float)(s.original_ctx / s.high_freq_factor);
    float wavelen = TR_ROPE_MUL(1.0f / f, two_pi);
    float scaled = wavelen > low_wavelen ? f / factor : f;
    if (wavelen < high_wavelen || wavelen > low_wavelen)
        return scaled;
    float span = (float)(s.high_freq_factor - s.low_freq_factor);
    float smooth = TR_ROPE_ADD(TR_ROPE_MUL(1.0f / wavelen, (float)s.original_ctx), -low) / span;
    float a = TR_ROPE_MUL(TR_ROPE_ADD(1.0f, -smooth), scaled) / factor;
    return TR_ROPE_ADD(a, TR_ROPE_MUL(smooth, scaled));
}

#endif
