/*
 * data = { plugin = "tokens", train = "data/train_*.bin" }: pre-tokenised
 * shards, memory-mapped, for language models.
 *
 * Two shard formats are read, told apart by their first bytes:
 *
 *   trainrun's own ("TRTOKENS"), a 64-byte little-endian header
 *       0  magic "TRTOKENS"        24  u32 vocabulary size (0: unknown)
 *       8  u32 version (1 or 2)    28  u32 flags (version 2), then zero
 *      12  u32 token dtype (2 = uint16, 4 = uint32)   padding to byte 64
 *      16  u64 token count
 *   then the tokens, little-endian, and with the flag TR_TOKENS_LOSS_MASK
 *   a loss mask of one bit per token (include/trainrun/tokens.h).  A
 *   target whose mask bit is 0 (a prompt token of instruction data) is
 *   read as -1, the index the cross-entropy ignores: it stays an input but
 *   is never predicted.  Shards without a mask train on every target, so
 *   masked and unmasked shards mix in one split;
 *
 *   llm.c's shard format: 256 int32 (1024 bytes), header[0] = 20240520,
 *   header[1] = 1 (uint16 tokens), header[2] = token count; then the tokens.
 *
 * A split is a list of segments (a shard, or part of one when the
 * validation tokens are cut from the end of the training shards).  Sample j
 * is the window of seq_len + 1 tokens starting at stride * (j - first
 * sample of its segment), so a sample never crosses a shard boundary.  The
 * stride is seq_len (windows = "aligned", and always for validation) or 1
 * for the training split with windows = "random": every start position is a
 * sample, so the loader's seeded permutation draws random-offset windows
 * without replacement.  The shards stay mapped read-only, so concurrent
 * reads need no locking.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file APIs (mmap, glob) under strict C11 */

#include <trainrun/plugin.h>
#include <trainrun/tokens.h>

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define TRTOKENS_HEADER TR_TOKENS_HEADER_BYTES
#define LLMC_HEADER 1024
#define LLMC_MAGIC 20240520

struct tokens_config {
    const char *train;
    const char *val;
    double val_fraction;
    int64_t vocab;
    int check;
    const char *windows;
};

static const char *const window_choices[] = {"aligned", "random", NULL};

static const struct tr_option tokens_options[] = {
    {TR_OPT_STRING, "train", NULL, 0, 0, NULL,
     "required: the training shards: a file, or a glob pattern such as "
     "\"data/train_*.bin\" (matches are taken in sorted order; relative paths are relative "
     "to the current directory)",
     offsetof(struct tokens_config, train)},
    {TR_OPT_STRING, "val", "", 0, 0, NULL,
     "the validation shards, a file or a glob pattern like train; \"\": cut val_fraction of "
     "the training tokens from the end of the last training shards instead",
     offsetof(struct tokens_config, val)},
    {TR_OPT_FLOAT, "val_fraction", "0.05", 0, 0.5, NULL,
     "with val = \"\": fraction of the training tokens, taken from the end, used for "
     "validation (0: no validation); ignored when val names shards",
     offsetof(struct tokens_config, val_fraction)},
    {TR_OPT_INT, "vocab", "0", 0, INT32_MAX, NULL,
     "vocabulary size; every token id must be below it. 0: the size the shards' headers "
     "declare (llm.c shards declare none: then 65536, the uint16 range; set 50257 for "
     "GPT-2 tokens)",
     offsetof(struct tokens_config, vocab)},
    {TR_OPT_BOOL, "check", "false", 0, 0, NULL,
     "scan every token against vocab when the data is opened (reads all shards once); "
     "otherwise tokens are checked as samples are read",
     offsetof(struct tokens_config, check)},
    {TR_OPT_ENUM, "windows", "aligned", 0, 0, window_choices,
     "training samples: \"aligned\": the windows of seq_len tokens starting at multiples of "
     "seq_len in each shard; \"random\": a window starting at every token, so the shuffled "
     "order draws random-offset windows without repeats (an epoch is then every start "
     "position once, about seq_len times as many samples). Validation is always aligned",
     offsetof(struct tokens_config, windows)},
    {.type = TR_OPT_END},
};

struct shard {
    char *path;
    const unsigned char *map; /* the whole file */
    size_t size;
    size_t data_offset;       /* byte offset of token 0 */
    uint32_t width;           /* bytes per token: 2 or 4 */
    uint32_t vocab;           /* declared by the header; 0: none */
    uint64_t tokens;
    const unsigned char *mask; /* the loss mask (bit i: token i is a target); NULL: none */
    uint64_t text_bytes;      /* bytes of text the tokens encode; 0: unknown */
};

/* Tokens [first, first + count) of one shard, serving samples
 * [first_sample, first_sample + samples) of its split. */
struct segment {
    const struct shard *shard;
    uint64_t first, count;
    uint64_t first_sample, samples;
};

struct tokens {
    struct shard *shards;
    size_t n_shards;
    struct segment *segments[TR_SPLIT_COUNT];
    size_t n_segments[TR_SPLIT_COUNT];
    uint64_t samples[TR_SPLIT_COUNT];
    uint64_t stride[TR_SPLIT_COUNT]; /* tokens between the starts of samples j and j + 1 */
    uint32_t seq_len;
    uint32_t vocab;
    char *tokenizer; /* tokenizer.json beside the first training shard, or NULL */
};

static void tokens_destroy(void *self)
{
    struct tokens *t = self;
    if (!t)
        return;
    for (size_t i = 0; i < t->n_shards; i++) {
        if (t->shards[i].map)
            munmap((void *)t->shards[i].map, t->shards[i].size);
        free(t->shards[i].path);
    }
    free(t->shards);
    for (int s = 0; s < TR_SPLIT_COUNT; s++)
        free(t->segments[s]);
    free(t->tokenizer);
    free(t);
}

/* `trainrun prepare --tokenizer` leaves the tokenizer beside the shards as
 * tokenizer.json: the data's tokenizer, which the run records. */
static char *tokenizer_beside(const char *shard)
{
    const char *slash = strrchr(shard, '/');
    size_t dir = slash ? (size_t)(slash - shard) + 1 : 0;
    char *path = malloc(dir + sizeof "tokenizer.json");
    if (!path)
        return NULL;
    memcpy(path, shard, dir);
    memcpy(path + dir, "tokenizer.json", sizeof "tokenizer.json");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
        return path;
    free(path);
    return NULL;
}


static uint32_t token_at(const struct shard *s, uint64_t i)
{
    const unsigned char *p = s->map + s->data_offset + i * s->width;
    return s->width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : data_le32(p);
}

/* Whether token i of s is a target the loss is taken on: its mask bit, or
 * always without a mask. */
static int trained(const struct shard *s, uint64_t i)
{
    return !s->mask || (s->mask[i / 8] >> (i % 8) & 1);
}

/* A file that is no shard: its first bytes shown, escaped, in the error. */
static int not_a_shard(const struct shard *s, tr_err *err)
{
    const unsigned char *h = s->map;
    const char *path = s->path;
    char shown[8 * 4 + 1] = "";
    size_t n = s->size < 8 ? s->size : 8, at = 0;
    for (size_t i = 0; i < n; i++) {
        int printable = h[i] >= 0x20 && h[i] < 0x7f && h[i] != '"' && h[i] != '\\';
        at += (size_t)snprintf(shown + at, sizeof shown - at,
                               printable ? "%c" : "\\x%02x", h[i]);
    }
    return tr_fail(err,
                   "tokens data: %s: byte offset 0: not a token shard: the file starts "
                   "with \"%s\", expected the magic \"TRTOKENS\" or llm.c's %d; "
                   "make shards with `trainrun prepare`",
                   path, shown, LLMC_MAGIC);
}

/* An llm.c shard's header (magic, version 1, uint16 tokens). */
static int parse_llmc_header(struct shard *s, tr_err *err)
{
    const unsigned char *h = s->map;
    const char *path = s->path;
    if (s->size < LLMC_HEADER)
        return tr_fail(err,
                       "tokens data: %s: truncated header: the file has %zu bytes but an "
                       "llm.c shard header needs %d; re-create the shard",
                       path, s->size, LLMC_HEADER);
    uint32_t version = data_le32(h + 4);
    if (version != 1)
        return tr_fail(err,
                       "tokens data: %s: byte offset 4: unsupported llm.c shard version %u "
                       "(only version 1, uint16 tokens, is read)",
                       path, version);
    s->width = 2;
    s->vocab = 0;
    s->tokens = data_le32(h + 8);
    s->data_offset = LLMC_HEADER;
    return TR_OK;
}

/* A TRTOKENS header: version, flags, token dtype and vocabulary checked;
 * *has_mask: a loss mask follows the tokens. */
static int parse_trtokens_header(struct shard *s, int *has_mask, tr_err *err)
{
    const unsigned char *h = s->map;
    const char *path = s->path;
    struct tr_tokens_header th;
    if (s->size < 8 || memcmp(h, TR_TOKENS_MAGIC, 8) != 0)
        return not_a_shard(s, err);
    if (s->size < TRTOKENS_HEADER)
        return tr_fail(err,
                       "tokens data: %s: truncated header: the file has %zu bytes but the "
                       "header needs %d; re-create the shard",
                       path, s->size, TRTOKENS_HEADER);
    tr_tokens_header_read(h, &th);
    if (th.version != TR_TOKENS_VERSION && th.version != TR_TOKENS_VERSION_FLAGS)
        return tr_fail(err,
                       "tokens data: %s: byte offset %d: unsupported version %u (this "
                       "trainrun reads versions %d and %d); re-create the shard with this "
                       "trainrun's `prepare`",
                       path, TR_TOKENS_AT_VERSION, th.version, TR_TOKENS_VERSION,
                       TR_TOKENS_VERSION_FLAGS);
    /* version 1 predates the flags word: whatever sits there is padding */
    if (th.version == TR_TOKENS_VERSION)
        th.flags = 0;
    if (th.flags & ~TR_TOKENS_LOSS_MASK)
        return tr_fail(err,
                       "tokens data: %s: byte offset %d: unknown flags 0x%x (this trainrun "
                       "knows 0x%x, the loss mask); the shard is damaged or from a newer "
                       "trainrun",
                       path, TR_TOKENS_AT_FLAGS, th.flags & ~TR_TOKENS_LOSS_MASK,
                       TR_TOKENS_LOSS_MASK);
    if (th.token_bytes != 2 && th.token_bytes != 4)
        return tr_fail(err,
                       "tokens data: %s: byte offset %d: unsupported token dtype %u "
                       "(2 = uint16, 4 = uint32)",
                       path, TR_TOKENS_AT_DTYPE, th.token_bytes);
    /* token ids travel as int32: a vocabulary beyond that would let
     * id 2^31 pass the check below it and reach the model negative */
    if (th.vocab > INT32_MAX)
        return tr_fail(err,
                       "tokens data: %s: byte offset %d: vocabulary size %u is beyond "
                       "2^31 - 1: the header is damaged; re-create the shard",
                       path, TR_TOKENS_AT_VOCAB, th.vocab);
    s->width = th.token_bytes;
    s->tokens = th.count;
    s->vocab = th.vocab;
    s->text_bytes = th.text_bytes;
    s->data_offset = TRTOKENS_HEADER;
    *has_mask = (th.flags & TR_TOKENS_LOSS_MASK) != 0;
    return TR_OK;
}

/* Check the header of a mapped shard and fill in where its tokens are. */
static int parse_header(struct shard *s, tr_err *err)
{
    const char *path = s->path;
    int has_mask = 0;
    int rc = s->size >= 4 && data_le32(s->map) == LLMC_MAGIC
                 ? parse_llmc_header(s, err) : parse_trtokens_header(s, &has_mask, err);
    if (rc != TR_OK)
        return rc;

    uint64_t room = (s->size - s->data_offset) / s->width;
    if (s->tokens > room)
        return tr_fail(err,
                       "tokens data: %s is truncated: the header says %llu tokens of %u bytes "
                       "from byte offset %zu, but the file ends at byte offset %zu, after %llu "
                       "whole tokens; re-create the shard (was it copied completely?)",
                       path, (unsigned long long)s->tokens, s->width, s->data_offset, s->size,
                       (unsigned long long)room);
    if (has_mask) {
        /* the tokens fit (above), so this subtraction cannot wrap */
        size_t mask_at = s->data_offset + (size_t)s->tokens * s->width;
        uint64_t need = tr_tokens_mask_bytes(s->tokens);
        if (need > s->size - mask_at)
            return tr_fail(err,
                           "tokens data: %s is truncated: the header (flags at byte offset %d) "
                           "says a loss mask of %llu bytes follows the %llu tokens from byte "
                           "offset %zu, but the file ends at byte offset %zu; re-create the "
                           "shard (was it copied completely?)",
                           path, TR_TOKENS_AT_FLAGS, (unsigned long long)need,
                           (unsigned long long)s->tokens, mask_at, s->size);
        s->mask = s->map + mask_at;
    }
    return TR_OK;
}

static int map_shard(struct shard *s, const char *option, const struct tr_host *host,
                     tr_err *err)
{
    void *map = NULL;
    int errnum = 0;
    switch (data_map_file(s->path, &map, &s->size, &errnum)) {
    case DATA_MAPPED:
        break;
    case DATA_CANNOT_OPEN:
        return data_fail_open(err, "tokens", option, s->path, errnum);
    case DATA_CANNOT_STAT:
        return tr_fail(err, "tokens data: cannot stat %s: %s", s->path, strerror(errnum));
    case DATA_NOT_REGULAR:
        return tr_fail(err, "tokens data: cannot read %s: %s; check data.%s", s->path,
                       tr_input_strerror(errnum), option);
    case DATA_EMPTY:
        return tr_fail(err,
                       "tokens data: %s is empty (0 bytes; byte offset 0); a shard starts with a "
                       "header: re-create it with `trainrun prepare`",
                       s->path);
    case DATA_CANNOT_MAP:
        return tr_fail(err, "tokens data: cannot map %s: %s", s->path, strerror(errnum));
    }
    s->map = map;
    if (parse_header(s, err) != TR_OK)
        return TR_ERROR;
    size_t used = s->data_offset + s->tokens * s->width +
                  (s->mask ? (size_t)tr_tokens_mask_bytes(s->tokens) : 0);
    if (used < s->size && host && host->log)
        host->log(TR_LOG_WARN, "tokens",
                  "%s: ignoring %zu bytes after the %llu tokens %sthe header declares (from "
                  "byte offset %zu)",
                  s->path, s->size - used, (unsigned long long)s->tokens,
                  s->mask ? "and loss mask " : "", used);
    return TR_OK;
}

static int has_glob_chars(const char *s)
{
    return strpbrk(s, "*?[") != NULL;
}

/* Append the files `pattern` names to t->shards; *first and *count say which. */
static int add_shards(struct tokens *t, const char *option, const char *pattern,
                      const struct tr_host *host, size_t *first, size_t *count, tr_err *err)
{
    glob_t g = {0};
    char *single[1] = {(char *)pattern};
    char **paths = single;
    size_t n = 1;
    if (has_glob_chars(pattern)) {
        int rc = glob(pattern, 0, NULL, &g);
        if (rc == GLOB_NOMATCH) {
            globfree(&g);
            char cwd[PATH_MAX];
            if (!getcwd(cwd, sizeof cwd))
                snprintf(cwd, sizeof cwd, "?");
            return tr_fail(err,
                           "tokens data: %s = \"%s\" matches no files%s%s%s; check data.%s",
                           option, pattern, pattern[0] == '/' ? "" : " (relative to ",
                           pattern[0] == '/' ? "" : cwd, pattern[0] == '/' ? "" : ")", option);
        }
        if (rc != 0) {
            globfree(&g);
            return tr_fail(err, "tokens data: cannot expand %s = \"%s\"%s", option, pattern,
                           rc == GLOB_NOSPACE ? ": out of memory" : ": read error");
        }
        paths = g.gl_pathv;
        n = g.gl_pathc;
    }

    struct shard *grown = realloc(t->shards, (t->n_shards + n) * sizeof *grown);
    if (!grown) {
        globfree(&g);
        return tr_fail(err, "tokens data: out of memory");
    }
    t->shards = grown;
    *first = t->n_shards;
    *count = n;
    int rc = TR_OK;
    for (size_t i = 0; i < n && rc == TR_OK; i++) {
        struct shard *s = &t->shards[t->n_shards];
        memset(s, 0, sizeof *s);
        s->path = strdup(paths[i]);
        if (!s->path) {
            rc = tr_fail(err, "tokens data: out of memory");
            break;
        }
        t->n_shards++; /* counted now so that destroy frees it on error */
        rc = map_shard(s, option, host, err);
    }
    globfree(&g);
    return rc;
}

static int add_segment(struct tokens *t, enum tr_split split, const struct shard *s,
                       uint64_t first, uint64_t count, tr_err *err)
{
    struct segment *grown =
        realloc(t->segments[split], (t->n_segments[split] + 1) * sizeof *grown);
    if (!grown)
        return tr_fail(err, "tokens data: out of memory");
    t->segments[split] = grown;
    struct segment *g = &grown[t->n_segments[split]++];
    g->shard = s;
    g->first = first;
    g->count = count;
    g->first_sample = t->samples[split];
    /* a window reads seq_len + 1 tokens: count tokens hold count - seq_len
     * of them at every start, (count - 1) / seq_len side by side */
    g->samples = count <= t->seq_len ? 0
                 : t->stride[split] == 1 ? count - t->seq_len
                                         : (count - 1) / t->seq_len;
    t->samples[split] += g->samples;
    return TR_OK;
}

/* The first token at or beyond `vocab` in tokens [first, first + count) of
 * s, as an error; TR_OK when there is none. */
static int check_range(const struct shard *s, uint64_t first, uint64_t count, uint32_t vocab,
                       tr_err *err)
{
    for (uint64_t i = first; i < first + count; i++) {
        uint32_t id = token_at(s, i);
        if (id >= vocab)
            return tr_fail(err,
                           "tokens data: %s: token %llu (byte offset %llu) is %u, not below the "
                           "vocabulary size %u; set data.vocab to the tokenizer's vocabulary "
                           "or re-create the shard",
                           s->path, (unsigned long long)i,
                           (unsigned long long)(s->data_offset + i * s->width), id, vocab);
    }
    return TR_OK;
}

/* The vocabulary: the option, else what the headers declare (they must
 * agree), else the uint16 range when every shard holds uint16 tokens. */
static int choose_vocab(struct tokens *t, int64_t option, tr_err *err)
{
    if (option > 0) {
        t->vocab = (uint32_t)option;
        return TR_OK;
    }
    const struct shard *declared = NULL;
    int all_narrow = 1;
    for (size_t i = 0; i < t->n_shards; i++) {
        const struct shard *s = &t->shards[i];
        all_narrow &= s->width == 2;
        if (!s->vocab)
            continue;
        if (declared && declared->vocab != s->vocab)
            return tr_fail(err,
                           "tokens data: %s declares vocabulary %u but %s declares %u; are they "
                           "from the same tokenizer? set data.vocab to use them together",
                           declared->path, declared->vocab, s->path, s->vocab);
        declared = s;
    }
    if (declared) {
        t->vocab = declared->vocab;
        return TR_OK;
    }
    if (!all_narrow)
        return tr_fail(err,
                       "tokens data: the shards hold uint32 tokens but declare no vocabulary "
                       "size; set data.vocab");
    t->vocab = 65536;
    return TR_OK;
}

static int fail_split(tr_err *err, const char *split, const char *pattern, uint64_t tokens,
                      size_t shards, uint32_t seq_len, const char *advice)
{
    return tr_fail(err,
                   "tokens data: the %s split (%s) has %llu tokens in %zu shard%s, but one "
                   "sample of seq_len %u needs %u tokens within one shard; %s",
                   split, pattern, (unsigned long long)tokens, shards, shards == 1 ? "" : "s",
                   seq_len, seq_len + 1, advice);
}

/* The training shards [first, first + n) as segments: all but the last
 * val_fraction of their tokens train, that tail (the last shards, or the
 * end of one) validates.  *keep: the tokens that train, *val_cut: the
 * tail's. */
static int split_segments(struct tokens *t, size_t first, size_t n, double val_fraction,
                          uint64_t *keep, uint64_t *val_cut, tr_err *err)
{
    uint64_t train_tokens = 0;
    for (size_t i = first; i < first + n; i++)
        train_tokens += t->shards[i].tokens;
    *val_cut = (uint64_t)((double)train_tokens * val_fraction);
    uint64_t seen = 0;
    *keep = train_tokens - *val_cut;
    for (size_t i = first; i < first + n; i++) {
        const struct shard *s = &t->shards[i];
        uint64_t in_train = seen >= *keep ? 0 : *keep - seen < s->tokens ? *keep - seen : s->tokens;
        if (in_train > 0 && add_segment(t, TR_SPLIT_TRAIN, s, 0, in_train, err) != TR_OK)
            return TR_ERROR;
        if (in_train < s->tokens &&
            add_segment(t, TR_SPLIT_VAL, s, in_train, s->tokens - in_train, err) != TR_OK)
            return TR_ERROR;
        seen += s->tokens;
    }
    return TR_OK;
}

/* data.val's shards [first, first + n), whole, as validation segments;
 * their tokens are added to *tokens. */
static int val_segments(struct tokens *t, size_t first, size_t n, uint64_t *tokens, tr_err *err)
{
    for (size_t i = first; i < first + n; i++) {
        if (add_segment(t, TR_SPLIT_VAL, &t->shards[i], 0, t->shards[i].tokens, err) != TR_OK)
            return TR_ERROR;
        *tokens += t->shards[i].tokens;
    }
    return TR_OK;
}

static int tokens_create(const struct tr_host *host, const void *config,
                         const struct tr_create_args *args, void **self, tr_err *err)
{
    const struct tokens_config *cfg = config;
    if (args->seq_len == 0)
        return tr_fail(err,
                       "tokens data: the tokens source needs a sequence model (the model reports "
                       "seq_len = 0); use a sequence model or another data plugin");
    if (!cfg->train[0])
        return tr_fail(err, "tokens data: train is empty; set data.train to a shard or a glob "
                            "pattern such as \"data/train_*.bin\"");

    struct tokens *t = calloc(1, sizeof *t);
    if (!t)
        return tr_fail(err, "tokens data: out of memory");
    t->seq_len = args->seq_len;
    t->stride[TR_SPLIT_TRAIN] = strcmp(cfg->windows, "random") == 0 ? 1 : args->seq_len;
    t->stride[TR_SPLIT_VAL] = args->seq_len;

    size_t train_first, train_n, val_first = 0, val_n = 0;
    int own_val = cfg->val[0] != '\0';
    if (add_shards(t, "train", cfg->train, host, &train_first, &train_n, err) != TR_OK ||
        (own_val && add_shards(t, "val", cfg->val, host, &val_first, &val_n, err) != TR_OK) ||
        choose_vocab(t, cfg->vocab, err) != TR_OK)
        goto fail;

    /* validation cut from the end of the training tokens, or data.val's */
    uint64_t keep, val_tokens;
    if (split_segments(t, train_first, train_n, own_val ? 0 : cfg->val_fraction, &keep,
                       &val_tokens, err) != TR_OK ||
        val_segments(t, val_first, val_n, &val_tokens, err) != TR_OK)
        goto fail;

    if (t->samples[TR_SPLIT_TRAIN] == 0) {
        fail_split(err, "training", cfg->train, keep, train_n, t->seq_len,
                   "use more or larger shards, a shorter sequence, or a smaller val_fraction");
        goto fail;
    }
    if ((own_val || cfg->val_fraction > 0) && t->samples[TR_SPLIT_VAL] == 0) {
        fail_split(err, "validation", own_val ? cfg->val : "the end of train", val_tokens,
                   own_val ? val_n : t->n_segments[TR_SPLIT_VAL], t->seq_len,
                   own_val ? "use larger validation shards or a shorter sequence"
                           : "use a larger val_fraction, val_fraction = 0, or data.val");
        goto fail;
    }

    t->tokenizer = tokenizer_beside(t->shards[train_first].path);
    if (cfg->check) {
        for (size_t i = 0; i < t->n_shards; i++)
            if (check_range(&t->shards[i], 0, t->shards[i].tokens, t->vocab, err) != TR_OK)
                goto fail;
    }
    if (host && host->log)
        host->log(TR_LOG_INFO, "tokens",
                  "%zu shard%s: %llu training and %llu validation samples of %u tokens, "
                  "vocabulary %u",
                  t->n_shards, t->n_shards == 1 ? "" : "s",
                  (unsigned long long)t->samples[TR_SPLIT_TRAIN],
                  (unsigned long long)t->samples[TR_SPLIT_VAL], t->seq_len, t->vocab);
    *self = t;
    return TR_OK;

fail:
    tokens_destroy(t);
    return TR_ERROR;
}

static int tokens_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)err;
    const struct tokens *t = self;
    /* random windows overlap: an in-order pass takes every seq_len-th (checked
     * before data_info() writes this plugin's struct_size over the core's) */
    if (TR_HAS_FIELD(out, struct tr_data_info, eval_stride))
        for (int s = 0; s < TR_SPLIT_COUNT; s++)
            out->eval_stride[s] = t->stride[s] == 1 ? t->seq_len : 0;
    data_info(out, t->samples, TR_I32, t->seq_len, t->seq_len, t->vocab);
    out->tokenizer = t->tokenizer;
    /* text bytes per token of each split, for the loss per byte: a segment cut from a
     * shard gets its share of the shard's bytes by tokens; one shard that does not know
     * its bytes (older shards, llm.c's) leaves the split unknown, and so does a shard
     * with a loss mask: its loss is over the trained-on tokens alone, whose share of
     * the bytes the header does not say */
    for (int split = 0; split < TR_SPLIT_COUNT; split++) {
        double bytes = 0, tokens = 0;
        for (size_t i = 0; i < t->n_segments[split]; i++) {
            const struct segment *g = &t->segments[split][i];
            if (!g->shard->text_bytes || !g->shard->tokens || g->shard->mask) {
                tokens = 0;
                break;
            }
            bytes += (double)g->shard->text_bytes * ((double)g->count / (double)g->shard->tokens);
            tokens += (double)g->count;
        }
        out->bytes_per_token[split] = tokens > 0 ? bytes / tokens : 0;
    }
    return TR_OK;
}

/* The segment holding sample `index` of a split (binary search). */
static const struct segment *find_segment(const struct tokens *t, enum tr_split split,
                                          uint64_t index)
{
    const struct segment *seg = t->segments[split];
    size_t lo = 0, hi = t->n_segments[split];
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (seg[mid].first_sample <= index)
            lo = mid;
        else
            hi = mid;
    }
    return &seg[lo];
}

static int tokens_read(void *self, enum tr_split split, const uint64_t *indices, size_t n,
                       void *inputs, int32_t *targets, tr_err *err)
{
    const struct tokens *t = self;
    if (data_check_read(err, "tokens", split, t->samples, indices, n) != TR_OK)
        return TR_ERROR;
    int32_t *in = inputs;
    const size_t T = t->seq_len;
    for (size_t i = 0; i < n; i++) {
        const struct segment *g = find_segment(t, split, indices[i]);
        const struct shard *s = g->shard;
        uint64_t first = g->first + (indices[i] - g->first_sample) * t->stride[split];
        uint32_t prev = token_at(s, first);
        if (prev >= t->vocab)
            return check_range(s, first, 1, t->vocab, err);
        for (size_t k = 0; k < T; k++) {
            uint32_t next = token_at(s, first + k + 1);
            if (next >= t->vocab)
                return check_range(s, first + k + 1, 1, t->vocab, err);
            in[i * T + k] = (int32_t)prev;
            targets[i * T + k] = trained(s, first + k + 1) ? (int32_t)next : -1;
            prev = next;
        }
    }
    return TR_OK;
}

static const struct tr_data_vtable tokens_vtable = {
    .struct_size = sizeof(struct tr_data_vtable),
    .info = tokens_info,
    .read = tokens_read,
};

static const struct tr_plugin_info tokens_plugin_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_DATA,
    .name = "tokens",
    .version = "0.1.0",
    .description = "memory-mapped pre-tokenised shards (trainrun's TRTOKENS or llm.c's format)",
    .options = tokens_options,
    .config_size = sizeof(struct tokens_config),
    .create = tokens_create,
    .destroy = tokens_destroy,
    .vtable = &tokens_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &tokens_plugin_info;
}
