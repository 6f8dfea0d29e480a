/* The BPE model of a tokenizer (step 4 of encode, see tokenizer.c): a word becomes symbols
 * (bytes for byte-level files, else characters, with byte fallback and the unknown token),
 * and the merges apply lowest rank first, leftmost first, with the library's priority
 * queue; words of up to CACHE_MAX_WORD bytes are cached, and long words on characters are
 * merged in chunks (tr_tokenizer.chunks). */
#include "tokenizer_internal.h"

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
    /* a symbol per byte and a pending unknown; byte-level byte fallback gives up to two
     * (the UTF-8 of a byte's character) */
    if (2 * n + 2 > t->sym_cap)
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
            /* byte-level: the library looks up the bytes of the byte's character (its UTF-8),
             * not the byte itself */
            const char *c = t->byte_level ? t->byte_char[(unsigned char)w[i]] : w + i;
            size_t nc = t->byte_level ? t->byte_char_len[(unsigned char)w[i]] : k;
            size_t j = 0;
            while (j < nc && t->fallback_id[(unsigned char)c[j]] >= 0)
                j++;
            if (j == nc) {
                for (j = 0; j < nc; j++)
                    s[m++].id = t->fallback_id[(unsigned char)c[j]];
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
int tr_tok_bpe_word(struct tr_tokenizer *t, const char *w, size_t n, struct out *o, tr_err *err)
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
