/* LD_PRELOAD shim for tests: write() fails with ENOSPC ("disk full") on
 * files whose path contains any of the comma-separated substrings in
 * TR_ENOSPC_MATCH, as a full disk would during a checkpoint.
 *
 * TR_ENOSPC_AFTER=N lets the first N bytes written to matching files (all
 * of them together, in this process) through and fails the rest: the disk
 * fills while the run is going, and the write that crosses the limit is cut
 * short as a real one would be.  Once the limit is reached, fsync() and
 * fdatasync() of matching files fail too. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long long written; /* bytes let through to matching files */

static int matches(int fd)
{
    const char *match = getenv("TR_ENOSPC_MATCH");
    if (!match || !*match)
        return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return 0;
    path[n] = 0;
    char list[1024];
    snprintf(list, sizeof list, "%s", match);
    char *save = NULL;
    for (char *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save))
        if (strstr(path, m))
            return 1;
    return 0;
}

/* Bytes still allowed to matching files: all of them when TR_ENOSPC_AFTER
 * is unset (then every write fails). */
static long long room(void)
{
    const char *after = getenv("TR_ENOSPC_AFTER");
    if (!after || !*after)
        return 0;
    long long limit = atoll(after);
    return limit > written ? limit - written : 0;
}

ssize_t write(int fd, const void *buf, size_t count)
{
    static ssize_t (*real_write)(int, const void *, size_t);
    if (!real_write)
        real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (fd > 2 && count > 0 && matches(fd)) {
        long long left = room();
        if (left <= 0) {
            errno = ENOSPC;
            return -1;
        }
        ssize_t n = real_write(fd, buf, (size_t)left < count ? (size_t)left : count);
        if (n > 0)
            written += n;
        return n;
    }
    return real_write(fd, buf, count);
}

static int sync_fails(int fd)
{
    const char *after = getenv("TR_ENOSPC_AFTER");
    return fd > 2 && after && *after && room() <= 0 && matches(fd);
}

int fsync(int fd)
{
    static int (*real_fsync)(int);
    if (!real_fsync)
        real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (sync_fails(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_fsync(fd);
}

int fdatasync(int fd)
{
    static int (*real_fdatasync)(int);
    if (!real_fdatasync)
        real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (sync_fails(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_fdatasync(fd);
}
