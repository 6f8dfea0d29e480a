#include "run_config.h"

#include "config_help.h"
#include "hardware.h"
#include "hf_config.h"
#include "optimizers.h"
#include "options.h"
#include "../util/suggest.h"
#include "../util/util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- install paths ------------------------------------------------------ */

const struct tr_install_paths *tr_install_paths(void)
{
    static struct tr_install_paths paths;
    static int done;
    if (done)
        return &paths;
    done = 1;
    paths.plugin_dir = TR_PLUGIN_DIR;
    paths.lua_dir = TR_LUA_DIR;
    paths.recipe_dir = TR_RECIPE_DIR;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    /* An installed tree that was moved (or installed with DESTDIR): find
     * the plugins and Lua next to the binary, as <prefix>/bin/trainrun. */
    static char rel_plugins[PATH_MAX + 64], rel_lua[PATH_MAX + 64], rel_recipes[PATH_MAX + 64];
    char *slash = n > 0 ? strrchr(exe, '/') : NULL;
    if (slash) {
        struct stat st;
        snprintf(rel_plugins, sizeof rel_plugins, "%.*s/../lib/trainrun/plugins", (int)(slash - exe), exe);
        snprintf(rel_lua, sizeof rel_lua, "%.*s/../share/trainrun/lua", (int)(slash - exe), exe);
        snprintf(rel_recipes, sizeof rel_recipes, "%.*s/../share/trainrun/recipes", (int)(slash - exe), exe);
        if (stat(rel_plugins, &st) == 0 && stat(rel_lua, &st) == 0) {
            paths.plugin_dir = rel_plugins;
            paths.lua_dir = rel_lua;
            paths.recipe_dir = rel_recipes;
        }
    }
#ifdef TR_BUILD_DIR
    /* Running from the build tree: use its plugins and the source tree's Lua. */
    char build[PATH_MAX];
    if (n > 0 && realpath(TR_BUILD_DIR, build)) {
        size_t len = strlen(build);
        if (strncmp(exe, build, len) == 0 && (exe[len] == '/' || exe[len] == 0) &&
            !strchr(exe + len + 1, '/')) {
            paths.plugin_dir = TR_BUILD_DIR "/plugins/.libs";
            paths.lua_dir = TR_SOURCE_DIR "/lua";
            paths.recipe_dir = TR_SOURCE_DIR "/recipes";
        }
    }
#endif
    const char *env = getenv("TRAINRUN_LUA_DIR");
    if (env && *env)
        paths.lua_dir = env;
    return &paths;
}

/* ---- the core's own schemas -------------------------------------------- */

#define OPT(type, name, def, lo, hi, help, st, field)                                              \
    {type, name, def, lo, hi, NULL, help, offsetof(st, field)}

/* Bounds of the integers below, as far as any real run goes and well inside
 * what their consumers compute with (micro-batches and steps meet int and
 * uint64 arithmetic, seeds become uint64): a recipe asking for more is a
 * typo or an attack, and gets an error naming the key, never a wrap. */
#define STEPS_MAX 1e12        /* steps and every step interval */
#define BATCH_MAX 16777216.0  /* 2^24 samples in a batch or micro-batch */
#define SEED_MAX 9007199254740991.0
#define TOKENS_MAX 1e18       /* train.tokens: a quintillion */
#define TIME_MAX 31536000.0   /* train.time: a year of seconds */ /* 2^53 - 1: every seed a recipe number holds exactly */

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
        "that fits memory_budget)",
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

static const struct tr_option optimizer_options[] = {
    {TR_OPT_ENUM, "type", "adamw", 0, 0, tr_optimizer_names,
     "the update rule (sgd: with momentum); the fields below say which rule reads them",
     offsetof(struct tr_optimizer_config, type)},
    OPT(TR_OPT_FLOAT, "lr", "0.001", 0, TR_NO_MAX, "peak learning rate (the schedule shapes it)",
        struct tr_optimizer_config, lr),
    OPT(TR_OPT_FLOAT, "weight_decay", "0.0", 0, TR_NO_MAX,
        "decoupled weight decay, applied to matrices and embeddings only (not to norms or biases)",
        struct tr_optimizer_config, weight_decay),
    OPT(TR_OPT_FLOAT, "beta1", "0.9", 0, 1, "AdamW first-moment decay", struct tr_optimizer_config, beta1),
    OPT(TR_OPT_FLOAT, "beta2", "0.999", 0, 1, "AdamW second-moment decay", struct tr_optimizer_config, beta2),
    OPT(TR_OPT_FLOAT, "eps", "1e-8", 0, 1, "AdamW denominator epsilon", struct tr_optimizer_config, eps),
    OPT(TR_OPT_FLOAT, "momentum", "0.9", 0, 1, "SGD momentum", struct tr_optimizer_config, momentum),
    OPT(TR_OPT_INT, "reference_batch", "0", 0, BATCH_MAX,
        "the batch lr was tuned for: lr is scaled by train.batch / reference_batch (the linear "
        "scaling rule; 0: no scaling)", struct tr_optimizer_config, reference_batch),
    OPT(TR_OPT_FLOAT, "clip", "1.0", 0, TR_NO_MAX,
        "clip gradients to this global L2 norm (0: no clipping)", struct tr_optimizer_config, clip),
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

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

static const struct tr_option parallel_options[] = {
    OPT(TR_OPT_FLOAT, "bucket_mb", "25", 0.01, 4096,
        "gradients are all-reduced in buckets of this many MiB, each as soon as backward has "
        "finished it", struct tr_parallel_config, bucket_mb),
    OPT(TR_OPT_BOOL, "zero", "false", 0, 0,
        "ZeRO-1: shard the optimizer state across ranks (each keeps 1/world of it)",
        struct tr_parallel_config, zero),
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

/* Keys every plugin slot takes besides its plugin's options. */
struct slot_keys {
    const char *plugin;
};
static const struct tr_option slot_options[] = {
    {TR_OPT_STRING, "plugin", NULL, 0, 0, NULL, "which plugin fills this slot",
     offsetof(struct slot_keys, plugin)},
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

static const char *const sections[] = {"model",     "data",  "precision",  "schedule",
                                       "checkpoint", "optimizer", "train", "early_stop",
                                       "cost",      "parallel", "comm", "logger", NULL};

/* ---- ranks ----------------------------------------------------------------- */

static int env_int(const char *name, int *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1 << 20)
        return -1;
    *out = (int)x;
    return 1;
}

int tr_rank_from_env(struct tr_rank_info *out, tr_err *err)
{
    static const char *const sources[][4] = {
        {"TRAINRUN_RANK", "TRAINRUN_WORLD_SIZE", "TRAINRUN_LOCAL_RANK", "TRAINRUN_LOCAL_WORLD_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
    };
    *out = (struct tr_rank_info){0, 1, 0, 1, NULL};
    for (size_t i = 0; i < TR_ARRAY_LEN(sources); i++) {
        int v[4] = {0, 1, 0, 1}, got[4];
        for (int k = 0; k < 4; k++)
            if ((got[k] = env_int(sources[i][k], &v[k])) < 0)
                return tr_fail(err, "environment: %s=\"%s\" is not a number", sources[i][k],
                               getenv(sources[i][k]));
        if (!got[0] && !got[1])
            continue;
        if (!got[0] || !got[1] || v[1] < 1 || v[0] >= v[1])
            return tr_fail(err, "environment: %s=%s and %s=%s do not name a rank of a job; set "
                           "both, with rank < size", sources[i][0],
                           getenv(sources[i][0]) ? getenv(sources[i][0]) : "(unset)", sources[i][1],
                           getenv(sources[i][1]) ? getenv(sources[i][1]) : "(unset)");
        if (!got[2]) /* no local rank: assume one rank per node */
            v[2] = 0;
        if (!got[3])
            v[3] = got[2] ? v[2] + 1 : 1;
        *out = (struct tr_rank_info){v[0], v[1], v[2], v[3], sources[i][0]};
        return TR_OK;
    }
    return TR_OK;
}

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

static void where_of(struct tr_config *cfg, const char *path, char *buf, size_t size)
{
    struct tr_origin o = {TR_FROM_RECIPE, tr_recipe_path(cfg->recipe), 0};
    tr_recipe_origin(cfg->recipe, path, &o);
    tr_origin_format(&o, buf, size);
}

static int takes_option(const struct tr_option *options, const char *name)
{
    for (const struct tr_option *o = options; o && o->type != TR_OPT_END; o++)
        if (strcmp(o->name, name) == 0)
            return 1;
    return 0;
}

/* A recipe that extends a base and names another plugin for a slot, or
 * slot.plugin=NAME on the command line, replaces the plugin: the base's
 * options of the old plugin that the new one does not take go, with a note
 * naming them ("schedule: dropped min_lr_ratio (set for cosine at
 * base.lua:6; constant, named at child.lua:3, has no such option)"); those
 * it also takes (warmup) stay, and the note says so.  Options set beside the
 * new plugin's name were never listed: they are checked against it. */
static void drop_replaced_options(struct tr_config *cfg, struct tr_value *table,
                                  const char *key, const struct tr_plugin_info *info,
                                  const struct tr_schema_use *extra)
{
    const struct tr_recipe_switch *sw;
    int n = tr_recipe_switches(cfg->recipe, &sw);
    for (int i = 0; i < n; i++) {
        if (strcmp(sw[i].slot, key) != 0)
            continue;
        char dropped[512] = "", kept[512] = "", at[600] = "";
        for (int k = 0; k < sw[i].n_keys; k++) {
            const char *name = sw[i].keys[k];
            struct tr_value *v = tr_value_child(table, name);
            if (!v)
                continue; /* dropped by an earlier switch */
            int takes = takes_option(info->options, name) ||
                        (extra && takes_option(extra->options, name));
            char *list = takes ? kept : dropped;
            size_t len = strlen(list);
            snprintf(list + len, sizeof dropped - len, "%s%s", len ? ", " : "", name);
            if (takes)
                continue;
            if (!*at)
                tr_origin_format(&v->origin, at, sizeof at);
            for (size_t j = 0; j < table->n_items; j++)
                if (table->items[j] == v) {
                    tr_value_free(v);
                    memmove(table->items + j, table->items + j + 1,
                            (table->n_items - j - 1) * sizeof *table->items);
                    table->n_items--;
                    break;
                }
        }
        if (cfg->rank.rank != 0 || (!*dropped && !*kept))
            continue;
        if (*dropped)
            tr_log(TR_LOG_INFO, NULL, "note: %s: dropped %s (set for %s at %s; %s, named at %s, "
                   "has no such option)%s%s%s", key, dropped, sw[i].from, at, sw[i].to,
                   sw[i].to_where, *kept ? "; kept " : "", kept,
                   *kept ? ", which it takes too" : "");
        else
            tr_log(TR_LOG_INFO, NULL, "note: %s: kept %s (set for %s) for %s, named at %s, "
                   "which takes it too", key, kept, sw[i].from, sw[i].to, sw[i].to_where);
    }
}

static int configure_slot(struct tr_config *cfg, struct tr_slot *slot, const char *key,
                          enum tr_plugin_kind kind, const char *default_name,
                          struct tr_origin default_origin, const struct tr_schema_use *extra,
                          tr_err *err)
{
    struct tr_value *root = tr_recipe_root(cfg->recipe);
    struct tr_value *v = tr_value_child(root, key);
    slot->key = key;
    slot->kind = kind;
    if (!v) {
        if (!default_name) {
            char where[600];
            where_of(cfg, "", where, sizeof where);
            return tr_fail(err, "%s: the recipe has no %s; add e.g. %s = { plugin = \"%s\", ... }",
                           tr_recipe_path(cfg->recipe), key, key,
                           kind == TR_KIND_DATA ? "text" : "?");
        }
        v = tr_value_new(TR_V_STRING, key, default_origin);
        v->string = tr_xstrdup(default_name);
        tr_value_put(root, v);
    }
    if (v->type == TR_V_STRING) { /* shorthand: precision = "bf16" */
        struct tr_value *table = tr_value_new(TR_V_TABLE, key, v->origin);
        struct tr_value *name = tr_value_new(TR_V_STRING, "plugin", v->origin);
        name->string = tr_xstrdup(v->string);
        if (v->text)
            name->text = tr_xstrdup(v->text);
        tr_value_put(table, name);
        tr_value_put(root, table); /* replaces (and frees) the string */
        v = table;
    }
    char where[600];
    tr_value_where(v, where, sizeof where);
    if (v->type != TR_V_TABLE)
        return tr_fail(err, "%s%s must be a plugin name or a table { plugin = \"name\", ... }",
                       where, key);
    struct tr_value *pv = tr_value_child(v, "plugin");
    if (!pv && default_name) { /* e.g. only checkpoint.every was given */
        pv = tr_value_new(TR_V_STRING, "plugin", default_origin);
        tr_value_set_string(pv, default_name);
        tr_value_put(v, pv);
    }
    if (!pv || pv->type != TR_V_STRING)
        return tr_fail(err, "%s%s: say which plugin, e.g. %s = { plugin = \"%s\", ... }", where,
                       key, key, default_name ? default_name : "text");
    slot->origin = pv->origin;
    tr_value_where(pv, where, sizeof where);
    slot->plugin = tr_plugin_find(&cfg->plugin_path, kind, pv->string, err);
    if (!slot->plugin) {
        tr_err_prefix(err, "%.*s", (int)(strlen(where) - 2), where);
        return TR_ERROR;
    }
    const struct tr_plugin_info *info = slot->plugin->info;
    drop_replaced_options(cfg, v, key, info, extra);
    slot->config = tr_xcalloc(1, info->config_size ? info->config_size : 1);
    struct slot_keys keys;
    struct tr_schema_use uses[3] = {{slot_options, &keys}, {info->options, slot->config}};
    int n = 2;
    if (extra)
        uses[n++] = *extra;
    char what[128];
    snprintf(what, sizeof what, "%s '%s'", key, info->name);
    if (tr_options_apply(root, key, what, uses, n, err) != TR_OK) {
        /* name the plugin file too: the schema came from it */
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " [plugin %s]", slot->plugin->path);
        return TR_ERROR;
    }
    return TR_OK;
}

/* logger = { "jsonl", "csv", { plugin = "tensorboard", dir = "tb" } }: a list
 * of names or tables, each a logger plugin; "jsonl" is metrics.jsonl, which
 * the run always writes (report, plot and --resume read it), so it takes no
 * plugin.  Absent: { "jsonl" }, which show prints. */
static int configure_loggers(struct tr_config *cfg, tr_err *err)
{
    struct tr_value *root = tr_recipe_root(cfg->recipe);
    struct tr_value *list = tr_value_child(root, "logger");
    struct tr_origin def = {TR_FROM_DEFAULT, NULL, 0};
    char where[600];
    if (list && list->type == TR_V_STRING) { /* logger = "csv", logger=jsonl,csv on the CLI */
        struct tr_value *table = tr_value_new(TR_V_TABLE, "logger", list->origin);
        const char *p = list->string;
        for (int n = 1;; n++) {
            size_t len = strcspn(p, ",");
            char pos[16];
            snprintf(pos, sizeof pos, "%d", n);
            struct tr_value *one = tr_value_new(TR_V_STRING, pos, list->origin);
            one->is_list_item = 1;
            one->string = tr_xasprintf("%.*s", (int)len, p);
            tr_value_put(table, one);
            if (!p[len])
                break;
            p += len + 1;
        }
        tr_value_put(root, table); /* replaces (and frees) the string */
        list = table;
    }
    if (!list) {
        list = tr_value_new(TR_V_TABLE, "logger", def);
        struct tr_value *one = tr_value_new(TR_V_STRING, "1", def);
        one->is_list_item = 1;
        tr_value_set_string(one, "jsonl");
        tr_value_put(list, one);
        tr_value_put(root, list);
        return TR_OK;
    }
    tr_value_where(list, where, sizeof where);
    if (list->type != TR_V_TABLE)
        return tr_fail(err, "%slogger must be a list of logger plugins, e.g. logger = { \"jsonl\", "
                       "\"csv\", \"tensorboard\" }", where);
    for (size_t i = 0; i < list->n_items; i++) {
        struct tr_value *item = list->items[i];
        tr_value_where(item, where, sizeof where);
        if (!item->is_list_item)
            return tr_fail(err, "%slogger: '%s' is not a list entry; write logger = { \"jsonl\", "
                           "{ plugin = \"csv\", file = \"m.csv\" } }", where, item->key);
        if (item->type == TR_V_STRING) { /* "csv" -> { plugin = "csv" } */
            struct tr_value *table = tr_value_new(TR_V_TABLE, item->key, item->origin);
            table->is_list_item = 1;
            struct tr_value *name = tr_value_new(TR_V_STRING, "plugin", item->origin);
            tr_value_set_string(name, item->string);
            tr_value_put(table, name);
            tr_value_put(list, table); /* replaces (and frees) the string */
            item = list->items[i];
        }
        struct tr_value *pv = item->type == TR_V_TABLE ? tr_value_child(item, "plugin") : NULL;
        if (!pv || pv->type != TR_V_STRING)
            return tr_fail(err, "%slogger entry %s: write a logger's name (\"csv\") or a table "
                           "{ plugin = \"csv\", ... }", where, item->key);
        if (strcmp(pv->string, "jsonl") == 0) { /* the built-in metrics.jsonl */
            if (item->n_items > 1)
                return tr_fail(err, "%slogger \"jsonl\" (metrics.jsonl) takes no options", where);
            continue;
        }
        for (int k = 0; k < cfg->n_loggers; k++)
            if (strcmp(cfg->loggers[k].plugin->info->name, pv->string) == 0) {
                tr_value_where(pv, where, sizeof where);
                return tr_fail(err, "%slogger \"%s\" is listed twice", where, pv->string);
            }
        if (cfg->n_loggers == TR_MAX_LOGGERS)
            return tr_fail(err, "%slogger: more than %d loggers", where, TR_MAX_LOGGERS);
        struct tr_slot *slot = &cfg->loggers[cfg->n_loggers];
        slot->key = "logger";
        slot->kind = TR_KIND_LOGGER;
        slot->origin = pv->origin;
        tr_value_where(pv, where, sizeof where);
        slot->plugin = tr_plugin_find(&cfg->plugin_path, TR_KIND_LOGGER, pv->string, err);
        if (!slot->plugin) {
            tr_err_prefix(err, "%.*s", (int)(strlen(where) - 2), where);
            return TR_ERROR;
        }
        cfg->n_loggers++;
        const struct tr_plugin_info *info = slot->plugin->info;
        slot->config = tr_xcalloc(1, info->config_size ? info->config_size : 1);
        struct slot_keys keys;
        struct tr_schema_use uses[2] = {{slot_options, &keys}, {info->options, slot->config}};
        char what[128];
        snprintf(what, sizeof what, "logger '%s'", info->name);
        if (tr_options_apply(list, item->key, what, uses, 2, err) != TR_OK) {
            size_t len = strlen(err->msg);
            snprintf(err->msg + len, sizeof err->msg - len, " [plugin %s]", slot->plugin->path);
            return TR_ERROR;
        }
    }
    return TR_OK;
}

/* ---- the run's length ----------------------------------------------------- */

double tr_parse_count(const char *text)
{
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || errno || !(x >= 0))
        return -1;
    static const char suffix[] = "kMBT";
    if (*end) {
        const char *at = strchr(suffix, end[0]);
        if (end[0] == 'K')
            at = suffix;
        if (!at || end[1])
            return -1;
        for (long i = 0; i <= at - suffix; i++)
            x *= 1000;
    }
    return x;
}

double tr_parse_duration(const char *text)
{
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || errno || !(x >= 0))
        return -1;
    double unit = !*end ? 1 : strcmp(end, "s") == 0 ? 1 : strcmp(end, "m") == 0 ? 60
                : strcmp(end, "h") == 0 ? 3600 : strcmp(end, "d") == 0 ? 86400 : -1;
    return unit < 0 ? -1 : x * unit;
}

/* How specific a length's place is: the command line 3, the recipe named
 * on it 2, a file it extends or includes 1. */
static int length_rank(struct tr_config *cfg, const struct tr_value *v)
{
    if (v->origin.kind != TR_FROM_RECIPE)
        return v->origin.kind == TR_FROM_DEFAULT ? 0 : 3;
    char a[PATH_MAX], b[PATH_MAX];
    const char *recipe = tr_recipe_path(cfg->recipe);
    if (v->origin.file && realpath(v->origin.file, a) && realpath(recipe, b))
        return strcmp(a, b) == 0 ? 2 : 1;
    return v->origin.file && strcmp(v->origin.file, recipe) == 0 ? 2 : 1;
}

/* train.tokens = "2B" and train.time = "6h" are read here into numbers
 * (the option table checks their ranges); one of steps, tokens and epochs
 * sets the length: the one in the most specific place, with a note, and
 * two in one place are an error naming both. */
static int train_length(struct tr_config *cfg, struct tr_value *root, tr_err *err)
{
    static const char *const keys[] = {"train.steps", "train.tokens", "train.epochs"};
    char where[600], other[600];
    struct tr_value *vals[3] = {NULL, NULL, NULL};
    int rank[3] = {0, 0, 0}, best = -1;
    for (int i = 0; i < 3; i++) {
        struct tr_value *v = tr_value_get(root, keys[i]);
        if (!v)
            continue;
        if (i == 1 && v->type == TR_V_STRING) {
            double n = tr_parse_count(v->string);
            tr_value_where(v, where, sizeof where);
            if (n < 0)
                return tr_fail(err, "%strain.tokens: '%s' is not a token count; write e.g. "
                               "\"2B\", \"500M\", \"12k\" or 2e9", where, v->string);
            v->type = TR_V_NUMBER;
            v->number = n;
            tr_value_set_text(v, NULL); /* the options read a number now */
        }
        if (v->type == TR_V_NUMBER && v->number == 0 && i > 0)
            continue; /* tokens = 0, epochs = 0: not set */
        vals[i] = v;
        rank[i] = length_rank(cfg, v);
        if (best < 0 || rank[i] > rank[best])
            best = i;
    }
    /* The most specific place wins, as with any key: the command line over
     * the recipe, the recipe over a base it extends (train.tokens=2B on the
     * command line replaces a base's train.steps); two lengths in one place
     * are a contradiction. */
    for (int i = 0; i < 3 && best >= 0; i++) {
        if (!vals[i] || i == best)
            continue;
        tr_value_where(vals[i], where, sizeof where);
        tr_value_where(vals[best], other, sizeof other);
        if (rank[i] == rank[best])
            return tr_fail(err, "%s%s and %s (%.*s) both set the run's length; keep one of "
                           "train.steps, train.tokens and train.epochs (train.time may go "
                           "with any)", where, keys[i], keys[best],
                           (int)(strlen(other) > 2 ? strlen(other) - 2 : 0), other);
        if (cfg->rank.rank == 0)
            tr_log(TR_LOG_INFO, NULL, "note: %s (%.*s) sets the run's length; %s (%.*s) is "
                   "not used", keys[best], (int)(strlen(other) > 2 ? strlen(other) - 2 : 0),
                   other, keys[i], (int)(strlen(where) > 2 ? strlen(where) - 2 : 0), where);
        if (i > 0)
            vals[i]->number = 0; /* show prints it as not set */
    }
    if (best >= 0)
        cfg->train.length_from = best == 0 ? TR_LENGTH_STEPS : best == 1 ? TR_LENGTH_TOKENS
                                                                          : TR_LENGTH_EPOCHS;
    struct tr_value *t = tr_value_get(root, "train.time");
    if (t && t->type == TR_V_STRING) {
        double s = tr_parse_duration(t->string);
        tr_value_where(t, where, sizeof where);
        if (s < 0)
            return tr_fail(err, "%strain.time: '%s' is not a duration; write e.g. \"90s\", "
                           "\"45m\", \"1.5h\", \"2d\" or seconds", where, t->string);
        t->type = TR_V_NUMBER;
        t->number = s;
        tr_value_set_text(t, NULL);
    }
    if (best < 0 && t && t->type == TR_V_NUMBER && t->number > 0)
        cfg->train.length_from = TR_LENGTH_TIME;
    return TR_OK;
}

int tr_train_resolve_steps(struct tr_config *cfg, uint64_t tokens_per_sample, uint64_t samples,
                           uint64_t micro_batch, tr_err *err)
{
    struct tr_train_config *t = &cfg->train;
    char where[600];
    double steps;
    switch (t->length_from) {
    case TR_LENGTH_STEPS:
        return TR_OK;
    case TR_LENGTH_TIME:
        t->steps = (int64_t)STEPS_MAX; /* the clock ends it */
        return TR_OK;
    case TR_LENGTH_TOKENS:
        where_of(cfg, "train.tokens", where, sizeof where);
        if (!tokens_per_sample)
            return tr_fail(err, "%strain.tokens: the model reads no token sequence; give "
                           "train.steps or train.epochs", where);
        steps = ceil(t->tokens / ((double)t->batch * (double)tokens_per_sample));
        break;
    default: { /* epochs */
        where_of(cfg, "train.epochs", where, sizeof where);
        uint64_t per_epoch = micro_batch ? samples / micro_batch : 0;
        uint64_t per_step = micro_batch ? (uint64_t)t->batch / micro_batch : 0;
        if (!per_epoch || !per_step)
            return tr_fail(err, "%strain.epochs: the training split has %llu samples, fewer than "
                           "a micro-batch of %llu; give train.steps", where,
                           (unsigned long long)samples, (unsigned long long)micro_batch);
        steps = ceil(t->epochs * (double)per_epoch / (double)per_step);
        break;
    }
    }
    if (!(steps <= STEPS_MAX))
        return tr_fail(err, "%s%s gives %.3g steps, more than %.0g; is it a typo?", where,
                       t->length_from == TR_LENGTH_TOKENS ? "train.tokens" : "train.epochs",
                       steps, STEPS_MAX);
    t->steps = steps < 1 ? 1 : (int64_t)steps;
    /* show and the checkpoints see the steps in effect */
    struct tr_value *sv = tr_value_get(tr_recipe_root(cfg->recipe), "train.steps");
    if (sv && sv->type == TR_V_NUMBER)
        sv->number = (double)t->steps;
    return TR_OK;
}

int tr_config_load(struct tr_config *cfg, const char *recipe_path, const char *const *overrides,
                   int n_overrides, tr_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    const struct tr_install_paths *ip = tr_install_paths();
    /* the slots configure_slot reads below, with the core's keys in each */
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

    struct tr_value *root = tr_recipe_root(cfg->recipe);
    if (root->type != TR_V_TABLE)
        return tr_fail(err, "%s: a recipe must return a table", recipe_path);
    /* the rank first: only rank 0 prints notes (configure_slot's) */
    if (tr_rank_from_env(&cfg->rank, err) != TR_OK)
        return TR_ERROR;

    /* root: scalars by schema, sections checked below */
    struct root_config rc;
    struct tr_schema_use ru = {root_options, &rc};
    if (tr_options_apply_skip(root, NULL, "recipe", &ru, 1, sections, err) != TR_OK)
        return TR_ERROR;
    if (!tr_value_child(root, "model"))
        return tr_fail(err, "%s: the recipe has no model (e.g. model = gpt { vocab = 256, ctx = 64, "
                       "layers = 2, heads = 4, dim = 64 })", recipe_path);
    /* model = { from = "DIR" }: the architecture of a Hugging Face directory */
    if (tr_hf_resolve_model(cfg->recipe, err) != TR_OK)
        return TR_ERROR;

    /* micro_batch = "auto" is the one string the integer option takes: it
     * is read here, and the options leave it (and its node) alone */
    const struct tr_value *mb = tr_value_get(root, "train.micro_batch");
    if (mb && ((mb->type == TR_V_STRING && strcmp(mb->string, "auto") == 0) ||
               (mb->text && strcmp(mb->text, "auto") == 0)))
        cfg->train.auto_micro_batch = 1;
    static const char *const auto_read[] = {"micro_batch", NULL};
    if (train_length(cfg, root, err) != TR_OK)
        return TR_ERROR;
    struct tr_schema_use tu = {train_options, &cfg->train};
    struct tr_schema_use ou = {optimizer_options, &cfg->optimizer};
    struct tr_schema_use eu = {early_stop_options, &cfg->early_stop};
    struct tr_schema_use cost_use = {tr_cost_options, &cfg->cost};
    struct tr_schema_use pu = {parallel_options, &cfg->parallel};
    if (tr_options_apply_except(root, "train", "train", &tu, 1,
                                cfg->train.auto_micro_batch ? auto_read : NULL, err) != TR_OK ||
        tr_options_apply(root, "parallel", "parallel", &pu, 1, err) != TR_OK ||
        tr_options_apply(root, "cost", "cost", &cost_use, 1, err) != TR_OK ||
        tr_options_apply(root, "optimizer", "optimizer", &ou, 1, err) != TR_OK ||
        tr_options_apply(root, "early_stop", "early_stop", &eu, 1, err) != TR_OK)
        return TR_ERROR;

    /* name and run_dir defaults depend on the recipe's file name */
    const char *base = strrchr(recipe_path, '/');
    base = base ? base + 1 : recipe_path;
    size_t blen = strlen(base);
    if (blen > 4 && strcmp(base + blen - 4, ".lua") == 0)
        blen -= 4;
    cfg->name = *rc.name ? tr_xstrdup(rc.name) : tr_xasprintf("%.*s", (int)blen, base);
    cfg->run_dir = *rc.run_dir ? tr_xstrdup(rc.run_dir) : tr_xasprintf("runs/%s", cfg->name);
    cfg->device = rc.device;
    cfg->parallel.procs = rc.procs;
    cfg->parallel.gpus = rc.gpus;
    if (rc.gpus > 0)
        cfg->device = "cuda";
    /* show what is in effect, not the "derive it" placeholder */
    tr_value_set_string(tr_value_child(root, "name"), cfg->name);
    tr_value_set_string(tr_value_child(root, "run_dir"), cfg->run_dir);

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
    if (configure_slot(cfg, &cfg->data, "data", TR_KIND_DATA, NULL, def, NULL, err) != TR_OK ||
        configure_slot(cfg, &cfg->precision, "precision", TR_KIND_PRECISION, precision, prec_origin,
                       NULL, err) != TR_OK ||
        configure_slot(cfg, &cfg->schedule, "schedule", TR_KIND_SCHEDULE, "constant", def, NULL,
                       err) != TR_OK ||
        configure_slot(cfg, &cfg->checkpoint, "checkpoint", TR_KIND_CHECKPOINT, "local", def, &cu,
                       err) != TR_OK)
        return TR_ERROR;
    if (configure_loggers(cfg, err) != TR_OK)
        return TR_ERROR;
    if ((cfg->rank.world > 1 || tr_value_child(root, "comm")) &&
        configure_slot(cfg, &cfg->comm, "comm", TR_KIND_COMM, default_comm(cfg), def, NULL,
                       err) != TR_OK)
        return TR_ERROR;

    /* cross-section rules */
    struct tr_train_config *t = &cfg->train;
    int64_t ranks = cfg->rank.world > 1 ? cfg->rank.world
                    : cfg->parallel.gpus > 0 ? cfg->parallel.gpus : cfg->parallel.procs;
    if (t->micro_batch == 0 && !t->auto_micro_batch) {
        /* unset: the whole batch, split evenly among the ranks when they can */
        t->micro_batch = ranks > 1 && t->batch % ranks == 0 ? t->batch / ranks : t->batch;
    }
    if (t->auto_micro_batch) /* chosen at run time; show says so */
        t->micro_batch = t->batch;
    if (cfg->optimizer.reference_batch > 0)
        cfg->optimizer.lr *= (double)t->batch / (double)cfg->optimizer.reference_batch;
    if (t->batch % t->micro_batch != 0) {
        char where[600];
        where_of(cfg, "train.micro_batch", where, sizeof where);
        return tr_fail(err, "%s: train: micro_batch (%lld) must divide batch (%lld)", where,
                       (long long)t->micro_batch, (long long)t->batch);
    }
    /* every rank runs the same number of micro-batches of each global batch */
    if (ranks > 1 && (t->batch / t->micro_batch) % ranks != 0 && !t->auto_micro_batch) {
        char where[600];
        where_of(cfg, "train.batch", where, sizeof where);
        return tr_fail(err, "%s: train: batch %lld is %lld micro-batch(es) of %lld, which %lld ranks "
                       "cannot share evenly; make batch / micro_batch a multiple of %lld (e.g. "
                       "micro_batch = %lld)", where, (long long)t->batch,
                       (long long)(t->batch / t->micro_batch), (long long)t->micro_batch,
                       (long long)ranks, (long long)ranks,
                       t->batch % ranks == 0 ? (long long)(t->batch / ranks) : 1LL);
    }
    return TR_OK;
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
    tr_options_help(optimizer_options, out, "    ");
    fprintf(out, "\n  checkpoint = { ... }  (besides the checkpoint plugin's own options)\n");
    tr_options_help(checkpoint_policy_options, out, "    ");
    fprintf(out, "\n  early_stop = { ... }  (on the validation loss; needs train.eval_every)\n");
    tr_options_help(early_stop_options, out, "    ");
    fprintf(out, "\n  cost = { ... }  (prices, budget; trainrun plan)\n");
    tr_options_help(tr_cost_options, out, "    ");
    fprintf(out, "\n  parallel = { ... }  (data parallelism across procs/gpus ranks; docs/scale-out.md)\n");
    tr_options_help(parallel_options, out, "    ");
    fprintf(out, "\nPlugins by slot, with their options (trainrun plugins KIND: defaults and meaning):\n");
    tr_plugins_help(out);
    fprintf(out, "\nRecipes are sandboxed data: each time recipe code runs (loading with extends/include,\n"
                 "each model build) it may use 50 million Lua instructions and 5 s of CPU, 1 GiB of Lua\n"
                 "heap and 1 MiB of C stack; a source file has at most 4 MiB.  Past a limit the recipe\n"
                 "stops with an error naming its file:line (README.md, \"Limits of recipe code\").\n");
}
