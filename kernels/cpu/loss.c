/*
 * Softmax cross-entropy (fused, no probabilities stored) and a sampling
 * softmax with temperature.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

/* Rows are exponentiated a chunk at a time into a buffer on the stack,
 * through the vectorised tr_cpu_exp_shifted (GELU's polynomial, about 1 ulp):
 * libm's expf per element was most of the loss's time at GPT-2's 50257
 * classes (26 M exponentials a step at batch 4, ctx 64). */
enum { CE_CHUNK = 1024 };

/* log(sum(exp(x))) of one row, shifted by its max for range safety; the
 * chunks' sums are added in double, in order. */
static float row_logsumexp(const float *x, int V)
{
    /* the maximum in lanes (a serial compare chain was most of the forward
     * pass); which of equal maxima wins does not change the value */
    float max = x[0];
#pragma omp simd reduction(max : max)
    for (int i = 1; i < V; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    float buf[CE_CHUNK];
    for (int i0 = 0; i0 < V; i0 += CE_CHUNK) {
        int len = V - i0 < CE_CHUNK ? V - i0 : CE_CHUNK;
        for (int i = 0; i < len; i++)
            buf[i] = x[i0 + i];
        sum += tr_cpu_exp_shifted(buf, len, max);
    }
    return max + (float)log(sum);
}

int tr_cpu_cross_entropy_forward(float *loss, float *lse, const float *logits,
                                 const int32_t *targets, int N, int V, int ignore_index)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        lse[n] = targets[n] == ignore_index ? 0.0f : row_logsumexp(logits + (size_t)n * V, V);

    /* the mean is a serial sum over rows: cheap, and in a fixed order */
    double total = 0.0;
    int n_valid = 0;
    for (int n = 0; n < N; n++) {
        if (targets[n] == ignore_index)
            continue;
        total += (double)lse[n] - logits[(size_t)n * V + targets[n]];
        n_valid++;
    }
    *loss = n_valid > 0 ? (float)(total / n_valid) : 0.0f;
    return n_valid;
}

void tr_cpu_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                   const int32_t *targets, float dloss, int N, int V,
                                   int ignore_index, int write)
{
    if (dlogits == NULL)
        return;
    int n_valid = 0;
    for (int n = 0; n < N; n++)
        n_valid += targets[n] != ignore_index;
    float row_scale = n_valid > 0 ? dloss / (float)n_valid : 0.0f;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        if (targets[n] == ignore_index) {
            if (write) /* a row that does not count: no gradient */
                memset(dlogits + (size_t)n * V, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float *x = logits + (size_t)n * V;
        float *dx = dlogits + (size_t)n * V;
        float row_lse = lse[n];
        int target = targets[n];
        float prob[CE_CHUNK];
        for (int i0 = 0; i0 < V; i0 += CE_CHUNK) {
            int len = V - i0 < CE_CHUNK ? V - i0 : CE_CHUNK;
            for (int i = 0; i < len; i++)
                prob[i] = x[i0 + i];
            tr_cpu_exp_shifted(prob, len, row_lse);
            for (int i = 0; i < len; i++) {
                float indicator = i0 + i == target ? 1.0f : 0.0f;
                float d = row_scale * (prob[i] - indicator);
                dx[i0 + i] = write ? d : dx[i0 + i] + d;
            }
        }
    }
}

/* temperature <= 0 means greedy: all mass on the first maximum. */
void tr_cpu_softmax(float *out, const float *logits, int n, float temperature)
{
    if (n <= 0)
        return;
    int argmax = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[argmax])
            argmax = i;
    if (!(temperature > 0.0f)) {
        for (int i = 0; i < n; i++)
            out[i] = i == argmax ? 1.0f : 0.0f;
        return;
    }
    float inv_temperature = 1.0f / temperature;
    float max = logits[argmax] * inv_temperature;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        out[i] = expf(logits[i] * inv_temperature - max);
        sum += out[i];
    }
    float inv_sum = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        out[i] *= inv_sum;
}
