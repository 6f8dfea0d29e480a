/*
 * CPU kernels: the math, and nothing but the math.
 *
 * Conventions (every function below):
 *   - row-major, contiguous float arrays; N is the number of rows (B*T);
 *   - backward functions ACCUMULATE into gradient outputs (+=), so one
 *     tensor feeding several ops gets the sum of their gradients.  Those
 *     that take `write` (bit k: the gradient of the op's k-th input, in the
 *     graph node's order) WRITE the gradients it names instead (=, their old
 *     contents ignored): the first writer of a gradient in backward, which
 *     then need not be zeroed first (the core's writes_grad contract,
 *     kernels/backend.h).  A written gradient has the bits of one accumulated
 *     onto zeros.  A NULL gradient pointer means "not needed" and is skipped;
 *   - no allocation: an op that needs scratch says how much through a
 *     *_scratch_floats() function and takes it as an argument;
 *   - threads: OpenMP inside each kernel; results do not depend on the
 *     thread count (reductions are ordered), so runs are reproducible.
 */
#ifndef TR_CPU_KERNELS_H
#define TR_CPU_KERNELS_H

#include "../backend.h"
#include "../host.h" /* 16-bit conversions, the sampling softmax */

#include <stddef.h>
#include <stdint.h>

/* ---- GEMM --------------------------------------------------------------
 * C[M,N] = alpha * op(A) op(B) + beta * C, row-major; op(X) = X or X^T.
 * A is M x K after op, B is K x N after op. */
void tr_cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* The same product on the calling thread only, for use inside a parallel
 * region (e.g. one head per thread).  Bitwise equal to tr_cpu_sgemm. */
void tr_cpu_sgemm_serial(int trans_a, int trans_b, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C,
                         int ldc);

/* C = C0 + op(A) op(B) (C0 in C's layout, ldc; it may be C itself): each
 * tile's product goes into a buffer of the thread's and C0 is added as it
 * is stored, while the buffer is in cache (gemm.c): one pass over C where
 * a product and then an add make three.  Bit for bit C0 plus tr_cpu_sgemm's
 * product. */
void tr_cpu_sgemm_onto(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                       const float *B, int ldb, const float *C0, float *C, int ldc);

/* Whether tr_cpu_sgemm runs C[M,N] = A B^T (B stored transposed, [N, K])
 * on a copy of B in plain rows, K x tr_cpu_sgemm_plain_b_ld(N) floats, that
 * it makes on every call; a caller that holds such a copy already (a frozen
 * weight's, frozen_t.c) passes it with trans_b 0 and that ld instead, for the
 * same bits. */
int tr_cpu_sgemm_plain_b(int M, int N, int K);
int tr_cpu_sgemm_plain_b_ld(int N);

/* The same products with bf16 inputs (bit patterns, as tr_f32_to_bf16 makes
 * them), fp32 products, sums and C; alpha 1, beta 0 or 1.  oneDNN matmul
 * primitives run them, one per tile of the sgemm's grid, so results do not
 * depend on the thread count either (gemm.c).  Products of bf16 numbers are
 * exact in fp32, so they differ from tr_cpu_sgemm on the same numbers
 * rounded to bf16 only in the order of the sums.  Callers check
 * tr_cpu_gemm_bf16_available() first: oneDNN has no bf16 matmul for CPUs
 * without AVX-512. */
void tr_cpu_gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A, int lda,
                      const uint16_t *B, int ldb, float beta, float *C, int ldc);
void tr_cpu_gemm_bf16_serial(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                             int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc);
/* C = op(A) op(B) + bias (a row added to every row of C; NULL: none), with
 * bf16 A and B as tr_cpu_gemm_bf16 multiplies them and the bias added in
 * the primitive as each tile is stored.  With C NULL the results go to bf16
 * C16 instead (ld ldc), rounded by the primitive as it stores them: the bits
 * of tr_f32_to_bf16 on the fp32 results, except that where the CPU rounds
 * with AVX512-BF16's conversion, fp32 results below 2^-126 in magnitude
 * become zero (the instruction flushes them; the bf16 GEMMs that read the
 * output treat such inputs as zero too). */
void tr_cpu_gemm_bf16_bias(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                           int lda, const uint16_t *B, int ldb, const float *bias, float *C,
                           int ldc, uint16_t *C16);
/* C = C0 + op(A) op(B) as tr_cpu_sgemm_onto does it, with bf16 A and B
 * (tr_cpu_gemm_bf16's product); into fp32 C, or with C NULL into bf16 C16
 * (C0 then bf16 too): the fp32 sum of C0's value and the product, rounded
 * once (tr_f32_to_bf16's bits). */
void tr_cpu_gemm_bf16_onto(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                           int lda, const uint16_t *B, int ldb, const void *C0, float *C, int ldc,
                           uint16_t *C16);
/* One small product (a block that is one thread's share, e.g. attention's
 * 64-row blocks) on the calling thread, in one call without the tile grid:
 * the same bf16 products summed in fp32, for blocks too small for the
 * primitives' per-call cost.  beta 0 or 1. */
void tr_cpu_gemm_bf16_block(int trans_a, int trans_b, int M, int N, int K, const uint16_t *A,
                            int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc);
/* Rank-r products (gemm_rank.c): tr_cpu_sgemm, its serial and onto forms
 * hand an fp32 product with K at most TR_CPU_RANK_MAX and N at least
 * TR_CPU_RANK_MIN_N to this kernel where the CPU has AVX-512
 * (tr_cpu_rank_gemm_takes), on every path, so the bits of a product depend
 * on its shape only.  C (ldc) = [C0 +] [C +] op(A) op(B). */
enum { TR_CPU_RANK_MAX = 32, TR_CPU_RANK_MIN_N = 256 };
struct tr_cpu_rank_gemm {
    int trans_a, trans_b, M, N, K;
    const float *A, *B;
    int lda, ldb;
    const float *C0; /* NULL: none */
    int accumulate;  /* without C0: C += the product */
    float *C;
    int ldc;
};
int tr_cpu_rank_gemm_takes(int M, int N, int K);
void tr_cpu_rank_gemm(const struct tr_cpu_rank_gemm *p, int threaded);
/* Nonzero when oneDNN runs bf16 matmuls on this CPU, natively or not. */
int tr_cpu_gemm_bf16_available(void);
/* "AVX512-BF16" or "AMX-BF16" when oneDNN multiplies bf16 with those
 * instructions here (after ONEDNN_MAX_CPU_ISA, which can turn them off), so
 * precision bf16 runs tr_cpu_gemm_bf16; NULL: the backend emulates bf16
 * (inputs rounded to bf16, fp32 GEMMs).  Decided once per process. */
const char *tr_cpu_bf16_native_isa(void);

/* Nonzero when this CPU runs AVX-512F (checked once): the kernels built
 * with AVX-512 paths (conversions, AdamW) take them only then. */
int tr_cpu_avx512f(void);

/* Nonzero when this CPU (and the compiler) has AVX512-BF16's conversion,
 * VCVTNE2PS2BF16 (checked once): tr_bf16_store32_cvt (bf16_lanes.h). */
int tr_cpu_bf16_convert_native(void);

/* fp32 -> bf16 bits, as tr_f32_to_bf16 (bit for bit), vectorised and threaded */
void tr_cpu_to_bf16(uint16_t *out, const float *in, size_t n);
/* The same on the calling thread alone, for small arrays inside a parallel
 * region (attention's probability blocks) */
void tr_cpu_to_bf16_serial(uint16_t *out, const float *in, size_t n);
/* tr_cpu_to_half and tr_cpu_from_half (host.h) on the calling thread alone,
 * for the tiles of a kernel's own parallel loop; the same bits (bf16 16
 * lanes at a time where tr_cpu_avx512f(), fp16 per element). */
void tr_cpu_to_half_serial(uint16_t *out, const float *in, size_t n, int bf16);
void tr_cpu_from_half_serial(float *out, const uint16_t *in, size_t n, int bf16);

/* ---- NF4 (kernels/nf4.h), nf4.c: elements [first, first + count) of an
 * n-element NF4 blob dequantised into fp32, or into bf16 bits (those fp32
 * values rounded as tr_f32_to_bf16).  Any first and count, partial blocks
 * included; tr_nf4_dequantize's bits on every path of
 * tr_cpu_elementwise_path (AVX-512, AVX2, portable); threaded. */
void tr_cpu_nf4_to_f32(float *dst, const void *blob, size_t n, size_t first, size_t count);
void tr_cpu_nf4_to_bf16(uint16_t *dst, const void *blob, size_t n, size_t first, size_t count);

/* ---- activations as stored.  Under a 16-bit compute dtype the planner
 * stores activations in bf16 or fp16 (backend.c).  The *_act kernels take
 * such an operand as it is: its data with its dtype, TR_F32, or TR_BF16 /
 * TR_F16 bit patterns as tr_f32_to_bf16 / tr_f32_to_f16 make them.  They
 * widen 16-bit inputs tile by tile as they go, compute exactly as the fp32
 * kernel does on those values, and round a 16-bit output once as
 * tr_cpu_to_half does: bit for bit the fp32 kernel run between
 * tr_cpu_from_half and tr_cpu_to_half, without those two passes over
 * memory.  Gradients, weights and saved statistics stay fp32 pointers. */
struct tr_cpu_act {
    void *data; /* only read, where the operand is an input */
    enum tr_dtype dtype;
};

/* For those kernels: the fp32 values of elements [i, i+n) of a, the stored
 * floats themselves or widened into buf (n floats) */
static inline const float *tr_cpu_act_read(struct tr_cpu_act a, size_t i, size_t n, float *buf)
{
    if (a.dtype == TR_F32)
        return (const float *)a.data + i;
    tr_cpu_from_half_serial(buf, (const uint16_t *)a.data + i, n, a.dtype == TR_BF16);
    return buf;
}

/* where fp32 results for elements i... of a go: a's own floats, or buf
 * (then stored by tr_cpu_act_write) */
static inline float *tr_cpu_act_dst(struct tr_cpu_act a, size_t i, float *buf)
{
    return a.dtype == TR_F32 ? (float *)a.data + i : buf;
}

/* stores the fp32 results y of elements [i, i+n) into a: rounded where a is
 * 16-bit, copied unless y already is a's own floats */
static inline void tr_cpu_act_write(struct tr_cpu_act a, size_t i, size_t n, const float *y)
{
    if (a.dtype != TR_F32)
        tr_cpu_to_half_serial((uint16_t *)a.data + i, y, n, a.dtype == TR_BF16);
    else if (y != (float *)a.data + i)
        for (size_t k = 0; k < n; k++)
            ((float *)a.data)[i + k] = y[k];
}

/* ---- linear: out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be NULL) */
void tr_cpu_linear_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int IC, int OC);
/* The same with w given transposed, as wt[IC, ldw] (ldw >= OC): bitwise
 * tr_cpu_linear_forward's result where tr_cpu_sgemm_plain_b(N, OC, IC) and
 * ldw is tr_cpu_sgemm_plain_b_ld(OC) (the copy it would have made). */
void tr_cpu_linear_forward_wt(float *out, const float *inp, const float *wt, int ldw,
                              const float *bias, int N, int IC, int OC);
/* out[N,OC] = addend[N,OC] + inp @ w^T (or inp @ wt with wt not NULL, as
 * tr_cpu_linear_forward_wt takes it): the product goes onto the addend tile
 * by tile (tr_cpu_sgemm_onto), a linear's addend input (ops.h,
 * tr_linear_addend).  addend may be out itself. */
void tr_cpu_linear_forward_onto(float *out, const float *inp, const float *w, const float *wt,
                                int ldw, const float *addend, int N, int IC, int OC);
/* The same with bf16 inputs (tr_cpu_gemm_bf16_onto): into fp32 out, or
 * with out16 not NULL into bf16 out16 from a bf16 addend. */
void tr_cpu_linear_forward_bf16_onto(float *out, uint16_t *out16, const uint16_t *inp,
                                     const uint16_t *w, const void *addend, int N, int IC, int OC);
/* dinp += dout @ w;  dw += dout^T @ inp;  dbias += sum over rows of dout
 * (write: bits 0, 1, 2 for dinp, dw, dbias) */
void tr_cpu_linear_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC,
                            unsigned write);
/* dbias[OC] += sum over the N rows of dout[N,OC], in row order whatever the
 * threads (rmsnorm sums its partial weight gradients with it too).  The bias gradient is a
 * sum, not a product: every backend takes it from the fp32 dout, also when
 * the GEMMs get 16-bit inputs (the CUDA backend's cuda_bias_backward too). */
void tr_cpu_linear_bias_backward(float *dbias, const float *dout, int N, int OC, int write);

/* The same with bf16 inputs (tr_cpu_gemm_bf16); bias and gradients fp32.
 * The bias gradient is not taken here: callers sum the fp32 dout. */
void tr_cpu_linear_forward_bf16(float *out, const uint16_t *inp, const uint16_t *w,
                                const float *bias, int N, int IC, int OC);
/* The same forward with its output rounded to bf16 into out by the GEMM as
 * it stores each tile (tr_cpu_gemm_bf16_bias: the bits of tr_cpu_to_bf16 on
 * the fp32 forward, subnormal results aside). */
void tr_cpu_linear_forward_bf16_out16(uint16_t *out, const uint16_t *inp, const uint16_t *w,
                                      const float *bias, int N, int IC, int OC);
void tr_cpu_linear_backward_bf16(float *dinp, float *dw, const uint16_t *dout,
                                 const uint16_t *inp, const uint16_t *w, int N, int IC, int OC,
                                 unsigned write);
/* dout[N,OC] rounded to bf16 into dout16 (tr_cpu_to_bf16's bits) and, when
 * dbias is not NULL, dbias (+)= its column sums (tr_cpu_linear_bias_backward's
 * bits), in one pass over dout. */
void tr_cpu_linear_dout_bf16(uint16_t *dout16, float *dbias, const float *dout, int N, int OC,
                             int write_bias);

/* ---- batched matmul: out[b] = a[b] @ op(bm[b]); a[b]: M x K; op(bm[b]): K x N;
 * trans_b: bm[b] is stored N x K.  `batch` independent products. */
void tr_cpu_matmul_forward(float *out, const float *a, const float *bm, int batch, int M, int K,
                           int N, int trans_b);
void tr_cpu_matmul_backward(float *da, float *dbm, const float *dout, const float *a,
                            const float *bm, int batch, int M, int K, int N, int trans_b);

void tr_cpu_matmul_forward_bf16(float *out, const uint16_t *a, const uint16_t *bm, int batch,
                                int M, int K, int N, int trans_b);
void tr_cpu_matmul_backward_bf16(float *da, float *dbm, const uint16_t *dout, const uint16_t *a,
                                 const uint16_t *bm, int batch, int M, int K, int N, int trans_b);

/* ---- embedding: out[n,:] = table[idx[n],:]; idx in [0,V) (checked by the caller) */
void tr_cpu_embedding_forward(float *out, const int32_t *idx, const float *table, int N, int C);
void tr_cpu_embedding_forward_half(float *out, const int32_t *idx, const uint16_t *table, int N,
                                   int C, int bf16);
void tr_cpu_embedding_backward(float *dtable, const float *dout, const int32_t *idx, int N, int C);

/* ---- broadcast add of rows: out[b,t,:] = x[b,t,:] + p[t,:] (positions) */
void tr_cpu_add_rows_forward(float *out, const float *x, const float *p, int B, int T, int C);
void tr_cpu_add_rows_backward(float *dx, float *dp, const float *dout, int B, int T, int C);

/* ---- elementwise add: out = a + b */
void tr_cpu_add_forward(float *out, const float *a, const float *b, size_t n);
/* da += dout, db += dout (write: bits 0 and 1 for da and db) */
void tr_cpu_add_backward(float *da, float *db, const float *dout, size_t n, unsigned write);
/* the same forward on activations as stored (any mix of dtypes) */
void tr_cpu_add_forward_act(struct tr_cpu_act out, struct tr_cpu_act a, struct tr_cpu_act b,
                            size_t n);

/* ---- layernorm over the last dim C; saves mean[N] and rstd[N] for backward.
 * Backward scratch: the partial sums of dw and db
 * (tr_cpu_layernorm_scratch_floats; its contents need not be initialised). */
void tr_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C, float eps);
size_t tr_cpu_layernorm_scratch_floats(int N, int C);
void tr_cpu_layernorm_backward(float *dinp, float *dw, float *db, float *scratch,
                               const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C,
                               unsigned write);
/* the same with the input and the output as stored (w, b, the statistics and
 * the gradients fp32) */
void tr_cpu_layernorm_forward_act(struct tr_cpu_act out, float *mean, float *rstd,
                                  struct tr_cpu_act inp, const float *w, const float *b, int N,
                                  int C, float eps);
void tr_cpu_layernorm_backward_act(float *dinp, float *dw, float *db, float *scratch,
                                   const float *dout, struct tr_cpu_act inp, const float *w,
                                   const float *mean, const float *rstd, int N, int C,
                                   unsigned write);

/* ---- RMSNorm over the last dim C: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps);
 * saves rstd[N] for backward.  Backward scratch: the partial sums of dw
 * (tr_cpu_rmsnorm_scratch_floats; its contents need not be initialised). */
void tr_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N,
                            int C, float eps);
size_t tr_cpu_rmsnorm_scratch_floats(int N, int C);
/* (write: bits 0, 1 for dinp, dw) */
void tr_cpu_rmsnorm_backward(float *dinp, float *dw, float *scratch, const float *dout,
                             const float *inp, const float *w, const float *rstd, int N, int C,
                             unsigned write);

/* ---- rotary position embedding, Hugging Face's rotate-half convention, on
 * x[B,T,H*D] (D even): in each head, pair (i, i+D/2) at position t turns by
 * t * theta^(-2i/D).  Both directions fill a cos/sin table in scratch
 * (tr_cpu_rope_scratch_floats; its contents need not be initialised).
 * Backward turns dout back by the same angles into dinp (+=). */
size_t tr_cpu_rope_scratch_floats(int T, int D);
void tr_cpu_rope_forward(float *out, const float *inp, float *scratch, int B, int T, int H, int D,
                         float theta);
void tr_cpu_rope_backward(float *dinp, const float *dout, float *scratch, int B, int T, int H,
                          int D, float theta, int write);
/* The same with Llama 3.1's frequency scaling (kernels/rope_scaling.h); sc
 * NULL or sc->factor 0: none. */
struct tr_rope_scaling;
void tr_cpu_rope_forward_scaled(float *out, const float *inp, float *scratch, int B, int T, int H,
                                int D, float theta, const struct tr_rope_scaling *sc);
/* The forward of rows at positions pos0 .. pos0 + T - 1 (a window of a
 * longer sequence: sample's key/value cache), the same angles as there. */
void tr_cpu_rope_forward_at(float *out, const float *inp, float *scratch, int B, int T, int H,
                            int D, float theta, const struct tr_rope_scaling *sc, int pos0);
void tr_cpu_rope_backward_scaled(float *dinp, const float *dout, float *scratch, int B, int T,
                                 int H, int D, float theta, const struct tr_rope_scaling *sc,
                                 int write);

/* ---- activations */
void tr_cpu_gelu_forward(float *out, const float *inp, size_t n); /* tanh form */
void tr_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, int write);
/* The vector path of GELU, SwiGLU, tr_cpu_exp_shifted, AdamW and the bf16
 * conversions: the widest this CPU runs.  The AVX-512 and AVX2 paths give the
 * same bits for every element (and exp_shifted the same sum; the conversions
 * also the portable path's).  tr_cpu_elementwise_cap(p) keeps the calls
 * that follow to paths up to p (TR_CPU_EW_AVX512: no cap) and returns the
 * previous cap: tests compare the paths with it; not to be changed while
 * those kernels run. */
enum { TR_CPU_EW_PORTABLE, TR_CPU_EW_AVX2, TR_CPU_EW_AVX512 };
int tr_cpu_elementwise_path(void);
int tr_cpu_elementwise_cap(int path);
/* the same with the input (and forward's output) as stored */
void tr_cpu_gelu_forward_act(struct tr_cpu_act out, struct tr_cpu_act inp, size_t n);
void tr_cpu_gelu_backward_act(float *dinp, struct tr_cpu_act inp, const float *dout, size_t n,
                              int write);
void tr_cpu_relu_forward(float *out, const float *inp, size_t n);
/* x[i] = exp(x[i] - shift) for i < n, returning their sum (softmax rows).
 * Vectorised like GELU; about 1 ulp; arguments below -87 give ~1e-38, not 0. */
float tr_cpu_exp_shifted(float *x, int n, float shift);
void tr_cpu_relu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* SwiGLU's gate: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); vectorised
 * like GELU.  Either gradient may be NULL, and both may be one buffer (gate
 * and up the same tensor: both contributions land). */
void tr_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
/* (write: bits 0, 1 for dgate, dup; never both when they are one buffer) */
void tr_cpu_swiglu_backward(float *dgate, float *dup, const float *gate, const float *up,
                            const float *dout, size_t n, unsigned write);
/* out = scale * x;  dinp += scale * dout */
void tr_cpu_scale_forward(float *out, const float *inp, float scale, size_t n);
void tr_cpu_scale_backward(float *dinp, const float *dout, float scale, size_t n, int write);
void tr_cpu_dropout_forward(float *out, const float *inp, size_t n, float p, uint64_t seed,
                            uint64_t node);
void tr_cpu_dropout_backward(float *dinp, const float *dout, size_t n, float p, uint64_t seed,
                             uint64_t node, int write);

/* ---- causal multi-head self-attention, flash style (no T x T matrix)
 * qkv[B,T,3C] holds q, k, v side by side (each C = NH heads of C/NH);
 * out[B,T,C]; lse[B,NH,T] keeps, for backward, the log-sum-exp of each
 * query row's scaled causal scores (scale 1/sqrt(C/NH)), from which the
 * backward recomputes the probabilities block by block. */
void tr_cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C,
                              int NH);
/* Backward scratch: D = rowsum(dout * out), B*NH*T floats; its contents
 * need not be initialised. */
size_t tr_cpu_attention_scratch_floats(int B, int T, int C, int NH);
/* write: dqkv is written (=), not added to */
void tr_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *out,
                               const float *qkv, const float *lse, int B, int T, int C, int NH,
                               int write);
/* The same attention from separate q[B,T,H*D], k[B,T,KV*D], v[B,T,KV*D]
 * (KV divides H; query head h reads key/value head h / (H/KV): grouped-query
 * attention), out[B,T,H*D], lse[B,H,T], scale 1/sqrt(D).  With KV = H and the
 * same numbers it gives the packed form's bits.  Scratch: B*H*T floats, not
 * initialised.  Any of dq, dk, dv may be NULL. */
void tr_cpu_attention_gqa_forward(float *out, float *lse, const float *q, const float *k,
                                  const float *v, int B, int T, int H, int KV, int D);
size_t tr_cpu_attention_gqa_scratch_floats(int B, int T, int H, int KV, int D);
/* write: bits 0, 1, 2 for dq, dk, dv */
void tr_cpu_attention_gqa_backward(float *dq, float *dk, float *dv, float *scratch,
                                   const float *dout, const float *out, const float *q,
                                   const float *k, const float *v, const float *lse, int B, int T,
                                   int H, int KV, int D, unsigned write);
/* Both forms under native bf16: q, k, v read as stored in bf16, every
 * product a bf16 one summed in fp32 (tr_cpu_gemm_bf16_block; the
 * probabilities, dS and dout rounded to bf16 for the products), softmax,
 * out, lse and the gradients in fp32.  Results do not depend on the thread
 * count.  Callers check tr_cpu_bf16_native_isa() first.  Backward scratch:
 * the *_bf16_scratch_floats, not initialised (D, and dout in bf16). */
/* The forward of query rows [q0, q1) alone (each batch), against keys
 * [0, q1): out holds those rows alone ([B, q1 - q0, H*D]), lse rows outside
 * them are left as they are, and rows of q, k, v at or past q1 are not read
 * (a key/value cache: the rows before q0 were written by earlier calls).
 * The same blocks and sums as the whole forward's rows, up to the products'
 * order.  Inputs in fp32, or in bf16 (the
 * native bf16 path) when qkv16 / q16 is not NULL. */
void tr_cpu_attention_forward_rows(float *out, float *lse, const float *qkv,
                                   const uint16_t *qkv16, int B, int T, int C, int NH, int q0,
                                   int q1);
void tr_cpu_attention_gqa_forward_rows(float *out, float *lse, const float *q, const float *k,
                                       const float *v, const uint16_t *q16, const uint16_t *k16,
                                       const uint16_t *v16, int B, int T, int H, int KV, int D,
                                       int q0, int q1);
void tr_cpu_attention_forward_bf16(float *out, float *lse, const uint16_t *qkv, int B, int T,
                                   int C, int NH);
size_t tr_cpu_attention_bf16_scratch_floats(int B, int T, int C, int NH);
void tr_cpu_attention_backward_bf16(float *dqkv, float *scratch, const float *dout,
                                    const float *out, const uint16_t *qkv, const float *lse, int B,
                                    int T, int C, int NH, int write);
void tr_cpu_attention_gqa_forward_bf16(float *out, float *lse, const uint16_t *q,
                                       const uint16_t *k, const uint16_t *v, int B, int T, int H,
                                       int KV, int D);
size_t tr_cpu_attention_gqa_bf16_scratch_floats(int B, int T, int H, int KV, int D);
void tr_cpu_attention_gqa_backward_bf16(float *dq, float *dk, float *dv, float *scratch,
                                        const float *dout, const float *out, const uint16_t *q,
                                        const uint16_t *k, const uint16_t *v, const float *lse,
                                        int B, int T, int H, int KV, int D, unsigned write);

/* ---- softmax cross-entropy, mean over rows whose target != ignore_index.
 * Forward writes the mean loss to *loss and the per-row log-sum-exp to lse[N]
 * (backward recomputes the softmax from logits and lse, so no N x V probs are
 * stored; ignored rows get lse 0).  Returns the number of rows that count. */
int tr_cpu_cross_entropy_forward(float *loss, float *lse, const float *logits,
                                 const int32_t *targets, int N, int V, int ignore_index);
/* dlogits += dloss * (softmax - onehot) / n_valid for rows that count
 * (write: every row written, those that do not count with zeros) */
void tr_cpu_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                   const int32_t *targets, float dloss, int N, int V,
                                   int ignore_index, int write);

/* ---- optimizers, over flat arrays.  grad_scale multiplies every gradient
 * first (loss-scale undo and global-norm clipping folded into one factor). */
/* AdamW, decoupled weight decay: p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p);
 * t is the 1-based step used for bias correction. */
void tr_cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int64_t t);
/* The same update, also writing each updated parameter as bf16 bits
 * (tr_cpu_to_bf16's rounding) into param_bf16[0..n) when it is not NULL:
 * the bf16 copy the native bf16 GEMMs read, refreshed in the same pass. */
void tr_cpu_adamw_update_bf16(float *param, uint16_t *param_bf16, const float *grad, float *m,
                              float *v, size_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, float grad_scale, int64_t t);
/* SGD with momentum (PyTorch form): g += wd*p; buf = mu*buf + g; p -= lr*buf
 * (momentum_buf may be NULL for plain SGD) */
void tr_cpu_sgd_update(float *param, const float *grad, float *momentum_buf, size_t n, float lr,
                       float momentum, float weight_decay, float grad_scale);
/* sum of squares, accumulated in double; inf/NaN anywhere makes it non-finite */
double tr_cpu_sum_squares(const float *x, size_t n);

/* ---- metrics: rows whose arg-max logit equals the target (ties: the first
 * maximum); rows with target == ignore_index are not counted in *n_valid. */
int64_t tr_cpu_count_correct(const float *logits, const int32_t *targets, int N, int V,
                             int ignore_index, int64_t *n_valid);

/* ---- convolutional models: images are channel-last, x[B,H,W,C] ---------- */

/* ---- 2-D convolution (conv.c, on oneDNN's convolution primitives):
 * x[B,H,W,IC], w[OC,KH,KW,IC/groups], bias[OC] (may be NULL) -> out[B,OH,OW,OC];
 * output size per dim (in + 2 pad - dilation (k - 1) - 1) / stride + 1, which
 * the caller computes and checks (OH, OW >= 1, groups dividing IC and OC).
 * Primitives are created on first use of a shape and kept for the process.
 * `compute` TR_BF16/TR_F16 rounds x, w (and dout) to that type first: native
 * bf16 convolutions where tr_cpu_bf16_native_isa() says so, fp32 ones on
 * rounded copies otherwise; results are fp32.
 * Scratch: tr_cpu_conv2d_scratch_floats (forward and backward share it; its
 * contents need not be initialised), which creates the primitives.
 * Determinism: the forward and dx do not depend on the thread count; dw's
 * sums are split over oneDNN's threads, so its bits depend on the thread
 * count (bitwise repeatable for a given count).  db is an ordered row sum. */
struct tr_cpu_conv_shape {
    int B, H, W, IC, OC, KH, KW, OH, OW;
    int stride[2], pad[2], dilation[2], groups;
};
/* Nonzero when oneDNN makes the primitives for this shape (made and kept,
 * so the scratch query and the first step find them). */
int tr_cpu_conv2d_supported(const struct tr_cpu_conv_shape *s, int bias, enum tr_dtype compute);
size_t tr_cpu_conv2d_scratch_floats(const struct tr_cpu_conv_shape *s, int bias,
                                    enum tr_dtype compute);
void tr_cpu_conv2d_forward(float *out, const float *x, const float *w, const float *bias,
                           float *scratch, const struct tr_cpu_conv_shape *s,
                           enum tr_dtype compute);
/* dx += dout conv^T w;  dw += x corr dout;  db += rows' sum of dout (any may
 * be NULL).  dx_write: dx is written, not added to (its first writer), so
 * the data gradient goes straight into it rather than through scratch. */
void tr_cpu_conv2d_backward(float *dx, float *dw, float *db, float *scratch, const float *dout,
                            const float *x, const float *w, int dx_write,
                            const struct tr_cpu_conv_shape *s, enum tr_dtype compute);

/* ---- pooling (pool.c, by hand): x[B,H,W,C] -> out[B,OH,OW,C], windows KH x KW
 * at stride, pad rows/columns on each side (-inf for max, zeros for average,
 * whose divisor is always KH*KW).  Max backward routes each output's
 * gradient to its window's first maximum in row-major order, found again
 * from x (no workspace). */
struct tr_cpu_pool_shape {
    int B, H, W, C, KH, KW, OH, OW;
    int stride[2], pad[2];
};
void tr_cpu_maxpool_forward(float *out, const float *x, const struct tr_cpu_pool_shape *s);
void tr_cpu_maxpool_backward(float *dx, const float *dout, const float *x,
                             const struct tr_cpu_pool_shape *s);
void tr_cpu_avgpool_forward(float *out, const float *x, const struct tr_cpu_pool_shape *s);
void tr_cpu_avgpool_backward(float *dx, const float *dout, const struct tr_cpu_pool_shape *s);
/* out[B,C] = mean over the HW positions of x[B,HW,C];  dx += dout / HW */
void tr_cpu_global_avgpool_forward(float *out, const float *x, int B, int HW, int C);
void tr_cpu_global_avgpool_backward(float *dx, const float *dout, int B, int HW, int C);

/* ---- batch normalisation over the N rows of x[N,C], per channel (batchnorm.c).
 * Training: mean and biased variance of the batch -> mean[C], rstd[C]
 * (1/sqrt(var + eps)); running[2,C] (running mean, then unbiased variance,
 * n/(n-1); NULL: not updated) moves by momentum toward the batch's.
 * Eval: normalises with running[2,C] and writes its mean and rstd to
 * mean[C], rstd[C], so backward reads the statistics from the same place.
 * Backward (training: through the batch statistics; eval: constants):
 * dx += ..., dw += sum dy xhat, db += sum dy (any may be NULL).
 * Scratch: tr_cpu_batchnorm_scratch_floats (not initialised).  Sums are
 * ordered over fixed chunks of rows: bits do not depend on the threads. */
size_t tr_cpu_batchnorm_scratch_floats(int N, int C);
void tr_cpu_batchnorm_forward_train(float *out, float *mean, float *rstd, float *running,
                                    float *scratch, const float *x, const float *w,
                                    const float *b, int N, int C, float eps, float momentum);
void tr_cpu_batchnorm_forward_eval(float *out, float *mean, float *rstd, float *scratch,
                                   const float *x, const float *w, const float *b,
                                   const float *running, int N, int C, float eps);
void tr_cpu_batchnorm_backward(float *dx, float *dw, float *db, float *scratch, const float *dout,
                               const float *x, const float *w, const float *mean,
                               const float *rstd, int N, int C, int training);

/* ---- bf16 copies of the parameters (param16.c), for the native bf16 GEMMs.
 * tr_cpu_param16: the bf16 bits of parameter tensor t of g, from a copy of
 * g's flat parameter buffer made on first use and brought up to date here;
 * NULL when t is not in g's buffer (the caller converts it itself).  The
 * backend reports every other write into its memory: tr_cpu_param16_updated
 * when an optimizer is about to update [p, p+n) (returns where that run's
 * bf16 copy goes, or NULL), tr_cpu_param16_written for any other write,
 * tr_cpu_param16_forget when memory is freed. */
const uint16_t *tr_cpu_param16(const struct tr_graph *g, const struct tr_tensor *t);
uint16_t *tr_cpu_param16_updated(const float *p, size_t n);
void tr_cpu_param16_written(const void *p, size_t bytes);
void tr_cpu_param16_forget(const void *p);
/* Whether the core discarded any of [p, p + bytes) (and committed it no
 * more, backend.c): the first such run as byte offsets [*from, *to). */
int tr_cpu_discarded_within(const void *p, size_t bytes, size_t *from, size_t *to);
/* The bytes a copy of n_params parameters takes (what the memory plan counts). */
size_t tr_cpu_param16_bytes(size_t n_params);

/* ---- Transposed copies of frozen fp32 linear weights (frozen_t.c), for
 * the forward GEMM.  tr_cpu_frozen_t: frozen weight t of g ([out, in]) as
 * tr_cpu_sgemm's plain-row copy of B (in x *ld), made on first use and kept
 * up to date here, when a forward over M rows would transpose it (else NULL:
 * the caller runs the product as before).  The backend reports writes into
 * its memory through tr_cpu_frozen_t_written and frees through
 * tr_cpu_frozen_t_forget, as for the bf16 copies above;
 * tr_cpu_frozen_t_bytes is what g's copies take (the memory plan). */
const float *tr_cpu_frozen_t(const struct tr_graph *g, const struct tr_tensor *t, int M, int *ld);
void tr_cpu_frozen_t_written(const void *p, size_t bytes);
void tr_cpu_frozen_t_forget(const void *p);
size_t tr_cpu_frozen_t_bytes(const struct tr_graph *g);

/* ---- The CPU backend (backend.c).  The core opens it by name, "cpu",
 * through tr_cpu_backend_module (kernels/backend.h); tests call these. */
int tr_cpu_backend_init(struct tr_backend *be, int threads); /* threads 0: one per core */
void tr_cpu_backend_free(struct tr_backend *be);

#endif
