/*
 * `trainrun export --format hf --merge`: an adapter run's checkpoint merged
 * into its base and written as a Hugging Face directory.  The run's recipe
 * (state.json names it) is opened as a weights-only session, so the base
 * loads as training loaded it, from model.from and checked against the
 * identity the checkpoint recorded, then the adapters; each adapted weight
 * becomes W + (B @ A) * scale (an NF4 base dequantised first: the merged
 * weights are the dequantised base plus the update, in fp32, then the
 * export's dtype).
 */
#include "merge.h"

#include "adapters.h"
#include "backend.h"
#include "checkpoint.h"
#include "hf_weights.h"
#include "session.h"
#include "../../kernels/host.h"
#include "../config/hf_config.h"
#include "../util/json.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <stdlib.h>
#include <string.h>

/* The recipe and overrides state.json recorded, loaded as one process. */
static int load_run_config(struct tr_config *cfg, const struct tr_json *state, tr_err *err)
{
    const char *recipe = tr_json_string(state, "recipe");
    if (!recipe || !*recipe)
        return tr_fail(err, "the checkpoint does not name its recipe");
    const struct tr_json *o = tr_json_get(state, "overrides");
    size_t n = o && o->type == TR_JSON_ARRAY ? o->n : 0;
    const char **ov = tr_xcalloc(n + 1, sizeof *ov);
    int k = 0;
    for (size_t i = 0; i < n; i++)
        if (o->items[i]->type == TR_JSON_STRING)
            ov[k++] = o->items[i]->string;
    int rc = tr_config_load(cfg, recipe, ov, k, err);
    free(ov);
    cfg->rank = (struct tr_rank_info){0, 1, 0, 1, NULL};
    return rc;
}

/* Tensor t's merged fp32 host values: a frozen base weight with its
 * adapter's update added, or the weight as trained. */
static float *merged(const struct tr_session *s, const struct tr_tensor *t, float scale,
                     tr_err *err)
{
    const struct tr_graph *g = s->g;
    float *w = malloc(t->numel * sizeof(float) + 1);
    if (!w) {
        tr_fail(err, "out of memory merging '%s'", t->name);
        return NULL;
    }
    if (tr_be_load_weight(&s->be, t, w, err) != TR_OK) {
        free(w);
        return NULL;
    }
    size_t len = strlen(t->name);
    if (t->role != TR_ROLE_FROZEN || len < 8 || strcmp(t->name + len - 7, ".weight") != 0)
        return w;
    char name[1100];
    snprintf(name, sizeof name, "%.*s.lora_A.weight", (int)(len - 7), t->name);
    int ia = tr_graph_find(g, name);
    snprintf(name, sizeof name, "%.*s.lora_B.weight", (int)(len - 7), t->name);
    int ib = tr_graph_find(g, name);
    if (ia < 0 || ib < 0)
        return w;
    const struct tr_tensor *A = &g->tensors[ia], *B = &g->tensors[ib];
    float *a = malloc(A->numel * sizeof(float) + 1), *b = malloc(B->numel * sizeof(float) + 1);
    if (!a || !b) {
        free(a);
        free(b);
        free(w);
        tr_fail(err, "out of memory merging '%s'", t->name);
        return NULL;
    }
    tr_be_download(&s->be, a, A->data, A->numel * sizeof(float));
    tr_be_download(&s->be, b, B->data, B->numel * sizeof(float));
    tr_cpu_lora_merge(w, a, b, t->shape[0], t->shape[1], (int)A->shape[0], scale);
    free(a);
    free(b);
    return w;
}

/* Every weight of the base model, merged, as an in-memory safetensors file
 * under trainrun's names (what tr_hf_export reads). */
static void *merged_weights(const struct tr_session *s, size_t *size, tr_err *err)
{
    const struct tr_graph *g = s->g;
    float scale = (float)tr_lora_scale(&s->cfg->lora);
    struct tr_st_entry *e = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *e);
    size_t n = 0;
    void *blob = NULL;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if ((t->role != TR_ROLE_PARAM && t->role != TR_ROLE_FROZEN) || tr_adapter_param(t->name))
            continue;
        float *w = merged(s, t, scale, err);
        if (!w)
            goto done;
        e[n] = (struct tr_st_entry){t->name, TR_F32, t->ndim, {0}, w, t->numel * sizeof(float)};
        memcpy(e[n].shape, t->shape, sizeof e[n].shape);
        n++;
    }
    blob = tr_safetensors_write(e, n, "{\"format\":\"pt\"}", size);
    if (!blob)
        tr_fail(err, "out of memory merging the weights");
done:
    for (size_t i = 0; i < n; i++)
        free((void *)e[i].data);
    free(e);
    return blob;
}

int tr_export_merged(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir,
                     tr_err *err)
{
    struct tr_run_state st;
    struct tr_json *state = tr_checkpoint_read_state(checkpoint_dir, &st, err);
    if (!state)
        return TR_ERROR;
    struct tr_config cfg;
    struct tr_session s;
    memset(&cfg, 0, sizeof cfg);
    memset(&s, 0, sizeof s);
    struct tr_hf_arch a;
    struct tr_st_file *file = NULL;
    void *blob = NULL;
    size_t size = 0;
    int rc = TR_ERROR;
    const char *config = tr_json_string(state, "hf_config");
    if (!tr_json_string(state, "peft_config")) {
        tr_fail(err, "%s is not a checkpoint of adapters: export --format hf writes its weights "
                "without --merge", checkpoint_dir);
        goto done;
    }
    if (!config) {
        tr_fail(err, "%s records no Hugging Face architecture (its model is not a llama or gpt)",
                checkpoint_dir);
        goto done;
    }
    if (tr_hf_config_parse(config, strlen(config), checkpoint_dir, &a, err) != TR_OK ||
        load_run_config(&cfg, state, err) != TR_OK ||
        tr_session_open(&s, &cfg, TR_SESSION_WEIGHTS, err) != TR_OK ||
        tr_session_load_pretrained(&s, err) != TR_OK ||
        tr_session_check_base(&s, st.base, checkpoint_dir, err) != TR_OK ||
        tr_checkpoint_load_weights(checkpoint_dir, s.g, &s.be, s.g->params, err) != TR_OK)
        goto done;
    if (!(blob = merged_weights(&s, &size, err)) ||
        !(file = tr_safetensors_read(blob, size, "the merged weights", err)))
        goto done;
    rc = tr_hf_export(&a, file, "the merged weights", out_dir, dtype, err);
    if (rc == TR_OK)
        rc = tr_export_hf_extras(checkpoint_dir, tr_json_string(state, "weights_from"), out_dir,
                                 err);
done:
    tr_safetensors_free(file);
    free(blob);
    tr_session_close(&s);
    tr_config_free(&cfg);
    tr_json_free(state);
    return rc;
}
