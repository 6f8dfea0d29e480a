/* Models: the recipe's Lua builder runs and its graph becomes a tr_graph. */
#ifndef TR_MODEL_H
#define TR_MODEL_H

#include "graph.h"
#include "../config/recipe.h"
#include "../config/run_config.h"

/* Build the graph of recipe's `model` for a micro-batch of `batch` samples.
 * Errors carry the recipe file:line of the model. */
struct tr_graph *tr_model_build(struct tr_recipe *r, int batch, tr_err *err);

/* The graph a run of cfg plans and runs: the model, then its adapters
 * (lora = { ... }, adapters.h); compute: what lora.base = "auto" stores the
 * frozen base in (tr_fit_base_auto).
 * Every command that plans or runs the recipe's model builds it so. */
struct tr_graph *tr_model_build_run(const struct tr_config *cfg, int batch, enum tr_dtype compute,
                                    tr_err *err);

#endif
