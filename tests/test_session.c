/*
 * Covers core/engine/session.c (tr_session_open in each mode), fit.c (the
 * one micro-batch search and margin) and policies.c (the end-of-step
 * decisions over a read-only view of the loop): a session never writes
 * the recipe's tree; "auto", plan and the fit search give one number; the
 * policies decide from the loop alone.
 */
#include <criterion/criterion.h>

#include "config/recipe.h"
#include "config/run_config.h"
#include "config/value.h"
#include "engine/fit.h"
#include "engine/policies.h"
#include "engine/session.h"
#include "remove_tree.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_DIR TR_TEST_SRCDIR "/config/"

static char run_dir[256];

static void environment(void)
{
    setenv("TRAINRUN_PLUGIN_PATH", getenv("TR_PLUGIN_BUILD_DIR"), 1);
    setenv("TRAINRUN_LUA_DIR", TR_TEST_SRCDIR "/../lua", 1);
    const char *tmp = getenv("TMPDIR");
    snprintf(run_dir, sizeof run_dir, "%s/trainrun-session.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(run_dir));
}

static void cleanup(void) { tr_test_remove_tree(run_dir); }

static void load(struct tr_config *cfg, const char *const *overrides, int n)
{
    tr_err err = {{0}};
    const char *all[16];
    char dir[300];
    snprintf(dir, sizeof dir, "run_dir=%s/run", run_dir);
    for (int i = 0; i < n; i++)
        all[i] = overrides[i];
    all[n] = dir;
    cr_assert_eq(tr_config_load(cfg, CONFIG_DIR "tiny.lua", all, n + 1, &err), TR_OK, "%s", err.msg);
}

/* The tree as `show` would dump it, with every value's origin. */
static char *dump(const struct tr_config *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tr_value_dump(tr_recipe_root(cfg->recipe), f);
    fclose(f);
    return text;
}

Test(session, never_writes_the_recipe_tree, .init = environment, .fini = cleanup)
{
    /* the values a session derives: steps from tokens, an "auto" micro-batch */
    const char *o[] = {"train.tokens=2k", "train.micro_batch=auto", "train.batch=16",
                       "train.memory_budget=0.0003"};
    enum tr_session_mode modes[] = {TR_SESSION_PLAN, TR_SESSION_EVAL, TR_SESSION_SAMPLE,
                                    TR_SESSION_TRAIN};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        struct tr_config cfg;
        struct tr_session s;
        tr_err err = {{0}};
        load(&cfg, o, 4);
        char *before = dump(&cfg);
        cr_assert_eq(tr_session_open(&s, &cfg, modes[i], &err), TR_OK, "mode %d: %s",
                     (int)modes[i], err.msg);
        cr_assert(s.micro_batch >= 1 && 16 % s.micro_batch == 0);
        char *after = dump(&cfg);
        cr_assert_str_eq(after, before, "mode %d changed the recipe's tree", (int)modes[i]);
        tr_session_close(&s);
        free(before);
        free(after);
        tr_config_free(&cfg);
    }
}

Test(session, auto_plan_and_the_fit_search_agree, .init = environment, .fini = cleanup)
{
    /* a budget between the plans of two micro-batches: auto must pick the
     * largest that fits, in a run's session and a plan's alike */
    const char *o[] = {"train.batch=64", "train.micro_batch=auto", "train.memory_budget=0.0003"};
    int64_t picked[2];
    enum tr_session_mode modes[] = {TR_SESSION_TRAIN, TR_SESSION_PLAN};
    for (int i = 0; i < 2; i++) {
        struct tr_config cfg;
        struct tr_session s;
        tr_err err = {{0}};
        load(&cfg, o, 3);
        cr_assert_eq(tr_session_open(&s, &cfg, modes[i], &err), TR_OK, "%s", err.msg);
        picked[i] = s.micro_batch;
        /* the search itself: the pick fits, the next divisor up does not */
        struct tr_fit_model fm = tr_session_fit_model(&s);
        struct tr_memory_report r;
        size_t at, above;
        cr_assert_eq(tr_fit_measure(&fm, picked[i], &r, &at, &err), TR_OK);
        cr_assert_leq((double)at, s.device.usable);
        cr_assert_eq(s.device.usable, (1.0 - TR_MEMORY_MARGIN) * s.device.bytes);
        if (picked[i] < 64) {
            cr_assert_eq(tr_fit_measure(&fm, 2 * picked[i], &r, &above, &err), TR_OK);
            cr_assert_gt((double)above, s.device.usable, "%lld would have fit too",
                         (long long)(2 * picked[i]));
        }
        tr_session_close(&s);
        tr_config_free(&cfg);
    }
    cr_assert(picked[0] > 1 && picked[0] < 64, "picked %lld", (long long)picked[0]);
    cr_assert_eq(picked[0], picked[1], "a run picks %lld, a plan %lld", (long long)picked[0],
                 (long long)picked[1]);
}

Test(session, eval_and_sample_plan_forward_only, .init = environment, .fini = cleanup)
{
    /* three blocks: a forward-only plan reuses one block's memory for the
     * next, so its activations come to well under the training plan's */
    const char *o[] = {"model.layers=3", "train.micro_batch=4", "train.batch=4"};
    enum tr_session_mode modes[] = {TR_SESSION_TRAIN, TR_SESSION_EVAL, TR_SESSION_SAMPLE};
    double loss[3], accuracy[3];
    size_t kept[3], measured = 0;
    for (int i = 0; i < 3; i++) {
        struct tr_config cfg;
        struct tr_session s;
        tr_err err = {{0}};
        load(&cfg, o, 3);
        cr_assert_eq(tr_session_open(&s, &cfg, modes[i], &err), TR_OK, "%s", err.msg);
        const struct tr_memory_report *m = &s.g->memory;
        kept[i] = m->activations + m->saved;
        if (i == 0) { /* plan's number for eval: what an eval session allocates */
            struct tr_memory_report before = *m;
            measured = tr_graph_measure_forward(s.g, &s.be);
            cr_assert(memcmp(&before, m, sizeof before) == 0, "measuring changed the plan");
        } else {
            cr_assert_eq(tr_graph_memory_total(m), measured, "mode %d allocates %zu, plan says %zu",
                         (int)modes[i], tr_graph_memory_total(m), measured);
            cr_assert_null(s.g->grads, "mode %d allocated parameter gradients", (int)modes[i]);
            cr_assert_eq(m->grads + m->optimizer + m->activation_grads + m->saved, 0,
                         "mode %d plans gradients, optimizer state or saved tensors",
                         (int)modes[i]);
            for (int t = 0; t < s.g->n_tensors; t++)
                cr_assert_null(s.g->tensors[t].grad, "%s has a gradient", s.g->tensors[t].name);
        }
        /* the same weights (the seed) and batches: the same numbers */
        cr_assert_eq(tr_session_evaluate(&s, TR_SPLIT_VAL, 3, &loss[i], &accuracy[i], NULL, &err),
                     TR_OK, "%s", err.msg);
        tr_session_close(&s);
        tr_config_free(&cfg);
    }
    for (int i = 1; i < 3; i++) {
        cr_assert_lt((double)kept[i], 0.6 * (double)kept[0], "forward only keeps %zu bytes of "
                     "activations, training %zu", kept[i], kept[0]);
        cr_assert(loss[i] == loss[0] && (accuracy[i] == accuracy[0] || isnan(accuracy[0])),
                  "forward only: loss %.9g, training plan %.9g", loss[i], loss[0]);
    }
}

Test(fit, shares_the_batch_among_the_devices)
{
    cr_assert_eq(tr_fit_per_device(64, 1), 64);
    cr_assert_eq(tr_fit_per_device(64, 4), 16);
    cr_assert_eq(tr_fit_per_device(63, 2), 63, "an uneven batch is not divided");
}

/* ---- policies: decisions from a const view of the loop ---------------------------- */

static void view(struct tr_config *cfg, struct tr_session *s, struct tr_loop *l)
{
    memset(s, 0, sizeof *s);
    memset(l, 0, sizeof *l);
    s->cfg = cfg;
    s->world = 1;
    l->s = s;
    l->best_val = l->stop_best = NAN;
    l->t_start = tr_now();
}

Test(policies, checkpoint_cadence_and_the_final_one, .init = environment, .fini = cleanup)
{
    const char *o[] = {"train.steps=10", "checkpoint.every=4"};
    struct tr_config cfg;
    struct tr_session s;
    struct tr_loop l;
    load(&cfg, o, 2);
    view(&cfg, &s, &l);
    l.step = 3;
    cr_assert_eq(tr_policy_checkpoint_due(&l, 0, 0), TR_CHECKPOINT_NONE);
    cr_assert_eq(tr_policy_checkpoint_due(&l, 1, 0), TR_CHECKPOINT_DUE, "a new best");
    l.step = 8;
    cr_assert_eq(tr_policy_checkpoint_due(&l, 0, 0), TR_CHECKPOINT_DUE);
    cr_assert_eq(tr_policy_checkpoint_due(&l, 0, 1), TR_CHECKPOINT_NONE,
                 "a signal: the preemption checkpoint follows instead");
    l.step = 10;
    cr_assert_eq(tr_policy_checkpoint_due(&l, 0, 0), TR_CHECKPOINT_FINAL);
    cr_assert(tr_policy_log_due(&l) && tr_policy_eval_due(&l), "the last step logs and evaluates");
    tr_config_free(&cfg);
}

Test(policies, early_stop_counts_evaluations_without_improvement, .init = environment, .fini = cleanup)
{
    const char *o[] = {"train.steps=100", "early_stop.patience=2", "early_stop.min_delta=0.1"};
    struct tr_config cfg;
    struct tr_session s;
    struct tr_loop l;
    load(&cfg, o, 3);
    view(&cfg, &s, &l);
    double vals[] = {3.0, 2.95, 2.5, 2.45, 2.44};
    uint64_t stopped = 0;
    for (int i = 0; i < 5 && !stopped; i++) {
        l.step = (uint64_t)(10 * (i + 1));
        struct tr_early_stop e = tr_policy_early_stop(&l, vals[i]);
        /* the policy changed nothing: the loop applies its answer */
        cr_assert(l.stop_misses == 0 || l.stop_misses == e.misses - 1 || e.misses == 0);
        l.stop_best = e.best;
        l.stop_misses = e.misses;
        stopped = l.stopped_early = e.stopped_at;
    }
    /* 2.95 and then 2.45, 2.44 miss by min_delta: the second miss in a row stops */
    cr_assert_eq(stopped, 50, "stopped at %llu", (unsigned long long)stopped);
    cr_assert_eq(tr_policy_stop(&l), TR_STOP_EARLY);
    cr_assert(tr_policy_is_best(&l, 1.0) == cfg.checkpoint_policy.keep_best);
    tr_config_free(&cfg);
}
