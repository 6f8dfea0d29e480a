#include "optimizers.h"

#include <string.h>

/* Each name is one object, pointed at by its descriptor and by the list of
 * choices, so the two lists below cannot spell a name two ways. */
static const char adamw_name[] = "adamw", sgd_name[] = "sgd";

static const char *const adamw_options[] = {"lr", "beta1", "beta2", "eps", "weight_decay", NULL};
static const char *const sgd_options[] = {"lr", "momentum", "weight_decay", NULL};

static const struct tr_optimizer_desc adamw = {
    adamw_name, TR_UPDATE_ADAMW, 2, {"exp_avg.", "exp_avg_sq."}, adamw_options};
/* momentum keeps PyTorch's exp_avg name of earlier checkpoints */
static const struct tr_optimizer_desc sgd = {sgd_name, TR_UPDATE_SGD, 1, {"exp_avg."},
                                             sgd_options};

const char *const tr_optimizer_state_files[TR_OPTIMIZER_MAX_SLOTS] = {"optimizer.safetensors",
                                                                      "optimizer2.safetensors"};

/* Adding an optimizer (docs/ops.md): a descriptor above and an entry in
 * both lists; its update in engine/optim.c (by its enum
 * tr_optimizer_update), which calls a backend slot with the kernels behind
 * it; its fields in the run configuration's optimizer options. */
const struct tr_optimizer_desc *const tr_optimizers[] = {&adamw, &sgd, NULL};
const char *const tr_optimizer_names[] = {adamw_name, sgd_name, NULL};

const struct tr_optimizer_desc *tr_optimizer_find(const char *type)
{
    for (int i = 0; type && tr_optimizers[i]; i++)
        if (strcmp(tr_optimizers[i]->name, type) == 0)
            return tr_optimizers[i];
    return NULL;
}
