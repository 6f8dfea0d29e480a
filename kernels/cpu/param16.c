/*
 * bf16 copies of the parameters, for the native bf16 GEMMs.
 *
 * A linear node's weight is a GEMM input like any other, and the native bf16
 * path converted it to bf16 into scratch on every call: forward and backward
 * of every micro-batch, for weights that change only when the optimizer runs.
 * Here each flat parameter buffer (tr_graph.params) gets one bf16 mirror,
 * made on first use, that the GEMMs read directly; AdamW writes it in the same
 * pass that updates the fp32 parameters (tr_cpu_adamw_update_bf16), so a step
 * converts no weight at all.  The mirror costs 2 bytes a parameter.
 *
 * Keeping the mirror equal to the fp32 parameters: the backend reports every
 * write it makes or is asked to make into backend memory (upload, zero, copy,
 * the optimizers) through tr_cpu_param16_written and tr_cpu_param16_updated.
 * One more writer exists: data parallelism with a sharded optimizer updates
 * only this rank's shard and gathers the others' straight into the buffer.
 * So the optimizer's calls are tracked as a burst: the first GEMM after one
 * converts every part of the buffer the burst did not refresh (nothing,
 * unless the optimizer was sharded).  Any other write marks the whole
 * mirror stale; the next GEMM converts it again.
 *
 * Values are those of tr_cpu_to_bf16 on the fp32 parameters, as the
 * per-call conversion made them, so results are unchanged, bit for bit, and
 * do not depend on the thread count.  Mirrors are kept in a short table
 * behind a mutex (each graph, e.g. every data-parallel rank's, has its own
 * buffer); a mirror lives until its buffer is freed (tr_cpu_param16_forget).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

enum {
    PARAM16_MIRRORS = 16, /* buffers mirrored at once; more just go unmirrored */
    PARAM16_RUNS = 32,    /* refreshed runs a burst remembers; more: convert all */
};

struct run {
    size_t begin, end; /* floats from the buffer's start */
};

struct mirror {
    const float *base; /* the flat fp32 parameter buffer */
    size_t n;
    uint16_t *bf16;
    int stale;         /* convert all of it before the next read */
    int burst;         /* optimizer calls since the last read */
    int n_runs;        /* their runs; PARAM16_RUNS + 1: too many to list */
    struct run runs[PARAM16_RUNS];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct mirror mirrors[PARAM16_MIRRORS];

/* The mirror whose buffer holds [p, p + bytes), or NULL; with lock held. */
static struct mirror *find(const void *p, size_t bytes)
{
    const char *c = p;
    for (int i = 0; i < PARAM16_MIRRORS; i++) {
        struct mirror *m = &mirrors[i];
        const char *b = (const char *)m->base;
        if (m->bf16 != NULL && c >= b && c + bytes <= b + m->n * sizeof(float))
            return m;
    }
    return NULL;
}

static int by_begin(const void *a, const void *b)
{
    const struct run *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Converts [at, end) of the buffer but for what the core discarded
 * (tr_cpu_discarded_within): a pipeline stage's other stages' parameters
 * are neither read (their pages were given back) nor mirrored. */
static void convert_present(struct mirror *m, size_t at, size_t end)
{
    while (at < end) {
        size_t from, to;
        if (!tr_cpu_discarded_within(m->base + at, (end - at) * sizeof(float), &from, &to))
            from = to = (end - at) * sizeof(float);
        /* runs are whole floats (a float only partly discarded is skipped) */
        size_t head = from / sizeof(float), skip = (to + sizeof(float) - 1) / sizeof(float);
        if (head > 0)
            tr_cpu_to_bf16(m->bf16 + at, m->base + at, head);
        at += skip > head ? skip : head;
    }
}

/* Bring the mirror up to date before a read; with lock held. */
static void refresh(struct mirror *m)
{
    if (m->burst && !m->stale) {
        m->burst = 0;
        if (m->n_runs > PARAM16_RUNS) {
            m->stale = 1;
        } else {
            /* convert what the optimizer's burst did not write */
            qsort(m->runs, (size_t)m->n_runs, sizeof m->runs[0], by_begin);
            size_t at = 0;
            for (int i = 0; i < m->n_runs; i++) {
                if (m->runs[i].begin > at)
                    convert_present(m, at, m->runs[i].begin);
                if (m->runs[i].end > at)
                    at = m->runs[i].end;
            }
            if (at < m->n)
                convert_present(m, at, m->n);
        }
        m->n_runs = 0;
    }
    if (m->stale) {
        convert_present(m, 0, m->n);
        m->stale = 0;
        m->burst = 0;
        m->n_runs = 0;
    }
}

/* whole 64-byte lines, so the bf16 rows the GEMMs read start aligned when
 * their fp32 rows do */
size_t tr_cpu_param16_bytes(size_t n_params)
{
    return (n_params * sizeof(uint16_t) + 63) & ~(size_t)63;
}

const uint16_t *tr_cpu_param16(const struct tr_graph *g, const struct tr_tensor *t)
{
    /* sharded parameters gathered in bf16: the core's copy (backend.h) */
    if (g->params16 != NULL && t->role == TR_ROLE_PARAM && t->dtype == TR_F32 &&
        g->compute == TR_BF16)
        return (const uint16_t *)g->params16 + t->offset;
    if (t->role != TR_ROLE_PARAM || t->dtype != TR_F32 || g->params == NULL || g->params_sharded ||
        g->n_params == 0 || (const float *)t->data < g->params ||
        (const float *)t->data + t->numel > g->params + g->n_params)
        return NULL;
    pthread_mutex_lock(&lock);
    struct mirror *m = find(g->params, g->n_params * sizeof(float));
    if (m != NULL && (m->base != g->params || m->n != g->n_params))
        m = NULL; /* another graph's buffer around this one: not ours to mirror */
    else if (m == NULL) {
        for (int i = 0; i < PARAM16_MIRRORS && m == NULL; i++)
            if (mirrors[i].bf16 == NULL)
                m = &mirrors[i];
        if (m != NULL) {
            size_t bytes = tr_cpu_param16_bytes(g->n_params);
            void *p = NULL;
            if (posix_memalign(&p, 64, bytes) != 0) {
                m = NULL; /* out of memory: the caller converts per call, as before */
            } else {
                memset(m, 0, sizeof *m);
                m->base = g->params;
                m->n = g->n_params;
                m->bf16 = p;
                m->stale = 1;
            }
        }
    }
    const uint16_t *out = NULL;
    if (m != NULL) {
        refresh(m);
        out = m->bf16 + ((const float *)t->data - m->base);
    }
    pthread_mutex_unlock(&lock);
    return out;
}

uint16_t *tr_cpu_param16_updated(const float *p, size_t n)
{
    pthread_mutex_lock(&lock);
    struct mirror *m = find(p, n * sizeof(float));
    uint16_t *out = NULL;
    if (m != NULL) {
        size_t begin = (size_t)(p - m->base);
        m->burst = 1;
        if (m->n_runs < PARAM16_RUNS)
            m->runs[m->n_runs++] = (struct run){begin, begin + n};
        else
            m->n_runs = PARAM16_RUNS + 1;
        out = m->bf16 + begin;
    }
    pthread_mutex_unlock(&lock);
    return out;
}

void tr_cpu_param16_written(const void *p, size_t bytes)
{
    const char *c = p;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < PARAM16_MIRRORS; i++) {
        struct mirror *m = &mirrors[i];
        const char *b = (const char *)m->base;
        if (m->bf16 != NULL && c < b + m->n * sizeof(float) && c + bytes > b)
            m->stale = 1;
    }
    pthread_mutex_unlock(&lock);
}

void tr_cpu_param16_forget(const void *p)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < PARAM16_MIRRORS; i++) {
        struct mirror *m = &mirrors[i];
        if (m->bf16 != NULL && (const void *)m->base == p) {
            free(m->bf16);
            memset(m, 0, sizeof *m);
        }
    }
    pthread_mutex_unlock(&lock);
}
