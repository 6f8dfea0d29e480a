/* BPE tokenizers from a Hugging Face tokenizer.json: byte-level (GPT-2, Llama 3, Qwen) and
 * on Unicode characters with byte fallback (SentencePiece style: Llama 2, Mistral).
 *
 * encode, as the `tokenizers` library does it:
 *  1. added tokens that are not "normalized" are cut out of the text, leftmost-longest;
 *  2. each stretch between them goes through the normalizers (NFC/NFD/NFKC/NFKD with
 *     utf8proc, Lowercase, Strip, Replace, Prepend), then the "normalized" added tokens are
 *     cut out of the result;
 *  3. each remaining stretch goes through the pre-tokenizer: byte-level files through the
 *     chain of Split (a PCRE2 regex, UTF + UCP, JIT when there is one, "Isolated"), Digits and
 *     ByteLevel; character-level files through Metaspace (spaces become "▁", one is
 *     prepended, the text is cut before each "▁") or nothing;
 *  4. each word becomes symbols (byte-level: one per byte; otherwise one per character, a
 *     character missing from the vocabulary becoming its <0xNN> byte tokens or the unknown
 *     token) and the merges apply lowest rank first, leftmost first, with the library's
 *     priority queue.  Words of up to 64 bytes are cached.
 * decode: byte-level files concatenate each id's bytes; the others run the file's decoder
 * chain (Replace, ByteFallback, Fuse, Strip, Metaspace) over the token strings.
 *
 * This file holds encode (steps 1 and 3: the added tokens and the pre-tokenizers) and the
 * tokenizer's small accessors; tokenizer_load.c reads tokenizer.json, tokenizer_bpe.c is the
 * BPE model (step 4), the normalizers are in tokenizer_normalize.c, the post-processors,
 * decoders and decode in tokenizer_post.c (tokenizer_internal.h is what they share).
 *
 * The file is untrusted: every id, size and string is checked before use. */
#include "tokenizer_internal.h"

/* Length of the valid UTF-8 prefix of s[0..n). */
size_t tr_tok_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t k;
        unsigned cp, min;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; min = 0x10000; }
        else return i;
        if (i + k >= n)
            return i;
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (u[i + j] & 0xC0) != 0x80)
                return i;
            cp = cp << 6 | (u[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += k + 1;
    }
    return n;
}

/* The error of normalizers or decoders (what) that made a text of `from` bytes longer than
 * tr_tok_growth_limit allows. */
int tr_tok_grown(const struct tr_tokenizer *t, const char *what, size_t from, tr_err *err)
{
    return tr_fail(err, "%s: its %s make a text of %zu bytes longer than %zu bytes (at most %d times its "
                   "length plus %d bytes, and 1 GiB, are allowed): a Replace that lengthens the text on "
                   "every pass? Fix the %s in the file, or use another tokenizer",
                   t->name, what, from, tr_tok_growth_limit(from), MAX_GROWTH, GROWTH_SLACK, what);
}

/* s[0..n) with every match of re replaced by with[0..nwith), into out.  Matches as the
 * library's (Oniguruma's) find_iter: left to right, not overlapping, an empty match right
 * where the previous match ended skipped.  A result longer than max bytes is an error
 * (1, err not set: the caller names the steps), found before it is built. */
int tr_tok_replace_all(const struct tr_tokenizer *t, const pcre2_code *re, pcre2_match_data *md,
                       const char *s, size_t n, const char *with, size_t nwith, size_t max, struct buf *out,
                       tr_err *err)
{
    out->n = 0;
    buf_reserve(out, n);
    size_t pos = 0, copied = 0;
    int matched = 0;
    size_t last_end = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tr_fail(err, "%s: Replace regex failed: %s", t->name, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a > n || b > n || b < a || a < copied)
            return tr_fail(err, "%s: Replace regex gave a bad match", t->name);
        if (a == b && matched && last_end == b) {
            if (pos >= n)
                break;
            pos++;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        if (out->n + (a - copied) + nwith > max)
            return 1;
        buf_add(out, s + copied, a - copied);
        buf_add(out, with, nwith);
        copied = pos = last_end = b;
        matched = 1;
    }
    if (out->n + (n - copied) > max)
        return 1;
    buf_add(out, s + copied, n - copied);
    return TR_OK;
}

/* ---- the tokenizer ------------------------------------------------------- */

void tr_tokenizer_free(struct tr_tokenizer *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->vocab_size; i++) {
        if (t->token)
            free(t->token[i]);
        if (t->bytes)
            free(t->bytes[i]);
    }
    free(t->token);
    free(t->bytes);
    free(t->nbytes);
    free(t->vocab.e);
    free(t->merges.e);
    free(t->no_cut.e);
    free(t->unk_missing);
    for (size_t i = 0; i < t->nadded; i++) {
        if (t->added[i].ns != t->added[i].s)
            free(t->added[i].ns);
        free(t->added[i].s);
    }
    free(t->added);
    free(t->before);
    free(t->after);
    for (int i = 0; i < t->nnorms; i++) {
        pcre2_match_data_free(t->norm[i].md);
        pcre2_code_free(t->norm[i].re);
        free(t->norm[i].text);
    }
    for (int i = 0; i < t->nsteps; i++) {
        pcre2_match_data_free(t->md[i]);
        pcre2_code_free(t->step[i]);
    }
    for (int i = 0; i < t->ndecs; i++) {
        pcre2_code_free(t->dec[i].re);
        free(t->dec[i].text);
    }
    if (t->cache) {
        for (size_t i = 0; i < 2 * CACHE_MAX_ENTRIES; i++) {
            free(t->cache[i].word);
            free(t->cache[i].ids);
        }
        free(t->cache);
    }
    free(t->sym);
    free(t->heap);
    free(t->bl);
    free(t->nb[0].p);
    free(t->nb[1].p);
    free(t->ms.p);
    free(t->name);
    free(t);
}

size_t tr_tokenizer_vocab_size(const struct tr_tokenizer *t) { return t->vocab_size; }

int32_t tr_tokenizer_token_id(const struct tr_tokenizer *t, const char *text)
{
    size_t n = strlen(text);
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].n == n && memcmp(t->added[i].s, text, n) == 0)
            return t->added[i].id;
    for (size_t id = 0; id < t->vocab_size; id++)
        if (t->bytes[id] && t->nbytes[id] == n && memcmp(t->bytes[id], text, n) == 0)
            return (int32_t)id;
    return -1;
}

/* ---- encode: added tokens and pre-tokenizers ------------------------------- */

/* A word of the pre-tokenizers: to the BPE model, or to tr_tokenizer_pretokenize's callback. */
static int word(struct tr_tokenizer *t, const char *w, size_t n, struct out *o, tr_err *err)
{
    if (!n)
        return TR_OK;
    if (t->word_fn) {
        t->word_fn(t->word_ctx, w, n);
        return TR_OK;
    }
    return tr_tok_bpe_word(t, w, n, o, err);
}

static int split(struct tr_tokenizer *t, int k, const char *s, size_t n, struct out *o, tr_err *err);

static int piece(struct tr_tokenizer *t, int k, const char *s, size_t n, struct out *o, tr_err *err)
{
    if (!n)
        return TR_OK;
    if (k + 1 < t->nsteps)
        return split(t, k + 1, s, n, o, err);
    return word(t, s, n, o, err);
}

/* Step k: matches and the stretches between them are pieces ("Isolated"). */
static int split(struct tr_tokenizer *t, int k, const char *s, size_t n, struct out *o, tr_err *err)
{
    if (k >= t->nsteps) /* no regex at all: the whole stretch is one word */
        return piece(t, k, s, n, o, err);
    size_t pos = 0, last = 0;
    while (pos <= n) {
        int rc = t->jit[k] ? pcre2_jit_match(t->step[k], (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, t->md[k], NULL)
                           : pcre2_match(t->step[k], (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, t->md[k], NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tr_fail(err, "%s: pre-tokenizer regex failed: %s", t->name, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md[k]);
        size_t a = ov[0], b = ov[1];
        if (a > n || b > n || b < a)
            return tr_fail(err, "%s: pre-tokenizer regex gave a bad match", t->name);
        if (b == a) { /* empty match: step over one character */
            pos = a + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        if (piece(t, k, s + last, a - last, o, err) || piece(t, k, s + a, b - a, o, err))
            return TR_ERROR;
        last = pos = b;
    }
    return piece(t, k, s + last, n - last, o, err);
}

/* The Metaspace pre-tokenizer: spaces become the replacement; one is prepended unless the
 * text starts with it ("always"; "first" only for the stretch at the start of the input);
 * with split, each replacement starts a new word. */
static int metaspace(struct tr_tokenizer *t, const char *s, size_t n, int first, struct out *o, tr_err *err)
{
    struct buf *b = &t->ms;
    const char *r = t->ms_repl;
    size_t rn = t->ms_len;
    b->n = 0;
    buf_reserve(b, n + n / 2 + rn);
    int starts = s[0] == ' ' || (n >= rn && memcmp(s, r, rn) == 0);
    if (!starts && (t->ms_scheme == PREPEND_ALWAYS || (t->ms_scheme == PREPEND_FIRST && first)))
        buf_add(b, r, rn);
    size_t last = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ' ') {
            buf_add(b, s + last, i - last);
            buf_add(b, r, rn);
            last = i + 1;
        }
    buf_add(b, s + last, n - last);
    if (!t->ms_split)
        return word(t, b->p, b->n, o, err);
    size_t from = 0;
    for (size_t i = 1; i + rn <= b->n; i++)
        if ((unsigned char)b->p[i] == (unsigned char)r[0] && memcmp(b->p + i, r, rn) == 0) {
            if (word(t, b->p + from, i - from, o, err))
                return TR_ERROR;
            from = i;
        }
    return word(t, b->p + from, b->n - from, o, err);
}

/* A stretch after normalization and the normalized added tokens: pre-tokenizer, then BPE.
 * first: it starts the input (Metaspace's "first"). */
static int pretok(struct tr_tokenizer *t, const char *s, size_t n, int first, struct out *o, tr_err *err)
{
    if (!n)
        return TR_OK;
    if (t->byte_level)
        return split(t, 0, s, n, o, err);
    if (t->metaspace)
        return metaspace(t, s, n, first, o, err);
    return word(t, s, n, o, err);
}

/* The leftmost-longest added token of one kind (normalized or not) in s[from..n); NULL if none. */
static const struct added *next_added(const struct tr_tokenizer *t, int normalized, const char *s, size_t n,
                                      size_t from, size_t *at)
{
    const uint8_t *first = normalized ? t->first_norm : t->first_raw;
    for (size_t i = from; i < n; i++) {
        if (!first[(unsigned char)s[i]])
            continue;
        const struct added *best = NULL;
        for (size_t k = 0; k < t->nadded; k++) {
            const struct added *a = &t->added[k];
            if (a->normalized == normalized && a->nn && a->nn <= n - i && memcmp(s + i, a->ns, a->nn) == 0 &&
                (!best || a->nn > best->nn))
                best = a;
        }
        if (best) {
            *at = i;
            return best;
        }
    }
    return NULL;
}

/* An added token found at s[*start..*stop) takes in the whitespace before it (lstrip, back to
 * from: not what an earlier token took) and after it (rstrip), as the library does. */
static void widen(const struct added *a, const char *s, size_t n, size_t from, size_t *start, size_t *stop)
{
    uint32_t cp;
    while (a->lstrip && *start > from) {
        size_t j = *start - 1;
        while (j > from && ((unsigned char)s[j] & 0xC0) == 0x80)
            j--;
        utf8_at(s, n, j, &cp);
        if (!is_white(cp))
            break;
        *start = j;
    }
    while (a->rstrip && *stop < n) {
        size_t k = utf8_at(s, n, *stop, &cp);
        if (!is_white(cp))
            break;
        *stop += k;
    }
}

/* A stretch of the input between added tokens that are not normalized. */
static int encode_piece(struct tr_tokenizer *t, const char *s, size_t n, int at_start, struct out *o,
                        tr_err *err)
{
    const char *p = s;
    size_t m = n;
    if (t->nnorms && tr_tok_normalize(t, s, n, &p, &m, err))
        return TR_ERROR;
    size_t pos = 0;
    for (;;) {
        size_t at = m;
        const struct added *a = t->nadded_norm ? next_added(t, 1, p, m, pos, &at) : NULL;
        size_t stop = a ? at + a->nn : m;
        if (a)
            widen(a, p, m, pos, &at, &stop);
        if (pretok(t, p + pos, at - pos, at_start && pos == 0, o, err))
            return TR_ERROR;
        if (!a)
            return TR_OK;
        out_push(o, a->id);
        pos = stop;
    }
}

int tr_tokenizer_encode(struct tr_tokenizer *t, const char *text, size_t len, int32_t **ids,
                        size_t *n, tr_err *err)
{
    *ids = NULL;
    *n = 0;
    t->unknown = 0;
    size_t ok = tr_tok_utf8_valid(text, len);
    if (ok != len)
        return tr_fail(err, "text to encode is not valid UTF-8 at byte %zu", ok);
    struct out o = { 0 };
    size_t pos = 0;
    for (;;) {
        size_t at = len;
        const struct added *a = next_added(t, 0, text, len, pos, &at);
        size_t stop = a ? at + a->nn : len;
        if (a)
            widen(a, text, len, pos, &at, &stop);
        if (at > pos && encode_piece(t, text + pos, at - pos, pos == 0, &o, err)) {
            free(o.ids);
            return TR_ERROR;
        }
        if (!a)
            break;
        out_push(&o, a->id);
        pos = stop;
    }
    *ids = o.ids ? o.ids : tr_xcalloc(1, sizeof **ids);
    *n = o.n;
    return TR_OK;
}

int tr_tokenizer_pretokenize(struct tr_tokenizer *t, const char *text, size_t len,
                             void (*word)(void *ctx, const char *w, size_t n), void *ctx,
                             tr_err *err)
{
    /* encode's own path, with the words handed out instead of merged: the same
     * special-token cuts and pre-tokenizer chain by construction */
    t->word_fn = word;
    t->word_ctx = ctx;
    int32_t *ids;
    size_t n;
    int rc = tr_tokenizer_encode(t, text, len, &ids, &n, err);
    free(ids);
    t->word_fn = NULL;
    t->word_ctx = NULL;
    return rc;
}

/* Does text[0..len) have a character encode cannot represent?  An encode that failed only
 * because the unknown token the file names is missing counts as yes. */
static int has_unknown(struct tr_tokenizer *t, const char *text, size_t len, int *yes, tr_err *err)
{
    int32_t *ids;
    size_t n;
    tr_err e = {{0}};
    int rc = tr_tokenizer_encode(t, text, len, &ids, &n, &e);
    free(ids);
    *yes = t->unknown > 0;
    if (rc != TR_OK && !*yes) {
        *err = e;
        return TR_ERROR;
    }
    return TR_OK;
}

int tr_tokenizer_unknown_at(struct tr_tokenizer *t, const char *text, size_t len, size_t *at,
                            tr_err *err)
{
    *at = len;
    int yes;
    if (has_unknown(t, text, len, &yes, err))
        return TR_ERROR;
    if (!yes)
        return TR_OK;
    /* the shortest prefix, cut between characters, that has one ends with it: a binary
     * search over the character boundaries (each step one encode of a prefix) */
    size_t nb = 0, *b = tr_xcalloc(len + 1, sizeof *b);
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)text[i] & 0xC0) != 0x80)
            b[nb++] = i;
    b[nb++] = len;
    size_t lo = 0, hi = nb - 1; /* b[lo]'s prefix has none, b[hi]'s has one */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (has_unknown(t, text, b[mid], &yes, err)) {
            free(b);
            return TR_ERROR;
        }
        if (yes)
            hi = mid;
        else
            lo = mid;
    }
    *at = b[lo];
    free(b);
    return TR_OK;
}

int32_t tr_tokenizer_bos_id(const struct tr_tokenizer *t) { return t->nbefore ? t->before[0] : -1; }

int32_t tr_tokenizer_eos_id(const struct tr_tokenizer *t) { return t->nafter ? t->after[t->nafter - 1] : -1; }

int tr_tokenizer_encode_ex(struct tr_tokenizer *t, const char *text, size_t len, int add_special,
                           int32_t **ids, size_t *n, tr_err *err)
{
    if (tr_tokenizer_encode(t, text, len, ids, n, err))
        return TR_ERROR;
    if (!add_special || (!t->nbefore && !t->nafter))
        return TR_OK;
    int32_t *all = tr_xcalloc(t->nbefore + *n + t->nafter, sizeof *all);
    if (t->nbefore)
        memcpy(all, t->before, t->nbefore * sizeof *all);
    if (*n)
        memcpy(all + t->nbefore, *ids, *n * sizeof *all);
    if (t->nafter)
        memcpy(all + t->nbefore + *n, t->after, t->nafter * sizeof *all);
    free(*ids);
    *ids = all;
    *n += t->nbefore + t->nafter;
    return TR_OK;
}
