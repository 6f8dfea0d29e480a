/*
 * `trainrun prepare --format images` (see dataset.h): image folders (one
 * subdirectory per class, as torchvision's ImageFolder) and WebDataset tar
 * shards (samples grouped by key: an image member .png/.jpg/.jpeg/.webp and
 * a .cls label) decoded once (image_codec.c), converted to RGB or grey,
 * resized to --size x --size and written as TRIMAGES shards
 * (include/trainrun/images.h) for the images data source, with the class
 * names in classes.txt and what was done in prepare.json.
 *
 * --augment-copies N adds N randomly cropped (and with --augment-flip
 * mirrored) copies of each training image, made once here with the crop
 * the loader applies on the fly (tr_images_apply_u8), deterministic per
 * --seed.
 *
 * This file holds the command and the run: samples are queued as the inputs
 * are read (prepare_images_read.c), decoded a batch at a time on worker
 * threads and written in input order (prepare_images_writer.c), so the
 * shards are the same for any number of workers.
 */
#include "dataset.h"

#include "image_codec.h"
#include "prepare_images_internal.h"
#include "prepare_internal.h"

#include "../util/json.h"
#include "../util/progress.h"
#include "../util/util.h"

#include <trainrun/images.h>
#include <trainrun/mix.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the run ------------------------------------------------------------------ */

/* Train or validation, for a sample named `name` when the split comes from
 * --val-fraction: a hash of the name, so a file's side does not change when
 * others are added or removed. */
static int goes_to_val(const struct prepare_opts *o, const char *name)
{
    if (o->n_val_inputs > 0 || o->val_fraction <= 0)
        return 0;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    h = tr_mix64(h ^ o->seed * TR_GOLDEN64);
    return (double)(h >> 11) / (double)(1ULL << 53) < o->val_fraction;
}

/* A file or tar member that did not decode: stop naming it, or with
 * --skip-bad-records count it and show the first few. */
int images_bad_record(struct run *r, const char *where, const char *why)
{
    if (!r->o->skip_bad_records)
        return tr_prepare_fail("%s: %s; fix or remove it, or pass --skip-bad-records to skip "
                               "such files (counted, the first %d named)",
                               where, why, SAMPLES_SHOWN);
    if (r->bad++ < SAMPLES_SHOWN)
        fprintf(stderr, "trainrun prepare: skipped %s: %s\n", where, why);
    return 0;
}

/* Write one decoded sample (and its copies when training). */
static int emit_sample(struct run *r, const char *split_name, uint32_t label, int val)
{
    const struct prepare_opts *o = r->o;
    if (label + 1 > r->max_label)
        r->max_label = label + 1;
    int is_val = val || goes_to_val(o, split_name);
    struct image_writer *w = is_val ? &r->val : &r->train;
    if (image_writer_put(w, r->square, label) != 0)
        return -1;
    if (is_val)
        return 0;
    uint64_t image = r->train_originals++;
    for (int k = 0; k < o->augment_copies; k++) {
        struct tr_images_view v = tr_images_draw(tr_images_key(o->seed, image, (uint64_t)k), o->augment_pad,
                                                 o->augment_flip);
        tr_images_apply_u8(r->square, r->copy, o->image_size, o->image_size, o->channels,
                           o->augment_pad, &v);
        if (image_writer_put(w, r->copy, label) != 0)
            return -1;
    }
    return 0;
}

struct decode_job {
    struct run *r;
    int first, step;
};

static void *decode_some(void *arg)
{
    struct decode_job *j = arg;
    const struct prepare_opts *o = j->r->o;
    for (int i = j->first; i < j->r->n_batch; i += j->step) {
        struct pending *p = &j->r->batch[i];
        struct tr_image img;
        p->ok = tr_image_decode(p->data, p->size, o->channels, &img, p->why, sizeof p->why) == 0;
        if (!p->ok)
            continue;
        tr_image_resize_crop(&img, o->image_size, p->pixels);
        tr_image_free(&img);
    }
    return NULL;
}

/* Decode the batch (on r->workers threads) and write it in order. */
int images_flush_batch(struct run *r)
{
    int n = r->n_batch, workers = r->workers < n ? r->workers : n;
    struct decode_job jobs[64];
    pthread_t threads[64];
    int started = 0;
    for (int k = 0; k < workers; k++)
        jobs[k] = (struct decode_job){.r = r, .first = k, .step = workers};
    for (int k = 1; k < workers; k++)
        if (pthread_create(&threads[k], NULL, decode_some, &jobs[k]) == 0)
            started = k;
        else
            break;
    if (started + 1 < workers) /* fewer threads than asked: the rest here */
        for (int k = started + 1; k < workers; k++)
            decode_some(&jobs[k]);
    if (workers > 0)
        decode_some(&jobs[0]);
    for (int k = 1; k <= started; k++)
        pthread_join(threads[k], NULL);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        struct pending *p = &r->batch[i];
        if (rc == 0) {
            if (!p->ok) {
                rc = images_bad_record(r, p->where, p->why);
            } else {
                memcpy(r->square, p->pixels,
                       (size_t)r->o->image_size * r->o->image_size * r->o->channels);
                rc = emit_sample(r, p->split_name, p->label, p->val);
            }
        }
        free(p->data);
        free(p->where);
        free(p->split_name);
        p->data = NULL;
        p->where = p->split_name = NULL;
    }
    r->n_batch = 0;
    return rc;
}

/* Queue one encoded sample (data becomes the batch's); a full batch is
 * decoded and written. */
int images_put_sample(struct run *r, const char *where, const char *split_name,
                      unsigned char *data, size_t size, uint32_t label, int val)
{
    struct pending *p = &r->batch[r->n_batch++];
    p->data = data;
    p->size = size;
    p->where = tr_xasprintf("%s", where);
    p->split_name = tr_xasprintf("%s", split_name);
    p->label = label;
    p->val = val;
    p->ok = 0;
    p->why[0] = '\0';
    return r->n_batch == r->batch_cap ? images_flush_batch(r) : 0;
}

/* ---- the command ---------------------------------------------------------------- */

static uint64_t input_bytes(const char *path, int depth)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    if (!S_ISDIR(st.st_mode))
        return (uint64_t)st.st_size;
    if (depth > 32)
        return 0;
    size_t n;
    char **v = images_list_dir(path, &n);
    uint64_t total = 0;
    for (size_t i = 0; v && i < n; i++) {
        char *sub = tr_xasprintf("%s/%s", path, v[i]);
        total += input_bytes(sub, depth + 1);
        free(sub);
    }
    if (v)
        images_free_list(v, n);
    return total;
}

static int write_classes(struct run *r, uint32_t classes)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/classes.txt", r->o->out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return tr_prepare_fail("cannot create %s: %s", tmp, strerror(errno));
    for (uint32_t i = 0; i < classes; i++) {
        if (i < r->cls.n)
            fprintf(f, "%s\n", r->cls.name[i]);
        else
            fprintf(f, "%u\n", i);
    }
    return tr_prepare_publish(tmp, path, f);
}

static int write_json(struct run *r, uint32_t classes, double seconds)
{
    const struct prepare_opts *o = r->o;
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/prepare.json", o->out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return tr_prepare_fail("cannot create %s: %s", tmp, strerror(errno));
    fputs("{\n  \"format\": \"images\",\n", f);
    tr_prepare_json_inputs(f, o);
    fputs("  \"val_inputs\": [", f);
    for (int i = 0; i < o->n_val_inputs; i++) {
        if (i)
            fputs(", ", f);
        tr_json_write_string(f, o->val_inputs[i]);
    }
    fputs("],\n", f);
    fputs("  \"class_names\": [", f);
    for (uint32_t i = 0; i < classes; i++) {
        if (i)
            fputs(", ", f);
        if (i < r->cls.n)
            tr_json_write_string(f, r->cls.name[i]);
        else
            fprintf(f, "\"%u\"", i);
    }
    fputs("],\n", f);
    fprintf(f,
            "  \"height\": %d,\n  \"width\": %d,\n  \"channels\": %d,\n  \"classes\": %u,\n"
            "  \"train_images\": %llu,\n  \"train_originals\": %llu,\n"
            "  \"val_images\": %llu,\n  \"val_fraction\": %g,\n  \"augment_copies\": %d,\n"
            "  \"augment_pad\": %d,\n  \"augment_flip\": %s,\n  \"seed\": %llu,\n"
            "  \"skipped\": %llu,\n  \"train_shards\": %d,\n  \"val_shards\": %d,\n"
            "  \"seconds\": %.3f\n}\n",
            o->image_size, o->image_size, o->channels, classes,
            (unsigned long long)r->train.total, (unsigned long long)r->train_originals,
            (unsigned long long)r->val.total, o->n_val_inputs ? 0.0 : o->val_fraction,
            o->augment_copies, o->augment_pad, o->augment_flip ? "true" : "false",
            (unsigned long long)o->seed, (unsigned long long)r->bad, r->train.n_shards,
            r->val.n_shards, seconds);
    return tr_prepare_publish(tmp, path, f);
}

static int is_tar(const char *path)
{
    static const char *const ext[] = {".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.xz"};
    size_t n = strlen(path);
    for (size_t i = 0; i < TR_ARRAY_LEN(ext); i++) {
        size_t m = strlen(ext[i]);
        if (n >= m && strcmp(path + n - m, ext[i]) == 0)
            return 1;
    }
    return 0;
}

int tr_prepare_is_image_input(const char *path)
{
    return is_tar(path) || images_is_dir(path);
}

/* --size, and every input a folder or a tar.  0 or -1. */
static int check_inputs(const struct prepare_opts *o)
{
    if (o->image_size < 1 || o->image_size > TR_IMAGES_MAX_SIDE)
        return tr_prepare_fail("--format images needs --size N, the side of the square every "
                               "image is resized to (1 to %d; 32 or 64 for small sets, 224 "
                               "for ImageNet-like ones)",
                               TR_IMAGES_MAX_SIDE);
    for (int k = 0; k < 2; k++) {
        const char **v = k ? o->val_inputs : o->inputs;
        int n = k ? o->n_val_inputs : o->n_inputs;
        for (int i = 0; i < n; i++)
            if (!tr_prepare_is_image_input(v[i]))
                return tr_prepare_fail("%s: %s; image inputs are folders (one subdirectory "
                                       "per class) or WebDataset tar shards (.tar, .tar.gz)",
                                       v[i], access(v[i], F_OK) != 0 ? strerror(errno)
                                                                      : "neither a folder "
                                                                        "nor a .tar");
    }
    return 0;
}

/* The run's writers, buffers, workers and batch. */
static void run_init(struct run *r, const struct prepare_opts *o)
{
    size_t bytes = (size_t)o->image_size * (size_t)o->image_size * (size_t)o->channels;
    uint64_t per_shard = o->shard_images ? o->shard_images : (1ULL << 30) / bytes;
    if (per_shard < 1)
        per_shard = 1;
    r->o = o;
    r->train = (struct image_writer){.dir = o->out_dir, .prefix = "train", .size = o->image_size,
                                     .channels = o->channels, .per_shard = per_shard};
    r->val = r->train;
    r->val.prefix = "val";
    r->square = tr_xcalloc(bytes, 1);
    r->copy = tr_xcalloc(bytes, 1);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    r->workers = o->workers > 0 ? o->workers : online > 0 ? (int)online : 1;
    if (r->workers > 64)
        r->workers = 64;
    r->batch_cap = bytes * BATCH <= BATCH_PIXEL_BYTES ? BATCH : (int)(BATCH_PIXEL_BYTES / bytes);
    if (r->batch_cap < r->workers)
        r->batch_cap = r->workers;
    r->batch = tr_xcalloc((size_t)r->batch_cap, sizeof *r->batch);
    for (int i = 0; i < r->batch_cap; i++)
        r->batch[i].pixels = tr_xcalloc(bytes, 1);
}

static void run_free(struct run *r)
{
    image_writer_free(&r->train);
    image_writer_free(&r->val);
    for (size_t i = 0; i < r->cls.n; i++)
        free(r->cls.name[i]);
    free(r->cls.name);
    for (int i = 0; i < r->batch_cap; i++) {
        free(r->batch[i].pixels);
        free(r->batch[i].data); /* queued when an error stopped prepare */
        free(r->batch[i].where);
        free(r->batch[i].split_name);
    }
    free(r->batch);
    free(r->square);
    free(r->copy);
}

/* The classes (every training folder's subdirectories, sorted), then every input read,
 * decoded and written, under the progress bar.  0 or -1. */
static int read_inputs(struct run *r)
{
    const struct prepare_opts *o = r->o;
    int rc = 0;
    for (int i = 0; i < o->n_inputs && rc == 0; i++)
        if (!is_tar(o->inputs[i]))
            rc = images_folder_classes(r, o->inputs[i]);
    uint64_t total = 0;
    for (int i = 0; i < o->n_inputs; i++)
        total += input_bytes(o->inputs[i], 0);
    for (int i = 0; i < o->n_val_inputs; i++)
        total += input_bytes(o->val_inputs[i], 0);
    r->progress = tr_progress_start("decoding", total);
    for (int k = 0; k < 2 && rc == 0; k++) {
        const char **v = k ? o->val_inputs : o->inputs;
        int n = k ? o->n_val_inputs : o->n_inputs;
        for (int i = 0; i < n && rc == 0; i++)
            rc = is_tar(v[i]) ? images_prepare_tar(r, v[i], k) : images_prepare_folder(r, v[i], k);
    }
    if (rc == 0)
        rc = images_flush_batch(r);
    if (r->progress)
        tr_progress_end(r->progress, rc == 0, 0);
    return rc;
}

/* Some images read, the shards published, stale ones removed, classes.txt written.  0 or -1. */
static int publish(struct run *r, uint32_t classes)
{
    const struct prepare_opts *o = r->o;
    if (r->train.total == 0)
        return tr_prepare_fail("no training image could be read from the inputs%s",
                               r->bad ? " (every one was skipped)" : "");
    if (o->n_val_inputs > 0 && r->val.total == 0)
        return tr_prepare_fail("no validation image could be read from the --val inputs");
    if (image_writer_publish(&r->train, classes) != 0 || image_writer_publish(&r->val, classes) != 0)
        return -1;
    tr_prepare_remove_stale_shards(o->out_dir, "train", r->train.n_shards);
    tr_prepare_remove_stale_shards(o->out_dir, "val", r->val.n_shards);
    return write_classes(r, classes);
}

/* What was written, skipped and ignored. */
static void print_report(const struct run *r, uint32_t classes, double seconds)
{
    const struct prepare_opts *o = r->o;
    uint64_t images = r->train_originals + r->val.total;
    printf("trainrun prepare: %llu images in %u classes -> %llu training",
           (unsigned long long)images, classes, (unsigned long long)r->train_originals);
    if (o->augment_copies)
        printf(" (+%llu augmented copies)",
               (unsigned long long)(r->train.total - r->train_originals));
    printf(" and %llu validation images of %dx%dx%d in %d shards, %.2f s (%.0f images/s): "
           "%s\n",
           (unsigned long long)r->val.total, o->image_size, o->image_size, o->channels,
           r->train.n_shards + r->val.n_shards, seconds, images / (seconds > 0 ? seconds : 1),
           o->out_dir);
    if (r->bad)
        printf("trainrun prepare: skipped %llu samples that did not decode "
               "(--skip-bad-records; the first %d named above)\n",
               (unsigned long long)r->bad, SAMPLES_SHOWN);
    if (r->ignored)
        printf("trainrun prepare: ignored %llu files that are not .png, .jpg, .jpeg or "
               ".webp images in a class folder (the first: %s)\n",
               (unsigned long long)r->ignored, r->first_ignored);
    if (r->val.total == 0)
        printf("trainrun prepare: note: no validation images (--val-fraction 0 and no "
               "--val): the run's evaluations will have nothing to read\n");
}

int tr_prepare_images(const struct prepare_opts *o)
{
    double t0 = tr_now();
    if (check_inputs(o) != 0)
        return -1;
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return tr_prepare_fail("cannot create %s: %s", o->out_dir, strerror(errno));
    if (tr_prepare_claim_out_dir(o->out_dir) != 0)
        return -1;
    struct run r = {0};
    run_init(&r, o);
    int rc = read_inputs(&r);
    uint32_t classes = r.max_label;
    if (classes < r.cls.n)
        classes = (uint32_t)r.cls.n;
    if (rc == 0)
        rc = publish(&r, classes);
    double seconds = tr_now() - t0;
    if (rc == 0)
        rc = write_json(&r, classes, seconds);
    if (rc == 0)
        print_report(&r, classes, seconds);
    run_free(&r);
    return rc;
}
