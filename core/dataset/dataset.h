/* The dataset room's face: what `trainrun prepare` (commands/prepare.c,
 * which parses the command line) hands the pipeline, and each format's
 * entry.  The pipeline reads the inputs, deduplicates, tokenises or
 * decodes, and writes the shards and prepare.json into OUTDIR; it never
 * calls back into the command.  Its files share prepare_internal.h beside
 * this header. */
#ifndef TR_DATASET_H
#define TR_DATASET_H

#include <stdint.h>

#define SAMPLES_SHOWN 5 /* duplicates shown per kind */

struct prepare_opts {
    const char **inputs;
    int n_inputs;
    const char *out_dir;
    const char *format;        /* "text", "csv", or NULL: from the inputs' names */
    const char *tokenizer;     /* "byte", "char" or the path of a tokenizer.json */
    uint64_t train_tokenizer;  /* --train-tokenizer N: a BPE of N tokens trained into
                                  OUTDIR/tokenizer.json, which tokenizer then names; 0: none */
    const char *text_field;    /* JSONL: the string field holding a document */
    const char *eos;           /* tokenizer.json: the token after each document,
                                  "none", or NULL (found in the files) */
    int workers;               /* tokenizing threads; 0: the online CPUs */
    int skip_bad_records;      /* JSONL: skip (and count) bad records instead of failing */
    uint64_t shard_tokens;
    double val_fraction;
    const char *dedup;         /* "exact", "near" or "none" */
    double near_threshold;
    const char *doc_separator; /* "blank-line" or "line" */
    int header;                /* CSV: the first line of each input names the columns */
    /* --format images (prepare_images.c) */
    const char **val_inputs;   /* --val: validation folders or tars (then no val_fraction) */
    int n_val_inputs;
    int val_fraction_set;      /* --val-fraction was given */
    int image_size;            /* --size: the side of the square images (0: not given) */
    int channels;              /* --channels: 3 (RGB) or 1 (grey) */
    int augment_copies;        /* --augment-copies: extra cropped/flipped training copies */
    int augment_pad;           /* --augment-pad: their crop's padding (-1: size / 8) */
    int augment_flip;          /* --augment-flip: copies may be mirrored */
    uint64_t seed;             /* --seed: the copies' draws and the split's hash */
    uint64_t shard_images;     /* --shard-images: images per shard (0: about 1 GiB) */
};

/* "trainrun prepare: error: ..." on stderr; returns -1.  Every file of
 * prepare shares it. */
int tr_prepare_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The text path (prepare_text.c): read, split, deduplicate, write the
 * shards and prepare.json.  0 or -1 (messages on stderr). */
int tr_prepare_text(const struct prepare_opts *o);

/* The CSV path (prepare_csv.c): check, dedup and write OUTDIR/data.csv and
 * prepare.json.  0 or -1 (messages on stderr). */
int tr_prepare_csv(const struct prepare_opts *o);

/* --format instruct (prepare_chat.c): prompt/response or chat messages
 * JSONL records, encoded with o->tokenizer (a tokenizer.json), into shards
 * with a loss mask that trains on the responses only, and prepare.json.
 * 0 or -1 (messages on stderr). */
int tr_prepare_instruct(const struct prepare_opts *o);

/* --format images (prepare_images.c): image folders and WebDataset tars
 * decoded, resized and written as TRIMAGES shards, classes.txt and
 * prepare.json.  0 or -1 (messages on stderr). */
int tr_prepare_images(const struct prepare_opts *o);
/* 1 when path is a folder or a tar shard (.tar, .tar.gz, ...): what
 * --format images reads, and what makes prepare guess that format. */
int tr_prepare_is_image_input(const char *path);

#endif
