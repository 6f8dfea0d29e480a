/*
 * Tests of the plugins shipped with trainrun, loaded the way the core loads
 * them: dlopen the built .so from $TR_PLUGIN_BUILD_DIR, call the entry
 * symbol, fill the config struct from the option schema, create, and drive
 * the kind's vtable.
 *
 * Covers: plugins/precision/, plugins/schedule/, plugins/data/ (text.c, csv.c, idx.c,
 * synthetic.c) and plugins/checkpoint/local.c, through include/trainrun/plugin.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include "scratch.h"
#include <trainrun/plugin.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ---- a host for the plugins -------------------------------------------- */

static char last_warning[2048];
static int warnings;

static void test_log(enum tr_log_level level, const char *who, const char *fmt, ...)
{
    (void)who;
    if (level < TR_LOG_WARN)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_warning, sizeof last_warning, fmt, ap);
    va_end(ap);
    warnings++;
}

/* the host (logging to test_log), load, set, create_ok, create_fails,
 * destroy: tests/plugin_harness.h */
#include "plugin_harness.h"

/* ---- a temporary directory per test ------------------------------------ */

/* each test gets a scratch directory (tests/scratch.h) */
static void make_tmp(void)
{
    tmp_create("trplugtest");
    warnings = 0;
    last_warning[0] = '\0';
}

/* ---- option schemas ---------------------------------------------------- */

/* The bytes an option of `type` fills in a config. */
static size_t option_size(enum tr_option_type type)
{
    switch (type) {
    case TR_OPT_INT: return sizeof(int64_t);
    case TR_OPT_FLOAT: return sizeof(double);
    case TR_OPT_BOOL: return sizeof(int);
    default: return sizeof(const char *);
    }
}

/* ---- every plugin: the info struct and the option schema --------------- */

static const char *const shipped[] = {
    "precision_fp32", "precision_bf16", "precision_fp16",
    "data_text", "data_csv", "data_idx", "data_synthetic", "data_tokens",
    "checkpoint_local",
    "schedule_constant", "schedule_cosine", "schedule_linear", "schedule_step",
    "schedule_plateau",
};

static const struct {
    const char *prefix;
    enum tr_plugin_kind kind;
    size_t vtable_size;
} kinds[] = {
    {"precision_", TR_KIND_PRECISION, sizeof(struct tr_precision_vtable)},
    {"data_", TR_KIND_DATA, sizeof(struct tr_data_vtable)},
    {"checkpoint_", TR_KIND_CHECKPOINT, sizeof(struct tr_checkpoint_vtable)},
    {"schedule_", TR_KIND_SCHEDULE, sizeof(struct tr_schedule_vtable)},
};

static void check_info(const char *file)
{
    struct plugin p = load(file);
    const struct tr_plugin_info *in = p.info;
    cr_assert_eq(in->abi_major, TR_ABI_MAJOR, "%s", file);
    cr_assert_eq(in->struct_size, sizeof(struct tr_plugin_info), "%s", file);
    cr_assert_str_eq(strchr(file, '_') + 1, in->name, "file name and plugin name differ");
    cr_assert_str_eq(in->version, "0.1.0", "%s", file);
    cr_assert(in->description && *in->description && !strchr(in->description, '\n'), "%s",
              file);
    cr_assert(in->create, "%s has no create", file);

    int known = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        if (strncmp(file, kinds[k].prefix, strlen(kinds[k].prefix)) != 0)
            continue;
        known = 1;
        cr_assert_eq(in->kind, kinds[k].kind, "%s: wrong kind", file);
        const uint32_t *vt = in->vtable; /* every vtable starts with its struct_size */
        cr_assert(vt, "%s has no vtable", file);
        cr_assert_eq(vt[0], kinds[k].vtable_size, "%s: vtable struct_size", file);
    }
    cr_assert(known, "%s: unknown kind prefix", file);

    for (const struct tr_option *o = in->options; o && o->type != TR_OPT_END; o++) {
        cr_assert(o->name && *o->name, "%s: option without a name", file);
        cr_assert(o->help && strlen(o->help) > 10, "%s.%s: help missing", file, o->name);
        cr_assert_leq(o->offset + option_size(o->type), in->config_size,
                      "%s.%s: offset outside the config", file, o->name);
        if (!o->default_value)
            continue; /* required */
        if (o->type == TR_OPT_INT || o->type == TR_OPT_FLOAT) {
            char *end;
            double v = strtod(o->default_value, &end);
            cr_assert(*end == '\0', "%s.%s: default %s is not a number", file, o->name,
                      o->default_value);
            if (o->min != 0 || o->max != 0)
                cr_assert(v >= o->min && v <= o->max, "%s.%s: default %g out of range", file,
                          o->name, v);
        } else if (o->type == TR_OPT_BOOL) {
            cr_assert(!strcmp(o->default_value, "true") || !strcmp(o->default_value, "false"),
                      "%s.%s", file, o->name);
        } else if (o->type == TR_OPT_ENUM) {
            int found = 0;
            for (const char *const *c = o->choices; c && *c; c++)
                found |= strcmp(*c, o->default_value) == 0;
            cr_assert(found, "%s.%s: default not among the choices", file, o->name);
        }
    }
}

Test(info, shipped_plugins_are_well_formed)
{
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++)
        check_info(shipped[i]);
}

/* Anything else in the build directory (e.g. the contrib example) too. */
Test(info, every_plugin_in_build_dir_is_well_formed)
{
    const char *dir = getenv("TR_PLUGIN_BUILD_DIR");
    cr_assert(dir, "set TR_PLUGIN_BUILD_DIR");
    DIR *d = opendir(dir);
    cr_assert(d, "cannot open %s", dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".so") != 0)
            continue;
        char file[256];
        snprintf(file, sizeof file, "%.*s", (int)(len - 3), e->d_name);
        int known = 0; /* kinds this test knows the vtable of */
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
            known |= strncmp(file, kinds[k].prefix, strlen(kinds[k].prefix)) == 0;
        if (!known)
            continue;
        check_info(file);
        n++;
    }
    closedir(d);
    cr_assert_geq(n, (int)(sizeof shipped / sizeof shipped[0]));
}

/* ---- precision --------------------------------------------------------- */

static const struct tr_precision_vtable *precision(struct plugin *p)
{
    return p->info->vtable;
}

Test(precision, fp32_policy)
{
    struct plugin p = load("precision_fp32");
    void *self = create_ok(&p, 0);
    struct tr_precision_policy pol = {.struct_size = sizeof pol};
    precision(&p)->policy(self, &pol);
    cr_assert_eq(pol.master, TR_F32);
    cr_assert_eq(pol.compute, TR_F32);
    cr_assert_eq(pol.grad, TR_F32);
    cr_assert_eq(pol.allow_tf32, 0);
    cr_assert_null(precision(&p)->loss_scale);
    destroy(&p, self);

    set(&p, "allow_tf32", "true");
    self = create_ok(&p, 0);
    precision(&p)->policy(self, &pol);
    cr_assert_eq(pol.allow_tf32, 1);
    destroy(&p, self);

    /* tf32 = true is the recipe's name for the same switch */
    set(&p, "allow_tf32", "false");
    set(&p, "tf32", "true");
    self = create_ok(&p, 0);
    precision(&p)->policy(self, &pol);
    cr_assert_eq(pol.allow_tf32, 1);
    cr_assert_eq(pol.compute, TR_F32);
    destroy(&p, self);
}

Test(precision, bf16_policy)
{
    struct plugin p = load("precision_bf16");
    void *self = create_ok(&p, 0);
    struct tr_precision_policy pol = {.struct_size = sizeof pol};
    precision(&p)->policy(self, &pol);
    cr_assert_eq(pol.master, TR_F32);
    cr_assert_eq(pol.compute, TR_BF16);
    cr_assert_eq(pol.grad, TR_F32);
    cr_assert_null(precision(&p)->update);
    destroy(&p, self);
}

Test(precision, fp16_grows_after_interval_and_backs_off_on_overflow)
{
    struct plugin p = load("precision_fp16");
    set(&p, "init_scale", "1024");
    set(&p, "growth_interval", "3");
    void *self = create_ok(&p, 0);
    const struct tr_precision_vtable *vt = precision(&p);
    tr_err err = {{0}};

    struct tr_precision_policy pol = {.struct_size = sizeof pol};
    vt->policy(self, &pol);
    cr_assert_eq(pol.compute, TR_F16);
    cr_assert_eq(pol.master, TR_F32);
    cr_assert_eq(pol.grad, TR_F32);

    cr_assert_eq(vt->loss_scale(self), 1024);
    cr_assert_eq(vt->update(self, 1, &err), 1);
    cr_assert_eq(vt->update(self, 1, &err), 1);
    cr_assert_eq(vt->loss_scale(self), 1024);
    cr_assert_eq(vt->update(self, 1, &err), 1);
    cr_assert_eq(vt->loss_scale(self), 2048, "grows after growth_interval good steps");

    cr_assert_eq(vt->update(self, 1, &err), 1);
    cr_assert_eq(vt->update(self, 0, &err), 0, "an overflow step is skipped");
    cr_assert_eq(vt->loss_scale(self), 1024);
    /* the overflow reset the good-step counter: 2 more good steps do not grow */
    cr_assert_eq(vt->update(self, 1, &err), 1);
    cr_assert_eq(vt->update(self, 1, &err), 1);
    cr_assert_eq(vt->loss_scale(self), 1024);

    struct tr_state_var vars[8];
    size_t n = vt->state_save(self, vars, 8);
    cr_assert_eq(n, 3);
    void *other = create_ok(&p, 0);
    cr_assert_eq(vt->state_load(other, vars, n, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->loss_scale(other), 1024);
    cr_assert_eq(vt->update(other, 1, &err), 1);
    cr_assert_eq(vt->loss_scale(other), 2048, "good_steps survived the round trip");
    struct tr_state_var again[8];
    vt->state_save(other, again, 8);
    for (size_t i = 0; i < n; i++)
        if (strcmp(again[i].name, "skipped_steps") == 0)
            cr_assert_eq(again[i].value, 1);
    destroy(&p, self);
    destroy(&p, other);
}

Test(precision, fp16_collapse_stops_the_run)
{
    struct plugin p = load("precision_fp16");
    void *self = create_ok(&p, 0); /* defaults: 65536, backoff 0.5, min 1 */
    const struct tr_precision_vtable *vt = precision(&p);
    tr_err err = {{0}};
    for (int i = 0; i < 16; i++)
        cr_assert_eq(vt->update(self, 0, &err), 0, "overflow %d", i + 1);
    cr_assert_eq(vt->loss_scale(self), 1);
    cr_assert_eq(vt->update(self, 0, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "collapsed to 1 after 17 consecutive overflow steps"), "%s",
              err.msg);
    cr_assert(strstr(err.msg, "precision = \"bf16\""), "%s", err.msg);
    destroy(&p, self);
}

Test(precision, fp16_rejects_init_below_min)
{
    struct plugin p = load("precision_fp16");
    set(&p, "init_scale", "0.5");
    create_fails(&p, 0, "init_scale", "min_scale");
}

/* ---- schedules --------------------------------------------------------- */

static double lr_at(struct plugin *p, void *self, uint64_t step, uint64_t total)
{
    const struct tr_schedule_vtable *vt = p->info->vtable;
    return vt->lr(self, step, total, 1.0);
}

#define assert_near(a, b) cr_assert_float_eq((a), (b), 1e-12, "%.15g != %.15g", (a), (b))

Test(schedule, constant)
{
    struct plugin p = load("schedule_constant");
    void *self = create_ok(&p, 0);
    assert_near(lr_at(&p, self, 0, 100), 1.0);
    assert_near(lr_at(&p, self, 99, 100), 1.0);
    destroy(&p, self);

    set(&p, "warmup", "4");
    self = create_ok(&p, 0);
    assert_near(lr_at(&p, self, 0, 100), 0.25);
    assert_near(lr_at(&p, self, 3, 100), 1.0);
    assert_near(lr_at(&p, self, 50, 100), 1.0);
    destroy(&p, self);
}

Test(schedule, cosine)
{
    struct plugin p = load("schedule_cosine");
    set(&p, "warmup", "10");
    void *self = create_ok(&p, 0); /* min_lr_ratio 0.1 */
    assert_near(lr_at(&p, self, 0, 111), 0.1);
    assert_near(lr_at(&p, self, 9, 111), 1.0);
    assert_near(lr_at(&p, self, 10, 111), 1.0);
    assert_near(lr_at(&p, self, 60, 111), 0.55); /* halfway through the decay */
    assert_near(lr_at(&p, self, 110, 111), 0.1);
    assert_near(lr_at(&p, self, 500, 111), 0.1); /* past the end stays at the floor */
    destroy(&p, self);
}

Test(schedule, linear)
{
    struct plugin p = load("schedule_linear");
    void *self = create_ok(&p, 0); /* warmup 0, end_ratio 0 */
    assert_near(lr_at(&p, self, 0, 11), 1.0);
    assert_near(lr_at(&p, self, 5, 11), 0.5);
    assert_near(lr_at(&p, self, 10, 11), 0.0);
    destroy(&p, self);

    set(&p, "warmup", "2");
    set(&p, "end_ratio", "0.5");
    self = create_ok(&p, 0);
    assert_near(lr_at(&p, self, 0, 12), 0.5);
    assert_near(lr_at(&p, self, 2, 12), 1.0);
    assert_near(lr_at(&p, self, 11, 12), 0.5);
    destroy(&p, self);
}

Test(schedule, step)
{
    struct plugin p = load("schedule_step");
    set(&p, "warmup", "2");
    set(&p, "step_size", "3");
    void *self = create_ok(&p, 0); /* gamma 0.1 */
    assert_near(lr_at(&p, self, 0, 100), 0.5);
    assert_near(lr_at(&p, self, 1, 100), 1.0);
    assert_near(lr_at(&p, self, 4, 100), 1.0);
    assert_near(lr_at(&p, self, 5, 100), 0.1);
    assert_near(lr_at(&p, self, 8, 100), 0.01);
    destroy(&p, self);
}

Test(schedule, plateau_reduces_after_patience_and_round_trips)
{
    struct plugin p = load("schedule_plateau");
    set(&p, "patience", "2");
    set(&p, "cooldown", "1");
    set(&p, "min_lr_ratio", "0.2");
    void *self = create_ok(&p, 0); /* factor 0.5 */
    const struct tr_schedule_vtable *vt = p.info->vtable;

    vt->observe(self, 100, 2.0);
    vt->observe(self, 200, 1.0); /* improvement */
    vt->observe(self, 300, 1.0); /* bad 1 */
    vt->observe(self, 400, 0.99995); /* below the 1e-4 relative threshold: bad 2 */
    assert_near(lr_at(&p, self, 400, 1000), 1.0);
    vt->observe(self, 500, 1.0); /* bad 3 > patience */
    assert_near(lr_at(&p, self, 500, 1000), 0.5);
    vt->observe(self, 600, 1.0); /* cooldown: not counted */
    vt->observe(self, 700, 1.0);
    vt->observe(self, 800, 1.0);
    assert_near(lr_at(&p, self, 800, 1000), 0.5);

    struct tr_state_var vars[8];
    size_t n = vt->state_save(self, vars, 8);
    cr_assert_eq(n, 4);
    void *other = create_ok(&p, 0);
    tr_err err = {{0}};
    cr_assert_eq(vt->state_load(other, vars, n, &err), TR_OK, "%s", err.msg);
    assert_near(lr_at(&p, other, 800, 1000), 0.5);

    /* both continue identically: one more bad evaluation reduces, floored at 0.2 */
    vt->observe(self, 900, 1.0);
    vt->observe(other, 900, 1.0);
    assert_near(lr_at(&p, self, 900, 1000), 0.25);
    assert_near(lr_at(&p, other, 900, 1000), 0.25);
    for (int i = 0; i < 10; i++)
        vt->observe(other, 1000, 1.0);
    assert_near(lr_at(&p, other, 1000, 1000), 0.2);

    /* the best loss survived: 0.9 improves on 1.0, so no reduction follows */
    void *third = create_ok(&p, 0);
    cr_assert_eq(vt->state_load(third, vars, n, &err), TR_OK);
    vt->observe(third, 900, 0.9);
    for (int i = 0; i < 2; i++)
        vt->observe(third, 1000, 0.95);
    assert_near(lr_at(&p, third, 1000, 1000), 0.5);
    destroy(&p, self);
    destroy(&p, other);
    destroy(&p, third);
}

Test(schedule, invsqrt_example)
{
    const char *dir = getenv("TR_PLUGIN_BUILD_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/schedule_invsqrt.so", dir ? dir : ".");
    if (access(path, R_OK) != 0)
        cr_skip_test("the contrib example is not built into TR_PLUGIN_BUILD_DIR");
    struct plugin p = load("schedule_invsqrt");
    set(&p, "warmup", "100");
    void *self = create_ok(&p, 0);
    assert_near(lr_at(&p, self, 0, 1000), 0.01);
    assert_near(lr_at(&p, self, 99, 1000), 1.0);
    assert_near(lr_at(&p, self, 399, 1000), 0.5);
    destroy(&p, self);
}

/* ---- data: helpers ----------------------------------------------------- */

static struct tr_data_info data_info(struct plugin *p, void *self)
{
    const struct tr_data_vtable *vt = p->info->vtable;
    struct tr_data_info info = {.struct_size = sizeof info};
    tr_err err = {{0}};
    cr_assert_eq(vt->info(self, &info, &err), TR_OK, "%s", err.msg);
    return info;
}

static void read_one(struct plugin *p, void *self, enum tr_split split, uint64_t index,
                     void *inputs, int32_t *targets)
{
    const struct tr_data_vtable *vt = p->info->vtable;
    tr_err err = {{0}};
    cr_assert_eq(vt->read(self, split, &index, 1, inputs, targets, &err), TR_OK, "%s",
                 err.msg);
}

TestSuite(text, .init = make_tmp, .fini = remove_tmp);
TestSuite(csv, .init = make_tmp, .fini = remove_tmp);
TestSuite(idx, .init = make_tmp, .fini = remove_tmp);
TestSuite(checkpoint, .init = make_tmp, .fini = remove_tmp);

/* ---- text -------------------------------------------------------------- */

Test(text, sample_windows)
{
    unsigned char bytes[100]; /* past 127 too: tokens are bytes 0..255, never negative */
    for (int i = 0; i < 100; i++)
        bytes[i] = (unsigned char)(40 + 2 * i);
    const char *path = tmp_path("corpus.txt");
    write_file(path, bytes, sizeof bytes);

    struct plugin p = load("data_text");
    set(&p, "path", path);
    set(&p, "val_fraction", "0.2"); /* train: bytes 0..79, val: 80..99 */
    void *self = create_ok(&p, 8);
    struct tr_data_info info = data_info(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 9);   /* (80-1)/8 */
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 2);     /* (20-1)/8 */
    cr_assert_eq(info.input_dtype, TR_I32);
    cr_assert_eq(info.input_len, 8);
    cr_assert_eq(info.target_len, 8);
    cr_assert_eq(info.classes, 256);

    int32_t in[8], tgt[8];
    read_one(&p, self, TR_SPLIT_TRAIN, 1, in, tgt);
    for (int k = 0; k < 8; k++) {
        cr_assert_eq(in[k], bytes[8 + k]);
        cr_assert_eq(tgt[k], bytes[9 + k]);
    }
    read_one(&p, self, TR_SPLIT_VAL, 1, in, tgt);
    for (int k = 0; k < 8; k++) {
        cr_assert_eq(in[k], bytes[88 + k]);
        cr_assert_eq(tgt[k], bytes[89 + k]);
    }

    uint64_t beyond = 9;
    tr_err err = {{0}};
    const struct tr_data_vtable *vt = p.info->vtable;
    cr_assert_eq(vt->read(self, TR_SPLIT_TRAIN, &beyond, 1, in, tgt, &err), TR_ERROR);
    destroy(&p, self);
}

Test(text, errors)
{
    struct plugin p = load("data_text");
    set(&p, "path", "no/such/corpus.txt");
    create_fails(&p, 8, "no/such/corpus.txt", "relative to the current directory");

    const char *empty = tmp_path("empty.txt");
    write_text(empty, "");
    set(&p, "path", empty);
    create_fails(&p, 8, empty, "empty");

    const char *small = tmp_path("small.txt");
    char bytes[100];
    memset(bytes, 'a', sizeof bytes);
    write_file(small, bytes, sizeof bytes);
    set(&p, "path", small);
    create_fails(&p, 0, "needs a sequence model", NULL);
    /* val split: 10 bytes; seq_len 16 needs 17 */
    set(&p, "val_fraction", "0.1");
    create_fails(&p, 16, "has 10 bytes", "needs 17");
}

/* ---- csv --------------------------------------------------------------- */

static void *csv_from(struct plugin *p, const char *name, const char *text)
{
    const char *path = tmp_path(name);
    write_text(path, text);
    set(p, "path", path);
    return create_ok(p, 0);
}

static void csv_fails(const char *text, const char *want1, const char *want2)
{
    struct plugin p = load("data_csv");
    const char *path = tmp_path("bad.csv");
    write_text(path, text);
    set(&p, "path", path);
    create_fails(&p, 0, want1, want2);
}

Test(csv, good_file)
{
    struct plugin p = load("data_csv");
    set(&p, "val_fraction", "0.2");
    void *self = csv_from(&p, "good.csv",
                          "1,2,0\n3,4,1\n5, 6 ,2\r\n\n7,8,1\n9,10,0\n-1e1,0.5,3\n7,7,0\n"
                          "1,1,1\n2,2,2\n3,3,0");
    struct tr_data_info info = data_info(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 8);
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 2);
    cr_assert_eq(info.input_dtype, TR_F32);
    cr_assert_eq(info.input_len, 2);
    cr_assert_eq(info.target_len, 1);
    cr_assert_eq(info.classes, 4);

    float x[2];
    int32_t y;
    read_one(&p, self, TR_SPLIT_TRAIN, 2, x, &y);
    cr_assert(x[0] == 5 && x[1] == 6 && y == 2);
    read_one(&p, self, TR_SPLIT_TRAIN, 5, x, &y);
    cr_assert(x[0] == -10 && x[1] == 0.5f && y == 3);
    read_one(&p, self, TR_SPLIT_VAL, 1, x, &y); /* the last row */
    cr_assert(x[0] == 3 && x[1] == 3 && y == 0);
    destroy(&p, self);
}

Test(csv, header_label_column_scale_classes)
{
    struct plugin p = load("data_csv");
    set(&p, "header", "true");
    set(&p, "label_column", "0");
    set(&p, "scale", "0.5");
    set(&p, "classes", "10");
    set(&p, "val_fraction", "0");
    void *self = csv_from(&p, "h.csv", "label,a,b,c\n1,2,4,6\n0,8,10,12\n");
    struct tr_data_info info = data_info(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 2);
    cr_assert_eq(info.input_len, 3);
    cr_assert_eq(info.classes, 10);
    float x[3];
    int32_t y;
    read_one(&p, self, TR_SPLIT_TRAIN, 1, x, &y);
    cr_assert(x[0] == 4 && x[1] == 5 && x[2] == 6 && y == 0);
    destroy(&p, self);
}

Test(csv, gzip_file)
{
    const char *path = tmp_path("data.csv.gz");
    gzFile gz = gzopen(path, "wb");
    cr_assert(gz);
    for (int i = 0; i < 100; i++)
        gzprintf(gz, "%d,%d,%d\n", i, -i, i % 3);
    gzclose(gz);

    struct plugin p = load("data_csv");
    set(&p, "path", path);
    void *self = create_ok(&p, 0);
    struct tr_data_info info = data_info(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 90);
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 10);
    cr_assert_eq(info.classes, 3);
    float x[2];
    int32_t y;
    read_one(&p, self, TR_SPLIT_VAL, 3, x, &y); /* row 93 */
    cr_assert(x[0] == 93 && x[1] == -93 && y == 0);
    destroy(&p, self);
}

Test(csv, wrong_field_count)
{
    csv_fails("1,2,0\n3,4,1\n5,6\n", "bad.csv:3", "expected 3 fields (as on line 1), got 2");
}

Test(csv, not_a_number)
{
    csv_fails("1,2,0\n3,x1,1\n", "bad.csv:2", "\"x1\" is not a number");
}

Test(csv, negative_label)
{
    csv_fails("1,2,0\n3,4,-1\n", "bad.csv:2", "\"-1\" is negative");
}

Test(csv, non_integer_label)
{
    csv_fails("1,2,0\n3,4,1.5\n", "bad.csv:2", "\"1.5\" is not an integer");
}

Test(csv, label_not_below_classes)
{
    struct plugin p = load("data_csv");
    const char *path = tmp_path("bad.csv");
    write_text(path, "1,2,0\n3,4,1\n5,6,2\n");
    set(&p, "path", path);
    set(&p, "classes", "2");
    create_fails(&p, 0, "bad.csv:3", "not below classes = 2");
}

Test(csv, empty_file)
{
    csv_fails("", "bad.csv", "no data rows");
    csv_fails("\n\n", "bad.csv", "no data rows");
}

/* ---- idx --------------------------------------------------------------- */

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* An IDX file with the given dims; elems are already in file byte order. */
static void write_idx(const char *path, int dtype, int ndims, const uint32_t *dims,
                      const void *elems, size_t elem_bytes)
{
    unsigned char header[4 + 4 * 4] = {0, 0, (unsigned char)dtype, (unsigned char)ndims};
    for (int d = 0; d < ndims; d++)
        put_be32(header + 4 + 4 * d, dims[d]);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite(header, 1, 4 + 4 * (size_t)ndims, f);
    fwrite(elems, 1, elem_bytes, f);
    fclose(f);
}

/* 10 images of 2x2 pixels: image i has pixels 10i..10i+3; label i % 4. */
static void write_mnist_like(const char *images, const char *labels)
{
    unsigned char px[10 * 4], lb[10];
    for (int i = 0; i < 10; i++) {
        for (int k = 0; k < 4; k++)
            px[4 * i + k] = (unsigned char)(10 * i + k);
        lb[i] = (unsigned char)(i % 4);
    }
    write_idx(images, 0x08, 3, (uint32_t[]){10, 2, 2}, px, sizeof px);
    write_idx(labels, 0x08, 1, (uint32_t[]){10}, lb, sizeof lb);
}

Test(idx, ubyte_with_val_fraction)
{
    const char *images = tmp_path("images.idx"), *labels = tmp_path("labels.idx");
    write_mnist_like(images, labels);
    struct plugin p = load("data_idx");
    set(&p, "images", images);
    set(&p, "labels", labels);
    set(&p, "val_fraction", "0.2");
    void *self = create_ok(&p, 0);
    struct tr_data_info info = data_info(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 8);
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 2);
    cr_assert_eq(info.input_dtype, TR_F32);
    cr_assert_eq(info.input_len, 4);
    cr_assert_eq(info.classes, 4);
    float x[4];
    int32_t y;
    read_one(&p, self, TR_SPLIT_TRAIN, 3, x, &y);
    cr_assert_float_eq(x[1], 31.0f / 255.0f, 1e-7);
    cr_assert_eq(y, 3);
    read_one(&p, self, TR_SPLIT_VAL, 1, x, &y); /* image 9 */
    cr_assert_float_eq(x[0], 90.0f / 255.0f, 1e-7);
    cr_assert_eq(y, 1);
    destroy(&p, self);
}

Test(idx, float32_with_val_files)
{
    /* float32 elements are big-endian in IDX */
    float values[3 * 2] = {0.5f, -1.0f, 2.0f, 3.0f, 4.5f, 5.0f};
    unsigned char be[sizeof values];
    for (int i = 0; i < 6; i++) {
        uint32_t bits;
        memcpy(&bits, &values[i], 4);
        put_be32(be + 4 * i, bits);
    }
    write_idx(tmp_path("f.idx"), 0x0D, 2, (uint32_t[]){3, 2}, be, sizeof be);
    write_idx(tmp_path("fl.idx"), 0x08, 1, (uint32_t[]){3}, (unsigned char[]){0, 1, 2}, 3);
    write_idx(tmp_path("vf.idx"), 0x0D, 2, (uint32_t[]){1, 2}, be + 8, 8);
    write_idx(tmp_path("vl.idx"), 0x08, 1, (uint32_t[]){1}, (unsigned char[]){5}, 1);

    struct plugin p = load("data_idx");
    set(&p, "images", tmp_path("f.idx"));
    set(&p, "labels", tmp_path("fl.idx"));
    set(&p, "val_images", tmp_path("vf.idx"));
    set(&p, "val_labels", tmp_path("vl.idx"));
    void *self = create_ok(&p, 0);
    struct tr_data_info info = data_info(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 3);
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 1);
    cr_assert_eq(info.classes, 6);
    float x[2];
    int32_t y;
    read_one(&p, self, TR_SPLIT_TRAIN, 2, x, &y);
    cr_assert(x[0] == 4.5f && x[1] == 5.0f && y == 2, "scale 1 for float32 files");
    read_one(&p, self, TR_SPLIT_VAL, 0, x, &y);
    cr_assert(x[0] == 2.0f && x[1] == 3.0f && y == 5);
    destroy(&p, self);
}

Test(idx, truncated)
{
    const char *images = tmp_path("images.idx"), *labels = tmp_path("labels.idx");
    write_mnist_like(images, labels);
    cr_assert_eq(truncate(images, 16 + 30), 0);
    struct plugin p = load("data_idx");
    set(&p, "images", images);
    set(&p, "labels", labels);
    create_fails(&p, 0, "truncated: 46 bytes", "needs 56");
}

Test(idx, wrong_magic)
{
    const char *images = tmp_path("images.idx"), *labels = tmp_path("labels.idx");
    write_mnist_like(images, labels);
    write_text(images, "P5\n2 2\n255\n....");
    struct plugin p = load("data_idx");
    set(&p, "images", images);
    set(&p, "labels", labels);
    create_fails(&p, 0, images, "wrong magic");
}

Test(idx, count_mismatch)
{
    const char *images = tmp_path("images.idx"), *labels = tmp_path("labels.idx");
    write_mnist_like(images, labels);
    write_idx(labels, 0x08, 1, (uint32_t[]){9}, (unsigned char[9]){0}, 9);
    struct plugin p = load("data_idx");
    set(&p, "images", images);
    set(&p, "labels", labels);
    create_fails(&p, 0, "10 images", "9 labels");
}

/* ---- synthetic --------------------------------------------------------- */

Test(synthetic, tokens_are_deterministic_and_follow_a_map)
{
    struct plugin p = load("data_synthetic");
    set(&p, "seed", "7");
    void *a = create_ok(&p, 32);
    void *b = create_ok(&p, 32);
    struct tr_data_info info = data_info(&p, a);
    cr_assert_eq(info.input_dtype, TR_I32);
    cr_assert_eq(info.input_len, 32);
    cr_assert_eq(info.target_len, 32);
    cr_assert_eq(info.classes, 256);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 65536);
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 1024);

    int32_t next[256];
    for (int i = 0; i < 256; i++)
        next[i] = -1;
    for (uint64_t idx = 0; idx < 64; idx += 7) {
        int32_t in1[32], t1[32], in2[32], t2[32];
        read_one(&p, a, TR_SPLIT_TRAIN, idx, in1, t1);
        read_one(&p, b, TR_SPLIT_TRAIN, idx, in2, t2);
        cr_assert_arr_eq(in1, in2, sizeof in1);
        cr_assert_arr_eq(t1, t2, sizeof t1);
        for (int t = 0; t < 32; t++) {
            cr_assert(in1[t] >= 0 && in1[t] < 256);
            if (t + 1 < 32)
                cr_assert_eq(t1[t], in1[t + 1], "targets are the inputs shifted by one");
            /* the next token is a function of the current one: learnable */
            cr_assert(next[in1[t]] < 0 || next[in1[t]] == t1[t]);
            next[in1[t]] = t1[t];
        }
    }
    destroy(&p, a);
    destroy(&p, b);

    create_fails(&p, 0, "needs a sequence model", NULL);
}

Test(synthetic, features_are_deterministic)
{
    struct plugin p = load("data_synthetic");
    set(&p, "kind", "features");
    set(&p, "classes", "10");
    set(&p, "features", "16");
    void *a = create_ok(&p, 0);
    void *b = create_ok(&p, 0);
    struct tr_data_info info = data_info(&p, a);
    cr_assert_eq(info.input_dtype, TR_F32);
    cr_assert_eq(info.input_len, 16);
    cr_assert_eq(info.target_len, 1);
    cr_assert_eq(info.classes, 10);

    int seen[10] = {0};
    for (uint64_t idx = 0; idx < 200; idx++) {
        float x1[16], x2[16];
        int32_t y1, y2;
        read_one(&p, a, TR_SPLIT_VAL, idx, x1, &y1);
        read_one(&p, b, TR_SPLIT_VAL, idx, x2, &y2);
        cr_assert_arr_eq(x1, x2, sizeof x1);
        cr_assert_eq(y1, y2);
        cr_assert(y1 >= 0 && y1 < 10);
        seen[y1] = 1;
        for (int f = 0; f < 16; f++)
            cr_assert(x1[f] >= -1.0f && x1[f] < 1.0f);
    }
    int classes_seen = 0;
    for (int k = 0; k < 10; k++)
        classes_seen += seen[k];
    cr_assert_geq(classes_seen, 5, "labels are spread over the classes");

    /* train and val differ; another seed gives other data */
    float xt[16], xv[16];
    int32_t y;
    read_one(&p, a, TR_SPLIT_TRAIN, 0, xt, &y);
    read_one(&p, a, TR_SPLIT_VAL, 0, xv, &y);
    cr_assert(memcmp(xt, xv, sizeof xt) != 0);
    set(&p, "seed", "1");
    void *c = create_ok(&p, 0);
    read_one(&p, c, TR_SPLIT_TRAIN, 0, xv, &y);
    cr_assert(memcmp(xt, xv, sizeof xt) != 0);
    destroy(&p, a);
    destroy(&p, b);
    destroy(&p, c);
}

/* ---- checkpoint -------------------------------------------------------- */

struct names {
    char list[16][64];
    int n;
};

static void collect_name(void *ud, const char *name)
{
    struct names *names = ud;
    if (names->n < 16)
        snprintf(names->list[names->n++], 64, "%s", name);
}

static struct names list_of(struct plugin *p, void *self)
{
    const struct tr_checkpoint_vtable *vt = p->info->vtable;
    struct names names = {.n = 0};
    tr_err err = {{0}};
    cr_assert_eq(vt->list(self, collect_name, &names, &err), TR_OK, "%s", err.msg);
    return names;
}

static void save(struct plugin *p, void *self, const char *name, const char *payload)
{
    const struct tr_checkpoint_vtable *vt = p->info->vtable;
    tr_err err = {{0}};
    cr_assert_eq(vt->begin(self, name, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put(self, "model", payload, strlen(payload), &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put(self, "empty", "", 0, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->commit(self, &err), TR_OK, "%s", err.msg);
}

static void assert_file(const char *path, const char *content)
{
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s missing", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cr_assert_str_eq(buf, content, "%s", path);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int dir_entries(const char *path)
{
    DIR *d = opendir(path);
    cr_assert(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

Test(checkpoint, save_list_get_remove)
{
    struct plugin p = load("checkpoint_local");
    set(&p, "fsync", "false"); /* fast; the code path is the same but for fsync */
    void *self = create_ok(&p, 0);
    const struct tr_checkpoint_vtable *vt = p.info->vtable;
    tr_err err = {{0}};

    save(&p, self, "step-0000000100", "hundred");
    save(&p, self, "step-0000000200", "two hundred");
    assert_file(tmp_path("checkpoints/LATEST"), "step-0000000200\n");
    assert_file(tmp_path("checkpoints/step-0000000100/model"), "hundred");

    struct names names = list_of(&p, self);
    cr_assert_eq(names.n, 2);
    cr_assert_str_eq(names.list[0], "step-0000000200");
    cr_assert_str_eq(names.list[1], "step-0000000100");

    void *data;
    size_t size;
    cr_assert_eq(vt->get(self, "step-0000000200", "model", &data, &size, &err), TR_OK, "%s",
                 err.msg);
    cr_assert_eq(size, 11);
    cr_assert(memcmp(data, "two hundred", 11) == 0);
    host.free(data);
    cr_assert_eq(vt->get(self, "step-0000000200", "empty", &data, &size, &err), TR_OK);
    cr_assert_eq(size, 0);
    host.free(data);
    cr_assert_eq(vt->get(self, "step-0000000200", "optimizer", &data, &size, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "has no blob optimizer"), "%s", err.msg);

    /* saving an existing name replaces it */
    save(&p, self, "step-0000000100", "again");
    assert_file(tmp_path("checkpoints/step-0000000100/model"), "again");
    assert_file(tmp_path("checkpoints/LATEST"), "step-0000000100\n");

    cr_assert_eq(vt->remove(self, "step-0000000100", &err), TR_OK, "%s", err.msg);
    cr_assert(!exists(tmp_path("checkpoints/step-0000000100")));
    assert_file(tmp_path("checkpoints/LATEST"), "step-0000000200\n");
    names = list_of(&p, self);
    cr_assert_eq(names.n, 1);
    cr_assert_eq(dir_entries(tmp_path("checkpoints")), 2, "only step-200 and LATEST remain");
    destroy(&p, self);
}

/* A checkpoint being removed leaves the listing before its files go: one
 * whose removal stops half-way (here a directory inside, which trainrun
 * never writes: ENOTEMPTY; a kill -9 in the middle is the case that
 * matters) is no longer listed as a checkpoint missing its files, and the
 * leftover is a staging directory the next run cleans up. */
Test(checkpoint, a_removal_cut_short_leaves_no_half_checkpoint)
{
    struct plugin p = load("checkpoint_local");
    set(&p, "fsync", "false");
    void *self = create_ok(&p, 0);
    const struct tr_checkpoint_vtable *vt = p.info->vtable;
    tr_err err = {{0}};
    save(&p, self, "step-0000000100", "hundred");
    save(&p, self, "step-0000000200", "two hundred");
    cr_assert_eq(mkdir(tmp_path("checkpoints/step-0000000100/user"), 0755), 0);
    cr_assert_eq(vt->remove(self, "step-0000000100", &err), TR_ERROR);
    cr_assert(!exists(tmp_path("checkpoints/step-0000000100")),
              "a half-removed checkpoint stays under its name");
    struct names names = list_of(&p, self);
    cr_assert_eq(names.n, 1);
    cr_assert_str_eq(names.list[0], "step-0000000200");
    destroy(&p, self);
}

Test(checkpoint, fsync_and_relative_dir)
{
    struct plugin p = load("checkpoint_local");
    set(&p, "dir", "ckpt/nested");
    void *self = create_ok(&p, 0); /* fsync on */
    save(&p, self, "final", "x");
    assert_file(tmp_path("ckpt/nested/final/model"), "x");
    assert_file(tmp_path("ckpt/nested/LATEST"), "final\n");
    destroy(&p, self);
}

Test(checkpoint, abort_leaves_nothing)
{
    struct plugin p = load("checkpoint_local");
    set(&p, "fsync", "false");
    void *self = create_ok(&p, 0);
    const struct tr_checkpoint_vtable *vt = p.info->vtable;
    tr_err err = {{0}};
    cr_assert_eq(vt->begin(self, "step-0000000001", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put(self, "model", "abc", 3, &err), TR_OK, "%s", err.msg);
    vt->abort(self);
    cr_assert_eq(dir_entries(tmp_path("checkpoints")), 0);
    cr_assert_eq(list_of(&p, self).n, 0);
    /* and the instance is usable again */
    save(&p, self, "step-0000000002", "ok");
    cr_assert_eq(list_of(&p, self).n, 1);
    destroy(&p, self);
}

/* put_stream's bytes: byte i of a blob of `size`, handed out in order by
 * pattern_fill, which fails instead of giving byte `fail_at` or beyond. */
struct pattern {
    size_t size, pos, fail_at;
    size_t calls, largest; /* fill calls, and the most bytes one asked for */
};

static unsigned char pattern_byte(size_t i) { return (unsigned char)(i * 131u + (i >> 11)); }

static int pattern_fill(void *ud, void *buf, size_t cap, size_t *got, tr_err *err)
{
    struct pattern *s = ud;
    size_t n = s->size - s->pos < cap ? s->size - s->pos : cap;
    cr_assert(cap > 0 && n > 0, "fill asked for %zu bytes at %zu of %zu", cap, s->pos, s->size);
    s->calls++;
    s->largest = cap > s->largest ? cap : s->largest;
    if (s->pos + n > s->fail_at)
        return tr_fail(err, "the test's fill fails at byte %zu", s->fail_at);
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)buf)[i] = pattern_byte(s->pos + i);
    s->pos += n;
    *got = n;
    return TR_OK;
}

static void *read_whole(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s missing", path);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(*size ? *size : 1);
    cr_assert_eq(fread(buf, 1, *size, f), *size);
    fclose(f);
    return buf;
}

/* The staging directory of checkpoint `name` being saved by this process */
static const char *staging_path(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "checkpoints/.trainrun-tmp-%s-%ld", name, (long)getpid());
    return tmp_path(rel);
}

/* put_stream writes the file put writes, pulling it in bounded pieces */
Test(checkpoint, put_stream_writes_what_put_writes)
{
    struct plugin p = load("checkpoint_local");
    void *self = create_ok(&p, 0); /* fsync on */
    const struct tr_checkpoint_vtable *vt = p.info->vtable;
    cr_assert(TR_HAS_SLOT(vt, struct tr_checkpoint_vtable, put_stream));
    tr_err err = {{0}};
    size_t size = (9u << 20) + 3; /* pieces of 4 MiB, and an odd last one */
    unsigned char *whole = malloc(size);
    for (size_t i = 0; i < size; i++)
        whole[i] = pattern_byte(i);
    struct pattern s = {.size = size, .fail_at = SIZE_MAX}, none = {.fail_at = SIZE_MAX};
    cr_assert_eq(vt->begin(self, "step-0000000001", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put_stream(self, "streamed", size, pattern_fill, &s, &err), TR_OK, "%s",
                 err.msg);
    cr_assert_eq(s.pos, size);
    cr_assert(s.calls >= 3 && s.largest <= (4u << 20), "%zu calls, the largest %zu bytes",
              s.calls, s.largest);
    cr_assert_eq(vt->put(self, "whole", whole, size, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put_stream(self, "empty", 0, pattern_fill, &none, &err), TR_OK, "%s",
                 err.msg);
    cr_assert_eq(none.calls, 0);
    /* put's errors, file named */
    struct pattern again = {.size = 1, .fail_at = SIZE_MAX};
    cr_assert_eq(vt->put_stream(self, "whole", 1, pattern_fill, &again, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "/whole") && strstr(err.msg, "blob written twice"), "%s", err.msg);
    cr_assert_eq(vt->put_stream(self, "a/b", 1, pattern_fill, &again, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "invalid blob name"), "%s", err.msg);
    cr_assert_eq(vt->commit(self, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put_stream(self, "late", 1, pattern_fill, &again, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "put_stream(\"late\") without begin()"), "%s", err.msg);

    size_t a_size, b_size;
    void *a = read_whole(tmp_path("checkpoints/step-0000000001/streamed"), &a_size);
    void *b = read_whole(tmp_path("checkpoints/step-0000000001/whole"), &b_size);
    cr_assert_eq(a_size, size);
    cr_assert_eq(b_size, size);
    cr_assert(memcmp(a, b, size) == 0, "the streamed blob differs from the one put wrote");
    void *data;
    cr_assert_eq(vt->get(self, "step-0000000001", "empty", &data, &a_size, &err), TR_OK, "%s",
                 err.msg);
    cr_assert_eq(a_size, 0);
    host.free(data);
    free(a);
    free(b);
    free(whole);
    destroy(&p, self);
}

/* A fill or a write that fails midway leaves no file behind, and the
 * checkpoint, aborted, is never published. */
Test(checkpoint, failed_put_stream_leaves_nothing)
{
    struct plugin p = load("checkpoint_local");
    set(&p, "fsync", "false");
    void *self = create_ok(&p, 0);
    const struct tr_checkpoint_vtable *vt = p.info->vtable;
    tr_err err = {{0}};

    struct pattern s = {.size = 9u << 20, .fail_at = 5u << 20};
    cr_assert_eq(vt->begin(self, "step-0000000001", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put_stream(self, "model", s.size, pattern_fill, &s, &err), TR_ERROR);
    cr_assert_str_eq(err.msg, "the test's fill fails at byte 5242880", "fill's message as it is");
    cr_assert(exists(staging_path("step-0000000001")));
    char model[512];
    snprintf(model, sizeof model, "%s/model", staging_path("step-0000000001"));
    cr_assert(!exists(model), "the partial blob was left behind");
    vt->abort(self);
    cr_assert_eq(dir_entries(tmp_path("checkpoints")), 0);

    /* a disk that takes 1 MiB of a file (EFBIG, as ENOSPC would) */
    struct rlimit small = {1u << 20, 1u << 20};
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    struct pattern big = {.size = 3u << 20, .fail_at = SIZE_MAX};
    cr_assert_eq(vt->begin(self, "step-0000000002", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put_stream(self, "model", big.size, pattern_fill, &big, &err), TR_ERROR);
    snprintf(model, sizeof model, "%s/model", staging_path("step-0000000002"));
    cr_assert(strstr(err.msg, "cannot write ") && strstr(err.msg, model) &&
              strstr(err.msg, "the previous checkpoint is untouched"), "%s", err.msg);
    cr_assert(!exists(model), "the partial blob was left behind");
    vt->abort(self);
    cr_assert_eq(dir_entries(tmp_path("checkpoints")), 0);
    cr_assert_eq(list_of(&p, self).n, 0);
    destroy(&p, self);
}

/* A directory as the local plugin makes it: with its owner marker. */
static void mkdir_marked(const char *rel)
{
    cr_assert_eq(mkdir(tmp_path(rel), 0755), 0, "%s", rel);
    char mark[512];
    snprintf(mark, sizeof mark, "%s/.trainrun-checkpoint", rel);
    write_text(tmp_path(mark), "trainrun\n");
}

Test(checkpoint, stale_staging_is_cleaned)
{
    cr_assert_eq(mkdir(tmp_path("checkpoints"), 0755), 0);
    mkdir_marked("checkpoints/.trainrun-tmp-step-0000000300-99999");
    write_text(tmp_path("checkpoints/.trainrun-tmp-step-0000000300-99999/model"), "partial");
    mkdir_marked("checkpoints/step-0000000200");
    write_text(tmp_path("checkpoints/LATEST"), "step-0000000200\n");
    /* look-alikes the user made: no marker, so never trainrun's to remove */
    cr_assert_eq(mkdir(tmp_path("checkpoints/.trainrun-tmp-step-0000000400-1"), 0755), 0);
    write_text(tmp_path("checkpoints/.trainrun-tmp-step-0000000400-1/notes"), "mine");
    cr_assert_eq(mkdir(tmp_path("checkpoints/.tmp-step-0000000300-99999"), 0755), 0);
    write_text(tmp_path("checkpoints/.trainrun-tmp-LATEST-x"), "mine");

    struct plugin p = load("checkpoint_local");
    void *self = create_ok(&p, 0);
    cr_assert(!exists(tmp_path("checkpoints/.trainrun-tmp-step-0000000300-99999")));
    cr_assert(exists(tmp_path("checkpoints/step-0000000200")));
    cr_assert_geq(warnings, 1);
    cr_assert(strstr(last_warning, ".trainrun-tmp-step-0000000300-99999"), "%s", last_warning);
    assert_file(tmp_path("checkpoints/.trainrun-tmp-step-0000000400-1/notes"), "mine");
    cr_assert(exists(tmp_path("checkpoints/.tmp-step-0000000300-99999")));
    assert_file(tmp_path("checkpoints/.trainrun-tmp-LATEST-x"), "mine");
    destroy(&p, self);
}

/* checkpoint.dir shared with the user's files: unmarked directories are not
 * listed as (new) checkpoints nor removed, symlinks are not followed, and a
 * LATEST that is not trainrun's is not replaced. */
Test(checkpoint, other_files_are_never_removed)
{
    cr_assert_eq(mkdir(tmp_path("outside"), 0755), 0);
    write_text(tmp_path("outside/precious"), "mine");
    cr_assert_eq(mkdir(tmp_path("checkpoints"), 0755), 0);
    cr_assert_eq(mkdir(tmp_path("checkpoints/step-0000000001"), 0755), 0);
    write_text(tmp_path("checkpoints/step-0000000001/model"), "mine");
    cr_assert_eq(symlink(tmp_path("outside"), tmp_path("checkpoints/step-0000000002")), 0);

    struct plugin p = load("checkpoint_local");
    set(&p, "fsync", "false");
    void *self = create_ok(&p, 0);
    const struct tr_checkpoint_vtable *vt = p.info->vtable;
    tr_err err = {{0}};
    cr_assert_eq(list_of(&p, self).n, 0);
    cr_assert_eq(vt->remove(self, "step-0000000001", &err), TR_ERROR);
    cr_assert(strstr(err.msg, "not removing"), "%s", err.msg);
    cr_assert_eq(vt->remove(self, "step-0000000002", &err), TR_ERROR);
    assert_file(tmp_path("checkpoints/step-0000000001/model"), "mine");
    assert_file(tmp_path("outside/precious"), "mine");
    /* publishing over a name the user took fails and keeps both */
    cr_assert_eq(vt->begin(self, "step-0000000001", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put(self, "model", "new", 3, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->commit(self, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "not made by trainrun"), "%s", err.msg);
    vt->abort(self);
    assert_file(tmp_path("checkpoints/step-0000000001/model"), "mine");
    /* a marker is not a blob name */
    cr_assert_eq(vt->begin(self, "step-0000000003", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put(self, ".trainrun-checkpoint", "x", 1, &err), TR_ERROR);
    vt->abort(self);
    /* a LATEST of the user's is neither replaced nor removed */
    write_text(tmp_path("checkpoints/LATEST"), "my notes\nmore notes\n");
    cr_assert_eq(vt->begin(self, "step-0000000004", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put(self, "model", "x", 1, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->commit(self, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "is not a LATEST file trainrun wrote"), "%s", err.msg);
    assert_file(tmp_path("checkpoints/LATEST"), "my notes\nmore notes\n");
    destroy(&p, self);
}

/* A crash after publishing step 300 but before LATEST was rewritten. */
Test(checkpoint, stale_latest_is_repaired)
{
    cr_assert_eq(mkdir(tmp_path("checkpoints"), 0755), 0);
    mkdir_marked("checkpoints/step-0000000200");
    mkdir_marked("checkpoints/step-0000000300");
    write_text(tmp_path("checkpoints/LATEST"), "step-0000000200\n");
    struct plugin p = load("checkpoint_local");
    void *self = create_ok(&p, 0);
    assert_file(tmp_path("checkpoints/LATEST"), "step-0000000300\n");
    cr_assert(strstr(last_warning, "it now names the newest checkpoint, step-0000000300"), "%s",
              last_warning);
    destroy(&p, self);
}

Test(checkpoint, invalid_names_are_refused)
{
    struct plugin p = load("checkpoint_local");
    set(&p, "fsync", "false");
    void *self = create_ok(&p, 0);
    const struct tr_checkpoint_vtable *vt = p.info->vtable;
    tr_err err = {{0}};
    cr_assert_eq(vt->begin(self, "../escape", &err), TR_ERROR);
    cr_assert_eq(vt->begin(self, ".hidden", &err), TR_ERROR);
    cr_assert_eq(vt->begin(self, "", &err), TR_ERROR);
    /* the name rule is the one the s3 backend shares (files.h) */
    cr_assert_eq(vt->begin(self, "step\n1", &err), TR_ERROR);
    cr_assert_eq(vt->begin(self, "ok", &err), TR_OK, "%s", err.msg);
    const char *bad[] = {"", "a/b", "..", ".", "../model", "/etc/passwd", "line\nbreak", "tab\t"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        cr_assert_eq(vt->put(self, bad[i], "x", 1, &err), TR_ERROR, "blob \"%s\"", bad[i]);
        cr_assert(strstr(err.msg, "invalid blob name"), "%s", err.msg);
    }
    cr_assert_eq(vt->put(self, "model.bin", "x", 1, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt->put(self, "model.bin", "x", 1, &err), TR_ERROR, "a blob written twice");
    vt->abort(self);
    destroy(&p, self);
}
