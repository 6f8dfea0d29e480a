/* The core's contracts: plugin loader refusals, recipe errors with their
 * file:line, overrides typed by the schema, the precision default, the
 * loader's order, and the checkpoint formats.
 *
 * Covers: core/config/ (plugin.c: the loader; recipe.c, options.c, run_config.c,
 * value.c: recipe errors, overrides and the precision default), core/engine/loader.c,
 * stop_signals.c and topo.c, core/util/ (safetensors.c, json.c, suggest.c, util.c's durations),
 * include/trainrun/mix.h.
 */
#include <criterion/criterion.h>

#include "config/run_config.h"
#include "config/optimizers.h"
#include "util/json.h"
#include "engine/loader.h"
#include "engine/model.h"
#include "config/options.h"
#include "config/plugin.h"
#include "util/safetensors.h"
#include "util/suggest.h"
#include "engine/stop_signals.h"
#include "engine/topo.h"
#include "util/util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONFIG_DIR TR_TEST_SRCDIR "/config/"

static void environment(void)
{
    const char *built = getenv("TR_PLUGIN_BUILD_DIR");
    cr_assert_not_null(built, "TR_PLUGIN_BUILD_DIR must name the built plugins (make check sets it)");
    setenv("TRAINRUN_PLUGIN_PATH", built, 1);
    setenv("TRAINRUN_LUA_DIR", TR_TEST_SRCDIR "/../lua", 1);
    unsetenv("TRAINRUN_PRECISION");
}

static char *test_plugin(const char *file)
{
    const char *dir = getenv("TR_TEST_PLUGIN_DIR");
    cr_assert_not_null(dir, "TR_TEST_PLUGIN_DIR must be set (make check sets it)");
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return path;
}

/* ---- plugin loader ----------------------------------------------------- */

Test(plugin_loader, refuses_a_plugin_built_for_another_abi)
{
    tr_err err = {{0}};
    char *path = test_plugin("schedule_bad_abi.so");
    cr_assert_null(tr_plugin_load_file(path, &err));
    char want[2048];
    snprintf(want, sizeof want,
             "refusing plugin %s: it was built for plugin ABI 99 but this trainrun speaks ABI 2; "
             "rebuild it against this trainrun's <trainrun/plugin.h>", path);
    cr_assert_str_eq(err.msg, want);
}

Test(plugin_loader, refuses_a_shared_object_without_the_entry_symbol)
{
    tr_err err = {{0}};
    char *path = test_plugin("schedule_no_entry.so");
    cr_assert_null(tr_plugin_load_file(path, &err));
    char want[2048];
    snprintf(want, sizeof want,
             "%s is not a trainrun plugin: it exports no 'trainrun_plugin_entry' function", path);
    cr_assert_str_eq(err.msg, want);
}

Test(plugin_loader, refuses_a_vtable_with_a_missing_mandatory_slot)
{
    tr_err err = {{0}};
    char *path = test_plugin("schedule_null_slot.so");
    cr_assert_null(tr_plugin_load_file(path, &err));
    cr_assert(strstr(err.msg, "schedule vtable leaves a mandatory slot NULL"), "%s", err.msg);
    cr_assert(strstr(err.msg, path), "%s", err.msg);
}

/* core/engine/comm.c calls allreduce_sum and broadcast without a NULL check: the
 * loader is what makes that safe, for comm plugins as for the other kinds. */
Test(plugin_loader, refuses_a_comm_vtable_without_allreduce)
{
    tr_err err = {{0}};
    char *path = test_plugin("comm_null_slot.so");
    cr_assert_null(tr_plugin_load_file(path, &err));
    cr_assert(strstr(err.msg, "comm vtable leaves a mandatory slot NULL"), "%s", err.msg);
    cr_assert(strstr(err.msg, path), "%s", err.msg);
}

Test(plugin_loader, suggests_a_close_name, .init = environment)
{
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, NULL);
    tr_err err = {{0}};
    cr_assert_null(tr_plugin_find(&sp, TR_KIND_SCHEDULE, "cosin", &err));
    cr_assert_str_eq(err.msg, "no schedule plugin 'cosin' (did you mean 'cosine'?)");
    struct tr_plugin *p = tr_plugin_find(&sp, TR_KIND_SCHEDULE, "cosine", &err);
    cr_assert_not_null(p, "%s", err.msg);
    cr_assert_str_eq(p->info->name, "cosine");
    tr_plugin_close(p);
    tr_plugin_path_free(&sp);
}

/* A recipe names plugins; a name that is a path would load any file. */
Test(plugin_loader, refuses_a_name_that_is_a_path, .init = environment)
{
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, NULL);
    const char *bad[] = {"../.libs/cosine", "/tmp/schedule_x", "cosine.so", "a b", "", "..",
                         "x/../cosine"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tr_err err = {{0}};
        cr_assert_null(tr_plugin_find(&sp, TR_KIND_SCHEDULE, bad[i], &err), "%s", bad[i]);
        cr_assert(strstr(err.msg, "invalid schedule plugin name") && strstr(err.msg, "never by a path"),
                  "%s: %s", bad[i], err.msg);
    }
    cr_assert(tr_plugin_name_ok("cosine") && tr_plugin_name_ok("my_plugin-2"));
    tr_plugin_path_free(&sp);
}

/* The search path is the built-in directory and the user's: nothing else. */
Test(plugin_loader, searches_only_the_directories_the_user_names, .init = environment)
{
    setenv("TRAINRUN_PLUGIN_PATH", "/opt/a::/opt/b:", 1);
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, "/builtin");
    cr_assert_eq(sp.n, 3);
    cr_assert_str_eq(sp.dirs[0], "/builtin");
    cr_assert_str_eq(sp.dirs[1], "/opt/a");
    cr_assert_str_eq(sp.dirs[2], "/opt/b");
    tr_plugin_path_free(&sp);
}

Test(plugin_loader, lists_every_builtin_kind, .init = environment)
{
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, NULL);
    struct tr_plugin **list;
    int n = tr_plugin_list(&sp, &list, NULL);
    int kinds[8] = {0};
    for (int i = 0; i < n; i++) {
        kinds[list[i]->info->kind]++;
        tr_plugin_close(list[i]);
    }
    free(list);
    tr_plugin_path_free(&sp);
    cr_assert_geq(kinds[TR_KIND_PRECISION], 1);
    cr_assert_geq(kinds[TR_KIND_DATA], 1);
    cr_assert_geq(kinds[TR_KIND_CHECKPOINT], 1);
    cr_assert_geq(kinds[TR_KIND_SCHEDULE], 2);
}

/* ---- recipe errors through the whole configuration --------------------- */

static void expect_error(const char *recipe, const char *const *overrides, int n, const char *want)
{
    struct tr_config cfg;
    tr_err err = {{0}};
    cr_assert_eq(tr_config_load(&cfg, recipe, overrides, n, &err), TR_ERROR, "%s loaded", recipe);
    cr_assert(strncmp(err.msg, want, strlen(want)) == 0, "got:  %s\nwant: %s", err.msg, want);
    tr_config_free(&cfg);
}

Test(recipe_errors, unknown_plugin_option_names_line_and_suggests, .init = environment)
{
    expect_error(CONFIG_DIR "typo.lua", NULL, 0,
                 CONFIG_DIR "typo.lua:4: schedule 'cosine': unknown option 'warmpu' (did you mean 'warmup'?)");
    struct tr_config cfg;
    tr_err err = {{0}};
    tr_config_load(&cfg, CONFIG_DIR "typo.lua", NULL, 0, &err);
    cr_assert(strstr(err.msg, "[plugin ") && strstr(err.msg, "schedule_cosine.so]"), "%s", err.msg);
    tr_config_free(&cfg);
}

Test(recipe_errors, ill_typed_option, .init = environment)
{
    expect_error(CONFIG_DIR "ill_typed.lua", NULL, 0,
                 CONFIG_DIR "ill_typed.lua:5: train: option 'steps' expects an integer, got a string");
}

Test(recipe_errors, out_of_range_option, .init = environment)
{
    expect_error(CONFIG_DIR "out_of_range.lua", NULL, 0,
                 CONFIG_DIR "out_of_range.lua:5: schedule 'cosine': option 'min_lr_ratio' is 2, must be between 0 and 1");
}

Test(recipe_errors, unknown_plugin_suggests, .init = environment)
{
    expect_error(CONFIG_DIR "unknown_plugin.lua", NULL, 0,
                 CONFIG_DIR "unknown_plugin.lua:3: no data plugin 'synthetc' (did you mean 'synthetic'?)");
}

Test(recipe_errors, unknown_section_suggests, .init = environment)
{
    expect_error(CONFIG_DIR "unknown_section.lua", NULL, 0,
                 CONFIG_DIR "unknown_section.lua:4: recipe: unknown option 'trian' (did you mean 'train'?)");
}

Test(recipe_errors, enum_choice_suggests, .init = environment)
{
    expect_error(CONFIG_DIR "bad_enum.lua", NULL, 0,
                 CONFIG_DIR "bad_enum.lua:4: optimizer: option 'type' is \"adamv\" (did you mean \"adamw\"?); choices: adamw, sgd");
}

/* optimizer.type's choices are the descriptor table's (config/optimizers.c),
 * not a list of its own: the type parsed is the descriptor's own name. */
Test(overrides, optimizer_type_is_a_descriptors_name, .init = environment)
{
    for (int i = 0; tr_optimizers[i]; i++) {
        char type[64];
        snprintf(type, sizeof type, "optimizer.type=%s", tr_optimizers[i]->name);
        const char *ov[] = {type};
        struct tr_config cfg;
        tr_err err = {{0}};
        cr_assert_eq(tr_config_load(&cfg, CONFIG_DIR "tiny.lua", ov, 1, &err), TR_OK, "%s", err.msg);
        cr_assert_eq(cfg.optimizer.type, tr_optimizers[i]->name, "%s", type);
        tr_config_free(&cfg);
    }
}

Test(recipe_errors, micro_batch_must_divide_batch, .init = environment)
{
    expect_error(CONFIG_DIR "micro_batch.lua", NULL, 0,
                 CONFIG_DIR "micro_batch.lua:4: train: micro_batch (4) must divide batch (10)");
}

Test(recipe_errors, shape_bug_is_caught_before_any_memory, .init = environment)
{
    /* relative, as users name recipes: Lua shortens chunk names over 60 characters */
    cr_assert_eq(chdir(CONFIG_DIR), 0);
    struct tr_config cfg;
    tr_err err = {{0}};
    cr_assert_eq(tr_config_load(&cfg, "shape_bug.lua", NULL, 0, &err), TR_OK, "%s", err.msg);
    cr_assert_null(tr_model_build(cfg.recipe, 4, &err));
    cr_assert_str_eq(err.msg, "shape_bug.lua:9: linear: input 'features' [4,16] has 16 features "
                     "but weight 'head.weight' [4,32] expects 32");
    tr_config_free(&cfg);
}

/* ---- overrides and defaults ------------------------------------------- */

Test(overrides, are_typed_by_the_schema, .init = environment)
{
    const char *bad[] = {"train.steps=abc"};
    expect_error(CONFIG_DIR "tiny.lua", bad, 1,
                 "command line: train: option 'steps' expects an integer, got \"abc\"");

    const char *good[] = {"train.steps=7", "optimizer.lr=3e-4", "precision=fp16",
                          "schedule.warmup=5"};
    struct tr_config cfg;
    tr_err err = {{0}};
    cr_assert_eq(tr_config_load(&cfg, CONFIG_DIR "tiny.lua", good, 4, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(cfg.train.steps, 7);
    cr_assert_float_eq(cfg.optimizer.lr, 3e-4, 1e-12);
    cr_assert_str_eq(cfg.precision.plugin->info->name, "fp16");
    cr_assert_eq(cfg.precision.origin.kind, TR_FROM_CLI);
    cr_assert_eq(*(int64_t *)cfg.schedule.config, 5, "warmup is the cosine schedule's first option");
    tr_config_free(&cfg);
}

Test(overrides, defaults_are_recorded_for_show, .init = environment)
{
    struct tr_config cfg;
    tr_err err = {{0}};
    cr_assert_eq(tr_config_load(&cfg, CONFIG_DIR "tiny.lua", NULL, 0, &err), TR_OK, "%s", err.msg);
    struct tr_value *lr = tr_value_get(tr_recipe_root(cfg.recipe), "optimizer.lr");
    cr_assert_not_null(lr);
    cr_assert_eq(lr->origin.kind, TR_FROM_DEFAULT);
    struct tr_value *warmup = tr_value_get(tr_recipe_root(cfg.recipe), "schedule.warmup");
    cr_assert_eq(warmup->origin.kind, TR_FROM_RECIPE);
    cr_assert_eq(warmup->origin.line, 5);
    tr_config_free(&cfg);
}

Test(precision_default, env_sets_it_and_the_recipe_wins, .init = environment)
{
    setenv("TRAINRUN_PRECISION", "bf16", 1);
    struct tr_config cfg;
    tr_err err = {{0}};
    cr_assert_eq(tr_config_load(&cfg, CONFIG_DIR "tiny.lua", NULL, 0, &err), TR_OK, "%s", err.msg);
    cr_assert_str_eq(cfg.precision.plugin->info->name, "bf16");
    cr_assert_eq(cfg.precision.origin.kind, TR_FROM_ENV);
    char where[256];
    tr_origin_format(&cfg.precision.origin, where, sizeof where);
    cr_assert_str_eq(where, "env TRAINRUN_PRECISION");
    tr_config_free(&cfg);

    cr_assert_eq(tr_config_load(&cfg, CONFIG_DIR "fp32.lua", NULL, 0, &err), TR_OK, "%s", err.msg);
    cr_assert_str_eq(cfg.precision.plugin->info->name, "fp32");
    cr_assert_eq(cfg.precision.origin.kind, TR_FROM_RECIPE);
    tr_config_free(&cfg);
    unsetenv("TRAINRUN_PRECISION");
}

/* ---- the loader -------------------------------------------------------- */

Test(loader, permutation_is_a_bijection)
{
    uint64_t sizes[] = {1, 2, 7, 100, 1000, 4097};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        uint64_t n = sizes[s];
        char *seen = calloc(n, 1);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t k = tr_loader_sample(42, 3, i, n, 1);
            cr_assert_lt(k, n);
            cr_assert_eq(seen[k], 0, "n=%llu: %llu drawn twice", (unsigned long long)n,
                         (unsigned long long)k);
            seen[k] = 1;
        }
        free(seen);
    }
    /* epochs differ */
    int same = 0;
    for (uint64_t i = 0; i < 100; i++)
        same += tr_loader_sample(1, 0, i, 100, 1) == tr_loader_sample(1, 1, i, 100, 1);
    cr_assert_lt(same, 20);
}

static struct tr_data_source open_synthetic(struct tr_plugin **plugin)
{
    struct tr_plugin_path sp;
    tr_plugin_path_init(&sp, NULL);
    tr_err err = {{0}};
    *plugin = tr_plugin_find(&sp, TR_KIND_DATA, "synthetic", &err);
    cr_assert_not_null(*plugin, "%s", err.msg);
    tr_plugin_path_free(&sp);
    const struct tr_plugin_info *info = (*plugin)->info;
    void *config = calloc(1, info->config_size);
    struct tr_schema_use use = {info->options, config};
    cr_assert_eq(tr_options_apply(NULL, NULL, "synthetic", &use, 1, &err), TR_OK, "%s", err.msg);
    struct tr_create_args args = {.struct_size = sizeof args, .run_dir = ".", .recipe_dir = ".",
                                  .seq_len = 8, .seed = 3, .rank = 0, .world = 1};
    struct tr_data_source src = {.vt = info->vtable, .name = "synthetic"};
    cr_assert_eq(info->create(tr_host_services(), config, &args, &src.self, &err), TR_OK, "%s", err.msg);
    src.info.struct_size = sizeof src.info;
    cr_assert_eq(src.vt->info(src.self, &src.info, &err), TR_OK, "%s", err.msg);
    return src;
}

Test(loader, order_does_not_depend_on_workers_and_resumes_exactly, .init = environment)
{
    struct tr_plugin *plugin;
    struct tr_data_source src = open_synthetic(&plugin);
    enum { BATCHES = 40, B = 5, T = 8 };
    static int32_t ref_in[BATCHES][B * T], ref_tg[BATCHES][B * T];
    int workers[] = {0, 1, 2, 4};
    for (size_t w = 0; w < 4; w++) {
        struct tr_loader_config lc = {TR_SPLIT_TRAIN, B, workers[w], 3, 1, 9, NULL};
        tr_err err = {{0}};
        struct tr_loader *l = tr_loader_open(&src, &lc, 0, &err);
        cr_assert_not_null(l, "%s", err.msg);
        for (int b = 0; b < BATCHES; b++) {
            int32_t in[B * T], tg[B * T];
            cr_assert_eq(tr_loader_next(l, in, tg, NULL, &err), TR_OK, "%s", err.msg);
            if (w == 0) {
                memcpy(ref_in[b], in, sizeof in);
                memcpy(ref_tg[b], tg, sizeof tg);
            } else {
                cr_assert_arr_eq(in, ref_in[b], sizeof in, "workers=%d batch %d differs", workers[w], b);
                cr_assert_arr_eq(tg, ref_tg[b], sizeof tg);
            }
        }
        cr_assert_eq(tr_loader_position(l), BATCHES);
        tr_loader_close(l);
    }
    /* resume at micro-batch 17 continues with exactly the 18th batch */
    struct tr_loader_config lc = {TR_SPLIT_TRAIN, B, 2, 3, 1, 9, NULL};
    tr_err err = {{0}};
    struct tr_loader *l = tr_loader_open(&src, &lc, 17, &err);
    int32_t in[B * T], tg[B * T];
    for (int b = 17; b < BATCHES; b++) {
        cr_assert_eq(tr_loader_next(l, in, tg, NULL, &err), TR_OK);
        cr_assert_arr_eq(in, ref_in[b], sizeof in, "resumed batch %d differs", b);
    }
    tr_loader_close(l);
    if (plugin->info->destroy)
        plugin->info->destroy(src.self);
    tr_plugin_close(plugin);
}

/* A data source that records the sample indices it is asked for. */
static uint64_t asked[64];
static size_t n_asked;
static int counting_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)self, (void)err;
    out->samples[TR_SPLIT_TRAIN] = out->samples[TR_SPLIT_VAL] = 50;
    out->input_dtype = TR_F32;
    out->input_len = out->target_len = 1;
    out->classes = 2;
    return TR_OK;
}
static int counting_read(void *self, enum tr_split split, const uint64_t *idx, size_t n,
                         void *inputs, int32_t *targets, tr_err *err)
{
    (void)self, (void)split, (void)err;
    for (size_t i = 0; i < n; i++) {
        if (n_asked < 64)
            asked[n_asked++] = idx[i];
        ((float *)inputs)[i] = 0;
        targets[i] = 0;
    }
    return TR_OK;
}

/* An in-order pass with a step (an evaluation of windows that start at every
 * token) reads samples 0, step, 2 * step, ...: ceil(50 / 4) = 13 of them, 4
 * micro-batches of 3; a shuffled one draws from all samples. */
Test(loader, an_unshuffled_step_reads_every_step_th_sample)
{
    static const struct tr_data_vtable vt = {sizeof vt, counting_info, counting_read};
    struct tr_data_source src = {.vt = &vt, .name = "counting"};
    tr_err err = {{0}};
    cr_assert_eq(counting_info(NULL, &src.info, &err), TR_OK);
    struct tr_loader_config lc = {.split = TR_SPLIT_VAL, .batch = 3, .prefetch = 1, .step = 4};
    struct tr_loader *l = tr_loader_open(&src, &lc, 0, &err);
    cr_assert_not_null(l, "%s", err.msg);
    cr_assert_eq(tr_loader_batches_per_epoch(l), 4);
    float in[3];
    int32_t tg[3];
    n_asked = 0;
    for (int b = 0; b < 5; b++)
        cr_assert_eq(tr_loader_next(l, in, tg, NULL, &err), TR_OK, "%s", err.msg);
    tr_loader_close(l);
    for (size_t i = 0; i < 12; i++)
        cr_assert_eq(asked[i], 4 * i, "sample %zu read is %llu", i, (unsigned long long)asked[i]);
    cr_assert_eq(asked[12], 0, "the second pass starts again at sample 0");

    lc.shuffle = 1;
    l = tr_loader_open(&src, &lc, 0, &err);
    cr_assert_eq(tr_loader_batches_per_epoch(l), 16, "training ignores the step");
    tr_loader_close(l);

    /* fewer samples that do not overlap than a micro-batch */
    lc.shuffle = 0;
    lc.step = 20;
    lc.batch = 4;
    cr_assert_null(tr_loader_open(&src, &lc, 0, &err));
    cr_assert(strstr(err.msg, "3 validation samples that do not overlap"), "%s", err.msg);
}

/* A data source whose reads block until released: a hung file system. */
static volatile int blocked_release;
static int blocked_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)self, (void)err;
    out->samples[TR_SPLIT_TRAIN] = out->samples[TR_SPLIT_VAL] = 64;
    out->input_dtype = TR_F32;
    out->input_len = out->target_len = 1;
    out->classes = 2;
    return TR_OK;
}
static int blocked_read(void *self, enum tr_split split, const uint64_t *idx, size_t n,
                        void *inputs, int32_t *targets, tr_err *err)
{
    (void)self, (void)split, (void)idx, (void)inputs, (void)targets, (void)n, (void)err;
    while (!blocked_release)
        usleep(1000);
    return TR_OK;
}

Test(loader, a_signal_ends_a_wait_for_a_stuck_worker_and_bad_positions_fail)
{
    static const struct tr_data_vtable vt = {sizeof vt, blocked_info, blocked_read};
    struct tr_data_source src = {.vt = &vt, .name = "blocked"};
    tr_err err = {{0}};
    src.info.struct_size = sizeof src.info;
    blocked_info(NULL, &src.info, &err);
    volatile sig_atomic_t cancel = 0;
    struct tr_loader_config lc = {TR_SPLIT_TRAIN, 4, 2, 2, 1, 9, NULL, 0, 1, &cancel, 0};
    /* a damaged resume position that would wrap the batch numbers */
    cr_assert_null(tr_loader_open(&src, &lc, UINT64_MAX - 1, &err));
    cr_assert(strstr(err.msg, "out of range"), "%s", err.msg);

    blocked_release = 0;
    struct tr_loader *l = tr_loader_open(&src, &lc, 0, &err);
    cr_assert_not_null(l, "%s", err.msg);
    float in[4];
    int32_t tg[4];
    cancel = 1; /* what the SIGTERM handler does */
    double t0 = tr_now();
    cr_assert_eq(tr_loader_next(l, in, tg, NULL, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "interrupted by a signal"), "%s", err.msg);
    cr_assert(tr_loader_cancelled(l));
    tr_loader_close(l); /* gives up on the stuck workers after a grace period */
    cr_assert_lt(tr_now() - t0, 10.0);
    blocked_release = 1; /* they finish and exit on their own; the loader was not freed */
    usleep(20000);
}

/* ---- stop signals --------------------------------------------------------- */

static void *mask_of_a_new_thread(void *arg)
{
    pthread_sigmask(SIG_BLOCK, NULL, arg);
    return NULL;
}

static int wait_for(volatile sig_atomic_t *flag, int sig)
{
    for (int i = 0; i < 2000 && *flag != sig; i++)
        usleep(1000);
    return *flag == sig;
}

Test(stop_signals, blocked_in_every_new_thread_taken_by_one_and_the_mask_restored)
{
    static volatile sig_atomic_t flag;
    struct tr_stop_signals s;
    tr_err err = {{0}};
    sigset_t mask;
    cr_assert_eq(tr_stop_signals_start(&s, &flag, &err), TR_OK, "%s", err.msg);
    pthread_sigmask(SIG_BLOCK, NULL, &mask);
    cr_assert(sigismember(&mask, SIGTERM) && sigismember(&mask, SIGUSR1) &&
              sigismember(&mask, SIGINT));
    /* a thread the run starts (OpenMP's, the loader's) inherits the mask */
    pthread_t t;
    sigset_t inherited;
    cr_assert_eq(pthread_create(&t, NULL, mask_of_a_new_thread, &inherited), 0);
    pthread_join(t, NULL);
    cr_assert(sigismember(&inherited, SIGTERM) && sigismember(&inherited, SIGINT));

    kill(getpid(), SIGTERM);
    cr_assert(wait_for(&flag, SIGTERM), "SIGTERM did not set the flag (%d)", (int)flag);
    kill(getpid(), SIGUSR1); /* the process lives on; the flag says the latest */
    cr_assert(wait_for(&flag, SIGUSR1), "SIGUSR1 did not set the flag (%d)", (int)flag);

    tr_stop_signals_end(&s);
    pthread_sigmask(SIG_BLOCK, NULL, &mask);
    cr_assert(!sigismember(&mask, SIGTERM) && !sigismember(&mask, SIGINT),
              "the caller's mask is not back");
    tr_stop_signals_end(&s); /* twice: nothing */
    /* after the run: a signal sets the flag, it does not kill the process */
    flag = 0;
    kill(getpid(), SIGINT);
    cr_assert(wait_for(&flag, SIGINT), "SIGINT after end (%d)", (int)flag);
}

/* ---- formats ----------------------------------------------------------- */

/* Two tensors over the same bytes (the safetensors library refuses them):
 * refused, naming both; tensors of no bytes at a shared offset are fine. */
Test(safetensors, refuses_overlapping_data_offsets)
{
    static const char *const headers[] = {
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
    };
    for (int i = 0; i < 4; i++) {
        size_t hl = strlen(headers[i]), size = 8 + hl + 8;
        unsigned char *buf = calloc(1, size);
        for (int k = 0; k < 8; k++)
            buf[k] = (unsigned char)((uint64_t)hl >> (8 * k));
        memcpy(buf + 8, headers[i], hl);
        tr_err err = {{0}};
        struct tr_st_file *f = tr_safetensors_read(buf, size, "o.safetensors", &err);
        if (i < 3) {
            cr_assert_null(f, "header %d: overlapping offsets accepted", i);
            cr_assert(strstr(err.msg, "o.safetensors: tensors '") &&
                          strstr(err.msg, "have overlapping data offsets"), "%s", err.msg);
        } else {
            cr_assert_not_null(f, "header %d: %s", i, err.msg);
            tr_safetensors_free(f);
        }
        free(buf);
    }
}

/* A tensor name from a file reaches a terminal in messages: its escape
 * sequences are shown escaped, never sent raw. */
Test(safetensors, names_in_messages_are_escaped)
{
    const char *h = "{\"\\u001b[2J\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"\\u001b[2J\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    size_t hl = strlen(h), size = 8 + hl + 8;
    unsigned char *buf = calloc(1, size);
    for (int k = 0; k < 8; k++)
        buf[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    memcpy(buf + 8, h, hl);
    tr_err err = {{0}};
    cr_assert_null(tr_safetensors_read(buf, size, "n.safetensors", &err));
    cr_assert_str_eq(err.msg, "n.safetensors: tensor '\\x1b[2J' appears twice");
    free(buf);
}

Test(safetensors, round_trips_and_detects_truncation)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    int32_t b[3] = {7, -8, 9};
    struct tr_st_entry e[2] = {{"layer.weight", TR_F32, 2, {2, 3}, a, sizeof a},
                               {"ids", TR_I32, 1, {3}, b, sizeof b}};
    size_t size;
    void *buf = tr_safetensors_write(e, 2, "{\"format\":\"pt\"}", &size);
    cr_assert_not_null(buf);
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    cr_assert_eq(hlen % 8, 0, "data must start 8-byte aligned");
    tr_err err = {{0}};
    struct tr_st_file *f = tr_safetensors_read(buf, size, "x.safetensors", &err);
    cr_assert_not_null(f, "%s", err.msg);
    cr_assert_eq(tr_safetensors_count(f), 2);
    const struct tr_st_entry *w = tr_safetensors_find(f, "layer.weight");
    cr_assert_not_null(w);
    cr_assert_eq(w->ndim, 2);
    cr_assert_eq(w->shape[1], 3);
    cr_assert_arr_eq(w->data, a, sizeof a);
    cr_assert_arr_eq(tr_safetensors_find(f, "ids")->data, b, sizeof b);
    tr_safetensors_free(f);
    cr_assert_null(tr_safetensors_read(buf, size - 4, "x.safetensors", &err));
    cr_assert(strstr(err.msg, "x.safetensors: tensor 'ids' has data offsets"), "%s", err.msg);
    cr_assert_null(tr_safetensors_read(buf, 5, "x.safetensors", &err));
    cr_assert_str_eq(err.msg, "x.safetensors: truncated safetensors file (5 bytes)");
    free(buf);
}

Test(json, parses_what_checkpoints_write)
{
    const char *text = "{\"step\": 12, \"name\": \"a\\\"b\", \"vars\": {\"scale\": 65536.5}, \"list\": [1, true, null]}";
    struct tr_json *j = tr_json_parse(text, strlen(text), NULL);
    cr_assert_not_null(j);
    cr_assert_float_eq(tr_json_number(j, "step", 0), 12, 0);
    cr_assert_str_eq(tr_json_string(j, "name"), "a\"b");
    cr_assert_float_eq(tr_json_number(tr_json_get(j, "vars"), "scale", 0), 65536.5, 0);
    cr_assert_eq(tr_json_get(j, "list")->n, 3);
    tr_json_free(j);
    size_t at = 0;
    cr_assert_null(tr_json_parse("{\"a\": }", 7, &at));
    cr_assert_eq(at, 6);
}

Test(suggest, picks_the_closest_within_reach)
{
    const char *names[] = {"warmup", "min_lr_ratio", "steps"};
    cr_assert_str_eq(tr_suggest("warmpu", names, 3), "warmup");
    cr_assert_str_eq(tr_suggest("step", names, 3), "steps");
    cr_assert_null(tr_suggest("batch", names, 3));
    cr_assert_eq(tr_edit_distance("kitten", "sitting"), 3);
}

/* ---- placement ------------------------------------------------------- */

Test(topology, synthetic_two_socket_machine_and_this_one)
{
    tr_err err = {{0}};
    struct tr_topo *t = tr_topo_open("synthetic:package:2 numa:1 core:8 pu:2", &err);
    cr_assert_not_null(t, "%s", err.msg);
    cr_assert_eq(tr_topo_cores(t), 16);
    cr_assert_eq(tr_topo_pus(t), 32);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tr_topo_print(t, 4, 2, f);
    fclose(f);
    cr_assert(strstr(text, "2 package(s), 2 NUMA node(s), 16 core(s), 32 PU(s)"), "%s", text);
    cr_assert(strstr(text, "compute thread 3 -> core L#3"), "%s", text);
    cr_assert(strstr(text, "2 loader worker(s) -> beside them, PUs 0-7"), "%s", text);
    free(text);
    tr_topo_close(t);

    cr_assert_null(tr_topo_open("synthetic:not a topology", &err));
    cr_assert(strstr(err.msg, "cannot load the topology"), "%s", err.msg);

    t = tr_topo_open(NULL, &err);
    cr_assert_not_null(t, "%s", err.msg);
    cr_assert_geq(tr_topo_cores(t), 1);
    cr_assert_geq(tr_topo_bind_compute(t, 0), 1, "no compute thread could be pinned");
    tr_topo_close(t);
}

/* ---- the 64-bit mixers ------------------------------------------------- */

/* Every seeded result trainrun gives (initial weights, the loader's order,
 * the data sources' splits and samples, prepare's hashes) goes through
 * <trainrun/mix.h>: these are the numbers the copies it replaced gave, and
 * SplitMix64's published first output for seed 0. */
Test(mixers, give_the_numbers_runs_were_seeded_with)
{
    cr_assert_eq(tr_mix64(0), 0);
    cr_assert_eq(tr_mix64(1), 0xb456bcfc34c2cb2cULL);
    cr_assert_eq(tr_mix64(0xdeadbeefULL), 0xd24bd59f862a1dacULL);
    cr_assert_eq(tr_splitmix64(0), 0xe220a8397b1dcdafULL);
    cr_assert_eq(tr_splitmix64(42), 0xbdd732262feb6e95ULL);
    uint64_t state = 42;
    cr_assert_eq(tr_splitmix64_next(&state), 0xbdd732262feb6e95ULL);
    cr_assert_eq(tr_splitmix64_next(&state), 0x28efe333b266f103ULL);
    cr_assert_eq(tr_splitmix64_next(&state), 0x47526757130f9f52ULL);

    /* the loader's shuffle of 10 samples, seed 7, in its first two epochs */
    static const uint64_t order[2][10] = {{3, 1, 2, 4, 6, 7, 0, 8, 5, 9},
                                          {4, 1, 8, 6, 7, 3, 0, 5, 2, 9}};
    for (uint64_t epoch = 0; epoch < 2; epoch++)
        for (uint64_t i = 0; i < 10; i++)
            cr_assert_eq(tr_loader_sample(7, epoch, i, 10, 1), order[epoch][i],
                         "epoch %llu, position %llu", (unsigned long long)epoch,
                         (unsigned long long)i);
}

/* train.tokens = "2B" and train.time = "6h": the suffixes, and what is refused */
Test(durations, counts_with_suffixes)
{
    cr_assert_float_eq(tr_parse_count("2B"), 2e9, 1e-3);
    cr_assert_float_eq(tr_parse_count("500M"), 5e8, 1e-3);
    cr_assert_float_eq(tr_parse_count("12k"), 12e3, 1e-9);
    cr_assert_float_eq(tr_parse_count("12K"), 12e3, 1e-9);
    cr_assert_float_eq(tr_parse_count("1.5T"), 1.5e12, 1);
    cr_assert_float_eq(tr_parse_count("3e9"), 3e9, 1e-3);
    cr_assert_float_eq(tr_parse_count("64"), 64, 1e-12);
    const char *bad[] = {"", "B", "2X", "2BB", "2 B", "-1k", "nan", "2b"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_lt(tr_parse_count(bad[i]), 0, "'%s' was read as a count", bad[i]);
}

Test(durations, durations_with_units)
{
    cr_assert_float_eq(tr_parse_duration("90s"), 90, 1e-9);
    cr_assert_float_eq(tr_parse_duration("45m"), 2700, 1e-9);
    cr_assert_float_eq(tr_parse_duration("1.5h"), 5400, 1e-9);
    cr_assert_float_eq(tr_parse_duration("2d"), 172800, 1e-9);
    cr_assert_float_eq(tr_parse_duration("30"), 30, 1e-9);
    const char *bad[] = {"", "h", "6y", "6hh", "-1h", "1 h", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_lt(tr_parse_duration(bad[i]), 0, "'%s' was read as a duration", bad[i]);
}
