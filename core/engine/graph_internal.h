/* What graph.c, graph_plan.c and graph_exec.c share: private to the three. */
#ifndef TR_GRAPH_INTERNAL_H
#define TR_GRAPH_INTERNAL_H

#include "graph.h"
#include "../../kernels/nf4.h"

#include <stddef.h>
#include <stdint.h>

static inline size_t tr_dtype_size(enum tr_dtype t) { return (t == TR_BF16 || t == TR_F16) ? 2 : 4; }

/* A frozen weight's bytes in its storage type (NF4: kernels/nf4.h's blob). */
static inline size_t tr_frozen_bytes(const struct tr_tensor *t)
{
    return t->dtype == TR_NF4 ? tr_nf4_bytes(t->numel) : t->numel * tr_dtype_size(t->dtype);
}

/* a + b, or SIZE_MAX when it does not fit: a plan's sums never wrap. */
static inline size_t tr_sat_add(size_t a, size_t b)
{
    size_t r;
    return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

static inline size_t tr_sat_mul(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

#endif
