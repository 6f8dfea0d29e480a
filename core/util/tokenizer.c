/* Byte-level BPE from a Hugging Face tokenizer.json.
 *
 * encode: added (special) tokens are cut out first, leftmost-longest; each stretch between
 * them goes through the pre-tokenizer chain (Split with a regex, "Isolated"; Digits; ByteLevel,
 * with or without GPT-2's regex), compiled with PCRE2 (UTF + UCP, JIT when there is one); each
 * piece's bytes become byte-level symbols and the merges apply lowest rank first, leftmost
 * first, as the `tokenizers` library does.  Words are cached.
 * decode: each id's bytes (byte-level characters mapped back), concatenated.
 *
 * The file is untrusted: every id, size and string is checked before use. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include "json.h"
#include "util.h"

#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ID (1 << 24)          /* ids beyond 16M are refused */
#define MAX_STEPS 8               /* pre-tokenizer steps */
#define CACHE_MAX_WORD 64         /* bytes; longer words are not cached */
#define CACHE_MAX_ENTRIES (1 << 18)

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

/* string -> id; keys point into storage owned elsewhere */
struct smap {
    struct sent { const char *k; uint32_t n; int32_t v; } *e;
    size_t cap, used;
};

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

/* (left id, right id) -> (rank, merged id) */
struct mmap {
    struct ment { uint64_t key; int32_t rank, id; } *e; /* key 0 = empty (ids + 1) */
    size_t cap;
};

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)(a + 1) << 32 | (uint32_t)(b + 1); }

static struct ment *mmap_slot(const struct mmap *m, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (m->cap - 1);
    while (m->e[i].key && m->e[i].key != key)
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

/* ---- the tokenizer --------------------------------------------------------- */

struct added { char *s; size_t n; int32_t id; };

struct cached { char *word; uint32_t n, nids; int32_t *ids; };

struct tr_tokenizer {
    char *name;
    size_t vocab_size;          /* max id + 1 */
    char **token;               /* [vocab_size] byte-level form (vocab only), or NULL */
    char **bytes;               /* [vocab_size] decoded bytes, or NULL for a hole */
    uint32_t *nbytes;
    struct smap vocab;          /* byte-level form -> id */
    struct mmap merges;
    int ignore_merges;
    int32_t byte_id[256];       /* id of each single byte's symbol, -1 if none */
    char byte_char[256][3];     /* its byte-level character (UTF-8) */
    uint8_t byte_char_len[256];
    struct added *added;
    size_t nadded;
    int32_t *before, *after;    /* the post-processor's ids around the text */
    size_t nbefore, nafter;
    uint8_t added_first[256];
    pcre2_code *step[MAX_STEPS];
    pcre2_match_data *md[MAX_STEPS];
    int jit[MAX_STEPS];
    int nsteps;
    struct cached *cache;       /* open addressing, CACHE_MAX_ENTRIES * 2 slots */
    size_t cache_used;
    /* tr_tokenizer_pretokenize: each word goes here instead of to BPE */
    void (*word_fn)(void *ctx, const char *w, size_t n);
    void *word_ctx;
    /* scratch */
    int32_t *sym;
    size_t sym_cap;
    char *bl;
    size_t bl_cap;
};

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
static size_t utf8_valid(const char *s, size_t n)
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
    for (size_t i = 0; i < t->nadded; i++)
        free(t->added[i].s);
    free(t->added);
    free(t->before);
    free(t->after);
    for (int i = 0; i < t->nsteps; i++) {
        pcre2_match_data_free(t->md[i]);
        pcre2_code_free(t->step[i]);
    }
    if (t->cache) {
        for (size_t i = 0; i < 2 * CACHE_MAX_ENTRIES; i++) {
            free(t->cache[i].word);
            free(t->cache[i].ids);
        }
        free(t->cache);
    }
    free(t->sym);
    free(t->bl);
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

static int get_id(const struct tr_json *v, int32_t *id)
{
    if (!v || v->type != TR_JSON_NUMBER || !(v->number >= 0) || v->number >= MAX_ID ||
        v->number != (double)(int32_t)v->number)
        return -1;
    *id = (int32_t)v->number;
    return 0;
}

static int is_true(const struct tr_json *o, const char *key)
{
    const struct tr_json *v = tr_json_get(o, key);
    return v && v->type == TR_JSON_BOOL && v->boolean;
}

static int is_null(const struct tr_json *o, const char *key)
{
    const struct tr_json *v = tr_json_get(o, key);
    return !v || v->type == TR_JSON_NULL;
}

static int add_regex(struct tr_tokenizer *t, const char *pattern, int literal, tr_err *err)
{
    if (t->nsteps >= MAX_STEPS)
        return tr_fail(err, "%s: more than %d pre-tokenizer steps", t->name, MAX_STEPS);
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   literal ? PCRE2_LITERAL | PCRE2_UTF
                                           : PCRE2_UTF | PCRE2_UCP,
                                   &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return tr_fail(err, "%s: pre-tokenizer regex does not compile at offset %zu: %s", t->name,
                       (size_t)off, (const char *)msg);
    }
    int i = t->nsteps++;
    t->step[i] = re;
    t->jit[i] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    t->md[i] = pcre2_match_data_create_from_pattern(re, NULL);
    return TR_OK;
}

/* One pre-tokenizer (not a Sequence); sets *byte_level when it is ByteLevel. */
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
        return tr_fail(err, "not supported yet: model type %s in %s (only byte-level BPE is)", type,
                       t->name);
    if (is_true(model, "byte_fallback"))
        return tr_fail(err, "not supported yet: model type BPE with byte_fallback (SentencePiece style) in %s",
                       t->name);
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
        if (!content || !*content || get_id(tr_json_get(a, "id"), &id))
            return tr_fail(err, "%s: added_tokens[%zu] needs a non-empty \"content\" and a valid \"id\"",
                           t->name, i);
        if (is_true(a, "lstrip") || is_true(a, "rstrip") || is_true(a, "single_word"))
            return tr_fail(err, "not supported yet: added token %s with lstrip, rstrip or single_word in %s",
                           content, t->name);
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
        t->bytes[id] = byte_level_decode(k, &t->nbytes[id]);
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
        t->added[t->nadded++] = (struct added){ tr_xstrdup(content), strlen(content), id };
        t->added_first[(unsigned char)content[0]] = 1;
    }

    byte_level_map(t);
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = smap_get(&t->vocab, t->byte_char[b], t->byte_char_len[b]);

    const struct tr_json *merges = tr_json_get(model, "merges");
    if (!merges || merges->type != TR_JSON_ARRAY)
        return tr_fail(err, "%s: the model has no \"merges\" list", t->name);
    if (merges->n >= MAX_ID)
        return tr_fail(err, "%s: %zu merges (at most %d)", t->name, merges->n, MAX_ID - 1);
    t->merges.cap = 16;
    while (t->merges.cap < merges->n * 2)
        t->merges.cap *= 2;
    t->merges.e = tr_xcalloc(t->merges.cap, sizeof *t->merges.e);
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
        struct ment *e = mmap_slot(&t->merges, pair_key(ia, ib));
        *e = (struct ment){ pair_key(ia, ib), (int32_t)i, iab }; /* a repeated pair: the last wins */
    }
    free(buf);
    return TR_OK;
}

static int load_rest(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err)
{
    const struct tr_json *norm = tr_json_get(root, "normalizer");
    if (norm && norm->type != TR_JSON_NULL) {
        const char *type = norm->type == TR_JSON_OBJECT ? tr_json_string(norm, "type") : NULL;
        return tr_fail(err, "not supported yet: normalizer %s in %s", type ? type : "(no type)", t->name);
    }
    const struct tr_json *pre = tr_json_get(root, "pre_tokenizer");
    int byte_level = 0;
    if (!pre || pre->type == TR_JSON_NULL)
        return tr_fail(err, "not supported yet: BPE without a ByteLevel pre-tokenizer in %s", t->name);
    const char *type = pre->type == TR_JSON_OBJECT ? tr_json_string(pre, "type") : NULL;
    if (type && strcmp(type, "Sequence") == 0) {
        const struct tr_json *list = tr_json_get(pre, "pretokenizers");
        if (!list || list->type != TR_JSON_ARRAY)
            return tr_fail(err, "%s: a Sequence pre-tokenizer without \"pretokenizers\"", t->name);
        for (size_t i = 0; i < list->n; i++)
            if (pretok_one(t, list->items[i], &byte_level, err))
                return TR_ERROR;
    } else if (pretok_one(t, pre, &byte_level, err)) {
        return TR_ERROR;
    }
    if (!byte_level)
        return tr_fail(err, "not supported yet: BPE without a ByteLevel pre-tokenizer in %s", t->name);
    const struct tr_json *dec = tr_json_get(root, "decoder");
    if (dec && dec->type != TR_JSON_NULL) {
        const char *dt = dec->type == TR_JSON_OBJECT ? tr_json_string(dec, "type") : NULL;
        if (!dt || strcmp(dt, "ByteLevel") != 0)
            return tr_fail(err, "not supported yet: decoder %s in %s", dt ? dt : "(no type)", t->name);
    }
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

static int load_post(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err)
{
    const struct tr_json *p = tr_json_get(root, "post_processor");
    int templates = 0;
    if (!p || p->type == TR_JSON_NULL)
        return TR_OK;
    return postproc_one(t, p, 0, &templates, err);
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
    int rc = root->type != TR_JSON_OBJECT ? tr_fail(err, "%s: not a JSON object", name)
                                          : load_model(t, root, err);
    if (rc == TR_OK)
        rc = load_rest(t, root, err);
    if (rc == TR_OK)
        rc = load_post(t, root, err);
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

static void bpe_word(struct tr_tokenizer *t, const char *w, size_t n, struct out *o)
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
            return;
        }
        if (t->cache_used < CACHE_MAX_ENTRIES)
            slot = &t->cache[i];
    }
    size_t start = o->n;
    if (t->ignore_merges) {
        if (2 * n > t->bl_cap)
            t->bl = tr_xrealloc(t->bl, t->bl_cap = 2 * n + 64);
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)w[i];
            memcpy(t->bl + m, t->byte_char[b], t->byte_char_len[b]);
            m += t->byte_char_len[b];
        }
        int32_t id = smap_get(&t->vocab, t->bl, m);
        if (id >= 0) {
            out_push(o, id);
            goto done;
        }
    }
    if (n > t->sym_cap)
        t->sym = tr_xrealloc(t->sym, (t->sym_cap = n + 64) * sizeof *t->sym);
    int32_t *s = t->sym;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[(unsigned char)w[i]] >= 0) /* no symbol: dropped, as with no unk token */
            s[m++] = t->byte_id[(unsigned char)w[i]];
    while (m > 1) {
        int32_t best = INT32_MAX, best_id = -1;
        uint64_t best_key = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            struct ment *e = mmap_slot(&t->merges, pair_key(s[i], s[i + 1]));
            if (e->key && e->rank < best) {
                best = e->rank;
                best_id = e->id;
                best_key = e->key;
            }
        }
        if (best_id < 0)
            break;
        size_t j = 0;
        for (size_t i = 0; i < m;) {
            if (i + 1 < m && pair_key(s[i], s[i + 1]) == best_key) {
                s[j++] = best_id;
                i += 2;
            } else {
                s[j++] = s[i++];
            }
        }
        m = j;
    }
    for (size_t i = 0; i < m; i++)
        out_push(o, s[i]);
done:
    if (slot) {
        slot->word = tr_xcalloc(n + 1, 1);
        memcpy(slot->word, w, n);
        slot->n = (uint32_t)n;
        slot->nids = (uint32_t)(o->n - start);
        slot->ids = tr_xcalloc(slot->nids ? slot->nids : 1, sizeof *slot->ids);
        memcpy(slot->ids, o->ids + start, slot->nids * sizeof *slot->ids);
        t->cache_used++;
    }
}

static int split(struct tr_tokenizer *t, int k, const char *s, size_t n, struct out *o, tr_err *err);

static int piece(struct tr_tokenizer *t, int k, const char *s, size_t n, struct out *o, tr_err *err)
{
    if (!n)
        return TR_OK;
    if (k + 1 < t->nsteps)
        return split(t, k + 1, s, n, o, err);
    if (t->word_fn)
        t->word_fn(t->word_ctx, s, n);
    else
        bpe_word(t, s, n, o);
    return TR_OK;
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

int tr_tokenizer_encode(struct tr_tokenizer *t, const char *text, size_t len, int32_t **ids,
                        size_t *n, tr_err *err)
{
    *ids = NULL;
    *n = 0;
    size_t ok = utf8_valid(text, len);
    if (ok != len)
        return tr_fail(err, "text to encode is not valid UTF-8 at byte %zu", ok);
    struct out o = { 0 };
    size_t last = 0;
    for (size_t i = 0; i < len; i++) {
        if (!t->added_first[(unsigned char)text[i]])
            continue;
        const struct added *best = NULL;
        for (size_t k = 0; k < t->nadded; k++) {
            const struct added *a = &t->added[k];
            if (a->n <= len - i && memcmp(text + i, a->s, a->n) == 0 && (!best || a->n > best->n))
                best = a;
        }
        if (!best)
            continue;
        if (split(t, 0, text + last, i - last, &o, err)) {
            free(o.ids);
            return TR_ERROR;
        }
        out_push(&o, best->id);
        i += best->n - 1;
        last = i + 1;
    }
    if (split(t, 0, text + last, len - last, &o, err)) {
        free(o.ids);
        return TR_ERROR;
    }
    *ids = o.ids ? o.ids : tr_xcalloc(1, sizeof **ids);
    *n = o.n;
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
