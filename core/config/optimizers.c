/* The optimizers (optimizers.h), each described once: its name, update,
 * state and the optimizer.* options its update reads, with their ranges,
 * defaults and help. */
#include "optimizers.h"

#include "options.h"
#include "run_config.h" /* struct tr_optimizer_config: the fields the options fill */

#include <stddef.h>
#include <string.h>

/* Each name is one object, pointed at by its descriptor and by the list of
 * choices, so the two lists below cannot spell a name two ways. */
static const char adamw_name[] = "adamw", sgd_name[] = "sgd";

#define FIELD(f) offsetof(struct tr_optimizer_config, f)
#define END {TR_OPT_END, NULL, NULL, 0, 0, NULL, NULL, 0}

/* An option more than one update reads is one field with one description:
 * each descriptor lists it, and tr_optimizer_options keeps one copy
 * (tests/test_ops checks that the copies agree). */
#define LR                                                                                         \
    {TR_OPT_FLOAT, "lr", "0.001", 0, TR_NO_MAX, NULL,                                              \
     "peak learning rate (the schedule shapes it)", FIELD(lr)}
#define WEIGHT_DECAY                                                                               \
    {TR_OPT_FLOAT, "weight_decay", "0.0", 0, TR_NO_MAX, NULL,                                      \
     "decoupled weight decay, applied to matrices and embeddings only (not to norms or biases)",   \
     FIELD(weight_decay)}

static const struct tr_option adamw_options[] = {
    LR,
    WEIGHT_DECAY,
    {TR_OPT_FLOAT, "beta1", "0.9", 0, 1, NULL, "AdamW first-moment decay", FIELD(beta1)},
    {TR_OPT_FLOAT, "beta2", "0.999", 0, 1, NULL, "AdamW second-moment decay", FIELD(beta2)},
    {TR_OPT_FLOAT, "eps", "1e-8", 0, 1, NULL, "AdamW denominator epsilon", FIELD(eps)},
    END,
};
static const struct tr_option sgd_options[] = {
    LR,
    {TR_OPT_FLOAT, "momentum", "0.9", 0, 1, NULL, "SGD momentum", FIELD(momentum)},
    WEIGHT_DECAY,
    END,
};

static const struct tr_optimizer_desc adamw = {
    adamw_name, TR_UPDATE_ADAMW, 2, {"exp_avg.", "exp_avg_sq."}, adamw_options};
/* momentum keeps PyTorch's exp_avg name of earlier checkpoints */
static const struct tr_optimizer_desc sgd = {sgd_name, TR_UPDATE_SGD, 1, {"exp_avg."},
                                             sgd_options};

const char *const tr_optimizer_state_files[TR_OPTIMIZER_MAX_SLOTS] = {"optimizer.safetensors",
                                                                      "optimizer2.safetensors"};

/* Adding an optimizer (docs/ops.md): a descriptor above, with its options,
 * and an entry in both lists; its update in engine/optim.c (by its enum
 * tr_optimizer_update), which calls a backend slot with the kernels behind
 * it.  The run configuration offers its name and its options from here. */
const struct tr_optimizer_desc *const tr_optimizers[] = {&adamw, &sgd, NULL};
const char *const tr_optimizer_names[] = {adamw_name, sgd_name, NULL};

const struct tr_optimizer_desc *tr_optimizer_find(const char *type)
{
    for (int i = 0; type && tr_optimizers[i]; i++)
        if (strcmp(tr_optimizers[i]->name, type) == 0)
            return tr_optimizers[i];
    return NULL;
}

int tr_optimizer_options(struct tr_option *out, int cap)
{
    int n = 0;
    for (int i = 0; tr_optimizers[i]; i++)
        for (const struct tr_option *o = tr_optimizers[i]->options; o && o->type != TR_OPT_END;
             o++) {
            int seen = 0;
            for (int k = 0; k < n && !seen; k++)
                seen = strcmp(out[k].name, o->name) == 0;
            if (seen)
                continue;
            if (n + 1 >= cap)
                return -1;
            out[n++] = *o;
        }
    out[n] = (struct tr_option)END;
    return n;
}
