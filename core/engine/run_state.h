/* A run's state in and out of checkpoints (run_state.c): saving the
 * session's weights and optimizer state with the loop's record (struct
 * tr_run_state, checkpoint.h), resuming from the newest good checkpoint,
 * and ZeRO-1, the optimizer state sharded across ranks: gathered on rank 0
 * to save, shared out again on resume.  Called by the loop (run.c) only. */
#ifndef TR_RUN_STATE_H
#define TR_RUN_STATE_H

#include "session.h"

/* The optimizer's update count and the precision and schedule plugins'
 * state into st (the loop fills the rest). */
void tr_state_capture(const struct tr_session *s, struct tr_run_state *st);

/* A checkpoint of the session with st; `now`: written before returning,
 * else in the background when checkpoint.async.  Every rank calls it (they
 * gather a sharded state); rank 0 writes. */
int tr_state_save(struct tr_session *s, const struct tr_run_state *st, int now, tr_err *err);

/* Pipeline stages: every rank writes the parameter tensors owner[] gives
 * it (whole, weights and optimizer state) into a blob of its own, in
 * parallel, and rank 0 publishes the checkpoint (checkpoint_shard.h), where
 * the checkpoint plugin can take one from several ranks
 * (tr_state_can_save_owned); no rank gathers anything. */
int tr_state_can_save_owned(const struct tr_session *s);
int tr_state_save_owned(struct tr_session *s, const struct tr_run_state *st, const int *owner,
                        tr_err *err);

/* The newest good checkpoint into the session (rank 0 reads, every rank
 * takes the same state): 1 with *st filled and the plugins' state
 * restored, 0 when there is none, TR_ERROR. */
int tr_state_resume(struct tr_session *s, struct tr_run_state *st, tr_err *err);

/* This rank holds a shard of the optimizer state (ZeRO-1). */
int tr_state_sharded(const struct tr_session *s);
/* After each rank updated its shard: every rank gets every shard. */
int tr_state_share_params(struct tr_session *s, tr_err *err);

/* Sharded parameters (level parameters) whole on rank 0; every rank calls
 * it, and releases them after (tr_gather_release_all).  Nothing to do at
 * the other levels. */
int tr_state_gather_params(struct tr_session *s, tr_err *err);

/* A smoke run's check: checkpoint step-<step> read back into fresh buffers
 * holds what the session has (on rank 0: its weights must be whole). */
int tr_state_round_trip(struct tr_session *s, uint64_t step, tr_err *err);

#endif
