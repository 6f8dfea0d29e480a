/* The tokenizer's insides, shared by its files (nothing outside core/tokenizer/tokenizer*.c
 * includes this):
 *   tokenizer.c            encode: the added tokens and the pre-tokenizers; the accessors;
 *   tokenizer_load.c       loading tokenizer.json: the model, the pre-tokenizers, the rest
 *                          through the two files below;
 *   tokenizer_bpe.c        the BPE model: symbols, merges, the word cache;
 *   tokenizer_normalize.c  the normalizers (NFC/NFD/NFKC/NFKD, Lowercase, Strip, Replace,
 *                          Prepend);
 *   tokenizer_post.c       the post-processors (special tokens around the text), the
 *                          decoders and decode. */
#ifndef TR_TOKENIZER_INTERNAL_H
#define TR_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include "../util/json.h"
#include "../util/util.h"

#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ID (1 << 24)          /* ids beyond 16M are refused */
#define MAX_STEPS 8               /* pre-tokenizer steps */
#define MAX_NORMS 16              /* normalizer steps */
#define MAX_DECS 16               /* decoder steps */
#define MAX_DEPTH 4               /* Sequences inside Sequences */
/* Normalizers and decoders may lengthen a text (NFKD spells U+FDFA in 18 characters, a
 * Replace turns " " into "\xe2\x96\x81"), but a tokenizer.json whose Replace steps grow it
 * on every pass would take all memory: the text they give may be at most MAX_GROWTH times
 * the text they got, plus GROWTH_SLACK bytes, and never more than MAX_GROWN_TEXT. */
#define MAX_GROWTH 32
#define GROWTH_SLACK 4096
#define MAX_GROWN_TEXT ((size_t)1 << 30)
static inline size_t tr_tok_growth_limit(size_t n)
{
    return n > (MAX_GROWN_TEXT - GROWTH_SLACK) / MAX_GROWTH ? MAX_GROWN_TEXT : n * MAX_GROWTH + GROWTH_SLACK;
}
#define CACHE_MAX_WORD 64         /* bytes; longer words are not cached */
#define CACHE_MAX_ENTRIES (1 << 18)

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* string -> id; keys point into storage owned elsewhere */
struct smap {
    struct sent { const char *k; uint32_t n; int32_t v; } *e;
    size_t cap, used;
};

/* (left id, right id) -> (rank, merged id) */
struct mmap {
    struct ment { uint64_t key; int32_t rank, id; } *e; /* key 0 = empty (ids + 1) */
    size_t cap;
};

/* ---- the tokenizer --------------------------------------------------------- */

/* An added token: s as written; ns the normalizers' output for it when it is "normalized"
 * (matched after normalization), else s. */
struct added { char *s; size_t n; int32_t id; int normalized; char *ns; size_t nn; int lstrip, rstrip; };

/* a cached word: its ids, and how many of its characters had no token (tr_tokenizer.unknown) */
struct cached { char *word; uint32_t n, nids, unknown; int32_t *ids; };

struct buf { char *p; size_t n, cap; };

enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_LOWER, N_STRIP, N_REPLACE, N_PREPEND };

struct norm {
    int kind;
    int left, right;            /* Strip */
    pcre2_code *re;             /* Replace */
    pcre2_match_data *md;
    char *text;                 /* Replace's content, Prepend's prefix */
    size_t ntext;
};

enum { D_REPLACE, D_BYTE_FALLBACK, D_FUSE, D_STRIP, D_METASPACE, D_BYTE_LEVEL };

struct dec {
    int kind;
    pcre2_code *re;             /* Replace */
    char *text;                 /* Replace's content */
    size_t ntext;
    uint32_t ch;                /* Strip's content, Metaspace's replacement */
    size_t start, stop;         /* Strip */
    int never;                  /* Metaspace with prepend_scheme "never" */
};

enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

/* a symbol of a word being merged, and a candidate merge (the library's Word and Merge) */
struct sym { int32_t id, prev, next, alive; };
struct merge { int32_t rank, pos, id; };

struct tr_tokenizer {
    char *name;
    size_t vocab_size;          /* max id + 1 */
    char **token;               /* [vocab_size] the vocabulary's key (vocab only), or NULL */
    char **bytes;               /* [vocab_size] decoded bytes (byte-level) or the token's text, NULL for a hole */
    uint32_t *nbytes;
    struct smap vocab;          /* key -> id */
    struct mmap merges;
    int ignore_merges;
    int byte_level;             /* symbols are bytes (ByteLevel), else Unicode characters */
    int byte_fallback, fuse_unk;
    int32_t unk_id;             /* -1: none */
    char *unk_missing;          /* an unk_token the vocabulary lacks (an error only when needed) */
    int32_t fallback_id[256];   /* id of <0xNN>, -1 if none */
    int32_t byte_id[256];       /* id of each single byte's symbol, -1 if none */
    char byte_char[256][3];     /* its byte-level character (UTF-8) */
    uint8_t byte_char_len[256];
    struct added *added;
    size_t nadded, nadded_norm;
    uint8_t first_raw[256], first_norm[256]; /* first bytes of the two kinds of added tokens */
    int32_t *before, *after;    /* the post-processor's ids around the text */
    size_t nbefore, nafter;
    struct norm norm[MAX_NORMS];
    int nnorms;
    pcre2_code *step[MAX_STEPS];
    pcre2_match_data *md[MAX_STEPS];
    int jit[MAX_STEPS];
    int nsteps;
    /* Long words on characters are merged in chunks, each starting at a "▁" whose left
     * neighbour is a vocabulary character that no merge ever joins to a "▁..." token:
     * then no token can span the cut, and the chunks merge exactly as the whole word. */
    int chunks;
    struct smap no_cut;         /* those left neighbours that a merge does join */
    int metaspace, ms_scheme, ms_split; /* the Metaspace pre-tokenizer */
    char ms_repl[5];
    size_t ms_len;
    struct dec dec[MAX_DECS];
    int ndecs;
    struct cached *cache;       /* open addressing, CACHE_MAX_ENTRIES * 2 slots */
    size_t cache_used;
    /* tr_tokenizer_pretokenize: each word goes here instead of to BPE */
    void (*word_fn)(void *ctx, const char *w, size_t n);
    void *word_ctx;
    /* characters (bytes, byte-level) the current encode could not represent: given the unknown
     * token or, without one, dropped (tr_tokenizer_unknown_at) */
    size_t unknown;
    /* scratch */
    struct sym *sym;
    size_t sym_cap;
    struct merge *heap;
    size_t heap_cap;
    char *bl;
    size_t bl_cap;
    struct buf nb[2], ms;
};

/* ---- small helpers (static inline: each file gets its own) ---------------- */

static inline void buf_reserve(struct buf *b, size_t more)
{
    if (b->n + more + 1 > b->cap) {
        b->cap = 2 * (b->n + more + 1);
        b->p = tr_xrealloc(b->p, b->cap);
    }
}

static inline void buf_add(struct buf *b, const char *s, size_t n)
{
    buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static inline void buf_char(struct buf *b, uint32_t cp)
{
    char u[4];
    buf_add(b, u, (size_t)tr_utf8_encode(cp, u));
}

/* The character at s[i] (i < n) and its length; a malformed sequence reads as one byte
 * U+FFFD (token strings from the file are not checked as UTF-8). */
static inline size_t utf8_at(const char *s, size_t n, size_t i, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s + i;
    size_t left = n - i, k;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if ((u[0] & 0xE0) == 0xC0) { k = 2; *cp = u[0] & 0x1F; }
    else if ((u[0] & 0xF0) == 0xE0) { k = 3; *cp = u[0] & 0x0F; }
    else if ((u[0] & 0xF8) == 0xF0) { k = 4; *cp = u[0] & 0x07; }
    else k = 0;
    if (!k || k > left) {
        *cp = 0xFFFD;
        return 1;
    }
    for (size_t j = 1; j < k; j++) {
        if ((u[j] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        *cp = *cp << 6 | (u[j] & 0x3F);
    }
    return k;
}

/* Rust's char::is_whitespace (the White_Space property), which Strip uses */
static inline int is_white(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

static inline int get_id(const struct tr_json *v, int32_t *id)
{
    if (!v || v->type != TR_JSON_NUMBER || !(v->number >= 0) || v->number >= MAX_ID ||
        v->number != (double)(int32_t)v->number)
        return -1;
    *id = (int32_t)v->number;
    return 0;
}

static inline int is_true(const struct tr_json *o, const char *key)
{
    const struct tr_json *v = tr_json_get(o, key);
    return v && v->type == TR_JSON_BOOL && v->boolean;
}

static inline int is_null(const struct tr_json *o, const char *key)
{
    const struct tr_json *v = tr_json_get(o, key);
    return !v || v->type == TR_JSON_NULL;
}

/* A string of exactly one character (Metaspace's replacement, Strip's content). */
static inline int one_char(const char *s, uint32_t *cp)
{
    if (!s || !*s)
        return -1;
    size_t n = strlen(s);
    return utf8_at(s, n, 0, cp) == n && *cp != 0xFFFD ? 0 : -1;
}

/* The maps' lookups, which encode and loading both use. */
static inline uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ h >> 29;
}

static inline struct sent *smap_slot(const struct smap *m, const char *k, size_t n)
{
    size_t i = hash_bytes(k, n) & (m->cap - 1);
    while (m->e[i].k && !(m->e[i].n == n && memcmp(m->e[i].k, k, n) == 0))
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

static inline int32_t smap_get(const struct smap *m, const char *k, size_t n)
{
    if (!m->cap)
        return -1;
    struct sent *e = smap_slot(m, k, n);
    return e->k ? e->v : -1;
}

static inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)(a + 1) << 32 | (uint32_t)(b + 1); }

static inline struct ment *mmap_slot(const struct mmap *m, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (m->cap - 1);
    while (m->e[i].key && m->e[i].key != key)
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

/* The ids encode puts out. */
struct out { int32_t *ids; size_t n, cap; };

static inline void out_push(struct out *o, int32_t id)
{
    if (o->n == o->cap)
        o->ids = tr_xrealloc(o->ids, (o->cap = o->cap ? 2 * o->cap : 256) * sizeof *o->ids);
    o->ids[o->n++] = id;
}

/* ---- between the files ------------------------------------------------------ */

/* tokenizer.c */
size_t tr_tok_utf8_valid(const char *s, size_t n);
int tr_tok_replace_all(const struct tr_tokenizer *t, const pcre2_code *re, pcre2_match_data *md,
                       const char *s, size_t n, const char *with, size_t nwith, size_t max, struct buf *out,
                       tr_err *err);
int tr_tok_grown(const struct tr_tokenizer *t, const char *what, size_t from, tr_err *err);
/* tokenizer_load.c */
int tr_tok_replace_pattern(struct tr_tokenizer *t, const struct tr_json *p, const char *what,
                           pcre2_code **re, char **text, size_t *ntext, tr_err *err);
int tr_tok_prepend_scheme(struct tr_tokenizer *t, const struct tr_json *p, const char *what, int *scheme,
                          tr_err *err);
/* tokenizer_bpe.c: a word's ids, appended to o */
int tr_tok_bpe_word(struct tr_tokenizer *t, const char *w, size_t n, struct out *o, tr_err *err);
/* tokenizer_normalize.c */
int tr_tok_norm_one(struct tr_tokenizer *t, const struct tr_json *p, int depth, tr_err *err);
int tr_tok_normalize(struct tr_tokenizer *t, const char *s, size_t n, const char **out, size_t *nout,
                     tr_err *err);
/* tokenizer_post.c */
int tr_tok_load_decoder(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err);
int tr_tok_load_post(struct tr_tokenizer *t, const struct tr_json *root, tr_err *err);

/* GPT-2's byte-level character -> its byte, -1 if cp is not one of the 256 (tokenizer_load.c) */
int tr_tok_char_byte(unsigned cp);

#endif
