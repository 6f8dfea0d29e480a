/*
 * The norms: layernorm and RMSNorm, one warp per row with row sums in
 * double (as kernels/cpu/layernorm.c and rmsnorm.c), and the column sums
 * that turn their per-warp partial weight gradients (and linear's bias
 * gradient, ops.cu) into one, in a fixed order: deterministic whatever the
 * device.
 */
#include "common.cuh"

#include <math.h>

static const unsigned THREADS = 256;

/* ---- layernorm: one warp per row, row sums in double (as the CPU) -------- */

enum { LN_WARPS = 8, LN_PARTIAL_WARPS = 256 };

template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                                         const T *b, int N, int C, float eps)
{
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const T *x = inp + (size_t)row * C;
    double sum = 0.0;
    for (int col = lane; col < C; col += 32)
        sum += to_f32(x[col]);
    sum = warp_sum_double(sum);
    float m = (float)(sum / C);
    double sq = 0.0;
    for (int col = lane; col < C; col += 32) {
        float d = to_f32(x[col]) - m;
        sq += (double)d * d;
    }
    sq = warp_sum_double(sq);
    float s = (float)(1.0 / sqrt(sq / C + eps));
    T *y = out + (size_t)row * C;
    for (int col = lane; col < C; col += 32)
        y[col] = from_f32<T>((to_f32(x[col]) - m) * s * to_f32(w[col]) + to_f32(b[col]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <typename T>
static void layernorm_forward(struct cuda_context *c, void *out, float *mean, float *rstd,
                              const void *inp, const void *w, const void *b, int N, int C, float eps)
{
    unsigned blocks = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    layernorm_forward_kernel<T><<<blocks ? blocks : 1, LN_WARPS * 32, 0, c->compute>>>(
        (T *)out, mean, rstd, (const T *)inp, (const T *)w, (const T *)b, N, C, eps);
    LAUNCHED(c, "layernorm forward");
}

void cuda_layernorm_forward(struct cuda_context *c, int dt, void *out, float *mean, float *rstd,
                            const void *inp, const void *w, const void *b, int N, int C, float eps)
{
    DISPATCH_STORAGE(dt, layernorm_forward, c, out, mean, rstd, inp, w, b, N, C, eps);
}

/* The dw/db column sums go through LN_PARTIAL_WARPS partial rows of scratch:
 * warp k sums rows k, k + W, k + 2W, ... of its columns, then one thread per
 * column adds the partials in warp order. */
static int layernorm_partial_warps(int N)
{
    int w = ((N + LN_WARPS - 1) / LN_WARPS) * LN_WARPS;
    return w < LN_PARTIAL_WARPS ? (w > 0 ? w : LN_WARPS) : LN_PARTIAL_WARPS;
}

size_t cuda_layernorm_scratch_floats(int N, int C)
{
    return 2 * (size_t)layernorm_partial_warps(N) * (size_t)C;
}

template <typename T>
__global__ void layernorm_backward_kernel(float *dinp, float *partial_dw, float *partial_db,
                                          const float *dout, const T *inp, const T *w,
                                          const float *mean, const float *rstd, int N, int C)
{
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    int warps = gridDim.x * LN_WARPS;
    float *pdw = partial_dw ? partial_dw + (size_t)warp * C : NULL;
    float *pdb = partial_db ? partial_db + (size_t)warp * C : NULL;
    for (int col = lane; col < C; col += 32) {
        if (pdw)
            pdw[col] = 0.0f;
        if (pdb)
            pdb[col] = 0.0f;
    }
    for (int row = warp; row < N; row += warps) {
        const T *x = inp + (size_t)row * C;
        const float *dy = dout + (size_t)row * C;
        float m = mean[row], s = rstd[row];
        if (dinp) {
            double g_sum = 0.0, g_xhat_sum = 0.0;
            for (int col = lane; col < C; col += 32) {
                float g = dy[col] * to_f32(w[col]);
                g_sum += g;
                g_xhat_sum += (double)g * ((to_f32(x[col]) - m) * s);
            }
            g_sum = warp_sum_double(g_sum);
            g_xhat_sum = warp_sum_double(g_xhat_sum);
            float g_mean = (float)(g_sum / C);
            float g_xhat_mean = (float)(g_xhat_sum / C);
            float *dx = dinp + (size_t)row * C;
            for (int col = lane; col < C; col += 32) {
                float xhat = (to_f32(x[col]) - m) * s;
                float g = dy[col] * to_f32(w[col]);
                dx[col] += s * (g - g_mean - xhat * g_xhat_mean);
            }
        }
        for (int col = lane; col < C; col += 32) {
            if (pdw)
                pdw[col] += dy[col] * ((to_f32(x[col]) - m) * s);
            if (pdb)
                pdb[col] += dy[col];
        }
    }
}

/* dst[c] += sum over k < parts of partial[k * C + c], in k order */
__global__ void column_sum_kernel(float *dst, const float *partial, int parts, int C)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C)
        return;
    float sum = 0.0f;
    for (int k = 0; k < parts; k++)
        sum += partial[(size_t)k * C + col];
    dst[col] += sum;
}

void cuda_column_sum(struct cuda_context *c, float *dst, const float *partial, int parts, int C)
{
    column_sum_kernel<<<(unsigned)((C + THREADS - 1) / THREADS), THREADS, 0, c->compute>>>(
        dst, partial, parts, C);
}

template <typename T>
static void layernorm_backward(struct cuda_context *c, float *dinp, float *dw, float *db,
                               const float *dout, const void *inp, const void *w, const float *mean,
                               const float *rstd, int N, int C, float *scratch)
{
    int warps = layernorm_partial_warps(N);
    float *pdw = dw ? scratch : NULL;
    float *pdb = db ? scratch + (size_t)warps * C : NULL;
    layernorm_backward_kernel<T><<<warps / LN_WARPS, LN_WARPS * 32, 0, c->compute>>>(
        dinp, pdw, pdb, dout, (const T *)inp, (const T *)w, mean, rstd, N, C);
    LAUNCHED(c, "layernorm backward");
    if (dw) {
        cuda_column_sum(c, dw, pdw, warps, C);
        LAUNCHED(c, "layernorm backward (weight)");
    }
    if (db) {
        cuda_column_sum(c, db, pdb, warps, C);
        LAUNCHED(c, "layernorm backward (bias)");
    }
}

void cuda_layernorm_backward(struct cuda_context *c, int dt, float *dinp, float *dw, float *db,
                             const float *dout, const void *inp, const void *w, const float *mean,
                             const float *rstd, int N, int C, float *scratch)
{
    if (!dinp && !dw && !db)
        return;
    DISPATCH_STORAGE(dt, layernorm_backward, c, dinp, dw, db, dout, inp, w, mean, rstd, N, C,
                     scratch);
}

/* ---- RMSNorm: layernorm without the mean and the bias --------------------- */
/* out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); one warp per row, the
 * row sums in double, dw through partial rows of scratch as layernorm's. */

template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C,
                                       float eps)
{
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const T *x = inp + (size_t)row * C;
    double sq = 0.0;
    for (int col = lane; col < C; col += 32) {
        float v = to_f32(x[col]);
        sq += (double)v * v;
    }
    sq = warp_sum_double(sq);
    float s = (float)(1.0 / sqrt(sq / C + eps));
    T *y = out + (size_t)row * C;
    for (int col = lane; col < C; col += 32)
        y[col] = from_f32<T>(to_f32(x[col]) * s * to_f32(w[col]));
    if (lane == 0)
        rstd[row] = s;
}

template <typename T>
static void rmsnorm_forward(struct cuda_context *c, void *out, float *rstd, const void *inp,
                            const void *w, int N, int C, float eps)
{
    unsigned blocks = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    rmsnorm_forward_kernel<T><<<blocks ? blocks : 1, LN_WARPS * 32, 0, c->compute>>>(
        (T *)out, rstd, (const T *)inp, (const T *)w, N, C, eps);
    LAUNCHED(c, "rmsnorm forward");
}

void cuda_rmsnorm_forward(struct cuda_context *c, int dt, void *out, float *rstd, const void *inp,
                          const void *w, int N, int C, float eps)
{
    DISPATCH_STORAGE(dt, rmsnorm_forward, c, out, rstd, inp, w, N, C, eps);
}

size_t cuda_rmsnorm_scratch_floats(int N, int C)
{
    return (size_t)layernorm_partial_warps(N) * (size_t)C;
}

/* with xhat = x rstd and g = dout w:
 *   dx = rstd (g - xhat mean(g xhat)),   dw = sum over rows of dout xhat */
template <typename T>
__global__ void rmsnorm_backward_kernel(float *dinp, float *partial_dw, const float *dout,
                                        const T *inp, const T *w, const float *rstd, int N, int C)
{
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    int warps = gridDim.x * LN_WARPS;
    float *pdw = partial_dw ? partial_dw + (size_t)warp * C : NULL;
    if (pdw)
        for (int col = lane; col < C; col += 32)
            pdw[col] = 0.0f;
    for (int row = warp; row < N; row += warps) {
        const T *x = inp + (size_t)row * C;
        const float *dy = dout + (size_t)row * C;
        float s = rstd[row];
        if (dinp) {
            double g_xhat_sum = 0.0;
            for (int col = lane; col < C; col += 32)
                g_xhat_sum += (double)(dy[col] * to_f32(w[col])) * (to_f32(x[col]) * s);
            g_xhat_sum = warp_sum_double(g_xhat_sum);
            float g_xhat_mean = (float)(g_xhat_sum / C);
            float *dx = dinp + (size_t)row * C;
            for (int col = lane; col < C; col += 32) {
                float xhat = to_f32(x[col]) * s;
                float g = dy[col] * to_f32(w[col]);
                dx[col] += s * (g - xhat * g_xhat_mean);
            }
        }
        if (pdw)
            for (int col = lane; col < C; col += 32)
                pdw[col] += dy[col] * (to_f32(x[col]) * s);
    }
}

template <typename T>
static void rmsnorm_backward(struct cuda_context *c, float *dinp, float *dw, const float *dout,
                             const void *inp, const void *w, const float *rstd, int N, int C,
                             float *scratch)
{
    int warps = layernorm_partial_warps(N);
    float *pdw = dw ? scratch : NULL;
    rmsnorm_backward_kernel<T><<<warps / LN_WARPS, LN_WARPS * 32, 0, c->compute>>>(
        dinp, pdw, dout, (const T *)inp, (const T *)w, rstd, N, C);
    LAUNCHED(c, "rmsnorm backward");
    if (dw) {
        cuda_column_sum(c, dw, pdw, warps, C);
        LAUNCHED(c, "rmsnorm backward (weight)");
    }
}

void cuda_rmsnorm_backward(struct cuda_context *c, int dt, float *dinp, float *dw,
                           const float *dout, const void *inp, const void *w, const float *rstd,
                           int N, int C, float *scratch)
{
    if (!dinp && !dw)
        return;
    DISPATCH_STORAGE(dt, rmsnorm_backward, c, dinp, dw, dout, inp, w, rstd, N, C, scratch);
}
