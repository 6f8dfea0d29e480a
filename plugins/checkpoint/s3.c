/*
 * checkpoint = { plugin = "s3", bucket = "..." }: checkpoints in an object
 * store that speaks the S3 API (AWS S3, GCS interoperability, MinIO, Ceph
 * RGW, Cloudflare R2), over libcurl with its built-in SigV4 signing.
 *
 * Layout in the bucket (keys, <prefix> as configured, e.g. "runs/exp1/"):
 *
 *   <prefix><name>/<blob>...    the blobs of one checkpoint
 *   <prefix><name>/MANIFEST     written after every blob: a checkpoint
 *                               without it is incomplete and never listed
 *   <prefix>LATEST              the name of the newest complete checkpoint,
 *                               plus "\n"; written after its MANIFEST
 *
 * S3 has no rename, but a single PUT is atomic, so the MANIFEST and LATEST
 * objects are the publication points: a crash or a dead server at any moment
 * leaves every checkpoint that has a MANIFEST intact, and LATEST never names
 * a checkpoint whose objects are not all there.
 *
 * put() writes each blob to a local staging directory (and fsyncs it);
 * commit() uploads the staged checkpoint.  The core calls commit() from its
 * own checkpoint writer thread (checkpoint.async, the default), so the step
 * loop does not wait for the network, and a failed upload reaches the core,
 * which reports it and fails the run when the last checkpoint did not land.
 *
 * With background = true, commit() instead hands the staged checkpoint to an
 * uploader thread of this plugin and returns at once, for hosts that call it
 * from the step loop.  The next begin() and destroy() wait for that upload
 * and log its error if it failed (the previous checkpoint then stays
 * LATEST); the core never sees that error.
 *
 * Either way a staged checkpoint whose upload did not end (the process was
 * killed, or in background mode the last upload failed) is uploaded when the
 * next run opens the same cache directory.
 *
 * list() and get() always read the bucket, never the local cache, so a run
 * resumes on any machine.
 *
 * Credentials come from where every AWS tool reads them, never from the
 * recipe: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else
 * the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or
 * ~/.aws/credentials, profile AWS_PROFILE or "default").  A recipe is shared
 * data: it may choose the endpoint, but requests signed with the user's keys
 * (and the session token, sent as it is) go only to AWS's own S3 hosts or to
 * an endpoint the user named outside the recipe (TRAINRUN_S3_ENDPOINT,
 * AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL).
 *
 * This file holds the options, create/destroy and the vtable; the rest of
 * the plugin (one shared object) is s3_credentials.c (credentials and the
 * endpoint policy above), s3_http.c (requests, retries, error hints, object
 * operations), s3_upload.c (staging, the upload, crash recovery) and
 * s3_format.c (SHA-256, buffers, XML, the MANIFEST), sharing s3_internal.h.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file and thread APIs under strict C11 */

#include <trainrun/plugin.h>

#include "files.h"
#include "s3_internal.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

struct s3_config {
    const char *bucket;
    const char *prefix;
    const char *endpoint;
    const char *region;
    const char *access_key_env;
    const char *secret_key_env;
    const char *session_token_env;
    int path_style;
    int64_t timeout;
    int64_t retries;
    const char *cache_dir;
    int background;
};

static const struct tr_option s3_options[] = {
    {TR_OPT_STRING, "bucket", NULL, 0, 0, NULL,
     "required: the bucket holding the checkpoints; it must exist",
     offsetof(struct s3_config, bucket)},
    {TR_OPT_STRING, "prefix", "", 0, 0, NULL,
     "key prefix for this run's objects, e.g. \"runs/exp1/\" (keys are <prefix><name>/<blob>, "
     "<prefix><name>/MANIFEST and <prefix>LATEST); include the trailing /",
     offsetof(struct s3_config, prefix)},
    {TR_OPT_STRING, "endpoint", "", 0, 0, NULL,
     "base URL of the S3 API, e.g. http://127.0.0.1:9000 for MinIO, "
     "https://storage.googleapis.com for GCS, https://<account>.r2.cloudflarestorage.com for R2; "
     "empty: TRAINRUN_S3_ENDPOINT, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else "
     "https://s3.amazonaws.com. Your credentials go to a host other than AWS's S3 only when "
     "you named it in one of those variables (see docs/checkpoints-s3.md)",
     offsetof(struct s3_config, endpoint)},
    {TR_OPT_STRING, "region", "us-east-1", 0, 0, NULL,
     "region the requests are signed for (SigV4); must be the bucket's region on AWS; "
     "\"auto\" for R2",
     offsetof(struct s3_config, region)},
    /* Removed: a recipe could name any variable (a CI token, a database
     * password) and have its value sent to a host of its choice.  Kept in
     * the schema only to tell an old recipe what replaced them. */
    {TR_OPT_STRING, "access_key_env", "", 0, 0, NULL,
     "removed: credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or "
     "~/.aws/credentials, never from a recipe; setting it is an error",
     offsetof(struct s3_config, access_key_env)},
    {TR_OPT_STRING, "secret_key_env", "", 0, 0, NULL,
     "removed, as access_key_env", offsetof(struct s3_config, secret_key_env)},
    {TR_OPT_STRING, "session_token_env", "", 0, 0, NULL,
     "removed: a session token comes from AWS_SESSION_TOKEN or the credentials file",
     offsetof(struct s3_config, session_token_env)},
    {TR_OPT_BOOL, "path_style", "true", 0, 0, NULL,
     "true: URLs are <endpoint>/<bucket>/<key> (MinIO, Ceph, most S3-compatible servers); "
     "false: virtual-hosted style, <scheme>://<bucket>.<endpoint host>/<key>",
     offsetof(struct s3_config, path_style)},
    {TR_OPT_INT, "timeout", "60", 1, 86400, NULL,
     "seconds: a request that cannot connect, or that moves no data, for this long fails "
     "(and is retried); large uploads may take longer in total",
     offsetof(struct s3_config, timeout)},
    {TR_OPT_INT, "retries", "3", 0, 20, NULL,
     "times a failed request (connection error, HTTP 5xx, throttling) is retried, after "
     "0.5 s, 1 s, 2 s...",
     offsetof(struct s3_config, retries)},
    {TR_OPT_STRING, "cache_dir", "", 0, 0, NULL,
     "local directory where blobs are staged before they are uploaded; empty: "
     "<run_dir>/s3-staging. A relative path is relative to the run directory. Needs room "
     "for one checkpoint; an upload cut short by a crash is finished by the next run that "
     "uses it",
     offsetof(struct s3_config, cache_dir)},
    {TR_OPT_BOOL, "background", "false", 0, 0, NULL,
     "false: commit uploads, and a failure reaches the core (with checkpoint.async = true, "
     "the default, that happens in the core's writer thread, off the step loop). true: "
     "commit returns once the blobs are staged and a thread of this plugin uploads them; "
     "the next save and the end of the run wait for it and log a failure, which leaves the "
     "previous checkpoint as LATEST but does not change the run's exit status",
     offsetof(struct s3_config, background)},
    {.type = TR_OPT_END},
};

/* ---- create / destroy --------------------------------------------------------- */

static void s3_abort(void *self);

static void s3_destroy(void *self)
{
    struct s3 *s = self;
    if (!s)
        return;
    s3_abort(s);
    tr_err why = {{0}};
    if (wait_for_upload(s, 1, 1, &why) != TR_OK)
        log_msg(s, TR_LOG_ERROR, "%s", without_plugin_prefix(why.msg));
    if (s->curl)
        curl_easy_cleanup(s->curl);
    if (s->curl_ready)
        curl_global_cleanup();
    pthread_mutex_destroy(&s->latest_lock);
    pthread_mutex_destroy(&s->call_lock);
    manifest_free(&s->manifest);
    free(s->manifest_name);
    free(s->bucket);
    free(s->prefix);
    free(s->endpoint);
    free(s->sigv4);
    if (s->credentials) /* do not leave the secret in freed memory */
        memset(s->credentials, 0, strlen(s->credentials));
    if (s->token_header)
        memset(s->token_header, 0, strlen(s->token_header));
    free(s->creds_source);
    free(s->credentials);
    free(s->token_header);
    free(s->cache_dir);
    free(s);
}

/* The recipe's options: no removed credential keys, a bare bucket name, a
 * region of letters, digits and dashes. */
static int check_options(const struct s3_config *cfg, tr_err *err)
{
    const char *removed = cfg->access_key_env[0]    ? "access_key_env"
                          : cfg->secret_key_env[0]    ? "secret_key_env"
                          : cfg->session_token_env[0] ? "session_token_env"
                                                      : NULL;
    if (removed)
        return tr_fail(err, "s3 checkpoint: checkpoint.%s was removed: a recipe no longer says "
                            "where credentials come from; they come from the standard places, "
                            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, or "
                            "~/.aws/credentials (AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE): "
                            "delete checkpoint.%s from the recipe", removed, removed);
    return check_bucket_region(cfg->bucket, cfg->path_style, cfg->region, err);
}

/* s's settings from the options, the endpoint (s owns it now) and the
 * credentials (freed here); -1 when out of memory. */
static int fill_settings(struct s3 *s, const struct s3_config *cfg, char *endpoint,
                         struct credentials *creds, const char *run_dir)
{
    s->path_style = cfg->path_style;
    s->background = cfg->background;
    s->timeout = (long)cfg->timeout;
    s->retries = (int)cfg->retries;
    s->bucket = strdup(cfg->bucket);
    s->prefix = strdup(cfg->prefix);
    s->endpoint = endpoint;
    s->sigv4 = str_printf("aws:amz:%s:s3", cfg->region);
    s->credentials = str_printf("%s:%s", creds->access, creds->secret);
    int want_token = creds->token && creds->token[0];
    if (want_token)
        s->token_header = str_printf("x-amz-security-token: %s", creds->token);
    s->creds_source = creds->source;
    creds->source = NULL;
    credentials_free(creds);
    if (!cfg->cache_dir[0])
        s->cache_dir = path_join(run_dir, "s3-staging");
    else if (cfg->cache_dir[0] == '/')
        s->cache_dir = strdup(cfg->cache_dir);
    else
        s->cache_dir = path_join(run_dir, cfg->cache_dir);
    if (!s->bucket || !s->prefix || !s->endpoint || !s->sigv4 ||
        !s->credentials || (want_token && !s->token_header) || !s->cache_dir)
        return -1;
    /* "https://host/" would make every URL "https://host//bucket" */
    for (size_t n = strlen(s->endpoint); n > 8 && s->endpoint[n - 1] == '/'; n--)
        s->endpoint[n - 1] = '\0';
    for (size_t n = strlen(s->cache_dir); n > 1 && s->cache_dir[n - 1] == '/'; n--)
        s->cache_dir[n - 1] = '\0';
    return 0;
}

/* curl ready and the staging directory made. */
static int start_client(struct s3 *s, tr_err *err)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return tr_fail(err, "s3 checkpoint: curl_global_init failed");
    s->curl_ready = 1;
    if (!(s->curl = curl_easy_init()))
        return tr_fail(err, "s3 checkpoint: curl_easy_init failed (out of memory?)");
    if (mkdir_p(s->cache_dir) != 0) {
        int e = errno;
        return tr_fail(err, "s3 checkpoint: cannot create the staging directory %s: %s%s",
                       s->cache_dir, strerror(e), disk_hint(e));
    }
    return TR_OK;
}

/* Fail now, not after the first save, when the bucket cannot be used. */
static int probe_bucket(struct s3 *s, tr_err *err)
{
    struct buf query = {0};
    if (buf_printf(&query, "list-type=2&max-keys=1&prefix=") || uri_encode(&query, s->prefix, 0)) {
        buf_free(&query);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    struct request probe = {.method = "GET", .query = query.data, .listing = s->prefix};
    int rc = s3_request(s, s->curl, &probe, 0, err);
    buf_free(&query);
    buf_free(&probe.response);
    return rc;
}

static int s3_create(const struct tr_host *host, const void *config,
                     const struct tr_create_args *args, void **self, tr_err *err)
{
    const struct s3_config *cfg = config;
    if (!host || !host->alloc || !host->free)
        return tr_fail(err, "s3 checkpoint: the host provides no allocator");
    if (check_options(cfg, err) != TR_OK)
        return TR_ERROR;
    char *endpoint = NULL;
    if (choose_endpoint(cfg->endpoint, &endpoint, err) != TR_OK)
        return TR_ERROR;
    struct credentials creds;
    if (load_checked_credentials(&creds, err) != TR_OK) {
        free(endpoint);
        return TR_ERROR;
    }
    const char *run_dir = args->run_dir ? args->run_dir : "";
    struct s3 *s = NULL;
    if (cfg->cache_dir[0] != '/' && !run_dir[0])
        tr_fail(err, "s3 checkpoint: no run directory for the staging cache; set "
                     "checkpoint.cache_dir to an absolute path");
    else if (!(s = calloc(1, sizeof *s)))
        tr_fail(err, "s3 checkpoint: out of memory");
    if (!s) {
        credentials_free(&creds);
        free(endpoint);
        return TR_ERROR;
    }
    s->host = host;
    pthread_mutex_init(&s->latest_lock, NULL);
    pthread_mutex_init(&s->call_lock, NULL);
    if (fill_settings(s, cfg, endpoint, &creds, run_dir) != 0) {
        s3_destroy(s);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    if (!s->path_style && strchr(s->bucket, '.') && strncmp(s->endpoint, "https://", 8) == 0)
        log_msg(s, TR_LOG_WARN, "bucket \"%s\" has dots: virtual-hosted https URLs will fail "
                                "certificate checks; use path_style = true", s->bucket);
    if (start_client(s, err) != TR_OK || probe_bucket(s, err) != TR_OK) {
        s3_destroy(s);
        return TR_ERROR;
    }
    /* Only one process may tidy up: another rank could be mid-save. */
    if (args->rank == 0)
        recover_staging(s);
    *self = s;
    return TR_OK;
}

/* ---- writing ------------------------------------------------------------------- */

static int do_begin(void *self, const char *name, tr_err *err)
{
    struct s3 *s = self;
    if (!valid_name(name))
        return tr_fail(err, "s3 checkpoint: invalid checkpoint name \"%s\": use a plain name "
                            "without '/', not starting with '.', and not LATEST",
                       name ? name : "(null)");
    if (s->open)
        return tr_fail(err, "s3 checkpoint: begin(\"%s\") while checkpoint \"%s\" is still "
                            "open; commit or abort it first",
                       name, s->open->name);
    /* The barrier.  A failed upload is reported, not fatal: this save may
     * well succeed, and the bucket still holds the previous checkpoint. */
    tr_err why = {{0}};
    if (wait_for_upload(s, 1, 0, &why) != TR_OK)
        log_msg(s, TR_LOG_ERROR, "%s", without_plugin_prefix(why.msg));

    struct upload *u = calloc(1, sizeof *u);
    if (!u)
        return tr_fail(err, "s3 checkpoint: out of memory");
    u->name = strdup(name);
    char *dir_name = str_printf(STAGING_PREFIX "%s-%ld", name, (long)getpid());
    u->staging = dir_name ? path_join(s->cache_dir, dir_name) : NULL;
    free(dir_name);
    if (!u->name || !u->staging) {
        upload_free(u);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    remove_tree(u->staging); /* a leftover of this very process; usually absent */
    if (make_owned_dir(u->staging) != 0) {
        int e = errno;
        tr_fail(err, "s3 checkpoint: cannot create the staging directory %s: %s; the previous "
                     "checkpoint is untouched%s",
                u->staging, strerror(e), disk_hint(e));
        upload_free(u);
        return TR_ERROR;
    }
    s->open = u;
    return TR_OK;
}

static int do_put(void *self, const char *blob, const void *data, size_t size, tr_err *err)
{
    struct s3 *s = self;
    struct upload *u = s->open;
    if (!u)
        return tr_fail(err, "s3 checkpoint: put(\"%s\") without begin()", blob ? blob : "");
    if (!valid_blob(blob) || strcmp(blob, MANIFEST_BLOB) == 0 ||
        strcmp(blob, COMMITTED_MARK) == 0 || strcmp(blob, TR_OWNER_MARK) == 0)
        return tr_fail(err, "s3 checkpoint: invalid blob name \"%s\": blob names are plain "
                            "names (not empty, no '/' or control characters, not . or .., "
                            "not MANIFEST or COMMITTED)",
                       blob ? blob : "(null)");
    if (manifest_find(&u->blobs, blob))
        return tr_fail(err, "s3 checkpoint: blob %s written twice to checkpoint %s", blob,
                       u->name);
    if ((uint64_t)size > MAX_PUT_SIZE)
        return tr_fail(err, "s3 checkpoint: blob %s is %zu bytes; one S3 PUT takes at most "
                            "5 GiB and this plugin does not do multipart uploads; use the "
                            "local checkpoint plugin for this model",
                       blob, size);
    char *path = path_join(u->staging, blob);
    if (!path)
        return tr_fail(err, "s3 checkpoint: out of memory");
    if (write_file(path, data, size, 1, 1) != 0) {
        int e = errno;
        tr_fail(err, "s3 checkpoint: cannot stage %s: %s; the previous checkpoint is "
                     "untouched%s",
                path, strerror(e), disk_hint(e));
        free(path);
        return TR_ERROR;
    }
    free(path);
    if (manifest_add(&u->blobs, blob, size, NULL) != 0)
        return tr_fail(err, "s3 checkpoint: out of memory");
    u->blobs.entries[u->blobs.n - 1].has_crc = 1;
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t done = 0; done < size;) { /* zlib takes at most 4 GiB a call */
        size_t n = size - done > (1u << 30) ? (1u << 30) : size - done;
        crc = crc32(crc, (const unsigned char *)data + done, (uInt)n);
        done += n;
    }
    u->blobs.entries[u->blobs.n - 1].crc = crc;
    return TR_OK;
}

static int do_commit(void *self, tr_err *err)
{
    struct s3 *s = self;
    struct upload *u = s->open;
    if (!u)
        return tr_fail(err, "s3 checkpoint: commit() without begin()");
    if (u->blobs.n == 0)
        return tr_fail(err, "s3 checkpoint: checkpoint %s has no blobs", u->name);
    /* The mark lists the blobs: a crash before the upload ends leaves
     * enough behind for the next run to finish it.  A checkpoint of
     * several ranks has none: its other ranks' blobs are not here to list,
     * so a crash leaves it unpublished (the previous one stays LATEST). */
    if (u->nonce)
        goto marked;
    struct buf mark = {0};
    for (size_t i = 0; i < u->blobs.n; i++)
        if (buf_printf(&mark, "%s\t%lu\n", u->blobs.entries[i].blob,
                       u->blobs.entries[i].crc))
            break;
    char *mark_path = path_join(u->staging, COMMITTED_MARK);
    if (!mark_path || !mark.data) {
        free(mark_path);
        buf_free(&mark);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    int failed = write_file(mark_path, mark.data, mark.len, 0, 1) != 0 ||
                 fsync_dir(u->staging) != 0;
    int e = errno;
    free(mark_path);
    buf_free(&mark);
    if (failed)
        return tr_fail(err, "s3 checkpoint: cannot stage %s: %s; the previous checkpoint is "
                            "untouched%s",
                       u->staging, strerror(e), disk_hint(e));
marked:
    if (s->manifest_name && strcmp(s->manifest_name, u->name) == 0) {
        free(s->manifest_name); /* about to be replaced */
        s->manifest_name = NULL;
        manifest_free(&s->manifest);
    }
    s->open = NULL;
    s->uploading = u;
    if (s->background && pthread_create(&s->uploader, NULL, uploader_main, s) == 0) {
        s->uploader_running = 1;
        return TR_OK;
    }
    /* in the foreground: the caller learns the outcome, and on failure the
     * staged copy goes (the core is told this checkpoint was not saved) */
    upload_and_clean(s, u);
    return wait_for_upload(s, 0, 0, err);
}

static void do_abort(void *self)
{
    struct s3 *s = self;
    struct upload *u = s->open;
    if (!u)
        return;
    if (remove_tree(u->staging) != 0 && errno != ENOENT)
        log_msg(s, TR_LOG_WARN, "cannot remove %s, an abandoned checkpoint: %s; remove it by "
                                "hand", u->staging, strerror(errno));
    upload_free(u);
    s->open = NULL;
}

/* ---- several ranks, one checkpoint (ABI 2.5) ------------------------------------ */

/* The publisher begins as begin() does and hands out a nonce; a joiner
 * stages its blobs as begin() does, and detach() uploads them under the
 * checkpoint's name with their list (PART-<nonce>-<pid>), which the
 * publisher's commit adds to its MANIFEST. */
static int do_begin_shared(void *self, const char *name, char *token, size_t token_size,
                           int publisher, tr_err *err)
{
    struct s3 *s = self;
    char nonce[64];
    if (publisher) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(nonce, sizeof nonce, "%ld-%ld-%ld", (long)getpid(), (long)ts.tv_sec,
                 (long)ts.tv_nsec);
        if (!token || token_size <= strlen(nonce))
            return tr_fail(err, "s3 checkpoint: no room for the token");
    } else {
        size_t n = token ? strnlen(token, token_size) : 0;
        int ok = n > 0 && n < sizeof nonce;
        for (size_t i = 0; ok && i < n; i++)
            ok = (token[i] >= '0' && token[i] <= '9') || token[i] == '-';
        if (!ok)
            return tr_fail(err, "s3 checkpoint: cannot join checkpoint \"%s\": \"%.64s\" is "
                                "no token of this plugin", name ? name : "(null)",
                           token ? token : "");
        memcpy(nonce, token, n + 1);
    }
    if (do_begin(s, name, err) != TR_OK)
        return TR_ERROR;
    if (!(s->open->nonce = strdup(nonce))) {
        do_abort(s);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    s->open->joined = !publisher;
    if (publisher)
        memcpy(token, nonce, strlen(nonce) + 1);
    return TR_OK;
}

static int do_detach(void *self, tr_err *err)
{
    struct s3 *s = self;
    struct upload *u = s->open;
    if (!u || !u->joined)
        return tr_fail(err, "s3 checkpoint: detach() without begin_shared() as a joiner");
    int rc = upload_part(s, u, err);
    if (rc != TR_OK)
        remove_tree(u->staging);
    upload_free(u);
    s->open = NULL;
    return rc;
}

/* ---- reading --------------------------------------------------------------------- */

static int do_list(void *self, void (*each)(void *ud, const char *name), void *ud, tr_err *err)
{
    struct s3 *s = self;
    char **names;
    size_t n;
    if (complete_checkpoints(s, s->curl, &names, &n, err) != TR_OK)
        return TR_ERROR;
    for (size_t i = 0; i < n; i++)
        each(ud, names[i]);
    free_strings(names, n);
    return TR_OK;
}

/* The MANIFEST of `name`, read once and kept for the get() calls that follow. */
static int load_manifest(struct s3 *s, const char *name, tr_err *err)
{
    if (s->manifest_name && strcmp(s->manifest_name, name) == 0)
        return TR_OK;
    free(s->manifest_name);
    s->manifest_name = NULL;
    manifest_free(&s->manifest);
    char *key = object_key(s, name, MANIFEST_BLOB);
    if (!key)
        return tr_fail(err, "s3 checkpoint: out of memory");
    char *text = NULL;
    int found;
    int rc = get_small(s, s->curl, key, &text, &found, err);
    if (rc == TR_OK && !found)
        rc = tr_fail(err, "s3 checkpoint: no complete checkpoint %s in s3://%s/%s at %s (%s "
                          "is missing: never uploaded, or its upload failed)",
                     name, s->bucket, s->prefix, s->endpoint, key);
    char why[256];
    if (rc == TR_OK && manifest_parse(text, &s->manifest, why, sizeof why) != 0)
        rc = tr_fail(err, "s3 checkpoint: s3://%s/%s at %s is not a MANIFEST this plugin "
                          "wrote: %s",
                     s->bucket, key, s->endpoint, why);
    if (rc == TR_OK && !(s->manifest_name = strdup(name))) {
        manifest_free(&s->manifest);
        rc = tr_fail(err, "s3 checkpoint: out of memory");
    }
    free(text);
    free(key);
    return rc;
}

static int do_get(void *self, const char *name, const char *blob, void **data, size_t *size,
                  tr_err *err)
{
    struct s3 *s = self;
    *data = NULL;
    *size = 0;
    if (!valid_name(name) || !valid_blob(blob))
        return tr_fail(err, "s3 checkpoint: invalid checkpoint or blob name \"%s/%s\"",
                       name ? name : "(null)", blob ? blob : "(null)");
    if (load_manifest(s, name, err) != TR_OK)
        return TR_ERROR;
    const struct manifest_entry *e = manifest_find(&s->manifest, blob);
    if (!e)
        return tr_fail(err, "s3 checkpoint: checkpoint %s has no blob %s (its MANIFEST in "
                            "s3://%s/%s lists none); it was written by a different "
                            "configuration",
                       name, blob, s->bucket, s->prefix);
    if (e->size > SIZE_MAX - 1)
        return tr_fail(err, "s3 checkpoint: blob %s of %s is too large for this machine", blob,
                       name);
    char *key = object_key(s, name, blob);
    unsigned char *buf = key ? s->host->alloc(e->size ? (size_t)e->size : 1) : NULL;
    if (!buf) {
        free(key);
        return tr_fail(err, "s3 checkpoint: out of memory reading %s/%s (%llu bytes)", name,
                       blob, (unsigned long long)e->size);
    }
    struct request r = {.method = "GET", .key = key, .sink = buf, .sink_size = e->size};
    int rc = s3_request(s, s->curl, &r, 0, err);
    buf_free(&r.response);
    if (rc == TR_OK) {
        char hex[65];
        sha256_hex(buf, (size_t)e->size, hex);
        if (strcmp(hex, e->sha256) != 0)
            rc = tr_fail(err, "s3 checkpoint: s3://%s/%s at %s does not match the SHA-256 in "
                              "its MANIFEST; the object was changed or damaged",
                         s->bucket, key, s->endpoint);
    }
    free(key);
    if (rc != TR_OK) {
        s->host->free(buf);
        return TR_ERROR;
    }
    *data = buf;
    *size = (size_t)e->size;
    return TR_OK;
}

/* size bytes of a published blob from offset, by a ranged GET */
static int do_get_range(void *self, const char *name, const char *blob, uint64_t offset,
                        void *buf, size_t size, tr_err *err)
{
    struct s3 *s = self;
    if (!valid_name(name) || !valid_blob(blob))
        return tr_fail(err, "s3 checkpoint: invalid checkpoint or blob name \"%s/%s\"",
                       name ? name : "(null)", blob ? blob : "(null)");
    if (load_manifest(s, name, err) != TR_OK)
        return TR_ERROR;
    const struct manifest_entry *e = manifest_find(&s->manifest, blob);
    if (!e)
        return tr_fail(err, "s3 checkpoint: checkpoint %s has no blob %s (its MANIFEST in "
                            "s3://%s/%s lists none)", name, blob, s->bucket, s->prefix);
    if (offset > e->size || size > e->size - offset)
        return tr_fail(err, "s3 checkpoint: blob %s of %s holds %llu bytes, fewer than the "
                            "%zu asked for at byte %llu", blob, name,
                       (unsigned long long)e->size, size, (unsigned long long)offset);
    if (size == 0)
        return TR_OK;
    char range[96];
    snprintf(range, sizeof range, "bytes=%llu-%llu", (unsigned long long)offset,
             (unsigned long long)(offset + size - 1));
    char *key = object_key(s, name, blob);
    if (!key)
        return tr_fail(err, "s3 checkpoint: out of memory");
    struct request r = {.method = "GET", .key = key, .range = range, .sink = buf,
                        .sink_size = size};
    int rc = s3_request(s, s->curl, &r, 0, err);
    buf_free(&r.response);
    free(key);
    return rc;
}

static int do_remove(void *self, const char *name, tr_err *err)
{
    struct s3 *s = self;
    if (!valid_name(name))
        return tr_fail(err, "s3 checkpoint: invalid checkpoint name \"%s\"",
                       name ? name : "(null)");
    if (s->manifest_name && strcmp(s->manifest_name, name) == 0) {
        free(s->manifest_name);
        s->manifest_name = NULL;
        manifest_free(&s->manifest);
    }
    /* MANIFEST first: a half-deleted checkpoint is then never listed */
    char *manifest_key = object_key(s, name, MANIFEST_BLOB);
    char *dir = object_key(s, name, "");
    char **keys = NULL;
    size_t n = 0;
    int rc = manifest_key && dir ? TR_OK : tr_fail(err, "s3 checkpoint: out of memory");
    if (rc == TR_OK)
        rc = delete_object(s, s->curl, manifest_key, err);
    if (rc == TR_OK)
        rc = list_keys(s, s->curl, dir, &keys, &n, err);
    for (size_t i = 0; rc == TR_OK && i < n; i++)
        rc = delete_object(s, s->curl, keys[i], err);
    free_strings(keys, n);
    free(manifest_key);
    free(dir);
    if (rc != TR_OK)
        return TR_ERROR;

    /* keep LATEST pointing at a checkpoint that exists */
    pthread_mutex_lock(&s->latest_lock);
    char *latest = NULL;
    rc = read_latest(s, s->curl, &latest, err);
    if (rc == TR_OK && strcmp(latest, name) == 0)
        rc = repoint_latest(s, s->curl, name, err);
    pthread_mutex_unlock(&s->latest_lock);
    free(latest);
    return rc;
}

/* ---- the vtable: one call at a time ------------------------------------------- */

static int s3_begin(void *self, const char *name, tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_begin(s, name, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static int s3_put(void *self, const char *blob, const void *data, size_t size, tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_put(s, blob, data, size, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static int s3_commit(void *self, tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_commit(s, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static void s3_abort(void *self)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    do_abort(s);
    pthread_mutex_unlock(&s->call_lock);
}

static int s3_list(void *self, void (*each)(void *ud, const char *name), void *ud, tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_list(s, each, ud, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static int s3_get(void *self, const char *name, const char *blob, void **data, size_t *size,
                  tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_get(s, name, blob, data, size, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static int s3_remove(void *self, const char *name, tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_remove(s, name, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static int s3_begin_shared(void *self, const char *name, char *token, size_t token_size,
                           int publisher, tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_begin_shared(s, name, token, token_size, publisher, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static int s3_detach(void *self, tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_detach(s, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static int s3_get_range(void *self, const char *name, const char *blob, uint64_t offset,
                        void *buf, size_t size, tr_err *err)
{
    struct s3 *s = self;
    pthread_mutex_lock(&s->call_lock);
    int rc = do_get_range(s, name, blob, offset, buf, size, err);
    pthread_mutex_unlock(&s->call_lock);
    return rc;
}

static const struct tr_checkpoint_vtable s3_vtable = {
    .struct_size = sizeof(struct tr_checkpoint_vtable),
    .begin = s3_begin,
    .put = s3_put,
    .commit = s3_commit,
    .abort = s3_abort,
    .list = s3_list,
    .get = s3_get,
    .remove = s3_remove,
    .begin_shared = s3_begin_shared,
    .detach = s3_detach,
    .get_range = s3_get_range,
};

static const struct tr_plugin_info s3_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_CHECKPOINT,
    .name = "s3",
    .version = "0.1.0",
    .description = "checkpoints in an S3-compatible object store (AWS, GCS, MinIO, Ceph, R2), "
                   "published atomically by MANIFEST and LATEST objects",
    .options = s3_options,
    .config_size = sizeof(struct s3_config),
    .create = s3_create,
    .destroy = s3_destroy,
    .vtable = &s3_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &s3_info;
}
