/* `trainrun eval`: the command line and the report of an evaluation; the
 * evaluation itself is the engine's (tr_eval, core/engine/evaluate.c), the
 * same code a run evaluates with. */
#include "eval.h"

#include "../engine/run.h"
#include "../util/json.h"
#include "../util/util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tr_eval_help(FILE *out)
{
    fprintf(out,
            "usage: trainrun eval RECIPE [key.sub=value ...] [--checkpoint PATH]\n"
            "                     [--split val|train] [--batches N|all] [--json]\n"
            "                     [--logits FILE.safetensors]\n"
            "       trainrun eval --checkpoint PATH [key.sub=value ...] [...]\n"
            "                     (the recipe the checkpoint's run recorded)\n"
            "\n"
            "The loss (mean cross-entropy in nats per predicted token, or per sample for a\n"
            "classifier), the perplexity exp(loss) and the accuracy of the model RECIPE\n"
            "describes, on the first micro-batches of a split, without training and without\n"
            "writing anything (no run directory, lock, metrics or checkpoint).  For text data\n"
            "whose bytes per token are known (the text plugin, shards from trainrun prepare)\n"
            "also the loss in nats per byte, which compares models with different tokenizers.\n"
            "\n"
            "The weights: a checkpoint's with --checkpoint; else the recipe's\n"
            "model = { from = DIR }; else freshly initialised from train.seed, with a warning\n"
            "(an untrained language model's loss is near ln(vocab)).\n"
            "\n"
            "  --checkpoint PATH  a run directory, its checkpoints directory (both through\n"
            "                     LATEST) or one checkpoint, as sample and export take; it is\n"
            "                     verified first.  With the recipe its run trained from, the\n"
            "                     run's overrides (state.json) apply before the command line's,\n"
            "                     so the model is the one saved\n"
            "  --split val|train  the validation split (default) or the training split, read\n"
            "                     in order from its start\n"
            "  --batches N|all    micro-batches to evaluate (default: train.eval_batches, what\n"
            "                     the run evaluates); all: the whole split\n"
            "  --json             one JSON object on stdout: recipe, weights (fresh, from or\n"
            "                     checkpoint), source, step, split, batches, split_batches,\n"
            "                     micro_batch, samples, tokens (sequence models), loss,\n"
            "                     perplexity, loss_per_byte (null when not known),\n"
            "                     accuracy (null when not counted), device,\n"
            "                     precision, seconds\n"
            "  --logits FILE      the first micro-batch evaluated, as safetensors: input_ids\n"
            "                     and labels (I32 [micro_batch, T]) and logits (F32\n"
            "                     [micro_batch, T, vocab]), to compare with a reference\n"
            "                     (e.g. transformers' model(input_ids).logits)\n"
            "\n"
            "It evaluates as the run does (the same code): the micro-batches of\n"
            "train.micro_batch samples, device, precision and train.threads of the recipe.\n"
            "For a checkpoint of step S the loss is the validation loss the run logged at\n"
            "step S (metrics.jsonl, \"val_loss\").\n"
            "\n"
            "Examples:\n"
            "  trainrun eval recipes/kjv-char.lua --checkpoint runs/kjv-char\n"
            "  trainrun eval recipes/kjv-char.lua --batches all --json\n"
            "  trainrun eval finetune.lua precision=bf16     (model = { from = \"hf/model\" })\n"
            "\n"
            "Exit codes: 0 done, 1 error (no validation split, a checkpoint that is missing,\n"
            "damaged or of another model), 2 usage.\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "trainrun: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (trainrun help eval)\n");
    va_end(ap);
    return TR_EXIT_USAGE;
}

/* --flag VALUE or --flag=VALUE: the value, and *i past it; NULL when absent. */
static const char *flag_value(int argc, char **argv, int *i, const char *flag, int *missing)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static void print_json(const struct tr_eval_result *e, int train_split)
{
    static const char *const weights[] = {"fresh", "from", "checkpoint"};
    printf("{\"recipe\": ");
    tr_json_write_string(stdout, e->recipe);
    printf(", \"weights\": \"%s\", \"source\": ", weights[e->weights]);
    if (e->weights == TR_EVAL_FRESH)
        printf("null");
    else
        tr_json_write_string(stdout, e->source);
    if (e->weights == TR_EVAL_CHECKPOINT)
        printf(", \"step\": %llu", (unsigned long long)e->step);
    printf(", \"split\": \"%s\", \"batches\": %llu, \"split_batches\": %llu, \"micro_batch\": %lld, "
           "\"samples\": %llu",
           train_split ? "train" : "val", (unsigned long long)e->batches,
           (unsigned long long)e->split_batches, (long long)e->micro_batch,
           (unsigned long long)e->samples);
    if (e->sequence)
        printf(", \"tokens\": %llu", (unsigned long long)e->tokens);
    /* %.9g: a float's every digit, so scripts compare with what the run logged */
    printf(", \"loss\": %.9g, \"perplexity\": %.9g, \"loss_per_byte\": ", e->loss, exp(e->loss));
    if (e->bytes_per_token > 0)
        printf("%.9g", e->loss / e->bytes_per_token);
    else
        printf("null");
    printf(", \"accuracy\": ");
    if (isnan(e->accuracy))
        printf("null");
    else
        printf("%.9g", e->accuracy);
    printf(", \"device\": ");
    tr_json_write_string(stdout, e->device);
    printf(", \"precision\": ");
    tr_json_write_string(stdout, e->precision);
    printf(", \"seconds\": %.3f}\n", e->seconds);
}

static void print_text(const struct tr_eval_result *e, int train_split)
{
    printf("eval %s", e->recipe);
    if (e->weights == TR_EVAL_CHECKPOINT)
        printf(", weights of %s (step %llu)\n", e->source, (unsigned long long)e->step);
    else if (e->weights == TR_EVAL_FROM)
        printf(", weights from %s\n", e->source);
    else
        printf(", fresh weights (train.seed = %lld)\n", (long long)e->seed);
    printf("  %s split: %llu micro-batches of %lld samples (of its %llu): %llu samples",
           train_split ? "training" : "validation", (unsigned long long)e->batches,
           (long long)e->micro_batch, (unsigned long long)e->split_batches,
           (unsigned long long)e->samples);
    if (e->sequence)
        printf(", %llu tokens", (unsigned long long)e->tokens);
    printf(" (device %s, precision %s, %.1f s)\n", e->device, e->precision, e->seconds);
    printf("  loss %.6g nats per %s", e->loss, e->sequence ? "token" : "sample");
    if (e->bytes_per_token > 0) /* text: comparable across tokenizers */
        printf(" (%.6g nats per byte, %.4g bytes per token)", e->loss / e->bytes_per_token,
               e->bytes_per_token);
    printf(", perplexity %.6g", exp(e->loss));
    if (!isnan(e->accuracy))
        printf(", accuracy %.2f%%", 100 * e->accuracy);
    printf("\n");
}

/* --batches N|all; -1 when read, else the usage exit. */
static int parse_batches(const char *v, uint64_t *batches)
{
    char *end;
    errno = 0;
    unsigned long long b = strtoull(v, &end, 10);
    if (strcmp(v, "all") == 0) {
        *batches = UINT64_MAX;
    } else if (v[0] < '0' || v[0] > '9' || *end || errno || b == 0) {
        return usage_error("--batches takes a number of micro-batches from 1, or all, "
                           "not '%s'", v);
    } else {
        *batches = b;
    }
    return -1;
}

/* An argument that is not a flag: an override or the recipe; -1
 * when taken, else the usage exit. */
static int take_operand(const char *a, struct tr_eval_flags *fl, const char **overrides)
{
    if (strchr(a, '=')) {
        if (a[0] == '=')
            return usage_error("'%s' is not an override: the key before '=' is empty", a);
        overrides[fl->n_overrides++] = a;
    } else if (!fl->recipe) {
        fl->recipe = a;
    } else {
        return usage_error("eval takes one recipe; '%s' is a second (overrides are "
                           "key.sub=value)", a);
    }
    return -1;
}

/* eval's arguments into fl and *json; -1 when the evaluation is to run,
 * else the exit status (--help, or a usage error). */
static int parse_args(int argc, char **argv, struct tr_eval_flags *fl, int *json,
                      const char **overrides)
{
    int code = -1;
    for (int i = 1; i < argc && code < 0; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if ((v = flag_value(argc, argv, &i, "--checkpoint", &missing))) {
            fl->checkpoint = v;
        } else if ((v = flag_value(argc, argv, &i, "--split", &missing))) {
            if (strcmp(v, "train") != 0 && strcmp(v, "val") != 0)
                return usage_error("--split takes val or train, not '%s'", v);
            fl->train_split = strcmp(v, "train") == 0;
        } else if ((v = flag_value(argc, argv, &i, "--batches", &missing))) {
            code = parse_batches(v, &fl->batches);
        } else if ((v = flag_value(argc, argv, &i, "--logits", &missing))) {
            if (!*v)
                return usage_error("--logits needs a file name");
            fl->logits = v;
        } else if (missing) {
            return usage_error("%s needs a value", a);
        } else if (strcmp(a, "--json") == 0) {
            *json = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            tr_eval_help(stdout);
            return TR_EXIT_OK;
        } else if (a[0] == '-') {
            return usage_error("unknown flag '%s' for eval", a);
        } else {
            code = take_operand(a, fl, overrides);
        }
    }
    if (code < 0 && !fl->recipe && !fl->checkpoint)
        return usage_error("eval needs a recipe: trainrun eval RECIPE [--checkpoint PATH]");
    return code;
}

/* Evaluating fresh weights is allowed, and said: with the loss to expect. */
static void warn_fresh(const struct tr_eval_result *e)
{
    char hint[128] = "";
    if (e->classes > 1)
        snprintf(hint, sizeof hint, ": an untrained model's loss is near ln(%u) = %.4f",
                 e->classes, log((double)e->classes));
    tr_log(TR_LOG_WARN, NULL, "no trained weights: the model is freshly initialised from "
           "train.seed = %lld%s (evaluate a checkpoint with --checkpoint PATH, or load "
           "weights with model = { from = DIR })", (long long)e->seed, hint);
}

int tr_eval_main(int argc, char **argv)
{
    struct tr_eval_flags fl = {0};
    int json = 0;
    const char **overrides = tr_xcalloc((size_t)argc + 1, sizeof *overrides);
    int code = parse_args(argc, argv, &fl, &json, overrides);
    if (code >= 0) {
        free(overrides);
        return code;
    }
    fl.overrides = overrides;
    struct tr_eval_result e;
    tr_err err = {{0}};
    if (tr_eval(&fl, &e, &err) != TR_OK) {
        fprintf(stderr, "trainrun: error: %s\n", err.msg);
        free(overrides);
        return TR_EXIT_ERROR;
    }
    if (e.weights == TR_EVAL_FRESH)
        warn_fresh(&e);
    if (json)
        print_json(&e, fl.train_split);
    else
        print_text(&e, fl.train_split);
    free(overrides);
    return TR_EXIT_OK;
}
