/*
 * Low-rank adapters (LoRA, Hu et al. 2021; QLoRA, Dettmers et al. 2023) as
 * a rewrite of the model's graph, before it is checked and planned, so
 * every command (train, eval, sample, plan, smoke, auto micro-batch) plans
 * and runs the same graph.  For each targeted linear node
 *
 *     y = linear(x, W, b)                       W [out,in] frozen
 *
 * becomes, with A [r,in] and B [out,r] trained and s = alpha / r
 * (alpha / sqrt(r) with rslora):
 *
 *     y_base = linear(x, W, b)                  "<module>"          [..,out]
 *     a      = linear(dropout(x), A)            "<module>.lora_A"   [..,r]
 *     a_s    = scale(a, s)                      "<module>.lora_scale"
 *     y      = linear(a_s, B, y_base)           "<module>.lora_B"   [..,out]
 *
 * (PEFT computes lora_B(lora_A(dropout(x))) * s: the same sum, the scale
 * applied to the r-wide product, where it costs r instead of out per row.)
 * lora_B's third input is an addend (ops.h, tr_linear_addend): y = y_base
 * + a_s B^T with the product going onto the base output tile by tile, and
 * y_base's gradient is y's own buffer (graph_plan.c's grad_alias), so the
 * update is never written out for an add to read back.
 *
 * Every other parameter becomes TR_ROLE_FROZEN (no gradient, no optimizer
 * state, not in the clip norm) except those of modules_to_save, trained in
 * full.  A frozen matrix read only as a linear's weight or an embedding's
 * table is stored in the base's dtype (nf4: the linears other than the
 * output head in NF4, the rest in the compute dtype's width); every other
 * frozen tensor (norm gains, biases) stays fp32.
 *
 * Parameter names are PEFT's without its "base_model.model." prefix:
 * "model.layers.0.self_attn.q_proj.lora_A.weight", so checkpoints and the
 * PEFT export (checkpoint_export.c) map one to one.
 */
#ifndef TR_ADAPTERS_H
#define TR_ADAPTERS_H

#include "graph.h"
#include "../config/lora.h"

/* Rewrite g (read from the model, not yet checked) for lc.  compute: the
 * storage base = "auto" means (fit.h's tr_fit_base_auto: the precision
 * policy's compute dtype where the backend stores 16-bit frozen weights,
 * else fp32).  Errors name lc's recipe line. */
int tr_adapters_apply(struct tr_graph *g, const struct tr_lora_config *lc, enum tr_dtype compute,
                      tr_err *err);

/* Whether a parameter's name is an adapter's ("...lora_A.weight",
 * "...lora_B.weight"): what a base model's files never hold. */
int tr_adapter_param(const char *name);

#endif
