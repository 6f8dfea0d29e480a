/*
 * Every op but the GEMMs and attention: embedding, add_rows, add, GELU,
 * ReLU, SwiGLU, scale, layernorm, RMSNorm, rotary position embeddings,
 * softmax cross-entropy, the optimizers, the gradient norm and the accuracy
 * count.  The formulas are those of the kernels/cpu files, term
 * for term, so the two backends differ only by summation order.
 *
 * Sums that feed parameters (layernorm dw/db, position and bias gradients,
 * the loss, the gradient norm) are deterministic: partial sums over a split
 * that depends on the shapes only, added in a fixed order.  The embedding
 * gradient uses atomics (rows of a token table collide), so it is the one
 * result that can differ in the last bits between runs.
 */
#include "common.cuh"

#include <math.h>

static const unsigned THREADS = 256;
enum { THREADS_PER_ROW_MAX = 256 }; /* count_correct's block, a power of two */

/* ---- embedding ---------------------------------------------------------- */

template <typename T>
__global__ void embedding_forward_kernel(T *out, const int32_t *idx, const T *table, int N, int C,
                                         int V)
{
    size_t total = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C, col = i % C;
        int id = idx[n];
        out[i] = (id >= 0 && id < V) ? table[(size_t)id * C + col] : from_f32<T>(0.0f);
    }
}

template <typename T>
static void embedding_forward(struct cuda_context *c, void *out, const int32_t *idx,
                              const void *table, int N, int C, int V)
{
    size_t n = (size_t)N * C;
    embedding_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, idx, (const T *)table, N, C, V);
    LAUNCHED(c, "embedding forward");
}

void cuda_embedding_forward(struct cuda_context *c, int dt, void *out, const int32_t *idx,
                            const void *table, int N, int C, int V)
{
    DISPATCH_STORAGE(dt, embedding_forward, c, out, idx, table, N, C, V);
}

__global__ void embedding_backward_kernel(float *dtable, const float *dout, const int32_t *idx,
                                          int N, int C, int V)
{
    size_t total = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C, col = i % C;
        int id = idx[n];
        if (id >= 0 && id < V)
            atomicAdd(&dtable[(size_t)id * C + col], dout[i]);
    }
}

void cuda_embedding_backward(struct cuda_context *c, float *dtable, const float *dout,
                             const int32_t *idx, int N, int C, int V)
{
    if (!dtable)
        return;
    size_t n = (size_t)N * C;
    embedding_backward_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(dtable, dout, idx,
                                                                                 N, C, V);
    LAUNCHED(c, "embedding backward");
}

/* ---- add_rows: out[b,t,:] = x[b,t,:] + p[t,:] ---------------------------- */

template <typename T>
__global__ void add_rows_forward_kernel(T *out, const T *x, const T *p, int B, int T_, int C)
{
    size_t total = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t col = i % C, t = (i / C) % T_;
        out[i] = from_f32<T>(to_f32(x[i]) + to_f32(p[t * C + col]));
    }
}

template <typename T>
static void add_rows_forward(struct cuda_context *c, void *out, const void *x, const void *p, int B,
                             int T_, int C)
{
    size_t n = (size_t)B * T_ * C;
    add_rows_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)x, (const T *)p, B, T_, C);
    LAUNCHED(c, "add_rows forward");
}

void cuda_add_rows_forward(struct cuda_context *c, int dt, void *out, const void *x, const void *p,
                           int B, int T, int C)
{
    DISPATCH_STORAGE(dt, add_rows_forward, c, out, x, p, B, T, C);
}

__global__ void accumulate_kernel(float *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

/* each (t, c) is one thread that adds the batch in order, as the CPU does */
__global__ void add_rows_dp_kernel(float *dp, const float *dout, int B, int T_, int C)
{
    size_t total = (size_t)T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = dp[i];
        for (int b = 0; b < B; b++)
            v += dout[(size_t)b * total + i];
        dp[i] = v;
    }
}

void cuda_add_rows_backward(struct cuda_context *c, float *dx, float *dp, const float *dout, int B,
                            int T, int C)
{
    size_t n = (size_t)B * T * C;
    if (dx) {
        accumulate_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(dx, dout, n);
        LAUNCHED(c, "add_rows backward");
    }
    if (dp) {
        size_t m = (size_t)T * C;
        add_rows_dp_kernel<<<grid_for(m, THREADS), THREADS, 0, c->compute>>>(dp, dout, B, T, C);
        LAUNCHED(c, "add_rows backward (positions)");
    }
}

/* ---- add ----------------------------------------------------------------- */

template <typename T> __global__ void add_forward_kernel(T *out, const T *a, const T *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T>
static void add_forward(struct cuda_context *c, void *out, const void *a, const void *b, size_t n)
{
    add_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)a, (const T *)b, n);
    LAUNCHED(c, "add forward");
}

void cuda_add_forward(struct cuda_context *c, int dt, void *out, const void *a, const void *b,
                      size_t n)
{
    DISPATCH_STORAGE(dt, add_forward, c, out, a, b, n);
}

/* da and db may be one buffer (x + x): one thread does both updates in turn */
__global__ void add_backward_kernel(float *da, float *db, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = dout[i];
        if (da)
            da[i] += d;
        if (db)
            db[i] += d;
    }
}

void cuda_add_backward(struct cuda_context *c, float *da, float *db, const float *dout, size_t n)
{
    if (!da && !db)
        return;
    add_backward_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(da, db, dout, n);
    LAUNCHED(c, "add backward");
}

/* ---- GELU (tanh form, as kernels/cpu/elementwise.c) and ReLU ------------- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_SCALE_CUBIC (GELU_SCALE * 0.044715f)
#define GELU_SCALE_CUBIC3 (3.0f * GELU_SCALE * 0.044715f)

/* exp(-2u) with the CPU's clamp of the argument to [-87, 88] */
__device__ __forceinline__ float gelu_exp(float u)
{
    float a = -2.0f * u;
    a = fminf(fmaxf(a, -87.0f), 88.0f);
    return expf(a);
}

template <typename T> __global__ void gelu_forward_kernel(T *out, const T *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = to_f32(inp[i]);
        float u = x * (GELU_SCALE + GELU_SCALE_CUBIC * x * x);
        out[i] = from_f32<T>(x / (1.0f + gelu_exp(u)));
    }
}

template <typename T>
__global__ void gelu_backward_kernel(float *dinp, const T *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = to_f32(inp[i]);
        float x2 = x * x;
        float u = x * (GELU_SCALE + GELU_SCALE_CUBIC * x2);
        float e = gelu_exp(u);
        float s = 1.0f / (1.0f + e);
        float du = GELU_SCALE + GELU_SCALE_CUBIC3 * x2;
        float local = s + 2.0f * x * du * (e * s) * s;
        dinp[i] += local * dout[i];
    }
}

template <typename T> static void gelu_forward(struct cuda_context *c, void *out, const void *inp, size_t n)
{
    gelu_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>((T *)out,
                                                                              (const T *)inp, n);
    LAUNCHED(c, "gelu forward");
}

template <typename T>
static void gelu_backward(struct cuda_context *c, float *dinp, const void *inp, const float *dout,
                          size_t n)
{
    gelu_backward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        dinp, (const T *)inp, dout, n);
    LAUNCHED(c, "gelu backward");
}

void cuda_gelu_forward(struct cuda_context *c, int dt, void *out, const void *inp, size_t n)
{
    DISPATCH_STORAGE(dt, gelu_forward, c, out, inp, n);
}

void cuda_gelu_backward(struct cuda_context *c, int dt, float *dinp, const void *inp,
                        const float *dout, size_t n)
{
    if (dinp)
        DISPATCH_STORAGE(dt, gelu_backward, c, dinp, inp, dout, n);
}

template <typename T> __global__ void relu_forward_kernel(T *out, const T *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = to_f32(inp[i]);
        out[i] = from_f32<T>(x > 0.0f ? x : 0.0f);
    }
}

template <typename T>
__global__ void relu_backward_kernel(float *dinp, const T *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dinp[i] += to_f32(inp[i]) > 0.0f ? dout[i] : 0.0f;
}

template <typename T> static void relu_forward(struct cuda_context *c, void *out, const void *inp, size_t n)
{
    relu_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>((T *)out,
                                                                              (const T *)inp, n);
    LAUNCHED(c, "relu forward");
}

template <typename T>
static void relu_backward(struct cuda_context *c, float *dinp, const void *inp, const float *dout,
                          size_t n)
{
    relu_backward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        dinp, (const T *)inp, dout, n);
    LAUNCHED(c, "relu backward");
}

void cuda_relu_forward(struct cuda_context *c, int dt, void *out, const void *inp, size_t n)
{
    DISPATCH_STORAGE(dt, relu_forward, c, out, inp, n);
}

void cuda_relu_backward(struct cuda_context *c, int dt, float *dinp, const void *inp,
                        const float *dout, size_t n)
{
    if (dinp)
        DISPATCH_STORAGE(dt, relu_backward, c, dinp, inp, dout, n);
}

/* ---- SwiGLU: silu(gate) * up, and scale ----------------------------------- */

/* sigmoid(g); exp(-g) overflows to inf for g < -88, giving 0, not NaN */
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T>
__global__ void swiglu_forward_kernel(T *out, const T *gate, const T *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = to_f32(gate[i]);
        out[i] = from_f32<T>(g * sigmoid(g) * to_f32(up[i]));
    }
}

/* d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g).  gate and up may be one
 * tensor: one thread does both updates of an element in turn. */
template <typename T>
__global__ void swiglu_backward_kernel(float *dgate, float *dup, const T *gate, const T *up,
                                       const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = to_f32(gate[i]), u = to_f32(up[i]), d = dout[i];
        float s = sigmoid(g);
        if (dgate)
            dgate[i] += d * u * (s * (1.0f + g * (1.0f - s)));
        if (dup)
            dup[i] += d * (g * s);
    }
}

template <typename T>
static void swiglu_forward(struct cuda_context *c, void *out, const void *gate, const void *up,
                           size_t n)
{
    swiglu_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)gate, (const T *)up, n);
    LAUNCHED(c, "swiglu forward");
}

template <typename T>
static void swiglu_backward(struct cuda_context *c, float *dgate, float *dup, const void *gate,
                            const void *up, const float *dout, size_t n)
{
    swiglu_backward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        dgate, dup, (const T *)gate, (const T *)up, dout, n);
    LAUNCHED(c, "swiglu backward");
}

void cuda_swiglu_forward(struct cuda_context *c, int dt, void *out, const void *gate,
                         const void *up, size_t n)
{
    DISPATCH_STORAGE(dt, swiglu_forward, c, out, gate, up, n);
}

void cuda_swiglu_backward(struct cuda_context *c, int dt, float *dgate, float *dup,
                          const void *gate, const void *up, const float *dout, size_t n)
{
    if (dgate || dup)
        DISPATCH_STORAGE(dt, swiglu_backward, c, dgate, dup, gate, up, dout, n);
}

template <typename T> __global__ void scale_forward_kernel(T *out, const T *inp, float scale, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f32<T>(scale * to_f32(inp[i]));
}

__global__ void scale_backward_kernel(float *dinp, const float *dout, float scale, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dinp[i] += scale * dout[i];
}

template <typename T>
static void scale_forward(struct cuda_context *c, void *out, const void *inp, float scale, size_t n)
{
    scale_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)inp, scale, n);
    LAUNCHED(c, "scale forward");
}

void cuda_scale_forward(struct cuda_context *c, int dt, void *out, const void *inp, float scale,
                        size_t n)
{
    DISPATCH_STORAGE(dt, scale_forward, c, out, inp, scale, n);
}

void cuda_scale_backward(struct cuda_context *c, float *dinp, const float *dout, float scale,
                         size_t n)
{
    if (!dinp)
        return;
    scale_backward_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(dinp, dout, scale, n);
    LAUNCHED(c, "scale backward");
}

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
    unsigned blocks = (unsigned)((C + THREADS - 1) / THREADS);
    if (dw) {
        column_sum_kernel<<<blocks, THREADS, 0, c->compute>>>(dw, pdw, warps, C);
        LAUNCHED(c, "layernorm backward (weight)");
    }
    if (db) {
        column_sum_kernel<<<blocks, THREADS, 0, c->compute>>>(db, pdb, warps, C);
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
        column_sum_kernel<<<(unsigned)((C + THREADS - 1) / THREADS), THREADS, 0, c->compute>>>(
            dw, pdw, warps, C);
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

/* ---- rotary position embedding, Hugging Face's rotate-half convention ----- */
/* In each head of D channels, pair (i, i + D/2) at position t turns by
 * t * theta^(-2i/D):
 *   out[i] = x[i] cos - x[i+D/2] sin,   out[i+D/2] = x[i+D/2] cos + x[i] sin
 * and backward turns dout back by the same angle.  The angles follow
 * transformers' fp32 arithmetic: inv_freq = 1 / theta^(float(2i)/D) and the
 * angle t * inv_freq rounded to fp32 (at t in the thousands that rounding
 * moves the angle by ~1e-4, so computing it differently would disagree with
 * the checkpoints' reference), then its cos and sin by sincosf (within 2
 * ulp; the CPU's glibc sincosf is within 1).  One kernel fills a [T, D/2]
 * table of each in scratch, shared by every batch row and head. */

size_t cuda_rope_scratch_floats(int T, int D)
{
    return (size_t)T * (size_t)(D / 2) * 2;
}

__global__ void rope_table_kernel(float *cos_t, float *sin_t, int T_, int half, float theta)
{
    size_t total = (size_t)T_ * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / half), k = (int)(i % half);
        float exponent = (float)(2 * k) / (float)(2 * half);
        /* powf rounded once from double: the correctly rounded fp32 power */
        float inv_freq = 1.0f / (float)pow((double)theta, (double)exponent);
        sincosf((float)t * inv_freq, &sin_t[i], &cos_t[i]);
    }
}

/* one thread per pair (i, i + D/2) of one head of one token */
template <typename T>
__global__ void rope_forward_kernel(T *out, const T *inp, const float *cos_t, const float *sin_t,
                                    size_t pairs, int T_, int H, int half)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < pairs;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t k = i % half, head_row = i / half; /* (b * T + t) * H + h */
        size_t t = (head_row / H) % T_;
        size_t at = head_row * 2 * half + k;
        float cs = cos_t[t * half + k], sn = sin_t[t * half + k];
        float x1 = to_f32(inp[at]), x2 = to_f32(inp[at + half]);
        out[at] = from_f32<T>(x1 * cs - x2 * sn);
        out[at + half] = from_f32<T>(x2 * cs + x1 * sn);
    }
}

__global__ void rope_backward_kernel(float *dinp, const float *dout, const float *cos_t,
                                     const float *sin_t, size_t pairs, int T_, int H, int half)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < pairs;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t k = i % half, head_row = i / half;
        size_t t = (head_row / H) % T_;
        size_t at = head_row * 2 * half + k;
        float cs = cos_t[t * half + k], sn = sin_t[t * half + k];
        float d1 = dout[at], d2 = dout[at + half];
        dinp[at] += d1 * cs + d2 * sn;
        dinp[at + half] += d2 * cs - d1 * sn;
    }
}

/* the table in scratch; 0 when the shape cannot be rotated (checked by the
 * graph: this keeps a bad node from reading out of bounds) */
static int rope_table(struct cuda_context *c, float *scratch, int T, int H, int D, float theta)
{
    if (T <= 0 || H <= 0 || D <= 0 || D % 2 != 0) {
        cuda_note(c, cudaErrorInvalidValue, "rope: the head size must be even");
        return 0;
    }
    size_t n = (size_t)T * (D / 2);
    rope_table_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(scratch, scratch + n, T,
                                                                        D / 2, theta);
    LAUNCHED(c, "rope (angles)");
    return 1;
}

template <typename T>
static void rope_forward(struct cuda_context *c, void *out, const void *inp, const float *cos_t,
                         const float *sin_t, size_t pairs, int T_, int H, int half)
{
    rope_forward_kernel<T><<<grid_for(pairs, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)inp, cos_t, sin_t, pairs, T_, H, half);
    LAUNCHED(c, "rope forward");
}

void cuda_rope_forward(struct cuda_context *c, int dt, void *out, const void *inp, int B, int T,
                       int H, int D, float theta, float *scratch)
{
    if (B <= 0 || !rope_table(c, scratch, T, H, D, theta))
        return;
    size_t n = (size_t)T * (D / 2), pairs = (size_t)B * T * H * (D / 2);
    DISPATCH_STORAGE(dt, rope_forward, c, out, inp, scratch, scratch + n, pairs, T, H, D / 2);
}

void cuda_rope_backward(struct cuda_context *c, float *dinp, const float *dout, int B, int T,
                        int H, int D, float theta, float *scratch)
{
    if (!dinp || B <= 0 || !rope_table(c, scratch, T, H, D, theta))
        return;
    size_t n = (size_t)T * (D / 2), pairs = (size_t)B * T * H * (D / 2);
    rope_backward_kernel<<<grid_for(pairs, THREADS), THREADS, 0, c->compute>>>(
        dinp, dout, scratch, scratch + n, pairs, T, H, D / 2);
    LAUNCHED(c, "rope backward");
}

/* ---- bias ------------------------------------------------------------------ */

template <typename T>
__global__ void add_bias_kernel(T *out, const T *bias, int M, int N, int ldc)
{
    size_t total = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / N, n = i % N;
        T *o = out + m * (size_t)ldc + n;
        *o = from_f32<T>(to_f32(*o) + to_f32(bias[n]));
    }
}

template <typename T>
static void add_bias(struct cuda_context *c, void *out, const void *bias, int M, int N, int ldc)
{
    size_t n = (size_t)M * N;
    add_bias_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)bias, M, N, ldc);
    LAUNCHED(c, "linear forward (bias)");
}

void cuda_add_bias(struct cuda_context *c, int dt, void *out, const void *bias, int M, int N,
                   int ldc)
{
    DISPATCH_STORAGE(dt, add_bias, c, out, bias, M, N, ldc);
}

/* ---- bias gradient: dbias[oc] += sum over rows of dout[:, oc] ------------ */
/* from the fp32 dout, also when the GEMMs take 16-bit inputs: the definition
 * both backends share (tr_cpu_linear_bias_backward, kernels/cpu/kernels.h) */

enum { BIAS_ROWS_PER_PART = 64, BIAS_MAX_PARTS = 64 };

static int bias_parts(int N)
{
    int p = (N + BIAS_ROWS_PER_PART - 1) / BIAS_ROWS_PER_PART;
    return p < 1 ? 1 : (p > BIAS_MAX_PARTS ? BIAS_MAX_PARTS : p);
}

size_t cuda_bias_scratch_floats(int N, int OC) { return (size_t)bias_parts(N) * (size_t)OC; }

/* block (32 columns x 8 row lanes) sums part blockIdx.y of the rows */
__global__ void bias_partial_kernel(float *partial, const float *dout, int N, int OC, int parts)
{
    __shared__ float sums[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int rows_per_part = (N + parts - 1) / parts;
    int r0 = blockIdx.y * rows_per_part;
    int r1 = min(N, r0 + rows_per_part);
    float sum = 0.0f;
    if (col < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += 8)
            sum += dout[(size_t)r * OC + col];
    sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < OC) {
        float total = 0.0f;
        for (int k = 0; k < 8; k++)
            total += sums[k][threadIdx.x];
        partial[(size_t)blockIdx.y * OC + col] = total;
    }
}

void cuda_bias_backward(struct cuda_context *c, float *dbias, const float *dout, int N, int OC,
                        float *scratch)
{
    if (!dbias)
        return;
    int parts = bias_parts(N);
    dim3 grid((unsigned)((OC + 31) / 32), (unsigned)parts);
    bias_partial_kernel<<<grid, dim3(32, 8), 0, c->compute>>>(scratch, dout, N, OC, parts);
    LAUNCHED(c, "linear backward (bias)");
    column_sum_kernel<<<(unsigned)((OC + THREADS - 1) / THREADS), THREADS, 0, c->compute>>>(
        dbias, scratch, parts, OC);
    LAUNCHED(c, "linear backward (bias sum)");
}

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

/* ---- conversions ----------------------------------------------------------- */

template <typename From, typename To> __global__ void convert_kernel(To *out, const From *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f32<To>(to_f32(in[i]));
}

template <typename From>
static void convert_from(struct cuda_context *c, void *out, int to, const void *in, size_t n)
{
    unsigned blocks = grid_for(n, THREADS);
    switch (to) {
    case DT_BF16:
        convert_kernel<From, __nv_bfloat16><<<blocks, THREADS, 0, c->compute>>>(
            (__nv_bfloat16 *)out, (const From *)in, n);
        break;
    case DT_F16:
        convert_kernel<From, __half><<<blocks, THREADS, 0, c->compute>>>((__half *)out,
                                                                         (const From *)in, n);
        break;
    default:
        convert_kernel<From, float><<<blocks, THREADS, 0, c->compute>>>((float *)out,
                                                                        (const From *)in, n);
        break;
    }
    LAUNCHED(c, "convert");
}

void cuda_convert(struct cuda_context *c, void *out, int to, const void *in, int from, size_t n)
{
    if (n == 0)
        return;
    DISPATCH_STORAGE(from, convert_from, c, out, to, in, n);
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
