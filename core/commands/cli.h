/*
 * The command line's shared pieces: the usage text, and the strict reading
 * of overrides and flag values every subcommand uses (usage errors exit 2).
 */
#ifndef TR_CLI_H
#define TR_CLI_H

#include <stdint.h>
#include <stdio.h>

void tr_cli_usage(FILE *out);

/* key=value with a key of names separated by single dots; else a usage
 * error on stderr, after `command` ("plan: "), and 0. */
int tr_cli_override_ok(const char *arg, const char *command);
/* argv[first..] as the recipe's overrides (*overrides, *n; the caller
 * frees the array); flags consumed are "-", any other flag is an error (-1). */
int tr_cli_overrides(int argc, char **argv, int first, const char ***overrides, int *n);

/* A flag's value, all of its text, in range; else a usage error and -1. */
int tr_cli_flag_int(const char *flag, const char *text, long long lo, long long hi, long long *out);
int tr_cli_flag_u64(const char *flag, const char *text, uint64_t *out);
int tr_cli_flag_positive(const char *flag, const char *text, double *out);
int tr_cli_flag_temperature(const char *flag, const char *text, double *out); /* 0 or more */

/* The subcommands main.c runs itself (subcommands.c); argv as main's. */
int tr_cmd_show(int argc, char **argv);
int tr_cmd_plugins(int argc, char **argv);
int tr_cmd_sample(int argc, char **argv);
int tr_cmd_export(int argc, char **argv);
void tr_sample_help(FILE *out);

#endif
