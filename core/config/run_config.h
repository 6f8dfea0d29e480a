/*
 * A recipe resolved into the run's configuration: the core's own sections
 * (train, optimizer, checkpoint policy) parsed by their schemas, and one
 * plugin per slot (precision, data, schedule, checkpoint) found, checked
 * and its options parsed.  Nothing is created or allocated yet, so `show`
 * and `plan` can stop here.
 */
#ifndef TR_RUN_CONFIG_H
#define TR_RUN_CONFIG_H

#include "hardware.h"
#include "lora.h"
#include "plugin.h"
#include "recipe.h"

struct tr_train_config {
    int64_t steps, batch, micro_batch, seed;
    int auto_micro_batch;  /* micro_batch = "auto" */
    double memory_budget;  /* GiB for auto micro-batch; 0: the device's */
    int64_t eval_every, eval_batches, log_every;
    int64_t threads, workers, prefetch;
    int64_t trace_every;
    /* The run's length: steps, or one of tokens and epochs (the step count
     * is then derived by tr_train_resolve_steps once the sequence length and
     * the training split are known); time: a wall-clock limit in seconds
     * that stops the run with a checkpoint, with any of them or alone. */
    double tokens, epochs, time;
    enum { TR_LENGTH_STEPS, TR_LENGTH_TOKENS, TR_LENGTH_EPOCHS, TR_LENGTH_TIME } length_from;
};

struct tr_optimizer_config {
    const char *type;
    double lr, weight_decay, beta1, beta2, eps, momentum, clip;
    int64_t reference_batch; /* > 0: lr is for this batch; scale linearly to train.batch */
};

struct tr_checkpoint_policy {
    int64_t every, keep;
    int keep_best, async;
    double deadline;
    const char *weights_dtype;
};

struct tr_early_stop_config {
    int64_t patience;  /* evaluations without improvement; 0: off */
    double min_delta;  /* an improvement must lower the validation loss by more */
};

/* The shard levels of data parallelism (parallel.shard): what each rank
 * keeps only its part of (engine/shard.h: which part). */
enum tr_shard_level {
    TR_SHARD_NONE,      /* replicated: every rank the whole state */
    TR_SHARD_OPTIMIZER, /* ZeRO-1: the optimizer state */
    TR_SHARD_GRADIENTS, /* ZeRO-2: also the summed gradients (reduce-scatter) */
    TR_SHARD_PARAMETERS /* ZeRO-3: also the parameters (gather.h) */
};
extern const char *const tr_shard_levels[]; /* the recipe's words, by level; NULL-ended */

/* Pipeline schedules (parallel.schedule; core/engine/pipeline.h). */
enum tr_pipe_kind { TR_PIPE_GPIPE, TR_PIPE_1F1B, TR_PIPE_INTERLEAVED };
extern const char *const tr_pipe_kinds[]; /* the recipe's words, by kind; NULL-ended */
extern const char *const tr_offload_kinds[]; /* parallel.offload's words: none, optimizer */

/* Data parallelism: how many ranks this node starts (the local launcher),
 * and how gradients travel between ranks. */
struct tr_parallel_config {
    int64_t procs;    /* CPU ranks to start on this node (1: no launcher) */
    int64_t gpus;     /* GPU ranks to start on this node (0: none) */
    double bucket_mb; /* gradients all-reduced in buckets of this size */
    int zero;         /* the alias of shard = "optimizer" */
    const char *shard;               /* as written: none, optimizer, gradients, parameters */
    enum tr_shard_level shard_level; /* resolved from shard and zero */
    /* pipeline stages (core/engine/pipeline.h, run by pipeline_exec.h) */
    int64_t pipeline;                /* stages P (1: none) */
    const char *schedule;            /* as written: gpipe, 1f1b, interleaved */
    enum tr_pipe_kind schedule_kind; /* resolved */
    int64_t virtual_stages;          /* chunks per stage V (interleaved) */
    int64_t micro_batches;           /* per step through the pipe M; 0: the accumulation's */
    /* optimizer offload (docs/scale-out.md): the optimizer's state and an
     * fp32 master copy of the parameters in host memory, updated there */
    const char *offload;             /* as written: none, optimizer */
    int offload_optimizer;           /* resolved: offload = "optimizer" */
    double offload_chunk_mb;         /* gradients a transfer of the offloaded update */
    int offload_overlap;             /* the offloaded update overlaps the next forward */
};

/* This process among the ranks of a data-parallel job (1 of 1 alone). */
struct tr_rank_info {
    int rank, world, local_rank, local_world;
    const char *source; /* the environment it came from: "TRAINRUN_RANK", "SLURM_PROCID", ... */
};

/* Read rank and world size from trainrun's launcher, Slurm or Open MPI, in
 * that order; alone when none is set. */
int tr_rank_from_env(struct tr_rank_info *out, tr_err *err);

struct tr_slot {
    const char *key;            /* "data" */
    enum tr_plugin_kind kind;
    struct tr_plugin *plugin;
    void *config;               /* parsed by the plugin's schema */
    void *self;                 /* the instance, once created */
    struct tr_origin origin;    /* where the recipe chose it */
};

#define TR_MAX_LOGGERS 8

struct tr_config {
    struct tr_recipe *recipe;
    const char *name, *run_dir, *device;
    struct tr_train_config train;
    struct tr_optimizer_config optimizer;
    struct tr_checkpoint_policy checkpoint_policy;
    struct tr_early_stop_config early_stop;
    struct tr_cost_config cost;
    struct tr_parallel_config parallel;
    struct tr_lora_config lora; /* lora = { ... }: adapters, the base frozen (lora.h) */
    struct tr_rank_info rank;
    struct tr_slot precision, data, schedule, checkpoint;
    struct tr_slot comm;        /* configured when world > 1 or the recipe names one */
    /* logger = { "jsonl", "csv", ... }: the logger plugins beside metrics.jsonl
     * (the built-in "jsonl", written always), created by rank 0 alone */
    struct tr_slot loggers[TR_MAX_LOGGERS];
    int n_loggers;
    void *device_stream;        /* the backend's stream, for the comm plugin */
    struct tr_plugin_path plugin_path;
    char **overrides; /* as given on the command line (checkpoints record them) */
    int n_overrides;
};

/* train.tokens / train.epochs -> train.steps: tokens_per_sample is the
 * sequence length (0 for a model without one), samples and micro_batch
 * those of the training split as the loader reads it (an epoch is
 * samples / micro_batch whole micro-batches).  With time alone, steps is
 * unbounded and the clock ends the run.  Checks every size; TR_OK or an
 * error naming the key. */
int tr_train_resolve_steps(struct tr_config *cfg, uint64_t tokens_per_sample, uint64_t samples,
                           uint64_t micro_batch, tr_err *err);
/* "2B", "500M", "12k", "3e9" -> a count; "90s", "45m", "1.5h", "2d" -> seconds.
 * -1 when the text is not one. */
double tr_parse_count(const char *text);
double tr_parse_duration(const char *text);

struct tr_install_paths {
    const char *plugin_dir; /* built-in plugins */
    const char *lua_dir;
    const char *recipe_dir; /* installed recipes */
};

/* The install paths: the build tree's when this binary runs from it. */
const struct tr_install_paths *tr_install_paths(void);

int tr_config_load(struct tr_config *cfg, const char *recipe_path, const char *const *overrides,
                   int n_overrides, tr_err *err);
/* Create one slot's plugin instance; errors name the recipe line that chose it. */
int tr_config_create_slot(struct tr_config *cfg, struct tr_slot *slot, uint32_t seq_len,
                          tr_err *err);
/* Create every plugin instance (data with the model's sequence length);
 * the comm slot is created by the run once its backend is open. */
int tr_config_create_plugins(struct tr_config *cfg, uint32_t seq_len, tr_err *err);
void tr_config_free(struct tr_config *cfg);
/* The ranks a run of cfg has: the launched world's, or before a launch
 * those procs=N / gpus=N would start (gpus where set). */
int64_t tr_config_ranks(const struct tr_config *cfg);
/* parallel.offload = "optimizer" needs a device to offload from: refused
 * on device = "cpu", unless `planning` for a cost.hardware profile, and
 * (not yet supported) in a run of `world` > 1 ranks; each refusal names the
 * recipe line.  Only training and plan sessions ask: eval, sample and
 * export of an offloaded run's checkpoints run anywhere (there is no
 * optimizer in them). */
int tr_config_check_offload(const struct tr_config *cfg, int planning, int world, tr_err *err);

/* Help for the core's own sections (trainrun help recipe). */
void tr_config_help(FILE *out);

/* "recipe.lua:14" for a dotted key of the recipe (its file when unknown). */
void tr_config_where(struct tr_config *cfg, const char *path, char *buf, size_t size);

#endif
