/*
 * Every op on the CPU backend and on the CUDA backend, compared (after
 * ggml's test-backend-ops): random inputs (never zeros), each op's forward
 * outputs and saved tensors, then every gradient of its backward, which
 * accumulates into gradients prefilled with random values on both sides.
 * Each device buffer is surrounded by guard bytes of a known pattern,
 * checked afterwards, so a kernel writing out of bounds fails its case.
 * Then the tiny GPT of tests/fixtures and the tiny Llama of tests/config as
 * wholes: loss, every gradient and a few SGD steps.
 *
 * Storage dtypes: the CUDA kernels are templated on fp32, bf16 and fp16
 * storage, so the bf16/fp16 cases store the node's tensors in that dtype on
 * the GPU; the CPU computes the same op in fp32 from the same (rounded)
 * values, with its output rounded to the storage dtype before backward, as
 * storing it would.  Gradients are fp32 on both.
 *
 * `make check` runs it against tests/cudacpu's backend_cuda.so: the same
 * kernels compiled with g++ and run on the CPU (TR_CUDACPU_DIR names its
 * directory; there every case must run, none may skip).  Without that
 * variable, as contrib/gpu/validate.sh runs it, the build's own
 * backend_cuda.so runs on the GPU; without a GPU every GPU case is then
 * skipped with the reason, and the program exits 77 so `make check` would
 * list it as SKIP.  The harness's own checks (guards, accumulation) run on
 * the CPU backend in the `harness` tests.
 *
 * Covers: every op of kernels/backend.h on kernels/cpu/ against kernels/cuda/ (the
 * GPU's, or tests/cudacpu's stand-in), on graphs built by core/engine/graph.c and
 * model.c and stepped by optim.c; the cuda backend's convert against the CPU's bits,
 * and its discard and commit (kernels/cuda/backend.cu's virtual memory, through the
 * harness's emulation of the driver calls: suite backend_memory).
 */
#include <criterion/criterion.h>

#include "engine/backend.h"
#include "engine/graph.h"
#include "kernels.h"
#include "engine/model.h"
#include "engine/optim.h"
#include "config/plugin.h"
#include "config/run_config.h"
#include "util/safetensors.h"

#include <math.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <trainrun/mix.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_harness.h" /* the fixtures of the whole-model cases; compare.h */

#define GUARD 256 /* bytes of pattern before and after each buffer */

/* ---- opening the backends ---------------------------------------------- */

/* open_cuda, on_cudacpu and need_cuda: engine_harness.h */

/* ---- guarded device buffers ---------------------------------------------- */

static uint8_t guard_byte(size_t i) { return (uint8_t)(0xA5u ^ (i * 29u)); }

struct buffer {
    void *base; /* the allocation: GUARD bytes, the data, GUARD bytes */
    size_t bytes;
    const char *what;
};

struct arena {
    const struct tr_backend *be;
    struct buffer list[256];
    int n;
};

static void *arena_alloc(struct arena *a, size_t bytes, const char *what)
{
    const struct tr_backend_iface *f = a->be->iface;
    cr_assert_lt(a->n, 256);
    uint8_t *base = f->alloc(a->be->context, bytes + 2 * GUARD);
    cr_assert_not_null(base, "%s: cannot allocate %zu bytes on %s", what, bytes, f->name);
    uint8_t pattern[GUARD];
    for (size_t i = 0; i < GUARD; i++)
        pattern[i] = guard_byte(i);
    f->upload(a->be->context, base, pattern, GUARD);
    f->upload(a->be->context, base + GUARD + bytes, pattern, GUARD);
    a->list[a->n++] = (struct buffer){base, bytes, what};
    return base + GUARD;
}

static void arena_check(const struct arena *a, const char *label)
{
    const struct tr_backend_iface *f = a->be->iface;
    if (f->synchronize)
        f->synchronize(a->be->context);
    for (int k = 0; k < a->n; k++) {
        const struct buffer *b = &a->list[k];
        uint8_t head[GUARD], tail[GUARD];
        f->download(a->be->context, head, b->base, GUARD);
        f->download(a->be->context, tail, (uint8_t *)b->base + GUARD + b->bytes, GUARD);
        for (size_t i = 0; i < GUARD; i++) {
            cr_assert_eq(head[i], guard_byte(i), "%s on %s: %s: a write %zu bytes before its start",
                         label, f->name, b->what, GUARD - i);
            cr_assert_eq(tail[i], guard_byte(i), "%s on %s: %s: a write %zu bytes past its end",
                         label, f->name, b->what, i + 1);
        }
    }
}

static void arena_free(struct arena *a)
{
    for (int k = 0; k < a->n; k++)
        a->be->iface->free(a->be->context, a->list[k].base);
    a->n = 0;
}

/* ---- values ---------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    return tr_splitmix64_next(s);
}

/* uniform in +-[0.1, 1) * scale: random sign, never zero */
static float rng_value(uint64_t *s, float scale)
{
    uint64_t r = rng_next(s);
    float u = 0.1f + 0.9f * (float)((r >> 11) * 0x1.0p-53);
    return ((r & 1) ? -u : u) * scale;
}

static size_t dt_size(enum tr_dtype dt) { return (dt == TR_BF16 || dt == TR_F16) ? 2 : 4; }
static int is_half(enum tr_dtype dt) { return dt == TR_BF16 || dt == TR_F16; }
static const char *dt_name(enum tr_dtype dt)
{
    return dt == TR_BF16 ? "bf16" : dt == TR_F16 ? "fp16" : dt == TR_I32 ? "i32" : "fp32";
}

/* host fp32 values -> a device buffer of dtype dt */
static void upload_as(const struct tr_backend *be, void *dst, const float *src, size_t n,
                      enum tr_dtype dt)
{
    if (!is_half(dt)) {
        be->iface->upload(be->context, dst, src, n * sizeof(float));
        return;
    }
    uint16_t *tmp = malloc(n * sizeof *tmp + 1);
    tr_cpu_to_half(tmp, src, n, dt == TR_BF16);
    be->iface->upload(be->context, dst, tmp, n * sizeof *tmp);
    free(tmp);
}

static float *download_as_f32(const struct tr_backend *be, const void *src, size_t n,
                              enum tr_dtype dt)
{
    float *out = malloc(n * sizeof *out + 4);
    if (!is_half(dt)) {
        be->iface->download(be->context, out, src, n * sizeof(float));
        return out;
    }
    uint16_t *tmp = malloc(n * sizeof *tmp + 2);
    be->iface->download(be->context, tmp, src, n * sizeof *tmp);
    tr_cpu_from_half(out, tmp, n, dt == TR_BF16);
    free(tmp);
    return out;
}

static void expect_finite(const float *x, size_t n, const char *label, const char *what)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(isfinite(x[i]), "%s: %s[%zu] = %g on the GPU", label, what, i, (double)x[i]);
}

/* ---- one op, as a graph of one node ------------------------------------------ */

struct op_case {
    const char *name;
    /* adds the node's tensors and node to g (float tensors in dtype dt) */
    void (*build)(struct tr_graph *g, enum tr_dtype dt, const int *dims);
    int dims[16];
    enum tr_dtype storage; /* of the node's float tensors on the GPU */
    enum tr_dtype compute; /* g->compute on both */
    double tolerance;
};

static int64_t shape_buf[TR_MAX_DIMS];
static const int64_t *shape(int64_t a, int64_t b, int64_t c)
{
    shape_buf[0] = a;
    shape_buf[1] = b;
    shape_buf[2] = c;
    return shape_buf;
}

/* a scalar no node uses: tr_graph_check wants a loss */
static void dummy_loss(struct tr_graph *g)
{
    int64_t one = 1;
    g->loss = tr_graph_add_tensor(g, "unused_loss", TR_ROLE_INPUT, TR_F32, 1, &one);
}

static int param(struct tr_graph *g, const char *name, enum tr_dtype dt, int ndim, const int64_t *s)
{
    return tr_graph_add_tensor(g, name, TR_ROLE_PARAM, dt, ndim, s);
}

static int activation(struct tr_graph *g, enum tr_dtype dt, int ndim, const int64_t *s)
{
    return tr_graph_add_tensor(g, "out", TR_ROLE_ACTIVATION, dt, ndim, s);
}

static void add_node(struct tr_graph *g, struct tr_node n) { tr_graph_add_node(g, &n); }

static void build_embedding(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int B = d[0], T = d[1], V = d[2], C = d[3];
    int table = param(g, "table", dt, 2, shape(V, C, 0));
    int idx = tr_graph_add_tensor(g, "ids", TR_ROLE_INPUT, TR_I32, 2, shape(B, T, 0));
    int out = activation(g, dt, 3, shape(B, T, C));
    add_node(g, (struct tr_node){.op = TR_OP_EMBEDDING, .name = "embedding", .in = {table, idx},
                                 .n_in = 2, .out = out});
    dummy_loss(g);
}

static void build_add_rows(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int B = d[0], T = d[1], C = d[2];
    int x = param(g, "x", dt, 3, shape(B, T, C));
    int p = param(g, "positions", dt, 2, shape(T + 3, C, 0)); /* more rows than T */
    int out = activation(g, dt, 3, shape(B, T, C));
    add_node(g, (struct tr_node){.op = TR_OP_ADD_ROWS, .name = "add_rows", .in = {x, p},
                                 .n_in = 2, .out = out});
    dummy_loss(g);
}

static void build_add(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int a = param(g, "a", dt, 2, shape(d[0], d[1], 0));
    int b = d[2] ? a : param(g, "b", dt, 2, shape(d[0], d[1], 0)); /* d[2]: x + x */
    int out = activation(g, dt, 2, shape(d[0], d[1], 0));
    add_node(g, (struct tr_node){.op = TR_OP_ADD, .name = "add", .in = {a, b}, .n_in = 2,
                                 .out = out});
    dummy_loss(g);
}

static void build_unary(struct tr_graph *g, enum tr_dtype dt, const int *d, enum tr_op op)
{
    int x = param(g, "x", dt, 2, shape(d[0], d[1], 0));
    int out = activation(g, dt, 2, shape(d[0], d[1], 0));
    add_node(g, (struct tr_node){.op = op, .name = (char *)tr_op_name(op), .in = {x}, .n_in = 1, .out = out});
    dummy_loss(g);
}
static void build_gelu(struct tr_graph *g, enum tr_dtype dt, const int *d) { build_unary(g, dt, d, TR_OP_GELU); }
static void build_relu(struct tr_graph *g, enum tr_dtype dt, const int *d) { build_unary(g, dt, d, TR_OP_RELU); }

/* dims: B, T, IC, OC, bias (1: a bias [OC]; 2: an addend of the output's
 * shape, out = b + x w^T, ops.h's tr_linear_addend) */
static void build_linear(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 3, shape(d[0], d[1], d[2]));
    int w = param(g, "w", dt, 2, shape(d[3], d[2], 0));
    int b = d[4] == 2   ? param(g, "b", dt, 3, shape(d[0], d[1], d[3]))
            : d[4] == 1 ? param(g, "b", dt, 1, shape(d[3], 0, 0))
                        : -1;
    int out = activation(g, dt, 3, shape(d[0], d[1], d[3]));
    add_node(g, (struct tr_node){.op = TR_OP_LINEAR, .name = "linear", .in = {x, w, b},
                                 .n_in = d[4] ? 3 : 2, .out = out});
    dummy_loss(g);
}

/* dims: batch (0: 2-D), M, K, N, trans_b */
static void build_matmul(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int batch = d[0], M = d[1], K = d[2], N = d[3], tb = d[4];
    int a, b, out;
    if (batch) {
        a = param(g, "a", dt, 3, shape(batch, M, K));
        b = param(g, "b", dt, 3, tb ? shape(batch, N, K) : shape(batch, K, N));
        out = activation(g, dt, 3, shape(batch, M, N));
    } else {
        a = param(g, "a", dt, 2, shape(M, K, 0));
        b = param(g, "b", dt, 2, tb ? shape(N, K, 0) : shape(K, N, 0));
        out = activation(g, dt, 2, shape(M, N, 0));
    }
    add_node(g, (struct tr_node){.op = TR_OP_MATMUL, .name = "matmul", .in = {a, b}, .n_in = 2,
                                 .out = out, .trans_b = tb});
    dummy_loss(g);
}

static void build_layernorm(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 3, shape(d[0], d[1], d[2]));
    int w = param(g, "w", dt, 1, shape(d[2], 0, 0));
    int b = param(g, "b", dt, 1, shape(d[2], 0, 0));
    int out = activation(g, dt, 3, shape(d[0], d[1], d[2]));
    add_node(g, (struct tr_node){.op = TR_OP_LAYERNORM, .name = "layernorm", .in = {x, w, b},
                                 .n_in = 3, .out = out, .eps = 1e-5f});
    dummy_loss(g);
}

/* dims: B, T, C, heads */
static void build_attention(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int qkv = param(g, "qkv", dt, 3, shape(d[0], d[1], 3 * d[2]));
    int out = activation(g, dt, 3, shape(d[0], d[1], d[2]));
    add_node(g, (struct tr_node){.op = TR_OP_ATTENTION, .name = "attention", .in = {qkv},
                                 .n_in = 1, .out = out, .heads = d[3]});
    dummy_loss(g);
}

/* dims: B, T, heads, kv_heads, head size: separate q, k, v (grouped-query
 * attention; query head h reads key/value head h / (heads / kv_heads)) */
static void build_attention_gqa(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int B = d[0], T = d[1], H = d[2], KV = d[3], D = d[4];
    int q = param(g, "q", dt, 3, shape(B, T, H * D));
    int k = param(g, "k", dt, 3, shape(B, T, KV * D));
    int v = param(g, "v", dt, 3, shape(B, T, KV * D));
    int out = activation(g, dt, 3, shape(B, T, H * D));
    add_node(g, (struct tr_node){.op = TR_OP_ATTENTION, .name = "attention", .in = {q, k, v},
                                 .n_in = 3, .out = out, .heads = H, .kv_heads = KV});
    dummy_loss(g);
}

/* dims: B, T, C, eps in units of 1e-7 */
static void build_rmsnorm(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 3, shape(d[0], d[1], d[2]));
    int w = param(g, "w", dt, 1, shape(d[2], 0, 0));
    int out = activation(g, dt, 3, shape(d[0], d[1], d[2]));
    add_node(g, (struct tr_node){.op = TR_OP_RMSNORM, .name = "rmsnorm", .in = {x, w}, .n_in = 2,
                                 .out = out, .eps = (float)d[3] * 1e-7f});
    dummy_loss(g);
}

/* dims: B, T, heads, head size, theta */
static void build_rope(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 3, shape(d[0], d[1], d[2] * d[3]));
    int out = activation(g, dt, 3, shape(d[0], d[1], d[2] * d[3]));
    add_node(g, (struct tr_node){.op = TR_OP_ROPE, .name = "rope", .in = {x}, .n_in = 1,
                                 .out = out, .heads = d[2], .theta = (float)d[4]});
    dummy_loss(g);
}

/* dims: B, T, heads, head size, theta, original context: Llama 3.1's
 * scaling with factor 8, low 1, high 4 */
static void build_rope_llama3(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 3, shape(d[0], d[1], d[2] * d[3]));
    int out = activation(g, dt, 3, shape(d[0], d[1], d[2] * d[3]));
    add_node(g, (struct tr_node){.op = TR_OP_ROPE, .name = "rope", .in = {x}, .n_in = 1,
                                 .out = out, .heads = d[2], .theta = (float)d[4],
                                 .rope_factor = 8, .rope_low_freq_factor = 1,
                                 .rope_high_freq_factor = 4, .rope_original_ctx = d[5]});
    dummy_loss(g);
}

/* dims: rows, cols, same input twice */
static void build_swiglu(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int gate = param(g, "gate", dt, 2, shape(d[0], d[1], 0));
    int up = d[2] ? gate : param(g, "up", dt, 2, shape(d[0], d[1], 0));
    int out = activation(g, dt, 2, shape(d[0], d[1], 0));
    add_node(g, (struct tr_node){.op = TR_OP_SWIGLU, .name = "swiglu", .in = {gate, up},
                                 .n_in = 2, .out = out});
    dummy_loss(g);
}

/* dims: rows, cols, scale in thousandths */
static void build_scale(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 2, shape(d[0], d[1], 0));
    int out = activation(g, dt, 2, shape(d[0], d[1], 0));
    add_node(g, (struct tr_node){.op = TR_OP_SCALE, .name = "scale", .in = {x}, .n_in = 1,
                                 .out = out, .scale = (float)d[2] * 1e-3f});
    dummy_loss(g);
}

/* dims: rows, cols, p in thousandths; a seed of its own (training mode):
 * both backends must draw the same mask (backend.h's tr_dropout_hash) */
static void build_dropout(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 2, shape(d[0], d[1], 0));
    int out = activation(g, dt, 2, shape(d[0], d[1], 0));
    add_node(g, (struct tr_node){.op = TR_OP_DROPOUT, .name = "dropout", .in = {x}, .n_in = 1,
                                 .out = out, .p = (float)d[2] * 1e-3f});
    g->dropout_seed = 0x5eedULL * (uint64_t)d[2];
    dummy_loss(g);
}

/* dims: B, T, V */
static void build_cross_entropy(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int logits = param(g, "logits", dt, 3, shape(d[0], d[1], d[2]));
    int targets = tr_graph_add_tensor(g, "targets", TR_ROLE_INPUT, TR_I32, 2, shape(d[0], d[1], 0));
    int64_t one = 1;
    int loss = tr_graph_add_tensor(g, "loss", TR_ROLE_ACTIVATION, dt, 1, &one);
    add_node(g, (struct tr_node){.op = TR_OP_CROSS_ENTROPY, .name = "cross_entropy",
                                 .in = {logits, targets}, .n_in = 2, .out = loss,
                                 .ignore_index = -1});
    g->loss = loss;
}

/* ---- the convolutional ops (channel-last images x[B,H,W,C]) */

static const int64_t *shape4(int64_t a, int64_t b, int64_t c, int64_t d)
{
    shape_buf[0] = a;
    shape_buf[1] = b;
    shape_buf[2] = c;
    shape_buf[3] = d;
    return shape_buf;
}

static int out_size(int in, int k, int stride, int pad, int dilation)
{
    return (in + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
}

/* dims: B, H, W, IC, OC, KH, KW, SH, SW, PH, PW, DH, DW, groups, bias, x an input (no gradient) */
static void build_conv2d(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int B = d[0], H = d[1], W = d[2], IC = d[3], OC = d[4], KH = d[5], KW = d[6];
    int OH = out_size(H, KH, d[7], d[9], d[11]), OW = out_size(W, KW, d[8], d[10], d[12]);
    int x = d[15] ? tr_graph_add_tensor(g, "x", TR_ROLE_INPUT, dt, 4, shape4(B, H, W, IC))
                  : param(g, "x", dt, 4, shape4(B, H, W, IC));
    int w = param(g, "w", dt, 4, shape4(OC, KH, KW, IC / d[13]));
    int b = d[14] ? param(g, "b", dt, 1, shape(OC, 0, 0)) : -1;
    int out = activation(g, dt, 4, shape4(B, OH, OW, OC));
    add_node(g, (struct tr_node){.op = TR_OP_CONV2D, .name = "conv2d", .in = {x, w, b},
                                 .n_in = d[14] ? 3 : 2, .out = out, .stride = {d[7], d[8]},
                                 .pad = {d[9], d[10]}, .dilation = {d[11], d[12]},
                                 .groups = d[13]});
    dummy_loss(g);
}

/* dims: B, H, W, C, KH, KW, SH, SW, PH, PW */
static void build_pool(struct tr_graph *g, enum tr_dtype dt, const int *d, enum tr_op op)
{
    int B = d[0], H = d[1], W = d[2], C = d[3];
    int OH = out_size(H, d[4], d[6], d[8], 1), OW = out_size(W, d[5], d[7], d[9], 1);
    int x = param(g, "x", dt, 4, shape4(B, H, W, C));
    int out = activation(g, dt, 4, shape4(B, OH, OW, C));
    add_node(g, (struct tr_node){.op = op, .name = (char *)tr_op_name(op), .in = {x}, .n_in = 1,
                                 .out = out, .kernel = {d[4], d[5]}, .stride = {d[6], d[7]},
                                 .pad = {d[8], d[9]}, .dilation = {1, 1}, .groups = 1});
    dummy_loss(g);
}
static void build_maxpool(struct tr_graph *g, enum tr_dtype dt, const int *d) { build_pool(g, dt, d, TR_OP_MAXPOOL); }
static void build_avgpool(struct tr_graph *g, enum tr_dtype dt, const int *d) { build_pool(g, dt, d, TR_OP_AVGPOOL); }

/* dims: B, H, W, C */
static void build_global_avgpool(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 4, shape4(d[0], d[1], d[2], d[3]));
    int out = activation(g, dt, 2, shape(d[0], d[3], 0));
    add_node(g, (struct tr_node){.op = TR_OP_GLOBAL_AVGPOOL, .name = "global_avgpool",
                                 .in = {x}, .n_in = 1, .out = out});
    dummy_loss(g);
}

/* dims: B, H, W, C, eval (normalise with the running statistics),
 * recomputing (a recomputed forward: the running statistics stay) */
static void build_batchnorm(struct tr_graph *g, enum tr_dtype dt, const int *d)
{
    int x = param(g, "x", dt, 4, shape4(d[0], d[1], d[2], d[3]));
    int w = param(g, "w", dt, 1, shape(d[3], 0, 0));
    int b = param(g, "b", dt, 1, shape(d[3], 0, 0));
    int running = tr_graph_add_tensor(g, "running", TR_ROLE_BUFFER, TR_F32, 2, shape(2, d[3], 0));
    int out = activation(g, dt, 4, shape4(d[0], d[1], d[2], d[3]));
    add_node(g, (struct tr_node){.op = TR_OP_BATCHNORM, .name = "batchnorm", .in = {x, w, b},
                                 .n_in = 3, .out = out, .eps = 1e-5f, .momentum = 0.1f,
                                 .buffer = running});
    g->training = !d[4];
    g->recomputing = d[5];
    dummy_loss(g);
}

/* One side of a case: the graph, its buffers, on one backend. */
struct side {
    const struct tr_backend *be;
    struct tr_graph *g;
    struct arena arena;
};

static void side_build(struct side *s, const struct op_case *oc, enum tr_dtype dt)
{
    s->g = tr_graph_new(1);
    oc->build(s->g, dt, oc->dims);
    s->g->compute = oc->compute;
    tr_err err = {{0}};
    cr_assert_eq(tr_graph_check(s->g, &err), TR_OK, "%s: %s", oc->name, err.msg);
    s->arena.be = s->be;
    s->arena.n = 0;
    struct tr_graph *g = s->g;
    const struct tr_node *n = &g->nodes[0];
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        t->data = arena_alloc(&s->arena, t->numel * dt_size(t->dtype), t->name);
        int feeds_node = 0;
        for (int k = 0; k < n->n_in; k++)
            feeds_node |= n->in[k] == i;
        int wants_grad = t->dtype != TR_I32 && ((feeds_node && t->role == TR_ROLE_PARAM) ||
                                                (i == n->out && i != g->loss));
        if (wants_grad)
            t->grad = arena_alloc(&s->arena, t->numel * sizeof(float), "gradient");
    }
    size_t floats = s->be->iface->scratch_floats(s->be->context, g, n);
    g->scratch_floats = floats;
    g->scratch = floats ? arena_alloc(&s->arena, floats * sizeof(float), "scratch") : NULL;
}

static void side_free(struct side *s)
{
    arena_free(&s->arena);
    for (int i = 0; i < s->g->n_tensors; i++)
        s->g->tensors[i].data = s->g->tensors[i].grad = NULL;
    s->g->scratch = NULL;
    tr_graph_free(s->g, NULL);
}

/* Random inputs and prefilled gradients, the same values on both sides
 * (rounded to the GPU's storage dtype). */
static void fill(struct side *cpu, struct side *gpu, const struct op_case *oc, uint64_t seed)
{
    struct tr_graph *gc = cpu->g, *gg = gpu->g;
    const struct tr_node *n = &gc->nodes[0];
    for (int i = 0; i < gc->n_tensors; i++) {
        struct tr_tensor *tc = &gc->tensors[i], *tg = &gg->tensors[i];
        if (tc->role == TR_ROLE_SAVED || i == n->out || i == gc->loss)
            continue;
        if (tc->dtype == TR_I32) {
            /* ids or targets: in range, repeated, a few targets ignored */
            const struct tr_tensor *table = &gc->tensors[n->in[0]];
            int V = n->op == TR_OP_EMBEDDING ? (int)table->shape[0]
                                             : (int)table->shape[table->ndim - 1];
            int32_t *ids = malloc(tc->numel * sizeof *ids);
            for (size_t j = 0; j < tc->numel; j++) {
                ids[j] = (int32_t)(rng_next(&seed) % (uint64_t)V);
                if (n->op == TR_OP_CROSS_ENTROPY && j % 5 == 3)
                    ids[j] = n->ignore_index;
            }
            cpu->be->iface->upload(cpu->be->context, tc->data, ids, tc->numel * sizeof *ids);
            gpu->be->iface->upload(gpu->be->context, tg->data, ids, tc->numel * sizeof *ids);
            free(ids);
            continue;
        }
        float *v = malloc(tc->numel * sizeof *v);
        /* logits and gates wide enough to saturate softmax and sigmoid */
        float scale = n->op == TR_OP_CROSS_ENTROPY || n->op == TR_OP_SWIGLU ? 4.0f
                      : n->op == TR_OP_ATTENTION                         ? 2.0f
                                                                         : 1.0f;
        for (size_t j = 0; j < tc->numel; j++)
            v[j] = rng_value(&seed, scale);
        if (tc->role == TR_ROLE_BUFFER) /* running statistics: the variances positive */
            for (size_t j = 0; j < tc->numel; j++)
                v[j] = 0.25f + fabsf(v[j]);
        if (is_half(oc->storage))
            tr_cpu_round_to_half(v, v, tc->numel, oc->storage == TR_BF16);
        upload_as(cpu->be, tc->data, v, tc->numel, TR_F32);
        upload_as(gpu->be, tg->data, v, tc->numel, tg->dtype);
        free(v);
    }
    for (int i = 0; i < gc->n_tensors; i++) { /* gradients, dout included */
        struct tr_tensor *tc = &gc->tensors[i], *tg = &gg->tensors[i];
        if (!tc->grad)
            continue;
        float *v = malloc(tc->numel * sizeof *v);
        for (size_t j = 0; j < tc->numel; j++)
            v[j] = rng_value(&seed, 1.0f);
        upload_as(cpu->be, tc->grad, v, tc->numel, TR_F32);
        upload_as(gpu->be, tg->grad, v, tc->numel, TR_F32);
        free(v);
    }
    gc->loss_grad = gg->loss_grad = 0.75f;
}

static void compare(const char *label, const char *what, const struct tr_backend *cpu_be,
                    const void *cpu_data, enum tr_dtype cpu_dt, const struct tr_backend *gpu_be,
                    const void *gpu_data, enum tr_dtype gpu_dt, size_t n, double tolerance)
{
    float *want = download_as_f32(cpu_be, cpu_data, n, cpu_dt);
    float *got = download_as_f32(gpu_be, gpu_data, n, gpu_dt);
    expect_finite(got, n, label, what);
    double error = tensor_error(got, want, n);
    free(want);
    free(got);
    /* every error in the log, so a GPU run (contrib/gpu/validate.sh) shows
     * the margins, not only the failures */
    cr_log_info("%s: %s: relative error %.3g (tolerance %.3g)", label, what, error, tolerance);
    cr_assert_leq(error, tolerance, "%s: %s differs from the CPU: relative error %.3g > %.3g",
                  label, what, error, tolerance);
}

static void run_case(const struct op_case *oc)
{
    struct tr_backend cuda, cpu_be;
    need_cuda(&cuda);
    cr_assert_eq(tr_cpu_backend_init(&cpu_be, 0), 0);
    char label[128];
    snprintf(label, sizeof label, "%s (%s storage, %s GEMM inputs)", oc->name,
             dt_name(oc->storage), dt_name(oc->compute));
    struct side cpu = {.be = &cpu_be}, gpu = {.be = &cuda};
    side_build(&cpu, oc, TR_F32);
    side_build(&gpu, oc, oc->storage);
    fill(&cpu, &gpu, oc, 0x5eed0000u + (uint64_t)strlen(oc->name) * 7919u);
    struct tr_graph *gc = cpu.g, *gg = gpu.g;
    const struct tr_node *nc = &gc->nodes[0], *ng = &gg->nodes[0];

    /* buffers a forward must leave alone: in eval and when recomputing */
    float *kept[TR_MAX_DIMS] = {NULL};
    int n_kept = 0;
    for (int i = 0; i < gg->n_tensors && n_kept < TR_MAX_DIMS; i++)
        if (gg->tensors[i].role == TR_ROLE_BUFFER && (!gg->training || gg->recomputing))
            kept[n_kept++] = download_as_f32(&cuda, gg->tensors[i].data, gg->tensors[i].numel,
                                             TR_F32);
    cpu_be.iface->forward(cpu_be.context, gc, nc);
    cuda.iface->forward(cuda.context, gg, ng);
    for (int i = 0, k = 0; i < gg->n_tensors && k < n_kept; i++)
        if (gg->tensors[i].role == TR_ROLE_BUFFER) {
            float *now = download_as_f32(&cuda, gg->tensors[i].data, gg->tensors[i].numel, TR_F32);
            cr_assert(memcmp(now, kept[k], gg->tensors[i].numel * sizeof(float)) == 0,
                      "%s: forward %s changed buffer '%s' on the GPU", label,
                      gg->recomputing ? "while recomputing" : "in eval", gg->tensors[i].name);
            free(now);
            free(kept[k++]);
        }
    const struct tr_tensor *oc_out = &gc->tensors[nc->out], *og_out = &gg->tensors[ng->out];
    compare(label, "forward output", &cpu_be, oc_out->data, TR_F32, &cuda, og_out->data,
            og_out->dtype, oc_out->numel, oc->tolerance);
    for (int k = 0; k < nc->n_aux; k++) {
        const struct tr_tensor *ac = &gc->tensors[nc->aux[k]], *ag = &gg->tensors[ng->aux[k]];
        compare(label, ac->name, &cpu_be, ac->data, TR_F32, &cuda, ag->data, TR_F32, ac->numel,
                oc->tolerance);
    }
    for (int i = 0; i < gc->n_tensors; i++) /* state the node updates (batch norm's running) */
        if (gc->tensors[i].role == TR_ROLE_BUFFER)
            compare(label, gc->tensors[i].name, &cpu_be, gc->tensors[i].data, TR_F32, &cuda,
                    gg->tensors[i].data, TR_F32, gc->tensors[i].numel, oc->tolerance);
    arena_check(&cpu.arena, label);
    arena_check(&gpu.arena, label);

    /* what storing the output in the storage dtype does, on the CPU side */
    if (is_half(oc->storage) && nc->out != gc->loss)
        tr_cpu_round_to_half(oc_out->data, oc_out->data, oc_out->numel, oc->storage == TR_BF16);
    cpu_be.iface->backward(cpu_be.context, gc, nc);
    cuda.iface->backward(cuda.context, gg, ng);
    for (int k = 0; k < nc->n_in; k++) {
        const struct tr_tensor *tc = &gc->tensors[nc->in[k]], *tg = &gg->tensors[ng->in[k]];
        if (!tc->grad || (k > 0 && nc->in[k] == nc->in[k - 1]))
            continue;
        char what[96];
        snprintf(what, sizeof what, "gradient of %s", tc->name);
        compare(label, what, &cpu_be, tc->grad, TR_F32, &cuda, tg->grad, TR_F32, tc->numel,
                oc->tolerance);
    }
    arena_check(&cpu.arena, label);
    arena_check(&gpu.arena, label);
    side_free(&cpu);
    side_free(&gpu);
    tr_cpu_backend_free(&cpu_be);
    tr_backend_close(&cuda);
}

/* fp32: the backends differ by summation order; 16-bit storage: by one
 * rounding of the output (relative to the tensor's largest element) */
#define TOL_F32 2e-4
#define TOL_BF16 1.6e-2
#define TOL_F16 3e-3
#define TOL_HALF_GEMM 1e-3 /* fp32 storage, 16-bit GEMM inputs: the same products */

/* name, builder, GPU storage dtype, GEMM input dtype, tolerance, dims... */
#define OP_CASES(X) \
    /* dims: B, T, V, C */ \
    X(embedding_f32, build_embedding, TR_F32, TR_F32, TOL_F32, 3, 7, 11, 24) \
    X(embedding_bf16, build_embedding, TR_BF16, TR_F32, TOL_BF16, 3, 7, 11, 24) \
    X(embedding_f16, build_embedding, TR_F16, TR_F32, TOL_F16, 3, 7, 11, 24) \
    /* dims: B, T, C */ \
    X(add_rows_f32, build_add_rows, TR_F32, TR_F32, TOL_F32, 3, 5, 24) \
    X(add_rows_bf16, build_add_rows, TR_BF16, TR_F32, TOL_BF16, 3, 5, 24) \
    X(add_rows_f16, build_add_rows, TR_F16, TR_F32, TOL_F16, 3, 5, 25) \
    /* dims: rows, cols, same input twice */ \
    X(add_f32, build_add, TR_F32, TR_F32, TOL_F32, 4, 37, 0) \
    X(add_same_input_f32, build_add, TR_F32, TR_F32, TOL_F32, 4, 37, 1) \
    X(add_bf16, build_add, TR_BF16, TR_F32, TOL_BF16, 4, 37, 0) \
    X(add_f16, build_add, TR_F16, TR_F32, TOL_F16, 3, 37, 0) \
    /* dims: rows, cols */ \
    X(gelu_f32, build_gelu, TR_F32, TR_F32, TOL_F32, 13, 77) \
    X(gelu_bf16, build_gelu, TR_BF16, TR_F32, TOL_BF16, 13, 77) \
    X(gelu_f16, build_gelu, TR_F16, TR_F32, TOL_F16, 13, 77) \
    X(relu_f32, build_relu, TR_F32, TR_F32, TOL_F32, 13, 77) \
    X(relu_bf16, build_relu, TR_BF16, TR_F32, TOL_BF16, 13, 77) \
    X(relu_f16, build_relu, TR_F16, TR_F32, TOL_F16, 13, 77) \
    /* dims: B, T, IC, OC, bias */ \
    X(linear_f32, build_linear, TR_F32, TR_F32, TOL_F32, 2, 9, 40, 24, 1) \
    X(linear_no_bias_f32, build_linear, TR_F32, TR_F32, TOL_F32, 2, 9, 40, 24, 0) \
    X(linear_odd_sizes_f32, build_linear, TR_F32, TR_F32, TOL_F32, 3, 5, 33, 17, 1) \
    X(linear_bf16_inputs, build_linear, TR_F32, TR_BF16, TOL_HALF_GEMM, 2, 9, 40, 24, 1) \
    X(linear_f16_inputs, build_linear, TR_F32, TR_F16, TOL_HALF_GEMM, 2, 9, 40, 24, 1) \
    X(linear_bf16, build_linear, TR_BF16, TR_BF16, TOL_BF16, 2, 9, 40, 24, 1) \
    X(linear_f16, build_linear, TR_F16, TR_F16, TOL_F16, 2, 9, 40, 24, 1) \
    X(linear_addend_f32, build_linear, TR_F32, TR_F32, TOL_F32, 2, 9, 40, 24, 2) \
    X(linear_addend_odd_sizes_f32, build_linear, TR_F32, TR_F32, TOL_F32, 3, 5, 33, 17, 2) \
    X(linear_addend_bf16_inputs, build_linear, TR_F32, TR_BF16, TOL_HALF_GEMM, 2, 9, 40, 24, 2) \
    X(linear_addend_bf16, build_linear, TR_BF16, TR_BF16, TOL_BF16, 2, 9, 40, 24, 2) \
    X(linear_addend_f16, build_linear, TR_F16, TR_F16, TOL_F16, 2, 9, 40, 24, 2) \
    /* dims: batch (0: 2-D), M, K, N, trans_b */ \
    X(matmul_batched_f32, build_matmul, TR_F32, TR_F32, TOL_F32, 3, 7, 16, 9, 0) \
    X(matmul_batched_trans_b_f32, build_matmul, TR_F32, TR_F32, TOL_F32, 3, 7, 16, 9, 1) \
    X(matmul_2d_f32, build_matmul, TR_F32, TR_F32, TOL_F32, 0, 7, 16, 9, 0) \
    X(matmul_2d_trans_b_odd_f32, build_matmul, TR_F32, TR_F32, TOL_F32, 0, 5, 13, 11, 1) \
    X(matmul_bf16_inputs, build_matmul, TR_F32, TR_BF16, TOL_HALF_GEMM, 3, 7, 16, 9, 1) \
    X(matmul_bf16, build_matmul, TR_BF16, TR_BF16, TOL_BF16, 3, 8, 16, 8, 0) \
    X(matmul_f16, build_matmul, TR_F16, TR_F16, TOL_F16, 3, 8, 16, 8, 1) \
    /* dims: B, T, C */ \
    X(layernorm_f32, build_layernorm, TR_F32, TR_F32, TOL_F32, 2, 11, 48) \
    X(layernorm_wide_f32, build_layernorm, TR_F32, TR_F32, TOL_F32, 3, 100, 200) \
    X(layernorm_bf16, build_layernorm, TR_BF16, TR_F32, TOL_BF16, 2, 11, 48) \
    X(layernorm_f16, build_layernorm, TR_F16, TR_F32, TOL_F16, 2, 11, 48) \
    /* dims: B, T, C, heads (head sizes 16, 64, 80, 128, 256; T not a tile multiple) */ \
    X(attention_head16_f32, build_attention, TR_F32, TR_F32, TOL_F32, 2, 37, 48, 3) \
    X(attention_head64_f32, build_attention, TR_F32, TR_F32, TOL_F32, 2, 70, 128, 2) \
    X(attention_head80_f32, build_attention, TR_F32, TR_F32, TOL_F32, 1, 45, 160, 2) \
    X(attention_head128_f32, build_attention, TR_F32, TR_F32, TOL_F32, 1, 33, 256, 2) \
    X(attention_head256_f32, build_attention, TR_F32, TR_F32, TOL_F32, 1, 20, 256, 1) \
    X(attention_one_token_f32, build_attention, TR_F32, TR_F32, TOL_F32, 3, 1, 32, 2) \
    X(attention_bf16, build_attention, TR_BF16, TR_F32, TOL_BF16, 2, 37, 64, 2) \
    X(attention_f16, build_attention, TR_F16, TR_F32, TOL_F16, 2, 37, 64, 2) \
    /* dims: B, T, heads, kv_heads, head size (heads / kv_heads = 1, 2, 4, 8; T not a \
     * multiple of the 16-row blocks or the 32-key tiles) */ \
    X(attention_gqa_group1_f32, build_attention_gqa, TR_F32, TR_F32, TOL_F32, 2, 37, 3, 3, 16) \
    X(attention_gqa_group2_f32, build_attention_gqa, TR_F32, TR_F32, TOL_F32, 2, 45, 4, 2, 32) \
    X(attention_gqa_group4_f32, build_attention_gqa, TR_F32, TR_F32, TOL_F32, 1, 70, 8, 2, 64) \
    X(attention_gqa_group4_head128_f32, build_attention_gqa, TR_F32, TR_F32, TOL_F32, 1, 33, 4, 1, \
      128) \
    X(attention_gqa_multi_query_f32, build_attention_gqa, TR_F32, TR_F32, TOL_F32, 2, 20, 8, 1, 24) \
    X(attention_gqa_head80_f32, build_attention_gqa, TR_F32, TR_F32, TOL_F32, 1, 40, 6, 3, 80) \
    X(attention_gqa_one_token_f32, build_attention_gqa, TR_F32, TR_F32, TOL_F32, 3, 1, 4, 2, 32) \
    X(attention_gqa_bf16, build_attention_gqa, TR_BF16, TR_F32, TOL_BF16, 2, 37, 4, 2, 32) \
    X(attention_gqa_f16, build_attention_gqa, TR_F16, TR_F32, TOL_F16, 2, 37, 8, 2, 32) \
    /* dims: B, T, C, eps in 1e-7 */ \
    X(rmsnorm_f32, build_rmsnorm, TR_F32, TR_F32, TOL_F32, 2, 11, 48, 100) \
    X(rmsnorm_wide_f32, build_rmsnorm, TR_F32, TR_F32, TOL_F32, 3, 100, 200, 10) \
    X(rmsnorm_bf16, build_rmsnorm, TR_BF16, TR_F32, TOL_BF16, 2, 11, 48, 100) \
    X(rmsnorm_f16, build_rmsnorm, TR_F16, TR_F32, TOL_F16, 2, 11, 50, 100) \
    /* dims: B, T, heads, head size, theta */ \
    X(rope_f32, build_rope, TR_F32, TR_F32, TOL_F32, 2, 37, 3, 16, 10000) \
    X(rope_head128_theta500k_f32, build_rope, TR_F32, TR_F32, TOL_F32, 1, 300, 2, 128, 500000) \
    X(rope_head2_f32, build_rope, TR_F32, TR_F32, TOL_F32, 2, 9, 5, 2, 10000) \
    X(rope_bf16, build_rope, TR_BF16, TR_F32, TOL_BF16, 2, 37, 4, 32, 10000) \
    X(rope_f16, build_rope, TR_F16, TR_F32, TOL_F16, 2, 37, 2, 64, 1000000) \
    X(rope_llama3_f32, build_rope_llama3, TR_F32, TR_F32, TOL_F32, 2, 37, 3, 16, 500000, 8) \
    X(rope_llama3_bf16, build_rope_llama3, TR_BF16, TR_F32, TOL_BF16, 2, 37, 4, 32, 10000, 16) \
    /* dims: rows, cols, same input twice */ \
    X(swiglu_f32, build_swiglu, TR_F32, TR_F32, TOL_F32, 13, 77, 0) \
    X(swiglu_same_input_f32, build_swiglu, TR_F32, TR_F32, TOL_F32, 4, 37, 1) \
    X(swiglu_bf16, build_swiglu, TR_BF16, TR_F32, TOL_BF16, 13, 77, 0) \
    X(swiglu_f16, build_swiglu, TR_F16, TR_F32, TOL_F16, 13, 77, 0) \
    /* dims: rows, cols, scale in thousandths (sqrt(2048), as Gemma scales its embedding) */ \
    X(scale_f32, build_scale, TR_F32, TR_F32, TOL_F32, 13, 77, 45255) \
    X(scale_negative_f32, build_scale, TR_F32, TR_F32, TOL_F32, 5, 33, -125) \
    X(scale_bf16, build_scale, TR_BF16, TR_F32, TOL_BF16, 13, 77, 45255) \
    X(scale_f16, build_scale, TR_F16, TR_F32, TOL_F16, 13, 77, 45255) \
    X(dropout_f32, build_dropout, TR_F32, TR_F32, TOL_F32, 13, 77, 100) \
    X(dropout_half_f32, build_dropout, TR_F32, TR_F32, TOL_F32, 7, 64, 500) \
    X(dropout_bf16, build_dropout, TR_BF16, TR_F32, TOL_BF16, 13, 77, 100) \
    X(dropout_f16, build_dropout, TR_F16, TR_F32, TOL_F16, 13, 77, 100) \
    /* dims: B, T, V */ \
    X(cross_entropy_f32, build_cross_entropy, TR_F32, TR_F32, TOL_F32, 2, 13, 67) \
    X(cross_entropy_wide_f32, build_cross_entropy, TR_F32, TR_F32, TOL_F32, 2, 5, 5000) \
    X(cross_entropy_bf16, build_cross_entropy, TR_BF16, TR_F32, TOL_BF16, 2, 13, 67) \
    X(cross_entropy_f16, build_cross_entropy, TR_F16, TR_F32, TOL_F16, 2, 13, 67) \
    /* dims: B, H, W, IC, OC, KH, KW, SH, SW, PH, PW, DH, DW, groups, bias, x an input \
     * (conv2d runs on cuDNN: tests/cudacpu/cudnn.cpp through the harness) */ \
    X(conv2d_3x3_f32, build_conv2d, TR_F32, TR_F32, TOL_F32, 2, 9, 7, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, \
      1, 1, 0) \
    X(conv2d_strided_asymmetric_f32, build_conv2d, TR_F32, TR_F32, TOL_F32, 2, 10, 8, 4, 6, 3, 2, \
      2, 1, 1, 0, 1, 1, 1, 0, 0) \
    X(conv2d_dilated_f32, build_conv2d, TR_F32, TR_F32, TOL_F32, 1, 11, 9, 3, 4, 3, 3, 1, 1, 2, 1, \
      2, 1, 1, 1, 0) \
    X(conv2d_grouped_f32, build_conv2d, TR_F32, TR_F32, TOL_F32, 2, 6, 6, 8, 12, 3, 3, 1, 1, 1, 1, \
      1, 1, 4, 1, 0) \
    X(conv2d_depthwise_f32, build_conv2d, TR_F32, TR_F32, TOL_F32, 2, 7, 7, 6, 6, 3, 3, 2, 2, 1, 1, \
      1, 1, 6, 1, 0) \
    X(conv2d_1x1_input_f32, build_conv2d, TR_F32, TR_F32, TOL_F32, 2, 5, 5, 16, 8, 1, 1, 1, 1, 0, 0, \
      1, 1, 1, 0, 1) \
    X(conv2d_bf16_inputs, build_conv2d, TR_F32, TR_BF16, TOL_HALF_GEMM, 2, 9, 7, 5, 6, 3, 3, 1, 1, \
      1, 1, 1, 1, 1, 1, 0) \
    X(conv2d_f16_inputs, build_conv2d, TR_F32, TR_F16, TOL_HALF_GEMM, 2, 9, 7, 5, 6, 3, 3, 1, 1, 1, \
      1, 1, 1, 1, 1, 0) \
    X(conv2d_bf16, build_conv2d, TR_BF16, TR_BF16, TOL_BF16, 2, 9, 7, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, \
      2, 1, 0) \
    X(conv2d_f16, build_conv2d, TR_F16, TR_F16, TOL_F16, 2, 9, 7, 5, 6, 3, 3, 2, 1, 1, 1, 1, 1, 1, \
      1, 0) \
    /* dims: B, H, W, C, KH, KW, SH, SW, PH, PW */ \
    X(maxpool_2x2_f32, build_maxpool, TR_F32, TR_F32, TOL_F32, 2, 8, 6, 5, 2, 2, 2, 2, 0, 0) \
    X(maxpool_3x3_overlapping_f32, build_maxpool, TR_F32, TR_F32, TOL_F32, 2, 9, 7, 4, 3, 3, 2, 2, \
      1, 1) \
    X(maxpool_asymmetric_f32, build_maxpool, TR_F32, TR_F32, TOL_F32, 1, 7, 8, 3, 3, 2, 1, 2, 1, 0) \
    X(maxpool_bf16, build_maxpool, TR_BF16, TR_F32, TOL_BF16, 2, 9, 7, 4, 3, 3, 2, 2, 1, 1) \
    X(maxpool_f16, build_maxpool, TR_F16, TR_F32, TOL_F16, 2, 9, 7, 4, 3, 3, 2, 2, 1, 1) \
    X(avgpool_2x2_f32, build_avgpool, TR_F32, TR_F32, TOL_F32, 2, 8, 6, 5, 2, 2, 2, 2, 0, 0) \
    X(avgpool_3x3_padded_f32, build_avgpool, TR_F32, TR_F32, TOL_F32, 2, 9, 7, 4, 3, 3, 2, 2, 1, 1) \
    X(avgpool_asymmetric_f32, build_avgpool, TR_F32, TR_F32, TOL_F32, 1, 7, 8, 3, 3, 2, 1, 2, 1, 0) \
    X(avgpool_bf16, build_avgpool, TR_BF16, TR_F32, TOL_BF16, 2, 9, 7, 4, 3, 3, 2, 2, 1, 1) \
    X(avgpool_f16, build_avgpool, TR_F16, TR_F32, TOL_F16, 2, 9, 7, 4, 3, 3, 2, 2, 1, 1) \
    /* dims: B, H, W, C */ \
    X(global_avgpool_f32, build_global_avgpool, TR_F32, TR_F32, TOL_F32, 3, 5, 7, 9) \
    X(global_avgpool_bf16, build_global_avgpool, TR_BF16, TR_F32, TOL_BF16, 3, 5, 7, 9) \
    X(global_avgpool_f16, build_global_avgpool, TR_F16, TR_F32, TOL_F16, 3, 5, 7, 9) \
    /* dims: B, H, W, C, eval, recomputing */ \
    X(batchnorm_train_f32, build_batchnorm, TR_F32, TR_F32, TOL_F32, 2, 5, 3, 7, 0, 0) \
    X(batchnorm_train_many_rows_f32, build_batchnorm, TR_F32, TR_F32, TOL_F32, 4, 20, 20, 10, 0, 0) \
    X(batchnorm_eval_f32, build_batchnorm, TR_F32, TR_F32, TOL_F32, 2, 5, 3, 7, 1, 0) \
    X(batchnorm_recomputing_f32, build_batchnorm, TR_F32, TR_F32, TOL_F32, 2, 5, 3, 7, 0, 1) \
    X(batchnorm_bf16, build_batchnorm, TR_BF16, TR_F32, TOL_BF16, 2, 5, 3, 40, 0, 0) \
    X(batchnorm_f16, build_batchnorm, TR_F16, TR_F32, TOL_F16, 2, 5, 3, 40, 0, 0)

#define OP_TEST(test_name, builder, storage_, compute_, tol, ...)                                  \
    Test(backend_ops, test_name)                                                                    \
    {                                                                                               \
        static const struct op_case oc = {#test_name, builder, {__VA_ARGS__}, storage_, compute_,   \
                                          tol};                                                     \
        run_case(&oc);                                                                              \
    }
OP_CASES(OP_TEST)

#define OP_ENTRY(test_name, builder, storage_, compute_, tol, ...)                                 \
    {#test_name, builder, {__VA_ARGS__}, storage_, compute_, tol},
static const struct op_case all_cases[] = {OP_CASES(OP_ENTRY)};

/* supports_op takes every op in every storage, and refuses attention whose
 * head size the kernels do not take (above 256), in both forms, so such a
 * model stops when the run starts, naming the op, not in its first step. */
Test(backend_ops, supports_op_attention_head_sizes)
{
    struct tr_backend cuda;
    need_cuda(&cuda);
    const struct tr_backend_iface *f = cuda.iface;
    cr_assert_not_null(f->supports_op);
    const int head_sizes[] = {256, 264, 512};
    for (int k = 0; k < 3; k++) {
        int D = head_sizes[k], want = D <= 256;
        int packed[6] = {1, 5, 2 * D, 2}, gqa[6] = {1, 5, 4, 2, D};
        struct tr_graph *g = tr_graph_new(1);
        build_attention(g, TR_BF16, packed);
        tr_err err = {{0}};
        cr_assert_eq(tr_graph_check(g, &err), TR_OK, "%s", err.msg);
        cr_assert_eq(f->supports_op(cuda.context, g, &g->nodes[0]), want,
                     "packed attention, head size %d: supports_op says %s", D, want ? "no" : "yes");
        tr_graph_free(g, NULL);
        g = tr_graph_new(1);
        build_attention_gqa(g, TR_F16, gqa);
        cr_assert_eq(tr_graph_check(g, &err), TR_OK, "%s", err.msg);
        cr_assert_eq(f->supports_op(cuda.context, g, &g->nodes[0]), want,
                     "grouped-query attention, head size %d: supports_op says %s", D,
                     want ? "no" : "yes");
        tr_graph_free(g, NULL);
    }
    for (size_t i = 0; i < sizeof all_cases / sizeof *all_cases; i++) {
        struct tr_graph *g = tr_graph_new(1);
        all_cases[i].build(g, all_cases[i].storage, all_cases[i].dims);
        tr_err err = {{0}};
        cr_assert_eq(tr_graph_check(g, &err), TR_OK, "%s", err.msg);
        cr_assert(f->supports_op(cuda.context, g, &g->nodes[0]), "%s: refused by supports_op",
                  all_cases[i].name);
        tr_graph_free(g, NULL);
    }
    tr_backend_close(&cuda);
}

/* conv2d's backward gives the same bits every time: the algorithms chosen
 * are cuDNN's deterministic ones (the harness's fake cuDNN adds the terms
 * of its non-deterministic algorithms in a different order on each call,
 * as atomics would). */
Test(backend_ops, conv2d_backward_bitwise_deterministic)
{
    struct tr_backend cuda;
    need_cuda(&cuda);
    static const struct op_case oc = {"conv2d_deterministic", build_conv2d,
                                      {2, 9, 7, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0}, TR_F32,
                                      TR_F32, TOL_F32};
    struct side a = {.be = &cuda}, b = {.be = &cuda};
    side_build(&a, &oc, TR_F32);
    side_build(&b, &oc, TR_F32);
    fill(&a, &b, &oc, 5);
    for (int run = 0; run < 2; run++) {
        struct side *s = run ? &b : &a;
        cuda.iface->forward(cuda.context, s->g, &s->g->nodes[0]);
        cuda.iface->backward(cuda.context, s->g, &s->g->nodes[0]);
    }
    const struct tr_node *n = &a.g->nodes[0];
    for (int k = 0; k < n->n_in; k++) {
        const struct tr_tensor *ta = &a.g->tensors[n->in[k]], *tb = &b.g->tensors[n->in[k]];
        float *ga = download_as_f32(&cuda, ta->grad, ta->numel, TR_F32);
        float *gb = download_as_f32(&cuda, tb->grad, tb->numel, TR_F32);
        cr_assert(memcmp(ga, gb, ta->numel * sizeof(float)) == 0,
                  "conv2d: two backwards of the same inputs give different bits in the gradient "
                  "of %s", ta->name);
        free(ga);
        free(gb);
    }
    arena_check(&a.arena, "conv2d determinism");
    arena_check(&b.arena, "conv2d determinism");
    side_free(&a);
    side_free(&b);
    tr_backend_close(&cuda);
}

/* ---- optimizers and reductions, through the iface ---------------------------------- */

struct flat {
    float *cpu, *gpu;
};

/* scale < 0: values of |scale|, all positive */
static struct flat flat_random(struct arena *ca, struct arena *ga, size_t n, uint64_t *seed,
                               float scale, const char *what)
{
    struct flat f = {arena_alloc(ca, n * sizeof(float), what), arena_alloc(ga, n * sizeof(float), what)};
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale < 0 ? fabsf(rng_value(seed, -scale)) : rng_value(seed, scale);
    ca->be->iface->upload(ca->be->context, f.cpu, v, n * sizeof *v);
    ga->be->iface->upload(ga->be->context, f.gpu, v, n * sizeof *v);
    free(v);
    return f;
}

struct pair {
    struct tr_backend cpu, cuda;
    struct arena ca, ga;
};

static void pair_open(struct pair *p)
{
    need_cuda(&p->cuda);
    cr_assert_eq(tr_cpu_backend_init(&p->cpu, 0), 0);
    p->ca = (struct arena){.be = &p->cpu};
    p->ga = (struct arena){.be = &p->cuda};
}

static void pair_close(struct pair *p, const char *label)
{
    arena_check(&p->ca, label);
    arena_check(&p->ga, label);
    arena_free(&p->ca);
    arena_free(&p->ga);
    tr_cpu_backend_free(&p->cpu);
    tr_backend_close(&p->cuda);
}

Test(backend_ops, adamw_three_steps)
{
    struct pair p;
    pair_open(&p);
    uint64_t seed = 11;
    size_t n = 10007;
    struct flat w = flat_random(&p.ca, &p.ga, n, &seed, 1, "params");
    struct flat g = flat_random(&p.ca, &p.ga, n, &seed, 1, "grads");
    struct flat m = flat_random(&p.ca, &p.ga, n, &seed, 0.1f, "m");
    struct flat v = flat_random(&p.ca, &p.ga, n, &seed, -0.01f, "v"); /* v >= 0 */
    for (int64_t t = 1; t <= 3; t++) {
        struct tr_adamw_args a = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t};
        p.cpu.iface->adamw(p.cpu.context, w.cpu, g.cpu, m.cpu, v.cpu, n, &a);
        p.cuda.iface->adamw(p.cuda.context, w.gpu, g.gpu, m.gpu, v.gpu, n, &a);
    }
    compare("adamw", "parameters", &p.cpu, w.cpu, TR_F32, &p.cuda, w.gpu, TR_F32, n, 1e-5);
    compare("adamw", "first moment", &p.cpu, m.cpu, TR_F32, &p.cuda, m.gpu, TR_F32, n, 1e-5);
    compare("adamw", "second moment", &p.cpu, v.cpu, TR_F32, &p.cuda, v.gpu, TR_F32, n, 1e-5);
    pair_close(&p, "adamw");
}

Test(backend_ops, sgd_momentum_three_steps)
{
    struct pair p;
    pair_open(&p);
    uint64_t seed = 12;
    size_t n = 4099;
    struct flat w = flat_random(&p.ca, &p.ga, n, &seed, 1, "params");
    struct flat g = flat_random(&p.ca, &p.ga, n, &seed, 1, "grads");
    struct flat b = flat_random(&p.ca, &p.ga, n, &seed, 0.1f, "momentum");
    for (int t = 0; t < 3; t++) {
        struct tr_sgd_args a = {0.05f, 0.9f, 0.01f, 2.0f};
        p.cpu.iface->sgd(p.cpu.context, w.cpu, g.cpu, b.cpu, n, &a);
        p.cuda.iface->sgd(p.cuda.context, w.gpu, g.gpu, b.gpu, n, &a);
    }
    compare("sgd", "parameters", &p.cpu, w.cpu, TR_F32, &p.cuda, w.gpu, TR_F32, n, 1e-5);
    compare("sgd", "momentum", &p.cpu, b.cpu, TR_F32, &p.cuda, b.gpu, TR_F32, n, 1e-5);
    pair_close(&p, "sgd");
}

Test(backend_ops, sum_squares_deterministic_and_non_finite)
{
    struct pair p;
    pair_open(&p);
    uint64_t seed = 13;
    size_t n = 1000003;
    struct flat x = flat_random(&p.ca, &p.ga, n, &seed, 3, "values");
    double want = p.cpu.iface->sum_squares(p.cpu.context, x.cpu, n);
    double got = p.cuda.iface->sum_squares(p.cuda.context, x.gpu, n);
    double again = p.cuda.iface->sum_squares(p.cuda.context, x.gpu, n);
    cr_assert_leq(fabs(got - want), 1e-12 * want, "sum of squares %.17g vs CPU %.17g", got, want);
    cr_assert(got == again, "two sums of the same data differ: %.17g, %.17g", got, again);
    cr_assert_eq(p.cuda.iface->sum_squares(p.cuda.context, x.gpu, 0), 0.0);
    float inf = INFINITY;
    p.cuda.iface->upload(p.cuda.context, x.gpu + n / 2, &inf, sizeof inf);
    cr_assert(!isfinite(p.cuda.iface->sum_squares(p.cuda.context, x.gpu, n)),
              "an inf gradient must make the norm non-finite");
    pair_close(&p, "sum_squares");
}

Test(backend_ops, count_correct_ties_and_ignored_rows)
{
    struct pair p;
    pair_open(&p);
    int N = 300, V = 37;
    uint64_t seed = 14;
    float *logits = malloc((size_t)N * V * sizeof *logits);
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    for (int i = 0; i < N; i++) {
        for (int v = 0; v < V; v++)
            logits[(size_t)i * V + v] = (float)(rng_next(&seed) % 7); /* many ties */
        targets[i] = i % 11 == 5 ? -1 : (int32_t)(rng_next(&seed) % (uint64_t)V);
    }
    float *lc = arena_alloc(&p.ca, (size_t)N * V * sizeof(float), "logits");
    float *lg = arena_alloc(&p.ga, (size_t)N * V * sizeof(float), "logits");
    int32_t *tc = arena_alloc(&p.ca, (size_t)N * sizeof(int32_t), "targets");
    int32_t *tg = arena_alloc(&p.ga, (size_t)N * sizeof(int32_t), "targets");
    p.cpu.iface->upload(p.cpu.context, lc, logits, (size_t)N * V * sizeof(float));
    p.cuda.iface->upload(p.cuda.context, lg, logits, (size_t)N * V * sizeof(float));
    p.cpu.iface->upload(p.cpu.context, tc, targets, (size_t)N * sizeof(int32_t));
    p.cuda.iface->upload(p.cuda.context, tg, targets, (size_t)N * sizeof(int32_t));
    int64_t valid_cpu = 0, valid_gpu = 0;
    int64_t want = p.cpu.iface->count_correct(p.cpu.context, lc, tc, N, V, -1, &valid_cpu);
    int64_t got = p.cuda.iface->count_correct(p.cuda.context, lg, tg, N, V, -1, &valid_gpu);
    cr_assert_eq(valid_gpu, valid_cpu, "%lld valid rows on the GPU, %lld on the CPU",
                 (long long)valid_gpu, (long long)valid_cpu);
    cr_assert_eq(got, want, "%lld correct on the GPU, %lld on the CPU", (long long)got,
                 (long long)want);
    free(logits);
    free(targets);
    pair_close(&p, "count_correct");
}

/* ---- memory the core converts, discards and commits (backend ABI 10, 7, 11) ------- */

/* convert on the CUDA backend against the CPU backend's, bit for bit: fp32
 * values at every rounding case of bf16 and fp16 (ties both ways, fp32 and
 * fp16 subnormals, overflow, infinities, NaN payloads) and random bits,
 * every 16-bit pattern widened, the same-type copies; odd n, 16-bit values
 * at addresses 2 bytes off a 4-byte boundary. */
static const uint32_t convert_cases[] = {
    0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u,
    0x3f808000u, 0x3f818000u, 0xbf818000u, 0x3f808001u, 0x3f807fffu, /* bf16 ties, near ties */
    0x3f801000u, 0x3f803000u, 0x3f801001u, 0x3f800fffu,             /* fp16 ties, near ties */
    0x00000001u, 0x80000001u, 0x007fffffu, 0x00400000u, 0x00008000u, /* fp32 subnormals */
    0x33000000u, 0x33000001u, 0xb3000000u, 0x33800000u, 0x33c00000u, /* fp16 subnormal range */
    0x34200000u, 0x387fe000u, 0x387ff000u, 0x38800000u, 0x387fffffu,
    0x477fe000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u, 0x47800000u, /* fp16 overflow */
    0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0xff7fffffu,              /* bf16 overflow */
    0x7f800000u, 0xff800000u,                                        /* infinities */
    0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u, 0xff812345u, /* NaN, payloads */
    0x7fffffffu, 0x7fc0ffffu, 0xffbfffffu,
};

static const char *type_name(enum tr_dtype t) { return t == TR_BF16 ? "bf16" : t == TR_F16 ? "fp16" : "fp32"; }

/* n values of type `from` (host bits at src) converted to `to` on both
 * backends; on the GPU src at offset so_ and dst at offset do_ bytes past
 * a 256-aligned address (2: not 4-byte aligned) */
static void convert_both(const struct tr_backend *cpu, struct arena *ga, const void *src,
                         enum tr_dtype from, enum tr_dtype to, size_t n, size_t so_, size_t do_)
{
    const struct tr_backend *gpu = ga->be;
    size_t sb = n * (from == TR_F32 ? 4 : 2), db = n * (to == TR_F32 ? 4 : 2);
    uint8_t *gs = arena_alloc(ga, sb + so_, "convert source");
    uint8_t *gd = arena_alloc(ga, db + do_, "convert destination");
    uint8_t *want = malloc(db), *got = malloc(db);
    cr_assert(want && got);
    gpu->iface->upload(gpu->context, gs + so_, src, sb);
    gpu->iface->convert(gpu->context, gd + do_, to, gs + so_, from, n);
    cpu->iface->convert(cpu->context, want, to, src, from, n); /* CPU memory is host memory */
    gpu->iface->download(gpu->context, got, gd + do_, db);
    for (size_t i = 0; i < n; i++) {
        uint32_t w = 0, g = 0, in = 0;
        memcpy(&w, want + i * (db / n), db / n);
        memcpy(&g, got + i * (db / n), db / n);
        memcpy(&in, (const uint8_t *)src + i * (sb / n), sb / n);
        cr_assert_eq(g, w, "convert %s -> %s, n %zu, source +%zu, destination +%zu: [%zu] 0x%0*x "
                     "gives 0x%0*x on cuda, 0x%0*x on the CPU", type_name(from), type_name(to), n,
                     so_, do_, i, (int)(sb / n * 2), in, (int)(db / n * 2), g, (int)(db / n * 2), w);
    }
    free(want);
    free(got);
}

Test(backend_memory, convert_gives_the_cpu_bits)
{
    struct pair p;
    pair_open(&p);
    cr_assert_not_null(p.cuda.iface->convert, "the cuda backend has no convert");
    /* fp32 -> 16 bits: the cases, then random bits (every exponent) */
    size_t n = 4097, n_cases = sizeof convert_cases / sizeof *convert_cases;
    uint32_t *f = malloc(n * sizeof *f);
    uint64_t seed = 21;
    for (size_t i = 0; i < n; i++)
        f[i] = i < n_cases ? convert_cases[i] : (uint32_t)rng_next(&seed);
    convert_both(&p.cpu, &p.ga, f, TR_F32, TR_BF16, n, 0, 2);
    convert_both(&p.cpu, &p.ga, f, TR_F32, TR_F16, n, 0, 2);
    convert_both(&p.cpu, &p.ga, f, TR_F32, TR_BF16, 1, 0, 0);
    convert_both(&p.cpu, &p.ga, f, TR_F32, TR_F32, n, 0, 0);
    /* every 16-bit pattern, and one more: odd */
    size_t n16 = 65537;
    uint16_t *h = malloc(n16 * sizeof *h);
    for (size_t i = 0; i < n16; i++)
        h[i] = (uint16_t)(i * 40503u); /* i * odd: a permutation of 0..65535, then 0 again */
    convert_both(&p.cpu, &p.ga, h, TR_BF16, TR_F32, n16, 2, 0);
    convert_both(&p.cpu, &p.ga, h, TR_F16, TR_F32, n16, 2, 0);
    convert_both(&p.cpu, &p.ga, h, TR_BF16, TR_BF16, n16, 2, 0);
    convert_both(&p.cpu, &p.ga, h, TR_F16, TR_F16, 999, 0, 2);
    free(f);
    free(h);
    pair_close(&p, "convert");
}

/* The chunk the cuda backend maps and gives back: the granularity of the
 * driver's virtual memory management, 2 MiB on current GPUs and in the
 * harness.  The tests below hold on any other: only which path a range
 * takes (whole chunks given back, or zeroed) depends on it. */
#define CHUNK ((size_t)2 << 20)

static uint8_t pattern_at(size_t i) { return (uint8_t)(1 + (i * 131u + (i >> 13)) % 255u); }

/* The CUDA backend with discard and commit: through the harness it must
 * have them (virtual memory management is emulated); a GPU whose driver
 * lacks it is skipped. */
static void need_vmm(struct tr_backend *cuda)
{
    need_cuda(cuda);
    if (cuda->iface->discard && cuda->iface->commit)
        return;
    if (on_cudacpu())
        cr_assert_fail("the CUDA backend of tests/cudacpu opened without discard and commit");
    cr_skip_test("this GPU's driver offers no virtual memory management: no discard on cuda");
}

static uint8_t *vmm_buffer(const struct tr_backend *be, size_t bytes)
{
    uint8_t *b = be->iface->alloc(be->context, bytes);
    cr_assert_not_null(b, "cannot allocate %zu bytes on cuda", bytes);
    uint8_t *host = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        host[i] = pattern_at(i);
    be->iface->upload(be->context, b, host, bytes);
    free(host);
    return b;
}

/* bytes [from, to) of got: the pattern, or zeros */
static void expect_range(const uint8_t *got, size_t base, size_t from, size_t to, int zeros,
                         const char *when)
{
    for (size_t i = from; i < to; i++) {
        uint8_t want = zeros ? 0 : pattern_at(i);
        if (got[i - base] != want)
            cr_assert_fail("%s: byte %zu (chunk %zu + %zu) is 0x%02x, want 0x%02x (%s)", when, i,
                           i / CHUNK, i % CHUNK, got[i - base], want,
                           zeros ? "discarded: zeros" : "kept: the pattern");
    }
}

Test(backend_memory, discard_gives_chunks_back_and_commit_makes_them_zeros)
{
    struct tr_backend cuda;
    need_vmm(&cuda);
    const struct tr_backend_iface *f = cuda.iface;
    size_t bytes = 5 * CHUNK + 1000; /* six chunks, the last one partly asked for */
    uint8_t *b = vmm_buffer(&cuda, bytes);
    /* chunks 1 and 2 whole, the end of chunk 0 and the start of chunk 3 */
    size_t d0 = CHUNK / 2, d1 = 3 * CHUNK + CHUNK / 4;
    f->discard(cuda.context, b + d0, d1 - d0);
    /* the end of chunk 4 and all of chunk 5 (whose tail was never asked
     * for); the first discard's chunks go meanwhile, once the device is
     * past its mark (at once in the harness) */
    size_t e0 = 4 * CHUNK + CHUNK / 2;
    f->discard(cuda.context, b + e0, bytes - e0);
    /* part of chunk 1 first: made again, all zeros */
    uint8_t *got = malloc(bytes);
    f->commit(cuda.context, b + CHUNK + 100, 4096);
    f->download(cuda.context, got, b + CHUNK + 100, 4096);
    expect_range(got, CHUNK + 100, CHUNK + 100, CHUNK + 100 + 4096, 1, "part of chunk 1 committed");
    /* then everything: what was not discarded keeps its bytes */
    f->commit(cuda.context, b, bytes);
    f->download(cuda.context, got, b, bytes);
    expect_range(got, 0, 0, d0, 0, "all committed");
    expect_range(got, 0, d0, d1, 1, "all committed");
    expect_range(got, 0, d1, e0, 0, "all committed");
    expect_range(got, 0, e0, bytes, 1, "all committed");
    /* the memory is usable again, and a second round gives the same */
    free(got);
    f->free(cuda.context, b);
    b = vmm_buffer(&cuda, bytes);
    f->discard(cuda.context, b + d0, d1 - d0);
    f->synchronize(cuda.context); /* the pending chunks go here at the latest */
    f->commit(cuda.context, b, bytes);
    got = malloc(bytes);
    f->download(cuda.context, got, b, bytes);
    expect_range(got, 0, 0, d0, 0, "second round");
    expect_range(got, 0, d0, d1, 1, "second round");
    expect_range(got, 0, d1, bytes, 0, "second round");
    /* a range inside one chunk only reads as zeros; memory of cudaMalloc too */
    f->discard(cuda.context, b + 10, 20);
    uint8_t *small = vmm_buffer(&cuda, 1000);
    f->discard(cuda.context, small + 100, 50);
    f->commit(cuda.context, small, 1000); /* nothing to do there */
    f->download(cuda.context, got, b, 64);
    expect_range(got, 0, 0, 10, 0, "inside one chunk");
    expect_range(got, 0, 10, 30, 1, "inside one chunk");
    expect_range(got, 0, 30, 64, 0, "inside one chunk");
    f->download(cuda.context, got, small, 1000);
    expect_range(got, 0, 0, 100, 0, "cudaMalloc memory");
    expect_range(got, 0, 100, 150, 1, "cudaMalloc memory");
    expect_range(got, 0, 150, 1000, 0, "cudaMalloc memory");
    free(got);
    f->free(cuda.context, small);
    f->free(cuda.context, b);
    tr_backend_close(&cuda);
}

/* Committed before the device passed the discard's mark: the chunks are
 * taken back as they are (the harness never reaps them in between), and
 * must read as zeros all the same. */
Test(backend_memory, commit_right_after_discard_takes_chunks_back_as_zeros)
{
    struct tr_backend cuda;
    need_vmm(&cuda);
    const struct tr_backend_iface *f = cuda.iface;
    size_t bytes = 3 * CHUNK;
    uint8_t *b = vmm_buffer(&cuda, bytes);
    f->discard(cuda.context, b, bytes);
    f->commit(cuda.context, b, bytes);
    uint8_t *got = malloc(bytes);
    f->download(cuda.context, got, b, bytes);
    expect_range(got, 0, 0, bytes, 1, "committed right after the discard");
    /* usable as any memory */
    free(got);
    f->free(cuda.context, b);
    b = vmm_buffer(&cuda, bytes);
    got = malloc(bytes);
    f->download(cuda.context, got, b, bytes);
    expect_range(got, 0, 0, bytes, 0, "written again");
    free(got);
    f->free(cuda.context, b);
    tr_backend_close(&cuda);
}

/* A chunk given back and not committed again is not memory any more: in
 * the harness touching it faults (on a GPU a kernel would fault with an
 * illegal address, which this test cannot catch: skipped there).  The
 * fault happens in a child of the test, which opens the backend itself;
 * its exit code says which step went wrong before the read expected to
 * fault. */
Test(backend_memory, a_discarded_chunk_faults_until_committed)
{
    if (!on_cudacpu())
        cr_skip_test("the fault is the harness's (SIGSEGV); a GPU reports an illegal address");
#if defined(__SANITIZE_ADDRESS__)
    /* the sanitizer job counts every report, this deliberate fault's too:
     * the plain build runs it */
    cr_skip_test("under AddressSanitizer the deliberate fault is a report");
#endif
    fflush(NULL);
    pid_t child = fork();
    cr_assert_geq(child, 0, "fork: %s", strerror(errno));
    if (child == 0) {
        struct tr_backend cuda;
        char why[1100];
        if (open_cuda(&cuda, why, sizeof why) != TR_OK || !cuda.iface->discard)
            _exit(2);
        const struct tr_backend_iface *f = cuda.iface;
        uint8_t *b = f->alloc(cuda.context, 3 * CHUNK);
        if (!b)
            _exit(3);
        f->discard(cuda.context, b + CHUNK, CHUNK);
        f->synchronize(cuda.context); /* the chunk is unmapped now */
        uint8_t got[64];
        f->download(cuda.context, got, b, sizeof got); /* chunk 0 is there */
        f->download(cuda.context, got, b + 2 * CHUNK, sizeof got); /* chunk 2 too */
        fprintf(stderr, "reading chunk 1, discarded and not committed: SIGSEGV expected\n");
        f->download(cuda.context, got, b + CHUNK, sizeof got);
        _exit(0);
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(!WIFEXITED(status) || WEXITSTATUS(status) != 2, "the child could not open cuda "
              "with discard");
    cr_assert(!WIFEXITED(status) || WEXITSTATUS(status) != 3, "the child could not allocate");
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
              "reading a discarded chunk that was not committed did not fault (%s %d)",
              WIFSIGNALED(status) ? "signal" : "exit code",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

/* Out of device memory when a commit maps a chunk again (the harness's
 * CUDACPU_VMM_LIMIT): a sticky CUDA error -- sum_squares NaN, so the run
 * stops at its step's end -- not a crash, and the rest stays usable. */
Test(backend_memory, commit_out_of_memory_is_a_sticky_error)
{
    if (!on_cudacpu())
        cr_skip_test("the harness's CUDACPU_VMM_LIMIT makes the device run out of memory");
    unsetenv("CUDACPU_VMM_LIMIT");
    struct tr_backend cuda;
    need_vmm(&cuda);
    const struct tr_backend_iface *f = cuda.iface;
    uint8_t *b = vmm_buffer(&cuda, 3 * CHUNK);
    f->zero(cuda.context, b, 4000); /* the pattern's bytes need not be finite floats */
    cr_assert(isfinite(f->sum_squares(cuda.context, (const float *)b, 1000)));
    f->discard(cuda.context, b + CHUNK, CHUNK);
    f->synchronize(cuda.context);
    char limit[32];
    snprintf(limit, sizeof limit, "%zu", 2 * CHUNK); /* what is mapped now */
    setenv("CUDACPU_VMM_LIMIT", limit, 1);
    f->commit(cuda.context, b + CHUNK, 100);
    cr_assert(isnan(f->sum_squares(cuda.context, (const float *)b, 1000)),
              "a commit that found no memory left no error behind");
    uint8_t got[64];
    f->download(cuda.context, got, b + 2 * CHUNK, sizeof got);
    expect_range(got, 2 * CHUNK, 2 * CHUNK, 2 * CHUNK + sizeof got, 0, "after the failed commit");
    unsetenv("CUDACPU_VMM_LIMIT");
    f->free(cuda.context, b);
    tr_backend_close(&cuda);
}

/* A driver without virtual memory management (the harness's
 * CUDACPU_NO_VMM): the backend opens without discard and commit, so the
 * core keeps sharded data parallelism off, and allocates as before. */
Test(backend_memory, without_virtual_memory_management_no_discard)
{
    if (!on_cudacpu())
        cr_skip_test("the harness's CUDACPU_NO_VMM takes the driver's functions away");
    setenv("CUDACPU_NO_VMM", "1", 1);
    struct tr_backend cuda;
    need_cuda(&cuda);
    cr_assert_null(cuda.iface->discard, "discard without virtual memory management");
    cr_assert_null(cuda.iface->commit, "commit without virtual memory management");
    cr_assert_not_null(cuda.iface->convert, "convert needs no virtual memory management");
    uint8_t *b = vmm_buffer(&cuda, 3 * CHUNK);
    uint8_t *got = malloc(3 * CHUNK);
    cuda.iface->download(cuda.context, got, b, 3 * CHUNK);
    expect_range(got, 0, 0, 3 * CHUNK, 0, "cudaMalloc memory");
    free(got);
    cuda.iface->free(cuda.context, b);
    tr_backend_close(&cuda);
    unsetenv("CUDACPU_NO_VMM");
}

/* The core's communication thread converts, discards and commits while the
 * compute thread allocates, launches and frees: the registry and the
 * launches from two threads. */
struct comm_side {
    const struct tr_backend *be;
    float *params;   /* n fp32 */
    uint16_t *half;  /* n bf16, several chunks */
    size_t n;
    int rounds;
};

static void *comm_thread(void *arg)
{
    struct comm_side *s = arg;
    const struct tr_backend_iface *f = s->be->iface;
    size_t part = s->n / 4;
    for (int r = 0; r < s->rounds; r++)
        for (size_t k = 0; k < 4; k++) {
            f->commit(s->be->context, s->half + k * part, part * 2);
            f->convert(s->be->context, s->half + k * part, TR_BF16, s->params + k * part, TR_F32,
                       part);
            if (r + 1 < s->rounds)
                f->discard(s->be->context, s->half + k * part, part * 2);
        }
    return NULL;
}

Test(backend_memory, convert_discard_and_commit_from_another_thread)
{
    struct pair p;
    pair_open(&p);
    if (!p.cuda.iface->discard || !p.cuda.iface->commit) {
        cr_assert(!on_cudacpu(), "the CUDA backend of tests/cudacpu opened without discard");
        pair_close(&p, "threads");
        cr_skip_test("this GPU's driver offers no virtual memory management: no discard on cuda");
    }
    uint64_t seed = 31;
    struct comm_side s = {.be = &p.cuda, .n = 4 * CHUNK / 2, .rounds = 3};
    size_t n = s.n;
    struct flat w = flat_random(&p.ca, &p.ga, n, &seed, 2, "params");
    s.params = w.gpu;
    s.half = p.cuda.iface->alloc(p.cuda.context, n * 2);
    cr_assert_not_null(s.half);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, comm_thread, &s), 0);
    for (int i = 0; i < 6; i++) { /* meanwhile: memory comes and goes, kernels run */
        float *x = p.cuda.iface->alloc(p.cuda.context, CHUNK + 4096);
        cr_assert_not_null(x);
        (void)p.cuda.iface->sum_squares(p.cuda.context, x, 1000);
        p.cuda.iface->free(p.cuda.context, x);
    }
    pthread_join(t, NULL);
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
    p.cpu.iface->convert(p.cpu.context, want, TR_BF16, w.cpu, TR_F32, n);
    p.cuda.iface->download(p.cuda.context, got, s.half, n * 2);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "[%zu]: 0x%04x on cuda, 0x%04x on the CPU", i, got[i], want[i]);
    cr_assert(isfinite(p.cuda.iface->sum_squares(p.cuda.context, w.gpu, n)), "a CUDA error");
    free(want);
    free(got);
    p.cuda.iface->free(p.cuda.context, s.half);
    pair_close(&p, "threads");
}

/* ---- the tiny GPT and the tiny Llama as wholes ------------------------------------ */

struct model_side {
    const struct tr_backend *be;
    struct tr_graph *g;
    struct tr_optimizer opt;
};

/* The model of cfg on s->be, its parameters and tokens from f (the GPT
 * fixture), or left for the caller when f is NULL. */
static void model_open(struct model_side *s, struct tr_config *cfg, const struct tr_st_file *f,
                       enum tr_dtype compute)
{
    tr_err err = {{0}};
    s->g = tr_model_build(cfg->recipe, 3, &err);
    cr_assert_not_null(s->g, "%s", err.msg);
    s->g->compute = compute;
    cr_assert_eq(tr_graph_plan(s->g, s->be, 2, &err), TR_OK, "%s", err.msg);
    /* a 16-bit compute dtype stores the activations in it (graph.c), on
     * both backends: the whole model runs with 16-bit activation storage */
    int halves = 0;
    for (int i = 0; i < s->g->n_tensors; i++)
        halves += s->g->tensors[i].role == TR_ROLE_ACTIVATION && s->g->tensors[i].dtype == compute;
    cr_assert(compute == TR_F32 || halves > 0, "no activation is stored in the compute dtype");
    cr_assert_eq(tr_optimizer_init(&s->opt, &cfg->optimizer, s->g, s->be, NULL, &err),
                 TR_OK, "%s", err.msg);
    if (!f)
        return;
    for (int i = 0; i < s->g->n_tensors; i++) {
        struct tr_tensor *t = &s->g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        const struct tr_st_entry *e = need(f, "param.", t->name);
        cr_assert_eq(e->bytes, t->numel * sizeof(float));
        s->be->iface->upload(s->be->context, t->data, e->data, e->bytes);
    }
    const struct tr_st_entry *tok = need(f, "", "tokens"), *tgt = need(f, "", "targets");
    s->be->iface->upload(s->be->context, s->g->tensors[s->g->inputs[0]].data, tok->data, tok->bytes);
    s->be->iface->upload(s->be->context, s->g->tensors[s->g->inputs[1]].data, tgt->data, tgt->bytes);
}

static float model_step(struct model_side *s)
{
    struct tr_graph *g = s->g;
    s->be->iface->zero(s->be->context, g->grads, g->n_params * sizeof(float));
    tr_graph_forward(g, s->be);
    g->loss_grad = 1.0f;
    tr_graph_backward(g, s->be);
    float loss;
    s->be->iface->download(s->be->context, &loss, g->tensors[g->loss].data, sizeof loss);
    return loss;
}

/* Three SGD steps of one model on both backends from the same parameters
 * and tokens: the loss of each step, every gradient of the first, the
 * parameters at the end. */
static void train_both(struct model_side *cpu, struct model_side *gpu, const char *label,
                       double tolerance)
{
    for (int step = 0; step < 3; step++) {
        float want = model_step(cpu), got = model_step(gpu);
        cr_assert(isfinite(got), "%s: step %d: loss %g on the GPU", label, step, (double)got);
        cr_assert_leq(fabs((double)got - want), tolerance * fabs((double)want),
                      "%s: step %d: loss %.7f on the GPU, %.7f on the CPU", label, step, (double)got,
                      (double)want);
        if (step == 0)
            for (int i = 0; i < cpu->g->n_tensors; i++) {
                const struct tr_tensor *tc = &cpu->g->tensors[i], *tg = &gpu->g->tensors[i];
                if (tc->role != TR_ROLE_PARAM)
                    continue;
                char what[128];
                snprintf(what, sizeof what, "gradient of %s", tc->name);
                compare(label, what, cpu->be, tc->grad, TR_F32, gpu->be, tg->grad, TR_F32,
                        tc->numel, tolerance);
            }
        tr_optimizer_step(&cpu->opt, cpu->g, cpu->be, 1.0, 1e-2);
        tr_optimizer_step(&gpu->opt, gpu->g, gpu->be, 1.0, 1e-2);
    }
    compare(label, "parameters after 3 SGD steps", cpu->be, cpu->g->params, TR_F32, gpu->be,
            gpu->g->params, TR_F32, cpu->g->n_params, tolerance);
}

static void model_close(struct model_side *s)
{
    tr_optimizer_free(&s->opt, s->be);
    tr_graph_free(s->g, s->be);
}

static void whole_model(enum tr_dtype compute, double tolerance)
{
    struct tr_backend cuda, cpu_be;
    need_cuda(&cuda);
    cr_assert_eq(tr_cpu_backend_init(&cpu_be, 0), 0);
    struct st_file fixture = st_open(TR_TEST_SRCDIR "/fixtures/tiny_gpt.safetensors");
    const struct tr_st_file *f = fixture.st;
    tr_err err = {{0}};
    /* SGD, not the recipe's AdamW: the key part of c_attn.bias has a
     * gradient of exactly zero in exact arithmetic (softmax ignores a shift
     * shared by all keys), so each backend gets rounding noise there, of
     * either sign, and AdamW's m / sqrt(v) turns any noise into a full +-lr
     * step: the parameters would differ by 2 lr whatever the kernels do.
     * SGD moves them by lr times the gradient, which the backends agree on.
     * (AdamW itself is compared in adamw_three_steps.) */
    const char *sgd[] = {"optimizer.type=sgd", "optimizer.momentum=0.9"};
    struct tr_config cfg;
    cr_assert_eq(tr_config_load(&cfg, TR_TEST_SRCDIR "/config/tiny_gpt.lua", sgd, 2, &err), TR_OK,
                 "%s", err.msg);
    struct model_side cpu = {.be = &cpu_be}, gpu = {.be = &cuda};
    model_open(&cpu, &cfg, f, compute);
    model_open(&gpu, &cfg, f, compute);
    train_both(&cpu, &gpu,
               compute == TR_F32 ? "tiny GPT, fp32" : "tiny GPT, bf16 GEMM inputs and activations",
               tolerance);
    model_close(&cpu);
    model_close(&gpu);
    tr_config_free(&cfg);
    st_close(&fixture);
    tr_cpu_backend_free(&cpu_be);
    tr_backend_close(&cuda);
}

/* tests/config/tiny_llama.lua (grouped-query attention, RoPE, RMSNorm,
 * SwiGLU, untied head) with parameters initialised on the CPU and copied,
 * and random tokens: every new op inside a whole model, forward and
 * backward, on the GPU as on the CPU. */
static void whole_llama(enum tr_dtype compute, double tolerance)
{
    struct tr_backend cuda, cpu_be;
    need_cuda(&cuda);
    cr_assert_eq(tr_cpu_backend_init(&cpu_be, 0), 0);
    tr_err err = {{0}};
    const char *sgd[] = {"optimizer.type=sgd", "optimizer.momentum=0.9"};
    struct tr_config cfg;
    cr_assert_eq(tr_config_load(&cfg, TR_TEST_SRCDIR "/config/tiny_llama.lua", sgd, 2, &err),
                 TR_OK, "%s", err.msg);
    struct model_side cpu = {.be = &cpu_be}, gpu = {.be = &cuda};
    model_open(&cpu, &cfg, NULL, compute);
    model_open(&gpu, &cfg, NULL, compute);
    cr_assert_eq(cpu.g->n_params, gpu.g->n_params);
    tr_graph_init_params(cpu.g, &cpu_be, 77);
    float *params = malloc(cpu.g->n_params * sizeof *params);
    cpu_be.iface->download(cpu_be.context, params, cpu.g->params, cpu.g->n_params * sizeof *params);
    cuda.iface->upload(cuda.context, gpu.g->params, params, gpu.g->n_params * sizeof *params);
    free(params);
    uint64_t seed = 21;
    for (int k = 0; k < 2; k++) { /* tokens, targets */
        const struct tr_tensor *t = &cpu.g->tensors[cpu.g->inputs[k]];
        cr_assert_eq(t->dtype, TR_I32);
        int32_t *ids = malloc(t->numel * sizeof *ids);
        for (size_t j = 0; j < t->numel; j++)
            ids[j] = (int32_t)(rng_next(&seed) % 37u); /* the recipe's vocab */
        cpu_be.iface->upload(cpu_be.context, t->data, ids, t->numel * sizeof *ids);
        cuda.iface->upload(cuda.context, gpu.g->tensors[gpu.g->inputs[k]].data, ids,
                           t->numel * sizeof *ids);
        free(ids);
    }
    train_both(&cpu, &gpu,
               compute == TR_F32 ? "tiny Llama, fp32" : "tiny Llama, bf16 GEMM inputs and activations",
               tolerance);
    model_close(&cpu);
    model_close(&gpu);
    tr_config_free(&cfg);
    tr_cpu_backend_free(&cpu_be);
    tr_backend_close(&cuda);
}

/* tests/config/tiny_cnn.lua (conv2d on cuDNN, batch norm, max and global
 * average pooling, linear head) with parameters and running statistics
 * initialised on the CPU and copied, and random images and labels: the
 * loss, every gradient, the parameters after three SGD steps and the
 * running statistics they moved. */
static void whole_cnn(enum tr_dtype compute, double tolerance)
{
    struct tr_backend cuda, cpu_be;
    need_cuda(&cuda);
    cr_assert_eq(tr_cpu_backend_init(&cpu_be, 0), 0);
    tr_err err = {{0}};
    const char *sgd[] = {"optimizer.type=sgd", "optimizer.momentum=0.9"};
    struct tr_config cfg;
    cr_assert_eq(tr_config_load(&cfg, TR_TEST_SRCDIR "/config/tiny_cnn.lua", sgd, 2, &err), TR_OK,
                 "%s", err.msg);
    struct model_side cpu = {.be = &cpu_be}, gpu = {.be = &cuda};
    model_open(&cpu, &cfg, NULL, compute);
    model_open(&gpu, &cfg, NULL, compute);
    cr_assert_eq(cpu.g->n_params, gpu.g->n_params);
    cr_assert(cpu.g->n_buffers > 0 && cpu.g->n_buffers == gpu.g->n_buffers,
              "the tiny CNN has no batch-norm buffers");
    tr_graph_init_params(cpu.g, &cpu_be, 78);
    size_t n = cpu.g->n_params > cpu.g->n_buffers ? cpu.g->n_params : cpu.g->n_buffers;
    float *host = malloc(n * sizeof *host);
    cpu_be.iface->download(cpu_be.context, host, cpu.g->params, cpu.g->n_params * sizeof *host);
    cuda.iface->upload(cuda.context, gpu.g->params, host, gpu.g->n_params * sizeof *host);
    cpu_be.iface->download(cpu_be.context, host, cpu.g->buffers, cpu.g->n_buffers * sizeof *host);
    cuda.iface->upload(cuda.context, gpu.g->buffers, host, gpu.g->n_buffers * sizeof *host);
    free(host);
    uint64_t seed = 22;
    for (int k = 0; k < 2; k++) { /* images, labels */
        const struct tr_tensor *t = &cpu.g->tensors[cpu.g->inputs[k]];
        void *v = malloc(t->numel * 4);
        for (size_t j = 0; j < t->numel; j++) {
            if (t->dtype == TR_I32)
                ((int32_t *)v)[j] = (int32_t)(rng_next(&seed) % 3u); /* the recipe's classes */
            else
                ((float *)v)[j] = rng_value(&seed, 1.0f);
        }
        cpu_be.iface->upload(cpu_be.context, t->data, v, t->numel * 4);
        cuda.iface->upload(cuda.context, gpu.g->tensors[gpu.g->inputs[k]].data, v, t->numel * 4);
        free(v);
    }
    const char *label = compute == TR_F32 ? "tiny CNN, fp32" : "tiny CNN, bf16 GEMM inputs";
    train_both(&cpu, &gpu, label, tolerance);
    compare(label, "running statistics after 3 steps", &cpu_be, cpu.g->buffers, TR_F32, &cuda,
            gpu.g->buffers, TR_F32, cpu.g->n_buffers, tolerance);
    model_close(&cpu);
    model_close(&gpu);
    tr_config_free(&cfg);
    tr_cpu_backend_free(&cpu_be);
    tr_backend_close(&cuda);
}

/* bf16 models with attention: 1e-2, five bf16 roundings (2^-9 each).  On a
 * CPU with native bf16 the CPU's attention multiplies in bf16 (P, dS and
 * dout rounded for its products, as bf16 flash-attention kernels do) where
 * the CUDA kernel keeps them fp32, and the gradients differ by up to
 * 7.1e-3 (GPT, h.0.mlp.c_fc.weight) and 8.7e-3 (Llama,
 * layers.0.input_layernorm.weight) of their scale; before, with both in
 * fp32, 2e-3 held.  A wrong kernel is off by O(1).  The CNN has no
 * attention and keeps 2e-3. */
Test(whole_model, tiny_gpt_fp32, .init = environment) { whole_model(TR_F32, 1e-4); }
Test(whole_model, tiny_gpt_bf16_gemm_inputs, .init = environment) { whole_model(TR_BF16, 1e-2); }
Test(whole_model, tiny_llama_fp32, .init = environment) { whole_llama(TR_F32, 1e-4); }
Test(whole_model, tiny_llama_bf16_gemm_inputs, .init = environment) { whole_llama(TR_BF16, 1e-2); }
Test(whole_model, tiny_cnn_fp32, .init = environment) { whole_cnn(TR_F32, 1e-4); }
Test(whole_model, tiny_cnn_bf16_gemm_inputs, .init = environment) { whole_cnn(TR_BF16, 2e-3); }

/* ---- the harness itself, on the CPU (runs everywhere) ---------------------------------- */

Test(harness, guards_catch_an_overrun_on_cpu)
{
    struct tr_backend cpu_be;
    cr_assert_eq(tr_cpu_backend_init(&cpu_be, 0), 0);
    struct arena a = {.be = &cpu_be};
    uint8_t *p = arena_alloc(&a, 100, "probe");
    memset(p, 1, 100); /* in bounds: the guards hold */
    arena_check(&a, "in-bounds write");
    /* the tail guard's first byte, checked by hand (arena_check would fail the test) */
    uint8_t want = guard_byte(0);
    cr_assert_eq(p[100], want);
    p[100] = (uint8_t)~want;
    cr_assert_neq(p[100], guard_byte(0), "an overrun changes the guard the check compares");
    p[100] = want;
    arena_free(&a);
    tr_cpu_backend_free(&cpu_be);
}

/* The rule that keeps the CUDA backend tested: every op of the graph has
 * cases here in fp32, bf16 and fp16 storage (the CUDA kernels are
 * templated on all three), so a new op cannot ship without running through
 * tests/cudacpu in make check, and on a GPU in contrib/gpu/validate.sh. */
Test(harness, every_op_has_cases_in_every_storage)
{
    const enum tr_dtype storages[] = {TR_F32, TR_BF16, TR_F16};
    size_t n_cases = sizeof all_cases / sizeof *all_cases;
    for (int op = 0; op < TR_OP_COUNT; op++)
        for (int k = 0; k < 3; k++) {
            int found = 0;
            for (size_t i = 0; i < n_cases && !found; i++) {
                if (all_cases[i].storage != storages[k])
                    continue;
                struct tr_graph *g = tr_graph_new(1);
                all_cases[i].build(g, TR_F32, all_cases[i].dims);
                found = g->n_nodes > 0 && (int)g->nodes[0].op == op;
                tr_graph_free(g, NULL);
            }
            cr_expect(found, "op %s has no case in %s storage: add one to OP_CASES",
                      tr_op_name((enum tr_op)op), dt_name(storages[k]));
        }
}

/* Every op case's graph builds, checks and runs forward and backward on
 * the CPU inside guarded buffers, with finite results and gradients that
 * changed: the GPU cases are valid graphs whatever the machine. */
Test(harness, every_case_runs_on_cpu_within_bounds)
{
    const struct op_case *cases = all_cases;
    size_t n_cases = sizeof all_cases / sizeof *all_cases;
    struct tr_backend cpu_be, cpu_twin;
    cr_assert_eq(tr_cpu_backend_init(&cpu_be, 0), 0);
    cr_assert_eq(tr_cpu_backend_init(&cpu_twin, 0), 0);
    for (size_t i = 0; i < n_cases; i++) {
        const struct op_case *oc = &cases[i];
        struct side s = {.be = &cpu_be}, twin = {.be = &cpu_twin};
        side_build(&s, oc, TR_F32);
        side_build(&twin, oc, TR_F32);
        fill(&s, &twin, oc, 99);
        const struct tr_node *n = &s.g->nodes[0];
        cpu_be.iface->forward(cpu_be.context, s.g, n);
        cpu_be.iface->backward(cpu_be.context, s.g, n);
        arena_check(&s.arena, oc->name);
        const struct tr_tensor *out = &s.g->tensors[n->out];
        expect_finite(out->data, out->numel, oc->name, "output");
        /* backward accumulated into the prefilled gradients: they changed */
        for (int k = 0; k < n->n_in; k++) {
            const struct tr_tensor *t = &s.g->tensors[n->in[k]], *t0 = &twin.g->tensors[n->in[k]];
            if (!t->grad)
                continue;
            expect_finite(t->grad, t->numel, oc->name, "gradient");
            cr_assert(tensor_error(t->grad, t0->grad, t->numel) > 0, "%s: gradient of %s unchanged",
                      oc->name, t->name);
        }
        side_free(&s);
        side_free(&twin);
    }
    tr_cpu_backend_free(&cpu_be);
    tr_cpu_backend_free(&cpu_twin);
}

/* Criterion's main, then exit 77 (SKIP for `make check`) when this machine
 * has no usable GPU, so skipped GPU cases never pass silently. */
int main(int argc, char *argv[])
{
    struct criterion_test_set *tests = criterion_initialize();
    criterion_options.logging_threshold = CRITERION_INFO; /* list each skip and its reason */
    if (!criterion_handle_args(argc, argv, true)) { /* --help, --list, ... */
        criterion_finalize(tests);
        return 0;
    }
    int result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    if (result != 0)
        return result;
    /* after the tests: CUDA must not be initialised in a process that forks them */
    struct tr_backend cuda;
    char why[1100];
    if (open_cuda(&cuda, why, sizeof why) != TR_OK) {
        if (on_cudacpu()) {
            fprintf(stderr, "the CUDA backend of tests/cudacpu does not open: %s\n", why);
            return 1;
        }
        fprintf(stderr, "SKIP: every GPU case of test_backend_ops was skipped: no GPU: %s\n", why);
        return 77;
    }
    tr_backend_close(&cuda);
    return 0;
}
