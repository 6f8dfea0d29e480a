/*
 * Run a command's main function with its stdout captured: what `trainrun
 * plan` or `trainrun topo` would print, for the tests to read.
 */
#ifndef TR_TESTS_CAPTURE_H
#define TR_TESTS_CAPTURE_H

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* main_fn(argc, argv) with stdout in a temporary file; returns what it
 * printed (malloc'd) and its exit code in *code. */
static char *capture_stdout(int (*main_fn)(int, char **), int argc, char **argv, int *code)
{
    fflush(stdout);
    FILE *tmp = tmpfile();
    cr_assert_not_null(tmp);
    int saved = dup(STDOUT_FILENO);
    dup2(fileno(tmp), STDOUT_FILENO);
    *code = main_fn(argc, argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    fseek(tmp, 0, SEEK_END);
    long size = ftell(tmp);
    rewind(tmp);
    char *text = calloc(1, (size_t)size + 1);
    cr_assert_eq(fread(text, 1, (size_t)size, tmp), (size_t)size);
    fclose(tmp);
    return text;
}

#endif
