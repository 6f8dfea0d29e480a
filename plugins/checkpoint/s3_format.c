/*
 * The s3 checkpoint plugin's text and bytes, with no I/O: SHA-256 (for the
 * signed x-amz-content-sha256 header and the MANIFEST), growable buffers and
 * SigV4 key escaping, the few XML elements S3 answers with (listings and
 * error bodies), and the MANIFEST format.  The plugin's layout and policy
 * are described at the top of s3.c.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file and thread APIs under strict C11 */

#include "s3_internal.h"

#include "files.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- SHA-256 (FIPS 180-4), for x-amz-content-sha256 --------------------- */

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

void sha256_init(struct sha256 *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->length = 0;
    s->fill = 0;
}

void sha256_update(struct sha256 *s, const void *data, size_t size)
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
void sha256_final(struct sha256 *s, char hex[65])
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

void sha256_hex(const void *data, size_t size, char hex[65])
{
    struct sha256 s;
    sha256_init(&s);
    sha256_update(&s, data, size);
    sha256_final(&s, hex);
}

/* ---- strings, names, keys ---------------------------------------------- */

int buf_append(struct buf *b, const void *data, size_t size)
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

int buf_printf(struct buf *b, const char *fmt, ...)
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

void buf_free(struct buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* printf into fresh memory; NULL when out of memory. */
char *str_printf(const char *fmt, ...)
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
int uri_encode(struct buf *out, const char *s, int keep_slash)
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
void xml_unescape(char *s)
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
char *xml_next(const char **cursor, const char *tag)
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

char *xml_first(const char *xml, const char *tag)
{
    const char *cursor = xml;
    return xml ? xml_next(&cursor, tag) : NULL;
}

/* "<prefix><name>/MANIFEST" -> "<name>" (fresh memory); NULL for other keys. */
char *checkpoint_of_manifest_key(const char *key, const char *prefix)
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

void manifest_free(struct manifest *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->entries[i].blob);
    free(m->entries);
    m->entries = NULL;
    m->n = 0;
}

int manifest_add(struct manifest *m, const char *blob, uint64_t size, const char *sha256)
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

const struct manifest_entry *manifest_find(const struct manifest *m, const char *blob)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->entries[i].blob, blob) == 0)
            return &m->entries[i];
    return NULL;
}

int manifest_format(const struct manifest *m, struct buf *out)
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
int manifest_parse(const char *text, struct manifest *m, char *why, size_t why_size)
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
