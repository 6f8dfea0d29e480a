/*
 * NF4: 4-bit NormalFloat (Dettmers et al., 2023, "QLoRA"), the storage type
 * TR_NF4 of frozen base weights under `lora = { base = "nf4" }`.  The values
 * are those of bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64,
 * compress_statistics=True), so a QLoRA fine-tune here starts from the base
 * a PEFT + bitsandbytes one does, and a dequantised matrix is bit-identical
 * to its dequantize_4bit.
 *
 * A tensor of n elements (n a multiple of TR_NF4_BLOCK) in row-major order
 * is one contiguous blob of tr_nf4_bytes(n) bytes:
 *
 *   codes    n / 2 bytes     two 4-bit indices into the NF4 table per byte,
 *                            element 2i in the high nibble, 2i+1 in the low
 *   qabsmax  n / 64 bytes    each block's absmax, 8-bit: an index into the
 *                            signed dynamic map (bitsandbytes' create_dynamic_map)
 *   absmax2  ceil(n / 64 / 256) floats   the scale of each 256 absmax values
 *   offset   1 float         the mean of the absmax values, subtracted before
 *                            their quantisation
 *
 * (each part starts 4-byte aligned from the blob's start; tr_nf4_parts
 * gives the offsets; the dequantisers read the floats with memcpy, so the
 * blob itself may start anywhere).  Dequantised: w[i] = NF4[code(i)] *
 * (dyn[qabsmax[b]] * absmax2[b / 256] + offset), b = i / 64, in fp32 in
 * that order, each operation rounded on its own (no fused multiply-add).
 *
 * Portable C (kernels/nf4.c) used by every backend for quantising at load;
 * the CPU backend dequantises with AVX-512 / AVX2 where the CPU has them
 * (kernels/cpu/nf4.c, into the scratch of the linear that reads the
 * weight), the CUDA backend with its own kernel (kernels/cuda/nf4.cu); all
 * give tr_nf4_dequantize's bits.
 */
#ifndef TR_NF4_H
#define TR_NF4_H

#include <stddef.h>
#include <stdint.h>

#define TR_NF4_BLOCK 64   /* elements per absmax */
#define TR_NF4_BLOCK2 256 /* absmax values per second-level scale */

/* The 16 NF4 values and the 256 values of the signed dynamic map. */
extern const float tr_nf4_table[16];
extern const float tr_nf4_dynamic_map[256];

struct tr_nf4_parts {
    size_t codes, qabsmax, absmax2, offset; /* byte offsets in the blob */
    size_t blocks, blocks2;                 /* absmax values, second-level scales */
    size_t bytes;                           /* the whole blob */
};

/* The layout of n elements; n must be a multiple of TR_NF4_BLOCK. */
struct tr_nf4_parts tr_nf4_parts(size_t n);
size_t tr_nf4_bytes(size_t n);

/* Quantise src[0 .. n) into the blob dst (tr_nf4_bytes(n) bytes); 0, or
 * -1 when out of memory (n / 64 floats of its own). */
int tr_nf4_quantize(void *dst, const float *src, size_t n);

/* The dequantised absmax of block b (b < n / 64), the factor of its 64
 * values: dyn[qabsmax[b]] * absmax2[b / 256] + offset, the product rounded
 * before the sum; tr_nf4_scales: those of blocks [first, first + count)
 * into dst[0 .. count).  Vector dequantisers take them and multiply, so
 * the one place the rounding order lives is kernels/nf4.c. */
float tr_nf4_scale(const void *blob, size_t n, size_t b);
void tr_nf4_scales(float *dst, const void *blob, size_t n, size_t first, size_t count);

/* Dequantise elements [first, first + count) of an n-element blob into
 * dst[0 .. count) (first and count multiples of TR_NF4_BLOCK): portable. */
void tr_nf4_dequantize(float *dst, const void *src, size_t n, size_t first, size_t count);

#endif
