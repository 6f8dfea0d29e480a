/* Sharded parameters gathered unit by unit around the nodes that read them
 * (gather.h says the rule). */
#include "gather.h"

#include "backend.h"
#include "../util/util.h"

#include <stdlib.h>
#include <string.h>

/* One pass's reads in execution order: event e is node node[e] running in
 * phase[e]; rel[rel_start[e] .. rel_start[e + 1]) are the units it reads
 * for the last time in the pass. */
struct pass {
    int n;
    int *node, *phase;
    int *rel_start;
    size_t *rel;
};

enum { RELEASED, IN_FLIGHT, RESIDENT };

/* A run of the flat buffer [begin, end): one or more parameters of a kind */
enum run_kind {
    RUN_HALF, /* read by GEMMs alone, as their weight: gathered in 16 bits */
    RUN_FULL, /* read in fp32 by some other op, by no GEMM: gathered in fp32 */
    RUN_BOTH  /* read in fp32 and as a GEMM's weight: gathered in fp32, rounded
               * into params16 where it arrives */
};
struct grun {
    size_t begin, end;
    enum run_kind kind;
};

/* Gathers in the compute dtype (gather.h): the runs, and for each unit the
 * floats each rank's packed part takes (the most over ranks), 0 for a unit
 * without 16-bit values (gathered in place in fp32, as ever). */
struct half {
    enum tr_dtype dt;  /* BF16 or F16 */
    struct grun *runs; /* sorted, disjoint; floats in no run are read by nothing */
    size_t n_runs;
    size_t *words;     /* per unit */
    size_t max_words;
};

struct tr_gather {
    struct tr_graph *g;
    const struct tr_backend *be;
    struct tr_comm *c;
    struct tr_shard s;
    struct half h;       /* h.runs NULL: the gathers move fp32 */
    uint16_t *params16;  /* g->params16: allocated here */
    float *staging;      /* world * h.max_words floats: the packed all-gather's */
    double bytes;        /* moved by the gathers since the last take */
    /* node i reads units units[ustart[i] .. ustart[i + 1]) */
    int *ustart;
    size_t *units;
    struct pass pass[2]; /* 0: forward; 1: backward with its recomputed forwards */
    unsigned char *state; /* per unit */
    size_t *ticket;       /* per unit in flight: its gather's */
    int cur, cursor;      /* the pass under way and its next event */
    double waited;        /* seconds spent waiting for gathers (not hidden by compute) */
    /* this rank's part of unit u made current just before its gather, on
     * the communication thread (an offloaded update, optim.h); NULL: none */
    void (*ready)(void *ctx, size_t u);
    void *ready_ctx;
    /* tr_gather_new_resident: every unit stays whole; tr_gather_refresh
     * gathers them all again */
    int resident;
    size_t *order;        /* the units as tr_gather_refresh gathers them (first use) */
};

/* ---- the schedule, from the graph ------------------------------------------- */

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* The units each node's parameters span, sorted, each once. */
static void node_units(const struct tr_graph *g, const struct tr_shard *s, int **start,
                       size_t **units)
{
    int total = 0;
    *start = tr_xcalloc((size_t)g->n_nodes + 1, sizeof **start);
    for (int pass = 0; pass < 2; pass++) {
        int at = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const struct tr_node *n = &g->nodes[i];
            int begin = at;
            for (int k = 0; k < n->n_in; k++) {
                const struct tr_tensor *t = &g->tensors[n->in[k]];
                if (t->role != TR_ROLE_PARAM || t->numel == 0)
                    continue;
                for (size_t u = t->offset / s->unit; u <= (t->offset + t->numel - 1) / s->unit; u++) {
                    if (pass)
                        (*units)[at] = u;
                    at++;
                }
            }
            if (pass) { /* sort, drop repeats (a node reading one tensor twice, or two in a unit) */
                qsort(*units + begin, (size_t)(at - begin), sizeof **units, cmp_size);
                int w = begin;
                for (int r = begin; r < at; r++)
                    if (w == begin || (*units)[w - 1] != (*units)[r])
                        (*units)[w++] = (*units)[r];
                at = w;
                (*start)[i + 1] = at;
            }
        }
        if (!pass) {
            total = at;
            *units = tr_xcalloc(total ? (size_t)total : 1, sizeof **units);
        }
    }
}

static int has_units(const struct tr_gather *gt, int i) { return gt->ustart[i + 1] > gt->ustart[i]; }

static void add_event(struct pass *p, int node, int phase)
{
    p->node[p->n] = node;
    p->phase[p->n] = phase;
    p->n++;
}

/* The release lists: each unit after its last read in the pass. */
static void plan_releases(struct tr_gather *gt, struct pass *p)
{
    size_t n_units = gt->s.n_units;
    int *last = tr_xcalloc(n_units ? n_units : 1, sizeof *last);
    for (size_t u = 0; u < n_units; u++)
        last[u] = -1;
    for (int e = 0; e < p->n; e++)
        for (int k = gt->ustart[p->node[e]]; k < gt->ustart[p->node[e] + 1]; k++)
            last[gt->units[k]] = e;
    p->rel_start = tr_xcalloc((size_t)p->n + 1, sizeof *p->rel_start);
    size_t used = 0;
    for (size_t u = 0; u < n_units; u++)
        if (last[u] >= 0) {
            p->rel_start[last[u] + 1]++;
            used++;
        }
    for (int e = 0; e < p->n; e++)
        p->rel_start[e + 1] += p->rel_start[e];
    p->rel = tr_xcalloc(used ? used : 1, sizeof *p->rel);
    int *fill = tr_xcalloc((size_t)p->n + 1, sizeof *fill);
    for (size_t u = 0; u < n_units; u++)
        if (last[u] >= 0)
            p->rel[p->rel_start[last[u]] + fill[last[u]]++] = u;
    free(fill);
    free(last);
}

/* The passes as graph_exec.c runs them, only the nodes that read parameters. */
static void plan_passes(struct tr_gather *gt)
{
    const struct tr_graph *g = gt->g;
    for (int k = 0; k < 2; k++) {
        gt->pass[k].node = tr_xcalloc(2 * (size_t)g->n_nodes + 1, sizeof(int));
        gt->pass[k].phase = tr_xcalloc(2 * (size_t)g->n_nodes + 1, sizeof(int));
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (has_units(gt, i))
            add_event(&gt->pass[0], i, TR_PHASE_FORWARD);
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        int first = tr_graph_recompute_from(g, i);
        for (int j = first; first >= 0 && j <= i; j++)
            if (has_units(gt, j))
                add_event(&gt->pass[1], j, TR_PHASE_RECOMPUTE);
        if (tr_graph_runs_backward(g, &g->nodes[i]) && has_units(gt, i))
            add_event(&gt->pass[1], i, TR_PHASE_BACKWARD);
    }
    plan_releases(gt, &gt->pass[0]);
    plan_releases(gt, &gt->pass[1]);
}

/* ---- gathers in the compute dtype ------------------------------------------- */

static int by_offset(const void *a, const void *b)
{
    const struct grun *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* How parameter tensor `tensor` of g is read: bit 0, as a GEMM's weight
 * (in[1] of linear or matmul); bit 1, in any other way. */
static unsigned reads_of(const struct tr_graph *g, int tensor)
{
    unsigned how = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct tr_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == tensor)
                how |= (n->op == TR_OP_LINEAR || n->op == TR_OP_MATMUL) && k == 1 ? 1u : 2u;
    }
    return how;
}

int tr_gather_gemm_weight(const struct tr_graph *g, int tensor)
{
    const struct tr_tensor *t = &g->tensors[tensor];
    return t->role == TR_ROLE_PARAM && t->dtype == TR_F32 && t->numel > 0 &&
           reads_of(g, tensor) == 1;
}

/* The runs of g's parameters, merged where neighbours are of one kind;
 * 0 (and none) where two parameters overlap (then the gathers stay fp32). */
static int plan_runs(const struct tr_graph *g, struct half *h)
{
    struct grun *r = tr_xcalloc((size_t)g->n_tensors + 1, sizeof *r);
    size_t n = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tr_tensor *t = &g->tensors[i];
        if (t->role == TR_ROLE_PARAM && t->numel > 0) {
            unsigned how = t->dtype == TR_F32 ? reads_of(g, i) : 2u;
            r[n++] = (struct grun){t->offset, t->offset + t->numel,
                                   how == 1 ? RUN_HALF : how & 1 ? RUN_BOTH : RUN_FULL};
        }
    }
    qsort(r, n, sizeof *r, by_offset);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (w > 0 && r[i].begin < r[w - 1].end) { /* aliased parameters: not ours to split */
            free(r);
            return 0;
        }
        if (w > 0 && r[i].begin == r[w - 1].end && r[i].kind == r[w - 1].kind)
            r[w - 1].end = r[i].end;
        else
            r[w++] = r[i];
    }
    h->runs = r;
    h->n_runs = w;
    return 1;
}

/* The first run that ends after `at`. */
static size_t first_run(const struct half *h, size_t at)
{
    size_t lo = 0, hi = h->n_runs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h->runs[mid].end <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Floats of [b, e) in runs of each kind. */
static void count_runs(const struct half *h, size_t b, size_t e, size_t count[3])
{
    count[RUN_HALF] = count[RUN_FULL] = count[RUN_BOTH] = 0;
    for (size_t i = first_run(h, b); i < h->n_runs && h->runs[i].begin < e; i++) {
        size_t rb = h->runs[i].begin > b ? h->runs[i].begin : b;
        size_t re = h->runs[i].end < e ? h->runs[i].end : e;
        count[h->runs[i].kind] += re - rb;
    }
}

/* Floats in fp32 runs and values in 16-bit runs of [b, e). */
static void count_part(const struct half *h, size_t b, size_t e, size_t *full, size_t *half)
{
    size_t count[3];
    count_runs(h, b, e, count);
    *full = count[RUN_FULL] + count[RUN_BOTH];
    *half = count[RUN_HALF];
}

/* Whether unit u has values that travel in 16 bits (else it goes in place
 * in fp32). */
static int unit_packed(const struct tr_shard *s, const struct half *h, size_t u)
{
    struct tr_shard_run r = tr_shard_unit(s, u);
    size_t full, half;
    count_part(h, r.begin, r.end, &full, &half);
    return half > 0;
}

/* A rank's part packed: its fp32 runs' floats first, in order (so they
 * stay 4-byte aligned), then its 16-bit runs' values, in order, the last
 * float padded with a zero half where their count is odd: (4 full + 2 half
 * + 3) / 4 floats; zeros after, to the unit's longest part. */
static size_t packed_words(size_t full, size_t half) { return (4 * full + 2 * half + 3) / 4; }

static void plan_words(const struct tr_shard *s, struct half *h)
{
    h->words = tr_xcalloc(s->n_units ? s->n_units : 1, sizeof *h->words);
    h->max_words = 0;
    for (size_t u = 0; u < s->n_units; u++)
        for (int q = 0; q < s->world && unit_packed(s, h, u); q++) {
            struct tr_shard_run p = tr_shard_part(s, u, q);
            size_t full, half;
            count_part(h, p.begin, p.end, &full, &half);
            size_t w = packed_words(full, half);
            h->words[u] = w > h->words[u] ? w : h->words[u];
            h->max_words = w > h->max_words ? w : h->max_words;
        }
}

/* Rank q's part of unit u from slot (its packed floats) into params (fp32
 * runs) and params16 (the runs GEMMs read), or, to_slot, the reverse (this
 * rank's, its params16 rounded from params first). */
static void move_part(struct tr_gather *gt, size_t u, int q, int to_slot)
{
    const struct half *h = &gt->h;
    const struct tr_backend *be = gt->be;
    float *params = gt->g->params;
    uint16_t *p16 = gt->params16;
    struct tr_shard_run p = tr_shard_part(&gt->s, u, q);
    float *slot = gt->staging + (size_t)q * h->words[u];
    size_t full = 0, half = 0;
    count_part(h, p.begin, p.end, &full, &half);
    float *f = slot;
    uint16_t *hv = (uint16_t *)(void *)(slot + full);
    for (size_t i = first_run(h, p.begin); i < h->n_runs && h->runs[i].begin < p.end; i++) {
        size_t b = h->runs[i].begin > p.begin ? h->runs[i].begin : p.begin;
        size_t e = h->runs[i].end < p.end ? h->runs[i].end : p.end;
        enum run_kind kind = h->runs[i].kind;
        if (kind != RUN_FULL && to_slot) /* this rank's values as its GEMMs read them */
            tr_be_convert(be, p16 + b, h->dt, params + b, TR_F32, e - b);
        if (kind == RUN_HALF && to_slot)
            tr_be_convert(be, hv, h->dt, p16 + b, h->dt, e - b);
        else if (kind == RUN_HALF)
            tr_be_convert(be, p16 + b, h->dt, hv, h->dt, e - b);
        else if (to_slot)
            tr_be_convert(be, f, TR_F32, params + b, TR_F32, e - b);
        else
            tr_be_convert(be, params + b, TR_F32, f, TR_F32, e - b);
        if (kind == RUN_BOTH && !to_slot)
            tr_be_convert(be, p16 + b, h->dt, params + b, TR_F32, e - b);
        if (kind == RUN_HALF)
            hv += e - b;
        else
            f += e - b;
    }
    /* the rest of this rank's slot (an odd count's half, a part shorter
     * than the longest) travels as zeros, not as an earlier unit's bytes */
    size_t used = (size_t)((char *)hv - (char *)slot);
    if (to_slot && used < h->words[u] * sizeof(float))
        tr_be_zero(be, (char *)slot + used, h->words[u] * sizeof(float) - used);
}

/* On the communication thread, around unit u's all-gather (comm.h). */
static void pack(void *ctx, size_t u)
{
    struct tr_gather *gt = ctx;
    if (gt->ready)
        gt->ready(gt->ready_ctx, u);
    move_part(gt, u, gt->s.rank, 1);
}

/* the same for a gather in fp32: this rank's part current first */
static void ready(void *ctx, size_t u)
{
    struct tr_gather *gt = ctx;
    gt->ready(gt->ready_ctx, u);
}

static void unpack(void *ctx, size_t u)
{
    struct tr_gather *gt = ctx;
    for (int q = 0; q < gt->s.world; q++)
        if (q != gt->s.rank)
            move_part(gt, u, q, 0);
}

/* After a unit gathered in fp32 in place: its runs GEMMs also read, every
 * rank's part, rounded into params16. */
static void round_both(void *ctx, size_t u)
{
    struct tr_gather *gt = ctx;
    const struct half *h = &gt->h;
    struct tr_shard_run r = tr_shard_unit(&gt->s, u);
    for (size_t i = first_run(h, r.begin); i < h->n_runs && h->runs[i].begin < r.end; i++) {
        size_t b = h->runs[i].begin > r.begin ? h->runs[i].begin : r.begin;
        size_t e = h->runs[i].end < r.end ? h->runs[i].end : r.end;
        if (h->runs[i].kind == RUN_BOTH)
            tr_be_convert(gt->be, gt->params16 + b, h->dt, gt->g->params + b, TR_F32, e - b);
    }
}

/* ---- at run time -------------------------------------------------------------- */

/* Unit u here, if its gather is in flight (a failure is the
 * communicator's, reported at its next wait). */
static void arrive(struct tr_gather *gt, size_t u)
{
    tr_err err = {{0}};
    if (gt->state[u] == IN_FLIGHT) {
        tr_comm_wait(gt->c, gt->ticket[u], &err);
        gt->state[u] = RESIDENT;
    }
}

static void release(struct tr_gather *gt, size_t u)
{
    arrive(gt, u);
    tr_shard_discard_others(gt->be, gt->g->params, &gt->s, u);
    if (gt->params16) { /* all of it: the owner's part is rounded again at each gather */
        struct tr_shard_run r = tr_shard_unit(&gt->s, u);
        size_t bytes = (r.end - r.begin) * sizeof(uint16_t);
        if (tr_be_can_discard(gt->be))
            tr_be_discard(gt->be, gt->params16 + r.begin, bytes);
        else
            tr_be_zero(gt->be, gt->params16 + r.begin, bytes);
    }
    gt->state[u] = RELEASED;
}

static void request(struct tr_gather *gt, int node)
{
    for (int k = gt->ustart[node]; k < gt->ustart[node + 1]; k++) {
        size_t u = gt->units[k];
        if (gt->state[u] != RELEASED)
            continue;
        size_t w = gt->h.runs ? gt->h.words[u] : 0;
        if (w) {
            gt->ticket[u] = tr_comm_gather_packed(gt->c, gt->staging, w, pack, unpack, gt, u);
            gt->bytes += (double)w * (double)gt->s.world * sizeof(float);
        } else {
            struct tr_shard_run r = tr_shard_unit(&gt->s, u);
            /* the comm plugin writes other ranks' parts in place (the packed
             * path's unpack writes through tr_be_convert, which commits) */
            tr_be_commit(gt->be, gt->g->params + r.begin, (r.end - r.begin) * sizeof(float));
            gt->ticket[u] = tr_comm_gather_unit_around(gt->c, gt->g->params, &gt->s, u,
                                                       gt->ready ? ready : NULL,
                                                       gt->h.runs ? round_both : NULL, gt);
            gt->bytes += (double)(r.end - r.begin) * sizeof(float);
        }
        gt->state[u] = IN_FLIGHT;
    }
}

static int reads(const struct tr_gather *gt, int node, size_t u)
{
    for (int k = gt->ustart[node]; k < gt->ustart[node + 1]; k++)
        if (gt->units[k] == u)
            return 1;
    return 0;
}

/* A new pass: what the last one left resident goes, but for what the new
 * one reads first (the head a forward ends with and backward starts at). */
static void begin_pass(struct tr_gather *gt, int p)
{
    const struct pass *ps = &gt->pass[p];
    for (size_t u = 0; u < gt->s.n_units; u++)
        if (gt->state[u] != RELEASED && !(ps->n > 0 && reads(gt, ps->node[0], u)))
            release(gt, u);
    gt->cur = p;
    gt->cursor = 0;
}

static int find_event(const struct pass *p, int from, int node, int phase)
{
    for (int e = from; e < p->n; e++)
        if (p->node[e] == node && p->phase[e] == phase)
            return e;
    return -1;
}

/* Until node's units in flight have arrived (the wait is communication). */
static void wait_units(struct tr_gather *gt, int node)
{
    double t0 = tr_now();
    for (int k = gt->ustart[node]; k < gt->ustart[node + 1]; k++)
        arrive(gt, gt->units[k]);
    gt->waited += tr_now() - t0;
}

static void before_node(void *ctx, int node, int phase)
{
    struct tr_gather *gt = ctx;
    if (!has_units(gt, node))
        return;
    if (gt->resident) { /* refreshed whole: only what this node reads must be here */
        wait_units(gt, node);
        return;
    }
    int p = phase == TR_PHASE_FORWARD ? 0 : 1;
    if (p != gt->cur)
        begin_pass(gt, p);
    const struct pass *ps = &gt->pass[p];
    int e = find_event(ps, gt->cursor, node, phase);
    if (e < 0) { /* the pass started over (a forward after a forward: evaluation) */
        begin_pass(gt, p);
        e = find_event(ps, 0, node, phase);
    }
    if (e < 0) { /* not in the schedule (cannot happen): gather it and keep it */
        request(gt, node);
    } else {
        /* the units the events since the last one here read for the last time */
        for (int d = gt->cursor > 0 ? gt->cursor - 1 : 0; d < e; d++)
            for (int k = ps->rel_start[d]; k < ps->rel_start[d + 1]; k++)
                if (gt->state[ps->rel[k]] != RELEASED)
                    release(gt, ps->rel[k]);
        gt->cursor = e + 1;
        request(gt, node);
        if (e + 1 < ps->n) /* the next node's, to arrive while this one computes */
            request(gt, ps->node[e + 1]);
    }
    wait_units(gt, node);
}

double tr_gather_take_bytes(struct tr_gather *gt)
{
    double b = gt->bytes;
    gt->bytes = 0;
    return b;
}

double tr_gather_take_waited(struct tr_gather *gt)
{
    double w = gt->waited;
    gt->waited = 0;
    return w;
}

void tr_gather_set_ready(struct tr_gather *gt, void (*fn)(void *ctx, size_t u), void *ctx)
{
    gt->ready = fn;
    gt->ready_ctx = ctx;
}

/* order[0..n_units): the units by their first reader in the forward (node
 * order), then the unread ones, each by place. */
static void forward_order(const struct tr_gather *gt, size_t *order)
{
    size_t n = gt->s.n_units;
    long *first = tr_xcalloc(n ? n : 1, sizeof *first);
    for (size_t u = 0; u < n; u++)
        first[u] = gt->g->n_nodes;
    for (int i = gt->g->n_nodes - 1; i >= 0; i--)
        for (int k = gt->ustart[i]; k < gt->ustart[i + 1]; k++)
            first[gt->units[k]] = i;
    tr_order_by_key(order, n, first);
    free(first);
}

void tr_gather_unit_positions(const struct tr_gather *gt, size_t *pos)
{
    size_t n = gt->s.n_units;
    size_t *order = tr_xcalloc(n ? n : 1, sizeof *order);
    forward_order(gt, order);
    for (size_t k = 0; k < n; k++)
        pos[order[k]] = k;
    free(order);
}

void tr_gather_refresh(struct tr_gather *gt)
{
    size_t n = gt->s.n_units;
    if (!gt->order) {
        gt->order = tr_xcalloc(n ? n : 1, sizeof *gt->order);
        forward_order(gt, gt->order);
    }
    for (size_t k = 0; k < n; k++) {
        size_t u = gt->order[k];
        struct tr_shard_run r = tr_shard_unit(&gt->s, u);
        gt->ticket[u] = tr_comm_gather_unit_around(gt->c, gt->g->params, &gt->s, u,
                                                   gt->ready ? ready : NULL, NULL, gt);
        gt->state[u] = IN_FLIGHT;
        gt->bytes += (double)(r.end - r.begin) * sizeof(float);
    }
}

void tr_gather_settle(struct tr_gather *gt)
{
    for (size_t u = 0; u < gt->s.n_units; u++)
        arrive(gt, u);
}

void tr_gather_release_all(struct tr_gather *gt)
{
    for (size_t u = 0; u < gt->s.n_units; u++)
        release(gt, u);
    gt->cur = -1;
    gt->cursor = 0;
}

void tr_gather_written(void *ctx, const struct tr_tensor *t)
{
    struct tr_gather *gt = ctx;
    if (t->role != TR_ROLE_PARAM || t->numel == 0)
        return;
    for (size_t u = t->offset / gt->s.unit; u <= (t->offset + t->numel - 1) / gt->s.unit; u++)
        release(gt, u);
}

/* Either kind's units and per-unit state (every unit in state `state`),
 * g's node hook taken. */
static struct tr_gather *gather_alloc(struct tr_graph *g, const struct tr_backend *be,
                                      struct tr_comm *c, const struct tr_shard *layout,
                                      unsigned char state)
{
    struct tr_gather *gt = tr_xcalloc(1, sizeof *gt);
    gt->g = g;
    gt->be = be;
    gt->c = c;
    gt->s = *layout;
    gt->cur = -1;
    node_units(g, layout, &gt->ustart, &gt->units);
    gt->state = tr_xcalloc(layout->n_units ? layout->n_units : 1, 1);
    memset(gt->state, state, layout->n_units);
    gt->ticket = tr_xcalloc(layout->n_units ? layout->n_units : 1, sizeof *gt->ticket);
    g->before_node = before_node;
    g->before_node_ctx = gt;
    return gt;
}

struct tr_gather *tr_gather_new(struct tr_graph *g, const struct tr_backend *be,
                                struct tr_comm *c, const struct tr_shard *layout)
{
    struct tr_gather *gt = gather_alloc(g, be, c, layout, RELEASED);
    plan_passes(gt);
    if (tr_gather_in_compute(g, be, layout) && plan_runs(g, &gt->h)) {
        gt->h.dt = g->compute;
        plan_words(layout, &gt->h);
        gt->params16 = tr_be_alloc(be, g->n_params * sizeof(uint16_t));
        gt->staging = tr_be_alloc(be, (size_t)layout->world * gt->h.max_words * sizeof(float) + 4);
        if (!gt->params16 || !gt->staging) { /* out of memory: fp32 gathers, as before */
            tr_be_free(be, gt->params16);
            tr_be_free(be, gt->staging);
            gt->params16 = NULL;
            gt->staging = NULL;
            free(gt->h.runs);
            free(gt->h.words);
            gt->h = (struct half){0};
        }
        g->params16 = gt->params16;
    }
    return gt;
}

struct tr_gather *tr_gather_new_resident(struct tr_graph *g, const struct tr_backend *be,
                                         struct tr_comm *c, const struct tr_shard *layout)
{
    struct tr_gather *gt = gather_alloc(g, be, c, layout, RESIDENT);
    gt->resident = 1;
    return gt;
}

/* What plan_passes and node_units allocated. */
static void free_schedule(struct tr_gather *gt)
{
    for (int k = 0; k < 2; k++) {
        free(gt->pass[k].node);
        free(gt->pass[k].phase);
        free(gt->pass[k].rel_start);
        free(gt->pass[k].rel);
    }
    free(gt->ustart);
    free(gt->units);
}

void tr_gather_free(struct tr_gather *gt)
{
    if (!gt)
        return;
    tr_gather_settle(gt); /* no hook of a gather in flight runs after this */
    if (gt->g->before_node_ctx == gt) {
        gt->g->before_node = NULL;
        gt->g->before_node_ctx = NULL;
    }
    free_schedule(gt);
    free(gt->state);
    free(gt->ticket);
    free(gt->order);
    if (gt->params16) {
        if (gt->g->params16 == gt->params16)
            gt->g->params16 = NULL;
        tr_be_free(gt->be, gt->params16);
        tr_be_free(gt->be, gt->staging);
    }
    free(gt->h.runs);
    free(gt->h.words);
    free(gt);
}

/* ---- the plan's peaks ------------------------------------------------------------ */

/* The most units resident at once in pass p: those between their first
 * and last read around each event, and the next event's, gathered ahead;
 * with weight, the most of the sum of their weights. */
static size_t pass_peak(const struct tr_gather *gt, const struct pass *p, int only_phase,
                        const size_t *weight)
{
    size_t n_units = gt->s.n_units, peak = 0;
    int *first = tr_xcalloc(n_units ? n_units : 1, sizeof *first);
    int *last = tr_xcalloc(n_units ? n_units : 1, sizeof *last);
    for (size_t u = 0; u < n_units; u++)
        first[u] = last[u] = -1;
    for (int e = 0; e < p->n; e++) {
        if (only_phase >= 0 && p->phase[e] != only_phase)
            continue;
        for (int k = gt->ustart[p->node[e]]; k < gt->ustart[p->node[e] + 1]; k++) {
            size_t u = gt->units[k];
            if (first[u] < 0)
                first[u] = e;
            last[u] = e;
        }
    }
    for (int e = 0; e < p->n; e++) {
        size_t live = 0;
        for (size_t u = 0; u < n_units; u++)
            if (first[u] >= 0 && ((first[u] <= e + (only_phase < 0) && e <= last[u])))
                live += weight ? weight[u] : 1;
        peak = live > peak ? live : peak;
    }
    free(first);
    free(last);
    return peak;
}

int tr_gather_in_compute(const struct tr_graph *g, const struct tr_backend *be,
                         const struct tr_shard *layout)
{
    return (g->compute == TR_BF16 || g->compute == TR_F16) && layout->world > 1 &&
           layout->level == TR_SHARD_PARAMETERS && (be == NULL || tr_be_can_convert(be));
}

void tr_gather_peaks(const struct tr_graph *g, const struct tr_shard *layout, int in_compute,
                     struct tr_gather_peaks *pk)
{
    struct tr_gather gt = {.g = (struct tr_graph *)g, .s = *layout};
    node_units(g, layout, &gt.ustart, &gt.units);
    plan_passes(&gt);
    size_t fw = pass_peak(&gt, &gt.pass[0], -1, NULL), bw = pass_peak(&gt, &gt.pass[1], -1, NULL);
    /* gradients: units between the first and the last backward writing
     * them, and the buckets queued behind (comm.h) */
    size_t gr = pass_peak(&gt, &gt.pass[1], TR_PHASE_BACKWARD, NULL) + TR_COMM_BUCKETS_IN_FLIGHT;
    size_t cap = layout->n_units, units = fw > bw ? fw : bw;
    size_t floats = units < cap ? units * layout->unit : layout->n; /* fp32: whole units */
    memset(pk, 0, sizeof *pk);
    pk->grad_floats = gr < cap ? gr * layout->unit : layout->n;
    if (in_compute && plan_runs(g, &gt.h)) {
        /* of the units resident together: fp32 for the runs some other op
         * reads (a unit gathered in place: all of it), 16 bits for those
         * GEMMs read */
        size_t *bytes = tr_xcalloc(cap ? cap : 1, sizeof *bytes);
        for (size_t u = 0; u < cap; u++) {
            struct tr_shard_run r = tr_shard_unit(layout, u);
            size_t count[3];
            count_runs(&gt.h, r.begin, r.end, count);
            size_t full = unit_packed(layout, &gt.h, u) ? count[RUN_FULL] + count[RUN_BOTH]
                                                        : r.end - r.begin;
            bytes[u] = full * sizeof(float) + (count[RUN_HALF] + count[RUN_BOTH]) * sizeof(uint16_t);
        }
        size_t bf = pass_peak(&gt, &gt.pass[0], -1, bytes), bb = pass_peak(&gt, &gt.pass[1], -1, bytes);
        pk->param_bytes = bf > bb ? bf : bb;
        plan_words(layout, &gt.h);
        pk->staging_bytes = (size_t)layout->world * gt.h.max_words * sizeof(float) + 4;
        free(bytes);
        free(gt.h.runs);
        free(gt.h.words);
    } else {
        pk->param_bytes = floats * sizeof(float);
    }
    free_schedule(&gt);
}
