/* The policies at the end of a step (policies.c): what to do after each
 * optimizer step, decided from a read-only view of the loop (struct
 * tr_loop).  They change nothing and call nothing back; the loop (run.c)
 * acts on their answers, in this order:
 *
 *   tr_policy_log_due         a progress line and metrics every train.log_every
 *   tr_policy_budget_*        cost.budget: warn at cost.warn_at, stop at the budget
 *   tr_policy_eval_due        validation every train.eval_every and at the end,
 *   tr_policy_early_stop        then early stopping
 *   tr_policy_is_best           and keep-best
 *   tr_policy_checkpoint_due  checkpoint.every, a new best, the run's last step
 *   tr_policy_stop            the budget or early stopping ends the run here
 *
 * Preemption (a signal) and the end of the run are phases of run.c. */
#ifndef TR_POLICIES_H
#define TR_POLICIES_H

#include "loop.h"

/* The numbers the policies and the journal derive from the loop. */
double tr_loop_spent(const struct tr_loop *l); /* dollars this process has spent */
int tr_loop_over_time(const struct tr_loop *l); /* train.time reached */
/* cost.budget (earlier runs' dollars included) or train.time reached */
int tr_loop_over_budget(const struct tr_loop *l);
int tr_loop_last_step(const struct tr_loop *l); /* the step is the run's last */

int tr_policy_log_due(const struct tr_loop *l);

/* 1 when the budget warning is due now (once, rank 0). */
int tr_policy_budget_warn(const struct tr_loop *l);
/* The budget verdict after this step: 1 stops the run.  Alone the process
 * judges; with ranks rank 0's verdict came with the gradients (agreed). */
int tr_policy_budget_stop(const struct tr_loop *l, int agreed);

int tr_policy_eval_due(const struct tr_loop *l);

/* Early stopping after an evaluation of val_loss: the new best, misses,
 * and the step it stops the run at (0: it goes on). */
struct tr_early_stop {
    double best;
    int64_t misses;
    uint64_t stopped_at;
};
struct tr_early_stop tr_policy_early_stop(const struct tr_loop *l, double val_loss);
/* Keep-best: 1 when val_loss is the best yet and checkpoint.keep_best. */
int tr_policy_is_best(const struct tr_loop *l, double val_loss);

enum tr_checkpoint_due {
    TR_CHECKPOINT_NONE,
    TR_CHECKPOINT_DUE,   /* every N steps or a new best: in the background when async */
    TR_CHECKPOINT_FINAL, /* the run ends after it: written now, and it must land */
};
enum tr_checkpoint_due tr_policy_checkpoint_due(const struct tr_loop *l, int improved,
                                                int stopping);

enum tr_stop_reason { TR_STOP_NONE, TR_STOP_TIME, TR_STOP_BUDGET, TR_STOP_EARLY };
enum tr_stop_reason tr_policy_stop(const struct tr_loop *l);
/* The stop's line (rank 0 says it). */
void tr_policy_say_stop(const struct tr_loop *l, enum tr_stop_reason why);

#endif
