/* Smoke runs (`trainrun --smoke`): the recipe's memory against its target
 * device, then 2 optimizer steps of the same recipe made small on the CPU,
 * through the real data source, ending with a checkpoint round trip. */
#include "run.h"
#include "run_internal.h"

#include "model.h"
#include "../config/options.h"
#include "../config/plugin.h"
#include "../config/recipe.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Save the run's checkpoint, load it into fresh buffers, and compare. */
int tr_smoke_round_trip(struct run *r, tr_err *err)
{
    size_t bytes = r->g->n_params * sizeof(float);
    const struct tr_backend_iface *bi = r->be.iface;
    int slots = r->opt.desc->state_slots, have_slots = 1;
    float *p = bi->alloc(r->be.context, bytes), *s[TR_OPTIMIZER_MAX_SLOTS] = {NULL};
    for (int k = 0; k < slots; k++)
        have_slots &= (s[k] = bi->alloc(r->be.context, bytes)) != NULL;
    float *a = tr_alloc(bytes), *b = tr_alloc(bytes);
    /* buffers (batch norm's running statistics) load back into the graph's
     * own: the values before the load must be those read back */
    size_t buffer_bytes = r->g->n_buffers * sizeof(float);
    float *kept = tr_alloc(buffer_bytes + 1), *back = tr_alloc(buffer_bytes + 1);
    int rc = TR_ERROR;
    struct tr_run_state st;
    char name[64];
    snprintf(name, sizeof name, "step-%010llu", (unsigned long long)r->step);
    if (buffer_bytes && kept)
        bi->download(r->be.context, kept, r->g->buffers, buffer_bytes);
    if (!p || !have_slots || !a || !b || !kept || !back) {
        tr_fail(err, "smoke: out of memory for the checkpoint round trip");
    } else if (tr_checkpointer_load(r->ckpt, name, p, s, &st, err) == TR_OK) {
        bi->download(r->be.context, a, r->g->params, bytes);
        bi->download(r->be.context, b, p, bytes);
        if (buffer_bytes)
            bi->download(r->be.context, back, r->g->buffers, buffer_bytes);
        if (memcmp(a, b, bytes) != 0 || memcmp(kept, back, buffer_bytes) != 0 || st.step != r->step)
            tr_fail(err, "smoke: checkpoint %s does not read back what was saved", name);
        else
            rc = TR_OK;
    } else {
        tr_err_prefix(err, "smoke: checkpoint round trip");
    }
    if (p)
        bi->free(r->be.context, p);
    for (int k = 0; k < slots; k++)
        if (s[k])
            bi->free(r->be.context, s[k]);
    tr_free(a);
    tr_free(b);
    tr_free(kept);
    tr_free(back);
    return rc;
}

/* The smoke run's checkpoints go to a local directory of its own, whatever
 * the recipe's checkpoint plugin (s3, a plugin of the user's) and its
 * options (a bucket, a dir): a smoke run needs no bucket or credentials,
 * and never writes next to, or prunes, the recipe's real checkpoints.
 * The recipe's own checkpoint options were checked against its plugin when
 * the recipe was loaded for the memory check. */
static int smoke_local_checkpoints(struct tr_config *cfg, tr_err *err)
{
    struct tr_slot *slot = &cfg->checkpoint;
    struct tr_plugin *local = tr_plugin_find(&cfg->plugin_path, TR_KIND_CHECKPOINT, "local", err);
    if (!local)
        return TR_ERROR;
    const struct tr_plugin_info *info = local->info;
    void *config = tr_xcalloc(1, info->config_size ? info->config_size : 1);
    /* all defaults (dir: <run_dir>/checkpoints); the parsed strings point
     * into this table, so the recipe's tree keeps it */
    struct tr_origin def = {TR_FROM_DEFAULT, NULL, 0};
    struct tr_value *holder = tr_value_new(TR_V_TABLE, "smoke", def);
    tr_value_put(tr_recipe_root(cfg->recipe), holder);
    struct tr_schema_use use = {info->options, config};
    if (tr_options_apply(holder, "checkpoint", "checkpoint 'local'", &use, 1, err) != TR_OK) {
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

/* What the recipe needs per device at its own micro-batch, measured without
 * allocating it. */
struct smoke_fit_input {
    size_t need;                     /* bytes per device */
    struct tr_memory_report report;
    double have;                     /* bytes the device offers */
    char what[128];                  /* the device, in words */
    int64_t micro_batch;             /* measured at */
    int is_auto, budget;             /* micro_batch = "auto"; train.memory_budget given */
};

static int smoke_memory(const char *recipe, const char *const *overrides, int n_overrides,
                        struct smoke_fit_input *in, tr_err *err)
{
    struct tr_config cfg;
    int rc = tr_config_load(&cfg, recipe, overrides, n_overrides, err);
    if (rc == TR_OK) {
        struct tr_backend be;
        /* "auto" picks the largest micro-batch that fits: it fits if 1 does */
        in->is_auto = cfg.train.auto_micro_batch;
        in->micro_batch = in->is_auto ? 1 : cfg.train.micro_batch;
        in->budget = cfg.train.memory_budget > 0;
        struct tr_graph *g = tr_model_build(cfg.recipe, (int)in->micro_batch, err);
        /* the precision policy's compute dtype: 16-bit ones store the
         * activations in 16 bits, which the run's plan counts too */
        struct tr_precision_policy pol = {.struct_size = sizeof pol};
        if (g && tr_config_create_slot(&cfg, &cfg.precision, 0, err) == TR_OK) {
            const struct tr_precision_vtable *pv = cfg.precision.plugin->info->vtable;
            pv->policy(cfg.precision.self, &pol);
            g->compute = pol.compute;
        } else if (g) {
            tr_graph_free(g, NULL);
            g = NULL;
        }
        if (!g || tr_backend_open(&be, "cpu", 1, NULL, err) != TR_OK) {
            rc = TR_ERROR;
        } else {
            tr_graph_measure(g, &be, tr_optimizer_find(cfg.optimizer.type)->state_slots);
            in->report = g->memory;
            in->need = tr_graph_memory_total(&g->memory);
            in->have = tr_run_device_memory(&cfg, in->what, sizeof in->what);
            tr_backend_close(&be);
        }
        tr_graph_free(g, NULL);
    }
    tr_config_free(&cfg);
    return rc;
}

/* Does `need` fit the device the recipe targets, with a 10% margin for the
 * allocator and the runtime? */
static int smoke_fit(const struct smoke_fit_input *in)
{
    char a[32], b[32];
    tr_format_bytes((double)in->need, a, sizeof a);
    tr_format_bytes(in->have, b, sizeof b);
    if ((double)in->need > 0.9 * in->have) {
        /* only the levers that are not pulled yet */
        char advice[256] = "", mb[64] = "";
        if (in->micro_batch > 1)
            snprintf(advice, sizeof advice, "lower train.micro_batch (or \"auto\"), ");
        if (!in->report.recompute)
            snprintf(advice + strlen(advice), sizeof advice - strlen(advice),
                     "recompute activations (model.recompute), ");
        if (in->budget)
            snprintf(advice + strlen(advice), sizeof advice - strlen(advice),
                     "raise train.memory_budget, ");
        if (in->is_auto)
            snprintf(mb, sizeof mb, " at micro-batch 1 (the least \"auto\" picks)");
        fprintf(stderr, "smoke: FAILED: won't fit: the recipe needs %s per device%s but %s has %s "
                        "(with a 10%% margin); %sor use a smaller model\n", a, mb, in->what, b,
                advice);
        return TR_EXIT_ERROR;
    }
    fprintf(stderr, "smoke: fits %s (%s of %s)\nsmoke: ready to launch\n", in->what, a, b);
    return TR_EXIT_OK;
}

int tr_smoke(const char *recipe, const char *const *overrides, int n_overrides, int quiet)
{
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
    int code;
    if (tr_config_load(&cfg, recipe, all, n, &err) != TR_OK ||
        smoke_local_checkpoints(&cfg, &err) != TR_OK) {
        fprintf(stderr, "smoke: FAILED: %s\n", err.msg);
        code = TR_EXIT_ERROR;
    } else {
        struct tr_run_flags flags = {0, 1, 1, 0};
        code = tr_train(&cfg, &flags);
    }
    tr_config_free(&cfg);
    free(all);
    free(run_dir);
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        tr_log(TR_LOG_WARN, NULL, "could not remove %s", dir);
    free(dir);
    if (code != TR_EXIT_OK) {
        fprintf(stderr, "smoke: FAILED (the error is above)\n");
        return code;
    }
    char buf[32];
    const struct tr_memory_report *report = &fit.report;
    double need = (double)fit.need;
    tr_format_bytes(need, buf, sizeof buf);
    fprintf(stderr, "smoke: 2 steps, checkpoint round trip ok in %.2f s\n", tr_now() - t0);
    fprintf(stderr, "smoke: the recipe needs %s per device at %s "
                    "(activations %.0f%%, parameters+gradients+optimizer %.0f%%)\n", buf,
            fit.is_auto ? "micro-batch 1 (\"auto\" picks the largest that fits)" : "its micro-batch",
            100.0 * (double)(report->activations + report->saved + report->recompute) / need,
            100.0 * (double)(report->params + report->grads + report->optimizer) / need);
    (void)quiet;
    return smoke_fit(&fit);
}
