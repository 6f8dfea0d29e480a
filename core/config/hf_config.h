/*
 * Hugging Face model directories: config.json <-> trainrun's model options.
 *
 * `model = { from = "DIR" }` in a recipe names a directory as transformers
 * saves it (config.json, model.safetensors or a sharded index).  Here the
 * config is read, checked against what trainrun computes (anything else is
 * refused naming the key), and turned into the options of the `llama` or
 * `gpt` builder; the other way, `trainrun export --format hf` writes a
 * config.json from the same description.  The weights themselves are
 * engine/hf_weights.c's.
 */
#ifndef TR_HF_CONFIG_H
#define TR_HF_CONFIG_H

#include "recipe.h"

#include <stdint.h>
#include <stdio.h>
#include <trainrun/plugin.h>

enum tr_hf_family { TR_HF_LLAMA = 0, TR_HF_GPT2 };

/* One architecture, in trainrun's terms (the builders' option names). */
struct tr_hf_arch {
    enum tr_hf_family family;
    char model_type[16];      /* "llama", "mistral", "qwen2", "gpt2" */
    int64_t vocab, dim, layers, heads, kv_heads, ffn_dim;
    int64_t ctx;              /* max_position_embeddings / n_positions */
    double rope_theta, norm_eps;
    int tie_embeddings, qkv_bias;
    int64_t sliding_window;   /* mistral: 0 when none */
    /* rope_scaling of rope_type "llama3" (Llama 3.1 and later); rope_factor 0: none */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_ctx;
};

/* The families' names for messages: "llama, mistral, qwen2, gpt2". */
extern const char *const tr_hf_model_types;

/* Parse config.json text; `what` names the file in errors.  Every size is
 * range-checked; what trainrun does not compute is refused naming the key. */
int tr_hf_config_parse(const char *text, size_t len, const char *what, struct tr_hf_arch *a,
                       tr_err *err);
/* The same from DIR/config.json (at most 16 MiB). */
int tr_hf_config_read(const char *dir, struct tr_hf_arch *a, tr_err *err);

/* config.json for `a`, as transformers' from_pretrained reads it;
 * torch_dtype "float32", "bfloat16", "float16", or NULL to leave it out. */
void tr_hf_config_write(const struct tr_hf_arch *a, const char *torch_dtype, FILE *out);

/* Resolve `model = { from = "DIR", ... }` of a loaded recipe: DIR relative
 * to the recipe's directory, its config.json read and checked, the recipe's
 * other model keys checked against it (an architecture key that contradicts
 * config.json is an error naming both values; ctx may be lowered), and the
 * model rewritten as the llama/gpt options it stands for, in the value tree
 * (so `show` and `plan` show them, from config.json) and in the table the
 * builder runs on.  model.from is left holding the resolved directory.
 * Nothing happens when the model has no `from`. */
/* Without model.ctx the context is config.json's, at most TR_HF_DEFAULT_CTX
 * tokens; *capped is then config.json's longer one (else 0), for a note. */
#define TR_HF_DEFAULT_CTX 2048
int tr_hf_resolve_model(struct tr_recipe *r, int64_t *capped, tr_err *err);
/* A directory a recipe names (model.from, lora.from): relative to the
 * directory of the recipe file that wrote it, like extends and include;
 * typed on the command line or absolute, as it is.  Newly allocated. */
char *tr_hf_recipe_dir(struct tr_recipe *r, const struct tr_value *v);

/* The directory a resolved recipe's weights come from, or NULL. */
const char *tr_hf_from_dir(struct tr_recipe *r);

#endif
