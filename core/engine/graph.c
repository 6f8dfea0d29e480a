/* The static graph: shape checking, the one-time memory plan,
 * initialisation and execution (forward, backward). It stays one file over
 * ~700 lines because all four walk the same node list and tensor table with
 * the same rules, and the plan decides where execution finds each buffer. */
#include "graph.h"

#include "../util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The op table (kernels/ops.h) names every op. */
const char *tr_op_name(enum tr_op op) { return (unsigned)op < TR_OP_COUNT ? tr_ops[op].name : "?"; }

int tr_op_from_name(const char *name, enum tr_op *out)
{
    for (int i = 0; i < TR_OP_COUNT; i++)
        if (strcmp(tr_ops[i].name, name) == 0) {
            *out = (enum tr_op)i;
            return 1;
        }
    return 0;
}

static size_t dtype_size(enum tr_dtype t) { return (t == TR_BF16 || t == TR_F16) ? 2 : 4; }

/* Sizes a model may reach.  The kernels take dimensions and row counts as
 * int; a tensor of 2^40 elements (4 TiB in fp32) and 2^44 parameters are far
 * past any device, so a plan that reaches them is a typo, not a model. */
#define DIM_MAX 2147483647LL
#define TENSOR_MAX_NUMEL ((size_t)1 << 40)
#define PARAMS_MAX ((size_t)1 << 44)

/* a + b, or SIZE_MAX when it does not fit: a plan's sums never wrap. */
static size_t sat_add(size_t a, size_t b)
{
    size_t r;
    return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

static size_t sat_mul(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

struct tr_graph *tr_graph_new(int batch)
{
    struct tr_graph *g = tr_xcalloc(1, sizeof *g);
    g->batch = batch;
    g->training = 1;
    g->loss = -1;
    g->logits = -1;
    return g;
}

int tr_graph_add_tensor(struct tr_graph *g, const char *name, enum tr_role role,
                        enum tr_dtype dtype, int ndim, const int64_t *shape)
{
    g->tensors = tr_xrealloc(g->tensors, (size_t)(g->n_tensors + 1) * sizeof *g->tensors);
    struct tr_tensor *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = tr_xstrdup(name);
    t->role = role;
    t->dtype = dtype;
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim && i < TR_MAX_DIMS; i++) {
        t->shape[i] = shape[i];
        /* saturates on overflow (or a negative dim): tr_graph_check refuses it */
        t->numel = shape[i] < 0 ? SIZE_MAX : sat_mul(t->numel, (size_t)shape[i]);
    }
    t->producer = -1;
    t->decay = role == TR_ROLE_PARAM && ndim >= 2;
    return g->n_tensors++;
}

int tr_graph_add_node(struct tr_graph *g, const struct tr_node *node)
{
    g->nodes = tr_xrealloc(g->nodes, (size_t)(g->n_nodes + 1) * sizeof *g->nodes);
    g->nodes[g->n_nodes] = *node;
    g->nodes[g->n_nodes].name = tr_xstrdup(node->name ? node->name : tr_op_name(node->op));
    return g->n_nodes++;
}

int tr_graph_find(const struct tr_graph *g, const char *name)
{
    for (int i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return i;
    return -1;
}

/* ---- shape checking ---------------------------------------------------- */

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

static int add_aux(struct tr_graph *g, struct tr_node *n, const char *suffix, int ndim,
                   const int64_t *shape)
{
    char *name = tr_xasprintf("%s.%s", n->name, suffix);
    int id = tr_graph_add_tensor(g, name, TR_ROLE_SAVED, TR_F32, ndim, shape);
    free(name);
    g->tensors[id].producer = (int)(n - g->nodes);
    n->aux[n->n_aux++] = id;
    return id;
}

#define SHAPE_FAIL(...)                                                                            \
    do {                                                                                           \
        char msg_[600];                                                                            \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                  \
        return tr_fail(err, "%s '%s': %s", tr_op_name(n->op), n->name, msg_);                    \
    } while (0)

static int expect_shape(struct tr_graph *g, struct tr_node *n, const int64_t *shape, int ndim,
                        tr_err *err)
{
    struct tr_tensor *out = &g->tensors[n->out];
    int same = out->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = out->shape[i] == shape[i];
    if (!same) {
        struct tr_tensor want = {.ndim = ndim};
        memcpy(want.shape, shape, sizeof(int64_t) * (size_t)ndim);
        char a[64], b[64];
        shape_text(out, a, sizeof a);
        shape_text(&want, b, sizeof b);
        SHAPE_FAIL("output '%s' is declared %s but the op produces %s", out->name, a, b);
    }
    return TR_OK;
}

/* A node against its op's description (kernels/ops.h): the number and
 * kinds of its inputs, then the op's shape rule, whose output must be the
 * one the node declares; the rule's saved tensors are added here. */
static int check_node(struct tr_graph *g, struct tr_node *n, tr_err *err)
{
    struct tr_tensor *in[3] = {NULL, NULL, NULL};
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] < 0 || n->in[k] >= g->n_tensors)
            SHAPE_FAIL("input %d is not a tensor of this graph", k + 1);
        in[k] = &g->tensors[n->in[k]];
    }
    const struct tr_op_desc *op = tr_op_desc(n->op);
    if (!op)
        SHAPE_FAIL("unknown op");
    if (n->n_in < op->min_in || n->n_in > op->max_in)
        SHAPE_FAIL("takes %d input(s), got %d", op->min_in, n->n_in);
    if (op->arity && !(op->in_counts & (1u << n->n_in)))
        SHAPE_FAIL("%s, got %d", op->arity, n->n_in);
    for (int k = 0; k < n->n_in; k++) {
        int wants_int = (op->int_inputs >> k) & 1u;
        if (wants_int != (in[k]->dtype == TR_I32))
            SHAPE_FAIL("input '%s' must be %s", in[k]->name, wants_int ? "integer ids" : "floating point");
    }
    struct tr_op_shape s;
    memset(&s, 0, sizeof s);
    char why[TR_OP_WHY_SIZE];
    if (op->shape(g, n, (const struct tr_tensor *const *)in, &s, why) != 0)
        SHAPE_FAIL("%s", why);
    if (expect_shape(g, n, s.shape, s.ndim, err) != TR_OK)
        return TR_ERROR;
    for (int i = 0; i < s.n_aux; i++) /* may grow g->tensors */
        add_aux(g, n, s.aux[i].suffix, s.aux[i].ndim, s.aux[i].shape);
    return TR_OK;
}

/* Every tensor's dimensions, elements and rows within what the kernels and
 * the memory plan compute with, checked before any product is formed. */
static int check_sizes(const struct tr_graph *g, tr_err *err)
{
    size_t params = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        const char *lower = t->role == TR_ROLE_PARAM
                                ? "the model's sizes (model.dim, model.vocab, ...)"
                                : "train.micro_batch or the model's sizes (model.ctx, model.dim, ...)";
        char a[160];
        shape_text(t, a, sizeof a);
        if (t->ndim < 1 || t->ndim > TR_MAX_DIMS)
            return tr_fail(err, "tensor '%s' has %d dimensions (1 to %d)", t->name, t->ndim,
                           TR_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 1 || t->shape[d] > DIM_MAX)
                return tr_fail(err, "tensor '%s' %s: dimension %d is %lld, must be between 1 and "
                               "%lld; lower %s", t->name, a, d + 1, (long long)t->shape[d],
                               DIM_MAX, lower);
        if (t->numel > TENSOR_MAX_NUMEL)
            return tr_fail(err, "tensor '%s' %s has more than %zu elements (2^40); lower %s",
                           t->name, a, TENSOR_MAX_NUMEL, lower);
        if (rows_of(t) > DIM_MAX)
            return tr_fail(err, "tensor '%s' %s has %lld rows, more than the kernels' %lld; "
                           "lower %s", t->name, a, (long long)rows_of(t), DIM_MAX, lower);
        if (t->role == TR_ROLE_PARAM) {
            params += t->numel; /* <= 2^44 + 2^40 here: cannot wrap */
            if (params > PARAMS_MAX)
                return tr_fail(err, "the model has more than %zu parameters (2^44) by tensor '%s' "
                               "%s; lower the model's sizes (model.dim, model.layers, ...)",
                               PARAMS_MAX, t->name, a);
        }
    }
    return TR_OK;
}

int tr_graph_check(struct tr_graph *g, tr_err *err)
{
    if (check_sizes(g, err) != TR_OK)
        return TR_ERROR;
    for (int i = 0; i < g->n_nodes; i++) {
        struct tr_node *n = &g->nodes[i];
        if (n->out < 0 || n->out >= g->n_tensors)
            return tr_fail(err, "%s '%s' has no output tensor", tr_op_name(n->op), n->name);
        const struct tr_tensor *out = &g->tensors[n->out];
        if (out->producer >= 0 || out->role != TR_ROLE_ACTIVATION)
            return tr_fail(err, "%s '%s': output '%s' is not a fresh activation",
                           tr_op_name(n->op), n->name, out->name);
        for (int k = 0; k < n->n_in; k++) {
            int t = n->in[k];
            if (t >= 0 && t < g->n_tensors && g->tensors[t].role == TR_ROLE_ACTIVATION &&
                g->tensors[t].producer < 0)
                return tr_fail(err, "%s '%s': input '%s' is used before any op produces it",
                               tr_op_name(n->op), n->name, g->tensors[t].name);
            /* a buffer is state its own batchnorm reads and updates; as an
             * input it would be read while that node changes it */
            if (t >= 0 && t < g->n_tensors && g->tensors[t].role == TR_ROLE_BUFFER)
                return tr_fail(err, "%s '%s': input '%s' is a buffer (running statistics); only "
                               "batchnorm reads it, through its buffer attribute",
                               tr_op_name(n->op), n->name, g->tensors[t].name);
        }
        n->n_aux = 0;
        if (check_node(g, n, err) != TR_OK) /* may grow g->tensors */
            return TR_ERROR;
        g->tensors[n->out].producer = i;
    }
    if (g->loss < 0 || g->tensors[g->loss].numel != 1)
        return tr_fail(err, "the model has no scalar loss (end it with cross_entropy)");
    /* a recomputed segment is re-run as a whole: its nodes must be adjacent */
    for (int i = 1; i < g->n_nodes; i++) {
        int s = g->nodes[i].segment;
        if (s > 0 && g->nodes[i - 1].segment != s)
            for (int j = 0; j < i - 1; j++)
                if (g->nodes[j].segment == s)
                    return tr_fail(err, "recompute segment %d is not contiguous (node '%s')", s,
                                   g->nodes[i].name);
    }
    return TR_OK;
}

/* A tensor produced inside recompute segment s that nothing outside s reads:
 * it can be dropped after forward and rebuilt before backward. */
static int segment_internal(const struct tr_graph *g, int t)
{
    int p = g->tensors[t].producer;
    if (p < 0 || g->nodes[p].segment <= 0 || t == g->loss || t == g->logits)
        return 0;
    int s = g->nodes[p].segment;
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_in; k++)
            if (g->nodes[j].in[k] == t && g->nodes[j].segment != s)
                return 0;
    return 1;
}

static int plan(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots, int allocate,
                tr_err *err);

int tr_graph_runs_backward(const struct tr_graph *g, const struct tr_node *n)
{
    int any = n->out == g->loss;
    for (int k = 0; k < n->n_in; k++)
        any |= g->tensors[n->in[k]].grad != NULL;
    return any && (n->out == g->loss || g->tensors[n->out].grad);
}

/* Each gradient's first writer in backward: the last node in forward order
 * that reads the tensor and runs backward.  It writes the gradient where
 * the backend says it can (writes_grad), else the core zeroes the gradient
 * right before it: activation gradients in every backward, parameter
 * gradients when the step starts them fresh (g->grads_fresh).  A tensor an
 * op reads twice (x + x) is zeroed, never written: the op's two updates
 * both land in it. */
static void plan_first_writers(struct tr_graph *g, const struct tr_backend *be)
{
    const struct tr_backend_iface *bi = be->iface;
    int ask = TR_HAS_SLOT(bi, struct tr_backend_iface, writes_grad) && bi->writes_grad != NULL;
    for (int i = 0; i < g->n_nodes; i++) {
        struct tr_node *n = &g->nodes[i];
        n->zero_grad_mask = n->act_write_mask = n->param_zero_mask = n->param_write_mask = 0;
        n->write_grad_mask = 0;
    }
    unsigned char *seen = tr_xcalloc((size_t)g->n_tensors, 1);
    for (int j = g->n_nodes - 1; j >= 0; j--) {
        struct tr_node *n = &g->nodes[j];
        if (!tr_graph_runs_backward(g, n))
            continue;
        for (int k = 0; k < n->n_in; k++) {
            int t = n->in[k];
            const struct tr_tensor *x = &g->tensors[t];
            if (x->grad == NULL || seen[t] ||
                (x->role != TR_ROLE_ACTIVATION && x->role != TR_ROLE_PARAM))
                continue;
            seen[t] = 1;
            int twice = 0;
            for (int k2 = 0; k2 < n->n_in; k2++)
                twice |= k2 != k && n->in[k2] == t;
            int write = ask && !twice && bi->writes_grad(be->context, g, n, k);
            unsigned bit = 1u << k;
            if (x->role == TR_ROLE_ACTIVATION)
                *(write ? &n->act_write_mask : &n->zero_grad_mask) |= bit;
            else
                *(write ? &n->param_write_mask : &n->param_zero_mask) |= bit;
        }
    }
    free(seen);
}

/* ---- memory plan ------------------------------------------------------- */

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

struct interval {
    int tensor;
    int start, end; /* inclusive, in backward order */
    size_t bytes, offset;
};

static int by_start(const void *a, const void *b)
{
    const struct interval *x = a, *y = b;
    if (x->start != y->start)
        return x->start - y->start;
    return x->tensor - y->tensor;
}

/* Greedy first-fit packing of gradient buffers whose backward lifetimes do
 * not overlap. Returns the arena size. */
static size_t pack_intervals(struct interval *iv, int n)
{
    qsort(iv, (size_t)n, sizeof *iv, by_start);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t offset = 0;
        for (int moved = 1; moved;) {
            moved = 0;
            for (int j = 0; j < i; j++) {
                if (iv[j].end < iv[i].start || iv[j].start > iv[i].end)
                    continue;
                if (offset < sat_add(iv[j].offset, iv[j].bytes) &&
                    iv[j].offset < sat_add(offset, iv[i].bytes)) {
                    offset = sat_add(iv[j].offset, iv[j].bytes);
                    moved = 1;
                }
            }
        }
        iv[i].offset = offset;
        if (sat_add(offset, iv[i].bytes) > total)
            total = sat_add(offset, iv[i].bytes);
    }
    return total;
}

/* Where activations are stored: in the compute dtype when the precision
 * policy's is 16-bit (bf16, fp16), so what forward keeps for backward takes
 * half the bytes; in fp32 otherwise.  Three kinds stay fp32 whatever the
 * policy: the loss (a scalar the run reads), the logits (the run's accuracy,
 * sampling and evaluation read them as fp32, the loss's gradient for them
 * is fp32 of the same size anyway, and a loss over rounded logits would be
 * coarser: PyTorch's autocast upcasts them inside the loss, holding an fp32
 * copy too) and whatever else a cross-entropy reads.  Gradients, saved aux
 * (mean, rstd, lse), parameters and inputs keep their dtypes.  Rerun at each
 * plan, so the same graph planned under fp32 goes back to fp32. */
static void plan_storage(struct tr_graph *g)
{
    enum tr_dtype half = g->compute == TR_BF16 || g->compute == TR_F16 ? g->compute : TR_F32;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == TR_ROLE_ACTIVATION)
            g->tensors[i].dtype = i == g->loss || i == g->logits ? TR_F32 : half;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TR_OP_CROSS_ENTROPY && g->nodes[i].n_in > 0 &&
            g->nodes[i].in[0] >= 0 && g->nodes[i].in[0] < g->n_tensors &&
            g->tensors[g->nodes[i].in[0]].role == TR_ROLE_ACTIVATION)
            g->tensors[g->nodes[i].in[0]].dtype = TR_F32;
}

int tr_graph_plan(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots, tr_err *err)
{
    plan_storage(g);
    /* a node the device cannot run is refused before anything is allocated */
    if (TR_HAS_SLOT(be->iface, struct tr_backend_iface, supports_op))
        for (int i = 0; i < g->n_nodes; i++)
            if (!be->iface->supports_op(be->context, g, &g->nodes[i]))
                return tr_fail(err, "device \"%s\" cannot run %s '%s': its backend does not "
                               "support op %s on these tensor types; choose another device",
                               be->iface->name, tr_op_name(g->nodes[i].op), g->nodes[i].name,
                               tr_op_name(g->nodes[i].op));
    return plan(g, be, optimizer_slots, 1, err);
}

void tr_graph_measure(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots)
{
    tr_err ignored;
    plan_storage(g);
    plan(g, be, optimizer_slots, 0, &ignored);
}

static int plan(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots, int allocate,
                tr_err *err)
{
    const struct tr_backend_iface *bi = be->iface;
    struct tr_memory_report *m = &g->memory;
    memset(m, 0, sizeof *m);

    /* which tensors carry gradients: params, and anything computed from them */
    int *needs = tr_xcalloc((size_t)g->n_tensors, sizeof *needs);
    for (int i = 0; i < g->n_tensors; i++)
        needs[i] = g->tensors[i].role == TR_ROLE_PARAM;
    for (int i = 0; i < g->n_nodes; i++) {
        struct tr_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (needs[n->in[k]])
                needs[n->out] = 1;
    }
    needs[g->loss] = 0; /* the loss gradient is the scalar g->loss_grad */

    /* parameters: one flat buffer, weight-decayed tensors first */
    g->n_params = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->n_tensors; i++) {
            struct tr_tensor *t = &g->tensors[i];
            if (t->role != TR_ROLE_PARAM || t->decay != (pass == 0))
                continue;
            t->offset = g->n_params;
            g->n_params += t->numel;
            if (pass == 0)
                g->n_decay = g->n_params;
        }
    m->grads = g->n_params * sizeof(float);
    m->optimizer = sat_mul((size_t)optimizer_slots, m->grads);
    /* buffers (batch norm's running statistics): fp32 state beside the
     * parameters, in their own array; counted in the parameters row, as
     * they are model state a checkpoint holds, never trained */
    g->n_buffers = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == TR_ROLE_BUFFER) {
            g->tensors[i].offset = g->n_buffers;
            g->n_buffers += g->tensors[i].numel;
        }
    m->params = (g->n_params + g->n_buffers) * sizeof(float);

    /* activations and saved tensors: each its own slot (all live until
     * backward), except the internals of recomputed segments, which share
     * one arena sized for the largest segment */
    size_t act_bytes = 0, in_bytes = 0;
    size_t *slot = tr_xcalloc((size_t)g->n_tensors, sizeof *slot);
    int *shared = tr_xcalloc((size_t)g->n_tensors, sizeof *shared);
    int max_segment = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].segment > max_segment)
            max_segment = g->nodes[i].segment;
    size_t *segment_bytes = tr_xcalloc((size_t)max_segment + 1, sizeof *segment_bytes);
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        size_t bytes = align64(t->numel * dtype_size(t->dtype));
        if ((t->role == TR_ROLE_ACTIVATION || t->role == TR_ROLE_SAVED) && segment_internal(g, i)) {
            int seg = g->nodes[t->producer].segment;
            shared[i] = 1;
            slot[i] = segment_bytes[seg];
            segment_bytes[seg] = sat_add(segment_bytes[seg], bytes);
            m->recompute_saved = sat_add(m->recompute_saved, bytes);
        } else if (t->role == TR_ROLE_ACTIVATION || t->role == TR_ROLE_SAVED) {
            slot[i] = act_bytes;
            act_bytes = sat_add(act_bytes, bytes);
            if (t->role == TR_ROLE_ACTIVATION)
                m->activations = sat_add(m->activations, bytes);
            else
                m->saved = sat_add(m->saved, bytes);
        } else if (t->role == TR_ROLE_INPUT) {
            slot[i] = in_bytes;
            in_bytes = sat_add(in_bytes, bytes);
        }
    }
    m->inputs = in_bytes;
    for (int sgm = 1; sgm <= max_segment; sgm++)
        if (segment_bytes[sgm] > m->recompute)
            m->recompute = segment_bytes[sgm];
    free(segment_bytes);

    /* activation gradients: live from their first writer (the last consumer,
     * first in backward) to their producer's backward; buffers with disjoint
     * lifetimes share memory. */
    struct interval *iv = tr_xcalloc((size_t)g->n_tensors, sizeof *iv);
    int n_iv = 0;
    int last = g->n_nodes - 1;
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (!needs[i] || t->role != TR_ROLE_ACTIVATION)
            continue;
        int last_consumer = -1;
        for (int j = 0; j < g->n_nodes; j++)
            for (int k = 0; k < g->nodes[j].n_in; k++)
                if (g->nodes[j].in[k] == i)
                    last_consumer = j;
        if (last_consumer < 0) {
            needs[i] = 0; /* feeds nothing: no gradient arrives */
            continue;
        }
        iv[n_iv].tensor = i;
        iv[n_iv].start = last - last_consumer;
        iv[n_iv].end = last - t->producer;
        iv[n_iv].bytes = align64(t->numel * sizeof(float));
        n_iv++;
    }
    size_t grad_arena = pack_intervals(iv, n_iv);
    m->activation_grads = grad_arena;

    /* scratch: the largest any node asks for */
    g->scratch_floats = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        size_t s = bi->scratch_floats ? bi->scratch_floats(be->context, g, &g->nodes[i]) : 0;
        if (s > g->scratch_floats)
            g->scratch_floats = s;
    }
    m->scratch = sat_mul(g->scratch_floats, sizeof(float));
    m->param_copies = TR_HAS_SLOT(bi, struct tr_backend_iface, param_copy_bytes)
                          ? bi->param_copy_bytes(be->context, g)
                          : 0;

    int rc = TR_OK;
    if (!allocate)
        goto done;
    g->params = bi->alloc(be->context, m->params);
    g->grads = bi->alloc(be->context, m->grads);
    g->activation_arena = bi->alloc(be->context, act_bytes);
    g->grad_arena = grad_arena ? bi->alloc(be->context, grad_arena) : NULL;
    g->input_arena = bi->alloc(be->context, in_bytes);
    g->scratch = g->scratch_floats ? bi->alloc(be->context, m->scratch) : NULL;
    g->recompute_arena = m->recompute ? bi->alloc(be->context, m->recompute) : NULL;
    g->buffers = g->n_buffers ? bi->alloc(be->context, g->n_buffers * sizeof(float)) : NULL;
    if (!g->params || !g->grads || !g->activation_arena || (grad_arena && !g->grad_arena) ||
        (g->n_buffers && !g->buffers) ||
        !g->input_arena || (g->scratch_floats && !g->scratch) || (m->recompute && !g->recompute_arena)) {
        char need[32];
        tr_format_bytes((double)m->params + (double)m->grads + (double)act_bytes +
                            (double)grad_arena + (double)in_bytes + (double)m->scratch,
                        need, sizeof need);
        rc = tr_fail(err, "out of %s memory: the plan needs %s at micro-batch %d; lower the "
                     "micro-batch (train.micro_batch) or use micro_batch = \"auto\"",
                     bi->name, need, g->batch);
        goto done;
    }
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        switch (t->role) {
        case TR_ROLE_PARAM:
            t->data = g->params + t->offset;
            t->grad = g->grads + t->offset;
            break;
        case TR_ROLE_INPUT:
            t->data = (char *)g->input_arena + slot[i];
            break;
        case TR_ROLE_BUFFER:
            t->data = g->buffers + t->offset;
            break;
        default:
            t->data = (char *)(shared[i] ? g->recompute_arena : g->activation_arena) + slot[i];
            break;
        }
    }
    for (int i = 0; i < n_iv; i++)
        g->tensors[iv[i].tensor].grad = (float *)((char *)g->grad_arena + iv[i].offset);
    plan_first_writers(g, be);
done:
    free(needs);
    free(slot);
    free(shared);
    free(iv);
    return rc;
}

/* ---- initialisation ---------------------------------------------------- */

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* A buffer's starting values: batch norm's running[2,C] starts at mean 0
 * and variance 1 (as PyTorch), so eval before any training step
 * normalises nothing. */
static void init_buffer(const struct tr_tensor *t, const struct tr_backend *be)
{
    float *host = tr_xcalloc(t->numel, sizeof *host);
    int64_t C = t->shape[t->ndim - 1];
    for (size_t j = (size_t)C; t->ndim == 2 && t->shape[0] == 2 && j < t->numel; j++)
        host[j] = 1.0f;
    be->iface->upload(be->context, t->data, host, t->numel * sizeof(float));
    free(host);
}

void tr_graph_init_params(struct tr_graph *g, const struct tr_backend *be, uint64_t seed)
{
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (t->role == TR_ROLE_BUFFER)
            init_buffer(t, be);
        if (t->role != TR_ROLE_PARAM)
            continue;
        float *host = tr_xcalloc(t->numel, sizeof *host);
        /* a counter-based stream per tensor name: adding a layer does not
         * change the values of the others */
        uint64_t stream = tr_splitmix64(seed ^ hash_name(t->name));
        for (size_t j = 0; j < t->numel; j++) {
            if (t->init == TR_INIT_ONES) {
                host[j] = 1.0f;
            } else if (t->init == TR_INIT_NORMAL) {
                uint64_t r1 = tr_splitmix64(stream + 2 * j), r2 = tr_splitmix64(stream + 2 * j + 1);
                double u1 = ((double)(r1 >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
                double u2 = (double)(r2 >> 11) * 0x1.0p-53;
                host[j] = (float)(t->init_std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
            }
        }
        be->iface->upload(be->context, t->data, host, t->numel * sizeof(float));
        free(host);
    }
}

/* ---- execution --------------------------------------------------------- */

/* Profiling needs the device idle before and after each node. */
static double op_begin(struct tr_graph *g, const struct tr_backend *be)
{
    if (be->iface->synchronize)
        be->iface->synchronize(be->context);
    return g->profile ? tr_now() : 0;
}

static void op_end(struct tr_graph *g, const struct tr_backend *be, int slot, double t0)
{
    if (be->iface->synchronize)
        be->iface->synchronize(be->context);
    g->op_start[slot] = t0;
    g->op_seconds[slot] = tr_now() - t0;
}

static void ensure_profile(struct tr_graph *g)
{
    if (g->profile && !g->op_start) {
        g->op_start = tr_xcalloc(2 * (size_t)g->n_nodes, sizeof *g->op_start);
        g->op_seconds = tr_xcalloc(2 * (size_t)g->n_nodes, sizeof *g->op_seconds);
    }
}

void tr_graph_forward(struct tr_graph *g, const struct tr_backend *be)
{
    ensure_profile(g);
    for (int i = 0; i < g->n_nodes; i++) {
        if (!g->profile) {
            be->iface->forward(be->context, g, &g->nodes[i]);
            continue;
        }
        double t0 = op_begin(g, be);
        be->iface->forward(be->context, g, &g->nodes[i]);
        op_end(g, be, i, t0);
    }
}

void tr_graph_backward(struct tr_graph *g, const struct tr_backend *be)
{
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        struct tr_node *n = &g->nodes[i];
        if (n->segment > 0 && (i == g->n_nodes - 1 || g->nodes[i + 1].segment != n->segment)) {
            /* entering a recomputed segment from its end: rebuild its internals */
            int first = i;
            while (first > 0 && g->nodes[first - 1].segment == n->segment)
                first--;
            /* the segment's forward ran once already: its batch norms must
             * not move their running statistics a second time */
            g->recomputing = 1;
            for (int j = first; j <= i; j++)
                be->iface->forward(be->context, g, &g->nodes[j]);
            g->recomputing = 0;
        }
        if (!tr_graph_runs_backward(g, n))
            continue;
        unsigned zero = n->zero_grad_mask | (g->grads_fresh ? n->param_zero_mask : 0);
        n->write_grad_mask = n->act_write_mask | (g->grads_fresh ? n->param_write_mask : 0);
        for (int k = 0; k < n->n_in; k++)
            if (zero & (1u << k)) {
                struct tr_tensor *t = &g->tensors[n->in[k]];
                be->iface->zero(be->context, t->grad, t->numel * sizeof(float));
            }
        if (!g->profile) {
            be->iface->backward(be->context, g, n);
        } else {
            ensure_profile(g);
            double t0 = op_begin(g, be);
            be->iface->backward(be->context, g, n);
            op_end(g, be, g->n_nodes + i, t0);
        }
        if (g->on_backward)
            g->on_backward(g->on_backward_ctx, i);
    }
}

void tr_graph_free(struct tr_graph *g, const struct tr_backend *be)
{
    if (!g)
        return;
    if (be) {
        void *bufs[] = {g->params, g->grads, g->activation_arena, g->grad_arena, g->input_arena,
                        g->scratch, g->recompute_arena, g->buffers};
        for (size_t i = 0; i < TR_ARRAY_LEN(bufs); i++)
            if (bufs[i])
                be->iface->free(be->context, bufs[i]);
    }
    for (int i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    for (int i = 0; i < g->n_nodes; i++)
        free(g->nodes[i].name);
    free(g->tensors);
    free(g->nodes);
    free(g->op_start);
    free(g->op_seconds);
    free(g);
}

size_t tr_memory_rows(const struct tr_memory_report *m, struct tr_memory_row rows[TR_MEMORY_ROWS])
{
    const struct tr_memory_row all[TR_MEMORY_ROWS] = {
        {"parameters", m->params},        {"gradients", m->grads},
        {"optimizer state", m->optimizer}, {"activations", m->activations},
        {"saved for backward", m->saved}, {"activation gradients", m->activation_grads},
        {"inputs", m->inputs},            {"scratch", m->scratch},
        {"recompute arena", m->recompute}, {"parameter copies", m->param_copies},
    };
    size_t n = 0; /* the last two only where there is any */
    for (size_t i = 0; i < TR_MEMORY_ROWS; i++)
        if (i < 8 || all[i].bytes)
            rows[n++] = all[i];
    return n;
}

void tr_graph_print_memory(const struct tr_graph *g, FILE *out)
{
    const struct tr_memory_report *m = &g->memory;
    struct tr_memory_row rows[TR_MEMORY_ROWS];
    size_t n = tr_memory_rows(m, rows);
    char buf[32];
    if (g->n_buffers) /* the parameters row holds them too */
        fprintf(out, "memory plan (micro-batch %d, %zu parameters, %zu buffer floats):\n",
                g->batch, g->n_params, g->n_buffers);
    else
        fprintf(out, "memory plan (micro-batch %d, %zu parameters):\n", g->batch, g->n_params);
    for (size_t i = 0; i < n; i++) {
        tr_format_bytes((double)rows[i].bytes, buf, sizeof buf);
        fprintf(out, "  %-22s %12s  (%zu bytes)\n", rows[i].what, buf, rows[i].bytes);
    }
    size_t total = tr_graph_memory_total(m);
    tr_format_bytes((double)total, buf, sizeof buf);
    fprintf(out, "  %-22s %12s  (%zu bytes)\n", "total", buf, total);
    if (m->recompute_saved) {
        tr_format_bytes((double)(m->recompute_saved - m->recompute), buf, sizeof buf);
        fprintf(out, "  activation recomputation saves %s (%zu bytes)\n", buf,
                m->recompute_saved - m->recompute);
    }
    if (g->compute == TR_BF16 || g->compute == TR_F16) /* plan_storage's choice */
        fprintf(out, "  activations in %s storage (the logits, gradients and saved statistics "
                "in fp32)\n", g->compute == TR_BF16 ? "bf16" : "fp16");
}

size_t tr_graph_memory_total(const struct tr_memory_report *m)
{
    const size_t parts[] = {m->params,           m->grads,  m->optimizer, m->activations,
                            m->saved,            m->activation_grads, m->inputs,
                            m->scratch,          m->recompute,        m->param_copies};
    size_t total = 0;
    for (size_t i = 0; i < TR_ARRAY_LEN(parts); i++)
        total = sat_add(total, parts[i]); /* SIZE_MAX: more than any device */
    return total;
}

void tr_graph_count_flops(const struct tr_graph *g, struct tr_flops *f)
{
    memset(f, 0, sizeof *f);
    /* a parameter that only embedding lookups read (an untied input
     * embedding) is gathered, not multiplied: it costs no FLOPs */
    char *multiplied = tr_xcalloc((size_t)g->n_tensors, 1);
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (!(n->op == TR_OP_EMBEDDING && k == 0))
                multiplied[n->in[k]] = 1;
        if (n->op == TR_OP_ATTENTION) {
            /* scores q·k and the mix p·v: 2·T·D multiply-adds per query head
             * and token forward, twice that backward; with grouped-query
             * heads every query head still does its own, so the width is
             * the query's heads·D */
            const struct tr_tensor *q = &g->tensors[n->in[0]];
            int64_t T = q->shape[1], W = n->n_in == 3 ? q->shape[2] : q->shape[2] / 3;
            if (f->layers == 0) {
                f->seq_len = T;
                f->width = W;
            }
            f->layers++;
            f->attention += 12.0 * (double)T * (double)W;
        }
    }
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == TR_ROLE_PARAM) {
            f->params += (double)g->tensors[i].numel;
            if (!multiplied[i])
                f->lookup_params += (double)g->tensors[i].numel;
        }
    free(multiplied);
    f->per_token = 6.0 * (f->params - f->lookup_params) + f->attention;
    /* an image model: multiply-adds per sample from the shapes (a conv's
     * weights multiply at every output position) */
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        if (n->op != TR_OP_CONV2D)
            continue;
        const struct tr_tensor *w = &g->tensors[n->in[1]], *y = &g->tensors[n->out];
        /* per output element: KH x KW x IC/groups, the weight's row */
        f->conv += 6.0 * (double)(y->numel / (size_t)y->shape[0]) * (double)(w->numel / (size_t)w->shape[0]);
        f->convs++;
    }
    if (!f->convs)
        return;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        if (n->op != TR_OP_LINEAR && n->op != TR_OP_MATMUL)
            continue;
        const struct tr_tensor *x = &g->tensors[n->in[0]], *y = &g->tensors[n->out];
        /* rows of the output per sample x the inner dimension x the outputs */
        f->dense += 6.0 * (double)(y->numel / (size_t)y->shape[0]) * (double)last_dim(x);
    }
    f->per_token = f->conv + f->dense;
}

double tr_graph_flops_per_token(const struct tr_graph *g)
{
    struct tr_flops f;
    tr_graph_count_flops(g, &f);
    return f.per_token;
}
