/*
 * LoRA adapters (lora = { ... }): the recipe section's checks and messages,
 * the graph rewrite (what freezes, what trains, what the plan allocates),
 * an adapter that starts as the identity, and agreement with PEFT on the
 * fixtures of tests/torch/make_lora_fixtures.py (tests/fixtures/lora/).
 *
 * Covers: core/config/lora.c, core/engine/adapters.c, core/engine/peft.c
 * (tr_peft_load), the frozen role in core/engine/graph_plan.c and
 * hf_weights.c, tr_fit_base_auto (core/engine/fit.c).
 */
#include <criterion/criterion.h>

#include "engine/adapters.h"
#include "engine/fit.h"
#include "engine/hf_weights.h"
#include "engine/optim.h"
#include "engine/peft.h"
#include "engine_harness.h"
#include "remove_tree.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_DIR TR_TEST_SRCDIR "/fixtures/hf/"
#define LORA_DIR TR_TEST_SRCDIR "/fixtures/lora/"

enum { B = 3, T = 8, STEPS = 10 };

static char scratch[256];

static void lora_cleanup(void) { tr_test_remove_tree(scratch); }

static void lora_environment(void)
{
    environment();
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof scratch, "%s/trainrun-lora.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(scratch));
}

/* A recipe in the scratch directory: the tiny Llama of the hf fixtures with
 * `lora` (a Lua table constructor's body, or NULL for none); its path. */
static const char *recipe_with(const char *name, const char *model, const char *lora)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.lua", scratch, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "return {\n  model = %s,\n"
               "  data = { plugin = \"synthetic\", kind = \"tokens\", classes = 61 },\n"
               "  optimizer = { type = \"adamw\", lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, "
               "weight_decay = 0.1, clip = 0 },\n",
            model ? model : "{ from = \"" HF_DIR "tiny-llama\", ctx = 8 }");
    if (lora)
        fprintf(f, "  lora = { %s },\n", lora);
    fprintf(f, "}\n");
    fclose(f);
    return path;
}

/* The run's graph of recipe (adapters applied) on the CPU backend, planned. */
static int build_run(struct engine *e, const char *recipe, tr_err *err)
{
    memset(e, 0, sizeof *e);
    if (tr_config_load(&e->cfg, recipe, NULL, 0, err) != TR_OK)
        return TR_ERROR;
    cr_assert_eq(tr_cpu_backend_init(&e->be, 0), 0);
    e->g = tr_model_build_run(&e->cfg, B, TR_F32, err);
    if (!e->g)
        return TR_ERROR;
    cr_assert_eq(tr_graph_plan(e->g, &e->be, 2, err), TR_OK, "%s", err->msg);
    return TR_OK;
}

/* The error recipe's lora gives, which must name the recipe's line 7 (where
 * lora = { ... } is) and contain `want`. */
static void refused(const char *name, const char *model, const char *lora, const char *want)
{
    struct engine e;
    tr_err err = {{0}};
    const char *path = recipe_with(name, model, lora);
    cr_assert_eq(build_run(&e, path, &err), TR_ERROR, "%s: accepted", name);
    char line[600];
    snprintf(line, sizeof line, "%s:", path);
    cr_assert(strstr(err.msg, line), "%s: the message does not name the recipe: %s", name, err.msg);
    cr_assert(strstr(err.msg, want), "%s: expected \"%s\" in: %s", name, want, err.msg);
    engine_close(&e);
}

Test(lora_config, mistakes_are_refused_at_the_recipe_line, .init = lora_environment, .fini = lora_cleanup)
{
    refused("rank0", NULL, "rank = 0, targets = { \"q_proj\" }", "rank");
    refused("typo", NULL, "rank = 4, targets = { \"q_prj\" }", "did you mean \"q_proj\"");
    refused("nomodule", NULL, "rank = 4, modules_to_save = { \"lm_hed\" }, targets = \"all-linear\"",
            "did you mean \"lm_head\"");
    refused("wide", NULL, "rank = 20, targets = { \"k_proj\" }", "at most 16");
    refused("one", NULL, "rank = 4, targets = \"q_proj\"", "give a list of module names");
    refused("none", NULL, "rank = 4", "lora needs targets");
    refused("unknown", NULL, "rank = 4, targets = \"all-linear\", use_dora = true", "use_dora");
    refused("base", NULL, "rank = 4, targets = \"all-linear\", base = \"int8\"", "base");
}

/* An adapter directory of our own making (a PEFT feature trainrun lacks,
 * or another base) is refused by name, not half-read. */
static const char *adapter_dir(const char *name, const char *config)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", scratch, name);
    cr_assert_eq(mkdir(dir, 0755), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(config, f);
    fclose(f);
    return dir;
}

Test(lora_config, peft_features_not_supported_are_refused, .init = lora_environment, .fini = lora_cleanup)
{
    char lora[700];
    const char *dora = adapter_dir("dora", "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, "
                                           "\"target_modules\": [\"q_proj\"], \"use_dora\": true}");
    snprintf(lora, sizeof lora, "from = \"%s\"", dora);
    refused("dora", NULL, lora, "DoRA");
    const char *ia3 = adapter_dir("ia3", "{\"peft_type\": \"IA3\", \"target_modules\": [\"q_proj\"]}");
    snprintf(lora, sizeof lora, "from = \"%s\"", ia3);
    refused("ia3", NULL, lora, "LoRA adapters (\"LORA\") only");
    const char *pattern = adapter_dir("pattern", "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, "
                                                 "\"target_modules\": [\"q_proj\"], "
                                                 "\"rank_pattern\": {\"q_proj\": 8}}");
    snprintf(lora, sizeof lora, "from = \"%s\"", pattern);
    refused("pattern", NULL, lora, "rank_pattern");
    const char *clash = adapter_dir("clash", "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, "
                                             "\"target_modules\": [\"q_proj\"]}");
    snprintf(lora, sizeof lora, "from = \"%s\", rank = 8", clash);
    refused("clash", NULL, lora, "lora.rank differs from the adapter's");
}

/* What trains and what freezes: the adapters alone have gradients and
 * optimizer state; every base weight is frozen with no gradient. */
Test(lora_graph, only_the_adapters_train, .init = lora_environment, .fini = lora_cleanup)
{
    struct engine e;
    tr_err err = {{0}};
    cr_assert_eq(build_run(&e, recipe_with("qv", NULL, "rank = 4, alpha = 8, targets = { \"q_proj\", "
                                           "\"v_proj\" }"), &err), TR_OK, "%s", err.msg);
    const struct tr_graph *g = e.g;
    size_t trained = 0, frozen = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role == TR_ROLE_PARAM) {
            cr_assert(tr_adapter_param(t->name), "%s trains", t->name);
            cr_assert_not_null(t->grad);
            trained += t->numel;
        } else if (t->role == TR_ROLE_FROZEN) {
            cr_assert_null(t->grad, "%s has a gradient", t->name);
            cr_assert_eq(t->dtype, TR_F32);
            frozen += t->numel;
        }
    }
    /* 2 layers x (q: A 4x32 + B 32x4, v: A 4x32 + B 16x4) */
    cr_assert_eq(trained, 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4));
    /* each adapter's lora_B goes onto its base output (the linear's addend,
     * ops.h), whose gradient is the output's own buffer (graph_plan.c's
     * grad_alias): no add node, nothing copied.  (Layer 0's base outputs
     * need no gradient: nothing before them trains.) */
    int onto = 0, shared = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        size_t len = strlen(n->name);
        cr_assert(len < 5 || strcmp(n->name + len - 5, ".lora") != 0, "%s: an adapter's add",
                  n->name);
        if (!tr_linear_addend(g, n))
            continue;
        onto++;
        const float *grad = g->tensors[n->in[2]].grad;
        cr_assert(grad == NULL || grad == g->tensors[n->out].grad,
                  "%s: its addend has a gradient buffer of its own", n->name);
        shared += grad != NULL;
    }
    cr_assert_eq(onto, 4);
    cr_assert_eq(shared, 2, "layer 1's base outputs share their adapter's output gradient");
    cr_assert_eq(g->n_params, trained);
    cr_assert_eq(g->memory.grads, trained * sizeof(float));
    cr_assert_eq(g->memory.optimizer, 2 * trained * sizeof(float));
    cr_assert_geq(g->memory.frozen, frozen * sizeof(float));
    engine_close(&e);
}

/* A backend without the store_frozen / load_frozen slots (a module of ABI
 * 5, say) keeps its frozen weights in fp32: base = "auto" means fp32 there,
 * and an explicit 16-bit or NF4 base is refused when the graph is planned,
 * naming the device and the weight.  (The CPU's iface cut short before the
 * slots stands for it: the CPU and CUDA backends both have them.) */
Test(lora_graph, a_backend_without_frozen_storage_refuses_nf4, .init = lora_environment,
     .fini = lora_cleanup)
{
    struct tr_config cfg;
    tr_err err = {{0}};
    cr_assert_eq(tr_config_load(&cfg, recipe_with("nf4", NULL, "rank = 4, targets = { \"q_proj\" }, "
                                                  "base = \"nf4\""), NULL, 0, &err), TR_OK, "%s", err.msg);
    struct tr_backend be;
    cr_assert_eq(tr_cpu_backend_init(&be, 1), 0);
    struct tr_backend_iface cut = *be.iface;
    cut.struct_size = offsetof(struct tr_backend_iface, store_frozen);
    struct tr_backend old = be;
    old.iface = &cut;
    cr_assert_eq(tr_fit_base_auto(&be, TR_BF16), TR_BF16);
    cr_assert_eq(tr_fit_base_auto(&old, TR_BF16), TR_F32);
    struct tr_graph *g = tr_model_build_run(&cfg, B, tr_fit_base_auto(&old, TR_F32), &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert_eq(tr_graph_plan(g, &old, 2, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "device \"cpu\" cannot store the frozen weight") &&
                  strstr(err.msg, "in NF4"), "%s", err.msg);
    tr_graph_free(g, &be);
    tr_cpu_backend_free(&be);
    tr_config_free(&cfg);
}

/* B starts at zero: the adapted model computes the base's loss, bit for
 * bit, and the first backward reaches A only through B (zero gradient). */
Test(lora_graph, starts_as_the_base_model, .init = lora_environment, .fini = lora_cleanup)
{
    struct engine base, ad;
    tr_err err = {{0}};
    cr_assert_eq(build_run(&base, recipe_with("base", NULL, NULL), &err), TR_OK, "%s", err.msg);
    cr_assert_eq(build_run(&ad, recipe_with("all", NULL, "rank = 8, targets = \"all-linear\""), &err),
                 TR_OK, "%s", err.msg);
    struct tr_hf_arch a;
    const char *dir = tr_hf_from_dir(base.cfg.recipe);
    cr_assert_eq(tr_hf_config_read(dir, &a, &err), TR_OK, "%s", err.msg);
    tr_graph_init_params(base.g, &base.be, 1);
    tr_graph_init_params(ad.g, &ad.be, 1);
    cr_assert_eq(tr_hf_load(base.g, &base.be, dir, &a, NULL, NULL, NULL, &err), TR_OK, "%s", err.msg);
    uint32_t crc = 0;
    cr_assert_eq(tr_hf_load(ad.g, &ad.be, dir, &a, &crc, NULL, NULL, &err), TR_OK, "%s", err.msg);
    cr_assert_neq(crc, 0u);
    struct st_file ref;
    ref = st_open(HF_DIR "tiny-llama.ref.safetensors");
    set_inputs(base.g, ref.st);
    set_inputs(ad.g, ref.st);
    tr_graph_forward(base.g, &base.be);
    tr_graph_forward(ad.g, &ad.be);
    cr_assert_eq(loss_of(base.g), loss_of(ad.g), "base %.9g, adapted %.9g", loss_of(base.g),
                 loss_of(ad.g));
    ad.g->loss_grad = 1.0f;
    ad.g->grads_fresh = 1;
    tr_graph_backward(ad.g, &ad.be);
    for (int i = 0; i < ad.g->n_tensors; i++) {
        const struct tr_tensor *t = &ad.g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        double sq = 0;
        for (size_t j = 0; j < t->numel; j++)
            sq += (double)t->grad[j] * t->grad[j];
        if (strstr(t->name, "lora_A"))
            cr_assert_eq(sq, 0.0, "%s: a gradient through B = 0", t->name);
        else
            cr_assert_gt(sq, 0.0, "%s: no gradient", t->name);
    }
    st_close(&ref);
    engine_close(&base);
    engine_close(&ad);
}

/* ---- agreement with PEFT (tests/fixtures/lora, make_lora_fixtures.py) ----- */

/* The adapter run of fixture `kase` over its base: the base from model.from
 * and the adapter from lora.from, as a run's session loads them. */
static void open_case(struct engine *e, const char *kase, const char *base, const char *extra)
{
    char model[600], lora[800];
    snprintf(model, sizeof model, "{ from = \"" HF_DIR "%s\", ctx = 8 }", base);
    snprintf(lora, sizeof lora, "from = \"" LORA_DIR "%s\"%s%s", kase, extra ? ", " : "",
             extra ? extra : "");
    tr_err err = {{0}};
    cr_assert_eq(build_run(e, recipe_with(kase, model, lora), &err), TR_OK, "%s", err.msg);
    tr_graph_init_params(e->g, &e->be, 99);
    const char *dir = tr_hf_from_dir(e->cfg.recipe);
    struct tr_hf_arch a;
    cr_assert_eq(tr_hf_config_read(dir, &a, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_hf_load(e->g, &e->be, dir, &a, NULL, NULL, NULL, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_peft_load(e->g, &e->be, &e->cfg.lora, dir, &err), TR_OK, "%s", err.msg);
}

/* Loss, logits of row 0, every trained tensor's gradient, ten AdamW steps'
 * losses and the trained tensors after them, against PEFT's float64 values
 * (max|diff| / max|ref| per tensor, the losses relative): all within tol
 * but the weights after ten steps, within 20 tol: Adam divides by the root
 * of the second moment, which turns the first steps' last bits into
 * visible differences where a gradient is tiny (PyTorch's own fp32 is 8.8e-5
 * away on tiny-llama-all's; make_lora_fixtures.py's README section). */
static void peft_agreement(const char *kase, const char *base, const char *extra, double tol)
{
    struct engine e;
    open_case(&e, kase, base, extra);
    char path[600];
    snprintf(path, sizeof path, LORA_DIR "%s.ref.safetensors", kase);
    struct st_file ref = st_open(path);
    struct tr_graph *g = e.g;
    set_inputs(g, ref.st);
    memset(g->grads, 0, g->n_params * sizeof(float));
    g->loss_grad = 1.0f;
    tr_graph_forward(g, &e.be);
    float want = *(const float *)need(ref.st, "", "loss")->data;
    cr_assert_float_eq(loss_of(g), want, tol * fabsf(want), "%s: loss %.8f, PEFT %.8f", kase,
                       loss_of(g), want);
    const struct tr_tensor *lt = &g->tensors[g->logits];
    size_t row = (size_t)T * (size_t)lt->shape[lt->ndim - 1];
    double lerr = tensor_error(lt->data, need(ref.st, "", "logits")->data, row);
    cr_assert_leq(lerr, tol, "%s: logits differ by %.2e", kase, lerr);
    tr_graph_backward(g, &e.be);
    double gworst = 0;
    int trained = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        const struct tr_st_entry *r = need(ref.st, "grad." TR_PEFT_PREFIX, t->name);
        cr_assert_eq(r->bytes, t->numel * 4, "%s: %s", kase, t->name);
        double d = tensor_error(t->grad, r->data, t->numel);
        cr_assert_leq(d, tol, "%s: gradient of %s differs by %.2e", kase, t->name, d);
        gworst = fmax(gworst, d);
        trained++;
    }
    /* ten AdamW steps from the same start */
    engine_close(&e);
    open_case(&e, kase, base, extra);
    g = e.g;
    set_inputs(g, ref.st);
    struct tr_optimizer opt;
    tr_err err = {{0}};
    cr_assert_eq(tr_optimizer_init(&opt, &e.cfg.optimizer, g, &e.be, NULL, &err), TR_OK,
                 "%s", err.msg);
    g->loss_grad = 1.0f;
    double sworst = engine_steps_agree(&e, &opt, need(ref.st, "", "adamw_losses")->data, STEPS, kase);
    double fworst = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM)
            continue;
        double d = tensor_error(t->data, need(ref.st, "final." TR_PEFT_PREFIX, t->name)->data,
                                t->numel);
        cr_assert_leq(d, 20 * tol, "%s: %s after %d steps differs by %.2e", kase, t->name, STEPS, d);
        fworst = fmax(fworst, d);
    }
    cr_log_info("%-18s %2d tensors: logits %.1e, gradients %.1e, AdamW losses %.1e, final %.1e",
                kase, trained, lerr, gworst, sworst, fworst);
    tr_optimizer_free(&opt, &e.be);
    st_close(&ref);
    engine_close(&e);
}

Test(lora_peft, llama_q_v, .init = lora_environment, .fini = lora_cleanup) { peft_agreement("tiny-llama-qv", "tiny-llama", NULL, 1e-5); }
Test(lora_peft, llama_all_linear, .init = lora_environment, .fini = lora_cleanup) { peft_agreement("tiny-llama-all", "tiny-llama", NULL, 1e-5); }
Test(lora_peft, llama_rslora, .init = lora_environment, .fini = lora_cleanup) { peft_agreement("tiny-llama-rslora", "tiny-llama", NULL, 1e-5); }
Test(lora_peft, llama_saved_head, .init = lora_environment, .fini = lora_cleanup) { peft_agreement("tiny-llama-save", "tiny-llama", NULL, 1e-5); }
Test(lora_peft, qwen2_all_linear, .init = lora_environment, .fini = lora_cleanup) { peft_agreement("tiny-qwen2-all", "tiny-qwen2", NULL, 1e-5); }
Test(lora_peft, gpt2_conv1d, .init = lora_environment, .fini = lora_cleanup) { peft_agreement("tiny-gpt2-attn", "tiny-gpt2", NULL, 1e-5); }
/* QLoRA: the base quantised by trainrun to NF4 (bit for bit bitsandbytes',
 * tests/test_nf4.c), against PEFT over bitsandbytes' dequantised base: the
 * same weights, so the fp32 tolerance holds */
Test(lora_peft, llama_qlora_nf4, .init = lora_environment, .fini = lora_cleanup)
{
    peft_agreement("tiny-llama-qlora", "tiny-llama", "base = \"nf4\"", 1e-5);
}
