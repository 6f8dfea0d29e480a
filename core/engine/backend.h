/* Choosing the device backend at run time: "cpu" is built in, any other is
 * a loadable module (see kernels/backend.h).  The core reaches every backend
 * through this, never through a backend's own functions. */
#ifndef TR_CORE_BACKEND_H
#define TR_CORE_BACKEND_H

#include "../../kernels/backend.h"
#include "../config/plugin.h"

/* Open backend `device` ("cpu", "cuda", ...): a built-in one, or
 * backend_<device>.so from TRAINRUN_BACKEND_PATH then `search` (NULL: the
 * built-in backends only). */
int tr_backend_open(struct tr_backend *be, const char *device, int threads,
                    const struct tr_plugin_path *search, tr_err *err);
void tr_backend_close(struct tr_backend *be);

/* Load backend module `path` and check it is one of this ABI; on failure
 * NULL, with why[0..why_size) saying so.  *handle is the dlopen handle. */
const struct tr_backend_module *tr_backend_module_load(const char *path, void **handle, char *why,
                                                       size_t why_size);

/* ---- calls into a backend: the one choke point ----------------------------
 *
 * The core calls a backend only through these wrappers (as SQLite's os.c is
 * the one way to its VFS): each optional slot is checked here, and its
 * default lives here, so a slot appended to struct tr_backend_iface is
 * handled in one place.  Required slots are called as they are. */

static inline void *tr_be_alloc(const struct tr_backend *be, size_t bytes)
{
    return be->iface->alloc(be->context, bytes);
}
/* NULL-safe, like free(3) */
static inline void tr_be_free(const struct tr_backend *be, void *p)
{
    if (p)
        be->iface->free(be->context, p);
}
/* optional (ABI 11): memory the core may have discarded made usable again
 * before it is touched (kernels/backend.h).  The wrappers below that write
 * or read backend memory commit it first, so the core's own accesses need
 * no more; what a node or a comm plugin touches is committed where it is
 * ordered (graph_exec.c's backward for parameter gradients, gather.c for
 * the gathers).  Without the slot discarded memory reads as zeros. */
static inline void tr_be_commit(const struct tr_backend *be, const void *p, size_t bytes)
{
    if (bytes && TR_HAS_SLOT(be->iface, struct tr_backend_iface, commit) && be->iface->commit)
        be->iface->commit(be->context, (void *)(uintptr_t)p, bytes);
}
static inline void tr_be_zero(const struct tr_backend *be, void *p, size_t bytes)
{
    tr_be_commit(be, p, bytes);
    be->iface->zero(be->context, p, bytes);
}
static inline void tr_be_upload(const struct tr_backend *be, void *dst, const void *src, size_t bytes)
{
    tr_be_commit(be, dst, bytes);
    be->iface->upload(be->context, dst, src, bytes);
}
static inline void tr_be_download(const struct tr_backend *be, void *dst, const void *src,
                                  size_t bytes)
{
    tr_be_commit(be, src, bytes);
    be->iface->download(be->context, dst, src, bytes);
}
/* optional: a node needs no scratch when the backend does not say */
static inline size_t tr_be_scratch_floats(const struct tr_backend *be, const struct tr_graph *g,
                                          const struct tr_node *n)
{
    return be->iface->scratch_floats ? be->iface->scratch_floats(be->context, g, n) : 0;
}
static inline void tr_be_forward(const struct tr_backend *be, struct tr_graph *g,
                                 const struct tr_node *n)
{
    be->iface->forward(be->context, g, n);
}
static inline void tr_be_backward(const struct tr_backend *be, struct tr_graph *g,
                                  const struct tr_node *n)
{
    be->iface->backward(be->context, g, n);
}
static inline double tr_be_sum_squares(const struct tr_backend *be, const float *x, size_t n)
{
    return be->iface->sum_squares(be->context, x, n);
}
static inline void tr_be_adamw(const struct tr_backend *be, float *param, const float *grad,
                               float *m, float *v, size_t n, const struct tr_adamw_args *a)
{
    be->iface->adamw(be->context, param, grad, m, v, n, a);
}
static inline void tr_be_sgd(const struct tr_backend *be, float *param, const float *grad,
                             float *buf, size_t n, const struct tr_sgd_args *a)
{
    be->iface->sgd(be->context, param, grad, buf, n, a);
}
/* optional; without it the backend runs everything in order: nothing to wait for */
static inline void tr_be_synchronize(const struct tr_backend *be)
{
    if (be->iface->synchronize)
        be->iface->synchronize(be->context);
}
/* optional: whether tr_be_count_correct can count (accuracy is NaN without it) */
static inline int tr_be_counts_correct(const struct tr_backend *be)
{
    return be->iface->count_correct != NULL;
}
static inline int64_t tr_be_count_correct(const struct tr_backend *be, const float *logits,
                                          const int32_t *targets, int N, int V, int ignore_index,
                                          int64_t *n_valid)
{
    return be->iface->count_correct(be->context, logits, targets, N, V, ignore_index, n_valid);
}
/* optional: page-locked host memory; without it, ordinary memory */
void *tr_be_host_alloc(const struct tr_backend *be, size_t bytes);
void tr_be_host_free(const struct tr_backend *be, void *p); /* NULL-safe */
/* optional: the stream every node runs on (NULL: none, the host's order) */
static inline void *tr_be_stream(const struct tr_backend *be)
{
    return TR_HAS_SLOT(be->iface, struct tr_backend_iface, stream) ? be->iface->stream(be->context)
                                                                   : NULL;
}
/* optional: every op runs when the backend does not say */
static inline int tr_be_supports_op(const struct tr_backend *be, const struct tr_graph *g,
                                    const struct tr_node *n)
{
    return TR_HAS_SLOT(be->iface, struct tr_backend_iface, supports_op)
               ? be->iface->supports_op(be->context, g, n)
               : 1;
}
/* optional: no windows of rows when the backend does not say */
static inline int tr_be_supports_rows(const struct tr_backend *be, const struct tr_graph *g,
                                      const struct tr_node *n)
{
    return TR_HAS_SLOT(be->iface, struct tr_backend_iface, supports_rows) &&
           be->iface->supports_rows(be->context, g, n);
}
/* optional: no copies of the parameters when the backend does not say */
static inline size_t tr_be_param_copy_bytes(const struct tr_backend *be, const struct tr_graph *g)
{
    return TR_HAS_SLOT(be->iface, struct tr_backend_iface, param_copy_bytes)
               ? be->iface->param_copy_bytes(be->context, g)
               : 0;
}
/* optional: a backend without the slot never writes a gradient, it adds */
static inline int tr_be_writes_grad(const struct tr_backend *be, const struct tr_graph *g,
                                    const struct tr_node *n, int k)
{
    return TR_HAS_SLOT(be->iface, struct tr_backend_iface, writes_grad)
               ? be->iface->writes_grad(be->context, g, n, k)
               : 0;
}
static inline const char *tr_be_name(const struct tr_backend *be) { return be->iface->name; }
/* optional: whether the backend gives discarded memory back (sharded data
 * parallelism keeps only a rank's shard resident through it) */
static inline int tr_be_can_discard(const struct tr_backend *be)
{
    return TR_HAS_SLOT(be->iface, struct tr_backend_iface, discard) && be->iface->discard;
}
static inline void tr_be_discard(const struct tr_backend *be, void *p, size_t bytes)
{
    if (bytes)
        be->iface->discard(be->context, p, bytes);
}

/* optional (ABI 10): whether the backend converts between fp32 and the
 * 16-bit types in its memory (sharded parameters then travel in 16 bits) */
static inline int tr_be_can_convert(const struct tr_backend *be)
{
    return TR_HAS_SLOT(be->iface, struct tr_backend_iface, convert) && be->iface->convert;
}
static inline void tr_be_convert(const struct tr_backend *be, void *dst, enum tr_dtype to,
                                 const void *src, enum tr_dtype from, size_t n)
{
    if (!n)
        return;
    tr_be_commit(be, src, n * (from == TR_F32 ? 4 : 2));
    tr_be_commit(be, dst, n * (to == TR_F32 ? 4 : 2));
    be->iface->convert(be->context, dst, to, src, from, n);
}

/* optional: whether frozen weights may be stored in 16 or 4 bits; without
 * the slots only fp32 frozen weights (uploaded as parameters are) */
static inline int tr_be_stores_frozen(const struct tr_backend *be)
{
    return TR_HAS_SLOT(be->iface, struct tr_backend_iface, store_frozen) &&
           TR_HAS_SLOT(be->iface, struct tr_backend_iface, load_frozen) &&
           be->iface->store_frozen && be->iface->load_frozen;
}
/* A weight's fp32 host values into its storage: a parameter, buffer or fp32
 * frozen tensor uploaded, a 16-bit or NF4 frozen one through store_frozen
 * (tr_graph_plan has refused those where the backend lacks it). */
int tr_be_store_weight(const struct tr_backend *be, const struct tr_tensor *t, const float *host,
                       tr_err *err);
/* The inverse: t's values as fp32 on the host (NF4 dequantised). */
int tr_be_load_weight(const struct tr_backend *be, const struct tr_tensor *t, float *host,
                      tr_err *err);

#endif
