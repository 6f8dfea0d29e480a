/* `trainrun sample`: text from a checkpoint of a language model (or from a
 * recipe's model = { from = DIR } weights), one token at a time through the
 * training graph (top-k, temperature, a seeded generator, so the same flags
 * give the same text).  It only reads: the run's setup in the read-only mode
 * `trainrun eval` uses, and the weights through tr_checkpoint_load_weights,
 * so a running run's checkpoints directory is left as it is. */
#include "run.h"
#include "run_internal.h"

#include "../config/hf_config.h"
#include "../util/json.h"
#include "../../kernels/host.h"

#include <errno.h>
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

/* The prompt as token ids: its bytes, or with --ids the decimal ids it
 * lists (separated by spaces or commas).  Each must be below vocab: the
 * embedding would read a row past its table.  NULL with err set. */
static int32_t *prompt_tokens(const struct tr_sample_flags *fl, int64_t vocab, size_t *n,
                              tr_err *err)
{
    const char *p = fl->prompt;
    int32_t *ids = tr_xcalloc(strlen(p) + 1, sizeof *ids);
    *n = 0;
    while (*p) {
        long long id;
        if (!fl->ids) {
            id = (unsigned char)*p++;
        } else {
            if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
                p++;
                continue;
            }
            char *end;
            errno = 0;
            id = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : -1;
            if (id < 0 || errno || (*end && !strchr(" ,\t\n", *end))) {
                free(ids);
                tr_fail(err, "--prompt: '%.40s' is not a token id: with --ids the prompt lists "
                        "token ids, e.g. --prompt \"1 2 3\"", p);
                return NULL;
            }
            p = end;
        }
        if (id >= vocab) {
            free(ids);
            if (fl->ids)
                tr_fail(err, "--prompt: token id %lld is not in the model's vocabulary of %lld",
                        id, (long long)vocab);
            else
                tr_fail(err, "--prompt: byte %lld (%s%c%s) is not in the model's vocabulary of "
                        "%lld tokens (the prompt's bytes are its token ids): use bytes below "
                        "%lld, or token ids with --ids", id, id >= 32 && id < 127 ? "'" : "",
                        id >= 32 && id < 127 ? (int)id : '?', id >= 32 && id < 127 ? "'" : "",
                        (long long)vocab, (long long)vocab);
            return NULL;
        }
        ids[(*n)++] = (int32_t)id;
    }
    if (fl->ids && *n == 0) {
        free(ids);
        tr_fail(err, "--ids needs a --prompt of one token id at least, e.g. --prompt \"1\"");
        return NULL;
    }
    return ids;
}

/* A token to stdout: its byte, or with --ids its id after a space. */
static void put_token(const struct tr_sample_flags *fl, int32_t id, size_t n)
{
    if (fl->ids)
        printf("%s%d", n ? " " : "", (int)id);
    else
        fputc(id, stdout);
}

int tr_sample(const struct tr_sample_flags *fl)
{
    tr_err err = {{0}};
    char *dir = NULL, *name = NULL, *ckpt = NULL;
    struct tr_json *state = NULL;
    struct tr_run_state st;
    const char **overrides = NULL;
    struct tr_config cfg;
    memset(&cfg, 0, sizeof cfg);
    struct run run, *r = &run;
    memset(r, 0, sizeof *r);
    int code = TR_EXIT_ERROR;
    if (fl->checkpoint) {
        if (tr_checkpoint_resolve(fl->checkpoint, &dir, &name, &err) != TR_OK)
            goto fail;
        /* the recipe and overrides below come from state.json: only one
         * whose own checksum and fields hold (its blobs are verified when
         * the weights are read) */
        ckpt = tr_xasprintf("%s/%s", dir, name);
        if (!(state = tr_checkpoint_read_state(ckpt, &st, &err)))
            goto fail;
    }
    const char *recipe = fl->recipe ? fl->recipe : state ? tr_json_string(state, "recipe") : NULL;
    if (!recipe) {
        tr_fail(&err, "the checkpoint does not name its recipe; pass --recipe FILE");
        goto fail;
    }
    /* the training run's overrides, the command line's, then one sequence
     * at a time */
    const struct tr_json *trained = state ? tr_json_get(state, "overrides") : NULL;
    size_t n_trained = trained && trained->type == TR_JSON_ARRAY ? trained->n : 0;
    overrides = tr_xcalloc(n_trained + (size_t)fl->n_overrides + 2, sizeof *overrides);
    int n_over = 0;
    for (size_t i = 0; i < n_trained; i++)
        if (trained->items[i]->type == TR_JSON_STRING)
            overrides[n_over++] = trained->items[i]->string;
    for (int i = 0; i < fl->n_overrides; i++)
        overrides[n_over++] = fl->overrides[i];
    overrides[n_over++] = "train.micro_batch=1";
    overrides[n_over++] = "train.batch=1";
    if (tr_config_load(&cfg, recipe, overrides, n_over, &err) != TR_OK)
        goto fail;
    if (!ckpt && !tr_hf_from_dir(cfg.recipe)) {
        tr_fail(&err, "%s: the model has no weights to sample from: name a checkpoint (trainrun "
                "sample RUN_DIR) or load them with model = { from = DIR }", recipe);
        goto fail;
    }
    /* one process, and the run's setup in its read-only mode: no run
     * directory, checkpoint plugin or checkpointer, whose start tidies the
     * checkpoints directory (and would make run_dir where sample runs) */
    cfg.rank = (struct tr_rank_info){0, 1, 0, 1, NULL};
    r->cfg = &cfg;
    r->eval_only = 1;
    if (tr_run_setup(r, &err) != TR_OK)
        goto fail;
    int loaded = ckpt ? tr_checkpoint_load_weights(ckpt, r->g, &r->be, r->g->params, &err)
                      : tr_run_load_pretrained(r, &err);
    if (loaded != TR_OK)
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
    /* the embedding reads a row per id: an id past its table is no token */
    int64_t vocab = r->vocab < (uint32_t)V ? (int64_t)r->vocab : V;
    if (!fl->ids && V > 256) {
        tr_fail(&err, "%s: the model predicts %d token ids, more than the 256 bytes sample "
                "prints as text; pass --ids to give the prompt and get the text as token ids "
                "(the tokenizer that made the data turns them into text)", recipe, V);
        goto fail;
    }
    size_t plen = 0;
    int32_t *prompt = prompt_tokens(fl, vocab, &plen, &err);
    if (!prompt)
        goto fail;
    size_t total = plen + (size_t)fl->tokens;
    int32_t *text = tr_xcalloc(total + 1, sizeof *text);
    memcpy(text, prompt, plen * sizeof *text);
    free(prompt);
    int32_t *ctx = tr_xcalloc((size_t)T, sizeof *ctx);
    float *logits = tr_xcalloc((size_t)V, sizeof *logits), *probs = tr_xcalloc((size_t)V, sizeof *probs);
    uint64_t rng = fl->seed * 0x9e3779b97f4a7c15ULL + 1;
    for (size_t n = 0; n < plen; n++)
        put_token(fl, text[n], n);
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
        text[n] = pick;
        put_token(fl, pick, n);
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
    free(overrides);
    tr_json_free(state);
    free(ckpt);
    free(dir);
    free(name);
    return code;
}
