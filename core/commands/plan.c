/* `trainrun plan`: building the plan (this file) and the command; the
 * plan's printed report is in plan_print.c. */
#include "plan.h"
#include "../engine/pipeline.h"

#include "../engine/fit.h"
#include "../engine/session.h"
#include "../config/precision.h"
#include "../engine/run.h"
#include "../config/run_config.h"
#include "../util/util.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Backward is 4·P of the 6·P training FLOPs: the share of a step the
 * gradient all-reduce can hide behind. */
#define BACKWARD_SHARE (2.0 / 3.0)

/* ---- building the plan -------------------------------------------------- */

static size_t dtype_bytes(enum tr_dtype d) { return d == TR_BF16 || d == TR_F16 ? 2 : 4; }

/* Parameters, embeddings among them, and the FLOPs terms, from the graph. */
static void count_model(struct tr_plan *p, const struct tr_graph *g)
{
    char *embedding = tr_xcalloc((size_t)g->n_tensors, 1);
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        if (n->op == TR_OP_EMBEDDING)
            embedding[n->in[0]] = 1; /* the table */
        else if (n->op == TR_OP_ADD_ROWS)
            embedding[n->in[1]] = 1; /* learned positions */
    }
    /* the attention term from the graph, packed or grouped-query alike */
    struct tr_flops f;
    tr_graph_count_flops(g, &f);
    p->layers = f.layers;
    p->seq_len = f.seq_len;
    p->width = f.width;
    p->attention_flops = f.attention;
    p->lookup_params = (int64_t)f.lookup_params;
    p->convs = f.convs;
    p->conv_flops = f.conv;
    p->dense_flops = f.dense;
    p->frozen_params = (int64_t)f.frozen;
    p->frozen_multiplied = (int64_t)f.frozen_multiplied;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM && t->role != TR_ROLE_FROZEN)
            continue;
        p->params += (int64_t)t->numel;
        if (embedding[i])
            p->embedding_params += (int64_t)t->numel;
    }
    free(embedding);
    const struct tr_tensor *in = &g->tensors[g->inputs[0]];
    p->sequence_model = in->dtype == TR_I32 && in->ndim == 2;
    p->tokens_per_sample = p->sequence_model ? in->shape[1] : 1;
}

static int find_hardware(struct tr_plan *p, struct tr_config *cfg, const char *name, tr_err *err)
{
    if (!*name)
        return TR_OK;
    if (tr_hardware_lookup(name, &p->hardware, err) == TR_OK)
        return TR_OK;
    struct tr_origin o = {TR_FROM_RECIPE, tr_recipe_path(cfg->recipe), 0};
    tr_recipe_origin(cfg->recipe, "cost.hardware", &o);
    char where[600];
    tr_origin_format(&o, where, sizeof where);
    tr_err_prefix(err, "%s: cost", where);
    return TR_ERROR;
}

/* Peak FLOP/s of one device for the GEMM dtype the backends will run. */
static void choose_peak(struct tr_plan *p)
{
    struct tr_precision_policy pol = {.struct_size = sizeof pol, .compute = p->compute,
                                      .allow_tf32 = p->tf32};
    double tflops = tr_precision_peak_tflops(p->hardware, &pol, &p->peak_kind);
    if (p->cost.peak_tflops > 0)
        tflops = p->cost.peak_tflops;
    p->peak_flops = tflops * 1e12;
}

void tr_plan_scale_step(struct tr_plan_scale *s, const struct tr_hardware *hw, int64_t devices,
                        double flops_per_step, double peak_flops, double mfu, double gradient_bytes,
                        double bucket_bytes)
{
    memset(s, 0, sizeof *s);
    s->devices = devices;
    s->nodes = hw->devices_per_node > 0 ? (devices + hw->devices_per_node - 1) / hw->devices_per_node : 1;
    s->link = tr_hardware_ring_link(hw, devices);
    if (peak_flops > 0 && mfu > 0)
        s->compute_seconds = flops_per_step / ((double)devices * peak_flops * mfu);
    if (devices > 1 && gradient_bytes > 0) {
        s->buckets = bucket_bytes > 0 ? (int64_t)ceil(gradient_bytes / bucket_bytes) : 1;
        double n = (double)s->buckets;
        s->bucket_seconds = tr_ring_allreduce_seconds(gradient_bytes / n, devices, &s->link);
        s->allreduce_seconds = n * s->bucket_seconds;
        /* bucket k of n is ready k/n of the way through backward and the
         * buckets go out one at a time: the last one always shows, and when
         * the ring is slower than backward the queue shows too */
        double backward = BACKWARD_SHARE * s->compute_seconds;
        s->exposed_seconds = fmax(s->bucket_seconds, s->allreduce_seconds - backward * (n - 1) / n);
    }
    s->step_seconds = s->compute_seconds + s->exposed_seconds;
    s->efficiency = s->step_seconds > 0 ? s->compute_seconds / s->step_seconds : 1;
}

/* The same run on count, count/2, ... 1 devices, and the count to suggest. */
static void project_scaling(struct tr_plan *p)
{
    double price = p->cost.spot ? p->spot_price : p->price;
    int k = 0;
    for (int64_t n = p->cost.count; n >= 1 && k < (int)TR_ARRAY_LEN(p->scale); n /= 2, k++) {
        struct tr_plan_scale *s = &p->scale[k];
        tr_plan_scale_step(s, p->hardware, n, p->flops_per_step, p->peak_flops, p->cost.mfu,
                           p->gradient_bytes, p->bucket_bytes);
        s->hours = (double)p->steps * s->step_seconds / 3600.0;
        s->dollars = (double)n * s->hours * price;
        s->even = p->batch % (n * p->micro_batch) == 0;
    }
    p->n_scale = k;
    double cheapest = p->scale[0].dollars;
    for (int i = 1; i < k; i++)
        cheapest = fmin(cheapest, p->scale[i].dollars);
    for (int i = k - 1; i >= 0; i--) /* the most devices within reach of the cheapest */
        if (p->scale[i].dollars <= CHEAP_ENOUGH * cheapest)
            p->suggested = i;
}

static void project(struct tr_plan *p)
{
    const struct tr_hardware *hw = p->hardware;
    double count = (double)p->cost.count;
    choose_peak(p);
    p->price = p->cost.price >= 0 ? p->cost.price : hw->price_hour;
    p->spot_price = p->cost.spot_price >= 0 ? p->cost.spot_price : hw->spot_price_hour;
    if (p->peak_flops <= 0)
        return; /* time and money need a peak (cost.peak_tflops for cpu) */
    /* a step is its compute plus the all-reduce backward does not hide */
    project_scaling(p);
    const struct tr_plan_scale *at = &p->scale[0];
    p->allreduce_seconds = at->allreduce_seconds;
    p->hours = (double)p->steps * at->step_seconds / 3600.0;
    p->dollars = count * p->hours * p->price;
    p->spot_dollars = count * p->hours * p->spot_price;
    p->optimal_hours = p->optimal_steps * at->step_seconds / 3600.0;
    p->optimal_dollars = count * p->optimal_hours * p->price;
    p->optimal_spot_dollars = count * p->optimal_hours * p->spot_price;
}

/* cost: the recipe's cost section as the configuration parsed it (the
 * hardware named, a peak that is 0 or usable); the tree is not read again. */
static int plan_cost(struct tr_plan *p, struct tr_config *cfg, tr_err *err)
{
    p->cost = cfg->cost;
    if (find_hardware(p, cfg, p->cost.hardware, err) != TR_OK)
        return TR_ERROR;
    if (p->cost.peak_tflops > 0 && p->cost.peak_tflops < 1e-3) {
        /* 0 means "the hardware table's"; a tiny peak only makes every time infinite */
        struct tr_origin o = {TR_FROM_RECIPE, tr_recipe_path(cfg->recipe), 0};
        tr_recipe_origin(cfg->recipe, "cost.peak_tflops", &o);
        char where[600];
        tr_origin_format(&o, where, sizeof where);
        return tr_fail(err, "%s: cost: option 'peak_tflops' is %g, must be 0 (the hardware "
                       "table's) or at least 0.001", where, p->cost.peak_tflops);
    }
    p->cost.hardware = p->hardware ? p->hardware->name : ""; /* the tree's string goes with cfg */
    return TR_OK;
}

/* Shard level `level`'s memory per device on `devices` devices: the
 * measured plan with everything whole, then as the level cuts it (fit.c). */
static double level_bytes(const struct tr_fit_model *fm, const struct tr_graph *g, int level,
                          int64_t devices)
{
    struct tr_fit_model f = *fm;
    f.shard_world = level != TR_SHARD_NONE && devices > 1 ? (int)devices : 1;
    f.level = (enum tr_shard_level)level;
    struct tr_memory_report m = g->memory;
    m.grads = g->n_params * sizeof(float);
    m.params = (g->n_params + g->n_buffers) * sizeof(float);
    m.param_copies = fm->other_device ? 0 : tr_be_param_copy_bytes(fm->be, g);
    m.optimizer = (size_t)fm->optimizer_slots * m.grads;
    tr_fit_adjust(&f, g, &m);
    return (double)tr_graph_memory_total(&m);
}

/* Each shard level's memory per device on cost.count devices and the
 * smallest level that fits; for each sharded level the fewest devices it
 * fits on (doubling, then halving the gap: memory per device only falls
 * as devices are added), 0 where even 4096 do not do. */
static void plan_levels(struct tr_plan *p, const struct tr_fit_model *fm, const struct tr_graph *g)
{
    p->level_fits_first = -1;
    for (int level = TR_SHARD_NONE; level <= TR_SHARD_PARAMETERS; level++) {
        p->level_total[level] = level_bytes(fm, g, level, p->cost.count);
        /* offload on several devices needs a shard level (run_config.c) */
        int runs = level != TR_SHARD_NONE || !fm->offload || p->cost.count < 2;
        if (runs && p->level_fits_first < 0 && p->level_total[level] <= p->usable_bytes)
            p->level_fits_first = level;
        int64_t hi = 1;
        while (hi <= 4096 && level_bytes(fm, g, level, hi) > p->usable_bytes)
            hi *= 2;
        if (hi > 4096) {
            p->level_devices[level] = 0;
            continue;
        }
        int64_t lo = hi / 2; /* does not fit (or 0) */
        while (hi - lo > 1) {
            int64_t mid = lo + (hi - lo) / 2;
            if (level_bytes(fm, g, level, mid) <= p->usable_bytes)
                hi = mid;
            else
                lo = mid;
        }
        p->level_devices[level] = level == TR_SHARD_NONE && hi > 1 ? 0 : hi;
    }
}

/* Memory: the session's measured plan at the micro-batch, its growth per
 * sample (measured again at twice the micro-batch: activations are linear
 * in it, the rest is fixed), and whether and at which micro-batch it fits
 * the device (fit.h: the same search micro_batch = "auto" makes). */
static int plan_memory(struct tr_plan *p, const struct tr_session *s, tr_err *err)
{
    struct tr_fit_model fm = tr_session_fit_model(s);
    struct tr_memory_report twice;
    size_t total2, fit_bytes;
    p->memory = s->g->memory;
    p->frozen_bytes = (double)s->g->memory.frozen;
    p->quantized_bytes = (double)s->g->memory.quantized;
    p->lora_rank = s->cfg->lora.enabled ? s->cfg->lora.rank : 0;
    p->memory_total = (double)tr_graph_memory_total(&s->g->memory);
    p->host_bytes = (double)tr_fit_host_bytes(&fm, s->g->n_params);
    if (fm.offload) { /* the host bytes by 4-byte slot: state, master copy, gradients */
        double slot = p->host_bytes / (fm.optimizer_slots + 1 + (fm.offload_overlap ? 1 : 0));
        p->offloaded_bytes = slot * fm.optimizer_slots;
        p->host_grad_bytes = fm.offload_overlap ? slot : 0;
    }
    if (tr_fit_measure(&fm, 2 * p->micro_batch, &twice, &total2, err) != TR_OK)
        return TR_ERROR;
    p->bytes_per_sample = ((double)total2 - p->memory_total) / (double)p->micro_batch;
    p->fixed_bytes = p->memory_total - p->bytes_per_sample * (double)p->micro_batch;
    p->forward_bytes = (double)tr_graph_measure_forward(s->g, &s->be);
    p->device_bytes = s->device.bytes;
    snprintf(p->device, sizeof p->device, "%s", s->device.what);
    p->usable_bytes = s->device.usable;
    p->fits = p->memory_total <= p->usable_bytes;
    plan_levels(p, &fm, s->g);
    /* the search micro_batch = "auto" makes (under stages: the largest
     * stage's fit, over a replica's share of the batch) */
    struct tr_fit_model search = tr_session_fit_search(s, &p->search_samples);
    if (s->cfg->train.auto_micro_batch) /* the session searched already: tr_plan_build */
        return TR_OK;
    struct tr_memory_report at;
    return tr_fit_largest(&search, p->search_samples, p->usable_bytes, &p->max_micro_batch, &at,
                          &fit_bytes, err);
}

/* Pipeline stages: the cut (pipeline.h), each stage's share of the FLOPs
 * and its memory, and the bubble of the schedule, in theory and played
 * with the stages' FLOPs as their times (forward a third, backward two).
 * A stage's memory: its share of the parameters, gradients and optimizer
 * state (as the plan keeps them per parameter), the activations kept for
 * backward of each micro-batch it holds in flight (the plan's, in the
 * stage's share of the FLOPs), and one micro-batch's transients (activation
 * gradients, scratch, recompute) in that share, an estimate. */
static int plan_pipeline(struct tr_plan *p, const struct tr_session *s, tr_err *err)
{
    const struct tr_parallel_config *par = &s->cfg->parallel;
    struct tr_plan_pipe *pp = &p->pipe;
    int P = (int)par->pipeline, V = (int)par->virtual_stages;
    if (P * V > 64)
        return tr_fail(err, "parallel.pipeline x virtual_stages = %d: plan shows up to 64 chunks",
                       P * V);
    pp->stages = P;
    pp->virtual_stages = V;
    pp->kind = par->schedule_kind;
    pp->devices_assumed = p->cost.count < P;
    if (!pp->devices_assumed && p->cost.count % P != 0)
        return tr_fail(err, "gpus=%lld (cost.count) is not a multiple of parallel.pipeline = %d: "
                       "each data-parallel replica needs %d devices", (long long)p->cost.count, P, P);
    pp->replicas = pp->devices_assumed ? 1 : (int)(p->cost.count / P);
    pp->micro_batches = tr_pipe_step_micro_batches(p->batch, p->micro_batch, pp->replicas,
                                                   par->micro_batches);
    if (pp->kind == TR_PIPE_INTERLEAVED && pp->micro_batches % P != 0)
        return tr_fail(err, "the interleaved schedule needs micro-batches a multiple of the %d "
                       "stages, and a step has %d (set parallel.micro_batches)", P,
                       pp->micro_batches);
    int C = P * V;
    struct tr_pipe_chunk chunk[64];
    if (tr_pipe_partition(s->g, C, chunk, err) != TR_OK)
        return TR_ERROR;
    double fw[64], bw[64];
    for (int c = 0; c < C; c++) {
        fw[c] = chunk[c].flops / 3;
        bw[c] = 2 * chunk[c].flops / 3;
    }
    struct tr_pipe_sim sim;
    if (tr_pipe_simulate(pp->kind, P, V, pp->micro_batches, fw, bw, &sim, err) != TR_OK)
        return TR_ERROR;
    pp->bubble_theory = tr_pipe_bubble_theory(pp->kind, P, V, pp->micro_batches);
    pp->bubble_simulated = sim.bubble;
    double all_params = 0;
    for (int c = 0; c < C; c++)
        all_params += chunk[c].param_floats;
    /* shard = "optimizer" or "gradients" with replicas: a stage's state
     * (and gradients) are cut over them (the plan's rows are already:
     * tr_session_fit_model) */
    pp->state_parted = (par->shard_level == TR_SHARD_OPTIMIZER ||
                        par->shard_level == TR_SHARD_GRADIENTS) && pp->replicas > 1;
    double bytes[64], in_flight[64], share[64];
    pp->largest = tr_pipe_stage_memory(s->g, chunk, pp->kind, P, V, pp->micro_batches, bytes,
                                       in_flight, share, err);
    if (pp->largest < 0)
        return TR_ERROR;
    for (int st = 0; st < P; st++) {
        struct tr_plan_stage *g = &pp->stage[st];
        g->first_block = g->last_block = -1;
        for (int c = st; c < C; c += P) {
            g->params += chunk[c].param_floats;
            g->has_embedding |= chunk[c].has_embedding;
            g->has_head |= chunk[c].has_head;
            if (chunk[c].first_block >= 0 && (g->first_block < 0 || chunk[c].first_block < g->first_block))
                g->first_block = chunk[c].first_block;
            if (chunk[c].last_block > g->last_block)
                g->last_block = chunk[c].last_block;
            g->block_from[g->chunks] = chunk[c].first_block;
            g->block_to[g->chunks] = chunk[c].last_block;
            g->chunks++;
        }
        g->flops_share = share[st];
        g->in_flight = in_flight[st];
        g->bytes = bytes[st];
    }
    /* a device holds one stage: the largest decides whether the run fits */
    p->fits = bytes[pp->largest] <= p->usable_bytes;
    /* offloaded: each stage's host keeps its own parameters' state, the
     * largest stage's is the line to provision for */
    double largest = 0;
    for (int st = 0; st < P; st++)
        largest = pp->stage[st].params > largest ? pp->stage[st].params : largest;
    if (p->host_bytes > 0 && all_params > 0) {
        double f = largest / (double)s->g->n_params;
        p->host_bytes *= f;
        p->offloaded_bytes *= f;
        p->host_grad_bytes *= f;
        p->host_stage = 1;
    }
    return TR_OK;
}

/* Steps, tokens and FLOPs of the recipe's run, and the compute-optimal ones. */
static void plan_length(struct tr_plan *p, const struct tr_session *s)
{
    const struct tr_config *cfg = s->cfg;
    p->flops_per_token = tr_graph_flops_per_token(s->g);
    p->length_from = cfg->train.length_from;
    p->length_value = p->length_from == TR_LENGTH_TOKENS ? cfg->train.tokens : cfg->train.epochs;
    p->time_limit = cfg->train.time;
    p->steps = p->length_from == TR_LENGTH_TIME ? 0 : cfg->train.steps;
    p->tokens_per_step = (double)p->batch * (double)p->tokens_per_sample;
    p->flops_per_step = p->flops_per_token * p->tokens_per_step;
    p->tokens = (double)p->steps * p->tokens_per_step;
    p->flops = (double)p->steps * p->flops_per_step;
    p->optimal_tokens = TOKENS_PER_PARAM * (double)p->params;
    p->optimal_flops = p->flops_per_token * p->optimal_tokens;
    p->optimal_steps = p->optimal_tokens / p->tokens_per_step;
    p->trained_factor = p->tokens / p->optimal_tokens;
    p->gradient_bytes = (double)p->params * (double)dtype_bytes(p->grad);
    p->bucket_bytes = cfg->parallel.bucket_mb * 1024 * 1024;
    p->shard_level = (int)cfg->parallel.shard_level;
    p->cpu_ranks = strcmp(cfg->device, "cpu") == 0 && cfg->parallel.gpus == 0 &&
                   !(p->hardware && strcmp(p->hardware->name, "cpu") != 0);
}

/* The plan is a client of the session (session.h) in plan mode: the
 * recipe's graph measured on the CPU backend, nothing allocated, only the
 * precision plugin created (and the data source when train.epochs needs
 * its sample count). */
int tr_plan_build(struct tr_plan *p, const char *recipe, const char *const *overrides,
                  int n_overrides, tr_err *err)
{
    memset(p, 0, sizeof *p);
    struct tr_config cfg;
    struct tr_session s;
    memset(&s, 0, sizeof s);
    int rc = TR_ERROR;
    if (tr_config_load(&cfg, recipe, overrides, n_overrides, err) != TR_OK ||
        plan_cost(p, &cfg, err) != TR_OK)
        goto out;
    p->recipe = tr_xstrdup(recipe);
    p->name = tr_xstrdup(cfg.name);
    p->precision = tr_xstrdup(cfg.precision.plugin->info->name);
    p->batch = cfg.train.batch;
    p->lr = cfg.optimizer.lr;
    if (tr_session_open(&s, &cfg, TR_SESSION_PLAN, err) != TR_OK)
        goto out;
    p->micro_batch = s.micro_batch;
    count_model(p, s.g);
    p->compute = s.policy.compute;
    p->grad = s.policy.grad;
    p->tf32 = s.policy.allow_tf32 && s.policy.compute == TR_F32;
    if (plan_memory(p, &s, err) != TR_OK)
        goto out;
    plan_length(p, &s);
    if (cfg.parallel.pipeline > 1 && plan_pipeline(p, &s, err) != TR_OK)
        goto out;
    /* micro_batch = "auto": the session's pick, where it fits (under stages
     * plan_pipeline decided that) */
    if (cfg.train.auto_micro_batch)
        p->max_micro_batch = p->fits ? p->micro_batch : 0;
    if (p->hardware)
        project(p);
    if (p->hardware && p->length_from == TR_LENGTH_TIME && p->scale[0].step_seconds > 0) {
        /* train.time alone: the steps that fit in it at the estimated step time */
        p->steps = (int64_t)floor(p->time_limit / p->scale[0].step_seconds);
        p->tokens = (double)p->steps * p->tokens_per_step;
        p->flops = (double)p->steps * p->flops_per_step;
        p->trained_factor = p->tokens / p->optimal_tokens;
        project(p);
    }
    rc = TR_OK;
out:
    tr_session_close(&s);
    tr_config_free(&cfg);
    if (rc != TR_OK)
        tr_plan_free(p);
    return rc;
}

void tr_plan_free(struct tr_plan *p)
{
    free(p->recipe);
    free(p->name);
    free(p->precision);
    memset(p, 0, sizeof *p);
}

/* ---- the command -------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out, "usage: trainrun plan RECIPE.lua [key.sub=value ...] [gpus=N]\n"
                 "  memory, FLOPs, time and cost of a recipe, without running it.\n"
                 "  gpus=N is cost.count=N; pick the device with cost.hardware=NAME.\n"
                 "  hardware:");
    for (size_t i = 0; i < tr_hardware_count(); i++)
        fprintf(out, " %s", tr_hardware_at(i)->name);
    fprintf(out, "\n");
}

int tr_plan_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? TR_EXIT_USAGE : TR_EXIT_OK;
    }
    const char **overrides = tr_xcalloc((size_t)argc, sizeof *overrides);
    char **owned = tr_xcalloc((size_t)argc, sizeof *owned);
    int n = 0, code = TR_EXIT_OK, gpus = 0;
    for (int i = 2; i < argc && code == TR_EXIT_OK; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "gpus=", 5) == 0) {
            gpus = 1;
            owned[n] = tr_xasprintf("cost.count=%s", arg + 5);
            overrides[n] = owned[n];
            n++;
        } else if (arg[0] != '-' && strchr(arg, '=')) {
            overrides[n++] = arg;
        } else {
            fprintf(stderr, "trainrun: error: plan: '%s' is not an override (key.sub=value or gpus=N)\n",
                    arg);
            usage(stderr);
            code = TR_EXIT_USAGE;
        }
    }
    if (code == TR_EXIT_OK) {
        struct tr_plan plan;
        tr_err err = {{0}};
        if (tr_plan_build(&plan, argv[1], overrides, n, &err) != TR_OK) {
            /* the user typed gpus=N: say which key it became */
            int via_gpus = gpus && strstr(err.msg, "command line: cost: option 'count'");
            fprintf(stderr, "trainrun: error: %s%s\n", err.msg,
                    via_gpus ? " (gpus=N sets cost.count)" : "");
            code = TR_EXIT_ERROR;
        } else {
            tr_plan_print(&plan, stdout);
            fflush(stdout);
            tr_plan_free(&plan);
        }
    }
    for (int i = 0; i < n; i++)
        free(owned[i]);
    free(owned);
    free(overrides);
    return code;
}
