#include "loader.h"

#include "topo.h"
#include "../util/util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- a stateless permutation of [0, n): a 4-round Feistel network on the
 * smallest even power-of-two domain >= n, with cycle walking ------------ */

uint64_t tr_loader_sample(uint64_t seed, uint64_t epoch, uint64_t i, uint64_t n, int shuffle)
{
    if (!shuffle || n <= 1)
        return i % (n ? n : 1);
    int bits = 2;
    while ((1ULL << bits) < n)
        bits++;
    bits += bits & 1;
    int half = bits / 2;
    uint64_t mask = (1ULL << half) - 1;
    uint64_t key = tr_mix64(seed * TR_GOLDEN64 ^ tr_mix64(epoch + 1));
    uint64_t x = i;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (int round = 0; round < 4; round++) {
            uint64_t f = tr_mix64(r ^ key ^ ((uint64_t)round << 56)) & mask;
            uint64_t t = r;
            r = l ^ f;
            l = t;
        }
        x = (l << half) | r;
    } while (x >= n);
    return x;
}

/* ---- the loader ------------------------------------------------------- */

struct slot {
    uint64_t id;   /* micro-batch number held, or UINT64_MAX */
    int ready;
    void *inputs;
    int32_t *targets;
    uint64_t *indices;
};

struct tr_loader {
    struct tr_data_source src;
    struct tr_loader_config cfg;
    size_t input_bytes, target_count;
    uint64_t per_epoch;
    uint64_t n;          /* samples an epoch draws from */
    uint64_t step;       /* sample index = drawn index * step */
    uint64_t next;       /* next micro-batch the consumer takes */
    uint64_t next_fill;  /* next micro-batch a worker will fill */
    struct slot *slots;
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int stop;
    int failed;
    int cancelled;
    int running; /* workers that have not exited */
    tr_err error;
};

/* How long close waits, once cancelled, for a worker stuck in a read. */
#define STUCK_GRACE_SECONDS 2.0

/* Wait on l->changed (l->lock held) for at most 50 ms. */
static void wait_a_moment(struct tr_loader *l)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += 50 * 1000 * 1000;
    if (t.tv_nsec >= 1000 * 1000 * 1000) {
        t.tv_sec++;
        t.tv_nsec -= 1000 * 1000 * 1000;
    }
    pthread_cond_timedwait(&l->changed, &l->lock, &t);
}

/* Wait on l->changed (l->lock held).  With a cancel flag, wake every 50 ms
 * to look at it: a signal handler cannot signal a condition variable.
 * Returns 1 when cancelled. */
static int wait_changed(struct tr_loader *l)
{
    if (!l->cfg.cancel) {
        pthread_cond_wait(&l->changed, &l->lock);
        return 0;
    }
    if (*l->cfg.cancel)
        return 1;
    wait_a_moment(l);
    return *l->cfg.cancel != 0;
}

static int fill(struct tr_loader *l, uint64_t id, void *inputs, int32_t *targets, uint64_t *idx,
                tr_err *err)
{
    uint64_t n = l->n;
    if (l->cfg.stride > 1)
        id = id * (uint64_t)l->cfg.stride + (uint64_t)l->cfg.rank;
    uint64_t epoch = id / l->per_epoch, first = (id % l->per_epoch) * (uint64_t)l->cfg.batch;
    for (int b = 0; b < l->cfg.batch; b++)
        idx[b] = tr_loader_sample(l->cfg.seed, epoch, first + (uint64_t)b, n, l->cfg.shuffle) *
                 l->step;
    return l->src.vt->read(l->src.self, l->cfg.split, idx, (size_t)l->cfg.batch, inputs, targets,
                           err);
}

static void *worker(void *arg)
{
    struct tr_loader *l = arg;
    if (l->cfg.topo)
        tr_topo_bind_loader(l->cfg.topo);
    pthread_mutex_lock(&l->lock);
    while (!l->stop) {
        uint64_t id = l->next_fill;
        struct slot *s = &l->slots[id % (uint64_t)l->cfg.prefetch];
        /* the slot is free once the consumer is past what it held */
        if (id >= l->next + (uint64_t)l->cfg.prefetch || s->id != UINT64_MAX) {
            pthread_cond_wait(&l->changed, &l->lock);
            continue;
        }
        l->next_fill++;
        s->id = id;
        s->ready = 0;
        pthread_mutex_unlock(&l->lock);
        tr_err err = {{0}};
        int rc = fill(l, id, s->inputs, s->targets, s->indices, &err);
        pthread_mutex_lock(&l->lock);
        if (rc != TR_OK && !l->failed) {
            l->failed = 1;
            l->error = err;
        }
        s->ready = 1;
        pthread_cond_broadcast(&l->changed);
    }
    l->running--;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

struct tr_loader *tr_loader_open(const struct tr_data_source *src,
                                 const struct tr_loader_config *cfg, uint64_t start, tr_err *err)
{
    uint64_t step = !cfg->shuffle && cfg->step > 1 ? cfg->step : 1;
    /* samples 0, step, ... below the count: as many as the aligned windows */
    uint64_t n = src->info.samples[cfg->split] / step + (src->info.samples[cfg->split] % step != 0);
    if (n < (uint64_t)cfg->batch) {
        tr_fail(err, "data source '%s' has %llu %s samples%s, fewer than one micro-batch of %d",
                src->name, (unsigned long long)n, cfg->split == TR_SPLIT_TRAIN ? "training" : "validation",
                step > 1 ? " that do not overlap" : "", cfg->batch);
        return NULL;
    }
    /* micro-batch numbers must not wrap (a damaged resume position): the
     * slots' bookkeeping would then wait for a batch no worker fills */
    uint64_t stride = cfg->stride > 1 ? (uint64_t)cfg->stride : 1;
    if (start > (UINT64_MAX / 2 - (uint64_t)(cfg->prefetch > 1 ? cfg->prefetch : 1)) / stride) {
        tr_fail(err, "data position %llu is out of range (a damaged checkpoint state?)",
                (unsigned long long)start);
        return NULL;
    }
    struct tr_loader *l = tr_xcalloc(1, sizeof *l);
    l->src = *src;
    l->cfg = *cfg;
    if (l->cfg.prefetch < 1)
        l->cfg.prefetch = 1;
    size_t elem = src->info.input_dtype == TR_I32 || src->info.input_dtype == TR_F32 ? 4 : 2;
    l->input_bytes = (size_t)cfg->batch * src->info.input_len * elem;
    l->target_count = (size_t)cfg->batch * src->info.target_len;
    l->n = n;
    l->step = step;
    l->per_epoch = n / (uint64_t)cfg->batch;
    l->next = l->next_fill = start;
    int nslots = cfg->workers > 0 ? l->cfg.prefetch : 1;
    l->slots = tr_xcalloc((size_t)nslots, sizeof *l->slots);
    for (int i = 0; i < nslots; i++) {
        l->slots[i].id = UINT64_MAX;
        l->slots[i].inputs = tr_alloc(l->input_bytes);
        l->slots[i].targets = tr_alloc(l->target_count * sizeof(int32_t));
        l->slots[i].indices = tr_xcalloc((size_t)cfg->batch, sizeof(uint64_t));
        if (!l->slots[i].inputs || !l->slots[i].targets) {
            tr_fail(err, "out of memory for the loader's prefetch buffers");
            tr_loader_close(l);
            return NULL;
        }
    }
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->changed, NULL);
    if (cfg->workers > 0) {
        l->threads = tr_xcalloc((size_t)cfg->workers, sizeof *l->threads);
        for (int i = 0; i < cfg->workers; i++) {
            pthread_mutex_lock(&l->lock);
            l->running++;
            pthread_mutex_unlock(&l->lock);
            if (pthread_create(&l->threads[i], NULL, worker, l) != 0) {
                pthread_mutex_lock(&l->lock);
                l->running--;
                pthread_mutex_unlock(&l->lock);
                tr_fail(err, "cannot start data loader thread %d", i);
                tr_loader_close(l);
                return NULL;
            }
            l->n_threads++;
        }
    }
    return l;
}

void tr_loader_close(struct tr_loader *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    l->stop = 1;
    pthread_cond_broadcast(&l->changed);
    /* A worker blocked in a read that never returns (a hung filesystem)
     * would block the join for good.  Once cancelled (or once a read
     * failed: the run is ending with an error), wait a grace period, then
     * leave such workers behind: detached, and the loader not freed, so
     * they touch no freed memory if the read ever returns.  A signal that
     * comes during the wait starts the grace period too. */
    double give_up = 0;
    while (l->running > 0) {
        int hurry = l->failed || (l->cfg.cancel && *l->cfg.cancel);
        if (hurry && give_up == 0)
            give_up = tr_now() + STUCK_GRACE_SECONDS;
        if (hurry && tr_now() >= give_up)
            break;
        if (l->cfg.cancel || l->failed)
            wait_a_moment(l);
        else
            pthread_cond_wait(&l->changed, &l->lock);
    }
    int stuck = l->running > 0;
    pthread_mutex_unlock(&l->lock);
    if (stuck) {
        for (int i = 0; i < l->n_threads; i++)
            pthread_detach(l->threads[i]);
        tr_log(TR_LOG_WARN, "loader", "a data loader worker is stuck in a read of '%s'; "
               "leaving it behind", l->src.name ? l->src.name : "data");
        return;
    }
    for (int i = 0; i < l->n_threads; i++)
        pthread_join(l->threads[i], NULL);
    int nslots = l->cfg.workers > 0 ? l->cfg.prefetch : 1;
    for (int i = 0; l->slots && i < nslots; i++) {
        tr_free(l->slots[i].inputs);
        tr_free(l->slots[i].targets);
        free(l->slots[i].indices);
    }
    free(l->slots);
    free(l->threads);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->changed);
    free(l);
}

int tr_loader_next(struct tr_loader *l, void *inputs, int32_t *targets, double *wait_seconds,
                   tr_err *err)
{
    if (l->cfg.workers <= 0) {
        double t0 = tr_now();
        int rc = fill(l, l->next, inputs, targets, l->slots[0].indices, err);
        if (wait_seconds)
            *wait_seconds += tr_now() - t0;
        if (rc == TR_OK)
            l->next++;
        return rc;
    }
    struct slot *s = &l->slots[l->next % (uint64_t)l->cfg.prefetch];
    double t0 = tr_now();
    pthread_mutex_lock(&l->lock);
    while (!(s->id == l->next && s->ready) && !l->failed) {
        if (wait_changed(l)) {
            l->cancelled = 1;
            pthread_mutex_unlock(&l->lock);
            return tr_fail(err, "interrupted by a signal while waiting for data from '%s'",
                           l->src.name ? l->src.name : "data");
        }
    }
    if (l->failed) {
        *err = l->error;
        pthread_mutex_unlock(&l->lock);
        return TR_ERROR;
    }
    pthread_mutex_unlock(&l->lock);
    if (wait_seconds)
        *wait_seconds += tr_now() - t0;
    memcpy(inputs, s->inputs, l->input_bytes);
    memcpy(targets, s->targets, l->target_count * sizeof(int32_t));
    pthread_mutex_lock(&l->lock);
    s->id = UINT64_MAX;
    l->next++;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    return TR_OK;
}

uint64_t tr_loader_position(const struct tr_loader *l) { return l->next; }
int tr_loader_cancelled(const struct tr_loader *l) { return l->cancelled; }
uint64_t tr_loader_batches_per_epoch(const struct tr_loader *l) { return l->per_epoch; }
