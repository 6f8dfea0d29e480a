/* Autodiff and the one-time memory plan: which tensors carry gradients,
 * where every tensor, gradient and arena lives (all allocated up front, the
 * activation gradients packed by lifetime), each gradient's first writer in
 * backward, and the memory report by class.  A graph that only runs
 * forward (eval, sample) gets a plan of its own: no gradients, and its
 * activations packed by their lifetimes in forward (place_forward). */
#include "graph.h"
#include "backend.h"
#include "graph_internal.h"

#include "../util/util.h"

#include <stdlib.h>
#include <string.h>

/* A tensor produced inside recompute segment s that nothing outside s reads:
 * it can be dropped after forward and rebuilt before backward. */
static int segment_internal(const struct tr_graph *g, int t)
{
    int p = g->tensors[t].producer;
    if (p < 0 || g->nodes[p].segment <= 0 || t == g->loss || t == g->logits)
        return 0;
    int s = g->nodes[p].segment;
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_in; k++)
            if (g->nodes[j].in[k] == t && g->nodes[j].segment != s)
                return 0;
    return 1;
}

int tr_graph_runs_backward(const struct tr_graph *g, const struct tr_node *n)
{
    int any = n->out == g->loss;
    for (int k = 0; k < n->n_in; k++)
        any |= g->tensors[n->in[k]].grad != NULL;
    return any && (n->out == g->loss || g->tensors[n->out].grad);
}

/* Each gradient's first writer in backward: the last node in forward order
 * that reads the tensor and runs backward.  It writes the gradient where
 * the backend says it can (writes_grad), else the core zeroes the gradient
 * right before it: activation gradients in every backward, parameter
 * gradients when the step starts them fresh (g->grads_fresh).  A tensor an
 * op reads twice (x + x) is zeroed, never written: the op's two updates
 * both land in it. */
static void plan_first_writers(struct tr_graph *g, const struct tr_backend *be)
{
    for (int i = 0; i < g->n_nodes; i++) {
        struct tr_node *n = &g->nodes[i];
        n->zero_grad_mask = n->act_write_mask = n->param_zero_mask = n->param_write_mask = 0;
        n->write_grad_mask = 0;
    }
    unsigned char *seen = tr_xcalloc((size_t)g->n_tensors, 1);
    for (int j = g->n_nodes - 1; j >= 0; j--) {
        struct tr_node *n = &g->nodes[j];
        if (!tr_graph_runs_backward(g, n))
            continue;
        for (int k = 0; k < n->n_in; k++) {
            int t = n->in[k];
            const struct tr_tensor *x = &g->tensors[t];
            if (x->grad == NULL || seen[t] ||
                (x->role != TR_ROLE_ACTIVATION && x->role != TR_ROLE_PARAM))
                continue;
            seen[t] = 1;
            int twice = 0;
            for (int k2 = 0; k2 < n->n_in; k2++)
                twice |= k2 != k && n->in[k2] == t;
            int write = !twice && tr_be_writes_grad(be, g, n, k); /* 0 without the slot */
            unsigned bit = 1u << k;
            if (x->role == TR_ROLE_ACTIVATION)
                *(write ? &n->act_write_mask : &n->zero_grad_mask) |= bit;
            else
                *(write ? &n->param_write_mask : &n->param_zero_mask) |= bit;
        }
    }
    free(seen);
}

/* ---- memory plan ------------------------------------------------------- */

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

struct interval {
    int tensor;
    int start, end; /* inclusive, in backward order */
    size_t bytes, offset;
};

static int by_start(const void *a, const void *b)
{
    const struct interval *x = a, *y = b;
    if (x->start != y->start)
        return x->start - y->start;
    return x->tensor - y->tensor;
}

/* Greedy first-fit packing of gradient buffers whose backward lifetimes do
 * not overlap. Returns the arena size. */
static size_t pack_intervals(struct interval *iv, int n)
{
    qsort(iv, (size_t)n, sizeof *iv, by_start);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t offset = 0;
        for (int moved = 1; moved;) {
            moved = 0;
            for (int j = 0; j < i; j++) {
                if (iv[j].end < iv[i].start || iv[j].start > iv[i].end)
                    continue;
                if (offset < tr_sat_add(iv[j].offset, iv[j].bytes) &&
                    iv[j].offset < tr_sat_add(offset, iv[i].bytes)) {
                    offset = tr_sat_add(iv[j].offset, iv[j].bytes);
                    moved = 1;
                }
            }
        }
        iv[i].offset = offset;
        if (tr_sat_add(offset, iv[i].bytes) > total)
            total = tr_sat_add(offset, iv[i].bytes);
    }
    return total;
}

/* Where activations are stored: in the compute dtype when the precision
 * policy's is 16-bit (bf16, fp16), so what forward keeps for backward takes
 * half the bytes; in fp32 otherwise.  Three kinds stay fp32 whatever the
 * policy: the loss (a scalar the run reads), the logits (the run's accuracy,
 * sampling and evaluation read them as fp32, the loss's gradient for them
 * is fp32 of the same size anyway, and a loss over rounded logits would be
 * coarser: PyTorch's autocast upcasts them inside the loss, holding an fp32
 * copy too) and whatever else a cross-entropy reads.  Gradients, saved aux
 * (mean, rstd, lse), parameters and inputs keep their dtypes.  Rerun at each
 * plan, so the same graph planned under fp32 goes back to fp32. */
static void plan_storage(struct tr_graph *g)
{
    enum tr_dtype half = g->compute == TR_BF16 || g->compute == TR_F16 ? g->compute : TR_F32;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == TR_ROLE_ACTIVATION)
            g->tensors[i].dtype = i == g->loss || i == g->logits ? TR_F32 : half;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TR_OP_CROSS_ENTROPY && g->nodes[i].n_in > 0 &&
            g->nodes[i].in[0] >= 0 && g->nodes[i].in[0] < g->n_tensors &&
            g->tensors[g->nodes[i].in[0]].role == TR_ROLE_ACTIVATION)
            g->tensors[g->nodes[i].in[0]].dtype = TR_F32;
}

/* What plan works out before it allocates: where each tensor goes. */
struct layout {
    int *needs;          /* tensor i carries a gradient */
    size_t *slot;        /* activations, saved and inputs: byte offset in their arena */
    int *shared;         /* in the recompute arena (a recomputed segment's internals) */
    struct interval *iv; /* activation gradients in the gradient arena */
    int n_iv;
    int *grad_alias;     /* -1, or the tensor whose gradient buffer tensor i shares */
    size_t act_bytes, in_bytes, grad_arena;
};

/* which tensors carry gradients: params, and anything computed from them */
static int *gradient_flow(const struct tr_graph *g)
{
    int *needs = tr_xcalloc((size_t)g->n_tensors, sizeof *needs);
    for (int i = 0; i < g->n_tensors; i++)
        needs[i] = g->tensors[i].role == TR_ROLE_PARAM;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (needs[n->in[k]])
                needs[n->out] = 1;
    }
    needs[g->loss] = 0; /* the loss gradient is the scalar g->loss_grad */
    return needs;
}

/* parameters: one flat buffer, weight-decayed tensors first; buffers (batch
 * norm's running statistics): fp32 state beside the parameters, in their
 * own array; counted in the parameters row, as they are model state a
 * checkpoint holds, never trained */
static void place_params(struct tr_graph *g, int optimizer_slots, int forward_only,
                         struct tr_memory_report *m)
{
    g->n_params = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->n_tensors; i++) {
            struct tr_tensor *t = &g->tensors[i];
            if (t->role != TR_ROLE_PARAM || t->decay != (pass == 0))
                continue;
            t->offset = g->n_params;
            g->n_params += t->numel;
            if (pass == 0)
                g->n_decay = g->n_params;
        }
    /* forward only: no gradient and no optimizer state for them */
    m->grads = forward_only ? 0 : g->n_params * sizeof(float);
    m->optimizer = tr_sat_mul((size_t)optimizer_slots, m->grads);
    g->n_buffers = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == TR_ROLE_BUFFER) {
            g->tensors[i].offset = g->n_buffers;
            g->n_buffers += g->tensors[i].numel;
        }
    m->params = (g->n_params + g->n_buffers) * sizeof(float);
    /* frozen weights (an adapter's base): each in its storage type, at a
     * 64-byte aligned offset of their own arena */
    g->frozen_bytes = 0;
    m->quantized = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_FROZEN)
            continue;
        size_t bytes = align64(tr_frozen_bytes(t));
        t->offset = g->frozen_bytes;
        g->frozen_bytes = tr_sat_add(g->frozen_bytes, bytes);
        if (t->dtype == TR_NF4)
            m->quantized = tr_sat_add(m->quantized, bytes);
    }
    m->frozen = g->frozen_bytes;
}

/* An activation no backward reads (an adapter's base output and update,
 * which the add after them consumes: tr_ops[].bwd_ignores): it is needed
 * only from its producer to its last reader in forward, so such tensors
 * share memory wherever those spans do not overlap.  Not where a recomputed
 * segment makes or reads it (backward re-runs that forward), nor the loss
 * or the logits (read after forward).  Returns its last reader, or -1. */
static int transient_until(const struct tr_graph *g, int t)
{
    const struct tr_tensor *x = &g->tensors[t];
    int p = x->producer;
    if (x->role != TR_ROLE_ACTIVATION || p < 0 || t == g->loss || t == g->logits ||
        !(tr_ops[g->nodes[p].op].bwd_ignores & TR_BWD_OUT))
        return -1;
    /* inside a recomputed segment: only where all of it is (re-run as one) */
    int seg = g->nodes[p].segment, last = -1;
    for (int j = p + 1; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_in; k++)
            if (g->nodes[j].in[k] == t) {
                if (g->nodes[j].segment != seg ||
                    !(tr_ops[g->nodes[j].op].bwd_ignores & (1u << k)))
                    return -1;
                last = j;
            }
    return last;
}

/* activations and saved tensors: each its own slot (all live until
 * backward), except the internals of recomputed segments, which share one
 * arena sized for the largest segment, and activations no backward reads,
 * packed by their forward spans after the others; inputs in an arena of
 * their own */
static void place_activations(const struct tr_graph *g, struct layout *l,
                              struct tr_memory_report *m)
{
    l->slot = tr_xcalloc((size_t)g->n_tensors, sizeof *l->slot);
    l->shared = tr_xcalloc((size_t)g->n_tensors, sizeof *l->shared);
    int max_segment = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].segment > max_segment)
            max_segment = g->nodes[i].segment;
    size_t *segment_bytes = tr_xcalloc((size_t)max_segment + 1, sizeof *segment_bytes);
    struct interval *spans = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *spans);
    int n_spans = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        size_t bytes = align64(t->numel * tr_dtype_size(t->dtype));
        int until = transient_until(g, i);
        if (until >= 0) {
            spans[n_spans++] = (struct interval){i, t->producer, until, bytes, 0};
        } else if ((t->role == TR_ROLE_ACTIVATION || t->role == TR_ROLE_SAVED) &&
                   segment_internal(g, i)) {
            int seg = g->nodes[t->producer].segment;
            l->shared[i] = 1;
            l->slot[i] = segment_bytes[seg];
            segment_bytes[seg] = tr_sat_add(segment_bytes[seg], bytes);
            m->recompute_saved = tr_sat_add(m->recompute_saved, bytes);
        } else if (t->role == TR_ROLE_ACTIVATION || t->role == TR_ROLE_SAVED) {
            l->slot[i] = l->act_bytes;
            l->act_bytes = tr_sat_add(l->act_bytes, bytes);
            if (t->role == TR_ROLE_ACTIVATION)
                m->activations = tr_sat_add(m->activations, bytes);
            else
                m->saved = tr_sat_add(m->saved, bytes);
        } else if (t->role == TR_ROLE_INPUT) {
            l->slot[i] = l->in_bytes;
            l->in_bytes = tr_sat_add(l->in_bytes, bytes);
        }
    }
    /* the transient ones after the rest of the arena, packed by their
     * forward spans.  A recomputed segment's re-run in backward writes its
     * own there again: by then no transient tensor is live but its own */
    size_t packed = pack_intervals(spans, n_spans);
    for (int k = 0; k < n_spans; k++)
        l->slot[spans[k].tensor] = l->act_bytes + spans[k].offset;
    l->act_bytes = tr_sat_add(l->act_bytes, packed);
    m->activations = tr_sat_add(m->activations, packed);
    free(spans);
    m->inputs = l->in_bytes;
    for (int sgm = 1; sgm <= max_segment; sgm++)
        if (segment_bytes[sgm] > m->recompute)
            m->recompute = segment_bytes[sgm];
    free(segment_bytes);
}

/* Forward only (eval, sample): nothing waits for a backward, so every
 * activation and saved tensor lives from its producer to its last reader
 * in forward (a saved tensor, read by no other node, for its own node
 * alone), and tensors whose spans do not overlap share memory: the arena
 * holds the widest cut through the forward, about one block's worth,
 * instead of every block's.  The loss and the logits, read after forward,
 * keep slots of their own; recompute segments mean nothing without a
 * backward.  Inputs in their arena, as for training. */
static void place_forward(const struct tr_graph *g, struct layout *l, struct tr_memory_report *m,
                          size_t *cache)
{
    /* with a cache (tr_graph_plan_forward_cached), every attention's keys
     * and values keep slots of their own too: later windows read their
     * earlier rows (a packed qkv whole, queries included) */
    unsigned char *keep = tr_xcalloc((size_t)g->n_tensors, 1);
    for (int j = 0; cache && j < g->n_nodes; j++) {
        const struct tr_node *n = &g->nodes[j];
        for (int k = n->n_in == 3 ? 1 : 0; n->op == TR_OP_ATTENTION && k < n->n_in; k++)
            keep[n->in[k]] = 1;
    }
    l->slot = tr_xcalloc((size_t)g->n_tensors, sizeof *l->slot);
    l->shared = tr_xcalloc((size_t)g->n_tensors, sizeof *l->shared);
    int *last = tr_xcalloc((size_t)g->n_tensors, sizeof *last);
    for (int i = 0; i < g->n_tensors; i++)
        last[i] = g->tensors[i].producer;
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_in; k++) {
            int t = g->nodes[j].in[k];
            if (t >= 0 && t < g->n_tensors && j > last[t])
                last[t] = j;
        }
    struct interval *spans = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *spans);
    int n_spans = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        size_t bytes = align64(t->numel * tr_dtype_size(t->dtype));
        if (t->role == TR_ROLE_INPUT) {
            l->slot[i] = l->in_bytes;
            l->in_bytes = tr_sat_add(l->in_bytes, bytes);
        } else if (t->role != TR_ROLE_ACTIVATION && t->role != TR_ROLE_SAVED) {
            continue;
        } else if (t->producer < 0 || i == g->loss || i == g->logits || keep[i]) {
            l->slot[i] = l->act_bytes;
            l->act_bytes = tr_sat_add(l->act_bytes, bytes);
            if (keep[i])
                *cache = tr_sat_add(*cache, bytes);
        } else {
            spans[n_spans++] = (struct interval){i, t->producer, last[i], bytes, 0};
        }
    }
    free(keep);
    size_t packed = pack_intervals(spans, n_spans);
    for (int k = 0; k < n_spans; k++)
        l->slot[spans[k].tensor] = l->act_bytes + spans[k].offset;
    l->act_bytes = tr_sat_add(l->act_bytes, packed);
    m->activations = l->act_bytes; /* the saved ones are transient too: no row of their own */
    m->inputs = l->in_bytes;
    free(spans);
    free(last);
}

/* An input whose gradient is its reader's output gradient value for value
 * (an add's inputs, d(a + b)/da = 1; a linear's addend: tr_op_grad_is_dout)
 * and that nothing else reads gets that output gradient's buffer: the
 * reader's backward then finds in[k]'s gradient at its output gradient's
 * address and has nothing to write there (a copy onto itself at worst).
 * A LoRA adapter's base output is such an input (adapters.c), as is the
 * branch output of each residual add.  Only where the backend writes that
 * gradient (writes_grad): one that adds would have the core zero it first,
 * the output's gradient with it.  Returns the tensor whose buffer tensor t
 * takes, or -1. */
static int grad_alias(const struct tr_graph *g, const struct tr_backend *be, const int *needs,
                      const int *reads, const int *reader, int t)
{
    const struct tr_tensor *x = &g->tensors[t];
    if (!needs[t] || x->role != TR_ROLE_ACTIVATION || reads[t] != 1)
        return -1;
    const struct tr_node *n = &g->nodes[reader[t]];
    if (!needs[n->out] || g->tensors[n->out].role != TR_ROLE_ACTIVATION)
        return -1;
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] == t)
            return tr_op_grad_is_dout(g, n, k) && tr_be_writes_grad(be, g, n, k) ? n->out : -1;
    return -1;
}

/* activation gradients: live from their first writer (the last consumer,
 * first in backward) to their producer's backward; buffers with disjoint
 * lifetimes share memory, and an add's input shares its output's
 * (grad_alias) for both their lifetimes. */
static void place_activation_grads(const struct tr_graph *g, const struct tr_backend *be,
                                   struct layout *l, struct tr_memory_report *m)
{
    l->iv = tr_xcalloc((size_t)g->n_tensors, sizeof *l->iv);
    l->n_iv = 0;
    int last = g->n_nodes - 1;
    int *reads = tr_xcalloc((size_t)g->n_tensors, sizeof *reads);
    int *reader = tr_xcalloc((size_t)g->n_tensors, sizeof *reader); /* the last */
    int *at = tr_xcalloc((size_t)g->n_tensors, sizeof *at);           /* index in iv */
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_in; k++) {
            reads[g->nodes[j].in[k]]++;
            reader[g->nodes[j].in[k]] = j;
        }
    for (int i = 0; i < g->n_tensors; i++)
        if (l->needs[i] && g->tensors[i].role == TR_ROLE_ACTIVATION && reads[i] == 0)
            l->needs[i] = 0; /* feeds nothing: no gradient arrives */
    l->grad_alias = tr_xcalloc((size_t)g->n_tensors, sizeof *l->grad_alias);
    for (int i = 0; i < g->n_tensors; i++)
        l->grad_alias[i] = grad_alias(g, be, l->needs, reads, reader, i);
    /* outputs before inputs: an alias's own buffer is settled when an
     * input of the add that made it asks for it (chains of adds) */
    for (int i = g->n_tensors - 1; i >= 0; i--) {
        const struct tr_tensor *t = &g->tensors[i];
        at[i] = -1;
        if (!l->needs[i] || t->role != TR_ROLE_ACTIVATION || l->grad_alias[i] >= 0)
            continue;
        struct interval *v = &l->iv[l->n_iv];
        at[i] = l->n_iv++;
        v->tensor = i;
        v->start = last - reader[i];
        v->end = last - t->producer;
        v->bytes = align64(t->numel * sizeof(float));
    }
    /* each alias to its root, which lives until the alias's producer runs
     * backward too */
    for (int i = 0; i < g->n_tensors; i++) {
        if (l->grad_alias[i] < 0)
            continue;
        int r = l->grad_alias[i];
        while (l->grad_alias[r] >= 0)
            r = l->grad_alias[r];
        l->grad_alias[i] = r;
        struct interval *v = &l->iv[at[r]];
        if (last - g->tensors[i].producer > v->end)
            v->end = last - g->tensors[i].producer;
    }
    l->grad_arena = pack_intervals(l->iv, l->n_iv);
    m->activation_grads = l->grad_arena;
    free(reads);
    free(reader);
    free(at);
}

/* scratch (the largest any node asks for) and the backend's parameter copies */
static void size_scratch(struct tr_graph *g, const struct tr_backend *be,
                         struct tr_memory_report *m)
{
    g->scratch_floats = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        size_t s = tr_be_scratch_floats(be, g, &g->nodes[i]);
        if (s > g->scratch_floats)
            g->scratch_floats = s;
    }
    m->scratch = tr_sat_mul(g->scratch_floats, sizeof(float));
    m->param_copies = tr_be_param_copy_bytes(be, g);
}

/* Every arena on the backend, or an out-of-memory error. */
static int allocate_arenas(struct tr_graph *g, const struct tr_backend *be, const struct layout *l,
                           tr_err *err)
{
    const struct tr_memory_report *m = &g->memory;
    g->params = tr_be_alloc(be, m->params);
    g->grads = m->grads ? tr_be_alloc(be, m->grads) : NULL; /* none forward only */
    g->activation_arena = tr_be_alloc(be, l->act_bytes);
    g->grad_arena = l->grad_arena ? tr_be_alloc(be, l->grad_arena) : NULL;
    g->input_arena = tr_be_alloc(be, l->in_bytes);
    g->scratch = g->scratch_floats ? tr_be_alloc(be, m->scratch) : NULL;
    g->recompute_arena = m->recompute ? tr_be_alloc(be, m->recompute) : NULL;
    g->buffers = g->n_buffers ? tr_be_alloc(be, g->n_buffers * sizeof(float)) : NULL;
    g->frozen = g->frozen_bytes ? tr_be_alloc(be, g->frozen_bytes) : NULL;
    if (!g->params || (m->grads && !g->grads) || !g->activation_arena || (l->grad_arena && !g->grad_arena) ||
        (g->n_buffers && !g->buffers) || (g->frozen_bytes && !g->frozen) ||
        !g->input_arena || (g->scratch_floats && !g->scratch) || (m->recompute && !g->recompute_arena)) {
        char need[32];
        tr_format_bytes((double)m->params + (double)m->grads + (double)l->act_bytes +
                            (double)l->grad_arena + (double)l->in_bytes + (double)m->scratch,
                        need, sizeof need);
        /* activations grow with the context: with a long one, its length is a lever */
        const struct tr_tensor *in = &g->tensors[g->inputs[0]];
        char ctx[120] = "";
        if (in->dtype == TR_I32 && in->ndim == 2 && in->shape[1] > 1)
            snprintf(ctx, sizeof ctx, ", shorten the context (model.ctx, now %lld tokens a "
                     "sample)", (long long)in->shape[1]);
        return tr_fail(err, "out of %s memory: the plan needs %s at micro-batch %d; lower the "
                       "micro-batch (train.micro_batch)%s or use micro_batch = \"auto\"",
                       tr_be_name(be), need, g->batch, ctx);
    }
    return TR_OK;
}

/* Each tensor's data (and gradient) in the arenas allocated. */
static void bind_tensors(struct tr_graph *g, const struct layout *l)
{
    for (int i = 0; i < g->n_tensors; i++) {
        struct tr_tensor *t = &g->tensors[i];
        switch (t->role) {
        case TR_ROLE_PARAM:
            t->data = g->params + t->offset;
            t->grad = g->grads ? g->grads + t->offset : NULL;
            break;
        case TR_ROLE_INPUT:
            t->data = (char *)g->input_arena + l->slot[i];
            break;
        case TR_ROLE_BUFFER:
            t->data = g->buffers + t->offset;
            break;
        case TR_ROLE_FROZEN:
            t->data = (char *)g->frozen + t->offset;
            t->grad = NULL;
            break;
        default:
            t->data = (char *)(l->shared[i] ? g->recompute_arena : g->activation_arena) + l->slot[i];
            break;
        }
    }
    for (int i = 0; i < l->n_iv; i++)
        g->tensors[l->iv[i].tensor].grad = (float *)((char *)g->grad_arena + l->iv[i].offset);
    for (int i = 0; l->grad_alias && i < g->n_tensors; i++)
        if (l->grad_alias[i] >= 0)
            g->tensors[i].grad = g->tensors[l->grad_alias[i]].grad;
}

/* The plan: the memory report always, and with allocate the arenas and each
 * tensor's place in them, then each gradient's first writer. */
static int plan(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots, int allocate,
                int forward_only, size_t *cache, tr_err *err)
{
    struct tr_memory_report *m = &g->memory;
    memset(m, 0, sizeof *m);
    struct layout l;
    memset(&l, 0, sizeof l);
    if (forward_only) {
        l.needs = tr_xcalloc((size_t)g->n_tensors, sizeof *l.needs);
        place_params(g, 0, 1, m);
        place_forward(g, &l, m, cache);
    } else {
        l.needs = gradient_flow(g);
        place_params(g, optimizer_slots, 0, m);
        place_activations(g, &l, m);
        place_activation_grads(g, be, &l, m);
    }
    size_scratch(g, be, m);
    int rc = TR_OK;
    if (allocate) {
        rc = allocate_arenas(g, be, &l, err);
        if (rc == TR_OK) {
            bind_tensors(g, &l);
            plan_first_writers(g, be);
        }
    }
    free(l.needs);
    free(l.slot);
    free(l.shared);
    free(l.iv);
    free(l.grad_alias);
    return rc;
}

/* Whether be runs node n: the op table's word for the device first (where
 * the table knows the device), then the backend's supports_op. */
static int runs_on(const struct tr_graph *g, const struct tr_node *n, const struct tr_backend *be)
{
    unsigned bit = tr_op_backend_bit(tr_be_name(be));
    const struct tr_op_desc *op = tr_op_desc(n->op);
    if (bit && (!op || !(op->backends & bit)))
        return 0;
    return tr_be_supports_op(be, g, n);
}

static int checked_plan(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots,
                        int forward_only, size_t *cache, tr_err *err)
{
    plan_storage(g);
    /* frozen weights in 16 or 4 bits need a backend that stores them */
    for (int i = 0; i < g->n_tensors && !tr_be_stores_frozen(be); i++)
        if (g->tensors[i].role == TR_ROLE_FROZEN && g->tensors[i].dtype != TR_F32)
            return tr_fail(err, "device \"%s\" cannot store the frozen weight '%s' in %s; use "
                           "lora.base = \"fp32\" or another device", tr_be_name(be),
                           g->tensors[i].name, g->tensors[i].dtype == TR_NF4 ? "NF4" : "16 bits");
    /* a node the device cannot run is refused before anything is allocated */
    for (int i = 0; i < g->n_nodes; i++)
        if (!runs_on(g, &g->nodes[i], be))
            return tr_fail(err, "device \"%s\" cannot run %s '%s': its backend does not "
                           "support op %s on these tensor types; choose another device",
                           tr_be_name(be), tr_op_name(g->nodes[i].op), g->nodes[i].name,
                           tr_op_name(g->nodes[i].op));
    return plan(g, be, optimizer_slots, 1, forward_only, cache, err);
}

int tr_graph_plan(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots, tr_err *err)
{
    return checked_plan(g, be, optimizer_slots, 0, NULL, err);
}

int tr_graph_plan_forward(struct tr_graph *g, const struct tr_backend *be, tr_err *err)
{
    return checked_plan(g, be, 0, 1, NULL, err);
}

/* ---- windows of sequence rows: sample's key/value cache ---------------------- */

int tr_graph_rows_ok(const struct tr_graph *g, const struct tr_backend *be)
{
    int T = tr_graph_sequence_length(g);
    if (T < 2 || g->logits < 0 || g->training || g->before_node)
        return 0;
    int last = g->tensors[g->logits].producer;
    if (last < 0)
        return 0;
    for (int i = 0; i <= last; i++) {
        const struct tr_node *n = &g->nodes[i];
        enum tr_rows_rule rule = tr_op_rows(n->op);
        if (rule == TR_ROWS_NONE || !tr_be_supports_rows(be, g, n))
            return 0;
        int t[6], k = tr_node_tensors(n, t);
        for (int j = 0; j < k; j++) {
            const struct tr_tensor *x = &g->tensors[t[j]];
            int per_sequence = x->role == TR_ROLE_INPUT || x->role == TR_ROLE_ACTIVATION ||
                               x->role == TR_ROLE_SAVED;
            if (rule == TR_ROWS_TABLE && t[j] == n->in[1]) {
                if (per_sequence || x->ndim != 2 || x->shape[0] < T)
                    return 0;
            } else if (rule == TR_ROWS_WHOLE) {
                /* attention: its inputs and output [1,T,...] (lse [1,H,T] is its own) */
                if (t[j] != n->aux[0] && tr_sequence_dim(x, T) != 1)
                    return 0;
            } else if (per_sequence && tr_sequence_dim(x, T) < 0) {
                return 0; /* rows this op mixes some other way */
            }
        }
    }
    return 1;
}

int tr_graph_plan_forward_cached(struct tr_graph *g, const struct tr_backend *be, size_t *cache,
                                 tr_err *err)
{
    *cache = 0;
    return checked_plan(g, be, 0, 1, tr_graph_rows_ok(g, be) ? cache : NULL, err);
}

void tr_graph_measure(struct tr_graph *g, const struct tr_backend *be, int optimizer_slots)
{
    tr_err ignored;
    plan_storage(g);
    plan(g, be, optimizer_slots, 0, 0, NULL, &ignored);
}

size_t tr_graph_measure_forward(struct tr_graph *g, const struct tr_backend *be)
{
    tr_err ignored;
    struct tr_memory_report kept = g->memory;
    plan_storage(g);
    plan(g, be, 0, 0, 1, NULL, &ignored);
    size_t total = tr_graph_memory_total(&g->memory);
    g->memory = kept; /* the offsets are the same either way: only the report differs */
    return total;
}

/* ---- the memory report ---------------------------------------------------- */

size_t tr_memory_rows(const struct tr_memory_report *m, struct tr_memory_row rows[TR_MEMORY_ROWS])
{
    const struct tr_memory_row all[TR_MEMORY_ROWS] = {
        {"parameters", m->params},        {"gradients", m->grads},
        {"optimizer state", m->optimizer}, {"activations", m->activations},
        {"saved for backward", m->saved}, {"activation gradients", m->activation_grads},
        {"inputs", m->inputs},            {"scratch", m->scratch},
        {"recompute arena", m->recompute}, {"parameter copies", m->param_copies},
        {m->quantized ? "frozen (NF4 + 16-bit)" : "frozen weights", m->frozen},
    };
    size_t n = 0; /* the last three only where there is any */
    for (size_t i = 0; i < TR_MEMORY_ROWS; i++)
        if (i < 8 || all[i].bytes)
            rows[n++] = all[i];
    return n;
}

void tr_graph_print_memory(const struct tr_graph *g, FILE *out)
{
    const struct tr_memory_report *m = &g->memory;
    struct tr_memory_row rows[TR_MEMORY_ROWS];
    size_t n = tr_memory_rows(m, rows);
    char buf[32];
    if (g->n_buffers) /* the parameters row holds them too */
        fprintf(out, "memory plan (micro-batch %d, %zu parameters, %zu buffer floats):\n",
                g->batch, g->n_params, g->n_buffers);
    else
        fprintf(out, "memory plan (micro-batch %d, %zu parameters):\n", g->batch, g->n_params);
    for (size_t i = 0; i < n; i++) {
        tr_format_bytes((double)rows[i].bytes, buf, sizeof buf);
        fprintf(out, "  %-22s %12s  (%zu bytes)\n", rows[i].what, buf, rows[i].bytes);
    }
    size_t total = tr_graph_memory_total(m);
    tr_format_bytes((double)total, buf, sizeof buf);
    fprintf(out, "  %-22s %12s  (%zu bytes)\n", "total", buf, total);
    if (m->recompute_saved) {
        tr_format_bytes((double)(m->recompute_saved - m->recompute), buf, sizeof buf);
        fprintf(out, "  activation recomputation saves %s (%zu bytes)\n", buf,
                m->recompute_saved - m->recompute);
    }
    if (g->compute == TR_BF16 || g->compute == TR_F16) /* plan_storage's choice */
        fprintf(out, "  activations in %s storage (the logits, gradients and saved statistics "
                "in fp32)\n", g->compute == TR_BF16 ? "bf16" : "fp16");
}

size_t tr_graph_memory_total(const struct tr_memory_report *m)
{
    const size_t parts[] = {m->params,           m->grads,  m->optimizer, m->activations,
                            m->saved,            m->activation_grads, m->inputs,
                            m->scratch,          m->recompute,        m->param_copies,
                            m->frozen};
    size_t total = 0;
    for (size_t i = 0; i < TR_ARRAY_LEN(parts); i++)
        total = tr_sat_add(total, parts[i]); /* SIZE_MAX: more than any device */
    return total;
}
