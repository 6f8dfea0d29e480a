/* Calls into the plugins of a run: the one choke point per plugin kind.
 *
 * The engine calls a precision, schedule, data or logger plugin only
 * through these wrappers.  The other contracts have a choke point of their
 * own: the checkpoint kind is called only by the checkpointer's files
 * (checkpoint.c, checkpoint_write.c, where the optional put_stream is
 * checked, and checkpoint_read.c), comm only by comm.c's thread, a data source's
 * reads only by loader.c, and backends only through backend.h's tr_be_*.  Each optional slot is
 * checked here and its default lives here, as SQLite's os.c does for its
 * VFS: a slot appended to a vtable in include/trainrun/plugin.h is handled
 * in this one place.  A slot is the recipe's choice of a plugin
 * (struct tr_slot, config/run_config.h), created before it is called. */
#ifndef TR_PLUGIN_CALLS_H
#define TR_PLUGIN_CALLS_H

#include "../config/run_config.h"

/* ---- precision ---------------------------------------------------------- */

/* The policy, zeroed first (fields an older plugin leaves out read 0). */
void tr_precision_policy_of(const struct tr_slot *s, struct tr_precision_policy *out);
/* The factor the loss gradient is multiplied by (1 without the slot). */
double tr_precision_loss_scale(const struct tr_slot *s);
/* Whether the plugin decides about steps with non-finite gradients (its
 * update slot); without it such a step ends the run. */
int tr_precision_decides_steps(const struct tr_slot *s);
/* 1: apply the step, 0: skip it, TR_ERROR: stop (without the slot: apply
 * when the gradients are finite). */
int tr_precision_update(const struct tr_slot *s, int grads_finite, tr_err *err);

/* ---- schedule ----------------------------------------------------------- */

double tr_schedule_lr(const struct tr_slot *s, uint64_t step, uint64_t total, double base_lr);
/* a validation metric after an evaluation (nothing without the slot) */
void tr_schedule_observe(const struct tr_slot *s, uint64_t step, double metric);

/* ---- state a precision or schedule plugin keeps in checkpoints ------------ */

/* Its variables into vars[0..cap); how many (0 without the slot). */
size_t tr_plugin_state_save(const struct tr_slot *s, struct tr_state_var *vars, size_t cap);
/* Its variables back (nothing to do without the slot). */
int tr_plugin_state_load(const struct tr_slot *s, const struct tr_state_var *vars, size_t n,
                         tr_err *err);

/* ---- data --------------------------------------------------------------- */

/* What the source offers, zeroed first (fields an older plugin leaves out read 0). */
int tr_data_info_of(const struct tr_slot *s, struct tr_data_info *out, tr_err *err);

/* ---- loggers ------------------------------------------------------------ */

int tr_logger_open(const struct tr_slot *s, int resume, tr_err *err);
/* a text value (run metadata); TR_OK without the slot */
int tr_logger_text(const struct tr_slot *s, uint64_t step, const char *key, const char *value,
                   tr_err *err);
int tr_logger_scalars(const struct tr_slot *s, uint64_t step, const struct tr_scalar *v, size_t n,
                      tr_err *err);
int tr_logger_flush(const struct tr_slot *s, tr_err *err); /* TR_OK without the slot */
int tr_logger_close(const struct tr_slot *s, tr_err *err); /* TR_OK without the slot */

#endif
