/*
 * The static graph: tensors and nodes as the Lua model builder described
 * them, checked, then planned once: every byte the step needs is allocated
 * up front and the plan says how much by class.  No math here — nodes run
 * through a backend (kernels/backend.h).
 */
#ifndef TR_GRAPH_H
#define TR_GRAPH_H

#include "../kernels/backend.h"
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <trainrun/plugin.h>

#define TR_MAX_DIMS 4

enum tr_op {
    TR_OP_EMBEDDING = 0, /* in: table[V,C], idx[...] (i32)          out: [...,C]      */
    TR_OP_ADD_ROWS,      /* in: x[B,T,C], p[>=T,C]                  out: [B,T,C]      */
    TR_OP_ADD,           /* in: a, b (same shape)                   out: same         */
    TR_OP_LINEAR,        /* in: x[...,IC], w[OC,IC], (b[OC])        out: [...,OC]     */
    TR_OP_MATMUL,        /* in: a[(batch),M,K], b[(batch),K,N] or [N,K] with trans_b */
    TR_OP_LAYERNORM,     /* in: x[...,C], w[C], b[C]  aux: mean[N], rstd[N]          */
    TR_OP_GELU,          /* in: x                                   out: same         */
    TR_OP_RELU,          /* in: x                                   out: same         */
    TR_OP_ATTENTION,     /* in: qkv[B,T,3C]  attr heads  aux: att[B,NH,T,T] out [B,T,C] */
    TR_OP_CROSS_ENTROPY, /* in: logits[...,V], targets[...] (i32)  aux: lse[N]  out: scalar */
    TR_OP_COUNT
};

const char *tr_op_name(enum tr_op op);
int tr_op_from_name(const char *name, enum tr_op *out);

enum tr_role {
    TR_ROLE_INPUT = 0, /* filled from the data source each micro-batch */
    TR_ROLE_PARAM,     /* learned; lives in the flat parameter buffer   */
    TR_ROLE_ACTIVATION,/* produced by a node in forward                 */
    TR_ROLE_SAVED      /* produced by a node for its own backward (mean, rstd, att, lse) */
};

enum tr_init { TR_INIT_ZEROS = 0, TR_INIT_ONES, TR_INIT_NORMAL };

struct tr_tensor {
    char *name;
    enum tr_role role;
    enum tr_dtype dtype;
    int ndim;
    int64_t shape[TR_MAX_DIMS];
    size_t numel;
    void *data;
    float *grad;     /* NULL when no gradient flows here */
    int producer;    /* node index, -1 for inputs and params */
    /* parameters */
    enum tr_init init;
    double init_std;
    int decay;        /* weight decay applies */
    size_t offset;    /* element offset in the flat parameter/gradient buffers */
};

struct tr_node {
    enum tr_op op;
    char *name;       /* for messages and profiles: "h.0.attn" */
    int in[3];
    int n_in;
    int out;
    int aux[2];
    int n_aux;
    /* attributes */
    int heads;
    float eps;
    int ignore_index;
    int trans_b;
    int segment;      /* > 0: recomputed in backward (activation recomputation) */
    /* planned */
    unsigned zero_grad_mask; /* bit k: zero in[k]'s activation gradient before this backward */
};

struct tr_memory_report {
    size_t params, grads, optimizer, activations, saved, activation_grads, inputs, scratch;
    size_t recompute;       /* one shared arena for the internals of recomputed segments */
    size_t recompute_saved; /* bytes those internals would take if all were kept */
};

struct tr_graph {
    struct tr_tensor *tensors;
    int n_tensors;
    struct tr_node *nodes;
    int n_nodes;
    int batch;       /* the micro-batch the shapes were built for */
    int loss;        /* scalar tensor */
    int logits;      /* optional, -1 if none */
    int inputs[4];   /* input tensors, in the order the data source fills them */
    int n_inputs;
    /* planned memory (backend memory) */
    float *params, *grads;
    size_t n_params, n_decay; /* params[0 .. n_decay) are weight-decayed */
    void *activation_arena, *grad_arena, *input_arena, *recompute_arena;
    float *scratch;
    size_t scratch_floats;
    struct tr_memory_report memory;
    /* set by the run loop before backward: d(objective)/d(loss) */
    float loss_grad;
    /* the precision policy's GEMM input dtype (accumulation is fp32) */
    enum tr_dtype compute;
    /* profiling: when set, each node's forward and backward are timed
     * (start and duration in seconds of tr_now(), for the trace) */
    int profile;
    double *op_start, *op_seconds; /* 2 * n_nodes: forward i, backward n_nodes + i */
    /* when set, called after each node's backward (data parallelism starts
     * all-reducing the gradients that node finished) */
    void (*on_backward)(void *ctx, int node);
    void *on_backward_ctx;
};

struct tr_graph *tr_graph_new(int batch);
/* Returns the tensor index.  Parameters are placed in the flat buffer in a
 * decay-first order by tr_graph_plan. */
int tr_graph_add_tensor(struct tr_graph *g, const char *name, enum tr_role role,
                        enum tr_dtype dtype, int ndim, const int64_t *shape);
int tr_graph_add_node(struct tr_graph *g, const struct tr_node *node);
int tr_graph_find(const struct tr_graph *g, const char *name);

/* Check every node's shapes, then allocate everything on the backend.
 * optimizer_slots: floats of optimizer state per parameter (2 for AdamW),
 * counted in the report only (the optimizer allocates them). */
int tr_graph_check(struct tr_graph *g, tr_err *err);
int tr_graph_plan(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots,
                  tr_err *err);

/* The same plan, measured only: fills g->memory, allocates nothing (what a
 * recipe would need on a device this machine does not have). */
void tr_graph_measure(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots);

/* Deterministic parameter initialisation from a seed (same values on every backend). */
void tr_graph_init_params(struct tr_graph *g, const struct tr_backend *be, uint64_t seed);

void tr_graph_forward(struct tr_graph *g, const struct tr_backend *be);
void tr_graph_backward(struct tr_graph *g, const struct tr_backend *be);
void tr_graph_free(struct tr_graph *g, const struct tr_backend *be);

/* The report's classes in print order (the recompute arena only when
 * used); returns how many of the 9 rows were filled. */
struct tr_memory_row {
    const char *what;
    size_t bytes;
};
size_t tr_memory_rows(const struct tr_memory_report *m, struct tr_memory_row rows[9]);

/* The memory plan, by class, as a few lines of text. */
void tr_graph_print_memory(const struct tr_graph *g, FILE *out);

/* Training FLOPs per token (per sample for non-sequence models):
 * 6 x parameters (2 forward, 4 backward) plus 12 x T x C per attention
 * layer for the scores and the mixing. */
double tr_graph_flops_per_token(const struct tr_graph *g);

/* Bytes the plan allocates in total (what must fit on the device). */
size_t tr_graph_memory_total(const struct tr_memory_report *m);

#endif
