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

struct tr_gather {
    struct tr_graph *g;
    const struct tr_backend *be;
    struct tr_comm *c;
    struct tr_shard s;
    /* node i reads units units[ustart[i] .. ustart[i + 1]) */
    int *ustart;
    size_t *units;
    struct pass pass[2]; /* 0: forward; 1: backward with its recomputed forwards */
    unsigned char *state; /* per unit */
    size_t *ticket;       /* per unit in flight: its gather's */
    int cur, cursor;      /* the pass under way and its next event */
    double waited;        /* seconds spent waiting for gathers (not hidden by compute) */
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

/* ---- at run time -------------------------------------------------------------- */

static void release(struct tr_gather *gt, size_t u)
{
    tr_err err = {{0}};
    if (gt->state[u] == IN_FLIGHT) /* a failure stays with the comm: the step's finish reports it */
        tr_comm_wait(gt->c, gt->ticket[u], &err);
    tr_shard_discard_others(gt->be, gt->g->params, &gt->s, u);
    gt->state[u] = RELEASED;
}

static void request(struct tr_gather *gt, int node)
{
    for (int k = gt->ustart[node]; k < gt->ustart[node + 1]; k++) {
        size_t u = gt->units[k];
        if (gt->state[u] == RELEASED) {
            gt->ticket[u] = tr_comm_gather_unit(gt->c, gt->g->params, &gt->s, u);
            gt->state[u] = IN_FLIGHT;
        }
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

static void before_node(void *ctx, int node, int phase)
{
    struct tr_gather *gt = ctx;
    if (!has_units(gt, node))
        return;
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
    tr_err err = {{0}};
    double t0 = tr_now();
    for (int k = gt->ustart[node]; k < gt->ustart[node + 1]; k++) {
        size_t u = gt->units[k];
        if (gt->state[u] == IN_FLIGHT) {
            tr_comm_wait(gt->c, gt->ticket[u], &err);
            gt->state[u] = RESIDENT;
        }
    }
    gt->waited += tr_now() - t0;
}

double tr_gather_take_waited(struct tr_gather *gt)
{
    double w = gt->waited;
    gt->waited = 0;
    return w;
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

struct tr_gather *tr_gather_new(struct tr_graph *g, const struct tr_backend *be,
                                struct tr_comm *c, const struct tr_shard *layout)
{
    struct tr_gather *gt = tr_xcalloc(1, sizeof *gt);
    gt->g = g;
    gt->be = be;
    gt->c = c;
    gt->s = *layout;
    gt->cur = -1;
    node_units(g, layout, &gt->ustart, &gt->units);
    plan_passes(gt);
    gt->state = tr_xcalloc(layout->n_units ? layout->n_units : 1, 1);
    gt->ticket = tr_xcalloc(layout->n_units ? layout->n_units : 1, sizeof *gt->ticket);
    g->before_node = before_node;
    g->before_node_ctx = gt;
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
    if (gt->g->before_node_ctx == gt) {
        gt->g->before_node = NULL;
        gt->g->before_node_ctx = NULL;
    }
    free_schedule(gt);
    free(gt->state);
    free(gt->ticket);
    free(gt);
}

/* ---- the plan's peaks ------------------------------------------------------------ */

/* The most units resident at once in pass p: those between their first
 * and last read around each event, and the next event's, gathered ahead. */
static size_t pass_peak(const struct tr_gather *gt, const struct pass *p, int only_phase)
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
                live++;
        peak = live > peak ? live : peak;
    }
    free(first);
    free(last);
    return peak;
}

void tr_gather_peaks(const struct tr_graph *g, const struct tr_shard *layout,
                     size_t *param_floats, size_t *grad_floats)
{
    struct tr_gather gt = {.g = (struct tr_graph *)g, .s = *layout};
    node_units(g, layout, &gt.ustart, &gt.units);
    plan_passes(&gt);
    size_t fw = pass_peak(&gt, &gt.pass[0], -1), bw = pass_peak(&gt, &gt.pass[1], -1);
    /* gradients: units between the first and the last backward writing
     * them, and the buckets queued behind (comm.h) */
    size_t gr = pass_peak(&gt, &gt.pass[1], TR_PHASE_BACKWARD) + TR_COMM_BUCKETS_IN_FLIGHT;
    size_t cap = layout->n_units;
    *param_floats = (fw > bw ? fw : bw) < cap ? (fw > bw ? fw : bw) * layout->unit : layout->n;
    *grad_floats = gr < cap ? gr * layout->unit : layout->n;
    free_schedule(&gt);
}
