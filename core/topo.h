/*
 * Thread placement with hwloc.  On the CPU, compute threads are pinned one
 * per core and loader workers run beside them (on the same cores: a worker
 * sleeps most of the time, and its prefetched batch stays in a warm cache).
 * A topology can also be loaded from hwloc's synthetic description or an
 * XML export, so placement is testable for machines this one is not.
 */
#ifndef TR_TOPO_H
#define TR_TOPO_H

#include <stdio.h>
#include <trainrun/plugin.h>

struct tr_topo;

/* source: NULL for this machine, "synthetic:<description>" (hwloc's
 * synthetic syntax, e.g. "package:2 core:8 pu:2"), or "xml:<file>". */
struct tr_topo *tr_topo_open(const char *source, tr_err *err);
void tr_topo_close(struct tr_topo *t);

int tr_topo_cores(const struct tr_topo *t);
int tr_topo_pus(const struct tr_topo *t);

/* Pin the calling process's OpenMP threads one per core (first `threads`
 * cores); returns how many were pinned. */
int tr_topo_bind_compute(struct tr_topo *t, int threads);
/* Pin the calling thread (a loader worker) to the compute threads' cores. */
int tr_topo_bind_loader(struct tr_topo *t);

/* The placement as text: which core each compute thread and the loader
 * workers use. */
void tr_topo_print(const struct tr_topo *t, int threads, int workers, FILE *out);

#endif
