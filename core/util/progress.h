/*
 * A terminal progress bar for long work that is not training (prepare's
 * tokenizing, export's writes): one line on stderr, redrawn in place at most
 * ten times a second, with the share done, the amount, the rate and an ETA:
 *
 *   tokenizing  41% [#########               ] 1.8/4.4 MB  21.0 MB/s  ETA 0:00:01
 *
 * Nothing is drawn when stderr is not a terminal (logs and pipes stay
 * clean).  Amounts are bytes (shown in kB, MB or GB).  tr_progress_add may be called from several
 * threads at once; draw and end from one.
 */
#ifndef TR_PROGRESS_H
#define TR_PROGRESS_H

#include <stdint.h>

struct tr_progress;

/* label: the first word of the line ("tokenizing", "exporting"); total: the
 * bytes expected (0: unknown, no share or ETA).  NULL when out of memory; a
 * NULL bar is accepted (and ignored) by every function below. */
struct tr_progress *tr_progress_start(const char *label, uint64_t total);
void tr_progress_add(struct tr_progress *p, uint64_t bytes);
/* Redraw when the last draw is 0.1 s old, or at once with force. */
void tr_progress_draw(struct tr_progress *p, int force);
/* Bytes added and seconds since start. */
uint64_t tr_progress_done(const struct tr_progress *p);
double tr_progress_elapsed(const struct tr_progress *p);
/* Draw the final state (ok) and end the line; when a bar was drawn, a
 * summary line follows on stderr ("exporting: 12.3 MB in 0.40 s, 30.7 MB/s")
 * unless the caller prints its own (summary = 0).  Frees p. */
void tr_progress_end(struct tr_progress *p, int ok, int summary);

#endif
