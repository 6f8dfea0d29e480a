/*
 * The output directory every format of `trainrun prepare` writes into:
 * claimed (what prepare replaces there, it touches only where an earlier
 * prepare wrote it), stale shards removed, files published whole; and the
 * error line all of prepare prints.
 */
#include "dataset.h"

#include "prepare_internal.h"

#include "../util/json.h"

#include <trainrun/input.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void tr_prepare_vfail(const char *fmt, va_list ap)
{
    fputs("trainrun prepare: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int tr_prepare_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tr_prepare_vfail(fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- the output directory ------------------------------------------------- */

/* The shard number of "<prefix>_NNNNNN.bin", or -1 for any other name. */
static long shard_index(const char *name, const char *prefix)
{
    size_t plen = strlen(prefix);
    if (strncmp(name, prefix, plen) != 0 || name[plen] != '_' || !isdigit((unsigned char)name[plen + 1]))
        return -1;
    char *end;
    long index = strtol(name + plen + 1, &end, 10);
    return end == name + plen + 7 && strcmp(end, ".bin") == 0 ? index : -1;
}

/* Shards named like ours that this run did not write (a previous run made
 * more): remove them, or a glob would pick them up.  Only regular files
 * (a symlink is not followed), in a directory tr_prepare_claim_out_dir made ours. */
void tr_prepare_remove_stale_shards(const char *dir, const char *prefix, int written)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        long index = shard_index(name, prefix);
        struct stat st;
        if (index < written || fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (unlinkat(dirfd(d), name, 0) == 0)
            printf("trainrun prepare: removed %s, left by an earlier run\n", path);
    }
    closedir(d);
}

/* OUTDIR/NAME, left by an earlier run (a tokenizer this run does not use):
 * removed, so nothing reports a tokenizer that did not make these shards.
 * Only in a directory tr_prepare_claim_out_dir made ours; regular files only. */
void tr_prepare_remove_stale_file(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && unlink(path) == 0)
        printf("trainrun prepare: removed %s, left by an earlier run\n", path);
}

/* OUTDIR may be any directory: what prepare replaces or removes there
 * (prepare.json, data.csv, train_/val_NNNNNN.bin, tokenizer.json,
 * tokenizer_config.json) it touches only where an
 * earlier prepare wrote them (its marker, or for older versions its
 * prepare.json).  A directory holding the user's files of those names is
 * refused, so nothing of theirs is overwritten or deleted. */
#define PREPARE_MARK ".trainrun-prepare"

int tr_prepare_claim_out_dir(const char *dir)
{
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/" PREPARE_MARK, dir);
    int ours = lstat(path, &st) == 0 && S_ISREG(st.st_mode);
    if (!ours) {
        snprintf(path, sizeof path, "%s/prepare.json", dir);
        FILE *f = lstat(path, &st) == 0 && S_ISREG(st.st_mode) ? tr_input_fopen(path) : NULL;
        char head[64] = "";
        size_t n = f ? fread(head, 1, sizeof head - 1, f) : 0;
        if (f)
            fclose(f);
        head[n] = '\0';
        static const char text[] = "{\n  \"format\": \"text\",", csv[] = "{\n  \"format\": \"csv\",";
        ours = strncmp(head, text, sizeof text - 1) == 0 || strncmp(head, csv, sizeof csv - 1) == 0;
    }
    DIR *d = ours ? NULL : opendir(dir);
    struct dirent *e;
    const char *theirs = NULL;
    while (d && !theirs && (e = readdir(d)))
        if (strcmp(e->d_name, "prepare.json") == 0 || strcmp(e->d_name, "data.csv") == 0 ||
            strcmp(e->d_name, "tokenizer.json") == 0 ||
            strcmp(e->d_name, "tokenizer_config.json") == 0 ||
            strcmp(e->d_name, "classes.txt") == 0 ||
            shard_index(e->d_name, "train") >= 0 || shard_index(e->d_name, "val") >= 0)
            theirs = e->d_name;
    if (theirs) {
        tr_prepare_fail("%s/%s exists and was not written by trainrun prepare; it is left untouched: "
             "pass -o with a new or empty directory", dir, theirs);
        closedir(d);
        return -1;
    }
    if (d)
        closedir(d);
    snprintf(path, sizeof path, "%s/" PREPARE_MARK, dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return tr_prepare_fail("cannot write %s: %s", path, strerror(errno));
    close(fd);
    return 0;
}

/* ---- writing prepare.json ------------------------------------------------- */

int tr_prepare_publish(const char *tmp, const char *path, FILE *f)
{
    int rc = 0;
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)
        rc = tr_prepare_fail("cannot write %s: %s", path, strerror(errno));
    if (fclose(f) != 0 && rc == 0)
        rc = tr_prepare_fail("cannot write %s: %s", path, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = tr_prepare_fail("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc != 0)
        unlink(tmp);
    return rc;
}

int tr_prepare_write_copy(const char *dir, const char *name, const unsigned char *data, size_t size)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return tr_prepare_fail("cannot create %s: %s", tmp, strerror(errno));
    if (size && fwrite(data, 1, size, f) != size) {
        fclose(f);
        unlink(tmp);
        return tr_prepare_fail("cannot write %s: %s", path, strerror(errno));
    }
    return tr_prepare_publish(tmp, path, f);
}

void tr_prepare_json_inputs(FILE *f, const struct prepare_opts *o)
{
    fputs("  \"inputs\": [", f);
    for (int i = 0; i < o->n_inputs; i++) {
        if (i)
            fputs(", ", f);
        tr_json_write_string(f, o->inputs[i]);
    }
    fputs("],\n", f);
}
