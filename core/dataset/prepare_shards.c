/*
 * TRTOKENS shards for `trainrun prepare` (see prepare_internal.h and
 * include/trainrun/tokens.h): tokens are buffered and written as they come;
 * the header, which holds the count and the text bytes, is written again
 * when the shard is finished, and the loss mask (kept in memory, one bit a
 * token) is appended then.  A shard lives under PATH.tmp-PID until it is
 * finished, fsynced and renamed, so no reader sees a partial shard.
 */
#include "dataset.h"

#include "prepare_internal.h"

#include <trainrun/tokens.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct tr_shard_writer {
    const char *dir, *prefix; /* OUTDIR, "train" or "val" */
    uint64_t limit;           /* tokens per shard */
    uint32_t vocab;
    int token_bytes;          /* 2 or 4 */
    int with_mask;
    FILE *f;
    char path[4096], tmp[4200];
    int shards;               /* finished so far */
    uint64_t in_shard, total;
    uint64_t shard_text, text; /* text bytes: of the open shard, of all */
    uint64_t pending_text;     /* added before the first token of a shard */
    unsigned char *mask;       /* the open shard's loss mask, grown as tokens come */
    size_t mask_cap;
    size_t fill;
    unsigned char buf[1 << 16];
};

struct tr_shard_writer *tr_shard_writer_open(const char *dir, const char *prefix,
                                             uint64_t shard_tokens, uint32_t vocab,
                                             int with_mask)
{
    if (vocab == 0 || shard_tokens == 0) {
        tr_prepare_fail("internal: a shard writer needs a vocabulary and a shard size");
        return NULL;
    }
    struct tr_shard_writer *w = calloc(1, sizeof *w);
    if (!w) {
        tr_prepare_fail("out of memory");
        return NULL;
    }
    w->dir = dir;
    w->prefix = prefix;
    w->limit = shard_tokens;
    w->vocab = vocab;
    w->token_bytes = vocab <= 65536 ? 2 : 4;
    w->with_mask = with_mask;
    return w;
}

static void header(const struct tr_shard_writer *w, unsigned char h[TR_TOKENS_HEADER_BYTES])
{
    struct tr_tokens_header th = {
        .version = w->with_mask ? TR_TOKENS_VERSION_FLAGS : TR_TOKENS_VERSION,
        .token_bytes = (uint32_t)w->token_bytes,
        .count = w->in_shard,
        .vocab = w->vocab,
        .flags = w->with_mask ? TR_TOKENS_LOSS_MASK : 0,
        .text_bytes = w->shard_text,
    };
    tr_tokens_header_write(h, &th);
}

static int flush_buf(struct tr_shard_writer *w)
{
    if (w->fill && fwrite(w->buf, 1, w->fill, w->f) != w->fill)
        return tr_prepare_fail("cannot write %s: %s", w->path, strerror(errno));
    w->fill = 0;
    return 0;
}

static int open_shard(struct tr_shard_writer *w)
{
    snprintf(w->path, sizeof w->path, "%s/%s_%06d.bin", w->dir, w->prefix, w->shards);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp-%ld", w->path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f)
        return tr_prepare_fail("cannot create %s: %s", w->tmp, strerror(errno));
    w->in_shard = 0;
    w->shard_text = w->pending_text;
    w->pending_text = 0;
    unsigned char h[TR_TOKENS_HEADER_BYTES];
    header(w, h); /* rewritten with the counts when the shard is finished */
    if (fwrite(h, 1, sizeof h, w->f) != sizeof h)
        return tr_prepare_fail("cannot write %s: %s", w->path, strerror(errno));
    return 0;
}

/* Finish the open shard: the mask after the tokens, the header with the
 * counts, fsync, rename. */
static int close_shard(struct tr_shard_writer *w)
{
    if (!w->f)
        return 0;
    unsigned char h[TR_TOKENS_HEADER_BYTES];
    header(w, h);
    int rc = flush_buf(w);
    if (rc == 0 && w->with_mask) {
        size_t bytes = (size_t)tr_tokens_mask_bytes(w->in_shard);
        if (fwrite(w->mask, 1, bytes, w->f) != bytes)
            rc = tr_prepare_fail("cannot write %s: %s", w->path, strerror(errno));
        memset(w->mask, 0, bytes);
    }
    if (rc == 0 && (fseek(w->f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, w->f) != sizeof h ||
                    fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        rc = tr_prepare_fail("cannot write %s: %s", w->path, strerror(errno));
    if (fclose(w->f) != 0 && rc == 0)
        rc = tr_prepare_fail("cannot write %s: %s", w->path, strerror(errno));
    w->f = NULL;
    if (rc == 0 && rename(w->tmp, w->path) != 0)
        rc = tr_prepare_fail("cannot rename %s to %s: %s", w->tmp, w->path, strerror(errno));
    if (rc != 0) {
        unlink(w->tmp);
        return rc;
    }
    w->shards++;
    return 0;
}

int tr_shard_writer_put(struct tr_shard_writer *w, uint32_t id, int trained)
{
    if (id >= w->vocab)
        return tr_prepare_fail("internal: token id %u is outside the vocabulary of %u", id,
                               w->vocab);
    if (w->f && w->in_shard == w->limit && close_shard(w) != 0)
        return -1;
    if (!w->f && open_shard(w) != 0)
        return -1;
    if (w->fill + 4 > sizeof w->buf && flush_buf(w) != 0)
        return -1;
    for (int i = 0; i < w->token_bytes; i++)
        w->buf[w->fill++] = (unsigned char)(id >> (8 * i));
    if (w->with_mask) {
        size_t byte = (size_t)(w->in_shard / 8);
        if (byte >= w->mask_cap) {
            size_t cap = w->mask_cap ? w->mask_cap * 2 : 4096;
            unsigned char *grown = realloc(w->mask, cap);
            if (!grown)
                return tr_prepare_fail("out of memory for the loss mask of %s", w->path);
            memset(grown + w->mask_cap, 0, cap - w->mask_cap);
            w->mask = grown;
            w->mask_cap = cap;
        }
        if (trained)
            w->mask[byte] |= (unsigned char)(1u << (w->in_shard % 8));
    }
    w->in_shard++;
    w->total++;
    return 0;
}

void tr_shard_writer_add_text_bytes(struct tr_shard_writer *w, uint64_t n)
{
    if (w->f)
        w->shard_text += n;
    else
        w->pending_text += n;
    w->text += n;
}

int tr_shard_writer_finish(struct tr_shard_writer *w)
{
    return close_shard(w);
}

void tr_shard_writer_free(struct tr_shard_writer *w)
{
    if (!w)
        return;
    if (w->f) {
        fclose(w->f);
        unlink(w->tmp);
    }
    free(w->mask);
    free(w);
}

int tr_shard_writer_shards(const struct tr_shard_writer *w)
{
    return w->shards;
}

uint64_t tr_shard_writer_tokens(const struct tr_shard_writer *w)
{
    return w->total;
}

uint64_t tr_shard_writer_text_bytes(const struct tr_shard_writer *w)
{
    return w->text;
}

int tr_shard_writer_token_bytes(const struct tr_shard_writer *w)
{
    return w->token_bytes;
}
