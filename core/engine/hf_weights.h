/*
 * Hugging Face weights in and out: the tensors of a model directory
 * (model.safetensors or a sharded model.safetensors.index.json) loaded into
 * a graph's parameters, and a checkpoint's weights written as a directory
 * transformers' from_pretrained loads.  The config.json side is
 * config/hf_config.c's.
 *
 * Names: Llama-family parameters are named as in transformers already.
 * GPT-2's are too, but transformers stores the Conv1D weights (attn.c_attn,
 * attn.c_proj, mlp.c_fc, mlp.c_proj) as [in, out] where trainrun's Linear
 * is [out, in]: they are transposed on the way in and out.  GPT-2 files
 * name tensors with or without the "transformer." prefix, and may carry the
 * attention mask buffers (attn.bias, attn.masked_bias); older Llama files
 * carry rotary_emb.inv_freq; a tied model's file may hold lm_head.weight
 * anyway: all of these are ignored, as transformers ignores them.
 */
#ifndef TR_HF_WEIGHTS_H
#define TR_HF_WEIGHTS_H

#include "graph.h"
#include "../config/hf_config.h"
#include "../util/safetensors.h"

/* One tensor of an architecture: its name in transformers' files, its
 * shape there, and whether trainrun stores it transposed. */
struct tr_hf_tensor {
    char *name;        /* as transformers saves it; trainrun's parameter has the same name */
    int ndim;
    int64_t shape[2];  /* in the file */
    int transposed;    /* trainrun's is [shape[1], shape[0]] */
    int64_t rows;      /* rows trainrun keeps (GPT-2's wpe: ctx of n_positions); else shape[0] */
};

/* The tensors of `a` with a context of ctx tokens; free with tr_hf_tensors_free. */
size_t tr_hf_tensors(const struct tr_hf_arch *a, int64_t ctx, struct tr_hf_tensor **out);
void tr_hf_tensors_free(struct tr_hf_tensor *t, size_t n);

/* Load dir's weights into g's parameters (on be).  a is dir's config.json;
 * the graph must be the model it describes.  Missing, unexpected or
 * mis-shaped tensors are one error naming them and the file.  Frozen
 * weights (an adapter's base) are stored in their storage types; *crc (when
 * not NULL) gets the CRC-32 of every fp32 value loaded, in order: the
 * base's identity a checkpoint of adapters records.  keep (NULL: all):
 * whether tensor t is stored; one it does not keep is read and counted in
 * *crc all the same (a pipeline stage stores only the weights its chunks
 * read, and records the same identity as one process). */
int tr_hf_load(struct tr_graph *g, const struct tr_backend *be, const char *dir,
               const struct tr_hf_arch *a, uint32_t *crc,
               int (*keep)(void *ctx, const struct tr_tensor *t), void *keep_ctx, tr_err *err);

/* Shared by the way in (hf_weights.c) and out (hf_export.c): the fp32
 * values of entry e (numel floats into out), and [r, c] -> [c, r]. */
void tr_hf_to_f32(const struct tr_st_entry *e, float *out, size_t numel);
void tr_hf_transpose(float *out, const float *in, int64_t r, int64_t c);

/* hf_export.c: the architecture of a graph built by the llama or gpt builder (`type`),
 * read off its parameters and nodes; TR_ERROR when it is not one. */
int tr_hf_describe(const struct tr_graph *g, const char *type, struct tr_hf_arch *a, tr_err *err);

/* An export's directory: created, or one that is empty or an earlier
 * export (it holds .trainrun-export, written here); a directory of anything
 * else is refused untouched. */
int tr_export_prepare_dir(const char *out_dir, tr_err *err);

/* Where an export takes a checkpoint's tensors from, one at a time (a
 * sharded checkpoint's are read from its blobs as they are written, so
 * the export never holds the model). */
struct tr_hf_source {
    /* 1 with *numel when it holds a floating-point tensor `name`, else 0 */
    int (*find)(void *ud, const char *name, size_t *numel);
    /* tensor `name`'s numel values as fp32 into out; err names the problem */
    int (*read)(void *ud, const char *name, float *out, size_t numel, tr_err *err);
    void *ud;
};

/* Write out_dir/config.json and out_dir/model.safetensors (in dtype) from
 * `weights`, a checkpoint's model.safetensors (`what` names it).  out_dir
 * is created, or must be empty or an earlier export (it holds
 * .trainrun-export); each file is replaced atomically. */
int tr_hf_export(const struct tr_hf_arch *a, const struct tr_st_file *weights, const char *what,
                 const char *out_dir, enum tr_dtype dtype, tr_err *err);
/* The same from any source, tensor by tensor. */
int tr_hf_export_from(const struct tr_hf_arch *a, const struct tr_hf_source *src,
                      const char *what, const char *out_dir, enum tr_dtype dtype, tr_err *err);

#endif
