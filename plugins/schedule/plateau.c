/*
 * schedule = "plateau": reduce the rate when the validation loss stops
 * improving.  The core calls observe() after every evaluation; once more
 * than `patience` evaluations in a row fail to improve on the best loss by
 * the relative `threshold`, the rate is multiplied by `factor` (never below
 * min_lr_ratio * base_lr) and `cooldown` evaluations pass before counting
 * again.
 */
#include <trainrun/plugin.h>

#include "warmup.h"

#include <stdlib.h>
#include <string.h>

struct plateau_config {
    double factor;
    int64_t patience;
    double threshold;
    int64_t cooldown;
    double min_lr_ratio;
    int64_t warmup;
};

static const struct tr_option plateau_options[] = {
    {TR_OPT_FLOAT, "factor", "0.5", 0, 1, NULL,
     "the rate is multiplied by this (strictly between 0 and 1) at each reduction",
     offsetof(struct plateau_config, factor)},
    {TR_OPT_INT, "patience", "3", 0, 1000000, NULL,
     "evaluations without improvement that are tolerated; the next one reduces the rate",
     offsetof(struct plateau_config, patience)},
    {TR_OPT_FLOAT, "threshold", "1e-4", 0, TR_NO_MAX, NULL,
     "relative improvement that counts: the validation loss must drop below "
     "best * (1 - threshold)",
     offsetof(struct plateau_config, threshold)},
    {TR_OPT_INT, "cooldown", "0", 0, 1000000, NULL,
     "evaluations to wait after a reduction before counting non-improving ones again",
     offsetof(struct plateau_config, cooldown)},
    {TR_OPT_FLOAT, "min_lr_ratio", "0.0", 0, 1, NULL,
     "the rate never drops below min_lr_ratio * base_lr",
     offsetof(struct plateau_config, min_lr_ratio)},
    {TR_OPT_INT, "warmup", "0", 0, 1e12, NULL,
     "steps of linear warmup: lr = base_lr * (step+1) / warmup; evaluations during warmup "
     "only record the best loss",
     offsetof(struct plateau_config, warmup)},
    {.type = TR_OPT_END},
};

struct plateau {
    struct plateau_config cfg;
    int has_best;
    double best;              /* lowest validation loss seen (when has_best) */
    uint64_t bad_evals;       /* consecutive evaluations without improvement */
    uint64_t cooldown_left;   /* evaluations until bad ones count again */
    double current_factor;    /* lr = base_lr * current_factor after warmup */
};

static int plateau_create(const struct tr_host *host, const void *config,
                          const struct tr_create_args *args, void **self, tr_err *err)
{
    (void)host;
    (void)args;
    const struct plateau_config *cfg = config;
    if (!(cfg->factor > 0 && cfg->factor < 1))
        return tr_fail(err,
                       "plateau schedule: factor must be strictly between 0 and 1 (got %g); "
                       "0.5 halves the rate at each reduction",
                       cfg->factor);
    struct plateau *s = calloc(1, sizeof *s);
    if (!s)
        return tr_fail(err, "plateau schedule: out of memory");
    s->cfg = *cfg;
    s->current_factor = 1.0;
    *self = s;
    return TR_OK;
}

static void plateau_destroy(void *self)
{
    free(self);
}

static double plateau_lr(void *self, uint64_t step, uint64_t total, double base_lr)
{
    const struct plateau *s = self;
    (void)total;
    uint64_t warmup = (uint64_t)s->cfg.warmup;
    double lr;
    if (warming_up(step, warmup, base_lr, &lr))
        return lr;
    return base_lr * s->current_factor;
}

static void plateau_observe(void *self, uint64_t step, double metric)
{
    struct plateau *s = self;
    /* fabs keeps the test meaningful for negative metrics; NaN never improves */
    int improved = isfinite(metric) &&
                   (!s->has_best || metric < s->best - fabs(s->best) * s->cfg.threshold);
    if (improved) {
        s->best = metric;
        s->has_best = 1;
        s->bad_evals = 0;
    } else if (step >= (uint64_t)s->cfg.warmup) {
        s->bad_evals++;
    }

    if (s->cooldown_left > 0) {
        s->cooldown_left--;
        s->bad_evals = 0;
    }

    if (s->bad_evals > (uint64_t)s->cfg.patience) {
        s->current_factor *= s->cfg.factor;
        if (s->current_factor < s->cfg.min_lr_ratio)
            s->current_factor = s->cfg.min_lr_ratio;
        s->cooldown_left = (uint64_t)s->cfg.cooldown;
        s->bad_evals = 0;
    }
}

/* "best" is saved only once there is one, so no infinity ever reaches the
 * checkpoint. */
static size_t plateau_state_save(void *self, struct tr_state_var *vars, size_t cap)
{
    const struct plateau *s = self;
    struct tr_state_var all[4] = {
        {"factor", s->current_factor},
        {"bad_evals", (double)s->bad_evals},
        {"cooldown_left", (double)s->cooldown_left},
        {"best", s->best},
    };
    size_t n = s->has_best ? 4 : 3;
    if (n > cap)
        n = cap;
    memcpy(vars, all, n * sizeof all[0]);
    return n;
}

static int plateau_state_load(void *self, const struct tr_state_var *vars, size_t n, tr_err *err)
{
    struct plateau *s = self;
    s->has_best = 0;
    for (size_t i = 0; i < n; i++) {
        double v = vars[i].value;
        if (strcmp(vars[i].name, "factor") == 0) {
            if (!(v >= 0 && v <= 1))
                return tr_fail(err, "plateau schedule: checkpoint holds an invalid factor %g", v);
            s->current_factor = v;
        } else if (strcmp(vars[i].name, "bad_evals") == 0 && v >= 0) {
            s->bad_evals = (uint64_t)v;
        } else if (strcmp(vars[i].name, "cooldown_left") == 0 && v >= 0) {
            s->cooldown_left = (uint64_t)v;
        } else if (strcmp(vars[i].name, "best") == 0 && isfinite(v)) {
            s->best = v;
            s->has_best = 1;
        }
    }
    return TR_OK;
}

static const struct tr_schedule_vtable plateau_vtable = {
    .struct_size = sizeof(struct tr_schedule_vtable),
    .lr = plateau_lr,
    .observe = plateau_observe,
    .state_save = plateau_state_save,
    .state_load = plateau_state_load,
};

static const struct tr_plugin_info plateau_info = {
    .abi_major = TR_ABI_MAJOR,
    .struct_size = sizeof(struct tr_plugin_info),
    .kind = TR_KIND_SCHEDULE,
    .name = "plateau",
    .version = "0.1.0",
    .description = "reduce the learning rate by `factor` when the validation loss stops improving",
    .options = plateau_options,
    .config_size = sizeof(struct plateau_config),
    .create = plateau_create,
    .destroy = plateau_destroy,
    .vtable = &plateau_vtable,
};

const struct tr_plugin_info *TR_PLUGIN_ENTRY(void)
{
    return &plateau_info;
}
