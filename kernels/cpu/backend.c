/* The CPU backend: runs graph nodes through the kernels in this directory.
 * It is built in, and the core opens it by name like any backend module
 * (tr_cpu_backend_module, in core/engine/backend.c's table). */
#include "../backend.h"
#include "kernels.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cpu_context {
    int threads;
};

static void *cpu_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        return NULL;
    memset(p, 0, rounded);
    return p;
}

static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    tr_cpu_param16_forget(p);
    free(p);
}

static void cpu_zero(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    tr_cpu_param16_written(p, bytes);
    memset(p, 0, bytes);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    tr_cpu_param16_written(dst, bytes);
    memcpy(dst, src, bytes);
}

#define T(i) (&g->tensors[n->in[i]])
#define F(t) ((float *)(t)->data)
#define I(t) ((const int32_t *)(t)->data)
#define OUT (&g->tensors[n->out])
#define AUX(i) ((float *)g->tensors[n->aux[i]].data)

/* a tensor as the *_act kernels take it: its data as stored, with its dtype */
static struct tr_cpu_act act(const struct tr_tensor *t)
{
    return (struct tr_cpu_act){t->data, t->dtype};
}

static int rows(const struct tr_tensor *t) { return (int)(t->numel / (size_t)t->shape[t->ndim - 1]); }
static int cols(const struct tr_tensor *t) { return (int)t->shape[t->ndim - 1]; }

/* matmul geometry from the node's tensors */
static void matmul_dims(const struct tr_graph *g, const struct tr_node *n, int *batch, int *M,
                        int *K, int *N)
{
    const struct tr_tensor *a = T(0), *b = T(1);
    int nd = a->ndim;
    *batch = nd == 3 ? (int)a->shape[0] : 1;
    *M = (int)a->shape[nd - 2];
    *K = (int)a->shape[nd - 1];
    *N = n->trans_b ? (int)b->shape[nd - 2] : (int)b->shape[nd - 1];
}

/* Half-precision GEMMs emulated (fp16 always; bf16 on a CPU without bf16
 * GEMM instructions, see native_bf16 below): the inputs
 * are rounded to bf16/fp16 into scratch and multiplied in fp32, which is
 * what the hardware computes (exact products of half inputs, fp32 sums). */
static int half_gemm(const struct tr_graph *g) { return g->compute == TR_BF16 || g->compute == TR_F16; }

static float *rounded(const struct tr_graph *g, float *dst, const float *src, size_t n)
{
    tr_cpu_round_to_half(dst, src, n, g->compute == TR_BF16);
    return dst;
}

/* bf16 on a CPU with bf16 GEMM instructions (tr_cpu_bf16_native_isa): the
 * inputs are converted to bf16 into scratch, half the bytes of the rounded
 * fp32 copies above, and oneDNN multiplies them natively.  The same numbers
 * go in as in the emulation; only the order of the fp32 sums differs. */
static int native_bf16(const struct tr_graph *g)
{
    return g->compute == TR_BF16 && tr_cpu_bf16_native_isa() != NULL;
}

/* A linear node on the native bf16 path whose output is stored in bf16:
 * its GEMM rounds each tile of the output into storage as it stores it
 * (tr_cpu_linear_forward_bf16_out16) instead of run_node rounding the whole
 * fp32 output in a pass of its own. */
static int linear_out16(const struct tr_graph *g, const struct tr_node *n)
{
    return n->op == TR_OP_LINEAR && native_bf16(g) && g->tensors[n->out].dtype == TR_BF16;
}

/* floats of scratch that hold n bf16 values, in whole 64-byte lines */
static size_t bf16_floats(size_t n) { return ((n + 31) & ~(size_t)31) / 2; }

static const uint16_t *to_bf16(float *dst, const float *src, size_t n)
{
    tr_cpu_to_bf16((uint16_t *)(void *)dst, src, n);
    return (const uint16_t *)(const void *)dst;
}

/* A GEMM operand in bf16: an activation stored in bf16 as it is (no second
 * copy), anything else converted into dst */
static const uint16_t *bf16_of(float *dst, const struct tr_tensor *t)
{
    if (t->dtype == TR_BF16)
        return (const uint16_t *)t->data;
    return to_bf16(dst, (const float *)t->data, t->numel);
}

/* The three GEMM operands of a linear or matmul node in bf16, one after
 * another in scratch: in[0] and in[1] (converted where they are not bf16
 * already) and room for the output's gradient (dout, which backward fills). */
struct bf16_operands {
    const uint16_t *a, *b;
    uint16_t *dout;
};

static struct bf16_operands bf16_inputs(const struct tr_graph *g, const struct tr_node *n)
{
    struct bf16_operands o;
    float *at = g->scratch;
    o.a = bf16_of(at, T(0));
    at += bf16_floats(T(0)->numel);
    /* a weight: its bf16 copy, kept up to date by the optimizer (param16.c) */
    const uint16_t *w16 = tr_cpu_param16(g, T(1));
    o.b = w16 ? w16 : bf16_of(at, T(1));
    at += bf16_floats(T(1)->numel);
    o.dout = (uint16_t *)(void *)at;
    return o;
}

/* attention with q, k, v inputs: key/value heads (0, as a packed node's, means heads) */
static int kv_heads(const struct tr_node *n) { return n->kv_heads > 0 ? n->kv_heads : n->heads; }

/* Attention on the native bf16 path: its inputs stored in bf16 are read as
 * they are and multiplied in bf16 (attention.c); otherwise fp32 (on fp32
 * copies of 16-bit inputs, run_node). */
static int attention_bf16(const struct tr_graph *g, const struct tr_node *n)
{
    if (n->op != TR_OP_ATTENTION || !native_bf16(g))
        return 0;
    for (int i = 0; i < n->n_in; i++)
        if (T(i)->dtype != TR_BF16)
            return 0;
    return 1;
}
#define U16(t) ((const uint16_t *)(t)->data)

/* ---- convolutional ops: geometry from the node's tensors and attributes */
static struct tr_cpu_conv_shape conv_shape(const struct tr_graph *g, const struct tr_node *n)
{
    const struct tr_tensor *x = T(0), *w = T(1), *o = OUT;
    struct tr_cpu_conv_shape s = {
        .B = (int)x->shape[0], .H = (int)x->shape[1], .W = (int)x->shape[2],
        .IC = (int)x->shape[3], .OC = (int)w->shape[0], .KH = (int)w->shape[1],
        .KW = (int)w->shape[2], .OH = (int)o->shape[1], .OW = (int)o->shape[2],
        .groups = n->groups > 0 ? n->groups : 1,
    };
    for (int d = 0; d < 2; d++) {
        s.stride[d] = n->stride[d] > 0 ? n->stride[d] : 1;
        s.pad[d] = n->pad[d];
        s.dilation[d] = n->dilation[d] > 0 ? n->dilation[d] : 1;
    }
    return s;
}

static struct tr_cpu_pool_shape pool_shape(const struct tr_graph *g, const struct tr_node *n)
{
    const struct tr_tensor *x = T(0), *o = OUT;
    struct tr_cpu_pool_shape s = {
        .B = (int)x->shape[0], .H = (int)x->shape[1], .W = (int)x->shape[2],
        .C = (int)x->shape[3], .KH = n->kernel[0], .KW = n->kernel[1],
        .OH = (int)o->shape[1], .OW = (int)o->shape[2],
    };
    for (int d = 0; d < 2; d++) {
        s.stride[d] = n->stride[d] > 0 ? n->stride[d] : n->kernel[d];
        s.pad[d] = n->pad[d];
    }
    return s;
}

/* batch norm's running[2,C] (its TR_ROLE_BUFFER tensor) */
static float *bn_running(const struct tr_graph *g, const struct tr_node *n)
{
    return n->buffer >= 0 && n->buffer < g->n_tensors ? F(&g->tensors[n->buffer]) : NULL;
}

static size_t cpu_scratch_floats(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx;
    if ((n->op == TR_OP_LINEAR || n->op == TR_OP_MATMUL) && native_bf16(g)) /* in bf16 */
        return bf16_floats(T(0)->numel) + bf16_floats(T(1)->numel) + bf16_floats(OUT->numel);
    if ((n->op == TR_OP_LINEAR || n->op == TR_OP_MATMUL) && half_gemm(g)) /* x, w, dout rounded */
        return T(0)->numel + T(1)->numel + OUT->numel;
    if (n->op == TR_OP_CONV2D) { /* 16-bit copies, reordered weights, oneDNN's scratchpads */
        struct tr_cpu_conv_shape s = conv_shape(g, n);
        return tr_cpu_conv2d_scratch_floats(&s, n->n_in == 3, g->compute);
    }
    if (n->op == TR_OP_BATCHNORM) /* ordered partial sums */
        return tr_cpu_batchnorm_scratch_floats(rows(T(0)), cols(T(0)));
    if (n->op == TR_OP_RMSNORM) /* dw's partial sums */
        return tr_cpu_rmsnorm_scratch_floats(rows(T(0)), cols(T(0)));
    if (n->op == TR_OP_LAYERNORM) /* dw's and db's partial sums */
        return tr_cpu_layernorm_scratch_floats(rows(T(0)), cols(T(0)));
    if (n->op == TR_OP_ROPE) /* the cos/sin table */
        return tr_cpu_rope_scratch_floats((int)T(0)->shape[1], cols(T(0)) / n->heads);
    if (n->op != TR_OP_ATTENTION)
        return 0;
    const struct tr_tensor *qkv = T(0);
    if (attention_bf16(g, n))
        return n->n_in == 3 ? tr_cpu_attention_gqa_bf16_scratch_floats(
                                  (int)qkv->shape[0], (int)qkv->shape[1], n->heads, kv_heads(n),
                                  cols(qkv) / n->heads)
                            : tr_cpu_attention_bf16_scratch_floats(
                                  (int)qkv->shape[0], (int)qkv->shape[1],
                                  (int)qkv->shape[2] / 3, n->heads);
    if (n->n_in == 3)
        return tr_cpu_attention_gqa_scratch_floats((int)qkv->shape[0], (int)qkv->shape[1],
                                                   n->heads, kv_heads(n), cols(qkv) / n->heads);
    return tr_cpu_attention_scratch_floats((int)qkv->shape[0], (int)qkv->shape[1],
                                           (int)qkv->shape[2] / 3, n->heads);
}

static void cpu_forward(void *ctx, struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx;
    switch (n->op) {
    case TR_OP_EMBEDDING:
        tr_cpu_embedding_forward(F(OUT), I(T(1)), F(T(0)), (int)T(1)->numel, cols(T(0)));
        break;
    case TR_OP_ADD_ROWS:
        tr_cpu_add_rows_forward(F(OUT), F(T(0)), F(T(1)), (int)T(0)->shape[0], (int)T(0)->shape[1],
                                (int)T(0)->shape[2]);
        break;
    case TR_OP_ADD:
        tr_cpu_add_forward_act(act(OUT), act(T(0)), act(T(1)), OUT->numel);
        break;
    case TR_OP_LINEAR: {
        if (native_bf16(g)) {
            struct bf16_operands o = bf16_inputs(g, n);
            const float *bias = n->n_in == 3 ? F(T(2)) : NULL;
            if (linear_out16(g, n)) /* rounded into storage tile by tile */
                tr_cpu_linear_forward_bf16_out16((uint16_t *)OUT->data, o.a, o.b, bias,
                                                 rows(T(0)), cols(T(0)), (int)T(1)->shape[0]);
            else
                tr_cpu_linear_forward_bf16(F(OUT), o.a, o.b, bias, rows(T(0)), cols(T(0)),
                                           (int)T(1)->shape[0]);
            break;
        }
        const float *x = F(T(0)), *w = F(T(1));
        if (half_gemm(g)) {
            x = rounded(g, g->scratch, x, T(0)->numel);
            w = rounded(g, g->scratch + T(0)->numel, w, T(1)->numel);
        }
        tr_cpu_linear_forward(F(OUT), x, w, n->n_in == 3 ? F(T(2)) : NULL, rows(T(0)), cols(T(0)),
                              (int)T(1)->shape[0]);
        break;
    }
    case TR_OP_MATMUL: {
        int batch, M, K, N;
        matmul_dims(g, n, &batch, &M, &K, &N);
        if (native_bf16(g)) {
            struct bf16_operands o = bf16_inputs(g, n);
            tr_cpu_matmul_forward_bf16(F(OUT), o.a, o.b, batch, M, K, N, n->trans_b);
            break;
        }
        const float *a = F(T(0)), *b = F(T(1));
        if (half_gemm(g)) {
            a = rounded(g, g->scratch, a, T(0)->numel);
            b = rounded(g, g->scratch + T(0)->numel, b, T(1)->numel);
        }
        tr_cpu_matmul_forward(F(OUT), a, b, batch, M, K, N, n->trans_b);
        break;
    }
    case TR_OP_LAYERNORM:
        tr_cpu_layernorm_forward_act(act(OUT), AUX(0), AUX(1), act(T(0)), F(T(1)), F(T(2)),
                                     rows(T(0)), cols(T(0)), n->eps);
        break;
    case TR_OP_GELU:
        tr_cpu_gelu_forward_act(act(OUT), act(T(0)), OUT->numel);
        break;
    case TR_OP_RELU:
        tr_cpu_relu_forward(F(OUT), F(T(0)), OUT->numel);
        break;
    case TR_OP_ATTENTION:
        if (attention_bf16(g, n) && n->n_in == 3)
            tr_cpu_attention_gqa_forward_bf16(F(OUT), AUX(0), U16(T(0)), U16(T(1)), U16(T(2)),
                                              (int)T(0)->shape[0], (int)T(0)->shape[1], n->heads,
                                              kv_heads(n), cols(T(0)) / n->heads);
        else if (attention_bf16(g, n))
            tr_cpu_attention_forward_bf16(F(OUT), AUX(0), U16(T(0)), (int)T(0)->shape[0],
                                          (int)T(0)->shape[1], (int)T(0)->shape[2] / 3, n->heads);
        else if (n->n_in == 3)
            tr_cpu_attention_gqa_forward(F(OUT), AUX(0), F(T(0)), F(T(1)), F(T(2)),
                                         (int)T(0)->shape[0], (int)T(0)->shape[1], n->heads,
                                         kv_heads(n), cols(T(0)) / n->heads);
        else
            tr_cpu_attention_forward(F(OUT), AUX(0), F(T(0)), (int)T(0)->shape[0],
                                     (int)T(0)->shape[1], (int)T(0)->shape[2] / 3, n->heads);
        break;
    case TR_OP_RMSNORM:
        tr_cpu_rmsnorm_forward(F(OUT), AUX(0), F(T(0)), F(T(1)), rows(T(0)), cols(T(0)), n->eps);
        break;
    case TR_OP_ROPE:
        tr_cpu_rope_forward(F(OUT), F(T(0)), g->scratch, (int)T(0)->shape[0], (int)T(0)->shape[1],
                            n->heads, cols(T(0)) / n->heads, n->theta);
        break;
    case TR_OP_SWIGLU:
        tr_cpu_swiglu_forward(F(OUT), F(T(0)), F(T(1)), OUT->numel);
        break;
    case TR_OP_SCALE:
        tr_cpu_scale_forward(F(OUT), F(T(0)), n->scale, OUT->numel);
        break;
    case TR_OP_CONV2D: {
        struct tr_cpu_conv_shape s = conv_shape(g, n);
        tr_cpu_conv2d_forward(F(OUT), F(T(0)), F(T(1)), n->n_in == 3 ? F(T(2)) : NULL, g->scratch,
                              &s, g->compute);
        break;
    }
    case TR_OP_MAXPOOL: {
        struct tr_cpu_pool_shape s = pool_shape(g, n);
        tr_cpu_maxpool_forward(F(OUT), F(T(0)), &s);
        break;
    }
    case TR_OP_AVGPOOL: {
        struct tr_cpu_pool_shape s = pool_shape(g, n);
        tr_cpu_avgpool_forward(F(OUT), F(T(0)), &s);
        break;
    }
    case TR_OP_GLOBAL_AVGPOOL:
        tr_cpu_global_avgpool_forward(F(OUT), F(T(0)), (int)T(0)->shape[0],
                                      (int)(T(0)->shape[1] * T(0)->shape[2]), cols(T(0)));
        break;
    case TR_OP_BATCHNORM:
        if (g->training) /* a recomputed forward must not move the running statistics again */
            tr_cpu_batchnorm_forward_train(F(OUT), AUX(0), AUX(1),
                                           g->recomputing ? NULL : bn_running(g, n), g->scratch,
                                           F(T(0)), F(T(1)), F(T(2)), rows(T(0)), cols(T(0)),
                                           n->eps, n->momentum);
        else
            tr_cpu_batchnorm_forward_eval(F(OUT), AUX(0), AUX(1), g->scratch, F(T(0)), F(T(1)),
                                          F(T(2)), bn_running(g, n), rows(T(0)), cols(T(0)),
                                          n->eps);
        break;
    case TR_OP_CROSS_ENTROPY:
        tr_cpu_cross_entropy_forward(F(OUT), AUX(0), F(T(0)), I(T(1)), rows(T(0)), cols(T(0)),
                                     n->ignore_index);
        break;
    default:
        break;
    }
}

static void cpu_backward(void *ctx, struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx;
    const float *dout = n->out == g->loss ? NULL : OUT->grad;
    switch (n->op) {
    case TR_OP_EMBEDDING:
        tr_cpu_embedding_backward(T(0)->grad, dout, I(T(1)), (int)T(1)->numel, cols(T(0)));
        break;
    case TR_OP_ADD_ROWS:
        tr_cpu_add_rows_backward(T(0)->grad, T(1)->grad, dout, (int)T(0)->shape[0],
                                 (int)T(0)->shape[1], (int)T(0)->shape[2]);
        break;
    case TR_OP_ADD:
        tr_cpu_add_backward(T(0)->grad, T(1)->grad, dout, OUT->numel, n->write_grad_mask);
        break;
    case TR_OP_LINEAR: {
        if (native_bf16(g)) {
            /* dout to bf16 and the bias gradient (from the fp32 dout) in one pass */
            struct bf16_operands o = bf16_inputs(g, n);
            tr_cpu_linear_dout_bf16(o.dout, n->n_in == 3 ? T(2)->grad : NULL, dout, rows(T(0)),
                                    (int)T(1)->shape[0], (n->write_grad_mask & 4u) != 0);
            tr_cpu_linear_backward_bf16(T(0)->grad, T(1)->grad, o.dout, o.a, o.b, rows(T(0)),
                                        cols(T(0)), (int)T(1)->shape[0], n->write_grad_mask);
            break;
        }
        const float *x = F(T(0)), *w = F(T(1)), *gemm_dout = dout;
        if (half_gemm(g)) {
            x = rounded(g, g->scratch, x, T(0)->numel);
            w = rounded(g, g->scratch + T(0)->numel, w, T(1)->numel);
            gemm_dout = rounded(g, g->scratch + T(0)->numel + T(1)->numel, dout, OUT->numel);
        }
        tr_cpu_linear_backward(T(0)->grad, T(1)->grad, NULL, gemm_dout, x, w, rows(T(0)),
                               cols(T(0)), (int)T(1)->shape[0], n->write_grad_mask);
        /* from the fp32 dout, whatever the GEMM inputs (kernels.h) */
        if (n->n_in == 3 && T(2)->grad)
            tr_cpu_linear_bias_backward(T(2)->grad, dout, rows(T(0)), (int)T(1)->shape[0],
                                        (n->write_grad_mask & 4u) != 0);
        break;
    }
    case TR_OP_MATMUL: {
        int batch, M, K, N;
        matmul_dims(g, n, &batch, &M, &K, &N);
        if (native_bf16(g)) {
            struct bf16_operands o = bf16_inputs(g, n);
            tr_cpu_to_bf16(o.dout, dout, OUT->numel);
            tr_cpu_matmul_backward_bf16(T(0)->grad, T(1)->grad, o.dout, o.a, o.b, batch, M, K, N,
                                        n->trans_b);
            break;
        }
        const float *a = F(T(0)), *b = F(T(1));
        if (half_gemm(g)) {
            a = rounded(g, g->scratch, a, T(0)->numel);
            b = rounded(g, g->scratch + T(0)->numel, b, T(1)->numel);
            dout = rounded(g, g->scratch + T(0)->numel + T(1)->numel, dout, OUT->numel);
        }
        tr_cpu_matmul_backward(T(0)->grad, T(1)->grad, dout, a, b, batch, M, K, N, n->trans_b);
        break;
    }
    case TR_OP_LAYERNORM:
        tr_cpu_layernorm_backward_act(T(0)->grad, T(1)->grad, T(2)->grad, g->scratch, dout,
                                      act(T(0)), F(T(1)), AUX(0), AUX(1), rows(T(0)), cols(T(0)),
                                      n->write_grad_mask);
        break;
    case TR_OP_GELU:
        tr_cpu_gelu_backward_act(T(0)->grad, act(T(0)), dout, OUT->numel,
                                 (n->write_grad_mask & 1u) != 0);
        break;
    case TR_OP_RELU:
        tr_cpu_relu_backward(T(0)->grad, F(T(0)), dout, OUT->numel);
        break;
    case TR_OP_ATTENTION:
        if (attention_bf16(g, n) && n->n_in == 3)
            tr_cpu_attention_gqa_backward_bf16(T(0)->grad, T(1)->grad, T(2)->grad, g->scratch,
                                               dout, F(OUT), U16(T(0)), U16(T(1)), U16(T(2)),
                                               AUX(0), (int)T(0)->shape[0], (int)T(0)->shape[1],
                                               n->heads, kv_heads(n), cols(T(0)) / n->heads,
                                               n->write_grad_mask);
        else if (attention_bf16(g, n))
            tr_cpu_attention_backward_bf16(T(0)->grad, g->scratch, dout, F(OUT), U16(T(0)),
                                           AUX(0), (int)T(0)->shape[0], (int)T(0)->shape[1],
                                           (int)T(0)->shape[2] / 3, n->heads,
                                           (n->write_grad_mask & 1u) != 0);
        else if (n->n_in == 3)
            tr_cpu_attention_gqa_backward(T(0)->grad, T(1)->grad, T(2)->grad, g->scratch, dout,
                                          F(OUT), F(T(0)), F(T(1)), F(T(2)), AUX(0),
                                          (int)T(0)->shape[0], (int)T(0)->shape[1], n->heads,
                                          kv_heads(n), cols(T(0)) / n->heads, n->write_grad_mask);
        else
            tr_cpu_attention_backward(T(0)->grad, g->scratch, dout, F(OUT), F(T(0)), AUX(0),
                                      (int)T(0)->shape[0], (int)T(0)->shape[1],
                                      (int)T(0)->shape[2] / 3, n->heads,
                                      (n->write_grad_mask & 1u) != 0);
        break;
    case TR_OP_RMSNORM:
        tr_cpu_rmsnorm_backward(T(0)->grad, T(1)->grad, g->scratch, dout, F(T(0)), F(T(1)),
                                AUX(0), rows(T(0)), cols(T(0)), n->write_grad_mask);
        break;
    case TR_OP_ROPE:
        tr_cpu_rope_backward(T(0)->grad, dout, g->scratch, (int)T(0)->shape[0],
                             (int)T(0)->shape[1], n->heads, cols(T(0)) / n->heads, n->theta,
                             (n->write_grad_mask & 1u) != 0);
        break;
    case TR_OP_SWIGLU:
        tr_cpu_swiglu_backward(T(0)->grad, T(1)->grad, F(T(0)), F(T(1)), dout, OUT->numel,
                               n->write_grad_mask);
        break;
    case TR_OP_SCALE:
        tr_cpu_scale_backward(T(0)->grad, dout, n->scale, OUT->numel,
                              (n->write_grad_mask & 1u) != 0);
        break;
    case TR_OP_CONV2D: {
        struct tr_cpu_conv_shape s = conv_shape(g, n);
        tr_cpu_conv2d_backward(T(0)->grad, T(1)->grad, n->n_in == 3 ? T(2)->grad : NULL,
                               g->scratch, dout, F(T(0)), F(T(1)), (n->write_grad_mask & 1u) != 0,
                               &s, g->compute);
        break;
    }
    case TR_OP_MAXPOOL: {
        struct tr_cpu_pool_shape s = pool_shape(g, n);
        if (T(0)->grad)
            tr_cpu_maxpool_backward(T(0)->grad, dout, F(T(0)), &s);
        break;
    }
    case TR_OP_AVGPOOL: {
        struct tr_cpu_pool_shape s = pool_shape(g, n);
        if (T(0)->grad)
            tr_cpu_avgpool_backward(T(0)->grad, dout, &s);
        break;
    }
    case TR_OP_GLOBAL_AVGPOOL:
        if (T(0)->grad)
            tr_cpu_global_avgpool_backward(T(0)->grad, dout, (int)T(0)->shape[0],
                                           (int)(T(0)->shape[1] * T(0)->shape[2]), cols(T(0)));
        break;
    case TR_OP_BATCHNORM:
        tr_cpu_batchnorm_backward(T(0)->grad, T(1)->grad, T(2)->grad, g->scratch, dout, F(T(0)),
                                  F(T(1)), AUX(0), AUX(1), rows(T(0)), cols(T(0)), g->training);
        break;
    case TR_OP_CROSS_ENTROPY:
        tr_cpu_cross_entropy_backward(T(0)->grad, F(T(0)), AUX(0), I(T(1)), g->loss_grad,
                                      rows(T(0)), cols(T(0)), n->ignore_index,
                                      (n->write_grad_mask & 1u) != 0);
        break;
    default:
        break;
    }
}

static double cpu_sum_squares(void *ctx, const float *x, size_t n)
{
    (void)ctx;
    return tr_cpu_sum_squares(x, n);
}

static void cpu_adamw(void *ctx, float *p, const float *grad, float *m, float *v, size_t n,
                      const struct tr_adamw_args *a)
{
    (void)ctx;
    /* the parameters' bf16 copy, where the GEMMs read one, in the same pass */
    tr_cpu_adamw_update_bf16(p, tr_cpu_param16_updated(p, n), grad, m, v, n, a->lr, a->beta1,
                             a->beta2, a->eps, a->weight_decay, a->grad_scale, a->t);
}

static void cpu_sgd(void *ctx, float *p, const float *grad, float *buf, size_t n,
                    const struct tr_sgd_args *a)
{
    (void)ctx;
    tr_cpu_sgd_update(p, grad, buf, n, a->lr, a->momentum, a->weight_decay, a->grad_scale);
    tr_cpu_param16_written(p, n * sizeof(float));
}

static int64_t cpu_count_correct(void *ctx, const float *logits, const int32_t *targets, int N,
                                 int V, int ignore_index, int64_t *n_valid)
{
    (void)ctx;
    return tr_cpu_count_correct(logits, targets, N, V, ignore_index, n_valid);
}

/* ---- 16-bit activation storage ---------------------------------------------
 * Under a 16-bit compute dtype the planner stores activations in it
 * (core/engine/graph.c, plan_storage).  Gradients and saved aux stay fp32.
 * A stored activation is always its op's fp32 result rounded once to the
 * storage dtype, on the native and the emulated GEMM paths alike.
 *
 * Some ops take their 16-bit tensors as stored (native_half):
 *  - add, GELU and layer norm read their 16-bit activations and write their
 *    16-bit output themselves, in bf16 and fp16 (the *_act kernels,
 *    kernels.h: fp32 arithmetic on values widened tile by tile in cache,
 *    the result rounded once).  Cheap ops over whole activations: separate
 *    passes to widen and round would cost more than the op;
 *  - on the native bf16 path, linear and matmul read bf16 inputs as they
 *    are (bf16_of): they would convert them to bf16 anyway; so does
 *    attention (q, k and v into bf16 products, attention_bf16).  Linear
 *    there also rounds its bf16 output into storage itself, tile by tile
 *    (linear_out16).
 * Every other op (the convolutional ones too), and linear, matmul and
 * attention off the native bf16 path, runs on fp32 copies: its 16-bit
 * inputs (and, in backward, its output where the op's backward reads it)
 * are widened into the start of scratch, the node's tensors point at the
 * copies for the call (their dtype saying fp32 meanwhile) and the kernel
 * sees the scratch after them, and forward rounds the fp32 result into the
 * output's 16-bit storage.  Backward copies only what it reads: not the
 * output where the op's backward needs none (backward_skips_output), nor
 * the inputs of an op whose gradients need only dout
 * (backward_skips_inputs). */

static int is_half(enum tr_dtype d) { return d == TR_BF16 || d == TR_F16; }

/* The op's kernels read in[k] (k < n_in), or write and read its output
 * (k == n_in), in its 16-bit storage themselves, forward and backward: no
 * fp32 copy.  Asked only of 16-bit tensors; an operand the op's kernels
 * take as fp32 (layer norm's weight and bias) must not be listed. */
static int native_half(const struct tr_graph *g, const struct tr_node *n, int k)
{
    switch (n->op) {
    case TR_OP_ADD:
    case TR_OP_GELU: /* every operand, any mix of dtypes */
        return 1;
    case TR_OP_LAYERNORM: /* the input and the output */
        return k == 0 || k == n->n_in;
    case TR_OP_LINEAR: /* the two GEMM operands, and a bf16 output (linear_out16) */
        if (k == n->n_in)
            return linear_out16(g, n);
        return k < 2 && native_bf16(g) && T(k)->dtype == TR_BF16;
    case TR_OP_MATMUL: /* the two GEMM operands; the GEMM's output is fp32 */
        return k < 2 && k < n->n_in && native_bf16(g) && T(k)->dtype == TR_BF16;
    case TR_OP_ATTENTION: /* q, k, v; its output still goes through a copy */
        return k < n->n_in && attention_bf16(g, n);
    default:
        return 0;
    }
}

/* Ops whose backward reads none of its inputs' values, only dout (and
 * shapes): their 16-bit inputs get no fp32 copy there.  An op not listed
 * gets them.  (Embedding's backward reads its int32 indices.) */
static int backward_skips_inputs(enum tr_op op)
{
    switch (op) {
    case TR_OP_ADD: case TR_OP_ADD_ROWS: case TR_OP_SCALE: case TR_OP_ROPE: case TR_OP_AVGPOOL:
    case TR_OP_GLOBAL_AVGPOOL:
        return 1;
    default:
        return 0;
    }
}

/* Ops whose backward does not read their output (attention's does: the
 * rows' sums of dout x out); an op not listed gets it, so an op added later
 * is safe before anyone lists it. */
static int backward_skips_output(enum tr_op op)
{
    switch (op) {
    case TR_OP_EMBEDDING: case TR_OP_ADD_ROWS: case TR_OP_ADD: case TR_OP_LINEAR:
    case TR_OP_MATMUL: case TR_OP_LAYERNORM: case TR_OP_GELU: case TR_OP_RELU:
    case TR_OP_CROSS_ENTROPY: case TR_OP_RMSNORM: case TR_OP_ROPE: case TR_OP_SWIGLU:
    case TR_OP_SCALE: case TR_OP_CONV2D: case TR_OP_MAXPOOL: case TR_OP_AVGPOOL:
    case TR_OP_GLOBAL_AVGPOOL: case TR_OP_BATCHNORM:
        return 1;
    default:
        return 0;
    }
}

/* The node's 16-bit tensors that need an fp32 copy in forward or backward,
 * each once (add(x, x) reads one tensor twice); widen[i]: the copy starts
 * as the stored values (forward's output needs none, it is written). */
struct fp32_copies {
    int n, tensor[4], widen[4];
};

static void fp32_copies(const struct tr_graph *g, const struct tr_node *n, int backward,
                        struct fp32_copies *c)
{
    c->n = 0;
    for (int k = 0; k <= n->n_in && k < 4; k++) {
        int out = k == n->n_in, id = out ? n->out : n->in[k];
        if (!is_half(g->tensors[id].dtype) || native_half(g, n, k))
            continue;
        if (backward && (out ? backward_skips_output(n->op) : backward_skips_inputs(n->op)))
            continue;
        int seen = 0;
        for (int i = 0; i < c->n; i++)
            seen |= c->tensor[i] == id;
        if (seen)
            continue;
        c->tensor[c->n] = id;
        c->widen[c->n++] = !out || backward;
    }
}

/* fp32 copies start on whole 64-byte lines */
static size_t line_floats(size_t n) { return (n + 15) & ~(size_t)15; }

static size_t copies_floats(const struct tr_graph *g, const struct tr_node *n, int backward)
{
    struct fp32_copies c;
    fp32_copies(g, n, backward, &c);
    size_t floats = 0;
    for (int i = 0; i < c.n; i++)
        floats += line_floats(g->tensors[c.tensor[i]].numel);
    return floats;
}

static size_t cpu_node_scratch_floats(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    size_t fwd = copies_floats(g, n, 0), bwd = copies_floats(g, n, 1);
    return cpu_scratch_floats(ctx, g, n) + (fwd > bwd ? fwd : bwd);
}

static void run_node(void *ctx, struct tr_graph *g, const struct tr_node *n, int backward)
{
    struct fp32_copies c;
    fp32_copies(g, n, backward, &c);
    if (c.n == 0) { /* all fp32, or taken as stored */
        if (backward)
            cpu_backward(ctx, g, n);
        else
            cpu_forward(ctx, g, n);
        return;
    }
    void *stored[4];
    enum tr_dtype dtype[4];
    float *scratch = g->scratch, *at = g->scratch;
    size_t scratch_floats = g->scratch_floats;
    for (int i = 0; i < c.n; i++) {
        struct tr_tensor *t = &g->tensors[c.tensor[i]];
        stored[i] = t->data;
        dtype[i] = t->dtype;
        if (c.widen[i])
            tr_cpu_from_half(at, (const uint16_t *)t->data, t->numel, t->dtype == TR_BF16);
        t->data = at;
        t->dtype = TR_F32;
        at += line_floats(t->numel);
    }
    g->scratch = at; /* the kernel's own scratch follows the copies */
    g->scratch_floats -= (size_t)(at - scratch);
    if (backward)
        cpu_backward(ctx, g, n);
    else
        cpu_forward(ctx, g, n);
    g->scratch = scratch;
    g->scratch_floats = scratch_floats;
    for (int i = 0; i < c.n; i++) {
        struct tr_tensor *t = &g->tensors[c.tensor[i]];
        if (!backward && c.tensor[i] == n->out)
            tr_cpu_to_half((uint16_t *)stored[i], (const float *)t->data, t->numel,
                           dtype[i] == TR_BF16);
        t->data = stored[i];
        t->dtype = dtype[i];
    }
}

static void cpu_node_forward(void *ctx, struct tr_graph *g, const struct tr_node *n)
{
    run_node(ctx, g, n, 0);
}

static void cpu_node_backward(void *ctx, struct tr_graph *g, const struct tr_node *n)
{
    run_node(ctx, g, n, 1);
}

/* The bf16 copy of the parameters (param16.c) that the native bf16 GEMMs
 * read a weight from, where some linear or matmul multiplies a parameter
 * (bf16_inputs). */
static size_t cpu_param_copy_bytes(void *ctx, const struct tr_graph *g)
{
    (void)ctx;
    if (!native_bf16(g))
        return 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        if ((n->op == TR_OP_LINEAR || n->op == TR_OP_MATMUL) && n->n_in > 1 &&
            T(1)->role == TR_ROLE_PARAM)
            return tr_cpu_param16_bytes(g->n_params);
    }
    return 0;
}

/* Every op of the vocabulary, on fp32 tensors (int32 for indices and
 * targets), activations also in bf16 or fp16 (taken as stored or run on
 * fp32 copies, above). */
static int cpu_supports_op(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx;
    if ((unsigned)n->op >= TR_OP_COUNT)
        return 0;
    int t[6], k = 0;
    for (int i = 0; i < n->n_in; i++)
        t[k++] = n->in[i];
    for (int i = 0; i < n->n_aux; i++)
        t[k++] = n->aux[i];
    t[k++] = n->out;
    for (int i = 0; i < k; i++) {
        const struct tr_tensor *x = &g->tensors[t[i]];
        if (x->dtype != TR_F32 && x->dtype != TR_I32 &&
            !(is_half(x->dtype) && x->role == TR_ROLE_ACTIVATION))
            return 0;
    }
    /* a convolution oneDNN has no primitive for (a shape the graph checks
     * let through) is refused here, before planning, not at the first step */
    if (n->op == TR_OP_CONV2D) {
        struct tr_cpu_conv_shape s = conv_shape(g, n);
        return tr_cpu_conv2d_supported(&s, n->n_in == 3, g->compute);
    }
    return 1;
}

/* The backward kernels that can write their gradients (kernels.h's
 * `write`): linear (all three: GEMMs with beta 0, the bias sums stored),
 * add, layer norm, RMSNorm, SwiGLU, attention (q, k and v: each block's
 * first product with beta 0), GELU, rope, scale, the cross-entropy's logits
 * and the convolution's data gradient.  The others (embeddings, batched
 * matmul, pooling, batch norm, ReLU) add to what the core zeroed. */
static int cpu_writes_grad(void *ctx, const struct tr_graph *g, const struct tr_node *n, int k)
{
    (void)ctx, (void)g;
    switch (n->op) {
    case TR_OP_LINEAR: case TR_OP_ADD: case TR_OP_LAYERNORM: case TR_OP_ATTENTION:
    case TR_OP_RMSNORM: case TR_OP_SWIGLU:
        return 1;
    case TR_OP_GELU: case TR_OP_CROSS_ENTROPY: case TR_OP_CONV2D: case TR_OP_ROPE:
    case TR_OP_SCALE:
        return k == 0;
    default:
        return 0;
    }
}

static const struct tr_backend_iface cpu_iface = {
    .struct_size = sizeof(struct tr_backend_iface),
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .download = cpu_copy,
    .scratch_floats = cpu_node_scratch_floats,
    .forward = cpu_node_forward,
    .backward = cpu_node_backward,
    .sum_squares = cpu_sum_squares,
    .adamw = cpu_adamw,
    .sgd = cpu_sgd,
    .synchronize = NULL,
    .count_correct = cpu_count_correct,
    .supports_op = cpu_supports_op,
    .param_copy_bytes = cpu_param_copy_bytes,
    .writes_grad = cpu_writes_grad,
};

int tr_cpu_backend_init(struct tr_backend *be, int threads)
{
    struct cpu_context *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->threads = threads > 0 ? threads : omp_get_num_procs();
    omp_set_num_threads(c->threads);
    be->iface = &cpu_iface;
    be->context = c;
    be->module = &tr_cpu_backend_module;
    return 0;
}

void tr_cpu_backend_free(struct tr_backend *be)
{
    free(be->context);
    be->context = NULL;
}

static int cpu_open(struct tr_backend *be, int threads, char *why, size_t why_size)
{
    if (tr_cpu_backend_init(be, threads) != 0) {
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    return 0;
}

const struct tr_backend_module tr_cpu_backend_module = {
    .abi = TR_BACKEND_ABI,
    .struct_size = sizeof(struct tr_backend_module),
    .name = "cpu",
    .open = cpu_open,
    .close = tr_cpu_backend_free,
    .describe = NULL,
};
