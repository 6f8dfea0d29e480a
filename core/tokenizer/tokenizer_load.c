/* Loading a tokenizer.json (see tokenizer.c for what encode does with it): the model (the
 * vocabulary, the added tokens, the merges), the pre-tokenizers, and through
 * tokenizer_normalize.c and tokenizer_post.c the normalizers, decoders and post-processor;
 * the added tokens' normalized text last.  The file is untrusted: every id, size and string
 * is checked before use. */
#include "tokenizer_internal.h"

#include <trainrun/input.h>
#include <errno.h>
#include <stdio.h>

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- the maps and the byte-level alphabet -------------------------------- */

static void smap_init(struct smap *m, size_t want)
{
    m->cap = 16;
    while (m->cap < want * 2)
        m->cap *= 2;
    m->e = tr_xcalloc(m->cap, sizeof *m->e);
    m->used = 0;
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
static int char_byte(unsigned cp);
int tr_tok_char_byte(unsigned cp) { return char_byte(cp); }
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

/* ---- regexes ------------------------------------------------------------------ */

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

/* ---- the model ---------------------------------------------------------------- */

/* The model's type and options, checked: BPE only, without the options not supported yet. */
static int model_options(struct tr_tokenizer *t, const struct tr_json *model, tr_err *err)
{
    const char *type = tr_json_string(model, "type");
    const struct tr_json *vocab = tr_json_get(model, "vocab");
    if (!type && vocab && vocab->type == TR_JSON_OBJECT && tr_json_get(model, "merges"))
        type = "BPE"; /* older files leave the type out */
    if (!type)
        return tr_fail(err, "%s: the model has no \"type\"", t->name);
    if (strcmp(type, "BPE") != 0)
        return tr_fail(err, "not supported yet: model type %s in %s (only BPE is)", type, t->name);
    /* with ByteLevel too, as the library does: a byte-level character missing from the
     * vocabulary becomes the <0xNN> tokens of its UTF-8 (tokenizer_bpe.c's symbols) */
    t->byte_fallback = is_true(model, "byte_fallback");
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
    return TR_OK;
}

/* The largest id of the vocab and the added tokens together (*max), every id and added
 * token checked; *nadded: how many added tokens there are. */
static int max_id(struct tr_tokenizer *t, const struct tr_json *vocab, const struct tr_json *added,
                  size_t *nadded, int32_t *max, tr_err *err)
{
    int32_t id;
    *max = -1;
    for (size_t i = 0; i < vocab->n; i++) {
        if (get_id(vocab->items[i], &id))
            return tr_fail(err, "%s: vocab entry %zu has no valid id (0..%d)", t->name, i, MAX_ID - 1);
        if (id > *max)
            *max = id;
    }
    if (added && added->type != TR_JSON_ARRAY && added->type != TR_JSON_NULL)
        return tr_fail(err, "%s: \"added_tokens\" is not a list", t->name);
    *nadded = added && added->type == TR_JSON_ARRAY ? added->n : 0;
    for (size_t i = 0; i < *nadded; i++) {
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
        if (id > *max)
            *max = id;
    }
    if (*max < 0)
        return tr_fail(err, "%s: the vocabulary is empty", t->name);
    return TR_OK;
}

/* The vocabulary of ids 0..max: each token's key, and its bytes (decoded, byte-level). */
static int load_vocab(struct tr_tokenizer *t, const struct tr_json *vocab, int32_t max, tr_err *err)
{
    int32_t id = 0; /* every id was checked by max_id */
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
    return TR_OK;
}

/* The added tokens (checked by max_id): their text, and whether they are "normalized". */
static int load_added(struct tr_tokenizer *t, const struct tr_json *added, size_t nadded, tr_err *err)
{
    int32_t id = 0; /* every id was checked by max_id */
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
    return TR_OK;
}

/* The ids of the single bytes (their byte-level characters, and the <0xNN> tokens of byte
 * fallback) and of the unknown token. */
static void special_ids(struct tr_tokenizer *t, const struct tr_json *model)
{
    byte_level_map(t);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = smap_get(&t->vocab, t->byte_char[b], t->byte_char_len[b]);
        t->fallback_id[b] = smap_get(&t->vocab, name, strlen(name));
    }
    const struct tr_json *unk = tr_json_get(model, "unk_token");
    t->unk_id = -1;
    if (unk && unk->type == TR_JSON_STRING && (t->unk_id = smap_get(&t->vocab, unk->string, strlen(unk->string))) < 0)
        t->unk_missing = tr_xstrdup(unk->string);
}

/* A merge's two sides, written "a b" or ["a", "b"]: 0, or -1 when it is neither. */
static int merge_sides(const struct tr_json *m, const char **a, size_t *na, const char **b, size_t *nb)
{
    *a = *b = NULL;
    *na = *nb = 0;
    if (m->type == TR_JSON_STRING) {
        const char *sp = strchr(m->string, ' ');
        if (sp && !strchr(sp + 1, ' ')) {
            *a = m->string; *na = (size_t)(sp - *a);
            *b = sp + 1; *nb = strlen(*b);
        }
    } else if (m->type == TR_JSON_ARRAY && m->n == 2 && m->items[0]->type == TR_JSON_STRING &&
               m->items[1]->type == TR_JSON_STRING) {
        *a = m->items[0]->string; *na = strlen(*a);
        *b = m->items[1]->string; *nb = strlen(*b);
    }
    return *a ? 0 : -1;
}

/* The merges, each a pair of vocabulary tokens whose concatenation is one too, ranked in
 * file order; on characters, also the left neighbours a merge joins to a "▁..." token
 * (tr_tokenizer.no_cut), and whether long words may be merged in chunks. */
static int load_merges(struct tr_tokenizer *t, const struct tr_json *model, tr_err *err)
{
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
        const char *a, *b;
        size_t na, nb;
        if (merge_sides(merges->items[i], &a, &na, &b, &nb)) {
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

/* The model: its options, the vocabulary and added tokens, the byte and unknown ids, the
 * merges. */
static int load_model(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err)
{
    const struct tr_json *model = tr_json_get(root, "model");
    if (!model || model->type != TR_JSON_OBJECT)
        return tr_fail(err, "%s: no \"model\" object (is this a tokenizer.json?)", t->name);
    if (model_options(t, model, err))
        return TR_ERROR;
    const struct tr_json *vocab = tr_json_get(model, "vocab");
    const struct tr_json *added = tr_json_get(root, "added_tokens");
    size_t nadded = 0;
    int32_t max = -1;
    if (max_id(t, vocab, added, &nadded, &max, err) || load_vocab(t, vocab, max, err) ||
        load_added(t, added, nadded, err))
        return TR_ERROR;
    special_ids(t, model);
    return load_merges(t, model, err);
}

/* ---- the whole file ----------------------------------------------------------- */

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
    FILE *f = tr_input_fopen(path);
    if (!f) {
        tr_fail(err, "%s: %s", path, tr_input_strerror(errno));
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
