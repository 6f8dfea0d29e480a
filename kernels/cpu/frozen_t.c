/*
 * Transposed copies of frozen fp32 linear weights, for the forward GEMM.
 *
 * A linear's forward is out = x W^T with W stored [out, in]: B transposed.
 * On AVX-512 tr_cpu_sgemm copies such a B into plain rows first, on every
 * call (gemm.c, copy_b_whole: oneDNN's kernels run B transposed 10-16%
 * slower).  A frozen weight -- an adapter's base -- never changes during
 * training, so here each one gets that copy once, made on first use in the
 * layout tr_cpu_sgemm would make (tr_cpu_sgemm_plain_b_ld), and the forward
 * runs on it directly: the same GEMM calls on the same numbers, so the same
 * bits, for any thread count.  The copy costs 4 bytes a weight (a little
 * more for the padded rows), counted in the memory plan's parameter copies
 * (backend.c, cpu_param_copy_bytes).
 *
 * Keeping a copy equal to its weight: the backend reports every write into
 * its memory (upload, zero, copy) through tr_cpu_frozen_t_written, which
 * marks the copies it overlaps stale, remade before their next read (a
 * frozen base loaded again, e.g. another base for the same graph); and
 * tr_cpu_frozen_t_forget drops the copies of a buffer being freed.  The
 * copies live in a table behind a mutex (every data-parallel rank's graph
 * has its own frozen buffer).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

struct copy {
    const float *w;     /* the weight, [rows, cols] */
    const void *buffer; /* the frozen buffer it lies in (what is freed) */
    int rows, cols, ld;
    float *t;           /* [cols, ld]: t[k * ld + n] = w[n * cols + k] */
    int stale;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct copy *copies;
static int n_copies, cap_copies;

/* The bytes of the copy of a rows x cols weight. */
static size_t copy_bytes(int rows, int cols)
{
    return (size_t)cols * (size_t)tr_cpu_sgemm_plain_b_ld(rows) * sizeof(float);
}

static int in_frozen(const struct tr_graph *g, const struct tr_tensor *t)
{
    const char *p = t->data, *b = g->frozen;
    return b != NULL && p >= b && p + t->numel * sizeof(float) <= b + g->frozen_bytes;
}

/* Whether the forward of a linear node with weight t over M rows reads the
 * copy: a frozen fp32 matrix in g's frozen buffer, and a product that
 * tr_cpu_sgemm would run on plain rows of B. */
static int wanted(const struct tr_graph *g, const struct tr_tensor *t, int M)
{
    return t->role == TR_ROLE_FROZEN && t->dtype == TR_F32 && t->ndim == 2 && in_frozen(g, t) &&
           tr_cpu_sgemm_plain_b(M, (int)t->shape[0], (int)t->shape[1]);
}

/* w^T into c->t, columns split over the threads (each element is a copy:
 * the split changes nothing) */
static void transpose(struct copy *c)
{
    int rows = c->rows, cols = c->cols, ld = c->ld;
    const float *w = c->w;
    float *t = c->t;
#pragma omp parallel for schedule(static)
    for (int n0 = 0; n0 < rows; n0 += 16) {
        int n1 = n0 + 16 < rows ? n0 + 16 : rows;
        for (int k = 0; k < cols; k++)
            for (int n = n0; n < n1; n++)
                t[(size_t)k * ld + n] = w[(size_t)n * cols + k];
    }
}

const float *tr_cpu_frozen_t(const struct tr_graph *g, const struct tr_tensor *t, int M, int *ld)
{
    if (!wanted(g, t, M))
        return NULL;
    const float *w = t->data;
    int rows = (int)t->shape[0], cols = (int)t->shape[1];
    pthread_mutex_lock(&lock);
    struct copy *c = NULL;
    for (int i = 0; i < n_copies && c == NULL; i++)
        if (copies[i].w == w && copies[i].rows == rows && copies[i].cols == cols)
            c = &copies[i];
    if (c == NULL) {
        void *p = NULL;
        if (n_copies == cap_copies) {
            int cap = cap_copies ? 2 * cap_copies : 64;
            struct copy *grown = realloc(copies, (size_t)cap * sizeof *grown);
            if (grown != NULL) {
                copies = grown;
                cap_copies = cap;
            }
        }
        /* out of memory: NULL, and the caller's GEMM transposes per call */
        if (n_copies < cap_copies && posix_memalign(&p, 64, copy_bytes(rows, cols)) == 0) {
            c = &copies[n_copies++];
            *c = (struct copy){w, g->frozen, rows, cols, tr_cpu_sgemm_plain_b_ld(rows), p, 1};
        }
    }
    const float *out = NULL;
    if (c != NULL) {
        if (c->stale) {
            transpose(c);
            c->stale = 0;
        }
        *ld = c->ld;
        out = c->t;
    }
    pthread_mutex_unlock(&lock);
    return out;
}

void tr_cpu_frozen_t_written(const void *p, size_t bytes)
{
    const char *a = p;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_copies; i++) {
        const char *w = (const char *)copies[i].w;
        if (a < w + (size_t)copies[i].rows * copies[i].cols * sizeof(float) && a + bytes > w)
            copies[i].stale = 1;
    }
    pthread_mutex_unlock(&lock);
}

void tr_cpu_frozen_t_forget(const void *p)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_copies;) {
        if (copies[i].buffer == p) {
            free(copies[i].t);
            copies[i] = copies[--n_copies];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&lock);
}

/* Every distinct weight that some linear node's forward would read a copy
 * of, counted once. */
size_t tr_cpu_frozen_t_bytes(const struct tr_graph *g)
{
    size_t total = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        if (n->op != TR_OP_LINEAR || n->n_in < 2)
            continue;
        const struct tr_tensor *x = &g->tensors[n->in[0]], *t = &g->tensors[n->in[1]];
        int M = (int)(x->numel / (size_t)x->shape[x->ndim - 1]);
        if (t->role != TR_ROLE_FROZEN || t->dtype != TR_F32 || t->ndim != 2 ||
            !tr_cpu_sgemm_plain_b(M, (int)t->shape[0], (int)t->shape[1]))
            continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) {
            const struct tr_node *m = &g->nodes[j];
            if (m->op == TR_OP_LINEAR && m->n_in >= 2 && m->in[1] == n->in[1]) {
                const struct tr_tensor *y = &g->tensors[m->in[0]];
                seen = tr_cpu_sgemm_plain_b((int)(y->numel / (size_t)y->shape[y->ndim - 1]),
                                            (int)t->shape[0], (int)t->shape[1]);
            }
        }
        if (!seen)
            total += copy_bytes((int)t->shape[0], (int)t->shape[1]);
    }
    return total;
}
