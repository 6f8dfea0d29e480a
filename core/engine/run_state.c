/* A run's state in and out of checkpoints: what a checkpoint records of
 * the run (step, loader position, best loss, the plugins' state), saving
 * it, resuming from it, and ZeRO-1: the optimizer state sharded across
 * ranks, gathered on rank 0 to save and shared out again on resume. */
#include "run_internal.h"

#include "../config/plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t save_vars(const void *vt, int kind, void *self, struct tr_state_var *vars, size_t cap)
{
    if (kind == TR_KIND_PRECISION) {
        const struct tr_precision_vtable *p = vt;
        if (TR_HAS_SLOT(p, struct tr_precision_vtable, state_save))
            return p->state_save(self, vars, cap);
    } else {
        const struct tr_schedule_vtable *s = vt;
        if (TR_HAS_SLOT(s, struct tr_schedule_vtable, state_save))
            return s->state_save(self, vars, cap);
    }
    return 0;
}

/* The run's state as a checkpoint records it. */
static void capture_state(struct run *r, uint64_t loader_position, struct tr_run_state *st)
{
    memset(st, 0, sizeof *st);
    st->step = r->step;
    st->applied = r->opt.applied;
    st->loader_position = loader_position;
    st->skipped = r->skipped;
    st->cost_usd = r->cost_before + tr_run_cost(r);
    st->loss = r->last_loss;
    st->val_loss = r->last_val;
    snprintf(st->best, sizeof st->best, "%s", r->best);
    st->best_val_loss = r->best_val;
    st->best_step = r->best_step;
    st->n_precision = save_vars(r->precision, TR_KIND_PRECISION, r->cfg->precision.self,
                                st->precision, 32);
    st->n_schedule = save_vars(r->schedule, TR_KIND_SCHEDULE, r->cfg->schedule.self,
                               st->schedule, 32);
}

static int restore_state(struct run *r, const struct tr_run_state *st, tr_err *err)
{
    r->step = st->step;
    r->opt.applied = st->applied;
    r->skipped = st->skipped;
    r->cost_before = st->cost_usd;
    r->last_loss = st->loss;
    r->last_val = st->val_loss;
    snprintf(r->best, sizeof r->best, "%s", st->best);
    r->best_val = st->best_val_loss;
    r->best_step = st->best_step;
    if (TR_HAS_SLOT(r->precision, struct tr_precision_vtable, state_load) &&
        r->precision->state_load(r->cfg->precision.self, st->precision, st->n_precision, err) != TR_OK)
        return TR_ERROR;
    if (TR_HAS_SLOT(r->schedule, struct tr_schedule_vtable, state_load) &&
        r->schedule->state_load(r->cfg->schedule.self, st->schedule, st->n_schedule, err) != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

/* ---- ZeRO-1: optimizer state sharded across ranks ----------------------- */

/* Checkpoints store up to two state slots (optimizer.safetensors and
 * optimizer2.safetensors), and a ZeRO-1 resume reads each into resume_full. */
_Static_assert(TR_OPTIMIZER_MAX_SLOTS == 2, "checkpoints store two optimizer state slots");
_Static_assert(sizeof ((struct run *)0)->resume_full >= TR_OPTIMIZER_MAX_SLOTS * sizeof(float *),
               "resume_full holds every optimizer state slot");

int tr_run_sharded(const struct run *r) { return r->opt.end - r->opt.begin < r->g->n_params; }

/* Rank q's shard of the flat parameter buffer: world equal parts of
 * n / world floats, the last rank's also holding the n % world left over,
 * so that the equal parts are one allgather (tr_run_share_params). */
void tr_run_shard_of(const struct run *r, int q, size_t *begin, size_t *end)
{
    size_t n = r->g->n_params, per = n / (size_t)r->world;
    *begin = (size_t)q * per;
    *end = q == r->world - 1 ? n : *begin + per;
}

/* Device-to-device through the host: only at checkpoint and resume time. */
static void copy_on_device(struct run *r, float *dst, const float *src, size_t floats)
{
    const struct tr_backend_iface *bi = r->be.iface;
    float *host = tr_alloc(floats * sizeof(float));
    bi->download(r->be.context, host, src, floats * sizeof(float));
    bi->upload(r->be.context, dst, host, floats * sizeof(float));
    tr_free(host);
}

/* After each rank updated its shard: every rank gets every shard, the
 * equal parts in one allgather, the last rank's few extra floats in a
 * broadcast. */
int tr_run_share_params(struct run *r, tr_err *err)
{
    size_t n = r->g->n_params, per = n / (size_t)r->world, rest = n - per * (size_t)r->world;
    if (per && tr_comm_allgather(r->comm, r->g->params, per, err) != TR_OK)
        return TR_ERROR;
    if (rest && tr_comm_broadcast(r->comm, r->g->params + (n - rest), rest * sizeof(float),
                                  r->world - 1, err) != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

/* Moments of all shards in one full-size buffer on rank 0 (to save them);
 * the other ranks send theirs.  full: n floats on rank 0, unused elsewhere. */
static int gather_moments(struct run *r, const float *mine, float *full, tr_err *err)
{
    size_t lb, le; /* the last shard is the largest */
    tr_run_shard_of(r, r->world - 1, &lb, &le);
    float *scratch = r->rank == 0 ? NULL : r->be.iface->alloc(r->be.context, (le - lb + 1) * sizeof(float));
    int rc = TR_OK;
    for (int q = 0; q < r->world && rc == TR_OK; q++) {
        size_t b, e;
        tr_run_shard_of(r, q, &b, &e);
        if (e == b)
            continue;
        float *buf = r->rank == q ? (float *)mine : r->rank == 0 ? full + b : scratch;
        rc = tr_comm_broadcast(r->comm, buf, (e - b) * sizeof(float), q, err);
        if (rc == TR_OK && q == 0 && r->rank == 0)
            copy_on_device(r, full + b, mine, e - b);
    }
    if (scratch)
        r->be.iface->free(r->be.context, scratch);
    return rc;
}

/* Save a checkpoint of the run; `now`: written before returning (the caller
 * waits for it anyway), else in the background when checkpoint.async. */
int tr_run_save(struct run *r, uint64_t loader_position, int now, tr_err *err)
{
    int (*save_fn)(struct tr_checkpointer *, const float *, float *const *,
                   const struct tr_run_state *, tr_err *) =
        now ? tr_checkpointer_save_now : tr_checkpointer_save;
    int slots = r->opt.desc->state_slots;
    if (r->comm && tr_run_sharded(r)) { /* every rank takes part in gathering the state */
        size_t bytes = r->rank == 0 ? r->g->n_params * sizeof(float) : 64;
        float *full[TR_OPTIMIZER_MAX_SLOTS] = {NULL};
        int rc = TR_OK;
        for (int k = 0; k < slots && rc == TR_OK; k++)
            if (!(full[k] = r->be.iface->alloc(r->be.context, bytes)))
                rc = tr_fail(err, "out of memory gathering the optimizer state");
        for (int k = 0; k < slots && rc == TR_OK; k++)
            rc = gather_moments(r, r->opt.state[k], full[k], err);
        if (rc == TR_OK && r->ckpt) {
            struct tr_run_state st;
            capture_state(r, loader_position, &st);
            rc = save_fn(r->ckpt, r->g->params, full, &st, err);
        }
        for (int k = 0; k < slots; k++)
            if (full[k])
                r->be.iface->free(r->be.context, full[k]);
        return rc;
    }
    if (!r->ckpt) /* ranks other than 0 hold the same state and do not write it */
        return TR_OK;
    struct tr_run_state st;
    capture_state(r, loader_position, &st);
    return save_fn(r->ckpt, r->g->params, r->opt.state, &st, err);
}

/* ---- resume ------------------------------------------------------------- */

/* Rank 0 resumed (or not); every rank takes the same state from it:
 * whether there was a checkpoint, the run state, weights and optimizer. */
static int share_resume(struct run *r, int *rc, struct tr_run_state *st, char *name,
                        size_t name_size, tr_err *err)
{
    float verdict = (float)*rc; /* 1 resumed, 0 nothing to resume, TR_ERROR failed */
    if (tr_comm_broadcast(r->comm, &verdict, sizeof verdict, 0, err) != TR_OK)
        return TR_ERROR;
    *rc = (int)verdict;
    if (*rc != 1)
        return *rc == TR_ERROR && r->rank != 0
                   ? tr_fail(err, "rank 0 could not resume from its checkpoint (see its log)")
                   : TR_OK;
    size_t bytes = r->g->n_params * sizeof(float);
    if (tr_comm_broadcast(r->comm, st, sizeof *st, 0, err) != TR_OK ||
        tr_comm_broadcast(r->comm, name, name_size, 0, err) != TR_OK ||
        tr_comm_broadcast(r->comm, r->g->params, bytes, 0, err) != TR_OK)
        return TR_ERROR;
    /* buffers (batch norm's running statistics) are rank 0's too: the
     * checkpoint holds rank 0's, the ranks then move them apart again */
    if (r->g->n_buffers && tr_comm_broadcast(r->comm, r->g->buffers,
                                             r->g->n_buffers * sizeof(float), 0, err) != TR_OK)
        return TR_ERROR;
    for (int k = 0; k < r->opt.desc->state_slots; k++) {
        if (!tr_run_sharded(r)) {
            if (tr_comm_broadcast(r->comm, r->opt.state[k], bytes, 0, err) != TR_OK)
                return TR_ERROR;
            continue;
        }
        /* rank 0 read the full state (see resume_moments); each rank keeps its shard */
        float *full = r->rank == 0 ? r->resume_full[k] : r->be.iface->alloc(r->be.context, bytes);
        if (!full)
            return tr_fail(err, "out of memory distributing the optimizer state");
        int rc = tr_comm_broadcast(r->comm, full, bytes, 0, err);
        if (rc == TR_OK)
            copy_on_device(r, r->opt.state[k], full + r->opt.begin, r->opt.end - r->opt.begin);
        r->be.iface->free(r->be.context, full);
        if (r->rank == 0)
            r->resume_full[k] = NULL;
        if (rc != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

/* Resume: rank 0 reads the newest good checkpoint (all of the optimizer
 * state when it is sharded); every rank takes the same state from it. */
int tr_run_resume(struct run *r, tr_err *err)
{
    struct tr_run_state st;
    char name[64] = "";
    /* where each state slot is read to: the optimizer's own buffers, or
     * full-size ones when the checkpoint holds every shard's state */
    float *into[TR_OPTIMIZER_MAX_SLOTS] = {NULL};
    for (int k = 0; k < r->opt.desc->state_slots; k++) {
        into[k] = r->opt.state[k];
        if (r->ckpt && tr_run_sharded(r) &&
            !(into[k] = r->resume_full[k] =
                  r->be.iface->alloc(r->be.context, r->g->n_params * sizeof(float))))
            return tr_fail(err, "out of memory reading the optimizer state");
    }
    int rc = r->ckpt ? tr_checkpointer_resume(r->ckpt, r->g->params, into, &st, name, sizeof name,
                                              err)
                     : 0;
    if (r->comm && share_resume(r, &rc, &st, name, sizeof name, err) != TR_OK)
        return TR_ERROR;
    if (rc == TR_ERROR || (rc == 1 && restore_state(r, &st, err) != TR_OK))
        return TR_ERROR;
    if (rc == 1)
        r->position = st.loader_position;
    if (rc == 1 && r->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "resumed from checkpoint %s (step %llu)", name,
               (unsigned long long)r->step);
    else if (r->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "no checkpoint to resume from: starting at step 0");
    return TR_OK;
}
