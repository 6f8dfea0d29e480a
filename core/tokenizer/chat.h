/* Chat templates, rendered as transformers' apply_chat_template renders them, for `prepare
 * --format instruct` (training records) and `sample --chat` (prompts).
 *
 * A tokenizer_config.json's chat_template is Jinja, and trainrun runs no Jinja: it recognises
 * the two families almost every chat model uses, reads from the template text what varies
 * between models of a family (a default system prompt, whether contents are trimmed, whether
 * bos_token is written), and renders them itself:
 *
 *   ChatML (SmolLM2, Qwen2: the template mentions <|im_start|>)
 *       [<|im_start|>system\n{default system prompt}<|im_end|>\n   when the first message is
 *                                                                  not a system one]
 *       <|im_start|>{role}\n{content}<|im_end|>\n                  for every message
 *       <|im_start|>assistant\n                                    the generation prompt
 *   Llama 3 (the template mentions <|start_header_id|>)
 *       {bos_token}<|start_header_id|>{role}<|end_header_id|>\n\n{content | trim}<|eot_id|>
 *       <|start_header_id|>assistant<|end_header_id|>\n\n          the generation prompt
 *   (Llama 3.1 and later templates, which always write a system turn with dates, are refused)
 *
 * The rendered text is tokenized as apply_chat_template(tokenize=True) does: the whole text at
 * once, special tokens written in it recognised, and none of the post-processor's added (a
 * ChatML template has no BOS; Llama 3's writes its own). */
#ifndef TR_CHAT_H
#define TR_CHAT_H

#include <stddef.h>
#include <stdint.h>
#include <trainrun/plugin.h>

struct tr_tokenizer;

enum tr_chat_family { TR_CHAT_NONE, TR_CHAT_CHATML, TR_CHAT_LLAMA3 };

struct tr_chat_template {
    enum tr_chat_family family;
    char *default_system;    /* ChatML: the system prompt put when the first message is not a
                              * system one; NULL when the template has none */
    char *bos;               /* text put before the first message (Llama 3's bos_token); NULL */
    int trim;                /* contents are trimmed (`| trim`), as Python's str.strip() */
    const char *opener;      /* the token a rendered conversation starts a turn with */
    const char *end_of_turn; /* the token ending each turn: where generation stops */
    char why[1200];          /* TR_CHAT_NONE: why ("... has no chat_template") */
};

struct tr_chat_message {
    const char *role, *content;
};

/* Read the chat template of a tokenizer_config.json's text (config_path names it in
 * messages; config NULL: there is none, and config_path names the tokenizer.json).  A
 * config without a template, or with one trainrun does not render, is family TR_CHAT_NONE
 * with `why` saying so, and TR_OK; TR_ERROR only for a config that is not JSON. */
int tr_chat_template_read(struct tr_chat_template *ct, const char *config, size_t len,
                          const char *config_path, tr_err *err);
void tr_chat_template_free(struct tr_chat_template *ct);
/* "chatml", "llama3", or NULL. */
const char *tr_chat_family_name(enum tr_chat_family f);

/* apply_chat_template(messages, tokenize=False, add_generation_prompt=gen): the text,
 * newly allocated and NUL-terminated in *text (free()), *len its bytes; with trained
 * non-NULL, one byte per text byte (free()): 1 for an assistant message's content and its
 * end-of-turn token, what training predicts.  TR_OK, or TR_ERROR for TR_CHAT_NONE. */
int tr_chat_render(const struct tr_chat_template *ct, const struct tr_chat_message *m, size_t n,
                   int gen, char **text, size_t *len, unsigned char **trained, tr_err *err);

/* The rendered text's token ids, as apply_chat_template(tokenize=True): newly allocated
 * in *ids; with trained_bytes (tr_chat_render's) non-NULL also *trained, one per id: 1 when
 * the token holds a trained byte.  Byte-level tokenizers give each token's bytes back, which
 * places the mask exactly; for others each run of equal mask bits is encoded on its own. */
int tr_chat_encode(struct tr_tokenizer *tok, const char *text, size_t len,
                   const unsigned char *trained_bytes, int32_t **ids, unsigned char **trained,
                   size_t *n, tr_err *err);

#endif
