/* What prepare.c (the command, text) and prepare_csv.c (CSV) share: the
 * parsed options and the output directory's claim and publishing.  Private
 * to the commands room. */
#ifndef TR_PREPARE_INTERNAL_H
#define TR_PREPARE_INTERNAL_H

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

/* The CSV path (prepare_csv.c): check, dedup and write OUTDIR/data.csv and
 * prepare.json.  0 or -1 (messages on stderr). */
int tr_prepare_csv(const struct prepare_opts *o);

#endif
