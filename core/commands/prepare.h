/*
 * `trainrun prepare`: turns raw text into token shards the tokens data
 * plugin reads (documents split, deduplicated, tokenised, sharded), or
 * checks and cleans a CSV file for the csv data plugin.
 *
 *   trainrun prepare INPUT... -o OUTDIR [--format text|csv] [--tokenizer byte|char|FILE]
 *       [--eos TOKEN|none] [--workers N] [--text-field NAME] [--skip-bad-records]
 *       [--shard-tokens N] [--val-fraction F] [--dedup exact|near|none]
 *       [--near-threshold T] [--doc-separator blank-line|line] [--header]
 */
#ifndef TR_PREPARE_H
#define TR_PREPARE_H

#include <stdio.h>

/* argv[0] is "prepare".  Prints its report on stdout and errors on stderr;
 * returns an exit code (0 done, 1 error, 2 usage) and never exits. */
int tr_prepare_main(int argc, char **argv);

/* The usage text of `trainrun prepare --help` (and `trainrun help prepare`). */
void tr_prepare_help(FILE *out);

#endif
