/*
 * Pipeline parallelism, the part that needs no second process: how a
 * model's graph is cut into stages, the order in which each stage runs its
 * micro-batches' forwards and backwards under each schedule, and what that
 * order costs in idle time.
 *
 *   stages P, virtual stages V (chunks per stage, interleaved only),
 *   micro-batches M per step: chunk c = v * P + s runs on stage s
 *
 * The schedules are Megatron-LM's: "gpipe" (every forward, then every
 * backward), "1f1b" (P - s - 1 forwards to fill the pipe, then one forward
 * and one backward in turn: at most P - s micro-batches in flight on stage
 * s) and "interleaved" (1F1B over V chunks a stage, micro-batches taken in
 * groups of P; needs M a multiple of P).  The same op lists are what the
 * executor will run; the simulator here plays them against per-chunk
 * forward and backward times and says how long the step takes and which
 * share of it the stages sit idle (the bubble).
 */
#ifndef TR_PIPELINE_H
#define TR_PIPELINE_H

#include "graph.h"
#include "../config/run_config.h" /* enum tr_pipe_kind, tr_pipe_kinds */

/* One op of a stage's list: the forward or backward of micro-batch `micro`
 * through chunk `chunk` (0 .. P*V - 1; on stage chunk % P). */
struct tr_pipe_op {
    int backward;
    int micro, chunk;
};

/* Stage s's ops, in order: 2 * M * V of them, written to ops (room for
 * that many).  Returns how many, or -1 when the schedule cannot run that
 * shape (interleaved with M not a multiple of P). */
int tr_pipe_schedule(enum tr_pipe_kind kind, int P, int V, int M, int s, struct tr_pipe_op *ops);

/* The schedule played against forward[c] and backward[c] seconds for each
 * chunk c (P*V of them), communication free: the step's length, and the
 * share of P x that length the stages sit idle.  Returns -1 (and says so in
 * err) when some stage waits forever (an invalid order). */
struct tr_pipe_sim {
    double makespan, bubble;
    int max_in_flight; /* the most micro-batches any stage holds activations for */
};
int tr_pipe_simulate(enum tr_pipe_kind kind, int P, int V, int M, const double *forward,
                     const double *backward, struct tr_pipe_sim *out, tr_err *err);

/* The bubble with every chunk equally long: (P - 1) / (M + P - 1), and
 * (P - 1) / (V * M + P - 1) interleaved. */
double tr_pipe_bubble_theory(enum tr_pipe_kind kind, int P, int V, int M);

/* The graph cut into `chunks` contiguous pieces at block boundaries: the
 * nodes before the first block (the embedding) and after the last (the
 * head and loss) are pieces of their own to place, the blocks found by
 * their names ("....h.<l>." in GPT-2's, "....layers.<l>." in Llama's).
 * Each piece's training FLOPs per token (6 per multiplied parameter, 12 T W
 * per attention: tr_graph_count_flops's rule, node by node) decide the cut:
 * the largest chunk's FLOPs are as small as they can be. */
struct tr_pipe_chunk {
    int first_node, last_node;  /* [first, last] */
    int first_block, last_block; /* -1: none (embedding or head only) */
    int has_embedding, has_head;
    double flops;                /* per token, training */
    double param_floats;         /* parameters its nodes read first */
};
int tr_pipe_partition(const struct tr_graph *g, int chunks, struct tr_pipe_chunk *out, tr_err *err);

/* The micro-batches a pipeline step runs on each of `replicas` replicas:
 * parallel.micro_batches where set (configured > 0), else the replica's
 * share of the batch in micro-batches (at least 1). */
int tr_pipe_step_micro_batches(int64_t batch, int64_t micro_batch, int64_t replicas,
                               int64_t configured);

/* Each stage's memory, estimated from the whole graph's plan (g->memory,
 * at its micro-batch) cut by chunk[] (P*V of them, tr_pipe_partition):
 * its share of the parameters, their gradients, optimizer state and the
 * backend's copies of them (by parameters; under a shard level g->memory
 * holds a replica's parts already); the whole frozen base
 * (LoRA's: every stage keeps all of it); the activations of the most
 * micro-batches the schedule has it hold at once, and one micro-batch's
 * transients, by its share of the FLOPs; the inputs.  Per stage s:
 * bytes[s], and in_flight[s] (those micro-batches, in whole-stage units:
 * chunks held / V) and flops_share[s] where not NULL.  Returns the index
 * of the largest stage, or -1 (and says why in err). */
int tr_pipe_stage_memory(const struct tr_graph *g, const struct tr_pipe_chunk *chunk,
                         enum tr_pipe_kind kind, int P, int V, int M, double *bytes,
                         double *in_flight, double *flops_share, tr_err *err);

/* For each tensor of g (readers[g->n_tensors]), the stages (bit s) whose
 * chunks read it as a parameter, chunk c running on stage c mod P; a
 * parameter no node reads is the first stage's (it updates, shares and
 * saves it, as one process would). */
void tr_pipe_readers(const struct tr_graph *g, const struct tr_pipe_chunk *chunk, int chunks, int P,
                     uint64_t *readers);

#endif
