/* Models: the recipe's Lua builder runs and its graph becomes a tr_graph. */
#ifndef TR_MODEL_H
#define TR_MODEL_H

#include "graph.h"
#include "../config/recipe.h"

/* Build the graph of recipe's `model` for a micro-batch of `batch` samples.
 * Errors carry the recipe file:line of the model. */
struct tr_graph *tr_model_build(struct tr_recipe *r, int batch, tr_err *err);

#endif
