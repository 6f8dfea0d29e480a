/*
 * What the plugin tests share: a 64-byte-aligned allocator for their
 * tr_host, and a scratch directory per test with helpers to name and fill
 * files in it.  Each test program includes this once.
 */
#ifndef TR_TESTS_SCRATCH_H
#define TR_TESTS_SCRATCH_H

#include <criterion/criterion.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tr_host.alloc: 64-byte aligned, as the ABI promises plugins */
static void *test_alloc(size_t size)
{
    return aligned_alloc(64, (size + 63) / 64 * 64);
}

/* The current test's scratch directory. */
static char tmp[256];

/* Create tmp as $TMPDIR/<prefix>-XXXXXX. */
static void tmp_create(const char *prefix)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmp, sizeof tmp, "%s/%s-XXXXXX", base, prefix);
    cr_assert(mkdtemp(tmp), "mkdtemp: %s", strerror(errno));
}

static int tmp_remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_tmp(void)
{
    nftw(tmp, tmp_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* tmp/name, in a buffer that lives for the test */
static const char *tmp_path(const char *name)
{
    static char paths[64][512];
    static int next;
    char *p = paths[next++ % 64];
    snprintf(p, sizeof paths[0], "%s/%s", tmp, name);
    return p;
}

static void write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, size, f), size);
    fclose(f);
}

static void write_text(const char *path, const char *text)
{
    write_file(path, text, strlen(text));
}

#endif
