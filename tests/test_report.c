/* `trainrun report`: the PNG files decode (signature, chunk CRCs, IHDR, the
 * zlib stream) and show the curves in their colours; errors name the file
 * and line.
 *
 * Covers: core/commands/report.c and core/plot/ (plot.c, font.h).
 */
#include <criterion/criterion.h>

#include "commands/report.h"
#include "remove_tree.h"

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define WIDTH 800
#define HEIGHT 500

struct color {
    uint8_t r, g, b;
};
static const struct color WHITE = {255, 255, 255};
static const struct color TRAIN_BLUE = {31, 119, 180};
static const struct color VAL_ORANGE = {255, 127, 14};
static const struct color TOKENS_GREEN = {44, 160, 44};
static const struct color WAIT_RED = {214, 39, 40};
static const struct color COST_PURPLE = {148, 103, 189};

/* ---- helpers ------------------------------------------------------------- */

static char *temp_dir(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char *dir;
    cr_assert(asprintf(&dir, "%s/trainrun-report-XXXXXX", base) > 0);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp in %s", base);
    return dir;
}

/* Tests that pass leave nothing behind; a failing one keeps its files. */
static void remove_tree(char *dir)
{
    tr_test_remove_tree(dir);
    free(dir);
}

static char *path_in(const char *dir, const char *name)
{
    char *p;
    cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
    return p;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static char *read_all(FILE *f, size_t *len)
{
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = 0;
    if (len)
        *len = got;
    return buf;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot read %s", path);
    char *buf = read_all(f, len);
    fclose(f);
    return buf;
}

static int exists(const char *dir, const char *name)
{
    char *p = path_in(dir, name);
    struct stat st;
    int ok = stat(p, &st) == 0;
    free(p);
    return ok;
}

/* Run the command with stdout and stderr caught in files. */
struct outcome {
    int code;
    char *out, *err;
};

static struct outcome report(int argc, const char **argv)
{
    fflush(stdout);
    fflush(stderr);
    FILE *out = tmpfile(), *err = tmpfile();
    int saved_out = dup(1), saved_err = dup(2);
    dup2(fileno(out), 1);
    dup2(fileno(err), 2);
    struct outcome o;
    o.code = tr_report_main(argc, (char **)argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    o.out = read_all(out, NULL);
    o.err = read_all(err, NULL);
    fclose(out);
    fclose(err);
    return o;
}

static void outcome_free(struct outcome *o)
{
    free(o->out);
    free(o->err);
}

/* A run of 400 steps: loss falls, cosine lr, evaluations every 50 steps. */
static char *synthetic_run(int with_cost)
{
    char *dir = temp_dir(), *metrics = path_in(dir, "metrics.jsonl");
    FILE *f = fopen(metrics, "w");
    cr_assert_not_null(f);
    for (int step = 10; step <= 400; step += 10) {
        double loss = 1.0 + 3.0 / (1 + step / 40.0) + 0.05 * ((step / 10) % 3);
        double lr = 1e-3 * 0.5 * (1 + cos(3.14159265 * step / 400));
        fprintf(f, "{\"step\": %d, \"loss\": %g, \"lr\": %g, \"grad_norm\": 1.1, \"tokens_per_s\": %g, "
                   "\"data_wait_pct\": %g, \"loss_scale\": 1, \"skipped_steps\": 0, \"elapsed_s\": %g",
                step, loss, lr, 11000.0 + 40 * (step % 70), 1.5 + (step % 30) / 10.0, step * 0.5);
        if (with_cost)
            fprintf(f, ", \"cost_usd\": %g, \"mfu\": 0.4", step * 0.01);
        fprintf(f, ", \"later_key\": {\"nested\": [1, 2]}}\n");
        if (step % 50 == 0)
            fprintf(f, "{\"step\": %d, \"val_loss\": %g, \"val_accuracy\": 0.5, \"val_loss_per_byte\": %g}\n",
                    step, loss + 0.2, (loss + 0.2) / 4);
    }
    fclose(f);
    free(metrics);
    return dir;
}

/* ---- a small PNG reader: enough to check what the report writes ------------ */

struct image {
    uint32_t width, height;
    uint8_t *rgb;
};

static void image_free(struct image *img) { free(img->rgb); }

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static struct image read_png(const char *dir, const char *name)
{
    char *path = path_in(dir, name);
    size_t len;
    uint8_t *png = (uint8_t *)slurp(path, &len);
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    cr_assert(len > 8 && memcmp(png, signature, 8) == 0, "%s starts with the PNG signature", name);

    struct image img = {0, 0, NULL};
    uint8_t *idat = NULL;
    size_t idat_len = 0, pos = 8;
    int seen_end = 0, first = 1;
    while (pos + 12 <= len && !seen_end) {
        uint32_t n = be32(png + pos);
        cr_assert(pos + 12 + n <= len, "%s: chunk runs past the end", name);
        const uint8_t *type = png + pos + 4, *data = png + pos + 8;
        uint32_t crc = (uint32_t)crc32(crc32(0L, type, 4), data, n);
        cr_assert_eq(crc, be32(data + n), "%s: CRC of chunk %.4s", name, type);
        if (first) {
            cr_assert(memcmp(type, "IHDR", 4) == 0 && n == 13, "%s: IHDR comes first", name);
            img.width = be32(data);
            img.height = be32(data + 4);
            cr_assert(data[8] == 8 && data[9] == 2 && data[10] == 0 && data[11] == 0 && data[12] == 0,
                      "%s: 8-bit RGB, deflate, no interlace", name);
            first = 0;
        } else if (memcmp(type, "IDAT", 4) == 0) {
            idat = realloc(idat, idat_len + n);
            memcpy(idat + idat_len, data, n);
            idat_len += n;
        } else if (memcmp(type, "IEND", 4) == 0) {
            seen_end = 1;
        }
        pos += 12 + n;
    }
    cr_assert(seen_end, "%s ends with IEND", name);
    cr_assert_eq(img.width, WIDTH, "%s width", name);
    cr_assert_eq(img.height, HEIGHT, "%s height", name);

    size_t stride = (size_t)img.width * 3;
    uLongf raw_len = (uLongf)((stride + 1) * img.height);
    uint8_t *raw = malloc(raw_len);
    cr_assert_eq(uncompress(raw, &raw_len, idat, (uLong)idat_len), Z_OK, "%s: IDAT inflates", name);
    cr_assert_eq(raw_len, (stride + 1) * img.height, "%s: one filter byte and a row per line", name);
    img.rgb = malloc(stride * img.height);
    for (uint32_t y = 0; y < img.height; y++) {
        cr_assert_eq(raw[y * (stride + 1)], 0, "%s: line %u uses filter type 0", name, y);
        memcpy(img.rgb + y * stride, raw + y * (stride + 1) + 1, stride);
    }
    free(raw);
    free(idat);
    free(png);
    free(path);
    return img;
}

static int pixel_is(const struct image *img, uint32_t x, uint32_t y, struct color c)
{
    const uint8_t *p = img->rgb + 3 * ((size_t)y * img->width + x);
    return p[0] == c.r && p[1] == c.g && p[2] == c.b;
}

/* Pixels of exactly colour c inside the middle of the image (the plot area). */
static size_t count_in_plot(const struct image *img, struct color c)
{
    size_t n = 0;
    for (uint32_t y = img->height / 10; y < img->height * 9 / 10; y++)
        for (uint32_t x = img->width / 8; x < img->width * 95 / 100; x++)
            n += pixel_is(img, x, y, c);
    return n;
}

/* ---- tests ----------------------------------------------------------------- */

Test(report, draws_loss_throughput_lr_and_cost)
{
    char *dir = synthetic_run(1);
    const char *argv[] = {"report", dir};
    struct outcome o = report(2, argv);
    cr_assert_eq(o.code, 0, "report fails: %s", o.err);

    char *out = path_in(dir, "report");
    const char *names[] = {"loss.png", "throughput.png", "lr.png", "cost.png", "index.html"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        cr_assert(exists(out, names[i]), "report/%s is written", names[i]);

    struct image loss = read_png(out, "loss.png");
    cr_assert(pixel_is(&loss, 0, 0, WHITE) && pixel_is(&loss, WIDTH - 1, HEIGHT - 1, WHITE),
              "the background is white");
    cr_assert_gt(count_in_plot(&loss, TRAIN_BLUE), 300, "the training loss is drawn");
    cr_assert_gt(count_in_plot(&loss, VAL_ORANGE), 100, "the validation loss is drawn");

    struct image throughput = read_png(out, "throughput.png");
    cr_assert(pixel_is(&throughput, 0, 0, WHITE));
    cr_assert_gt(count_in_plot(&throughput, TOKENS_GREEN), 300, "tokens/s is drawn");
    cr_assert_gt(count_in_plot(&throughput, WAIT_RED), 300, "data wait is drawn");

    struct image lr = read_png(out, "lr.png");
    cr_assert_gt(count_in_plot(&lr, TRAIN_BLUE), 300, "the learning rate is drawn");
    struct image cost = read_png(out, "cost.png");
    cr_assert_gt(count_in_plot(&cost, COST_PURPLE), 300, "the cost is drawn");

    /* the curves are in the plot, not in the margins */
    for (uint32_t y = 0; y < HEIGHT; y++)
        for (uint32_t x = 0; x < 60; x++)
            cr_assert(!pixel_is(&loss, x, y, TRAIN_BLUE), "no curve in the left margin (%u,%u)", x, y);

    char *index = path_in(out, "index.html");
    char *html = slurp(index, NULL);
    cr_assert(strstr(html, "<img src=\"loss.png\"") && strstr(html, "<img src=\"cost.png\""),
              "index.html shows the images");

    cr_assert(strstr(o.out, "400"), "the summary names the last step:\n%s", o.out);
    cr_assert(strstr(o.out, "train loss") && strstr(o.out, "val loss"), "summary:\n%s", o.out);
    /* the loss per byte of text data: step 400's val_loss / 4 */
    char per_byte[64];
    snprintf(per_byte, sizeof per_byte, "val per byte final %.4g (step 400)",
             (1.0 + 3.0 / (1 + 400 / 40.0) + 0.05 * ((400 / 10) % 3) + 0.2) / 4);
    cr_assert(strstr(o.out, per_byte), "the summary has no \"%s\":\n%s", per_byte, o.out);
    cr_assert(strstr(o.out, "$4.00"), "the summary gives the cost:\n%s", o.out);
    cr_assert(strstr(o.out, "3m 20s"), "the summary gives the time:\n%s", o.out);
    free(html);
    free(index);
    image_free(&loss);
    image_free(&throughput);
    image_free(&lr);
    image_free(&cost);
    outcome_free(&o);
    free(out);
    remove_tree(dir);
}

Test(report, skips_cost_when_not_logged_and_honours_o)
{
    char *dir = synthetic_run(0), *out = path_in(dir, "elsewhere/plots");
    const char *argv[] = {"report", dir, "-o", out};
    struct outcome o = report(4, argv);
    cr_assert_eq(o.code, 0, "report fails: %s", o.err);
    cr_assert(exists(out, "loss.png") && exists(out, "lr.png") && exists(out, "index.html"));
    cr_assert(!exists(out, "cost.png"), "no cost.png without cost_usd");
    cr_assert(!exists(dir, "report"), "-o replaces the default directory");
    cr_assert(strstr(o.out, "cost.png skipped"), "a note says why:\n%s", o.out);
    outcome_free(&o);
    free(out);
    remove_tree(dir);
}

Test(report, malformed_line_names_file_and_line)
{
    char *dir = temp_dir(), *metrics = path_in(dir, "metrics.jsonl");
    write_text(metrics, "{\"step\": 10, \"loss\": 2.5}\n"
                        "{\"step\": 20, \"loss\": 2.4}\n"
                        "{\"step\": 30, \"loss\": }\n"
                        "{\"step\": 40, \"loss\": 2.2}\n");
    const char *argv[] = {"report", dir};
    struct outcome o = report(2, argv);
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.err, "metrics.jsonl:3:"), "the error names file:line: %s", o.err);
    cr_assert(!exists(dir, "report/loss.png"), "no images from a broken file");
    outcome_free(&o);
    free(metrics);
    remove_tree(dir);
}

Test(report, line_that_is_not_an_object)
{
    char *dir = temp_dir(), *metrics = path_in(dir, "metrics.jsonl");
    write_text(metrics, "{\"step\": 10, \"loss\": 2.5}\n\n[1, 2]\n");
    const char *argv[] = {"report", dir};
    struct outcome o = report(2, argv);
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.err, "metrics.jsonl:3: expected a JSON object"), "%s", o.err);
    outcome_free(&o);
    free(metrics);
    remove_tree(dir);
}

Test(report, run_dir_without_metrics)
{
    char *dir = temp_dir();
    const char *argv[] = {"report", dir};
    struct outcome o = report(2, argv);
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.err, "has no metrics.jsonl"), "a clear error: %s", o.err);
    outcome_free(&o);

    char *missing = path_in(dir, "no-such-run");
    const char *argv2[] = {"report", missing};
    o = report(2, argv2);
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.err, "no-such-run") && strstr(o.err, "No such file"), "%s", o.err);
    outcome_free(&o);
    free(missing);
    remove_tree(dir);
}

Test(report, empty_metrics_is_an_error)
{
    char *dir = temp_dir(), *metrics = path_in(dir, "metrics.jsonl");
    write_text(metrics, "");
    const char *argv[] = {"report", dir};
    struct outcome o = report(2, argv);
    cr_assert_eq(o.code, 1);
    cr_assert(strstr(o.err, "no metrics yet"), "%s", o.err);
    outcome_free(&o);
    free(metrics);
    remove_tree(dir);
}

/* A resumed run logs steps again and restarts elapsed_s; a run being written
 * may end in half a line. */
Test(report, resumed_run_and_partial_last_line)
{
    char *dir = temp_dir(), *metrics = path_in(dir, "metrics.jsonl");
    write_text(metrics, "{\"step\": 10, \"loss\": 3.0, \"elapsed_s\": 10}\n"
                        "{\"step\": 20, \"loss\": 2.0, \"elapsed_s\": 20}\n"
                        "{\"step\": 30, \"loss\": 1.5, \"elapsed_s\": 30}\n"
                        "{\"step\": 20, \"loss\": 2.1, \"elapsed_s\": 5}\n"
                        "{\"step\": 30, \"loss\": 1.4, \"elapsed_s\": 15}\n"
                        "{\"step\": 40, \"loss\": 1.2, \"elapsed_s\": 25}\n"
                        "{\"step\": 50, \"lo");
    const char *argv[] = {"report", dir};
    struct outcome o = report(2, argv);
    cr_assert_eq(o.code, 0, "%s", o.err);
    cr_assert(strstr(o.err, "metrics.jsonl:7: incomplete last line"), "%s", o.err);
    cr_assert(strstr(o.out, "40 (4 logged"), "steps logged twice count once:\n%s", o.out);
    cr_assert(strstr(o.out, "final 1.2 (step 40), best 1.2 (step 40)"), "%s", o.out);
    cr_assert(strstr(o.out, "55.0 s"), "time adds the segments (30 + 25 s):\n%s", o.out);
    cr_assert(strstr(o.out, "throughput.png skipped"), "%s", o.out);
    outcome_free(&o);
    free(metrics);
    remove_tree(dir);
}

Test(report, usage)
{
    const char *no_dir[] = {"report"}, *two_dirs[] = {"report", "a", "b"}, *no_out[] = {"report", "a", "-o"};
    struct {
        int argc;
        const char **argv;
    } cases[] = {{1, no_dir}, {3, two_dirs}, {3, no_out}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct outcome o = report(cases[i].argc, cases[i].argv);
        cr_assert_eq(o.code, 2, "case %zu exits with the usage code", i);
        cr_assert(strstr(o.err, "usage") || strstr(o.err, "-o needs"), "%s", o.err);
        outcome_free(&o);
    }
}
