/*
 * precision = "fp16": fp32 master weights and gradients, fp16 GEMM inputs
 * (fp32 accumulation) and fp16 activation storage on every backend (the
 * logits stay fp32; an activation past 65504 is stored as inf, and the
 * step's non-finite gradients are skipped as an overflow), with dynamic loss
 * scaling.
 *
 * fp16 tops out at 65504 and loses small gradients below ~6e-8, so the loss
 * is multiplied by a scale before backward.  The scale backs off whenever the
 * gradients overflow (that step is skipped) and grows again after
 * growth_interval clean steps.  If gradients overflow even at min_scale the
 * model has diverged (or fp16 is not enough for it) and the run stops.
 */
#include <trainrun/plugin.h>

#include <stdlib.h>
#include <string.h>

struct fp16_config {
    double init_scale;
    double growth_factor;
    double backoff_factor;
    int64_t growth_interval;
    double min_scale;
};

static const struct tr_option fp16_options[] = {
    {TR_OPT_FLOAT, "init_scale", "65536", 0, TR_NO_MAX, NULL,
     "loss scale at the start of the run; must be >= min_scale",
     offsetof(struct fp16_config, init_scale)},
    {TR_OPT_FLOAT, "growth_factor", "2", 1, TR_NO_MAX, NULL,
     "the scale is multiplied by this after growth_interval steps without overflow",
     offsetof(struct fp16_config, growth_factor)},
    {TR_OPT_FLOAT, "backoff_factor", "0.5", 0, 1, NULL,
     "the scale is multiplied by this (strictly between 0 and 1) when gradients "
     "overflow; that step is skipped",
     offsetof(struct fp16_config, backoff_factor)},
    {TR_OPT_INT, "growth_interval", "2000", 1, 1e12, NULL,
     "consecutive steps without overflow before the scale grows",
     offsetof(struct fp16_config, growth_interval)},
    {TR_OPT_FLOAT, "min_scale", "1.0", 0, TR_NO_MAX, NULL,
     "the scale never backs off below this (> 0); an overflow at this scale stops the run "
     "with a diagnosis",
     offsetof(struct fp16_config, min_scale)},
    {.type = TR_OPT_END},
};

struct fp16 {
    struct fp16_config cfg;
    double scale;
    uint64_t good_steps;       /* finite steps since the last growth or overflow */
    uint64_t skipped_steps;    /* all overflow steps of the run */
    uint64_t overflow_streak;  /* consecutive overflow steps, for the diagnosis */
};

static int fp16_create(const struct tr_host *host, const void *config,
                       const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    const struct fp16_config *cfg = config;
    if (!(cfg->min_scale > 0))
        return tr_fail(err, "fp16 precision: min_scale must be > 0 (got %g)", cfg->min_scale);
    if (cfg->init_scale < cfg->min_scale)
        return tr_fail(err,
                       "fp16 precision: init_scale (%g) is below min_scale (%g); raise "
                       "init_scale or lower min_scale",
                       cfg->init_scale, cfg->min_scale);
    if (!(cfg->backoff_factor > 0 && cfg->backoff_factor < 1))
        return tr_fail(err,
                       "fp16 precision: backoff_factor must be strictly between 0 and 1 "
                       "(got %g); 0.5 is the usual choice",
                       cfg->backoff_factor);

    struct fp16 *s = calloc(1, sizeof *s);
    if (!s)
        return tr_fail(err, "fp16 precision: out of memory");
    s->cfg = *cfg;
    s->scale = cfg->init_scale;
    *self = s;
    return TR_OK;
}

static void fp16_destroy(void *self)
{
    free(self);
}

static void fp16_policy(void *self, struct tr_precision_policy *out)
{
    (void)self;
    out->struct_size = sizeof *out;
    out->master = TR_F32;
    out->compute = TR_F16;
    out->grad = TR_F32;
    out->allow_tf32 = 0;
}

static double fp16_loss_scale(void *self)
{
    const struct fp16 *s = self;
    return s->scale;
}

static int fp16_update(void *self, int grads_finite, tr_err *err)
{
    struct fp16 *s = self;
    if (!grads_finite) {
        s->overflow_streak++;
        if (s->scale <= s->cfg.min_scale) {
            if (s->cfg.min_scale <= 1)
                return tr_fail(err,
                               "fp16 loss scale collapsed to %g after %llu consecutive overflow "
                               "steps: gradients are non-finite even unscaled; the model "
                               "diverged or needs bf16/fp32 (precision = \"bf16\")",
                               s->scale, (unsigned long long)s->overflow_streak);
            return tr_fail(err,
                           "fp16 loss scale collapsed to min_scale = %g after %llu consecutive "
                           "overflow steps: gradients are non-finite even at the minimum "
                           "scale; lower min_scale, or the model diverged or needs bf16/fp32 "
                           "(precision = \"bf16\")",
                           s->scale, (unsigned long long)s->overflow_streak);
        }
        s->scale *= s->cfg.backoff_factor;
        if (s->scale < s->cfg.min_scale)
            s->scale = s->cfg.min_scale;
        s->good_steps = 0;
        s->skipped_steps++;
        return 0;
    }
    s->overflow_streak = 0;
    s->good_steps++;
    if (s->good_steps >= (uint64_t)s->cfg.growth_interval) {
        s->scale *= s->cfg.growth_factor;
        s->good_steps = 0;
    }
    return 1;
}

static size_t fp16_state_save(void *self, struct tr_state_var *vars, size_t cap)
{
    const struct fp16 *s = self;
    const struct tr_state_var all[] = {
        {"scale", s->scale},
        {"good_steps", (double)s->good_steps},
        {"skipped_steps", (double)s->skipped_steps},
    };
    size_t n = sizeof all / sizeof all[0];
    if (n > cap)
        n = cap;
    memcpy(vars, all, n * sizeof all[0]);
    return n;
}

/* Variables missing from an older checkpoint keep their current values. */
static int fp16_state_load(void *self, const struct tr_state_var *vars, size_t n, tr_err *err)
{
    struct fp16 *s = self;
    for (size_t i = 0; i < n; i++) {
        double v = vars[i].value;
        if (strcmp(vars[i].name, "scale") == 0) {
            if (!(v > 0) || !isfinite(v))
                return tr_fail(err, "fp16 precision: checkpoint holds an invalid loss scale %g",
                               v);
            s->scale = v;
        } else if (strcmp(vars[i].name, "good_steps") == 0 && v >= 0) {
            s->good_steps = (uint64_t)v;
        } else if (strcmp(vars[i].name, "skipped_steps") == 0 && v >= 0) {
            s->skipped_steps = (uint64_t)v;
        }
    }
    s->overflow_streak = 0;
    return TR_OK;
}

static const struct tr_precision_vtable fp16_vtable = {
    .struct_size = sizeof(struct tr_precision_vtable),
    .policy = fp16_policy,
    .loss_scale = fp16_loss_scale,
    .update = fp16_update,
    .state_save = fp16_state_save,
    .state_load = fp16_state_load,
};

static const struct tr_plugin_info fp16_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_PRECISION,
    .name = "fp16",
    .version = "0.1.0",
    .description = "fp16 compute with fp32 master weights and gradients, dynamic loss scaling",
    .options = fp16_options,
    .config_size = sizeof(struct fp16_config),
    .create = fp16_create,
    .destroy = fp16_destroy,
    .vtable = &fp16_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &fp16_info;
}
