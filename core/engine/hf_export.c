/* Hugging Face weights out: the architecture of a graph the llama or gpt
 * builder made (tr_hf_describe) and its export as config.json +
 * model.safetensors (tr_hf_export, `trainrun export --format hf`).  The way
 * in is hf_weights.c; hf_weights.h says how names and layouts map. */
#define _XOPEN_SOURCE 700
#include "hf_weights.h"
#include "adapters.h"

#include "../../kernels/host.h"
#include "../util/json.h"
#include "../util/progress.h"
#include "../util/util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the architecture of a built graph ------------------------------------ */

static const struct tr_tensor *param_named(const struct tr_graph *g, const char *name)
{
    int i = tr_graph_find(g, name);
    /* a weight trained or frozen (an adapter's base) */
    return i >= 0 && (g->tensors[i].role == TR_ROLE_PARAM || g->tensors[i].role == TR_ROLE_FROZEN)
               ? &g->tensors[i]
               : NULL;
}

/* Transformer blocks: the first layer norm of each, numbered from 0. */
static int64_t count_layers(const struct tr_graph *g, int gpt)
{
    int64_t layers = 0;
    char name[96];
    for (;;) {
        snprintf(name, sizeof name, gpt ? "transformer.h.%lld.ln_1.weight" : "model.layers.%lld.input_layernorm.weight",
                 (long long)layers);
        if (!param_named(g, name))
            break;
        layers++;
    }
    return layers;
}

/* The heads, rope_theta (and Llama 3.1's rope scaling) and the norms' eps,
 * off the graph's nodes; a scaled embedding has no Hugging Face form. */
static int read_nodes(const struct tr_graph *g, int gpt, const char *type, struct tr_hf_arch *a,
                      tr_err *err)
{
    a->norm_eps = gpt ? 1e-5 : 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *nd = &g->nodes[i];
        if (nd->op == TR_OP_ATTENTION && !a->heads) {
            a->heads = nd->heads;
            a->kv_heads = nd->n_in == 3 ? nd->kv_heads : nd->heads;
        } else if (nd->op == TR_OP_ROPE && a->rope_theta == 0) {
            a->rope_theta = nd->theta;
            if (nd->rope_factor > 0) {
                a->rope_factor = nd->rope_factor;
                a->rope_low_freq_factor = nd->rope_low_freq_factor;
                a->rope_high_freq_factor = nd->rope_high_freq_factor;
                a->rope_original_ctx = (int64_t)nd->rope_original_ctx;
            }
        } else if (nd->op == TR_OP_RMSNORM && a->norm_eps == 0) {
            a->norm_eps = nd->eps;
        } else if (nd->op == TR_OP_LAYERNORM && gpt && nd->eps != 1e-5f) {
            a->norm_eps = nd->eps;
        } else if (nd->op == TR_OP_SCALE && !strstr(nd->name, ".lora_scale")) {
            /* (an adapter's scale is not the model's) */
            return tr_fail(err, "the %s model scales its embeddings (embed_scale), which none of "
                           "the Hugging Face families trainrun writes does", type);
        }
    }
    return TR_OK;
}

/* The graph holds floats: rope_theta and eps as the shortest decimal that
 * is the same float (the rope scaling's factors are doubles, as read). */
static void shortest_decimals(struct tr_hf_arch *a)
{
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

/* What the family fixes (GPT-2) or the parameters tell (llama): the kv
 * heads, the MLP's width, a tied head, q/k/v biases. */
static int family_fields(const struct tr_graph *g, int gpt, struct tr_hf_arch *a, tr_err *err)
{
    if (gpt) {
        a->kv_heads = a->heads;
        a->ffn_dim = 4 * a->dim;
        a->tie_embeddings = 1;
        return TR_OK;
    }
    const struct tr_tensor *gate = param_named(g, "model.layers.0.mlp.gate_proj.weight");
    if (!gate)
        return tr_fail(err, "the llama model has no model.layers.0.mlp.gate_proj.weight");
    a->ffn_dim = gate->shape[0];
    a->tie_embeddings = !param_named(g, "lm_head.weight");
    a->qkv_bias = param_named(g, "model.layers.0.self_attn.q_proj.bias") != NULL;
    return TR_OK;
}

/* Every parameter must be one the Hugging Face form names, and every one
 * it names a parameter. */
static int check_params(const struct tr_graph *g, const char *type, const struct tr_hf_arch *a,
                        tr_err *err)
{
    struct tr_hf_tensor *t = NULL;
    size_t n = tr_hf_tensors(a, a->ctx, &t), params = 0;
    int rc = TR_OK;
    for (size_t i = 0; i < n && rc == TR_OK; i++)
        if (!param_named(g, t[i].name))
            rc = tr_fail(err, "the %s model has no parameter '%s'", type, t[i].name);
    for (int i = 0; i < g->n_tensors; i++) /* the base's: adapters are not in its form */
        params += (g->tensors[i].role == TR_ROLE_PARAM || g->tensors[i].role == TR_ROLE_FROZEN) &&
                  !tr_adapter_param(g->tensors[i].name);
    if (rc == TR_OK && params != n)
        rc = tr_fail(err, "the %s model has %zu parameters; its Hugging Face form names %zu", type,
                     params, n);
    tr_hf_tensors_free(t, n);
    return rc;
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
    a->layers = count_layers(g, gpt);
    if (read_nodes(g, gpt, type, a, err) != TR_OK)
        return TR_ERROR;
    if (!gpt)
        shortest_decimals(a);
    if (a->layers == 0 || a->heads <= 0 || a->dim % a->heads != 0 || (!gpt && (a->kv_heads <= 0 || a->rope_theta <= 0 || a->norm_eps <= 0)))
        return tr_fail(err, "the %s model's graph does not have the shape of one", type);
    if (family_fields(g, gpt, a, err) != TR_OK)
        return TR_ERROR;
    return check_params(g, type, a, err);
}

/* ---- export -------------------------------------------------------------------- */

#define EXPORT_MARK ".trainrun-export"

int tr_export_prepare_dir(const char *out_dir, tr_err *err)
{
    struct stat st;
    if (stat(out_dir, &st) != 0) {
        if (tr_mkdir_p(out_dir) != 0)
            return tr_fail(err, "cannot create %s: %s", out_dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return tr_fail(err, "%s exists and is not a directory; export --format hf and peft "
                       "write a directory", out_dir);
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
    int ok = f && fputs("written by trainrun export; a later export may replace the files it "
                        "wrote here\n", f) >= 0;
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

/* Every tensor of the form in the source, with its number of values:
 * checked before anything is written. */
static int find_sources(const struct tr_hf_source *src, const char *what,
                        const struct tr_hf_tensor *want, size_t n, tr_err *err)
{
    for (size_t i = 0; i < n; i++) {
        size_t numel = (size_t)want[i].shape[0] * (size_t)(want[i].ndim > 1 ? want[i].shape[1] : 1);
        size_t have = 0;
        if (!src->find(src->ud, want[i].name, &have) || have != numel)
            return tr_fail(err, "%s has no tensor '%s' of %zu values (a checkpoint of another "
                           "model?)", what, want[i].name, numel);
    }
    return TR_OK;
}

/* Tensor w (from src) in dtype, in the form's layout, written to f: 1, 0
 * on a short write, -1 out of memory or unreadable (err says so). */
static int write_tensor(FILE *f, const struct tr_hf_tensor *w, const struct tr_hf_source *src,
                        enum tr_dtype dtype, tr_err *err)
{
    int ok;
    size_t numel = (size_t)w->shape[0] * (size_t)(w->ndim > 1 ? w->shape[1] : 1);
    float *f32 = malloc(numel * sizeof(float) + 1);
    float *flip = w->transposed ? malloc(numel * sizeof(float) + 1) : NULL;
    uint16_t *half = dtype != TR_F32 ? malloc(numel * sizeof(uint16_t) + 1) : NULL;
    if (!f32 || (w->transposed && !flip) || (dtype != TR_F32 && !half)) {
        tr_fail(err, "out of memory exporting '%s'", w->name);
        ok = -1;
    } else if (src->read(src->ud, w->name, f32, numel, err) != TR_OK) {
        ok = -1;
    } else {
        const float *v = f32;
        if (flip) { /* back to Conv1D's [in, out] */
            tr_hf_transpose(flip, f32, w->shape[1], w->shape[0]);
            v = flip;
        }
        if (half) {
            tr_cpu_to_half(half, v, numel, dtype == TR_BF16);
            ok = fwrite(half, sizeof *half, numel, f) == numel;
        } else {
            ok = fwrite(v, sizeof *v, numel, f) == numel;
        }
    }
    free(f32);
    free(flip);
    free(half);
    return ok;
}

/* model.safetensors into f, streamed tensor by tensor (the host holds one
 * tensor's values and conversion, besides what the source holds)
 * on a progress bar: as write_tensor, 1 when all of it was written. */
static int write_weights(FILE *f, const struct tr_hf_tensor *want, size_t n,
                         const struct tr_hf_source *src, enum tr_dtype dtype, tr_err *err)
{
    size_t hlen = 0;
    char *header = st_header(want, n, dtype, &hlen);
    unsigned char len8[8];
    for (int k = 0; k < 8; k++)
        len8[k] = (unsigned char)((uint64_t)hlen >> (8 * k));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
    free(header);
    uint64_t total = 8 + hlen;
    for (size_t i = 0; i < n; i++)
        total += (uint64_t)want[i].shape[0] * (uint64_t)(want[i].ndim > 1 ? want[i].shape[1] : 1) *
                 (dtype == TR_F32 ? 4 : 2);
    struct tr_progress *bar = tr_progress_start("exporting", total);
    tr_progress_add(bar, 8 + hlen);
    /* ok == 1 only: -1 (out of memory) stops the loop as 0 does, and no
     * later tensor's success may turn it back into a whole file */
    for (size_t i = 0; i < n && ok == 1; i++) {
        size_t numel = (size_t)want[i].shape[0] * (size_t)(want[i].ndim > 1 ? want[i].shape[1] : 1);
        ok = write_tensor(f, &want[i], src, dtype, err);
        tr_progress_add(bar, (uint64_t)numel * (dtype == TR_F32 ? 4 : 2)); /* written */
        tr_progress_draw(bar, 0);
    }
    tr_progress_end(bar, ok > 0, 1);
    return ok;
}

/* A checkpoint's model.safetensors as a source */
static int st_find(void *ud, const char *name, size_t *numel)
{
    const struct tr_st_entry *e = tr_safetensors_find(ud, name);
    if (!e || e->dtype == TR_I32)
        return 0;
    *numel = 1;
    for (int d = 0; d < e->ndim; d++)
        *numel *= (size_t)e->shape[d];
    return 1;
}

static int st_read(void *ud, const char *name, float *out, size_t numel, tr_err *err)
{
    (void)err; /* found (st_find) before: the bytes are in memory */
    tr_hf_to_f32(tr_safetensors_find(ud, name), out, numel);
    return TR_OK;
}

int tr_hf_export(const struct tr_hf_arch *a, const struct tr_st_file *weights, const char *what,
                 const char *out_dir, enum tr_dtype dtype, tr_err *err)
{
    struct tr_hf_source src = {st_find, st_read, (void *)weights};
    return tr_hf_export_from(a, &src, what, out_dir, dtype, err);
}

int tr_hf_export_from(const struct tr_hf_arch *a, const struct tr_hf_source *src,
                      const char *what, const char *out_dir, enum tr_dtype dtype, tr_err *err)
{
    struct tr_hf_tensor *want = NULL;
    size_t n = tr_hf_tensors(a, a->ctx, &want);
    int rc = TR_ERROR;
    /* every tensor there before anything is written */
    if (find_sources(src, what, want, n, err) != TR_OK ||
        tr_export_prepare_dir(out_dir, err) != TR_OK)
        goto done;
    struct atomic_file af;
    if (atomic_open(&af, out_dir, "model.safetensors", err) != TR_OK)
        goto done;
    int ok = write_weights(af.f, want, n, src, dtype, err);
    if (ok <= 0) { /* out of memory or unreadable (err says so) or a short write */
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
    tr_hf_tensors_free(want, n);
    return rc;
}
