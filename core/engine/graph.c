/* The static graph: building it, checking every node against the op
 * table (kernels/ops.h), initialising its parameters, its FLOPs, freeing
 * it.  Autodiff and the one-time memory plan are in graph_plan.c, running
 * it (forward, backward) in graph_exec.c; graph_internal.h holds what they
 * share. */
#include "graph.h"
#include "backend.h"
#include "graph_internal.h"

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

/* Sizes a model may reach.  The kernels take dimensions and row counts as
 * int; a tensor of 2^40 elements (4 TiB in fp32) and 2^44 parameters are far
 * past any device, so a plan that reaches them is a typo, not a model. */
#define DIM_MAX 2147483647LL
#define TENSOR_MAX_NUMEL ((size_t)1 << 40)
#define PARAMS_MAX ((size_t)1 << 44)

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
        t->numel = shape[i] < 0 ? SIZE_MAX : tr_sat_mul(t->numel, (size_t)shape[i]);
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
    struct tr_op_shape s;
    char why[TR_OP_WHY_SIZE];
    if (tr_op_check(g, n, (const struct tr_tensor *const *)in, &s, why) != 0)
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
    tr_be_upload(be, t->data, host, t->numel * sizeof(float));
    free(host);
}

static void init_weights(struct tr_graph *g, const struct tr_backend *be, uint64_t seed,
                         enum tr_role role, int (*take)(void *, const struct tr_tensor *),
                         void (*written)(void *, const struct tr_tensor *), void *ctx)
{
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (t->role == TR_ROLE_BUFFER && role == TR_ROLE_PARAM)
            init_buffer(t, be);
        if (t->role != role || (take && !take(ctx, t)))
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
            } else if (t->init == TR_INIT_UNIFORM) {
                double u = (double)(tr_splitmix64(stream + j) >> 11) * 0x1.0p-53; /* [0, 1) */
                host[j] = (float)(t->init_std * (2.0 * u - 1.0));
            }
        }
        tr_err err; /* the plan refused storage types the backend lacks */
        if (tr_be_store_weight(be, t, host, &err) != TR_OK)
            tr_log(TR_LOG_ERROR, NULL, "%s", err.msg);
        free(host);
        if (written)
            written(ctx, t);
    }
}

void tr_graph_init_params(struct tr_graph *g, const struct tr_backend *be, uint64_t seed)
{
    init_weights(g, be, seed, TR_ROLE_PARAM, NULL, NULL, NULL);
}

void tr_graph_init_params_each(struct tr_graph *g, const struct tr_backend *be, uint64_t seed,
                               void (*written)(void *ctx, const struct tr_tensor *t), void *ctx)
{
    init_weights(g, be, seed, TR_ROLE_PARAM, NULL, written, ctx);
}

void tr_graph_init_params_some(struct tr_graph *g, const struct tr_backend *be, uint64_t seed,
                               int (*take)(void *ctx, const struct tr_tensor *t),
                               void (*written)(void *ctx, const struct tr_tensor *t), void *ctx)
{
    init_weights(g, be, seed, TR_ROLE_PARAM, take, written, ctx);
}

void tr_graph_init_frozen(struct tr_graph *g, const struct tr_backend *be, uint64_t seed)
{
    init_weights(g, be, seed, TR_ROLE_FROZEN, NULL, NULL, NULL);
}

void tr_graph_free(struct tr_graph *g, const struct tr_backend *be)
{
    if (!g)
        return;
    if (be) {
        void *bufs[] = {g->params, g->grads, g->activation_arena, g->grad_arena, g->input_arena,
                        g->scratch, g->recompute_arena, g->buffers, g->frozen};
        for (size_t i = 0; i < TR_ARRAY_LEN(bufs); i++)
            if (bufs[i])
                tr_be_free(be, bufs[i]);
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
    double frozen_multiplied = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM && t->role != TR_ROLE_FROZEN)
            continue;
        f->params += (double)t->numel;
        if (t->role == TR_ROLE_FROZEN)
            f->frozen += (double)t->numel;
        if (!multiplied[i])
            f->lookup_params += (double)t->numel;
        else if (t->role == TR_ROLE_FROZEN)
            frozen_multiplied += (double)t->numel;
    }
    free(multiplied);
    f->frozen_multiplied = frozen_multiplied;
    /* a frozen weight computes no gradient of its own: 2 forward + 2 for
     * its input's gradient */
    f->per_token = 6.0 * (f->params - f->lookup_params - frozen_multiplied) +
                   4.0 * frozen_multiplied + f->attention;
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
