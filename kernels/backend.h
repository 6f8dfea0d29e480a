/*
 * The contract between the core and the backends, owned by kernels: the op
 * vocabulary and the graph a backend runs (tensors, nodes), and the device
 * interface the core runs graphs through: a {iface, context} pair opened by
 * a backend module.  The CPU backend is linked in (kernels/cpu/backend.c);
 * other backends are loadable modules exporting the same iface, so the core
 * and the Lua layer never change when one is added.  Slots may only be
 * appended; optional ones may be NULL.
 *
 * The contract runs one way: kernels include this header (and host.h) and
 * nothing of core/; the core includes these two and no backend's private
 * headers (kernels/cpu/, kernels/cuda/).  tests/e2e/layering.sh checks it.
 */
#ifndef TR_BACKEND_H
#define TR_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <trainrun/plugin.h> /* enum tr_dtype */

/* ---- The graph as backends see it: the op vocabulary, tensors, nodes.
 * The core builds, checks and plans it (core/engine/graph.h); a backend reads a
 * node's tensors and attributes and runs it. */
#define TR_MAX_DIMS 4

enum tr_op {
    TR_OP_EMBEDDING = 0, /* in: table[V,C], idx[...] (i32)          out: [...,C]      */
    TR_OP_ADD_ROWS,      /* in: x[B,T,C], p[>=T,C]                  out: [B,T,C]      */
    TR_OP_ADD,           /* in: a, b (same shape)                   out: same         */
    TR_OP_LINEAR,        /* in: x[...,IC], w[OC,IC], (b[OC])        out: [...,OC]     */
    TR_OP_MATMUL,        /* in: a[(batch),M,K], b[(batch),K,N] or [N,K] with trans_b */
    TR_OP_LAYERNORM,     /* in: x[...,C], w[C], b[C]  aux: mean[N], rstd[N]          */
    TR_OP_GELU,          /* in: x                                   out: same         */
    TR_OP_RELU,          /* in: x                                   out: same         */
    /* causal softmax attention, scale 1/sqrt(D); aux: lse[B,H,T]; out [B,T,H*D].
     * One input: qkv[B,T,3C] packed (heads H, D = C/H).  Three inputs:
     * q[B,T,H*D], k[B,T,KV*D], v[B,T,KV*D] (heads H, kv_heads KV dividing H;
     * query head h reads kv head h / (H/KV): grouped-query attention). */
    TR_OP_ATTENTION,
    TR_OP_CROSS_ENTROPY, /* in: logits[...,V], targets[...] (i32)  aux: lse[N]  out: scalar */
    /* ---- appended with ABI 2 (Llama-family blocks) */
    TR_OP_RMSNORM,       /* in: x[...,C], w[C]  attr eps  aux: rstd[N]  out: x*rstd*w    */
    /* rotary position embedding, Hugging Face's rotate-half convention: in
     * each head of D (even) channels, pair (i, i+D/2) of position t turns by
     * t * theta^(-2i/D).  in: x[B,T,H*D]  attr heads, theta  out: same       */
    TR_OP_ROPE,
    TR_OP_SWIGLU,        /* in: gate, up (same shape)  out: silu(gate) * up          */
    TR_OP_SCALE,         /* in: x  attr scale          out: scale * x                */
    /* ---- appended with ABI 3 (convolutional models).  Images are stored
     * channel-last, x[B,H,W,C]: the layout oneDNN's and cuDNN's fastest
     * convolutions take (no reorder per call), the one image decoders
     * produce, and the one where a per-channel op (batch norm, bias) is an
     * op over the last dimension like every other normalisation here.
     * Spatial attributes are (h, w) pairs: kernel, stride, pad, dilation.
     * Output size per spatial dim: (in + 2 pad - dilation (k - 1) - 1) / stride + 1. */
    /* in: x[B,H,W,IC], w[OC,KH,KW,IC/groups], (b[OC])  attr stride, pad,
     * dilation, groups (dividing IC and OC; groups = IC is depthwise)
     * out: [B,OH,OW,OC].  Under a 16-bit compute dtype x and w are rounded to
     * it and products accumulate in fp32, as in linear. */
    TR_OP_CONV2D,
    /* in: x[B,H,W,C]  attr kernel, stride, pad (padding never wins: -inf)
     * out: [B,OH,OW,C].  Backward routes each output's gradient to the first
     * maximum of its window in row-major order. */
    TR_OP_MAXPOOL,
    /* in: x[B,H,W,C]  attr kernel, stride, pad  out: [B,OH,OW,C]; each output
     * is the window's sum over kernel_h x kernel_w (padding counts as zeros). */
    TR_OP_AVGPOOL,
    TR_OP_GLOBAL_AVGPOOL, /* in: x[B,H,W,C]                         out: [B,C] mean over H,W */
    /* batch normalisation over every dimension but the last (channels):
     * in: x[...,C], w[C], b[C]  attr eps, momentum, buffer (running[2,C]: the
     * running mean, then the running unbiased variance)  aux: mean[C], rstd[C]
     * out: same as x.  Training forward (g->training) normalises with the
     * batch's mean and biased variance, saves them as aux, and, unless
     * g->recomputing, updates running = (1 - momentum) running + momentum
     * batch (variance unbiased: n/(n-1)); eval forward normalises with the
     * running statistics. */
    TR_OP_BATCHNORM,
    /* ---- appended with ABI 6.  in: x  attr p (0 < p < 1)  out: same.
     * Training forward (g->training): y = x * m / (1 - p), m = 0 for a
     * fraction p of the elements, drawn from g->dropout_seed, the node's
     * index and the element's: a counter-based hash, no state and no saved
     * mask, so backward (dx = dout * m / (1 - p)), a recomputed segment and
     * every backend draw the same m.  Eval forward: y = x. */
    TR_OP_DROPOUT,
    TR_OP_COUNT
};

enum tr_role {
    TR_ROLE_INPUT = 0, /* filled from the data source each micro-batch */
    TR_ROLE_PARAM,     /* learned; lives in the flat parameter buffer   */
    TR_ROLE_ACTIVATION,/* produced by a node in forward                 */
    TR_ROLE_SAVED,     /* produced by a node for its own backward (mean, rstd, att, lse) */
    /* appended with ABI 3: state a node updates while training and reads in
     * eval (batch norm's running statistics): fp32, never trained, saved in
     * checkpoints beside the parameters; lives in g->buffers */
    TR_ROLE_BUFFER,
    /* appended with ABI 6: a weight that is not trained (the base of a
     * low-rank adapter, core/engine/adapters.c): grad stays NULL, no
     * optimizer state, not in the flat parameter buffer.  Lives in
     * g->frozen in its own storage type (t->dtype): TR_F32, TR_BF16,
     * TR_F16, or TR_NF4 (kernels/nf4.h; numel a multiple of its block).
     * Only the weight input of linear (in[1]) and embedding (in[0]) may be
     * 16-bit or NF4 frozen; the backend widens it where a kernel needs
     * fp32 (backend's scratch, sized by the backend). */
    TR_ROLE_FROZEN
};

enum tr_init { TR_INIT_ZEROS = 0, TR_INIT_ONES, TR_INIT_NORMAL,
               TR_INIT_UNIFORM /* ABI 6: uniform in [-init_std, init_std] (a LoRA A) */ };

struct tr_tensor {
    char *name;
    enum tr_role role;
    enum tr_dtype dtype;
    int ndim;
    int64_t shape[TR_MAX_DIMS];
    size_t numel;
    void *data;
    float *grad;     /* NULL when no gradient flows here */
    int producer;    /* node index, -1 for inputs and params */
    /* parameters */
    enum tr_init init;
    double init_std;
    int decay;        /* weight decay applies */
    size_t offset;    /* element offset in the flat parameter/gradient buffers */
};

struct tr_node {
    enum tr_op op;
    char *name;       /* for messages and profiles: "h.0.attn" */
    int in[3];
    int n_in;
    int out;
    int aux[2];
    int n_aux;
    /* attributes */
    int heads;
    float eps;
    int ignore_index;
    int trans_b;
    int segment;      /* > 0: recomputed in backward (activation recomputation) */
    /* planned */
    unsigned zero_grad_mask; /* bit k: zero in[k]'s activation gradient before this backward */
    /* attributes appended with ABI 2 */
    int kv_heads;     /* attention with q, k, v inputs: key/value heads (divides heads) */
    float theta;      /* rope: base of the rotation frequencies (10000 in Llama 2) */
    float scale;      /* scale: the factor */
    /* attributes appended with ABI 3 (convolutions, pooling, batch norm);
     * spatial pairs are (h, w) */
    int kernel[2];    /* pooling window */
    int stride[2];    /* conv: 1; pooling: the window */
    int pad[2];       /* zero (conv, avgpool) or -inf (maxpool) rows/columns on each side */
    int dilation[2];  /* conv: 1 */
    int groups;       /* conv: 1 */
    float momentum;   /* batchnorm: weight of the batch in the running statistics (0.1) */
    int buffer;       /* batchnorm: index of its TR_ROLE_BUFFER tensor running[2,C] (others: unused) */
    /* appended with ABI 5: each gradient's first writer in backward (the
     * last node in forward order that reads the tensor and runs backward)
     * either writes it (where the backend's writes_grad allows) or has it
     * zeroed by the core right before (zero_grad_mask above, and
     * param_zero_mask); bit k of each mask names in[k].  Planned: */
    unsigned act_write_mask;   /* activation gradients this backward writes */
    unsigned param_zero_mask;  /* parameter gradients zeroed first, at a fresh step */
    unsigned param_write_mask; /* parameter gradients this backward writes, at a fresh step */
    /* set by the core before each backward: the gradients to write (=, their
     * old contents ignored), not add to (+=): act_write_mask, and
     * param_write_mask when g->grads_fresh */
    unsigned write_grad_mask;
    /* appended with ABI 6: dropout's probability of dropping an element */
    float p;
    /* appended with ABI 8: rope's frequency scaling, Llama 3.1's rope_type
     * "llama3" (kernels/rope_scaling.h); rope_factor 0: none.  Doubles:
     * transformers forms the thresholds and high - low from Python floats */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_ctx;
};

struct tr_memory_report {
    size_t params, grads, optimizer, activations, saved, activation_grads, inputs, scratch;
    size_t recompute;       /* one shared arena for the internals of recomputed segments */
    size_t recompute_saved; /* bytes those internals would take if all were kept */
    /* ABI 4: what the backend keeps of its own beside the plan's arenas for
     * the graph's parameters (param_copy_bytes: the CPU's bf16 copy) */
    size_t param_copies;
    /* ABI 6: frozen weights (TR_ROLE_FROZEN) in their storage types, and of
     * those the bytes stored as TR_NF4 (counted in frozen too) */
    size_t frozen, quantized;
};

struct tr_graph {
    struct tr_tensor *tensors;
    int n_tensors;
    struct tr_node *nodes;
    int n_nodes;
    int batch;       /* the micro-batch the shapes were built for */
    int loss;        /* scalar tensor */
    int logits;      /* optional, -1 if none */
    int inputs[4];   /* input tensors, in the order the data source fills them */
    int n_inputs;
    /* planned memory (backend memory) */
    float *params, *grads;
    size_t n_params, n_decay; /* params[0 .. n_decay) are weight-decayed */
    void *activation_arena, *grad_arena, *input_arena, *recompute_arena;
    float *scratch;
    size_t scratch_floats;
    struct tr_memory_report memory;
    /* set by the run loop before backward: d(objective)/d(loss) */
    float loss_grad;
    /* the precision policy's GEMM input dtype (accumulation is fp32) */
    enum tr_dtype compute;
    /* profiling: when set, each node's forward and backward are timed
     * (start and duration in seconds of tr_now(), for the trace) */
    int profile;
    double *op_start, *op_seconds; /* 2 * n_nodes: forward i, backward n_nodes + i */
    /* when set, called after each node's backward (data parallelism starts
     * all-reducing the gradients that node finished) */
    void (*on_backward)(void *ctx, int node);
    void *on_backward_ctx;
    /* appended: fp32 GEMMs may round their inputs to tf32 (the precision
     * policy's allow_tf32 with compute fp32).  Only a backend with tf32
     * GEMMs sees 1: the engine refuses the policy for any other device. */
    int allow_tf32;
    /* appended with ABI 3 */
    float *buffers;    /* planned: every TR_ROLE_BUFFER tensor's data, fp32 */
    size_t n_buffers;  /* floats */
    int training;      /* 1 (tr_graph_new): forward in training mode; 0: eval (batch norm
                        * normalises with its running statistics and updates nothing) */
    int recomputing;   /* 1 while backward re-runs a recomputed segment's forward:
                        * nodes then must not update buffers a second time */
    /* appended with ABI 5: set by the caller before backward.  1: the
     * parameter gradients start from nothing (a step's first micro-batch):
     * each one's first writer writes it, or the core zeroes it first, and a
     * gradient no node writes keeps the zeros it was allocated with.  0 (the
     * default): backward adds to what they hold (the caller zeroed them, or
     * accumulates micro-batches). */
    int grads_fresh;
    /* appended with ABI 6: the frozen weights (TR_ROLE_FROZEN), each at its
     * offset in bytes, in its storage type */
    void *frozen;
    size_t frozen_bytes;
    /* set by the caller before each training forward: what dropout draws
     * its masks from (the run derives it from train.seed, the step and the
     * micro-batch, so a resumed run draws the same) */
    uint64_t dropout_seed;
    /* appended with ABI 7: 1 when the parameters other ranks own come and
     * go between nodes (parallel.shard = "parameters": gathered before the
     * nodes that read them, discarded after), so the backend keeps no copy
     * of the parameters across nodes (the CPU's bf16 mirror); set before
     * the graph is planned */
    int params_sharded;
    /* appended with ABI 7: when set, called before each node runs: in
     * forward (phase 0), re-run in backward for a recomputed segment
     * (phase 1), and before its backward (phase 2) -- sharded parameters
     * are gathered there (core/engine/gather.c) */
    void (*before_node)(void *ctx, int node, int phase);
    void *before_node_ctx;
    /* appended with ABI 9: a forward over sequence rows [seq_from, seq_to)
     * alone (seq_to 0: every row), set by tr_graph_forward_rows for the
     * nodes of a backend's supports_rows.  The graph's batch is 1; the rows
     * before seq_from were computed by earlier windows and are kept (the
     * plan of tr_graph_plan_forward_cached keeps attention's inputs): rope
     * turns row t of its (viewed) input by position seq_from + t, attention
     * computes query rows [seq_from, seq_to) against keys [0, seq_to) of its
     * whole inputs into its output (a view of those rows) and those rows of
     * its lse. */
    int seq_from, seq_to;
    /* appended with ABI 10: NULL, or (sharded parameters under a 16-bit
     * compute dtype, core/engine/gather.c) the flat parameter buffer in
     * g->compute: 2 bytes a parameter at the parameters' offsets, each
     * value params[i] rounded to nearest even (the backend's convert).
     * Then a GEMM's weight (in[1] of linear and matmul) that is a
     * parameter is there when the node runs, and the GEMM reads it from
     * here instead of converting params.  A parameter that only GEMMs read,
     * as their weight, is there alone: its fp32 values in params are this
     * rank's parts only (the gathers move the others' in 16 bits).  Every
     * other parameter a node reads is in params, as without params16.
     * 64-byte aligned at the buffer's start. */
    void *params16;
};

/* Dropout's mask, the same on every backend (the CUDA kernels call these
 * on the device): element i of node `node` is kept when the high 32 bits of
 * splitmix64 of (seed, node, i) are at or above threshold = p * 2^32
 * (tr_dropout_threshold). */
#ifdef __CUDACC__
#define TR_HOST_DEVICE __host__ __device__
#else
#define TR_HOST_DEVICE
#endif
TR_HOST_DEVICE static inline uint64_t tr_dropout_hash(uint64_t seed, uint64_t node, uint64_t i)
{
    uint64_t z = seed ^ (node * 0x9E3779B97F4A7C15ull);
    z += (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint32_t tr_dropout_threshold(float p)
{
    double t = (double)p * 4294967296.0;
    return t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}

/* ---- The device interface */

struct tr_adamw_args {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int64_t t; /* 1-based step for bias correction */
};

struct tr_sgd_args {
    float lr, momentum, weight_decay, grad_scale;
};

struct tr_backend_iface {
    uint32_t struct_size;
    const char *name;
    void *(*alloc)(void *ctx, size_t bytes); /* zeroed; NULL when out of memory */
    void (*free)(void *ctx, void *ptr);
    void (*zero)(void *ctx, void *ptr, size_t bytes);
    /* may also come from the core's communication thread while the compute
     * thread uploads and runs nodes (an offloaded update's parameters under
     * a shard level, core/engine/optim.h): ordered after the work queued
     * before it, and before the work queued after it, on either thread */
    void (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*download)(void *ctx, void *dst, const void *src, size_t bytes);
    /* floats of scratch one node needs (forward and backward share it) */
    size_t (*scratch_floats)(void *ctx, const struct tr_graph *g, const struct tr_node *n);
    void (*forward)(void *ctx, struct tr_graph *g, const struct tr_node *n);
    /* accumulates into input gradients (see kernels/cpu/kernels.h) */
    void (*backward)(void *ctx, struct tr_graph *g, const struct tr_node *n);
    double (*sum_squares)(void *ctx, const float *x, size_t n);
    void (*adamw)(void *ctx, float *param, const float *grad, float *m, float *v, size_t n,
                  const struct tr_adamw_args *a);
    void (*sgd)(void *ctx, float *param, const float *grad, float *buf, size_t n,
                const struct tr_sgd_args *a);
    void (*synchronize)(void *ctx); /* optional */
    /* rows of logits[N,V] whose arg-max is the target (accuracy) */
    int64_t (*count_correct)(void *ctx, const float *logits, const int32_t *targets, int N, int V,
                             int ignore_index, int64_t *n_valid);
    /* Optional (NULL, or absent when struct_size is smaller): page-locked
     * host memory for buffers the host fills and uploads often (the
     * loader's), so copies run at full speed; free with host_free. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* Optional: the stream (cudaStream_t on CUDA) every node runs on, for
     * comm plugins that queue collectives behind the compute. */
    void *(*stream)(void *ctx);
    /* Optional (NULL: every op): nonzero when the backend runs node n of g
     * as built (its op, its tensors' storage types, its attributes).  The
     * core asks for every node before it plans a graph on the backend, and
     * refuses one the device cannot run, naming the op and the device. */
    int (*supports_op)(void *ctx, const struct tr_graph *g, const struct tr_node *n);
    /* Optional (ABI 4): bytes of memory the backend will hold for g's
     * parameters in another form while g runs (the CPU backend's bf16 copy,
     * which its native bf16 GEMMs read), beyond what the plan allocates
     * through alloc.  Asked once g's storage types are set; the memory plan
     * counts it (tr_memory_report.param_copies). */
    size_t (*param_copy_bytes)(void *ctx, const struct tr_graph *g);
    /* Optional (ABI 5; NULL: never): nonzero when the backward of node n
     * can write in[k]'s gradient instead of adding to it -- overwrite
     * whatever the buffer holds -- which it then does for the bits of
     * n->write_grad_mask.  The core asks for each gradient's first writer
     * once, when it plans g; where the answer is 0 it zeroes the gradient
     * before that node, as for a backend without the slot.  Saves a pass
     * over each such gradient (and its zeros read back).  Where an add
     * writes in[k]'s gradient and nothing else reads in[k], the plan gives
     * that gradient the add's output gradient's own buffer (they are equal):
     * the add's backward then finds in[k]'s grad at its output gradient's
     * address and has nothing to write there (writing it onto itself is
     * harmless, but a pass). */
    int (*writes_grad)(void *ctx, const struct tr_graph *g, const struct tr_node *n, int k);
    /* Optional (ABI 6): store n = t->numel fp32 values from host memory
     * into frozen tensor t's data in its storage type: F32 as is, BF16 and
     * F16 rounded to nearest even, NF4 quantised (kernels/nf4.h, the values
     * bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64,
     * compress_statistics=True) gives).  NULL: the backend keeps frozen
     * weights in fp32 only (uploaded like parameters). */
    int (*store_frozen)(void *ctx, const struct tr_tensor *t, const float *host, tr_err *err);
    /* Optional (ABI 6): the inverse into host fp32 (NF4 dequantised, the
     * matrix bitsandbytes' dequantize_4bit gives, bit for bit): for exports
     * that merge an adapter into its base. */
    int (*load_frozen)(void *ctx, const struct tr_tensor *t, float *host, tr_err *err);
    /* Optional (ABI 7; NULL: the backend cannot): the bytes [ptr, ptr +
     * bytes) of memory from alloc are not needed now; the backend may give
     * the memory behind them back (the CPU's whole pages to the kernel) and
     * they read as zeros afterwards, until written.  Data parallelism with
     * parallel.shard = "gradients" or "parameters" discards the parts of the
     * flat gradient and parameter buffers other ranks own, so a rank's
     * resident memory is its shard plus what is in flight.  A backend with
     * `commit` (below) may instead leave discarded memory unusable until it
     * is committed again. */
    void (*discard)(void *ctx, void *ptr, size_t bytes);
    /* Optional (ABI 9; NULL: never): nonzero when the backend runs node n's
     * forward over a window of sequence rows (tr_graph.seq_to > 0, batch 1):
     * rope turning row t by position seq_from + t of views the core makes,
     * attention computing query rows [seq_from, seq_to) of its whole inputs
     * (and aux) into a view of those rows of its output,
     * and every other op on the core's views of its tensors (which a backend
     * that keeps per-node plans of the planned shapes cannot take).  sample's
     * key/value cache runs on it (core/engine/graph_exec.c,
     * tr_graph_forward_rows); without it sample re-runs the whole context. */
    int (*supports_rows)(void *ctx, const struct tr_graph *g, const struct tr_node *n);
    /* Optional (ABI 10; NULL: the core gathers sharded parameters in fp32):
     * n values at src (backend memory, of type `from`) into dst (backend
     * memory, of type `to`), for from and to among TR_F32, TR_BF16 and
     * TR_F16: the same type copied as it is, fp32 to 16 bits rounded to
     * nearest even -- the bits the backend's GEMMs round their inputs to
     * under that compute dtype -- and 16 bits to fp32 widened exactly.
     * 16-bit values need only be 2-byte aligned; dst and src do not
     * overlap.  Called from the core's communication thread while nodes
     * run on the compute thread (tr_graph.params16 is filled through it),
     * so it must not use what they use (the CPU's OpenMP team): the copy
     * runs on the calling thread, done when it returns. */
    void (*convert)(void *ctx, void *dst, enum tr_dtype to, const void *src, enum tr_dtype from,
                    size_t n);
    /* Optional (ABI 11; NULL: discarded memory reads as zeros when touched
     * again, as the CPU's pages do): the bytes [ptr, ptr + bytes) of memory
     * from alloc are about to be read or written; what of them was
     * discarded is made usable again and reads as zeros, the rest keeps its
     * contents.  A backend whose discard unmaps memory (the cuda backend's
     * virtual memory: a discarded range faults until committed) needs it:
     * the core commits before every access it makes or orders to memory it
     * may have discarded (core/engine/backend.h's wrappers, the gathers and
     * each backward node's parameter gradients).  May be called from the
     * communication thread while nodes run, as convert is; ordered before
     * the work the caller queues after it. */
    void (*commit)(void *ctx, void *ptr, size_t bytes);
};

struct tr_backend {
    const struct tr_backend_iface *iface;
    void *context;
    const struct tr_backend_module *module; /* the module that opened it */
};

/* Every backend is a module: the core opens it by name (device=) and never
 * calls a backend's own functions.  The CPU one is linked in
 * (tr_cpu_backend_module, in core/engine/backend.c's table of built-in modules);
 * any other is a loadable module, backend_<device>.so, found on the plugin
 * search path and exporting TR_BACKEND_ENTRY_NAME, so a trainrun built with
 * a device backend still starts where that device (or its driver) is
 * missing, and says why device=<name> is unavailable. */
#define TR_BACKEND_ABI 11 /* 2: the Llama-family ops and node attributes; 3: convolutions;
                          * 4: the memory plan counts the backend's parameter copies;
                          * 5: gradients written by their first writer (writes_grad);
                          * 6: frozen weights (16-bit, NF4) and store/load_frozen;
                          * 7: discard, and tr_graph.params_sharded;
                          * 8: rope's frequency scaling (tr_node.rope_factor ...);
                          * 9: windows of sequence rows (tr_graph.seq_from, supports_rows);
                          * 10: tr_graph.params16 and convert (sharded parameters gathered
                          *     in the compute dtype); a linear's b may be an addend of its
                          *     output's shape (ops.h, tr_linear_addend);
                          * 11: commit (discarded memory made usable again) */
#define TR_BACKEND_ENTRY_NAME "trainrun_backend_entry"

struct tr_backend_module {
    uint32_t abi;         /* TR_BACKEND_ABI */
    uint32_t struct_size; /* sizeof(struct tr_backend_module) */
    const char *name;     /* "cuda" */
    /* Fill be->iface and be->context; on failure write why into why[0..size). */
    int (*open)(struct tr_backend *be, int threads, char *why, size_t why_size);
    void (*close)(struct tr_backend *be);
    /* Optional: what this machine offers the backend (driver and library
     * versions, each device), one item a line, without opening it and
     * without crashing where there is no device.  0 when buf holds it. */
    int (*describe)(char *buf, size_t size);
};
typedef const struct tr_backend_module *(*tr_backend_entry_fn)(void);

/* The CPU backend, built in (kernels/cpu/backend.c); `threads` 0 at open
 * means one per core. */
extern const struct tr_backend_module tr_cpu_backend_module;
/* How the CPU backend runs GEMMs whose inputs are `compute` on this
 * machine, in one line for doctor, plan and the run's first line: "bf16
 * GEMMs: native (AVX512-BF16, oneDNN)", or emulated and slower than fp32. */
const char *tr_cpu_gemm_path(enum tr_dtype compute);

#endif
