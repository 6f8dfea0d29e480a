/* The CPU backend's nodes: each op's forward, backward and scratch as calls
 * of the kernels in this directory, one function each, in a table indexed
 * by enum tr_op (tr_cpu_ops, at the end).  backend.c runs them, on fp32
 * copies where a node's 16-bit tensors need them.  Adding an op: its
 * functions here and its row in the table (docs/ops.md). */
#include "nodes.h"

#include "../ops.h"
#include "../rope_scaling.h"

#include <stddef.h>
#include <string.h>

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
 * GEMM instructions, see tr_cpu_node_native_bf16 below): the inputs
 * are rounded to bf16/fp16 into scratch and multiplied in fp32, which is
 * what the hardware computes (exact products of half inputs, fp32 sums). */
static int half_gemm(const struct tr_graph *g) { return g->compute == TR_BF16 || g->compute == TR_F16; }

static float *rounded(const struct tr_graph *g, float *dst, const float *src, size_t n)
{
    tr_cpu_round_to_half(dst, src, n, g->compute == TR_BF16);
    return dst;
}

/* A GEMM's weight (in[1]) rounded likewise: a parameter of a graph whose
 * parameters are gathered in the compute dtype (tr_graph.params16) widened
 * from there -- the same numbers, and the only place other ranks' parts of
 * such a weight are -- anything else rounded from its fp32 values */
static const float *weight_rounded(const struct tr_graph *g, float *dst, const struct tr_tensor *t)
{
    if (g->params16 != NULL && t->role == TR_ROLE_PARAM && t->dtype == TR_F32) {
        tr_cpu_from_half(dst, (const uint16_t *)g->params16 + t->offset, t->numel,
                         g->compute == TR_BF16);
        return dst;
    }
    return rounded(g, dst, F(t), t->numel);
}

/* bf16 on a CPU with bf16 GEMM instructions (tr_cpu_bf16_native_isa): the
 * inputs are converted to bf16 into scratch, half the bytes of the rounded
 * fp32 copies above, and oneDNN multiplies them natively.  The same numbers
 * go in as in the emulation; only the order of the fp32 sums differs. */
int tr_cpu_node_native_bf16(const struct tr_graph *g)
{
    return g->compute == TR_BF16 && tr_cpu_bf16_native_isa() != NULL;
}

/* A linear node on the native bf16 path whose output is stored in bf16:
 * its GEMM rounds each tile of the output into storage as it stores it
 * (tr_cpu_linear_forward_bf16_out16) instead of backend.c's run_node
 * rounding the whole fp32 output in a pass of its own. */
int tr_cpu_node_linear_out16(const struct tr_graph *g, const struct tr_node *n)
{
    return n->op == TR_OP_LINEAR && tr_cpu_node_native_bf16(g) && g->tensors[n->out].dtype == TR_BF16;
}

/* floats of scratch that hold n bf16 values, in whole 64-byte lines */
static size_t bf16_floats(size_t n) { return ((n + 31) & ~(size_t)31) / 2; }

static const uint16_t *to_bf16(float *dst, const float *src, size_t n)
{
    tr_cpu_to_bf16((uint16_t *)(void *)dst, src, n);
    return (const uint16_t *)(const void *)dst;
}

/* A GEMM operand in bf16: a tensor stored in bf16 as it is (no second
 * copy), a frozen NF4 weight dequantised straight into dst (the rounding of
 * its fp32 values: no fp32 copy, backend.c's native_half), anything else
 * converted into dst */
static const uint16_t *bf16_of(float *dst, const struct tr_tensor *t)
{
    if (t->dtype == TR_BF16)
        return (const uint16_t *)t->data;
    if (t->dtype == TR_NF4) {
        tr_cpu_nf4_to_bf16((uint16_t *)(void *)dst, t->data, t->numel, 0, t->numel);
        return (const uint16_t *)(const void *)dst;
    }
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
 * copies of 16-bit inputs, backend.c's run_node). */
int tr_cpu_node_attention_bf16(const struct tr_graph *g, const struct tr_node *n)
{
    if (n->op != TR_OP_ATTENTION || !tr_cpu_node_native_bf16(g))
        return 0;
    for (int i = 0; i < n->n_in; i++)
        if (T(i)->dtype != TR_BF16)
            return 0;
    return 1;
}
#define U16(t) ((const uint16_t *)(t)->data)

/* ---- convolutional ops: geometry from the node's tensors and attributes */
struct tr_cpu_conv_shape tr_cpu_node_conv_shape(const struct tr_graph *g, const struct tr_node *n)
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

/* the output's gradient: none for the loss (g->loss_grad seeds it) */
static const float *dout_of(const struct tr_graph *g, const struct tr_node *n)
{
    return n->out == g->loss ? NULL : OUT->grad;
}

/* batch norm's running[2,C] (its TR_ROLE_BUFFER tensor) */
static float *bn_running(const struct tr_graph *g, const struct tr_node *n)
{
    return n->buffer >= 0 && n->buffer < g->n_tensors ? F(&g->tensors[n->buffer]) : NULL;
}

/* ---- scratch: floats each op needs (forward and backward share it) */

static size_t gemm_scratch(const struct tr_graph *g, const struct tr_node *n)
{
    if (tr_cpu_node_native_bf16(g)) /* in bf16 */
        return bf16_floats(T(0)->numel) + bf16_floats(T(1)->numel) + bf16_floats(OUT->numel);
    if (half_gemm(g)) /* x, w, dout rounded */
        return T(0)->numel + T(1)->numel + OUT->numel;
    return 0;
}

/* 16-bit copies, reordered weights, oneDNN's scratchpads */
static size_t conv2d_scratch(const struct tr_graph *g, const struct tr_node *n)
{
    struct tr_cpu_conv_shape s = tr_cpu_node_conv_shape(g, n);
    return tr_cpu_conv2d_scratch_floats(&s, n->n_in == 3, g->compute);
}

/* ordered partial sums */
static size_t batchnorm_scratch(const struct tr_graph *g, const struct tr_node *n)
{
    return tr_cpu_batchnorm_scratch_floats(rows(T(0)), cols(T(0)));
}

/* dw's partial sums */
static size_t rmsnorm_scratch(const struct tr_graph *g, const struct tr_node *n)
{
    return tr_cpu_rmsnorm_scratch_floats(rows(T(0)), cols(T(0)));
}

/* dw's and db's partial sums */
static size_t layernorm_scratch(const struct tr_graph *g, const struct tr_node *n)
{
    return tr_cpu_layernorm_scratch_floats(rows(T(0)), cols(T(0)));
}

/* the cos/sin table */
static size_t rope_scratch(const struct tr_graph *g, const struct tr_node *n)
{
    return tr_cpu_rope_scratch_floats((int)T(0)->shape[1], cols(T(0)) / n->heads);
}

static size_t attention_scratch(const struct tr_graph *g, const struct tr_node *n)
{
    const struct tr_tensor *qkv = T(0);
    if (tr_cpu_node_attention_bf16(g, n))
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

/* ---- forward and backward, in enum order -------------------------------- */

static void embedding_forward(struct tr_graph *g, const struct tr_node *n)
{
    if (T(0)->dtype == TR_BF16 || T(0)->dtype == TR_F16) /* a frozen 16-bit table */
        tr_cpu_embedding_forward_half(F(OUT), I(T(1)), (const uint16_t *)T(0)->data,
                                      (int)T(1)->numel, cols(T(0)), T(0)->dtype == TR_BF16);
    else
        tr_cpu_embedding_forward(F(OUT), I(T(1)), F(T(0)), (int)T(1)->numel, cols(T(0)));
}

static void embedding_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_embedding_backward(T(0)->grad, dout, I(T(1)), (int)T(1)->numel, cols(T(0)));
}

static void add_rows_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_add_rows_forward(F(OUT), F(T(0)), F(T(1)), (int)T(0)->shape[0], (int)T(0)->shape[1],
                            (int)T(0)->shape[2]);
}

static void add_rows_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_add_rows_backward(T(0)->grad, T(1)->grad, dout, (int)T(0)->shape[0],
                             (int)T(0)->shape[1], (int)T(0)->shape[2]);
}

static void add_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_add_forward_act(act(OUT), act(T(0)), act(T(1)), OUT->numel);
}

static void add_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_add_backward(T(0)->grad, T(1)->grad, dout, OUT->numel, n->write_grad_mask);
}

/* out = x w^T (+ a bias), or onto an addend (ops.h, tr_linear_addend): the
 * product goes onto it tile by tile.  On the native bf16 path a bf16 output
 * takes a bf16 addend as stored (backend.c's native_half); every other
 * 16-bit tensor here is an fp32 copy (run_node), so the types pair up. */
static void linear_forward(struct tr_graph *g, const struct tr_node *n)
{
    int N = rows(T(0)), IC = cols(T(0)), OC = (int)T(1)->shape[0];
    int addend = tr_linear_addend(g, n), out16 = tr_cpu_node_linear_out16(g, n);
    const float *bias = n->n_in == 3 && !addend ? F(T(2)) : NULL;
    if (tr_cpu_node_native_bf16(g)) {
        struct bf16_operands o = bf16_inputs(g, n);
        if (addend && out16 && T(2)->dtype != TR_BF16) { /* an fp32 addend */
            tr_cpu_linear_forward_bf16_out16((uint16_t *)OUT->data, o.a, o.b, NULL, N, IC, OC);
            tr_cpu_add_forward_act(act(OUT), act(OUT), act(T(2)), OUT->numel);
        } else if (addend) {
            tr_cpu_linear_forward_bf16_onto(out16 ? NULL : F(OUT),
                                            out16 ? (uint16_t *)OUT->data : NULL, o.a, o.b,
                                            T(2)->data, N, IC, OC);
        } else if (out16) { /* rounded into storage tile by tile */
            tr_cpu_linear_forward_bf16_out16((uint16_t *)OUT->data, o.a, o.b, bias, N, IC, OC);
        } else {
            tr_cpu_linear_forward_bf16(F(OUT), o.a, o.b, bias, N, IC, OC);
        }
        return;
    }
    const float *x = F(T(0)), *w = F(T(1)), *wt = NULL;
    int ldw = 0;
    if (half_gemm(g)) {
        x = rounded(g, g->scratch, x, T(0)->numel);
        w = weight_rounded(g, g->scratch + T(0)->numel, T(1));
    } else {
        wt = tr_cpu_frozen_t(g, T(1), N, &ldw); /* a frozen weight's copy, made once (frozen_t.c) */
    }
    if (addend)
        tr_cpu_linear_forward_onto(F(OUT), x, w, wt, ldw, F(T(2)), N, IC, OC);
    else if (wt != NULL)
        tr_cpu_linear_forward_wt(F(OUT), x, wt, ldw, bias, N, IC, OC);
    else
        tr_cpu_linear_forward(F(OUT), x, w, bias, N, IC, OC);
}

static void linear_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    /* an addend's gradient is dout itself: nothing to do where the plan gave
     * it dout's buffer (graph_plan.c), else written or added */
    int addend = tr_linear_addend(g, n);
    if (addend && T(2)->grad)
        tr_cpu_add_backward(T(2)->grad, NULL, dout, OUT->numel, (n->write_grad_mask >> 2) & 1u);
    float *dbias = n->n_in == 3 && !addend ? T(2)->grad : NULL;
    if (tr_cpu_node_native_bf16(g)) {
        /* dout to bf16 and the bias gradient (from the fp32 dout) in one pass */
        struct bf16_operands o = bf16_inputs(g, n);
        tr_cpu_linear_dout_bf16(o.dout, dbias, dout, rows(T(0)), (int)T(1)->shape[0],
                                (n->write_grad_mask & 4u) != 0);
        tr_cpu_linear_backward_bf16(T(0)->grad, T(1)->grad, o.dout, o.a, o.b, rows(T(0)),
                                    cols(T(0)), (int)T(1)->shape[0], n->write_grad_mask);
        return;
    }
    const float *x = F(T(0)), *w = F(T(1)), *gemm_dout = dout;
    if (half_gemm(g)) {
        x = rounded(g, g->scratch, x, T(0)->numel);
        w = weight_rounded(g, g->scratch + T(0)->numel, T(1));
        gemm_dout = rounded(g, g->scratch + T(0)->numel + T(1)->numel, dout, OUT->numel);
    }
    tr_cpu_linear_backward(T(0)->grad, T(1)->grad, NULL, gemm_dout, x, w, rows(T(0)),
                           cols(T(0)), (int)T(1)->shape[0], n->write_grad_mask);
    /* from the fp32 dout, whatever the GEMM inputs (kernels.h) */
    if (dbias)
        tr_cpu_linear_bias_backward(dbias, dout, rows(T(0)), (int)T(1)->shape[0],
                                    (n->write_grad_mask & 4u) != 0);
}

static void matmul_forward(struct tr_graph *g, const struct tr_node *n)
{
    int batch, M, K, N;
    matmul_dims(g, n, &batch, &M, &K, &N);
    if (tr_cpu_node_native_bf16(g)) {
        struct bf16_operands o = bf16_inputs(g, n);
        tr_cpu_matmul_forward_bf16(F(OUT), o.a, o.b, batch, M, K, N, n->trans_b);
        return;
    }
    const float *a = F(T(0)), *b = F(T(1));
    if (half_gemm(g)) {
        a = rounded(g, g->scratch, a, T(0)->numel);
        b = weight_rounded(g, g->scratch + T(0)->numel, T(1));
    }
    tr_cpu_matmul_forward(F(OUT), a, b, batch, M, K, N, n->trans_b);
}

static void matmul_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    int batch, M, K, N;
    matmul_dims(g, n, &batch, &M, &K, &N);
    if (tr_cpu_node_native_bf16(g)) {
        struct bf16_operands o = bf16_inputs(g, n);
        tr_cpu_to_bf16(o.dout, dout, OUT->numel);
        tr_cpu_matmul_backward_bf16(T(0)->grad, T(1)->grad, o.dout, o.a, o.b, batch, M, K, N,
                                    n->trans_b);
        return;
    }
    const float *a = F(T(0)), *b = F(T(1));
    if (half_gemm(g)) {
        a = rounded(g, g->scratch, a, T(0)->numel);
        b = weight_rounded(g, g->scratch + T(0)->numel, T(1));
        dout = rounded(g, g->scratch + T(0)->numel + T(1)->numel, dout, OUT->numel);
    }
    tr_cpu_matmul_backward(T(0)->grad, T(1)->grad, dout, a, b, batch, M, K, N, n->trans_b);
}

static void layernorm_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_layernorm_forward_act(act(OUT), AUX(0), AUX(1), act(T(0)), F(T(1)), F(T(2)),
                                 rows(T(0)), cols(T(0)), n->eps);
}

static void layernorm_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_layernorm_backward_act(T(0)->grad, T(1)->grad, T(2)->grad, g->scratch, dout,
                                  act(T(0)), F(T(1)), AUX(0), AUX(1), rows(T(0)), cols(T(0)),
                                  n->write_grad_mask);
}

static void gelu_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_gelu_forward_act(act(OUT), act(T(0)), OUT->numel);
}

static void gelu_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_gelu_backward_act(T(0)->grad, act(T(0)), dout, OUT->numel,
                             (n->write_grad_mask & 1u) != 0);
}

static void relu_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_relu_forward(F(OUT), F(T(0)), OUT->numel);
}

static void relu_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_relu_backward(T(0)->grad, F(T(0)), dout, OUT->numel);
}

static void attention_forward(struct tr_graph *g, const struct tr_node *n)
{
    if (g->seq_to > 0) { /* a window of query rows: the rows before it are the cache */
        int bf16 = tr_cpu_node_attention_bf16(g, n), B = (int)T(0)->shape[0],
            Tn = (int)T(0)->shape[1];
        if (n->n_in == 3)
            tr_cpu_attention_gqa_forward_rows(F(OUT), AUX(0), F(T(0)), F(T(1)), F(T(2)),
                                              bf16 ? U16(T(0)) : NULL, bf16 ? U16(T(1)) : NULL,
                                              bf16 ? U16(T(2)) : NULL, B, Tn, n->heads,
                                              kv_heads(n), cols(T(0)) / n->heads, g->seq_from,
                                              g->seq_to);
        else
            tr_cpu_attention_forward_rows(F(OUT), AUX(0), F(T(0)), bf16 ? U16(T(0)) : NULL, B,
                                          Tn, (int)T(0)->shape[2] / 3, n->heads, g->seq_from,
                                          g->seq_to);
        return;
    }
    if (tr_cpu_node_attention_bf16(g, n) && n->n_in == 3)
        tr_cpu_attention_gqa_forward_bf16(F(OUT), AUX(0), U16(T(0)), U16(T(1)), U16(T(2)),
                                          (int)T(0)->shape[0], (int)T(0)->shape[1], n->heads,
                                          kv_heads(n), cols(T(0)) / n->heads);
    else if (tr_cpu_node_attention_bf16(g, n))
        tr_cpu_attention_forward_bf16(F(OUT), AUX(0), U16(T(0)), (int)T(0)->shape[0],
                                      (int)T(0)->shape[1], (int)T(0)->shape[2] / 3, n->heads);
    else if (n->n_in == 3)
        tr_cpu_attention_gqa_forward(F(OUT), AUX(0), F(T(0)), F(T(1)), F(T(2)),
                                     (int)T(0)->shape[0], (int)T(0)->shape[1], n->heads,
                                     kv_heads(n), cols(T(0)) / n->heads);
    else
        tr_cpu_attention_forward(F(OUT), AUX(0), F(T(0)), (int)T(0)->shape[0],
                                 (int)T(0)->shape[1], (int)T(0)->shape[2] / 3, n->heads);
}

static void attention_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    if (tr_cpu_node_attention_bf16(g, n) && n->n_in == 3)
        tr_cpu_attention_gqa_backward_bf16(T(0)->grad, T(1)->grad, T(2)->grad, g->scratch,
                                           dout, F(OUT), U16(T(0)), U16(T(1)), U16(T(2)),
                                           AUX(0), (int)T(0)->shape[0], (int)T(0)->shape[1],
                                           n->heads, kv_heads(n), cols(T(0)) / n->heads,
                                           n->write_grad_mask);
    else if (tr_cpu_node_attention_bf16(g, n))
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
}

static void cross_entropy_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_cross_entropy_forward(F(OUT), AUX(0), F(T(0)), I(T(1)), rows(T(0)), cols(T(0)),
                                 n->ignore_index);
}

static void cross_entropy_backward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_cross_entropy_backward(T(0)->grad, F(T(0)), AUX(0), I(T(1)), g->loss_grad,
                                  rows(T(0)), cols(T(0)), n->ignore_index,
                                  (n->write_grad_mask & 1u) != 0);
}

static void rmsnorm_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_rmsnorm_forward(F(OUT), AUX(0), F(T(0)), F(T(1)), rows(T(0)), cols(T(0)), n->eps);
}

static void rmsnorm_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_rmsnorm_backward(T(0)->grad, T(1)->grad, g->scratch, dout, F(T(0)), F(T(1)),
                            AUX(0), rows(T(0)), cols(T(0)), n->write_grad_mask);
}

/* the node's Llama 3.1 frequency scaling (rope_factor 0: none) */
static struct tr_rope_scaling rope_scaling_of(const struct tr_node *n)
{
    return (struct tr_rope_scaling){n->rope_factor, n->rope_low_freq_factor,
                                    n->rope_high_freq_factor, n->rope_original_ctx};
}

static void rope_forward(struct tr_graph *g, const struct tr_node *n)
{
    struct tr_rope_scaling sc = rope_scaling_of(n);
    /* in a window of rows, row t is at position seq_from + t */
    tr_cpu_rope_forward_at(F(OUT), F(T(0)), g->scratch, (int)T(0)->shape[0], (int)T(0)->shape[1],
                           n->heads, cols(T(0)) / n->heads, n->theta, &sc,
                           g->seq_to > 0 ? g->seq_from : 0);
}

static void rope_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    struct tr_rope_scaling sc = rope_scaling_of(n);
    tr_cpu_rope_backward_scaled(T(0)->grad, dout, g->scratch, (int)T(0)->shape[0],
                                (int)T(0)->shape[1], n->heads, cols(T(0)) / n->heads, n->theta,
                                &sc, (n->write_grad_mask & 1u) != 0);
}

static void swiglu_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_swiglu_forward(F(OUT), F(T(0)), F(T(1)), OUT->numel);
}

static void swiglu_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_swiglu_backward(T(0)->grad, T(1)->grad, F(T(0)), F(T(1)), dout, OUT->numel,
                           n->write_grad_mask);
}

static void scale_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_scale_forward(F(OUT), F(T(0)), n->scale, OUT->numel);
}

static void scale_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_scale_backward(T(0)->grad, dout, n->scale, OUT->numel,
                          (n->write_grad_mask & 1u) != 0);
}

/* dropout: the node's index salts its mask; eval passes x through */
static void dropout_forward(struct tr_graph *g, const struct tr_node *n)
{
    if (!g->training) {
        memcpy(F(OUT), F(T(0)), OUT->numel * sizeof(float));
        return;
    }
    tr_cpu_dropout_forward(F(OUT), F(T(0)), OUT->numel, n->p, g->dropout_seed,
                           (uint64_t)(n - g->nodes));
}

static void dropout_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    int write = (n->write_grad_mask & 1u) != 0;
    if (!g->training) /* (a backward after an eval forward: the identity's) */
        tr_cpu_scale_backward(T(0)->grad, dout, 1.0f, OUT->numel, write);
    else
        tr_cpu_dropout_backward(T(0)->grad, dout, OUT->numel, n->p, g->dropout_seed,
                                (uint64_t)(n - g->nodes), write);
}

static void conv2d_forward(struct tr_graph *g, const struct tr_node *n)
{
    struct tr_cpu_conv_shape s = tr_cpu_node_conv_shape(g, n);
    tr_cpu_conv2d_forward(F(OUT), F(T(0)), F(T(1)), n->n_in == 3 ? F(T(2)) : NULL, g->scratch,
                          &s, g->compute);
}

static void conv2d_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    struct tr_cpu_conv_shape s = tr_cpu_node_conv_shape(g, n);
    tr_cpu_conv2d_backward(T(0)->grad, T(1)->grad, n->n_in == 3 ? T(2)->grad : NULL,
                           g->scratch, dout, F(T(0)), F(T(1)), (n->write_grad_mask & 1u) != 0,
                           &s, g->compute);
}

static void maxpool_forward(struct tr_graph *g, const struct tr_node *n)
{
    struct tr_cpu_pool_shape s = pool_shape(g, n);
    tr_cpu_maxpool_forward(F(OUT), F(T(0)), &s);
}

static void maxpool_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    struct tr_cpu_pool_shape s = pool_shape(g, n);
    if (T(0)->grad)
        tr_cpu_maxpool_backward(T(0)->grad, dout, F(T(0)), &s);
}

static void avgpool_forward(struct tr_graph *g, const struct tr_node *n)
{
    struct tr_cpu_pool_shape s = pool_shape(g, n);
    tr_cpu_avgpool_forward(F(OUT), F(T(0)), &s);
}

static void avgpool_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    struct tr_cpu_pool_shape s = pool_shape(g, n);
    if (T(0)->grad)
        tr_cpu_avgpool_backward(T(0)->grad, dout, &s);
}

static void global_avgpool_forward(struct tr_graph *g, const struct tr_node *n)
{
    tr_cpu_global_avgpool_forward(F(OUT), F(T(0)), (int)T(0)->shape[0],
                                  (int)(T(0)->shape[1] * T(0)->shape[2]), cols(T(0)));
}

static void global_avgpool_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    if (T(0)->grad)
        tr_cpu_global_avgpool_backward(T(0)->grad, dout, (int)T(0)->shape[0],
                                       (int)(T(0)->shape[1] * T(0)->shape[2]), cols(T(0)));
}

static void batchnorm_forward(struct tr_graph *g, const struct tr_node *n)
{
    if (g->training) /* a recomputed forward must not move the running statistics again */
        tr_cpu_batchnorm_forward_train(F(OUT), AUX(0), AUX(1),
                                       g->recomputing ? NULL : bn_running(g, n), g->scratch,
                                       F(T(0)), F(T(1)), F(T(2)), rows(T(0)), cols(T(0)),
                                       n->eps, n->momentum);
    else
        tr_cpu_batchnorm_forward_eval(F(OUT), AUX(0), AUX(1), g->scratch, F(T(0)), F(T(1)),
                                      F(T(2)), bn_running(g, n), rows(T(0)), cols(T(0)),
                                      n->eps);
}

static void batchnorm_backward(struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    tr_cpu_batchnorm_backward(T(0)->grad, T(1)->grad, T(2)->grad, g->scratch, dout, F(T(0)),
                              F(T(1)), AUX(0), AUX(1), rows(T(0)), cols(T(0)), g->training);
}

/* ---- the table ------------------------------------------------------------
 * forward, backward, scratch, backward_skips_inputs, backward_skips_output,
 * writes_grads.  Gradients written, not added: linear (all three: GEMMs
 * with beta 0, the bias sums stored), add, layer norm, RMSNorm, SwiGLU,
 * attention (q, k and v: each block's first product with beta 0), GELU,
 * rope, scale, the cross-entropy's logits and the convolution's data
 * gradient.  The others (embeddings, batched matmul, pooling, batch norm,
 * ReLU) add to what the core zeroed. */
const struct tr_cpu_op tr_cpu_ops[TR_OP_COUNT] = {
    [TR_OP_EMBEDDING] = {embedding_forward, embedding_backward, NULL, 0, 1, 0},
    [TR_OP_ADD_ROWS] = {add_rows_forward, add_rows_backward, NULL, 1, 1, 0},
    [TR_OP_ADD] = {add_forward, add_backward, NULL, 1, 1, ~0u},
    [TR_OP_LINEAR] = {linear_forward, linear_backward, gemm_scratch, 0, 1, ~0u},
    [TR_OP_MATMUL] = {matmul_forward, matmul_backward, gemm_scratch, 0, 1, 0},
    [TR_OP_LAYERNORM] = {layernorm_forward, layernorm_backward, layernorm_scratch, 0, 1, ~0u},
    [TR_OP_GELU] = {gelu_forward, gelu_backward, NULL, 0, 1, 1u},
    [TR_OP_RELU] = {relu_forward, relu_backward, NULL, 0, 1, 0},
    [TR_OP_ATTENTION] = {attention_forward, attention_backward, attention_scratch, 0, 0, ~0u},
    [TR_OP_CROSS_ENTROPY] = {cross_entropy_forward, cross_entropy_backward, NULL, 0, 1, 1u},
    [TR_OP_RMSNORM] = {rmsnorm_forward, rmsnorm_backward, rmsnorm_scratch, 0, 1, ~0u},
    [TR_OP_ROPE] = {rope_forward, rope_backward, rope_scratch, 1, 1, 1u},
    [TR_OP_SWIGLU] = {swiglu_forward, swiglu_backward, NULL, 0, 1, ~0u},
    [TR_OP_SCALE] = {scale_forward, scale_backward, NULL, 1, 1, 1u},
    [TR_OP_CONV2D] = {conv2d_forward, conv2d_backward, conv2d_scratch, 0, 1, 1u},
    [TR_OP_MAXPOOL] = {maxpool_forward, maxpool_backward, NULL, 0, 1, 0},
    [TR_OP_AVGPOOL] = {avgpool_forward, avgpool_backward, NULL, 1, 1, 0},
    [TR_OP_GLOBAL_AVGPOOL] = {global_avgpool_forward, global_avgpool_backward, NULL, 1, 1, 0},
    [TR_OP_BATCHNORM] = {batchnorm_forward, batchnorm_backward, batchnorm_scratch, 0, 1, 0},
    [TR_OP_DROPOUT] = {dropout_forward, dropout_backward, NULL, 1, 1, 1u},
};
