/*
 * schedule = "step": linear warmup, then the rate is multiplied by gamma
 * every step_size steps.
 */
#include <trainrun/plugin.h>

#include "warmup.h"

#include <stdlib.h>

struct step_config {
    int64_t warmup;
    int64_t step_size;
    double gamma;
};

static const struct tr_option step_options[] = {
    {TR_OPT_INT, "warmup", "0", 0, 1e12, NULL,
     "steps of linear warmup: lr = base_lr * (step+1) / warmup for the first warmup steps",
     offsetof(struct step_config, warmup)},
    {TR_OPT_INT, "step_size", NULL, 1, 1e12, NULL,
     "required: optimizer steps between decays (counted after warmup)",
     offsetof(struct step_config, step_size)},
    {TR_OPT_FLOAT, "gamma", "0.1", 0, 1, NULL,
     "factor the rate is multiplied by at each decay: "
     "lr = base_lr * gamma^floor((step - warmup) / step_size)",
     offsetof(struct step_config, gamma)},
    {.type = TR_OPT_END},
};

static int step_create(const struct tr_host *host, const void *config,
                       const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    (void)err;
    /* the core keeps the config alive until destroy: no copy */
    *self = (void *)config;
    return TR_OK;
}

static double step_lr(void *self, uint64_t step, uint64_t total, double base_lr)
{
    const struct step_config *cfg = self;
    (void)total;
    uint64_t warmup = (uint64_t)cfg->warmup;
    double lr;
    if (warming_up(step, warmup, base_lr, &lr))
        return lr;
    uint64_t decays = (step - warmup) / (uint64_t)cfg->step_size;
    return base_lr * pow(cfg->gamma, (double)decays);
}

static const struct tr_schedule_vtable step_vtable = {
    .struct_size = sizeof(struct tr_schedule_vtable),
    .lr = step_lr,
};

static const struct tr_plugin_info step_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_SCHEDULE,
    .name = "step",
    .version = "0.1.0",
    .description = "linear warmup, then multiply the rate by gamma every step_size steps",
    .options = step_options,
    .config_size = sizeof(struct step_config),
    .create = step_create,
    .vtable = &step_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &step_info;
}
