/* Pipeline schedules, their simulation and the stage partition (pipeline.h). */
#include "pipeline.h"

#include "../util/util.h"

#include <ctype.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

/* ---- schedules ------------------------------------------------------------------ */

static int put(struct tr_pipe_op *ops, int n, int backward, int micro, int chunk)
{
    ops[n] = (struct tr_pipe_op){backward, micro, chunk};
    return n + 1;
}

/* Megatron's interleaved order: the k-th forward (or backward) of a stage
 * takes micro-batches in groups of P, each group through the stage's
 * chunks in turn (backward: the last chunk first). */
static void interleaved_op(int P, int V, int s, int k, int backward, int *micro, int *chunk)
{
    int v = (k % (P * V)) / P;
    if (backward)
        v = V - 1 - v;
    *chunk = v * P + s;
    *micro = (k / (P * V)) * P + k % P;
}

int tr_pipe_schedule(enum tr_pipe_kind kind, int P, int V, int M, int s, struct tr_pipe_op *ops)
{
    int n = 0;
    if (P < 1 || V < 1 || M < 1 || s < 0 || s >= P || (kind != TR_PIPE_INTERLEAVED && V != 1))
        return -1;
    if (kind == TR_PIPE_GPIPE) {
        for (int m = 0; m < M; m++)
            n = put(ops, n, 0, m, s);
        for (int m = 0; m < M; m++)
            n = put(ops, n, 1, m, s);
        return n;
    }
    if (kind == TR_PIPE_1F1B) {
        int warmup = P - s - 1 < M ? P - s - 1 : M;
        for (int m = 0; m < warmup; m++)
            n = put(ops, n, 0, m, s);
        for (int i = 0; i < M - warmup; i++) {
            n = put(ops, n, 0, warmup + i, s);
            n = put(ops, n, 1, i, s);
        }
        for (int m = M - warmup; m < M; m++)
            n = put(ops, n, 1, m, s);
        return n;
    }
    if (M % P != 0)
        return -1;
    int total = M * V, micro, chunk;
    int warmup = M == P ? total : (P - s - 1) * 2 + (V - 1) * P;
    if (warmup > total)
        warmup = total;
    for (int k = 0; k < warmup; k++) {
        interleaved_op(P, V, s, k, 0, &micro, &chunk);
        n = put(ops, n, 0, micro, chunk);
    }
    for (int i = 0; i < total - warmup; i++) {
        interleaved_op(P, V, s, warmup + i, 0, &micro, &chunk);
        n = put(ops, n, 0, micro, chunk);
        interleaved_op(P, V, s, i, 1, &micro, &chunk);
        n = put(ops, n, 1, micro, chunk);
    }
    for (int k = total - warmup; k < total; k++) {
        interleaved_op(P, V, s, k, 1, &micro, &chunk);
        n = put(ops, n, 1, micro, chunk);
    }
    return n;
}

double tr_pipe_bubble_theory(enum tr_pipe_kind kind, int P, int V, int M)
{
    double mv = (double)M * (kind == TR_PIPE_INTERLEAVED ? V : 1);
    return (double)(P - 1) / (mv + (double)P - 1);
}

/* ---- simulation ------------------------------------------------------------------- */

int tr_pipe_simulate(enum tr_pipe_kind kind, int P, int V, int M, const double *forward,
                     const double *backward, struct tr_pipe_sim *out, tr_err *err)
{
    int C = P * V, per = 2 * M * V;
    struct tr_pipe_op *ops = tr_xcalloc((size_t)P * (size_t)per, sizeof *ops);
    int *len = tr_xcalloc((size_t)P, sizeof *len), *at = tr_xcalloc((size_t)P, sizeof *at);
    int *held = tr_xcalloc((size_t)P, sizeof *held);
    double *free_at = tr_xcalloc((size_t)P, sizeof *free_at);
    /* when each (micro-batch, chunk)'s forward and backward finished; -1: not yet */
    double *done_f = tr_xcalloc((size_t)M * (size_t)C, sizeof *done_f);
    double *done_b = tr_xcalloc((size_t)M * (size_t)C, sizeof *done_b);
    int rc = TR_OK;
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < (size_t)M * (size_t)C; i++)
        done_f[i] = done_b[i] = -1;
    for (int s = 0; s < P && rc == TR_OK; s++)
        if ((len[s] = tr_pipe_schedule(kind, P, V, M, s, ops + (size_t)s * (size_t)per)) < 0)
            rc = tr_fail(err, "schedule %s cannot run %d stages x %d virtual over %d "
                         "micro-batches%s", tr_pipe_kinds[kind], P, V, M,
                         kind == TR_PIPE_INTERLEAVED ? " (micro-batches must be a multiple of "
                                                       "the stages)" : "");
    double work = 0;
    for (int left = P * per; rc == TR_OK && left > 0;) {
        int moved = 0;
        for (int s = 0; s < P; s++)
            while (at[s] < len[s]) {
                const struct tr_pipe_op *o = &ops[(size_t)s * (size_t)per + (size_t)at[s]];
                size_t me = (size_t)o->micro * (size_t)C + (size_t)o->chunk;
                double ready;
                if (!o->backward)
                    ready = o->chunk == 0 ? 0 : done_f[me - 1];
                else if (o->chunk == C - 1)
                    ready = done_f[me];
                else
                    ready = done_b[me + 1] < 0 || done_f[me] < 0 ? -1 : done_b[me + 1];
                if (ready < 0)
                    break; /* waits for another stage */
                double t = o->backward ? backward[o->chunk] : forward[o->chunk];
                double start = ready > free_at[s] ? ready : free_at[s];
                free_at[s] = start + t;
                work += t;
                if (o->backward) {
                    done_b[me] = free_at[s];
                    held[s]--;
                } else {
                    done_f[me] = free_at[s];
                    if (++held[s] > out->max_in_flight)
                        out->max_in_flight = held[s];
                }
                at[s]++;
                left--;
                moved = 1;
            }
        if (!moved)
            rc = tr_fail(err, "schedule %s: the stages wait on each other for ever (an invalid "
                         "order)", tr_pipe_kinds[kind]);
    }
    if (rc == TR_OK) {
        for (int s = 0; s < P; s++)
            out->makespan = free_at[s] > out->makespan ? free_at[s] : out->makespan;
        out->bubble = out->makespan > 0 ? 1.0 - work / ((double)P * out->makespan) : 0;
    }
    free(ops);
    free(len);
    free(at);
    free(held);
    free(free_at);
    free(done_f);
    free(done_b);
    return rc;
}

/* ---- the partition ---------------------------------------------------------------- */

/* The block a node belongs to, from its name: the number after "h." or
 * "layers." at the start of a dotted part; -1 for none. */
static int block_of(const char *name)
{
    static const char *const keys[] = {"h.", "layers."};
    for (const char *p = name; p && *p; p = strchr(p, '.') ? strchr(p, '.') + 1 : NULL)
        for (int k = 0; k < 2; k++) {
            size_t len = strlen(keys[k]);
            if (strncmp(p, keys[k], len) == 0 && isdigit((unsigned char)p[len])) {
                char *end;
                long b = strtol(p + len, &end, 10);
                if ((*end == '.' || *end == 0) && b < 1 << 20)
                    return (int)b;
            }
        }
    return -1;
}

/* Training FLOPs per token of node i (tr_graph_count_flops's rule, node by
 * node): 6 per parameter it multiplies first (4 frozen), 12 T W for
 * attention; an embedding's lookup multiplies nothing. */
static double node_flops(const struct tr_graph *g, int i, char *counted)
{
    const struct tr_node *n = &g->nodes[i];
    double f = 0;
    for (int k = 0; k < n->n_in; k++) {
        const struct tr_tensor *t = &g->tensors[n->in[k]];
        if ((n->op == TR_OP_EMBEDDING && k == 0) || counted[n->in[k]] ||
            (t->role != TR_ROLE_PARAM && t->role != TR_ROLE_FROZEN))
            continue;
        counted[n->in[k]] = 1;
        f += (t->role == TR_ROLE_FROZEN ? 4.0 : 6.0) * (double)t->numel;
    }
    if (n->op == TR_OP_ATTENTION) {
        const struct tr_tensor *q = &g->tensors[n->in[0]];
        int64_t T = q->shape[1], W = n->n_in == 3 ? q->shape[2] : q->shape[2] / 3;
        f += 12.0 * (double)T * (double)W;
    }
    return f;
}

struct piece {
    int first, last, block; /* nodes; block -1: embedding or head */
    double flops, params;
};

int tr_pipe_partition(const struct tr_graph *g, int chunks, struct tr_pipe_chunk *out, tr_err *err)
{
    struct piece *pc = tr_xcalloc((size_t)g->n_nodes + 1, sizeof *pc);
    char *counted = tr_xcalloc((size_t)g->n_tensors, 1), *owned = tr_xcalloc((size_t)g->n_tensors, 1);
    int n = 0, last_block = -1, blocks = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        int b = block_of(g->nodes[i].name);
        /* a new piece where a new block starts, and where the nodes after
         * the last block (the head) start */
        int starts = n == 0 || (b >= 0 && b != last_block) || (b < 0 && pc[n - 1].block >= 0 &&
                                                               !(i + 1 < g->n_nodes && block_of(g->nodes[i + 1].name) == last_block));
        if (b >= 0 && b != last_block)
            blocks++;
        if (starts)
            pc[n++] = (struct piece){i, i, b >= 0 ? b : -1, 0, 0};
        if (b >= 0)
            last_block = b;
        struct piece *p = &pc[n - 1];
        p->last = i;
        p->flops += node_flops(g, i, counted);
        const struct tr_node *nd = &g->nodes[i];
        for (int k = 0; k < nd->n_in; k++) {
            const struct tr_tensor *t = &g->tensors[nd->in[k]];
            if ((t->role == TR_ROLE_PARAM || t->role == TR_ROLE_FROZEN) && !owned[nd->in[k]]) {
                owned[nd->in[k]] = 1;
                p->params += (double)t->numel;
            }
        }
    }
    free(counted);
    free(owned);
    int rc = TR_OK;
    if (blocks == 0)
        rc = tr_fail(err, "pipeline: the model has no blocks to cut between (node names with "
                     "\"h.<l>.\" or \"layers.<l>.\")");
    else if (chunks > n)
        rc = tr_fail(err, "pipeline: %d stages (x virtual stages) but the model has %d pieces "
                     "to place (%d blocks, the embedding and the head): use fewer stages",
                     chunks, n, blocks);
    if (rc != TR_OK) {
        free(pc);
        return rc;
    }
    /* the contiguous cut whose largest chunk is smallest: best[j][i], the
     * least largest chunk of pieces [0, i) in j chunks (n x chunks, small) */
    double *best = tr_xcalloc((size_t)(chunks + 1) * (size_t)(n + 1), sizeof *best);
    int *from = tr_xcalloc((size_t)(chunks + 1) * (size_t)(n + 1), sizeof *from);
    double *prefix = tr_xcalloc((size_t)n + 1, sizeof *prefix);
    for (int i = 0; i < n; i++)
        prefix[i + 1] = prefix[i] + pc[i].flops;
#define AT(j, i) ((size_t)(j) * (size_t)(n + 1) + (size_t)(i))
    for (int i = 0; i <= n; i++)
        best[AT(0, i)] = i == 0 ? 0 : DBL_MAX;
    for (int j = 1; j <= chunks; j++)
        for (int i = 0; i <= n; i++) {
            best[AT(j, i)] = DBL_MAX;
            for (int k = j - 1; k < i; k++) { /* the last chunk: pieces [k, i) */
                if (best[AT(j - 1, k)] == DBL_MAX)
                    continue;
                double last = prefix[i] - prefix[k];
                double worst = last > best[AT(j - 1, k)] ? last : best[AT(j - 1, k)];
                if (worst < best[AT(j, i)]) {
                    best[AT(j, i)] = worst;
                    from[AT(j, i)] = k;
                }
            }
        }
    for (int j = chunks, i = n; j > 0; j--) {
        int k = from[AT(j, i)];
        struct tr_pipe_chunk *c = &out[j - 1];
        memset(c, 0, sizeof *c);
        c->first_node = pc[k].first;
        c->last_node = pc[i - 1].last;
        c->first_block = c->last_block = -1;
        for (int q = k; q < i; q++) {
            c->flops += pc[q].flops;
            c->param_floats += pc[q].params;
            if (pc[q].block >= 0) {
                if (c->first_block < 0)
                    c->first_block = pc[q].block;
                c->last_block = pc[q].block;
            } else if (q == 0) {
                c->has_embedding = 1;
            } else {
                c->has_head = 1;
            }
        }
        i = k;
    }
#undef AT
    free(best);
    free(from);
    free(prefix);
    free(pc);
    return TR_OK;
}

void tr_pipe_readers(const struct tr_graph *g, const struct tr_pipe_chunk *chunk, int chunks, int P,
                     uint64_t *readers)
{
    memset(readers, 0, (size_t)g->n_tensors * sizeof *readers);
    for (int c = 0; c < chunks; c++)
        for (int i = chunk[c].first_node; i <= chunk[c].last_node; i++) {
            const struct tr_node *n = &g->nodes[i];
            for (int k = 0; k < n->n_in; k++)
                if (g->tensors[n->in[k]].role == TR_ROLE_PARAM)
                    readers[n->in[k]] |= 1ull << (c % P);
        }
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == TR_ROLE_PARAM && !readers[i])
            readers[i] = 1;
}

int tr_pipe_step_micro_batches(int64_t batch, int64_t micro_batch, int64_t replicas,
                               int64_t configured)
{
    if (configured > 0)
        return (int)configured;
    int64_t m = micro_batch > 0 && replicas > 0 ? batch / micro_batch / replicas : 1;
    return m > 0 ? (int)m : 1;
}

int tr_pipe_stage_memory(const struct tr_graph *g, const struct tr_pipe_chunk *chunk,
                         enum tr_pipe_kind kind, int P, int V, int M, double *bytes,
                         double *in_flight, double *flops_share, tr_err *err)
{
    int C = P * V;
    const struct tr_memory_report *m = &g->memory;
    double total = 0, all_params = 0;
    for (int c = 0; c < C; c++) {
        total += chunk[c].flops;
        all_params += chunk[c].param_floats;
    }
    double per_param = (double)(m->params + m->grads + m->optimizer + m->param_copies) /
                       (all_params > 0 ? all_params : 1);
    double kept = (double)(m->activations + m->saved),
           transient = (double)(m->activation_grads + m->scratch + m->recompute);
    struct tr_pipe_op *ops = tr_xcalloc((size_t)(2 * M * V), sizeof *ops);
    int largest = 0;
    for (int st = 0; st < P; st++) {
        double share = 0, params = 0;
        for (int c = st; c < C; c += P) {
            share += total > 0 ? chunk[c].flops / total : 0;
            params += chunk[c].param_floats;
        }
        /* the most (micro-batch, chunk) pairs the stage holds at once */
        int len = tr_pipe_schedule(kind, P, V, M, st, ops), held = 0, most = 0;
        if (len < 0) {
            free(ops);
            return tr_fail(err, "the %s schedule takes micro-batches in groups of the %d "
                           "stages, and a step has %d (set parallel.micro_batches, or "
                           "train.batch and train.micro_batch)", tr_pipe_kinds[kind], P, M), -1;
        }
        for (int i = 0; i < len; i++) {
            held += ops[i].backward ? -1 : 1;
            most = held > most ? held : most;
        }
        double flight = (double)most / V;
        bytes[st] = per_param * params + (double)m->frozen + kept * share * flight +
                    transient * share + (double)m->inputs;
        if (in_flight)
            in_flight[st] = flight;
        if (flops_share)
            flops_share[st] = share;
        if (bytes[st] > bytes[largest])
            largest = st;
    }
    free(ops);
    return largest;
}
