/*
 * What the engine tests (test_engine, test_hf, test_hf_io, and
 * test_backend_ops's whole-model cases) share to drive the
 * engine below the run loop: a recipe's configuration, the CPU backend and
 * the model's planned graph, the reading of safetensors fixtures into it,
 * and training steps checked against a reference's losses.  The
 * comparison of tensors is tests/compare.h's, included here.  Everything is
 * static inline: a test uses what it needs without unused-function warnings.
 */
#ifndef TR_TESTS_ENGINE_HARNESS_H
#define TR_TESTS_ENGINE_HARNESS_H

#include <criterion/criterion.h>

#include "config/plugin.h" /* tr_plugin_path */
#include "config/run_config.h"
#include "engine/backend.h"
#include "engine/graph.h"
#include "engine/model.h"
#include "engine/optim.h"
#include "kernels.h" /* tr_cpu_backend_init */
#include "util/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "slurp.h"

/* Plugins and trainrun's Lua library from the build and source trees. */
static inline void environment(void)
{
    setenv("TRAINRUN_PLUGIN_PATH", getenv("TR_PLUGIN_BUILD_DIR"), 1);
    setenv("TRAINRUN_LUA_DIR", TR_TEST_SRCDIR "/../lua", 1);
}

struct engine {
    struct tr_config cfg;
    struct tr_backend be;
    struct tr_graph *g;
};

/* Load recipe (with n overrides) and build its model for `batch` rows on
 * the CPU backend with `threads` threads (0: all), its memory planned; the
 * parameters are not initialised.  TR_ERROR with err when the recipe does
 * not load; a model that does not build fails the test.  engine_close
 * frees what was opened either way. */
static inline int engine_build(struct engine *e, const char *recipe, const char *const *overrides,
                               int n, int batch, int threads, tr_err *err)
{
    memset(e, 0, sizeof *e);
    if (tr_config_load(&e->cfg, recipe, overrides, n, err) != TR_OK)
        return TR_ERROR;
    cr_assert_eq(tr_cpu_backend_init(&e->be, threads), 0);
    e->g = tr_model_build(e->cfg.recipe, batch, err);
    cr_assert_not_null(e->g, "%s", err->msg);
    cr_assert_eq(tr_graph_plan(e->g, &e->be, 2, err), TR_OK, "%s", err->msg);
    return TR_OK;
}

static inline void engine_close(struct engine *e)
{
    if (e->g)
        tr_graph_free(e->g, &e->be);
    if (e->be.iface)
        tr_cpu_backend_free(&e->be);
    tr_config_free(&e->cfg);
}

/* The whole file, NUL-terminated (a text file reads as a string). */
static inline void *read_file(const char *path, size_t *size)
{
    return tr_test_slurp(path, size);
}

/* A safetensors file and the bytes it points into. */
struct st_file {
    void *buf;
    struct tr_st_file *st;
};

static inline struct st_file st_open(const char *path)
{
    struct st_file f;
    size_t size;
    f.buf = read_file(path, &size);
    tr_err err = {{0}};
    f.st = tr_safetensors_read(f.buf, size, path, &err);
    cr_assert_not_null(f.st, "%s", err.msg);
    return f;
}

static inline void st_close(struct st_file *f)
{
    tr_safetensors_free(f->st);
    free(f->buf);
}

/* Tensor prefix+name of a fixture; the test fails without it. */
static inline const struct tr_st_entry *need(const struct tr_st_file *f, const char *prefix,
                                             const char *name)
{
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    const struct tr_st_entry *e = tr_safetensors_find(f, key);
    cr_assert_not_null(e, "the fixture has no %s", key);
    return e;
}

/* The fixture's tokens and targets as the batch of g (a model of two
 * inputs, the fixture's batch the graph's shape). */
static inline void set_inputs(struct tr_graph *g, const struct tr_st_file *f)
{
    const struct tr_st_entry *tok = need(f, "", "tokens"), *tgt = need(f, "", "targets");
    cr_assert_eq(g->n_inputs, 2);
    cr_assert_eq(tok->bytes, g->tensors[g->inputs[0]].numel * 4,
                 "the fixture's batch is not the graph's [%lld,%lld]",
                 (long long)g->tensors[g->inputs[0]].shape[0],
                 (long long)g->tensors[g->inputs[0]].shape[1]);
    cr_assert_eq(tgt->bytes, tok->bytes);
    memcpy(g->tensors[g->inputs[0]].data, tok->data, tok->bytes);
    memcpy(g->tensors[g->inputs[1]].data, tgt->data, tgt->bytes);
}

/* The loss of the last forward. */
static inline float loss_of(const struct tr_graph *g)
{
    return *(const float *)g->tensors[g->loss].data;
}

/* `steps` optimizer steps on the batch in the graph's inputs, at the
 * recipe's constant lr, each step's loss within 1e-4 relative of the
 * reference's want[step] (`who` names the test and the reference in a
 * failure); the worst relative difference. */
static inline double engine_steps_agree(struct engine *e, struct tr_optimizer *opt, const float *want,
                                        int steps, const char *who)
{
    struct tr_graph *g = e->g;
    double worst = 0;
    for (int step = 0; step < steps; step++) {
        memset(g->grads, 0, g->n_params * sizeof(float));
        tr_graph_forward(g, &e->be);
        cr_assert_float_eq(loss_of(g), want[step], 1e-4 * fabsf(want[step]),
                           "%s: step %d: loss %.7f, reference %.7f", who, step, loss_of(g),
                           want[step]);
        worst = fmax(worst, fabs(loss_of(g) / want[step] - 1));
        tr_graph_backward(g, &e->be);
        tr_optimizer_step(opt, g, &e->be, 1.0, e->cfg.optimizer.lr);
    }
    return worst;
}

/* ---- the CUDA backend (test_backend_ops, test_nf4) ------------------------- */

static inline int open_cuda(struct tr_backend *be, char *why, size_t size)
{
    /* `make check` sets TR_CUDACPU_DIR: the kernels run on the CPU through
     * tests/cudacpu.  Without it (contrib/gpu/validate.sh) the build's own
     * module runs them on the GPU. */
    const char *dir = getenv("TR_CUDACPU_DIR");
    if (!dir || !*dir)
        dir = getenv("TR_PLUGIN_BUILD_DIR");
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, dir ? dir : ".");
    tr_err err = {{0}};
    int rc = tr_backend_open(be, "cuda", 0, &sp, &err);
    tr_plugin_path_free(&sp);
    if (rc != TR_OK)
        snprintf(why, size, "%s", err.msg);
    return rc;
}

static inline int on_cudacpu(void)
{
    const char *dir = getenv("TR_CUDACPU_DIR");
    return dir && *dir;
}

/* The CUDA backend, or the test is skipped saying why (fails through
 * tests/cudacpu, which runs anywhere). */
static inline void need_cuda(struct tr_backend *be)
{
    char why[1100];
    if (open_cuda(be, why, sizeof why) != TR_OK) {
        if (on_cudacpu())
            cr_assert_fail("the CUDA backend of tests/cudacpu does not open: %s", why);
        cr_skip_test("no GPU: %s", why);
    }
}

#endif
