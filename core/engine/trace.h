/* A Chrome/Perfetto trace of a run (chrome://tracing, ui.perfetto.dev):
 * one complete event per step phase, and the forward and backward time of
 * every op on sampled steps. */
#ifndef TR_TRACE_H
#define TR_TRACE_H

#include "graph.h"

struct tr_trace;

struct tr_trace *tr_trace_open(const char *path, double origin);
/* A phase ("data", "forward+backward", "optimizer", ...) from t0 to t1 (tr_now() seconds). */
void tr_trace_phase(struct tr_trace *t, const char *name, uint64_t step, double t0, double t1);
/* A collective the communication thread ran, from t0 to t1, on a track of
 * its own ("reduce-scatter 2.5 MiB"): what overlaps compute and what not. */
void tr_trace_comm(struct tr_trace *t, const char *name, uint64_t step, double t0, double t1);
/* The graph's per-op timings of the last forward and backward. */
void tr_trace_ops(struct tr_trace *t, const struct tr_graph *g, uint64_t step);
/* The errno of the first write to the trace that failed (a full disk), 0
 * while all is well: the caller stops rather than keep a torn trace. */
int tr_trace_error(const struct tr_trace *t);
/* Ends the JSON, flushes, syncs and closes: 0, or the errno of what failed. */
int tr_trace_close(struct tr_trace *t);

#endif
