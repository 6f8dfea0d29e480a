/*
 * Sharded parameters (parallel.shard = "parameters", ZeRO-3): each rank
 * keeps only its parts of the flat parameter buffer (shard.h) resident;
 * the rest of a unit is gathered from its owners just before a node that
 * reads it runs, and discarded after the last node of the pass (forward,
 * or backward with its recomputed segments) that reads it.
 *
 * The buffer keeps its full size in address space, so every tensor's data
 * pointer stays where the plan put it: what comes and goes is the memory
 * behind it (the backend's discard slot: on the CPU, whole pages back to
 * the kernel).  Which units each node reads, in which order the passes
 * read them, and so when each is gathered and discarded is worked out
 * once from the graph (the order is graph_exec.c's, tr_graph_recompute_from);
 * the gather of the next node's units is submitted before the current node
 * runs, so it overlaps that node's compute on the communication thread.
 *
 *   event e of a pass:  discard units last read at e - 1
 *                       gather units of e (if not resident), then of e + 1
 *                       wait for e's; the node runs
 */
#ifndef TR_GATHER_H
#define TR_GATHER_H

#include "comm.h"
#include "shard.h"

struct tr_gather;

/* For graph g (planned, params allocated) and layout (this rank's, level
 * parameters): the schedule, and g's before_node hook set to follow it. */
struct tr_gather *tr_gather_new(struct tr_graph *g, const struct tr_backend *be,
                                struct tr_comm *c, const struct tr_shard *layout);
void tr_gather_free(struct tr_gather *gt);

/* Discards every unit's parts other ranks own (waiting for gathers in
 * flight): after a pass, after the parameters were loaded or initialised
 * in full, after a checkpoint gathered them. */
void tr_gather_release_all(struct tr_gather *gt);

/* Discards other ranks' parts of the units parameter t spans: called as
 * each parameter is initialised (tr_graph_init_params_each), so a rank
 * never holds more than its parts and one tensor.  ctx: the tr_gather. */
void tr_gather_written(void *ctx, const struct tr_tensor *t);

/* Seconds the nodes waited for their units since the last call: the
 * gathers compute did not hide (the run counts them as communication). */
double tr_gather_take_waited(struct tr_gather *gt);

/* The most floats of parameters and of gradients held at once over a
 * training step's forward and backward, beyond this rank's parts: whole
 * units resident together (parameters), and units backward has started
 * writing and not yet handed to their reduce-scatter, plus those in
 * flight (gradients).  For the memory plan (fit.c). */
void tr_gather_peaks(const struct tr_graph *g, const struct tr_shard *layout,
                     size_t *param_floats, size_t *grad_floats);

#endif
