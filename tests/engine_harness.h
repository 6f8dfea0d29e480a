/*
 * What the engine tests (test_engine, test_hf, test_hf_io) share to drive the
 * engine below the run loop: a recipe's configuration, the CPU backend and
 * the model's planned graph, and the reading of safetensors fixtures.  The
 * comparison of tensors is tests/compare.h's, included here.  Everything is
 * static inline: a test uses what it needs without unused-function warnings.
 */
#ifndef TR_TESTS_ENGINE_HARNESS_H
#define TR_TESTS_ENGINE_HARNESS_H

#include <criterion/criterion.h>

#include "config/run_config.h"
#include "engine/graph.h"
#include "engine/model.h"
#include "kernels.h" /* tr_cpu_backend_init */
#include "util/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"

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
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*size + 1);
    cr_assert_eq(fread(buf, 1, *size, f), *size);
    buf[*size] = '\0';
    fclose(f);
    return buf;
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

#endif
