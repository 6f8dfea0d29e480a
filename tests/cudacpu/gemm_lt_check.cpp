/*
 * kernels/cuda/gemm.cu itself, on the CPU: compiled with g++ (cu2cpp.pl)
 * against the cuBLASLt stand-in (include/cublasLt.h) and dlopening the fake
 * library tests/cudacpu/cublaslt.cpp, which records each GEMM's compute type
 * and computes it.  Checks:
 *   - fp32 GEMMs run with CUBLAS_COMPUTE_32F, and with
 *     CUBLAS_COMPUTE_32F_FAST_TF32 exactly when the context allows tf32
 *     (the graph's allow_tf32, set by nodes.cu); switching back and forth
 *     on one shape gets each its own cached plan;
 *   - 16-bit inputs keep CUBLAS_COMPUTE_32F whatever the flag;
 *   - gemm.cu's row-major products through column-major cuBLASLt (the
 *     operand swap, transposes, strided batches, the bias epilogue) give the
 *     right numbers, with tf32-rounded inputs under fast-TF32;
 *   - the products run on the context's compute stream: the fake queues
 *     them on the stream gemm.cu names, and C holds them only once that
 *     stream is synchronised.
 * The backend the other cudacpu tests run uses tests/cudacpu/gemm_ref.cu
 * instead, so this is the one test of gemm.cu short of a GPU.
 */
#include "common.cuh.hpp"

#include <cublasLt.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "gemm_lt_check:%d: ", __LINE__);                                       \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* what gemm.cu needs from the rest of the backend */
static int notes;
void cuda_note(struct cuda_context *c, cudaError_t e, const char *what)
{
    (void)c;
    if (e != cudaSuccess) {
        fprintf(stderr, "gemm_lt_check: gemm.cu reported: %s\n", what);
        notes++;
    }
}
/* the bias pass, queued on the compute stream after the product as ops.cu's
 * kernel is */
struct bias_job {
    float *out;
    const float *bias;
    int M, N, ldc;
};
static void add_bias_now(void *arg)
{
    struct bias_job *j = (struct bias_job *)arg;
    for (int m = 0; m < j->M; m++)
        for (int n = 0; n < j->N; n++)
            j->out[(size_t)m * j->ldc + n] += j->bias[n];
    free(j);
}
void cuda_add_bias(struct cuda_context *c, int dt, void *out, const void *bias, int M, int N,
                   int ldc)
{
    (void)dt;
    struct bias_job *j = (struct bias_job *)malloc(sizeof *j);
    *j = {(float *)out, (const float *)bias, M, N, ldc};
    cuda_note(c, cudaLaunchHostFunc(c->compute, add_bias_now, j), "cudaLaunchHostFunc");
}

static float tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint16_t bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* row-major C = op(A) op(B) (+ bias) of `batch` products, in double */
static void reference(int ta, int tb, int M, int N, int K, const float *A, const float *B,
                      const float *bias, int batch, int round, double *C)
{
    for (int p = 0; p < batch; p++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double acc = bias ? bias[n] : 0;
                for (int k = 0; k < K; k++) {
                    float x = A[(size_t)p * M * K + (ta ? (size_t)k * M + m : (size_t)m * K + k)];
                    float y = B[(size_t)p * K * N + (tb ? (size_t)n * K + k : (size_t)k * N + n)];
                    acc += round ? (double)tf32(x) * tf32(y) : (double)x * y;
                }
                C[((size_t)p * M + m) * N + n] = acc;
            }
}

static const int *(*lt_log)(int *n);

static int last_compute(void)
{
    int n;
    const int *log = lt_log(&n);
    return n > 0 ? log[n - 1] : -1;
}

/* one fp32 product through cuda_gemm; its largest error against the
 * reference with (round = 1) or without tf32 rounding, relative to values
 * of 1 and more, absolute below (sums near 0 have float accumulation noise
 * of ~1e-6; tf32's rounding moves them by ~1e-3) */
static double run_fp32(struct cuda_context *c, int ta, int tb, int batch, int with_bias, int round)
{
    enum { M = 5, N = 7, K = 33 };
    static float A[2 * M * K], B[2 * K * N], C[2 * M * N], bias[N];
    static double want[2 * M * N];
    for (int i = 0; i < 2 * M * K; i++)
        A[i] = (float)((i * 7919 % 1013) / 1013.0 - 0.5) * 1.0001f;
    for (int i = 0; i < 2 * K * N; i++)
        B[i] = (float)((i * 104729 % 997) / 997.0 - 0.5) * 0.9999f;
    for (int n = 0; n < N; n++)
        bias[n] = 0.25f * n;
    memset(C, 0, sizeof C);
    cuda_gemm(c, ta, tb, M, N, K, 1.0f, A, ta ? M : K, (long long)M * K, B, tb ? K : N,
              (long long)K * N, 0.0f, C, N, (long long)M * N, batch, DT_F32, DT_F32,
              with_bias ? bias : NULL);
    /* queued on the compute stream (the harness's streams are queues):
     * nothing written before it runs, all of it after */
    int untouched = 1;
    for (int i = 0; i < batch * M * N; i++)
        untouched &= C[i] == 0.0f;
    CHECK(untouched, "the GEMM wrote C before its stream ran it");
    CHECK(cudaStreamSynchronize(c->compute) == cudaSuccess, "the compute stream failed");
    reference(ta, tb, M, N, K, A, B, with_bias ? bias : NULL, batch, round, want);
    double worst = 0;
    for (int i = 0; i < batch * M * N; i++) {
        double e = fabs(C[i] - want[i]) / (fabs(want[i]) > 1 ? fabs(want[i]) : 1);
        worst = e > worst ? e : worst;
    }
    return worst;
}

int main(void)
{
    struct cuda_context *c = (struct cuda_context *)calloc(1, sizeof *c);
    /* as backend.cu's open(): GEMMs go on a non-blocking compute stream,
     * which a GEMM queued on the legacy default stream does not join */
    if (cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "gemm_lt_check: no stream\n");
        return 1;
    }
    size_t version = 0;
    const char *why = cuda_gemm_open(c, &version);
    if (why) {
        fprintf(stderr, "gemm_lt_check: the fake cuBLASLt did not open: %s\n", why);
        return 1;
    }
    void *lib = dlopen(TR_CUDA_HOME "/lib64/libcublasLt.so.99", RTLD_NOW | RTLD_NOLOAD);
    lt_log = lib ? (const int *(*)(int *))dlsym(lib, "cudacpu_lt_log") : NULL;
    if (!lt_log) {
        fprintf(stderr, "gemm_lt_check: gemm.cu loaded some other library than the fake one\n");
        return 1;
    }

    /* every layout gemm.cu maps: transposes, strided batches, fused bias */
    for (int tf = 0; tf <= 1; tf++) {
        c->allow_tf32 = tf;
        int want = tf ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        for (int ta = 0; ta <= 1; ta++)
            for (int tb = 0; tb <= 1; tb++)
                for (int batch = 1; batch <= 2; batch++) {
                    int with_bias = batch == 1;
                    double e = run_fp32(c, ta, tb, batch, with_bias, tf);
                    CHECK(e < 1e-5, "fp32 GEMM (tf32 %d, trans %d%d, batch %d): relative error %g",
                          tf, ta, tb, batch, e);
                    CHECK(last_compute() == want,
                          "fp32 GEMM with allow_tf32 = %d ran with compute type %d, not %d", tf,
                          last_compute(), want);
                }
    }
    /* tf32 changes the numbers: the fast-TF32 result is not the fp32 one */
    c->allow_tf32 = 1;
    double off = run_fp32(c, 0, 1, 1, 0, 0);
    CHECK(off > 1e-4, "a tf32 GEMM agrees with full fp32 to %g: its inputs were not rounded", off);
    /* one shape, the flag switched: each setting its own plan */
    c->allow_tf32 = 0;
    run_fp32(c, 0, 1, 1, 0, 0);
    CHECK(last_compute() == CUBLAS_COMPUTE_32F, "a cached tf32 plan ran with tf32 off");
    c->allow_tf32 = 1;
    run_fp32(c, 0, 1, 1, 0, 1);
    CHECK(last_compute() == CUBLAS_COMPUTE_32F_FAST_TF32, "a cached fp32 plan ran with tf32 on");

    /* bf16 inputs: CUBLAS_COMPUTE_32F (already tensor cores), tf32 or not */
    uint16_t a[4 * 8], b[8 * 3];
    float out[4 * 3];
    for (int i = 0; i < 32; i++)
        a[i] = bf16(0.125f * (i % 5) - 0.25f);
    for (int i = 0; i < 24; i++)
        b[i] = bf16(0.5f - 0.0625f * (i % 7));
    for (int tf = 0; tf <= 1; tf++) {
        c->allow_tf32 = tf;
        cuda_gemm(c, 0, 0, 4, 3, 8, 1.0f, a, 8, 0, b, 3, 0, 0.0f, out, 3, 0, 1, DT_BF16, DT_F32,
                  NULL);
        CHECK(last_compute() == CUBLAS_COMPUTE_32F,
              "a bf16 GEMM with allow_tf32 = %d ran with compute type %d", tf, last_compute());
    }
    CHECK(notes == 0, "gemm.cu reported %d failures", notes);
    int n;
    lt_log(&n);
    CHECK(cudaStreamSynchronize(c->compute) == cudaSuccess, "the compute stream failed");
    cuda_gemm_close(c);
    cudaStreamDestroy(c->compute);
    free(c);
    if (failures) {
        fprintf(stderr, "gemm_lt_check: %d checks failed\n", failures);
        return 1;
    }
    printf("gemm_lt_check: %d cuBLASLt GEMMs through gemm.cu: compute types and results right\n", n);
    return 0;
}
