/* What a run writes about itself (journal.c), rank 0: metrics.jsonl (whole
 * lines or a stop), the same numbers to the recipe's logger plugins
 * (logger = { "csv", "tensorboard" }, named as in metrics.jsonl), the
 * progress and validation lines on stderr, trace.json and the summary.
 * The numbers come from a read-only view of the loop (loop.h). */
#ifndef TR_JOURNAL_H
#define TR_JOURNAL_H

#include "loop.h"
#include "trace.h"

#include <sys/types.h>

struct tr_journal {
    const struct tr_config *cfg;
    int metrics_open, metrics_fd; /* metrics.jsonl, rank 0 only */
    char *metrics_path;
    off_t metrics_good;           /* metrics.jsonl up to here holds whole lines */
    int loggers_open;             /* cfg->loggers[0..loggers_open) created and opened */
    struct tr_trace *trace;       /* trace.json, when train.trace_every */
};

/* metrics.jsonl (appended to when resuming, else started afresh), the
 * logger plugins, and trace.json (a resumed run's keeps the earlier one as
 * trace-N.json) from t_start on. */
int tr_journal_open(struct tr_journal *j, const struct tr_loop *l, int resume, tr_err *err);
/* The progress line (unless quiet), the loggers' scalars and metrics.jsonl's line. */
int tr_journal_step(struct tr_journal *j, const struct tr_loop *l, tr_err *err);
/* An evaluation's line, scalars and metrics.jsonl line. */
int tr_journal_eval(struct tr_journal *j, const struct tr_loop *l, tr_err *err);
/* trace.json could not be written: the error to stop with. */
int tr_journal_trace_failed(const struct tr_journal *j, const struct tr_loop *l, int errnum,
                            tr_err *err);
/* The end of a run: metrics, loggers and trace complete on disk, or the reason not. */
int tr_journal_close(struct tr_journal *j, const struct tr_loop *l, tr_err *err);
/* Closes whatever is still open, without a word (after a failure). */
void tr_journal_drop(struct tr_journal *j);
/* The run's summary on stderr; t_checkpoint: seconds the step waited for checkpoints. */
void tr_journal_summary(const struct tr_loop *l, double elapsed, double t_checkpoint);

#endif
