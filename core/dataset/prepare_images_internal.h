/* What the files of `prepare --format images` share: prepare_images.c (the command and the
 * run: samples decoded a batch at a time, written in input order), prepare_images_read.c
 * (folders and WebDataset tars read into the run) and prepare_images_writer.c (the TRIMAGES
 * shards).  Private to the dataset room. */
#ifndef TR_PREPARE_IMAGES_INTERNAL_H
#define TR_PREPARE_IMAGES_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <trainrun/images.h>

struct prepare_opts;
struct tr_progress;

/* A tar member larger than this is not an image prepare decodes. */
#define MAX_MEMBER_BYTES (256u << 20)

/* ---- the shard writer (prepare_images_writer.c) ------------------------------ */

struct shard {
    char *tmp, *path;
    uint64_t count, checksum;
};

struct image_writer {
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

/* Append one image of size x size x channels bytes and its label; a full shard is finished
 * and the next opened.  0 or -1 (message on stderr). */
int image_writer_put(struct image_writer *w, const unsigned char *pixels, uint32_t label);
/* Write every shard's header (now that `classes` is known), then publish them under their
 * names.  0 or -1. */
int image_writer_publish(struct image_writer *w, uint32_t classes);
/* Close and free; shards not published are removed. */
void image_writer_free(struct image_writer *w);

/* ---- the run (prepare_images.c) ---------------------------------------------- */

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
    struct image_writer train, val;
    struct classes cls;
    uint32_t max_label;         /* largest label seen, +1 (0: none) */
    unsigned char *square;      /* size x size x channels */
    unsigned char *copy;
    uint64_t train_originals;   /* training images before copies: the copies' key */
    uint64_t bad, ignored;
    char first_ignored[512];
    struct tr_progress *progress; /* the bar over the inputs' bytes */
};

/* A file or tar member that did not decode: stop naming it, or with --skip-bad-records
 * count it and show the first few.  0 or -1. */
int images_bad_record(struct run *r, const char *where, const char *why);
/* Decode the queued batch (on r->workers threads) and write it in order.  0 or -1. */
int images_flush_batch(struct run *r);
/* Queue one encoded sample (data becomes the batch's); a full batch is decoded and
 * written.  0 or -1. */
int images_put_sample(struct run *r, const char *where, const char *split_name,
                      unsigned char *data, size_t size, uint32_t label, int val);

/* ---- the inputs (prepare_images_read.c) -------------------------------------- */

int images_is_dir(const char *path);
/* Entries of a directory, sorted by byte value, hidden names left out; NULL when it cannot
 * be read.  Freed by images_free_list. */
char **images_list_dir(const char *path, size_t *n);
void images_free_list(char **v, size_t n);
/* The class subdirectories of a folder input, added to r->cls.  0 or -1. */
int images_folder_classes(struct run *r, const char *root);
/* Every image of a folder input (one subdirectory per class), or of a WebDataset tar, into
 * the run, as training or (val) validation samples.  0 or -1. */
int images_prepare_folder(struct run *r, const char *root, int val);
int images_prepare_tar(struct run *r, const char *path, int val);

#endif
