/* The CPU backend: its iface (memory, optimizer updates, metrics), the
 * 16-bit activation storage every node runs through, and which nodes it
 * supports.  Each op's forward and backward are in nodes.c's per-op table.
 * It is built in, and the core opens it by name like any backend module
 * (tr_cpu_backend_module, in core/engine/backend.c's table). */
#include "../backend.h"
#include "../ops.h"
#include "../nf4.h"
#include "../host.h"
#include "kernels.h"
#include "nodes.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

struct cpu_context {
    int threads;
};

static void release_pages(void *p, size_t bytes);
static int holes_remove(const void *p, size_t bytes);

static void *cpu_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        return NULL;
    /* large buffers zeroed without touching them: their pages are resident
     * only once written (a rank of sharded data parallelism never writes
     * most of its gradient and parameter buffers) */
    if (rounded >= ((size_t)1 << 20))
        release_pages(p, rounded);
    else
        memset(p, 0, rounded);
    return p;
}

static void cpu_free(void *ctx, void *p)
{
    (void)ctx;
    if (p)
        holes_remove(p, malloc_usable_size(p));
    tr_cpu_param16_forget(p);
    tr_cpu_frozen_t_forget(p);
    free(p);
}

static void cpu_zero(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    holes_remove(p, bytes);
    tr_cpu_param16_written(p, bytes);
    tr_cpu_frozen_t_written(p, bytes);
    memset(p, 0, bytes);
}

/*
 * What the core discarded (backend.h's discard), as address runs, so that
 * the backend's own copies of its memory (param16.c's bf16 mirror of the
 * parameters) skip it: a pipeline stage discards the other stages'
 * parameters, and a mirror converting them would read pages given back
 * (faulting under TRAINRUN_CPU_DISCARD=strict) and write 2 bytes a
 * parameter of the whole model.  A run leaves the list when the core
 * commits, zeroes or uploads into it, or frees its buffer.  Sorted,
 * disjoint, behind a mutex (the communication thread discards too).
 */
struct hole {
    uintptr_t begin, end;
};
static pthread_mutex_t holes_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hole *holes;
static size_t n_holes, cap_holes;

static int holes_room_locked(void)
{
    if (n_holes + 1 <= cap_holes)
        return 1;
    size_t cap = cap_holes ? 2 * cap_holes : 64;
    struct hole *grown = realloc(holes, cap * sizeof *holes);
    if (!grown)
        return 0;
    holes = grown;
    cap_holes = cap;
    return 1;
}

/* Takes [a, b) out of the list; whether any of it was listed. */
static int holes_remove_locked(uintptr_t a, uintptr_t b)
{
    size_t before = n_holes;
    int cut = 0;
    size_t out = 0;
    struct hole split = {0, 0};
    for (size_t i = 0; i < n_holes; i++) {
        struct hole h = holes[i];
        if (h.end <= a || h.begin >= b) {
            holes[out++] = h;
            continue;
        }
        cut = 1;
        if (h.begin < a)
            holes[out++] = (struct hole){h.begin, a};
        if (h.end > b) /* at most one run reaches past b (they are disjoint) */
            split = (struct hole){b, h.end};
    }
    n_holes = out;
    /* a run cut in two needs one more entry; without room its right part
     * is forgotten (a mirror then converts those zeros, as before) */
    if (split.end && (n_holes < before || holes_room_locked())) {
        size_t at = n_holes;
        while (at > 0 && holes[at - 1].begin > split.begin)
            at--;
        memmove(holes + at + 1, holes + at, (n_holes - at) * sizeof *holes);
        holes[at] = split;
        n_holes++;
    }
    return cut;
}

static void holes_add(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    pthread_mutex_lock(&holes_lock);
    holes_remove_locked(a, b);
    if (!holes_room_locked()) { /* not listed: a mirror converts its zeros, as before */
        pthread_mutex_unlock(&holes_lock);
        return;
    }
    size_t at = n_holes;
    while (at > 0 && holes[at - 1].begin > a)
        at--;
    memmove(holes + at + 1, holes + at, (n_holes - at) * sizeof *holes);
    holes[at] = (struct hole){a, b};
    n_holes++;
    /* merge with the neighbours it touches */
    size_t out = 0;
    for (size_t i = 0; i < n_holes; i++) {
        if (out && holes[out - 1].end >= holes[i].begin) {
            if (holes[i].end > holes[out - 1].end)
                holes[out - 1].end = holes[i].end;
        } else {
            holes[out++] = holes[i];
        }
    }
    n_holes = out;
    pthread_mutex_unlock(&holes_lock);
}

static int holes_remove(const void *p, size_t bytes)
{
    pthread_mutex_lock(&holes_lock);
    int cut = n_holes && holes_remove_locked((uintptr_t)p, (uintptr_t)p + bytes);
    pthread_mutex_unlock(&holes_lock);
    return cut;
}

int tr_cpu_discarded_within(const void *p, size_t bytes, size_t *from, size_t *to)
{
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    int found = 0;
    pthread_mutex_lock(&holes_lock);
    for (size_t i = 0; i < n_holes && holes[i].begin < b; i++)
        if (holes[i].end > a) {
            *from = (holes[i].begin > a ? holes[i].begin : a) - a;
            *to = (holes[i].end < b ? holes[i].end : b) - a;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&holes_lock);
    return found;
}

/* The whole pages inside [p, p + bytes) back to the kernel (private
 * anonymous memory, as malloc's is: they read as zeros when touched
 * again), the partial pages at either end zeroed by hand. */
static void release_pages(void *p, size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    uintptr_t first = (a + page - 1) & ~(uintptr_t)(page - 1), last = b & ~(uintptr_t)(page - 1);
    if (first >= last || madvise((void *)first, last - first, MADV_DONTNEED) != 0) {
        memset(p, 0, bytes);
        return;
    }
    memset(p, 0, first - a);
    memset((void *)last, 0, b - last);
}

static void cpu_discard(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    tr_cpu_param16_written(p, bytes);
    tr_cpu_frozen_t_written(p, bytes);
    release_pages(p, bytes);
    holes_add(p, bytes);
}

/* the range may be read or written again: its discarded runs are listed no
 * more (the bf16 mirror converts them again at its next read) */
static void cpu_commit(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    if (holes_remove(p, bytes))
        tr_cpu_param16_written(p, bytes);
}

/*
 * TRAINRUN_CPU_DISCARD=strict (a debugging aid, tests/e2e/shard.sh and
 * pipeline-run.sh run with it): discard also makes the whole pages it gave
 * back inaccessible, and commit (backend.h, ABI 11) makes them readable and
 * writable again, so a rank touching memory it discarded without
 * committing it faults here as it would on the cuda backend, whose
 * discarded memory is unmapped.  Off (the default), the slot stays NULL:
 * the pages read as zeros when touched again.
 */
static void whole_pages(const void *p, size_t bytes, int outward, uintptr_t *first,
                        uintptr_t *last)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    *first = outward ? a & ~(uintptr_t)(page - 1) : (a + page - 1) & ~(uintptr_t)(page - 1);
    *last = outward ? (b + page - 1) & ~(uintptr_t)(page - 1) : b & ~(uintptr_t)(page - 1);
}

static void cpu_discard_strict(void *ctx, void *p, size_t bytes)
{
    /* discarding what was discarded is allowed: its edges are zeroed by
     * hand, so the pages they lie on must be accessible first */
    uintptr_t lo, hi;
    whole_pages(p, bytes, 1, &lo, &hi);
    mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE);
    cpu_discard(ctx, p, bytes);
    uintptr_t first, last;
    whole_pages(p, bytes, 0, &first, &last);
    if (first < last)
        mprotect((void *)first, last - first, PROT_NONE);
}

/* every page [p, p + bytes) touches, whether or not it was discarded: an
 * accessible page is unchanged, a discarded one reads as zeros */
static void cpu_commit_strict(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    uintptr_t first, last;
    whole_pages(p, bytes, 1, &first, &last);
    if (first < last && mprotect((void *)first, last - first, PROT_READ | PROT_WRITE) != 0) {
        fprintf(stderr, "trainrun: cpu: TRAINRUN_CPU_DISCARD=strict: mprotect failed\n");
        abort(); /* a debugging mode only: the test that set it fails here */
    }
    cpu_commit(ctx, p, bytes);
}

static void cpu_free_strict(void *ctx, void *p)
{
    if (p) /* the allocator may hand these pages out again */
        cpu_commit_strict(ctx, p, malloc_usable_size(p));
    cpu_free(ctx, p);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    holes_remove(dst, bytes);
    tr_cpu_param16_written(dst, bytes);
    tr_cpu_frozen_t_written(dst, bytes);
    memcpy(dst, src, bytes);
}

/* Between fp32 and the 16-bit types (backend.h's convert): on the calling
 * thread (the core's communication thread, while nodes run on OpenMP's),
 * with the bits of tr_cpu_to_half and tr_cpu_from_half. */
static void cpu_convert(void *ctx, void *dst, enum tr_dtype to, const void *src,
                        enum tr_dtype from, size_t n)
{
    (void)ctx;
    tr_cpu_param16_written(dst, n * (to == TR_F32 ? sizeof(float) : sizeof(uint16_t)));
    if (to == from)
        memcpy(dst, src, n * (to == TR_F32 ? sizeof(float) : sizeof(uint16_t)));
    else if (from == TR_F32)
        tr_cpu_to_half_serial(dst, src, n, to == TR_BF16);
    else
        tr_cpu_from_half_serial(dst, src, n, from == TR_BF16);
}

#define T(i) (&g->tensors[n->in[i]])

/* ---- nodes: each op's kernels, through the per-op table (nodes.c) */

static size_t cpu_scratch_floats(const struct tr_graph *g, const struct tr_node *n)
{
    const struct tr_cpu_op *op = &tr_cpu_ops[n->op];
    return op->scratch_floats ? op->scratch_floats(g, n) : 0;
}

static void cpu_forward(struct tr_graph *g, const struct tr_node *n)
{
    if (tr_cpu_ops[n->op].forward)
        tr_cpu_ops[n->op].forward(g, n);
}

static void cpu_backward(struct tr_graph *g, const struct tr_node *n)
{
    if (tr_cpu_ops[n->op].backward)
        tr_cpu_ops[n->op].backward(g, n);
}

/* ---- optimizer updates and metrics */

static double cpu_sum_squares(void *ctx, const float *x, size_t n)
{
    (void)ctx;
    return tr_cpu_sum_squares(x, n);
}

static void cpu_adamw(void *ctx, float *p, const float *grad, float *m, float *v, size_t n,
                      const struct tr_adamw_args *a)
{
    (void)ctx;
    /* the parameters' bf16 copy, where the GEMMs read one, in the same pass */
    tr_cpu_adamw_update_bf16(p, tr_cpu_param16_updated(p, n), grad, m, v, n, a->lr, a->beta1,
                             a->beta2, a->eps, a->weight_decay, a->grad_scale, a->t);
}

static void cpu_sgd(void *ctx, float *p, const float *grad, float *buf, size_t n,
                    const struct tr_sgd_args *a)
{
    (void)ctx;
    tr_cpu_sgd_update(p, grad, buf, n, a->lr, a->momentum, a->weight_decay, a->grad_scale);
    tr_cpu_param16_written(p, n * sizeof(float));
}

static int64_t cpu_count_correct(void *ctx, const float *logits, const int32_t *targets, int N,
                                 int V, int ignore_index, int64_t *n_valid)
{
    (void)ctx;
    return tr_cpu_count_correct(logits, targets, N, V, ignore_index, n_valid);
}

/* ---- 16-bit activation storage ---------------------------------------------
 * Under a 16-bit compute dtype the planner stores activations in it
 * (core/engine/graph_plan.c, plan_storage).  Gradients and saved aux stay fp32.
 * A stored activation is always its op's fp32 result rounded once to the
 * storage dtype, on the native and the emulated GEMM paths alike.
 *
 * Some ops take their 16-bit tensors as stored (native_half):
 *  - add, GELU and layer norm read their 16-bit activations and write their
 *    16-bit output themselves, in bf16 and fp16 (the *_act kernels,
 *    kernels.h: fp32 arithmetic on values widened tile by tile in cache,
 *    the result rounded once).  Cheap ops over whole activations: separate
 *    passes to widen and round would cost more than the op;
 *  - on the native bf16 path, linear and matmul read bf16 inputs as they
 *    are (bf16_of): they would convert them to bf16 anyway; so does
 *    attention (q, k and v into bf16 products, tr_cpu_node_attention_bf16
 *    in nodes.c).  Linear there also rounds its bf16 output into storage
 *    itself, tile by tile (tr_cpu_node_linear_out16), and takes a frozen
 *    NF4 weight dequantised straight into its bf16 operand (2 bytes a
 *    weight of scratch, which the GEMM's operand copy has anyway).
 * Frozen weights (an adapter's base) go the same ways: bf16 and fp16 like
 * activations, NF4 into an fp32 copy (tr_cpu_nf4_to_f32) off that path.
 * Every other op (the convolutional ones too), and linear, matmul and
 * attention off the native bf16 path, runs on fp32 copies: its 16-bit
 * inputs (and, in backward, its output where the op's backward reads it)
 * are widened into the start of scratch, the node's tensors point at the
 * copies for the call (their dtype saying fp32 meanwhile) and the kernel
 * sees the scratch after them, and forward rounds the fp32 result into the
 * output's 16-bit storage.  Backward copies only what it reads: not the
 * output where the op's backward needs none, nor the inputs of an op whose
 * gradients need only dout (the op's backward_skips_output and
 * backward_skips_inputs in tr_cpu_ops, nodes.h). */

static int is_half(enum tr_dtype d) { return d == TR_BF16 || d == TR_F16; }

/* stored in fewer bits than the kernels read: 16-bit, or an NF4 frozen
 * weight (dequantised, kernels/nf4.h: into an fp32 copy with
 * tr_cpu_nf4_to_f32, or on the native bf16 path straight into the GEMM's
 * bf16 operand, nodes.c's bf16_of) */
static int is_narrow(enum tr_dtype d) { return is_half(d) || d == TR_NF4; }

/* The op's kernels read in[k] (k < n_in), or write and read its output
 * (k == n_in), in its narrow storage themselves, forward and backward: no
 * fp32 copy.  Asked only of 16-bit tensors and NF4 weights; an operand the
 * op's kernels take as fp32 (layer norm's weight and bias) must not be
 * listed. */
static int native_half(const struct tr_graph *g, const struct tr_node *n, int k)
{
    switch (n->op) {
    case TR_OP_ADD:
    case TR_OP_GELU: /* every operand, any mix of dtypes */
        return 1;
    case TR_OP_EMBEDDING: /* a 16-bit table: rows widened as gathered */
        return k == 0;
    case TR_OP_LAYERNORM: /* the input and the output */
        return k == 0 || k == n->n_in;
    case TR_OP_LINEAR: /* the two GEMM operands, and a bf16 output (linear_out16)
                        * with a bf16 addend (its tiles start as the addend's);
                        * an NF4 weight dequantised straight to bf16 (bf16_of) */
        if (k == n->n_in)
            return tr_cpu_node_linear_out16(g, n);
        if (k == 2)
            return tr_linear_addend(g, n) && tr_cpu_node_linear_out16(g, n) &&
                   T(2)->dtype == TR_BF16;
        return k < 2 && tr_cpu_node_native_bf16(g) &&
               (T(k)->dtype == TR_BF16 || (k == 1 && T(k)->dtype == TR_NF4));
    case TR_OP_MATMUL: /* the two GEMM operands; the GEMM's output is fp32 */
        return k < 2 && k < n->n_in && tr_cpu_node_native_bf16(g) && T(k)->dtype == TR_BF16;
    case TR_OP_ATTENTION: /* q, k, v; its output still goes through a copy */
        return k < n->n_in && tr_cpu_node_attention_bf16(g, n);
    default:
        return 0;
    }
}

/* The node's 16-bit tensors that need an fp32 copy in forward or backward,
 * each once (add(x, x) reads one tensor twice); widen[i]: the copy starts
 * as the stored values (forward's output needs none, it is written). */
struct fp32_copies {
    int n, tensor[4], widen[4];
};

static void fp32_copies(const struct tr_graph *g, const struct tr_node *n, int backward,
                        struct fp32_copies *c)
{
    c->n = 0;
    for (int k = 0; k <= n->n_in && k < 4; k++) {
        int out = k == n->n_in, id = out ? n->out : n->in[k];
        if (!is_narrow(g->tensors[id].dtype) || native_half(g, n, k))
            continue;
        if (backward && (out ? tr_cpu_ops[n->op].backward_skips_output
                            : tr_cpu_ops[n->op].backward_skips_inputs))
            continue;
        if (backward && n->op == TR_OP_LINEAR && k == 2 && !out)
            continue; /* its bias or addend: backward reads only dout for it */
        int seen = 0;
        for (int i = 0; i < c->n; i++)
            seen |= c->tensor[i] == id;
        if (seen)
            continue;
        c->tensor[c->n] = id;
        c->widen[c->n++] = !out || backward;
    }
}

/* fp32 copies start on whole 64-byte lines */
static size_t line_floats(size_t n) { return (n + 15) & ~(size_t)15; }

static size_t copies_floats(const struct tr_graph *g, const struct tr_node *n, int backward)
{
    struct fp32_copies c;
    fp32_copies(g, n, backward, &c);
    size_t floats = 0;
    for (int i = 0; i < c.n; i++)
        floats += line_floats(g->tensors[c.tensor[i]].numel);
    return floats;
}

static size_t cpu_node_scratch_floats(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    size_t fwd = copies_floats(g, n, 0), bwd = copies_floats(g, n, 1);
    (void)ctx;
    return cpu_scratch_floats(g, n) + (fwd > bwd ? fwd : bwd);
}

static void run_node(struct tr_graph *g, const struct tr_node *n, int backward)
{
    struct fp32_copies c;
    fp32_copies(g, n, backward, &c);
    if (c.n == 0) { /* all fp32, or taken as stored */
        if (backward)
            cpu_backward(g, n);
        else
            cpu_forward(g, n);
        return;
    }
    void *stored[4];
    enum tr_dtype dtype[4];
    float *scratch = g->scratch, *at = g->scratch;
    size_t scratch_floats = g->scratch_floats;
    for (int i = 0; i < c.n; i++) {
        struct tr_tensor *t = &g->tensors[c.tensor[i]];
        stored[i] = t->data;
        dtype[i] = t->dtype;
        if (c.widen[i] && t->dtype == TR_NF4) /* vectorised, tr_nf4_dequantize's bits */
            tr_cpu_nf4_to_f32(at, t->data, t->numel, 0, t->numel);
        else if (c.widen[i])
            tr_cpu_from_half(at, (const uint16_t *)t->data, t->numel, t->dtype == TR_BF16);
        t->data = at;
        t->dtype = TR_F32;
        at += line_floats(t->numel);
    }
    g->scratch = at; /* the kernel's own scratch follows the copies */
    g->scratch_floats -= (size_t)(at - scratch);
    if (backward)
        cpu_backward(g, n);
    else
        cpu_forward(g, n);
    g->scratch = scratch;
    g->scratch_floats = scratch_floats;
    for (int i = 0; i < c.n; i++) {
        struct tr_tensor *t = &g->tensors[c.tensor[i]];
        if (!backward && c.tensor[i] == n->out)
            tr_cpu_to_half((uint16_t *)stored[i], (const float *)t->data, t->numel,
                           dtype[i] == TR_BF16);
        t->data = stored[i];
        t->dtype = dtype[i];
    }
}

static void cpu_node_forward(void *ctx, struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx;
    run_node(g, n, 0);
}

static void cpu_node_backward(void *ctx, struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx;
    run_node(g, n, 1);
}

/* The bf16 copy of the parameters (param16.c) that the native bf16 GEMMs
 * read a weight from, where some linear or matmul multiplies a parameter
 * (nodes.c, bf16_inputs); on the fp32 path, the transposed copies of frozen
 * weights that linear forwards read (frozen_t.c). */
static size_t cpu_param_copy_bytes(void *ctx, const struct tr_graph *g)
{
    (void)ctx;
    if (!tr_cpu_node_native_bf16(g))
        return g->compute == TR_F32 ? tr_cpu_frozen_t_bytes(g) : 0;
    if (g->params_sharded)
        return 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        if ((n->op == TR_OP_LINEAR || n->op == TR_OP_MATMUL) && n->n_in > 1 &&
            T(1)->role == TR_ROLE_PARAM)
            return tr_cpu_param16_bytes(g->n_params);
    }
    return 0;
}

/* Every op the op table lets run in a window of rows: the kernels read
 * shapes and pointers from the tensors as given (the core's views) and rope
 * and attention the window (nodes.c); nothing is planned per node. */
static int cpu_supports_rows(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx, (void)g;
    return tr_op_rows(n->op) != TR_ROWS_NONE;
}

/* The ops the op table (kernels/ops.h) says the CPU runs -- every op of
 * the vocabulary -- on fp32 tensors (int32 for indices and targets),
 * activations also in bf16 or fp16 (taken as stored or run on fp32 copies,
 * above). */
static int cpu_supports_op(void *ctx, const struct tr_graph *g, const struct tr_node *n)
{
    (void)ctx;
    const struct tr_op_desc *op = tr_op_desc(n->op);
    if (!op || !(op->backends & TR_ON_CPU) || !tr_cpu_ops[n->op].forward)
        return 0;
    int t[6], k = 0;
    for (int i = 0; i < n->n_in; i++)
        t[k++] = n->in[i];
    for (int i = 0; i < n->n_aux; i++)
        t[k++] = n->aux[i];
    t[k++] = n->out;
    for (int i = 0; i < k; i++) {
        const struct tr_tensor *x = &g->tensors[t[i]];
        /* activations in 16 bits; frozen weights in 16 bits or NF4 (an
         * adapter's base), read through fp32 copies where the kernel is not
         * native: a linear's weight or an embedding's table only */
        int frozen_weight = x->role == TR_ROLE_FROZEN && t[i] == n->in[n->op == TR_OP_LINEAR] &&
                            (n->op == TR_OP_LINEAR || (n->op == TR_OP_EMBEDDING && is_half(x->dtype)));
        if (x->dtype != TR_F32 && x->dtype != TR_I32 &&
            !(is_half(x->dtype) && x->role == TR_ROLE_ACTIVATION) &&
            !(is_narrow(x->dtype) && frozen_weight))
            return 0;
    }
    /* a convolution oneDNN has no primitive for (a shape the graph checks
     * let through) is refused here, before planning, not at the first step */
    if (n->op == TR_OP_CONV2D) {
        struct tr_cpu_conv_shape s = tr_cpu_node_conv_shape(g, n);
        return tr_cpu_conv2d_supported(&s, n->n_in == 3, g->compute);
    }
    return 1;
}

/* Whether node n's backward can write in[k]'s gradient: its op's
 * writes_grads in the per-op table (nodes.c says which do). */
static int cpu_writes_grad(void *ctx, const struct tr_graph *g, const struct tr_node *n, int k)
{
    (void)ctx, (void)g;
    return (unsigned)n->op < TR_OP_COUNT && ((tr_cpu_ops[n->op].writes_grads >> k) & 1u);
}

/* Frozen weights in their storage type (backend.h): fp32 as is, 16-bit
 * rounded to nearest even, NF4 quantised as bitsandbytes does. */
static int cpu_store_frozen(void *ctx, const struct tr_tensor *t, const float *host, tr_err *err)
{
    (void)ctx;
    switch (t->dtype) {
    case TR_F32:
        memcpy(t->data, host, t->numel * sizeof(float));
        return TR_OK;
    case TR_BF16:
    case TR_F16:
        tr_cpu_to_half((uint16_t *)t->data, host, t->numel, t->dtype == TR_BF16);
        return TR_OK;
    case TR_NF4:
        if (t->numel % TR_NF4_BLOCK != 0)
            return tr_fail(err, "'%s': %zu values are not whole NF4 blocks of %d", t->name,
                           t->numel, TR_NF4_BLOCK);
        if (tr_nf4_quantize(t->data, host, t->numel) != 0)
            return tr_fail(err, "out of memory quantising '%s'", t->name);
        return TR_OK;
    default:
        return tr_fail(err, "'%s': a frozen weight cannot be stored as dtype %d", t->name,
                       (int)t->dtype);
    }
}

static int cpu_load_frozen(void *ctx, const struct tr_tensor *t, float *host, tr_err *err)
{
    (void)ctx;
    switch (t->dtype) {
    case TR_F32:
        memcpy(host, t->data, t->numel * sizeof(float));
        return TR_OK;
    case TR_BF16:
    case TR_F16:
        tr_cpu_from_half(host, (const uint16_t *)t->data, t->numel, t->dtype == TR_BF16);
        return TR_OK;
    case TR_NF4:
        tr_cpu_nf4_to_f32(host, t->data, t->numel, 0, t->numel);
        return TR_OK;
    default:
        return tr_fail(err, "'%s': a frozen weight of dtype %d", t->name, (int)t->dtype);
    }
}

static const struct tr_backend_iface cpu_iface = {
    .struct_size = sizeof(struct tr_backend_iface),
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .download = cpu_copy,
    .scratch_floats = cpu_node_scratch_floats,
    .forward = cpu_node_forward,
    .backward = cpu_node_backward,
    .sum_squares = cpu_sum_squares,
    .adamw = cpu_adamw,
    .sgd = cpu_sgd,
    .synchronize = NULL,
    .count_correct = cpu_count_correct,
    .supports_op = cpu_supports_op,
    .param_copy_bytes = cpu_param_copy_bytes,
    .writes_grad = cpu_writes_grad,
    .store_frozen = cpu_store_frozen,
    .load_frozen = cpu_load_frozen,
    .discard = cpu_discard,
    .supports_rows = cpu_supports_rows,
    .convert = cpu_convert,
    .commit = cpu_commit,
};

static struct tr_backend_iface cpu_iface_strict;

int tr_cpu_backend_init(struct tr_backend *be, int threads)
{
    struct cpu_context *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->threads = threads > 0 ? threads : omp_get_num_procs();
    omp_set_num_threads(c->threads);
    be->iface = &cpu_iface;
    const char *mode = getenv("TRAINRUN_CPU_DISCARD");
    if (mode && !strcmp(mode, "strict")) {
        cpu_iface_strict = cpu_iface;
        cpu_iface_strict.free = cpu_free_strict;
        cpu_iface_strict.discard = cpu_discard_strict;
        cpu_iface_strict.commit = cpu_commit_strict;
        be->iface = &cpu_iface_strict;
    }
    be->context = c;
    be->module = &tr_cpu_backend_module;
    return 0;
}

void tr_cpu_backend_free(struct tr_backend *be)
{
    free(be->context);
    be->context = NULL;
}

static int cpu_open(struct tr_backend *be, int threads, char *why, size_t why_size)
{
    if (tr_cpu_backend_init(be, threads) != 0) {
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    return 0;
}

const struct tr_backend_module tr_cpu_backend_module = {
    .abi = TR_BACKEND_ABI,
    .struct_size = sizeof(struct tr_backend_module),
    .name = "cpu",
    .open = cpu_open,
    .close = tr_cpu_backend_free,
    .describe = NULL,
};
