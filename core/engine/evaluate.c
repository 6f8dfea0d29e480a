/* `trainrun eval`: the validation loss of the model a recipe describes,
 * without training.  The run's own setup builds it (so every lever that
 * changes numbers — device, precision, threads, micro_batch, a recipe's
 * model = { from = DIR } — acts as it does in the run), a checkpoint's
 * weights replace the initial ones when one is named, and the run's own
 * evaluation (tr_session_evaluate, below: the one evaluation) measures it: for the same weights and
 * batches the number is the one the run logged.  Nothing is written: no run
 * directory, checkpoint plugin, lock or metrics. */
#include "run.h"
#include "session.h"

#include "checkpoint.h"
#include "../config/hf_config.h"
#include "../util/json.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <errno.h>
#include <unistd.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The checkpoint named on the command line: its directory, and the recipe
 * and overrides its run recorded (state.json, checked before it is read). */
struct eval_checkpoint {
    char *path;              /* dir/name */
    struct tr_json *state;
    struct tr_run_state st;
};

static int open_checkpoint(const char *arg, struct eval_checkpoint *c, tr_err *err)
{
    char *dir = NULL, *name = NULL;
    if (tr_checkpoint_resolve(arg, &dir, &name, err) != TR_OK)
        return TR_ERROR;
    c->path = tr_xasprintf("%s/%s", dir, name);
    free(dir);
    free(name);
    c->state = tr_checkpoint_read_state(c->path, &c->st, err);
    return c->state ? TR_OK : TR_ERROR;
}

/* Same file: the checkpoint records its recipe's absolute path. */
static int same_file(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && strcmp(ra, rb) == 0;
}

/* The overrides to load the recipe with: the checkpoint's run's (when the
 * recipe is the one it trained from: the model it saved is the recipe's
 * with them), then the command line's, which win. */
static const char **overrides_for(const struct tr_eval_flags *fl, const struct eval_checkpoint *c,
                                  const char *recipe, struct tr_eval_result *out, int *n)
{
    const struct tr_json *trained = c->state ? tr_json_get(c->state, "overrides") : NULL;
    size_t n_trained = trained && trained->type == TR_JSON_ARRAY ? trained->n : 0;
    const char *recorded = c->state ? tr_json_string(c->state, "recipe") : NULL;
    if (n_trained && !(recorded && same_file(recipe, recorded))) {
        tr_log(TR_LOG_WARN, NULL, "the checkpoint's run trained from %s with overrides of its "
               "own (its state.json lists them), which are not applied to %s",
               recorded ? recorded : "another recipe", recipe);
        out->other_recipe = 1;
        n_trained = 0;
    }
    const char **list = tr_xcalloc(n_trained + (size_t)fl->n_overrides + 1, sizeof *list);
    char said[1024] = "";
    size_t len = 0;
    *n = 0;
    for (size_t i = 0; i < n_trained; i++)
        if (trained->items[i]->type == TR_JSON_STRING) {
            list[(*n)++] = trained->items[i]->string;
            if (len < sizeof said)
                len += (size_t)snprintf(said + len, sizeof said - len, " %s",
                                        trained->items[i]->string);
        }
    out->recorded_overrides = *n;
    if (*n)
        tr_log(TR_LOG_INFO, NULL, "the run's overrides apply first, then the command line's:%s",
               said);
    for (int i = 0; i < fl->n_overrides; i++)
        list[(*n)++] = fl->overrides[i];
    return list;
}

/* ---- the one evaluation ------------------------------------------------------ */

/* The first max_batches micro-batches of split, in order (no shuffle),
 * forward only; rank r evaluates batches r, r + world, ... and the ranks
 * sum what they saw. */
/* eval --logits FILE: the micro-batch just evaluated as safetensors,
 * "input_ids" (I32 [B, T]), "labels" (I32, the targets) and "logits" (F32
 * [B, T, V]), so that a reference (transformers) can run the same ids and
 * compare; written under a temporary name and renamed. */
static int write_logits(const struct tr_session *s, const char *path, tr_err *err)
{
    const struct tr_graph *g = s->g;
    if (g->logits < 0 || g->tensors[g->logits].dtype != TR_F32)
        return tr_fail(err, "--logits %s: the model has no fp32 logits to write", path);
    const struct tr_tensor *lg = &g->tensors[g->logits], *in = &g->tensors[g->inputs[0]];
    const struct tr_tensor *tg = &g->tensors[g->inputs[1]];
    float *logits = tr_xcalloc(lg->numel ? lg->numel : 1, sizeof *logits);
    tr_be_download(&s->be, logits, lg->data, lg->numel * sizeof(float));
    struct tr_st_entry e[3] = {
        {"input_ids", in->dtype, in->ndim, {0}, s->host_inputs, in->numel * 4},
        {"labels", TR_I32, tg->ndim, {0}, s->host_targets, tg->numel * 4},
        {"logits", TR_F32, lg->ndim, {0}, logits, lg->numel * sizeof(float)},
    };
    for (int d = 0; d < 4; d++) {
        e[0].shape[d] = d < in->ndim ? in->shape[d] : 0;
        e[1].shape[d] = d < tg->ndim ? tg->shape[d] : 0;
        e[2].shape[d] = d < lg->ndim ? lg->shape[d] : 0;
    }
    size_t size = 0;
    void *blob = tr_safetensors_write(e, 3, "{\"producer\":\"trainrun eval --logits\"}", &size);
    free(logits);
    char *tmp = tr_xasprintf("%s.tmp-%ld", path, (long)getpid());
    FILE *f = blob ? fopen(tmp, "wb") : NULL;
    int ok = f && fwrite(blob, 1, size, f) == size;
    if (f && fclose(f) != 0)
        ok = 0;
    if (ok && rename(tmp, path) != 0)
        ok = 0;
    int rc = ok ? TR_OK : tr_fail(err, "--logits: cannot write %s: %s", path,
                                  blob ? strerror(errno) : "out of memory");
    if (!ok)
        remove(tmp);
    free(tmp);
    free(blob);
    return rc;
}

static int graph_forward(void *ctx, struct tr_session *s, tr_err *err)
{
    (void)ctx, (void)err;
    tr_graph_forward(s->g, &s->be);
    return TR_OK;
}

int tr_session_evaluate(struct tr_session *s, enum tr_split split, uint64_t max_batches,
                        double *loss, double *accuracy, uint64_t *batches, tr_err *err)
{
    struct tr_eval_pass pass = {graph_forward, NULL, s->rank, s->world, 1};
    return tr_session_evaluate_pass(s, split, max_batches, &pass, loss, accuracy, batches, err);
}

int tr_session_evaluate_pass(struct tr_session *s, enum tr_split split, uint64_t max_batches,
                             const struct tr_eval_pass *pass, double *loss, double *accuracy,
                             uint64_t *batches, tr_err *err)
{
    struct tr_loader_config lc = {split, (int)s->micro_batch, 0, 1, 0,
                                  (uint64_t)s->cfg->train.seed, NULL, pass->part, pass->parts,
                                  NULL, /* each token once, with random windows too */
                                  s->data.info.eval_stride[split]};
    struct tr_loader *val = tr_loader_open(&s->data, &lc, 0, err);
    if (!val)
        return TR_ERROR;
    uint64_t n = tr_loader_batches_per_epoch(val);
    if (n > max_batches)
        n = max_batches;
    uint64_t parts = (uint64_t)pass->parts, part = (uint64_t)pass->part;
    uint64_t mine = n / parts + (part < n % parts);
    double sum = 0, weights = 0; /* the loss as the mean over every counted target */
    int64_t correct = 0, counted = 0;
    /* eval mode: batch norm normalises with its running statistics and
     * updates nothing (training resumes in training mode) */
    s->g->training = 0;
    /* sharded parameters: every forward gathers them, a collective, so
     * every rank runs as many; those past their share count nothing */
    uint64_t runs = s->gather ? (n + parts - 1) / parts : mine;
    for (uint64_t i = 0; i < runs; i++) {
        if (i >= mine) {
            tr_graph_forward(s->g, &s->be); /* on whatever the inputs hold */
            continue;
        }
        if (tr_session_load_batch(s, val, NULL, err) != TR_OK ||
            pass->forward(pass->ctx, s, err) != TR_OK) {
            s->g->training = 1;
            tr_loader_close(val);
            return TR_ERROR;
        }
        if (!pass->count)
            continue;
        if (i == 0 && s->logits_out && write_logits(s, s->logits_out, err) != TR_OK) {
            s->g->training = 1;
            tr_loader_close(val);
            return TR_ERROR;
        }
        double w = tr_session_batch_weight(s, tr_session_loss_targets(s));
        sum += tr_session_read_loss(s) * w;
        weights += w;
        if (s->g->logits >= 0 && tr_be_counts_correct(&s->be)) {
            const struct tr_tensor *lg = &s->g->tensors[s->g->logits];
            int V = (int)lg->shape[lg->ndim - 1];
            int64_t valid = 0;
            correct += tr_be_count_correct(&s->be, lg->data, s->g->tensors[s->g->inputs[1]].data,
                                           (int)(lg->numel / (size_t)V), V, -1, &valid);
            counted += valid;
        }
    }
    s->g->training = 1;
    tr_loader_close(val);
    if (s->gather)
        tr_gather_release_all(s->gather);
    if (s->comm) {
        float totals[4] = {(float)sum, (float)correct, (float)counted, (float)weights};
        if (tr_comm_allreduce_host(s->comm, totals, 4, err) != TR_OK)
            return TR_ERROR;
        sum = totals[0];
        correct = (int64_t)totals[1];
        counted = (int64_t)totals[2];
        weights = totals[3];
    }
    /* weights == n unless targets were masked: then sum / n exactly as before */
    *loss = weights == (double)n ? sum / (double)n : weights > 0 ? sum / weights : NAN;
    *accuracy = counted ? (double)correct / (double)counted : NAN;
    if (batches)
        *batches = n;
    return TR_OK;
}

/* ---- `trainrun eval` ------------------------------------------------------------ */

/* The recipe to evaluate (the command line's, else the one the checkpoint
 * records) loaded with overrides_for's overrides, as one process.
 * *overrides is the caller's to free once cfg is. */
static int load_config(const struct tr_eval_flags *fl, const struct eval_checkpoint *ck,
                       struct tr_config *cfg, const char ***overrides, struct tr_eval_result *out,
                       tr_err *err)
{
    const char *recipe = fl->recipe;
    if (!recipe && ck->state)
        recipe = tr_json_string(ck->state, "recipe");
    if (!recipe || !*recipe)
        return tr_fail(err, "%s", fl->checkpoint ? "the checkpoint does not name its recipe: trainrun "
                       "eval RECIPE --checkpoint PATH" : "eval needs a recipe: trainrun eval RECIPE");
    snprintf(out->recipe, sizeof out->recipe, "%s", recipe);
    int n = 0;
    *overrides = overrides_for(fl, ck, recipe, out, &n);
    if (tr_config_load(cfg, recipe, *overrides, n, err) != TR_OK)
        return TR_ERROR;
    /* one process: the ranks of a data-parallel run evaluate the same
     * batches between them, so one alone gets the same loss */
    cfg->rank = (struct tr_rank_info){0, 1, 0, 1, NULL};
    return TR_OK;
}

/* The weights evaluated, into the open session: the checkpoint's when one
 * is named, else model.from's, else the initial ones it built. */
static int load_weights(struct tr_session *r, struct tr_config *cfg,
                        const struct eval_checkpoint *ck, struct tr_eval_result *out, tr_err *err)
{
    /* the weights a fresh run would start from (the run loads them in
     * start(), after the session opens); a checkpoint's replace them */
    const char *from = tr_hf_from_dir(cfg->recipe);
    /* an adapter's checkpoint holds the adapter alone: its base first */
    if ((from && !ck->path) || tr_session_base_first(r)) {
        if (tr_session_load_pretrained(r, err) != TR_OK)
            return TR_ERROR;
        out->weights = TR_EVAL_FROM;
        snprintf(out->source, sizeof out->source, "%s", from ? from : "the seed");
    }
    if (ck->path) {
        if (tr_session_check_base(r, ck->st.base, ck->path, err) != TR_OK ||
            tr_checkpoint_load_weights(ck->path, r->g, &r->be, r->g->params, err) != TR_OK)
            return TR_ERROR;
        out->weights = TR_EVAL_CHECKPOINT;
        out->step = ck->st.step;
        snprintf(out->source, sizeof out->source, "%s", ck->path);
    }
    return TR_OK;
}

/* What the result says besides the loss: the split's size in batches, the
 * samples and tokens evaluated, the classes, and what it ran on. */
static void fill_result(struct tr_eval_result *out, const struct tr_session *r,
                        const struct tr_config *cfg, enum tr_split split)
{
    const struct tr_data_info *di = &r->data.info;
    out->split_batches = tr_session_eval_samples(di, split) / (uint64_t)r->micro_batch;
    out->micro_batch = r->micro_batch;
    out->samples = out->batches * (uint64_t)r->micro_batch;
    out->sequence = di->input_dtype == TR_I32 && di->target_len == di->input_len &&
                    di->target_len > 1;
    out->tokens = out->samples * di->target_len;
    out->bytes_per_token = out->sequence ? di->bytes_per_token[split] : 0;
    if (r->g->logits >= 0) {
        const struct tr_tensor *lg = &r->g->tensors[r->g->logits];
        out->classes = (uint32_t)lg->shape[lg->ndim - 1];
    }
    out->seed = cfg->train.seed;
    snprintf(out->device, sizeof out->device, "%s", cfg->device);
    snprintf(out->precision, sizeof out->precision, "%s", cfg->precision.plugin->info->name);
}

int tr_eval(const struct tr_eval_flags *fl, struct tr_eval_result *out, tr_err *err)
{
    memset(out, 0, sizeof *out);
    out->accuracy = NAN;
    out->loss = NAN;
    struct eval_checkpoint ck = {0};
    struct tr_config cfg;
    memset(&cfg, 0, sizeof cfg);
    struct tr_session session, *r = &session;
    memset(r, 0, sizeof *r);
    const char **overrides = NULL;
    int rc = TR_ERROR;
    double t0 = tr_now();

    if (fl->checkpoint && open_checkpoint(fl->checkpoint, &ck, err) != TR_OK)
        goto done;
    if (load_config(fl, &ck, &cfg, &overrides, out, err) != TR_OK ||
        tr_session_open(r, &cfg, TR_SESSION_EVAL, err) != TR_OK ||
        load_weights(r, &cfg, &ck, out, err) != TR_OK)
        goto done;
    enum tr_split split = fl->train_split ? TR_SPLIT_TRAIN : TR_SPLIT_VAL;
    r->logits_out = fl->logits;
    if (tr_session_check_split(r, split, 0, err) != TR_OK)
        goto done;
    uint64_t batches = fl->batches ? fl->batches : (uint64_t)cfg.train.eval_batches;
    double accuracy;
    if (tr_session_evaluate(r, split, batches, &out->loss, &accuracy, &out->batches, err) != TR_OK)
        goto done;
    out->accuracy = accuracy;
    fill_result(out, r, &cfg, split);
    rc = TR_OK;
done:
    tr_session_close(r);
    if (cfg.recipe)
        tr_config_free(&cfg);
    free(overrides);
    tr_json_free(ck.state);
    free(ck.path);
    out->seconds = tr_now() - t0;
    return rc;
}
