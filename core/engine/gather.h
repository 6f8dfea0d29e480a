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
 *
 * Under a 16-bit compute dtype (precision bf16 or fp16) the gathers move
 * the compute dtype where they can (the backend's convert slot): the graph
 * gets a second flat buffer, tr_graph.params16 (2 bytes a parameter, the
 * same offsets, resident only while a unit is: the owner's part is rounded
 * again at each gather), and GEMMs read their weights from it (backend.h).  A
 * parameter that only GEMMs read, as their weight, travels in 16 bits
 * alone: its owner rounds its fp32 part to nearest even (the rounding the
 * unsharded run's GEMMs apply, so the results are the same bits) and the
 * other ranks never hold its fp32 values.  Every other parameter (norms'
 * weights, biases, embedding tables, a tied embedding the head multiplies
 * too) is read in fp32 by some op, so it travels in fp32 as before, and
 * where a GEMM multiplies it too (the tied embedding) it is rounded into
 * params16 where it arrives; a unit with nothing to move in 16 bits is
 * gathered in place in fp32, as without params16.  Each rank's part of a unit is
 * packed for the one all-gather the comm plugins have (floats): its fp32
 * floats, then its 16-bit values two to a float, the last padded with a
 * zero half when their count is odd, and every rank's packed part as long
 * as the longest (parts differ: the last rank's holds the unit's leftover,
 * and runs fall unevenly); packing and unpacking run on the communication
 * thread around the collective, through one staging buffer.  Gradients,
 * the optimizer and checkpoints keep to fp32 (the master shard).
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

/* Shard levels "optimizer" and "gradients" under an offloaded update that
 * overlaps the next forward (optim.h): every parameter stays whole on
 * every rank, but after an update the units are gathered again, in the
 * order the forward first reads them, by tr_gather_refresh, which returns
 * at once; g's before_node hook then waits before a node for the units it
 * reads, so the forward starts while later units are still being updated
 * and gathered. */
struct tr_gather *tr_gather_new_resident(struct tr_graph *g, const struct tr_backend *be,
                                         struct tr_comm *c, const struct tr_shard *layout);
void tr_gather_refresh(struct tr_gather *gt);
/* Until every gather in flight has arrived (before anything but the
 * graph reads the parameters: a checkpoint, an evaluation). */
void tr_gather_settle(struct tr_gather *gt);

/* fn(ctx, u) runs on the communication thread just before each gather of
 * unit u: it makes this rank's part current there (the offloaded update's
 * tr_optimizer_offload_ready). */
void tr_gather_set_ready(struct tr_gather *gt, void (*fn)(void *ctx, size_t u), void *ctx);
/* pos[u]: unit u's place in the order the forward first reads the units
 * (node order; units no node reads last, by place): the order gathers are
 * requested in, and so the order an offloaded update should finish them. */
void tr_gather_unit_positions(const struct tr_gather *gt, size_t *pos);

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

/* Bytes the gathers moved since the last call, as the trace counts a
 * collective's (every rank's part of each all-gather, padding included). */
double tr_gather_take_bytes(struct tr_gather *gt);

/* Whether graph g's sharded parameters (layout) are gathered in the
 * compute dtype on backend be (NULL: a plan for another device, which is
 * assumed to convert): the one place that decides it. */
int tr_gather_in_compute(const struct tr_graph *g, const struct tr_backend *be,
                         const struct tr_shard *layout);

/* Whether parameter tensor `tensor` of g is read by GEMMs alone, as their
 * weight (in[1] of linear and matmul): one that travels in 16 bits. */
int tr_gather_gemm_weight(const struct tr_graph *g, int tensor);

/* What a training step's forward and backward hold at once beyond this
 * rank's fp32 parts: bytes of parameters (the most over the passes' events
 * of the units resident together: fp32, whole units; in_compute, 4 bytes
 * a value of their fp32 runs -- a unit gathered in place: all of it -- and
 * 2 of the values GEMMs read, in params16, which keeps nothing of a unit
 * once it is released), the packed gathers' staging buffer (in_compute),
 * and gradient floats (units backward has started writing and not yet
 * handed to their reduce-scatter, plus those in flight).  For the memory
 * plan (fit.c). */
struct tr_gather_peaks {
    size_t param_bytes, staging_bytes, grad_floats;
};
void tr_gather_peaks(const struct tr_graph *g, const struct tr_shard *layout, int in_compute,
                     struct tr_gather_peaks *pk);

#endif
