/*
 * run_config.c's resolution, in the files that hold its parts: the slots
 * and their plugins (run_slots.c), the train section's length and batch
 * (run_train.c); install paths and ranks are run_env.c's, declared in
 * run_config.h.  Internal to core/config.
 */
#ifndef TR_RUN_PARTS_H
#define TR_RUN_PARTS_H

#include "options.h"
#include "run_config.h"

/* Bounds of the core's integer options (run_config.c's schemas), as far
 * as any real run goes and well inside what their consumers compute with
 * (micro-batches and steps meet int and uint64 arithmetic, seeds become
 * uint64): a recipe asking for more is a typo or an attack, and gets an
 * error naming the key, never a wrap. */
#define STEPS_MAX 1e12        /* steps and every step interval */
#define BATCH_MAX 16777216.0  /* 2^24 samples in a batch or micro-batch */
#define SEED_MAX 9007199254740991.0 /* 2^53 - 1: every seed a recipe number holds exactly */
#define TOKENS_MAX 1e18       /* train.tokens: a quintillion */
#define TIME_MAX 31536000.0   /* train.time: a year of seconds */


/* The plugin of slot `key` found and its options (and the core's keys of
 * the slot in `extra`) parsed; absent, default_name from default_origin. */
int tr_config_slot(struct tr_config *cfg, struct tr_slot *slot, const char *key,
                   enum tr_plugin_kind kind, const char *default_name,
                   struct tr_origin default_origin, const struct tr_schema_use *extra,
                   tr_err *err);
/* logger = { ... }: each logger plugin found and configured. */
int tr_config_loggers(struct tr_config *cfg, tr_err *err);

/* Which of train.steps, tokens and epochs sets the run's length, with
 * tokens and time read from their text; before the train options apply. */
int tr_train_length(struct tr_config *cfg, struct tr_value *root, tr_err *err);
/* The micro-batch in effect and the batch's rules across sections, once
 * the train, optimizer and parallel sections and the ranks are known. */
int tr_train_resolve_batch(struct tr_config *cfg, tr_err *err);

#endif
