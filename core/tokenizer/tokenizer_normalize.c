/* The tokenizer's normalizers, as the `tokenizers` library applies them: NFC/NFD/NFKC/NFKD
 * (utf8proc), Lowercase, Strip, Replace and Prepend, alone or in a Sequence.  Loaded from
 * tokenizer.json's "normalizer" (tr_tok_norm_one) and run over each stretch of text between
 * added tokens before the pre-tokenizer (tr_tok_normalize). */
#include "tokenizer_internal.h"

#include <utf8proc.h>

/* ---- normalizers ----------------------------------------------------------- */

int tr_tok_norm_one(struct tr_tokenizer *t, const struct tr_json *p, int depth, tr_err *err)
{
    const char *type = p && p->type == TR_JSON_OBJECT ? tr_json_string(p, "type") : NULL;
    if (!type)
        return tr_fail(err, "%s: a normalizer without a \"type\"", t->name);
    if (strcmp(type, "Sequence") == 0) {
        const struct tr_json *list = tr_json_get(p, "normalizers");
        if (!list || list->type != TR_JSON_ARRAY)
            return tr_fail(err, "%s: a Sequence normalizer without a \"normalizers\" list", t->name);
        if (depth >= MAX_DEPTH)
            return tr_fail(err, "%s: normalizer Sequences nested more than %d deep", t->name, MAX_DEPTH);
        for (size_t i = 0; i < list->n; i++)
            if (tr_tok_norm_one(t, list->items[i], depth + 1, err))
                return TR_ERROR;
        return TR_OK;
    }
    if (t->nnorms >= MAX_NORMS)
        return tr_fail(err, "%s: more than %d normalizers", t->name, MAX_NORMS);
    struct norm *nm = &t->norm[t->nnorms];
    static const char *const unicode[] = { "NFC", "NFD", "NFKC", "NFKD" };
    int kind = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(type, unicode[i]) == 0)
            kind = N_NFC + i;
    if (kind >= 0) {
        nm->kind = kind;
    } else if (strcmp(type, "Lowercase") == 0) {
        nm->kind = N_LOWER;
    } else if (strcmp(type, "Strip") == 0) {
        nm->kind = N_STRIP;
        nm->left = is_true(p, "strip_left");
        nm->right = is_true(p, "strip_right");
    } else if (strcmp(type, "Replace") == 0) {
        nm->kind = N_REPLACE;
        if (tr_tok_replace_pattern(t, p, "normalizer", &nm->re, &nm->text, &nm->ntext, err))
            return TR_ERROR;
        nm->md = pcre2_match_data_create_from_pattern(nm->re, NULL);
    } else if (strcmp(type, "Prepend") == 0) {
        const char *s = tr_json_string(p, "prepend");
        if (!s)
            return tr_fail(err, "%s: a Prepend normalizer without a \"prepend\" string", t->name);
        nm->kind = N_PREPEND;
        nm->text = tr_xstrdup(s);
        nm->ntext = strlen(s);
    } else {
        return tr_fail(err, "not supported yet: normalizer %s in %s (NFC, NFD, NFKC, NFKD, Lowercase, "
                       "Strip, Replace, Prepend and Sequence are)", type, t->name);
    }
    t->nnorms++;
    return TR_OK;
}

/* NFC, NFD, NFKC or NFKD (utf8proc) of s[0..n): as norm_apply. */
static int norm_unicode(struct tr_tokenizer *t, const struct norm *nm, const char *s, size_t n,
                        struct buf *out, tr_err *err)
{
    size_t i;
    for (i = 0; i < n && (unsigned char)s[i] < 0x80; i++)
        ;
    if (i == n) /* ASCII is in every normal form */
        return 0;
    static const utf8proc_option_t opt[] = {
        UTF8PROC_STABLE | UTF8PROC_COMPOSE, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &res,
                                      opt[nm->kind - N_NFC]);
    if (m < 0) {
        free(res);
        return tr_fail(err, "%s: Unicode normalization failed: %s", t->name, utf8proc_errmsg(m));
    }
    out->n = 0;
    buf_add(out, (const char *)res, (size_t)m);
    free(res);
    return 1;
}

/* Lowercase: Rust's char::to_lowercase, character by character as the library does (so no
 * final-sigma rule): the simple mapping, and U+0130 to "i" + U+0307.  As norm_apply. */
static int norm_lower(const char *s, size_t n, struct buf *out)
{
    size_t i;
    for (i = 0; i < n && (unsigned char)s[i] < 0x80 && !(s[i] >= 'A' && s[i] <= 'Z'); i++)
        ;
    if (i == n)
        return 0;
    out->n = 0;
    buf_reserve(out, n + 16);
    buf_add(out, s, i);
    while (i < n) {
        uint32_t cp;
        size_t k = utf8_at(s, n, i, &cp);
        if (cp == 0x130)
            buf_add(out, "i\xcc\x87", 3);
        else if (cp < 0x80)
            buf_add(out, &(char){ (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp) }, 1);
        else
            buf_char(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        i += k;
    }
    return 1;
}

/* Strip: white space off the left and/or right of s[0..n).  As norm_apply. */
static int norm_strip(const struct norm *nm, const char *s, size_t n, struct buf *out)
{
    size_t a = 0, b = n;
    while (nm->left && a < b) {
        uint32_t cp;
        size_t k = utf8_at(s, n, a, &cp);
        if (!is_white(cp))
            break;
        a += k;
    }
    while (nm->right && b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80)
            j--;
        uint32_t cp;
        utf8_at(s, n, j, &cp);
        if (!is_white(cp))
            break;
        b = j;
    }
    if (a == 0 && b == n)
        return 0;
    out->n = 0;
    buf_add(out, s + a, b - a);
    return 1;
}

/* One normalizer on s[0..n) (valid UTF-8) into out: 1 when it changed the text (out
 * holds it), 0 when not (out untouched), TR_ERROR; 2 when a Replace would have made it
 * longer than max (err not set). */
static int norm_apply(struct tr_tokenizer *t, struct norm *nm, const char *s, size_t n, size_t max,
                      struct buf *out, tr_err *err)
{
    switch (nm->kind) {
    case N_NFC: case N_NFD: case N_NFKC: case N_NFKD:
        return norm_unicode(t, nm, s, n, out, err);
    case N_LOWER:
        return norm_lower(s, n, out);
    case N_STRIP:
        return norm_strip(nm, s, n, out);
    case N_REPLACE: {
        int rc = tr_tok_replace_all(t, nm->re, nm->md, s, n, nm->text, nm->ntext, max, out, err);
        return rc < 0 ? TR_ERROR : rc > 0 ? 2 : 1;
    }
    case N_PREPEND:
        if (!n)
            return 0;
        out->n = 0;
        buf_add(out, nm->text, nm->ntext);
        buf_add(out, s, n);
        return 1;
    }
    return 0;
}

/* s[0..n) through every normalizer: the result in *out (t->nb[0 or 1], or s itself when
 * nothing changed it).  A result longer than tr_tok_growth_limit(n) is an error. */
int tr_tok_normalize(struct tr_tokenizer *t, const char *s, size_t n, const char **out, size_t *nout,
                     tr_err *err)
{
    const char *cur = s;
    size_t len = n;
    int which = 0;
    size_t max = tr_tok_growth_limit(n);
    for (int k = 0; k < t->nnorms; k++) {
        int rc = norm_apply(t, &t->norm[k], cur, len, max, &t->nb[which], err);
        if (rc < 0)
            return TR_ERROR;
        if (rc == 2 || (rc && t->nb[which].n > max))
            return tr_tok_grown(t, "normalizers", n, err);
        if (rc) {
            cur = t->nb[which].p;
            len = t->nb[which].n;
            which ^= 1;
        }
    }
    *out = cur;
    *nout = len;
    return TR_OK;
}

