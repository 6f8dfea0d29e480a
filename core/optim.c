#include "optim.h"

#include <string.h>

int tr_optimizer_init(struct tr_optimizer *o, const struct tr_optimizer_config *cfg,
                      const struct tr_graph *g, const struct tr_backend *be, size_t begin,
                      size_t end, tr_err *err)
{
    (void)g;
    memset(o, 0, sizeof *o);
    o->cfg = cfg;
    o->begin = begin;
    o->end = end;
    size_t bytes = (end - begin) * sizeof(float);
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
    o->applied++;
    /* two runs: [begin, end) within the decayed tensors, then within the rest */
    size_t nd = g->n_decay;
    size_t runs[2][2] = {{o->begin, o->end < nd ? o->end : nd},
                         {o->begin > nd ? o->begin : nd, o->end}};
    for (int k = 0; k < 2; k++) {
        size_t b = runs[k][0], e = runs[k][1];
        if (b >= e)
            continue;
        float *p = g->params + b, *m = o->m + (b - o->begin);
        const float *grad = g->grads + b;
        double wd = k == 0 ? c->weight_decay : 0;
        if (o->v) {
            struct tr_adamw_args a = {(float)lr, (float)c->beta1, (float)c->beta2, (float)c->eps,
                                      (float)wd, (float)grad_scale, o->applied};
            be->iface->adamw(be->context, p, grad, m, o->v + (b - o->begin), e - b, &a);
        } else {
            struct tr_sgd_args a = {(float)lr, (float)c->momentum, (float)wd, (float)grad_scale};
            be->iface->sgd(be->context, p, grad, m, e - b, &a);
        }
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
