/*
 * What the checkpoint backends share (plugins link nothing from the core, so
 * it lives here as static inline functions, which a file using only some of
 * them compiles without unused-function warnings): the rules for checkpoint and blob
 * names and the newest-first order of listings; write everything, write a
 * whole file durably, fsync a directory, create and remove directories
 * trainrun owns (a marker file inside), create parents, and read the name
 * back out of a staging entry.
 * The file functions return 0, or -1 with errno set (write_file: -2 too).
 */
#ifndef TR_CHECKPOINT_FILES_H
#define TR_CHECKPOINT_FILES_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Blob names become a plain file name in a checkpoint directory (and, in
 * s3, the last component of a key and a line of the MANIFEST): not empty,
 * no '/', no control characters, not . or .. */
static inline int valid_blob(const char *s)
{
    if (!s || !s[0] || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p == '/' || *p < 0x20 || *p == 0x7f)
            return 0;
    return 1;
}

/* Checkpoint names additionally must not collide with LATEST or with the
 * staging entries, which start with '.'. */
static inline int valid_name(const char *s)
{
    return valid_blob(s) && s[0] != '.' && strcmp(s, "LATEST") != 0;
}

/* qsort order of checkpoint names: newest (largest) first. */
static inline int newest_first(const void *a, const void *b)
{
    return strcmp(*(char *const *)b, *(char *const *)a);
}

/* The checkpoint name inside a staging entry "<prefix><name>-<pid>", newly
 * allocated; NULL when out of memory or the entry has no "-<pid>". */
static inline char *staged_name(const char *entry, const char *prefix)
{
    char *name = strdup(entry + strlen(prefix));
    char *dash = name ? strrchr(name, '-') : NULL;
    if (!dash) {
        free(name);
        return NULL;
    }
    *dash = '\0';
    return name;
}

/* What to do about a failed write, for the end of a message: errno's usual
 * causes, naming the option that chose the directory (a string literal). */
#define DISK_HINT(errnum, option)                                                                 \
    ((errnum) == ENOSPC || (errnum) == EDQUOT                                                     \
         ? " (free disk space, or point " option " at a larger disk)"                            \
     : (errnum) == EACCES || (errnum) == EPERM || (errnum) == EROFS                               \
         ? " (make it writable, or point " option " elsewhere)"                                  \
         : "")

static inline int write_all(int fd, const void *data, size_t size)
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

/* The end of writing file path through fd (failed: a write already failed,
 * with errno e): fsync'd when sync and nothing failed, closed, and removed
 * when anything failed.  0, or -2 with errno set. */
static inline int finish_file(int fd, const char *path, int failed, int e, int sync)
{
    if (!failed && sync && fsync(fd) != 0) {
        failed = 1;
        e = errno;
    }
    /* close() reports delayed write errors on some filesystems (NFS) */
    if (close(fd) != 0 && !failed) {
        failed = 1;
        e = errno;
    }
    if (failed) {
        unlink(path);
        errno = e;
        return -2;
    }
    return 0;
}

/* A whole file: created (exclusive: it must not exist yet; else replaced),
 * written, fsync'd when sync, closed.  -1: it could not be created; -2: it
 * was, but writing failed, and it is removed again; errno says why. */
static inline int write_file(const char *path, const void *data, size_t size, int exclusive,
                             int sync)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC), 0644);
    if (fd < 0)
        return -1;
    int failed = write_all(fd, data, size) != 0;
    return finish_file(fd, path, failed, errno, sync);
}

/* Some filesystems cannot fsync directories (EINVAL); that is not an error. */
static inline int fsync_dir(const char *path)
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

/* The marker file trainrun writes into every checkpoint and staging
 * directory it creates.  A directory is removed only when it is a real
 * directory (not a symlink) holding this marker, so pointing checkpoint.dir
 * at a directory of other files never deletes them, however their names
 * look.  Blob names must not take it. */
#define TR_OWNER_MARK ".trainrun-checkpoint"

/* mkdir, then the marker inside: a directory trainrun may later remove. */
static inline int make_owned_dir(const char *path)
{
    if (mkdir(path, 0755) != 0)
        return -1;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int fd = dfd < 0 ? -1
                     : openat(dfd, TR_OWNER_MARK, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int rc = fd >= 0 && write_all(fd, "trainrun\n", 9) == 0 ? 0 : -1;
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (dfd >= 0)
        close(dfd);
    if (rc != 0) {
        rmdir(path); /* empty unless the marker half-landed; then it stays */
        errno = e;
    }
    return rc;
}

/* An open descriptor of path when it is a directory trainrun created (not
 * a symlink, holding the marker as a regular file); else -1 with errno
 * EPERM (not ours) or open()'s errno. */
static inline int open_owned_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstatat(fd, TR_OWNER_MARK, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

static inline int is_owned_dir(const char *path)
{
    int fd = open_owned_dir(path);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

/* Remove a checkpoint or staging directory trainrun created: its files one
 * level deep (a symlink is removed, never followed), the marker last, then
 * itself.  A directory without the marker is left alone (errno EPERM); a
 * subdirectory inside is not trainrun's and makes the removal stop short
 * (errno ENOTEMPTY), the marker kept so a later attempt still knows it. */
static inline int remove_tree(const char *path)
{
    int fd = open_owned_dir(path);
    if (fd < 0)
        return -1;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    int rc = 0, e = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0 ||
            strcmp(ent->d_name, TR_OWNER_MARK) == 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), ent->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISDIR(st.st_mode)) {
            if (rc == 0) {
                rc = -1;
                e = ENOTEMPTY;
            }
            continue;
        }
        if (unlinkat(dirfd(d), ent->d_name, 0) != 0 && rc == 0) {
            rc = -1;
            e = errno;
        }
    }
    if (rc == 0 && unlinkat(dirfd(d), TR_OWNER_MARK, 0) != 0 && errno != ENOENT) {
        rc = -1;
        e = errno;
    }
    closedir(d);
    if (rc == 0 && rmdir(path) != 0) {
        rc = -1;
        e = errno;
    }
    errno = e;
    return rc;
}

static inline int mkdir_p(char *path)
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
