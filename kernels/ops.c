/*
 * The op table (kernels/ops.h): each op described once, with its shape rule.
 * The shape rules are the graph check's, one function per op or family; the
 * core (core/engine/graph.c) checks a node's output tensor and input count
 * and types against the table, calls the rule, compares the output it
 * declared with the one the rule derives and adds the aux tensors.
 */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- attributes ------------------------------------------------------------ */

#define AT(field) offsetof(struct tr_node, field)

const struct tr_attr_desc tr_attrs[TR_ATTR_COUNT] = {
    [TR_ATTR_EPS] = {"eps", TR_ATTR_OPEN_UNIT, 0, 0, 1e-5, AT(eps), "between 0 and 1"},
    [TR_ATTR_HEADS] = {"heads", TR_ATTR_INT, 0, INT32_MAX, 0, AT(heads), NULL},
    [TR_ATTR_IGNORE_INDEX] = {"ignore_index", TR_ATTR_INT, INT32_MIN, INT32_MAX, -1,
                              AT(ignore_index), NULL},
    [TR_ATTR_TRANS_B] = {"trans_b", TR_ATTR_INT, 0, 1, 0, AT(trans_b), NULL},
    [TR_ATTR_SEGMENT] = {"segment", TR_ATTR_INT, 0, INT32_MAX, 0, AT(segment), NULL},
    /* grouped-query attention: 0 (absent) means as many as heads */
    [TR_ATTR_KV_HEADS] = {"kv_heads", TR_ATTR_INT, 0, INT32_MAX, 0, AT(kv_heads), NULL},
    [TR_ATTR_THETA] = {"theta", TR_ATTR_REAL, 1, 0, 10000.0, AT(theta), NULL},
    [TR_ATTR_SCALE] = {"scale", TR_ATTR_REAL, 0, 0, 1.0, AT(scale), NULL},
    /* convolutions, pooling: 0 (absent) takes the shape rule's default
     * (stride 1 or the window, dilation 1, groups 1) */
    [TR_ATTR_KERNEL] = {"kernel", TR_ATTR_PAIR, 1, 65536, 0, AT(kernel), NULL},
    [TR_ATTR_STRIDE] = {"stride", TR_ATTR_PAIR, 1, 65536, 0, AT(stride), NULL},
    [TR_ATTR_PAD] = {"pad", TR_ATTR_PAIR, 0, 65536, 0, AT(pad), NULL},
    [TR_ATTR_DILATION] = {"dilation", TR_ATTR_PAIR, 1, 65536, 0, AT(dilation), NULL},
    [TR_ATTR_GROUPS] = {"groups", TR_ATTR_INT, 1, INT32_MAX, 0, AT(groups), NULL},
    [TR_ATTR_MOMENTUM] = {"momentum", TR_ATTR_HALF_UNIT, 0, 0, 0.1, AT(momentum),
                          "above 0 and at most 1 (the weight of each batch in the running "
                          "statistics)"},
    [TR_ATTR_BUFFER] = {"buffer", TR_ATTR_TENSOR, 0, 0, -1, AT(buffer), NULL},
    [TR_ATTR_P] = {"p", TR_ATTR_OPEN_UNIT, 0, 0, 0.5, AT(p), "above 0 and below 1"},
    /* absent: no scaling (the rest are read only with a factor; the shape
     * rule checks them together) */
    [TR_ATTR_ROPE_FACTOR] = {"rope_factor", TR_ATTR_REAL64, 0, 0, 0, AT(rope_factor), NULL},
    [TR_ATTR_ROPE_LOW_FREQ_FACTOR] = {"rope_low_freq_factor", TR_ATTR_REAL64, 0, 0, 0,
                                      AT(rope_low_freq_factor), NULL},
    [TR_ATTR_ROPE_HIGH_FREQ_FACTOR] = {"rope_high_freq_factor", TR_ATTR_REAL64, 0, 0, 0,
                                       AT(rope_high_freq_factor), NULL},
    [TR_ATTR_ROPE_ORIGINAL_CTX] = {"rope_original_ctx", TR_ATTR_REAL64, 0, 0, 0,
                                   AT(rope_original_ctx), NULL},
};

/* ---- helpers for the rules -------------------------------------------------- */

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(why, TR_OP_WHY_SIZE, __VA_ARGS__);                                                \
        return -1;                                                                                 \
    } while (0)

static void shape_text(const struct tr_tensor *t, char *buf, size_t size)
{
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < t->ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (len < size)
        snprintf(buf + len, size - len, "]");
}

static int64_t rows_of(const struct tr_tensor *t) /* product of all but the last dim */
{
    return t->ndim ? (int64_t)t->numel / t->shape[t->ndim - 1] : 1;
}

static int64_t last_dim(const struct tr_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

static int same_dims(const struct tr_tensor *a, const struct tr_tensor *b)
{
    int same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    return same;
}

/* The output: ndim dims from shape. */
static int produce(struct tr_op_shape *s, const int64_t *shape, int ndim)
{
    s->ndim = ndim;
    memcpy(s->shape, shape, sizeof(int64_t) * (size_t)ndim);
    return 0;
}

/* A saved tensor for the op's backward, "<node>.<suffix>". */
static void save(struct tr_op_shape *s, const char *suffix, int ndim, const int64_t *shape)
{
    s->aux[s->n_aux].suffix = suffix;
    s->aux[s->n_aux].ndim = ndim;
    memcpy(s->aux[s->n_aux].shape, shape, sizeof(int64_t) * (size_t)ndim);
    s->n_aux++;
}

/* ---- shape rules, in enum order ------------------------------------------- */

static int embedding_shape(const struct tr_graph *g, struct tr_node *n,
                           const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g, (void)n;
    if (in[0]->ndim != 2) {
        char a[64];
        shape_text(in[0], a, sizeof a);
        FAIL("table '%s' %s must be [vocab, dim]", in[0]->name, a);
    }
    if (in[1]->ndim + 1 > TR_MAX_DIMS)
        FAIL("too many dimensions");
    produce(s, in[1]->shape, in[1]->ndim);
    s->shape[s->ndim++] = in[0]->shape[1];
    return 0;
}

static int add_rows_shape(const struct tr_graph *g, struct tr_node *n,
                          const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g, (void)n;
    if (in[0]->ndim != 3 || in[1]->ndim != 2 || in[1]->shape[1] != in[0]->shape[2] ||
        in[1]->shape[0] < in[0]->shape[1]) {
        char a[64], b[64];
        shape_text(in[0], a, sizeof a);
        shape_text(in[1], b, sizeof b);
        FAIL("'%s' %s and '%s' %s: need x[B,T,C] and p[>=T,C]", in[0]->name, a, in[1]->name, b);
    }
    return produce(s, in[0]->shape, 3);
}

static int add_shape(const struct tr_graph *g, struct tr_node *n,
                     const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g, (void)n;
    if (!same_dims(in[0], in[1])) {
        char a[64], b[64];
        shape_text(in[0], a, sizeof a);
        shape_text(in[1], b, sizeof b);
        FAIL("'%s' %s and '%s' %s differ in shape", in[0]->name, a, in[1]->name, b);
    }
    return produce(s, in[0]->shape, in[0]->ndim);
}

static int linear_shape(const struct tr_graph *g, struct tr_node *n,
                        const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g;
    char a[64], b[64];
    shape_text(in[0], a, sizeof a);
    shape_text(in[1], b, sizeof b);
    if (in[1]->ndim != 2)
        FAIL("weight '%s' %s must be w[out, in] (y = x w^T)", in[1]->name, b);
    if (in[1]->shape[1] != last_dim(in[0]))
        FAIL("input '%s' %s has %lld features but weight '%s' %s expects %lld", in[0]->name, a,
             (long long)last_dim(in[0]), in[1]->name, b, (long long)in[1]->shape[1]);
    produce(s, in[0]->shape, in[0]->ndim);
    s->shape[in[0]->ndim - 1] = in[1]->shape[0];
    /* b: a bias [out], or an addend of the output's shape (tr_linear_addend) */
    int addend = n->n_in == 3 && in[2]->ndim == s->ndim && s->ndim >= 2;
    for (int d = 0; addend && d < s->ndim; d++)
        addend = in[2]->shape[d] == s->shape[d];
    if (n->n_in == 3 && !addend && (in[2]->ndim != 1 || in[2]->shape[0] != in[1]->shape[0])) {
        char b[64], o[64];
        struct tr_tensor out = {.ndim = s->ndim};
        memcpy(out.shape, s->shape, sizeof out.shape);
        shape_text(in[2], b, sizeof b);
        shape_text(&out, o, sizeof o);
        FAIL("bias '%s' %s must be [%lld], one per output feature of weight '%s', or an addend "
             "of the output's shape %s", in[2]->name, b, (long long)in[1]->shape[0], in[1]->name,
             o);
    }
    return 0;
}

static int matmul_shape(const struct tr_graph *g, struct tr_node *n,
                        const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g;
    int nd = in[0]->ndim;
    if ((nd != 2 && nd != 3) || in[1]->ndim != nd || (nd == 3 && in[0]->shape[0] != in[1]->shape[0]))
        FAIL("needs a[M,K] b[K,N] or a[batch,M,K] b[batch,K,N]");
    int64_t K = in[0]->shape[nd - 1];
    int64_t bk = n->trans_b ? in[1]->shape[nd - 1] : in[1]->shape[nd - 2];
    int64_t N = n->trans_b ? in[1]->shape[nd - 2] : in[1]->shape[nd - 1];
    if (bk != K) {
        char a[64], b[64];
        shape_text(in[0], a, sizeof a);
        shape_text(in[1], b, sizeof b);
        FAIL("inner dimensions differ: '%s' %s and '%s' %s%s", in[0]->name, a, in[1]->name, b,
             n->trans_b ? " (b transposed)" : "");
    }
    produce(s, in[0]->shape, nd);
    s->shape[nd - 1] = N;
    return 0;
}

static int layernorm_shape(const struct tr_graph *g, struct tr_node *n,
                           const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g;
    int64_t C = last_dim(in[0]);
    if (in[1]->numel != (size_t)C || in[2]->numel != (size_t)C) {
        char a[64], b[64], c[64];
        shape_text(in[0], a, sizeof a);
        shape_text(in[1], b, sizeof b);
        shape_text(in[2], c, sizeof c);
        FAIL("weight '%s' %s and bias '%s' %s must have %lld elements each (the last dimension "
             "of '%s' %s)", in[1]->name, b, in[2]->name, c, (long long)C, in[0]->name, a);
    }
    int64_t rows = rows_of(in[0]);
    if (n->eps <= 0)
        n->eps = 1e-5f;
    produce(s, in[0]->shape, in[0]->ndim);
    save(s, "mean", 1, &rows);
    save(s, "rstd", 1, &rows);
    return 0;
}

/* gelu, relu: elementwise, the input's shape */
static int same_shape(const struct tr_graph *g, struct tr_node *n,
                      const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g, (void)n, (void)why;
    return produce(s, in[0]->shape, in[0]->ndim);
}

/* Attention with separate q[B,T,H*D], k[B,T,KV*D], v[B,T,KV*D]: query head h
 * reads key/value head h / (H/KV) (grouped-query; KV = H is multi-head,
 * KV = 1 multi-query).  kv_heads 0 means as many as heads. */
static int gqa_shape(struct tr_node *n, const struct tr_tensor *const in[3],
                     struct tr_op_shape *s, char *why)
{
    char a[64], b[64], c[64];
    shape_text(in[0], a, sizeof a);
    shape_text(in[1], b, sizeof b);
    shape_text(in[2], c, sizeof c);
    if (in[0]->ndim != 3 || in[1]->ndim != 3 || in[2]->ndim != 3)
        FAIL("q '%s' %s, k '%s' %s and v '%s' %s must each be [B,T,heads*D]", in[0]->name, a,
             in[1]->name, b, in[2]->name, c);
    for (int d = 0; d < 2; d++)
        if (in[1]->shape[d] != in[0]->shape[d] || in[2]->shape[d] != in[0]->shape[d])
            FAIL("q '%s' %s, k '%s' %s and v '%s' %s differ in batch or sequence length",
                 in[0]->name, a, in[1]->name, b, in[2]->name, c);
    int64_t W = in[0]->shape[2];
    if (n->heads <= 0 || W % n->heads != 0)
        FAIL("%d heads do not divide the width %lld of q '%s'", n->heads, (long long)W,
             in[0]->name);
    if (n->kv_heads == 0)
        n->kv_heads = n->heads;
    if (n->kv_heads < 0 || n->heads % n->kv_heads != 0)
        FAIL("%d key/value heads do not divide the %d heads; each key/value head serves "
             "a whole group of query heads", n->kv_heads, n->heads);
    int64_t D = W / n->heads, KVW = (int64_t)n->kv_heads * D;
    if (in[1]->shape[2] != KVW || in[2]->shape[2] != KVW)
        FAIL("k '%s' %s and v '%s' %s must be %lld wide (kv_heads %d x head dim %lld) to go "
             "with q '%s' %s over %d heads", in[1]->name, b, in[2]->name, c, (long long)KVW,
             n->kv_heads, (long long)D, in[0]->name, a, n->heads);
    produce(s, in[0]->shape, 3);
    int64_t lse[3] = {in[0]->shape[0], n->heads, in[0]->shape[1]};
    save(s, "lse", 3, lse);
    return 0;
}

static int attention_shape(const struct tr_graph *g, struct tr_node *n,
                           const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g;
    if (n->n_in == 3)
        return gqa_shape(n, in, s, why);
    if (n->kv_heads != 0 && n->kv_heads != n->heads)
        FAIL("packed qkv attention has as many key/value heads as heads (%d), not %d; "
             "give q, k and v separately for grouped-query attention", n->heads, n->kv_heads);
    n->kv_heads = n->heads;
    if (in[0]->ndim != 3 || in[0]->shape[2] % 3 != 0) {
        char a[64];
        shape_text(in[0], a, sizeof a);
        FAIL("input '%s' %s must be qkv[B,T,3C] (q, k and v packed)", in[0]->name, a);
    }
    int64_t C = in[0]->shape[2] / 3;
    if (n->heads <= 0 || C % n->heads != 0)
        FAIL("%d heads do not divide the width %lld", n->heads, (long long)C);
    int64_t out[3] = {in[0]->shape[0], in[0]->shape[1], C};
    produce(s, out, 3);
    /* log-sum-exp of each query row's scaled causal scores: the backward
     * recomputes the probabilities from q, k and it */
    int64_t lse[3] = {in[0]->shape[0], n->heads, in[0]->shape[1]};
    save(s, "lse", 3, lse);
    return 0;
}

static int cross_entropy_shape(const struct tr_graph *g, struct tr_node *n,
                               const struct tr_tensor *const in[3], struct tr_op_shape *s,
                               char *why)
{
    (void)g, (void)n;
    int64_t rows = rows_of(in[0]);
    if ((int64_t)in[1]->numel != rows) {
        char a[64], b[64];
        shape_text(in[0], a, sizeof a);
        shape_text(in[1], b, sizeof b);
        FAIL("logits '%s' %s have %lld rows but targets '%s' %s have %zu", in[0]->name, a,
             (long long)rows, in[1]->name, b, in[1]->numel);
    }
    int64_t one = 1;
    produce(s, &one, 1);
    save(s, "lse", 1, &rows);
    return 0;
}

static int rmsnorm_shape(const struct tr_graph *g, struct tr_node *n,
                         const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g;
    int64_t C = last_dim(in[0]);
    if (in[1]->numel != (size_t)C) {
        char a[64], b[64];
        shape_text(in[1], a, sizeof a);
        shape_text(in[0], b, sizeof b);
        FAIL("weight '%s' %s must have %lld elements (the last dimension of '%s' %s)", in[1]->name,
             a, (long long)C, in[0]->name, b);
    }
    int64_t rows = rows_of(in[0]);
    if (!(n->eps > 0)) /* NaN too */
        n->eps = 1e-5f;
    produce(s, in[0]->shape, in[0]->ndim);
    save(s, "rstd", 1, &rows);
    return 0;
}

static int rope_shape(const struct tr_graph *g, struct tr_node *n,
                      const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g;
    if (in[0]->ndim != 3) {
        char a[64];
        shape_text(in[0], a, sizeof a);
        FAIL("input '%s' %s must be x[B,T,heads*D]", in[0]->name, a);
    }
    int64_t W = in[0]->shape[2];
    if (n->heads <= 0 || W % n->heads != 0)
        FAIL("%d heads do not divide the width %lld of '%s'", n->heads, (long long)W, in[0]->name);
    if ((W / n->heads) % 2 != 0)
        FAIL("head dim %lld of '%s' (%lld wide over %d heads) is odd; rotary embedding turns "
             "pairs of channels (i, i+D/2), so it needs an even head dim",
             (long long)(W / n->heads), in[0]->name, (long long)W, n->heads);
    if (!(n->theta > 0) || !isfinite(n->theta))
        FAIL("theta %g must be a finite number above 0 (10000 in Llama 2)", (double)n->theta);
    if (n->rope_factor != 0) { /* Llama 3.1's scaling: as transformers validates it, and more */
        if (!(n->rope_factor >= 1) || !isfinite(n->rope_factor))
            FAIL("rope_factor %g must be a finite number from 1 (0: no scaling)", n->rope_factor);
        if (!(n->rope_low_freq_factor > 0) ||
            !(n->rope_high_freq_factor > n->rope_low_freq_factor) ||
            !isfinite(n->rope_high_freq_factor))
            FAIL("rope_low_freq_factor %g and rope_high_freq_factor %g must be finite, above 0 "
                 "and the high one above the low one (Llama 3.1: 1 and 4)",
                 n->rope_low_freq_factor, n->rope_high_freq_factor);
        if (!(n->rope_original_ctx >= 1) || n->rope_original_ctx > 16777216.0 ||
            n->rope_original_ctx != floor(n->rope_original_ctx))
            FAIL("rope_original_ctx %g must be a whole number from 1 to 16777216 (Llama 3.1: 8192)",
                 n->rope_original_ctx);
    } else if (n->rope_low_freq_factor != 0 || n->rope_high_freq_factor != 0 ||
               n->rope_original_ctx != 0) {
        FAIL("rope_low_freq_factor, rope_high_freq_factor and rope_original_ctx need a "
             "rope_factor (Llama 3.1's scaling)");
    }
    return produce(s, in[0]->shape, 3);
}

static int swiglu_shape(const struct tr_graph *g, struct tr_node *n,
                        const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g, (void)n;
    if (!same_dims(in[0], in[1])) {
        char a[64], b[64];
        shape_text(in[0], a, sizeof a);
        shape_text(in[1], b, sizeof b);
        FAIL("gate '%s' %s and up '%s' %s differ in shape", in[0]->name, a, in[1]->name, b);
    }
    return produce(s, in[0]->shape, in[0]->ndim);
}

static int scale_shape(const struct tr_graph *g, struct tr_node *n,
                       const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g;
    if (!isfinite(n->scale))
        FAIL("scale %g is not a finite number", (double)n->scale);
    return produce(s, in[0]->shape, in[0]->ndim);
}

/* A spatial attribute pair as "3x3", for messages. */
#define PAIR(p) (p)[0], (p)[1]

/* Output size of one spatial dimension (the contract's formula), or 0 when
 * the window does not fit in the padded input. */
static int64_t window_out(int64_t in, int k, int stride, int pad, int dilation)
{
    int64_t span = (int64_t)dilation * (k - 1) + 1, padded = in + 2 * (int64_t)pad;
    return padded < span ? 0 : (padded - span) / stride + 1;
}

/* conv2d's weight w[OC,KH,KW,IC/groups] against x's C channels: the groups,
 * the window (the weight's), and the defaults stride 1, dilation 1. */
static int conv_weight(struct tr_node *n, const struct tr_tensor *const in[3], int64_t C,
                       char *why)
{
    char b[64];
    shape_text(in[1], b, sizeof b);
    if (in[1]->ndim != 4)
        FAIL("weight '%s' %s must be w[OC,KH,KW,IC/groups]", in[1]->name, b);
    if (n->groups == 0)
        n->groups = 1;
    if (n->groups < 0 || C % n->groups != 0 || in[1]->shape[0] % n->groups != 0)
        FAIL("%d groups must divide the %lld input channels of '%s' and the %lld output "
             "channels of '%s'", n->groups, (long long)C, in[0]->name,
             (long long)in[1]->shape[0], in[1]->name);
    if (in[1]->shape[3] != C / n->groups)
        FAIL("weight '%s' %s must have %lld input channels (the %lld of '%s' over %d "
             "groups) in its last dimension", in[1]->name, b, (long long)(C / n->groups),
             (long long)C, in[0]->name, n->groups);
    int64_t OC = in[1]->shape[0];
    if (n->n_in == 3 && (in[2]->ndim != 1 || in[2]->shape[0] != OC))
        FAIL("bias '%s' must be [%lld]", in[2]->name, (long long)OC);
    for (int d = 0; d < 2; d++) {
        if (in[1]->shape[1 + d] > INT32_MAX)
            FAIL("weight '%s' %s: a window of more than %d", in[1]->name, b, INT32_MAX);
        if (n->kernel[d] != 0 && n->kernel[d] != in[1]->shape[1 + d])
            FAIL("kernel %dx%d differs from the window of weight '%s' %s", PAIR(n->kernel),
                 in[1]->name, b);
        n->kernel[d] = (int)in[1]->shape[1 + d]; /* the weight's window */
        if (n->stride[d] == 0)
            n->stride[d] = 1;
        if (n->dilation[d] == 0)
            n->dilation[d] = 1;
    }
    return 0;
}

/* Pooling's window: at least 1 on each side, stride the window unless
 * given, dilation 1, padding at most half the window (as PyTorch), so no
 * max window is all padding. */
static int pool_window(struct tr_node *n, char *why)
{
    for (int d = 0; d < 2; d++) {
        if (n->kernel[d] < 1)
            FAIL("needs a window: kernel %dx%d (1 or more on each side)", PAIR(n->kernel));
        if (n->stride[d] == 0)
            n->stride[d] = n->kernel[d];
        n->dilation[d] = 1;
        if (n->pad[d] > n->kernel[d] / 2)
            FAIL("padding %dx%d is more than half the window %dx%d", PAIR(n->pad), PAIR(n->kernel));
    }
    n->groups = 1;
    return 0;
}

/* conv2d, maxpool and avgpool: channel-last x[B,H,W,C] under a window.
 * Defaults (an attribute left 0): stride 1 for a convolution and the
 * window for pooling (non-overlapping, as PyTorch), dilation 1, groups 1. */
static int window_shape(const struct tr_graph *g, struct tr_node *n,
                        const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    (void)g;
    char a[64];
    shape_text(in[0], a, sizeof a);
    if (in[0]->ndim != 4)
        FAIL("input '%s' %s must be an image batch x[B,H,W,C] (channel-last)", in[0]->name, a);
    int64_t C = in[0]->shape[3], OC = C;
    if (n->op == TR_OP_CONV2D) {
        if (conv_weight(n, in, C, why) != 0)
            return -1;
        OC = in[1]->shape[0];
    } else if (pool_window(n, why) != 0) {
        return -1;
    }
    int64_t out[2];
    for (int d = 0; d < 2; d++) {
        if (n->stride[d] < 1 || n->pad[d] < 0 || n->dilation[d] < 1)
            FAIL("stride %dx%d, padding %dx%d and dilation %dx%d: strides and dilations are "
                 "1 or more, padding 0 or more", PAIR(n->stride), PAIR(n->pad), PAIR(n->dilation));
        out[d] = window_out(in[0]->shape[1 + d], n->kernel[d], n->stride[d], n->pad[d],
                            n->dilation[d]);
        if (out[d] < 1)
            FAIL("the window %dx%d (dilation %dx%d) does not fit input '%s' %s padded by "
                 "%dx%d; use a smaller window or more padding", PAIR(n->kernel),
                 PAIR(n->dilation), in[0]->name, a, PAIR(n->pad));
    }
    int64_t shape[4] = {in[0]->shape[0], out[0], out[1], OC};
    return produce(s, shape, 4);
}

static int global_avgpool_shape(const struct tr_graph *g, struct tr_node *n,
                                const struct tr_tensor *const in[3], struct tr_op_shape *s,
                                char *why)
{
    (void)g, (void)n;
    if (in[0]->ndim != 4) {
        char a[64];
        shape_text(in[0], a, sizeof a);
        FAIL("input '%s' %s must be an image batch x[B,H,W,C]", in[0]->name, a);
    }
    int64_t out[2] = {in[0]->shape[0], in[0]->shape[3]};
    return produce(s, out, 2);
}

/* batchnorm: x[...,C], w[C], b[C], and its running statistics, a buffer
 * running[2,C] (mean, then variance) that no other node updates. */
static int batchnorm_shape(const struct tr_graph *g, struct tr_node *n,
                           const struct tr_tensor *const in[3], struct tr_op_shape *s, char *why)
{
    char a[64];
    int64_t C = last_dim(in[0]);
    shape_text(in[0], a, sizeof a);
    if (in[0]->ndim < 2)
        FAIL("input '%s' %s must have a batch dimension and channels last", in[0]->name, a);
    if (in[1]->numel != (size_t)C || in[2]->numel != (size_t)C)
        FAIL("weight '%s' and bias '%s' must have %lld elements (the channels of '%s' %s)",
             in[1]->name, in[2]->name, (long long)C, in[0]->name, a);
    if (n->buffer < 0 || n->buffer >= g->n_tensors)
        FAIL("needs its running statistics: a buffer tensor running[2,%lld] (the buffer "
             "attribute)", (long long)C);
    const struct tr_tensor *buf = &g->tensors[n->buffer];
    if (buf->role != TR_ROLE_BUFFER)
        FAIL("'%s' is not a buffer; its running statistics must be a buffer tensor "
             "running[2,%lld] (the buffer attribute; g:buffer in a recipe)", buf->name,
             (long long)C);
    if (buf->ndim != 2 || buf->shape[0] != 2 || buf->shape[1] != C) {
        shape_text(buf, a, sizeof a);
        FAIL("buffer '%s' %s must be [2,%lld]: the running mean and variance of each "
             "channel", buf->name, a, (long long)C);
    }
    for (const struct tr_node *o = g->nodes; o < n; o++)
        if (o->op == TR_OP_BATCHNORM && o->buffer == n->buffer)
            FAIL("buffer '%s' is already the running statistics of '%s'; each batchnorm "
                 "needs its own", buf->name, o->name);
    if (!(n->eps > 0)) /* NaN too */
        n->eps = 1e-5f;
    if (n->momentum == 0)
        n->momentum = 0.1f;
    if (!(n->momentum > 0 && n->momentum <= 1))
        FAIL("momentum %g must be above 0 and at most 1 (the weight of each batch in the "
             "running statistics; 0.1 in PyTorch)", (double)n->momentum);
    produce(s, in[0]->shape, in[0]->ndim);
    save(s, "mean", 1, &C);
    save(s, "rstd", 1, &C);
    return 0;
}

/* ---- the table -------------------------------------------------------------- */

#define BOTH (TR_ON_CPU | TR_ON_CUDA)
#define A(x) TR_ATTR(TR_ATTR_##x)

/* name, min_in, max_in, arity, in_counts, inputs, int_inputs, grad_inputs,
 * attrs, shape, backends, lua (kernels/ops.h says what each means) */
const struct tr_op_desc tr_ops[TR_OP_COUNT] = {
    [TR_OP_EMBEDDING] = {"embedding", 2, 2, NULL, 0, {"table", "idx"}, 1u << 1, 1u << 0, 0,
                         embedding_shape, BOTH, "Graph:embedding"},
    [TR_OP_ADD_ROWS] = {"add_rows", 2, 2, NULL, 0, {"x", "p"}, 0, 3u, 0, add_rows_shape, BOTH,
                        "Graph:add_rows"},
    /* backward: dout to both inputs, reading neither */
    [TR_OP_ADD] = {"add", 2, 2, NULL, 0, {"a", "b"}, 0, 3u, 0, add_shape, BOTH, "Graph:add",
                   3u | TR_BWD_OUT},
    /* backward reads x and w (dx = dout w, dw = dout^T x), not b or the output */
    [TR_OP_LINEAR] = {"linear", 2, 3, NULL, 0, {"x", "w", "b"}, 0, 7u, 0, linear_shape, BOTH,
                      "Graph:linear, Graph:Linear", 4u | TR_BWD_OUT},
    [TR_OP_MATMUL] = {"matmul", 2, 2, NULL, 0, {"a", "b"}, 0, 3u, A(TRANS_B), matmul_shape, BOTH,
                      "Graph:matmul"},
    [TR_OP_LAYERNORM] = {"layernorm", 3, 3, NULL, 0, {"x", "w", "b"}, 0, 7u, A(EPS),
                         layernorm_shape, BOTH, "Graph:layernorm, Graph:LayerNorm"},
    [TR_OP_GELU] = {"gelu", 1, 1, NULL, 0, {"x"}, 0, 1u, 0, same_shape, BOTH, "Graph:gelu"},
    [TR_OP_RELU] = {"relu", 1, 1, NULL, 0, {"x"}, 0, 1u, 0, same_shape, BOTH, "Graph:relu"},
    [TR_OP_ATTENTION] = {"attention", 1, 3, "takes 1 input (packed qkv) or 3 (q, k, v)",
                         (1u << 1) | (1u << 3), {"qkv or q", "k", "v"}, 0, 7u,
                         A(HEADS) | A(KV_HEADS), attention_shape, BOTH,
                         "Graph:attention, Graph:gqa_attention"},
    [TR_OP_CROSS_ENTROPY] = {"cross_entropy", 2, 2, NULL, 0, {"logits", "targets"}, 1u << 1,
                             1u << 0, A(IGNORE_INDEX), cross_entropy_shape, BOTH,
                             "Graph:cross_entropy"},
    [TR_OP_RMSNORM] = {"rmsnorm", 2, 2, NULL, 0, {"x", "w"}, 0, 3u, A(EPS), rmsnorm_shape, BOTH,
                       "Graph:rmsnorm, Graph:RMSNorm"},
    [TR_OP_ROPE] = {"rope", 1, 1, NULL, 0, {"x"}, 0, 1u, A(HEADS) | A(THETA) | A(ROPE_FACTOR) |
                    A(ROPE_LOW_FREQ_FACTOR) | A(ROPE_HIGH_FREQ_FACTOR) | A(ROPE_ORIGINAL_CTX), rope_shape, BOTH,
                    "Graph:rope"},
    [TR_OP_SWIGLU] = {"swiglu", 2, 2, NULL, 0, {"gate", "up"}, 0, 3u, 0, swiglu_shape, BOTH,
                      "Graph:swiglu"},
    [TR_OP_SCALE] = {"scale", 1, 1, NULL, 0, {"x"}, 0, 1u, A(SCALE), scale_shape, BOTH,
                     "Graph:scale", 1u | TR_BWD_OUT},
    [TR_OP_CONV2D] = {"conv2d", 2, 3, NULL, 0, {"x", "w", "b"}, 0, 7u,
                      A(KERNEL) | A(STRIDE) | A(PAD) | A(DILATION) | A(GROUPS), window_shape,
                      BOTH, "Graph:conv2d, Graph:Conv2d"},
    [TR_OP_MAXPOOL] = {"maxpool", 1, 1, NULL, 0, {"x"}, 0, 1u, A(KERNEL) | A(STRIDE) | A(PAD),
                       window_shape, BOTH, "Graph:maxpool"},
    [TR_OP_AVGPOOL] = {"avgpool", 1, 1, NULL, 0, {"x"}, 0, 1u, A(KERNEL) | A(STRIDE) | A(PAD),
                       window_shape, BOTH, "Graph:avgpool"},
    [TR_OP_GLOBAL_AVGPOOL] = {"global_avgpool", 1, 1, NULL, 0, {"x"}, 0, 1u, 0,
                              global_avgpool_shape, BOTH, "Graph:global_avgpool"},
    [TR_OP_BATCHNORM] = {"batchnorm", 3, 3, NULL, 0, {"x", "w", "b"}, 0, 7u,
                         A(EPS) | A(MOMENTUM) | A(BUFFER), batchnorm_shape, BOTH,
                         "Graph:batchnorm, Graph:BatchNorm"},
    [TR_OP_DROPOUT] = {"dropout", 1, 1, NULL, 0, {"x"}, 0, 1u, A(P), same_shape, BOTH,
                       "Graph:dropout", 1u | TR_BWD_OUT},
};

int tr_op_grad_is_dout(const struct tr_graph *g, const struct tr_node *n, int k)
{
    if (n->op == TR_OP_ADD)
        return k == 0 || k == 1;
    return k == 2 && tr_linear_addend(g, n);
}

/* The ops of language models run in windows (sample's key/value cache);
 * matmul's rows mix over its batch dimension, the image ops have none */
static const unsigned char rows_rules[TR_OP_COUNT] = {
    [TR_OP_EMBEDDING] = TR_ROWS_VIEW,   [TR_OP_ADD_ROWS] = TR_ROWS_TABLE,
    [TR_OP_ADD] = TR_ROWS_VIEW,         [TR_OP_LINEAR] = TR_ROWS_VIEW,
    [TR_OP_LAYERNORM] = TR_ROWS_VIEW,   [TR_OP_GELU] = TR_ROWS_VIEW,
    [TR_OP_RELU] = TR_ROWS_VIEW,        [TR_OP_ATTENTION] = TR_ROWS_WHOLE,
    [TR_OP_RMSNORM] = TR_ROWS_VIEW,     [TR_OP_ROPE] = TR_ROWS_POSITION,
    [TR_OP_SWIGLU] = TR_ROWS_VIEW,      [TR_OP_SCALE] = TR_ROWS_VIEW,
    [TR_OP_DROPOUT] = TR_ROWS_VIEW,
};

enum tr_rows_rule tr_op_rows(enum tr_op op)
{
    return (unsigned)op < TR_OP_COUNT ? (enum tr_rows_rule)rows_rules[op] : TR_ROWS_NONE;
}

const struct tr_op_desc *tr_op_desc(enum tr_op op)
{
    return (unsigned)op < TR_OP_COUNT ? &tr_ops[op] : NULL;
}

int tr_op_check(const struct tr_graph *g, struct tr_node *n, const struct tr_tensor *const in[3],
                struct tr_op_shape *s, char *why)
{
    const struct tr_op_desc *op = tr_op_desc(n->op);
    memset(s, 0, sizeof *s);
    if (!op)
        FAIL("unknown op");
    if (n->n_in < op->min_in || n->n_in > op->max_in)
        FAIL("takes %d input(s), got %d", op->min_in, n->n_in);
    if (op->arity && !(op->in_counts & (1u << n->n_in)))
        FAIL("%s, got %d", op->arity, n->n_in);
    for (int k = 0; k < n->n_in; k++) {
        int wants_int = (op->int_inputs >> k) & 1u;
        if (wants_int != (in[k]->dtype == TR_I32))
            FAIL("input '%s' must be %s", in[k]->name, wants_int ? "integer ids" : "floating point");
    }
    return op->shape(g, n, in, s, why);
}

unsigned tr_op_backend_bit(const char *name)
{
    static const struct {
        const char *name;
        unsigned bit;
    } known[] = {{"cpu", TR_ON_CPU}, {"cuda", TR_ON_CUDA}};
    for (size_t i = 0; name && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(known[i].name, name) == 0)
            return known[i].bit;
    return 0;
}
