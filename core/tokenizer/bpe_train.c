/* Byte-level BPE training (see bpe_train.h).
 *
 * feed: the documents go through tokenizer.c's own pre-tokenizer (a tokenizer.json holding
 * nothing but GPT-2's ByteLevel step), so training and encoding cut words identically; the
 * words are counted in a hash map.
 *
 * train, as the `tokenizers` library's BpeTrainer::do_train does it, so that the merges come
 * out the same: every distinct word becomes a list of symbol ids; pair counts (weighted by
 * the word's count) go into a map, and one max-heap entry per pair holds its count and the
 * words it occurs in.  An entry whose count went stale is pushed back with the current count
 * (counts only fall after a pair is pushed), so the top entry with a current count is the
 * most frequent pair; ties go to the smaller (left id, right id).  Merging it rewrites only
 * those words, left to right, and the neighbours' pair counts change by the word's count;
 * the pairs the merge created are pushed with the words they appeared in.  The library's
 * quirks are kept on purpose (the merged pair's own count is not zeroed; a merge whose text
 * is already a token reuses its id and the pair is written once, at its last rank), since
 * the point is the same tokenizer.json from the same text. */
#include "bpe_train.h"

#include "tokenizer.h"
#include "../util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hash maps -------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ h >> 29;
}

/* bytes -> index; keys are owned by the caller's storage */
struct strmap {
    struct strent { const char *k; size_t n; uint32_t v; } *e;
    size_t cap, used;
};

static void strmap_grow(struct strmap *m)
{
    struct strmap g = { tr_xcalloc(m->cap ? m->cap * 2 : 1024, sizeof *g.e), m->cap ? m->cap * 2 : 1024, 0 };
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].k)
            continue;
        size_t j = hash_bytes(m->e[i].k, m->e[i].n) & (g.cap - 1);
        while (g.e[j].k)
            j = (j + 1) & (g.cap - 1);
        g.e[j] = m->e[i];
    }
    free(m->e);
    g.used = m->used;
    *m = g;
}

/* The slot of key k (empty when absent), after making room for one more. */
static struct strent *strmap_slot(struct strmap *m, const char *k, size_t n)
{
    if ((m->used + 1) * 2 > m->cap)
        strmap_grow(m);
    size_t i = hash_bytes(k, n) & (m->cap - 1);
    while (m->e[i].k && !(m->e[i].n == n && memcmp(m->e[i].k, k, n) == 0))
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

/* (left, right) -> index into the pair table */
struct pairmap {
    struct pairent { uint64_t key; uint32_t v; } *e; /* key 0: empty (ids + 1) */
    size_t cap, used;
};

static uint64_t pkey(uint32_t a, uint32_t b) { return (uint64_t)(a + 1) << 32 | (uint64_t)(b + 1); }

static size_t phash(uint64_t key, size_t cap) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1); }

static struct pairent *pairmap_slot(struct pairmap *m, uint64_t key)
{
    if ((m->used + 1) * 2 > m->cap) {
        struct pairmap g = { tr_xcalloc(m->cap ? m->cap * 2 : 4096, sizeof *g.e), m->cap ? m->cap * 2 : 4096, m->used };
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->e[i].key)
                continue;
            size_t j = phash(m->e[i].key, g.cap);
            while (g.e[j].key)
                j = (j + 1) & (g.cap - 1);
            g.e[j] = m->e[i];
        }
        free(m->e);
        *m = g;
    }
    size_t i = phash(key, m->cap);
    while (m->e[i].key && m->e[i].key != key)
        i = (i + 1) & (m->cap - 1);
    return &m->e[i];
}

/* ---- feeding: word counts ----------------------------------------------------- */

struct tr_bpe_trainer {
    struct tr_tokenizer *pre;   /* GPT-2's pre-tokenizer, nothing else */
    struct strmap words;        /* word bytes -> index */
    char **word;                /* [n] bytes (owned) */
    uint32_t *word_len;
    uint64_t *count;
    size_t n, cap;
    uint64_t documents, bytes, total_words;
};

/* A tokenizer.json with GPT-2's ByteLevel pre-tokenizer and a one-entry vocabulary: only its
 * pre-tokenizer is used. */
static const char PRE_JSON[] =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"!\": 0}, \"merges\": []},"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
    " \"trim_offsets\": true, \"use_regex\": true}}";

struct tr_bpe_trainer *tr_bpe_trainer_new(tr_err *err)
{
    struct tr_tokenizer *pre = tr_tokenizer_parse(PRE_JSON, sizeof PRE_JSON - 1, "the BPE trainer's pre-tokenizer", err);
    if (!pre)
        return NULL;
    struct tr_bpe_trainer *b = tr_xcalloc(1, sizeof *b);
    b->pre = pre;
    return b;
}

void tr_bpe_trainer_free(struct tr_bpe_trainer *b)
{
    if (!b)
        return;
    tr_tokenizer_free(b->pre);
    for (size_t i = 0; i < b->n; i++)
        free(b->word[i]);
    free(b->word);
    free(b->word_len);
    free(b->count);
    free(b->words.e);
    free(b);
}

static void count_word(void *ctx, const char *w, size_t n)
{
    struct tr_bpe_trainer *b = ctx;
    b->total_words++;
    struct strent *e = strmap_slot(&b->words, w, n);
    if (e->k) {
        b->count[e->v]++;
        return;
    }
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 4096;
        b->word = tr_xrealloc(b->word, b->cap * sizeof *b->word);
        b->word_len = tr_xrealloc(b->word_len, b->cap * sizeof *b->word_len);
        b->count = tr_xrealloc(b->count, b->cap * sizeof *b->count);
    }
    char *copy = tr_xcalloc(n + 1, 1);
    memcpy(copy, w, n);
    b->word[b->n] = copy;
    b->word_len[b->n] = (uint32_t)n;
    b->count[b->n] = 1;
    *e = (struct strent){ copy, n, (uint32_t)b->n };
    b->words.used++;
    b->n++;
}

int tr_bpe_trainer_feed(struct tr_bpe_trainer *b, const char *text, size_t len, tr_err *err)
{
    if (len > UINT32_MAX)
        return tr_fail(err, "a document of %zu bytes is too long to train a tokenizer on (4 GiB at most)", len);
    if (tr_tokenizer_pretokenize(b->pre, text, len, count_word, b, err))
        return TR_ERROR;
    b->documents++;
    b->bytes += len;
    return TR_OK;
}

/* ---- training ------------------------------------------------------------------ */

/* GPT-2's bytes_to_unicode: the code point standing for byte b in byte-level strings.  The
 * loader (tokenizer.c) maps them back; test_bpe_train checks the two agree on every byte. */
static unsigned byte_cp(unsigned b)
{
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    unsigned extra = 0; /* the bytes before b that are not their own character */
    for (unsigned c = 0; c < b; c++)
        extra += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
    return 256 + extra;
}

struct heap_entry {
    uint64_t count;
    uint32_t a, b;
    uint32_t *pos;   /* words the pair was seen in (each once) */
    size_t npos;
};

struct pair {
    uint32_t a, b;
    int64_t count;
    uint32_t *pos;   /* words where a merge created it this round (where_to_update) */
    size_t npos, cap;
};

struct state {
    /* tokens: byte-level strings, NUL-terminated */
    char **tok;
    size_t ntok, tokcap;
    struct strmap tokmap;
    /* words as symbol lists: word i is sym[off[i] .. off[i] + len[i]) */
    uint32_t *sym;
    size_t *off;
    uint32_t *len;
    const uint64_t *count;
    /* pairs */
    struct pairmap pmap;
    struct pair *pairs;
    size_t npairs, paircap;
    uint32_t *touched;  /* pairs with a pos list this round */
    size_t ntouched, touchcap;
    /* the queue */
    struct heap_entry *heap;
    size_t nheap, heapcap;
    /* merges in order: left, right, result */
    uint32_t (*merges)[3];
    size_t nmerges, mergecap;
};

static uint32_t add_token(struct state *s, char *text)
{
    if (s->ntok == s->tokcap)
        s->tok = tr_xrealloc(s->tok, (s->tokcap = s->tokcap ? 2 * s->tokcap : 1024) * sizeof *s->tok);
    s->tok[s->ntok] = text;
    struct strent *e = strmap_slot(&s->tokmap, text, strlen(text));
    *e = (struct strent){ text, strlen(text), (uint32_t)s->ntok };
    s->tokmap.used++;
    return (uint32_t)s->ntok++;
}

static struct pair *pair_of(struct state *s, uint32_t a, uint32_t b)
{
    struct pairent *e = pairmap_slot(&s->pmap, pkey(a, b));
    if (!e->key) {
        if (s->npairs == s->paircap)
            s->pairs = tr_xrealloc(s->pairs, (s->paircap = s->paircap ? 2 * s->paircap : 4096) * sizeof *s->pairs);
        s->pairs[s->npairs] = (struct pair){ .a = a, .b = b };
        *e = (struct pairent){ pkey(a, b), (uint32_t)s->npairs++ };
        s->pmap.used++;
    }
    return &s->pairs[e->v];
}

/* Count change for pair (a, b) in word w; a rise also records w for the queue. */
static void change(struct state *s, uint32_t a, uint32_t b, int delta, uint32_t w)
{
    struct pair *p = pair_of(s, a, b);
    p->count += delta * (int64_t)s->count[w];
    if (delta <= 0 || (p->npos && p->pos[p->npos - 1] == w))
        return;
    if (!p->npos) {
        if (s->ntouched == s->touchcap)
            s->touched = tr_xrealloc(s->touched, (s->touchcap = s->touchcap ? 2 * s->touchcap : 1024) * sizeof *s->touched);
        s->touched[s->ntouched++] = (uint32_t)(p - s->pairs);
    }
    if (p->npos == p->cap)
        p->pos = tr_xrealloc(p->pos, (p->cap = p->cap ? 2 * p->cap : 4) * sizeof *p->pos);
    p->pos[p->npos++] = w;
}

/* Max-heap order: higher count first, then the smaller pair (BpeTrainer's Merge ordering). */
static int before(const struct heap_entry *x, const struct heap_entry *y)
{
    if (x->count != y->count)
        return x->count > y->count;
    return x->a != y->a ? x->a < y->a : x->b < y->b;
}

static void heap_push(struct state *s, struct heap_entry e)
{
    if (s->nheap == s->heapcap)
        s->heap = tr_xrealloc(s->heap, (s->heapcap = s->heapcap ? 2 * s->heapcap : 4096) * sizeof *s->heap);
    size_t i = s->nheap++;
    while (i > 0 && before(&e, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
}

static struct heap_entry heap_pop(struct state *s)
{
    struct heap_entry top = s->heap[0], last = s->heap[--s->nheap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->nheap)
            break;
        if (c + 1 < s->nheap && before(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!before(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->nheap)
        s->heap[i] = last;
    return top;
}

/* The pairs given pos lists this round go into the queue with their current counts. */
static void push_touched(struct state *s)
{
    for (size_t k = 0; k < s->ntouched; k++) {
        struct pair *p = &s->pairs[s->touched[k]];
        if (p->count > 0)
            heap_push(s, (struct heap_entry){ (uint64_t)p->count, p->a, p->b, p->pos, p->npos });
        else
            free(p->pos);
        p->pos = NULL;
        p->npos = p->cap = 0;
    }
    s->ntouched = 0;
}

/* Word::merge: replace each (a, b), left to right, by id; the neighbours' pairs change. */
static void merge_word(struct state *s, uint32_t w, uint32_t a, uint32_t b, uint32_t id)
{
    uint32_t *v = s->sym + s->off[w];
    size_t n = s->len[w], j = 0;
    for (size_t r = 0; r < n;) {
        if (v[r] == a && r + 1 < n && v[r + 1] == b) {
            if (j > 0) {
                change(s, v[j - 1], a, -1, w);
                change(s, v[j - 1], id, +1, w);
            }
            if (r + 2 < n) {
                change(s, b, v[r + 2], -1, w);
                change(s, id, v[r + 2], +1, w);
            }
            v[j++] = id;
            r += 2;
        } else {
            v[j++] = v[r++];
        }
    }
    s->len[w] = (uint32_t)j;
}

static void put_json_string(char **buf, size_t *len, size_t *cap, const char *str)
{
    size_t n = strlen(str);
    if (*len + 6 * n + 8 > *cap)
        *buf = tr_xrealloc(*buf, *cap = 2 * (*cap + 6 * n + 8));
    char *o = *buf + *len;
    *o++ = '"';
    for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *o++ = '\\';
            *o++ = (char)*c;
        } else if (*c < 0x20) {
            o += sprintf(o, "\\u%04x", *c);
        } else {
            *o++ = (char)*c;
        }
    }
    *o++ = '"';
    *len = (size_t)(o - *buf);
}

static void put(char **buf, size_t *len, size_t *cap, const char *text)
{
    size_t n = strlen(text);
    if (*len + n + 1 > *cap)
        *buf = tr_xrealloc(*buf, *cap = 2 * (*cap + n + 1));
    memcpy(*buf + *len, text, n + 1);
    *len += n;
}

/* The tokenizer.json, laid out as the library saves one (merges as pairs, which also hold
 * tokens with spaces; decoder ByteLevel; no post-processor: EOS between documents is the
 * data pipeline's). */
static char *write_json(const struct state *s, size_t nspecials, size_t *out_len)
{
    size_t len = 0, cap = 1 << 16;
    char *buf = tr_xcalloc(cap, 1);
    char num[64];
    put(&buf, &len, &cap, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
                          "  \"added_tokens\": [");
    for (size_t i = 0; i < nspecials; i++) {
        snprintf(num, sizeof num, "%s\n    {\"id\": %zu, \"content\": ", i ? "," : "", i);
        put(&buf, &len, &cap, num);
        put_json_string(&buf, &len, &cap, s->tok[i]);
        put(&buf, &len, &cap, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                              "\"normalized\": false, \"special\": true}");
    }
    put(&buf, &len, &cap, nspecials ? "\n  ],\n" : "],\n");
    put(&buf, &len, &cap,
        "  \"normalizer\": null,\n"
        "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
        "\"use_regex\": true},\n"
        "  \"post_processor\": null,\n"
        "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
        "\"use_regex\": true},\n"
        "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
        "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
        "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
        "    \"vocab\": {");
    for (size_t i = 0; i < s->ntok; i++) {
        put(&buf, &len, &cap, i ? ",\n      " : "\n      ");
        put_json_string(&buf, &len, &cap, s->tok[i]);
        snprintf(num, sizeof num, ": %zu", i);
        put(&buf, &len, &cap, num);
    }
    put(&buf, &len, &cap, "\n    },\n    \"merges\": [");
    /* a pair merged twice (see the top comment) is written once, at its last rank, as the
     * library's model keeps it */
    struct pairmap last = { 0 };
    for (size_t i = 0; i < s->nmerges; i++) {
        struct pairent *e = pairmap_slot(&last, pkey(s->merges[i][0], s->merges[i][1]));
        last.used += !e->key;
        *e = (struct pairent){ pkey(s->merges[i][0], s->merges[i][1]), (uint32_t)i };
    }
    int first = 1;
    for (size_t i = 0; i < s->nmerges; i++) {
        struct pairent *e = pairmap_slot(&last, pkey(s->merges[i][0], s->merges[i][1]));
        if (e->v != i)
            continue;
        put(&buf, &len, &cap, first ? "\n      [" : ",\n      [");
        first = 0;
        put_json_string(&buf, &len, &cap, s->tok[s->merges[i][0]]);
        put(&buf, &len, &cap, ", ");
        put_json_string(&buf, &len, &cap, s->tok[s->merges[i][1]]);
        put(&buf, &len, &cap, "]");
    }
    free(last.e);
    put(&buf, &len, &cap, first ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n");
    *out_len = len;
    return buf;
}

/* 1. The special tokens first (none empty, none twice)... */
static int add_specials(struct state *s, const char *const *specials, size_t nspecials, tr_err *err)
{
    for (size_t i = 0; i < nspecials; i++) {
        if (!specials[i] || !*specials[i])
            return tr_fail(err, "special token %zu is empty", i);
        struct strent *e = strmap_slot(&s->tokmap, specials[i], strlen(specials[i]));
        if (e->k)
            return tr_fail(err, "special token %s is given twice", specials[i]);
        add_token(s, tr_xstrdup(specials[i]));
    }
    return TR_OK;
}

/* ...then the 256 byte symbols, by code point; byte_id: each byte's id. */
static void add_bytes(struct state *s, uint32_t byte_id[256])
{
    unsigned order[256], cps[256];
    for (unsigned c = 0; c < 256; c++)
        cps[c] = byte_cp(c);
    for (unsigned c = 0; c < 256; c++) { /* insertion sort by code point */
        unsigned k = c;
        while (k > 0 && cps[order[k - 1]] > cps[c]) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = c;
    }
    for (unsigned k = 0; k < 256; k++) {
        char ch[5] = { 0 };
        tr_utf8_encode(cps[order[k]], ch);
        struct strent *e = strmap_slot(&s->tokmap, ch, strlen(ch));
        byte_id[order[k]] = e->k ? e->v /* a special token spelled like a byte symbol */
                                 : add_token(s, tr_xstrdup(ch));
    }
}

/* 2. The words as symbol lists, and the pairs in them. */
static void add_words(struct state *s, const struct tr_bpe_trainer *b, const uint32_t byte_id[256])
{
    size_t total = 0;
    for (size_t w = 0; w < b->n; w++)
        total += b->word_len[w];
    s->sym = tr_xcalloc(total ? total : 1, sizeof *s->sym);
    s->off = tr_xcalloc(b->n ? b->n : 1, sizeof *s->off);
    s->len = tr_xcalloc(b->n ? b->n : 1, sizeof *s->len);
    size_t at = 0;
    for (size_t w = 0; w < b->n; w++) {
        s->off[w] = at;
        s->len[w] = b->word_len[w];
        for (uint32_t i = 0; i < b->word_len[w]; i++)
            s->sym[at + i] = byte_id[(unsigned char)b->word[w][i]];
        for (uint32_t i = 0; i + 1 < b->word_len[w]; i++)
            change(s, s->sym[at + i], s->sym[at + i + 1], +1, (uint32_t)w);
        at += b->word_len[w];
    }
    push_touched(s);
}

/* 3. The merges: the most frequent pair first (a stale heap entry is pushed again with its
 * count now), until the vocabulary is full or no pair is frequent enough. */
static void merge_pairs(struct state *s, size_t vocab_size, uint64_t min_frequency)
{
    char *joined = NULL;
    size_t joined_cap = 0;
    while (s->ntok < vocab_size && s->nheap) {
        struct heap_entry top = heap_pop(s);
        struct pair *p = pair_of(s, top.a, top.b);
        if ((int64_t)top.count != p->count) {
            top.count = p->count > 0 ? (uint64_t)p->count : 0;
            heap_push(s, top);
            continue;
        }
        if (top.count < 1 || top.count < min_frequency) {
            free(top.pos);
            break;
        }
        size_t na = strlen(s->tok[top.a]), nb = strlen(s->tok[top.b]);
        if (na + nb + 1 > joined_cap)
            joined = tr_xrealloc(joined, joined_cap = 2 * (na + nb + 1));
        memcpy(joined, s->tok[top.a], na);
        memcpy(joined + na, s->tok[top.b], nb + 1);
        struct strent *e = strmap_slot(&s->tokmap, joined, na + nb);
        uint32_t id = e->k ? e->v : add_token(s, tr_xstrdup(joined));
        if (s->nmerges == s->mergecap)
            s->merges = tr_xrealloc(s->merges, (s->mergecap = s->mergecap ? 2 * s->mergecap : 1024) * sizeof *s->merges);
        s->merges[s->nmerges][0] = top.a;
        s->merges[s->nmerges][1] = top.b;
        s->merges[s->nmerges][2] = id;
        s->nmerges++;
        for (size_t k = 0; k < top.npos; k++)
            merge_word(s, top.pos[k], top.a, top.b, id);
        free(top.pos);
        push_touched(s);
    }
    free(joined);
}

static void state_free(struct state *s)
{
    for (size_t i = 0; i < s->ntok; i++)
        free(s->tok[i]);
    free(s->tok);
    free(s->tokmap.e);
    free(s->sym);
    free(s->off);
    free(s->len);
    for (size_t i = 0; i < s->npairs; i++)
        free(s->pairs[i].pos);
    free(s->pairs);
    free(s->pmap.e);
    free(s->touched);
    for (size_t i = 0; i < s->nheap; i++)
        free(s->heap[i].pos);
    free(s->heap);
    free(s->merges);
}

int tr_bpe_trainer_train(struct tr_bpe_trainer *b, size_t vocab_size, uint64_t min_frequency,
                         const char *const *specials, size_t nspecials, char **json, size_t *len,
                         struct tr_bpe_stats *stats, tr_err *err)
{
    *json = NULL;
    *len = 0;
    if (vocab_size < nspecials + 256 || vocab_size > TR_BPE_MAX_VOCAB)
        return tr_fail(err, "a byte-level BPE vocabulary of %zu is out of range: it needs at least "
                       "%zu entries (%zu special token%s and the 256 bytes) and at most %d",
                       vocab_size, nspecials + 256, nspecials, nspecials == 1 ? "" : "s",
                       TR_BPE_MAX_VOCAB);
    struct state s = { .count = b->count };
    int rc = add_specials(&s, specials, nspecials, err);
    if (rc == TR_OK) {
        uint32_t byte_id[256];
        add_bytes(&s, byte_id);
        add_words(&s, b, byte_id);
        merge_pairs(&s, vocab_size, min_frequency);
        *json = write_json(&s, nspecials, len);
        if (stats)
            *stats = (struct tr_bpe_stats){ b->documents, b->bytes, b->total_words, b->n, s.nmerges, s.ntok };
    }
    state_free(&s);
    return rc;
}
