/*
 * Inputs of `trainrun prepare` (see prepare_internal.h): a file read whole,
 * decompressed when it is gzip (zlib) or zstd (libzstd), and the records of
 * a JSONL file, one JSON object per line, with the line each came from.
 */
#include "dataset.h"

#include "prepare_internal.h"

#include "../util/json.h"

#include <trainrun/input.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int tr_prepare_is_jsonl(const char *path)
{
    return ends_with(path, ".jsonl") || ends_with(path, ".jsonl.gz") ||
           ends_with(path, ".jsonl.zst");
}

/* A compressed input may decompress to at most TR_PREPARE_MAX_EXPANSION times its size
 * on disk plus TR_PREPARE_EXPANSION_SLACK: prepare holds every input decompressed in
 * memory, and a 1 MB .zst can hold 40 GB of one repeated line.  Text compresses 3 to 10
 * times; a file past the bound is refused before it takes the memory. */
#define TR_PREPARE_MAX_EXPANSION 100
#define TR_PREPARE_EXPANSION_SLACK ((size_t)16 << 20)

static size_t expansion_limit(size_t compressed)
{
    if (compressed > (SIZE_MAX - TR_PREPARE_EXPANSION_SLACK) / TR_PREPARE_MAX_EXPANSION)
        return SIZE_MAX;
    return compressed * TR_PREPARE_MAX_EXPANSION + TR_PREPARE_EXPANSION_SLACK;
}

static int expanded_too_far(const char *path, const char *how, size_t compressed)
{
    return tr_prepare_fail("%s decompresses to more than %zu MiB, over %d times its %zu bytes on disk "
                           "(plus %zu MiB): prepare holds each input decompressed in memory and refuses "
                           "a file that expands this far (a damaged or hostile file?); if its contents are "
                           "what you mean, decompress it yourself (%s) and pass the plain file",
                           path, expansion_limit(compressed) >> 20, TR_PREPARE_MAX_EXPANSION, compressed,
                           TR_PREPARE_EXPANSION_SLACK >> 20, how);
}

/* Room for `more` bytes after len (and a NUL), doubling. */
static int grow(unsigned char **buf, size_t *cap, size_t len, size_t more, const char *path)
{
    if (len + more + 1 <= *cap)
        return 0;
    size_t want = *cap ? *cap : 1;
    while (want < len + more + 1) {
        if (want > SIZE_MAX / 2)
            return tr_prepare_fail("%s is too large to read", path);
        want *= 2;
    }
    unsigned char *grown = realloc(*buf, want);
    if (!grown)
        return tr_prepare_fail("out of memory reading %s (%zu bytes so far)", path, len);
    *buf = grown;
    *cap = want;
    return 0;
}

/* zstd: every frame of the file, streamed. */
static int read_zstd(const char *path, FILE *f, size_t hint, unsigned char **data, size_t *size)
{
    ZSTD_DCtx *z = ZSTD_createDCtx();
    size_t in_cap = ZSTD_DStreamInSize();
    unsigned char *in = malloc(in_cap), *buf = NULL;
    size_t cap = 0, len = 0, last = 0;
    size_t limit = expansion_limit(hint);
    int rc = z && in ? grow(&buf, &cap, 0, hint * 3, path) : tr_prepare_fail("out of memory");
    size_t got;
    while (rc == 0 && (got = fread(in, 1, in_cap, f)) > 0) {
        ZSTD_inBuffer ib = {in, got, 0};
        while (rc == 0 && ib.pos < ib.size) {
            if ((rc = grow(&buf, &cap, len, ZSTD_DStreamOutSize(), path)) != 0)
                break;
            ZSTD_outBuffer ob = {buf + len, cap - len - 1, 0};
            last = ZSTD_decompressStream(z, &ob, &ib);
            if (ZSTD_isError(last))
                rc = tr_prepare_fail("cannot read %s: %s (is the .zst file complete and not "
                                     "damaged?)", path, ZSTD_getErrorName(last));
            len += ob.pos;
            if (rc == 0 && len > limit)
                rc = expanded_too_far(path, "zstd -d", hint);
        }
    }
    if (rc == 0 && ferror(f))
        rc = tr_prepare_fail("cannot read %s: %s", path, strerror(errno));
    /* drain what the decoder still holds */
    while (rc == 0 && last != 0) {
        if ((rc = grow(&buf, &cap, len, ZSTD_DStreamOutSize(), path)) != 0)
            break;
        ZSTD_inBuffer ib = {in, 0, 0};
        ZSTD_outBuffer ob = {buf + len, cap - len - 1, 0};
        last = ZSTD_decompressStream(z, &ob, &ib);
        if (ZSTD_isError(last))
            rc = tr_prepare_fail("cannot read %s: %s", path, ZSTD_getErrorName(last));
        else if (ob.pos == 0 && last != 0)
            rc = tr_prepare_fail("cannot read %s: it ends inside a zstd frame (is the .zst "
                                 "file complete?)", path);
        len += ob.pos;
        if (rc == 0 && len > limit)
            rc = expanded_too_far(path, "zstd -d", hint);
    }
    ZSTD_freeDCtx(z);
    free(in);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    buf[len] = '\0';
    *data = buf;
    *size = len;
    return 0;
}

/* Plain or gzip: zlib reads a plain file as it is. */
static int read_gzip(const char *path, size_t hint, unsigned char **data, size_t *size)
{
    int fd = tr_input_open(path); /* a regular file: a FIFO would block forever */
    gzFile f = fd >= 0 ? gzdopen(fd, "rb") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return tr_prepare_fail("cannot open %s: %s", path,
                               fd >= 0 ? "out of memory" : tr_input_strerror(e));
    }
    gzbuffer(f, 1 << 17);
    /* hint + 1: a plain file is read without growing; gzip grows */
    size_t cap = 0, len = 0;
    unsigned char *buf = NULL;
    int rc = grow(&buf, &cap, 0, hint, path);
    size_t limit = expansion_limit(hint);
    while (rc == 0) {
        if (len + 1 >= cap && (rc = grow(&buf, &cap, len, cap, path)) != 0)
            break;
        size_t want = cap - len - 1 > (1u << 30) ? (1u << 30) : cap - len - 1;
        int got = gzread(f, buf + len, (unsigned)want);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            rc = tr_prepare_fail("cannot read %s: %s (is the .gz file complete?)", path,
                                 zerr == Z_ERRNO ? strerror(errno) : msg);
        }
        if (got <= 0)
            break;
        len += (size_t)got;
        if (len > limit && !gzdirect(f)) {
            rc = expanded_too_far(path, "gunzip", hint);
            break;
        }
    }
    gzclose(f);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    buf[len] = '\0';
    *data = buf;
    *size = len;
    return 0;
}

int tr_prepare_read_input(const char *path, unsigned char **data, size_t *size)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return tr_prepare_fail("cannot open %s: %s%s", path, strerror(errno),
                               path[0] == '/' ? "" : " (relative to the current directory)");
    if (!S_ISREG(st.st_mode))
        return tr_prepare_fail("%s is not a regular file", path);
    FILE *f = tr_input_fopen(path);
    if (!f)
        return tr_prepare_fail("cannot open %s: %s", path, tr_input_strerror(errno));
    unsigned char magic[4] = {0};
    size_t n = fread(magic, 1, sizeof magic, f);
    static const unsigned char zstd_magic[4] = {0x28, 0xb5, 0x2f, 0xfd};
    int rc;
    if (n == 4 && memcmp(magic, zstd_magic, 4) == 0) {
        rewind(f);
        rc = read_zstd(path, f, (size_t)st.st_size, data, size);
        fclose(f);
    } else {
        fclose(f);
        if (ends_with(path, ".zst"))
            return tr_prepare_fail("%s is named .zst but is not zstd-compressed (its first "
                                   "bytes are not a zstd frame); rename it or compress it with "
                                   "zstd", path);
        rc = read_gzip(path, (size_t)st.st_size, data, size);
    }
    return rc;
}

/* ---- JSONL ------------------------------------------------------------------ */

void tr_jsonl_init(struct tr_jsonl *it, const char *path, const unsigned char *data, size_t size)
{
    memset(it, 0, sizeof *it);
    it->path = path;
    it->at = data;
    it->end = data + size;
    if (size >= 3 && data[0] == 0xef && data[1] == 0xbb && data[2] == 0xbf)
        it->at += 3; /* a byte order mark */
}

int tr_jsonl_next(struct tr_jsonl *it, struct tr_json **rec)
{
    *rec = NULL;
    while (it->at < it->end) {
        const unsigned char *p = it->at;
        const unsigned char *nl = memchr(p, '\n', (size_t)(it->end - p));
        const unsigned char *line_end = nl ? nl : it->end;
        it->at = nl ? nl + 1 : it->end;
        it->line++;
        const unsigned char *b = p, *e = line_end;
        while (b < e && (*b == ' ' || *b == '\t' || *b == '\r'))
            b++;
        while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
            e--;
        if (b == e)
            continue;
        size_t at = 0;
        struct tr_json *j = tr_json_parse((const char *)b, (size_t)(e - b), &at);
        if (!j) {
            snprintf(it->error, sizeof it->error,
                     "%s:%ld: not a JSON object (malformed JSON at column %zu; each line "
                     "of a JSONL file must be one complete JSON object)",
                     it->path, it->line, (size_t)(b - p) + at + 1);
            return -1;
        }
        if (j->type != TR_JSON_OBJECT) {
            tr_json_free(j);
            snprintf(it->error, sizeof it->error,
                     "%s:%ld: not a JSON object (each line of a JSONL file must be an "
                     "object such as {\"text\": \"...\"})", it->path, it->line);
            return -1;
        }
        *rec = j;
        return 1;
    }
    return 0;
}
