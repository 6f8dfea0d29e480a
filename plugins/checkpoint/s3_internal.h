/*
 * What the files of the s3 checkpoint plugin share (one shared object:
 * s3.c, the vtable; s3_credentials.c, where secrets and hosts come from;
 * s3_http.c, requests and object operations; s3_upload.c, staging, upload
 * and crash recovery; s3_format.c, SHA-256, buffers, XML and the MANIFEST):
 * the bucket layout's names, the instance, and the functions one file
 * calls in another.  Everything here has hidden visibility: the plugin
 * exports TR_PLUGIN_ENTRY alone.  Not installed; nothing outside
 * plugins/checkpoint includes it (but tests/test_s3.c, through s3.c).
 */
#ifndef TR_CHECKPOINT_S3_INTERNAL_H
#define TR_CHECKPOINT_S3_INTERNAL_H

#include <trainrun/plugin.h>

#include <curl/curl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#pragma GCC visibility push(hidden)

#define STAGING_PREFIX ".tmp-"
#define COMMITTED_MARK "COMMITTED"        /* staged and committed: upload pending */
#define MANIFEST_BLOB "MANIFEST"
#define LATEST_KEY "LATEST"
#define MANIFEST_HEADER "trainrun-s3-manifest 1"
#define MAX_PUT_SIZE (5ull << 30)         /* S3's limit for a single PUT */
#define MAX_LIST_RESPONSE (64u << 20)     /* an XML listing page is far smaller */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* Signing the payload hash lets the server reject a blob corrupted in
 * transit; curl signs the header but does not hash uploads itself. */
struct sha256 {
    uint32_t h[8];
    uint64_t length;
    unsigned char block[64];
    size_t fill;
};

struct buf {
    char *data;
    size_t len, cap;
};

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

/* A checkpoint on its way: staged locally, then uploaded. */
struct upload {
    char *name;
    char *staging;          /* local directory holding one file per blob */
    struct manifest blobs;  /* in put() order; sizes known, hashes filled by the upload */
    int recovered;          /* left by an interrupted run: LATEST only moves forward */
    char *nonce;            /* a checkpoint of several ranks (begin_shared): its token */
    int joined;             /* this rank joined it: detach() uploads its blobs as a part */
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
    const char *range;           /* GET: "bytes=<first>-<last>", or NULL */
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

struct credentials {
    char *access, *secret, *token; /* token may be NULL */
    char *source;                  /* "the environment" or "<file> [profile]" */
};

/* ---- s3_format.c: SHA-256, buffers and key escaping, XML, the MANIFEST */

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t size);
void sha256_final(struct sha256 *s, char hex[65]);
void sha256_hex(const void *data, size_t size, char hex[65]);
int buf_append(struct buf *b, const void *data, size_t size);
int buf_printf(struct buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void buf_free(struct buf *b);
char *str_printf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
int uri_encode(struct buf *out, const char *s, int keep_slash);
void xml_unescape(char *s);
char *xml_next(const char **cursor, const char *tag);
char *xml_first(const char *xml, const char *tag);
char *checkpoint_of_manifest_key(const char *key, const char *prefix);
void manifest_free(struct manifest *m);
int manifest_add(struct manifest *m, const char *blob, uint64_t size, const char *sha256);
const struct manifest_entry *manifest_find(const struct manifest *m, const char *blob);
int manifest_format(const struct manifest *m, struct buf *out);
int manifest_parse(const char *text, struct manifest *m, char *why, size_t why_size);

/* ---- s3_http.c: logging, requests, object operations, LATEST */

void log_msg(const struct s3 *s, enum tr_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
double now_seconds(void);
char *object_url(const struct s3 *s, const char *key, const char *query);
const char *hint_for(const struct s3 *s, const char *code, long status);
int retryable(CURLcode rc, long status, const char *code);
int s3_request(const struct s3 *s, CURL *curl, struct request *r, int quiet_404,
               tr_err *err);
char *object_key(const struct s3 *s, const char *name, const char *blob);
int get_small(const struct s3 *s, CURL *curl, const char *key, char **text, int *found,
              tr_err *err);
int put_small(const struct s3 *s, CURL *curl, const char *key, const char *text,
              tr_err *err);
int delete_object(const struct s3 *s, CURL *curl, const char *key, tr_err *err);
int list_keys(const struct s3 *s, CURL *curl, const char *key_prefix, char ***keys,
              size_t *count, tr_err *err);
void free_strings(char **v, size_t n);
int complete_checkpoints(const struct s3 *s, CURL *curl, char ***names, size_t *count,
                         tr_err *err);
int read_latest(const struct s3 *s, CURL *curl, char **name, tr_err *err);
int write_latest(const struct s3 *s, CURL *curl, const char *name, tr_err *err);
int repoint_latest(const struct s3 *s, CURL *curl, const char *except, tr_err *err);

/* ---- s3_upload.c: staging, the upload, crash recovery */

char *path_join(const char *a, const char *b);
const char *disk_hint(int errnum);
void upload_free(struct upload *u);
int hash_file(FILE *f, const char *path, const struct manifest_entry *e, char hex[65],
              tr_err *err);
const char *without_plugin_prefix(const char *msg);
int upload_part(struct s3 *s, struct upload *u, tr_err *err);
void upload_and_clean(struct s3 *s, struct upload *u);
void *uploader_main(void *arg);
int wait_for_upload(struct s3 *s, int background, int keep_failed, tr_err *err);
struct upload *read_committed(const char *staging, const char *name);
void recover_staging(struct s3 *s);

/* ---- s3_credentials.c: credentials and endpoints */

void credentials_free(struct credentials *c);
int load_credentials(struct credentials *c, tr_err *err);
int aws_endpoint(const char *url);
int choose_endpoint(const char *configured, char **endpoint, tr_err *err);
int valid_bucket(const char *b, int path_style);
/* checkpoint.bucket a bare bucket name (valid_bucket) and checkpoint.region
 * letters, digits and dashes; else err names which. */
int check_bucket_region(const char *bucket, int path_style, const char *region, tr_err *err);
/* load_credentials, with no ':' in the key (it joins key and secret) and no
 * line break in the token (a header); freed on failure. */
int load_checked_credentials(struct credentials *creds, tr_err *err);

#pragma GCC visibility pop

#endif
