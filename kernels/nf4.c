/*
 * NF4 storage (kernels/nf4.h): bitsandbytes' values, portable C.  Every
 * backend quantises with this at load (store_frozen); tr_nf4_scales is
 * the one definition of a block's scale, which the CPU backend's vector
 * dequantisers (kernels/cpu/nf4.c) take from here; the CUDA kernel
 * (kernels/cuda/nf4.cu) computes the same products with __fmul_rn and
 * __fadd_rn.  tr_nf4_dequantize is the portable reference they all match.
 *
 * bitsandbytes 0.46.1's CPU path, which the fixture (tests/fixtures/nf4,
 * tests/torch/make_nf4_fixtures.py) records and tests/test_nf4.c checks bit
 * for bit:
 *   - per block of 64: absmax = max |w|; each w / absmax (fp32 division)
 *     takes the index of the nearest of the 16 NF4 values, the first on a
 *     tie (torch.argmin);
 *   - the absmax values: offset = their mean; absmax - offset quantised in
 *     blocks of 256 to the signed dynamic map: absmax2 = the block's max
 *     |.|, each value / absmax2 to the nearest map entry (the left one on a
 *     tie), the map's first entry -1 (the CPU quantiser sets it so);
 *   - dequantised: (map[q] * absmax2 + offset) * NF4[code], in fp32.
 */
#include "nf4.h"

/* bitsandbytes rounds each product and sum on its own: no fused multiply-adds */
#pragma GCC optimize("fp-contract=off")

#include <math.h>
#include <stdlib.h>
#include <string.h>

const float tr_nf4_table[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

/* bitsandbytes' create_dynamic_map(signed=True), ascending, with its first
 * entry -1 as the CPU quantiser leaves it (hex: the exact floats) */
const float tr_nf4_dynamic_map[256] = {
    -0x1.0000000000000p+0f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f, -0x1.e6cccc0000000p-1f,
    -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f, -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f,
    -0x1.c2cccc0000000p-1f, -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f,
    -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f, -0x1.9066660000000p-1f,
    -0x1.8933340000000p-1f, -0x1.8200000000000p-1f, -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f,
    -0x1.6c66680000000p-1f, -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f,
    -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f, -0x1.3a00000000000p-1f,
    -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f, -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f,
    -0x1.1600000000000p-1f, -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f,
    -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f, -0x1.c733340000000p-2f,
    -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f, -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f,
    -0x1.7f33340000000p-2f, -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f,
    -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f, -0x1.1a66680000000p-2f,
    -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f, -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f,
    -0x1.a4cccc0000000p-3f, -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f,
    -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f, -0x1.b666680000000p-4f,
    -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f, -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f,
    -0x1.65c2900000000p-4f, -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f,
    -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f, -0x1.151eba0000000p-4f,
    -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f, -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f,
    -0x1.b70a3e0000000p-5f, -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f,
    -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f, -0x1.15c2900000000p-5f,
    -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f, -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f,
    -0x1.451eba0000000p-6f, -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f,
    -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f, -0x1.072b020000000p-7f,
    -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f, -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f,
    -0x1.56041a0000000p-8f, -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f,
    -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f, -0x1.4fdf3a0000000p-10f,
    -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f, -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f,
    -0x1.02de020000000p-11f, -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f,
    -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f, -0x1.64840c0000000p-16f,
    -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f, -0x1.27476e0000000p-21f, 0x0.0p+0f,
    0x1.27476e0000000p-21f, 0x1.b435280000000p-19f, 0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f,
    0x1.6f00680000000p-15f, 0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f,
    0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f, 0x1.3dd9820000000p-11f,
    0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f, 0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f,
    0x1.e353f80000000p-10f, 0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f,
    0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f, 0x1.7ae1480000000p-8f,
    0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f, 0x1.e978d40000000p-8f, 0x1.072b020000000p-7f,
    0x1.19999a0000000p-7f, 0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f,
    0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f, 0x1.7333340000000p-6f,
    0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f, 0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f,
    0x1.2cccce0000000p-5f, 0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f,
    0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f, 0x1.ce147a0000000p-5f,
    0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f, 0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f,
    0x1.20a3d60000000p-4f, 0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f,
    0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f, 0x1.7147ae0000000p-4f,
    0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f, 0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f,
    0x1.f000000000000p-4f, 0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f,
    0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f, 0x1.c1999a0000000p-3f,
    0x1.de66660000000p-3f, 0x1.fb33320000000p-3f, 0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f,
    0x1.28cccc0000000p-2f, 0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f,
    0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f, 0x1.8d99980000000p-2f,
    0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f, 0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f,
    0x1.d599980000000p-2f, 0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f,
    0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f, 0x1.1d33340000000p-1f,
    0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f, 0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f,
    0x1.4133340000000p-1f, 0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f,
    0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f, 0x1.73999a0000000p-1f,
    0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f, 0x1.8933340000000p-1f, 0x1.9066660000000p-1f,
    0x1.97999a0000000p-1f, 0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f,
    0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f, 0x1.ca00000000000p-1f,
    0x1.d133340000000p-1f, 0x1.d866660000000p-1f, 0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f,
    0x1.ee00000000000p-1f, 0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f,
};

static size_t align4(size_t n) { return (n + 3) & ~(size_t)3; }

struct tr_nf4_parts tr_nf4_parts(size_t n)
{
    struct tr_nf4_parts p;
    p.blocks = n / TR_NF4_BLOCK;
    p.blocks2 = (p.blocks + TR_NF4_BLOCK2 - 1) / TR_NF4_BLOCK2;
    p.codes = 0;
    p.qabsmax = align4(n / 2);
    p.absmax2 = p.qabsmax + align4(p.blocks);
    p.offset = p.absmax2 + p.blocks2 * sizeof(float);
    p.bytes = p.offset + sizeof(float);
    return p;
}

size_t tr_nf4_bytes(size_t n) { return tr_nf4_parts(n).bytes; }

/* the nearest NF4 value's index, the first of two equally near (argmin) */
static unsigned nf4_code(float x)
{
    unsigned best = 0;
    float d = fabsf(x - tr_nf4_table[0]);
    for (unsigned k = 1; k < 16; k++) {
        float e = fabsf(x - tr_nf4_table[k]);
        if (e < d) { /* NaN (a block of zeros: 0 / 0) never wins: index 0 */
            d = e;
            best = k;
        }
    }
    return best;
}

/* the dynamic map's index for x: the last entry at or below x (0 below
 * them all), or the next one when that is strictly nearer */
static unsigned char map_code(float x)
{
    const float *m = tr_nf4_dynamic_map;
    unsigned lo = 0, hi = 255;
    if (!(x >= m[0]))
        return 0;
    while (lo < hi) { /* the last m[i] <= x */
        unsigned mid = (lo + hi + 1) / 2;
        if (m[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo < 255 && fabsf(x - m[lo + 1]) < fabsf(x - m[lo]))
        lo++;
    return (unsigned char)lo;
}

/* ---- the offset: the mean of the absmax values, summed as torch sums a
 * contiguous fp32 tensor on the CPU (its cascade_sum: 8-lane vectors, four
 * of them interleaved, chunked in levels of 16 or more, the scalar tail
 * first and then the lanes in order), so the offset, and with it every
 * absmax code, is bitsandbytes' bit for bit.  Tensors of fewer than 32768
 * blocks (2 M weights) are summed by torch in one thread, which this
 * reproduces; for larger ones torch splits the sum across its threads, and
 * the offset may differ from bitsandbytes' in its last bit (docs/adapters.md). */
enum { LANES = 8, ILP = 4, LEVELS = 4 };

struct vec8 {
    float v[LANES];
};

static void vadd(struct vec8 *a, const struct vec8 *b)
{
    for (int l = 0; l < LANES; l++)
        a->v[l] += b->v[l];
}

static int ceil_log2(size_t x)
{
    if (x <= 2)
        return 1;
    int k = 0;
    for (size_t v = x - 1; v; v >>= 1)
        k++;
    return k;
}

/* multi_row_sum over `size` groups of ILP vectors */
static void multi_row_sum(const float *x, size_t size, struct vec8 out[ILP])
{
    int power = ceil_log2(size) / LEVELS;
    if (power < 4)
        power = 4;
    size_t step = (size_t)1 << power, mask = step - 1;
    struct vec8 acc[LEVELS][ILP];
    memset(acc, 0, sizeof acc);
    size_t i = 0;
    while (i + step <= size) {
        for (size_t j = 0; j < step; j++, i++)
            for (int k = 0; k < ILP; k++)
                vadd(&acc[0][k], (const struct vec8 *)(const void *)(x + (i * ILP + (size_t)k) * LANES));
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++) {
                vadd(&acc[j][k], &acc[j - 1][k]);
                memset(&acc[j - 1][k], 0, sizeof acc[j - 1][k]);
            }
            if ((i & (mask << (j * power))) != 0)
                break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < ILP; k++)
            vadd(&acc[0][k], (const struct vec8 *)(const void *)(x + (i * ILP + (size_t)k) * LANES));
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            vadd(&acc[0][k], &acc[j][k]);
    memcpy(out, acc[0], sizeof acc[0]);
}

static float torch_sum(const float *x, size_t n)
{
    if (n < LANES) { /* torch's scalar path: row_sum's four interleaved partial sums */
        float p[ILP] = {0};
        size_t groups = n / ILP;
        for (size_t i = 0; i < groups; i++)
            for (int k = 0; k < ILP; k++)
                p[k] += x[i * ILP + (size_t)k];
        for (size_t i = groups * ILP; i < n; i++)
            p[0] += x[i];
        for (int k = 1; k < ILP; k++)
            p[0] += p[k];
        return p[0];
    }
    size_t vecs = n / LANES, groups = vecs / ILP;
    struct vec8 part[ILP];
    multi_row_sum(x, groups, part);
    for (size_t v = groups * ILP; v < vecs; v++)
        vadd(&part[0], (const struct vec8 *)(const void *)(x + v * LANES));
    for (int k = 1; k < ILP; k++)
        vadd(&part[0], &part[k]);
    float s = 0.0f;
    for (size_t i = vecs * LANES; i < n; i++)
        s += x[i];
    for (int l = 0; l < LANES; l++)
        s += part[0].v[l];
    return s;
}

int tr_nf4_quantize(void *dst, const float *src, size_t n)
{
    struct tr_nf4_parts p = tr_nf4_parts(n);
    unsigned char *out = dst, *codes = out + p.codes, *qabsmax = out + p.qabsmax;
    float *absmax2 = (float *)(void *)(out + p.absmax2), *offset = (float *)(void *)(out + p.offset);
    float *absmax = malloc(p.blocks * sizeof(float) + 1);
    if (!absmax)
        return -1;
    memset(dst, 0, p.bytes);
    for (size_t b = 0; b < p.blocks; b++) {
        const float *w = src + b * TR_NF4_BLOCK;
        float m = 0.0f;
        for (int i = 0; i < TR_NF4_BLOCK; i++)
            m = fmaxf(m, fabsf(w[i]));
        absmax[b] = m;
        for (int i = 0; i < TR_NF4_BLOCK; i += 2) {
            unsigned hi = nf4_code(w[i] / m), lo = nf4_code(w[i + 1] / m);
            codes[(b * TR_NF4_BLOCK + (size_t)i) / 2] = (unsigned char)(hi << 4 | lo);
        }
    }
    float mean = torch_sum(absmax, p.blocks) / (float)p.blocks;
    *offset = mean;
    for (size_t b2 = 0; b2 < p.blocks2; b2++) {
        size_t first = b2 * TR_NF4_BLOCK2, last = first + TR_NF4_BLOCK2;
        if (last > p.blocks)
            last = p.blocks;
        float m = -INFINITY;
        for (size_t b = first; b < last; b++)
            m = fmaxf(m, fabsf(absmax[b] - mean));
        absmax2[b2] = m;
        for (size_t b = first; b < last; b++)
            qabsmax[b] = map_code((absmax[b] - mean) / m);
    }
    free(absmax);
    return 0;
}

/* block b's scale, given the blob's parts and offset */
static float block_scale(const unsigned char *in, const struct tr_nf4_parts *p, float offset, size_t b)
{
    float absmax2;
    memcpy(&absmax2, in + p->absmax2 + b / TR_NF4_BLOCK2 * sizeof(float), sizeof absmax2);
    /* two statements, and fp-contract off above: bitsandbytes multiplies in
     * C++ and torch adds, each result rounded to fp32 (a fused multiply-add
     * changes some scales by a bit) */
    float scale = tr_nf4_dynamic_map[in[p->qabsmax + b]] * absmax2;
    scale += offset;
    return scale;
}

void tr_nf4_scales(float *dst, const void *blob, size_t n, size_t first, size_t count)
{
    struct tr_nf4_parts p = tr_nf4_parts(n);
    float offset;
    memcpy(&offset, (const unsigned char *)blob + p.offset, sizeof offset);
    for (size_t b = first; b < first + count; b++)
        dst[b - first] = block_scale(blob, &p, offset, b);
}

float tr_nf4_scale(const void *blob, size_t n, size_t b)
{
    struct tr_nf4_parts p = tr_nf4_parts(n);
    float offset;
    memcpy(&offset, (const unsigned char *)blob + p.offset, sizeof offset);
    return block_scale(blob, &p, offset, b);
}

void tr_nf4_dequantize(float *dst, const void *src, size_t n, size_t first, size_t count)
{
    const unsigned char *codes = (const unsigned char *)src + tr_nf4_parts(n).codes;
    for (size_t b = first / TR_NF4_BLOCK; b < (first + count) / TR_NF4_BLOCK; b++) {
        float scale = tr_nf4_scale(src, n, b);
        float *out = dst + (b * TR_NF4_BLOCK - first);
        const unsigned char *c = codes + b * TR_NF4_BLOCK / 2;
        for (int i = 0; i < TR_NF4_BLOCK / 2; i++) {
            out[2 * i] = tr_nf4_table[c[i] >> 4] * scale;
            out[2 * i + 1] = tr_nf4_table[c[i] & 15] * scale;
        }
    }
}
