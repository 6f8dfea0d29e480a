/*
 * Causal multi-head self-attention, flash style: the T x T scores are never
 * stored.  Two layouts, one set of kernels (struct attention_args): the
 * packed qkv[B,T,3C] (head h of q at columns h*D .. h*D+D-1, k at C + h*D,
 * v at 2C + h*D, D = C/NH), and separate q[B,T,NH*D], k[B,T,KV*D],
 * v[B,T,KV*D] where query head h reads key/value head h / (NH/KV)
 * (grouped-query attention; KV = NH is plain multi-head).  The kernels only
 * see a base pointer per tensor and the elements between two tokens.
 * Scale 1/sqrt(D).
 *
 * Forward keeps a running max m, sum l and output accumulator per query row
 * (online softmax) over tiles of 32 keys, and saves lse = m + log(l) per row,
 * lse[B,NH,T].  Backward recomputes p = exp(s - lse) from q, k and lse:
 *   Dvec_i = sum_d dout_i,d out_i,d             (scratch, B*NH*T floats)
 *   dp_ij  = dout_i . v_j,   ds_ij = p_ij (dp_ij - Dvec_i)
 *   dv_j  += sum_i p_ij dout_i,   dk_j += scale sum_i ds_ij q_i,
 *   dq_i  += scale sum_j ds_ij k_j
 * in two kernels (one per key tile for dk, dv; one per query tile for dq), so
 * every gradient element has one writer: no atomics, deterministic.  With
 * grouped queries a key tile's block walks the NH/KV query heads that share
 * its key/value head one after another, adding them in head order.
 *
 * One warp works on one row at a time; lane j takes key (or query) j of a
 * 32-wide tile for the dot products, and lane d takes dimensions d, d+32, ...
 * for the accumulators.  Tiles sit in shared memory as float; the rows lanes
 * index are padded to D+1 floats so those reads do not hit one bank.
 * Arithmetic is fp32 on CUDA cores (no tensor cores): correct first.
 */
#include "common.cuh"

#include <math.h>

enum {
    WARPS = 4,          /* per block */
    ROWS_PER_WARP = 4,  /* query (or key) rows each warp owns in a block */
    BLOCK_ROWS = WARPS * ROWS_PER_WARP,
    TILE = 32           /* keys (or queries) per tile: one per lane */
};

/* smem floats for each kernel, for head size D */
static size_t forward_smem(int D) { return (size_t)BLOCK_ROWS * (D + 1) + (size_t)TILE * (D + 1) + (size_t)TILE * D; }
static size_t dkdv_smem(int D) { return 2 * (size_t)BLOCK_ROWS * D + 2 * (size_t)TILE * (D + 1) + 2 * TILE; }
static size_t dq_smem(int D) { return 2 * (size_t)BLOCK_ROWS * D + 2 * (size_t)TILE * (D + 1); }

template <typename T>
__device__ __forceinline__ float load_or_zero(const T *base, size_t index, bool ok)
{
    return ok ? to_f32(base[index]) : 0.0f;
}

/* ---- forward ---------------------------------------------------------------- */

/* Past 80 lines as one kernel: its tile loads, barriers and accumulators share one loop nest. */
template <typename T, int DMAX>
__global__ void __launch_bounds__(WARPS * 32)
attention_forward_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int T_, int NH,
                         int KV, int D, size_t q_stride, size_t kv_stride, float scale,
                         int q_begin, int q_end)
{
    constexpr int DC = DMAX / 32;
    extern __shared__ float smem[];
    const int P = D + 1;
    float *Qs = smem;                      /* [BLOCK_ROWS][P] */
    float *Ks = Qs + BLOCK_ROWS * P;       /* [TILE][P] */
    float *Vs = Ks + TILE * P;             /* [TILE][D] */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kvh = h / (NH / KV);
    /* the block's query rows, within [q_begin, q_end) (a window: out holds its rows alone) */
    const int q0 = q_begin + blockIdx.x * BLOCK_ROWS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t C = (size_t)NH * D;
    const T *q_base = q + (size_t)b * T_ * q_stride + (size_t)h * D;
    const T *k_base = k + (size_t)b * T_ * kv_stride + (size_t)kvh * D;
    const T *v_base = v + (size_t)b * T_ * kv_stride + (size_t)kvh * D;

    for (int i = threadIdx.x; i < BLOCK_ROWS * D; i += blockDim.x) {
        int r = i / D, d = i % D;
        int tq = q0 + r;
        Qs[r * P + d] = load_or_zero(q_base, (size_t)tq * q_stride + d, tq < q_end);
    }

    float m[ROWS_PER_WARP], l[ROWS_PER_WARP], acc[ROWS_PER_WARP][DC];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DC; i++)
            acc[r][i] = 0.0f;
    }

    const int key_end = min(q_end, q0 + BLOCK_ROWS); /* the block's last query sees keys < key_end */
    for (int kt0 = 0; kt0 < key_end; kt0 += TILE) {
        __syncthreads(); /* the previous tile is no longer read (and Qs is written) */
        for (int i = threadIdx.x; i < TILE * D; i += blockDim.x) {
            int j = i / D, d = i % D;
            int tk = kt0 + j;
            size_t at = (size_t)tk * kv_stride + d;
            Ks[j * P + d] = load_or_zero(k_base, at, tk < q_end);
            Vs[j * D + d] = load_or_zero(v_base, at, tk < q_end);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; r++) {
            const int row = warp + WARPS * r, tq = q0 + row;
            if (tq >= q_end || kt0 > tq) /* the same for the whole warp */
                continue;
            const int key = kt0 + lane;
            float s = -INFINITY;
            if (key <= tq) {
                float dot = 0.0f;
                for (int d = 0; d < D; d++)
                    dot += Qs[row * P + d] * Ks[lane * P + d];
                s = dot * scale;
            }
            /* lane 0's key kt0 <= tq is always valid, so the max is finite */
            float m_new = fmaxf(m[r], warp_max(s));
            float p = key <= tq ? expf(s - m_new) : 0.0f;
            float correction = expf(m[r] - m_new); /* 0 on the first tile */
            l[r] = l[r] * correction + warp_sum(p);
            m[r] = m_new;
#pragma unroll
            for (int i = 0; i < DC; i++)
                acc[r][i] *= correction;
            const int j_end = min(TILE, tq - kt0 + 1);
            for (int j = 0; j < j_end; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int i = 0; i < DC; i++) {
                    int d = lane + 32 * i;
                    if (d < D)
                        acc[r][i] += pj * Vs[j * D + d];
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        const int tq = q0 + warp + WARPS * r;
        if (tq >= q_end)
            continue;
        float inv = 1.0f / l[r];
        T *o = out + ((size_t)b * (q_end - q_begin) + (tq - q_begin)) * C + (size_t)h * D;
#pragma unroll
        for (int i = 0; i < DC; i++) {
            int d = lane + 32 * i;
            if (d < D)
                o[d] = from_f32<T>(acc[r][i] * inv);
        }
        if (lane == 0)
            lse[((size_t)b * NH + h) * T_ + tq] = m[r] + logf(l[r]);
    }
}

/* ---- backward --------------------------------------------------------------- */

/* Dvec[b,h,t] = dout[b,t,h,:] . out[b,t,h,:]: one warp per (b, t, h) */
template <typename T>
__global__ void attention_dvec_kernel(float *dvec, const float *dout, const T *out, int B, int T_,
                                      int C, int NH)
{
    const int D = C / NH;
    size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    size_t total = (size_t)B * T_ * NH;
    if (warp >= total)
        return;
    int h = (int)(warp % NH);
    size_t bt = warp / NH; /* b * T + t */
    size_t at = bt * C + (size_t)h * D;
    float sum = 0.0f;
    for (int d = lane; d < D; d += 32)
        sum += dout[at + d] * to_f32(out[at + d]);
    sum = warp_sum(sum);
    if (lane == 0) {
        size_t b = bt / T_, t = bt % T_;
        dvec[(b * NH + h) * T_ + t] = sum;
    }
}

/* dk and dv of BLOCK_ROWS keys of one key/value head, over the query tiles
 * that can see them, of each query head that reads this key/value head */
/* Past 80 lines as one kernel: its tile loads, barriers and accumulators share one loop nest. */
template <typename T, int DMAX>
__global__ void __launch_bounds__(WARPS * 32)
attention_dkdv_kernel(float *dk, float *dv, const float *dout, const T *q, const T *k, const T *v,
                      const float *lse, const float *dvec, int T_, int NH, int KV, int D,
                      size_t q_stride, size_t kv_stride, float scale)
{
    constexpr int DC = DMAX / 32;
    extern __shared__ float smem[];
    const int P = D + 1;
    float *Ks = smem;                     /* [BLOCK_ROWS][D] */
    float *Vs = Ks + BLOCK_ROWS * D;      /* [BLOCK_ROWS][D] */
    float *Qs = Vs + BLOCK_ROWS * D;      /* [TILE][P] */
    float *dOs = Qs + TILE * P;           /* [TILE][P] */
    float *lse_s = dOs + TILE * P;        /* [TILE] */
    float *dvec_s = lse_s + TILE;         /* [TILE] */
    const int bkv = blockIdx.y, b = bkv / KV, kvh = bkv % KV, group = NH / KV;
    const int k0 = blockIdx.x * BLOCK_ROWS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t C = (size_t)NH * D;
    const size_t kv_offset = (size_t)b * T_ * kv_stride + (size_t)kvh * D;
    const T *k_base = k + kv_offset;
    const T *v_base = v + kv_offset;

    for (int i = threadIdx.x; i < BLOCK_ROWS * D; i += blockDim.x) {
        int r = i / D, d = i % D;
        int tk = k0 + r;
        size_t at = (size_t)tk * kv_stride + d;
        Ks[r * D + d] = load_or_zero(k_base, at, tk < T_);
        Vs[r * D + d] = load_or_zero(v_base, at, tk < T_);
    }

    float dk_acc[ROWS_PER_WARP][DC], dv_acc[ROWS_PER_WARP][DC];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++)
#pragma unroll
        for (int i = 0; i < DC; i++)
            dk_acc[r][i] = dv_acc[r][i] = 0.0f;

    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const T *q_base = q + (size_t)b * T_ * q_stride + (size_t)h * D;
        const float *do_base = dout + (size_t)b * T_ * C + (size_t)h * D;
        const float *lse_row = lse + ((size_t)b * NH + h) * T_;
        const float *dvec_row = dvec + ((size_t)b * NH + h) * T_;
        for (int qt0 = (k0 / TILE) * TILE; qt0 < T_; qt0 += TILE) {
            __syncthreads();
            for (int i = threadIdx.x; i < TILE * D; i += blockDim.x) {
                int j = i / D, d = i % D;
                int tq = qt0 + j;
                Qs[j * P + d] = load_or_zero(q_base, (size_t)tq * q_stride + d, tq < T_);
                dOs[j * P + d] = tq < T_ ? do_base[(size_t)tq * C + d] : 0.0f;
            }
            for (int j = threadIdx.x; j < TILE; j += blockDim.x) {
                int tq = qt0 + j;
                lse_s[j] = tq < T_ ? lse_row[tq] : 0.0f;
                dvec_s[j] = tq < T_ ? dvec_row[tq] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < ROWS_PER_WARP; r++) {
                const int kr = warp + WARPS * r, tk = k0 + kr;
                if (tk >= T_ || qt0 + TILE - 1 < tk) /* no query of this tile sees key tk */
                    continue;
                const int tq = qt0 + lane;
                const bool valid = tq >= tk && tq < T_;
                float p = 0.0f, ds = 0.0f;
                if (valid) {
                    float dot = 0.0f, dp = 0.0f;
                    for (int d = 0; d < D; d++) {
                        dot += Qs[lane * P + d] * Ks[kr * D + d];
                        dp += dOs[lane * P + d] * Vs[kr * D + d];
                    }
                    p = expf(dot * scale - lse_s[lane]);
                    ds = p * (dp - dvec_s[lane]);
                }
                for (int j = 0; j < TILE; j++) {
                    float pj = __shfl_sync(0xffffffffu, p, j);
                    float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
                    for (int i = 0; i < DC; i++) {
                        int d = lane + 32 * i;
                        if (d < D) {
                            dv_acc[r][i] += pj * dOs[j * P + d];
                            dk_acc[r][i] += dsj * Qs[j * P + d];
                        }
                    }
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        const int tk = k0 + warp + WARPS * r;
        if (tk >= T_)
            continue;
        const size_t at = kv_offset + (size_t)tk * kv_stride;
#pragma unroll
        for (int i = 0; i < DC; i++) {
            int d = lane + 32 * i;
            if (d < D) {
                /* k and v may be one tensor: this thread is the only writer of both */
                if (dk)
                    dk[at + d] += scale * dk_acc[r][i];
                if (dv)
                    dv[at + d] += dv_acc[r][i];
            }
        }
    }
}

/* dq of BLOCK_ROWS queries, over the key tiles they see */
/* Past 80 lines as one kernel: its tile loads, barriers and accumulators share one loop nest. */
template <typename T, int DMAX>
__global__ void __launch_bounds__(WARPS * 32)
attention_dq_kernel(float *dq, const float *dout, const T *q, const T *k, const T *v,
                    const float *lse, const float *dvec, int T_, int NH, int KV, int D,
                    size_t q_stride, size_t kv_stride, float scale)
{
    constexpr int DC = DMAX / 32;
    extern __shared__ float smem[];
    const int P = D + 1;
    float *Qs = smem;                     /* [BLOCK_ROWS][D] */
    float *dOs = Qs + BLOCK_ROWS * D;     /* [BLOCK_ROWS][D] */
    float *Ks = dOs + BLOCK_ROWS * D;     /* [TILE][P] */
    float *Vs = Ks + TILE * P;            /* [TILE][P] */
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kvh = h / (NH / KV);
    const int q0 = blockIdx.x * BLOCK_ROWS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t C = (size_t)NH * D;
    const size_t q_offset = (size_t)b * T_ * q_stride + (size_t)h * D;
    const T *q_base = q + q_offset;
    const T *k_base = k + (size_t)b * T_ * kv_stride + (size_t)kvh * D;
    const T *v_base = v + (size_t)b * T_ * kv_stride + (size_t)kvh * D;
    const float *do_base = dout + (size_t)b * T_ * C + (size_t)h * D;

    for (int i = threadIdx.x; i < BLOCK_ROWS * D; i += blockDim.x) {
        int r = i / D, d = i % D;
        int tq = q0 + r;
        Qs[r * D + d] = load_or_zero(q_base, (size_t)tq * q_stride + d, tq < T_);
        dOs[r * D + d] = tq < T_ ? do_base[(size_t)tq * C + d] : 0.0f;
    }

    float dq_acc[ROWS_PER_WARP][DC], row_lse[ROWS_PER_WARP], row_dvec[ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        const int tq = q0 + warp + WARPS * r;
        row_lse[r] = tq < T_ ? lse[(size_t)bh * T_ + tq] : 0.0f;
        row_dvec[r] = tq < T_ ? dvec[(size_t)bh * T_ + tq] : 0.0f;
#pragma unroll
        for (int i = 0; i < DC; i++)
            dq_acc[r][i] = 0.0f;
    }

    const int key_end = min(T_, q0 + BLOCK_ROWS);
    for (int kt0 = 0; kt0 < key_end; kt0 += TILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < TILE * D; i += blockDim.x) {
            int j = i / D, d = i % D;
            int tk = kt0 + j;
            size_t at = (size_t)tk * kv_stride + d;
            Ks[j * P + d] = load_or_zero(k_base, at, tk < T_);
            Vs[j * P + d] = load_or_zero(v_base, at, tk < T_);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; r++) {
            const int row = warp + WARPS * r, tq = q0 + row;
            if (tq >= T_ || kt0 > tq)
                continue;
            const int key = kt0 + lane;
            float ds = 0.0f;
            if (key <= tq) {
                float dot = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; d++) {
                    dot += Qs[row * D + d] * Ks[lane * P + d];
                    dp += dOs[row * D + d] * Vs[lane * P + d];
                }
                float p = expf(dot * scale - row_lse[r]);
                ds = p * (dp - row_dvec[r]);
            }
            const int j_end = min(TILE, tq - kt0 + 1);
            for (int j = 0; j < j_end; j++) {
                float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
                for (int i = 0; i < DC; i++) {
                    int d = lane + 32 * i;
                    if (d < D)
                        dq_acc[r][i] += dsj * Ks[j * P + d];
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        const int tq = q0 + warp + WARPS * r;
        if (tq >= T_)
            continue;
        float *dq_out = dq + q_offset + (size_t)tq * q_stride;
#pragma unroll
        for (int i = 0; i < DC; i++) {
            int d = lane + 32 * i;
            if (d < D)
                dq_out[d] += scale * dq_acc[r][i];
        }
    }
}

/* ---- host side ---------------------------------------------------------------- */

/* DMAX for head size D, 0 when too large */
static int head_bucket(int D)
{
    return D <= 0 ? 0 : D <= 32 ? 32 : D <= 64 ? 64 : D <= 128 ? 128 : D <= ATTENTION_MAX_HEAD ? 256 : 0;
}

int cuda_attention_head_ok(int D) { return head_bucket(D) != 0; }

template <typename T, int DMAX> static cudaError_t allow_smem(void)
{
    cudaError_t e;
    e = cudaFuncSetAttribute(attention_forward_kernel<T, DMAX>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)(forward_smem(DMAX) * sizeof(float)));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attention_dkdv_kernel<T, DMAX>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)(dkdv_smem(DMAX) * sizeof(float)));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attention_dq_kernel<T, DMAX>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)(dq_smem(DMAX) * sizeof(float)));
    return e;
}

template <typename T> static cudaError_t allow_smem_all(void)
{
    cudaError_t e = allow_smem<T, 32>();
    if (e == cudaSuccess)
        e = allow_smem<T, 64>();
    if (e == cudaSuccess)
        e = allow_smem<T, 128>();
    if (e == cudaSuccess)
        e = allow_smem<T, 256>();
    return e;
}

cudaError_t cuda_attention_init(void)
{
    cudaError_t e = allow_smem_all<float>();
    if (e == cudaSuccess)
        e = allow_smem_all<__nv_bfloat16>();
    if (e == cudaSuccess)
        e = allow_smem_all<__half>();
    return e;
}

size_t cuda_attention_scratch_floats(int B, int T, int NH)
{
    return (size_t)B * NH * T; /* Dvec */
}

/* supports_op refuses these shapes before a run starts; this keeps a graph
 * that skipped it from launching kernels that would read out of bounds */
static int shape_ok(struct cuda_context *c, const struct attention_args *a)
{
    if (a->NH > 0 && a->KV > 0 && a->NH % a->KV == 0 && head_bucket(a->D))
        return 1;
    cuda_note(c, cudaErrorInvalidValue,
              "attention: the CUDA kernels take head sizes up to 256 and key/value heads "
              "dividing the heads");
    return 0;
}

template <typename T, int DMAX>
static void forward_launch(struct cuda_context *c, const struct attention_args *a, void *out,
                           float *lse)
{
    int q_begin = a->q_end > 0 ? a->q_begin : 0, q_end = a->q_end > 0 ? a->q_end : a->T;
    dim3 grid((unsigned)((q_end - q_begin + BLOCK_ROWS - 1) / BLOCK_ROWS), (unsigned)(a->B * a->NH));
    attention_forward_kernel<T, DMAX><<<grid, WARPS * 32, forward_smem(a->D) * sizeof(float), c->compute>>>(
        (T *)out, lse, (const T *)a->q, (const T *)a->k, (const T *)a->v, a->T, a->NH, a->KV, a->D,
        a->q_stride, a->kv_stride, 1.0f / sqrtf((float)a->D), q_begin, q_end);
    LAUNCHED(c, "attention forward");
}

template <typename T>
static void attention_forward(struct cuda_context *c, const struct attention_args *a, void *out,
                              float *lse)
{
    switch (head_bucket(a->D)) {
    case 32: forward_launch<T, 32>(c, a, out, lse); break;
    case 64: forward_launch<T, 64>(c, a, out, lse); break;
    case 128: forward_launch<T, 128>(c, a, out, lse); break;
    default: forward_launch<T, 256>(c, a, out, lse); break;
    }
}

void cuda_attention_forward(struct cuda_context *c, int dt, const struct attention_args *a,
                            void *out, float *lse)
{
    if (a->B <= 0 || a->T <= 0 || !shape_ok(c, a))
        return;
    DISPATCH_STORAGE(dt, attention_forward, c, a, out, lse);
}

template <typename T, int DMAX>
static void backward_launch(struct cuda_context *c, const struct attention_args *a,
                            const float *dout, const float *lse, const float *dvec)
{
    float scale = 1.0f / sqrtf((float)a->D);
    unsigned tiles = (unsigned)((a->T + BLOCK_ROWS - 1) / BLOCK_ROWS);
    if (a->dk || a->dv) {
        dim3 grid(tiles, (unsigned)(a->B * a->KV));
        attention_dkdv_kernel<T, DMAX><<<grid, WARPS * 32, dkdv_smem(a->D) * sizeof(float), c->compute>>>(
            a->dk, a->dv, dout, (const T *)a->q, (const T *)a->k, (const T *)a->v, lse, dvec, a->T,
            a->NH, a->KV, a->D, a->q_stride, a->kv_stride, scale);
        LAUNCHED(c, "attention backward (dk, dv)");
    }
    if (a->dq) {
        dim3 grid(tiles, (unsigned)(a->B * a->NH));
        attention_dq_kernel<T, DMAX><<<grid, WARPS * 32, dq_smem(a->D) * sizeof(float), c->compute>>>(
            a->dq, dout, (const T *)a->q, (const T *)a->k, (const T *)a->v, lse, dvec, a->T, a->NH,
            a->KV, a->D, a->q_stride, a->kv_stride, scale);
        LAUNCHED(c, "attention backward (dq)");
    }
}

template <typename T>
static void attention_backward(struct cuda_context *c, const struct attention_args *a,
                               const float *dout, const void *out, const float *lse, float *dvec)
{
    size_t warps = (size_t)a->B * a->T * a->NH;
    unsigned blocks = (unsigned)((warps * 32 + 255) / 256);
    attention_dvec_kernel<T><<<blocks, 256, 0, c->compute>>>(dvec, dout, (const T *)out, a->B, a->T,
                                                             a->NH * a->D, a->NH);
    LAUNCHED(c, "attention backward (dout . out)");
    switch (head_bucket(a->D)) {
    case 32: backward_launch<T, 32>(c, a, dout, lse, dvec); break;
    case 64: backward_launch<T, 64>(c, a, dout, lse, dvec); break;
    case 128: backward_launch<T, 128>(c, a, dout, lse, dvec); break;
    default: backward_launch<T, 256>(c, a, dout, lse, dvec); break;
    }
}

void cuda_attention_backward(struct cuda_context *c, int dt, const struct attention_args *a,
                             const float *dout, const void *out, const float *lse, float *scratch)
{
    if ((!a->dq && !a->dk && !a->dv) || a->B <= 0 || a->T <= 0 || !shape_ok(c, a))
        return;
    DISPATCH_STORAGE(dt, attention_backward, c, a, dout, out, lse, scratch);
}
