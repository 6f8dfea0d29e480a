/* `trainrun sample`: text from a checkpoint of a language model, one token
 * at a time through the training graph (top-k, temperature, a seeded
 * generator, so the same flags give the same text). */
#include "run.h"
#include "run_internal.h"

#include "../util/json.h"
#include "../../kernels/host.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (tr_checkpoint_resolve(fl->checkpoint, &dir, &name, &err) != TR_OK)
        goto fail;
    /* the recipe and overrides below come from state.json: only a verified one */
    char *ckpt_path = tr_xasprintf("%s/%s", dir, name);
    int verified = tr_checkpoint_verify(ckpt_path, &err);
    free(ckpt_path);
    if (verified != TR_OK)
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
    if (tr_run_setup(r, &err) != TR_OK)
        goto fail;
    struct tr_run_state st;
    if (tr_checkpointer_load(r->ckpt, name, r->g->params, r->opt.state, &st, &err) != TR_OK)
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
    tr_run_teardown(r);
    if (cfg.recipe)
        tr_config_free(&cfg);
    tr_json_free(state);
    free(state_blob);
    free(dir);
    free(name);
    return code;
}
