/* The run directory (rundir.c): one writer at a time, no fresh run over an
 * earlier one, the run's tokenizer and its recorded recipe. */
#ifndef TR_RUNDIR_H
#define TR_RUNDIR_H

#include "session.h"

/* run_dir/trainrun.lock, held by rank 0 while the run writes */
struct tr_rundir_lock {
    int held, fd;
};
int tr_rundir_lock(const struct tr_config *cfg, struct tr_rundir_lock *lock, tr_err *err);
void tr_rundir_unlock(struct tr_rundir_lock *lock);
/* A fresh run in a directory that holds an earlier one is refused. */
int tr_rundir_refuse_earlier(const struct tr_config *cfg, tr_err *err);

/* The tokenizer that made the session's data (tr_data_info.tokenizer).
 * Setup: the model has a row for each of its ids, and model = { from = DIR }
 * with a DIR/tokenizer.json was trained with the same one (by content).
 * Start (rank 0, fresh or resumed): copied into run_dir/tokenizer.json. */
int tr_rundir_check_tokenizer(const struct tr_session *s, tr_err *err);
/* The same for a data source opened without a session (show), and byte ids
 * (a data source with no tokenizer and ids below 256) refused for a
 * model.from whose DIR has a tokenizer.json; g is the model's graph (its
 * token embedding and logits give its vocabulary). */
int tr_check_data_tokenizer(const struct tr_config *cfg, const struct tr_graph *g,
                            const char *data_name, const struct tr_data_info *di, int rank,
                            tr_err *err);
int tr_rundir_record_tokenizer(const struct tr_session *s, int resume, tr_err *err);

/* The resolved recipe into run_dir/recipe.resolved(.json); a resume compares first. */
int tr_rundir_record_recipe(const struct tr_config *cfg, int resumed, int allow_changes,
                            tr_err *err);

#endif
