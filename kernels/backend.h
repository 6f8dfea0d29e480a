/*
 * The device interface the core runs graphs through: a {iface, context}
 * pair.  The CPU backend is linked in (kernels/cpu/backend.c); other
 * backends are loadable modules exporting the same iface, so the core and
 * the Lua layer never change when one is added.  Slots may only be
 * appended; optional ones may be NULL.
 */
#ifndef TR_BACKEND_H
#define TR_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct tr_graph;
struct tr_node;

struct tr_adamw_args {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int64_t t; /* 1-based step for bias correction */
};

struct tr_sgd_args {
    float lr, momentum, weight_decay, grad_scale;
};

struct tr_backend_iface {
    uint32_t struct_size;
    const char *name;
    void *(*alloc)(void *ctx, size_t bytes); /* zeroed; NULL when out of memory */
    void (*free)(void *ctx, void *ptr);
    void (*zero)(void *ctx, void *ptr, size_t bytes);
    void (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*download)(void *ctx, void *dst, const void *src, size_t bytes);
    /* floats of scratch one node needs (forward and backward share it) */
    size_t (*scratch_floats)(void *ctx, const struct tr_graph *g, const struct tr_node *n);
    void (*forward)(void *ctx, struct tr_graph *g, const struct tr_node *n);
    /* accumulates into input gradients (see kernels/cpu/kernels.h) */
    void (*backward)(void *ctx, struct tr_graph *g, const struct tr_node *n);
    double (*sum_squares)(void *ctx, const float *x, size_t n);
    void (*adamw)(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                  const struct tr_adamw_args *a);
    void (*sgd)(void *ctx, float *param, const float *grad, float *buf, size_t n,
                const struct tr_sgd_args *a);
    void (*synchronize)(void *ctx); /* optional */
    /* rows of logits[N,V] whose arg-max is the target (accuracy) */
    int64_t (*count_correct)(void *ctx, const float *logits, const int32_t *targets, int N, int V,
                             int ignore_index, int64_t *n_valid);
    /* Optional (NULL, or absent when struct_size is smaller): page-locked
     * host memory for buffers the host fills and uploads often (the
     * loader's), so copies run at full speed; free with host_free. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* Optional: the stream (cudaStream_t on CUDA) every node runs on, for
     * comm plugins that queue collectives behind the compute. */
    void *(*stream)(void *ctx);
};

struct tr_backend {
    const struct tr_backend_iface *iface;
    void *context;
    const struct tr_backend_module *module; /* NULL for the built-in CPU backend */
};

/* The CPU backend; `threads` 0 means one per core. */
int tr_cpu_backend_init(struct tr_backend *be, int threads);
void tr_cpu_backend_free(struct tr_backend *be);

/* A backend other than the CPU one is a loadable module, backend_<device>.so,
 * found on the plugin search path and exporting TR_BACKEND_ENTRY_NAME, so a
 * trainrun built with a device backend still starts where that device (or
 * its driver) is missing, and says why device=<name> is unavailable. */
#define TR_BACKEND_ABI 1
#define TR_BACKEND_ENTRY_NAME "trainrun_backend_entry"

struct tr_backend_module {
    uint32_t abi;         /* TR_BACKEND_ABI */
    uint32_t struct_size; /* sizeof(struct tr_backend_module) */
    const char *name;     /* "cuda" */
    /* Fill be->iface and be->context; on failure write why into why[0..size). */
    int (*open)(struct tr_backend *be, int threads, char *why, size_t why_size);
    void (*close)(struct tr_backend *be);
    /* Optional: what this machine offers the backend (driver and library
     * versions, each device), one item a line, without opening it and
     * without crashing where there is no device.  0 when buf holds it. */
    int (*describe)(char *buf, size_t size);
};
typedef const struct tr_backend_module *(*tr_backend_entry_fn)(void);

#endif
