/* A run's setup and teardown (tr_run_setup, tr_run_teardown; the loop is
 * in run.c): thread placement, the backend, comm, the model graph at its
 * micro-batch (micro_batch = "auto" chooses it), the plugins, the precision
 * policy, the data source checked against the model, the memory plan, the
 * optimizer, the host input buffers, the checkpointer, and the run's prices. */
#include "run_internal.h"

#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "graph.h"
#include "hf_weights.h"
#include "loader.h"
#include "model.h"
#include "optim.h"
#include "../config/hardware.h"
#include "../config/hf_config.h"
#include "../config/plugin.h"
#include "../config/precision.h"
#include "../config/recipe.h"
#include "topo.h"
#include "trace.h"
#include "../util/util.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- host buffers ---------------------------------------------------------- */

/* Host buffers the loader fills and the backend uploads: page-locked when
 * the backend offers it (faster copies), else ordinary memory. */
static void *host_buffer(struct run *r, size_t bytes)
{
    if (TR_HAS_SLOT(r->be.iface, struct tr_backend_iface, host_alloc))
        return r->be.iface->host_alloc(r->be.context, bytes);
    return tr_alloc(bytes);
}

static void host_buffer_free(struct run *r, void *p)
{
    if (!p)
        return;
    if (r->be.iface && TR_HAS_SLOT(r->be.iface, struct tr_backend_iface, host_free))
        r->be.iface->host_free(r->be.context, p);
    else
        tr_free(p);
}

/* Prices and peaks from the recipe's cost section and the hardware table. */
static int setup_cost(struct run *r, const struct tr_precision_policy *pol, tr_err *err)
{
    const struct tr_cost_config *c = &r->cfg->cost;
    const struct tr_hardware *hw = NULL;
    if (*c->hardware && tr_hardware_lookup(c->hardware, &hw, err) != TR_OK) {
        char where[600];
        struct tr_origin o;
        tr_recipe_origin(r->cfg->recipe, "cost.hardware", &o);
        tr_origin_format(&o, where, sizeof where);
        tr_err_prefix(err, "%s: cost", where);
        return TR_ERROR;
    }
    double price = c->spot ? c->spot_price : c->price;
    if (price < 0 && hw)
        price = c->spot ? hw->spot_price_hour : hw->price_hour;
    /* a job of several ranks pays for all of them (cost.count, if larger, also
     * counts devices this job's ranks do not see, e.g. an idle spare) */
    double devices = (double)(c->count > r->world ? c->count : r->world);
    r->usd_per_second = price > 0 ? price * devices / 3600.0 : 0;
    double peak = c->peak_tflops;
    if (peak <= 0 && hw)
        peak = tr_precision_peak_tflops(hw, pol, NULL);
    r->peak_flops = peak > 0 ? peak * 1e12 * devices : 0;
    r->flops_per_token = tr_graph_flops_per_token(r->g);
    return TR_OK;
}

/* Memory the device offers a plan: train.memory_budget, else the device's
 * (cost.hardware, or 80 GiB for an unnamed accelerator), else this machine's. */
double tr_run_device_memory(const struct tr_config *cfg, char *what, size_t what_size)
{
    const struct tr_hardware *hw = *cfg->cost.hardware ? tr_hardware_find(cfg->cost.hardware) : NULL;
    if (cfg->train.memory_budget > 0) {
        snprintf(what, what_size, "train.memory_budget");
        return cfg->train.memory_budget * 1024.0 * 1024.0 * 1024.0;
    }
    if (hw && strcmp(hw->name, "cpu") != 0) {
        snprintf(what, what_size, "%s", hw->name);
        return (double)hw->memory_bytes;
    }
    if (strcmp(cfg->device, "cpu") != 0) {
        snprintf(what, what_size, "an 80 GiB %s device (set cost.hardware)", cfg->device);
        return 80.0 * 1024 * 1024 * 1024;
    }
    snprintf(what, what_size, "this machine's memory");
    return (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
}

/* micro_batch = "auto": the largest divisor of the batch whose measured plan
 * fits the memory budget less a 10% margin (for the allocator and runtime). */
static int choose_micro_batch(struct run *r, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    char what[128];
    double usable = 0.9 * tr_run_device_memory(cfg, what, sizeof what);
    int slots = tr_optimizer_find(cfg->optimizer.type)->state_slots;
    int64_t batch = cfg->train.batch;
    size_t smallest = 0;
    int recomputing = 0;
    /* a 16-bit compute dtype stores the activations in 16 bits: each
     * candidate's plan counts them as the run will */
    struct tr_precision_policy pol = {.struct_size = sizeof pol};
    r->precision->policy(cfg->precision.self, &pol);
    for (int64_t m = batch; m >= 1; m--) {
        if (batch % m != 0)
            continue;
        struct tr_graph *g = tr_model_build(cfg->recipe, (int)m, err);
        if (!g)
            return TR_ERROR;
        g->compute = pol.compute;
        tr_graph_measure(g, &r->be, slots);
        size_t total = tr_graph_memory_total(&g->memory);
        recomputing = g->memory.recompute > 0;
        tr_graph_free(g, NULL);
        smallest = total;
        if ((double)total <= usable) {
            char a[32], b[32];
            tr_format_bytes((double)total, a, sizeof a);
            tr_format_bytes(usable, b, sizeof b);
            tr_log(TR_LOG_INFO, NULL, "auto micro-batch: %lld (plan %s of %s usable on %s); %lld "
                   "micro-batches per step keep the batch of %lld", (long long)m, a, b, what,
                   (long long)(batch / m), (long long)batch);
            cfg->train.micro_batch = m;
            return TR_OK;
        }
    }
    char a[32], b[32];
    tr_format_bytes((double)smallest, a, sizeof a);
    tr_format_bytes(usable, b, sizeof b);
    return tr_fail(err, "auto micro-batch: even a micro-batch of 1 needs %s, more than the %s "
                   "usable on %s; %s%suse a smaller model", a, b, what,
                   recomputing ? "" : "recompute activations (model.recompute) or ",
                   cfg->train.memory_budget > 0 ? "raise train.memory_budget or " : "");
}

/* One forward and backward at the chosen size before training: a plan that
 * does not fit fails here, not hours in. */
static void trial_step(struct run *r)
{
    struct tr_graph *g = r->g;
    for (int k = 0; k < g->n_inputs; k++) {
        struct tr_tensor *t = &g->tensors[g->inputs[k]];
        r->be.iface->zero(r->be.context, t->data, t->numel * 4);
    }
    g->loss_grad = 1.0f;
    tr_graph_forward(g, &r->be);
    tr_graph_backward(g, &r->be);
    r->be.iface->zero(r->be.context, g->grads, g->n_params * sizeof(float));
}

/* ---- pretrained weights (model = { from = "DIR" }) -------------------------- */

/* The model as a Hugging Face config.json, for state.json (export --format
 * hf), or NULL when it has no such form (an mlp, an inline builder). */
static char *hf_config_text(struct run *r)
{
    const struct tr_value *model = tr_value_child(tr_recipe_root(r->cfg->recipe), "model");
    const struct tr_value *type = tr_value_child(model, "type");
    struct tr_hf_arch a;
    tr_err why = {{0}};
    if (!type || type->type != TR_V_STRING ||
        (strcmp(type->string, "llama") != 0 && strcmp(type->string, "gpt") != 0))
        return NULL;
    if (tr_hf_describe(r->g, type->string, &a, &why) != TR_OK) {
        tr_log(TR_LOG_DEBUG, NULL, "no Hugging Face form recorded: %s", why.msg);
        return NULL;
    }
    /* a Llama from a directory keeps that directory's context length */
    struct tr_hf_arch from;
    const char *dir = tr_hf_from_dir(r->cfg->recipe);
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

int tr_run_load_pretrained(struct run *r, tr_err *err)
{
    const char *dir = tr_hf_from_dir(r->cfg->recipe);
    if (!dir)
        return TR_OK;
    struct tr_hf_arch a;
    double t0 = tr_now();
    if (tr_hf_config_read(dir, &a, err) != TR_OK || tr_hf_load(r->g, &r->be, dir, &a, err) != TR_OK) {
        char where[600];
        struct tr_origin o = {TR_FROM_RECIPE, tr_recipe_path(r->cfg->recipe), 0};
        tr_recipe_origin(r->cfg->recipe, "model.from", &o);
        tr_origin_format(&o, where, sizeof where);
        tr_err_prefix(err, "%s: model.from", where);
        return TR_ERROR;
    }
    if (r->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "weights from %s (%s, %zu parameters, %.1f s); the optimizer "
               "starts fresh", dir, a.model_type, r->g->n_params, tr_now() - t0);
    return TR_OK;
}

/* The recipe's plugins.  An evaluation creates only those it reads through:
 * no run directory and no checkpoint plugin, which would create (and tidy)
 * a checkpoints directory. */
static int create_plugins(struct run *r, uint32_t seq_len, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    if (!r->eval_only)
        return tr_config_create_plugins(cfg, seq_len, err);
    struct tr_slot *slots[] = {&cfg->precision, &cfg->data, &cfg->schedule};
    for (size_t i = 0; i < TR_ARRAY_LEN(slots); i++)
        if (!slots[i]->self && tr_config_create_slot(cfg, slots[i], seq_len, err) != TR_OK)
            return TR_ERROR;
    return TR_OK;
}

/* ---- setup and teardown --------------------------------------------------- */

int tr_run_setup(struct run *r, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    r->rank = cfg->rank.rank;
    r->world = cfg->rank.world;
    /* placement: compute threads one per core, loader workers beside them;
     * ranks sharing this node each get their own cores (near their GPU) */
    int threads = (int)cfg->train.threads, placed = 0;
    tr_err why = {{0}};
    r->topo = tr_topo_open(NULL, &why);
    if (!r->topo)
        tr_log(TR_LOG_WARN, "topology", "%s; threads are not pinned", why.msg);
    if (r->topo && cfg->rank.local_world > 1) {
        struct tr_topo_rank place;
        enum tr_topo_device kind = strcmp(cfg->device, "cuda") == 0 ? TR_TOPO_CUDA : TR_TOPO_CPU;
        if (tr_topo_place(r->topo, kind, cfg->rank.local_world, cfg->rank.local_rank, &place,
                          &why) == TR_OK) {
            placed = tr_topo_use(r->topo, &place);
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
    if (tr_backend_open(&r->be, cfg->device, threads, &cfg->plugin_path, err) != TR_OK)
        return TR_ERROR;
    if (r->topo && strcmp(cfg->device, "cpu") == 0 && (cfg->rank.local_world == 1 || placed))
        tr_topo_bind_compute(r->topo, threads);
    if (r->world > 1) {
        if (TR_HAS_SLOT(r->be.iface, struct tr_backend_iface, stream)) /* device comms queue behind the compute */
            cfg->device_stream = r->be.iface->stream(r->be.context);
        if (!(r->comm = tr_comm_open(cfg, err)))
            return TR_ERROR;
        if (r->rank == 0)
            tr_log(TR_LOG_INFO, NULL, "rank 0 of %d (%s); %s", r->world, cfg->rank.source,
                   tr_comm_describe(r->comm));
    }
    r->precision = cfg->precision.plugin->info->vtable;
    r->schedule = cfg->schedule.plugin->info->vtable;

    /* the precision plugin first (it needs no sequence length): the
     * micro-batch choice plans with its compute dtype */
    if (!cfg->precision.self && tr_config_create_slot(cfg, &cfg->precision, 0, err) != TR_OK)
        return TR_ERROR;
    if (cfg->train.auto_micro_batch && choose_micro_batch(r, err) != TR_OK)
        return TR_ERROR;
    r->g = tr_model_build(cfg->recipe, (int)cfg->train.micro_batch, err);
    if (!r->g)
        return TR_ERROR;
    struct tr_tensor *in = &r->g->tensors[r->g->inputs[0]];
    uint32_t seq_len = in->dtype == TR_I32 && in->ndim == 2 ? (uint32_t)in->shape[1] : 0;
    if (create_plugins(r, seq_len, err) != TR_OK)
        return TR_ERROR;
    struct tr_precision_policy pol = {.struct_size = sizeof pol};
    r->precision->policy(cfg->precision.self, &pol);
    char pwhere[600];
    tr_origin_format(&cfg->precision.origin, pwhere, sizeof pwhere);
    if (tr_precision_check(&pol, cfg->precision.plugin->info->name, pwhere, cfg->device, err) != TR_OK)
        return TR_ERROR;
    r->policy = pol;
    r->g->compute = pol.compute; /* before the plan: scratch depends on it */
    r->g->allow_tf32 = pol.allow_tf32 && pol.compute == TR_F32;

    /* the data source must fit the model */
    r->data.vt = cfg->data.plugin->info->vtable;
    r->data.self = cfg->data.self;
    r->data.name = cfg->data.plugin->info->name;
    memset(&r->data.info, 0, sizeof r->data.info); /* fields an older plugin leaves out read 0 */
    r->data.info.struct_size = sizeof r->data.info;
    if (r->data.vt->info(r->data.self, &r->data.info, err) != TR_OK)
        return TR_ERROR;
    struct tr_tensor *tg = &r->g->tensors[r->g->inputs[1]];
    size_t per_in = in->numel / (size_t)r->g->batch, per_tg = tg->numel / (size_t)r->g->batch;
    const struct tr_data_info *di = &r->data.info;
    char where[600];
    tr_origin_format(&cfg->data.origin, where, sizeof where);
    if (di->input_dtype != in->dtype || di->input_len != per_in || di->target_len != per_tg)
        return tr_fail(err, "%s: data '%s' gives samples of %u %s and %u targets, but the model "
                       "takes %zu %s and %zu targets per sample", where, r->data.name,
                       di->input_len, di->input_dtype == TR_I32 ? "token ids" : "features",
                       di->target_len, per_in, in->dtype == TR_I32 ? "token ids" : "features", per_tg);
    if (r->g->logits >= 0) {
        const struct tr_tensor *lg = &r->g->tensors[r->g->logits];
        if (di->classes > (uint32_t)lg->shape[lg->ndim - 1])
            return tr_fail(err, "%s: data '%s' has %u classes/symbols but the model predicts only %lld",
                           where, r->data.name, di->classes, (long long)lg->shape[lg->ndim - 1]);
    }

    /* train.tokens / train.epochs: the step count, now that the sequence
     * length and the training split are known */
    if (!r->eval_only && tr_train_resolve_steps(cfg, seq_len, di->samples[TR_SPLIT_TRAIN] /
                                                (di->train_views > 1 ? di->train_views : 1),
                                                (uint64_t)cfg->train.micro_batch, err) != TR_OK)
        return TR_ERROR;

    /* an evaluation keeps no optimizer state */
    int slots = r->eval_only ? 0 : tr_optimizer_find(cfg->optimizer.type)->state_slots;
    if (tr_graph_plan(r->g, &r->be, slots, err) != TR_OK)
        return TR_ERROR;
    size_t begin = 0, end = r->g->n_params;
    if (cfg->parallel.zero && r->world > 1) { /* ZeRO-1: this rank's shard of the state */
        if (r->comm && !tr_comm_has_allgather(r->comm))
            return tr_fail(err, "parallel.zero: comm '%s' has no allgather, which ZeRO-1 needs to "
                           "share the updated parameter shards; set parallel.zero = false or use "
                           "a comm plugin that has one (tcp, mpi, nccl)",
                           cfg->comm.plugin->info->name);
        tr_run_shard_of(r, r->rank, &begin, &end);
    }
    if (!r->eval_only &&
        tr_optimizer_init(&r->opt, &cfg->optimizer, r->g, &r->be, begin, end, err) != TR_OK)
        return TR_ERROR;
    r->g->memory.optimizer = (size_t)slots * (end - begin) * sizeof(float);
    if (end - begin < r->g->n_params && r->rank == 0)
        tr_log(TR_LOG_INFO, NULL, "optimizer state sharded: rank 0 keeps %zu of %zu parameters' "
               "state (parallel.zero)", end - begin, r->g->n_params);
    if (r->comm && tr_comm_plan_buckets(r->comm, r->g,
                                        (size_t)(cfg->parallel.bucket_mb * 1024 * 1024), err) != TR_OK)
        return TR_ERROR;
    r->input_bytes = in->numel * 4;
    r->target_count = tg->numel;
    r->host_inputs = host_buffer(r, r->input_bytes);
    r->host_targets = host_buffer(r, r->target_count * sizeof(int32_t));
    if (!r->host_inputs || !r->host_targets)
        return tr_fail(err, "out of memory for the input buffers");
    if (cfg->train.auto_micro_batch)
        trial_step(r);
    tr_graph_init_params(r->g, &r->be, (uint64_t)cfg->train.seed);
    /* micro-batches per optimizer step on this rank (the config checked that
     * the ranks share them evenly) */
    r->accum = (int)(cfg->train.batch / cfg->train.micro_batch / r->world);
    if (r->accum < 1)
        return tr_fail(err, "train: batch %lld cannot be shared by %d ranks in micro-batches of %lld",
                       (long long)cfg->train.batch, r->world, (long long)cfg->train.micro_batch);
    r->vocab = UINT32_MAX;
    for (int i = 0; i < r->g->n_nodes; i++) /* the token embedding's table size */
        if (r->g->nodes[i].op == TR_OP_EMBEDDING && r->g->nodes[i].in[1] == r->g->inputs[0])
            r->vocab = (uint32_t)r->g->tensors[r->g->nodes[i].in[0]].shape[0];
    if (tr_run_check_tokenizer(r, err) != TR_OK)
        return TR_ERROR;
    r->last_val = NAN;
    r->best_val = NAN;
    r->stop_best = NAN;
    r->last_loss = NAN;

    char recipe[PATH_MAX];
    const struct tr_checkpoint_policy *cp = &cfg->checkpoint_policy;
    struct tr_checkpointer_config cc = {
        .vt = cfg->checkpoint.plugin->info->vtable,
        .self = cfg->checkpoint.self,
        .g = r->g,
        .be = &r->be,
        .optimizer = r->opt.desc,
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
    /* rank 0 writes; the others get its state by broadcast; an evaluation writes nothing */
    if (r->rank != 0 || r->eval_only)
        return setup_cost(r, &r->policy, err);
    char *hf_config = hf_config_text(r), weights_from[PATH_MAX];
    const char *from = tr_hf_from_dir(cfg->recipe);
    cc.hf_config = hf_config;
    cc.weights_from = from ? (realpath(from, weights_from) ? weights_from : from) : NULL;
    r->ckpt = tr_checkpointer_open(&cc, err);
    free(hf_config);
    if (!r->ckpt)
        return TR_ERROR;
    return setup_cost(r, &r->policy, err);
}

void tr_run_teardown(struct run *r)
{
    tr_checkpointer_close(r->ckpt);
    tr_comm_close(r->comm);
    tr_loader_close(r->loader);
    tr_topo_close(r->topo);
    tr_trace_close(r->trace);
    if (r->be.iface) {
        for (int k = 0; k < 2; k++)
            if (r->resume_full[k])
                r->be.iface->free(r->be.context, r->resume_full[k]);
        tr_optimizer_free(&r->opt, &r->be);
        tr_graph_free(r->g, &r->be);
        host_buffer_free(r, r->host_inputs);
        host_buffer_free(r, r->host_targets);
        tr_backend_close(&r->be);
    }
    tr_run_metrics_drop(r);
    free(r->metrics_path);
    tr_run_unlock(r); /* last: the run directory is ours until everything is written */
}
