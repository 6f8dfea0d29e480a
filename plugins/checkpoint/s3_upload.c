/*
 * The s3 checkpoint plugin's local side of a save: the staging directory
 * put() writes to, the upload of a staged checkpoint (blobs, then MANIFEST,
 * then LATEST) on the core's writer thread or the plugin's own uploader
 * thread, the barrier that waits for it, and crash recovery of staged
 * checkpoints an earlier process left behind.  The plugin's layout and
 * policy are described at the top of s3.c.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file and thread APIs under strict C11 */

#include "s3_internal.h"

#include "files.h"

#include <trainrun/input.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

/* ---- local staging ------------------------------------------------------------ */

char *path_join(const char *a, const char *b)
{
    return str_printf("%s/%s", a, b);
}

const char *disk_hint(int errnum)
{
    return DISK_HINT(errnum, "checkpoint.cache_dir");
}

void upload_free(struct upload *u)
{
    if (!u)
        return;
    free(u->name);
    free(u->staging);
    free(u->nonce);
    manifest_free(&u->blobs);
    free(u);
}

/* ---- the upload --------------------------------------------------------------- */

/* Hash one staged file; its size must be what put() wrote. */
/* SHA-256 of a staged file (for the request), and its CRC-32 checked
 * against what put() wrote: a staged copy changed or damaged on disk since
 * (a crash, another program) is not uploaded as the checkpoint. */
int hash_file(FILE *f, const char *path, const struct manifest_entry *e, char hex[65],
              tr_err *err)
{
    uint64_t size = e->size;
    struct sha256 h;
    sha256_init(&h);
    unsigned char chunk[1 << 16];
    uint64_t total = 0;
    size_t got;
    uLong crc = crc32(0L, Z_NULL, 0);
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        sha256_update(&h, chunk, got);
        crc = crc32(crc, chunk, (uInt)got);
        total += got;
    }
    if (ferror(f))
        return tr_fail(err, "s3 checkpoint: cannot read staged file %s: %s", path,
                       strerror(errno));
    if (total != size)
        return tr_fail(err, "s3 checkpoint: staged file %s is %llu bytes, expected %llu; "
                            "something else changed it",
                       path, (unsigned long long)total, (unsigned long long)size);
    if (e->has_crc && crc != e->crc)
        return tr_fail(err, "s3 checkpoint: staged file %s fails its checksum: it changed "
                            "since it was written, so it is not uploaded",
                       path);
    sha256_final(&h, hex);
    return TR_OK;
}

static int upload_blob(const struct s3 *s, CURL *curl, struct upload *u,
                       struct manifest_entry *e, tr_err *err)
{
    char *path = path_join(u->staging, e->blob);
    char *key = object_key(s, u->name, e->blob);
    if (!path || !key) {
        free(path);
        free(key);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    int rc = TR_ERROR;
    /* never through a symlink: only the file staged here leaves the machine */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        tr_fail(err, "s3 checkpoint: cannot open staged file %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        goto out;
    }
    if (hash_file(f, path, e, e->sha256, err) != TR_OK)
        goto out;
    struct request r = {.method = "PUT", .key = key, .body_file = f, .body_size = e->size,
                        .body_sha256 = e->sha256, .content_type = "application/octet-stream"};
    rc = s3_request(s, curl, &r, 0, err);
    buf_free(&r.response);
    if (rc == TR_OK)
        u->bytes += e->size;
out:
    if (f)
        fclose(f);
    free(path);
    free(key);
    return rc;
}

const char *without_plugin_prefix(const char *msg)
{
    static const char prefix[] = "s3 checkpoint: ";
    return strncmp(msg, prefix, sizeof prefix - 1) == 0 ? msg + sizeof prefix - 1 : msg;
}

/* The blobs the other ranks of a shared checkpoint uploaded (their parts,
 * PART-<nonce>-<pid> objects, each a MANIFEST of its blobs) added to u's. */
static int merge_parts(const struct s3 *s, CURL *curl, struct upload *u, char ***keys,
                       size_t *n, tr_err *err)
{
    char *tail = str_printf("PART-%s-", u->nonce);
    char *prefix = tail ? object_key(s, u->name, tail) : NULL;
    free(tail);
    if (!prefix)
        return tr_fail(err, "s3 checkpoint: out of memory");
    int rc = list_keys(s, curl, prefix, keys, n, err);
    free(prefix);
    for (size_t i = 0; rc == TR_OK && i < *n; i++) {
        char *text = NULL, why[256];
        int found = 0;
        struct manifest m = {0};
        rc = get_small(s, curl, (*keys)[i], &text, &found, err);
        if (rc == TR_OK && (!found || manifest_parse(text, &m, why, sizeof why) != 0))
            rc = tr_fail(err, "s3 checkpoint: s3://%s/%s, a rank's part of %s, is %s", s->bucket,
                         (*keys)[i], u->name, found ? "damaged" : "gone");
        for (size_t j = 0; rc == TR_OK && j < m.n; j++)
            if (manifest_find(&u->blobs, m.entries[j].blob))
                rc = tr_fail(err, "s3 checkpoint: blob %s of %s was written by two ranks",
                             m.entries[j].blob, u->name);
            else if (manifest_add(&u->blobs, m.entries[j].blob, m.entries[j].size,
                                  m.entries[j].sha256) != 0)
                rc = tr_fail(err, "s3 checkpoint: out of memory");
        manifest_free(&m);
        free(text);
    }
    return rc;
}

/* A joined rank's blobs uploaded under the checkpoint's name, then their
 * list as PART-<nonce>-<pid>: invisible until the publisher's MANIFEST
 * names them.  The staged copy goes once they are up. */
int upload_part(struct s3 *s, struct upload *u, tr_err *err)
{
    CURL *curl = curl_easy_init();
    if (!curl)
        return tr_fail(err, "s3 checkpoint: curl_easy_init failed (out of memory?)");
    int rc = TR_OK;
    for (size_t i = 0; rc == TR_OK && i < u->blobs.n; i++)
        rc = upload_blob(s, curl, u, &u->blobs.entries[i], err);
    struct buf text = {0};
    char *tail = str_printf("PART-%s-%ld", u->nonce, (long)getpid());
    char *key = tail ? object_key(s, u->name, tail) : NULL;
    if (rc == TR_OK && (!key || manifest_format(&u->blobs, &text) != 0))
        rc = tr_fail(err, "s3 checkpoint: out of memory");
    if (rc == TR_OK)
        rc = put_small(s, curl, key, text.data, err);
    buf_free(&text);
    free(tail);
    free(key);
    curl_easy_cleanup(curl);
    if (rc == TR_OK && remove_tree(u->staging) != 0)
        log_msg(s, TR_LOG_WARN, "cannot remove the staged copy %s: %s; remove it by hand",
                u->staging, strerror(errno));
    return rc;
}

/* Blobs, then MANIFEST, then LATEST: each step only after the previous one
 * succeeded, so LATEST never names an incomplete checkpoint. */
static int upload_checkpoint(struct s3 *s, CURL *curl, struct upload *u, tr_err *err)
{
    double t0 = now_seconds();
    char *manifest_key = object_key(s, u->name, MANIFEST_BLOB);
    struct buf manifest = {0};
    int rc = TR_ERROR, published = 0;
    char **parts = NULL; /* the other ranks' PART objects, removed once published */
    size_t n_parts = 0;
    if (!manifest_key) {
        tr_fail(err, "s3 checkpoint: out of memory");
        goto out;
    }

    /* Replacing a checkpoint: unpublish it first, so that it is never listed
     * complete with a mix of old and new blobs, nor named by LATEST. */
    struct request head = {.method = "HEAD", .key = manifest_key};
    int exists = s3_request(s, curl, &head, 1, err) == TR_OK;
    buf_free(&head.response);
    if (!exists && head.status != 404)
        goto out;
    if (exists) {
        if (delete_object(s, curl, manifest_key, err) != TR_OK)
            goto out;
        pthread_mutex_lock(&s->latest_lock);
        char *latest = NULL;
        int lrc = read_latest(s, curl, &latest, err);
        if (lrc == TR_OK && strcmp(latest, u->name) == 0)
            lrc = repoint_latest(s, curl, u->name, err);
        pthread_mutex_unlock(&s->latest_lock);
        free(latest);
        if (lrc != TR_OK)
            goto out;
    }

    for (size_t i = 0; i < u->blobs.n; i++)
        if (upload_blob(s, curl, u, &u->blobs.entries[i], err) != TR_OK)
            goto out;
    if (u->nonce && merge_parts(s, curl, u, &parts, &n_parts, err) != TR_OK)
        goto out;
    if (manifest_format(&u->blobs, &manifest) != 0) {
        tr_fail(err, "s3 checkpoint: out of memory");
        goto out;
    }
    if (put_small(s, curl, manifest_key, manifest.data, err) != TR_OK)
        goto out;
    published = 1;

    pthread_mutex_lock(&s->latest_lock);
    char *latest = NULL;
    rc = TR_OK;
    /* a recovered upload may be older than what later runs published */
    if (u->recovered)
        rc = read_latest(s, curl, &latest, err);
    if (rc == TR_OK && (!latest || strcmp(latest, u->name) < 0))
        rc = write_latest(s, curl, u->name, err);
    pthread_mutex_unlock(&s->latest_lock);
    free(latest);
out:
    u->seconds = now_seconds() - t0;
    if (rc != TR_OK) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", without_plugin_prefix(err->msg));
        if (published)
            tr_fail(err, "s3 checkpoint: %s was uploaded, but LATEST was not updated: %s",
                    u->name, why);
    }
    for (size_t i = 0; published && i < n_parts; i++) {
        tr_err ignored = {{0}};
        delete_object(s, curl, parts[i], &ignored);
    }
    free_strings(parts, n_parts);
    buf_free(&manifest);
    free(manifest_key);
    return rc;
}

/* Upload u on a handle of its own; the staged copy goes once it is safe. */
void upload_and_clean(struct s3 *s, struct upload *u)
{
    CURL *curl = curl_easy_init();
    if (!curl) {
        u->failed = 1;
        tr_fail(&u->err, "s3 checkpoint: %s was not uploaded: curl_easy_init failed (out of "
                         "memory?)",
                u->name);
        return;
    }
    u->failed = upload_checkpoint(s, curl, u, &u->err) != TR_OK;
    curl_easy_cleanup(curl);
    if (u->failed)
        return; /* the caller decides whether the staged copy is worth keeping */
    if (remove_tree(u->staging) != 0)
        log_msg(s, TR_LOG_WARN, "cannot remove the staged copy %s: %s; remove it by hand",
                u->staging, strerror(errno));
    log_msg(s, TR_LOG_INFO, "uploaded %s to s3://%s/%s%s/ (%zu blobs, %.1f MB, %.1f s)",
            u->name, s->bucket, s->prefix, u->name, u->blobs.n, (double)u->bytes / 1e6,
            u->seconds);
}

void *uploader_main(void *arg)
{
    /* signals belong to the step loop; a write to a dead peer must fail
     * with EPIPE here, not kill the process */
    sigset_t block;
    sigfillset(&block);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    struct s3 *s = arg;
    upload_and_clean(s, s->uploading);
    return NULL;
}

/* The barrier: wait for the background upload, if any.  Returns TR_ERROR
 * with err set when it failed; `background` words the error for a log line
 * (nobody else will say the checkpoint is missing).  The staged copy of a
 * failed upload is kept when keep_failed (the next run in this cache_dir
 * uploads it), else removed: a newer checkpoint supersedes it. */
int wait_for_upload(struct s3 *s, int background, int keep_failed, tr_err *err)
{
    if (s->uploader_running) {
        pthread_join(s->uploader, NULL);
        s->uploader_running = 0;
    }
    struct upload *u = s->uploading;
    s->uploading = NULL;
    if (!u)
        return TR_OK;
    if (!u->failed) {
        upload_free(u);
        return TR_OK;
    }
    *err = u->err;
    if (background && strstr(err->msg, "LATEST was not updated") == NULL)
        tr_fail(err, "s3 checkpoint: %s was not uploaded, so LATEST still names an older "
                     "checkpoint: %s",
                u->name, without_plugin_prefix(u->err.msg));
    if (keep_failed) {
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n,
                 " (the staged copy in %s is uploaded by the next run that uses this "
                 "cache_dir)",
                 u->staging);
    } else if (remove_tree(u->staging) != 0 && errno != ENOENT) {
        log_msg(s, TR_LOG_WARN, "cannot remove %s, the staged copy of a failed upload: %s; "
                                "remove it by hand", u->staging, strerror(errno));
    }
    upload_free(u);
    return TR_ERROR;
}

/* ---- crash recovery ------------------------------------------------------- */

/* A staged checkpoint with a COMMITTED mark lists its blobs, one a line, in
 * put() order; read it back into an upload. */
struct upload *read_committed(const char *staging, const char *name)
{
    char *mark = path_join(staging, COMMITTED_MARK);
    FILE *f = mark ? tr_input_fopen(mark) : NULL;
    free(mark);
    if (!f)
        return NULL;
    struct upload *u = calloc(1, sizeof *u);
    int ok = u && (u->name = strdup(name)) && (u->staging = strdup(staging));
    char line[4096];
    while (ok && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        /* "<blob>\t<crc32>"; older marks name the blob alone */
        char *tab = strchr(line, '\t'), *end = NULL;
        unsigned long crc = 0;
        if (tab) {
            *tab = '\0';
            crc = strtoul(tab + 1, &end, 10);
        }
        char *path = path_join(staging, line);
        struct stat st;
        ok = valid_blob(line) && (!tab || (end != tab + 1 && !*end)) && path &&
             lstat(path, &st) == 0 && S_ISREG(st.st_mode) &&
             manifest_add(&u->blobs, line, (uint64_t)st.st_size, NULL) == 0;
        if (ok && tab) {
            u->blobs.entries[u->blobs.n - 1].has_crc = 1;
            u->blobs.entries[u->blobs.n - 1].crc = crc;
        }
        free(path);
    }
    fclose(f);
    if (!ok || u->blobs.n == 0) {
        upload_free(u);
        return NULL;
    }
    u->recovered = 1;
    return u;
}

/* Staging directories ".tmp-<name>-<pid>" left by an earlier process: a
 * committed one is uploaded now (its run stopped before the upload ended),
 * any other is removed.  Only directories with trainrun's marker count: a
 * look-alike the user made in cache_dir is neither uploaded nor removed. */
void recover_staging(struct s3 *s)
{
    DIR *d = opendir(s->cache_dir);
    if (!d)
        return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        const char *n = ent->d_name;
        if (strncmp(n, STAGING_PREFIX, strlen(STAGING_PREFIX)) != 0)
            continue;
        char *path = path_join(s->cache_dir, n);
        char *name = staged_name(n, STAGING_PREFIX);
        if (!path || !name) {
            free(path);
            free(name);
            continue;
        }
        if (!is_owned_dir(path)) {
            free(path);
            free(name);
            continue;
        }
        struct upload *u = valid_name(name) ? read_committed(path, name) : NULL;
        if (u) {
            log_msg(s, TR_LOG_WARN, "uploading %s, staged in %s by a run that stopped before "
                                    "its upload finished", name, path);
            s->uploading = u;
            upload_and_clean(s, u);
            tr_err why = {{0}};
            if (wait_for_upload(s, 1, 1, &why) != TR_OK)
                log_msg(s, TR_LOG_ERROR, "%s", without_plugin_prefix(why.msg));
        } else if (remove_tree(path) == 0) {
            log_msg(s, TR_LOG_WARN, "removed %s, left by an interrupted checkpoint save", path);
        } else {
            log_msg(s, TR_LOG_WARN, "cannot remove %s, left by an interrupted checkpoint save: "
                                    "%s; remove it by hand", path, strerror(errno));
        }
        free(path);
        free(name);
    }
    closedir(d);
}
