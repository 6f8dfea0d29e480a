/*
 * Batch normalisation over the rows of x[N,C] (every dimension but the
 * channels, which are last: N = B*H*W for images), per channel.
 *
 * Written by hand: it is two or three passes over memory with a short loop
 * over contiguous channels, and the statistics must not depend on the thread
 * count.  The rows are cut into chunks whose size depends on N only; each
 * chunk's per-channel sums (in double: the variance comes from E[x^2] -
 * mean^2 in one pass, which double keeps exact enough for fp32 data) go to
 * scratch, and the chunks are added in order.  Which thread ran a chunk
 * never changes a bit.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

enum { BN_MAX_CHUNKS = 64, BN_MIN_ROWS = 32 };

static int chunk_rows(int N)
{
    int rows = (N + BN_MAX_CHUNKS - 1) / BN_MAX_CHUNKS;
    return rows < BN_MIN_ROWS ? BN_MIN_ROWS : rows;
}

static int chunks(int N) { return N <= 0 ? 0 : (N + chunk_rows(N) - 1) / chunk_rows(N); }

/* scratch: two double partial sums per chunk and channel, their totals,
 * then three float coefficients per channel */
struct bn_scratch {
    double *part, *tot;
    float *coef;
};

static struct bn_scratch bn_scratch(float *scratch, int N, int C)
{
    struct bn_scratch s;
    s.part = (double *)(void *)scratch;
    s.tot = s.part + (size_t)chunks(N) * 2 * C;
    s.coef = (float *)(void *)(s.tot + 2 * (size_t)C);
    return s;
}

size_t tr_cpu_batchnorm_scratch_floats(int N, int C)
{
    return ((size_t)chunks(N) * 2 * C + 2 * (size_t)C) * (sizeof(double) / sizeof(float)) +
           3 * (size_t)C;
}

/* s1 = sum of a, s2 = sum of a*b per channel, ordered over chunks (b may
 * be NULL: s2 = sum of a*a; with `center`, b - center[c] replaces b). */
static void channel_sums(double *s1, double *s2, double *part, const float *a, const float *b,
                         const float *center, int N, int C)
{
    int rows = chunk_rows(N), n_chunks = chunks(N);
#pragma omp parallel for schedule(static)
    for (int k = 0; k < n_chunks; k++) {
        double *p1 = part + (size_t)k * 2 * C, *p2 = p1 + C;
        for (int c = 0; c < C; c++)
            p1[c] = p2[c] = 0.0;
        int end = (k + 1) * rows < N ? (k + 1) * rows : N;
        for (int i = k * rows; i < end; i++) {
            const float *ar = a + (size_t)i * C;
            const float *br = b ? b + (size_t)i * C : ar;
            if (center)
                for (int c = 0; c < C; c++) {
                    p1[c] += ar[c];
                    p2[c] += (double)ar[c] * (double)(br[c] - center[c]);
                }
            else
                for (int c = 0; c < C; c++) {
                    p1[c] += ar[c];
                    p2[c] += (double)ar[c] * br[c];
                }
        }
    }
    for (int c = 0; c < C; c++)
        s1[c] = s2[c] = 0.0;
    for (int k = 0; k < n_chunks; k++) {
        const double *p1 = part + (size_t)k * 2 * C, *p2 = p1 + C;
        for (int c = 0; c < C; c++) {
            s1[c] += p1[c];
            s2[c] += p2[c];
        }
    }
}

/* out = (x - mean) * rstd * w + b, as (x - mean) * scale + b */
static void normalise(float *out, const float *x, const float *mean, const float *scale,
                      const float *b, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *xr = x + (size_t)i * C;
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++)
            o[c] = (xr[c] - mean[c]) * scale[c] + b[c];
    }
}

void tr_cpu_batchnorm_forward_train(float *out, float *mean, float *rstd, float *running,
                                    float *scratch, const float *x, const float *w, const float *b,
                                    int N, int C, float eps, float momentum)
{
    if (N <= 0 || C <= 0)
        return;
    struct bn_scratch sc = bn_scratch(scratch, N, C);
    double *tot1 = sc.tot, *tot2 = sc.tot + C;
    float *scale = sc.coef;
    channel_sums(tot1, tot2, sc.part, x, NULL, NULL, N, C);
    for (int c = 0; c < C; c++) {
        double m = tot1[c] / N;
        double var = tot2[c] / N - m * m;
        if (var < 0.0)
            var = 0.0;
        mean[c] = (float)m;
        rstd[c] = (float)(1.0 / sqrt(var + (double)eps));
        scale[c] = rstd[c] * w[c];
        if (running) { /* [mean | unbiased variance] */
            double unbiased = N > 1 ? var * N / (N - 1) : var;
            running[c] = (float)((1.0 - momentum) * running[c] + momentum * m);
            running[C + c] = (float)((1.0 - momentum) * running[C + c] + momentum * unbiased);
        }
    }
    normalise(out, x, mean, scale, b, N, C);
}

void tr_cpu_batchnorm_forward_eval(float *out, float *mean, float *rstd, float *scratch,
                                   const float *x, const float *w, const float *b,
                                   const float *running, int N, int C, float eps)
{
    float *scale = scratch;
    for (int c = 0; c < C; c++) {
        mean[c] = running[c];
        rstd[c] = (float)(1.0 / sqrt((double)running[C + c] + (double)eps));
        scale[c] = rstd[c] * w[c];
    }
    normalise(out, x, mean, scale, b, N, C);
}

void tr_cpu_batchnorm_backward(float *dx, float *dw, float *db, float *scratch, const float *dout,
                               const float *x, const float *w, const float *mean, const float *rstd,
                               int N, int C, int training)
{
    if (N <= 0 || C <= 0)
        return;
    struct bn_scratch sc = bn_scratch(scratch, N, C);
    double *sdy = sc.tot, *sdyx = sc.tot + C;
    /* sum dy and sum dy (x - mean) per channel */
    channel_sums(sdy, sdyx, sc.part, dout, x, mean, N, C);
    float *a = sc.coef, *bb = sc.coef + C, *cc = sc.coef + 2 * C;
    for (int c = 0; c < C; c++) {
        if (db)
            db[c] += (float)sdy[c];
        if (dw)
            dw[c] += (float)(sdyx[c] * rstd[c]);
        /* training: the batch statistics depend on x too,
         * dx = w rstd (dy - mean(dy) - xhat mean(dy xhat)); eval: w rstd dy */
        double k = (double)w[c] * rstd[c];
        a[c] = (float)k;
        bb[c] = training ? (float)(k * sdy[c] / N) : 0.0f;
        cc[c] = training ? (float)(k * rstd[c] * rstd[c] * sdyx[c] / N) : 0.0f;
    }
    if (!dx)
        return;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *d = dout + (size_t)i * C, *xr = x + (size_t)i * C;
        float *g = dx + (size_t)i * C;
        for (int c = 0; c < C; c++)
            g[c] += a[c] * d[c] - bb[c] - cc[c] * (xr[c] - mean[c]);
    }
}
