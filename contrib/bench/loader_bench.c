/*
 * Loader throughput: how many samples and tokens per second the core's
 * loader (core/engine/loader.h) delivers from the text data plugin with 0, 1, 2
 * and 4 worker threads, against the rate a training recipe consumes them.
 * The consumer only takes batches, so this is the loader's ceiling.
 *
 *   loader_bench --data data/kjv.txt --consume 11000 [--tokenizer byte|char]
 *       [--seq-len 128] [--batch 32] [--prefetch 4] [--seconds 2]
 *
 * The text plugin is found like any plugin: set TRAINRUN_PLUGIN_PATH to the
 * directory holding data_text.so (contrib/bench/loader.sh does).
 */
#include "engine/loader.h"
#include "config/options.h"
#include "config/plugin.h"
#include "util/util.h"
#include "config/value.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bench_args {
    const char *data;
    const char *tokenizer;
    double consume; /* tokens/s the recipe consumes */
    int seq_len, batch, prefetch;
    double seconds; /* measured per worker count */
};

static void usage(FILE *out)
{
    fprintf(out, "usage: loader_bench --data FILE --consume TOKENS_PER_S [--tokenizer byte|char]\n"
                 "       [--seq-len 128] [--batch 32] [--prefetch 4] [--seconds 2]\n");
}

static int parse(int argc, char **argv, struct bench_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "loader_bench: %s needs a value\n", k);
            return -1;
        }
        i++;
        if (strcmp(k, "--data") == 0)
            a->data = v;
        else if (strcmp(k, "--tokenizer") == 0)
            a->tokenizer = v;
        else if (strcmp(k, "--consume") == 0)
            a->consume = atof(v);
        else if (strcmp(k, "--seq-len") == 0)
            a->seq_len = atoi(v);
        else if (strcmp(k, "--batch") == 0)
            a->batch = atoi(v);
        else if (strcmp(k, "--prefetch") == 0)
            a->prefetch = atoi(v);
        else if (strcmp(k, "--seconds") == 0)
            a->seconds = atof(v);
        else {
            fprintf(stderr, "loader_bench: unknown option %s\n", k);
            return -1;
        }
    }
    if (!a->data || a->consume <= 0 || a->seq_len < 1 || a->batch < 1 || a->prefetch < 1 ||
        a->seconds <= 0) {
        fprintf(stderr, "loader_bench: --data and a positive --consume are required; sizes "
                        "must be positive\n");
        return -1;
    }
    return 0;
}

/* Create the text plugin as the core does: options from a value tree
 * checked against the plugin's schema. */
static int open_text(const struct bench_args *a, struct tr_plugin **plugin,
                     struct tr_data_source *src, tr_err *err)
{
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, NULL);
    *plugin = tr_plugin_find(&sp, TR_KIND_DATA, "text", err);
    tr_plugin_path_free(&sp);
    if (!*plugin)
        return TR_ERROR;
    const struct tr_plugin_info *info = (*plugin)->info;

    struct tr_origin cli = {.kind = TR_FROM_CLI};
    struct tr_value *table = tr_value_new(TR_V_TABLE, NULL, cli);
    const char *keys[] = {"path", "tokenizer", "cache_dir"};
    const char *values[] = {a->data, a->tokenizer, ""}; /* char: tokenise in memory */
    for (size_t i = 0; i < TR_ARRAY_LEN(keys); i++) {
        struct tr_value *v = tr_value_new(TR_V_STRING, keys[i], cli);
        tr_value_set_string(v, values[i]);
        tr_value_put(table, v);
    }
    void *config = tr_xcalloc(1, info->config_size);
    struct tr_schema_use use = {info->options, config};
    int rc = tr_options_apply(table, NULL, "data 'text'", &use, 1, err);
    if (rc == TR_OK) {
        struct tr_create_args args = {.struct_size = sizeof args, .run_dir = ".",
                                      .recipe_dir = ".", .seq_len = (uint32_t)a->seq_len,
                                      .seed = 1, .rank = 0, .world = 1};
        *src = (struct tr_data_source){.vt = info->vtable, .name = "text"};
        rc = info->create(tr_host_services(), config, &args, &src->self, err);
    }
    if (rc == TR_OK) {
        src->info.struct_size = sizeof src->info;
        rc = src->vt->info(src->self, &src->info, err);
    }
    free(config);
    tr_value_free(table);
    return rc;
}

/* Batches per second with `workers` threads, after a short warm-up. */
static int measure(const struct tr_data_source *src, const struct bench_args *a, int workers,
                   double *batches_per_s, tr_err *err)
{
    struct tr_loader_config lc = {.split = TR_SPLIT_TRAIN, .batch = a->batch,
                                  .workers = workers, .prefetch = a->prefetch, .shuffle = 1,
                                  .seed = 1};
    struct tr_loader *l = tr_loader_open(src, &lc, 0, err);
    if (!l)
        return TR_ERROR;
    size_t n = (size_t)a->batch * (size_t)a->seq_len;
    int32_t *inputs = malloc(n * sizeof *inputs), *targets = malloc(n * sizeof *targets);
    int rc = inputs && targets ? TR_OK : tr_fail(err, "out of memory");
    for (int i = 0; i < 2 * a->prefetch && rc == TR_OK; i++)
        rc = tr_loader_next(l, inputs, targets, NULL, err);
    uint64_t batches = 0;
    double start = tr_now(), elapsed = 0;
    while (rc == TR_OK && elapsed < a->seconds) {
        rc = tr_loader_next(l, inputs, targets, NULL, err);
        batches++;
        if (batches % 16 == 0)
            elapsed = tr_now() - start;
    }
    elapsed = tr_now() - start;
    *batches_per_s = (double)batches / elapsed;
    free(inputs);
    free(targets);
    tr_loader_close(l);
    return rc;
}

int main(int argc, char **argv)
{
    struct bench_args a = {.tokenizer = "byte", .seq_len = 128, .batch = 32, .prefetch = 4,
                           .seconds = 2};
    if (parse(argc, argv, &a) != 0) {
        usage(stderr);
        return 2;
    }
    tr_log_threshold = TR_LOG_WARN;
    struct tr_plugin *plugin = NULL;
    struct tr_data_source src = {0};
    tr_err err = {{0}};
    if (open_text(&a, &plugin, &src, &err) != TR_OK) {
        fprintf(stderr, "loader_bench: %s\n", err.msg);
        if (plugin)
            tr_plugin_close(plugin);
        return 1;
    }

    printf("text plugin (tokenizer %s) on %s: %llu training samples; seq_len %d, micro-batch "
           "%d, prefetch %d, %.1f s per row\n",
           a.tokenizer, a.data, (unsigned long long)src.info.samples[TR_SPLIT_TRAIN], a.seq_len,
           a.batch, a.prefetch, a.seconds);
    printf("recipe consumes %.0f tokens/s (%.1f samples/s)\n\n", a.consume,
           a.consume / a.seq_len);
    printf("| workers | samples/s |   tokens/s | x consumption |\n");
    printf("|--------:|----------:|-----------:|--------------:|\n");
    static const int workers[] = {0, 1, 2, 4};
    int rc = 0;
    for (size_t i = 0; i < TR_ARRAY_LEN(workers); i++) {
        double bps;
        if (measure(&src, &a, workers[i], &bps, &err) != TR_OK) {
            fprintf(stderr, "loader_bench: %s\n", err.msg);
            rc = 1;
            break;
        }
        double samples = bps * a.batch, tokens = samples * a.seq_len;
        printf("| %7d | %9.0f | %10.0f | %13.1f |\n", workers[i], samples, tokens,
               tokens / a.consume);
        fflush(stdout);
    }
    if (plugin->info->destroy)
        plugin->info->destroy(src.self);
    tr_plugin_close(plugin);
    return rc;
}
