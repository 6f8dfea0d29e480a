/*
 * Unit tests of the s3 checkpoint plugin's pure parts: SHA-256, key
 * escaping, the XML it reads, the MANIFEST format, URLs, error hints,
 * where credentials come from and where they may go, staging and crash
 * recovery.  No server is needed (tests/e2e/s3.sh runs it
 * against one); the only network use is a refused connection on 127.0.0.1.
 *
 * The plugin is included as source so that its static functions can be
 * called directly.
 *
 * Covers: plugins/checkpoint/s3.c and its s3_*.c files.
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
    cr_assert(strstr(hint_for(&s, "SignatureDoesNotMatch", 403), "AWS_SECRET_ACCESS_KEY"));
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
        .access_key_env = "", .secret_key_env = "", .session_token_env = "",
        .path_style = 1, .timeout = 5, .retries = 0,
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

/* No credentials or endpoint from this machine's environment leak in. */
static void clean_env(void)
{
    const char *vars[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                          "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE", "TRAINRUN_S3_ENDPOINT",
                          "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
    setenv("HOME", tmp, 1);
}

static void user_credentials(void)
{
    clean_env();
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "the-secret-key", 1);
}

Test(create, refuses_bad_options_and_missing_credentials)
{
    clean_env();
    struct s3_config c = defaults();
    tr_err err = {{0}};
    setenv("TRAINRUN_S3_ENDPOINT", c.endpoint, 1);
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
              "%s", err.msg);
    cr_assert(strstr(err.msg, "/.aws/credentials"), "%s", err.msg);
    cr_assert(strstr(err.msg, "never write keys into recipes"), "%s", err.msg);

    setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not"), "%s",
              err.msg);

    user_credentials();
    const char *bad_buckets[] = {"s3://ckpt", "a/b", "", "ev il"};
    for (size_t i = 0; i < sizeof bad_buckets / sizeof *bad_buckets; i++) {
        c.bucket = bad_buckets[i];
        cr_assert_eq(try_create(&c, &err), TR_ERROR);
        cr_assert(strstr(err.msg, "invalid bucket"), "%s: %s", bad_buckets[i], err.msg);
    }
    /* virtual-hosted style: the bucket becomes part of the host name */
    c = defaults();
    c.path_style = 0;
    c.endpoint = "https://s3.amazonaws.com";
    const char *bad_hosts[] = {"evil.example#", "evil.example?", "x@evil.example", "Caps", "a_b"};
    for (size_t i = 0; i < sizeof bad_hosts / sizeof *bad_hosts; i++) {
        c.bucket = bad_hosts[i];
        cr_assert_eq(try_create(&c, &err), TR_ERROR);
        cr_assert(strstr(err.msg, "invalid bucket"), "%s: %s", bad_hosts[i], err.msg);
    }

    c = defaults();
    c.region = "us-east-1\r\nX-Injected: 1";
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "invalid region"), "%s", err.msg);

    c = defaults();
    c.endpoint = "127.0.0.1:9000";
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "not an http:// or https:// URL"), "%s", err.msg);
    c.endpoint = "https://s3.amazonaws.com@evil.example";
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "without user info"), "%s", err.msg);
}

/* A recipe could name any variable (a CI token) as the "access key". */
Test(create, the_removed_env_options_are_an_error_saying_what_replaced_them)
{
    user_credentials();
    setenv("GITHUB_TOKEN", "ghp_not-for-s3", 1);
    struct s3_config c = defaults();
    setenv("TRAINRUN_S3_ENDPOINT", c.endpoint, 1);
    tr_err err = {{0}};
    c.access_key_env = "GITHUB_TOKEN";
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "checkpoint.access_key_env was removed"), "%s", err.msg);
    cr_assert(strstr(err.msg, "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, or "
                              "~/.aws/credentials"), "%s", err.msg);
    c = defaults();
    c.session_token_env = "GITHUB_TOKEN";
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "checkpoint.session_token_env was removed"), "%s", err.msg);
}

Test(create, credentials_from_the_environment_first)
{
    user_credentials();
    setenv("AWS_SESSION_TOKEN", "tok", 1);
    /* a credentials file too: the environment wins, as in the AWS SDKs */
    char *file = path_join(tmp, "credentials");
    cr_assert_eq(write_file(file, "[default]\naws_access_key_id = F\naws_secret_access_key = G\n",
                            52, 0, 1), 0);
    setenv("AWS_SHARED_CREDENTIALS_FILE", file, 1);
    struct credentials c;
    tr_err err = {{0}};
    cr_assert_eq(load_credentials(&c, &err), TR_OK, "%s", err.msg);
    cr_assert_str_eq(c.access, "AKIDTEST");
    cr_assert_str_eq(c.secret, "the-secret-key");
    cr_assert_str_eq(c.token, "tok");
    cr_assert(strstr(c.source, "environment"), "%s", c.source);
    credentials_free(&c);
    free(file);
}

static void write_text(const char *path, const char *text)
{
    cr_assert_eq(write_file(path, text, strlen(text), 0, 1), 0, "%s", path);
}

Test(create, credentials_file_profiles)
{
    clean_env();
    char *file = path_join(tmp, "creds.ini");
    write_text(file, "# the AWS CLI's format\n"
                     "[default]\n"
                     "aws_access_key_id = DEFAULTKEY\n"
                     "aws_secret_access_key = defaultsecret\n"
                     "\n"
                     "  [ trainer ]  \n"
                     "AWS_ACCESS_KEY_ID=TRAINERKEY  \r\n"
                     "; a comment = not a key\n"
                     "aws_secret_access_key =  trainer/secret+x==  \n"
                     "aws_session_token = tok==\n"
                     "[half]\n"
                     "aws_access_key_id = ONLY\n");
    setenv("AWS_SHARED_CREDENTIALS_FILE", file, 1);
    struct credentials c;
    tr_err err = {{0}};
    cr_assert_eq(load_credentials(&c, &err), TR_OK, "%s", err.msg);
    cr_assert_str_eq(c.access, "DEFAULTKEY");
    cr_assert_str_eq(c.secret, "defaultsecret");
    cr_assert_null(c.token);
    cr_assert(strstr(c.source, "creds.ini [default]"), "%s", c.source);
    credentials_free(&c);

    setenv("AWS_PROFILE", "trainer", 1);
    cr_assert_eq(load_credentials(&c, &err), TR_OK, "%s", err.msg);
    cr_assert_str_eq(c.access, "TRAINERKEY");
    cr_assert_str_eq(c.secret, "trainer/secret+x==");
    cr_assert_str_eq(c.token, "tok==");
    credentials_free(&c);

    setenv("AWS_PROFILE", "half", 1);
    cr_assert_eq(load_credentials(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "creds.ini lacks a key in profile [half]"), "%s", err.msg);
    setenv("AWS_PROFILE", "nobody", 1);
    cr_assert_eq(load_credentials(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "creds.ini has no profile [nobody]"), "%s", err.msg);
    cr_assert(strstr(err.msg, "AWS_PROFILE"), "%s", err.msg);

    /* without AWS_SHARED_CREDENTIALS_FILE: ~/.aws/credentials */
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_PROFILE");
    char *dir = path_join(tmp, ".aws");
    cr_assert_eq(mkdir(dir, 0700), 0);
    char *home_file = path_join(dir, "credentials");
    write_text(home_file, "[default]\naws_access_key_id=HOMEKEY\naws_secret_access_key=s\n");
    cr_assert_eq(load_credentials(&c, &err), TR_OK, "%s", err.msg);
    cr_assert_str_eq(c.access, "HOMEKEY");
    credentials_free(&c);
    free(home_file);
    free(dir);
    free(file);
}

Test(endpoints, only_aws_s3_hosts_are_aws)
{
    const char *aws[] = {
        "https://s3.amazonaws.com", "https://s3.eu-west-1.amazonaws.com/",
        "https://s3-us-west-2.amazonaws.com", "https://s3.dualstack.us-east-1.amazonaws.com",
        "https://s3-fips.us-gov-west-1.amazonaws.com", "https://s3.cn-north-1.amazonaws.com.cn",
        "https://S3.US-EAST-1.AMAZONAWS.COM", "https://s3.amazonaws.com:443",
    };
    const char *not_aws[] = {
        "http://s3.amazonaws.com",                     /* signed requests in clear text */
        "https://s3.amazonaws.com.evil.example",
        "https://s3.amazonaws.com@evil.example",
        "https://evil.example/s3.amazonaws.com",
        "https://evil.example?s3.amazonaws.com",
        "https://s3-123456.us-east-1.elb.amazonaws.com", /* anyone's load balancer */
        "https://abc.execute-api.us-east-1.amazonaws.com",
        "https://ec2-1-2-3-4.compute-1.amazonaws.com",
        "https://s3.evil.amazonaws.com",
        "https://s3.amazonaws.com:8443",
        "https://amazonaws.com",
        "https://storage.googleapis.com",
        "http://127.0.0.1:9000",
    };
    for (size_t i = 0; i < sizeof aws / sizeof *aws; i++)
        cr_assert(aws_endpoint(aws[i]), "%s is AWS's S3", aws[i]);
    for (size_t i = 0; i < sizeof not_aws / sizeof *not_aws; i++)
        cr_assert(!aws_endpoint(not_aws[i]), "%s is not AWS's S3", not_aws[i]);
}

Test(endpoints, a_recipe_endpoint_needs_the_users_word)
{
    clean_env();
    char *url = NULL;
    tr_err err = {{0}};
    /* the default, and AWS hosts, need nothing */
    cr_assert_eq(choose_endpoint("", &url, &err), TR_OK, "%s", err.msg);
    cr_assert_str_eq(url, "https://s3.amazonaws.com");
    free(url);
    cr_assert_eq(choose_endpoint("https://s3.eu-west-1.amazonaws.com", &url, &err), TR_OK);
    free(url);
    /* another host from the recipe alone: refused, saying how to confirm it */
    cr_assert_eq(choose_endpoint("http://127.0.0.1:9000", &url, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "endpoint \"http://127.0.0.1:9000\", which is not AWS's S3"), "%s",
              err.msg);
    cr_assert(strstr(err.msg, "export TRAINRUN_S3_ENDPOINT=http://127.0.0.1:9000"), "%s", err.msg);
    /* the user named it: allowed, by any of the three variables */
    const char *vars[] = {"TRAINRUN_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"};
    for (size_t i = 0; i < 3; i++) {
        clean_env();
        setenv(vars[i], "http://127.0.0.1:9000/", 1);
        cr_assert_eq(choose_endpoint("http://127.0.0.1:9000", &url, &err), TR_OK, "%s", err.msg);
        free(url);
        cr_assert_eq(choose_endpoint("", &url, &err), TR_OK, "%s", err.msg);
        cr_assert_str_eq(url, "http://127.0.0.1:9000/", "no endpoint in the recipe: the user's");
        free(url);
        /* the recipe's own endpoint is not the one the user named */
        cr_assert_eq(choose_endpoint("http://10.0.0.1:9000", &url, &err), TR_ERROR);
        cr_assert(strstr(err.msg, "not to the one you named in"), "%s", err.msg);
        cr_assert(strstr(err.msg, vars[i]), "%s", err.msg);
    }
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
    user_credentials();
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", closed_port());
    setenv("TRAINRUN_S3_ENDPOINT", endpoint, 1); /* the user's own server */
    struct s3_config c = defaults();
    c.endpoint = endpoint;
    tr_err err = {{0}};
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, endpoint), "names the endpoint: %s", err.msg);
    cr_assert(strstr(err.msg, "s3://ckpt/"), "names the bucket: %s", err.msg);
    cr_assert(strstr(err.msg, "server is up"), "says what to do: %s", err.msg);
}

/* A listening socket on 127.0.0.1 that never answers: what a host a recipe
 * chose would receive is whatever connected to it. */
static int listen_local(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, 8), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    cr_assert_eq(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
    return fd;
}

/* What arrived at the listener (all of it had arrived: create() returned). */
static char *received(int fd)
{
    int c = accept(fd, NULL, NULL);
    if (c < 0)
        return NULL;
    static char text[8192];
    ssize_t n = recv(c, text, sizeof text - 1, MSG_DONTWAIT);
    text[n > 0 ? n : 0] = '\0';
    close(c);
    return text;
}

Test(create, no_request_reaches_an_endpoint_the_user_did_not_name)
{
    user_credentials();
    setenv("AWS_SESSION_TOKEN", "the-session-token", 1);
    setenv("GITHUB_TOKEN", "ghp_not-for-s3", 1);
    int port;
    int fd = listen_local(&port);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", port);
    struct s3_config c = defaults();
    c.endpoint = endpoint;
    c.timeout = 1;
    tr_err err = {{0}};
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "not AWS's S3"), "%s", err.msg);
    c.access_key_env = "GITHUB_TOKEN"; /* the old way to pick a variable */
    cr_assert_eq(try_create(&c, &err), TR_ERROR);
    cr_assert_null(received(fd), "a request went to an endpoint only the recipe named");

    /* the control: once the user names it, requests go there, signed, and
     * neither the secret key nor another variable is in them */
    c = defaults();
    c.endpoint = endpoint;
    c.timeout = 1;
    setenv("TRAINRUN_S3_ENDPOINT", endpoint, 1);
    cr_assert_eq(try_create(&c, &err), TR_ERROR, "the listener never answers");
    char *request = received(fd);
    cr_assert_not_null(request, "no request reached the endpoint the user named");
    cr_assert(strstr(request, "Credential=AKIDTEST/"), "%s", request);
    cr_assert(!strstr(request, "the-secret-key"), "%s", request);
    cr_assert(!strstr(request, "ghp_not-for-s3"), "%s", request);
    close(fd);
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
    cr_assert_eq(write_file(p, "12345", 5, 1, 1), 0);
    free(p);
    p = path_join(dir, "state.json");
    cr_assert_eq(write_file(p, "{}", 2, 1, 1), 0);
    free(p);
    p = path_join(dir, COMMITTED_MARK);
    cr_assert_eq(write_file(p, "model\nstate.json\n", 17, 1, 1), 0);
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
    cr_assert_eq(write_file(p, "model\nmissing\n", 14, 0, 1), 0);
    free(p);
    cr_assert_null(read_committed(dir, "step-0000000007"));
    free(dir);
    s3_destroy(s);
}

/* What put() staged is checked before it leaves: a blob changed on disk
 * since (its CRC-32 in the COMMITTED mark) is not uploaded, and a symlink
 * in a staging directory is never followed to what it points at. */
Test(staging, a_changed_or_linked_staged_blob_is_not_uploaded)
{
    struct s3 *s = offline_instance();
    char *dir = path_join(s->cache_dir, ".tmp-step-0000000008-12345");
    cr_assert_eq(make_owned_dir(dir), 0);
    char *model = path_join(dir, "model");
    cr_assert_eq(write_file(model, "12345", 5, 1, 1), 0);
    char line[64];
    snprintf(line, sizeof line, "model\t%lu\n", (unsigned long)crc32(0, (const Bytef *)"12345", 5));
    char *mark = path_join(dir, COMMITTED_MARK);
    cr_assert_eq(write_file(mark, line, strlen(line), 1, 1), 0);

    struct upload *u = read_committed(dir, "step-0000000008");
    cr_assert_not_null(u);
    cr_assert(u->blobs.entries[0].has_crc);
    char hex[65];
    tr_err err = {{0}};
    FILE *f = fopen(model, "rb");
    cr_assert_eq(hash_file(f, model, &u->blobs.entries[0], hex, &err), TR_OK, "%s", err.msg);
    fclose(f);
    cr_assert_eq(write_file(model, "12346", 5, 0, 1), 0); /* same size, other bytes */
    f = fopen(model, "rb");
    cr_assert_eq(hash_file(f, model, &u->blobs.entries[0], hex, &err), TR_ERROR);
    cr_assert(strstr(err.msg, "fails its checksum"), "%s", err.msg);
    fclose(f);
    upload_free(u);

    /* a symlink where a blob was staged: not an upload */
    cr_assert_eq(unlink(model), 0);
    cr_assert_eq(symlink(mark, model), 0);
    cr_assert_null(read_committed(dir, "step-0000000008"));
    free(mark);
    free(model);
    free(dir);
    s3_destroy(s);
}

Test(staging, uncommitted_leftovers_are_removed)
{
    struct s3 *s = offline_instance();
    char *dir = path_join(s->cache_dir, ".tmp-step-0000000003-999");
    cr_assert_eq(make_owned_dir(dir), 0);
    char *p = path_join(dir, "model");
    cr_assert_eq(write_file(p, "x", 1, 1, 1), 0);
    free(p);
    /* a look-alike without trainrun's marker: the user's, never removed */
    char *mine = path_join(s->cache_dir, ".tmp-step-0000000004-998");
    cr_assert_eq(mkdir(mine, 0755), 0);
    p = path_join(mine, "notes");
    cr_assert_eq(write_file(p, "x", 1, 1, 1), 0);
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
