/*
 * Elementwise ops: add, GELU (tanh form), ReLU.
 */
#include <math.h>

#include "kernels.h"

void tr_cpu_add_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* da and db may be the same buffer (x + x): both updates then land in it. */
void tr_cpu_add_backward(float *da, float *db, const float *dout, size_t n)
{
    if (da != NULL) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            da[i] += dout[i];
    }
    if (db != NULL) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            db[i] += dout[i];
    }
}

/* sqrt(2/pi) */
#define GELU_SCALE 0.7978845608028654f
#define GELU_CUBIC 0.044715f

void tr_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(inner));
    }
}

void tr_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    if (dinp == NULL)
        return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        float th = tanhf(inner);
        float sech2 = 1.0f - th * th;
        /* d/dx of 0.5 x (1 + tanh(inner)) */
        float local = 0.5f * (1.0f + th) +
                      0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
        dinp[i] += local * dout[i];
    }
}

void tr_cpu_relu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void tr_cpu_relu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    if (dinp == NULL)
        return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}
