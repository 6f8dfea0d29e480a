/*
 * Pipeline parallelism, run: each rank is one stage and runs its chunks of
 * the graph (pipeline.h's cut) for the micro-batches of a step in its
 * schedule's order, activations going to the next stage and their
 * gradients coming back through the comm plugin's sendrecv slot.
 *
 *   stage s runs chunks s, s + P, ... (V of them); chunk c's nodes are
 *   [first_node, last_node] of the full graph
 *   F(m, c): recv (c > 0) the tensors live across the cut before c
 *            forward of c's nodes; loss (last chunk)
 *            send (c < C-1) the tensors live across the cut after c
 *   B(m, c): recv (c < C-1) those tensors' gradients
 *            backward of c's nodes (when the stage ran another forward of
 *            c since, m's activations come back first from the host
 *            memory they were copied to before that forward)
 *            send (c > 0) the gradients of what it received
 *
 * Each consecutive send and receive of a stage travel in one sendrecv
 * call, as Megatron-LM pairs them, so neighbours exchanging at once never
 * wait on each other.  Every stage holds the whole graph's memory plan
 * (parameters of other stages included, never touched in the step) but
 * runs only its chunks; a parameter read by several stages (tied
 * embeddings) has its gradient summed over them.  With procs = P x D, ranks
 * r P .. r P + P - 1 are replica r's stages; each replica reads its share of
 * the step's micro-batches (all its stages the same ones) and the
 * gradients are summed over the replicas (or reduce-scattered among them,
 * under a shard level: tr_pipe_exec_zero).
 */
#ifndef TR_PIPELINE_EXEC_H
#define TR_PIPELINE_EXEC_H

#include "comm.h"
#include "pipeline.h"

struct tr_session;
struct tr_pipe_exec;
enum { TR_PIPE_MAX_CHUNKS = 64 };
struct tr_loader;

/* The stage of s's rank: the cut, the tensors crossing each cut, the
 * schedule's ops, the buffers of M micro-batches in flight.  Refuses a
 * comm plugin without sendrecv, naming it. */
struct tr_pipe_exec *tr_pipe_exec_new(struct tr_session *s, tr_err *err);
/* This rank's stage (rank mod P) and replica (rank / P). */
int tr_pipe_exec_stage(const struct tr_pipe_exec *x);
int tr_pipe_exec_replica(const struct tr_pipe_exec *x);
void tr_pipe_exec_free(struct tr_pipe_exec *x, const struct tr_backend *be);

/* What one step did on this stage. */
struct tr_pipe_step {
    double loss_sum;  /* the weighted sum of the micro-batches' losses (last stage; else 0) */
    double targets;   /* targets the loss was taken on (every stage counts them) */
    double busy;      /* seconds this stage computed */
    double waited;    /* seconds in sendrecv */
    double t0, t1;    /* the step's forward-backward, wall clock */
    /* the mean seconds of a forward and of a backward (copies of activations
     * included) of each chunk over the step's micro-batches: this stage's
     * chunks filled, the others 0 (a sum over the stages fills them all) */
    float forward[TR_PIPE_MAX_CHUNKS], backward[TR_PIPE_MAX_CHUNKS];
};

/* The micro-batches of one step (s->accum, from the loader), through this
 * stage's ops; then the gradients of parameters several stages read summed
 * over them.  scale: the loss scale over the micro-batches (the caller's
 * mean).  Parameter gradients are zeroed first and accumulated. */
int tr_pipe_exec_step(struct tr_pipe_exec *x, struct tr_session *s, struct tr_loader *loader,
                      double mean, uint64_t step, struct tr_pipe_step *out, tr_err *err);

/* One micro-batch's forward through the stages (an evaluation: the inputs
 * in the graph, every stage of the replica called alike, in no schedule
 * but chunk order); the last chunk's stage holds its loss and logits
 * after.  tr_eval_pass's forward (session.h): ctx is the stage. */
int tr_pipe_exec_forward(void *x, struct tr_session *s, tr_err *err);
/* Whether this stage runs the last chunk (the loss). */
int tr_pipe_exec_has_loss(const struct tr_pipe_exec *x);

/* The squared norm of the step's gradients over every stage: each
 * parameter counted once, on the first stage that reads it. */
int tr_pipe_exec_sumsq(struct tr_pipe_exec *x, struct tr_session *s, double *sumsq, tr_err *err);

/* What each stage owns, from the stage that owns it (the first that reads
 * it): to every rank, the parameters (before an evaluation, which reads the
 * whole model); to rank 0, the parameters and optimizer state (before a
 * checkpoint, which rank 0 writes). */
enum tr_pipe_share { TR_PIPE_SHARE_PARAMS, TR_PIPE_SHARE_SAVE };
int tr_pipe_exec_share(struct tr_pipe_exec *x, struct tr_session *s, enum tr_pipe_share what,
                       tr_err *err);

/* For each tensor of the graph, the rank that writes it to a checkpoint:
 * a parameter's first reading stage in replica 0 (rank = stage), -1 for
 * the rest. */
const int *tr_pipe_exec_owners(const struct tr_pipe_exec *x);

/* The memory of what this stage's chunks do not read given back: the
 * parameters, gradients and optimizer state of other stages' parameters
 * (the backend's discard; they read as zeros after).  Once the weights are
 * in place, and after each share.  A backend without discard keeps them. */
void tr_pipe_exec_release(struct tr_pipe_exec *x, struct tr_session *s);

/* parallel.shard = "optimizer" or "gradients" with data-parallel replicas
 * (ZeRO-1 or ZeRO-2 inside stages): each replica's stage updates, and
 * keeps optimizer state for, only its part of each piece of the stage's
 * parameters (runs of one chunk's, cut in pieces of parallel.bucket_mb,
 * each piece in D parts: shard.h's rule over the stage's chunks).  The
 * gradients are reduce-scattered among the stage's replicas (under
 * "gradients" piece by piece during the backward, the other replicas'
 * parts given back) where the comm plugin has the group slots (ABI 2.7),
 * else summed whole.  Whether this stage does. */
int tr_pipe_exec_zero(const struct tr_pipe_exec *x);
/* Under it, buf (the parameters after an update, or a state slot before a
 * checkpoint; be's memory) whole on every replica again: each piece's
 * parts all-gathered among the stage's replicas (tr_comm_allgather_group);
 * without the group slots each of the stage's tensors summed among its
 * readers in every replica, the first reading stage adding its replica's
 * parts and zeros elsewhere, the other readers zeros (twice an
 * all-gather's bytes).  Nothing otherwise. */
int tr_pipe_exec_share_parts(struct tr_pipe_exec *x, struct tr_session *s, float *buf,
                             const struct tr_backend *be, tr_err *err);

/* The times of the last step's ops on this stage, for the trace: each
 * forward and backward, and each send and receive (with the micro-batch
 * and chunk of the op it comes before; -1 after the last); what is left of
 * the step between them is the stage's idle time. */
enum tr_pipe_span_kind { TR_PIPE_SPAN_FORWARD, TR_PIPE_SPAN_BACKWARD, TR_PIPE_SPAN_SENDRECV };
struct tr_pipe_span {
    enum tr_pipe_span_kind kind;
    int micro, chunk;
    double t0, t1;
};
size_t tr_pipe_exec_spans(const struct tr_pipe_exec *x, const struct tr_pipe_span **spans);

/* chunks (stages x virtual stages) and micro-batches a step */
int tr_pipe_exec_chunks(const struct tr_pipe_exec *x);

#endif
