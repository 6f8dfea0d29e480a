/*
 * What the kernel tests share: a tensor of the backend contract over
 * caller-owned fp32 arrays, for graphs of one node built by hand.
 * Each test program includes this once.
 */
#ifndef TR_TEST_TENSOR_INIT_H
#define TR_TEST_TENSOR_INIT_H

#include <stdint.h>
#include <string.h>

#include "../kernels/backend.h"

static void tensor_init(struct tr_tensor *t, int ndim, const int64_t *shape, float *data,
                        float *grad)
{
    memset(t, 0, sizeof *t);
    t->dtype = TR_F32;
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->numel *= (size_t)shape[d];
    }
    t->data = data;
    t->grad = grad;
    t->producer = -1;
}

#endif
