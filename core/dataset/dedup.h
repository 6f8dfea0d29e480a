/* Deduplication for `trainrun prepare` (dedup.c): documents, and the
 * exact and near (MinHash with LSH banding) passes that mark the later of
 * two duplicates as removed. Private to the dataset room. */
#ifndef TR_DEDUP_H
#define TR_DEDUP_H

#include <stddef.h>
#include <stdint.h>

#define MINHASH_FUNCS 64
#define SHINGLE 5 /* bytes per shingle of the normalised text */

/* ---- hashing, shared with prepare's csv row deduplication ---------------- */

static inline uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

#define FNV_OFFSET 0xcbf29ce484222325ULL

static inline size_t table_size_for(size_t n)
{
    size_t size = 1024;
    while (size < 2 * n)
        size *= 2;
    return size;
}

/* ---- documents ------------------------------------------------------------ */

/* The whitespace of a document's normalised view (and of its splitting). */
static inline int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

enum removal { KEPT = 0, EXACT_DUP, NEAR_DUP };

struct doc {
    const unsigned char *text;
    size_t len;
    int input;         /* index into the inputs */
    long line;         /* first line, from 1 */
    enum removal removed;
    size_t dup_of;     /* the kept document it duplicates */
    double similarity; /* near: the estimated Jaccard similarity */
};

struct docs {
    struct doc *v;
    size_t n, cap;
};

/* Exact: mark each document whose normalised text (ASCII letters
 * lowercased, runs of whitespace one space, ends trimmed) equals an earlier
 * kept one's as EXACT_DUP of it. *removed counts them. -1 (message on
 * stderr) when out of memory. */
int dedup_exact(struct docs *d, size_t *removed);

/* Rows per LSH band for a similarity threshold (see dedup.c). */
int band_rows(double threshold);

/* Near: among the documents not yet removed, mark each whose estimated
 * Jaccard similarity (MinHash over SHINGLE-grams of the normalised text,
 * MINHASH_FUNCS functions, bands of `rows`) with a kept one is at least
 * threshold as NEAR_DUP of the most similar. -1 when out of memory. */
int dedup_near(struct docs *d, double threshold, int rows, size_t *removed);

#endif
