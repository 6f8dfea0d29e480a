/* LD_PRELOAD shim for tests: write() fails with ENOSPC ("disk full") on
 * files whose path contains any of the comma-separated substrings in
 * TR_ENOSPC_MATCH, as a full disk would during a checkpoint. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

ssize_t write(int fd, const void *buf, size_t count)
{
    static ssize_t (*real_write)(int, const void *, size_t);
    if (!real_write)
        real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (fd > 2 && matches(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_write(fd, buf, count);
}
