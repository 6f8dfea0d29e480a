/*
 * The elementwise and row ops: embedding, add_rows, add, GELU, ReLU,
 * SwiGLU, scale, rotary position embeddings, the bias and its gradient, and
 * the storage conversions.  The norms are in norms.cu; the loss, the
 * optimizers, the gradient norm and the accuracy count in step.cu; GEMMs in
 * gemm.cu and attention in attention.cu.  The formulas are those of the
 * kernels/cpu files, term for term, so the two backends differ only by
 * summation order.
 *
 * Sums that feed parameters (position and bias gradients) are
 * deterministic: partial sums over a split that depends on the shapes only,
 * added in a fixed order.  The embedding gradient uses atomics (rows of a
 * token table collide), so it is the one result that can differ in the last
 * bits between runs.
 */
#include "common.cuh"

#include <math.h>

static const unsigned THREADS = 256;

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

/* ---- dropout: the mask of backend.h's tr_dropout_hash, as the CPU's ------- */

template <typename T>
__global__ void dropout_forward_kernel(T *out, const T *inp, size_t n, uint32_t threshold,
                                       float keep, unsigned long long seed,
                                       unsigned long long node)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f32<T>((uint32_t)(tr_dropout_hash(seed, node, i) >> 32) >= threshold
                                 ? to_f32(inp[i]) * keep
                                 : 0.0f);
}

__global__ void dropout_backward_kernel(float *dinp, const float *dout, size_t n,
                                        uint32_t threshold, float keep,
                                        unsigned long long seed, unsigned long long node)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if ((uint32_t)(tr_dropout_hash(seed, node, i) >> 32) >= threshold)
            dinp[i] += dout[i] * keep;
}

template <typename T>
static void dropout_forward(struct cuda_context *c, void *out, const void *inp, size_t n, float p,
                            uint64_t seed, uint64_t node)
{
    dropout_forward_kernel<T><<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        (T *)out, (const T *)inp, n, tr_dropout_threshold(p), 1.0f / (1.0f - p), seed, node);
    LAUNCHED(c, "dropout forward");
}

void cuda_dropout_forward(struct cuda_context *c, int dt, void *out, const void *inp, size_t n,
                          float p, uint64_t seed, uint64_t node)
{
    DISPATCH_STORAGE(dt, dropout_forward, c, out, inp, n, p, seed, node);
}

void cuda_dropout_backward(struct cuda_context *c, float *dinp, const float *dout, size_t n, float p,
                           uint64_t seed, uint64_t node)
{
    if (!dinp)
        return;
    dropout_backward_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(
        dinp, dout, n, tr_dropout_threshold(p), 1.0f / (1.0f - p), seed, node);
    LAUNCHED(c, "dropout backward");
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

__global__ void rope_table_kernel(float *cos_t, float *sin_t, int T_, int half, float theta,
                                  struct tr_rope_scaling sc, int pos0)
{
    size_t total = (size_t)T_ * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / half), k = (int)(i % half);
        float exponent = (float)(2 * k) / (float)(2 * half);
        /* powf rounded once from double: the correctly rounded fp32 power */
        float inv_freq = tr_rope_scale_freq(1.0f / (float)pow((double)theta, (double)exponent), sc);
        sincosf((float)(pos0 + t) * inv_freq, &sin_t[i], &cos_t[i]);
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
static int rope_table(struct cuda_context *c, float *scratch, int T, int H, int D, float theta,
                      const struct tr_rope_scaling *sc, int pos0)
{
    if (T <= 0 || H <= 0 || D <= 0 || D % 2 != 0) {
        cuda_note(c, cudaErrorInvalidValue, "rope: the head size must be even");
        return 0;
    }
    size_t n = (size_t)T * (D / 2);
    rope_table_kernel<<<grid_for(n, THREADS), THREADS, 0, c->compute>>>(scratch, scratch + n, T,
                                                                        D / 2, theta, *sc, pos0);
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
                       int H, int D, float theta, const struct tr_rope_scaling *sc, float *scratch,
                       int pos0)
{
    if (B <= 0 || !rope_table(c, scratch, T, H, D, theta, sc, pos0))
        return;
    size_t n = (size_t)T * (D / 2), pairs = (size_t)B * T * H * (D / 2);
    DISPATCH_STORAGE(dt, rope_forward, c, out, inp, scratch, scratch + n, pairs, T, H, D / 2);
}

void cuda_rope_backward(struct cuda_context *c, float *dinp, const float *dout, int B, int T,
                        int H, int D, float theta, const struct tr_rope_scaling *sc, float *scratch)
{
    if (!dinp || B <= 0 || !rope_table(c, scratch, T, H, D, theta, sc, 0))
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
    cuda_column_sum(c, dbias, scratch, parts, OC);
    LAUNCHED(c, "linear backward (bias sum)");
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

/* ---- the iface's convert: the CPU backend's bits ------------------------------
 *
 * kernels/cpu/convert.c's integer rounding, term for term, on the bits: the
 * same values as __float2bfloat16_rn / __float2half_rn (nearest even,
 * subnormals kept, fp16 overflow to inf), but NaN as the CPU keeps it -- bf16
 * the fp32 NaN's top half with the quiet bit set, fp16 sign | 0x7e00 -- where
 * the cvt instructions give the canonical 0x7fff; and 16 bits widened with
 * their NaN payload, which cvt.f32.f16 need not keep.  No float arithmetic,
 * so nvcc and the harness compute the same bits. */

__device__ __forceinline__ uint16_t bits_to_bf16(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet, payload's top kept */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u); /* ties to even; may carry into the exponent (to inf) */
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ uint16_t bits_to_f16(uint32_t u)
{
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u)                  /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* subnormal in fp16, or zero */
        if (a < 0x33000000u)
            return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14..24 */
        uint32_t h = mant >> shift;
        uint32_t rest = mant & ((1u << shift) - 1u), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (a - 0x38000000u) >> 13; /* exponent rebiased 127 -> 15 */
    uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

__device__ __forceinline__ uint32_t bits_from_f16(uint16_t x)
{
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
    if (e == 0x1f)
        return sign | 0x7f800000u | (m << 13); /* inf, NaN with its payload */
    if (e != 0)
        return sign | ((e + 112u) << 23) | (m << 13);
    if (m == 0)
        return sign;
    e = 113; /* subnormal: normalise */
    while (!(m & 0x400u)) {
        m <<= 1;
        e--;
    }
    return sign | (e << 23) | ((m & 0x3ffu) << 13);
}

/* FROM, TO: DT_F32, DT_BF16 or DT_F16.  fp32 is read and written as
 * uint32_t (4-byte aligned), 16-bit values as uint16_t: 2-byte alignment
 * is all they need, and one element a thread takes any n. */
template <int FROM, int TO>
__global__ void convert_bits_kernel(void *out, const void *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t u = FROM == DT_F32    ? ((const uint32_t *)in)[i]
                     : FROM == DT_BF16 ? (uint32_t)((const uint16_t *)in)[i] << 16
                                       : bits_from_f16(((const uint16_t *)in)[i]);
        if (TO == DT_F32)
            ((uint32_t *)out)[i] = u;
        else
            ((uint16_t *)out)[i] = TO == DT_BF16 ? bits_to_bf16(u) : bits_to_f16(u);
    }
}

template <int FROM>
static void convert_bits_from(struct cuda_context *c, void *out, int to, const void *in, size_t n)
{
    unsigned blocks = grid_for(n, THREADS);
    switch (to) {
    case DT_BF16:
        convert_bits_kernel<FROM, DT_BF16><<<blocks, THREADS, 0, c->compute>>>(out, in, n);
        break;
    case DT_F16:
        convert_bits_kernel<FROM, DT_F16><<<blocks, THREADS, 0, c->compute>>>(out, in, n);
        break;
    default:
        convert_bits_kernel<FROM, DT_F32><<<blocks, THREADS, 0, c->compute>>>(out, in, n);
        break;
    }
}

void cuda_convert_bits(struct cuda_context *c, void *out, int to, const void *in, int from,
                       size_t n)
{
    if (n == 0)
        return;
    if (to == from) { /* a copy keeps every bit, NaN payloads included */
        CUDA_NOTE(c, cudaMemcpyAsync(out, in, n * (to == DT_F32 ? 4 : 2),
                                     cudaMemcpyDeviceToDevice, c->compute));
        return;
    }
    switch (from) {
    case DT_BF16:
        convert_bits_from<DT_BF16>(c, out, to, in, n);
        break;
    case DT_F16:
        convert_bits_from<DT_F16>(c, out, to, in, n);
        break;
    default:
        convert_bits_from<DT_F32>(c, out, to, in, n);
        break;
    }
    LAUNCHED(c, "convert");
}
