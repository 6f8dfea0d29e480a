/*
 * An out-of-tree trainrun plugin: the inverse-square-root schedule.
 *
 *   lr = base_lr * min((step+1) / warmup, sqrt(warmup / (step+1)))
 *
 * i.e. a linear warmup to base_lr at step warmup-1, then decay proportional
 * to 1/sqrt(step).  Build with `make`; select it in a recipe with
 *
 *   schedule = { plugin = "invsqrt", warmup = 100 }
 */
#include <trainrun/plugin.h>

#include <stdlib.h>

/* The options are parsed into this struct by the core before create(). */
struct invsqrt_config {
    int64_t warmup;
};

static const struct tr_option invsqrt_options[] = {
    {TR_OPT_INT, "warmup", "1000", 1, 1e12, NULL,
     "steps of linear warmup; the rate peaks at base_lr at step warmup-1, then decays as "
     "1/sqrt(step)",
     offsetof(struct invsqrt_config, warmup)},
    {.type = TR_OPT_END},
};

static int invsqrt_create(const struct tr_host *host, const void *config,
                          const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    (void)err;
    /* the core keeps the config alive until destroy: no copy */
    *self = (void *)config;
    return TR_OK;
}

static double invsqrt_lr(void *self, uint64_t step, uint64_t total, double base_lr)
{
    const struct invsqrt_config *cfg = self;
    (void)total;
    double s = (double)(step + 1);
    double w = (double)cfg->warmup;
    double warm = s / w;
    double decay = sqrt(w / s);
    return base_lr * (warm < decay ? warm : decay);
}

static const struct tr_schedule_vtable invsqrt_vtable = {
    .struct_size = sizeof(struct tr_schedule_vtable),
    .lr = invsqrt_lr,
    /* observe, state_save, state_load: not needed, the rate depends on the step only */
};

static const struct tr_plugin_info invsqrt_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_SCHEDULE,
    .name = "invsqrt",
    .version = "0.1.0",
    .description = "linear warmup, then inverse-square-root decay",
    .options = invsqrt_options,
    .config_size = sizeof(struct invsqrt_config),
    .create = invsqrt_create,
    .vtable = &invsqrt_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &invsqrt_info;
}
