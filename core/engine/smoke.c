/* Smoke runs (`trainrun --smoke`): the recipe's memory against its target
 * device, then 2 optimizer steps of the same recipe made small on the CPU,
 * through the real data source, ending with a checkpoint round trip. */
#include "fit.h"
#include "run.h"
#include "session.h"

#include "../config/options.h"
#include "../config/plugin.h"
#include "../config/recipe.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The smoke run's checkpoints go to a local directory of its own, whatever
 * the recipe's checkpoint plugin (s3, a plugin of the user's) and its
 * options (a bucket, a dir): a smoke run needs no bucket or credentials,
 * and never writes next to, or prunes, the recipe's real checkpoints.
 * The recipe's own checkpoint options were checked against its plugin when
 * the recipe was loaded for the memory check. */
static int smoke_local_checkpoints(struct tr_config *cfg, struct tr_value **holder, tr_err *err)
{
    struct tr_slot *slot = &cfg->checkpoint;
    struct tr_plugin *local = tr_plugin_find(&cfg->plugin_path, TR_KIND_CHECKPOINT, "local", err);
    if (!local)
        return TR_ERROR;
    const struct tr_plugin_info *info = local->info;
    void *config = tr_xcalloc(1, info->config_size ? info->config_size : 1);
    /* all defaults (dir: <run_dir>/checkpoints), from a table of the smoke
     * run's own, never the recipe's tree; the parsed strings point into it,
     * so it lives until the config is freed (*holder: the caller frees it) */
    struct tr_origin def = {TR_FROM_DEFAULT, NULL, 0};
    *holder = tr_value_new(TR_V_TABLE, "smoke", def);
    struct tr_schema_use use = {info->options, config};
    if (tr_options_apply(*holder, "checkpoint", "checkpoint 'local'", &use, 1, err) != TR_OK) {
        free(config);
        tr_plugin_close(local);
        return TR_ERROR;
    }
    if (strcmp(slot->plugin->info->name, "local") != 0)
        fprintf(stderr, "smoke: checkpoints go to a scratch directory, not through the recipe's "
                "'%s' plugin (its options were checked)\n", slot->plugin->info->name);
    free(slot->config);
    tr_plugin_close(slot->plugin);
    slot->plugin = local;
    slot->config = config;
    return TR_OK;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path) == 0 ? 0 : 1;
}

/* What the recipe needs per device at its micro-batch ("auto": the one it
 * picks, fit.h), measured without allocating it: a session in plan mode. */
struct smoke_fit_input {
    size_t need;                     /* bytes per device */
    struct tr_memory_report report;
    double have;                     /* bytes the device offers */
    char what[128];                  /* the device, in words */
    int64_t micro_batch;             /* measured at */
    int is_auto, budget;             /* micro_batch = "auto"; train.memory_budget given */
    int64_t ctx;                     /* model.ctx, 0: none */
    int ranks, stages;               /* the recipe runs on several ranks; with pipeline stages */
    int stage;                       /* with stages: the largest, whose need is `need` */
    size_t whole;                    /* the whole model's (need without stages) */
};

/* With pipeline stages a device holds one stage: the largest stage's
 * estimate (fit.h) at the micro-batches a step of the recipe's ranks
 * (procs or gpus = stages x replicas) runs, instead of the whole model's. */
static int smoke_stage_need(const struct tr_config *cfg, const struct tr_session *s,
                            struct smoke_fit_input *in, tr_err *err)
{
    int64_t P = cfg->parallel.pipeline, ranks = tr_config_ranks(cfg);
    int64_t replicas = ranks >= P ? ranks / P : 1;
    return tr_fit_stages(cfg, s->g, tr_fit_per_device(cfg->train.batch, replicas),
                         s->micro_batch, 0, &in->need, &in->stage, err);
}

static int smoke_memory(const char *recipe, const char *const *overrides, int n_overrides,
                        struct smoke_fit_input *in, tr_err *err)
{
    struct tr_config cfg;
    struct tr_session s;
    memset(&s, 0, sizeof s);
    int rc = tr_config_load(&cfg, recipe, overrides, n_overrides, err);
    if (rc == TR_OK)
        rc = tr_session_open(&s, &cfg, TR_SESSION_PLAN, err);
    if (rc == TR_OK) {
        in->is_auto = cfg.train.auto_micro_batch;
        in->stages = cfg.parallel.pipeline > 1;
        in->ranks = in->stages || cfg.parallel.procs > 1 || cfg.parallel.gpus > 1 ||
                            cfg.parallel.shard_level != TR_SHARD_NONE
                        ? 2 : 1;
        const struct tr_value *c = tr_value_get(tr_recipe_root(cfg.recipe), "model.ctx");
        in->ctx = c && c->type == TR_V_NUMBER && c->number > 1 ? (int64_t)c->number : 0;
        in->micro_batch = s.micro_batch;
        in->budget = cfg.train.memory_budget > 0;
        in->report = s.g->memory;
        in->need = in->whole = tr_graph_memory_total(&s.g->memory);
        in->have = s.device.bytes;
        snprintf(in->what, sizeof in->what, "%s", s.device.what);
        if (in->stages)
            rc = smoke_stage_need(&cfg, &s, in, err);
    }
    /* the data at the recipe's micro-batch (the smoke run's own is 1), once
     * it fits: a recipe that does not fit gets that diagnosis first */
    if (rc == TR_OK && (double)in->need <= (1.0 - TR_MEMORY_MARGIN) * in->have)
        rc = tr_session_check_data(&s, err);
    tr_session_close(&s);
    tr_config_free(&cfg);
    return rc;
}

/* Does `need` fit the device the recipe targets, less the margin the
 * allocator and the runtime keep (fit.h)? */
static int smoke_fit(const struct smoke_fit_input *in)
{
    char a[32], b[32];
    tr_format_bytes((double)in->need, a, sizeof a);
    tr_format_bytes(in->have, b, sizeof b);
    if ((double)in->need > (1.0 - TR_MEMORY_MARGIN) * in->have) {
        /* only the levers that are not pulled yet */
        char advice[384] = "", mb[128] = "";
        if (in->micro_batch > 1)
            snprintf(advice, sizeof advice, "lower train.micro_batch (or \"auto\"), ");
        if (in->ctx > 0) /* activations grow with the context */
            snprintf(advice + strlen(advice), sizeof advice - strlen(advice),
                     "shorten the context (model.ctx, now %lld tokens a sample), ",
                     (long long)in->ctx);
        if (!in->report.recompute)
            snprintf(advice + strlen(advice), sizeof advice - strlen(advice),
                     "recompute activations (model.recompute), ");
        if (in->budget)
            snprintf(advice + strlen(advice), sizeof advice - strlen(advice),
                     "raise train.memory_budget, ");
        if (in->is_auto)
            snprintf(mb, sizeof mb, " at micro-batch 1 (the least \"auto\" picks)");
        if (in->stages)
            snprintf(mb + strlen(mb), sizeof mb - strlen(mb), " (stage %d's, the largest)",
                     in->stage);
        fprintf(stderr, "smoke: FAILED: won't fit: the recipe needs %s per device%s but %s has %s "
                        "(with a %.0f%% margin); %s%sor use a smaller model\n", a, mb, in->what, b,
                100 * TR_MEMORY_MARGIN, advice, in->stages ? "more stages, " : "");
        return TR_EXIT_ERROR;
    }
    char whose[64] = "";
    if (in->stages)
        snprintf(whose, sizeof whose, ": stage %d's, the largest", in->stage);
    fprintf(stderr, "smoke: fits %s (%s of %s%s)\nsmoke: ready to launch\n", in->what, a, b,
            whose);
    return TR_EXIT_OK;
}

/* The smoke steps of the recipe made small in run directory dir, in this
 * process: alone, or as one of the ranks the parent smoke run launched. */
static int smoke_steps(const char *recipe, const char *const *overrides, int n_overrides,
                       const char *dir)
{
    tr_err err = {{0}};
    char *run_dir = tr_xasprintf("run_dir=%s", dir);
    /* two steps whatever length the recipe asks for (tokens and epochs 0: not set) */
    const char *smoke[] = {"device=cpu", "train.steps=2", "train.tokens=0", "train.epochs=0",
                           "train.time=0", "train.batch=2", "train.micro_batch=1",
                           "train.eval_every=0", "train.eval_batches=1", "train.log_every=1",
                           "checkpoint.every=0", "checkpoint.keep=1",
                           "checkpoint.async=false", "early_stop.patience=0", run_dir};
    int n = n_overrides + (int)TR_ARRAY_LEN(smoke);
    const char **all = tr_xcalloc((size_t)n, sizeof *all);
    for (int i = 0; i < n_overrides; i++)
        all[i] = overrides[i];
    for (size_t i = 0; i < TR_ARRAY_LEN(smoke); i++)
        all[n_overrides + (int)i] = smoke[i];
    struct tr_config cfg;
    struct tr_value *holder = NULL;
    int code;
    if (tr_config_load(&cfg, recipe, all, n, &err) != TR_OK ||
        smoke_local_checkpoints(&cfg, &holder, &err) != TR_OK) {
        fprintf(stderr, "smoke: FAILED: %s\n", err.msg);
        code = TR_EXIT_ERROR;
    } else {
        struct tr_run_flags flags = {0, 1, 1, 0};
        code = tr_train(&cfg, &flags);
    }
    tr_config_free(&cfg);
    if (holder)
        tr_value_free(holder);
    free(all);
    free(run_dir);
    return code;
}

/* The ranks' smoke steps: 2 CPU ranks over tcp (2 pipeline stages when the
 * recipe has stages), each `trainrun --smoke` of the same recipe. */
static int smoke_ranks(const char *recipe, const char *const *overrides, int n_overrides,
                       const char *dir, int stages, int (*launch)(int, char *const *))
{
    const char *extra[] = {"procs=2", "gpus=0", "comm=tcp",
                           stages ? "parallel.pipeline=2" : "parallel.pipeline=1"};
    int n = 3 + n_overrides + (int)TR_ARRAY_LEN(extra);
    char **argv = tr_xcalloc((size_t)n + 1, sizeof *argv);
    argv[0] = (char *)"trainrun";
    argv[1] = (char *)"--smoke";
    argv[2] = (char *)recipe;
    for (int i = 0; i < n_overrides; i++)
        argv[3 + i] = (char *)overrides[i];
    for (size_t i = 0; i < TR_ARRAY_LEN(extra); i++)
        argv[3 + n_overrides + (int)i] = (char *)extra[i];
    fprintf(stderr, "smoke: 2 steps on 2 CPU ranks%s\n", stages ? " (2 pipeline stages)" : "");
    setenv("TRAINRUN_SMOKE_DIR", dir, 1);
    int code = launch(2, argv);
    unsetenv("TRAINRUN_SMOKE_DIR");
    free(argv);
    return code;
}

int tr_smoke(const char *recipe, const char *const *overrides, int n_overrides, int quiet,
             int (*launch)(int ranks, char *const *argv))
{
    /* a rank of a smoke run: its steps, in the directory the parent made */
    const char *given = getenv("TRAINRUN_SMOKE_DIR");
    if (given && *given && getenv("TRAINRUN_RANK"))
        return smoke_steps(recipe, overrides, n_overrides, given);
    tr_err err = {{0}};
    double t0 = tr_now();
    struct smoke_fit_input fit;
    memset(&fit, 0, sizeof fit);
    fprintf(stderr, "smoke: %s\n", recipe);
    if (smoke_memory(recipe, overrides, n_overrides, &fit, &err) != TR_OK) {
        fprintf(stderr, "smoke: FAILED: %s\n", err.msg);
        return TR_EXIT_ERROR;
    }
    /* the same recipe, made small: CPU, 2 steps of 2 micro-batches of 1 sample */
    const char *tmp = getenv("TMPDIR");
    char *dir = tr_xasprintf("%s/trainrun-smoke.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "smoke: FAILED: cannot create a scratch directory %s: %s\n", dir,
                strerror(errno));
        free(dir);
        return TR_EXIT_ERROR;
    }
    int code = fit.ranks > 1 && launch
                   ? smoke_ranks(recipe, overrides, n_overrides, dir, fit.stages, launch)
                   : smoke_steps(recipe, overrides, n_overrides, dir);
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        tr_log(TR_LOG_WARN, NULL, "could not remove %s", dir);
    free(dir);
    if (code != TR_EXIT_OK) {
        fprintf(stderr, "smoke: FAILED (the error is above)\n");
        return code;
    }
    char buf[32], at[96];
    const struct tr_memory_report *report = &fit.report;
    double need = (double)fit.need;
    tr_format_bytes(need, buf, sizeof buf);
    fprintf(stderr, "smoke: 2 steps, checkpoint round trip ok in %.2f s\n", tr_now() - t0);
    snprintf(at, sizeof at, fit.is_auto ? "micro-batch %lld (what \"auto\" picks)"
                                        : "its micro-batch", (long long)fit.micro_batch);
    if (fit.stages) { /* the rows' shares are the whole model's */
        char whole[32];
        tr_format_bytes((double)fit.whole, whole, sizeof whole);
        fprintf(stderr, "smoke: the recipe needs %s per device at %s (stage %d, the largest; "
                "the whole model %s)\n", buf, at, fit.stage, whole);
    } else
        fprintf(stderr, "smoke: the recipe needs %s per device at %s "
                        "(activations %.0f%%, parameters+gradients+optimizer %.0f%%)\n", buf, at,
                100.0 * (double)(report->activations + report->saved + report->recompute) / need,
                100.0 * (double)(report->params + report->grads + report->optimizer) / need);
    (void)quiet;
    return smoke_fit(&fit);
}
