/*
 * NF4 (kernels/nf4.c) against bitsandbytes: the fixture of
 * tests/torch/make_nf4_fixtures.py holds, for matrices with outliers, a
 * block of zeros, values on and halfway between the NF4 entries, bf16
 * values and more than 256 blocks, what quantize_4bit(quant_type="nf4",
 * blocksize=64, compress_statistics=True) stored and what dequantize_4bit
 * gave back; both must come out bit for bit.  Then, each against that
 * portable reference:
 *
 *  - nf4_scales: tr_nf4_scale, the factor of a block, at any blob address;
 *  - nf4_paths: the CPU backend's AVX-512 (with and without AVX512-BF16's
 *    conversion), AVX2 and portable dequantisers (kernels/cpu/nf4.c), to
 *    fp32 and bf16, whole blobs, partial blocks at either end, odd block
 *    counts, one element, 1 and 2 threads, values that dequantise to
 *    subnormals: tr_nf4_dequantize's bits (bf16: those rounded as
 *    tr_f32_to_bf16);
 *  - frozen: the CPU backend's store_frozen / load_frozen for every type,
 *    and a linear node reading a frozen NF4, bf16, fp16 or fp32 weight
 *    against the same node with the stored weight's fp32 values as a
 *    parameter (output, dx, dbias bit-identical: the same numbers reach the
 *    same GEMMs; NF4 on the native bf16 path goes straight to bf16);
 *  - frozen_cuda: the CUDA backend (tests/cudacpu's stand-in under `make
 *    check`, a GPU under contrib/gpu/validate.sh): store_frozen /
 *    load_frozen with NF4 dequantised by its kernel (kernels/cuda/nf4.cu)
 *    bit for bit; a linear with a frozen weight bit-identical to the fp32
 *    parameter on the device and within the backends' usual tolerances of
 *    the CPU's; an embedding of a frozen 16-bit table; supports_op.
 *
 * Covers: kernels/nf4.c, kernels/cpu/nf4.c, kernels/cpu/backend.c (frozen
 * weights), kernels/cuda/nf4.cu and nodes.cu (frozen weights).
 */
#include <criterion/criterion.h>

#include "../kernels/nf4.h"
#include "config/plugin.h"
#include "engine/backend.h"
#include "engine_harness.h"
#include "tensor_init.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <trainrun/mix.h>

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

/* ---- the fixture's matrices, quantised here (bitsandbytes' blobs, as the
 * test above proves), for the tests that follow ----------------------- */

struct nf4_case {
    const char *name;
    const float *w, *deq; /* the weights, dequantize_4bit's values */
    size_t rows, cols, n;
    void *blob; /* tr_nf4_quantize's */
};

static struct nf4_case nf4_case(const struct st_file *f, size_t k)
{
    char c[64];
    snprintf(c, sizeof c, "%s.", cases[k]);
    const struct tr_st_entry *w = get(f->st, c, "w");
    struct nf4_case nc = {.name = cases[k], .w = w->data, .deq = get(f->st, c, "deq")->data};
    cr_assert_eq(w->ndim, 2);
    nc.rows = (size_t)w->shape[0];
    nc.cols = (size_t)w->shape[1];
    nc.n = nc.rows * nc.cols;
    nc.blob = malloc(tr_nf4_bytes(nc.n));
    cr_assert_eq(tr_nf4_quantize(nc.blob, nc.w, nc.n), 0);
    return nc;
}

enum { N_CASES = sizeof cases / sizeof *cases };

static void expect_floats(const char *what, const char *label, const float *got, const float *want,
                          size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        cr_assert_eq(a, b, "%s: %s[%zu] is %.9g, want %.9g", label, what, i, (double)got[i],
                     (double)want[i]);
    }
}

static void expect_bf16(const char *label, const uint16_t *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], tr_f32_to_bf16(want[i]), "%s: bf16[%zu] is 0x%04x, want 0x%04x",
                     label, i, got[i], tr_f32_to_bf16(want[i]));
}

/* ---- nf4_scales ------------------------------------------------------------ */

/* a block's scale times NF4[code] is each of its dequantised values, for a
 * blob at an aligned address and one byte past it (floats read by memcpy) */
Test(nf4_scales, scale_times_code_is_the_value)
{
    struct st_file f = st_open(FIXTURE);
    for (size_t k = 0; k < N_CASES; k++) {
        struct nf4_case c = nf4_case(&f, k);
        size_t bytes = tr_nf4_bytes(c.n), blocks = c.n / TR_NF4_BLOCK;
        unsigned char *space = malloc(bytes + 1);
        memcpy(space + 1, c.blob, bytes);
        float *scales = malloc(blocks * sizeof *scales);
        tr_nf4_scales(scales, space + 1, c.n, 0, blocks);
        const unsigned char *codes = c.blob;
        for (size_t b = 0; b < blocks; b++) {
            cr_assert(scales[b] == tr_nf4_scale(c.blob, c.n, b), "%s block %zu", c.name, b);
            for (int i = 0; i < TR_NF4_BLOCK; i++) {
                size_t at = b * TR_NF4_BLOCK + (size_t)i;
                unsigned code = i % 2 ? codes[at / 2] & 15u : codes[at / 2] >> 4;
                float v = tr_nf4_table[code] * scales[b];
                cr_assert(memcmp(&v, &c.deq[at], 4) == 0, "%s block %zu: value %d", c.name, b, i);
            }
        }
        float *d = malloc(c.n * sizeof *d); /* the portable dequantiser, misaligned */
        tr_nf4_dequantize(d, space + 1, c.n, 0, c.n);
        expect_floats("dequantised from a misaligned blob", c.name, d, c.deq, c.n);
        free(d), free(scales), free(space), free(c.blob);
    }
    st_close(&f);
}

/* ---- nf4_paths -------------------------------------------------------------- */

static const char *path_name(int p)
{
    return p == TR_CPU_EW_AVX512 ? "AVX-512" : p == TR_CPU_EW_AVX2 ? "AVX2" : "portable";
}

/* [first, first + count) dequantised on each path this CPU has, 1 and 2
 * threads, against want (the portable tr_nf4_dequantize of the whole blob);
 * the element after the range is never written.  Returns the paths run. */
static int check_paths(const char *what, const void *blob, size_t n, const float *want, size_t first,
                       size_t count)
{
    float *f = malloc((count + 1) * sizeof *f);
    uint16_t *h = malloc((count + 1) * sizeof *h);
    int ran = 0;
    for (int path = TR_CPU_EW_PORTABLE; path <= TR_CPU_EW_AVX512; path++) {
        int saved = tr_cpu_elementwise_cap(path);
        if (tr_cpu_elementwise_path() == path) {
            ran++;
            for (int threads = 1; threads <= 2; threads++) {
                omp_set_num_threads(threads);
                char label[160];
                snprintf(label, sizeof label, "%s [%zu, +%zu) %s, %d threads", what, first, count,
                         path_name(path), threads);
                f[count] = 12345.0f;
                h[count] = 0x1234;
                tr_cpu_nf4_to_f32(f, blob, n, first, count);
                tr_cpu_nf4_to_bf16(h, blob, n, first, count);
                expect_floats("fp32", label, f, want + first, count);
                expect_bf16(label, h, want + first, count);
                cr_assert(f[count] == 12345.0f && h[count] == 0x1234, "%s: wrote past the end",
                          label);
            }
        }
        tr_cpu_elementwise_cap(saved);
    }
    free(f);
    free(h);
    return ran;
}

Test(nf4_paths, vector_paths_are_the_portable_bits)
{
    struct st_file f = st_open(FIXTURE);
    int paths = 0;
    for (size_t k = 0; k < N_CASES; k++) {
        struct nf4_case c = nf4_case(&f, k);
        float *want = malloc(c.n * sizeof *want);
        tr_nf4_dequantize(want, c.blob, c.n, 0, c.n);
        expect_floats("portable", c.name, want, c.deq, c.n);
        paths = check_paths(c.name, c.blob, c.n, want, 0, c.n);
        check_paths(c.name, c.blob, c.n, want, 5, c.n - 70); /* partial blocks at both ends */
        check_paths(c.name, c.blob, c.n, want, 64, 64);       /* one whole block */
        check_paths(c.name, c.blob, c.n, want, 77, 1);        /* one element */
        if (c.n >= 64 * 5)                                    /* an odd count of blocks, inside */
            check_paths(c.name, c.blob, c.n, want, 64 * 2, 64 * 3);
        free(want), free(c.blob);
    }
    st_close(&f);
    cr_log_info("nf4 dequantisation: %d paths on this CPU (%s the widest), bit for bit", paths,
                path_name(tr_cpu_elementwise_path()));
    /* a weight of many spans (spread over the threads), 1499 blocks */
    const size_t n = 64 * 1499;
    float *w = malloc(n * sizeof *w), *want = malloc(n * sizeof *want);
    uint64_t seed = 77;
    for (size_t i = 0; i < n; i++)
        w[i] = (float)((double)(tr_splitmix64_next(&seed) >> 11) * 0x1.0p-53 - 0.5) *
               (i % 4096 == 7 ? 40.0f : 1.0f);
    void *b = malloc(tr_nf4_bytes(n));
    cr_assert_eq(tr_nf4_quantize(b, w, n), 0);
    tr_nf4_dequantize(want, b, n, 0, n);
    check_paths("random", b, n, want, 0, n);
    check_paths("random", b, n, want, 64 * 300 + 17, n - 64 * 700); /* spans cut off-block */
    check_paths("random", b, n, want, 64 * 255, 64 * 3);            /* across a span's edge */
    /* weights near the smallest normal: values that dequantise to
     * subnormals (AVX512-BF16's conversion would flush them to zero) */
    for (size_t i = 0; i < n; i++)
        w[i] *= (i / 4096) % 2 ? 1e-36f : 4e-38f;
    cr_assert_eq(tr_nf4_quantize(b, w, n), 0);
    tr_nf4_dequantize(want, b, n, 0, n);
    size_t subnormal = 0;
    for (size_t i = 0; i < n; i++)
        subnormal += want[i] != 0 && fabsf(want[i]) < 0x1p-126f;
    cr_assert_gt(subnormal, 1000, "only %zu subnormal values", subnormal);
    check_paths("tiny", b, n, want, 0, n);
    omp_set_num_threads(2);
    free(w), free(want), free(b);
}

/* ---- frozen: the CPU backend ------------------------------------------------- */

static size_t dtype_bytes(enum tr_dtype dt, size_t numel)
{
    return dt == TR_NF4                      ? tr_nf4_bytes(numel)
           : dt == TR_BF16 || dt == TR_F16 ? numel * 2
                                            : numel * 4;
}

static const char *dtype_name(enum tr_dtype dt)
{
    return dt == TR_BF16 ? "bf16" : dt == TR_F16 ? "fp16" : dt == TR_NF4 ? "nf4" : "fp32";
}

static struct tr_tensor frozen_tensor(const char *name, enum tr_dtype dt, int64_t rows, int64_t cols,
                                      void *data)
{
    struct tr_tensor t;
    int64_t shape[2] = {rows, cols};
    tensor_init(&t, 2, shape, NULL, NULL);
    t.name = (char *)name;
    t.role = TR_ROLE_FROZEN;
    t.dtype = dt;
    t.data = data;
    return t;
}

static struct tr_backend cpu_open(void)
{
    struct tr_backend be;
    cr_assert_eq(tr_cpu_backend_init(&be, 2), 0);
    cr_assert_not_null(be.iface->store_frozen);
    cr_assert_not_null(be.iface->load_frozen);
    return be;
}

/* what load_frozen must give back for weight i stored in dt, checking the
 * stored 16-bit bits on the way (h: the storage as uint16) */
static float stored_value(const struct nf4_case *c, enum tr_dtype dt, const uint16_t *h, size_t i,
                          const char *label)
{
    if (dt == TR_BF16) {
        cr_assert_eq(h[i], tr_f32_to_bf16(c->w[i]), "%s[%zu]", label, i);
        return tr_bf16_to_f32(h[i]);
    }
    if (dt == TR_F16) {
        cr_assert_eq(h[i], tr_f32_to_f16(c->w[i]), "%s[%zu]", label, i);
        return tr_f16_to_f32(h[i]);
    }
    return dt == TR_NF4 ? c->deq[i] : c->w[i];
}

Test(frozen, cpu_store_and_load)
{
    struct st_file f = st_open(FIXTURE);
    struct tr_backend be = cpu_open();
    const enum tr_dtype types[] = {TR_F32, TR_BF16, TR_F16, TR_NF4};
    for (size_t k = 0; k < N_CASES; k++) {
        struct nf4_case c = nf4_case(&f, k);
        for (int d = 0; d < 4; d++) {
            void *data = calloc(1, dtype_bytes(types[d], c.n));
            struct tr_tensor t = frozen_tensor("w", types[d], (int64_t)c.rows, (int64_t)c.cols, data);
            tr_err err = {{0}};
            cr_assert_eq(be.iface->store_frozen(be.context, &t, c.w, &err), TR_OK, "%s", err.msg);
            float *back = malloc(c.n * sizeof *back);
            cr_assert_eq(be.iface->load_frozen(be.context, &t, back, &err), TR_OK, "%s", err.msg);
            char label[64];
            snprintf(label, sizeof label, "%s stored %s", c.name, dtype_name(types[d]));
            for (size_t i = 0; i < c.n; i++) {
                float want = stored_value(&c, types[d], data, i, label);
                cr_assert(memcmp(&back[i], &want, 4) == 0, "%s: loaded [%zu] %.9g, want %.9g",
                          label, i, (double)back[i], (double)want);
            }
            if (types[d] == TR_NF4)
                cr_assert_eq(memcmp(data, c.blob, tr_nf4_bytes(c.n)), 0, "%s: the blob", label);
            free(back), free(data);
        }
        free(c.blob);
    }
    tr_cpu_backend_free(&be);
    st_close(&f);
}

/* ---- a linear node with a frozen weight --------------------------------------- */

struct linear_case {
    int B, T, IC, OC, bias;
    enum tr_dtype storage; /* x and out */
    enum tr_dtype compute;
};

/* One linear node over caller-owned data; scratch (host memory here, the
 * device's in linear_on) with a guard after what the backend asked for. */
struct linear_node {
    struct tr_graph g;
    struct tr_tensor t[4];
    struct tr_node n;
    float *scratch;
    size_t scratch_floats;
};

enum { GUARD = 64 };

static void linear_setup(struct linear_node *L, const struct linear_case *lc,
                         const struct tr_backend *be, void *x, float *dx, struct tr_tensor w,
                         float *bias, float *dbias, void *out, float *dout)
{
    memset(L, 0, sizeof *L);
    int64_t xs[3] = {lc->B, lc->T, lc->IC}, os[3] = {lc->B, lc->T, lc->OC}, bs[1] = {lc->OC};
    tensor_init(&L->t[0], 3, xs, x, dx);
    L->t[0].dtype = lc->storage;
    L->t[0].role = TR_ROLE_ACTIVATION;
    L->t[1] = w;
    tensor_init(&L->t[2], 1, bs, bias, dbias);
    L->t[2].role = TR_ROLE_PARAM;
    tensor_init(&L->t[3], 3, os, out, dout);
    L->t[3].dtype = lc->storage;
    L->t[3].role = TR_ROLE_ACTIVATION;
    L->n = (struct tr_node){.op = TR_OP_LINEAR, .name = "linear", .in = {0, 1, lc->bias ? 2 : -1},
                            .n_in = lc->bias ? 3 : 2, .out = 3};
    L->g.tensors = L->t;
    L->g.n_tensors = 4;
    L->g.nodes = &L->n;
    L->g.n_nodes = 1;
    L->g.loss = -1;
    L->g.logits = -1;
    L->g.compute = lc->compute;
    L->g.training = 1;
    cr_assert(be->iface->supports_op(be->context, &L->g, &L->n), "%s does not run the linear node",
              be->iface->name);
    L->scratch_floats = be->iface->scratch_floats(be->context, &L->g, &L->n);
    L->scratch = malloc((L->scratch_floats + GUARD) * sizeof(float));
    for (size_t i = 0; i < L->scratch_floats + GUARD; i++)
        L->scratch[i] = -77.0f;
    L->g.scratch = L->scratch;
    L->g.scratch_floats = L->scratch_floats;
}

static void linear_run(struct linear_node *L, const struct tr_backend *be, const char *label)
{
    be->iface->forward(be->context, &L->g, &L->n);
    be->iface->backward(be->context, &L->g, &L->n);
    for (size_t i = L->scratch_floats; i < L->scratch_floats + GUARD; i++)
        cr_assert(L->scratch[i] == -77.0f, "%s: scratch written past the %zu floats it asked for",
                  label, L->scratch_floats);
    free(L->scratch);
}

/* fp32 values in storage dtype dt (fp32 or 16-bit), and back */
static void *stored(const float *v, size_t n, enum tr_dtype dt)
{
    void *p = malloc(n * 4);
    if (dt == TR_F32)
        memcpy(p, v, n * 4);
    else
        tr_cpu_to_half(p, v, n, dt == TR_BF16);
    return p;
}

static float *widened(const void *p, size_t n, enum tr_dtype dt)
{
    float *v = malloc(n * 4);
    if (dt == TR_F32)
        memcpy(v, p, n * 4);
    else
        tr_cpu_from_half(v, p, n, dt == TR_BF16);
    return v;
}

static void random_fill(float *v, size_t n, uint64_t *seed, float scale)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)((double)(tr_splitmix64_next(seed) >> 11) * 0x1.0p-52 - 1.0) * scale;
}

static const char *gemm_name(enum tr_dtype compute)
{
    if (compute != TR_BF16)
        return dtype_name(compute);
    return tr_cpu_bf16_native_isa() != NULL ? "bf16 (native)" : "bf16 (emulated)";
}

/* The node with its weight stored frozen in `frozen` against the node with
 * the stored weight's fp32 values (load_frozen's) as a parameter: forward
 * output, dx and dbias bit-identical. */
static void frozen_linear_case(const struct linear_case *lc, enum tr_dtype frozen)
{
    struct tr_backend be = cpu_open();
    size_t nx = (size_t)lc->B * lc->T * lc->IC, nw = (size_t)lc->OC * lc->IC,
           no = (size_t)lc->B * lc->T * lc->OC;
    uint64_t seed = 0x5eed + (uint64_t)frozen * 31 + (uint64_t)lc->compute * 7 + (uint64_t)lc->storage;
    float *xv = malloc(nx * 4), *wv = malloc(nw * 4), *bv = malloc((size_t)lc->OC * 4),
          *dv = malloc(no * 4);
    random_fill(xv, nx, &seed, 1.0f);
    random_fill(wv, nw, &seed, 0.05f);
    random_fill(bv, (size_t)lc->OC, &seed, 0.1f);
    random_fill(dv, no, &seed, 1.0f);
    void *x = stored(xv, nx, lc->storage);
    void *wdata = calloc(1, dtype_bytes(frozen, nw));
    struct tr_tensor wf = frozen_tensor("w", frozen, lc->OC, lc->IC, wdata);
    tr_err err = {{0}};
    cr_assert_eq(be.iface->store_frozen(be.context, &wf, wv, &err), TR_OK, "%s", err.msg);
    float *wvals = malloc(nw * 4);
    cr_assert_eq(be.iface->load_frozen(be.context, &wf, wvals, &err), TR_OK, "%s", err.msg);
    struct tr_tensor wp = frozen_tensor("w", TR_F32, lc->OC, lc->IC, wvals);
    wp.role = TR_ROLE_PARAM;
    wp.grad = calloc(nw, 4);
    char label[160];
    snprintf(label, sizeof label, "linear %dx%dx%d->%d%s, %s weight, %s storage, %s GEMMs", lc->B,
             lc->T, lc->IC, lc->OC, lc->bias ? " +bias" : "", dtype_name(frozen),
             dtype_name(lc->storage), gemm_name(lc->compute));
    void *out[2];
    float *dx[2], *db[2];
    for (int side = 0; side < 2; side++) { /* 0: frozen, 1: parameter */
        struct linear_node L;
        out[side] = calloc(no, 4);
        dx[side] = calloc(nx, 4);
        db[side] = calloc((size_t)lc->OC, 4);
        float *dout = malloc(no * 4);
        memcpy(dout, dv, no * 4);
        linear_setup(&L, lc, &be, x, dx[side], side == 0 ? wf : wp, bv, db[side], out[side], dout);
        linear_run(&L, &be, label);
        free(dout);
    }
    float *o0 = widened(out[0], no, lc->storage), *o1 = widened(out[1], no, lc->storage);
    expect_floats("forward output", label, o0, o1, no);
    expect_floats("dx", label, dx[0], dx[1], nx);
    if (lc->bias)
        expect_floats("dbias", label, db[0], db[1], (size_t)lc->OC);
    for (int side = 0; side < 2; side++)
        free(out[side]), free(dx[side]), free(db[side]);
    free(o0), free(o1), free(xv), free(wv), free(bv), free(dv), free(x), free(wdata), free(wvals);
    free(wp.grad);
    tr_cpu_backend_free(&be);
}

static const struct linear_case linear_shapes[] = {
    {2, 9, 128, 48, 1, TR_F32, TR_F32},
    {3, 5, 64, 33, 0, TR_F32, TR_F32},  /* odd OC (33 blocks), no bias */
    {1, 7, 192, 64, 1, TR_F32, TR_F32}, /* 192 blocks */
};

static void frozen_linear_all(enum tr_dtype compute, enum tr_dtype storage)
{
    const enum tr_dtype types[] = {TR_NF4, TR_BF16, TR_F16, TR_F32};
    for (size_t s = 0; s < sizeof linear_shapes / sizeof *linear_shapes; s++)
        for (int d = 0; d < 4; d++) {
            struct linear_case lc = linear_shapes[s];
            lc.compute = compute;
            lc.storage = storage;
            frozen_linear_case(&lc, types[d]);
        }
}

Test(frozen, linear_fp32) { frozen_linear_all(TR_F32, TR_F32); }
Test(frozen, linear_fp16_gemm_inputs) { frozen_linear_all(TR_F16, TR_F32); }
Test(frozen, linear_bf16_gemm_inputs) { frozen_linear_all(TR_BF16, TR_F32); }
Test(frozen, linear_bf16_storage) { frozen_linear_all(TR_BF16, TR_BF16); }
Test(frozen, linear_fp16_storage) { frozen_linear_all(TR_F16, TR_F16); }

/* bf16 GEMMs emulated (inputs rounded, fp32 GEMMs), as on a CPU without
 * AVX512-BF16: oneDNN decides once per process, and each test runs in its
 * own, so the variable is set before anything asks */
static void emulate_bf16(void) { setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1); }

Test(frozen, linear_bf16_emulated, .init = emulate_bf16)
{
    if (tr_cpu_bf16_native_isa() != NULL)
        cr_skip_test("ONEDNN_MAX_CPU_ISA=AVX2 did not turn the native bf16 GEMMs off");
    frozen_linear_all(TR_BF16, TR_F32);
    frozen_linear_all(TR_BF16, TR_BF16);
}

/* ---- frozen_cuda: the CUDA backend ------------------------------------------- */

/* The CUDA backend (engine_harness.h's need_cuda), with its frozen-weight
 * slots */
static void need_cuda_frozen(struct tr_backend *be)
{
    need_cuda(be);
    cr_assert_not_null(be->iface->store_frozen);
    cr_assert_not_null(be->iface->load_frozen);
}

static void *dev_alloc(const struct tr_backend *be, size_t bytes)
{
    void *p = be->iface->alloc(be->context, bytes ? bytes : 4);
    cr_assert_not_null(p, "cannot allocate %zu bytes on %s", bytes, be->iface->name);
    return p;
}

static void *dev_copy(const struct tr_backend *be, const void *host, size_t bytes)
{
    void *p = dev_alloc(be, bytes);
    be->iface->upload(be->context, p, host, bytes);
    return p;
}

static void *host_copy(const struct tr_backend *be, const void *dev, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 4);
    if (be->iface->synchronize)
        be->iface->synchronize(be->context);
    be->iface->download(be->context, p, dev, bytes);
    return p;
}

Test(frozen_cuda, store_and_load)
{
    struct tr_backend cuda;
    need_cuda_frozen(&cuda);
    struct st_file f = st_open(FIXTURE);
    const enum tr_dtype types[] = {TR_F32, TR_BF16, TR_F16, TR_NF4};
    for (size_t k = 0; k < N_CASES; k++) {
        struct nf4_case c = nf4_case(&f, k);
        for (int d = 0; d < 4; d++) {
            size_t bytes = dtype_bytes(types[d], c.n);
            struct tr_tensor t = frozen_tensor("w", types[d], (int64_t)c.rows, (int64_t)c.cols,
                                               dev_alloc(&cuda, bytes));
            tr_err err = {{0}};
            cr_assert_eq(cuda.iface->store_frozen(cuda.context, &t, c.w, &err), TR_OK, "%s", err.msg);
            float *back = malloc(c.n * sizeof *back);
            cr_assert_eq(cuda.iface->load_frozen(cuda.context, &t, back, &err), TR_OK, "%s", err.msg);
            char label[64];
            snprintf(label, sizeof label, "%s stored %s on cuda", c.name, dtype_name(types[d]));
            uint16_t *h = host_copy(&cuda, t.data, bytes);
            for (size_t i = 0; i < c.n; i++) {
                float want = stored_value(&c, types[d], h, i, label);
                cr_assert(memcmp(&back[i], &want, 4) == 0, "%s: loaded [%zu] %.9g, want %.9g",
                          label, i, (double)back[i], (double)want);
            }
            if (types[d] == TR_NF4)
                cr_assert_eq(memcmp(h, c.blob, bytes), 0, "%s: the blob", label);
            free(h), free(back);
            cuda.iface->free(cuda.context, t.data);
        }
        free(c.blob);
    }
    /* NF4 takes whole blocks only, and says which weight */
    float w[100] = {0};
    struct tr_tensor t = frozen_tensor("odd", TR_NF4, 10, 10, dev_alloc(&cuda, 256));
    tr_err err = {{0}};
    cr_assert_eq(cuda.iface->store_frozen(cuda.context, &t, w, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "'odd'") && strstr(err.msg, "NF4"), "%s", err.msg);
    cuda.iface->free(cuda.context, t.data);
    st_close(&f);
    tr_backend_close(&cuda);
}

/* One linear node on backend be, its weight frozen in `frozen` (stored from
 * wv by store_frozen) or, with as_param, an fp32 parameter holding wv: the
 * output widened to fp32, dx and dbias, on the host. */
struct linear_result {
    float *out, *dx, *db;
};

static struct linear_result linear_on(const struct tr_backend *be, const struct linear_case *lc,
                                      enum tr_dtype frozen, int as_param, const float *xv,
                                      const float *wv, const float *bv, const float *dv)
{
    size_t nx = (size_t)lc->B * lc->T * lc->IC, nw = (size_t)lc->OC * lc->IC,
           no = (size_t)lc->B * lc->T * lc->OC, xb = dtype_bytes(lc->storage, nx),
           ob = dtype_bytes(lc->storage, no);
    void *xs = stored(xv, nx, lc->storage);
    /* gradients start at zero: backward adds to them */
    float *zeros = calloc(nx > nw ? nx : nw, 4);
    void *x = dev_copy(be, xs, xb), *out = dev_alloc(be, ob);
    float *dx = dev_copy(be, zeros, nx * 4), *bias = dev_copy(be, bv, (size_t)lc->OC * 4);
    float *db = dev_copy(be, zeros, (size_t)lc->OC * 4), *dout = dev_copy(be, dv, no * 4);
    struct tr_tensor w = frozen_tensor("w", as_param ? TR_F32 : frozen, lc->OC, lc->IC, NULL);
    if (as_param) {
        w.role = TR_ROLE_PARAM;
        w.data = dev_copy(be, wv, nw * 4);
        w.grad = dev_copy(be, zeros, nw * 4);
    } else {
        w.data = dev_alloc(be, dtype_bytes(frozen, nw));
        tr_err err = {{0}};
        cr_assert_eq(be->iface->store_frozen(be->context, &w, wv, &err), TR_OK, "%s", err.msg);
    }
    struct linear_node L;
    linear_setup(&L, lc, be, x, dx, w, bias, db, out, dout);
    float *scratch_host = L.scratch; /* linear_setup's host scratch: replaced by the device's */
    L.scratch = L.g.scratch = dev_alloc(be, (L.scratch_floats + 1) * 4);
    be->iface->forward(be->context, &L.g, &L.n);
    be->iface->backward(be->context, &L.g, &L.n);
    void *oh = host_copy(be, out, ob);
    struct linear_result r = {widened(oh, no, lc->storage), host_copy(be, dx, nx * 4),
                              host_copy(be, db, (size_t)lc->OC * 4)};
    free(oh), free(xs), free(scratch_host), free(zeros);
    void *dev[] = {x, out, dx, bias, db, dout, w.data, w.grad, L.scratch};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i])
            be->iface->free(be->context, dev[i]);
    return r;
}

static void result_free(struct linear_result *r) { free(r->out), free(r->dx), free(r->db); }

/* A frozen weight on the device against the fp32 parameter holding its
 * stored values (the same GEMM inputs: bit for bit), and against the CPU
 * backend's node with the same frozen weight (within tolerance: the two
 * GEMMs sum in other orders). */
static void cuda_linear_cases(enum tr_dtype compute, enum tr_dtype storage, double tolerance)
{
    struct tr_backend cuda, cpu = cpu_open();
    need_cuda_frozen(&cuda);
    const enum tr_dtype types[] = {TR_NF4, TR_BF16, TR_F16, TR_F32};
    for (size_t s = 0; s < 2; s++)
        for (int d = 0; d < 4; d++) {
            struct linear_case lc = linear_shapes[s];
            lc.compute = compute;
            lc.storage = storage;
            size_t nx = (size_t)lc.B * lc.T * lc.IC, nw = (size_t)lc.OC * lc.IC,
                   no = (size_t)lc.B * lc.T * lc.OC;
            uint64_t seed = 0xc0da + (uint64_t)d * 131 + s;
            float *xv = malloc(nx * 4), *wv = malloc(nw * 4), *bv = malloc((size_t)lc.OC * 4),
                  *dv = malloc(no * 4), *wvals = malloc(nw * 4);
            random_fill(xv, nx, &seed, 1.0f);
            random_fill(wv, nw, &seed, 0.05f);
            random_fill(bv, (size_t)lc.OC, &seed, 0.1f);
            random_fill(dv, no, &seed, 1.0f);
            /* the stored weight's fp32 values, as the CPU reads them back */
            void *wd = calloc(1, dtype_bytes(types[d], nw));
            struct tr_tensor wt = frozen_tensor("w", types[d], lc.OC, lc.IC, wd);
            tr_err err = {{0}};
            cr_assert_eq(cpu.iface->store_frozen(cpu.context, &wt, wv, &err), TR_OK, "%s", err.msg);
            cr_assert_eq(cpu.iface->load_frozen(cpu.context, &wt, wvals, &err), TR_OK, "%s", err.msg);
            struct linear_result fz = linear_on(&cuda, &lc, types[d], 0, xv, wv, bv, dv);
            struct linear_result pm = linear_on(&cuda, &lc, TR_F32, 1, xv, wvals, bv, dv);
            struct linear_result cp = linear_on(&cpu, &lc, types[d], 0, xv, wv, bv, dv);
            char label[160];
            snprintf(label, sizeof label, "cuda linear %dx%dx%d->%d%s, %s weight, %s storage, %s GEMMs",
                     lc.B, lc.T, lc.IC, lc.OC, lc.bias ? " +bias" : "", dtype_name(types[d]),
                     dtype_name(storage), dtype_name(compute));
            expect_floats("output against a parameter's", label, fz.out, pm.out, no);
            expect_floats("dx against a parameter's", label, fz.dx, pm.dx, nx);
            if (lc.bias)
                expect_floats("dbias against a parameter's", label, fz.db, pm.db, (size_t)lc.OC);
            double eo = tensor_error(fz.out, cp.out, no), ex = tensor_error(fz.dx, cp.dx, nx);
            cr_assert_leq(eo, tolerance, "%s: output differs from the CPU's by %.3g", label, eo);
            cr_assert_leq(ex, tolerance, "%s: dx differs from the CPU's by %.3g", label, ex);
            result_free(&fz), result_free(&pm), result_free(&cp);
            free(xv), free(wv), free(bv), free(dv), free(wvals), free(wd);
        }
    tr_cpu_backend_free(&cpu);
    tr_backend_close(&cuda);
}

/* the backends' sums run in other orders: fp32 2e-4 of the largest value;
 * 16-bit GEMM inputs the same products (1e-3); 16-bit storage one rounding
 * of the output apart at most (bf16 1.6e-2, fp16 3e-3): test_backend_ops's */
Test(frozen_cuda, linear_fp32) { cuda_linear_cases(TR_F32, TR_F32, 2e-4); }
Test(frozen_cuda, linear_bf16_gemm_inputs) { cuda_linear_cases(TR_BF16, TR_F32, 1e-3); }
Test(frozen_cuda, linear_fp16_gemm_inputs) { cuda_linear_cases(TR_F16, TR_F32, 1e-3); }
Test(frozen_cuda, linear_bf16_storage) { cuda_linear_cases(TR_BF16, TR_BF16, 1.6e-2); }
Test(frozen_cuda, linear_fp16_storage) { cuda_linear_cases(TR_F16, TR_F16, 3e-3); }

/* an embedding of a frozen 16-bit table gives the rows of the same table as
 * an fp32 parameter, in each output type, without a copy of the table */
Test(frozen_cuda, embedding_16bit_table)
{
    struct tr_backend cuda;
    need_cuda_frozen(&cuda);
    enum { B = 3, T = 7, V = 11, C = 24 };
    uint64_t seed = 1234;
    float table[V * C];
    random_fill(table, V * C, &seed, 1.0f);
    int32_t ids[B * T];
    for (int i = 0; i < B * T; i++)
        ids[i] = (int32_t)(tr_splitmix64_next(&seed) % V);
    const enum tr_dtype types[] = {TR_BF16, TR_F16}, outs[] = {TR_F32, TR_BF16, TR_F16};
    for (int d = 0; d < 2; d++)
        for (int o = 0; o < 3; o++) {
            void *stored_table = stored(table, V * C, types[d]);
            float *wide = widened(stored_table, V * C, types[d]), *res[2];
            for (int side = 0; side < 2; side++) { /* frozen 16-bit, then an fp32 parameter */
                struct tr_graph g = {0};
                struct tr_tensor t[3];
                struct tr_node n = {.op = TR_OP_EMBEDDING, .in = {0, 1}, .n_in = 2, .out = 2};
                int64_t is[2] = {B, T}, os[3] = {B, T, C};
                t[0] = frozen_tensor("table", side ? TR_F32 : types[d], V, C,
                                     side ? dev_copy(&cuda, wide, V * C * 4)
                                          : dev_copy(&cuda, stored_table, V * C * 2));
                if (side)
                    t[0].role = TR_ROLE_PARAM;
                tensor_init(&t[1], 2, is, dev_copy(&cuda, ids, sizeof ids), NULL);
                t[1].dtype = TR_I32;
                t[1].role = TR_ROLE_INPUT;
                tensor_init(&t[2], 3, os, dev_alloc(&cuda, dtype_bytes(outs[o], B * T * C)), NULL);
                t[2].dtype = outs[o];
                t[2].role = TR_ROLE_ACTIVATION;
                g.tensors = t;
                g.n_tensors = 3;
                g.nodes = &n;
                g.n_nodes = 1;
                g.loss = g.logits = -1;
                g.compute = outs[o];
                cr_assert(cuda.iface->supports_op(cuda.context, &g, &n));
                g.scratch_floats = cuda.iface->scratch_floats(cuda.context, &g, &n);
                g.scratch = dev_alloc(&cuda, (g.scratch_floats + 1) * 4);
                if (!side) /* no copy of the table */
                    cr_assert_lt(g.scratch_floats, (size_t)V * C);
                cuda.iface->forward(cuda.context, &g, &n);
                void *h = host_copy(&cuda, t[2].data, dtype_bytes(outs[o], B * T * C));
                res[side] = widened(h, B * T * C, outs[o]);
                free(h);
                for (int i = 0; i < 3; i++)
                    cuda.iface->free(cuda.context, t[i].data);
                cuda.iface->free(cuda.context, g.scratch);
            }
            char label[96];
            snprintf(label, sizeof label, "cuda embedding, %s frozen table, %s output",
                     dtype_name(types[d]), dtype_name(outs[o]));
            expect_floats("output", label, res[0], res[1], B * T * C);
            free(res[0]), free(res[1]), free(stored_table), free(wide);
        }
    tr_backend_close(&cuda);
}

/* what supports_op takes: a frozen linear weight in any type, a 16-bit
 * table; not an NF4 table, NF4 of a partial block, a 16-bit matmul operand */
Test(frozen_cuda, supports_op)
{
    struct tr_backend cuda;
    need_cuda_frozen(&cuda);
    struct tr_graph g = {0};
    struct tr_tensor t[4];
    int64_t xs[2] = {4, 64}, os[2] = {4, 8}, is[1] = {4}, odd[2] = {8, 65};
    tensor_init(&t[0], 2, xs, NULL, NULL);
    t[0].role = TR_ROLE_ACTIVATION;
    tensor_init(&t[2], 2, os, NULL, NULL);
    t[2].role = TR_ROLE_ACTIVATION;
    tensor_init(&t[3], 1, is, NULL, NULL);
    t[3].dtype = TR_I32;
    g.tensors = t;
    g.n_tensors = 4;
    g.compute = TR_F32;
    struct tr_node lin = {.op = TR_OP_LINEAR, .in = {0, 1}, .n_in = 2, .out = 2};
    struct tr_node mm = {.op = TR_OP_MATMUL, .in = {0, 1}, .n_in = 2, .out = 2, .trans_b = 1};
    struct tr_node emb = {.op = TR_OP_EMBEDDING, .in = {1, 3}, .n_in = 2, .out = 0};
    const enum tr_dtype all[] = {TR_F32, TR_BF16, TR_F16, TR_NF4};
    for (int d = 0; d < 4; d++) {
        t[1] = frozen_tensor("w", all[d], 8, 64, NULL);
        cr_assert(cuda.iface->supports_op(cuda.context, &g, &lin), "linear, %s weight",
                  dtype_name(all[d]));
        cr_assert_eq(cuda.iface->supports_op(cuda.context, &g, &mm), all[d] == TR_F32,
                     "matmul, %s frozen operand", dtype_name(all[d]));
        cr_assert_eq(cuda.iface->supports_op(cuda.context, &g, &emb), all[d] != TR_NF4,
                     "embedding, %s table", dtype_name(all[d]));
    }
    tensor_init(&t[1], 2, odd, NULL, NULL);
    t[1].role = TR_ROLE_FROZEN;
    t[1].dtype = TR_NF4;
    cr_assert_not(cuda.iface->supports_op(cuda.context, &g, &lin), "NF4 of 520 values");
    tr_backend_close(&cuda);
}
