/*
 * The CPU backend's convolutional ops (conv2d, maxpool, avgpool,
 * global_avgpool, batchnorm), run as one-node graphs through the backend
 * interface, so the node's attributes and shapes are read as the engine
 * would hand them over.  Checked against:
 *  - a plain double-precision reference written here (forward), and central
 *    finite differences of it for every gradient (L = sum(out * R), dout = R);
 *  - accumulation: backward adds to gradients that already hold values;
 *  - PyTorch 2.5.1 (tests/fixtures/conv/, made by tests/torch/make_conv_fixtures.py);
 *  - bf16/fp16 compute within the 16-bit tolerance of fp32;
 *  - thread counts: what the kernels promise to keep the same bits.
 *
 * Covers: kernels/cpu/conv.c, pool.c and batchnorm.c, through kernels/cpu/backend.c.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <trainrun/mix.h>

#include "kernels.h"
#include "tensor_init.h"

#define FD_EPS 1e-6
#define FWD_TOL 1e-5
#define GRAD_TOL 1e-4
#define ACCUM_TOL 1e-6

/* ---- data ---------------------------------------------------------------- */

static uint64_t rng_state;

static double uniform(double lo, double hi)
{
    return lo + (hi - lo) * ((double)(tr_splitmix64_next(&rng_state) >> 11) / 9007199254740992.0);
}

static float *fvec(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof(float));
    cr_assert(x != NULL);
    return x;
}

static double *dvec(size_t n)
{
    double *x = calloc(n ? n : 1, sizeof(double));
    cr_assert(x != NULL);
    return x;
}

static float *random_fvec(size_t n, double lo, double hi)
{
    float *x = fvec(n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)uniform(lo, hi);
    return x;
}

static float *copy_fvec(const float *x, size_t n)
{
    float *y = fvec(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double *to_double(const float *x, size_t n)
{
    double *y = dvec(n);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* max |got - want| <= tol * max(max|want|, 1e-3) */
static void expect_close(const char *what, const float *got, const double *want, size_t n,
                         double tol)
{
    double scale = fmax(max_abs(want, n), 1e-3), err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) {
            err = e;
            worst = i;
        }
    }
    cr_assert(err <= tol * scale, "%s: max error %.3g at [%zu] (got %.8g, want %.8g), allowed %.3g",
              what, err, worst, n ? (double)got[worst] : 0.0, n ? want[worst] : 0.0, tol * scale);
}

static void expect_close_ff(const char *what, const float *got, const float *want, size_t n,
                            double tol)
{
    double *w = to_double(want, n);
    expect_close(what, got, w, n, tol);
    free(w);
}

static void expect_bitwise(const char *what, const float *a, const float *b, size_t n)
{
    cr_assert(memcmp(a, b, n * sizeof(float)) == 0, "%s: not bitwise identical", what);
}

typedef void (*ref_fn)(const void *ctx, double *out);

/* dL/dx of L = sum(out * R) by central differences; x is read by forward */
static void check_fd(const char *what, const float *got, ref_fn forward, const void *ctx, double *x,
                     size_t n, const double *R, size_t n_out)
{
    double *out = dvec(n_out), *want = dvec(n);
    for (size_t i = 0; i < n; i++) {
        double saved = x[i], plus = 0.0, minus = 0.0;
        x[i] = saved + FD_EPS;
        forward(ctx, out);
        for (size_t j = 0; j < n_out; j++)
            plus += out[j] * R[j];
        x[i] = saved - FD_EPS;
        forward(ctx, out);
        for (size_t j = 0; j < n_out; j++)
            minus += out[j] * R[j];
        x[i] = saved;
        want[i] = (plus - minus) / (2.0 * FD_EPS);
    }
    expect_close(what, got, want, n, GRAD_TOL);
    free(out);
    free(want);
}

/* ---- one-node graphs ------------------------------------------------------ */

typedef struct {
    struct tr_graph g;
    struct tr_tensor t[8];
    struct tr_node n;
    struct tr_backend be;
    int threads;
} one_node;

static void node_open(one_node *o, int n_tensors, enum tr_dtype compute, int threads)
{
    o->g.tensors = o->t;
    o->g.n_tensors = n_tensors;
    o->g.nodes = &o->n;
    o->g.n_nodes = 1;
    o->g.loss = -1;
    o->g.logits = -1;
    o->g.compute = compute;
    o->g.training = 1;
    cr_assert(tr_cpu_backend_init(&o->be, threads) == 0);
    const struct tr_backend_iface *in = o->be.iface;
    cr_assert(in->supports_op(o->be.context, &o->g, &o->n), "the CPU backend runs this node");
    o->g.scratch_floats = in->scratch_floats(o->be.context, &o->g, &o->n);
    o->g.scratch = fvec(o->g.scratch_floats);
}

static void node_forward(one_node *o) { o->be.iface->forward(o->be.context, &o->g, &o->n); }
static void node_backward(one_node *o) { o->be.iface->backward(o->be.context, &o->g, &o->n); }

static void node_close(one_node *o)
{
    free(o->g.scratch);
    tr_cpu_backend_free(&o->be);
    omp_set_num_threads(2);
}

/* ======================================================================== */
/* conv2d                                                                    */
/* ======================================================================== */

struct conv_case {
    const char *name;
    int B, H, W, IC, OC, KH, KW;
    int stride[2], pad[2], dilation[2], groups, bias;
};

static int out_size(int in, int k, int s, int p, int d)
{
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

struct conv_ref {
    const struct conv_case *c;
    int OH, OW;
    const double *x, *w, *b;
};

static void ref_conv(const void *vctx, double *out)
{
    const struct conv_ref *r = vctx;
    const struct conv_case *c = r->c;
    int icg = c->IC / c->groups, ocg = c->OC / c->groups;
    for (int b = 0; b < c->B; b++)
        for (int oh = 0; oh < r->OH; oh++)
            for (int ow = 0; ow < r->OW; ow++)
                for (int oc = 0; oc < c->OC; oc++) {
                    int g = oc / ocg;
                    double s = r->b ? r->b[oc] : 0.0;
                    for (int kh = 0; kh < c->KH; kh++) {
                        int h = oh * c->stride[0] - c->pad[0] + kh * c->dilation[0];
                        if (h < 0 || h >= c->H)
                            continue;
                        for (int kw = 0; kw < c->KW; kw++) {
                            int w = ow * c->stride[1] - c->pad[1] + kw * c->dilation[1];
                            if (w < 0 || w >= c->W)
                                continue;
                            const double *xp =
                                r->x + (((size_t)b * c->H + h) * c->W + w) * c->IC + g * icg;
                            const double *wp =
                                r->w + (((size_t)oc * c->KH + kh) * c->KW + kw) * icg;
                            for (int i = 0; i < icg; i++)
                                s += xp[i] * wp[i];
                        }
                    }
                    out[(((size_t)b * r->OH + oh) * r->OW + ow) * c->OC + oc] = s;
                }
}

/* tensors 0 x, 1 w, 2 bias (if any), then out */
struct conv_run {
    float *out, *dx, *dw, *db;
};

static struct conv_run run_conv(const struct conv_case *c, const float *x, const float *w,
                                const float *b, const float *dout, enum tr_dtype compute,
                                int threads, const float *prefill_dx, const float *prefill_dw,
                                const float *prefill_db)
{
    int OH = out_size(c->H, c->KH, c->stride[0], c->pad[0], c->dilation[0]);
    int OW = out_size(c->W, c->KW, c->stride[1], c->pad[1], c->dilation[1]);
    size_t nx = (size_t)c->B * c->H * c->W * c->IC,
           nw = (size_t)c->OC * c->KH * c->KW * (c->IC / c->groups);
    size_t no = (size_t)c->B * OH * OW * c->OC;
    struct conv_run r = {fvec(no), fvec(nx), fvec(nw), c->bias ? fvec(c->OC) : NULL};
    if (prefill_dx)
        memcpy(r.dx, prefill_dx, nx * sizeof(float));
    if (prefill_dw)
        memcpy(r.dw, prefill_dw, nw * sizeof(float));
    if (prefill_db && r.db)
        memcpy(r.db, prefill_db, c->OC * sizeof(float));
    one_node o = {0};
    int64_t xs[4] = {c->B, c->H, c->W, c->IC}, ws[4] = {c->OC, c->KH, c->KW, c->IC / c->groups};
    int64_t bs[1] = {c->OC}, os[4] = {c->B, OH, OW, c->OC};
    tensor_init(&o.t[0], 4, xs, (float *)x, r.dx);
    tensor_init(&o.t[1], 4, ws, (float *)w, r.dw);
    int k = 2;
    if (c->bias)
        tensor_init(&o.t[k++], 1, bs, (float *)b, r.db);
    float *dout_copy = copy_fvec(dout, no);
    tensor_init(&o.t[k], 4, os, r.out, dout_copy);
    o.n.op = TR_OP_CONV2D;
    o.n.n_in = k;
    for (int i = 0; i < k; i++)
        o.n.in[i] = i;
    o.n.out = k;
    o.n.groups = c->groups;
    for (int d = 0; d < 2; d++) {
        o.n.stride[d] = c->stride[d];
        o.n.pad[d] = c->pad[d];
        o.n.dilation[d] = c->dilation[d];
    }
    /* a dx that holds zeros is written straight (the graph's first writer) */
    o.n.zero_grad_mask = prefill_dx ? 0u : 1u;
    node_open(&o, k + 1, compute, threads);
    node_forward(&o);
    node_backward(&o);
    node_close(&o);
    expect_bitwise("dout is read-only", dout_copy, dout, no);
    free(dout_copy);
    return r;
}

static void free_run(struct conv_run *r)
{
    free(r->out);
    free(r->dx);
    free(r->dw);
    free(r->db);
}

static void check_conv(const struct conv_case *c)
{
    int OH = out_size(c->H, c->KH, c->stride[0], c->pad[0], c->dilation[0]);
    int OW = out_size(c->W, c->KW, c->stride[1], c->pad[1], c->dilation[1]);
    size_t nx = (size_t)c->B * c->H * c->W * c->IC,
           nw = (size_t)c->OC * c->KH * c->KW * (c->IC / c->groups);
    size_t no = (size_t)c->B * OH * OW * c->OC;
    float *x = random_fvec(nx, -1, 1), *w = random_fvec(nw, -1, 1), *b = random_fvec(c->OC, -1, 1);
    float *dout = random_fvec(no, -1, 1);
    struct conv_run r = run_conv(c, x, w, c->bias ? b : NULL, dout, TR_F32, 2, NULL, NULL, NULL);

    double *xd = to_double(x, nx), *wd = to_double(w, nw), *bd = to_double(b, c->OC);
    double *R = to_double(dout, no), *want = dvec(no);
    struct conv_ref ref = {c, OH, OW, xd, wd, c->bias ? bd : NULL};
    ref_conv(&ref, want);
    char what[128];
    snprintf(what, sizeof what, "%s: forward", c->name);
    expect_close(what, r.out, want, no, FWD_TOL);
    snprintf(what, sizeof what, "%s: dx", c->name);
    check_fd(what, r.dx, ref_conv, &ref, xd, nx, R, no);
    snprintf(what, sizeof what, "%s: dw", c->name);
    check_fd(what, r.dw, ref_conv, &ref, wd, nw, R, no);
    if (c->bias) {
        snprintf(what, sizeof what, "%s: db", c->name);
        check_fd(what, r.db, ref_conv, &ref, bd, c->OC, R, no);
    }

    /* backward accumulates: prefilled gradients get the same gradient added */
    float *px = random_fvec(nx, -1, 1), *pw = random_fvec(nw, -1, 1),
          *pb = random_fvec(c->OC, -1, 1);
    struct conv_run a = run_conv(c, x, w, c->bias ? b : NULL, dout, TR_F32, 2, px, pw, pb);
    double *sum = dvec(nx > nw ? nx : nw);
    for (size_t i = 0; i < nx; i++)
        sum[i] = (double)px[i] + r.dx[i];
    snprintf(what, sizeof what, "%s: dx accumulates", c->name);
    expect_close(what, a.dx, sum, nx, ACCUM_TOL);
    for (size_t i = 0; i < nw; i++)
        sum[i] = (double)pw[i] + r.dw[i];
    snprintf(what, sizeof what, "%s: dw accumulates", c->name);
    expect_close(what, a.dw, sum, nw, ACCUM_TOL);
    if (c->bias) {
        for (int i = 0; i < c->OC; i++)
            sum[i] = (double)pb[i] + r.db[i];
        snprintf(what, sizeof what, "%s: db accumulates", c->name);
        expect_close(what, a.db, sum, c->OC, ACCUM_TOL);
    }
    free_run(&a);
    free_run(&r);
    free(sum);
    free(px);
    free(pw);
    free(pb);
    free(x);
    free(w);
    free(b);
    free(dout);
    free(xd);
    free(wd);
    free(bd);
    free(R);
    free(want);
}

static const struct conv_case conv_cases[] = {
    {"3x3 pad 1 bias", 2, 5, 6, 4, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1},
    {"3x3 stride 2 pad 1", 2, 7, 6, 3, 5, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, 0},
    {"1x1 stride 2 (even size: the last row skipped)",
     2,
     6,
     4,
     5,
     7,
     1,
     1,
     {2, 2},
     {0, 0},
     {1, 1},
     1,
     1},
    {"1x1", 3, 3, 3, 8, 4, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, 0},
    {"dilation 2", 1, 7, 8, 3, 4, 3, 3, {1, 1}, {2, 2}, {2, 2}, 1, 1},
    {"groups 2", 2, 5, 5, 6, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, 1},
    {"depthwise", 2, 6, 5, 8, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 8, 0},
    {"depthwise stride 2, multiplier 2", 2, 6, 6, 4, 8, 3, 3, {2, 2}, {1, 1}, {1, 1}, 4, 1},
    {"rectangular 3x2, stride (2,1), pad (1,0), dilation (1,2)",
     2,
     7,
     7,
     3,
     4,
     3,
     2,
     {2, 1},
     {1, 0},
     {1, 2},
     1,
     1},
    {"no padding, kernel = input", 2, 4, 4, 3, 5, 4, 4, {1, 1}, {0, 0}, {1, 1}, 1, 1},
};

Test(conv, forward_backward_every_attribute)
{
    rng_state = 2024;
    for (size_t i = 0; i < sizeof conv_cases / sizeof *conv_cases; i++)
        check_conv(&conv_cases[i]);
}

/* A convolution oneDNN cannot make (here groups not dividing the input
 * channels, which the graph checks refuse before this) is refused by
 * supports_op, so the engine reports it instead of aborting in a step. */
Test(conv, unsupported_shape_refused)
{
    one_node o = {0};
    float x[2 * 4 * 4 * 5] = {0}, w[4 * 3 * 3 * 2] = {0}, out[2 * 4 * 4 * 4];
    int64_t xs[4] = {2, 4, 4, 5}, ws[4] = {4, 3, 3, 2}, os[4] = {2, 4, 4, 4};
    tensor_init(&o.t[0], 4, xs, x, NULL);
    tensor_init(&o.t[1], 4, ws, w, NULL);
    tensor_init(&o.t[2], 4, os, out, NULL);
    o.n.op = TR_OP_CONV2D;
    o.n.n_in = 2;
    o.n.in[0] = 0;
    o.n.in[1] = 1;
    o.n.out = 2;
    o.n.groups = 2;
    for (int d = 0; d < 2; d++) {
        o.n.stride[d] = o.n.dilation[d] = 1;
        o.n.pad[d] = 1;
    }
    o.g.tensors = o.t;
    o.g.n_tensors = 3;
    o.g.nodes = &o.n;
    o.g.n_nodes = 1;
    o.g.compute = TR_F32;
    cr_assert(tr_cpu_backend_init(&o.be, 2) == 0);
    cr_assert(!o.be.iface->supports_op(o.be.context, &o.g, &o.n),
              "IC 5 in 2 groups: refused by supports_op");
    o.n.groups = 1; /* the same node with one group (w then [4,3,3,5]) */
    o.t[1].shape[3] = 5;
    float w5[4 * 3 * 3 * 5] = {0};
    o.t[1].data = w5;
    cr_assert(o.be.iface->supports_op(o.be.context, &o.g, &o.n), "one group: runs");
    tr_cpu_backend_free(&o.be);
}

/* compute bf16/fp16: the same numbers rounded to 16 bits, fp32 sums.  The
 * result must equal (to fp32 rounding of the sums) the fp32 convolution of
 * the rounded inputs, and stay within the 16-bit tolerance of fp32. */
static void check_conv_half(enum tr_dtype compute)
{
    rng_state = 77;
    /* 16x16 outputs: bf16 weight gradients native (conv.c runs smaller
     * images' in fp32 on rounded inputs); the others: that fallback */
    static const struct conv_case big = {
        "16x16 3x3", 2, 16, 16, 16, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1};
    const struct conv_case *cs[] = {&conv_cases[0], &conv_cases[6], &conv_cases[8], &big};
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
        const struct conv_case *c = cs[k];
        int OH = out_size(c->H, c->KH, c->stride[0], c->pad[0], c->dilation[0]);
        int OW = out_size(c->W, c->KW, c->stride[1], c->pad[1], c->dilation[1]);
        size_t nx = (size_t)c->B * c->H * c->W * c->IC,
               nw = (size_t)c->OC * c->KH * c->KW * (c->IC / c->groups);
        size_t no = (size_t)c->B * OH * OW * c->OC;
        float *x = random_fvec(nx, -1, 1), *w = random_fvec(nw, -1, 1),
              *b = random_fvec(c->OC, -1, 1);
        float *dout = random_fvec(no, -1, 1);
        int bf16 = compute == TR_BF16;
        float *xr = fvec(nx), *wr = fvec(nw), *dr = fvec(no);
        tr_cpu_round_to_half(xr, x, nx, bf16);
        tr_cpu_round_to_half(wr, w, nw, bf16);
        tr_cpu_round_to_half(dr, dout, no, bf16);
        struct conv_run h =
            run_conv(c, x, w, c->bias ? b : NULL, dout, compute, 2, NULL, NULL, NULL);
        struct conv_run e =
            run_conv(c, xr, wr, c->bias ? b : NULL, dr, TR_F32, 2, NULL, NULL, NULL);
        struct conv_run f =
            run_conv(c, x, w, c->bias ? b : NULL, dout, TR_F32, 2, NULL, NULL, NULL);
        char what[160];
        const char *name = bf16 ? "bf16" : "fp16";
        snprintf(what, sizeof what, "%s %s: forward vs fp32 on rounded inputs", c->name, name);
        expect_close_ff(what, h.out, e.out, no, 1e-5);
        snprintf(what, sizeof what, "%s %s: dx vs fp32 on rounded inputs", c->name, name);
        expect_close_ff(what, h.dx, e.dx, nx, 1e-5);
        snprintf(what, sizeof what, "%s %s: dw vs fp32 on rounded inputs", c->name, name);
        expect_close_ff(what, h.dw, e.dw, nw, 1e-5);
        /* 16-bit inputs: relative errors of a few 2^-8 (bf16) or 2^-11 (fp16) */
        double tol = bf16 ? 3e-2 : 4e-3;
        snprintf(what, sizeof what, "%s %s: forward vs fp32", c->name, name);
        expect_close_ff(what, h.out, f.out, no, tol);
        snprintf(what, sizeof what, "%s %s: dx vs fp32", c->name, name);
        expect_close_ff(what, h.dx, f.dx, nx, tol);
        snprintf(what, sizeof what, "%s %s: dw vs fp32", c->name, name);
        expect_close_ff(what, h.dw, f.dw, nw, tol);
        if (c->bias) { /* from the fp32 dout, as linear's */
            snprintf(what, sizeof what, "%s %s: db is fp32's", c->name, name);
            expect_bitwise(what, h.db, f.db, c->OC);
        }
        free_run(&h);
        free_run(&e);
        free_run(&f);
        free(x);
        free(w);
        free(b);
        free(dout);
        free(xr);
        free(wr);
        free(dr);
    }
}

Test(conv, bf16_within_tolerance_of_fp32)
{
    if (tr_cpu_bf16_native_isa() == NULL)
        cr_log_info("bf16 convolutions emulated on this CPU (no AVX512-BF16/AMX for oneDNN)");
    check_conv_half(TR_BF16);
}

Test(conv, fp16_within_tolerance_of_fp32) { check_conv_half(TR_F16); }

/* Forward and dx are the same bits for any thread count; dw is the same bits
 * run after run at one thread count (oneDNN splits its sums by threads). */
Test(conv, threads)
{
    rng_state = 99;
    struct conv_case c = {"threads", 4, 12, 12, 16, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1};
    size_t nx = (size_t)c.B * c.H * c.W * c.IC, nw = (size_t)c.OC * c.KH * c.KW * c.IC;
    size_t no = (size_t)c.B * c.H * c.W * c.OC;
    float *x = random_fvec(nx, -1, 1), *w = random_fvec(nw, -1, 1), *b = random_fvec(c.OC, -1, 1);
    float *dout = random_fvec(no, -1, 1);
    struct conv_run one = run_conv(&c, x, w, b, dout, TR_F32, 1, NULL, NULL, NULL);
    struct conv_run two = run_conv(&c, x, w, b, dout, TR_F32, 2, NULL, NULL, NULL);
    struct conv_run again = run_conv(&c, x, w, b, dout, TR_F32, 2, NULL, NULL, NULL);
    expect_bitwise("forward, 1 and 2 threads", one.out, two.out, no);
    expect_bitwise("dx, 1 and 2 threads", one.dx, two.dx, nx);
    expect_bitwise("db, 1 and 2 threads", one.db, two.db, (size_t)c.OC);
    expect_bitwise("dw, 2 threads twice", two.dw, again.dw, nw);
    expect_close_ff("dw, 1 and 2 threads", one.dw, two.dw, nw, 1e-6);
    cr_log_info("conv dw with 1 and 2 threads: %s",
                memcmp(one.dw, two.dw, nw * sizeof(float)) == 0 ? "same bits" : "different bits");
    free_run(&one);
    free_run(&two);
    free_run(&again);
    free(x);
    free(w);
    free(b);
    free(dout);
}

/* ======================================================================== */
/* pooling                                                                   */
/* ======================================================================== */

struct pool_case {
    const char *name;
    int B, H, W, C, KH, KW, stride[2], pad[2];
};

struct pool_ref {
    const struct pool_case *c;
    enum tr_op op;
    int OH, OW;
    const double *x;
};

static void ref_pool(const void *vctx, double *out)
{
    const struct pool_ref *r = vctx;
    const struct pool_case *c = r->c;
    for (int b = 0; b < c->B; b++)
        for (int oh = 0; oh < r->OH; oh++)
            for (int ow = 0; ow < r->OW; ow++)
                for (int ch = 0; ch < c->C; ch++) {
                    double s = r->op == TR_OP_MAXPOOL ? -INFINITY : 0.0;
                    for (int kh = 0; kh < c->KH; kh++)
                        for (int kw = 0; kw < c->KW; kw++) {
                            int h = oh * c->stride[0] - c->pad[0] + kh;
                            int w = ow * c->stride[1] - c->pad[1] + kw;
                            if (h < 0 || h >= c->H || w < 0 || w >= c->W)
                                continue;
                            double v = r->x[(((size_t)b * c->H + h) * c->W + w) * c->C + ch];
                            s = r->op == TR_OP_MAXPOOL ? fmax(s, v) : s + v;
                        }
                    if (r->op == TR_OP_AVGPOOL)
                        s /= c->KH * c->KW;
                    out[(((size_t)b * r->OH + oh) * r->OW + ow) * c->C + ch] = s;
                }
}

/* forward and backward of one pooling node; dx prefilled with `prefill` */
static void run_pool(enum tr_op op, const struct pool_case *c, int OH, int OW, const float *x,
                     const float *dout, float *out, float *dx, int threads)
{
    one_node o = {0};
    int64_t xs[4] = {c->B, c->H, c->W, c->C}, os[4] = {c->B, OH, OW, c->C};
    size_t no = (size_t)c->B * OH * OW * c->C;
    float *dcopy = copy_fvec(dout, no);
    tensor_init(&o.t[0], 4, xs, (float *)x, dx);
    tensor_init(&o.t[1], 4, os, out, dcopy);
    o.n.op = op;
    o.n.n_in = 1;
    o.n.in[0] = 0;
    o.n.out = 1;
    o.n.kernel[0] = c->KH;
    o.n.kernel[1] = c->KW;
    for (int d = 0; d < 2; d++) {
        o.n.stride[d] = c->stride[d];
        o.n.pad[d] = c->pad[d];
    }
    node_open(&o, 2, TR_F32, threads);
    node_forward(&o);
    node_backward(&o);
    node_close(&o);
    free(dcopy);
}

static const struct pool_case pool_cases[] = {
    {"2x2 stride 2", 2, 6, 4, 5, 2, 2, {2, 2}, {0, 0}},
    {"3x3 stride 2 pad 1 (overlapping)", 2, 7, 6, 3, 3, 3, {2, 2}, {1, 1}},
    {"3x3 stride 1 pad 1", 1, 5, 5, 70, 3, 3, {1, 1}, {1, 1}}, /* C over one chunk of 64 */
    {"3x2 stride (1,2) pad (1,0)", 2, 5, 6, 4, 3, 2, {1, 2}, {1, 0}},
};

static void check_pool(enum tr_op op)
{
    for (size_t k = 0; k < sizeof pool_cases / sizeof *pool_cases; k++) {
        const struct pool_case *c = &pool_cases[k];
        int OH = out_size(c->H, c->KH, c->stride[0], c->pad[0], 1);
        int OW = out_size(c->W, c->KW, c->stride[1], c->pad[1], 1);
        size_t nx = (size_t)c->B * c->H * c->W * c->C, no = (size_t)c->B * OH * OW * c->C;
        /* distinct values a finite difference cannot reorder (max pooling) */
        float *x = fvec(nx);
        for (size_t i = 0; i < nx; i++)
            x[i] = (float)((double)((i * 7919) % nx) / nx * 4.0 - 2.0 + uniform(0, 1e-3));
        float *dout = random_fvec(no, -1, 1), *out = fvec(no), *dx = fvec(nx);
        run_pool(op, c, OH, OW, x, dout, out, dx, 2);
        double *xd = to_double(x, nx), *R = to_double(dout, no), *want = dvec(no);
        struct pool_ref ref = {c, op, OH, OW, xd};
        ref_pool(&ref, want);
        char what[128];
        snprintf(what, sizeof what, "%s %s: forward", op == TR_OP_MAXPOOL ? "max" : "avg", c->name);
        expect_close(what, out, want, no, FWD_TOL);
        snprintf(what, sizeof what, "%s %s: dx", op == TR_OP_MAXPOOL ? "max" : "avg", c->name);
        check_fd(what, dx, ref_pool, &ref, xd, nx, R, no);
        /* accumulates, and the same bits with one thread */
        float *pre = random_fvec(nx, -1, 1), *dx2 = copy_fvec(pre, nx), *out1 = fvec(no);
        run_pool(op, c, OH, OW, x, dout, out1, dx2, 1);
        double *sum = dvec(nx);
        for (size_t i = 0; i < nx; i++)
            sum[i] = (double)pre[i] + dx[i];
        snprintf(what, sizeof what, "%s: accumulates", c->name);
        expect_close(what, dx2, sum, nx, ACCUM_TOL);
        expect_bitwise("pool forward, 1 and 2 threads", out, out1, no);
        free(pre);
        free(dx2);
        free(out1);
        free(sum);
        free(x);
        free(dout);
        free(out);
        free(dx);
        free(xd);
        free(R);
        free(want);
    }
}

Test(maxpool, forward_backward)
{
    rng_state = 5;
    check_pool(TR_OP_MAXPOOL);
}
Test(avgpool, forward_backward_padding_counts_as_zeros)
{
    rng_state = 6;
    check_pool(TR_OP_AVGPOOL);
}

/* ties: the first maximum in row-major order gets the whole gradient; a
 * window half in padding never routes to the padding */
Test(maxpool, ties_go_to_the_first_maximum)
{
    struct pool_case c = {"ties", 1, 2, 2, 1, 2, 2, {1, 1}, {1, 1}};
    float x[4] = {-1.0f, -1.0f, -1.0f, -1.0f}, dout[9], out[9], dx[4] = {0};
    for (int i = 0; i < 9; i++)
        dout[i] = 1.0f;
    run_pool(TR_OP_MAXPOOL, &c, 3, 3, x, dout, out, dx, 2);
    for (int i = 0; i < 9; i++)
        cr_assert(out[i] == -1.0f, "padding never wins (out[%d] = %g)", i, out[i]);
    /* windows (by top-left, padded): each covers the pixels below/right;
     * its first pixel in row-major order is its top-left valid one */
    float want[4] = {4.0f, 2.0f, 2.0f, 1.0f};
    for (int i = 0; i < 4; i++)
        cr_assert(dx[i] == want[i], "dx[%d] = %g, want %g", i, dx[i], want[i]);
}

Test(global_avgpool, forward_backward)
{
    rng_state = 7;
    enum { B = 3, H = 4, W = 5, C = 6 };
    size_t nx = B * H * W * C;
    float *x = random_fvec(nx, -1, 1), *dout = random_fvec(B * C, -1, 1);
    float *out = fvec(B * C), *dx = random_fvec(nx, -1, 1), *pre = copy_fvec(dx, nx);
    one_node o = {0};
    int64_t xs[4] = {B, H, W, C}, os[2] = {B, C};
    tensor_init(&o.t[0], 4, xs, x, dx);
    tensor_init(&o.t[1], 2, os, out, dout);
    o.n.op = TR_OP_GLOBAL_AVGPOOL;
    o.n.n_in = 1;
    o.n.out = 1;
    node_open(&o, 2, TR_F32, 2);
    node_forward(&o);
    node_backward(&o);
    node_close(&o);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int p = 0; p < H * W; p++)
                s += x[((size_t)b * H * W + p) * C + c];
            cr_assert(fabs(out[b * C + c] - s / (H * W)) < 1e-6, "mean of [%d,%d]", b, c);
            for (int p = 0; p < H * W; p++) {
                size_t i = ((size_t)b * H * W + p) * C + c;
                cr_assert(fabs(dx[i] - (pre[i] + dout[b * C + c] / (H * W))) < 1e-6,
                          "dx[%zu] accumulates dout / HW", i);
            }
        }
    free(x);
    free(dout);
    free(out);
    free(dx);
    free(pre);
}

/* ======================================================================== */
/* batch norm                                                                */
/* ======================================================================== */

struct bn_ref {
    int N, C, training;
    double eps;
    const double *x, *w, *b, *running;
};

static void ref_bn(const void *vctx, double *out)
{
    const struct bn_ref *r = vctx;
    for (int c = 0; c < r->C; c++) {
        double m, var;
        if (r->training) {
            m = 0.0;
            var = 0.0;
            for (int i = 0; i < r->N; i++)
                m += r->x[(size_t)i * r->C + c];
            m /= r->N;
            for (int i = 0; i < r->N; i++) {
                double d = r->x[(size_t)i * r->C + c] - m;
                var += d * d;
            }
            var /= r->N;
        } else {
            m = r->running[c];
            var = r->running[r->C + c];
        }
        double rstd = 1.0 / sqrt(var + r->eps);
        for (int i = 0; i < r->N; i++)
            out[(size_t)i * r->C + c] = (r->x[(size_t)i * r->C + c] - m) * rstd * r->w[c] + r->b[c];
    }
}

struct bn_run {
    float *out, *dx, *dw, *db, *mean, *rstd, *running;
};

/* x as [B,H,W,C]; tensors 0 x, 1 w, 2 b, 3 out, 4 mean, 5 rstd, 6 running */
static struct bn_run run_bn(int B, int H, int W, int C, const float *x, const float *w,
                            const float *b, const float *dout, const float *running, int training,
                            int recomputing, int threads, float momentum)
{
    size_t nx = (size_t)B * H * W * C;
    struct bn_run r = {
        fvec(nx), fvec(nx), fvec(C), fvec(C), fvec(C), fvec(C), copy_fvec(running, 2 * C)};
    one_node o = {0};
    int64_t xs[4] = {B, H, W, C}, cs[1] = {C}, rs[2] = {2, C};
    float *dcopy = copy_fvec(dout, nx);
    tensor_init(&o.t[0], 4, xs, (float *)x, r.dx);
    tensor_init(&o.t[1], 1, cs, (float *)w, r.dw);
    tensor_init(&o.t[2], 1, cs, (float *)b, r.db);
    tensor_init(&o.t[3], 4, xs, r.out, dcopy);
    tensor_init(&o.t[4], 1, cs, r.mean, NULL);
    tensor_init(&o.t[5], 1, cs, r.rstd, NULL);
    tensor_init(&o.t[6], 2, rs, r.running, NULL);
    o.t[6].role = TR_ROLE_BUFFER;
    o.n.op = TR_OP_BATCHNORM;
    o.n.n_in = 3;
    o.n.in[0] = 0;
    o.n.in[1] = 1;
    o.n.in[2] = 2;
    o.n.out = 3;
    o.n.n_aux = 2;
    o.n.aux[0] = 4;
    o.n.aux[1] = 5;
    o.n.eps = 1e-5f;
    o.n.momentum = momentum;
    o.n.buffer = 6;
    node_open(&o, 7, TR_F32, threads);
    o.g.training = training;
    o.g.recomputing = recomputing;
    node_forward(&o);
    node_backward(&o);
    node_close(&o);
    free(dcopy);
    return r;
}

static void free_bn(struct bn_run *r)
{
    free(r->out);
    free(r->dx);
    free(r->dw);
    free(r->db);
    free(r->mean);
    free(r->rstd);
    free(r->running);
}

static void check_bn(int training)
{
    enum { B = 2, H = 3, W = 5, C = 4 };
    int N = B * H * W;
    size_t nx = (size_t)N * C;
    /* channels with a mean far from zero: the one-pass variance must hold */
    float *x = fvec(nx);
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)(uniform(-1, 1) * (1 + i % C) + 10.0 * (i % C));
    float *w = random_fvec(C, 0.5, 1.5), *b = random_fvec(C, -1, 1), *dout = random_fvec(nx, -1, 1);
    float running[2 * C];
    for (int c = 0; c < C; c++) {
        running[c] = (float)uniform(-1, 1);
        running[C + c] = (float)uniform(0.5, 2);
    }
    struct bn_run r = run_bn(B, H, W, C, x, w, b, dout, running, training, 0, 2, 0.1f);
    double *xd = to_double(x, nx), *wd = to_double(w, C), *bd = to_double(b, C);
    double *rd = to_double(running, 2 * C), *R = to_double(dout, nx), *want = dvec(nx);
    struct bn_ref ref = {N, C, training, 1e-5, xd, wd, bd, rd};
    ref_bn(&ref, want);
    const char *mode = training ? "training" : "eval";
    char what[96];
    snprintf(what, sizeof what, "batchnorm %s: forward", mode);
    expect_close(what, r.out, want, nx, FWD_TOL);
    snprintf(what, sizeof what, "batchnorm %s: dx", mode);
    check_fd(what, r.dx, ref_bn, &ref, xd, nx, R, nx);
    snprintf(what, sizeof what, "batchnorm %s: dw", mode);
    check_fd(what, r.dw, ref_bn, &ref, wd, C, R, nx);
    snprintf(what, sizeof what, "batchnorm %s: db", mode);
    check_fd(what, r.db, ref_bn, &ref, bd, C, R, nx);
    /* running statistics: moved by momentum toward the batch's (unbiased
     * variance) in training, untouched in eval */
    for (int c = 0; c < C; c++) {
        double m = 0.0, v = 0.0;
        for (int i = 0; i < N; i++)
            m += xd[(size_t)i * C + c];
        m /= N;
        for (int i = 0; i < N; i++)
            v += (xd[(size_t)i * C + c] - m) * (xd[(size_t)i * C + c] - m);
        double rm = training ? 0.9 * running[c] + 0.1 * m : running[c];
        double rv = training ? 0.9 * running[C + c] + 0.1 * v / (N - 1) : running[C + c];
        cr_assert(fabs(r.running[c] - rm) <= 1e-5 * fmax(1, fabs(rm)),
                  "%s: running mean[%d] %g, want %g", mode, c, r.running[c], rm);
        cr_assert(fabs(r.running[C + c] - rv) <= 1e-5 * fmax(1, rv),
                  "%s: running var[%d] %g, want %g", mode, c, r.running[C + c], rv);
    }
    free_bn(&r);
    free(x);
    free(w);
    free(b);
    free(dout);
    free(xd);
    free(wd);
    free(bd);
    free(rd);
    free(R);
    free(want);
}

Test(batchnorm, training_forward_backward_running_stats)
{
    rng_state = 11;
    check_bn(1);
}
Test(batchnorm, eval_uses_running_stats)
{
    rng_state = 12;
    check_bn(0);
}

/* a recomputed forward (backward re-running a segment) gives the same
 * output and does not move the running statistics a second time */
Test(batchnorm, recomputing_leaves_running_stats)
{
    rng_state = 13;
    enum { B = 2, H = 4, W = 4, C = 8 };
    size_t nx = (size_t)B * H * W * C;
    float *x = random_fvec(nx, -2, 2), *w = random_fvec(C, 0.5, 1.5), *b = random_fvec(C, -1, 1);
    float *dout = random_fvec(nx, -1, 1), running[2 * C];
    for (int c = 0; c < C; c++) {
        running[c] = 0.0f;
        running[C + c] = 1.0f;
    }
    struct bn_run first = run_bn(B, H, W, C, x, w, b, dout, running, 1, 0, 2, 0.1f);
    struct bn_run again = run_bn(B, H, W, C, x, w, b, dout, running, 1, 1, 2, 0.1f);
    expect_bitwise("recomputed output", first.out, again.out, nx);
    expect_bitwise("recomputed dx", first.dx, again.dx, nx);
    expect_bitwise("running stats untouched while recomputing", again.running, running, 2 * C);
    cr_assert(memcmp(first.running, running, sizeof running) != 0, "training moves them");
    free_bn(&first);
    free_bn(&again);
    free(x);
    free(w);
    free(b);
    free(dout);
}

Test(batchnorm, same_bits_for_any_thread_count)
{
    rng_state = 14;
    enum { B = 8, H = 16, W = 16, C = 24 }; /* several chunks of rows */
    size_t nx = (size_t)B * H * W * C;
    float *x = random_fvec(nx, -2, 2), *w = random_fvec(C, 0.5, 1.5), *b = random_fvec(C, -1, 1);
    float *dout = random_fvec(nx, -1, 1), running[2 * C];
    for (int c = 0; c < 2 * C; c++)
        running[c] = c < C ? 0.0f : 1.0f;
    struct bn_run one = run_bn(B, H, W, C, x, w, b, dout, running, 1, 0, 1, 0.1f);
    struct bn_run two = run_bn(B, H, W, C, x, w, b, dout, running, 1, 0, 2, 0.1f);
    expect_bitwise("out", one.out, two.out, nx);
    expect_bitwise("dx", one.dx, two.dx, nx);
    expect_bitwise("dw", one.dw, two.dw, C);
    expect_bitwise("db", one.db, two.db, C);
    expect_bitwise("running", one.running, two.running, 2 * C);
    free_bn(&one);
    free_bn(&two);
    free(x);
    free(w);
    free(b);
    free(dout);
}

/* ======================================================================== */
/* PyTorch fixtures (tests/torch/make_conv_fixtures.py)                      */
/* ======================================================================== */

#define CONV_FIXTURES TR_TEST_SRCDIR "/fixtures/conv/"
#define TORCH_TOL 1e-5 /* fp32 kernels against PyTorch in float64 */

struct fixture {
    int n;
    char name[16][17];
    int ndim[16];
    int64_t dims[16][4];
    size_t numel[16];
    float *data[16];
};

/* Reads NAME.bin (format in make_conv_fixtures.py), checking every size
 * against the file's length. */
static void fixture_load(struct fixture *f, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, CONV_FIXTURES "%s.bin", name);
    FILE *fp = fopen(path, "rb");
    cr_assert(fp != NULL, "cannot open %s (made by tests/torch/make_conv_fixtures.py)", path);
    memset(f, 0, sizeof *f);
    int32_t n = 0;
    cr_assert(fread(&n, 4, 1, fp) == 1 && n > 0 && n <= 16, "%s: bad array count", path);
    f->n = n;
    for (int i = 0; i < n; i++) {
        int32_t nd = 0;
        cr_assert(fread(f->name[i], 1, 16, fp) == 16, "%s: truncated header", path);
        cr_assert(fread(&nd, 4, 1, fp) == 1 && nd >= 1 && nd <= 4, "%s: bad ndim", path);
        f->ndim[i] = nd;
        f->numel[i] = 1;
        for (int d = 0; d < nd; d++) {
            int32_t v = 0;
            cr_assert(fread(&v, 4, 1, fp) == 1 && v > 0 && v < 4096, "%s: bad dim", path);
            f->dims[i][d] = v;
            f->numel[i] *= (size_t)v;
        }
    }
    for (int i = 0; i < n; i++) {
        f->data[i] = fvec(f->numel[i]);
        cr_assert(fread(f->data[i], sizeof(float), f->numel[i], fp) == f->numel[i],
                  "%s: truncated data of %s", path, f->name[i]);
    }
    cr_assert(fgetc(fp) == EOF, "%s: bytes after the data", path);
    fclose(fp);
}

/* the array `name`, which must have `numel` elements (0: any) */
static float *fixture_get(const struct fixture *f, const char *name, size_t numel)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->name[i], name) == 0) {
            cr_assert(numel == 0 || f->numel[i] == numel, "fixture %s: %zu elements, want %zu",
                      name, f->numel[i], numel);
            return f->data[i];
        }
    return NULL;
}

static void fixture_free(struct fixture *f)
{
    for (int i = 0; i < f->n; i++)
        free(f->data[i]);
}

Test(torch_fixtures, conv)
{
    /* the cases of make_conv_fixtures.py's CONVS */
    static const struct conv_case cases[] = {
        {"conv_3x3_bias", 2, 6, 5, 4, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1},
        {"conv_stride2_groups2", 2, 7, 6, 4, 6, 3, 3, {2, 2}, {1, 1}, {1, 1}, 2, 0},
        {"conv_depthwise_dilation2", 2, 6, 6, 4, 4, 3, 3, {1, 1}, {2, 2}, {2, 2}, 4, 1},
        {"conv_1x1_stride2", 2, 6, 6, 4, 8, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const struct conv_case *c = &cases[k];
        int OH = out_size(c->H, c->KH, c->stride[0], c->pad[0], c->dilation[0]);
        int OW = out_size(c->W, c->KW, c->stride[1], c->pad[1], c->dilation[1]);
        size_t nx = (size_t)c->B * c->H * c->W * c->IC;
        size_t nw = (size_t)c->OC * c->KH * c->KW * (c->IC / c->groups);
        size_t no = (size_t)c->B * OH * OW * c->OC;
        struct fixture f;
        fixture_load(&f, c->name);
        struct conv_run r =
            run_conv(c, fixture_get(&f, "x", nx), fixture_get(&f, "w", nw),
                     c->bias ? fixture_get(&f, "b", c->OC) : NULL, fixture_get(&f, "dout", no),
                     TR_F32, 2, NULL, NULL, NULL);
        char what[96];
        snprintf(what, sizeof what, "%s: out", c->name);
        expect_close_ff(what, r.out, fixture_get(&f, "out", no), no, TORCH_TOL);
        snprintf(what, sizeof what, "%s: dx", c->name);
        expect_close_ff(what, r.dx, fixture_get(&f, "dx", nx), nx, TORCH_TOL);
        snprintf(what, sizeof what, "%s: dw", c->name);
        expect_close_ff(what, r.dw, fixture_get(&f, "dw", nw), nw, TORCH_TOL);
        if (c->bias) {
            snprintf(what, sizeof what, "%s: db", c->name);
            expect_close_ff(what, r.db, fixture_get(&f, "db", c->OC), c->OC, TORCH_TOL);
        }
        free_run(&r);
        fixture_free(&f);
    }
}

Test(torch_fixtures, pooling)
{
    static const struct {
        const char *file;
        enum tr_op op;
        struct pool_case c;
    } cases[] = {
        {"maxpool_3x3_s2_p1", TR_OP_MAXPOOL, {"max", 2, 7, 6, 3, 3, 3, {2, 2}, {1, 1}}},
        {"avgpool_3x3_s2_p1", TR_OP_AVGPOOL, {"avg", 2, 7, 6, 3, 3, 3, {2, 2}, {1, 1}}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const struct pool_case *c = &cases[k].c;
        int OH = out_size(c->H, c->KH, c->stride[0], c->pad[0], 1);
        int OW = out_size(c->W, c->KW, c->stride[1], c->pad[1], 1);
        size_t nx = (size_t)c->B * c->H * c->W * c->C, no = (size_t)c->B * OH * OW * c->C;
        struct fixture f;
        fixture_load(&f, cases[k].file);
        float *out = fvec(no), *dx = fvec(nx);
        run_pool(cases[k].op, c, OH, OW, fixture_get(&f, "x", nx), fixture_get(&f, "dout", no),
                 out, dx, 2);
        char what[96];
        snprintf(what, sizeof what, "%s: out", cases[k].file);
        expect_close_ff(what, out, fixture_get(&f, "out", no), no, TORCH_TOL);
        snprintf(what, sizeof what, "%s: dx", cases[k].file);
        expect_close_ff(what, dx, fixture_get(&f, "dx", nx), nx, TORCH_TOL);
        free(out);
        free(dx);
        fixture_free(&f);
    }

    /* global average pooling: x[2,4,3,5] -> [2,5] */
    enum { B = 2, H = 4, W = 3, C = 5 };
    struct fixture f;
    fixture_load(&f, "global_avgpool");
    float out[B * C], *dx = fvec(B * H * W * C);
    float *dout = copy_fvec(fixture_get(&f, "dout", B * C), B * C);
    one_node o = {0};
    int64_t xs[4] = {B, H, W, C}, os[2] = {B, C};
    tensor_init(&o.t[0], 4, xs, fixture_get(&f, "x", B * H * W * C), dx);
    tensor_init(&o.t[1], 2, os, out, dout);
    o.n.op = TR_OP_GLOBAL_AVGPOOL;
    o.n.n_in = 1;
    o.n.out = 1;
    node_open(&o, 2, TR_F32, 2);
    node_forward(&o);
    node_backward(&o);
    node_close(&o);
    expect_close_ff("global_avgpool: out", out, fixture_get(&f, "out", B * C), B * C, TORCH_TOL);
    expect_close_ff("global_avgpool: dx", dx, fixture_get(&f, "dx", B * H * W * C), B * H * W * C,
                    TORCH_TOL);
    free(dx);
    free(dout);
    fixture_free(&f);
}

Test(torch_fixtures, batchnorm)
{
    enum { B = 2, H = 3, W = 4, C = 5 };
    size_t nx = (size_t)B * H * W * C;
    for (int training = 1; training >= 0; training--) {
        struct fixture f;
        fixture_load(&f, training ? "batchnorm_train" : "batchnorm_eval");
        struct bn_run r = run_bn(B, H, W, C, fixture_get(&f, "x", nx), fixture_get(&f, "w", C),
                                 fixture_get(&f, "b", C), fixture_get(&f, "dout", nx),
                                 fixture_get(&f, "running", 2 * C), training, 0, 2, 0.1f);
        const char *mode = training ? "batchnorm training" : "batchnorm eval";
        char what[96];
        snprintf(what, sizeof what, "%s: out", mode);
        expect_close_ff(what, r.out, fixture_get(&f, "out", nx), nx, TORCH_TOL);
        snprintf(what, sizeof what, "%s: dx", mode);
        expect_close_ff(what, r.dx, fixture_get(&f, "dx", nx), nx, TORCH_TOL);
        snprintf(what, sizeof what, "%s: dw", mode);
        expect_close_ff(what, r.dw, fixture_get(&f, "dw", C), C, TORCH_TOL);
        snprintf(what, sizeof what, "%s: db", mode);
        expect_close_ff(what, r.db, fixture_get(&f, "db", C), C, TORCH_TOL);
        const float *after = training ? fixture_get(&f, "running_after", 2 * C)
                                      : fixture_get(&f, "running", 2 * C);
        cr_assert(after != NULL);
        snprintf(what, sizeof what, "%s: running statistics", mode);
        expect_close_ff(what, r.running, after, 2 * C, TORCH_TOL);
        free_bn(&r);
        fixture_free(&f);
    }
}
