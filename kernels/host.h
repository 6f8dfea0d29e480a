/*
 * Kernels the core may call on host memory, whatever the device: 16-bit
 * float conversions (checkpoints are written and read on the host) and the
 * softmax of one row (sampling), an adapter's merge.  Part of the kernels'
 * public contract, like backend.h; implemented in kernels/cpu (convert.c,
 * loss.c, linear.c).
 */
#ifndef TR_KERNELS_HOST_H
#define TR_KERNELS_HOST_H

#include <stddef.h>
#include <stdint.h>

/* ---- 16-bit floats: round to nearest even; fp16 overflow gives inf */
uint16_t tr_f32_to_bf16(float f);
float tr_bf16_to_f32(uint16_t h);
uint16_t tr_f32_to_f16(float f);
float tr_f16_to_f32(uint16_t h);
/* bf16 != 0: bfloat16, else IEEE half */
void tr_cpu_to_half(uint16_t *out, const float *in, size_t n, int bf16);
void tr_cpu_from_half(float *out, const uint16_t *in, size_t n, int bf16);
/* out = in rounded to bf16 or fp16 and back: what a half-precision GEMM
 * multiplies (fp16 overflow gives inf, as the hardware's would) */
void tr_cpu_round_to_half(float *out, const float *in, size_t n, int bf16);

/* ---- softmax of one row with temperature (sampling); temperature <= 0
 * gives a one-hot at the first maximum (greedy) */
void tr_cpu_softmax(float *out, const float *logits, int n, float temperature);

/* ---- a LoRA adapter merged into its base (export --merge), as PEFT merges:
 * w[out,in] += (b[out,r] @ a[r,in]) * scale, the product summed in fp32 over
 * r in order, then scaled and added */
void tr_cpu_lora_merge(float *w, const float *a, const float *b, int64_t out, int64_t in, int r,
                       float scale);

#endif
