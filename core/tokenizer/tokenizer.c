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
 * This file loads tokenizer.json and holds the model, the pre-tokenizers and encode; the
 * normalizers are in tokenizer_normalize.c, the post-processors, decoders and decode in
 * tokenizer_post.c (tokenizer_internal.h is what they share).
 *
 * The file is untrusted: every id, size and string is checked before use. */
#include "tokenizer_internal.h"

#include <errno.h>
#include <stdio.h>
#include <utf8proc.h>

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- hashing ------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ h >> 29;
}

static void smap_init(struct smap *m, size_t want)
{
    m->cap = 16;
    while (m->cap < want * 2)
        m->cap *= 2;
    m->e = tr_xcalloc(m->cap, sizeof *m->e);
    m->used = 0;
}

static struct sent *smap_slot(const struct smap *m, const char *k, size_t n)
{
    size_t i = hash_bytes(k, n) & (m->cap - 1);
    while (m->e[i].k && !(m->e[i].n == n && memcmp(m->e[i].k, k, n) == 0))
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

static int32_t smap_get(const struct smap *m, const char *k, size_t n)
{
    if (!m->cap)
        return -1;
    struct sent *e = smap_slot(m, k, n);
    return e->k ? e->v : -1;
}

/* 0 added, 1 already there (value left) */
static int smap_put(struct smap *m, const char *k, size_t n, int32_t v)
{
    if ((m->used + 1) * 2 > m->cap) {
        struct smap g;
        smap_init(&g, m->cap);
        for (size_t i = 0; i < m->cap; i++)
            if (m->e[i].k)
                *smap_slot(&g, m->e[i].k, m->e[i].n) = m->e[i];
        free(m->e);
        *m = (struct smap){ g.e, g.cap, m->used };
    }
    struct sent *e = smap_slot(m, k, n);
    if (e->k)
        return 1;
    *e = (struct sent){ k, (uint32_t)n, v };
    m->used++;
    return 0;
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)(a + 1) << 32 | (uint32_t)(b + 1); }

static struct ment *mmap_slot(const struct mmap *m, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (m->cap - 1);
    while (m->e[i].key && m->e[i].key != key)
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

/* GPT-2's bytes_to_unicode */
static void byte_level_map(struct tr_tokenizer *t)
{
    unsigned extra = 0;
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp;
        if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))
            cp = b;
        else
            cp = 256 + extra++;
        t->byte_char_len[b] = (unsigned char)tr_utf8_encode(cp, t->byte_char[b]);
    }
}

/* The inverse: a code point -> its byte, -1 if it is not one of the 256. */
static int char_byte(unsigned cp)
{
    static int inv[324];
    static int ready;
    if (!ready) {
        unsigned extra = 0;
        for (unsigned i = 0; i < 324; i++)
            inv[i] = -1;
        for (unsigned b = 0; b < 256; b++) {
            unsigned c = ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) ? b : 256 + extra++;
            inv[c] = (int)b;
        }
        ready = 1;
    }
    return cp < 324 ? inv[cp] : -1;
}

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

/* Decode a byte-level token string to its bytes (chars outside the map kept as UTF-8). */
static char *byte_level_decode(const char *s, uint32_t *len)
{
    size_t n = strlen(s), o = 0;
    char *out = tr_xcalloc(n + 1, 1);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned cp = u[i];
        size_t k = 1;
        if ((cp & 0xE0) == 0xC0 && i + 1 < n) { cp = (cp & 0x1F) << 6 | (u[i + 1] & 0x3F); k = 2; }
        int b = k == 2 || cp < 0x80 ? char_byte(cp) : -1;
        if (b >= 0) {
            out[o++] = (char)b;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
        }
        i += k;
    }
    *len = (uint32_t)o;
    return out;
}

/* ---- small helpers ------------------------------------------------------- */

/* Regexes as the library's Oniguruma (Ruby syntax) reads them: Unicode classes, and ^ and $
 * at every line's start and end. */
static pcre2_code *compile(struct tr_tokenizer *t, const char *what, const char *pattern, int literal,
                           tr_err *err)
{
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   literal ? PCRE2_LITERAL | PCRE2_UTF : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                   &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        tr_fail(err, "%s: %s regex does not compile at offset %zu: %s", t->name, what, (size_t)off,
                (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* pcre2_match uses it when it works */
    return re;
}

/* A Replace pattern, {"String": s} or {"Regex": r}.  The library makes a String an Oniguruma
 * regex too, so an empty one matches at every character boundary. */
int tr_tok_replace_pattern(struct tr_tokenizer *t, const struct tr_json *p, const char *what,
                           pcre2_code **re, char **text, size_t *ntext, tr_err *err)
{
    const struct tr_json *pat = tr_json_get(p, "pattern");
    const char *rx = pat && pat->type == TR_JSON_OBJECT ? tr_json_string(pat, "Regex") : NULL;
    const char *lit = pat && pat->type == TR_JSON_OBJECT ? tr_json_string(pat, "String") : NULL;
    const char *content = tr_json_string(p, "content");
    if ((!rx && !lit) || !content)
        return tr_fail(err, "%s: a Replace %s needs a \"pattern\" ({\"String\": ...} or {\"Regex\": ...}) "
                       "and a \"content\"", t->name, what);
    if (!(*re = compile(t, what, rx ? rx : lit, !rx, err)))
        return TR_ERROR;
    *text = tr_xstrdup(content);
    *ntext = strlen(content);
    return TR_OK;
}

/* s[0..n) with every match of re replaced by with[0..nwith), into out.  Matches as the
 * library's (Oniguruma's) find_iter: left to right, not overlapping, an empty match right
 * where the previous match ended skipped. */
int tr_tok_replace_all(const struct tr_tokenizer *t, const pcre2_code *re, pcre2_match_data *md,
                       const char *s, size_t n, const char *with, size_t nwith, struct buf *out, tr_err *err)
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
        buf_add(out, s + copied, a - copied);
        buf_add(out, with, nwith);
        copied = pos = last_end = b;
        matched = 1;
    }
    buf_add(out, s + copied, n - copied);
    return TR_OK;
}

/* ---- loading ------------------------------------------------------------- */

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

/* Metaspace's tr_tok_prepend_scheme ("always", "first", "never"); older files have only
 * add_prefix_space (true: "always"). */
int tr_tok_prepend_scheme(struct tr_tokenizer *t, const struct tr_json *p, const char *what, int *scheme,
                          tr_err *err)
{
    const char *s = tr_json_string(p, "prepend_scheme");
    if (!s) {
        const struct tr_json *a = tr_json_get(p, "add_prefix_space");
        *scheme = a && a->type == TR_JSON_BOOL && !a->boolean ? PREPEND_NEVER : PREPEND_ALWAYS;
        return TR_OK;
    }
    if (strcmp(s, "always") == 0)
        *scheme = PREPEND_ALWAYS;
    else if (strcmp(s, "first") == 0)
        *scheme = PREPEND_FIRST;
    else if (strcmp(s, "never") == 0)
        *scheme = PREPEND_NEVER;
    else
        return tr_fail(err, "%s: Metaspace %s with prepend_scheme \"%s\" (always, first or never)", t->name,
                       what, s);
    return TR_OK;
}

/* ---- pre-tokenizers ---------------------------------------------------------- */

static int add_regex(struct tr_tokenizer *t, const char *pattern, int literal, tr_err *err)
{
    if (t->nsteps >= MAX_STEPS)
        return tr_fail(err, "%s: more than %d pre-tokenizer steps", t->name, MAX_STEPS);
    pcre2_code *re = compile(t, "pre-tokenizer", pattern, literal, err);
    if (!re)
        return TR_ERROR;
    int i = t->nsteps++;
    t->step[i] = re;
    t->jit[i] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    t->md[i] = pcre2_match_data_create_from_pattern(re, NULL);
    return TR_OK;
}

/* One pre-tokenizer of a byte-level file (not a Sequence); sets *byte_level at ByteLevel. */
static int pretok_one(struct tr_tokenizer *t, const struct tr_json *p, int *byte_level, tr_err *err)
{
    const char *type = p && p->type == TR_JSON_OBJECT ? tr_json_string(p, "type") : NULL;
    if (!type)
        return tr_fail(err, "%s: a pre_tokenizer without a \"type\"", t->name);
    if (*byte_level)
        return tr_fail(err, "not supported yet: pre-tokenizer %s after ByteLevel in %s", type, t->name);
    if (strcmp(type, "ByteLevel") == 0) {
        if (is_true(p, "add_prefix_space"))
            return tr_fail(err, "not supported yet: ByteLevel pre-tokenizer with add_prefix_space in %s",
                           t->name);
        *byte_level = 1;
        const struct tr_json *r = tr_json_get(p, "use_regex");
        if (!r || r->type != TR_JSON_BOOL || r->boolean) /* default true */
            return add_regex(t, GPT2_PATTERN, 0, err);
        return TR_OK;
    }
    if (strcmp(type, "Split") == 0) {
        const char *behavior = tr_json_string(p, "behavior");
        if (!behavior || strcmp(behavior, "Isolated") != 0 || is_true(p, "invert"))
            return tr_fail(err, "not supported yet: Split pre-tokenizer with behavior %s%s in %s",
                           behavior ? behavior : "(none)", is_true(p, "invert") ? " inverted" : "",
                           t->name);
        const struct tr_json *pat = tr_json_get(p, "pattern");
        const char *re = pat ? tr_json_string(pat, "Regex") : NULL;
        const char *lit = pat ? tr_json_string(pat, "String") : NULL;
        if (re)
            return add_regex(t, re, 0, err);
        if (lit && *lit)
            return add_regex(t, lit, 1, err);
        return tr_fail(err, "%s: Split pre-tokenizer without a Regex or String pattern", t->name);
    }
    if (strcmp(type, "Digits") == 0) /* Rust's char::is_numeric is \p{N}: Nd, Nl, No */
        return add_regex(t, is_true(p, "individual_digits") ? "\\p{N}" : "\\p{N}+", 0, err);
    return tr_fail(err, "not supported yet: pre-tokenizer type %s in %s", type, t->name);
}

/* The pre-tokenizer as a list (a Sequence's items, or the one, kept in *one). */
static const struct tr_json *const *pretok_list(const struct tr_json *pre, const struct tr_json **one, size_t *n)
{
    *n = 0;
    if (!pre || pre->type == TR_JSON_NULL)
        return NULL;
    const char *type = pre->type == TR_JSON_OBJECT ? tr_json_string(pre, "type") : NULL;
    if (type && strcmp(type, "Sequence") == 0) {
        const struct tr_json *list = tr_json_get(pre, "pretokenizers");
        if (list && list->type == TR_JSON_ARRAY) {
            *n = list->n;
            return (const struct tr_json *const *)list->items;
        }
        return NULL;
    }
    *n = 1;
    *one = pre;
    return one;
}

/* Byte-level when the pre-tokenizer is or contains ByteLevel: the symbols are then bytes. */
static int is_byte_level(const struct tr_json *root)
{
    const struct tr_json *pre = tr_json_get(root, "pre_tokenizer");
    size_t n;
    const struct tr_json *one;
    const struct tr_json *const *list = pretok_list(pre, &one, &n);
    for (size_t i = 0; i < n; i++) {
        const char *type = list[i] && list[i]->type == TR_JSON_OBJECT ? tr_json_string(list[i], "type") : NULL;
        if (type && strcmp(type, "ByteLevel") == 0)
            return 1;
    }
    return 0;
}

static int load_pretok(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err)
{
    const struct tr_json *pre = tr_json_get(root, "pre_tokenizer");
    const char *type = pre && pre->type == TR_JSON_OBJECT ? tr_json_string(pre, "type") : NULL;
    size_t n;
    const struct tr_json *one;
    const struct tr_json *const *list = pretok_list(pre, &one, &n);
    if (type && strcmp(type, "Sequence") == 0 && !list)
        return tr_fail(err, "%s: a Sequence pre-tokenizer without \"pretokenizers\"", t->name);
    if (pre && pre->type != TR_JSON_NULL && !type)
        return tr_fail(err, "%s: a pre_tokenizer without a \"type\"", t->name);
    if (t->byte_level) {
        int byte_level = 0;
        for (size_t i = 0; i < n; i++)
            if (pretok_one(t, list[i], &byte_level, err))
                return TR_ERROR;
        return TR_OK;
    }
    /* on characters: no pre-tokenizer (Llama 2), or Metaspace alone (Mistral) */
    if (n == 0)
        return TR_OK;
    const char *first = list[0] && list[0]->type == TR_JSON_OBJECT ? tr_json_string(list[0], "type") : NULL;
    if (n > 1 || !first || strcmp(first, "Metaspace") != 0)
        return tr_fail(err, "not supported yet: pre-tokenizer %s%s in %s (a BPE without ByteLevel takes "
                       "Metaspace alone or none)", first ? first : "(no type)", n > 1 ? " in a Sequence" : "",
                       t->name);
    uint32_t cp;
    const char *repl = tr_json_string(list[0], "replacement");
    if (one_char(repl, &cp))
        return tr_fail(err, "%s: the Metaspace pre-tokenizer needs a one-character \"replacement\"", t->name);
    if (tr_tok_prepend_scheme(t, list[0], "pre-tokenizer", &t->ms_scheme, err))
        return TR_ERROR;
    const struct tr_json *split = tr_json_get(list[0], "split");
    t->ms_split = !split || split->type != TR_JSON_BOOL || split->boolean; /* default true */
    t->ms_len = strlen(repl);
    memcpy(t->ms_repl, repl, t->ms_len);
    t->metaspace = 1;
    return TR_OK;
}

static int load_model(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err)
{
    const struct tr_json *model = tr_json_get(root, "model");
    if (!model || model->type != TR_JSON_OBJECT)
        return tr_fail(err, "%s: no \"model\" object (is this a tokenizer.json?)", t->name);
    const char *type = tr_json_string(model, "type");
    const struct tr_json *vocab = tr_json_get(model, "vocab");
    if (!type && vocab && vocab->type == TR_JSON_OBJECT && tr_json_get(model, "merges"))
        type = "BPE"; /* older files leave the type out */
    if (!type)
        return tr_fail(err, "%s: the model has no \"type\"", t->name);
    if (strcmp(type, "BPE") != 0)
        return tr_fail(err, "not supported yet: model type %s in %s (only BPE is)", type, t->name);
    t->byte_fallback = is_true(model, "byte_fallback");
    if (t->byte_fallback && t->byte_level)
        return tr_fail(err, "not supported yet: BPE with byte_fallback and a ByteLevel pre-tokenizer in %s",
                       t->name);
    t->fuse_unk = is_true(model, "fuse_unk");
    const struct tr_json *unk = tr_json_get(model, "unk_token");
    if (unk && unk->type != TR_JSON_NULL && unk->type != TR_JSON_STRING)
        return tr_fail(err, "%s: the model's \"unk_token\" is not a string", t->name);
    if (!is_null(model, "continuing_subword_prefix") || !is_null(model, "end_of_word_suffix"))
        return tr_fail(err, "not supported yet: BPE with a subword prefix or suffix in %s", t->name);
    const struct tr_json *dropout = tr_json_get(model, "dropout");
    if (dropout && dropout->type == TR_JSON_NUMBER && dropout->number != 0)
        return tr_fail(err, "not supported yet: BPE dropout in %s", t->name);
    t->ignore_merges = is_true(model, "ignore_merges");
    if (!vocab || vocab->type != TR_JSON_OBJECT)
        return tr_fail(err, "%s: the model has no \"vocab\" object", t->name);

    /* ids: vocab and added tokens together */
    int32_t max = -1, id;
    for (size_t i = 0; i < vocab->n; i++) {
        if (get_id(vocab->items[i], &id))
            return tr_fail(err, "%s: vocab entry %zu has no valid id (0..%d)", t->name, i, MAX_ID - 1);
        if (id > max)
            max = id;
    }
    const struct tr_json *added = tr_json_get(root, "added_tokens");
    if (added && added->type != TR_JSON_ARRAY && added->type != TR_JSON_NULL)
        return tr_fail(err, "%s: \"added_tokens\" is not a list", t->name);
    size_t nadded = added && added->type == TR_JSON_ARRAY ? added->n : 0;
    for (size_t i = 0; i < nadded; i++) {
        const struct tr_json *a = added->items[i];
        const char *content = a && a->type == TR_JSON_OBJECT ? tr_json_string(a, "content") : NULL;
        const struct tr_json *nz = a && a->type == TR_JSON_OBJECT ? tr_json_get(a, "normalized") : NULL;
        if (nz && nz->type != TR_JSON_BOOL)
            return tr_fail(err, "%s: added_tokens[%zu]: \"normalized\" is not true or false", t->name, i);
        if (!content || !*content || get_id(tr_json_get(a, "id"), &id))
            return tr_fail(err, "%s: added_tokens[%zu] needs a non-empty \"content\" and a valid \"id\"",
                           t->name, i);
        if (is_true(a, "single_word"))
            return tr_fail(err, "not supported yet: added token %s with single_word in %s", content, t->name);
        if (id > max)
            max = id;
    }
    if (max < 0)
        return tr_fail(err, "%s: the vocabulary is empty", t->name);
    t->vocab_size = (size_t)max + 1;
    t->token = tr_xcalloc(t->vocab_size, sizeof *t->token);
    t->bytes = tr_xcalloc(t->vocab_size, sizeof *t->bytes);
    t->nbytes = tr_xcalloc(t->vocab_size, sizeof *t->nbytes);
    smap_init(&t->vocab, vocab->n);
    for (size_t i = 0; i < vocab->n; i++) {
        get_id(vocab->items[i], &id);
        const char *k = vocab->keys[i];
        if (t->token[id])
            return tr_fail(err, "%s: id %d is given to both \"%s\" and \"%s\"", t->name, (int)id,
                           t->token[id], k);
        t->token[id] = tr_xstrdup(k);
        if (smap_put(&t->vocab, t->token[id], strlen(k), id))
            return tr_fail(err, "%s: \"%s\" is in the vocab twice", t->name, k);
        if (t->byte_level) {
            t->bytes[id] = byte_level_decode(k, &t->nbytes[id]);
        } else {
            t->bytes[id] = tr_xstrdup(k);
            t->nbytes[id] = (uint32_t)strlen(k);
        }
    }
    t->added = tr_xcalloc(nadded ? nadded : 1, sizeof *t->added);
    for (size_t i = 0; i < nadded; i++) {
        const struct tr_json *a = added->items[i];
        const char *content = tr_json_string(a, "content");
        get_id(tr_json_get(a, "id"), &id);
        if (t->token[id] && strcmp(t->token[id], content) != 0)
            return tr_fail(err, "%s: added token %s has id %d, which the vocab gives to \"%s\"",
                           t->name, content, (int)id, t->token[id]);
        if (t->bytes[id] && !t->token[id])
            return tr_fail(err, "%s: id %d is given to two added tokens", t->name, (int)id);
        free(t->bytes[id]);
        t->bytes[id] = tr_xstrdup(content);
        t->nbytes[id] = (uint32_t)strlen(content);
        /* "normalized" left out: the library's default, true unless the token is special */
        const struct tr_json *nz = tr_json_get(a, "normalized");
        int normalized = nz ? nz->boolean : !is_true(a, "special");
        char *s = tr_xstrdup(content);
        t->added[t->nadded++] = (struct added){ s, strlen(s), id, normalized, s, strlen(s),
                                                is_true(a, "lstrip"), is_true(a, "rstrip") };
    }

    byte_level_map(t);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = smap_get(&t->vocab, t->byte_char[b], t->byte_char_len[b]);
        t->fallback_id[b] = smap_get(&t->vocab, name, strlen(name));
    }
    t->unk_id = -1;
    if (unk && unk->type == TR_JSON_STRING && (t->unk_id = smap_get(&t->vocab, unk->string, strlen(unk->string))) < 0)
        t->unk_missing = tr_xstrdup(unk->string);

    const struct tr_json *merges = tr_json_get(model, "merges");
    if (!merges || merges->type != TR_JSON_ARRAY)
        return tr_fail(err, "%s: the model has no \"merges\" list", t->name);
    if (merges->n >= MAX_ID)
        return tr_fail(err, "%s: %zu merges (at most %d)", t->name, merges->n, MAX_ID - 1);
    t->merges.cap = 16;
    while (t->merges.cap < merges->n * 2)
        t->merges.cap *= 2;
    t->merges.e = tr_xcalloc(t->merges.cap, sizeof *t->merges.e);
    smap_init(&t->no_cut, 16);
    char *buf = NULL;
    size_t bufcap = 0;
    for (size_t i = 0; i < merges->n; i++) {
        const struct tr_json *m = merges->items[i];
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if (m->type == TR_JSON_STRING) {
            const char *sp = strchr(m->string, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                a = m->string; na = (size_t)(sp - a);
                b = sp + 1; nb = strlen(b);
            }
        } else if (m->type == TR_JSON_ARRAY && m->n == 2 && m->items[0]->type == TR_JSON_STRING &&
                   m->items[1]->type == TR_JSON_STRING) {
            a = m->items[0]->string; na = strlen(a);
            b = m->items[1]->string; nb = strlen(b);
        }
        if (!a) {
            free(buf);
            return tr_fail(err, "%s: merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", t->name, i);
        }
        int32_t ia = smap_get(&t->vocab, a, na), ib = smap_get(&t->vocab, b, nb);
        if (na + nb + 1 > bufcap)
            buf = tr_xrealloc(buf, bufcap = na + nb + 64);
        memcpy(buf, a, na);
        memcpy(buf + na, b, nb);
        int32_t iab = smap_get(&t->vocab, buf, na + nb);
        if (ia < 0 || ib < 0 || iab < 0) {
            buf[na + nb] = 0;
            tr_err e2;
            snprintf(e2.msg, sizeof e2.msg, "%s: merges[%zu] (%.*s + %.*s = %s) uses a token not in the vocab",
                     t->name, i, (int)(na > 100 ? 100 : na), a, (int)(nb > 100 ? 100 : nb), b,
                     na + nb > 200 ? "..." : buf);
            free(buf);
            return tr_fail(err, "%s", e2.msg);
        }
        if (!t->byte_level && nb >= 3 && memcmp(b, SPACE_MARK, 3) == 0) {
            size_t j = na - 1; /* a's last character, which a merge joins to a "▁..." */
            while (j > 0 && ((unsigned char)a[j] & 0xC0) == 0x80)
                j--;
            smap_put(&t->no_cut, t->token[ia] + j, na - j, 1);
        }
        struct ment *e = mmap_slot(&t->merges, pair_key(ia, ib));
        *e = (struct ment){ pair_key(ia, ib), (int32_t)i, iab }; /* a repeated pair: the last wins */
    }
    free(buf);
    t->chunks = !t->byte_level && !t->ignore_merges && smap_get(&t->vocab, SPACE_MARK, 3) >= 0;
    return TR_OK;
}
/* The "normalized" added tokens are looked for in normalized text, so their content goes
 * through the normalizers too (the library's normalized trie). */
static int added_prepare(struct tr_tokenizer *t, tr_err *err)
{
    for (size_t i = 0; i < t->nadded; i++) {
        struct added *a = &t->added[i];
        if (tr_tok_utf8_valid(a->s, a->n) != a->n)
            return tr_fail(err, "%s: added token %zu is not valid UTF-8", t->name, i);
        if (a->normalized && t->nnorms) {
            const char *ns;
            size_t nn;
            if (tr_tok_normalize(t, a->s, a->n, &ns, &nn, err))
                return TR_ERROR;
            a->ns = tr_xcalloc(nn + 1, 1);
            memcpy(a->ns, ns, nn);
            a->nn = nn;
        }
        if (!a->nn)
            continue;
        (a->normalized ? t->first_norm : t->first_raw)[(unsigned char)a->ns[0]] = 1;
        t->nadded_norm += a->normalized;
    }
    return TR_OK;
}

struct tr_tokenizer *tr_tokenizer_parse(const char *text, size_t len, const char *name, tr_err *err)
{
    size_t off = 0;
    struct tr_json *root = tr_json_parse(text, len, &off);
    if (!root) {
        tr_fail(err, "%s: not valid JSON (at byte %zu)", name, off);
        return NULL;
    }
    struct tr_tokenizer *t = tr_xcalloc(1, sizeof *t);
    t->name = tr_xstrdup(name);
    int rc = TR_OK;
    if (root->type != TR_JSON_OBJECT) {
        rc = tr_fail(err, "%s: not a JSON object", name);
    } else {
        t->byte_level = is_byte_level(root);
        const struct tr_json *norm = tr_json_get(root, "normalizer");
        rc = load_model(t, root, err);
        if (rc == TR_OK && norm && norm->type != TR_JSON_NULL)
            rc = tr_tok_norm_one(t, norm, 0, err);
        if (rc == TR_OK)
            rc = added_prepare(t, err);
        if (rc == TR_OK)
            rc = load_pretok(t, root, err);
        if (rc == TR_OK)
            rc = tr_tok_load_decoder(t, root, err);
        if (rc == TR_OK)
            rc = tr_tok_load_post(t, root, err);
    }
    tr_json_free(root);
    if (rc != TR_OK) {
        tr_tokenizer_free(t);
        return NULL;
    }
    t->cache = tr_xcalloc(2 * CACHE_MAX_ENTRIES, sizeof *t->cache);
    return t;
}

struct tr_tokenizer *tr_tokenizer_load(const char *path, tr_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        tr_fail(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *text = tr_xcalloc(cap, 1);
    size_t got;
    while ((got = fread(text + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap)
            text = tr_xrealloc(text, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(text);
        tr_fail(err, "%s: read error", path);
        return NULL;
    }
    struct tr_tokenizer *t = tr_tokenizer_parse(text, n, path, err);
    free(text);
    return t;
}

/* ---- encode ------------------------------------------------------------ */

struct out { int32_t *ids; size_t n, cap; };

static void out_push(struct out *o, int32_t id)
{
    if (o->n == o->cap)
        o->ids = tr_xrealloc(o->ids, (o->cap = o->cap ? 2 * o->cap : 256) * sizeof *o->ids);
    o->ids[o->n++] = id;
}

static void heap_push(struct tr_tokenizer *t, size_t *n, struct merge m)
{
    if (*n == t->heap_cap)
        t->heap = tr_xrealloc(t->heap, (t->heap_cap = t->heap_cap ? 2 * t->heap_cap : 256) * sizeof *t->heap);
    struct merge *h = t->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < m.rank || (h[p].rank == m.rank && h[p].pos <= m.pos))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct merge heap_pop(struct tr_tokenizer *t, size_t *n)
{
    struct merge *h = t->heap, top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos)))
            c++;
        if (last.rank < h[c].rank || (last.rank == h[c].rank && last.pos <= h[c].pos))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static const struct ment *merge_of(const struct tr_tokenizer *t, int32_t a, int32_t b)
{
    const struct ment *e = mmap_slot(&t->merges, pair_key(a, b));
    return e->key ? e : NULL;
}

/* The library's Word::merge_all: the candidate merge of lowest rank, leftmost among equal
 * ranks, is applied first; a candidate whose symbols changed since it was queued is skipped. */
static void merge_all(struct tr_tokenizer *t, size_t m, struct out *o)
{
    struct sym *s = t->sym;
    size_t nheap = 0;
    for (size_t i = 0; i < m; i++) {
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < m ? (int32_t)i + 1 : -1;
        s[i].alive = 1;
    }
    for (size_t i = 0; i + 1 < m; i++) {
        const struct ment *e = merge_of(t, s[i].id, s[i + 1].id);
        if (e)
            heap_push(t, &nheap, (struct merge){ e->rank, (int32_t)i, e->id });
    }
    while (nheap) {
        struct merge top = heap_pop(t, &nheap);
        struct sym *cur = &s[top.pos];
        if (!cur->alive || cur->next < 0)
            continue;
        struct sym *right = &s[cur->next];
        const struct ment *e = merge_of(t, cur->id, right->id);
        if (!e || e->id != top.id)
            continue;
        cur->id = top.id;
        right->alive = 0;
        cur->next = right->next;
        if (right->next >= 0)
            s[right->next].prev = top.pos;
        if (cur->prev >= 0 && (e = merge_of(t, s[cur->prev].id, cur->id)))
            heap_push(t, &nheap, (struct merge){ e->rank, cur->prev, e->id });
        if (cur->next >= 0 && (e = merge_of(t, cur->id, s[cur->next].id)))
            heap_push(t, &nheap, (struct merge){ e->rank, top.pos, e->id });
    }
    for (int32_t i = m ? 0 : -1; i >= 0; i = s[i].next)
        out_push(o, s[i].id);
}

/* The symbols of a word, as the library's BPE::merge_word makes them: each character (each
 * byte's character for byte-level files) that is in the vocabulary is a symbol; one that is
 * not becomes its <0xNN> byte tokens (byte_fallback, when all are there), else the unknown
 * token (runs of them fused into one with fuse_unk; a pending unknown is added at the next
 * known character, after any byte tokens, as the library does), else nothing. */
static int symbols(struct tr_tokenizer *t, const char *w, size_t n, size_t *count, tr_err *err)
{
    if (n + 1 > t->sym_cap)
        t->sym = tr_xrealloc(t->sym, (t->sym_cap = 2 * n + 64) * sizeof *t->sym);
    struct sym *s = t->sym;
    size_t m = 0;
    int unk = 0;
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        int32_t id;
        if (t->byte_level) {
            id = t->byte_id[(unsigned char)w[i]];
        } else {
            uint32_t cp;
            k = utf8_at(w, n, i, &cp);
            id = smap_get(&t->vocab, w + i, k);
        }
        if (id >= 0) {
            if (unk)
                s[m++].id = t->unk_id;
            unk = 0;
            s[m++].id = id;
            i += k;
            continue;
        }
        if (t->byte_fallback) {
            size_t j = 0;
            while (j < k && t->fallback_id[(unsigned char)w[i + j]] >= 0)
                j++;
            if (j == k) {
                for (j = 0; j < k; j++)
                    s[m++].id = t->fallback_id[(unsigned char)w[i + j]];
                i += k;
                continue;
            }
        }
        t->unknown++;
        if (t->unk_missing)
            return tr_fail(err, "%s: the text has a character the vocabulary lacks, and the unknown token "
                           "\"%s\" the file names is not in the vocabulary either", t->name, t->unk_missing);
        if (t->unk_id >= 0) {
            if (unk && !t->fuse_unk)
                s[m++].id = t->unk_id;
            unk = 1;
        }
        i += k;
    }
    if (unk)
        s[m++].id = t->unk_id;
    *count = m;
    return TR_OK;
}

static int model_chunk(struct tr_tokenizer *t, const char *w, size_t n, struct out *o, tr_err *err)
{
    int cacheable = n <= CACHE_MAX_WORD;
    struct cached *slot = NULL;
    if (cacheable) {
        size_t i = hash_bytes(w, n) & (2 * CACHE_MAX_ENTRIES - 1);
        while (t->cache[i].word && !(t->cache[i].n == n && memcmp(t->cache[i].word, w, n) == 0))
            i = (i + 1) & (2 * CACHE_MAX_ENTRIES - 1);
        if (t->cache[i].word) {
            for (uint32_t k = 0; k < t->cache[i].nids; k++)
                out_push(o, t->cache[i].ids[k]);
            t->unknown += t->cache[i].unknown;
            return TR_OK;
        }
        if (t->cache_used < CACHE_MAX_ENTRIES)
            slot = &t->cache[i];
    }
    size_t start = o->n, unknown = t->unknown;
    int32_t whole = -1;
    if (t->ignore_merges) { /* a word that is a token is that token */
        if (t->byte_level) {
            if (2 * n > t->bl_cap)
                t->bl = tr_xrealloc(t->bl, t->bl_cap = 2 * n + 64);
            size_t m = 0;
            for (size_t i = 0; i < n; i++) {
                unsigned char b = (unsigned char)w[i];
                memcpy(t->bl + m, t->byte_char[b], t->byte_char_len[b]);
                m += t->byte_char_len[b];
            }
            whole = smap_get(&t->vocab, t->bl, m);
        } else {
            whole = smap_get(&t->vocab, w, n);
        }
    }
    if (whole >= 0) {
        out_push(o, whole);
    } else {
        size_t m = 0;
        if (symbols(t, w, n, &m, err))
            return TR_ERROR;
        merge_all(t, m, o);
    }
    if (slot) {
        slot->word = tr_xcalloc(n + 1, 1);
        memcpy(slot->word, w, n);
        slot->n = (uint32_t)n;
        slot->unknown = (uint32_t)(t->unknown - unknown);
        slot->nids = (uint32_t)(o->n - start);
        slot->ids = tr_xcalloc(slot->nids ? slot->nids : 1, sizeof *slot->ids);
        if (slot->nids) /* a word of symbols the vocabulary lacks has none, and o->ids may be NULL */
            memcpy(slot->ids, o->ids + start, slot->nids * sizeof *slot->ids);
        t->cache_used++;
    }
    return TR_OK;
}

/* A word; a long one on characters in chunks (see tr_tokenizer.chunks): Llama 2's files have
 * no pre-tokenizer, so a whole document would otherwise be one word. */
static int model_word(struct tr_tokenizer *t, const char *w, size_t n, struct out *o, tr_err *err)
{
    if (!t->chunks || n <= CACHE_MAX_WORD)
        return model_chunk(t, w, n, o, err);
    size_t from = 0, prev = 0; /* prev: where the character before i starts */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_at(w, n, i, &cp);
        if (i > from && k == 3 && memcmp(w + i, SPACE_MARK, 3) == 0 &&
            smap_get(&t->vocab, w + prev, i - prev) >= 0 && smap_get(&t->no_cut, w + prev, i - prev) < 0) {
            if (model_chunk(t, w + from, i - from, o, err))
                return TR_ERROR;
            from = i;
        }
        prev = i;
        i += k;
    }
    return model_chunk(t, w + from, n - from, o, err);
}

static int word(struct tr_tokenizer *t, const char *w, size_t n, struct out *o, tr_err *err)
{
    if (!n)
        return TR_OK;
    if (t->word_fn) {
        t->word_fn(t->word_ctx, w, n);
        return TR_OK;
    }
    return model_word(t, w, n, o, err);
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

