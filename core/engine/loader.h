/*
 * The data loader: worker threads fill a bounded ring of micro-batches ahead
 * of the step loop.  Micro-batch k is a pure function of (seed, k): epoch =
 * k / batches_per_epoch, and the samples are a seeded permutation of the
 * split for that epoch — so the order does not depend on the number of
 * workers, and a resumed run continues at the exact sample.
 */
#ifndef TR_LOADER_H
#define TR_LOADER_H

#include <signal.h>
#include <stdint.h>
#include <trainrun/plugin.h>

struct tr_loader;

struct tr_data_source {
    const struct tr_data_vtable *vt;
    void *self;
    struct tr_data_info info;
    const char *name; /* plugin name, for messages */
};

struct tr_topo;

struct tr_loader_config {
    enum tr_split split;
    int batch;      /* samples per micro-batch */
    int workers;    /* 0: read synchronously in the caller */
    int prefetch;   /* micro-batches buffered ahead (>= 1) */
    int shuffle;    /* permute samples each epoch */
    uint64_t seed;
    struct tr_topo *topo; /* where workers run (NULL: anywhere) */
    /* data parallelism: this loader's micro-batch k is the job's micro-batch
     * k * stride + rank (stride 0 or 1: alone), so ranks read disjoint parts
     * of every global batch and together read what one process would */
    int rank, stride;
    /* when set and *cancel turns non-zero (the stop flag, set by the thread
     * that takes the stop signals: stop_signals.h), a wait for workers ends
     * with an error instead of blocking, and close stops waiting for a
     * worker stuck in a read after a grace period */
    volatile sig_atomic_t *cancel;
    /* unshuffled: read samples 0, step, 2 * step, ... (0 or 1: every one), so
     * an in-order pass over windows that overlap (tr_data_info.eval_stride)
     * sees each token once; an epoch is then samples / step of them */
    uint64_t step;
};

struct tr_loader *tr_loader_open(const struct tr_data_source *src,
                                 const struct tr_loader_config *cfg, uint64_t start, tr_err *err);
void tr_loader_close(struct tr_loader *l);

/* Copy micro-batch number `next` into inputs/targets and advance.  Adds the
 * time spent waiting for workers to *wait_seconds.  TR_ERROR when a read
 * failed, or when cancelled while waiting (tr_loader_cancelled says so). */
int tr_loader_next(struct tr_loader *l, void *inputs, int32_t *targets, double *wait_seconds,
                   tr_err *err);

/* Micro-batches consumed so far (the resumable position), and per epoch. */
uint64_t tr_loader_position(const struct tr_loader *l);
int tr_loader_cancelled(const struct tr_loader *l);
uint64_t tr_loader_batches_per_epoch(const struct tr_loader *l);

/* The sample index at position i of `epoch`'s order (exposed for tests). */
uint64_t tr_loader_sample(uint64_t seed, uint64_t epoch, uint64_t i, uint64_t n, int shuffle);

#endif
