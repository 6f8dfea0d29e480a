/*
 * precision = "bf16": fp32 master weights and gradients, bf16 GEMM inputs
 * (fp32 accumulation) and bf16 activation storage on every backend (the
 * logits stay fp32).
 * bf16 has fp32's exponent range, so gradients cannot overflow where fp32
 * would not and no loss scaling is needed.
 */
#include <trainrun/plugin.h>

static int bf16_create(const struct tr_host *host, const void *config,
                       const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)config;
    (void)args;
    (void)err;
    *self = NULL; /* stateless */
    return TR_OK;
}

static void bf16_policy(void *self, struct tr_precision_policy *out)
{
    (void)self;
    out->struct_size = sizeof *out;
    out->master = TR_F32;
    out->compute = TR_BF16;
    out->grad = TR_F32;
    out->allow_tf32 = 0;
}

static const struct tr_precision_vtable bf16_vtable = {
    .struct_size = sizeof(struct tr_precision_vtable),
    .policy = bf16_policy,
};

static const struct tr_plugin_info bf16_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_PRECISION,
    .name = "bf16",
    .version = "0.1.0",
    .description = "bf16 compute with fp32 master weights and gradients; no loss scaling needed",
    .options = NULL,
    .config_size = 0,
    .create = bf16_create,
    .destroy = NULL,
    .vtable = &bf16_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &bf16_info;
}
