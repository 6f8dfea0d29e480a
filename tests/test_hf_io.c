/* Hugging Face model directories in and out (core/config/hf_config.c,
 * core/engine/hf_weights.c): each test writes a tiny directory itself
 * (config.json + safetensors through tr_safetensors_write), loads it through
 * a recipe's model = { from = ... } and checks every parameter, or checks the
 * error a broken one gives.  No PyTorch: tests/test_hf.c compares with it.
 *
 * Covers: core/config/hf_config.c, core/engine/hf_weights.c and hf_export.c,
 * core/util/safetensors.c.
 */
#include <criterion/criterion.h>

#include "config/hf_config.h"
#include "engine/hf_weights.h"
#include "engine_harness.h"
#include "../kernels/host.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scratch.h"

static void setup(void)
{
    (void)test_alloc; /* scratch.h's, for the plugin tests */
    environment();
    tmp_create("trainrun-hf");
    mkdir(tmp_path("hf"), 0755);
    mkdir(tmp_path("recipes"), 0755);
}

static void teardown(void) { remove_tmp(); }

/* ---- writing a directory ------------------------------------------------------ */

/* A tensor as a test writes it: values are k/64 for |k| <= 64, exact in
 * bf16 and fp16, so every dtype must load to the same floats. */
struct tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    float *values;
    size_t numel;
};

struct model_dir {
    struct tensor t[64];
    size_t n;
};

static float value_of(size_t tensor, size_t j)
{
    return (float)((int)((tensor * 7 + j * 3) % 129) - 64) / 64.0f;
}

static void add_tensor(struct model_dir *m, const char *name, int ndim, int64_t d0, int64_t d1)
{
    struct tensor *t = &m->t[m->n];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    t->values = calloc(t->numel, sizeof(float));
    for (size_t j = 0; j < t->numel; j++)
        t->values[j] = value_of(m->n, j);
    m->n++;
}

static void free_dir(struct model_dir *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->t[i].values);
}

static struct tensor *tensor_named(struct model_dir *m, const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->t[i].name, name) == 0)
            return &m->t[i];
    cr_assert_fail("the test's model has no %s", name);
    return NULL;
}

/* Tensors [from, to) of m into path, in dtype. */
static void write_safetensors(const struct model_dir *m, size_t from, size_t to, enum tr_dtype dtype,
                              const char *path)
{
    struct tr_st_entry e[64];
    void *bufs[64];
    memset(e, 0, sizeof e);
    for (size_t i = from; i < to; i++) {
        const struct tensor *t = &m->t[i];
        struct tr_st_entry *x = &e[i - from];
        memset(x, 0, sizeof *x);
        x->name = t->name;
        x->dtype = dtype;
        x->ndim = t->ndim;
        x->shape[0] = t->shape[0];
        x->shape[1] = t->shape[1];
        if (dtype == TR_F32) {
            bufs[i - from] = NULL;
            x->data = t->values;
            x->bytes = t->numel * 4;
        } else {
            uint16_t *h = calloc(t->numel, 2);
            tr_cpu_to_half(h, t->values, t->numel, dtype == TR_BF16);
            bufs[i - from] = h;
            x->data = h;
            x->bytes = t->numel * 2;
        }
    }
    size_t size = 0;
    void *blob = tr_safetensors_write(e, to - from, "{\"format\":\"pt\"}", &size);
    write_file(path, blob, size);
    free(blob);
    for (size_t i = from; i < to; i++)
        free(bufs[i - from]);
}

/* V=11 C=8 layers=2 heads=2 kv_heads=1 ffn=12: grouped-query attention */
static const char *const llama_config =
    "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 11,"
    " \"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"max_position_embeddings\": 16,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"rope_scaling\": null,"
    " \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"attention_bias\": false,"
    " \"head_dim\": 4, \"torch_dtype\": \"float32\"}";

static void llama_tensors(struct model_dir *m)
{
    memset(m, 0, sizeof *m);
    add_tensor(m, "model.embed_tokens.weight", 2, 11, 8);
    for (int l = 0; l < 2; l++) {
        char n[96];
#define T(suffix, nd, a, b)                                                   \
        snprintf(n, sizeof n, "model.layers.%d." suffix, l);                  \
        add_tensor(m, n, nd, a, b);
        T("input_layernorm.weight", 1, 8, 0)
        T("self_attn.q_proj.weight", 2, 8, 8)
        T("self_attn.k_proj.weight", 2, 4, 8)
        T("self_attn.v_proj.weight", 2, 4, 8)
        T("self_attn.o_proj.weight", 2, 8, 8)
        T("post_attention_layernorm.weight", 1, 8, 0)
        T("mlp.gate_proj.weight", 2, 12, 8)
        T("mlp.up_proj.weight", 2, 12, 8)
        T("mlp.down_proj.weight", 2, 8, 12)
#undef T
    }
    add_tensor(m, "model.norm.weight", 1, 8, 0);
    add_tensor(m, "lm_head.weight", 2, 11, 8);
}

/* V=13 C=8 layers=1 heads=2 n_positions=12; Conv1D weights [in, out] */
static const char *const gpt2_config =
    "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"], \"vocab_size\": 13,"
    " \"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"n_positions\": 12, \"n_inner\": null,"
    " \"activation_function\": \"gelu_new\", \"layer_norm_epsilon\": 1e-05}";

/* prefix: "transformer." or "" (GPT2Model's names); buffers: the attention
 * mask buffers and tied head older files carry */
static void gpt2_tensors(struct model_dir *m, const char *prefix, int buffers)
{
    memset(m, 0, sizeof *m);
    char n[96];
#define T(name, nd, a, b)                                                     \
    snprintf(n, sizeof n, "%s" name, prefix);                                 \
    add_tensor(m, n, nd, a, b);
    T("wte.weight", 2, 13, 8)
    T("wpe.weight", 2, 12, 8)
    T("h.0.ln_1.weight", 1, 8, 0)
    T("h.0.ln_1.bias", 1, 8, 0)
    T("h.0.attn.c_attn.weight", 2, 8, 24)
    T("h.0.attn.c_attn.bias", 1, 24, 0)
    T("h.0.attn.c_proj.weight", 2, 8, 8)
    T("h.0.attn.c_proj.bias", 1, 8, 0)
    T("h.0.ln_2.weight", 1, 8, 0)
    T("h.0.ln_2.bias", 1, 8, 0)
    T("h.0.mlp.c_fc.weight", 2, 8, 32)
    T("h.0.mlp.c_fc.bias", 1, 32, 0)
    T("h.0.mlp.c_proj.weight", 2, 32, 8)
    T("h.0.mlp.c_proj.bias", 1, 8, 0)
    T("ln_f.weight", 1, 8, 0)
    T("ln_f.bias", 1, 8, 0)
    if (buffers) {
        T("h.0.attn.bias", 2, 12, 12)
        T("h.0.attn.masked_bias", 1, 1, 0)
    }
#undef T
    if (buffers)
        add_tensor(m, "lm_head.weight", 2, 13, 8);
}

static void write_dir(const char *dir, const char *config, const struct model_dir *m,
                      enum tr_dtype dtype)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, config);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_safetensors(m, 0, m->n, dtype, path);
}

/* hf/: llama_config and llama_tensors in fp32 */
static void write_llama_dir(struct model_dir *m)
{
    llama_tensors(m);
    write_dir(tmp_path("hf"), llama_config, m, TR_F32);
}

/* recipes/r.lua: model = { from = "../hf", <extra> } */
static const char *write_recipe(const char *extra, int vocab)
{
    char text[1024];
    snprintf(text, sizeof text,
             "return {\n  model = { from = \"../hf\"%s%s },\n"
             "  data = { plugin = \"synthetic\", kind = \"tokens\", classes = %d },\n}\n",
             extra ? ", " : "", extra ? extra : "", vocab);
    const char *path = tmp_path("recipes/r.lua");
    write_text(path, text);
    return path;
}

/* ---- loading ------------------------------------------------------------------ */

/* Load recipe and build its model; TR_OK or the error in err. */
static int engine_open(struct engine *e, const char *recipe, const char *const *overrides, int n,
                       tr_err *err)
{
    if (engine_build(e, recipe, overrides, n, 1, 1, err) != TR_OK)
        return TR_ERROR;
    tr_graph_init_params(e->g, &e->be, 1);
    return TR_OK;
}

static int engine_load(struct engine *e, tr_err *err)
{
    struct tr_hf_arch a;
    const char *dir = tr_hf_from_dir(e->cfg.recipe);
    cr_assert_not_null(dir);
    if (tr_hf_config_read(dir, &a, err) != TR_OK)
        return TR_ERROR;
    return tr_hf_load(e->g, &e->be, dir, &a, NULL, NULL, NULL, err);
}

/* engine_open and engine_load, both of which must succeed */
static void open_loaded(struct engine *e, const char *recipe)
{
    tr_err err = {{0}};
    cr_assert_eq(engine_open(e, recipe, NULL, 0, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(engine_load(e, &err), TR_OK, "%s", err.msg);
}

static const float *param(struct engine *e, const char *name)
{
    int i = tr_graph_find(e->g, name);
    cr_assert(i >= 0 && e->g->tensors[i].role == TR_ROLE_PARAM, "the model has no parameter %s", name);
    return e->g->tensors[i].data;
}

/* every parameter of e equals m's tensor of the same name (GPT-2: file
 * names with prefix added, Conv1D transposed, wpe's first ctx rows) */
static void expect_loaded(struct engine *e, struct model_dir *m, const char *prefix, int gpt2)
{
    size_t checked = 0;
    for (size_t i = 0; i < m->n; i++) {
        const struct tensor *t = &m->t[i];
        const char *bare = t->name + strlen(prefix);
        if (gpt2 && (strstr(bare, "attn.bias") == bare + strlen(bare) - 9 ||
                     strstr(bare, "masked_bias") || strcmp(bare, "lm_head.weight") == 0))
            continue;
        char name[128];
        snprintf(name, sizeof name, "%s%s", gpt2 ? "transformer." : "", bare);
        const float *p = param(e, name);
        int conv1d = gpt2 && t->ndim == 2 && strstr(name, ".h.") != NULL;
        int idx = tr_graph_find(e->g, name);
        size_t numel = e->g->tensors[idx].numel;
        for (size_t j = 0; j < numel; j++) {
            size_t r = conv1d ? j / (size_t)t->shape[0] : 0, c = conv1d ? j % (size_t)t->shape[0] : 0;
            float want = conv1d ? t->values[c * (size_t)t->shape[1] + r] : t->values[j];
            cr_assert_eq(p[j], want, "%s[%zu] is %g, the file's is %g", name, j, p[j], want);
        }
        checked++;
    }
    cr_assert_gt(checked, 0);
}

static void load_llama_in(enum tr_dtype dtype)
{
    struct model_dir m;
    llama_tensors(&m);
    write_dir(tmp_path("hf"), llama_config, &m, dtype);
    struct engine e;
    open_loaded(&e, write_recipe("ctx = 8", 11));
    expect_loaded(&e, &m, "", 0);
    engine_close(&e);
    free_dir(&m);
}

Test(hf_in, llama_f32, .init = setup, .fini = teardown) { load_llama_in(TR_F32); }
Test(hf_in, llama_bf16, .init = setup, .fini = teardown) { load_llama_in(TR_BF16); }
Test(hf_in, llama_f16, .init = setup, .fini = teardown) { load_llama_in(TR_F16); }

Test(hf_in, recipe_shows_the_resolved_model_from_config_json, .init = setup, .fini = teardown)
{
    struct model_dir m;
    write_llama_dir(&m);
    struct tr_config cfg;
    tr_err err = {{0}};
    cr_assert_eq(tr_config_load(&cfg, write_recipe("recompute = 1", 11), NULL, 0, &err), TR_OK, "%s",
                 err.msg);
    struct tr_value *root = tr_recipe_root(cfg.recipe);
    cr_assert_str_eq(tr_value_get(root, "model.type")->string, "llama");
    cr_assert_eq(tr_value_get(root, "model.kv_heads")->number, 1);
    cr_assert_eq(tr_value_get(root, "model.ffn_dim")->number, 12);
    cr_assert_eq(tr_value_get(root, "model.ctx")->number, 16); /* max_position_embeddings */
    cr_assert_eq(tr_value_get(root, "model.recompute")->number, 1);
    cr_assert_eq(tr_value_get(root, "model.tie_embeddings")->boolean, 0);
    cr_assert(strstr(tr_value_get(root, "model.vocab")->origin.file, "hf/config.json"));
    tr_config_free(&cfg);
    free_dir(&m);
}

/* A long config.json context: 2048 without model.ctx (with why, for show),
 * the recipe's when it gives one, up to config.json's. */
Test(hf_in, a_long_context_is_capped_unless_model_ctx_says_more, .init = setup, .fini = teardown)
{
    struct model_dir m;
    llama_tensors(&m);
    char config[2048];
    const char *at = strstr(llama_config, "\"max_position_embeddings\": 16");
    snprintf(config, sizeof config, "%.*s\"max_position_embeddings\": 8192%s",
             (int)(at - llama_config), llama_config, at + strlen("\"max_position_embeddings\": 16"));
    write_dir(tmp_path("hf"), config, &m, TR_F32);
    const char *extra[] = {NULL, "ctx = 4096", "ctx = 8192"};
    const double want[] = {TR_HF_DEFAULT_CTX, 4096, 8192};
    for (int i = 0; i < 3; i++) {
        struct tr_config cfg;
        tr_err err = {{0}};
        cr_assert_eq(tr_config_load(&cfg, write_recipe(extra[i], 11), NULL, 0, &err), TR_OK,
                     "%s", err.msg);
        const struct tr_value *ctx = tr_value_get(tr_recipe_root(cfg.recipe), "model.ctx");
        cr_assert_eq(ctx->number, want[i], "%s: ctx %g", extra[i] ? extra[i] : "none", ctx->number);
        if (!extra[i])
            cr_assert(strstr(ctx->origin.file, "default:") &&
                      strstr(ctx->origin.file, "set model.ctx = 8192"), "%s", ctx->origin.file);
        tr_config_free(&cfg);
    }
    free_dir(&m);
}

Test(hf_in, llama_buffers_older_files_carry_are_ignored, .init = setup, .fini = teardown)
{
    struct model_dir m;
    llama_tensors(&m);
    add_tensor(&m, "model.layers.0.self_attn.rotary_emb.inv_freq", 1, 2, 0);
    add_tensor(&m, "model.layers.1.self_attn.rotary_emb.inv_freq", 1, 2, 0);
    write_dir(tmp_path("hf"), llama_config, &m, TR_F32);
    struct engine e;
    open_loaded(&e, write_recipe(NULL, 11));
    engine_close(&e);
    free_dir(&m);
}

Test(hf_in, sharded_index, .init = setup, .fini = teardown)
{
    struct model_dir m;
    llama_tensors(&m);
    write_text(tmp_path("hf/config.json"), llama_config);
    size_t half = m.n / 2;
    write_safetensors(&m, 0, half, TR_BF16, tmp_path("hf/model-00001-of-00002.safetensors"));
    write_safetensors(&m, half, m.n, TR_F32, tmp_path("hf/model-00002-of-00002.safetensors"));
    char *index = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&index, &len);
    fprintf(f, "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {");
    for (size_t i = 0; i < m.n; i++)
        fprintf(f, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", m.t[i].name,
                i < half ? 1 : 2);
    fprintf(f, "}}");
    fclose(f);
    write_text(tmp_path("hf/model.safetensors.index.json"), index);
    free(index);
    struct engine e;
    open_loaded(&e, write_recipe(NULL, 11));
    expect_loaded(&e, &m, "", 0);
    engine_close(&e);
    free_dir(&m);
}

Test(hf_in, from_is_relative_to_the_file_that_names_it, .init = setup, .fini = teardown)
{
    struct model_dir m;
    write_llama_dir(&m);
    /* recipes/base/ft.lua names ../../hf; recipes/child.lua extends it */
    mkdir(tmp_path("recipes/base"), 0755);
    write_text(tmp_path("recipes/base/ft.lua"),
               "return {\n  model = { from = \"../../hf\" },\n"
               "  data = { plugin = \"synthetic\", kind = \"tokens\", classes = 11 },\n}\n");
    write_text(tmp_path("recipes/child.lua"), "return { extends = \"base/ft.lua\", train = { steps = 3 } }\n");
    struct engine e;
    open_loaded(&e, tmp_path("recipes/child.lua"));
    expect_loaded(&e, &m, "", 0);
    engine_close(&e);
    free_dir(&m);
}

static void load_gpt2(const char *prefix, int buffers)
{
    struct model_dir m;
    gpt2_tensors(&m, prefix, buffers);
    write_dir(tmp_path("hf"), gpt2_config, &m, TR_F32);
    struct engine e;
    open_loaded(&e, write_recipe("ctx = 6", 13));
    expect_loaded(&e, &m, prefix, 1);
    /* the Conv1D transpose, spelled out once: trainrun's c_attn [3C, C]
     * holds at [o][i] what the file's [C, 3C] holds at [i][o] */
    const float *w = param(&e, "transformer.h.0.attn.c_attn.weight");
    char name[96];
    snprintf(name, sizeof name, "%sh.0.attn.c_attn.weight", prefix);
    const struct tensor *t = tensor_named(&m, name);
    cr_assert_eq(w[5 * 8 + 3], t->values[3 * 24 + 5]);
    engine_close(&e);
    free_dir(&m);
}

Test(hf_in, gpt2_with_transformer_prefix, .init = setup, .fini = teardown) { load_gpt2("transformer.", 0); }
Test(hf_in, gpt2_without_prefix_with_buffers, .init = setup, .fini = teardown) { load_gpt2("", 1); }

/* ---- errors ------------------------------------------------------------------- */

/* Loading recipe (with the directory as written) fails, naming `needle`s. */
static void expect_error(const char *extra, int vocab, const char *needle1, const char *needle2)
{
    struct engine e;
    tr_err err = {{0}};
    int rc = engine_open(&e, write_recipe(extra, vocab), NULL, 0, &err);
    if (rc == TR_OK)
        rc = engine_load(&e, &err);
    cr_assert_eq(rc, TR_ERROR, "loaded, but should have failed with '%s'", needle1);
    cr_assert(strstr(err.msg, needle1), "'%s' does not say '%s'", err.msg, needle1);
    if (needle2)
        cr_assert(strstr(err.msg, needle2), "'%s' does not say '%s'", err.msg, needle2);
    engine_close(&e);
}

/* llama_config with `from` replaced by `to` */
static void write_llama_config_with(const char *from, const char *to)
{
    char text[2048];
    const char *at = strstr(llama_config, from);
    cr_assert_not_null(at, "%s", from);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - llama_config), llama_config, to,
             at + strlen(from));
    write_text(tmp_path("hf/config.json"), text);
}

Test(hf_errors, missing_extra_and_misshaped_tensors_in_one_message, .init = setup, .fini = teardown)
{
    struct model_dir m;
    llama_tensors(&m);
    /* lm_head dropped (missing), down_proj of layer 1 transposed (mis-shaped),
     * an extra tensor */
    struct tensor *down = tensor_named(&m, "model.layers.1.mlp.down_proj.weight");
    down->shape[0] = 12;
    down->shape[1] = 8;
    snprintf(m.t[m.n - 1].name, sizeof m.t[0].name, "model.layers.2.mlp.up_proj.weight");
    write_dir(tmp_path("hf"), llama_config, &m, TR_F32);
    expect_error(NULL, 11, "1 missing (lm_head.weight)",
                 "model.layers.1.mlp.down_proj.weight: [12,8] in the file, [8,12] expected");
    expect_error(NULL, 11, "1 unexpected (model.layers.2.mlp.up_proj.weight)", "hf/model.safetensors");
    free_dir(&m);
}

/* rope_scaling as transformers reads it: "llama3" with its four numbers,
 * "default" as none, "type" over "rope_type", the rest refused naming the
 * key; damaged values refused, never used. */
Test(hf_errors, rope_scaling_llama3)
{
    static const char *const head = "{\"model_type\": \"llama\", \"vocab_size\": 11, "
        "\"hidden_size\": 8, \"intermediate_size\": 12, \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 2, \"max_position_embeddings\": 64, \"rope_scaling\": ";
    static const struct { const char *scaling, *error; double factor; } cases[] = {
        {"{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}", NULL, 8},
        {"{\"type\": \"llama3\", \"factor\": 32, \"low_freq_factor\": 1, "
         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}", NULL, 32},
        {"{\"rope_type\": \"default\"}", NULL, 0},
        {"{\"type\": \"default\", \"rope_type\": \"llama3\"}", NULL, 0},
        {"null", NULL, 0},
        {"{\"type\": \"linear\", \"factor\": 2.0}", "\"rope_scaling\" has \"type\": \"linear\"", 0},
        {"{\"rope_type\": \"dynamic\", \"factor\": 2.0}", "\"rope_type\": \"dynamic\"", 0},
        {"{\"rope_type\": \"longrope\"}", "\"rope_type\": \"longrope\"", 0},
        {"{\"factor\": 2.0}", "has no \"rope_type\" string", 0},
        {"[1]", "\"rope_scaling\" is a list", 0},
        {"{\"rope_type\": \"llama3\", \"factor\": 0.5, \"low_freq_factor\": 1, "
         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}", "\"factor\" is 0.5", 0},
        {"{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}", "the high one above", 0},
        {"{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 81.5}",
         "\"original_max_position_embeddings\" is 81.5", 0},
        {"{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": \"1\", "
         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
         "needs a number \"low_freq_factor\" (1.0 in Llama 3.1); it is a string", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s}", head, cases[i].scaling);
        struct tr_hf_arch a;
        tr_err err = {{0}};
        int rc = tr_hf_config_parse(text, strlen(text), "dir/config.json", &a, &err);
        if (!cases[i].error) {
            cr_assert_eq(rc, TR_OK, "%s: %s", cases[i].scaling, err.msg);
            cr_assert_eq(a.rope_factor, cases[i].factor, "%s", cases[i].scaling);
            if (a.rope_factor > 0)
                cr_assert(a.rope_low_freq_factor == 1 && a.rope_high_freq_factor == 4 &&
                          a.rope_original_ctx == 8192);
            /* what export writes reads back the same */
            char *out = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&out, &len);
            tr_hf_config_write(&a, "float32", f);
            fclose(f);
            struct tr_hf_arch b;
            cr_assert_eq(tr_hf_config_parse(out, len, "written", &b, &err), TR_OK, "%s", err.msg);
            cr_assert(b.rope_factor == a.rope_factor && b.rope_low_freq_factor == a.rope_low_freq_factor &&
                      b.rope_high_freq_factor == a.rope_high_freq_factor &&
                      b.rope_original_ctx == a.rope_original_ctx, "%s", out);
            cr_assert((a.rope_factor > 0) == (strstr(out, "\"rope_type\": \"llama3\"") != NULL), "%s", out);
            free(out);
        } else {
            cr_assert_eq(rc, TR_ERROR, "%s was accepted", cases[i].scaling);
            cr_assert(strstr(err.msg, "dir/config.json") && strstr(err.msg, cases[i].error),
                      "'%s' does not say '%s'", err.msg, cases[i].error);
        }
    }
}

Test(hf_errors, unsupported_configs_name_the_key, .init = setup, .fini = teardown)
{
    struct model_dir m;
    write_llama_dir(&m);
    write_llama_config_with("\"rope_scaling\": null",
                            "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}");
    expect_error(NULL, 11, "config.json: \"rope_scaling\" of rope_type \"llama3\" needs a number "
                 "\"low_freq_factor\"", "recipes/r.lua:2");
    write_llama_config_with("\"rope_scaling\": null",
                            "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8.0}");
    expect_error(NULL, 11, "config.json: \"rope_scaling\" has \"rope_type\": \"yarn\"",
                 "\"llama3\" (Llama 3.1) and \"default\" only");
    write_llama_config_with("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"");
    expect_error(NULL, 11, "\"hidden_act\" is \"gelu\"", NULL);
    write_llama_config_with("\"head_dim\": 4", "\"head_dim\": 8");
    expect_error(NULL, 11, "\"head_dim\" is 8", NULL);
    write_llama_config_with("\"attention_bias\": false", "\"attention_bias\": true");
    expect_error(NULL, 11, "\"attention_bias\" is true", NULL);
    write_llama_config_with("\"model_type\": \"llama\"", "\"model_type\": \"gemma\"");
    expect_error(NULL, 11, "\"model_type\" is \"gemma\"", "\"llama\", \"mistral\", \"qwen2\" and \"gpt2\"");
    write_llama_config_with("\"vocab_size\": 11", "\"vocab_size\": 1e300");
    expect_error(NULL, 11, "\"vocab_size\" is 1.0000000000000001e+300", NULL);
    write_llama_config_with("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3");
    expect_error(NULL, 11, "\"num_key_value_heads\" (3) does not divide", NULL);
    write_llama_config_with("\"hidden_size\": 8", "\"hidden_size\": \"8\"");
    expect_error(NULL, 11, "\"hidden_size\" is a string", NULL);
    write_llama_config_with("\"model_type\": \"llama\"",
                            "\"model_type\": \"mistral\", \"sliding_window\": 4");
    expect_error("ctx = 8", 11, "\"sliding_window\": 4, shorter than the context of 8", "model.ctx = 4");
    write_llama_config_with("\"model_type\": \"llama\"",
                            "\"model_type\": \"qwen2\", \"use_sliding_window\": true");
    expect_error(NULL, 11, "\"use_sliding_window\" is true", NULL);
    write_text(tmp_path("hf/config.json"), "{\"model_type\": \"llama\",");
    expect_error(NULL, 11, "hf/config.json: not a JSON object", NULL);
    free_dir(&m);
}

Test(hf_errors, gpt2_activation_and_epsilon, .init = setup, .fini = teardown)
{
    struct model_dir m;
    gpt2_tensors(&m, "", 0);
    write_dir(tmp_path("hf"), "{\"model_type\": \"gpt2\", \"activation_function\": \"gelu\"}", &m, TR_F32);
    expect_error(NULL, 13, "\"activation_function\" is \"gelu\"", "\"gelu_new\" or \"gelu_pytorch_tanh\"");
    write_text(tmp_path("hf/config.json"), "{\"model_type\": \"gpt2\", \"layer_norm_epsilon\": 1e-6}");
    expect_error(NULL, 13, "\"layer_norm_epsilon\" is 1e-06", NULL);
    free_dir(&m);
}

Test(hf_errors, recipe_keys_that_contradict_config_json, .init = setup, .fini = teardown)
{
    struct model_dir m;
    write_llama_dir(&m);
    expect_error("layers = 4", 11, "model.layers is 4, but", "says 2 (\"num_hidden_layers\")");
    expect_error("ctx = 32", 11, "model.ctx is 32", "(16)");
    expect_error("type = \"gpt\"", 11, "is a \"llama\" model", NULL);
    expect_error("embed_scale = 2", 11, "model.embed_scale is 2, but", NULL);
    expect_error("qkv_bias = true", 11, "model.qkv_bias is true, but", "says false");
    /* agreeing keys are fine */
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_open(&e, write_recipe("layers = 2, heads = 2", 11), NULL, 0, &err), TR_OK,
                 "%s", err.msg);
    engine_close(&e);
    /* so is a command-line override of a non-architecture key */
    const char *over[] = {"model.ctx=4"};
    cr_assert_eq(engine_open(&e, write_recipe(NULL, 11), over, 1, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(e.g->tensors[e.g->inputs[0]].shape[1], 4);
    engine_close(&e);
    free_dir(&m);
}

Test(hf_errors, damaged_files, .init = setup, .fini = teardown)
{
    struct model_dir m;
    write_llama_dir(&m);
    /* truncated: the header promises more data than there is */
    struct stat st;
    cr_assert_eq(stat(tmp_path("hf/model.safetensors"), &st), 0);
    cr_assert_eq(truncate(tmp_path("hf/model.safetensors"), st.st_size / 2), 0);
    expect_error(NULL, 11, "hf/model.safetensors: tensor", "truncated?");
    /* no weights at all */
    remove(tmp_path("hf/model.safetensors"));
    expect_error(NULL, 11, "neither model.safetensors nor model.safetensors.index.json", NULL);
    /* an index naming a shard outside the directory */
    write_text(tmp_path("hf/model.safetensors.index.json"),
               "{\"weight_map\": {\"model.norm.weight\": \"../secret.safetensors\"}}");
    expect_error(NULL, 11, "is mapped to \"../secret.safetensors\"", NULL);
    remove(tmp_path("hf/model.safetensors.index.json"));
    /* no directory */
    remove(tmp_path("hf/config.json"));
    expect_error(NULL, 11, "model.from: cannot read", "hf/config.json");
    free_dir(&m);
}

/* ---- out ---------------------------------------------------------------------- */

/* e's parameters as trainrun names them, as a checkpoint's model.safetensors. */
static struct tr_st_file *weights_of(struct engine *e, void **blob)
{
    struct tr_st_entry ent[64];
    size_t n = 0;
    for (int i = 0; i < e->g->n_tensors; i++) {
        const struct tr_tensor *t = &e->g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        ent[n] = (struct tr_st_entry){t->name, TR_F32, t->ndim, {0}, t->data, t->numel * 4};
        for (int d = 0; d < t->ndim; d++)
            ent[n].shape[d] = t->shape[d];
        n++;
    }
    size_t size = 0;
    *blob = tr_safetensors_write(ent, n, NULL, &size);
    tr_err err = {{0}};
    struct tr_st_file *f = tr_safetensors_read(*blob, size, "weights", &err);
    cr_assert_not_null(f, "%s", err.msg);
    return f;
}

Test(hf_out, gpt2_weights_loaded_then_exported_are_the_same_bytes, .init = setup, .fini = teardown)
{
    struct model_dir m;
    gpt2_tensors(&m, "transformer.", 0);
    write_dir(tmp_path("hf"), gpt2_config, &m, TR_F32);
    struct engine e;
    tr_err err = {{0}};
    /* the full context, so wpe goes out as it came in */
    open_loaded(&e, write_recipe(NULL, 13));
    struct tr_hf_arch a;
    cr_assert_eq(tr_hf_describe(e.g, "gpt", &a, &err), TR_OK, "%s", err.msg);
    void *blob;
    struct tr_st_file *w = weights_of(&e, &blob);
    cr_assert_eq(tr_hf_export(&a, w, "weights", tmp_path("out"), TR_F32, &err), TR_OK, "%s", err.msg);
    size_t size;
    void *out = read_file(tmp_path("out/model.safetensors"), &size);
    struct tr_st_file *back = tr_safetensors_read(out, size, "export", &err);
    cr_assert_not_null(back, "%s", err.msg);
    cr_assert_eq(tr_safetensors_count(back), m.n);
    for (size_t i = 0; i < m.n; i++) {
        const struct tr_st_entry *x = tr_safetensors_find(back, m.t[i].name);
        cr_assert_not_null(x, "the export has no %s", m.t[i].name);
        cr_assert_eq(x->shape[0], m.t[i].shape[0], "%s", m.t[i].name);
        cr_assert_eq(x->bytes, m.t[i].numel * 4);
        cr_assert_eq(memcmp(x->data, m.t[i].values, x->bytes), 0, "%s differs", m.t[i].name);
    }
    /* the config it wrote reads back as the same architecture */
    struct tr_hf_arch b;
    cr_assert_eq(tr_hf_config_read(tmp_path("out"), &b, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(b.family, TR_HF_GPT2);
    cr_assert_eq(b.vocab, 13);
    cr_assert_eq(b.ctx, 12);
    cr_assert_eq(b.layers, 1);
    char *cfg_text = read_file(tmp_path("out/config.json"), &size);
    cfg_text[size] = 0;
    cr_assert(strstr(cfg_text, "\"architectures\": [\"GPT2LMHeadModel\"]"));
    cr_assert(strstr(cfg_text, "\"torch_dtype\": \"float32\""));
    free(cfg_text);
    tr_safetensors_free(back);
    free(out);
    tr_safetensors_free(w);
    free(blob);
    engine_close(&e);
    free_dir(&m);
}

Test(hf_out, llama_export_then_from_gives_identical_parameters, .init = setup, .fini = teardown)
{
    struct model_dir m;
    write_llama_dir(&m);
    struct engine e;
    tr_err err = {{0}};
    open_loaded(&e, write_recipe(NULL, 11));
    struct tr_hf_arch a;
    cr_assert_eq(tr_hf_describe(e.g, "llama", &a, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(a.kv_heads, 1);
    cr_assert_eq(a.ffn_dim, 12);
    cr_assert_eq(a.norm_eps, 1e-5);
    cr_assert_eq(a.rope_theta, 10000);
    cr_assert_eq(a.tie_embeddings, 0);
    void *blob;
    struct tr_st_file *w = weights_of(&e, &blob);
    cr_assert_eq(tr_hf_export(&a, w, "weights", tmp_path("out"), TR_BF16, &err), TR_OK, "%s", err.msg);
    /* the export is a model directory `from` reads: move it where the recipe looks */
    cr_assert_eq(rename(tmp_path("hf"), tmp_path("old")), 0);
    cr_assert_eq(rename(tmp_path("out"), tmp_path("hf")), 0);
    struct engine e2;
    open_loaded(&e2, write_recipe(NULL, 11));
    cr_assert_eq(e2.g->n_params, e.g->n_params);
    /* the values are k/64, exact in bf16 */
    cr_assert_eq(memcmp(e2.g->params, e.g->params, e.g->n_params * 4), 0);
    engine_close(&e2);
    tr_safetensors_free(w);
    free(blob);
    engine_close(&e);
    free_dir(&m);
}

Test(hf_out, refuses_a_directory_of_other_files_and_replaces_an_earlier_export, .init = setup,
     .fini = teardown)
{
    struct model_dir m;
    write_llama_dir(&m);
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(engine_open(&e, write_recipe(NULL, 11), NULL, 0, &err), TR_OK, "%s", err.msg);
    struct tr_hf_arch a;
    cr_assert_eq(tr_hf_describe(e.g, "llama", &a, &err), TR_OK, "%s", err.msg);
    void *blob;
    struct tr_st_file *w = weights_of(&e, &blob);
    /* hf/ holds the user's files and no export mark */
    cr_assert_eq(tr_hf_export(&a, w, "weights", tmp_path("hf"), TR_F32, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "is not empty and is not an earlier trainrun export"), "%s", err.msg);
    size_t size;
    void *kept = read_file(tmp_path("hf/config.json"), &size);
    cr_assert_eq(size, strlen(llama_config));
    free(kept);
    /* twice into the same new directory: the second replaces the first */
    cr_assert_eq(tr_hf_export(&a, w, "weights", tmp_path("out"), TR_F32, &err), TR_OK, "%s", err.msg);
    write_text(tmp_path("out/tokenizer.json"), "{}");
    cr_assert_eq(tr_hf_export(&a, w, "weights", tmp_path("out"), TR_F16, &err), TR_OK, "%s", err.msg);
    char *cfg = read_file(tmp_path("out/config.json"), &size);
    cfg[size] = 0;
    cr_assert(strstr(cfg, "\"float16\""), "%s", cfg);
    free(cfg);
    struct stat st;
    cr_assert_eq(stat(tmp_path("out/tokenizer.json"), &st), 0);
    /* a gpt architecture cannot be exported from llama weights */
    struct tr_hf_arch g = a;
    g.family = TR_HF_GPT2;
    cr_assert_eq(tr_hf_export(&g, w, "weights", tmp_path("out2"), TR_F32, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "weights has no tensor 'transformer.wte.weight'"), "%s", err.msg);
    tr_safetensors_free(w);
    free(blob);
    engine_close(&e);
    free_dir(&m);
}
