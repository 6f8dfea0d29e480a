/*
 * schedule = "constant": the base learning rate throughout, after an
 * optional linear warmup.
 */
#include <trainrun/plugin.h>

#include "warmup.h"

#include <stdlib.h>

struct constant_config {
    int64_t warmup;
};

static const struct tr_option constant_options[] = {
    {TR_OPT_INT, "warmup", "0", 0, 1e12, NULL,
     "steps of linear warmup: lr = base_lr * (step+1) / warmup for the first warmup steps",
     offsetof(struct constant_config, warmup)},
    {.type = TR_OPT_END},
};

static int constant_create(const struct tr_host *host, const void *config,
                           const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    (void)err;
    /* the core keeps the config alive until destroy: no copy */
    *self = (void *)config;
    return TR_OK;
}

static double constant_lr(void *self, uint64_t step, uint64_t total, double base_lr)
{
    const struct constant_config *cfg = self;
    (void)total;
    uint64_t warmup = (uint64_t)cfg->warmup;
    double lr;
    if (warming_up(step, warmup, base_lr, &lr))
        return lr;
    return base_lr;
}

static const struct tr_schedule_vtable constant_vtable = {
    .struct_size = sizeof(struct tr_schedule_vtable),
    .lr = constant_lr,
};

static const struct tr_plugin_info constant_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_SCHEDULE,
    .name = "constant",
    .version = "0.1.0",
    .description = "constant learning rate after an optional linear warmup",
    .options = constant_options,
    .config_size = sizeof(struct constant_config),
    .create = constant_create,
    .vtable = &constant_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &constant_info;
}
