/* Hugging Face weights in (tr_hf_load) and out (tr_hf_export); hf_weights.h
 * says how names and layouts map.  The files are mmap'd: a 1B model is
 * gigabytes, and each tensor is converted to fp32 and uploaded on its own,
 * so the host holds one tensor's fp32 copy at a time. */
#define _XOPEN_SOURCE 700
#include "hf_weights.h"

#include "../../kernels/host.h"
#include "../util/json.h"
#include "../util/util.h"

#include <dirent.h>
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
    int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return tr_fail(err, "cannot read %s: %s", sh->path, strerror(errno));
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
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f)
        return tr_fail(err, "cannot read %s: %s", path, strerror(errno));
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

/* fp32 values of entry e: numel floats into out. */
static void to_f32(const struct tr_st_entry *e, float *out, size_t numel)
{
    if (e->dtype == TR_F32)
        memcpy(out, e->data, numel * sizeof(float));
    else
        tr_cpu_from_half(out, e->data, numel, e->dtype == TR_BF16);
}

/* [r, c] -> [c, r] */
static void transpose(float *out, const float *in, int64_t r, int64_t c)
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

int tr_hf_load(struct tr_graph *g, const struct tr_backend *be, const char *dir,
               const struct tr_hf_arch *a, tr_err *err)
{
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
    int rc = TR_ERROR;

    /* every tensor config.json implies: in the files, in the graph, same shape */
    for (size_t i = 0; i < n; i++) {
        int twice = 0;
        found[i] = find_tensor(&s, a, want[i].name, &twice);
        if (twice) {
            tr_fail(err, "%s: tensor '%s' is in two shards", s.what, want[i].name);
            goto done;
        }
        char have[128], expect[128];
        shape_text(want[i].shape, want[i].ndim, expect, sizeof expect);
        if (!found[i]) {
            note(&p, 0, "%s", want[i].name);
        } else if (found[i]->ndim != want[i].ndim || found[i]->shape[0] != want[i].shape[0] ||
                   (want[i].ndim > 1 && found[i]->shape[1] != want[i].shape[1]) ||
                   found[i]->dtype == TR_I32) {
            shape_text(found[i]->shape, found[i]->ndim, have, sizeof have);
            note(&p, 1, "%s: %s%s in the file, %s expected", want[i].name,
                 found[i]->dtype == TR_I32 ? "I32 " : "", have, expect);
            found[i] = NULL;
        }
        param[i] = tr_graph_find(g, want[i].name);
    }
    /* everything in the files is a tensor of the model or a known buffer */
    for (size_t k = 0; k < s.n; k++)
        for (size_t j = 0; j < tr_safetensors_count(s.shards[k].st); j++) {
            const char *name = tr_safetensors_at(s.shards[k].st, j)->name;
            int known = ignorable(a, name);
            for (size_t i = 0; i < n && !known; i++)
                known = strcmp(want[i].name, name) == 0 ||
                        (a->family == TR_HF_GPT2 && strcmp(want[i].name + 12, name) == 0);
            if (!known)
                note(&p, 2, "%s", name);
        }
    if (report(&p, s.what, err) != TR_OK)
        goto done;

    /* the graph must be the model config.json describes, parameter for parameter */
    size_t covered = 0;
    for (size_t i = 0; i < n; i++) {
        const struct tr_tensor *t = param[i] >= 0 ? &g->tensors[param[i]] : NULL;
        int64_t r = want[i].transposed ? want[i].shape[1] : want[i].rows;
        int64_t c = want[i].ndim == 1 ? 1 : want[i].transposed ? want[i].shape[0] : want[i].shape[1];
        if (!t || t->role != TR_ROLE_PARAM || t->numel != (size_t)(r * c) || t->shape[0] != r) {
            tr_fail(err, "%s: the model's graph has no parameter '%s' of %lld x %lld values; the "
                    "model builder does not build what config.json describes", dir, want[i].name,
                    (long long)r, (long long)c);
            goto done;
        }
        covered++;
    }
    size_t n_params = 0;
    for (int i = 0; i < g->n_tensors; i++)
        n_params += g->tensors[i].role == TR_ROLE_PARAM;
    if (covered != n_params) {
        tr_fail(err, "%s: the model has %zu parameters but config.json describes %zu; the rest "
                "would keep their random values", dir, n_params, covered);
        goto done;
    }

    for (size_t i = 0; i < n; i++) {
        struct tr_tensor *t = &g->tensors[param[i]];
        size_t file_numel = (size_t)want[i].shape[0] * (size_t)(want[i].ndim > 1 ? want[i].shape[1] : 1);
        float *host = malloc(file_numel * sizeof(float));
        float *flip = want[i].transposed ? malloc(file_numel * sizeof(float)) : NULL;
        if (!host || (want[i].transposed && !flip)) {
            free(host);
            free(flip);
            tr_fail(err, "out of memory converting tensor '%s' of %s", want[i].name, s.what);
            goto done;
        }
        to_f32(found[i], host, file_numel);
        if (flip)
            transpose(flip, host, want[i].shape[0], want[i].shape[1]);
        /* rows beyond trainrun's (GPT-2's positions past ctx) are not kept */
        be->iface->upload(be->context, t->data, flip ? flip : host, t->numel * sizeof(float));
        free(host);
        free(flip);
    }
    rc = TR_OK;
done:
    free(found);
    free(param);
    tr_hf_tensors_free(want, n);
    source_close(&s);
    return rc;
}

/* ---- the architecture of a built graph ------------------------------------ */

static const struct tr_tensor *param_named(const struct tr_graph *g, const char *name)
{
    int i = tr_graph_find(g, name);
    return i >= 0 && g->tensors[i].role == TR_ROLE_PARAM ? &g->tensors[i] : NULL;
}

int tr_hf_describe(const struct tr_graph *g, const char *type, struct tr_hf_arch *a, tr_err *err)
{
    memset(a, 0, sizeof *a);
    int gpt = type && strcmp(type, "gpt") == 0;
    if (!type || (!gpt && strcmp(type, "llama") != 0))
        return tr_fail(err, "the model is %s%s%s; only llama and gpt models have a Hugging Face form",
                       type ? "\"" : "", type ? type : "built by the recipe's own function",
                       type ? "\"" : "");
    const struct tr_tensor *emb = param_named(g, gpt ? "transformer.wte.weight" : "model.embed_tokens.weight");
    const struct tr_tensor *in = &g->tensors[g->inputs[0]];
    if (!emb || emb->ndim != 2 || in->ndim != 2)
        return tr_fail(err, "the %s model has no token embedding", type);
    a->family = gpt ? TR_HF_GPT2 : TR_HF_LLAMA;
    snprintf(a->model_type, sizeof a->model_type, "%s", gpt ? "gpt2" : "llama");
    a->vocab = emb->shape[0];
    a->dim = emb->shape[1];
    a->ctx = in->shape[1];
    char name[96];
    for (;;) {
        snprintf(name, sizeof name, gpt ? "transformer.h.%lld.ln_1.weight" : "model.layers.%lld.input_layernorm.weight",
                 (long long)a->layers);
        if (!param_named(g, name))
            break;
        a->layers++;
    }
    a->norm_eps = gpt ? 1e-5 : 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *nd = &g->nodes[i];
        if (nd->op == TR_OP_ATTENTION && !a->heads) {
            a->heads = nd->heads;
            a->kv_heads = nd->n_in == 3 ? nd->kv_heads : nd->heads;
        } else if (nd->op == TR_OP_ROPE && a->rope_theta == 0) {
            a->rope_theta = nd->theta;
        } else if (nd->op == TR_OP_RMSNORM && a->norm_eps == 0) {
            a->norm_eps = nd->eps;
        } else if (nd->op == TR_OP_LAYERNORM && gpt && nd->eps != 1e-5f) {
            a->norm_eps = nd->eps;
        } else if (nd->op == TR_OP_SCALE) {
            return tr_fail(err, "the %s model scales its embeddings (embed_scale), which none of "
                           "the Hugging Face families trainrun writes does", type);
        }
    }
    if (!gpt) {
        /* the graph holds floats: the shortest decimal that is the same float */
        double vals[2] = {a->rope_theta, a->norm_eps};
        for (int k = 0; k < 2; k++) {
            char buf[40];
            for (int p = 1; p <= 9; p++) {
                snprintf(buf, sizeof buf, "%.*g", p, vals[k]);
                if ((float)strtod(buf, NULL) == (float)vals[k])
                    break;
            }
            vals[k] = strtod(buf, NULL);
        }
        a->rope_theta = vals[0];
        a->norm_eps = vals[1];
    }
    if (a->layers == 0 || a->heads <= 0 || a->dim % a->heads != 0 || (!gpt && (a->kv_heads <= 0 || a->rope_theta <= 0 || a->norm_eps <= 0)))
        return tr_fail(err, "the %s model's graph does not have the shape of one", type);
    if (gpt) {
        a->kv_heads = a->heads;
        a->ffn_dim = 4 * a->dim;
        a->tie_embeddings = 1;
    } else {
        const struct tr_tensor *gate = param_named(g, "model.layers.0.mlp.gate_proj.weight");
        if (!gate)
            return tr_fail(err, "the llama model has no model.layers.0.mlp.gate_proj.weight");
        a->ffn_dim = gate->shape[0];
        a->tie_embeddings = !param_named(g, "lm_head.weight");
        a->qkv_bias = param_named(g, "model.layers.0.self_attn.q_proj.bias") != NULL;
    }
    /* every parameter must be one the Hugging Face form names */
    struct tr_hf_tensor *t = NULL;
    size_t n = tr_hf_tensors(a, a->ctx, &t), params = 0;
    int rc = TR_OK;
    for (size_t i = 0; i < n && rc == TR_OK; i++)
        if (!param_named(g, t[i].name))
            rc = tr_fail(err, "the %s model has no parameter '%s'", type, t[i].name);
    for (int i = 0; i < g->n_tensors; i++)
        params += g->tensors[i].role == TR_ROLE_PARAM;
    if (rc == TR_OK && params != n)
        rc = tr_fail(err, "the %s model has %zu parameters; its Hugging Face form names %zu", type,
                     params, n);
    tr_hf_tensors_free(t, n);
    return rc;
}

/* ---- export -------------------------------------------------------------------- */

#define EXPORT_MARK ".trainrun-export"

/* out_dir new, empty, or an earlier export. */
static int prepare_dir(const char *out_dir, tr_err *err)
{
    struct stat st;
    if (stat(out_dir, &st) != 0) {
        if (tr_mkdir_p(out_dir) != 0)
            return tr_fail(err, "cannot create %s: %s", out_dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return tr_fail(err, "%s exists and is not a directory; export --format hf writes a "
                       "directory", out_dir);
    } else {
        char *mark = tr_xasprintf("%s/" EXPORT_MARK, out_dir);
        int earlier = stat(mark, &st) == 0;
        free(mark);
        if (!earlier) {
            DIR *d = opendir(out_dir);
            if (!d)
                return tr_fail(err, "cannot read %s: %s", out_dir, strerror(errno));
            struct dirent *e;
            int empty = 1;
            while ((e = readdir(d)))
                if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                    empty = 0;
            closedir(d);
            if (!empty)
                return tr_fail(err, "%s is not empty and is not an earlier trainrun export; "
                               "export into a new or empty directory (nothing there was changed)",
                               out_dir);
        }
    }
    char *mark = tr_xasprintf("%s/" EXPORT_MARK, out_dir);
    FILE *f = fopen(mark, "w");
    int ok = f && fputs("written by trainrun export --format hf; a later export may replace "
                        "config.json and model.safetensors here\n", f) >= 0;
    if (f && fclose(f) != 0)
        ok = 0;
    free(mark);
    return ok ? TR_OK : tr_fail(err, "cannot write in %s: %s", out_dir, strerror(errno));
}

/* A file written under a fresh temporary name beside its final one, renamed
 * into place only once whole: an interrupted export leaves the previous one. */
struct atomic_file {
    char *path, *tmp;
    FILE *f;
};

static int atomic_open(struct atomic_file *af, const char *out_dir, const char *name, tr_err *err)
{
    af->path = tr_xasprintf("%s/%s", out_dir, name);
    af->tmp = tr_xasprintf("%s.XXXXXX", af->path);
    af->f = NULL;
    int fd = mkstemp(af->tmp);
    if (fd >= 0) { /* mkstemp makes it 0600; an export is as readable as any new file */
        mode_t mask = umask(0);
        umask(mask);
        fchmod(fd, 0666 & ~mask);
        if (!(af->f = fdopen(fd, "wb"))) {
            close(fd);
            remove(af->tmp);
        }
    }
    if (!af->f) {
        tr_fail(err, "cannot write %s: %s", af->path, strerror(errno));
        free(af->path);
        free(af->tmp);
        return TR_ERROR;
    }
    return TR_OK;
}

/* ok: everything was written; else the temporary file is removed. */
static int atomic_close(struct atomic_file *af, int ok, tr_err *err)
{
    int rc = TR_OK;
    if (!ok || ferror(af->f) || fflush(af->f) != 0) {
        if (ok)
            rc = tr_fail(err, "cannot write %s: %s", af->path, strerror(errno));
        fclose(af->f);
        remove(af->tmp);
    } else if (fclose(af->f) != 0 || rename(af->tmp, af->path) != 0) {
        rc = tr_fail(err, "cannot write %s: %s", af->path, strerror(errno));
        remove(af->tmp);
    }
    free(af->path);
    free(af->tmp);
    return ok ? rc : TR_ERROR;
}

/* The safetensors header of tensors t[0..n) in dtype, padded so the data
 * starts 8-byte aligned (as tr_safetensors_write lays it out). */
static char *st_header(const struct tr_hf_tensor *t, size_t n, enum tr_dtype dtype, size_t *size)
{
    char *h = NULL;
    size_t len = 0, offset = 0, esize = dtype == TR_F32 ? 4 : 2;
    FILE *f = open_memstream(&h, &len);
    fputs("{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"trainrun export\"}", f);
    for (size_t i = 0; i < n; i++) {
        size_t bytes = (size_t)t[i].shape[0] * (size_t)(t[i].ndim > 1 ? t[i].shape[1] : 1) * esize;
        fputc(',', f);
        tr_json_write_string(f, t[i].name);
        fprintf(f, ":{\"dtype\":\"%s\",\"shape\":[%lld", dtype == TR_F32 ? "F32" : dtype == TR_BF16 ? "BF16" : "F16",
                (long long)t[i].shape[0]);
        if (t[i].ndim > 1)
            fprintf(f, ",%lld", (long long)t[i].shape[1]);
        fprintf(f, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    fputc('}', f);
    while ((ftell(f) % 8) != 0)
        fputc(' ', f);
    fclose(f);
    *size = len;
    return h;
}

int tr_hf_export(const struct tr_hf_arch *a, const struct tr_st_file *weights, const char *what,
                 const char *out_dir, enum tr_dtype dtype, tr_err *err)
{
    struct tr_hf_tensor *want = NULL;
    size_t n = tr_hf_tensors(a, a->ctx, &want);
    const struct tr_st_entry **src = tr_xcalloc(n, sizeof *src);
    int rc = TR_ERROR;
    /* every tensor there before anything is written */
    for (size_t i = 0; i < n; i++) {
        const struct tr_st_entry *e = tr_safetensors_find(weights, want[i].name);
        size_t numel = (size_t)want[i].shape[0] * (size_t)(want[i].ndim > 1 ? want[i].shape[1] : 1);
        size_t have = 1;
        for (int d = 0; e && d < e->ndim; d++)
            have *= (size_t)e->shape[d];
        if (!e || e->dtype == TR_I32 || have != numel) {
            tr_fail(err, "%s has no tensor '%s' of %zu values (a checkpoint of another model?)",
                    what, want[i].name, numel);
            goto done;
        }
        src[i] = e;
    }
    if (prepare_dir(out_dir, err) != TR_OK)
        goto done;
    /* model.safetensors streamed tensor by tensor: the host holds the
     * checkpoint and one tensor's conversion, not a second copy of the model */
    struct atomic_file af;
    if (atomic_open(&af, out_dir, "model.safetensors", err) != TR_OK)
        goto done;
    size_t hlen = 0;
    char *header = st_header(want, n, dtype, &hlen);
    unsigned char len8[8];
    for (int k = 0; k < 8; k++)
        len8[k] = (unsigned char)((uint64_t)hlen >> (8 * k));
    int ok = fwrite(len8, 1, 8, af.f) == 8 && fwrite(header, 1, hlen, af.f) == hlen;
    free(header);
    for (size_t i = 0; i < n && ok; i++) {
        size_t numel = (size_t)want[i].shape[0] * (size_t)(want[i].ndim > 1 ? want[i].shape[1] : 1);
        float *f32 = malloc(numel * sizeof(float) + 1);
        float *flip = want[i].transposed ? malloc(numel * sizeof(float) + 1) : NULL;
        uint16_t *half = dtype != TR_F32 ? malloc(numel * sizeof(uint16_t) + 1) : NULL;
        if (!f32 || (want[i].transposed && !flip) || (dtype != TR_F32 && !half)) {
            tr_fail(err, "out of memory exporting '%s'", want[i].name);
            ok = -1;
        } else {
            to_f32(src[i], f32, numel);
            const float *v = f32;
            if (flip) { /* back to Conv1D's [in, out] */
                transpose(flip, f32, want[i].shape[1], want[i].shape[0]);
                v = flip;
            }
            if (half) {
                tr_cpu_to_half(half, v, numel, dtype == TR_BF16);
                ok = fwrite(half, sizeof *half, numel, af.f) == numel;
            } else {
                ok = fwrite(v, sizeof *v, numel, af.f) == numel;
            }
        }
        free(f32);
        free(flip);
        free(half);
    }
    if (ok <= 0) { /* out of memory (err says so) or a short write */
        int errnum = errno;
        atomic_close(&af, 0, err);
        if (ok == 0)
            tr_fail(err, "cannot write %s/model.safetensors: %s", out_dir, strerror(errnum));
        goto done;
    }
    if (atomic_close(&af, 1, err) != TR_OK)
        goto done;
    if (atomic_open(&af, out_dir, "config.json", err) != TR_OK)
        goto done;
    tr_hf_config_write(a, dtype == TR_BF16 ? "bfloat16" : dtype == TR_F16 ? "float16" : "float32", af.f);
    rc = atomic_close(&af, 1, err);
done:
    free(src);
    tr_hf_tensors_free(want, n);
    return rc;
}
