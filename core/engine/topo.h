/*
 * Thread placement with hwloc.  On the CPU, compute threads are pinned one
 * per core and loader workers run beside them (on the same cores: a worker
 * sleeps most of the time, and its prefetched batch stays in a warm cache).
 * A topology can also be loaded from hwloc's synthetic description or an
 * XML export, so placement is testable for machines this one is not.
 *
 * With several ranks on a node, each rank gets its own cores (docs/scale-out.md):
 *
 *   GPU ranks   local rank r drives the r-th NVIDIA GPU in PCI bus order
 *               (what CUDA calls device r with CUDA_DEVICE_ORDER=PCI_BUS_ID
 *               and all GPUs visible).  Its cores are those hwloc finds
 *               nearest that GPU (the package, die or NUMA node its PCI
 *               host bridge hangs off), shared out evenly, without overlap,
 *               among the ranks whose GPUs sit there.
 *   CPU ranks   the cores are cut into contiguous, disjoint blocks that
 *               follow NUMA nodes: with fewer ranks than nodes a rank takes
 *               whole nodes, with more the ranks of a node split its cores.
 *
 * Only when ranks outnumber the cores near them do ranks share cores.
 */
#ifndef TR_TOPO_H
#define TR_TOPO_H

#include <hwloc.h>
#include <stdio.h>
#include <trainrun/plugin.h>

struct tr_topo;

/* source: NULL for this machine, "synthetic:<description>" (hwloc's
 * synthetic syntax, e.g. "package:2 core:8 pu:2"), or "xml:<file>". */
struct tr_topo *tr_topo_open(const char *source, tr_err *err);
void tr_topo_close(struct tr_topo *t);

int tr_topo_cores(const struct tr_topo *t);
int tr_topo_pus(const struct tr_topo *t);
/* NVIDIA GPUs (PCI vendor 0x10de, display or 3D class) in the topology. */
int tr_topo_gpus(const struct tr_topo *t);

/* Pin the calling process's OpenMP threads one per core (first `threads`
 * cores, or of the rank's compute cores after tr_topo_use); returns how
 * many were pinned. */
int tr_topo_bind_compute(struct tr_topo *t, int threads);
/* Pin the calling thread (a loader worker) to the compute threads' cores,
 * or to the rank's loader cores after tr_topo_use. */
int tr_topo_bind_loader(struct tr_topo *t);

/* The placement as text: which core each compute thread and the loader
 * workers use. */
void tr_topo_print(const struct tr_topo *t, int threads, int workers, FILE *out);

/* ---- ranks ------------------------------------------------------------- */

enum tr_topo_device { TR_TOPO_CPU, TR_TOPO_CUDA };

/* One rank's share of the node.  The cpusets hold hwloc PU (OS) indices,
 * all hardware threads of each core; the caller owns them and frees them
 * with tr_topo_rank_free. */
struct tr_topo_rank {
    int local_rank, local_world;
    int gpu;                  /* index among the GPUs in PCI bus order; -1 for a CPU rank */
    char gpu_busid[16];       /* "0000:19:00.0"; "" for a CPU rank */
    hwloc_cpuset_t near;      /* the cores this rank's share is cut from: its
                                 GPU's locality, or its NUMA node(s) */
    hwloc_cpuset_t compute;   /* compute threads (GPU ranks: the host thread
                                 that drives the GPU, and its helpers) */
    hwloc_cpuset_t loader;    /* data-loader workers */
    int compute_cores, loader_cores; /* cores in each (they are the same cores on the CPU) */
    int shared;               /* 1: more ranks than cores near them, some cores are shared */
};

/* Work out where local rank `local_rank` of `local_world` ranks on this
 * node runs.  CUDA: needs at least local_world GPUs in the topology, else
 * an error that says how many were found.  The same inputs always give the
 * same answer, so every rank can compute its own without talking. */
int tr_topo_place(const struct tr_topo *t, enum tr_topo_device device, int local_world,
                  int local_rank, struct tr_topo_rank *out, tr_err *err);
void tr_topo_rank_free(struct tr_topo_rank *r);

/* This process is that rank: bind the calling thread to its compute cores
 * (threads it starts afterwards inherit them), and make tr_topo_bind_compute
 * and tr_topo_bind_loader pin inside its share.  Returns 1 when bound, 0 for
 * a topology that is not this machine or when the OS refused. */
int tr_topo_use(struct tr_topo *t, const struct tr_topo_rank *r);

/* The placement of every rank as text ("procs=N" or "gpus=N" plans). */
int tr_topo_print_ranks(const struct tr_topo *t, enum tr_topo_device device, int local_world,
                        FILE *out, tr_err *err);

/* `trainrun topo [--topology SRC] [--threads N] [--workers N] [procs=N | gpus=N]`:
 * argv[0] = "topo".  Returns the exit code. */
int tr_topo_main(int argc, char **argv);

#endif
