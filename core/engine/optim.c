#include "optim.h"
#include "backend.h"

#include "../util/suggest.h"
#include "../util/util.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
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

static void offload_step(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be,
                         double grad_scale, double lr);

void tr_optimizer_step(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be,
                       double grad_scale, double lr)
{
    o->applied++;
    if (o->offload) {
        offload_step(o, g, be, grad_scale, lr);
        return;
    }
    struct step_ctx c = {o, g, be, grad_scale, lr};
    if (o->only) { /* unsharded: a run's state is at its own offset */
        for (size_t i = 0; i < o->n_only; i++)
            step_run(&c, o->only[i], o->only[i].begin);
        return;
    }
    tr_optimizer_runs(o, step_run, &c);
}

static void offload_free(struct tr_optimizer *o, const struct tr_backend *be);

void tr_optimizer_free(struct tr_optimizer *o, const struct tr_backend *be)
{
    if (o->offload) {
        offload_free(o, be);
    } else {
        for (int k = 0; k < TR_OPTIMIZER_MAX_SLOTS; k++)
            if (o->state[k])
                tr_be_free(be, o->state[k]);
    }
    memset(o, 0, sizeof *o);
}

/* ---- parallel.offload = "optimizer" ------------------------------------------
 *
 * The state and the master copy are host memory; the core does no math on
 * them, the host's CPU backend does.  A step is a list of chunks (each
 * within the decayed tensors or within the rest, so each keeps its weight
 * decay), and runs as a pipeline: while the worker updates chunk i on the
 * host, this thread talks to the device (chunk i-1's parameters up, chunk
 * i+1's gradients down).  Device calls stay on one thread: a backend need
 * not take calls from two. */

struct offload_chunk {
    size_t begin, n;     /* floats of the flat buffer */
    size_t state_at;     /* where its state starts in state[k] */
    double weight_decay;
};

struct tr_offload {
    const struct tr_backend *host;
    float *master;            /* g->n_params floats, the flat buffer's layout */
    float *grad[2];           /* chunk buffers, one downloading while one is updated */
    size_t chunk;             /* floats a chunk at most */
    int stale;                /* master must be read from the device first */
    struct offload_chunk *chunks;
    size_t n_chunks, cap;
    /* the worker: one posted chunk at a time */
    pthread_t thread;
    int started;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int posted, finished, quit;
    const struct tr_optimizer *o;
    struct update_run job;
};

static void *offload_worker(void *arg)
{
    struct tr_offload *f = arg;
    pthread_mutex_lock(&f->lock);
    for (;;) {
        while (!f->posted && !f->quit)
            pthread_cond_wait(&f->changed, &f->lock);
        if (f->quit)
            break;
        struct update_run u = f->job;
        f->posted = 0;
        pthread_mutex_unlock(&f->lock);
        updates[f->o->desc->update](f->o, f->host, &u);
        pthread_mutex_lock(&f->lock);
        f->finished = 1;
        pthread_cond_broadcast(&f->changed);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

static void offload_post(struct tr_offload *f, const struct update_run *u)
{
    pthread_mutex_lock(&f->lock);
    f->job = *u;
    f->finished = 0;
    f->posted = 1;
    pthread_cond_broadcast(&f->changed);
    pthread_mutex_unlock(&f->lock);
}

static void offload_wait(struct tr_offload *f)
{
    pthread_mutex_lock(&f->lock);
    while (!f->finished)
        pthread_cond_wait(&f->changed, &f->lock);
    pthread_mutex_unlock(&f->lock);
}

static void offload_free(struct tr_optimizer *o, const struct tr_backend *be)
{
    struct tr_offload *f = o->offload;
    if (f->started) {
        pthread_mutex_lock(&f->lock);
        f->quit = 1;
        pthread_cond_broadcast(&f->changed);
        pthread_mutex_unlock(&f->lock);
        pthread_join(f->thread, NULL);
    }
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->changed);
    for (int k = 0; k < TR_OPTIMIZER_MAX_SLOTS; k++)
        tr_be_host_free(be, o->state[k]);
    tr_be_host_free(be, f->master);
    tr_be_host_free(be, f->grad[0]);
    tr_be_host_free(be, f->grad[1]);
    free(f->chunks);
    free(f);
    o->offload = NULL;
}

int tr_optimizer_offload(struct tr_optimizer *o, const struct tr_backend *be,
                         const struct tr_backend *host, size_t chunk_floats, tr_err *err)
{
    if (o->only)
        return tr_fail(err, "parallel.offload = \"optimizer\": not with pipeline stages yet");
    struct tr_offload *f = calloc(1, sizeof *f);
    if (!f)
        return tr_fail(err, "out of memory for the optimizer offload");
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->changed, NULL);
    f->host = host;
    f->o = o;
    f->stale = 1;
    f->chunk = chunk_floats ? chunk_floats : 1;
    /* the device's state goes; the host's takes its place, zeroed as
     * tr_be_alloc's is */
    for (int k = 0; k < o->desc->state_slots; k++) {
        tr_be_free(be, o->state[k]);
        o->state[k] = NULL;
    }
    o->offload = f;
    /* the parts this rank owns (all of them without a shard level), one
     * after another as the device's state kept them: state and master copy
     * alike, so a chunk's master values are at its state offset */
    size_t n = o->owned ? o->owned : 1;
    size_t chunk = f->chunk < n ? f->chunk : n;
    int ok = 1;
    for (int k = 0; k < o->desc->state_slots && ok; k++)
        if ((ok = (o->state[k] = tr_be_host_alloc(be, n * sizeof(float))) != NULL))
            memset(o->state[k], 0, n * sizeof(float));
    ok = ok && (f->master = tr_be_host_alloc(be, n * sizeof(float))) != NULL &&
         (f->grad[0] = tr_be_host_alloc(be, chunk * sizeof(float))) != NULL &&
         (f->grad[1] = tr_be_host_alloc(be, chunk * sizeof(float))) != NULL;
    if (!ok)
        return tr_fail(err, "out of host memory for the offloaded optimizer state (%zu "
                       "parameters: %d bytes each); use parallel.offload = \"none\" or a "
                       "machine with more memory", o->owned, 4 * (o->desc->state_slots + 1));
    /* the worker takes no signal: stop signals are the run's (stop_signals.h),
     * and its OpenMP threads inherit the mask */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&f->thread, NULL, offload_worker, f);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return tr_fail(err, "could not start the optimizer offload's worker thread: %s",
                       strerror(rc));
    pthread_setname_np(f->thread, "trainrun-offload"); /* top -H */
    f->started = 1;
    return TR_OK;
}

const struct tr_backend *tr_optimizer_state_backend(const struct tr_optimizer *o,
                                                    const struct tr_backend *be)
{
    return o->offload ? o->offload->host : be;
}

void tr_optimizer_params_changed(struct tr_optimizer *o)
{
    if (o->offload)
        o->offload->stale = 1;
}

static void add_chunk(struct tr_offload *f, size_t b, size_t e, size_t state_at, double wd)
{
    for (size_t at = b; at < e; at += f->chunk) {
        if (f->n_chunks == f->cap) {
            size_t cap = f->cap ? 2 * f->cap : 64;
            f->chunks = tr_xrealloc(f->chunks, cap * sizeof *f->chunks);
            f->cap = cap;
        }
        size_t n = e - at < f->chunk ? e - at : f->chunk;
        f->chunks[f->n_chunks++] = (struct offload_chunk){at, n, state_at + (at - b), wd};
    }
}

/* step_run's split into decayed and not, as chunks */
static void chunk_run(void *ctx, struct tr_shard_run r, size_t state_at)
{
    struct step_ctx *c = ctx;
    const struct tr_optimizer *o = c->o;
    size_t nd = c->g->n_decay;
    size_t runs[2][2] = {{r.begin, r.end < nd ? r.end : nd}, {r.begin > nd ? r.begin : nd, r.end}};
    for (int k = 0; k < 2; k++)
        if (runs[k][0] < runs[k][1])
            add_chunk(o->offload, runs[k][0], runs[k][1], state_at + (runs[k][0] - r.begin),
                      k == 0 ? o->cfg->weight_decay : 0);
}

/* The master copy of one owned run from the device's parameters (never
 * another rank's parts: under sharded parameters they are not there). */
struct master_ctx {
    struct tr_offload *f;
    const struct tr_graph *g;
    const struct tr_backend *be;
};

static void read_master(void *ctx, struct tr_shard_run r, size_t state_at)
{
    struct master_ctx *c = ctx;
    tr_be_download(c->be, c->f->master + state_at, c->g->params + r.begin,
                   (r.end - r.begin) * sizeof(float));
}

static void offload_step(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be,
                         double grad_scale, double lr)
{
    struct tr_offload *f = o->offload;
    if (f->stale) { /* the device's parameters are the truth until the first update */
        struct master_ctx mc = {f, g, be};
        tr_optimizer_runs(o, read_master, &mc);
        f->stale = 0;
    }
    f->n_chunks = 0;
    struct step_ctx c = {o, g, be, grad_scale, lr};
    tr_optimizer_runs(o, chunk_run, &c);
    if (f->n_chunks == 0)
        return;
    tr_be_download(be, f->grad[0], g->grads + f->chunks[0].begin,
                   f->chunks[0].n * sizeof(float));
    for (size_t i = 0; i < f->n_chunks; i++) {
        const struct offload_chunk *ch = &f->chunks[i];
        struct update_run u = {f->master + ch->state_at, f->grad[i % 2], {NULL}, ch->n,
                               ch->weight_decay, grad_scale, lr};
        for (int s = 0; s < o->desc->state_slots; s++)
            u.slot[s] = o->state[s] + ch->state_at;
        offload_post(f, &u);
        /* while the host updates chunk i: chunk i-1's parameters up (done,
         * and another part of the master copy) and chunk i+1's gradients
         * down (into the buffer chunk i-1's update is done with) */
        if (i > 0) {
            const struct offload_chunk *prev = &f->chunks[i - 1];
            tr_be_upload(be, g->params + prev->begin, f->master + prev->state_at,
                         prev->n * sizeof(float));
        }
        if (i + 1 < f->n_chunks)
            tr_be_download(be, f->grad[(i + 1) % 2], g->grads + f->chunks[i + 1].begin,
                           f->chunks[i + 1].n * sizeof(float));
        offload_wait(f);
    }
    const struct offload_chunk *last = &f->chunks[f->n_chunks - 1];
    tr_be_upload(be, g->params + last->begin, f->master + last->state_at, last->n * sizeof(float));
}
