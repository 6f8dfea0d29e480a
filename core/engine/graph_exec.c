/* Running a planned graph: forward in node order, backward in reverse with
 * recomputed segments rebuilt and each gradient zeroed or written by its
 * first writer (graph_plan.c), optionally timing each node for the trace. */
#include "graph.h"
#include "backend.h"
#include "graph_internal.h"

#include "../util/util.h"

/* Profiling needs the device idle before and after each node. */
static double op_begin(struct tr_graph *g, const struct tr_backend *be)
{
    tr_be_synchronize(be);
    return g->profile ? tr_now() : 0;
}

static void op_end(struct tr_graph *g, const struct tr_backend *be, int slot, double t0)
{
    tr_be_synchronize(be);
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
    tr_graph_forward_range(g, be, 0, g->n_nodes - 1);
}

void tr_graph_forward_range(struct tr_graph *g, const struct tr_backend *be, int first, int last)
{
    ensure_profile(g);
    for (int i = first; i <= last; i++) {
        if (g->before_node)
            g->before_node(g->before_node_ctx, i, TR_PHASE_FORWARD);
        if (!g->profile) {
            tr_be_forward(be, g, &g->nodes[i]);
            continue;
        }
        double t0 = op_begin(g, be);
        tr_be_forward(be, g, &g->nodes[i]);
        op_end(g, be, i, t0);
    }
}

int tr_graph_recompute_from(const struct tr_graph *g, int i)
{
    const struct tr_node *n = &g->nodes[i];
    if (n->segment <= 0 || (i < g->n_nodes - 1 && g->nodes[i + 1].segment == n->segment))
        return -1;
    int first = i;
    while (first > 0 && g->nodes[first - 1].segment == n->segment)
        first--;
    return first;
}

void tr_graph_backward(struct tr_graph *g, const struct tr_backend *be)
{
    tr_graph_backward_range(g, be, 0, g->n_nodes - 1);
}

void tr_graph_backward_range(struct tr_graph *g, const struct tr_backend *be, int from, int to)
{
    for (int i = to; i >= from; i--) {
        struct tr_node *n = &g->nodes[i];
        int first = tr_graph_recompute_from(g, i);
        if (first >= 0 && first < from) /* a segment is cut inside one block, never across */
            first = from;
        if (first >= 0) {
            /* entering a recomputed segment from its end: rebuild its
             * internals.  The segment's forward ran once already: its batch
             * norms must not move their running statistics a second time */
            g->recomputing = 1;
            for (int j = first; j <= i; j++) {
                if (g->before_node)
                    g->before_node(g->before_node_ctx, j, TR_PHASE_RECOMPUTE);
                tr_be_forward(be, g, &g->nodes[j]);
            }
            g->recomputing = 0;
        }
        if (!tr_graph_runs_backward(g, n))
            continue;
        if (g->before_node)
            g->before_node(g->before_node_ctx, i, TR_PHASE_BACKWARD);
        /* a sharded rank's parameter gradients were discarded after their
         * last reduction (or a trial step): committed before the node
         * writes or adds to them (a no-op where discarded memory reads as
         * zeros, backend.h) */
        for (int k = 0; k < n->n_in; k++) {
            const struct tr_tensor *t = &g->tensors[n->in[k]];
            if (t->role == TR_ROLE_PARAM && t->grad)
                tr_be_commit(be, t->grad, t->numel * sizeof(float));
        }
        unsigned zero = n->zero_grad_mask | (g->grads_fresh ? n->param_zero_mask : 0);
        n->write_grad_mask = n->act_write_mask | (g->grads_fresh ? n->param_write_mask : 0);
        for (int k = 0; k < n->n_in; k++)
            if (zero & (1u << k)) {
                struct tr_tensor *t = &g->tensors[n->in[k]];
                tr_be_zero(be, t->grad, t->numel * sizeof(float));
            }
        if (!g->profile) {
            tr_be_backward(be, g, n);
        } else {
            ensure_profile(g);
            double t0 = op_begin(g, be);
            tr_be_backward(be, g, n);
            op_end(g, be, g->n_nodes + i, t0);
        }
        if (g->on_backward)
            g->on_backward(g->on_backward_ctx, i);
    }
}

/* ---- windows of sequence rows: sample's key/value cache ---------------------- */

/* t seen as rows [from, to) of its dimension d (of T rows), or, with d < 0,
 * as a position table from its row `from` on */
static void view_rows(struct tr_tensor *t, int d, int T, int from, int to)
{
    int64_t len = d >= 0 ? T : t->shape[0];
    size_t row = t->numel / (size_t)len;
    t->data = (char *)t->data + (size_t)from * row * tr_dtype_size(t->dtype);
    if (d < 0)
        d = 0, to = (int)len;
    t->shape[d] = to - from;
    t->numel = row * (size_t)(to - from);
}

void tr_graph_forward_rows(struct tr_graph *g, const struct tr_backend *be, int from, int to)
{
    int T = tr_graph_sequence_length(g), last = g->tensors[g->logits].producer;
    g->seq_from = from;
    g->seq_to = to;
    for (int i = 0; i <= last; i++) {
        const struct tr_node *n = &g->nodes[i];
        enum tr_rows_rule rule = tr_op_rows(n->op);
        struct tr_tensor saved[6];
        int t[6], k = rule == TR_ROWS_WHOLE ? 0 : tr_node_tensors(n, t);
        if (rule == TR_ROWS_WHOLE) /* attention: whole inputs, the window's output rows */
            t[k++] = n->out;
        for (int j = 0; j < k; j++) {
            struct tr_tensor *x = &g->tensors[t[j]];
            saved[j] = *x;
            int d = tr_sequence_dim(x, T);
            if (rule == TR_ROWS_TABLE && t[j] == n->in[1])
                view_rows(x, -1, T, from, to);
            else if (d >= 0)
                view_rows(x, d, T, from, to);
        }
        tr_be_forward(be, g, n);
        for (int j = 0; j < k; j++)
            g->tensors[t[j]] = saved[j];
    }
    g->seq_from = g->seq_to = 0;
}
