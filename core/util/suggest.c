#include "suggest.h"

#include <stdlib.h>
#include <string.h>

size_t tr_edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    /* three rows: previous-previous (for transpositions), previous, current */
    size_t *rows = malloc(3 * (m + 1) * sizeof *rows);
    if (!rows)
        return (size_t)-1;
    size_t *pp = rows, *p = rows + (m + 1), *c = rows + 2 * (m + 1);
    for (size_t j = 0; j <= m; j++)
        p[j] = j;
    for (size_t i = 1; i <= n; i++) {
        c[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = p[j] + 1;
            if (c[j - 1] + 1 < best)
                best = c[j - 1] + 1;
            if (p[j - 1] + cost < best)
                best = p[j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < best)
                best = pp[j - 2] + 1;
            c[j] = best;
        }
        size_t *t = pp;
        pp = p;
        p = c;
        c = t;
    }
    size_t d = p[m];
    free(rows);
    return d;
}

const char *tr_suggest(const char *word, const char *const *candidates, size_t n)
{
    size_t limit = strlen(word) / 3;
    if (limit < 1)
        limit = 1;
    const char *best = NULL;
    size_t best_d = limit + 1;
    for (size_t i = 0; i < n; i++) {
        if (!candidates[i])
            continue;
        size_t d = tr_edit_distance(word, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    return best;
}
