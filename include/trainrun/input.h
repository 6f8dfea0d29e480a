/*
 * Opening a file trainrun reads: a recipe, a config.json, weights, a shard,
 * a text or CSV, a tokenizer, a checkpoint's files.  Every one must be a
 * regular file: a FIFO (or a socket, a terminal, a tape) named by mistake
 * would block open() or the first read() forever, and a directory opens but
 * reads as nonsense.  So the file is opened with O_NONBLOCK, which never
 * waits for a FIFO's writer, checked with fstat(), and only then read (with
 * O_NONBLOCK cleared again).  Core and plugins open their inputs through
 * these; include it to read files the same way in your own plugin.
 *
 *   tr_input_open(path)      a file descriptor, or -1 with errno set
 *   tr_input_fopen(path)     the same as a FILE * ("rb"), or NULL
 *   tr_input_strerror(e)     the text for errno e, including the two below
 *
 * errno after a refusal: EISDIR for a directory, TR_INPUT_ENOTREG for
 * anything else that is not a regular file.
 */
#ifndef TRAINRUN_INPUT_H
#define TRAINRUN_INPUT_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* errno: the path is a FIFO, a socket or a device; far above the system's errno values */
#define TR_INPUT_ENOTREG 0x7472

static inline int tr_input_open(const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    int e = 0;
    if (fstat(fd, &st) != 0)
        e = errno;
    else if (S_ISDIR(st.st_mode))
        e = EISDIR;
    else if (!S_ISREG(st.st_mode))
        e = TR_INPUT_ENOTREG;
    else {
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
            e = errno;
    }
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static inline FILE *tr_input_fopen(const char *path)
{
    int fd = tr_input_open(path);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

static inline const char *tr_input_strerror(int e)
{
    if (e == TR_INPUT_ENOTREG)
        return "not a regular file (a FIFO, a socket or a device: reading it could block "
               "forever); give the path of the file itself";
    return strerror(e);
}

#endif
