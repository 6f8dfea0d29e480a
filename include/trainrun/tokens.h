/*
 * trainrun's token shard format ("TRTOKENS"), written by `trainrun prepare`
 * and the text source's cache, read by the tokens data source.  Include it
 * to write shards from your own pipeline.
 *
 *   byte  0  magic "TRTOKENS"            byte 16  u64 number of tokens
 *   byte  8  u32 version (1 or 2)        byte 24  u32 vocabulary size (0: unknown)
 *   byte 12  u32 bytes per token (2, 4)  byte 28  u32 flags (version 2; 0 in version 1)
 *                                        byte 32  u64 text bytes (0: unknown)
 *                                        bytes 40..63  zero
 *
 * All little-endian; the tokens follow the 64-byte header.
 *
 * Text bytes: how many bytes of text (UTF-8, document separators included)
 * the tokens encode, so a reader can report the loss per byte, which
 * compares across tokenizers.  Readers of either version that predate it
 * see zero padding there and ignore it.
 *
 * Version 2 adds flags.  TR_TOKENS_LOSS_MASK: after the tokens comes a loss
 * mask of ceil(count / 8) bytes; bit (i % 8) of byte i / 8 is 1 when token i
 * is trained on as a target (a response token of instruction data) and 0
 * when it is not (a prompt token: read as input, never predicted).  Writers
 * write version 1 when they have no flags to set, so every reader of
 * version 1 keeps reading them; a version 1 reader refuses version 2 rather
 * than train on masked tokens.
 */
#ifndef TRAINRUN_TOKENS_H
#define TRAINRUN_TOKENS_H

#include <stdint.h>
#include <string.h>

#define TR_TOKENS_MAGIC "TRTOKENS"
#define TR_TOKENS_HEADER_BYTES 64
#define TR_TOKENS_VERSION 1        /* no flags */
#define TR_TOKENS_VERSION_FLAGS 2  /* the flags word is meaningful */
#define TR_TOKENS_LOSS_MASK 1u     /* flag: a loss mask follows the tokens */
/* where each field starts, for error messages that name a byte offset */
#define TR_TOKENS_AT_VERSION 8
#define TR_TOKENS_AT_DTYPE 12
#define TR_TOKENS_AT_COUNT 16
#define TR_TOKENS_AT_VOCAB 24
#define TR_TOKENS_AT_FLAGS 28
#define TR_TOKENS_AT_TEXT_BYTES 32

struct tr_tokens_header {
    uint32_t version;     /* TR_TOKENS_VERSION */
    uint32_t token_bytes; /* 2 (uint16) or 4 (uint32) */
    uint64_t count;       /* tokens after the header */
    uint32_t vocab;       /* 0: unknown */
    uint32_t flags;       /* TR_TOKENS_LOSS_MASK; 0 in version 1 */
    uint64_t text_bytes;  /* bytes of text the tokens encode; 0: unknown */
};

/* Bytes of the loss mask that follows `count` tokens when TR_TOKENS_LOSS_MASK is set. */
static inline uint64_t tr_tokens_mask_bytes(uint64_t count)
{
    return count / 8 + (count % 8 != 0);
}

static inline void tr_tokens_header_write(unsigned char out[TR_TOKENS_HEADER_BYTES],
                                          const struct tr_tokens_header *h)
{
    memset(out, 0, TR_TOKENS_HEADER_BYTES);
    memcpy(out, TR_TOKENS_MAGIC, 8);
    for (int i = 0; i < 4; i++) {
        out[TR_TOKENS_AT_VERSION + i] = (unsigned char)(h->version >> (8 * i));
        out[TR_TOKENS_AT_DTYPE + i] = (unsigned char)(h->token_bytes >> (8 * i));
        out[TR_TOKENS_AT_VOCAB + i] = (unsigned char)(h->vocab >> (8 * i));
        out[TR_TOKENS_AT_FLAGS + i] = (unsigned char)(h->flags >> (8 * i));
    }
    for (int i = 0; i < 8; i++) {
        out[TR_TOKENS_AT_COUNT + i] = (unsigned char)(h->count >> (8 * i));
        out[TR_TOKENS_AT_TEXT_BYTES + i] = (unsigned char)(h->text_bytes >> (8 * i));
    }
}

/* Decode a header of at least TR_TOKENS_HEADER_BYTES; returns 0 when the
 * magic is right, -1 when it is not (the fields are then meaningless).
 * Checking version, token_bytes and count against the file is the reader's. */
static inline int tr_tokens_header_read(const unsigned char *in, struct tr_tokens_header *h)
{
    uint32_t f[4] = {0, 0, 0, 0};
    const int at[4] = {TR_TOKENS_AT_VERSION, TR_TOKENS_AT_DTYPE, TR_TOKENS_AT_VOCAB,
                       TR_TOKENS_AT_FLAGS};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++)
            f[k] |= (uint32_t)in[at[k] + i] << (8 * i);
    h->version = f[0];
    h->token_bytes = f[1];
    h->vocab = f[2];
    h->flags = f[3];
    h->count = 0;
    h->text_bytes = 0;
    for (int i = 0; i < 8; i++) {
        h->count |= (uint64_t)in[TR_TOKENS_AT_COUNT + i] << (8 * i);
        h->text_bytes |= (uint64_t)in[TR_TOKENS_AT_TEXT_BYTES + i] << (8 * i);
    }
    return memcmp(in, TR_TOKENS_MAGIC, 8) == 0 ? 0 : -1;
}

#endif
