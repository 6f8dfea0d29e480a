/*
 * Every GEMM of the Linear layers of one training step of cpu_gpt.sh's GPT,
 * timed through trainrun's kernels and, for comparison, through one threaded
 * oneDNN call on the same shape.  Large shape (default): 12 layers, dim 768,
 * ctx 256, batch 8 (2048 tokens), vocab 256; medium: 6 layers, dim 384,
 * ctx 256, batch 8, vocab 256; small: 4 layers, dim 128, ctx 128, batch 32
 * (4096 tokens), vocab 256; gpt2-t64: GPT-2 124M (12 layers, dim 768, vocab
 * 50257) at ctx 64, batch 4 (256 tokens); smollm-135m: SmolLM-135M's Llama
 * shape (30 layers, dim 576, k/v 192, MLP 1536, vocab 49152) at ctx 256,
 * batch 4 (1024 tokens), as contrib/bench/lora.sh runs it.
 *
 * With `bf16` as the fourth argument the trainrun column is the native bf16
 * path instead (tr_cpu_linear_forward_bf16 / _backward_bf16, the operands'
 * conversion to bf16 included, as the CPU backend runs it under precision
 * bf16), next to trainrun's fp32 on the same shape; the ceiling is then the
 * bf16 one (gemm_ceiling's second number; "n/a" without it).  With
 * `bf16-stored` instead, the bf16 operands are converted once before the
 * timing, as a training step holds them (activations stored in bf16 under the
 * policy, weights from AdamW's bf16 copy; only the output gradient is
 * converted in a step, once for both gradients): the GEMMs alone.
 *
 * For each Linear (out = x @ W^T + b) three products: the forward, the input
 * gradient dx = dout @ W and the weight gradient dW += dout^T @ x, each as
 * tr_cpu_linear_forward / tr_cpu_linear_backward run it (backward with only
 * that gradient requested; the forward includes filling out with the bias).
 * The oneDNN column is dnnl_sgemm with oneDNN's own threading and the same
 * transposes (forward N,T; dx N,N; dW T,N): what a GEMM whose results may
 * depend on the thread count reaches.  Each figure is
 * the best of REPS timed calls after one warm-up call.  The last line weighs
 * each product by how often a step runs it (once per block, once for the
 * head) and gives the Linear GEMM time of one step, both ways.
 *
 * Build against a build directory's kernels (from the repository root):
 *   cc -O2 -fopenmp -Iinclude -Ikernels/cpu contrib/bench/gemm_shapes.c \
 *      BUILD/.libs/libtrkernels.a -o gemm_shapes -ldnnl -lm
 *   OMP_NUM_THREADS=2 ./gemm_shapes [large|medium|small|gpt2-t64|smollm-135m|smollm-360m] [reps] [ceiling GFLOP/s] [fp32|bf16|bf16-stored]
 *   GEMM_SHAPES_CLOCK=cpu OMP_NUM_THREADS=1 ./gemm_shapes medium 5 0 bf16   # on a loaded machine
 *
 * Without a ceiling (or with 0) fp32 measures one, dnnl_sgemm at 2048^3 as
 * gemm_ceiling.c does (5 repetitions by default).
 */
#include <dnnl.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

struct model {
    const char *name;
    int tokens, dim, layers, vocab;
    int kv, inter; /* a Llama block's k/v width and MLP width; 0: a GPT block */
};

static const struct model models[] = {
    {"large", 8 * 256, 768, 12, 256},
    {"medium", 8 * 256, 384, 6, 256},
    {"small", 32 * 128, 128, 4, 256},
    {"gpt2-t64", 4 * 64, 768, 12, 50257}, /* GPT-2 124M at ctx 64, batch 4 (cpu_bf16.sh) */
    /* SmolLM-135M's shape at ctx 256, batch 4 (lora.sh) */
    {"smollm-135m", 4 * 256, 576, 30, 49152, 192, 1536},
    /* SmolLM-360M's shape at ctx 256, batch 4 (lora.sh) */
    {"smollm-360m", 4 * 256, 960, 32, 49152, 320, 2560},
};

struct linear_shape {
    const char *name;
    int in, out, bias, per_step;
};

enum { LINEARS_MAX = 8 };

/* The Linears of a GPT or Llama block, then the (tied, bias-free) output
 * head; returns how many. */
static int linear_shapes(const struct model *g, struct linear_shape s[LINEARS_MAX])
{
    int C = g->dim, L = g->layers;
    if (g->inter > 0) {
        s[0] = (struct linear_shape){"q_proj", C, C, 0, L};
        s[1] = (struct linear_shape){"k_proj", C, g->kv, 0, L};
        s[2] = (struct linear_shape){"v_proj", C, g->kv, 0, L};
        s[3] = (struct linear_shape){"o_proj", C, C, 0, L};
        s[4] = (struct linear_shape){"gate_proj", C, g->inter, 0, L};
        s[5] = (struct linear_shape){"up_proj", C, g->inter, 0, L};
        s[6] = (struct linear_shape){"down_proj", g->inter, C, 0, L};
        s[7] = (struct linear_shape){"lm_head", C, g->vocab, 0, 1};
        return 8;
    }
    s[0] = (struct linear_shape){"attn.c_attn", C, 3 * C, 1, L};
    s[1] = (struct linear_shape){"attn.c_proj", C, C, 1, L};
    s[2] = (struct linear_shape){"mlp.c_fc", C, 4 * C, 1, L};
    s[3] = (struct linear_shape){"mlp.c_proj", 4 * C, C, 1, L};
    s[4] = (struct linear_shape){"lm_head", C, g->vocab, 0, 1};
    return 5;
}

/* CLOCK_MONOTONIC; with GEMM_SHAPES_CLOCK=cpu in the environment the calling
 * thread's CPU time instead, which time slices given to other processes do
 * not inflate: for OMP_NUM_THREADS=1 on a machine others are loading. */
static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *random_floats(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (p == NULL) {
        fprintf(stderr, "gemm_shapes: out of memory\n");
        exit(1);
    }
    /* values in [-1, 1): no denormals, no overflow when accumulating */
    for (size_t i = 0; i < n; i++)
        p[i] = (float)rand() / RAND_MAX * 2 - 1;
    return p;
}

static void check(dnnl_status_t s)
{
    if (s != dnnl_success) {
        fprintf(stderr, "gemm_shapes: dnnl_sgemm failed (status %d)\n", (int)s);
        exit(1);
    }
}

enum pass { FORWARD, INPUT_GRAD, WEIGHT_GRAD };

struct buffers {
    int tokens;
    float *x, *w, *b, *out, *dout, *dx, *dw;
    uint16_t *x16, *w16, *dout16; /* bf16 copies, converted in each timed call unless stored */
    int stored;
};

/* One product of one Linear, as trainrun runs it. */
static void run_trainrun(enum pass pass, const struct linear_shape *s, struct buffers *m)
{
    switch (pass) {
    case FORWARD:
        tr_cpu_linear_forward(m->out, m->x, m->w, s->bias ? m->b : NULL, m->tokens, s->in, s->out);
        break;
    case INPUT_GRAD:
        tr_cpu_linear_backward(m->dx, NULL, NULL, m->dout, m->x, m->w, m->tokens, s->in, s->out, 0);
        break;
    case WEIGHT_GRAD:
        tr_cpu_linear_backward(NULL, m->dw, NULL, m->dout, m->x, m->w, m->tokens, s->in, s->out, 0);
        break;
    }
}

/* One product of one Linear on the native bf16 path, converting its two
 * operands first unless m->stored (the backend converts dout once for both
 * gradients; here each gradient pays for its own two). */
static void run_trainrun_bf16(enum pass pass, const struct linear_shape *s, struct buffers *m)
{
    size_t x_n = (size_t)m->tokens * s->in, w_n = (size_t)s->in * s->out;
    size_t out_n = (size_t)m->tokens * s->out;
    switch (pass) {
    case FORWARD:
        if (!m->stored) {
            tr_cpu_to_bf16(m->x16, m->x, x_n);
            tr_cpu_to_bf16(m->w16, m->w, w_n);
        }
        tr_cpu_linear_forward_bf16(m->out, m->x16, m->w16, s->bias ? m->b : NULL, m->tokens,
                                   s->in, s->out);
        break;
    case INPUT_GRAD:
        if (!m->stored) {
            tr_cpu_to_bf16(m->dout16, m->dout, out_n);
            tr_cpu_to_bf16(m->w16, m->w, w_n);
        }
        tr_cpu_linear_backward_bf16(m->dx, NULL, m->dout16, m->x16, m->w16, m->tokens, s->in,
                                    s->out, 0);
        break;
    case WEIGHT_GRAD:
        if (!m->stored) {
            tr_cpu_to_bf16(m->dout16, m->dout, out_n);
            tr_cpu_to_bf16(m->x16, m->x, x_n);
        }
        tr_cpu_linear_backward_bf16(NULL, m->dw, m->dout16, m->x16, m->w16, m->tokens, s->in,
                                    s->out, 0);
        break;
    }
}

/* The same product as one threaded oneDNN call. */
static void run_dnnl(enum pass pass, const struct linear_shape *s, struct buffers *m)
{
    int N = m->tokens, IC = s->in, OC = s->out;
    switch (pass) {
    case FORWARD: /* out[N,OC] = x[N,IC] @ w[OC,IC]^T */
        check(dnnl_sgemm('N', 'T', N, OC, IC, 1.0f, m->x, IC, m->w, IC, 0.0f, m->out, OC));
        break;
    case INPUT_GRAD: /* dx[N,IC] += dout[N,OC] @ w[OC,IC] */
        check(dnnl_sgemm('N', 'N', N, IC, OC, 1.0f, m->dout, OC, m->w, IC, 1.0f, m->dx, IC));
        break;
    case WEIGHT_GRAD: /* dw[OC,IC] += dout[N,OC]^T @ x[N,IC] */
        check(dnnl_sgemm('T', 'N', OC, IC, N, 1.0f, m->dout, OC, m->x, IC, 1.0f, m->dw, IC));
        break;
    }
}

typedef void (*runner)(enum pass, const struct linear_shape *, struct buffers *);

static double best_seconds(runner run, enum pass pass, const struct linear_shape *s,
                           struct buffers *m, int reps)
{
    double best = 1e30;
    for (int rep = 0; rep <= reps; rep++) { /* rep 0: warm-up */
        double t = now();
        run(pass, s, m);
        t = now() - t;
        if (rep > 0 && t < best)
            best = t;
    }
    return best;
}

static double measure_ceiling(int reps)
{
    enum { SIZE = 2048 };
    size_t n2 = (size_t)SIZE * SIZE;
    float *a = random_floats(n2), *b = random_floats(n2), *c = random_floats(n2);
    double best = 1e30;
    for (int rep = 0; rep <= reps; rep++) {
        double t = now();
        check(dnnl_sgemm('N', 'N', SIZE, SIZE, SIZE, 1.0f, a, SIZE, b, SIZE, 0.0f, c, SIZE));
        t = now() - t;
        if (rep > 0 && t < best)
            best = t;
    }
    free(a), free(b), free(c);
    return 2.0 * SIZE * SIZE * SIZE / best / 1e9;
}

/* What the command line asks for. */
struct options {
    const struct model *g;
    int reps, bf16, stored;
    double ceiling; /* GFLOP/s; 0: none */
};

/* argv into o; -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct options *o)
{
    o->g = &models[0];
    if (argc > 1) {
        o->g = NULL;
        for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
            if (strcmp(argv[1], models[i].name) == 0)
                o->g = &models[i];
        if (o->g == NULL) {
            fprintf(stderr, "usage: gemm_shapes [large|medium|small|gpt2-t64|smollm-135m|smollm-360m] [reps] [ceiling GFLOP/s] "
                            "[fp32|bf16|bf16-stored]\n");
            return 2;
        }
    }
    o->reps = argc > 2 ? atoi(argv[2]) : 5;
    if (o->reps < 1)
        o->reps = 1;
    const char *clock_name = getenv("GEMM_SHAPES_CLOCK");
    if (clock_name != NULL && strcmp(clock_name, "cpu") == 0) {
        if (omp_get_max_threads() != 1) {
            fprintf(stderr, "gemm_shapes: GEMM_SHAPES_CLOCK=cpu times one thread: set OMP_NUM_THREADS=1\n");
            return 2;
        }
        clock_id = CLOCK_THREAD_CPUTIME_ID;
    }
    o->stored = argc > 4 && strcmp(argv[4], "bf16-stored") == 0;
    o->bf16 = o->stored || (argc > 4 && strcmp(argv[4], "bf16") == 0);
    if (o->bf16 && !tr_cpu_gemm_bf16_available()) {
        fprintf(stderr, "gemm_shapes: oneDNN has no bf16 matmul for this CPU\n");
        return 1;
    }
    o->ceiling = argc > 3 ? atof(argv[3]) : 0;
    if (o->ceiling <= 0 && !o->bf16)
        o->ceiling = measure_ceiling(5);
    return -1;
}

/* Operands for the largest of the linears, random, with bf16 copies; -1
 * when out of memory. */
static int alloc_buffers(const struct model *g, const struct linear_shape *linears, int count,
                         int stored, struct buffers *m)
{
    size_t max_in = 0, max_out = 0;
    for (int i = 0; i < count; i++) {
        if ((size_t)linears[i].in > max_in)
            max_in = linears[i].in;
        if ((size_t)linears[i].out > max_out)
            max_out = linears[i].out;
    }
    size_t T = g->tokens;
    *m = (struct buffers){
        .tokens = g->tokens,
        .x = random_floats(T * max_in),
        .w = random_floats(max_in * max_out),
        .b = random_floats(max_out),
        .out = random_floats(T * max_out),
        .dout = random_floats(T * max_out),
        .dx = random_floats(T * max_in),
        .dw = random_floats(max_in * max_out),
        .x16 = malloc(T * max_in * sizeof(uint16_t)),
        .w16 = malloc(max_in * max_out * sizeof(uint16_t)),
        .dout16 = malloc(T * max_out * sizeof(uint16_t)),
        .stored = stored,
    };
    if (!m->x16 || !m->w16 || !m->dout16) {
        fprintf(stderr, "gemm_shapes: out of memory\n");
        return -1;
    }
    tr_cpu_to_bf16(m->x16, m->x, T * max_in);
    tr_cpu_to_bf16(m->w16, m->w, max_in * max_out);
    tr_cpu_to_bf16(m->dout16, m->dout, T * max_out);
    return 0;
}

static void print_header(const struct options *o)
{
    char ceiling_text[32] = "n/a";
    if (o->ceiling > 0)
        snprintf(ceiling_text, sizeof ceiling_text, "%.1f GFLOP/s", o->ceiling);
    printf("Linear GEMMs of one %s-shape step (%d tokens, dim %d), %d threads, best of %d; "
           "%s ceiling %s%s%s\n\n",
           o->g->name, o->g->tokens, o->g->dim, omp_get_max_threads(), o->reps,
           o->bf16 ? "bf16" : "fp32", ceiling_text,
           clock_id == CLOCK_MONOTONIC ? "" : "; thread CPU time",
           !o->bf16 ? "" : o->stored ? "; bf16 operands as stored (no conversion timed)"
                                     : "; bf16 conversion of the operands timed");
    if (o->bf16)
        printf("| linear | product | M x N x K | trainrun bf16 GFLOP/s | of ceiling "
               "| trainrun fp32 GFLOP/s | bf16 / fp32 |\n");
    else
        printf("| linear | product | M x N x K | trainrun GFLOP/s | of ceiling "
               "| oneDNN threaded GFLOP/s | of ceiling |\n");
    printf("|---|---|---|---:|---:|---:|---:|\n");
}

/* One row: pass p of linear s timed both ways; the step's totals grow by
 * its count per step. */
static void time_row(const struct options *o, const struct linear_shape *s, enum pass p,
                     struct buffers *m, double *step_trainrun, double *step_other)
{
    static const char *pass_names[] = {"forward", "dx", "dW"};
    const struct model *g = o->g;
    /* C is M x N, the reduction K long */
    int M = p == WEIGHT_GRAD ? s->out : g->tokens;
    int N = p == FORWARD ? s->out : s->in;
    int K = p == FORWARD ? s->in : p == INPUT_GRAD ? s->out : g->tokens;
    double flop = 2.0 * M * N * K;
    double t_ours = best_seconds(o->bf16 ? run_trainrun_bf16 : run_trainrun, p, s, m, o->reps);
    double t_other = best_seconds(o->bf16 ? run_trainrun : run_dnnl, p, s, m, o->reps);
    *step_trainrun += s->per_step * t_ours;
    *step_other += s->per_step * t_other;
    double g_ours = flop / t_ours / 1e9, g_other = flop / t_other / 1e9;
    char share[16] = "n/a";
    if (o->ceiling > 0)
        snprintf(share, sizeof share, "%.0f%%", 100 * g_ours / o->ceiling);
    if (o->bf16)
        printf("| %s | %s | %d x %d x %d | %.1f | %s | %.1f | %.2fx |\n", s->name,
               pass_names[p], M, N, K, g_ours, share, g_other, g_ours / g_other);
    else
        printf("| %s | %s | %d x %d x %d | %.1f | %s | %.1f | %.0f%% |\n", s->name,
               pass_names[p], M, N, K, g_ours, share, g_other, 100 * g_other / o->ceiling);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    struct options o;
    int code = parse_args(argc, argv, &o);
    if (code >= 0)
        return code;
    struct linear_shape linears[LINEARS_MAX];
    int count = linear_shapes(o.g, linears);
    struct buffers m;
    if (alloc_buffers(o.g, linears, count, o.stored, &m) != 0)
        return 1;

    print_header(&o);
    double step_trainrun = 0, step_other = 0;
    for (int i = 0; i < count; i++)
        for (int p = FORWARD; p <= WEIGHT_GRAD; p++)
            time_row(&o, &linears[i], (enum pass)p, &m, &step_trainrun, &step_other);
    if (o.bf16)
        printf("\nLinear GEMMs of one step (each product times its count per step): "
               "trainrun bf16 %.1f ms, trainrun fp32 %.1f ms (%.2fx)\n",
               1e3 * step_trainrun, 1e3 * step_other, step_other / step_trainrun);
    else
        printf("\nLinear GEMMs of one step (each product times its count per step): "
               "trainrun %.1f ms, oneDNN threaded %.1f ms\n",
               1e3 * step_trainrun, 1e3 * step_other);
    free(m.x), free(m.w), free(m.b), free(m.out), free(m.dout), free(m.dx), free(m.dw);
    free(m.x16), free(m.w16), free(m.dout16);
    return 0;
}
