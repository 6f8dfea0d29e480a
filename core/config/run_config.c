/*
 * The run's configuration from its recipe (run_config.h): the core's own
 * schemas, the order in which a recipe is resolved into them, and the
 * plugins' creation and release.  The slots and loggers are run_slots.c's,
 * the train section's length and batch run_train.c's, the install paths
 * and ranks run_env.c's.
 */
#include "run_config.h"

#include "config_help.h"
#include "hardware.h"
#include "hf_config.h"
#include "optimizers.h"
#include "options.h"
#include "run_parts.h"
#include "../util/suggest.h"
#include "../util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the core's own schemas -------------------------------------------- */

#define OPT(type, name, def, lo, hi, help, st, field)                                              \
    {type, name, def, lo, hi, NULL, help, offsetof(st, field)}

static const struct tr_option train_options[] = {
    OPT(TR_OPT_INT, "steps", "1000", 1, STEPS_MAX,
        "optimizer steps to run (or set one of tokens and epochs instead)", struct tr_train_config, steps),
    OPT(TR_OPT_FLOAT, "tokens", "0", 0, TOKENS_MAX,
        "train on this many tokens instead: steps = ceil(tokens / (batch x sequence length)); "
        "\"2B\", \"500M\", \"12k\", \"1T\" or a number (0: not set)", struct tr_train_config, tokens),
    OPT(TR_OPT_FLOAT, "epochs", "0", 0, 1000000,
        "passes over the training split instead of steps (fractions allowed): steps = "
        "ceil(epochs x micro-batches per epoch / micro-batches per step) (0: not set)",
        struct tr_train_config, epochs),
    OPT(TR_OPT_FLOAT, "time", "0", 0, TIME_MAX,
        "wall-clock limit of this process's training, \"90s\", \"45m\", \"1.5h\", \"2d\" or "
        "seconds: the run stops with a checkpoint when it is reached (0: none); alone, it sets "
        "the length and the schedule sees no end", struct tr_train_config, time),
    OPT(TR_OPT_INT, "batch", "16", 1, BATCH_MAX,
        "global batch in samples per optimizer step", struct tr_train_config, batch),
    OPT(TR_OPT_INT, "micro_batch", "0", 0, BATCH_MAX,
        "samples per forward/backward; batch / micro_batch micro-batches are accumulated "
        "(0: the whole batch at once, or each rank's even share of it; \"auto\": the largest "
        "that fits memory_budget; under parallel.pipeline, whose largest stage fits)",
        struct tr_train_config, micro_batch),
    OPT(TR_OPT_FLOAT, "memory_budget", "0", 0, 1048576,
        "GiB a micro_batch = \"auto\" may plan for (0: the device's memory, from cost.hardware, "
        "or this machine's)", struct tr_train_config, memory_budget),
    OPT(TR_OPT_INT, "seed", "1", 0, SEED_MAX, "seed of initialisation and data order",
        struct tr_train_config, seed),
    OPT(TR_OPT_INT, "eval_every", "0", 0, STEPS_MAX,
        "evaluate on the validation split every N steps (0: only at the end)", struct tr_train_config, eval_every),
    OPT(TR_OPT_INT, "eval_batches", "8", 1, 1000000, "micro-batches per evaluation",
        struct tr_train_config, eval_batches),
    OPT(TR_OPT_INT, "log_every", "10", 1, STEPS_MAX, "progress line and metrics every N steps",
        struct tr_train_config, log_every),
    OPT(TR_OPT_INT, "threads", "0", 0, 4096, "compute threads (0: one per core)",
        struct tr_train_config, threads),
    OPT(TR_OPT_INT, "workers", "1", 0, 64,
        "data loader threads (0: read in the step loop)", struct tr_train_config, workers),
    OPT(TR_OPT_INT, "prefetch", "4", 1, 1024, "micro-batches the loader prepares ahead",
        struct tr_train_config, prefetch),
    OPT(TR_OPT_INT, "trace_every", "100", 0, STEPS_MAX,
        "run_dir/trace.json (chrome://tracing, Perfetto) gets every step's phases and, every N "
        "steps, each op's forward and backward time (0: no trace)",
        struct tr_train_config, trace_every),
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

/* optimizer = { ... } is three schemas: the rule, each rule's own options
 * (optimizers.c describes them with the optimizer that reads them), and
 * what the step does whatever the rule: the lr's scaling and the gradient
 * clipping before the update (engine/run.c). */
static const struct tr_option optimizer_type[] = {
    {TR_OPT_ENUM, "type", "adamw", 0, 0, tr_optimizer_names,
     "the update rule (sgd: with momentum); the fields below say which rule reads them",
     offsetof(struct tr_optimizer_config, type)},
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};
static const struct tr_option optimizer_step_options[] = {
    OPT(TR_OPT_INT, "reference_batch", "0", 0, BATCH_MAX,
        "the batch lr was tuned for: lr is scaled by train.batch / reference_batch (the linear "
        "scaling rule; 0: no scaling)", struct tr_optimizer_config, reference_batch),
    OPT(TR_OPT_FLOAT, "clip", "1.0", 0, TR_NO_MAX,
        "clip gradients to this global L2 norm (0: no clipping)", struct tr_optimizer_config, clip),
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

/* The three, in that order, into uses[3] for cfg's optimizer section;
 * rules[] holds the optimizers' options. */
static void optimizer_schemas(struct tr_schema_use uses[3], struct tr_option *rules,
                              struct tr_optimizer_config *c)
{
    if (tr_optimizer_options(rules, TR_OPTIMIZER_MAX_OPTIONS + 1) < 0)
        abort(); /* more options than TR_OPTIMIZER_MAX_OPTIONS: raise it */
    uses[0] = (struct tr_schema_use){optimizer_type, c};
    uses[1] = (struct tr_schema_use){rules, c};
    uses[2] = (struct tr_schema_use){optimizer_step_options, c};
}

static const char *const weight_dtypes[] = {"fp32", "bf16", "fp16", NULL};
static const struct tr_option checkpoint_policy_options[] = {
    OPT(TR_OPT_INT, "every", "0", 0, STEPS_MAX, "save every N steps (0: only at the end)",
        struct tr_checkpoint_policy, every),
    OPT(TR_OPT_INT, "keep", "3", 1, 10000, "checkpoints kept, newest first (plus the best)",
        struct tr_checkpoint_policy, keep),
    OPT(TR_OPT_BOOL, "keep_best", "true", 0, 0,
        "also save and keep the checkpoint of the lowest validation loss",
        struct tr_checkpoint_policy, keep_best),
    OPT(TR_OPT_BOOL, "async", "true", 0, 0,
        "write in a background thread; the step loop stalls only for a snapshot",
        struct tr_checkpoint_policy, async),
    OPT(TR_OPT_FLOAT, "deadline", "120", 0, 604800,
        "seconds a preemption checkpoint (SIGTERM, SIGUSR1) should take; warns when exceeded",
        struct tr_checkpoint_policy, deadline),
    {TR_OPT_ENUM, "weights_dtype", "fp32", 0, 0, weight_dtypes,
     "dtype of model.safetensors; bf16/fp16 halve it, but resuming from it is not bit-exact",
     offsetof(struct tr_checkpoint_policy, weights_dtype)},
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

static const struct tr_option early_stop_options[] = {
    OPT(TR_OPT_INT, "patience", "0", 0, 1000000,
        "stop after this many evaluations without improvement (0: never stop early)",
        struct tr_early_stop_config, patience),
    OPT(TR_OPT_FLOAT, "min_delta", "0", 0, TR_NO_MAX,
        "an evaluation improves when the validation loss falls by more than this",
        struct tr_early_stop_config, min_delta),
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

struct root_config {
    const char *name, *run_dir, *device;
    int64_t procs, gpus;
};
static const char *const devices[] = {"cpu", "cuda", NULL};
static const struct tr_option root_options[] = {
    {TR_OPT_STRING, "name", "", 0, 0, NULL, "run name (default: the recipe's file name)",
     offsetof(struct root_config, name)},
    {TR_OPT_STRING, "run_dir", "", 0, 0, NULL,
     "where metrics and checkpoints go (default: runs/<name>)", offsetof(struct root_config, run_dir)},
    {TR_OPT_ENUM, "device", "cpu", 0, 0, devices,
     "where the math runs: cpu, or cuda (needs the CUDA backend module and a GPU)",
     offsetof(struct root_config, device)},
    {TR_OPT_INT, "procs", "1", 1, 1024, NULL,
     "CPU ranks to start on this node, each training on its share of every batch",
     offsetof(struct root_config, procs)},
    {TR_OPT_INT, "gpus", "0", 0, 1024, NULL,
     "GPU ranks to start on this node (one per GPU; implies device=cuda)",
     offsetof(struct root_config, gpus)},
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

/* by enum tr_shard_level */
const char *const tr_shard_levels[] = {"none", "optimizer", "gradients", "parameters", NULL};
/* by enum tr_pipe_kind */
const char *const tr_pipe_kinds[] = {"gpipe", "1f1b", "interleaved", NULL};
const char *const tr_offload_kinds[] = {"none", "optimizer", NULL};

static const struct tr_option parallel_options[] = {
    OPT(TR_OPT_FLOAT, "bucket_mb", "25", 0.01, 4096,
        "gradients are all-reduced in buckets of this many MiB, each as soon as backward has "
        "finished it", struct tr_parallel_config, bucket_mb),
    OPT(TR_OPT_BOOL, "zero", "false", 0, 0,
        "the alias of shard = \"optimizer\" (ZeRO-1)", struct tr_parallel_config, zero),
    {TR_OPT_ENUM, "shard", "none", 0, 0, tr_shard_levels,
     "what each rank keeps only 1/world of: none; optimizer (ZeRO-1: its state); gradients "
     "(ZeRO-2: also the summed gradients, reduce-scattered in buckets as backward makes them); "
     "parameters (ZeRO-3: also the parameters, each unit gathered just before the nodes that "
     "read it and discarded after); with pipeline stages, optimizer or gradients, each "
     "stage's state (and gradients) cut over its data-parallel replicas",
     offsetof(struct tr_parallel_config, shard)},
    OPT(TR_OPT_INT, "pipeline", "1", 1, 1024,
        "pipeline stages the model is cut into at block boundaries, one a rank (procs = "
        "pipeline x data-parallel replicas); trainrun plan prints the partition, each stage's "
        "memory and the bubble",
        struct tr_parallel_config, pipeline),
    {TR_OPT_ENUM, "schedule", "1f1b", 0, 0, tr_pipe_kinds,
     "the pipeline's order of micro-batches: gpipe (all forwards, then all backwards), 1f1b "
     "(one forward, one backward: at most `pipeline` micro-batches in flight), interleaved "
     "(1f1b over virtual_stages chunks a stage: a smaller bubble)",
     offsetof(struct tr_parallel_config, schedule)},
    OPT(TR_OPT_INT, "virtual_stages", "1", 1, 64,
        "model chunks per pipeline stage (schedule = \"interleaved\")", struct tr_parallel_config,
        virtual_stages),
    OPT(TR_OPT_INT, "micro_batches", "0", 0, 1 << 20,
        "micro-batches a step sends through the pipeline (0: batch / micro_batch / data-parallel "
        "replicas)", struct tr_parallel_config, micro_batches),
    {TR_OPT_ENUM, "offload", "none", 0, 0, tr_offload_kinds,
     "none; optimizer: the optimizer's state and an fp32 master copy of the parameters stay "
     "in host memory and the CPU backend updates them (gradients down, parameters up, in "
     "chunks): AdamW's 8 bytes a parameter off the device, 12 on the host, for GPUs short of "
     "memory; needs a device other than cpu; with several ranks, a shard level (each rank "
     "keeps its parts of the state on its host) or pipeline stages of one replica (each its "
     "stage's) (docs/scale-out.md)",
     offsetof(struct tr_parallel_config, offload)},
    OPT(TR_OPT_FLOAT, "offload_chunk_mb", "4", 0.001, 1024,
        "offload = \"optimizer\" moves gradients down and parameters up in chunks of this "
        "many MiB, two in flight: larger chunks, fewer transfers; smaller, less pinned host "
        "memory", struct tr_parallel_config, offload_chunk_mb),
    OPT(TR_OPT_BOOL, "offload_overlap", "true", 0, 0,
        "offload = \"optimizer\": the host's update of a step runs while the next forward "
        "starts, each layer waiting only for its own parameters (with a shard level: for "
        "their all-gather, which follows the update unit by unit) (4 more host bytes a "
        "parameter of the state's: the gradients); false: the update ends within the step",
        struct tr_parallel_config, offload_overlap),
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

/* parallel.shard and its alias parallel.zero as one level. */
static int resolve_shard(struct tr_config *cfg, struct tr_value *root, tr_err *err)
{
    struct tr_parallel_config *p = &cfg->parallel;
    const struct tr_value *v = tr_value_child(tr_value_child(root, "parallel"), "shard");
    char where[256] = "";
    if (v)
        tr_origin_format(&v->origin, where, sizeof where);
    enum tr_shard_level level = TR_SHARD_NONE;
    for (int k = 0; tr_shard_levels[k]; k++)
        if (strcmp(p->shard, tr_shard_levels[k]) == 0)
            level = (enum tr_shard_level)k;
    if (p->zero && level > TR_SHARD_OPTIMIZER)
        return tr_fail(err, "%s: parallel.zero = true means shard = \"optimizer\", but shard is "
                       "\"%s\": drop parallel.zero (shard = \"%s\" shards the optimizer state "
                       "too)", where, p->shard, p->shard);
    p->shard_level = p->zero && level == TR_SHARD_NONE ? TR_SHARD_OPTIMIZER : level;
    return TR_OK;
}

/* "recipe.lua:4" of parallel.offload in root, or "" */
static void offload_where(const struct tr_value *root, char *where, size_t size)
{
    const struct tr_value *v = tr_value_child(tr_value_child(root, "parallel"), "offload");
    where[0] = '\0';
    if (v)
        tr_origin_format(&v->origin, where, size);
}

/* Several ranks offloading: each must keep a part of the state of its own,
 * a shard level's or a pipeline stage's (one replica: ranks = stages);
 * replicas each keeping the whole state (or their stage's) are refused. */
static int offload_ranks_check(const struct tr_parallel_config *p, const char *where, int world,
                               tr_err *err)
{
    if (world <= 1 || p->shard_level != TR_SHARD_NONE || world == p->pipeline)
        return TR_OK;
    if (p->pipeline > 1)
        return tr_fail(err, "%s: parallel.offload = \"optimizer\" with pipeline = %lld on %d "
                       "ranks: each of the %lld data-parallel replicas would keep its stages' "
                       "optimizer state and master copy on the host (a shard level inside "
                       "stages is not supported yet); run %lld ranks (one replica), or drop the "
                       "offload", where, (long long)p->pipeline, world,
                       (long long)(world / p->pipeline), (long long)p->pipeline);
    return tr_fail(err, "%s: parallel.offload = \"optimizer\" with %d ranks needs a shard "
                   "level: without one every rank would keep the whole optimizer state and its "
                   "master copy on the host; add parallel.shard = \"optimizer\" (or "
                   "\"gradients\", \"parameters\") so that each keeps its parts, or run in "
                   "one process", where, world);
}

/* parallel.offload.  The device and the ranks are checked once they are
 * known (offload_ranks, tr_config_check_offload). */
static void resolve_offload(struct tr_config *cfg)
{
    cfg->parallel.offload_optimizer = strcmp(cfg->parallel.offload, "optimizer") == 0;
}

/* parallel.offload with the ranks this node would start (procs, gpus:
 * configure_run): refused before any starts.  A job launched from outside
 * is refused by each rank's session (tr_config_check_offload). */
static int offload_ranks(const struct tr_config *cfg, struct tr_value *root, tr_err *err)
{
    const struct tr_parallel_config *p = &cfg->parallel;
    int64_t ranks = p->gpus > p->procs ? p->gpus : p->procs;
    if (!p->offload_optimizer)
        return TR_OK;
    char where[256];
    offload_where(root, where, sizeof where);
    return offload_ranks_check(p, where, (int)ranks, err);
}

int64_t tr_config_ranks(const struct tr_config *cfg)
{
    return cfg->rank.world > 1 ? cfg->rank.world
           : cfg->parallel.gpus > 0 ? cfg->parallel.gpus : cfg->parallel.procs;
}

int tr_config_check_offload(const struct tr_config *cfg, int planning, int world, tr_err *err)
{
    if (!cfg->parallel.offload_optimizer)
        return TR_OK;
    char where[256];
    offload_where(tr_recipe_root(cfg->recipe), where, sizeof where);
    if (offload_ranks_check(&cfg->parallel, where, world, err) != TR_OK)
        return TR_ERROR;
    /* a plan for a hardware profile plans for that device, whatever this
     * machine's device is */
    const char *hw = cfg->cost.hardware;
    if (planning && hw && *hw && strcmp(hw, "cpu") != 0)
        return TR_OK;
    if (strcmp(cfg->device, "cpu") != 0)
        return TR_OK;
    return tr_fail(err, "%s: parallel.offload = \"optimizer\" on device = \"cpu\": nothing to "
                   "offload to: the optimizer state is in host memory already; drop it, or run "
                   "on a GPU (device = \"cuda\")%s", where,
                   planning ? " or plan for one (cost.hardware)" : "");
}

/* parallel.schedule as a kind, and what it needs: virtual stages only when
 * interleaved, and there a micro-batch count the stages divide. */
static int resolve_pipeline(struct tr_config *cfg, struct tr_value *root, tr_err *err)
{
    struct tr_parallel_config *p = &cfg->parallel;
    const struct tr_value *par = tr_value_child(root, "parallel");
    for (int k = 0; tr_pipe_kinds[k]; k++)
        if (strcmp(p->schedule, tr_pipe_kinds[k]) == 0)
            p->schedule_kind = (enum tr_pipe_kind)k;
    char where[256] = "";
    const struct tr_value *v = tr_value_child(par, "virtual_stages");
    if (v)
        tr_origin_format(&v->origin, where, sizeof where);
    if (p->virtual_stages > 1 && p->schedule_kind != TR_PIPE_INTERLEAVED)
        return tr_fail(err, "%s: parallel.virtual_stages = %lld needs schedule = \"interleaved\" "
                       "(gpipe and 1f1b run one chunk a stage)", where,
                       (long long)p->virtual_stages);
    v = tr_value_child(par, "micro_batches");
    if (v)
        tr_origin_format(&v->origin, where, sizeof where);
    if (p->schedule_kind == TR_PIPE_INTERLEAVED && p->micro_batches > 0 &&
        p->micro_batches % p->pipeline != 0)
        return tr_fail(err, "%s: parallel.micro_batches = %lld: the interleaved schedule takes "
                       "micro-batches in groups of the %lld stages; use a multiple of %lld",
                       where, (long long)p->micro_batches, (long long)p->pipeline,
                       (long long)p->pipeline);
    return TR_OK;
}

static const char *const sections[] = {"model",     "data",  "precision",  "schedule",
                                       "checkpoint", "optimizer", "train", "early_stop",
                                       "cost",      "parallel", "comm", "logger", "lora", NULL};

/* GPUs talk over NCCL; CPU ranks started by mpirun over MPI, others over TCP. */
static const char *default_comm(const struct tr_config *cfg)
{
    if (strcmp(cfg->device, "cuda") == 0)
        return "nccl";
    if (cfg->rank.source && strncmp(cfg->rank.source, "OMPI_", 5) == 0)
        return "mpi";
    return "tcp";
}

/* ---- resolution -------------------------------------------------------- */

void tr_config_where(struct tr_config *cfg, const char *path, char *buf, size_t size)
{
    struct tr_origin o = {TR_FROM_RECIPE, tr_recipe_path(cfg->recipe), 0};
    tr_recipe_origin(cfg->recipe, path, &o);
    tr_origin_format(&o, buf, size);
}

/* The recipe loaded (extends, include and the command line's overrides
 * merged), the overrides kept for the record, and the plugin path. */
static int load_recipe(struct tr_config *cfg, const char *recipe_path,
                       const char *const *overrides, int n_overrides, tr_err *err)
{
    const struct tr_install_paths *ip = tr_install_paths();
    /* the slots tr_config_slot reads below, with the core's keys in each */
    static const struct tr_recipe_slot slots[] = {
        {"data", NULL}, {"precision", NULL}, {"schedule", NULL},
        {"checkpoint", checkpoint_policy_options}, {"comm", NULL}, {NULL, NULL}};
    struct tr_recipe_paths rp = {.lua_dir = ip->lua_dir, .recipe_dir = ip->recipe_dir,
                                 .slots = slots};
    cfg->overrides = tr_xcalloc((size_t)n_overrides + 1, sizeof *cfg->overrides);
    for (int i = 0; i < n_overrides; i++)
        cfg->overrides[i] = tr_xstrdup(overrides[i]);
    cfg->n_overrides = n_overrides;
    cfg->recipe = tr_recipe_load(recipe_path, overrides, n_overrides, &rp, err);
    if (!cfg->recipe)
        return TR_ERROR;
    /* never the recipe's directory: a shared recipe must not run code */
    tr_plugin_path_init(&cfg->plugin_path, ip->plugin_dir);
    return TR_OK;
}

/* The root's scalars by their schema (the sections are checked by theirs),
 * and the model, which a Hugging Face directory may give. */
static int configure_root(struct tr_config *cfg, struct tr_value *root, const char *recipe_path,
                          struct root_config *rc, tr_err *err)
{
    struct tr_schema_use ru = {root_options, rc};
    if (tr_options_apply_skip(root, NULL, "recipe", &ru, 1, sections, err) != TR_OK)
        return TR_ERROR;
    if (!tr_value_child(root, "model"))
        return tr_fail(err, "%s: the recipe has no model (e.g. model = gpt { vocab = 256, ctx = 64, "
                       "layers = 2, heads = 4, dim = 64 })", recipe_path);
    /* model = { from = "DIR" }: the architecture of a Hugging Face directory */
    int64_t capped;
    if (tr_hf_resolve_model(cfg->recipe, &capped, err) != TR_OK)
        return TR_ERROR;
    if (capped > 0 && cfg->rank.rank == 0)
        tr_log(TR_LOG_INFO, NULL, "note: model.ctx = %d: %s/config.json allows %lld tokens, but "
               "a from model trains on at most %d unless model.ctx says more (set model.ctx = "
               "%lld for the whole context; it needs more memory)", TR_HF_DEFAULT_CTX,
               tr_hf_from_dir(cfg->recipe), (long long)capped, TR_HF_DEFAULT_CTX,
               (long long)capped);
    return TR_OK;
}

/* The core's sections by their schemas.  micro_batch = "auto" is the one
 * string the integer option takes: it is read here, and the options leave
 * it (and its node) alone. */
static int configure_sections(struct tr_config *cfg, struct tr_value *root, tr_err *err)
{
    const struct tr_value *mb = tr_value_get(root, "train.micro_batch");
    if (mb && ((mb->type == TR_V_STRING && strcmp(mb->string, "auto") == 0) ||
               (mb->text && strcmp(mb->text, "auto") == 0)))
        cfg->train.auto_micro_batch = 1;
    static const char *const auto_read[] = {"micro_batch", NULL};
    if (tr_train_length(cfg, root, err) != TR_OK)
        return TR_ERROR;
    struct tr_schema_use tu = {train_options, &cfg->train};
    struct tr_schema_use ou[3];
    struct tr_option rules[TR_OPTIMIZER_MAX_OPTIONS + 1];
    optimizer_schemas(ou, rules, &cfg->optimizer);
    struct tr_schema_use eu = {early_stop_options, &cfg->early_stop};
    struct tr_schema_use cost_use = {tr_cost_options, &cfg->cost};
    struct tr_schema_use pu = {parallel_options, &cfg->parallel};
    if (tr_options_apply_except(root, "train", "train", &tu, 1,
                                cfg->train.auto_micro_batch ? auto_read : NULL, err) != TR_OK ||
        tr_options_apply(root, "parallel", "parallel", &pu, 1, err) != TR_OK ||
        tr_options_apply(root, "cost", "cost", &cost_use, 1, err) != TR_OK ||
        tr_options_apply(root, "optimizer", "optimizer", ou, 3, err) != TR_OK ||
        tr_options_apply(root, "early_stop", "early_stop", &eu, 1, err) != TR_OK ||
        resolve_shard(cfg, root, err) != TR_OK || resolve_pipeline(cfg, root, err) != TR_OK)
        return TR_ERROR;
    resolve_offload(cfg);
    return tr_lora_configure(&cfg->lora, cfg->recipe, err);
}

/* name, run_dir, device and the ranks to start from the root's options;
 * name and run_dir default from the recipe's file name. */
static void configure_run(struct tr_config *cfg, struct tr_value *root,
                          const struct root_config *rc, const char *recipe_path)
{
    const char *base = strrchr(recipe_path, '/');
    base = base ? base + 1 : recipe_path;
    size_t blen = strlen(base);
    if (blen > 4 && strcmp(base + blen - 4, ".lua") == 0)
        blen -= 4;
    cfg->name = *rc->name ? tr_xstrdup(rc->name) : tr_xasprintf("%.*s", (int)blen, base);
    cfg->run_dir = *rc->run_dir ? tr_xstrdup(rc->run_dir) : tr_xasprintf("runs/%s", cfg->name);
    cfg->device = rc->device;
    cfg->parallel.procs = rc->procs;
    cfg->parallel.gpus = rc->gpus;
    if (rc->gpus > 0)
        cfg->device = "cuda";
    /* show what is in effect, not the "derive it" placeholder */
    tr_value_set_string(tr_value_child(root, "name"), cfg->name);
    tr_value_set_string(tr_value_child(root, "run_dir"), cfg->run_dir);
}

/* The plugin slots: data (which the recipe must give), precision
 * ($TRAINRUN_PRECISION, else fp32), schedule, checkpoint, the loggers, and
 * comm when there are ranks or the recipe names one. */
static int configure_plugins(struct tr_config *cfg, struct tr_value *root, tr_err *err)
{
    struct tr_origin def = {TR_FROM_DEFAULT, NULL, 0};
    const char *precision = "fp32";
    const char *env = getenv("TRAINRUN_PRECISION");
    struct tr_origin prec_origin = def;
    if (env && *env) { /* a cluster-wide default; the recipe still wins */
        precision = env;
        prec_origin.kind = TR_FROM_ENV;
        prec_origin.file = "TRAINRUN_PRECISION";
    }
    struct tr_schema_use cu = {checkpoint_policy_options, &cfg->checkpoint_policy};
    if (tr_config_slot(cfg, &cfg->data, "data", TR_KIND_DATA, NULL, def, NULL, err) != TR_OK ||
        tr_config_slot(cfg, &cfg->precision, "precision", TR_KIND_PRECISION, precision,
                       prec_origin, NULL, err) != TR_OK ||
        tr_config_slot(cfg, &cfg->schedule, "schedule", TR_KIND_SCHEDULE, "constant", def, NULL,
                       err) != TR_OK ||
        tr_config_slot(cfg, &cfg->checkpoint, "checkpoint", TR_KIND_CHECKPOINT, "local", def,
                       &cu, err) != TR_OK)
        return TR_ERROR;
    if (tr_config_loggers(cfg, err) != TR_OK)
        return TR_ERROR;
    if ((cfg->rank.world > 1 || tr_value_child(root, "comm")) &&
        tr_config_slot(cfg, &cfg->comm, "comm", TR_KIND_COMM, default_comm(cfg), def, NULL,
                       err) != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

int tr_config_load(struct tr_config *cfg, const char *recipe_path, const char *const *overrides,
                   int n_overrides, tr_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    if (load_recipe(cfg, recipe_path, overrides, n_overrides, err) != TR_OK)
        return TR_ERROR;
    struct tr_value *root = tr_recipe_root(cfg->recipe);
    if (root->type != TR_V_TABLE)
        return tr_fail(err, "%s: a recipe must return a table", recipe_path);
    /* the rank first: only rank 0 prints notes (tr_config_slot's) */
    if (tr_rank_from_env(&cfg->rank, err) != TR_OK)
        return TR_ERROR;
    struct root_config rc;
    if (configure_root(cfg, root, recipe_path, &rc, err) != TR_OK ||
        configure_sections(cfg, root, err) != TR_OK)
        return TR_ERROR;
    configure_run(cfg, root, &rc, recipe_path);
    if (offload_ranks(cfg, root, err) != TR_OK || configure_plugins(cfg, root, err) != TR_OK)
        return TR_ERROR;
    return tr_train_resolve_batch(cfg, err);
}

int tr_config_create_slot(struct tr_config *cfg, struct tr_slot *slot, uint32_t seq_len,
                          tr_err *err)
{
    char *recipe_dir = tr_dirname(tr_recipe_path(cfg->recipe));
    struct tr_create_args args = {
        .struct_size = sizeof args,
        .run_dir = cfg->run_dir,
        .recipe_dir = recipe_dir,
        .seq_len = seq_len,
        .seed = (uint64_t)cfg->train.seed,
        .rank = cfg->rank.rank,
        .world = cfg->rank.world,
        .local_rank = cfg->rank.local_rank,
        .local_world = cfg->rank.local_world,
        .device = cfg->device,
        .device_stream = cfg->device_stream,
    };
    const struct tr_plugin_info *info = slot->plugin->info;
    int rc = info->create(tr_host_services(), slot->config, &args, &slot->self, err);
    free(recipe_dir);
    if (rc != TR_OK) {
        char where[600];
        tr_origin_format(&slot->origin, where, sizeof where);
        tr_err_prefix(err, "%s: %s '%s'", where, slot->key, info->name);
        return TR_ERROR;
    }
    return TR_OK;
}

int tr_config_create_plugins(struct tr_config *cfg, uint32_t seq_len, tr_err *err)
{
    if (tr_mkdir_p(cfg->run_dir) != 0)
        return tr_fail(err, "cannot create the run directory %s: %s", cfg->run_dir,
                       strerror(errno));
    struct tr_slot *slots[] = {&cfg->precision, &cfg->data, &cfg->schedule, &cfg->checkpoint};
    for (size_t i = 0; i < TR_ARRAY_LEN(slots); i++) /* one created already is kept */
        if (!slots[i]->self && tr_config_create_slot(cfg, slots[i], seq_len, err) != TR_OK)
            return TR_ERROR;
    return TR_OK;
}

void tr_config_free(struct tr_config *cfg)
{
    struct tr_slot *slots[] = {&cfg->precision, &cfg->data, &cfg->schedule, &cfg->checkpoint,
                               &cfg->comm};
    for (size_t i = 0; i < TR_ARRAY_LEN(slots); i++) {
        struct tr_slot *s = slots[i];
        if (!s->plugin)
            continue;
        if (s->plugin && s->self && s->plugin->info->destroy)
            s->plugin->info->destroy(s->self);
        free(s->config);
        tr_plugin_close(s->plugin);
    }
    for (int i = 0; i < cfg->n_loggers; i++) {
        struct tr_slot *s = &cfg->loggers[i];
        if (s->self && s->plugin->info->destroy)
            s->plugin->info->destroy(s->self);
        free(s->config);
        tr_plugin_close(s->plugin);
    }
    tr_plugin_path_free(&cfg->plugin_path);
    tr_lora_free(&cfg->lora);
    if (cfg->recipe)
        tr_recipe_free(cfg->recipe);
    for (int i = 0; i < cfg->n_overrides; i++)
        free(cfg->overrides[i]);
    free(cfg->overrides);
    free((char *)cfg->name);
    free((char *)cfg->run_dir);
    memset(cfg, 0, sizeof *cfg);
}

void tr_config_help(FILE *out)
{
    fprintf(out, "Recipe sections (a recipe returns a table with these keys):\n\n");
    fprintf(out, "  model       = gpt { ... } | llama { ... } | mlp { ... }  (the builders' options below)\n"
                 "                | cnn { ... } | resnet { ... }  (images x[B,H,W,C]; docs/vision.md)\n"
                 "                | { from = \"DIR\" }  (a Hugging Face directory: config.json + safetensors;\n"
                 "                  llama, mistral, qwen2 or gpt2; DIR relative to the recipe; ctx and\n"
                 "                  recompute may sit beside it; docs/models.md)\n"
                 "                | { build = function(nn, spec, batch) ... end }  (README.md, Models)\n");
    tr_model_help(out);
    fprintf(out, "  data        = { plugin = \"text\", ... }        (trainrun plugins data)\n");
    fprintf(out, "  precision   = \"fp32\" | { plugin = ..., ... }  (default: $TRAINRUN_PRECISION or fp32)\n");
    fprintf(out, "  schedule    = { plugin = \"cosine\", ... }      (default: constant)\n");
    fprintf(out, "  checkpoint  = { plugin = \"local\", every, keep, ... }\n\n");
    fprintf(out, "  top level:\n");
    tr_options_help(root_options, out, "    ");
    fprintf(out, "\n  train = { ... }\n");
    tr_options_help(train_options, out, "    ");
    fprintf(out, "\n  optimizer = { ... }\n");
    struct tr_schema_use ou[3];
    struct tr_option rules[TR_OPTIMIZER_MAX_OPTIONS + 1];
    optimizer_schemas(ou, rules, NULL);
    for (int i = 0; i < 3; i++)
        tr_options_help(ou[i].options, out, "    ");
    fprintf(out, "\n  checkpoint = { ... }  (besides the checkpoint plugin's own options)\n");
    tr_options_help(checkpoint_policy_options, out, "    ");
    fprintf(out, "\n  early_stop = { ... }  (on the validation loss; needs train.eval_every)\n");
    tr_options_help(early_stop_options, out, "    ");
    fprintf(out, "\n  cost = { ... }  (prices, budget; trainrun plan)\n");
    tr_options_help(tr_cost_options, out, "    ");
    fprintf(out, "\n  parallel = { ... }  (data parallelism across procs/gpus ranks; docs/scale-out.md)\n");
    tr_options_help(parallel_options, out, "    ");
    tr_lora_help(out);
    fprintf(out, "\nPlugins by slot, with their options (trainrun plugins KIND: defaults and meaning):\n");
    tr_plugins_help(out);
    fprintf(out, "\nRecipes are sandboxed data: each time recipe code runs (loading with extends/include,\n"
                 "each model build) it may use 50 million Lua instructions and 5 s of CPU, 1 GiB of Lua\n"
                 "heap and 1 MiB of C stack; a source file has at most 4 MiB.  Past a limit the recipe\n"
                 "stops with an error naming its file:line (README.md, \"Limits of recipe code\").\n");
}
