/*
 * The shard layout of data parallelism: which rank keeps (and updates) which
 * part of the flat parameter buffer, its gradients and optimizer state.
 * One rule, used by the optimizer (what it updates), the gradient buckets
 * (what each reduce-scatter leaves where), the parameter all-gather after
 * the update, and the checkpoint's gather and resume (run_state.c).
 *
 * The buffer (n floats) is cut into units of `unit` floats, a multiple of
 * the world size (the last unit shorter); the units are the gradient
 * buckets.  Each unit is cut into world equal parts of len / world floats;
 * rank q owns part q of every unit, and the last rank also the len % world
 * floats left over at the end of a unit (only the last unit has any).
 *
 *   unit u:  [ part 0 | part 1 | ... | part world-1 + leftover ]
 *
 * So a unit's reduce-scatter (world x part floats) leaves each rank its
 * part, the leftover is all-reduced, and the all-gather of the updated
 * parameters is the reverse: equal counts on every rank, the collectives
 * every comm plugin has.  Alone (world 1), a rank owns one run: everything.
 */
#ifndef TR_SHARD_H
#define TR_SHARD_H

#include "../config/run_config.h" /* enum tr_shard_level */

#include <stddef.h>

struct tr_shard {
    size_t n;       /* floats in the flat buffer */
    size_t unit;    /* floats per unit: a multiple of world (the last unit shorter) */
    size_t n_units;
    int rank, world;
    enum tr_shard_level level;
};

struct tr_shard_run {
    size_t begin, end; /* floats of the flat buffer */
};

/* The layout of n floats over world ranks in units of unit_floats rounded
 * up to a multiple of world, as rank `rank`. */
void tr_shard_init(struct tr_shard *s, size_t n, size_t unit_floats, int rank, int world,
                   enum tr_shard_level level);

/* The unit of a run's layout: parallel.bucket_mb in floats, at least 1024
 * (smaller buckets cost more calls than they hide). */
size_t tr_shard_unit_floats(const struct tr_config *cfg);

/* Unit u's floats [begin, end); its part length (the reduce-scatter's
 * count per rank, len / world) and its leftover (len % world, the last
 * rank's besides its part). */
struct tr_shard_run tr_shard_unit(const struct tr_shard *s, size_t u);
size_t tr_shard_part_len(const struct tr_shard *s, size_t u);

/* Rank q's part of unit u (leftover included for the last rank). */
struct tr_shard_run tr_shard_part(const struct tr_shard *s, size_t u, int q);

/* Floats rank q owns over all units. */
size_t tr_shard_owned(const struct tr_shard *s, int q);

/* Whether ranks keep only their part of the optimizer state (any level but
 * none, with more than one rank). */
int tr_shard_sharded(const struct tr_shard *s);

/* "none", "optimizer", "gradients", "parameters": the recipe's words. */
const char *tr_shard_level_name(enum tr_shard_level level);

/* Unit u of buf (a flat buffer of this layout, backend memory) but this
 * rank's part, discarded through the backend, or zeroed where it cannot
 * discard: it reads as zeros after. */
struct tr_backend;
void tr_shard_discard_others(const struct tr_backend *be, float *buf, const struct tr_shard *s,
                             size_t u);
/* The same for a buffer of elem bytes an element laid out alike (the
 * parameters' 16-bit copy, tr_graph.params16). */
void tr_shard_discard_others_of(const struct tr_backend *be, void *buf, size_t elem,
                                const struct tr_shard *s, size_t u);

#endif
