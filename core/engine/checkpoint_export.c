/* `trainrun export`: a checkpoint directory's weights, verified first, as
 * one safetensors file (tr_export_weights) or as a Hugging Face directory
 * (tr_export_hf, written by hf_export.c).  A sharded checkpoint's weights
 * stream from its blobs tensor by tensor, each range checked as it is
 * read: the export holds one tensor at a time, never the model. */
#include "checkpoint.h"
#include "checkpoint_internal.h"
#include "checkpoint_shard.h"

#include "../../kernels/host.h"
#include "hf_weights.h"
#include "peft.h"
#include "../util/json.h"
#include "../util/progress.h"
#include "../util/safetensors.h"
#include "../util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A checkpoint as every export reads it: its weights, verified against
 * state.json first (the weights exported are the ones it vouches for),
 * and state.json itself when asked for.  A sharded checkpoint's weights
 * are not read here when the export streams them (layout set): each range
 * is checked against its CRC-32 as it is read, one tensor at a time. */
struct verified {
    char *dir, *weights_path, *state_path;
    void *buf, *text;
    size_t size, text_size;
    struct tr_st_file *st;       /* NULL when layout is set */
    struct tr_ckpt_layout *layout;
    struct tr_json *state; /* NULL unless asked for */
};

static void close_verified(struct verified *v)
{
    tr_safetensors_free(v->st);
    tr_ckpt_layout_free(v->layout);
    tr_json_free(v->state);
    free(v->text);
    free(v->buf);
    free(v->state_path);
    free(v->weights_path);
    free(v->dir);
    memset(v, 0, sizeof *v);
}

/* stream: a sharded checkpoint may stay in its blobs (v->layout) */
static int open_verified(struct verified *v, const char *checkpoint_dir, int with_state,
                         int stream, tr_err *err)
{
    memset(v, 0, sizeof *v);
    v->dir = tr_xstrdup(checkpoint_dir);
    for (size_t len = strlen(v->dir); len > 1 && v->dir[len - 1] == '/';) /* as verify names it */
        v->dir[--len] = 0;
    v->weights_path = tr_xasprintf("%s/model.safetensors", checkpoint_dir);
    v->state_path = tr_xasprintf("%s/state.json", checkpoint_dir);
    size_t bad = 0;
    if (tr_ckpt_verify_dir(checkpoint_dir, &v->buf, &v->size, stream ? &v->layout : NULL,
                           err) != TR_OK ||
        (with_state &&
         tr_ckpt_read_whole(v->state_path, &v->text, &v->text_size, err) != TR_OK) ||
        (!v->layout && !(v->st = tr_safetensors_read(v->buf, v->size, v->weights_path, err)))) {
        close_verified(v);
        return TR_ERROR;
    }
    if (with_state)
        v->state = tr_json_parse(v->text, v->text_size, &bad);
    return TR_OK;
}

/* A sharded checkpoint's weights read tensor by tensor (tr_hf_source) */
struct layout_source {
    const struct tr_ckpt_layout *l;
    struct tr_ckpt_reader *rd;
    const char *dir;
};

static int layout_index(const struct tr_ckpt_layout *l, const char *name, size_t *i)
{
    for (*i = 0; *i < l->n_tensors; ++*i)
        if (strcmp(l->tensors[*i].name, name) == 0)
            return 1;
    return 0;
}

static int layout_find(void *ud, const char *name, size_t *numel)
{
    const struct layout_source *ls = ud;
    size_t i;
    if (!layout_index(ls->l, name, &i))
        return 0;
    *numel = (size_t)ls->l->tensors[i].numel;
    return 1;
}

static int layout_read(void *ud, const char *name, float *out, size_t numel, tr_err *err)
{
    struct layout_source *ls = ud;
    size_t i;
    if (!layout_index(ls->l, name, &i) || ls->l->tensors[i].numel != numel)
        return tr_fail(err, "checkpoint %s has no tensor '%s' of %zu values", ls->dir, name, numel);
    if (tr_ckpt_read_tensor(ls->rd, i, out, err) != TR_OK) {
        tr_err_prefix(err, "nothing exported (export an earlier checkpoint of the run)");
        return TR_ERROR;
    }
    return TR_OK;
}

/* The tensors of a checkpoint as they are exported: fp32 ones converted to
 * dtype, the rest as stored. */
struct converted {
    struct tr_st_entry *out;
    uint16_t **halves; /* the converted values, per tensor (NULL: as stored) */
    size_t n;
};

static void convert_entries(struct converted *c, const struct tr_st_file *st, enum tr_dtype dtype)
{
    c->n = tr_safetensors_count(st);
    c->out = tr_xcalloc(c->n ? c->n : 1, sizeof *c->out);
    c->halves = tr_xcalloc(c->n ? c->n : 1, sizeof *c->halves);
    for (size_t i = 0; i < c->n; i++) {
        const struct tr_st_entry *e = tr_safetensors_at(st, i);
        c->out[i] = *e;
        if (e->dtype == TR_F32 && dtype != TR_F32) {
            size_t count = e->bytes / 4;
            c->halves[i] = tr_xcalloc(count ? count : 1, sizeof(uint16_t));
            tr_cpu_to_half(c->halves[i], e->data, count, dtype == TR_BF16);
            c->out[i].dtype = dtype;
            c->out[i].data = c->halves[i];
            c->out[i].bytes = count * 2;
        }
    }
}

static void free_converted(struct converted *c)
{
    for (size_t i = 0; c->halves && i < c->n; i++)
        free(c->halves[i]);
    free(c->halves);
    free(c->out);
}

/* What an export writes, produced into o and counted on bar: 1 when all
 * of it was, 0 on a short write (errno says why), -1 when it could not be
 * made (err says why). */
typedef int (*produce_fn)(void *ud, FILE *o, struct tr_progress *bar, tr_err *err);

/* out_size bytes from produce as out_path. */
static int write_export_with(const char *out_path, uint64_t out_size, produce_fn produce,
                             void *ud, tr_err *err)
{
    int rc = TR_ERROR;
    /* a fresh name beside the output: no file of the user's is overwritten
     * but out_path itself, and that only once the export is complete */
    char *tmp = tr_xasprintf("%s.XXXXXX", out_path);
    int fd = mkstemp(tmp);
    if (fd >= 0) { /* mkstemp makes it 0600; an export is as readable as any new file */
        mode_t mask = umask(0);
        umask(mask);
        fchmod(fd, 0666 & ~mask);
    }
    FILE *o = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !o)
        close(fd);
    struct tr_progress *bar = o ? tr_progress_start("exporting", out_size) : NULL;
    int ok = o ? produce(ud, o, bar, err) : 0;
    int errnum = errno;
    tr_progress_end(bar, ok == 1, 1);
    if (ok != 1 || fflush(o) != 0) {
        if (ok != -1) /* -1: err says why already */
            tr_fail(err, "cannot write %s: %s", out_path, strerror(ok == 1 ? errno : errnum));
        if (o)
            fclose(o);
        if (fd >= 0)
            remove(tmp);
    } else if (fclose(o) != 0 || rename(tmp, out_path) != 0) {
        tr_fail(err, "cannot write %s: %s", out_path, strerror(errno));
        remove(tmp);
    } else {
        rc = TR_OK;
    }
    free(tmp);
    return rc;
}

struct whole_blob {
    const void *data; /* NULL when it could not be made */
    size_t size;
};

/* a blob in memory, in 16 MiB pieces, each counted on the progress bar */
static int produce_blob(void *ud, FILE *o, struct tr_progress *bar, tr_err *err)
{
    (void)err;
    const struct whole_blob *b = ud;
    if (!b->data) {
        errno = ENOMEM;
        return 0;
    }
    for (size_t written = 0; written < b->size;) {
        size_t piece = b->size - written < (16u << 20) ? b->size - written : (16u << 20);
        if (fwrite((const char *)b->data + written, 1, piece, o) != piece)
            return 0;
        written += piece;
        tr_progress_add(bar, piece);
        tr_progress_draw(bar, 0);
    }
    return 1;
}

/* blob (out_size bytes; NULL when it could not be made) as out_path. */
static int write_export(const char *out_path, const void *blob, size_t out_size, tr_err *err)
{
    struct whole_blob b = {blob, out_size};
    return write_export_with(out_path, out_size, produce_blob, &b, err);
}

/* A sharded checkpoint's weights as one safetensors file, in the layout's
 * order (what assembling them and tr_safetensors_write would give, byte
 * for byte): the header from the layout alone, then each tensor read,
 * checked, converted to dtype, written and freed in turn. */
struct layout_export {
    struct layout_source src;
    enum tr_dtype dtype;
    const unsigned char *header;
    size_t header_size;
};

static int produce_layout(void *ud, FILE *o, struct tr_progress *bar, tr_err *err)
{
    const struct layout_export *x = ud;
    const struct tr_ckpt_layout *l = x->src.l;
    if (fwrite(x->header, 1, x->header_size, o) != x->header_size)
        return 0;
    tr_progress_add(bar, x->header_size);
    int ok = 1;
    for (size_t i = 0; i < l->n_tensors && ok == 1; i++) {
        size_t numel = (size_t)l->tensors[i].numel;
        float *f32 = malloc(numel * sizeof(float) + 1);
        uint16_t *half = x->dtype != TR_F32 ? malloc(numel * sizeof(uint16_t) + 1) : NULL;
        if (!f32 || (x->dtype != TR_F32 && !half)) {
            tr_fail(err, "out of memory exporting '%s'", l->tensors[i].name);
            ok = -1;
        } else if (layout_read((void *)&x->src, l->tensors[i].name, f32, numel, err) != TR_OK) {
            ok = -1;
        } else if (half) {
            tr_cpu_to_half(half, f32, numel, x->dtype == TR_BF16);
            ok = fwrite(half, sizeof *half, numel, o) == numel;
        } else {
            ok = fwrite(f32, sizeof *f32, numel, o) == numel;
        }
        free(f32);
        free(half);
        tr_progress_add(bar, (uint64_t)numel * (x->dtype == TR_F32 ? 4 : 2));
        tr_progress_draw(bar, 0);
    }
    return ok;
}

static int export_layout_weights(const struct verified *v, enum tr_dtype dtype,
                                 const char *out_path, tr_err *err)
{
    const struct tr_ckpt_layout *l = v->layout;
    struct tr_st_entry *e = tr_xcalloc(l->n_tensors + 1, sizeof *e);
    size_t esize = dtype == TR_F32 ? 4 : 2;
    for (size_t i = 0; i < l->n_tensors; i++) {
        const struct tr_ckpt_tensor *t = &l->tensors[i];
        /* the shards hold fp32: every tensor is converted (convert_entries) */
        e[i] = (struct tr_st_entry){t->name, dtype, t->ndim, {0}, NULL, (size_t)t->numel * esize};
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
    }
    size_t header_size = 0, total = 0;
    unsigned char *header = tr_safetensors_header(
        e, l->n_tensors, "{\"format\":\"pt\",\"producer\":\"trainrun export\"}", &header_size,
        &total);
    free(e);
    if (!header)
        return tr_fail(err, "out of memory writing %s", out_path);
    struct tr_ckpt_src src = {NULL, NULL, v->dir, v->dir};
    struct layout_export x = {{l, tr_ckpt_reader_open(&src, l), v->dir}, dtype, header,
                              header_size};
    int rc = write_export_with(out_path, total, produce_layout, &x, err);
    tr_ckpt_reader_close(x.src.rd);
    free(header);
    return rc;
}

int tr_export_weights(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_path,
                      tr_err *err)
{
    struct verified v;
    if (open_verified(&v, checkpoint_dir, 1, 1, err) != TR_OK)
        return TR_ERROR;
    tr_export_warn_dtype(tr_json_string(v.state, "weights_dtype"), dtype, checkpoint_dir);
    if (v.layout) { /* sharded: streamed from its blobs */
        int rc = export_layout_weights(&v, dtype, out_path, err);
        close_verified(&v);
        return rc;
    }
    struct converted c;
    convert_entries(&c, v.st, dtype);
    size_t out_size = 0;
    void *blob = tr_safetensors_write(c.out, c.n,
                                      "{\"format\":\"pt\",\"producer\":\"trainrun export\"}",
                                      &out_size);
    int rc = write_export(out_path, blob, out_size, err);
    free(blob);
    free_converted(&c);
    close_verified(&v);
    return rc;
}

/* ---- what a Hugging Face directory holds beside the weights ------------------ */

static int regular_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir/name copied to out_dir/name, replaced atomically: 1 copied, 0 there
 * is no dir/name, -1 an error (err). */
static int copy_beside(const char *dir, const char *name, const char *out_dir, tr_err *err)
{
    char *src = tr_xasprintf("%s/%s", dir, name);
    char *dst = tr_xasprintf("%s/%s", out_dir, name);
    void *text = NULL;
    size_t size = 0;
    int rc = 0;
    if (regular_file(src))
        rc = tr_ckpt_read_whole(src, &text, &size, err) == TR_OK &&
                     write_export(dst, text, size, err) == TR_OK ? 1 : -1;
    free(text);
    free(src);
    free(dst);
    return rc;
}

/* Do two files hold the same bytes?  0 also when either cannot be read. */
static int same_contents(const char *a, const char *b)
{
    void *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    tr_err ignored = {{0}};
    int same = regular_file(a) && regular_file(b) &&
               tr_ckpt_read_whole(a, &x, &nx, &ignored) == TR_OK &&
               tr_ckpt_read_whole(b, &y, &ny, &ignored) == TR_OK && nx == ny &&
               memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

/* The EOS the run's data ends documents with (tokenizer.origin.json's
 * "eos"), or -1. */
static long long recorded_eos(const char *run_dir)
{
    char *path = tr_xasprintf("%s/tokenizer.origin.json", run_dir);
    void *text = NULL;
    size_t size = 0, bad = 0;
    tr_err ignored = {{0}};
    long long eos = -1;
    if (regular_file(path) && tr_ckpt_read_whole(path, &text, &size, &ignored) == TR_OK) {
        struct tr_json *j = tr_json_parse(text, size, &bad);
        const struct tr_json *e = j && j->type == TR_JSON_OBJECT ? tr_json_get(j, "eos") : NULL;
        if (e && e->type == TR_JSON_NUMBER && e->number >= 0 && e->number < 1e9)
            eos = (long long)e->number;
        tr_json_free(j);
    }
    free(text);
    free(path);
    return eos;
}

/* generation_config.json when the base has none: what transformers derives
 * from a config.json, with the EOS the data was made with. */
static int write_generation_config(const char *run_dir, const char *out_dir, tr_err *err)
{
    long long eos = recorded_eos(run_dir);
    char text[128];
    if (eos >= 0)
        snprintf(text, sizeof text, "{\n  \"_from_model_config\": true,\n  \"eos_token_id\": %lld\n}\n",
                 eos);
    else
        snprintf(text, sizeof text, "{\n  \"_from_model_config\": true\n}\n");
    char *dst = tr_xasprintf("%s/generation_config.json", out_dir);
    int rc = write_export(dst, text, strlen(text), err);
    free(dst);
    return rc;
}

int tr_export_hf_extras(const char *checkpoint_dir, const char *weights_from, const char *out_dir,
                        tr_err *err)
{
    /* checkpoint_dir is RUN/checkpoints/step-N: the run records its tokenizer in RUN */
    char *checkpoints = tr_dirname(checkpoint_dir), *run = tr_dirname(checkpoints);
    char *run_tok = tr_xasprintf("%s/tokenizer.json", run);
    char *base_tok = weights_from ? tr_xasprintf("%s/tokenizer.json", weights_from) : NULL;
    /* the tokenizer that made the run's data, else the base's (a run of
     * synthetic ids keeps the base's vocabulary) */
    const char *tok_dir = regular_file(run_tok) ? run : base_tok && regular_file(base_tok)
                                                            ? weights_from : NULL;
    static const char *const tok_files[] = {"tokenizer.json", "tokenizer_config.json"};
    int rc = TR_OK, copied = 0;
    for (size_t i = 0; tok_dir && rc == TR_OK && i < TR_ARRAY_LEN(tok_files); i++) {
        int c = copy_beside(tok_dir, tok_files[i], out_dir, err);
        rc = c < 0 ? TR_ERROR : TR_OK;
        copied += c > 0;
    }
    /* without a tokenizer_config.json AutoTokenizer would take config.json's
     * model_type's class (LlamaTokenizerFast adds a <s> this vocabulary may
     * not have): the plain fast tokenizer reads tokenizer.json as it is */
    if (rc == TR_OK && tok_dir && copied == 1) {
        static const char plain[] = "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n";
        char *dst = tr_xasprintf("%s/tokenizer_config.json", out_dir);
        rc = write_export(dst, plain, sizeof plain - 1, err);
        free(dst);
    }
    /* the base's special tokens name ids of the base's tokenizer: only with that one */
    int special = 0;
    if (rc == TR_OK && tok_dir && weights_from &&
        (tok_dir == weights_from || same_contents(run_tok, base_tok))) {
        special = copy_beside(weights_from, "special_tokens_map.json", out_dir, err);
        rc = special < 0 ? TR_ERROR : TR_OK;
    }
    int generation = 0;
    if (rc == TR_OK && weights_from) {
        generation = copy_beside(weights_from, "generation_config.json", out_dir, err);
        rc = generation < 0 ? TR_ERROR : TR_OK;
    }
    if (rc == TR_OK && generation == 0)
        rc = write_generation_config(run, out_dir, err);
    if (rc == TR_OK && tok_dir)
        tr_log(TR_LOG_INFO, NULL, "with the tokenizer of %s (%s%s%s) and generation_config.json",
               tok_dir == run ? "the run" : weights_from, "tokenizer.json, tokenizer_config.json",
               special > 0 ? ", " : "",
               special > 0 ? "special_tokens_map.json" : "");
    else if (rc == TR_OK)
        tr_log(TR_LOG_WARN, NULL, "the run records no tokenizer (its data had none, nor has "
               "model.from): %s has no tokenizer.json; put the one that made the data there for "
               "AutoTokenizer", out_dir);
    free(base_tok);
    free(run_tok);
    free(run);
    free(checkpoints);
    return rc;
}

/* A export narrower than the checkpoint's weights changes the model: said
 * on stderr, with the flag that keeps them. */
void tr_export_warn_dtype(const char *stored, enum tr_dtype dtype, const char *checkpoint_dir)
{
    const char *name = dtype == TR_BF16 ? "bf16" : dtype == TR_F16 ? "fp16" : "fp32";
    if (!stored || strcmp(stored, name) == 0 || dtype == TR_F32)
        return;
    tr_log(TR_LOG_WARN, NULL, "exporting the %s weights of %s as %s rounds every one of them: "
           "the exported model computes other logits than the checkpoint (a loss often a "
           "percent apart); --dtype %s exports them as they are", stored, checkpoint_dir, name,
           stored);
}

int tr_export_hf(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir, tr_err *err)
{
    struct verified v;
    if (open_verified(&v, checkpoint_dir, 1, 1, err) != TR_OK)
        return TR_ERROR;
    const char *config = tr_json_string(v.state, "hf_config");
    struct tr_hf_arch a;
    int rc = TR_ERROR;
    if (!config)
        tr_fail(err, "%s records no Hugging Face architecture: its model is not a llama or gpt "
                "(or the run predates export --format hf); export --format safetensors writes "
                "the weights alone", v.state_path);
    else if (tr_hf_config_parse(config, strlen(config), v.state_path, &a, err) != TR_OK)
        ; /* err says why */
    else if (v.layout) { /* sharded: each tensor read from the blobs as it is written */
        struct tr_ckpt_src src = {NULL, NULL, v.dir, v.dir};
        struct layout_source ls = {v.layout, tr_ckpt_reader_open(&src, v.layout), v.dir};
        struct tr_hf_source hs = {layout_find, layout_read, &ls};
        rc = tr_hf_export_from(&a, &hs, v.dir, out_dir, dtype, err);
        tr_ckpt_reader_close(ls.rd);
    } else {
        rc = tr_hf_export(&a, v.st, v.weights_path, out_dir, dtype, err);
    }
    if (rc == TR_OK) {
        tr_export_warn_dtype(tr_json_string(v.state, "weights_dtype"), dtype, checkpoint_dir);
        rc = tr_export_hf_extras(checkpoint_dir, tr_json_string(v.state, "weights_from"), out_dir,
                                 err);
    }
    close_verified(&v);
    return rc;
}

/* `export --format peft`: adapter_config.json as the run recorded it and
 * the trained tensors under PEFT's names, each file replaced atomically. */
int tr_export_peft(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir,
                   tr_err *err)
{
    struct verified v; /* adapters are small: a sharded checkpoint's are assembled */
    if (open_verified(&v, checkpoint_dir, 1, 0, err) != TR_OK)
        return TR_ERROR;
    const char *config = tr_json_string(v.state, "peft_config");
    if (!config) {
        tr_fail(err, "%s is not a checkpoint of adapters (its run has no lora section); "
                "export --format hf writes its full weights", checkpoint_dir);
        close_verified(&v);
        return TR_ERROR;
    }
    if (tr_export_prepare_dir(out_dir, err) != TR_OK) {
        close_verified(&v);
        return TR_ERROR;
    }
    struct converted c;
    convert_entries(&c, v.st, dtype);
    char **names = tr_xcalloc(c.n ? c.n : 1, sizeof *names);
    for (size_t i = 0; i < c.n; i++) {
        names[i] = tr_xasprintf(TR_PEFT_PREFIX "%s", c.out[i].name);
        c.out[i].name = names[i];
    }
    size_t out_size = 0;
    void *blob = tr_safetensors_write(c.out, c.n, "{\"format\":\"pt\"}", &out_size);
    char *weights = tr_xasprintf("%s/adapter_model.safetensors", out_dir);
    char *cfg = tr_xasprintf("%s/adapter_config.json", out_dir);
    int rc = write_export(weights, blob, out_size, err);
    if (rc == TR_OK)
        rc = write_export(cfg, config, strlen(config), err);
    free(blob);
    free(weights);
    free(cfg);
    for (size_t i = 0; i < c.n; i++)
        free(names[i]);
    free(names);
    free_converted(&c);
    close_verified(&v);
    return rc;
}
