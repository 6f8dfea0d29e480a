#include "optim.h"
#include "backend.h"

#include "../util/suggest.h"
#include "../util/util.h"

#include <math.h>
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
    if (o->only) { /* a stage's, unsharded: a run's state is at its own offset */
        for (size_t i = 0; i < o->n_only; i++)
            fn(ctx, o->only[i], o->only[i].begin);
        return;
    }
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
 * them, the host's CPU backend does, on a worker thread.  A step is a list
 * of chunks (each within the decayed tensors or within the rest, so each
 * keeps its weight decay).  The worker never calls the device backend.
 *
 * In step (parallel.offload_overlap = false): a pipeline inside the step.
 * While the worker updates chunk i on the host, the trainer's thread talks
 * to the device (chunk i-1's parameters up, chunk i+1's gradients down); the
 * step returns with every chunk's parameters uploaded.
 *
 * Overlapped with the next forward (tr_optimizer_offload_overlap): the step
 * brings every owned gradient down (a host buffer of them), queues all the
 * chunks to the worker in the order the forward needs them, and returns.
 * Alone, the graph's before_node hook then uploads, before a forward node
 * runs, the chunks it reads, waiting for the worker where it has not got
 * there yet; anything else that reads the parameters first settles them all
 * (tr_optimizer_settle).  Under a shard level the communication thread
 * uploads a unit's chunks before the unit's all-gather
 * (tr_optimizer_offload_ready), the one other thread that calls the device
 * backend here (its upload only). */

struct offload_chunk {
    size_t begin, n;     /* floats of the flat buffer */
    size_t state_at;     /* where its state starts in state[k] (and the master copy) */
    size_t packed;       /* where its gradients are in the overlap's buffer (chunks packed) */
    double weight_decay;
};

struct tr_offload {
    const struct tr_backend *host;
    float *master;            /* the owned floats, packed as state[k] */
    float *grad[2];           /* chunk buffers, one downloading while one is updated */
    size_t chunk;             /* floats a chunk at most */
    int stale;                /* master must be read from the device first */
    struct offload_chunk *chunks;
    size_t n_chunks, cap;
    /* the worker runs jobs[done..n_jobs) in order */
    pthread_t thread;
    int started;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    struct update_run *jobs;
    size_t n_jobs, jobs_cap, done;
    int quit;
    const struct tr_optimizer *o;
    /* overlapped with the next forward: the owned gradients (packed), the
     * chunks in the forward's order (order[k]: an index into chunks), and
     * per node the last position in that order it reads (-1: none) */
    int overlap;
    float *grads;
    size_t *order;
    long *need;
    int n_nodes;
    size_t uploaded;          /* chunks of order[] whose parameters are up */
    int pending;              /* a step's chunks are not all up yet */
    /* under a shard level: order[] runs unit by unit, unit u's chunks at
     * [unit_begin[u], unit_end[u]); due[u] (under lock): its chunks are
     * queued and not up yet (tr_optimizer_offload_ready uploads them) */
    size_t n_units;
    size_t *unit_begin, *unit_end;
    unsigned char *due;
    struct tr_graph *g;
    const struct tr_backend *be;
    double waited;            /* seconds waited for the worker: the trainer's thread, or
                               * the communication thread under a shard level (under lock) */
    double busy;              /* seconds the worker has updated (under lock) */
};

static void *offload_worker(void *arg)
{
    struct tr_offload *f = arg;
    pthread_mutex_lock(&f->lock);
    for (;;) {
        while (f->done == f->n_jobs && !f->quit)
            pthread_cond_wait(&f->changed, &f->lock);
        if (f->quit)
            break;
        struct update_run u = f->jobs[f->done];
        pthread_mutex_unlock(&f->lock);
        double t0 = tr_now();
        updates[f->o->desc->update](f->o, f->host, &u);
        double took = tr_now() - t0;
        pthread_mutex_lock(&f->lock);
        f->busy += took;
        f->done++;
        pthread_cond_broadcast(&f->changed);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

/* A new step's queue; the worker is idle (everything posted is done). */
static void offload_reset(struct tr_offload *f)
{
    pthread_mutex_lock(&f->lock);
    f->n_jobs = f->done = 0;
    pthread_mutex_unlock(&f->lock);
}

static void offload_post(struct tr_offload *f, const struct update_run *u)
{
    pthread_mutex_lock(&f->lock);
    if (f->n_jobs == f->jobs_cap) {
        f->jobs_cap = f->jobs_cap ? 2 * f->jobs_cap : 64;
        f->jobs = tr_xrealloc(f->jobs, f->jobs_cap * sizeof *f->jobs);
    }
    f->jobs[f->n_jobs++] = *u;
    pthread_cond_broadcast(&f->changed);
    pthread_mutex_unlock(&f->lock);
}

/* Until the worker has done the first n jobs posted. */
static void offload_wait(struct tr_offload *f, size_t n)
{
    pthread_mutex_lock(&f->lock);
    while (f->done < n)
        pthread_cond_wait(&f->changed, &f->lock);
    pthread_mutex_unlock(&f->lock);
}

/* What tr_optimizer_offload_overlap planned (be: the device backend). */
static void overlap_plan_free(struct tr_offload *f, const struct tr_backend *be)
{
    free(f->order);
    free(f->need);
    free(f->unit_begin);
    free(f->unit_end);
    free(f->due);
    tr_be_host_free(be, f->grads);
    f->order = NULL;
    f->need = NULL;
    f->unit_begin = f->unit_end = NULL;
    f->due = NULL;
    f->grads = NULL;
}

static void offload_free(struct tr_optimizer *o, const struct tr_backend *be)
{
    struct tr_offload *f = o->offload;
    if (f->started) {
        offload_wait(f, f->n_jobs); /* nothing it still writes is freed under it */
        pthread_mutex_lock(&f->lock);
        f->quit = 1;
        pthread_cond_broadcast(&f->changed);
        pthread_mutex_unlock(&f->lock);
        pthread_join(f->thread, NULL);
    }
    if (f->g && f->g->before_node_ctx == f) {
        f->g->before_node = NULL;
        f->g->before_node_ctx = NULL;
    }
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->changed);
    for (int k = 0; k < TR_OPTIMIZER_MAX_SLOTS; k++)
        tr_be_free(f->host, o->state[k]);
    tr_be_free(f->host, f->master);
    tr_be_host_free(be, f->grad[0]);
    tr_be_host_free(be, f->grad[1]);
    overlap_plan_free(f, be);
    free(f->chunks);
    free(f->jobs);
    free(f);
    o->offload = NULL;
}

int tr_optimizer_offload(struct tr_optimizer *o, const struct tr_backend *be,
                         const struct tr_backend *host, size_t chunk_floats, tr_err *err)
{
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
     * tr_be_alloc's is: the host backend's own memory (a large buffer's
     * pages resident only once written: a pipeline stage's buffers keep
     * the whole model's layout, and it writes only its parameters' parts).
     * Only the gradients' transfer buffers are page-locked: the master copy
     * goes up through the device backend's own staging */
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
        ok = (o->state[k] = tr_be_alloc(host, n * sizeof(float))) != NULL;
    ok = ok && (f->master = tr_be_alloc(host, n * sizeof(float))) != NULL &&
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

int tr_optimizer_only(struct tr_optimizer *o, const struct tr_shard_run *runs, size_t n,
                      tr_err *err)
{
    o->only = runs;
    o->n_only = n;
    struct tr_offload *f = o->offload;
    if (!f || !f->overlap) /* within the step the chunks are listed every step */
        return TR_OK;
    return tr_optimizer_offload_overlap(o, f->g, f->be, NULL, err);
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
        size_t packed = f->n_chunks ? f->chunks[f->n_chunks - 1].packed +
                                          f->chunks[f->n_chunks - 1].n : 0;
        f->chunks[f->n_chunks++] = (struct offload_chunk){at, n, state_at + (at - b), packed, wd};
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

/* The chunks of the parts this optimizer owns (the same every step). */
static void build_chunks(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be)
{
    struct tr_offload *f = o->offload;
    f->n_chunks = 0;
    struct step_ctx c = {o, g, be, 0, 0};
    tr_optimizer_runs(o, chunk_run, &c);
}

/* Chunk order[k]'s job: its master values, gradients (from), state. */
static struct update_run chunk_job(const struct tr_optimizer *o, const struct offload_chunk *ch,
                                   const float *grad, double grad_scale, double lr)
{
    struct update_run u = {o->offload->master + ch->state_at, grad, {NULL}, ch->n,
                           ch->weight_decay, grad_scale, lr};
    for (int s = 0; s < o->desc->state_slots; s++)
        u.slot[s] = o->state[s] + ch->state_at;
    return u;
}

static void upload_chunk(struct tr_offload *f, const struct offload_chunk *ch)
{
    tr_be_upload(f->be, f->g->params + ch->begin, f->master + ch->state_at,
                 ch->n * sizeof(float));
}

/* Overlapped: the parameters of order[0..upto] on the device, waiting for
 * the worker where it has not updated them yet. */
static void settle_upto(struct tr_offload *f, size_t upto)
{
    while (f->pending && f->uploaded <= upto && f->uploaded < f->n_chunks) {
        double t0 = tr_now();
        offload_wait(f, f->uploaded + 1);
        pthread_mutex_lock(&f->lock);
        f->waited += tr_now() - t0;
        pthread_mutex_unlock(&f->lock);
        upload_chunk(f, &f->chunks[f->order[f->uploaded]]);
        if (++f->uploaded == f->n_chunks)
            f->pending = 0;
    }
}

/* the graph's before_node hook: a forward node's chunks up before it runs;
 * anything else (a backward without a forward first) all of them */
static void offload_before_node(void *ctx, int node, int phase)
{
    struct tr_offload *f = ctx;
    if (!f->pending)
        return;
    if (phase != TR_PHASE_FORWARD || node < 0 || node >= f->n_nodes)
        settle_upto(f, f->n_chunks);
    else if (f->need[node] >= 0)
        settle_upto(f, (size_t)f->need[node]);
}

void tr_optimizer_offload_ready(void *ctx, size_t u)
{
    struct tr_offload *f = ((struct tr_optimizer *)ctx)->offload;
    if (!f || !f->due || u >= f->n_units)
        return;
    pthread_mutex_lock(&f->lock);
    int due = f->due[u];
    f->due[u] = 0;
    double t0 = tr_now();
    while (due && f->done < f->unit_end[u])
        pthread_cond_wait(&f->changed, &f->lock);
    if (due)
        f->waited += tr_now() - t0;
    pthread_mutex_unlock(&f->lock);
    if (!due) /* none queued this step, or already up */
        return;
    for (size_t k = f->unit_begin[u]; k < f->unit_end[u]; k++)
        upload_chunk(f, &f->chunks[f->order[k]]);
}

void tr_optimizer_settle(struct tr_optimizer *o)
{
    struct tr_offload *f = o->offload;
    if (f && f->due) /* what no gather made current (none ran in flight now) */
        for (size_t u = 0; u < f->n_units; u++)
            tr_optimizer_offload_ready(o, u);
    else if (f && f->pending)
        settle_upto(f, f->n_chunks);
}

double tr_optimizer_offload_waited(const struct tr_optimizer *o)
{
    struct tr_offload *f = o->offload;
    if (!f || !f->overlap)
        return NAN;
    pthread_mutex_lock(&f->lock);
    double w = f->waited;
    pthread_mutex_unlock(&f->lock);
    return w;
}

double tr_optimizer_offload_busy(const struct tr_optimizer *o)
{
    struct tr_offload *f = o->offload;
    if (!f)
        return NAN;
    pthread_mutex_lock(&f->lock);
    double busy = f->busy;
    pthread_mutex_unlock(&f->lock);
    return busy;
}

static void offload_step_overlapped(struct tr_optimizer *o, struct tr_graph *g,
                                    const struct tr_backend *be, double grad_scale, double lr)
{
    struct tr_offload *f = o->offload;
    /* every owned gradient down before the next backward writes them */
    for (size_t i = 0; i < f->n_chunks; i++) {
        const struct offload_chunk *ch = &f->chunks[i];
        tr_be_download(be, f->grads + ch->packed, g->grads + ch->begin, ch->n * sizeof(float));
    }
    offload_reset(f);
    f->uploaded = 0;
    f->pending = f->n_chunks > 0 && !f->due;
    if (f->due) { /* each unit's gather makes its chunks current */
        pthread_mutex_lock(&f->lock);
        for (size_t u = 0; u < f->n_units; u++)
            f->due[u] = f->unit_end[u] > f->unit_begin[u];
        pthread_mutex_unlock(&f->lock);
    }
    for (size_t k = 0; k < f->n_chunks; k++) {
        const struct offload_chunk *ch = &f->chunks[f->order[k]];
        struct update_run u = chunk_job(o, ch, f->grads + ch->packed, grad_scale, lr);
        offload_post(f, &u);
    }
}

static void offload_step(struct tr_optimizer *o, struct tr_graph *g, const struct tr_backend *be,
                         double grad_scale, double lr)
{
    struct tr_offload *f = o->offload;
    f->g = g;
    f->be = be;
    tr_optimizer_settle(o); /* the last step's parameters all up before a new update */
    if (f->stale) { /* the device's parameters are the truth until the first update */
        struct master_ctx mc = {f, g, be};
        tr_optimizer_runs(o, read_master, &mc);
        f->stale = 0;
    }
    if (!f->overlap)
        build_chunks(o, g, be);
    if (f->n_chunks == 0)
        return;
    if (f->overlap) {
        offload_step_overlapped(o, g, be, grad_scale, lr);
        return;
    }
    offload_reset(f);
    tr_be_download(be, f->grad[0], g->grads + f->chunks[0].begin,
                   f->chunks[0].n * sizeof(float));
    for (size_t i = 0; i < f->n_chunks; i++) {
        struct update_run u = chunk_job(o, &f->chunks[i], f->grad[i % 2], grad_scale, lr);
        offload_post(f, &u);
        /* while the host updates chunk i: chunk i-1's parameters up (done,
         * and another part of the master copy) and chunk i+1's gradients
         * down (into the buffer chunk i-1's update is done with) */
        if (i > 0)
            upload_chunk(f, &f->chunks[i - 1]);
        if (i + 1 < f->n_chunks)
            tr_be_download(be, f->grad[(i + 1) % 2], g->grads + f->chunks[i + 1].begin,
                           f->chunks[i + 1].n * sizeof(float));
        offload_wait(f, i + 1);
    }
    upload_chunk(f, &f->chunks[f->n_chunks - 1]);
}

/* whether node n reads any of chunk ch's floats as a parameter */
static int reads_chunk(const struct tr_graph *g, const struct tr_node *n,
                       const struct offload_chunk *ch)
{
    for (int k = 0; k < n->n_in; k++) {
        const struct tr_tensor *t = &g->tensors[n->in[k]];
        if (t->role == TR_ROLE_PARAM && ch->begin < t->offset + t->numel &&
            t->offset < ch->begin + ch->n)
            return 1;
    }
    return 0;
}

int tr_optimizer_offload_overlap(struct tr_optimizer *o, struct tr_graph *g,
                                 const struct tr_backend *be, const size_t *unit_pos,
                                 tr_err *err)
{
    struct tr_offload *f = o->offload;
    if (!f)
        return TR_OK;
    if (!unit_pos && g->before_node && g->before_node_ctx != f)
        return tr_fail(err, "parallel.offload_overlap: the graph's node hook is taken");
    f->g = g;
    f->be = be;
    overlap_plan_free(f, be); /* planned again (a stage's runs, tr_optimizer_only) */
    build_chunks(o, g, be);
    size_t nc = f->n_chunks, unit = o->shard.unit ? o->shard.unit : 1;
    /* each chunk's first forward reader (n_nodes: none, so last), or its
     * unit's place in the gathers' order */
    long *first = tr_xcalloc(nc + 1, sizeof *first);
    for (size_t c = 0; c < nc; c++) {
        first[c] = unit_pos ? (long)unit_pos[f->chunks[c].begin / unit] : g->n_nodes;
        for (int i = 0; !unit_pos && i < g->n_nodes && first[c] == g->n_nodes; i++)
            if (reads_chunk(g, &g->nodes[i], &f->chunks[c]))
                first[c] = i;
    }
    /* the chunks by that, then by place */
    f->order = tr_xcalloc(nc + 1, sizeof *f->order);
    tr_order_by_key(f->order, nc, first);
    if (unit_pos) { /* each unit's chunks, one range of order[]: a chunk is in one unit */
        f->n_units = o->shard.n_units;
        f->unit_begin = tr_xcalloc(f->n_units + 1, sizeof *f->unit_begin);
        f->unit_end = tr_xcalloc(f->n_units + 1, sizeof *f->unit_end);
        f->due = tr_xcalloc(f->n_units + 1, 1);
        for (size_t k = nc; k-- > 0;) {
            size_t u = f->chunks[f->order[k]].begin / unit;
            if (f->unit_end[u] == 0)
                f->unit_end[u] = k + 1;
            f->unit_begin[u] = k;
        }
    }
    /* alone, per node: the last position in that order of a chunk it reads
     * (the node hook's; under a shard level the gathers wait) */
    f->n_nodes = unit_pos ? 0 : g->n_nodes;
    f->need = tr_xcalloc((size_t)f->n_nodes + 1, sizeof *f->need);
    for (int i = 0; i < f->n_nodes; i++)
        f->need[i] = -1;
    for (size_t k = 0; k < nc && !unit_pos; k++)
        for (int i = 0; i < g->n_nodes; i++)
            if (reads_chunk(g, &g->nodes[i], &f->chunks[f->order[k]]))
                f->need[i] = (long)k;
    free(first);
    size_t packed = nc ? f->chunks[nc - 1].packed + f->chunks[nc - 1].n : 0;
    f->grads = tr_be_host_alloc(be, (packed ? packed : 1) * sizeof(float));
    if (!f->grads)
        return tr_fail(err, "out of host memory for the offloaded gradients (%zu parameters, 4 "
                       "bytes each); set parallel.offload_overlap = false", packed);
    f->overlap = 1;
    if (!unit_pos) {
        g->before_node = offload_before_node;
        g->before_node_ctx = f;
    }
    return TR_OK;
}
