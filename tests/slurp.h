/*
 * A file read whole into a malloc'd, NUL-terminated buffer (*len: its
 * bytes), the test failing when it cannot be read.  Included once per test
 * program.
 */
#ifndef TR_TESTS_SLURP_H
#define TR_TESTS_SLURP_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

static inline char *tr_test_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    s[n] = 0;
    *len = (size_t)n;
    return s;
}

#endif
