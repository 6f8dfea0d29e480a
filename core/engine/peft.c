/*
 * PEFT adapter directories in (tr_peft_load) and the adapter_config.json a
 * run records for its export (tr_peft_config_text); the export itself is
 * checkpoint_export.c's.  peft.h says the naming.
 */
#include "peft.h"

#include "adapters.h"
#include "backend.h"
#include "hf_weights.h"
#include "../util/json.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <stdlib.h>
#include <string.h>

#define MAX_ADAPTER_BYTES ((size_t)64 << 30)

/* The last path component of a directory or hub id ("org/model" -> "model"). */
static const char *last_part(const char *s, size_t *len)
{
    size_t n = strlen(s);
    while (n > 1 && s[n - 1] == '/')
        n--;
    const char *start = s + n;
    while (start > s && start[-1] != '/')
        start--;
    *len = (size_t)(s + n - start);
    return start;
}

/* The adapter says which base it was trained on (its adapter_config.json,
 * read by config/lora.c); a base of another name is refused (the shapes
 * may match by chance). */
static int check_base_name(const struct tr_lora_config *lc, const char *base_dir, tr_err *err)
{
    if (!base_dir || !lc->from_base)
        return TR_OK;
    size_t a, b;
    const char *x = last_part(lc->from_base, &a), *y = last_part(base_dir, &b);
    if (a == b && strncmp(x, y, a) == 0)
        return TR_OK;
    return tr_fail(err, "%s was trained on \"%s\", but model.from is %s; use that base, or set "
                   "base_model_name_or_path in %s/adapter_config.json if this is the same model "
                   "under another name", lc->from, lc->from_base, base_dir, lc->from);
}

int tr_peft_load(struct tr_graph *g, const struct tr_backend *be, const struct tr_lora_config *lc,
                 const char *base_dir, tr_err *err)
{
    if (check_base_name(lc, base_dir, err) != TR_OK)
        return TR_ERROR;
    char *path = tr_xasprintf("%s/adapter_model.safetensors", lc->from);
    size_t size = 0;
    char *buf = tr_read_small_file(path, MAX_ADAPTER_BYTES, "an adapter_model.safetensors", &size,
                                   err);
    struct tr_st_file *st = buf ? tr_safetensors_read(buf, size, path, err) : NULL;
    int rc = TR_ERROR;
    char *seen = tr_xcalloc((size_t)g->n_tensors + 1, 1);
    if (!st)
        goto done;
    size_t prefix = strlen(TR_PEFT_PREFIX);
    for (size_t i = 0; i < tr_safetensors_count(st); i++) {
        const struct tr_st_entry *e = tr_safetensors_at(st, i);
        const char *name = strncmp(e->name, TR_PEFT_PREFIX, prefix) == 0 ? e->name + prefix : NULL;
        int k = name ? tr_graph_find(g, name) : -1;
        struct tr_tensor *t = k >= 0 ? &g->tensors[k] : NULL;
        if (!t || t->role != TR_ROLE_PARAM) {
            tr_fail(err, "%s holds '%s', which is no trained tensor of this model with these "
                    "adapters (lora.targets, modules_to_save): the adapter was made for another "
                    "model or another configuration", path, e->name);
            goto done;
        }
        int same = e->ndim == t->ndim && e->dtype != TR_I32 && e->dtype != TR_NF4;
        for (int d = 0; same && d < t->ndim; d++)
            same = e->shape[d] == t->shape[d];
        if (!same) {
            tr_fail(err, "%s: '%s' is [%lld,%lld] in the file but [%lld,%lld] in this model: the "
                    "adapter does not fit this base (another size, rank or module)", path,
                    e->name, (long long)e->shape[0], (long long)(e->ndim > 1 ? e->shape[1] : 1),
                    (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 1));
            goto done;
        }
        float *host = malloc(t->numel * sizeof(float) + 1);
        if (!host) {
            tr_fail(err, "out of memory reading '%s' of %s", e->name, path);
            goto done;
        }
        tr_hf_to_f32(e, host, t->numel);
        rc = tr_be_store_weight(be, t, host, err);
        free(host);
        if (rc != TR_OK)
            goto done;
        rc = TR_ERROR;
        seen[k] = 1;
    }
    for (int k = 0; k < g->n_tensors; k++)
        if (g->tensors[k].role == TR_ROLE_PARAM && !seen[k]) {
            tr_fail(err, "%s has no '%s%s': the adapter was made for other targets or "
                    "modules_to_save than this model's", path, TR_PEFT_PREFIX, g->tensors[k].name);
            goto done;
        }
    rc = TR_OK;
done:
    free(seen);
    tr_safetensors_free(st);
    free(buf);
    free(path);
    return rc;
}

/* ---- adapter_config.json ---------------------------------------------------- */

/* The distinct last components of the adapted modules, in graph order. */
static size_t adapted_modules(const struct tr_graph *g, char ***out)
{
    char **names = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *names);
    size_t n = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const char *s = g->tensors[i].name;
        const char *tail = strstr(s, ".lora_A.weight");
        if (!tail || tail[14] != 0)
            continue;
        const char *start = tail;
        while (start > s && start[-1] != '.')
            start--;
        char *m = tr_xasprintf("%.*s", (int)(tail - start), start);
        int dup = 0;
        for (size_t k = 0; k < n && !dup; k++)
            dup = strcmp(names[k], m) == 0;
        if (dup)
            free(m);
        else
            names[n++] = m;
    }
    *out = names;
    return n;
}

static void write_list(FILE *f, const char *const *v, size_t n)
{
    fprintf(f, "[");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s", i ? ", " : "");
        tr_json_write_string(f, v[i]);
    }
    fprintf(f, "]");
}

char *tr_peft_config_text(const struct tr_graph *g, const struct tr_lora_config *lc,
                          const char *base)
{
    char **mods = NULL;
    size_t n = adapted_modules(g, &mods);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fprintf(f, "{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n"
               "  \"base_model_name_or_path\": ");
    tr_json_write_string(f, base ? base : "");
    /* GPT-2's linears are transformers' Conv1D, stored [in,out] */
    int conv1d = 0;
    for (int i = 0; i < g->n_tensors && !conv1d; i++)
        conv1d = strncmp(g->tensors[i].name, "transformer.h.", 14) == 0;
    fprintf(f, ",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": %s,\n"
               "  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n"
               "  \"layer_replication\": null,\n  \"layers_pattern\": null,\n"
               "  \"layers_to_transform\": null,\n  \"loftq_config\": {},\n"
               "  \"lora_alpha\": %.17g,\n  \"lora_dropout\": %.17g,\n"
               "  \"megatron_config\": null,\n  \"megatron_core\": \"megatron.core\",\n"
               "  \"modules_to_save\": ", conv1d ? "true" : "false", lc->alpha, lc->dropout);
    if (lc->n_save)
        write_list(f, lc->modules_to_save, (size_t)lc->n_save);
    else
        fprintf(f, "null");
    fprintf(f, ",\n  \"peft_type\": \"LORA\",\n  \"r\": %lld,\n  \"rank_pattern\": {},\n"
               "  \"revision\": null,\n  \"target_modules\": ", (long long)lc->rank);
    write_list(f, (const char *const *)mods, n);
    fprintf(f, ",\n  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n"
               "  \"use_rslora\": %s\n}\n", lc->rslora ? "true" : "false");
    fclose(f);
    for (size_t i = 0; i < n; i++)
        free(mods[i]);
    free(mods);
    return text;
}
