/*
 * The GEMM ceiling of this machine, as oneDNN reaches it: fp32 (dnnl_sgemm)
 * and bf16 inputs with fp32 accumulation, both at 2048^3, best of a few
 * timed repetitions after a warm-up call.  bf16 is the better of oneDNN's two
 * routes: the GEMM function dnnl_gemm_bf16bf16f32 and a matmul primitive
 * (bf16 src and weights, f32 dst: what trainrun's CPU backend runs, one
 * primitive per tile); both figures go to stderr.  The training benchmark
 * (cpu_gpt.sh) divides achieved FLOP rates by these.
 *
 *   gcc -O2 -fopenmp gemm_ceiling.c -o gemm_ceiling -ldnnl
 *   OMP_NUM_THREADS=2 ./gemm_ceiling          # prints: <fp32 GFLOP/s> <bf16 GFLOP/s>
 *   ./gemm_ceiling 2                          # same, thread count as argument
 *   ./gemm_ceiling 2 fp32                     # fp32 only: prints <fp32 GFLOP/s>
 *                                             (tests/e2e/step-efficiency.sh)
 *   GEMM_CEILING_CLOCK=cpu OMP_WAIT_POLICY=passive ./gemm_ceiling 2
 *       times each call by the process's CPU time instead, divided by the
 *       thread count: what the threads reach while they run, for a machine
 *       others are loading (cpu_bf16.sh divides CPU-time step rates by it)
 *
 * oneDNN has no bf16 GEMM for CPUs without AVX512 (e.g. AVX2-only ones);
 * there the second number is "n/a".  On AVX-512 CPUs without bf16
 * instructions oneDNN emulates them, so the figure is below fp32's.
 */
#include <dnnl.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Exported by libdnnl but, in the 2.x headers Debian ships, not declared.
 * oneDNN's bfloat16_t is a struct holding one uint16_t, so a uint16_t
 * pointer has the same layout. */
dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                    dnnl_dim_t K, float alpha, const uint16_t *A, dnnl_dim_t lda,
                                    const uint16_t *B, dnnl_dim_t ldb, float beta, float *C,
                                    dnnl_dim_t ldc);

enum { N = 2048, REPS = 5 };

/* GEMM_CEILING_CLOCK=cpu: process CPU time over the threads, not wall time */
static int cpu_clock, threads = 1;

static double now(void)
{
    struct timespec ts;
    clock_gettime(cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (ts.tv_sec + ts.tv_nsec * 1e-9) / (cpu_clock ? threads : 1);
}

/* round to nearest even: the same conversion trainrun's kernels use */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static void check(dnnl_status_t s, const char *what)
{
    if (s != dnnl_success) {
        fprintf(stderr, "gemm_ceiling: %s failed (status %d)\n", what, (int)s);
        exit(1);
    }
}

/* The best time of a threaded bf16 x bf16 -> f32 matmul primitive on the
 * same matrices; 0 where oneDNN has none for this CPU. */
static double matmul_bf16_seconds(const uint16_t *a, const uint16_t *b, float *c)
{
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t dims = {N, N};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    check(dnnl_engine_create(&engine, dnnl_cpu, 0), "dnnl_engine_create");
    check(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "dnnl_stream_create");
    check(dnnl_memory_desc_init_by_tag(&a_md, 2, dims, dnnl_bf16, dnnl_ab), "memory desc");
    check(dnnl_memory_desc_init_by_tag(&b_md, 2, dims, dnnl_bf16, dnnl_ab), "memory desc");
    check(dnnl_memory_desc_init_by_tag(&c_md, 2, dims, dnnl_f32, dnnl_ab), "memory desc");
    check(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md), "dnnl_matmul_desc_init");
    if (dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL) != dnnl_success)
        return 0;
    check(dnnl_primitive_create(&prim, pd), "dnnl_primitive_create");
    dnnl_memory_t am, bm, cm;
    check(dnnl_memory_create(&am, &a_md, engine, (void *)a), "dnnl_memory_create");
    check(dnnl_memory_create(&bm, &b_md, engine, (void *)b), "dnnl_memory_create");
    check(dnnl_memory_create(&cm, &c_md, engine, c), "dnnl_memory_create");
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    double best = 1e30;
    for (int rep = 0; rep <= REPS; rep++) {
        double t = now();
        check(dnnl_primitive_execute(prim, stream, 3, args), "dnnl_primitive_execute");
        check(dnnl_stream_wait(stream), "dnnl_stream_wait");
        t = now() - t;
        if (rep > 0 && t < best)
            best = t;
    }
    dnnl_memory_destroy(am), dnnl_memory_destroy(bm), dnnl_memory_destroy(cm);
    dnnl_primitive_destroy(prim), dnnl_primitive_desc_destroy(pd);
    dnnl_stream_destroy(stream), dnnl_engine_destroy(engine);
    return best;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        omp_set_num_threads(atoi(argv[1]));
    threads = omp_get_max_threads();
    cpu_clock = getenv("GEMM_CEILING_CLOCK") && strcmp(getenv("GEMM_CEILING_CLOCK"), "cpu") == 0;
    size_t n2 = (size_t)N * N;
    float *a = malloc(n2 * sizeof *a), *b = malloc(n2 * sizeof *b), *c = malloc(n2 * sizeof *c);
    uint16_t *ah = malloc(n2 * sizeof *ah), *bh = malloc(n2 * sizeof *bh);
    if (!a || !b || !c || !ah || !bh) {
        fprintf(stderr, "gemm_ceiling: out of memory\n");
        return 1;
    }
    /* values in [-1, 1): no denormals or overflow to slow anything down */
    srand(1);
    for (size_t i = 0; i < n2; i++) {
        a[i] = (float)rand() / RAND_MAX * 2 - 1;
        b[i] = (float)rand() / RAND_MAX * 2 - 1;
        ah[i] = to_bf16(a[i]);
        bh[i] = to_bf16(b[i]);
    }
    int fp32_only = argc > 2 && strcmp(argv[2], "fp32") == 0;
    double flop = 2.0 * N * N * N, best32 = 1e30, best16 = 1e30;
    /* rep 0 is the warm-up: JIT code generation and first-touch page faults */
    for (int rep = 0; rep <= REPS; rep++) {
        double t = now();
        check(dnnl_sgemm('N', 'N', N, N, N, 1.0f, a, N, b, N, 0.0f, c, N), "dnnl_sgemm");
        t = now() - t;
        if (rep > 0 && t < best32)
            best32 = t;
    }
    if (fp32_only) {
        printf("%.1f\n", flop / best32 / 1e9);
        free(a), free(b), free(c), free(ah), free(bh);
        return 0;
    }
    int have_bf16 = 1;
    for (int rep = 0; rep <= REPS && have_bf16; rep++) {
        double t = now();
        dnnl_status_t s =
            dnnl_gemm_bf16bf16f32('N', 'N', N, N, N, 1.0f, ah, N, bh, N, 0.0f, c, N);
        t = now() - t;
        if (s == dnnl_unimplemented) { /* no bf16 kernel for this CPU */
            have_bf16 = 0;
            break;
        }
        check(s, "dnnl_gemm_bf16bf16f32");
        if (rep > 0 && t < best16)
            best16 = t;
    }
    double best_matmul = have_bf16 ? matmul_bf16_seconds(ah, bh, c) : 0;
    if (have_bf16) {
        fprintf(stderr, "bf16: dnnl_gemm_bf16bf16f32 %.1f GFLOP/s, matmul primitive %.1f GFLOP/s\n",
                flop / best16 / 1e9, best_matmul > 0 ? flop / best_matmul / 1e9 : 0.0);
        if (best_matmul > 0 && best_matmul < best16)
            best16 = best_matmul;
    }
    if (have_bf16)
        printf("%.1f %.1f\n", flop / best32 / 1e9, flop / best16 / 1e9);
    else
        printf("%.1f n/a\n", flop / best32 / 1e9);
    free(a), free(b), free(c), free(ah), free(bh);
    return 0;
}
