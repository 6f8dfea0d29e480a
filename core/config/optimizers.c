#include "optimizers.h"

#include <string.h>

/* Each name is one object, pointed at by its descriptor and by the list of
 * choices, so the two lists below cannot spell a name two ways. */
static const char adamw_name[] = "adamw", sgd_name[] = "sgd";

static const struct tr_optimizer_desc adamw = {
    adamw_name, TR_UPDATE_ADAMW, 2, {"exp_avg.", "exp_avg_sq."},
    "lr, beta1, beta2, eps, weight_decay"};
/* momentum keeps PyTorch's exp_avg name of earlier checkpoints */
static const struct tr_optimizer_desc sgd = {sgd_name, TR_UPDATE_SGD, 1, {"exp_avg."},
                                             "lr, momentum, weight_decay"};

/* Adding an optimizer: a descriptor above, an entry in both lists. */
const struct tr_optimizer_desc *const tr_optimizers[] = {&adamw, &sgd, NULL};
const char *const tr_optimizer_names[] = {adamw_name, sgd_name, NULL};

const struct tr_optimizer_desc *tr_optimizer_find(const char *type)
{
    for (int i = 0; type && tr_optimizers[i]; i++)
        if (strcmp(tr_optimizers[i]->name, type) == 0)
            return tr_optimizers[i];
    return NULL;
}
