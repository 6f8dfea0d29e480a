#include "optim.h"

#include <string.h>

int tr_optimizer_init(struct tr_optimizer *o, const struct tr_optimizer_config *cfg,
                      const struct tr_graph *g, const struct tr_backend *be, tr_err *err)
{
    memset(o, 0, sizeof *o);
    o->cfg = cfg;
    size_t bytes = g->n_params * sizeof(float);
    o->m = be->iface->alloc(be->context, bytes);
    if (strcmp(cfg->type, "adamw") == 0)
        o->v = be->iface->alloc(be->context, bytes);
    if (!o->m || (strcmp(cfg->type, "adamw") == 0 && !o->v))
        return tr_fail(err, "out of %s memory for the optimizer state", be->iface->name);
    return TR_OK;
}

void tr_optimizer_step(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be,
                       double grad_scale, double lr)
{
    const struct tr_optimizer_config *c = o->cfg;
    size_t nd = g->n_decay, rest = g->n_params - g->n_decay;
    o->applied++;
    if (o->v) {
        struct tr_adamw_args a = {(float)lr, (float)c->beta1, (float)c->beta2, (float)c->eps,
                                  (float)c->weight_decay, (float)grad_scale, o->applied};
        be->iface->adamw(be->context, g->params, g->grads, o->m, o->v, nd, &a);
        a.weight_decay = 0;
        be->iface->adamw(be->context, g->params + nd, g->grads + nd, o->m + nd, o->v + nd, rest, &a);
    } else {
        struct tr_sgd_args a = {(float)lr, (float)c->momentum, (float)c->weight_decay,
                                (float)grad_scale};
        be->iface->sgd(be->context, g->params, g->grads, o->m, nd, &a);
        a.weight_decay = 0;
        be->iface->sgd(be->context, g->params + nd, g->grads + nd, o->m + nd, rest, &a);
    }
}

void tr_optimizer_free(struct tr_optimizer *o, const struct tr_backend *be)
{
    if (o->m)
        be->iface->free(be->context, o->m);
    if (o->v)
        be->iface->free(be->context, o->v);
    memset(o, 0, sizeof *o);
}
