/*
 * The s3 checkpoint plugin's HTTP layer: one S3 request over libcurl (SigV4
 * signing by curl, bodies from memory or a staged file, responses into a
 * buffer or the caller's memory), retries with backoff, S3 error codes
 * mapped to messages that say what to do, and the object operations built
 * on it: small GETs and PUTs, DELETE, ListObjectsV2 paging, and the LATEST
 * pointer.  The plugin's layout and policy are described at the top of s3.c.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file and thread APIs under strict C11 */

#include "s3_internal.h"

#include "files.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

void log_msg(const struct s3 *s, enum tr_log_level level, const char *fmt, ...)
{
    if (!s->host || !s->host->log)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->host->log(level, "s3 checkpoint", "%s", msg);
}

double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_seconds(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- HTTP ------------------------------------------------------------------ */

struct read_cursor {
    struct request *req;
    uint64_t offset;
};

static size_t read_body(char *out, size_t size, size_t count, void *ud)
{
    struct read_cursor *c = ud;
    size_t want = size * count;
    uint64_t left = c->req->body_size - c->offset;
    if (want > left)
        want = (size_t)left;
    if (want == 0)
        return 0;
    if (c->req->body_file) {
        size_t got = fread(out, 1, want, c->req->body_file);
        if (got == 0)
            return CURL_READFUNC_ABORT; /* the staged file shrank or failed */
        want = got;
    } else {
        memcpy(out, (const char *)c->req->body + c->offset, want);
    }
    c->offset += want;
    return want;
}

struct write_context {
    struct request *req;
    CURL *curl;
};

static size_t write_body(char *data, size_t size, size_t count, void *ud)
{
    struct write_context *w = ud;
    struct request *r = w->req;
    size_t n = size * count;
    long status = 0;
    curl_easy_getinfo(w->curl, CURLINFO_RESPONSE_CODE, &status);
    if (r->sink && status >= 200 && status < 300) {
        if (n > r->sink_size - r->sink_filled) {
            r->sink_overflow = 1;
            return 0; /* aborts the transfer */
        }
        memcpy(r->sink + r->sink_filled, data, n);
        r->sink_filled += n;
        return n;
    }
    if (r->response.len + n > r->response_limit)
        return 0;
    return buf_append(&r->response, data, n) == 0 ? n : 0;
}

/* What a request is about, for messages: s3://bucket/key, or a listing. */
static void request_target(const struct s3 *s, const struct request *r, char *out, size_t size)
{
    if (r->key)
        snprintf(out, size, "s3://%s/%s", s->bucket, r->key);
    else
        snprintf(out, size, "s3://%s/ (listing keys under \"%s\")", s->bucket,
                 r->listing ? r->listing : "");
}

char *object_url(const struct s3 *s, const char *key, const char *query)
{
    struct buf url = {0};
    int failed = 0;
    if (s->path_style) {
        failed |= buf_printf(&url, "%s/", s->endpoint);
        failed |= uri_encode(&url, s->bucket, 0);
    } else {
        /* https://host -> https://bucket.host */
        const char *host = strstr(s->endpoint, "://") + 3;
        failed |= buf_append(&url, s->endpoint, (size_t)(host - s->endpoint));
        failed |= buf_printf(&url, "%s.%s", s->bucket, host);
    }
    failed |= buf_append(&url, "/", 1);
    if (key)
        failed |= uri_encode(&url, key, 1);
    if (query && *query)
        failed |= buf_printf(&url, "?%s", query);
    if (failed) {
        buf_free(&url);
        return NULL;
    }
    return url.data;
}

/* What to do about an S3 error code (or HTTP status when there is no body). */
const char *hint_for(const struct s3 *s, const char *code, long status)
{
    (void)s;
    static const struct {
        const char *code;
        const char *hint;
    } hints[] = {
        {"NoSuchBucket", "create the bucket, or fix checkpoint.bucket / checkpoint.endpoint"},
        {"AccessDenied", "the credentials lack permission: they need s3:ListBucket, "
                         "s3:GetObject, s3:PutObject and s3:DeleteObject on the bucket and prefix"},
        {"InvalidAccessKeyId", "check the access key (AWS_ACCESS_KEY_ID, or "
                               "aws_access_key_id in the credentials file)"},
        {"SignatureDoesNotMatch", "check the secret key (AWS_SECRET_ACCESS_KEY, or "
                                  "aws_secret_access_key in the credentials file) and "
                                  "checkpoint.region"},
        {"AuthorizationHeaderMalformed", "set checkpoint.region to the bucket's region"},
        {"PermanentRedirect", "the bucket lives elsewhere: set checkpoint.region and "
                              "checkpoint.endpoint to its region's endpoint"},
        {"IllegalLocationConstraintException", "set checkpoint.region to the bucket's region"},
        {"RequestTimeTooSkewed", "this machine's clock is off: synchronise it (NTP)"},
        {"ExpiredToken", "the temporary credentials expired: refresh them"},
        {"InvalidToken", "check the session token (AWS_SESSION_TOKEN, or aws_session_token "
                         "in the credentials file)"},
        {"XAmzContentSHA256Mismatch", "the data was corrupted on the way: check the network"},
        {"BadDigest", "the data was corrupted on the way: check the network"},
        {"SlowDown", "the server is throttling: save less often or raise checkpoint.retries"},
        {"EntityTooLarge", "the blob is larger than the server accepts in one request"},
        {"QuotaExceeded", "the bucket or account is out of quota: free space"},
    };
    for (size_t i = 0; code && i < sizeof hints / sizeof hints[0]; i++)
        if (strcmp(code, hints[i].code) == 0)
            return hints[i].hint;
    if (status == 301 || status == 307)
        return "the bucket lives elsewhere: check checkpoint.region, checkpoint.endpoint and "
               "checkpoint.path_style";
    if (status == 400)
        return "check checkpoint.region and checkpoint.endpoint";
    if (status == 401 || status == 403)
        return "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or the "
               "credentials file and AWS_PROFILE) and their permissions on the bucket";
    if (status >= 500)
        return "the server failed: retry later or raise checkpoint.retries";
    return "check checkpoint.endpoint, checkpoint.bucket and checkpoint.prefix";
}

int retryable(CURLcode rc, long status, const char *code)
{
    if (rc != CURLE_OK)
        return rc != CURLE_URL_MALFORMAT && rc != CURLE_UNSUPPORTED_PROTOCOL &&
               rc != CURLE_OUT_OF_MEMORY && rc != CURLE_ABORTED_BY_CALLBACK &&
               rc != CURLE_READ_ERROR && rc != CURLE_WRITE_ERROR;
    if (status >= 500 || status == 429 || status == 408)
        return 1;
    return code && (strcmp(code, "RequestTimeout") == 0 || strcmp(code, "SlowDown") == 0 ||
                    strcmp(code, "InternalError") == 0);
}

/* The request's headers: the body's SHA-256, its type, the session token.
 * The buffers hold the first two; NULL when out of memory. */
static struct curl_slist *request_headers(const struct s3 *s, const struct request *r,
                                          char sha_header[128], char type_header[128],
                                          char range_header[128])
{
    struct curl_slist *headers = NULL;
    snprintf(sha_header, 128, "x-amz-content-sha256: %s",
             r->body_sha256 ? r->body_sha256 : EMPTY_SHA256);
    headers = curl_slist_append(headers, sha_header);
    if (r->content_type) {
        snprintf(type_header, 128, "Content-Type: %s", r->content_type);
        headers = curl_slist_append(headers, type_header);
    }
    if (r->range) {
        snprintf(range_header, 128, "Range: %s", r->range);
        headers = curl_slist_append(headers, range_header);
    }
    if (s->token_header)
        headers = curl_slist_append(headers, s->token_header);
    /* No "Expect:" override here: curl 7.88 signs an emptied header and the
     * signature then fails.  100-continue also lets a server refuse a large
     * upload before it is sent. */
    return headers;
}

/* One attempt's options on a reset handle: signed with SigV4, timed out on
 * a stalled transfer, the body read from and the answer written to r. */
static void set_options(const struct s3 *s, CURL *curl, const struct request *r, const char *url,
                        struct curl_slist *headers, char *curl_error, struct read_cursor *cursor,
                        struct write_context *wctx)
{
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM */
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "trainrun-s3/0.1");
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, s->sigv4);
    curl_easy_setopt(curl, CURLOPT_USERPWD, s->credentials);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, s->timeout);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, s->timeout);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, wctx);
    if (strcmp(r->method, "PUT") == 0) {
        curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_body);
        curl_easy_setopt(curl, CURLOPT_READDATA, cursor);
        curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_size);
    } else if (strcmp(r->method, "HEAD") == 0) {
        curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r->method);
    }
}

/* The last attempt failed: say how (curl's error, or the server's code and
 * message with a hint), after how many attempts. */
static int request_failed(const struct s3 *s, const struct request *r, const char *what,
                          int attempt, CURLcode crc, const char *code, const char *curl_error,
                          tr_err *err)
{
    char tries[64] = "";
    if (attempt > 0)
        snprintf(tries, sizeof tries, " (%d attempts)", attempt + 1);
    if (crc != CURLE_OK)
        return tr_fail(err, "s3 checkpoint: %s %s at %s failed%s: %s%s%s; check that the server "
                            "is up and reachable and that checkpoint.endpoint is right",
                       r->method, what, s->endpoint, tries, curl_easy_strerror(crc),
                       curl_error[0] ? ": " : "", curl_error);
    char *message = xml_first(r->response.data, "Message");
    tr_fail(err, "s3 checkpoint: %s %s at %s failed%s: HTTP %ld%s%s%s%s; %s", r->method,
            what, s->endpoint, tries, r->status, code ? " " : "", code ? code : "",
            message ? ": " : "", message ? message : "", hint_for(s, code, r->status));
    free(message);
    return TR_ERROR;
}

/* One S3 request with retries.  Returns TR_OK for a 2xx answer.  Otherwise
 * TR_ERROR with err describing the failure (the HTTP status is in r->status,
 * 0 when no answer came), except that with quiet_404 a missing object is
 * left to the caller: status 404 and err untouched. */
int s3_request(const struct s3 *s, CURL *curl, struct request *r, int quiet_404,
               tr_err *err)
{
    char what[1024];
    request_target(s, r, what, sizeof what);
    char *url = object_url(s, r->key, r->query);
    if (!url)
        return tr_fail(err, "s3 checkpoint: out of memory");
    if (!r->response_limit)
        r->response_limit = MAX_LIST_RESPONSE;
    char sha_header[128], type_header[128], range_header[128];
    struct curl_slist *headers = request_headers(s, r, sha_header, type_header, range_header);
    if (!headers) {
        free(url);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }

    int rc = TR_ERROR;
    char curl_error[CURL_ERROR_SIZE];
    for (int attempt = 0;; attempt++) {
        curl_easy_reset(curl);
        curl_error[0] = '\0';
        buf_free(&r->response);
        r->status = 0;
        r->sink_filled = 0;
        r->sink_overflow = 0;
        struct read_cursor cursor = {r, 0};
        struct write_context wctx = {r, curl};
        if (r->body_file && fseeko(r->body_file, 0, SEEK_SET) != 0) {
            tr_fail(err, "s3 checkpoint: cannot rewind the staged file for %s: %s", what,
                    strerror(errno));
            break;
        }
        set_options(s, curl, r, url, headers, curl_error, &cursor, &wctx);
        CURLcode crc = curl_easy_perform(curl);
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r->status);
        if (crc == CURLE_OK && r->status >= 200 && r->status < 300) {
            if (r->sink && r->sink_filled != r->sink_size) {
                tr_fail(err, "s3 checkpoint: %s at %s is %llu bytes, but its MANIFEST says "
                             "%llu; the checkpoint is damaged",
                        what, s->endpoint, (unsigned long long)r->sink_filled,
                        (unsigned long long)r->sink_size);
                break;
            }
            rc = TR_OK;
            break;
        }
        if (crc == CURLE_WRITE_ERROR && r->sink_overflow) {
            tr_fail(err, "s3 checkpoint: %s at %s is larger than the %llu bytes its MANIFEST "
                         "says; the checkpoint is damaged",
                    what, s->endpoint, (unsigned long long)r->sink_size);
            break;
        }
        char *code = crc == CURLE_OK ? xml_first(r->response.data, "Code") : NULL;
        /* a missing object may be expected; a missing bucket never is */
        if (crc == CURLE_OK && r->status == 404 && quiet_404 &&
            (!code || strcmp(code, "NoSuchKey") == 0)) {
            free(code);
            break;
        }
        if (attempt < s->retries && retryable(crc, r->status, code)) {
            free(code);
            double delay = 0.5 * (double)(1 << (attempt < 5 ? attempt : 5));
            sleep_seconds(delay);
            continue;
        }
        request_failed(s, r, what, attempt, crc, code, curl_error, err);
        free(code);
        break;
    }
    curl_slist_free_all(headers);
    free(url);
    return rc;
}

char *object_key(const struct s3 *s, const char *name, const char *blob)
{
    return blob ? str_printf("%s%s/%s", s->prefix, name, blob) : str_printf("%s%s", s->prefix, name);
}

/* GET a small object (MANIFEST, LATEST) as a string.  *found = 0 on 404. */
int get_small(const struct s3 *s, CURL *curl, const char *key, char **text, int *found,
              tr_err *err)
{
    struct request r = {.method = "GET", .key = key, .response_limit = 16u << 20};
    *text = NULL;
    *found = 1;
    if (s3_request(s, curl, &r, 1, err) != TR_OK) {
        buf_free(&r.response);
        if (r.status == 404) {
            *found = 0;
            return TR_OK;
        }
        return TR_ERROR;
    }
    *text = r.response.data ? r.response.data : strdup("");
    if (!*text)
        return tr_fail(err, "s3 checkpoint: out of memory");
    return TR_OK;
}

int put_small(const struct s3 *s, CURL *curl, const char *key, const char *text,
              tr_err *err)
{
    char sha[65];
    sha256_hex(text, strlen(text), sha);
    struct request r = {.method = "PUT", .key = key, .body = text, .body_size = strlen(text),
                        .body_sha256 = sha, .content_type = "text/plain"};
    int rc = s3_request(s, curl, &r, 0, err);
    buf_free(&r.response);
    return rc;
}

int delete_object(const struct s3 *s, CURL *curl, const char *key, tr_err *err)
{
    struct request r = {.method = "DELETE", .key = key};
    int rc = s3_request(s, curl, &r, 1, err);
    int missing = rc != TR_OK && r.status == 404; /* already gone is fine */
    buf_free(&r.response);
    return missing ? TR_OK : rc;
}

/* Every key under key_prefix (ListObjectsV2, all pages), in fresh memory. */
int list_keys(const struct s3 *s, CURL *curl, const char *key_prefix, char ***keys,
              size_t *count, tr_err *err)
{
    *keys = NULL;
    *count = 0;
    char **out = NULL;
    size_t n = 0;
    char *token = NULL;
    int rc = TR_ERROR;
    for (;;) {
        /* parameters sorted by name: SigV4 signs the query as written */
        struct buf query = {0};
        int failed = 0;
        if (token) {
            failed |= buf_printf(&query, "continuation-token=");
            failed |= uri_encode(&query, token, 0);
            failed |= buf_printf(&query, "&");
        }
        failed |= buf_printf(&query, "list-type=2&prefix=");
        failed |= uri_encode(&query, key_prefix, 0);
        if (failed) {
            buf_free(&query);
            tr_fail(err, "s3 checkpoint: out of memory");
            goto out;
        }
        struct request r = {.method = "GET", .query = query.data, .listing = key_prefix};
        int got = s3_request(s, curl, &r, 0, err);
        buf_free(&query);
        if (got != TR_OK) {
            buf_free(&r.response);
            goto out;
        }
        const char *cursor = r.response.data ? r.response.data : "";
        char *key;
        while ((key = xml_next(&cursor, "Key")) != NULL) {
            char **grown = realloc(out, (n + 1) * sizeof *out);
            if (!grown) {
                free(key);
                buf_free(&r.response);
                tr_fail(err, "s3 checkpoint: out of memory");
                goto out;
            }
            out = grown;
            out[n++] = key;
        }
        char *truncated = xml_first(r.response.data, "IsTruncated");
        int more = truncated && strcmp(truncated, "true") == 0;
        free(truncated);
        free(token);
        token = more ? xml_first(r.response.data, "NextContinuationToken") : NULL;
        buf_free(&r.response);
        if (more && !token) {
            tr_fail(err, "s3 checkpoint: listing %s at %s: the answer is truncated but has no "
                         "NextContinuationToken; the server's ListObjectsV2 is incomplete",
                    s->bucket, s->endpoint);
            goto out;
        }
        if (!more)
            break;
    }
    *keys = out;
    *count = n;
    out = NULL;
    n = 0;
    rc = TR_OK;
out:
    for (size_t i = 0; i < n; i++)
        free(out[i]);
    free(out);
    free(token);
    return rc;
}

void free_strings(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Complete checkpoints (those with a MANIFEST), newest first. */
int complete_checkpoints(const struct s3 *s, CURL *curl, char ***names, size_t *count,
                         tr_err *err)
{
    char **keys;
    size_t n;
    if (list_keys(s, curl, s->prefix, &keys, &n, err) != TR_OK)
        return TR_ERROR;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        char *name = checkpoint_of_manifest_key(keys[i], s->prefix);
        free(keys[i]);
        if (name)
            keys[kept++] = name;
    }
    if (kept)
        qsort(keys, kept, sizeof *keys, newest_first);
    *names = keys;
    *count = kept;
    return TR_OK;
}

/* LATEST's name without the newline, "" when absent; fresh memory. */
int read_latest(const struct s3 *s, CURL *curl, char **name, tr_err *err)
{
    char *key = object_key(s, LATEST_KEY, NULL);
    if (!key)
        return tr_fail(err, "s3 checkpoint: out of memory");
    int found;
    int rc = get_small(s, curl, key, name, &found, err);
    free(key);
    if (rc != TR_OK)
        return rc;
    if (!found && !(*name = strdup("")))
        return tr_fail(err, "s3 checkpoint: out of memory");
    (*name)[strcspn(*name, "\r\n")] = '\0';
    return TR_OK;
}

int write_latest(const struct s3 *s, CURL *curl, const char *name, tr_err *err)
{
    char *key = object_key(s, LATEST_KEY, NULL);
    char *text = str_printf("%s\n", name);
    int rc = key && text ? put_small(s, curl, key, text, err)
                         : tr_fail(err, "s3 checkpoint: out of memory");
    free(key);
    free(text);
    return rc;
}

/* Point LATEST at the newest complete checkpoint other than `except`, or
 * delete it when there is none.  Caller holds latest_lock. */
int repoint_latest(const struct s3 *s, CURL *curl, const char *except, tr_err *err)
{
    char **names;
    size_t n;
    if (complete_checkpoints(s, curl, &names, &n, err) != TR_OK)
        return TR_ERROR;
    const char *newest = NULL;
    for (size_t i = 0; i < n && !newest; i++)
        if (strcmp(names[i], except) != 0)
            newest = names[i];
    int rc;
    if (newest) {
        rc = write_latest(s, curl, newest, err);
    } else {
        char *key = object_key(s, LATEST_KEY, NULL);
        rc = key ? delete_object(s, curl, key, err) : tr_fail(err, "s3 checkpoint: out of memory");
        free(key);
    }
    free_strings(names, n);
    return rc;
}
