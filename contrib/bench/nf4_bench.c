/*
 * NF4 frozen weights on the CPU backend (docs/nf4.md): what dequantising
 * costs, and what it adds to a linear layer's forward.
 *
 * Table 1, dequantisation of an OC x IC weight: tr_cpu_nf4_to_f32 and
 * tr_cpu_nf4_to_bf16 on the widest vector path this CPU runs, and the
 * portable tr_nf4_dequantize (one thread), in GB/s of values written (4 or 2
 * bytes a weight; the blob read is 0.53 bytes a weight), and
 * tr_nf4_quantize (portable, one thread) in ns a weight.
 *
 * Table 2, one linear node's forward (out[T,OC] = x[T,IC] @ W^T, T tokens)
 * through the CPU backend's iface, as a step runs it: with W an fp32
 * parameter (under bf16 GEMMs read from the parameters' bf16 copy, as
 * AdamW keeps it, so the GEMM alone), and with W frozen in NF4 (dequantised
 * into scratch on every call: to bf16 on the native bf16 path, to fp32
 * otherwise) and in bf16.  fp32 and bf16 GEMM inputs (bf16: native where
 * oneDNN has AVX512-BF16 or AMX, emulated otherwise).  The last column is
 * the NF4 forward's time over the fp32 parameter's.
 *
 * Each figure is the best of REPS calls after one warm-up (table 2: the
 * three weights' calls in turns, so the machine's drift hits all three).
 * Wall-clock time by default; NF4_BENCH_CLOCK=cpu counts the process's CPU
 * time instead, for a loaded machine (then a 2-thread figure is the time
 * of both cores; run it with OMP_WAIT_POLICY=passive, so waiting threads
 * do not spin).
 *
 * `make` builds it (Makefile.am) in the build directory:
 *   contrib/bench/nf4_bench [tokens] [reps]   # default 512 tokens, best of 5
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../nf4.h"
#include "kernels.h"

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *aligned(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0) {
        fprintf(stderr, "nf4_bench: out of memory\n");
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* roughly N(0, 0.02), a weight's scale: the sum of four uniforms */
static float weight_value(void)
{
    double s = 0;
    for (int k = 0; k < 4; k++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        s += (double)(rng >> 11) * 0x1.0p-53 - 0.5;
    }
    return (float)(s * 0.035);
}

struct shape {
    const char *name;
    int OC, IC;
};

/* Llama-7B's projections at dim 2048 (TinyLlama-1.1B's): attention and MLP */
static const struct shape shapes[] = {
    {"q/o proj", 2048, 2048},
    {"up/gate proj", 5632, 2048},
    {"down proj", 2048, 5632},
};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };

typedef void (*work_fn)(void *arg);

static double best_of(int reps, work_fn fn, void *arg)
{
    fn(arg); /* warm-up */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        fn(arg);
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

struct deq {
    void *blob, *out;
    size_t n;
};

static void run_f32(void *a)
{
    struct deq *d = a;
    tr_cpu_nf4_to_f32(d->out, d->blob, d->n, 0, d->n);
}
static void run_bf16(void *a)
{
    struct deq *d = a;
    tr_cpu_nf4_to_bf16(d->out, d->blob, d->n, 0, d->n);
}
static void run_portable(void *a)
{
    struct deq *d = a;
    tr_nf4_dequantize(d->out, d->blob, d->n, 0, d->n);
}

/* one linear node, its tensors and scratch, on the CPU backend */
struct node {
    struct tr_graph g;
    struct tr_tensor t[3];
    struct tr_node n;
    struct tr_backend *be;
};

static void run_forward(void *a)
{
    struct node *x = a;
    x->be->iface->forward(x->be->context, &x->g, &x->n);
}

/* The best of reps forwards of each of k nodes, taken in turns (one of
 * each, then again), so drift in the machine's speed hits all alike. */
static void best_in_turns(int reps, struct node **nodes, int k, double *best)
{
    for (int i = 0; i < k; i++) {
        run_forward(nodes[i]); /* warm-up */
        best[i] = 1e30;
    }
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < k; i++) {
            double t0 = now();
            run_forward(nodes[i]);
            double t = now() - t0;
            if (t < best[i])
                best[i] = t;
        }
}

static void node_init(struct node *x, struct tr_backend *be, int tokens, const struct shape *s,
                      float *xin, float *out, enum tr_dtype wdt, void *w, enum tr_dtype compute)
{
    memset(x, 0, sizeof *x);
    x->be = be;
    int64_t xs[2] = {tokens, s->IC}, ws[2] = {s->OC, s->IC}, os[2] = {tokens, s->OC};
    const int64_t *shp[3] = {xs, ws, os};
    void *data[3] = {xin, w, out};
    for (int i = 0; i < 3; i++) {
        struct tr_tensor *t = &x->t[i];
        t->ndim = 2;
        t->shape[0] = shp[i][0];
        t->shape[1] = shp[i][1];
        t->numel = (size_t)shp[i][0] * (size_t)shp[i][1];
        t->data = data[i];
        t->dtype = TR_F32;
        t->role = TR_ROLE_ACTIVATION;
        t->producer = -1;
    }
    x->t[1].dtype = wdt;
    x->t[1].role = wdt == TR_F32 ? TR_ROLE_PARAM : TR_ROLE_FROZEN;
    x->n = (struct tr_node){.op = TR_OP_LINEAR, .name = "linear", .in = {0, 1}, .n_in = 2, .out = 2};
    x->g.tensors = x->t;
    x->g.n_tensors = 3;
    x->g.nodes = &x->n;
    x->g.n_nodes = 1;
    x->g.loss = x->g.logits = -1;
    x->g.compute = compute;
    if (wdt == TR_F32) { /* the parameter buffer: its bf16 copy is made once, as in a step */
        x->g.params = w;
        x->g.n_params = x->t[1].numel;
    }
    if (!be->iface->supports_op(be->context, &x->g, &x->n)) {
        fprintf(stderr, "nf4_bench: the CPU backend refuses the node\n");
        exit(1);
    }
    x->g.scratch_floats = be->iface->scratch_floats(be->context, &x->g, &x->n);
    x->g.scratch = aligned(x->g.scratch_floats * sizeof(float) + 64);
}

int main(int argc, char **argv)
{
    int tokens = argc > 1 ? atoi(argv[1]) : 512, reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *clk = getenv("NF4_BENCH_CLOCK");
    if (clk && strcmp(clk, "cpu") == 0)
        clock_id = CLOCK_PROCESS_CPUTIME_ID;
    const char *paths[] = {"portable", "AVX2", "AVX-512"};
    const char *native = tr_cpu_bf16_native_isa();
    printf("NF4 on the CPU backend: vector path %s, bf16 GEMMs %s; best of %d, %s\n\n",
           paths[tr_cpu_elementwise_path()], native ? native : "emulated", reps,
           clock_id == CLOCK_MONOTONIC ? "wall clock" : "process CPU time");

    printf("| weight | OC x IC | threads | to fp32 GB/s | to bf16 GB/s | portable fp32 GB/s | "
           "quantise ns/weight |\n|---|---|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < N_SHAPES; s++) {
        size_t n = (size_t)shapes[s].OC * shapes[s].IC;
        float *w = aligned(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            w[i] = weight_value();
        struct deq d = {aligned(tr_nf4_bytes(n)), aligned(n * sizeof(float)), n};
        double t0 = now();
        tr_nf4_quantize(d.blob, w, n);
        double quant = now() - t0;
        for (int threads = 1; threads <= 2; threads++) {
            omp_set_num_threads(threads);
            double f32 = best_of(reps, run_f32, &d), bf16 = best_of(reps, run_bf16, &d);
            double portable = threads == 1 ? best_of(reps, run_portable, &d) : 0;
            char pbuf[32] = "", qbuf[32] = "";
            if (threads == 1) {
                snprintf(pbuf, sizeof pbuf, "%.2f", (double)n * 4 / portable / 1e9);
                snprintf(qbuf, sizeof qbuf, "%.2f", quant / (double)n * 1e9);
            }
            printf("| %s | %d x %d | %d | %.2f | %.2f | %s | %s |\n", shapes[s].name,
                   shapes[s].OC, shapes[s].IC, threads, (double)n * 4 / f32 / 1e9,
                   (double)n * 2 / bf16 / 1e9, pbuf, qbuf);
        }
        free(w), free(d.blob), free(d.out);
    }

    printf("\nLinear forward, %d tokens: ms per call\n\n", tokens);
    printf("| weight | OC x IC | threads | GEMM inputs | fp32 param ms | nf4 frozen ms | "
           "bf16 frozen ms | nf4 / fp32 |\n|---|---|---:|---|---:|---:|---:|---:|\n");
    for (int s = 0; s < N_SHAPES; s++) {
        const struct shape *sh = &shapes[s];
        size_t n = (size_t)sh->OC * sh->IC;
        float *w = aligned(n * sizeof(float)), *xin = aligned((size_t)tokens * sh->IC * 4);
        float *out = aligned((size_t)tokens * sh->OC * 4);
        for (size_t i = 0; i < n; i++)
            w[i] = weight_value();
        for (size_t i = 0; i < (size_t)tokens * sh->IC; i++)
            xin[i] = weight_value() * 30;
        void *nf4 = aligned(tr_nf4_bytes(n)), *bf16 = aligned(n * 2);
        tr_nf4_quantize(nf4, w, n);
        tr_cpu_to_half(bf16, w, n, 1);
        for (int threads = 1; threads <= 2; threads++)
            for (int c = 0; c < 2; c++) {
                enum tr_dtype compute = c ? TR_BF16 : TR_F32;
                struct tr_backend be;
                if (tr_cpu_backend_init(&be, threads) != 0)
                    return 1;
                struct node p, q, b;
                node_init(&p, &be, tokens, sh, xin, out, TR_F32, w, compute);
                node_init(&q, &be, tokens, sh, xin, out, TR_NF4, nf4, compute);
                node_init(&b, &be, tokens, sh, xin, out, TR_BF16, bf16, compute);
                struct node *nodes[3] = {&p, &q, &b};
                double t[3];
                best_in_turns(reps, nodes, 3, t);
                double tp = t[0], tq = t[1], tb = t[2];
                printf("| %s | %d x %d | %d | %s | %.2f | %.2f | %.2f | %.2fx |\n", sh->name,
                       sh->OC, sh->IC, threads, c ? (native ? "bf16" : "bf16 (emulated)") : "fp32",
                       tp * 1e3, tq * 1e3, tb * 1e3, tq / tp);
                free(p.g.scratch), free(q.g.scratch), free(b.g.scratch);
                tr_cpu_param16_forget(w);
                tr_cpu_backend_free(&be);
            }
        free(w), free(xin), free(out), free(nf4), free(bf16);
    }
    return 0;
}
