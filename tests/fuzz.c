/*
 * A mutation fuzzer for everything trainrun reads from files a user may have
 * been handed: recipes, token shards, CSV, IDX, images (PNG, JPEG, WebP) and image
 * shards, text and JSONL files, chat templates (tokenizer_config.json), the text
 * plugin's token cache, safetensors files and headers, and checkpoints
 * (state.json, model.safetensors and a sharded checkpoint's layout.json); and for the one C function recipe
 * code can call, the op table's answer (trainrun.ops' shape).  docs/testing.md says how to run it
 * for longer and how to reproduce a failure.
 *
 *   tests/fuzz [--cases N] [--seed N] [--target NAME]   mutated cases
 *   tests/fuzz --replay TARGET FILE...                   run saved inputs
 *   tests/fuzz --list                                    the targets
 *
 * Every case runs in a child process of its own (a new process group), so a
 * crash, a sanitizer report or a hang is caught and named, not fatal to the
 * run.  A case passes when the code under test returns, with success or a
 * clean error, and every invariant the driver checks holds (token ids below
 * the vocabulary, finite features, tensors inside their file, a damaged
 * cache read back as the text it caches, ...).  Whole-binary cases run the
 * `trainrun` binary and pass when it exits 0, 1 or 2 and prints no
 * sanitizer report.
 *
 * Inputs start from seeds: files of the source tree (recipes, the tiny GPT
 * fixture), small valid files made here, and every file under
 * tests/fuzz-corpus/TARGET/, which also run unmutated each time: that is
 * where the reproducer of every fixed crash lives (a file named reject-*
 * there must be refused with an error, not accepted).  Case i of seed S is the
 * same input on every machine; a failing input is saved under
 * $TR_FUZZ_OUT (default ./fuzz-failures) with the command that replays it.
 * Options a case runs with (seq_len, val_fraction, tokenizer, ...) are
 * chosen from a hash of its input, so a saved input replays exactly.
 *
 * Environment: TR_FUZZ_CASES (default 2000), TR_FUZZ_SEED (default
 * 20261124), TR_FUZZ_TIMEOUT (seconds per case, default 20), TR_FUZZ_OUT,
 * TR_FUZZ_NOFORK=1 (run cases in this process: for a debugger), and from
 * `make check`: TR_SRCDIR, TR_PLUGIN_BUILD_DIR and TRAINRUN (without
 * TRAINRUN the whole-binary targets are skipped).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <trainrun/mix.h>
#include <trainrun/plugin.h>
#include <trainrun/tokens.h>

#include "util/json.h"
#include "commands/prepare.h"
#include "config/recipe_ops.h"
#include "dataset/image_codec.h"
#include <trainrun/images.h>
#include "config/hf_config.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "engine/hf_weights.h"
#include "engine/checkpoint_shard.h"
#include "remove_tree.h"
#include "util/safetensors.h"
#include "option_text.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

#define FUZZ_MAX_INPUT (1u << 20) /* mutated inputs are capped at 1 MiB */

/* ---- small helpers ---------------------------------------------------------- */

struct buf {
    unsigned char *p;
    size_t n;
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

/* An invariant of the code under test does not hold: the case fails. */
static void broken(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void broken(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: INVARIANT BROKEN: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    _exit(3);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory");
    return p;
}

static int read_file(const char *path, struct buf *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 4096, n = 0;
    unsigned char *p = xmalloc(cap);
    size_t got;
    while ((got = fread(p + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap)
            p = realloc(p, cap *= 2);
        if (!p)
            die("out of memory");
    }
    fclose(f);
    out->p = p;
    out->n = n;
    return 0;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0)
        die("cannot write %s: %s", path, strerror(errno));
}

static void write_text(const char *path, const char *text)
{
    write_file(path, text, strlen(text));
}

static uint64_t below(uint64_t *rng, uint64_t n) { return n ? tr_splitmix64_next(rng) % n : 0; }

static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h ^ (uint64_t)n;
}

static void le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void be32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (24 - 8 * i));
}

static uint32_t get_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The input is a corpus file named reject-*: parsing or opening it must
 * fail (with a message).  That is how a fix that turns a silently wrong
 * accept into an error keeps its regression case. */
static int must_reject;

static void accepted(const char *what)
{
    if (must_reject)
        broken("%s accepted an input that must be rejected", what);
}

/* ---- plugins, loaded once before the cases fork ------------------------------ */

static void quiet_log(enum tr_log_level level, const char *who, const char *fmt, ...)
{
    (void)level;
    (void)who;
    (void)fmt;
}

static void *host_alloc(size_t size) { return aligned_alloc(64, (size + 63) / 64 * 64); }

static const struct tr_host host = {
    .struct_size = sizeof(struct tr_host),
    .log = quiet_log,
    .alloc = host_alloc,
    .free = free,
};

struct plugin {
    const char *file;
    const struct tr_plugin_info *info;
};

static struct plugin plugins[] = {
    {"data_tokens", NULL}, {"data_csv", NULL}, {"data_idx", NULL}, {"data_text", NULL},
    {"data_images", NULL},
};
enum { P_TOKENS, P_CSV, P_IDX, P_TEXT, P_IMAGES };

static void load_plugins(void)
{
    const char *dir = getenv("TR_PLUGIN_BUILD_DIR");
    if (!dir || !*dir)
        die("set TR_PLUGIN_BUILD_DIR to the directory of the built plugins (make check does)");
    for (size_t i = 0; i < sizeof plugins / sizeof plugins[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.so", dir, plugins[i].file);
        void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!dl)
            die("dlopen %s: %s", path, dlerror());
        tr_plugin_entry_fn entry = (tr_plugin_entry_fn)dlsym(dl, TR_PLUGIN_ENTRY_NAME);
        if (!entry)
            die("%s does not export %s", path, TR_PLUGIN_ENTRY_NAME);
        plugins[i].info = entry();
    }
}

/* A config filled with the plugin's defaults, then name=value pairs. */
struct config {
    max_align_t storage[64];
};

static void set_option(const struct plugin *p, struct config *c, const char *name,
                       const char *text)
{
    for (const struct tr_option *o = p->info->options; o && o->type != TR_OPT_END; o++) {
        if (strcmp(o->name, name) != 0)
            continue;
        set_text(o, c->storage, text);
        return;
    }
    die("plugin %s has no option %s", p->info->name, name);
}

static void config_init(const struct plugin *p, struct config *c)
{
    if (p->info->config_size > sizeof c->storage)
        die("plugin %s: config too large for the fuzzer", p->info->name);
    memset(c, 0, sizeof *c);
    for (const struct tr_option *o = p->info->options; o && o->type != TR_OPT_END; o++)
        if (o->default_value)
            set_option(p, c, o->name, o->default_value);
}

static int create(const struct plugin *p, const struct config *c, uint32_t seq_len,
                  void **self, tr_err *err)
{
    struct tr_create_args args = {
        .struct_size = sizeof args, .run_dir = ".", .recipe_dir = ".",
        .seq_len = seq_len, .seed = 1, .rank = 0, .world = 1,
        .local_rank = 0, .local_world = 1, .device = "cpu",
    };
    *self = NULL;
    err->msg[0] = '\0';
    int rc = p->info->create(&host, c->storage, &args, self, err);
    if (rc != TR_OK && !err->msg[0])
        broken("%s: create failed without a message", p->info->name);
    if (rc == TR_OK)
        accepted(p->info->name);
    return rc;
}

/* Read samples of both splits (all of them, up to `most` per split, else
 * the first, the last and a spread between) and check every value: token
 * ids and labels in [0, classes), features finite.  With `out`, the inputs
 * and targets read are appended there (to compare two reads). */
static void read_samples(const struct plugin *p, void *self, uint64_t most, struct buf *out)
{
    const struct tr_data_vtable *vt = p->info->vtable;
    struct tr_data_info info = {0};
    tr_err err = {{0}};
    if (vt->info(self, &info, &err) != TR_OK)
        return;
    if (info.classes == 0 || info.classes > INT32_MAX)
        broken("%s: %u classes: a model cannot be built for that", p->info->name,
               info.classes);
    if (info.input_len == 0 || info.target_len == 0)
        broken("%s: samples of %u inputs and %u targets", p->info->name, info.input_len,
               info.target_len);
    size_t in_size = info.input_dtype == TR_I32 || info.input_dtype == TR_F32 ? 4 : 0;
    if (!in_size)
        broken("%s: input dtype %d", p->info->name, (int)info.input_dtype);
    for (int split = 0; split < TR_SPLIT_COUNT; split++) {
        uint64_t n = info.samples[split];
        if (n == 0)
            continue;
        uint64_t count = n < most ? n : most;
        uint64_t *idx = xmalloc(count * sizeof *idx);
        for (uint64_t i = 0; i < count; i++)
            idx[i] = n <= most ? i : i == count - 1 ? n - 1 : i * (n / count);
        void *in = xmalloc(count * info.input_len * in_size);
        int32_t *tg = xmalloc(count * info.target_len * sizeof *tg);
        if (vt->read(self, (enum tr_split)split, idx, count, in, tg, &err) == TR_OK) {
            /* -1: a target the loss skips (the tokens plugin's masked tokens) */
            for (uint64_t i = 0; i < count * info.target_len; i++)
                if (tg[i] < -1 || (tg[i] >= 0 && (uint32_t)tg[i] >= info.classes))
                    broken("%s: target %d of split %d is neither -1 nor in [0, %u)",
                           p->info->name, tg[i], split, info.classes);
            for (uint64_t i = 0; i < count * info.input_len; i++) {
                if (info.input_dtype == TR_I32) {
                    int32_t v = ((int32_t *)in)[i];
                    if (v < 0 || (uint32_t)v >= info.classes)
                        broken("%s: token %d of split %d is not in [0, %u)", p->info->name, v,
                               split, info.classes);
                } else if (!isfinite(((float *)in)[i])) {
                    broken("%s: feature %llu of split %d is %g", p->info->name,
                           (unsigned long long)i, split, ((float *)in)[i]);
                }
            }
            if (out) {
                size_t a = count * info.input_len * in_size, b = count * info.target_len * 4;
                out->p = realloc(out->p, out->n + a + b);
                if (!out->p)
                    die("out of memory");
                memcpy(out->p + out->n, in, a);
                memcpy(out->p + out->n + a, tg, b);
                out->n += a + b;
            }
        } else if (!err.msg[0]) {
            broken("%s: read failed without a message", p->info->name);
        }
        free(idx);
        free(in);
        free(tg);
    }
}

/* An instance with config c (a failed create is a finding only without a
 * message, see create), its samples read and checked, then destroyed. */
static int create_and_read(const struct plugin *p, const struct config *c, uint32_t seq_len,
                           uint64_t most, struct buf *out)
{
    void *self;
    tr_err err;
    if (create(p, c, seq_len, &self, &err) != TR_OK)
        return TR_ERROR;
    read_samples(p, self, most, out);
    p->info->destroy(self);
    return TR_OK;
}

/* ---- targets ----------------------------------------------------------------- */

static const char *srcdir;   /* the source tree */
static const char *trainrun; /* the binary, or NULL */
static char template_dir[4200]; /* a run with a checkpoint, made once */
static int have_template;

/* Options chosen from the input's hash, so that a saved input replays. */
static const char *pick(uint64_t *h, const char *const *choices, size_t n)
{
    return choices[below(h, n)];
}
#define CHOOSE(h, ...) pick(h, (const char *const[]){__VA_ARGS__}, \
                            sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

static void walk_json(const struct tr_json *j, int depth)
{
    if (!j)
        return;
    if (depth > 200)
        broken("json: nesting deeper than the parser allows");
    if (j->type == TR_JSON_STRING && !j->string)
        broken("json: a string without text");
    if ((j->type == TR_JSON_ARRAY || j->type == TR_JSON_OBJECT) && j->n && !j->items)
        broken("json: items missing");
    for (size_t i = 0; i < j->n; i++) {
        if (j->type == TR_JSON_OBJECT && !j->keys[i])
            broken("json: a key missing");
        walk_json(j->items[i], depth + 1);
    }
}

static void target_json(const struct buf *in, uint64_t h)
{
    (void)h;
    size_t bad = 0;
    struct tr_json *j = tr_json_parse((const char *)in->p, in->n, &bad);
    if (!j && bad > in->n)
        broken("json: error offset %zu beyond the %zu bytes", bad, in->n);
    if (j)
        accepted("json");
    walk_json(j, 0);
    (void)tr_json_number(j, "step", 0);
    (void)tr_json_string(j, "recipe");
    (void)tr_json_get(tr_json_get(j, "checksums"), "model.safetensors");
    tr_json_free(j);
}

/* layout.json of a sharded checkpoint: refused with a message, or accepted
 * with every slot of every tensor covered exactly once by ranges inside
 * their tensor and blob; and what is accepted, written back, reads the
 * same. */
static void check_layout(const struct tr_ckpt_layout *l)
{
    if (l->world < 1 || l->world > TR_CKPT_MAX_WORLD || l->n_slots < 1 ||
        l->n_slots > TR_CKPT_MAX_SLOTS || l->n_blobs < 1)
        broken("layout: world %d, %d slots, %zu blobs accepted", l->world, l->n_slots, l->n_blobs);
    for (size_t i = 0; i < l->n_tensors; i++) {
        const struct tr_ckpt_tensor *t = &l->tensors[i];
        uint64_t next[TR_CKPT_MAX_SLOTS] = {0};
        if (t->first + t->n > l->n_entries)
            broken("layout: '%s' has entries past the list", t->name);
        for (size_t j = 0; j < t->n; j++) {
            const struct tr_ckpt_entry *e = &l->entries[t->first + j];
            if ((int)e->slot >= l->n_slots || e->blob >= l->n_blobs || e->begin != next[e->slot] ||
                e->end <= e->begin || e->end > t->numel ||
                e->offset + (e->end - e->begin) * 4 > l->blobs[e->blob].bytes)
                broken("layout: '%s' entry %zu is incoherent", t->name, j);
            next[e->slot] = e->end;
        }
        for (int s = 0; s < (t->buffer ? 1 : l->n_slots); s++)
            if (next[s] != t->numel)
                broken("layout: '%s' slot %d is not covered", t->name, s);
    }
}

static void target_layout(const struct buf *in, uint64_t h)
{
    (void)h;
    tr_err err = {{0}};
    struct tr_ckpt_layout *l = NULL, *back = NULL;
    if (tr_ckpt_layout_parse((const char *)in->p, in->n, "ckpt/layout.json", &l, &err) != TR_OK) {
        if (!err.msg[0] || !strstr(err.msg, "ckpt/layout.json"))
            broken("layout: rejected without a message naming the file (%s)", err.msg);
        return;
    }
    accepted("layout");
    check_layout(l);
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    tr_ckpt_layout_write(f, l);
    fclose(f);
    if (tr_ckpt_layout_parse(text, size, "again", &back, &err) != TR_OK)
        broken("layout: written back, it is refused: %s", err.msg);
    if (back->n_entries != l->n_entries || back->n_tensors != l->n_tensors ||
        back->world != l->world)
        broken("layout: written back, it reads otherwise");
    tr_ckpt_layout_free(back);
    tr_ckpt_layout_free(l);
    free(text);
}

/* tokenizer.json of a model directory (prepare --tokenizer, sample): a file accepted
 * encodes and decodes texts (byte-level ones with byte fallback and decoder chains among
 * them) without reading or writing out of bounds; one refused says why. */
static void target_tokenizer(const struct buf *in, uint64_t h)
{
    tr_err err = {{0}};
    struct tr_tokenizer *t = tr_tokenizer_parse((const char *)in->p, in->n, "tokenizer.json", &err);
    if (!t) {
        if (!err.msg[0])
            broken("tokenizer: rejected without a message");
        return;
    }
    accepted("tokenizer");
    static const char *const texts[] = {"", "ab ab", " \xc4\xa0x\n\n", "\xe4\xb8\xad\xf0\x9f\x98\x80 a",
                                        "<|endoftext|>a b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        const char *x = texts[(k + h) % (sizeof texts / sizeof texts[0])];
        int32_t *ids = NULL;
        size_t n = 0;
        if (tr_tokenizer_encode(t, x, strlen(x), &ids, &n, &err) != TR_OK) {
            if (!err.msg[0])
                broken("tokenizer: encode failed without a message");
            continue;
        }
        char *out = NULL;
        size_t len = 0;
        if (tr_tokenizer_decode(t, ids, n, &out, &len, &err) == TR_OK)
            free(out);
        for (size_t i = 1; i <= n; i++) {
            out = NULL;
            if (tr_tokenizer_decode_next(t, ids, i, &out, &len, &err) == TR_OK)
                free(out);
        }
        free(ids);
    }
    tr_tokenizer_free(t);
}

/* tokenizer_config.json's chat_template (prepare --format instruct, sample --chat): a
 * template read renders a conversation, with and without a system message, as text that
 * starts with its BOS or turn opener and holds every content, with the assistant's bytes
 * and only bytes of the text marked trained; one not rendered says why. */
static void target_chat_template(const struct buf *in, uint64_t h)
{
    (void)h;
    tr_err err = {{0}};
    struct tr_chat_template ct;
    if (tr_chat_template_read(&ct, (const char *)in->p, in->n, "tokenizer_config.json", &err)
        != TR_OK) {
        if (!err.msg[0])
            broken("chat-template: rejected without a message");
        return;
    }
    if (ct.family == TR_CHAT_NONE) {
        if (!ct.why[0])
            broken("chat-template: not rendered, without saying why");
        tr_chat_template_free(&ct);
        return;
    }
    accepted("chat-template");
    struct tr_chat_message m[] = {{"system", " Be brief.\n"}, {"user", "Hi"},
                                  {"assistant", "\xe3\x80\x80Hello\t"}};
    for (int sys = 0; sys < 2; sys++) {
        char *text = NULL;
        size_t len = 0, trained = 0;
        unsigned char *bits = NULL;
        if (tr_chat_render(&ct, m + 1 - sys, 2 + (size_t)sys, sys, &text, &len, &bits, &err)
            != TR_OK)
            broken("chat-template: a template read does not render: %s", err.msg);
        const char *start = ct.bos ? ct.bos : ct.opener;
        if (len != strlen(text) || strncmp(text, start, strlen(start)) != 0 ||
            !strstr(text, "Hi") || !strstr(text, "Hello") || !strstr(text, ct.end_of_turn))
            broken("chat-template: rendered as %.200s", text);
        for (size_t i = 0; i < len; i++) {
            if (bits[i] > 1)
                broken("chat-template: mask byte %zu is %d", i, bits[i]);
            trained += bits[i];
        }
        if (trained < strlen("Hello") + strlen(ct.end_of_turn))
            broken("chat-template: %zu bytes trained on", trained);
        free(text);
        free(bits);
    }
    tr_chat_template_free(&ct);
}

/* config.json of a Hugging Face directory (model = { from = DIR }): what is
 * accepted is in range, and writing it back reads as the same model. */
static void target_hf_config(const struct buf *in, uint64_t h)
{
    (void)h;
    tr_err err = {{0}};
    struct tr_hf_arch a, b;
    if (tr_hf_config_parse((const char *)in->p, in->n, "config.json", &a, &err) != TR_OK) {
        if (!err.msg[0])
            broken("hf-config: rejected without a message");
        return;
    }
    accepted("hf-config");
    if (a.vocab < 2 || a.dim < 1 || a.layers < 1 || a.heads < 1 || a.kv_heads < 1 ||
        a.dim % a.heads || a.heads % a.kv_heads || a.ffn_dim < 1 || a.ctx < 1 ||
        !(a.norm_eps > 0 && a.norm_eps < 1) ||
        (a.rope_factor != 0 && !(a.rope_factor >= 1 && a.rope_high_freq_factor > a.rope_low_freq_factor &&
                                 a.rope_low_freq_factor > 0 && a.rope_original_ctx >= 1)))
        broken("hf-config: accepted vocab %lld dim %lld layers %lld heads %lld/%lld ffn %lld ctx %lld",
               (long long)a.vocab, (long long)a.dim, (long long)a.layers, (long long)a.heads,
               (long long)a.kv_heads, (long long)a.ffn_dim, (long long)a.ctx);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tr_hf_config_write(&a, "float32", f);
    fclose(f);
    if (tr_hf_config_parse(text, len, "written", &b, &err) != TR_OK)
        broken("hf-config: what trainrun writes does not read back: %s", err.msg);
    if (a.family != b.family || a.vocab != b.vocab || a.dim != b.dim || a.layers != b.layers ||
        a.heads != b.heads || a.kv_heads != b.kv_heads || a.ffn_dim != b.ffn_dim ||
        a.ctx != b.ctx || a.tie_embeddings != b.tie_embeddings || a.qkv_bias != b.qkv_bias ||
        a.norm_eps != b.norm_eps || (a.family == TR_HF_LLAMA && a.rope_theta != b.rope_theta) ||
        a.rope_factor != b.rope_factor || a.rope_low_freq_factor != b.rope_low_freq_factor ||
        a.rope_high_freq_factor != b.rope_high_freq_factor || a.rope_original_ctx != b.rope_original_ctx)
        broken("hf-config: written and read back, the model differs:\n%s", text);
    free(text);
    /* the tensor list of a small enough model (the names of a huge one are
     * only more of the same) */
    if (a.layers <= 64) {
        struct tr_hf_tensor *t = NULL;
        size_t n = tr_hf_tensors(&a, a.ctx, &t);
        for (size_t i = 0; i < n; i++)
            if (t[i].shape[0] < 1 || (t[i].ndim == 2 && t[i].shape[1] < 1))
                broken("hf-config: tensor %s has an empty shape", t[i].name);
        tr_hf_tensors_free(t, n);
    }
}

static void target_safetensors(const struct buf *in, uint64_t h)
{
    (void)h;
    tr_err err = {{0}};
    struct tr_st_file *f = tr_safetensors_read(in->p, in->n, "fuzz.safetensors", &err);
    if (!f) {
        if (!err.msg[0])
            broken("safetensors: rejected without a message");
        return;
    }
    accepted("safetensors");
    unsigned sum = 0;
    for (size_t i = 0; i < tr_safetensors_count(f); i++) {
        const struct tr_st_entry *e = tr_safetensors_at(f, i);
        if (e->ndim < 0 || e->ndim > 4)
            broken("safetensors: '%s' has %d dimensions", e->name, e->ndim);
        /* what readers rely on: numel * element size == bytes, exactly */
        unsigned __int128 numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0)
                broken("safetensors: '%s' has dimension %lld", e->name, (long long)e->shape[d]);
            numel *= (unsigned __int128)e->shape[d];
        }
        size_t esize = e->dtype == TR_BF16 || e->dtype == TR_F16 ? 2 : 4;
        if (numel * esize != e->bytes)
            broken("safetensors: '%s' has a shape of other than its %zu bytes", e->name,
                   e->bytes);
        const unsigned char *d = e->data;
        if ((uintptr_t)d % esize != 0)
            broken("safetensors: '%s' is misaligned for its dtype", e->name);
        if (d >= in->p && d < in->p + in->n && d + e->bytes > in->p + in->n)
            broken("safetensors: '%s' runs past the end of the file", e->name);
        if (tr_safetensors_find(f, e->name) == NULL)
            broken("safetensors: '%s' cannot be found by name", e->name);
        for (size_t k = 0; k < e->bytes; k++)
            sum += d[k];
    }
    tr_safetensors_free(f);
    (void)sum;
}

static void target_tokens(const struct buf *in, uint64_t h)
{
    write_file("shard.bin", in->p, in->n);
    struct config c;
    config_init(&plugins[P_TOKENS], &c);
    set_option(&plugins[P_TOKENS], &c, "train", CHOOSE(&h, "shard.bin", "shard.bin", "sh*.bin"));
    set_option(&plugins[P_TOKENS], &c, "val", CHOOSE(&h, "", "", "shard.bin"));
    set_option(&plugins[P_TOKENS], &c, "val_fraction", CHOOSE(&h, "0", "0.05", "0.5"));
    set_option(&plugins[P_TOKENS], &c, "vocab", CHOOSE(&h, "0", "0", "50", "1000", "65536"));
    set_option(&plugins[P_TOKENS], &c, "check", CHOOSE(&h, "false", "true"));
    uint32_t seq_len = (uint32_t)strtoul(CHOOSE(&h, "1", "4", "7", "64"), NULL, 10);
    create_and_read(&plugins[P_TOKENS], &c, seq_len, 64, NULL);
}

static void target_csv(const struct buf *in, uint64_t h)
{
    const char *path = CHOOSE(&h, "data.csv", "data.csv.gz");
    write_file(path, in->p, in->n);
    struct config c;
    config_init(&plugins[P_CSV], &c);
    set_option(&plugins[P_CSV], &c, "path", path);
    set_option(&plugins[P_CSV], &c, "label_column", CHOOSE(&h, "-1", "-1", "0", "2"));
    set_option(&plugins[P_CSV], &c, "header", CHOOSE(&h, "false", "true"));
    set_option(&plugins[P_CSV], &c, "val_fraction", CHOOSE(&h, "0", "0.1", "0.5"));
    set_option(&plugins[P_CSV], &c, "val_split", CHOOSE(&h, "tail", "random"));
    set_option(&plugins[P_CSV], &c, "classes", CHOOSE(&h, "0", "0", "3", "100"));
    set_option(&plugins[P_CSV], &c, "scale", CHOOSE(&h, "1", "1", "0.00392", "1e30"));
    create_and_read(&plugins[P_CSV], &c, 0, 4096, NULL);
}

/* An IDX file of `count` items of `per_item` unsigned bytes (1 dimension
 * when per_item is 0: labels). */
static void write_idx(const char *path, uint32_t count, uint32_t per_item)
{
    int dims = per_item ? 2 : 1;
    size_t n = 4 + 4 * (size_t)dims + (size_t)count * (per_item ? per_item : 1);
    unsigned char *b = calloc(1, n);
    if (!b)
        die("out of memory");
    b[2] = 0x08;
    b[3] = (unsigned char)dims;
    be32(b + 4, count);
    if (per_item)
        be32(b + 8, per_item);
    unsigned char *e = b + 4 + 4 * dims;
    for (size_t i = 0; i < (size_t)count * (per_item ? per_item : 1); i++)
        e[i] = (unsigned char)(per_item ? i * 7 : i % 10);
    write_file(path, b, n);
    free(b);
}

/* The first dimension an IDX header declares, capped (0 when unreadable). */
static uint32_t idx_count(const struct buf *in)
{
    if (in->n < 8)
        return 0;
    uint32_t n = get_be32(in->p + 4);
    return n > 100000 ? 100000 : n;
}

static void run_idx(const char *images, const char *labels, uint64_t h)
{
    struct config c;
    config_init(&plugins[P_IDX], &c);
    set_option(&plugins[P_IDX], &c, "images", images);
    set_option(&plugins[P_IDX], &c, "labels", labels);
    if (below(&h, 4) == 0) {
        set_option(&plugins[P_IDX], &c, "val_images", images);
        set_option(&plugins[P_IDX], &c, "val_labels", labels);
    }
    set_option(&plugins[P_IDX], &c, "val_fraction", CHOOSE(&h, "0", "0.1", "0.5"));
    set_option(&plugins[P_IDX], &c, "scale", CHOOSE(&h, "0", "0", "1", "1e30"));
    create_and_read(&plugins[P_IDX], &c, 0, 512, NULL);
}

static void target_idx_images(const struct buf *in, uint64_t h)
{
    write_file("images.idx", in->p, in->n);
    write_idx("labels.idx", idx_count(in), 0);
    run_idx("images.idx", "labels.idx", h);
}

static void target_idx_labels(const struct buf *in, uint64_t h)
{
    write_file("labels.idx", in->p, in->n);
    write_idx("images.idx", idx_count(in), 4);
    run_idx("images.idx", "labels.idx", h);
}

/* A PNG, JPEG or WebP file through the decoders, then the resize: a clean
 * error or an image of the size asked for. */
static void target_image(const struct buf *in, uint64_t h)
{
    int channels = below(&h, 2) ? 3 : 1;
    struct tr_image img;
    char why[512] = "";
    if (tr_image_decode(in->p, in->n, channels, &img, why, sizeof why) != 0) {
        if (!why[0])
            broken("image: refused without a reason");
        return;
    }
    if (img.width < 1 || img.height < 1 || img.channels != channels || !img.pixels)
        broken("image: decoded to %dx%dx%d", img.width, img.height, img.channels);
    int size = 1 + (int)below(&h, 40);
    unsigned char *out = xmalloc((size_t)size * size * channels);
    tr_image_resize_crop(&img, size, out);
    free(out);
    tr_image_free(&img);
}

/* A TRIMAGES shard as the images plugin's training (or also validation)
 * shard, with augmentation on or off. */
static void target_images_shard(const struct buf *in, uint64_t h)
{
    mkdir("shards", 0755);
    write_file("shards/train_000000.bin", in->p, in->n);
    if (below(&h, 2))
        write_file("shards/val_000000.bin", in->p, in->n);
    else
        unlink("shards/val_000000.bin");
    struct config c;
    config_init(&plugins[P_IMAGES], &c);
    set_option(&plugins[P_IMAGES], &c, "dir", "shards");
    set_option(&plugins[P_IMAGES], &c, "pad", CHOOSE(&h, "0", "1", "4"));
    set_option(&plugins[P_IMAGES], &c, "flip", CHOOSE(&h, "false", "true"));
    set_option(&plugins[P_IMAGES], &c, "verify", CHOOSE(&h, "true", "false", "false"));
    create_and_read(&plugins[P_IMAGES], &c, 0, 64, NULL);
}

/* A WebDataset tar through prepare --format images, and its shards through
 * the images plugin. */
static void target_prepare_tar(const struct buf *in, uint64_t h)
{
    write_file("in.tar", in->p, in->n);
    char *argv[] = {"prepare", "in.tar", "-o", "out", "--size",
                    (char *)CHOOSE(&h, "1", "3", "8"), "--val-fraction",
                    (char *)CHOOSE(&h, "0", "0.5"), "--skip-bad-records", NULL};
    int argc = below(&h, 2) ? 9 : 8;
    int rc = tr_prepare_main(argc, argv);
    if (rc != 0 && rc != 1)
        broken("prepare: exit code %d", rc);
    if (rc != 0)
        return;
    struct config c;
    config_init(&plugins[P_IMAGES], &c);
    set_option(&plugins[P_IMAGES], &c, "dir", "out");
    create_and_read(&plugins[P_IMAGES], &c, 0, 64, NULL);
}

/* The text plugin over text.txt; the samples read are appended to *out. */
static int run_text(const char *tokenizer, const char *cache_dir, uint32_t seq_len,
                    const char *val_fraction, struct buf *out)
{
    struct config c;
    config_init(&plugins[P_TEXT], &c);
    set_option(&plugins[P_TEXT], &c, "path", "text.txt");
    set_option(&plugins[P_TEXT], &c, "tokenizer", tokenizer);
    set_option(&plugins[P_TEXT], &c, "cache_dir", cache_dir);
    set_option(&plugins[P_TEXT], &c, "val_fraction", val_fraction);
    return create_and_read(&plugins[P_TEXT], &c, seq_len, 256, out);
}

static void target_text(const struct buf *in, uint64_t h)
{
    write_file("text.txt", in->p, in->n);
    const char *tokenizer = CHOOSE(&h, "byte", "char", "char");
    uint32_t seq_len = (uint32_t)strtoul(CHOOSE(&h, "1", "3", "16", "256"), NULL, 10);
    const char *val = CHOOSE(&h, "0", "0.1", "0.5");
    struct buf first = {0}, again = {0}, plain = {0};
    int a = run_text(tokenizer, "cache", seq_len, val, &first);
    int b = run_text(tokenizer, "cache", seq_len, val, &again); /* from the cache */
    int c = run_text(tokenizer, "", seq_len, val, &plain);
    if (a != b || a != c || first.n != again.n || first.n != plain.n ||
        (first.n && (memcmp(first.p, again.p, first.n) != 0 ||
                     memcmp(first.p, plain.p, first.n) != 0)))
        broken("text: the cached and uncached tokens differ");
    free(first.p);
    free(again.p);
    free(plain.p);
}

/* The text every textcache case caches. */
static const char cache_text[] =
    "In the beginning was the word, and the word was with the fuzzer.\n"
    "The quick brown fox jumps over the lazy dog; 0123456789 !?\n"
    "Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump!\n"
    "Sphinx of black quartz, judge my vow: \xc3\xa9t\xc3\xa9, \t tabs, and \x01 bytes.\n";

/* Name of the one file in dir ending in suffix, into name. */
static int find_suffix(const char *dir, const char *suffix, char *name, size_t size)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *e;
    int found = -1;
    while ((e = readdir(d))) {
        size_t a = strlen(e->d_name), b = strlen(suffix);
        if (a > b && strcmp(e->d_name + a - b, suffix) == 0) {
            snprintf(name, size, "%s/%s", dir, e->d_name);
            found = 0;
        }
    }
    closedir(d);
    return found;
}

/* A damaged cache file (tokens or character table) must never change what
 * the text plugin serves: it is rebuilt, or the run fails cleanly. */
static void text_cache_case(const struct buf *in, uint64_t h, const char *suffix)
{
    write_text("text.txt", cache_text);
    uint32_t seq_len = (uint32_t)strtoul(CHOOSE(&h, "1", "4", "16"), NULL, 10);
    /* the text is long enough for a sample of each split at every seq_len */
    struct buf truth = {0}, got = {0};
    if (run_text("char", "", seq_len, "0.1", &truth) != TR_OK)
        broken("textcache: the clean text does not load");
    if (run_text("char", "cache", seq_len, "0.1", NULL) != TR_OK)
        broken("textcache: the cache is not written");
    char path[4200];
    if (find_suffix("cache", suffix, path, sizeof path) != 0)
        broken("textcache: no %s file in the cache", suffix);
    write_file(path, in->p, in->n);
    if (run_text("char", "cache", seq_len, "0.1", &got) == TR_OK &&
        (got.n != truth.n || (got.n && memcmp(got.p, truth.p, got.n) != 0)))
        broken("textcache: a damaged %s file changed the tokens served", suffix);
    free(truth.p);
    free(got.p);
}

static void target_textcache_tokens(const struct buf *in, uint64_t h)
{
    text_cache_case(in, h, ".tokens");
}

static void target_textcache_chars(const struct buf *in, uint64_t h)
{
    text_cache_case(in, h, ".chars");
}

/* Shards `trainrun prepare` wrote must read back through the tokens plugin. */
static void read_prepared(void)
{
    struct stat st;
    if (stat("out/train_000000.bin", &st) != 0)
        return;
    struct config c;
    config_init(&plugins[P_TOKENS], &c);
    set_option(&plugins[P_TOKENS], &c, "train", "out/train_*.bin");
    if (stat("out/val_000000.bin", &st) == 0)
        set_option(&plugins[P_TOKENS], &c, "val", "out/val_*.bin");
    set_option(&plugins[P_TOKENS], &c, "check", "true");
    create_and_read(&plugins[P_TOKENS], &c, 2, 64, NULL);
}

static void target_prepare_text(const struct buf *in, uint64_t h)
{
    const char *input = CHOOSE(&h, "in.txt", "in.txt.gz");
    write_file(input, in->p, in->n);
    char *argv[16];
    int argc = 0;
    argv[argc++] = "prepare";
    argv[argc++] = (char *)input;
    argv[argc++] = "-o";
    argv[argc++] = "out";
    argv[argc++] = "--format=text";
    argv[argc++] = (char *)CHOOSE(&h, "--tokenizer=byte", "--tokenizer=char");
    argv[argc++] = (char *)CHOOSE(&h, "--dedup=exact", "--dedup=near", "--dedup=none");
    argv[argc++] = (char *)CHOOSE(&h, "--doc-separator=blank-line", "--doc-separator=line");
    /* every shard is fsync'd: small shards, but not hundreds of them */
    argv[argc++] = (char *)CHOOSE(&h, "--shard-tokens=1000000", "--shard-tokens=1000000",
                                  "--shard-tokens=256");
    argv[argc++] = (char *)CHOOSE(&h, "--val-fraction=0.05", "--val-fraction=0",
                                  "--val-fraction=0.5");
    argv[argc] = NULL;
    int rc = tr_prepare_main(argc, argv);
    if (rc != 0 && rc != 1)
        broken("prepare: exit code %d", rc);
    if (rc == 0) {
        accepted("prepare");
        read_prepared();
    }
}

/* JSONL records through prepare: byte, char or the fixture tokenizer.json,
 * bad records refused or skipped, one or two workers. */
static void target_prepare_jsonl(const struct buf *in, uint64_t h)
{
    write_file("in.jsonl", in->p, in->n);
    char tokenizer[4200];
    snprintf(tokenizer, sizeof tokenizer, "--tokenizer=%s/tests/fixtures/tokenizer/bpe.json",
             srcdir);
    char *argv[] = {"prepare", "in.jsonl", "-o", "out",
                    below(&h, 3) ? tokenizer : (char *)CHOOSE(&h, "--tokenizer=byte",
                                                              "--tokenizer=char"),
                    (char *)CHOOSE(&h, "--skip-bad-records", "--dedup=exact"),
                    (char *)CHOOSE(&h, "--workers=1", "--workers=2"),
                    (char *)CHOOSE(&h, "--val-fraction=0.05", "--val-fraction=0.5"),
                    (char *)CHOOSE(&h, "--shard-tokens=1000000", "--shard-tokens=64"), NULL};
    int rc = tr_prepare_main(9, argv);
    if (rc != 0 && rc != 1)
        broken("prepare: exit code %d", rc);
    if (rc == 0)
        read_prepared();
}

static void target_prepare_csv(const struct buf *in, uint64_t h)
{
    write_file("in.csv", in->p, in->n);
    char *argv[] = {"prepare", "in.csv", "-o", "out", "--format=csv",
                    (char *)CHOOSE(&h, "--dedup=exact", "--dedup=none"),
                    below(&h, 2) ? "--header" : "--dedup=exact", NULL};
    int rc = tr_prepare_main(7, argv);
    if (rc != 0 && rc != 1)
        broken("prepare: exit code %d", rc);
    if (rc != 0)
        return;
    struct config c;
    config_init(&plugins[P_CSV], &c);
    set_option(&plugins[P_CSV], &c, "path", "out/data.csv");
    create_and_read(&plugins[P_CSV], &c, 0, 4096, NULL);
}

/* ---- the op table's answer to recipe code ---------------------------------------- */

/* Recipe code may call require("trainrun.ops").shape (config/recipe_ops.h)
 * with anything at all.  The input is a Lua chunk that returns the three
 * arguments (the seeds: a valid call of each op, and hostile ones); it runs
 * in a state without io, os or require, its heap capped and its
 * instructions counted.  The answer to those arguments, and to them with
 * one replaced by a hostile value (a wrong type, a huge, negative or NaN
 * dimension, an unknown op, a handle without its fields, a metamethod that
 * must not run, ...) chosen from the input's hash, must never raise nor
 * crash: a list of 1 to 8 whole dimensions from 1 to 2^31-1, or nil and a
 * sentence. */

#define OPS_HEAP_LIMIT ((size_t)64 << 20)
#define OPS_INSTRUCTIONS 2000000L

struct ops_heap {
    size_t used;
};

static void *ops_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    struct ops_heap *heap = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        heap->used -= old;
        return NULL;
    }
    if (nsize > old && heap->used + (nsize - old) > OPS_HEAP_LIMIT)
        return NULL;
    void *p = realloc(ptr, nsize);
    if (p)
        heap->used = heap->used - old + nsize;
    return p;
}

static long ops_count;
static void ops_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    if ((ops_count += 1000) > OPS_INSTRUCTIONS)
        luaL_error(L, "too many instructions");
}

/* Asks shape(a1, a2, a3), then again with argument k replaced by hostile
 * value v, for rounds drawn from the seed; returns nil or what broke. */
static const char ops_driver[] =
    "local shape, seed, a1, a2, a3 = ...\n"
    "local function handle(name, shape, more)\n"
    "  local t = { name = name, shape = shape }\n"
    "  for k, v in pairs(more or {}) do t[k] = v end\n"
    "  return t\n"
    "end\n"
    "local trap = setmetatable({}, { __index = function() error('a metamethod ran') end,\n"
    "                                __len = function() error('a metamethod ran') end })\n"
    "local hostile = {\n"
    "  false, 0 / 0, 1 / 0, -1, 0, 2^31, 2^63, -2^63, 1.5, 'linear', 'no_such_op', '', {}, { {} },\n"
    "  trap, { trap, trap }, function() end, { name = 7, shape = { 2 } },\n"
    "  handle('x', { -1 }), handle('x', { 0, 4 }), handle('x', { 2^31 }), handle('x', { 0 / 0 }),\n"
    "  handle('x', { 2^40, 2^40 }), handle('x', { 1, 1, 1, 1, 1, 1, 1, 1, 1 }), handle('x', 'abc'),\n"
    "  handle('x', { 2, 3 }, { dtype = 'f64' }), handle('x', { 2, 3 }, { role = 'weights' }),\n"
    "  handle('x', { 2, 3 }, { role = 'buffer' }), handle('x', { 2, 4 }, { dtype = 'i32' }),\n"
    "  handle('x', trap), { handle('x', { 2, 3 }), handle('w', { 3, 3 }), handle('b', { 3 }),\n"
    "                       handle('z', { 3 }) },\n"
    "  { kernel = { 1e10, 0 }, stride = -1, pad = { 1, 2, 3 }, dilation = 0 / 0, groups = 2^40 },\n"
    "  { heads = -3, kv_heads = 2^33, eps = 1 / 0, theta = -0, scale = 1e300, momentum = 0 },\n"
    "  { buffer = 3 }, { buffer = trap }, { buffer = handle('r', { 2, 3 }, { role = 'buffer',\n"
    "    attribute_of = { op = 'batchnorm', name = 7 } }) },\n"
    "  { buffer = handle('r', { 2, 3 }, { role = 'buffer', attribute_of = trap }) },\n"
    "  { trans_b = 'yes', ignore_index = 2^53, segment = {} }, ('x'):rep(5000),\n"
    "}\n"
    "local function check(ok, s, why)\n"
    "  if not ok then\n"
    "    if tostring(s):find('not enough memory', 1, true) then return end\n"
    "    return 'the answer raised an error: ' .. tostring(s)\n"
    "  end\n"
    "  if s == nil then\n"
    "    if type(why) ~= 'string' or why == '' then return 'nil without a sentence' end\n"
    "    return\n"
    "  end\n"
    "  if type(s) ~= 'table' or #s < 1 or #s > 8 then return 'not a shape: ' .. tostring(s) end\n"
    "  for i = 1, #s do\n"
    "    local d = s[i]\n"
    "    if type(d) ~= 'number' or d < 1 or d > 2^31 - 1 or d ~= math.floor(d) then\n"
    "      return ('dimension %d of the answer is %s'):format(i, tostring(d))\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local wrong = check(pcall(shape, a1, a2, a3))\n"
    "if wrong then return wrong end\n"
    "for round = 1, 24 do\n"
    "  seed = (seed * 1103515245 + 12345) % 2147483648\n"
    "  local args = { a1, a2, a3 }\n"
    "  local k, v = seed % 3 + 1, hostile[math.floor(seed / 3) % #hostile + 1]\n"
    "  if type(args[2]) == 'table' and seed % 7 == 0 then\n"
    "    args[2] = { args[2][1], v, args[2][3] }\n" /* a hostile input among good ones */
    "  elseif type(args[3]) == 'table' and seed % 7 == 1 then\n"
    "    args[3] = setmetatable({}, { __index = args[3] })\n" /* attributes behind a metatable */
    "  else\n"
    "    args[k] = v\n"
    "  end\n"
    "  wrong = check(pcall(shape, args[1], args[2], args[3]))\n"
    "  if wrong then return ('round %d (argument %d): %s'):format(round, k, wrong) end\n"
    "end\n";

static void target_op_shape(const struct buf *in, uint64_t h)
{
    struct ops_heap heap = {0};
    lua_State *L = lua_newstate(ops_alloc, &heap);
    if (!L)
        die("cannot start Lua");
    static const lua_CFunction libs[] = {luaopen_base, luaopen_string, luaopen_table, luaopen_math};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        lua_pushcfunction(L, libs[i]);
        lua_call(L, 0, 0);
    }
    static const char *const unsafe[] = {"dofile", "loadfile", "load", "loadstring", "require"};
    for (size_t i = 0; i < sizeof unsafe / sizeof unsafe[0]; i++) {
        lua_pushnil(L);
        lua_setglobal(L, unsafe[i]);
    }
    tr_recipe_push_ops(L);
    lua_setglobal(L, "ops"); /* the chunk may ask too */
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF); /* traces skip hooks */
    lua_sethook(L, ops_hook, LUA_MASKCOUNT, 1000);
    ops_count = 0;
    int top = lua_gettop(L);
    /* text only: LuaJIT does not verify bytecode */
    if (luaL_loadbufferx(L, (const char *)in->p, in->n, "=op-shape", "t") != 0 ||
        lua_pcall(L, 0, 3, 0) != 0) {
        lua_close(L);
        return; /* not Lua, or it failed or ran too long: nothing was asked */
    }
    ops_count = 0;
    if (luaL_loadbufferx(L, ops_driver, sizeof ops_driver - 1, "=ops-driver", "t") != 0)
        die("the driver does not compile: %s", lua_tostring(L, -1));
    lua_insert(L, top + 1);
    tr_recipe_push_ops(L);
    lua_getfield(L, -1, "shape");
    lua_remove(L, -2);
    lua_insert(L, top + 2);
    lua_pushnumber(L, (lua_Number)(h % 2147483648u));
    lua_insert(L, top + 3);
    if (lua_pcall(L, 5, 1, 0) != 0) {
        const char *e = lua_tostring(L, -1);
        if (!e || (!strstr(e, "not enough memory") && !strstr(e, "too many instructions")))
            broken("op-shape driver: %s", e ? e : "(no message)");
    } else if (!lua_isnil(L, -1)) {
        broken("trainrun.ops' shape: %s", lua_tostring(L, -1));
    }
    lua_close(L);
}

static void add_seed(const char *target, const void *data, size_t n);

/* A valid call of every op, some refused ones, and some hostile ones. */
static void make_op_shape_seeds(void)
{
    static const char *const seeds[] = {
        "local x = {name = 'x', shape = {2, 8, 16}}\n"
        "local w = {name = 'w', shape = {32, 16}, role = 'param'}\n"
        "return 'linear', {x, w, {name = 'b', shape = {32}, role = 'param'}}\n",
        "return 'linear', {{name = 'x', shape = {2, 8, 16}}, {name = 'w', shape = {32, 24}}}\n",
        "return 'embedding', {{name = 't', shape = {64, 16}}, {name = 'i', shape = {2, 8}, dtype = 'i32'}}\n",
        "return 'add_rows', {{name = 'x', shape = {2, 8, 16}}, {name = 'p', shape = {8, 16}}}\n",
        "return 'add', {{name = 'a', shape = {2, 8}}, {name = 'b', shape = {2, 8}}}\n",
        "return 'matmul', {{name = 'a', shape = {2, 8, 4}}, {name = 'b', shape = {2, 8, 4}}}, {trans_b = 1}\n",
        "local x = {name = 'x', shape = {2, 8, 16}}\n"
        "local c = {name = 'c', shape = {16}}\n"
        "return 'layernorm', {x, c, c}, {eps = 1e-6}\n",
        "return 'gelu', {{name = 'x', shape = {3}}}\n",
        "return 'relu', {{name = 'x', shape = {3, 1, 1, 1, 1, 1, 1, 1}}}\n",
        "return 'attention', {{name = 'qkv', shape = {2, 8, 48}}}, {heads = 4}\n",
        "local q = {name = 'q', shape = {2, 8, 16}}\n"
        "local kv = {name = 'kv', shape = {2, 8, 8}}\n"
        "return 'attention', {q, kv, kv}, {heads = 4, kv_heads = 2}\n",
        "return 'cross_entropy', {{name = 'l', shape = {2, 8, 64}}, {name = 't', shape = {2, 8}, dtype = 'i32'}},\n"
        "  {ignore_index = -100}\n",
        "return 'rmsnorm', {{name = 'x', shape = {2, 8, 16}}, {name = 'w', shape = {16}}}, {eps = 1e-5}\n",
        "return 'rope', {{name = 'x', shape = {2, 8, 16}}}, {heads = 4, theta = 500000}\n",
        "return 'swiglu', {{name = 'g', shape = {2, 8}}, {name = 'u', shape = {2, 8}}}\n",
        "return 'scale', {{name = 'x', shape = {2, 8}}}, {scale = 0.5}\n",
        "local im = {name = 'im', shape = {2, 6, 6, 3}}\n"
        "return 'conv2d', {im, {name = 'k', shape = {4, 3, 3, 3}}, {name = 'b', shape = {4}}},\n"
        "  {stride = {1, 2}, pad = 1, dilation = 1, groups = 1}\n",
        "return 'maxpool', {{name = 'im', shape = {2, 6, 6, 3}}}, {kernel = 2, stride = 2, pad = 1}\n",
        "return 'avgpool', {{name = 'im', shape = {2, 6, 6, 3}}}, {kernel = {3, 2}}\n",
        "return 'global_avgpool', {{name = 'im', shape = {2, 6, 6, 3}}}\n",
        "local im = {name = 'im', shape = {2, 6, 6, 3}}\n"
        "local c = {name = 'c', shape = {3}, role = 'param'}\n"
        "local r = {name = 'r', shape = {2, 3}, role = 'buffer'}\n"
        "return 'batchnorm', {im, c, c}, {buffer = r, momentum = 0.1, eps = 1e-5}\n",
        "local im = {name = 'im', shape = {2, 6, 6, 3}}\n"
        "local c = {name = 'c', shape = {3}}\n"
        "local r = {name = 'r', shape = {2, 3}, role = 'buffer', attribute_of = {op = 'batchnorm', name = 'bn'}}\n"
        "return 'batchnorm', {im, c, c}, {buffer = r}\n",
        "return 'conv2d', {{name = 'im', shape = {2^31 - 1, 1, 1, 2^9}}, {name = 'k', shape = {1, 1, 1, 2^9}}},\n"
        "  {dilation = 65536, pad = 65536}\n",
        "return ops.shape, {1, 2, 3}, 'eps'\n",
        "return 'maxpool', {{name = 'im', shape = {1, 65536, 65536, 1}}}, {kernel = 65536, pad = 32768}\n",
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
        add_seed("op-shape", seeds[i], strlen(seeds[i]));
}

/* ---- whole-binary targets ------------------------------------------------------ */

/* Run trainrun with argv[1..] in the current directory, output to
 * trainrun.out; fails the case on a signal, an exit code other than 0, 1 or
 * 2, or a sanitizer report. */
static void run_trainrun(const char *const *args)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open("trainrun.out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int null = open("/dev/null", O_RDONLY);
        if (fd < 0 || null < 0)
            _exit(126);
        dup2(null, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        char *argv[32];
        int n = 0;
        argv[n++] = (char *)trainrun;
        for (; args[n - 1] && n < 31; n++)
            argv[n] = (char *)args[n - 1];
        argv[n] = NULL;
        execv(trainrun, argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            die("waitpid: %s", strerror(errno));
    struct buf out = {0};
    read_file("trainrun.out", &out);
    const char *text = out.p ? (const char *)out.p : "";
    int report = out.p && (memmem(out.p, out.n, "Sanitizer", 9) ||
                           memmem(out.p, out.n, "runtime error:", 14));
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (WIFSIGNALED(status) || report || code > 2) {
        fprintf(stderr, "fuzz: trainrun");
        for (int i = 0; args[i]; i++)
            fprintf(stderr, " %s", args[i]);
        if (WIFSIGNALED(status))
            fprintf(stderr, ": killed by signal %d (%s)\n", WTERMSIG(status),
                    strsignal(WTERMSIG(status)));
        else
            fprintf(stderr, ": exit code %d%s\n", code, report ? ", sanitizer report" : "");
        size_t from = out.n > 6000 ? out.n - 6000 : 0;
        fprintf(stderr, "--- its output (end) ---\n%.*s\n---\n", (int)(out.n - from), text + from);
        broken("trainrun crashed or reported memory or undefined-behaviour errors");
    }
    if (code == 0)
        accepted("trainrun");
    free(out.p);
}

static void target_recipe(const struct buf *in, uint64_t h)
{
    write_file("recipe.lua", in->p, in->n);
    const char *cmd = CHOOSE(&h, "show", "show", "plan");
    const char *args[] = {cmd, "recipe.lua", NULL};
    run_trainrun(args);
}

static const char tiny_recipe[] =
    "return {\n"
    "  model = gpt { vocab = 64, ctx = 8, layers = 1, heads = 2, dim = 16 },\n"
    "  data = { plugin = \"synthetic\", kind = \"tokens\", classes = 64, samples = 512 },\n"
    "  train = { steps = 2, batch = 4, log_every = 1 },\n"
    "  checkpoint = { every = 2 },\n"
    "}\n";
#define CKPT "runs/r/checkpoints/step-0000000002"

/* Copy the template run (recipe and checkpoint) into the current directory. */
static void copy_template(void)
{
    static const char *const files[] = {"r.lua", "runs/r/checkpoints/LATEST",
                                        CKPT "/state.json", CKPT "/model.safetensors",
                                        CKPT "/optimizer.safetensors",
                                        CKPT "/optimizer2.safetensors"};
    if (mkdir("runs", 0755) || mkdir("runs/r", 0755) || mkdir("runs/r/checkpoints", 0755) ||
        mkdir(CKPT, 0755))
        die("cannot make the checkpoint directories: %s", strerror(errno));
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char from[4400];
        snprintf(from, sizeof from, "%s/%s", template_dir, files[i]);
        struct buf b;
        if (read_file(from, &b) != 0)
            die("cannot read %s", from);
        write_file(files[i], b.p, b.n);
        free(b.p);
    }
}

/* One command over the checkpoint in the current directory. */
static void checkpoint_command(uint64_t h)
{
    switch (below(&h, 3)) {
    case 0: {
        const char *args[] = {"sample", "runs/r", "--prompt", "ab", "--tokens", "4", NULL};
        run_trainrun(args);
        break;
    }
    case 1: {
        const char *args[] = {"export", "runs/r", "--dtype", CHOOSE(&h, "bf16", "fp32"), "-o",
                              "out.safetensors", NULL};
        run_trainrun(args);
        break;
    }
    default: {
        const char *args[] = {"r.lua", "--resume", "auto", "train.steps=3", "--quiet", NULL};
        run_trainrun(args);
        break;
    }
    }
}

static void target_state(const struct buf *in, uint64_t h)
{
    copy_template();
    write_file(CKPT "/state.json", in->p, in->n);
    checkpoint_command(h);
}

/* model.safetensors mutated, with the checksum in state.json made to match
 * so that the parser, not the checksum, meets the damage. */
static void target_checkpoint(const struct buf *in, uint64_t h)
{
    copy_template();
    write_file(CKPT "/model.safetensors", in->p, in->n);
    struct buf st;
    if (read_file(CKPT "/state.json", &st) != 0)
        die("cannot read the template's state.json");
    const char key[] = "\"model.safetensors\": ";
    unsigned char *at = memmem(st.p, st.n, key, sizeof key - 1);
    if (at) {
        unsigned char *num = at + sizeof key - 1, *end = num;
        while (end < st.p + st.n && *end >= '0' && *end <= '9')
            end++;
        char sum[32];
        int len = snprintf(sum, sizeof sum, "%lu", crc32(0, in->p, (uInt)in->n));
        FILE *f = fopen(CKPT "/state.json", "wb");
        if (!f)
            die("cannot write state.json");
        fwrite(st.p, 1, (size_t)(num - st.p), f);
        fwrite(sum, 1, (size_t)len, f);
        fwrite(end, 1, (size_t)(st.p + st.n - end), f);
        fclose(f);
    }
    free(st.p);
    checkpoint_command(h);
}

/* ---- the target table ------------------------------------------------------- */

struct target {
    const char *name;
    void (*run)(const struct buf *in, uint64_t h);
    int weight;        /* share of the mutated cases */
    int needs_binary;  /* runs trainrun */
    const char *dict;  /* tokens the mutator inserts, '\1'-separated */
    struct buf *seeds;
    size_t n_seeds;
};

static const char json_dict[] =
    "{\1}\1[\1]\1\"\1,\1:\1null\1true\1false\1-1\1-0\1"
    "1e999\1-1e999\1" "18446744073709551616\1" "9007199254740993\1" "4294967296\1"
    "\"\\u0000\"\1\"\\ud800\"\1\"__metadata__\"\1\"dtype\"\1\"shape\"\1\"data_offsets\"\1"
    "\"F32\"\1\"BF16\"\1\"I32\"\1\"F16\"\1\"step\"\1\"checksums\"\1\"recipe\"\1"
    "\"loader_position\"\1\"precision\"\1\"schedule\"\1\"best\"\1\"seed\"\1\"format\"\1"
    "[-1]\1[0,0]\1[4294967296,4294967296]\1[1e300]\1{\"a\":{}}";
static const char chat_dict[] =
    "\"\1'\1\\\\\1\\\\n\1\\n\1<|im_start|>\1<|im_start|>system\\n\1<|im_end|>\1"
    "<|start_header_id|>\1<|eot_id|>\1<|begin_of_text|>\1bos_token\1| trim\1|\1"
    "\"chat_template\"\1\"bos_token\"\1{\"content\": \"\"}\1[{\"name\": \"default\", "
    "\"template\": \"\"}]\1Cutting Knowledge Date\1";
static const char lua_dict[] =
    "{\1}\1=\1,\1\"\1'\1[[\1]]\1--\1..\1return\1nil\1true\1-1\1 0 \1 1e309 \1 -1e309 \1"
    " 0/0 \1 2^63 \1 2^31 \1 4294967296 \1 9007199254740993 \1 1e-320 \1"
    "model = \1data = \1train = \1steps = \1batch = \1vocab = \1ctx = \1layers = \1"
    "heads = \1dim = \1lr = \1precision = \1schedule = \1checkpoint = \1every = \1"
    "plugin = \1gpt { }\1mlp { }\1extends \"base/gpt-char.lua\"\1include(\"x.lua\")\1"
    "require(\"trainrun.nn\")\1string.rep(\"a\", 1e9)\1setmetatable({}, {})\1"
    "require(\"trainrun.ops\").shape(\"linear\", {}, {})\1"
    "\"\\0\"\1\"../../etc/passwd\"\1\"/dev/zero\"";
static const char csv_dict[] =
    ",\1\n\1\r\n\1 \1\"\1-\1.\1e\1nan\1inf\1-inf\1" "1e39\1-1e39\1" "1e308\1" "2147483648\1"
    "4294967296\1" "-1\1" "0.5\1" "0x10\1" "\0";
static const char text_dict[] = "\n\1\n\n\1\r\n\1 \1\t\1\xff\1\xc3\xa9\1\0\1the\1The ";
static const char ops_dict[] =
    "{\1}\1,\1=\1'\1nil\1 -1 \1 0 \1 0/0 \1 1/0 \1 2^31 \1 2^40 \1 2^63 \1 1.5 \1"
    "'linear'\1'attention'\1'conv2d'\1'batchnorm'\1'maxpool'\1'embedding'\1'lineer'\1"
    "name = \1shape = \1dtype = 'i32'\1dtype = 'f64'\1role = 'buffer'\1role = 'param'\1"
    "kernel = \1stride = \1pad = \1dilation = \1groups = \1heads = \1kv_heads = \1"
    "eps = \1momentum = \1theta = \1scale = \1buffer = \1attribute_of = \1trans_b = \1"
    "{2, 3}\1{-1}\1{1, 1, 1, 1, 1, 1, 1, 1, 1}\1setmetatable({}, {__index = error})\1"
    "ops.shape(\1while true do end\1string.rep('x', 1e8)\1";

static struct target targets[] = {
    {"json", target_json, 10, 0, json_dict, NULL, 0},
    {"safetensors", target_safetensors, 10, 0, json_dict, NULL, 0},
    {"hf-config", target_hf_config, 6, 0, json_dict, NULL, 0},
    {"tokenizer", target_tokenizer, 3, 0, json_dict, NULL, 0},
    {"chat-template", target_chat_template, 2, 0, chat_dict, NULL, 0},
    {"tokens", target_tokens, 10, 0, NULL, NULL, 0},
    {"csv", target_csv, 10, 0, csv_dict, NULL, 0},
    {"idx-images", target_idx_images, 6, 0, NULL, NULL, 0},
    {"idx-labels", target_idx_labels, 5, 0, NULL, NULL, 0},
    {"image", target_image, 6, 0, NULL, NULL, 0},
    {"images-shard", target_images_shard, 5, 0, NULL, NULL, 0},
    {"prepare-tar", target_prepare_tar, 3, 0, NULL, NULL, 0},
    {"text", target_text, 8, 0, text_dict, NULL, 0},
    {"textcache-tokens", target_textcache_tokens, 4, 0, NULL, NULL, 0},
    {"textcache-chars", target_textcache_chars, 3, 0, NULL, NULL, 0},
    {"prepare-text", target_prepare_text, 6, 0, text_dict, NULL, 0},
    {"prepare-csv", target_prepare_csv, 5, 0, csv_dict, NULL, 0},
    {"prepare-jsonl", target_prepare_jsonl, 4, 0, json_dict, NULL, 0},
    {"op-shape", target_op_shape, 4, 0, ops_dict, NULL, 0},
    {"recipe", target_recipe, 3, 1, lua_dict, NULL, 0},
    {"state", target_state, 1, 1, json_dict, NULL, 0},
    {"checkpoint", target_checkpoint, 1, 1, json_dict, NULL, 0},
    {"layout", target_layout, 8, 0, json_dict, NULL, 0},
};
#define N_TARGETS (sizeof targets / sizeof targets[0])

static struct target *find_target(const char *name)
{
    for (size_t i = 0; i < N_TARGETS; i++)
        if (strcmp(targets[i].name, name) == 0)
            return &targets[i];
    return NULL;
}

static void add_seed(const char *target, const void *data, size_t n)
{
    struct target *t = find_target(target);
    if (!t)
        die("no target %s", target);
    t->seeds = realloc(t->seeds, (t->n_seeds + 1) * sizeof *t->seeds);
    if (!t->seeds)
        die("out of memory");
    struct buf *b = &t->seeds[t->n_seeds++];
    b->p = xmalloc(n);
    memcpy(b->p, data, n);
    b->n = n;
}

static void add_seed_file(const char *target, const char *path)
{
    struct buf b;
    if (read_file(path, &b) != 0)
        die("cannot read seed %s: %s", path, strerror(errno));
    add_seed(target, b.p, b.n);
    free(b.p);
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Regular files of dir whose names end in suffix (NULL: all), sorted;
 * calls each(path) for every one. */
static void each_file(const char *dir, const char *suffix, void (*each)(const char *, void *),
                      void *ud)
{
    struct dirent **names;
    int n = scandir(dir, &names, NULL, by_name);
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        size_t a = strlen(name), b = suffix ? strlen(suffix) : 0;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct stat st;
        if (name[0] != '.' && (!suffix || (a > b && strcmp(name + a - b, suffix) == 0)) &&
            stat(path, &st) == 0 && S_ISREG(st.st_mode))
            each(path, ud);
        free(names[i]);
    }
    if (n >= 0)
        free(names);
}

static void seed_from(const char *path, void *target) { add_seed_file(target, path); }

/* ---- seeds made here ----------------------------------------------------------- */

static void make_shard_seeds(void)
{
    unsigned char b[64 + 4 * 300];
    for (int width = 2; width <= 4; width += 2) {
        struct tr_tokens_header th = {TR_TOKENS_VERSION, (uint32_t)width, 300,
                                      width == 2 ? 50 : 1000, 0, 0};
        tr_tokens_header_write(b, &th);
        for (int i = 0; i < 300; i++)
            for (int k = 0; k < width; k++)
                b[64 + i * width + k] = (unsigned char)((uint32_t)(i * 7 % (width == 2 ? 50 : 1000)) >> (8 * k));
        add_seed("tokens", b, 64 + (size_t)width * 300);
    }
    /* version 2 with a loss mask (instruction data): 300 uint16 tokens, then
     * 38 mask bytes training on runs of them */
    struct tr_tokens_header masked = {TR_TOKENS_VERSION_FLAGS, 2, 300, 50, TR_TOKENS_LOSS_MASK, 0};
    tr_tokens_header_write(b, &masked);
    for (int i = 0; i < 300; i++) {
        b[64 + 2 * i] = (unsigned char)(i * 7 % 50);
        b[64 + 2 * i + 1] = 0;
    }
    for (int i = 0; i < 38; i++)
        b[64 + 600 + i] = (unsigned char)(i % 3 ? 0xf0 : 0x0f);
    add_seed("tokens", b, 64 + 600 + 38);
    /* llm.c: 256 int32 header, uint16 tokens */
    unsigned char *l = calloc(1, 1024 + 2 * 200);
    le32(l, 20240520);
    le32(l + 4, 1);
    le32(l + 8, 200);
    for (int i = 0; i < 200; i++)
        l[1024 + 2 * i] = (unsigned char)(i * 13);
    add_seed("tokens", l, 1024 + 2 * 200);
    free(l);
}

static void make_csv_seeds(void)
{
    char text[4096];
    size_t n = 0;
    n += (size_t)snprintf(text + n, sizeof text - n, "a,b,c,label\n");
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%d.5, %g,%d,%d\n", i, i * 0.25,
                              -i, i % 3);
    add_seed("csv", text + 12, n - 12);
    add_seed("csv", text, n);
    add_seed("prepare-csv", text + 12, n - 12);
    add_seed("prepare-csv", text, n);
}

static void make_idx_seeds(void)
{
    /* 20 images of 4x4 unsigned bytes; 10 of 2x3 float32; their labels */
    unsigned char b[16 + 20 * 16];
    b[0] = b[1] = 0;
    b[2] = 0x08;
    b[3] = 3;
    be32(b + 4, 20);
    be32(b + 8, 4);
    be32(b + 12, 4);
    for (int i = 0; i < 20 * 16; i++)
        b[16 + i] = (unsigned char)(i * 3);
    add_seed("idx-images", b, sizeof b);
    unsigned char f[16 + 10 * 6 * 4];
    memset(f, 0, 16);
    f[2] = 0x0D;
    f[3] = 3;
    be32(f + 4, 10);
    be32(f + 8, 2);
    be32(f + 12, 3);
    for (int i = 0; i < 60; i++) {
        float v = (float)i / 7.0f;
        uint32_t bits;
        memcpy(&bits, &v, 4);
        be32(f + 16 + 4 * i, bits);
    }
    add_seed("idx-images", f, sizeof f);
    unsigned char lb[8 + 20];
    memset(lb, 0, 8);
    lb[2] = 0x08;
    lb[3] = 1;
    be32(lb + 4, 20);
    for (int i = 0; i < 20; i++)
        lb[8 + i] = (unsigned char)(i % 10);
    add_seed("idx-labels", lb, sizeof lb);
    unsigned char fl[8 + 10 * 4];
    memset(fl, 0, 8);
    fl[2] = 0x0D;
    fl[3] = 1;
    be32(fl + 4, 10);
    for (int i = 0; i < 10; i++) {
        float v = (float)(i % 4);
        uint32_t bits;
        memcpy(&bits, &v, 4);
        be32(fl + 8 + 4 * i, bits);
    }
    add_seed("idx-labels", fl, sizeof fl);
}

static void make_text_seeds(void)
{
    static const char text[] =
        "It was the best of times, it was the worst of times.\n\n"
        "It was the age of wisdom, it was the age of foolishness.\n\n"
        "It was the best of times, it was the worst of times.\n\n"
        "It was the age of wisdom; it was the age of foolishness!\n"
        "A line of its own.\nAnother line, \xc3\xa9t\xc3\xa9 and tabs\there.\n";
    add_seed("text", text, sizeof text - 1);
    add_seed("prepare-text", text, sizeof text - 1);
    static const char jsonl[] =
        "{\"text\": \"It was the best of times,\\nit was the worst of times.\"}\n"
        "{\"id\": 2, \"text\": \"It was the age of wisdom \\u00e9t\\u00e9 <|endoftext|>\"}\n"
        "\n{\"text\": \"It was the best of times,\\nit was the worst of times.\"}\r\n"
        "{\"text\": \"A record of its own, \xc3\xa9t\xc3\xa9 and\\ttabs.\"}\n";
    add_seed("prepare-jsonl", jsonl, sizeof jsonl - 1);
}

/* The text plugin's own cache files for cache_text, made in dir. */
static void make_cache_seeds(const char *dir)
{
    char old[4096];
    if (!getcwd(old, sizeof old) || chdir(dir) != 0)
        die("cannot enter %s", dir);
    write_text("text.txt", cache_text);
    if (run_text("char", "cache", 4, "0.1", NULL) != TR_OK)
        die("the text plugin does not cache a plain text");
    char path[4200];
    if (find_suffix("cache", ".tokens", path, sizeof path) != 0)
        die("no token cache was written");
    add_seed_file("textcache-tokens", path);
    if (find_suffix("cache", ".chars", path, sizeof path) != 0)
        die("no character table was written");
    add_seed_file("textcache-chars", path);
    if (chdir(old) != 0)
        die("cannot go back to %s", old);
}

static void make_safetensors_seeds(void)
{
    float w[12];
    uint16_t half[6] = {0x3f80, 0x4000, 0xbf80, 0x0000, 0x7f80, 0x0001};
    int32_t ids[3] = {1, -1, 7};
    for (int i = 0; i < 12; i++)
        w[i] = (float)i * 0.5f;
    struct tr_st_entry e[3] = {
        {"w", TR_F32, 2, {3, 4, 0, 0}, w, sizeof w},
        {"h.bias", TR_BF16, 1, {6, 0, 0, 0}, half, sizeof half},
        {"ids", TR_I32, 3, {1, 3, 1, 0}, ids, sizeof ids},
    };
    size_t n;
    void *b = tr_safetensors_write(e, 3, "{\"format\":\"pt\"}", &n);
    add_seed("safetensors", b, n);
    free(b);
    b = tr_safetensors_write(e, 1, NULL, &n);
    add_seed("safetensors", b, n);
    /* its header alone, for the JSON parser */
    add_seed("json", (unsigned char *)b + 8, n - 8 - sizeof w);
    free(b);
}

/* A two-step run with a checkpoint, the template of the checkpoint targets. */
static void make_template(const char *work)
{
    snprintf(template_dir, sizeof template_dir, "%s/template", work);
    if (mkdir(template_dir, 0755) != 0)
        die("mkdir %s: %s", template_dir, strerror(errno));
    char old[4096];
    if (!getcwd(old, sizeof old) || chdir(template_dir) != 0)
        die("cannot enter %s", template_dir);
    write_text("r.lua", tiny_recipe);
    const char *args[] = {"r.lua", "--quiet", NULL};
    run_trainrun(args);
    struct stat st;
    have_template = stat(CKPT "/state.json", &st) == 0;
    if (!have_template)
        die("the template run wrote no checkpoint; see %s/trainrun.out", template_dir);
    add_seed_file("state", CKPT "/state.json");
    add_seed_file("json", CKPT "/state.json");
    add_seed_file("checkpoint", CKPT "/model.safetensors");
    add_seed_file("safetensors", CKPT "/model.safetensors");
    remove("trainrun.out");
    if (chdir(old) != 0)
        die("cannot go back to %s", old);
}

/* A valid TRIMAGES shard of three 3x4 RGB images of 2 classes, and the
 * fixture images. */
static void make_image_seeds(void)
{
    enum { N = 3, BYTES = 3 * 4 * 3 };
    unsigned char b[TR_IMAGES_HEADER_BYTES + N * BYTES + N * 4];
    unsigned char *body = b + TR_IMAGES_HEADER_BYTES;
    for (int i = 0; i < N * BYTES; i++)
        body[i] = (unsigned char)(i * 29);
    for (int i = 0; i < N; i++)
        tr_images_put32(body + N * BYTES + 4 * i, (uint32_t)(i % 2));
    struct tr_images_header hd = {.version = TR_IMAGES_VERSION, .height = 3, .width = 4,
                                  .channels = 3, .count = N, .classes = 2};
    hd.checksum = tr_images_checksum(body, sizeof b - TR_IMAGES_HEADER_BYTES);
    tr_images_header_write(b, &hd);
    add_seed("images-shard", b, sizeof b);
    char path[4400];
    snprintf(path, sizeof path, "%s/tests/fixtures/images", srcdir);
    each_file(path, ".png", seed_from, "image");
    each_file(path, ".jpg", seed_from, "image");
    each_file(path, ".webp", seed_from, "image");
    each_file(path, ".tar", seed_from, "prepare-tar");
}

static void gather_seeds(const char *work)
{
    char path[4400];
    make_image_seeds();
    make_shard_seeds();
    make_csv_seeds();
    make_idx_seeds();
    make_text_seeds();
    make_safetensors_seeds();
    make_op_shape_seeds();
    char cache_dir[4200];
    snprintf(cache_dir, sizeof cache_dir, "%s/cache-seeds", work);
    if (mkdir(cache_dir, 0755) != 0)
        die("mkdir %s: %s", cache_dir, strerror(errno));
    make_cache_seeds(cache_dir);
    snprintf(path, sizeof path, "%s/tests/fixtures/tiny_gpt.safetensors", srcdir);
    add_seed_file("safetensors", path);
    add_seed_file("checkpoint", path);
    snprintf(path, sizeof path, "%s/tests/fixtures/chat/chatml/tokenizer_config.json", srcdir);
    add_seed_file("chat-template", path);
    snprintf(path, sizeof path, "%s/tests/fixtures/chat/llama3/tokenizer_config.json", srcdir);
    add_seed_file("chat-template", path);
    snprintf(path, sizeof path, "%s/tests/config", srcdir);
    each_file(path, ".lua", seed_from, "recipe");
    snprintf(path, sizeof path, "%s/recipes", srcdir);
    each_file(path, ".lua", seed_from, "recipe");
    if (trainrun)
        make_template(work);
}

/* ---- the mutator ------------------------------------------------------------- */

static const int64_t interesting[] = {
    0, 1, -1, 2, 7, 8, 16, 64, 127, 128, 255, 256, 1024, 4096, 32767, 32768, 65535, 65536,
    INT32_MAX, (int64_t)INT32_MAX + 1, UINT32_MAX, (int64_t)UINT32_MAX + 1, INT64_MAX,
    INT64_MIN, 20240520, 0x7f800000 /* +inf as float32 bits */, 0x7fc00000 /* NaN */,
};
static const char *const interesting_text[] = {
    "0", "-1", "1", "-0", "2147483647", "2147483648", "4294967295", "4294967296",
    "9223372036854775807", "18446744073709551615", "1e308", "1e309", "-1e309", "nan", "inf",
    "1e-320", "0.5", "65536", "99999999999999999999999",
};

static void ensure(struct buf *b, size_t n)
{
    unsigned char *p = realloc(b->p, n ? n : 1);
    if (!p)
        die("out of memory");
    b->p = p;
}

static void insert_bytes(struct buf *b, size_t at, const void *data, size_t n)
{
    if (b->n + n > FUZZ_MAX_INPUT)
        return;
    ensure(b, b->n + n);
    memmove(b->p + at + n, b->p + at, b->n - at);
    memcpy(b->p + at, data, n);
    b->n += n;
}

static void erase_bytes(struct buf *b, size_t at, size_t n)
{
    if (at + n > b->n)
        n = b->n - at;
    memmove(b->p + at, b->p + at + n, b->n - at - n);
    b->n -= n;
}

/* A run of decimal digits (with sign, point, exponent) at or after `from`. */
static int find_number(const struct buf *b, size_t from, size_t *at, size_t *len)
{
    for (size_t i = from; i < b->n; i++) {
        if (b->p[i] < '0' || b->p[i] > '9')
            continue;
        size_t s = i > 0 && b->p[i - 1] == '-' ? i - 1 : i, e = i;
        while (e < b->n && strchr("0123456789.eE+-", b->p[e]) && b->p[e])
            e++;
        *at = s;
        *len = e - s;
        return 1;
    }
    return 0;
}

static void mutate_once(struct buf *b, uint64_t *rng, const struct target *t)
{
    size_t n = b->n;
    switch (below(rng, n ? 11 : 3)) {
    case 0: { /* insert random bytes */
        unsigned char r[8];
        size_t k = 1 + below(rng, 8);
        for (size_t i = 0; i < k; i++)
            r[i] = (unsigned char)tr_splitmix64_next(rng);
        insert_bytes(b, below(rng, n + 1), r, k);
        break;
    }
    case 1: { /* insert a token of the format */
        if (!t->dict) {
            unsigned char z[4] = {0, 0xff, 0x80, 0x7f};
            insert_bytes(b, below(rng, n + 1), z + below(rng, 4), 1);
            break;
        }
        size_t count = 1;
        for (const char *p = t->dict; *p; p++)
            count += *p == '\1';
        size_t want = below(rng, count);
        const char *p = t->dict;
        for (size_t i = 0; i < want; i++)
            p = strchr(p, '\1') + 1;
        const char *end = strchr(p, '\1');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        insert_bytes(b, below(rng, n + 1), p, len ? len : 1); /* "" stands for a NUL byte */
        break;
    }
    case 2: { /* splice in part of another seed */
        if (!t->n_seeds)
            break;
        const struct buf *o = &t->seeds[below(rng, t->n_seeds)];
        if (!o->n)
            break;
        size_t from = below(rng, o->n), len = 1 + below(rng, o->n - from);
        if (len > 4096)
            len = 4096;
        unsigned char *copy = xmalloc(len);
        memcpy(copy, o->p + from, len);
        insert_bytes(b, below(rng, n + 1), copy, len);
        free(copy);
        break;
    }
    case 3: /* flip a bit */
        b->p[below(rng, n)] ^= (unsigned char)(1u << below(rng, 8));
        break;
    case 4: /* set a byte */
        b->p[below(rng, n)] = (unsigned char)tr_splitmix64_next(rng);
        break;
    case 5: /* delete a range */
        erase_bytes(b, below(rng, n), 1 + below(rng, below(rng, 2) ? 4 : n));
        break;
    case 6: /* truncate */
        b->n = below(rng, n);
        break;
    case 7: { /* an interesting integer, 1/2/4/8 bytes, either byte order */
        int64_t v = interesting[below(rng, sizeof interesting / sizeof interesting[0])];
        size_t width = (size_t)1 << below(rng, 4);
        if (width > n)
            break;
        size_t at = below(rng, n - width + 1);
        if (below(rng, 3) == 0 && n >= 64) /* header fields sit at small, aligned offsets */
            at = (below(rng, 16) * 4) % (n - width + 1);
        int big = (int)below(rng, 2);
        for (size_t i = 0; i < width; i++)
            b->p[at + (big ? width - 1 - i : i)] = (unsigned char)((uint64_t)v >> (8 * i));
        break;
    }
    case 8: { /* replace a decimal number in text with an interesting one */
        size_t at, len;
        if (!find_number(b, below(rng, n), &at, &len) && !find_number(b, 0, &at, &len))
            break;
        const char *s = interesting_text[below(rng, sizeof interesting_text /
                                                    sizeof interesting_text[0])];
        erase_bytes(b, at, len);
        insert_bytes(b, at, s, strlen(s));
        break;
    }
    case 9: { /* duplicate a range */
        size_t from = below(rng, n), len = 1 + below(rng, n - from);
        if (len > 4096)
            len = 4096;
        unsigned char *copy = xmalloc(len);
        memcpy(copy, b->p + from, len);
        insert_bytes(b, below(rng, n + 1), copy, len);
        free(copy);
        break;
    }
    default: { /* swap two bytes */
        size_t i = below(rng, n), j = below(rng, n);
        unsigned char c = b->p[i];
        b->p[i] = b->p[j];
        b->p[j] = c;
        break;
    }
    }
}

static struct buf mutate(const struct buf *seed, uint64_t *rng, const struct target *t)
{
    struct buf b = {xmalloc(seed->n + 1), seed->n};
    memcpy(b.p, seed->p, seed->n);
    int rounds = 1 + (int)below(rng, below(rng, 4) ? 3 : 8);
    for (int i = 0; i < rounds; i++)
        mutate_once(&b, rng, t);
    return b;
}

/* ---- running a case -------------------------------------------------------------- */

static double timeout_s = 20;
static const char *work_dir;
static const char *fail_dir = "fuzz-failures";
static int no_fork;
static unsigned long long case_counter;

static volatile sig_atomic_t alarm_fired;
static void on_alarm(int sig)
{
    (void)sig;
    alarm_fired = 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void print_tail(const char *path)
{
    struct buf b;
    if (read_file(path, &b) != 0 || b.n == 0)
        return;
    size_t from = b.n > 8000 ? b.n - 8000 : 0;
    fprintf(stderr, "--- the case's output (end) ---\n%.*s\n---\n", (int)(b.n - from),
            (char *)b.p + from);
    free(b.p);
}

/* Run one input of a target in a child process; returns 0 when it passed.
 * `label` names the case in messages. */
static int run_case(const struct target *t, const struct buf *in, const char *label,
                    const char *replay_name)
{
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/case-%llu", work_dir, case_counter++);
    if (mkdir(dir, 0755) != 0)
        die("mkdir %s: %s", dir, strerror(errno));
    uint64_t h = hash_bytes(in->p, in->n);
    if (no_fork) {
        char old[4096];
        if (!getcwd(old, sizeof old) || chdir(dir) != 0)
            die("cannot enter %s", dir);
        t->run(in, h);
        if (chdir(old) != 0)
            die("cannot go back");
        tr_test_remove_tree(dir);
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0);
        char out[4500];
        snprintf(out, sizeof out, "%s/case.out", dir);
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || chdir(dir) != 0)
            _exit(125);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        t->run(in, h);
        exit(0); /* exit, not _exit: LeakSanitizer checks at exit */
    }
    setpgid(pid, pid);
    /* block in waitpid; SIGALRM (no SA_RESTART) interrupts it at the timeout */
    alarm_fired = 0;
    alarm((unsigned)ceil(timeout_s));
    int status = 0, timed_out = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, 0);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR)
            die("waitpid: %s", strerror(errno));
        if (alarm_fired) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            timed_out = 1;
            break;
        }
    }
    alarm(0);
    kill(-pid, SIGKILL); /* a trainrun the case left behind */
    int ok = !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok) {
        tr_test_remove_tree(dir);
        return 0;
    }
    fprintf(stderr, "\nfuzz: FAIL: target %s, %s: ", t->name, label);
    if (timed_out)
        fprintf(stderr, "still running after %g s (a hang?)\n", timeout_s);
    else if (WIFSIGNALED(status))
        fprintf(stderr, "killed by signal %d (%s)\n", WTERMSIG(status),
                strsignal(WTERMSIG(status)));
    else
        fprintf(stderr, "exit code %d (3: an invariant broke; others: a sanitizer report)\n",
                WEXITSTATUS(status));
    char out[4500];
    snprintf(out, sizeof out, "%s/case.out", dir);
    print_tail(out);
    if (!replay_name) {
        mkdir(fail_dir, 0755);
        char saved[4400];
        snprintf(saved, sizeof saved, "%s/%s-%s", fail_dir, t->name, label);
        for (char *p = saved + strlen(fail_dir) + 1; *p; p++)
            if (*p == ' ' || *p == '/')
                *p = '-';
        write_file(saved, in->p, in->n);
        fprintf(stderr, "fuzz: input saved as %s; replay it with\n  tests/fuzz --replay %s %s\n",
                saved, t->name, saved);
    } else {
        fprintf(stderr, "fuzz: input: %s\n", replay_name);
    }
    fprintf(stderr, "fuzz: the case's files are kept in %s\n", dir);
    return 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: fuzz [--cases N] [--seed N] [--target NAME] [--timeout S]\n"
            "       fuzz --replay TARGET FILE...\n"
            "       fuzz --list\n"
            "Environment: TR_FUZZ_CASES, TR_FUZZ_SEED, TR_FUZZ_TIMEOUT, TR_FUZZ_OUT,\n"
            "TR_FUZZ_NOFORK, TR_SRCDIR, TR_PLUGIN_BUILD_DIR, TRAINRUN (see docs/testing.md)\n");
}

struct corpus_ud {
    struct target *t;
    int failures;
    int runs;
};

static void corpus_case(const char *path, void *p)
{
    struct corpus_ud *ud = p;
    struct buf b;
    if (read_file(path, &b) != 0)
        die("cannot read %s", path);
    const char *slash = strrchr(path, '/');
    char label[512];
    const char *base = slash ? slash + 1 : path;
    snprintf(label, sizeof label, "corpus file %s", base);
    must_reject = strncmp(base, "reject-", 7) == 0;
    ud->failures += run_case(ud->t, &b, label, path);
    must_reject = 0;
    ud->runs++;
    free(b.p);
}

int main(int argc, char **argv)
{
    unsigned long long cases = 2000, seed = 20261124;
    const char *only = NULL, *replay = NULL;
    int first_file = argc;
    if (getenv("TR_FUZZ_CASES"))
        cases = strtoull(getenv("TR_FUZZ_CASES"), NULL, 10);
    if (getenv("TR_FUZZ_SEED"))
        seed = strtoull(getenv("TR_FUZZ_SEED"), NULL, 10);
    if (getenv("TR_FUZZ_TIMEOUT"))
        timeout_s = strtod(getenv("TR_FUZZ_TIMEOUT"), NULL);
    if (getenv("TR_FUZZ_OUT") && *getenv("TR_FUZZ_OUT"))
        fail_dir = getenv("TR_FUZZ_OUT");
    no_fork = getenv("TR_FUZZ_NOFORK") && strcmp(getenv("TR_FUZZ_NOFORK"), "1") == 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--cases") == 0 && i + 1 < argc) {
            cases = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(a, "--seed") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(a, "--target") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else if (strcmp(a, "--timeout") == 0 && i + 1 < argc) {
            timeout_s = strtod(argv[++i], NULL);
        } else if (strcmp(a, "--replay") == 0 && i + 2 < argc) {
            replay = argv[++i];
            first_file = i + 1;
            break;
        } else if (strcmp(a, "--list") == 0) {
            for (size_t k = 0; k < N_TARGETS; k++)
                printf("%s%s\n", targets[k].name, targets[k].needs_binary ? " (runs trainrun)" : "");
            return 0;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if ((only && !find_target(only)) || (replay && !find_target(replay)))
        die("no target %s (fuzz --list names them)", only ? only : replay);

    srcdir = getenv("TR_SRCDIR");
    if (!srcdir || !*srcdir)
        die("set TR_SRCDIR to the source tree (make check does)");
    trainrun = getenv("TRAINRUN");
    if (trainrun && (!*trainrun || access(trainrun, X_OK) != 0))
        trainrun = NULL;
    /* recipes that extend the shipped ones find them */
    char recipe_path[8400];
    snprintf(recipe_path, sizeof recipe_path, "%s/recipes:%s/tests/config", srcdir, srcdir);
    setenv("TRAINRUN_RECIPE_PATH", recipe_path, 1);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: the alarm interrupts waitpid */
    sigaction(SIGALRM, &sa, NULL);
    load_plugins();

    char work[4096];
    snprintf(work, sizeof work, "%s/trfuzz-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(work))
        die("mkdtemp %s: %s", work, strerror(errno));
    work_dir = work;
    if (work[0] != '/')
        die("TMPDIR must be an absolute path");
    gather_seeds(work);

    int failures = 0;
    double start = now();
    if (replay) {
        struct target *t = find_target(replay);
        if (t->needs_binary && !trainrun)
            die("target %s runs trainrun: set TRAINRUN to the binary", t->name);
        for (int i = first_file; i < argc; i++) {
            struct buf b;
            if (read_file(argv[i], &b) != 0)
                die("cannot read %s: %s", argv[i], strerror(errno));
            const char *slash = strrchr(argv[i], '/');
            must_reject = strncmp(slash ? slash + 1 : argv[i], "reject-", 7) == 0;
            int bad = run_case(t, &b, "replay", argv[i]);
            printf("fuzz: %s %s: %s\n", t->name, argv[i], bad ? "FAIL" : "ok");
            failures += bad;
            free(b.p);
        }
        tr_test_remove_tree(work);
        return failures ? 1 : 0;
    }

    /* Every committed corpus file, as it is: the regression cases. */
    int corpus_runs = 0;
    for (size_t i = 0; i < N_TARGETS; i++) {
        struct target *t = &targets[i];
        if ((only && strcmp(only, t->name) != 0) || (t->needs_binary && !trainrun))
            continue;
        char dir[4400];
        snprintf(dir, sizeof dir, "%s/tests/fuzz-corpus/%s", srcdir, t->name);
        struct corpus_ud ud = {t, 0, 0};
        each_file(dir, NULL, corpus_case, &ud);
        failures += ud.failures;
        corpus_runs += ud.runs;
        each_file(dir, NULL, seed_from, (void *)t->name); /* and seeds for mutation */
    }

    int total_weight = 0;
    for (size_t i = 0; i < N_TARGETS; i++)
        if ((!only || strcmp(only, targets[i].name) == 0) &&
            (!targets[i].needs_binary || trainrun) && targets[i].n_seeds)
            total_weight += targets[i].weight;
    if (total_weight == 0)
        die("no target to run%s", trainrun ? "" : " (the whole-binary targets need TRAINRUN)");
    unsigned long long per_target[N_TARGETS] = {0};
    for (unsigned long long c = 0; c < cases; c++) {
        uint64_t rng = seed ^ (c * 0xd1342543de82ef95ULL);
        tr_splitmix64_next(&rng);
        int w = (int)below(&rng, (uint64_t)total_weight);
        struct target *t = NULL;
        for (size_t i = 0; i < N_TARGETS; i++) {
            if ((only && strcmp(only, targets[i].name) != 0) ||
                (targets[i].needs_binary && !trainrun) || !targets[i].n_seeds)
                continue;
            if (w < targets[i].weight) {
                t = &targets[i];
                per_target[i]++;
                break;
            }
            w -= targets[i].weight;
        }
        const struct buf *s = &t->seeds[below(&rng, t->n_seeds)];
        struct buf in = mutate(s, &rng, t);
        char label[64];
        snprintf(label, sizeof label, "case %llu of seed %llu", c, seed);
        failures += run_case(t, &in, label, NULL);
        free(in.p);
    }
    double took = now() - start;
    printf("fuzz: %llu mutated cases and %d corpus files in %.1f s (seed %llu), %d failing\n",
           cases, corpus_runs, took, seed, failures);
    for (size_t i = 0; i < N_TARGETS; i++)
        if (per_target[i])
            printf("  %-18s %6llu cases, %zu seeds\n", targets[i].name, per_target[i],
                   targets[i].n_seeds);
    if (!trainrun)
        printf("fuzz: TRAINRUN is not set: recipes and checkpoints were not fuzzed\n");
    if (!failures)
        tr_test_remove_tree(work);
    else
        printf("fuzz: the failing cases' files are under %s\n", work);
    for (size_t i = 0; i < N_TARGETS; i++) {
        for (size_t k = 0; k < targets[i].n_seeds; k++)
            free(targets[i].seeds[k].p);
        free(targets[i].seeds);
    }
    return failures ? 1 : 0;
}
