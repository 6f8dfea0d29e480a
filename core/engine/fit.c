/* Does it fit (fit.h): the device's memory, one measured plan, and the
 * search for the largest micro-batch that fits. */
#include "fit.h"

#include "backend.h"
#include "model.h"
#include "shard.h"
#include "gather.h"
#include "pipeline.h"
#include "../config/hardware.h"
#include "../util/util.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void tr_fit_device_of(const struct tr_config *cfg, struct tr_fit_device *d)
{
    memset(d, 0, sizeof *d);
    const struct tr_hardware *hw = *cfg->cost.hardware ? tr_hardware_find(cfg->cost.hardware) : NULL;
    if (cfg->train.memory_budget > 0) {
        snprintf(d->what, sizeof d->what, "train.memory_budget");
        d->bytes = cfg->train.memory_budget * 1024.0 * 1024.0 * 1024.0;
    } else if (hw && strcmp(hw->name, "cpu") != 0) {
        snprintf(d->what, sizeof d->what, "%s", hw->name);
        d->bytes = (double)hw->memory_bytes;
    } else if (strcmp(cfg->device, "cpu") != 0) {
        snprintf(d->what, sizeof d->what, "an 80 GiB %s device (set cost.hardware)", cfg->device);
        d->bytes = 80.0 * 1024 * 1024 * 1024;
    } else {
        snprintf(d->what, sizeof d->what, "this machine's memory");
        d->bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    }
    d->usable = (1.0 - TR_MEMORY_MARGIN) * d->bytes;
}

void tr_fit_adjust(const struct tr_fit_model *fm, const struct tr_graph *g,
                   struct tr_memory_report *report)
{
    if (fm->other_device)
        report->param_copies = 0;
    if (fm->shard_world > 1 && report->grads > 0) { /* the largest rank's part: the last's */
        size_t n = report->grads / sizeof(float), slots = report->optimizer / report->grads;
        int last = fm->shard_world - 1;
        struct tr_shard sh;
        tr_shard_init(&sh, n, tr_shard_unit_floats(fm->cfg), last, fm->shard_world, fm->level);
        size_t owned = tr_shard_owned(&sh, last);
        report->optimizer = slots * owned * sizeof(float);
        if (fm->level >= TR_SHARD_GRADIENTS && g && g->n_params == n) {
            /* 16-bit gathers where the device converts (a plan for
             * another device assumes it does) */
            struct tr_graph view = *g;
            view.compute = fm->compute;
            int in_compute = tr_gather_in_compute(&view, fm->other_device ? NULL : fm->be, &sh);
            struct tr_gather_peaks pk;
            tr_gather_peaks(g, &sh, in_compute, &pk);
            size_t held = owned + pk.grad_floats;
            report->grads = (held < n ? held : n) * sizeof(float);
            if (fm->level == TR_SHARD_PARAMETERS) {
                /* this rank's fp32 parts, the units resident together (in
                 * the compute dtype where they travel in it: 2 bytes a
                 * value), never more than all of them in fp32 and 16 bits,
                 * and the packed gathers' staging */
                size_t most = (n - owned) * sizeof(float) + (in_compute ? n * sizeof(uint16_t) : 0);
                report->params = (owned + g->n_buffers) * sizeof(float) +
                                 (pk.param_bytes < most ? pk.param_bytes : most) + pk.staging_bytes;
                /* what the backend keeps beside a sharded graph's parameters:
                 * no bf16 mirror (params16 holds the gathered units, above),
                 * but a frozen base's transposed copies, which no shard level
                 * divides (fp32 adapters: kernels/cpu/frozen_t.c) */
                struct tr_graph sharded = *g;
                sharded.params_sharded = 1;
                report->param_copies =
                    fm->other_device || !fm->be ? 0 : tr_be_param_copy_bytes(fm->be, &sharded);
            }
        }
    }
    if (fm->offload) /* on the host (tr_fit_host_bytes) */
        report->optimizer = 0;
}

size_t tr_fit_host_bytes(const struct tr_fit_model *fm, size_t n_params)
{
    if (!fm->offload)
        return 0;
    if (fm->shard_world > 1) { /* each rank keeps its parts: the largest, the last rank's */
        int last = fm->shard_world - 1;
        struct tr_shard sh;
        tr_shard_init(&sh, n_params, tr_shard_unit_floats(fm->cfg), last, fm->shard_world,
                      fm->level);
        n_params = tr_shard_owned(&sh, last);
    }
    return ((size_t)fm->optimizer_slots + 1 + (fm->offload_overlap ? 1 : 0)) * n_params *
           sizeof(float);
}

int tr_fit_stages(const struct tr_config *cfg, const struct tr_graph *g, int64_t replica_batch,
                  int64_t m, int search, size_t *bytes, int *stage, tr_err *err)
{
    const struct tr_parallel_config *par = &cfg->parallel;
    int P = (int)par->pipeline, V = (int)par->virtual_stages;
    struct tr_pipe_chunk chunk[64];
    double each[64];
    if (P * V > 64)
        return tr_fail(err, "parallel.pipeline x virtual_stages = %d: up to 64 chunks", P * V);
    if (tr_pipe_partition(g, P * V, chunk, err) != TR_OK)
        return TR_ERROR;
    int M = tr_pipe_step_micro_batches(replica_batch, m, 1, par->micro_batches);
    /* a candidate whose micro-batches the interleaved schedule cannot take is
     * measured at the next count it can: the search then lowers the
     * micro-batch until the step's count is one (session.c) */
    if (search && par->schedule_kind == TR_PIPE_INTERLEAVED && M % P != 0)
        M += P - M % P;
    int largest = tr_pipe_stage_memory(g, chunk, par->schedule_kind, P, V, M, each, NULL, NULL,
                                       err);
    if (largest < 0)
        return TR_ERROR;
    *bytes = (size_t)each[largest];
    if (stage)
        *stage = largest;
    return TR_OK;
}

int tr_fit_measure(const struct tr_fit_model *fm, int64_t m, struct tr_memory_report *report,
                   size_t *bytes, tr_err *err)
{
    struct tr_graph *g = tr_model_build_run(fm->cfg, (int)m, tr_fit_base_auto(fm->be, fm->compute), err);
    if (!g)
        return TR_ERROR;
    g->compute = fm->compute; /* 16-bit compute stores activations in 16 bits */
    tr_graph_measure(g, fm->be, fm->optimizer_slots);
    *report = g->memory;
    tr_fit_adjust(fm, g, report);
    *bytes = tr_graph_memory_total(report);
    int rc = TR_OK;
    if (fm->stages > 1) { /* the stages' estimate reads the adjusted report */
        g->memory = *report;
        rc = tr_fit_stages(fm->cfg, g, fm->replica_batch, m, 1, bytes, NULL, err);
    }
    tr_graph_free(g, NULL);
    return rc;
}

int64_t tr_fit_per_device(int64_t batch, int64_t devices)
{
    return devices > 1 && batch % devices == 0 ? batch / devices : batch;
}

int tr_fit_largest(const struct tr_fit_model *fm, int64_t per_device, double usable, int64_t *m,
                   struct tr_memory_report *report, size_t *bytes, tr_err *err)
{
    *m = 0;
    *bytes = 0;
    for (int64_t c = per_device; c >= 1; c--) {
        if (per_device % c != 0)
            continue;
        if (tr_fit_measure(fm, c, report, bytes, err) != TR_OK)
            return TR_ERROR;
        if ((double)*bytes <= usable) {
            *m = c;
            return TR_OK;
        }
    }
    return TR_OK;
}

enum tr_dtype tr_fit_base_auto(const struct tr_backend *be, enum tr_dtype compute)
{
    return tr_be_stores_frozen(be) ? compute : TR_F32;
}
