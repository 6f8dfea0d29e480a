/*
 * Deduplication for `trainrun prepare` (see dedup.h).
 *
 * It works on a normalised view of a document (ASCII letters lowercased,
 * runs of whitespace made one space, ends trimmed):
 *   exact: documents with the same normalised text; the later ones go.
 *   near:  exact, then MinHash over character 5-grams of the normalised text
 *          (64 hash functions) with LSH banding to find candidates; a later
 *          document whose estimated Jaccard similarity with a kept one is at
 *          least the threshold goes.
 * Documents are only marked (removed, dup_of, similarity): prepare_text.c reports
 * them and leaves them out of the shards.
 */
#include "dedup.h"
#include "dataset.h"

#include "../util/util.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* The normalised view of a document, one byte at a time: ASCII lowercased,
 * each run of whitespace one space, none at either end. */
struct norm {
    const unsigned char *p, *end;
};

static struct norm norm_begin(const struct doc *doc)
{
    struct norm n = {doc->text, doc->text + doc->len};
    while (n.p < n.end && is_space(*n.p))
        n.p++;
    return n;
}

static int norm_next(struct norm *n)
{
    if (n->p == n->end)
        return -1;
    if (is_space(*n->p)) {
        while (n->p < n->end && is_space(*n->p))
            n->p++;
        return n->p == n->end ? -1 : ' ';
    }
    return tolower(*n->p++);
}

static uint64_t norm_hash(const struct doc *doc)
{
    struct norm n = norm_begin(doc);
    uint64_t h = FNV_OFFSET;
    for (int c; (c = norm_next(&n)) >= 0;)
        h = (h ^ (unsigned)c) * 0x100000001b3ULL;
    return h;
}

static int norm_equal(const struct doc *a, const struct doc *b)
{
    struct norm x = norm_begin(a), y = norm_begin(b);
    for (;;) {
        int c = norm_next(&x), d = norm_next(&y);
        if (c != d)
            return 0;
        if (c < 0)
            return 1;
    }
}

/* Exact: an open-addressing table of kept documents by normalised hash;
 * equal hashes are compared byte by byte, so a collision never drops a
 * document. */
int dedup_exact(struct docs *d, size_t *removed)
{
    size_t size = table_size_for(d->n), mask = size - 1;
    size_t *slots = calloc(size, sizeof *slots); /* document index + 1; 0: empty */
    uint64_t *hashes = malloc((d->n ? d->n : 1) * sizeof *hashes);
    if (!slots || !hashes) {
        free(slots);
        free(hashes);
        return tr_prepare_fail("out of memory deduplicating %zu documents", d->n);
    }
    *removed = 0;
    for (size_t i = 0; i < d->n; i++) {
        hashes[i] = norm_hash(&d->v[i]);
        size_t s = (size_t)tr_mix64(hashes[i]) & mask;
        for (; slots[s]; s = (s + 1) & mask) {
            size_t j = slots[s] - 1;
            if (hashes[j] == hashes[i] && norm_equal(&d->v[j], &d->v[i])) {
                d->v[i].removed = EXACT_DUP;
                d->v[i].dup_of = j;
                d->v[i].similarity = 1;
                (*removed)++;
                break;
            }
        }
        if (!d->v[i].removed)
            slots[s] = i + 1;
    }
    free(slots);
    free(hashes);
    return 0;
}

/* MinHash signature of a document's normalised 5-grams: for each of the
 * hash functions h_k(x) = a_k x + b_k (x the mixed hash of a 5-gram, a_k
 * odd), the high 32 bits of the smallest value. */
static void minhash(const struct doc *doc, unsigned char *buf, const uint64_t *a,
                    const uint64_t *b, uint32_t *sig)
{
    struct norm n = norm_begin(doc);
    size_t len = 0;
    for (int c; (c = norm_next(&n)) >= 0;)
        buf[len++] = (unsigned char)c;
    uint64_t mins[MINHASH_FUNCS];
    for (int k = 0; k < MINHASH_FUNCS; k++)
        mins[k] = UINT64_MAX;
    size_t shingles = len >= SHINGLE ? len - SHINGLE + 1 : 1;
    size_t width = len >= SHINGLE ? SHINGLE : len;
    for (size_t i = 0; i < shingles; i++) {
        uint64_t x = tr_mix64(fnv1a(FNV_OFFSET, buf + i, width));
        for (int k = 0; k < MINHASH_FUNCS; k++) {
            uint64_t h = x * a[k] + b[k];
            if (h < mins[k])
                mins[k] = h;
        }
    }
    for (int k = 0; k < MINHASH_FUNCS; k++)
        sig[k] = (uint32_t)(mins[k] >> 32);
}

/* Rows per LSH band: the most (fewest candidates to check) that still make
 * a pair at the threshold a candidate with probability >= 0.99, i.e.
 * 1 - (1 - t^rows)^bands >= 0.99. */
int band_rows(double threshold)
{
    static const int choices[] = {8, 4, 2};
    for (size_t i = 0; i < TR_ARRAY_LEN(choices); i++) {
        int rows = choices[i], bands = MINHASH_FUNCS / rows;
        if (1 - pow(1 - pow(threshold, rows), bands) >= 0.99)
            return rows;
    }
    return 1;
}

struct bucket_entry {
    uint64_t key;
    size_t doc_plus_one; /* 0: empty */
};

int dedup_near(struct docs *d, double threshold, int rows, size_t *removed)
{
    int bands = MINHASH_FUNCS / rows;
    size_t longest = 1, kept = 0;
    for (size_t i = 0; i < d->n; i++) {
        if (d->v[i].len > longest)
            longest = d->v[i].len;
        kept += !d->v[i].removed;
    }
    size_t size = table_size_for(kept * (size_t)bands), mask = size - 1;
    struct bucket_entry *table = calloc(size, sizeof *table);
    uint32_t *sigs = malloc((d->n ? d->n : 1) * MINHASH_FUNCS * sizeof *sigs);
    unsigned char *buf = malloc(longest);
    if (!table || !sigs || !buf) {
        free(table);
        free(sigs);
        free(buf);
        return tr_prepare_fail("out of memory for near deduplication of %zu documents", kept);
    }

    /* Fixed coefficients: the same input always gives the same result. */
    uint64_t a[MINHASH_FUNCS], b[MINHASH_FUNCS];
    for (int k = 0; k < MINHASH_FUNCS; k++) {
        a[k] = tr_mix64(0x9e3779b97f4a7c15ULL * (uint64_t)(2 * k + 1)) | 1;
        b[k] = tr_mix64(0x632be59bd9b4e019ULL * (uint64_t)(2 * k + 2));
    }

    *removed = 0;
    for (size_t i = 0; i < d->n; i++) {
        struct doc *doc = &d->v[i];
        if (doc->removed)
            continue;
        uint32_t *sig = sigs + i * MINHASH_FUNCS;
        minhash(doc, buf, a, b, sig);
        uint64_t keys[MINHASH_FUNCS];
        double best = -1;
        size_t best_doc = 0;
        for (int band = 0; band < bands; band++) {
            uint64_t key = tr_mix64((uint64_t)band + 1);
            for (int r = 0; r < rows; r++)
                key = tr_mix64(key ^ sig[band * rows + r]);
            keys[band] = key;
            for (size_t s = (size_t)key & mask; table[s].doc_plus_one; s = (s + 1) & mask) {
                if (table[s].key != key)
                    continue;
                size_t j = table[s].doc_plus_one - 1;
                const uint32_t *other = sigs + j * MINHASH_FUNCS;
                int same = 0;
                for (int k = 0; k < MINHASH_FUNCS; k++)
                    same += sig[k] == other[k];
                double similarity = (double)same / MINHASH_FUNCS;
                if (similarity > best) {
                    best = similarity;
                    best_doc = j;
                }
            }
        }
        if (best >= threshold) {
            doc->removed = NEAR_DUP;
            doc->dup_of = best_doc;
            doc->similarity = best;
            (*removed)++;
            continue;
        }
        for (int band = 0; band < bands; band++) {
            size_t s = (size_t)keys[band] & mask;
            while (table[s].doc_plus_one)
                s = (s + 1) & mask;
            table[s] = (struct bucket_entry){keys[band], i + 1};
        }
    }
    free(table);
    free(sigs);
    free(buf);
    return 0;
}
