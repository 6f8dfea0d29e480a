/*
 * The recipe's `lora` section (lora.h): its schema, its two lists, and an
 * existing PEFT adapter's adapter_config.json when `from` names one.
 */
#include "lora.h"

#include "hf_config.h"
#include "options.h"
#include "../util/json.h"
#include "../util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ADAPTER_CONFIG (1u << 20)

struct lora_options {
    int64_t rank;
    double alpha, dropout;
    int rslora;
    const char *base, *from;
};

static const char *const bases[] = {"auto", "fp32", "bf16", "fp16", "nf4", NULL};

#define OPT(type, name, def, lo, hi, help, field)                                                  \
    {type, name, def, lo, hi, NULL, help, offsetof(struct lora_options, field)}

static const struct tr_option lora_options[] = {
    OPT(TR_OPT_INT, "rank", "8", 1, 65536, "r: the adapters' inner width (at most a layer's)", rank),
    OPT(TR_OPT_FLOAT, "alpha", "0", 0, TR_NO_MAX,
        "the update is scaled by alpha / rank (0: alpha = rank, a scale of 1)", alpha),
    OPT(TR_OPT_FLOAT, "dropout", "0", 0, 0.999,
        "dropout on each adapter's input while training (eval and sample: none)", dropout),
    OPT(TR_OPT_BOOL, "rslora", "false", 0, 0,
        "rank-stabilised scaling alpha / sqrt(rank) instead of alpha / rank", rslora),
    {TR_OPT_ENUM, "base", "auto", 0, 0, bases,
     "storage of the frozen base weights: nf4 quantises the linears to 4-bit NormalFloat (QLoRA); "
     "auto: the precision policy's compute dtype",
     offsetof(struct lora_options, base)},
    {TR_OPT_STRING, "from", "", 0, 0, NULL,
     "a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) to continue "
     "training or evaluate; relative to the recipe", offsetof(struct lora_options, from)},
    {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0},
};

/* The lists: targets = "all-linear" or { "q_proj", ... }, modules_to_save = { ... }. */
static int read_names(const struct tr_value *v, const char *key, const char **out, int *n,
                      int *all_linear, tr_err *err)
{
    char where[600];
    tr_value_where(v, where, sizeof where);
    if (v->type == TR_V_STRING && all_linear && strcmp(v->string, "all-linear") == 0) {
        *all_linear = 1;
        return TR_OK;
    }
    if (v->type == TR_V_STRING) /* one name */
        return tr_fail(err, "%slora.%s is \"%s\": give a list of module names, { \"%s\" }%s",
                       where, key, v->string, v->string, all_linear ? ", or \"all-linear\"" : "");
    if (v->type != TR_V_TABLE)
        return tr_fail(err, "%slora.%s must be a list of module names%s", where, key,
                       all_linear ? " or \"all-linear\"" : "");
    for (size_t i = 0; i < v->n_items; i++) {
        const struct tr_value *it = v->items[i];
        if (!it->is_list_item || it->type != TR_V_STRING || !*it->string)
            return tr_fail(err, "%slora.%s must be a list of module names (e.g. { \"q_proj\", "
                           "\"v_proj\" }); item '%s' is not one", where, key, it->key);
        if (*n >= TR_LORA_MAX_NAMES)
            return tr_fail(err, "%slora.%s names more than %d modules", where, key,
                           TR_LORA_MAX_NAMES);
        for (int k = 0; k < *n; k++)
            if (strcmp(out[k], it->string) == 0)
                return tr_fail(err, "%slora.%s names \"%s\" twice", where, key, it->string);
        out[(*n)++] = it->string;
    }
    if (*n == 0)
        return tr_fail(err, "%slora.%s is empty: name the modules to adapt (e.g. { \"q_proj\", "
                       "\"v_proj\" }) or use \"all-linear\"", where, key);
    return TR_OK;
}

/* ---- adapter_config.json ------------------------------------------------- */

static int json_true(const struct tr_json *j, const char *key)
{
    const struct tr_json *v = tr_json_get(j, key);
    return v && v->type == TR_JSON_BOOL && v->boolean;
}

static int json_nonempty(const struct tr_json *j, const char *key)
{
    const struct tr_json *v = tr_json_get(j, key);
    if (!v || v->type == TR_JSON_NULL)
        return 0;
    if (v->type == TR_JSON_OBJECT || v->type == TR_JSON_ARRAY)
        return v->n > 0;
    return 1;
}

/* What trainrun's adapters do not do, refused by name rather than ignored. */
static int refuse_features(const struct tr_json *j, const char *path, tr_err *err)
{
    const char *type = tr_json_string(j, "peft_type");
    if (!type || strcmp(type, "LORA") != 0)
        return tr_fail(err, "%s: peft_type is %s; trainrun reads LoRA adapters (\"LORA\") only",
                       path, type ? type : "missing");
    static const struct {
        const char *key, *what;
    } unsupported[] = {
        {"use_dora", "DoRA (use_dora)"},
        {"rank_pattern", "per-layer ranks (rank_pattern)"},
        {"alpha_pattern", "per-layer alphas (alpha_pattern)"},
        {"layers_to_transform", "adapting some layers only (layers_to_transform)"},
        {"layer_replication", "layer replication"},
        {"megatron_config", "Megatron parallel layers (megatron_config)"},
    };
    for (size_t i = 0; i < TR_ARRAY_LEN(unsupported); i++) {
        const struct tr_json *v = tr_json_get(j, unsupported[i].key);
        int on = v && (v->type == TR_JSON_BOOL ? v->boolean : json_nonempty(j, unsupported[i].key));
        if (on)
            return tr_fail(err, "%s uses %s, which trainrun's adapters do not support; train "
                           "without it or merge the adapter first", path, unsupported[i].what);
    }
    const char *bias = tr_json_string(j, "bias");
    if (bias && strcmp(bias, "none") != 0)
        return tr_fail(err, "%s: bias is \"%s\"; trainrun's adapters train no biases (\"none\")",
                       path, bias);
    return TR_OK;
}

/* A list of names from the adapter's config into out (strings owned by
 * the json tree, copied by the caller). */
static int json_names(const struct tr_json *v, const char *path, const char *key, char **out,
                      int *n, int *all_linear, tr_err *err)
{
    if (!v || v->type == TR_JSON_NULL)
        return TR_OK;
    if (v->type == TR_JSON_STRING && all_linear && strcmp(v->string, "all-linear") == 0) {
        *all_linear = 1;
        return TR_OK;
    }
    if (v->type == TR_JSON_STRING)
        return tr_fail(err, "%s: %s is the pattern \"%s\"; trainrun takes a list of module "
                       "names (write them out in the recipe's lora.targets instead)", path, key,
                       v->string);
    if (v->type != TR_JSON_ARRAY)
        return tr_fail(err, "%s: %s is not a list of module names", path, key);
    for (size_t i = 0; i < v->n; i++) {
        if (v->items[i]->type != TR_JSON_STRING || *n >= TR_LORA_MAX_NAMES)
            return tr_fail(err, "%s: %s must be at most %d module names", path, key,
                           TR_LORA_MAX_NAMES);
        out[(*n)++] = tr_xstrdup(v->items[i]->string);
    }
    return TR_OK;
}

static int same_names(const char *const *a, int na, char *const *b, int nb)
{
    if (na != nb)
        return 0;
    for (int i = 0; i < na; i++) {
        int found = 0;
        for (int k = 0; k < nb && !found; k++)
            found = strcmp(a[i], b[k]) == 0;
        if (!found)
            return 0;
    }
    return 1;
}

/* Whether the recipe gave key (the schema fills in the defaults it did not). */
static int given(const struct tr_value *section, const char *key)
{
    const struct tr_value *v = tr_value_child(section, key);
    return v && v->origin.kind != TR_FROM_DEFAULT;
}

/* The adapter's own settings; the recipe may repeat them but not
 * contradict them (set: which keys the recipe gave). */
static int read_adapter_config(struct tr_lora_config *lc, const struct tr_value *section,
                               tr_err *err)
{
    char *path = tr_xasprintf("%s/adapter_config.json", lc->from);
    size_t len = 0;
    char *text = tr_read_small_file(path, MAX_ADAPTER_CONFIG, "an adapter_config.json", &len, err);
    struct tr_json *j = NULL;
    char *targets[TR_LORA_MAX_NAMES], *save[TR_LORA_MAX_NAMES];
    int n_targets = 0, n_save = 0, all_linear = 0, rc = TR_ERROR;
    if (!text) {
        tr_err_prefix(err, "%slora.from (a PEFT adapter directory holds adapter_config.json and "
                      "adapter_model.safetensors)", lc->where);
        free(path);
        return TR_ERROR;
    }
    size_t at = 0;
    if (!(j = tr_json_parse(text, len, &at)) || j->type != TR_JSON_OBJECT) {
        tr_fail(err, "%s is not valid JSON (near byte %zu)", path, at);
        goto done;
    }
    if (refuse_features(j, path, err) != TR_OK ||
        json_names(tr_json_get(j, "target_modules"), path, "target_modules", targets, &n_targets,
                   &all_linear, err) != TR_OK ||
        json_names(tr_json_get(j, "modules_to_save"), path, "modules_to_save", save, &n_save,
                   NULL, err) != TR_OK)
        goto done;
    double r = tr_json_number(j, "r", -1), alpha = tr_json_number(j, "lora_alpha", -1);
    if (!(r >= 1 && r <= 65536 && r == floor(r)) || !(alpha > 0 && isfinite(alpha))) {
        tr_fail(err, "%s: r must be a whole number from 1 and lora_alpha a number above 0", path);
        goto done;
    }
    if (n_targets == 0 && !all_linear) {
        tr_fail(err, "%s names no target_modules", path);
        goto done;
    }
    int rslora = json_true(j, "use_rslora");
    /* the recipe's own keys, where it gave them, must agree */
    const char *clash = NULL;
    if (given(section, "rank") && lc->rank != (int64_t)r)
        clash = "rank";
    else if (given(section, "alpha") && lc->alpha != alpha)
        clash = "alpha";
    else if (given(section, "rslora") && lc->rslora != rslora)
        clash = "rslora";
    else if (given(section, "targets") &&
             (lc->all_linear != all_linear ||
              !same_names(lc->targets, lc->n_targets, targets, n_targets)))
        clash = "targets";
    else if (given(section, "modules_to_save") &&
             !same_names(lc->modules_to_save, lc->n_save, save, n_save))
        clash = "modules_to_save";
    if (clash) {
        tr_fail(err, "lora.%s differs from the adapter's %s; with lora.from the adapter's "
                "settings apply: remove lora.%s", clash, path, clash);
        goto done;
    }
    const struct tr_json *drop = tr_json_get(j, "lora_dropout");
    if (!given(section, "dropout") && drop && drop->type == TR_JSON_NUMBER &&
        drop->number >= 0 && drop->number < 1)
        lc->dropout = drop->number;
    lc->rank = (int64_t)r;
    lc->alpha = alpha;
    lc->rslora = rslora;
    lc->all_linear = all_linear;
    /* copies: the json tree goes */
    for (int i = 0; i < n_targets; i++)
        lc->targets[i] = targets[i];
    lc->n_targets = n_targets;
    for (int i = 0; i < n_save; i++)
        lc->modules_to_save[i] = save[i];
    lc->n_save = n_save;
    lc->owns_names = 1;
    n_targets = n_save = 0;
    const char *base_name = tr_json_string(j, "base_model_name_or_path");
    lc->from_base = base_name && *base_name ? tr_xstrdup(base_name) : NULL;
    rc = TR_OK;
done:
    if (rc != TR_OK) /* every message names the recipe's line */
        tr_err_prefix(err, "%slora.from", lc->where);
    for (int i = 0; i < n_targets; i++)
        free(targets[i]);
    for (int i = 0; i < n_save; i++)
        free(save[i]);
    tr_json_free(j);
    free(text);
    free(path);
    return rc;
}

int tr_lora_configure(struct tr_lora_config *lc, struct tr_recipe *r, tr_err *err)
{
    memset(lc, 0, sizeof *lc);
    struct tr_value *root = tr_recipe_root(r);
    struct tr_value *section = tr_value_child(root, "lora");
    if (!section)
        return TR_OK;
    lc->origin = section->origin;
    tr_origin_format(&section->origin, lc->where, sizeof lc->where);
    size_t wl = strlen(lc->where);
    if (wl + 2 < sizeof lc->where) /* "file:line: " as a message prefix */
        memcpy(lc->where + wl, ": ", 3);
    if (section->type != TR_V_TABLE)
        return tr_fail(err, "%slora must be a table, e.g. lora = { rank = 16, targets = "
                       "\"all-linear\" }", lc->where);
    struct lora_options o;
    struct tr_schema_use use = {lora_options, &o};
    static const char *const lists[] = {"targets", "modules_to_save", NULL};
    if (tr_options_apply_skip(root, "lora", "lora", &use, 1, lists, err) != TR_OK)
        return TR_ERROR;
    lc->enabled = 1;
    lc->rank = o.rank;
    lc->alpha = o.alpha > 0 ? o.alpha : (double)o.rank;
    lc->dropout = o.dropout;
    lc->rslora = o.rslora;
    lc->base_text = o.base;
    for (int i = 0; bases[i]; i++)
        if (strcmp(o.base, bases[i]) == 0)
            lc->base = (enum tr_lora_base)i;
    const struct tr_value *t = tr_value_child(section, "targets");
    const struct tr_value *s = tr_value_child(section, "modules_to_save");
    if ((t && read_names(t, "targets", lc->targets, &lc->n_targets, &lc->all_linear, err) != TR_OK) ||
        (s && read_names(s, "modules_to_save", lc->modules_to_save, &lc->n_save, NULL, err) != TR_OK))
        return TR_ERROR;
    if (*o.from) {
        lc->from = tr_hf_recipe_dir(r, tr_value_child(section, "from"));
        return read_adapter_config(lc, section, err);
    }
    if (!t)
        return tr_fail(err, "%slora needs targets: the modules to adapt, e.g. targets = { "
                       "\"q_proj\", \"v_proj\" } or targets = \"all-linear\"", lc->where);
    return TR_OK;
}

void tr_lora_free(struct tr_lora_config *lc)
{
    if (lc->owns_names) {
        for (int i = 0; i < lc->n_targets; i++)
            free((char *)lc->targets[i]);
        for (int i = 0; i < lc->n_save; i++)
            free((char *)lc->modules_to_save[i]);
    }
    free(lc->from);
    free(lc->from_base);
    memset(lc, 0, sizeof *lc);
}

double tr_lora_scale(const struct tr_lora_config *lc)
{
    return lc->rslora ? lc->alpha / sqrt((double)lc->rank) : lc->alpha / (double)lc->rank;
}

void tr_lora_help(FILE *out)
{
    fprintf(out, "\n  lora = { ... }  (low-rank adapters, the base frozen; docs/adapters.md)\n");
    tr_options_help(lora_options, out, "    ");
    fprintf(out, "    targets          list    the modules to adapt by name or last component "
                 "({ \"q_proj\", \"v_proj\" }), or \"all-linear\" (every linear but the output head)\n"
                 "    modules_to_save  list    modules trained in full beside the adapters "
                 "({ \"lm_head\" }, { \"embed_tokens\" })\n");
}
