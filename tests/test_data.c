/*
 * Tests of the token data path: the tokens plugin (trainrun's TRTOKENS shards
 * and llm.c's shards), the text plugin's char tokenizer and its cache, and
 * `trainrun prepare`, whose shards the tokens plugin must read back.
 * Plugins are dlopen'ed from $TR_PLUGIN_BUILD_DIR as the core loads them;
 * prepare is called in-process through tr_prepare_main.
 *
 * Covers: plugins/data/tokens.c, text.c and images.c; core/dataset/ (every prepare_*.c,
 * dedup.c, image_codec.c) through core/commands/prepare.c; include/trainrun/tokens.h and
 * images.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include "scratch.h"
#include "slurp.h"
#include <trainrun/plugin.h>
#include <trainrun/tokens.h>

#include "util/json.h"
#include "commands/prepare.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a host that records what plugins log --------------------------------- */

static char log_text[8192]; /* every message of the test, one per line */

static void test_log(enum tr_log_level level, const char *who, const char *fmt, ...)
{
    (void)level;
    (void)who;
    size_t used = strlen(log_text);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(log_text + used, sizeof log_text - used, fmt, ap);
    va_end(ap);
    used = strlen(log_text);
    if (used + 1 < sizeof log_text)
        strcat(log_text, "\n");
}

/* the host (logging to test_log), load, set, create_ok, create_fails,
 * destroy: tests/plugin_harness.h */
#include "plugin_harness.h"

/* ---- a temporary directory per test ---------------------------------------- */

/* each test gets a scratch directory (tests/scratch.h) */
static void make_tmp(void)
{
    tmp_create("trdatatest");
    log_text[0] = '\0';
}

static char *read_all(const char *path, size_t *size)
{
    size_t n;
    char *buf = tr_test_slurp(path, &n);
    if (size)
        *size = n;
    return buf;
}

/* Files in a directory whose names end with `suffix`. */
static int count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t a = strlen(e->d_name), b = strlen(suffix);
        n += a >= b && strcmp(e->d_name + a - b, suffix) == 0;
    }
    closedir(d);
    return n;
}

static int count_containing(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strstr(e->d_name, part) != NULL;
    closedir(d);
    return n;
}

/* ---- shard files ------------------------------------------------------------- */

static void le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A TRTOKENS shard: `count` tokens of `width` bytes, the header declaring
 * `declared` tokens. */
static void write_shard_as(const char *path, const char *magic, uint32_t version,
                           uint32_t width, const uint32_t *ids, size_t count, uint64_t declared,
                           uint32_t vocab)
{
    size_t size = 64 + count * width;
    unsigned char *buf = calloc(1, size);
    memcpy(buf, magic, 8);
    le32(buf + 8, version);
    le32(buf + 12, width);
    le64(buf + 16, declared);
    le32(buf + 24, vocab);
    for (size_t i = 0; i < count; i++)
        for (uint32_t b = 0; b < width; b++)
            buf[64 + i * width + b] = (unsigned char)(ids[i] >> (8 * b));
    write_file(path, buf, size);
    free(buf);
}

static void write_shard(const char *path, uint32_t width, const uint32_t *ids, size_t count,
                        uint32_t vocab)
{
    write_shard_as(path, "TRTOKENS", 1, width, ids, count, count, vocab);
}

/* A TRTOKENS version 2 shard with `flags` at byte 28 and, after the
 * uint16 tokens, `mask_bytes` bytes of the loss mask built from trained[]
 * (bit i = trained[i]; bytes beyond the tokens' ceil(count / 8) are zero). */
static void write_masked_shard(const char *path, const uint32_t *ids, const int *trained,
                               size_t count, uint32_t vocab, uint32_t flags, size_t mask_bytes)
{
    size_t size = 64 + count * 2 + mask_bytes;
    unsigned char *buf = calloc(1, size);
    memcpy(buf, "TRTOKENS", 8);
    le32(buf + 8, 2);
    le32(buf + 12, 2);
    le64(buf + 16, count);
    le32(buf + 24, vocab);
    le32(buf + 28, flags);
    for (size_t i = 0; i < count; i++) {
        buf[64 + 2 * i] = (unsigned char)ids[i];
        buf[64 + 2 * i + 1] = (unsigned char)(ids[i] >> 8);
        if (trained[i] && i / 8 < mask_bytes)
            buf[64 + 2 * count + i / 8] |= (unsigned char)(1u << (i % 8));
    }
    write_file(path, buf, size);
    free(buf);
}

/* llm.c's format: 256 int32 header (magic, version, count), uint16 tokens. */
static void write_llmc(const char *path, uint32_t version, const uint32_t *ids, size_t count)
{
    size_t size = 1024 + 2 * count;
    unsigned char *buf = calloc(1, size);
    le32(buf, 20240520);
    le32(buf + 4, version);
    le32(buf + 8, (uint32_t)count);
    for (size_t i = 0; i < count; i++) {
        buf[1024 + 2 * i] = (unsigned char)ids[i];
        buf[1024 + 2 * i + 1] = (unsigned char)(ids[i] >> 8);
    }
    write_file(path, buf, size);
    free(buf);
}

/* The token count of a TRTOKENS version 2 shard with a loss mask, whose
 * size must be the header, the uint16 tokens and the mask. */
static uint64_t shard_count_masked(const char *path)
{
    size_t size;
    unsigned char *b = (unsigned char *)read_all(path, &size);
    struct tr_tokens_header h;
    cr_assert_geq(size, TR_TOKENS_HEADER_BYTES);
    cr_assert_eq(tr_tokens_header_read(b, &h), 0, "%s: bad magic", path);
    cr_assert_eq(h.version, TR_TOKENS_VERSION_FLAGS, "%s", path);
    cr_assert_eq(h.flags, TR_TOKENS_LOSS_MASK, "%s", path);
    cr_assert_eq(size, TR_TOKENS_HEADER_BYTES + 2 * h.count + tr_tokens_mask_bytes(h.count),
                 "%s: size, count and mask disagree", path);
    free(b);
    return h.count;
}

/* The declared token count of a TRTOKENS shard. */
static uint64_t shard_count(const char *path)
{
    size_t size;
    unsigned char *b = (unsigned char *)read_all(path, &size);
    cr_assert_geq(size, 64);
    cr_assert(memcmp(b, "TRTOKENS", 8) == 0, "%s: bad magic", path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b[16 + i];
    cr_assert_eq(size, 64 + 2 * n, "%s: size and count disagree", path);
    free(b);
    return n;
}

/* ---- a data plugin's vtable and info --------------------------------------- */

static const struct tr_data_vtable *data(struct plugin *p)
{
    return p->info->vtable;
}

static struct tr_data_info info_of(struct plugin *p, void *self)
{
    struct tr_data_info info = {.struct_size = sizeof info};
    tr_err err = {{0}};
    cr_assert_eq(data(p)->info(self, &info, &err), TR_OK, "%s", err.msg);
    return info;
}

static void read_one(struct plugin *p, void *self, enum tr_split split, uint64_t index,
                     int32_t *in, int32_t *tgt)
{
    tr_err err = {{0}};
    cr_assert_eq(data(p)->read(self, split, &index, 1, in, tgt, &err), TR_OK, "%s", err.msg);
}

/* Sample `index` must be tokens ids[first ..] (inputs) and one later (targets). */
static void expect_window(struct plugin *p, void *self, enum tr_split split, uint64_t index,
                          const uint32_t *ids, size_t first, size_t T)
{
    int32_t in[64], tgt[64];
    cr_assert_leq(T, 64);
    read_one(p, self, split, index, in, tgt);
    for (size_t k = 0; k < T; k++) {
        cr_assert_eq((uint32_t)in[k], ids[first + k], "split %d sample %llu input %zu",
                     (int)split, (unsigned long long)index, k);
        cr_assert_eq((uint32_t)tgt[k], ids[first + k + 1], "split %d sample %llu target %zu",
                     (int)split, (unsigned long long)index, k);
    }
}

TestSuite(tokens, .init = make_tmp, .fini = remove_tmp);
TestSuite(text_char, .init = make_tmp, .fini = remove_tmp);
TestSuite(prepare, .init = make_tmp, .fini = remove_tmp);

/* ---- tokens: formats and splits ------------------------------------------------ */

Test(tokens, reads_uint16_and_uint32_shards)
{
    uint32_t ids[41];
    for (int i = 0; i < 41; i++)
        ids[i] = (uint32_t)(i * 7 % 50);
    write_shard(tmp_path("a.bin"), 2, ids, 41, 50);
    struct plugin p = load("data_tokens");
    set(&p, "train", tmp_path("a.bin"));
    set(&p, "val_fraction", "0");
    void *self = create_ok(&p, 8);
    struct tr_data_info info = info_of(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 5); /* (41 - 1) / 8 */
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 0);
    cr_assert_eq(info.input_dtype, TR_I32);
    cr_assert_eq(info.input_len, 8);
    cr_assert_eq(info.target_len, 8);
    cr_assert_eq(info.classes, 50, "vocab comes from the header");
    expect_window(&p, self, TR_SPLIT_TRAIN, 0, ids, 0, 8);
    expect_window(&p, self, TR_SPLIT_TRAIN, 4, ids, 32, 8);
    uint64_t beyond = 5;
    int32_t in[8], tgt[8];
    tr_err err = {{0}};
    cr_assert_eq(data(&p)->read(self, TR_SPLIT_TRAIN, &beyond, 1, in, tgt, &err), TR_ERROR);
    destroy(&p, self);

    /* uint32 tokens beyond the uint16 range */
    for (int i = 0; i < 41; i++)
        ids[i] = 70000u + (uint32_t)i * 1000u;
    write_shard(tmp_path("wide.bin"), 4, ids, 41, 200000);
    set(&p, "train", tmp_path("wide.bin"));
    self = create_ok(&p, 8);
    cr_assert_eq(info_of(&p, self).classes, 200000);
    expect_window(&p, self, TR_SPLIT_TRAIN, 3, ids, 24, 8);
    destroy(&p, self);
}

Test(tokens, glob_takes_shards_sorted_and_samples_stay_inside_a_shard)
{
    uint32_t a[13], b[10];
    for (int i = 0; i < 13; i++)
        a[i] = (uint32_t)i;
    for (int i = 0; i < 10; i++)
        b[i] = (uint32_t)(100 + i);
    write_shard(tmp_path("shard_1.bin"), 2, b, 10, 256); /* written first, sorts second */
    write_shard(tmp_path("shard_0.bin"), 2, a, 13, 256);
    struct plugin p = load("data_tokens");
    set(&p, "train", tmp_path("shard_*.bin"));
    set(&p, "val_fraction", "0");
    void *self = create_ok(&p, 4);
    /* shard_0: (13-1)/4 = 3 samples; shard_1: (10-1)/4 = 2 */
    cr_assert_eq(info_of(&p, self).samples[TR_SPLIT_TRAIN], 5);
    expect_window(&p, self, TR_SPLIT_TRAIN, 2, a, 8, 4);
    expect_window(&p, self, TR_SPLIT_TRAIN, 3, b, 0, 4); /* not a's tail + b's head */
    expect_window(&p, self, TR_SPLIT_TRAIN, 4, b, 4, 4);
    destroy(&p, self);
}

Test(tokens, validation_from_the_end_or_from_its_own_shards)
{
    uint32_t ids[101];
    for (int i = 0; i < 101; i++)
        ids[i] = (uint32_t)(i % 256);
    write_shard(tmp_path("train.bin"), 2, ids, 101, 256);
    struct plugin p = load("data_tokens");
    set(&p, "train", tmp_path("train.bin"));
    set(&p, "val_fraction", "0.2"); /* the last 20 tokens validate */
    void *self = create_ok(&p, 4);
    struct tr_data_info info = info_of(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 20); /* (81-1)/4 */
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 4);    /* (20-1)/4 */
    expect_window(&p, self, TR_SPLIT_TRAIN, 19, ids, 76, 4);
    expect_window(&p, self, TR_SPLIT_VAL, 0, ids, 81, 4);
    destroy(&p, self);

    uint32_t v[9] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
    write_shard(tmp_path("val.bin"), 2, v, 9, 256);
    set(&p, "val", tmp_path("val.bin"));
    self = create_ok(&p, 4);
    info = info_of(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 25, "val_fraction is ignored with val");
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 2);
    expect_window(&p, self, TR_SPLIT_VAL, 1, v, 4, 4);
    destroy(&p, self);

    /* a validation split too small for one sample */
    set(&p, "val", "");
    set(&p, "val_fraction", "0.02");
    create_fails(&p, 4, "validation split", "needs 5 tokens");
}

/* Set a shard's text bytes (header byte 32), as prepare writes them. */
static void set_text_bytes(const char *path, uint64_t bytes)
{
    size_t size;
    unsigned char *b = (unsigned char *)read_all(path, &size);
    le64(b + 32, bytes);
    write_file(path, b, size);
    free(b);
}

/* bytes_per_token (the loss per byte) from the headers' text bytes: a split cut from the
 * end of a shard gets the shard's bytes in proportion to its tokens; one shard that does
 * not know its bytes leaves its split unknown (0). */
Test(tokens, bytes_per_token_from_the_shards_text_bytes)
{
    uint32_t ids[101];
    for (int i = 0; i < 101; i++)
        ids[i] = (uint32_t)(i % 256);
    write_shard(tmp_path("a.bin"), 2, ids, 100, 256);
    struct plugin p = load("data_tokens");
    set(&p, "train", tmp_path("a.bin"));
    set(&p, "val_fraction", "0.2");
    void *self = create_ok(&p, 4);
    struct tr_data_info info = info_of(&p, self);
    cr_assert_eq(info.bytes_per_token[TR_SPLIT_TRAIN], 0, "a shard without text bytes: unknown");
    cr_assert_eq(info.bytes_per_token[TR_SPLIT_VAL], 0);
    destroy(&p, self);

    set_text_bytes(tmp_path("a.bin"), 350);
    self = create_ok(&p, 4);
    info = info_of(&p, self);
    cr_assert_float_eq(info.bytes_per_token[TR_SPLIT_TRAIN], 3.5, 1e-12, "%g",
                       info.bytes_per_token[TR_SPLIT_TRAIN]);
    cr_assert_float_eq(info.bytes_per_token[TR_SPLIT_VAL], 3.5, 1e-12, "%g",
                       info.bytes_per_token[TR_SPLIT_VAL]);
    destroy(&p, self);

    /* two training shards (100 tokens of 350 bytes, 50 of 50) and a validation shard */
    write_shard(tmp_path("b.bin"), 2, ids, 50, 256);
    set_text_bytes(tmp_path("b.bin"), 50);
    write_shard(tmp_path("v.bin"), 2, ids, 20, 256);
    set_text_bytes(tmp_path("v.bin"), 45);
    set(&p, "train", tmp_path("[ab].bin"));
    set(&p, "val", tmp_path("v.bin"));
    self = create_ok(&p, 4);
    info = info_of(&p, self);
    cr_assert_float_eq(info.bytes_per_token[TR_SPLIT_TRAIN], 400.0 / 150, 1e-12, "%g",
                       info.bytes_per_token[TR_SPLIT_TRAIN]);
    cr_assert_float_eq(info.bytes_per_token[TR_SPLIT_VAL], 2.25, 1e-12, "%g",
                       info.bytes_per_token[TR_SPLIT_VAL]);
    destroy(&p, self);

    set_text_bytes(tmp_path("b.bin"), 0);
    self = create_ok(&p, 4);
    info = info_of(&p, self);
    cr_assert_eq(info.bytes_per_token[TR_SPLIT_TRAIN], 0, "one shard of the split is unknown");
    cr_assert_float_eq(info.bytes_per_token[TR_SPLIT_VAL], 2.25, 1e-12);
    destroy(&p, self);
}

Test(tokens, reads_llmc_shards)
{
    uint32_t ids[33];
    for (int i = 0; i < 33; i++)
        ids[i] = (uint32_t)(i * 1543 % 50257);
    write_llmc(tmp_path("shard_train_000001.bin"), 1, ids, 33);
    struct plugin p = load("data_tokens");
    set(&p, "train", tmp_path("shard_train_*.bin"));
    set(&p, "val_fraction", "0");
    void *self = create_ok(&p, 16);
    struct tr_data_info info = info_of(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 2);
    cr_assert_eq(info.classes, 65536, "llm.c shards declare no vocabulary: the uint16 range");
    expect_window(&p, self, TR_SPLIT_TRAIN, 1, ids, 16, 16);
    destroy(&p, self);

    set(&p, "vocab", "50257");
    self = create_ok(&p, 16);
    cr_assert_eq(info_of(&p, self).classes, 50257);
    destroy(&p, self);
}

/* ---- tokens: bad input --------------------------------------------------------- */

Test(tokens, bad_shards_are_errors_naming_file_and_offset)
{
    uint32_t ids[20] = {0};
    struct plugin p = load("data_tokens");
    set(&p, "val_fraction", "0");

    const char *truncated = tmp_path("truncated.bin");
    write_shard_as(truncated, "TRTOKENS", 1, 2, ids, 20, 100, 256);
    set(&p, "train", truncated);
    create_fails(&p, 4, truncated, "truncated: the header says 100 tokens");
    create_fails(&p, 4, "ends at byte offset 104", "after 20 whole tokens");

    const char *magic = tmp_path("magic.bin");
    write_shard_as(magic, "TRTOKENZ", 1, 2, ids, 20, 20, 256);
    set(&p, "train", magic);
    create_fails(&p, 4, magic, "byte offset 0: not a token shard");
    create_fails(&p, 4, "TRTOKENZ", "expected the magic \"TRTOKENS\"");

    const char *version = tmp_path("version.bin");
    write_shard_as(version, "TRTOKENS", 3, 2, ids, 20, 20, 256);
    set(&p, "train", version);
    create_fails(&p, 4, version, "byte offset 8: unsupported version 3");

    const char *dtype = tmp_path("dtype.bin");
    write_shard_as(dtype, "TRTOKENS", 1, 3, ids, 20, 20, 256);
    set(&p, "train", dtype);
    create_fails(&p, 4, dtype, "byte offset 12: unsupported token dtype 3");

    const char *llmc = tmp_path("llmc.bin");
    write_llmc(llmc, 7, ids, 20);
    set(&p, "train", llmc);
    create_fails(&p, 4, llmc, "byte offset 4: unsupported llm.c shard version 7");

    const char *empty = tmp_path("empty.bin");
    write_file(empty, "", 0);
    set(&p, "train", empty);
    create_fails(&p, 4, empty, "is empty");

    const char *short_header = tmp_path("short.bin");
    write_file(short_header, "TRTOKENS\1\0\0\0", 12);
    set(&p, "train", short_header);
    create_fails(&p, 4, short_header, "truncated header");

    set(&p, "train", tmp_path("nothing_*.bin"));
    create_fails(&p, 4, "nothing_*.bin", "matches no files");

    set(&p, "train", "no/such/shard.bin");
    create_fails(&p, 4, "no/such/shard.bin", "relative to the current directory");

    create_fails(&p, 0, "needs a sequence model", NULL);

    /* shards that disagree on the vocabulary */
    write_shard(tmp_path("v_0.bin"), 2, ids, 20, 256);
    write_shard(tmp_path("v_1.bin"), 2, ids, 20, 300);
    set(&p, "train", tmp_path("v_*.bin"));
    create_fails(&p, 4, "declares vocabulary 256", "set data.vocab");
    set(&p, "vocab", "300");
    destroy(&p, create_ok(&p, 4));
}

/* ---- tokens: loss masks (instruction data) -------------------------------------- */

/* Every sample's inputs are the tokens, and each target is the next token
 * when the mask trains on it, else exactly -1 (the cross-entropy's
 * ignore_index); shards without a mask in the same split train on all. */
Test(tokens, masked_targets_read_as_minus_one)
{
    enum { N = 43, T = 6 };
    uint32_t ids[N];
    int trained[N];
    for (int i = 0; i < N; i++) {
        ids[i] = (uint32_t)(i * 5 % 97);
        /* uneven runs of prompt (0) and response (1), across byte boundaries */
        trained[i] = (i % 11) >= 4;
    }
    write_masked_shard(tmp_path("m_0.bin"), ids, trained, N, 97, TR_TOKENS_LOSS_MASK,
                       N / 8 + 1);
    write_shard(tmp_path("m_1.bin"), 2, ids, N, 97); /* version 1, no mask */
    struct plugin p = load("data_tokens");
    set(&p, "train", tmp_path("m_*.bin"));
    set(&p, "val_fraction", "0");
    void *self = create_ok(&p, T);
    uint64_t per_shard = (N - 1) / T;
    cr_assert_eq(info_of(&p, self).samples[TR_SPLIT_TRAIN], 2 * per_shard);
    cr_assert_null(strstr(log_text, "ignoring"), "a complete mask is not extra bytes: %s",
                   log_text);
    int masked = 0, kept = 0;
    for (uint64_t j = 0; j < 2 * per_shard; j++) {
        int32_t in[T], tgt[T];
        read_one(&p, self, TR_SPLIT_TRAIN, j, in, tgt);
        size_t first = (size_t)(j % per_shard) * T;
        for (size_t k = 0; k < T; k++) {
            cr_assert_eq((uint32_t)in[k], ids[first + k], "sample %llu input %zu",
                         (unsigned long long)j, k);
            int mask_applies = j < per_shard; /* m_0 is masked, m_1 is not */
            int32_t want = mask_applies && !trained[first + k + 1] ? -1
                                                                   : (int32_t)ids[first + k + 1];
            cr_assert_eq(tgt[k], want, "sample %llu target %zu: %d, want %d",
                         (unsigned long long)j, k, tgt[k], want);
            masked += tgt[k] == -1;
            kept += tgt[k] != -1;
        }
    }
    cr_assert_gt(masked, 0);
    cr_assert_gt(kept, masked);
    destroy(&p, self);

    /* version 1 never has a mask, whatever byte 28 holds */
    unsigned char *v1 = NULL;
    size_t size;
    write_shard(tmp_path("v1.bin"), 2, ids, N, 97);
    v1 = (unsigned char *)read_all(tmp_path("v1.bin"), &size);
    le32(v1 + 28, TR_TOKENS_LOSS_MASK);
    write_file(tmp_path("v1.bin"), v1, size);
    free(v1);
    set(&p, "train", tmp_path("v1.bin"));
    self = create_ok(&p, T);
    expect_window(&p, self, TR_SPLIT_TRAIN, 2, ids, 2 * T, T);
    destroy(&p, self);
}

Test(tokens, damaged_masks_are_errors_naming_file_and_offset)
{
    enum { N = 40 };
    uint32_t ids[N];
    int trained[N];
    for (int i = 0; i < N; i++) {
        ids[i] = (uint32_t)i;
        trained[i] = i % 2;
    }
    struct plugin p = load("data_tokens");
    set(&p, "val_fraction", "0");

    const char *short_mask = tmp_path("short_mask.bin");
    write_masked_shard(short_mask, ids, trained, N, 256, TR_TOKENS_LOSS_MASK, N / 8 - 1);
    set(&p, "train", short_mask);
    create_fails(&p, 4, short_mask, "a loss mask of 5 bytes follows the 40 tokens");
    create_fails(&p, 4, "the file ends at byte offset 148", "re-create the shard");

    const char *no_mask = tmp_path("no_mask.bin");
    write_masked_shard(no_mask, ids, trained, N, 256, TR_TOKENS_LOSS_MASK, 0);
    set(&p, "train", no_mask);
    create_fails(&p, 4, no_mask, "loss mask of 5 bytes");

    const char *flags = tmp_path("flags.bin");
    write_masked_shard(flags, ids, trained, N, 256, TR_TOKENS_LOSS_MASK | 0x40, N / 8);
    set(&p, "train", flags);
    create_fails(&p, 4, flags, "byte offset 28: unknown flags 0x40");

    /* version 2 without the flag: no mask, every target trained on */
    const char *plain = tmp_path("plain_v2.bin");
    write_masked_shard(plain, ids, trained, N, 256, 0, 0);
    set(&p, "train", plain);
    void *self = create_ok(&p, 4);
    expect_window(&p, self, TR_SPLIT_TRAIN, 1, ids, 4, 4);
    destroy(&p, self);

    /* a mask longer than the tokens need: warned about, not an error */
    const char *longer = tmp_path("longer.bin");
    write_masked_shard(longer, ids, trained, N, 256, TR_TOKENS_LOSS_MASK, N / 8 + 3);
    set(&p, "train", longer);
    self = create_ok(&p, 4);
    cr_assert(strstr(log_text, "ignoring 3 bytes after the 40 tokens and loss mask"), "%s",
              log_text);
    destroy(&p, self);
}

Test(tokens, token_beyond_vocab_is_reported_lazily_or_at_open)
{
    uint32_t ids[21];
    for (int i = 0; i < 21; i++)
        ids[i] = (uint32_t)i;
    ids[13] = 999; /* in sample 3 of seq_len 4 (tokens 12..16) */
    const char *path = tmp_path("bad_token.bin");
    write_shard(path, 2, ids, 21, 100);
    struct plugin p = load("data_tokens");
    set(&p, "train", path);
    set(&p, "val_fraction", "0");
    void *self = create_ok(&p, 4); /* not scanned at open by default */
    int32_t in[4], tgt[4];
    read_one(&p, self, TR_SPLIT_TRAIN, 0, in, tgt); /* clean samples still read */
    uint64_t index = 3;
    tr_err err = {{0}};
    cr_assert_eq(data(&p)->read(self, TR_SPLIT_TRAIN, &index, 1, in, tgt, &err), TR_ERROR);
    cr_assert(strstr(err.msg, path), "%s", err.msg);
    cr_assert(strstr(err.msg, "token 13 (byte offset 90) is 999"), "%s", err.msg);
    cr_assert(strstr(err.msg, "vocabulary size 100"), "%s", err.msg);
    destroy(&p, self);

    set(&p, "check", "true");
    create_fails(&p, 4, path, "token 13 (byte offset 90) is 999");
}

/* ---- text: the char tokenizer and its cache --------------------------------------- */

static const char corpus[] =
    "the cat sat on the mat. the dog sat on the log. a cat and a dog met on a mat.\n";

Test(text_char, vocabulary_is_the_sorted_distinct_bytes)
{
    const char *path = tmp_path("corpus.txt");
    write_text(path, corpus);
    struct plugin p = load("data_text");
    set(&p, "path", path);
    set(&p, "val_fraction", "0");
    set(&p, "tokenizer", "char");
    set(&p, "cache_dir", "");
    void *self = create_ok(&p, 8);

    char distinct[256];
    int n = 0;
    for (int c = 0; c < 256; c++)
        if (strchr(corpus, c) && c)
            distinct[n++] = (char)c;
    struct tr_data_info info = info_of(&p, self);
    cr_assert_eq(info.classes, (uint32_t)n, "vocabulary %u, distinct bytes %d", info.classes, n);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], (sizeof corpus - 2) / 8);
    /* a char is a byte of the file: the loss per token is the loss per byte */
    cr_assert_eq(info.bytes_per_token[TR_SPLIT_TRAIN], 1.0);
    cr_assert_eq(info.bytes_per_token[TR_SPLIT_VAL], 1.0);

    int32_t in[8], tgt[8];
    read_one(&p, self, TR_SPLIT_TRAIN, 1, in, tgt);
    for (int k = 0; k < 8; k++) {
        cr_assert_lt(in[k], n);
        cr_assert_eq(distinct[in[k]], corpus[8 + k], "token %d maps back to its byte", k);
        cr_assert_eq(distinct[tgt[k]], corpus[9 + k]);
    }
    destroy(&p, self);
    cr_assert_eq(count_files(tmp, ".tokens"), 0, "cache_dir = \"\" caches nothing");

    /* the byte tokenizer keeps vocabulary 256 and writes no cache */
    set(&p, "tokenizer", "byte");
    set(&p, "cache_dir", tmp_path("cache"));
    self = create_ok(&p, 8);
    cr_assert_eq(info_of(&p, self).classes, 256);
    cr_assert_eq(info_of(&p, self).bytes_per_token[TR_SPLIT_VAL], 1.0);
    destroy(&p, self);
    cr_assert_eq(count_files(tmp_path("cache"), ".tokens"), 0);
}

Test(text_char, cache_is_created_reused_and_rebuilt_when_the_file_changes)
{
    const char *path = tmp_path("corpus.txt");
    const char *cache = tmp_path("cache");
    write_text(path, corpus);
    struct plugin p = load("data_text");
    set(&p, "path", path);
    set(&p, "val_fraction", "0.2");
    set(&p, "tokenizer", "char");
    set(&p, "cache_dir", cache);

    void *self = create_ok(&p, 8);
    int32_t first_in[8], first_tgt[8];
    read_one(&p, self, TR_SPLIT_VAL, 0, first_in, first_tgt);
    uint32_t vocab = info_of(&p, self).classes;
    destroy(&p, self);
    cr_assert(strstr(log_text, "tokenised"), "log: %s", log_text);
    cr_assert_eq(count_files(cache, ".tokens"), 1);
    cr_assert_eq(count_files(cache, ".chars"), 1);
    cr_assert_eq(count_containing(cache, ".tmp"), 0, "no temporary files are left");

    DIR *d = opendir(cache);
    struct dirent *e;
    char tokens_file[600] = "";
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tokens"))
            snprintf(tokens_file, sizeof tokens_file, "%s/%s", cache, e->d_name);
    closedir(d);
    struct stat before, after;
    cr_assert_eq(stat(tokens_file, &before), 0);
    cr_assert_eq(shard_count(tokens_file), sizeof corpus - 1, "the cache is a TRTOKENS file");

    /* the same contents again: reused, not rewritten */
    log_text[0] = '\0';
    self = create_ok(&p, 8);
    cr_assert(strstr(log_text, "using cached tokens"), "log: %s", log_text);
    cr_assert(!strstr(log_text, "tokenised"), "log: %s", log_text);
    cr_assert_eq(stat(tokens_file, &after), 0);
    cr_assert_eq(before.st_ino, after.st_ino, "the cache file was replaced");
    cr_assert_eq(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
    cr_assert_eq(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
    cr_assert_eq(info_of(&p, self).classes, vocab);
    int32_t in[8], tgt[8];
    read_one(&p, self, TR_SPLIT_VAL, 0, in, tgt);
    cr_assert_arr_eq(in, first_in, sizeof in);
    cr_assert_arr_eq(tgt, first_tgt, sizeof tgt);
    destroy(&p, self);

    /* one byte changed: a new hash, so a new cache, and the new contents */
    char changed[sizeof corpus];
    memcpy(changed, corpus, sizeof corpus);
    changed[4] = 'X'; /* "the Xat": a new character, too */
    write_text(path, changed);
    log_text[0] = '\0';
    self = create_ok(&p, 8);
    cr_assert(strstr(log_text, "tokenised"), "log: %s", log_text);
    cr_assert_eq(count_files(cache, ".tokens"), 2);
    cr_assert_eq(info_of(&p, self).classes, vocab + 1);
    read_one(&p, self, TR_SPLIT_TRAIN, 0, in, tgt);
    cr_assert_eq(in[4], 3, "'X' sorts after '\\n', ' ' and '.', before the lowercase letters");
    destroy(&p, self);

    /* a damaged cache is noticed and rebuilt */
    cr_assert_eq(truncate(tokens_file, 100), 0);
    write_text(path, corpus);
    log_text[0] = '\0';
    self = create_ok(&p, 8);
    cr_assert(strstr(log_text, "damaged"), "log: %s", log_text);
    read_one(&p, self, TR_SPLIT_VAL, 0, in, tgt);
    cr_assert_arr_eq(in, first_in, sizeof in);
    destroy(&p, self);
    cr_assert_eq(stat(tokens_file, &after), 0);
    cr_assert_eq(after.st_size, 64 + 2 * (sizeof corpus - 1));
}

/* ---- windows = "random": a training sample at every start position ------------------- */

TestSuite(windows, .init = make_tmp, .fini = remove_tmp);

/* Training sample j starts at token j of its segment (a shard, or the part of
 * one before the validation cut), and never crosses into the next shard;
 * validation keeps its aligned windows. */
Test(windows, tokens_random_starts_a_training_sample_at_every_token)
{
    uint32_t ids[101];
    for (int i = 0; i < 101; i++)
        ids[i] = (uint32_t)(i * 37 % 251);
    write_shard(tmp_path("train.bin"), 2, ids, 101, 256);
    struct plugin p = load("data_tokens");
    set(&p, "train", tmp_path("train.bin"));
    set(&p, "val_fraction", "0.2"); /* tokens 81..100 validate */
    set(&p, "windows", "random");
    void *self = create_ok(&p, 4);
    struct tr_data_info info = info_of(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 77, "81 - 4 start positions, got %llu",
                 (unsigned long long)info.samples[TR_SPLIT_TRAIN]);
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 4, "validation stays aligned: (20 - 1) / 4");
    cr_assert_eq(info.eval_stride[TR_SPLIT_TRAIN], 4, "an evaluation reads every 4th window");
    cr_assert_eq(info.eval_stride[TR_SPLIT_VAL], 0);
    for (uint64_t j = 0; j < 77; j++)
        expect_window(&p, self, TR_SPLIT_TRAIN, j, ids, j, 4);
    expect_window(&p, self, TR_SPLIT_VAL, 0, ids, 81, 4);
    expect_window(&p, self, TR_SPLIT_VAL, 3, ids, 93, 4);
    uint64_t beyond = 77;
    int32_t in[4], tgt[4];
    tr_err err = {{0}};
    cr_assert_eq(data(&p)->read(self, TR_SPLIT_TRAIN, &beyond, 1, in, tgt, &err), TR_ERROR,
                 "sample 77 would read the first validation token as a target");
    destroy(&p, self);

    /* aligned, the default, is unchanged */
    set(&p, "windows", "aligned");
    self = create_ok(&p, 4);
    info = info_of(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 20);
    cr_assert_eq(info.eval_stride[TR_SPLIT_TRAIN], 0, "aligned windows do not overlap");
    expect_window(&p, self, TR_SPLIT_TRAIN, 19, ids, 76, 4);
    destroy(&p, self);

    /* shards: 13 tokens give 9 starts, 10 give 6, 4 (too short) none */
    uint32_t a[13], b[10], c[4] = {1, 2, 3, 4};
    for (int i = 0; i < 13; i++)
        a[i] = (uint32_t)i;
    for (int i = 0; i < 10; i++)
        b[i] = (uint32_t)(100 + i);
    write_shard(tmp_path("shard_0.bin"), 2, a, 13, 256);
    write_shard(tmp_path("shard_1.bin"), 2, c, 4, 256);
    write_shard(tmp_path("shard_2.bin"), 4, b, 10, 256);
    set(&p, "train", tmp_path("shard_*.bin"));
    set(&p, "val_fraction", "0");
    set(&p, "windows", "random");
    self = create_ok(&p, 4);
    cr_assert_eq(info_of(&p, self).samples[TR_SPLIT_TRAIN], 15);
    expect_window(&p, self, TR_SPLIT_TRAIN, 0, a, 0, 4);
    expect_window(&p, self, TR_SPLIT_TRAIN, 8, a, 8, 4); /* a's last window */
    expect_window(&p, self, TR_SPLIT_TRAIN, 9, b, 0, 4); /* not a's tail + b's head */
    expect_window(&p, self, TR_SPLIT_TRAIN, 14, b, 5, 4);
    destroy(&p, self);
}

/* The text plugin's byte and char tokens, the same way: training sample j is
 * the window at byte j, validation keeps the windows at multiples of seq_len. */
Test(windows, text_random_starts_a_training_sample_at_every_byte)
{
    const char *path = tmp_path("corpus.txt");
    write_text(path, corpus);
    const uint64_t size = sizeof corpus - 1;
    const uint64_t train_len = size - (uint64_t)((double)size * 0.25);
    const char *tokenizers[] = {"byte", "char"};
    for (int t = 0; t < 2; t++) {
        struct plugin p = load("data_text");
        set(&p, "path", path);
        set(&p, "val_fraction", "0.25");
        set(&p, "tokenizer", tokenizers[t]);
        set(&p, "cache_dir", "");
        void *self = create_ok(&p, 8);
        struct tr_data_info aligned = info_of(&p, self);
        destroy(&p, self);

        set(&p, "windows", "random");
        self = create_ok(&p, 8);
        struct tr_data_info info = info_of(&p, self);
        cr_assert_eq(info.samples[TR_SPLIT_TRAIN], train_len - 8, "%s: %llu samples",
                     tokenizers[t], (unsigned long long)info.samples[TR_SPLIT_TRAIN]);
        cr_assert_eq(aligned.samples[TR_SPLIT_TRAIN], (train_len - 1) / 8);
        cr_assert_eq(info.samples[TR_SPLIT_VAL], aligned.samples[TR_SPLIT_VAL]);
        cr_assert_eq(info.classes, aligned.classes);
        cr_assert_eq(info.eval_stride[TR_SPLIT_TRAIN], 8);
        cr_assert_eq(info.eval_stride[TR_SPLIT_VAL], 0);
        cr_assert_eq(aligned.eval_stride[TR_SPLIT_TRAIN], 0);

        /* the byte each token stands for: itself, or the char table's */
        char table[256];
        int n = 0;
        for (int c = 0; c < 256; c++)
            if (t == 0 || (c && strchr(corpus, c)))
                table[n++] = (char)c;
        int32_t in[8], tgt[8];
        for (uint64_t j = 0; j < train_len - 8; j += 7) {
            read_one(&p, self, TR_SPLIT_TRAIN, j, in, tgt);
            for (int k = 0; k < 8; k++) {
                cr_assert_eq(table[in[k]], corpus[j + k], "%s: sample %llu input %d",
                             tokenizers[t], (unsigned long long)j, k);
                cr_assert_eq(table[tgt[k]], corpus[j + k + 1]);
            }
        }
        read_one(&p, self, TR_SPLIT_TRAIN, train_len - 9, in, tgt);
        cr_assert_eq(table[tgt[7]], corpus[train_len - 1], "the last training window");
        read_one(&p, self, TR_SPLIT_VAL, 1, in, tgt);
        for (int k = 0; k < 8; k++)
            cr_assert_eq(table[in[k]], corpus[train_len + 8 + k], "validation stays aligned");
        destroy(&p, self);
    }
}

/* ---- prepare ------------------------------------------------------------------------ */

static char out_text[16384], err_text[8192];

/* Run `trainrun prepare ARGS...` (NULL-terminated) with stdout and stderr
 * captured into out_text and err_text; returns the exit code. */
static int prepare(const char *arg, ...)
{
    char *argv[32] = {"prepare"};
    int argc = 1;
    va_list ap;
    va_start(ap, arg);
    for (const char *a = arg; a && argc < 31; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);

    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2);
    const char *out_path = tmp_path("prepare.stdout"), *err_path = tmp_path("prepare.stderr");
    int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    int code = tr_prepare_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(fo);
    close(fe);
    close(saved_out);
    close(saved_err);
    char *o = read_all(out_path, NULL), *e = read_all(err_path, NULL);
    snprintf(out_text, sizeof out_text, "%s", o);
    snprintf(err_text, sizeof err_text, "%s", e);
    free(o);
    free(e);
    unlink(out_path);
    unlink(err_path);
    return code;
}

static struct tr_json *read_json(const char *path)
{
    size_t size, at = 0;
    char *text = read_all(path, &size);
    struct tr_json *j = tr_json_parse(text, size, &at);
    cr_assert_not_null(j, "%s is not JSON (byte %zu): %s", path, at, text);
    free(text);
    return j;
}

static double json_at(const struct tr_json *j, const char *object, const char *key)
{
    const struct tr_json *o = tr_json_get(j, object);
    cr_assert_not_null(o, "prepare.json has no \"%s\"", object);
    return tr_json_number(o, key, -1);
}

/* A long paragraph (about 90 words), the same with one word changed. */
static const char long_paragraph[] =
    "And it came to pass in those days that the people of the valley gathered at the river "
    "to bring in the harvest of barley and wheat, and every household carried its baskets "
    "down the long road past the old well and the olive trees, singing the songs their "
    "fathers had sung, while the children ran ahead to watch the boats come in from the "
    "northern shore where the fishermen mended their nets in the evening light and spoke "
    "of the storms of the winter past and of the calm season that was coming to the land.";

static void near_duplicate(char *out, size_t size)
{
    snprintf(out, size, "%s", long_paragraph);
    char *w = strstr(out, "barley");
    memcpy(w, "millet", 6);
}

Test(prepare, exact_duplicates_are_removed)
{
    const char *in = tmp_path("in.txt");
    write_text(in, "First paragraph,\nover two lines.\n\n"
                   "Second one.\n\n\n"
                   "  FIRST   paragraph,\nover two\tlines.  \n\n" /* same up to case/space */
                   "Third one.\n");
    cr_assert_eq(prepare(in, "-o", tmp_path("out"), "--val-fraction", "0", NULL), 0, "%s",
                 err_text);
    cr_assert(strstr(out_text, "4 documents"), "%s", out_text);
    cr_assert(strstr(out_text, "exact dedup removed 1 document"), "%s", out_text);
    cr_assert(strstr(out_text, "in.txt:7 \"FIRST paragraph, over two lines.\""), "%s", out_text);
    cr_assert(strstr(out_text, "repeats"), "%s", out_text);
    cr_assert(strstr(out_text, "in.txt:1 \"First paragraph, over two lines.\""), "%s", out_text);

    struct tr_json *j = read_json(tmp_path("out/prepare.json"));
    cr_assert_eq(json_at(j, "documents", "read"), 4);
    cr_assert_eq(json_at(j, "documents", "kept"), 3);
    cr_assert_eq(json_at(j, "documents", "removed_exact"), 1);
    tr_json_free(j);

    /* the stream is the kept documents, each followed by a blank line */
    size_t size;
    char *shard = read_all(tmp_path("out/train_000000.bin"), &size);
    const char want[] = "First paragraph,\nover two lines.\n\nSecond one.\n\nThird one.\n\n";
    cr_assert_eq(size, 64 + 2 * (sizeof want - 1));
    for (size_t i = 0; i < sizeof want - 1; i++)
        cr_assert_eq((unsigned char)shard[64 + 2 * i], (unsigned char)want[i], "token %zu", i);
    free(shard);

    /* --dedup none keeps it */
    cr_assert_eq(prepare(in, "-o", tmp_path("all"), "--dedup", "none", "--val-fraction", "0",
                         NULL), 0, "%s", err_text);
    j = read_json(tmp_path("all/prepare.json"));
    cr_assert_eq(json_at(j, "documents", "kept"), 4);
    tr_json_free(j);
}

Test(prepare, near_duplicates_are_removed_with_near_and_kept_with_exact)
{
    char changed[sizeof long_paragraph];
    near_duplicate(changed, sizeof changed);
    char text[4096];
    snprintf(text, sizeof text,
             "%s\n\nA short unrelated note about lamps and oil.\n\n%s\n\nThe end of it all.\n",
             long_paragraph, changed);
    const char *in = tmp_path("in.txt");
    write_text(in, text);

    cr_assert_eq(prepare(in, "-o", tmp_path("exact"), "--dedup", "exact", NULL), 0, "%s",
                 err_text);
    struct tr_json *j = read_json(tmp_path("exact/prepare.json"));
    cr_assert_eq(json_at(j, "documents", "kept"), 4, "exact dedup keeps a changed word");
    tr_json_free(j);

    cr_assert_eq(prepare(in, "-o", tmp_path("near"), "--dedup", "near", NULL), 0, "%s",
                 err_text);
    cr_assert(strstr(out_text, "near dedup"), "%s", out_text);
    cr_assert(strstr(out_text, "removed 1 document"), "%s", out_text);
    cr_assert(strstr(out_text, "in.txt:5"), "the later copy goes: %s", out_text);
    cr_assert(strstr(out_text, "is like") && strstr(out_text, "in.txt:1"), "%s", out_text);
    j = read_json(tmp_path("near/prepare.json"));
    cr_assert_eq(json_at(j, "documents", "kept"), 3);
    cr_assert_eq(json_at(j, "documents", "removed_near"), 1);
    cr_assert_eq(json_at(j, "documents", "removed_exact"), 0);
    tr_json_free(j);

    /* a strict threshold keeps it */
    cr_assert_eq(prepare(in, "-o", tmp_path("strict"), "--dedup", "near", "--near-threshold",
                         "1", NULL), 0, "%s", err_text);
    j = read_json(tmp_path("strict/prepare.json"));
    cr_assert_eq(json_at(j, "documents", "removed_near"), 0);
    tr_json_free(j);
}

/* Sum of the shards' token counts named in prepare.json's split. */
static uint64_t shard_total(const struct tr_json *j, const char *dir, const char *split,
                            uint64_t *samples, uint32_t seq_len)
{
    const struct tr_json *shards = tr_json_get(tr_json_get(j, split), "shards");
    cr_assert_not_null(shards);
    uint64_t total = 0;
    *samples = 0;
    for (size_t i = 0; i < shards->n; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, shards->items[i]->string);
        uint64_t n = shard_count(path);
        total += n;
        *samples += n > seq_len ? (n - 1) / seq_len : 0;
    }
    return total;
}

Test(prepare, shards_are_readable_by_the_tokens_plugin)
{
    /* 40 paragraphs of varied text, about 3 KiB */
    char text[8192] = "";
    for (int i = 0; i < 40; i++) {
        char para[160];
        snprintf(para, sizeof para, "Paragraph %d tells of %d sheep, %d goats and the %s.\n\n",
                 i, i * 7 % 31, i * 5 % 17, i % 3 ? "shepherd" : "river");
        strcat(text, para);
    }
    const char *in = tmp_path("in.txt");
    write_text(in, text);
    const char *out = tmp_path("out");
    for (int t = 0; t < 2; t++) {
        /* the second run makes fewer shards: the first run's extra ones must go */
        const char *tokenizer = t ? "char" : "byte", *shard_tokens = t ? "800" : "400";
        cr_assert_eq(prepare(in, "-o", out, "--tokenizer", tokenizer, "--shard-tokens", shard_tokens,
                             "--val-fraction", "0.1", NULL), 0, "%s", err_text);
        struct tr_json *j = read_json(tmp_path("out/prepare.json"));
        uint32_t seq_len = 16;
        uint64_t train_samples, val_samples;
        uint64_t train = shard_total(j, out, "train", &train_samples, seq_len);
        uint64_t val = shard_total(j, out, "val", &val_samples, seq_len);
        cr_assert_eq(train, (uint64_t)json_at(j, "train", "tokens"));
        cr_assert_eq(val, (uint64_t)json_at(j, "val", "tokens"));
        cr_assert_eq(train + val, strlen(text), "nothing was a duplicate");
        cr_assert_geq(val, strlen(text) / 10);
        cr_assert_geq(tr_json_get(tr_json_get(j, "train"), "shards")->n, t ? 2 : 4);
        cr_assert_eq(count_files(out, ".bin"),
                     (int)(tr_json_get(tr_json_get(j, "train"), "shards")->n +
                           tr_json_get(tr_json_get(j, "val"), "shards")->n),
                     "no stale shards from the previous run");

        struct plugin p = load("data_tokens");
        set(&p, "train", tmp_path("out/train_*.bin"));
        set(&p, "val", tmp_path("out/val_*.bin"));
        set(&p, "check", "true");
        void *self = create_ok(&p, seq_len);
        struct tr_data_info info = info_of(&p, self);
        cr_assert_eq(info.samples[TR_SPLIT_TRAIN], train_samples);
        cr_assert_eq(info.samples[TR_SPLIT_VAL], val_samples);
        cr_assert_eq(info.classes, (uint32_t)tr_json_number(j, "vocab", 0));
        int32_t in_ids[16], tgt[16];
        read_one(&p, self, TR_SPLIT_TRAIN, 0, in_ids, tgt);
        if (t == 0) {
            cr_assert_eq(info.classes, 256);
            for (int k = 0; k < 16; k++)
                cr_assert_eq(in_ids[k], (unsigned char)text[k]);
        } else {
            const struct tr_json *chars = tr_json_get(j, "chars");
            cr_assert_eq(chars->n, info.classes);
            for (int k = 0; k < 16; k++)
                cr_assert_eq((int)chars->items[in_ids[k]]->number, (unsigned char)text[k]);
        }
        destroy(&p, self);
        tr_json_free(j);
    }
}

Test(prepare, errors_and_csv)
{
    cr_assert_eq(prepare(tmp_path("missing.txt"), "-o", tmp_path("out"), NULL), 1);
    cr_assert(strstr(err_text, "missing.txt"), "%s", err_text);
    cr_assert_eq(prepare(tmp_path("x.txt"), NULL), 2, "no -o");
    cr_assert(strstr(err_text, "-o OUTDIR"), "%s", err_text);
    cr_assert_eq(prepare("x.txt", "-o", "out", "--dedup", "fuzzy", NULL), 2);
    cr_assert(strstr(err_text, "--dedup must be exact, near or none"), "%s", err_text);
    const char *blank = tmp_path("blank.txt");
    write_text(blank, "\n  \n\t\n");
    cr_assert_eq(prepare(blank, "-o", tmp_path("out"), NULL), 1);
    cr_assert(strstr(err_text, "no documents"), "%s", err_text);

    const char *bad = tmp_path("bad.csv");
    write_text(bad, "1,2,0\n3,4,1\n\n5,x,1\n6,7\n");
    cr_assert_eq(prepare(bad, "-o", tmp_path("csv"), NULL), 1);
    cr_assert(strstr(err_text, "bad.csv:4: column 1 \"x\" is not a number"), "%s", err_text);
    cr_assert(strstr(err_text, "bad.csv:5: expected 3 fields"), "%s", err_text);
    cr_assert_eq(count_files(tmp_path("csv"), ".csv"), 0, "nothing written on errors");

    const char *good = tmp_path("good.csv");
    write_text(good, "a, b ,label\r\n 1 , 2,0\r\n3,4,1\n\n1,2,0\n5.5,-6e1,2\n");
    cr_assert_eq(prepare(good, "-o", tmp_path("csv"), "--header", NULL), 0, "%s", err_text);
    char *clean = read_all(tmp_path("csv/data.csv"), NULL);
    cr_assert_str_eq(clean, "a,b,label\n1,2,0\n3,4,1\n5.5,-6e1,2\n");
    free(clean);
    cr_assert(strstr(out_text, "good.csv:5 \"1,2,0\""), "%s", out_text);
    struct tr_json *j = read_json(tmp_path("csv/prepare.json"));
    cr_assert_eq(json_at(j, "rows", "read"), 4);
    cr_assert_eq(json_at(j, "rows", "written"), 3);
    cr_assert_eq(json_at(j, "rows", "duplicates_removed"), 1);
    cr_assert_eq(tr_json_number(j, "columns", 0), 3);
    tr_json_free(j);
}

/* --format instruct reads untrusted JSONL: the records cut at every few
 * bytes, and bytes changed at random, are refused with a message or
 * prepared, never a crash; what is prepared always counts every token as
 * trained on or masked, and the shards hold exactly the tokens counted. */
Test(prepare, instruct_records_refused_or_prepared_never_crash)
{
    const char *dir = tmp_path("tok");
    mkdir(dir, 0755);
    size_t size;
    char *tok = read_all(TR_TEST_SRCDIR "/fixtures/tokenizer/bpe.json", &size);
    write_file(tmp_path("tok/tokenizer.json"), tok, size);
    free(tok);
    write_text(tmp_path("tok/tokenizer_config.json"),
               "{\"eos_token\": \"<|im_end|>\", \"chat_template\": \"{{'<|im_start|>' + "
               "message['role'] + '\\\\n' + message['content'] + '<|im_end|>'}}\"}");
    static const char records[] =
        "{\"prompt\": \"In the beginning\", \"response\": \" God created\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"And?\"}, "
        "{\"role\": \"assistant\", \"content\": \"The earth.\"}]}\n"
        "{\"prompt\": \"And God said,\", \"response\": \" Let there be light.\"}\n";
    /* tmp_path's buffers are reused: keep copies */
    char in[512], out[512], tokenizer[512], json[512], shard[512];
    snprintf(in, sizeof in, "%s", tmp_path("in.jsonl"));
    snprintf(out, sizeof out, "%s", tmp_path("out"));
    snprintf(tokenizer, sizeof tokenizer, "%s", tmp_path("tok/tokenizer.json"));
    snprintf(json, sizeof json, "%s", tmp_path("out/prepare.json"));
    snprintf(shard, sizeof shard, "%s", tmp_path("out/train_000000.bin"));
    unsigned rng = 12345;
    int prepared = 0, refused = 0;
    for (size_t round = 0; round < 2 * sizeof records; round += 3) {
        char text[sizeof records];
        size_t len = sizeof records - 1;
        memcpy(text, records, len);
        if (round < sizeof records) {
            len = round; /* cut */
        } else {
            for (int k = 0; k < 3; k++) { /* three bytes changed */
                rng = rng * 1103515245u + 12345u;
                text[(rng >> 8) % len] = (char)(rng >> 20);
            }
        }
        write_file(in, text, len);
        int skip = round % 2;
        int code = prepare(in, "-o", out, "--format", "instruct", "--tokenizer", tokenizer,
                           "--val-fraction", "0",
                           skip ? "--skip-bad-records" : NULL, NULL);
        cr_assert(code == 0 || code == 1, "round %zu: exit %d: %s", round, code, err_text);
        if (code == 1) {
            cr_assert(strstr(err_text, "trainrun prepare: error: "), "round %zu: %s", round,
                      err_text);
            refused++;
            continue;
        }
        prepared++;
        struct tr_json *j = read_json(json);
        double trained = tr_json_number(j, "trained_tokens", -1);
        double masked = tr_json_number(j, "masked_tokens", -1);
        double tokens = json_at(j, "train", "tokens");
        cr_assert_gt(trained, 0, "round %zu", round);
        cr_assert_eq(trained + masked, tokens, "round %zu", round);
        cr_assert_eq(shard_count_masked(shard), (uint64_t)tokens, "round %zu", round);
        tr_json_free(j);
    }
    cr_assert_gt(prepared, 5);
    cr_assert_gt(refused, 5);
}

/* ---- images: decoders, resize, TRIMAGES shards, augmentation, prepare, plugin ------ */

#include <math.h>
#include <png.h>
#include <trainrun/images.h>

#include "dataset/image_codec.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static unsigned char *fixture(const char *name, size_t *size)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/fixtures/images/%s", TR_TEST_SRCDIR, name);
    return (unsigned char *)read_all(path, size);
}

static struct tr_image decode_ok(const char *name, int channels)
{
    size_t size;
    unsigned char *data = fixture(name, &size);
    struct tr_image img;
    char why[512] = "";
    cr_assert_eq(tr_image_decode(data, size, channels, &img, why, sizeof why), 0, "%s: %s",
                 name, why);
    free(data);
    return img;
}

/* make-fixtures.py: pixel (x, y) of the 6x4 RGB images is (40x, 60y, 200 - 10x) */
static void expect_rgb_pattern(const struct tr_image *img, int tolerance, const char *name)
{
    cr_assert_eq(img->width, 6, "%s", name);
    cr_assert_eq(img->height, 4, "%s", name);
    cr_assert_eq(img->channels, 3, "%s", name);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 6; x++) {
            const unsigned char *p = img->pixels + (y * 6 + x) * 3;
            int want[3] = {40 * x, 60 * y, 200 - 10 * x};
            for (int c = 0; c < 3; c++)
                cr_assert_leq(abs(p[c] - want[c]), tolerance, "%s: pixel (%d,%d) channel %d is %d, "
                              "not %d", name, x, y, c, p[c], want[c]);
        }
}

TestSuite(images, .init = make_tmp, .fini = remove_tmp);

Test(images, png_jpeg_webp_decode_to_the_same_pixels)
{
    static const struct {
        const char *name;
        int tolerance;
    } cases[] = {{"rgb.png", 0}, {"rgb.webp", 0}, {"rgb.jpg", 6}, {"palette.png", 0}};
    for (size_t i = 0; i < N_OF(cases); i++) {
        struct tr_image img = decode_ok(cases[i].name, 3);
        expect_rgb_pattern(&img, cases[i].tolerance, cases[i].name);
        tr_image_free(&img);
    }
    /* grey: a grey PNG as stored; RGB files as BT.601 luma */
    struct tr_image g = decode_ok("grey.png", 1);
    cr_assert_eq(g.width, 5);
    cr_assert_eq(g.height, 3);
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 5; x++)
            cr_assert_eq(g.pixels[y * 5 + x], 50 * x + 20 * y);
    tr_image_free(&g);
    const char *rgb_files[] = {"rgb.png", "rgb.webp"};
    for (int f = 0; f < 2; f++) {
        g = decode_ok(rgb_files[f], 1);
        for (int y = 0; y < 4; y++)
            for (int x = 0; x < 6; x++) {
                double luma = 0.299 * 40 * x + 0.587 * 60 * y + 0.114 * (200 - 10 * x);
                cr_assert_leq(fabs(g.pixels[y * 6 + x] - luma), 1.01, "%s (%d,%d): %d vs %.1f",
                              rgb_files[f], x, y, g.pixels[y * 6 + x], luma);
            }
        tr_image_free(&g);
    }
    /* a grey file asked for RGB: the grey in every channel */
    g = decode_ok("grey.png", 3);
    cr_assert_eq(g.pixels[3 * 7], g.pixels[3 * 7 + 1]);
    cr_assert_eq(g.pixels[3 * 7], 50 * 2 + 20 * 1);
    tr_image_free(&g);
}

Test(images, alpha_is_composited_onto_black)
{
    const char *files[] = {"rgba.png", "rgba.webp"};
    for (int f = 0; f < 2; f++) {
        struct tr_image img = decode_ok(files[f], 3);
        const unsigned char *p = img.pixels;
        cr_assert(p[0] == 255 && p[1] == 0 && p[2] == 0, "%s: opaque red", files[f]);
        /* white at alpha 128: 128, composited in the stored values as PIL does */
        cr_assert(p[3] == 128 && p[4] == 128 && p[5] == 128, "%s: %d %d %d", files[f], p[3],
                  p[4], p[5]);
        cr_assert(p[6] == 0 && p[7] == 0 && p[8] == 0, "%s: transparent green is black",
                  files[f]);
        cr_assert(p[9] == 0 && p[10] == 0 && p[11] == 255, "%s: opaque blue", files[f]);
        tr_image_free(&img);
    }
}

Test(images, damaged_files_are_errors_never_crashes)
{
    const char *files[] = {"rgb.png", "rgb.jpg", "rgb.webp", "palette.png"};
    for (int f = 0; f < 4; f++) {
        size_t size;
        unsigned char *data = fixture(files[f], &size);
        /* every cut, and every single-byte change of the first 64 bytes */
        for (size_t cut = 0; cut < size; cut++) {
            struct tr_image img;
            char why[512] = "";
            int rc = tr_image_decode(data, cut, 3, &img, why, sizeof why);
            if (rc == 0) { /* only a cut after the last pixel data may still decode */
                cr_assert_gt(cut, size / 2, "%s cut at %zu decoded", files[f], cut);
                tr_image_free(&img);
            } else {
                cr_assert(why[0], "%s cut at %zu: no reason given", files[f], cut);
            }
        }
        for (size_t at = 0; at < size && at < 64; at++) {
            unsigned char keep = data[at];
            data[at] ^= 0x5A;
            struct tr_image img;
            char why[512];
            if (tr_image_decode(data, size, 3, &img, why, sizeof why) == 0)
                tr_image_free(&img);
            data[at] = keep;
        }
        free(data);
    }
    struct tr_image img;
    char why[512];
    cr_assert_eq(tr_image_decode((const unsigned char *)"GIF89a......", 12, 3, &img, why,
                                 sizeof why), -1);
    cr_assert(strstr(why, "not a PNG, JPEG or WebP"), "%s", why);
    size_t size;
    unsigned char *jpg = fixture("rgb.jpg", &size);
    cr_assert_eq(tr_image_decode(jpg, size - 8, 3, &img, why, sizeof why), -1);
    cr_assert(strstr(why, "truncated"), "%s", why);
    free(jpg);
    unsigned char *cmyk = fixture("cmyk.jpg", &size);
    cr_assert_eq(tr_image_decode(cmyk, size, 3, &img, why, sizeof why), -1, "CMYK: no conversion");
    cr_assert(strstr(why, "JPEG: "), "%s", why);
    free(cmyk);
    /* a header claiming a huge image is refused before any allocation */
    unsigned char *png = fixture("rgb.png", &size);
    png[16] = 0x7f; /* IHDR width's top byte (the CRC no longer matches either) */
    cr_assert_eq(tr_image_decode(png, size, 3, &img, why, sizeof why), -1);
    free(png);
}

Test(images, resize_shorter_side_then_centre_crop)
{
    /* a uniform image stays uniform at every ratio, up and down */
    unsigned char flat[7 * 5 * 3];
    memset(flat, 77, sizeof flat);
    struct tr_image in = {.width = 7, .height = 5, .channels = 3, .pixels = flat};
    unsigned char out[64 * 64 * 3];
    int sizes[] = {1, 2, 3, 5, 8, 31, 64};
    for (size_t s = 0; s < N_OF(sizes); s++) {
        tr_image_resize_crop(&in, sizes[s], out);
        for (int i = 0; i < sizes[s] * sizes[s] * 3; i++)
            cr_assert_eq(out[i], 77, "size %d byte %d", sizes[s], i);
    }
    /* the same size: the image itself */
    unsigned char ramp[4 * 4];
    for (int i = 0; i < 16; i++)
        ramp[i] = (unsigned char)(i * 16);
    struct tr_image r = {.width = 4, .height = 4, .channels = 1, .pixels = ramp};
    tr_image_resize_crop(&r, 4, out);
    cr_assert_eq(memcmp(out, ramp, 16), 0);
    /* halving averages each 2x2 block (area resampling) */
    tr_image_resize_crop(&r, 2, out);
    cr_assert_eq(out[0], (0 + 16 + 64 + 80) / 4);
    cr_assert_eq(out[3], (10 * 16 + 11 * 16 + 14 * 16 + 15 * 16) / 4);
    /* a 2x2 checkerboard of 0 and 255 shrunk to 1 pixel: their mean, no aliasing */
    unsigned char four[4] = {0, 255, 255, 0};
    struct tr_image q = {.width = 2, .height = 2, .channels = 1, .pixels = four};
    tr_image_resize_crop(&q, 1, out);
    cr_assert_eq(out[0], 128);
    unsigned char two[2] = {0, 255};
    struct tr_image t = {.width = 2, .height = 1, .channels = 1, .pixels = two};
    /* a wide image keeps its centre: 9x3 columns 0..8 of value 10 x column, size 3 */
    unsigned char wide[9 * 3];
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 9; x++)
            wide[y * 9 + x] = (unsigned char)(10 * x);
    struct tr_image w = {.width = 9, .height = 3, .channels = 1, .pixels = wide};
    tr_image_resize_crop(&w, 3, out);
    cr_assert(out[0] == 30 && out[1] == 40 && out[2] == 50, "%d %d %d", out[0], out[1], out[2]);
    /* doubling interpolates between neighbours: values stay inside the input's range */
    tr_image_resize_crop(&t, 4, out);
    for (int i = 0; i < 16; i++)
        cr_assert(out[i] <= 255);
    cr_assert_lt(out[0], out[3]);
}

static void header_rejected(const unsigned char *p, uint64_t size, const char *want)
{
    struct tr_images_header h;
    char why[256] = "";
    cr_assert_eq(tr_images_header_read(p, size, &h, why, sizeof why), -1, "accepted, wanted %s",
                 want);
    cr_assert(strstr(why, want), "\"%s\" lacks \"%s\"", why, want);
}

Test(images, shard_header_checks_and_checksum)
{
    struct tr_images_header h = {.version = TR_IMAGES_VERSION, .height = 2, .width = 3,
                                 .channels = 1, .count = 2, .classes = 5};
    size_t size = TR_IMAGES_HEADER_BYTES + 2 * 6 + 2 * 4;
    unsigned char file[128] = {0};
    for (int i = 0; i < 12; i++)
        file[TR_IMAGES_HEADER_BYTES + i] = (unsigned char)i;
    h.checksum = tr_images_checksum(file + TR_IMAGES_HEADER_BYTES, size - TR_IMAGES_HEADER_BYTES);
    tr_images_header_write(file, &h);
    struct tr_images_header back;
    char why[256] = "";
    cr_assert_eq(tr_images_header_read(file, size, &back, why, sizeof why), 0, "%s", why);
    cr_assert(back.height == 2 && back.width == 3 && back.channels == 1 && back.count == 2 &&
              back.classes == 5 && back.checksum == h.checksum);
    header_rejected(file, size - 1, "truncated");
    header_rejected(file, size + 4, "take");
    header_rejected(file, 10, "shorter than the 64-byte header");
    unsigned char bad[128];
    memcpy(bad, file, sizeof bad);
    bad[0] = 'X';
    header_rejected(bad, size, "magic");
    memcpy(bad, file, sizeof bad);
    bad[8] = 9;
    header_rejected(bad, size, "version 9");
    memcpy(bad, file, sizeof bad);
    bad[20] = 4;
    header_rejected(bad, size, "channels 1 or 3");
    memcpy(bad, file, sizeof bad);
    memset(bad + 24, 0xff, 8); /* count 2^64 - 1: no overflow into a small size */
    header_rejected(bad, size, "truncated");
    memcpy(bad, file, sizeof bad);
    memset(bad + 32, 0, 4);
    header_rejected(bad, size, "number of classes 0");
    /* the checksum fed in pieces of any length is the checksum of the whole */
    unsigned char body[1000];
    for (int i = 0; i < 1000; i++)
        body[i] = (unsigned char)(i * 7 + i / 13);
    uint64_t whole = tr_images_checksum(body, sizeof body);
    size_t pieces[] = {1, 3, 31, 32, 33, 100, 999};
    for (size_t k = 0; k < N_OF(pieces); k++) {
        struct tr_images_sum s;
        tr_images_sum_init(&s);
        for (size_t at = 0; at < sizeof body; at += pieces[k])
            tr_images_sum_update(&s, body + at,
                                 at + pieces[k] > sizeof body ? sizeof body - at : pieces[k]);
        cr_assert_eq(tr_images_sum_final(&s), whole, "pieces of %zu", pieces[k]);
    }
    body[500] ^= 1;
    cr_assert_neq(tr_images_checksum(body, sizeof body), whole, "one bit changes it");
}

Test(images, crop_and_flip_are_deterministic_and_in_bounds)
{
    int seen_dx[9] = {0}, mirrored = 0;
    for (uint64_t i = 0; i < 2000; i++) {
        uint64_t key = tr_images_key(7, i, i % 5);
        struct tr_images_view v = tr_images_draw(key, 4, 1), again = tr_images_draw(key, 4, 1);
        cr_assert(v.dy == again.dy && v.dx == again.dx && v.mirror == again.mirror);
        cr_assert(v.dy >= 0 && v.dy <= 8 && v.dx >= 0 && v.dx <= 8, "%d %d", v.dy, v.dx);
        seen_dx[v.dx]++;
        mirrored += v.mirror;
        struct tr_images_view none = tr_images_draw(key, 4, 0);
        cr_assert_eq(none.mirror, 0, "flip off never mirrors");
        struct tr_images_view still = tr_images_draw(key, 0, 0);
        cr_assert(still.dx == 0 && still.dy == 0, "pad 0: no shift");
    }
    for (int k = 0; k < 9; k++)
        cr_assert_gt(seen_dx[k], 2000 / 9 / 2, "offset %d drawn %d times", k, seen_dx[k]);
    cr_assert(mirrored > 800 && mirrored < 1200, "%d of 2000 mirrored", mirrored);
    cr_assert_neq(tr_images_key(1, 5, 0), tr_images_key(2, 5, 0), "the seed matters");
    cr_assert_neq(tr_images_key(1, 5, 0), tr_images_key(1, 5, 1), "so does the view");

    /* the view's pixels: a 4x4 ramp shifted by (dy, dx) - pad, zeros outside */
    unsigned char src[16], dst[16];
    for (int i = 0; i < 16; i++)
        src[i] = (unsigned char)(i + 1);
    struct tr_images_view v = {.dy = 0, .dx = 2, .mirror = 0}; /* pad 1: down 1, left 1 */
    tr_images_apply_u8(src, dst, 4, 4, 1, 1, &v);
    cr_assert_eq(dst[0], 0, "row 0 is padding");
    cr_assert_eq(dst[4], src[1], "row 1 col 0 reads source (0, 1)");
    cr_assert_eq(dst[4 + 3], 0, "column 3 reads source column 4: padding");
    v = (struct tr_images_view){.dy = 1, .dx = 1, .mirror = 1}; /* centred, mirrored */
    tr_images_apply_u8(src, dst, 4, 4, 1, 1, &v);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++)
            cr_assert_eq(dst[y * 4 + x], src[y * 4 + 3 - x]);
}

/* Write a w x h PNG of one grey level with libpng (the decoder's own library). */
static void write_png(const char *path, int w, int h, unsigned char level)
{
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)w;
    im.height = (png_uint_32)h;
    im.format = PNG_FORMAT_GRAY;
    unsigned char *px = malloc((size_t)w * h);
    for (int i = 0; i < w * h; i++)
        px[i] = level;
    cr_assert(png_image_write_to_file(&im, path, 0, px, 0, NULL), "%s", im.message);
    free(px);
}

/* An ImageFolder: root/<class>/<n>.png, n images per class, class c of grey level 40 c + n. */
static void make_folder(const char *root, const char *const *classes, int n_classes, int n)
{
    mkdir(root, 0755);
    for (int c = 0; c < n_classes; c++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", root, classes[c]);
        mkdir(dir, 0755);
        for (int k = 0; k < n; k++) {
            char path[1100];
            snprintf(path, sizeof path, "%s/%02d.png", dir, k);
            write_png(path, 6 + k, 5, (unsigned char)(40 * c + k));
        }
    }
}

static struct tr_data_info images_info(struct plugin *p, void *self)
{
    struct tr_data_info info = {.struct_size = sizeof info};
    tr_err err = {{0}};
    cr_assert_eq(data(p)->info(self, &info, &err), TR_OK, "%s", err.msg);
    return info;
}

static void images_read(struct plugin *p, void *self, enum tr_split split, uint64_t index,
                        float *x, int32_t *label)
{
    tr_err err = {{0}};
    cr_assert_eq(data(p)->read(self, split, &index, 1, x, label, &err), TR_OK, "%s", err.msg);
}

Test(images, prepare_folder_to_shards_the_plugin_reads)
{
    /* classes are the sorted subdirectory names, as ImageFolder's */
    const char *classes[] = {"zebra", "ant", "moth"};
    make_folder(tmp_path("train"), classes, 3, 4);
    const char *val_classes[] = {"moth", "ant"};
    make_folder(tmp_path("val"), val_classes, 2, 2);
    write_text(tmp_path("train/notes.txt"), "not a class");
    write_text(tmp_path("train/ant/readme.md"), "not an image");
    const char *out = tmp_path("out");
    cr_assert_eq(prepare(tmp_path("train"), "--val", tmp_path("val"), "--size", "4",
                         "--channels", "1", "-o", out, NULL), 0, "%s", err_text);
    cr_assert(strstr(out_text, "16 images in 3 classes -> 12 training and 4 validation"), "%s",
              out_text);
    cr_assert(strstr(out_text, "ignored 2 files"), "%s", out_text);
    char *names = read_all(tmp_path("out/classes.txt"), NULL);
    cr_assert_str_eq(names, "ant\nmoth\nzebra\n");
    free(names);
    struct tr_json *j = read_json(tmp_path("out/prepare.json"));
    cr_assert_eq(tr_json_number(j, "classes", 0), 3);
    const struct tr_json *cn = tr_json_get(j, "class_names");
    cr_assert(cn && cn->n == 3 && strcmp(cn->items[2]->string, "zebra") == 0);
    cr_assert_eq(tr_json_number(j, "train_images", 0), 12);
    tr_json_free(j);

    struct plugin p = load("data_images");
    set(&p, "dir", out);
    set(&p, "mean", "0");
    set(&p, "std", "1");
    void *self = create_ok(&p, 0);
    struct tr_data_info info = images_info(&p, self);
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN], 12);
    cr_assert_eq(info.samples[TR_SPLIT_VAL], 4);
    cr_assert_eq(info.input_len, 16);
    cr_assert_eq(info.input_dtype, TR_F32);
    cr_assert_eq(info.classes, 3);
    cr_assert_leq(info.train_views, 1, "no augmentation: one view");
    /* sample k of class c (sorted: ant 0, moth 1, zebra 2) is uniform grey 40 c' + k,
     * c' its index in the list it was made from */
    const int made[3] = {1, 2, 0}; /* ant, moth, zebra in `classes` */
    for (uint64_t i = 0; i < 12; i++) {
        float x[16];
        int32_t label;
        images_read(&p, self, TR_SPLIT_TRAIN, i, x, &label);
        cr_assert_eq(label, (int32_t)(i / 4));
        float want = (float)(40 * made[label] + i % 4) / 255.0f;
        for (int k = 0; k < 16; k++)
            cr_assert_float_eq(x[k], want, 1e-6, "sample %llu pixel %d", (unsigned long long)i, k);
    }
    float x[16];
    int32_t label;
    images_read(&p, self, TR_SPLIT_VAL, 0, x, &label);
    cr_assert_eq(label, 0, "the validation folder's ant is class 0 too");
    destroy(&p, self);

    /* a validation class the training folders lack is an error naming it */
    const char *extra[] = {"wasp"};
    make_folder(tmp_path("val2"), extra, 1, 1);
    cr_assert_eq(prepare(tmp_path("train"), "--val", tmp_path("val2"), "--size", "4", "-o",
                         tmp_path("out2"), NULL), 1);
    cr_assert(strstr(err_text, "'wasp'"), "%s", err_text);
    /* usage errors: --val with --val-fraction, a channel count other than 1 or 3, image
     * options with text inputs */
    cr_assert_eq(prepare(tmp_path("train"), "--val", tmp_path("val"), "--val-fraction", "0.1",
                         "--size", "4", "-o", tmp_path("out5"), NULL), 2);
    cr_assert(strstr(err_text, "leave out --val-fraction"), "%s", err_text);
    cr_assert_eq(prepare(tmp_path("train"), "--channels", "2", "--size", "4", "-o",
                         tmp_path("out5"), NULL), 2);
    cr_assert(strstr(err_text, "--channels must be 3 (RGB) or 1 (grey)"), "%s", err_text);
    write_text(tmp_path("t.txt"), "text\n");
    cr_assert_eq(prepare(tmp_path("t.txt"), "--size", "4", "-o", tmp_path("out5"), NULL), 2);
    cr_assert(strstr(err_text, "go with --format images"), "%s", err_text);
    /* --size is required; an empty class folder is refused */
    cr_assert_eq(prepare(tmp_path("train"), "-o", tmp_path("out3"), NULL), 1);
    cr_assert(strstr(err_text, "--size"), "%s", err_text);
    mkdir(tmp_path("train/empty"), 0755);
    cr_assert_eq(prepare(tmp_path("train"), "--size", "4", "-o", tmp_path("out4"), NULL), 1);
    cr_assert(strstr(err_text, "holds no .png"), "%s", err_text);
}

Test(images, val_fraction_and_offline_copies_are_deterministic)
{
    const char *classes[] = {"a", "b"};
    make_folder(tmp_path("in"), classes, 2, 20);
    const char *outs[] = {tmp_path("o1"), tmp_path("o2"), tmp_path("o3")};
    const char *seeds[] = {"5", "5", "6"}, *workers[] = {"1", "3", "2"};
    for (int r = 0; r < 3; r++)
        cr_assert_eq(prepare(tmp_path("in"), "--size", "8", "--val-fraction", "0.25",
                             "--augment-copies", "2", "--augment-pad", "2", "--augment-flip",
                             "--seed", seeds[r], "--workers", workers[r], "-o", outs[r], NULL),
                     0, "%s", err_text);
    struct tr_json *j = read_json(tmp_path("o1/prepare.json"));
    double originals = tr_json_number(j, "train_originals", 0);
    double val = tr_json_number(j, "val_images", 0);
    cr_assert_eq(originals + val, 40);
    cr_assert(val >= 4 && val <= 18, "about a quarter validates: %g", val);
    cr_assert_eq(tr_json_number(j, "train_images", 0), originals * 3, "two copies each");
    tr_json_free(j);
    size_t n1, n2, n3;
    char *s1 = read_all(tmp_path("o1/train_000000.bin"), &n1);
    char *s2 = read_all(tmp_path("o2/train_000000.bin"), &n2);
    char *s3 = read_all(tmp_path("o3/train_000000.bin"), &n3);
    cr_assert(n1 == n2 && memcmp(s1, s2, n1) == 0,
              "the same seed, the same shard, with one decoding thread or three");
    cr_assert(n1 != n3 || memcmp(s1, s3, n1) != 0, "another seed, other copies or split");
    /* the copies are views of the image before them: a crop of a uniform image is the
     * image with some rows or columns of zeros */
    struct tr_images_header h;
    char why[256];
    cr_assert_eq(tr_images_header_read((unsigned char *)s1, n1, &h, why, sizeof why), 0, "%s", why);
    const unsigned char *px = (unsigned char *)s1 + TR_IMAGES_HEADER_BYTES;
    size_t per = 8 * 8 * 3;
    for (uint64_t i = 0; i < h.count; i += 3) {
        unsigned char level = px[i * per];
        for (int c = 1; c <= 2; c++)
            for (size_t k = 0; k < per; k++) {
                unsigned char v = px[(i + c) * per + k];
                cr_assert(v == 0 || v == level, "copy %d of image %llu: %d", c,
                          (unsigned long long)i, v);
            }
    }
    free(s1);
    free(s2);
    free(s3);
}

Test(images, webdataset_tars_and_bad_records)
{
    char shard[1024], bad[1024];
    snprintf(shard, sizeof shard, "%s/fixtures/images/shard-000.tar", TR_TEST_SRCDIR);
    snprintf(bad, sizeof bad, "%s/fixtures/images/bad.tar", TR_TEST_SRCDIR);
    const char *out = tmp_path("out");
    cr_assert_eq(prepare(shard, "--val", shard, "--size", "4", "-o", out, NULL), 0, "%s",
                 err_text);
    cr_assert(strstr(out_text, "6 images in 3 classes -> 3 training and 3 validation"), "%s",
              out_text);
    struct plugin p = load("data_images");
    set(&p, "dir", out);
    set(&p, "mean", "0");
    set(&p, "std", "1");
    void *self = create_ok(&p, 0);
    const int32_t want[3] = {2, 0, 1};
    float png[48], x[48];
    int32_t label;
    images_read(&p, self, TR_SPLIT_TRAIN, 0, png, &label);
    cr_assert_eq(label, 2);
    for (uint64_t i = 1; i < 3; i++) {
        images_read(&p, self, TR_SPLIT_TRAIN, i, x, &label);
        cr_assert_eq(label, want[i], "sample %llu", (unsigned long long)i);
        for (int k = 0; k < 48; k++) /* the same picture as PNG, JPEG and WebP */
            cr_assert_float_eq(x[k], png[k], 8 / 255.0, "sample %llu value %d", (unsigned long long)i, k);
    }
    destroy(&p, self);

    /* a sample without .cls stops prepare naming it, unless --skip-bad-records */
    cr_assert_eq(prepare(bad, "--size", "4", "--val-fraction", "0", "-o", tmp_path("b1"), NULL), 1);
    cr_assert(strstr(err_text, "bad.tar: sample b: no .cls member"), "%s", err_text);
    cr_assert(strstr(err_text, "--skip-bad-records"), "%s", err_text);
    cr_assert_eq(prepare(bad, "--size", "4", "--val-fraction", "0", "--skip-bad-records", "-o",
                         tmp_path("b2"), NULL), 0, "%s", err_text);
    cr_assert(strstr(out_text, "1 images in 2 classes -> 1 training"), "%s", out_text);
    cr_assert(strstr(out_text, "skipped 2 samples"), "%s", out_text);
    cr_assert(strstr(err_text, "c.png: PNG: "), "the cut image is named: %s", err_text);
    /* a tar cut in the middle of a member is an error, not a crash */
    size_t size;
    char *t = read_all(shard, &size);
    write_file(tmp_path("cut.tar"), t, 1200);
    free(t);
    cr_assert_eq(prepare(tmp_path("cut.tar"), "--size", "4", "-o", tmp_path("b3"), NULL), 1);
    cr_assert(strstr(err_text, "cut.tar"), "%s", err_text);
}

Test(images, plugin_augments_training_only_and_checks_its_shards)
{
    const char *classes[] = {"a", "b"};
    make_folder(tmp_path("in"), classes, 2, 8);
    const char *out = tmp_path("out");
    cr_assert_eq(prepare(tmp_path("in"), "--size", "8", "--channels", "1", "--val-fraction",
                         "0.25", "-o", out, NULL), 0, "%s", err_text);
    struct plugin p = load("data_images");
    set(&p, "dir", out);
    set(&p, "pad", "3");
    set(&p, "flip", "true");
    void *self = create_ok(&p, 0);
    struct tr_data_info info = images_info(&p, self);
    uint64_t n = info.samples[TR_SPLIT_TRAIN] / info.train_views;
    cr_assert_eq(info.train_views, 16, "pad set: 16 views by default");
    cr_assert_eq(info.samples[TR_SPLIT_TRAIN] % n, 0);
    /* defaults: mean 0.5, std 0.5: pixel 0 (padding) is -1 */
    float a[64], b[64];
    int32_t la, lb;
    int differ = 0, padded = 0;
    for (uint64_t v = 0; v < 16; v++) {
        images_read(&p, self, TR_SPLIT_TRAIN, v * n + 1, a, &la);
        images_read(&p, self, TR_SPLIT_TRAIN, v * n + 1, b, &lb);
        cr_assert(la == lb && memcmp(a, b, sizeof a) == 0, "the same index, the same sample");
        float level = NAN;
        for (int k = 0; k < 64; k++) {
            cr_assert(a[k] >= -1.0f && a[k] <= 1.0f);
            if (a[k] == -1.0f)
                padded = 1;
            else if (isnan(level))
                level = a[k];
            else
                cr_assert_float_eq(a[k], level, 1e-6, "a uniform image stays uniform");
        }
        if (v > 0) {
            float first[64];
            images_read(&p, self, TR_SPLIT_TRAIN, 1, first, &la);
            differ |= memcmp(first, a, sizeof a) != 0;
        }
    }
    cr_assert(differ && padded, "views differ, and some show the padding");
    /* validation: never augmented */
    images_read(&p, self, TR_SPLIT_VAL, 0, a, &la);
    for (int k = 1; k < 64; k++)
        cr_assert_eq(a[k], a[0]);
    destroy(&p, self);

    /* options */
    set(&p, "mean", "0.485,0.456,0.406");
    create_fails(&p, 0, "3 values", "1 channel");
    set(&p, "mean", "0.5");
    set(&p, "std", "0");
    create_fails(&p, 0, "std must be positive", NULL);
    set(&p, "std", "0.5,x");
    create_fails(&p, 0, "std", "one number");
    set(&p, "std", "0.5");
    set(&p, "pad", "8");
    create_fails(&p, 0, "pad = 8", NULL);
    set(&p, "pad", "0");
    set(&p, "dir", tmp_path("nowhere"));
    create_fails(&p, 0, "nowhere", "data.dir");

    /* a changed byte is caught by the checksum, a cut file by the header */
    set(&p, "dir", out);
    size_t size;
    char *shard = read_all(tmp_path("out/train_000000.bin"), &size);
    shard[TR_IMAGES_HEADER_BYTES + 5] ^= 1;
    write_file(tmp_path("out/train_000000.bin"), shard, size);
    create_fails(&p, 0, "train_000000.bin", "checksum");
    set(&p, "verify", "false");
    destroy(&p, create_ok(&p, 0));
    write_file(tmp_path("out/train_000000.bin"), shard, size - 3);
    create_fails(&p, 0, "train_000000.bin", "truncated");
    /* a label beyond the classes */
    shard[TR_IMAGES_HEADER_BYTES + 5] ^= 1;
    shard[size - 4] = 9;
    write_file(tmp_path("out/train_000000.bin"), shard, size);
    create_fails(&p, 0, "class 9", NULL);
    free(shard);
}
