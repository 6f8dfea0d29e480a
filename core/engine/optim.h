/* The optimizer step over the graph's flat parameter buffer: weight-decayed
 * tensors first, the rest (norms, biases) without decay.  The update math
 * is the backend's (fused AdamW / SGD kernels). */
#ifndef TR_OPTIM_H
#define TR_OPTIM_H

#include "../config/optimizers.h"
#include "../config/run_config.h"
#include "graph.h"

struct tr_optimizer {
    const struct tr_optimizer_config *cfg;
    const struct tr_optimizer_desc *desc;
    /* backend memory, one buffer per state slot of desc (desc->state_slots
     * of them, in the descriptor's order; the rest NULL) */
    float *state[TR_OPTIMIZER_MAX_SLOTS];
    int64_t applied;  /* updates applied so far (AdamW bias correction) */
    /* the part of the flat parameter buffer this optimizer updates and keeps
     * state for: all of it, or one rank's shard under ZeRO-1 (state[k][0]
     * is slot k of parameter `begin`) */
    size_t begin, end;
};

/* State for parameters [begin, end) of g's flat buffer. */
int tr_optimizer_init(struct tr_optimizer *o, const struct tr_optimizer_config *cfg,
                      const struct tr_graph *g, const struct tr_backend *be, size_t begin,
                      size_t end, tr_err *err);
/* Update parameters [begin, end); grad_scale multiplies every gradient
 * first (loss-scale undo and clipping). */
void tr_optimizer_step(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be,
                       double grad_scale, double lr);
void tr_optimizer_free(struct tr_optimizer *o, const struct tr_backend *be);

#endif
