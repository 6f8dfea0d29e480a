/* The policies at the end of a step (policies.h): pure decisions over a
 * read-only view of the loop. */
#include "policies.h"

#include <math.h>
#include <stdio.h>

double tr_loop_spent(const struct tr_loop *l)
{
    return (tr_now() - l->t_start) * l->s->usd_per_second;
}

int tr_loop_over_time(const struct tr_loop *l)
{
    const struct tr_config *cfg = l->s->cfg;
    return cfg->train.time > 0 && tr_now() - l->t_start >= cfg->train.time;
}

/* cost.budget or train.time reached (this process's view of the dollars
 * spent): both stop the run the same way, with a checkpoint */
int tr_loop_over_budget(const struct tr_loop *l)
{
    const struct tr_config *cfg = l->s->cfg;
    return (cfg->cost.budget > 0 && l->cost_before + tr_loop_spent(l) >= cfg->cost.budget) ||
           tr_loop_over_time(l);
}

int tr_loop_last_step(const struct tr_loop *l)
{
    return l->step == (uint64_t)l->s->cfg->train.steps;
}

/* Logging: a progress line and a metrics line every train.log_every steps. */
int tr_policy_log_due(const struct tr_loop *l)
{
    return l->step % (uint64_t)l->s->cfg->train.log_every == 0 || tr_loop_last_step(l);
}

/* Budget: warn at cost.warn_at of cost.budget, stop (with a checkpoint) at it
 * or at train.time. */
int tr_policy_budget_warn(const struct tr_loop *l)
{
    const struct tr_cost_config *c = &l->s->cfg->cost;
    return c->budget > 0 && !l->budget_warned && l->s->rank == 0 &&
           l->cost_before + tr_loop_spent(l) >= c->warn_at * c->budget;
}

int tr_policy_budget_stop(const struct tr_loop *l, int agreed)
{
    const struct tr_config *cfg = l->s->cfg;
    if (cfg->cost.budget <= 0 && cfg->train.time <= 0)
        return agreed;
    int stop = l->s->world == 1 ? tr_loop_over_budget(l) || agreed : agreed;
    return tr_loop_last_step(l) ? 0 : stop;
}

int tr_policy_eval_due(const struct tr_loop *l)
{
    const struct tr_config *cfg = l->s->cfg;
    return (cfg->train.eval_every && l->step % (uint64_t)cfg->train.eval_every == 0) ||
           tr_loop_last_step(l);
}

/* Early stopping: early_stop.patience evaluations without an improvement of
 * more than min_delta end the run. */
struct tr_early_stop tr_policy_early_stop(const struct tr_loop *l, double val_loss)
{
    const struct tr_config *cfg = l->s->cfg;
    struct tr_early_stop e = {l->stop_best, l->stop_misses, l->stopped_early};
    if (cfg->early_stop.patience <= 0)
        return e;
    if (isnan(e.best) || val_loss < e.best - cfg->early_stop.min_delta) {
        e.best = val_loss;
        e.misses = 0;
    } else if (++e.misses >= cfg->early_stop.patience && !tr_loop_last_step(l)) {
        e.stopped_at = l->step;
    }
    return e;
}

int tr_policy_is_best(const struct tr_loop *l, double val_loss)
{
    return l->s->cfg->checkpoint_policy.keep_best && (isnan(l->best_val) || val_loss < l->best_val);
}

/* Checkpoint cadence: every checkpoint.every steps, a new best, and the
 * step the run ends at (last, budget, early stop); none once a signal
 * stops the run (the preemption checkpoint follows). */
enum tr_checkpoint_due tr_policy_checkpoint_due(const struct tr_loop *l, int improved,
                                                int stopping)
{
    const struct tr_config *cfg = l->s->cfg;
    int due = cfg->checkpoint_policy.every && l->step % (uint64_t)cfg->checkpoint_policy.every == 0;
    int final = tr_loop_last_step(l) || l->budget_stop || l->stopped_early;
    if (!(due || final || improved) || stopping)
        return TR_CHECKPOINT_NONE;
    return final ? TR_CHECKPOINT_FINAL : TR_CHECKPOINT_DUE;
}

/* The budget or early stopping ends the run here (its checkpoint is saved). */
enum tr_stop_reason tr_policy_stop(const struct tr_loop *l)
{
    if (l->budget_stop && tr_loop_over_time(l))
        return TR_STOP_TIME;
    if (l->budget_stop)
        return TR_STOP_BUDGET;
    return l->stopped_early ? TR_STOP_EARLY : TR_STOP_NONE;
}

void tr_policy_say_stop(const struct tr_loop *l, enum tr_stop_reason why)
{
    const struct tr_config *cfg = l->s->cfg;
    if (l->s->rank != 0)
        return;
    if (why == TR_STOP_TIME)
        tr_log(TR_LOG_WARN, NULL, "stopping at step %llu: train.time (%.0f s) reached; "
               "checkpoint saved (--resume auto goes on, with the time again)",
               (unsigned long long)l->step, cfg->train.time);
    else if (why == TR_STOP_BUDGET)
        tr_log(TR_LOG_WARN, "budget", "stopping at step %llu: $%.2f spent reaches the $%.2f "
               "budget; checkpoint saved (raise cost.budget and --resume auto to go on)",
               (unsigned long long)l->step, l->cost_before + tr_loop_spent(l), cfg->cost.budget);
    else if (why == TR_STOP_EARLY)
        tr_log(TR_LOG_INFO, NULL, "early stop at step %llu: the validation loss has not "
               "improved by more than %g for %lld evaluations (best %.4f at step %llu)",
               (unsigned long long)l->step, cfg->early_stop.min_delta,
               (long long)cfg->early_stop.patience, l->best_val, (unsigned long long)l->best_step);
}
