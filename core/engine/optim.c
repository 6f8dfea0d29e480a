#include "optim.h"
#include "backend.h"

#include "../util/suggest.h"

#include <stdio.h>
#include <string.h>

/* The optimizers themselves are described in config/optimizers.c; each
 * descriptor's update is one of the functions below, which hands a run of
 * parameters and their state slots to the backend's kernel. */

/* A run of n parameters from p, with their gradients and each state slot
 * at the same offset. */
struct update_run {
    float *p;
    const float *grad;
    float *slot[TR_OPTIMIZER_MAX_SLOTS];
    size_t n;
    double weight_decay, grad_scale, lr;
};

static void adamw_update(const struct tr_optimizer *o, const struct tr_backend *be,
                         const struct update_run *u)
{
    const struct tr_optimizer_config *c = o->cfg;
    struct tr_adamw_args a = {(float)u->lr, (float)c->beta1, (float)c->beta2, (float)c->eps,
                              (float)u->weight_decay, (float)u->grad_scale, o->applied};
    tr_be_adamw(be, u->p, u->grad, u->slot[0], u->slot[1], u->n, &a);
}

static void sgd_update(const struct tr_optimizer *o, const struct tr_backend *be,
                       const struct update_run *u)
{
    const struct tr_optimizer_config *c = o->cfg;
    struct tr_sgd_args a = {(float)u->lr, (float)c->momentum, (float)u->weight_decay,
                            (float)u->grad_scale};
    tr_be_sgd(be, u->p, u->grad, u->slot[0], u->n, &a);
}

/* by enum tr_optimizer_update, the descriptor's `update`: each calls its
 * backend slot (iface->adamw, iface->sgd) with the fields the descriptor's
 * `options` name */
static void (*const updates[])(const struct tr_optimizer *, const struct tr_backend *,
                               const struct update_run *) = {
    [TR_UPDATE_ADAMW] = adamw_update,
    [TR_UPDATE_SGD] = sgd_update,
};

/* The run configuration admits only known names; this is for callers that
 * fill a tr_optimizer_config themselves.  The choices come from the table. */
static int unknown_optimizer(const char *type, tr_err *err)
{
    char list[256] = "";
    size_t len = 0, n = 0;
    for (; tr_optimizer_names[n]; n++) {
        int w = snprintf(list + len, sizeof list - len, "%s%s", n ? ", " : "",
                         tr_optimizer_names[n]);
        len += w > 0 && (size_t)w < sizeof list - len ? (size_t)w : 0;
    }
    const char *hint = type ? tr_suggest(type, tr_optimizer_names, n) : NULL;
    if (hint)
        return tr_fail(err, "unknown optimizer.type \"%s\" (did you mean \"%s\"?); choices: %s",
                       type, hint, list);
    return tr_fail(err, "unknown optimizer.type \"%s\"; choices: %s", type ? type : "(none)",
                   list);
}

int tr_optimizer_init(struct tr_optimizer *o, const struct tr_optimizer_config *cfg,
                      const struct tr_graph *g, const struct tr_backend *be,
                      const struct tr_shard *shard, tr_err *err)
{
    memset(o, 0, sizeof *o);
    o->cfg = cfg;
    o->desc = tr_optimizer_find(cfg->type);
    if (!o->desc)
        return unknown_optimizer(cfg->type, err);
    if (shard && tr_shard_sharded(shard))
        o->shard = *shard;
    else /* alone or replicated: one rank owning everything */
        tr_shard_init(&o->shard, g->n_params, g->n_params, 0, 1, TR_SHARD_NONE);
    o->owned = tr_shard_owned(&o->shard, o->shard.rank);
    size_t bytes = o->owned * sizeof(float);
    for (int k = 0; k < o->desc->state_slots; k++)
        if (!(o->state[k] = tr_be_alloc(be, bytes ? bytes : sizeof(float))))
            return tr_fail(err, "out of %s memory for the optimizer state", tr_be_name(be));
    return TR_OK;
}

void tr_optimizer_runs(const struct tr_optimizer *o,
                       void (*fn)(void *ctx, struct tr_shard_run run, size_t state_at), void *ctx)
{
    size_t at = 0;
    for (size_t u = 0; u < o->shard.n_units; u++) {
        struct tr_shard_run r = tr_shard_part(&o->shard, u, o->shard.rank);
        if (r.end > r.begin)
            fn(ctx, r, at);
        at += r.end - r.begin;
    }
}

struct step_ctx {
    struct tr_optimizer *o;
    struct tr_graph *g;
    const struct tr_backend *be;
    double grad_scale, lr;
};

/* One owned run in two: within the decayed tensors, then within the rest. */
static void step_run(void *ctx, struct tr_shard_run r, size_t state_at)
{
    struct step_ctx *c = ctx;
    const struct tr_optimizer *o = c->o;
    size_t nd = c->g->n_decay;
    size_t runs[2][2] = {{r.begin, r.end < nd ? r.end : nd}, {r.begin > nd ? r.begin : nd, r.end}};
    for (int k = 0; k < 2; k++) {
        size_t b = runs[k][0], e = runs[k][1];
        if (b >= e)
            continue;
        struct update_run u = {c->g->params + b, c->g->grads + b, {NULL}, e - b,
                               k == 0 ? o->cfg->weight_decay : 0, c->grad_scale, c->lr};
        for (int s = 0; s < o->desc->state_slots; s++)
            u.slot[s] = o->state[s] + state_at + (b - r.begin);
        updates[o->desc->update](o, c->be, &u);
    }
}

void tr_optimizer_step(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be,
                       double grad_scale, double lr)
{
    o->applied++;
    struct step_ctx c = {o, g, be, grad_scale, lr};
    if (o->only) { /* unsharded: a run's state is at its own offset */
        for (size_t i = 0; i < o->n_only; i++)
            step_run(&c, o->only[i], o->only[i].begin);
        return;
    }
    tr_optimizer_runs(o, step_run, &c);
}

void tr_optimizer_free(struct tr_optimizer *o, const struct tr_backend *be)
{
    for (int k = 0; k < TR_OPTIMIZER_MAX_SLOTS; k++)
        if (o->state[k])
            tr_be_free(be, o->state[k]);
    memset(o, 0, sizeof *o);
}
