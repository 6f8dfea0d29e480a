/*
 * The logger plugins (plugins/logger), driven as the core drives them:
 * tensorboard's event files read back with tests/tfevents.h, a reader of
 * its own (bitwise CRC32C, any field order), which must also refuse a
 * damaged file, and which must read the committed fixture exactly as
 * TensorBoard did (tests/fixtures/tensorboard/make_fixture.py); csv's
 * header, rows, resume and refusals.
 *
 * Covers: plugins/logger/tensorboard.c and csv.c.
 */
#include "scratch.h"

#include <trainrun/plugin.h>

#include <stdarg.h>
#include <unistd.h>

static char logged[4096]; /* what the plugins logged, for checks */

static void test_log(enum tr_log_level level, const char *who, const char *fmt, ...)
{
    (void)level;
    size_t len = strlen(logged);
    snprintf(logged + len, sizeof logged - len, "[%s] ", who ? who : "");
    len = strlen(logged);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(logged + len, sizeof logged - len, fmt, ap);
    va_end(ap);
    len = strlen(logged);
    snprintf(logged + len, sizeof logged - len, "\n");
}

#include "plugin_harness.h"
#include "tfevents.h"

#include <dirent.h>
#include <math.h>

static void setup(void)
{
    tmp_create("trainrun-logger");
    logged[0] = 0;
}

TestSuite(logger, .init = setup, .fini = remove_tmp);

static const struct tr_logger_vtable *vt(const struct plugin *p)
{
    cr_assert_eq(p->info->kind, TR_KIND_LOGGER);
    return p->info->vtable;
}

/* the one file in dir whose name starts with prefix (tmp/dir/...) */
static const char *only_file(const char *dir, const char *prefix)
{
    static char path[1024];
    DIR *d = opendir(dir);
    cr_assert(d, "no directory %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            n++;
        }
    closedir(d);
    cr_assert_eq(n, 1, "%d files %s* in %s", n, prefix, dir);
    return path;
}

static const struct tr_scalar train_row[] = {{"loss", 4.25}, {"lr", 3e-4}, {"grad_norm", 1.5}};
static const struct tr_scalar val_row[] = {{"val_loss", 3.875}, {"val_loss_per_byte", 1.0625}};

/* a tensorboard file of two steps, one with validation; its path */
static const char *write_tb(void)
{
    struct plugin p = load("logger_tensorboard");
    void *self = create_ok(&p, 0);
    tr_err err = {{0}};
    cr_assert_eq(vt(&p)->open(self, 0, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt(&p)->scalars(self, 1, train_row, 3, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt(&p)->scalars(self, 2, train_row, 3, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt(&p)->scalars(self, 2, val_row, 2, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt(&p)->close(self, &err), TR_OK, "%s", err.msg);
    destroy(&p, self);
    return only_file(tmp_path("tb"), "events.out.tfevents.");
}

Test(logger, tensorboard_events_read_back)
{
    const char *path = write_tb();
    struct tfe_file f;
    char msg[512];
    cr_assert_eq(tfevents_read(path, &f, msg, sizeof msg), 0, "%s", msg);
    cr_expect(f.version_ok, "the first Event must be file_version brain.Event:2");
    cr_assert_eq(f.events, 4, "file_version + 3 scalar events, got %zu", f.events);
    cr_assert_eq(f.n, 8);
    const char *tags[] = {"loss", "lr", "grad_norm", "loss", "lr", "grad_norm", "val_loss",
                          "val_loss_per_byte"};
    const double want[] = {4.25, 3e-4, 1.5, 4.25, 3e-4, 1.5, 3.875, 1.0625};
    const int64_t steps[] = {1, 1, 1, 2, 2, 2, 2, 2};
    for (int i = 0; i < 8; i++) {
        cr_expect_str_eq(f.v[i].tag, tags[i]);
        cr_expect_eq(f.v[i].step, steps[i]);
        cr_expect_eq(f.v[i].value, (float)want[i], "%s: %g", tags[i], (double)f.v[i].value);
        cr_expect(f.v[i].wall_time > 1.5e9, "wall_time %f is not a Unix time", f.v[i].wall_time);
    }
    free(f.v);
}

/* flip one bit at `at` bytes from the start (negative: from the end) */
static void flip(const char *path, long at)
{
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp);
    fseek(fp, at, at < 0 ? SEEK_END : SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, -1, SEEK_CUR);
    fputc(c ^ 0x10, fp);
    fclose(fp);
}

Test(logger, tensorboard_damage_is_detected)
{
    const char *path = write_tb();
    struct tfe_file f;
    char msg[512];
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", path);
    flip(copy, 20); /* inside the first record's data */
    cr_assert_eq(tfevents_read(copy, &f, msg, sizeof msg), -1, "a flipped data byte was read");
    cr_expect(strstr(msg, "data CRC"), "%s", msg);
    flip(copy, 20); /* undo: reads again */
    cr_assert_eq(tfevents_read(copy, &f, msg, sizeof msg), 0, "%s", msg);
    free(f.v);
    flip(copy, 3); /* the first length */
    cr_assert_eq(tfevents_read(copy, &f, msg, sizeof msg), -1, "a flipped length was read");
    cr_expect(strstr(msg, "length CRC"), "%s", msg);
    flip(copy, 3);
    flip(copy, -1); /* the last record's data CRC */
    cr_assert_eq(tfevents_read(copy, &f, msg, sizeof msg), -1, "a flipped CRC was read");
    /* cut short */
    flip(copy, -1);
    cr_assert_eq(truncate(copy, 30), 0);
    cr_assert_eq(tfevents_read(copy, &f, msg, sizeof msg), -1, "a cut file was read");
    cr_expect(strstr(msg, "cut short"), "%s", msg);
}

/* The committed event file of a trainrun run, as TensorBoard 2.18.0 read it. */
Test(logger, tensorboard_fixture_as_tensorboard_reads_it)
{
    const char *src = getenv("TR_SRCDIR");
    cr_assert(src, "set TR_SRCDIR");
    char path[1024], tsv[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/tensorboard/events.out.tfevents.fixture", src);
    snprintf(tsv, sizeof tsv, "%s/tests/fixtures/tensorboard/scalars.tsv", src);
    struct tfe_file f;
    char msg[512];
    cr_assert_eq(tfevents_read(path, &f, msg, sizeof msg), 0, "%s", msg);
    cr_expect(f.version_ok);
    FILE *in = fopen(tsv, "r");
    cr_assert(in, "cannot open %s", tsv);
    char line[512];
    size_t rows = 0;
    char *seen = calloc(f.n + 1, 1);
    while (fgets(line, sizeof line, in)) {
        if (line[0] == '#')
            continue;
        char tag[64];
        long long step;
        double value, wall;
        cr_assert_eq(sscanf(line, "%63s %lld %lf %lf", tag, &step, &value, &wall), 4, "%s", line);
        size_t i = 0;
        while (i < f.n && !(strcmp(f.v[i].tag, tag) == 0 && f.v[i].step == step && !seen[i]))
            i++;
        cr_assert(i < f.n, "TensorBoard read %s at step %lld; this reader did not", tag, step);
        seen[i] = 1;
        cr_expect_eq(f.v[i].value, (float)value, "%s step %lld: %.9g, TensorBoard %.9g", tag,
                     step, (double)f.v[i].value, value);
        cr_expect(fabs(f.v[i].wall_time - wall) < 1e-5, "%s wall_time %f, TensorBoard %f", tag,
                  f.v[i].wall_time, wall);
        rows++;
    }
    fclose(in);
    cr_expect_eq(rows, f.n, "TensorBoard read %zu scalars, this reader %zu", rows, f.n);
    cr_expect_geq(rows, 30);
    free(seen);
    free(f.v);
}

Test(logger, tensorboard_refuses_dir_outside_run)
{
    struct plugin p = load("logger_tensorboard");
    set(&p, "dir", "../elsewhere");
    create_fails(&p, 0, "inside the run directory", NULL);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void csv_run(struct plugin *p, int resume, uint64_t first)
{
    void *self = create_ok(p, 0);
    tr_err err = {{0}};
    cr_assert_eq(vt(p)->open(self, resume, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt(p)->scalars(self, first, train_row, 3, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt(p)->scalars(self, first, val_row, 2, &err), TR_OK, "%s", err.msg);
    cr_assert_eq(vt(p)->close(self, &err), TR_OK, "%s", err.msg);
    destroy(p, self);
}

Test(logger, csv_header_rows_and_resume)
{
    struct plugin p = load("logger_csv");
    set(&p, "columns", "loss,lr,val_loss");
    csv_run(&p, 0, 10);
    cr_expect_str_eq(slurp(tmp_path("metrics.csv")),
                     "step,loss,lr,val_loss\n10,4.25,0.0003,\n10,,,3.875\n");
    /* the names outside the columns: warned once each, not written */
    cr_expect(strstr(logged, "\"grad_norm\""), "%s", logged);
    cr_expect(strstr(logged, "\"val_loss_per_byte\""), "%s", logged);
    /* a resume appends below, without a second header; a torn row is cut */
    write_text(tmp_path("metrics.csv"), "step,loss,lr,val_loss\n10,4.25,0.0003,\n10,,,3.875\n"
                                         "11,4.1");
    logged[0] = 0;
    csv_run(&p, 1, 12);
    cr_expect_str_eq(slurp(tmp_path("metrics.csv")),
                     "step,loss,lr,val_loss\n10,4.25,0.0003,\n10,,,3.875\n"
                     "12,4.25,0.0003,\n12,,,3.875\n");
    cr_expect(strstr(logged, "torn row"), "%s", logged);
    /* a fresh run starts the file again */
    csv_run(&p, 0, 1);
    cr_expect_str_eq(slurp(tmp_path("metrics.csv")),
                     "step,loss,lr,val_loss\n1,4.25,0.0003,\n1,,,3.875\n");
}

Test(logger, csv_resume_with_other_columns_is_refused)
{
    struct plugin p = load("logger_csv");
    set(&p, "columns", "loss,lr");
    csv_run(&p, 0, 1);
    struct plugin q = load("logger_csv");
    set(&q, "columns", "loss");
    void *self = create_ok(&q, 0);
    tr_err err = {{0}};
    cr_assert_eq(vt(&q)->open(self, 1, &err), TR_ERROR);
    cr_expect(strstr(err.msg, "metrics.csv") && strstr(err.msg, "other columns"), "%s", err.msg);
    destroy(&q, self);
    cr_expect_str_eq(slurp(tmp_path("metrics.csv")), "step,loss,lr\n1,4.25,0.0003\n1,,\n",
                     "the earlier rows must be kept");
}

Test(logger, csv_bad_columns)
{
    struct plugin p = load("logger_csv");
    set(&p, "columns", "loss,,lr");
    create_fails(&p, 0, "empty name", NULL);
    set(&p, "columns", "loss,l\"r");
    create_fails(&p, 0, "in a column name", NULL);
    set(&p, "columns", "loss,");
    create_fails(&p, 0, "ends in a comma", NULL);
}

Test(logger, csv_write_error_is_reported)
{
    /* /dev/full: every write fails with ENOSPC */
    struct plugin p = load("logger_csv");
    set(&p, "file", "/dev/full");
    void *self = create_ok(&p, 0);
    tr_err err = {{0}};
    int rc = vt(&p)->open(self, 0, &err);
    if (rc == TR_OK)
        rc = vt(&p)->scalars(self, 1, train_row, 3, &err);
    cr_expect_eq(rc, TR_ERROR, "a write to a full disk must fail");
    cr_expect(strstr(err.msg, "/dev/full") && strstr(err.msg, "space"), "%s", err.msg);
    destroy(&p, self);
}
