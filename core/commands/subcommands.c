/* The subcommands main.c runs itself: show (the resolved recipe and what a
 * run derives from it), plugins, sample and export (cli.h). */
#include "cli.h"
#include "../config/run_config.h"
#include "../config/options.h"
#include "../config/precision.h"
#include "../config/record.h"
#include "../engine/graph.h"
#include "../engine/model.h"
#include "../engine/plugin_calls.h"
#include "plan.h"
#include "prepare.h"
#include "report.h"
#include "../engine/checkpoint.h"
#include "../engine/peft.h"
#include "../engine/merge.h"
#include "../engine/run.h"
#include "../engine/rundir.h"
#include "../config/hf_config.h"
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

/* What show learns by checking the recipe as a run would. */
struct show_derived {
    int64_t seq_len;  /* tokens per sample; 0: not a sequence model */
    int64_t params;
};

/* model = { from = DIR } with a DIR/tokenizer.json: the data must be that
 * tokenizer's ids (not bytes, not another tokenizer's), which a run checks
 * as soon as it opens the data; show opens it for that alone.  Data that
 * cannot be opened yet (not prepared) gets a note: show still shows. */
static int show_check_data(struct tr_config *cfg, const struct tr_graph *g, uint32_t seq,
                           tr_err *err)
{
    const char *dir = tr_hf_from_dir(cfg->recipe);
    if (!dir)
        return TR_OK;
    char *path = tr_xasprintf("%s/tokenizer.json", dir);
    struct stat st;
    int has = stat(path, &st) == 0;
    free(path);
    if (!has)
        return TR_OK;
    tr_err why = {{0}};
    struct tr_data_info di;
    if (tr_config_create_slot(cfg, &cfg->data, seq, &why) != TR_OK ||
        tr_data_info_of(&cfg->data, &di, &why) != TR_OK) {
        fprintf(stderr, "trainrun: note: the data is not checked against the tokenizer of %s "
                "(it cannot be opened: %s)\n", dir, why.msg);
        return TR_OK;
    }
    return tr_check_data_tokenizer(cfg, g, cfg->data.plugin->info->name, &di, 0, err);
}

/* The checks a run makes before its first step that need no data, device
 * or run directory: the model is built by its builder (unknown or bad model
 * options fail here, at their file:line), and the precision and schedule
 * plugins are created (their cross-option rules) and the precision policy
 * refused where a run refuses it.  The data and checkpoint plugins are not
 * created: they open files. */
static int show_check(struct tr_config *cfg, struct show_derived *d, tr_err *err)
{
    memset(d, 0, sizeof *d);
    /* the graph a run builds, adapters and all: a lora mistake fails here too
     * (the base's storage type is the run's business, not show's) */
    struct tr_graph *g = tr_model_build_run(cfg, (int)cfg->train.micro_batch, TR_F32, err);
    if (!g)
        return TR_ERROR;
    const struct tr_tensor *in = &g->tensors[g->inputs[0]];
    d->seq_len = in->dtype == TR_I32 && in->ndim == 2 ? in->shape[1] : 0;
    struct tr_flops f;
    tr_graph_count_flops(g, &f);
    d->params = (int64_t)f.params;
    int rc = show_check_data(cfg, g, (uint32_t)d->seq_len, err);
    tr_graph_free(g, NULL);
    if (rc != TR_OK)
        return TR_ERROR;
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
    struct tr_precision_policy pol;
    tr_precision_policy_of(&cfg->precision, &pol);
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
    int64_t ranks = tr_config_ranks(cfg);
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

int tr_cmd_show(int argc, char **argv)
{
    if (argc < 3) {
        tr_cli_usage(stderr);
        return TR_EXIT_USAGE;
    }
    const char **overrides;
    int n;
    if (tr_cli_overrides(argc, argv, 3, &overrides, &n) != 0) {
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

int tr_cmd_plugins(int argc, char **argv)
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

void tr_sample_help(FILE *out)
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
            "prompt is encoded with it (after the tokenizer's BOS, if it has one, except\n"
            "before a prompt that starts with the chat template's BOS or turn opener, as\n"
            "transformers' apply_chat_template adds none) and each token is printed as its\n"
            "bytes as it is sampled, until an EOS: the chat template's end of turn\n"
            "(<|im_end|>, <|eot_id|>) and the tokenizer's EOS, or --eos's alone.  Without a\n"
            "tokenizer (byte-tokenized runs) every token is one byte.  stderr names the\n"
            "tokenizer used and the EOS.\n"
            "\n"
            "  --prompt TEXT      the text to continue (default: a newline; empty: from the\n"
            "                     tokenizer's BOS, else its EOS, as a new document starts)\n"
            "  --tokens N         tokens to sample at most (default 200)\n"
            "  --temperature T    softmax temperature (default 0.8); 0 is greedy: the\n"
            "                     likeliest token each time (the first of equals), no\n"
            "                     draw, so --seed and --top-k change nothing\n"
            "  --top-k K          sample among the K likeliest tokens (default 0: all)\n"
            "  --seed N           the generator's seed: the same flags give the same text\n"
            "  --ids              the prompt is token ids (\"15496 11 995\") and the output too,\n"
            "                     the EOS included when sampled (with --chat the prompt is\n"
            "                     text, and its rendered ids are printed)\n"
            "  --chat             the prompt is a user message: rendered with the chat\n"
            "                     template of the tokenizer_config.json beside the tokenizer\n"
            "                     (ChatML, Llama 3), its default system prompt and the\n"
            "                     assistant's turn opened, as apply_chat_template(messages,\n"
            "                     add_generation_prompt=True); the rendered text is printed\n"
            "  --system TEXT      with --chat: a system message first (instead of the\n"
            "                     template's default system prompt)\n"
            "  --eos TOKEN        stop at this token alone: its text (\"<|im_end|>\") or id\n"
            "  --ignore-eos       sample all N tokens, past the EOS\n"
            "  --no-cache         no key/value cache: every token re-runs the forward over\n"
            "                     the whole context (slower; the same tokens, for checking)\n"
            "  --recipe FILE      with a CHECKPOINT: the recipe to build the model from,\n"
            "                     instead of the one the checkpoint recorded\n");
}

/* trainrun sample CHECKPOINT|RECIPE [key=value ...] [flags]: a checkpoint is
 * a directory (a run's, its checkpoints', or one checkpoint), a recipe a
 * file, whose model = { from = DIR } gives the weights. */
int tr_cmd_sample(int argc, char **argv)
{
    struct tr_sample_flags f = {.prompt = "\n", .tokens = 200, .temperature = 0.8, .top_k = 0, .seed = 1};
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            tr_sample_help(stdout);
            return TR_EXIT_OK;
        }
    if (argc < 3 || argv[2][0] == '-') {
        tr_cli_usage(stderr);
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
            if (!tr_cli_override_ok(a, "sample: "))
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
        if (strcmp(a, "--chat") == 0) {
            f.chat = 1;
            continue;
        }
        if (strcmp(a, "--no-cache") == 0) {
            f.no_cache = 1;
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
        else if (strcmp(a, "--eos") == 0)
            f.eos = v;
        else if (strcmp(a, "--system") == 0)
            f.system = v;
        else if (strcmp(a, "--tokens") == 0)
            bad = tr_cli_flag_int(a, v, 0, 1000000, &n), f.tokens = (int)n;
        else if (strcmp(a, "--temperature") == 0)
            bad = tr_cli_flag_temperature(a, v, &f.temperature);
        else if (strcmp(a, "--top-k") == 0)
            bad = tr_cli_flag_int(a, v, 0, 1 << 24, &n), f.top_k = (int)n;
        else if (strcmp(a, "--seed") == 0)
            bad = tr_cli_flag_u64(a, v, &f.seed);
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
    if (f.system && !f.chat) {
        fprintf(stderr, "trainrun: error: sample: --system is the system message of a --chat "
                "prompt; add --chat\n");
        goto done;
    }
    if (f.eos && f.ignore_eos) {
        fprintf(stderr, "trainrun: error: sample: --eos names the token to stop at and "
                "--ignore-eos stops at none; give one of them\n");
        goto done;
    }
    if (recipe)
        f.recipe = recipe;
    rc = tr_sample(&f);
done:
    free(overrides);
    return rc;
}

int tr_cmd_export(int argc, char **argv)
{
    const char *out = NULL, *dtype_name = NULL, *format = "safetensors";
    int merge = 0;
    if (argc < 3) {
        tr_cli_usage(stderr);
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
        else if (strcmp(argv[i], "--merge") == 0)
            merge = 1;
        else {
            fprintf(stderr, "trainrun: error: unknown argument '%s' for export\n", argv[i]);
            return TR_EXIT_USAGE;
        }
    }
    enum tr_dtype dtype;
    /* adapters are small and trained in fp32: kept so unless asked */
    if (!dtype_name)
        dtype_name = strcmp(format, "peft") == 0 ? "fp32" : "bf16";
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
    int hf = strcmp(format, "hf") == 0, peft = strcmp(format, "peft") == 0;
    if (!hf && !peft && strcmp(format, "safetensors") != 0) {
        fprintf(stderr, "trainrun: error: --format takes safetensors (one file of trainrun's "
                "weights), hf (a Hugging Face model directory) or peft (a PEFT adapter "
                "directory), not '%s'\n", format);
        return TR_EXIT_USAGE;
    }
    if (!out) {
        fprintf(stderr, "trainrun: error: export needs -o %s\n",
                hf || peft ? "DIR" : "FILE.safetensors");
        return TR_EXIT_USAGE;
    }
    if (merge && !hf) {
        fprintf(stderr, "trainrun: error: --merge goes with --format hf: the adapters merged "
                "into their base as one Hugging Face model\n");
        return TR_EXIT_USAGE;
    }
    tr_err err = {{0}};
    char *dir = NULL, *name = NULL;
    int code = TR_EXIT_OK;
    if (tr_checkpoint_resolve(argv[2], &dir, &name, &err) != TR_OK) {
        code = TR_EXIT_ERROR;
    } else {
        char *path = tr_xasprintf("%s/%s", dir, name);
        int rc = merge  ? tr_export_merged(path, dtype, out, &err)
                 : hf   ? tr_export_hf(path, dtype, out, &err)
                 : peft ? tr_export_peft(path, dtype, out, &err)
                        : tr_export_weights(path, dtype, out, &err);
        if (rc != TR_OK)
            code = TR_EXIT_ERROR;
        else if (peft)
            fprintf(stderr, "trainrun: wrote %s/adapter_config.json and %s/adapter_model.safetensors "
                    "(%s adapter of %s); load it with PeftModel.from_pretrained(base, \"%s\"), or "
                    "lora = { from = ... }\n", out, out, dtype_name, path, out);
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
