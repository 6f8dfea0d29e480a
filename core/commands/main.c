/* trainrun: the command line. */
#include "../config/run_config.h"
#include "../config/options.h"
#include "../config/precision.h"
#include "../config/record.h"
#include "../engine/graph.h"
#include "../engine/model.h"
#include "plan.h"
#include "prepare.h"
#include "report.h"
#include "../engine/checkpoint.h"
#include "../engine/run.h"
#include "launch.h"
#include "doctor.h"
#include "eval.h"
#include "../engine/topo.h"
#include "../util/suggest.h"
#include "../util/util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: trainrun [run] RECIPE.lua [key.sub=value ...] [--resume auto|never]\n"
            "                [--allow-changes] [--quiet]\n"
            "       trainrun RECIPE.lua procs=N | gpus=N         N data-parallel ranks on this machine\n"
            "                                                    (docs/scale-out.md for clusters)\n"
            "       trainrun --smoke RECIPE.lua [key=value ...]  2 CPU steps, a checkpoint round trip\n"
            "                                                    (in a scratch dir), whether the batch fits\n"
            "       trainrun show RECIPE.lua [key=value ...]   resolved recipe, with where each value came from,\n"
            "                                                    checked as a run checks it, and derived values\n"
            "       trainrun plan RECIPE.lua [key=value ...] [gpus=N]  memory, FLOPs, time and cost,\n"
            "                                                    without running\n"
            "       trainrun plugins [KIND]                      installed plugins and their options\n"
            "       trainrun sample CHECKPOINT|RECIPE [key=value ...] [--prompt TEXT] [--tokens N]\n"
            "                       [--temperature T] [--top-k K] [--seed N] [--recipe FILE] [--ids]\n"
            "                       [--ignore-eos]               text from a run's checkpoint (read-only,\n"
            "                                                    also of a running run) or a recipe's\n"
            "                                                    model = { from = DIR } weights, through\n"
            "                                                    the run's tokenizer (help sample)\n"
            "       trainrun eval RECIPE [key=value ...] [--checkpoint PATH] [--split val|train]\n"
            "                     [--batches N|all] [--json]     validation loss, perplexity and\n"
            "                                                    accuracy, without training (help eval)\n"
            "       trainrun export CHECKPOINT --dtype bf16|fp16|fp32 -o FILE.safetensors\n"
            "       trainrun export CHECKPOINT --format hf [--dtype bf16|fp16|fp32] -o DIR\n"
            "                                                    a Hugging Face model directory (config.json +\n"
            "                                                    model.safetensors) of a llama or gpt run\n"
            "       trainrun prepare INPUT... -o OUTDIR [--tokenizer byte|char|tokenizer.json]\n"
            "                        [--workers N] [--dedup exact|near|none] ...\n"
            "                                                    .txt or .jsonl (.gz, .zst) to token\n"
            "                                                    shards, once (help prepare)\n"
            "       trainrun prepare FOLDER|SHARD.tar... --size N -o OUTDIR [--val DIR|TAR]\n"
            "                                                    images (PNG, JPEG, WebP) to image\n"
            "                                                    shards for data plugin images\n"
            "       trainrun report RUN_DIR [-o OUTDIR]           plots of a run (PNG + index.html)\n"
            "       trainrun topo [--threads N] [--workers N] [--topology synthetic:DESC|xml:FILE]\n"
            "                     [procs=N|gpus=N]               where threads (of each rank) will run\n"
            "       trainrun doctor                              what this machine can run: CPU features,\n"
            "                                                    backends (and why one is unavailable), plugins\n"
            "       trainrun help [recipe|eval|sample|prepare]   this text, the recipe reference, or a\n"
            "                                                    command's own help\n"
            "       trainrun version\n"
            "\n"
            "Overrides are applied after the recipe and before validation, e.g.\n"
            "  trainrun recipes/kjv-char.lua train.steps=100 optimizer.lr=3e-4 precision=fp32\n"
            "\n"
            "Plugins load from trainrun's own directory, then --plugin-path DIR (any command,\n"
            "repeatable) and TRAINRUN_PLUGIN_PATH; never from a recipe's directory: a shared\n"
            "recipe runs no code of its own (README: Sharing recipes safely).\n"
            "Environment: TRAINRUN_PLUGIN_PATH (more plugin dirs), TRAINRUN_RECIPE_PATH (dirs for\n"
            "extends/include), TRAINRUN_PRECISION (default precision policy),\n"
            "TRAINRUN_BACKEND_PATH (dirs searched first for device=X's backend_X.so).\n"
            "A run locks its run_dir (run_dir/trainrun.lock): a second run there refuses and\n"
            "names the first; the lock ends with the process, however it ends.\n"
            "A run records its resolved recipe, trainrun's and its plugins' versions in\n"
            "run_dir/recipe.resolved(.json); --resume auto refuses a recipe that trains\n"
            "differently (lr, batch, model, data, ...), listing each change, unless\n"
            "--allow-changes; changes to logging, evaluation, checkpoints, budget or length\n"
            "pass with a note (README: What a run records).\n"
            "Checkpoints are checked (CRC-32 of each file, state.json's fields) before --resume,\n"
            "sample or export use one; a damaged one is skipped or refused, naming why.\n"
            "checkpoint.dir may hold other files: trainrun removes only what it created there\n"
            "(directories marked .trainrun-checkpoint), never through a symlink.\n"
            "Exit codes: 0 done, 1 error, 2 usage, %d preempted (checkpoint saved; requeue with\n"
            "--resume auto).\n",
            TR_EXIT_PREEMPTED);
}

/* key=value with a key of names separated by single dots: what the recipe
 * loader accepts.  Checked here so that a typo on the command line is a
 * usage error (exit 2), not a recipe error. */
static int override_syntax_ok(const char *arg, const char *command)
{
    const char *eq = strchr(arg, '=');
    const char *why = NULL;
    if (!eq)
        why = "expected key.sub=value";
    else if (eq == arg)
        why = "the key before '=' is empty";
    else if (arg[0] == '.' || eq[-1] == '.')
        why = "the key starts or ends with '.'";
    else
        for (const char *p = arg; p + 1 < eq && !why; p++)
            if (p[0] == '.' && p[1] == '.')
                why = "the key has an empty part ('..')";
    if (!why)
        return 1;
    fprintf(stderr, "trainrun: error: %s'%s' is not an override: %s (e.g. train.steps=100)\n",
            command, arg, why);
    return 0;
}

/* Split argv into the recipe's overrides (key=value); flags the command
 * consumed were replaced by "-", any other flag is a usage error. */
static int collect_overrides(int argc, char **argv, int first, const char ***overrides, int *n)
{
    *overrides = tr_xcalloc((size_t)argc + 1, sizeof **overrides);
    *n = 0;
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "-") == 0)
            continue;
        if (argv[i][0] == '-') {
            fprintf(stderr, "trainrun: error: unknown flag '%s' (see trainrun help)\n", argv[i]);
            return -1;
        }
        if (!override_syntax_ok(argv[i], ""))
            return -1;
        (*overrides)[(*n)++] = argv[i];
    }
    return 0;
}

/* Strict numbers for flags: all of the text, within [lo, hi]; atoi would
 * turn "abc" into 0 and "10x" into 10 without a word. */
static int flag_int(const char *flag, const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "trainrun: error: %s takes an integer from %lld to %lld, not '%s'\n", flag,
                lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

static int flag_u64(const char *flag, const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    /* strtoull takes "-1" as 2^64 - 1: digits only */
    if (end == text || *end || errno || !isdigit((unsigned char)text[0])) {
        fprintf(stderr, "trainrun: error: %s takes an integer from 0 to %llu, not '%s'\n", flag,
                (unsigned long long)UINT64_MAX, text);
        return -1;
    }
    *out = v;
    return 0;
}

static int flag_positive(const char *flag, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || !(v > 0)) {
        fprintf(stderr, "trainrun: error: %s takes a number greater than 0, not '%s'\n", flag,
                text);
        return -1;
    }
    *out = v;
    return 0;
}

static char **original_argv;

static int cmd_run(int argc, char **argv, int first)
{
    const char *recipe = argv[first];
    struct tr_run_flags flags = {0, 0, 0, 0};
    for (int i = first + 1; i < argc; i++) {
        if (strcmp(argv[i], "--resume") == 0 || strncmp(argv[i], "--resume=", 9) == 0) {
            int joined = argv[i][8] == '='; /* --resume=auto */
            const char *how = joined ? argv[i] + 9 : i + 1 < argc ? argv[i + 1] : NULL;
            if (!how || !*how) {
                fprintf(stderr, "trainrun: error: --resume needs a value: --resume auto or "
                                "--resume never\n");
                return TR_EXIT_USAGE;
            }
            if (strcmp(how, "auto") == 0)
                flags.resume = 1;
            else if (strcmp(how, "never") != 0) {
                fprintf(stderr, "trainrun: error: --resume takes auto or never, not '%s'\n", how);
                return TR_EXIT_USAGE;
            }
            argv[i] = "-"; /* consumed, with its value */
            if (!joined)
                argv[++i] = "-";
        } else if (strcmp(argv[i], "--quiet") == 0) {
            flags.quiet = 1;
            argv[i] = "-";
        } else if (strcmp(argv[i], "--allow-changes") == 0) {
            flags.allow_changes = 1;
            argv[i] = "-";
        } else if (strcmp(argv[i], "--smoke") == 0) {
            flags.smoke = 1;
            argv[i] = "-";
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "trainrun: error: unknown flag '%s' (see trainrun help)\n", argv[i]);
            return TR_EXIT_USAGE;
        }
    }
    const char **overrides;
    int n;
    if (collect_overrides(argc, argv, first + 1, &overrides, &n) != 0) {
        free(overrides);
        return TR_EXIT_USAGE;
    }
    if (flags.smoke) {
        int code = tr_smoke(recipe, overrides, n, flags.quiet);
        free(overrides);
        return code;
    }
    struct tr_config cfg;
    tr_err err = {{0}};
    int code;
    if (tr_config_load(&cfg, recipe, overrides, n, &err) != TR_OK) {
        fprintf(stderr, "trainrun: error: %s\n", err.msg);
        code = TR_EXIT_ERROR;
    } else if (!cfg.rank.source && (cfg.parallel.procs > 1 || cfg.parallel.gpus > 1)) {
        /* procs=N / gpus=N: become the launcher of N ranks of this command */
        code = tr_launch((int)(cfg.parallel.gpus > 0 ? cfg.parallel.gpus : cfg.parallel.procs),
                         original_argv);
    } else {
        code = tr_train(&cfg, &flags);
    }
    tr_config_free(&cfg);
    free(overrides);
    return code;
}

/* What show learns by checking the recipe as a run would. */
struct show_derived {
    int64_t seq_len;  /* tokens per sample; 0: not a sequence model */
    int64_t params;
};

/* The checks a run makes before its first step that need no data, device
 * or run directory: the model is built by its builder (unknown or bad model
 * options fail here, at their file:line), and the precision and schedule
 * plugins are created (their cross-option rules) and the precision policy
 * refused where a run refuses it.  The data and checkpoint plugins are not
 * created: they open files. */
static int show_check(struct tr_config *cfg, struct show_derived *d, tr_err *err)
{
    memset(d, 0, sizeof *d);
    struct tr_graph *g = tr_model_build(cfg->recipe, (int)cfg->train.micro_batch, err);
    if (!g)
        return TR_ERROR;
    const struct tr_tensor *in = &g->tensors[g->inputs[0]];
    d->seq_len = in->dtype == TR_I32 && in->ndim == 2 ? in->shape[1] : 0;
    struct tr_flops f;
    tr_graph_count_flops(g, &f);
    d->params = (int64_t)f.params;
    tr_graph_free(g, NULL);
    /* train.tokens gives the steps once the sequence length is known, as in
     * the run; train.epochs needs the data, which show does not read */
    if (cfg->train.length_from == TR_LENGTH_TOKENS &&
        tr_train_resolve_steps(cfg, (uint64_t)d->seq_len, 0, (uint64_t)cfg->train.micro_batch,
                               err) != TR_OK)
        return TR_ERROR;
    uint32_t seq = (uint32_t)d->seq_len;
    if (tr_config_create_slot(cfg, &cfg->precision, seq, err) != TR_OK ||
        tr_config_create_slot(cfg, &cfg->schedule, seq, err) != TR_OK)
        return TR_ERROR;
    const struct tr_precision_vtable *vt = cfg->precision.plugin->info->vtable;
    struct tr_precision_policy pol = {.struct_size = sizeof pol};
    vt->policy(cfg->precision.self, &pol);
    char where[600];
    tr_origin_format(&cfg->precision.origin, where, sizeof where);
    return tr_precision_check(&pol, cfg->precision.plugin->info->name, where, cfg->device, err);
}

/* The values a run derives from the recipe's, which the tree above does not
 * show. */
static void show_print_derived(const struct tr_config *cfg, const struct show_derived *d)
{
    const struct tr_train_config *t = &cfg->train;
    const struct tr_optimizer_config *o = &cfg->optimizer;
    int64_t ranks = cfg->rank.world > 1 ? cfg->rank.world
                    : cfg->parallel.gpus > 0 ? cfg->parallel.gpus : cfg->parallel.procs;
    if (ranks < 1)
        ranks = 1;
    printf("-- derived (what the run computes from the values above)\n");
    if (d->params > 0)
        printf("parameters      = %lld\n", (long long)d->params);
    if (o->reference_batch > 0)
        printf("lr (scaled)     = %g   -- optimizer.lr x batch %lld / reference_batch %lld\n",
               o->lr, (long long)t->batch, (long long)o->reference_batch);
    else
        printf("lr              = %g   -- optimizer.lr (no reference_batch: not scaled)\n", o->lr);
    if (t->auto_micro_batch)
        printf("micro_batch     = auto -- the largest that fits the device, chosen when the run "
               "starts (trainrun plan shows the memory per sample)\n");
    else
        printf("accumulation    = %lld micro-batch(es) of %lld per step%s\n",
               (long long)(t->batch / t->micro_batch / ranks), (long long)t->micro_batch,
               ranks > 1 ? " on each rank" : "");
    if (t->length_from == TR_LENGTH_TOKENS)
        printf("steps           = %lld   -- from train.tokens\n", (long long)t->steps);
    else if (t->length_from == TR_LENGTH_EPOCHS)
        printf("steps           = from train.epochs, counted when the run reads the data "
               "(trainrun plan counts them)\n");
    else if (t->length_from == TR_LENGTH_TIME)
        printf("steps           = until train.time ends the run\n");
    if (d->seq_len > 0) {
        double per_step = (double)t->batch * (double)d->seq_len;
        printf("tokens/step     = %.0f   -- batch %lld x %lld tokens\n", per_step,
               (long long)t->batch, (long long)d->seq_len);
        if (t->length_from == TR_LENGTH_STEPS || t->length_from == TR_LENGTH_TOKENS)
            printf("tokens in all   = %.0f   -- %lld steps\n", per_step * (double)t->steps,
                   (long long)t->steps);
    }
}

static int cmd_show(int argc, char **argv)
{
    if (argc < 3) {
        usage(stderr);
        return TR_EXIT_USAGE;
    }
    const char **overrides;
    int n;
    if (collect_overrides(argc, argv, 3, &overrides, &n) != 0) {
        free(overrides);
        return TR_EXIT_USAGE;
    }
    struct tr_config cfg;
    tr_err err = {{0}};
    int code = TR_EXIT_OK;
    struct show_derived d;
    if (tr_config_load(&cfg, argv[2], overrides, n, &err) != TR_OK ||
        show_check(&cfg, &d, &err) != TR_OK) {
        fprintf(stderr, "trainrun: error: %s\n", err.msg);
        code = TR_EXIT_ERROR;
    } else {
        tr_record_print(&cfg, stdout);
        show_print_derived(&cfg, &d);
    }
    tr_config_free(&cfg);
    free(overrides);
    return code;
}

static void report_broken(const char *file, const char *why)
{
    fprintf(stderr, "trainrun: warning: skipping %s: %s\n", file, why);
}

static int cmd_plugins(int argc, char **argv)
{
    enum tr_plugin_kind only = 0;
    if (argc > 2 && !tr_kind_from_name(argv[2], &only)) {
        fprintf(stderr, "trainrun: error: no plugin kind '%s' (precision, data, checkpoint, "
                        "schedule, comm)\n", argv[2]);
        return TR_EXIT_USAGE;
    }
    if (argc > 3) {
        fprintf(stderr, "trainrun: error: plugins takes at most one KIND, not '%s'\n", argv[3]);
        return TR_EXIT_USAGE;
    }
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, tr_install_paths()->plugin_dir);
    struct tr_plugin **list;
    int n = tr_plugin_list(&sp, &list, report_broken);
    printf("plugin search path:");
    for (int i = 0; i < sp.n; i++)
        printf(" %s", sp.dirs[i]);
    printf("\n");
    int last_kind = -1;
    for (int i = 0; i < n; i++) {
        const struct tr_plugin_info *info = list[i]->info;
        if (only && info->kind != only)
            continue;
        if ((int)info->kind != last_kind && info->kind == TR_KIND_LOGGER) { /* a list */
            printf("\nlogger plugins  (recipe: logger = { \"jsonl\", \"NAME\", { plugin = \"NAME\", "
                   "option = value, ... } })\n  \"jsonl\" is the run's metrics.jsonl, built in and "
                   "always written; docs/logging.md\n");
            last_kind = (int)info->kind;
        }
        if ((int)info->kind != last_kind) {
            printf("\n%s plugins  (recipe: %s = { plugin = \"NAME\", option = value, ... })\n",
                   tr_kind_name(info->kind), tr_kind_name(info->kind));
            if (info->kind == TR_KIND_PRECISION) /* the part of a policy no option shows */
                printf("  Every backend keeps master weights, optimizer state and gradients "
                       "in fp32; a\n  policy picks the GEMM input dtype (fp32, bf16 or fp16), "
                       "which 16-bit ones also\n  store the activations in (the logits stay "
                       "fp32), and the loss scale.\n  A policy asking for more (master or grad "
                       "other than fp32, tf32 off\n  device=cuda) is refused when the run or plan starts.\n");
            last_kind = (int)info->kind;
        }
        printf("\n  %s %s — %s\n    %s\n", info->name, info->version ? info->version : "",
               info->description ? info->description : "", list[i]->path);
        if (info->options && info->options->type != TR_OPT_END)
            tr_options_help(info->options, stdout, "    ");
        else
            printf("    (no options)\n");
        tr_plugin_close(list[i]);
    }
    free(list);
    tr_plugin_path_free(&sp);
    return TR_EXIT_OK;
}

static void sample_help(FILE *out)
{
    fprintf(out,
            "usage: trainrun sample CHECKPOINT [key.sub=value ...] [flags]\n"
            "       trainrun sample RECIPE [key.sub=value ...] [flags]\n"
            "\n"
            "Text from a language model, one token at a time, read-only (it can open a running\n"
            "run).  CHECKPOINT is a run directory, its checkpoints directory (both through\n"
            "LATEST) or one checkpoint; RECIPE a recipe whose model = { from = DIR } gives\n"
            "the weights.\n"
            "\n"
            "Text goes through the tokenizer the model learnt, the first found of: the run\n"
            "directory's tokenizer.json (a run records its data's tokenizer there when it\n"
            "starts; a char-tokenized text run records its character table as one), DIR's\n"
            "tokenizer.json of model = { from = DIR }, the tokenizer the data reports.  The\n"
            "prompt is encoded with it (after the tokenizer's BOS, if it has one) and each\n"
            "token is printed as its bytes as it is sampled, until the tokenizer's EOS.\n"
            "Without a tokenizer (byte-tokenized runs) every token is one byte.  stderr\n"
            "names the tokenizer used.\n"
            "\n"
            "  --prompt TEXT      the text to continue (default: a newline; empty: from the\n"
            "                     tokenizer's BOS, else its EOS, as a new document starts)\n"
            "  --tokens N         tokens to sample at most (default 200)\n"
            "  --temperature T    softmax temperature (default 0.8)\n"
            "  --top-k K          sample among the K likeliest tokens (default 0: all)\n"
            "  --seed N           the generator's seed: the same flags give the same text\n"
            "  --ids              the prompt is token ids (\"15496 11 995\") and the output too,\n"
            "                     the EOS included when sampled\n"
            "  --ignore-eos       sample all N tokens, past the EOS\n"
            "  --recipe FILE      with a CHECKPOINT: the recipe to build the model from,\n"
            "                     instead of the one the checkpoint recorded\n");
}

/* trainrun sample CHECKPOINT|RECIPE [key=value ...] [flags]: a checkpoint is
 * a directory (a run's, its checkpoints', or one checkpoint), a recipe a
 * file, whose model = { from = DIR } gives the weights. */
static int cmd_sample(int argc, char **argv)
{
    struct tr_sample_flags f = {.prompt = "\n", .tokens = 200, .temperature = 0.8, .top_k = 0, .seed = 1};
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            sample_help(stdout);
            return TR_EXIT_OK;
        }
    if (argc < 3 || argv[2][0] == '-') {
        usage(stderr);
        return TR_EXIT_USAGE;
    }
    struct stat st;
    const char *recipe = stat(argv[2], &st) == 0 && S_ISREG(st.st_mode) ? argv[2] : NULL;
    if (!recipe)
        f.checkpoint = argv[2];
    const char **overrides = tr_xcalloc((size_t)argc, sizeof *overrides);
    f.overrides = overrides;
    int rc = TR_EXIT_USAGE;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-' && strchr(a, '=')) {
            if (!override_syntax_ok(a, "sample: "))
                goto done;
            overrides[f.n_overrides++] = a;
            continue;
        }
        if (strcmp(a, "--ids") == 0) {
            f.ids = 1;
            continue;
        }
        if (strcmp(a, "--ignore-eos") == 0) {
            f.ignore_eos = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "trainrun: error: %s needs a value\n", a);
            return TR_EXIT_USAGE;
        }
        long long n = 0;
        int bad = 0;
        if (strcmp(a, "--prompt") == 0)
            f.prompt = v;
        else if (strcmp(a, "--tokens") == 0)
            bad = flag_int(a, v, 0, 1000000, &n), f.tokens = (int)n;
        else if (strcmp(a, "--temperature") == 0)
            bad = flag_positive(a, v, &f.temperature);
        else if (strcmp(a, "--top-k") == 0)
            bad = flag_int(a, v, 0, 1 << 24, &n), f.top_k = (int)n;
        else if (strcmp(a, "--seed") == 0)
            bad = flag_u64(a, v, &f.seed);
        else if (strcmp(a, "--recipe") == 0 && !recipe)
            f.recipe = v;
        else if (strcmp(a, "--recipe") == 0) {
            fprintf(stderr, "trainrun: error: sample: --recipe goes with a checkpoint, and %s is a "
                    "recipe already\n", recipe);
            goto done;
        } else {
            fprintf(stderr, "trainrun: error: unknown flag '%s' for sample\n", a);
            goto done;
        }
        if (bad)
            goto done;
        i++;
    }
    if (recipe)
        f.recipe = recipe;
    rc = tr_sample(&f);
done:
    free(overrides);
    return rc;
}

static int cmd_export(int argc, char **argv)
{
    const char *out = NULL, *dtype_name = "bf16", *format = "safetensors";
    if (argc < 3) {
        usage(stderr);
        return TR_EXIT_USAGE;
    }
    for (int i = 3; i < argc; i++) {
        int takes_value = strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0 ||
                          strcmp(argv[i], "--dtype") == 0 || strcmp(argv[i], "--format") == 0;
        if (takes_value && i + 1 >= argc) {
            fprintf(stderr, "trainrun: error: %s needs a value (see trainrun help)\n", argv[i]);
            return TR_EXIT_USAGE;
        }
        if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0)
            out = argv[++i];
        else if (strcmp(argv[i], "--dtype") == 0)
            dtype_name = argv[++i];
        else if (strcmp(argv[i], "--format") == 0)
            format = argv[++i];
        else {
            fprintf(stderr, "trainrun: error: unknown argument '%s' for export\n", argv[i]);
            return TR_EXIT_USAGE;
        }
    }
    enum tr_dtype dtype;
    if (strcmp(dtype_name, "bf16") == 0)
        dtype = TR_BF16;
    else if (strcmp(dtype_name, "fp16") == 0)
        dtype = TR_F16;
    else if (strcmp(dtype_name, "fp32") == 0)
        dtype = TR_F32;
    else {
        fprintf(stderr, "trainrun: error: --dtype takes bf16, fp16 or fp32, not '%s'\n", dtype_name);
        return TR_EXIT_USAGE;
    }
    int hf = strcmp(format, "hf") == 0;
    if (!hf && strcmp(format, "safetensors") != 0) {
        fprintf(stderr, "trainrun: error: --format takes safetensors (one file of trainrun's "
                "weights) or hf (a Hugging Face model directory), not '%s'\n", format);
        return TR_EXIT_USAGE;
    }
    if (!out) {
        fprintf(stderr, "trainrun: error: export needs -o %s\n", hf ? "DIR" : "FILE.safetensors");
        return TR_EXIT_USAGE;
    }
    tr_err err = {{0}};
    char *dir = NULL, *name = NULL;
    int code = TR_EXIT_OK;
    if (tr_checkpoint_resolve(argv[2], &dir, &name, &err) != TR_OK) {
        code = TR_EXIT_ERROR;
    } else {
        char *path = tr_xasprintf("%s/%s", dir, name);
        if ((hf ? tr_export_hf(path, dtype, out, &err) : tr_export_weights(path, dtype, out, &err)) != TR_OK)
            code = TR_EXIT_ERROR;
        else if (hf)
            fprintf(stderr, "trainrun: wrote %s/config.json and %s/model.safetensors (%s weights of "
                    "%s); load it with transformers' from_pretrained, or model = { from = ... }\n",
                    out, out, dtype_name, path);
        else
            fprintf(stderr, "trainrun: wrote %s (%s weights of %s)\n", out, dtype_name, path);
        free(path);
    }
    if (code != TR_EXIT_OK)
        fprintf(stderr, "trainrun: error: %s\n", err.msg);
    free(dir);
    free(name);
    return code;
}

/*
 * How OpenMP's idle threads wait between parallel regions.  A step runs
 * hundreds of short regions (every GEMM, every elementwise op), and a thread
 * that sleeps at once between them (OMP_WAIT_POLICY=passive) costs 60-90 us
 * to wake for the next one on a virtual machine: 2 threads, an empty region
 * of 20 us of work took 70 us passive and 20-27 us with a short spin (Zen 4).
 * Spinning long (libgomp's default spins some 300000 iterations, about 12 ms
 * on that CPU, then sleeps; OMP_WAIT_POLICY=active never sleeps) steals the
 * cores from the threads doing work -- the loader, the checkpoint writer,
 * other processes.  So trainrun asks for a short spin, about 0.2-0.5 ms
 * (libgomp: GOMP_SPINCOUNT=10000; LLVM's libomp: KMP_BLOCKTIME=1, in ms),
 * then sleep.  Measured on the 2-core Zen 4 (docs/results.md, "How idle
 * threads wait"): the KJV recipe's 100 steps 16.1-16.7 s passive against
 * 15.0-15.2 s; its 60 steps with two busy loops on both cores 26.3-26.4 s
 * passive, 19.3-22.1 s with the short spin, 30.7-34.8 s with libgomp's
 * default spin.  libgomp reads the settings before main(), so set them and
 * start again, once, unless the user chose (any of tr_openmp_waits, in
 * doctor.c with the values, set in the environment).
 */
static void prefer_short_spin_openmp(char **argv)
{
    for (int i = 0; i < TR_OPENMP_WAITS; i++)
        if (getenv(tr_openmp_waits[i].name) != NULL)
            return;
    for (int i = 0; i < TR_OPENMP_WAITS; i++)
        if (tr_openmp_waits[i].short_spin != NULL)
            setenv(tr_openmp_waits[i].name, tr_openmp_waits[i].short_spin, 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the runtime's default policy */
}

/* --plugin-path DIR (or --plugin-path=DIR), anywhere on the command line and
 * repeatable: the user's own plugin directories, searched after the built-in
 * one and before TRAINRUN_PLUGIN_PATH's.  They are taken out of argv and
 * passed on through TRAINRUN_PLUGIN_PATH, so that every command and every
 * rank a launcher starts sees them.  Returns the new argc, or -1. */
static int take_plugin_paths(int argc, char **argv)
{
    char *dirs = NULL;
    int out = 1;
    for (int i = 1; i < argc; i++) {
        const char *dir = NULL;
        if (strcmp(argv[i], "--plugin-path") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "trainrun: error: --plugin-path needs a directory\n");
                free(dirs);
                return -1;
            }
            dir = argv[++i];
        } else if (strncmp(argv[i], "--plugin-path=", 14) == 0) {
            dir = argv[i] + 14;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        struct stat st;
        if (!*dir || strchr(dir, ':') || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "trainrun: error: --plugin-path '%s' is not a directory%s\n", dir,
                    strchr(dir, ':') ? " (give one directory per --plugin-path)" : "");
            free(dirs);
            return -1;
        }
        char abs[PATH_MAX];
        if (realpath(dir, abs)) /* ranks and plugins see the same directory */
            dir = abs;
        char *more = dirs ? tr_xasprintf("%s:%s", dirs, dir) : tr_xstrdup(dir);
        free(dirs);
        dirs = more;
    }
    argv[out] = NULL;
    if (dirs) {
        const char *env = getenv("TRAINRUN_PLUGIN_PATH");
        char *path = env && *env ? tr_xasprintf("%s:%s", dirs, env) : tr_xstrdup(dirs);
        setenv("TRAINRUN_PLUGIN_PATH", path, 1);
        free(path);
        free(dirs);
    }
    return out;
}

static const char *const commands[] = {"run",    "show",   "plan",   "plugins", "sample",
                                       "export", "eval", "prepare", "report", "topo",    "doctor",
                                       "help",   "version", NULL};

/* `trainrun shwo x.lua` is a mistyped command, not a recipe named "shwo":
 * a recipe is an existing file, or a name ending in .lua or holding a '/'. */
static int looks_like_recipe(const char *arg)
{
    size_t n = strlen(arg);
    return access(arg, F_OK) == 0 || strchr(arg, '/') ||
           (n > 4 && strcmp(arg + n - 4, ".lua") == 0);
}

int main(int argc, char **argv)
{
    prefer_short_spin_openmp(argv);
    argc = take_plugin_paths(argc, argv);
    if (argc < 0)
        return TR_EXIT_USAGE;
    /* commands mark the arguments they consume; the launcher needs them as given */
    original_argv = tr_xcalloc((size_t)argc + 1, sizeof *original_argv);
    memcpy(original_argv, argv, (size_t)argc * sizeof *argv);
    if (argc < 2) {
        usage(stderr);
        return TR_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        if (argc > 2 && strcmp(argv[2], "recipe") == 0)
            tr_config_help(stdout);
        else if (argc > 2 && strcmp(argv[2], "eval") == 0)
            tr_eval_help(stdout);
        else if (argc > 2 && strcmp(argv[2], "sample") == 0)
            sample_help(stdout);
        else if (argc > 2 && strcmp(argv[2], "prepare") == 0)
            tr_prepare_help(stdout);
        else
            usage(stdout);
        return TR_EXIT_OK;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0 ||
        strcmp(cmd, "doctor") == 0) {
        if (argc > 2) {
            fprintf(stderr, "trainrun: error: %s takes no arguments, not '%s'\n", cmd, argv[2]);
            return TR_EXIT_USAGE;
        }
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("trainrun %s (plugin ABI %d)\n", PACKAGE_VERSION, TR_ABI_MAJOR);
        return TR_EXIT_OK;
    }
    if (strcmp(cmd, "show") == 0)
        return cmd_show(argc, argv);
    if (strcmp(cmd, "plugins") == 0)
        return cmd_plugins(argc, argv);
    if (strcmp(cmd, "sample") == 0)
        return cmd_sample(argc, argv);
    if (strcmp(cmd, "export") == 0)
        return cmd_export(argc, argv);
    if (strcmp(cmd, "eval") == 0)
        return tr_eval_main(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0) {
        for (int i = 3; i < argc; i++) { /* plan parses the rest itself */
            long long gpus;
            int bad = strncmp(argv[i], "gpus=", 5) == 0
                          ? flag_int("gpus=N", argv[i] + 5, 1, 1048576, &gpus) != 0
                          : argv[i][0] != '-' && strchr(argv[i], '=') &&
                                !override_syntax_ok(argv[i], "plan: ");
            if (bad)
                return TR_EXIT_USAGE;
        }
        return tr_plan_main(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "topo") == 0)
        return tr_topo_main(argc - 1, argv + 1);
    if (strcmp(cmd, "doctor") == 0) {
        struct tr_plugin_path search;
        tr_plugin_path_init(&search, tr_install_paths()->plugin_dir);
        int problems = tr_doctor(stdout, &search);
        tr_plugin_path_free(&search);
        return problems ? TR_EXIT_ERROR : TR_EXIT_OK;
    }
    if (strcmp(cmd, "report") == 0)
        return tr_report_main(argc - 1, argv + 1);
    if (strcmp(cmd, "prepare") == 0)
        return tr_prepare_main(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0) {
        if (argc < 3) {
            usage(stderr);
            return TR_EXIT_USAGE;
        }
        return cmd_run(argc, argv, 2);
    }
    if (strcmp(cmd, "--smoke") == 0) {
        if (argc < 3 || argv[2][0] == '-') {
            fprintf(stderr, "trainrun: error: --smoke needs a recipe: trainrun --smoke "
                            "RECIPE.lua\n");
            return TR_EXIT_USAGE;
        }
        argv[1] = argv[2]; /* trainrun --smoke recipe.lua ... */
        argv[2] = "--smoke";
        return cmd_run(argc, argv, 1);
    }
    if (strcmp(cmd, "--resume") == 0 || strcmp(cmd, "--quiet") == 0) {
        fprintf(stderr, "trainrun: error: %s goes after the recipe: trainrun RECIPE.lua %s\n", cmd,
                strcmp(cmd, "--resume") == 0 ? "--resume auto" : "--quiet");
        return TR_EXIT_USAGE;
    }
    if (cmd[0] == '-') {
        fprintf(stderr, "trainrun: error: unknown flag '%s'\n", cmd);
        usage(stderr);
        return TR_EXIT_USAGE;
    }
    if (!looks_like_recipe(cmd)) {
        const char *hint = tr_suggest(cmd, commands, TR_ARRAY_LEN(commands) - 1);
        if (strchr(cmd, '='))
            fprintf(stderr, "trainrun: error: '%s' is an override, but no recipe comes before "
                            "it: trainrun RECIPE.lua %s\n", cmd, cmd);
        else if (hint)
            fprintf(stderr, "trainrun: error: unknown command '%s' (did you mean '%s'?)\n", cmd,
                    hint);
        else
            fprintf(stderr, "trainrun: error: '%s' is neither a command nor a recipe file (see "
                            "trainrun help)\n", cmd);
        return TR_EXIT_USAGE;
    }
    return cmd_run(argc, argv, 1);
}
