/* A run's state in and out of checkpoints (run_state.h): what a
 * checkpoint records besides the loop's own record (the optimizer's update
 * count, the plugins' state), saving it, resuming from it, and sharding:
 * the optimizer state kept in parts across ranks (shard.h), gathered on
 * rank 0 to save and cut up again on resume, at any world size; and a
 * smoke run's round trip. */
#include "run_state.h"

#include "checkpoint_shard.h"
#include "plugin_calls.h"
#include "../config/plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tr_state_capture(const struct tr_session *s, struct tr_run_state *st)
{
    st->applied = s->opt.applied;
    st->n_precision = tr_plugin_state_save(&s->cfg->precision, st->precision, 32);
    st->n_schedule = tr_plugin_state_save(&s->cfg->schedule, st->schedule, 32);
}

static int restore_plugins(struct tr_session *s, const struct tr_run_state *st, tr_err *err)
{
    s->opt.applied = st->applied;
    if (tr_plugin_state_load(&s->cfg->precision, st->precision, st->n_precision, err) != TR_OK ||
        tr_plugin_state_load(&s->cfg->schedule, st->schedule, st->n_schedule, err) != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

/* ---- sharding: the optimizer state in parts across ranks ------------------ */

/* Checkpoints store up to two state slots (optimizer.safetensors and
 * optimizer2.safetensors). */
_Static_assert(TR_OPTIMIZER_MAX_SLOTS == 2, "checkpoints store two optimizer state slots");

int tr_state_sharded(const struct tr_session *s) { return tr_shard_sharded(&s->opt.shard); }

/* Where the optimizer state lives: the device backend's memory, or the
 * host's under parallel.offload (its CPU backend reads and writes it). */
static const struct tr_backend *state_backend(const struct tr_session *s)
{
    return tr_optimizer_state_backend(&s->opt, &s->be);
}

/* Host staging: only at checkpoint and resume time. */
static float *download(const struct tr_backend *be, const float *src, size_t floats)
{
    float *host = tr_alloc(floats * sizeof(float) + 1);
    if (host && floats)
        tr_be_download(be, host, src, floats * sizeof(float));
    return host;
}

/* Rank q's parts (shard.h) between its packed state (`packed`, the parts
 * one after another, as the optimizer keeps them; device memory) and a
 * full-size buffer (full, in full_be's memory): to_full 1 places packed
 * into full, 0 takes full's parts into packed. */
static void place_parts(struct tr_session *s, int q, float *packed, float *full,
                        const struct tr_backend *full_be, int to_full)
{
    const struct tr_shard *sh = &s->opt.shard;
    size_t at = 0, n = tr_shard_owned(sh, q);
    /* one host buffer of the parts only (never the whole buffer: under
     * sharded parameters most of it is not there) */
    float *host = to_full ? download(&s->be, packed, n) : tr_alloc(n * sizeof(float) + 1);
    for (size_t u = 0; u < sh->n_units && host; u++) {
        struct tr_shard_run r = tr_shard_part(sh, u, q);
        size_t len = r.end - r.begin;
        if (len && to_full)
            tr_be_upload(full_be, full + r.begin, host + at, len * sizeof(float));
        else if (len)
            tr_be_download(full_be, host + at, full + r.begin, len * sizeof(float));
        at += len;
    }
    if (host && !to_full && n)
        tr_be_upload(&s->be, packed, host, n * sizeof(float));
    tr_free(host);
}

/* After each rank updated its parts: every rank gets every part. */
int tr_state_share_params(struct tr_session *s, tr_err *err)
{
    return tr_comm_gather_shards(s->comm, s->g->params, &s->opt.shard, err);
}

/* Moments of all ranks in one full-size buffer on rank 0 (to save them):
 * each rank broadcasts its packed state, rank 0 places it.  full: n floats
 * on rank 0, unused elsewhere. */
/* Backend memory for the largest rank's parts: where a rank receives
 * another's parts in turn. */
static float *parts_scratch(struct tr_session *s, const char *what, tr_err *err)
{
    size_t largest = 0;
    for (int q = 0; q < s->world; q++) {
        size_t n = tr_shard_owned(&s->opt.shard, q);
        largest = n > largest ? n : largest;
    }
    float *scratch = tr_be_alloc(&s->be, (largest + 1) * sizeof(float));
    if (!scratch)
        tr_fail(err, "out of memory %s", what);
    return scratch;
}

/* mine and full in be's memory (the device's, or the host's for an
 * offloaded state: it travels through the device scratch) */
static int gather_moments(struct tr_session *s, float *mine, float *full,
                          const struct tr_backend *be, tr_err *err)
{
    float *scratch = parts_scratch(s, "gathering the optimizer state", err);
    if (!scratch)
        return TR_ERROR;
    int rc = TR_OK;
    for (int q = 0; q < s->world && rc == TR_OK; q++) {
        size_t n = tr_shard_owned(&s->opt.shard, q);
        if (n == 0)
            continue;
        float *buf = s->rank == q && be == &s->be ? mine : scratch;
        if (s->rank == q && buf != mine)
            tr_be_upload(&s->be, scratch, mine, n * sizeof(float));
        rc = tr_comm_broadcast(s->comm, buf, n * sizeof(float), q, err);
        if (rc == TR_OK && s->rank == 0)
            place_parts(s, q, buf, full, be, 1);
    }
    tr_be_free(&s->be, scratch);
    return rc;
}

/* Sharded parameters (level parameters) whole on rank 0, in its own
 * buffer, to save them: each rank's parts, packed, broadcast and placed as
 * the moments are.  The caller discards them again afterwards. */
static int gather_params(struct tr_session *s, tr_err *err)
{
    size_t n = tr_shard_owned(&s->opt.shard, s->rank);
    float *mine = tr_be_alloc(&s->be, (n + 1) * sizeof(float));
    if (!mine)
        return tr_fail(err, "out of memory gathering the parameters");
    place_parts(s, s->rank, mine, s->g->params, &s->be, 0);
    int rc = gather_moments(s, mine, s->g->params, &s->be, err);
    tr_be_free(&s->be, mine);
    return rc;
}

int tr_state_gather_params(struct tr_session *s, tr_err *err)
{
    return s->gather ? gather_params(s, err) : TR_OK;
}

/* ---- sharded checkpoints: every rank writes and reads its own parts ------- */

static struct tr_ckpt_rank ckpt_rank(const struct tr_session *s)
{
    return (struct tr_ckpt_rank){s->cfg->checkpoint.plugin->info->vtable, s->cfg->checkpoint.self,
                                 s->g, &s->be, s->opt.desc, &s->opt.shard, s->comm, NULL,
                                 /* a pipeline stage reads its own parameters */
                                 s->stage_readers ? tr_session_stage_keeps : NULL, (void *)s,
                                 state_backend(s)};
}

/* Whether this save goes to every rank's blob (checkpoint_shard.h): a
 * sharded state and a plugin that takes blobs from several ranks.  Every
 * rank answers alike (the same recipe, the same plugin). */
static int save_in_parallel(const struct tr_session *s)
{
    static int said;
    if (!s->comm || !tr_state_sharded(s) || !s->cfg->checkpoint.plugin)
        return 0;
    if (tr_ckpt_plugin_shared(s->cfg->checkpoint.plugin->info->vtable))
        return 1;
    if (!said++ && s->rank == 0)
        tr_log(TR_LOG_INFO, "checkpoint", "checkpoint plugin '%s' cannot take one checkpoint from "
               "several ranks (plugin ABI 2.5: begin_shared, detach): rank 0 gathers the whole "
               "state to save it", s->cfg->checkpoint.plugin->info->name);
    return 0;
}

/* ---- save ------------------------------------------------------------------- */

int tr_state_save(struct tr_session *s, const struct tr_run_state *st, int now, tr_err *err)
{
    int (*save_fn)(struct tr_checkpointer *, const float *, float *const *,
                   const struct tr_run_state *, tr_err *) =
        now ? tr_checkpointer_save_now : tr_checkpointer_save;
    int slots = s->opt.desc->state_slots;
    tr_session_settle(s); /* an offloaded update overlapping: every part up first */
    if (save_in_parallel(s)) { /* each rank writes its parts, before returning */
        struct tr_ckpt_rank r = ckpt_rank(s);
        return tr_ckpt_save_shared(&r, s->ckpt, s->g->params, s->opt.state, st, err);
    }
    if (s->comm && tr_state_sharded(s)) { /* every rank takes part in gathering the state */
        size_t bytes = s->rank == 0 ? s->g->n_params * sizeof(float) : 64;
        const struct tr_backend *sbe = state_backend(s);
        float *full[TR_OPTIMIZER_MAX_SLOTS] = {NULL};
        int rc = TR_OK;
        for (int k = 0; k < slots && rc == TR_OK; k++)
            if (!(full[k] = tr_be_alloc(sbe, bytes)))
                rc = tr_fail(err, "out of memory gathering the optimizer state");
        for (int k = 0; k < slots && rc == TR_OK; k++)
            rc = gather_moments(s, s->opt.state[k], full[k], sbe, err);
        if (rc == TR_OK && s->gather)
            rc = gather_params(s, err);
        if (rc == TR_OK && s->ckpt)
            rc = save_fn(s->ckpt, s->g->params, full, st, err);
        if (s->gather) /* the save took its copy: back to this rank's parts */
            tr_gather_release_all(s->gather);
        for (int k = 0; k < slots; k++)
            tr_be_free(sbe, full[k]);
        return rc;
    }
    if (!s->ckpt) /* ranks other than 0 hold the same state and do not write it */
        return TR_OK;
    return save_fn(s->ckpt, s->g->params, s->opt.state, st, err);
}

int tr_state_can_save_owned(const struct tr_session *s)
{
    return s->comm && s->cfg->checkpoint.plugin &&
           tr_ckpt_plugin_shared(s->cfg->checkpoint.plugin->info->vtable);
}

int tr_state_save_owned(struct tr_session *s, const struct tr_run_state *st, const int *owner,
                        tr_err *err)
{
    /* the layout of no shard level over every rank: the blobs' names and
     * the manifest's world; owner says who writes what */
    tr_session_settle(s); /* an offloaded update overlapping: every part up first */
    struct tr_shard all;
    tr_shard_init(&all, s->g->n_params, s->g->n_params, s->rank, s->world, TR_SHARD_NONE);
    struct tr_ckpt_rank r = ckpt_rank(s);
    r.shard = &all;
    r.owner = owner;
    return tr_ckpt_save_shared(&r, s->ckpt, s->g->params, s->opt.state, st, err);
}

/* ---- resume ------------------------------------------------------------- */

/* A full-size buffer on rank 0 (`full`, n floats there, unused
 * elsewhere) cut into every rank's parts: for each rank q, rank 0 packs q's
 * parts and broadcasts them, and q keeps them in `packed` (its own
 * packed buffer: the optimizer state) or places them into `place` (a
 * full-size buffer laid out like the parameters: its own parts only).  No
 * rank but 0 ever holds more than the largest rank's parts beside its own. */
static int scatter_parts(struct tr_session *s, float *full, float *packed, float *place,
                         const struct tr_backend *be, tr_err *err)
{
    const struct tr_shard *sh = &s->opt.shard;
    float *scratch = parts_scratch(s, "distributing the checkpoint's state", err);
    if (!scratch)
        return TR_ERROR;
    int rc = TR_OK;
    for (int q = 0; q < s->world && rc == TR_OK; q++) {
        size_t n = tr_shard_owned(sh, q);
        if (n == 0)
            continue;
        /* full and packed in be's memory: an offloaded state (host)
         * travels through the device scratch */
        float *buf = s->rank == q && packed && be == &s->be ? packed : scratch;
        if (s->rank == 0)
            place_parts(s, q, buf, full, be, 0);
        rc = tr_comm_broadcast(s->comm, buf, n * sizeof(float), 0, err);
        if (rc == TR_OK && s->rank == q && packed && buf != packed)
            tr_be_download(&s->be, packed, scratch, n * sizeof(float));
        if (rc == TR_OK && s->rank == q && place && s->rank != 0)
            place_parts(s, q, buf, place, &s->be, 1);
    }
    tr_be_free(&s->be, scratch);
    return rc;
}

/* The optimizer state of every part as rank 0 read it (full[k]: n floats
 * on rank 0, NULL elsewhere): each rank keeps its own parts.  The
 * checkpoint holds the whole state, so this is also where a run saved at
 * another world size is cut up anew. */
static int share_shards(struct tr_session *s, float *const *full, tr_err *err)
{
    for (int k = 0; k < s->opt.desc->state_slots; k++)
        if (scatter_parts(s, s->rank == 0 ? full[k] : NULL, s->opt.state[k], NULL,
                          state_backend(s), err) != TR_OK)
            return TR_ERROR;
    return TR_OK;
}

/* A slot of the optimizer state from rank 0 to every rank: device memory
 * straight, an offloaded state's host memory through the communicator's
 * staging a piece at a time (pipeline stages keep whole-model slots; each
 * gives back what its chunks do not read once resumed). */
static int broadcast_state(struct tr_session *s, float *slot, size_t bytes, tr_err *err)
{
    if (state_backend(s) == &s->be)
        return tr_comm_broadcast(s->comm, slot, bytes, 0, err);
    const size_t piece = (size_t)64 << 20;
    for (size_t at = 0; at < bytes; at += piece)
        if (tr_comm_broadcast_host(s->comm, (char *)slot + at, bytes - at < piece ? bytes - at : piece,
                                   0, err) != TR_OK)
            return TR_ERROR;
    return TR_OK;
}

/* Rank 0 resumed (or not); every rank takes the same state from it:
 * whether there was a checkpoint, the run state, weights and optimizer. */
static int share_resume(struct tr_session *s, int *rc, struct tr_run_state *st, char *name,
                        size_t name_size, float *const *full, tr_err *err)
{
    float verdict = (float)*rc; /* 1 resumed, 0 nothing to resume, TR_ERROR failed */
    if (tr_comm_broadcast_host(s->comm, &verdict, sizeof verdict, 0, err) != TR_OK)
        return TR_ERROR;
    *rc = (int)verdict;
    if (*rc != 1)
        return *rc == TR_ERROR && s->rank != 0
                   ? tr_fail(err, "rank 0 could not resume from its checkpoint (see its log)")
                   : TR_OK;
    size_t bytes = s->g->n_params * sizeof(float);
    if (tr_comm_broadcast_host(s->comm, st, sizeof *st, 0, err) != TR_OK ||
        tr_comm_broadcast_host(s->comm, name, name_size, 0, err) != TR_OK)
        return TR_ERROR;
    /* the weights: whole to every rank, or (sharded parameters) each
     * rank's parts to it; rank 0 then keeps its own (the run discards the rest) */
    if (s->gather ? scatter_parts(s, s->g->params, NULL, s->g->params, &s->be, err) != TR_OK
                  : tr_comm_broadcast(s->comm, s->g->params, bytes, 0, err) != TR_OK)
        return TR_ERROR;
    /* buffers (batch norm's running statistics) are rank 0's too: the
     * checkpoint holds rank 0's, the ranks then move them apart again */
    if (s->g->n_buffers && tr_comm_broadcast(s->comm, s->g->buffers,
                                             s->g->n_buffers * sizeof(float), 0, err) != TR_OK)
        return TR_ERROR;
    if (tr_state_sharded(s)) /* rank 0 read the full state; each rank keeps its shard */
        return share_shards(s, full, err); /* (the run then discards others' parameters) */
    for (int k = 0; k < s->opt.desc->state_slots; k++)
        if (broadcast_state(s, s->opt.state[k], bytes, err) != TR_OK)
            return TR_ERROR;
    return TR_OK;
}

/* A sharded state: when rank 0 finds the newest checkpoint sharded, every
 * rank reads its own parts of it; 1 resumed, 0 not sharded or none (the
 * caller goes on as ever), TR_ERROR. */
static int resume_in_parallel(struct tr_session *s, struct tr_run_state *st, char *name,
                              size_t name_size, tr_err *err)
{
    struct tr_ckpt_rank r = ckpt_rank(s);
    /* Rank 0 picks, every rank reads its parts; when some rank cannot (a
     * blob damaged, truncated or missing), all of them pass over it
     * together and rank 0 picks the next older one, as a resume in one
     * process does.  What a failed try wrote into the weights and state
     * is overwritten by the checkpoint finally read (every range of it). */
    for (;;) {
        struct {
            float verdict;
            char name[64];
        } pick = {0, ""};
        if (s->rank == 0 && s->ckpt) {
            int rc = tr_ckpt_newest_sharded(s->ckpt, pick.name, sizeof pick.name, err);
            pick.verdict = (float)rc;
        }
        if (tr_comm_broadcast_host(s->comm, &pick, sizeof pick, 0, err) != TR_OK)
            return TR_ERROR;
        if (pick.verdict == (float)TR_ERROR)
            return s->rank == 0 ? TR_ERROR
                                : tr_fail(err, "rank 0 could not list its checkpoints (see its log)");
        if (pick.verdict != 1)
            return 0; /* none (left) sharded: the caller's resume, past what was skipped */
        pick.name[sizeof pick.name - 1] = 0;
        int rc = tr_ckpt_resume_shared(&r, pick.name, s->g->params, s->opt.state,
                                       s->gather != NULL, st, err);
        if (rc == TR_OK) {
            snprintf(name, name_size, "%s", pick.name);
            return 1;
        }
        if (rc != 1)
            return TR_ERROR;
        if (s->rank == 0 && s->ckpt)
            tr_ckpt_skip(s->ckpt, pick.name, err);
    }
}

int tr_state_resume(struct tr_session *s, struct tr_run_state *st, tr_err *err)
{
    char name[64] = "";
    if (s->comm && (tr_state_sharded(s) || s->stage_readers) && s->cfg->checkpoint.plugin) {
        int rc = resume_in_parallel(s, st, name, sizeof name, err);
        if (rc == 1 && restore_plugins(s, st, err) != TR_OK)
            rc = TR_ERROR;
        if (rc == 1) /* an offloaded optimizer's master copy: the checkpoint's weights */
            tr_optimizer_params_changed(&s->opt);
        if (rc == 1 && s->rank == 0)
            tr_log(TR_LOG_INFO, NULL, "resumed from checkpoint %s (step %llu; every rank read "
                   "its own parts)", name, (unsigned long long)st->step);
        if (rc != 0)
            return rc;
    }
    /* where each state slot is read to: the optimizer's own buffers, or
     * full-size ones when the checkpoint holds every shard's state */
    float *into[TR_OPTIMIZER_MAX_SLOTS] = {NULL}, *full[TR_OPTIMIZER_MAX_SLOTS] = {NULL};
    int rc = TR_OK;
    const struct tr_backend *sbe = state_backend(s); /* where the checkpointer reads slots to */
    for (int k = 0; k < s->opt.desc->state_slots && rc == TR_OK; k++) {
        into[k] = s->opt.state[k];
        if (s->ckpt && tr_state_sharded(s) &&
            !(into[k] = full[k] = tr_be_alloc(sbe, s->g->n_params * sizeof(float))))
            rc = tr_fail(err, "out of memory reading the optimizer state");
    }
    if (rc == TR_OK) {
        rc = s->ckpt ? tr_checkpointer_resume(s->ckpt, s->g->params, into, st, name, sizeof name,
                                              err)
                     : 0;
        /* with ranks, rank 0's verdict goes to all, a failure too */
        if (s->comm && share_resume(s, &rc, st, name, sizeof name, full, err) != TR_OK)
            rc = TR_ERROR;
    }
    for (int k = 0; k < TR_OPTIMIZER_MAX_SLOTS; k++)
        tr_be_free(sbe, full[k]);
    if (rc == 1 && restore_plugins(s, st, err) != TR_OK)
        rc = TR_ERROR;
    if (rc == 1) /* the offloaded optimizer's master copy: the checkpoint's weights */
        tr_optimizer_params_changed(&s->opt);
    if (rc == 1 && s->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "resumed from checkpoint %s (step %llu)", name,
               (unsigned long long)st->step);
    else if (rc == 0 && s->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "no checkpoint to resume from: starting at step 0");
    return rc;
}

/* ---- a smoke run's round trip ------------------------------------------------ */

int tr_state_round_trip(struct tr_session *s, uint64_t step, tr_err *err)
{
    size_t bytes = s->g->n_params * sizeof(float);
    int slots = s->opt.desc->state_slots, have_slots = 1;
    /* the checkpointer reads the slots to where the optimizer keeps them */
    const struct tr_backend *sbe = state_backend(s);
    float *p = tr_be_alloc(&s->be, bytes), *sl[TR_OPTIMIZER_MAX_SLOTS] = {NULL};
    for (int k = 0; k < slots; k++)
        have_slots &= (sl[k] = tr_be_alloc(sbe, bytes)) != NULL;
    float *a = tr_alloc(bytes), *b = tr_alloc(bytes);
    /* buffers (batch norm's running statistics) load back into the graph's
     * own: the values before the load must be those read back */
    size_t buffer_bytes = s->g->n_buffers * sizeof(float);
    float *kept = tr_alloc(buffer_bytes + 1), *back = tr_alloc(buffer_bytes + 1);
    int rc = TR_ERROR;
    struct tr_run_state st;
    char name[64];
    snprintf(name, sizeof name, "step-%010llu", (unsigned long long)step);
    if (buffer_bytes && kept)
        tr_be_download(&s->be, kept, s->g->buffers, buffer_bytes);
    if (!p || !have_slots || !a || !b || !kept || !back) {
        tr_fail(err, "smoke: out of memory for the checkpoint round trip");
    } else if (tr_checkpointer_load(s->ckpt, name, p, sl, &st, err) == TR_OK) {
        tr_be_download(&s->be, a, s->g->params, bytes);
        tr_be_download(&s->be, b, p, bytes);
        if (buffer_bytes)
            tr_be_download(&s->be, back, s->g->buffers, buffer_bytes);
        if (memcmp(a, b, bytes) != 0 || memcmp(kept, back, buffer_bytes) != 0 || st.step != step)
            tr_fail(err, "smoke: checkpoint %s does not read back what was saved", name);
        else
            rc = TR_OK;
    } else {
        tr_err_prefix(err, "smoke: checkpoint round trip");
    }
    tr_be_free(&s->be, p);
    for (int k = 0; k < slots; k++)
        tr_be_free(sbe, sl[k]);
    tr_free(a);
    tr_free(b);
    tr_free(kept);
    tr_free(back);
    return rc;
}
