/*
 * The recipe's `lora = { ... }` section: low-rank adapters on a model's
 * linear layers, with the base weights frozen (core/engine/adapters.c
 * rewrites the graph; docs/adapters.md).  Names and defaults follow PEFT's
 * LoraConfig, so a recipe reads like the adapter_config.json it exports:
 *
 *   lora = { rank = 16, alpha = 32, dropout = 0.05,
 *            targets = { "q_proj", "v_proj" } | "all-linear",
 *            rslora = false, modules_to_save = { "lm_head" },
 *            base = "auto" | "fp32" | "bf16" | "fp16" | "nf4",
 *            from = "adapter-dir" }
 *
 * Parsed and checked here (ranges, lists, the adapter directory's config);
 * what depends on the model (a target matching no layer, a rank above a
 * layer's width, NF4 blocks) is checked where the graph is rewritten, with
 * the same recipe line in the message.
 */
#ifndef TR_LORA_H
#define TR_LORA_H

#include "recipe.h"
#include "value.h"

#include <stdint.h>
#include <stdio.h>

#define TR_LORA_MAX_NAMES 64

enum tr_lora_base { TR_LORA_BASE_AUTO = 0, TR_LORA_BASE_F32, TR_LORA_BASE_BF16, TR_LORA_BASE_F16,
                    TR_LORA_BASE_NF4 };

struct tr_lora_config {
    int enabled;            /* the recipe has a lora section */
    int64_t rank;           /* r */
    double alpha;           /* the update is scaled by alpha / r (rslora: alpha / sqrt(r)) */
    double dropout;         /* on the adapter's input, in training only */
    int rslora;
    int all_linear;         /* targets = "all-linear": every linear but the output head */
    const char *targets[TR_LORA_MAX_NAMES];   /* module names or their last components */
    int n_targets;
    const char *modules_to_save[TR_LORA_MAX_NAMES]; /* trained in full beside the adapters */
    int n_save;
    int owns_names;         /* the names came from an adapter_config.json: freed with it */
    enum tr_lora_base base; /* storage of the frozen weights */
    const char *base_text;  /* as the recipe wrote it ("nf4") */
    char *from;             /* a PEFT adapter directory (resolved against the recipe), or NULL */
    char *from_base;        /* its base_model_name_or_path (NULL: none recorded) */
    struct tr_origin origin;/* where `lora` was set: every message names it */
    char where[600];        /* the origin, formatted */
};

/* Read root's `lora` section (cfg->enabled stays 0 without one).  Errors
 * name the recipe line.  With `from`, the directory's adapter_config.json
 * gives rank, alpha, rslora, targets and modules_to_save (the recipe may
 * not contradict it) and a feature PEFT has that trainrun does not (DoRA,
 * another adapter type, bias training, ...) is refused. */
int tr_lora_configure(struct tr_lora_config *lc, struct tr_recipe *r, tr_err *err);
void tr_lora_free(struct tr_lora_config *lc);

/* The scaling of the adapter's product: alpha / r, or alpha / sqrt(r). */
double tr_lora_scale(const struct tr_lora_config *lc);

void tr_lora_help(FILE *out);

#endif
