/* The training loop's own state: run.c owns it and alone changes it.  The
 * end-of-step policies (policies.h) and what the run writes about itself
 * (journal.h) read it through a const pointer and call nothing back; the
 * checkpoint's record of it is struct tr_run_state (checkpoint.h). */
#ifndef TR_LOOP_H
#define TR_LOOP_H

#include "session.h"

#include <stdint.h>

struct tr_loop {
    const struct tr_session *s;  /* the session the loop steps (read-only here) */
    uint64_t step;               /* optimizer steps done */
    uint64_t first_step;         /* the step this process started at */
    uint64_t position;           /* micro-batches of the whole job consumed */
    uint64_t skipped;            /* steps skipped for non-finite gradients */
    uint64_t empty_steps;        /* steps whose every target was masked: no update */
    /* token-weighted accumulation (run.c): the last step's targets the loss
     * was taken on (all ranks), and the factor that makes its accumulated
     * gradients and loss the mean over them; 1 when every target counted */
    double step_targets, loss_norm;
    double loss, lr, grad_norm;  /* of the last step */
    double pipe_idle;            /* pipeline stages: the share of the last step's forward-
                                  * backward they sat idle, all stages (NaN: no pipeline) */
    double pipe_idle_sim;        /* the same as the schedule simulator predicts it from the
                                  * step's measured forward and backward times of each chunk */
    double pipe_idle_chunks;     /* what those times give as C = P x V stages of one chunk
                                  * each under 1F1B, the same micro-batches: a deeper
                                  * pipeline's bubble from measured times (NaN: C = P) */
    double gathered;             /* sharded parameters (gather.h): the bytes the last step's
                                  * gathers moved on this rank (NaN: not sharded) */
    double offload_wait;         /* parallel.offload overlapped: seconds the last step's
                                  * forward waited for the host's update of the step before
                                  * (NaN: not overlapped) */
    double offload_update;       /* parallel.offload: seconds the host updated since the
                                  * step before's end (NaN: no offload) */
    double offload_busy;         /* the host's updating seconds at the last step's end */
    double val_loss, val_accuracy; /* of the last evaluation (NaN before one) */
    char best[64];               /* checkpoint of the best validation loss */
    double best_val;
    uint64_t best_step;
    double stop_best;            /* early stopping: best loss by min_delta, and misses since */
    int64_t stop_misses;
    uint64_t stopped_early;      /* the step early stopping ended the run at, 0 if not */
    /* where time goes */
    double t_start, t_data, t_compute, t_optimizer, t_comm, t_eval;
    /* this process's peak resident memory (MiB) before the final checkpoint:
     * training's, without what saving takes (0: not reached) */
    double rss_train_mib;
    double tokens;               /* tokens this process trained on */
    double cost_before;          /* dollars spent by earlier runs this one resumed */
    int budget_warned, budget_stop;
    int agreed_stop;             /* the ranks agreed to stop (a signal reached one of them) */
    int quiet;                   /* no progress lines: asked for, or not rank 0 */
};

#endif
