/*
 * checkpoint = { plugin = "local", dir = "ckpt" }: checkpoints as
 * directories of blob files on a local (or network) filesystem.
 *
 *   <dir>/<name>/<blob>...               published checkpoints
 *   <dir>/<name>/.trainrun-checkpoint    the marker: trainrun made this directory
 *   <dir>/LATEST                         the name of the last committed one, plus "\n"
 *   <dir>/.trainrun-tmp-<name>-<pid>/    a checkpoint being written (with the marker)
 *
 * Several ranks write one checkpoint (begin_shared, ABI 2.5): the
 * publisher stages it as above and hands out the staging directory's name
 * as the token; the other ranks write their blobs into that same directory
 * (fsync'd as they are closed), detach, and the publisher renames it into
 * place once every rank has.  A killed rank leaves a staging directory,
 * removed as any other leftover.
 *
 * Atomicity comes from rename(): blobs are written and fsync'd in a staging
 * directory that is renamed into place only when complete, so a crash at
 * any moment leaves every published checkpoint intact.  Staging leftovers
 * from a crash are removed the next time a run opens the directory.
 *
 * The directory may hold other files (checkpoint.dir pointed at a shared or
 * home directory): only directories with the marker are ever removed or
 * replaced, whatever the names of the others, and symlinks are never
 * followed, so nothing trainrun did not create is deleted.
 *
 * One file, over the usual ~700 lines, because it is one thing: the vtable
 * of one backend whose parts all serve the same rename-and-marker protocol
 * (staging, LATEST's write, read and repair, crash recovery, ownership
 * checks on remove), each a few dozen lines that read each other's names.
 * What is generic (names, durable writes, owned directories) is already
 * shared with the s3 backend in files.h; splitting the rest would only
 * scatter the protocol across files.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file APIs under strict C11 */

#include <trainrun/input.h>
#include <trainrun/plugin.h>

#include "files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

struct local_config {
    const char *dir;
    int fsync;
};

static const struct tr_option local_options[] = {
    {TR_OPT_STRING, "dir", "", 0, 0, NULL,
     "directory holding the checkpoints; empty: <run_dir>/checkpoints. A relative path is "
     "relative to the run directory",
     offsetof(struct local_config, dir)},
    {TR_OPT_BOOL, "fsync", "true", 0, 0, NULL,
     "flush every file and directory to disk before publishing, so a checkpoint survives a "
     "power loss; false is faster on scratch disks",
     offsetof(struct local_config, fsync)},
    {.type = TR_OPT_END},
};

#define STAGING_PREFIX ".trainrun-tmp-"
#define ASIDE_PREFIX ".trainrun-old-"
#define LATEST_TMP STAGING_PREFIX "LATEST-" /* then the pid */

struct local {
    const struct tr_host *host;
    char *dir;
    int fsync;
    char *staging;      /* open checkpoint's staging directory, or NULL */
    char *staging_name; /* its final name */
    int joined;         /* staging is another rank's (begin_shared as a joiner) */
};

/* ---- small helpers ----------------------------------------------------- */

static void warn(const struct local *l, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void warn(const struct local *l, const char *fmt, ...)
{
    if (!l->host || !l->host->log)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    l->host->log(TR_LOG_WARN, "checkpoint", "%s", msg);
}

/* "a/b" (or "a/bc" with a suffix) in fresh memory, NULL when out of memory. */
static char *path_join(const char *a, const char *b, const char *suffix)
{
    size_t n = strlen(a) + 1 + strlen(b) + (suffix ? strlen(suffix) : 0) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s%s", a, b, suffix ? suffix : "");
    return p;
}

/* "<dir>/<prefix><name>-<pid>" */
static char *private_path(const struct local *l, const char *prefix, const char *name)
{
    char tail[64];
    snprintf(tail, sizeof tail, "-%ld", (long)getpid());
    size_t n = strlen(prefix) + strlen(name) + 1;
    char *base = malloc(n);
    if (!base)
        return NULL;
    snprintf(base, n, "%s%s", prefix, name);
    char *p = path_join(l->dir, base, tail);
    free(base);
    return p;
}

static const char *hint_for(int errnum)
{
    return DISK_HINT(errnum, "checkpoint.dir");
}

/* ---- crash recovery ---------------------------------------------------- */

/* ".trainrun-tmp-LATEST-<pid>": a regular file this plugin wrote. */
static int is_latest_tmp(const char *name, const struct stat *st)
{
    size_t n = strlen(LATEST_TMP);
    if (strncmp(name, LATEST_TMP, n) != 0 || !name[n] || !S_ISREG(st->st_mode) ||
        st->st_size > 4096)
        return 0;
    for (const char *p = name + n; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

/* The pid that ends ".trainrun-...-<pid>" is a live process on this host:
 * its save is in progress, not interrupted.  A reader (`trainrun sample` of
 * a running run) or another run sharing checkpoint.dir must leave it alone;
 * this process's own pid can only be a leftover of an earlier one. */
static int owner_alive(const char *name)
{
    const char *dash = strrchr(name, '-');
    char *end;
    long pid = dash ? strtol(dash + 1, &end, 10) : 0;
    if (pid <= 0 || *end || pid == (long)getpid())
        return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* A crash can leave staging directories (.trainrun-tmp-<name>-<pid>), a
 * half-written LATEST (.trainrun-tmp-LATEST-<pid>), or a checkpoint renamed
 * aside while being replaced (.trainrun-old-<name>-<pid>): the last is
 * restored if its replacement never landed, otherwise deleted.  Only what
 * carries trainrun's marker is touched: a user's look-alike stays. */
static void clean_stale(struct local *l)
{
    DIR *d = opendir(l->dir);
    if (!d)
        return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        const char *n = ent->d_name;
        int staging = strncmp(n, STAGING_PREFIX, strlen(STAGING_PREFIX)) == 0;
        int aside = strncmp(n, ASIDE_PREFIX, strlen(ASIDE_PREFIX)) == 0;
        if ((!staging && !aside) || owner_alive(n))
            continue;
        char *path = path_join(l->dir, n, NULL);
        if (!path)
            break;
        struct stat st;
        if (lstat(path, &st) != 0 ||
            !(S_ISDIR(st.st_mode) ? is_owned_dir(path) : staging && is_latest_tmp(n, &st))) {
            free(path);
            continue;
        }
        if (aside) {
            /* ".trainrun-old-<name>-<pid>" -> "<name>" */
            char *name = staged_name(n, ASIDE_PREFIX);
            char *orig = name ? path_join(l->dir, name, NULL) : NULL;
            struct stat ost;
            if (orig && valid_name(name) && lstat(orig, &ost) != 0 && rename(path, orig) == 0) {
                warn(l, "restored checkpoint %s from %s, left by an interrupted save", orig,
                     path);
                free(name);
                free(orig);
                free(path);
                continue;
            }
            free(name);
            free(orig);
        }
        int rc = S_ISDIR(st.st_mode) ? remove_tree(path) : unlink(path);
        if (rc == 0)
            warn(l, "removed %s, left by an interrupted checkpoint save", path);
        else
            warn(l, "cannot remove %s, left by an interrupted checkpoint save: %s; remove it "
                    "by hand",
                 path, strerror(errno));
        free(path);
    }
    closedir(d);
}

/* ---- create / destroy -------------------------------------------------- */

static void local_abort(void *self);

static void local_destroy(void *self)
{
    struct local *l = self;
    if (!l)
        return;
    local_abort(l);
    free(l->dir);
    free(l);
}

static void repair_latest(struct local *l);

static int local_create(const struct tr_host *host, const void *config,
                        const struct tr_create_args *args, void **self, tr_err *err)
{
    const struct local_config *cfg = config;
    if (cfg->dir[0] != '/' && (!args->run_dir || !args->run_dir[0]))
        return tr_fail(err, "local checkpoint: no run directory to put \"%s\" in; set "
                            "checkpoint.dir to an absolute path",
                       cfg->dir[0] ? cfg->dir : "checkpoints");
    if (!host || !host->alloc || !host->free)
        return tr_fail(err, "local checkpoint: the host provides no allocator");

    struct local *l = calloc(1, sizeof *l);
    if (!l)
        return tr_fail(err, "local checkpoint: out of memory");
    l->host = host;
    l->fsync = cfg->fsync;
    if (cfg->dir[0] == '\0')
        l->dir = path_join(args->run_dir, "checkpoints", NULL);
    else if (cfg->dir[0] == '/')
        l->dir = strdup(cfg->dir);
    else
        l->dir = path_join(args->run_dir, cfg->dir, NULL);
    if (!l->dir) {
        free(l);
        return tr_fail(err, "local checkpoint: out of memory");
    }
    /* "dir/" would make every path "dir//name"; harmless but ugly */
    for (size_t n = strlen(l->dir); n > 1 && l->dir[n - 1] == '/'; n--)
        l->dir[n - 1] = '\0';

    if (mkdir_p(l->dir) != 0) {
        int e = errno;
        tr_fail(err, "local checkpoint: cannot create directory %s: %s%s", l->dir, strerror(e),
                hint_for(e));
        local_destroy(l);
        return TR_ERROR;
    }
    /* Only one process may tidy up: another rank could be mid-save. */
    if (args->rank == 0) {
        clean_stale(l);
        repair_latest(l);
    }
    *self = l;
    return TR_OK;
}

/* ---- writing ----------------------------------------------------------- */

static int local_begin(void *self, const char *name, tr_err *err)
{
    struct local *l = self;
    if (!valid_name(name))
        return tr_fail(err,
                       "local checkpoint: invalid checkpoint name \"%s\": use a plain file "
                       "name without '/' or control characters, not starting with '.', and "
                       "not LATEST",
                       name ? name : "(null)");
    if (l->staging)
        return tr_fail(err,
                       "local checkpoint: begin(\"%s\") while checkpoint \"%s\" is still open; "
                       "commit or abort it first",
                       name, l->staging_name);
    l->staging = private_path(l, STAGING_PREFIX, name);
    l->staging_name = strdup(name);
    if (!l->staging || !l->staging_name) {
        local_abort(l);
        return tr_fail(err, "local checkpoint: out of memory");
    }
    remove_tree(l->staging); /* a leftover of this very process; usually absent */
    if (make_owned_dir(l->staging) != 0) {
        int e = errno;
        tr_fail(err,
                "local checkpoint: cannot create %s: %s; the previous checkpoint is "
                "untouched%s",
                l->staging, strerror(e), hint_for(e));
        local_abort(l);
        return TR_ERROR;
    }
    return TR_OK;
}

/* "<staging>/<blob>" for a blob of the open checkpoint, or NULL with err
 * (`what` names the call: "put"). */
static char *blob_path(struct local *l, const char *what, const char *blob, tr_err *err)
{
    if (!l->staging) {
        tr_fail(err, "local checkpoint: %s(\"%s\") without begin()", what, blob ? blob : "");
        return NULL;
    }
    if (!valid_blob(blob) || strcmp(blob, TR_OWNER_MARK) == 0) {
        tr_fail(err,
                "local checkpoint: invalid blob name \"%s\": blob names are plain file "
                "names (not empty, no '/' or control characters, not . or .., not "
                TR_OWNER_MARK ")",
                blob ? blob : "(null)");
        return NULL;
    }
    char *path = path_join(l->staging, blob, NULL);
    if (!path)
        tr_fail(err, "local checkpoint: out of memory");
    return path;
}

/* The error of a blob file that could not be created (rc -1) or written
 * (-2) with errno e; TR_ERROR. */
static int blob_file_error(const char *path, int rc, int e, tr_err *err)
{
    if (rc == -1)
        return tr_fail(err, "local checkpoint: cannot create %s: %s%s; the previous checkpoint "
                            "is untouched%s",
                       path, strerror(e), e == EEXIST ? " (blob written twice)" : "",
                       hint_for(e));
    return tr_fail(err, "local checkpoint: cannot write %s: %s; the previous checkpoint is "
                        "untouched%s",
                   path, strerror(e), hint_for(e));
}

static int local_put(void *self, const char *blob, const void *data, size_t size, tr_err *err)
{
    struct local *l = self;
    char *path = blob_path(l, "put", blob, err);
    if (!path)
        return TR_ERROR;
    int rc = write_file(path, data, size, 1, l->fsync);
    if (rc != 0)
        blob_file_error(path, rc, errno, err);
    free(path);
    return rc == 0 ? TR_OK : TR_ERROR;
}

/* The piece of a streamed blob read and written at a time */
#define STREAM_PIECE ((size_t)4 << 20)

/* put() with the bytes pulled from fill a piece at a time: the same file,
 * created exclusively and finished as write_file finishes it (finish_file:
 * fsync'd, closed, removed again when anything failed, fill included). */
static int local_put_stream(void *self, const char *blob, size_t size, tr_blob_fill_fn fill,
                            void *ud, tr_err *err)
{
    struct local *l = self;
    char *path = blob_path(l, "put_stream", blob, err);
    if (!path)
        return TR_ERROR;
    size_t cap = size < STREAM_PIECE ? (size ? size : 1) : STREAM_PIECE;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        free(path);
        return tr_fail(err, "local checkpoint: out of memory writing %s", blob);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        blob_file_error(path, -1, errno, err);
        free(buf);
        free(path);
        return TR_ERROR;
    }
    int failed = 0, filled = 1, e = 0; /* filled: every fill succeeded */
    for (size_t done = 0; done < size && !failed;) {
        size_t want = size - done < cap ? size - done : cap, got = 0;
        if (fill(ud, buf, want, &got, err) != TR_OK) {
            failed = 1;
            filled = 0;
        } else if (got == 0 || got > want) {
            failed = 1;
            filled = 0;
            tr_fail(err, "local checkpoint: writing %s, the core gave %zu bytes for a piece of "
                         "%zu",
                    path, got, want);
        } else if (write_all(fd, buf, got) != 0) {
            failed = 1;
            e = errno;
        }
        done += got;
    }
    int rc = finish_file(fd, path, failed, e, l->fsync);
    if (rc != 0 && filled) /* a failed fill has said why */
        blob_file_error(path, rc, errno, err);
    free(buf);
    free(path);
    return rc == 0 ? TR_OK : TR_ERROR;
}

/* LATEST as this plugin writes it: a regular file holding one checkpoint
 * name and a newline.  Anything else is a file of the user's, which is
 * neither replaced nor removed. */
static int latest_is_ours(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT; /* absent: ours to create */
    if (!S_ISREG(st.st_mode) || st.st_size < 2 || st.st_size > 4096)
        return 0;
    char buf[4097];
    FILE *f = tr_input_fopen(path);
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    if (n < 2 || buf[n - 1] != '\n' || strlen(buf) != n)
        return 0;
    buf[n - 1] = '\0';
    return valid_name(buf) && !strpbrk(buf, "\r\n");
}

static int not_our_latest(const char *latest, tr_err *err)
{
    return tr_fail(err, "local checkpoint: %s is not a LATEST file trainrun wrote (it must "
                        "hold one checkpoint name); it is left untouched: point "
                        "checkpoint.dir at a directory of its own, or move the file away",
                   latest);
}

/* Point LATEST at name: write a temporary file, then rename it over. */
static int write_latest(struct local *l, const char *name, tr_err *err)
{
    char *tmp = private_path(l, STAGING_PREFIX, "LATEST");
    char *latest = path_join(l->dir, "LATEST", NULL);
    if (!tmp || !latest) {
        free(tmp);
        free(latest);
        return tr_fail(err, "local checkpoint: out of memory");
    }
    if (!latest_is_ours(latest)) {
        int rc = not_our_latest(latest, err);
        free(tmp);
        free(latest);
        return rc;
    }
    int rc = TR_OK;
    struct stat st;
    if (lstat(tmp, &st) == 0 && is_latest_tmp(strrchr(tmp, '/') + 1, &st))
        unlink(tmp); /* a leftover of this very process id */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int failed = fd < 0;
    if (!failed) {
        failed = write_all(fd, name, strlen(name)) != 0 || write_all(fd, "\n", 1) != 0 ||
                 (l->fsync && fsync(fd) != 0);
        int e = errno;
        if (close(fd) != 0 && !failed) {
            failed = 1;
            e = errno;
        }
        errno = e;
    }
    if (!failed)
        failed = rename(tmp, latest) != 0 || (l->fsync && fsync_dir(l->dir) != 0);
    if (failed) {
        int e = errno;
        if (fd >= 0)
            unlink(tmp);
        rc = tr_fail(err, "local checkpoint: cannot update %s: %s%s", latest, strerror(e),
                     hint_for(e));
    }
    free(tmp);
    free(latest);
    return rc;
}

static int local_commit(void *self, tr_err *err)
{
    struct local *l = self;
    if (!l->staging)
        return tr_fail(err, "local checkpoint: commit() without begin()");
    if (l->joined)
        return tr_fail(err, "local checkpoint: commit() by a rank that joined checkpoint %s; "
                            "its publisher commits it", l->staging_name);
    const char *name = l->staging_name;
    char *final = path_join(l->dir, name, NULL);
    char *aside = private_path(l, ASIDE_PREFIX, name);
    if (!final || !aside) {
        free(final);
        free(aside);
        return tr_fail(err, "local checkpoint: out of memory");
    }
    int rc = TR_ERROR;
    int moved_aside = 0;

    if (l->fsync && fsync_dir(l->staging) != 0) {
        int e = errno;
        tr_fail(err, "local checkpoint: cannot flush %s: %s; the previous checkpoint is "
                     "untouched%s",
                l->staging, strerror(e), hint_for(e));
        goto out;
    }
    /* rename() cannot replace a non-empty directory: move the old one aside */
    struct stat st;
    if (lstat(final, &st) == 0) {
        if (!S_ISDIR(st.st_mode) || !is_owned_dir(final)) {
            tr_fail(err, "local checkpoint: cannot publish checkpoint %s: %s exists and was not "
                         "made by trainrun, so it is left untouched; move it away or point "
                         "checkpoint.dir at a directory of its own",
                    name, final);
            goto out;
        }
        if (rename(final, aside) != 0) {
            int e = errno;
            tr_fail(err, "local checkpoint: cannot replace %s: %s", final, strerror(e));
            goto out;
        }
        moved_aside = 1;
    }
    if (rename(l->staging, final) != 0) {
        int e = errno;
        if (moved_aside)
            rename(aside, final);
        tr_fail(err, "local checkpoint: cannot publish %s as %s: %s; the previous checkpoint "
                     "is untouched",
                l->staging, final, strerror(e));
        goto out;
    }
    if (l->fsync && fsync_dir(l->dir) != 0) {
        int e = errno;
        tr_fail(err, "local checkpoint: cannot flush %s: %s", l->dir, strerror(e));
        goto out;
    }
    if (moved_aside && remove_tree(aside) != 0)
        warn(l, "cannot remove %s, the replaced checkpoint: %s; remove it by hand", aside,
             strerror(errno));

    /* published: from here on there is nothing left to abort */
    free(l->staging);
    l->staging = NULL;
    rc = write_latest(l, name, err);
    if (rc != TR_OK) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        tr_fail(err, "checkpoint %s was saved, but LATEST was not updated: %s", final, why);
    }
    free(l->staging_name);
    l->staging_name = NULL;
out:
    free(final);
    free(aside);
    return rc;
}

/* begin() shared by several ranks: the publisher's staging directory is
 * the token; a joiner writes into it. */
static int local_begin_shared(void *self, const char *name, char *token, size_t token_size,
                              int publisher, tr_err *err)
{
    struct local *l = self;
    if (publisher) {
        if (local_begin(self, name, err) != TR_OK)
            return TR_ERROR;
        const char *base = strrchr(l->staging, '/') + 1;
        if (!token || strlen(base) >= token_size) {
            local_abort(l);
            return tr_fail(err, "local checkpoint: no room for the staging name %s", base);
        }
        memcpy(token, base, strlen(base) + 1);
        return TR_OK;
    }
    if (!valid_name(name) || !token || strnlen(token, token_size) == token_size ||
        strncmp(token, STAGING_PREFIX, strlen(STAGING_PREFIX)) != 0 || strchr(token, '/'))
        return tr_fail(err, "local checkpoint: cannot join checkpoint \"%s\": the token \"%.64s\" "
                            "names no staging directory of this plugin",
                       name ? name : "(null)", token ? token : "");
    if (l->staging)
        return tr_fail(err, "local checkpoint: begin_shared(\"%s\") while checkpoint \"%s\" is "
                            "still open; commit, detach or abort it first",
                       name, l->staging_name);
    l->staging = path_join(l->dir, token, NULL);
    l->staging_name = strdup(name);
    if (!l->staging || !l->staging_name) {
        local_abort(l);
        return tr_fail(err, "local checkpoint: out of memory");
    }
    l->joined = 1;
    if (!is_owned_dir(l->staging)) {
        tr_fail(err, "local checkpoint: %s, the checkpoint being written, is not there (is "
                     "checkpoint.dir one directory that every rank sees, a shared filesystem "
                     "for ranks on several machines?)",
                l->staging);
        local_abort(l);
        return TR_ERROR;
    }
    return TR_OK;
}

/* A joiner's blobs are fsync'd as they are written; the directory entries too. */
static int local_detach(void *self, tr_err *err)
{
    struct local *l = self;
    if (!l->staging || !l->joined)
        return tr_fail(err, "local checkpoint: detach() without begin_shared() as a joiner");
    int rc = TR_OK;
    if (l->fsync && fsync_dir(l->staging) != 0) {
        int e = errno;
        rc = tr_fail(err, "local checkpoint: cannot flush %s: %s%s", l->staging, strerror(e),
                     hint_for(e));
    }
    free(l->staging);
    free(l->staging_name);
    l->staging = NULL;
    l->staging_name = NULL;
    l->joined = 0;
    return rc;
}

static void local_abort(void *self)
{
    struct local *l = self;
    if (l->joined) { /* the publisher's to remove */
        free(l->staging);
        free(l->staging_name);
        l->staging = NULL;
        l->staging_name = NULL;
        l->joined = 0;
        return;
    }
    if (l->staging && remove_tree(l->staging) != 0 && errno != ENOENT)
        warn(l, "cannot remove %s, an abandoned checkpoint: %s; remove it by hand", l->staging,
             strerror(errno));
    free(l->staging);
    free(l->staging_name);
    l->staging = NULL;
    l->staging_name = NULL;
}

/* ---- reading ----------------------------------------------------------- */

/* A directory an older trainrun published, before the marker: listed so
 * its run still resumes, but never removed (it cannot be told apart from a
 * user's directory with certainty). */
static int is_legacy_checkpoint(int dirfd_, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/state.json", name);
    struct stat st;
    return fstatat(dirfd_, path, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

/* Published checkpoint names, sorted newest first; *out is NULL-terminated.
 * Only real directories (symlinks are not followed) holding the marker, and
 * with `legacy` also the unmarked ones older versions wrote. */
static int collect(struct local *l, char ***out, size_t *count, int legacy, tr_err *err)
{
    DIR *d = opendir(l->dir);
    if (!d)
        return tr_fail(err, "local checkpoint: cannot read %s: %s", l->dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        struct stat st;
        if (!valid_name(ent->d_name) ||
            fstatat(dirfd(d), ent->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(st.st_mode))
            continue;
        char mark[4096];
        snprintf(mark, sizeof mark, "%s/" TR_OWNER_MARK, ent->d_name);
        int owned = fstatat(dirfd(d), mark, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
        if (!owned && !(legacy && is_legacy_checkpoint(dirfd(d), ent->d_name)))
            continue;
        if (n + 1 >= cap) {
            size_t grown = cap ? cap * 2 : 16;
            char **p = realloc(names, grown * sizeof *p);
            if (!p)
                goto oom;
            names = p;
            cap = grown;
        }
        if (!(names[n] = strdup(ent->d_name)))
            goto oom;
        n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof *names, newest_first);
    *out = names;
    *count = n;
    return TR_OK;
oom:
    closedir(d);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return tr_fail(err, "local checkpoint: out of memory listing %s", l->dir);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static int local_list(void *self, void (*each)(void *ud, const char *name), void *ud,
                      tr_err *err)
{
    struct local *l = self;
    char **names;
    size_t n;
    if (collect(l, &names, &n, 1, err) != TR_OK)
        return TR_ERROR;
    for (size_t i = 0; i < n; i++)
        each(ud, names[i]);
    free_names(names, n);
    return TR_OK;
}

static int local_get(void *self, const char *name, const char *blob, void **data, size_t *size,
                     tr_err *err)
{
    struct local *l = self;
    *data = NULL;
    *size = 0;
    if (!valid_name(name) || !valid_blob(blob))
        return tr_fail(err, "local checkpoint: invalid checkpoint or blob name \"%s/%s\"",
                       name ? name : "(null)", blob ? blob : "(null)");
    char *ckpt = path_join(l->dir, name, NULL);
    char *path = ckpt ? path_join(ckpt, blob, NULL) : NULL;
    if (!path) {
        free(ckpt);
        return tr_fail(err, "local checkpoint: out of memory");
    }
    int rc = TR_ERROR;
    unsigned char *buf = NULL;
    /* a FIFO planted in a shared directory must not hang the reader */
    int fd = tr_input_open(path);
    struct stat st;
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT && stat(ckpt, &st) != 0)
            tr_fail(err, "local checkpoint: no checkpoint named %s in %s", name, l->dir);
        else if (e == ENOENT)
            tr_fail(err, "local checkpoint: checkpoint %s has no blob %s (%s); it was written "
                         "by a different configuration or is damaged",
                    name, blob, path);
        else if (e == EISDIR || e == TR_INPUT_ENOTREG)
            tr_fail(err, "local checkpoint: %s is %s", path,
                    e == EISDIR ? "a directory, not a file" : tr_input_strerror(e));
        else
            tr_fail(err, "local checkpoint: cannot open %s: %s", path, strerror(e));
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        tr_fail(err, "local checkpoint: cannot stat %s: %s", path, strerror(errno));
        goto out;
    }
    size_t want = (size_t)st.st_size;
    buf = l->host->alloc(want ? want : 1);
    if (!buf) {
        tr_fail(err, "local checkpoint: out of memory reading %s (%zu bytes)", path, want);
        goto out;
    }
    size_t have = 0;
    while (have < want) {
        ssize_t got = read(fd, buf + have, want - have);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            tr_fail(err, "local checkpoint: cannot read %s: %s", path,
                    got < 0 ? strerror(errno) : "file shrank while reading");
            goto out;
        }
        have += (size_t)got;
    }
    *data = buf;
    *size = want;
    buf = NULL;
    rc = TR_OK;
out:
    if (buf)
        l->host->free(buf);
    if (fd >= 0)
        close(fd);
    free(path);
    free(ckpt);
    return rc;
}

/* size bytes of a published blob from offset */
static int local_get_range(void *self, const char *name, const char *blob, uint64_t offset,
                           void *buf, size_t size, tr_err *err)
{
    struct local *l = self;
    if (!valid_name(name) || !valid_blob(blob))
        return tr_fail(err, "local checkpoint: invalid checkpoint or blob name \"%s/%s\"",
                       name ? name : "(null)", blob ? blob : "(null)");
    char *ckpt = path_join(l->dir, name, NULL);
    char *path = ckpt ? path_join(ckpt, blob, NULL) : NULL;
    free(ckpt);
    if (!path)
        return tr_fail(err, "local checkpoint: out of memory");
    int fd = tr_input_open(path);
    if (fd < 0) {
        int e = errno;
        tr_fail(err, "local checkpoint: cannot open %s: %s", path,
                e == TR_INPUT_ENOTREG ? tr_input_strerror(e) : strerror(e));
        free(path);
        return TR_ERROR;
    }
    int rc = TR_OK;
    for (size_t got = 0; got < size;) {
        ssize_t k = pread(fd, (char *)buf + got, size - got, (off_t)(offset + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            rc = tr_fail(err, "local checkpoint: cannot read %zu bytes of %s at byte %llu: %s",
                         size, path, (unsigned long long)offset,
                         k < 0 ? strerror(errno) : "the file is shorter (truncated)");
            break;
        }
        got += (size_t)k;
    }
    close(fd);
    free(path);
    return rc;
}

/* LATEST's name, without the newline, or "" when absent. */
static void read_latest(const struct local *l, char *out, size_t size)
{
    out[0] = '\0';
    char *path = path_join(l->dir, "LATEST", NULL);
    FILE *f = path ? tr_input_fopen(path) : NULL; /* a regular file: a FIFO would hang */
    if (f) {
        if (fgets(out, (int)size, f))
            out[strcspn(out, "\r\n")] = '\0';
        fclose(f);
    }
    free(path);
}

static int local_remove(void *self, const char *name, tr_err *err)
{
    struct local *l = self;
    if (!valid_name(name))
        return tr_fail(err, "local checkpoint: invalid checkpoint name \"%s\"",
                       name ? name : "(null)");
    char *path = path_join(l->dir, name, NULL);
    if (!path)
        return tr_fail(err, "local checkpoint: out of memory");
    /* out of the listing at once, as a staging directory of this process,
     * then its files: a crash in between leaves a leftover the next run
     * removes, never a checkpoint missing half its files */
    char *doomed = is_owned_dir(path) ? private_path(l, STAGING_PREFIX, name) : NULL;
    if (doomed && rename(path, doomed) == 0) {
        free(path);
        path = doomed;
    } else {
        free(doomed);
    }
    if (remove_tree(path) != 0) {
        int e = errno;
        if (e == EPERM || e == ELOOP || e == ENOTDIR)
            tr_fail(err, "local checkpoint: not removing %s: it has no " TR_OWNER_MARK
                         " marker, so trainrun did not create it (or an older version did); "
                         "remove it by hand if it is no longer needed",
                    path);
        else
            tr_fail(err, "local checkpoint: cannot remove %s: %s%s", path, strerror(e),
                    e == ENOENT ? " (no such checkpoint)"
                    : e == ENOTEMPTY ? " (it holds a directory trainrun did not write; the "
                                       "checkpoint's own files are gone, remove the rest by hand)"
                                     : "");
        free(path);
        return TR_ERROR;
    }
    free(path);
    if (l->fsync)
        fsync_dir(l->dir);

    /* keep LATEST pointing at a checkpoint that exists */
    char latest[4096];
    read_latest(l, latest, sizeof latest);
    if (strcmp(latest, name) != 0)
        return TR_OK;
    char **names;
    size_t n;
    if (collect(l, &names, &n, 0, err) != TR_OK)
        return TR_ERROR;
    int rc = TR_OK;
    if (n > 0) {
        rc = write_latest(l, names[0], err);
    } else {
        char *lp = path_join(l->dir, "LATEST", NULL);
        if (lp && latest_is_ours(lp))
            unlink(lp);
        free(lp);
    }
    free_names(names, n);
    return rc;
}

/* A crash between publishing a checkpoint (the rename) and updating LATEST
 * leaves LATEST one behind: point it at the newest published checkpoint. */
static void repair_latest(struct local *l)
{
    char **names;
    size_t n;
    tr_err err = {{0}};
    if (collect(l, &names, &n, 0, &err) != TR_OK)
        return;
    char latest[4096];
    read_latest(l, latest, sizeof latest);
    if (n > 0 && strcmp(latest, names[0]) != 0) {
        if (write_latest(l, names[0], &err) == TR_OK && l->host && l->host->log)
            l->host->log(TR_LOG_WARN, "checkpoint", "%s/LATEST named \"%s\"; it now names the "
                         "newest checkpoint, %s (the last run stopped before updating it)",
                         l->dir, latest, names[0]);
    }
    free_names(names, n);
}

static const struct tr_checkpoint_vtable local_vtable = {
    .struct_size = sizeof(struct tr_checkpoint_vtable),
    .begin = local_begin,
    .put = local_put,
    .commit = local_commit,
    .abort = local_abort,
    .list = local_list,
    .get = local_get,
    .remove = local_remove,
    .put_stream = local_put_stream,
    .begin_shared = local_begin_shared,
    .detach = local_detach,
    .get_range = local_get_range,
};

static const struct tr_plugin_info local_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_CHECKPOINT,
    .name = "local",
    .version = "0.1.0",
    .description = "checkpoints as directories of files, published atomically by rename",
    .options = local_options,
    .config_size = sizeof(struct local_config),
    .create = local_create,
    .destroy = local_destroy,
    .vtable = &local_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &local_info;
}
