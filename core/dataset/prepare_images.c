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
 */
#include "dataset.h"

#include "image_codec.h"
#include "prepare_internal.h"

#include "../util/json.h"
#include "../util/progress.h"
#include "../util/util.h"

#include <trainrun/images.h>
#include <trainrun/mix.h>

#include <archive.h>
#include <archive_entry.h>
#include <ctype.h>
#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A tar member larger than this is not an image prepare decodes. */
#define MAX_MEMBER_BYTES (256u << 20)

/* ---- the shard writer ------------------------------------------------------ */

struct shard {
    char *tmp, *path;
    uint64_t count, checksum;
};

struct writer {
    const char *dir, *prefix;
    int size, channels;
    uint64_t per_shard;
    FILE *f;                /* the open shard, or NULL */
    struct tr_images_sum sum;
    uint32_t *labels;       /* of the open shard */
    uint64_t count;         /* images in the open shard */
    uint64_t total;
    struct shard *shards;
    int n_shards;
};

static int writer_finish_shard(struct writer *w)
{
    if (!w->f)
        return 0;
    struct shard *s = &w->shards[w->n_shards - 1];
    unsigned char b[4];
    int rc = 0;
    for (uint64_t i = 0; i < w->count && rc == 0; i++) {
        tr_images_put32(b, w->labels[i]);
        tr_images_sum_update(&w->sum, b, 4);
        if (fwrite(b, 1, 4, w->f) != 4)
            rc = -1;
    }
    s->count = w->count;
    s->checksum = tr_images_sum_final(&w->sum);
    if (rc != 0 || fflush(w->f) != 0 || ferror(w->f))
        rc = tr_prepare_fail("cannot write %s: %s", s->tmp, strerror(errno));
    if (fclose(w->f) != 0 && rc == 0)
        rc = tr_prepare_fail("cannot write %s: %s", s->tmp, strerror(errno));
    w->f = NULL;
    w->count = 0;
    return rc;
}

static int writer_put(struct writer *w, const unsigned char *pixels, uint32_t label)
{
    size_t bytes = (size_t)w->size * (size_t)w->size * (size_t)w->channels;
    if (w->f && w->count == w->per_shard && writer_finish_shard(w) != 0)
        return -1;
    if (!w->f) {
        w->shards = realloc(w->shards, (size_t)(w->n_shards + 1) * sizeof *w->shards);
        if (!w->shards)
            return tr_prepare_fail("out of memory");
        struct shard *s = &w->shards[w->n_shards++];
        memset(s, 0, sizeof *s);
        s->path = tr_xasprintf("%s/%s_%06d.bin", w->dir, w->prefix, w->n_shards - 1);
        s->tmp = tr_xasprintf("%s.tmp-%ld", s->path, (long)getpid());
        w->f = fopen(s->tmp, "w+b");
        if (!w->f)
            return tr_prepare_fail("cannot create %s: %s", s->tmp, strerror(errno));
        /* the header is written last, once the classes of every input are known */
        unsigned char zero[TR_IMAGES_HEADER_BYTES] = {0};
        if (fwrite(zero, 1, sizeof zero, w->f) != sizeof zero)
            return tr_prepare_fail("cannot write %s: %s", s->tmp, strerror(errno));
        tr_images_sum_init(&w->sum);
        if (!w->labels)
            w->labels = tr_xcalloc((size_t)w->per_shard, sizeof *w->labels);
    }
    if (fwrite(pixels, 1, bytes, w->f) != bytes)
        return tr_prepare_fail("cannot write %s: %s", w->shards[w->n_shards - 1].tmp,
                               strerror(errno));
    tr_images_sum_update(&w->sum, pixels, bytes);
    w->labels[w->count++] = label;
    w->total++;
    return 0;
}

/* Write every shard's header (now that `classes` is known), then publish
 * them under their names. */
static int writer_publish(struct writer *w, uint32_t classes)
{
    if (writer_finish_shard(w) != 0)
        return -1;
    for (int i = 0; i < w->n_shards; i++) {
        struct shard *s = &w->shards[i];
        struct tr_images_header h = {.version = TR_IMAGES_VERSION,
                                     .height = (uint32_t)w->size,
                                     .width = (uint32_t)w->size,
                                     .channels = (uint32_t)w->channels,
                                     .count = s->count,
                                     .classes = classes,
                                     .checksum = s->checksum};
        unsigned char head[TR_IMAGES_HEADER_BYTES];
        tr_images_header_write(head, &h);
        FILE *f = fopen(s->tmp, "r+b");
        if (!f)
            return tr_prepare_fail("cannot reopen %s: %s", s->tmp, strerror(errno));
        if (fwrite(head, 1, sizeof head, f) != sizeof head) {
            fclose(f);
            return tr_prepare_fail("cannot write %s: %s", s->tmp, strerror(errno));
        }
        if (tr_prepare_publish(s->tmp, s->path, f) != 0)
            return -1;
        free(s->tmp);
        s->tmp = NULL;
    }
    return 0;
}

static void writer_free(struct writer *w)
{
    if (w->f)
        fclose(w->f);
    for (int i = 0; i < w->n_shards; i++) {
        if (w->shards[i].tmp) /* not published: an error stopped prepare */
            unlink(w->shards[i].tmp);
        free(w->shards[i].tmp);
        free(w->shards[i].path);
    }
    free(w->shards);
    free(w->labels);
}

/* ---- the run ------------------------------------------------------------------ */

struct classes {
    char **name;
    size_t n, cap;
};

/* A sample read but not yet decoded: samples are decoded a batch at a time
 * on the worker threads, then written in the order they were read, so the
 * shards are the same for any number of workers. */
struct pending {
    unsigned char *data;   /* the encoded file (owned) */
    size_t size;
    char *where;           /* for messages: the file, or tar: member */
    char *split_name;      /* for the --val-fraction hash */
    uint32_t label;
    int val;
    int ok;                /* decoded into pixels */
    char why[512];
    unsigned char *pixels; /* size x size x channels */
};

#define BATCH 256
#define BATCH_PIXEL_BYTES (256u << 20) /* fewer than BATCH when images are large */

struct run {
    const struct prepare_opts *o;
    struct pending *batch;      /* batch_cap of them */
    int batch_cap;
    int n_batch;
    int workers;
    struct writer train, val;
    struct classes cls;
    uint32_t max_label;         /* largest label seen, +1 (0: none) */
    unsigned char *square;      /* size x size x channels */
    unsigned char *copy;
    uint64_t train_originals;   /* training images before copies: the copies' key */
    uint64_t bad, ignored;
    char first_ignored[512];
    struct tr_progress *progress; /* the bar over the inputs' bytes */
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static long class_index(const struct classes *c, const char *name)
{
    char *const *hit = c->n ? bsearch(&name, c->name, c->n, sizeof *c->name, cmp_str) : NULL;
    return hit ? (long)(hit - c->name) : -1;
}

static int has_image_ext(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot)
        return 0;
    static const char *const ext[] = {".png", ".jpg", ".jpeg", ".webp"};
    for (size_t i = 0; i < TR_ARRAY_LEN(ext); i++)
        if (strcasecmp(dot, ext[i]) == 0)
            return 1;
    return 0;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

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
static int bad_record(struct run *r, const char *where, const char *why)
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
    struct writer *w = is_val ? &r->val : &r->train;
    if (writer_put(w, r->square, label) != 0)
        return -1;
    if (is_val)
        return 0;
    uint64_t image = r->train_originals++;
    for (int k = 0; k < o->augment_copies; k++) {
        struct tr_images_view v = tr_images_draw(tr_images_key(o->seed, image, (uint64_t)k), o->augment_pad,
                                                 o->augment_flip);
        tr_images_apply_u8(r->square, r->copy, o->image_size, o->image_size, o->channels,
                           o->augment_pad, &v);
        if (writer_put(w, r->copy, label) != 0)
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
static int flush_batch(struct run *r)
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
                rc = bad_record(r, p->where, p->why);
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
static int put_sample(struct run *r, const char *where, const char *split_name,
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
    return r->n_batch == r->batch_cap ? flush_batch(r) : 0;
}

static int read_file(const char *path, unsigned char **data, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return tr_prepare_fail("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size > (off_t)MAX_MEMBER_BYTES) {
        fclose(f);
        return tr_prepare_fail("%s: %s", path,
                               errno ? strerror(errno) : "larger than 256 MiB: not an image "
                                                         "prepare decodes");
    }
    *size = (size_t)st.st_size;
    *data = malloc(*size ? *size : 1);
    if (!*data || fread(*data, 1, *size, f) != *size) {
        int e = errno;
        fclose(f);
        free(*data);
        return tr_prepare_fail("cannot read %s: %s", path, e ? strerror(e) : "short read");
    }
    fclose(f);
    return 0;
}

/* ---- folders ---------------------------------------------------------------- */

/* Entries of a directory, sorted by byte value (ImageFolder sorts its
 * classes and files with Python's sorted(), which is the same for UTF-8);
 * hidden names are left out.  NULL when it cannot be read. */
static char **list_dir(const char *path, size_t *n)
{
    DIR *d = opendir(path);
    if (!d)
        return NULL;
    char **v = NULL;
    size_t cap = 0;
    *n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(v, cap * sizeof *v);
            if (!grown)
                break;
            v = grown;
        }
        v[(*n)++] = tr_xasprintf("%s", e->d_name);
    }
    closedir(d);
    if (*n)
        qsort(v, *n, sizeof *v, cmp_str);
    return v ? v : tr_xcalloc(1, sizeof *v);
}

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* The class subdirectories of a folder input, added to r->cls (train) or
 * checked against it (val). */
static int folder_classes(struct run *r, const char *root)
{
    size_t n;
    char **v = list_dir(root, &n);
    if (!v)
        return tr_prepare_fail("cannot read the folder %s: %s", root, strerror(errno));
    for (size_t i = 0; i < n; i++) {
        char *path = tr_xasprintf("%s/%s", root, v[i]);
        int dir = is_dir(path);
        free(path);
        if (!dir || class_index(&r->cls, v[i]) >= 0)
            continue;
        if (r->cls.n == r->cls.cap) {
            r->cls.cap = r->cls.cap ? 2 * r->cls.cap : 64;
            r->cls.name = realloc(r->cls.name, r->cls.cap * sizeof *r->cls.name);
            if (!r->cls.name) {
                free_list(v, n);
                return tr_prepare_fail("out of memory");
            }
        }
        r->cls.name[r->cls.n++] = tr_xasprintf("%s", v[i]);
        qsort(r->cls.name, r->cls.n, sizeof *r->cls.name, cmp_str);
    }
    free_list(v, n);
    return 0;
}

/* Every image file under dir (recursively, sorted), as class `label`.
 * rel is the path below the input root, for the split's hash. */
static int walk(struct run *r, const char *dir, const char *rel, uint32_t label, int val,
                int depth, uint64_t *found)
{
    if (depth > 32)
        return tr_prepare_fail("%s: folders nested more than 32 deep (a symbolic link loop?)",
                               dir);
    size_t n;
    char **v = list_dir(dir, &n);
    if (!v)
        return tr_prepare_fail("cannot read the folder %s: %s", dir, strerror(errno));
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *path = tr_xasprintf("%s/%s", dir, v[i]);
        char *sub = tr_xasprintf("%s/%s", rel, v[i]);
        if (is_dir(path)) {
            rc = walk(r, path, sub, label, val, depth + 1, found);
        } else if (!has_image_ext(v[i])) {
            if (r->ignored++ == 0)
                snprintf(r->first_ignored, sizeof r->first_ignored, "%s", path);
        } else {
            unsigned char *data = NULL;
            size_t size = 0;
            rc = read_file(path, &data, &size);
            if (rc == 0) {
                tr_progress_add(r->progress, size);
                rc = put_sample(r, path, sub, data, size, label, val);
                (*found)++;
            }
        }
        free(path);
        free(sub);
    }
    free_list(v, n);
    return rc;
}

static int prepare_folder(struct run *r, const char *root, int val)
{
    size_t n;
    char **v = list_dir(root, &n);
    if (!v)
        return tr_prepare_fail("cannot read the folder %s: %s", root, strerror(errno));
    int rc = 0, classes = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *path = tr_xasprintf("%s/%s", root, v[i]);
        if (!is_dir(path)) {
            if (r->ignored++ == 0)
                snprintf(r->first_ignored, sizeof r->first_ignored, "%s", path);
            free(path);
            continue;
        }
        classes++;
        long label = class_index(&r->cls, v[i]);
        if (label < 0) /* only a validation folder can have a class the training ones lack */
            rc = tr_prepare_fail("%s: the validation folder has a class, '%s', that no training "
                                 "folder has; the classes are the training folders' "
                                 "subdirectories",
                                 path, v[i]);
        uint64_t found = 0;
        if (rc == 0)
            rc = walk(r, path, v[i], (uint32_t)label, val, 0, &found);
        if (rc == 0 && found == 0 && !val)
            rc = tr_prepare_fail("%s: the class folder holds no .png, .jpg, .jpeg or .webp "
                                 "file; add images or remove the folder (every subdirectory "
                                 "of %s is a class)",
                                 path, root);
        free(path);
    }
    free_list(v, n);
    if (rc == 0 && classes == 0)
        rc = tr_prepare_fail("%s has no subdirectories: an image folder holds one "
                             "subdirectory of images per class (root/cat/1.png, "
                             "root/dog/2.png), as torchvision's ImageFolder",
                             root);
    return rc;
}

/* ---- WebDataset tar shards -------------------------------------------------- */

struct sample {
    char key[1024];
    unsigned char *image;
    size_t image_size;
    char image_member[1024];
    long label;  /* -1: no .cls yet */
    char cls_problem[128];
};

static int flush_sample(struct run *r, const char *tar, struct sample *s, int val)
{
    int rc = 0;
    char where[2200];
    snprintf(where, sizeof where, "%s: sample %s", tar, s->key);
    if (!s->key[0])
        return 0;
    if (!s->image || s->label < 0) {
        /* the samples before it first, so that errors come in input order */
        rc = flush_batch(r);
        if (rc == 0)
            rc = bad_record(r, where, !s->image ? "no .png, .jpg, .jpeg or .webp member"
                                      : s->cls_problem[0] ? s->cls_problem
                                                          : "no .cls member (the class number)");
    } else {
        snprintf(where, sizeof where, "%s: %s", tar, s->image_member);
        rc = put_sample(r, where, s->key, s->image, s->image_size, (uint32_t)s->label, val);
        s->image = NULL; /* the batch's now */
    }
    free(s->image);
    memset(s, 0, sizeof *s);
    s->label = -1;
    return rc;
}

static int prepare_tar(struct run *r, const char *path, int val)
{
    struct archive *a = archive_read_new();
    archive_read_support_filter_all(a);
    archive_read_support_format_tar(a);
    if (archive_read_open_filename(a, path, 1 << 16) != ARCHIVE_OK) {
        int rc = tr_prepare_fail("cannot open %s: %s", path, archive_error_string(a));
        archive_read_free(a);
        return rc;
    }
    struct sample s;
    memset(&s, 0, sizeof s);
    s.label = -1;
    int64_t consumed = 0;
    int rc = 0;
    for (;;) {
        struct archive_entry *e;
        int st = archive_read_next_header(a, &e);
        if (st == ARCHIVE_EOF)
            break;
        if (st < ARCHIVE_WARN) {
            rc = tr_prepare_fail("%s: %s (a damaged or truncated tar?)", path,
                                 archive_error_string(a));
            break;
        }
        int64_t now = archive_filter_bytes(a, -1);
        tr_progress_add(r->progress, (uint64_t)(now - consumed));
        consumed = now;
        if (archive_entry_filetype(e) != AE_IFREG)
            continue;
        const char *name = archive_entry_pathname(e);
        if (!name)
            continue;
        /* WebDataset: the key is the path up to the first dot of the file
         * name; the rest is the member's extension */
        const char *base = strrchr(name, '/');
        base = base ? base + 1 : name;
        const char *dot = strchr(base, '.');
        if (!dot || base[0] == '.')
            continue;
        char key[1024];
        snprintf(key, sizeof key, "%.*s", (int)(dot - name), name);
        const char *ext = dot + 1;
        if (strcmp(key, s.key) != 0) {
            if ((rc = flush_sample(r, path, &s, val)) != 0)
                break;
            snprintf(s.key, sizeof s.key, "%s", key);
        }
        int is_image = strcasecmp(ext, "png") == 0 || strcasecmp(ext, "jpg") == 0 ||
                       strcasecmp(ext, "jpeg") == 0 || strcasecmp(ext, "webp") == 0;
        int is_cls = strcasecmp(ext, "cls") == 0;
        if (!is_image && !is_cls)
            continue; /* .json, .txt, ...: other fields of the sample */
        int64_t size = archive_entry_size(e);
        char where[2200];
        snprintf(where, sizeof where, "%s: %s", path, name);
        if (size < 0 || size > (int64_t)MAX_MEMBER_BYTES) {
            if ((rc = bad_record(r, where, "larger than 256 MiB: not an image prepare "
                                           "decodes")) != 0)
                break;
            continue;
        }
        unsigned char *data = malloc((size_t)size + 1);
        if (!data) {
            rc = tr_prepare_fail("out of memory");
            break;
        }
        la_ssize_t got = archive_read_data(a, data, (size_t)size);
        if (got != size) {
            free(data);
            rc = tr_prepare_fail("%s: %s (a truncated tar?)", where,
                                 got < 0 ? archive_error_string(a) : "member ends early");
            break;
        }
        data[size] = '\0';
        if (is_image) {
            free(s.image);
            s.image = data;
            s.image_size = (size_t)size;
            snprintf(s.image_member, sizeof s.image_member, "%s", name);
            continue;
        }
        char *end;
        const char *t = (const char *)data;
        while (isspace((unsigned char)*t))
            t++;
        errno = 0;
        long v = strtol(t, &end, 10);
        while (isspace((unsigned char)*end))
            end++;
        if (end == t || *end || errno || v < 0 || v >= TR_IMAGES_MAX_CLASSES)
            snprintf(s.cls_problem, sizeof s.cls_problem,
                     ".cls is not a class number from 0 to %d", TR_IMAGES_MAX_CLASSES - 1);
        else
            s.label = v;
        free(data);
    }
    if (rc == 0)
        rc = flush_sample(r, path, &s, val);
    free(s.image);
    archive_read_free(a);
    return rc;
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
    char **v = list_dir(path, &n);
    uint64_t total = 0;
    for (size_t i = 0; v && i < n; i++) {
        char *sub = tr_xasprintf("%s/%s", path, v[i]);
        total += input_bytes(sub, depth + 1);
        free(sub);
    }
    if (v)
        free_list(v, n);
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
    return is_tar(path) || is_dir(path);
}

int tr_prepare_images(const struct prepare_opts *o)
{
    double t0 = tr_now();
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
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return tr_prepare_fail("cannot create %s: %s", o->out_dir, strerror(errno));
    if (tr_prepare_claim_out_dir(o->out_dir) != 0)
        return -1;

    struct run r = {.o = o};
    size_t bytes = (size_t)o->image_size * (size_t)o->image_size * (size_t)o->channels;
    uint64_t per_shard = o->shard_images ? o->shard_images : (1ULL << 30) / bytes;
    if (per_shard < 1)
        per_shard = 1;
    r.train = (struct writer){.dir = o->out_dir, .prefix = "train", .size = o->image_size,
                              .channels = o->channels, .per_shard = per_shard};
    r.val = r.train;
    r.val.prefix = "val";
    r.square = tr_xcalloc(bytes, 1);
    r.copy = tr_xcalloc(bytes, 1);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    r.workers = o->workers > 0 ? o->workers : online > 0 ? (int)online : 1;
    if (r.workers > 64)
        r.workers = 64;
    r.batch_cap = bytes * BATCH <= BATCH_PIXEL_BYTES ? BATCH : (int)(BATCH_PIXEL_BYTES / bytes);
    if (r.batch_cap < r.workers)
        r.batch_cap = r.workers;
    r.batch = tr_xcalloc((size_t)r.batch_cap, sizeof *r.batch);
    for (int i = 0; i < r.batch_cap; i++)
        r.batch[i].pixels = tr_xcalloc(bytes, 1);

    int rc = 0;
    /* the classes: every training folder's subdirectories, sorted */
    for (int i = 0; i < o->n_inputs && rc == 0; i++)
        if (!is_tar(o->inputs[i]))
            rc = folder_classes(&r, o->inputs[i]);
    uint64_t total = 0;
    for (int i = 0; i < o->n_inputs; i++)
        total += input_bytes(o->inputs[i], 0);
    for (int i = 0; i < o->n_val_inputs; i++)
        total += input_bytes(o->val_inputs[i], 0);
    r.progress = tr_progress_start("decoding", total);
    for (int k = 0; k < 2 && rc == 0; k++) {
        const char **v = k ? o->val_inputs : o->inputs;
        int n = k ? o->n_val_inputs : o->n_inputs;
        for (int i = 0; i < n && rc == 0; i++)
            rc = is_tar(v[i]) ? prepare_tar(&r, v[i], k) : prepare_folder(&r, v[i], k);
    }
    if (rc == 0)
        rc = flush_batch(&r);
    if (r.progress)
        tr_progress_end(r.progress, rc == 0, 0);
    uint32_t classes = r.max_label;
    if (classes < r.cls.n)
        classes = (uint32_t)r.cls.n;
    if (rc == 0 && r.train.total == 0)
        rc = tr_prepare_fail("no training image could be read from the inputs%s",
                             r.bad ? " (every one was skipped)" : "");
    if (rc == 0 && o->n_val_inputs > 0 && r.val.total == 0)
        rc = tr_prepare_fail("no validation image could be read from the --val inputs");
    if (rc == 0)
        rc = writer_publish(&r.train, classes);
    if (rc == 0)
        rc = writer_publish(&r.val, classes);
    if (rc == 0) {
        tr_prepare_remove_stale_shards(o->out_dir, "train", r.train.n_shards);
        tr_prepare_remove_stale_shards(o->out_dir, "val", r.val.n_shards);
        rc = write_classes(&r, classes);
    }
    double seconds = tr_now() - t0;
    if (rc == 0)
        rc = write_json(&r, classes, seconds);
    if (rc == 0) {
        uint64_t images = r.train_originals + r.val.total;
        printf("trainrun prepare: %llu images in %u classes -> %llu training",
               (unsigned long long)images, classes, (unsigned long long)r.train_originals);
        if (o->augment_copies)
            printf(" (+%llu augmented copies)",
                   (unsigned long long)(r.train.total - r.train_originals));
        printf(" and %llu validation images of %dx%dx%d in %d shards, %.2f s (%.0f images/s): "
               "%s\n",
               (unsigned long long)r.val.total, o->image_size, o->image_size, o->channels,
               r.train.n_shards + r.val.n_shards, seconds, images / (seconds > 0 ? seconds : 1),
               o->out_dir);
        if (r.bad)
            printf("trainrun prepare: skipped %llu samples that did not decode "
                   "(--skip-bad-records; the first %d named above)\n",
                   (unsigned long long)r.bad, SAMPLES_SHOWN);
        if (r.ignored)
            printf("trainrun prepare: ignored %llu files that are not .png, .jpg, .jpeg or "
                   ".webp images in a class folder (the first: %s)\n",
                   (unsigned long long)r.ignored, r.first_ignored);
        if (r.val.total == 0)
            printf("trainrun prepare: note: no validation images (--val-fraction 0 and no "
                   "--val): the run's evaluations will have nothing to read\n");
    }
    writer_free(&r.train);
    writer_free(&r.val);
    for (size_t i = 0; i < r.cls.n; i++)
        free(r.cls.name[i]);
    free(r.cls.name);
    for (int i = 0; i < r.batch_cap; i++) {
        free(r.batch[i].pixels);
        free(r.batch[i].data); /* queued when an error stopped prepare */
        free(r.batch[i].where);
        free(r.batch[i].split_name);
    }
    free(r.batch);
    free(r.square);
    free(r.copy);
    return rc;
}
