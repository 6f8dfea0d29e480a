/*
 * The CUDA backend's shared pieces: the context every iface call gets, the
 * storage-type helpers the kernels are templated on, and the entry points
 * each .cu file gives the dispatcher (backend.cu).
 *
 * Conventions are those of kernels/cpu/kernels.h: row-major, backward
 * ACCUMULATES into gradients, a NULL gradient is skipped.  Everything runs on
 * one compute stream; nothing here allocates or waits for the device, except
 * the iface calls whose result the host needs (download, sum_squares,
 * count_correct, synchronize).
 */
#ifndef TR_CUDA_COMMON_CUH
#define TR_CUDA_COMMON_CUH

#include <pthread.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../backend.h"
#include "../nf4.h"

/* rope's Llama 3.1 frequency scaling, the CPU's own arithmetic: each product
 * and sum rounded on its own (nvcc would fuse them) */
#define TR_ROPE_FN __device__ static inline
#define TR_ROPE_MUL(a, b) __fmul_rn((a), (b))
#define TR_ROPE_ADD(a, b) __fadd_rn((a), (b))
#include "../rope_scaling.h"
}

/* storage dtypes, as enum tr_dtype (include/trainrun/plugin.h) */
enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2, DT_I32 = 3, DT_NF4 = 4 };

enum { STAGE_SLOTS = 2 };
#define STAGE_BYTES ((size_t)8 << 20)      /* pinned upload staging, per slot */
#define LT_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt workspace */
enum { SUM_BLOCKS = 256, SUM_THREADS = 256 }; /* fixed: the sum's order depends on n only */

struct gemm_cache; /* gemm.cu */
struct dnn_state;  /* conv.cu */
struct vmm;        /* backend.cu: memory that discard gives back */

struct cuda_context {
    int device;
    cudaDeviceProp prop;
    cudaStream_t compute, copy;
    cudaEvent_t compute_mark;            /* "compute has reached here", for the copy stream */
    void *stage[STAGE_SLOTS];            /* pinned */
    cudaEvent_t stage_done[STAGE_SLOTS]; /* the DMA out of slot i has finished */
    int stage_next;
    /* upload comes from the compute thread and (an offloaded update shared
     * by a shard level, optim.h) the communication thread: the staging
     * slots and compute_mark are taken under this lock */
    pthread_mutex_t upload_lock;
    double *sum_partials;                /* device, SUM_BLOCKS + 1 */
    double *sum_result;                  /* pinned host, 1 */
    unsigned long long *counts;          /* device, 2: correct, valid */
    unsigned long long *counts_host;     /* pinned host, 2 */
    void *lt_workspace;                  /* device, LT_WORKSPACE_BYTES */
    struct gemm_cache *gemm;
    int allow_tf32;                      /* the graph's: fp32 GEMMs in tf32 (gemm.cu) */
    struct dnn_state *dnn;               /* cuDNN, NULL when it did not load (conv.cu) */
    size_t dnn_version;
    char dnn_why[320];                   /* why dnn is NULL */
    int dnn_refusal_said;                /* a conv2d refused for want of cuDNN was reported */
    cudaError_t first_error;             /* sticky: reported once, turns sum_squares into NaN */
    struct vmm *vmm;                     /* NULL: no virtual memory management (no discard) */
};

/* Records a failed CUDA call (the first one is printed with `what`). */
void cuda_note(struct cuda_context *c, cudaError_t e, const char *what);
#define CUDA_NOTE(c, call) cuda_note((c), (call), #call)
/* After a kernel launch: catches launch-configuration errors. */
#define LAUNCHED(c, what) cuda_note((c), cudaGetLastError(), (what))

/* ---- storage helpers ---------------------------------------------------- */
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

/* Calls F<T>(args...) for the storage type `dtype`. */
#define DISPATCH_STORAGE(dtype, F, ...)                                                           \
    do {                                                                                           \
        switch (dtype) {                                                                           \
        case DT_BF16:                                                                              \
            F<__nv_bfloat16>(__VA_ARGS__);                                                         \
            break;                                                                                 \
        case DT_F16:                                                                               \
            F<__half>(__VA_ARGS__);                                                                \
            break;                                                                                 \
        default:                                                                                   \
            F<float>(__VA_ARGS__);                                                                 \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_double(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A grid for n elements, capped so huge tensors use grid-stride loops. */
static inline unsigned grid_for(size_t n, unsigned threads)
{
    size_t blocks = (n + threads - 1) / threads;
    if (blocks > 65535u * 8u)
        blocks = 65535u * 8u;
    return blocks ? (unsigned)blocks : 1u;
}

/* ---- nodes.cu: a graph node as kernel launches (backend.cu's iface) ------ */
size_t cuda_scratch_floats(void *ctx, const struct tr_graph *g, const struct tr_node *n);
void cuda_forward(void *ctx, struct tr_graph *g, const struct tr_node *n);
void cuda_backward(void *ctx, struct tr_graph *g, const struct tr_node *n);
int cuda_supports_op(void *ctx, const struct tr_graph *g, const struct tr_node *n);
int cuda_supports_rows(void *ctx, const struct tr_graph *g, const struct tr_node *n);

/* ---- ops.cu (elementwise, rope, embedding, bias), norms.cu, step.cu (loss, optimizers) */
/* ids outside [0,V) read as zero rows and are skipped in backward (the
 * core checks them; this keeps a bad id from faulting the device) */
void cuda_embedding_forward(struct cuda_context *c, int dt, void *out, const int32_t *idx,
                            const void *table, int N, int C, int V);
void cuda_embedding_backward(struct cuda_context *c, float *dtable, const float *dout,
                             const int32_t *idx, int N, int C, int V);
void cuda_add_rows_forward(struct cuda_context *c, int dt, void *out, const void *x, const void *p,
                           int B, int T, int C);
void cuda_add_rows_backward(struct cuda_context *c, float *dx, float *dp, const float *dout, int B,
                            int T, int C);
void cuda_add_forward(struct cuda_context *c, int dt, void *out, const void *a, const void *b,
                      size_t n);
void cuda_add_backward(struct cuda_context *c, float *da, float *db, const float *dout, size_t n);
void cuda_gelu_forward(struct cuda_context *c, int dt, void *out, const void *inp, size_t n);
void cuda_gelu_backward(struct cuda_context *c, int dt, float *dinp, const void *inp,
                        const float *dout, size_t n);
void cuda_relu_forward(struct cuda_context *c, int dt, void *out, const void *inp, size_t n);
void cuda_relu_backward(struct cuda_context *c, int dt, float *dinp, const void *inp,
                        const float *dout, size_t n);
/* out = silu(gate) * up */
void cuda_swiglu_forward(struct cuda_context *c, int dt, void *out, const void *gate,
                         const void *up, size_t n);
void cuda_swiglu_backward(struct cuda_context *c, int dt, float *dgate, float *dup,
                          const void *gate, const void *up, const float *dout, size_t n);
void cuda_scale_forward(struct cuda_context *c, int dt, void *out, const void *inp, float scale,
                        size_t n);
void cuda_dropout_forward(struct cuda_context *c, int dt, void *out, const void *inp, size_t n,
                          float p, uint64_t seed, uint64_t node);
void cuda_dropout_backward(struct cuda_context *c, float *dinp, const float *dout, size_t n, float p,
                           uint64_t seed, uint64_t node);
void cuda_scale_backward(struct cuda_context *c, float *dinp, const float *dout, float scale,
                         size_t n);
/* norms.cu: dst[c] += sum over k < parts of partial[k * C + c], in k order
 * (the norms' weight gradients and the bias gradient) */
void cuda_column_sum(struct cuda_context *c, float *dst, const float *partial, int parts, int C);
void cuda_layernorm_forward(struct cuda_context *c, int dt, void *out, float *mean, float *rstd,
                            const void *inp, const void *w, const void *b, int N, int C, float eps);
size_t cuda_layernorm_scratch_floats(int N, int C);
void cuda_layernorm_backward(struct cuda_context *c, int dt, float *dinp, float *dw, float *db,
                             const float *dout, const void *inp, const void *w, const float *mean,
                             const float *rstd, int N, int C, float *scratch);
void cuda_rmsnorm_forward(struct cuda_context *c, int dt, void *out, float *rstd, const void *inp,
                          const void *w, int N, int C, float eps);
size_t cuda_rmsnorm_scratch_floats(int N, int C);
void cuda_rmsnorm_backward(struct cuda_context *c, int dt, float *dinp, float *dw,
                           const float *dout, const void *inp, const void *w, const float *rstd,
                           int N, int C, float *scratch);
/* x[B,T,H*D]: H heads of D (even) channels; scratch holds the angles' table;
 * sc: Llama 3.1's frequency scaling (kernels/rope_scaling.h; factor 0: none);
 * forward's row t is at position pos0 + t (a window of a longer sequence) */
size_t cuda_rope_scratch_floats(int T, int D);
void cuda_rope_forward(struct cuda_context *c, int dt, void *out, const void *inp, int B, int T,
                       int H, int D, float theta, const struct tr_rope_scaling *sc, float *scratch,
                       int pos0);
void cuda_rope_backward(struct cuda_context *c, float *dinp, const float *dout, int B, int T,
                        int H, int D, float theta, const struct tr_rope_scaling *sc, float *scratch);
size_t cuda_cross_entropy_scratch_floats(int N);
void cuda_cross_entropy_forward(struct cuda_context *c, int dt, void *loss, float *lse,
                                const void *logits, const int32_t *targets, int N, int V,
                                int ignore_index, float *scratch);
void cuda_cross_entropy_backward(struct cuda_context *c, int dt, float *dlogits, const void *logits,
                                 const float *lse, const int32_t *targets, float dloss, int N,
                                 int V, int ignore_index, float *scratch);
/* out[m*ldc + n] += bias[n] for m < M, n < N (out and bias of dtype dt) */
void cuda_add_bias(struct cuda_context *c, int dt, void *out, const void *bias, int M, int N,
                   int ldc);
size_t cuda_bias_scratch_floats(int N, int OC);
void cuda_bias_backward(struct cuda_context *c, float *dbias, const float *dout, int N, int OC,
                        float *scratch);
/* out = in converted to dtype `to` (from float or another storage type) */
void cuda_convert(struct cuda_context *c, void *out, int to, const void *in, int from, size_t n);
/* The iface's convert (kernels/backend.h): from, to among DT_F32, DT_BF16,
 * DT_F16, with the CPU backend's bits (kernels/cpu/convert.c: NaN kept as
 * the CPU keeps it, where cuda_convert's cvt gives the canonical NaN);
 * 16-bit pointers 2-byte aligned, any n; queued on the compute stream. */
void cuda_convert_bits(struct cuda_context *c, void *out, int to, const void *in, int from,
                       size_t n);
void cuda_adamw(struct cuda_context *c, float *p, const float *g, float *m, float *v, size_t n,
                const struct tr_adamw_args *a);
void cuda_sgd(struct cuda_context *c, float *p, const float *g, float *buf, size_t n,
              const struct tr_sgd_args *a);
double cuda_sum_squares(struct cuda_context *c, const float *x, size_t n);
int64_t cuda_count_correct(struct cuda_context *c, const float *logits, const int32_t *targets,
                           int N, int V, int ignore_index, int64_t *n_valid);

/* ---- nf4.cu: frozen weights (TR_ROLE_FROZEN) in their storage types ------ */
/* out = frozen tensor t in storage type `to` (fp32, bf16, fp16): NF4
 * dequantised as tr_nf4_dequantize, bit for bit, then rounded to `to` */
void cuda_frozen_convert(struct cuda_context *c, void *out, int to, const struct tr_tensor *t);
/* embedding rows of a 16-bit table (table_dt) into out of type out_dt */
void cuda_frozen_embedding_forward(struct cuda_context *c, int out_dt, void *out,
                                   const int32_t *idx, const void *table, int table_dt, int N,
                                   int C, int V);
/* the iface's store_frozen and load_frozen */
int cuda_store_frozen(void *ctx, const struct tr_tensor *t, const float *host, tr_err *err);
int cuda_load_frozen(void *ctx, const struct tr_tensor *t, float *host, tr_err *err);

/* ---- attention.cu ------------------------------------------------------- */
/* Largest head size the kernels take. */
enum { ATTENTION_MAX_HEAD = 256 };
/* One attention node's tensors as the kernels read them: token t of batch
 * row b, head h starts at q + (b*T + t) * q_stride + h*D, and key/value head
 * h / (NH/KV) at k (v) + (b*T + t) * kv_stride + (h / (NH/KV)) * D.  The
 * packed qkv[B,T,3C] is q = qkv, k = qkv + C, v = qkv + 2C, both strides 3C,
 * KV = NH.  The gradients (fp32, NULL when not wanted) have the same layout;
 * the output is [B,T,NH*D]. */
struct attention_args {
    int B, T, NH, KV, D;
    /* forward: query rows [q_begin, q_end) alone, against keys [0, q_end),
     * out holding those rows alone ([B, q_end - q_begin, NH*D]; a window of
     * rows, sample's key/value cache); q_end 0: every row */
    int q_begin, q_end;
    size_t q_stride, kv_stride; /* elements */
    const void *q, *k, *v;      /* storage dtype */
    float *dq, *dk, *dv;
};
cudaError_t cuda_attention_init(void); /* shared-memory limits, once in open() */
int cuda_attention_head_ok(int D);     /* 0 < D <= ATTENTION_MAX_HEAD */
size_t cuda_attention_scratch_floats(int B, int T, int NH);
void cuda_attention_forward(struct cuda_context *c, int dt, const struct attention_args *a,
                            void *out, float *lse);
void cuda_attention_backward(struct cuda_context *c, int dt, const struct attention_args *a,
                             const float *dout, const void *out, const float *lse, float *scratch);

/* ---- gemm.cu: cuBLASLt, loaded at open() -------------------------------- */
/* Why cuBLASLt could not be loaded (NULL when it was); fills *version. */
const char *cuda_gemm_open(struct cuda_context *c, size_t *version);
void cuda_gemm_close(struct cuda_context *c);
/* Row-major C[M,N] = alpha op(A) op(B) + beta C (+ bias[N] per row when
 * bias != NULL), `batch` products `stride_*` elements apart.  A and B are of
 * dtype ab_dt, C and the bias of c_dt; fp32 accumulation. */
void cuda_gemm(struct cuda_context *c, int trans_a, int trans_b, int M, int N, int K, float alpha,
               const void *A, int lda, long long stride_a, const void *B, int ldb,
               long long stride_b, float beta, void *C, int ldc, long long stride_c, int batch,
               int ab_dt, int c_dt, const void *bias);


/* ---- pool.cu: pooling and batch norm on channel-last x[B,H,W,C] ------------ */
struct pool_args {
    int B, H, W, C, OH, OW, KH, KW, SH, SW, PH, PW;
};
void cuda_maxpool_forward(struct cuda_context *c, int dt, void *out, const void *x,
                          const struct pool_args *p);
void cuda_maxpool_backward(struct cuda_context *c, int dt, float *dx, const void *x,
                           const float *dout, const struct pool_args *p);
void cuda_avgpool_forward(struct cuda_context *c, int dt, void *out, const void *x,
                          const struct pool_args *p);
void cuda_avgpool_backward(struct cuda_context *c, float *dx, const float *dout,
                           const struct pool_args *p);
void cuda_global_avgpool_forward(struct cuda_context *c, int dt, void *out, const void *x, int B,
                                 int HW, int C);
void cuda_global_avgpool_backward(struct cuda_context *c, float *dx, const float *dout, int B,
                                  int HW, int C);
/* x[N,C]; running[2,C] (mean, unbiased variance) is updated when `update` */
size_t cuda_batchnorm_scratch_floats(int N, int C);
void cuda_batchnorm_forward(struct cuda_context *c, int dt, void *out, float *mean, float *rstd,
                            float *running, const void *x, const void *w, const void *b, int N,
                            int C, float eps, float momentum, int training, int update,
                            float *scratch);
void cuda_batchnorm_backward(struct cuda_context *c, int dt, float *dx, float *dw, float *db,
                             const float *dout, const void *x, const void *w, const float *mean,
                             const float *rstd, int N, int C, int training, float *scratch);

/* ---- conv.cu: convolutions through cuDNN, loaded at open() ------------------ */
/* One conv2d node: x[B,H,W,IC], w[OC,KH,KW,IC/groups], (b[OC]) and out
 * [B,OH,OW,OC] in storage dtype dt; gradients fp32 (NULL: not wanted). */
struct conv_args {
    int B, H, W, IC, OC, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, groups;
    int dt;       /* storage */
    int compute;  /* 16-bit: x, w and dy are rounded to it first */
    int tf32;     /* fp32 may run in tf32 (the policy's allow_tf32) */
    int has_bias;
    const void *x, *w, *b;
    void *out;
    const float *dout;
    float *dx, *dw, *db;
};
/* Loads cuDNN into c->dnn, or says why not in c->dnn_why (the backend opens either way). */
void cuda_dnn_open(struct cuda_context *c);
void cuda_dnn_close(struct cuda_context *c);
/* doctor's line: the cuDNN this build would load, and what for */
int cuda_dnn_describe(char *buf, size_t size);
/* NULL when cuDNN runs this convolution, else why not */
const char *cuda_conv_check(struct cuda_context *c, const struct conv_args *a);
size_t cuda_conv_scratch_floats(struct cuda_context *c, const struct conv_args *a);
void cuda_conv_forward(struct cuda_context *c, const struct conv_args *a, float *scratch,
                       size_t scratch_floats);
void cuda_conv_backward(struct cuda_context *c, const struct conv_args *a, float *scratch,
                        size_t scratch_floats);

#endif
