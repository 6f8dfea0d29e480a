/* Incremental decoding (sample's key/value cache): a forward over windows of
 * sequence rows -- the prompt's rows at once, then one row at a time -- on a
 * plan that keeps every attention's inputs gives the logits of the whole
 * forward, row for row, for the GPT (packed attention, learned positions)
 * and the Llama (rotary positions, grouped-query attention), across the
 * attention kernel's query and key blocks, in fp32 and native bf16; and it
 * reads the earlier rows from the cache alone, not from the ids.
 *
 * Covers: core/engine/graph_exec.c (tr_graph_rows_ok, tr_graph_forward_rows),
 * graph_plan.c (tr_graph_plan_forward_cached), kernels/ops.c (tr_op_rows),
 * kernels/cpu/attention.c and rope.c (the window entry points), on the CPU
 * backend.
 */
#include <criterion/criterion.h>

#include "engine_harness.h"

#define CONFIG_DIR TR_TEST_SRCDIR "/config/"

struct decoder {
    struct engine e;
    size_t cache;
    int T, V;
};

/* recipe's model for one sequence, planned forward only (cached or not), its
 * parameters from seed 7, in eval mode */
static void open_decoder(struct decoder *d, const char *recipe, const char *const *overrides,
                         int n, enum tr_dtype compute, int cached)
{
    tr_err err = {{0}};
    memset(d, 0, sizeof *d);
    struct engine *e = &d->e;
    cr_assert_eq(tr_config_load(&e->cfg, recipe, overrides, n, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(tr_cpu_backend_init(&e->be, 0), 0);
    e->g = tr_model_build(e->cfg.recipe, 1, &err);
    cr_assert_not_null(e->g, "%s", err.msg);
    e->g->compute = compute;
    e->g->training = 0;
    if (cached)
        cr_assert_eq(tr_graph_plan_forward_cached(e->g, &e->be, &d->cache, &err), TR_OK, "%s",
                     err.msg);
    else
        cr_assert_eq(tr_graph_plan_forward(e->g, &e->be, &err), TR_OK, "%s", err.msg);
    tr_graph_init_params(e->g, &e->be, 7);
    const struct tr_tensor *in = &e->g->tensors[e->g->inputs[0]];
    const struct tr_tensor *lg = &e->g->tensors[e->g->logits];
    d->T = (int)in->shape[1];
    d->V = (int)lg->shape[lg->ndim - 1];
}

static int32_t *ids_of(struct decoder *d) { return d->e.g->tensors[d->e.g->inputs[0]].data; }
static float *logits_of(struct decoder *d) { return d->e.g->tensors[d->e.g->logits].data; }

/* The whole forward's logits, and those of windows [0, prompt) then one row
 * at a time, agree within tol (relative to the largest logit); before each
 * window after the first the ids of the rows already computed are
 * scrambled: only the cache may carry them. */
static void expect_windows_match(const char *recipe, const char *const *overrides, int n,
                                 enum tr_dtype compute, int prompt, double tol)
{
    struct decoder whole, win;
    open_decoder(&whole, recipe, overrides, n, compute, 0);
    open_decoder(&win, recipe, overrides, n, compute, 1);
    cr_assert(tr_graph_rows_ok(win.e.g, &win.e.be), "%s: the model cannot run windows", recipe);
    cr_assert_gt(win.cache, 0, "%s: the cached plan keeps no keys and values", recipe);
    int T = whole.T, V = whole.V;
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    uint64_t x = 12345;
    for (int t = 0; t < T; t++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[t] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    memcpy(ids_of(&whole), ids, (size_t)T * sizeof *ids);
    tr_graph_forward(whole.e.g, &whole.e.be);
    float *want = logits_of(&whole);
    double scale = 0;
    for (size_t i = 0; i < (size_t)T * V; i++)
        scale = fmax(scale, fabs(want[i]));
    cr_assert_gt(scale, 0, "%s: the logits are all zero", recipe);
    memcpy(ids_of(&win), ids, (size_t)T * sizeof *ids);
    for (int from = 0, to = prompt; from < T; from = to, to = to + 1) {
        if (from > 0)
            for (int t = 0; t < from; t++) /* only the cache may carry these rows now */
                ids_of(&win)[t] = (ids[t] + 1) % V;
        tr_graph_forward_rows(win.e.g, &win.e.be, from, to);
        const float *got = logits_of(&win);
        double worst = 0;
        for (size_t i = (size_t)from * V; i < (size_t)to * V; i++)
            worst = fmax(worst, fabs((double)got[i] - want[i]));
        cr_assert_leq(worst / scale, tol, "%s: rows [%d, %d) of %d: logits off by %g (of %g)",
                      recipe, from, to, T, worst, scale);
    }
    free(ids);
    engine_close(&whole.e);
    engine_close(&win.e);
}

Test(decode, gpt_windows_give_the_whole_forwards_logits, .init = environment)
{
    expect_windows_match(CONFIG_DIR "tiny_gpt.lua", NULL, 0, TR_F32, 3, 1e-5);
    expect_windows_match(CONFIG_DIR "tiny_gpt.lua", NULL, 0, TR_F32, 1, 1e-5);
}

Test(decode, llama_windows_give_the_whole_forwards_logits, .init = environment)
{
    expect_windows_match(CONFIG_DIR "tiny_llama.lua", NULL, 0, TR_F32, 5, 1e-5);
}

/* 300 positions: windows past the attention kernel's 64-row query blocks
 * and its 256-key blocks (the online softmax's rescaling) */
Test(decode, windows_cross_the_attention_blocks, .init = environment)
{
    const char *gpt[] = {"model.ctx=300"};
    expect_windows_match(CONFIG_DIR "tiny_gpt.lua", gpt, 1, TR_F32, 70, 1e-5);
    /* with Llama 3.1's frequency scaling */
    const char *llama[] = {"model.ctx=300", "model.rope_factor=8", "model.rope_low_freq_factor=1",
                           "model.rope_high_freq_factor=4", "model.rope_original_ctx=64"};
    expect_windows_match(CONFIG_DIR "tiny_llama.lua", llama, 5, TR_F32, 250, 1e-5);
}

/* bf16 activations (the native path where the CPU has it): rows rounded to
 * bf16 alike, sums in another order, so within a few bf16 steps */
Test(decode, bf16_windows_within_bf16, .init = environment)
{
    expect_windows_match(CONFIG_DIR "tiny_llama.lua", NULL, 0, TR_BF16, 4, 3e-2);
    expect_windows_match(CONFIG_DIR "tiny_gpt.lua", NULL, 0, TR_BF16, 2, 3e-2);
}

/* Windows need one sequence of a model whose rows are rows: not a batch of
 * two, not an image model; their plans then keep nothing extra. */
Test(decode, other_graphs_run_whole, .init = environment)
{
    struct decoder cnn;
    open_decoder(&cnn, CONFIG_DIR "tiny_cnn.lua", NULL, 0, TR_F32, 1);
    cr_assert_not(tr_graph_rows_ok(cnn.e.g, &cnn.e.be));
    cr_assert_eq(cnn.cache, 0);
    engine_close(&cnn.e);

    tr_err err = {{0}};
    struct engine two;
    memset(&two, 0, sizeof two);
    cr_assert_eq(tr_config_load(&two.cfg, CONFIG_DIR "tiny_llama.lua", NULL, 0, &err), TR_OK);
    cr_assert_eq(tr_cpu_backend_init(&two.be, 0), 0);
    two.g = tr_model_build(two.cfg.recipe, 2, &err);
    cr_assert_not_null(two.g, "%s", err.msg);
    two.g->training = 0;
    size_t cache = 1;
    cr_assert_eq(tr_graph_plan_forward_cached(two.g, &two.be, &cache, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(cache, 0, "a batch of two sequences got a cache");
    engine_close(&two);
}
