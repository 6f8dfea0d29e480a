/* Training: tr_train and its phases.  The loop, in shape (tr_train, below):
 *
 *   start(r)                        lock run_dir, setup, resume, signals, loader
 *   while (step < steps && !stopping)
 *       train_step(r)               forward_backward, agree (ranks), update
 *       tr_policy_log(r)            progress line, metrics.jsonl
 *       tr_policy_budget(r)         warn, then stop at cost.budget
 *       tr_policy_evaluate(r)       validation, early stop, keep-best
 *       tr_policy_checkpoint(r)     every N steps, a new best, the last step
 *       if (tr_policy_stop(r)) break
 *   stopped by a signal ? preempted(r) (checkpoint, exit 75) : finish(r)
 *
 * Here: setup and teardown, the phases and the step.  Around them: the
 * end-of-step policies and metrics.jsonl (policies.c), the run's state in
 * checkpoints, resume and ZeRO-1 shards (run_state.c), the run-directory
 * lock (rundir.c), sampling (sample.c), smoke runs (smoke.c); struct run,
 * which they all share, is in run_internal.h. */
#include "run.h"
#include "run_internal.h"

#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "graph.h"
#include "../util/json.h"
#include "loader.h"
#include "model.h"
#include "optim.h"
#include "../config/options.h"
#include "../config/plugin.h"
#include "../config/precision.h"
#include "../config/recipe.h"
#include "../util/safetensors.h"
#include "topo.h"
#include "trace.h"
#include "../util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- signals: finish the step, checkpoint, exit for requeue ----------- */

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

/* A stop was requested: alone, as soon as a signal arrives; with other
 * ranks, only what they all agreed at the last step boundary, so every
 * rank stops after the same step. */
int tr_run_stopping(const struct run *r)
{
    return r->world > 1 ? r->agreed_stop : stop_signal != 0;
}

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

double tr_run_loss_scale(struct run *r)
{
    if (TR_HAS_SLOT(r->precision, struct tr_precision_vtable, loss_scale))
        return r->precision->loss_scale(r->cfg->precision.self);
    return 1.0;
}

/* What to try when the loss or the gradients are not finite, from what the
 * run is actually doing: no advice to turn on what is already on. */
static void nonfinite_advice(const struct run *r, char *buf, size_t size)
{
    const struct tr_config *cfg = r->cfg;
    const char *precision = cfg->precision.plugin->info->name;
    char fp32[128] = "";
    if (r->policy.compute != TR_F32)
        snprintf(fp32, sizeof fp32, "train in fp32 (precision = \"fp32\") to see whether %s "
                 "overflows, ", precision);
    if (r->opt.applied == 0) { /* the weights are the initial ones: no step size made this */
        snprintf(buf, size, "no update has been applied yet, so the learning rate is not the "
                 "cause: %scheck the data for NaN, inf or huge values (data '%s'), and the "
                 "model's initialisation", fp32, r->data.name);
    } else if (cfg->optimizer.clip > 0) {
        snprintf(buf, size, "gradient clipping is already on (optimizer.clip = %g): lower "
                 "optimizer.lr (now %g) or warm up longer, %sor check the data (data '%s') "
                 "for NaN, inf or outliers", cfg->optimizer.clip, cfg->optimizer.lr, fp32,
                 r->data.name);
    } else {
        snprintf(buf, size, "lower optimizer.lr (now %g), clip the gradients (optimizer.clip "
                 "= 1.0), %sor check the data (data '%s') for NaN, inf or outliers",
                 cfg->optimizer.lr, fp32, r->data.name);
    }
}

/* ---- one step ----------------------------------------------------------- */

static int load_micro_batch(struct run *r, struct tr_loader *loader, double *wait, tr_err *err)
{
    if (tr_loader_next(loader, r->host_inputs, r->host_targets, wait, err) != TR_OK)
        return TR_ERROR;
    struct tr_tensor *in = &r->g->tensors[r->g->inputs[0]];
    struct tr_tensor *tg = &r->g->tensors[r->g->inputs[1]];
    if (r->data.info.input_dtype == TR_I32) {
        /* an id past the embedding table would read out of bounds */
        const int32_t *ids = r->host_inputs;
        for (size_t i = 0; i < in->numel; i++)
            if ((uint32_t)ids[i] >= r->vocab)
                return tr_fail(err, "data '%s': token id %d is outside the model's vocabulary of %u",
                               r->data.name, ids[i], r->vocab);
    }
    r->be.iface->upload(r->be.context, in->data, r->host_inputs, r->input_bytes);
    r->be.iface->upload(r->be.context, tg->data, r->host_targets, r->target_count * sizeof(int32_t));
    return TR_OK;
}

static float read_loss(struct run *r)
{
    float loss;
    r->be.iface->download(r->be.context, &loss, r->g->tensors[r->g->loss].data, sizeof loss);
    return loss;
}

int tr_run_evaluate(struct run *r, double *val_loss, double *val_accuracy, tr_err *err)
{
    double t0 = tr_now();
    struct tr_loader_config lc = {TR_SPLIT_VAL, (int)r->cfg->train.micro_batch, 0, 1, 0,
                                  (uint64_t)r->cfg->train.seed, NULL, r->rank, r->world, NULL};
    struct tr_loader *val = tr_loader_open(&r->data, &lc, 0, err);
    if (!val)
        return TR_ERROR;
    uint64_t n = tr_loader_batches_per_epoch(val);
    if (n > (uint64_t)r->cfg->train.eval_batches)
        n = (uint64_t)r->cfg->train.eval_batches;
    /* rank r evaluates batches r, r + world, ... of the n */
    uint64_t mine = n / (uint64_t)r->world + ((uint64_t)r->rank < n % (uint64_t)r->world);
    double sum = 0;
    int64_t correct = 0, counted = 0;
    for (uint64_t i = 0; i < mine; i++) {
        if (load_micro_batch(r, val, NULL, err) != TR_OK) {
            tr_loader_close(val);
            return TR_ERROR;
        }
        tr_graph_forward(r->g, &r->be);
        sum += read_loss(r);
        if (r->g->logits >= 0 && r->be.iface->count_correct) {
            const struct tr_tensor *lg = &r->g->tensors[r->g->logits];
            int V = (int)lg->shape[lg->ndim - 1];
            int64_t valid = 0;
            correct += r->be.iface->count_correct(r->be.context, lg->data,
                                                  r->g->tensors[r->g->inputs[1]].data,
                                                  (int)(lg->numel / (size_t)V), V, -1, &valid);
            counted += valid;
        }
    }
    tr_loader_close(val);
    if (r->comm) {
        float totals[3] = {(float)sum, (float)correct, (float)counted};
        if (tr_comm_allreduce(r->comm, totals, 3, err) != TR_OK)
            return TR_ERROR;
        sum = totals[0];
        correct = (int64_t)totals[1];
        counted = (int64_t)totals[2];
    }
    *val_loss = sum / (double)n;
    *val_accuracy = counted ? (double)correct / (double)counted : NAN;
    r->t_eval += tr_now() - t0;
    return TR_OK;
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
    for (int64_t m = batch; m >= 1; m--) {
        if (batch % m != 0)
            continue;
        struct tr_graph *g = tr_model_build(cfg->recipe, (int)m, err);
        if (!g)
            return TR_ERROR;
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

/* ---- setup and the loop ------------------------------------------------- */

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

    if (cfg->train.auto_micro_batch && choose_micro_batch(r, err) != TR_OK)
        return TR_ERROR;
    r->g = tr_model_build(cfg->recipe, (int)cfg->train.micro_batch, err);
    if (!r->g)
        return TR_ERROR;
    struct tr_tensor *in = &r->g->tensors[r->g->inputs[0]];
    uint32_t seq_len = in->dtype == TR_I32 && in->ndim == 2 ? (uint32_t)in->shape[1] : 0;
    if (tr_config_create_plugins(cfg, seq_len, err) != TR_OK)
        return TR_ERROR;
    struct tr_precision_policy pol = {.struct_size = sizeof pol};
    r->precision->policy(cfg->precision.self, &pol);
    char pwhere[600];
    tr_origin_format(&cfg->precision.origin, pwhere, sizeof pwhere);
    if (tr_precision_check(&pol, cfg->precision.plugin->info->name, pwhere, cfg->device, err) != TR_OK)
        return TR_ERROR;
    r->policy = pol;
    r->g->compute = pol.compute; /* before the plan: scratch depends on it */

    /* the data source must fit the model */
    r->data.vt = cfg->data.plugin->info->vtable;
    r->data.self = cfg->data.self;
    r->data.name = cfg->data.plugin->info->name;
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

    int slots = tr_optimizer_find(cfg->optimizer.type)->state_slots;
    if (tr_graph_plan(r->g, &r->be, slots, err) != TR_OK)
        return TR_ERROR;
    size_t begin = 0, end = r->g->n_params;
    if (cfg->parallel.zero && r->world > 1) /* ZeRO-1: this rank's shard of the state */
        tr_run_shard_of(r, r->rank, &begin, &end);
    if (tr_optimizer_init(&r->opt, &cfg->optimizer, r->g, &r->be, begin, end, err) != TR_OK)
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
    if (r->rank != 0) /* rank 0 writes; the others get its state by broadcast */
        return setup_cost(r, &r->policy, err);
    r->ckpt = tr_checkpointer_open(&cc, err);
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

/* Dollars this process has spent (elapsed time x device price x count). */
double tr_run_cost(const struct run *r) { return (tr_now() - r->t_start) * r->usd_per_second; }

/* cost.budget reached (this process's view of the dollars spent) */
int tr_run_over_budget(const struct run *r)
{
    return r->cfg->cost.budget > 0 && r->cost_before + tr_run_cost(r) >= r->cfg->cost.budget;
}

/* ---- the phases of a run ------------------------------------------------ */

/* Everything before the first step: the run directory, setup, resume, the
 * signal handlers, the loader, metrics.jsonl and the trace. */
static int start(struct run *r, const struct tr_run_flags *flags, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    /* before anything in run_dir is opened (metrics.jsonl is truncated on a
     * fresh start): rank 0 writes for the whole job, so it alone locks */
    if (cfg->rank.rank == 0 && (tr_run_lock(r, err) != TR_OK ||
                                (!flags->resume && tr_run_refuse_earlier(r, err) != TR_OK)))
        return TR_ERROR;
    if (tr_run_setup(r, err) != TR_OK)
        return TR_ERROR;
    if (!flags->quiet && r->rank == 0)
        tr_graph_print_memory(r->g, stderr);
    if (flags->resume && tr_run_resume(r, err) != TR_OK)
        return TR_ERROR;
    if (r->position % (uint64_t)r->world != 0)
        return tr_fail(err, "the checkpoint stopped %llu micro-batches into the data, which %d "
                       "ranks cannot share; resume with a world size that divides the "
                       "micro-batches per step", (unsigned long long)r->position, r->world);
    /* before the loader's workers start: from their first read on, a signal
     * ends a wait for data and the run (exit 75) instead of killing it */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    struct tr_loader_config lc = {TR_SPLIT_TRAIN, (int)cfg->train.micro_batch,
                                  (int)cfg->train.workers, (int)cfg->train.prefetch, 1,
                                  (uint64_t)cfg->train.seed, r->topo, r->rank, r->world,
                                  &stop_signal}; /* a signal ends a wait for data */
    r->loader = tr_loader_open(&r->data, &lc, r->position / (uint64_t)r->world, err);
    if (!r->loader)
        return TR_ERROR;
    if (r->rank == 0 && tr_run_open_metrics(r, flags->resume, err) != TR_OK) /* one rank reports */
        return TR_ERROR;
    r->quiet = flags->quiet || r->rank != 0;
    r->first_step = r->step;
    r->t_start = tr_now();
    if (cfg->train.trace_every > 0 && r->rank == 0) {
        char *path = tr_xasprintf("%s/trace.json", cfg->run_dir);
        if (flags->resume)
            tr_run_keep_earlier_trace(path);
        r->trace = tr_trace_open(path, r->t_start);
        free(path);
    }
    return TR_OK;
}

/* ---- the step ------------------------------------------------------------ */

#define STEP_ABANDONED 1 /* a signal came mid-step: the step is dropped, not finished */

/* Forward and backward over the micro-batches of one step, the loss summed
 * into *loss_sum.  Alone, a signal abandons the step (STEP_ABANDONED): the
 * checkpoint written next predates it.  With ranks, every rank finishes it. */
static int forward_backward(struct run *r, double scale, double *loss_sum, tr_err *err)
{
    r->be.iface->zero(r->be.context, r->g->grads, r->g->n_params * sizeof(float));
    /* the mean over the micro-batches of every rank */
    r->g->loss_grad = (float)(scale / (r->accum * r->world));
    int sampled = r->trace && r->step % (uint64_t)r->cfg->train.trace_every == 0;
    for (int k = 0; k < r->accum; k++) {
        if (k > 0 && r->world == 1 && stop_signal)
            return STEP_ABANDONED;
        double td = tr_now();
        if (load_micro_batch(r, r->loader, &r->t_data, err) != TR_OK)
            /* signalled while the loader was blocked: abandon the step too */
            return r->world == 1 && tr_loader_cancelled(r->loader) ? STEP_ABANDONED : TR_ERROR;
        double t0 = tr_now();
        r->g->profile = sampled && k == 0; /* per-op timings of one micro-batch */
        tr_graph_forward(r->g, &r->be);
        *loss_sum += read_loss(r);
        if (r->comm && k == r->accum - 1) /* all-reduce buckets as backward finishes them */
            tr_comm_arm(r->comm, r->g);
        tr_graph_backward(r->g, &r->be);
        double t1 = tr_now();
        r->t_compute += t1 - t0;
        tr_trace_phase(r->trace, "data wait", r->step, td, t0);
        tr_trace_phase(r->trace, "forward+backward", r->step, t0, t1);
        if (r->g->profile)
            tr_trace_ops(r->trace, r->g, r->step);
        r->g->profile = 0;
    }
    return TR_OK;
}

/* With ranks: the last gradient buckets, then one small agreement: the
 * loss, whether any rank was signalled, and rank 0's budget verdict. */
static int agree(struct run *r, double *loss_sum, tr_err *err)
{
    double tw = tr_now();
    float agree[3] = {(float)*loss_sum, stop_signal ? 1.0f : 0.0f,
                      r->rank == 0 && tr_run_over_budget(r) ? 1.0f : 0.0f};
    if (tr_comm_finish(r->comm, r->g, err) != TR_OK ||
        tr_comm_allreduce(r->comm, agree, 3, err) != TR_OK)
        return TR_ERROR;
    *loss_sum = agree[0];
    r->agreed_stop = agree[1] > 0;
    r->budget_stop = agree[2] > 0;
    r->t_comm += tr_now() - tw;
    tr_trace_phase(r->trace, "gradient all-reduce wait", r->step, tw, tr_now());
    return TR_OK;
}

/* Unscale, check, clip, update.  The precision plugin decides whether a step
 * with non-finite gradients is skipped; without that slot it ends the run. */
static int update(struct run *r, double scale, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    double t0 = tr_now();
    double sumsq = r->be.iface->sum_squares(r->be.context, r->g->grads, r->g->n_params);
    int finite = isfinite(sumsq) && isfinite(r->last_loss);
    r->grad_norm = sqrt(sumsq) / scale;
    int apply = finite;
    if (TR_HAS_SLOT(r->precision, struct tr_precision_vtable, update)) {
        apply = r->precision->update(cfg->precision.self, finite, err);
        if (apply == TR_ERROR)
            return TR_ERROR;
    } else if (!finite) {
        char advice[512];
        nonfinite_advice(r, advice, sizeof advice);
        return tr_fail(err, "step %llu: the %s not finite (loss %g); %s",
                       (unsigned long long)r->step,
                       isfinite(r->last_loss) ? "gradients are" : "loss is", r->last_loss, advice);
    }
    r->lr = r->schedule->lr(cfg->schedule.self, r->step, (uint64_t)cfg->train.steps,
                            cfg->optimizer.lr);
    if (apply) {
        double clip = cfg->optimizer.clip > 0 && r->grad_norm > cfg->optimizer.clip
                          ? cfg->optimizer.clip / r->grad_norm : 1.0;
        tr_optimizer_step(&r->opt, r->g, &r->be, clip / scale, r->lr);
        if (r->comm && tr_run_sharded(r) && tr_run_share_params(r, err) != TR_OK)
            return TR_ERROR;
    } else {
        r->skipped++;
    }
    r->t_optimizer += tr_now() - t0;
    tr_trace_phase(r->trace, "optimizer", r->step, t0, tr_now());
    return TR_OK;
}

/* One optimizer step: TR_OK, STEP_ABANDONED or TR_ERROR. */
static int train_step(struct run *r, tr_err *err)
{
    uint64_t step_start = tr_loader_position(r->loader) * (uint64_t)r->world;
    double scale = tr_run_loss_scale(r), loss_sum = 0;
    int rc = forward_backward(r, scale, &loss_sum, err);
    if (rc == STEP_ABANDONED)
        r->position = step_start; /* the preemption checkpoint resumes at the step's start */
    if (rc != TR_OK)
        return rc;
    if (r->comm && agree(r, &loss_sum, err) != TR_OK)
        return TR_ERROR;
    r->last_loss = loss_sum / (r->accum * r->world);
    if (update(r, scale, err) != TR_OK)
        return TR_ERROR;
    r->step++;
    r->tokens += (double)r->cfg->train.batch * r->data.info.target_len;
    r->position = tr_loader_position(r->loader) * (uint64_t)r->world;
    return TR_OK;
}

/* Preemption: a signal stopped the loop before the last step; checkpoint
 * now, within checkpoint.deadline, and exit 75 for the launcher to requeue. */
static int preempted(struct run *r, tr_err *err)
{
    int sig = stop_signal ? (int)stop_signal : SIGTERM;
    double t0 = tr_now();
    if (tr_run_save(r, r->position, 1, err) != TR_OK ||
        (r->ckpt && tr_checkpointer_wait(r->ckpt, err) != TR_OK))
        return TR_ERROR;
    double took = tr_now() - t0;
    if (took > r->cfg->checkpoint_policy.deadline)
        tr_log(TR_LOG_WARN, NULL, "the preemption checkpoint took %.1f s, over the %.0f s "
               "deadline (checkpoint.deadline)", took, r->cfg->checkpoint_policy.deadline);
    tr_log(TR_LOG_WARN, NULL, "received signal %d: checkpoint of step %llu saved in %.2f s; "
           "exiting with code %d (requeue, then --resume auto)", sig,
           (unsigned long long)r->step, took, TR_EXIT_PREEMPTED);
    return tr_run_close_outputs(r, err);
}

/* The end of a finished run: the last checkpoint landed (and, for a smoke
 * run, reads back), metrics and trace on disk, the summary. */
static int finish(struct run *r, const struct tr_run_flags *flags, tr_err *err)
{
    if (r->ckpt && tr_checkpointer_wait(r->ckpt, err) != TR_OK)
        return TR_ERROR; /* the final checkpoint did not land */
    if (flags->smoke && r->ckpt && tr_smoke_round_trip(r, err) != TR_OK)
        return TR_ERROR;
    if (tr_run_close_outputs(r, err) != TR_OK)
        return TR_ERROR;
    if (!r->quiet)
        tr_run_summary(r, tr_now() - r->t_start, r->tokens);
    return TR_OK;
}

/* ---- the training loop ---------------------------------------------------- */

int tr_train(struct tr_config *cfg, const struct tr_run_flags *flags)
{
    struct run run, *r = &run;
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    tr_err err = {{0}};
    int code = TR_EXIT_ERROR, improved;
    if (start(r, flags, &err) != TR_OK)
        goto fail;
    while (r->step < (uint64_t)cfg->train.steps && !tr_run_stopping(r)) {
        int rc = train_step(r, &err); /* forward, backward, update */
        if (rc == STEP_ABANDONED)
            break;
        if (rc != TR_OK || tr_policy_log(r, &err) != TR_OK)
            goto fail;
        tr_policy_budget(r);
        if (tr_policy_evaluate(r, &improved, &err) != TR_OK || /* + early stop, keep-best */
            tr_policy_checkpoint(r, improved, &err) != TR_OK)
            goto fail;
        if (tr_policy_stop(r))
            break;
        if (tr_trace_error(r->trace)) {
            tr_run_trace_failed(r, tr_trace_error(r->trace), &err);
            goto fail;
        }
    }
    if (tr_run_stopping(r) && r->step < (uint64_t)cfg->train.steps) {
        if (preempted(r, &err) != TR_OK)
            goto fail;
        code = TR_EXIT_PREEMPTED;
    } else {
        if (finish(r, flags, &err) != TR_OK)
            goto fail;
        code = TR_EXIT_OK;
    }
    goto out;
fail:
    if (r->world > 1)
        tr_log(TR_LOG_ERROR, NULL, "rank %d: %s", r->rank, err.msg);
    else
        tr_log(TR_LOG_ERROR, NULL, "%s", err.msg);
out:
    tr_run_teardown(r);
    return code;
}
