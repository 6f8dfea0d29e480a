/* Pipeline stages, run (pipeline_exec.h): the tensors crossing each cut,
 * the ops of this stage's schedule with their sends and receives, and the
 * sums over stages the update needs. */
#include "pipeline_exec.h"

#include "backend.h"
#include "loader.h"
#include "session.h"
#include "../util/util.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_CHUNKS = TR_PIPE_MAX_CHUNKS };

/* The tensors live across the cut before chunk c (produced before it, read
 * in it or after): what chunk c - 1's stage sends with each forward and
 * gets gradients back for. */
struct cut {
    int *t;
    int n;
    size_t bytes, grad_bytes; /* packed data; packed fp32 gradients (of those that have one) */
};

struct tr_pipe_exec {
    int P, V, M, C, stage;
    int D, replica;                       /* data-parallel replicas; this rank's (rank / P) */
    enum tr_pipe_kind kind;
    struct tr_comm *comm;
    struct tr_pipe_chunk chunk[MAX_CHUNKS];
    struct cut cut[MAX_CHUNKS];           /* cut[c]: before chunk c (cut[0] empty) */
    struct tr_pipe_op *ops;
    int n_ops;
    /* parameters: for each parameter tensor, the stages reading it (bit s);
     * the runs of the flat buffer this stage's chunks read (merged) */
    uint64_t *readers;
    struct tr_shard_run *own;
    size_t n_own;
    /* a shard level with replicas (ZeRO-1 or ZeRO-2 inside stages): the
     * runs of own this replica updates and keeps state for, its part of
     * each piece of own (find_updated); else own */
    struct tr_shard_run *upd;
    size_t n_upd;
    int zero;
    /* under it, where the comm plugin has a group's reduce-scatter and
     * all-gather (plugin ABI 2.7): the pieces own is cut into
     * (find_updated) and the ranks of the stage's replicas (ascending);
     * the gradients are then reduce-scattered piece by piece among them,
     * the updated parts all-gathered */
    int parts;
    struct tr_shard_run *pieces;
    size_t n_pieces;
    int *peers;
    /* parallel.shard = "gradients" (ZeRO-2 inside stages; needs parts):
     * each piece is one chunk's (piece_chunk), reduce-scattered as soon as
     * a backward of that chunk has finished its parameters (piece_need of
     * them; final_start/final_params: those a node finishes, CSR by node),
     * the parts other replicas own then given back, so a stage holds its
     * own parts of the gradients plus the pieces in flight */
    int grads_parted;
    int *piece_chunk, *piece_need, *piece_left;
    int *final_start, *final_params;
    size_t chunk_ticket[MAX_CHUNKS]; /* 1 + the last job of a chunk's pieces (0: none) */
    size_t recent[2];                /* 1 + the last pieces' last jobs: at most 2 in flight */
    const struct tr_backend *be;
    struct tr_graph *g;
    int *owner;                           /* tr_pipe_exec_owners */
    int *group;                           /* [P * D]: the ranks summing one tensor */
    /* buffers: a host bounce for copies between backend buffers, packed
     * messages out and in (backend memory), and for each of this stage's
     * chunks and each micro-batch the data it received (backend memory) */
    unsigned char *bounce;
    size_t bounce_bytes;
    void *out, *in;
    void **kept;                          /* [V * M]: chunk index v (c = v * P + stage), micro m */
    int *last_forward;                    /* [V]: the micro-batch whose activations the graph
                                           * holds, its backward still to run; -1: none */
    /* what a chunk's forward writes that its backward reads (the
     * activations and saved tensors its nodes produce), as merged byte
     * ranges of backend memory; a micro-batch in flight whose activations
     * another forward of the chunk is about to overwrite has them copied
     * into a stash (host memory) and back before its backward */
    struct range { char *p; size_t n; } *ranges[MAX_CHUNKS];
    int n_ranges[MAX_CHUNKS];
    size_t stash_bytes;                   /* the largest of this stage's chunks' */
    void **stash;                         /* [n_stash] */
    int n_stash;
    unsigned char *stash_busy;            /* [n_stash] */
    int *stash_of;                        /* [V * M]: the stash holding (v, m), or -1 */
    /* the step's micro-batches as the loader gave them */
    unsigned char *inputs;                /* M x input_bytes */
    int32_t *targets;                     /* M x target_count */
    double *weight;                       /* [M] */
    struct tr_pipe_span *spans;
    size_t n_spans;
};

int tr_pipe_exec_stage(const struct tr_pipe_exec *x) { return x->stage; }
const int *tr_pipe_exec_owners(const struct tr_pipe_exec *x) { return x->owner; }
int tr_pipe_exec_replica(const struct tr_pipe_exec *x) { return x->replica; }
int tr_pipe_exec_chunks(const struct tr_pipe_exec *x) { return x->C; }

size_t tr_pipe_exec_spans(const struct tr_pipe_exec *x, const struct tr_pipe_span **spans)
{
    *spans = x->spans;
    return x->n_spans;
}

static int chunk_of(const struct tr_pipe_exec *x, int node)
{
    for (int c = 0; c < x->C; c++)
        if (node >= x->chunk[c].first_node && node <= x->chunk[c].last_node)
            return c;
    return -1;
}


/* Each activation's producer chunk and last reader chunk: it crosses every
 * cut in between. */
static void find_cuts(struct tr_pipe_exec *x, const struct tr_graph *g)
{
    int *last = tr_xcalloc((size_t)g->n_tensors, sizeof *last);
    for (int i = 0; i < g->n_tensors; i++)
        last[i] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        int c = chunk_of(x, i);
        for (int k = 0; k < n->n_in; k++)
            last[n->in[k]] = c > last[n->in[k]] ? c : last[n->in[k]];
        for (int k = 0; k < n->n_aux; k++)
            last[n->aux[k]] = c > last[n->aux[k]] ? c : last[n->aux[k]];
    }
    for (int c = 1; c < x->C; c++) {
        struct cut *k = &x->cut[c];
        k->t = tr_xcalloc((size_t)g->n_tensors, sizeof *k->t);
        for (int i = 0; i < g->n_tensors; i++) {
            const struct tr_tensor *t = &g->tensors[i];
            if ((t->role != TR_ROLE_ACTIVATION && t->role != TR_ROLE_SAVED) || t->producer < 0)
                continue;
            int from = chunk_of(x, t->producer);
            if (from < c && last[i] >= c) {
                k->t[k->n++] = i;
                k->bytes += t->numel * tr_dtype_size(t->dtype);
                if (t->grad)
                    k->grad_bytes += t->numel * sizeof(float);
            }
        }
    }
    free(last);
}

static void find_readers(struct tr_pipe_exec *x, const struct tr_graph *g)
{
    x->readers = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *x->readers);
    tr_pipe_readers(g, x->chunk, x->C, x->P, x->readers);
}

static int by_address(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->p < y->p ? -1 : x->p > y->p;
}

/* The bytes chunk c's forward leaves for its backward: the data of the
 * activations and saved tensors its nodes produce (tensors that share
 * memory give overlapping ranges, merged). */
static size_t find_ranges(struct tr_pipe_exec *x, const struct tr_graph *g, int c)
{
    struct range *r = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *r);
    int n = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if ((t->role == TR_ROLE_ACTIVATION || t->role == TR_ROLE_SAVED) && t->data &&
            t->producer >= x->chunk[c].first_node && t->producer <= x->chunk[c].last_node)
            r[n++] = (struct range){t->data, t->numel * tr_dtype_size(t->dtype)};
    }
    qsort(r, (size_t)n, sizeof *r, by_address);
    int m = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && r[i].p <= r[m - 1].p + r[m - 1].n) {
            char *end = r[i].p + r[i].n > r[m - 1].p + r[m - 1].n ? r[i].p + r[i].n
                                                                  : r[m - 1].p + r[m - 1].n;
            r[m - 1].n = (size_t)(end - r[m - 1].p);
        } else {
            r[m++] = r[i];
        }
    }
    for (int i = 0; i < m; i++)
        total += r[i].n;
    x->ranges[c] = r;
    x->n_ranges[c] = m;
    return total;
}

/* The runs of the flat parameter buffer stage x->stage reads, in order. */
static void find_own(struct tr_pipe_exec *x, const struct tr_graph *g)
{
    x->own = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *x->own);
    for (size_t at = 0; at < g->n_params;) {
        /* the tensor at flat offset `at`, in offset order */
        int best = -1;
        for (int i = 0; i < g->n_tensors; i++) {
            const struct tr_tensor *t = &g->tensors[i];
            if (t->role == TR_ROLE_PARAM && t->offset >= at &&
                (best < 0 || t->offset < g->tensors[best].offset))
                best = i;
        }
        if (best < 0)
            break;
        const struct tr_tensor *t = &g->tensors[best];
        at = t->offset + t->numel;
        if (!(x->readers[best] >> x->stage & 1) || !t->numel)
            continue;
        if (x->n_own && x->own[x->n_own - 1].end == t->offset)
            x->own[x->n_own - 1].end = at;
        else
            x->own[x->n_own++] = (struct tr_shard_run){t->offset, at};
    }
}

/* Piece r in D parts: each part's floats (the return), the last part's
 * extra leftover (*left), and replica `replica`'s part (*part). */
static size_t piece_share(const struct tr_pipe_exec *x, struct tr_shard_run r, int replica,
                          size_t *left, struct tr_shard_run *part)
{
    size_t per = (r.end - r.begin) / (size_t)x->D;
    *left = r.end - r.begin - per * (size_t)x->D;
    part->begin = r.begin + (size_t)replica * per;
    part->end = replica == x->D - 1 ? r.end : part->begin + per;
    return per;
}

/* The runs of own this replica updates: all of them, or under a shard
 * level with replicas its part of each piece: the stage's parameters in
 * runs of one chunk's (consecutive in the flat buffer), each run cut into
 * pieces of parallel.bucket_mb (rounded up to a multiple of D), each piece
 * into D equal parts, replica r keeping part r (the last also the piece's
 * len % D leftover floats): the rule of shard.h applied to the stage's
 * chunks alone, so that a piece's collectives move this stage's floats
 * only, and a backward of one chunk finishes its pieces. */
static void find_updated(struct tr_pipe_exec *x, const struct tr_session *s)
{
    const struct tr_graph *g = s->g;
    enum tr_shard_level level = s->cfg->parallel.shard_level;
    x->upd = x->own;
    x->n_upd = x->n_own;
    x->zero = x->D > 1 && (level == TR_SHARD_OPTIMIZER || level == TR_SHARD_GRADIENTS);
    if (!x->zero)
        return;
    x->grads_parted = level == TR_SHARD_GRADIENTS;
    size_t D = (size_t)x->D, unit = (tr_shard_unit_floats(s->cfg) + D - 1) / D * D;
    x->parts = tr_comm_has_group_parts(x->comm);
    x->peers = tr_xcalloc(D, sizeof *x->peers);
    for (size_t r = 0; r < D; r++)
        x->peers[r] = (int)r * x->P + x->stage;
    /* the chunk of this stage reading each parameter (one: only tied
     * embeddings have two readers, on the first and the last stage) */
    int *chunk_of = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *chunk_of);
    long *key = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *key);
    size_t *order = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *order);
    for (int t = 0; t < g->n_tensors; t++) {
        chunk_of[t] = -1;
        key[t] = (long)g->tensors[t].offset;
    }
    for (int c = x->stage; c < x->C; c += x->P)
        for (int i = x->chunk[c].first_node; i <= x->chunk[c].last_node; i++)
            for (int k = 0; k < g->nodes[i].n_in; k++) {
                int t = g->nodes[i].in[k];
                if (g->tensors[t].role == TR_ROLE_PARAM && g->tensors[t].numel && chunk_of[t] < 0)
                    chunk_of[t] = c;
            }
    tr_order_by_key(order, (size_t)g->n_tensors, key);
    /* runs of one chunk, in offset order; then their pieces */
    struct tr_shard_run *run = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *run);
    int *run_chunk = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *run_chunk);
    size_t n_runs = 0;
    for (int k = 0; k < g->n_tensors; k++) {
        const struct tr_tensor *t = &g->tensors[order[k]];
        int c = chunk_of[order[k]];
        if (c < 0)
            continue;
        if (n_runs && run_chunk[n_runs - 1] == c && run[n_runs - 1].end == t->offset)
            run[n_runs - 1].end = t->offset + t->numel;
        else {
            run_chunk[n_runs] = c;
            run[n_runs++] = (struct tr_shard_run){t->offset, t->offset + t->numel};
        }
    }
    for (size_t i = 0; i < n_runs; i++)
        x->n_pieces += (run[i].end - run[i].begin + unit - 1) / unit;
    x->pieces = tr_xcalloc(x->n_pieces + 1, sizeof *x->pieces);
    x->piece_chunk = tr_xcalloc(x->n_pieces + 1, sizeof *x->piece_chunk);
    x->upd = tr_xcalloc(x->n_pieces + 1, sizeof *x->upd);
    x->n_upd = 0;
    size_t n = 0;
    for (size_t i = 0; i < n_runs; i++)
        for (size_t at = run[i].begin; at < run[i].end; at += unit) {
            size_t end = run[i].end - at < unit ? run[i].end : at + unit, left;
            struct tr_shard_run mine;
            x->piece_chunk[n] = run_chunk[i];
            x->pieces[n++] = (struct tr_shard_run){at, end};
            piece_share(x, x->pieces[n - 1], x->replica, &left, &mine);
            size_t b = mine.begin, e = mine.end;
            if (b == e)
                continue;
            if (x->n_upd && x->upd[x->n_upd - 1].end == b)
                x->upd[x->n_upd - 1].end = e;
            else
                x->upd[x->n_upd++] = (struct tr_shard_run){b, e};
        }
    /* shard = "gradients": where a backward finishes each parameter (the
     * earliest node of its chunk that adds into its gradient: backward runs
     * last to first) and so each piece */
    if (x->grads_parted) {
        int *final_node = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *final_node);
        for (int t = 0; t < g->n_tensors; t++)
            final_node[t] = -1;
        for (int c = x->stage; c < x->C; c += x->P)
            for (int i = x->chunk[c].last_node; i >= x->chunk[c].first_node; i--) {
                const struct tr_node *nd = &g->nodes[i];
                if (!tr_graph_runs_backward(g, nd))
                    continue;
                for (int k = 0; k < nd->n_in; k++) {
                    const struct tr_tensor *t = &g->tensors[nd->in[k]];
                    if (t->role == TR_ROLE_PARAM && t->grad && t->numel &&
                        chunk_of[nd->in[k]] == c)
                        final_node[nd->in[k]] = i;
                }
            }
        x->final_start = tr_xcalloc((size_t)g->n_nodes + 2, sizeof *x->final_start);
        for (int t = 0; t < g->n_tensors; t++)
            if (final_node[t] >= 0)
                x->final_start[final_node[t] + 1]++;
        for (int i = 0; i < g->n_nodes; i++)
            x->final_start[i + 1] += x->final_start[i];
        x->final_params = tr_xcalloc((size_t)x->final_start[g->n_nodes] + 1,
                                     sizeof *x->final_params);
        int *fill = tr_xcalloc((size_t)g->n_nodes + 1, sizeof *fill);
        x->piece_need = tr_xcalloc(x->n_pieces + 1, sizeof *x->piece_need);
        x->piece_left = tr_xcalloc(x->n_pieces + 1, sizeof *x->piece_left);
        for (int t = 0; t < g->n_tensors; t++) {
            if (final_node[t] < 0)
                continue;
            int i = final_node[t];
            x->final_params[x->final_start[i] + fill[i]++] = t;
            const struct tr_tensor *p = &g->tensors[t];
            for (size_t k = 0; k < x->n_pieces; k++)
                if (x->pieces[k].begin < p->offset + p->numel && p->offset < x->pieces[k].end)
                    x->piece_need[k]++;
        }
        free(fill);
        free(final_node);
    }
    free(run);
    free(run_chunk);
    free(order);
    free(key);
    free(chunk_of);
}

/* x->group := the ranks whose stage reads tensor i, in every replica,
 * ascending (replica by replica, stage by stage: every member calls the
 * group in the same order); returns how many. */
static int readers_group(struct tr_pipe_exec *x, int i)
{
    int n = 0;
    for (int r = 0; r < x->D; r++)
        for (int q = 0; q < x->P; q++)
            if (x->readers[i] >> q & 1)
                x->group[n++] = r * x->P + q;
    return n;
}

static int first_reader(uint64_t mask)
{
    return mask ? __builtin_ctzll(mask) : -1;
}

/* Each piece of this stage's runs, of buf (a flat buffer of the
 * parameters' layout in be's memory), reduce-scattered (scatter = 1) or
 * all-gathered among the stage's replicas: equal parts through the group
 * slots, a piece's leftover (the last replica's) summed whole, the others
 * adding zeros for an all-gather. */
static int piece_parts(struct tr_pipe_exec *x, const struct tr_backend *be, float *buf, int scatter,
                      tr_err *err)
{
    for (size_t k = 0; k < x->n_pieces; k++) {
        struct tr_shard_run r = x->pieces[k], mine;
        size_t left, per = piece_share(x, r, x->replica, &left, &mine);
        size_t whole = per * (size_t)x->D;
        /* a state slot made whole for a save: the other parts were given back */
        tr_be_commit(be, buf + r.begin, (r.end - r.begin) * sizeof(float));
        if (per && (scatter ? tr_comm_reduce_scatter_group : tr_comm_allgather_group)(
                       x->comm, buf + r.begin, per, x->peers, x->D, err) != TR_OK)
            return TR_ERROR;
        if (left && !scatter && x->replica != x->D - 1)
            tr_be_zero(be, buf + r.begin + whole, left * sizeof(float));
        if (left &&
            tr_comm_allreduce_group(x->comm, buf + r.begin + whole, left, x->peers, x->D, err) !=
                TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}

static void zero_floats(const struct tr_backend *be, float *p, size_t n)
{
    tr_be_zero(be, p, n * sizeof(float));
}

/* [p, p + n) floats of be's memory given back (they read as zeros after),
 * or zeroed where be cannot discard. */
static void give_back(const struct tr_backend *be, float *p, size_t n)
{
    if (n && tr_be_can_discard(be))
        tr_be_discard(be, p, n * sizeof(float));
    else if (n)
        tr_be_zero(be, p, n * sizeof(float));
}

/* After piece k's last collective, on the communication thread: the parts
 * of its gradients other replicas own go (shard = "gradients"). */
static void piece_summed(void *ctx, size_t k)
{
    struct tr_pipe_exec *x = ctx;
    struct tr_shard_run r = x->pieces[k], mine;
    size_t left;
    piece_share(x, r, x->replica, &left, &mine);
    give_back(x->be, x->g->grads + r.begin, mine.begin - r.begin);
    give_back(x->be, x->g->grads + mine.end, r.end - mine.end);
}

/* Piece k's gradients reduce-scattered among the stage's replicas, queued
 * (at most two pieces in flight: the one before the last is waited for
 * first, so a stage's gradients stay its parts plus those). */
static void submit_piece(struct tr_pipe_exec *x, size_t k)
{
    struct tr_shard_run r = x->pieces[k], mine;
    size_t left, per = piece_share(x, r, x->replica, &left, &mine);
    size_t whole = per * (size_t)x->D;
    if (x->recent[0]) {
        tr_err ignored = {{0}}; /* a failure stays with the comm: the step's next wait says it */
        tr_comm_wait(x->comm, x->recent[0] - 1, &ignored);
    }
    size_t ticket = 0;
    if (per)
        ticket = tr_comm_group_start(x->comm, 1, x->g->grads + r.begin, per, x->peers, x->D,
                                     left ? NULL : piece_summed, x, k);
    if (left)
        ticket = tr_comm_group_start(x->comm, 0, x->g->grads + r.begin + whole, left, x->peers,
                                     x->D, piece_summed, x, k);
    x->recent[0] = x->recent[1];
    x->recent[1] = ticket + 1;
    x->chunk_ticket[x->piece_chunk[k]] = ticket + 1;
}

/* The graph's backward hook during a backward of one chunk: the pieces
 * whose parameters node finished go. */
static void piece_hook(void *ctx, int node)
{
    struct tr_pipe_exec *x = ctx;
    for (int k = x->final_start[node]; k < x->final_start[node + 1]; k++) {
        const struct tr_tensor *p = &x->g->tensors[x->final_params[k]];
        for (size_t q = 0; q < x->n_pieces; q++)
            if (x->pieces[q].begin < p->offset + p->numel && p->offset < x->pieces[q].end &&
                --x->piece_left[q] == 0)
                submit_piece(x, q);
    }
}

/* Around a backward of chunk c under shard = "gradients": before, the
 * chunk's last reduce-scatters done (the backward adds into what they
 * leave) and its pieces armed; after, any piece left (parameters no node
 * finished) queued. */
static int arm_pieces(struct tr_pipe_exec *x, int c, tr_err *err)
{
    if (x->chunk_ticket[c] && tr_comm_wait(x->comm, x->chunk_ticket[c] - 1, err) != TR_OK)
        return TR_ERROR;
    for (size_t q = 0; q < x->n_pieces; q++)
        if (x->piece_chunk[q] == c)
            x->piece_left[q] = x->piece_need[q];
    x->g->on_backward = piece_hook;
    x->g->on_backward_ctx = x;
    return TR_OK;
}

static void disarm_pieces(struct tr_pipe_exec *x, int c)
{
    x->g->on_backward = NULL;
    x->g->on_backward_ctx = NULL;
    for (size_t q = 0; q < x->n_pieces; q++)
        if (x->piece_chunk[q] == c && x->piece_left[q] > 0)
            submit_piece(x, q);
}

static int scatter_pieces(struct tr_pipe_exec *x, struct tr_session *s, tr_err *err)
{
    return piece_parts(x, &s->be, s->g->grads, 1, err);
}

void tr_pipe_exec_free(struct tr_pipe_exec *x, const struct tr_backend *be)
{
    if (!x)
        return;
    for (int c = 0; c < MAX_CHUNKS; c++)
        free(x->cut[c].t);
    if (x->kept)
        for (int i = 0; i < x->V * x->M; i++)
            if (x->kept[i])
                tr_be_free(be, x->kept[i]);
    if (x->out)
        tr_be_free(be, x->out);
    if (x->in)
        tr_be_free(be, x->in);
    tr_be_host_free(be, x->bounce);
    for (int i = 0; i < x->n_stash; i++)
        tr_be_host_free(be, x->stash[i]);
    for (int c = 0; c < MAX_CHUNKS; c++)
        free(x->ranges[c]);
    free(x->stash);
    free(x->stash_busy);
    free(x->stash_of);
    free(x->kept);
    free(x->last_forward);
    free(x->ops);
    free(x->readers);
    free(x->own);
    if (x->upd != x->own)
        free(x->upd);
    free(x->owner);
    free(x->pieces);
    free(x->piece_chunk);
    free(x->piece_need);
    free(x->piece_left);
    free(x->final_start);
    free(x->final_params);
    free(x->peers);
    free(x->group);
    free(x->inputs);
    free(x->targets);
    free(x->weight);
    free(x->spans);
    free(x);
}

struct tr_pipe_exec *tr_pipe_exec_new(struct tr_session *s, tr_err *err)
{
    const struct tr_parallel_config *par = &s->cfg->parallel;
    struct tr_pipe_exec *x = tr_xcalloc(1, sizeof *x);
    x->P = (int)par->pipeline;
    x->V = (int)par->virtual_stages;
    x->C = x->P * x->V;
    x->M = s->accum;
    x->kind = par->schedule_kind;
    x->stage = s->rank % x->P;
    x->D = s->world / x->P;
    x->replica = s->rank / x->P;
    x->comm = s->comm;
    if (!x->comm || !tr_comm_has_sendrecv(x->comm)) {
        tr_fail(err, "parallel.pipeline = %d: comm '%s' has no sendrecv (plugin ABI 2.4), which "
                "pipeline stages send activations and gradients with; use a comm plugin that "
                "has one (tcp, mpi, nccl)", x->P,
                s->cfg->comm.plugin ? s->cfg->comm.plugin->info->name : "none");
        goto fail;
    }
    if (x->C > MAX_CHUNKS) {
        tr_fail(err, "parallel.pipeline x virtual_stages = %d: at most %d chunks", x->C, MAX_CHUNKS);
        goto fail;
    }
    if (tr_pipe_partition(s->g, x->C, x->chunk, err) != TR_OK)
        goto fail;
    find_cuts(x, s->g);
    find_readers(x, s->g);
    find_own(x, s->g);
    x->owner = tr_xcalloc((size_t)s->g->n_tensors + 1, sizeof *x->owner);
    x->group = tr_xcalloc((size_t)(x->P * x->D), sizeof *x->group);
    for (int i = 0; i < s->g->n_tensors; i++)
        x->owner[i] = s->g->tensors[i].role == TR_ROLE_PARAM ? first_reader(x->readers[i]) : -1;
    /* the update of the parameters this stage reads (this replica's parts
     * of them under a shard level) */
    x->be = &s->be;
    x->g = s->g;
    find_updated(x, s);
    if (x->grads_parted && !x->parts) {
        tr_fail(err, "parallel.shard = \"gradients\" inside pipeline stages: comm '%s' has no "
                "reduce_scatter_group and allgather_group (plugin ABI 2.7), which reduce-scatter "
                "a stage's gradients among its replicas; use a comm plugin that has them (tcp, "
                "mpi, nccl) or shard = \"optimizer\"",
                s->cfg->comm.plugin ? s->cfg->comm.plugin->info->name : "none");
        goto fail;
    }
    if (tr_optimizer_only(&s->opt, x->upd, x->n_upd, err) != TR_OK)
        goto fail;
    for (int v = 0; v < x->V; v++) {
        size_t b = find_ranges(x, s->g, v * x->P + x->stage);
        x->stash_bytes = b > x->stash_bytes ? b : x->stash_bytes;
    }
    x->ops = tr_xcalloc((size_t)(2 * x->M * x->V), sizeof *x->ops);
    x->n_ops = tr_pipe_schedule(x->kind, x->P, x->V, x->M, x->stage, x->ops);
    if (x->n_ops < 0) {
        tr_fail(err, "parallel.schedule = \"%s\" cannot run %d micro-batches on %d stages "
                "(interleaved: a multiple of the stages)", tr_pipe_kinds[x->kind], x->M, x->P);
        goto fail;
    }
    size_t largest = 0;
    for (int c = 1; c < x->C; c++) {
        if (x->cut[c].bytes > largest)
            largest = x->cut[c].bytes;
        if (x->cut[c].grad_bytes > largest)
            largest = x->cut[c].grad_bytes;
    }
    size_t io = s->input_bytes > s->target_count * 4 ? s->input_bytes : s->target_count * 4;
    x->bounce_bytes = (largest > io ? largest : io) + 64;
    x->bounce = tr_be_host_alloc(&s->be, x->bounce_bytes);
    x->out = tr_be_alloc(&s->be, largest + 64);
    x->in = tr_be_alloc(&s->be, largest + 64);
    x->kept = tr_xcalloc((size_t)(x->V * x->M), sizeof *x->kept);
    x->last_forward = tr_xcalloc((size_t)x->V, sizeof *x->last_forward);
    x->stash_of = tr_xcalloc((size_t)(x->V * x->M), sizeof *x->stash_of);
    int ok = x->bounce && x->out && x->in;
    for (int v = 0; v < x->V && ok; v++) {
        int c = v * x->P + x->stage;
        for (int m = 0; m < x->M && ok && c > 0 && x->cut[c].bytes; m++)
            ok = (x->kept[v * x->M + m] = tr_be_alloc(&s->be, x->cut[c].bytes)) != NULL;
    }
    if (!ok) {
        tr_fail(err, "pipeline stage %d: out of %s memory for the activations of %d micro-batches "
                "in flight", x->stage, tr_be_name(&s->be), x->M);
        goto fail;
    }
    x->inputs = tr_xcalloc((size_t)x->M, s->input_bytes);
    x->targets = tr_xcalloc((size_t)x->M * s->target_count, sizeof *x->targets);
    x->weight = tr_xcalloc((size_t)x->M, sizeof *x->weight);
    x->spans = tr_xcalloc((size_t)(2 * x->n_ops + 1), sizeof *x->spans);
    if (s->rank == 0) {
        char line[512];
        size_t at = 0;
        for (int c = 0; c < x->C && at < sizeof line; c++)
            at += (size_t)snprintf(line + at, sizeof line - at, "%s%d:[%s..%s]", c ? " " : "",
                                   c % x->P, s->g->nodes[x->chunk[c].first_node].name,
                                   s->g->nodes[x->chunk[c].last_node].name);
        tr_log(TR_LOG_INFO, NULL, "pipeline: %d stages, schedule %s, %d micro-batches a step; "
               "chunks (stage:[first..last node]) %s", x->P, tr_pipe_kinds[x->kind], x->M, line);
    }
    if (x->zero && s->rank == 0) {
        size_t mine = 0, all = 0;
        for (size_t i = 0; i < x->n_upd; i++)
            mine += x->upd[i].end - x->upd[i].begin;
        for (size_t i = 0; i < x->n_own; i++)
            all += x->own[i].end - x->own[i].begin;
        tr_log(TR_LOG_INFO, NULL, "%s sharded over each stage's %d replicas: rank 0 keeps %zu "
               "of its stage's %zu parameters' (parallel.shard = %s)",
               x->grads_parted ? "gradients and optimizer state" : "optimizer state", x->D, mine,
               all, x->grads_parted ? "gradients, reduce-scattered during backward" : "optimizer");
    }
    return x;
fail:
    tr_pipe_exec_free(x, &s->be);
    return NULL;
}

/* ---- moving tensors ---------------------------------------------------------- */

/* Backend to backend through the host (the backend has no copy slot): two
 * memcpys on the CPU. */
static void be_copy(struct tr_pipe_exec *x, const struct tr_backend *be, void *dst, const void *src,
                    size_t bytes)
{
    tr_be_download(be, x->bounce, src, bytes);
    tr_be_upload(be, dst, x->bounce, bytes);
}

/* The data (grads = 0) or the gradients of cut k's tensors into buf, one
 * after another, or (unpack) back out of it. */
static void pack(struct tr_pipe_exec *x, const struct tr_session *s, const struct cut *k, int grads,
                 void *buf, int unpack)
{
    size_t at = 0;
    for (int i = 0; i < k->n; i++) {
        struct tr_tensor *t = &s->g->tensors[k->t[i]];
        if (grads && !t->grad)
            continue;
        void *p = grads ? (void *)t->grad : t->data;
        size_t b = grads ? t->numel * sizeof(float) : t->numel * tr_dtype_size(t->dtype);
        if (unpack)
            be_copy(x, &s->be, p, (char *)buf + at, b);
        else
            be_copy(x, &s->be, (char *)buf + at, p, b);
        at += b;
    }
}

/* ---- the step ------------------------------------------------------------------ */

/* What an op sends after it and receives before it. */
struct transfer {
    int peer;      /* -1: none */
    size_t bytes;
    const struct cut *cut;
    int grads;
};

/* The rank running chunk c in this rank's replica (ranks r P .. r P + P - 1
 * are replica r's stages). */
static int peer(const struct tr_pipe_exec *x, int c)
{
    return x->replica * x->P + c % x->P;
}

static struct transfer receives(const struct tr_pipe_exec *x, const struct tr_pipe_op *op)
{
    int c = op->chunk;
    if (!op->backward && c > 0 && x->cut[c].bytes)
        return (struct transfer){peer(x, c - 1), x->cut[c].bytes, &x->cut[c], 0};
    if (op->backward && c < x->C - 1 && x->cut[c + 1].grad_bytes)
        return (struct transfer){peer(x, c + 1), x->cut[c + 1].grad_bytes, &x->cut[c + 1], 1};
    return (struct transfer){-1, 0, NULL, 0};
}

static struct transfer sends(const struct tr_pipe_exec *x, const struct tr_pipe_op *op)
{
    int c = op->chunk;
    if (!op->backward && c < x->C - 1 && x->cut[c + 1].bytes)
        return (struct transfer){peer(x, c + 1), x->cut[c + 1].bytes, &x->cut[c + 1], 0};
    if (op->backward && c > 0 && x->cut[c].grad_bytes)
        return (struct transfer){peer(x, c - 1), x->cut[c].grad_bytes, &x->cut[c], 1};
    return (struct transfer){-1, 0, NULL, 0};
}

/* Micro-batch m's inputs and targets into the graph. */
static void upload_batch(struct tr_pipe_exec *x, struct tr_session *s, int m)
{
    struct tr_graph *g = s->g;
    tr_be_upload(&s->be, g->tensors[g->inputs[0]].data, x->inputs + (size_t)m * s->input_bytes,
                 s->input_bytes);
    tr_be_upload(&s->be, g->tensors[g->inputs[1]].data, x->targets + (size_t)m * s->target_count,
                 s->target_count * sizeof(int32_t));
}

static void set_micro(struct tr_pipe_exec *x, struct tr_session *s, double mean, uint64_t step, int m)
{
    s->g->loss_grad = (float)(mean * x->weight[m]);
    /* the seed one process draws micro-batch m's dropout from (run.c's rule:
     * replica d's m-th is the one process's m D + d-th) */
    s->g->dropout_seed = tr_splitmix64(
        (uint64_t)s->cfg->train.seed ^
        tr_splitmix64(step * 65536 + (uint64_t)m * (uint64_t)x->D + (uint64_t)x->replica));
}

/* F(m, c) without its communication: the data received is in the cut's
 * tensors already. */
static void run_forward(struct tr_pipe_exec *x, struct tr_session *s, int m, int c)
{
    upload_batch(x, s, m);
    tr_graph_forward_range(s->g, &s->be, x->chunk[c].first_node, x->chunk[c].last_node);
    x->last_forward[c / x->P] = m;
}

/* The activations the graph holds for chunk c (of a micro-batch whose
 * backward is still to run) into a free stash, growing the pool when all
 * are taken: at most the micro-batches the schedule holds in flight. */
static int stash(struct tr_pipe_exec *x, const struct tr_session *s, int c, tr_err *err)
{
    int v = c / x->P, m = x->last_forward[v];
    if (m < 0)
        return TR_OK;
    int k = 0;
    while (k < x->n_stash && x->stash_busy[k])
        k++;
    if (k == x->n_stash) {
        void *b = tr_be_host_alloc(&s->be, x->stash_bytes ? x->stash_bytes : 1);
        if (!b)
            return tr_fail(err, "pipeline stage %d: out of host memory for the activations of "
                           "%d micro-batches in flight (%zu bytes each)", x->stage, x->n_stash + 1,
                           x->stash_bytes);
        x->stash = tr_xrealloc(x->stash, (size_t)(k + 1) * sizeof *x->stash);
        x->stash_busy = tr_xrealloc(x->stash_busy, (size_t)(k + 1));
        x->stash[k] = b;
        x->n_stash++;
    }
    size_t at = 0;
    for (int i = 0; i < x->n_ranges[c]; i++) {
        tr_be_download(&s->be, (char *)x->stash[k] + at, x->ranges[c][i].p, x->ranges[c][i].n);
        at += x->ranges[c][i].n;
    }
    x->stash_busy[k] = 1;
    x->stash_of[v * x->M + m] = k;
    x->last_forward[v] = -1;
    return TR_OK;
}

/* Micro-batch m's state for chunk c's backward back in the graph: its
 * inputs and targets, the tensors it received, its activations. */
static void restore(struct tr_pipe_exec *x, struct tr_session *s, int m, int c)
{
    int v = c / x->P, k = x->stash_of[v * x->M + m];
    upload_batch(x, s, m);
    if (c > 0 && x->cut[c].bytes)
        pack(x, s, &x->cut[c], 0, x->kept[v * x->M + m], 1);
    size_t at = 0;
    for (int i = 0; i < x->n_ranges[c]; i++) {
        tr_be_upload(&s->be, x->ranges[c][i].p, (char *)x->stash[k] + at, x->ranges[c][i].n);
        at += x->ranges[c][i].n;
    }
    x->stash_busy[k] = 0;
    x->stash_of[v * x->M + m] = -1;
    x->last_forward[v] = m;
}

int tr_pipe_exec_step(struct tr_pipe_exec *x, struct tr_session *s, struct tr_loader *loader,
                      double mean, uint64_t step, struct tr_pipe_step *out, tr_err *err)
{
    struct tr_graph *g = s->g;
    memset(out, 0, sizeof *out);
    /* every stage reads the step's micro-batches (the data's order is the
     * single process's): the first stage for the tokens, the last for the
     * targets, every one for the weights of masked targets */
    for (int m = 0; m < x->M; m++) {
        if (tr_loader_next(loader, x->inputs + (size_t)m * s->input_bytes,
                           x->targets + (size_t)m * s->target_count, NULL, err) != TR_OK)
            return TR_ERROR;
        memcpy(s->host_targets, x->targets + (size_t)m * s->target_count,
               s->target_count * sizeof(int32_t));
        double n = tr_session_loss_targets(s);
        x->weight[m] = tr_session_batch_weight(s, n);
        out->targets += n;
    }
    if (s->data.info.input_dtype == TR_I32) /* an id past the table would read out of bounds */
        for (size_t i = 0; i < (size_t)x->M * s->input_bytes / 4; i++) {
            int32_t id = ((const int32_t *)x->inputs)[i];
            if ((uint32_t)id >= s->vocab)
                return tr_fail(err, "data '%s': token id %d is outside the model's vocabulary of %u",
                               s->data.name, id, s->vocab);
        }
    /* parameter gradients accumulate from zero: a stage's backward never
     * sees the first writer of a gradient another stage also writes (the
     * other stages' parameters: never written here) */
    for (size_t i = 0; i < x->n_own; i++) /* under "gradients" given back: zeros, not resident */
        (x->grads_parted ? give_back : zero_floats)(&s->be, g->grads + x->own[i].begin,
                                                    x->own[i].end - x->own[i].begin);
    g->grads_fresh = 0;
    memset(x->chunk_ticket, 0, sizeof x->chunk_ticket);
    memset(x->recent, 0, sizeof x->recent);
    for (int v = 0; v < x->V; v++)
        x->last_forward[v] = -1;
    for (int i = 0; i < x->V * x->M; i++)
        x->stash_of[i] = -1;
    x->n_spans = 0;
    out->t0 = tr_now();
    struct transfer pending = {-1, 0, NULL, 0}; /* the last op's send, not yet made */
    /* a send whose next op needs nothing received goes while that op
     * computes (x->out is its buffer until it is waited for) */
    size_t sending = 0;
    int in_flight = 0;
    for (int i = 0; i <= x->n_ops; i++) {
        const struct tr_pipe_op *op = i < x->n_ops ? &x->ops[i] : NULL;
        struct transfer rx = op ? receives(x, op) : (struct transfer){-1, 0, NULL, 0};
        if (pending.peer >= 0 || rx.peer >= 0) {
            double tw = tr_now();
            if (in_flight && tr_comm_wait(x->comm, sending, err) != TR_OK)
                return TR_ERROR;
            in_flight = 0;
            if (pending.peer >= 0)
                pack(x, s, pending.cut, pending.grads, x->out, 0);
            if (rx.peer < 0 && op) { /* overlapped with op's compute */
                sending = tr_comm_send_start(x->comm, x->out, pending.bytes, pending.peer);
                in_flight = 1;
            } else if (tr_comm_sendrecv(x->comm, x->out, pending.bytes, pending.peer, x->in,
                                        rx.bytes, rx.peer, err) != TR_OK) {
                return TR_ERROR;
            }
            if (rx.peer >= 0 && rx.grads) /* gradients: into the cut's tensors' */
                pack(x, s, rx.cut, 1, x->in, 1);
            else if (rx.peer >= 0) /* data: kept for the backward, and run */
                be_copy(x, &s->be, x->kept[(op->chunk / x->P) * x->M + op->micro], x->in, rx.bytes);
            double tx = tr_now();
            out->waited += tx - tw;
            x->spans[x->n_spans++] = (struct tr_pipe_span){
                TR_PIPE_SPAN_SENDRECV, op ? op->micro : -1, op ? op->chunk : -1, tw, tx};
        }
        if (!op)
            break;
        int c = op->chunk, m = op->micro;
        double t0 = tr_now();
        set_micro(x, s, mean, step, m);
        if (!op->backward) {
            /* the micro-batch before, whose backward is still to come, keeps
             * its activations aside */
            if (stash(x, s, c, err) != TR_OK)
                return TR_ERROR;
            if (c > 0 && x->cut[c].bytes)
                pack(x, s, &x->cut[c], 0, x->kept[(c / x->P) * x->M + m], 1);
            run_forward(x, s, m, c);
            if (c == x->C - 1)
                out->loss_sum += tr_session_read_loss(s) * x->weight[m];
        } else {
            if (x->last_forward[c / x->P] != m) {
                /* another forward of this chunk ran since: m's activations
                 * come back from their stash (the gradients just received
                 * are in the gradient arena, untouched) */
                if (stash(x, s, c, err) != TR_OK)
                    return TR_ERROR;
                restore(x, s, m, c);
            }
            if (x->grads_parted && arm_pieces(x, c, err) != TR_OK)
                return TR_ERROR;
            tr_graph_backward_range(g, &s->be, x->chunk[c].first_node, x->chunk[c].last_node);
            if (x->grads_parted)
                disarm_pieces(x, c);
            x->last_forward[c / x->P] = -1;
        }
        tr_be_synchronize(&s->be);
        double t1 = tr_now();
        out->busy += t1 - t0;
        x->spans[x->n_spans++] = (struct tr_pipe_span){
            op->backward ? TR_PIPE_SPAN_BACKWARD : TR_PIPE_SPAN_FORWARD, m, c, t0, t1};
        *(op->backward ? &out->backward[c] : &out->forward[c]) += (float)((t1 - t0) / x->M);
        pending = sends(x, op);
    }
    if (in_flight) { /* the last send went while the stage's last op computed */
        double tw = tr_now();
        if (tr_comm_wait(x->comm, sending, err) != TR_OK)
            return TR_ERROR;
        out->waited += tr_now() - tw;
    }
    /* a parameter several stages read (tied embeddings): its gradient is
     * the sum of theirs; with replicas, every gradient is the sum over them
     * too.  A tensor at a time, in index order (so that every rank makes
     * the group calls in the same order), summed among the ranks whose
     * stage reads it, in every replica: a stage moves only its own
     * tensors.  The ranks outside a tensor's group skip it where the comm
     * plugin has groups, and add zeros to a world all-reduce where it has
     * none (tr_comm_allreduce_group).  Reduce-scattered among the replicas
     * instead (x->parts), only the tensors several stages read are summed
     * so, whole, and then count once in the pieces' sums: replica 0's sum
     * and the others' zeros.  Under shard = "gradients" the pieces were
     * reduce-scattered during the backward (waited for first: the last
     * gives back parts of what follows): a tensor several stages read has
     * each stage's sum in the parts its replicas own and zeros elsewhere,
     * so the same all-reduce among its readers makes it whole. */
    double tw = tr_now();
    if (x->grads_parted && x->recent[1] && tr_comm_wait(x->comm, x->recent[1] - 1, err) != TR_OK)
        return TR_ERROR;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        int tied = __builtin_popcountll(x->readers[i]) > 1, reads = x->readers[i] >> x->stage & 1;
        if (t->role != TR_ROLE_PARAM || (!tied && (x->D == 1 || x->parts)))
            continue;
        if (x->grads_parted && reads) /* its given-back parts written again */
            tr_be_commit(&s->be, t->grad, t->numel * sizeof(float));
        int n = readers_group(x, i);
        if (tr_comm_allreduce_group(x->comm, t->grad, t->numel, x->group, n, err) != TR_OK)
            return TR_ERROR;
        if (x->parts && !x->grads_parted && x->replica > 0 && reads)
            tr_be_zero(&s->be, t->grad, t->numel * sizeof(float));
    }
    if (x->parts && !x->grads_parted && scatter_pieces(x, s, err) != TR_OK)
        return TR_ERROR;
    out->waited += tr_now() - tw;
    out->t1 = tr_now();
    return TR_OK;
}

int tr_pipe_exec_has_loss(const struct tr_pipe_exec *x) { return (x->C - 1) % x->P == x->stage; }

int tr_pipe_exec_forward(void *stage, struct tr_session *s, tr_err *err)
{
    struct tr_pipe_exec *x = stage;
    for (int c = x->stage; c < x->C; c += x->P) {
        const struct cut *in = &x->cut[c], *out = c + 1 < x->C ? &x->cut[c + 1] : NULL;
        if (c > 0 && in->bytes) {
            if (tr_comm_sendrecv(x->comm, NULL, 0, -1, x->in, in->bytes, peer(x, c - 1), err) !=
                TR_OK)
                return TR_ERROR;
            pack(x, s, in, 0, x->in, 1);
        }
        tr_graph_forward_range(s->g, &s->be, x->chunk[c].first_node, x->chunk[c].last_node);
        if (out && out->bytes) {
            pack(x, s, out, 0, x->out, 0);
            if (tr_comm_sendrecv(x->comm, x->out, out->bytes, peer(x, c + 1), NULL, 0, -1, err) !=
                TR_OK)
                return TR_ERROR;
        }
    }
    return TR_OK;
}

int tr_pipe_exec_sumsq(struct tr_pipe_exec *x, struct tr_session *s, double *sumsq, tr_err *err)
{
    const struct tr_graph *g = s->g;
    double mine = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM || first_reader(x->readers[i]) != x->stage)
            continue;
        if (!x->parts) { /* the replicas' gradients are equal: one counts */
            if (x->replica == 0)
                mine += tr_be_sum_squares(&s->be, t->grad, t->numel);
            continue;
        }
        /* each replica holds the sums of its parts alone */
        for (size_t k = 0; k < x->n_upd; k++) {
            size_t b = x->upd[k].begin > t->offset ? x->upd[k].begin : t->offset;
            size_t e = x->upd[k].end < t->offset + t->numel ? x->upd[k].end : t->offset + t->numel;
            if (b < e)
                mine += tr_be_sum_squares(&s->be, g->grads + b, e - b);
        }
    }
    _Static_assert(sizeof(double) == 2 * sizeof(float), "a double travels as two floats");
    double *all = tr_xcalloc((size_t)s->world, sizeof *all);
    all[s->rank] = mine;
    int rc = tr_comm_allgather_host(x->comm, (float *)all, 2, err);
    *sumsq = 0;
    for (int q = 0; q < s->world; q++) /* in stage order: the same double on every rank */
        *sumsq += all[q];
    free(all);
    return rc;
}

/* [off, off + n) of buf (be's memory: the device's, or the host's for an
 * offloaded optimizer state) from stage `root` to the ranks that keep it
 * (`all`, or rank 0 only: the others let it pass), through the host (an
 * upload marks the backend's copies of the parameters stale, as a write
 * from the comm plugin would not). */
static int share_range(struct tr_pipe_exec *x, struct tr_session *s, const struct tr_backend *be,
                       float *buf, size_t n, int root, int all, tr_err *err)
{
    size_t chunk = x->bounce_bytes / sizeof(float);
    for (size_t at = 0; at < n; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk;
        if (s->rank == root)
            tr_be_download(be, x->bounce, buf + at, k * sizeof(float));
        if (tr_comm_broadcast_host(x->comm, x->bounce, k * sizeof(float), root, err) != TR_OK)
            return TR_ERROR;
        if (s->rank != root && (all || s->rank == 0))
            tr_be_upload(be, buf + at, x->bounce, k * sizeof(float));
    }
    return TR_OK;
}

int tr_pipe_exec_share(struct tr_pipe_exec *x, struct tr_session *s, enum tr_pipe_share what,
                       tr_err *err)
{
    const struct tr_graph *g = s->g;
    int all = what == TR_PIPE_SHARE_PARAMS;
    const struct tr_backend *sbe = tr_optimizer_state_backend(&s->opt, &s->be);
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        /* replica 0's stage (rank = stage) */
        int root = t->role == TR_ROLE_PARAM ? first_reader(x->readers[i]) : -1;
        if (root < 0)
            continue;
        if (share_range(x, s, &s->be, g->params + t->offset, t->numel, root, all, err) != TR_OK)
            return TR_ERROR;
        for (int k = 0; !all && k < TR_OPTIMIZER_MAX_SLOTS && s->opt.state[k]; k++)
            if (share_range(x, s, sbe, s->opt.state[k] + t->offset, t->numel, root, 0, err) !=
                TR_OK)
                return TR_ERROR;
    }
    return TR_OK;
}

void tr_pipe_exec_release(struct tr_pipe_exec *x, struct tr_session *s)
{
    const struct tr_graph *g = s->g;
    if (!tr_be_can_discard(&s->be))
        return;
    /* the optimizer state where it is: the host's when offloaded */
    const struct tr_backend *sbe = tr_optimizer_state_backend(&s->opt, &s->be);
    size_t at = 0;
    for (size_t i = 0; i <= x->n_own; i++) { /* the gaps between this stage's runs */
        size_t end = i < x->n_own ? x->own[i].begin : g->n_params;
        if (end > at) {
            size_t b = (end - at) * sizeof(float);
            tr_be_discard(&s->be, g->params + at, b);
            tr_be_discard(&s->be, g->grads + at, b);
        }
        if (i < x->n_own)
            at = x->own[i].end;
    }
    at = 0;
    for (size_t i = 0; i <= x->n_upd && tr_be_can_discard(sbe); i++) { /* and the state's */
        size_t end = i < x->n_upd ? x->upd[i].begin : g->n_params;
        for (int k = 0; end > at && k < TR_OPTIMIZER_MAX_SLOTS && s->opt.state[k]; k++)
            tr_be_discard(sbe, s->opt.state[k] + at, (end - at) * sizeof(float));
        if (i < x->n_upd)
            at = x->upd[i].end;
    }
}

int tr_pipe_exec_zero(const struct tr_pipe_exec *x) { return x->zero; }

/* buf (a flat buffer of the parameters' layout in be's memory) but this
 * rank's updated runs, zeroed within [b, e). */
static void zero_outside(const struct tr_pipe_exec *x, const struct tr_backend *be, float *buf,
                         size_t b, size_t e)
{
    size_t at = b;
    for (size_t i = 0; i < x->n_upd && at < e; i++) {
        if (x->upd[i].end <= at)
            continue;
        size_t upto = x->upd[i].begin < e ? x->upd[i].begin : e;
        if (upto > at)
            tr_be_zero(be, buf + at, (upto - at) * sizeof(float));
        at = x->upd[i].end > at ? x->upd[i].end : at;
    }
    if (at < e)
        tr_be_zero(be, buf + at, (e - at) * sizeof(float));
}

int tr_pipe_exec_share_parts(struct tr_pipe_exec *x, struct tr_session *s, float *buf,
                             const struct tr_backend *be, tr_err *err)
{
    const struct tr_graph *g = s->g;
    int host = be != &s->be; /* an offloaded state: never with replicas (refused) */
    if (!x->zero || host)
        return TR_OK;
    if (x->parts) /* every reading stage updated its parts alike */
        return piece_parts(x, be, buf, 0, err);
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role != TR_ROLE_PARAM || !t->numel || !(x->readers[i] >> x->stage & 1))
            continue;
        /* the first stage reading it adds its replica's parts, the other
         * readers zeros: each float once in the sum */
        tr_be_commit(be, buf + t->offset, t->numel * sizeof(float));
        if (first_reader(x->readers[i]) == x->stage)
            zero_outside(x, be, buf, t->offset, t->offset + t->numel);
        else
            tr_be_zero(be, buf + t->offset, t->numel * sizeof(float));
        int n = readers_group(x, i);
        if (tr_comm_allreduce_group(x->comm, buf + t->offset, t->numel, x->group, n, err) != TR_OK)
            return TR_ERROR;
    }
    return TR_OK;
}
