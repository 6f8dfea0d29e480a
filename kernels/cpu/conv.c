/*
 * 2-D convolution, channel-last, on oneDNN's convolution primitives.
 *
 * Layout.  Activations are x[B,H,W,IC] and out[B,OH,OW,OC] (oneDNN's nhwc,
 * which its brgemm/jit convolutions take directly: no reorder of the big
 * tensors per call).  Weights are w[OC,KH,KW,IC/groups] (ohwi; grouped:
 * dims {G, OC/G, IC/G, KH, KW} in gohwi order, whose memory order is
 * [G][OC/G][KH][KW][IC/G], the same bytes).  The primitives are created
 * with weights in "any" format and get the layout they run fastest with;
 * the weights (small next to the activations) are reordered into it in
 * scratch on every call, and the weight gradient is reordered back with a
 * sum post-op, which also makes it accumulate (kernels.h).
 *
 * Primitives are created once per shape (and precision and thread count)
 * and kept for the life of the process in a table behind a mutex, as
 * gemm.c's bf16 matmuls: creating one costs more than running a small
 * convolution.  They run with user-managed scratchpads carved from the
 * node's planned scratch (tr_cpu_conv2d_scratch_floats asks the primitives
 * how much), so a step allocates nothing.
 *
 * Precision.  compute bf16 on a CPU with bf16 instructions
 * (tr_cpu_bf16_native_isa): x and dout are converted to bf16 into scratch
 * (tr_cpu_to_bf16), the weights by the reorder, and oneDNN's bf16
 * convolutions multiply them with fp32 accumulation and fp32 results.
 * Otherwise (fp16 always, bf16 without the instructions) x, w and dout are
 * rounded to the 16-bit type into scratch and the fp32 primitives run on
 * them: the same products, fp32 sums.  (On small images the bf16 weight
 * gradient is the latter too: see create_wgrad.)
 *
 * Determinism.  The forward and the data gradient reduce each output over
 * its whole window on one thread.  The weight gradient sums over batch and
 * positions, and oneDNN splits that sum over the threads it was created
 * for, so its bits depend on the thread count (see the test conv.threads):
 * a primitive is created per thread count and the split is static, so runs
 * with the same thread count are bitwise repeatable.  The bias gradient is
 * not oneDNN's: it is the ordered row sum of linear's (tr_cpu_linear_bias_backward).
 *
 * One file a little past 700 lines: every convolution path (forward, both
 * gradients, grouped or not) goes through the same primitive cache
 * and scratch carving, which are static here.
 */
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

enum conv_mode { MODE_F32 = 0, MODE_BF16 = 1 };

/* bf16 weight gradients natively from this many output pixels per image up
 * (create_wgrad says why) */
enum { BF16_WGRAD_MIN_PIXELS = 256 };

struct conv_key {
    struct tr_cpu_conv_shape s;
    int bias, mode, threads;
};

/* One primitive with the layouts it chose. */
struct conv_prim {
    dnnl_primitive_t prim;
    dnnl_memory_desc_t wei;     /* the weights (or their gradient) as the primitive wants them */
    dnnl_primitive_t reorder;   /* user weights -> wei (forward, data gradient), or
                                 * wei -> user weights with a sum (weight gradient) */
    dnnl_memory_desc_t scratch; /* its scratchpad */
    size_t scratch_bytes, wei_bytes;
};

struct conv_prims {
    struct conv_key key;
    dnnl_memory_desc_t src, dst, diff_src, user_wei, bias;
    struct conv_prim fwd, bwd_data, bwd_weights;
    int bwd_weights_f32; /* bf16 mode, but the weight gradient on rounded fp32 copies */
    struct conv_prims *next;
};

enum { CONV_BUCKETS = 256 };

static pthread_mutex_t conv_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conv_prims *conv_table[CONV_BUCKETS];
static dnnl_engine_t conv_engine;
static _Thread_local dnnl_stream_t conv_stream;

static void conv_fail(const char *what, dnnl_status_t status, const struct tr_cpu_conv_shape *s)
{
    /* reachable only through a shape the graph checks refuse (an empty
     * output, groups not dividing the channels) or a oneDNN without
     * convolutions for this CPU: a programming error, not a user's */
    fprintf(stderr,
            "tr_cpu_conv2d: %s failed (status %d): x[%d,%d,%d,%d] w[%d,%d,%d,%d/%d] out "
            "[%d,%d] stride %d,%d pad %d,%d dilation %d,%d\n",
            what, (int)status, s->B, s->H, s->W, s->IC, s->OC, s->KH, s->KW, s->IC, s->groups,
            s->OH, s->OW, s->stride[0], s->stride[1], s->pad[0], s->pad[1], s->dilation[0],
            s->dilation[1]);
    abort();
}

static unsigned conv_hash(const struct conv_key *k)
{
    const int *v = (const int *)(const void *)k;
    unsigned h = 2166136261u;
    for (size_t i = 0; i < sizeof *k / sizeof(int); i++)
        h = (h ^ (unsigned)v[i]) * 16777619u;
    return h % CONV_BUCKETS;
}

static int conv_native_bf16(enum tr_dtype compute)
{
    return compute == TR_BF16 && tr_cpu_bf16_native_isa() != NULL;
}

static int conv_emulated(enum tr_dtype compute)
{
    return (compute == TR_BF16 || compute == TR_F16) && !conv_native_bf16(compute);
}

/* The geometry oneDNN takes: dilation counted from 0, and the right/bottom
 * padding that makes its output size formula give OH, OW exactly (it can be
 * smaller than the left one, or negative: a stride that skips the last
 * rows, as PyTorch's floor division does). */
static void conv_geometry(const struct tr_cpu_conv_shape *s, dnnl_dims_t strides,
                          dnnl_dims_t dilates, dnnl_dims_t pad_l, dnnl_dims_t pad_r)
{
    int in[2] = {s->H, s->W}, out[2] = {s->OH, s->OW}, k[2] = {s->KH, s->KW};
    for (int d = 0; d < 2; d++) {
        strides[d] = s->stride[d];
        dilates[d] = s->dilation[d] - 1;
        pad_l[d] = s->pad[d];
        pad_r[d] = (dnnl_dim_t)(out[d] - 1) * s->stride[d] +
                   (dnnl_dim_t)(k[d] - 1) * s->dilation[d] + 1 - in[d] - s->pad[d];
    }
}

static void destroy_prim(struct conv_prim *p)
{
    if (p->prim)
        dnnl_primitive_destroy(p->prim);
    if (p->reorder)
        dnnl_primitive_destroy(p->reorder);
}

/* A reorder from `from` to `to` (accumulating into `to` when sum), or NULL
 * in *out when the two layouts are one and the copy is not needed. */
static dnnl_status_t make_reorder(dnnl_primitive_t *out, const dnnl_memory_desc_t *from,
                                  const dnnl_memory_desc_t *to, int sum)
{
    *out = NULL;
    if (!sum && dnnl_memory_desc_equal(from, to))
        return dnnl_success;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post_ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = dnnl_success;
    if (sum) {
        s = dnnl_primitive_attr_create(&attr);
        if (s == dnnl_success)
            s = dnnl_post_ops_create(&post_ops);
        if (s == dnnl_success)
            s = dnnl_post_ops_append_sum(post_ops, 1.0f);
        if (s == dnnl_success)
            s = dnnl_primitive_attr_set_post_ops(attr, post_ops);
    }
    if (s == dnnl_success)
        s = dnnl_reorder_primitive_desc_create(&pd, from, conv_engine, to, conv_engine, attr);
    if (s == dnnl_success)
        s = dnnl_primitive_create(out, pd);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (post_ops)
        dnnl_post_ops_destroy(post_ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return s;
}

/* Fills p from a created primitive descriptor: the primitive, its
 * scratchpad and the weights layout it chose (query `wei_query`). */
static dnnl_status_t finish_prim(struct conv_prim *p, dnnl_primitive_desc_t pd,
                                 dnnl_query_t wei_query)
{
    dnnl_status_t s = dnnl_primitive_create(&p->prim, pd);
    if (s != dnnl_success)
        return s;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (md != NULL) {
        p->scratch = *md;
        p->scratch_bytes = dnnl_memory_desc_get_size(md);
    }
    md = dnnl_primitive_desc_query_md(pd, wei_query, 0);
    if (md == NULL)
        return dnnl_runtime_error;
    p->wei = *md;
    p->wei_bytes = dnnl_memory_desc_get_size(md);
    return dnnl_success;
}

/*
 * oneDNN 2.x's AVX2 1x1 weight gradient (jit_1x1:avx2) with a stride, on
 * nhwc data with fewer input channels per group than its block of 8, writes
 * past the buffer it gathers the strided input into (its "rtus" workspace):
 * wrong weight gradients from run to run with 2 threads, a hang or a crash
 * elsewhere (oneDNN GitHub issue 6035, open; seen here as the test conv.
 * forward_backward_every_attribute failing 1 run in 3 on a Zen 3).  Such a
 * shape takes oneDNN's next implementation for the weight gradient instead.
 */
static int wgrad_impl_avoided(const struct tr_cpu_conv_shape *sh, const char *impl)
{
    int strided = sh->stride[0] > 1 || sh->stride[1] > 1;
    return strided && sh->KH == 1 && sh->KW == 1 && (sh->IC / sh->groups) % 8 != 0 &&
           impl != NULL && strncmp(impl, "jit_1x1:", 8) == 0 && strstr(impl, "avx512") == NULL;
}

/* The first implementation oneDNN offers for `desc` that wgrad_impl_avoided
 * does not rule out (all of them ruled out: the first). */
static dnnl_status_t wgrad_pd_create(dnnl_primitive_desc_t *pd, const_dnnl_op_desc_t desc,
                                     const_dnnl_primitive_attr_t attr,
                                     const_dnnl_primitive_desc_t hint,
                                     const struct tr_cpu_conv_shape *sh)
{
    dnnl_primitive_desc_iterator_t it = NULL;
    dnnl_status_t s = dnnl_primitive_desc_iterator_create(&it, desc, attr, conv_engine, hint);
    if (s != dnnl_success)
        return s;
    *pd = NULL;
    do {
        dnnl_primitive_desc_t candidate = dnnl_primitive_desc_iterator_fetch(it);
        if (candidate == NULL)
            break;
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(candidate, dnnl_query_impl_info_str, 0, &impl) !=
                dnnl_success ||
            !wgrad_impl_avoided(sh, impl)) {
            *pd = candidate;
            break;
        }
        dnnl_primitive_desc_destroy(candidate);
    } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    dnnl_primitive_desc_iterator_destroy(it);
    if (*pd == NULL) /* every implementation ruled out, or none fetched */
        return dnnl_primitive_desc_create(pd, desc, attr, conv_engine, hint);
    return dnnl_success;
}

/* The memory descriptors and geometry the three convolutions share. */
struct conv_descs {
    dnnl_memory_desc_t src_in, dst_in, wei_any, wei_any_f32;
    dnnl_dims_t strides, dilates, pad_l, pad_r;
};

/* c's own memory descriptors (src, dst, diff_src, bias, user_wei) and d's */
static dnnl_status_t conv_descs_init(struct conv_prims *c, struct conv_descs *d)
{
    const struct tr_cpu_conv_shape *sh = &c->key.s;
    dnnl_data_type_t in_type = c->key.mode == MODE_BF16 ? dnnl_bf16 : dnnl_f32;
    int G = sh->groups;
    dnnl_dims_t src_dims = {sh->B, sh->IC, sh->H, sh->W};
    dnnl_dims_t dst_dims = {sh->B, sh->OC, sh->OH, sh->OW};
    dnnl_dims_t bias_dims = {sh->OC};
    dnnl_dims_t wei_dims = {sh->OC, sh->IC, sh->KH, sh->KW};
    dnnl_dims_t gwei_dims = {G, sh->OC / G, sh->IC / G, sh->KH, sh->KW};
    conv_geometry(sh, d->strides, d->dilates, d->pad_l, d->pad_r);

    /* src / diff_dst in the input precision; dst and diff_src always fp32 */
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&c->src, 4, src_dims, dnnl_f32, dnnl_nhwc);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&d->src_in, 4, src_dims, in_type, dnnl_nhwc);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&c->dst, 4, dst_dims, dnnl_f32, dnnl_nhwc);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&d->dst_in, 4, dst_dims, in_type, dnnl_nhwc);
    c->diff_src = c->src;
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&c->bias, 1, bias_dims, dnnl_f32, dnnl_a);
    if (s == dnnl_success)
        s = G == 1 ? dnnl_memory_desc_init_by_tag(&c->user_wei, 4, wei_dims, dnnl_f32, dnnl_ohwi)
                   : dnnl_memory_desc_init_by_tag(&c->user_wei, 5, gwei_dims, dnnl_f32, dnnl_gohwi);
    if (s == dnnl_success)
        s = G == 1
                ? dnnl_memory_desc_init_by_tag(&d->wei_any, 4, wei_dims, in_type, dnnl_format_tag_any)
                : dnnl_memory_desc_init_by_tag(&d->wei_any, 5, gwei_dims, in_type,
                                               dnnl_format_tag_any);
    if (s == dnnl_success)
        s = G == 1 ? dnnl_memory_desc_init_by_tag(&d->wei_any_f32, 4, wei_dims, dnnl_f32,
                                                  dnnl_format_tag_any)
                   : dnnl_memory_desc_init_by_tag(&d->wei_any_f32, 5, gwei_dims, dnnl_f32,
                                                  dnnl_format_tag_any);
    return s;
}

/* forward_training (*fpd: the hint the backward primitives are made from),
 * then backward data (*bpd) */
static dnnl_status_t create_fwd_and_data(struct conv_prims *c, struct conv_descs *d,
                                         dnnl_primitive_attr_t attr, dnnl_primitive_desc_t *fpd,
                                         dnnl_primitive_desc_t *bpd)
{
    dnnl_convolution_desc_t fd, bd;
    dnnl_status_t s = dnnl_dilated_convolution_forward_desc_init(
        &fd, dnnl_forward_training, dnnl_convolution_direct, &d->src_in, &d->wei_any,
        c->key.bias ? &c->bias : NULL, &c->dst, d->strides, d->dilates, d->pad_l, d->pad_r);
    if (s == dnnl_success)
        s = dnnl_primitive_desc_create(fpd, &fd, attr, conv_engine, NULL);
    if (s == dnnl_success)
        s = finish_prim(&c->fwd, *fpd, dnnl_query_weights_md);
    if (s == dnnl_success)
        s = make_reorder(&c->fwd.reorder, &c->user_wei, &c->fwd.wei, 0);

    if (s == dnnl_success)
        s = dnnl_dilated_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct,
                                                             &c->diff_src, &d->wei_any, &d->dst_in,
                                                             d->strides, d->dilates, d->pad_l,
                                                             d->pad_r);
    if (s == dnnl_success)
        s = dnnl_primitive_desc_create(bpd, &bd, attr, conv_engine, *fpd);
    if (s == dnnl_success)
        s = finish_prim(&c->bwd_data, *bpd, dnnl_query_weights_md);
    if (s == dnnl_success)
        s = make_reorder(&c->bwd_data.reorder, &c->user_wei, &c->bwd_data.wei, 0);
    return s;
}

/* The weight gradient in fp32 whatever the inputs; no bias (summed here).
 * oneDNN 2.x's bf16 weight gradient (jit_bf16) is slower than its fp32 one
 * on small images (at 8x8, 512 channels, batch 32: 2.2x the CPU time on
 * AVX512-BF16; break-even near 16x16), so below BF16_WGRAD_MIN_PIXELS output
 * pixels (c->bwd_weights_f32) it runs in fp32 on the inputs rounded to
 * bf16: the same products (exact in fp32), another order of sums.  The
 * choice depends on the shape only, so runs repeat. */
static dnnl_status_t create_wgrad(struct conv_prims *c, struct conv_descs *d,
                                  dnnl_primitive_attr_t attr, dnnl_primitive_desc_t fpd,
                                  dnnl_primitive_desc_t *wpd)
{
    dnnl_convolution_desc_t wd;
    dnnl_primitive_desc_t hint = fpd, f32_fpd = NULL;
    dnnl_status_t s = dnnl_success;
    if (c->bwd_weights_f32) {
        dnnl_convolution_desc_t f32_fd;
        s = dnnl_dilated_convolution_forward_desc_init(
            &f32_fd, dnnl_forward_training, dnnl_convolution_direct, &c->src, &d->wei_any_f32,
            NULL, &c->dst, d->strides, d->dilates, d->pad_l, d->pad_r);
        if (s == dnnl_success)
            s = dnnl_primitive_desc_create(&f32_fpd, &f32_fd, attr, conv_engine, NULL);
        hint = f32_fpd;
    }
    if (s == dnnl_success)
        s = dnnl_dilated_convolution_backward_weights_desc_init(
            &wd, dnnl_convolution_direct, c->bwd_weights_f32 ? &c->src : &d->src_in,
            &d->wei_any_f32, NULL, c->bwd_weights_f32 ? &c->dst : &d->dst_in, d->strides,
            d->dilates, d->pad_l, d->pad_r);
    if (s == dnnl_success)
        s = wgrad_pd_create(wpd, &wd, attr, hint, &c->key.s);
    if (f32_fpd)
        dnnl_primitive_desc_destroy(f32_fpd);
    if (s == dnnl_success)
        s = finish_prim(&c->bwd_weights, *wpd, dnnl_query_diff_weights_md);
    if (s == dnnl_success)
        s = make_reorder(&c->bwd_weights.reorder, &c->bwd_weights.wei, &c->user_wei, 1);
    return s;
}

/* The forward, backward-data and weight-gradient primitives of c's shape,
 * with the reorders between the user's weights and each one's layout. */
static dnnl_status_t create_prims(struct conv_prims *c)
{
    struct conv_descs d;
    dnnl_status_t s = conv_descs_init(c, &d);
    if (s != dnnl_success)
        return s;

    dnnl_primitive_attr_t attr = NULL;
    s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    dnnl_primitive_desc_t fpd = NULL, bpd = NULL, wpd = NULL;
    if (s == dnnl_success)
        s = create_fwd_and_data(c, &d, attr, &fpd, &bpd);
    c->bwd_weights_f32 =
        c->key.mode == MODE_BF16 && (long)c->key.s.OH * c->key.s.OW < BF16_WGRAD_MIN_PIXELS;
    if (s == dnnl_success)
        s = create_wgrad(c, &d, attr, fpd, &wpd);

    if (fpd)
        dnnl_primitive_desc_destroy(fpd);
    if (bpd)
        dnnl_primitive_desc_destroy(bpd);
    if (wpd)
        dnnl_primitive_desc_destroy(wpd);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return s;
}

/* The primitives for this shape, created on first use; NULL with *status
 * when oneDNN cannot make them. */
static struct conv_prims *conv_find(const struct tr_cpu_conv_shape *s, int bias,
                                    enum tr_dtype compute, dnnl_status_t *status)
{
    struct conv_key k;
    memset(&k, 0, sizeof k);
    k.s = *s;
    k.bias = bias != 0;
    k.mode = conv_native_bf16(compute) ? MODE_BF16 : MODE_F32;
    k.threads = omp_get_max_threads();
    unsigned h = conv_hash(&k);
    pthread_mutex_lock(&conv_lock);
    struct conv_prims *c = conv_table[h];
    while (c != NULL && memcmp(&c->key, &k, sizeof k) != 0)
        c = c->next;
    *status = dnnl_success;
    if (c == NULL) {
        if (conv_engine == NULL)
            *status = dnnl_engine_create(&conv_engine, dnnl_cpu, 0);
        c = calloc(1, sizeof *c);
        if (c == NULL)
            *status = dnnl_out_of_memory;
        if (*status == dnnl_success) {
            c->key = k;
            *status = create_prims(c);
        }
        if (*status == dnnl_success) {
            c->next = conv_table[h];
            conv_table[h] = c;
        } else if (c != NULL) {
            destroy_prim(&c->fwd);
            destroy_prim(&c->bwd_data);
            destroy_prim(&c->bwd_weights);
            free(c);
            c = NULL;
        }
    }
    pthread_mutex_unlock(&conv_lock);
    return c;
}

/* The primitives for this shape (tr_cpu_conv2d_supported said yes). */
static struct conv_prims *conv_get(const struct tr_cpu_conv_shape *s, int bias,
                                   enum tr_dtype compute)
{
    dnnl_status_t status;
    struct conv_prims *c = conv_find(s, bias, compute, &status);
    if (c == NULL)
        conv_fail("creating the convolution primitives", status, s);
    return c;
}

static dnnl_stream_t stream_get(const struct tr_cpu_conv_shape *s)
{
    if (conv_stream == NULL) {
        dnnl_status_t st = dnnl_stream_create(&conv_stream, conv_engine, dnnl_stream_default_flags);
        if (st != dnnl_success)
            conv_fail("creating a stream", st, s);
    }
    return conv_stream;
}

/* ---- scratch: regions of whole 64-byte lines, in the order below ---- */

static size_t lines(size_t bytes) { return ((bytes + 63) / 64) * 16; } /* in floats */

struct carve {
    float *at;
    size_t used; /* floats */
};

static void *take(struct carve *c, size_t bytes)
{
    void *p = c->at ? c->at + c->used : NULL;
    c->used += lines(bytes);
    return p;
}

static size_t numel_x(const struct tr_cpu_conv_shape *s)
{
    return (size_t)s->B * s->H * s->W * s->IC;
}
static size_t numel_out(const struct tr_cpu_conv_shape *s)
{
    return (size_t)s->B * s->OH * s->OW * s->OC;
}
static size_t numel_w(const struct tr_cpu_conv_shape *s)
{
    return (size_t)s->OC * s->KH * s->KW * (s->IC / s->groups);
}

/* The inputs as the primitives take them: bf16 copies (native), rounded
 * fp32 copies (emulated), or the tensors themselves. */
struct conv_inputs {
    const void *x, *dout;
    const float *w;
};

static struct conv_inputs prepare_inputs(struct carve *sc, const float *x, const float *w,
                                         const float *dout, const struct tr_cpu_conv_shape *s,
                                         enum tr_dtype compute)
{
    struct conv_inputs in = {x, dout, w};
    if (conv_native_bf16(compute)) {
        if (x) {
            uint16_t *xb = take(sc, numel_x(s) * sizeof(uint16_t));
            if (xb)
                tr_cpu_to_bf16(xb, x, numel_x(s));
            in.x = xb;
        }
        if (dout) {
            uint16_t *db = take(sc, numel_out(s) * sizeof(uint16_t));
            if (db)
                tr_cpu_to_bf16(db, dout, numel_out(s));
            in.dout = db;
        }
    } else if (conv_emulated(compute)) {
        int bf16 = compute == TR_BF16;
        if (x) {
            float *xr = take(sc, numel_x(s) * sizeof(float));
            if (xr)
                tr_cpu_round_to_half(xr, x, numel_x(s), bf16);
            in.x = xr;
        }
        float *wr = take(sc, numel_w(s) * sizeof(float));
        if (wr)
            tr_cpu_round_to_half(wr, w, numel_w(s), bf16);
        in.w = wr;
        if (dout) {
            float *dr = take(sc, numel_out(s) * sizeof(float));
            if (dr)
                tr_cpu_round_to_half(dr, dout, numel_out(s), bf16);
            in.dout = dr;
        }
    }
    return in;
}

/* Runs prim with (arg, desc, pointer) triples; NULL pointers are skipped. */
struct arg {
    int what;
    const dnnl_memory_desc_t *md;
    const void *data;
};

static void run(dnnl_primitive_t prim, const struct arg *args, int n,
                const struct tr_cpu_conv_shape *s)
{
    dnnl_memory_t mem[6] = {NULL};
    dnnl_exec_arg_t ex[6];
    int k = 0;
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < n && st == dnnl_success; i++) {
        if (args[i].data == NULL)
            continue;
        st = dnnl_memory_create(&mem[k], args[i].md, conv_engine, (void *)args[i].data);
        ex[k].arg = args[i].what;
        ex[k].memory = mem[k];
        k++;
    }
    dnnl_stream_t stream = stream_get(s);
    if (st == dnnl_success)
        st = dnnl_primitive_execute(prim, stream, k, ex);
    if (st == dnnl_success)
        st = dnnl_stream_wait(stream);
    for (int i = 0; i < k; i++)
        if (mem[i])
            dnnl_memory_destroy(mem[i]);
    if (st != dnnl_success)
        conv_fail("executing a convolution primitive", st, s);
}

static void reorder(dnnl_primitive_t r, const dnnl_memory_desc_t *from_md, const void *from,
                    const dnnl_memory_desc_t *to_md, void *to, const struct tr_cpu_conv_shape *s)
{
    struct arg a[2] = {{DNNL_ARG_FROM, from_md, from}, {DNNL_ARG_TO, to_md, to}};
    run(r, a, 2, s);
}

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

static size_t forward_floats(const struct conv_prims *c, const struct tr_cpu_conv_shape *s,
                             enum tr_dtype compute)
{
    struct carve sc = {NULL, 0};
    prepare_inputs(&sc, (const float *)1, (const float *)1, NULL, s, compute);
    if (c->fwd.reorder)
        take(&sc, c->fwd.wei_bytes);
    take(&sc, c->fwd.scratch_bytes);
    return sc.used;
}

static size_t backward_floats(const struct conv_prims *c, const struct tr_cpu_conv_shape *s,
                              enum tr_dtype compute)
{
    struct carve sc = {NULL, 0};
    prepare_inputs(&sc, (const float *)1, (const float *)1, (const float *)1, s, compute);
    size_t shared = sc.used;
    /* the data gradient: weights reordered, a temporary dx, its scratchpad */
    struct carve d = {NULL, 0};
    if (c->bwd_data.reorder)
        take(&d, c->bwd_data.wei_bytes);
    take(&d, numel_x(s) * sizeof(float));
    take(&d, c->bwd_data.scratch_bytes);
    /* the weight gradient in the primitive's layout, its scratchpad */
    struct carve w = {NULL, 0};
    if (c->bwd_weights_f32) { /* x and dout rounded, in fp32 */
        take(&w, numel_x(s) * sizeof(float));
        take(&w, numel_out(s) * sizeof(float));
    }
    take(&w, c->bwd_weights.wei_bytes);
    take(&w, c->bwd_weights.scratch_bytes);
    return shared + max_z(d.used, w.used);
}

size_t tr_cpu_conv2d_scratch_floats(const struct tr_cpu_conv_shape *s, int bias,
                                    enum tr_dtype compute)
{
    const struct conv_prims *c = conv_get(s, bias, compute);
    return max_z(forward_floats(c, s, compute), backward_floats(c, s, compute));
}

void tr_cpu_conv2d_forward(float *out, const float *x, const float *w, const float *bias,
                           float *scratch, const struct tr_cpu_conv_shape *s, enum tr_dtype compute)
{
    struct conv_prims *c = conv_get(s, bias != NULL, compute);
    struct carve sc = {scratch, 0};
    struct conv_inputs in = prepare_inputs(&sc, x, w, NULL, s, compute);
    const void *wei = in.w;
    if (c->fwd.reorder) {
        void *wre = take(&sc, c->fwd.wei_bytes);
        reorder(c->fwd.reorder, &c->user_wei, in.w, &c->fwd.wei, wre, s);
        wei = wre;
    }
    void *pad = c->fwd.scratch_bytes ? take(&sc, c->fwd.scratch_bytes) : NULL;
    dnnl_memory_desc_t src_in = c->src;
    if (conv_native_bf16(compute))
        src_in.data_type = dnnl_bf16;
    struct arg a[5] = {{DNNL_ARG_SRC, &src_in, in.x},
                       {DNNL_ARG_WEIGHTS, &c->fwd.wei, wei},
                       {DNNL_ARG_BIAS, &c->bias, bias},
                       {DNNL_ARG_DST, &c->dst, out},
                       {DNNL_ARG_SCRATCHPAD, &c->fwd.scratch, pad}};
    run(c->fwd.prim, a, 5, s);
}

void tr_cpu_conv2d_backward(float *dx, float *dw, float *db, float *scratch, const float *dout,
                            const float *x, const float *w, int dx_write,
                            const struct tr_cpu_conv_shape *s, enum tr_dtype compute)
{
    struct conv_prims *c = conv_get(s, db != NULL, compute);
    /* the bias gradient is a sum of the fp32 dout, in row order (kernels.h) */
    if (db)
        tr_cpu_linear_bias_backward(db, dout, s->B * s->OH * s->OW, s->OC, 0);
    if (!dx && !dw)
        return;
    struct carve sc = {scratch, 0};
    struct conv_inputs in =
        prepare_inputs(&sc, dw && !c->bwd_weights_f32 ? x : NULL, w, dout, s, compute);
    size_t shared = sc.used;
    dnnl_memory_desc_t src_in = c->src, dst_in = c->dst;
    if (conv_native_bf16(compute)) {
        src_in.data_type = dnnl_bf16;
        dst_in.data_type = dnnl_bf16;
    }
    if (dx) {
        const void *wei = in.w;
        if (c->bwd_data.reorder) {
            void *wre = take(&sc, c->bwd_data.wei_bytes);
            reorder(c->bwd_data.reorder, &c->user_wei, in.w, &c->bwd_data.wei, wre, s);
            wei = wre;
        }
        /* oneDNN overwrites diff_src: straight into dx when dx is written
         * (its first writer), else through scratch and added */
        float *tmp = take(&sc, numel_x(s) * sizeof(float));
        float *target = dx_write ? dx : tmp;
        void *pad = c->bwd_data.scratch_bytes ? take(&sc, c->bwd_data.scratch_bytes) : NULL;
        struct arg a[4] = {{DNNL_ARG_DIFF_DST, &dst_in, in.dout},
                           {DNNL_ARG_WEIGHTS, &c->bwd_data.wei, wei},
                           {DNNL_ARG_DIFF_SRC, &c->diff_src, target},
                           {DNNL_ARG_SCRATCHPAD, &c->bwd_data.scratch, pad}};
        run(c->bwd_data.prim, a, 4, s);
        if (!dx_write) {
            size_t n = numel_x(s);
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < n; i++)
                dx[i] += tmp[i];
        }
    }
    if (dw) {
        sc.used = shared;
        if (c->bwd_weights_f32) { /* bf16 values, fp32 storage (create_wgrad) */
            float *xr = take(&sc, numel_x(s) * sizeof(float));
            float *dr = take(&sc, numel_out(s) * sizeof(float));
            tr_cpu_round_to_half(xr, x, numel_x(s), 1);
            tr_cpu_round_to_half(dr, dout, numel_out(s), 1);
            in.x = xr;
            in.dout = dr;
            src_in = c->src;
            dst_in = c->dst;
        }
        void *dwre = take(&sc, c->bwd_weights.wei_bytes);
        void *pad = c->bwd_weights.scratch_bytes ? take(&sc, c->bwd_weights.scratch_bytes) : NULL;
        struct arg a[4] = {{DNNL_ARG_SRC, &src_in, in.x},
                           {DNNL_ARG_DIFF_DST, &dst_in, in.dout},
                           {DNNL_ARG_DIFF_WEIGHTS, &c->bwd_weights.wei, dwre},
                           {DNNL_ARG_SCRATCHPAD, &c->bwd_weights.scratch, pad}};
        run(c->bwd_weights.prim, a, 4, s);
        /* dw += the gradient, back in [OC,KH,KW,IC/groups] (a sum post-op) */
        reorder(c->bwd_weights.reorder, &c->bwd_weights.wei, dwre, &c->user_wei, dw, s);
    }
}

int tr_cpu_conv2d_supported(const struct tr_cpu_conv_shape *s, int bias, enum tr_dtype compute)
{
    dnnl_status_t status;
    return conv_find(s, bias, compute, &status) != NULL;
}
