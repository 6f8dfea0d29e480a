/* Hugging Face weights in (tr_hf_load); hf_weights.h says how names and
 * layouts map, hf_export.c writes them out.  The files are mmap'd: a 1B
 * model is gigabytes, and each tensor is converted to fp32 and uploaded on
 * its own, so the host holds one tensor's fp32 copy at a time, and the
 * mapped pages of a tensor uploaded are given back (else a whole model's
 * file stays resident beside its parameters until the end of the load:
 * 2.8 GB at the peak of a 360M model's sample, 1.4 GB of them the file). */
#define _XOPEN_SOURCE 700
#define _DEFAULT_SOURCE /* madvise's MADV_DONTNEED (posix_madvise's is a no-op in glibc) */
#include "hf_weights.h"

#include "backend.h"
#include "adapters.h"

#include "../../kernels/host.h"
#include "../util/json.h"
#include "../util/util.h"

#include <trainrun/input.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define MAX_INDEX_BYTES ((size_t)64 << 20)
#define MAX_SHARDS 4096
#define NAMES_SHOWN 4

/* ---- the tensors of an architecture ----------------------------------------- */

static void add(struct tr_hf_tensor **t, size_t *n, size_t *cap, char *name, int ndim, int64_t d0,
                int64_t d1, int transposed)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *t = tr_xrealloc(*t, *cap * sizeof **t);
    }
    (*t)[(*n)++] = (struct tr_hf_tensor){name, ndim, {d0, ndim > 1 ? d1 : 0}, transposed, d0};
}

size_t tr_hf_tensors(const struct tr_hf_arch *a, int64_t ctx, struct tr_hf_tensor **out)
{
    struct tr_hf_tensor *t = NULL;
    size_t n = 0, cap = 0;
    int64_t V = a->vocab, C = a->dim, F = a->ffn_dim, D = a->dim / a->heads, KV = a->kv_heads * D;
    if (a->family == TR_HF_GPT2) {
        add(&t, &n, &cap, tr_xstrdup("transformer.wte.weight"), 2, V, C, 0);
        add(&t, &n, &cap, tr_xstrdup("transformer.wpe.weight"), 2, a->ctx, C, 0);
        t[n - 1].rows = ctx; /* trainrun keeps the positions of its context */
        for (int64_t l = 0; l < a->layers; l++) {
            /* Conv1D weights are [in, out] in the file */
            static const char *const names[] = {"ln_1", "attn.c_attn", "attn.c_proj", "ln_2",
                                                "mlp.c_fc", "mlp.c_proj"};
            int64_t in[] = {0, C, C, 0, C, 4 * C}, outs[] = {C, 3 * C, C, C, 4 * C, C};
            for (int k = 0; k < 6; k++) {
                if (in[k])
                    add(&t, &n, &cap, tr_xasprintf("transformer.h.%lld.%s.weight", (long long)l, names[k]), 2,
                        in[k], outs[k], 1);
                else
                    add(&t, &n, &cap, tr_xasprintf("transformer.h.%lld.%s.weight", (long long)l, names[k]), 1,
                        outs[k], 0, 0);
                add(&t, &n, &cap, tr_xasprintf("transformer.h.%lld.%s.bias", (long long)l, names[k]), 1,
                    outs[k], 0, 0);
            }
        }
        add(&t, &n, &cap, tr_xstrdup("transformer.ln_f.weight"), 1, C, 0, 0);
        add(&t, &n, &cap, tr_xstrdup("transformer.ln_f.bias"), 1, C, 0, 0);
        *out = t;
        return n;
    }
    add(&t, &n, &cap, tr_xstrdup("model.embed_tokens.weight"), 2, V, C, 0);
    for (int64_t l = 0; l < a->layers; l++) {
        long long L = (long long)l;
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.input_layernorm.weight", L), 1, C, 0, 0);
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.self_attn.q_proj.weight", L), 2, C, C, 0);
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.self_attn.k_proj.weight", L), 2, KV, C, 0);
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.self_attn.v_proj.weight", L), 2, KV, C, 0);
        if (a->qkv_bias) {
            add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.self_attn.q_proj.bias", L), 1, C, 0, 0);
            add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.self_attn.k_proj.bias", L), 1, KV, 0, 0);
            add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.self_attn.v_proj.bias", L), 1, KV, 0, 0);
        }
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.self_attn.o_proj.weight", L), 2, C, C, 0);
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.post_attention_layernorm.weight", L), 1, C, 0, 0);
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.mlp.gate_proj.weight", L), 2, F, C, 0);
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.mlp.up_proj.weight", L), 2, F, C, 0);
        add(&t, &n, &cap, tr_xasprintf("model.layers.%lld.mlp.down_proj.weight", L), 2, C, F, 0);
    }
    add(&t, &n, &cap, tr_xstrdup("model.norm.weight"), 1, C, 0, 0);
    if (!a->tie_embeddings)
        add(&t, &n, &cap, tr_xstrdup("lm_head.weight"), 2, V, C, 0);
    *out = t;
    return n;
}

void tr_hf_tensors_free(struct tr_hf_tensor *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(t[i].name);
    free(t);
}

/* ---- the files of a model directory ------------------------------------------ */

struct shard {
    char *path;
    void *map;
    size_t size;
    struct tr_st_file *st;
};

struct source {
    struct shard *shards;
    size_t n;
    char *what; /* model.safetensors or the index, for messages */
};

static void source_close(struct source *s)
{
    for (size_t i = 0; i < s->n; i++) {
        tr_safetensors_free(s->shards[i].st);
        if (s->shards[i].map)
            munmap(s->shards[i].map, s->shards[i].size);
        free(s->shards[i].path);
    }
    free(s->shards);
    free(s->what);
    memset(s, 0, sizeof *s);
}

static int open_shard(struct shard *sh, tr_err *err)
{
    int fd = tr_input_open(sh->path);
    struct stat st;
    if (fd < 0)
        return tr_fail(err, "cannot read %s: %s", sh->path, tr_input_strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tr_fail(err, "cannot read %s: not a regular file", sh->path);
    }
    sh->size = (size_t)st.st_size;
    if (sh->size >= 8) {
        sh->map = mmap(NULL, sh->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (sh->map == MAP_FAILED) {
            sh->map = NULL;
            close(fd);
            return tr_fail(err, "cannot map %s: %s", sh->path, strerror(errno));
        }
    }
    close(fd);
    sh->st = tr_safetensors_read(sh->map ? sh->map : "", sh->map ? sh->size : 0, sh->path, err);
    return sh->st ? TR_OK : TR_ERROR;
}

static int read_small(const char *path, size_t limit, char **text, size_t *len, tr_err *err)
{
    FILE *f = tr_input_fopen(path);
    struct stat st;
    if (!f)
        return tr_fail(err, "cannot read %s: %s", path, tr_input_strerror(errno));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > limit) {
        fclose(f);
        return tr_fail(err, "%s is not a regular file of at most %zu MiB", path, limit >> 20);
    }
    *len = (size_t)st.st_size;
    *text = tr_xcalloc(1, *len + 1);
    int ok = fread(*text, 1, *len, f) == *len;
    fclose(f);
    if (!ok) {
        free(*text);
        return tr_fail(err, "cannot read %s", path);
    }
    return TR_OK;
}

/* A shard's file name from an index: a plain name inside the directory. */
static int plain_name(const char *s)
{
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static int source_open(struct source *s, const char *dir, tr_err *err)
{
    memset(s, 0, sizeof *s);
    char *single = tr_xasprintf("%s/model.safetensors", dir);
    char *index = tr_xasprintf("%s/model.safetensors.index.json", dir);
    struct stat st;
    int rc = TR_ERROR;
    if (stat(single, &st) == 0) {
        s->what = single;
        single = NULL;
        s->shards = tr_xcalloc(1, sizeof *s->shards);
        s->shards[0].path = tr_xstrdup(s->what);
        s->n = 1;
        rc = open_shard(&s->shards[0], err);
        goto done;
    }
    if (stat(index, &st) != 0) {
        char *bin = tr_xasprintf("%s/pytorch_model.bin", dir);
        int has_bin = stat(bin, &st) == 0;
        free(bin);
        rc = tr_fail(err, "%s holds neither model.safetensors nor model.safetensors.index.json%s",
                     dir, has_bin ? " (only pytorch_model.bin, which trainrun does not read: save "
                                    "the model again with safe_serialization=True)" : "");
        goto done;
    }
    s->what = index;
    index = NULL;
    char *text = NULL;
    size_t len = 0, bad = 0;
    if (read_small(s->what, MAX_INDEX_BYTES, &text, &len, err) != TR_OK)
        goto done;
    struct tr_json *j = tr_json_parse(text, len, &bad);
    free(text);
    const struct tr_json *map = tr_json_get(j, "weight_map");
    if (!map || map->type != TR_JSON_OBJECT) {
        tr_json_free(j);
        rc = tr_fail(err, "%s: no \"weight_map\" object (malformed at byte %zu?)", s->what, bad);
        goto done;
    }
    /* the distinct shard files, in order of first mention */
    char **files = tr_xcalloc(map->n ? map->n : 1, sizeof *files);
    size_t n_files = 0;
    rc = TR_OK;
    for (size_t i = 0; i < map->n && rc == TR_OK; i++) {
        const struct tr_json *v = map->items[i];
        if (v->type != TR_JSON_STRING || !plain_name(v->string)) {
            rc = tr_fail(err, "%s: tensor \"%.80s\" is mapped to %s%.80s%s; shards are files "
                         "inside the model directory", s->what, map->keys[i],
                         v->type == TR_JSON_STRING ? "\"" : "a non-string",
                         v->type == TR_JSON_STRING ? v->string : "",
                         v->type == TR_JSON_STRING ? "\"" : "");
            break;
        }
        size_t k = 0;
        while (k < n_files && strcmp(files[k], v->string) != 0)
            k++;
        if (k == n_files)
            files[n_files++] = v->string;
    }
    if (rc == TR_OK && (n_files == 0 || n_files > MAX_SHARDS))
        rc = tr_fail(err, "%s names %zu shard files; expected 1 to %d", s->what, n_files, MAX_SHARDS);
    if (rc == TR_OK) {
        s->shards = tr_xcalloc(n_files, sizeof *s->shards);
        for (size_t k = 0; k < n_files; k++)
            s->shards[k].path = tr_xasprintf("%s/%s", dir, files[k]);
        s->n = n_files;
        for (size_t k = 0; k < n_files && rc == TR_OK; k++)
            rc = open_shard(&s->shards[k], err);
    }
    free(files);
    tr_json_free(j);
done:
    free(single);
    free(index);
    if (rc != TR_OK)
        source_close(s);
    return rc;
}

/* The entry named `name` in any shard; *twice set when two shards hold it. */
static const struct tr_st_entry *source_find(const struct source *s, const char *name, int *twice)
{
    const struct tr_st_entry *found = NULL;
    for (size_t k = 0; k < s->n; k++) {
        const struct tr_st_entry *e = tr_safetensors_find(s->shards[k].st, name);
        if (e && found)
            *twice = 1;
        if (e && !found)
            found = e;
    }
    return found;
}

/* Tensors files carry that are no parameters: a tied head saved anyway (transformers
 * ties it on load too), GPT-2's attention mask buffers, and the rotary
 * frequencies older Llama checkpoints saved (trainrun computes them from
 * rope_theta, as transformers does now). */
static int ignorable(const struct tr_hf_arch *a, const char *name)
{
    if (a->tie_embeddings && strcmp(name, "lm_head.weight") == 0)
        return 1;
    static const char *const gpt2[] = {".attn.bias", ".attn.masked_bias"};
    static const char *const llama[] = {".self_attn.rotary_emb.inv_freq"};
    const char *const *buffers = a->family == TR_HF_GPT2 ? gpt2 : llama;
    int n_buffers = a->family == TR_HF_GPT2 ? 2 : 1;
    size_t len = strlen(name);
    for (int k = 0; k < n_buffers; k++) {
        size_t b = strlen(buffers[k]);
        if (len > b && strcmp(name + len - b, buffers[k]) == 0)
            return 1;
    }
    return 0;
}

/* Problems, collected so that one message names all of them. */
struct problems {
    size_t count[3]; /* missing, mis-shaped, unexpected */
    char list[3][600];
};

static void note(struct problems *p, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void note(struct problems *p, int kind, const char *fmt, ...)
{
    if (p->count[kind]++ < NAMES_SHOWN) {
        char *l = p->list[kind];
        size_t used = strlen(l);
        if (used)
            snprintf(l + used, sizeof p->list[kind] - used, ", ");
        used = strlen(l);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(l + used, sizeof p->list[kind] - used, fmt, ap);
        va_end(ap);
    }
}

static int report(struct problems *p, const char *what, tr_err *err)
{
    static const char *const kinds[] = {"missing", "mis-shaped", "unexpected"};
    if (!p->count[0] && !p->count[1] && !p->count[2])
        return TR_OK;
    char msg[2000] = "";
    for (int k = 0; k < 3; k++) {
        if (!p->count[k])
            continue;
        size_t used = strlen(msg);
        snprintf(msg + used, sizeof msg - used, "%s%zu %s (%s%s)", used ? "; " : "", p->count[k],
                 kinds[k], p->list[k], p->count[k] > NAMES_SHOWN ? ", ..." : "");
    }
    return tr_fail(err, "%s does not hold the weights config.json describes: %s", what, msg);
}

static void shape_text(const int64_t *shape, int ndim, char *buf, size_t size)
{
    snprintf(buf, size, "[");
    for (int d = 0; d < ndim; d++)
        snprintf(buf + strlen(buf), size - strlen(buf), "%s%lld", d ? "," : "", (long long)shape[d]);
    snprintf(buf + strlen(buf), size - strlen(buf), "]");
}

void tr_hf_to_f32(const struct tr_st_entry *e, float *out, size_t numel)
{
    if (e->dtype == TR_F32)
        memcpy(out, e->data, numel * sizeof(float));
    else
        tr_cpu_from_half(out, e->data, numel, e->dtype == TR_BF16);
}

void tr_hf_transpose(float *out, const float *in, int64_t r, int64_t c)
{
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++)
            out[j * r + i] = in[i * c + j];
}

/* The entry of tensor t in s, under its name or (GPT-2) without the
 * "transformer." prefix, as GPT2Model saves it. */
static const struct tr_st_entry *find_tensor(const struct source *s, const struct tr_hf_arch *a,
                                             const char *name, int *twice)
{
    const struct tr_st_entry *e = source_find(s, name, twice);
    if (!e && a->family == TR_HF_GPT2 && strncmp(name, "transformer.", 12) == 0)
        e = source_find(s, name + 12, twice);
    return e;
}

/* Every tensor config.json implies, found in the files with the shape it
 * implies: found[i], or NULL with the problem noted.  TR_ERROR (err says
 * which) when a tensor is in two shards. */
static int find_wanted(const struct source *s, const struct tr_hf_arch *a,
                       const struct tr_hf_tensor *want, size_t n,
                       const struct tr_st_entry **found, struct problems *p, tr_err *err)
{
    for (size_t i = 0; i < n; i++) {
        int twice = 0;
        found[i] = find_tensor(s, a, want[i].name, &twice);
        if (twice)
            return tr_fail(err, "%s: tensor '%s' is in two shards", s->what, want[i].name);
        char have[128], expect[128];
        shape_text(want[i].shape, want[i].ndim, expect, sizeof expect);
        if (!found[i]) {
            note(p, 0, "%s", want[i].name);
        } else if (found[i]->ndim != want[i].ndim || found[i]->shape[0] != want[i].shape[0] ||
                   (want[i].ndim > 1 && found[i]->shape[1] != want[i].shape[1]) ||
                   found[i]->dtype == TR_I32) {
            shape_text(found[i]->shape, found[i]->ndim, have, sizeof have);
            note(p, 1, "%s: %s%s in the file, %s expected", want[i].name,
                 found[i]->dtype == TR_I32 ? "I32 " : "", have, expect);
            found[i] = NULL;
        }
    }
    return TR_OK;
}

/* Everything in the files is a tensor of the model or a known buffer; the
 * rest is noted as unexpected. */
static void note_unexpected(const struct source *s, const struct tr_hf_arch *a,
                            const struct tr_hf_tensor *want, size_t n, struct problems *p)
{
    for (size_t k = 0; k < s->n; k++)
        for (size_t j = 0; j < tr_safetensors_count(s->shards[k].st); j++) {
            const char *name = tr_safetensors_at(s->shards[k].st, j)->name;
            int known = ignorable(a, name);
            for (size_t i = 0; i < n && !known; i++)
                known = strcmp(want[i].name, name) == 0 ||
                        (a->family == TR_HF_GPT2 && strcmp(want[i].name + 12, name) == 0);
            if (!known)
                note(p, 2, "%s", name);
        }
}

/* The graph must be the model config.json describes, parameter for
 * parameter: param[i], the index of want[i]'s parameter in g. */
static int match_graph(const struct tr_graph *g, const char *dir, const struct tr_hf_tensor *want,
                       size_t n, int *param, tr_err *err)
{
    size_t covered = 0;
    for (size_t i = 0; i < n; i++) {
        param[i] = tr_graph_find(g, want[i].name);
        const struct tr_tensor *t = param[i] >= 0 ? &g->tensors[param[i]] : NULL;
        int64_t r = want[i].transposed ? want[i].shape[1] : want[i].rows;
        int64_t c = want[i].ndim == 1 ? 1 : want[i].transposed ? want[i].shape[0] : want[i].shape[1];
        int weight = t && (t->role == TR_ROLE_PARAM || t->role == TR_ROLE_FROZEN);
        if (!weight || t->numel != (size_t)(r * c) || t->shape[0] != r)
            return tr_fail(err, "%s: the model's graph has no parameter '%s' of %lld x %lld "
                           "values; the model builder does not build what config.json "
                           "describes", dir, want[i].name, (long long)r, (long long)c);
        covered++;
    }
    size_t n_params = 0; /* the base's: an adapter's own come from elsewhere */
    for (int i = 0; i < g->n_tensors; i++)
        n_params += (g->tensors[i].role == TR_ROLE_PARAM || g->tensors[i].role == TR_ROLE_FROZEN) &&
                    !tr_adapter_param(g->tensors[i].name);
    if (covered != n_params)
        return tr_fail(err, "%s: the model has %zu parameters but config.json describes %zu; the "
                       "rest would keep their random values", dir, n_params, covered);
    return TR_OK;
}

/* The CRC-32 of n floats continued from crc (zlib's, in chunks it takes). */
static uint32_t crc_of(uint32_t crc, const float *v, size_t n)
{
    const Bytef *p = (const Bytef *)v;
    size_t bytes = n * sizeof(float);
    while (bytes) {
        uInt k = bytes > (1u << 30) ? (1u << 30) : (uInt)bytes;
        crc = (uint32_t)crc32(crc, p, k);
        p += k;
        bytes -= k;
    }
    return crc;
}

/* The whole pages of [p, p + bytes) of a read-only file mapping given back
 * to the kernel: read again, they come from the file (page cache) anew. */
static void release_mapped(const void *p, size_t bytes)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t from = ((uintptr_t)p + page - 1) & ~(page - 1), to = ((uintptr_t)p + bytes) & ~(page - 1);
    if (to > from)
        madvise((void *)from, to - from, MADV_DONTNEED);
}

/* Each tensor in fp32, transposed where trainrun's layout is, uploaded
 * into its parameter: one tensor's host copy at a time. */
struct keep {
    int (*fn)(void *ctx, const struct tr_tensor *t);
    void *ctx;
};

static int upload_all(struct tr_graph *g, const struct tr_backend *be, const struct source *s,
                      const struct tr_hf_tensor *want, size_t n,
                      const struct tr_st_entry *const *found, const int *param, uint32_t *crc,
                      const struct keep *keep, tr_err *err)
{
    for (size_t i = 0; i < n; i++) {
        struct tr_tensor *t = &g->tensors[param[i]];
        int kept = !keep->fn || keep->fn(keep->ctx, t);
        if (!kept && !crc)
            continue;
        size_t file_numel = (size_t)want[i].shape[0] * (size_t)(want[i].ndim > 1 ? want[i].shape[1] : 1);
        float *host = malloc(file_numel * sizeof(float));
        float *flip = want[i].transposed ? malloc(file_numel * sizeof(float)) : NULL;
        if (!host || (want[i].transposed && !flip)) {
            free(host);
            free(flip);
            return tr_fail(err, "out of memory converting tensor '%s' of %s", want[i].name,
                           s->what);
        }
        tr_hf_to_f32(found[i], host, file_numel);
        release_mapped(found[i]->data, found[i]->bytes);
        if (flip)
            tr_hf_transpose(flip, host, want[i].shape[0], want[i].shape[1]);
        /* rows beyond trainrun's (GPT-2's positions past ctx) are not kept */
        const float *v = flip ? flip : host;
        if (crc)
            *crc = crc_of(*crc, v, t->numel);
        int rc = kept ? tr_be_store_weight(be, t, v, err) : TR_OK;
        free(host);
        free(flip);
        if (rc != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

int tr_hf_load(struct tr_graph *g, const struct tr_backend *be, const char *dir,
               const struct tr_hf_arch *a, uint32_t *crc,
               int (*keep)(void *ctx, const struct tr_tensor *t), void *keep_ctx, tr_err *err)
{
    struct keep k = {keep, keep_ctx};
    struct source s;
    if (source_open(&s, dir, err) != TR_OK)
        return TR_ERROR;
    const struct tr_tensor *in = &g->tensors[g->inputs[0]];
    int64_t ctx = in->ndim == 2 ? in->shape[1] : a->ctx;
    struct tr_hf_tensor *want = NULL;
    size_t n = tr_hf_tensors(a, ctx, &want);
    const struct tr_st_entry **found = tr_xcalloc(n, sizeof *found);
    int *param = tr_xcalloc(n, sizeof *param);
    struct problems p;
    memset(&p, 0, sizeof p);
    int rc = find_wanted(&s, a, want, n, found, &p, err);
    if (rc == TR_OK) {
        note_unexpected(&s, a, want, n, &p);
        rc = report(&p, s.what, err);
    }
    if (rc == TR_OK)
        rc = match_graph(g, dir, want, n, param, err);
    if (rc == TR_OK)
        {
        if (crc)
            *crc = (uint32_t)crc32(0L, Z_NULL, 0);
        rc = upload_all(g, be, &s, want, n, found, param, crc, &k, err);
    }
    free(found);
    free(param);
    tr_hf_tensors_free(want, n);
    source_close(&s);
    return rc;
}
