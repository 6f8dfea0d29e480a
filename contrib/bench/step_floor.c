/*
 * The memory-bound passes of a training step: the work no GEMM speed-up
 * removes.  For P parameters, trainrun's CPU kernels as the engine runs
 * them once a step, each timed alone (best of REPS after one warm-up):
 *
 *   sum of sq.  the gradients' sum of squares, for the global-norm clip
 *               (tr_cpu_sum_squares)
 *   AdamW       the update (tr_cpu_adamw_update): reads parameter, gradient
 *               and both moments, writes three back, 28 bytes a parameter
 *   AdamW bf16  the same, also writing the bf16 copy of the parameters the
 *               native bf16 GEMMs read (tr_cpu_adamw_update_bf16), 30 bytes
 *
 * These passes stream a few bytes per parameter and do a few FLOPs, so they
 * run at memory bandwidth in fp32 and bf16 alike: precision bf16 makes the
 * GEMMs up to the bf16/fp32 ceiling ratio faster (gemm_ceiling) and these
 * not at all.  With F the passes' time and T32 a measured fp32 step, a bf16
 * step can be at most T32 / (F + (T32 - F) / r) times faster, r the ceiling
 * ratio, even if every other op sped up by r (docs/results.md uses this).
 *
 * Build against a build directory's kernels (from the repository root):
 *   cc -O2 -fopenmp -Iinclude -Ikernels/cpu contrib/bench/step_floor.c \
 *      BUILD/.libs/libtrkernels.a -o step_floor -ldnnl -lm
 *   OMP_NUM_THREADS=2 ./step_floor [parameters] [reps]
 * Parameters default to GPT-2 124M's 123,702,528 (trainrun plan's "parameters
 * P" line gives any recipe's).  Prints a table, then one line:
 *   floor <sum of squares ms> <adamw ms> <adamw bf16 ms>
 * (No pass clears the gradients: a step's first backward writes them.)
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == NULL) {
        fprintf(stderr, "step_floor: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

enum { PASS_SUMSQ, PASS_ADAMW, PASS_ADAMW_BF16, PASSES };

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 123702528;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (n == 0 || reps < 1) {
        fprintf(stderr, "usage: step_floor [parameters] [reps]\n");
        return 2;
    }
    float *p = xalloc(n * sizeof(float)), *g = xalloc(n * sizeof(float));
    float *m = xalloc(n * sizeof(float)), *v = xalloc(n * sizeof(float));
    uint16_t *p16 = xalloc(n * sizeof(uint16_t));
    /* every page touched (and the moments non-zero) before any timing */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        p[i] = 0.02f * (float)(i % 97) - 1.0f;
        g[i] = 1e-3f * (float)(i % 13) - 6e-3f;
        m[i] = 1e-4f;
        v[i] = 1e-6f;
        p16[i] = 0;
    }
    static const char *names[PASSES] = {"sum of squares", "AdamW", "AdamW + bf16 copy"};
    static const double bytes_per[PASSES] = {4, 28, 30};
    double best[PASSES];
    volatile double sink = 0;
    for (int k = 0; k < PASSES; k++) {
        best[k] = 1e30;
        for (int r = 0; r <= reps; r++) { /* r == 0: the warm-up */
            double t0 = now();
            switch (k) {
            case PASS_SUMSQ:
                sink += tr_cpu_sum_squares(g, n);
                break;
            case PASS_ADAMW:
                tr_cpu_adamw_update(p, g, m, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, r + 1);
                break;
            default:
                tr_cpu_adamw_update_bf16(p, p16, g, m, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                         1.0f, r + 1);
            }
            double t = now() - t0;
            if (r > 0 && t < best[k])
                best[k] = t;
        }
    }
    (void)sink;
    printf("Memory-bound passes of one step over %zu parameters, %d threads, best of %d\n\n", n,
           omp_get_max_threads(), reps);
    printf("| pass | bytes/param | ms | GB/s |\n|---|---:|---:|---:|\n");
    for (int k = 0; k < PASSES; k++)
        printf("| %s | %.0f | %.1f | %.1f |\n", names[k], bytes_per[k], best[k] * 1e3,
               bytes_per[k] * (double)n / best[k] / 1e9);
    double f32 = best[PASS_SUMSQ] + best[PASS_ADAMW];
    double f16 = best[PASS_SUMSQ] + best[PASS_ADAMW_BF16];
    printf("\nA step's passes: fp32 %.1f ms, bf16 %.1f ms\n", f32 * 1e3, f16 * 1e3);
    printf("floor %.2f %.2f %.2f\n", best[PASS_SUMSQ] * 1e3, best[PASS_ADAMW] * 1e3,
           best[PASS_ADAMW_BF16] * 1e3);
    free(p);
    free(g);
    free(m);
    free(v);
    free(p16);
    return 0;
}
