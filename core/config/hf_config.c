/*
 * config.json of a Hugging Face model directory <-> trainrun's model
 * options (hf_config.h).  config.json comes with downloaded weights, so it
 * is untrusted like a recipe: every size is checked before it becomes a
 * dimension, and a setting trainrun would silently compute differently
 * (a rope_scaling other than Llama 3.1's, biases, another activation) is
 * refused, naming the key.
 */
#define _XOPEN_SOURCE 700
#include "hf_config.h"

#include "../util/json.h"
#include "../util/util.h"

#include <trainrun/input.h>
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *const tr_hf_model_types = "\"llama\", \"mistral\", \"qwen2\" and \"gpt2\"";

#define MAX_CONFIG_BYTES ((size_t)16 << 20)

/* Limits of the builders (lua/trainrun/models.lua): token ids are int32,
 * the rest far past any released model. */
#define MAX_VOCAB 2147483647LL
#define MAX_WIDTH 1048576LL
#define MAX_LAYERS 1024LL
#define MAX_HEADS 65536LL
#define MAX_CTX 1048576LL

struct cfg {
    const struct tr_json *j;
    const char *what;
    tr_err *err;
};

static const char *type_name(const struct tr_json *v)
{
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "a list",
                                        "an object"};
    return v ? names[v->type] : "missing";
}

/* Key present with a value other than null. */
static const struct tr_json *present(const struct cfg *c, const char *key)
{
    const struct tr_json *v = tr_json_get(c->j, key);
    return v && v->type != TR_JSON_NULL ? v : NULL;
}

/* A whole number in [lo, hi]; `fallback` when absent or null and
 * `required` is 0. */
static int get_int(const struct cfg *c, const char *key, int64_t lo, int64_t hi, int required,
                   int64_t fallback, int64_t *out)
{
    const struct tr_json *v = present(c, key);
    if (!v) {
        if (required)
            return tr_fail(c->err, "%s: \"%s\" is missing; a %s config needs it", c->what, key,
                           tr_json_string(c->j, "model_type"));
        *out = fallback;
        return TR_OK;
    }
    if (v->type != TR_JSON_NUMBER || !(v->number >= (double)lo && v->number <= (double)hi) ||
        v->number != floor(v->number)) {
        if (v->type == TR_JSON_NUMBER)
            return tr_fail(c->err, "%s: \"%s\" is %.17g; it must be a whole number from %lld to %lld",
                           c->what, key, v->number, (long long)lo, (long long)hi);
        return tr_fail(c->err, "%s: \"%s\" is %s; it must be a whole number from %lld to %lld",
                       c->what, key, type_name(v), (long long)lo, (long long)hi);
    }
    *out = (int64_t)v->number;
    return TR_OK;
}

/* A number in the open interval (lo, hi); fallback when absent or null. */
static int get_real(const struct cfg *c, const char *key, double lo, double hi, double fallback,
                    double *out)
{
    const struct tr_json *v = present(c, key);
    if (!v) {
        *out = fallback;
        return TR_OK;
    }
    if (v->type != TR_JSON_NUMBER || !(v->number > lo && v->number < hi))
        return tr_fail(c->err, "%s: \"%s\" must be a number between %g and %g", c->what, key, lo, hi);
    *out = v->number;
    return TR_OK;
}

static int get_bool(const struct cfg *c, const char *key, int fallback, int *out)
{
    const struct tr_json *v = present(c, key);
    if (!v) {
        *out = fallback;
        return TR_OK;
    }
    if (v->type != TR_JSON_BOOL)
        return tr_fail(c->err, "%s: \"%s\" is %s; it must be true or false", c->what, key,
                       type_name(v));
    *out = v->boolean;
    return TR_OK;
}

/* A string key that must be one of `allowed` (NULL-terminated) when present. */
static int check_string(const struct cfg *c, const char *key, const char *const *allowed,
                        const char *why)
{
    const struct tr_json *v = present(c, key);
    if (!v)
        return TR_OK;
    if (v->type == TR_JSON_STRING)
        for (int i = 0; allowed[i]; i++)
            if (strcmp(v->string, allowed[i]) == 0)
                return TR_OK;
    char list[200] = "";
    for (int i = 0; allowed[i]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? " or " : "",
                 allowed[i]);
    if (v->type == TR_JSON_STRING)
        return tr_fail(c->err, "%s: \"%s\" is \"%.60s\"; trainrun computes %s only (%s)", c->what,
                       key, v->string, list, why);
    return tr_fail(c->err, "%s: \"%s\" is %s; trainrun computes %s only (%s)", c->what, key,
                   type_name(v), list, why);
}

/* A setting trainrun does not compute: refused unless absent, null, false or 0. */
static int refuse_if_set(const struct cfg *c, const char *key, const char *why)
{
    const struct tr_json *v = present(c, key);
    if (!v || (v->type == TR_JSON_BOOL && !v->boolean) || (v->type == TR_JSON_NUMBER && v->number == 0))
        return TR_OK;
    const char *detail = v->type == TR_JSON_OBJECT ? tr_json_string(v, "rope_type") : NULL;
    if (!detail && v->type == TR_JSON_OBJECT)
        detail = tr_json_string(v, "type");
    if (detail)
        return tr_fail(c->err, "%s: \"%s\" is %s of type \"%.40s\"; %s", c->what, key, type_name(v),
                       detail, why);
    if (v->type == TR_JSON_BOOL)
        return tr_fail(c->err, "%s: \"%s\" is true; %s", c->what, key, why);
    return tr_fail(c->err, "%s: \"%s\" is %s; %s", c->what, key, type_name(v), why);
}

/* "rope_scaling": null, absent, rope_type "default" (transformers' plain
 * frequencies) or "llama3" (Llama 3.1's, computed as transformers computes
 * them: kernels/rope_scaling.h); any other type is refused.  Older files say
 * "type"; where both are given transformers takes "type". */
static int parse_rope_scaling(const struct cfg *c, struct tr_hf_arch *a)
{
    const struct tr_json *v = present(c, "rope_scaling");
    if (!v)
        return TR_OK;
    if (v->type != TR_JSON_OBJECT)
        return tr_fail(c->err, "%s: \"rope_scaling\" is %s; it must be null or an object such as "
                       "Llama 3.1's {\"rope_type\": \"llama3\", \"factor\": 8.0, ...}", c->what,
                       type_name(v));
    const struct tr_json *t = tr_json_get(v, "type");
    const char *key = "type";
    if (!t || t->type == TR_JSON_NULL) {
        t = tr_json_get(v, "rope_type");
        key = "rope_type";
    }
    if (!t || t->type != TR_JSON_STRING)
        return tr_fail(c->err, "%s: \"rope_scaling\" has no \"rope_type\" string; trainrun computes "
                       "rope_type \"llama3\" (Llama 3.1) and \"default\" (no scaling)", c->what);
    if (strcmp(t->string, "default") == 0)
        return TR_OK;
    if (strcmp(t->string, "llama3") != 0)
        return tr_fail(c->err, "%s: \"rope_scaling\" has \"%s\": \"%.40s\"; trainrun computes "
                       "rope_type \"llama3\" (Llama 3.1) and \"default\" only, and another scaling "
                       "would give other logits: use a model whose config.json has one of those, or "
                       "\"rope_scaling\": null for plain rotary embeddings", c->what, key, t->string);
    static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    double x[4];
    for (int i = 0; i < 4; i++) {
        const struct tr_json *k = tr_json_get(v, keys[i]);
        if (!k || k->type != TR_JSON_NUMBER || !isfinite(k->number))
            return tr_fail(c->err, "%s: \"rope_scaling\" of rope_type \"llama3\" needs a number "
                           "\"%s\" (%s); it is %s", c->what, keys[i],
                           i == 0 ? "8.0 in Llama 3.1" : i == 1 ? "1.0 in Llama 3.1"
                           : i == 2 ? "4.0 in Llama 3.1" : "8192 in Llama 3.1",
                           k && k->type == TR_JSON_NUMBER ? "not finite" : type_name(k));
        x[i] = k->number;
    }
    if (!(x[0] >= 1 && x[0] <= 1e6))
        return tr_fail(c->err, "%s: \"rope_scaling\": \"factor\" is %g; it must be from 1 to 1e6 "
                       "(8.0 in Llama 3.1)", c->what, x[0]);
    if (!(x[1] > 0 && x[2] > x[1] && x[2] <= 1e6))
        return tr_fail(c->err, "%s: \"rope_scaling\": \"low_freq_factor\" %g and "
                       "\"high_freq_factor\" %g must be above 0, at most 1e6, and the high one above "
                       "the low one (1.0 and 4.0 in Llama 3.1)", c->what, x[1], x[2]);
    if (!(x[3] >= 1 && x[3] <= 16777216) || x[3] != floor(x[3]))
        return tr_fail(c->err, "%s: \"rope_scaling\": \"original_max_position_embeddings\" is %g; "
                       "it must be a whole number from 1 to 16777216 (8192 in Llama 3.1)", c->what, x[3]);
    a->rope_factor = x[0];
    a->rope_low_freq_factor = x[1];
    a->rope_high_freq_factor = x[2];
    a->rope_original_ctx = (int64_t)x[3];
    return TR_OK;
}

static int parse_llama(const struct cfg *c, const char *type, struct tr_hf_arch *a)
{
    a->family = TR_HF_LLAMA;
    /* transformers' defaults for a key its config class may leave out */
    int64_t ctx_default = strcmp(type, "llama") == 0 ? 2048 : strcmp(type, "qwen2") == 0 ? 32768 : 131072;
    double eps_default = 1e-6; /* LlamaConfig's, MistralConfig's and Qwen2Config's */
    if (get_int(c, "vocab_size", 2, MAX_VOCAB, 1, 0, &a->vocab) != TR_OK ||
        get_int(c, "hidden_size", 1, MAX_WIDTH, 1, 0, &a->dim) != TR_OK ||
        get_int(c, "num_hidden_layers", 1, MAX_LAYERS, 1, 0, &a->layers) != TR_OK ||
        get_int(c, "num_attention_heads", 1, MAX_HEADS, 1, 0, &a->heads) != TR_OK ||
        get_int(c, "num_key_value_heads", 1, MAX_HEADS, 0, a->heads, &a->kv_heads) != TR_OK ||
        get_int(c, "intermediate_size", 1, MAX_WIDTH * 8, 1, 0, &a->ffn_dim) != TR_OK ||
        get_int(c, "max_position_embeddings", 1, MAX_CTX, 0, ctx_default, &a->ctx) != TR_OK ||
        get_real(c, "rope_theta", 0, 1e12, 10000.0, &a->rope_theta) != TR_OK ||
        get_real(c, "rms_norm_eps", 0, 1, eps_default, &a->norm_eps) != TR_OK ||
        get_bool(c, "tie_word_embeddings", 0, &a->tie_embeddings) != TR_OK)
        return TR_ERROR;
    if (a->dim % a->heads != 0)
        return tr_fail(c->err, "%s: \"num_attention_heads\" (%lld) does not divide \"hidden_size\" (%lld)",
                       c->what, (long long)a->heads, (long long)a->dim);
    if (a->heads % a->kv_heads != 0)
        return tr_fail(c->err, "%s: \"num_key_value_heads\" (%lld) does not divide "
                       "\"num_attention_heads\" (%lld)", c->what, (long long)a->kv_heads,
                       (long long)a->heads);
    if ((a->dim / a->heads) % 2 != 0)
        return tr_fail(c->err, "%s: the head size hidden_size / num_attention_heads = %lld is odd; "
                       "rotary embeddings turn pairs of channels", c->what,
                       (long long)(a->dim / a->heads));
    int64_t head_dim = 0;
    if (get_int(c, "head_dim", 1, MAX_WIDTH, 0, a->dim / a->heads, &head_dim) != TR_OK)
        return TR_ERROR;
    if (head_dim != a->dim / a->heads)
        return tr_fail(c->err, "%s: \"head_dim\" is %lld, not hidden_size / num_attention_heads = %lld; "
                       "trainrun's attention heads are hidden_size / num_attention_heads wide",
                       c->what, (long long)head_dim, (long long)(a->dim / a->heads));
    static const char *const silu[] = {"silu", NULL};
    if (check_string(c, "hidden_act", silu, "the SiLU-gated MLP of Llama") != TR_OK ||
        parse_rope_scaling(c, a) != TR_OK ||
        refuse_if_set(c, "mlp_bias", "trainrun's Llama MLP has no biases") != TR_OK)
        return TR_ERROR;
    if (strcmp(type, "qwen2") == 0) {
        a->qkv_bias = 1; /* Qwen2's q, k and v projections always carry biases */
        if (refuse_if_set(c, "use_sliding_window", "trainrun's attention sees the whole context; "
                          "set it to false") != TR_OK)
            return TR_ERROR;
    } else if (refuse_if_set(c, "attention_bias", "trainrun's Llama attention has no biases on "
                             "q, k, v and o") != TR_OK) {
        return TR_ERROR;
    }
    if (strcmp(type, "mistral") == 0 &&
        get_int(c, "sliding_window", 1, INT64_MAX / 2, 0, 0, &a->sliding_window) != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

static int parse_gpt2(const struct cfg *c, struct tr_hf_arch *a)
{
    a->family = TR_HF_GPT2;
    /* GPT2Config's defaults are GPT-2 small's */
    if (get_int(c, "vocab_size", 2, MAX_VOCAB, 0, 50257, &a->vocab) != TR_OK ||
        get_int(c, "n_embd", 1, MAX_WIDTH, 0, 768, &a->dim) != TR_OK ||
        get_int(c, "n_layer", 1, MAX_LAYERS, 0, 12, &a->layers) != TR_OK ||
        get_int(c, "n_head", 1, MAX_HEADS, 0, 12, &a->heads) != TR_OK ||
        get_int(c, "n_positions", 1, MAX_CTX, 0, 1024, &a->ctx) != TR_OK ||
        get_real(c, "layer_norm_epsilon", 0, 1, 1e-5, &a->norm_eps) != TR_OK ||
        get_bool(c, "tie_word_embeddings", 1, &a->tie_embeddings) != TR_OK)
        return TR_ERROR;
    a->kv_heads = a->heads;
    a->ffn_dim = 4 * a->dim;
    if (a->dim % a->heads != 0)
        return tr_fail(c->err, "%s: \"n_head\" (%lld) does not divide \"n_embd\" (%lld)", c->what,
                       (long long)a->heads, (long long)a->dim);
    /* the tanh form is what trainrun's GELU computes (kernels/cpu/elementwise.c) */
    static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
    if (check_string(c, "activation_function", gelu, "the tanh form of GELU") != TR_OK)
        return TR_ERROR;
    if (a->norm_eps != 1e-5)
        return tr_fail(c->err, "%s: \"layer_norm_epsilon\" is %g; trainrun's gpt computes layer "
                       "norms with 1e-05", c->what, a->norm_eps);
    if (!a->tie_embeddings)
        return tr_fail(c->err, "%s: \"tie_word_embeddings\" is false; trainrun's gpt ties the "
                       "output head to the token embedding", c->what);
    int64_t inner = 0;
    if (get_int(c, "n_inner", 1, MAX_WIDTH * 8, 0, 4 * a->dim, &inner) != TR_OK)
        return TR_ERROR;
    if (inner != 4 * a->dim)
        return tr_fail(c->err, "%s: \"n_inner\" is %lld; trainrun's gpt has an MLP of 4 x n_embd = %lld",
                       c->what, (long long)inner, (long long)(4 * a->dim));
    int scale = 1;
    if (get_bool(c, "scale_attn_weights", 1, &scale) != TR_OK)
        return TR_ERROR;
    if (!scale)
        return tr_fail(c->err, "%s: \"scale_attn_weights\" is false; trainrun scales attention "
                       "scores by 1/sqrt(head size)", c->what);
    if (refuse_if_set(c, "scale_attn_by_inverse_layer_idx", "trainrun does not scale attention "
                      "by the layer index") != TR_OK ||
        refuse_if_set(c, "add_cross_attention", "trainrun's gpt is a decoder without cross-attention") != TR_OK)
        return TR_ERROR;
    return TR_OK;
}

int tr_hf_config_parse(const char *text, size_t len, const char *what, struct tr_hf_arch *a,
                       tr_err *err)
{
    memset(a, 0, sizeof *a);
    size_t bad = 0;
    struct tr_json *j = tr_json_parse(text, len, &bad);
    if (!j || j->type != TR_JSON_OBJECT) {
        tr_json_free(j);
        return tr_fail(err, "%s: not a JSON object (malformed at byte %zu)", what, bad);
    }
    struct cfg c = {j, what, err};
    const char *type = tr_json_string(j, "model_type");
    int rc;
    if (!type)
        rc = tr_fail(err, "%s: \"model_type\" is missing; trainrun reads %s", what, tr_hf_model_types);
    else if (strcmp(type, "llama") == 0 || strcmp(type, "mistral") == 0 || strcmp(type, "qwen2") == 0)
        rc = parse_llama(&c, type, a);
    else if (strcmp(type, "gpt2") == 0)
        rc = parse_gpt2(&c, a);
    else
        rc = tr_fail(err, "%s: \"model_type\" is \"%.40s\"; trainrun reads %s", what, type,
                     tr_hf_model_types);
    if (rc == TR_OK)
        snprintf(a->model_type, sizeof a->model_type, "%s", type);
    tr_json_free(j);
    return rc;
}

int tr_hf_config_read(const char *dir, struct tr_hf_arch *a, tr_err *err)
{
    char *path = tr_xasprintf("%s/config.json", dir);
    FILE *f = tr_input_fopen(path);
    struct stat st;
    int rc = TR_ERROR;
    char *text = NULL;
    if (!f) {
        tr_fail(err, "cannot read %s: %s (a Hugging Face model directory holds config.json and "
                "model.safetensors)", path, tr_input_strerror(errno));
    } else if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        tr_fail(err, "cannot read %s: not a regular file", path);
    } else if ((size_t)st.st_size > MAX_CONFIG_BYTES) {
        tr_fail(err, "%s is %lld bytes; a config.json has far less than 16 MiB", path,
                (long long)st.st_size);
    } else {
        text = tr_xcalloc(1, (size_t)st.st_size + 1);
        if (fread(text, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
            tr_fail(err, "cannot read %s: %s", path, strerror(errno));
        else
            rc = tr_hf_config_parse(text, (size_t)st.st_size, path, a, err);
    }
    if (f)
        fclose(f);
    free(text);
    free(path);
    return rc;
}

/* The shortest decimal that reads back as the same double, into buf. */
static void shortest(char buf[40], double x)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, 40, "%.*g", p, x);
        if (strtod(buf, NULL) == x)
            break;
    }
}

static void write_real(FILE *out, double x)
{
    char buf[40];
    shortest(buf, x);
    /* JSON readers take 1e-05; Python would make 10000 an int, which config
     * classes accept as well */
    fputs(buf, out);
}

/* The same, always with a decimal point: transformers' validation of
 * rope_scaling wants its factors floats (4.0), and warns about 4. */
static void write_float(FILE *out, double x)
{
    char buf[40];
    shortest(buf, x);
    fputs(buf, out);
    if (!strpbrk(buf, ".eEn"))
        fputs(".0", out);
}

void tr_hf_config_write(const struct tr_hf_arch *a, const char *torch_dtype, FILE *out)
{
    if (a->family == TR_HF_GPT2) {
        fprintf(out, "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                     "  \"vocab_size\": %lld,\n  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n"
                     "  \"n_head\": %lld,\n  \"n_positions\": %lld,\n  \"n_ctx\": %lld,\n"
                     "  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n"
                     "  \"layer_norm_epsilon\": ",
                (long long)a->vocab, (long long)a->dim, (long long)a->layers, (long long)a->heads,
                (long long)a->ctx, (long long)a->ctx);
        write_real(out, a->norm_eps);
        /* trainrun trains without dropout; the same holds in transformers */
        fprintf(out, ",\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
                     "  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
                     "  \"reorder_and_upcast_attn\": false,\n  \"initializer_range\": 0.02,\n"
                     "  \"tie_word_embeddings\": true,\n  \"use_cache\": true");
    } else {
        /* q/k/v biases without an o bias are Qwen2's layout; Llama's
         * attention_bias would add one to o_proj too */
        int qwen = a->qkv_bias;
        fprintf(out, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
                     "  \"vocab_size\": %lld,\n  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
                     "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
                     "  \"num_key_value_heads\": %lld,\n  \"hidden_act\": \"silu\",\n"
                     "  \"max_position_embeddings\": %lld,\n  \"rms_norm_eps\": ",
                qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM", qwen ? "qwen2" : "llama",
                (long long)a->vocab, (long long)a->dim, (long long)a->ffn_dim, (long long)a->layers,
                (long long)a->heads, (long long)a->kv_heads, (long long)a->ctx);
        write_real(out, a->norm_eps);
        fprintf(out, ",\n  \"rope_theta\": ");
        write_real(out, a->rope_theta);
        if (a->rope_factor > 0) {
            fprintf(out, ",\n  \"rope_scaling\": {\n    \"rope_type\": \"llama3\",\n    \"factor\": ");
            write_float(out, a->rope_factor);
            fprintf(out, ",\n    \"low_freq_factor\": ");
            write_float(out, a->rope_low_freq_factor);
            fprintf(out, ",\n    \"high_freq_factor\": ");
            write_float(out, a->rope_high_freq_factor);
            fprintf(out, ",\n    \"original_max_position_embeddings\": %lld\n  }",
                    (long long)a->rope_original_ctx);
        } else {
            fprintf(out, ",\n  \"rope_scaling\": null");
        }
        fprintf(out, ",\n  \"attention_dropout\": 0.0,\n"
                     "  \"initializer_range\": 0.02,\n  \"tie_word_embeddings\": %s,\n"
                     "  \"use_cache\": true",
                a->tie_embeddings ? "true" : "false");
        if (qwen)
            fprintf(out, ",\n  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n"
                         "  \"max_window_layers\": %lld", (long long)a->layers);
        else
            fprintf(out, ",\n  \"head_dim\": %lld,\n  \"attention_bias\": false,\n"
                         "  \"mlp_bias\": false,\n  \"pretraining_tp\": 1",
                    (long long)(a->dim / a->heads));
    }
    if (torch_dtype)
        fprintf(out, ",\n  \"torch_dtype\": \"%s\"", torch_dtype);
    fprintf(out, "\n}\n");
}

/* ---- the recipe's model = { from = "DIR" } ------------------------------- */

struct option {
    const char *key;
    int is_bool;
    double value;
};

/* The builder options config.json stands for. */
static size_t arch_options(const struct tr_hf_arch *a, int64_t ctx, struct option *o)
{
    size_t n = 0;
    o[n++] = (struct option){"vocab", 0, (double)a->vocab};
    o[n++] = (struct option){"dim", 0, (double)a->dim};
    o[n++] = (struct option){"layers", 0, (double)a->layers};
    o[n++] = (struct option){"heads", 0, (double)a->heads};
    o[n++] = (struct option){"ctx", 0, (double)ctx};
    if (a->family == TR_HF_LLAMA) {
        o[n++] = (struct option){"kv_heads", 0, (double)a->kv_heads};
        o[n++] = (struct option){"ffn_dim", 0, (double)a->ffn_dim};
        o[n++] = (struct option){"rope_theta", 0, a->rope_theta};
        o[n++] = (struct option){"norm_eps", 0, a->norm_eps};
        o[n++] = (struct option){"tie_embeddings", 1, a->tie_embeddings};
        o[n++] = (struct option){"qkv_bias", 1, a->qkv_bias};
        o[n++] = (struct option){"embed_scale", 0, 1}; /* none of these families scales */
        if (a->rope_factor > 0) {
            o[n++] = (struct option){"rope_factor", 0, a->rope_factor};
            o[n++] = (struct option){"rope_low_freq_factor", 0, a->rope_low_freq_factor};
            o[n++] = (struct option){"rope_high_freq_factor", 0, a->rope_high_freq_factor};
            o[n++] = (struct option){"rope_original_ctx", 0, (double)a->rope_original_ctx};
        }
    }
    return n;
}

/* The config.json key each option comes from, for messages. */
static const char *source_key(const struct tr_hf_arch *a, const char *opt)
{
    static const char *const llama[][2] = {
        {"vocab", "vocab_size"}, {"dim", "hidden_size"}, {"layers", "num_hidden_layers"},
        {"heads", "num_attention_heads"}, {"kv_heads", "num_key_value_heads"},
        {"ffn_dim", "intermediate_size"}, {"rope_theta", "rope_theta"}, {"norm_eps", "rms_norm_eps"},
        {"tie_embeddings", "tie_word_embeddings"}, {"qkv_bias", "model_type"},
        {"ctx", "max_position_embeddings"}, {"embed_scale", "model_type"},
        {"rope_factor", "rope_scaling.factor"}, {"rope_low_freq_factor", "rope_scaling.low_freq_factor"},
        {"rope_high_freq_factor", "rope_scaling.high_freq_factor"},
        {"rope_original_ctx", "rope_scaling.original_max_position_embeddings"}};
    static const char *const gpt[][2] = {{"vocab", "vocab_size"}, {"dim", "n_embd"}, {"layers", "n_layer"},
                                         {"heads", "n_head"}, {"ctx", "n_positions"}};
    if (a->family == TR_HF_GPT2) {
        for (size_t i = 0; i < TR_ARRAY_LEN(gpt); i++)
            if (strcmp(gpt[i][0], opt) == 0)
                return gpt[i][1];
    } else {
        for (size_t i = 0; i < TR_ARRAY_LEN(llama); i++)
            if (strcmp(llama[i][0], opt) == 0)
                return llama[i][1];
    }
    return opt;
}

static void format_option(const struct option *o, char *buf, size_t size)
{
    if (o->is_bool)
        snprintf(buf, size, "%s", o->value ? "true" : "false");
    else
        snprintf(buf, size, "%.17g", o->value);
}

/* model.from's directory: relative to the directory of the recipe that
 * names it, like extends and include (a recipe shared with its model
 * directory works from anywhere); typed on the command line, relative to
 * where the command runs. */
char *tr_hf_recipe_dir(struct tr_recipe *r, const struct tr_value *from)
{
    if (from->string[0] == '/' || from->origin.kind == TR_FROM_CLI)
        return tr_xstrdup(from->string);
    /* the file that wrote it: a base recipe extended from elsewhere names a
     * directory beside itself */
    const char *file = from->origin.kind == TR_FROM_RECIPE && from->origin.file
                           ? from->origin.file : tr_recipe_path(r);
    char *base = tr_dirname(file);
    char *dir = strcmp(base, ".") == 0 ? tr_xstrdup(from->string)
                                       : tr_xasprintf("%s/%s", base, from->string);
    free(base);
    return dir;
}

/* A resolution in progress: config.json's architecture and the recipe's
 * model table beside model.from. */
struct hf_model {
    struct tr_value *model, *from;
    struct tr_hf_arch a;
    const char *config_path, *builder;
};

/* The recipe's own model keys next to `from`: no build, a type that is
 * config.json's builder, a ctx that only shortens the context, and no
 * sliding window shorter than it.  *ctx: the context in effect. */
static int check_model_keys(const struct hf_model *m, int64_t *ctx, tr_err *err)
{
    const struct tr_hf_arch *a = &m->a;
    struct tr_value *type = tr_value_child(m->model, "type");
    struct tr_value *ctx_v = tr_value_child(m->model, "ctx");
    struct tr_value *build = tr_value_child(m->model, "build");
    char where[600];
    /* a long context planned because config.json allows it is rarely what a
     * fine-tuning run wants (8192 tokens of Llama 3 plan ~100 GiB): without
     * model.ctx the context is config.json's, at most TR_HF_DEFAULT_CTX */
    *ctx = !ctx_v && a->ctx > TR_HF_DEFAULT_CTX ? TR_HF_DEFAULT_CTX : a->ctx;
    if (build) {
        tr_origin_format(&build->origin, where, sizeof where);
        return tr_fail(err, "%s: model.build cannot go with model.from: the architecture is "
                       "config.json's (%s)", where, m->config_path);
    }
    if (type && (type->type != TR_V_STRING || strcmp(type->string, m->builder) != 0)) {
        char got[80];
        tr_value_format(type, got, sizeof got);
        tr_origin_format(&type->origin, where, sizeof where);
        return tr_fail(err, "%s: the model is %s, but %s is a \"%s\" model (a %s); write model = "
                       "{ from = ... } or %s { from = ... }", where, got, m->config_path,
                       a->model_type, m->builder, m->builder);
    }
    if (ctx_v) {
        tr_origin_format(&ctx_v->origin, where, sizeof where);
        if (ctx_v->type != TR_V_NUMBER || !(ctx_v->number >= 1 && ctx_v->number <= (double)a->ctx) ||
            ctx_v->number != floor(ctx_v->number)) {
            char got[80];
            tr_value_format(ctx_v, got, sizeof got);
            return tr_fail(err, "%s: model.ctx is %s; with model.from it may shorten the context "
                           "to a whole number from 1 to %s's \"%s\" (%lld)", where, got,
                           m->config_path, source_key(a, "ctx"), (long long)a->ctx);
        }
        *ctx = (int64_t)ctx_v->number;
    }
    if (a->sliding_window > 0 && a->sliding_window < *ctx) {
        tr_origin_format(ctx_v ? &ctx_v->origin : &m->from->origin, where, sizeof where);
        return tr_fail(err, "%s: %s has \"sliding_window\": %lld, shorter than the context of "
                       "%lld tokens; trainrun's attention sees the whole context, so it would "
                       "compute another model: set model.ctx = %lld or less", where,
                       m->config_path, (long long)a->sliding_window, (long long)*ctx,
                       (long long)a->sliding_window);
    }
    return TR_OK;
}

/* Architecture keys the recipe gives beside model.from must be what
 * config.json says (ctx aside, checked above). */
static int check_arch_keys(const struct hf_model *m, const struct option *opts, size_t n,
                           tr_err *err)
{
    for (size_t i = 0; i < n; i++) {
        struct tr_value *v = tr_value_child(m->model, opts[i].key);
        if (!v || strcmp(opts[i].key, "ctx") == 0)
            continue;
        int same = opts[i].is_bool ? v->type == TR_V_BOOL && v->boolean == (opts[i].value != 0)
                                   : v->type == TR_V_NUMBER && v->number == opts[i].value;
        if (!same) {
            char got[80], want[40], where[600];
            tr_value_format(v, got, sizeof got);
            format_option(&opts[i], want, sizeof want);
            tr_origin_format(&v->origin, where, sizeof where);
            return tr_fail(err, "%s: model.%s is %s, but %s says %s (\"%s\"); the architecture "
                           "comes from model.from: remove model.%s", where, opts[i].key, got,
                           m->config_path, want, source_key(&m->a, opts[i].key), opts[i].key);
        }
    }
    return TR_OK;
}

/* Rewrite the value tree (show, plan) and the table the builder runs on:
 * config.json's options and the builder's type; the builder knows no
 * `from`, and the tree's from is the directory resolved. */
static int rewrite_model(struct tr_recipe *r, const struct hf_model *m, const struct option *opts,
                         size_t n, const char *dir, tr_err *err)
{
    lua_State *L = tr_recipe_lua(r);
    int top = lua_gettop(L);
    tr_recipe_push_resolved(r);
    lua_pushstring(L, "model");
    lua_rawget(L, -2);
    if (!lua_istable(L, -1)) {
        lua_settop(L, top);
        return tr_fail(err, "%s: the model is not a table", tr_recipe_path(r));
    }
    int t = lua_gettop(L);
    struct tr_origin o = {TR_FROM_RECIPE, m->config_path, 0};
    char capped[900];
    snprintf(capped, sizeof capped, "default: %s says %lld (\"%s\"), a from model plans at most "
             "%d without model.ctx; set model.ctx = %lld for the whole context", m->config_path,
             (long long)m->a.ctx, source_key(&m->a, "ctx"), TR_HF_DEFAULT_CTX,
             (long long)m->a.ctx);
    for (size_t i = 0; i < n; i++) {
        lua_pushstring(L, opts[i].key);
        if (opts[i].is_bool)
            lua_pushboolean(L, opts[i].value != 0);
        else
            lua_pushnumber(L, opts[i].value);
        lua_rawset(L, t);
        struct tr_value *v = tr_value_child(m->model, opts[i].key);
        if (v && strcmp(opts[i].key, "ctx") == 0)
            continue; /* the recipe's shorter context, with its origin */
        struct tr_origin vo = o;
        if (strcmp(opts[i].key, "ctx") == 0 && opts[i].value < (double)m->a.ctx) /* capped */
            vo = (struct tr_origin){TR_FROM_RECIPE, capped, 0}; /* show says why */
        v = tr_value_new(opts[i].is_bool ? TR_V_BOOL : TR_V_NUMBER, opts[i].key, vo);
        v->boolean = opts[i].is_bool && opts[i].value != 0;
        v->number = opts[i].value;
        tr_value_put(m->model, v);
    }
    lua_pushstring(L, "type");
    lua_pushstring(L, m->builder);
    lua_rawset(L, t);
    /* the builder knows no `from`; the weights are the run's business */
    lua_pushstring(L, "from");
    lua_pushnil(L);
    lua_rawset(L, t);
    lua_settop(L, top);
    if (!tr_value_child(m->model, "type")) {
        struct tr_value *tv = tr_value_new(TR_V_STRING, "type", o);
        tr_value_set_string(tv, m->builder);
        tr_value_put(m->model, tv);
    }
    tr_value_set_string(m->from, dir);
    return TR_OK;
}

int tr_hf_resolve_model(struct tr_recipe *r, int64_t *capped, tr_err *err)
{
    struct hf_model m = {0};
    *capped = 0;
    m.model = tr_value_child(tr_recipe_root(r), "model");
    m.from = m.model && m.model->type == TR_V_TABLE ? tr_value_child(m.model, "from") : NULL;
    if (!m.from)
        return TR_OK;
    char where[600];
    tr_origin_format(&m.from->origin, where, sizeof where);
    if (m.from->type != TR_V_STRING || !m.from->string[0])
        return tr_fail(err, "%s: model.from must name a directory (a string): one holding a Hugging "
                       "Face config.json and model.safetensors", where);
    char *dir = tr_hf_recipe_dir(r, m.from);
    if (tr_hf_config_read(dir, &m.a, err) != TR_OK) {
        tr_err_prefix(err, "%s: model.from", where);
        free(dir);
        return TR_ERROR;
    }
    char *config_path = tr_xasprintf("%s/config.json", dir);
    m.config_path = config_path;
    m.builder = m.a.family == TR_HF_GPT2 ? "gpt" : "llama";
    int64_t ctx;
    struct option opts[24];
    int had_ctx = tr_value_child(m.model, "ctx") != NULL;
    int rc = check_model_keys(&m, &ctx, err);
    if (rc == TR_OK && !had_ctx && ctx < m.a.ctx)
        *capped = m.a.ctx;
    size_t n = rc == TR_OK ? arch_options(&m.a, ctx, opts) : 0;
    if (rc == TR_OK)
        rc = check_arch_keys(&m, opts, n, err);
    if (rc == TR_OK)
        rc = rewrite_model(r, &m, opts, n, dir, err);
    free(config_path);
    free(dir);
    return rc;
}

const char *tr_hf_from_dir(struct tr_recipe *r)
{
    struct tr_value *model = tr_value_child(tr_recipe_root(r), "model");
    struct tr_value *from = model && model->type == TR_V_TABLE ? tr_value_child(model, "from") : NULL;
    return from && from->type == TR_V_STRING ? from->string : NULL;
}
