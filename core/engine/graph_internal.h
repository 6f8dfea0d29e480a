/* What graph.c, graph_plan.c and graph_exec.c share: private to the three. */
#ifndef TR_GRAPH_INTERNAL_H
#define TR_GRAPH_INTERNAL_H

#include "graph.h"
#include "../../kernels/nf4.h"

#include <stddef.h>
#include <stdint.h>

/* A frozen weight's bytes in its storage type (NF4: kernels/nf4.h's blob). */
static inline size_t tr_frozen_bytes(const struct tr_tensor *t)
{
    return t->dtype == TR_NF4 ? tr_nf4_bytes(t->numel) : t->numel * tr_dtype_size(t->dtype);
}

/* a + b, or SIZE_MAX when it does not fit: a plan's sums never wrap. */
static inline size_t tr_sat_add(size_t a, size_t b)
{
    size_t r;
    return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

static inline size_t tr_sat_mul(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

/* ---- windows of sequence rows (graph_plan.c's tr_graph_rows_ok, graph_exec.c's
 * tr_graph_forward_rows) */

/* The sequence length of a graph of one sequence (inputs[0] ids [1,T]); 0 otherwise. */
static inline int tr_graph_sequence_length(const struct tr_graph *g)
{
    if (g->n_inputs < 1)
        return 0;
    const struct tr_tensor *in = &g->tensors[g->inputs[0]];
    return in->dtype == TR_I32 && in->ndim == 2 && in->shape[0] == 1 ? (int)in->shape[1] : 0;
}

/* The dimension of t that is the sequence's rows: the first of length T
 * after dimensions of 1 only ([1,T,C], [1,T], [T] of a norm's saved rows),
 * in a tensor forward writes or reads per micro-batch; -1 for any other. */
static inline int tr_sequence_dim(const struct tr_tensor *t, int T)
{
    if (t->role != TR_ROLE_INPUT && t->role != TR_ROLE_ACTIVATION && t->role != TR_ROLE_SAVED)
        return -1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == T)
            return d;
        if (t->shape[d] != 1)
            return -1;
    }
    return -1;
}

/* The tensors of node n, each once: in, aux, out. */
static inline int tr_node_tensors(const struct tr_node *n, int t[6])
{
    int k = 0;
    int all[6], m = 0;
    for (int i = 0; i < n->n_in; i++)
        all[m++] = n->in[i];
    for (int i = 0; i < n->n_aux; i++)
        all[m++] = n->aux[i];
    all[m++] = n->out;
    for (int i = 0; i < m; i++) {
        int seen = 0;
        for (int j = 0; j < k; j++)
            seen |= t[j] == all[i];
        if (!seen && all[i] >= 0)
            t[k++] = all[i];
    }
    return k;
}

#endif
