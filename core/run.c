#include "run.h"

#include "graph.h"
#include "json.h"
#include "loader.h"
#include "model.h"
#include "optim.h"
#include "safetensors.h"
#include "util.h"
#include "../kernels/cpu/kernels.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ---- signals: finish the step, checkpoint, exit for requeue ----------- */

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

/* ---- the state of one training run ------------------------------------ */

struct run {
    struct tr_config *cfg;
    struct tr_backend be;
    struct tr_graph *g;
    struct tr_data_source data;
    struct tr_loader *loader;
    struct tr_optimizer opt;
    void *host_inputs;       /* one micro-batch from the loader */
    int32_t *host_targets;
    size_t input_bytes, target_count;
    int accum;               /* micro-batches per optimizer step */
    uint32_t vocab;          /* token ids must be below this */
    uint64_t step;           /* optimizer steps done */
    double last_loss, last_val, last_accuracy;
    /* where time goes */
    double t_data, t_compute, t_optimizer, t_eval, t_checkpoint;
    FILE *metrics;
    const struct tr_precision_vtable *precision;
    const struct tr_schedule_vtable *schedule;
    const struct tr_checkpoint_vtable *ckpt;
};

static int vt_has(const void *vt, size_t offset_end)
{
    return ((const uint32_t *)vt)[1] >= offset_end;
}
#define HAS_SLOT(vt, type, slot) (vt_has(vt, offsetof(type, slot) + sizeof(((type *)0)->slot)) && (vt)->slot)

static double loss_scale(struct run *r)
{
    if (HAS_SLOT(r->precision, struct tr_precision_vtable, loss_scale))
        return r->precision->loss_scale(r->cfg->precision.self);
    return 1.0;
}

/* ---- checkpoints -------------------------------------------------------- */

static size_t save_vars(const void *vt, int kind, void *self, struct tr_state_var *vars, size_t cap)
{
    if (kind == TR_KIND_PRECISION) {
        const struct tr_precision_vtable *p = vt;
        if (HAS_SLOT(p, struct tr_precision_vtable, state_save))
            return p->state_save(self, vars, cap);
    } else {
        const struct tr_schedule_vtable *s = vt;
        if (HAS_SLOT(s, struct tr_schedule_vtable, state_save))
            return s->state_save(self, vars, cap);
    }
    return 0;
}

static void write_vars(FILE *f, const char *key, const struct tr_state_var *vars, size_t n)
{
    fprintf(f, "  \"%s\": {", key);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s", i ? ", " : "");
        tr_json_write_string(f, vars[i].name);
        fprintf(f, ": %.17g", vars[i].value);
    }
    fprintf(f, "}");
}

static void *params_blob(struct run *r, const float *base, const char *prefix, size_t *size)
{
    struct tr_graph *g = r->g;
    struct tr_st_entry *e = tr_xcalloc((size_t)g->n_tensors, sizeof *e);
    char **names = tr_xcalloc((size_t)g->n_tensors, sizeof *names);
    size_t n = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        names[n] = tr_xasprintf("%s%s", prefix, t->name);
        e[n] = (struct tr_st_entry){names[n], TR_F32, t->ndim, {0}, base + t->offset,
                                    t->numel * sizeof(float)};
        memcpy(e[n].shape, t->shape, sizeof t->shape);
        n++;
    }
    void *blob = tr_safetensors_write(e, n, "{\"format\":\"pt\",\"producer\":\"trainrun\"}", size);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    free(e);
    return blob;
}

static int save_checkpoint(struct run *r, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    void *self = cfg->checkpoint.self;
    double t0 = tr_now();
    char name[64];
    snprintf(name, sizeof name, "step-%010llu", (unsigned long long)r->step);

    size_t model_size = 0, optim_size = 0;
    void *model = params_blob(r, r->g->params, "", &model_size);
    void *optim = params_blob(r, r->opt.m, "exp_avg.", &optim_size);
    void *optim2 = NULL;
    size_t optim2_size = 0;
    if (r->opt.v)
        optim2 = params_blob(r, r->opt.v, "exp_avg_sq.", &optim2_size);
    char *state = NULL;
    size_t state_size = 0;
    FILE *f = open_memstream(&state, &state_size);
    struct tr_state_var vars[32];
    fprintf(f, "{\n  \"format\": 1,\n  \"step\": %llu,\n  \"applied_steps\": %lld,\n",
            (unsigned long long)r->step, (long long)r->opt.applied);
    fprintf(f, "  \"loader_position\": %llu,\n  \"seed\": %lld,\n",
            (unsigned long long)tr_loader_position(r->loader), (long long)cfg->train.seed);
    fprintf(f, "  \"recipe\": ");
    char abs[PATH_MAX];
    tr_json_write_string(f, realpath(tr_recipe_path(cfg->recipe), abs) ? abs : tr_recipe_path(cfg->recipe));
    fprintf(f, ",\n  \"overrides\": [");
    for (int i = 0; i < cfg->n_overrides; i++) {
        fprintf(f, "%s", i ? ", " : "");
        tr_json_write_string(f, cfg->overrides[i]);
    }
    fprintf(f, "]");
    fprintf(f, ",\n  \"loss\": %.9g,\n  \"val_loss\": %.9g,\n", r->last_loss,
            isnan(r->last_val) ? -1.0 : r->last_val);
    size_t nv = save_vars(r->precision, TR_KIND_PRECISION, cfg->precision.self, vars, 32);
    write_vars(f, "precision", vars, nv);
    fprintf(f, ",\n");
    nv = save_vars(r->schedule, TR_KIND_SCHEDULE, cfg->schedule.self, vars, 32);
    write_vars(f, "schedule", vars, nv);
    fprintf(f, ",\n  \"checksums\": {\"model.safetensors\": %lu, \"optimizer.safetensors\": %lu",
            crc32(0, model, (uInt)model_size), crc32(0, optim, (uInt)optim_size));
    if (optim2)
        fprintf(f, ", \"optimizer2.safetensors\": %lu", crc32(0, optim2, (uInt)optim2_size));
    fprintf(f, "}\n}\n");
    fclose(f);

    int rc = TR_ERROR;
    if (!model || !optim || (r->opt.v && !optim2)) {
        tr_fail(err, "out of memory while serialising checkpoint %s", name);
        goto done;
    }
    if (r->ckpt->begin(self, name, err) != TR_OK ||
        r->ckpt->put(self, "model.safetensors", model, model_size, err) != TR_OK ||
        r->ckpt->put(self, "optimizer.safetensors", optim, optim_size, err) != TR_OK ||
        (optim2 && r->ckpt->put(self, "optimizer2.safetensors", optim2, optim2_size, err) != TR_OK) ||
        /* state last: its checksums vouch for the blobs before it */
        r->ckpt->put(self, "state.json", state, state_size, err) != TR_OK ||
        r->ckpt->commit(self, err) != TR_OK) {
        r->ckpt->abort(self);
        tr_err_prefix(err, "checkpoint %s not saved", name);
        goto done;
    }
    rc = TR_OK;
done:
    free(model);
    free(optim);
    free(optim2);
    free(state);
    r->t_checkpoint += tr_now() - t0;
    return rc;
}

struct name_list {
    char **names;
    size_t n;
};

static void collect(void *ud, const char *name)
{
    struct name_list *l = ud;
    l->names = tr_xrealloc(l->names, (l->n + 1) * sizeof *l->names);
    l->names[l->n++] = tr_xstrdup(name);
}

static void free_names(struct name_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
}

static void prune_checkpoints(struct run *r)
{
    struct name_list l = {0};
    tr_err err = {{0}};
    if (r->ckpt->list(r->cfg->checkpoint.self, collect, &l, &err) != TR_OK)
        return;
    for (size_t i = (size_t)r->cfg->checkpoint_policy.keep; i < l.n; i++)
        if (r->ckpt->remove(r->cfg->checkpoint.self, l.names[i], &err) != TR_OK)
            tr_log(TR_LOG_WARN, "checkpoint", "cannot remove %s: %s", l.names[i], err.msg);
    free_names(&l);
}

static int load_params(struct run *r, const void *blob, size_t size, const char *prefix, float *base,
                       const char *what, tr_err *err)
{
    struct tr_st_file *f = tr_safetensors_read(blob, size, what, err);
    if (!f)
        return TR_ERROR;
    int rc = TR_OK;
    for (int i = 0; i < r->g->n_tensors && rc == TR_OK; i++) {
        struct tr_tensor *t = &r->g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        char *key = tr_xasprintf("%s%s", prefix, t->name);
        const struct tr_st_entry *e = tr_safetensors_find(f, key);
        if (!e)
            rc = tr_fail(err, "%s has no tensor '%s' (a checkpoint of another model?)", what, key);
        else if (e->dtype != TR_F32 || e->bytes != t->numel * sizeof(float))
            rc = tr_fail(err, "%s: tensor '%s' has another shape or dtype than the model's", what, key);
        else
            r->be.iface->upload(r->be.context, base + t->offset, e->data, e->bytes);
        free(key);
    }
    tr_safetensors_free(f);
    return rc;
}

static int load_vars(const struct tr_json *obj, int kind, struct run *r, tr_err *err)
{
    struct tr_state_var vars[32];
    size_t n = 0;
    for (size_t i = 0; obj && obj->type == TR_JSON_OBJECT && i < obj->n && n < 32; i++) {
        snprintf(vars[n].name, sizeof vars[n].name, "%s", obj->keys[i]);
        vars[n++].value = obj->items[i]->number;
    }
    if (kind == TR_KIND_PRECISION) {
        if (HAS_SLOT(r->precision, struct tr_precision_vtable, state_load))
            return r->precision->state_load(r->cfg->precision.self, vars, n, err);
    } else if (HAS_SLOT(r->schedule, struct tr_schedule_vtable, state_load)) {
        return r->schedule->state_load(r->cfg->schedule.self, vars, n, err);
    }
    return TR_OK;
}

/* Load one checkpoint into the run; the run is untouched on failure of the
 * checks that come before any upload. */
static int load_checkpoint(struct run *r, const char *name, uint64_t *loader_position, tr_err *err)
{
    void *self = r->cfg->checkpoint.self;
    const char *blobs[] = {"state.json", "model.safetensors", "optimizer.safetensors",
                           "optimizer2.safetensors"};
    void *data[4] = {NULL};
    size_t size[4] = {0};
    struct tr_json *state = NULL;
    int rc = TR_ERROR;
    int nblobs = r->opt.v ? 4 : 3;
    for (int i = 0; i < nblobs; i++)
        if (r->ckpt->get(self, name, blobs[i], &data[i], &size[i], err) != TR_OK)
            goto done;
    size_t bad = 0;
    state = tr_json_parse(data[0], size[0], &bad);
    if (!state) {
        tr_fail(err, "state.json is not valid JSON (byte %zu)", bad);
        goto done;
    }
    const struct tr_json *sums = tr_json_get(state, "checksums");
    for (int i = 1; i < nblobs; i++) {
        double want = tr_json_number(sums, blobs[i], -1);
        unsigned long got = crc32(0, data[i], (uInt)size[i]);
        if (want < 0 || (unsigned long)want != got) {
            tr_fail(err, "%s fails its checksum (torn or corrupted write)", blobs[i]);
            goto done;
        }
    }
    if (load_params(r, data[1], size[1], "", r->g->params, "model.safetensors", err) != TR_OK ||
        load_params(r, data[2], size[2], "exp_avg.", r->opt.m, "optimizer.safetensors", err) != TR_OK ||
        (r->opt.v && load_params(r, data[3], size[3], "exp_avg_sq.", r->opt.v, "optimizer2.safetensors",
                             err) != TR_OK) ||
        load_vars(tr_json_get(state, "precision"), TR_KIND_PRECISION, r, err) != TR_OK ||
        load_vars(tr_json_get(state, "schedule"), TR_KIND_SCHEDULE, r, err) != TR_OK)
        goto done;
    r->step = (uint64_t)tr_json_number(state, "step", 0);
    r->opt.applied = (int64_t)tr_json_number(state, "applied_steps", 0);
    r->last_loss = tr_json_number(state, "loss", NAN);
    *loader_position = (uint64_t)tr_json_number(state, "loader_position", 0);
    rc = TR_OK;
done:
    for (int i = 0; i < 4; i++)
        tr_free(data[i]);
    tr_json_free(state);
    return rc;
}

/* Newest checkpoint that loads; warns about each one skipped. Returns 1 if
 * one was loaded, 0 if there was none, TR_ERROR if all were bad. */
static int resume(struct run *r, uint64_t *loader_position, tr_err *err)
{
    struct name_list l = {0};
    if (r->ckpt->list(r->cfg->checkpoint.self, collect, &l, err) != TR_OK)
        return TR_ERROR;
    int rc = 0;
    for (size_t i = 0; i < l.n; i++) {
        tr_err why = {{0}};
        if (load_checkpoint(r, l.names[i], loader_position, &why) == TR_OK) {
            tr_log(TR_LOG_INFO, NULL, "resumed from checkpoint %s (step %llu)", l.names[i],
                   (unsigned long long)r->step);
            rc = 1;
            break;
        }
        tr_log(TR_LOG_WARN, "checkpoint", "skipping %s: %s", l.names[i], why.msg);
        rc = TR_ERROR;
        tr_fail(err, "no checkpoint could be loaded (the newest, %s: %s)", l.names[0], why.msg);
    }
    free_names(&l);
    return rc;
}

/* ---- one step ----------------------------------------------------------- */

static int load_micro_batch(struct run *r, struct tr_loader *loader, double *wait, tr_err *err)
{
    if (tr_loader_next(loader, r->host_inputs, r->host_targets, wait, err) != TR_OK)
        return TR_ERROR;
    struct tr_tensor *in = &r->g->tensors[r->g->inputs[0]];
    struct tr_tensor *tg = &r->g->tensors[r->g->inputs[1]];
    if (r->data.info.input_dtype == TR_I32) {
        /* an id past the embedding table would read out of bounds */
        const int32_t *ids = r->host_inputs;
        for (size_t i = 0; i < in->numel; i++)
            if ((uint32_t)ids[i] >= r->vocab)
                return tr_fail(err, "data '%s': token id %d is outside the model's vocabulary of %u",
                               r->data.name, ids[i], r->vocab);
    }
    r->be.iface->upload(r->be.context, in->data, r->host_inputs, r->input_bytes);
    r->be.iface->upload(r->be.context, tg->data, r->host_targets, r->target_count * sizeof(int32_t));
    return TR_OK;
}

static float read_loss(struct run *r)
{
    float loss;
    r->be.iface->download(r->be.context, &loss, r->g->tensors[r->g->loss].data, sizeof loss);
    return loss;
}

static int evaluate(struct run *r, double *val_loss, double *val_accuracy, tr_err *err)
{
    double t0 = tr_now();
    struct tr_loader_config lc = {TR_SPLIT_VAL, (int)r->cfg->train.micro_batch, 0, 1, 0,
                                  (uint64_t)r->cfg->train.seed};
    struct tr_loader *val = tr_loader_open(&r->data, &lc, 0, err);
    if (!val)
        return TR_ERROR;
    uint64_t n = tr_loader_batches_per_epoch(val);
    if (n > (uint64_t)r->cfg->train.eval_batches)
        n = (uint64_t)r->cfg->train.eval_batches;
    double sum = 0;
    int64_t correct = 0, counted = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (load_micro_batch(r, val, NULL, err) != TR_OK) {
            tr_loader_close(val);
            return TR_ERROR;
        }
        tr_graph_forward(r->g, &r->be);
        sum += read_loss(r);
        if (r->g->logits >= 0 && r->be.iface->count_correct) {
            const struct tr_tensor *lg = &r->g->tensors[r->g->logits];
            int V = (int)lg->shape[lg->ndim - 1];
            int64_t valid = 0;
            correct += r->be.iface->count_correct(r->be.context, lg->data,
                                                  r->g->tensors[r->g->inputs[1]].data,
                                                  (int)(lg->numel / (size_t)V), V, -1, &valid);
            counted += valid;
        }
    }
    tr_loader_close(val);
    *val_loss = sum / (double)n;
    *val_accuracy = counted ? (double)correct / (double)counted : NAN;
    r->t_eval += tr_now() - t0;
    return TR_OK;
}

static void progress(struct run *r, double lr, double grad_norm, double elapsed, double tokens,
                     int quiet)
{
    uint64_t steps = (uint64_t)r->cfg->train.steps;
    double per_step = elapsed / (double)(r->step ? r->step : 1);
    double eta = per_step * (double)(steps - r->step);
    double total = r->t_data + r->t_compute + r->t_optimizer;
    double wait = total > 0 ? 100.0 * r->t_data / total : 0;
    if (!quiet)
        fprintf(stderr, "step %6llu/%llu | loss %.4f | lr %.3g | norm %.3f | %.0f tok/s | data wait %.1f%% | ETA %.0fs\n",
                (unsigned long long)r->step, (unsigned long long)steps, r->last_loss, lr, grad_norm,
                tokens / (elapsed > 0 ? elapsed : 1), wait, eta);
    if (r->metrics)
        fprintf(r->metrics,
                "{\"step\": %llu, \"loss\": %.6g, \"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f, "
                "\"data_wait_pct\": %.2f, \"loss_scale\": %.6g, \"elapsed_s\": %.3f}\n",
                (unsigned long long)r->step, r->last_loss, lr, grad_norm,
                tokens / (elapsed > 0 ? elapsed : 1), wait, loss_scale(r), elapsed);
}

/* ---- setup and the loop ------------------------------------------------- */

static int setup(struct run *r, tr_err *err)
{
    struct tr_config *cfg = r->cfg;
    if (strcmp(cfg->device, "cpu") != 0)
        return tr_fail(err, "device \"%s\" is not available in this build: the CUDA backend is not "
                       "part of this trainrun yet; run with device=cpu", cfg->device);
    if (tr_cpu_backend_init(&r->be, (int)cfg->train.threads) != 0)
        return tr_fail(err, "cannot start the cpu backend");
    r->precision = cfg->precision.plugin->info->vtable;
    r->schedule = cfg->schedule.plugin->info->vtable;
    r->ckpt = cfg->checkpoint.plugin->info->vtable;


    r->g = tr_model_build(cfg->recipe, (int)cfg->train.micro_batch, err);
    if (!r->g)
        return TR_ERROR;
    struct tr_tensor *in = &r->g->tensors[r->g->inputs[0]];
    uint32_t seq_len = in->dtype == TR_I32 && in->ndim == 2 ? (uint32_t)in->shape[1] : 0;
    if (tr_config_create_plugins(cfg, seq_len, err) != TR_OK)
        return TR_ERROR;
    struct tr_precision_policy pol = {.struct_size = sizeof pol};
    r->precision->policy(cfg->precision.self, &pol);
    if (pol.compute != TR_F32 || pol.master != TR_F32 || pol.grad != TR_F32)
        return tr_fail(err, "precision '%s': the cpu backend computes in fp32 only for now; use "
                       "precision = \"fp32\"", cfg->precision.plugin->info->name);

    /* the data source must fit the model */
    r->data.vt = cfg->data.plugin->info->vtable;
    r->data.self = cfg->data.self;
    r->data.name = cfg->data.plugin->info->name;
    r->data.info.struct_size = sizeof r->data.info;
    if (r->data.vt->info(r->data.self, &r->data.info, err) != TR_OK)
        return TR_ERROR;
    struct tr_tensor *tg = &r->g->tensors[r->g->inputs[1]];
    size_t per_in = in->numel / (size_t)r->g->batch, per_tg = tg->numel / (size_t)r->g->batch;
    const struct tr_data_info *di = &r->data.info;
    char where[600];
    tr_origin_format(&cfg->data.origin, where, sizeof where);
    if (di->input_dtype != in->dtype || di->input_len != per_in || di->target_len != per_tg)
        return tr_fail(err, "%s: data '%s' gives samples of %u %s and %u targets, but the model "
                       "takes %zu %s and %zu targets per sample", where, r->data.name,
                       di->input_len, di->input_dtype == TR_I32 ? "token ids" : "features",
                       di->target_len, per_in, in->dtype == TR_I32 ? "token ids" : "features", per_tg);
    if (r->g->logits >= 0) {
        const struct tr_tensor *lg = &r->g->tensors[r->g->logits];
        if (di->classes > (uint32_t)lg->shape[lg->ndim - 1])
            return tr_fail(err, "%s: data '%s' has %u classes/symbols but the model predicts only %lld",
                           where, r->data.name, di->classes, (long long)lg->shape[lg->ndim - 1]);
    }

    int adam = strcmp(cfg->optimizer.type, "adamw") == 0;
    if (tr_graph_plan(r->g, &r->be, adam ? 2 : 1, err) != TR_OK ||
        tr_optimizer_init(&r->opt, &cfg->optimizer, r->g, &r->be, err) != TR_OK)
        return TR_ERROR;
    r->input_bytes = in->numel * 4;
    r->target_count = tg->numel;
    r->host_inputs = tr_alloc(r->input_bytes);
    r->host_targets = tr_alloc(r->target_count * sizeof(int32_t));
    if (!r->host_inputs || !r->host_targets)
        return tr_fail(err, "out of memory for the input buffers");
    tr_graph_init_params(r->g, &r->be, (uint64_t)cfg->train.seed);
    r->accum = (int)(cfg->train.batch / cfg->train.micro_batch);
    r->vocab = UINT32_MAX;
    for (int i = 0; i < r->g->n_nodes; i++) /* the token embedding's table size */
        if (r->g->nodes[i].op == TR_OP_EMBEDDING && r->g->nodes[i].in[1] == r->g->inputs[0])
            r->vocab = (uint32_t)r->g->tensors[r->g->nodes[i].in[0]].shape[0];
    r->last_val = NAN;
    return TR_OK;
}

static void teardown(struct run *r)
{
    tr_loader_close(r->loader);
    if (r->be.iface) {
        tr_optimizer_free(&r->opt, &r->be);
        tr_graph_free(r->g, &r->be);
        tr_cpu_backend_free(&r->be);
    }
    tr_free(r->host_inputs);
    tr_free(r->host_targets);
    if (r->metrics)
        fclose(r->metrics);
}

static void summary(struct run *r, double elapsed, double tokens)
{
    double parts = r->t_data + r->t_compute + r->t_optimizer + r->t_eval + r->t_checkpoint;
    double other = elapsed > parts ? elapsed - parts : 0;
    fprintf(stderr, "\nrun %s: %llu steps in %.1f s, %.0f tokens/s\n", r->cfg->name,
            (unsigned long long)r->step, elapsed, tokens / (elapsed > 0 ? elapsed : 1));
    fprintf(stderr, "  final train loss %.4f", r->last_loss);
    if (!isnan(r->last_val))
        fprintf(stderr, ", validation loss %.4f, accuracy %.2f%%", r->last_val,
                100 * r->last_accuracy);
    fprintf(stderr, "\n  time: data wait %.1f%%, forward+backward %.1f%%, optimizer %.1f%%, "
                    "evaluation %.1f%%, checkpoint %.1f%%, other %.1f%%\n",
            100 * r->t_data / elapsed, 100 * r->t_compute / elapsed, 100 * r->t_optimizer / elapsed,
            100 * r->t_eval / elapsed, 100 * r->t_checkpoint / elapsed, 100 * other / elapsed);
    if (r->t_data > 0.05 * (r->t_data + r->t_compute))
        fprintf(stderr, "  warning: the step waited for data %.1f%% of the time: raise train.workers "
                        "or prepare the data into shards\n",
                100 * r->t_data / (r->t_data + r->t_compute));
}

int tr_train(struct tr_config *cfg, const struct tr_run_flags *flags)
{
    struct run run, *r = &run;
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    tr_err err = {{0}};
    int code = TR_EXIT_ERROR;
    if (setup(r, &err) != TR_OK)
        goto fail;
    if (!flags->quiet)
        tr_graph_print_memory(r->g, stderr);

    uint64_t position = 0;
    if (flags->resume) {
        int rc = resume(r, &position, &err);
        if (rc == TR_ERROR)
            goto fail;
        if (rc == 0)
            tr_log(TR_LOG_INFO, NULL, "no checkpoint to resume from: starting at step 0");
    }
    struct tr_loader_config lc = {TR_SPLIT_TRAIN, (int)cfg->train.micro_batch,
                                  (int)cfg->train.workers, (int)cfg->train.prefetch, 1,
                                  (uint64_t)cfg->train.seed};
    r->loader = tr_loader_open(&r->data, &lc, position, &err);
    if (!r->loader)
        goto fail;
    char *metrics_path = tr_xasprintf("%s/metrics.jsonl", cfg->run_dir);
    r->metrics = fopen(metrics_path, flags->resume ? "a" : "w");
    free(metrics_path);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    uint64_t steps = (uint64_t)cfg->train.steps;
    double tokens_per_step = (double)cfg->train.batch * r->data.info.target_len;
    double t_start = tr_now(), tokens = 0, lr = 0, grad_norm = 0;
    uint64_t first_step = r->step;
    while (r->step < steps) {
        /* forward and backward over the micro-batches of one step */
        r->be.iface->zero(r->be.context, r->g->grads, r->g->n_params * sizeof(float));
        double scale = loss_scale(r), loss_sum = 0;
        r->g->loss_grad = (float)(scale / r->accum); /* the mean over micro-batches */
        for (int k = 0; k < r->accum; k++) {
            if (load_micro_batch(r, r->loader, &r->t_data, &err) != TR_OK)
                goto fail;
            double t0 = tr_now();
            tr_graph_forward(r->g, &r->be);
            loss_sum += read_loss(r);
            tr_graph_backward(r->g, &r->be);
            r->t_compute += tr_now() - t0;
        }
        r->last_loss = loss_sum / r->accum;

        /* unscale, check, clip, update */
        double t0 = tr_now();
        double sumsq = r->be.iface->sum_squares(r->be.context, r->g->grads, r->g->n_params);
        int finite = isfinite(sumsq) && isfinite(r->last_loss);
        grad_norm = sqrt(sumsq) / scale;
        int apply = finite;
        if (HAS_SLOT(r->precision, struct tr_precision_vtable, update)) {
            apply = r->precision->update(cfg->precision.self, finite, &err);
            if (apply == TR_ERROR)
                goto fail;
        } else if (!finite) {
            tr_fail(&err, "step %llu: the loss or gradients are not finite (loss %g); lower "
                    "optimizer.lr, enable clipping (optimizer.clip) or check the data",
                    (unsigned long long)r->step, r->last_loss);
            goto fail;
        }
        lr = r->schedule->lr(cfg->schedule.self, r->step, steps, cfg->optimizer.lr);
        if (apply) {
            double clip = cfg->optimizer.clip > 0 && grad_norm > cfg->optimizer.clip
                              ? cfg->optimizer.clip / grad_norm : 1.0;
            tr_optimizer_step(&r->opt, r->g, &r->be, clip / scale, lr);
        }
        r->t_optimizer += tr_now() - t0;
        r->step++;
        tokens += tokens_per_step;

        int last = r->step == steps;
        if (r->step % (uint64_t)cfg->train.log_every == 0 || last)
            progress(r, lr, grad_norm, tr_now() - t_start, tokens, flags->quiet);
        if ((cfg->train.eval_every && r->step % (uint64_t)cfg->train.eval_every == 0) || last) {
            double accuracy;
            if (evaluate(r, &r->last_val, &accuracy, &err) != TR_OK)
                goto fail;
            r->last_accuracy = accuracy;
            if (!flags->quiet)
                fprintf(stderr, "step %6llu | validation loss %.4f | accuracy %.2f%%\n",
                        (unsigned long long)r->step, r->last_val, 100 * accuracy);
            if (r->metrics)
                fprintf(r->metrics, "{\"step\": %llu, \"val_loss\": %.6g, \"val_accuracy\": %.6g}\n",
                        (unsigned long long)r->step, r->last_val, isnan(accuracy) ? -1.0 : accuracy);
            if (HAS_SLOT(r->schedule, struct tr_schedule_vtable, observe))
                r->schedule->observe(cfg->schedule.self, r->step, r->last_val);
        }
        int due = cfg->checkpoint_policy.every && r->step % (uint64_t)cfg->checkpoint_policy.every == 0;
        if (due || last || stop_signal) {
            tr_err cerr = {{0}};
            if (save_checkpoint(r, &cerr) != TR_OK) {
                tr_log(TR_LOG_ERROR, NULL, "%s", cerr.msg);
                if (stop_signal || last) { /* nothing later will save it */
                    err = cerr;
                    goto fail;
                }
            } else {
                prune_checkpoints(r);
            }
        }
        if (stop_signal) {
            tr_log(TR_LOG_WARN, NULL, "received signal %d: checkpoint of step %llu saved; exiting "
                   "with code %d (requeue, then --resume auto)", (int)stop_signal,
                   (unsigned long long)r->step, TR_EXIT_PREEMPTED);
            code = TR_EXIT_PREEMPTED;
            goto out;
        }
    }
    (void)first_step;
    if (!flags->quiet)
        summary(r, tr_now() - t_start, tokens);
    code = TR_EXIT_OK;
    goto out;
fail:
    tr_log(TR_LOG_ERROR, NULL, "%s", err.msg);
out:
    teardown(r);
    return code;
}

/* ---- sampling ------------------------------------------------------------ */

static int compare_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Top-k sampling: logits below the k-th largest drop out. */
static void keep_top_k(float *logits, int n, int k)
{
    if (k <= 0 || k >= n)
        return;
    float *sorted = tr_xcalloc((size_t)n, sizeof *sorted);
    memcpy(sorted, logits, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_desc);
    float threshold = sorted[k - 1];
    for (int i = 0; i < n; i++)
        if (logits[i] < threshold)
            logits[i] = -INFINITY;
    free(sorted);
}

static int resolve_checkpoint(const char *path, char **dir, char **name, tr_err *err)
{
    struct stat st;
    char *latest = NULL;
    const char *candidates[] = {"%s/LATEST", "%s/checkpoints/LATEST"};
    for (int i = 0; i < 2; i++) {
        char *p = tr_xasprintf(candidates[i], path);
        FILE *f = fopen(p, "r");
        if (f) {
            char buf[256] = "";
            if (fgets(buf, sizeof buf, f))
                buf[strcspn(buf, "\r\n")] = 0;
            fclose(f);
            *dir = i == 0 ? tr_xstrdup(path) : tr_xasprintf("%s/checkpoints", path);
            *name = tr_xstrdup(buf);
            free(p);
            return TR_OK;
        }
        free(p);
    }
    char *state = tr_xasprintf("%s/state.json", path);
    int ok = stat(state, &st) == 0;
    free(state);
    free(latest);
    if (!ok)
        return tr_fail(err, "%s is not a checkpoint, a checkpoints directory or a run directory "
                       "(no state.json or LATEST there)", path);
    char *copy = tr_xstrdup(path);
    size_t len = strlen(copy);
    while (len > 1 && copy[len - 1] == '/')
        copy[--len] = 0;
    *dir = tr_dirname(copy);
    const char *slash = strrchr(copy, '/');
    *name = tr_xstrdup(slash ? slash + 1 : copy);
    free(copy);
    return TR_OK;
}

int tr_sample(const struct tr_sample_flags *fl)
{
    tr_err err = {{0}};
    char *dir = NULL, *name = NULL;
    void *state_blob = NULL;
    size_t state_size = 0;
    struct tr_json *state = NULL;
    struct tr_config cfg;
    memset(&cfg, 0, sizeof cfg);
    struct run run, *r = &run;
    memset(r, 0, sizeof *r);
    int code = TR_EXIT_ERROR;
    if (resolve_checkpoint(fl->checkpoint, &dir, &name, &err) != TR_OK)
        goto fail;
    char *state_path = tr_xasprintf("%s/%s/state.json", dir, name);
    FILE *f = fopen(state_path, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        state_size = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        state_blob = tr_xcalloc(state_size + 1, 1);
        if (fread(state_blob, 1, state_size, f) != state_size)
            state_size = 0;
        fclose(f);
    }
    if (!state_size || !(state = tr_json_parse(state_blob, state_size, NULL))) {
        tr_fail(&err, "cannot read %s", state_path);
        free(state_path);
        goto fail;
    }
    free(state_path);
    const char *recipe = fl->recipe ? fl->recipe : tr_json_string(state, "recipe");
    if (!recipe) {
        tr_fail(&err, "the checkpoint does not name its recipe; pass --recipe FILE");
        goto fail;
    }
    /* one sequence at a time; the checkpoint is read through the local backend */
    char absdir[PATH_MAX];
    char *ckdir = tr_xasprintf("checkpoint.dir=%s", realpath(dir, absdir) ? absdir : dir);
    /* the training run's overrides, then one sequence at a time */
    const struct tr_json *trained = tr_json_get(state, "overrides");
    size_t n_trained = trained && trained->type == TR_JSON_ARRAY ? trained->n : 0;
    const char **overrides = tr_xcalloc(n_trained + 4, sizeof *overrides);
    int n_over = 0;
    for (size_t i = 0; i < n_trained; i++)
        if (trained->items[i]->type == TR_JSON_STRING)
            overrides[n_over++] = trained->items[i]->string;
    overrides[n_over++] = "train.micro_batch=1";
    overrides[n_over++] = "train.batch=1";
    overrides[n_over++] = ckdir;
    int rc = tr_config_load(&cfg, recipe, overrides, n_over, &err);
    free(overrides);
    free(ckdir);
    if (rc != TR_OK)
        goto fail;
    r->cfg = &cfg;
    if (setup(r, &err) != TR_OK)
        goto fail;
    uint64_t pos;
    if (load_checkpoint(r, name, &pos, &err) != TR_OK)
        goto fail;
    struct tr_graph *g = r->g;
    struct tr_tensor *in = &g->tensors[g->inputs[0]];
    if (in->dtype != TR_I32 || g->logits < 0) {
        tr_fail(&err, "sample needs a language model (token inputs and logits)");
        goto fail;
    }
    int T = (int)in->shape[1];
    const struct tr_tensor *lg = &g->tensors[g->logits];
    int V = (int)lg->shape[lg->ndim - 1];
    int32_t *ctx = tr_xcalloc((size_t)T, sizeof *ctx);
    float *logits = tr_xcalloc((size_t)V, sizeof *logits), *probs = tr_xcalloc((size_t)V, sizeof *probs);
    size_t plen = strlen(fl->prompt);
    size_t total = plen + (size_t)fl->tokens;
    unsigned char *text = tr_xcalloc(total + 1, 1);
    memcpy(text, fl->prompt, plen);
    uint64_t rng = fl->seed * 0x9e3779b97f4a7c15ULL + 1;
    fputs(fl->prompt, stdout);
    for (size_t n = plen; n < total; n++) {
        size_t start = n > (size_t)T ? n - (size_t)T : 0;
        int len = (int)(n - start);
        for (int t = 0; t < T; t++)
            ctx[t] = t < len ? text[start + (size_t)t] : 0;
        r->be.iface->upload(r->be.context, in->data, ctx, (size_t)T * sizeof(int32_t));
        tr_graph_forward(g, &r->be);
        int at = len > 0 ? len - 1 : 0;
        r->be.iface->download(r->be.context, logits, (float *)lg->data + (size_t)at * (size_t)V,
                              (size_t)V * sizeof(float));
        keep_top_k(logits, V, fl->top_k);
        tr_cpu_softmax(probs, logits, V, (float)fl->temperature);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        double u = (double)(rng >> 11) * 0x1.0p-53, acc = 0;
        int pick = V - 1;
        for (int k = 0; k < V; k++) {
            acc += probs[k];
            if (u < acc) {
                pick = k;
                break;
            }
        }
        text[n] = (unsigned char)pick;
        fputc(pick, stdout);
        fflush(stdout);
    }
    fputc('\n', stdout);
    free(ctx);
    free(logits);
    free(probs);
    free(text);
    code = TR_EXIT_OK;
    goto out;
fail:
    tr_log(TR_LOG_ERROR, NULL, "%s", err.msg);
out:
    teardown(r);
    if (cfg.recipe)
        tr_config_free(&cfg);
    tr_json_free(state);
    free(state_blob);
    free(dir);
    free(name);
    return code;
}
