/*
 * schedule = "cosine": linear warmup, then a half cosine from base_lr down
 * to min_lr_ratio * base_lr, reached at the last step.
 */
#include <trainrun/plugin.h>

#include "warmup.h"

#include <stdlib.h>

/* M_PI is not in strict C11 */
static const double pi = 3.14159265358979323846;

struct cosine_config {
    int64_t warmup;
    double min_lr_ratio;
};

static const struct tr_option cosine_options[] = {
    {TR_OPT_INT, "warmup", "0", 0, 1e12, NULL,
     "steps of linear warmup: lr = base_lr * (step+1) / warmup for the first warmup steps",
     offsetof(struct cosine_config, warmup)},
    {TR_OPT_FLOAT, "min_lr_ratio", "0.1", 0, 1, NULL,
     "the learning rate at the last step, as a fraction of base_lr",
     offsetof(struct cosine_config, min_lr_ratio)},
    {.type = TR_OPT_END},
};

static int cosine_create(const struct tr_host *host, const void *config,
                         const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    (void)err;
    /* the core keeps the config alive until destroy: no copy */
    *self = (void *)config;
    return TR_OK;
}

static double cosine_lr(void *self, uint64_t step, uint64_t total, double base_lr)
{
    const struct cosine_config *cfg = self;
    uint64_t warmup = (uint64_t)cfg->warmup;
    double lr;
    if (warming_up(step, warmup, base_lr, &lr))
        return lr;

    double progress = decay_progress(step, warmup, total);
    double min_lr = base_lr * cfg->min_lr_ratio;
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + cos(pi * progress));
}

static const struct tr_schedule_vtable cosine_vtable = {
    .struct_size = sizeof(struct tr_schedule_vtable),
    .lr = cosine_lr,
};

static const struct tr_plugin_info cosine_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_SCHEDULE,
    .name = "cosine",
    .version = "0.1.0",
    .description = "linear warmup, then cosine decay to min_lr_ratio * base_lr at the last step",
    .options = cosine_options,
    .config_size = sizeof(struct cosine_config),
    .create = cosine_create,
    .vtable = &cosine_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &cosine_info;
}
