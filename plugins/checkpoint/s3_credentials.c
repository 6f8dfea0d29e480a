/*
 * Where the s3 checkpoint plugin's secrets and hosts come from: AWS
 * credentials from the environment or the shared credentials file (never
 * from the recipe), the endpoint a user named outside the recipe
 * (TRAINRUN_S3_ENDPOINT, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL), which
 * endpoints the user's keys may be sent to (AWS's own S3 hosts or that
 * one), and S3's bucket name rules.  The policy is described at the top of
 * s3.c.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file and thread APIs under strict C11 */

#include "s3_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- credentials, and where they may be sent ------------------------------------ */

static void wipe(char *secret)
{
    if (secret) { /* do not leave a secret in freed memory */
        memset(secret, 0, strlen(secret));
        free(secret);
    }
}

void credentials_free(struct credentials *c)
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
int load_credentials(struct credentials *c, tr_err *err)
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
int aws_endpoint(const char *url)
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
int choose_endpoint(const char *configured, char **endpoint, tr_err *err)
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
int valid_bucket(const char *b, int path_style)
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

/* The recipe's bucket and region (s3.c's check of its options). */
int check_bucket_region(const char *bucket, int path_style, const char *region, tr_err *err)
{
    if (!valid_bucket(bucket, path_style))
        return tr_fail(err, "s3 checkpoint: invalid bucket \"%s\": give the bucket's name "
                            "alone (letters, digits, '.', '-'; no s3://, no '/'); put a path "
                            "into checkpoint.prefix", bucket);
    if (!region[0] || strspn(region, "abcdefghijklmnopqrstuvwxyz0123456789-") != strlen(region))
        return tr_fail(err, "s3 checkpoint: invalid region \"%s\"", region);
    return TR_OK;
}

/* The credentials from the standard places, with no ':' in the key (it
 * joins key and secret) and no line break in the token (a header). */
int load_checked_credentials(struct credentials *creds, tr_err *err)
{
    if (load_credentials(creds, err) != TR_OK)
        return TR_ERROR;
    if (strchr(creds->access, ':') || strpbrk(creds->token ? creds->token : "", "\r\n")) {
        tr_fail(err, "s3 checkpoint: the %s from %s contains '%s'; check it",
                strchr(creds->access, ':') ? "access key" : "session token", creds->source,
                strchr(creds->access, ':') ? ":" : "a line break");
        credentials_free(creds);
        return TR_ERROR;
    }
    return TR_OK;
}
