/*
 * What the file-backed data sources (csv, idx, text, tokens) share.  Each
 * plugin is its own shared object and links nothing from the core, so these
 * are static functions compiled into every plugin that includes this file;
 * one copy of the source, one behaviour.
 *
 *   data_fail_open    the "cannot open" error, naming the current directory
 *                     for a relative path and the option to check
 *   data_gz_message   zlib's error message without the path it starts with
 *                     (only where <zlib.h> was included first)
 *   data_gzopen       open a regular file (trainrun/input.h) for zlib, plain or gzip'd
 *                     (only where <zlib.h> was included first)
 *   data_map_file     map a whole regular, non-empty file read-only
 *   data_le32         a little-endian uint32
 *   data_info         fill the info() answer
 *   data_check_read   read()'s argument checks: a known split, every index
 *                     inside it
 *
 * Messages start with "<who> data: ", who being the plugin's name.
 */
#ifndef TR_DATA_COMMON_H
#define TR_DATA_COMMON_H

#include <trainrun/input.h>
#include <trainrun/plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int data_fail_open(tr_err *err, const char *who, const char *option, const char *path,
                          int errnum)
{
    const char *why = errnum ? tr_input_strerror(errnum) : "unknown error";
    if (path[0] == '/')
        return tr_fail(err, "%s data: cannot open %s: %s; check data.%s", who, path, why,
                       option);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        snprintf(cwd, sizeof cwd, "?");
    return tr_fail(err,
                   "%s data: cannot open %s: %s (a relative path is relative to the current "
                   "directory, %s); check data.%s",
                   who, path, why, cwd, option);
}

#ifdef ZLIB_H
/* The file for zlib (a plain file reads as it is), or NULL with *errnum
 * set (0: out of memory): a regular file only, so a FIFO never blocks. */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static gzFile data_gzopen(const char *path, int *errnum)
{
    int fd = tr_input_open(path);
    if (fd < 0) {
        *errnum = errno;
        return NULL;
    }
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        *errnum = 0;
        close(fd);
    }
    return f;
}

/* zlib's message, without the "path: " it starts with. */
static const char *data_gz_message(gzFile f, const char *path, int *zerr)
{
    const char *msg = gzerror(f, zerr);
    size_t n = strlen(path);
    if (strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ')
        msg += n + 2;
    return msg;
}
#endif

enum data_map_result {
    DATA_MAPPED,
    DATA_CANNOT_OPEN,
    DATA_CANNOT_STAT,
    DATA_NOT_REGULAR,
    DATA_EMPTY,
    DATA_CANNOT_MAP,
};

/* Map a whole regular, non-empty file read-only.  *errnum says why
 * DATA_CANNOT_OPEN, DATA_CANNOT_STAT or DATA_CANNOT_MAP; each caller words
 * the errors for its own files. */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static enum data_map_result data_map_file(const char *path, void **map, size_t *size,
                                          int *errnum)
{
    int fd = tr_input_open(path); /* a FIFO would block open() forever */
    if (fd < 0) {
        *errnum = errno;
        return errno == EISDIR || errno == TR_INPUT_ENOTREG ? DATA_NOT_REGULAR : DATA_CANNOT_OPEN;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *errnum = errno;
        close(fd);
        return DATA_CANNOT_STAT;
    }
    enum data_map_result r = st.st_size == 0 ? DATA_EMPTY : DATA_MAPPED;
    if (r == DATA_MAPPED) {
        *size = (size_t)st.st_size;
        *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        *errnum = errno;
        if (*map == MAP_FAILED)
            r = DATA_CANNOT_MAP;
    }
    close(fd); /* the mapping keeps the file alive */
    return r;
}

#if defined(__GNUC__)
__attribute__((unused))
#endif
static uint32_t data_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int data_info(struct tr_data_info *out, const uint64_t samples[TR_SPLIT_COUNT],
                     enum tr_dtype input_dtype, uint32_t input_len, uint32_t target_len,
                     uint32_t classes)
{
    out->struct_size = sizeof *out;
    out->samples[TR_SPLIT_TRAIN] = samples[TR_SPLIT_TRAIN];
    out->samples[TR_SPLIT_VAL] = samples[TR_SPLIT_VAL];
    out->input_dtype = input_dtype;
    out->input_len = input_len;
    out->target_len = target_len;
    out->classes = classes;
    return TR_OK;
}

/* Before read() touches anything: the split is one the core knows and every
 * index is below that split's sample count (the first one that is not is
 * named). */
static int data_check_read(tr_err *err, const char *who, enum tr_split split,
                           const uint64_t samples[TR_SPLIT_COUNT], const uint64_t *indices,
                           size_t n)
{
    if ((unsigned)split >= TR_SPLIT_COUNT)
        return tr_fail(err, "%s data: unknown split %d", who, (int)split);
    for (size_t i = 0; i < n; i++)
        if (indices[i] >= samples[split])
            return tr_fail(err, "%s data: sample %llu out of range (split has %llu)", who,
                           (unsigned long long)indices[i],
                           (unsigned long long)samples[split]);
    return TR_OK;
}

#endif
