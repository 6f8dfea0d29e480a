/*
 * A test's scratch directory removed with everything in it (the tests that
 * make one in TMPDIR leave nothing behind).  Included once per test program.
 */
#ifndef TR_TESTS_REMOVE_TREE_H
#define TR_TESTS_REMOVE_TREE_H

#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

static inline int tr_test_remove_entry(const char *path, const struct stat *st, int flag,
                                       struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* dir and all below it; nothing when dir is empty or gone */
static inline void tr_test_remove_tree(const char *dir)
{
    if (dir && *dir)
        nftw(dir, tr_test_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
