/* Training a byte-level BPE tokenizer on text, written as a Hugging Face tokenizer.json that
 * tokenizer.h and the `tokenizers` library both load (with identical ids).
 *
 * The same algorithm as the `tokenizers` library's BpeTrainer behind a ByteLevel
 * pre-tokenizer (GPT-2's regex, no prefix space) with the 256 byte symbols as initial
 * alphabet: the vocabulary starts with the special tokens, then the 256 byte symbols in the
 * order of their byte-level characters' code points; each step merges the adjacent pair of
 * symbols with the highest count over all words (word counts included), ties going to the
 * pair with the smaller ids (left id first, then right), until the vocabulary has the
 * requested size.  Pair counts are kept up to date incrementally: a merge touches only the
 * words that hold the pair.  Given the same documents, the library makes the same merges.
 *
 * Usage: tr_bpe_trainer_new, tr_bpe_trainer_feed for each document (not thread-safe),
 * tr_bpe_trainer_train, tr_bpe_trainer_free. */
#ifndef TR_BPE_TRAIN_H
#define TR_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <trainrun/plugin.h>

#define TR_BPE_EOS "<|endoftext|>"
#define TR_BPE_MAX_VOCAB (1 << 24) /* tokenizer.c refuses larger ids */

struct tr_bpe_trainer;

struct tr_bpe_stats {
    uint64_t documents, bytes, words; /* fed */
    size_t unique_words, merges;
    size_t vocab;                     /* entries written (can stay below the request when
                                       * no pair is left to merge) */
};

/* A trainer with GPT-2's byte-level pre-tokenizer; NULL with err on failure. */
struct tr_bpe_trainer *tr_bpe_trainer_new(tr_err *err);
void tr_bpe_trainer_free(struct tr_bpe_trainer *b);

/* Count the words of one document (UTF-8; the pre-tokenizer runs within it, as the library's
 * train_from_iterator runs it on each item).  TR_OK, or TR_ERROR when it is not UTF-8. */
int tr_bpe_trainer_feed(struct tr_bpe_trainer *b, const char *text, size_t len, tr_err *err);

/* Train a vocabulary of vocab_size entries: the special tokens (ids 0.., in order; NULL/0
 * for none), the 256 byte symbols, then merges; pairs seen fewer than min_frequency times
 * are not merged (0 or 1: any pair seen).  *json gets the tokenizer.json text (free()), *len
 * its length.  vocab_size below nspecials + 256 or above TR_BPE_MAX_VOCAB is refused. */
int tr_bpe_trainer_train(struct tr_bpe_trainer *b, size_t vocab_size, uint64_t min_frequency,
                         const char *const *specials, size_t nspecials, char **json, size_t *len,
                         struct tr_bpe_stats *stats, tr_err *err);

#endif
