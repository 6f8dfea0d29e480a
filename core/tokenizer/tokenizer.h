/* Tokenizers read from a Hugging Face tokenizer.json: BPE, byte-level (GPT-2, Llama 3, Qwen,
 * SmolLM style) or on characters with <0xNN> byte fallback (SentencePiece style: Llama 2,
 * Mistral), with the file's normalizers, pre-tokenizer, post-processor and decoder.  Ids
 * and decodes agree with the `tokenizers` library for the same file (docs/tokenizers.md);
 * anything else is refused with a "not supported yet: ..." error naming it and the file. */
#ifndef TR_TOKENIZER_H
#define TR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <trainrun/plugin.h>

struct tr_tokenizer;

/* Load a tokenizer.json; NULL with err filled on any problem (the file is untrusted). */
struct tr_tokenizer *tr_tokenizer_load(const char *path, tr_err *err);
/* The same from text[0..len); name is used in messages. */
struct tr_tokenizer *tr_tokenizer_parse(const char *text, size_t len, const char *name, tr_err *err);
void tr_tokenizer_free(struct tr_tokenizer *t);

/* One more than the largest id. */
size_t tr_tokenizer_vocab_size(const struct tr_tokenizer *t);
/* The id of the token whose text is exactly `text` (an added/special token such as
 * "<|endoftext|>" first, then the vocabulary's decoded bytes), or -1. */
int32_t tr_tokenizer_token_id(const struct tr_tokenizer *t, const char *text);

/* text (UTF-8) -> ids, newly allocated in *ids (free()), without a BOS/EOS template;
 * special tokens written in the text are recognised.  TR_OK or TR_ERROR. */
int tr_tokenizer_encode(struct tr_tokenizer *t, const char *text, size_t len, int32_t **ids,
                        size_t *n, tr_err *err);
/* Where text[0..len) has the first character the tokenizer cannot represent: one its
 * vocabulary lacks (after the file's normalizers) without <0xNN> byte fallback for it, which
 * encode gives as the unknown token or, without one, drops; in a byte-level file, a character
 * with a byte its alphabet lacks.  *at is the character's byte offset in text, len when every
 * character is represented.  What the normalizers change or remove is no loss (the model was
 * trained on their output), nor is a decoder that does not give the text back byte for byte.
 * Costs one encode, and about log2(len) more of prefixes when there is such a character.
 * TR_OK or TR_ERROR (text that is not UTF-8). */
int tr_tokenizer_unknown_at(struct tr_tokenizer *t, const char *text, size_t len, size_t *at,
                            tr_err *err);
/* The post-processor's special tokens: BOS is the first id its template puts before the
 * text ($A), EOS the last id it puts after; -1 when the file has no
 * post-processor or it adds none there. */
int32_t tr_tokenizer_bos_id(const struct tr_tokenizer *t);
int32_t tr_tokenizer_eos_id(const struct tr_tokenizer *t);
/* Like tr_tokenizer_encode, plus the post-processor's special tokens around the text
 * (TemplateProcessing's single template, RobertaProcessing's / BertProcessing's cls and
 * sep) when add_special is nonzero, as `encode(text, add_special_tokens=True)`. */
int tr_tokenizer_encode_ex(struct tr_tokenizer *t, const char *text, size_t len, int add_special,
                           int32_t **ids, size_t *n, tr_err *err);
/* The pre-tokenizer alone, for training a BPE (bpe_train.h): word(ctx, bytes, n) for each
 * piece the file's pre-tokenizer chain cuts text into, in order, as encode would merge them;
 * special tokens written in the text are cut out and not passed.  TR_OK or TR_ERROR. */
int tr_tokenizer_pretokenize(struct tr_tokenizer *t, const char *text, size_t len,
                             void (*word)(void *ctx, const char *w, size_t n), void *ctx,
                             tr_err *err);
/* ids -> text, newly allocated and NUL-terminated in *out (free()); special tokens kept, as
 * `decode(ids, skip_special_tokens=False)`.  Byte-level files give each id's bytes,
 * concatenated (so a prefix of the ids gives a prefix of the bytes); the others run the
 * file's decoder over the whole sequence, which may differ from decoding piece by piece
 * (Llama 2's strips one leading space of the whole text). */
int tr_tokenizer_decode(const struct tr_tokenizer *t, const int32_t *ids, size_t n, char **out,
                        size_t *len, tr_err *err);

/* For printing tokens as they come: the text ids[n-1] adds after ids[0..n-1), newly
 * allocated and NUL-terminated in *out (free()).  Concatenated, these pieces are
 * decode(ids[0..n)), except that <0xNN> byte tokens that do not (yet) form valid UTF-8 are
 * given as their bytes rather than as U+FFFD (the next pieces complete the character).
 * Byte-level files: ids[n-1]'s bytes; others decode the prefix (O(n) per call). */
int tr_tokenizer_decode_next(const struct tr_tokenizer *t, const int32_t *ids, size_t n, char **out,
                             size_t *len, tr_err *err);

#endif
