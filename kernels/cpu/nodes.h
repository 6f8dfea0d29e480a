/* The CPU backend's nodes (nodes.c): each op's forward, backward and scratch
 * as calls of the kernels in this directory, in a table indexed by enum
 * tr_op, and the node-level choices backend.c's 16-bit storage and
 * supports_op also ask about.  Private to the CPU backend. */
#ifndef TR_CPU_NODES_H
#define TR_CPU_NODES_H

#include "../backend.h"
#include "kernels.h"

typedef void (*tr_cpu_node_fn)(struct tr_graph *g, const struct tr_node *n);

struct tr_cpu_op {
    tr_cpu_node_fn forward, backward;
    /* floats of scratch the op's kernels need (forward and backward share
     * it); NULL: none */
    size_t (*scratch_floats)(const struct tr_graph *g, const struct tr_node *n);
    /* 16-bit storage (backend.c): the backward reads none of the inputs'
     * values, only dout and shapes, so they get no fp32 copy there */
    unsigned backward_skips_inputs : 1;
    /* the backward does not read the output (attention's does: the rows'
     * sums of dout x out); an op without the bit gets it, so an op added
     * later is safe before anyone sets the bit */
    unsigned backward_skips_output : 1;
    /* bit k: the backward can write in[k]'s gradient (=, kernels.h's
     * `write`) instead of adding to it, when the core sets the bit in
     * n->write_grad_mask (writes_grad, kernels/backend.h); ~0u: every input */
    unsigned writes_grads;
};

/* Every op, indexed by enum tr_op; an op without a forward is not run. */
extern const struct tr_cpu_op tr_cpu_ops[TR_OP_COUNT];

/* bf16 GEMMs in bf16 instructions (tr_cpu_bf16_native_isa) under a bf16 policy */
int tr_cpu_node_native_bf16(const struct tr_graph *g);
/* a linear node whose GEMM rounds its bf16 output into storage itself */
int tr_cpu_node_linear_out16(const struct tr_graph *g, const struct tr_node *n);
/* an attention node that reads its bf16 q, k and v as stored */
int tr_cpu_node_attention_bf16(const struct tr_graph *g, const struct tr_node *n);
/* a conv2d node's geometry */
struct tr_cpu_conv_shape tr_cpu_node_conv_shape(const struct tr_graph *g, const struct tr_node *n);

#endif
