/*
 * How the tests compare a computed tensor with a reference (PyTorch's, or
 * the other backend's).
 */
#ifndef TR_TESTS_COMPARE_H
#define TR_TESTS_COMPARE_H

#include <math.h>
#include <stddef.h>

/* max |got - want| / max |want|: robust where single elements are tiny */
static inline double tensor_error(const float *got, const float *want, size_t n)
{
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)got[i] - (double)want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    return diff / scale;
}

#endif
