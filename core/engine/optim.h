/* The optimizer step over the graph's flat parameter buffer: weight-decayed
 * tensors first, the rest (norms, biases) without decay.  The update math
 * is the backend's (fused AdamW / SGD kernels). */
#ifndef TR_OPTIM_H
#define TR_OPTIM_H

#include "../config/optimizers.h"
#include "../config/run_config.h"
#include "graph.h"
#include "shard.h"

struct tr_optimizer {
    const struct tr_optimizer_config *cfg;
    const struct tr_optimizer_desc *desc;
    /* backend memory, one buffer per state slot of desc (desc->state_slots
     * of them, in the descriptor's order; the rest NULL) */
    float *state[TR_OPTIMIZER_MAX_SLOTS];
    int64_t applied;  /* updates applied so far (AdamW bias correction) */
    /* the parts of the flat parameter buffer this optimizer updates and
     * keeps state for: all of it, or this rank's parts under a shard level
     * (shard.h); the state holds them one after another */
    struct tr_shard shard;
    size_t owned; /* floats of state per slot */
    /* a pipeline stage (no shard level): the step updates only these runs
     * of the flat buffer, the parameters its chunks read; the state keeps
     * the whole buffer's layout and the rest of it is never touched.
     * NULL: every run it owns.  Set by tr_optimizer_only. */
    const struct tr_shard_run *only;
    size_t n_only;
    /* parallel.offload = "optimizer" (tr_optimizer_offload): state[] and
     * an fp32 master copy of the parameters in host memory, updated by the
     * host's CPU backend; NULL: everything in the device backend's memory */
    struct tr_offload *offload;
};

/* State for the parts of g's flat buffer this rank owns under shard (NULL:
 * all of it). */
int tr_optimizer_init(struct tr_optimizer *o, const struct tr_optimizer_config *cfg,
                      const struct tr_graph *g, const struct tr_backend *be,
                      const struct tr_shard *shard, tr_err *err);
/* A pipeline stage's optimizer: only these runs (alive while it is), an
 * offloaded update overlapping the forward planned again for them. */
int tr_optimizer_only(struct tr_optimizer *o, const struct tr_shard_run *runs, size_t n,
                      tr_err *err);
/* Calls fn for each run of the flat buffer this optimizer owns (`only`'s,
 * where set), with the offset of its state in state[k]. */
void tr_optimizer_runs(const struct tr_optimizer *o,
                       void (*fn)(void *ctx, struct tr_shard_run run, size_t state_at), void *ctx);
/* Update the parameters it owns; grad_scale multiplies every gradient
 * first (loss-scale undo and clipping). */
void tr_optimizer_step(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be,
                       double grad_scale, double lr);
void tr_optimizer_free(struct tr_optimizer *o, const struct tr_backend *be);

/* Move an initialised optimizer's state to host memory (`host`'s own:
 * pages resident once written) and update it there with `host`, the CPU
 * backend: each step brings the gradients of the parts it owns (all, or
 * this rank's under a shard level, or a stage's runs) down (through
 * buffers pinned where the device backend `be` offers it) and their
 * updated parameters up in chunks of chunk_floats, the next chunk's
 * download and the previous one's upload overlapping the update of the
 * current one (a worker thread).  The host keeps the state and an fp32
 * master copy laid out as state[] is (a shard level's parts packed; a
 * stage's runs at their offsets, the rest never written).  The master copy
 * is read from the device's parameters at the first step after this or
 * tr_optimizer_params_changed. */
int tr_optimizer_offload(struct tr_optimizer *o, const struct tr_backend *be,
                         const struct tr_backend *host, size_t chunk_floats, tr_err *err);
/* Offloaded: overlap each step's host update with the next forward.  The
 * step then brings the owned gradients down (a host buffer of them, 4 more
 * bytes a parameter), queues every chunk to the worker in the order the
 * forward needs them and returns.  The same numbers as the update inside
 * the step, bit for bit.
 * - Alone (unit_pos NULL): chunks in the order the forward first reads
 *   them; g's before_node hook (which must be free) uploads a forward
 *   node's chunks before it runs, waiting for the worker where needed; a
 *   backward node first settles all.
 * - Under a shard level (unit_pos: each unit of o->shard's place in the
 *   order its gathers run, tr_gather_unit_positions): chunks unit by unit
 *   in that order; the gather of unit u calls tr_optimizer_offload_ready
 *   first, on the communication thread, and the gathers' node hook makes
 *   the forward wait for them (gather.h). */
int tr_optimizer_offload_overlap(struct tr_optimizer *o, struct tr_graph *g,
                                 const struct tr_backend *be, const size_t *unit_pos,
                                 tr_err *err);
/* ctx: the optimizer.  This rank's part of unit u current on the device:
 * waits for the worker to finish its chunks and uploads them, once a step
 * (nothing when not overlapped under a shard level).  Called on the
 * communication thread before the unit's gather (gather.h's ready). */
void tr_optimizer_offload_ready(void *ctx, size_t u);
/* Every pending chunk's parameters up (before anything but the graph's
 * forward reads them: a checkpoint, an evaluation); under a shard level,
 * after the gathers in flight have arrived (tr_session_settle). */
void tr_optimizer_settle(struct tr_optimizer *o);
/* Seconds spent so far waiting for the host's update, overlapped: by the
 * trainer's thread alone, by the communication thread before a unit's
 * gather under a shard level (NaN: not overlapped). */
double tr_optimizer_offload_waited(const struct tr_optimizer *o);
/* Seconds the host has spent updating so far, offloaded (NaN: not). */
double tr_optimizer_offload_busy(const struct tr_optimizer *o);
/* The backend whose memory state[] is in: host under offload, else be. */
const struct tr_backend *tr_optimizer_state_backend(const struct tr_optimizer *o,
                                                    const struct tr_backend *be);
/* The device's parameters were written (a resume): the master copy is
 * read again before the next update. */
void tr_optimizer_params_changed(struct tr_optimizer *o);

#endif
