/* What prepare.c (the command line, the output directory), prepare_text.c
 * and prepare_csv.c (the two formats) share: the parsed options, the output
 * directory's claim, stale-shard removal and publishing, and each format's
 * entry.  Private to the commands room. */
#ifndef TR_PREPARE_INTERNAL_H
#define TR_PREPARE_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#define SAMPLES_SHOWN 5 /* duplicates shown per kind */

struct prepare_opts {
    const char **inputs;
    int n_inputs;
    const char *out_dir;
    const char *format;        /* "text", "csv", or NULL: from the inputs' names */
    const char *tokenizer;     /* "byte" or "char" */
    uint64_t shard_tokens;
    double val_fraction;
    const char *dedup;         /* "exact", "near" or "none" */
    double near_threshold;
    const char *doc_separator; /* "blank-line" or "line" */
    int header;                /* CSV: the first line of each input names the columns */
};

/* Make OUTDIR ours (created by the caller): refused, with a message, when it
 * holds prepare's file names that no prepare wrote.  0 or -1. */
int tr_prepare_claim_out_dir(const char *dir);

/* Flush, fsync and close f (written at tmp), then rename it to path; on any
 * failure tmp is removed.  0 or -1 (message on stderr). */
int tr_prepare_publish(const char *tmp, const char *path, FILE *f);

/* prepare.json's "inputs" line. */
void tr_prepare_json_inputs(FILE *f, const struct prepare_opts *o);

/* Remove <prefix>_NNNNNN.bin shards numbered `written` and up (left by an
 * earlier, longer run) from a directory tr_prepare_claim_out_dir made ours;
 * regular files only. */
void tr_prepare_remove_stale_shards(const char *dir, const char *prefix, int written);

/* "trainrun prepare: error: ..." from a va_list (tr_prepare_fail's body). */
void tr_prepare_vfail(const char *fmt, va_list ap);

/* The text path (prepare_text.c): read, split, deduplicate, write the
 * shards and prepare.json.  0 or -1 (messages on stderr). */
int tr_prepare_text(const struct prepare_opts *o);

/* The CSV path (prepare_csv.c): check, dedup and write OUTDIR/data.csv and
 * prepare.json.  0 or -1 (messages on stderr). */
int tr_prepare_csv(const struct prepare_opts *o);

#endif
