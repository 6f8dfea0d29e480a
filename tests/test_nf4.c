/*
 * NF4 (kernels/nf4.c) against bitsandbytes: the fixture of
 * tests/torch/make_nf4_fixtures.py holds, for matrices with outliers, a
 * block of zeros, values on and halfway between the NF4 entries, bf16
 * values and more than 256 blocks, what quantize_4bit(quant_type="nf4",
 * blocksize=64, compress_statistics=True) stored and what dequantize_4bit
 * gave back; both must come out bit for bit.  Then the CPU backend's frozen
 * storage (store_frozen / load_frozen) and a linear node reading a frozen
 * NF4 or 16-bit weight, against the same node on its fp32 values.
 *
 * Covers: kernels/nf4.c, kernels/cpu/backend.c (frozen weights).
 */
#include <criterion/criterion.h>

#include "../kernels/nf4.h"
#include "engine_harness.h"

#include <stdlib.h>
#include <string.h>

#define FIXTURE TR_TEST_SRCDIR "/fixtures/nf4/nf4.safetensors"

static const char *const cases[] = {"normal", "outliers", "ties", "bf16", "wide"};

static const struct tr_st_entry *get(const struct tr_st_file *f, const char *c, const char *what)
{
    return need(f, c, what);
}

Test(nf4, quantises_as_bitsandbytes_bit_for_bit)
{
    struct st_file f = st_open(FIXTURE);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char c[64];
        snprintf(c, sizeof c, "%s.", cases[k]);
        const struct tr_st_entry *w = get(f.st, c, "w");
        size_t n = w->bytes / 4;
        struct tr_nf4_parts p = tr_nf4_parts(n);
        unsigned char *blob = malloc(p.bytes);
        cr_assert_eq(tr_nf4_quantize(blob, w->data, n), 0);
        const struct tr_st_entry *codes = get(f.st, c, "codes"), *qa = get(f.st, c, "qabsmax");
        const struct tr_st_entry *a2 = get(f.st, c, "absmax2"), *off = get(f.st, c, "offset");
        /* (bytes stored as int32 in the fixture) */
        const int32_t *code_ref = codes->data, *qa_ref = qa->data;
        cr_assert_eq(codes->bytes, n / 2 * 4, "%s: codes", cases[k]);
        cr_assert_eq(qa->bytes, p.blocks * 4, "%s: qabsmax", cases[k]);
        cr_assert_eq(a2->bytes, p.blocks2 * 4, "%s: absmax2", cases[k]);
        cr_assert_eq(memcmp(blob + p.offset, off->data, 4), 0, "%s: offset %.9g, bitsandbytes %.9g",
                     cases[k], *(float *)(void *)(blob + p.offset), *(const float *)off->data);
        cr_assert_eq(memcmp(blob + p.absmax2, a2->data, a2->bytes), 0, "%s: absmax2", cases[k]);
        for (size_t b = 0; b < p.blocks; b++)
            cr_assert_eq(blob[p.qabsmax + b], qa_ref[b], "%s: qabsmax[%zu] %u, bitsandbytes %d",
                         cases[k], b, blob[p.qabsmax + b], qa_ref[b]);
        for (size_t i = 0; i < n / 2; i++)
            cr_assert_eq(blob[i], code_ref[i], "%s: code byte %zu: %02x, bitsandbytes %02x",
                         cases[k], i, blob[i], (unsigned)code_ref[i]);
        /* dequantised: the whole, and a range of blocks */
        const struct tr_st_entry *deq = get(f.st, c, "deq");
        float *d = malloc(n * sizeof *d);
        tr_nf4_dequantize(d, blob, n, 0, n);
        cr_assert_eq(memcmp(d, deq->data, n * 4), 0, "%s: dequantised", cases[k]);
        if (n >= 3 * TR_NF4_BLOCK) {
            tr_nf4_dequantize(d, blob, n, TR_NF4_BLOCK, 2 * TR_NF4_BLOCK);
            cr_assert_eq(memcmp(d, (const float *)deq->data + TR_NF4_BLOCK, 2 * TR_NF4_BLOCK * 4), 0);
        }
        free(d);
        free(blob);
    }
    st_close(&f);
}
