/*
 * What the schedules share: the same linear warmup, and how far the decay
 * after it has come.  Static inline: each schedule is its own shared object.
 */
#ifndef TR_SCHEDULE_WARMUP_H
#define TR_SCHEDULE_WARMUP_H

#include <stdint.h>

/* During the first `warmup` steps: *lr = base_lr * (step+1) / warmup, and 1. */
static inline int warming_up(uint64_t step, uint64_t warmup, double base_lr, double *lr)
{
    if (step >= warmup)
        return 0;
    *lr = base_lr * (double)(step + 1) / (double)warmup;
    return 1;
}

/* 0 at the first step after warmup, 1 at the last step (total - 1) and after. */
static inline double decay_progress(uint64_t step, uint64_t warmup, uint64_t total)
{
    if (total <= warmup + 1)
        return 1.0;
    double progress = (double)(step - warmup) / (double)(total - 1 - warmup);
    return progress > 1.0 ? 1.0 : progress;
}

#endif
