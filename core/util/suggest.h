/* "did you mean": the closest candidate by edit distance, if close enough. */
#ifndef TR_SUGGEST_H
#define TR_SUGGEST_H
#include <stddef.h>

/* Levenshtein distance, with a transposition counted as one edit. */
size_t tr_edit_distance(const char *a, const char *b);

/* The candidate closest to `word` when at most max(1, strlen(word)/3) edits
 * away, else NULL.  `candidates` has n entries; NULL entries are skipped. */
const char *tr_suggest(const char *word, const char *const *candidates, size_t n);

#endif
