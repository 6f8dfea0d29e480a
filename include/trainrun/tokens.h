/*
 * trainrun's token shard format ("TRTOKENS"), written by `trainrun prepare`
 * and the text source's cache, read by the tokens data source.  Include it
 * to write shards from your own pipeline.
 *
 *   byte  0  magic "TRTOKENS"            byte 16  u64 number of tokens
 *   byte  8  u32 version (1)             byte 24  u32 vocabulary size (0: unknown)
 *   byte 12  u32 bytes per token (2, 4)  bytes 28..63  zero
 *
 * All little-endian; the tokens follow the 64-byte header.
 */
#ifndef TRAINRUN_TOKENS_H
#define TRAINRUN_TOKENS_H

#include <stdint.h>
#include <string.h>

#define TR_TOKENS_MAGIC "TRTOKENS"
#define TR_TOKENS_HEADER_BYTES 64
#define TR_TOKENS_VERSION 1
/* where each field starts, for error messages that name a byte offset */
#define TR_TOKENS_AT_VERSION 8
#define TR_TOKENS_AT_DTYPE 12
#define TR_TOKENS_AT_COUNT 16
#define TR_TOKENS_AT_VOCAB 24

struct tr_tokens_header {
    uint32_t version;     /* TR_TOKENS_VERSION */
    uint32_t token_bytes; /* 2 (uint16) or 4 (uint32) */
    uint64_t count;       /* tokens after the header */
    uint32_t vocab;       /* 0: unknown */
};

static inline void tr_tokens_header_write(unsigned char out[TR_TOKENS_HEADER_BYTES],
                                          const struct tr_tokens_header *h)
{
    memset(out, 0, TR_TOKENS_HEADER_BYTES);
    memcpy(out, TR_TOKENS_MAGIC, 8);
    for (int i = 0; i < 4; i++) {
        out[TR_TOKENS_AT_VERSION + i] = (unsigned char)(h->version >> (8 * i));
        out[TR_TOKENS_AT_DTYPE + i] = (unsigned char)(h->token_bytes >> (8 * i));
        out[TR_TOKENS_AT_VOCAB + i] = (unsigned char)(h->vocab >> (8 * i));
    }
    for (int i = 0; i < 8; i++)
        out[TR_TOKENS_AT_COUNT + i] = (unsigned char)(h->count >> (8 * i));
}

/* Decode a header of at least TR_TOKENS_HEADER_BYTES; returns 0 when the
 * magic is right, -1 when it is not (the fields are then meaningless).
 * Checking version, token_bytes and count against the file is the reader's. */
static inline int tr_tokens_header_read(const unsigned char *in, struct tr_tokens_header *h)
{
    uint32_t f[3] = {0, 0, 0};
    const int at[3] = {TR_TOKENS_AT_VERSION, TR_TOKENS_AT_DTYPE, TR_TOKENS_AT_VOCAB};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++)
            f[k] |= (uint32_t)in[at[k] + i] << (8 * i);
    h->version = f[0];
    h->token_bytes = f[1];
    h->vocab = f[2];
    h->count = 0;
    for (int i = 0; i < 8; i++)
        h->count |= (uint64_t)in[TR_TOKENS_AT_COUNT + i] << (8 * i);
    return memcmp(in, TR_TOKENS_MAGIC, 8) == 0 ? 0 : -1;
}

#endif
