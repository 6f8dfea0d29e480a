/* The one choke point per plugin kind (plugin_calls.h): slot checks and
 * defaults, nothing else. */
#include "plugin_calls.h"

#include <string.h>

#define VT(s, type) ((const struct type *)(s)->plugin->info->vtable)

void tr_precision_policy_of(const struct tr_slot *s, struct tr_precision_policy *out)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    VT(s, tr_precision_vtable)->policy(s->self, out);
}

double tr_precision_loss_scale(const struct tr_slot *s)
{
    const struct tr_precision_vtable *vt = VT(s, tr_precision_vtable);
    return TR_HAS_SLOT(vt, struct tr_precision_vtable, loss_scale) ? vt->loss_scale(s->self) : 1.0;
}

int tr_precision_decides_steps(const struct tr_slot *s)
{
    return TR_HAS_SLOT(VT(s, tr_precision_vtable), struct tr_precision_vtable, update);
}

int tr_precision_update(const struct tr_slot *s, int grads_finite, tr_err *err)
{
    const struct tr_precision_vtable *vt = VT(s, tr_precision_vtable);
    if (!TR_HAS_SLOT(vt, struct tr_precision_vtable, update))
        return grads_finite ? 1 : 0;
    return vt->update(s->self, grads_finite, err);
}

double tr_schedule_lr(const struct tr_slot *s, uint64_t step, uint64_t total, double base_lr)
{
    return VT(s, tr_schedule_vtable)->lr(s->self, step, total, base_lr);
}

void tr_schedule_observe(const struct tr_slot *s, uint64_t step, double metric)
{
    const struct tr_schedule_vtable *vt = VT(s, tr_schedule_vtable);
    if (TR_HAS_SLOT(vt, struct tr_schedule_vtable, observe))
        vt->observe(s->self, step, metric);
}

size_t tr_plugin_state_save(const struct tr_slot *s, struct tr_state_var *vars, size_t cap)
{
    if (s->kind == TR_KIND_PRECISION) {
        const struct tr_precision_vtable *p = VT(s, tr_precision_vtable);
        if (TR_HAS_SLOT(p, struct tr_precision_vtable, state_save))
            return p->state_save(s->self, vars, cap);
    } else if (s->kind == TR_KIND_SCHEDULE) {
        const struct tr_schedule_vtable *q = VT(s, tr_schedule_vtable);
        if (TR_HAS_SLOT(q, struct tr_schedule_vtable, state_save))
            return q->state_save(s->self, vars, cap);
    }
    return 0;
}

int tr_plugin_state_load(const struct tr_slot *s, const struct tr_state_var *vars, size_t n,
                         tr_err *err)
{
    if (s->kind == TR_KIND_PRECISION) {
        const struct tr_precision_vtable *p = VT(s, tr_precision_vtable);
        if (TR_HAS_SLOT(p, struct tr_precision_vtable, state_load))
            return p->state_load(s->self, vars, n, err);
    } else if (s->kind == TR_KIND_SCHEDULE) {
        const struct tr_schedule_vtable *q = VT(s, tr_schedule_vtable);
        if (TR_HAS_SLOT(q, struct tr_schedule_vtable, state_load))
            return q->state_load(s->self, vars, n, err);
    }
    return TR_OK;
}

int tr_data_info_of(const struct tr_slot *s, struct tr_data_info *out, tr_err *err)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    return VT(s, tr_data_vtable)->info(s->self, out, err);
}

int tr_logger_open(const struct tr_slot *s, int resume, tr_err *err)
{
    return VT(s, tr_logger_vtable)->open(s->self, resume, err);
}

int tr_logger_text(const struct tr_slot *s, uint64_t step, const char *key, const char *value,
                   tr_err *err)
{
    const struct tr_logger_vtable *vt = VT(s, tr_logger_vtable);
    if (!TR_HAS_SLOT(vt, struct tr_logger_vtable, text))
        return TR_OK;
    return vt->text(s->self, step, key, value, err);
}

int tr_logger_scalars(const struct tr_slot *s, uint64_t step, const struct tr_scalar *v, size_t n,
                      tr_err *err)
{
    return VT(s, tr_logger_vtable)->scalars(s->self, step, v, n, err);
}

int tr_logger_flush(const struct tr_slot *s, tr_err *err)
{
    const struct tr_logger_vtable *vt = VT(s, tr_logger_vtable);
    return TR_HAS_SLOT(vt, struct tr_logger_vtable, flush) ? vt->flush(s->self, err) : TR_OK;
}

int tr_logger_close(const struct tr_slot *s, tr_err *err)
{
    const struct tr_logger_vtable *vt = VT(s, tr_logger_vtable);
    return TR_HAS_SLOT(vt, struct tr_logger_vtable, close) ? vt->close(s->self, err) : TR_OK;
}
