/*
 * Optimizer updates and the squared norm used for gradient clipping.
 */
#include <math.h>

#include "kernels.h"

void tr_cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int64_t t)
{
    /* bias corrections in double: beta2^t is close to 1 for small t */
    float correction1 = (float)(1.0 - pow((double)beta1, (double)t));
    float correction2 = (float)(1.0 - pow((double)beta2, (double)t));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float m_new = beta1 * m[i] + (1.0f - beta1) * g;
        float v_new = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = m_new;
        v[i] = v_new;
        float m_hat = m_new / correction1;
        float v_hat = v_new / correction2;
        float p = param[i];
        param[i] = p - lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * p);
    }
}

/* momentum_buf may be NULL when momentum == 0 (plain SGD). */
void tr_cpu_sgd_update(float *param, const float *grad, float *momentum_buf, size_t n, float lr,
                       float momentum, float weight_decay, float grad_scale)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float p = param[i];
        float g = grad[i] * grad_scale + weight_decay * p;
        if (momentum_buf != NULL) {
            /* the buffer starts at zero, so the first step stores g itself */
            float buf = momentum * momentum_buf[i] + g;
            momentum_buf[i] = buf;
            g = buf;
        }
        param[i] = p - lr * g;
    }
}

enum {
    SUM_CHUNK_MIN = 1 << 14, /* below this a chunk is not worth a thread */
    SUM_MAX_CHUNKS = 256,
    SUM_LANES = 8, /* independent partial sums in a chunk, so the loop vectorises */
};

/* Sum of squares of x[0..n), in a fixed order. */
static double chunk_sum_squares(const float *x, size_t n)
{
    double lane[SUM_LANES] = {0};
    size_t i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int j = 0; j < SUM_LANES; j++)
            lane[j] += (double)x[i + j] * x[i + j];
    double sum = 0.0;
    for (; i < n; i++)
        sum += (double)x[i] * x[i];
    for (int j = 0; j < SUM_LANES; j++)
        sum += lane[j];
    return sum;
}

double tr_cpu_sum_squares(const float *x, size_t n)
{
    /* The split into chunks depends on n only, and the chunk sums are added
     * in order, so the result does not depend on the thread count.  Squares of
     * floats cannot overflow a double; inf or NaN inputs propagate. */
    size_t chunks = (n + SUM_CHUNK_MIN - 1) / SUM_CHUNK_MIN;
    if (chunks > SUM_MAX_CHUNKS)
        chunks = SUM_MAX_CHUNKS;
    if (chunks <= 1)
        return chunk_sum_squares(x, n);
    size_t chunk = (n + chunks - 1) / chunks;
    double partial[SUM_MAX_CHUNKS];
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * chunk;
        size_t end = begin + chunk < n ? begin + chunk : n;
        partial[c] = begin < end ? chunk_sum_squares(x + begin, end - begin) : 0.0;
    }
    double sum = 0.0;
    for (size_t c = 0; c < chunks; c++)
        sum += partial[c];
    return sum;
}
