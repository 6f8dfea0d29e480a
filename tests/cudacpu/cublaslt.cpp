/*
 * A fake libcublasLt for tests/cudacpu/gemm_lt_check.cpp: kernels/cuda/gemm.cu
 * dlopens it as the real one and drives it through the same calls.  It keeps
 * what gemm.cu asked for (the compute type, operations, layouts, epilogue)
 * and computes the product on the CPU in cuBLASLt's column-major terms, so
 * the check sees both which compute type each GEMM ran with and whether
 * gemm.cu's row-major-to-column-major mapping gives the right numbers.
 *
 * Inputs fp32 or bf16, C/D fp32 (what the check uses); under
 * CUBLAS_COMPUTE_32F_FAST_TF32 fp32 inputs are rounded to tf32 first, as the
 * tensor cores do.  cudacpu_lt_log() lists the compute type of every
 * cublasLtMatmul so far.  The product is queued on the call's stream and
 * computed when the stream runs, as a GPU would (cudacpu_library.h).
 */
#include <cublasLt.h>
#include <cudacpu_library.h>

#include <stdlib.h>
#include <string.h>

struct cudacpu_lt_context {
    int unused;
};
struct cudacpu_lt_desc {
    cublasComputeType_t compute;
    int32_t op_a, op_b;
    cublasLtEpilogue_t epilogue;
    const void *bias;
};
struct cudacpu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld, stride;
    int32_t batch;
};
struct cudacpu_lt_pref {
    int unused;
};

enum { LOG_MAX = 1024 };
static int log_compute[LOG_MAX], log_n;

extern "C" __attribute__((visibility("default"))) const int *cudacpu_lt_log(int *n)
{
    *n = log_n;
    return log_compute;
}

#define API extern "C" __attribute__((visibility("default")))

API cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    *handle = (cublasLtHandle_t)calloc(1, sizeof **handle);
    return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
API cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}
API size_t cublasLtGetVersion(void) { return CUBLAS_VER_MAJOR * 10000 + 1; }

API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc,
                                            cublasComputeType_t compute, cudaDataType_t scale)
{
    if (scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *desc = (cublasLtMatmulDesc_t)calloc(1, sizeof **desc);
    if (!*desc)
        return CUBLAS_STATUS_ALLOC_FAILED;
    (*desc)->compute = compute;
    (*desc)->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    free(desc);
    return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                  cublasLtMatmulDescAttributes_t attr,
                                                  const void *buf, size_t size)
{
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        memcpy(&desc->op_a, buf, sizeof desc->op_a);
        return size == 4 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        memcpy(&desc->op_b, buf, sizeof desc->op_b);
        return size == 4 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        memcpy(&desc->epilogue, buf, sizeof desc->epilogue);
        return size == sizeof desc->epilogue ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        memcpy(&desc->bias, buf, sizeof desc->bias);
        return size == sizeof desc->bias ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type,
                                              uint64_t rows, uint64_t cols, int64_t ld)
{
    if ((int64_t)rows > ld)
        return CUBLAS_STATUS_INVALID_VALUE; /* column-major: ld >= rows */
    *layout = (cublasLtMatrixLayout_t)calloc(1, sizeof **layout);
    if (!*layout)
        return CUBLAS_STATUS_ALLOC_FAILED;
    **layout = {type, rows, cols, ld, 0, 1};
    return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    free(layout);
    return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                    cublasLtMatrixLayoutAttribute_t attr,
                                                    const void *buf, size_t size)
{
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof layout->batch)
        memcpy(&layout->batch, buf, size);
    else if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof layout->stride)
        memcpy(&layout->stride, buf, size);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    *pref = (cublasLtMatmulPreference_t)calloc(1, sizeof **pref);
    return *pref ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    free(pref);
    return CUBLAS_STATUS_SUCCESS;
}
API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, 
                                                        cublasLtMatmulPreferenceAttributes_t,
                                                        const void *, size_t)
{
    return CUBLAS_STATUS_SUCCESS;
}

/* a product this fake computes: fp32 or bf16 inputs, fp32 output, one of
 * the two compute types gemm.cu may ask for */
static bool supported(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                      cublasLtMatrixLayout_t c)
{
    bool inputs = a->type == b->type && (a->type == CUDA_R_32F || a->type == CUDA_R_16BF);
    bool compute = d->compute == CUBLAS_COMPUTE_32F ||
                   (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a->type == CUDA_R_32F);
    return inputs && compute && c->type == CUDA_R_32F;
}

API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                                  cublasLtMatrixLayout_t a,
                                                  cublasLtMatrixLayout_t b,
                                                  cublasLtMatrixLayout_t c,
                                                  cublasLtMatrixLayout_t,
                                                  cublasLtMatmulPreference_t, int requested,
                                                  cublasLtMatmulHeuristicResult_t *results,
                                                  int *returned)
{
    *returned = 0;
    if (requested < 1 || !supported(desc, a, b, c))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(results, 0, sizeof *results);
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float element(const void *base, cudaDataType_t type, int64_t i)
{
    uint32_t u;
    float f;
    if (type == CUDA_R_16BF) {
        u = (uint32_t)((const uint16_t *)base)[i] << 16;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    return ((const float *)base)[i];
}

/* fp32 to tf32, round to nearest, ties away from zero (cvt.rna.tf32.f32) */
static float tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* one cublasLtMatmul as it was called: the descriptor and layouts as they
 * were then (gemm.cu reuses a descriptor with another bias pointer for the
 * next call), alpha and beta read from the host then, as cuBLASLt does */
struct matmul_call {
    cudacpu_lt_desc desc;
    cudacpu_lt_layout a, b, c, d;
    float alpha, beta;
    const void *A, *B, *C;
    void *D;
};

/* column-major D[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C (+ bias[m]),
 * when the stream runs it */
static void run_matmul(void *arg)
{
    const matmul_call *m_ = (const matmul_call *)arg;
    const cudacpu_lt_desc *desc = &m_->desc;
    const cudacpu_lt_layout *a = &m_->a, *b = &m_->b, *c = &m_->c, *d = &m_->d;
    int64_t m = (int64_t)c->rows, n = (int64_t)c->cols;
    int64_t k = desc->op_a ? (int64_t)a->rows : (int64_t)a->cols;
    bool round = desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    float al = m_->alpha, be = m_->beta;
    for (int32_t p = 0; p < c->batch; p++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                float acc = 0;
                for (int64_t l = 0; l < k; l++) {
                    int64_t ia = desc->op_a ? i * a->ld + l : l * a->ld + i;
                    int64_t ib = desc->op_b ? l * b->ld + j : j * b->ld + l;
                    float x = element(m_->A, a->type, p * a->stride + ia);
                    float y = element(m_->B, b->type, p * b->stride + ib);
                    if (round) {
                        x = tf32(x);
                        y = tf32(y);
                    }
                    acc += x * y;
                }
                float v = al * acc;
                if (be != 0)
                    v += be * ((const float *)m_->C)[p * c->stride + j * c->ld + i];
                if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && desc->bias)
                    v += ((const float *)desc->bias)[i];
                ((float *)m_->D)[p * d->stride + j * d->ld + i] = v;
            }
    free(arg);
}

/* checks the call at once, as cuBLASLt does, and queues the product on
 * the stream (tests/cudacpu/include/cudacpu_library.h) */
API cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void *alpha,
                                  const void *A, cublasLtMatrixLayout_t a, const void *B,
                                  cublasLtMatrixLayout_t b, const void *beta, const void *C,
                                  cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                                  const cublasLtMatmulAlgo_t *, void *, size_t,
                                  cudaStream_t stream)
{
    if (!supported(desc, a, b, c) || c->rows != d->rows || c->cols != d->cols)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int64_t m = (int64_t)c->rows, n = (int64_t)c->cols;
    int64_t k = desc->op_a ? (int64_t)a->rows : (int64_t)a->cols;
    int64_t am = desc->op_a ? (int64_t)a->cols : (int64_t)a->rows;
    int64_t bk = desc->op_b ? (int64_t)b->cols : (int64_t)b->rows;
    int64_t bn = desc->op_b ? (int64_t)b->rows : (int64_t)b->cols;
    if (am != m || bk != k || bn != n || a->batch != c->batch || b->batch != c->batch)
        return CUBLAS_STATUS_INVALID_VALUE;
    matmul_call *call = (matmul_call *)malloc(sizeof *call);
    if (!call)
        return CUBLAS_STATUS_ALLOC_FAILED;
    *call = {*desc, *a, *b, *c, *d, *(const float *)alpha, *(const float *)beta, A, B, C, D};
    if (cudacpu_queue(stream, run_matmul, call) != cudaSuccess) {
        free(call);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if (log_n < LOG_MAX)
        log_compute[log_n++] = desc->compute;
    return CUBLAS_STATUS_SUCCESS;
}
