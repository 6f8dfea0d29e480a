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
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file and thread APIs under strict C11 */

#include <trainrun/plugin.h>

#include "files.h"

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

#define STAGING_PREFIX ".tmp-"
#define COMMITTED_MARK "COMMITTED"        /* staged and committed: upload pending */
#define MANIFEST_BLOB "MANIFEST"
#define LATEST_KEY "LATEST"
#define MANIFEST_HEADER "trainrun-s3-manifest 1"
#define MAX_PUT_SIZE (5ull << 30)         /* S3's limit for a single PUT */
#define MAX_LIST_RESPONSE (64u << 20)     /* an XML listing page is far smaller */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* ---- SHA-256 (FIPS 180-4), for x-amz-content-sha256 --------------------- */

/* Signing the payload hash lets the server reject a blob corrupted in
 * transit; curl signs the header but does not hash uploads itself. */
struct sha256 {
    uint32_t h[8];
    uint64_t length;
    unsigned char block[64];
    size_t fill;
};

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(struct sha256 *s, const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
    uint32_t e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                      sha256_k[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    s->h[0] += a;
    s->h[1] += b;
    s->h[2] += c;
    s->h[3] += d;
    s->h[4] += e;
    s->h[5] += f;
    s->h[6] += g;
    s->h[7] += h;
}

static void sha256_init(struct sha256 *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->length = 0;
    s->fill = 0;
}

static void sha256_update(struct sha256 *s, const void *data, size_t size)
{
    const unsigned char *p = data;
    s->length += size;
    while (size > 0) {
        size_t take = 64 - s->fill < size ? 64 - s->fill : size;
        memcpy(s->block + s->fill, p, take);
        s->fill += take;
        p += take;
        size -= take;
        if (s->fill == 64) {
            sha256_block(s, s->block);
            s->fill = 0;
        }
    }
}

/* Lower-case hex digest into hex[65]. */
static void sha256_final(struct sha256 *s, char hex[65])
{
    uint64_t bits = s->length * 8;
    unsigned char pad = 0x80;
    sha256_update(s, &pad, 1);
    pad = 0;
    while (s->fill != 56)
        sha256_update(s, &pad, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha256_update(s, len, 8);
    for (int i = 0; i < 8; i++)
        snprintf(hex + 8 * i, 9, "%08x", (unsigned)s->h[i]);
}

static void sha256_hex(const void *data, size_t size, char hex[65])
{
    struct sha256 s;
    sha256_init(&s);
    sha256_update(&s, data, size);
    sha256_final(&s, hex);
}

/* ---- strings, names, keys ---------------------------------------------- */

struct buf {
    char *data;
    size_t len, cap;
};

static int buf_append(struct buf *b, const void *data, size_t size)
{
    if (b->len + size + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + size + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, size);
    b->len += size;
    b->data[b->len] = '\0';
    return 0;
}

static int buf_printf(struct buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int buf_printf(struct buf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -1;
    if ((size_t)n < sizeof small)
        return buf_append(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big)
        return -1;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = buf_append(b, big, (size_t)n);
    free(big);
    return rc;
}

static void buf_free(struct buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* printf into fresh memory; NULL when out of memory. */
static char *str_printf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static char *str_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = malloc((size_t)n + 1);
    if (!p)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

/* Percent-encode as SigV4 wants: everything but A-Z a-z 0-9 - _ . ~, and
 * also '/' when keep_slash (object paths). */
static int uri_encode(struct buf *out, const char *s, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        int plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
        char esc[3] = {'%', hex[c >> 4], hex[c & 15]};
        if (plain ? buf_append(out, p, 1) : buf_append(out, esc, 3))
            return -1;
    }
    return 0;
}

/* ---- minimal XML: the few elements S3 answers with ---------------------- */

/* Decode XML character references in place (S3 escapes keys with them). */
static void xml_unescape(char *s)
{
    static const struct {
        const char *entity;
        char c;
    } named[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    char *out = s;
    while (*s) {
        if (*s != '&') {
            *out++ = *s++;
            continue;
        }
        int done = 0;
        for (size_t i = 0; i < sizeof named / sizeof named[0] && !done; i++) {
            size_t n = strlen(named[i].entity);
            if (strncmp(s, named[i].entity, n) == 0) {
                *out++ = named[i].c;
                s += n;
                done = 1;
            }
        }
        if (!done && s[1] == '#') {
            char *end;
            unsigned long cp = s[2] == 'x' || s[2] == 'X' ? strtoul(s + 3, &end, 16)
                                                          : strtoul(s + 2, &end, 10);
            if (*end == ';' && end > s + 2 && cp > 0 && cp < 0x110000) {
                /* UTF-8 encode the code point */
                if (cp < 0x80) {
                    *out++ = (char)cp;
                } else if (cp < 0x800) {
                    *out++ = (char)(0xc0 | cp >> 6);
                    *out++ = (char)(0x80 | (cp & 0x3f));
                } else if (cp < 0x10000) {
                    *out++ = (char)(0xe0 | cp >> 12);
                    *out++ = (char)(0x80 | (cp >> 6 & 0x3f));
                    *out++ = (char)(0x80 | (cp & 0x3f));
                } else {
                    *out++ = (char)(0xf0 | cp >> 18);
                    *out++ = (char)(0x80 | (cp >> 12 & 0x3f));
                    *out++ = (char)(0x80 | (cp >> 6 & 0x3f));
                    *out++ = (char)(0x80 | (cp & 0x3f));
                }
                s = end + 1;
                done = 1;
            }
        }
        if (!done)
            *out++ = *s++;
    }
    *out = '\0';
}

/* The text of the next <tag>...</tag> at or after *cursor, unescaped, in
 * fresh memory, and *cursor moved past it; NULL when there is none (or out of
 * memory).  Exact tag match: "<Key>" does not match "<KeyCount>". */
static char *xml_next(const char **cursor, const char *tag)
{
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *start = strstr(*cursor, open);
    if (!start)
        return NULL;
    start += strlen(open);
    const char *end = strstr(start, close);
    if (!end)
        return NULL;
    char *text = strndup(start, (size_t)(end - start));
    if (text)
        xml_unescape(text);
    *cursor = end + strlen(close);
    return text;
}

static char *xml_first(const char *xml, const char *tag)
{
    const char *cursor = xml;
    return xml ? xml_next(&cursor, tag) : NULL;
}

/* "<prefix><name>/MANIFEST" -> "<name>" (fresh memory); NULL for other keys. */
static char *checkpoint_of_manifest_key(const char *key, const char *prefix)
{
    size_t np = strlen(prefix), nk = strlen(key), nm = strlen("/" MANIFEST_BLOB);
    if (nk <= np + nm || strncmp(key, prefix, np) != 0 ||
        strcmp(key + nk - nm, "/" MANIFEST_BLOB) != 0)
        return NULL;
    char *name = strndup(key + np, nk - np - nm);
    if (name && !valid_name(name)) {
        free(name);
        return NULL;
    }
    return name;
}

/* ---- the manifest -------------------------------------------------------- */

/*
 *   trainrun-s3-manifest 1
 *   <sha256 hex> <size> <blob>
 *   ...
 *
 * One line per blob in the order they were saved; the blob name is the rest
 * of the line, so it may contain spaces.
 */
struct manifest_entry {
    char *blob;
    uint64_t size;
    char sha256[65];
    int has_crc;      /* staged blobs: the CRC-32 put() wrote, checked before upload */
    unsigned long crc;
};

struct manifest {
    struct manifest_entry *entries;
    size_t n;
};

static void manifest_free(struct manifest *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->entries[i].blob);
    free(m->entries);
    m->entries = NULL;
    m->n = 0;
}

static int manifest_add(struct manifest *m, const char *blob, uint64_t size, const char *sha256)
{
    struct manifest_entry *e = realloc(m->entries, (m->n + 1) * sizeof *e);
    if (!e)
        return -1;
    m->entries = e;
    e = &m->entries[m->n];
    if (!(e->blob = strdup(blob)))
        return -1;
    e->size = size;
    snprintf(e->sha256, sizeof e->sha256, "%s", sha256 ? sha256 : "");
    e->has_crc = 0;
    e->crc = 0;
    m->n++;
    return 0;
}

static const struct manifest_entry *manifest_find(const struct manifest *m, const char *blob)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->entries[i].blob, blob) == 0)
            return &m->entries[i];
    return NULL;
}

static int manifest_format(const struct manifest *m, struct buf *out)
{
    if (buf_printf(out, "%s\n", MANIFEST_HEADER))
        return -1;
    for (size_t i = 0; i < m->n; i++)
        if (buf_printf(out, "%s %llu %s\n", m->entries[i].sha256,
                       (unsigned long long)m->entries[i].size, m->entries[i].blob))
            return -1;
    return 0;
}

/* Parse text into m (empty on entry).  Returns 0, or -1 with why[] filled. */
static int manifest_parse(const char *text, struct manifest *m, char *why, size_t why_size)
{
    size_t header = strlen(MANIFEST_HEADER);
    if (strncmp(text, MANIFEST_HEADER, header) != 0 || text[header] != '\n') {
        snprintf(why, why_size, "it does not start with \"%s\"", MANIFEST_HEADER);
        return -1;
    }
    const char *line = text + header + 1;
    for (int lineno = 2; *line; lineno++) {
        const char *eol = strchr(line, '\n');
        if (!eol) {
            snprintf(why, why_size, "line %d is not terminated (truncated?)", lineno);
            goto bad;
        }
        char hash[65];
        unsigned long long size;
        int used = 0;
        char *copy = strndup(line, (size_t)(eol - line));
        if (!copy) {
            snprintf(why, why_size, "out of memory");
            goto bad;
        }
        int ok = sscanf(copy, "%64[0-9a-f] %llu %n", hash, &size, &used) == 2 &&
                 strlen(hash) == 64 && used > 0 && valid_blob(copy + used) &&
                 !manifest_find(m, copy + used);
        if (ok && manifest_add(m, copy + used, size, hash) != 0) {
            free(copy);
            snprintf(why, why_size, "out of memory");
            goto bad;
        }
        free(copy);
        if (!ok) {
            snprintf(why, why_size, "line %d is not \"<sha256> <size> <blob>\"", lineno);
            goto bad;
        }
        line = eol + 1;
    }
    return 0;
bad:
    manifest_free(m);
    return -1;
}

/* ---- the instance --------------------------------------------------------- */

/* A checkpoint on its way: staged locally, then uploaded. */
struct upload {
    char *name;
    char *staging;          /* local directory holding one file per blob */
    struct manifest blobs;  /* in put() order; sizes known, hashes filled by the upload */
    int recovered;          /* left by an interrupted run: LATEST only moves forward */
    /* results, written by the uploader thread, read after join */
    int failed;
    tr_err err;
    uint64_t bytes;
    double seconds;
};

struct s3 {
    const struct tr_host *host;
    char *bucket, *prefix, *endpoint;
    char *sigv4;            /* "aws:amz:<region>:s3" for CURLOPT_AWS_SIGV4 */
    char *credentials;      /* "access:secret" for CURLOPT_USERPWD */
    char *token_header;     /* "x-amz-security-token: ...", or NULL */
    char *creds_source;     /* where the credentials came from, for error hints */
    int path_style;
    long timeout;
    int retries;
    int background;
    char *cache_dir;
    int curl_ready;         /* curl_global_init succeeded */
    CURL *curl;             /* for vtable calls (list, get, remove), under call_lock */
    /* the core may call from its writer thread and from the main thread */
    pthread_mutex_t call_lock;

    struct upload *open;    /* between begin() and commit() */
    struct upload *uploading;
    pthread_t uploader;
    int uploader_running;
    /* LATEST is a read-modify-write in remove(): keep the uploader out */
    pthread_mutex_t latest_lock;

    char *manifest_name;    /* the checkpoint whose MANIFEST get() read last */
    struct manifest manifest;
};

static void log_msg(const struct s3 *s, enum tr_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void log_msg(const struct s3 *s, enum tr_log_level level, const char *fmt, ...)
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

static double now_seconds(void)
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

struct request {
    const char *method;          /* GET, PUT, DELETE, HEAD */
    const char *key;             /* object key; NULL: the bucket itself */
    const char *query;           /* sorted and encoded (SigV4 canonical form), or NULL */
    const char *listing;         /* for messages: the key prefix a listing is for */
    /* PUT body: from memory, or from a file of body_size bytes */
    const void *body;
    FILE *body_file;
    uint64_t body_size;
    const char *body_sha256;     /* hex; NULL for requests without a body */
    const char *content_type;
    /* GET into a caller buffer of exactly sink_size bytes (else into response) */
    unsigned char *sink;
    uint64_t sink_size;
    /* results */
    long status;
    uint64_t sink_filled;
    int sink_overflow;
    struct buf response;         /* the body when not sunk: XML listings, errors */
    size_t response_limit;
};

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

static char *object_url(const struct s3 *s, const char *key, const char *query)
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
static const char *hint_for(const struct s3 *s, const char *code, long status)
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

static int retryable(CURLcode rc, long status, const char *code)
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

/* One S3 request with retries.  Returns TR_OK for a 2xx answer.  Otherwise
 * TR_ERROR with err describing the failure (the HTTP status is in r->status,
 * 0 when no answer came), except that with quiet_404 a missing object is
 * left to the caller: status 404 and err untouched. */
static int s3_request(const struct s3 *s, CURL *curl, struct request *r, int quiet_404,
                      tr_err *err)
{
    char what[1024];
    request_target(s, r, what, sizeof what);
    char *url = object_url(s, r->key, r->query);
    if (!url)
        return tr_fail(err, "s3 checkpoint: out of memory");
    if (!r->response_limit)
        r->response_limit = MAX_LIST_RESPONSE;

    struct curl_slist *headers = NULL;
    char sha_header[128], type_header[128];
    snprintf(sha_header, sizeof sha_header, "x-amz-content-sha256: %s",
             r->body_sha256 ? r->body_sha256 : EMPTY_SHA256);
    headers = curl_slist_append(headers, sha_header);
    if (r->content_type) {
        snprintf(type_header, sizeof type_header, "Content-Type: %s", r->content_type);
        headers = curl_slist_append(headers, type_header);
    }
    if (s->token_header)
        headers = curl_slist_append(headers, s->token_header);
    /* No "Expect:" override here: curl 7.88 signs an emptied header and the
     * signature then fails.  100-continue also lets a server refuse a large
     * upload before it is sent. */
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
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &wctx);
        if (strcmp(r->method, "PUT") == 0) {
            curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_body);
            curl_easy_setopt(curl, CURLOPT_READDATA, &cursor);
            curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_size);
        } else if (strcmp(r->method, "HEAD") == 0) {
            curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
        } else if (strcmp(r->method, "GET") != 0) {
            curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r->method);
        }

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
        char tries[64] = "";
        if (attempt > 0)
            snprintf(tries, sizeof tries, " (%d attempts)", attempt + 1);
        if (crc != CURLE_OK) {
            tr_fail(err, "s3 checkpoint: %s %s at %s failed%s: %s%s%s; check that the server "
                         "is up and reachable and that checkpoint.endpoint is right",
                    r->method, what, s->endpoint, tries, curl_easy_strerror(crc),
                    curl_error[0] ? ": " : "", curl_error);
        } else {
            char *message = xml_first(r->response.data, "Message");
            tr_fail(err, "s3 checkpoint: %s %s at %s failed%s: HTTP %ld%s%s%s%s; %s", r->method,
                    what, s->endpoint, tries, r->status, code ? " " : "", code ? code : "",
                    message ? ": " : "", message ? message : "", hint_for(s, code, r->status));
            free(message);
        }
        free(code);
        break;
    }
    curl_slist_free_all(headers);
    free(url);
    return rc;
}

static char *object_key(const struct s3 *s, const char *name, const char *blob)
{
    return blob ? str_printf("%s%s/%s", s->prefix, name, blob) : str_printf("%s%s", s->prefix, name);
}

/* GET a small object (MANIFEST, LATEST) as a string.  *found = 0 on 404. */
static int get_small(const struct s3 *s, CURL *curl, const char *key, char **text, int *found,
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

static int put_small(const struct s3 *s, CURL *curl, const char *key, const char *text,
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

static int delete_object(const struct s3 *s, CURL *curl, const char *key, tr_err *err)
{
    struct request r = {.method = "DELETE", .key = key};
    int rc = s3_request(s, curl, &r, 1, err);
    int missing = rc != TR_OK && r.status == 404; /* already gone is fine */
    buf_free(&r.response);
    return missing ? TR_OK : rc;
}

/* Every key under key_prefix (ListObjectsV2, all pages), in fresh memory. */
static int list_keys(const struct s3 *s, CURL *curl, const char *key_prefix, char ***keys,
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

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Complete checkpoints (those with a MANIFEST), newest first. */
static int complete_checkpoints(const struct s3 *s, CURL *curl, char ***names, size_t *count,
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
static int read_latest(const struct s3 *s, CURL *curl, char **name, tr_err *err)
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

static int write_latest(const struct s3 *s, CURL *curl, const char *name, tr_err *err)
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
static int repoint_latest(const struct s3 *s, CURL *curl, const char *except, tr_err *err)
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

/* ---- local staging ------------------------------------------------------------ */

static char *path_join(const char *a, const char *b)
{
    return str_printf("%s/%s", a, b);
}

static const char *disk_hint(int errnum)
{
    return DISK_HINT(errnum, "checkpoint.cache_dir");
}

static void upload_free(struct upload *u)
{
    if (!u)
        return;
    free(u->name);
    free(u->staging);
    manifest_free(&u->blobs);
    free(u);
}

/* ---- the upload --------------------------------------------------------------- */

/* Hash one staged file; its size must be what put() wrote. */
/* SHA-256 of a staged file (for the request), and its CRC-32 checked
 * against what put() wrote: a staged copy changed or damaged on disk since
 * (a crash, another program) is not uploaded as the checkpoint. */
static int hash_file(FILE *f, const char *path, const struct manifest_entry *e, char hex[65],
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

static const char *without_plugin_prefix(const char *msg)
{
    static const char prefix[] = "s3 checkpoint: ";
    return strncmp(msg, prefix, sizeof prefix - 1) == 0 ? msg + sizeof prefix - 1 : msg;
}

/* Blobs, then MANIFEST, then LATEST: each step only after the previous one
 * succeeded, so LATEST never names an incomplete checkpoint. */
static int upload_checkpoint(struct s3 *s, CURL *curl, struct upload *u, tr_err *err)
{
    double t0 = now_seconds();
    char *manifest_key = object_key(s, u->name, MANIFEST_BLOB);
    struct buf manifest = {0};
    int rc = TR_ERROR, published = 0;
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
    buf_free(&manifest);
    free(manifest_key);
    return rc;
}

/* Upload u on a handle of its own; the staged copy goes once it is safe. */
static void upload_and_clean(struct s3 *s, struct upload *u)
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

static void *uploader_main(void *arg)
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
static int wait_for_upload(struct s3 *s, int background, int keep_failed, tr_err *err)
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
static struct upload *read_committed(const char *staging, const char *name)
{
    char *mark = path_join(staging, COMMITTED_MARK);
    FILE *f = mark ? fopen(mark, "r") : NULL;
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
static void recover_staging(struct s3 *s)
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

/* ---- credentials, and where they may be sent ------------------------------------ */

struct credentials {
    char *access, *secret, *token; /* token may be NULL */
    char *source;                  /* "the environment" or "<file> [profile]" */
};

static void wipe(char *secret)
{
    if (secret) { /* do not leave a secret in freed memory */
        memset(secret, 0, strlen(secret));
        free(secret);
    }
}

static void credentials_free(struct credentials *c)
{
    wipe(c->access);
    wipe(c->secret);
    wipe(c->token);
    free(c->source);
    memset(c, 0, sizeof *c);
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

/* The AWS shared credentials file, an INI file:
 *
 *   [default]
 *   aws_access_key_id = AKIA...
 *   aws_secret_access_key = ...
 *   aws_session_token = ...      (optional)
 *
 * Lines starting with '#' or ';' are comments; keys are case-insensitive.
 * Returns TR_OK with c filled, NO_FILE when the file does not exist,
 * TR_ERROR with err set when it exists but does not hold the profile's keys. */
#define NO_FILE 1
static int read_credentials_file(const char *path, const char *profile, struct credentials *c,
                                 tr_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT)
            return NO_FILE;
        return tr_fail(err, "s3 checkpoint: cannot read the credentials file %s: %s", path,
                       strerror(errno));
    }
    char line[4096];
    int in_profile = 0, found = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *l = trim(line);
        if (!*l || *l == '#' || *l == ';')
            continue;
        if (*l == '[') {
            char *end = strchr(l, ']');
            if (end)
                *end = '\0';
            in_profile = end && strcmp(trim(l + 1), profile) == 0;
            found |= in_profile;
            continue;
        }
        char *eq = strchr(l, '=');
        if (!in_profile || !eq)
            continue;
        *eq = '\0';
        char *key = trim(l), *value = trim(eq + 1);
        char **slot = strcasecmp(key, "aws_access_key_id") == 0       ? &c->access
                      : strcasecmp(key, "aws_secret_access_key") == 0 ? &c->secret
                      : strcasecmp(key, "aws_session_token") == 0     ? &c->token
                                                                      : NULL;
        if (slot && *value) {
            wipe(*slot);
            *slot = strdup(value);
        }
    }
    memset(line, 0, sizeof line);
    fclose(f);
    c->source = str_printf("%s [%s]", path, profile);
    if (!found || !c->access || !c->secret) {
        tr_fail(err, "s3 checkpoint: the credentials file %s %s [%s]; set aws_access_key_id and "
                     "aws_secret_access_key there, choose another profile with AWS_PROFILE, or set "
                     "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                path, found ? "lacks a key in profile" : "has no profile", profile);
        credentials_free(c);
        return TR_ERROR;
    }
    if (!c->source) {
        credentials_free(c);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    return TR_OK;
}

/* The standard places, in the AWS SDKs' order: the environment, then the
 * shared credentials file. */
static int load_credentials(struct credentials *c, tr_err *err)
{
    memset(c, 0, sizeof *c);
    const char *access = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
    if ((access && *access) || (secret && *secret)) {
        if (!access || !*access || !secret || !*secret)
            return tr_fail(err, "s3 checkpoint: %s is set but %s is not: set both (or neither, "
                                "to use ~/.aws/credentials)",
                           access && *access ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                           access && *access ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
        const char *token = getenv("AWS_SESSION_TOKEN");
        c->access = strdup(access);
        c->secret = strdup(secret);
        c->token = token && *token ? strdup(token) : NULL;
        c->source = strdup("the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)");
        if (!c->access || !c->secret || (token && *token && !c->token) || !c->source) {
            credentials_free(c);
            return tr_fail(err, "s3 checkpoint: out of memory");
        }
        return TR_OK;
    }
    const char *file = getenv("AWS_SHARED_CREDENTIALS_FILE");
    const char *home = getenv("HOME");
    char *path = file && *file ? strdup(file)
                 : home && *home ? str_printf("%s/.aws/credentials", home) : NULL;
    const char *profile = getenv("AWS_PROFILE");
    if (!profile || !*profile)
        profile = "default";
    int rc = path ? read_credentials_file(path, profile, c, err) : NO_FILE;
    if (rc == NO_FILE)
        tr_fail(err, "s3 checkpoint: no credentials: set AWS_ACCESS_KEY_ID and "
                     "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or put "
                     "them in %s (profile from AWS_PROFILE, else [default]); never write keys "
                     "into recipes", path ? path : "~/.aws/credentials");
    free(path);
    return rc == TR_OK ? TR_OK : TR_ERROR;
}

/* The endpoint the user named outside the recipe, and the variable naming it. */
static const char *user_endpoint(const char **variable)
{
    static const char *const names[] = {"TRAINRUN_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3",
                                        "AWS_ENDPOINT_URL"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            *variable = names[i];
            return v;
        }
    }
    *variable = NULL;
    return NULL;
}

/* "https://host/" and "https://HOST" name the same endpoint. */
static int same_endpoint(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    while (na > 8 && a[na - 1] == '/')
        na--;
    while (nb > 8 && b[nb - 1] == '/')
        nb--;
    return na == nb && strncasecmp(a, b, na) == 0;
}

/* us-east-1, eu-west-3, us-gov-west-1, cn-north-1, ap-southeast-2 */
static int region_like(const char *s, size_t n)
{
    size_t i = 0, parts = 0;
    while (i < n) {
        size_t start = i;
        while (i < n && s[i] != '-')
            i++;
        if (i == start)
            return 0;
        for (size_t k = start; k < i; k++)
            if (!((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= '0' && s[k] <= '9')))
                return 0;
        parts++;
        if (i < n)
            i++; /* the '-' */
        else if (!(s[i - 1] >= '0' && s[i - 1] <= '9'))
            return 0; /* ends in the region's number */
    }
    return parts >= 3 && !(s[0] >= '0' && s[0] <= '9');
}

/* AWS's own S3 API hosts over https: s3.amazonaws.com, s3.<region>, s3-<region>,
 * s3.dualstack.<region>, s3-fips[.dualstack].<region> under amazonaws.com(.cn).
 * Only these: other names under amazonaws.com (load balancers, API gateways,
 * EC2 hosts) are anyone's, and one can be called "s3-something". */
static int aws_endpoint(const char *url)
{
    if (strncasecmp(url, "https://", 8) != 0)
        return 0;
    const char *host = url + 8;
    size_t n = strcspn(host, "/?#");
    char h[256];
    if (n == 0 || n >= sizeof h)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = host[i];
        if (ch >= 'A' && ch <= 'Z')
            ch = (char)(ch - 'A' + 'a');
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' ||
              ch == ':'))
            return 0; /* '@' (user info), '%', '\\' ... */
        h[i] = ch;
    }
    h[n] = '\0';
    char *colon = strchr(h, ':');
    if (colon) {
        if (strcmp(colon, ":443") != 0)
            return 0;
        *colon = '\0';
        n = (size_t)(colon - h);
    }
    size_t rest;
    if (n > 14 && strcmp(h + n - 14, ".amazonaws.com") == 0)
        rest = n - 14;
    else if (n > 17 && strcmp(h + n - 17, ".amazonaws.com.cn") == 0)
        rest = n - 17;
    else
        return 0;
    h[rest] = '\0';
    const char *region;
    if (strcmp(h, "s3") == 0)
        return 1;
    if (strncmp(h, "s3-fips.dualstack.", 18) == 0)
        region = h + 18;
    else if (strncmp(h, "s3.dualstack.", 13) == 0)
        region = h + 13;
    else if (strncmp(h, "s3-fips.", 8) == 0)
        region = h + 8;
    else if (strncmp(h, "s3.", 3) == 0 || strncmp(h, "s3-", 3) == 0)
        region = h + 3;
    else
        return 0;
    return !strchr(region, '.') && region_like(region, strlen(region));
}

/* The endpoint requests go to, and whether the user's credentials may go there. */
static int choose_endpoint(const char *configured, char **endpoint, tr_err *err)
{
    const char *variable;
    const char *mine = user_endpoint(&variable);
    const char *url = configured[0] ? configured : mine ? mine : "https://s3.amazonaws.com";
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return tr_fail(err, "s3 checkpoint: endpoint \"%s\"%s%s is not an http:// or https:// URL",
                       url, configured[0] ? "" : " from ", configured[0] ? "" : variable);
    /* no user info ("https://s3.amazonaws.com@evil.example"), no query or fragment */
    const char *host = strstr(url, "://") + 3;
    size_t host_len = strcspn(host, "/");
    if (memchr(host, '@', host_len) || strpbrk(url, "?#\\ \t\r\n"))
        return tr_fail(err, "s3 checkpoint: endpoint \"%s\" must be scheme://host[:port][/path], "
                            "without user info, query or spaces", url);
    if (!aws_endpoint(url) && !(mine && same_endpoint(url, mine))) {
        if (mine)
            return tr_fail(err, "s3 checkpoint: the recipe sends checkpoints to endpoint \"%s\", "
                                "not to the one you named in %s (\"%s\"); trainrun signs "
                                "requests with your credentials only for AWS's S3 or for the "
                                "endpoint you named: check the recipe's checkpoint.endpoint "
                                "(trainrun show), then set %s to it if you trust it",
                           url, variable, mine, variable);
        return tr_fail(err, "s3 checkpoint: the recipe sends checkpoints to endpoint \"%s\", "
                            "which is not AWS's S3; trainrun signs requests with your "
                            "credentials for such an endpoint only when you name it outside the "
                            "recipe: if you trust it, export TRAINRUN_S3_ENDPOINT=%s (or "
                            "AWS_ENDPOINT_URL) and run again", url, url);
    }
    *endpoint = strdup(url);
    if (!*endpoint)
        return tr_fail(err, "s3 checkpoint: out of memory");
    return TR_OK;
}

/* S3's bucket rules, loosened for the legacy names some servers accept
 * ('_', upper case) in path style.  In virtual-hosted style the bucket
 * becomes part of the host name, so it must be a DNS label sequence: a '#',
 * '?' or '@' there would send the request (and its signature) elsewhere. */
static int valid_bucket(const char *b, int path_style)
{
    size_t n = strlen(b);
    if (n < 1 || n > 255)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
        if (path_style)
            ok |= (c >= 'A' && c <= 'Z') || c == '_';
        if (!ok)
            return 0;
    }
    return path_style || (n >= 3 && n <= 63 && b[0] != '.' && b[0] != '-' && !strstr(b, ".."));
}

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

static int s3_create(const struct tr_host *host, const void *config,
                     const struct tr_create_args *args, void **self, tr_err *err)
{
    const struct s3_config *cfg = config;
    if (!host || !host->alloc || !host->free)
        return tr_fail(err, "s3 checkpoint: the host provides no allocator");
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
    if (!valid_bucket(cfg->bucket, cfg->path_style))
        return tr_fail(err, "s3 checkpoint: invalid bucket \"%s\": give the bucket's name "
                            "alone (letters, digits, '.', '-'; no s3://, no '/'); put a path "
                            "into checkpoint.prefix", cfg->bucket);
    if (!cfg->region[0] || strspn(cfg->region, "abcdefghijklmnopqrstuvwxyz0123456789-") !=
                               strlen(cfg->region))
        return tr_fail(err, "s3 checkpoint: invalid region \"%s\"", cfg->region);
    char *endpoint = NULL;
    if (choose_endpoint(cfg->endpoint, &endpoint, err) != TR_OK)
        return TR_ERROR;
    struct credentials creds;
    if (load_credentials(&creds, err) != TR_OK) {
        free(endpoint);
        return TR_ERROR;
    }
    if (strchr(creds.access, ':') || strpbrk(creds.token ? creds.token : "", "\r\n")) {
        tr_fail(err, "s3 checkpoint: the %s from %s contains '%s'; check it",
                strchr(creds.access, ':') ? "access key" : "session token", creds.source,
                strchr(creds.access, ':') ? ":" : "a line break");
        credentials_free(&creds);
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
    s->path_style = cfg->path_style;
    s->background = cfg->background;
    s->timeout = (long)cfg->timeout;
    s->retries = (int)cfg->retries;
    s->bucket = strdup(cfg->bucket);
    s->prefix = strdup(cfg->prefix);
    s->endpoint = endpoint;
    s->sigv4 = str_printf("aws:amz:%s:s3", cfg->region);
    s->credentials = str_printf("%s:%s", creds.access, creds.secret);
    int want_token = creds.token && creds.token[0];
    if (want_token)
        s->token_header = str_printf("x-amz-security-token: %s", creds.token);
    s->creds_source = creds.source;
    creds.source = NULL;
    credentials_free(&creds);
    if (!cfg->cache_dir[0])
        s->cache_dir = path_join(run_dir, "s3-staging");
    else if (cfg->cache_dir[0] == '/')
        s->cache_dir = strdup(cfg->cache_dir);
    else
        s->cache_dir = path_join(run_dir, cfg->cache_dir);
    if (!s->bucket || !s->prefix || !s->endpoint || !s->sigv4 ||
        !s->credentials || (want_token && !s->token_header) || !s->cache_dir) {
        s3_destroy(s);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    /* "https://host/" would make every URL "https://host//bucket" */
    for (size_t n = strlen(s->endpoint); n > 8 && s->endpoint[n - 1] == '/'; n--)
        s->endpoint[n - 1] = '\0';
    for (size_t n = strlen(s->cache_dir); n > 1 && s->cache_dir[n - 1] == '/'; n--)
        s->cache_dir[n - 1] = '\0';
    if (!s->path_style && strchr(s->bucket, '.') && strncmp(s->endpoint, "https://", 8) == 0)
        log_msg(s, TR_LOG_WARN, "bucket \"%s\" has dots: virtual-hosted https URLs will fail "
                                "certificate checks; use path_style = true", s->bucket);

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        s3_destroy(s);
        return tr_fail(err, "s3 checkpoint: curl_global_init failed");
    }
    s->curl_ready = 1;
    if (!(s->curl = curl_easy_init())) {
        s3_destroy(s);
        return tr_fail(err, "s3 checkpoint: curl_easy_init failed (out of memory?)");
    }
    if (mkdir_p(s->cache_dir) != 0) {
        int e = errno;
        tr_fail(err, "s3 checkpoint: cannot create the staging directory %s: %s%s",
                s->cache_dir, strerror(e), disk_hint(e));
        s3_destroy(s);
        return TR_ERROR;
    }

    /* Fail now, not after the first save, when the bucket cannot be used. */
    struct buf query = {0};
    if (buf_printf(&query, "list-type=2&max-keys=1&prefix=") || uri_encode(&query, s->prefix, 0)) {
        buf_free(&query);
        s3_destroy(s);
        return tr_fail(err, "s3 checkpoint: out of memory");
    }
    struct request probe = {.method = "GET", .query = query.data, .listing = s->prefix};
    int rc = s3_request(s, s->curl, &probe, 0, err);
    buf_free(&query);
    buf_free(&probe.response);
    if (rc != TR_OK) {
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
     * enough behind for the next run to finish it. */
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

static const struct tr_checkpoint_vtable s3_vtable = {
    .struct_size = sizeof(struct tr_checkpoint_vtable),
    .begin = s3_begin,
    .put = s3_put,
    .commit = s3_commit,
    .abort = s3_abort,
    .list = s3_list,
    .get = s3_get,
    .remove = s3_remove,
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
