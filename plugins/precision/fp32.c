/*
 * precision = "fp32": everything in single precision, no loss scaling.
 * The reference policy: slowest, but numerically the safest choice.
 *
 * tf32 = true lets the GEMMs round their fp32 inputs to tf32 (8-bit
 * exponent, 10-bit mantissa) and accumulate in fp32: the cuda backend then
 * runs them on tensor cores (cuBLASLt's CUBLAS_COMPUTE_32F_FAST_TF32), and
 * plan and MFU price the tf32 peak.  The cpu backend has no tf32, so the
 * engine refuses it there when the run or plan starts rather than promise
 * a speed nothing delivers.  allow_tf32 is the same switch under the
 * policy field's name.
 */
#include <trainrun/plugin.h>

#include <stdlib.h>

struct fp32_config {
    int tf32, allow_tf32;
};

static const struct tr_option fp32_options[] = {
    {TR_OPT_BOOL, "tf32", "false", 0, 0, NULL,
     "fp32 GEMMs in tf32 on tensor cores (10-bit mantissa inputs, fp32 accumulation): "
     "device = \"cuda\" only, refused on the cpu",
     offsetof(struct fp32_config, tf32)},
    {TR_OPT_BOOL, "allow_tf32", "false", 0, 0, NULL,
     "the same as tf32 (the precision policy's name for it)",
     offsetof(struct fp32_config, allow_tf32)},
    {.type = TR_OPT_END},
};

static int fp32_create(const struct tr_host *host, const void *config,
                       const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    (void)err;
    /* the core keeps the config alive until destroy: no copy */
    *self = (void *)config;
    return TR_OK;
}

static void fp32_policy(void *self, struct tr_precision_policy *out)
{
    const struct fp32_config *cfg = self;
    out->struct_size = sizeof *out;
    out->master = TR_F32;
    out->compute = TR_F32;
    out->grad = TR_F32;
    out->allow_tf32 = cfg->tf32 || cfg->allow_tf32;
}

static const struct tr_precision_vtable fp32_vtable = {
    .struct_size = sizeof(struct tr_precision_vtable),
    .policy = fp32_policy,
    /* loss_scale, update, state_*: NULL = scale 1, always apply, no state */
};

static const struct tr_plugin_info fp32_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_PRECISION,
    .name = "fp32",
    .version = "0.1.0",
    .description = "single precision everywhere, no loss scaling",
    .options = fp32_options,
    .config_size = sizeof(struct fp32_config),
    .create = fp32_create,
    .vtable = &fp32_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &fp32_info;
}
