/*
 * Unit tests of the s3 checkpoint plugin's pure parts: SHA-256, key
 * escaping, the XML it reads, the MANIFEST format, URLs, error hints,
 * staging and crash recovery.  No server is needed (tests/e2e/s3.sh runs it
 * against one); the only network use is a refused connection on 127.0.0.1.
 *
 * The plugin is included as source so that its static functions can be
 * called directly.
 */
#include "../plugins/checkpoint/s3.c"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* ---- a host and a scratch directory -------------------------------------- */

static char last_log[4096];

static void test_log(enum tr_log_level level, const char *who, const char *fmt, ...)
{
    (void)level;
    (void)who;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_log, sizeof last_log, fmt, ap);
    va_end(ap);
}

static void *test_alloc(size_t size)
{
    return aligned_alloc(64, (size + 63) / 64 * 64);
}

static const struct tr_host host = {
    .struct_size = sizeof(struct tr_host),
    .abi_major = TR_ABI_MAJOR,
    .log = test_log,
    .alloc = test_alloc,
    .free = free,
};

static char tmp[256];

static void make_tmp(void)
{
    snprintf(tmp, sizeof tmp, "%s/trainrun-s3-test.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    cr_assert(mkdtemp(tmp), "mkdtemp: %s", strerror(errno));
}

static void remove_tmp(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct buf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        buf_append(&b, chunk, n);
    fclose(f);
    return b.data ? b.data : strdup("");
}

/* ---- SHA-256 ---------------------------------------------------------------- */

Test(sha256, known_answers)
{
    char hex[65];
    sha256_hex("", 0, hex);
    cr_assert_str_eq(hex, EMPTY_SHA256);
    sha256_hex("abc", 3, hex);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha256_hex(two_blocks, strlen(two_blocks), hex);
    cr_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

    char *million = malloc(1000000);
    memset(million, 'a', 1000000);
    sha256_hex(million, 1000000, hex);
    cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

Test(sha256, pieces_hash_like_the_whole)
{
    unsigned char data[1000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 7 + 3);
    char whole[65];
    sha256_hex(data, sizeof data, whole);
    const size_t steps[] = {1, 55, 56, 63, 64, 65, 127, 999};
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        struct sha256 h;
        sha256_init(&h);
        for (size_t at = 0; at < sizeof data; at += steps[k]) {
            size_t n = sizeof data - at < steps[k] ? sizeof data - at : steps[k];
            sha256_update(&h, data + at, n);
        }
        char hex[65];
        sha256_final(&h, hex);
        cr_assert_str_eq(hex, whole, "pieces of %zu bytes", steps[k]);
    }
}

/* ---- names and keys --------------------------------------------------------- */

Test(names, checkpoint_and_blob_names)
{
    cr_assert(valid_name("step-0000000100"));
    cr_assert(valid_blob("model.safetensors"));
    cr_assert(valid_blob("with space"));
    cr_assert(!valid_blob(""));
    cr_assert(!valid_blob("."));
    cr_assert(!valid_blob(".."));
    cr_assert(!valid_blob("a/b"));
    cr_assert(!valid_blob("line\nbreak"));
    cr_assert(!valid_blob(NULL));
    cr_assert(!valid_name("LATEST"));
    cr_assert(!valid_name(".tmp-x"));
}

Test(names, newest_first)
{
    char *names[] = {"step-0000000005", "step-0000000100", "step-0000000010"};
    qsort(names, 3, sizeof names[0], newest_first);
    cr_assert_str_eq(names[0], "step-0000000100");
    cr_assert_str_eq(names[1], "step-0000000010");
    cr_assert_str_eq(names[2], "step-0000000005");
}

static char *encoded(const char *s, int keep_slash)
{
    struct buf b = {0};
    cr_assert_eq(uri_encode(&b, s, keep_slash), 0);
    return b.data ? b.data : strdup("");
}

Test(names, uri_encoding_as_sigv4_wants)
{
    char *e = encoded("runs/exp 1+x=y/", 0);
    cr_assert_str_eq(e, "runs%2Fexp%201%2Bx%3Dy%2F");
    free(e);
    e = encoded("runs/exp 1+x=y/", 1);
    cr_assert_str_eq(e, "runs/exp%201%2Bx%3Dy/");
    free(e);
    e = encoded("AZaz09-_.~", 0);
    cr_assert_str_eq(e, "AZaz09-_.~");
    free(e);
    e = encoded("\xc3\xa9*", 0);
    cr_assert_str_eq(e, "%C3%A9%2A");
    free(e);
}

Test(names, checkpoint_of_manifest_key)
{
    char *n = checkpoint_of_manifest_key("t/step-0000000005/MANIFEST", "t/");
    cr_assert_str_eq(n, "step-0000000005");
    free(n);
    n = checkpoint_of_manifest_key("step-1/MANIFEST", "");
    cr_assert_str_eq(n, "step-1");
    free(n);
    cr_assert_null(checkpoint_of_manifest_key("t/step-1/model.safetensors", "t/"));
    cr_assert_null(checkpoint_of_manifest_key("t/a/b/MANIFEST", "t/"), "nested");
    cr_assert_null(checkpoint_of_manifest_key("t//MANIFEST", "t/"), "empty name");
    cr_assert_null(checkpoint_of_manifest_key("t/LATEST", "t/"));
    cr_assert_null(checkpoint_of_manifest_key("u/step-1/MANIFEST", "t/"), "other prefix");
    cr_assert_null(checkpoint_of_manifest_key("t/.tmp/MANIFEST", "t/"));
    cr_assert_null(checkpoint_of_manifest_key("t/step-1/XMANIFEST", "t/"));
}

/* ---- XML ---------------------------------------------------------------------- */

Test(xml, list_page)
{
    const char *page =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<Name>ckpt</Name><Prefix>t/</Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys>"
        "<IsTruncated>true</IsTruncated>"
        "<Contents><Key>t/step-1/MANIFEST</Key><Size>10</Size></Contents>"
        "<Contents><Key>t/a&amp;b &lt;c&gt; &quot;d&quot; &apos;e&apos;</Key></Contents>"
        "<Contents><Key>t/cr&#x0D;lf&#10;&#xe9;&#x1F600;</Key></Contents>"
        "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
        "</ListBucketResult>";
    const char *cursor = page;
    char *k1 = xml_next(&cursor, "Key");
    char *k2 = xml_next(&cursor, "Key");
    char *k3 = xml_next(&cursor, "Key");
    char *k4 = xml_next(&cursor, "Key");
    cr_assert_str_eq(k1, "t/step-1/MANIFEST");
    cr_assert_str_eq(k2, "t/a&b <c> \"d\" 'e'");
    cr_assert_str_eq(k3, "t/cr\rlf\n\xc3\xa9\xf0\x9f\x98\x80");
    cr_assert_null(k4);
    free(k1);
    free(k2);
    free(k3);
    char *truncated = xml_first(page, "IsTruncated");
    cr_assert_str_eq(truncated, "true");
    free(truncated);
    char *token = xml_first(page, "NextContinuationToken");
    cr_assert_str_eq(token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
    free(token);
    cr_assert_null(xml_first(NULL, "Key"));
}

Test(xml, error_body)
{
    const char *body = "<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code>"
                       "<Message>The specified bucket does not exist</Message>"
                       "<BucketName>nope</BucketName></Error>";
    char *code = xml_first(body, "Code");
    char *message = xml_first(body, "Message");
    cr_assert_str_eq(code, "NoSuchBucket");
    cr_assert_str_eq(message, "The specified bucket does not exist");
    free(code);
    free(message);
    cr_assert_null(xml_first("<Error><Code>unterminated", "Code"));
    char odd[] = "a &unknown; b &#; c &#xZZ; d";
    xml_unescape(odd);
    cr_assert_str_eq(odd, "a &unknown; b &#; c &#xZZ; d", "unknown entities stay as they are");
}

/* ---- the manifest -------------------------------------------------------------- */

Test(manifest, round_trip)
{
    struct manifest m = {0};
    char h1[65], h2[65];
    sha256_hex("one", 3, h1);
    sha256_hex("", 0, h2);
    cr_assert_eq(manifest_add(&m, "model.safetensors", 3, h1), 0);
    cr_assert_eq(manifest_add(&m, "with space", 0, h2), 0);
    struct buf text = {0};
    cr_assert_eq(manifest_format(&m, &text), 0);
    char expected[512];
    snprintf(expected, sizeof expected,
             "trainrun-s3-manifest 1\n%s 3 model.safetensors\n%s 0 with space\n", h1, h2);
    cr_assert_str_eq(text.data, expected);

    struct manifest back = {0};
    char why[256] = "";
    cr_assert_eq(manifest_parse(text.data, &back, why, sizeof why), 0, "%s", why);
    cr_assert_eq(back.n, 2);
    const struct manifest_entry *e = manifest_find(&back, "with space");
    cr_assert_not_null(e);
    cr_assert_eq(e->size, 0);
    cr_assert_str_eq(e->sha256, h2);
    cr_assert_eq(manifest_find(&back, "model.safetensors")->size, 3);
    cr_assert_null(manifest_find(&back, "state.json"));
    manifest_free(&back);
    manifest_free(&m);
    buf_free(&text);
}

static void assert_rejected(const char *text, const char *reason)
{
    struct manifest m = {0};
    char why[256] = "";
    cr_assert_eq(manifest_parse(text, &m, why, sizeof why), -1, "accepted: %s", text);
    cr_assert(strstr(why, reason), "why: \"%s\", expected it to mention \"%s\"", why, reason);
    cr_assert_eq(m.n, 0);
}

Test(manifest, damaged_ones_are_refused)
{
    const char *h = EMPTY_SHA256;
    char text[512];
    assert_rejected("", "does not start with");
    assert_rejected("trainrun-s3-manifest 2\n", "does not start with");
    snprintf(text, sizeof text, "trainrun-s3-manifest 1\n%s 0 a", h);
    assert_rejected(text, "line 2 is not terminated");
    assert_rejected("trainrun-s3-manifest 1\nabc 0 a\n", "line 2 is not");
    snprintf(text, sizeof text, "trainrun-s3-manifest 1\n%s 0 a\n%s x b\n", h, h);
    assert_rejected(text, "line 3 is not");
    snprintf(text, sizeof text, "trainrun-s3-manifest 1\n%s 0 a\n%s 1 a\n", h, h);
    assert_rejected(text, "line 3 is not"); /* the same blob twice */
    snprintf(text, sizeof text, "trainrun-s3-manifest 1\n%s 0 a/b\n", h);
    assert_rejected(text, "line 2 is not");
    snprintf(text, sizeof text, "trainrun-s3-manifest 1\n%s 0 \n", h);
    assert_rejected(text, "line 2 is not");
}

/* ---- URLs and errors --------------------------------------------------------------- */

Test(http, urls)
{
    struct s3 s = {.bucket = "ckpt", .endpoint = "http://127.0.0.1:9000", .path_style = 1};
    char *url = object_url(&s, "t/step-1/model x", NULL);
    cr_assert_str_eq(url, "http://127.0.0.1:9000/ckpt/t/step-1/model%20x");
    free(url);
    url = object_url(&s, NULL, "list-type=2&prefix=t%2F");
    cr_assert_str_eq(url, "http://127.0.0.1:9000/ckpt/?list-type=2&prefix=t%2F");
    free(url);
    s.endpoint = "https://s3.eu-west-1.amazonaws.com";
    s.path_style = 0;
    url = object_url(&s, "LATEST", NULL);
    cr_assert_str_eq(url, "https://ckpt.s3.eu-west-1.amazonaws.com/LATEST");
    free(url);
}

Test(http, hints_and_retries)
{
    struct s3 s = {0};
    cr_assert(strstr(hint_for(&s, "NoSuchBucket", 404), "create the bucket"));
    cr_assert(strstr(hint_for(&s, "SignatureDoesNotMatch", 403), "secret_key_env"));
    cr_assert(strstr(hint_for(&s, NULL, 403), "credentials"), "HEAD answers have no body");
    cr_assert(strstr(hint_for(&s, NULL, 301), "region"));
    cr_assert(strstr(hint_for(&s, "Whatever", 503), "server failed"));

    cr_assert(retryable(CURLE_COULDNT_CONNECT, 0, NULL));
    cr_assert(retryable(CURLE_RECV_ERROR, 0, NULL));
    cr_assert(retryable(CURLE_OPERATION_TIMEDOUT, 0, NULL));
    cr_assert(!retryable(CURLE_URL_MALFORMAT, 0, NULL));
    cr_assert(retryable(CURLE_OK, 503, "SlowDown"));
    cr_assert(retryable(CURLE_OK, 500, NULL));
    cr_assert(retryable(CURLE_OK, 400, "RequestTimeout"));
    cr_assert(!retryable(CURLE_OK, 404, "NoSuchBucket"));
    cr_assert(!retryable(CURLE_OK, 403, "AccessDenied"));
}

/* ---- create: what fails before any upload ------------------------------------------- */

static struct s3_config defaults(void)
{
    struct s3_config c = {
        .bucket = "ckpt", .prefix = "t/", .endpoint = "http://127.0.0.1:1", .region = "us-east-1",
        .access_key_env = "TR_TEST_S3_KEY", .secret_key_env = "TR_TEST_S3_SECRET",
        .session_token_env = "", .path_style = 1, .timeout = 5, .retries = 0,
        .cache_dir = "", .background = 0,
    };
    return c;
}

static int try_create(const struct s3_config *cfg, tr_err *err)
{
    struct tr_create_args args = {.struct_size = sizeof args, .run_dir = tmp, .world = 1};
    void *self = NULL;
    int rc = s3_create(&host, cfg, &args, &self, err);
    if (rc == TR_OK)
        s3_destroy(self);
    return rc;
}

TestSuite(create, .init = make_tmp, .fini = remove_tmp);

Test(create, refuses_bad_options_and_missing_credentials)
{
    struct s3_config c = defaults();
    tr_err err = {{0}};
    unsetenv("TR_TEST_S3_KEY");
    setenv("TR_TEST_S3_SECRET", "secret", 1);
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "TR_TEST_S3_KEY"), "%s", err.msg);
    cr_assert(strstr(err.msg, "never write keys into recipes"), "%s", err.msg);

    setenv("TR_TEST_S3_KEY", "key", 1);
    c.bucket = "s3://ckpt";
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "invalid bucket"), "%s", err.msg);

    c = defaults();
    c.endpoint = "127.0.0.1:9000";
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "not an http:// or https:// URL"), "%s", err.msg);
}

/* A port on 127.0.0.1 where nothing listens: bind one, then close it. */
static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

Test(create, an_unreachable_endpoint_is_reported_at_once)
{
    setenv("TR_TEST_S3_KEY", "key", 1);
    setenv("TR_TEST_S3_SECRET", "secret", 1);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", closed_port());
    struct s3_config c = defaults();
    c.endpoint = endpoint;
    tr_err err = {{0}};
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, endpoint), "names the endpoint: %s", err.msg);
    cr_assert(strstr(err.msg, "s3://ckpt/"), "names the bucket: %s", err.msg);
    cr_assert(strstr(err.msg, "server is up"), "says what to do: %s", err.msg);
}

/* ---- staging and recovery, without a server ------------------------------------------ */

/* An instance as create() would make it, minus the network check. */
static struct s3 *offline_instance(void)
{
    struct s3 *s = calloc(1, sizeof *s);
    s->host = &host;
    pthread_mutex_init(&s->latest_lock, NULL);
    pthread_mutex_init(&s->call_lock, NULL);
    s->bucket = strdup("ckpt");
    s->prefix = strdup("t/");
    s->endpoint = strdup("http://127.0.0.1:1");
    s->cache_dir = path_join(tmp, "cache");
    cr_assert_eq(mkdir_p(s->cache_dir), 0);
    return s;
}

TestSuite(staging, .init = make_tmp, .fini = remove_tmp);

Test(staging, put_writes_files_and_abort_removes_them)
{
    struct s3 *s = offline_instance();
    tr_err err = {{0}};
    cr_assert_eq(s3_begin(s, "step-0000000001", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(s3_put(s, "model", "weights", 7, &err), TR_OK, "%s", err.msg);
    char *path = path_join(s->open->staging, "model");
    char *text = slurp(path);
    cr_assert_str_eq(text, "weights");
    free(text);

    cr_assert_eq(s3_put(s, "model", "again", 5, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "written twice"), "%s", err.msg);
    cr_assert_eq(s3_put(s, "MANIFEST", "x", 1, &err), TR_ERROR);
    cr_assert_eq(s3_put(s, "a/b", "x", 1, &err), TR_ERROR);
    cr_assert_eq(s3_begin(s, "step-0000000002", &err), TR_ERROR);
    cr_assert(strstr(err.msg, "still open"), "%s", err.msg);

    char *staging = strdup(s->open->staging);
    s3_abort(s);
    struct stat st;
    cr_assert_neq(stat(staging, &st), 0, "abort leaves nothing behind");
    cr_assert_null(s->open);
    free(staging);
    free(path);
    s3_destroy(s);
}

Test(staging, invalid_names_and_order)
{
    struct s3 *s = offline_instance();
    tr_err err = {{0}};
    cr_assert_eq(s3_begin(s, "LATEST", &err), TR_ERROR);
    cr_assert_eq(s3_begin(s, "a/b", &err), TR_ERROR);
    cr_assert_eq(s3_put(s, "model", "x", 1, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "without begin"), "%s", err.msg);
    cr_assert_eq(s3_commit(s, &err), TR_ERROR);
    cr_assert_eq(s3_begin(s, "step-1", &err), TR_OK, "%s", err.msg);
    cr_assert_eq(s3_commit(s, &err), TR_ERROR, "no blobs");
    s3_abort(s);
    s3_destroy(s);
}

Test(staging, a_committed_leftover_reads_back_in_order)
{
    struct s3 *s = offline_instance();
    char *dir = path_join(s->cache_dir, ".tmp-step-0000000007-12345");
    cr_assert_eq(mkdir(dir, 0755), 0);
    char *p = path_join(dir, "model");
    cr_assert_eq(write_file(p, "12345", 5, 1), 0);
    free(p);
    p = path_join(dir, "state.json");
    cr_assert_eq(write_file(p, "{}", 2, 1), 0);
    free(p);
    p = path_join(dir, COMMITTED_MARK);
    cr_assert_eq(write_file(p, "model\nstate.json\n", 17, 1), 0);
    free(p);

    struct upload *u = read_committed(dir, "step-0000000007");
    cr_assert_not_null(u);
    cr_assert_str_eq(u->name, "step-0000000007");
    cr_assert_eq(u->recovered, 1);
    cr_assert_eq(u->blobs.n, 2);
    cr_assert_str_eq(u->blobs.entries[0].blob, "model");
    cr_assert_eq(u->blobs.entries[0].size, 5);
    cr_assert_str_eq(u->blobs.entries[1].blob, "state.json");
    upload_free(u);

    /* a blob the mark lists but the directory lacks: not an upload */
    p = path_join(dir, COMMITTED_MARK);
    cr_assert_eq(write_file(p, "model\nmissing\n", 14, 0), 0);
    free(p);
    cr_assert_null(read_committed(dir, "step-0000000007"));
    free(dir);
    s3_destroy(s);
}

Test(staging, uncommitted_leftovers_are_removed)
{
    struct s3 *s = offline_instance();
    char *dir = path_join(s->cache_dir, ".tmp-step-0000000003-999");
    cr_assert_eq(make_owned_dir(dir), 0);
    char *p = path_join(dir, "model");
    cr_assert_eq(write_file(p, "x", 1, 1), 0);
    free(p);
    /* a look-alike without trainrun's marker: the user's, never removed */
    char *mine = path_join(s->cache_dir, ".tmp-step-0000000004-998");
    cr_assert_eq(mkdir(mine, 0755), 0);
    p = path_join(mine, "notes");
    cr_assert_eq(write_file(p, "x", 1, 1), 0);
    recover_staging(s);
    struct stat st;
    cr_assert_neq(stat(dir, &st), 0, "a save that never committed is dropped");
    cr_assert(strstr(last_log, "left by an interrupted checkpoint save"), "%s", last_log);
    cr_assert_eq(stat(p, &st), 0, "a directory trainrun did not make is kept");
    free(p);
    free(mine);
    free(dir);
    s3_destroy(s);
}
