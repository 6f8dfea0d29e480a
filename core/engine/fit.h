/* Does it fit?  The one answer to how much memory a recipe needs on its
 * device, and the largest micro-batch that fits: `micro_batch = "auto"`
 * (session.c), `trainrun plan`, `--smoke` and setup's own check all ask
 * here, so they print the same numbers for the same recipe.
 *
 * The method: the model's graph is built at a micro-batch and its memory
 * plan measured, allocating nothing (tr_graph_measure, with the precision
 * policy's compute dtype and the optimizer's state slots).  The largest
 * micro-batch is searched by measuring each candidate (the divisors of the
 * samples one device takes per step, largest first): no extrapolation. */
#ifndef TR_FIT_H
#define TR_FIT_H

#include "graph.h"
#include "../config/run_config.h"

/* The one margin: a plan may use the device's memory less this share,
 * which the allocator and the runtime keep. */
#define TR_MEMORY_MARGIN 0.10

/* What one measurement needs: the recipe's model and how it is stored. */
struct tr_fit_model {
    const struct tr_config *cfg;
    const struct tr_backend *be;   /* answers each node's scratch; nothing is allocated */
    enum tr_dtype compute;         /* the precision policy's GEMM dtype */
    int optimizer_slots;           /* 0: no optimizer state (eval, sample) */
    /* 1: measured on the CPU backend for another device (plan, smoke): the
     * CPU's own copy of the weights (its bf16 GEMMs') is no memory there */
    int other_device;
    /* ranks the optimizer state is cut over (parallel.shard at any level,
     * with the run's ranks or the plan's devices); 1: none */
    int shard_world;
    enum tr_shard_level level; /* parallel.shard's (plan: each level in turn) */
    /* parallel.offload = "optimizer": the optimizer state (and the fp32
     * master copy) is host memory, none of it on the device */
    int offload;
    /* ... overlapping the next forward (parallel.offload_overlap): the
     * gradients of the state's parts are on the host too */
    int offload_overlap;
    /* the micro-batch search under parallel.pipeline (tr_session_fit_search
     * sets them; 0 elsewhere): a measure is then the largest stage's
     * estimate (pipeline.h, tr_pipe_stage_memory) at the micro-batches a
     * step of replica_batch samples makes, since a device holds one stage */
    int stages;
    int64_t replica_batch;
};

/* A measured plan of graph g as the target device holds it (other_device),
 * at the fit model's shard level: the optimizer state as the largest rank's
 * part; at "gradients" and "parameters" the gradients as that part plus
 * the units in flight, at "parameters" the parameters too (gather.h's
 * peaks). */
void tr_fit_adjust(const struct tr_fit_model *fm, const struct tr_graph *g,
                   struct tr_memory_report *report);
/* Host memory parallel.offload = "optimizer" takes for n_params: every
 * state slot and the fp32 master copy (and the gradients, overlapped), 4
 * bytes a parameter each (0 without offload), of the largest rank's parts
 * under a shard level. */
size_t tr_fit_host_bytes(const struct tr_fit_model *fm, size_t n_params);

/* The device a plan must fit: train.memory_budget, else cost.hardware's
 * memory, else 80 GiB for an unnamed accelerator, else this machine's. */
struct tr_fit_device {
    double bytes;                  /* the device's memory */
    double usable;                 /* bytes less TR_MEMORY_MARGIN */
    char what[128];                /* the device in words, for messages */
};
void tr_fit_device_of(const struct tr_config *cfg, struct tr_fit_device *d);

/* The model's plan at micro-batch m, measured: *report filled, the total
 * returned in *bytes.  TR_ERROR when the model does not build at m. */
/* Under parallel.pipeline (cfg's stages, schedule and micro-batches): the
 * largest stage's estimate from g's plan (g->memory) at micro-batch m, a
 * replica's step having replica_batch samples (pipeline.h,
 * tr_pipe_stage_memory), in *bytes, and that stage in *stage (may be
 * NULL).  search: a count of micro-batches the interleaved schedule cannot
 * take is measured at the next it can (the search goes on from there);
 * else it is the error it would be in a run. */
int tr_fit_stages(const struct tr_config *cfg, const struct tr_graph *g, int64_t replica_batch,
                  int64_t m, int search, size_t *bytes, int *stage, tr_err *err);
int tr_fit_measure(const struct tr_fit_model *fm, int64_t m, struct tr_memory_report *report,
                   size_t *bytes, tr_err *err);

/* The samples each device takes per step: the batch shared by the ranks
 * (the whole batch when they cannot share it evenly). */
int64_t tr_fit_per_device(int64_t batch, int64_t devices);

/* The largest micro-batch that divides per_device and whose plan fits
 * `usable` bytes: *m, its plan's *report and total *bytes; *m = 0 when not
 * even 1 fits (*report and *bytes are then the plan at 1). */
int tr_fit_largest(const struct tr_fit_model *fm, int64_t per_device, double usable, int64_t *m,
                   struct tr_memory_report *report, size_t *bytes, tr_err *err);

/* What lora.base = "auto" stores a frozen base in on be: the compute
 * dtype where the backend stores frozen weights in 16 bits, else fp32
 * (the session's graph and every graph the fit search measures agree). */
enum tr_dtype tr_fit_base_auto(const struct tr_backend *be, enum tr_dtype compute);

#endif
