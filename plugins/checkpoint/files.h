/*
 * File helpers the checkpoint backends share (plugins link nothing from the
 * core, so they live here as static functions): write everything, fsync a
 * directory, remove a checkpoint-shaped directory, create parents.
 * All return 0, or -1 with errno set.
 */
#ifndef TR_CHECKPOINT_FILES_H
#define TR_CHECKPOINT_FILES_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_all(int fd, const void *data, size_t size)
{
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

/* Some filesystems cannot fsync directories (EINVAL); that is not an error. */
static int fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) {
        errno = e;
        return -1;
    }
    return 0;
}

/* Remove a checkpoint or staging directory: files one level deep, then itself. */
static int remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int rc = 0, e = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), ent->d_name, 0) != 0 && rc == 0) {
            rc = -1;
            e = errno;
        }
    }
    closedir(d);
    if (rc == 0 && rmdir(path) != 0) {
        rc = -1;
        e = errno;
    }
    errno = e;
    return rc;
}

static int mkdir_p(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int rc = mkdir(path, 0755);
        *p = '/';
        if (rc != 0 && errno != EEXIST)
            return -1;
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

#endif
