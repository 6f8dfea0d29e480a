/*
 * Pooling and batch normalisation on channel-last images x[B,H,W,C]: own
 * kernels, not cuDNN's.  cuDNN 9 deprecates its legacy pooling and
 * batch-norm calls, and these ops are memory-bound: one pass (two for the
 * batch statistics) over the tensor is all any library can do.
 *
 * Determinism without float atomics: the pooling backwards are gathers (one
 * thread per input element adds the gradients of the outputs whose window
 * holds it, in output order), and batch norm's per-channel sums go through
 * fixed parts of rows, added in part order (as linear's bias gradient,
 * ops.cu), so the bits depend on the shapes alone.
 *
 * Storage: x, w, b and the output in fp32, bf16 or fp16; statistics,
 * running buffers and gradients fp32, arithmetic fp32 (sums of parts in
 * double).
 */
#include "common.cuh"

#include <math.h>

static const unsigned THREADS = 256;

/* ---- max and average pooling --------------------------------------------- */

/* the first output row (column) whose window holds input row i, and the last */
__device__ __forceinline__ int first_window(int i, int k, int s, int p)
{
    int lo = i + p - k + 1; /* o * s - p + k - 1 >= i */
    return lo <= 0 ? 0 : (lo + s - 1) / s;
}
__device__ __forceinline__ int last_window(int i, int s, int p, int n_out)
{
    int hi = (i + p) / s; /* o * s - p <= i */
    return hi < n_out - 1 ? hi : n_out - 1;
}

/* The flat (h * W + w) position of the first maximum of output (oh, ow)'s
 * window in channel c of image b, in row-major order; -1 when the window
 * holds padding only. */
template <typename T>
__device__ int window_argmax(const T *x, const struct pool_args &p, int b, int oh, int ow, int c,
                             float *best_out)
{
    int best_at = -1;
    float best = -INFINITY;
    for (int kh = 0; kh < p.KH; kh++) {
        int ih = oh * p.SH - p.PH + kh;
        if (ih < 0 || ih >= p.H)
            continue;
        for (int kw = 0; kw < p.KW; kw++) {
            int iw = ow * p.SW - p.PW + kw;
            if (iw < 0 || iw >= p.W)
                continue;
            float v = to_f32(x[(((size_t)b * p.H + ih) * p.W + iw) * p.C + c]);
            if (best_at < 0 || v > best) { /* strictly greater: the first maximum stays */
                best = v;
                best_at = ih * p.W + iw;
            }
        }
    }
    *best_out = best;
    return best_at;
}

template <typename T>
__global__ void maxpool_forward_kernel(T *out, const T *x, struct pool_args p)
{
    size_t total = (size_t)p.B * p.OH * p.OW * p.C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % p.C);
        size_t r = i / p.C;
        int ow = (int)(r % p.OW), oh = (int)(r / p.OW % p.OH), b = (int)(r / p.OW / p.OH);
        float best;
        window_argmax(x, p, b, oh, ow, c, &best);
        out[i] = from_f32<T>(best);
    }
}

/* one thread per input element: its gradient plus that of every output
 * whose first maximum it is, in output order */
template <typename T>
__global__ void maxpool_backward_kernel(float *dx, const T *x, const float *dout,
                                        struct pool_args p)
{
    size_t total = (size_t)p.B * p.H * p.W * p.C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % p.C);
        size_t r = i / p.C;
        int iw = (int)(r % p.W), ih = (int)(r / p.W % p.H), b = (int)(r / p.W / p.H);
        float acc = dx[i];
        int oh1 = last_window(ih, p.SH, p.PH, p.OH), ow1 = last_window(iw, p.SW, p.PW, p.OW);
        for (int oh = first_window(ih, p.KH, p.SH, p.PH); oh <= oh1; oh++)
            for (int ow = first_window(iw, p.KW, p.SW, p.PW); ow <= ow1; ow++) {
                float best;
                if (window_argmax(x, p, b, oh, ow, c, &best) == ih * p.W + iw)
                    acc += dout[(((size_t)b * p.OH + oh) * p.OW + ow) * p.C + c];
            }
        dx[i] = acc;
    }
}

template <typename T>
__global__ void avgpool_forward_kernel(T *out, const T *x, struct pool_args p)
{
    size_t total = (size_t)p.B * p.OH * p.OW * p.C;
    float inv = 1.0f / (float)(p.KH * p.KW); /* padding counts as zeros */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % p.C);
        size_t r = i / p.C;
        int ow = (int)(r % p.OW), oh = (int)(r / p.OW % p.OH), b = (int)(r / p.OW / p.OH);
        float sum = 0.0f;
        for (int kh = 0; kh < p.KH; kh++) {
            int ih = oh * p.SH - p.PH + kh;
            if (ih < 0 || ih >= p.H)
                continue;
            for (int kw = 0; kw < p.KW; kw++) {
                int iw = ow * p.SW - p.PW + kw;
                if (iw >= 0 && iw < p.W)
                    sum += to_f32(x[(((size_t)b * p.H + ih) * p.W + iw) * p.C + c]);
            }
        }
        out[i] = from_f32<T>(sum * inv);
    }
}

__global__ void avgpool_backward_kernel(float *dx, const float *dout, struct pool_args p)
{
    size_t total = (size_t)p.B * p.H * p.W * p.C;
    float inv = 1.0f / (float)(p.KH * p.KW);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % p.C);
        size_t r = i / p.C;
        int iw = (int)(r % p.W), ih = (int)(r / p.W % p.H), b = (int)(r / p.W / p.H);
        float acc = 0.0f;
        int oh1 = last_window(ih, p.SH, p.PH, p.OH), ow1 = last_window(iw, p.SW, p.PW, p.OW);
        for (int oh = first_window(ih, p.KH, p.SH, p.PH); oh <= oh1; oh++)
            for (int ow = first_window(iw, p.KW, p.SW, p.PW); ow <= ow1; ow++)
                acc += dout[(((size_t)b * p.OH + oh) * p.OW + ow) * p.C + c];
        dx[i] += acc * inv;
    }
}

template <typename T>
static void maxpool_forward(struct cuda_context *c, void *out, const void *x,
                            const struct pool_args *p)
{
    size_t n = (size_t)p->B * p->OH * p->OW * p->C;
    maxpool_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>((T *)out,
                                                                                (const T *)x, *p);
    LAUNCHED(c, "maxpool forward");
}

template <typename T>
static void maxpool_backward(struct cuda_context *c, float *dx, const void *x, const float *dout,
                             const struct pool_args *p)
{
    size_t n = (size_t)p->B * p->H * p->W * p->C;
    maxpool_backward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        dx, (const T *)x, dout, *p);
    LAUNCHED(c, "maxpool backward");
}

template <typename T>
static void avgpool_forward(struct cuda_context *c, void *out, const void *x,
                            const struct pool_args *p)
{
    size_t n = (size_t)p->B * p->OH * p->OW * p->C;
    avgpool_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>((T *)out,
                                                                                (const T *)x, *p);
    LAUNCHED(c, "avgpool forward");
}

void cuda_maxpool_forward(struct cuda_context *c, int dt, void *out, const void *x,
                          const struct pool_args *p)
{
    DISPATCH_STORAGE(dt, maxpool_forward, c, out, x, p);
}

void cuda_maxpool_backward(struct cuda_context *c, int dt, float *dx, const void *x,
                           const float *dout, const struct pool_args *p)
{
    if (dx)
        DISPATCH_STORAGE(dt, maxpool_backward, c, dx, x, dout, p);
}

void cuda_avgpool_forward(struct cuda_context *c, int dt, void *out, const void *x,
                          const struct pool_args *p)
{
    DISPATCH_STORAGE(dt, avgpool_forward, c, out, x, p);
}

void cuda_avgpool_backward(struct cuda_context *c, float *dx, const float *dout,
                           const struct pool_args *p)
{
    if (!dx)
        return;
    size_t n = (size_t)p->B * p->H * p->W * p->C;
    avgpool_backward_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(dx, dout, *p);
    LAUNCHED(c, "avgpool backward");
}

/* ---- global average pooling: out[b,c] = mean over the HW positions ---------- */

/* one thread per (b, c): the positions in order (neighbouring threads read
 * neighbouring channels, so the loads coalesce) */
template <typename T>
__global__ void global_avgpool_forward_kernel(T *out, const T *x, int B, int HW, int C)
{
    size_t total = (size_t)B * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t b = i / C, c = i % C;
        const T *at = x + b * (size_t)HW * C + c;
        float sum = 0.0f;
        for (int k = 0; k < HW; k++)
            sum += to_f32(at[(size_t)k * C]);
        out[i] = from_f32<T>(sum * (1.0f / (float)HW));
    }
}

__global__ void global_avgpool_backward_kernel(float *dx, const float *dout, int B, int HW, int C)
{
    size_t total = (size_t)B * HW * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t c = i % C, b = i / C / HW;
        dx[i] += dout[b * C + c] * (1.0f / (float)HW);
    }
}

template <typename T>
static void global_avgpool_forward(struct cuda_context *c, void *out, const void *x, int B, int HW,
                                   int C)
{
    size_t n = (size_t)B * C;
    global_avgpool_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)x, B, HW, C);
    LAUNCHED(c, "global_avgpool forward");
}

void cuda_global_avgpool_forward(struct cuda_context *c, int dt, void *out, const void *x, int B,
                                 int HW, int C)
{
    DISPATCH_STORAGE(dt, global_avgpool_forward, c, out, x, B, HW, C);
}

void cuda_global_avgpool_backward(struct cuda_context *c, float *dx, const float *dout, int B,
                                  int HW, int C)
{
    if (!dx)
        return;
    size_t n = (size_t)B * HW * C;
    global_avgpool_backward_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(dx, dout, B,
                                                                                     HW, C);
    LAUNCHED(c, "global_avgpool backward");
}

/* ---- batch normalisation over the N rows of x[N,C] ------------------------------ */

/* Per-channel sums through fixed parts of the rows (as the bias gradient):
 * part k of `parts` writes partial[k * C + c], then one thread per channel
 * adds the parts in order. */
enum { BN_ROWS_PER_PART = 64, BN_MAX_PARTS = 64 };

static int bn_parts(int N)
{
    int p = (N + BN_ROWS_PER_PART - 1) / BN_ROWS_PER_PART;
    return p < 1 ? 1 : (p > BN_MAX_PARTS ? BN_MAX_PARTS : p);
}

/* scratch: two partial arrays (parts x C) and two totals (C) */
size_t cuda_batchnorm_scratch_floats(int N, int C)
{
    return 2 * (size_t)bn_parts(N) * (size_t)C + 2 * (size_t)C;
}

/* What a part sums per channel: x (mean), (x - mean)^2 (variance), or for
 * backward dy and dy * xhat together. */
enum { BN_SUM_X = 0, BN_SUM_SQUARES = 1, BN_SUM_GRAD = 2 };

/* block (32 channels x 8 row lanes) sums part blockIdx.y of the rows */
template <typename T>
__global__ void batchnorm_partial_kernel(float *partial, float *partial2, int what, const T *x,
                                         const float *dy, const float *mean, const float *rstd,
                                         int N, int C, int parts)
{
    __shared__ float sums[2][8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int rows_per_part = (N + parts - 1) / parts;
    int r0 = blockIdx.y * rows_per_part;
    int r1 = min(N, r0 + rows_per_part);
    float s1 = 0.0f, s2 = 0.0f;
    if (col < C) {
        float m = what == BN_SUM_X ? 0.0f : mean[col];
        float rs = what == BN_SUM_GRAD ? rstd[col] : 1.0f;
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            size_t at = (size_t)r * C + col;
            float v = to_f32(x[at]);
            if (what == BN_SUM_X) {
                s1 += v;
            } else if (what == BN_SUM_SQUARES) {
                float d = v - m;
                s1 += d * d;
            } else {
                float g = dy[at];
                s1 += g;
                s2 += g * (v - m) * rs;
            }
        }
    }
    sums[0][threadIdx.y][threadIdx.x] = s1;
    sums[1][threadIdx.y][threadIdx.x] = s2;
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        float t1 = 0.0f, t2 = 0.0f;
        for (int k = 0; k < 8; k++) {
            t1 += sums[0][k][threadIdx.x];
            t2 += sums[1][k][threadIdx.x];
        }
        partial[(size_t)blockIdx.y * C + col] = t1;
        if (what == BN_SUM_GRAD)
            partial2[(size_t)blockIdx.y * C + col] = t2;
    }
}

__device__ __forceinline__ double parts_sum(const float *partial, int parts, int C, int col)
{
    double s = 0.0;
    for (int k = 0; k < parts; k++)
        s += partial[(size_t)k * C + col];
    return s;
}

/* the batch mean, from the partial sums of x */
__global__ void batchnorm_mean_kernel(float *mean, const float *partial, int parts, int N, int C)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col < C)
        mean[col] = (float)(parts_sum(partial, parts, C, col) / N);
}

/* the batch rstd from the partial sums of squares, and the running
 * statistics' update (unbiased variance) when `update` */
__global__ void batchnorm_var_kernel(float *rstd, float *running, const float *mean,
                                     const float *partial, int parts, int N, int C, float eps,
                                     float momentum, int update)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C)
        return;
    double var = parts_sum(partial, parts, C, col) / N;
    rstd[col] = (float)(1.0 / sqrt(var + (double)eps));
    if (update) {
        double unbiased = N > 1 ? var * N / (N - 1) : var;
        running[col] = (1.0f - momentum) * running[col] + momentum * mean[col];
        running[C + col] = (1.0f - momentum) * running[C + col] + momentum * (float)unbiased;
    }
}

/* eval: the running statistics as the mean and rstd to normalise with */
__global__ void batchnorm_eval_stats_kernel(float *mean, float *rstd, const float *running, int C,
                                            float eps)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col < C) {
        mean[col] = running[col];
        rstd[col] = (float)(1.0 / sqrt((double)running[C + col] + (double)eps));
    }
}

template <typename T>
__global__ void batchnorm_normalise_kernel(T *out, const T *x, const T *w, const T *b,
                                           const float *mean, const float *rstd, size_t n, int C)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        float xhat = (to_f32(x[i]) - mean[c]) * rstd[c];
        out[i] = from_f32<T>(xhat * to_f32(w[c]) + to_f32(b[c]));
    }
}

/* totals[0..C) = sum dy, totals[C..2C) = sum dy * xhat; dw, db accumulate them */
__global__ void batchnorm_grad_sums_kernel(float *totals, float *dw, float *db,
                                           const float *partial, const float *partial2, int parts,
                                           int C)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C)
        return;
    float sum_dy = (float)parts_sum(partial, parts, C, col);
    float sum_dy_xhat = (float)parts_sum(partial2, parts, C, col);
    totals[col] = sum_dy;
    totals[C + col] = sum_dy_xhat;
    if (dw)
        dw[col] += sum_dy_xhat;
    if (db)
        db[col] += sum_dy;
}

/* training: dx += rstd w (dy - mean(dy) - xhat mean(dy xhat)), the batch
 * statistics depending on x; eval: dx += rstd w dy (they are constants) */
template <typename T>
__global__ void batchnorm_dx_kernel(float *dx, const float *dy, const T *x, const T *w,
                                    const float *mean, const float *rstd, const float *totals,
                                    size_t n, int N, int C, int training)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        float g = dy[i];
        if (training) {
            float xhat = (to_f32(x[i]) - mean[c]) * rstd[c];
            g -= (totals[c] + xhat * totals[C + c]) / (float)N;
        }
        dx[i] += rstd[c] * to_f32(w[c]) * g;
    }
}

template <typename T>
static void batchnorm_forward(struct cuda_context *c, void *out, float *mean, float *rstd,
                              float *running, const void *x, const void *w, const void *b, int N,
                              int C, float eps, float momentum, int training, int update,
                              float *scratch)
{
    unsigned col_blocks = (unsigned)((C + THREADS - 1) / THREADS);
    float *none = NULL; /* typed: a launch's arguments keep their types */
    const float *nothing = NULL;
    if (training) {
        int parts = bn_parts(N);
        dim3 grid((unsigned)((C + 31) / 32), (unsigned)parts);
        batchnorm_partial_kernel<T><<<grid, dim3(32, 8), 0, c->compute>>>(
            scratch, none, BN_SUM_X, (const T *)x, nothing, nothing, nothing, N, C, parts);
        batchnorm_mean_kernel<<<col_blocks, THREADS, 0, c->compute>>>(mean, scratch, parts, N, C);
        batchnorm_partial_kernel<T><<<grid, dim3(32, 8), 0, c->compute>>>(
            scratch, none, BN_SUM_SQUARES, (const T *)x, nothing, mean, nothing, N, C, parts);
        batchnorm_var_kernel<<<col_blocks, THREADS, 0, c->compute>>>(
            rstd, running, mean, scratch, parts, N, C, eps, momentum, update);
    } else {
        batchnorm_eval_stats_kernel<<<col_blocks, THREADS, 0, c->compute>>>(mean, rstd, running, C,
                                                                            eps);
    }
    LAUNCHED(c, "batchnorm forward (statistics)");
    size_t n = (size_t)N * C;
    batchnorm_normalise_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)x, (const T *)w, (const T *)b, mean, rstd, n, C);
    LAUNCHED(c, "batchnorm forward");
}

template <typename T>
static void batchnorm_backward(struct cuda_context *c, float *dx, float *dw, float *db,
                               const float *dout, const void *x, const void *w, const float *mean,
                               const float *rstd, int N, int C, int training, float *scratch)
{
    int parts = bn_parts(N);
    float *partial = scratch, *partial2 = scratch + (size_t)parts * C;
    float *totals = scratch + 2 * (size_t)parts * C;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)parts);
    batchnorm_partial_kernel<T><<<grid, dim3(32, 8), 0, c->compute>>>(
        partial, partial2, BN_SUM_GRAD, (const T *)x, dout, mean, rstd, N, C, parts);
    batchnorm_grad_sums_kernel<<<(unsigned)((C + THREADS - 1) / THREADS), THREADS, 0, c->compute>>>(
        totals, dw, db, partial, partial2, parts, C);
    LAUNCHED(c, "batchnorm backward (sums)");
    if (dx) {
        size_t n = (size_t)N * C;
        batchnorm_dx_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
            dx, dout, (const T *)x, (const T *)w, mean, rstd, totals, n, N, C, training);
        LAUNCHED(c, "batchnorm backward");
    }
}

void cuda_batchnorm_forward(struct cuda_context *c, int dt, void *out, float *mean, float *rstd,
                            float *running, const void *x, const void *w, const void *b, int N,
                            int C, float eps, float momentum, int training, int update,
                            float *scratch)
{
    DISPATCH_STORAGE(dt, batchnorm_forward, c, out, mean, rstd, running, x, w, b, N, C, eps,
                     momentum, training, update, scratch);
}

void cuda_batchnorm_backward(struct cuda_context *c, int dt, float *dx, float *dw, float *db,
                             const float *dout, const void *x, const void *w, const float *mean,
                             const float *rstd, int N, int C, int training, float *scratch)
{
    if (!dx && !dw && !db)
        return;
    DISPATCH_STORAGE(dt, batchnorm_backward, c, dx, dw, db, dout, x, w, mean, rstd, N, C, training,
                     scratch);
}
