/* The session (session.h): what a command needs to run a recipe's model,
 * built in one place for training, smoke runs, eval, sample and plan, and
 * undone by tr_session_close.  The steps of tr_session_open are in its
 * order below; which of them a mode takes is said at each. */
#include "session.h"
#include "adapters.h"
#include "pipeline.h"

#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "fit.h"
#include "graph.h"
#include "hf_weights.h"
#include "loader.h"
#include "model.h"
#include "optim.h"
#include "peft.h"
#include "plugin_calls.h"
#include "rundir.h"
#include "../config/hardware.h"
#include "../config/hf_config.h"
#include "../config/plugin.h"
#include "../config/precision.h"
#include "../config/recipe.h"
#include "topo.h"
#include "../util/util.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int training(const struct tr_session *s)
{
    return s->mode == TR_SESSION_TRAIN || s->mode == TR_SESSION_SMOKE;
}

/* ---- placement and the backend ------------------------------------------------ */

/* Compute threads one per core, loader workers beside them; ranks sharing
 * this node each get their own cores (near their GPU).  The thread count
 * the backend opens with. */
static int place_threads(struct tr_session *s, int *placed)
{
    struct tr_config *cfg = s->cfg;
    int threads = (int)cfg->train.threads;
    tr_err why = {{0}};
    *placed = 0;
    s->topo = tr_topo_open(NULL, &why);
    if (!s->topo)
        tr_log(TR_LOG_WARN, "topology", "%s; threads are not pinned", why.msg);
    if (s->topo && cfg->rank.local_world > 1) {
        struct tr_topo_rank place;
        enum tr_topo_device kind = strcmp(cfg->device, "cuda") == 0 ? TR_TOPO_CUDA : TR_TOPO_CPU;
        if (tr_topo_place(s->topo, kind, cfg->rank.local_world, cfg->rank.local_rank, &place,
                          &why) == TR_OK) {
            *placed = tr_topo_use(s->topo, &place);
            if (threads == 0 && kind == TR_TOPO_CPU)
                threads = place.compute_cores;
            tr_topo_rank_free(&place);
        } else {
            tr_log(TR_LOG_WARN, "topology", "%s; threads are not pinned", why.msg);
        }
    }
    if (threads == 0 && cfg->rank.local_world > 1) { /* unplaced ranks share the cores */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > cfg->rank.local_world ? (int)(cores / cfg->rank.local_world) : 1;
    }
    return threads;
}

/* The backend (plan: the CPU's, one thread, which only answers how much
 * scratch a node needs), and with ranks the comm plugin. */
static int open_backend(struct tr_session *s, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    if (s->mode == TR_SESSION_PLAN)
        return tr_backend_open(&s->be, "cpu", 1, NULL, err);
    int placed, threads = place_threads(s, &placed);
    if (tr_backend_open(&s->be, cfg->device, threads, &cfg->plugin_path, err) != TR_OK)
        return TR_ERROR;
    if (s->topo && strcmp(cfg->device, "cpu") == 0 && (cfg->rank.local_world == 1 || placed))
        tr_topo_bind_compute(s->topo, threads);
    if (s->world == 1)
        return TR_OK;
    cfg->device_stream = tr_be_stream(&s->be); /* device comms queue behind the compute */
    if (!(s->comm = tr_comm_open(cfg, &s->be, err)))
        return TR_ERROR;
    if (s->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "rank 0 of %d (%s); %s", s->world, cfg->rank.source,
               tr_comm_describe(s->comm));
    return TR_OK;
}

/* ---- precision and the micro-batch ------------------------------------------ */

/* The precision plugin first (it needs no sequence length): the
 * micro-batch choice plans with its compute dtype. */
static int open_precision(struct tr_session *s, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    if (!cfg->precision.self && tr_config_create_slot(cfg, &cfg->precision, 0, err) != TR_OK)
        return TR_ERROR;
    tr_precision_policy_of(&cfg->precision, &s->policy);
    char where[600];
    tr_origin_format(&cfg->precision.origin, where, sizeof where);
    return tr_precision_check(&s->policy, cfg->precision.plugin->info->name, where, cfg->device,
                              err);
}

struct tr_fit_model tr_session_fit_model(const struct tr_session *s)
{
    /* eval and sample keep no optimizer state */
    const struct tr_config *cfg = s->cfg;
    /* the training run's plan, optimizer state included, in every mode: an
     * eval or a sample of an "auto" recipe runs at the micro-batch its
     * training run chose */
    int slots = tr_optimizer_find(cfg->optimizer.type)->state_slots;
    /* a plan measures on the CPU backend whatever the device it plans for */
    int other = s->mode == TR_SESSION_PLAN &&
                (strcmp(cfg->device, "cpu") != 0 ||
                 (*cfg->cost.hardware && strcmp(cfg->cost.hardware, "cpu") != 0));
    /* the optimizer state is cut over the run's ranks, or the plan's devices */
    int64_t ranks = s->mode == TR_SESSION_PLAN ? cfg->cost.count : s->world;
    if (cfg->parallel.pipeline > 1) /* a stage's state is cut over its replicas */
        ranks = ranks >= cfg->parallel.pipeline ? ranks / cfg->parallel.pipeline : 1;
    int shard_world = cfg->parallel.shard_level != TR_SHARD_NONE && ranks > 1 ? (int)ranks : 1;
    return (struct tr_fit_model){cfg, &s->be, s->policy.compute, slots, other, shard_world,
                                 shard_world > 1 ? cfg->parallel.shard_level : TR_SHARD_NONE,
                                 cfg->parallel.offload_optimizer,
                                 cfg->parallel.offload_optimizer && cfg->parallel.offload_overlap,
                                 0, 0};
}

struct tr_fit_model tr_session_fit_search(const struct tr_session *s, int64_t *per_device)
{
    const struct tr_config *cfg = s->cfg;
    struct tr_fit_model fm = tr_session_fit_model(s);
    int64_t P = cfg->parallel.pipeline;
    /* a plan shares the batch among the devices it plans for (gpus=N), a
     * stage's replicas being those devices over the stages */
    int64_t devices = s->mode == TR_SESSION_PLAN ? cfg->cost.count : s->replicas;
    if (s->mode == TR_SESSION_PLAN && P > 1)
        devices = devices >= P ? devices / P : 1;
    *per_device = tr_fit_per_device(cfg->train.batch, devices);
    if (P > 1) {
        fm.stages = (int)P;
        fm.replica_batch = *per_device;
    }
    return fm;
}

/* micro_batch = "auto": the largest that fits (fit.h).  A plan whose every
 * micro-batch is too large measures at 1 and says it does not fit; a run
 * stops here. */
static int choose_micro_batch(struct tr_session *s, tr_err *err)
{
    const struct tr_config *cfg = s->cfg;
    s->micro_batch = cfg->train.micro_batch;
    if (!cfg->train.auto_micro_batch)
        return TR_OK;
    int64_t per_device, m, batch = cfg->train.batch;
    struct tr_fit_model fm = tr_session_fit_search(s, &per_device);
    int64_t devices = s->mode == TR_SESSION_PLAN ? cfg->cost.count : s->replicas;
    struct tr_memory_report report;
    size_t total;
    if (tr_fit_largest(&fm, per_device, s->device.usable, &m, &report, &total, err) != TR_OK)
        return TR_ERROR;
    char a[32], b[32];
    tr_format_bytes((double)total, a, sizeof a);
    tr_format_bytes(s->device.usable, b, sizeof b);
    if (m == 0 && s->mode == TR_SESSION_PLAN) {
        s->micro_batch = 1;
        return TR_OK;
    }
    if (m == 0) {
        /* activations grow with the context: with a long one, its length is the lever */
        char ctx[120] = "";
        const struct tr_value *c = tr_value_get(tr_recipe_root(cfg->recipe), "model.ctx");
        if (c && c->type == TR_V_NUMBER && c->number > 1)
            snprintf(ctx, sizeof ctx, "shorten the context (model.ctx, now %.0f tokens a "
                     "sample), ", c->number);
        return tr_fail(err, "auto micro-batch: even a micro-batch of 1 needs %s%s, more than the "
                       "%s usable on %s; %s%s%s%suse a smaller model", a,
                       fm.stages > 1 ? " (the largest pipeline stage)" : "", b, s->device.what,
                       ctx, report.recompute > 0 ? "" : "recompute activations (model.recompute) or ",
                       cfg->train.memory_budget > 0 ? "raise train.memory_budget or " : "",
                       fm.stages > 1 ? "more stages or " : "");
    }
    /* pipeline stages idle (P - 1) / (M + P - 1) of a step: the largest
     * micro-batch that fits may leave them one micro-batch to share, so it
     * gives way to a smaller one (dividing the replica's batch) until there
     * are 4 P micro-batches a step (bubble under 20%), a multiple of P
     * when interleaved, or it is 1 */
    int64_t P = cfg->parallel.pipeline, fits = m;
    int interleaved = cfg->parallel.schedule_kind == TR_PIPE_INTERLEAVED;
    while (P > 1 && m > 1 && (per_device / m < 4 * P || (interleaved && (per_device / m) % P))) {
        do
            m--;
        while (m > 1 && per_device % m != 0);
    }
    /* a plan reports its pick itself */
    if (m != fits && s->rank == 0 && s->mode != TR_SESSION_PLAN)
        tr_log(TR_LOG_INFO, NULL, "auto micro-batch: %lld (%lld fits in %s usable on %s); %lld "
               "pipeline stages share %lld micro-batches a step on each of %lld replica(s) "
               "(bubble (P-1)/(M+P-1) = %.0f%%)", (long long)m, (long long)fits, b,
               s->device.what, (long long)P, (long long)(per_device / m), (long long)devices,
               100.0 * (double)(P - 1) / (double)(per_device / m + P - 1));
    else if (s->rank == 0 && s->mode != TR_SESSION_PLAN && devices > 1)
        tr_log(TR_LOG_INFO, NULL, "auto micro-batch: %lld (plan %s of %s usable on %s); %lld "
               "micro-batches per step on each of %lld ranks keep the batch of %lld",
               (long long)m, a, b, s->device.what, (long long)(per_device / m),
               (long long)devices, (long long)batch);
    else if (s->rank == 0 && s->mode != TR_SESSION_PLAN)
        tr_log(TR_LOG_INFO, NULL, "auto micro-batch: %lld (plan %s of %s usable on %s); %lld "
               "micro-batches per step keep the batch of %lld", (long long)m, a, b,
               s->device.what, (long long)(batch / m), (long long)batch);
    s->micro_batch = m;
    return TR_OK;
}

/* ---- the plugins and the data ---------------------------------------------- */

/* The recipe's plugins.  An evaluation creates only those it reads through:
 * no run directory and no checkpoint plugin, which would create (and tidy)
 * a checkpoints directory. */
static int create_plugins(struct tr_session *s, uint32_t seq_len, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    if (training(s))
        return tr_config_create_plugins(cfg, seq_len, err);
    struct tr_slot *slots[] = {&cfg->precision, &cfg->data, &cfg->schedule};
    for (size_t i = 0; i < TR_ARRAY_LEN(slots); i++)
        if (!slots[i]->self && tr_config_create_slot(cfg, slots[i], seq_len, err) != TR_OK)
            return TR_ERROR;
    return TR_OK;
}

/* The sequence length of a token model's input, else 0. */
static uint32_t seq_len_of(const struct tr_graph *g)
{
    const struct tr_tensor *in = &g->tensors[g->inputs[0]];
    return in->dtype == TR_I32 && in->ndim == 2 ? (uint32_t)in->shape[1] : 0;
}

/* The data source must fit the model: its samples' shape, and no more
 * classes than the model predicts. */
static int open_data(struct tr_session *s, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    const struct tr_graph *g = s->g;
    s->data.vt = cfg->data.plugin->info->vtable;
    s->data.self = cfg->data.self;
    s->data.name = cfg->data.plugin->info->name;
    if (tr_data_info_of(&cfg->data, &s->data.info, err) != TR_OK)
        return TR_ERROR;
    const struct tr_tensor *in = &g->tensors[g->inputs[0]], *tg = &g->tensors[g->inputs[1]];
    size_t per_in = in->numel / (size_t)g->batch, per_tg = tg->numel / (size_t)g->batch;
    const struct tr_data_info *di = &s->data.info;
    char where[600];
    tr_origin_format(&cfg->data.origin, where, sizeof where);
    if (di->input_dtype != in->dtype || di->input_len != per_in || di->target_len != per_tg)
        return tr_fail(err, "%s: data '%s' gives samples of %u %s and %u targets, but the model "
                       "takes %zu %s and %zu targets per sample", where, s->data.name,
                       di->input_len, di->input_dtype == TR_I32 ? "token ids" : "features",
                       di->target_len, per_in, in->dtype == TR_I32 ? "token ids" : "features", per_tg);
    if (g->logits >= 0) {
        const struct tr_tensor *lg = &g->tensors[g->logits];
        if (di->classes > (uint32_t)lg->shape[lg->ndim - 1])
            return tr_fail(err, "%s: data '%s' has %u classes/symbols but the model predicts only %lld",
                           where, s->data.name, di->classes, (long long)lg->shape[lg->ndim - 1]);
    }
    return TR_OK;
}

/* train.tokens / train.epochs: the step count, now that the sequence
 * length (and, for epochs, the training split) is known.  A plan opens the
 * data only when epochs need its sample count. */
static int resolve_steps(struct tr_session *s, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    uint32_t seq_len = seq_len_of(s->g);
    if (s->mode == TR_SESSION_PLAN && cfg->train.length_from != TR_LENGTH_EPOCHS)
        return tr_train_resolve_steps(cfg, seq_len, 0, 0, err);
    if (s->mode == TR_SESSION_PLAN) {
        struct tr_data_info di;
        if (tr_config_create_slot(cfg, &cfg->data, seq_len, err) != TR_OK ||
            tr_data_info_of(&cfg->data, &di, err) != TR_OK)
            return TR_ERROR;
        return tr_train_resolve_steps(cfg, 0, di.samples[TR_SPLIT_TRAIN] /
                                      (di.train_views > 1 ? di.train_views : 1),
                                      (uint64_t)s->micro_batch, err);
    }
    const struct tr_data_info *di = &s->data.info;
    return tr_train_resolve_steps(cfg, seq_len, di->samples[TR_SPLIT_TRAIN] /
                                  (di->train_views > 1 ? di->train_views : 1),
                                  (uint64_t)s->micro_batch, err);
}

/* ---- memory: the plan, the optimizer, the inputs ------------------------------ */

/* parallel.offload = "optimizer": the state moves to the host, updated by a
 * second backend, the CPU's (the core does no math itself). */
static int open_offload(struct tr_session *s, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    if (tr_config_check_offload(cfg, 0, s->world, err) != TR_OK)
        return TR_ERROR;
    /* parallel.offload_chunk_mb (4 by default: large enough that a transfer
     * is not its fixed cost, small enough that the host's transfer buffers
     * stay a few MiB at any model size) */
    size_t chunk = (size_t)(cfg->parallel.offload_chunk_mb * 1024 * 1024 / sizeof(float));
    if (tr_backend_open(&s->host_be, "cpu", (int)cfg->train.threads, NULL, err) != TR_OK ||
        tr_optimizer_offload(&s->opt, &s->be, &s->host_be, chunk ? chunk : 1, err) != TR_OK)
        return TR_ERROR;
    /* whether the update runs into the next forward: the fit model decides,
     * as for the plan's host memory (overlap_offload sets it up) */
    struct tr_fit_model fm = tr_session_fit_model(s);
    size_t n = s->opt.owned, slots = (size_t)s->opt.desc->state_slots + 1 + fm.offload_overlap;
    char buf[32], parts[96] = "";
    tr_format_bytes((double)(slots * n * sizeof(float)), buf, sizeof buf);
    if (tr_shard_sharded(&s->opt.shard))
        snprintf(parts, sizeof parts, " (rank %d's parts: %zu of %zu)", s->rank, n,
                 s->g->n_params);
    tr_log(TR_LOG_INFO, NULL, "optimizer offloaded: its state and an fp32 master copy of the "
           "parameters%s%s (%s) in host memory, updated by the cpu backend in chunks of %g MiB%s "
           "(parallel.offload)", parts, fm.offload_overlap ? " and their gradients" : "", buf,
           cfg->parallel.offload_chunk_mb,
           fm.offload_overlap ? ", overlapping the next forward" : "");
    return TR_OK;
}

/* The offloaded update overlapping the next forward.  Alone, its node hook
 * uploads what a forward node reads.  Under a shard level each unit's
 * gather first makes this rank's updated part current: "parameters"
 * gathers before the nodes anyway; "optimizer" and "gradients" gather
 * every unit again after the update (s->share), in the order the forward
 * needs them, instead of all at the step's end. */
static int overlap_offload(struct tr_session *s, tr_err *err)
{
    if (!s->opt.offload || !tr_session_fit_model(s).offload_overlap)
        return TR_OK;
    if (!tr_shard_sharded(&s->shard))
        return tr_optimizer_offload_overlap(&s->opt, s->g, &s->be, NULL, err);
    if (!s->gather)
        s->share = tr_gather_new_resident(s->g, &s->be, s->comm, &s->shard);
    struct tr_gather *gt = s->gather ? s->gather : s->share;
    size_t *pos = tr_xcalloc(s->shard.n_units + 1, sizeof *pos);
    tr_gather_unit_positions(gt, pos);
    int rc = tr_optimizer_offload_overlap(&s->opt, s->g, &s->be, pos, err);
    free(pos);
    tr_gather_set_ready(gt, tr_optimizer_offload_ready, &s->opt);
    return rc;
}

void tr_session_settle(struct tr_session *s)
{
    if (s->share)
        tr_gather_settle(s->share);
    if (s->gather)
        tr_gather_settle(s->gather);
    if (s->be.iface && training(s))
        tr_optimizer_settle(&s->opt);
}

/* The graph's memory planned and allocated, the shard layout (units the
 * size of the gradient buckets), the optimizer state (this rank's parts
 * under a shard level) and the gradient buckets of data parallelism. */
static int plan_memory(struct tr_session *s, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    /* an evaluation keeps no optimizer state (nor gradients) */
    int slots = training(s) ? tr_session_fit_model(s).optimizer_slots : 0;
    /* pipeline stages shard their own optimizer state (pipeline_exec.h) */
    enum tr_shard_level level = s->replicas > 1 && !tr_session_stages(s)
                                    ? cfg->parallel.shard_level : TR_SHARD_NONE;
    if (level == TR_SHARD_PARAMETERS && !tr_be_can_discard(&s->be))
        return tr_fail(err, "parallel.shard = \"parameters\": the %s backend cannot give "
                       "memory back (its discard slot), which sharded parameters need; use "
                       "shard = \"gradients\" (ZeRO-2) there", tr_be_name(&s->be));
    /* before the plan: no bf16 mirror (the gathers fill tr_graph.params16 instead) */
    s->g->params_sharded = level == TR_SHARD_PARAMETERS;
    /* eval and sample run forward alone: no gradients, activations reused
     * as soon as forward is done with them (graph.h) */
    if (!training(s))
        s->g->training = 0; /* forward in eval mode (and so windows of rows may run) */
    /* sample keeps a key/value cache where the graph and backend run windows of rows */
    if ((training(s)                     ? tr_graph_plan(s->g, &s->be, slots, err)
         : s->mode == TR_SESSION_SAMPLE ? tr_graph_plan_forward_cached(s->g, &s->be,
                                                                       &s->kv_cache, err)
                                         : tr_graph_plan_forward(s->g, &s->be, err)) != TR_OK)
        return TR_ERROR;
    /* the layout is the replicas' (pipeline stages each keep their own) */
    tr_shard_init(&s->shard, s->g->n_params, tr_shard_unit_floats(cfg),
                  s->replicas == s->world ? s->rank : 0, s->replicas, level);
    if (tr_shard_sharded(&s->shard) && s->comm && !tr_comm_has_allgather(s->comm))
        return tr_fail(err, "parallel.shard = \"%s\"%s: comm '%s' has no allgather, which "
                       "sharding (ZeRO-1 and up) needs to share the updated parameters; use a "
                       "comm plugin that has one (tcp, mpi, nccl) or no sharding",
                       tr_shard_level_name(level), cfg->parallel.zero ? " (parallel.zero = true)" : "",
                       cfg->comm.plugin->info->name);
    if (training(s) &&
        tr_optimizer_init(&s->opt, &cfg->optimizer, s->g, &s->be, &s->shard, err) != TR_OK)
        return TR_ERROR;
    if (training(s) && cfg->parallel.offload_optimizer && open_offload(s, err) != TR_OK)
        return TR_ERROR;
    size_t owned = training(s) ? s->opt.owned : s->g->n_params;
    s->g->memory.optimizer = s->opt.offload ? 0 : (size_t)slots * owned * sizeof(float);
    if (tr_shard_sharded(&s->shard) && s->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "optimizer state sharded: rank 0 keeps %zu of %zu parameters' "
               "state (parallel.shard = %s)", owned, s->g->n_params,
               level == TR_SHARD_PARAMETERS ? "parameters, gathered unit by unit"
               : level == TR_SHARD_GRADIENTS ? "gradients, reduce-scattered" : "optimizer");
    if (s->comm && s->replicas > 1 && !tr_session_stages(s) &&
        tr_comm_plan_buckets(s->comm, s->g, &s->shard, err) != TR_OK)
        return TR_ERROR;
    if (s->comm && level == TR_SHARD_PARAMETERS) {
        s->gather = tr_gather_new(s->g, &s->be, s->comm, &s->shard);
        if (s->rank == 0 && s->g->params16)
            tr_log(TR_LOG_INFO, NULL, "sharded parameters gathered in %s where only GEMMs "
                   "read them as weights, the rest in fp32", tr_dtype_name(s->g->compute));
    }
    return training(s) ? overlap_offload(s, err) : TR_OK;
}

/* One forward and backward at the chosen size before training: a plan that
 * does not fit fails here, not hours in. */
static void trial_step(struct tr_session *s)
{
    struct tr_graph *g = s->g;
    for (int k = 0; k < g->n_inputs; k++) {
        struct tr_tensor *t = &g->tensors[g->inputs[k]];
        tr_be_zero(&s->be, t->data, t->numel * 4);
    }
    g->loss_grad = 1.0f;
    tr_graph_forward(g, &s->be);
    tr_graph_backward(g, &s->be);
    /* zeros again, given back where the backend can (a sharded rank keeps
     * no pages of gradients it does not own) */
    if (tr_be_can_discard(&s->be))
        tr_be_discard(&s->be, g->grads, g->n_params * sizeof(float));
    else
        tr_be_zero(&s->be, g->grads, g->n_params * sizeof(float));
    if (s->gather) /* and the parameters it gathered */
        tr_gather_release_all(s->gather);
}

/* A pipeline stage initialises and loads every parameter (the same draws,
 * the same base identity, as one process) but keeps only those its chunks
 * read, giving each other one back as soon as it is written: loading never
 * holds the whole model.  Without a cut here (the stage says why when it
 * is built) or a backend that gives memory back, it keeps them all. */
static void find_stage_readers(struct tr_session *s)
{
    int P = tr_session_stages(s);
    if (!P || !tr_be_can_discard(&s->be))
        return;
    struct tr_graph *g = s->g;
    int C = P * (int)s->cfg->parallel.virtual_stages;
    struct tr_pipe_chunk *chunk = tr_xcalloc((size_t)C, sizeof *chunk);
    tr_err ignored = {{0}};
    if (tr_pipe_partition(g, C, chunk, &ignored) == TR_OK) {
        s->stage_readers = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *s->stage_readers);
        tr_pipe_readers(g, chunk, C, P, s->stage_readers);
    }
    free(chunk);
}

int tr_session_stage_keeps(void *ctx, const struct tr_tensor *t)
{
    const struct tr_session *s = ctx;
    size_t i = (size_t)(t - s->g->tensors);
    int stage = s->rank % tr_session_stages(s);
    return t->role != TR_ROLE_PARAM || !s->stage_readers || (s->stage_readers[i] >> stage & 1);
}

static int adapter_only(void *ctx, const struct tr_tensor *t)
{
    (void)ctx;
    return tr_adapter_param(t->name);
}

static void stage_written(void *ctx, const struct tr_tensor *t)
{
    struct tr_session *s = ctx;
    if (!tr_session_stage_keeps(s, t))
        tr_be_discard(&s->be, t->data, t->numel * sizeof(float));
}

/* The host buffers the loader fills, the trial step of an "auto" size, the
 * initial weights, the accumulation, and the vocabulary the data must keep to. */
static int open_inputs(struct tr_session *s, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    struct tr_graph *g = s->g;
    const struct tr_tensor *in = &g->tensors[g->inputs[0]], *tg = &g->tensors[g->inputs[1]];
    s->input_bytes = in->numel * 4;
    s->target_count = tg->numel;
    s->host_inputs = tr_be_host_alloc(&s->be, s->input_bytes);
    s->host_targets = tr_be_host_alloc(&s->be, s->target_count * sizeof(int32_t));
    if (!s->host_inputs || !s->host_targets)
        return tr_fail(err, "out of memory for the input buffers");
    if (cfg->train.auto_micro_batch && training(s)) /* a forward-only plan has no backward */
        trial_step(s);
    find_stage_readers(s);
    /* model.from's weights are loaded over every parameter but an adapter's
     * (hf_weights.c refuses a directory that lacks one), or a checkpoint's
     * over all: only an adapter's are drawn here (the normal draws of a 135M
     * model's took 2.8 s of a 3.9 s sample) */
    int (*take)(void *, const struct tr_tensor *) = tr_hf_from_dir(cfg->recipe) ? adapter_only
                                                                                : NULL;
    if (s->gather) /* sharded parameters: this rank's parts only, tensor by tensor */
        tr_graph_init_params_some(g, &s->be, (uint64_t)cfg->train.seed, take, tr_gather_written,
                                  s->gather);
    else if (s->stage_readers) /* a pipeline stage: its chunks' parameters only */
        tr_graph_init_params_some(g, &s->be, (uint64_t)cfg->train.seed, take, stage_written, s);
    else
        tr_graph_init_params_some(g, &s->be, (uint64_t)cfg->train.seed, take, NULL, NULL);
    if (!tr_hf_from_dir(cfg->recipe)) /* else model.from's base is loaded over them */
        tr_graph_init_frozen(g, &s->be, (uint64_t)cfg->train.seed);
    /* micro-batches per optimizer step on this rank (the config checked that
     * the ranks share them evenly) */
    s->accum = (int)(cfg->train.batch / s->micro_batch / s->replicas);
    if (s->accum < 1)
        return tr_fail(err, "train: batch %lld cannot be shared by %d ranks in micro-batches of %lld",
                       (long long)cfg->train.batch, s->replicas, (long long)s->micro_batch);
    s->vocab = UINT32_MAX;
    for (int i = 0; i < g->n_nodes; i++) /* the token embedding's table size */
        if (g->nodes[i].op == TR_OP_EMBEDDING && g->nodes[i].in[1] == g->inputs[0])
            s->vocab = (uint32_t)g->tensors[g->nodes[i].in[0]].shape[0];
    return TR_OK;
}

/* ---- checkpoints and prices -------------------------------------------------- */

/* The model as a Hugging Face config.json, for state.json (export --format
 * hf), or NULL when it has no such form (an mlp, an inline builder). */
static char *hf_config_text(const struct tr_session *s)
{
    const struct tr_value *model = tr_value_child(tr_recipe_root(s->cfg->recipe), "model");
    const struct tr_value *type = tr_value_child(model, "type");
    struct tr_hf_arch a;
    tr_err why = {{0}};
    if (!type || type->type != TR_V_STRING ||
        (strcmp(type->string, "llama") != 0 && strcmp(type->string, "gpt") != 0))
        return NULL;
    if (tr_hf_describe(s->g, type->string, &a, &why) != TR_OK) {
        tr_log(TR_LOG_DEBUG, NULL, "no Hugging Face form recorded: %s", why.msg);
        return NULL;
    }
    /* a Llama from a directory keeps that directory's context length */
    struct tr_hf_arch from;
    const char *dir = tr_hf_from_dir(s->cfg->recipe);
    if (dir && a.family == TR_HF_LLAMA && tr_hf_config_read(dir, &from, &why) == TR_OK &&
        from.ctx > a.ctx)
        a.ctx = from.ctx;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tr_hf_config_write(&a, NULL, f);
    fclose(f);
    return text;
}

/* Rank 0 of a training session writes checkpoints; the other ranks get its
 * state by broadcast. */
static int open_checkpointer(struct tr_session *s, tr_err *err)
{
    struct tr_config *cfg = s->cfg;
    char recipe[PATH_MAX], weights_from[PATH_MAX];
    const struct tr_checkpoint_policy *cp = &cfg->checkpoint_policy;
    struct tr_checkpointer_config cc = {
        .vt = cfg->checkpoint.plugin->info->vtable,
        .self = cfg->checkpoint.self,
        .g = s->g,
        .be = &s->be,
        .optimizer = s->opt.desc,
        .state_be = tr_optimizer_state_backend(&s->opt, &s->be),
        .keep = cp->keep,
        .weights_dtype = strcmp(cp->weights_dtype, "bf16") == 0   ? TR_BF16
                         : strcmp(cp->weights_dtype, "fp16") == 0 ? TR_F16
                                                                  : TR_F32,
        .async = cp->async,
        .recipe = realpath(tr_recipe_path(cfg->recipe), recipe) ? recipe : tr_recipe_path(cfg->recipe),
        .overrides = cfg->overrides,
        .n_overrides = cfg->n_overrides,
        .seed = cfg->train.seed,
        .max_step = (uint64_t)cfg->train.steps,
    };
    char *hf_config = hf_config_text(s);
    const char *from = tr_hf_from_dir(cfg->recipe);
    cc.hf_config = hf_config;
    cc.weights_from = from ? (realpath(from, weights_from) ? weights_from : from) : NULL;
    char *peft = cfg->lora.enabled ? tr_peft_config_text(s->g, &cfg->lora, cc.weights_from) : NULL;
    cc.peft_config = peft;
    cc.base_identity = s->base_identity;
    s->ckpt = tr_checkpointer_open(&cc, err);
    free(peft);
    free(hf_config);
    return s->ckpt ? TR_OK : TR_ERROR;
}

/* Prices and peaks from the recipe's cost section and the hardware table. */
static int open_prices(struct tr_session *s, tr_err *err)
{
    const struct tr_cost_config *c = &s->cfg->cost;
    const struct tr_hardware *hw = NULL;
    if (*c->hardware && tr_hardware_lookup(c->hardware, &hw, err) != TR_OK) {
        char where[600];
        struct tr_origin o;
        tr_recipe_origin(s->cfg->recipe, "cost.hardware", &o);
        tr_origin_format(&o, where, sizeof where);
        tr_err_prefix(err, "%s: cost", where);
        return TR_ERROR;
    }
    double price = c->spot ? c->spot_price : c->price;
    if (price < 0 && hw)
        price = c->spot ? hw->spot_price_hour : hw->price_hour;
    /* a job of several ranks pays for all of them (cost.count, if larger, also
     * counts devices this job's ranks do not see, e.g. an idle spare) */
    double devices = (double)(c->count > s->world ? c->count : s->world);
    s->usd_per_second = price > 0 ? price * devices / 3600.0 : 0;
    double peak = c->peak_tflops;
    if (peak <= 0 && hw)
        peak = tr_precision_peak_tflops(hw, &s->policy, NULL);
    s->peak_flops = peak > 0 ? peak * 1e12 * devices : 0;
    s->flops_per_token = tr_graph_flops_per_token(s->g);
    return TR_OK;
}

/* ---- open and close ---------------------------------------------------------- */

/* A plan: the graph at the micro-batch, measured; the steps resolved. */
/* The model's memory and initial weights, nothing to train or read data with. */
static int open_weights(struct tr_session *s, tr_err *err)
{
    if (tr_graph_plan_forward(s->g, &s->be, err) != TR_OK)
        return TR_ERROR;
    s->g->training = 0;
    tr_graph_init_params(s->g, &s->be, (uint64_t)s->cfg->train.seed);
    if (!tr_hf_from_dir(s->cfg->recipe))
        tr_graph_init_frozen(s->g, &s->be, (uint64_t)s->cfg->train.seed);
    return TR_OK;
}

int tr_session_stages(const struct tr_session *s)
{
    int64_t P = s->cfg->parallel.pipeline;
    int ranks = s->mode == TR_SESSION_TRAIN || (s->mode == TR_SESSION_SMOKE && s->world > 1);
    return P > 1 && ranks ? (int)P : 0;
}

/* parallel.pipeline = P: a training run's ranks are P stages of D
 * data-parallel replicas, procs = P x D (an evaluation, a sample or a smoke
 * run is one process: the stages' arithmetic is its own). */
static int check_pipeline(struct tr_session *s, tr_err *err)
{
    const struct tr_parallel_config *par = &s->cfg->parallel;
    if (!tr_session_stages(s))
        return TR_OK;
    char where[600];
    tr_config_where(s->cfg, "parallel.pipeline", where, sizeof where);
    if (s->world % par->pipeline != 0)
        return tr_fail(err, "%s: parallel.pipeline = %lld runs one stage a rank: start it with "
                       "procs = %lld x the data-parallel replicas (this run has %d rank%s)", where,
                       (long long)par->pipeline, (long long)par->pipeline, s->world,
                       s->world == 1 ? "" : "s");
    /* "parameters" would gather each of a stage's units for every
     * micro-batch's forward and again for its backward (2M times a step,
     * against twice without stages), or keep them gathered through the
     * step and save nothing at its peak: refused (scale-out.md) */
    if (par->shard_level > TR_SHARD_GRADIENTS)
        return tr_fail(err, "%s: parallel.pipeline with parallel.shard = \"%s\": a stage's "
                       "parameters are not sharded: they would be gathered again for every "
                       "micro-batch's forward and backward; use shard = \"gradients\" (each "
                       "replica of a stage keeps its part of the stage's gradients and optimizer "
                       "state), more stages, or \"parameters\" without stages", where,
                       tr_shard_level_name(par->shard_level));
    s->replicas = s->world / (int)par->pipeline;
    return TR_OK;
}

/* The micro-batches a pipeline step runs are the step's (run.c then builds
 * this rank's stage: pipeline_exec.h). */
static int check_micro_batches(struct tr_session *s, tr_err *err)
{
    const struct tr_parallel_config *par = &s->cfg->parallel;
    if (!tr_session_stages(s))
        return TR_OK;
    if (par->micro_batches > 0 && par->micro_batches != s->accum) {
        char where[600];
        tr_config_where(s->cfg, "parallel.micro_batches", where, sizeof where);
        return tr_fail(err, "%s: parallel.micro_batches = %lld, but train.batch %lld in "
                       "micro-batches of %lld makes %d a step: set one to agree (or leave "
                       "micro_batches out)", where, (long long)par->micro_batches,
                       (long long)s->cfg->train.batch, (long long)s->micro_batch, s->accum);
    }
    return TR_OK;
}

static int open_plan(struct tr_session *s, tr_err *err)
{
    if (tr_config_check_offload(s->cfg, 1, 1, err) != TR_OK)
        return TR_ERROR;
    struct tr_fit_model fm = tr_session_fit_model(s);
    tr_graph_measure(s->g, &s->be, fm.optimizer_slots);
    tr_fit_adjust(&fm, s->g, &s->g->memory);
    return resolve_steps(s, err);
}

int tr_session_open(struct tr_session *s, struct tr_config *cfg, enum tr_session_mode mode,
                    tr_err *err)
{
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->mode = mode;
    s->rank = cfg->rank.rank;
    s->world = cfg->rank.world;
    s->replicas = s->world;
    if (check_pipeline(s, err) != TR_OK)
        return TR_ERROR;
    tr_fit_device_of(cfg, &s->device);
    if (open_backend(s, err) != TR_OK || open_precision(s, err) != TR_OK ||
        choose_micro_batch(s, err) != TR_OK)
        return TR_ERROR;
    if (!(s->g = tr_model_build_run(cfg, (int)s->micro_batch, tr_fit_base_auto(&s->be, s->policy.compute), err)))
        return TR_ERROR;
    s->g->compute = s->policy.compute; /* before the plan: scratch depends on it */
    s->g->allow_tf32 = s->policy.allow_tf32 && s->policy.compute == TR_F32;
    if (mode == TR_SESSION_PLAN)
        return open_plan(s, err);
    if (mode == TR_SESSION_WEIGHTS)
        return open_weights(s, err);
    /* the data against the model's tokenizer before any memory is planned or
     * weights loaded: a mismatch is the recipe's mistake, found in seconds */
    if (create_plugins(s, seq_len_of(s->g), err) != TR_OK || open_data(s, err) != TR_OK ||
        tr_rundir_check_tokenizer(s, err) != TR_OK ||
        (training(s) && resolve_steps(s, err) != TR_OK) ||
        (training(s) && tr_session_check_split(s, TR_SPLIT_VAL, 1, err) != TR_OK) ||
        plan_memory(s, err) != TR_OK || open_inputs(s, err) != TR_OK ||
        check_micro_batches(s, err) != TR_OK)
        return TR_ERROR;
    if (training(s) && s->rank == 0 && open_checkpointer(s, err) != TR_OK)
        return TR_ERROR;
    return open_prices(s, err);
}

/* The samples an evaluation reads: those that do not overlap (every
 * eval_stride-th of a source whose windows start at every token). */
uint64_t tr_session_eval_samples(const struct tr_data_info *di, enum tr_split split)
{
    uint64_t step = di->eval_stride[split] > 1 ? di->eval_stride[split] : 1;
    return di->samples[split] / step + (di->samples[split] % step != 0);
}

/* The split must hold one micro-batch at least: say which lever gives it one. */
int tr_session_check_split(const struct tr_session *r, enum tr_split split, int for_training,
                           tr_err *err)
{
    uint64_t have = tr_session_eval_samples(&r->data.info, split);
    int64_t mb = r->micro_batch;
    if (have >= (uint64_t)mb)
        return TR_OK;
    char where[600];
    tr_origin_format(&r->cfg->data.origin, where, sizeof where);
    if (for_training)
        return tr_fail(err, "%s: data '%s' has %llu validation samples%s, fewer than one "
                       "micro-batch of %lld, and training evaluates on them at its end (and "
                       "every train.eval_every steps): give the data a larger validation split "
                       "(data.val_fraction, or the plugin's validation file: trainrun plugins "
                       "data) or use a smaller train.micro_batch=N; nothing was trained",
                       where, r->data.name, (unsigned long long)have,
                       r->data.info.eval_stride[split] > 1 ? " that do not overlap" : "",
                       (long long)mb);
    if (split == TR_SPLIT_VAL && have == 0)
        return tr_fail(err, "%s: data '%s' has no validation split: give it one (data.val_fraction "
                       "above 0, or the plugin's validation file: trainrun plugins data), or "
                       "evaluate on the training split with --split train", where, r->data.name);
    return tr_fail(err, "%s: data '%s' has %llu %s samples, fewer than one micro-batch of %lld: "
                   "evaluate with a smaller train.micro_batch=N", where, r->data.name,
                   (unsigned long long)have, split == TR_SPLIT_VAL ? "validation" : "training",
                   (long long)mb);
}

int tr_session_check_data(struct tr_session *s, tr_err *err)
{
    if (!s->data.vt) { /* a plan session opens no data (or only for train.epochs) */
        if (!s->cfg->data.self &&
            tr_config_create_slot(s->cfg, &s->cfg->data, seq_len_of(s->g), err) != TR_OK)
            return TR_ERROR;
        if (open_data(s, err) != TR_OK || tr_rundir_check_tokenizer(s, err) != TR_OK)
            return TR_ERROR;
    }
    return tr_session_check_split(s, TR_SPLIT_VAL, 1, err);
}

void tr_session_close(struct tr_session *s)
{
    tr_checkpointer_close(s->ckpt);
    tr_gather_free(s->gather);
    tr_gather_free(s->share);
    free(s->stage_readers);
    tr_comm_close(s->comm);
    tr_topo_close(s->topo);
    if (s->be.iface) {
        tr_optimizer_free(&s->opt, &s->be);
        if (s->host_be.iface)
            tr_backend_close(&s->host_be);
        tr_graph_free(s->g, &s->be);
        tr_be_host_free(&s->be, s->host_inputs);
        tr_be_host_free(&s->be, s->host_targets);
        tr_backend_close(&s->be);
    }
    memset(s, 0, sizeof *s);
}

/* ---- pretrained weights (model = { from = "DIR" }) -------------------------- */

int tr_session_base_first(const struct tr_session *s)
{
    return s->cfg->lora.enabled;
}

int tr_session_check_base(const struct tr_session *s, const char *recorded, const char *what,
                          tr_err *err)
{
    if (!s->cfg->lora.enabled || !recorded || !*recorded || strcmp(recorded, s->base_identity) == 0)
        return TR_OK;
    return tr_fail(err, "%s holds adapters trained on the base %s, but this run's base is %s: "
                   "adapters only fit the weights they were trained on; use that base "
                   "(model.from) again", what, recorded, s->base_identity);
}

/* lora.from: an existing adapter's weights over the fresh ones */
static int load_adapter(struct tr_session *s, const char *base_dir, tr_err *err)
{
    const struct tr_lora_config *lc = &s->cfg->lora;
    if (!lc->enabled || !lc->from)
        return TR_OK;
    if (tr_peft_load(s->g, &s->be, lc, base_dir, err) != TR_OK) {
        tr_err_prefix(err, "%slora.from", lc->where);
        return TR_ERROR;
    }
    if (s->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "adapter from %s (rank %lld)", lc->from, (long long)lc->rank);
    return TR_OK;
}

int tr_session_load_pretrained(struct tr_session *s, tr_err *err)
{
    const char *dir = tr_hf_from_dir(s->cfg->recipe);
    snprintf(s->base_identity, sizeof s->base_identity, "seed:%lld",
             (long long)s->cfg->train.seed);
    if (!dir)
        return load_adapter(s, NULL, err);
    struct tr_hf_arch a;
    double t0 = tr_now();
    uint32_t crc = 0;
    if (tr_hf_config_read(dir, &a, err) != TR_OK ||
        tr_hf_load(s->g, &s->be, dir, &a, &crc, s->stage_readers ? tr_session_stage_keeps : NULL, s,
                   err) != TR_OK) {
        char where[600];
        struct tr_origin o = {TR_FROM_RECIPE, tr_recipe_path(s->cfg->recipe), 0};
        tr_recipe_origin(s->cfg->recipe, "model.from", &o);
        tr_origin_format(&o, where, sizeof where);
        tr_err_prefix(err, "%s: model.from", where);
        return TR_ERROR;
    }
    snprintf(s->base_identity, sizeof s->base_identity, "crc32:%08x", (unsigned)crc);
    if (s->rank == 0 && s->cfg->lora.enabled)
        tr_log(TR_LOG_INFO, NULL, "base weights from %s (%s, frozen, %s, %.1f s)", dir,
               a.model_type, s->base_identity, tr_now() - t0);
    else if (s->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "weights from %s (%s, %zu parameters, %.1f s); the optimizer "
               "starts fresh", dir, a.model_type, s->g->n_params, tr_now() - t0);
    return load_adapter(s, dir, err);
}

/* ---- micro-batches on the device ------------------------------------------- */

int tr_session_load_batch(struct tr_session *s, struct tr_loader *loader, double *wait,
                          tr_err *err)
{
    if (tr_loader_next(loader, s->host_inputs, s->host_targets, wait, err) != TR_OK)
        return TR_ERROR;
    struct tr_tensor *in = &s->g->tensors[s->g->inputs[0]];
    struct tr_tensor *tg = &s->g->tensors[s->g->inputs[1]];
    if (s->data.info.input_dtype == TR_I32) {
        /* an id past the embedding table would read out of bounds */
        const int32_t *ids = s->host_inputs;
        for (size_t i = 0; i < in->numel; i++)
            if ((uint32_t)ids[i] >= s->vocab)
                return tr_fail(err, "data '%s': token id %d is outside the model's vocabulary of %u",
                               s->data.name, ids[i], s->vocab);
    }
    tr_be_upload(&s->be, in->data, s->host_inputs, s->input_bytes);
    tr_be_upload(&s->be, tg->data, s->host_targets, s->target_count * sizeof(int32_t));
    return TR_OK;
}

double tr_session_loss_targets(const struct tr_session *s)
{
    const struct tr_graph *g = s->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        if (n->op != TR_OP_CROSS_ENTROPY || n->out != g->loss)
            continue;
        size_t valid = 0;
        for (size_t k = 0; k < s->target_count; k++)
            valid += s->host_targets[k] != n->ignore_index;
        return (double)valid;
    }
    return (double)s->target_count;
}

double tr_session_batch_weight(const struct tr_session *s, double targets)
{
    double full = (double)s->target_count;
    return targets == full ? 1.0 : targets / full;
}

float tr_session_read_loss(const struct tr_session *s)
{
    float loss;
    tr_be_download(&s->be, &loss, s->g->tensors[s->g->loss].data, sizeof loss);
    return loss;
}
