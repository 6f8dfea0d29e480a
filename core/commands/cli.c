/* The command line's usage text and its strict reading of overrides and
 * flags (cli.h). */
#include "cli.h"
#include "../engine/run.h"
#include "../util/util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void tr_cli_usage(FILE *out)
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
            "                       [--chat] [--system TEXT] [--eos TOKEN] [--ignore-eos]\n"
            "                       [--no-cache]\n"
            "                                                    text from a run's checkpoint (read-only,\n"
            "                                                    also of a running run) or a recipe's\n"
            "                                                    model = { from = DIR } weights, through\n"
            "                                                    the run's tokenizer (help sample)\n"
            "       trainrun eval RECIPE [key=value ...] [--checkpoint PATH] [--split val|train]\n"
            "                     [--batches N|all] [--json] [--logits FILE]\n"
            "                                                    validation loss, perplexity and\n"
            "                                                    accuracy, without training (help eval)\n"
            "       trainrun export CHECKPOINT --dtype bf16|fp16|fp32 -o FILE.safetensors\n"
            "       trainrun export CHECKPOINT --format hf [--dtype bf16|fp16|fp32] -o DIR\n"
            "                                                    a Hugging Face model directory (config.json,\n"
            "                                                    model.safetensors, the run's tokenizer,\n"
            "                                                    generation_config.json) of a llama or gpt\n"
            "                                                    run; bf16 by default (a warning says when\n"
            "                                                    that rounds fp32 weights)\n"
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
int tr_cli_override_ok(const char *arg, const char *command)
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
int tr_cli_overrides(int argc, char **argv, int first, const char ***overrides, int *n)
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
        if (!tr_cli_override_ok(argv[i], ""))
            return -1;
        (*overrides)[(*n)++] = argv[i];
    }
    return 0;
}

/* Strict numbers for flags: all of the text, within [lo, hi]; atoi would
 * turn "abc" into 0 and "10x" into 10 without a word. */
int tr_cli_flag_int(const char *flag, const char *text, long long lo, long long hi, long long *out)
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

int tr_cli_flag_u64(const char *flag, const char *text, uint64_t *out)
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

/* --temperature: 0 is a value of its own (greedy), so 0 or more */
int tr_cli_flag_temperature(const char *flag, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || !(v >= 0)) {
        fprintf(stderr, "trainrun: error: %s takes a number of 0 or more (0: greedy, the "
                "likeliest token each time), not '%s'\n", flag, text);
        return -1;
    }
    *out = v;
    return 0;
}

int tr_cli_flag_positive(const char *flag, const char *text, double *out)
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
