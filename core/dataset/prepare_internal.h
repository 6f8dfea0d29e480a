/* What the dataset room's files share beyond dataset.h: the output
 * directory's claim, stale-shard removal and publishing (prepare_output.c);
 * reading inputs and JSONL records (prepare_input.c) and writing TRTOKENS
 * shards (prepare_shards.c), which every path that makes token shards uses;
 * tokenizing documents (prepare_tokenize.c) and training a tokenizer
 * (prepare_train.c).  Private to the dataset room. */
#ifndef TR_PREPARE_INTERNAL_H
#define TR_PREPARE_INTERNAL_H

#include "dataset.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

struct tr_json;

/* Make OUTDIR ours (created by the caller): refused, with a message, when it
 * holds prepare's file names that no prepare wrote.  0 or -1. */
int tr_prepare_claim_out_dir(const char *dir);

/* Flush, fsync and close f (written at tmp), then rename it to path; on any
 * failure tmp is removed.  0 or -1 (message on stderr). */
int tr_prepare_publish(const char *tmp, const char *path, FILE *f);

/* Write DIR/NAME from memory, published whole (tmp + rename): the
 * tokenizer.json and tokenizer_config.json copied into OUTDIR.  0 or -1. */
int tr_prepare_write_copy(const char *dir, const char *name, const unsigned char *data,
                          size_t size);

/* prepare.json's "inputs" line. */
void tr_prepare_json_inputs(FILE *f, const struct prepare_opts *o);

/* Remove <prefix>_NNNNNN.bin shards numbered `written` and up (left by an
 * earlier, longer run) from a directory tr_prepare_claim_out_dir made ours;
 * regular files only. */
void tr_prepare_remove_stale_shards(const char *dir, const char *prefix, int written);

/* Remove DIR/NAME, a regular file left by an earlier run (a tokenizer this run does not
 * use), saying so; only in a directory tr_prepare_claim_out_dir made ours. */
void tr_prepare_remove_stale_file(const char *dir, const char *name);

/* "trainrun prepare: error: ..." from a va_list (tr_prepare_fail's body). */
void tr_prepare_vfail(const char *fmt, va_list ap);

/* ---- inputs (prepare_input.c) ------------------------------------------------ */

/* Read the file at path whole into *data (malloc'd, NUL-terminated one past
 * *size, free() it): plain, gzip or zstd, told by the file's first bytes,
 * not its name.  0 or -1 (message on stderr naming the file). */
int tr_prepare_read_input(const char *path, unsigned char **data, size_t *size);

/* 1 when path names a JSONL file (.jsonl, .jsonl.gz or .jsonl.zst): one
 * JSON object per line. */
int tr_prepare_is_jsonl(const char *path);

/* Records of a JSONL file already in memory, one JSON object per line;
 * blank lines are skipped, so are a UTF-8 byte order mark and the "\r" of
 * "\r\n". */
struct tr_jsonl {
    const char *path;                /* for messages */
    const unsigned char *at, *end;
    long line;                       /* the line of the record last returned, from 1 */
    char error[512];                 /* why the last tr_jsonl_next returned -1 */
};

void tr_jsonl_init(struct tr_jsonl *it, const char *path, const unsigned char *data, size_t size);

/* The next record: 1 with *rec set (an object; tr_json_free it), 0 after
 * the last, -1 when the line it->line is not JSON or not an object: it->error
 * then says so as "PATH:LINE: ...", and the iterator has moved past that
 * line, so a caller that skips bad records simply calls again. */
int tr_jsonl_next(struct tr_jsonl *it, struct tr_json **rec);

/* ---- token shards (prepare_shards.c) ----------------------------------------- */

/* Writes DIR/PREFIX_000000.bin, DIR/PREFIX_000001.bin, ... of at most
 * shard_tokens tokens each (see include/trainrun/tokens.h).  Tokens are
 * uint16 when vocab <= 65536, else uint32.  With a loss mask each shard is
 * TRTOKENS version 2 with TR_TOKENS_LOSS_MASK; without, version 1.  Shards
 * are written to a temporary name and renamed when finished, so a reader
 * never sees half a shard.  Errors go to stderr ("trainrun prepare: error:"). */
struct tr_shard_writer;

/* NULL (message on stderr) when out of memory or vocab is 0. */
struct tr_shard_writer *tr_shard_writer_open(const char *dir, const char *prefix,
                                             uint64_t shard_tokens, uint32_t vocab,
                                             int with_mask);

/* Append token id (< vocab, else -1) with its mask bit: trained = 1 when
 * the token is a target the loss is taken on (ignored without a mask).  The
 * first put after a full shard finishes that shard and opens the next. */
int tr_shard_writer_put(struct tr_shard_writer *w, uint32_t id, int trained);

/* Count n more bytes of text (UTF-8) as encoded by the shard holding the
 * token put last (the next shard before any put): its header's text_bytes.
 * Callers add each token's bytes right after putting it, so that every
 * shard's count is its own. */
void tr_shard_writer_add_text_bytes(struct tr_shard_writer *w, uint64_t n);

/* Finish the open shard (published under its name): 0, or -1 when it could
 * not be written (it is removed).  The counts below are then final. */
int tr_shard_writer_finish(struct tr_shard_writer *w);
/* Free w; a shard still unfinished (after an error) is removed, finished
 * ones stay.  NULL is fine. */
void tr_shard_writer_free(struct tr_shard_writer *w);

int tr_shard_writer_shards(const struct tr_shard_writer *w);        /* finished so far */
uint64_t tr_shard_writer_tokens(const struct tr_shard_writer *w);   /* put so far */
uint64_t tr_shard_writer_text_bytes(const struct tr_shard_writer *w);
int tr_shard_writer_token_bytes(const struct tr_shard_writer *w);   /* 2 or 4 */

/* ---- tokenizing documents (prepare_tokenize.c) ------------------------------ */

struct docs;
struct prepare_progress;

/* A tokenizer.json, loaded once per worker thread (a tr_tokenizer is not
 * thread-safe), with what prepare records about it. */
struct prepare_tokenizer {
    const char *path;           /* the tokenizer.json (in a directory --tokenizer named) */
    char *owned_path;
    unsigned char *file;        /* the file's bytes (copied into OUTDIR) */
    size_t file_size;
    uint64_t hash;              /* 64-bit FNV-1a of the file */
    char *config_path;          /* tokenizer_config.json beside it, or NULL */
    unsigned char *config;
    size_t config_size;
    struct tr_tokenizer **tok;  /* one per worker */
    int workers;
    uint32_t vocab;
    int32_t eos;                /* after each document; -1: none */
    char *eos_text;             /* its text (NULL when out of memory) */
    const char *eos_from;       /* where the EOS was found, for the report */
    unsigned char *token_len;   /* bytes of text each id decodes to (capped at 255);
                                   0 for the post-processor's and the EOS token */
};

/* Load o->tokenizer for `workers` threads and find the EOS (--eos, else
 * tokenizer_config.json's eos_token, else <|endoftext|>, <|end_of_text|>
 * or </s>).  0 or -1 (message on stderr). */
int tr_prepare_tokenizer_load(struct prepare_tokenizer *pt, const struct prepare_opts *o,
                              int workers);
void tr_prepare_tokenizer_free(struct prepare_tokenizer *pt);

/* Encode the kept documents of d->v[from, to) on pt->workers threads
 * (each document with the post-processor's special tokens, then the EOS)
 * and put them into w in document order, so the shards are the same for
 * every worker count.  inputs names the files for messages.  0 or -1. */
int tr_prepare_encode_docs(struct prepare_tokenizer *pt, const struct docs *d, size_t from,
                           size_t to, const char *const *inputs, struct tr_shard_writer *w,
                           struct prepare_progress *progress);

/* Progress over `total` bytes of text: a bar on stderr redrawn at most ten
 * times a second when stderr is a terminal; at the end (ok) a summary line
 * with MB/s on stdout.  end frees p (NULL is fine). */
struct prepare_progress *tr_prepare_progress_start(uint64_t total, int workers);
void tr_prepare_progress_add(struct prepare_progress *p, uint64_t bytes);
void tr_prepare_progress_draw(struct prepare_progress *p, int force);
void tr_prepare_progress_end(struct prepare_progress *p, int ok);

/* --train-tokenizer (prepare_train.c): a byte-level BPE of `vocab` tokens trained on the kept
 * documents of d->v[0, to) (the training split), written as OUTDIR/tokenizer.json (a stale
 * tokenizer_config.json there is removed); inputs names the files for messages.  OUTDIR must
 * be claimed.  0 or -1 (message on stderr). */
struct docs;
int tr_prepare_train_tokenizer(const char *out_dir, uint64_t vocab, const struct docs *d,
                               size_t to, const char *const *inputs);

#endif
