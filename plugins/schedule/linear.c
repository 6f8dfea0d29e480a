/*
 * schedule = "linear": linear warmup, then a straight line from base_lr down
 * to end_ratio * base_lr, reached at the last step.
 */
#include <trainrun/plugin.h>

#include "warmup.h"

#include <stdlib.h>

struct linear_config {
    int64_t warmup;
    double end_ratio;
};

static const struct tr_option linear_options[] = {
    {TR_OPT_INT, "warmup", "0", 0, 1e12, NULL,
     "steps of linear warmup: lr = base_lr * (step+1) / warmup for the first warmup steps",
     offsetof(struct linear_config, warmup)},
    {TR_OPT_FLOAT, "end_ratio", "0.0", 0, 1, NULL,
     "the learning rate at the last step, as a fraction of base_lr",
     offsetof(struct linear_config, end_ratio)},
    {.type = TR_OPT_END},
};

static int linear_create(const struct tr_host *host, const void *config,
                         const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    (void)err;
    /* the core keeps the config alive until destroy: no copy */
    *self = (void *)config;
    return TR_OK;
}

static double linear_lr(void *self, uint64_t step, uint64_t total, double base_lr)
{
    const struct linear_config *cfg = self;
    uint64_t warmup = (uint64_t)cfg->warmup;
    double lr;
    if (warming_up(step, warmup, base_lr, &lr))
        return lr;

    double progress = decay_progress(step, warmup, total);
    return base_lr * (1.0 + (cfg->end_ratio - 1.0) * progress);
}

static const struct tr_schedule_vtable linear_vtable = {
    .struct_size = sizeof(struct tr_schedule_vtable),
    .lr = linear_lr,
};

static const struct tr_plugin_info linear_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_SCHEDULE,
    .name = "linear",
    .version = "0.1.0",
    .description = "linear warmup, then linear decay to end_ratio * base_lr at the last step",
    .options = linear_options,
    .config_size = sizeof(struct linear_config),
    .create = linear_create,
    .vtable = &linear_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &linear_info;
}
