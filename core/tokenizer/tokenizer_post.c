/* What surrounds the model: the post-processor's special tokens (TemplateProcessing,
 * RobertaProcessing, BertProcessing: the BOS/EOS that encode_ex adds), and the decoder chain
 * (Replace, ByteFallback, Fuse, Strip, Metaspace) with decode and decode_next. */
#include "tokenizer_internal.h"

#include <stdio.h>

/* ---- decoders ---------------------------------------------------------------- */

static int dec_one(struct tr_tokenizer *t, const struct tr_json *p, int depth, tr_err *err)
{
    const char *type = p && p->type == TR_JSON_OBJECT ? tr_json_string(p, "type") : NULL;
    if (!type)
        return tr_fail(err, "%s: a decoder without a \"type\"", t->name);
    if (strcmp(type, "ByteLevel") == 0 && !t->byte_level)
        return tr_fail(err, "not supported yet: decoder ByteLevel without a ByteLevel pre-tokenizer in %s",
                       t->name);
    if (strcmp(type, "Sequence") == 0) {
        const struct tr_json *list = tr_json_get(p, "decoders");
        if (!list || list->type != TR_JSON_ARRAY)
            return tr_fail(err, "%s: a Sequence decoder without a \"decoders\" list", t->name);
        if (depth >= MAX_DEPTH)
            return tr_fail(err, "%s: decoder Sequences nested more than %d deep", t->name, MAX_DEPTH);
        for (size_t i = 0; i < list->n; i++)
            if (dec_one(t, list->items[i], depth + 1, err))
                return TR_ERROR;
        return TR_OK;
    }
    if (t->ndecs >= MAX_DECS)
        return tr_fail(err, "%s: more than %d decoders", t->name, MAX_DECS);
    struct dec *d = &t->dec[t->ndecs];
    if (strcmp(type, "ByteLevel") == 0) {
        d->kind = D_BYTE_LEVEL;
    } else if (strcmp(type, "Replace") == 0) {
        d->kind = D_REPLACE;
        if (tr_tok_replace_pattern(t, p, "decoder", &d->re, &d->text, &d->ntext, err))
            return TR_ERROR;
    } else if (strcmp(type, "ByteFallback") == 0) {
        d->kind = D_BYTE_FALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        d->kind = D_FUSE;
    } else if (strcmp(type, "Strip") == 0) {
        d->kind = D_STRIP;
        const struct tr_json *a = tr_json_get(p, "start"), *b = tr_json_get(p, "stop");
        if (one_char(tr_json_string(p, "content"), &d->ch) || !a || a->type != TR_JSON_NUMBER ||
            !b || b->type != TR_JSON_NUMBER || !(a->number >= 0 && a->number <= 1e6) ||
            !(b->number >= 0 && b->number <= 1e6))
            return tr_fail(err, "%s: a Strip decoder needs a one-character \"content\" and counts "
                           "\"start\" and \"stop\"", t->name);
        d->start = (size_t)a->number;
        d->stop = (size_t)b->number;
    } else if (strcmp(type, "Metaspace") == 0) {
        int scheme;
        d->kind = D_METASPACE;
        if (one_char(tr_json_string(p, "replacement"), &d->ch))
            return tr_fail(err, "%s: the Metaspace decoder needs a one-character \"replacement\"", t->name);
        if (tr_tok_prepend_scheme(t, p, "decoder", &scheme, err))
            return TR_ERROR;
        d->never = scheme == PREPEND_NEVER;
    } else {
        return tr_fail(err, "not supported yet: decoder %s in %s (ByteLevel, Replace, ByteFallback, Fuse, "
                       "Strip, Metaspace and Sequence are)", type, t->name);
    }
    t->ndecs++;
    return TR_OK;
}

int tr_tok_load_decoder(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err)
{
    const struct tr_json *dec = tr_json_get(root, "decoder");
    if (!dec || dec->type == TR_JSON_NULL)
        return TR_OK;
    if (dec_one(t, dec, 0, err))
        return TR_ERROR;
    if (!t->byte_level)
        return TR_OK;
    /* byte-level: the chain must turn the characters back into bytes somewhere; ByteLevel
     * alone (or a Sequence of it alone) is each id's bytes concatenated, with no chain */
    int bl = 0;
    for (int i = 0; i < t->ndecs; i++)
        bl += t->dec[i].kind == D_BYTE_LEVEL;
    if (!bl) {
        const char *type = dec->type == TR_JSON_OBJECT ? tr_json_string(dec, "type") : NULL;
        return tr_fail(err, "not supported yet: decoder %s without ByteLevel, with a ByteLevel "
                       "pre-tokenizer in %s", type ? type : "(no type)", t->name);
    }
    if (t->ndecs == bl)
        t->ndecs = 0;
    return TR_OK;
}

static void push_id(int32_t **list, size_t *n, int32_t id)
{
    *list = tr_xrealloc(*list, (*n + 1) * sizeof **list);
    (*list)[(*n)++] = id;
}

/* A [token, id] pair of RobertaProcessing / BertProcessing; the id must be the vocabulary's
 * (or an added token's) id for that token. */
static int cls_sep(struct tr_tokenizer *t, const struct tr_json *p, const char *key, const char *type,
                   int32_t *id, tr_err *err)
{
    const struct tr_json *v = tr_json_get(p, key);
    if (!v || v->type != TR_JSON_ARRAY || v->n != 2 || v->items[0]->type != TR_JSON_STRING ||
        get_id(v->items[1], id) || (size_t)*id >= t->vocab_size || !t->bytes[*id])
        return tr_fail(err, "%s: post-processor %s needs \"%s\": [token, id] with an id of the vocabulary",
                       t->name, type, key);
    return TR_OK;
}

/* TemplateProcessing's single template: [{"SpecialToken": {"id": NAME}} | {"Sequence":
 * {"id": "A"}}, ...], each NAME's ids from "special_tokens". */
static int template_single(struct tr_tokenizer *t, const struct tr_json *p, tr_err *err)
{
    const struct tr_json *single = tr_json_get(p, "single");
    const struct tr_json *specials = tr_json_get(p, "special_tokens");
    if (!single || single->type != TR_JSON_ARRAY)
        return tr_fail(err, "%s: TemplateProcessing post-processor without a \"single\" template", t->name);
    int seen_a = 0;
    for (size_t i = 0; i < single->n; i++) {
        const struct tr_json *piece = single->items[i];
        const struct tr_json *seq = piece->type == TR_JSON_OBJECT ? tr_json_get(piece, "Sequence") : NULL;
        const struct tr_json *sp = piece->type == TR_JSON_OBJECT ? tr_json_get(piece, "SpecialToken") : NULL;
        const char *id = seq ? tr_json_string(seq, "id") : sp ? tr_json_string(sp, "id") : NULL;
        if (!id)
            return tr_fail(err, "%s: post-processor template piece %zu is neither a Sequence nor a "
                           "SpecialToken with an \"id\"", t->name, i);
        if (seq) {
            if (strcmp(id, "A") != 0 || seen_a)
                return tr_fail(err, "not supported yet: a single template with sequence %s%s in %s "
                               "(only one $A is)", id, seen_a ? " twice" : "", t->name);
            seen_a = 1;
            continue;
        }
        const struct tr_json *st = specials && specials->type == TR_JSON_OBJECT ? tr_json_get(specials, id) : NULL;
        const struct tr_json *ids = st && st->type == TR_JSON_OBJECT ? tr_json_get(st, "ids") : NULL;
        if (!ids || ids->type != TR_JSON_ARRAY || !ids->n)
            return tr_fail(err, "%s: post-processor template names special token %s, which its "
                           "\"special_tokens\" does not give ids", t->name, id);
        for (size_t k = 0; k < ids->n; k++) {
            int32_t v;
            if (get_id(ids->items[k], &v) || (size_t)v >= t->vocab_size || !t->bytes[v])
                return tr_fail(err, "%s: post-processor special token %s has an id outside the vocabulary",
                               t->name, id);
            if (seen_a)
                push_id(&t->after, &t->nafter, v);
            else
                push_id(&t->before, &t->nbefore, v);
        }
    }
    if (!seen_a)
        return tr_fail(err, "%s: the post-processor's single template has no $A (the text)", t->name);
    return TR_OK;
}

/* One post-processor (a Sequence's items too); *templates counts those that add tokens. */
static int postproc_one(struct tr_tokenizer *t, const struct tr_json *p, int depth, int *templates,
                        tr_err *err)
{
    const char *type = p && p->type == TR_JSON_OBJECT ? tr_json_string(p, "type") : NULL;
    if (!type)
        return tr_fail(err, "%s: a post_processor without a \"type\"", t->name);
    if (strcmp(type, "ByteLevel") == 0) /* it trims offsets only: the ids are left as they are */
        return TR_OK;
    if (strcmp(type, "Sequence") == 0) {
        const struct tr_json *list = tr_json_get(p, "processors");
        if (!list || list->type != TR_JSON_ARRAY || depth > 4)
            return tr_fail(err, "%s: a Sequence post-processor without a \"processors\" list", t->name);
        for (size_t i = 0; i < list->n; i++)
            if (postproc_one(t, list->items[i], depth + 1, templates, err))
                return TR_ERROR;
        return TR_OK;
    }
    int adds = strcmp(type, "TemplateProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0 ||
               strcmp(type, "BertProcessing") == 0;
    if (!adds)
        return tr_fail(err, "not supported yet: post-processor %s in %s", type, t->name);
    if (++*templates > 1)
        return tr_fail(err, "not supported yet: two post-processors that add special tokens in %s", t->name);
    if (type[0] == 'T')
        return template_single(t, p, err);
    int32_t cls, sep; /* single: cls $A sep */
    if (cls_sep(t, p, "cls", type, &cls, err) || cls_sep(t, p, "sep", type, &sep, err))
        return TR_ERROR;
    push_id(&t->before, &t->nbefore, cls);
    push_id(&t->after, &t->nafter, sep);
    return TR_OK;
}

int tr_tok_load_post(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err)
{
    const struct tr_json *p = tr_json_get(root, "post_processor");
    int templates = 0;
    if (!p || p->type == TR_JSON_NULL)
        return TR_OK;
    return postproc_one(t, p, 0, &templates, err);
}

/* ---- decode ------------------------------------------------------------ */

struct strs { struct buf *s; size_t n; };

static void strs_free(struct strs *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->s[i].p);
    free(l->s);
    l->s = NULL;
    l->n = 0;
}

/* moves b in */
static void strs_push(struct strs *l, struct buf b)
{
    l->s = tr_xrealloc(l->s, (l->n + 1) * sizeof *l->s);
    l->s[l->n++] = b;
}

/* a new empty string */
static struct buf *strs_add(struct strs *l)
{
    l->s = tr_xrealloc(l->s, (l->n + 1) * sizeof *l->s);
    l->s[l->n] = (struct buf){ 0 };
    buf_reserve(&l->s[l->n], 0);
    l->s[l->n].p[0] = 0;
    return &l->s[l->n++];
}

static int hex(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* "<0xNN>" -> NN as Rust's u8::from_str_radix(NN, 16) reads it (which takes "+F" too); -1 if not */
static int byte_token(const struct buf *b)
{
    const char *p = b->p;
    if (b->n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    if (p[3] == '+')
        return hex(p[4]);
    return hex(p[3]) < 0 || hex(p[4]) < 0 ? -1 : hex(p[3]) * 16 + hex(p[4]);
}

/* ByteFallback: runs of <0xNN> tokens become their bytes when those are valid UTF-8, else one
 * U+FFFD per byte (raw: the bytes all the same, for decode_next). */
static void byte_fallback(struct strs *l, int raw)
{
    struct strs r = { 0 };
    struct buf run = { 0 };
    size_t nrun = 0;
    for (size_t i = 0; i <= l->n; i++) {
        int b = i < l->n ? byte_token(&l->s[i]) : -1;
        if (b >= 0) {
            char c = (char)b;
            buf_add(&run, &c, 1);
            nrun++;
            continue;
        }
        if (nrun) {
            if (raw || tr_tok_utf8_valid(run.p, run.n) == run.n)
                buf_add(strs_add(&r), run.p, run.n);
            else
                for (size_t k = 0; k < nrun; k++)
                    buf_add(strs_add(&r), "\xef\xbf\xbd", 3);
            run.n = nrun = 0;
        }
        if (i < l->n) {
            strs_push(&r, l->s[i]);
            l->s[i] = (struct buf){ 0 };
        }
    }
    free(run.p);
    strs_free(l);
    *l = r;
}

/* The strings of l joined into one buffer (never NULL). */
static struct buf join(const struct strs *l)
{
    struct buf all = { 0 };
    buf_reserve(&all, 0);
    all.p[0] = 0;
    for (size_t i = 0; i < l->n; i++)
        buf_add(&all, l->s[i].p, l->s[i].n);
    return all;
}

/* The bytes of all the strings of l. */
static size_t strs_bytes(const struct strs *l)
{
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        n += l->s[i].n;
    return n;
}

/* Replace over each token string, through *tmp (scratch); all of them together may not
 * grow past max bytes. */
static int decode_replace(const struct tr_tokenizer *t, const struct dec *d, struct strs *l,
                          struct buf *tmp, size_t from, size_t max, tr_err *err)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(d->re, NULL);
    size_t total = strs_bytes(l);
    for (size_t i = 0; i < l->n; i++) {
        /* token strings from the file may not be valid UTF-8: PCRE2 must check */
        if (tr_tok_utf8_valid(l->s[i].p, l->s[i].n) != l->s[i].n)
            continue;
        size_t others = total - l->s[i].n;
        int rc = others > max ? 1 : tr_tok_replace_all(t, d->re, md, l->s[i].p, l->s[i].n, d->text, d->ntext,
                                                        max - others, tmp, err);
        if (rc) {
            pcre2_match_data_free(md);
            return rc < 0 ? TR_ERROR : tr_tok_grown(t, "decoders", from, err);
        }
        total = others + tmp->n;
        struct buf swap = l->s[i];
        l->s[i] = *tmp;
        *tmp = swap;
    }
    pcre2_match_data_free(md);
    return TR_OK;
}

/* Strip: up to d->start of d->ch taken off the front of s[0..m), d->stop off its end. */
static void decode_strip(const struct dec *d, const char *s, size_t m, struct buf *out)
{
    size_t a = 0, b = m;
    uint32_t cp;
    for (size_t c = 0; c < d->start && a < m; c++) {
        size_t kk = utf8_at(s, m, a, &cp);
        if (cp != d->ch)
            break;
        a += kk;
    }
    for (size_t c = 0; c < d->stop && b > a; c++) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80)
            j--;
        utf8_at(s, m, j, &cp);
        if (cp != d->ch)
            break;
        b = j;
    }
    buf_add(out, s + a, b - a);
}

/* Metaspace: the replacement is a space again; in the first token it is dropped (it was
 * prepended) unless the scheme is "never". */
static void decode_metaspace(const struct dec *d, const char *s, size_t m, int first, struct buf *out)
{
    uint32_t cp;
    for (size_t j = 0; j < m;) {
        size_t kk = utf8_at(s, m, j, &cp);
        if (cp != d->ch)
            buf_add(out, s + j, kk);
        else if (!first || d->never)
            buf_add(out, " ", 1);
        j += kk;
    }
}

/* Rust's String::from_utf8_lossy: each maximal invalid stretch (a lead byte and the
 * continuation bytes that could still follow it) becomes one U+FFFD. */
static void utf8_lossy(const char *s, size_t n, struct buf *out)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t ok = tr_tok_utf8_valid(s + i, n - i);
        buf_add(out, s + i, ok);
        i += ok;
        if (i >= n)
            break;
        unsigned c = u[i];
        size_t need = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
        size_t k = 1;
        for (size_t j = 0; j < need && i + k < n; j++) {
            unsigned d = u[i + k];
            unsigned lo = 0x80, hi = 0xBF;
            if (j == 0 && c == 0xE0) lo = 0xA0;
            if (j == 0 && c == 0xED) hi = 0x9F;
            if (j == 0 && c == 0xF0) lo = 0x90;
            if (j == 0 && c == 0xF4) hi = 0x8F;
            if (d < lo || d > hi)
                break;
            k++;
        }
        buf_add(out, "\xef\xbf\xbd", 3);
        i += k;
    }
}

/* ByteLevel: each token whose characters are all byte-level ones becomes those bytes, any
 * other stays as it is; all joined into one string, made valid UTF-8 as the library does
 * (raw: the bytes as they are, for decode_next). */
static void decode_byte_level(struct strs *l, int raw)
{
    struct buf all = { 0 };
    buf_reserve(&all, 0);
    for (size_t i = 0; i < l->n; i++) {
        const char *s = l->s[i].p;
        size_t m = l->s[i].n, start = all.n;
        int whole = tr_tok_utf8_valid(s, m) == m;
        for (size_t j = 0; whole && j < m;) {
            uint32_t cp;
            size_t k = utf8_at(s, m, j, &cp);
            int b = tr_tok_char_byte(cp);
            if (b < 0) {
                whole = 0;
                break;
            }
            char c = (char)b;
            buf_add(&all, &c, 1);
            j += k;
        }
        if (!whole) {
            all.n = start;
            buf_add(&all, s, m);
        }
    }
    strs_free(l);
    if (raw) {
        strs_push(l, all);
        return;
    }
    struct buf ok = { 0 };
    buf_reserve(&ok, all.n);
    ok.p[0] = 0;
    utf8_lossy(all.p, all.n, &ok);
    free(all.p);
    strs_push(l, ok);
}

/* The decoder chain over the token strings, as the library's decode_chain; then joined. */
static int decode_chain(const struct tr_tokenizer *t, const int32_t *ids, size_t n, int raw, char **out,
                        size_t *len, tr_err *err)
{
    struct strs l = { 0 };
    for (size_t i = 0; i < n; i++) { /* byte-level: the token as written (ByteLevel decodes it) */
        const char *s = t->byte_level && t->token[ids[i]] ? t->token[ids[i]] : t->bytes[ids[i]];
        buf_add(strs_add(&l), s, t->byte_level && t->token[ids[i]] ? strlen(s) : t->nbytes[ids[i]]);
    }
    struct buf tmp = { 0 };
    size_t from = strs_bytes(&l), max = tr_tok_growth_limit(from);
    for (int k = 0; k < t->ndecs; k++) {
        const struct dec *d = &t->dec[k];
        if (d->kind == D_BYTE_LEVEL) {
            decode_byte_level(&l, raw);
        } else if (d->kind == D_BYTE_FALLBACK) {
            byte_fallback(&l, raw);
        } else if (d->kind == D_FUSE) {
            struct buf all = join(&l);
            strs_free(&l);
            strs_push(&l, all);
        } else if (d->kind == D_REPLACE) {
            if (decode_replace(t, d, &l, &tmp, from, max, err)) {
                free(tmp.p);
                strs_free(&l);
                return TR_ERROR;
            }
        } else { /* Strip and Metaspace: character by character */
            for (size_t i = 0; i < l.n; i++) {
                tmp.n = 0;
                buf_reserve(&tmp, l.s[i].n);
                if (d->kind == D_STRIP)
                    decode_strip(d, l.s[i].p, l.s[i].n, &tmp);
                else
                    decode_metaspace(d, l.s[i].p, l.s[i].n, i == 0, &tmp);
                struct buf swap = l.s[i];
                l.s[i] = tmp;
                tmp = swap;
            }
        }
    }
    free(tmp.p);
    struct buf all = join(&l);
    strs_free(&l);
    *out = all.p;
    *len = all.n;
    return TR_OK;
}

int tr_tokenizer_decode(const struct tr_tokenizer *t, const int32_t *ids, size_t n, char **out,
                        size_t *len, tr_err *err)
{
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->vocab_size || !t->bytes[ids[i]])
            return tr_fail(err, "id %d (at %zu) is not in %s's vocabulary", (int)ids[i], i, t->name);
        total += t->nbytes[ids[i]];
    }
    if (!t->byte_level || t->ndecs)
        return decode_chain(t, ids, n, 0, out, len, err);
    char *s = tr_xcalloc(total + 1, 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s + o, t->bytes[ids[i]], t->nbytes[ids[i]]);
        o += t->nbytes[ids[i]];
    }
    *out = s;
    *len = o;
    return TR_OK;
}

/* the byte of a <0xNN> vocabulary token, else -1 */
static int id_byte(const struct tr_tokenizer *t, int32_t id)
{
    const char *tok = t->token[id];
    struct buf b = { (char *)tok, tok ? strlen(tok) : 0, 0 };
    return tok ? byte_token(&b) : -1;
}

/* How many of ids[0..n) decode_next decodes: all, but for a byte-level chain without the
 * tokens of a trailing run of <0xNN> tokens past its last whole UTF-8 character. */
static size_t stable_prefix(const struct tr_tokenizer *t, const int32_t *ids, size_t n)
{
    if (!t->byte_level)
        return n;
    size_t k = n;
    while (k > 0 && id_byte(t, ids[k - 1]) >= 0)
        k--;
    if (k == n)
        return n;
    char *run = tr_xcalloc(n - k, 1);
    for (size_t i = k; i < n; i++)
        run[i - k] = (char)id_byte(t, ids[i]);
    size_t whole = tr_tok_utf8_valid(run, n - k); /* the run's whole characters, a token a byte */
    free(run);
    return k + whole;
}

int tr_tokenizer_decode_next(const struct tr_tokenizer *t, const int32_t *ids, size_t n, char **out,
                             size_t *len, tr_err *err)
{
    *out = NULL;
    *len = 0;
    if (!n)
        return tr_fail(err, "tr_tokenizer_decode_next needs at least one id");
    if (t->byte_level && !t->ndecs)
        return tr_tokenizer_decode(t, ids + n - 1, 1, out, len, err);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= t->vocab_size || !t->bytes[ids[i]])
            return tr_fail(err, "id %d (at %zu) is not in %s's vocabulary", (int)ids[i], i, t->name);
    /* the decoders here (Replace, raw ByteFallback, Fuse, Strip at the start, Metaspace) only
     * ever extend the text of a prefix, so the new text is what follows it.  Byte-level, where
     * ByteLevel reads what ByteFallback made, a trailing run of <0xNN> tokens that is not yet
     * whole UTF-8 waits: a lone <0xC3> is not a prefix of the byte <0xC3><0xA4> ("ä") gives */
    size_t upto = stable_prefix(t, ids, n), before_upto = stable_prefix(t, ids, n - 1);
    char *all, *before;
    size_t nall, nbefore;
    if (decode_chain(t, ids, upto, 1, &all, &nall, err))
        return TR_ERROR;
    if (decode_chain(t, ids, before_upto, 1, &before, &nbefore, err)) {
        free(all);
        return TR_ERROR;
    }
    size_t same = 0;
    while (same < nbefore && same < nall && before[same] == all[same])
        same++;
    free(before);
    memmove(all, all + same, nall - same + 1);
    *out = all;
    *len = nall - same;
    return TR_OK;
}
