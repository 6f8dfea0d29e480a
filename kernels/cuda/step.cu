/*
 * The loss and the step: softmax cross-entropy, the optimizers, the gradient
 * norm and the accuracy count, with the block reductions they share.  The
 * formulas are those of the kernels/cpu files, term for term.  The loss and
 * the gradient norm are deterministic: partial sums over a split that depends
 * on the shapes only, added in a fixed order.
 */
#include "common.cuh"

#include <math.h>

static const unsigned THREADS = 256;
enum { THREADS_PER_ROW_MAX = 256 }; /* count_correct's block, a power of two */

/* ---- block reductions ---------------------------------------------------- */

/* Sum over the block in a fixed tree (blockDim.x a multiple of 32, <= 1024). */
__device__ double block_sum_double(double v)
{
    __shared__ double warp_sums[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_double(v);
    __syncthreads(); /* warp_sums may still be read by a previous call */
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    int warps = blockDim.x >> 5;
    double total = 0.0;
    if (warp == 0) {
        total = lane < warps ? warp_sums[lane] : 0.0;
        total = warp_sum_double(total);
    }
    return total; /* valid in thread 0 */
}

__device__ float block_max_float(float v)
{
    __shared__ float warp_max_shared[32];
    __shared__ float result;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        warp_max_shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int warps = blockDim.x >> 5;
        float m = lane < warps ? warp_max_shared[lane] : -INFINITY;
        m = warp_max(m);
        if (lane == 0)
            result = m;
    }
    __syncthreads();
    return result; /* valid in every thread */
}

/* ---- softmax cross-entropy ------------------------------------------------ */

/* scratch: N doubles (per-row losses) in forward, one int (n_valid) in backward */
size_t cuda_cross_entropy_scratch_floats(int N) { return 2 * (size_t)N + 64; }

/* one block per row: lse, and the row's loss (0 for ignored rows) */
template <typename T>
__global__ void cross_entropy_rows_kernel(float *lse, double *row_loss, const T *logits,
                                          const int32_t *targets, int N, int V, int ignore_index)
{
    int row = blockIdx.x;
    int target = targets[row];
    if (target == ignore_index) { /* uniform over the block: no thread reaches a barrier */
        if (threadIdx.x == 0) {
            lse[row] = 0.0f;
            row_loss[row] = 0.0;
        }
        return;
    }
    const T *x = logits + (size_t)row * V;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        m = fmaxf(m, to_f32(x[i]));
    m = block_max_float(m);
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        sum += expf(to_f32(x[i]) - m);
    sum = block_sum_double(sum);
    if (threadIdx.x == 0) {
        float l = m + (float)log(sum);
        lse[row] = l;
        /* a target outside [0,V) makes the loss NaN rather than a fault */
        row_loss[row] = (target >= 0 && target < V) ? (double)l - to_f32(x[target]) : (double)NAN;
    }
}

/* one block: mean over the rows that count, written in the loss's dtype */
template <typename T>
__global__ void cross_entropy_mean_kernel(T *loss, const double *row_loss, const int32_t *targets,
                                          int N, int ignore_index)
{
    double total = 0.0, valid = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x)
        if (targets[i] != ignore_index) {
            total += row_loss[i];
            valid += 1.0;
        }
    total = block_sum_double(total);
    valid = block_sum_double(valid);
    if (threadIdx.x == 0)
        *loss = from_f32<T>(valid > 0 ? (float)(total / valid) : 0.0f);
}

template <typename T>
static void cross_entropy_forward(struct cuda_context *c, void *loss, float *lse,
                                  const void *logits, const int32_t *targets, int N, int V,
                                  int ignore_index, float *scratch)
{
    double *row_loss = (double *)scratch;
    if (N > 0) {
        cross_entropy_rows_kernel<T><<<(unsigned)N, THREADS, 0, c->compute>>>(
            lse, row_loss, (const T *)logits, targets, N, V, ignore_index);
        LAUNCHED(c, "cross_entropy forward");
    }
    cross_entropy_mean_kernel<T><<<1, 1024, 0, c->compute>>>((T *)loss, row_loss, targets, N,
                                                             ignore_index);
    LAUNCHED(c, "cross_entropy forward (mean)");
}

void cuda_cross_entropy_forward(struct cuda_context *c, int dt, void *loss, float *lse,
                                const void *logits, const int32_t *targets, int N, int V,
                                int ignore_index, float *scratch)
{
    DISPATCH_STORAGE(dt, cross_entropy_forward, c, loss, lse, logits, targets, N, V, ignore_index,
                     scratch);
}

__global__ void count_valid_kernel(int *n_valid, const int32_t *targets, int N, int ignore_index)
{
    double valid = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x)
        valid += targets[i] != ignore_index;
    valid = block_sum_double(valid);
    if (threadIdx.x == 0)
        *n_valid = (int)valid;
}

template <typename T>
__global__ void cross_entropy_backward_kernel(float *dlogits, const T *logits, const float *lse,
                                              const int32_t *targets, const int *n_valid,
                                              float dloss, int V, int ignore_index)
{
    int row = blockIdx.x;
    int target = targets[row];
    int valid = *n_valid;
    if (target == ignore_index || valid == 0)
        return;
    float row_scale = dloss / (float)valid;
    const T *x = logits + (size_t)row * V;
    float *dx = dlogits + (size_t)row * V;
    float row_lse = lse[row];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float prob = expf(to_f32(x[i]) - row_lse);
        float indicator = i == target ? 1.0f : 0.0f;
        dx[i] += row_scale * (prob - indicator);
    }
}

template <typename T>
static void cross_entropy_backward(struct cuda_context *c, float *dlogits, const void *logits,
                                   const float *lse, const int32_t *targets, float dloss, int N,
                                   int V, int ignore_index, float *scratch)
{
    int *n_valid = (int *)scratch;
    count_valid_kernel<<<1, 1024, 0, c->compute>>>(n_valid, targets, N, ignore_index);
    LAUNCHED(c, "cross_entropy backward (count)");
    cross_entropy_backward_kernel<T><<<(unsigned)N, THREADS, 0, c->compute>>>(
        dlogits, (const T *)logits, lse, targets, n_valid, dloss, V, ignore_index);
    LAUNCHED(c, "cross_entropy backward");
}

void cuda_cross_entropy_backward(struct cuda_context *c, int dt, float *dlogits, const void *logits,
                                 const float *lse, const int32_t *targets, float dloss, int N,
                                 int V, int ignore_index, float *scratch)
{
    if (!dlogits || N <= 0)
        return;
    DISPATCH_STORAGE(dt, cross_entropy_backward, c, dlogits, logits, lse, targets, dloss, N, V,
                     ignore_index, scratch);
}

/* ---- optimizers (kernels/cpu/optim.c) --------------------------------------- */

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             float grad_scale, float correction1, float correction2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
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

void cuda_adamw(struct cuda_context *c, float *p, const float *g, float *m, float *v, size_t n,
                const struct tr_adamw_args *a)
{
    if (n == 0)
        return;
    /* bias corrections in double on the host, as the CPU does */
    float correction1 = (float)(1.0 - pow((double)a->beta1, (double)a->t));
    float correction2 = (float)(1.0 - pow((double)a->beta2, (double)a->t));
    adamw_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        p, g, m, v, n, a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, a->grad_scale,
        correction1, correction2);
    LAUNCHED(c, "adamw");
}

__global__ void sgd_kernel(float *param, const float *grad, float *momentum_buf, size_t n, float lr,
                           float momentum, float weight_decay, float grad_scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float p = param[i];
        float g = grad[i] * grad_scale + weight_decay * p;
        if (momentum_buf) {
            float buf = momentum * momentum_buf[i] + g;
            momentum_buf[i] = buf;
            g = buf;
        }
        param[i] = p - lr * g;
    }
}

void cuda_sgd(struct cuda_context *c, float *p, const float *g, float *buf, size_t n,
              const struct tr_sgd_args *a)
{
    if (n == 0)
        return;
    sgd_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(p, g, buf, n, a->lr, a->momentum,
                                                                 a->weight_decay, a->grad_scale);
    LAUNCHED(c, "sgd");
}

/* ---- gradient norm: SUM_BLOCKS x SUM_THREADS fixed lanes, double sums ---- */

__global__ void sum_squares_partial_kernel(double *partial, const float *x, size_t n)
{
    double acc = 0.0;
    size_t stride = (size_t)SUM_BLOCKS * SUM_THREADS;
    for (size_t i = blockIdx.x * (size_t)SUM_THREADS + threadIdx.x; i < n; i += stride)
        acc += (double)x[i] * x[i];
    acc = block_sum_double(acc);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = acc;
}

__global__ void sum_squares_final_kernel(double *result, const double *partial)
{
    double v = block_sum_double(partial[threadIdx.x]);
    if (threadIdx.x == 0)
        *result = v;
}

double cuda_sum_squares(struct cuda_context *c, const float *x, size_t n)
{
    if (n == 0)
        return 0.0;
    sum_squares_partial_kernel<<<SUM_BLOCKS, SUM_THREADS, 0, c->compute>>>(c->sum_partials, x, n);
    LAUNCHED(c, "sum_squares");
    sum_squares_final_kernel<<<1, SUM_BLOCKS, 0, c->compute>>>(c->sum_partials + SUM_BLOCKS,
                                                               c->sum_partials);
    LAUNCHED(c, "sum_squares (final)");
    CUDA_NOTE(c, cudaMemcpyAsync(c->sum_result, c->sum_partials + SUM_BLOCKS, sizeof(double),
                                 cudaMemcpyDeviceToHost, c->compute));
    CUDA_NOTE(c, cudaStreamSynchronize(c->compute));
    /* a failed step must not look like a finite gradient */
    return c->first_error == cudaSuccess ? *c->sum_result : (double)NAN;
}

/* ---- accuracy: one block per row, first maximum wins ties ----------------- */

__global__ void count_correct_kernel(unsigned long long *counts, const float *logits,
                                     const int32_t *targets, int V, int ignore_index)
{
    __shared__ float best_value[THREADS_PER_ROW_MAX];
    __shared__ int best_index[THREADS_PER_ROW_MAX];
    int row = blockIdx.x;
    int target = targets[row];
    if (target == ignore_index)
        return;
    const float *x = logits + (size_t)row * V;
    float bv = -INFINITY;
    int bi = V; /* no candidate yet */
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = x[i];
        if (bi == V || v > bv) {
            bv = v;
            bi = i;
        }
    }
    best_value[threadIdx.x] = bv;
    best_index[threadIdx.x] = bi;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) {
            float ov = best_value[threadIdx.x + half];
            int oi = best_index[threadIdx.x + half];
            float mv = best_value[threadIdx.x];
            int mi = best_index[threadIdx.x];
            if (oi != V && (mi == V || ov > mv || (ov == mv && oi < mi))) {
                best_value[threadIdx.x] = ov;
                best_index[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&counts[1], 1ULL);
        if (best_index[0] == target)
            atomicAdd(&counts[0], 1ULL);
    }
}

int64_t cuda_count_correct(struct cuda_context *c, const float *logits, const int32_t *targets,
                           int N, int V, int ignore_index, int64_t *n_valid)
{
    *n_valid = 0;
    if (N <= 0 || V <= 0)
        return 0;
    CUDA_NOTE(c, cudaMemsetAsync(c->counts, 0, 2 * sizeof(unsigned long long), c->compute));
    count_correct_kernel<<<(unsigned)N, THREADS_PER_ROW_MAX, 0, c->compute>>>(
        c->counts, logits, targets, V, ignore_index);
    LAUNCHED(c, "count_correct");
    CUDA_NOTE(c, cudaMemcpyAsync(c->counts_host, c->counts, 2 * sizeof(unsigned long long),
                                 cudaMemcpyDeviceToHost, c->compute));
    CUDA_NOTE(c, cudaStreamSynchronize(c->compute));
    *n_valid = (int64_t)c->counts_host[1];
    return (int64_t)c->counts_host[0];
}
