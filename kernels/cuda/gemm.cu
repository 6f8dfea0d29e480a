/*
 * GEMMs through cuBLASLt, fp32 accumulation, inputs fp32, bf16 or fp16.
 * The compute type is CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32
 * for fp32 inputs when the graph allows tf32 (the precision policy's
 * allow_tf32): tensor cores then round the inputs to tf32.  16-bit inputs
 * always use CUBLAS_COMPUTE_32F (it already runs on tensor cores).
 *
 * cuBLASLt is opened with dlopen when the backend opens, not linked: the
 * module then loads (and `trainrun doctor` describes the machine) where the
 * toolkit's libraries are missing, and device=cuda says which library is.
 *
 * Each distinct product (shapes, strides, dtypes, pointer alignment) gets
 * its descriptors and algorithm once, the first time it runs, and keeps them:
 * later steps only launch.
 */
#include "common.cuh"

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TR_CUDA_HOME
#define TR_CUDA_HOME "/usr/local/cuda"
#endif

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

struct lt_api {
    void *handle;
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtGetVersion) get_version;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatrixLayoutSetAttribute) layout_set;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtMatmul) matmul;
};

struct gemm_key {
    int op_a, op_b, m, n, k, lda, ldb, ldc, batch;
    long long stride_a, stride_b, stride_c;
    int ab_dt, c_dt, bias, tf32;
    int align_a, align_b, align_c, align_bias;
};

struct gemm_plan {
    struct gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int ok; /* 0: no algorithm for this product */
};

enum { GEMM_PLANS = 256 };

struct gemm_cache {
    struct lt_api api;
    cublasLtHandle_t lt;
    struct gemm_plan plans[GEMM_PLANS];
    int n, next_evict;
};

static cudaDataType_t cuda_type(int dt)
{
    return dt == DT_BF16 ? CUDA_R_16BF : dt == DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static size_t dt_size(int dt) { return (dt == DT_BF16 || dt == DT_F16) ? 2 : 4; }

/* the alignment cuBLASLt may assume: every batch's base, capped at 256 */
static int alignment(const void *p, long long stride_bytes)
{
    uintptr_t bits = (uintptr_t)p | (uintptr_t)stride_bytes | (uintptr_t)256;
    return (int)(bits & (~bits + 1));
}

const char *cuda_gemm_open(struct cuda_context *c, size_t *version)
{
    static char why[512];
    const char *names[] = {"libcublasLt.so." STRINGIFY(CUBLAS_VER_MAJOR),
                           TR_CUDA_HOME "/lib64/libcublasLt.so." STRINGIFY(CUBLAS_VER_MAJOR),
                           "libcublasLt.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why,
                 "cuBLASLt (%s) is not installed or not on the library path: install the CUDA "
                 "toolkit's cuBLAS %d or add its lib64 directory to LD_LIBRARY_PATH",
                 names[0], CUBLAS_VER_MAJOR);
        return why;
    }
    struct gemm_cache *g = (struct gemm_cache *)calloc(1, sizeof *g);
    if (!g) {
        dlclose(h);
        return "out of host memory";
    }
    struct lt_api *a = &g->api;
    a->handle = h;
    int missing = 0;
#define LOAD(field, symbol)                                                                        \
    do {                                                                                           \
        a->field = (decltype(a->field))dlsym(h, #symbol);                                          \
        missing |= a->field == NULL;                                                               \
    } while (0)
    LOAD(create, cublasLtCreate);
    LOAD(destroy, cublasLtDestroy);
    LOAD(get_version, cublasLtGetVersion);
    LOAD(desc_create, cublasLtMatmulDescCreate);
    LOAD(desc_destroy, cublasLtMatmulDescDestroy);
    LOAD(desc_set, cublasLtMatmulDescSetAttribute);
    LOAD(layout_create, cublasLtMatrixLayoutCreate);
    LOAD(layout_destroy, cublasLtMatrixLayoutDestroy);
    LOAD(layout_set, cublasLtMatrixLayoutSetAttribute);
    LOAD(pref_create, cublasLtMatmulPreferenceCreate);
    LOAD(pref_destroy, cublasLtMatmulPreferenceDestroy);
    LOAD(pref_set, cublasLtMatmulPreferenceSetAttribute);
    LOAD(heuristic, cublasLtMatmulAlgoGetHeuristic);
    LOAD(matmul, cublasLtMatmul);
#undef LOAD
    if (missing) {
        snprintf(why, sizeof why, "%s lacks cuBLASLt functions this build uses: install cuBLAS %d",
                 names[0], CUBLAS_VER_MAJOR);
        dlclose(h);
        free(g);
        return why;
    }
    *version = a->get_version();
    if (*version / 10000 != CUBLAS_VER_MAJOR) {
        snprintf(why, sizeof why, "cuBLASLt %zu is loaded but this build needs major version %d",
                 *version, CUBLAS_VER_MAJOR);
        dlclose(h);
        free(g);
        return why;
    }
    cublasStatus_t s = a->create(&g->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "cuBLASLt does not start (status %d)", (int)s);
        dlclose(h);
        free(g);
        return why;
    }
    c->gemm = g;
    return NULL;
}

static void plan_release(struct lt_api *a, struct gemm_plan *p)
{
    if (p->desc)
        a->desc_destroy(p->desc);
    if (p->la)
        a->layout_destroy(p->la);
    if (p->lb)
        a->layout_destroy(p->lb);
    if (p->lc)
        a->layout_destroy(p->lc);
    memset(p, 0, sizeof *p);
}

void cuda_gemm_close(struct cuda_context *c)
{
    struct gemm_cache *g = c->gemm;
    if (!g)
        return;
    for (int i = 0; i < g->n; i++)
        plan_release(&g->api, &g->plans[i]);
    g->api.destroy(g->lt);
    /* the library stays mapped: unloading it under a live CUDA context is not safe */
    free(g);
    c->gemm = NULL;
}

static cublasLtMatrixLayout_t make_layout(struct lt_api *a, int dt, int rows, int cols, int ld,
                                          int batch, long long stride, int *ok)
{
    cublasLtMatrixLayout_t l = NULL;
    if (a->layout_create(&l, cuda_type(dt), (uint64_t)rows, (uint64_t)cols, (int64_t)ld) !=
        CUBLAS_STATUS_SUCCESS) {
        *ok = 0;
        return NULL;
    }
    if (batch > 1) {
        int32_t count = batch;
        int64_t offset = stride;
        *ok &= a->layout_set(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count) ==
               CUBLAS_STATUS_SUCCESS;
        *ok &= a->layout_set(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset,
                             sizeof offset) == CUBLAS_STATUS_SUCCESS;
    }
    return l;
}

/* In cuBLASLt's column-major terms the row-major C = op(A) op(B) is
 * C^T = op(B)^T op(A)^T: A' is B, B' is A, and a row-major X is the
 * column-major X^T in the same memory. */
static void plan_build(struct gemm_cache *g, struct gemm_plan *p)
{
    struct lt_api *a = &g->api;
    const struct gemm_key *k = &p->key;
    int ok = 1;
    cublasComputeType_t compute = k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    ok &= a->desc_create(&p->desc, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    if (!ok)
        return;
    int32_t op_a = k->op_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* A' = B */
    int32_t op_b = k->op_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* B' = A */
    ok &= a->desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a) ==
          CUBLAS_STATUS_SUCCESS;
    ok &= a->desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b) ==
          CUBLAS_STATUS_SUCCESS;
    if (k->bias) {
        cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        ok &= a->desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue) ==
              CUBLAS_STATUS_SUCCESS;
    }
    /* A' (= B): N x K as stored, or K x N transposed */
    p->la = k->op_b ? make_layout(a, k->ab_dt, k->k, k->n, k->ldb, k->batch, k->stride_b, &ok)
                    : make_layout(a, k->ab_dt, k->n, k->k, k->ldb, k->batch, k->stride_b, &ok);
    /* B' (= A): K x M as stored, or M x K transposed */
    p->lb = k->op_a ? make_layout(a, k->ab_dt, k->m, k->k, k->lda, k->batch, k->stride_a, &ok)
                    : make_layout(a, k->ab_dt, k->k, k->m, k->lda, k->batch, k->stride_a, &ok);
    p->lc = make_layout(a, k->c_dt, k->n, k->m, k->ldc, k->batch, k->stride_c, &ok);
    if (!ok)
        return;
    cublasLtMatmulPreference_t pref = NULL;
    if (a->pref_create(&pref) != CUBLAS_STATUS_SUCCESS)
        return;
    uint64_t workspace = LT_WORKSPACE_BYTES;
    uint32_t align_a = (uint32_t)k->align_b, align_b = (uint32_t)k->align_a,
             align_c = (uint32_t)k->align_c;
    a->pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
    a->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
    a->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
    a->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c);
    a->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    memset(&result, 0, sizeof result);
    if (a->heuristic(g->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &result, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
        p->algo = result.algo;
        p->ok = 1;
    }
    a->pref_destroy(pref);
}

static struct gemm_plan *plan_for(struct gemm_cache *g, const struct gemm_key *key)
{
    for (int i = 0; i < g->n; i++)
        if (memcmp(&g->plans[i].key, key, sizeof *key) == 0)
            return &g->plans[i];
    struct gemm_plan *p;
    if (g->n < GEMM_PLANS) {
        p = &g->plans[g->n++];
    } else { /* more distinct products than slots: reuse the oldest */
        p = &g->plans[g->next_evict];
        g->next_evict = (g->next_evict + 1) % GEMM_PLANS;
        plan_release(&g->api, p);
    }
    p->key = *key;
    plan_build(g, p);
    return p;
}

void cuda_gemm(struct cuda_context *c, int trans_a, int trans_b, int M, int N, int K, float alpha,
               const void *A, int lda, long long stride_a, const void *B, int ldb,
               long long stride_b, float beta, void *C, int ldc, long long stride_c, int batch,
               int ab_dt, int c_dt, const void *bias)
{
    struct gemm_cache *g = c->gemm;
    if (M <= 0 || N <= 0 || batch <= 0)
        return;
    if (K <= 0) { /* an empty sum: C = beta C (+ bias); not worth a special path here */
        cuda_note(c, cudaErrorInvalidValue, "gemm with an empty inner dimension");
        return;
    }
    struct gemm_key key;
    memset(&key, 0, sizeof key); /* the key is compared bytewise, padding included */
    key.op_a = trans_a;
    key.op_b = trans_b;
    key.m = M;
    key.n = N;
    key.k = K;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.batch = batch;
    key.stride_a = batch > 1 ? stride_a : 0;
    key.stride_b = batch > 1 ? stride_b : 0;
    key.stride_c = batch > 1 ? stride_c : 0;
    key.ab_dt = ab_dt;
    key.c_dt = c_dt;
    key.tf32 = c->allow_tf32 && ab_dt == DT_F32;
    key.align_a = alignment(A, key.stride_a * (long long)dt_size(ab_dt));
    key.align_b = alignment(B, key.stride_b * (long long)dt_size(ab_dt));
    key.align_c = alignment(C, key.stride_c * (long long)dt_size(c_dt));
    /* the bias epilogue only for a single product and a 16-byte aligned
     * bias; otherwise a separate pass adds it */
    int fused_bias = bias && batch == 1 && ((uintptr_t)bias & 15) == 0;
    key.bias = fused_bias;
    key.align_bias = fused_bias ? 16 : 0;
    struct gemm_plan *p = plan_for(g, &key);
    if (!p->ok && fused_bias) {
        key.bias = 0;
        key.align_bias = 0;
        fused_bias = 0;
        p = plan_for(g, &key);
    }
    if (!p->ok) {
        cuda_note(c, cudaErrorNotSupported, "cuBLASLt has no algorithm for a GEMM of this graph");
        return;
    }
    if (fused_bias)
        g->api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cublasStatus_t s = g->api.matmul(g->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc,
                                     C, p->lc, &p->algo, c->lt_workspace, LT_WORKSPACE_BYTES,
                                     c->compute);
    if (s != CUBLAS_STATUS_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cublasLtMatmul failed with status %d", (int)s);
        cuda_note(c, cudaErrorLaunchFailure, what);
        return;
    }
    if (bias && !fused_bias)
        for (int i = 0; i < batch; i++)
            cuda_add_bias(c, c_dt, (char *)C + (size_t)i * stride_c * dt_size(c_dt), bias, M, N,
                          ldc);
}
