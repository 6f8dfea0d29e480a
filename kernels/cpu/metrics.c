/* Evaluation metrics computed from logits. */
#include "kernels.h"

int64_t tr_cpu_count_correct(const float *logits, const int32_t *targets, int N, int V,
                             int ignore_index, int64_t *n_valid)
{
    int64_t correct = 0, valid = 0;
#pragma omp parallel for reduction(+ : correct, valid) schedule(static)
    for (int n = 0; n < N; n++) {
        if (targets[n] == ignore_index)
            continue;
        const float *row = logits + (size_t)n * (size_t)V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best])
                best = v;
        valid++;
        correct += best == targets[n];
    }
    *n_valid = valid;
    return correct;
}
