/*
 * cudacpu's stand-in for kernels/cuda/gemm.cu: the same three entry points
 * (cuda_gemm_open, cuda_gemm_close, cuda_gemm), with a plain reference
 * kernel where gemm.cu calls cuBLASLt, which cannot run on the CPU.  It is a
 * CUDA kernel like the others and runs through the harness.
 *
 * Semantics are cuBLASLt's as gemm.cu asks for them: fp32 accumulation
 * (CUBLAS_COMPUTE_32F), inputs of ab_dt, C and the bias of c_dt, C read only
 * when beta != 0, the bias added in fp32 before the one rounding to c_dt
 * (the BIAS epilogue).  The sum runs over k in order: cuBLASLt's order is its
 * own, so results agree with a GPU's to rounding, not bit for bit.
 * When the graph allows tf32 (c->allow_tf32) fp32 inputs are rounded to
 * tf32 first, as CUBLAS_COMPUTE_32F_FAST_TF32 does on tensor cores: a run
 * with tf32 on differs from one without, as it would on a GPU.
 */
#include "common.cuh"

#include <string.h>

/* fp32 to tf32 (8-bit exponent, 10-bit mantissa), round to nearest with
 * ties away from zero as the tensor cores' cvt.rna.tf32.f32; kept in fp32 */
__device__ __forceinline__ float to_tf32(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) /* inf and NaN stay as they are */
        u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

template <typename AB, typename CT>
__global__ void reference_gemm_kernel(int trans_a, int trans_b, int M, int N, int K, float alpha,
                                      const AB *A, int lda, long long stride_a, const AB *B,
                                      int ldb, long long stride_b, float beta, CT *C, int ldc,
                                      long long stride_c, int batch, const CT *bias, int tf32)
{
    size_t total = (size_t)batch * M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(i % N), m = (int)(i / N % M), b = (int)(i / ((size_t)M * N));
        const AB *a = A + b * stride_a, *bm = B + b * stride_b;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            float x = to_f32(trans_a ? a[(size_t)k * lda + m] : a[(size_t)m * lda + k]);
            float y = to_f32(trans_b ? bm[(size_t)n * ldb + k] : bm[(size_t)k * ldb + n]);
            if (tf32) {
                x = to_tf32(x);
                y = to_tf32(y);
            }
            acc += x * y;
        }
        CT *c = C + b * stride_c + (size_t)m * ldc + n;
        float v = alpha * acc;
        if (beta != 0.0f)
            v += beta * to_f32(*c);
        if (bias)
            v += to_f32(bias[n]);
        *c = from_f32<CT>(v);
    }
}

const char *cuda_gemm_open(struct cuda_context *c, size_t *version)
{
    (void)c;
    *version = 0;
    return NULL;
}

void cuda_gemm_close(struct cuda_context *c) { (void)c; }

template <typename AB, typename CT>
static void gemm_typed(struct cuda_context *c, int trans_a, int trans_b, int M, int N, int K,
                       float alpha, const void *A, int lda, long long stride_a, const void *B,
                       int ldb, long long stride_b, float beta, void *C, int ldc,
                       long long stride_c, int batch, const void *bias)
{
    size_t total = (size_t)batch * M * N;
    reference_gemm_kernel<AB, CT><<<grid_for(total, 256), 256, 0, c->compute>>>(
        trans_a, trans_b, M, N, K, alpha, (const AB *)A, lda, stride_a, (const AB *)B, ldb,
        stride_b, beta, (CT *)C, ldc, stride_c, batch, (const CT *)bias,
        c->allow_tf32 && sizeof(AB) == sizeof(float));
    LAUNCHED(c, "gemm (reference)");
}

template <typename AB>
static void gemm_for_c(struct cuda_context *c, int c_dt, int trans_a, int trans_b, int M, int N,
                       int K, float alpha, const void *A, int lda, long long stride_a,
                       const void *B, int ldb, long long stride_b, float beta, void *C, int ldc,
                       long long stride_c, int batch, const void *bias)
{
    switch (c_dt) {
    case DT_BF16:
        gemm_typed<AB, __nv_bfloat16>(c, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B,
                                      ldb, stride_b, beta, C, ldc, stride_c, batch, bias);
        break;
    case DT_F16:
        gemm_typed<AB, __half>(c, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb,
                               stride_b, beta, C, ldc, stride_c, batch, bias);
        break;
    default:
        gemm_typed<AB, float>(c, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb,
                              stride_b, beta, C, ldc, stride_c, batch, bias);
        break;
    }
}

void cuda_gemm(struct cuda_context *c, int trans_a, int trans_b, int M, int N, int K, float alpha,
               const void *A, int lda, long long stride_a, const void *B, int ldb,
               long long stride_b, float beta, void *C, int ldc, long long stride_c, int batch,
               int ab_dt, int c_dt, const void *bias)
{
    if (M <= 0 || N <= 0 || batch <= 0)
        return;
    if (K <= 0) { /* as gemm.cu */
        cuda_note(c, cudaErrorInvalidValue, "gemm with an empty inner dimension");
        return;
    }
    if (batch == 1)
        stride_a = stride_b = stride_c = 0;
    DISPATCH_STORAGE(ab_dt, gemm_for_c, c, c_dt, trans_a, trans_b, M, N, K, alpha, A, lda,
                     stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch, bias);
}
