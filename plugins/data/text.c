/*
 * data = { plugin = "text", path = "corpus.txt" }: a raw text file for
 * character-level language models, with one of two tokenizers:
 *
 *   "byte" (default): every byte is a token, vocabulary 256.  The file is
 *       mapped and read as it is; nothing is cached.
 *   "char": the distinct bytes of the file, sorted, are the vocabulary
 *       (token i is the i-th smallest byte value that occurs), so a model
 *       only predicts characters the corpus uses.  The file is tokenised
 *       once into <cache_dir>/<hash>.tokens (trainrun's TRTOKENS format,
 *       uint16 tokens) with the character table beside it in <hash>.chars;
 *       the hash covers the file's contents and the tokenizer, so an edited
 *       file gets a new cache and an unchanged one reuses it.  The table is
 *       also written as a tokenizer.json (<hash>.tokenizer.json: a byte-level
 *       BPE without merges whose vocabulary is the table, which the
 *       `tokenizers` library reads too), reported as the data's tokenizer:
 *       the run keeps a copy, and `trainrun sample` prints characters, not
 *       ids.  With caching off it goes to a temporary directory, removed
 *       when the source is destroyed (the run has copied it by then).
 *
 * The tokens are split by position: the first (1 - val_fraction) train, the
 * rest validate.  Sample j of a split is the window of seq_len tokens
 * starting at j * seq_len inside that split (windows = "aligned"; always for
 * validation), or, with windows = "random", sample j of the training split
 * starts at token j: every start position is a sample, so the loader's
 * seeded permutation of the samples draws random-offset windows without
 * replacement, and an epoch is every start position once.  A sample's
 * targets are its window shifted by one token.  Tokens are mapped read-only
 * (or held in memory when caching is off), so concurrent reads need no
 * locking.
 */
#define _POSIX_C_SOURCE 200809L /* POSIX file APIs under strict C11 */

#include <trainrun/plugin.h>
#include <trainrun/tokens.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define TRTOKENS_HEADER TR_TOKENS_HEADER_BYTES
#define CHARS_MAGIC "TRCHARS1"

struct text_config {
    const char *path;
    double val_fraction;
    const char *tokenizer;
    const char *cache_dir;
    const char *windows;
};

static const char *const tokenizer_choices[] = {"byte", "char", NULL};
static const char *const window_choices[] = {"aligned", "random", NULL};

static const struct tr_option text_options[] = {
    {TR_OPT_STRING, "path", NULL, 0, 0, NULL,
     "required: the text file (any bytes; relative paths are relative to the current "
     "directory)",
     offsetof(struct text_config, path)},
    {TR_OPT_FLOAT, "val_fraction", "0.1", 0, 0.5, NULL,
     "fraction of the file, taken from its end, used for validation (0: no validation)",
     offsetof(struct text_config, val_fraction)},
    {TR_OPT_ENUM, "tokenizer", "byte", 0, 0, tokenizer_choices,
     "\"byte\": every byte is a token (vocabulary 256); \"char\": the file's distinct bytes, "
     "sorted, are the vocabulary (its size is what the model must predict)",
     offsetof(struct text_config, tokenizer)},
    {TR_OPT_STRING, "cache_dir", ".trainrun-cache", 0, 0, NULL,
     "tokenizer = \"char\": directory of the tokenised copies, keyed by the file's contents "
     "(relative to the current directory; \"\": tokenise in memory on every start)",
     offsetof(struct text_config, cache_dir)},
    {TR_OPT_ENUM, "windows", "aligned", 0, 0, window_choices,
     "training samples: \"aligned\": the windows of seq_len tokens starting at multiples of "
     "seq_len; \"random\": a window starting at every token, so the shuffled order draws "
     "random-offset windows without repeats (an epoch is then every start position once, "
     "about seq_len times as many samples). Validation is always aligned",
     offsetof(struct text_config, windows)},
    {.type = TR_OPT_END},
};

struct text {
    void *map;                  /* what to unmap: the text file or the cache file */
    size_t map_size;
    unsigned char *owned;       /* char tokens built in memory (not from a cache) */
    const unsigned char *bytes; /* byte tokenizer: token i is bytes[i] */
    const unsigned char *wide;  /* char tokenizer: token i is little-endian u16 at 2 * i */
    uint32_t vocab;
    uint32_t seq_len;
    uint64_t start[TR_SPLIT_COUNT];   /* first token of each split */
    uint64_t samples[TR_SPLIT_COUNT];
    uint64_t stride[TR_SPLIT_COUNT];  /* tokens between the starts of samples j and j + 1 */
    char *tokenizer;            /* char tokenizer: its table as a tokenizer.json, or NULL */
    char *tokenizer_tmpdir;     /* the temporary directory holding it (no cache), or NULL */
};

static void text_destroy(void *self)
{
    struct text *t = self;
    if (!t)
        return;
    if (t->map)
        munmap(t->map, t->map_size);
    free(t->owned);
    if (t->tokenizer_tmpdir && t->tokenizer) {
        unlink(t->tokenizer);
        rmdir(t->tokenizer_tmpdir);
    }
    free(t->tokenizer);
    free(t->tokenizer_tmpdir);
    free(t);
}

static void log_to(const struct tr_host *host, enum tr_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void log_to(const struct tr_host *host, enum tr_log_level level, const char *fmt, ...)
{
    if (!host || !host->log)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    host->log(level, "text", "%s", msg);
}

/* Each split needs seq_len + 1 bytes for one (input, target) window. */
static int check_split(tr_err *err, const char *path, const char *split, uint64_t have,
                       uint32_t seq_len, double val_fraction)
{
    uint64_t need = (uint64_t)seq_len + 1;
    if (have >= need)
        return TR_OK;
    return tr_fail(err,
                   "text data: the %s split of %s has %llu bytes but one sample of seq_len %u "
                   "needs %llu (val_fraction = %g); use a longer file, a shorter sequence%s",
                   split, path, (unsigned long long)have, seq_len, (unsigned long long)need,
                   val_fraction,
                   split[0] == 'v' ? ", a larger val_fraction, or val_fraction = 0" : "");
}

/* ---- the char tokenizer and its cache ----------------------------------- */

static uint64_t read_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}


/* FNV-1a's xor-multiply step over 8-byte words (8 times faster than over
 * bytes; every step is a bijection, so any single changed word changes the
 * hash), an xor-shift per step so high bits reach the low ones, and the
 * tokenizer and length folded in.  It names cache files; it is no defence
 * against someone crafting collisions. */
static uint64_t content_hash(const char *tokenizer, const unsigned char *p, size_t n)
{
    const uint64_t prime = 0x100000001b3ULL;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *c = tokenizer; *c; c++)
        h = (h ^ (unsigned char)*c) * prime;
    h = (h ^ (uint64_t)n) * prime;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        h = (h ^ read_le64(p + i)) * prime;
        h ^= h >> 32;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * prime;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 32);
}

/* The sorted distinct bytes of the text; returns how many. */
static uint32_t char_table(const unsigned char *text, size_t n, unsigned char table[256])
{
    unsigned char seen[256] = {0};
    for (size_t i = 0; i < n; i++)
        seen[text[i]] = 1;
    uint32_t count = 0;
    for (int b = 0; b < 256; b++)
        if (seen[b])
            table[count++] = (unsigned char)b;
    return count;
}

/* A TRTOKENS file image in memory: header, then little-endian u16 ids. */
static unsigned char *tokenise_chars(const unsigned char *text, size_t n,
                                     const unsigned char *table, uint32_t vocab)
{
    unsigned char *out = malloc(TRTOKENS_HEADER + 2 * n);
    if (!out)
        return NULL;
    struct tr_tokens_header h = {TR_TOKENS_VERSION, 2, n, vocab, 0, 0}; /* uint16 ids */
    tr_tokens_header_write(out, &h);
    uint16_t id[256] = {0};
    for (uint32_t i = 0; i < vocab; i++)
        id[table[i]] = (uint16_t)i;
    unsigned char *w = out + TRTOKENS_HEADER;
    for (size_t i = 0; i < n; i++) {
        w[2 * i] = (unsigned char)(id[text[i]] & 0xff);
        w[2 * i + 1] = (unsigned char)(id[text[i]] >> 8);
    }
    return out;
}

static int mkdir_p(const char *dir)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* Write a file so that readers see all of it or none: a private temporary
 * file in the same directory, fsync'd, then renamed over the name. */
static int write_atomically(const char *path, const void *a, size_t a_size, const void *b,
                            size_t b_size)
{
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return -1;
    const void *parts[2] = {a, b};
    size_t sizes[2] = {a_size, b_size};
    for (int k = 0; k < 2; k++) {
        const char *p = parts[k];
        size_t left = sizes[k];
        while (left > 0) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                goto fail;
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0)
        goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        fd = -1;
        goto fail;
    }
    return 0;
fail:;
    int e = errno ? errno : EIO;
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    errno = e;
    return -1;
}

/* Is this mapped cache file the tokenisation of `text` (n bytes) with the
 * given character table?  Says why not in `why`.  Every token is checked
 * against the character it stands for: the file name only hashes the text,
 * so a cache damaged on disk (or written by someone else) must not change
 * what is trained on.  This costs what one pass of tokenising costs. */
static int cache_valid(const unsigned char *map, size_t size, const unsigned char *text,
                       uint64_t n, const unsigned char *table, uint32_t vocab, char *why,
                       size_t why_size)
{
    struct tr_tokens_header h;
    if (size < TRTOKENS_HEADER || tr_tokens_header_read(map, &h) != 0 ||
        h.version != TR_TOKENS_VERSION || h.token_bytes != 2) {
        snprintf(why, why_size, "not a version 1 uint16 token file");
        return 0;
    }
    if (h.count != n || size != TRTOKENS_HEADER + 2 * n) {
        snprintf(why, why_size, "holds %llu tokens in %zu bytes, the text has %llu characters",
                 (unsigned long long)h.count, size, (unsigned long long)n);
        return 0;
    }
    if (h.vocab != vocab) {
        snprintf(why, why_size, "its vocabulary %u differs from its character table's %u",
                 h.vocab, vocab);
        return 0;
    }
    const unsigned char *w = map + TRTOKENS_HEADER;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t id = (uint32_t)w[2 * i] | (uint32_t)w[2 * i + 1] << 8;
        if (id >= vocab) {
            snprintf(why, why_size, "token %llu is %u, beyond the vocabulary of %u",
                     (unsigned long long)i, id, vocab);
            return 0;
        }
        if (table[id] != text[i]) {
            snprintf(why, why_size, "token %llu does not match the text's character there",
                     (unsigned long long)i);
            return 0;
        }
    }
    return 1;
}

/* The vocabulary size a character table file declares, with the table in
 * `table`, or 0 when it is missing or malformed. */
static uint32_t read_char_table(const char *path, unsigned char table[256])
{
    FILE *f = tr_input_fopen(path);
    if (!f)
        return 0;
    unsigned char head[12];
    uint32_t count = 0;
    if (fread(head, 1, sizeof head, f) == sizeof head && memcmp(head, CHARS_MAGIC, 8) == 0) {
        count = data_le32(head + 8);
        if (count == 0 || count > 256 || fread(table, 1, count, f) != count ||
            fgetc(f) != EOF)
            count = 0;
        for (uint32_t i = 1; i < count; i++)
            if (table[i] <= table[i - 1])
                count = 0; /* must be strictly increasing */
    }
    fclose(f);
    return count;
}

/* Char tokens for `text`, from the cache when there is a valid one (then
 * t->map holds them), else tokenised now into t->owned and cached when
 * cache_dir is set. */
static int load_char_tokens(struct text *t, const unsigned char *text, size_t n,
                            const struct text_config *cfg, const struct tr_host *host,
                            tr_err *err)
{
    char tokens_path[PATH_MAX], chars_path[PATH_MAX];
    int caching = cfg->cache_dir[0] != '\0';
    if (caching) {
        uint64_t h = content_hash(cfg->tokenizer, text, n);
        int a = snprintf(tokens_path, sizeof tokens_path, "%s/%016llx.tokens", cfg->cache_dir,
                         (unsigned long long)h);
        int b = snprintf(chars_path, sizeof chars_path, "%s/%016llx.chars", cfg->cache_dir,
                         (unsigned long long)h);
        if (a >= (int)sizeof tokens_path || b >= (int)sizeof chars_path)
            return tr_fail(err, "text data: cache_dir \"%s\" is too long; use a shorter path",
                           cfg->cache_dir);

        /* the table must be the text's own: a longer one would change the
         * vocabulary, and so the model, without changing a token */
        unsigned char cached_table[256], own_table[256];
        uint32_t vocab = read_char_table(chars_path, cached_table);
        uint32_t own_vocab = char_table(text, n, own_table);
        void *cached = NULL;
        size_t size = 0;
        int errnum = 0;
        if (vocab && (vocab != own_vocab || memcmp(cached_table, own_table, vocab) != 0)) {
            log_to(host, TR_LOG_WARN, "cache %s is not this text's character table; "
                   "rebuilding it", chars_path);
        } else if (vocab && data_map_file(tokens_path, &cached, &size, &errnum) == DATA_MAPPED) {
            char why[256] = "";
            if (cache_valid(cached, size, text, n, cached_table, vocab, why, sizeof why)) {
                t->map = cached;
                t->map_size = size;
                t->wide = (const unsigned char *)cached + TRTOKENS_HEADER;
                t->vocab = vocab;
                log_to(host, TR_LOG_INFO, "using cached tokens %s for %s (vocabulary %u)",
                       tokens_path, cfg->path, vocab);
                return TR_OK;
            }
            munmap(cached, size);
            log_to(host, TR_LOG_WARN, "cache %s is damaged (%s); rebuilding it", tokens_path,
                   why);
        }
    }

    unsigned char table[256];
    uint32_t vocab = char_table(text, n, table);
    t->owned = tokenise_chars(text, n, table, vocab);
    if (!t->owned)
        return tr_fail(err, "text data: out of memory tokenising %s (%zu characters)",
                       cfg->path, n);
    t->wide = t->owned + TRTOKENS_HEADER;
    t->vocab = vocab;
    if (!caching)
        return TR_OK;

    /* The table first: the tokens file is what marks the cache complete. */
    unsigned char head[12];
    memcpy(head, CHARS_MAGIC, 8);
    put_le32(head + 8, vocab);
    errno = 0;
    if (mkdir_p(cfg->cache_dir) != 0 ||
        write_atomically(chars_path, head, sizeof head, table, vocab) != 0 ||
        write_atomically(tokens_path, t->owned, TRTOKENS_HEADER, t->wide, 2 * n) != 0) {
        log_to(host, TR_LOG_WARN,
               "cannot write the token cache in %s (%s); continuing without it (set "
               "data.cache_dir to a writable directory, or \"\" to stop caching)",
               cfg->cache_dir, strerror(errno));
        return TR_OK;
    }
    log_to(host, TR_LOG_INFO, "tokenised %s (%zu characters, vocabulary %u) into %s",
           cfg->path, n, vocab, tokens_path);
    return TR_OK;
}

/* The character of GPT-2's byte-level alphabet that stands for byte b in a
 * tokenizer.json: printable bytes stand for themselves, the others for
 * U+0100 onwards in byte order. */
static uint32_t byte_level_char(unsigned b)
{
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (printable)
        return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        n += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
    return 256 + n;
}

/* The character table as a tokenizer.json: a byte-level BPE without merges
 * whose vocabulary maps byte table[i] to id i, so encoding text gives the
 * char tokens and decoding ids gives the bytes back.  The text is a
 * function of the table alone (the same table, the same file). */
static char *char_tokenizer_json(const unsigned char *table, uint32_t vocab, size_t *len)
{
    char *out = NULL;
    FILE *f = open_memstream(&out, len);
    if (!f)
        return NULL;
    fputs("{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, "
          "\"added_tokens\": [], \"normalizer\": null,\n"
          " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
          "\"trim_offsets\": true, \"use_regex\": false},\n"
          " \"post_processor\": null,\n"
          " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
          "\"trim_offsets\": true, \"use_regex\": false},\n"
          " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
          "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, "
          "\"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
          "  \"vocab\": {", f);
    for (uint32_t i = 0; i < vocab; i++) {
        uint32_t c = byte_level_char(table[i]);
        fputs(i ? ", \"" : "\"", f);
        if (c == '"' || c == '\\')
            fputc('\\', f);
        if (c < 0x80) {
            fputc((int)c, f);
        } else { /* below U+0800: two bytes of UTF-8 */
            fputc((int)(0xc0 | c >> 6), f);
            fputc((int)(0x80 | (c & 0x3f)), f);
        }
        fprintf(f, "\": %u", i);
    }
    fputs("},\n  \"merges\": []}}\n", f);
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* Writes the char tokenizer of `text` beside its cached tokens
 * (<cache_dir>/<hash>.tokenizer.json), or in a temporary directory when
 * caching is off, and keeps its path in t->tokenizer.  A failure is only a
 * warning: training needs the tokens, not the table. */
static void record_char_tokenizer(struct text *t, const unsigned char *text, size_t n,
                                  const struct text_config *cfg, const struct tr_host *host)
{
    unsigned char table[256];
    uint32_t vocab = char_table(text, n, table);
    size_t len = 0;
    char *json = char_tokenizer_json(table, vocab, &len);
    char path[PATH_MAX];
    int fits = 0;
    if (cfg->cache_dir[0]) {
        fits = snprintf(path, sizeof path, "%s/%016llx.tokenizer.json", cfg->cache_dir,
                        (unsigned long long)content_hash(cfg->tokenizer, text, n)) < (int)sizeof path;
    } else {
        const char *tmp = getenv("TMPDIR");
        char dir[PATH_MAX];
        if (snprintf(dir, sizeof dir, "%s/trainrun-chars-XXXXXX", tmp && *tmp ? tmp : "/tmp") <
                (int)sizeof dir && mkdtemp(dir)) {
            t->tokenizer_tmpdir = strdup(dir);
            fits = snprintf(path, sizeof path, "%s/tokenizer.json", dir) < (int)sizeof path;
        }
    }
    errno = 0;
    if (json && fits && write_atomically(path, json, len, NULL, 0) == 0) {
        t->tokenizer = strdup(path);
    } else {
        log_to(host, TR_LOG_WARN, "cannot write the character table of %s as a tokenizer (%s); "
               "the run records no tokenizer, and `trainrun sample` prints its ids as bytes",
               cfg->path, errno ? strerror(errno) : "out of memory");
        if (t->tokenizer_tmpdir)
            rmdir(t->tokenizer_tmpdir);
    }
    free(json);
}

/* ---- the plugin ----------------------------------------------------------- */

static int text_create(const struct tr_host *host, const void *config,
                       const struct tr_create_args *args, void **self, tr_err *err)
{
    const struct text_config *cfg = config;
    if (args->seq_len == 0)
        return tr_fail(err,
                       "text data: the text source needs a sequence model (the model reports "
                       "seq_len = 0); use a sequence model or another data plugin");

    void *map = NULL;
    size_t size = 0;
    int errnum = 0;
    switch (data_map_file(cfg->path, &map, &size, &errnum)) {
    case DATA_MAPPED:
        break;
    case DATA_CANNOT_OPEN:
    case DATA_CANNOT_STAT:
        return data_fail_open(err, "text", "path", cfg->path, errnum);
    case DATA_NOT_REGULAR:
        return tr_fail(err, "text data: cannot read %s: %s; check data.path", cfg->path,
                       tr_input_strerror(errnum));
    case DATA_EMPTY:
        return tr_fail(err, "text data: %s is empty; point data.path at a text file",
                       cfg->path);
    case DATA_CANNOT_MAP:
        return tr_fail(err, "text data: cannot map %s: %s", cfg->path, strerror(errnum));
    }

    /* One token per byte in either tokenizer, so the split is the same. */
    uint64_t val_len = (uint64_t)((double)size * cfg->val_fraction);
    uint64_t train_len = size - val_len;
    if (check_split(err, cfg->path, "training", train_len, args->seq_len, cfg->val_fraction) ||
        (cfg->val_fraction > 0 &&
         check_split(err, cfg->path, "validation", val_len, args->seq_len, cfg->val_fraction))) {
        munmap(map, size);
        return TR_ERROR;
    }

    struct text *t = calloc(1, sizeof *t);
    if (!t) {
        munmap(map, size);
        return tr_fail(err, "text data: out of memory");
    }
    if (strcmp(cfg->tokenizer, "char") == 0) {
        int rc = load_char_tokens(t, map, size, cfg, host, err);
        if (rc == TR_OK)
            record_char_tokenizer(t, map, size, cfg, host);
        munmap(map, size); /* the tokens are cached or in memory now */
        if (rc != TR_OK) {
            text_destroy(t);
            return TR_ERROR;
        }
    } else {
        t->map = map;
        t->map_size = size;
        t->bytes = map;
        t->vocab = 256;
    }
    t->seq_len = args->seq_len;
    t->start[TR_SPLIT_TRAIN] = 0;
    t->start[TR_SPLIT_VAL] = train_len;
    /* a window reads seq_len + 1 tokens: n tokens hold n - seq_len of them
     * at every start, (n - 1) / seq_len side by side */
    int random = strcmp(cfg->windows, "random") == 0;
    t->stride[TR_SPLIT_TRAIN] = random ? 1 : args->seq_len;
    t->stride[TR_SPLIT_VAL] = args->seq_len;
    t->samples[TR_SPLIT_TRAIN] =
        random ? train_len - args->seq_len : (train_len - 1) / args->seq_len;
    t->samples[TR_SPLIT_VAL] = val_len > 0 ? (val_len - 1) / args->seq_len : 0;
    *self = t;
    return TR_OK;
}

static int text_info(void *self, struct tr_data_info *out, tr_err *err)
{
    (void)err;
    const struct text *t = self;
    /* random windows overlap: an in-order pass takes every seq_len-th (checked
     * before data_info() writes this plugin's struct_size over the core's) */
    if (TR_HAS_FIELD(out, struct tr_data_info, eval_stride))
        for (int s = 0; s < TR_SPLIT_COUNT; s++)
            out->eval_stride[s] = t->stride[s] == 1 ? t->seq_len : 0;
    data_info(out, t->samples, TR_I32, t->seq_len, t->seq_len, t->vocab);
    out->tokenizer = t->tokenizer; /* char: the table as a tokenizer.json */
    /* byte and char tokens are one byte of the file each: the loss per token is per byte */
    out->bytes_per_token[TR_SPLIT_TRAIN] = out->bytes_per_token[TR_SPLIT_VAL] = 1.0;
    return TR_OK;
}

static int text_read(void *self, enum tr_split split, const uint64_t *indices, size_t n,
                     void *inputs, int32_t *targets, tr_err *err)
{
    const struct text *t = self;
    if (data_check_read(err, "text", split, t->samples, indices, n) != TR_OK)
        return TR_ERROR;
    int32_t *in = inputs;
    const size_t T = t->seq_len;
    for (size_t i = 0; i < n; i++) {
        uint64_t first = t->start[split] + indices[i] * t->stride[split];
        if (t->bytes) {
            const unsigned char *w = t->bytes + first;
            for (size_t k = 0; k < T; k++) {
                in[i * T + k] = w[k];
                targets[i * T + k] = w[k + 1];
            }
        } else {
            const unsigned char *w = t->wide + 2 * first;
            int32_t prev = w[0] | w[1] << 8;
            for (size_t k = 0; k < T; k++) {
                int32_t next = w[2 * k + 2] | w[2 * k + 3] << 8;
                in[i * T + k] = prev;
                targets[i * T + k] = next;
                prev = next;
            }
        }
    }
    return TR_OK;
}

static const struct tr_data_vtable text_vtable = {
    .struct_size = sizeof(struct tr_data_vtable),
    .info = text_info,
    .read = text_read,
};

static const struct tr_plugin_info text_plugin_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_DATA,
    .name = "text",
    .version = "0.1.0",
    .description = "a raw text file as byte or character tokens, for character-level models",
    .options = text_options,
    .config_size = sizeof(struct text_config),
    .create = text_create,
    .destroy = text_destroy,
    .vtable = &text_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &text_plugin_info;
}
