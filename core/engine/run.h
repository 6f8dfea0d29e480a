/* The step loop and the things built on it: training (run.c, with its
 * policies in policies.c), smoke runs (smoke.c) and sampling (sample.c).
 * Their shared internals are in run_internal.h, which only they include. */
#ifndef TR_RUN_H
#define TR_RUN_H

#include "../config/run_config.h"

/* Exit codes a launcher can act on. */
#define TR_EXIT_OK 0
#define TR_EXIT_ERROR 1
#define TR_EXIT_USAGE 2
#define TR_EXIT_PREEMPTED 75 /* checkpointed after SIGTERM/SIGUSR1: requeue and --resume auto */

struct tr_run_flags {
    int resume;   /* continue from the newest good checkpoint if any */
    int quiet;    /* no progress lines */
    int smoke;    /* a smoke run: end with a checkpoint save+load round trip */
};

/* `trainrun --smoke`: the recipe's memory at its full micro-batch against the
 * target device, then 2 optimizer steps on the CPU with a tiny batch through
 * the real data source and a checkpoint round trip.  Prints "ready to launch"
 * or the failure. */
int tr_smoke(const char *recipe, const char *const *overrides, int n_overrides, int quiet);

/* Train the configured recipe; returns an exit code. */
int tr_train(struct tr_config *cfg, const struct tr_run_flags *flags);

struct tr_sample_flags {
    const char *checkpoint; /* run dir, checkpoints dir, or one checkpoint */
    const char *prompt;
    int tokens;
    double temperature;
    int top_k;
    uint64_t seed;
    const char *recipe; /* override the recipe recorded in the checkpoint */
};
int tr_sample(const struct tr_sample_flags *flags);

#endif
