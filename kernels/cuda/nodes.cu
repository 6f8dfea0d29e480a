/*
 * The CUDA backend's nodes: each op's forward and backward as launches of
 * the kernels in ops.cu, norms.cu, step.cu, attention.cu, pool.cu, gemm.cu
 * and conv.cu, one function each in a per-op table indexed by enum tr_op
 * (cuda_ops); the storage and GEMM dtypes a node runs in, its scratch
 * layout, and which nodes the backend supports.  backend.cu puts them in
 * the module's iface.  Adding an op: its functions and its row in
 * build_ops (docs/ops.md).  One file past 800 lines because the table
 * holds the node functions, which are static and read the node through the
 * same macros and storage rules as the 16-bit views around them.
 */
#include "common.cuh"
#include "../ops.h"

#include <stdio.h>
#include <string.h>

/* ---- nodes ------------------------------------------------------------------- */

#define T(i) (&g->tensors[n->in[i]])
#define OUT (&g->tensors[n->out])
#define AUX(i) ((float *)g->tensors[n->aux[i]].data)
#define IDS(t) ((const int32_t *)(t)->data)

static int rows(const struct tr_tensor *t) { return (int)(t->numel / (size_t)t->shape[t->ndim - 1]); }
static int cols(const struct tr_tensor *t) { return (int)t->shape[t->ndim - 1]; }

static int is_half(int dt) { return dt == DT_BF16 || dt == DT_F16; }

/* Frozen weights (TR_ROLE_FROZEN, nf4.cu) keep their own storage type and
 * stay out of the storage rules below: a linear's weight is converted to
 * the GEMM's input type in scratch (NF4 dequantised), and otherwise counts
 * as the fp32 parameter it stands for, so the node runs as it would with
 * one; an embedding's table is read by a kernel of its own into the
 * output's type. */
static int frozen_weight(const struct tr_graph *g, const struct tr_node *n)
{
    return n->op == TR_OP_LINEAR && n->n_in > 1 && T(1)->role == TR_ROLE_FROZEN;
}

static int frozen_table(const struct tr_graph *g, const struct tr_node *n)
{
    return n->op == TR_OP_EMBEDDING && T(0)->role == TR_ROLE_FROZEN;
}

static int frozen_input(const struct tr_graph *g, const struct tr_node *n, int k)
{
    return (k == 1 && frozen_weight(g, n)) || (k == 0 && frozen_table(g, n));
}

/* The node's storage dtype: that of its first input (every float input and
 * output of a node shares it, or the node runs on fp32 copies, see
 * run_node; saved tensors and gradients are fp32); an embedding of a frozen
 * table: its output's. */
static int storage(const struct tr_graph *g, const struct tr_node *n)
{
    return frozen_table(g, n) ? (int)OUT->dtype : (int)T(0)->dtype;
}

/* The GEMM input dtype: the precision policy's when it asks for 16 bits,
 * else the storage dtype. */
static int gemm_dtype(const struct tr_graph *g, const struct tr_node *n)
{
    int compute = (int)g->compute;
    return is_half(compute) ? compute : storage(g, n);
}

static size_t dt_bytes(int dt) { return is_half(dt) ? 2 : 4; }

/* floats of scratch for `numel` elements of dtype dt, in 256-byte units */
static size_t floats_for(size_t numel, int dt)
{
    size_t floats = (numel * dt_bytes(dt) + 3) / 4;
    return (floats + 63) & ~(size_t)63;
}

/* An attention node's tensors for the kernels (common.cuh): the packed
 * qkv[B,T,3C] form, or q[B,T,H*D], k and v[B,T,KV*D] with kv_heads KV. */
static struct attention_args attention_of(const struct tr_graph *g, const struct tr_node *n)
{
    struct attention_args a;
    const struct tr_tensor *q = T(0);
    a.q_begin = a.q_end = 0; /* every row (a window: attention_forward) */
    a.B = (int)q->shape[0];
    a.T = (int)q->shape[1];
    a.NH = n->heads;
    if (n->n_in == 1) {
        int C = (int)(q->shape[2] / 3);
        size_t bytes = dt_bytes(storage(g, n));
        a.KV = a.NH;
        a.D = a.NH > 0 ? C / a.NH : 0;
        a.q_stride = a.kv_stride = 3 * (size_t)C;
        a.q = q->data;
        a.k = (const char *)q->data + (size_t)C * bytes;
        a.v = (const char *)q->data + 2 * (size_t)C * bytes;
        a.dq = q->grad;
        a.dk = q->grad ? q->grad + C : NULL;
        a.dv = q->grad ? q->grad + 2 * (size_t)C : NULL;
        return a;
    }
    a.KV = n->kv_heads;
    a.D = a.NH > 0 ? (int)(q->shape[2] / a.NH) : 0;
    a.q_stride = (size_t)q->shape[2];
    a.kv_stride = (size_t)T(1)->shape[2];
    a.q = q->data;
    a.k = T(1)->data;
    a.v = T(2)->data;
    a.dq = q->grad;
    a.dk = T(1)->grad;
    a.dv = T(2)->grad;
    return a;
}

/* rope's head size: the last dimension over the node's heads */
static int rope_head(const struct tr_graph *g, const struct tr_node *n)
{
    return n->heads > 0 ? cols(T(0)) / n->heads : 0;
}

/* A conv2d node as conv.cu takes it (the gradients are filled for backward) */
static struct conv_args conv_of(const struct tr_graph *g, const struct tr_node *n)
{
    struct conv_args a;
    memset(&a, 0, sizeof a);
    const struct tr_tensor *x = T(0), *w = T(1), *y = OUT;
    a.B = (int)x->shape[0];
    a.H = (int)x->shape[1];
    a.W = (int)x->shape[2];
    a.IC = (int)x->shape[3];
    a.OC = (int)w->shape[0];
    a.KH = (int)w->shape[1];
    a.KW = (int)w->shape[2];
    a.OH = (int)y->shape[1];
    a.OW = (int)y->shape[2];
    a.SH = n->stride[0];
    a.SW = n->stride[1];
    a.PH = n->pad[0];
    a.PW = n->pad[1];
    a.DH = n->dilation[0];
    a.DW = n->dilation[1];
    a.groups = n->groups;
    a.dt = (int)x->dtype;
    a.compute = (int)g->compute;
    a.tf32 = g->allow_tf32;
    a.has_bias = n->n_in == 3;
    a.x = x->data;
    a.w = w->data;
    a.b = n->n_in == 3 ? T(2)->data : NULL;
    a.out = y->data;
    a.dout = y->grad;
    a.dx = x->grad;
    a.dw = w->grad;
    a.db = n->n_in == 3 ? T(2)->grad : NULL;
    return a;
}

/* A pooling node's geometry: x[B,H,W,C] to out[B,OH,OW,C] */
static struct pool_args pool_of(const struct tr_graph *g, const struct tr_node *n)
{
    struct pool_args p;
    const struct tr_tensor *x = T(0), *y = OUT;
    p.B = (int)x->shape[0];
    p.H = (int)x->shape[1];
    p.W = (int)x->shape[2];
    p.C = (int)x->shape[3];
    p.OH = (int)y->shape[1];
    p.OW = (int)y->shape[2];
    p.KH = n->kernel[0];
    p.KW = n->kernel[1];
    p.SH = n->stride[0];
    p.SW = n->stride[1];
    p.PH = n->pad[0];
    p.PW = n->pad[1];
    return p;
}

/* batch norm's running[2,C] buffer (fp32, in g->buffers) */
static float *running_of(const struct tr_graph *g, const struct tr_node *n)
{
    return n->buffer >= 0 && n->buffer < g->n_tensors ? (float *)g->tensors[n->buffer].data : NULL;
}

struct gemm_geometry {
    int batch, M, K, N; /* out[b] = a[b] (M x K) @ op(b[b]) (K x N) */
};

static struct gemm_geometry geometry(const struct tr_graph *g, const struct tr_node *n)
{
    struct gemm_geometry s;
    const struct tr_tensor *a = T(0), *b = T(1);
    if (n->op == TR_OP_LINEAR) {
        s.batch = 1;
        s.M = rows(a);
        s.K = cols(a);
        s.N = (int)b->shape[0];
        return s;
    }
    int nd = a->ndim;
    s.batch = nd == 3 ? (int)a->shape[0] : 1;
    s.M = (int)a->shape[nd - 2];
    s.K = (int)a->shape[nd - 1];
    s.N = n->trans_b ? (int)b->shape[nd - 2] : (int)b->shape[nd - 1];
    return s;
}

/* Scratch of a GEMM node: its two inputs and dout converted to the GEMM
 * dtype where they are not in it, then the bias-gradient partial sums. */
struct gemm_scratch {
    size_t a, b, dout, bias, total; /* float offsets */
};

static struct gemm_scratch gemm_scratch_layout(const struct tr_graph *g, const struct tr_node *n)
{
    struct gemm_scratch s;
    int dt = storage(g, n), gdt = gemm_dtype(g, n);
    size_t at = 0;
    s.a = at;
    if (dt != gdt)
        at += floats_for(T(0)->numel, gdt);
    s.b = at;
    if (frozen_weight(g, n) ? (int)T(1)->dtype != gdt : dt != gdt)
        at += floats_for(T(1)->numel, gdt);
    s.dout = at;
    if (gdt != DT_F32) /* gradients are fp32 */
        at += floats_for(OUT->numel, gdt);
    s.bias = at;
    if (n->op == TR_OP_LINEAR && n->n_in == 3 && !tr_linear_addend(g, n)) {
        struct gemm_geometry geo = geometry(g, n);
        at += (cuda_bias_scratch_floats(geo.M, geo.N) + 63) & ~(size_t)63;
    }
    s.total = at;
    return s;
}

/* Floats of scratch each op's kernels need (forward and backward share it). */
static size_t conv2d_scratch(struct cuda_context *c, const struct tr_graph *g,
                             const struct tr_node *n)
{
    struct conv_args a = conv_of(g, n);
    return cuda_conv_scratch_floats(c, &a);
}

static size_t batchnorm_scratch(struct cuda_context *c, const struct tr_graph *g,
                                const struct tr_node *n)
{
    (void)c;
    return cuda_batchnorm_scratch_floats(rows(T(0)), cols(T(0)));
}

static size_t gemm_scratch(struct cuda_context *c, const struct tr_graph *g,
                           const struct tr_node *n)
{
    (void)c;
    return gemm_scratch_layout(g, n).total;
}

static size_t layernorm_scratch(struct cuda_context *c, const struct tr_graph *g,
                                const struct tr_node *n)
{
    (void)c;
    return cuda_layernorm_scratch_floats(rows(T(0)), cols(T(0)));
}

static size_t attention_scratch(struct cuda_context *c, const struct tr_graph *g,
                                const struct tr_node *n)
{
    (void)c;
    return cuda_attention_scratch_floats((int)T(0)->shape[0], (int)T(0)->shape[1], n->heads);
}

static size_t cross_entropy_scratch(struct cuda_context *c, const struct tr_graph *g,
                                    const struct tr_node *n)
{
    (void)c;
    return cuda_cross_entropy_scratch_floats(rows(T(0)));
}

static size_t rmsnorm_scratch(struct cuda_context *c, const struct tr_graph *g,
                              const struct tr_node *n)
{
    (void)c;
    return cuda_rmsnorm_scratch_floats(rows(T(0)), cols(T(0)));
}

static size_t rope_scratch(struct cuda_context *c, const struct tr_graph *g,
                           const struct tr_node *n)
{
    (void)c;
    return cuda_rope_scratch_floats((int)T(0)->shape[1], rope_head(g, n));
}

/* x in the GEMM dtype: itself, or converted into scratch */
static const void *as_gemm_input(struct cuda_context *c, const void *x, int from, int to,
                                 size_t numel, float *scratch_at)
{
    if (from == to)
        return x;
    cuda_convert(c, scratch_at, to, x, from, numel);
    return scratch_at;
}

/* A GEMM node's second operand in the GEMM dtype: a frozen weight from its
 * own storage type (nf4.cu), anything else as as_gemm_input */
static const void *gemm_b(struct cuda_context *c, const struct tr_graph *g, const struct tr_node *n,
                          int dt, int gdt, float *scratch_at)
{
    /* sharded parameters gathered in the compute dtype (backend.h,
     * tr_graph.params16): a GEMM weight is there, and its fp32 values in
     * params are this rank's parts only */
    if (!frozen_weight(g, n) && g->params16 && T(1)->role == TR_ROLE_PARAM &&
        T(1)->dtype == TR_F32 && is_half(gdt))
        return (const uint16_t *)g->params16 + T(1)->offset;
    if (!frozen_weight(g, n))
        return as_gemm_input(c, T(1)->data, dt, gdt, T(1)->numel, scratch_at);
    if ((int)T(1)->dtype == gdt)
        return T(1)->data;
    cuda_frozen_convert(c, scratch_at, gdt, T(1));
    return scratch_at;
}

static void gemm_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n), gdt = gemm_dtype(g, n);
    struct gemm_geometry s = geometry(g, n);
    struct gemm_scratch sl = gemm_scratch_layout(g, n);
    const void *a = as_gemm_input(c, T(0)->data, dt, gdt, T(0)->numel, g->scratch + sl.a);
    const void *b = gemm_b(c, g, n, dt, gdt, g->scratch + sl.b);
    if (tr_linear_addend(g, n)) { /* out = addend + x @ w^T: the addend copied, beta 1 */
        CUDA_NOTE(c, cudaMemcpyAsync(OUT->data, T(2)->data, OUT->numel * dt_bytes(dt),
                                     cudaMemcpyDeviceToDevice, c->compute));
        cuda_gemm(c, 0, 1, s.M, s.N, s.K, 1.0f, a, s.K, 0, b, s.K, 0, 1.0f, OUT->data, s.N, 0, 1,
                  gdt, dt, NULL);
    } else if (n->op == TR_OP_LINEAR) /* out[M,N] = x[M,K] @ w[N,K]^T + bias */
        cuda_gemm(c, 0, 1, s.M, s.N, s.K, 1.0f, a, s.K, 0, b, s.K, 0, 0.0f, OUT->data, s.N, 0, 1,
                  gdt, dt, n->n_in == 3 ? T(2)->data : NULL);
    else
        cuda_gemm(c, 0, n->trans_b, s.M, s.N, s.K, 1.0f, a, s.K, (long long)s.M * s.K, b,
                  n->trans_b ? s.K : s.N, (long long)s.K * s.N, 0.0f, OUT->data, s.N,
                  (long long)s.M * s.N, s.batch, gdt, dt, NULL);
}

static void gemm_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n), gdt = gemm_dtype(g, n);
    struct gemm_geometry s = geometry(g, n);
    struct gemm_scratch sl = gemm_scratch_layout(g, n);
    float *da = T(0)->grad, *db = T(1)->grad;
    int addend = tr_linear_addend(g, n);
    float *dbias = n->op == TR_OP_LINEAR && n->n_in == 3 && !addend ? T(2)->grad : NULL;
    const float *dout = OUT->grad;
    if (addend && T(2)->grad) /* dout itself, added to the gradient the core zeroed */
        cuda_add_backward(c, T(2)->grad, NULL, dout, OUT->numel);
    if (!da && !db && !dbias)
        return;
    if (dbias)
        cuda_bias_backward(c, dbias, dout, s.M, s.N, g->scratch + sl.bias);
    if (!da && !db)
        return;
    const void *a = as_gemm_input(c, T(0)->data, dt, gdt, T(0)->numel, g->scratch + sl.a);
    const void *b = gemm_b(c, g, n, dt, gdt, g->scratch + sl.b);
    const void *d = as_gemm_input(c, dout, DT_F32, gdt, OUT->numel, g->scratch + sl.dout);
    long long sa = (long long)s.M * s.K, sb = (long long)s.K * s.N, so = (long long)s.M * s.N;
    if (n->op == TR_OP_LINEAR) {
        /* dx[M,K] += dout[M,N] @ w[N,K];  dw[N,K] += dout^T[N,M] @ x[M,K] */
        if (da)
            cuda_gemm(c, 0, 0, s.M, s.K, s.N, 1.0f, d, s.N, 0, b, s.K, 0, 1.0f, da, s.K, 0, 1, gdt,
                      DT_F32, NULL);
        if (db)
            cuda_gemm(c, 1, 0, s.N, s.K, s.M, 1.0f, d, s.N, 0, a, s.K, 0, 1.0f, db, s.K, 0, 1, gdt,
                      DT_F32, NULL);
    } else if (n->trans_b) {
        /* b stored [N,K]: da += dout @ b;  db[N,K] += dout^T @ a */
        if (da)
            cuda_gemm(c, 0, 0, s.M, s.K, s.N, 1.0f, d, s.N, so, b, s.K, sb, 1.0f, da, s.K, sa,
                      s.batch, gdt, DT_F32, NULL);
        if (db)
            cuda_gemm(c, 1, 0, s.N, s.K, s.M, 1.0f, d, s.N, so, a, s.K, sa, 1.0f, db, s.K, sb,
                      s.batch, gdt, DT_F32, NULL);
    } else {
        /* b stored [K,N]: da += dout @ b^T;  db[K,N] += a^T @ dout */
        if (da)
            cuda_gemm(c, 0, 1, s.M, s.K, s.N, 1.0f, d, s.N, so, b, s.N, sb, 1.0f, da, s.K, sa,
                      s.batch, gdt, DT_F32, NULL);
        if (db)
            cuda_gemm(c, 1, 0, s.K, s.N, s.M, 1.0f, a, s.K, sa, d, s.N, so, 1.0f, db, s.N, sb,
                      s.batch, gdt, DT_F32, NULL);
    }
}

/* the output's gradient: none for the loss (g->loss_grad seeds it) */
static const float *dout_of(const struct tr_graph *g, const struct tr_node *n)
{
    return n->out == g->loss ? NULL : OUT->grad;
}

/* Each op's forward and backward, in enum order: launches of the kernels
 * with the node's tensors, in its storage dtype. */

static void embedding_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    if (frozen_table(g, n))
        cuda_frozen_embedding_forward(c, dt, OUT->data, IDS(T(1)), T(0)->data, (int)T(0)->dtype,
                                      (int)T(1)->numel, cols(T(0)), (int)T(0)->shape[0]);
    else
        cuda_embedding_forward(c, dt, OUT->data, IDS(T(1)), T(0)->data, (int)T(1)->numel,
                               cols(T(0)), (int)T(0)->shape[0]);
}

static void embedding_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    cuda_embedding_backward(c, T(0)->grad, dout, IDS(T(1)), (int)T(1)->numel, cols(T(0)),
                            (int)T(0)->shape[0]);
}

static void add_rows_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_add_rows_forward(c, dt, OUT->data, T(0)->data, T(1)->data, (int)T(0)->shape[0],
                          (int)T(0)->shape[1], (int)T(0)->shape[2]);
}

static void add_rows_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    cuda_add_rows_backward(c, T(0)->grad, T(1)->grad, dout, (int)T(0)->shape[0],
                           (int)T(0)->shape[1], (int)T(0)->shape[2]);
}

static void add_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_add_forward(c, dt, OUT->data, T(0)->data, T(1)->data, OUT->numel);
}

static void add_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    cuda_add_backward(c, T(0)->grad, T(1)->grad, dout, OUT->numel);
}

static void layernorm_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_layernorm_forward(c, dt, OUT->data, AUX(0), AUX(1), T(0)->data, T(1)->data,
                           T(2)->data, rows(T(0)), cols(T(0)), n->eps);
}

static void layernorm_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    const float *dout = dout_of(g, n);
    cuda_layernorm_backward(c, dt, T(0)->grad, T(1)->grad, T(2)->grad, dout, T(0)->data,
                            T(1)->data, AUX(0), AUX(1), rows(T(0)), cols(T(0)), g->scratch);
}

static void gelu_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_gelu_forward(c, dt, OUT->data, T(0)->data, OUT->numel);
}

static void gelu_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    const float *dout = dout_of(g, n);
    cuda_gelu_backward(c, dt, T(0)->grad, T(0)->data, dout, OUT->numel);
}

static void relu_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_relu_forward(c, dt, OUT->data, T(0)->data, OUT->numel);
}

static void relu_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    const float *dout = dout_of(g, n);
    cuda_relu_backward(c, dt, T(0)->grad, T(0)->data, dout, OUT->numel);
}

static void attention_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    struct attention_args a = attention_of(g, n);
    if (g->seq_to > 0) { /* a window of query rows: the rows before it are the cache */
        a.q_begin = g->seq_from;
        a.q_end = g->seq_to;
    }
    cuda_attention_forward(c, dt, &a, OUT->data, AUX(0));
}

static void attention_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    const float *dout = dout_of(g, n);
    struct attention_args a = attention_of(g, n);
    cuda_attention_backward(c, dt, &a, dout, OUT->data, AUX(0), g->scratch);
}

static void cross_entropy_forward(struct cuda_context *c, struct tr_graph *g,
                                  const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_cross_entropy_forward(c, dt, OUT->data, AUX(0), T(0)->data, IDS(T(1)), rows(T(0)),
                               cols(T(0)), n->ignore_index, g->scratch);
}

static void cross_entropy_backward(struct cuda_context *c, struct tr_graph *g,
                                   const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_cross_entropy_backward(c, dt, T(0)->grad, T(0)->data, AUX(0), IDS(T(1)), g->loss_grad,
                                rows(T(0)), cols(T(0)), n->ignore_index, g->scratch);
}

static void rmsnorm_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_rmsnorm_forward(c, dt, OUT->data, AUX(0), T(0)->data, T(1)->data, rows(T(0)),
                         cols(T(0)), n->eps);
}

static void rmsnorm_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    const float *dout = dout_of(g, n);
    cuda_rmsnorm_backward(c, dt, T(0)->grad, T(1)->grad, dout, T(0)->data, T(1)->data, AUX(0),
                          rows(T(0)), cols(T(0)), g->scratch);
}

/* the node's Llama 3.1 frequency scaling (rope_factor 0: none) */
static struct tr_rope_scaling rope_scaling_of(const struct tr_node *n)
{
    struct tr_rope_scaling sc = {n->rope_factor, n->rope_low_freq_factor,
                                 n->rope_high_freq_factor, n->rope_original_ctx};
    return sc;
}

static void rope_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    struct tr_rope_scaling sc = rope_scaling_of(n);
    /* in a window of rows, row t is at position seq_from + t */
    cuda_rope_forward(c, dt, OUT->data, T(0)->data, (int)T(0)->shape[0], (int)T(0)->shape[1],
                      n->heads, rope_head(g, n), n->theta, &sc, g->scratch,
                      g->seq_to > 0 ? g->seq_from : 0);
}

static void rope_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    struct tr_rope_scaling sc = rope_scaling_of(n);
    cuda_rope_backward(c, T(0)->grad, dout, (int)T(0)->shape[0], (int)T(0)->shape[1],
                       n->heads, rope_head(g, n), n->theta, &sc, g->scratch);
}

static void swiglu_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_swiglu_forward(c, dt, OUT->data, T(0)->data, T(1)->data, OUT->numel);
}

static void swiglu_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    const float *dout = dout_of(g, n);
    cuda_swiglu_backward(c, dt, T(0)->grad, T(1)->grad, T(0)->data, T(1)->data, dout,
                         OUT->numel);
}

static void scale_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_scale_forward(c, dt, OUT->data, T(0)->data, n->scale, OUT->numel);
}

static void scale_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    cuda_scale_backward(c, T(0)->grad, dout, n->scale, OUT->numel);
}

/* dropout: the node's index salts its mask (backend.h); eval passes x through */
static void dropout_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    if (!g->training)
        cuda_scale_forward(c, dt, OUT->data, T(0)->data, 1.0f, OUT->numel);
    else
        cuda_dropout_forward(c, dt, OUT->data, T(0)->data, OUT->numel, n->p, g->dropout_seed,
                             (uint64_t)(n - g->nodes));
}

static void dropout_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    if (!g->training)
        cuda_scale_backward(c, T(0)->grad, dout, 1.0f, OUT->numel);
    else
        cuda_dropout_backward(c, T(0)->grad, dout, OUT->numel, n->p, g->dropout_seed,
                              (uint64_t)(n - g->nodes));
}

static void conv2d_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    struct conv_args a = conv_of(g, n);
    cuda_conv_forward(c, &a, g->scratch, g->scratch_floats);
}

static void conv2d_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    struct conv_args a = conv_of(g, n);
    cuda_conv_backward(c, &a, g->scratch, g->scratch_floats);
}

static void maxpool_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    struct pool_args p = pool_of(g, n);
    cuda_maxpool_forward(c, dt, OUT->data, T(0)->data, &p);
}

static void maxpool_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    const float *dout = dout_of(g, n);
    struct pool_args p = pool_of(g, n);
    cuda_maxpool_backward(c, dt, T(0)->grad, T(0)->data, dout, &p);
}

static void avgpool_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    struct pool_args p = pool_of(g, n);
    cuda_avgpool_forward(c, dt, OUT->data, T(0)->data, &p);
}

static void avgpool_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    struct pool_args p = pool_of(g, n);
    cuda_avgpool_backward(c, T(0)->grad, dout, &p);
}

static void global_avgpool_forward(struct cuda_context *c, struct tr_graph *g,
                                   const struct tr_node *n)
{
    int dt = storage(g, n);
    cuda_global_avgpool_forward(c, dt, OUT->data, T(0)->data, (int)T(0)->shape[0],
                                (int)(T(0)->shape[1] * T(0)->shape[2]), cols(T(0)));
}

static void global_avgpool_backward(struct cuda_context *c, struct tr_graph *g,
                                    const struct tr_node *n)
{
    const float *dout = dout_of(g, n);
    cuda_global_avgpool_backward(c, T(0)->grad, dout, (int)T(0)->shape[0],
                                 (int)(T(0)->shape[1] * T(0)->shape[2]), cols(T(0)));
}

static void batchnorm_forward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    /* training: batch statistics, and the running ones updated once per
     * step (not again when a recomputed segment re-runs forward) */
    cuda_batchnorm_forward(c, dt, OUT->data, AUX(0), AUX(1), running_of(g, n), T(0)->data,
                           T(1)->data, T(2)->data, rows(T(0)), cols(T(0)), n->eps,
                           n->momentum, g->training, g->training && !g->recomputing,
                           g->scratch);
}

static void batchnorm_backward(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n)
{
    int dt = storage(g, n);
    const float *dout = dout_of(g, n);
    cuda_batchnorm_backward(c, dt, T(0)->grad, T(1)->grad, T(2)->grad, dout, T(0)->data,
                            T(1)->data, AUX(0), AUX(1), rows(T(0)), cols(T(0)), g->training,
                            g->scratch);
}

/* ---- the per-op table, indexed by enum tr_op (built at compile time, so
 * each row names its op): forward, backward, scratch; an op without
 * functions is not run */
typedef void (*node_fn)(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n);
typedef size_t (*scratch_fn)(struct cuda_context *c, const struct tr_graph *g,
                             const struct tr_node *n);
struct cuda_op {
    node_fn forward, backward;
    scratch_fn scratch; /* NULL: none */
};
struct cuda_op_table {
    struct cuda_op op[TR_OP_COUNT];
};

static constexpr struct cuda_op_table build_ops()
{
    struct cuda_op_table t{};
    t.op[TR_OP_EMBEDDING] = {embedding_forward, embedding_backward, NULL};
    t.op[TR_OP_ADD_ROWS] = {add_rows_forward, add_rows_backward, NULL};
    t.op[TR_OP_ADD] = {add_forward, add_backward, NULL};
    t.op[TR_OP_LINEAR] = {gemm_forward, gemm_backward, gemm_scratch};
    t.op[TR_OP_MATMUL] = {gemm_forward, gemm_backward, gemm_scratch};
    t.op[TR_OP_LAYERNORM] = {layernorm_forward, layernorm_backward, layernorm_scratch};
    t.op[TR_OP_GELU] = {gelu_forward, gelu_backward, NULL};
    t.op[TR_OP_RELU] = {relu_forward, relu_backward, NULL};
    t.op[TR_OP_ATTENTION] = {attention_forward, attention_backward, attention_scratch};
    t.op[TR_OP_CROSS_ENTROPY] = {cross_entropy_forward, cross_entropy_backward,
                                 cross_entropy_scratch};
    t.op[TR_OP_RMSNORM] = {rmsnorm_forward, rmsnorm_backward, rmsnorm_scratch};
    t.op[TR_OP_ROPE] = {rope_forward, rope_backward, rope_scratch};
    t.op[TR_OP_SWIGLU] = {swiglu_forward, swiglu_backward, NULL};
    t.op[TR_OP_SCALE] = {scale_forward, scale_backward, NULL};
    t.op[TR_OP_DROPOUT] = {dropout_forward, dropout_backward, NULL};
    t.op[TR_OP_CONV2D] = {conv2d_forward, conv2d_backward, conv2d_scratch};
    t.op[TR_OP_MAXPOOL] = {maxpool_forward, maxpool_backward, NULL};
    t.op[TR_OP_AVGPOOL] = {avgpool_forward, avgpool_backward, NULL};
    t.op[TR_OP_GLOBAL_AVGPOOL] = {global_avgpool_forward, global_avgpool_backward, NULL};
    t.op[TR_OP_BATCHNORM] = {batchnorm_forward, batchnorm_backward, batchnorm_scratch};
    return t;
}
static constexpr struct cuda_op_table cuda_ops = build_ops();

static size_t node_scratch_floats(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    if ((unsigned)n->op >= TR_OP_COUNT || !cuda_ops.op[n->op].scratch)
        return 0;
    return cuda_ops.op[n->op].scratch((struct cuda_context *)ctx, g, n);
}

static void node_forward(void *ctx, struct tr_graph *g, const struct tr_node *n)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    c->allow_tf32 = g->allow_tf32; /* cuda_gemm's compute type */
    if ((unsigned)n->op < TR_OP_COUNT && cuda_ops.op[n->op].forward)
        cuda_ops.op[n->op].forward(c, g, n);
}

static void node_backward(void *ctx, struct tr_graph *g, const struct tr_node *n)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    c->allow_tf32 = g->allow_tf32;
    if ((unsigned)n->op < TR_OP_COUNT && cuda_ops.op[n->op].backward)
        cuda_ops.op[n->op].backward(c, g, n);
}

/* ---- 16-bit activation storage -----------------------------------------------
 * Under a 16-bit compute dtype the planner stores activations in it
 * (core/engine/graph_plan.c, plan_storage), beside fp32 parameters, gradients,
 * saved statistics and logits.  The kernels take one storage dtype per node,
 * so a node whose float tensors share one runs as it is (a GELU, an
 * attention, a residual add of bf16 activations: in bf16), and a node that
 * mixes them (a layer norm of a bf16 x with fp32 weights, a linear of a bf16
 * x and an fp32 weight) runs in fp32 on copies of its 16-bit tensors at the
 * start of scratch, the kernel's own scratch after them, and forward rounds
 * the fp32 output into its storage: the fp32 result rounded once, as the
 * CPU backend stores it. */

static int mixed_storage(const struct tr_graph *g, const struct tr_node *n)
{
    int dt = -1;
    for (int k = 0; k <= n->n_in; k++) {
        const struct tr_tensor *t = k == n->n_in ? OUT : T(k);
        if (t->dtype == TR_I32 || (k == 0 && frozen_table(g, n)))
            continue;
        int tdt = k == 1 && frozen_weight(g, n) ? DT_F32 : (int)t->dtype;
        if (dt < 0)
            dt = tdt;
        else if (dt != tdt)
            return 1;
    }
    return 0;
}

/* The 16-bit tensors of a mixed node that get fp32 copies, each once;
 * widen[i]: the copy starts as the stored values (not forward's output). */
struct fp32_copies {
    int n, tensor[4], widen[4];
};

static void fp32_copies(const struct tr_graph *g, const struct tr_node *n, int backward,
                        struct fp32_copies *cp)
{
    cp->n = 0;
    for (int k = 0; k <= n->n_in && k < 4; k++) {
        int out = k == n->n_in, id = out ? n->out : n->in[k];
        if (!is_half((int)g->tensors[id].dtype) || (!out && frozen_input(g, n, k)))
            continue;
        int seen = 0;
        for (int i = 0; i < cp->n; i++)
            seen |= cp->tensor[i] == id;
        if (seen)
            continue;
        cp->tensor[cp->n] = id;
        cp->widen[cp->n++] = !out || backward;
    }
}

/* Runs node n of g (forward, or backward), on fp32 copies where it mixes
 * storage dtypes.  scratch_of: the kernel's scratch is asked of the fp32
 * view too, so the view is set up for it as for a run. */
struct fp32_view {
    struct fp32_copies cp;
    void *data[4];
    int dtype[4];
    float *scratch;
    size_t scratch_floats;
};

static void view_enter(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n,
                       int backward, struct fp32_view *v)
{
    fp32_copies(g, n, backward, &v->cp);
    v->scratch = g->scratch;
    v->scratch_floats = g->scratch_floats;
    float *at = g->scratch;
    for (int i = 0; i < v->cp.n; i++) {
        struct tr_tensor *t = &g->tensors[v->cp.tensor[i]];
        v->data[i] = t->data;
        v->dtype[i] = (int)t->dtype;
        if (c && v->cp.widen[i])
            cuda_convert(c, at, DT_F32, t->data, (int)t->dtype, t->numel);
        t->data = at;
        t->dtype = TR_F32;
        at = at ? at + floats_for(t->numel, DT_F32) : NULL;
    }
    if (g->scratch) {
        g->scratch = at;
        g->scratch_floats -= (size_t)(at - v->scratch);
    }
}

static void view_leave(struct cuda_context *c, struct tr_graph *g, const struct tr_node *n,
                       int backward, struct fp32_view *v)
{
    g->scratch = v->scratch;
    g->scratch_floats = v->scratch_floats;
    for (int i = 0; i < v->cp.n; i++) {
        struct tr_tensor *t = &g->tensors[v->cp.tensor[i]];
        if (c && !backward && v->cp.tensor[i] == n->out)
            cuda_convert(c, v->data[i], v->dtype[i], t->data, DT_F32, t->numel);
        t->data = v->data[i];
        t->dtype = (enum tr_dtype)v->dtype[i];
    }
}

static size_t copies_floats(const struct tr_graph *g, const struct tr_node *n, int backward)
{
    struct fp32_copies cp;
    fp32_copies(g, n, backward, &cp);
    size_t floats = 0;
    for (int i = 0; i < cp.n; i++)
        floats += floats_for(g->tensors[cp.tensor[i]].numel, DT_F32);
    return floats;
}

size_t cuda_scratch_floats(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    if (!mixed_storage(g, n))
        return node_scratch_floats(ctx, g, n);
    size_t fwd = copies_floats(g, n, 0), bwd = copies_floats(g, n, 1);
    /* the kernel's own scratch, asked of the fp32 view it will run on (the
     * tensors' dtypes are switched and restored; nothing else is touched) */
    struct tr_graph *view = (struct tr_graph *)g;
    struct fp32_view v;
    view_enter(NULL, view, n, 1, &v);
    size_t own = node_scratch_floats(ctx, view, n);
    view_leave(NULL, view, n, 1, &v);
    return (fwd > bwd ? fwd : bwd) + own;
}

static void run_node(void *ctx, struct tr_graph *g, const struct tr_node *n, int backward)
{
    struct cuda_context *c = (struct cuda_context *)ctx;
    struct fp32_view v;
    int mixed = mixed_storage(g, n);
    if (mixed)
        view_enter(c, g, n, backward, &v);
    if (backward)
        node_backward(ctx, g, n);
    else
        node_forward(ctx, g, n);
    if (mixed)
        view_leave(c, g, n, backward, &v);
}

void cuda_forward(void *ctx, struct tr_graph *g, const struct tr_node *n) { run_node(ctx, g, n, 0); }

void cuda_backward(void *ctx, struct tr_graph *g, const struct tr_node *n) { run_node(ctx, g, n, 1); }

/* Every op the op table lets run in a window of rows (the core asks for
 * those alone): the kernels take shapes and pointers from the tensors at
 * each call (the core's views; the GEMMs' plans are kept by shape), and
 * rope and attention the window. */
int cuda_supports_rows(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx, (void)g, (void)n;
    return 1;
}

/* The ops the op table (kernels/ops.h) gives to cuda -- every op of the
 * vocabulary; the core checks the table's bit before asking here -- their
 * float tensors stored in fp32, bf16 or fp16 (the storage dtype is that of
 * the first input, see storage(); frozen weights as frozen_input says), with attention's head size up to
 * ATTENTION_MAX_HEAD: a larger one is refused when the run starts rather
 * than failing in its first step.  conv2d needs cuDNN (loaded at open) and
 * a shape it has a deterministic algorithm for. */
int cuda_supports_op(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    if ((unsigned)n->op >= TR_OP_COUNT)
        return 0;
    int dt = storage(g, n);
    if (dt != DT_F32 && !is_half(dt))
        return 0;
    /* a linear's addend is copied as its output's start: stored alike */
    if (tr_linear_addend(g, n) && (T(2)->dtype != OUT->dtype || (int)OUT->dtype != dt))
        return 0;
    /* frozen inputs: fp32 anywhere; a linear's weight also in 16 bits or
     * NF4 (2-D, whole blocks), an embedding's table in 16 bits */
    for (int k = 0; k < n->n_in; k++) {
        const struct tr_tensor *x = T(k);
        int xdt = (int)x->dtype;
        if (x->role != TR_ROLE_FROZEN || xdt == DT_F32)
            continue;
        if (!frozen_input(g, n, k))
            return 0;
        if (xdt == DT_NF4 ? !frozen_weight(g, n) || x->ndim != 2 || x->numel % TR_NF4_BLOCK != 0
                          : !is_half(xdt))
            return 0;
    }
    if (n->op == TR_OP_ATTENTION) {
        struct attention_args a = attention_of(g, n);
        return cuda_attention_head_ok(a.D) && a.KV > 0 && a.NH % a.KV == 0;
    }
    if (n->op == TR_OP_CONV2D) {
        /* cuDNN runs it, when it loaded and takes this shape; the core's
         * refusal names the op and the device, this says why */
        struct cuda_context *c = (struct cuda_context *)ctx;
        struct conv_args a = conv_of(g, n);
        const char *why = cuda_conv_check(c, &a);
        if (why && !c->dnn_refusal_said) {
            c->dnn_refusal_said = 1;
            fprintf(stderr, "trainrun: cuda: conv2d '%s' cannot run: %s\n", n->name, why);
        }
        return why == NULL;
    }
    return 1;
}
