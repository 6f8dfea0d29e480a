/*
 * The static graph: tensors and nodes as the Lua model builder described
 * them, checked, then planned once: every byte the step needs is allocated
 * up front and the plan says how much by class.  No math here — nodes run
 * through a backend (kernels/backend.h).
 */
#ifndef TR_GRAPH_H
#define TR_GRAPH_H

#include "../../kernels/backend.h"
#include "../../kernels/ops.h" /* the op table */
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* The op's name in recipes and messages ("linear"), and back (tr_ops[op].name). */
/* Bytes of one element of a tensor stored as t (NF4 weights: tr_nf4_bytes
 * of their count, graph_internal.h's tr_frozen_bytes). */
static inline size_t tr_dtype_size(enum tr_dtype t) { return (t == TR_BF16 || t == TR_F16) ? 2 : 4; }

const char *tr_op_name(enum tr_op op);
int tr_op_from_name(const char *name, enum tr_op *out);

struct tr_graph *tr_graph_new(int batch);
/* Returns the tensor index.  Parameters are placed in the flat buffer in a
 * decay-first order by tr_graph_plan. */
int tr_graph_add_tensor(struct tr_graph *g, const char *name, enum tr_role role,
                        enum tr_dtype dtype, int ndim, const int64_t *shape);
int tr_graph_add_node(struct tr_graph *g, const struct tr_node *node);
int tr_graph_find(const struct tr_graph *g, const char *name);

/* Check every node's shapes, then allocate everything on the backend.
 * optimizer_slots: floats of optimizer state per parameter (the
 * optimizer's state_slots, core/engine/optim.h),
 * counted in the report only (the optimizer allocates them). */
int tr_graph_check(struct tr_graph *g, tr_err *err);
int tr_graph_plan(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots,
                  tr_err *err);

/* The plan of a graph that only runs forward (eval, sample, export
 * --merge): no parameter or activation gradients (every grad NULL), no
 * optimizer state, and the activations and saved tensors packed by their
 * spans in forward (tensors no later node reads share memory), the loss
 * and logits kept.  tr_graph_backward must not run on it. */
int tr_graph_plan_forward(struct tr_graph *g, const struct tr_backend *be, tr_err *err);
/* The same, and every attention node's keys and values (the whole qkv of
 * a packed one) keep memory of their own across forwards: the
 * key/value cache tr_graph_forward_rows reads its earlier rows from.  Only
 * where tr_graph_rows_ok; otherwise tr_graph_plan_forward's plan.  *cache:
 * the bytes kept (in the activations' row of the memory report). */
int tr_graph_plan_forward_cached(struct tr_graph *g, const struct tr_backend *be, size_t *cache,
                                 tr_err *err);

/* Whether forward can run over windows of sequence rows on be: a batch of
 * one sequence (inputs[0] ids [1,T], T > 1), logits, eval mode, and every
 * node up to the logits' one of an op the table runs in windows
 * (tr_op_rows) and be's supports_rows. */
int tr_graph_rows_ok(const struct tr_graph *g, const struct tr_backend *be);
/* Forward over sequence rows [from, to) alone, up to the logits (0 <= from
 * < to <= T), on a graph planned by tr_graph_plan_forward_cached: the input
 * ids' rows [from, to) must hold the tokens, rows [0, from) were computed by
 * earlier calls on the same sequence, and afterwards the logits' rows
 * [from, to) hold theirs (each as the whole forward gives it up to the
 * order of sums).  Incremental decoding: the prompt once, then a token at a
 * time.  Row-by-row ops run on views of their tensors' rows, rope and
 * attention on the window (kernels/backend.h, tr_graph.seq_from). */
void tr_graph_forward_rows(struct tr_graph *g, const struct tr_backend *be, int from, int to);

/* tr_graph_plan's plan, measured only: fills g->memory, allocates nothing (what a
 * recipe would need on a device this machine does not have). */
void tr_graph_measure(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots);
/* tr_graph_plan_forward's total, measured only; g->memory keeps what it held. */
size_t tr_graph_measure_forward(struct tr_graph *g, const struct tr_backend *be);

/* Deterministic parameter initialisation from a seed (same values on every backend). */
void tr_graph_init_params(struct tr_graph *g, const struct tr_backend *be, uint64_t seed);
/* The same, calling written(ctx, t) after each parameter t is stored (a
 * rank of sharded parameters keeps only its parts as it goes). */
void tr_graph_init_params_each(struct tr_graph *g, const struct tr_backend *be, uint64_t seed,
                               void (*written)(void *ctx, const struct tr_tensor *t), void *ctx);
/* The same for the parameters take(ctx, t) takes alone (NULL: every one),
 * each the value it has in the whole initialisation; the others are left
 * as they are (those weights loaded from elsewhere take). */
void tr_graph_init_params_some(struct tr_graph *g, const struct tr_backend *be, uint64_t seed,
                               int (*take)(void *ctx, const struct tr_tensor *t),
                               void (*written)(void *ctx, const struct tr_tensor *t), void *ctx);
/* The same for frozen weights (an adapter's base), by the same rule: where
 * no pretrained base is loaded over them. */
void tr_graph_init_frozen(struct tr_graph *g, const struct tr_backend *be, uint64_t seed);

void tr_graph_forward(struct tr_graph *g, const struct tr_backend *be);
void tr_graph_backward(struct tr_graph *g, const struct tr_backend *be);
/* The same over nodes [first, last] only (a pipeline stage's chunk). */
void tr_graph_forward_range(struct tr_graph *g, const struct tr_backend *be, int first, int last);
void tr_graph_backward_range(struct tr_graph *g, const struct tr_backend *be, int first, int last);
/* Whether backward runs node n at all: a gradient arrives (n makes the
 * loss, or its output has one) and one leaves (some input has one).  Once
 * the graph is planned (gradients assigned). */
int tr_graph_runs_backward(const struct tr_graph *g, const struct tr_node *n);
/* Backward's order, for those who plan around it (gather.c): walking
 * nodes last to first, at node i backward first re-runs the forward of
 * nodes [tr_graph_recompute_from(g, i), i] when i ends a recomputed
 * segment (-1: it does not), then runs i's backward if
 * tr_graph_runs_backward.  The phases tr_graph.before_node is told. */
int tr_graph_recompute_from(const struct tr_graph *g, int i);
enum { TR_PHASE_FORWARD, TR_PHASE_RECOMPUTE, TR_PHASE_BACKWARD };
void tr_graph_free(struct tr_graph *g, const struct tr_backend *be);

/* The report's classes in print order (the recompute arena and the
 * backend's parameter copies only where there are any); returns how many of
 * the TR_MEMORY_ROWS rows were filled. */
#define TR_MEMORY_ROWS 11
struct tr_memory_row {
    const char *what;
    size_t bytes;
};
size_t tr_memory_rows(const struct tr_memory_report *m, struct tr_memory_row rows[TR_MEMORY_ROWS]);

/* The memory plan, by class, as a few lines of text. */
void tr_graph_print_memory(const struct tr_graph *g, FILE *out);

/* Training FLOPs per token (per sample for non-sequence models):
 * 6 x the parameters that multiply (2 forward, 4 backward; a table only
 * embedding lookups read, as an untied input embedding, multiplies
 * nothing) plus 12 x T x W per attention layer for the scores and the
 * mixing, W the query width heads x D (grouped-query attention included).
 * A model with convolutions (an image model) is counted per sample from
 * its shapes instead, since a convolution's weights multiply once per
 * output position: 6 x the multiply-adds of its convolutions
 * (OH x OW x OC x KH x KW x IC/groups each) and linear layers (their
 * weight's elements x rows per sample); batch norm, pooling and
 * activations, a few FLOPs per element, are left out as norms and
 * activations are from the transformers' count. */
struct tr_flops {
    double params;          /* every parameter, trained or frozen */
    double frozen;          /* of those, frozen (an adapter's base) */
    double frozen_multiplied; /* frozen and multiplied: 4 FLOPs each (no weight gradient) */
    double lookup_params;   /* read only by embedding lookups: no FLOPs */
    double attention;       /* 12 x sum over attention nodes of T x W */
    int64_t layers;         /* attention nodes */
    int64_t seq_len, width; /* T and W of the first attention node */
    double per_token;       /* 6 x (params - lookup_params) + attention; image models:
                             * conv + dense (per sample) */
    int64_t convs;          /* conv2d nodes; > 0: an image model, counted per sample */
    double conv;            /* 6 x the convolutions' multiply-adds per sample */
    double dense;           /* 6 x the linear layers' multiply-adds per sample (image models) */
};
void tr_graph_count_flops(const struct tr_graph *g, struct tr_flops *f);
double tr_graph_flops_per_token(const struct tr_graph *g);

/* Bytes the plan allocates in total (what must fit on the device). */
size_t tr_graph_memory_total(const struct tr_memory_report *m);

#endif
