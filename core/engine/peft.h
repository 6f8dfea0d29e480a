/*
 * LoRA adapters in and out as PEFT writes them: a directory holding
 * adapter_config.json and adapter_model.safetensors, whose tensors are the
 * trained ones named "base_model.model.<name>" (adapters.h names them so
 * without the prefix): "...q_proj.lora_A.weight" [r,in], "...lora_B.weight"
 * [out,r], and each module_to_save's full weights under the base's name.
 */
#ifndef TR_PEFT_H
#define TR_PEFT_H

#include "graph.h"
#include "../config/lora.h"

#include <stdio.h>

#define TR_PEFT_PREFIX "base_model.model."

/* lc->from's adapter_model.safetensors into g's trained parameters (on be):
 * every one present with its shape, and nothing else; base_dir (model.from,
 * or NULL) is compared with the adapter's base_model_name_or_path. */
int tr_peft_load(struct tr_graph *g, const struct tr_backend *be, const struct tr_lora_config *lc,
                 const char *base_dir, tr_err *err);

/* The adapter_config.json PEFT would write for lc on g (its adapted
 * modules' last components as target_modules), base naming the base
 * model.  Newly allocated. */
char *tr_peft_config_text(const struct tr_graph *g, const struct tr_lora_config *lc,
                          const char *base);

/* `trainrun export --format peft`: a checkpoint of an adapter run as a PEFT
 * adapter directory (the adapter_config.json its state.json recorded, and
 * its trained tensors in dtype). */
int tr_export_peft(const char *checkpoint_dir, enum tr_dtype dtype, const char *out_dir,
                   tr_err *err);

#endif
